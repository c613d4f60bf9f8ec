//! `cowlink dedupe` and its index from the command line: kill -9 at any
//! point leaves an index the next run can trust; --index and --no-index.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use cowlink_testfs::{data, testfs, write_file};

use crate::common::{bin, text};

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn dedupe(ix: &Path, dir: &Path) -> Output {
    bin()
        .args(["dedupe", "--json", "--index"])
        .arg(ix)
        .arg(dir)
        .output()
        .unwrap()
}

/// `cowlink dedupe --index IX DIR` started, its output dropped: a run
/// the test kills.
fn spawn_quiet(ix: &Path, dir: &Path) -> std::process::Child {
    bin()
        .args(["dedupe", "--index"])
        .arg(ix)
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn same_blocks(a: &Path, b: &Path) -> bool {
    let runs = |p: &Path| cowlink::extents::extents(p).unwrap().physical_runs();
    let (x, y) = (runs(a), runs(b));
    !x.is_empty() && x == y
}

/// One round's files: three copies (`c0`, `c1`, `c2`, written apart) of
/// 200 files from 4 KiB to 124 KiB (none inline on Btrfs; small ones read whole in the walk,
/// larger ones hashed at their edges), each of its own bytes.
fn round_tree(dir: &Path, seed: u64) -> Vec<(Vec<PathBuf>, Vec<u8>)> {
    let mut sets: Vec<(Vec<PathBuf>, Vec<u8>)> = (0..200u64)
        .map(|i| {
            (
                Vec::new(),
                data(4096 + (i as usize * 613) % (120 << 10), seed * 1000 + i),
            )
        })
        .collect();
    for copy in 0..3 {
        let d = dir.join(format!("c{copy}"));
        std::fs::create_dir_all(&d).unwrap();
        for (i, (paths, bytes)) in sets.iter_mut().enumerate() {
            let p = d.join(format!("f{i}"));
            // Not synced: 600 fsyncs a round would be most of the test.
            std::fs::write(&p, &bytes).unwrap();
            paths.push(p);
        }
    }
    sets
}

/// Rewrite `p` with other bytes of the same size and put its mtime back:
/// only its ctime tells the change (same inode, size and mtime).
fn rewrite_keeping_mtime(p: &Path, bytes: &[u8]) {
    let mtime = std::fs::metadata(p).unwrap().modified().unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    f.set_modified(mtime).unwrap();
    f.sync_all().unwrap();
}

/// The seed of a generated test: `COWLINK_TEST_SEED`, else the clock;
/// printed, so a failure is replayed with it.
fn seed() -> u64 {
    let seed = std::env::var("COWLINK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("seed {seed} (replay with COWLINK_TEST_SEED={seed})");
    seed
}

/// Only the database and its lock are left in the index's directory:
/// no `.redb.new` of a rewrite killed before its rename, no other
/// temporary.
fn assert_index_files(ix: &Path, what: &str) {
    for n in cowlink_testfs::names(ix) {
        assert!(
            n.ends_with(".redb") || n.ends_with(".lock"),
            "{what}: {n} left in the index's directory"
        );
    }
}

/// Every set's files share their blocks and hold its bytes.
fn assert_shared(sets: &[(Vec<PathBuf>, Vec<u8>)], what: &str) {
    for (paths, bytes) in sets {
        for p in paths {
            assert!(
                std::fs::read(p).unwrap() == *bytes,
                "{what}: bytes of {p:?}"
            );
            assert!(same_blocks(&paths[0], p), "{what}: {p:?} not shared");
        }
    }
}

/// kill -9 at random points of a run (drawn from a seeded RNG over the
/// length of a whole run: the walk, hashing, sharing and the index's
/// commits and rewrite), each followed by a rerun, on XFS and Btrfs.
/// Expected: redb commits are atomic, so no kill ever leaves a corrupt
/// index (the rerun's index notes are empty), a rewrite's `.redb.new` is
/// gone after the rerun, every duplicate ends shared with its bytes, and
/// a third run finds nothing to read or do. Between the kill and the
/// rerun a file is rewritten under its restored mtime: the rerun must
/// read it again (ctime) and never share it with its old twins.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn kill_9_at_random_points_leaves_an_index_the_next_run_trusts() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    for fs in [x.path(), b.path()] {
        let ix = tempfile::tempdir().unwrap();
        let root = fs.join("kill");
        // A whole first run over one round's files, timed: the kills are
        // drawn over its length (and a little past it).
        let mut sets = round_tree(&root.join("whole"), 0);
        let t0 = std::time::Instant::now();
        let v = json(&dedupe(ix.path(), &root));
        let whole = t0.elapsed();
        assert_eq!(v["result"]["targets_deduped"], 400, "{v}");
        eprintln!("{fs:?}: a whole run took {whole:?}");
        for round in 1..=6u64 {
            let dir = root.join(format!("r{round}"));
            let mut round_sets = round_tree(&dir, round);
            let delay = Duration::from_micros(rng.u64(0..=whole.as_micros() as u64 * 11 / 10));
            let what = format!("{fs:?} round {round}, killed after {delay:?} (seed {seed})");
            let mut child = spawn_quiet(ix.path(), &dir);
            std::thread::sleep(delay);
            let _ = child.kill(); // SIGKILL
            child.wait().unwrap();
            // Changed behind the index: other bytes, same size, inode and
            // mtime; its twins keep theirs. A new file holds its new bytes:
            // an entry trusted by its mtime would keep the old hash and
            // miss that duplicate.
            let k = rng.usize(0..round_sets.len());
            let (paths, bytes) = &mut round_sets[k];
            let changed = paths.remove(0);
            let new = data(bytes.len(), 7_000_000 + round);
            rewrite_keeping_mtime(&changed, &new);
            let partner = dir.join("new");
            write_file(&partner, &new);
            round_sets.push((vec![changed.clone(), partner], new));

            let v = json(&dedupe(ix.path(), &root));
            assert_eq!(
                v["plan"]["index"]["notes"],
                serde_json::json!([]),
                "{what}: {v}"
            );
            assert_eq!(v["plan"]["errors"], serde_json::json!([]), "{what}: {v}");
            assert_eq!(v["result"]["errors"], serde_json::json!([]), "{what}: {v}");
            assert_eq!(v["result"]["changed"], serde_json::json!([]), "{what}: {v}");
            assert_index_files(ix.path(), &what);
            sets.extend(round_sets);
            assert_shared(&sets, &what);
            let twin = changed
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("c1")
                .join(changed.file_name().unwrap());
            assert!(
                !same_blocks(&changed, &twin),
                "{what}: {changed:?} shared with its old twin"
            );
            // The names in the tree are the ones written: nothing left.
            assert_eq!(
                cowlink_testfs::temporaries(&root),
                Vec::<PathBuf>::new(),
                "{what}"
            );
            for c in 0..3 {
                assert_eq!(
                    cowlink_testfs::names(&dir.join(format!("c{c}"))).len(),
                    200,
                    "{what}"
                );
            }
        }
        // A third run: consistent, nothing to read, nothing to do.
        let v = json(&dedupe(ix.path(), &root));
        assert_eq!(v["plan"]["bytes_hashed"], 0, "{v}");
        assert_eq!(v["plan"]["groups"], serde_json::json!([]), "{v}");
        assert_eq!(v["result"]["targets_deduped"], 0, "{v}");
        assert_index_files(ix.path(), "after the third run");
        assert_shared(&sets, "after the third run");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn no_index_reads_everything_and_keeps_nothing() {
    let x = testfs!(Xfs);
    let root = x.path().join("t");
    for copy in ["a", "b"] {
        std::fs::create_dir_all(root.join(copy)).unwrap();
        write_file(&root.join(copy).join("f"), &data(50_000, 1));
    }
    let ix = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["dedupe", "--json", "--no-index"])
        .arg(&root)
        .env("COWLINK_INDEX_DIR", ix.path())
        .output()
        .unwrap();
    let v = json(&out);
    assert!(v["plan"].get("index").is_none(), "{v}");
    assert_eq!(std::fs::read_dir(ix.path()).unwrap().count(), 0);
    // The default place (here moved by COWLINK_INDEX_DIR) is used without
    // a flag, and the summary says what the index saved.
    let run = || {
        bin()
            .args(["dedupe"])
            .arg(&root)
            .env("COWLINK_INDEX_DIR", ix.path())
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read_dir(ix.path()).unwrap().count() > 0);
    let out = run();
    assert!(
        text(&out.stdout).contains("index: 2 files not read (unchanged)"),
        "{}",
        text(&out.stdout)
    );
    // Both flags at once make no sense.
    let out = bin()
        .args(["dedupe", "--no-index", "--index"])
        .arg(ix.path())
        .arg(&root)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `cp -a --reflink=always a b` of files whose sizes collide (so each size
/// group holds several pairs, none equal to another): every file of `b`
/// is counted as already shared, with and without the index, on a first
/// run and a rerun, and nothing is deduped.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_reflinked_copy_counts_as_already_shared() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    for fs in [x.path(), b.path()] {
        // Small files (read whole in the walk) and larger ones (mapped,
        // then hashed at their edges), each size held by several files.
        let (small, large) = (12u64, 6u64);
        for index in [false, true] {
            let root = fs.join(format!("reflinked-{index}"));
            let a = root.join("a");
            std::fs::create_dir_all(&a).unwrap();
            for i in 0..small {
                write_file(&a.join(format!("s{i}")), &data(6000 + (i % 2) as usize, i));
            }
            for i in 0..large {
                write_file(&a.join(format!("l{i}")), &data(300_000, 100 + i));
            }
            let st = std::process::Command::new("cp")
                .args(["-a", "--reflink=always"])
                .arg(&a)
                .arg(root.join("b"))
                .status()
                .unwrap();
            assert!(st.success());
            let ix = tempfile::tempdir().unwrap();
            for round in 0..2 {
                let mut cmd = bin();
                cmd.args(["dedupe", "--json"]);
                match index {
                    true => cmd.arg("--index").arg(ix.path()),
                    false => cmd.arg("--no-index"),
                };
                let v = json(&cmd.arg(&a).arg(root.join("b")).output().unwrap());
                let what = format!("{fs:?} index {index} round {round}: {v}");
                assert_eq!(v["plan"]["files_already_shared"], small + large, "{what}");
                assert_eq!(v["plan"]["groups"], serde_json::json!([]), "{what}");
                assert_eq!(v["result"]["targets_deduped"], 0, "{what}");
                // The text summary says the same.
                let mut cmd = bin();
                cmd.args(["dedupe", "--dry-run"]);
                match index {
                    true => cmd.arg("--index").arg(ix.path()),
                    false => cmd.arg("--no-index"),
                };
                let out = cmd.arg(&a).arg(root.join("b")).output().unwrap();
                assert!(out.status.success(), "{}", text(&out.stderr));
                let said = text(&out.stdout);
                assert!(
                    said.contains(&format!("skipped: {} already shared", small + large)),
                    "{what}: {said}"
                );
            }
        }
    }
}

/// Two runs over the same tree with one index, the second started at a
/// random offset (seeded) into the first, on XFS and Btrfs. The index's
/// lock lets one use it at a time: the other never waits, it goes on
/// without the index and says so, naming the index file (in `--json`, a
/// note in `plan.index.notes`; in text, on stderr). Both succeed, at most
/// one loses, and afterwards the index opens with no note (not corrupt),
/// every duplicate is shared with its bytes, and a run with
/// `--recheck-layouts` finds nothing left to do.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn two_runs_at_once_share_everything_and_one_goes_on_without_the_index() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut lost = 0;
    for fs in [x.path(), b.path()] {
        let ix = tempfile::tempdir().unwrap();
        let root = fs.join("race");
        let mut sets = round_tree(&root.join("whole"), 50);
        let t0 = std::time::Instant::now();
        json(&dedupe(ix.path(), &root));
        let whole = t0.elapsed();
        // The lock held (here by the test itself): the run goes on without
        // the index at once, says which, and still shares everything.
        {
            sets.extend(round_tree(&root.join("r0"), 49));
            let lock = cowlink_testfs::names(ix.path())
                .into_iter()
                .find(|n| n.ends_with(".lock"))
                .unwrap();
            let held = std::fs::File::open(ix.path().join(&lock)).unwrap();
            rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
            let out = bin()
                .args(["dedupe", "--index"])
                .arg(ix.path())
                .arg(&root)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            let said = text(&out.stderr);
            let file = ix.path().join(lock.replace(".lock", ".redb"));
            assert!(
                said.contains(&format!("index '{}' is in use by", file.display()))
                    && said.contains("this run goes on without it"),
                "{said}"
            );
            assert_shared(&sets, "with the lock held");
            drop(held);
        }
        for round in 1..=4u64 {
            sets.extend(round_tree(&root.join(format!("r{round}")), 50 + round));
            let offset = Duration::from_micros(rng.u64(0..=whole.as_micros() as u64));
            let what = format!("{fs:?} round {round}, second run {offset:?} later (seed {seed})");
            let first = bin()
                .args(["dedupe", "--json", "--index"])
                .arg(ix.path())
                .arg(&root)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(offset);
            let second = bin()
                .args(["dedupe", "--index"])
                .arg(ix.path())
                .arg(&root)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let (one, two) = (
                first.wait_with_output().unwrap(),
                second.wait_with_output().unwrap(),
            );
            let v = json(&one);
            assert!(two.status.success(), "{what}: {}", text(&two.stderr));
            assert_eq!(v["result"]["errors"], serde_json::json!([]), "{what}: {v}");
            let in_use = |s: &str| s.contains("is in use by") && s.contains("goes on without it");
            let notes: Vec<String> = v["plan"]["index"]["notes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect();
            let shown = ix.path().to_str().unwrap();
            for n in &notes {
                assert!(in_use(n) && n.contains(shown), "{what}: {n}");
            }
            let said = text(&two.stderr);
            let two_lost = in_use(&said);
            if two_lost {
                assert!(said.contains(shown), "{what}: {said}");
            }
            assert!(
                !two_lost || notes.is_empty(),
                "{what}: both went without the index: {notes:?} {said}"
            );
            lost += u32::from(two_lost) + u32::from(!notes.is_empty());

            let v = json(&dedupe(ix.path(), &root));
            assert_eq!(
                v["plan"]["index"]["notes"],
                serde_json::json!([]),
                "{what}: {v}"
            );
            assert_eq!(v["result"]["errors"], serde_json::json!([]), "{what}: {v}");
            assert_index_files(ix.path(), &what);
            assert_shared(&sets, &what);
            assert_recheck_finds_nothing(ix.path(), &root, &what);
        }
    }
    eprintln!("in {lost} of 8 rounds one run went on without the index");
}

/// A watch (root, fanotify) and manual runs on one index, on XFS: new
/// duplicates are written, then a manual run starts at a seeded random
/// offset, so it meets the watch's batch at different points (and the
/// watch starts with the lock held by the test). Both share
/// everything; whichever finds the lock held goes on without the index
/// and names it; after SIGTERM (exit 0) the index opens with no note and
/// a `--recheck-layouts` run finds nothing left.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_watch_and_a_manual_run_share_one_index() {
    let x = testfs!(Xfs);
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let ix = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let root = x.path().join("watched");
    let mut sets = round_tree(&root.join("r0"), 80);
    let (out, err) = (logs.path().join("out"), logs.path().join("err"));
    // The start batch meets the index's lock held (by the test): it goes
    // on without the index and says so, naming it.
    json(&dedupe(ix.path(), &root.join("r0")));
    let lock = cowlink_testfs::names(ix.path())
        .into_iter()
        .find(|n| n.ends_with(".lock"))
        .unwrap();
    let held = std::fs::File::open(ix.path().join(&lock)).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    // Killed if an assertion fails first.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut watch = Stop(
        bin()
            .args(["dedupe", "--watch", "--quiet-period", "200ms", "--index"])
            .arg(ix.path())
            .arg(&root)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
    );
    let said = || {
        let mut s = std::fs::read_to_string(&out).unwrap_or_default();
        s += &std::fs::read_to_string(&err).unwrap_or_default();
        s
    };
    let t0 = std::time::Instant::now();
    while !said().contains("start: every path") {
        assert!(watch.0.try_wait().unwrap().is_none(), "{}", said());
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", said());
        std::thread::sleep(Duration::from_millis(20));
    }
    let shown = ix.path().to_str().unwrap();
    let file = ix.path().join(lock.replace(".lock", ".redb"));
    assert!(
        said().contains(&format!("index '{}' is in use by", file.display())),
        "the watch's start batch did not say it went without the index: {}",
        said()
    );
    drop(held);
    let mut manual_lost = 0;
    for round in 1..=3u64 {
        let new = round_tree(&root.join(format!("r{round}")), 80 + round);
        let offset = Duration::from_micros(rng.u64(0..=600_000));
        let what = format!("round {round}, manual run {offset:?} after the writes (seed {seed})");
        std::thread::sleep(offset);
        let v = json(&dedupe(ix.path(), &root));
        for n in v["plan"]["index"]["notes"].as_array().unwrap() {
            let n = n.as_str().unwrap();
            assert!(
                n.contains("is in use by") && n.contains(shown),
                "{what}: {n}"
            );
            manual_lost += 1;
        }
        assert_eq!(v["result"]["errors"], serde_json::json!([]), "{what}: {v}");
        sets.extend(new);
        // The watch may be on its batch still: a second manual run
        // settles what either left.
        json(&dedupe(ix.path(), &root));
        assert_shared(&sets, &what);
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&watch.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = watch.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", said());
    let watch_lost = said()
        .lines()
        .filter(|l| l.contains("is in use by"))
        .count();
    for line in said().lines().filter(|l| l.contains("is in use by")) {
        assert!(line.contains(shown), "{line}");
    }
    eprintln!("the watch went without the index {watch_lost} times, the manual runs {manual_lost}");
    let v = json(&dedupe(ix.path(), &root));
    assert_eq!(v["plan"]["index"]["notes"], serde_json::json!([]), "{v}");
    assert_index_files(ix.path(), "after the watch");
    assert_recheck_finds_nothing(ix.path(), &root, "after the watch");
    assert_shared(&sets, "after the watch");
}

