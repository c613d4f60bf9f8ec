//! The data copy used when cloning is not possible (or not wanted).
//!
//! Walks the source's data segments with `SEEK_DATA`/`SEEK_HOLE`, so holes
//! are skipped and sparse files stay sparse, and moves each segment with
//! `copy_file_range(2)` (in-kernel, no user-space buffer; server-side on
//! NFS/SMB). Where the kernel refuses `copy_file_range` (different
//! filesystem types, old kernels, special filesystems) it falls back to
//! `pread`/`pwrite` with a buffer of up to 1 MiB.
//!
//! Dense files of 1 MiB and more are preallocated with `fallocate(2)` first,
//! except on ext2/3/4: large streamed writes then land in few extents, and
//! a full filesystem fails with ENOSPC before any data is written. On ext4
//! the price is too high: writing into its unwritten (preallocated) extents
//! and converting them at writeback made a copy of the real `/usr` tree
//! about 1.6× slower there (docs/benchmarks.md), while its delayed allocation
//! already lays a streamed copy out in few extents; ENOSPC then comes
//! mid-copy and the unfinished file is removed as on any error. Sparse
//! files are not preallocated (that would fill their holes), and a clone
//! never reaches this code (preallocating over shared blocks would unshare
//! them).
//!
//! [`transfer`] is the clone-or-copy step every feature runs on an open
//! source and an empty destination: FICLONE, then (when the
//! [`LinkMode`] allows and the kernel says cloning is not possible
//! here) the copy below; it returns the [`Method`] used.
//!
//! `copy_file_range` may itself clone on XFS/Btrfs. [`copy_data`] therefore
//! takes `offload: false` for `LinkMode::Copy`, which must produce blocks of
//! its own, and uses only read/write then.
//!
//! [`Sparse`] (`cp --sparse`) is a mode of this one copy loop, not a pass
//! after it: `Auto` is the above; `Never` reads the whole length as one
//! segment (holes read as zeros and are written); `Always` keeps the
//! source's holes and also leaves every 512-byte run of zeros unwritten,
//! coalescing the writes between them, so a fresh destination gets holes
//! wherever whole blocks are zero (GNU's `sparse_copy`, in the same units).
//! Both use read/write only, as GNU does: `copy_file_range` may clone,
//! keep holes or allocate zeros as the filesystem likes.

use std::path::Path;

use rustix::fd::BorrowedFd;
use rustix::fs;
use rustix::io::{self, Errno};

use super::files::kind_of;
use super::mode::{LinkMode, Method, Outcome, Sparse, Step};
use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;

/// Files this large and without holes are preallocated before copying.
const PREALLOC_MIN: u64 = 1 << 20;
/// Largest read/write buffer.
const BUF_MAX: u64 = 1 << 20;
/// Largest single `copy_file_range` request: small enough that a cancel is
/// noticed within a fraction of a second, large enough to cost nothing.
const CFR_CHUNK: u64 = 64 << 20;

/// What a copy needs to know of its source: its size, whether it may
/// have holes, and what the copy makes of holes and zeros.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Source {
    /// The size stat gave.
    pub size: u64,
    /// Whether the file may have holes, so its data segments are worth
    /// asking for (`SEEK_DATA`/`SEEK_HOLE`, two calls per file).
    pub maybe_sparse: bool,
    /// Holes in the copy (`cp --sparse`); [`Sparse::Auto`] unless set.
    pub sparse: Sparse,
}

impl Source {
    /// From the source's stat. As GNU cp decides: a file whose blocks
    /// cover its size is read as one segment. (Blocks past the end or of
    /// extended attributes can hide a small hole; the copy then holds
    /// zeros there, the same bytes.)
    pub(crate) fn of(st: &cowlink_sys::Stat) -> Self {
        let size = st.st_size as u64;
        Self {
            size,
            maybe_sparse: (st.st_blocks as u64).saturating_mul(512) < size,
            sparse: Sparse::Auto,
        }
    }

    /// The same source, copied with `sparse`'s treatment of holes.
    pub(crate) fn with_sparse(self, sparse: Sparse) -> Self {
        Self { sparse, ..self }
    }

    /// A source known only by its size: its segments are asked for.
    pub(crate) fn sized(size: u64) -> Self {
        Self {
            size,
            maybe_sparse: true,
            sparse: Sparse::Auto,
        }
    }
}

