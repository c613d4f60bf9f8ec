//! Dedupe against hostile trees: seeded random trees of exact copies and
//! near duplicates (same size and edges, another middle), run with and
//! without `keep_groups`, must share the same files and report the same
//! counts as each other and as the plan (`--dry-run`) finds.

use std::fs;
use std::path::{Path, PathBuf};

use cowlink::dedupe::{dedupe, plan, DedupeOptions};
use cowlink_testfs::{data, serial, testfs, write_file};

use crate::same_blocks;

fn sync(dir: &Path) {
    let f = fs::File::open(dir).unwrap();
    rustix::fs::syncfs(&f).unwrap();
}

/// A seeded random tree under `dir`: groups of exact copies (small ones,
/// read whole while walking, and larger ones, grouped on their edges),
/// near duplicates whose every member differs in the middle only (one
/// edge group the kernel splits whole), near duplicates with equal pairs
/// among the variants (grouped again by hash), and singletons. Returns
/// the sets of equal files (two or more each).
fn random_tree(dir: &Path, seed: u64) -> Vec<Vec<PathBuf>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut sets = Vec::new();
    for g in 0..24u64 {
        let sub = dir.join(format!("g{g:02}"));
        fs::create_dir_all(&sub).unwrap();
        let file_seed = seed * 1000 + g;
        match rng.u8(0..4) {
            // Exact copies, small or larger.
            0 | 1 => {
                let size = if rng.bool() {
                    rng.usize(4096..=8192)
                } else {
                    rng.usize(8193..=96 << 10)
                };
                let bytes = data(size, file_seed);
                let set: Vec<PathBuf> = (0..rng.usize(2..=4))
                    .map(|i| sub.join(format!("c{i}")))
                    .collect();
                for p in &set {
                    write_file(p, &bytes);
                }
                sets.push(set);
            }
            // Same size and edges, every file another middle: nothing
            // is equal.
            2 => {
                let size = rng.usize(16 << 10..=96 << 10);
                let base = data(size, file_seed);
                for i in 0..rng.usize(2..=4) {
                    let mut b = base.clone();
                    b[size / 2] ^= 1 + i as u8;
                    write_file(&sub.join(format!("n{i}")), &b);
                }
            }
            // Same edges; variants in equal pairs.
            _ => {
                let size = rng.usize(16 << 10..=96 << 10);
                let base = data(size, file_seed);
                write_file(&sub.join("base"), &base);
                for v in 0..rng.usize(1..=2) {
                    let mut b = base.clone();
                    b[size / 2] ^= 1 + v as u8;
                    let set: Vec<PathBuf> = (0..2).map(|i| sub.join(format!("v{v}_{i}"))).collect();
                    for p in &set {
                        write_file(p, &b);
                    }
                    sets.push(set);
                }
            }
        }
        // A singleton of the same size as nothing else.
        if rng.bool() {
            write_file(
                &sub.join("single"),
                &data(rng.usize(1..=20_000), !file_seed),
            );
        }
    }
    sync(dir);
    sets
}