/// A run that maps every indexed file again (`--recheck-layouts`) plans
/// and shares nothing: every claim the index holds is true.
fn assert_recheck_finds_nothing(ix: &Path, root: &Path, what: &str) {
    let out = bin()
        .args(["dedupe", "--json", "--recheck-layouts", "--index"])
        .arg(ix)
        .arg(root)
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["plan"]["groups"], serde_json::json!([]), "{what}: {v}");
    assert_eq!(v["result"]["targets_deduped"], 0, "{what}: {v}");
}

/// `cp --reflink=always from to`: `to` on `from`'s blocks.
fn reflink(from: &Path, to: &Path) {
    let out = std::process::Command::new("cp")
        .arg("--reflink=always")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(out.status.success(), "cp: {}", text(&out.stderr));
}

/// One attempt of [`a_kill_between_two_clones_moved_leaves_no_stale_claim`];
/// `false` when the kill did not land between the two clones' sharing.
/// With `lock_held`, the index is in use (its lock held by the test)
/// while the killed run goes: that run shares without the index.
fn kill_between_two_clones(fs: &Path, seed: u64, lock_held: bool) -> bool {
    let ix = tempfile::tempdir().unwrap();
    let root = fs.join(format!("kill-clones-{seed}"));
    let (p, q) = (root.join("p"), root.join("q"));
    std::fs::create_dir_all(&p).unwrap();
    std::fs::create_dir_all(&q).unwrap();
    // Large enough that the kernel's compare of one takes a while.
    let bytes = data(64 << 20, seed);
    let (a, z) = (p.join("a"), p.join("z"));
    write_file(&a, &bytes);
    reflink(&a, &z);
    // Indexed as one cluster: a and z on the same blocks.
    json(&dedupe(ix.path(), &root));
    let s = [q.join("s0"), q.join("s1"), q.join("s2")];
    write_file(&s[0], &bytes);
    reflink(&s[0], &s[1]);
    reflink(&s[0], &s[2]);
    let held = lock_held.then(|| {
        let lock = cowlink_testfs::names(ix.path())
            .into_iter()
            .find(|n| n.ends_with(".lock"))
            .unwrap();
        let held = std::fs::File::open(ix.path().join(&lock)).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        held
    });
    // The larger cluster is the source: a and z are both targets.
    let mut child = spawn_quiet(ix.path(), &root);
    let mut landed = false;
    loop {
        let moved = [&a, &z].map(|t| same_blocks(t, &s[0]));
        if moved[0] != moved[1] {
            let _ = child.kill(); // SIGKILL
            landed = true;
            break;
        }
        if moved[0] || child.try_wait().unwrap().is_some() {
            break;
        }
    }
    child.wait().unwrap();
    drop(held);
    let moved = [&a, &z].map(|t| same_blocks(t, &s[0]));
    if !landed || moved[0] == moved[1] {
        std::fs::remove_dir_all(&root).unwrap();
        return false;
    }
    eprintln!(
        "seed {seed}: killed with a moved: {}, z moved: {}",
        moved[0], moved[1]
    );
    // A rerun over the pair alone, trusting every indexed layout whose
    // file is unchanged (a and z are: a dedupe keeps times and size).
    let opts = cowlink::dedupe::DedupeOptions {
        index: Some(ix.path().to_path_buf()),
        layout_recheck: cowlink::dedupe::LayoutRecheck::Never,
        ..Default::default()
    };
    let (plan, report) = cowlink::dedupe::dedupe(&[&p], &opts).unwrap();
    assert!(plan.errors.is_empty() && report.errors.is_empty());
    assert_eq!(std::fs::read(&a).unwrap(), bytes);
    assert_eq!(std::fs::read(&z).unwrap(), bytes);
    assert!(
        same_blocks(&a, &z),
        "seed {seed}: a kill -9 between sharing a and z left them apart, \
         and the index's claim that they share (their layouts before the \
         killed run) kept them so: {plan:?}"
    );
    std::fs::remove_dir_all(&root).unwrap();
    true
}

