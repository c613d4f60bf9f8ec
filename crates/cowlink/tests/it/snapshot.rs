//! Snapshot sets on the real test filesystems: begin/complete cycles,
//! clones (FIEMAP), Btrfs subvolumes, a `kill -9` mid-clone resumed under
//! the same name, the lock, prune on disk (foreign directories, links and
//! mounts inside a snapshot), and the usage listing.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cowlink::snapshot::{KeepPolicy, Kind, SnapshotSet, State, Verdict};
use cowlink::ErrorKind;
use cowlink_testfs::{data, rsync_diff, testfs};

use crate::same_blocks;

/// A small tree with the kinds of entry a snapshot must carry.
fn fill(dir: &Path) {
    fs::create_dir_all(dir.join("sub/deeper")).unwrap();
    fs::write(dir.join("big"), data(1 << 20, 1)).unwrap();
    fs::write(dir.join("sub/a"), data(64 << 10, 2)).unwrap();
    fs::write(dir.join("sub/deeper/b"), data(4096 * 3, 3)).unwrap();
    fs::hard_link(dir.join("sub/a"), dir.join("a-link")).unwrap();
    symlink("sub/a", dir.join("rel-link")).unwrap();
    fs::set_permissions(dir.join("sub/a"), fs::Permissions::from_mode(0o750)).unwrap();
}

use std::os::unix::fs::PermissionsExt;

