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
use cowlink_testfs::{temporaries, testfs, umask};

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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cancel_stops_promptly_and_leaves_only_complete_files() {
    let e = testfs!(Ext4);
    let (src, dst) = (e.path().join("src"), e.path().join("dst"));
    tree_of(&src, 20, 100, 20_000);
    let options = TreeOptions::archive();
    let seen = AtomicU64::new(0);
    let cancel = options.run.cancel.clone();
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn hardlinks_are_kept_only_when_asked() {
    let x = testfs!(Xfs);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dereference_follows_links_and_reports_loops() {
    let x = testfs!(Xfs);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn merging_into_an_existing_tree_refuses_or_replaces_files() {
    let b = testfs!(Btrfs);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn non_directory_sources_are_copied_as_one_entry() {
    let x = testfs!(Xfs);
    symlink("target-elsewhere", x.path().join("link")).unwrap();
    let report = copy_tree(
        x.path().join("link"),
        x.path().join("copy"),
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
        x.path().join("missing"),
        x.path().join("copy2"),
        &TreeOptions::default(),
        &Quiet,
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("source does not exist"), "{err}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_directory_where_a_file_is_needed_fails_that_entry_only() {
    let x = testfs!(Xfs);
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

/// A sparse file with `n` data segments of `seg` bytes, a hole between each.
fn sparse_file(p: &Path, n: u64, seg: usize) {
    let f = fs::File::create(p).unwrap();
    for i in 0..n {
        let off = i * 2 * seg as u64;
        std::os::unix::fs::FileExt::write_all_at(&f, &cowlink_testfs::data(seg, i + 1), off)
            .unwrap();
    }
}

/// ENOSPC in the middle of a data copy: neither the direct path (a
/// directory this run created) nor the atomic one (`--atomic`) leaves
/// anything under the final name, and the space comes back.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_failure_mid_transfer_leaves_no_name_direct_or_atomic() {
    let (x, small) = (testfs!(Xfs), testfs!(FillExt4));
    let src = x.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("small"), b"fits").unwrap();
    // 3 x 20 MiB of data with holes: no preallocation, so the copy runs
    // until the 48 MiB filesystem is full, mid-file.
    sparse_file(&src.join("big"), 3, 20 << 20);
    for atomic in [false, true] {
        let dst = small.path().join(format!("dst-{atomic}"));
        let options = TreeOptions {
            atomic,
            ..TreeOptions::archive()
        };
        let errors = Mutex::new(Vec::new());
        let observer = |ev: &TreeEvent<'_>| {
            if let TreeEvent::Failed(e) = ev {
                errors.lock().unwrap().push(e.kind());
            }
        };
        let report = copy_tree(&src, &dst, &options, &observer).unwrap();
        assert_eq!(report.errors, 1, "atomic={atomic}");
        assert_eq!(*errors.lock().unwrap(), [ErrorKind::NoSpace]);
        assert!(
            !dst.join("big").exists(),
            "no partial file (atomic={atomic})"
        );
        assert_eq!(fs::read(dst.join("small")).unwrap(), b"fits");
        assert!(temporaries(&dst).is_empty());
        fs::remove_dir_all(&dst).unwrap();
    }
}

/// A cancel while a large file is being copied: in a directory this run
/// created the file is visible under its name during the copy (direct
/// placement), and the cancel removes it.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_cancel_mid_transfer_removes_the_direct_file() {
    let e = testfs!(Ext4);
    let (src, dst) = (e.path().join("src"), e.path().join("dst"));
    fs::create_dir(&src).unwrap();
    sparse_file(&src.join("big"), 8, 64 << 20); // 512 MiB of data, copied in chunks
    let options = TreeOptions::archive();
    let cancel = options.run.cancel.clone();
    let target = dst.join("big");
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            // Wait until the copy has written something under the name.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while fs::metadata(&target).map_or(0, |m| m.blocks()) == 0
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            cancel.cancel();
        });
        copy_tree(&src, &dst, &options, &Quiet).unwrap()
    });
    assert!(report.cancelled);
    assert_eq!(report.files, 0);
    assert!(!target.exists(), "the partial file was removed");
    assert!(temporaries(&dst).is_empty());
}