/// Two clones indexed as sharing their blocks are both targets of a run
/// killed (kill -9) after the kernel moved one onto the source and
/// before the other: the index must not keep claiming the pair shares,
/// or every later run leaves those equal files apart. Seeded; retried
/// until the kill lands between the two (at most ten tries).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_kill_between_two_clones_moved_leaves_no_stale_claim() {
    let x = testfs!(Xfs);
    kill_between_two_clones_within_ten_tries(x.path(), false);
}

/// [`kill_between_two_clones`] from the run's seed on, until a kill lands
/// between the two clones' sharing (at most ten tries).
fn kill_between_two_clones_within_ten_tries(dir: &Path, in_use: bool) {
    let first = seed() % 1_000_000;
    for seed in first..first + 10 {
        if kill_between_two_clones(dir, seed, in_use) {
            return;
        }
    }
    panic!("no kill landed between the two clones' sharing in ten tries");
}

/// As [`a_kill_between_two_clones_moved_leaves_no_stale_claim`], but the
/// killed run found the index in use and went on without it: it could
/// not mark the index, yet it moved one clone behind it.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_kill_of_a_run_without_the_index_in_use_leaves_no_stale_claim() {
    let x = testfs!(Xfs);
    kill_between_two_clones_within_ten_tries(x.path(), true);
}