fn names_under(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cycles_on_xfs_clone_the_newest_complete_snapshot() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    assert_eq!(set.list().unwrap().0, vec![]);

    let first = set.begin().unwrap();
    assert!(!first.resumed());
    assert_eq!(first.base(), None);
    assert_eq!(first.kind(), Kind::Tree);
    fill(first.path());
    let p1 = first.path().to_path_buf();
    // In progress: listed, not complete.
    let (l, _) = SnapshotSet::open_existing(&root).unwrap().list().unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].state, State::Open);
    let s1 = first.complete().unwrap();
    assert!(s1.is_complete());
    assert_eq!(s1.path, p1);

    let second = set.begin().unwrap();
    assert_eq!(second.base(), Some(s1.name.as_str()));
    assert!(
        second.name() > s1.name.as_str(),
        "names sort as they are made"
    );
    let p2 = second.path().to_path_buf();
    // A clone: equal in every attribute, and sharing the blocks.
    assert_eq!(rsync_diff(&p1, &p2, true), "");
    for f in ["big", "sub/a", "sub/deeper/b"] {
        assert!(same_blocks(&p1.join(f), &p2.join(f)), "{f} is not shared");
    }
    assert_eq!(
        fs::metadata(p2.join("a-link")).unwrap().ino(),
        fs::metadata(p2.join("sub/a")).unwrap().ino()
    );
    assert_eq!(
        fs::read_link(p2.join("rel-link")).unwrap(),
        Path::new("sub/a")
    );
    assert_eq!(
        fs::metadata(p2.join("sub/a")).unwrap().mode() & 0o7777,
        0o750
    );
    // A write to the new one leaves the old one as it was.
    fs::write(p2.join("sub/a"), b"changed").unwrap();
    assert_eq!(fs::read(p1.join("sub/a")).unwrap(), data(64 << 10, 2));
    let s2 = second.complete().unwrap();

    // The third is cloned from the second, not the first.
    let third = set.begin().unwrap();
    assert_eq!(third.base(), Some(s2.name.as_str()));
    assert_eq!(fs::read(third.path().join("sub/a")).unwrap(), b"changed");
    drop(third);
    // Nothing but the snapshots and the bookkeeping under the root.
    let (l, bad) = set.list().unwrap();
    assert!(bad.is_empty());
    let states: Vec<State> = l.iter().map(|s| s.state).collect();
    assert_eq!(states, [State::Complete, State::Complete, State::Open]);
    let mut want: Vec<String> = l.iter().map(|s| s.name.clone()).collect();
    want.push(".cowlink".into());
    want.sort();
    assert_eq!(names_under(&root), want);

    // Dropped without completing: the next begin resumes it by name.
    let again = set.begin().unwrap();
    assert!(again.resumed());
    assert_eq!(again.name(), l[2].name);
    let blocks = again.blocks_dir_create().unwrap().to_path_buf();
    assert_eq!(blocks, root.join(".cowlink/blocks").join(again.name()));
    assert!(blocks.is_dir());
    drop(again);

    // Its directory removed behind its back: made again as a clone.
    fs::remove_dir_all(&l[2].path).unwrap();
    let again = set.begin().unwrap();
    assert_eq!((again.name(), again.resumed()), (l[2].name.as_str(), true));
    assert_eq!(fs::read(again.path().join("sub/a")).unwrap(), b"changed");
    drop(again);
    // Replaced by something else: refused, left as it is.
    fs::remove_dir_all(&l[2].path).unwrap();
    fs::write(&l[2].path, b"theirs").unwrap();
    let e = set.begin().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    assert_eq!(fs::read(&l[2].path).unwrap(), b"theirs");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_snapshots_are_subvolume_snapshots() {
    let b = testfs!(Btrfs);
    let root = b.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let first = set.begin().unwrap();
    assert_eq!(first.kind(), Kind::Subvolume);
    // A subvolume's root directory has inode 256.
    assert_eq!(fs::metadata(first.path()).unwrap().ino(), 256);
    fill(first.path());
    let s1 = first.complete().unwrap();

    let second = set.begin().unwrap();
    assert_eq!(second.kind(), Kind::Subvolume);
    let md = fs::metadata(second.path()).unwrap();
    assert_eq!(md.ino(), 256);
    assert_ne!(
        md.dev(),
        fs::metadata(&s1.path).unwrap().dev(),
        "a separate subvolume"
    );
    assert_eq!(rsync_diff(&s1.path, second.path(), true), "");
    for f in ["big", "sub/a", "sub/deeper/b"] {
        assert!(
            same_blocks(&s1.path.join(f), &second.path().join(f)),
            "{f} is not shared"
        );
    }
    fs::write(second.path().join("big"), b"new").unwrap();
    let s2 = second.complete().unwrap();
    assert_eq!(fs::read(s1.path.join("big")).unwrap(), data(1 << 20, 1));

    // Prune deletes the older subvolume, keeps the newest.
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert!(!s1.path.exists());
    assert_eq!(fs::read(s2.path.join("big")).unwrap(), b"new");
    let (l, _) = set.list().unwrap();
    assert_eq!(
        l.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        vec![s2.name.clone()]
    );
    // The next one still snapshots the newest.
    let third = set.begin().unwrap();
    assert_eq!(
        (third.kind(), third.base()),
        (Kind::Subvolume, Some(s2.name.as_str()))
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_second_run_is_refused_naming_the_holder() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let begun = SnapshotSet::open(&root).unwrap().begin().unwrap();
    let other = SnapshotSet::open(&root).unwrap();
    let e = other.begin().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse);
    assert!(
        e.to_string()
            .contains(&format!("process {}", std::process::id())),
        "{e}"
    );
    let e = other.prune(&KeepPolicy::default(), true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse);
    // From another thread at once: exactly one of two begins wins.
    let name = begun.name().to_string();
    begun.complete().unwrap();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    SnapshotSet::open(&root).unwrap().begin().map(|b| {
                        std::thread::sleep(Duration::from_millis(300));
                        b.name().to_string()
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    let e = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(e.kind(), ErrorKind::InUse);
    // Released with the begun snapshot: a third run gets in and resumes it.
    let won = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
    assert_ne!(won, &name);
    let b = SnapshotSet::open(&root).unwrap().begin().unwrap();
    assert!(b.resumed());
    assert_eq!(b.name(), won);
}

/// Where the child of the kill test makes its snapshot.
const CHILD_ROOT: &str = "COWLINK_SNAPSHOT_TEST_CHILD_ROOT";

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn killed_mid_clone_is_resumed_under_its_name() {
    if let Some(root) = std::env::var_os(CHILD_ROOT) {
        // The child: begin (slowly, one thread) and wait to be killed.
        let set = SnapshotSet::open(PathBuf::from(root))
            .unwrap()
            .with_run(cowlink::Run::default().with_threads(1));
        let b = set.begin().unwrap();
        eprintln!("clone finished before the kill: {}", b.name());
        std::thread::sleep(Duration::from_secs(120));
        unreachable!("the parent kills this process");
    }
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let first = set.begin().unwrap();
    // 4,000 small files: cloned one by one on one thread, they give the
    // parent a window of a few hundred milliseconds to kill the child in.
    for d in 0..8 {
        let sub = first.path().join(format!("d{d:02}"));
        fs::create_dir(&sub).unwrap();
        for f in 0..500 {
            fs::write(sub.join(format!("f{f}")), data(4096, (d * 1000 + f) as u64)).unwrap();
        }
    }
    let s1 = first.complete().unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "snapshot::killed_mid_clone_is_resumed_under_its_name",
            "--include-ignored",
            "--nocapture",
        ])
        .env(CHILD_ROOT, &root)
        .spawn()
        .unwrap();
    // Kill it once the new snapshot holds some, not all, of the files.
    let t0 = Instant::now();
    let victim = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the child made no snapshot"
        );
        if let Some(name) = names_under(&root)
            .into_iter()
            .find(|n| n != ".cowlink" && *n != s1.name)
        {
            let sub = root.join(&name).join("d03");
            if sub.exists() && fs::read_dir(&sub).map(|r| r.count()).unwrap_or(0) > 10 {
                break name;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let (l, _) = set.list().unwrap();
    let v = l.iter().find(|s| s.name == victim).unwrap();
    assert_eq!(
        v.state,
        State::Cloning,
        "killed after the clone ended: make the tree bigger"
    );
    assert!(!v.is_complete());
    let cloned = |p: &Path| {
        (0..8)
            .map(|d| fs::read_dir(p.join(format!("d{d:02}"))).map_or(0, |r| r.count()))
            .sum::<usize>()
    };
    assert!(cloned(&v.path) < 4000, "the clone was whole when killed");

    let resumed = set.begin().unwrap();
    assert!(resumed.resumed());
    assert_eq!(resumed.name(), victim);
    assert_eq!(resumed.base(), Some(s1.name.as_str()));
    assert_eq!(rsync_diff(&s1.path, resumed.path(), true), "");
    assert_eq!(cloned(resumed.path()), 4000);
    for f in ["d00/f0", "d07/f499", "d03/f10"] {
        assert!(
            same_blocks(&s1.path.join(f), &resumed.path().join(f)),
            "{f} is not shared"
        );
    }
    let done = resumed.complete().unwrap();
    let (l, _) = set.list().unwrap();
    assert_eq!(l.len(), 2);
    assert!(l.iter().all(|s| s.is_complete()));
    assert_eq!(l[1].name, done.name);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn prune_removes_only_its_own_old_snapshots() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let mut made = Vec::new();
    for i in 0..5u8 {
        let b = set.begin().unwrap();
        fs::write(b.path().join("n"), [i]).unwrap();
        made.push(b.complete().unwrap().name);
    }
    let open = set.begin().unwrap().name().to_string();
    // The user's own directories, one named like a snapshot.
    let foreign = ["mine", "20200101T000000.000000Z"];
    for f in foreign {
        fs::create_dir(root.join(f)).unwrap();
        fs::write(root.join(f).join("keep"), b"k").unwrap();
    }

    let keep = KeepPolicy {
        last: 2,
        ..Default::default()
    };
    let dry = set.prune(&keep, true).unwrap();
    let verdicts: Vec<Verdict> = dry.snapshots.iter().map(|(_, v)| *v).collect();
    assert_eq!(
        verdicts,
        [
            Verdict::Remove,
            Verdict::Remove,
            Verdict::Remove,
            Verdict::Policy,
            Verdict::Newest,
            Verdict::InUse
        ]
    );
    assert_eq!(
        dry.snapshots
            .iter()
            .map(|(s, _)| s.name.clone())
            .collect::<Vec<_>>()[..5],
        made[..]
    );
    for n in &made {
        assert!(root.join(n).exists(), "a dry run removed {n}");
    }

    // Cancelled before it starts: nothing removed, and it says so.
    let stop = cowlink::CancelToken::new();
    stop.cancel();
    let stopped = set
        .clone()
        .with_run(cowlink::Run::default().with_cancel(stop))
        .prune(&keep, false)
        .unwrap();
    assert!(stopped.cancelled);
    assert!(stopped.snapshots.is_empty() && stopped.failed.is_empty());
    for n in &made {
        assert!(root.join(n).exists(), "a cancelled prune removed {n}");
    }

    // One of the old ones was replaced by the user: not the directory the
    // record describes, so it stays.
    fs::rename(root.join(&made[1]), root.join("moved")).unwrap();
    fs::create_dir(root.join(&made[1])).unwrap();
    fs::write(root.join(&made[1]).join("theirs"), b"t").unwrap();

    let pruned = set.prune(&keep, false).unwrap();
    assert_eq!(pruned.snapshots[1].1, Verdict::Replaced);
    assert!(pruned.failed.is_empty());
    assert_eq!(pruned.errors.len(), 1);
    assert!(
        pruned.errors[0]
            .to_string()
            .contains("not the directory this tool made"),
        "{}",
        pruned.errors[0]
    );
    assert!(!root.join(&made[0]).exists());
    assert!(!root.join(&made[2]).exists());
    assert_eq!(fs::read(root.join(&made[1]).join("theirs")).unwrap(), b"t");
    for n in [&made[3], &made[4], &open] {
        assert!(root.join(n).exists(), "{n} was removed");
    }
    for f in foreign.iter().chain(&["moved"]) {
        assert!(root.join(f).exists(), "{f} was removed");
    }
    assert_eq!(fs::read(root.join("mine/keep")).unwrap(), b"k");
    let (l, _) = set.list().unwrap();
    let left: Vec<&str> = l.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        left,
        [
            made[1].as_str(),
            made[3].as_str(),
            made[4].as_str(),
            open.as_str()
        ]
    );
    // keep 0 of everything: still the newest complete one.
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(root.join(&made[4]).exists());
    assert!(!root.join(&made[3]).exists());
    assert!(pruned.failed.is_empty());
    assert_eq!(pruned.errors.len(), 1);
    assert!(root.join(&made[1]).join("theirs").exists());

    // The newest complete snapshot's directory replaced by the user: it
    // is not counted as the newest, so the one before it stays as such.
    let b = set.begin().unwrap();
    let newest = b.complete().unwrap().name;
    fs::remove_dir_all(root.join(&newest)).unwrap();
    fs::create_dir(root.join(&newest)).unwrap();
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    let v: Vec<(String, Verdict)> = pruned
        .snapshots
        .iter()
        .map(|(s, v)| (s.name.clone(), *v))
        .collect();
    assert!(v.contains(&(made[4].clone(), Verdict::Newest)), "{v:?}");
    assert!(v.contains(&(newest.clone(), Verdict::Replaced)), "{v:?}");
    assert!(root.join(&made[4]).exists() && root.join(&newest).exists());
    // And the next snapshot clones the newest one that is still ours.
    assert_eq!(set.begin().unwrap().base(), Some(made[4].as_str()));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn prune_never_follows_a_link_or_enters_a_mount() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let outside = x.path().join("outside");
    fs::create_dir_all(outside.join("sub")).unwrap();
    fs::write(outside.join("precious"), b"p").unwrap();
    fs::write(outside.join("sub/precious"), b"q").unwrap();
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    symlink(&outside, b.path().join("to-outside")).unwrap();
    symlink("/", b.path().join("to-root")).unwrap();
    fs::create_dir(b.path().join("dir")).unwrap();
    symlink(outside.join("sub"), b.path().join("dir/to-sub")).unwrap();
    fs::create_dir(b.path().join("mnt")).unwrap();
    let old = b.complete().unwrap();
    set.begin().unwrap().complete().unwrap();

    // A bind mount inside the old snapshot: prune refuses it whole.
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&outside)
        .arg(old.path.join("mnt"))
        .status()
        .unwrap();
    assert!(status.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let guard = Unmount(old.path.join("mnt"));
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert_eq!(pruned.failed, vec![old.name.clone()]);
    assert_eq!(pruned.errors[0].kind(), ErrorKind::InUse);
    assert!(
        pruned.errors[0].to_string().contains("mounted inside it"),
        "{}",
        pruned.errors[0]
    );
    assert!(old.path.join("to-outside").exists());
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"p");
    drop(guard);

    // Unmounted: removed, links and all, the targets untouched.
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert!(!old.path.exists());
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"p");
    assert_eq!(fs::read(outside.join("sub/precious")).unwrap(), b"q");
    assert!(Path::new("/etc").exists());

    // A mount the mount table check does not look for (inside the
    // snapshot's block-hash records): the descriptor walk itself stops at
    // it (openat2 RESOLVE_NO_XDEV) and the prune is finished later.
    let b = set.begin().unwrap();
    let blocks = b.blocks_dir_create().unwrap().to_path_buf();
    let old = b.complete().unwrap();
    set.begin().unwrap().complete().unwrap();
    fs::create_dir(blocks.join("mnt")).unwrap();
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&outside)
        .arg(blocks.join("mnt"))
        .status()
        .unwrap();
    assert!(status.success());
    let guard = Unmount(blocks.join("mnt"));
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert_eq!(pruned.failed, vec![old.name.clone()]);
    assert_eq!(
        pruned.errors[0].kind(),
        ErrorKind::InUse,
        "{}",
        pruned.errors[0]
    );
    assert!(
        pruned.errors[0].to_string().contains("mount point"),
        "{}",
        pruned.errors[0]
    );
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"p");
    assert_eq!(fs::read(outside.join("sub/precious")).unwrap(), b"q");
    let (l, _) = set.list().unwrap();
    assert_eq!(
        l.iter().find(|s| s.name == old.name).unwrap().state,
        State::Removing
    );
    drop(guard);
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert_eq!(pruned.snapshots[0].1, Verdict::Unfinished);
    assert!(!blocks.exists());
    assert_eq!(fs::read(outside.join("precious")).unwrap(), b"p");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn listing_shows_what_each_snapshot_holds_alone() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    fs::write(b.path().join("same"), data(256 << 10, 1)).unwrap();
    fs::write(b.path().join("changes"), data(64 << 10, 2)).unwrap();
    b.complete().unwrap();
    let b = set.begin().unwrap();
    fs::write(b.path().join("changes"), data(128 << 10, 3)).unwrap();
    b.complete().unwrap();
    // Written back, so every extent has its address.
    rustix::fs::sync();
    let listing = set.list_usage().unwrap();
    assert!(listing.errors.is_empty(), "{:?}", listing.errors);
    let u: Vec<_> = listing.snapshots.iter().map(|s| s.usage.unwrap()).collect();
    assert_eq!((u[0].exclusive, u[0].shared), (64 << 10, 256 << 10));
    assert_eq!((u[1].exclusive, u[1].shared), (128 << 10, 256 << 10));
    assert_eq!(listing.total.shared_inside, 256 << 10);
    assert_eq!(listing.total.on_disk, (64 + 128 + 256) << 10);
}

