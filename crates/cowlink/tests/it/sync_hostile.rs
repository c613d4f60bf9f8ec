//! `sync` against a hostile destination and a hostile run: mount points
//! of the same filesystem (bind mounts) planted in DST, which share its
//! device number and so are not told apart by `st_dev`; nothing outside
//! DST may change, whatever DST holds.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use cowlink::sync::{sync, SyncEvent, SyncOptions, SyncReport};
use cowlink_testfs::testfs;

fn slash(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push("/");
    PathBuf::from(s)
}

/// A sync whose per-entry failures are collected, not fatal.
fn run_failing(src: &Path, dst: &Path, opts: &SyncOptions) -> (SyncReport, Vec<String>) {
    let failed = Mutex::new(Vec::new());
    let observer = |ev: &SyncEvent<'_>| {
        if let SyncEvent::Failed(e) = ev {
            failed.lock().unwrap().push(e.to_string());
        }
    };
    let r = sync(src, dst, opts, &observer).unwrap();
    (r, failed.into_inner().unwrap())
}

/// `mount --bind from to`, undone when dropped.
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, to: &Path) -> Bind {
        let ok = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(ok.success(), "mount --bind {from:?} {to:?}");
        Bind(to.to_path_buf())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Every name below `root` with its bytes (directories as empty), sorted.
fn snapshot_of(root: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let bytes = if m.is_file() {
                fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            if m.is_dir() {
                todo.push(p.clone());
            }
            out.push((p, bytes, m.permissions().mode()));
        }
    }
    out.sort();
    out
}

/// A bind mount of a directory outside DST (same filesystem, so the same
/// `st_dev`) at every place a sync reaches: a directory the source also
/// has (entered to write), one the source lacks (`--delete` empties it),
/// and one deep inside a directory `--delete` removes. None is entered;
/// the outside directory keeps every byte.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_bind_mount_inside_dst_is_never_entered_nor_emptied() {
    let x = testfs!(Xfs);
    let (src, dst, outside) = (
        x.path().join("src"),
        x.path().join("dst"),
        x.path().join("outside"),
    );
    fs::create_dir_all(src.join("kept")).unwrap();
    fs::write(src.join("kept/new"), b"new").unwrap();
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("precious"), b"p").unwrap();
    fs::write(outside.join("sub/precious"), b"q").unwrap();
    for d in ["kept", "gone", "tree/deep/mnt"] {
        fs::create_dir_all(dst.join(d)).unwrap();
    }
    let before = snapshot_of(&outside);
    let _a = Bind::new(&outside, &dst.join("kept"));
    let _b = Bind::new(&outside, &dst.join("gone"));
    let _c = Bind::new(&outside, &dst.join("tree/deep/mnt"));
    let opts = SyncOptions {
        delete: true,
        ..SyncOptions::default()
    };
    let (r, failed) = run_failing(&slash(&src), &dst, &opts);
    assert_eq!(
        snapshot_of(&outside),
        before,
        "outside DST changed: {failed:#?}"
    );
    assert_eq!(r.errors, 3, "one refusal per mount point: {failed:#?}");
    for f in &failed {
        assert!(
            f.contains("does not cross") || f.contains("mount point"),
            "{f}"
        );
    }
}

/// A file outside DST bind-mounted over a name in DST whose source
/// differs in mode only: its metadata is not set through the mount.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_file_bind_mounted_in_dst_is_never_written_through() {
    let x = testfs!(Xfs);
    let (src, dst, outside) = (
        x.path().join("src"),
        x.path().join("dst"),
        x.path().join("outside"),
    );
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("f"), b"same bytes").unwrap();
    fs::set_permissions(outside.join("f"), fs::Permissions::from_mode(0o644)).unwrap();
    let cp = Command::new("cp")
        .arg("-a")
        .arg(outside.join("f"))
        .arg(src.join("f"))
        .status()
        .unwrap();
    assert!(cp.success());
    fs::set_permissions(src.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(dst.join("f"), b"").unwrap();
    let before = snapshot_of(&outside);
    let _m = Bind::new(&outside.join("f"), &dst.join("f"));
    let (r, failed) = run_failing(&slash(&src), &dst, &SyncOptions::default());
    assert_eq!(
        snapshot_of(&outside),
        before,
        "outside DST changed: {failed:#?}"
    );
    assert_eq!(r.errors, 1, "{failed:#?}");
    assert!(failed[0].contains("mount point"), "{}", failed[0]);
}