/// Two identical random trees of `seed`, one deduplicated keeping its
/// groups and one not: both find the groups the plan finds, share every
/// equal set, keep every byte, and report the same counts.
fn keep_groups_changes_nothing_but_the_groups(dir: &Path, seed: u64) {
    let (ka, kb) = (dir.join("kept"), dir.join("dropped"));
    let kept_sets = random_tree(&ka, seed);
    let dropped_sets = random_tree(&kb, seed);
    let planned = plan(&[&ka], &DedupeOptions::default()).unwrap();
    assert_eq!(planned.groups.len(), kept_sets.len(), "seed {seed}");
    let (pk, rk) = dedupe(&[&ka], &DedupeOptions::default()).unwrap();
    let opts = DedupeOptions {
        keep_groups: false,
        ..Default::default()
    };
    let (pd, rd) = dedupe(&[&kb], &opts).unwrap();
    assert!(pd.groups.is_empty());
    for (p, r) in [(&pk, &rk), (&pd, &rd)] {
        assert!(p.errors.is_empty(), "seed {seed}: {:?}", p.errors);
        assert!(
            r.errors.is_empty() && r.changed.is_empty(),
            "seed {seed}: {r:?}"
        );
        // The summary's count is the dry run's.
        assert_eq!(
            p.groups_found,
            planned.groups.len() as u64,
            "seed {seed}: groups found (keep_groups {})",
            !p.groups.is_empty()
        );
        assert_eq!(r.targets_deduped, planned.targets(), "seed {seed}");
    }
    assert_eq!(pk.groups_found, pk.groups.len() as u64, "seed {seed}");
    assert_eq!(
        (rk.groups, rk.regrouped, pk.files_already_shared),
        (rd.groups, rd.regrouped, pd.files_already_shared),
        "seed {seed}"
    );
    for sets in [&kept_sets, &dropped_sets] {
        for set in sets {
            let want = fs::read(&set[0]).unwrap();
            for f in &set[1..] {
                assert!(same_blocks(&set[0], f), "seed {seed}: {}", f.display());
                assert_eq!(fs::read(f).unwrap(), want, "seed {seed}");
            }
        }
    }
}

/// Near duplicates whose every target the kernel finds different leave
/// their edge group empty: it is no group found, with or without
/// `keep_groups` (the summary's count must be the dry run's).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_edge_group_split_whole_counts_the_same_without_keep_groups() {
    let _serial = serial();
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    for (i, d) in [x.path(), b.path()].into_iter().enumerate() {
        for seed in 0..4 {
            let dir = d.join(format!("s{i}_{seed}"));
            keep_groups_changes_nothing_but_the_groups(&dir, 7000 + seed);
        }
    }
}

/// One attempt: a group of a source and `n` targets, planned; as the
/// executor opens the source (inotify, the first open after the plan),
/// another program writes other bytes over the source in place, same
/// size. The targets go to the kernel in calls of at most 127: those of
/// calls before the write are shared, the others found different.
/// Returns the report when the write landed before the last call (not
/// every target shared), `None` otherwise (void attempt).
fn source_rewritten_when_opened(
    dir: &Path,
    n: usize,
    index: Option<&Path>,
) -> Option<(PathBuf, cowlink::dedupe::DedupeReport)> {
    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    fs::create_dir_all(dir).unwrap();
    let size = 6000;
    let bytes = data(size, 11);
    let files: Vec<PathBuf> = (0..=n).map(|i| dir.join(format!("f{i:03}"))).collect();
    for f in &files {
        write_file(f, &bytes);
    }
    sync(dir);
    let opts = DedupeOptions {
        run: cowlink::Run::default().with_threads(1),
        index: index.map(Path::to_path_buf),
        layout_recheck: cowlink::dedupe::LayoutRecheck::Never,
        ..Default::default()
    };
    let p = plan(&[dir], &opts).unwrap();
    assert_eq!(p.groups.len(), 1);
    let source = p.groups[0].source.clone();
    let w = fs::OpenOptions::new().write(true).open(&source).unwrap();
    let other = data(size, 12);
    let ino = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).unwrap();
    inotify::add_watch(&ino, &source, WatchFlags::OPEN).unwrap();
    let done = AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
            let mut events = inotify::Reader::new(&ino, &mut buf);
            loop {
                // Read before the queue: once the run is over, its open
                // is queued (read after, a run that opened and ended
                // between an empty read and the flag was taken as never
                // opening the source, and the test failed under load).
                let over = done.load(SeqCst);
                match events.next() {
                    Ok(ev) if ev.events().contains(ReadFlags::OPEN) => {
                        w.write_all_at(&other, 0).unwrap();
                        return;
                    }
                    Ok(_) => {}
                    Err(rustix::io::Errno::AGAIN) if over => return,
                    Err(rustix::io::Errno::AGAIN) => std::hint::spin_loop(),
                    Err(e) => panic!("inotify: {e}"),
                }
            }
        });
        let r = cowlink::dedupe::execute(&p, &opts);
        done.store(true, SeqCst);
        writer.join().unwrap();
        r
    });
    assert_eq!(fs::read(&source).unwrap(), other);
    for t in &files[1..] {
        assert_eq!(fs::read(t).unwrap(), bytes);
    }
    (r.targets_deduped < n as u64).then_some((source, r))
}

