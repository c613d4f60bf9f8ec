//! Dedupe on real filesystems: space comes back, data is never lost, near
//! duplicates stay apart, large files and many copies work, a second run
//! does nothing, and filesystems that cannot dedupe are refused.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use cowlink::dedupe::{dedupe, execute, plan, DedupeOptions, DedupePlan, FileStamp};
use cowlink::extents::extents;
use cowlink::ErrorKind;
use cowlink_testfs::{data, serial, testfs, write_file};

use crate::same_blocks;

const MIB: u64 = 1 << 20;

fn plan_of(paths: &[&Path]) -> DedupePlan {
    plan(paths, &DedupeOptions::default()).unwrap()
}

fn sync(dir: &Path) {
    let f = fs::File::open(dir).unwrap();
    rustix::fs::syncfs(&f).unwrap();
}

/// N separately written identical files (not clones) of `size` bytes.
fn copies(dir: &Path, n: usize, size: usize, seed: u64) -> Vec<PathBuf> {
    let bytes = data(size, seed);
    let out: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("copy{i:03}"))).collect();
    for p in &out {
        write_file(p, &bytes);
    }
    sync(dir);
    out
}

fn reclaims_space_and_keeps_metadata(dir: &Path) {
    let files = copies(dir, 5, 4 * MIB as usize, 1);
    // Distinct metadata on a target, to check nothing changes it.
    let t = &files[3];
    fs::set_permissions(t, fs::Permissions::from_mode(0o640)).unwrap();
    rustix::fs::chown(
        t,
        Some(rustix::fs::Uid::from_raw(1234)),
        Some(rustix::fs::Gid::from_raw(4321)),
    )
    .unwrap();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let f = fs::File::options().write(true).open(t).unwrap();
    f.set_times(fs::FileTimes::new().set_accessed(old).set_modified(old))
        .unwrap();
    drop(f);
    let before = fs::metadata(t).unwrap();

    let p = plan_of(&[dir]);
    assert_eq!(p.groups.len(), 1, "{p:?}");
    let g = &p.groups[0];
    assert_eq!((g.source.clone(), g.targets.len()), (files[0].clone(), 4));
    assert_eq!(g.reclaimable, 16 * MIB);
    let r = execute(&p, &DedupeOptions::default());
    assert!(r.errors.is_empty() && r.changed.is_empty(), "{r:?}");
    assert!(r.measured);
    assert_eq!(r.targets_deduped, 4);
    assert_eq!(r.bytes_compared, 16 * MIB);
    for f in &files[1..] {
        assert!(
            same_blocks(&files[0], f),
            "{f:?} does not share the source's blocks"
        );
    }
    // Measured, so only roughly the expected amount (metadata moves too).
    assert!(
        (15 * MIB..=17 * MIB).contains(&r.bytes_reclaimed),
        "reclaimed {} bytes, expected about 16 MiB",
        r.bytes_reclaimed
    );
    // Metadata first: reading the contents below updates the access time.
    let after = fs::metadata(t).unwrap();
    assert_eq!(
        (
            after.mode(),
            after.uid(),
            after.gid(),
            after.mtime(),
            after.mtime_nsec()
        ),
        (
            before.mode(),
            before.uid(),
            before.gid(),
            before.mtime(),
            before.mtime_nsec()
        )
    );
    assert_eq!(
        (after.atime(), after.atime_nsec()),
        (before.atime(), before.atime_nsec())
    );

    for f in &files[1..] {
        assert!(same_blocks(&files[0], f), "{} not shared", f.display());
        assert_eq!(fs::read(f).unwrap(), data(4 * MIB as usize, 1));
    }
    // A second run: everything is already shared, nothing is read.
    let again = plan_of(&[dir]);
    assert!(again.groups.is_empty(), "{again:?}");
    assert_eq!((again.files_already_shared, again.bytes_hashed), (4, 0));
    assert_eq!(again.groups_already_shared, 1);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_dedupe_reclaims_space_and_keeps_metadata() {
    let _serial = serial();
    let d = testfs!(Xfs);
    reclaims_space_and_keeps_metadata(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_dedupe_reclaims_space_and_keeps_metadata() {
    let _serial = serial();
    let d = testfs!(Btrfs);
    reclaims_space_and_keeps_metadata(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_target_changed_after_the_plan_keeps_its_new_content() {
    let _serial = serial();
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    for d in [x.path(), b.path()] {
        let files = copies(d, 4, 2 * MIB as usize, 2);
        let p = plan_of(&[d]);
        assert_eq!(p.targets(), 3);
        // Same size, one byte different, after the plan: the kernel's
        // comparison must catch it.
        let f = fs::File::options().write(true).open(&files[1]).unwrap();
        f.write_all_at(b"!", MIB + 17).unwrap();
        f.sync_all().unwrap();
        // A size change is caught before the kernel is asked.
        fs::OpenOptions::new()
            .append(true)
            .open(&files[2])
            .unwrap()
            .write_all_at(b"tail", 2 * MIB)
            .unwrap();
        let r = execute(&p, &DedupeOptions::default());
        let mut changed = r.changed.clone();
        changed.sort();
        assert_eq!(changed, vec![files[1].clone(), files[2].clone()], "{r:?}");
        assert!(r.errors.is_empty(), "{r:?}");
        assert_eq!(r.targets_deduped, 1);
        let mut want = data(2 * MIB as usize, 2);
        want[(MIB + 17) as usize] = b'!';
        assert_eq!(fs::read(&files[1]).unwrap(), want, "new content lost");
        assert_eq!(fs::metadata(&files[2]).unwrap().len(), 2 * MIB + 4);
        assert!(same_blocks(&files[0], &files[3]));
        assert!(!same_blocks(&files[0], &files[1]));
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn near_duplicates_and_hard_links_are_not_deduplicated() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let d = x.path();
    let base = data(256 << 10, 3);
    write_file(&d.join("base"), &base);
    let mut last = base.clone();
    *last.last_mut().unwrap() ^= 1;
    write_file(&d.join("last-byte"), &last);
    let mut first = base.clone();
    first[0] ^= 1;
    write_file(&d.join("first-byte"), &first);
    let mut middle = base.clone();
    middle[128 << 10] ^= 1;
    write_file(&d.join("middle-byte"), &middle);
    write_file(&d.join("prefix"), &base[..200 << 10]);
    let mut longer = base.clone();
    longer.extend_from_slice(b"more");
    write_file(&d.join("longer"), &longer);
    fs::hard_link(d.join("base"), d.join("hardlink")).unwrap();
    write_file(&d.join("small"), b"tiny"); // below a 4 KiB min_size
    write_file(&d.join("small2"), b"tiny");
    sync(d);
    let opts = DedupeOptions {
        min_size: 4096,
        ..Default::default()
    };
    let p = plan(&[d], &opts).unwrap();
    assert!(p.groups.is_empty(), "{p:#?}");
    assert_eq!(p.hardlinks_skipped, 1);
    assert_eq!(p.files_scanned, 9);
    assert_eq!(p.candidates, 6);
    // The default (1 byte) pairs the tiny duplicates and nothing else.
    let p = plan_of(&[d]);
    assert_eq!(p.candidates, 8);
    assert_eq!(p.groups.len(), 1, "{p:#?}");
    assert_eq!(p.groups[0].size, 4);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_file_over_1_gib_deduplicates_completely() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let d = x.path();
    // Sparse, with data at the start, across the 1 GiB chunk boundary, and
    // an unaligned tail at EOF.
    let size = (1 << 30) + 8 * MIB + 123;
    let pieces = [
        (0u64, 4 * MIB),
        ((1 << 30) - 2 * MIB, 4 * MIB),
        (size - 4096 - 123, 4096 + 123),
    ];
    let paths = [d.join("big-a"), d.join("big-b")];
    for p in &paths {
        let f = fs::File::create(p).unwrap();
        for (i, &(off, len)) in pieces.iter().enumerate() {
            f.write_all_at(&data(len as usize, 10 + i as u64), off)
                .unwrap();
        }
        f.set_len(size).unwrap();
        f.sync_all().unwrap();
    }
    let p = plan_of(&[d]);
    assert_eq!(p.targets(), 1, "{p:?}");
    let r = execute(&p, &DedupeOptions::default());
    assert!(r.errors.is_empty() && r.changed.is_empty(), "{r:?}");
    assert_eq!(r.targets_deduped, 1);
    assert_eq!(r.bytes_compared, size);
    assert!(same_blocks(&paths[0], &paths[1]));
    assert!(extents(&paths[1])
        .unwrap()
        .extents
        .iter()
        .all(|e| e.is_shared()));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn more_than_127_copies_deduplicate() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let files = copies(x.path(), 140, 16 << 10, 4);
    let p = plan_of(&[x.path()]);
    assert_eq!(p.targets(), 139);
    let r = execute(&p, &DedupeOptions::default());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.targets_deduped, 139);
    assert!(files[1..].iter().all(|f| same_blocks(&files[0], f)));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn filesystems_that_cannot_dedupe_are_refused_and_untouched() {
    let _serial = serial();
    let (e, t) = (testfs!(Ext4), testfs!(Tmpfs));
    for d in [e.path(), t.path()] {
        copies(d, 3, 64 << 10, 5);
    }
    let p = plan(&[e.path(), t.path()], &DedupeOptions::default()).unwrap();
    assert!(p.groups.is_empty());
    assert_eq!(p.errors.len(), 2, "{:?}", p.errors);
    assert!(
        p.errors[0]
            .to_string()
            .contains("this filesystem cannot deduplicate"),
        "{:?}",
        p.errors
    );
    assert!(
        p.errors.iter().any(|e| e.to_string().contains("ext4")),
        "{:?}",
        p.errors
    );
    assert!(
        p.errors.iter().any(|e| e.to_string().contains("tmpfs")),
        "{:?}",
        p.errors
    );
    for d in [e.path(), t.path()] {
        for i in 0..3 {
            assert_eq!(
                fs::read(d.join(format!("copy{i:03}"))).unwrap(),
                data(64 << 10, 5)
            );
        }
    }
}

/// Sizes from 1 byte to 4 KiB: on XFS each copy holds a block of its own,
/// and the default settings reclaim every one of them: the free space,
/// measured here, grows by a block per target, as the plan (from the
/// extent maps) expects and the report (measured) says.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_small_files_from_one_byte_are_deduplicated_and_measured_back() {
    let _serial = serial();
    let d = testfs!(Xfs);
    let dir = d.path();
    let sizes = [1usize, 100, 1000, 2047, 4095, 4096];
    let mut groups = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let sub = dir.join(format!("s{size}"));
        fs::create_dir(&sub).unwrap();
        groups.push(copies(&sub, 40, size, 10 + i as u64));
    }
    let p = plan_of(&[dir]);
    assert_eq!(p.groups.len(), sizes.len(), "{:?}", p.errors);
    assert_eq!(p.targets(), 39 * sizes.len() as u64);
    let free = || {
        let f = fs::File::open(dir).unwrap();
        rustix::fs::syncfs(&f).unwrap();
        let s = rustix::fs::fstatfs(&f).unwrap();
        s.f_bavail * s.f_frsize as u64
    };
    let before = free();
    let r = execute(&p, &DedupeOptions::default());
    let gained = free().saturating_sub(before);
    assert!(r.errors.is_empty() && r.changed.is_empty(), "{r:?}");
    assert_eq!(r.targets_deduped, 39 * sizes.len() as u64);
    // One 4 KiB block back per target: expected exactly from the extent
    // maps, and measured (allowing for metadata).
    let expected = 39 * sizes.len() as u64 * 4096;
    assert_eq!(p.reclaimable(), expected);
    assert!(r.measured);
    assert!(
        r.bytes_reclaimed >= expected * 9 / 10,
        "reported {} back, expected {expected}",
        r.bytes_reclaimed
    );
    assert!(
        gained >= expected * 9 / 10,
        "free space grew by {gained}, expected {expected}"
    );
    for (g, &size) in groups.iter().zip(&sizes) {
        for f in &g[1..] {
            assert!(same_blocks(&g[0], f), "{} not shared", f.display());
            assert_eq!(fs::read(f).unwrap().len(), size);
        }
    }
}

/// On Btrfs small files live inline in metadata: they are reported as not
/// shareable, never counted as reclaimed; larger ones still dedupe.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_inline_files_are_reported_not_claimed() {
    let _serial = serial();
    let d = testfs!(Btrfs);
    let dir = d.path();
    let small = copies(&dir.join("x").tap_mkdir(), 5, 100, 30);
    // Above Btrfs's default max_inline (2 KiB): small, but in a block.
    let mid = copies(&dir.join("z").tap_mkdir(), 3, 3000, 32);
    let big = copies(&dir.join("y").tap_mkdir(), 3, 64 * 1024, 31);
    assert!(
        extents(&small[0])
            .unwrap()
            .extents
            .iter()
            .any(|x| x.is_inline()),
        "a 100-byte file is inline on this Btrfs"
    );
    assert!(!extents(&mid[0])
        .unwrap()
        .extents
        .iter()
        .any(|x| x.is_inline()));
    // Inline files are counted apart from the candidates: a second name
    // of one is a hard link, and one of a size no other file has is not
    // counted as a shareless duplicate.
    fs::hard_link(&small[0], dir.join("x/link")).unwrap();
    write_file(&dir.join("x/lone"), &data(77, 33));
    let p = plan_of(&[dir]);
    assert_eq!(p.inline_skipped, 5, "{p:?}");
    assert_eq!(p.hardlinks_skipped, 1, "{p:?}");
    assert_eq!(p.files_scanned, 5 + 1 + 1 + 3 + 3, "{p:?}");
    assert_eq!(p.candidates, 5 + 1 + 3 + 3, "{p:?}");
    let sizes: Vec<(u64, usize)> = p.groups.iter().map(|g| (g.size, g.targets.len())).collect();
    assert_eq!(sizes, [(65536, 2), (3000, 2)], "{p:?}");
    let r = execute(&p, &DedupeOptions::default());
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(r.targets_deduped, 4);
    assert!(same_blocks(&big[0], &big[2]));
    assert!(same_blocks(&mid[0], &mid[2]));
}

trait MkDir {
    fn tap_mkdir(self) -> PathBuf;
}

impl MkDir for PathBuf {
    fn tap_mkdir(self) -> PathBuf {
        fs::create_dir_all(&self).unwrap();
        self
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_cancel_mid_execute_stops_between_groups_and_loses_nothing() {
    let _g = serial();
    let x = testfs!(Xfs);
    // 300 groups of 2 identical 64 KiB files each, one thread, and a
    // watcher that cancels as soon as the first group is done.
    let mut pairs = Vec::new();
    for i in 0..300 {
        let bytes = data(64 << 10, 1000 + i);
        let (a, b) = (
            x.path().join(format!("a{i:03}")),
            x.path().join(format!("b{i:03}")),
        );
        write_file(&a, &bytes);
        write_file(&b, &bytes);
        pairs.push((a, b, bytes));
    }
    sync(x.path());
    let progress = std::sync::Arc::new(cowlink::Progress::new());
    let opts = DedupeOptions {
        run: cowlink::Run::default()
            .with_threads(1)
            .with_progress(progress.clone()),
        ..Default::default()
    };
    let p = plan(&[x.path()], &opts).unwrap();
    assert_eq!(p.groups.len(), 300);
    let cancel = opts.run.cancel.clone();
    let watcher = std::thread::spawn(move || {
        while progress.phase() != cowlink::Phase::Dedupe || progress.snapshot().files_done == 0 {
            std::thread::yield_now();
        }
        cancel.cancel();
    });
    let r = execute(&p, &opts);
    watcher.join().unwrap();
    assert!(r.cancelled);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(
        r.targets_deduped >= 1 && r.targets_deduped < 300,
        "{} targets: the cancel did not land mid-run",
        r.targets_deduped
    );
    // Every file keeps its bytes; exactly the groups reported done share.
    let mut shared = 0;
    for (a, b, bytes) in &pairs {
        assert_eq!(&fs::read(a).unwrap(), bytes);
        assert_eq!(&fs::read(b).unwrap(), bytes);
        shared += same_blocks(a, b) as u64;
    }
    assert_eq!(shared, r.targets_deduped);
}

/// Small and large groups, and a near-duplicate of a large file whose ends
/// match (only the full hash tells it apart), under `dir`.
fn mixed(dir: &Path, sizes: &[usize]) -> Vec<Vec<PathBuf>> {
    let mut groups = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let sub = dir.join(format!("s{size}"));
        fs::create_dir(&sub).unwrap();
        groups.push(copies(&sub, 3, size, 50 + i as u64));
    }
    let near = dir.join("near");
    fs::create_dir(&near).unwrap();
    let mut bytes = data(256 << 10, 99);
    write_file(&near.join("a"), &bytes);
    write_file(&near.join("b"), &bytes);
    // c and d: the same size and the same first and last 4 KiB as a and
    // b, one byte different in the middle.
    bytes[100 << 10] ^= 1;
    write_file(&near.join("c"), &bytes);
    write_file(&near.join("d"), &bytes);
    sync(dir);
    groups.push(vec![near.join("a"), near.join("b")]);
    groups.push(vec![near.join("c"), near.join("d")]);
    groups
}

/// `dedupe` (planning and executing overlapped: the small files' groups run
/// while the larger files are read) returns the groups `plan` gives and
/// shares every target of both kinds, with the space measured back. Files
/// over two edges are grouped on their edges and left to the kernel's
/// comparison: the near duplicates (same edges, a different middle) are
/// found different, hashed whole and grouped again, not reported changed.
fn overlapped_dedupe_matches_plan_then_execute(dir: &Path, sizes: &[usize]) {
    let groups = mixed(dir, sizes);
    let planned = plan_of(&[dir]);
    assert!(planned.groups.iter().all(|g| g.blake3.is_some()));
    let (p, r) = dedupe(&[dir], &DedupeOptions::default()).unwrap();
    let unhashed = |gs: &[cowlink::dedupe::DedupeGroup]| -> Vec<cowlink::dedupe::DedupeGroup> {
        gs.iter()
            .map(|g| cowlink::dedupe::DedupeGroup {
                blake3: None,
                ..g.clone()
            })
            .collect()
    };
    assert_eq!(unhashed(&p.groups), unhashed(&planned.groups));
    assert_eq!(p.groups.len(), groups.len(), "{p:?}");
    let near = dir.join("near");
    for g in &p.groups {
        // Small files were read whole anyway; larger ones only at their
        // edges, except the near duplicates hashed whole once regrouped.
        let whole = g.size <= 8192 || g.source == near.join("c");
        assert_eq!(g.blake3.is_some(), whole, "{g:?}");
    }
    assert!(
        p.errors.is_empty() && r.errors.is_empty() && r.changed.is_empty(),
        "{r:?}"
    );
    assert_eq!(r.regrouped, 2, "c and d differ from a");
    assert!(!r.cancelled);
    assert_eq!(r.targets_deduped, p.targets());
    // a, b, c and d ran as one group on their edges, then c and d again.
    assert_eq!(r.groups, groups.len() as u64);
    let expected: u64 = p.reclaimable();
    assert!(
        r.bytes_reclaimed >= expected * 9 / 10,
        "reclaimed {} of {expected}",
        r.bytes_reclaimed
    );
    for g in &groups {
        let want = fs::read(&g[0]).unwrap();
        for f in &g[1..] {
            assert!(same_blocks(&g[0], f), "{} not shared", f.display());
            assert_eq!(fs::read(f).unwrap(), want);
        }
    }
    assert!(!same_blocks(&near.join("a"), &near.join("c")));
    assert_ne!(
        fs::read(near.join("a")).unwrap(),
        fs::read(near.join("c")).unwrap()
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_overlapped_dedupe_matches_plan_then_execute() {
    let _serial = serial();
    let d = testfs!(Xfs);
    overlapped_dedupe_matches_plan_then_execute(d.path(), &[1, 4096, 8192, 8193, 3 << 20]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_overlapped_dedupe_matches_plan_then_execute() {
    let _serial = serial();
    let d = testfs!(Btrfs);
    // Above Btrfs's inline limit, so every group has blocks to share.
    overlapped_dedupe_matches_plan_then_execute(d.path(), &[4096, 8192, 8193, 3 << 20]);
}

/// `dedupe` without `keep_groups` (what the command line runs unless it
/// prints the groups): the groups are handed over in batches and dropped
/// once carried out. It shares exactly what `plan` finds, over more
/// groups than one batch holds and with near duplicates grouped again,
/// counts the groups it found, and returns none.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_dedupe_that_keeps_no_groups_shares_what_the_plan_finds() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let dir = x.path();
    let mut groups = mixed(&dir.join("mixed").tap_mkdir(), &[1, 8192, 8193, 3 << 20]);
    // More groups than a batch: 2,500 pairs of small files, and 300
    // pairs of larger ones (hashed at their edges after the walk).
    let many = dir.join("many").tap_mkdir();
    for i in 0..2800u64 {
        let bytes = data(if i < 2500 { 100 } else { 12 << 10 }, 1000 + i);
        let pair = vec![many.join(format!("{i}a")), many.join(format!("{i}b"))];
        for p in &pair {
            write_file(p, &bytes);
        }
        groups.push(pair);
    }
    sync(dir);
    let planned = plan_of(&[dir]);
    assert_eq!(planned.groups_found, planned.groups.len() as u64);
    assert_eq!(planned.groups.len(), groups.len());
    let opts = DedupeOptions {
        keep_groups: false,
        ..Default::default()
    };
    let (p, r) = dedupe(&[dir], &opts).unwrap();
    assert!(p.groups.is_empty(), "{:?}", p.groups.len());
    // The near duplicates' group of four counts, and so does the group
    // the two that differ were planned again into.
    assert_eq!(p.groups_found, groups.len() as u64);
    assert!(
        p.errors.is_empty() && r.errors.is_empty() && r.changed.is_empty(),
        "{r:?}"
    );
    assert_eq!(r.regrouped, 2, "c and d differ from a");
    assert_eq!(r.targets_deduped, planned.targets());
    for g in &groups {
        let want = fs::read(&g[0]).unwrap();
        for f in &g[1..] {
            assert!(same_blocks(&g[0], f), "{} not shared", f.display());
            assert_eq!(fs::read(f).unwrap(), want);
        }
    }
    let near = dir.join("mixed/near");
    assert!(!same_blocks(&near.join("a"), &near.join("c")));
}

/// A cancel while the executor shares the first batches and the planner,
/// without `keep_groups`, waits to hand over the next: the run stops
/// promptly, every byte stays as it was, the report says cancelled, and
/// what it counts as shared is exactly what shares.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_cancel_while_the_planner_waits_for_the_executor_stops_promptly() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let dir = x.path().join("waits").tap_mkdir();
    // Three batches of small groups.
    let pairs: Vec<(PathBuf, PathBuf, Vec<u8>)> = (0..6_000u64)
        .map(|i| {
            let bytes = data(64, 5000 + i);
            let (a, b) = (dir.join(format!("{i}a")), dir.join(format!("{i}b")));
            write_file(&a, &bytes);
            write_file(&b, &bytes);
            (a, b, bytes)
        })
        .collect();
    sync(&dir);
    let opts = DedupeOptions {
        keep_groups: false,
        run: cowlink::Run::default().with_threads(1),
        ..Default::default()
    };
    let cancel = opts.run.cancel.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let probe = &pairs[..300];
        // Cancel once anything shares: the executor is at work, the
        // planner a batch or two ahead of it.
        s.spawn(move || loop {
            if probe.iter().any(|(a, b, _)| same_blocks(a, b)) {
                cancel.cancel();
                return;
            }
            if rx.try_recv().is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        });
        let (p, r) = dedupe(&[&dir], &opts).unwrap();
        let _ = tx.send(());
        assert!(r.cancelled, "{r:?}");
        assert!(p.groups.is_empty());
        assert!(r.errors.is_empty() && r.changed.is_empty(), "{r:?}");
        let shared = pairs.iter().filter(|(a, b, _)| same_blocks(a, b)).count() as u64;
        assert_eq!(shared, r.targets_deduped);
        assert!(
            shared < pairs.len() as u64,
            "the cancel came after the last group"
        );
        for (a, b, bytes) in &pairs {
            assert_eq!(&fs::read(a).unwrap(), bytes);
            assert_eq!(&fs::read(b).unwrap(), bytes);
        }
    });
}

/// A cancel while the large files are still being hashed, with the
/// plan's groups kept and without (`keep_groups`): the small files' group
/// handed over by then may be done (and share), the large ones were never
/// handed over and stay apart, every byte stays as it was, the report says
/// cancelled rather than failing, and the plan counts the group handed
/// over either way.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_cancel_while_hashing_leaves_the_large_groups_untouched() {
    let _serial = serial();
    let x = testfs!(Xfs);
    for keep_groups in [true, false] {
        let dir = &x.path().join(format!("keep-{keep_groups}")).tap_mkdir();
        let small = copies(&dir.join("small").tap_mkdir(), 20, 2000, 70);
        // Enough larger files that one thread is still reading their
        // edges when the watcher sees the phase change: 2,000 pairs of 12
        // KiB (over two edges, so grouped after the walk).
        let ldir = dir.join("large").tap_mkdir();
        let large: Vec<Vec<PathBuf>> = (0..2000u64)
            .map(|i| {
                let bytes = data(12 << 10, 200 + i);
                let pair = vec![ldir.join(format!("{i}a")), ldir.join(format!("{i}b"))];
                for p in &pair {
                    write_file(p, &bytes);
                }
                pair
            })
            .collect();
        sync(dir);
        let progress = std::sync::Arc::new(cowlink::Progress::new());
        let opts = DedupeOptions {
            run: cowlink::Run::default()
                .with_threads(1)
                .with_progress(progress.clone()),
            keep_groups,
            ..Default::default()
        };
        let cancel = opts.run.cancel.clone();
        let watcher = std::thread::spawn(move || {
            while progress.phase() != cowlink::Phase::Hash {
                std::thread::yield_now();
            }
            cancel.cancel();
        });
        let (p, r) = dedupe(&[dir], &opts).unwrap();
        watcher.join().unwrap();
        assert!(r.cancelled);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // Only the small group was handed over before the cancel; on a
        // loaded machine the watcher may see the phase change only once
        // planning is over, and then every group was handed over: each
        // large pair shares or not as the report counts it. The small
        // group is handed over before anything looks at the cancel:
        // found, whether or not the executor ran it.
        let late = p.groups_found == 1 + large.len() as u64;
        assert!(late || p.groups_found == 1, "{}", p.groups_found);
        if keep_groups {
            assert_eq!(p.groups.len() as u64, p.groups_found);
            assert!(late || p.groups.iter().all(|g| g.size == 2000));
        }
        for pair in &large {
            assert!(
                late || !same_blocks(&pair[0], &pair[1]),
                "{}",
                pair[1].display()
            );
            assert_eq!(fs::read(&pair[0]).unwrap(), fs::read(&pair[1]).unwrap());
        }
        let shared = small[1..]
            .iter()
            .filter(|f| same_blocks(&small[0], f))
            .count() as u64
            + large
                .iter()
                .filter(|pair| same_blocks(&pair[0], &pair[1]))
                .count() as u64;
        assert_eq!(shared, r.targets_deduped, "keep_groups {keep_groups}");
        for f in &small {
            assert_eq!(fs::read(f).unwrap(), data(2000, 70));
        }
    }
}

/// A saved plan whose group was formed on the file edges alone (`blake3`
/// absent, as `dedupe` reports it): `execute` lets the kernel confirm each
/// target, and regroups by a whole-file hash those whose middle differs,
/// instead of calling them changed.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn execute_regroups_targets_of_an_edge_only_group_that_differ() {
    let _serial = serial();
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    for d in [x.path(), b.path()] {
        let mut bytes = data(256 << 10, 8);
        for n in ["a", "b"] {
            write_file(&d.join(n), &bytes);
        }
        bytes[128 << 10] ^= 1;
        for n in ["c", "d"] {
            write_file(&d.join(n), &bytes);
        }
        sync(d);
        // Made by hand, the plan names its files by their stamps too.
        let stamp = |n: &str| FileStamp::of_path(&d.join(n)).unwrap().to_string();
        let text = format!(
            r#"{{"groups": [{{"size": {}, "source": "{}", "targets": ["{}", "{}", "{}"], "reclaimable": 0,
                "source_stamp": "{}", "target_stamps": ["{}", "{}", "{}"]}}],
                "files_scanned": 4, "candidates": 4, "bytes_hashed": 0,
                "groups_already_shared": 0, "files_already_shared": 0, "hardlinks_skipped": 0}}"#,
            256 << 10,
            d.join("a").display(),
            d.join("b").display(),
            d.join("c").display(),
            d.join("d").display(),
            stamp("a"),
            stamp("b"),
            stamp("c"),
            stamp("d"),
        );
        let p: DedupePlan = serde_json::from_str(&text).unwrap();
        assert_eq!(p.groups[0].blake3, None);
        let r = execute(&p, &DedupeOptions::default());
        assert!(r.errors.is_empty() && r.changed.is_empty(), "{r:?}");
        assert_eq!(r.regrouped, 2, "{r:?}");
        assert_eq!(r.targets_deduped, 2, "b on a, then d on c");
        assert!(same_blocks(&d.join("a"), &d.join("b")));
        assert!(same_blocks(&d.join("c"), &d.join("d")));
        assert!(!same_blocks(&d.join("a"), &d.join("c")));
        assert_eq!(fs::read(d.join("d")).unwrap(), bytes);
        assert_ne!(fs::read(d.join("a")).unwrap(), bytes);
    }
}

