//! The run-control contract through the binary, on the real test
//! filesystems: Ctrl-C (SIGINT) stops `du`, `dedupe`, `store add-tree` and
//! `store checkout` with exit 130 and nothing partial, and the walk's open
//! descriptors stay bounded whatever the width of a directory (100,000
//! subdirectories under `ulimit -n 256`).

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cowlink_testfs::{data, temporaries, testfs, write_file};

use crate::common;
use crate::common::{bin, store, text};

/// Whether `child` has a thread whose name starts with `prefix` (the
/// library names the threads it starts: `cowlink-walk-N`, `cowlink-store-N`).
fn has_thread(child: &Child, prefix: &str) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", child.id())) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
}

/// Wait (at most 60 s) until `ready()`, then send SIGINT to `child` and
/// return its output.
fn interrupt_when(mut child: Child, ready: impl Fn(&Child) -> bool) -> Output {
    let start = Instant::now();
    while !ready(&child) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("finished ({status}) before it could be interrupted");
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never got going");
        std::thread::sleep(Duration::from_millis(2));
    }
    common::sigint(&child);
    child.wait_with_output().unwrap()
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A tree of `dirs` directories holding `per_dir` small files each, every
/// file's content appearing twice (so dedupe has work).
fn wide_tree(root: &Path, dirs: usize, per_dir: usize) {
    for d in 0..dirs {
        let dir = root.join(format!("d{d:05}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..per_dir {
            let seed = ((d * per_dir + f) / 2) as u64;
            write_file(
                &dir.join(format!("f{f}")),
                &data(4096 + seed as usize % 3000, seed),
            );
        }
    }
}

fn assert_interrupted(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(130),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("interrupted"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sigint_stops_du_and_dedupe_with_130_and_changes_nothing() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    wide_tree(&src, 400, 50);
    let before = fs::read_dir(src.join("d00000")).unwrap().count();

    let out = interrupt_when(spawn(bin().args(["du", "-s", "-j", "2"]).arg(&src)), |c| {
        has_thread(c, "cowlink-walk")
    });
    assert_interrupted(&out);
    assert!(
        text(&out.stdout).is_empty(),
        "a partial walk printed figures: {}",
        text(&out.stdout)
    );

    let out = interrupt_when(spawn(bin().args(["dedupe", "-j", "2"]).arg(&src)), |c| {
        has_thread(c, "cowlink-walk")
    });
    assert_interrupted(&out);
    // Interrupted while planning: no file was touched.
    assert!(text(&out.stderr).contains("nothing was changed"));
    assert_eq!(fs::read_dir(src.join("d00000")).unwrap().count(), before);
    assert!(temporaries(&src).is_empty());
}

/// Ctrl-C while groups are being shared, without `--json` or
/// `--verbose` (the groups go to the executor in bounded batches of
/// 2,048, the planner waiting on it): exit 130, no byte changed, and a
/// rerun shares every pair left, counting exactly those as groups.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sigint_while_sharing_batches_exits_130_and_a_rerun_finishes() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    // 5,000 pairs of small files: three batches.
    const DIRS: usize = 200;
    wide_tree(&src, DIRS, 50);
    let pair = |d: usize, f: usize| {
        let dir = src.join(format!("d{d:05}"));
        (dir.join(format!("f{f}")), dir.join(format!("f{}", f + 1)))
    };
    let shared = |d: usize, f: usize| {
        let (a, b) = pair(d, f);
        common::shares_extents_with(&a, &b) || common::shares_extents_with(&b, &a)
    };
    let out = interrupt_when(spawn(bin().args(["dedupe", "-j", "2"]).arg(&src)), |_| {
        (0..DIRS).step_by(7).any(|d| shared(d, 0))
    });
    assert_interrupted(&out);
    assert!(
        text(&out.stderr).contains("groups already done share their blocks"),
        "{}",
        text(&out.stderr)
    );
    let left = (0..DIRS)
        .flat_map(|d| (0..50).step_by(2).map(move |f| (d, f)))
        .filter(|&(d, f)| !shared(d, f))
        .count();
    assert!(left > 0 && left < DIRS * 25, "{left} pairs left unshared");
    for d in (0..DIRS).step_by(13) {
        for f in 0..50 {
            let seed = ((d * 50 + f) / 2) as u64;
            let p = src.join(format!("d{d:05}/f{f}"));
            assert_eq!(
                fs::read(&p).unwrap(),
                data(4096 + seed as usize % 3000, seed)
            );
        }
    }
    assert!(temporaries(&src).is_empty());
    let s = common::ok(&bin().arg("dedupe").arg(&src).output().unwrap());
    let groups = if left == 1 { "group" } else { "groups" };
    assert!(
        s.contains(&format!(" {left} duplicate {groups}, ")),
        "{left} pairs left: {s}"
    );
    let unshared = (0..DIRS)
        .flat_map(|d| (0..50).step_by(2).map(move |f| (d, f)))
        .filter(|&(d, f)| !shared(d, f))
        .count();
    assert_eq!(unshared, 0);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sigint_stops_store_add_tree_and_checkout_leaving_the_store_consistent() {
    let e = testfs!(Ext4);
    let src = e.path().join("src");
    wide_tree(&src, 100, 50);
    let st = e.path().join("store");

    // add-tree: interrupted mid-walk, no manifest names a half-read tree.
    let mut add = bin();
    add.arg("store")
        .arg("--store")
        .arg(&st)
        .args(["add-tree", "-j", "1"])
        .arg(&src);
    let out = interrupt_when(spawn(&mut add), |_| {
        // Objects appear (in objects/ab/) as the walk stores them.
        fs::read_dir(st.join("objects")).is_ok_and(|d| {
            d.flatten()
                .filter_map(|f| fs::read_dir(f.path()).ok())
                .map(|f| f.count())
                .sum::<usize>()
                > 20
        })
    });
    assert_interrupted(&out);
    let ls = store(&st, &[&"ls", &"--json"]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&ls.stdout).unwrap(),
        serde_json::json!([]),
        "a manifest was written for an interrupted add-tree"
    );
    let verify = store(&st, &[&"verify"]);
    assert!(verify.status.success(), "{}", text(&verify.stderr));
    assert!(temporaries(&st).is_empty());

    // A whole add, then a checkout by copying (ext4), interrupted once the
    // first files are in place.
    let add = store(&st, &[&"add-tree", &src]);
    assert!(add.status.success(), "{}", text(&add.stderr));
    let digest = text(&add.stdout).trim().to_string();
    let dst = e.path().join("dst");
    let mut co = bin();
    co.arg("store")
        .arg("--store")
        .arg(&st)
        .args(["checkout", "--link", "copy", "-j", "1", &digest])
        .arg(&dst);
    // Directories are filled in no set order: wait for any file.
    let out = interrupt_when(spawn(&mut co), |_| {
        fs::read_dir(&dst).is_ok_and(|dirs| {
            dirs.flatten()
                .any(|d| fs::read_dir(d.path()).is_ok_and(|mut f| f.next().is_some()))
        })
    });
    assert_interrupted(&out);
    let mut placed = 0;
    let mut missing = 0;
    for d in fs::read_dir(&src).unwrap() {
        let d = d.unwrap();
        for f in fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let there = dst.join(d.file_name()).join(f.file_name());
            match fs::read(&there) {
                Ok(bytes) => {
                    assert_eq!(bytes, fs::read(f.path()).unwrap(), "{there:?} is partial");
                    placed += 1;
                }
                Err(_) => missing += 1,
            }
        }
    }
    assert!(
        placed > 0 && missing > 0,
        "{placed} placed, {missing} missing: the interrupt did not land mid-run"
    );
    assert!(temporaries(&dst).is_empty());
    assert!(temporaries(&st).is_empty());
    let verify = store(&st, &[&"verify"]);
    assert!(verify.status.success(), "{}", text(&verify.stderr));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_directory_of_100000_subdirectories_walks_under_ulimit_n_256() {
    let x = testfs!(Xfs);
    let wide = x.path().join("wide");
    fs::create_dir(&wide).unwrap();
    for i in 0..100_000 {
        fs::create_dir(wide.join(format!("s{i:06}"))).unwrap();
    }
    // A few duplicate files, so every command has something to do.
    for i in 0..4 {
        write_file(&wide.join(format!("s{i:06}/f")), &data(10_000, 7));
    }
    let st = x.path().join("store");
    let limited = |args: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -n 256 && exec \"$0\" {args}"))
            .arg(env!("CARGO_BIN_EXE_cowlink"))
            .output()
            .unwrap()
    };
    let w = wide.display();
    for args in [
        format!("du -s '{w}'"),
        format!("dedupe -n '{w}'"),
        format!("store --store '{}' add-tree '{w}'", st.display()),
    ] {
        let out = limited(&args);
        assert!(
            out.status.success(),
            "cowlink {args}: exit {:?}\n{}",
            out.status.code(),
            text(&out.stderr)
        );
        assert!(
            !text(&out.stderr).contains("Too many open files"),
            "{}",
            text(&out.stderr)
        );
    }
    let ls = store(&st, &[&"ls", &"--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows[0]["entries"], 100_000 + 4, "{rows}");
}
