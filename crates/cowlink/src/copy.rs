//! The data copy used when cloning is not possible (or not wanted).
//!
//! Walks the source's data segments with `SEEK_DATA`/`SEEK_HOLE`, so holes
//! are skipped and sparse files stay sparse, and moves each segment with
//! `copy_file_range(2)` (in-kernel, no user-space buffer; server-side on
//! NFS/SMB). Where the kernel refuses `copy_file_range` (different
//! filesystem types, old kernels, special filesystems) it falls back to
//! `pread`/`pwrite` with a buffer of up to 1 MiB.
//!
//! Dense files of 1 MiB and more are preallocated with `fallocate(2)` first:
//! large streamed writes then land in few extents, and a full filesystem
//! fails with ENOSPC before any data is written. Sparse files are not
//! preallocated (that would fill their holes), and a clone never reaches
//! this code (preallocating over shared blocks would unshare them).
//!
//! `copy_file_range` may itself clone on XFS/Btrfs. [`copy_data`] therefore
//! takes `offload: false` for `Reflink::Never`, which must produce blocks of
//! its own, and uses only read/write then.

use rustix::fd::BorrowedFd;
use rustix::fs::{self, SeekFrom};
use rustix::io::{self, Errno};

use crate::Method;

/// Files this large and without holes are preallocated before copying.
const PREALLOC_MIN: u64 = 1 << 20;
/// Largest read/write buffer.
const BUF_MAX: u64 = 1 << 20;
/// Largest single `copy_file_range` request: small enough that a cancel is
/// noticed within a fraction of a second, large enough to cost nothing.
const CFR_CHUNK: u64 = 64 << 20;

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

/// Copy `size` bytes of `src` into the empty file `dst`, keeping holes.
///
/// Returns the method that moved the data: [`Method::CopyOffload`] when
/// `copy_file_range` did the whole job, [`Method::ReadWrite`] when any part
/// used read/write. Errors are the kernel's (ENOSPC, EIO, ...); "not
/// possible here" errors from `copy_file_range` are never returned, they
/// switch to read/write. `cancelled` is asked between chunks (at most
/// [`CFR_CHUNK`] or 1 MiB apart); when it says yes the copy stops with
/// `ECANCELED`.
pub(crate) fn copy_data(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    size: u64,
    mut offload: bool,
    cancelled: &dyn Fn() -> bool,
) -> Result<Method, Errno> {
    let segs = data_segments(src, size)?;
    let dense = segs.len() == 1 && segs[0] == (0, size);
    if dense && size >= PREALLOC_MIN {
        crate::prealloc::preallocate(dst, size)?;
    }
    let mut method = if offload {
        Method::CopyOffload
    } else {
        Method::ReadWrite
    };
    let mut buf: Vec<u8> = Vec::new();
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
                    Ok(0) => break 'segments, // source shrank: stop at its new end
                    Ok(n) => {
                        pos += n as u64;
                        continue;
                    }
                    Err(Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => {
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
                Ok(0) => break 'segments,
                Ok(g) => g,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            write_all_at(dst, &buf[..got], pos)?;
            pos += got as u64;
        }
    }
    // A trailing hole (or an empty copy) still needs the right length.
    fs::ftruncate(dst, size)?;
    Ok(method)
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
