//! The watch's parts on real filesystems: fanotify events come back as
//! the paths written (excluded ones and other directories dropped), a
//! rescan (what a queue overflow or a full pending set leads to) finds
//! duplicates no event named, and `--exclude` keeps the plain dedupe off
//! matching files and directories.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cowlink::dedupe::watch::{dedupe_batch, Changes, Pending, Rescan, Watcher};
use cowlink::dedupe::{dedupe, DedupeOptions, Exclude};
use cowlink::ErrorKind;
use cowlink_testfs::{data, testfs, write_file};

use crate::same_blocks;

/// Write `text` to `p` from another process: the watcher drops the
/// events its own process causes.
fn write_elsewhere(p: &Path, text: &str) {
    let st = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" > \"$2\"", "sh", text])
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Poll `w` (at most 30 s) until `pending` holds `want`.
fn until_pending(w: &mut Watcher, pending: &mut Pending, want: &Path) -> Changes {
    let start = Instant::now();
    let mut all = Changes::default();
    while !all.paths.iter().any(|p| p == want) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no event for {}: {all:?}",
            want.display()
        );
        w.poll(Duration::from_millis(100), pending).unwrap();
        let c = pending.take();
        assert_eq!(c.rescan, None, "{c:?}");
        all.paths.extend(c.paths);
    }
    all
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn events_name_the_files_written_under_the_root_and_not_excluded_ones() {
    let x = testfs!(Xfs);
    let root = fs::canonicalize(x.path()).unwrap().join("root");
    let outside = root.with_file_name("outside");
    fs::create_dir_all(root.join("keep/deep")).unwrap();
    fs::create_dir_all(root.join("cache")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    let exclude = Exclude::new(&["cache", "*.tmp"]).unwrap();
    let mut w = Watcher::new(&[&root], &exclude).unwrap();
    assert_eq!(w.roots(), vec![root.clone()]);
    let mut pending = Pending::new(1000);

    // This process's own writes are not events for it (written first, so
    // its event would come before the ones waited for).
    write_file(&root.join("keep/mine"), b"own");
    write_elsewhere(&outside.join("o"), "outside");
    write_elsewhere(&root.join("cache/c"), "excluded dir");
    write_elsewhere(&root.join("keep/x.tmp"), "excluded name");
    write_elsewhere(&root.join("keep/deep/f"), "kept");
    // Renamed into place: FAN_MOVED_TO names the new path.
    write_elsewhere(&root.join("keep/.part"), "renamed");
    let mv = std::process::Command::new("mv")
        .arg(root.join("keep/.part"))
        .arg(root.join("keep/done"))
        .status()
        .unwrap();
    assert!(mv.success());
    let got = until_pending(&mut w, &mut pending, &root.join("keep/done"));
    let mut got = got.paths;
    // The writes of the first file may come in a later read.
    if !got.contains(&root.join("keep/deep/f")) {
        got.extend(until_pending(&mut w, &mut pending, &root.join("keep/deep/f")).paths);
    }
    for p in &got {
        assert!(p.starts_with(&root), "outside the root: {}", p.display());
        assert!(
            !p.starts_with(root.join("cache")) && p.extension().is_none_or(|e| e != "tmp"),
            "excluded: {}",
            p.display()
        );
    }
    assert!(got.contains(&root.join("keep/.part")), "{got:?}");
    assert!(!got.contains(&root.join("keep/mine")), "{got:?}");

    // A root that is not a directory, or does not exist: named.
    let e = Watcher::new(&[root.join("nope")], &Exclude::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_rescan_after_lost_events_finds_duplicates_no_event_named() {
    let x = testfs!(Xfs);
    let a = x.path().join("a");
    let b = x.path().join("b");
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    let w = Watcher::new(&[&a, &b], &Exclude::default()).unwrap();
    let bytes = data(256 * 1024, 5);
    let (fa, fb) = (a.join("one"), b.join("two"));
    write_file(&fa, &bytes);
    write_file(&fb, &bytes);

    // A queue overflow (the kernel's queue cannot be made small, so the
    // loss is told to the pending set directly): the paths it held are
    // dropped and the batch covers every root.
    let mut pending = Pending::new(2);
    let now = Instant::now();
    pending.add(PathBuf::from("/not/related"), now);
    pending.rescan(Rescan::QueueOverflow, now);
    let changes = pending.take();
    assert_eq!(changes.rescan, Some(Rescan::QueueOverflow));
    assert!(changes.paths.is_empty());
    let roots = w.batch_roots(&changes);
    assert_eq!(roots.len(), 2, "{roots:?}");
    let (plan, report) = dedupe_batch(&roots, &changes, &DedupeOptions::default()).unwrap();
    assert_eq!(plan.groups.len(), 1, "{plan:?}");
    assert_eq!(report.targets_deduped, 1, "{report:?}");
    assert!(same_blocks(&fa, &fb));
    assert_eq!(fs::read(&fb).unwrap(), bytes);

    // A full pending set turns into the same rescan.
    let mut full = Pending::new(2);
    for i in 0..3 {
        full.add(a.join(format!("f{i}")), now);
    }
    assert_eq!(full.take().rescan, Some(Rescan::PendingFull));

    // Changed paths only: the roots on the changed filesystem (both here).
    let only = Changes {
        paths: vec![fa.clone()],
        rescan: None,
    };
    assert_eq!(w.batch_roots(&only).len(), 2);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn excluded_files_and_directories_are_never_sources_nor_targets() {
    let x = testfs!(Xfs);
    let root = x.path().join("r");
    for d in ["src", "build/out", "logs"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    let bytes = data(128 * 1024, 9);
    let names = ["src/a", "src/b", "build/out/c", "logs/d.tmp"];
    for n in names {
        write_file(&root.join(n), &bytes);
    }
    let opts = DedupeOptions {
        exclude: Exclude::new(&["build/out", "*.tmp"]).unwrap(),
        ..DedupeOptions::default()
    };
    let (plan, report) = dedupe(&[&root], &opts).unwrap();
    assert_eq!(plan.files_scanned, 2, "{plan:?}");
    assert_eq!(report.targets_deduped, 1, "{report:?}");
    assert!(same_blocks(&root.join("src/a"), &root.join("src/b")));
    for n in ["build/out/c", "logs/d.tmp"] {
        let e = cowlink::extents::extents(root.join(n)).unwrap().extents;
        assert!(e.iter().all(|x| !x.is_shared()), "{n} was touched");
        assert_eq!(fs::read(root.join(n)).unwrap(), bytes);
    }
}
