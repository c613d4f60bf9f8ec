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

/// A source whose itemized listing (`-i`) is far larger than a pipe
/// holds: a sync writing it to a pipe nobody reads stops, its locks held,
/// until the pipe is read. Empty files with long names: quick to make.
fn long_listing(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let tail = "n".repeat(200);
    for i in 0..800 {
        fs::write(dir.join(format!("{i:04}{tail}")), b"").unwrap();
    }
}

/// Whether process `pid` holds a `flock` on the inode of `path`
/// (`/proc/locks`).
fn holds_lock(pid: u32, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = fs::metadata(path) else {
        return false;
    };
    let ino = m.ino();
    fs::read_to_string("/proc/locks").unwrap().lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let f = if f.get(1) == Some(&"->") {
            &f[1..]
        } else {
            &f[..]
        };
        f.get(1) == Some(&"FLOCK")
            && f.get(4) == Some(&pid.to_string().as_str())
            && f.get(5).and_then(|d| d.rsplit(':').next()) == Some(ino.to_string().as_str())
    })
}

/// `cowlink sync -i ARGS` started with its listing going to a pipe nobody
/// reads: it stops mid-run holding its locks. Answered once it holds a
/// lock on `locked` (a bound only keeps a broken run from hanging the
/// test).
fn held_sync(args: &[&dyn AsRef<std::ffi::OsStr>], locked: &Path) -> std::process::Child {
    let mut c = bin();
    c.args(["sync", "-i", "--no-progress", "-j", "1"]);
    for a in args {
        c.arg(a.as_ref());
    }
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..3000 {
        if holds_lock(child.id(), locked) {
            return child;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the sync ended ({st}) before it was seen holding its lock");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    panic!("the sync never took its lock on {locked:?}");
}

/// Let a [`held_sync`] finish: read its listing, wait, and check it
/// succeeded.
fn release(mut child: std::process::Child) {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let st = child.wait_with_output().unwrap();
    assert!(st.status.success(), "{}", text(&st.stderr));
}

/// A sync refused because another holds a lock: exit 2, `InUse` text
/// naming the holder's process and the directory; nothing written.
fn refused_by(out: &std::process::Output, pid: u32, what: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("process {pid}")), "{err}");
    assert!(err.contains(what), "{err}");
}

/// `sync A/ dst/` and `sync B/ dst/sub/` at once would both write
/// dst/sub: they refuse each other, whichever starts first, naming the
/// holder; runs into siblings, and a dry run of the outer directory while
/// an inner one runs, go on.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn nested_destinations_refuse_each_other_in_both_orders() {
    let x = testfs!(Xfs);
    let (big, small) = (x.path().join("big"), x.path().join("small"));
    long_listing(&big);
    fs::create_dir_all(&small).unwrap();
    fs::write(small.join("s"), b"small").unwrap();
    let dst = x.path().join("dst");
    let (sub, other) = (dst.join("sub"), dst.join("other"));
    fs::create_dir_all(&sub).unwrap();
    fs::create_dir_all(&other).unwrap();

    // The outer run first: the inner one, and a dry run of it, are
    // refused; a sibling of the outer directory is not.
    let outer = held_sync(&[&slash(&big), &dst], &dst);
    let pid = outer.id();
    let out = cowlink(&[&"sync", &slash(&small), &sub]);
    refused_by(&out, pid, "which holds this directory");
    assert!(text(&out.stderr).contains(&*dst.to_string_lossy()));
    refused_by(&cowlink(&[&"sync", &"-n", &slash(&small), &sub]), pid, "");
    let beside = x.path().join("beside");
    ok(&cowlink(&[&"sync", &slash(&small), &beside]));
    release(outer);
    assert!(!sub.join("s").exists(), "the refused run wrote");

    // The inner run first: the outer one is refused; a sibling of the
    // inner one and a dry run of the outer one go on.
    let inner = held_sync(&[&slash(&big), &sub], &sub);
    let pid = inner.id();
    let out = cowlink(&[&"sync", &"--delete", &slash(&small), &dst]);
    refused_by(&out, pid, "or into a directory inside it");
    assert!(sub.exists() && dst.join("0000".to_string() + &"n".repeat(200)).exists());
    ok(&cowlink(&[&"sync", &slash(&small), &other]));
    ok(&cowlink(&[&"sync", &"-n", &slash(&small), &dst]));
    release(inner);
    assert_eq!(rsync_diff(&big, &sub, true), "");
    // Both free again.
    ok(&cowlink(&[&"sync", &slash(&small), &sub]));
}