/// Two snapshot syncs started at once into a root that does not exist
/// yet: one makes the snapshot, the other is refused as `InUse` (never
/// another error from the two making the bookkeeping together), and the
/// set is usable afterwards. Repeated on fresh roots to meet the race.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn two_first_snapshot_syncs_at_once_one_wins_the_other_is_in_use() {
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    for i in 0..30 {
        let root = x.path().join(format!("root{i}"));
        let barrier = std::sync::Barrier::new(2);
        let outcomes: Vec<Result<bool, cowlink::Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        cowlink::sync::sync_snapshot(
                            slash(&src),
                            &root,
                            &SyncOptions::default(),
                            &|_: &SyncEvent<'_>| {},
                        )
                        .map(|r| r.completed)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut made = 0;
        for o in &outcomes {
            match o {
                Ok(done) => {
                    assert!(done, "round {i}");
                    made += 1;
                }
                Err(e) => assert_eq!(e.kind(), cowlink::ErrorKind::InUse, "round {i}: {e}"),
            }
        }
        assert!(made >= 1, "round {i}: {outcomes:?}");
        let set = cowlink::snapshot::SnapshotSet::open_existing(&root).unwrap();
        let (list, bad) = set.list().unwrap();
        assert!(bad.is_empty(), "round {i}: {bad:?}");
        assert_eq!(list.iter().filter(|s| s.is_complete()).count(), made);
    }
}

/// DST inside SRC, and SRC inside DST with `--delete`, reached through
/// a bind mount so that no path comparison sees it: refused before
/// anything is made (a sync into itself would nest without end).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dst_inside_src_through_a_bind_mount_is_refused() {
    let x = testfs!(Xfs);
    let (src, alias) = (x.path().join("src"), x.path().join("alias"));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    fs::create_dir(&alias).unwrap();
    let _m = Bind::new(&src, &alias);
    let refused = |s: &Path, d: &Path, opts: &SyncOptions| {
        let r = sync(s, d, opts, &|_: &SyncEvent<'_>| {});
        match r {
            Err(e) => assert_eq!(e.kind(), cowlink::ErrorKind::InvalidInput, "{e}"),
            Ok(r) => panic!("{s:?} into {d:?} was not refused: {r:?}"),
        }
    };
    // DST (new, or existing) inside SRC.
    refused(&slash(&src), &alias.join("new"), &SyncOptions::default());
    refused(&slash(&src), &alias.join("sub"), &SyncOptions::default());
    refused(&src, &alias.join("sub"), &SyncOptions::default());
    assert!(!src.join("new").exists());
    assert!(fs::read_dir(src.join("sub")).unwrap().next().is_none());
    // SRC inside DST, where --delete would remove it.
    let opts = SyncOptions {
        delete: true,
        ..SyncOptions::default()
    };
    refused(&slash(&alias.join("sub")), &src, &opts);
    assert!(src.join("sub").is_dir() && src.join("f").is_file());
    // The check does not stand in the way of a dry run into a directory
    // (and parent) that do not exist yet: everything would be created.
    let dry = SyncOptions {
        dry_run: true,
        ..SyncOptions::default()
    };
    let missing = x.path().join("missing/dst");
    let r = sync(slash(&src), &missing, &dry, &|_: &SyncEvent<'_>| {}).unwrap();
    assert_eq!((r.created, r.errors), (2, 0), "{r:?}");
    assert!(!x.path().join("missing").exists());
}

/// DST made as hardlinks to an earlier copy (`cp -al`, the rotation of
/// rsnapshot and `rsync --link-dest` trees): a change of metadata only
/// (mode, an extended attribute) must not be set in place on an inode
/// the earlier copy shares, with or without hardlink groups in SRC and
/// with hardlinks preserved or not. The earlier copy keeps every
/// attribute; DST equals SRC.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn metadata_changes_never_reach_a_tree_dst_shares_inodes_with() {
    use std::os::unix::fs::MetadataExt;
    let x = testfs!(Xfs);
    for (case, no_hardlinks) in [("grouped", false), ("unlinked", true)] {
        let base = x.path().join(case);
        let (src, backup, dst) = (base.join("src"), base.join("backup"), base.join("dst"));
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("a"), b"data").unwrap();
        fs::hard_link(src.join("a"), src.join("b")).unwrap();
        fs::write(src.join("single"), b"one").unwrap();
        let opts = SyncOptions {
            no_hardlinks,
            ..SyncOptions::default()
        };
        let (r, failed) = run_failing(&slash(&src), &backup, &opts);
        assert_eq!(r.errors, 0, "{failed:#?}");
        let cp = Command::new("cp")
            .arg("-al")
            .arg(&backup)
            .arg(&dst)
            .status()
            .unwrap();
        assert!(cp.success());
        let before = snapshot_of(&backup);
        let attrs = |p: &Path| {
            let out = Command::new("getfattr")
                .args(["-d", "-m", "-", "--absolute-names"])
                .arg(p)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let backup_attrs = attrs(&backup.join("a")) + &attrs(&backup.join("single"));
        fs::set_permissions(src.join("a"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(src.join("single"), fs::Permissions::from_mode(0o600)).unwrap();
        let set = Command::new("setfattr")
            .args(["-n", "user.changed", "-v", "yes"])
            .arg(src.join("a"))
            .arg(src.join("single"))
            .status()
            .unwrap();
        assert!(set.success());
        let (r, failed) = run_failing(&slash(&src), &dst, &opts);
        assert_eq!(r.errors, 0, "{case}: {failed:#?}");
        assert_eq!(
            snapshot_of(&backup),
            before,
            "{case}: the earlier copy changed"
        );
        assert_eq!(
            attrs(&backup.join("a")) + &attrs(&backup.join("single")),
            backup_attrs,
            "{case}: the earlier copy's attributes changed"
        );
        if no_hardlinks {
            // Groups not kept, so `rsync -H` would differ: each name alone.
            for n in ["a", "b", "single"] {
                let mode = |p: &Path| fs::metadata(p).unwrap().mode();
                assert_eq!(mode(&dst.join(n)), mode(&src.join(n)), "{case}: {n}");
                assert!(attrs(&dst.join(n)).contains("user.changed"), "{case}: {n}");
                assert_eq!(
                    fs::read(dst.join(n)).unwrap(),
                    fs::read(src.join(n)).unwrap()
                );
            }
        } else {
            let diff = cowlink_testfs::rsync_diff(&src, &dst, true);
            assert!(diff.is_empty(), "{case}: rsync sees:\n{diff}");
        }
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_ne!(ino(&dst.join("a")), ino(&backup.join("a")), "{case}");
    }
}

/// Whether anything opened the files `inot` watches since it was made.
fn opened(inot: &rustix::fd::OwnedFd) -> Vec<String> {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut r = rustix::fs::inotify::Reader::new(inot, &mut buf);
    let mut out = Vec::new();
    while let Ok(ev) = r.next() {
        if ev.events().contains(rustix::fs::inotify::ReadFlags::OPEN) {
            out.push(format!("watch {} {:?}", ev.wd(), ev.events()));
        }
    }
    out
}

/// A device node or FIFO planted where a regular file is expected (in
/// DST, replaced by a file synced from another filesystem; in a
/// `--reflink-dest` directory, a candidate to clone from) is never
/// opened: opening a device can act on hardware (a tape rewinds, a
/// watchdog starts), and it is not DST's to read. Watched with inotify's
/// IN_OPEN on the nodes themselves.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn device_nodes_planted_in_dst_or_reflink_dest_are_never_opened() {
    use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let (src, dst, basis) = (
        e.path().join("src"),
        x.path().join("dst"),
        x.path().join("basis"),
    );
    for d in [&src, &dst, &basis] {
        fs::create_dir_all(d).unwrap();
    }
    for n in ["dev", "fifo"] {
        fs::write(src.join(n), b"regular now").unwrap();
    }
    let mknod = |p: &Path, args: &[&str]| {
        let ok = Command::new("mknod").arg(p).args(args).status().unwrap();
        assert!(ok.success());
    };
    // /dev/null's numbers: harmless if the test fails and it is opened.
    let inot = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).unwrap();
    for d in [&dst, &basis] {
        mknod(&d.join("dev"), &["c", "1", "3"]);
        mknod(&d.join("fifo"), &["p"]);
        for n in ["dev", "fifo"] {
            inotify::add_watch(&inot, d.join(n), WatchFlags::OPEN).unwrap();
        }
    }
    let opts = SyncOptions {
        reflink_dest: vec![basis.clone()],
        ..SyncOptions::default()
    };
    let (r, failed) = run_failing(&slash(&src), &dst, &opts);
    assert_eq!(r.errors, 0, "{failed:#?}");
    assert_eq!(opened(&inot), Vec::<String>::new());
    for n in ["dev", "fifo"] {
        assert_eq!(fs::read(dst.join(n)).unwrap(), b"regular now");
    }
}

