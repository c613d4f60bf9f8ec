//! Library behaviour on real, loop-mounted filesystems (scripts/testfs).
//!
//! Every test asserts effects: bytes equal, FIEMAP sharing and physical
//! offsets, metadata, typed errors, and that no file or temporary is left
//! behind where an operation failed.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cowlink::extents::{extents, Extent};
use cowlink::{
    clone_file, clone_range, probe, CloneOptions, ErrorKind, FsKind, LinkMode, Method, Overwrite,
    Placement, Preserve,
};
use cowlink_testfs::{data, names, testfs, umask, write_file};

fn opts(link: LinkMode) -> CloneOptions {
    CloneOptions {
        link,
        ..Default::default()
    }
}

fn physical(ext: &[Extent]) -> Vec<(u64, u64, u64)> {
    ext.iter()
        .map(|e| (e.logical, e.physical, e.length))
        .collect()
}

fn assert_clone_shares(dir: &Path) {
    let (a, b) = (dir.join("a"), dir.join("b"));
    let content = data(1 << 20, 1);
    write_file(&a, &content);
    let o = clone_file(&a, &b, &CloneOptions::default()).unwrap();
    assert_eq!(o.method, Method::Reflink);
    assert_eq!(o.bytes, 1 << 20);
    assert_eq!(fs::read(&b).unwrap(), content);
    let (ea, eb) = (extents(&a).unwrap().extents, extents(&b).unwrap().extents);
    assert!(!ea.is_empty());
    assert!(
        ea.iter().all(Extent::is_shared),
        "source extents not shared: {ea:?}"
    );
    assert!(
        eb.iter().all(Extent::is_shared),
        "clone extents not shared: {eb:?}"
    );
    assert_eq!(
        physical(&ea),
        physical(&eb),
        "clone must map to the same blocks"
    );

    // Writing the clone leaves the source intact, and the reverse.
    let mut f = fs::OpenOptions::new().write(true).open(&b).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"CLONE", 4096).unwrap();
    f.flush().unwrap();
    assert_eq!(fs::read(&a).unwrap(), content);
    let f2 = fs::OpenOptions::new().write(true).open(&a).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f2, b"SOURCE", 0).unwrap();
    let bb = fs::read(&b).unwrap();
    assert_eq!(&bb[4096..4101], b"CLONE");
    assert_eq!(&bb[..6], &content[..6]);
    drop(f);
    assert_eq!(names(dir), ["a", "b"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_clone_shares_extents_and_writes_stay_separate() {
    let d = testfs!(Xfs);
    assert_clone_shares(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_clone_shares_extents_and_writes_stay_separate() {
    let d = testfs!(Btrfs);
    assert_clone_shares(d.path());
}

/// On a filesystem without reflink: Auto copies identical bytes and says
/// how; Always fails with NotSupported and creates nothing.
fn assert_fallback(dir: &Path, same_fs_method: Method) {
    let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
    let content = data(3 << 20 | 123, 2);
    write_file(&a, &content);
    let o = clone_file(&a, &b, &opts(LinkMode::Auto)).unwrap();
    assert_eq!(o.method, same_fs_method);
    assert_eq!(fs::read(&b).unwrap(), content);
    let e = clone_file(&a, &c, &opts(LinkMode::Clone)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert!(e.to_string().contains("does not support reflink"), "{e}");
    let n = clone_file(&a, &c, &opts(LinkMode::Copy)).unwrap();
    assert_eq!(n.method, Method::ReadWrite);
    assert_eq!(fs::read(&c).unwrap(), content);
    assert_eq!(names(dir), ["a", "b", "c"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ext4_auto_copies_with_copy_file_range_and_always_fails() {
    let d = testfs!(Ext4);
    assert_fallback(d.path(), Method::CopyOffload);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn tmpfs_auto_copies_and_always_fails() {
    let d = testfs!(Tmpfs);
    // tmpfs accepts copy_file_range within itself too.
    assert_fallback(d.path(), Method::CopyOffload);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_to_btrfs_auto_copies_always_is_cross_device() {
    let (x, b) = (testfs!(Xfs), testfs!(Btrfs));
    let src = x.path().join("src");
    let content = data(2 << 20, 3);
    write_file(&src, &content);
    let o = clone_file(&src, b.path().join("auto"), &opts(LinkMode::Auto)).unwrap();
    assert_ne!(o.method, Method::Reflink);
    assert_eq!(fs::read(b.path().join("auto")).unwrap(), content);
    let e = clone_file(&src, b.path().join("always"), &opts(LinkMode::Clone)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CrossDevice);
    assert!(
        e.to_string()
            .contains("different filesystems (xfs → btrfs)"),
        "{e}"
    );
    assert_eq!(names(b.path()), ["auto"]);
}

fn allocated(p: &Path) -> u64 {
    fs::metadata(p).unwrap().blocks() * 512
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sparse_file_stays_sparse_on_ext4() {
    let (d, x) = (testfs!(Ext4), testfs!(Xfs));
    let src = d.path().join("sparse");
    {
        let f = fs::File::create(&src).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &data(1 << 20, 4), 0).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &data(1 << 20, 5), 200 << 20).unwrap();
        f.set_len(300 << 20).unwrap(); // trailing hole
        f.sync_all().unwrap();
    }
    let src_alloc = allocated(&src);
    assert!(src_alloc < 4 << 20, "source should be sparse: {src_alloc}");
    let want = fs::read(&src).unwrap();
    // Same filesystem (copy_file_range), user-space copy, and from XFS.
    let xsrc = x.path().join("sparse");
    clone_file(&src, &xsrc, &opts(LinkMode::Copy)).unwrap();
    for (from, name, mode) in [
        (&src, "auto", LinkMode::Auto),
        (&src, "never", LinkMode::Copy),
        (&xsrc, "from-xfs", LinkMode::Auto),
    ] {
        let dst = d.path().join(name);
        let o = clone_file(from, &dst, &opts(mode)).unwrap();
        assert_eq!(o.bytes, 300 << 20);
        assert_eq!(fs::metadata(&dst).unwrap().len(), 300 << 20);
        let got = allocated(&dst);
        assert!(
            got <= src_alloc + (256 << 10),
            "{name}: {got} bytes allocated vs source {src_alloc}"
        );
        assert!(fs::read(&dst).unwrap() == want, "{name}: content differs");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn exec_bit_always_and_ns_times_with_preserve() {
    let d = testfs!(Xfs);
    let src = d.path().join("tool");
    write_file(&src, b"#!/bin/sh\necho hi\n");
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    let mtime = filetime_ns(&src, 1_600_000_000, 123_456_789);
    let plain = d.path().join("plain");
    clone_file(&src, &plain, &CloneOptions::default()).unwrap();
    assert_eq!(
        fs::metadata(&plain).unwrap().mode() & 0o111,
        0o111,
        "exec bits lost"
    );
    let kept = d.path().join("kept");
    let o = CloneOptions {
        preserve: Preserve::P,
        ..Default::default()
    };
    clone_file(&src, &kept, &o).unwrap();
    let m = fs::metadata(&kept).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755);
    assert_eq!((m.mtime(), m.mtime_nsec()), mtime);
}

/// Set `p`'s atime and mtime to the given second and nanosecond.
fn filetime_ns(p: &Path, sec: i64, nsec: i64) -> (i64, i64) {
    let ts = rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    let times = rustix::fs::Timestamps {
        last_access: ts,
        last_modification: ts,
    };
    rustix::fs::utimensat(rustix::fs::CWD, p, &times, rustix::fs::AtFlags::empty()).unwrap();
    (sec, nsec)
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xattrs_preserved_on_request() {
    let d = testfs!(Btrfs);
    let src = d.path().join("x");
    write_file(&src, b"attrs");
    rustix::fs::setxattr(
        &src,
        "user.cowlink.test",
        b"value-1",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let dst = d.path().join("y");
    let o = CloneOptions {
        preserve: Preserve::ALL,
        ..Default::default()
    };
    clone_file(&src, &dst, &o).unwrap();
    let mut buf = [0u8; 64];
    let n = rustix::fs::getxattr(&dst, "user.cowlink.test", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"value-1");
    // Without the option no xattr is carried.
    let bare = d.path().join("z");
    clone_file(&src, &bare, &CloneOptions::default()).unwrap();
    assert!(rustix::fs::getxattr(&bare, "user.cowlink.test", &mut buf[..]).is_err());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn existing_destination_refused_unless_replace_and_never_written_through() {
    let d = testfs!(Xfs);
    let (src, dst, other) = (
        d.path().join("src"),
        d.path().join("dst"),
        d.path().join("other-link"),
    );
    write_file(&src, b"new content");
    write_file(&dst, b"old content");
    fs::hard_link(&dst, &other).unwrap();
    let e = clone_file(&src, &dst, &CloneOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    assert_eq!(fs::read(&dst).unwrap(), b"old content");
    let replace = CloneOptions {
        overwrite: Overwrite::Replace,
        ..Default::default()
    };
    let o = clone_file(&src, &dst, &replace).unwrap();
    assert_eq!(o.method, Method::Reflink);
    assert_eq!(fs::read(&dst).unwrap(), b"new content");
    assert_eq!(
        fs::read(&other).unwrap(),
        b"old content",
        "wrote through a hardlink"
    );
    // A directory is never replaced by a file; a file is not its own copy.
    fs::create_dir(d.path().join("adir")).unwrap();
    let e = clone_file(&src, d.path().join("adir"), &replace).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IsDirectory);
    let e = clone_file(&src, &src, &replace).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SameFile);
    assert_eq!(fs::read(&src).unwrap(), b"new content");
    assert_eq!(names(d.path()), ["adir", "dst", "other-link", "src"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn direct_placement_clones_under_the_name_and_leaves_nothing_on_error() {
    let (x, e4) = (testfs!(Xfs), testfs!(Ext4));
    let direct = |link, overwrite| CloneOptions {
        link,
        overwrite,
        placement: Placement::Direct,
        ..Default::default()
    };
    let p = x.path();
    let (src, dst) = (p.join("src"), p.join("dst"));
    let content = data(1 << 20, 11);
    write_file(&src, &content);
    fs::set_permissions(&src, fs::Permissions::from_mode(0o750)).unwrap();
    let o = clone_file(&src, &dst, &direct(LinkMode::Clone, Overwrite::Refuse)).unwrap();
    assert_eq!(o.method, Method::Reflink);
    assert_eq!(fs::read(&dst).unwrap(), content);
    assert_eq!(
        physical(&extents(&src).unwrap().extents),
        physical(&extents(&dst).unwrap().extents)
    );
    // The final mode is the source's less the umask, the mark cleared.
    let mode = fs::metadata(&dst).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o750 & !umask(), "{mode:o}");

    // Never over an existing file: refused, the old content intact.
    write_file(&src, b"newer");
    let e = clone_file(&src, &dst, &direct(LinkMode::Auto, Overwrite::Refuse)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert_eq!(fs::read(&dst).unwrap(), content);
    let o = clone_file(&src, &dst, &direct(LinkMode::Auto, Overwrite::Skip)).unwrap();
    assert_eq!(o.method, Method::Skipped);
    // A file a killed run left (it carries the mark) is named as such.
    fs::set_permissions(&dst, fs::Permissions::from_mode(0o1640)).unwrap();
    let e = clone_file(&src, &dst, &direct(LinkMode::Auto, Overwrite::Refuse)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert!(
        e.to_string().contains("interrupted run left unfinished"),
        "{e}"
    );
    // Replacing stays atomic: a hardlink of the old file keeps its content.
    fs::hard_link(&dst, p.join("old-link")).unwrap();
    clone_file(&src, &dst, &direct(LinkMode::Auto, Overwrite::Replace)).unwrap();
    assert_eq!(fs::read(&dst).unwrap(), b"newer");
    assert_eq!(fs::read(p.join("old-link")).unwrap(), content);
    assert_eq!(names(p), ["dst", "old-link", "src"]);

    // No reflink on ext4: Auto copies under the name, Always leaves nothing.
    let e4 = e4.path();
    let big = data(3 << 20 | 77, 12);
    write_file(&e4.join("src"), &big);
    let o = clone_file(
        e4.join("src"),
        e4.join("copy"),
        &direct(LinkMode::Auto, Overwrite::Refuse),
    )
    .unwrap();
    assert_eq!(o.method, Method::CopyOffload);
    assert_eq!(fs::read(e4.join("copy")).unwrap(), big);
    assert_eq!(fs::metadata(e4.join("copy")).unwrap().mode() & 0o1000, 0);
    let e = clone_file(
        e4.join("src"),
        e4.join("never"),
        &direct(LinkMode::Clone, Overwrite::Refuse),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert_eq!(names(e4), ["copy", "src"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn bad_sources_give_typed_errors_and_create_nothing() {
    let d = testfs!(Xfs);
    let p = d.path();
    fs::create_dir(p.join("dir")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    std::os::unix::fs::symlink(p.join("nowhere"), p.join("dangling")).unwrap();
    let out = p.join("out");
    fs::create_dir(&out).unwrap();
    let cases: [(&str, ErrorKind, &str); 4] = [
        ("dir", ErrorKind::IsDirectory, "source is a directory"),
        ("fifo", ErrorKind::NotRegularFile, "source is a FIFO"),
        ("dangling", ErrorKind::NotFound, "dangling symbolic link"),
        ("missing", ErrorKind::NotFound, "source does not exist"),
    ];
    for (name, kind, text) in cases {
        for mode in [LinkMode::Auto, LinkMode::Clone, LinkMode::Copy] {
            let e = clone_file(p.join(name), out.join(name), &opts(mode)).unwrap_err();
            assert_eq!(e.kind(), kind, "{name}: {e}");
            assert!(e.to_string().contains(text), "{name}: {e}");
            assert!(
                e.to_string().contains(name),
                "error must name the path: {e}"
            );
        }
    }
    // Missing destination directory.
    write_file(&p.join("f"), b"x");
    let e = clone_file(
        p.join("f"),
        p.join("no/such/dir/f"),
        &CloneOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(names(&out).is_empty(), "left behind: {:?}", names(&out));
}

/// Fill `dir`'s filesystem with a preallocated file, leaving about `leave` bytes.
fn fill(dir: &Path, leave: u64) -> PathBuf {
    let st = rustix::fs::statvfs(dir).unwrap();
    let free = st.f_bavail * st.f_frsize;
    let filler = dir.join("filler");
    let f = fs::File::create(&filler).unwrap();
    rustix::fs::fallocate(
        &f,
        rustix::fs::FallocateFlags::empty(),
        0,
        free.saturating_sub(leave),
    )
    .unwrap();
    f.sync_all().unwrap();
    filler
}

fn free_bytes(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).unwrap();
    st.f_bavail * st.f_frsize
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn enospc_on_tiny_ext4_fails_cleanly() {
    let (t, x) = (testfs!(TinyExt4), testfs!(Xfs));
    let src = x.path().join("big");
    write_file(&src, &data(8 << 20, 6));
    let filler = fill(t.path(), 2 << 20);
    let before = free_bytes(t.path());
    // Created under its name (direct) or unnamed, the file goes.
    let direct = CloneOptions {
        placement: Placement::Direct,
        ..opts(LinkMode::Auto)
    };
    for o in [opts(LinkMode::Auto), opts(LinkMode::Copy), direct] {
        let e = clone_file(&src, t.path().join("big"), &o).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
        assert_eq!(names(t.path()), ["filler"]);
    }
    // A sparse source is never preallocated (nor is any copy into ext4):
    // ENOSPC comes mid-copy, and the unfinished file goes.
    let sparse = x.path().join("sparse");
    {
        let f = fs::File::create(&sparse).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &data(6 << 20, 7), 4096).unwrap();
    }
    let e = clone_file(&sparse, t.path().join("sparse"), &opts(LinkMode::Auto)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert_eq!(names(t.path()), ["filler"]);
    // The unnamed temporary's blocks are released again.
    assert!(free_bytes(t.path()) + (64 << 10) >= before, "space leaked");
    fs::remove_file(filler).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn enospc_on_tiny_xfs_fails_cleanly() {
    let t = testfs!(TinyXfs);
    let src = t.path().join("src");
    write_file(&src, &data(16 << 20, 8));
    let filler = fill(t.path(), 4 << 20);
    // A physical copy needs 16 MiB: refused. (A clone needs almost none.)
    let e = clone_file(&src, t.path().join("copy"), &opts(LinkMode::Copy)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert_eq!(names(t.path()), ["filler", "src"]);
    fs::remove_file(filler).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn clone_range_checks_alignment_and_shares_only_the_range() {
    let d = testfs!(Xfs);
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let s = data(4 * 4096, 9);
    let t = data(4 * 4096, 10);
    write_file(&src, &s);
    write_file(&dst, &t);
    for (so, doff, len) in [(100, 0, 4096), (0, 512, 4096), (0, 0, 1000)] {
        let e = clone_range(&src, so, &dst, doff, len).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unaligned, "{so} {doff} {len}: {e}");
        assert!(e.to_string().contains("4096 bytes"), "{e}");
    }
    assert_eq!(
        fs::read(&dst).unwrap(),
        t,
        "failed range clone changed the file"
    );
    let o = clone_range(&src, 4096, &dst, 8192, 4096).unwrap();
    assert_eq!((o.method, o.bytes), (Method::Reflink, 4096));
    let got = fs::read(&dst).unwrap();
    assert_eq!(&got[8192..12288], &s[4096..8192]);
    assert_eq!(&got[..8192], &t[..8192]);
    assert_eq!(&got[12288..], &t[12288..]);
    let es = extents(&src).unwrap().extents;
    let ed = extents(&dst).unwrap().extents;
    let src_block = es
        .iter()
        .find(|e| e.logical <= 4096 && 4096 < e.logical + e.length)
        .unwrap();
    let src_phys = src_block.physical + (4096 - src_block.logical);
    for e in &ed {
        let overlaps = e.logical < 12288 && 8192 < e.logical + e.length;
        if overlaps {
            assert!(e.is_shared(), "cloned range not shared: {ed:?}");
            assert_eq!(e.physical + (8192 - e.logical), src_phys, "{ed:?}");
        } else {
            assert!(
                !e.is_shared(),
                "outside the range must stay exclusive: {ed:?}"
            );
        }
    }
    // The EOF exception: an unaligned length that ends at the source's end.
    let tail = d.path().join("tail");
    write_file(&tail, &data(2 * 4096 + 100, 11));
    let empty = d.path().join("empty");
    write_file(&empty, b"");
    let o = clone_range(&tail, 0, &empty, 0, 2 * 4096 + 100).unwrap();
    assert_eq!(o.bytes, 2 * 4096 + 100);
    assert_eq!(fs::read(&empty).unwrap(), fs::read(&tail).unwrap());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn probe_reports_kinds_and_answers_on_all_four() {
    let (x, b, e, t) = (testfs!(Xfs), testfs!(Btrfs), testfs!(Ext4), testfs!(Tmpfs));
    probe::clear_cache();
    for (dir, kind, yes) in [
        (x.path(), FsKind::Xfs, true),
        (b.path(), FsKind::Btrfs, true),
        (e.path(), FsKind::Ext4, false),
        (t.path(), FsKind::Tmpfs, false),
    ] {
        let f = probe::filesystem(dir).unwrap();
        assert_eq!(f.kind, kind);
        assert_eq!(f.reflink.is_yes(), yes, "{kind}: {:?}", f.reflink);
        assert_eq!(f.dedupe.is_yes(), yes, "{kind}: {:?}", f.dedupe);
        assert_eq!(f.block_size, Some(4096));
        if !yes {
            assert!(
                f.reflink.reason().unwrap().contains(kind.name()),
                "{:?}",
                f.reflink
            );
        }
        assert!(
            names(dir).is_empty(),
            "probe left files in {}",
            dir.display()
        );
    }
    assert_eq!(
        probe::filesystem(x.path()).unwrap().clone_limit,
        cowlink::CloneLimit::PerBlock(4_294_967_295)
    );
    let src = x.path().join("f");
    write_file(&src, &data(10000, 12));
    let same = probe::between(&src, x.path()).unwrap();
    assert!(same.reflink.is_yes() && same.same_filesystem);
    for (other, name) in [(b.path(), "btrfs"), (e.path(), "ext4"), (t.path(), "tmpfs")] {
        let s = probe::between(&src, other.join("new-file")).unwrap();
        assert!(!s.reflink.is_yes(), "xfs → {name}");
        assert!(!s.same_filesystem);
        assert_eq!(s.dst.kind.name(), name);
    }
    let s = probe::between(&src, b.path()).unwrap();
    assert_eq!(
        s.reflink.reason(),
        Some("different filesystems (xfs → btrfs)")
    );
    // Directory to directory on one filesystem.
    assert!(probe::between(x.path(), x.path()).unwrap().reflink.is_yes());
    // The tree view lists the test mounts with the same answers.
    let root = Path::new(&std::env::var_os("COWLINK_TEST_XFS").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let mounts = probe::tree(&root).unwrap();
    let xfs_mount = Path::new(&std::env::var_os("COWLINK_TEST_XFS").unwrap()).to_path_buf();
    let m = mounts
        .iter()
        .find(|m| m.mount_point == xfs_mount)
        .expect("xfs mount listed");
    assert_eq!(m.fstype, "xfs");
    assert!(m.facts.reflink.is_yes());
    let ext4_mount = Path::new(&std::env::var_os("COWLINK_TEST_EXT4").unwrap()).to_path_buf();
    let m = mounts
        .iter()
        .find(|m| m.mount_point == ext4_mount)
        .expect("ext4 mount listed");
    assert!(matches!(m.facts.reflink, probe::Answer::No(_)));
    assert_eq!(names(x.path()), ["f"]);
}

#[test]
fn probe_missing_path_is_an_error_not_a_panic() {
    let e = probe::filesystem("/definitely/not/here").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let e = probe::between("/definitely/not/here", "/tmp").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
}