/// A path given as a symbolic link to a directory is deduplicated as the
/// directory, and its rerun through the link reads nothing; a link to
/// nothing, a link to a file and a FIFO given next to it are each named
/// on stderr with the reason, and the run fails (exit 1) after sharing
/// the rest.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_given_link_to_a_directory_is_walked_and_odd_paths_are_named() {
    let x = testfs!(Xfs);
    let root = x.path().join("t");
    std::fs::create_dir_all(root.join("real/sub")).unwrap();
    let bytes = data(70_000, 9);
    for f in ["a", "b", "sub/c"] {
        write_file(&root.join("real").join(f), &bytes);
    }
    std::os::unix::fs::symlink("real", root.join("link")).unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("real/a", root.join("to-file")).unwrap();
    let fifo = root.join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let ix = tempfile::tempdir().unwrap();
    let run = |paths: &[&str]| {
        let mut c = bin();
        c.args(["dedupe", "--index"]).arg(ix.path());
        for p in paths {
            c.arg(root.join(p));
        }
        c.output().unwrap()
    };
    let out = run(&["link"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("3 files scanned") && said.contains("2 files deduplicated"),
        "{said}"
    );
    let real = root.join("real");
    assert!(same_blocks(&real.join("a"), &real.join("b")));
    assert!(same_blocks(&real.join("a"), &real.join("sub/c")));
    let out = run(&["link"]);
    assert!(
        text(&out.stdout).contains("index: 3 files not read (unchanged)"),
        "{}",
        text(&out.stdout)
    );

    let out = run(&["dangling", "link", "to-file", "fifo"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    for (name, why) in [
        ("dangling", "a symbolic link to nothing"),
        ("to-file", "a symbolic link to a file"),
        ("fifo", "neither a regular file nor a directory"),
    ] {
        assert!(
            err.lines()
                .any(|l| l.contains(&format!("/t/{name}'")) && l.contains(why)),
            "{name}: {err}"
        );
    }
    assert!(
        text(&out.stdout).contains("3 files scanned"),
        "{}",
        text(&out.stdout)
    );
}

/// A first run's tree for [`a_signal_at_any_point_of_a_first_run_leaves_no_claim_a_trusting_run_keeps`]:
/// 600 contents of 4 to 20 KiB, each written in three of eight
/// directories drawn at random (1,800 files: an index its first run
/// rewrites at its end), not synced.
fn spread_tree(dir: &Path, seed: u64) -> Vec<(Vec<PathBuf>, Vec<u8>)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let dirs: Vec<PathBuf> = (0..8).map(|d| dir.join(format!("d{d}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    (0..600u64)
        .map(|i| {
            let bytes = data(4096 + (i as usize * 613) % (16 << 10), seed * 1000 + i);
            let mut paths = Vec::new();
            while paths.len() < 3 {
                let p = dirs[rng.usize(..dirs.len())].join(format!("f{i}-{}", paths.len()));
                std::fs::write(&p, &bytes).unwrap();
                paths.push(p);
            }
            (paths, bytes)
        })
        .collect()
}

/// A library run over `dir` that trusts every indexed layout while its
/// file's identity holds (`LayoutRecheck::Never`, which the command does
/// not offer): what the index claims is all it knows.
fn trusting_run(
    ix: &Path,
    dir: &Path,
    what: &str,
) -> (cowlink::dedupe::DedupePlan, cowlink::dedupe::DedupeReport) {
    let opts = cowlink::dedupe::DedupeOptions {
        index: Some(ix.to_path_buf()),
        layout_recheck: cowlink::dedupe::LayoutRecheck::Never,
        ..cowlink::dedupe::DedupeOptions::default()
    };
    let (p, r) = cowlink::dedupe::dedupe(&[dir], &opts).unwrap();
    assert!(p.errors.is_empty(), "{what}: {:?}", p.errors);
    assert!(r.errors.is_empty(), "{what}: {:?}", r.errors);
    let notes = &p.index.as_ref().expect("an index report").notes;
    assert!(notes.is_empty(), "{what}: {notes:?}");
    (p, r)
}

/// A second Ctrl-C while a first run copies its index (into
/// `<key>.redb.new`, renamed over the old file once whole) exits at once
/// and takes the copy with it: the index's directory holds only the
/// database and its lock, and a run trusting the index then leaves every
/// duplicate shared. 2,000 directories of three files make the copy last
/// long enough (13 ms in a release build) for both signals, 3 ms apart
/// (two at once are delivered as one), to land while it is there; tried
/// until that happened three times.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_second_ctrl_c_while_the_index_is_copied_leaves_no_copy_behind() {
    use rustix::process::{kill_process, Pid, Signal};
    let x = testfs!(Xfs);
    let mut landed = 0;
    for attempt in 0..12u64 {
        let dir = x.path().join(format!("copy-cut-{attempt}"));
        let sets: Vec<(Vec<PathBuf>, Vec<u8>)> = (0..2000u64)
            .map(|d| {
                let bytes = data(4096, attempt * 10_000 + d);
                let sub = dir.join(format!("d{d:04}"));
                let paths: Vec<PathBuf> = (0..3).map(|k| sub.join(format!("f{k}"))).collect();
                std::fs::create_dir_all(&sub).unwrap();
                for p in &paths {
                    std::fs::write(p, &bytes).unwrap();
                }
                (paths, bytes)
            })
            .collect();
        rustix::fs::syncfs(std::fs::File::open(&dir).unwrap()).unwrap();
        let ix = tempfile::tempdir().unwrap();
        let copying = || {
            cowlink_testfs::names(ix.path())
                .iter()
                .any(|n| n.ends_with(".redb.new"))
        };
        let mut child = spawn_quiet(ix.path(), &dir);
        let pid = Pid::from_child(&child);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut hit = false;
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            if copying() {
                let _ = kill_process(pid, Signal::INT);
                std::thread::sleep(Duration::from_millis(3));
                hit = copying();
                let _ = kill_process(pid, Signal::INT);
                break;
            }
        }
        let status = child.wait().unwrap();
        let what = format!("attempt {attempt}: {status:?}, copy there at the second signal: {hit}");
        assert!(matches!(status.code(), Some(0 | 130)), "{what}");
        assert_index_files(ix.path(), &what);
        trusting_run(ix.path(), &dir, &what);
        assert_shared(&sets, &what);
        std::fs::remove_dir_all(&dir).unwrap();
        landed += u32::from(hit && status.code() == Some(130));
        if landed == 3 {
            return;
        }
    }
    panic!("the second signal landed during the copy only {landed} times in 12");
}

/// SIGKILL, SIGINT or SIGTERM (drawn from a seeded RNG) at a random
/// point of a first run over 1,800 files (from the walk to the index's
/// rewrite at the run's end, where the layouts learnt while sharing go
/// into the copy), on XFS and Btrfs, each with an index of its own.
/// Then a run that trusts the index wholly: it must leave every
/// duplicate shared (no claim of the stopped run made it skip a file it
/// had to read, or take two files for shared), leave only the database
/// and its lock in the index's directory, and a run after it must read,
/// plan, share and write nothing.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_signal_at_any_point_of_a_first_run_leaves_no_claim_a_trusting_run_keeps() {
    use rustix::process::Signal;
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    for fs in [x.path(), b.path()] {
        let root = fs.join(format!("signals-{seed}"));
        // A whole first run, timed: the signals are drawn over its length.
        let timing = root.join("timing");
        spread_tree(&timing, 0);
        let ix = tempfile::tempdir().unwrap();
        let t0 = std::time::Instant::now();
        let v = json(&dedupe(ix.path(), &timing));
        let whole = t0.elapsed();
        assert_eq!(v["result"]["targets_deduped"], 1200, "{v}");
        eprintln!("{fs:?}: a whole first run took {whole:?}");
        for round in 1..=4u64 {
            let dir = root.join(format!("r{round}"));
            let sets = spread_tree(&dir, round);
            let ix = tempfile::tempdir().unwrap();
            let sig = [Signal::KILL, Signal::INT, Signal::TERM][rng.usize(..3)];
            let us = whole.as_micros() as u64;
            let delay = Duration::from_micros(rng.u64(us / 10..=us * 11 / 10));
            let what = format!("{fs:?} round {round}, {sig:?} after {delay:?} (seed {seed})");
            let mut child = spawn_quiet(ix.path(), &dir);
            std::thread::sleep(delay);
            let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&child), sig);
            let status = child.wait().unwrap();
            if sig != Signal::KILL {
                // 130 when cancelled, 0 when it had finished; killed by
                // the signal only before its handler was set.
                use std::os::unix::process::ExitStatusExt;
                assert!(
                    matches!(status.code(), Some(0 | 130)) || status.signal() == Some(sig.as_raw()),
                    "{what}: {status:?}"
                );
            }
            // A `.redb.new` left by a kill during the rewrite is the
            // next opener's to remove.
            trusting_run(ix.path(), &dir, &what);
            assert_index_files(ix.path(), &what);
            assert_shared(&sets, &what);
            let firsts: Vec<Vec<(u64, u64)>> = sets
                .iter()
                .map(|(p, _)| cowlink::extents::extents(&p[0]).unwrap().physical_runs())
                .collect();
            let mut distinct = firsts.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(
                distinct.len(),
                firsts.len(),
                "{what}: different files on the same blocks"
            );
            let (p, r) = trusting_run(ix.path(), &dir, &what);
            let got = p.index.as_ref().unwrap();
            assert_eq!(p.bytes_hashed, 0, "{what}: {p:?}");
            assert!(p.groups.is_empty(), "{what}: {:?}", p.groups);
            assert_eq!(r.targets_deduped, 0, "{what}");
            assert_eq!(got.written, 0, "{what}: {got:?}");
            assert_eq!(got.unchanged, p.candidates, "{what}: {p:?}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// Paths as users give them: one that is not UTF-8 with an index (the
/// index's lock file names the command line: it once panicked there),
/// bare file names in the working directory (their directory is `.`,
/// not the empty path), and the index's own database named as a path
/// (left alone, as inside a walked directory).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn odd_paths_an_index_database_given_as_a_path_and_bare_names() {
    use std::os::unix::ffi::OsStrExt;
    let d = testfs!(Xfs);
    let ix = d.path().join("ix");
    let bad = d.path().join(std::ffi::OsStr::from_bytes(b"bad\xff\nname"));
    std::fs::create_dir_all(&bad).unwrap();
    let bytes = data(70_000, 7);
    write_file(&bad.join("a"), &bytes);
    write_file(&bad.join("b"), &bytes);
    let v = json(&dedupe(&ix, &bad));
    assert_eq!(v["result"]["targets_deduped"], 1, "{v}");
    assert!(same_blocks(&bad.join("a"), &bad.join("b")));

    let db = std::fs::read_dir(&ix)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "redb"))
        .expect("an index database");
    let copy = d.path().join("copy.redb");
    std::fs::write(&copy, std::fs::read(&db).unwrap()).unwrap();
    let out = bin()
        .args(["dedupe", "--json", "--index"])
        .arg(&ix)
        .arg(&db)
        .arg(&copy)
        .arg(&bad)
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["plan"]["files_scanned"], 3, "{v}");
    assert!(!same_blocks(&db, &copy), "the index's database was shared");

    let here = d.path().join("here");
    std::fs::create_dir_all(&here).unwrap();
    write_file(&here.join("x"), &bytes);
    write_file(&here.join("y"), &bytes);
    let out = bin()
        .current_dir(&here)
        .args(["dedupe", "--json", "--no-index", "x", "y"])
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["result"]["targets_deduped"], 1, "{v}");
    assert!(same_blocks(&here.join("x"), &here.join("y")));
}

