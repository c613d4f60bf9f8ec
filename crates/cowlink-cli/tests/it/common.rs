//! Helpers shared by the binary's integration tests.

use std::path::Path;
use std::process::{Command, Output};

/// The `cowlink` binary under test, as a command to add arguments to.
///
/// `cowlink dedupe` keeps its index in a directory of this call's own
/// (COWLINK_INDEX_DIR), never the machine's, and no two runs share one
/// unless a test passes `--index` itself. The directories of earlier
/// test processes that have exited are removed on the first call.
pub fn bin() -> Command {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static SWEEP: std::sync::Once = std::sync::Once::new();
    let top = std::env::temp_dir().join("cowlink-it-index");
    SWEEP.call_once(|| {
        for e in std::fs::read_dir(&top).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().unwrap_or_default().to_string();
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = top.join(format!("{}-{n}", std::process::id()));
    let mut c = Command::new(env!("CARGO_BIN_EXE_cowlink"));
    c.env("COWLINK_INDEX_DIR", dir);
    c
}

/// Run `cowlink` with `args` and collect its output.
pub fn cowlink(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = bin();
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().unwrap()
}

/// Output bytes as text, for messages and matching.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `cowlink store --store ST ARGS...`, output collected.
pub fn store(st: &std::path::Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = bin();
    c.arg("store").arg("--store").arg(st);
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().unwrap()
}

/// Send SIGINT (Ctrl-C) to a running child.
pub fn sigint(child: &std::process::Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::INT,
    )
    .unwrap();
}

/// Whether `b`'s blocks are all shared and are `a`'s blocks (FIEMAP): `b`
/// is a clone of `a`.
pub fn shares_extents_with(a: &std::path::Path, b: &std::path::Path) -> bool {
    let (ea, eb) = (
        cowlink::extents::extents(a).unwrap().extents,
        cowlink::extents::extents(b).unwrap().extents,
    );
    !eb.is_empty()
        && eb.iter().all(|x| x.is_shared())
        && ea
            .iter()
            .map(|x| x.physical)
            .eq(eb.iter().map(|x| x.physical))
}

/// The command succeeded (else fail with its status and output); its
/// stdout.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The command's stdout as JSON (whatever its exit status).
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}