/// A destination left by an interrupted run (a truncated file with the
/// wrong mtime, a file never written) is found and recopied by `resume`;
/// finished files are kept.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn resume_recopies_what_an_interrupted_run_left() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    tree_of(&src, 3, 10, 9000);
    let options = TreeOptions::archive();
    let first = copy_tree(&src, &dst, &options, &Quiet).unwrap();
    assert_eq!((first.files, first.errors), (30, 0));
    // Simulate the crash: one file half written with the time of the crash,
    // one never created.
    let half = dst.join("d1/f3");
    fs::OpenOptions::new()
        .write(true)
        .open(&half)
        .unwrap()
        .set_len(4000)
        .unwrap();
    let now = std::time::SystemTime::now();
    fs::File::open(&half).unwrap().set_modified(now).unwrap();
    fs::remove_file(dst.join("d2/f7")).unwrap();
    // Same size, wrong time: still not trusted.
    let same_size = dst.join("d0/f0");
    fs::write(&same_size, vec![0u8; 9000]).unwrap();

    let resume = TreeOptions {
        resume: true,
        ..TreeOptions::archive()
    };
    let again = copy_tree(&src, &dst, &resume, &Quiet).unwrap();
    assert_eq!(again.errors, 0);
    assert_eq!((again.files, again.skipped), (3, 27));
    for d in 0..3 {
        for f in 0..10 {
            let rel = format!("d{d}/f{f}");
            assert_eq!(
                fs::read(src.join(&rel)).unwrap(),
                fs::read(dst.join(&rel)).unwrap(),
                "{rel}"
            );
            let (a, b) = (
                fs::metadata(src.join(&rel)).unwrap(),
                fs::metadata(dst.join(&rel)).unwrap(),
            );
            assert_eq!(
                (a.mtime(), a.mtime_nsec()),
                (b.mtime(), b.mtime_nsec()),
                "{rel}"
            );
        }
    }
    // A third run has nothing left to do.
    let third = copy_tree(&src, &dst, &resume, &Quiet).unwrap();
    assert_eq!((third.files, third.skipped), (0, 30));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn overwrite_skip_keeps_existing_files_and_counts_them_in_the_report() {
    let x = testfs!(Xfs);
    let (src, dst) = (x.path().join("src"), x.path().join("dst"));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::create_dir_all(dst.join("sub")).unwrap();
    for name in ["a", "b", "sub/c", "sub/d"] {
        fs::write(src.join(name), format!("new {name}")).unwrap();
    }
    std::os::unix::fs::symlink("a", src.join("link")).unwrap();
    fs::write(dst.join("a"), "old a").unwrap();
    fs::write(dst.join("sub/c"), "old c").unwrap();
    std::os::unix::fs::symlink("elsewhere", dst.join("link")).unwrap();
    let mut options = TreeOptions::default();
    options.file.overwrite = cowlink::Overwrite::Skip;
    let skipped = std::sync::Mutex::new(Vec::new());
    let observer = |ev: &TreeEvent<'_>| {
        if let TreeEvent::Skipped { dst, reason, .. } = ev {
            assert_eq!(*reason, cowlink::tree::SkipReason::Exists);
            skipped.lock().unwrap().push(dst.to_path_buf());
        }
    };
    let report = copy_tree(&src, &dst, &options, &observer).unwrap();
    assert_eq!(report.skipped, 3, "{report:?}");
    assert_eq!(report.errors, 0, "{report:?}");
    assert_eq!(report.files, 2);
    assert_eq!(fs::read_to_string(dst.join("a")).unwrap(), "old a");
    assert_eq!(fs::read_to_string(dst.join("sub/c")).unwrap(), "old c");
    assert_eq!(
        fs::read_link(dst.join("link")).unwrap(),
        Path::new("elsewhere")
    );
    assert_eq!(fs::read_to_string(dst.join("b")).unwrap(), "new b");
    assert_eq!(fs::read_to_string(dst.join("sub/d")).unwrap(), "new sub/d");
    let mut seen = skipped.into_inner().unwrap();
    seen.sort();
    assert_eq!(seen, [dst.join("a"), dst.join("link"), dst.join("sub/c")]);

    // One file: the method says it was kept.
    let o = cowlink::clone_file(
        src.join("a"),
        dst.join("a"),
        &cowlink::CloneOptions {
            overwrite: cowlink::Overwrite::Skip,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(o.method, cowlink::Method::Skipped);
    assert_eq!(fs::read_to_string(dst.join("a")).unwrap(), "old a");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn default_mode_gives_new_entries_the_mode_new_files_get() {
    use std::os::unix::fs::PermissionsExt;
    let b = testfs!(Btrfs);
    let src = b.path().join("ro");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("f"), b"f").unwrap();
    fs::write(src.join("sub/g"), b"g").unwrap();
    fs::set_permissions(src.join("f"), fs::Permissions::from_mode(0o400)).unwrap();
    fs::set_permissions(src.join("sub/g"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o500)).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
    let u = umask();
    for atomic in [false, true] {
        let dst = b.path().join(format!("out-{atomic}"));
        let mut options = TreeOptions::default();
        options.file.default_mode = true;
        options.atomic = atomic;
        copy_tree(&src, &dst, &options, &Quiet).unwrap();
        assert_eq!(mode(&dst), 0o777 & !u);
        assert_eq!(mode(&dst.join("sub")), 0o777 & !u);
        assert_eq!(mode(&dst.join("f")), 0o666 & !u);
        assert_eq!(mode(&dst.join("sub/g")), 0o666 & !u);
        assert_eq!(fs::read(dst.join("sub/g")).unwrap(), b"g");
        // Without it: the source's bits, less the umask.
        let plain = b.path().join(format!("plain-{atomic}"));
        options.file.default_mode = false;
        copy_tree(&src, &plain, &options, &Quiet).unwrap();
        assert_eq!(mode(&plain.join("f")), 0o400);
        assert_eq!(mode(&plain.join("sub")), 0o500 & !u);
        fs::set_permissions(plain.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
    }
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn copy_contents_reads_fifos_and_new_dirs_stay_closed_until_done() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::set_permissions(src.join("sub"), fs::Permissions::from_mode(0o777)).unwrap();
    let fifo = src.join("sub/fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let dst = x.path().join("dst");
    let mut options = TreeOptions {
        copy_contents: true,
        ..Default::default()
    };
    options.file.preserve.mode = true;
    options.file.preserve.ownership = true;
    std::thread::scope(|s| {
        let copy = s.spawn(|| copy_tree(&src, &dst, &options, &Quiet));
        // The copy blocks on the FIFO inside dst/sub (until the write
        // below): with owners preserved, the group and others get nothing
        // in that directory meanwhile (it may be about to change hands).
        let sub = dst.join("sub");
        while fs::symlink_metadata(&sub).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mode = fs::metadata(&sub).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "dst/sub is {mode:o} while being filled");
        let mut writer = fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        writer.write_all(b"through ").unwrap();
        // Being written under its final name, the file carries the mark a
        // kill -9 would leave on it.
        let copied = sub.join("fifo");
        while fs::symlink_metadata(&copied).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mid = fs::symlink_metadata(&copied).unwrap().mode();
        assert!(cowlink::left_unfinished(0o100600, mid), "{mid:o}");
        writer.write_all(b"the pipe").unwrap();
        drop(writer);
        let report = copy.join().unwrap().unwrap();
        assert_eq!(report.files, 1);
    });
    let copied = dst.join("sub/fifo");
    assert!(fs::symlink_metadata(&copied).unwrap().file_type().is_file());
    assert_eq!(fs::read(&copied).unwrap(), b"through the pipe");
    assert!(!cowlink::left_unfinished(
        0o100600,
        fs::metadata(&copied).unwrap().mode()
    ));
    assert_eq!(fs::metadata(dst.join("sub")).unwrap().mode() & 0o777, 0o777);
    assert!(temporaries(&dst).is_empty());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_file_an_interrupted_run_left_is_copied_again_by_update_and_resume() {
    use std::os::unix::fs::PermissionsExt;
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    for name in ["partial", "edited"] {
        fs::write(src.join(name), vec![7u8; 300_000]).unwrap();
        fs::File::options()
            .write(true)
            .open(src.join(name))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    // What a kill -9 leaves: truncated, newer than its source, marked
    // (as a direct placement creates it). Beside it a destination edited
    // after the copy, newer too, which -u must keep.
    let leftover = |dst: &Path| {
        fs::create_dir_all(dst).unwrap();
        fs::write(dst.join("partial"), vec![7u8; 4096]).unwrap();
        fs::set_permissions(dst.join("partial"), fs::Permissions::from_mode(0o1644)).unwrap();
        fs::write(dst.join("edited"), b"kept").unwrap();
    };
    let check = |dst: &Path, edited: &[u8]| {
        assert_eq!(
            fs::read(dst.join("partial")).unwrap(),
            fs::read(src.join("partial")).unwrap()
        );
        let mode = fs::metadata(dst.join("partial")).unwrap().mode();
        assert!(!cowlink::left_unfinished(0o100644, mode), "{mode:o}");
        assert_eq!(fs::read(dst.join("edited")).unwrap(), edited);
    };
    let update = x.path().join("update");
    leftover(&update);
    let mut options = TreeOptions {
        update_older: true,
        ..Default::default()
    };
    options.file.overwrite = Overwrite::Replace;
    let report = copy_tree(&src, &update, &options, &Quiet).unwrap();
    assert_eq!((report.files, report.skipped), (1, 1));
    check(&update, b"kept");
    // --resume: even with the source's size and mtime, a marked file is
    // not complete.
    let resume = x.path().join("resume");
    leftover(&resume);
    fs::write(resume.join("partial"), vec![0u8; 300_000]).unwrap();
    fs::File::options()
        .write(true)
        .open(resume.join("partial"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let mut options = TreeOptions::archive();
    options.resume = true;
    copy_tree(&src, &resume, &options, &Quiet).unwrap();
    check(&resume, &fs::read(src.join("edited")).unwrap());
}
