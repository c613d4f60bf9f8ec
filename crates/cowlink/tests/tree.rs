//! `copy_tree` through the library on the real test filesystems: cancel
//! token, hardlink and dereference options, merging into an existing tree,
//! single-entry sources, events.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cowlink::tree::{copy_tree, Quiet, TreeEvent, TreeOptions};
use cowlink::{ErrorKind, Overwrite};
use cowlink_testfs::{temporaries, testfs};

fn tree_of(dir: &Path, dirs: usize, files: usize, len: usize) {
    for d in 0..dirs {
        let sub = dir.join(format!("d{d}"));
        fs::create_dir_all(&sub).unwrap();
        for f in 0..files {
            fs::write(sub.join(format!("f{f}")), vec![(d * 7 + f) as u8; len]).unwrap();
        }
    }
}

#[test]
fn cancel_stops_promptly_and_leaves_only_complete_files() {
    let Some(e) = testfs!(Ext4) else { return };
    let (src, dst) = (e.path().join("src"), e.path().join("dst"));
    tree_of(&src, 20, 100, 20_000);
    let options = TreeOptions::archive();
    let seen = AtomicU64::new(0);
    let cancel = options.cancel.clone();
    let observer = |ev: &TreeEvent<'_>| {
        if let TreeEvent::File { .. } = ev {
            if seen.fetch_add(1, Ordering::SeqCst) + 1 == 100 {
                cancel.cancel();
            }
        }
    };
    let report = copy_tree(&src, &dst, &options, &observer).unwrap();
    assert!(report.cancelled);
    // Each worker finishes at most the entry it is on.
    assert!(
        (100..=110).contains(&report.files),
        "{} files after cancel",
        report.files
    );
    let mut present = 0;
    for d in fs::read_dir(&dst).unwrap() {
        for f in fs::read_dir(d.unwrap().path()).unwrap() {
            let f = f.unwrap().path();
            let orig = src.join(f.strip_prefix(&dst).unwrap());
            assert_eq!(fs::read(&orig).unwrap(), fs::read(&f).unwrap());
            present += 1;
        }
    }
    assert_eq!(present, report.files);
    assert!(temporaries(&dst).is_empty());
}

#[test]
fn hardlinks_are_kept_only_when_asked() {
    let Some(x) = testfs!(Xfs) else { return };
    let src = x.path().join("src");
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("b")).unwrap();
    fs::write(src.join("a/one"), vec![1u8; 10_000]).unwrap();
    fs::hard_link(src.join("a/one"), src.join("b/two")).unwrap();
    fs::hard_link(src.join("a/one"), src.join("a/three")).unwrap();

    let linked = x.path().join("linked");
    let report = copy_tree(&src, &linked, &TreeOptions::archive(), &Quiet).unwrap();
    assert_eq!((report.files, report.hardlinks, report.errors), (1, 2, 0));
    let ino = fs::metadata(linked.join("a/one")).unwrap().ino();
    assert_eq!(fs::metadata(linked.join("b/two")).unwrap().ino(), ino);
    assert_eq!(fs::metadata(linked.join("a/three")).unwrap().ino(), ino);
    assert_eq!(fs::metadata(linked.join("a/one")).unwrap().nlink(), 3);

    let separate = x.path().join("separate");
    let report = copy_tree(&src, &separate, &TreeOptions::default(), &Quiet).unwrap();
    assert_eq!((report.files, report.hardlinks), (3, 0));
    assert_eq!(fs::metadata(separate.join("a/one")).unwrap().nlink(), 1);
    assert_eq!(fs::read(separate.join("b/two")).unwrap(), vec![1u8; 10_000]);
}

