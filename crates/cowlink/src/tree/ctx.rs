//! What every entry copy needs from the run, apart from the scheduler:
//! options, the observer, counters, the hardlink table and the destination
//! root. `copy.rs` owns one and lends it to `entry.rs`.

use std::sync::Mutex;

use rustix::fd::OwnedFd;

use super::links::LinkTable;
use super::{Observer, Prompt, TreeEvent, TreeOptions, TreeReport};
use crate::ground::error::Error;
use crate::run::{Count, Progress};

/// The run as entry copies see it.
pub(super) struct Ctx<'a> {
    pub(super) opts: &'a TreeOptions,
    pub(super) observer: &'a dyn Observer,
    /// This copy's totals (its report).
    pub(super) counts: Progress,
    pub(super) links: LinkTable,
    /// The destination root (a second descriptor), for `linkat` of hardlinks.
    pub(super) root_dst: Option<OwnedFd>,
    /// Held while the observer is asked a question: one at a time.
    pub(super) asking: Mutex<()>,
}

impl Ctx<'_> {
    pub(super) fn emit(&self, event: TreeEvent<'_>) {
        self.observer.event(&event);
    }

    /// Count `n` of `c`, in this copy's totals and the run's progress.
    pub(super) fn count(&self, c: Count, n: u64) {
        self.counts.add(c, n);
        if let Some(p) = &self.opts.run.progress {
            p.add(c, n);
        }
    }

    /// Ask the observer whether an existing destination may be replaced.
    pub(super) fn may_replace(&self, prompt: &Prompt<'_>) -> bool {
        let _one = crate::ground::lock(&self.asking);
        self.observer.may_replace(prompt)
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
        TreeReport::from_totals(self.counts.totals(), self.cancelled())
    }
}