/// A source rewritten in place (same size, other bytes) after it was
/// opened and before the kernel compared it: the kernel finds every
/// target of the later calls different. The source is the file that changed and is
/// reported so; its unchanged targets are not reported changed.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_source_rewritten_under_the_call_is_the_file_reported_changed() {
    let _serial = serial();
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let mut landed = [0; 2];
    for attempt in 0..6 {
        let fs = if attempt % 2 == 0 { x.path() } else { b.path() };
        let Some((source, r)) =
            source_rewritten_when_opened(&fs.join(format!("a{attempt}")), 300, None)
        else {
            continue;
        };
        landed[attempt % 2] += 1;
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert!(
            r.changed == [source.clone()],
            "attempt {attempt}: {} reported changed ({:?}, ...), not the source {source:?}",
            r.changed.len(),
            r.changed.first()
        );
    }
    assert!(
        landed[0] > 0 && landed[1] > 0,
        "the rewrite never landed before the kernel's comparison"
    );
}

/// As [`a_source_rewritten_under_the_call_is_the_file_reported_changed`],
/// with an index trusted by every run: a rerun shares every target,
/// those shared before the rewrite and those found different, and
/// leaves the rewritten source apart; a third run has nothing to do.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn after_a_source_rewritten_under_the_call_a_rerun_shares_the_targets() {
    let _serial = serial();
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let mut landed = [0; 2];
    for attempt in 0..4 {
        let fs = if attempt % 2 == 0 { x.path() } else { b.path() };
        let ix = tempfile::tempdir().unwrap();
        let dir = fs.join(format!("i{attempt}"));
        let Some((source, r)) = source_rewritten_when_opened(&dir, 200, Some(ix.path())) else {
            continue;
        };
        landed[attempt % 2] += 1;
        assert!(r.changed == [source.clone()], "attempt {attempt}: {r:?}");
        let opts = DedupeOptions {
            index: Some(ix.path().to_path_buf()),
            layout_recheck: cowlink::dedupe::LayoutRecheck::Never,
            ..Default::default()
        };
        let (p, r) = dedupe(&[&dir], &opts).unwrap();
        assert!(p.errors.is_empty() && r.errors.is_empty(), "{p:?} {r:?}");
        let targets: Vec<PathBuf> = (1..=200).map(|i| dir.join(format!("f{i:03}"))).collect();
        for t in &targets[1..] {
            assert!(same_blocks(&targets[0], t), "attempt {attempt}: {t:?}");
        }
        assert!(!same_blocks(&source, &targets[0]));
        let (p, r) = dedupe(&[&dir], &opts).unwrap();
        assert_eq!(
            (p.groups_found, r.targets_deduped),
            (0, 0),
            "attempt {attempt}"
        );
    }
    assert!(landed[0] > 0 && landed[1] > 0, "{landed:?}");
}

#[allow(dead_code)]
#[path = "../../../../fuzz/fuzz_targets/index_record_check.rs"]
mod index_record_check;

/// The `index_record` fuzz target's seed corpus (fuzz/seeds/index_record:
/// records of real indexes, XFS and Btrfs) replayed on stable through the
/// same checks the target runs, with every seed also cut short and
/// changed byte by byte, the directory's inode included. A seed, as a
/// real record, encodes to exactly its own bytes.
#[test]
fn index_record_fuzz_corpus_replay() {
    let seeds = crate::replay_corpus("index_record", |b| {
        index_record_check::check(b);
    });
    for (p, bytes) in &seeds {
        assert_eq!(
            index_record_check::check(bytes).as_deref(),
            Some(&bytes[8..]),
            "{}: a real record is refused or not its own encoding",
            p.display()
        );
    }
    assert!(seeds.len() >= 10, "{} seeds", seeds.len());
}