/// What a hostile user can plant in the bookkeeping in place of the
/// files a run writes: a hard link to a file outside the root, or a FIFO.
#[derive(Debug, Clone, Copy)]
enum Plant {
    HardLink,
    Fifo,
}

fn plant(kind: Plant, at: &Path, victim: &Path) {
    let _ = fs::remove_file(at);
    match kind {
        Plant::HardLink => fs::hard_link(victim, at).unwrap(),
        Plant::Fifo => rustix::fs::mknodat(
            rustix::fs::CWD,
            at,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap(),
    }
}

/// Every file the bookkeeping writes (the lock, a record's temporary, the
/// format mark's temporary), replaced by a hard link to a file outside
/// the root or by a FIFO: nothing outside the root changes, and the
/// snapshot completed is listed complete.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn planted_bookkeeping_files_never_write_outside_the_root() {
    let x = testfs!(Xfs);
    let victim = x.path().join("precious");
    for kind in [Plant::HardLink, Plant::Fifo] {
        for target in ["lock", "record-tmp", "mark-tmp"] {
            fs::write(&victim, b"precious").unwrap();
            let root = x.path().join(format!("snaps-{kind:?}-{target}"));
            let meta = root.join(".cowlink");
            // A FIFO with a reader open does not block its writer: what
            // is written goes into the pipe, and a FIFO renamed into
            // place of a record would hide the snapshot.
            let mut readers = Vec::new();
            let mut put = |at: &Path| {
                plant(kind, at, &victim);
                if let Plant::Fifo = kind {
                    readers.push(
                        fs::OpenOptions::new()
                            .read(true)
                            .custom_flags(libc_nonblock())
                            .open(at)
                            .unwrap(),
                    );
                }
            };
            if target == "mark-tmp" {
                fs::create_dir_all(&meta).unwrap();
                put(&meta.join(".snapshots.tmp"));
            }
            let set = match SnapshotSet::open(&root) {
                Ok(s) => s,
                Err(e) => {
                    // Refusing is allowed; writing outside is not.
                    assert_eq!(fs::read(&victim).unwrap(), b"precious", "{kind:?} {target}");
                    eprintln!("{kind:?} {target}: refused: {e}");
                    continue;
                }
            };
            if target == "lock" {
                put(&meta.join("lock"));
            }
            let b = set.begin().unwrap();
            let name = b.name().to_string();
            if target == "record-tmp" {
                put(&meta.join(format!("records/.{name}.json.tmp")));
            }
            fs::write(b.path().join("f"), b"data").unwrap();
            let done = b.complete();
            assert_eq!(
                fs::read(&victim).unwrap(),
                b"precious",
                "{kind:?} {target}: a file outside the root was written"
            );
            let done = done.unwrap_or_else(|e| panic!("{kind:?} {target}: {e}"));
            let (l, bad) = set.list().unwrap();
            assert!(bad.is_empty(), "{kind:?} {target}: {bad:?}");
            assert_eq!(l.len(), 1, "{kind:?} {target}");
            assert_eq!(l[0].name, done.name);
            assert!(l[0].is_complete(), "{kind:?} {target}");
            // And the next run still works.
            set.begin().unwrap().complete().unwrap();
            assert_eq!(fs::read(&victim).unwrap(), b"precious", "{kind:?} {target}");
        }
    }
}

fn libc_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

use std::os::unix::fs::OpenOptionsExt;

