//! One directory of a tree copy, open on both sides: what the scheduler
//! (`copy.rs`, through the walker engine) queues and what every entry copy (`entry.rs`) works in.

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::Dir;

use crate::prim::place::Placement;

/// A directory being copied: its source and destination, open.
pub(super) struct DirNode {
    pub(super) src_path: PathBuf,
    pub(super) dst_path: PathBuf,
    /// Path below the destination root (for hardlinks to earlier copies).
    pub(super) rel: PathBuf,
    pub(super) src: OwnedFd,
    /// `None` in a dry run.
    pub(super) dst: Option<OwnedFd>,
    /// The entries not read yet; `None` once the end was reached.
    pub(super) reader: Mutex<Option<Dir>>,
    /// The source directory's stat.
    pub(super) st: Stat,
    /// The mode to end with when modes are not preserved, and whether the
    /// current mode differs from it (we added u+rwx to work inside).
    pub(super) final_mode: u32,
    pub(super) mode_changed: bool,
    /// The group new files get in the destination directory (the
    /// directory's when it is set-group-ID), if known.
    pub(super) new_gid: Option<u32>,
    /// False for the parent directories of a single-entry copy, which are
    /// not ours to change.
    pub(super) finish: bool,
    /// How files get their names here: directly where this run created
    /// the directory, atomically where it merges into an existing one.
    pub(super) placement: Placement,
    pub(super) parent: Option<Arc<DirNode>>,
}

impl DirNode {
    /// The source and destination paths of the entry `name` in this directory.
    pub(super) fn paths(&self, name: &CStr) -> (PathBuf, PathBuf) {
        let n = OsStr::from_bytes(name.to_bytes());
        (self.src_path.join(n), self.dst_path.join(n))
    }

    /// The destination directory (not called in a dry run).
    pub(super) fn dst_fd(&self) -> BorrowedFd<'_> {
        self.dst
            .as_ref()
            .expect("destination is open outside dry runs")
            .as_fd()
    }
}
