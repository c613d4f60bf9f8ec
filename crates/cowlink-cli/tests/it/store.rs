//! `cowlink store` across processes on the real test filesystems: a round
//! trip, the store location rules, 8 concurrent adders and checkouts (with
//! gc running too), kill -9 during an add, hostile manifest files, ext4.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cowlink_testfs::{data, names, temporaries, testfs, write_file};

use crate::common::{bin, json, ok, store, text};

/// Every regular file below `root`, relative, with its bytes.
fn contents(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push((
                    e.path().strip_prefix(root).unwrap().to_path_buf(),
                    fs::read(e.path()).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// A tree of `n` files in 10 directories; file `k` has the content of
/// seed `seed0 + k` (length and bytes), so trees with overlapping seed
/// ranges share contents.
fn tree(root: &Path, n: usize, seed0: u64, size: usize) {
    for k in 0..n {
        let seed = seed0 + k as u64;
        let p = root.join(format!("d{}/f{k}", k % 10));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data(size + (seed % 997) as usize, seed)).unwrap();
    }
    std::os::unix::fs::symlink("d0/f0", root.join("link")).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn round_trip_and_listing() {
    let x = testfs!(Xfs);
    let (src, st, out) = (
        x.path().join("src"),
        x.path().join("store"),
        x.path().join("out"),
    );
    tree(&src, 40, 1, 10_000);
    fs::set_permissions(src.join("d3/f3"), fs::Permissions::from_mode(0o751)).unwrap();
    let add = store(&st, &[&"add-tree", &src]);
    let digest = ok(&add).trim().to_string();
    assert_eq!(digest.len(), 64, "stdout is the digest alone: {digest}");
    assert!(
        text(&add.stderr).contains("stored 40 files"),
        "{}",
        text(&add.stderr)
    );
    let co = ok(&store(&st, &[&"checkout", &digest, &out]));
    assert!(
        co.contains("checked out 40 files") && co.contains("40 cloned"),
        "{co}"
    );
    assert_eq!(contents(&src), contents(&out));
    assert_eq!(fs::read_link(out.join("link")).unwrap(), Path::new("d0/f0"));
    assert_eq!(
        fs::metadata(out.join("d3/f3"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o751
    );
    let ls = ok(&store(&st, &[&"ls"]));
    assert!(ls.contains(&digest) && ls.contains("40"), "{ls}");
    let entries = ok(&store(&st, &[&"ls", &digest]));
    assert!(
        entries.contains("f 0751")
            && entries.contains("d3/f3")
            && entries.contains("link -> d0/f0"),
        "{entries}"
    );
    let stats = json(&store(&st, &[&"--json", &"stats"]));
    assert_eq!(stats["objects"], 40);
    assert_eq!(stats["manifests"], 1);
    let v = ok(&store(&st, &[&"verify"]));
    assert!(
        v.contains("checked 40 objects") && v.contains("all good"),
        "{v}"
    );
    // One file back by digest; then it exists and is refused.
    let f0 = fs::read(src.join("d0/f0")).unwrap();
    let added = ok(&store(&st, &[&"add", &src.join("d0/f0")]));
    assert!(added.contains("already stored"), "{added}");
    let d0 = added.split_whitespace().next().unwrap().to_string();
    let one = x.path().join("one");
    ok(&store(&st, &[&"materialize", &d0, &one]));
    assert_eq!(fs::read(&one).unwrap(), f0);
    let again = store(&st, &[&"materialize", &d0, &one]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again.stderr).contains("already exists"),
        "{}",
        text(&again.stderr)
    );
    let bad = store(
        &st,
        &[&"materialize", &"../../etc/passwd", &x.path().join("p")],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains("not a BLAKE3 digest"),
        "{}",
        text(&bad.stderr)
    );
    // A non-empty destination is refused before anything is written.
    let busy = store(&st, &[&"checkout", &digest, &out]);
    assert_eq!(busy.status.code(), Some(2));
    assert!(
        text(&busy.stderr).contains("not empty"),
        "{}",
        text(&busy.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn store_location_follows_flag_env_and_xdg() {
    let x = testfs!(Xfs);
    let f = x.path().join("f");
    write_file(&f, b"where am I");
    let run = |envs: &[(&str, &Path)]| {
        let mut c = bin();
        c.args(["store", "add"])
            .arg(&f)
            .env_remove("COWLINK_STORE")
            .env_remove("XDG_CACHE_HOME");
        for (k, v) in envs {
            c.env(k, v);
        }
        ok(&c.output().unwrap());
    };
    let home = x.path().join("home");
    run(&[("HOME", &home)]);
    assert!(home.join(".cache/cowlink/store/cowlink-store").exists());
    let xdg = x.path().join("xdg");
    run(&[("HOME", &home), ("XDG_CACHE_HOME", &xdg)]);
    assert!(xdg.join("cowlink/store/cowlink-store").exists());
    let env = x.path().join("env-store");
    run(&[
        ("HOME", &home),
        ("XDG_CACHE_HOME", &xdg),
        ("COWLINK_STORE", &env),
    ]);
    assert!(env.join("cowlink-store").exists());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn eight_processes_add_and_check_out_concurrently() {
    let x = testfs!(Btrfs);
    let st = x.path().join("store");
    // Tree i holds contents i*100 .. i*100+300: neighbours share 2/3.
    let srcs: Vec<PathBuf> = (0..8).map(|i| x.path().join(format!("src{i}"))).collect();
    for (i, s) in srcs.iter().enumerate() {
        tree(s, 300, i as u64 * 100, 20_000);
    }
    // One tree stored before, checked out while the others are added.
    let base = ok(&store(&st, &[&"add-tree", &srcs[0]])).trim().to_string();
    let sh = |script: String| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("COWLINK_STORE", &st)
            .env("B", env!("CARGO_BIN_EXE_cowlink"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut kids = Vec::new();
    for (i, s) in srcs.iter().enumerate() {
        let out = x.path().join(format!("out{i}"));
        let extra = x.path().join(format!("base{i}"));
        kids.push(sh(format!(
            "set -e; M=$(\"$B\" store add-tree '{}'); \"$B\" store checkout $M '{}' >/dev/null; \
             \"$B\" store checkout {base} '{}' >/dev/null",
            s.display(),
            out.display(),
            extra.display()
        )));
    }
    // And gc, keeping every manifest, racing with the adds.
    kids.push(sh(
        "for k in 1 2 3 4 5; do \"$B\" store gc >/dev/null; done".into(),
    ));
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    for (i, s) in srcs.iter().enumerate() {
        assert_eq!(
            contents(s),
            contents(&x.path().join(format!("out{i}"))),
            "tree {i}"
        );
        assert_eq!(
            contents(&srcs[0]),
            contents(&x.path().join(format!("base{i}"))),
            "base {i}"
        );
    }
    let v = ok(&store(&st, &[&"verify"]));
    assert!(v.contains("all good"), "{v}");
    let stats = json(&store(&st, &[&"--json", &"stats"]));
    assert_eq!(stats["manifests"], 8);
    assert_eq!(stats["objects"], 1000, "contents 0..1000, each stored once");
    assert!(temporaries(&st).is_empty());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_9_during_add_leaves_a_consistent_store() {
    let x = testfs!(Xfs);
    let (src, st) = (x.path().join("src"), x.path().join("store"));
    tree(&src, 4000, 7, 30_000);
    let mut child = bin()
        .args(["store", "add-tree"])
        .arg(&src)
        .env("COWLINK_STORE", &st)
        .arg("-j1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once objects are appearing, well before it can finish.
    let deadline = Instant::now() + Duration::from_secs(20);
    let objects = || {
        (0..=255)
            .map(|i| fs::read_dir(st.join(format!("objects/{i:02x}"))).map_or(0, |d| d.count()))
            .sum::<usize>()
    };
    while objects() < 50 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let stored = objects();
    assert!(
        (50..4000).contains(&stored),
        "killed mid-add ({stored} objects)"
    );
    assert!(
        names(&st.join("manifests")).is_empty(),
        "the add never finished"
    );
    assert!(
        temporaries(&st).is_empty(),
        "O_TMPFILE: nothing half-written has a name"
    );
    let v = ok(&store(&st, &[&"verify"]));
    assert!(v.contains("all good"), "{v}");
    let gc = json(&store(&st, &[&"--json", &"gc"]));
    assert_eq!(
        gc["objects_removed"], stored as u64,
        "the unreferenced objects go"
    );
    // The next run completes and checks out identically.
    let m = ok(&store(&st, &[&"add-tree", &src])).trim().to_string();
    ok(&store(&st, &[&"checkout", &m, &x.path().join("out")]));
    assert_eq!(contents(&src), contents(&x.path().join("out")));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn hostile_manifest_files_are_rejected() {
    let x = testfs!(Xfs);
    let st = x.path().join("store");
    let f = x.path().join("f");
    write_file(&f, b"payload");
    let d = ok(&store(&st, &[&"add", &f]))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let file =
        |p: &str| format!(r#"{{"path":"{p}","type":"file","digest":"{d}","size":7,"mode":420}}"#);
    let cases = [
        (file("../escape"), "path traversal"),
        (file("/tmp/escape"), "absolute"),
        (
            format!(
                r#"{{"path":"l","type":"symlink","target":"{}"}}"#,
                x.path().display()
            ),
            "points outside the tree",
        ),
        (
            format!(
                r#"{{"path":"l","type":"symlink","target":"in"}},{}"#,
                file("l/escape")
            ),
            "not a directory in the manifest",
        ),
        // `s` is the root, so `s/s/..` is its parent.
        (
            r#"{"path":"l","type":"symlink","target":"s/s/.."},{"path":"s","type":"symlink","target":"."}"#
                .to_string(),
            "points outside the tree",
        ),
        // Twelve levels up through a link to the directory above.
        (
            format!(
                r#"{{"path":"a","type":"dir","mode":493}},{{"path":"a/up","type":"symlink","target":".."}},{{"path":"x","type":"symlink","target":"{}../../../../../../../../../../../etc/passwd"}}"#,
                "a/up/".repeat(12)
            ),
            "points outside the tree",
        ),
    ];
    for (i, (entries, why)) in cases.iter().enumerate() {
        let mf = x.path().join(format!("evil{i}.json"));
        fs::write(
            &mf,
            format!(r#"{{"format":"cowlink-manifest","version":1,"entries":[{entries}]}}"#),
        )
        .unwrap();
        let dest = x.path().join(format!("dest{i}"));
        let out = store(&st, &[&"checkout", &mf, &dest]);
        assert_eq!(out.status.code(), Some(2), "case {i}");
        let err = text(&out.stderr);
        assert!(
            err.contains(why) && err.contains("invalid manifest"),
            "case {i}: {err}"
        );
        assert!(!dest.exists());
    }
    assert!(!Path::new("/tmp/escape").exists());
    assert!(!x.path().join("escape").exists());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ext4_checkout_needs_auto_and_then_copies() {
    let e = testfs!(Ext4);
    let (src, st) = (e.path().join("src"), e.path().join("store"));
    tree(&src, 20, 3, 5000);
    let m = ok(&store(&st, &[&"add-tree", &src])).trim().to_string();
    // Clone-only (the default) is refused before anything is written:
    // no directory, no dangling symlink, nothing (exit 2: nothing could
    // start), with the reason and the way out.
    let out = store(&st, &[&"checkout", &m, &e.path().join("clone")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let msg = text(&out.stderr);
    assert!(
        msg.contains("ext4 cannot clone")
            && msg.contains("nothing was written")
            && msg.contains("--link auto"),
        "{msg}"
    );
    assert!(!e.path().join("clone").exists());
    // Into an existing empty directory: it stays empty.
    fs::create_dir(e.path().join("empty")).unwrap();
    let out = store(&st, &[&"checkout", &m, &e.path().join("empty")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(fs::read_dir(e.path().join("empty")).unwrap().count(), 0);
    let new = store(
        &st,
        &[&"checkout", &"--link", &"auto", &m, &e.path().join("auto")],
    );
    let co = ok(&new);
    assert!(co.contains("0 cloned, 20 copied"), "{co}");
    assert!(
        !text(&new.stderr).contains("deprecated"),
        "{}",
        text(&new.stderr)
    );
    assert_eq!(contents(&src), contents(&e.path().join("auto")));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn the_old_mode_flag_still_works_warns_and_is_hidden() {
    let e = testfs!(Ext4);
    let (src, st) = (e.path().join("src"), e.path().join("store"));
    tree(&src, 5, 9, 3000);
    let m = ok(&store(&st, &[&"add-tree", &src])).trim().to_string();
    // `--mode auto` is `--link auto`, with a warning on stderr.
    let old = store(
        &st,
        &[&"checkout", &"--mode", &"auto", &m, &e.path().join("old")],
    );
    let co = ok(&old);
    assert!(co.contains("0 cloned, 5 copied"), "{co}");
    assert!(
        text(&old.stderr).contains("warning: --mode is deprecated; use --link"),
        "{}",
        text(&old.stderr)
    );
    assert_eq!(contents(&src), contents(&e.path().join("old")));
    // And for one object.
    let digest = ok(&store(&st, &[&"add", &src.join("d0/f0")]));
    let digest = digest.split_whitespace().next().unwrap().to_string();
    let one = store(
        &st,
        &[
            &"materialize",
            &"--mode",
            &"copy",
            &digest,
            &e.path().join("one"),
        ],
    );
    assert!(ok(&one).starts_with("copied"), "{}", text(&one.stdout));
    assert!(text(&one.stderr).contains("--mode is deprecated"));
    assert_eq!(
        fs::read(e.path().join("one")).unwrap(),
        fs::read(src.join("d0/f0")).unwrap()
    );
    // Both spellings at once are refused before anything is written.
    let both = store(
        &st,
        &[
            &"checkout",
            &"--link",
            &"copy",
            &"--mode",
            &"auto",
            &m,
            &e.path().join("both"),
        ],
    );
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
    assert!(!e.path().join("both").exists());
    // Help shows --link only.
    let help = bin()
        .args(["store", "checkout", "--help"])
        .output()
        .unwrap();
    let help = ok(&help);
    assert!(
        help.contains("--link <HOW>") && !help.contains("--mode"),
        "{help}"
    );
}

/// Open the directory `levels` levels of `d` below `root`, one `openat`
/// at a time (the path is longer than PATH_MAX).
fn open_chain(root: &Path, levels: usize) -> std::fs::File {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(root, flags, Mode::empty()).unwrap();
    for _ in 0..levels {
        dir = rustix::fs::openat(&dir, "d", flags, Mode::empty()).unwrap();
    }
    dir.into()
}

fn read_at(dir: &std::fs::File, name: &str) -> Vec<u8> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut v = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut v).unwrap();
    v
}

/// A 3000-level tree (paths of 6,000 bytes, beyond PATH_MAX) goes into the
/// store and comes back out whole: the store works relative to directory
/// descriptors, as `cp -a` does, and leaves no loose object.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn trees_deeper_than_path_max_round_trip() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    let body = data(20_000, 5);
    cowlink_testfs::deep_chain(&src, 3000, &[1500, 3000], &body);
    let st = x.path().join("store");
    let out = ok(&store(&st, &[&"add-tree", &src]));
    let digest = out.lines().next().unwrap().trim().to_owned();
    assert_eq!(digest.len(), 64, "{out}");
    // One object for the four identical files, and it is in the manifest.
    let objects: usize = fs::read_dir(st.join("objects"))
        .unwrap()
        .flatten()
        .map(|d| fs::read_dir(d.path()).unwrap().count())
        .sum();
    assert_eq!(objects, 1);
    let co = x.path().join("co");
    ok(&store(&st, &[&"checkout", &digest, &co]));
    for level in [1500, 3000] {
        let d = open_chain(&co, level);
        assert_eq!(read_at(&d, "a"), body, "level {level}");
        assert_eq!(read_at(&d, "b"), body, "level {level}");
    }
    let bottom = open_chain(&co, 3000);
    assert_eq!(
        rustix::fs::Dir::read_from(&bottom).unwrap().count(),
        4,
        "'.', '..', a and b: nothing deeper"
    );
    ok(&store(&st, &[&"verify"]));
    let gc = ok(&store(&st, &[&"gc"]));
    assert!(gc.contains("removed 0"), "{gc}");
}

/// `store ls MANIFEST` shows names and link targets through the one
/// quoting rule; a manifest file that is a FIFO or a device is refused
/// at once and left as it is; a link to a manifest file is followed.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ls_quotes_names_and_refuses_special_manifest_files() {
    let x = testfs!(Xfs);
    let st = x.path().join("store");
    let f = x.path().join("f");
    write_file(&f, b"payload");
    let d = ok(&store(&st, &[&"add", &f]))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let mf = x.path().join("m.json");
    fs::write(
        &mf,
        format!(
            r#"{{"format":"cowlink-manifest","version":1,"entries":[{{"path":"a\nb\u001b[2J","type":"file","digest":"{d}","size":7,"mode":420}},{{"path":"l","type":"symlink","target":"x\u001b]0;owned\u0007\ny"}}]}}"#
        ),
    )
    .unwrap();
    let out = ok(&store(&st, &[&"ls", &mf]));
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert_eq!(out.lines().count(), 2, "one row per entry: {out:?}");
    assert!(out.contains("$'a\\nb\\x1b[2J'"), "{out:?}");
    assert!(out.contains("l -> $'x\\x1b]0;owned\\x07\\ny'"), "{out:?}");
    // Through a symbolic link the caller names: read.
    let link = x.path().join("m-link.json");
    std::os::unix::fs::symlink(&mf, &link).unwrap();
    assert_eq!(ok(&store(&st, &[&"ls", &link])), out);
    // A FIFO (no writer: reading would wait forever) and a device like
    // /dev/zero (made here, never in /dev): refused, left alone.
    let fifo = x.path().join("fifo.json");
    let zero = x.path().join("zero.json");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    assert!(Command::new("mknod")
        .arg(&zero)
        .args(["c", "1", "5"])
        .status()
        .unwrap()
        .success());
    for p in [&fifo, &zero] {
        for args in [vec!["ls"], vec!["checkout"]] {
            let dest = x.path().join("dest");
            let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = args
                .iter()
                .map(|s| s as &dyn AsRef<std::ffi::OsStr>)
                .collect();
            a.push(p);
            if args[0] == "checkout" {
                a.push(&dest);
            }
            let out = store(&st, &a);
            assert!(!out.status.success());
            let err = text(&out.stderr);
            assert!(err.contains("not a regular file"), "{err}");
            assert!(!dest.exists());
        }
        let t = fs::symlink_metadata(p).unwrap().file_type();
        use std::os::unix::fs::FileTypeExt;
        assert!(t.is_fifo() || t.is_char_device(), "left as it was");
    }
}