/// A snapshot in progress whose directory went away is made again from
/// its recorded base; when that base was since replaced (a link to a
/// directory outside the root, another directory, a file), the run must
/// not clone what is there now: it refuses, naming the base, and nothing
/// of the replacement reaches the snapshot.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_resumed_clone_never_reads_a_replaced_base() {
    let x = testfs!(Xfs);
    let outside = x.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret"), b"not for the snapshot").unwrap();
    for how in ["link-outside", "other-dir", "file"] {
        let root = x.path().join(format!("snaps-{how}"));
        let set = SnapshotSet::open(&root).unwrap();
        let b = set.begin().unwrap();
        fs::write(b.path().join("mine"), b"v1").unwrap();
        let s1 = b.complete().unwrap();
        // The next one is left open (a crash), then its directory goes.
        let b = set.begin().unwrap();
        let s2 = b.name().to_string();
        drop(b);
        fs::remove_dir_all(root.join(&s2)).unwrap();
        // The base is swapped for something else.
        fs::rename(&s1.path, x.path().join(format!("moved-{how}"))).unwrap();
        match how {
            "link-outside" => symlink(&outside, &s1.path).unwrap(),
            "other-dir" => {
                fs::create_dir(&s1.path).unwrap();
                fs::write(s1.path.join("secret"), b"not for the snapshot").unwrap();
            }
            _ => fs::write(&s1.path, b"a file").unwrap(),
        }
        let r = set.begin();
        assert!(
            !root.join(&s2).join("secret").exists(),
            "{how}: the replacement was cloned into the snapshot"
        );
        let e = r.map(|b| b.name().to_string()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged, "{how}: {e}");
        assert!(e.to_string().contains(&s1.name), "{how}: {e}");
        // Nothing in progress is listed complete, and the base's record
        // still describes the directory that moved.
        let (l, _) = set.list().unwrap();
        assert!(l.iter().all(|s| s.name != s2 || !s.is_complete()), "{how}");
        assert_eq!(
            fs::read(outside.join("secret")).unwrap(),
            b"not for the snapshot"
        );
    }
}

/// Records a clock set far ahead left behind, up to the last name there
/// is (9999-12-31): every snapshot begun after them either is listed
/// under a valid name or is refused; none is made under a name `list`
/// cannot read (it would never be listed, completed or pruned).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn records_at_the_end_of_time_never_hide_a_new_snapshot() {
    let x = testfs!(Xfs);
    for (i, future) in [
        "99991231T235959.999999Z",
        "99991231T235959.999998Z",
        "99991231T235959.999990Z",
        "30000101T000000.000000Z",
    ]
    .into_iter()
    .enumerate()
    {
        let root = x.path().join(format!("snaps-{i}"));
        let set = SnapshotSet::open(&root).unwrap();
        let b = set.begin().unwrap();
        let s1 = b.complete().unwrap();
        // The record of a snapshot made while the clock was at `future`.
        let rec = fs::read(root.join(format!(".cowlink/records/{}.json", s1.name))).unwrap();
        fs::rename(&s1.path, root.join(future)).unwrap();
        fs::write(root.join(format!(".cowlink/records/{future}.json")), rec).unwrap();
        fs::remove_file(root.join(format!(".cowlink/records/{}.json", s1.name))).unwrap();
        for round in 0..3 {
            match set.begin() {
                Ok(b) => {
                    let name = b.name().to_string();
                    let done = b.complete().unwrap();
                    let (l, bad) = set.list().unwrap();
                    assert!(bad.is_empty(), "{future} {round}: {bad:?}");
                    assert!(
                        l.iter().any(|s| s.name == name && s.is_complete()),
                        "{future} {round}: {name} made but not listed: {l:?}"
                    );
                    assert_eq!(l.last().unwrap().name, done.name, "{future} {round}");
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{future} {round}: {e}");
                    assert!(
                        e.to_string().contains("99991231T235959.999999Z"),
                        "{future} {round}: {e}"
                    );
                    let dirs: Vec<String> = names_under(&root);
                    assert!(
                        dirs.iter().all(
                            |n| n == ".cowlink" || cowlink::snapshot::Stamp::parse(n).is_some()
                        ),
                        "{future} {round}: {dirs:?}"
                    );
                }
            }
        }
    }
}

/// Where the child of the kill loop runs its cycles, and its log of the
/// snapshots it completed.
const LOOP_ROOT: &str = "COWLINK_SNAPSHOT_TEST_LOOP_ROOT";
const LOOP_LOG: &str = "COWLINK_SNAPSHOT_TEST_LOOP_LOG";
/// Files a snapshot of the kill loop holds besides `gen`.
const LOOP_FILES: u64 = 24;

fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The child of the kill loop: begin (resuming what a kill left), write
/// the snapshot's own contents (every file derived from its name), mark
/// it with `gen`, complete, log it, prune to the two newest; forever.
fn kill_loop_child(root: &Path, log: &Path) -> ! {
    let set = SnapshotSet::open(root)
        .unwrap()
        .with_run(cowlink::Run::default().with_threads(1));
    loop {
        let b = set.begin().unwrap();
        let seed = seed_of(b.name());
        // A file only some snapshots have, and a directory that comes
        // and goes: removal and the clone see both.
        let _ = fs::remove_dir_all(b.path().join("sometimes"));
        if seed % 2 == 0 {
            fs::create_dir_all(b.path().join("sometimes/deeper")).unwrap();
            fs::write(b.path().join("sometimes/deeper/x"), data(8192, seed)).unwrap();
        }
        for i in 0..LOOP_FILES {
            let tmp = b.path().join(format!(".f{i}.tmp"));
            fs::write(&tmp, data(4096 * (1 + i as usize % 5), seed ^ i)).unwrap();
            fs::rename(&tmp, b.path().join(format!("f{i}"))).unwrap();
        }
        fs::write(b.path().join("gen"), b.name()).unwrap();
        let name = b.name().to_string();
        b.complete().unwrap();
        let mut f = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
            .unwrap();
        std::io::Write::write_all(&mut f, format!("{name}\n").as_bytes()).unwrap();
        set.prune(
            &KeepPolicy {
                last: 2,
                ..Default::default()
            },
            false,
        )
        .unwrap();
    }
}

/// Whether the snapshot `dir` named `name` holds exactly what the kill
/// loop's child wrote into it.
fn loop_snapshot_intact(dir: &Path, name: &str) -> Result<(), String> {
    let seed = seed_of(name);
    let gen = fs::read(dir.join("gen")).map_err(|e| format!("gen: {e}"))?;
    if gen != name.as_bytes() {
        return Err(format!("gen is {:?}", String::from_utf8_lossy(&gen)));
    }
    for i in 0..LOOP_FILES {
        let got = fs::read(dir.join(format!("f{i}"))).map_err(|e| format!("f{i}: {e}"))?;
        if got != data(4096 * (1 + i as usize % 5), seed ^ i) {
            return Err(format!("f{i} differs"));
        }
    }
    let x = fs::read(dir.join("sometimes/deeper/x")).ok();
    if (seed % 2 == 0) != x.is_some() || x.is_some_and(|x| x != data(8192, seed)) {
        return Err("sometimes/deeper/x is wrong".into());
    }
    Ok(())
}