/// The data segments `[start, end)` of a file of `size` bytes, in order.
/// Where the filesystem cannot report holes the whole file is one segment.
pub(crate) fn data_segments(src: BorrowedFd<'_>, size: u64) -> Result<Vec<(u64, u64)>, Errno> {
    let mut segs = Vec::new();
    let mut pos = 0;
    while pos < size {
        let start = match cowlink_sys::seek_data(src, pos) {
            Ok(s) => s,
            Err(Errno::NXIO) => break, // no data after pos: trailing hole
            Err(Errno::INVAL | Errno::OPNOTSUPP) if pos == 0 => return Ok(vec![(0, size)]),
            Err(e) => return Err(e),
        };
        if start >= size {
            break;
        }
        let end = match cowlink_sys::seek_hole(src, start) {
            Ok(e) => e.min(size),
            Err(Errno::NXIO) => size,
            Err(e) => return Err(e),
        };
        if end <= start {
            // The file changed under us; copy the rest as data.
            segs.push((start, size));
            break;
        }
        segs.push((start, end));
        pos = end;
    }
    Ok(segs)
}

/// Copy `source.size` bytes of `src` into the empty file `dst`, keeping
/// holes (of a source that [may have them](Source::maybe_sparse)).
///
/// The size is what stat said; the copy has the length reading gives. A
/// file of a pseudo filesystem reporting 0 bytes (procfs) or one page
/// (sysfs) is read to its end whatever its size says, and a source that
/// ends early (it shrank) gives a copy of what was read, never one padded
/// with zeros to the old size.
///
/// Returns the method that moved the data ([`Method::CopyOffload`] when
/// `copy_file_range` did the whole job, [`Method::ReadWrite`] when any part
/// used read/write) and the bytes the copy holds. Errors are the kernel's (ENOSPC, EIO, ...); "not
/// possible here" errors from `copy_file_range` are never returned, they
/// switch to read/write. `cancelled` is asked between chunks (at most
/// [`CFR_CHUNK`] or 1 MiB apart); when it says yes the copy stops with
/// `ECANCELED`.
pub(crate) fn copy_data(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    source: Source,
    mut offload: bool,
    cancelled: &dyn Fn() -> bool,
) -> Result<Outcome, Errno> {
    let size = source.size;
    if size_untrusted(src, size) {
        let bytes = copy_to_eof(src, dst, cancelled)?;
        return Ok(Outcome {
            method: Method::ReadWrite,
            bytes,
        });
    }
    // Holes of the source are found unless they are to be filled.
    let segs = match (source.maybe_sparse && source.sparse != Sparse::Never, size) {
        (true, _) => data_segments(src, size)?,
        (false, 0) => Vec::new(),
        (false, _) => vec![(0, size)],
    };
    // Zero runs become holes only in a copy we write ourselves.
    let make_holes = source.sparse == Sparse::Always;
    if source.sparse != Sparse::Auto {
        offload = false;
    }
    // Where the last write ended (holes made at the end leave it short).
    let mut write_end = 0;
    let dense = segs.len() == 1 && segs[0] == (0, size);
    let written_to = segs.last().map_or(0, |&(_, end)| end);
    let preallocated = dense && !make_holes && size >= PREALLOC_MIN && prealloc_pays(dst);
    if preallocated {
        preallocate(dst, size)?;
    }
    let mut method = if offload {
        Method::CopyOffload
    } else {
        Method::ReadWrite
    };
    let mut buf: Vec<u8> = Vec::new();
    // Where the source ended, when it ended before `size`.
    let mut short = None;
    'segments: for (start, end) in segs {
        let mut pos = start;
        while pos < end {
            if cancelled() {
                return Err(Errno::CANCELED);
            }
            let want = end - pos;
            if offload {
                let (mut off_in, mut off_out) = (pos, pos);
                let chunk = want.min(CFR_CHUNK) as usize;
                match cowlink_sys::copy_file_range(src, &mut off_in, dst, &mut off_out, chunk) {
                    Ok(0) => {
                        // The source shrank: stop at its new end.
                        short = Some(pos);
                        break 'segments;
                    }
                    Ok(n) => {
                        pos += n as u64;
                        continue;
                    }
                    // ETXTBSY: an active swap file (read/write may read it).
                    Err(
                        Errno::XDEV
                        | Errno::INVAL
                        | Errno::OPNOTSUPP
                        | Errno::NOSYS
                        | Errno::TXTBSY,
                    ) => {
                        offload = false;
                        method = Method::ReadWrite;
                    }
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e),
                }
            }
            if buf.is_empty() {
                buf = vec![0; want.min(BUF_MAX) as usize];
            }
            let n = want.min(buf.len() as u64) as usize;
            let got = match io::pread(src, &mut buf[..n], pos) {
                Ok(0) => {
                    short = Some(pos);
                    break 'segments;
                }
                Ok(g) => g,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            if make_holes {
                write_end = write_nonzero_at(dst, &buf[..got], pos)?.unwrap_or(write_end);
            } else {
                write_all_at(dst, &buf[..got], pos)?;
            }
            pos += got as u64;
        }
    }
    // A trailing hole, or a shrunk source (preallocated or not), still
    // needs the right length; a copy whose last write ended at `size`
    // has it already. Only then: XFS flushes a truncated file's data when
    // it is closed (its guard for truncate-and-rewrite), which made every
    // small-file copy there ~10× slower.
    let mut bytes = short.unwrap_or(size);
    if short.is_none() && written_to != size {
        // A trailing hole and a source that shrank look alike to
        // SEEK_DATA; its size now tells them apart (one fstat, only for
        // files that end in a hole).
        bytes = bytes.min(cowlink_sys::fstat(src)?.st_size as u64);
    }
    // Zeros left unwritten at the end: the length is set below.
    let holes_at_end = make_holes && write_end != bytes;
    if (short.is_some() || written_to != size || holes_at_end)
        && cowlink_sys::fstat(dst)?.st_size as u64 != bytes
    {
        fs::ftruncate(dst, bytes)?;
    }
    Ok(Outcome { method, bytes })
}