/// xorshift: reproducible cases from a seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Generated hostile destinations: for each seed, a random source tree
/// and a DST where some of its names (and some extra ones) hold what an
/// attacker plants: symbolic links to a directory and a file outside,
/// FIFOs, device nodes, hardlinks to a file outside (same contents and
/// time as the source, another mode), and bind mounts of the outside
/// directory. Synced with random options (`--delete`, `--checksum`, an
/// exclusion): nothing outside changes, the only failures name a mount
/// point, and once the mounts are gone a rerun makes DST equal SRC.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn generated_hostile_destinations_never_change_anything_outside() {
    let x = testfs!(Xfs);
    for seed in 1..=30u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x1000_0001));
        let base = x.path().join(format!("case{seed}"));
        let (src, dst, outside) = (base.join("src"), base.join("dst"), base.join("outside"));
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("file"), b"outside data").unwrap();
        fs::write(outside.join("sub/deep"), b"deep").unwrap();
        fs::set_permissions(outside.join("file"), fs::Permissions::from_mode(0o644)).unwrap();
        // The source: a few directories, files (one equal to the outside
        // file but for its mode), links and FIFOs.
        let dirs = ["", "a", "a/b", "c"];
        let mut names = Vec::new();
        for d in &dirs {
            fs::create_dir_all(src.join(d)).unwrap();
            for i in 0..4 {
                let rel = Path::new(d).join(format!("e{i}"));
                let p = src.join(&rel);
                match rng.below(5) {
                    0 => std::os::unix::fs::symlink("../x", &p).unwrap(),
                    1 => {
                        let ok = Command::new("mkfifo").arg(&p).status().unwrap();
                        assert!(ok.success());
                    }
                    2 => {
                        let cp = Command::new("cp")
                            .arg("-p")
                            .arg(outside.join("file"))
                            .arg(&p)
                            .status()
                            .unwrap();
                        assert!(cp.success());
                        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
                    }
                    _ => fs::write(&p, format!("{seed} {}", rel.display())).unwrap(),
                }
                names.push(rel);
            }
        }
        // Directories first, so what is planted in one is not removed
        // with it; a name whose parent was replaced is left alone.
        for d in dirs[1..].iter().rev() {
            names.insert(0, PathBuf::from(d));
        }
        names.push(PathBuf::from("extra"));
        names.push(PathBuf::from("a/extra"));
        // The destination: planted entries at random names.
        for d in &dirs {
            fs::create_dir_all(dst.join(d)).unwrap();
        }
        let mut binds = Vec::new();
        for rel in &names {
            let p = dst.join(rel);
            let parent_is_dir = fs::symlink_metadata(p.parent().unwrap()).is_ok_and(|m| m.is_dir());
            let under_mount = binds.iter().any(|b: &Bind| p.starts_with(&b.0));
            if rng.below(2) == 0 || !parent_is_dir || under_mount {
                continue;
            }
            let _ = fs::remove_dir_all(&p);
            let _ = fs::remove_file(&p);
            match rng.below(6) {
                0 => std::os::unix::fs::symlink(&outside, &p).unwrap(),
                1 => std::os::unix::fs::symlink(outside.join("file"), &p).unwrap(),
                2 => {
                    let ok = Command::new("mkfifo").arg(&p).status().unwrap();
                    assert!(ok.success());
                }
                3 => {
                    let ok = Command::new("mknod").arg(&p).args(["c", "1", "3"]).status();
                    assert!(ok.unwrap().success());
                }
                4 => fs::hard_link(outside.join("file"), &p).unwrap(),
                _ => {
                    fs::create_dir(&p).unwrap();
                    binds.push(Bind::new(&outside, &p));
                }
            }
        }
        let before = snapshot_of(&outside);
        let opts = SyncOptions {
            delete: rng.below(2) == 0,
            checksum: rng.below(2) == 0,
            exclude: if rng.below(3) == 0 {
                vec!["e1".to_string()]
            } else {
                Vec::new()
            },
            ..SyncOptions::default()
        };
        let (_, failed) = run_failing(&slash(&src), &dst, &opts);
        assert_eq!(
            snapshot_of(&outside),
            before,
            "seed {seed}: outside changed"
        );
        for f in &failed {
            assert!(f.contains("mount point"), "seed {seed}: {f}");
        }
        drop(binds);
        let opts = SyncOptions {
            delete: true,
            ..SyncOptions::default()
        };
        let (r, failed) = run_failing(&slash(&src), &dst, &opts);
        assert_eq!(r.errors, 0, "seed {seed}: {failed:#?}");
        assert_eq!(
            snapshot_of(&outside),
            before,
            "seed {seed}: outside changed"
        );
        let diff = cowlink_testfs::rsync_diff(&src, &dst, true);
        assert!(diff.is_empty(), "seed {seed}: rsync sees:\n{diff}");
    }
}