/// Every file under `dir`, with its contents.
fn tree_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// kill -9 and SIGINT at random moments of begin, fill, complete and
/// prune, over and over; after each kill: no record is unreadable, every
/// snapshot listed complete is present and intact (so no half-removed
/// one is), the newest one the child saw completed (or a newer one) is
/// listed complete, nothing outside the root changed. At the end a run
/// resumes what is left, completes it, and a prune leaves one snapshot.
fn kill_loop(fs_kind: &str, root: &Path, outside: &Path) {
    if let (Some(root), Some(log)) = (std::env::var_os(LOOP_ROOT), std::env::var_os(LOOP_LOG)) {
        kill_loop_child(Path::new(&root), Path::new(&log));
    }
    fs::create_dir_all(outside.join("d")).unwrap();
    fs::write(outside.join("d/keep"), data(10_000, 7)).unwrap();
    let before = tree_bytes(outside);
    let log = outside.parent().unwrap().join("completed.log");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill loop on {fs_kind}: seed {seed}");
    let mut x = seed;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let set = SnapshotSet::open(root).unwrap();
    let test = format!("snapshot::kill_loop_{fs_kind}");
    let mut completed_seen = 0;
    for round in 0..25 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test, "--include-ignored", "--nocapture"])
            .env(LOOP_ROOT, root)
            .env(LOOP_LOG, &log)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20 + rnd(300)));
        let sig = if rnd(3) == 0 {
            rustix::process::Signal::INT
        } else {
            rustix::process::Signal::KILL
        };
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process(pid, sig);
        // A child started with SIGINT ignored (a shell's background job
        // passes that on) never sees the INT: after a while it gets KILL.
        let mut waited = 0;
        while child.try_wait().unwrap().is_none() && waited < 300 {
            std::thread::sleep(Duration::from_millis(10));
            waited += 1;
        }
        if child.try_wait().unwrap().is_none() {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "round {round}: the child ended by itself"
        );
        let what = format!("{fs_kind} round {round} (seed {seed}, {sig:?})");

        let (l, bad) = set.list().unwrap();
        assert!(bad.is_empty(), "{what}: {bad:?}");
        for s in l.iter().filter(|s| s.is_complete()) {
            assert!(
                s.present,
                "{what}: {} listed complete, no directory",
                s.name
            );
            if let Err(e) = loop_snapshot_intact(&s.path, &s.name) {
                panic!("{what}: {} listed complete but {e}", s.name);
            }
        }
        let logged: Vec<String> = fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if let Some(last) = logged.last() {
            let newest = l.iter().filter(|s| s.is_complete()).map(|s| &s.name).max();
            assert!(
                newest.is_some_and(|n| n >= last),
                "{what}: {last} was completed, the newest listed is {newest:?}"
            );
        }
        completed_seen = logged.len();
        assert_eq!(tree_bytes(outside), before, "{what}: outside changed");
        // Nothing under the root but snapshots (listed) and bookkeeping.
        for n in names_under(root) {
            assert!(
                n == ".cowlink" || l.iter().any(|s| s.name == n),
                "{what}: {n} under the root is not recorded"
            );
        }
    }
    eprintln!("{fs_kind}: {completed_seen} snapshots completed in the loop");
    // A rerun converges.
    let b = set.begin().unwrap();
    let name = b.name().to_string();
    drop(b);
    let b = set.begin().unwrap();
    assert!(b.resumed());
    assert_eq!(b.name(), name);
    b.complete().unwrap();
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    let (l, bad) = set.list().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0].name, name);
    assert_eq!(
        names_under(root),
        vec![".cowlink".to_string(), name.clone()]
    );
    // Nothing a prune moved aside is left behind.
    let aside = root.join(".cowlink/removing");
    if aside.exists() {
        assert_eq!(names_under(&aside), Vec::<String>::new());
    }
    let blocks = root.join(".cowlink/blocks");
    if blocks.exists() {
        assert!(
            names_under(&blocks).iter().all(|n| *n == name),
            "{:?}",
            names_under(&blocks)
        );
    }
    assert_eq!(tree_bytes(outside), before);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_loop_xfs() {
    if std::env::var_os(LOOP_ROOT).is_some() {
        kill_loop("xfs", Path::new(""), Path::new(""));
    }
    let x = testfs!(Xfs);
    kill_loop("xfs", &x.path().join("snaps"), &x.path().join("outside"));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_loop_btrfs() {
    if std::env::var_os(LOOP_ROOT).is_some() {
        kill_loop("btrfs", Path::new(""), Path::new(""));
    }
    let x = testfs!(Btrfs);
    kill_loop("btrfs", &x.path().join("snaps"), &x.path().join("outside"));
}

/// A concurrent process swaps a snapshot the prune removes with the
/// user's own directory (`renameat2(RENAME_EXCHANGE)` in a tight loop)
/// while the prune runs: the user's files survive every round, wherever
/// the swapping left them, and the prune removes only the snapshot or
/// leaves it (replaced) for the next one.
fn swap_during_prune(fs_kind: &str, base: &Path) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    for round in 0..12 {
        let root = base.join(format!("snaps-{round}"));
        let set = SnapshotSet::open(&root).unwrap();
        let b = set.begin().unwrap();
        fs::write(b.path().join("snapfile"), b"snapshot").unwrap();
        let old = b.complete().unwrap();
        set.begin().unwrap().complete().unwrap();
        let mine = base.join(format!("mine-{round}"));
        fs::create_dir_all(mine.join("sub")).unwrap();
        fs::write(mine.join("sub/precious"), b"user data").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, a, b) = (Arc::clone(&stop), old.path.clone(), mine.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &a,
                        rustix::fs::CWD,
                        &b,
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                    n += 1;
                }
                n
            })
        };
        let pruned = set.prune(&KeepPolicy::default(), false);
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let pruned = pruned.unwrap();
        let survived = [&mine, &old.path]
            .iter()
            .any(|p| fs::read(p.join("sub/precious")).is_ok_and(|d| d == b"user data"));
        assert!(
            survived,
            "{fs_kind} round {round}: the user's directory was removed by the prune ({:?})",
            pruned.errors
        );
        // What is left at the snapshot's name, if anything, is listed
        // as it is: never complete unless it is the snapshot.
        let (l, _) = set.list().unwrap();
        if let Some(s) = l.iter().find(|s| s.name == old.name && s.is_complete()) {
            assert!(s.path.join("snapfile").exists() || !s.present);
        }
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_swap_during_prune_never_removes_the_users_directory_xfs() {
    let x = testfs!(Xfs);
    swap_during_prune("xfs", x.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_swap_during_prune_never_removes_the_users_directory_btrfs() {
    let x = testfs!(Btrfs);
    swap_during_prune("btrfs", x.path());
}

/// A program that starts processes on another thread (the Python
/// binding's host, a test harness) must not see its own set reported in
/// use: a child forked while the lock is held holds a copy of its
/// descriptor until it executes, so the next `begin` of the same program
/// can find the lock taken for a moment.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_forking_thread_does_not_make_the_set_look_in_use() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let x = testfs!(Xfs);
    let set = SnapshotSet::open(x.path().join("snaps")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let spawner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = Command::new("true").status();
            }
        })
    };
    let mut refused = Vec::new();
    for i in 0..100 {
        match set.begin() {
            Ok(b) => {
                if i % 2 == 0 {
                    drop(b);
                } else {
                    b.complete().unwrap();
                }
            }
            Err(e) => refused.push(format!("{i}: {e}")),
        }
    }
    stop.store(true, Ordering::Relaxed);
    spawner.join().unwrap();
    assert!(
        refused.is_empty(),
        "{} refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );
}

