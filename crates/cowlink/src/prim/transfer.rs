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

use std::path::Path;

use rustix::fd::BorrowedFd;
use rustix::fs::{self, FallocateFlags, SeekFrom};
use rustix::io::{self, Errno};

use super::files::kind_of;
use super::mode::{LinkMode, Method, Outcome, Step};
use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;

/// Files this large and without holes are preallocated before copying.
const PREALLOC_MIN: u64 = 1 << 20;
/// Largest read/write buffer.
const BUF_MAX: u64 = 1 << 20;
/// Largest single `copy_file_range` request: small enough that a cancel is
/// noticed within a fraction of a second, large enough to cost nothing.
const CFR_CHUNK: u64 = 64 << 20;

/// What a copy needs to know of its source: its size, and whether it may
/// have holes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Source {
    /// The size stat gave.
    pub size: u64,
    /// Whether the file may have holes, so its data segments are worth
    /// asking for (`SEEK_DATA`/`SEEK_HOLE`, two calls per file).
    pub maybe_sparse: bool,
}

impl Source {
    /// From the source's stat. As GNU cp decides: a file whose blocks
    /// cover its size is read as one segment. (Blocks past the end or of
    /// extended attributes can hide a small hole; the copy then holds
    /// zeros there, the same bytes.)
    pub(crate) fn of(st: &fs::Stat) -> Self {
        let size = st.st_size as u64;
        Self {
            size,
            maybe_sparse: (st.st_blocks as u64).saturating_mul(512) < size,
        }
    }

    /// A source known only by its size: its segments are asked for.
    pub(crate) fn sized(size: u64) -> Self {
        Self {
            size,
            maybe_sparse: true,
        }
    }
}

/// The data segments `[start, end)` of a file of `size` bytes, in order.
/// Where the filesystem cannot report holes the whole file is one segment.
fn data_segments(src: BorrowedFd<'_>, size: u64) -> Result<Vec<(u64, u64)>, Errno> {
    let mut segs = Vec::new();
    let mut pos = 0;
    while pos < size {
        let start = match fs::seek(src, SeekFrom::Data(pos)) {
            Ok(s) => s,
            Err(Errno::NXIO) => break, // no data after pos: trailing hole
            Err(Errno::INVAL | Errno::OPNOTSUPP) if pos == 0 => return Ok(vec![(0, size)]),
            Err(e) => return Err(e),
        };
        if start >= size {
            break;
        }
        let end = match fs::seek(src, SeekFrom::Hole(start)) {
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
    let segs = match source.maybe_sparse {
        true => data_segments(src, size)?,
        false if size > 0 => vec![(0, size)],
        false => Vec::new(),
    };
    let dense = segs.len() == 1 && segs[0] == (0, size);
    let written_to = segs.last().map_or(0, |&(_, end)| end);
    let preallocated = dense && size >= PREALLOC_MIN && prealloc_pays(dst);
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
                match fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), chunk) {
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
            write_all_at(dst, &buf[..got], pos)?;
            pos += got as u64;
        }
    }
    // A trailing hole, or a shrunk source (preallocated or not), still
    // needs the right length; a copy whose last write ended at `size`
    // has it already. Only then: XFS flushes a truncated file's data when
    // it is closed (its guard for truncate-and-rewrite), which made every
    // small-file copy there ~10× slower.
    let bytes = short.unwrap_or(size);
    if (short.is_some() || written_to != size) && fs::fstat(dst)?.st_size as u64 != bytes {
        fs::ftruncate(dst, bytes)?;
    }
    Ok(Outcome { method, bytes })
}

/// Whether preallocating a streamed copy into `dst` pays (see the module
/// essay): everywhere but ext2/3/4.
fn prealloc_pays(dst: BorrowedFd<'_>) -> bool {
    !fs::fstatfs(dst).is_ok_and(|s| FsKind::from_magic(s.f_type as u64) == FsKind::Ext4)
}

/// Whether stat's size of `src` may not be its length: 0 (procfs) or one
/// page (sysfs, configfs) on a kernel pseudo filesystem.
fn size_untrusted(src: BorrowedFd<'_>, size: u64) -> bool {
    (size == 0 || size == 4096)
        && fs::fstatfs(src).is_ok_and(|s| FsKind::from_magic(s.f_type as u64) == FsKind::Pseudo)
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
    fs::ioctl_getflags(fd).is_ok_and(|f| f.contains(fs::IFlags::NOCOW))
}

/// Reserve `len` bytes of `fd` from offset 0 (extending its size).
/// Returns whether the filesystem preallocated (`false` where it cannot:
/// tmpfs before 3.x, some FUSE and network filesystems); real errors
/// (ENOSPC, EDQUOT, EIO) are returned.
pub(crate) fn preallocate(fd: BorrowedFd<'_>, len: u64) -> std::result::Result<bool, Errno> {
    if len == 0 {
        return Ok(false);
    }
    match fs::fallocate(fd, FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(true),
        Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => Ok(false),
        Err(e) => Err(e),
    }
}
