//! `cowlink sync`: kill -9 and Ctrl-C mid-run then a rerun converges,
//! with every name old or new, never mixed; a concurrent run is refused
//! naming the holder; itemized dry runs and JSON.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use cowlink_testfs::{rsync_diff, temporaries, testfs};

use crate::common::{bin, cowlink, json, ok, text};

fn slash(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push("/");
    PathBuf::from(s)
}

/// `n` files of `len` bytes whose contents depend on `version`.
fn versioned_tree(dir: &Path, n: usize, len: usize, version: u8) {
    fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        fs::write(
            dir.join(format!("f{i:05}")),
            vec![version.wrapping_add(i as u8); len],
        )
        .unwrap();
    }
}

/// Start a sync from ext4 into XFS (copied: it takes long enough), wait
/// for the first itemized file, stop it with `signal`, and check that
/// every name holds either its old content (version 1) or its new
/// (version 2), then that a rerun converges.
fn stop_mid_sync(signal: rustix::process::Signal, want_code: Option<i32>) {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let (src, dst) = (e.path().join("src"), x.path().join("dst"));
    let (n, len) = (1500, 128 << 10);
    versioned_tree(&src, n, len, 1);
    ok(&cowlink(&[&"sync", &slash(&src), &dst]));
    versioned_tree(&src, n, len, 2);
    let mut child = bin()
        .args(["sync", "-i", "-j", "2", "--no-progress"])
        .arg(slash(&src))
        .arg(&dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("the sync ended before a file").unwrap();
        if line.starts_with(">f") {
            break;
        }
    }
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal).unwrap();
    for _ in lines {}
    let status = child.wait().unwrap();
    assert_eq!(status.code(), want_code, "{signal:?}");
    let (mut old, mut new) = (0, 0);
    for i in 0..n {
        let got = fs::read(dst.join(format!("f{i:05}"))).unwrap();
        if got == vec![1u8.wrapping_add(i as u8); len] {
            old += 1;
        } else if got == vec![2u8.wrapping_add(i as u8); len] {
            new += 1;
        } else {
            panic!("f{i:05} holds a mix of old and new content after {signal:?}");
        }
    }
    assert!(
        new > 0 && old > 0,
        "{signal:?} did not land mid-run: {old} old, {new} new"
    );
    assert!(temporaries(&dst).is_empty());
    ok(&cowlink(&[&"sync", &"--delete", &slash(&src), &dst]));
    assert_eq!(rsync_diff(&src, &dst, true), "");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_9_mid_sync_leaves_every_name_old_or_new_and_a_rerun_converges() {
    stop_mid_sync(rustix::process::Signal::KILL, None);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ctrl_c_mid_sync_exits_130_and_a_rerun_converges() {
    stop_mid_sync(rustix::process::Signal::INT, Some(130));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_9_mid_first_sync_then_a_rerun_converges() {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let (src, dst) = (e.path().join("src"), x.path().join("dst"));
    for d in 0..10 {
        versioned_tree(&src.join(format!("d{d}")), 150, 128 << 10, d);
    }
    let mut child = bin()
        .args(["sync", "-i", "--no-progress"])
        .arg(slash(&src))
        .arg(&dst)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().starts_with(">f") {}
    child.kill().unwrap();
    child.wait().unwrap();
    drop(lines);
    assert_ne!(rsync_diff(&src, &dst, true), "", "the kill came too late");
    ok(&cowlink(&[&"sync", &slash(&src), &dst]));
    assert_eq!(rsync_diff(&src, &dst, true), "");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_concurrent_sync_is_refused_naming_the_holder() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    let mut holder = std::process::Command::new("flock")
        .arg("-o")
        .arg(&dst)
        .args(["sleep", "30"])
        .spawn()
        .unwrap();
    let pid = holder.id();
    let mut out = None;
    for _ in 0..100 {
        let o = cowlink(&[&"sync", &slash(&src), &dst]);
        if !o.status.success() {
            out = Some(o);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = out.expect("refused while the lock was held");
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("process {pid}")), "{err}");
    assert!(err.contains("another sync"), "{err}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dry_run_itemizes_like_rsync_and_json_lists_changes() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("sub/f"), b"x").unwrap();
    fs::write(src.join("keep.o"), b"o").unwrap();
    let out = ok(&cowlink(&[
        &"sync",
        &"-n",
        &"--exclude",
        &"*.o",
        &slash(&src),
        &dst,
    ]));
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, [">f+++++++++ sub/f", "cd+++++++++ sub/"]);
    assert!(!dst.exists());
    ok(&cowlink(&[&"sync", &slash(&src), &dst]));
    fs::write(src.join("sub/f"), b"longer").unwrap();
    fs::write(dst.join("extra"), b"e").unwrap();
    let out = cowlink(&[&"sync", &"--json", &"--delete", &slash(&src), &dst]);
    let v = json(&out);
    assert!(out.status.success());
    let changes = v["changes"].as_array().unwrap();
    let mut got: Vec<(String, String)> = changes
        .iter()
        .map(|c| {
            (
                c["itemize"].as_str().unwrap().to_string(),
                c["path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("*deleting  ".to_string(), "extra".to_string()),
            // The new name "extra" moved the root's time.
            (".d..t......".to_string(), "".to_string()),
            (">f.st......".to_string(), "sub/f".to_string()),
        ]
    );
    assert_eq!(v["summary"]["deleted"], 1);
    assert_eq!(rsync_diff(&src, &dst, true), "");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn exclude_from_reads_patterns_and_a_missing_source_fails() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(src.join("build")).unwrap();
    fs::write(src.join("build/out"), b"x").unwrap();
    fs::write(src.join("a.c"), b"c").unwrap();
    let list = x.path().join("excludes");
    fs::write(&list, "# build products\n/build\n").unwrap();
    ok(&cowlink(&[
        &"sync",
        &"--exclude-from",
        &list,
        &slash(&src),
        &dst,
    ]));
    assert!(dst.join("a.c").exists() && !dst.join("build").exists());
    let out = cowlink(&[&"sync", &"--json", &x.path().join("nope/"), &dst]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("source does not exist"));
    assert_eq!(text(&out.stdout), "", "no half JSON document");
    // A source inside the destination would be deleted by --delete.
    let inner = dst.join("inner");
    fs::create_dir(&inner).unwrap();
    let out = cowlink(&[&"sync", &"--delete", &slash(&inner), &dst]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("source is inside the destination"));
    assert!(inner.exists());
}

/// Names of the snapshot directories under `root` (not the bookkeeping).
fn snapshot_names(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

/// `sync --snapshot` stopped mid-sync (`signal`) is not listed complete;
/// the rerun resumes it under the same name, completes it, and it equals
/// SRC; the snapshot before it is untouched.
fn stop_mid_snapshot(signal: rustix::process::Signal) {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let (src, root) = (e.path().join("src"), x.path().join("snaps"));
    for d in 0..4 {
        versioned_tree(&src.join(format!("d{d}")), 100, 64 << 10, 1);
    }
    ok(&cowlink(&[&"sync", &"--snapshot", &root, &slash(&src)]));
    let first = snapshot_names(&root);
    assert_eq!(first.len(), 1);
    for d in 0..4 {
        versioned_tree(&src.join(format!("d{d}")), 100, 64 << 10, 2);
    }
    let mut child = bin()
        .args(["sync", "-i", "--no-progress", "--snapshot"])
        .arg(&root)
        .arg(slash(&src))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().starts_with(">f") {}
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        signal,
    )
    .unwrap();
    let status = child.wait().unwrap();
    drop(lines);
    if signal == rustix::process::Signal::INT {
        assert_eq!(status.code(), Some(130));
    }
    let names = snapshot_names(&root);
    assert_eq!(names.len(), 2, "{names:?}");
    let ls = json(&cowlink(&[&"snapshot", &"ls", &"--json", &root]));
    let states: Vec<String> = ls["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(states, ["complete", "open"], "{ls}");
    let out = cowlink(&[&"sync", &"--snapshot", &root, &slash(&src)]);
    ok(&out);
    assert_eq!(snapshot_names(&root), names, "resumed under its name");
    assert!(
        text(&out.stderr).contains("(resumed)"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(rsync_diff(&src, &root.join(&names[1]), true), "");
    // The older snapshot still holds version 1.
    let old = fs::read(root.join(&names[0]).join("d0/f00000")).unwrap();
    assert_eq!(old, vec![1u8; 64 << 10]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_9_mid_snapshot_then_a_rerun_resumes_it_under_its_name() {
    stop_mid_snapshot(rustix::process::Signal::KILL);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ctrl_c_mid_snapshot_exits_130_and_a_rerun_resumes_it() {
    stop_mid_snapshot(rustix::process::Signal::INT);
}

/// An `--exclude-from` file is read up to a bound: one that never ends
/// (`/dev/zero`) is refused with its name, within a memory limit the
/// unbounded read would exceed; a pipe (`<(...)`) still works.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn exclude_from_is_bounded_and_pipes_still_work() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a.o"), b"o").unwrap();
    fs::write(src.join("a.c"), b"c").unwrap();
    // 1 GiB of address space: the whole of /dev/zero cannot fit.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576; exec \"$0\" sync --exclude-from /dev/zero \"$1\" \"$2\"")
        .arg(bin().get_program())
        .arg(slash(&src))
        .arg(&dst)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("/dev/zero") && err.contains("larger than"),
        "{err}"
    );
    assert!(!dst.exists());
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("exec \"$0\" sync --exclude-from <(printf '*.o\\n') \"$1\" \"$2\"")
        .arg(bin().get_program())
        .arg(slash(&src))
        .arg(&dst)
        .output()
        .unwrap();
    ok(&out);
    assert!(dst.join("a.c").exists() && !dst.join("a.o").exists());
}

/// `--exclude-from` input that is not a list of patterns is refused
/// before anything is made, naming the file: a line that is not UTF-8
/// (with its number), a missing file, a directory, and a FIFO no process
/// writes to (after a bounded wait, never a hang). A FIFO with a writer
/// is read.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn exclude_from_refuses_what_is_not_a_list_of_patterns() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    // A name from a Latin-1 tree: not UTF-8.
    let latin1_name = std::ffi::OsStr::from_bytes(b"caf\xe9.o");
    fs::write(src.join(latin1_name), b"o").unwrap();
    fs::write(src.join("a.c"), b"c").unwrap();
    let refused = |list: &Path, what: &str| {
        let out = cowlink(&[&"sync", &"--exclude-from", &list, &slash(&src), &dst]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains(&*list.to_string_lossy()), "{err}");
        assert!(err.contains(what), "{err}");
        assert!(!dst.exists(), "{list:?} made the destination");
    };
    // The name as written in a Latin-1 list: read lossily it became
    // "caf\u{fffd}.o", which matches nothing, and the file was synced
    // though listed.
    let latin1 = x.path().join("latin1.list");
    fs::write(&latin1, b"# build output\n*.tmp\ncaf\xe9.o\n").unwrap();
    refused(&latin1, "line 3 of the exclude file is not UTF-8");
    refused(&x.path().join("no-such.list"), "No such file");
    refused(x.path(), "is a directory");
    let fifo = x.path().join("fifo.list");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    refused(&fifo, "no process writes to");
    // With a writer, the FIFO is a list like any other; `?` matches the
    // byte that is not UTF-8, as the refusal advises.
    let writer = std::thread::spawn({
        let fifo = fifo.clone();
        move || fs::write(&fifo, "caf?.o\n").unwrap()
    });
    ok(&cowlink(&[
        &"sync",
        &"--exclude-from",
        &fifo,
        &slash(&src),
        &dst,
    ]));
    writer.join().unwrap();
    assert!(dst.join("a.c").exists() && !dst.join(latin1_name).exists());
}
