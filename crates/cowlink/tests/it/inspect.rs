//! Inspection on real filesystems: extents (FIEMAP), Btrfs back references,
//! and true disk usage (`usage`), with exact expected byte counts.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cowlink::extents::{btrfs_refs, extents, FileLayout, Hole};
use cowlink::usage::{usage_report, Usage, UsageOptions};
use cowlink::{clone_file, CloneOptions, ErrorKind, Method};
use cowlink_testfs::{data, testfs, write_file};

const K: u64 = 1024;

fn clone(a: &Path, b: &Path) {
    let o = clone_file(a, b, &CloneOptions::default()).unwrap();
    assert_eq!(o.method, Method::Reflink, "{} must clone", b.display());
}

fn runs(l: &FileLayout) -> Vec<(u64, u64)> {
    l.physical_runs()
}

/// The file ranges `[start, end)` that are not flagged shared.
fn unshared(l: &FileLayout) -> Vec<(u64, u64)> {
    l.extents
        .iter()
        .filter(|e| !e.is_shared())
        .map(|e| (e.logical, e.logical + e.length))
        .collect()
}

/// Clone 1 MiB, check both files are wholly shared on the same blocks;
/// overwrite one 4 KiB block of the clone and check exactly that block
/// became the clone's own. `source_block_still_shared`: Btrfs keeps the
/// source's whole extent flagged shared (the clone still references the
/// rest of it), XFS tracks sharing per block.
fn clone_then_diverge(dir: &Path, source_block_still_shared: bool) {
    let (a, b) = (dir.join("a"), dir.join("b"));
    write_file(&a, &data(1 << 20, 1));
    clone(&a, &b);
    let (la, lb) = (extents(&a).unwrap(), extents(&b).unwrap());
    for l in [&la, &lb] {
        assert_eq!(l.mapped_bytes, 1 << 20, "{l:?}");
        assert_eq!(
            l.shared_bytes,
            1 << 20,
            "fresh clone not 100% shared: {l:?}"
        );
        assert!(l.is_cow_link());
        assert_eq!(l.hole_bytes, 0, "{l:?}");
        assert_eq!(l.fragments, runs(l).len() as u64, "{l:?}");
    }
    assert_eq!(runs(&la), runs(&lb), "clone must map to the same blocks");

    let f = fs::OpenOptions::new().write(true).open(&b).unwrap();
    f.write_all_at(&[0xAB; 4096], 64 * K).unwrap();
    f.sync_all().unwrap();
    let (la, lb) = (extents(&a).unwrap(), extents(&b).unwrap());
    assert_eq!(unshared(&lb), vec![(64 * K, 68 * K)], "clone: {lb:?}");
    assert_eq!(lb.shared_bytes, (1 << 20) - 4 * K);
    let own = lb.extents.iter().find(|e| !e.is_shared()).unwrap();
    assert!(
        runs(&la)
            .iter()
            .all(|&(p, n)| own.physical + own.length <= p || p + n <= own.physical),
        "the rewritten block must live outside the source's blocks"
    );
    if source_block_still_shared {
        assert_eq!(la.shared_bytes, 1 << 20, "source: {la:?}");
    } else {
        assert_eq!(unshared(&la), vec![(64 * K, 68 * K)], "source: {la:?}");
    }
    assert_eq!(fs::read(&a).unwrap(), data(1 << 20, 1), "source changed");

    // The same pair measured: 2 MiB referenced, 1 MiB - 4 KiB saved.
    let u = usage_report(&[&a, &b], &UsageOptions::default());
    assert!(u.errors.is_empty(), "{:?}", u.errors);
    let exclusive = if source_block_still_shared {
        4 * K
    } else {
        8 * K
    };
    assert_eq!(u.total.data, 2 << 20);
    assert_eq!(u.total.exclusive, exclusive);
    assert_eq!(u.total.saved, (1 << 20) - 4 * K);
    // On Btrfs the rewritten block of the source's extent is still flagged
    // shared (the clone references the rest of that extent), yet only the
    // source reads it: it counts as shared with something outside the set.
    let outside = if source_block_still_shared { 4 * K } else { 0 };
    assert_eq!(u.total.shared_outside, outside);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_clone_is_fully_shared_until_one_block_is_rewritten() {
    let d = testfs!(Xfs);
    clone_then_diverge(d.path(), false);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_clone_is_fully_shared_until_one_block_is_rewritten() {
    let d = testfs!(Btrfs);
    clone_then_diverge(d.path(), true);
}

/// Holes where nothing was written; UNWRITTEN where space was only
/// preallocated.
fn holes_and_unwritten(dir: &Path) {
    let p = dir.join("sparse");
    let f = fs::File::create(&p).unwrap();
    f.write_all_at(&data(4096, 2), 0).unwrap();
    f.write_all_at(&data(4096, 3), 1 << 20).unwrap();
    f.set_len(2 << 20).unwrap();
    f.sync_all().unwrap();
    let l = extents(&p).unwrap();
    assert_eq!(
        l.holes,
        vec![
            Hole {
                offset: 4 * K,
                length: (1 << 20) - 4 * K
            },
            Hole {
                offset: (1 << 20) + 4 * K,
                length: (1 << 20) - 4 * K
            }
        ],
        "{l:?}"
    );
    assert_eq!(l.mapped_bytes, 8 * K);
    assert_eq!(l.size, 2 << 20);

    let p = dir.join("prealloc");
    let f = fs::File::create(&p).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 1 << 20).unwrap();
    f.write_all_at(&data(4096, 4), 0).unwrap();
    f.sync_all().unwrap();
    let l = extents(&p).unwrap();
    assert_eq!(l.unwritten_bytes, (1 << 20) - 4 * K, "{l:?}");
    assert!(!l.extents[0].is_unwritten() && l.extents.last().unwrap().is_unwritten());
    assert!(l
        .extents
        .last()
        .unwrap()
        .flag_names()
        .contains(&"unwritten"));
    assert_eq!(l.hole_bytes, 0);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn holes_and_unwritten_ranges_on_xfs_btrfs_ext4() {
    let (x, b, e) = (testfs!(Xfs), testfs!(Btrfs), testfs!(Ext4));
    for d in [&x, &b, &e] {
        holes_and_unwritten(d.path());
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn thousands_of_extents_are_all_listed() {
    let (x, e) = (testfs!(Xfs), testfs!(Ext4));
    // Every other 4 KiB block written: 3000 separate extents, more than
    // ten FIEMAP batches.
    for d in [&x, &e] {
        let p = d.path().join("striped");
        let f = fs::File::create(&p).unwrap();
        for i in 0..3000u64 {
            f.write_all_at(&[i as u8 | 1; 4096], i * 8 * K).unwrap();
        }
        f.sync_all().unwrap();
        let l = extents(&p).unwrap();
        // XFS may fill the gaps with unwritten (preallocated) extents;
        // the written ones must all be there, in order.
        let written: Vec<(u64, u64)> = l
            .extents
            .iter()
            .filter(|e| !e.is_unwritten())
            .map(|e| (e.logical, e.length))
            .collect();
        let want: Vec<(u64, u64)> = (0..3000).map(|i| (i * 8 * K, 4 * K)).collect();
        assert_eq!(written, want, "{}", d.path().display());
        assert!(l.extents.last().unwrap().is_last());
        assert_eq!(
            l.mapped_bytes,
            l.extents.iter().map(|e| e.length).sum::<u64>()
        );
    }
}

/// A tree with known sharing:
///   set/x        256 KiB, own data
///   set/y        clone of x
///   set/sub/z    clone of x
///   set/w        128 KiB, cloned to outside/o (outside the set)
///   set/hl       hard link to w (counts once)
///   set/e        8 KiB, own data, not shared
///   set/link     symlink to "x"
fn shared_tree(root: &Path) -> PathBuf {
    let set = root.join("set");
    fs::create_dir_all(set.join("sub")).unwrap();
    fs::create_dir(root.join("outside")).unwrap();
    write_file(&set.join("x"), &data(256 << 10, 5));
    clone(&set.join("x"), &set.join("y"));
    clone(&set.join("x"), &set.join("sub/z"));
    write_file(&set.join("w"), &data(128 << 10, 6));
    clone(&set.join("w"), &root.join("outside/o"));
    fs::hard_link(set.join("w"), set.join("hl")).unwrap();
    write_file(&set.join("e"), &data(8 << 10, 7));
    std::os::unix::fs::symlink("x", set.join("link")).unwrap();
    set
}

fn usage_of_shared_tree(root: &Path) -> Vec<(PathBuf, Usage)> {
    let set = shared_tree(root);
    let r = usage_report(
        &[&set],
        &UsageOptions {
            per_dir: true,
            ..Default::default()
        },
    );
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let t = r.total;
    assert_eq!((t.files, t.dirs, t.others), (5, 2, 1), "{t:?}");
    assert_eq!(t.apparent, 3 * 256 * K + 128 * K + 8 * K + 1);
    assert_eq!(t.data, 3 * 256 * K + 128 * K + 8 * K);
    assert_eq!(t.exclusive, 8 * K);
    assert_eq!(t.shared_inside, 256 * K);
    assert_eq!(t.shared_outside, 128 * K);
    assert_eq!(t.shared, 384 * K);
    assert_eq!(t.on_disk, 392 * K);
    assert_eq!(t.saved, 512 * K);
    assert_eq!(r.args.len(), 1);
    assert_eq!(r.args[0].usage, t);
    // The subdirectory alone: z's blocks are shared with x and y, which
    // are outside it.
    let sub = r.dirs.iter().find(|d| d.path == set.join("sub")).unwrap();
    assert_eq!(
        (sub.usage.data, sub.usage.shared_outside),
        (256 * K, 256 * K)
    );
    assert_eq!((sub.usage.shared_inside, sub.usage.saved), (0, 0));
    // Overlapping arguments: each alone, the set counts every file once.
    let both = usage_report(&[set.clone(), set.join("sub")], &UsageOptions::default());
    assert_eq!(both.total, t);
    assert_eq!(both.args[1].usage.data, 256 * K);
    // Two arguments: the hard link counts once in the set.
    let two = usage_report(&[set.join("w"), set.join("hl")], &UsageOptions::default());
    assert_eq!((two.total.files, two.total.data), (1, 128 * K));
    r.dirs
        .into_iter()
        .map(|d| (d.path, d.usage))
        .chain([(set.clone(), t)])
        .collect()
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn du_of_a_constructed_tree_on_xfs() {
    let d = testfs!(Xfs);
    usage_of_shared_tree(d.path());
    // Data not written back yet (delayed allocation) is exclusive.
    let fresh = d.path().join("fresh");
    fs::write(&fresh, data(64 << 10, 10)).unwrap();
    let u = usage_report(&[&fresh], &UsageOptions::default()).total;
    assert_eq!(
        (u.data, u.exclusive, u.shared),
        (64 * K, 64 * K, 0),
        "{u:?}"
    );
}

/// `btrfs filesystem du -s --raw`: (Total, Exclusive, Set shared).
fn btrfs_du(path: &Path) -> (u64, u64, u64) {
    let out = Command::new("btrfs")
        .args(["filesystem", "du", "-s", "--raw"])
        .arg(path)
        .output()
        .expect("btrfs-progs is installed (scripts/setup)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let row: Vec<u64> = text
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .take(3)
        .map(|n| n.parse().unwrap())
        .collect();
    (row[0], row[1], row[2])
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn du_of_a_constructed_tree_on_btrfs_agrees_with_btrfs_filesystem_du() {
    let d = testfs!(Btrfs);
    let rows = usage_of_shared_tree(d.path());
    for (path, u) in rows {
        assert_eq!(
            btrfs_du(&path),
            (u.data, u.exclusive, u.shared),
            "{}",
            path.display()
        );
    }
    // And on the fixture with every kind of entry.
    let rich = d.path().join("rich");
    fs::create_dir(&rich).unwrap();
    cowlink_testfs::rich_tree(&rich, 20);
    let copy = d.path().join("rich-copy");
    let o = cowlink::tree::copy_tree(
        &rich,
        &copy,
        &cowlink::tree::TreeOptions::archive(),
        &cowlink::tree::Quiet,
    )
    .unwrap();
    assert!(o.cloned > 0);
    let both = d.path();
    let u = usage_report(&[both], &UsageOptions::default()).total;
    assert_eq!(btrfs_du(both), (u.data, u.exclusive, u.shared));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_refs_count_every_clone_and_name_it() {
    let d = testfs!(Btrfs);
    let a = d.path().join("a");
    write_file(&a, &data(512 << 10, 8));
    let names: Vec<PathBuf> = ["b", "c", "d"].iter().map(|n| d.path().join(n)).collect();
    for n in &names {
        clone(&a, n);
    }
    let l = extents(&a).unwrap();
    let refs = btrfs_refs(&a, &l, true).unwrap();
    assert_eq!(refs.len(), l.extents.len());
    let root = fs::canonicalize(d.path()).unwrap();
    let mut want: Vec<PathBuf> = ["a", "b", "c", "d"].iter().map(|n| root.join(n)).collect();
    want.sort();
    for r in &refs {
        assert_eq!(r.len(), 4, "{r:?}");
        let mut got: Vec<PathBuf> = r.iter().flat_map(|f| f.paths.clone()).collect();
        got.sort();
        assert_eq!(got, want);
    }
    // Without paths, the counts alone.
    let counts = btrfs_refs(&a, &l, false).unwrap();
    assert!(counts.iter().all(|r| r.len() == 4 && r[0].paths.is_empty()));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_refs_elsewhere_is_not_supported() {
    let x = testfs!(Xfs);
    let a = x.path().join("a");
    write_file(&a, &data(8192, 9));
    let l = extents(&a).unwrap();
    let e = btrfs_refs(&a, &l, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert!(e.to_string().contains("xfs"), "{e}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn tmpfs_has_no_extents_and_says_so() {
    let t = testfs!(Tmpfs);
    let p = t.path().join("f");
    fs::write(&p, b"hello").unwrap();
    let e = extents(&p).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported);
    assert_eq!(
        e.to_string(),
        format!(
            "cannot map extents of '{}': this filesystem (tmpfs) does not report file extents (no FIEMAP)",
            p.display()
        )
    );
    // usage reports it once per filesystem, not once per file.
    fs::write(t.path().join("g"), b"world").unwrap();
    let r = usage_report(&[t.path()], &UsageOptions::default());
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].kind(), ErrorKind::NotSupported);
    assert_eq!((r.total.files, r.total.unmapped), (2, 2));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn typed_errors_for_missing_files_and_directories() {
    let x = testfs!(Xfs);
    let e = extents(x.path().join("missing")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("missing"), "{e}");
    let e = extents(x.path()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IsDirectory);
    let r = usage_report(&[x.path().join("missing")], &UsageOptions::default());
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].kind(), ErrorKind::NotFound);
}

/// A Btrfs subvolume and its snapshot have device numbers of their own
/// but share one pool of disk: measured together, the blocks they share
/// count once (shared inside the set), and a rewritten file's old and
/// new blocks are each one snapshot's alone.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_subvolume_and_its_snapshot_share_one_address_space() {
    use std::os::unix::fs::MetadataExt;
    let d = testfs!(Btrfs);
    let (vol, snap) = (d.path().join("vol"), d.path().join("snap"));
    let btrfs = |args: &[&std::ffi::OsStr]| {
        let st = Command::new("btrfs").arg("-q").args(args).status().unwrap();
        assert!(st.success(), "btrfs {args:?}");
    };
    btrfs(&["subvolume".as_ref(), "create".as_ref(), vol.as_os_str()]);
    write_file(&vol.join("kept"), &data(1 << 20, 1));
    write_file(&vol.join("changed"), &data(1 << 20, 2));
    Command::new("sync").status().unwrap();
    btrfs(&[
        "subvolume".as_ref(),
        "snapshot".as_ref(),
        vol.as_os_str(),
        snap.as_os_str(),
    ]);
    assert_ne!(
        fs::metadata(&vol).unwrap().dev(),
        fs::metadata(&snap).unwrap().dev()
    );
    write_file(&snap.join("changed"), &data(1 << 20, 3));
    Command::new("sync").status().unwrap();

    let u = usage_report(&[&vol, &snap], &UsageOptions::default());
    assert!(u.errors.is_empty(), "{:?}", u.errors);
    assert_eq!(u.total.data, 4 << 20, "four files of 1 MiB referenced");
    assert_eq!(u.total.shared_inside, 1 << 20, "`kept` once: {:?}", u.total);
    assert_eq!(u.total.shared_outside, 0, "{:?}", u.total);
    assert_eq!(u.total.exclusive, 2 << 20, "{:?}", u.total);
    assert_eq!(u.total.on_disk, 3 << 20, "{:?}", u.total);
    assert_eq!(u.total.saved, 1 << 20, "{:?}", u.total);
    // Each alone: `kept` is shared with the other, outside that argument.
    for a in &u.args {
        assert_eq!(a.usage.shared_outside, 1 << 20, "{:?}", a);
        assert_eq!(a.usage.exclusive, 1 << 20, "{:?}", a);
    }
    for p in [&vol, &snap] {
        btrfs(&["subvolume".as_ref(), "delete".as_ref(), p.as_os_str()]);
    }
}