/// A full filesystem (XFS, 236 MiB, filled to the last block): begin and
/// complete fail with `NoSpace`, leave no temporary in the bookkeeping,
/// never list a partial snapshot complete, leave the newest complete one
/// intact; once space is freed the next run resumes and converges.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn enospc_mid_snapshot_converges_once_space_is_freed() {
    let t = testfs!(TinyXfs);
    let root = t.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    for d in 0..4 {
        fs::create_dir(b.path().join(format!("d{d}"))).unwrap();
        for f in 0..400 {
            fs::write(
                b.path().join(format!("d{d}/f{f}")),
                data(4096, d * 1000 + f),
            )
            .unwrap();
        }
    }
    let s1 = b.complete().unwrap();
    // Fill every block, then every last inode's worth with small files.
    let st = rustix::fs::statvfs(t.path()).unwrap();
    let crumbs = t.path().join("crumbs");
    fs::create_dir(&crumbs).unwrap();
    let filler = t.path().join("filler");
    let f = fs::File::create(&filler).unwrap();
    let _ = rustix::fs::fallocate(
        &f,
        rustix::fs::FallocateFlags::empty(),
        0,
        (st.f_bavail * st.f_frsize).saturating_sub(64 << 10),
    );
    drop(f);
    for i in 0.. {
        if fs::write(crumbs.join(format!("c{i}")), [1u8; 4096]).is_err() {
            break;
        }
    }
    let mut failures = Vec::new();
    for _ in 0..3 {
        match set.begin() {
            Ok(b) => match b.complete() {
                Ok(s) => panic!("a snapshot {} completed on a full filesystem", s.name),
                Err(e) => failures.push(e),
            },
            Err(e) => failures.push(e),
        }
    }
    for e in &failures {
        assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    }
    let leftovers: Vec<String> = names_under(&root.join(".cowlink/records"))
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert_eq!(leftovers, Vec::<String>::new());
    let (l, bad) = set.list().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(l.iter().filter(|s| s.is_complete()).count(), 1, "{l:?}");
    assert_eq!(l[0].name, s1.name);
    // Space back: the snapshot in progress is resumed and completes.
    fs::remove_file(&filler).unwrap();
    fs::remove_dir_all(&crumbs).unwrap();
    let b = set.begin().unwrap();
    assert_eq!(b.base(), Some(s1.name.as_str()));
    let s2 = b.complete().unwrap();
    assert_eq!(rsync_diff(&s1.path, &s2.path, true), "");
    assert!(same_blocks(
        &s1.path.join("d3/f399"),
        &s2.path.join("d3/f399")
    ));
    let (l, _) = set.list().unwrap();
    assert_eq!(l.len(), 2, "{l:?}");
    assert!(l.iter().all(|s| s.is_complete()));
}

/// ext4 cannot clone: the first snapshot is a plain directory, the
/// second is refused with a typed error (never a silent full copy), is
/// never listed complete, and a prune keeps the complete one.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ext4_refuses_the_second_snapshot_and_stays_consistent() {
    let e4 = testfs!(Ext4);
    let root = e4.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    fs::write(b.path().join("f"), data(1 << 20, 4)).unwrap();
    let s1 = b.complete().unwrap();
    for round in 0..2 {
        let e = set.begin().map(|b| b.name().to_string()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported, "round {round}: {e}");
        let (l, bad) = set.list().unwrap();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(l.iter().filter(|s| s.is_complete()).count(), 1, "{l:?}");
        // No full copy of the data was made under the new name.
        for s in l.iter().filter(|s| !s.is_complete() && s.present) {
            let copied = fs::metadata(s.path.join("f")).map_or(0, |m| m.len());
            assert_eq!(copied, 0, "round {round}: {} holds a copy", s.name);
        }
    }
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert_eq!(fs::read(s1.path.join("f")).unwrap(), data(1 << 20, 4));
}

/// Every path of the bookkeeping replaced by each kind of thing a hostile
/// user can put there (a link to a directory or a file outside the
/// root, a FIFO, a hard link to a file outside, an oversized file, a
/// directory): open, list, prune, begin and complete each succeed or
/// fail with an error naming the path; none hangs or panics; nothing
/// outside the root changes; the complete snapshots still hold their
/// data; and once the plant is removed, the set works again.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn every_planted_bookkeeping_path_is_refused_or_survived() {
    let x = testfs!(Xfs);
    let outside = x.path().join("outside");
    fs::create_dir_all(outside.join("d")).unwrap();
    fs::write(outside.join("d/keep"), data(5000, 1)).unwrap();
    let victim = outside.join("victim");
    fs::write(&victim, b"precious").unwrap();
    let before = tree_bytes(&outside);
    let paths = [
        ".cowlink",
        ".cowlink/snapshots",
        ".cowlink/records",
        ".cowlink/lock",
        ".cowlink/blocks",
        ".cowlink/removing",
        ".cowlink/blocks/OLD",
        ".cowlink/records/OLD.json",
        ".cowlink/records/NEW.json",
    ];
    let kinds = ["link-dir", "link-file", "fifo", "hardlink", "huge", "dir"];
    let mut n = 0;
    for p in paths {
        for kind in kinds {
            n += 1;
            let root = x.path().join(format!("snaps-{n}"));
            let set = SnapshotSet::open(&root).unwrap();
            let b = set.begin().unwrap();
            fs::write(b.path().join("f"), b"old").unwrap();
            b.blocks_dir_create().unwrap();
            fs::write(b.blocks_dir().join("h"), b"hashes").unwrap();
            let old = b.complete().unwrap();
            let b = set.begin().unwrap();
            fs::write(b.path().join("f"), b"new").unwrap();
            let new = b.complete().unwrap();
            fs::create_dir_all(root.join(".cowlink/removing")).unwrap();
            let at = root.join(p.replace("OLD", &old.name).replace("NEW", &new.name));
            let what = format!("{p} as {kind}");
            if at.is_dir() {
                fs::remove_dir_all(&at).unwrap();
            } else if at.exists() {
                fs::remove_file(&at).unwrap();
            }
            let saved = at.with_extension("saved");
            match kind {
                "link-dir" => symlink(&outside, &at).unwrap(),
                "link-file" => symlink(&victim, &at).unwrap(),
                "fifo" => plant(Plant::Fifo, &at, &victim),
                "hardlink" => plant(Plant::HardLink, &at, &victim),
                "huge" => {
                    let f = fs::File::create(&at).unwrap();
                    f.set_len(1 << 40).unwrap();
                }
                _ => fs::create_dir(&at).unwrap(),
            }
            let _ = saved;
            let mut log = Vec::new();
            let mut note = |step: &str, r: Result<(), cowlink::Error>| {
                if let Err(e) = r {
                    let text = e.to_string();
                    assert!(
                        text.contains(&*root.to_string_lossy()),
                        "{what}: {step}: the error names no path: {text}"
                    );
                    log.push(format!("{step}: {:?}", e.kind()));
                }
            };
            note(
                "list",
                SnapshotSet::open_existing(&root).and_then(|s| s.list().map(|_| ())),
            );
            note("list_usage", set.list_usage().map(|_| ()));
            note(
                "prune",
                set.prune(
                    &KeepPolicy {
                        last: 1,
                        ..Default::default()
                    },
                    false,
                )
                .and_then(|p| p.errors.into_iter().next().map_or(Ok(()), Err)),
            );
            note(
                "begin",
                set.begin().and_then(|b| {
                    fs::write(b.path().join("f"), b"third").unwrap();
                    b.complete().map(|_| ())
                }),
            );
            // A record or format mark that is not a plain file of the
            // bookkeeping reads as damaged, whatever was put there.
            if p.ends_with(".json") || p.ends_with("snapshots") {
                assert!(
                    log.iter().all(|l| l.ends_with("Corrupt")),
                    "{what}: {log:?}"
                );
            }
            assert_eq!(tree_bytes(&outside), before, "{what}: outside changed");
            // The newest complete snapshot still holds its data.
            assert_eq!(fs::read(new.path.join("f")).unwrap(), b"new", "{what}");
            // The plant removed, the set works again (a record planted in
            // place of one is lost with it: that snapshot is then the
            // user's, and left alone).
            if at.is_dir() && !at.is_symlink() {
                fs::remove_dir_all(&at).unwrap();
            } else if at.symlink_metadata().is_ok() {
                fs::remove_file(&at).unwrap();
            }
            let set = SnapshotSet::open(&root).unwrap();
            let b = set
                .begin()
                .unwrap_or_else(|e| panic!("{what}: after the plant is gone: {e} ({log:?})"));
            b.complete().unwrap();
            let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
            assert!(pruned.errors.is_empty(), "{what}: {:?}", pruned.errors);
            assert_eq!(tree_bytes(&outside), before, "{what}: outside changed");
            eprintln!("{what}: {log:?}");
        }
    }
}