/// Give tree `t` and index directory `ix` (made here) to `nobody`, open
/// `top` to all, and return a run of `cowlink dedupe --json --index IX T`
/// as `nobody`.
fn nobodys<'a>(top: &Path, t: &'a Path, ix: &'a Path) -> impl Fn() -> Output + 'a {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(ix).unwrap();
    let st = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(t)
        .arg(ix)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    move || {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_cowlink"))
            .args(["dedupe", "--json", "--index"])
            .arg(ix)
            .arg(t)
            .output()
            .unwrap()
    }
}

/// The entries the index kept in `ix` holds (its one database).
fn entries_in(ix: &Path) -> u64 {
    let db = std::fs::read_dir(ix)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "redb"))
        .expect("an index database");
    cowlink::dedupe::index::stats(&db).unwrap().0
}

/// Pruning where the walk sees less than the tree: a tree whose files
/// were all removed or emptied (no file met, so no index was needed to
/// look one up), a tree recorded through a symbolic link or with `..` in
/// its root and walked later by its own path, and a directory the run
/// may not read (as `nobody`), whose entries stay while it cannot be
/// read, with those below it.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn pruning_when_the_walk_meets_no_file_a_link_or_a_closed_directory() {
    use std::os::unix::fs::PermissionsExt;
    let d = testfs!(Xfs);
    let top = d.path();
    let mk = |root: &Path, files: &[(&str, usize)]| {
        for (i, (name, size)) in files.iter().enumerate() {
            let p = root.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            write_file(&p, &data(*size, 40 + i as u64));
        }
    };
    let run = |ix: &Path, root: &Path| {
        let out = dedupe(ix, root);
        json(&out)
    };

    // No file met: every file removed, then the only file emptied.
    let (t, ix) = (top.join("none"), top.join("ix-none"));
    mk(&t, &[("a", 100), ("s/b", 5000), ("s/c", 5000)]);
    run(&ix, &t);
    assert_eq!(entries_in(&ix), 3);
    std::fs::remove_file(t.join("a")).unwrap();
    std::fs::remove_dir_all(t.join("s")).unwrap();
    let v = run(&ix, &t);
    assert_eq!(v["plan"]["index"]["pruned"], 3, "{v}");
    assert_eq!(entries_in(&ix), 0);
    mk(&t, &[("x", 5000)]);
    run(&ix, &t);
    assert_eq!(entries_in(&ix), 1);
    std::fs::File::options()
        .write(true)
        .open(t.join("x"))
        .unwrap()
        .set_len(0)
        .unwrap();
    run(&ix, &t);
    assert_eq!(entries_in(&ix), 0);

    // Recorded through a link, walked by the real path; and with `..`.
    let (t, ix) = (top.join("real"), top.join("ix-link"));
    mk(&t, &[("d/f1", 5000), ("d/s/f2", 5000)]);
    let link = top.join("link");
    std::os::unix::fs::symlink(&t, &link).unwrap();
    run(&ix, &link);
    assert_eq!(entries_in(&ix), 2);
    std::fs::remove_dir_all(t.join("d/s")).unwrap();
    std::fs::remove_file(&link).unwrap();
    run(&ix, &t);
    assert_eq!(
        entries_in(&ix),
        1,
        "the entry recorded through the link stays"
    );
    let (t, ix) = (top.join("dots"), top.join("ix-dots"));
    mk(&t, &[("d/f1", 5000), ("d/s/f2", 5000)]);
    run(&ix, &t);
    std::fs::remove_dir_all(t.join("d/s")).unwrap();
    run(&ix, &t.join("d/.."));
    assert_eq!(entries_in(&ix), 1, "the root given with `..`");
    // Walked both ways in one run: recorded once, nothing written again.
    mk(&t, &[("d/s/f2", 6000)]);
    run(&ix, &t);
    let v = json(
        &bin()
            .args(["dedupe", "--json", "--index"])
            .arg(&ix)
            .arg(&t)
            .arg(t.join("d/.."))
            .output()
            .unwrap(),
    );
    assert_eq!(v["plan"]["index"]["written"], 0, "{v}");
    assert_eq!(entries_in(&ix), 2);

    // A directory `nobody` may not read keeps its entries, and those
    // below it; read again, nothing was lost.
    let (t, ix) = (top.join("closed"), top.join("ix-closed"));
    mk(
        &t,
        &[
            ("a/f1", 5000),
            ("a/f2", 5001),
            ("a/s/f1", 5002),
            ("a/s/f2", 5003),
            ("b/f1", 5004),
            ("b/f2", 5005),
        ],
    );
    let as_nobody = nobodys(top, &t, &ix);
    let out = as_nobody();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(entries_in(&ix), 6);
    std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = as_nobody();
    assert!(!out.status.success(), "the closed directory is an error");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["index"]["pruned"], 0, "{v}");
    assert_eq!(entries_in(&ix), 6);
    std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_nobody();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["index"]["written"], 0, "read again, as held: {v}");
    assert_eq!(entries_in(&ix), 6);
}