#[test]
fn dereference_follows_links_and_reports_loops() {
    let Some(x) = testfs!(Xfs) else { return };
    let src = x.path().join("src");
    fs::create_dir_all(src.join("real")).unwrap();
    fs::write(src.join("real/file"), b"data").unwrap();
    symlink("real", src.join("via-link")).unwrap();
    symlink("..", src.join("real/up")).unwrap();
    let failures = Mutex::new(Vec::new());
    let observer = |ev: &TreeEvent<'_>| {
        if let TreeEvent::Failed(e) = ev {
            failures.lock().unwrap().push((e.kind(), e.to_string()));
        }
    };
    let options = TreeOptions {
        dereference: true,
        ..TreeOptions::default()
    };
    let dst = x.path().join("dst");
    let report = copy_tree(&src, &dst, &options, &observer).unwrap();
    assert_eq!(fs::read(dst.join("via-link/file")).unwrap(), b"data");
    assert!(!fs::symlink_metadata(dst.join("via-link"))
        .unwrap()
        .is_symlink());
    // real/up and via-link/up both lead back to the root.
    let failures = failures.into_inner().unwrap();
    assert_eq!(report.errors, 2, "{failures:?}");
    assert!(failures
        .iter()
        .all(|(k, m)| *k == ErrorKind::InvalidInput && m.contains("symbolic link loop")));

    // Without -L the links stay links.
    let plain = x.path().join("plain");
    copy_tree(&src, &plain, &TreeOptions::default(), &Quiet).unwrap();
    assert_eq!(
        fs::read_link(plain.join("real/up")).unwrap(),
        Path::new("..")
    );
}

#[test]
fn merging_into_an_existing_tree_refuses_or_replaces_files() {
    let Some(b) = testfs!(Btrfs) else { return };
    let src = b.path().join("src");
    tree_of(&src, 2, 3, 5000);
    let dst = b.path().join("dst");
    fs::create_dir_all(dst.join("d0")).unwrap();
    fs::write(dst.join("d0/f1"), b"old").unwrap();
    fs::hard_link(dst.join("d0/f1"), b.path().join("outside-link")).unwrap();

    let failed = Mutex::new(Vec::new());
    let observer = |ev: &TreeEvent<'_>| {
        if let TreeEvent::Failed(e) = ev {
            failed
                .lock()
                .unwrap()
                .push((e.kind(), e.dst().unwrap().to_path_buf()));
        }
    };
    let report = copy_tree(&src, &dst, &TreeOptions::default(), &observer).unwrap();
    assert_eq!((report.files, report.errors), (5, 1));
    assert_eq!(
        failed.into_inner().unwrap(),
        vec![(ErrorKind::AlreadyExists, dst.join("d0/f1"))]
    );
    assert_eq!(fs::read(dst.join("d0/f1")).unwrap(), b"old");

    let mut replace = TreeOptions::default();
    replace.file.overwrite = Overwrite::Replace;
    let report = copy_tree(&src, &dst, &replace, &Quiet).unwrap();
    assert_eq!((report.files, report.errors), (6, 0));
    assert_eq!(fs::read(dst.join("d0/f1")).unwrap(), vec![1u8; 5000]);
    // The replaced file's other name keeps the old content.
    assert_eq!(fs::read(b.path().join("outside-link")).unwrap(), b"old");
    assert!(temporaries(&dst).is_empty());
}

#[test]
fn non_directory_sources_are_copied_as_one_entry() {
    let Some(x) = testfs!(Xfs) else { return };
    symlink("target-elsewhere", x.path().join("link")).unwrap();
    let report = copy_tree(
        &x.path().join("link"),
        &x.path().join("copy"),
        &TreeOptions::archive(),
        &Quiet,
    )
    .unwrap();
    assert_eq!(report.symlinks, 1);
    assert_eq!(
        fs::read_link(x.path().join("copy")).unwrap(),
        Path::new("target-elsewhere")
    );
    let err = copy_tree(
        &x.path().join("missing"),
        &x.path().join("copy2"),
        &TreeOptions::default(),
        &Quiet,
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("source does not exist"), "{err}");
}

#[test]
fn a_directory_where_a_file_is_needed_fails_that_entry_only() {
    let Some(x) = testfs!(Xfs) else { return };
    let src = x.path().join("src");
    tree_of(&src, 1, 2, 100);
    let dst = x.path().join("dst");
    fs::create_dir_all(dst.join("d0/f0")).unwrap();
    let errors = Mutex::new(Vec::new());
    let observer = |ev: &TreeEvent<'_>| {
        if let TreeEvent::Failed(e) = ev {
            errors.lock().unwrap().push(e.kind());
        }
    };
    let report = copy_tree(&src, &dst, &TreeOptions::default(), &observer).unwrap();
    assert_eq!(report.files, 1);
    assert_eq!(errors.into_inner().unwrap(), vec![ErrorKind::IsDirectory]);
    assert_eq!(fs::read(dst.join("d0/f1")).unwrap(), vec![1u8; 100]);
}
