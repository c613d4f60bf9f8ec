//! Block-level updates (`cowlink::delta`) on real filesystems: the new
//! version equals the source byte for byte, shares every unchanged block
//! with the old version (FIEMAP), the old version (kept as an earlier
//! snapshot's clone) is never written, and failures leave the old name
//! and no temporary.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use cowlink::delta::{update_file, BlockRecord, DeltaMethod, DeltaOptions, DeltaReport};
use cowlink::extents::extents;
use cowlink::{clone_file, CloneOptions, ErrorKind, Preserve};
use cowlink_testfs::{data, names, temporaries, testfs, write_file};

const BLOCK: u64 = 4096;

/// Bytes of `p` in extents no other file shares (FIEMAP, synced).
fn exclusive(p: &Path) -> u64 {
    let l = extents(p).unwrap();
    l.mapped_bytes - l.shared_bytes
}

fn update(src: &Path, dst: &Path, record: Option<&BlockRecord>) -> (DeltaReport, BlockRecord) {
    let opts = DeltaOptions {
        record,
        ..Default::default()
    };
    update_file(src, dst, &opts, Preserve::ALL).unwrap()
}

/// Overwrite `n` distinct random full blocks of `p` (never its last,
/// possibly short, block) with new random bytes; returns their indices.
fn change_blocks(p: &Path, n: usize, rng: &mut fastrand::Rng) -> Vec<u64> {
    let size = fs::metadata(p).unwrap().len();
    let full = size / BLOCK;
    let mut picked = std::collections::BTreeSet::new();
    while picked.len() < n {
        picked.insert(rng.u64(0..full));
    }
    let f = fs::OpenOptions::new().write(true).open(p).unwrap();
    for &i in &picked {
        f.write_all_at(&data(BLOCK as usize, rng.u64(..)), i * BLOCK)
            .unwrap();
    }
    f.sync_all().unwrap();
    picked.into_iter().collect()
}

