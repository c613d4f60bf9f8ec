//! What a run with an index writes at its end (the planning's hashes and
//! layouts and the layouts learnt while sharing, in one transaction, or
//! in the copy when the file is due for a rewrite), attacked with seeded
//! random trees and random operations between runs, on an index small
//! enough to be written in place and on one large enough (thousands of
//! files in a dozen directories) to be rewritten at the end of its first
//! run. Every run trusts the index wholly (`LayoutRecheck::Never`), so a
//! wrong claim (a hash, a layout, two files taken for shared) shows as a
//! pair of equal files left apart, a file not read, or a rerun that
//! writes or reads.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cowlink::dedupe::{dedupe, DedupeOptions, DedupePlan, DedupeReport, LayoutRecheck};
use cowlink::extents::extents;
use cowlink_testfs::{data, testfs};

use crate::dedupe_space::reflink;

/// A run that trusts every indexed layout while its file's identity
/// holds: what the index claims is all it knows.
fn trusting(ix: &Path) -> DedupeOptions {
    DedupeOptions {
        index: Some(ix.to_path_buf()),
        layout_recheck: LayoutRecheck::Never,
        ..DedupeOptions::default()
    }
}

fn run(root: &Path, ix: &Path, what: &str) -> (DedupePlan, DedupeReport) {
    let (p, r) = dedupe(&[root], &trusting(ix)).unwrap();
    assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
    assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
    let notes = &p.index.as_ref().expect("an index report").notes;
    assert!(notes.is_empty(), "{what}: {notes:?}");
    (p, r)
}

fn sync(dir: &Path) {
    let f = fs::File::open(dir).unwrap();
    rustix::fs::syncfs(&f).unwrap();
}

/// What each file should hold: its size and the seed of its bytes
/// ([`data`]).
type Model = HashMap<PathBuf, (usize, u64)>;

/// Sizes around one and two edges (4 KiB), none inline on Btrfs.
const SIZES: [usize; 7] = [4096, 6000, 8192, 8193, 12_288, 20_000, 65_537];

/// A content of the pool: about three files of each, in directories
/// drawn at random.
fn pick(rng: &mut fastrand::Rng, pool: &[(usize, u64)]) -> (usize, u64) {
    pool[rng.usize(..pool.len())]
}