/// A bind mount inside SRC of a DST directory: walking it would copy
/// that directory into itself, nesting without end. The source directory
/// that is the destination directory being written (or one above it) is
/// refused, nothing is made for it, and the rest is synced.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_bind_mount_of_dst_inside_src_is_not_copied_into_itself() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(src.join("a/mnt")).unwrap();
    fs::write(src.join("a/f"), b"f").unwrap();
    fs::write(src.join("top"), b"t").unwrap();
    fs::create_dir_all(dst.join("a")).unwrap();
    let _m = Bind::new(&dst.join("a"), &src.join("a/mnt"));
    let (r, failed) = run_failing(&slash(&src), &dst, &SyncOptions::default());
    assert_eq!(r.errors, 1, "{failed:#?}");
    assert!(failed[0].contains("into itself"), "{}", failed[0]);
    assert!(!dst.join("a/mnt").exists());
    assert_eq!(fs::read(dst.join("a/f")).unwrap(), b"f");
    assert_eq!(fs::read(dst.join("top")).unwrap(), b"t");
}

/// The snapshot's directory swapped, after `begin` made it and before the
/// sync into it, for a symbolic link to a directory outside the root (or
/// for another directory): the sync writes only into the directory
/// `begin` made (moved aside, wherever it went), never through the name;
/// the seal refuses, since the name no longer holds that directory, and
/// the snapshot stays in progress.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_snapshot_directory_swapped_after_begin_is_never_written_through() {
    use cowlink::snapshot::{SnapshotSet, State};
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("f"), b"new data").unwrap();
    fs::write(src.join("sub/g"), b"more").unwrap();
    for link in [true, false] {
        let root = x.path().join(format!("snaps-{link}"));
        let outside = x.path().join(format!("outside-{link}"));
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("precious"), b"p").unwrap();
        fs::write(outside.join("sub/g"), b"theirs").unwrap();
        let before = snapshot_of(&outside);
        let set = SnapshotSet::open(&root).unwrap();
        let begun = set.begin().unwrap();
        let name = begun.path().to_path_buf();
        let aside = root.join("moved-aside");
        fs::rename(&name, &aside).unwrap();
        if link {
            symlink_dir(&outside, &name);
        } else {
            fs::rename(&outside, &name).unwrap();
        }
        let failed = Mutex::new(Vec::new());
        let r = cowlink::sync::sync_into_snapshot(
            slash(&src),
            &begun,
            &SyncOptions::default(),
            &|ev: &SyncEvent<'_>| {
                if let SyncEvent::Failed(e) = ev {
                    failed.lock().unwrap().push(e.to_string());
                }
            },
        )
        .unwrap();
        assert_eq!(r.errors, 0, "{failed:?}");
        // Not sealed while the name holds something else.
        let e = begun.complete().unwrap_err();
        assert_eq!(e.kind(), cowlink::ErrorKind::ContentChanged, "{e}");
        assert!(e.to_string().contains("replaced"), "{e}");
        let (list, _) = set.list().unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].state, State::Open, "never sealed complete");
        if !link {
            fs::rename(&name, &outside).unwrap();
        }
        assert_eq!(snapshot_of(&outside), before, "written through the name");
        // Written where `begin` made it.
        assert_eq!(fs::read(aside.join("f")).unwrap(), b"new data");
        assert_eq!(fs::read(aside.join("sub/g")).unwrap(), b"more");
    }
}

