//! Output never stops the work: a reader that goes away (`| head`) or a
//! closed stderr ends cowlink's output to that stream, never the copy, and
//! the exit status stays the copy's (never a panic's 101).

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use cowlink_testfs::testfs;

mod common;
use common::{bin, text};

/// `n` small files under `dir/src`, and a dangling symbolic link when
/// `broken` (copied with -L, it fails with a message on stderr).
fn tree(dir: &Path, n: usize, broken: bool) -> std::path::PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..n {
        fs::write(
            src.join("sub").join(format!("f{i:05}")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    if broken {
        std::os::unix::fs::symlink("/nonexistent/target", src.join("a-dangling-link")).unwrap();
    }
    src
}

fn copied(dst: &Path, n: usize) {
    for i in 0..n {
        let p = dst.join("sub").join(format!("f{i:05}"));
        assert_eq!(
            fs::read_to_string(&p).unwrap_or_default(),
            format!("file {i}\n"),
            "{} missing or wrong after the output was cut",
            p.display()
        );
    }
}

#[test]
fn a_reader_that_goes_away_never_stops_a_copy() {
    let Some(fs_) = testfs!(Xfs) else { return };
    let n = 3000; // --json output well over a pipe's 64 KiB
    let src = tree(fs_.path(), n, false);
    let dst = fs_.path().join("dst");
    let mut child = bin()
        .args(["cp", "-r", "--json", "-j", "2"])
        .arg(&src)
        .arg(&dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's reader is gone now (as after `| head -c 100`).
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "exit status must be the copy's; stderr: {}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    copied(&dst, n);
}

#[test]
fn a_closed_stderr_never_stops_a_copy() {
    let Some(fs_) = testfs!(Xfs) else { return };
    let n = 500;
    let src = tree(fs_.path(), n, true);
    // Two ways to lose stderr: a pipe whose reader is gone, and a closed
    // descriptor (`2>&-`).
    for (i, closed) in [false, true].into_iter().enumerate() {
        let dst = fs_.path().join(format!("dst{i}"));
        let status = if closed {
            Command::new("sh")
                .arg("-c")
                .arg(r#"exec "$0" cp -rL "$1" "$2" 2>&-"#)
                .arg(env!("CARGO_BIN_EXE_cowlink"))
                .arg(&src)
                .arg(&dst)
                .status()
                .unwrap()
        } else {
            let mut child = bin()
                .args(["cp", "-rL", "-v"])
                .arg(&src)
                .arg(&dst)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            drop(child.stderr.take());
            child.wait().unwrap()
        };
        // The dangling link fails (exit 1); nothing panics (101), and
        // every other file is copied.
        assert_eq!(status.code(), Some(1), "closed={closed}");
        copied(&dst, n);
        assert!(!dst.join("a-dangling-link").exists());
    }
}