/// Whether preallocating a streamed copy into `dst` pays (see the module
/// essay): everywhere but ext2/3/4.
fn prealloc_pays(dst: BorrowedFd<'_>) -> bool {
    !FsKind::of_fd(dst).is_ok_and(|k| k == FsKind::Ext4)
}

/// Whether stat's size of `src` may not be its length: 0 (procfs) or one
/// page (sysfs, configfs) on a kernel pseudo filesystem.
fn size_untrusted(src: BorrowedFd<'_>, size: u64) -> bool {
    (size == 0 || size == 4096) && FsKind::of_fd(src).is_ok_and(|k| k == FsKind::Pseudo)
}

/// Copy `src` into the empty file `dst` by reading until the end of file,
/// as GNU cp does for files whose size cannot be trusted. Returns the
/// bytes copied.
pub(crate) fn copy_to_eof(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    cancelled: &dyn Fn() -> bool,
) -> Result<u64, Errno> {
    let mut buf = vec![0u8; 64 << 10];
    let mut pos = 0u64;
    loop {
        if cancelled() {
            return Err(Errno::CANCELED);
        }
        let n = match io::read(src, &mut buf) {
            Ok(0) => return Ok(pos),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        };
        write_all_at(dst, &buf[..n], pos)?;
        pos += n as u64;
    }
}

/// The unit in which `Sparse::Always` looks for zeros: GNU's
/// `ST_NBLOCKSIZE`. Any filesystem block is a multiple of it, so every
/// whole zero block of the destination is left unwritten, and a hole.
const ZERO_UNIT: usize = 512;

