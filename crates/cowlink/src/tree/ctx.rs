//! What every entry copy needs from the run, apart from the scheduler:
//! options, the observer, counters, the hardlink table and the destination
//! root. `copy.rs` owns one and lends it to `entry.rs`.

use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fd::OwnedFd;

use super::links::LinkTable;
use super::{Observer, TreeEvent, TreeOptions, TreeReport};
use crate::ground::error::Error;

#[derive(Default)]
pub(super) struct Counts {
    pub(super) files: AtomicU64,
    pub(super) dirs: AtomicU64,
    pub(super) symlinks: AtomicU64,
    pub(super) hardlinks: AtomicU64,
    pub(super) specials: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) cloned: AtomicU64,
    pub(super) copied: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) skipped: AtomicU64,
}

/// Add one to a counter.
pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The run as entry copies see it.
pub(super) struct Ctx<'a> {
    pub(super) opts: &'a TreeOptions,
    pub(super) observer: &'a dyn Observer,
    pub(super) counts: Counts,
    pub(super) links: LinkTable,
    /// The destination root (a second descriptor), for `linkat` of hardlinks.
    pub(super) root_dst: Option<OwnedFd>,
}

impl Ctx<'_> {
    pub(super) fn emit(&self, event: TreeEvent<'_>) {
        self.observer.event(&event);
    }

    /// Record a per-entry failure.
    pub(super) fn fail(&self, e: Error) {
        bump(&self.counts.errors, 1);
        self.emit(TreeEvent::Failed(&e));
    }

    pub(super) fn cancelled(&self) -> bool {
        self.opts.run.cancelled()
    }

    pub(super) fn report(&self) -> TreeReport {
        let c = &self.counts;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TreeReport {
            files: g(&c.files),
            dirs: g(&c.dirs),
            symlinks: g(&c.symlinks),
            hardlinks: g(&c.hardlinks),
            specials: g(&c.specials),
            bytes: g(&c.bytes),
            cloned: g(&c.cloned),
            copied: g(&c.copied),
            errors: g(&c.errors),
            skipped: g(&c.skipped),
            cancelled: self.cancelled(),
        }
    }
}
