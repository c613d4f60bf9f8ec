//! `cowlink cp -r/-a` on whole trees, against GNU `cp -a`, on the real test
//! filesystems: equality (rsync), shared extents, cancel, vanishing and
//! unreadable sources, ENOSPC, dry run.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cowlink_testfs::{rich_tree, rsync_diff, temporaries, testfs};

use crate::common;
use crate::common::{bin, cowlink, text};

/// Every regular file under `dir` (not following symlinks).
fn regular_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            regular_files(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

/// The rich fixture copied by cowlink and by GNU cp on one filesystem:
/// rsync finds no difference; on reflink filesystems every file shares
/// its source's blocks.
fn equals_cp_a(root: &Path, reflinks: bool) {
    let src = root.join("src");
    let files = rich_tree(&src, 520);
    let (reference, ours) = (root.join("ref"), root.join("ours"));
    let st = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&reference)
        .status()
        .unwrap();
    assert!(st.success());
    let out = cowlink(&[&"cp", &"-a", &"--json", &src, &ours]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &doc["summary"];
    // Three of the fixture's file names are hardlinks of others inside it.
    assert_eq!(s["files"], files as u64 - 2, "{s}");
    assert_eq!(s["hardlinks"], 2, "{s}");
    assert_eq!(s["symlinks"], 7, "{s}");
    assert_eq!(s["failed"], 0, "{s}");
    let method_count = if reflinks { &s["cloned"] } else { &s["copied"] };
    assert_eq!(method_count, &s["files"], "{s}");

    let diff = rsync_diff(&reference, &ours, true);
    assert!(
        diff.is_empty(),
        "cowlink's copy differs from cp -a's:\n{diff}"
    );
    assert!(rsync_diff(&src, &ours, true).is_empty());
    assert!(temporaries(&ours).is_empty());
    // The comparison can fail: a changed mode is seen.
    fs::set_permissions(ours.join("a/exec"), fs::Permissions::from_mode(0o700)).unwrap();
    assert!(rsync_diff(&reference, &ours, true).contains("a/exec"));

    if reflinks {
        let mut copies = Vec::new();
        regular_files(&ours, &mut copies);
        let mut checked = 0;
        for copy in &copies {
            let orig = src.join(copy.strip_prefix(&ours).unwrap());
            assert_eq!(fs::read(&orig).unwrap(), fs::read(copy).unwrap());
            // Below a block, Btrfs stores data inline in metadata: nothing to share.
            if fs::metadata(copy).unwrap().len() >= 4096 {
                assert!(
                    common::shares_extents_with(&orig, copy),
                    "{} is not shared",
                    copy.display()
                );
                checked += 1;
            }
        }
        assert!(checked >= 15, "only {checked} files checked");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_a_equals_gnu_cp_a_on_xfs() {
    let x = testfs!(Xfs);
    equals_cp_a(x.path(), true);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_a_equals_gnu_cp_a_on_btrfs() {
    let b = testfs!(Btrfs);
    equals_cp_a(b.path(), true);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_a_equals_gnu_cp_a_on_ext4_by_copying() {
    let e = testfs!(Ext4);
    equals_cp_a(e.path(), false);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dry_run_plans_without_touching_the_destination() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    let files = rich_tree(&src, 3);
    let dst = x.path().join("dst");
    let out = cowlink(&[&"cp", &"-a", &"--dry-run", &"--json", &src, &dst]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!dst.exists());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["summary"]["files"], files as u64 - 2);
    assert_eq!(doc["summary"]["dry_run"], true);
    let results = doc["results"].as_array().unwrap();
    assert!(results.iter().all(|r| r["status"] == "planned"));
    let out = cowlink(&[&"cp", &"-r", &"--dry-run", &src, &dst]);
    assert!(text(&out.stdout).contains(&format!(
        "would copy '{}' -> '{}': file, 3.0 MiB",
        src.join("a/sub/big").display(),
        dst.join("a/sub/big").display()
    )));
    assert!(!dst.exists());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn copying_a_directory_into_itself_is_refused() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("in")).unwrap();
    let out = cowlink(&[&"cp", &"-r", &src, &src.join("in")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot copy a directory, "),
        "{}",
        text(&out.stderr)
    );
    assert!(!src.join("in/src").exists());
}

/// A tree of `n` files of `len` bytes in one directory, plus its names in
/// the order the directory lists them (the order a single worker copies
/// them in).
fn flat_tree(dir: &Path, n: usize, len: usize) -> Vec<String> {
    fs::create_dir(dir).unwrap();
    for i in 0..n {
        fs::write(dir.join(format!("f{i:05}")), vec![(i % 251) as u8; len]).unwrap();
    }
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Read the verbose output up to the first copied file.
fn wait_for_first_file(lines: &mut impl Iterator<Item = std::io::Result<String>>) {
    for line in lines {
        if line.unwrap().contains(": copied") {
            return;
        }
    }
    panic!("the copy ended without copying a file");
}

/// Copy `src` into a fresh `dst` with `-j threads`, send `signal` after
/// the first copied file, and check the run stopped with 130 and left
/// only complete files (no partial file, no temporary).
fn interrupt_mid_run(src: &Path, dst: &Path, signal: rustix::process::Signal, threads: &str) {
    let mut child = bin()
        .args(["cp", "-r", "-v", "-j", threads])
        .arg(src)
        .arg(dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait for the first copied file, then interrupt.
    wait_for_first_file(&mut lines);
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal).unwrap();
    for _ in lines {}
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{signal:?} at -j {threads}");
    let copied: Vec<_> = fs::read_dir(dst)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        !copied.is_empty() && copied.len() < 3000,
        "{} files copied: the {signal:?} at -j {threads} did not land mid-run",
        copied.len()
    );
    for c in &copied {
        let orig = src.join(c.file_name().unwrap());
        assert_eq!(
            fs::read(&orig).unwrap(),
            fs::read(c).unwrap(),
            "{} is partial",
            c.display()
        );
    }
    assert!(temporaries(dst).is_empty());
}

/// SIGINT and SIGTERM stop a copy the same way at one thread, two, and
/// the most `-j` allows (64: more is capped).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sigint_and_sigterm_mid_run_exit_130_and_leave_only_complete_files() {
    use rustix::process::Signal;
    let e = testfs!(Ext4);
    // Copied (ext4 cannot clone): 3,000 files of 64 KiB take long enough to
    // interrupt after the first one.
    let src = e.path().join("src");
    flat_tree(&src, 3000, 64 << 10);
    for (i, (signal, threads)) in [
        (Signal::INT, "2"),
        (Signal::TERM, "1"),
        (Signal::TERM, "64"),
        (Signal::INT, "64"),
    ]
    .into_iter()
    .enumerate()
    {
        interrupt_mid_run(&src, &e.path().join(format!("dst{i}")), signal, threads);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn vanishing_and_unreadable_sources_are_reported_and_the_run_completes() {
    let e = testfs!(Ext4);
    let src = e.path().join("src");
    let order = flat_tree(&src, 400, 256 << 10);
    // The copy runs unprivileged (root reads anything) on one thread, so
    // it copies in directory order, reading 128 names at a time; once it
    // reports the first file, two later files of that first batch vanish
    // or become unreadable.
    let (vanish, locked) = (&order[60], &order[100]);
    let dst = e.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let chown = |p: &Path| {
        rustix::fs::chown(p, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
    };
    chown(&src);
    chown(&dst);
    for n in &order {
        chown(&src.join(n));
    }
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .args(["cp", "-r", "-v", "-j", "1"])
        .arg(&src)
        .arg(dst.join("out"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    wait_for_first_file(&mut lines);
    fs::remove_file(src.join(vanish)).unwrap();
    fs::set_permissions(src.join(locked), fs::Permissions::from_mode(0o000)).unwrap();
    for _ in lines {}
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("'{}'", src.join(vanish).display()))
            && err.contains("source vanished during the copy"),
        "{err}"
    );
    assert!(
        err.contains(&format!("'{}'", src.join(locked).display()))
            && err.contains("permission denied reading the source"),
        "{err}"
    );
    let copied = fs::read_dir(dst.join("out")).unwrap().count();
    assert_eq!(copied, 398, "every other file is copied");
    assert!(temporaries(&dst).is_empty());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn enospc_mid_tree_reports_and_leaves_no_partial_file() {
    let (e, small) = (testfs!(Ext4), testfs!(SmallExt4));
    // 48 files of 2 MiB (96 MiB) onto a 64 MiB filesystem.
    let src = e.path().join("src");
    flat_tree(&src, 48, 2 << 20);
    let free_before = rustix::fs::statvfs(small.path()).unwrap().f_bfree;
    let dst = small.path().join("dst");
    let t = Instant::now();
    let out = cowlink(&[&"cp", &"-r", &src, &dst]);
    assert!(t.elapsed() < Duration::from_secs(120));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no space left on the destination filesystem"),
        "{err}"
    );
    let copied: Vec<_> = fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!copied.is_empty() && copied.len() < 48, "{}", copied.len());
    for c in &copied {
        let orig = src.join(c.file_name().unwrap());
        assert_eq!(
            fs::metadata(c).unwrap().size(),
            fs::metadata(&orig).unwrap().size(),
            "{} is partial",
            c.display()
        );
        assert_eq!(fs::read(&orig).unwrap(), fs::read(c).unwrap());
    }
    assert!(temporaries(&dst).is_empty());
    // The failed files' blocks went back to the filesystem.
    fs::remove_dir_all(&dst).unwrap();
    let free_after = rustix::fs::statvfs(small.path()).unwrap().f_bfree;
    assert!(
        free_after + 16 >= free_before,
        "{free_before} → {free_after}"
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sigint_inside_a_large_file_copy_stops_it_and_places_nothing() {
    let e = testfs!(Ext4);
    // One dense 1 GiB file: copying it (ext4 cannot clone) takes seconds.
    let src = e.path().join("src");
    fs::create_dir(&src).unwrap();
    {
        use std::io::Write;
        let mut f = fs::File::create(src.join("big")).unwrap();
        let block = vec![0x5au8; 1 << 20];
        for _ in 0..1024 {
            f.write_all(&block).unwrap();
        }
    }
    let dst = e.path().join("dst");
    let mut child = bin()
        .args(["cp", "-r", "-v"])
        .arg(&src)
        .arg(&dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.ends_with(": directory"), "{first}");
    std::thread::sleep(Duration::from_millis(100));
    common::sigint(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    // The copy stopped inside the file: no name for it, no temporary,
    // and no error reported for it (it was cancelled, not failed).
    assert_eq!(fs::read_dir(&dst).unwrap().count(), 0);
    assert!(
        !text(&out.stderr).contains("cannot"),
        "{}",
        text(&out.stderr)
    );
}

/// An absurd thread count is capped (with a message) and the copy
/// finishes; idle workers park instead of spinning.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn huge_thread_counts_are_capped_and_finish() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    let names = flat_tree(&src, 247, 100);
    let start = Instant::now();
    let out = cowlink(&[&"cp", &"-r", &"-j", &"100000", &src, &dst]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("using 64"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    for n in &names {
        assert_eq!(
            fs::read(src.join(n)).unwrap(),
            fs::read(dst.join(n)).unwrap()
        );
    }
}

/// `cp -a --resume` after an interrupted run recopies the damaged file
/// and keeps the finished ones.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn resume_through_the_cli_recopies_a_truncated_file() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    let names = flat_tree(&src, 20, 5000);
    let out = cowlink(&[&"cp", &"-a", &src, &dst]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let victim = dst.join(&names[3]);
    fs::OpenOptions::new()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_len(10)
        .unwrap();
    // -T: DEST is the copy itself (as with GNU cp, an existing DEST would
    // otherwise receive DEST/src).
    let out = cowlink(&[&"cp", &"-aT", &"--resume", &"--json", &src, &dst]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["summary"]["skipped"], 19, "{json}");
    assert_eq!(
        fs::read(src.join(&names[3])).unwrap(),
        fs::read(&victim).unwrap()
    );
}