/// Write the parts of `data` (destined for offset `pos`) that are not
/// 512-byte runs of zeros, one write per run of data; zeros are skipped,
/// so a fresh file gets holes there. Returns where the last write ended,
/// `None` when all was zeros.
fn write_nonzero_at(fd: BorrowedFd<'_>, data: &[u8], pos: u64) -> Result<Option<u64>, Errno> {
    let mut end = None;
    let mut run: Option<usize> = None; // start of the pending data run
    for (i, chunk) in data.chunks(ZERO_UNIT).enumerate() {
        let at = i * ZERO_UNIT;
        let zero = is_zero(chunk);
        match (zero, run) {
            (false, None) => run = Some(at),
            (true, Some(start)) => {
                write_all_at(fd, &data[start..at], pos + start as u64)?;
                end = Some(pos + at as u64);
                run = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run {
        write_all_at(fd, &data[start..], pos + start as u64)?;
        end = Some(pos + data.len() as u64);
    }
    Ok(end)
}

/// Whether every byte of `b` is zero (eight at a time).
fn is_zero(b: &[u8]) -> bool {
    let (words, rest) = b.split_at(b.len() - b.len() % 8);
    words
        .chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("eight bytes")) == 0)
        && rest.iter().all(|&x| x == 0)
}

fn write_all_at(fd: BorrowedFd<'_>, mut data: &[u8], mut pos: u64) -> Result<(), Errno> {
    while !data.is_empty() {
        match io::pwrite(fd, data, pos) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => {
                data = &data[n..];
                pos += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Move the data of `sfd` (`source`) into the empty file `dfd`:
/// clone, or copy when `link` allows and cloning is not possible here.
/// `before_copy` runs before a data copy (to refuse early instead of
/// copying in vain); `failed` turns an errno into the caller's error;
/// `cancelled` can stop a data copy between chunks (ECANCELED).
pub(crate) fn transfer(
    sfd: BorrowedFd<'_>,
    dfd: BorrowedFd<'_>,
    source: Source,
    link: LinkMode,
    before_copy: &dyn Fn() -> Result<()>,
    failed: &dyn Fn(Errno) -> Error,
    cancelled: &dyn Fn() -> bool,
) -> Result<Outcome> {
    let cloned = Outcome {
        method: Method::Reflink,
        bytes: source.size,
    };
    let copy = |offload: bool| -> Result<Outcome> {
        before_copy()?;
        copy_data(sfd, dfd, source, offload, cancelled).map_err(failed)
    };
    let mut step = link.first_step();
    loop {
        step = match step {
            Step::Clone => match cowlink_sys::ficlone(dfd, sfd) {
                Ok(()) => return Ok(cloned),
                // One source only: a reference limit is a failure here.
                Err(e) => link.after(e, false),
            },
            Step::Copy { offload } => return copy(offload),
            Step::NextSource => Step::Fail(Errno::MLINK),
            Step::Fail(e) => return Err(failed(e)),
        };
    }
}

/// Why a transfer failed, in words that name the filesystems.
pub(crate) fn transfer_error(
    op: Operation,
    src: &Path,
    dst: &Path,
    e: Errno,
    sfd: BorrowedFd<'_>,
    dfd: BorrowedFd<'_>,
) -> Error {
    let base = Error::from_errno(op, e).with_src(src).with_dst(dst);
    match e {
        Errno::XDEV => base.with_reason(format!(
            "different filesystems ({} → {})",
            kind_of(sfd),
            kind_of(dfd)
        )),
        Errno::OPNOTSUPP | Errno::NOTTY | Errno::NOSYS | Errno::INVAL => {
            let k = kind_of(dfd);
            let base = base.with_kind(ErrorKind::NotSupported);
            if let Some(why) = cowlink_sys::CLONE_UNAVAILABLE {
                return base.with_reason(format!("{k} filesystem: {why}"));
            }
            match (k, nocow(sfd), nocow(dfd)) {
                // Btrfs clones only between files that both keep checksums
                // or both do not (NOCOW files have none).
                (FsKind::Btrfs, s, d) if s != d => base.with_reason(format!(
                    "the {} is a NOCOW file (chattr +C) and the {} is not; \
                     Btrfs clones only between files that are both NOCOW or both not",
                    if s { "source" } else { "destination" },
                    if s { "destination" } else { "source" },
                )),
                _ => base.with_reason(format!(
                    "{k} does not support reflink here: {}",
                    k.reflink_hint()
                )),
            }
        }
        Errno::TXTBSY => base
            .with_kind(ErrorKind::NotSupported)
            .with_reason(crate::ground::error::SWAP_REASON),
        Errno::NOSPC => base.with_reason("no space left on the destination filesystem"),
        Errno::DQUOT => base.with_reason("disk quota exceeded on the destination filesystem"),
        _ => base,
    }
}

/// Whether the file has the NOCOW attribute (`chattr +C`; Btrfs).
fn nocow(fd: BorrowedFd<'_>) -> bool {
    cowlink_sys::inode_flags(fd).is_ok_and(|f| f.contains(cowlink_sys::InodeFlags::NOCOW))
}

/// Reserve `len` bytes of `fd` from offset 0 (extending its size).
/// Returns whether the filesystem preallocated (`false` where it cannot:
/// tmpfs before 3.x, some FUSE and network filesystems); real errors
/// (ENOSPC, EDQUOT, EIO) are returned.
pub(crate) fn preallocate(fd: BorrowedFd<'_>, len: u64) -> std::result::Result<bool, Errno> {
    if len == 0 {
        return Ok(false);
    }
    match cowlink_sys::allocate(fd, 0, len) {
        Ok(()) => Ok(true),
        Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    //! The copy step on tmpfs (`/dev/shm`: no root, no test filesystems,
    //! no clones): holes, short and empty sources, cancel, and what
    //! [`transfer`] does with each [`Reflink`] mode where cloning is not
    //! possible.
    use super::*;
    use rustix::fd::AsFd;
    use std::os::unix::fs::{FileExt, MetadataExt};

    fn shm() -> tempfile::TempDir {
        let d = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let magic = fs::statfs(d.path()).unwrap().f_type as u64;
        assert_eq!(magic, 0x0102_1994, "/dev/shm is not tmpfs");
        d
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(29) ^ seed).collect()
    }

    /// A file of `len` bytes with data at each `(offset, bytes)`, holes
    /// elsewhere.
    fn sparse(path: &Path, len: u64, data: &[(u64, Vec<u8>)]) -> std::fs::File {
        let f = std::fs::File::create(path).unwrap();
        for (at, b) in data {
            f.write_all_at(b, *at).unwrap();
        }
        f.set_len(len).unwrap();
        std::fs::File::open(path).unwrap()
    }

    fn never() -> bool {
        false
    }

    fn copy(src: &std::fs::File, dst: &std::fs::File, source: Source, offload: bool) -> Outcome {
        copy_data(src.as_fd(), dst.as_fd(), source, offload, &never).unwrap()
    }

    #[test]
    fn data_segments_follow_the_holes() {
        let d = shm();
        let p = d.path().join("s");
        let f = sparse(
            &p,
            5 << 20,
            &[(0, bytes(4096, 1)), (2 << 20, bytes(8192, 2))],
        );
        assert_eq!(
            data_segments(f.as_fd(), 5 << 20).unwrap(),
            vec![(0, 4096), (2 << 20, (2 << 20) + 8192)]
        );
        // All hole, and empty.
        let f = sparse(&d.path().join("h"), 1 << 20, &[]);
        assert_eq!(data_segments(f.as_fd(), 1 << 20).unwrap(), vec![]);
        let f = sparse(&d.path().join("e"), 0, &[]);
        assert_eq!(data_segments(f.as_fd(), 0).unwrap(), vec![]);
    }

    #[test]
    fn sparse_copies_keep_holes_and_length_with_either_method() {
        let d = shm();
        let layout = [(4096, bytes(100, 3)), (3 << 20, bytes(5000, 4))];
        let src = sparse(&d.path().join("s"), 6 << 20, &layout);
        let source = Source::of(&fs::fstat(&src).unwrap());
        assert!(source.maybe_sparse);
        for offload in [true, false] {
            let p = d.path().join(format!("d-{offload}"));
            let dst = std::fs::File::options()
                .create_new(true)
                .read(true)
                .write(true)
                .open(&p)
                .unwrap();
            let out = copy(&src, &dst, source, offload);
            assert_eq!(out.bytes, 6 << 20);
            if !offload {
                assert_eq!(out.method, Method::ReadWrite);
            }
            assert!(std::fs::read(&p).unwrap() == std::fs::read(d.path().join("s")).unwrap());
            let m = dst.metadata().unwrap();
            assert_eq!(m.len(), 6 << 20, "the trailing hole is kept as length");
            assert!(
                m.blocks() * 512 < 64 << 10,
                "holes were filled: {} blocks",
                m.blocks()
            );
        }
    }

    #[test]
    fn a_source_shorter_than_stat_said_gives_what_was_read_never_padding() {
        let d = shm();
        let data = bytes(10_000, 5);
        std::fs::write(d.path().join("s"), &data).unwrap();
        let src = std::fs::File::open(d.path().join("s")).unwrap();
        for (offload, sparse_) in [(true, false), (false, false), (false, true), (true, true)] {
            let p = d.path().join(format!("d-{offload}-{sparse_}"));
            let dst = std::fs::File::create(&p).unwrap();
            // As if the file shrank between stat and the copy.
            let source = Source {
                size: 50_000,
                maybe_sparse: sparse_,
                sparse: Sparse::Auto,
            };
            let out = copy(&src, &dst, source, offload);
            assert_eq!(out.bytes, 10_000, "offload {offload} sparse {sparse_}");
            assert!(std::fs::read(&p).unwrap() == data);
        }
    }

    #[test]
    fn empty_sources_and_offsets_past_the_end_copy_nothing() {
        let d = shm();
        std::fs::write(d.path().join("e"), b"").unwrap();
        let src = std::fs::File::open(d.path().join("e")).unwrap();
        for source in [Source::sized(0), Source::of(&fs::fstat(&src).unwrap())] {
            let p = d.path().join("d");
            let _ = std::fs::remove_file(&p);
            let dst = std::fs::File::create(&p).unwrap();
            assert_eq!(copy(&src, &dst, source, true).bytes, 0);
            assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        }
        // A source whose data starts past the size stat gave: nothing is
        // read beyond that size.
        let src = sparse(&d.path().join("late"), 2 << 20, &[(1 << 20, bytes(10, 6))]);
        let dst = std::fs::File::create(d.path().join("d2")).unwrap();
        let out = copy(&src, &dst, Source::sized(4096), true);
        assert_eq!(out.bytes, 4096);
        assert!(std::fs::read(d.path().join("d2")).unwrap() == vec![0; 4096]);
    }

    /// Data, a written run of zeros, a hole, data ending mid-block, and a
    /// zero tail: every case `--sparse` treats differently.
    fn zeros_and_holes(p: &Path) -> std::fs::File {
        let mut layout = vec![(0, bytes(5000, 9))];
        layout.push((5000, vec![0; (1 << 20) - 5000])); // written zeros
        layout.push((3 << 20, bytes(3000, 10))); // after a 2 MiB hole
        layout.push(((3 << 20) + 3000, vec![0; 200_000])); // zero tail
        sparse(p, (3 << 20) + 203_000, &layout)
    }

    #[test]
    fn sparse_always_leaves_zero_blocks_unwritten_and_never_fills_holes() {
        let d = shm();
        let sp = d.path().join("s");
        let src = zeros_and_holes(&sp);
        let want = std::fs::read(&sp).unwrap();
        let src_blocks = src.metadata().unwrap().blocks();
        for (mode, offload) in [
            (Sparse::Always, true),
            (Sparse::Always, false),
            (Sparse::Never, true),
            (Sparse::Never, false),
            (Sparse::Auto, false),
        ] {
            let p = d.path().join(format!("d-{mode:?}-{offload}"));
            let dst = std::fs::File::create_new(&p).unwrap();
            let source = Source::of(&fs::fstat(&src).unwrap()).with_sparse(mode);
            let out = copy(&src, &dst, source, offload);
            assert_eq!(out.bytes, want.len() as u64, "{mode:?}");
            assert!(std::fs::read(&p).unwrap() == want, "{mode:?}: bytes differ");
            let blocks = dst.metadata().unwrap().blocks();
            match mode {
                // Only the two data runs (5000 and 3000 bytes) hold blocks.
                Sparse::Always => {
                    assert_eq!(out.method, Method::ReadWrite, "no copy_file_range");
                    assert!(blocks * 512 <= 16 << 10, "{mode:?}: {blocks} blocks");
                }
                Sparse::Never => {
                    assert_eq!(out.method, Method::ReadWrite, "no copy_file_range");
                    assert!(
                        blocks * 512 >= want.len() as u64,
                        "{mode:?}: a hole is left: {blocks} blocks"
                    );
                }
                // The source's layout: its hole stays, its zeros are written.
                Sparse::Auto => assert_eq!(blocks, src_blocks, "{mode:?}"),
            }
        }
    }

    #[test]
    fn zero_runs_are_found_in_512_byte_units_and_writes_coalesce() {
        let d = shm();
        let f = std::fs::File::create_new(d.path().join("w")).unwrap();
        let mut data = vec![1u8; 4096];
        data[512..1024].fill(0); // one zero unit inside data: skipped
        data[3584..].fill(0); // a zero tail
        assert_eq!(
            write_nonzero_at(f.as_fd(), &data, 8192).unwrap(),
            Some(8192 + 3584)
        );
        let back = std::fs::read(d.path().join("w")).unwrap();
        assert_eq!(back.len(), 8192 + 3584);
        assert!(back[..8192].iter().all(|&b| b == 0) && back[8192..] == data[..3584]);
        assert_eq!(write_nonzero_at(f.as_fd(), &[0; 1000], 0).unwrap(), None);
        assert!(is_zero(&[0; 13]) && !is_zero(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
    }

    #[test]
    fn a_cancel_stops_the_copy_with_ecanceled() {
        let d = shm();
        std::fs::write(d.path().join("s"), bytes(3 << 20, 7)).unwrap();
        let src = std::fs::File::open(d.path().join("s")).unwrap();
        let dst = std::fs::File::create(d.path().join("d")).unwrap();
        let source = Source::of(&fs::fstat(&src).unwrap());
        let e = copy_data(src.as_fd(), dst.as_fd(), source, false, &|| true).unwrap_err();
        assert_eq!(e, Errno::CANCELED);
    }

    #[test]
    fn transfer_copies_or_fails_by_mode_where_cloning_is_not_possible() {
        let d = shm();
        let data = bytes(200_000, 8);
        std::fs::write(d.path().join("s"), &data).unwrap();
        let src = std::fs::File::open(d.path().join("s")).unwrap();
        let source = Source::of(&fs::fstat(&src).unwrap());
        let failed = |e: Errno| Error::from_errno(Operation::Clone, e);
        for (mode, copies) in [
            (LinkMode::Auto, true),
            (LinkMode::Copy, true),
            (LinkMode::Clone, false),
        ] {
            let p = d.path().join(format!("{mode:?}"));
            let dst = std::fs::File::create(&p).unwrap();
            let asked = std::cell::Cell::new(false);
            let before = || {
                asked.set(true);
                Ok(())
            };
            let r = transfer(
                src.as_fd(),
                dst.as_fd(),
                source,
                mode,
                &before,
                &failed,
                &never,
            );
            match (copies, r) {
                (true, Ok(out)) => {
                    assert_ne!(out.method, Method::Reflink, "{mode:?}");
                    if mode == LinkMode::Copy {
                        assert_eq!(out.method, Method::ReadWrite);
                    }
                    assert_eq!(out.bytes, data.len() as u64);
                    assert!(std::fs::read(&p).unwrap() == data);
                    assert!(asked.get(), "{mode:?}: the caller is asked before a copy");
                }
                (false, Err(e)) => {
                    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
                    assert!(!asked.get(), "no copy was started");
                    assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
                }
                (_, r) => panic!("{mode:?}: {r:?}"),
            }
        }
        // The caller may refuse the copy before a byte is written.
        let dst = std::fs::File::create(d.path().join("refused")).unwrap();
        let no = || Err(Error::new(Operation::Clone, ErrorKind::NoSpace));
        let e = transfer(
            src.as_fd(),
            dst.as_fd(),
            source,
            LinkMode::Auto,
            &no,
            &failed,
            &never,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!(dst.metadata().unwrap().len(), 0);
    }

    #[test]
    fn transfer_errors_name_the_filesystems_and_the_reason() {
        let d = shm();
        std::fs::write(d.path().join("s"), b"x").unwrap();
        let (s, t) = (d.path().join("s"), d.path().join("t"));
        let src = std::fs::File::open(&s).unwrap();
        let dst = std::fs::File::create(&t).unwrap();
        let e = transfer_error(
            Operation::Clone,
            &s,
            &t,
            Errno::OPNOTSUPP,
            src.as_fd(),
            dst.as_fd(),
        );
        assert_eq!(e.kind(), ErrorKind::NotSupported);
        assert!(e.reason().contains("tmpfs"), "{e}");
        let e = transfer_error(
            Operation::Clone,
            &s,
            &t,
            Errno::XDEV,
            src.as_fd(),
            dst.as_fd(),
        );
        assert_eq!(e.kind(), ErrorKind::CrossDevice);
        assert!(e.reason().contains("different filesystems"), "{e}");
        let e = transfer_error(
            Operation::Clone,
            &s,
            &t,
            Errno::NOSPC,
            src.as_fd(),
            dst.as_fd(),
        );
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        assert_eq!((e.src(), e.dst()), (Some(s.as_path()), Some(t.as_path())));
    }
}
