//! Plan and execute name the same files: a path that names another file
//! by the time the plan is carried out (a hard link to a store object, a
//! fresh copy with the same bytes, the same file changed) is left alone
//! and reported, on real filesystems. The swapped-in files' extents and
//! bytes are checked untouched, and a generated case swaps random sources
//! and targets.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cowlink::dedupe::{execute, plan, DedupeOptions, DedupePlan, FileStamp};
use cowlink::store::Store;
use cowlink_testfs::{data, testfs, write_file};

use crate::same_blocks;

const MIB: usize = 1 << 20;

fn sync(dir: &Path) {
    let f = fs::File::open(dir).unwrap();
    rustix::fs::syncfs(&f).unwrap();
}

/// The disk runs of `p` (FIEMAP).
fn runs(p: &Path) -> Vec<(u64, u64)> {
    cowlink::extents::extents(p).unwrap().physical_runs()
}

/// Put `with` at `at` in one rename: a hard link to it, or (`copy`) a
/// new file with its bytes.
fn swap(at: &Path, with: &Path, copy: bool) {
    let tmp = at.with_extension("swap-tmp");
    match copy {
        true => write_file(&tmp, &fs::read(with).unwrap()),
        false => fs::hard_link(with, &tmp).unwrap(),
    }
    fs::rename(&tmp, at).unwrap();
}

fn plan_of(dir: &Path) -> DedupePlan {
    let p = plan(&[dir], &DedupeOptions::default()).unwrap();
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    p
}