/// A bind mount inside the newest snapshot (of a directory on the same
/// filesystem, outside the root): the next snapshot's clone must not
/// take the mounted directory's contents for the snapshot's.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn the_clone_stops_at_a_mount_inside_the_base() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let outside = x.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret"), b"mounted, not the snapshot's").unwrap();
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    fs::create_dir(b.path().join("mnt")).unwrap();
    fs::write(b.path().join("f"), b"mine").unwrap();
    let s1 = b.complete().unwrap();
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&outside)
        .arg(s1.path.join("mnt"))
        .status()
        .unwrap();
    assert!(status.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let guard = Unmount(s1.path.join("mnt"));
    let r = set.begin();
    let (l, _) = set.list().unwrap();
    let s2 = l.iter().find(|s| s.name != s1.name).unwrap().clone();
    assert!(
        !s2.path.join("mnt/secret").exists(),
        "the clone copied what is mounted inside the base ({:?})",
        r.map(|b| b.name().to_string())
    );
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse, "{e}");
    assert!(e.to_string().contains("mounted inside"), "{e}");
    assert!(!s2.is_complete());
    // Unmounted: the snapshot in progress is resumed and completes.
    drop(guard);
    let b = set.begin().unwrap();
    assert!(b.resumed());
    assert_eq!(b.name(), s2.name);
    let done = b.complete().unwrap();
    assert_eq!(rsync_diff(&s1.path, &done.path, true), "");
    assert_eq!(
        fs::read(outside.join("secret")).unwrap(),
        b"mounted, not the snapshot's"
    );
}

/// A concurrent process swaps the base snapshot with the user's own
/// directory (or subvolume, on Btrfs) while `begin` clones it: no
/// snapshot ever receives the user's files.
fn swap_during_begin(fs_kind: &str, base: &Path, subvol: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut took = 0;
    for round in 0..40 {
        let root = base.join(format!("snaps-{round}"));
        let set = SnapshotSet::open(&root).unwrap();
        let b = set.begin().unwrap();
        fs::write(b.path().join("snapfile"), b"snapshot").unwrap();
        let s1 = b.complete().unwrap();
        let mine = base.join(format!("mine-{round}"));
        if subvol {
            let st = Command::new("btrfs")
                .args(["-q", "subvolume", "create"])
                .arg(&mine)
                .status()
                .unwrap();
            assert!(st.success());
        } else {
            fs::create_dir_all(&mine).unwrap();
        }
        fs::write(mine.join("users-file"), b"user data").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, a, b) = (Arc::clone(&stop), s1.path.clone(), mine.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &a,
                        rustix::fs::CWD,
                        &b,
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                }
            })
        };
        let r = set.begin().map(|b| b.path().to_path_buf());
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let (l, _) = set.list().unwrap();
        for s in l.iter().filter(|s| s.name != s1.name) {
            if s.path.join("users-file").exists() {
                took += 1;
                eprintln!(
                    "{fs_kind} round {round}: {} took the user's files ({r:?})",
                    s.name
                );
            }
        }
    }
    assert_eq!(
        took, 0,
        "{fs_kind}: snapshots cloned from the user's directory"
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_swap_during_begin_never_clones_the_users_directory_xfs() {
    let x = testfs!(Xfs);
    swap_during_begin("xfs", x.path(), false);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_swap_during_begin_never_clones_the_users_directory_btrfs() {
    let x = testfs!(Btrfs);
    swap_during_begin("btrfs", x.path(), true);
}

/// A concurrent process watches the records for the name of the next
/// snapshot and puts a link to a directory outside the root (or its own
/// directory) under that name before the clone makes it: nothing is
/// ever written outside the root or into the user's directory.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_link_planted_at_the_new_name_is_never_written_through() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let x = testfs!(Xfs);
    let outside = x.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("keep"), b"k").unwrap();
    let before = tree_bytes(&outside);
    let mut planted = 0;
    for round in 0..30 {
        let root = x.path().join(format!("snaps-{round}"));
        let set = SnapshotSet::open(&root).unwrap();
        let b = set.begin().unwrap();
        fs::write(b.path().join("snapfile"), b"snapshot").unwrap();
        b.complete().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let planter = {
            let (stop, root, outside) = (Arc::clone(&stop), root.clone(), outside.clone());
            let user_dir = round % 2 == 1;
            std::thread::spawn(move || {
                let records = root.join(".cowlink/records");
                let known: Vec<String> = names_under(&records);
                while !stop.load(Ordering::Relaxed) {
                    for n in names_under(&records) {
                        if known.contains(&n) {
                            continue;
                        }
                        let name = n.trim_start_matches('.');
                        let Some(name) = name.split(".json").next() else {
                            continue;
                        };
                        let at = root.join(name);
                        let ok = if user_dir {
                            fs::create_dir(&at).is_ok()
                        } else {
                            symlink(&outside, &at).is_ok()
                        };
                        if ok {
                            return true;
                        }
                    }
                }
                false
            })
        };
        let r = set.begin().map(|b| b.name().to_string());
        stop.store(true, Ordering::Relaxed);
        if planter.join().unwrap() {
            planted += 1;
            eprintln!("round {round}: {:?}", r.as_ref().map_err(|e| e.to_string()));
        }
        assert_eq!(
            tree_bytes(&outside),
            before,
            "round {round}: written outside ({r:?})"
        );
        // What was planted is not taken for the snapshot: the snapshot
        // is made under the next free name, and what was planted is left
        // as it was (an empty directory, or the link).
        let name = r.unwrap_or_else(|e| panic!("round {round}: {e}"));
        let (l, bad) = set.list().unwrap();
        assert!(bad.is_empty(), "round {round}: {bad:?}");
        let s = l.iter().find(|s| s.name == name).unwrap();
        assert!(s.present, "round {round}");
        assert!(s.path.join("snapfile").exists(), "round {round}");
        for n in names_under(&root) {
            if n == ".cowlink" || l.iter().any(|s| s.name == n) {
                continue;
            }
            let p = root.join(&n);
            let planted_ok = p.is_symlink() || names_under(&p).is_empty();
            assert!(planted_ok, "round {round}: {n} was written into");
        }
        assert!(l.iter().all(|s| s.present), "round {round}: {l:?}");
    }
    eprintln!("planted in {planted} of 30 rounds");
}

/// Names a snapshot may hold whatever the synced source held: newlines,
/// bytes that are not UTF-8, 255-byte names, a leading dash, `..`-like
/// names, a tree 120 levels deep, a FIFO and a dangling link. They are
/// cloned into the next snapshot exactly, listed, and pruned to nothing.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn hostile_names_inside_snapshots_clone_and_prune() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let x = testfs!(Btrfs);
    let y = testfs!(Xfs);
    for base in [x.path(), y.path()] {
        let root = base.join("snaps");
        let set = SnapshotSet::open(&root).unwrap();
        let b = set.begin().unwrap();
        let names: Vec<Vec<u8>> = vec![
            b"new\nline".to_vec(),
            vec![0xff, 0xfe, b'x'],
            vec![b'a'; 255],
            b"-rf".to_vec(),
            b"...".to_vec(),
            b"..\n..".to_vec(),
            b" space ".to_vec(),
            b"\\back".to_vec(),
        ];
        for (i, n) in names.iter().enumerate() {
            let p = b.path().join(OsStr::from_bytes(n));
            if i % 2 == 0 {
                fs::create_dir(&p).unwrap();
                fs::write(p.join(OsStr::from_bytes(n)), data(5000, i as u64)).unwrap();
            } else {
                fs::write(&p, data(7000, i as u64)).unwrap();
            }
        }
        let mut deep = b.path().to_path_buf();
        for _ in 0..120 {
            deep = deep.join("d");
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("bottom"), b"bottom").unwrap();
        symlink("/nonexistent/target", b.path().join("dangling")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            b.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let s1 = b.complete().unwrap();
        let s2 = set.begin().unwrap().complete().unwrap();
        assert_eq!(
            rsync_diff(&s1.path, &s2.path, true),
            "",
            "{}",
            base.display()
        );
        let listing = set.list_usage().unwrap();
        assert!(listing.errors.is_empty(), "{:?}", listing.errors);
        assert_eq!(listing.snapshots.len(), 2);
        // Both go but the newest; then the newest is the only one.
        let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
        assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
        assert!(!s1.path.exists());
        assert_eq!(
            names_under(&root),
            vec![".cowlink".to_string(), s2.name.clone()]
        );
        assert!(names_under(&root.join(".cowlink/removing")).is_empty());
        assert_eq!(
            fs::read(
                s2.path
                    .join(deep.strip_prefix(&s1.path).unwrap())
                    .join("bottom")
            )
            .unwrap(),
            b"bottom"
        );
    }
}