/// The scenario of the sync issue, scaled down: a file on ext4 with 1% of
/// its blocks changed, updated into its copy on `dst_dir` (another
/// filesystem) while a clone of the old copy stands for an earlier
/// snapshot. Then again with the first update's record.
fn one_percent(src_dir: &Path, dst_dir: &Path) {
    let size: u64 = (32 << 20) + 1234;
    let blocks = size.div_ceil(BLOCK);
    let (src, dst, snap) = (src_dir.join("f"), dst_dir.join("f"), dst_dir.join("snap"));
    write_file(&src, &data(size as usize, 1));
    fs::copy(&src, &dst).unwrap();
    fs::File::open(&dst).unwrap().sync_all().unwrap();
    clone_file(&dst, &snap, &CloneOptions::default()).unwrap();
    let before = fs::read(&snap).unwrap();
    let snap_ino = fs::metadata(&snap).unwrap().ino();
    let old_ino = fs::metadata(&dst).unwrap().ino();

    let mut rng = fastrand::Rng::with_seed(48);
    let n = (blocks / 100) as usize;
    change_blocks(&src, n, &mut rng);
    let (r, rec) = update(&src, &dst, None);
    assert_eq!(r.method, DeltaMethod::CloneAndPatch);
    assert_eq!(r.block_size, BLOCK);
    assert_eq!((r.blocks, r.blocks_written), (blocks, n as u64), "{r:?}");
    assert_eq!(r.blocks_reused, blocks - n as u64);
    assert_eq!(r.bytes_written, n as u64 * BLOCK);
    assert_eq!((r.bytes_compared, r.bytes_read_old), (size, size));
    assert!(!r.record_used);

    assert!(fs::read(&dst).unwrap() == fs::read(&src).unwrap());
    assert!(
        fs::read(&snap).unwrap() == before,
        "the old version was written"
    );
    assert_eq!(fs::metadata(&snap).unwrap().ino(), snap_ino);
    assert_ne!(
        fs::metadata(&dst).unwrap().ino(),
        old_ino,
        "not a new inode"
    );
    let excl = exclusive(&dst);
    assert!(
        excl <= size / 50 && excl >= n as u64 * BLOCK,
        "new version's exclusive bytes: {excl} of {size}"
    );
    let (sm, dm) = (fs::metadata(&src).unwrap(), fs::metadata(&dst).unwrap());
    assert_eq!((dm.mtime(), dm.mtime_nsec()), (sm.mtime(), sm.mtime_nsec()));
    assert!(rec.is_current_for(&rustix::fs::stat(&dst).unwrap()));
    assert_eq!(names(dst_dir), ["f", "snap"]);

    // Again, with the record: the old version is not read at all.
    let second = change_blocks(&src, n, &mut rng);
    let (r2, _) = update(&src, &dst, Some(&rec));
    assert!(r2.record_used, "{r2:?}");
    assert_eq!(r2.bytes_read_old, 0);
    assert_eq!(r2.blocks_written, second.len() as u64);
    assert!(fs::read(&dst).unwrap() == fs::read(&src).unwrap());
    assert!(fs::read(&snap).unwrap() == before);
    let excl = exclusive(&dst);
    assert!(excl <= 2 * n as u64 * BLOCK, "{excl}");
    assert_eq!(names(dst_dir), ["f", "snap"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn one_percent_changed_on_ext4_shares_the_rest_on_xfs() {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    one_percent(e.path(), x.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn one_percent_changed_on_ext4_shares_the_rest_on_btrfs() {
    let (e, b) = (testfs!(Ext4), testfs!(Btrfs));
    one_percent(e.path(), b.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sizes_grow_shrink_and_empty_files_update_exactly() {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let old = data(100_000, 1);
    let grown = [&old[..], &data(200_000, 2)].concat();
    let cases: [(&str, Vec<u8>, Vec<u8>, u64); 6] = [
        // (case, old, new, blocks kept at least)
        ("grow", old.clone(), grown, 100_000 / BLOCK),
        ("shrink unaligned", old.clone(), old[..5000].to_vec(), 1),
        ("shrink aligned", old.clone(), old[..8192].to_vec(), 2),
        ("to empty", old.clone(), Vec::new(), 0),
        ("from empty", Vec::new(), data(9000, 3), 0),
        (
            "unchanged",
            old.clone(),
            old.clone(),
            100_000_u64.div_ceil(BLOCK),
        ),
    ];
    for (case, before, after, kept) in cases {
        let (src, dst, snap) = (
            e.path().join(case),
            x.path().join(case),
            x.path().join("snap"),
        );
        write_file(&src, &after);
        write_file(&dst, &before);
        let _ = fs::remove_file(&snap);
        clone_file(&dst, &snap, &CloneOptions::default()).unwrap();
        let (r, _) = update(&src, &dst, None);
        assert!(fs::read(&dst).unwrap() == after, "{case}");
        assert!(
            fs::read(&snap).unwrap() == before,
            "{case}: old version written"
        );
        assert_eq!(r.size, after.len() as u64, "{case}");
        assert!(r.blocks_reused >= kept, "{case}: {r:?}");
        assert_eq!(
            r.blocks_reused + r.blocks_written + r.blocks_punched,
            r.blocks,
            "{case}"
        );
        if case == "unchanged" {
            assert_eq!(r.bytes_written, 0);
            assert_eq!(exclusive(&dst), 0, "an unchanged file shares everything");
        }
        if case == "grow" {
            // Block 24 holds the old tail and new bytes: rewritten.
            assert_eq!(r.bytes_written, 300_000 - 24 * BLOCK);
        }
        assert!(temporaries(x.path()).is_empty(), "{case}");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sparse_sources_keep_their_holes() {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let size = 8u64 << 20;
    let (src, dst) = (e.path().join("s"), x.path().join("d"));
    {
        let f = fs::File::create(&src).unwrap();
        f.write_all_at(&data(64 << 10, 1), 0).unwrap();
        f.write_all_at(&data(100 << 10, 2), 4 << 20).unwrap();
        f.set_len(size).unwrap();
        f.sync_all().unwrap();
    }
    // The old version is dense: its data where the source has holes goes.
    write_file(&dst, &data(size as usize, 3));
    let (r, rec) = update(&src, &dst, None);
    assert!(fs::read(&dst).unwrap() == fs::read(&src).unwrap());
    assert!(r.blocks_punched > 0, "{r:?}");
    let l = extents(&dst).unwrap();
    assert!(
        l.hole_bytes >= size - (200 << 10),
        "holes: {} of {size}",
        l.hole_bytes
    );
    assert!(fs::metadata(&dst).unwrap().blocks() * 512 <= 512 << 10);
    // The record of the new version hashes its holes as zeros.
    let d = fs::File::open(&dst).unwrap();
    assert_eq!(
        BlockRecord::of_file(d.as_fd(), BLOCK).unwrap().hashes(),
        rec.hashes()
    );
    // A source with a trailing hole, onto that sparse old version: holes
    // where the old one had them stay holes without being punched again.
    {
        let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
        f.write_all_at(&data(4096, 4), 1 << 20).unwrap();
        f.set_len(size + (1 << 20)).unwrap();
    }
    let (r, _) = update(&src, &dst, Some(&rec));
    assert!(r.record_used);
    assert!(fs::read(&dst).unwrap() == fs::read(&src).unwrap());
    assert_eq!((r.blocks_written, r.blocks_punched), (1, 0), "{r:?}");
    assert!(temporaries(x.path()).is_empty());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn enospc_mid_update_leaves_the_old_name_and_no_temporary() {
    let (e, t) = (testfs!(Ext4), testfs!(TinyXfs));
    let (src, dst) = (e.path().join("s"), t.path().join("d"));
    let old = data(16 << 20, 1);
    write_file(&dst, &old);
    // Every block differs: the update needs 16 MiB of new space.
    write_file(&src, &data(16 << 20, 2));
    let st = rustix::fs::statvfs(t.path()).unwrap();
    let free = st.f_bavail * st.f_frsize;
    let filler = t.path().join("filler");
    {
        // Another test filling the same tiny filesystem may have left
        // less than 4 MiB already.
        let f = fs::File::create(&filler).unwrap();
        if free > 4 << 20 {
            let flags = rustix::fs::FallocateFlags::empty();
            rustix::fs::fallocate(&f, flags, 0, free - (4 << 20)).unwrap();
        }
        f.sync_all().unwrap();
    }
    let ino = fs::metadata(&dst).unwrap().ino();
    let e = update_file(&src, &dst, &DeltaOptions::default(), Preserve::ALL).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains(&*dst.to_string_lossy()), "{e}");
    assert!(fs::read(&dst).unwrap() == old);
    assert_eq!(fs::metadata(&dst).unwrap().ino(), ino);
    assert_eq!(names(t.path()), ["d", "filler"]);
    fs::remove_file(filler).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_source_that_changes_while_read_links_nothing() {
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let (src, dst) = (e.path().join("s"), x.path().join("d"));
    let old = data(4 << 20, 1);
    write_file(&dst, &old);
    // Grows after the first chunk (the stat after the pass tells), or
    // shrinks before the second (reading it ends early).
    for grow in [true, false] {
        write_file(&src, &data(4 << 20, 2));
        let f = fs::OpenOptions::new().write(true).open(&src).unwrap();
        let calls = std::cell::Cell::new(0);
        let meddle = || {
            calls.set(calls.get() + 1);
            if calls.get() == 2 {
                if grow {
                    f.write_all_at(b"more", 4 << 20).unwrap();
                } else {
                    f.set_len(1 << 20).unwrap();
                }
            }
            false
        };
        let opts = DeltaOptions {
            cancelled: Some(&meddle),
            ..Default::default()
        };
        let e = update_file(&src, &dst, &opts, Preserve::ALL).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ContentChanged, "grow {grow}: {e}");
        assert!(fs::read(&dst).unwrap() == old);
        assert_eq!(names(x.path()), ["d"]);
    }
    // The old version written to while it is compared: refused too, and
    // the name keeps what the writer made of it.
    write_file(&src, &data(4 << 20, 3));
    let writer = fs::OpenOptions::new().write(true).open(&dst).unwrap();
    let calls = std::cell::Cell::new(0);
    let meddle = || {
        calls.set(calls.get() + 1);
        if calls.get() == 2 {
            // Appended: its size tells, whatever the clock's granularity.
            writer.write_all_at(b"late", 4 << 20).unwrap();
        }
        false
    };
    let opts = DeltaOptions {
        cancelled: Some(&meddle),
        ..Default::default()
    };
    let e = update_file(&src, &dst, &opts, Preserve::ALL).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");
    assert!(e.reason().contains("old version"), "{e}");
    let mut old = old;
    old.extend_from_slice(b"late");
    assert!(fs::read(&dst).unwrap() == old);
    assert_eq!(names(x.path()), ["d"]);
    // A cancel: the same, with its own kind.
    let stop = || true;
    let opts = DeltaOptions {
        cancelled: Some(&stop),
        ..Default::default()
    };
    let e = update_file(&src, &dst, &opts, Preserve::ALL).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    assert!(fs::read(&dst).unwrap() == old);
    assert_eq!(names(x.path()), ["d"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn without_reflink_the_new_version_is_a_full_copy() {
    let (x, e) = (testfs!(Xfs), testfs!(Ext4));
    let (src, dst) = (x.path().join("s"), e.path().join("d"));
    write_file(&dst, &data(1 << 20, 1));
    let mut new = data(1 << 20, 1);
    new[5000] ^= 1;
    new.extend_from_slice(b"tail");
    write_file(&src, &new);
    let d = fs::File::open(&dst).unwrap();
    let rec = BlockRecord::of_file(d.as_fd(), BLOCK).unwrap();
    drop(d);
    let (r, _) = update(&src, &dst, Some(&rec));
    assert_eq!(r.method, DeltaMethod::FullCopy);
    assert!(!r.record_used && r.record_ignored.is_some(), "{r:?}");
    assert_eq!(r.bytes_written, new.len() as u64);
    assert!(fs::read(&dst).unwrap() == new);
    assert_eq!(names(e.path()), ["d"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_stale_record_is_not_trusted() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("s"), x.path().join("d"));
    write_file(&src, &data(256 << 10, 1));
    write_file(&dst, &data(256 << 10, 2));
    let (_, rec) = update(&src, &dst, None);
    // Someone writes the destination afterwards, and puts its times back:
    // only the change time tells (distinct from the one the record took,
    // even within a clock tick: the kernel's multigrain timestamps give a
    // change after a stat a fine-grained time).
    let before = fs::metadata(&dst).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&dst)
        .unwrap()
        .write_all_at(b"scribble", 8192)
        .unwrap();
    let times = fs::FileTimes::new()
        .set_accessed(before.accessed().unwrap())
        .set_modified(before.modified().unwrap());
    fs::File::options()
        .write(true)
        .open(&dst)
        .unwrap()
        .set_times(times)
        .unwrap();
    let (r, _) = update(&src, &dst, Some(&rec));
    assert!(!r.record_used, "{r:?}");
    assert!(r
        .record_ignored
        .as_deref()
        .unwrap()
        .contains("another version"));
    assert_eq!(r.blocks_written, 1);
    assert!(fs::read(&dst).unwrap() == fs::read(&src).unwrap());
}

/// Random files (to 3 MB) and random edits, chained: each round's result is the
/// next round's old version, with the record it returned half the time,
/// at a random block size otherwise. Every time the new version equals
/// the source, its record equals one made by reading it, and the counts
/// add up. The seed is in the failure message.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn random_files_and_edits_update_to_the_source_byte_for_byte() {
    let x = testfs!(Xfs);
    let seed = std::env::var("DELTA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let (src, dst) = (x.path().join("s"), x.path().join("d"));
    // Up to 3 MB: several of the update's 1 MiB chunks, so runs of blocks
    // and holes cross chunk boundaries.
    let mut content = data(rng.usize(0..3_000_000), rng.u64(..));
    write_file(&dst, &content);
    let mut record: Option<BlockRecord> = None;
    for round in 0..100 {
        let ctx = format!("seed {seed} round {round}");
        // Edit: overwrite ranges, truncate, extend with data or a hole,
        // punch holes.
        let _ = fs::remove_file(&src);
        let f = fs::File::create(&src).unwrap();
        f.write_all_at(&content, 0).unwrap();
        f.set_len(content.len() as u64).unwrap();
        for _ in 0..rng.usize(0..6) {
            let len = content.len();
            match rng.u8(0..5) {
                0 if len > 0 => {
                    let at = rng.usize(0..len);
                    let n = rng.usize(1..20_000).min(len - at);
                    let b = data(n, rng.u64(..));
                    content[at..at + n].copy_from_slice(&b);
                    f.write_all_at(&b, at as u64).unwrap();
                }
                1 => {
                    let n = rng.usize(0..len.max(1));
                    content.truncate(n);
                    f.set_len(n as u64).unwrap();
                }
                2 => {
                    let b = data(rng.usize(1..50_000), rng.u64(..));
                    f.write_all_at(&b, len as u64).unwrap();
                    content.extend_from_slice(&b);
                }
                3 => {
                    let n = len + rng.usize(1..1_500_000);
                    content.resize(n, 0);
                    f.set_len(n as u64).unwrap();
                }
                _ if len > 0 => {
                    let at = rng.usize(0..len);
                    let n = rng.usize(1..1_200_000).min(len - at);
                    content[at..at + n].fill(0);
                    rustix::fs::fallocate(
                        &f,
                        rustix::fs::FallocateFlags::PUNCH_HOLE
                            | rustix::fs::FallocateFlags::KEEP_SIZE,
                        at as u64,
                        n as u64,
                    )
                    .unwrap();
                }
                _ => {}
            }
        }
        drop(f);
        let use_record = rng.bool();
        let opts = DeltaOptions {
            record: record.as_ref().filter(|_| use_record),
            block_size: (!use_record).then(|| [4096, 8192, 65536][rng.usize(0..3)]),
            cancelled: None,
        };
        let (r, rec) =
            update_file(&src, &dst, &opts, Preserve::NONE).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let got = fs::read(&dst).unwrap();
        assert!(
            got == content,
            "{ctx}: {} vs {} bytes",
            got.len(),
            content.len()
        );
        assert_eq!(r.record_used, opts.record.is_some(), "{ctx}: {r:?}");
        if r.record_used {
            assert_eq!(r.bytes_read_old, 0, "{ctx}");
        }
        assert_eq!(
            r.blocks_reused + r.blocks_written + r.blocks_punched,
            r.blocks,
            "{ctx}"
        );
        assert!(r.bytes_written <= r.size, "{ctx}: {r:?}");
        let d = fs::File::open(&dst).unwrap();
        let read = BlockRecord::of_file(d.as_fd(), rec.block_size()).unwrap();
        assert_eq!(read, rec, "{ctx}: the record does not describe the result");
        record = Some(rec);
    }
    assert_eq!(names(x.path()), ["d", "s"]);
}

#[allow(dead_code)]
#[path = "../../../../fuzz/fuzz_targets/block_record_check.rs"]
mod block_record_check;

/// The `block_record` fuzz target's seed corpus (fuzz/seeds/block_record)
/// replayed on stable through the same checks the target runs, with every
/// seed also cut short and flipped byte by byte.
#[test]
fn block_record_fuzz_corpus_replay() {
    let seeds = crate::replay_corpus("block_record", block_record_check::check);
    let n = seeds.len();
    let accepted = (seeds.iter())
        .filter(|(_, b)| BlockRecord::from_bytes(b).is_ok())
        .count();
    assert!(n >= 5 && accepted >= 5, "{n} seeds, {accepted} valid");
}

/// As a snapshot set uses it: the old version is the earlier snapshot's
/// file (with its record), the new version goes to a name in the new
/// snapshot through the descriptor-level API, metadata set by the caller
/// before the commit. The earlier snapshot is only read.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_earlier_snapshot_is_the_old_version() {
    use cowlink::delta::{prepare, Target};
    let (e, x) = (testfs!(Ext4), testfs!(Xfs));
    let src = e.path().join("f");
    let (s1, s2) = (x.path().join("s1"), x.path().join("s2"));
    fs::create_dir(&s1).unwrap();
    fs::create_dir(&s2).unwrap();
    let v1 = data(3 << 20, 1);
    write_file(&s1.join("f"), &v1);
    let old = fs::File::open(s1.join("f")).unwrap();
    let rec = BlockRecord::of_file(old.as_fd(), BLOCK).unwrap();
    let mut v2 = v1.clone();
    v2[(1 << 20) + 17] ^= 0xff;
    write_file(&src, &v2);
    let srcf = fs::File::open(&src).unwrap();
    let dir = fs::File::open(&s2).unwrap();
    let shown = s2.join("f");
    let target = Target {
        dir: dir.as_fd(),
        name: Path::new("f"),
        shown: &shown,
    };
    let opts = DeltaOptions {
        record: Some(&rec),
        ..Default::default()
    };
    let pending = prepare(srcf.as_fd(), &src, old.as_fd(), target, &opts).unwrap();
    let mtime = fs::metadata(&src).unwrap().modified().unwrap();
    let new = fs::File::from(pending.fd().try_clone_to_owned().unwrap());
    new.set_modified(mtime).unwrap();
    drop(new);
    assert_eq!(
        names(&s2),
        Vec::<String>::new(),
        "visible before the commit"
    );
    let (r, rec2) = pending.commit().unwrap();
    assert!(r.record_used && r.bytes_read_old == 0, "{r:?}");
    assert_eq!(r.blocks_written, 1);
    assert!(fs::read(&shown).unwrap() == v2);
    assert_eq!(fs::metadata(&shown).unwrap().modified().unwrap(), mtime);
    assert!(fs::read(s1.join("f")).unwrap() == v1);
    assert!(rec.is_current_for(&rustix::fs::fstat(&old).unwrap()));
    assert!(rec2.is_current_for(&rustix::fs::stat(&shown).unwrap()));
    assert_eq!(exclusive(&shown), BLOCK);
}

/// What cannot be updated is refused with a typed error naming the path,
/// and leaves nothing: a symbolic link as the destination (never
/// followed), a directory as the source, a block size that is not a
/// multiple of the filesystem's or would need too many hashes.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn what_cannot_be_updated_is_refused_and_left_alone() {
    let x = testfs!(Xfs);
    let (src, dst, link) = (x.path().join("s"), x.path().join("d"), x.path().join("l"));
    write_file(&src, &data(10_000, 1));
    write_file(&dst, &data(10_000, 2));
    std::os::unix::fs::symlink(&dst, &link).unwrap();
    let opts = DeltaOptions::default();
    let e = update_file(&src, &link, &opts, Preserve::ALL).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotRegularFile, "{e}");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    let e = update_file(x.path(), &dst, &opts, Preserve::ALL).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IsDirectory, "{e}");
    for b in [2048, 12288] {
        let opts = DeltaOptions {
            block_size: Some(b),
            ..Default::default()
        };
        let e = update_file(&src, &dst, &opts, Preserve::ALL).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{b}: {e}");
    }
    // 32 GiB (sparse) in 4 KiB blocks: 8 Mi hashes, more than allowed.
    let big = x.path().join("big");
    fs::File::create(&big).unwrap().set_len(32 << 30).unwrap();
    let opts = DeltaOptions {
        block_size: Some(BLOCK),
        ..Default::default()
    };
    let e = update_file(&big, &dst, &opts, Preserve::ALL).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains(&*dst.to_string_lossy()), "{e}");
    assert!(fs::read(&dst).unwrap() == data(10_000, 2));
    assert_eq!(names(x.path()), ["big", "d", "l", "s"]);
}