/// A snapshot root takes part as a destination: `sync --snapshot ROOT`
/// and a sync into ROOT or into one of its snapshots refuse each other,
/// whichever starts first, naming the holder. On Btrfs each snapshot is a
/// subvolume (another `st_dev`, no mount point): ROOT above it is still
/// locked.
fn snapshot_root_and_syncs_into_it_refuse_each_other(
    x: &cowlink_testfs::TestDir,
    subvolumes: bool,
) {
    let (big, small) = (x.path().join("big"), x.path().join("small"));
    long_listing(&big);
    fs::create_dir_all(&small).unwrap();
    fs::write(small.join("s"), b"small").unwrap();
    let root = x.path().join("snaps");
    ok(&cowlink(&[&"sync", &"--snapshot", &root, &slash(&small)]));
    let first = snapshot_names(&root).remove(0);
    {
        use std::os::unix::fs::MetadataExt;
        let ino = fs::metadata(root.join(&first)).unwrap().ino();
        if subvolumes {
            assert_eq!(
                ino, 256,
                "a Btrfs snapshot is a subvolume (its root is inode 256)"
            );
        }
    }

    // The snapshot run first.
    let snap = held_sync(&[&"--snapshot", &root, &slash(&big)], &root);
    let pid = snap.id();
    refused_by(
        &cowlink(&[&"sync", &slash(&small), &root]),
        pid,
        "another sync",
    );
    let into_old = root.join(&first);
    refused_by(
        &cowlink(&[&"sync", &slash(&small), &into_old.join("sub")]),
        pid,
        "which holds this directory",
    );
    refused_by(
        &cowlink(&[&"snapshot", &"prune", &root, &"--keep-last", &"1"]),
        pid,
        "",
    );
    release(snap);
    assert!(!into_old.join("sub").exists());
    let names = snapshot_names(&root);
    assert_eq!(names.len(), 2);
    assert_eq!(rsync_diff(&big, &root.join(&names[1]), true), "");

    // A sync into a snapshot first: the snapshot run is refused.
    let plain = held_sync(
        &[&slash(&big), &into_old.join("sub")],
        &into_old.join("sub"),
    );
    let pid = plain.id();
    let out = cowlink(&[&"sync", &"--snapshot", &root, &slash(&small)]);
    refused_by(&out, pid, "another sync");
    release(plain);
    assert_eq!(snapshot_names(&root), names, "a snapshot was begun");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_snapshot_root_and_syncs_into_it_refuse_each_other_xfs() {
    snapshot_root_and_syncs_into_it_refuse_each_other(&testfs!(Xfs), false);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_snapshot_root_and_syncs_into_it_refuse_each_other_btrfs() {
    snapshot_root_and_syncs_into_it_refuse_each_other(&testfs!(Btrfs), true);
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

/// `sync --snapshot ROOT -n` into a root with no complete snapshot:
/// everything is new, no made-up path shows, nothing is made.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_dry_run_snapshot_into_an_empty_root_lists_everything_new() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/f"), b"f").unwrap();
    let root = x.path().join("snaps");
    fs::create_dir(&root).unwrap();
    let out = cowlink(&[&"sync", &"-n", &"--snapshot", &root, &slash(&src)]);
    let (stdout, stderr) = (ok(&out), text(&out.stderr));
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, [">f+++++++++ d/f", "cd+++++++++ d/"]);
    assert!(stderr.contains("holds no complete snapshot"), "{stderr}");
    assert!(!stdout.contains("cowlink-none") && !stderr.contains("cowlink-none"));
    let v = json(&cowlink(&[
        &"sync",
        &"-n",
        &"--json",
        &"--snapshot",
        &root,
        &slash(&src),
    ]));
    assert!(v["snapshot"]["path"].is_null(), "{v}");
    assert!(v["snapshot"]["snapshot"].is_null(), "{v}");
    assert_eq!(v["summary"]["created"], 2);
    assert_eq!(
        fs::read_dir(&root).unwrap().count(),
        0,
        "the dry run made something"
    );
}

/// A directory a user cannot open to read cannot be locked by that
/// user's run: `sync` as nobody into `p/q/`, while root's run holds `p/`
/// (mode 0711: searchable, not readable), is still refused, naming the
/// holder, from the kernel's lock table; nothing is written.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_run_inside_an_unreadable_running_dst_is_refused_as_another_user() {
    use std::os::unix::fs::PermissionsExt;
    let x = testfs!(Xfs);
    let (big, small) = (x.path().join("big"), x.path().join("small"));
    long_listing(&big);
    fs::create_dir(&small).unwrap();
    fs::write(small.join("f"), b"f").unwrap();
    let p = x.path().join("p");
    let q = p.join("q");
    fs::create_dir_all(&q).unwrap();
    std::os::unix::fs::chown(&q, Some(65534), Some(65534)).unwrap();
    for d in [x.path(), &small] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::set_permissions(small.join("f"), fs::Permissions::from_mode(0o644)).unwrap();
    let outer = held_sync(&[&slash(&big), &slash(&p)], &p);
    fs::set_permissions(&p, fs::Permissions::from_mode(0o711)).unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .args([
            "sync".as_ref(),
            slash(&small).as_os_str(),
            slash(&q).as_os_str(),
        ])
        .output()
        .unwrap();
    refused_by(&out, outer.id(), &p.to_string_lossy());
    assert!(
        !q.join("f").exists(),
        "written while the outer run holds p/"
    );
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    release(outer);
}

/// One `--exclude-from` line longer than any path (a wrong file, a
/// generator gone wrong) is refused naming the file and the line, before
/// the matcher compiles it: compiled, a few MiB of one line took over a
/// GiB of memory.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn exclude_from_refuses_a_line_longer_than_any_path() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a.c"), b"c").unwrap();
    let list = x.path().join("long.list");
    let mut bytes = b"*.tmp\n".to_vec();
    bytes.extend(std::iter::repeat_n(b"*a", 4 << 20).flatten());
    bytes.push(b'\n');
    fs::write(&list, &bytes).unwrap();
    let out = cowlink(&[&"sync", &"--exclude-from", &list, &slash(&src), &dst]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains(&*list.to_string_lossy()), "{err}");
    assert!(
        err.contains("line 2 of the exclude file is longer than"),
        "{err}"
    );
    assert!(!dst.exists(), "the destination was made");
    // A line as long as a path is a pattern like any other.
    let name = "n".repeat(250);
    fs::write(src.join(&name), b"n").unwrap();
    fs::write(&list, format!("{}/../{name}\n{name}\n", "d".repeat(3800))).unwrap();
    ok(&cowlink(&[
        &"sync",
        &"--exclude-from",
        &list,
        &slash(&src),
        &dst,
    ]));
    assert!(dst.join("a.c").exists() && !dst.join(&name).exists());
}