fn symlink_dir(target: &Path, at: &Path) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

/// A snapshot still being cloned (its record says `cloning`, with the
/// identity of the directory `begin` made) whose directory was replaced
/// by another directory: the next `begin` does not resume the clone into
/// it. It refuses, naming it, and leaves it alone.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_clone_resumed_into_a_swapped_directory_is_refused() {
    use cowlink::snapshot::SnapshotSet;
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let first = set.begin().unwrap();
    fs::write(first.path().join("data"), b"base").unwrap();
    first.complete().unwrap();
    let second = set.begin().unwrap();
    let name = second.name().to_string();
    drop(second);
    // As a crash during the clone leaves it: the record `cloning`, its
    // directory (identity recorded) half made.
    let record = root.join(".cowlink/records").join(format!("{name}.json"));
    let text = fs::read_to_string(&record).unwrap();
    assert!(text.contains("\"open\""), "{text}");
    fs::write(&record, text.replace("\"open\"", "\"cloning\"")).unwrap();
    // Someone else's directory renamed into the name.
    fs::rename(root.join(&name), x.path().join("made-by-begin")).unwrap();
    let theirs = x.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    fs::write(theirs.join("mine"), b"m").unwrap();
    let before = snapshot_of(&theirs);
    fs::rename(&theirs, root.join(&name)).unwrap();
    let e = set.begin().unwrap_err();
    assert_eq!(e.kind(), cowlink::ErrorKind::AlreadyExists, "{e}");
    assert!(e.to_string().contains("cannot be resumed"), "{e}");
    assert!(e.to_string().contains(&name), "{e}");
    fs::rename(root.join(&name), &theirs).unwrap();
    assert_eq!(snapshot_of(&theirs), before, "cloned into their directory");
}