/// A path given that is a symbolic link to a directory is walked as that
/// directory (as `link/` is); a link to a file or to nothing, or a FIFO,
/// is an error naming it, and the other paths are still deduplicated.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn given_links_to_directories_are_walked_and_other_odd_paths_are_named() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let d = x.path();
    let real = d.join("real");
    fs::create_dir(&real).unwrap();
    let files = copies(&real, 3, 64 << 10, 21);
    std::os::unix::fs::symlink("real", d.join("link")).unwrap();
    std::os::unix::fs::symlink("real/copy000", d.join("to-file")).unwrap();
    std::os::unix::fs::symlink("gone", d.join("dangling")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        d.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();

    // The link alone: the directory's files, under the link's name.
    let p = plan_of(&[&d.join("link")]);
    assert_eq!(p.files_scanned, 3, "{p:#?}");
    assert_eq!(p.groups.len(), 1);
    assert!(p.groups[0].source.starts_with(d.join("link")), "{p:#?}");
    assert!(p.errors.is_empty(), "{:?}", p.errors);

    // Odd paths alone: the first one's error, typed, naming it.
    for (name, kind) in [
        ("to-file", ErrorKind::InvalidInput),
        ("dangling", ErrorKind::NotFound),
        ("fifo", ErrorKind::InvalidInput),
    ] {
        let e = plan(&[d.join(name)], &DedupeOptions::default()).unwrap_err();
        assert_eq!(e.kind(), kind, "{name}: {e}");
        assert_eq!(e.src(), Some(d.join(name).as_path()), "{name}: {e}");
    }

    // With a good path: it is deduplicated, the others reported.
    let paths = [
        d.join("dangling"),
        d.join("link"),
        d.join("fifo"),
        d.join("to-file"),
    ];
    let (p, r) = dedupe(&paths, &DedupeOptions::default()).unwrap();
    let named: Vec<_> = p.errors.iter().filter_map(|e| e.src()).collect();
    assert_eq!(named.len(), 3, "{:?}", p.errors);
    for n in ["dangling", "fifo", "to-file"] {
        assert!(
            named.contains(&d.join(n).as_path()),
            "{n} not named: {:?}",
            p.errors
        );
    }
    assert_eq!(r.targets_deduped, 2);
    assert!(same_blocks(&files[0], &files[1]) && same_blocks(&files[0], &files[2]));
}
