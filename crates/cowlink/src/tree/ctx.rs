//! What every entry copy needs from the run, apart from the scheduler:
//! options, the observer, counters, the hardlink table and the destination
//! root. `copy.rs` owns one and lends it to `entry.rs`.

use rustix::fd::OwnedFd;

use super::links::LinkTable;
use super::tally::{Count, Tally};
use super::{Observer, TreeEvent, TreeOptions, TreeReport};
use crate::ground::error::Error;

/// The run as entry copies see it.
pub(super) struct Ctx<'a> {
    pub(super) opts: &'a TreeOptions,
    pub(super) observer: &'a dyn Observer,
    /// This copy's totals (its report).
    pub(super) counts: Tally,
    pub(super) links: LinkTable,
    /// The destination root (a second descriptor), for `linkat` of hardlinks.
    pub(super) root_dst: Option<OwnedFd>,
}

impl Ctx<'_> {
    pub(super) fn emit(&self, event: TreeEvent<'_>) {
        self.observer.event(&event);
    }

    /// Count `n` of `c`, in this copy's totals and the caller's tally.
    pub(super) fn count(&self, c: Count, n: u64) {
        self.counts.add(c, n);
        if let Some(t) = &self.opts.tally {
            t.add(c, n);
        }
    }

    /// Record a per-entry failure.
    pub(super) fn fail(&self, e: Error) {
        self.count(Count::Errors, 1);
        self.emit(TreeEvent::Failed(&e));
    }

    pub(super) fn cancelled(&self) -> bool {
        self.opts.run.cancelled()
    }

    pub(super) fn report(&self) -> TreeReport {
        TreeReport {
            cancelled: self.cancelled(),
            ..self.counts.report()
        }
    }
}
