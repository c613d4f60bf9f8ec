//! `PreallocWriter` on real filesystems: few extents for large files
//! written in small chunks by concurrent writers, right bytes, nothing
//! left on cancel, and ENOSPC before any data is written.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cowlink::extents::extents;
use cowlink::{ErrorKind, PreallocOptions, PreallocWriter};
use cowlink_testfs::{data, names, serial, testfs};

const MIB: u64 = 1 << 20;

/// Four threads each write a 256 MiB file in 8 KiB chunks at the same
/// time; every file ends with the right bytes in at most a few extents.
fn four_writers_few_extents(dir: &Path) {
    let chunk = data(8192, 3);
    let size = 256 * MIB;
    std::thread::scope(|s| {
        for w in 0..4 {
            let chunk = &chunk;
            s.spawn(move || {
                let path = dir.join(format!("stream{w}"));
                let opts = PreallocOptions {
                    fsync: true,
                    ..Default::default()
                };
                let mut pw = PreallocWriter::with_options(&path, size, &opts).unwrap();
                assert!(pw.preallocated());
                assert!(!path.exists(), "no name before finish");
                for i in 0..size / 8192 {
                    let mut c = chunk.clone();
                    c[..8].copy_from_slice(&(i ^ (w << 40)).to_le_bytes());
                    pw.write_all(&c).unwrap();
                }
                assert_eq!(pw.finish().unwrap(), size);
            });
        }
    });
    for w in 0..4u64 {
        let path = dir.join(format!("stream{w}"));
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, size);
        for (i, c) in bytes.chunks(8192).enumerate() {
            assert_eq!(
                c[..8],
                (i as u64 ^ (w << 40)).to_le_bytes(),
                "chunk {i} of writer {w}"
            );
            assert_eq!(c[8..], chunk[8..]);
        }
        let layout = extents(&path).unwrap();
        assert!(
            // ext4 caps an extent at 32,767 blocks (~128 MiB), and four
            // concurrent 256 MiB fallocates split across block groups: 5
            // physical runs on a fresh 6 GiB ext4, up to 12 after many
            // runs on the same one, and 17 once in a whole suite whose
            // other tests had left the free space in pieces. At most 24
            // = more than 10 MiB per run. This bounds how far the layout
            // may fall apart; it does not show what preallocation gains:
            // four streams of plain 8 KiB writes got 16-23 extents each
            // on the same ext4 and one each on XFS (delayed allocation).
            layout.fragments <= 24,
            "writer {w}: {} fragments",
            layout.fragments
        );
        assert_eq!(
            layout.unwritten_bytes, 0,
            "every preallocated byte was written"
        );
    }
    assert_eq!(names(dir), ["stream0", "stream1", "stream2", "stream3"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn four_writers_few_extents_on_ext4() {
    let _serial = serial();
    let d = testfs!(Ext4);
    four_writers_few_extents(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn four_writers_few_extents_on_xfs() {
    let _serial = serial();
    let d = testfs!(Xfs);
    four_writers_few_extents(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn cancel_and_drop_leave_nothing_and_short_writes_are_trimmed() {
    let _serial = serial();
    let d = testfs!(Xfs);
    let dir = d.path();
    // (Free space is not compared here: XFS frees unlinked inodes in the
    // background, so earlier tests' deletions land at random moments.)
    let mut w = PreallocWriter::create(dir.join("a"), 64 * MIB).unwrap();
    assert!(w.preallocated());
    w.write_all(&data(MIB as usize, 1)).unwrap();
    w.cancel();
    let w = PreallocWriter::create(dir.join("b"), 8 * MIB).unwrap();
    drop(w);
    assert!(names(dir).is_empty(), "{:?}", names(dir));
    // Fewer bytes than announced: the file is what was written, and the
    // unused preallocation is released.
    let mut w = PreallocWriter::create(dir.join("c"), 8 * MIB).unwrap();
    w.write_all(b"short").unwrap();
    assert_eq!(w.finish().unwrap(), 5);
    assert_eq!(fs::read(dir.join("c")).unwrap(), b"short");
    let m = fs::metadata(dir.join("c")).unwrap();
    assert_eq!(m.len(), 5);
    assert!(
        m.blocks() * 512 <= 64 * 1024,
        "{} bytes allocated",
        m.blocks() * 512
    );
    // All of it written: allocated once, in one piece.
    let mut w = PreallocWriter::create(dir.join("e"), 16 * MIB).unwrap();
    w.write_all(&data(16 * MIB as usize, 5)).unwrap();
    w.finish().unwrap();
    assert_eq!(
        fs::metadata(dir.join("e")).unwrap().blocks() * 512,
        16 * MIB
    );
    assert_eq!(extents(dir.join("e")).unwrap().fragments, 1);
    // The name is checked at finish: someone else's file is never replaced.
    let mut w = PreallocWriter::create(dir.join("d"), 10).unwrap();
    fs::write(dir.join("d"), b"theirs").unwrap();
    w.write_all(b"mine").unwrap();
    let e = w.finish().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert_eq!(fs::read(dir.join("d")).unwrap(), b"theirs");
    assert_eq!(names(dir), ["c", "d", "e"]);
    let e = PreallocWriter::create(dir.join("missing/x"), 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn enospc_at_fallocate_fails_before_any_data() {
    let _serial = serial();
    let d = testfs!(TinyExt4);
    let dir = d.path();
    let free = || rustix::fs::statvfs(dir).unwrap().f_bavail;
    let before = free();
    let e = PreallocWriter::create(dir.join("huge"), 1 << 30).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert!(e.to_string().contains("nothing was written"), "{e}");
    assert!(names(dir).is_empty());
    rustix::fs::syncfs(fs::File::open(dir).unwrap()).unwrap();
    assert_eq!(free(), before, "no blocks kept");
}