/// `dirs` directories of `per_dir` files each, most a copy of a content
/// of a pool (about three of each), one in twenty a reflinked copy of a
/// file written before (already shared), one in ten of bytes of its own.
fn build(root: &Path, rng: &mut fastrand::Rng, dirs: usize, per_dir: usize) -> Model {
    let pool: Vec<(usize, u64)> = (0..(dirs * per_dir / 3).max(2))
        .map(|_| (SIZES[rng.usize(..SIZES.len())], rng.u64(1..1 << 40)))
        .collect();
    let mut model = Model::new();
    let mut written: Vec<PathBuf> = Vec::new();
    for d in 0..dirs {
        let dir = root.join(format!("d{d:02}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..per_dir {
            let p = dir.join(format!("f{f:04}"));
            match rng.u8(..20) {
                0 if !written.is_empty() => {
                    let from = &written[rng.usize(..written.len())];
                    reflink(from, &p);
                    let c = model[from];
                    model.insert(p.clone(), c);
                }
                1 | 2 => {
                    let c = (SIZES[rng.usize(..SIZES.len())], rng.u64(1 << 41..1 << 42));
                    fs::write(&p, data(c.0, c.1)).unwrap();
                    model.insert(p.clone(), c);
                }
                _ => {
                    let c = pick(rng, &pool);
                    fs::write(&p, data(c.0, c.1)).unwrap();
                    model.insert(p.clone(), c);
                }
            }
            written.push(p);
        }
    }
    sync(root);
    model
}

/// Random operations between runs, `n` of them: contents rewritten in
/// place under a restored mtime (only the ctime tells), files replaced
/// by a rename, new copies and reflinked copies, removals, a directory
/// renamed.
fn operate(root: &Path, rng: &mut fastrand::Rng, model: &mut Model, n: usize, round: u64) {
    for i in 0..n {
        let mut paths: Vec<PathBuf> = model.keys().cloned().collect();
        paths.sort();
        let p = paths[rng.usize(..paths.len())].clone();
        let (size, _) = model[&p];
        // Another file's content of the same size where there is one.
        let same_size: Vec<(usize, u64)> =
            model.values().copied().filter(|c| c.0 == size).collect();
        let other = |rng: &mut fastrand::Rng| match rng.bool() {
            true => same_size[rng.usize(..same_size.len())],
            false => (size, rng.u64(1 << 43..1 << 44)),
        };
        match rng.u8(..7) {
            0 => {
                let c = other(rng);
                let m = fs::metadata(&p).unwrap();
                let mut f = fs::OpenOptions::new().write(true).open(&p).unwrap();
                std::io::Write::write_all(&mut f, &data(c.0, c.1)).unwrap();
                f.set_modified(m.modified().unwrap()).unwrap();
                // Every name of the file holds the new bytes.
                let names: Vec<PathBuf> = match m.nlink() > 1 {
                    true => paths
                        .iter()
                        .filter(|q| fs::metadata(q).is_ok_and(|n| n.ino() == m.ino()))
                        .cloned()
                        .collect(),
                    false => vec![p],
                };
                for q in names {
                    model.insert(q, c);
                }
            }
            1 => {
                let c = other(rng);
                let tmp = p.with_extension("tmp");
                fs::write(&tmp, data(c.0, c.1)).unwrap();
                fs::rename(&tmp, &p).unwrap();
                model.insert(p, c);
            }
            2 => {
                let to = p.with_file_name(format!("new-{round}-{i}"));
                let c = model[&p];
                fs::write(&to, data(c.0, c.1)).unwrap();
                model.insert(to, c);
            }
            3 => {
                let dirs: Vec<PathBuf> = paths
                    .iter()
                    .filter_map(|q| q.parent())
                    .map(Path::to_path_buf)
                    .collect();
                let to = dirs[rng.usize(..dirs.len())].join(format!("ref-{round}-{i}"));
                reflink(&p, &to);
                let c = model[&p];
                model.insert(to, c);
            }
            4 if model.len() > 4 => {
                fs::remove_file(&p).unwrap();
                model.remove(&p);
            }
            5 => {
                let dir = p.parent().unwrap().to_path_buf();
                let to = root.join(format!(
                    "{}-m{round}{i}",
                    dir.file_name().unwrap().to_string_lossy()
                ));
                fs::rename(&dir, &to).unwrap();
                let moved: Vec<PathBuf> = model
                    .keys()
                    .filter(|q| q.starts_with(&dir))
                    .cloned()
                    .collect();
                for q in moved {
                    let c = model.remove(&q).unwrap();
                    model.insert(to.join(q.strip_prefix(&dir).unwrap()), c);
                }
            }
            _ => {
                // A hard link in another directory: one file, two names.
                let dirs: Vec<PathBuf> = paths
                    .iter()
                    .filter_map(|q| q.parent())
                    .map(Path::to_path_buf)
                    .collect();
                let to = dirs[rng.usize(..dirs.len())].join(format!("link-{round}-{i}"));
                fs::hard_link(&p, &to).unwrap();
                let c = model[&p];
                model.insert(to, c);
            }
        }
    }
    sync(root);
}

/// Every file holds its bytes; files of equal content are on the same
/// blocks (but for targets the run skipped as held elsewhere), and files
/// of different content are never on the same runs of blocks.
fn assert_shared_iff_equal(model: &Model, skipped: &[PathBuf], what: &str) {
    type Runs = Vec<(u64, u64)>;
    type Content = (usize, u64);
    let mut first: HashMap<Content, (&PathBuf, Runs)> = HashMap::new();
    let mut by_runs: HashMap<Runs, (Content, &PathBuf)> = HashMap::new();
    let mut paths: Vec<&PathBuf> = model.keys().collect();
    paths.sort();
    for p in paths {
        let c = model[p];
        assert!(
            fs::read(p).unwrap() == data(c.0, c.1),
            "{what}: bytes of {p:?}"
        );
        let runs = extents(p).unwrap().physical_runs();
        assert!(!runs.is_empty(), "{what}: {p:?} has no blocks");
        match first.get(&c) {
            Some((q, r)) => assert!(
                *r == runs || skipped.contains(p) || skipped.contains(*q),
                "{what}: {p:?} and {q:?} are equal, not shared"
            ),
            None => {
                first.insert(c, (p, runs.clone()));
            }
        }
        if let Some((d, q)) = by_runs.insert(runs, (c, p)) {
            assert_eq!(
                d, c,
                "{what}: {p:?} and {q:?} differ but are on the same blocks"
            );
        }
    }
}

/// Only the databases and their locks are in the index's directory.
fn assert_index_files(ix: &Path, what: &str) {
    for n in cowlink_testfs::names(ix) {
        assert!(
            n.ends_with(".redb") || n.ends_with(".lock"),
            "{what}: {n} left in the index's directory"
        );
    }
}

/// A rerun trusting the index over an unchanged tree: nothing read,
/// planned, shared or written.
fn assert_rerun_quiet(root: &Path, ix: &Path, what: &str) {
    let (p, r) = run(root, ix, what);
    let got = p.index.as_ref().unwrap();
    assert_eq!(p.bytes_hashed, 0, "{what}: an indexed file was read: {p:?}");
    assert!(p.groups.is_empty(), "{what}: {:?}", p.groups);
    assert_eq!(r.targets_deduped, 0, "{what}");
    assert_eq!(got.written, 0, "{what}: {got:?}");
    assert_eq!(got.pruned, 0, "{what}: {got:?}");
    // A file of two names is looked up under each.
    assert!(got.unchanged >= p.candidates, "{what}: {p:?}");
}

/// The attack: a first run over a random tree (index written at its
/// end, rewritten when large), checks, a quiet rerun, then rounds of
/// random operations each followed by a run, checks and a quiet rerun.
///
/// The index is first made by a run over one file in a directory of its
/// own, outside the tree, so that each run over the tree finds its file:
/// a new inode after a run tells that the file was rewritten at the
/// run's end, the same one that it was written in place. The first run
/// over the tree must take the rewrite (the layouts learnt while sharing
/// go into the copy). At these sizes every run that writes rewrites the
/// index too: redb's first regions leave the file at megabytes, twice
/// what the last rewrite recorded.
fn end_of_run_claims(dir: &Path, seed: u64, dirs: usize, per_dir: usize) {
    let root = dir.join(format!("end-{seed}-{dirs}x{per_dir}"));
    let ix = tempfile::tempdir().unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let prime = dir.join(format!("prime-{seed}-{dirs}x{per_dir}"));
    fs::create_dir_all(&prime).unwrap();
    fs::write(prime.join("one"), data(5000, seed)).unwrap();
    let (p, _) = run(&prime, ix.path(), "the priming run");
    let file = p.index.as_ref().unwrap().files[0].clone();
    let was = fs::metadata(&file).unwrap().ino();
    let mut model = build(&root, &mut rng, dirs, per_dir);
    let what = format!("seed {seed}, {dirs}x{per_dir}, first run");
    let (p, r) = run(&root, ix.path(), &what);
    assert!(r.targets_deduped > 0, "{what}: {p:?}");
    let got = p.index.as_ref().unwrap();
    assert!(got.written >= model.len() as u64, "{what}: {got:?}");
    let (entries, size) = cowlink::dedupe::index::stats(&file).unwrap();
    eprintln!("{what}: {entries} entries, {size} bytes, {got:?}");
    let mut was = (was, fs::metadata(&file).unwrap().ino());
    assert_ne!(
        was.0, was.1,
        "{what}: the index was not rewritten at the run's end"
    );
    let skipped: Vec<PathBuf> = r.skipped.iter().map(|s| s.path.clone()).collect();
    assert_index_files(ix.path(), &what);
    assert_shared_iff_equal(&model, &skipped, &what);
    if skipped.is_empty() {
        assert_rerun_quiet(&root, ix.path(), &what);
    }
    for round in 1..=3u64 {
        let what = format!("seed {seed}, {dirs}x{per_dir}, round {round}");
        let n = (model.len() / 600).max(3);
        operate(&root, &mut rng, &mut model, n, round);
        let (p, r) = run(&root, ix.path(), &what);
        was = (was.1, fs::metadata(&file).unwrap().ino());
        eprintln!("{what}: rewritten: {}, {:?}", was.0 != was.1, p.index);
        let skipped: Vec<PathBuf> = r.skipped.iter().map(|s| s.path.clone()).collect();
        assert_index_files(ix.path(), &what);
        assert_shared_iff_equal(&model, &skipped, &what);
        if skipped.is_empty() {
            assert_rerun_quiet(&root, ix.path(), &what);
        }
    }
    fs::remove_dir_all(&root).unwrap();
    fs::remove_dir_all(&prime).unwrap();
}

/// A tree of sixty directories of fifty files (each round changes a few
/// of its records), and one of a few small directories.
const LARGE: (usize, usize) = (60, 50);
const SMALL: (usize, usize) = (4, 12);

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_a_small_index_claims_only_what_is_true() {
    let d = testfs!(Xfs);
    for seed in [301, 302, 303] {
        end_of_run_claims(d.path(), seed, SMALL.0, SMALL.1);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_a_large_index_rewritten_at_the_end_claims_only_what_is_true() {
    let d = testfs!(Xfs);
    end_of_run_claims(d.path(), 311, LARGE.0, LARGE.1);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_a_small_index_claims_only_what_is_true() {
    let d = testfs!(Btrfs);
    for seed in [321, 322, 323] {
        end_of_run_claims(d.path(), seed, SMALL.0, SMALL.1);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_a_large_index_rewritten_at_the_end_claims_only_what_is_true() {
    let d = testfs!(Btrfs);
    end_of_run_claims(d.path(), 331, LARGE.0, LARGE.1);
}

/// Fill the filesystem of `dir` until about `leave` bytes are free.
fn fill(dir: &Path, leave: u64) -> PathBuf {
    let st = rustix::fs::statvfs(dir).unwrap();
    let free = st.f_bavail * st.f_frsize;
    let filler = dir.join("filler");
    let f = fs::File::create(&filler).unwrap();
    let mut len = free.saturating_sub(leave);
    // XFS keeps some blocks back: give up a MiB at a time until it fits.
    while rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, len).is_err() {
        len = len.saturating_sub(1 << 20);
        assert!(len > 0, "cannot fill {dir:?}");
    }
    f.sync_all().unwrap();
    filler
}

/// A first run whose index directory is on a filesystem with `leave`
/// bytes free, over a fresh random tree of 1,200 files on XFS: the
/// index's writes and its end (the rewrite's copy, or the write in
/// place) fail or not. The run must go on (no error: an index that
/// cannot be written is a note), leave no `.redb.new` behind, and a run
/// with room that trusts what the index kept must leave every duplicate
/// shared and nothing else, then a rerun must read nothing.
fn full_index_fs(data_dir: &Path, tiny: &Path, seed: u64, leave: u64) {
    let root = data_dir.join(format!("full-{seed}-{leave}"));
    let ix = tiny.join(format!("ix-{seed}-{leave}"));
    fs::create_dir_all(&ix).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let model = build(&root, &mut rng, 8, 150);
    let what = format!("seed {seed}, {leave} bytes left for the index");
    let filler = fill(tiny, leave);
    let (p, r) = dedupe(&[&root], &trusting(&ix)).unwrap();
    fs::remove_file(&filler).unwrap();
    assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
    assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
    eprintln!("{what}: {:?}", p.index);
    assert_index_files(&ix, &what);
    let (p, r) = dedupe(&[&root], &trusting(&ix)).unwrap();
    assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
    assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
    let skipped: Vec<PathBuf> = r.skipped.iter().map(|s| s.path.clone()).collect();
    assert_index_files(&ix, &what);
    assert_shared_iff_equal(&model, &skipped, &what);
    if skipped.is_empty() {
        assert_rerun_quiet(&root, &ix, &what);
    }
    fs::remove_dir_all(&root).unwrap();
    fs::remove_dir_all(&ix).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_index_on_a_full_filesystem_leaves_no_copy_and_no_wrong_claim() {
    let _alone = cowlink_testfs::serial();
    let (d, t) = (testfs!(Xfs), testfs!(TinyXfs));
    for (i, leave) in [0u64, 96 << 10, 384 << 10, 1 << 20, 3 << 20]
        .into_iter()
        .enumerate()
    {
        full_index_fs(d.path(), t.path(), 340 + i as u64, leave);
    }
}

/// Two runs at once on one index, both trusting it: one over a large
/// random tree (its index rewritten at its end when it holds the index),
/// and, while it goes, runs over two of its directories, each after new
/// copies of indexed files were written there. One of each pair finds
/// the index in use, goes on without it and shares files the other has
/// learnt or will claim: it must leave a mark that makes the next
/// opener forget every layout. A run over the whole tree after them must
/// leave every duplicate shared and nothing else (no claim of the
/// holder that another moved is trusted), leave only the database and
/// its lock, and a rerun must be quiet.
fn two_runs_at_once(dir: &Path, seed: u64) {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let root = dir.join(format!("two-{seed}"));
    let ix = tempfile::tempdir().unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let model = std::sync::Mutex::new(build(&root, &mut rng, 12, 250));
    let done = AtomicBool::new(false);
    let what = format!("seed {seed}, two runs at once");
    let subs = [root.join("d03"), root.join("d07")];
    let behind = std::thread::scope(|s| {
        let first = s.spawn(|| {
            let (p, r) = dedupe(&[&root], &trusting(ix.path())).unwrap();
            done.store(true, Relaxed);
            (p, r)
        });
        let mut runs = 0;
        let mut i = 0;
        while !done.load(Relaxed) || runs == 0 {
            // New copies of files of the tree in the directories the
            // second run covers, so that it has something to share.
            {
                let mut m = model.lock().unwrap();
                let mut paths: Vec<PathBuf> = m.keys().cloned().collect();
                paths.sort();
                for _ in 0..5 {
                    let from = &paths[rng.usize(..paths.len())];
                    let c = m[from];
                    let to = subs[rng.usize(..2)].join(format!("copy-{i}"));
                    i += 1;
                    fs::write(&to, data(c.0, c.1)).unwrap();
                    m.insert(to, c);
                }
            }
            let (p, r) = dedupe(&subs, &trusting(ix.path())).unwrap();
            assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
            assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
            runs += 1;
        }
        // Files written while it read them are its errors, rightly.
        let (p, r) = first.join().unwrap();
        eprintln!("{what}: the first run: {:?} {:?}", p.errors, r.errors);
        eprintln!("{what}: {runs} runs over two directories while the first went");
        runs
    });
    assert!(behind > 0);
    sync(&root);
    let model = model.into_inner().unwrap();
    let (p, r) = dedupe(&[&root], &trusting(ix.path())).unwrap();
    assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
    assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
    let skipped: Vec<PathBuf> = r.skipped.iter().map(|s| s.path.clone()).collect();
    assert_index_files(ix.path(), &what);
    assert_shared_iff_equal(&model, &skipped, &what);
    if skipped.is_empty() {
        assert_rerun_quiet(&root, ix.path(), &what);
    }
    fs::remove_dir_all(&root).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_two_runs_at_once_on_a_large_index_leave_no_wrong_claim() {
    let d = testfs!(Xfs);
    two_runs_at_once(d.path(), 351);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_two_runs_at_once_on_a_large_index_leave_no_wrong_claim() {
    let d = testfs!(Btrfs);
    two_runs_at_once(d.path(), 361);
}

/// Fill the filesystem of `dir` to its last block: files of halving
/// sizes until not one more block fits.
fn fill_all(dir: &Path) -> Vec<PathBuf> {
    let mut made = Vec::new();
    let mut len: u64 = 1 << 30;
    while len >= 4096 {
        let p = dir.join(format!("filler-{}", made.len()));
        // No room left for one more inode either.
        let Ok(f) = fs::File::create(&p) else { break };
        if rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, len).is_ok() {
            made.push(p);
        } else {
            drop(f);
            let _ = fs::remove_file(&p);
            len /= 2;
        }
    }
    made
}

/// An index made with room, then its filesystem filled to the last
/// block (and, with `reflinked`, its file's blocks shared with a copy,
/// as a backup by `cp --reflink` leaves them, so that redb's overwrite of
/// its header needs new blocks too): a run must go on without the index
/// and keep it, never remove it as if it were damaged, and once there is
/// room again a rerun must find every file it held unchanged.
fn a_full_filesystem_keeps_the_index(data_dir: &Path, tiny: &Path, reflinked: bool) {
    let root = data_dir.join(format!("keep-{reflinked}"));
    let ix = tiny.join(format!("keep-ix-{reflinked}"));
    fs::create_dir_all(&ix).unwrap();
    let mut rng = fastrand::Rng::with_seed(370 + u64::from(reflinked));
    let model = build(&root, &mut rng, 6, 20);
    let (p, _) = run(&root, &ix, "with room");
    let file = p.index.as_ref().unwrap().files[0].clone();
    let held = cowlink::dedupe::index::stats(&file).unwrap().0;
    let ino = fs::metadata(&file).unwrap().ino();
    if reflinked {
        reflink(&file, &tiny.join(format!("backup-{reflinked}.redb")));
    }
    let fillers = fill_all(tiny);
    let (p, r) = dedupe(&[&root], &trusting(&ix)).unwrap();
    for f in &fillers {
        fs::remove_file(f).unwrap();
    }
    let what = format!("reflinked {reflinked}: {:?}", p.index);
    assert!(p.errors.is_empty() && r.errors.is_empty(), "{what}: {p:?}");
    assert!(
        fs::metadata(&file).is_ok_and(|m| m.ino() == ino),
        "{what}: the index was removed on a full filesystem"
    );
    assert_eq!(
        cowlink::dedupe::index::stats(&file).unwrap().0,
        held,
        "{what}"
    );
    let (p, _) = run(&root, &ix, &what);
    assert_eq!(
        p.bytes_hashed, 0,
        "{what}: what the index held was lost: {p:?}"
    );
    assert_shared_iff_equal(&model, &[], &what);
    fs::remove_dir_all(&root).unwrap();
    fs::remove_dir_all(&ix).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_index_on_a_filesystem_filled_since_is_kept_not_rebuilt() {
    let _alone = cowlink_testfs::serial();
    let (d, t) = (testfs!(Xfs), testfs!(TinyXfs));
    a_full_filesystem_keeps_the_index(d.path(), t.path(), false);
    a_full_filesystem_keeps_the_index(d.path(), t.path(), true);
}
