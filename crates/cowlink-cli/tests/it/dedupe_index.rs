//! `cowlink dedupe` and its index from the command line: kill -9 at any
//! point leaves an index the next run can trust; --index and --no-index.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use cowlink_testfs::{data, testfs, write_file};

use crate::common::{bin, text};

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn dedupe(ix: &Path, dir: &Path) -> Output {
    bin()
        .args(["dedupe", "--json", "--index"])
        .arg(ix)
        .arg(dir)
        .output()
        .unwrap()
}

fn same_blocks(a: &Path, b: &Path) -> bool {
    let runs = |p: &Path| cowlink::extents::extents(p).unwrap().physical_runs();
    let (x, y) = (runs(a), runs(b));
    !x.is_empty() && x == y
}

/// Three copies of 400 files, from 1 KiB to 200 KiB; the first copy's
/// paths.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut first = Vec::new();
    for copy in 0..3 {
        let d = dir.join(format!("c{copy}"));
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..400u64 {
            let p = d.join(format!("f{i}"));
            write_file(&p, &data(1024 + (i as usize * 509) % (200 << 10), i));
            if copy == 0 {
                first.push(p);
            }
        }
    }
    first
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_9_mid_run_leaves_an_index_the_next_run_trusts() {
    let x = testfs!(Xfs);
    let ix = tempfile::tempdir().unwrap();
    let root = x.path().join("t");
    let first = tree(&root);
    // Killed at several points of a run (walk, hashing, sharing, the
    // index's writes), each followed by a whole run.
    for delay_ms in [5, 40, 120, 300] {
        // New duplicates each round, so every run has work.
        for copy in 0..2 {
            let p = root.join(format!("new-{delay_ms}-{copy}"));
            write_file(&p, &data(150_000, 1000 + delay_ms));
        }
        let mut child = bin()
            .args(["dedupe", "--index"])
            .arg(ix.path())
            .arg(&root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        child.wait().unwrap();
        let out = dedupe(ix.path(), &root);
        let v = json(&out);
        let notes = &v["plan"]["index"]["notes"];
        assert_eq!(notes, &serde_json::json!([]), "after kill at {delay_ms} ms");
        assert_eq!(v["result"]["errors"], serde_json::json!([]));
        for f in &first {
            let twin = root.join("c2").join(f.file_name().unwrap());
            assert!(same_blocks(f, &twin), "{f:?} after kill at {delay_ms} ms");
        }
        assert!(same_blocks(
            &root.join(format!("new-{delay_ms}-0")),
            &root.join(format!("new-{delay_ms}-1"))
        ));
    }
    // Consistent: an unchanged rerun reads nothing.
    let v = json(&dedupe(ix.path(), &root));
    assert_eq!(v["plan"]["bytes_hashed"], 0, "{v}");
    assert_eq!(v["result"]["targets_deduped"], 0, "{v}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn no_index_reads_everything_and_keeps_nothing() {
    let x = testfs!(Xfs);
    let root = x.path().join("t");
    for copy in ["a", "b"] {
        std::fs::create_dir_all(root.join(copy)).unwrap();
        write_file(&root.join(copy).join("f"), &data(50_000, 1));
    }
    let ix = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["dedupe", "--json", "--no-index"])
        .arg(&root)
        .env("COWLINK_INDEX_DIR", ix.path())
        .output()
        .unwrap();
    let v = json(&out);
    assert!(v["plan"].get("index").is_none(), "{v}");
    assert_eq!(std::fs::read_dir(ix.path()).unwrap().count(), 0);
    // The default place (here moved by COWLINK_INDEX_DIR) is used without
    // a flag, and the summary says what the index saved.
    let run = || {
        bin()
            .args(["dedupe"])
            .arg(&root)
            .env("COWLINK_INDEX_DIR", ix.path())
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_dir(ix.path()).unwrap().count() > 0);
    let out = run();
    assert!(
        text(&out.stdout).contains("index: 2 files not read (unchanged)"),
        "{}",
        text(&out.stdout)
    );
    // Both flags at once make no sense.
    let out = bin()
        .args(["dedupe", "--no-index", "--index"])
        .arg(ix.path())
        .arg(&root)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `cp -a --reflink=always a b` of files whose sizes collide (so each size
/// group holds several pairs, none equal to another): every file of `b`
/// is counted as already shared, with and without the index, on a first
/// run and a rerun, and nothing is deduped.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_reflinked_copy_counts_as_already_shared() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    for fs in [x.path(), b.path()] {
        // Small files (read whole in the walk) and larger ones (mapped,
        // then hashed at their edges), each size held by several files.
        let (small, large) = (12u64, 6u64);
        for index in [false, true] {
            let root = fs.join(format!("reflinked-{index}"));
            let a = root.join("a");
            std::fs::create_dir_all(&a).unwrap();
            for i in 0..small {
                write_file(&a.join(format!("s{i}")), &data(6000 + (i % 2) as usize, i));
            }
            for i in 0..large {
                write_file(&a.join(format!("l{i}")), &data(300_000, 100 + i));
            }
            let st = std::process::Command::new("cp")
                .args(["-a", "--reflink=always"])
                .arg(&a)
                .arg(root.join("b"))
                .status()
                .unwrap();
            assert!(st.success());
            let ix = tempfile::tempdir().unwrap();
            for round in 0..2 {
                let mut cmd = bin();
                cmd.args(["dedupe", "--json"]);
                match index {
                    true => cmd.arg("--index").arg(ix.path()),
                    false => cmd.arg("--no-index"),
                };
                let v = json(&cmd.arg(&a).arg(root.join("b")).output().unwrap());
                let what = format!("{fs:?} index {index} round {round}: {v}");
                assert_eq!(v["plan"]["files_already_shared"], small + large, "{what}");
                assert_eq!(v["plan"]["groups"], serde_json::json!([]), "{what}");
                assert_eq!(v["result"]["targets_deduped"], 0, "{what}");
                // The text summary says the same.
                let mut cmd = bin();
                cmd.args(["dedupe", "--dry-run"]);
                match index {
                    true => cmd.arg("--index").arg(ix.path()),
                    false => cmd.arg("--no-index"),
                };
                let out = cmd.arg(&a).arg(root.join("b")).output().unwrap();
                assert!(out.status.success(), "{}", text(&out.stderr));
                let said = text(&out.stdout);
                assert!(
                    said.contains(&format!("skipped: {} already shared", small + large)),
                    "{what}: {said}"
                );
            }
        }
    }
}
