//! File layout through FIEMAP: which byte ranges map to which disk blocks,
//! and which of those blocks are shared with other files.
//!
//! Used by tests and tools to prove that a clone really shares blocks.
//! Always maps with `FIEMAP_FLAG_SYNC` so delayed-allocation data has real
//! addresses, and loops until the extent flagged LAST, so files with any
//! number of extents are listed completely.

use std::path::Path;

use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, ErrorKind, Operation, Result};

/// One mapped extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    /// Offset in the file, bytes.
    pub logical: u64,
    /// Offset on the device, bytes.
    pub physical: u64,
    /// Length, bytes.
    pub length: u64,
    /// Raw `FIEMAP_EXTENT_*` flags.
    pub flags: u32,
}

impl Extent {
    /// The blocks are shared with another file (FIEMAP_EXTENT_SHARED).
    pub fn is_shared(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_SHARED != 0
    }

    /// Allocated but unwritten; reads as zeros (FIEMAP_EXTENT_UNWRITTEN).
    pub fn is_unwritten(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_UNWRITTEN != 0
    }

    /// The last extent of the file (FIEMAP_EXTENT_LAST).
    pub fn is_last(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_LAST != 0
    }
}

/// All extents of an open file, in file order.
///
/// # Errors
/// `NotSupported` when the filesystem has no FIEMAP (tmpfs, ZFS).
pub fn extents_fd(fd: BorrowedFd<'_>) -> std::result::Result<Vec<Extent>, Errno> {
    let mut raw = Vec::new();
    let mut start = 0u64;
    loop {
        let before = raw.len();
        let n = cowlink_sys::fiemap(
            fd,
            start,
            u64::MAX - start,
            cowlink_sys::FIEMAP_FLAG_SYNC,
            &mut raw,
        )?;
        if n == 0 {
            break;
        }
        let last = raw[raw.len() - 1];
        if last.flags & cowlink_sys::FIEMAP_EXTENT_LAST != 0 || raw.len() == before {
            break;
        }
        start = last.logical + last.length;
    }
    Ok(raw
        .into_iter()
        .map(|e| Extent {
            logical: e.logical,
            physical: e.physical,
            length: e.length,
            flags: e.flags,
        })
        .collect())
}

/// All extents of the file at `path`.
///
/// # Errors
/// `NotFound`, `PermissionDenied`, `IsDirectory`, and `NotSupported` when
/// the filesystem has no FIEMAP (tmpfs, ZFS).
pub fn extents(path: impl AsRef<Path>) -> Result<Vec<Extent>> {
    let path = path.as_ref();
    let op = Operation::Extents;
    let fd = fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| Error::from_errno(op, e).with_src(path))?;
    extents_fd(fd.as_fd()).map_err(|e| {
        let err = Error::from_errno(op, e).with_src(path);
        match e {
            Errno::OPNOTSUPP => err
                .with_kind(ErrorKind::NotSupported)
                .with_reason("this filesystem does not report file extents (no FIEMAP)"),
            _ => err,
        }
    })
}