/// Unmounts a bind mount the test made, when dropped.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// What a run does not see whole stays in the index: a directory listed
/// but not searchable (as `nobody`: each file's `statx` refused), and an
/// `--exclude`d directory; after either, a full run writes nothing again.
/// A directory met under two paths (a bind mount inside the tree) is
/// recorded under one of them, so a rerun writes nothing either.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn what_the_walk_does_not_see_whole_is_kept_and_a_bind_mount_written_once() {
    use std::os::unix::fs::PermissionsExt;
    let d = testfs!(Xfs);
    let top = d.path();
    let mk = |root: &Path, names: &[&str]| {
        for (i, name) in names.iter().enumerate() {
            let p = root.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            write_file(&p, &data(5000 + i, 60 + i as u64));
        }
    };
    let index = |v: &serde_json::Value, what: &str| v["plan"]["index"][what].clone();

    // Listed, not searchable.
    let (t, ix) = (top.join("listed"), top.join("ix-listed"));
    mk(&t, &["a/f1", "a/f2", "b/f1", "b/f2"]);
    let as_nobody = nobodys(top, &t, &ix);
    json(&as_nobody());
    assert_eq!(entries_in(&ix), 4);
    std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = as_nobody();
    assert!(!out.status.success(), "a file not examined is an error");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(index(&v, "pruned"), 0, "{v}");
    assert_eq!(entries_in(&ix), 4);
    std::fs::set_permissions(t.join("a"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let v = json(&as_nobody());
    assert_eq!(index(&v, "written"), 0, "{v}");

    // Excluded.
    let (t, ix) = (top.join("excl"), top.join("ix-excl"));
    mk(&t, &["s/f1", "s/f2", "k/f1"]);
    json(&dedupe(&ix, &t));
    let v = json(
        &bin()
            .args(["dedupe", "--json", "--exclude", "s", "--index"])
            .arg(&ix)
            .arg(&t)
            .output()
            .unwrap(),
    );
    assert_eq!(index(&v, "pruned"), 0, "{v}");
    assert_eq!(entries_in(&ix), 3);
    let v = json(&dedupe(&ix, &t));
    assert_eq!(index(&v, "written"), 0, "{v}");

    // One directory under two paths.
    let (t, ix) = (top.join("bound"), top.join("ix-bound"));
    mk(&t, &["a/f1", "a/f2"]);
    std::fs::create_dir_all(t.join("b/bnd")).unwrap();
    let st = std::process::Command::new("mount")
        .arg("--bind")
        .arg(t.join("a"))
        .arg(t.join("b/bnd"))
        .status()
        .unwrap();
    assert!(st.success(), "mount --bind");
    let _bound = Unmount(t.join("b/bnd"));
    json(&dedupe(&ix, &t));
    for _ in 0..3 {
        let v = json(&dedupe(&ix, &t));
        assert_eq!(index(&v, "written"), 0, "{v}");
    }
    assert_eq!(entries_in(&ix), 2);
}