/// A Btrfs subvolume the user made inside a snapshot later (a snapshot
/// never holds one: a subvolume snapshot leaves nested ones out and a
/// tree clone makes directories) is not the snapshot's: prune refuses
/// the snapshot, as it does one with a mount inside, and the
/// subvolume's files survive; once it is moved out, the prune finishes.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn prune_leaves_a_foreign_subvolume_inside_a_snapshot() {
    let x = testfs!(Btrfs);
    let root = x.path().join("snaps");
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    fs::write(b.path().join("f"), b"snap").unwrap();
    let old = b.complete().unwrap();
    set.begin().unwrap().complete().unwrap();
    let sub = old.path.join("users-subvol");
    let st = Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(&sub)
        .status()
        .unwrap();
    assert!(st.success());
    fs::write(sub.join("precious"), b"user data").unwrap();
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    let inside = |p: &Path| fs::read(p.join("precious")).ok();
    let aside = root
        .join(".cowlink/removing")
        .join(&old.name)
        .join("users-subvol");
    assert_eq!(
        inside(&sub).or_else(|| inside(&aside)).as_deref(),
        Some(&b"user data"[..]),
        "the user's subvolume was emptied ({:?})",
        pruned.errors
    );
    assert_eq!(pruned.failed, vec![old.name.clone()]);
    assert_eq!(
        pruned.errors[0].kind(),
        ErrorKind::InUse,
        "{}",
        pruned.errors[0]
    );
    // The error says where it is now (the snapshot was moved aside to
    // be removed); moved out, the next prune removes the snapshot.
    let now = root
        .join(".cowlink/removing")
        .join(&old.name)
        .join("users-subvol");
    let at = if sub.exists() { sub.clone() } else { now };
    assert!(
        pruned.errors[0]
            .to_string()
            .contains(&*at.to_string_lossy()),
        "{}",
        pruned.errors[0]
    );
    fs::rename(&at, x.path().join("kept")).unwrap();
    let pruned = set.prune(&KeepPolicy::default(), false).unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    assert!(!old.path.exists());
    assert_eq!(
        fs::read(x.path().join("kept/precious")).unwrap(),
        b"user data"
    );
    // A subvolume in the newest snapshot leaves an empty placeholder in
    // the next (a subvolume snapshot): that one is the snapshot's, and a
    // prune removes it with the snapshot.
    let (l, _) = set.list().unwrap();
    let newest = l.last().unwrap().clone();
    let st = Command::new("btrfs")
        .args(["-q", "subvolume", "create"])
        .arg(newest.path.join("sv"))
        .status()
        .unwrap();
    assert!(st.success());
    let with_placeholder = set.begin().unwrap().complete().unwrap();
    assert!(with_placeholder.path.join("sv").is_dir());
    set.begin().unwrap().complete().unwrap();
    let pruned = set
        .prune(
            &KeepPolicy {
                last: 1,
                ..Default::default()
            },
            false,
        )
        .unwrap();
    assert_eq!(
        pruned.failed,
        vec![newest.name.clone()],
        "{:?}",
        pruned.errors
    );
    assert!(!with_placeholder.path.exists());
}

/// A directory bind-mounted inside a snapshot is not the snapshot's: the
/// listing does not count its bytes as the snapshot's (removing the
/// snapshot would not free them; prune refuses it anyway), and says why.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn listing_does_not_count_a_mount_inside_a_snapshot() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let outside = x.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("big"), data(3 << 20, 5)).unwrap();
    let set = SnapshotSet::open(&root).unwrap();
    let b = set.begin().unwrap();
    fs::create_dir(b.path().join("mnt")).unwrap();
    fs::write(b.path().join("f"), data(64 << 10, 1)).unwrap();
    let s1 = b.complete().unwrap();
    let s2 = set.begin().unwrap().complete().unwrap();
    let status = Command::new("mount")
        .arg("--bind")
        .arg(&outside)
        .arg(s1.path.join("mnt"))
        .status()
        .unwrap();
    assert!(status.success());
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let guard = Unmount(s1.path.join("mnt"));
    rustix::fs::sync();
    let listing = set.list_usage().unwrap();
    let u1 = listing.snapshots[0].usage;
    assert!(
        u1.is_none_or(|u| u.data < 1 << 20),
        "the mounted directory counted as the snapshot's: {u1:?}"
    );
    assert_eq!(listing.errors.len(), 1, "{:?}", listing.errors);
    assert_eq!(listing.errors[0].kind(), ErrorKind::InUse);
    assert!(
        listing.errors[0].to_string().contains("mounted inside"),
        "{}",
        listing.errors[0]
    );
    // The other snapshot is measured as usual.
    assert_eq!(listing.snapshots[1].snapshot.name, s2.name);
    assert_eq!(listing.snapshots[1].usage.unwrap().data, 64 << 10);
    drop(guard);
    let listing = set.list_usage().unwrap();
    assert!(listing.errors.is_empty(), "{:?}", listing.errors);
    assert_eq!(listing.snapshots[0].usage.unwrap().data, 64 << 10);
}

/// A clock once set ahead (here to 2030) leaves a snapshot whose name
/// every later one must sort after, so the later ones are named a few
/// microseconds into 2030 whatever day they were really made. Their days
/// for --keep-daily are the days they were made (their completion, which
/// is earlier than their name): five snapshots of five real days are
/// five days, not one.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_clock_once_set_ahead_does_not_merge_later_days() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let records = root.join(".cowlink/records");
    let set = SnapshotSet::open(&root).unwrap();
    let s0 = set.begin().unwrap().complete().unwrap();
    let future = "20300101T000000.000000Z";
    fs::rename(&s0.path, root.join(future)).unwrap();
    let rec = fs::read(records.join(format!("{}.json", s0.name))).unwrap();
    fs::write(records.join(format!("{future}.json")), rec).unwrap();
    fs::remove_file(records.join(format!("{}.json", s0.name))).unwrap();
    // Five daily snapshots, the clock right again: made (completed) on
    // five consecutive days up to yesterday.
    let now_us = cowlink::snapshot::Stamp::now().0;
    let day_us = 86_400_000_000u64;
    let mut later = Vec::new();
    for k in 0..5u64 {
        let s = set.begin().unwrap().complete().unwrap();
        assert!(s.name.starts_with("20300101T"), "{}", s.name);
        let file = records.join(format!("{}.json", s.name));
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        v["completed"] = serde_json::json!(now_us - (5 - k) * day_us);
        fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
        later.push(s.name);
    }
    let pruned = set
        .prune(
            &KeepPolicy {
                daily: 5,
                ..Default::default()
            },
            false,
        )
        .unwrap();
    assert!(pruned.errors.is_empty(), "{:?}", pruned.errors);
    let (l, _) = set.list().unwrap();
    let left: Vec<String> = l.iter().map(|s| s.name.clone()).collect();
    assert_eq!(left, later, "{:?}", pruned.snapshots);
}
