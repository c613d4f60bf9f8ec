//! The real `cowlink` binary on the real test filesystems.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use cowlink_testfs::{names, testfs};

use crate::common;
use crate::common::{cowlink, text};

fn shared(p: &Path) -> bool {
    let e = cowlink::extents::extents(p).unwrap().extents;
    !e.is_empty() && e.iter().all(|x| x.is_shared())
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_verbose_says_cloned_on_xfs_and_copied_on_ext4() {
    let (x, e) = (testfs!(Xfs), testfs!(Ext4));
    let src = x.path().join("a");
    fs::write(&src, vec![7u8; 300_000]).unwrap();
    let out = cowlink(&[&"cp", &"-v", &src, &x.path().join("b")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(": cloned, 293.0 KiB in "),
        "{}",
        text(&out.stdout)
    );
    assert!(shared(&x.path().join("b")));
    let out = cowlink(&[&"cp", &"-v", &src, &e.path()]);
    assert!(out.status.success());
    assert!(
        text(&out.stdout).contains(": copied (read/write)"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(fs::read(e.path().join("a")).unwrap(), vec![7u8; 300_000]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_always_across_filesystems_fails_with_reason_and_hint() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let src = x.path().join("a");
    fs::write(&src, b"data").unwrap();
    let dst = b.path().join("a");
    let out = cowlink(&[&"cp", &"--reflink=always", &src, &dst]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot clone '{}' to '{}': different filesystems (xfs → btrfs); use --reflink=auto to copy",
            src.display(),
            dst.display()
        )),
        "{err}"
    );
    assert!(names(b.path()).is_empty());
    // Bare --reflink means always, as in cp.
    let out = cowlink(&[&"cp", &"--reflink", &src, &dst]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_json_reports_method_bytes_and_errors() {
    let x = testfs!(Xfs);
    let (a, missing) = (x.path().join("a"), x.path().join("missing"));
    fs::write(&a, vec![1u8; 5000]).unwrap();
    let out_dir = x.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let out = cowlink(&[&"cp", &"--json", &a, &missing, &out_dir]);
    assert_eq!(out.status.code(), Some(1), "one source is missing");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &doc["results"];
    assert_eq!(r[0]["status"], "ok");
    assert_eq!(r[0]["method"], "reflink");
    assert_eq!(r[0]["bytes"], 5000);
    assert_eq!(r[1]["status"], "failed");
    assert_eq!(r[1]["error"]["kind"], "not_found");
    assert_eq!(r[1]["error"]["errno"], 2);
    assert_eq!(doc["summary"]["cloned"], 1);
    assert_eq!(doc["summary"]["failed"], 1);
    assert_eq!(names(&out_dir), ["a"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_existing_destination_is_replaced_keeping_its_mode_n_keeps_it() {
    let x = testfs!(Xfs);
    let (a, b) = (x.path().join("a"), x.path().join("b"));
    fs::write(&a, b"new").unwrap();
    fs::write(&b, b"old").unwrap();
    fs::set_permissions(&b, fs::Permissions::from_mode(0o600)).unwrap();
    let keep = x.path().join("hardlink-of-b");
    fs::hard_link(&b, &keep).unwrap();
    // -n keeps what exists.
    let out = cowlink(&[&"cp", &"-n", &a, &b]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(fs::read(&b).unwrap(), b"old");
    // As GNU cp: replaced by default, keeping the old file's mode; done
    // atomically, so another hardlink of the old file keeps its content.
    let out = cowlink(&[&"cp", &a, &b]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(fs::read(&b).unwrap(), b"new");
    assert_eq!(
        fs::metadata(&b).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(fs::read(&keep).unwrap(), b"old");
    assert!(shared(&b));
    // --remove-destination: a new file with the source's mode.
    fs::set_permissions(&a, fs::Permissions::from_mode(0o640)).unwrap();
    let out = cowlink(&[&"cp", &"--remove-destination", &a, &b]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        fs::metadata(&b).unwrap().permissions().mode() & 0o777,
        0o640
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_usage_errors_exit_2() {
    let x = testfs!(Xfs);
    let a = x.path().join("a");
    fs::write(&a, b"x").unwrap();
    for args in [
        vec![a.as_os_str().to_owned()],
        vec![
            "--reflink=sometimes".into(),
            a.as_os_str().into(),
            x.path().join("b").into(),
        ],
        vec![
            a.as_os_str().into(),
            a.as_os_str().into(),
            x.path().join("not-a-dir").into(),
        ],
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cowlink"));
        let out = c.arg("cp").args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(!text(&out.stderr).is_empty());
    }
    assert_eq!(names(x.path()), ["a"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_directory_without_r_is_refused_with_hint() {
    let x = testfs!(Xfs);
    fs::create_dir(x.path().join("d")).unwrap();
    let out = cowlink(&[&"cp", &x.path().join("d"), &x.path().join("e")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("-r not specified; omitting directory"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(names(x.path()), ["d"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_unreadable_source_as_unprivileged_user_is_permission_denied() {
    let x = testfs!(Xfs);
    if Command::new("setpriv").arg("--version").output().is_err() {
        panic!("setpriv (util-linux) is needed for this test; scripts/setup installs it");
    }
    let src = x.path().join("secret");
    fs::write(&src, b"secret").unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o000)).unwrap();
    let out_dir = x.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    fs::set_permissions(&out_dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::set_permissions(x.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .args([
            "cp".as_ref(),
            src.as_os_str(),
            out_dir.join("secret").as_os_str(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("permission denied"),
        "{}",
        text(&out.stderr)
    );
    assert!(names(&out_dir).is_empty());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_r_copies_a_tree_with_links_and_modes() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("sub/deeper")).unwrap();
    fs::write(src.join("top.txt"), b"top").unwrap();
    fs::write(src.join("sub/deeper/run.sh"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(
        src.join("sub/deeper/run.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("../top.txt", src.join("sub/link")).unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o750)).unwrap();
    let dst = x.path().join("dst");
    let out = cowlink(&[&"cp", &"-a", &"--json", &src, &dst]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["summary"]["files"], 2);
    assert_eq!(doc["summary"]["cloned"], 2);
    assert_eq!(doc["summary"]["symlinks"], 1);
    assert_eq!(doc["summary"]["dirs"], 3);
    assert_eq!(
        fs::read_link(dst.join("sub/link")).unwrap(),
        Path::new("../top.txt")
    );
    assert!(shared(&dst.join("top.txt")));
    // rsync (checksums, perms, times, links) sees no difference.
    let rs = Command::new("rsync")
        .args(["-ani", "--checksum", "--no-owner", "--no-group"])
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dst.display()))
        .output()
        .expect("rsync is needed; scripts/setup installs it");
    assert!(rs.status.success());
    assert_eq!(text(&rs.stdout), "", "rsync found differences");
    // Copying a directory into itself is refused.
    let out = cowlink(&[&"cp", &"-r", &src, &src.join("sub")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("into itself"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn probe_answers_in_text_json_and_exit_code() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let out = cowlink(&[&"probe", &"--json", &x.path()]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "xfs");
    assert_eq!(doc["reflink"]["answer"], "yes");
    let f = x.path().join("f");
    fs::write(&f, b"probe me").unwrap();
    let out = cowlink(&[&"probe", &f, &b.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("no — different filesystems (xfs → btrfs)"),
        "{}",
        text(&out.stdout)
    );
    let out = cowlink(&[&"probe", &f, &x.path()]);
    assert_eq!(out.status.code(), Some(0));
    let root = x.path().parent().unwrap().parent().unwrap();
    let out = cowlink(&[&"probe", &"--tree", &"--json", &root]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["fstype"] == "btrfs" && m["facts"]["reflink"]["answer"] == "yes"));
    // Text tables fit their content: no line ends in padding.
    for args in [vec![x.path()], vec![f.as_path(), b.path()], vec![root]] {
        let mut c = common::bin();
        c.arg("probe");
        if args.len() == 1 && args[0] == root {
            c.arg("--tree");
        }
        let out = c.args(&args).output().unwrap();
        for line in text(&out.stdout).lines() {
            assert_eq!(line, line.trim_end(), "padded: {line:?}");
        }
    }
    // A missing path is a failed operation (1), as in every subcommand.
    let out = cowlink(&[&"probe", &"/no/such/path"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/no/such/path"));
}

/// A mount that never answers (a FUSE server that reads nothing, like a
/// stale network mount): every form of probe, the first `stat` of its
/// arguments included, says "no answer" within its 5 s deadline instead of
/// hanging. The forms run in parallel, so the test takes one deadline.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn probe_never_hangs_on_a_mount_that_never_answers() {
    let x = testfs!(Xfs);
    let dead = cowlink_testfs::DeadFuse::mount()
        .unwrap_or_else(|why| panic!("the unresponsive FUSE mount could not be made: {why}"));
    let d = dead.path().to_path_buf();
    let inside = d.join("file");
    let f = x.path().join("f");
    fs::write(&f, b"probe me").unwrap();
    let forms: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["probe".into(), d.clone().into()],
        vec!["probe".into(), "--json".into(), inside.clone().into()],
        vec!["probe".into(), f.clone().into(), d.clone().into()],
        vec!["probe".into(), inside.clone().into(), x.path().into()],
        vec!["probe".into(), "--tree".into(), d.clone().into()],
    ];
    let children: Vec<_> = forms
        .iter()
        .map(|a| {
            common::bin()
                .args(a)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = std::time::Instant::now();
    for (mut child, args) in children.into_iter().zip(&forms) {
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > std::time::Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{args:?} hung on the unresponsive mount");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(all.contains("no answer within 5 s"), "{args:?}: {all}");
        assert_ne!(out.status.code(), Some(2), "{args:?}: {all}");
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "the deadline is 5 s: {:?}",
        start.elapsed()
    );
    drop(dead);
}

/// Pseudo files report sizes that reading does not give back: procfs 0,
/// sysfs a page. The copy holds exactly what reading gives, as GNU cp's.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_pseudo_files_are_read_to_their_end() {
    let x = testfs!(Xfs);
    let d = x.path();
    // procfs: stat says 0 bytes.
    for (src, name) in [
        ("/proc/version", "version"),
        ("/proc/sys/kernel/ostype", "ostype"),
    ] {
        assert_eq!(
            fs::metadata(src).unwrap().len(),
            0,
            "{src} no longer reports 0 bytes"
        );
        let out = cowlink(&[&"cp", &src, &d.join(name)]);
        assert!(out.status.success(), "{src}: {}", text(&out.stderr));
        let copy = fs::read(d.join(name)).unwrap();
        assert!(!copy.is_empty(), "{src} copied as 0 bytes");
        assert_eq!(copy, fs::read(src).unwrap(), "{src}");
    }
    // /proc/cpuinfo changes between reads (clock rates): only its shape.
    let out = cowlink(&[&"cp", &"/proc/cpuinfo", &d.join("cpuinfo")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(fs::read_to_string(d.join("cpuinfo"))
        .unwrap()
        .contains("processor"));
    // sysfs: stat says 4096 bytes for an 18-byte attribute.
    let attr = "/sys/class/net/lo/address";
    assert_eq!(fs::metadata(attr).unwrap().len(), 4096, "{attr}");
    let out = cowlink(&[&"cp", &attr, &d.join("address")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        fs::read(d.join("address")).unwrap(),
        fs::read(attr).unwrap()
    );
    // A whole procfs directory: every file holds what reading gives.
    let out = cowlink(&[&"cp", &"-r", &"/proc/sys/kernel/random", &d.join("random")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for e in fs::read_dir(d.join("random")).unwrap() {
        let p = e.unwrap().path();
        assert!(
            fs::metadata(&p).unwrap().len() > 0,
            "{} copied as 0 bytes",
            p.display()
        );
    }
    assert_eq!(
        fs::read(d.join("random/boot_id")).unwrap(),
        fs::read("/proc/sys/kernel/random/boot_id").unwrap()
    );
}

/// An active swap file: swapped off again when dropped, even on a panic.
struct Swap(std::path::PathBuf);

impl Swap {
    fn on(path: &Path) -> Swap {
        let sbin = |tool: &str| {
            ["/usr/sbin", "/sbin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{tool} is installed (util-linux)"))
        };
        let f = fs::File::create(path).unwrap();
        // Written, not fallocated: swapon refuses files with holes or
        // unwritten extents.
        std::io::Write::write_all(&mut &f, &vec![0u8; 16 << 20]).unwrap();
        f.sync_all().unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
        let ok = |c: &mut Command| c.status().unwrap().success();
        assert!(ok(Command::new(sbin("mkswap")).arg("-q").arg(path)));
        assert!(
            ok(Command::new(sbin("swapon")).arg(path)),
            "swapon {} failed (the tests run as root)",
            path.display()
        );
        Swap(path.to_path_buf())
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
        let _ = Command::new("/usr/sbin/swapoff").arg(&self.0).status();
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_active_swap_file_is_copied_by_auto_and_refused_by_always_with_reason() {
    let x = testfs!(Xfs);
    let d = x.path();
    let swap = Swap::on(&d.join("swapfile"));
    let src = &swap.0;
    // Auto falls back to a copy (the kernel never clones a swap file).
    let out = cowlink(&[&"cp", &"-v", src, &d.join("auto")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("copied"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(fs::read(d.join("auto")).unwrap(), fs::read(src).unwrap());
    // Always refuses, saying why.
    let out = cowlink(&[&"cp", &"--reflink=always", src, &d.join("always")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("active swap file"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.join("always").exists());
    // probe names the reason, and other files of the same filesystem still
    // clone (the answer is the file's, not the pair of filesystems').
    let out = cowlink(&[&"probe", src, &d.join("x")]);
    assert!(
        text(&out.stdout).contains("active swap file"),
        "{}",
        text(&out.stdout)
    );
    fs::write(d.join("plain"), b"data").unwrap();
    let out = cowlink(&[&"probe", &d.join("plain"), &d.join("y")]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

/// One rule for every subcommand (docs/guide.md, "Exit codes, messages and output"): a
/// missing path is a failed operation (1) reported once, by its name; an
/// empty path or `-j 0` is a usage error (2); `-j` above the cap says so.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn exit_codes_and_messages_follow_one_rule() {
    let x = testfs!(Xfs);
    let missing = x.path().join("missing");
    let m = missing.to_str().unwrap();
    let dest = x.path().join("dest");
    let cases: [(&str, Vec<&dyn AsRef<std::ffi::OsStr>>); 6] = [
        ("cp", vec![&"cp", &m, &dest]),
        ("bench", vec![&"bench", &m]),
        ("probe", vec![&"probe", &m]),
        ("du", vec![&"du", &m]),
        ("dedupe", vec![&"dedupe", &m]),
        ("extents", vec![&"extents", &m]),
    ];
    for (name, args) in &cases {
        let out = cowlink(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(m)
                && (err.to_lowercase().contains("no such file") || err.contains("does not exist")),
            "{name}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{name}: one message: {err}");
        assert!(!err.contains("cannot deduplicate: cannot"), "{name}: {err}");
        assert!(
            text(&out.stdout).is_empty(),
            "{name}: no row (not even a header) for {m}: {}",
            text(&out.stdout)
        );
    }
    for args in [
        vec!["cp", "", "x"],
        vec!["probe", ""],
        vec!["du", ""],
        vec!["dedupe", ""],
        vec!["extents", ""],
        vec!["store", "add-tree", ""],
    ] {
        let a: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|s| s as _).collect();
        let out = cowlink(&a);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains("names no file"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let store = x.path().join("store");
    let s = store.to_str().unwrap();
    for args in [
        vec!["cp", "-r", "-j", "0", m, "x"],
        vec!["du", "-j", "0", m],
        vec!["dedupe", "-j", "0", m],
        vec!["store", "--store", s, "-j", "0", "ls"],
    ] {
        let a: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|s| s as _).collect();
        let out = cowlink(&a);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains("0 threads"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = cowlink(&[&"store", &"--store", &s, &"-j", &"500", &"ls"]);
    assert!(
        text(&out.stderr).contains("-j 500 is more threads than help; using 64"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_nocow_refusal_is_named_and_auto_copies() {
    let b = testfs!(Btrfs);
    let src = b.path().join("nocow");
    fs::File::create(&src).unwrap();
    let st = Command::new("chattr").arg("+C").arg(&src).status().unwrap();
    assert!(st.success(), "chattr +C");
    fs::write(&src, vec![3u8; 200_000]).unwrap();
    let dst = b.path().join("copy");
    let out = cowlink(&[&"cp", &"--reflink=always", &src, &dst]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("the source is a NOCOW file (chattr +C) and the destination is not"),
        "{err}"
    );
    assert!(!err.contains("something else refused"), "{err}");
    assert!(!dst.exists(), "nothing left under the name");
    let out = cowlink(&[&"cp", &"-v", &src, &dst]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("copied"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(fs::read(&dst).unwrap(), vec![3u8; 200_000]);
}

/// As in GNU cp: long options may be abbreviated, a repeated option is
/// allowed and the last one wins, and repeated `--preserve` lists add up.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cp_takes_abbreviated_and_repeated_options_as_gnu_cp_does() {
    let x = testfs!(Xfs);
    let a = x.path().join("a");
    fs::write(&a, b"gnu").unwrap();
    // The last --reflink wins: never clone, so a copy.
    let out = cowlink(&[
        &"cp",
        &"--reflink=always",
        &"--reflink=never",
        &"-v",
        &a,
        &x.path().join("b"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("copied"),
        "{}",
        text(&out.stdout)
    );
    assert!(!shared(&x.path().join("b")));
    // Abbreviations (unique prefixes), and a flag given twice.
    let out = cowlink(&[
        &"cp",
        &"--rec",
        &"-r",
        &"--verb",
        &"--refl=always",
        &a,
        &x.path().join("c"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cloned"),
        "{}",
        text(&out.stdout)
    );
    // --preserve lists add up, as in GNU cp (times and xattrs both kept).
    let st = Command::new("setfattr")
        .args(["-n", "user.k", "-v", "v"])
        .arg(&a)
        .status()
        .unwrap();
    assert!(st.success());
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    fs::File::options()
        .write(true)
        .open(&a)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let d = x.path().join("d");
    let out = cowlink(&[&"cp", &"--preserve=xattr", &"--pres=timestamps", &a, &d]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fs::metadata(&d).unwrap().modified().unwrap(), old);
    let got = Command::new("getfattr")
        .args(["--only-values", "-n", "user.k"])
        .arg(&d)
        .output()
        .unwrap();
    assert_eq!(got.stdout, b"v");
    // An ambiguous abbreviation is a usage error (exit 2) naming the choices.
    let out = cowlink(&[&"cp", &"--p", &a, &x.path().join("e")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