/// `sync --snapshot ROOT SRC/ --dry-run` with no complete snapshot in
/// ROOT (none at all, only one in progress, or no ROOT) compares against
/// nothing: every entry is new, the report names no directory, and
/// nothing is made in ROOT. A `ROOT/.cowlink-none` the user made (a copy
/// of the source, or a link to one) is not compared against.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_dry_run_snapshot_with_no_complete_one_shows_everything_new_and_makes_nothing() {
    use cowlink::sync::Action;
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    fs::write(src.join("sub/g"), b"g").unwrap();
    let dry = SyncOptions {
        dry_run: true,
        ..SyncOptions::default()
    };
    let items_of = |root: &Path| {
        let items = Mutex::new(Vec::new());
        let r =
            cowlink::sync::sync_snapshot(slash(&src), root, &dry, &|ev: &SyncEvent<'_>| match ev {
                SyncEvent::Item { path, action, .. } if *action != Action::Keep => {
                    items.lock().unwrap().push((path.to_path_buf(), *action))
                }
                SyncEvent::Failed(e) => panic!("{e}"),
                _ => {}
            })
            .unwrap();
        let mut items = items.into_inner().unwrap();
        items.sort_by(|a, b| a.0.cmp(&b.0));
        (r, items)
    };
    let all_new: Vec<(PathBuf, Action)> = ["f", "sub", "sub/g"]
        .iter()
        .map(|p| (PathBuf::from(p), Action::Create))
        .collect();
    // No ROOT at all.
    let missing = x.path().join("missing");
    let (r, items) = items_of(&missing);
    assert_eq!(items, all_new);
    assert!(r.path.is_none() && r.snapshot.is_none() && !r.completed);
    assert_eq!(r.sync.created, 3);
    assert!(!missing.exists(), "a dry run made the root");
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains("cowlink-none"), "{json}");
    // A root holding a copy of SRC under `.cowlink-none`, then a link
    // of that name to SRC itself: still compared against nothing.
    let root = x.path().join("snaps");
    fs::create_dir_all(&root).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(root.join(".cowlink-none"))
        .status()
        .unwrap();
    assert!(copied.success());
    let before = snapshot_of(&root);
    let (r, items) = items_of(&root);
    assert_eq!(items, all_new);
    assert!(r.path.is_none());
    assert_eq!(snapshot_of(&root), before, "the dry run changed the root");
    fs::remove_dir_all(root.join(".cowlink-none")).unwrap();
    std::os::unix::fs::symlink(&src, root.join(".cowlink-none")).unwrap();
    assert_eq!(items_of(&root).1, all_new);
    fs::remove_file(root.join(".cowlink-none")).unwrap();
    // A set whose only snapshot is in progress: nothing complete.
    let set = cowlink::snapshot::SnapshotSet::open(&root).unwrap();
    let begun = set.begin().unwrap();
    fs::write(begun.path().join("f"), b"f").unwrap();
    drop(begun);
    let before = snapshot_of(&root);
    let (r, items) = items_of(&root);
    assert_eq!(items, all_new);
    assert!(r.path.is_none() && r.snapshot.is_none());
    assert_eq!(snapshot_of(&root), before, "the dry run changed the root");
}