/// Two groups planned, then: one target replaced by a hard link to a store
/// object with the same bytes, another by a fresh copy of them, and the
/// other group's source by a hard link to a file outside the plan with its
/// bytes. Executing shares only the target left in place; the store
/// object, the copy and the outside file keep their extents and bytes, the
/// other group's targets keep theirs, and the report names the three.
fn swapped_files_are_left_alone(dir: &Path) {
    let x = data(MIB, 31);
    let y = data(MIB + 12345, 32);
    let store = Store::open(dir.join("store")).unwrap();
    write_file(&dir.join("in"), &x);
    let digest = store.add(dir.join("in")).unwrap();
    fs::remove_file(dir.join("in")).unwrap();
    let object = store.object_path(&digest);
    let tree = dir.join("tree");
    fs::create_dir_all(&tree).unwrap();
    for n in ["a", "b", "c", "d"] {
        write_file(&tree.join(n), &x);
    }
    for n in ["s1", "s2", "s3"] {
        write_file(&tree.join(n), &y);
    }
    let outside = dir.join("outside");
    write_file(&outside, &y);
    sync(dir);

    let p = plan_of(&tree);
    assert_eq!(p.groups.len(), 2, "{p:?}");
    let gx = p.groups.iter().find(|g| g.size == x.len() as u64).unwrap();
    let gy = p.groups.iter().find(|g| g.size == y.len() as u64).unwrap();
    assert_eq!(gx.source, tree.join("a"));
    assert_eq!(gx.targets, [tree.join("b"), tree.join("c"), tree.join("d")]);
    assert_eq!(gy.source, tree.join("s1"));
    // Every path carries the stamp of the file it named, in JSON too.
    assert_eq!(
        gx.source_stamp,
        Some(FileStamp::of_path(&gx.source).unwrap())
    );
    let stamps: Vec<FileStamp> = (gx.targets.iter())
        .map(|t| FileStamp::of_path(t).unwrap())
        .collect();
    assert_eq!(gx.target_stamps, stamps);
    let json = serde_json::to_string(&p).unwrap();
    let back: DedupePlan = serde_json::from_str(&json).unwrap();
    assert_eq!(back.groups, p.groups);

    swap(&tree.join("b"), &object, false);
    swap(&tree.join("c"), &tree.join("a"), true);
    swap(&tree.join("s1"), &outside, false);
    sync(dir);
    let object_runs = runs(&object);
    let c_runs = runs(&tree.join("c"));
    let outside_runs = runs(&outside);
    let s_runs: Vec<_> = ["s2", "s3"].map(|n| runs(&tree.join(n))).into();

    // The plan read back from its JSON is executed: the stamps travel.
    let r = execute(&back, &DedupeOptions::default());
    let mut changed = r.changed.clone();
    changed.sort();
    assert_eq!(
        changed,
        [tree.join("b"), tree.join("c"), tree.join("s1")],
        "{r:?}"
    );
    assert!(r.errors.is_empty() && r.skipped.is_empty(), "{r:?}");
    assert_eq!(r.targets_deduped, 1, "{r:?}");
    assert!(same_blocks(&tree.join("a"), &tree.join("d")));

    assert_eq!(runs(&object), object_runs, "the store object moved");
    assert_eq!(fs::read(&object).unwrap(), x);
    let v = store.verify().unwrap();
    assert!(v.is_clean() && v.objects == 1, "{v:?}");
    assert_eq!(runs(&tree.join("c")), c_runs, "the copy put in place moved");
    assert_eq!(runs(&outside), outside_runs, "the file outside moved");
    assert_eq!(fs::read(&outside).unwrap(), y);
    let after: Vec<_> = ["s2", "s3"].map(|n| runs(&tree.join(n))).into();
    assert_eq!(after, s_runs, "a group whose source was swapped ran");
    for n in ["a", "b", "c", "d"] {
        assert_eq!(fs::read(tree.join(n)).unwrap(), x, "{n}");
    }
    for n in ["s1", "s2", "s3"] {
        assert_eq!(fs::read(tree.join(n)).unwrap(), y, "{n}");
    }

    // A plan without stamps (made by hand, or by an older version) is
    // refused path by path, naming each, and shares nothing.
    let mut bare = plan_of(&tree);
    assert!(!bare.groups.is_empty());
    for g in &mut bare.groups {
        g.source_stamp = None;
        g.target_stamps.clear();
    }
    let text = serde_json::to_string(&bare).unwrap();
    assert!(!text.contains("stamp"), "{text}");
    let bare: DedupePlan = serde_json::from_str(&text).unwrap();
    let before: Vec<_> = ["b", "c", "s2", "s3"].map(|n| runs(&tree.join(n))).into();
    let r = execute(&bare, &DedupeOptions::default());
    assert_eq!(r.targets_deduped, 0, "{r:?}");
    assert_eq!(r.errors.len(), bare.groups.len(), "{r:?}");
    for e in &r.errors {
        assert_eq!(e.kind(), cowlink::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("does not record which file"), "{e}");
    }
    let now: Vec<_> = ["b", "c", "s2", "s3"].map(|n| runs(&tree.join(n))).into();
    assert_eq!(now, before);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_a_path_swapped_after_the_plan_is_left_alone() {
    let d = testfs!(Xfs);
    swapped_files_are_left_alone(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_a_path_swapped_after_the_plan_is_left_alone() {
    let d = testfs!(Btrfs);
    swapped_files_are_left_alone(d.path());
}

/// What happens to a planned path between plan and execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Swap {
    /// Nothing.
    Keep,
    /// A hard link to a file outside the plan with the same bytes.
    Link,
    /// A new file with the same bytes, renamed over it.
    Copy,
    /// Its mode changed (same inode, same bytes; ctime moves).
    Chmod,
    /// The same bytes written over it in place (mtime moves).
    Rewrite,
}

/// Random groups of identical files, planned; then random sources and
/// targets swapped ([`Swap`]). Executing shares exactly the targets left
/// alone in groups whose source was left alone; every swapped path is
/// reported changed and keeps its extents; the files put in place from
/// outside keep theirs; no byte anywhere changes.
fn random_swaps(dir: &Path, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let tree = dir.join("tree");
    let outside = dir.join("outside");
    fs::create_dir_all(&tree).unwrap();
    fs::create_dir_all(&outside).unwrap();
    // Above Btrfs's inline limit, and some over two 4 KiB edges.
    let sizes = [12 << 10, 64 << 10, 300_001];
    let mut content: HashMap<PathBuf, Vec<u8>> = HashMap::new();
    for g in 0..rng.usize(3..7) {
        let bytes = data(sizes[rng.usize(..sizes.len())], seed * 100 + g as u64);
        for i in 0..rng.usize(2..6) {
            let p = tree.join(format!("g{g}-{i}"));
            write_file(&p, &bytes);
            content.insert(p, bytes.clone());
        }
    }
    sync(dir);
    let p = plan_of(&tree);
    assert!(!p.groups.is_empty());

    let pick = |rng: &mut fastrand::Rng| match rng.u32(..10) {
        0 => Swap::Link,
        1 => Swap::Copy,
        2 => Swap::Chmod,
        3 => Swap::Rewrite,
        _ => Swap::Keep,
    };
    let mut swaps: HashMap<PathBuf, Swap> = HashMap::new();
    // The files put in place from outside, with their bytes.
    let mut victims: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for g in &p.groups {
        for path in std::iter::once(&g.source).chain(&g.targets) {
            let s = pick(&mut rng);
            let bytes = &content[path];
            match s {
                Swap::Keep => {}
                Swap::Link => {
                    let v = outside.join(format!("v{}", victims.len()));
                    write_file(&v, bytes);
                    swap(path, &v, false);
                    victims.push((v, bytes.clone()));
                }
                Swap::Copy => swap(path, path, true),
                Swap::Chmod => {
                    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap()
                }
                Swap::Rewrite => {
                    use std::os::unix::fs::FileExt;
                    let f = fs::File::options().write(true).open(path).unwrap();
                    f.write_all_at(bytes, 0).unwrap();
                    f.sync_all().unwrap();
                }
            }
            swaps.insert(path.clone(), s);
        }
    }
    sync(dir);
    let runs_before: HashMap<PathBuf, Vec<(u64, u64)>> = content
        .keys()
        .chain(victims.iter().map(|(v, _)| v))
        .map(|p| (p.clone(), runs(p)))
        .collect();

    let r = execute(&p, &DedupeOptions::default());
    assert!(r.errors.is_empty() && r.skipped.is_empty(), "{r:?}");
    let mut want_changed = BTreeSet::new();
    let mut want_shared = Vec::new();
    for g in &p.groups {
        if swaps[&g.source] != Swap::Keep {
            want_changed.insert(g.source.clone());
            continue;
        }
        for t in &g.targets {
            match swaps[t] {
                Swap::Keep => want_shared.push((g.source.clone(), t.clone())),
                _ => {
                    want_changed.insert(t.clone());
                }
            }
        }
    }
    let changed: BTreeSet<PathBuf> = r.changed.iter().cloned().collect();
    assert_eq!(changed, want_changed, "seed {seed}: {swaps:?}");
    assert_eq!(r.targets_deduped, want_shared.len() as u64, "seed {seed}");
    for (s, t) in &want_shared {
        assert!(same_blocks(s, t), "seed {seed}: {t:?} not shared");
    }
    let moved: HashSet<&PathBuf> = want_shared.iter().map(|(_, t)| t).collect();
    for (path, before) in &runs_before {
        if !moved.contains(path) {
            assert_eq!(&runs(path), before, "seed {seed}: {path:?} moved");
        }
    }
    for (path, bytes) in &content {
        assert_eq!(&fs::read(path).unwrap(), bytes, "seed {seed}: {path:?}");
    }
    for (v, bytes) in &victims {
        assert_eq!(&fs::read(v).unwrap(), bytes, "seed {seed}: {v:?}");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_random_swaps_between_plan_and_execute() {
    for seed in 1..=6 {
        let d = testfs!(Xfs);
        random_swaps(d.path(), seed);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_random_swaps_between_plan_and_execute() {
    for seed in 1..=6 {
        let d = testfs!(Btrfs);
        random_swaps(d.path(), seed);
    }
}
