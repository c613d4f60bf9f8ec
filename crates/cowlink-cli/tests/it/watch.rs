//! `cowlink dedupe --watch` as a running process on the real test
//! filesystems: new duplicates written under a watched root come to share
//! their blocks (polled with FIEMAP, up to 60 s), an excluded path is
//! never touched, SIGTERM stops the watch with exit 0, a Btrfs subvolume
//! is watched through its mount point or directory by directory (and it
//! says so), the root check gives the sudo line, and `--install-unit`
//! writes a unit systemd's own checker accepts.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cowlink_testfs::{data, testfs, write_file};

use crate::common::{bin, shares_extents_with, text};

/// A running watch: its process and its stdout and stderr lines as they
/// come.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watch {
    fn start(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Watch {
        let mut cmd = bin();
        cmd.args(["dedupe", "--watch", "--quiet-period", "300ms"]);
        for a in args {
            cmd.arg(a);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Watch {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Wait (at most 60 s) for a line containing `what`.
    fn wait_for(&mut self, what: &str) {
        let start = Instant::now();
        while !self.seen.iter().any(|l| l.contains(what)) {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.drain();
                panic!(
                    "the watch ended ({status}) before {what:?}: {:#?}",
                    self.seen
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {what:?} within 60 s: {:#?}",
                self.seen
            );
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push(l);
            }
        }
    }

    fn drain(&mut self) {
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
    }

    /// SIGTERM, then the exit code (within 20 s) and every line.
    fn stop(mut self) -> (Option<i32>, Vec<String>) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                panic!("still running 20 s after SIGTERM: {:#?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.drain();
        (status.code(), std::mem::take(&mut self.seen))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // A failed assertion must not leave the watch running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll (at most 60 s) until `b` shares `a`'s blocks.
fn until_shared(a: &Path, b: &Path, w: &Watch) {
    let start = Instant::now();
    while !shares_extents_with(a, b) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} and {} still not shared after 60 s: {:#?}",
            a.display(),
            b.display(),
            w.seen
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// No extent of `p` is shared.
fn not_shared(p: &Path) -> bool {
    let e = cowlink::extents::extents(p).unwrap().extents;
    !e.is_empty() && e.iter().all(|x| !x.is_shared())
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn new_duplicates_on_xfs_come_to_share_and_sigterm_exits_0() {
    let x = testfs!(Xfs);
    let root = x.path().join("watched");
    fs::create_dir_all(root.join("skip/deeper")).unwrap();
    fs::create_dir_all(root.join("sub")).unwrap();
    // A duplicate pair from before the watch: the start rescan takes it.
    let old = data(200_000, 3);
    write_file(&root.join("old1"), &old);
    write_file(&root.join("sub/old2"), &old);

    let mut w = Watch::start(&[&"--exclude", &"skip", &root]);
    w.wait_for("start: every path");
    until_shared(&root.join("old1"), &root.join("sub/old2"), &w);

    // Two new duplicates, and a third copy under the excluded directory.
    let new = data(300_000, 11);
    write_file(&root.join("a.bin"), &new);
    write_file(&root.join("sub/b.bin"), &new);
    write_file(&root.join("skip/deeper/c.bin"), &new);
    until_shared(&root.join("a.bin"), &root.join("sub/b.bin"), &w);
    assert_eq!(fs::read(root.join("sub/b.bin")).unwrap(), new);

    // The excluded copy was neither a target nor a source.
    assert!(not_shared(&root.join("skip/deeper/c.bin")));
    assert_eq!(fs::read(root.join("skip/deeper/c.bin")).unwrap(), new);

    let (code, lines) = w.stop();
    assert_eq!(code, Some(0), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("by its whole filesystem")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("stopped: ")),
        "{lines:#?}"
    );
    // A batch for the changed paths, not only the start.
    assert!(
        lines.iter().any(|l| l.contains("changed path")),
        "{lines:#?}"
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_bad_exclude_pattern_and_no_root_are_refused_before_watching() {
    let x = testfs!(Xfs);
    let out = bin()
        .args(["dedupe", "--watch", "--exclude", "[oops"])
        .arg(x.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("[oops"), "{}", text(&out.stderr));

    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .args(["dedupe", "--watch"])
        .arg(x.path())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs root") && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "sudo {} dedupe --watch",
            env!("CARGO_BIN_EXE_cowlink")
        )),
        "{err}"
    );
}

/// A mount this test made, unmounted when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = fs::remove_dir(&self.0);
    }
}

/// The device the filesystem holding `p` is mounted from, and its mount
/// point (`findmnt`).
fn source_of(p: &Path) -> (String, PathBuf) {
    let out = Command::new("findmnt")
        .args(["-n", "-o", "SOURCE,TARGET", "--target"])
        .arg(p)
        .output()
        .unwrap();
    let s = text(&out.stdout);
    let (src, target) = s.trim().split_once(' ').unwrap();
    // A subvolume mount shows as /dev/loopN[/subvol].
    (
        src.split('[').next().unwrap().to_string(),
        PathBuf::from(target.trim()),
    )
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_btrfs_subvolume_is_watched_through_its_mount_or_its_directories() {
    let b = testfs!(Btrfs);
    let sv = b.path().join("sv");
    let made = Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&sv)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));

    // Watched by a path inside the filesystem's own mount: a filesystem
    // mark on the subvolume is refused (EXDEV), the mount point takes it.
    let mut w = Watch::start(&[&sv]);
    w.wait_for("start: every path");
    let new = data(300_000, 21);
    write_file(&sv.join("a.bin"), &new);
    write_file(&sv.join("b.bin"), &new);
    until_shared(&sv.join("a.bin"), &sv.join("b.bin"), &w);
    let (code, lines) = w.stop();
    assert_eq!(code, Some(0), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("EXDEV") && l.contains("through its mount point")),
        "{lines:#?}"
    );

    // The subvolume mounted by itself (subvol=): filesystem and mount
    // marks are both refused; every directory gets a mark, and so does a
    // directory made while watching.
    let mnt = b.path().join("svmnt");
    fs::create_dir(&mnt).unwrap();
    let (dev, top) = source_of(b.path());
    let rel = sv.strip_prefix(&top).unwrap();
    let st = Command::new("mount")
        .arg("-o")
        .arg(format!("subvol={}", rel.display()))
        .arg(&dev)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(st.status.success(), "mount {dev}: {}", text(&st.stderr));
    let _m = Mounted(mnt.clone());
    fs::create_dir_all(mnt.join("d1/d2")).unwrap();
    let mut w = Watch::start(&[&mnt]);
    w.wait_for("start: every path");
    fs::create_dir_all(mnt.join("late/deeper")).unwrap();
    // The new directories' marks are set when their events are read.
    std::thread::sleep(Duration::from_millis(500));
    let other = data(200_000, 22);
    write_file(&mnt.join("d1/d2/c.bin"), &other);
    write_file(&mnt.join("late/deeper/d.bin"), &other);
    until_shared(&mnt.join("d1/d2/c.bin"), &mnt.join("late/deeper/d.bin"), &w);
    let (code, lines) = w.stop();
    assert_eq!(code, Some(0), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("by marks on each of its directories")),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l.contains("one by one")), "{lines:#?}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn install_unit_writes_a_service_systemd_analyze_accepts() {
    let x = testfs!(Xfs);
    let root = x.path().join("watched dir");
    fs::create_dir(&root).unwrap();
    let units = x.path().join("units");
    let out = bin()
        .args([
            "dedupe",
            "--watch",
            "--install-unit",
            "--exclude",
            "*.tmp",
            "--quiet-period",
            "5s",
            "--unit-dir",
        ])
        .arg(&units)
        .arg(&root)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let files: Vec<PathBuf> = fs::read_dir(&units)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("cowlink-dedupe-watch-") && name.ends_with("watched\\x20dir.service"),
        "{name}"
    );
    let unit = fs::read_to_string(file).unwrap();
    for must in [
        format!("\"{}\"", env!("CARGO_BIN_EXE_cowlink")),
        "\"dedupe\" \"--watch\"".into(),
        "\"--quiet-period=5000ms\"".into(),
        "\"--exclude=*.tmp\"".into(),
        format!("\"--\" \"{}\"", root.display()),
        format!("RequiresMountsFor=\"{}\"", root.display()),
        "WantedBy=multi-user.target".into(),
    ] {
        assert!(unit.contains(&must), "{must:?} not in:\n{unit}");
    }
    // PID 1 is not systemd here: written, not started, and it says so.
    if !Path::new("/run/systemd/system").is_dir() {
        assert!(stdout.contains("not started"), "{stdout}");
    }
    // systemd's own checker, run again here on the file written.
    let v = Command::new("systemd-analyze")
        .arg("verify")
        .arg(file)
        .output()
        .expect("systemd-analyze (scripts/setup installs systemd)");
    assert!(
        v.status.success() && text(&v.stderr).trim().is_empty(),
        "systemd-analyze verify: {}",
        text(&v.stderr)
    );
    assert!(stdout.contains("no complaint"), "{stdout}{stderr}");
    // Nothing was started: no watch is running on the root.
    assert!(!stdout.contains("watching"), "{stdout}");
}