/// A snapshot begun through the library (`SnapshotSet::begin`, then
/// `sync_into_snapshot`) is a run into its root: a sync into the root or
/// above it (whose `--delete` would remove the snapshot being cloned, and
/// the bookkeeping) refuses it and the other way round; the sync that
/// fills it, and a dry run of the root, do not. The other run's lock is
/// held here on a descriptor of its own, which `flock` treats as another
/// holder.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_library_snapshot_and_a_sync_into_its_root_refuse_each_other() {
    use cowlink::snapshot::{SnapshotSet, State};
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let top = x.path().join("top");
    let root = top.join("snaps");
    fs::create_dir_all(&top).unwrap();
    let set = SnapshotSet::open(&root).unwrap();
    let names = |root: &Path| {
        let mut v: Vec<String> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let open = |p: &Path| {
        rustix::fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    };
    // A sync into ROOT, or above it, holds it: begin is refused and makes
    // nothing.
    for held in [&root, &top] {
        let other = open(held);
        rustix::fs::flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
        let e = set.begin().unwrap_err();
        assert_eq!(e.kind(), cowlink::ErrorKind::InUse, "{held:?}: {e}");
        assert_eq!(names(&root), [".cowlink"], "a snapshot was made meanwhile");
    }
    // A begun snapshot holds ROOT: syncs into it or above it are
    // refused, and nothing under them changes.
    let begun = set.begin().unwrap();
    let before = snapshot_of(&top);
    let delete = SyncOptions {
        delete: true,
        ..SyncOptions::default()
    };
    for dst in [&root, &top] {
        let e = sync(slash(&src), dst, &delete, &|_: &SyncEvent<'_>| {}).unwrap_err();
        assert_eq!(e.kind(), cowlink::ErrorKind::InUse, "{dst:?}: {e}");
    }
    assert_eq!(snapshot_of(&top), before, "written while the snapshot runs");
    // A dry run of ROOT only reads it.
    let dry = SyncOptions {
        dry_run: true,
        ..delete.clone()
    };
    sync(slash(&src), &root, &dry, &|_: &SyncEvent<'_>| {}).unwrap();
    // Its own sync goes through, and it seals.
    let r = cowlink::sync::sync_into_snapshot(
        slash(&src),
        &begun,
        &SyncOptions::default(),
        &|_: &SyncEvent<'_>| {},
    )
    .unwrap();
    assert_eq!((r.errors, r.created), (0, 2), "{r:?}");
    let done = begun.complete().unwrap();
    assert_eq!(done.state, State::Complete);
    assert_eq!(fs::read(done.path.join("f")).unwrap(), b"data");
    // Released with the snapshot: a sync into ROOT's parent runs again.
    let r = sync(
        slash(&src),
        &top,
        &SyncOptions::default(),
        &|_: &SyncEvent<'_>| {},
    )
    .unwrap();
    assert_eq!(r.errors, 0);
}

/// A destination reached through a bind mount of a directory inside
/// another run's destination is that directory: the locks go on above
/// the bind mount's root through the filesystem's own parents, so a sync
/// into the alias (or into a new directory inside it, or a dry run of
/// it) refuses the run into the outer directory, and writes nothing.
/// The other run's lock is held here on a descriptor of its own, which
/// `flock` treats as another holder.
/// On Btrfs the inner directory is a subvolume: another `st_dev`, no
/// mount point, and its bind mount's root is named by path all the same.
fn bind_mount_alias_refused(top: &Path, subvolume: bool) {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let src = top.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let outer = top.join("a/outer");
    let inner = outer.join("mid/inner");
    let alias = top.join("b/alias");
    if subvolume {
        fs::create_dir_all(outer.join("mid")).unwrap();
        let ok = Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(&inner)
            .output()
            .unwrap();
        assert!(ok.status.success(), "{ok:?}");
    } else {
        fs::create_dir_all(&inner).unwrap();
    }
    fs::create_dir_all(&alias).unwrap();
    let _bind = Bind::new(&inner, &alias);
    for held in [&outer, &outer.join("mid"), &top.join("a")] {
        let other = rustix::fs::open(
            held,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        rustix::fs::flock(&other, FlockOperation::NonBlockingLockExclusive).unwrap();
        for (dst, dry) in [
            (alias.clone(), false),
            (alias.clone(), true),
            (alias.join("new"), false),
        ] {
            let opts = SyncOptions {
                dry_run: dry,
                ..SyncOptions::default()
            };
            let e = sync(slash(&src), &dst, &opts, &|_: &SyncEvent<'_>| {}).unwrap_err();
            assert_eq!(e.kind(), cowlink::ErrorKind::InUse, "{held:?} {dst:?}: {e}");
            assert!(e.to_string().contains(&*held.to_string_lossy()), "{e}");
        }
        assert_eq!(
            fs::read_dir(&inner).unwrap().count(),
            0,
            "written meanwhile"
        );
    }
    // Nothing held: the alias is synced.
    let r = sync(
        slash(&src),
        &alias,
        &SyncOptions::default(),
        &|_: &SyncEvent<'_>| {},
    )
    .unwrap();
    assert_eq!((r.errors, r.created), (0, 1));
    assert_eq!(fs::read(inner.join("f")).unwrap(), b"data");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_bind_mount_alias_of_a_directory_inside_a_running_dst_is_refused() {
    let x = testfs!(Xfs);
    bind_mount_alias_refused(x.path(), false);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_bind_mount_alias_of_a_subvolume_inside_a_running_dst_is_refused_btrfs() {
    let b = testfs!(Btrfs);
    bind_mount_alias_refused(b.path(), true);
}

/// DST swapped, in a tight loop, with a link into SRC (`renameat2`
/// `RENAME_EXCHANGE`, so the name always holds one of them) while syncs
/// start: whichever the run opens, it never writes inside SRC. The check
/// that DST is not inside SRC is on the directory opened, not on an
/// earlier look at the path.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dst_swapped_for_a_link_into_src_while_syncs_start_never_writes_src() {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    use std::sync::atomic::{AtomicBool, Ordering};
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("inner")).unwrap();
    fs::write(src.join("f"), b"data").unwrap();
    let before = snapshot_of(&src);
    let dst = x.path().join("dst");
    let alt = x.path().join("alt");
    fs::create_dir(&dst).unwrap();
    symlink_dir(&src.join("inner"), &alt);
    let stop = AtomicBool::new(false);
    let (mut ran, mut refused) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                renameat_with(CWD, &dst, CWD, &alt, RenameFlags::EXCHANGE).unwrap();
            }
        });
        // Until enough runs went through the window between the look at
        // the path and the open (most are refused at the look).
        while ran < 200 && ran + refused < 50_000 {
            match sync(
                slash(&src),
                &dst,
                &SyncOptions::default(),
                &|_: &SyncEvent<'_>| {},
            ) {
                Ok(_) => ran += 1,
                Err(e) => {
                    assert_eq!(e.kind(), cowlink::ErrorKind::InvalidInput, "{e}");
                    refused += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(snapshot_of(&src), before, "written inside SRC");
    assert!(
        ran > 0 && refused > 0,
        "the race never went both ways: {ran} {refused}"
    );
}

/// What a generated run does: write into a directory, or a dry run of it.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Index into the directories of the test.
    dir: usize,
    dry: bool,
}

/// Random pairs of runs, the second started while the first holds its
/// locks (from inside the first run's observer, on its first entry), over
/// nested directories, siblings, dry runs and a bind mount alias of an
/// inner directory: the second is refused exactly when the module rule
/// says (`crate::sync::lock`), and never waits.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn generated_pairs_of_concurrent_runs_follow_the_lock_rule() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    let top = x.path().join("dst");
    let a = top.join("a");
    let deep = a.join("deep");
    let b = top.join("b");
    for d in [&deep, &b] {
        fs::create_dir_all(d).unwrap();
    }
    let alias = x.path().join("alias");
    fs::create_dir(&alias).unwrap();
    let _bind = Bind::new(&a, &alias);
    // The directories, and the one each really is (the alias is `a`).
    let dirs = [&top, &a, &deep, &b, &alias];
    let real = |i: usize| if i == 4 { 1 } else { i };
    // Whether real directory `i` is `j` or holds it.
    let holds = |i: usize, j: usize| {
        let (i, j) = (real(i), real(j));
        i == j || dirs[j].starts_with(dirs[i])
    };
    let conflict = |p: Run, q: Run| match (p.dry, q.dry) {
        (false, false) => holds(p.dir, q.dir) || holds(q.dir, p.dir),
        (false, true) => holds(p.dir, q.dir),
        (true, false) => holds(q.dir, p.dir),
        (true, true) => false,
    };
    let opts = |r: Run| SyncOptions {
        dry_run: r.dry,
        run: cowlink::run::Run::default().with_threads(1),
        ..SyncOptions::default()
    };
    let mut rng = Rng(0x5eed_0048);
    // A refusal within one process waits half a second (the lock table
    // names no other holder), so the pairs are few: 40, about 13 s.
    let (mut refused, mut ran) = (0, 0);
    for _ in 0..40 {
        let pick = |rng: &mut Rng| Run {
            dir: rng.below(dirs.len() as u64) as usize,
            dry: rng.below(3) == 0,
        };
        let (first, second) = (pick(&mut rng), pick(&mut rng));
        let started = AtomicBool::new(false);
        let inner = Mutex::new(None);
        let observer = |_: &SyncEvent<'_>| {
            if !started.swap(true, Ordering::SeqCst) {
                let r = sync(
                    slash(&src),
                    dirs[second.dir],
                    &opts(second),
                    &|_: &SyncEvent<'_>| {},
                );
                *inner.lock().unwrap() = Some(r.map(|_| ()).map_err(|e| (e.kind(), e.to_string())));
            }
        };
        sync(slash(&src), dirs[first.dir], &opts(first), &observer).unwrap();
        let got = inner
            .into_inner()
            .unwrap()
            .expect("the second run was started");
        match (conflict(first, second), got) {
            (true, Err((kind, _))) => {
                assert_eq!(kind, cowlink::ErrorKind::InUse);
                refused += 1;
            }
            (false, Ok(())) => ran += 1,
            (want, got) => panic!("{first:?} then {second:?}: conflict {want}, got {got:?}"),
        }
    }
    assert!(refused > 0 && ran > 0, "{refused} refused, {ran} ran");
}

/// `snapshot ls` while a prune forgets records: a record that vanishes
/// between the listing of the records and its reading was forgotten, not
/// broken; the listing goes on without it and reports no error. A
/// record is made and removed in a tight loop while the set is listed.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn listing_while_records_are_forgotten_reports_no_error() {
    use cowlink::snapshot::SnapshotSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let done = set.begin().unwrap().complete().unwrap();
    let records = root.join(".cowlink/records");
    let record = fs::read(records.join(format!("{}.json", done.name))).unwrap();
    // A record of an older snapshot, named as the tool names them.
    let gone = records.join("20200101T000000.000000Z.json");
    let stop = AtomicBool::new(false);
    // Asserted after the loop, which stops the other thread.
    let mut failures = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Written whole and renamed in, as the tool writes records.
            let tmp = records.join("new.tmp");
            while !stop.load(Ordering::Relaxed) {
                fs::write(&tmp, &record).unwrap();
                fs::rename(&tmp, &gone).unwrap();
                fs::remove_file(&gone).unwrap();
            }
        });
        for _ in 0..3000 {
            match set.list() {
                Ok((list, errors)) if errors.is_empty() => {
                    if !list.iter().any(|s| s.name == done.name) {
                        failures.push("the complete snapshot is missing".to_string());
                    }
                }
                Ok((_, errors)) => failures.push(format!("{errors:?}")),
                Err(e) => failures.push(e.to_string()),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        failures.is_empty(),
        "{} of 3000: {:?}",
        failures.len(),
        failures.first()
    );
}
