//! Carrying out a plan: `FIDEDUPERANGE` only, in chunks of at most
//! [`CHUNK`], groups in source-path order, the space given back taken from
//! the plan's extent maps or, on request, measured before and after (see
//! the module notes in `mod.rs`).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs;

use super::{open_read, DedupeGroup, DedupeOptions, DedupePlan, CHUNK};
use crate::ground::error::{Error, Operation};
use crate::ground::lock;
use crate::run::{Phase, Run};

/// What [`execute`] did.
#[derive(Debug, Default, serde::Serialize)]
pub struct DedupeReport {
    /// Groups worked on.
    pub groups: u64,
    /// Targets whose every byte the kernel found equal and now shares.
    pub targets_deduped: u64,
    /// Sum of the sizes of those targets.
    pub bytes_compared: u64,
    /// Space given back. Without [`DedupeOptions::measure`]: the bytes
    /// the targets now sharing in full held alone, from their extent maps
    /// when planned (a group's [`DedupeGroup::reclaimable`], in proportion to
    /// its targets done). With it: free space gained, from `statfs` before
    /// and after, each after a `syncfs`, summed over the filesystems
    /// involved.
    pub bytes_reclaimed: u64,
    /// `bytes_reclaimed` was measured ([`DedupeOptions::measure`]) rather
    /// than taken from the extent maps.
    pub measured: bool,
    /// Targets (or sources) that changed since the plan: left untouched
    /// from the first differing chunk on.
    #[serde(flatten, serialize_with = "crate::name::json::changed")]
    pub changed: Vec<PathBuf>,
    /// Targets of groups formed from the file edges alone
    /// ([`DedupeGroup::blake3`] `None`) that the kernel found different from
    /// their source: not changed, just not identical after all. They were
    /// hashed whole with their sources and grouped again.
    pub regrouped: u64,
    /// Targets the kernel refused, and files that could not be opened.
    pub errors: Vec<Error>,
    /// The run was cancelled: groups not started were left as they were
    /// (a started `FIDEDUPERANGE` call always completes; the kernel only
    /// shares what it found equal).
    pub cancelled: bool,
}

/// What the Dedupe phase counts for `groups`: their targets, and the
/// targets' bytes.
pub(super) fn totals(groups: &[DedupeGroup]) -> (u64, u64) {
    let files = groups.iter().map(|g| g.targets.len() as u64).sum();
    let bytes = groups.iter().map(|g| g.size * g.targets.len() as u64).sum();
    (files, bytes)
}

/// Carry out `plan` with `FIDEDUPERANGE` only, groups in parallel on
/// `opts.run`'s threads. Never fails as a whole: every problem is listed
/// in the report and the run goes on (until cancelled).
///
/// A group without a whole-file hash (from [`dedupe`](super::dedupe)'s
/// plan) is confirmed by the kernel's comparison; a target found different
/// is hashed whole with its source and grouped again, as `dedupe` does.
pub fn execute(plan: &DedupePlan, opts: &DedupeOptions) -> DedupeReport {
    let tally = Counters::new(&opts.run);
    let (files, bytes) = totals(&plan.groups);
    tally.show(files, bytes);
    let mut ex = Executor::new(&opts.run, &tally, opts.measure);
    ex.start(&plan.groups);
    let unsettled = ex.take_unsettled();
    if !unsettled.is_empty() && !opts.run.cancelled() {
        if let Some(second) = super::regroup(&unsettled, opts, None) {
            ex.start(&second.groups);
        }
    }
    ex.finish()
}

/// Dedupe progress that may begin before [`Phase::Dedupe`] is shown (while
/// the plan still hashes): work done early is held back and handed over
/// when the phase is entered, so the hashing's counters stay its own.
pub(super) struct Counters<'a> {
    run: &'a Run,
    /// Shown yet, and files and bytes done before it was.
    held: Mutex<(bool, u64, u64)>,
}

impl<'a> Counters<'a> {
    pub(super) fn new(run: &'a Run) -> Self {
        Counters {
            run,
            held: Mutex::new((false, 0, 0)),
        }
    }

    /// Enter [`Phase::Dedupe`] for all the groups (`files` targets of
    /// `bytes` in all), with what was done so far.
    pub(super) fn show(&self, files: u64, bytes: u64) {
        let mut held = lock(&self.held);
        self.run.enter(Phase::Dedupe, files, bytes);
        self.run.done(held.1, held.2);
        held.0 = true;
    }

    fn done(&self, files: u64, bytes: u64) {
        let mut held = lock(&self.held);
        if held.0 {
            self.run.done(files, bytes);
        } else {
            held.1 += files;
            held.2 += bytes;
        }
    }
}

/// Carries out groups as they are handed over ([`Executor::start`], any
/// number of times), then measures what came back ([`Executor::finish`]).
/// The free space of a filesystem is read before its first group runs.
pub(super) struct Executor<'a> {
    run: &'a Run,
    tally: &'a Counters<'a>,
    pool: Option<rayon::ThreadPool>,
    /// Free space per filesystem before anything ran there, keyed by device
    /// (`None`: it could not be read); `None` when not measuring.
    free_before: Option<FreeBefore>,
    /// Devices where something was shared: only their free space can have
    /// grown because of us (elsewhere a change is someone else's).
    shared_on: HashSet<u64>,
    /// (source, target) of edge-only groups whose bytes differ.
    unsettled: Vec<(PathBuf, PathBuf)>,
    report: DedupeReport,
}

impl<'a> Executor<'a> {
    /// `measure`: read the free space (after a `syncfs`) before the first
    /// group on each filesystem and at the end, for the report.
    pub(super) fn new(run: &'a Run, tally: &'a Counters<'a>, measure: bool) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(run.threads_or(crate::run::cores))
            .build()
            .ok();
        Executor {
            run,
            tally,
            pool,
            free_before: measure.then(|| Mutex::new(HashMap::new())),
            shared_on: HashSet::new(),
            unsettled: Vec::new(),
            report: DedupeReport::default(),
        }
    }

    /// Carry out `groups` (in parallel) and wait for them.
    pub(super) fn start(&mut self, groups: &[DedupeGroup]) {
        // Disk order (approximately: path order) rather than size order.
        let mut order: Vec<&DedupeGroup> = groups.iter().collect();
        order.sort_by(|a, b| a.source.cmp(&b.source));
        let (run, tally, free_before) = (self.run, self.tally, self.free_before.as_ref());
        type Part = (Option<u64>, DedupeReport, Vec<(PathBuf, PathBuf)>);
        let work = || -> Vec<Part> {
            order
                .par_iter()
                .map(|g| {
                    let mut r = DedupeReport::default();
                    let mut differ = Vec::new();
                    let mut dev = None;
                    if !run.cancelled() {
                        r.groups = 1;
                        dev = dedupe_group(g, &mut r, &mut differ, run, tally, free_before);
                    }
                    (dev, r, differ)
                })
                .collect()
        };
        let parts = match &self.pool {
            Some(pool) => pool.install(work),
            None => work(),
        };
        let report = &mut self.report;
        for (dev, r, differ) in parts {
            if let (Some(d), true) = (dev, r.targets_deduped > 0) {
                self.shared_on.insert(d);
            }
            report.groups += r.groups;
            report.targets_deduped += r.targets_deduped;
            report.bytes_compared += r.bytes_compared;
            report.bytes_reclaimed += r.bytes_reclaimed;
            report.changed.extend(r.changed);
            report.errors.extend(r.errors);
            report.regrouped += differ.len() as u64;
            self.unsettled.extend(differ);
        }
    }

    /// The (source, target) pairs of edge-only groups that the kernel
    /// found different since the last call.
    pub(super) fn take_unsettled(&mut self) -> Vec<(PathBuf, PathBuf)> {
        std::mem::take(&mut self.unsettled)
    }

    /// Measure the space given back (when asked to) and close the run.
    pub(super) fn finish(mut self) -> DedupeReport {
        self.report.cancelled = self.run.cancelled();
        let Some(free_before) = self.free_before else {
            self.run.finish();
            return self.report;
        };
        let free_before = free_before.into_inner().unwrap_or_else(|e| e.into_inner());
        self.report.measured = true;
        self.report.bytes_reclaimed = 0;
        for (dev, (fd, before)) in free_before
            .iter()
            .filter_map(|(d, m)| Some((d, m.as_ref()?)))
        {
            if !self.shared_on.contains(dev) {
                continue;
            }
            if let Some(after) = free_space(fd) {
                self.report.bytes_reclaimed += after.saturating_sub(*before);
            }
        }
        self.run.finish();
        self.report
    }
}

/// Free space per device before the first group there, with a descriptor
/// to read it again after.
type FreeBefore = Mutex<HashMap<u64, Option<(OwnedFd, u64)>>>;

/// Read the free space of `src`'s filesystem (device `dev`) unless it was
/// read already. Called before a group's first `FIDEDUPERANGE`; a group on
/// a new device waits here until its measure is taken, so no sharing there
/// comes before it.
fn measure_once(free_before: &FreeBefore, dev: u64, src: &OwnedFd) {
    let mut map = lock(free_before);
    if let Entry::Vacant(slot) = map.entry(dev) {
        let fd = rustix::io::fcntl_dupfd_cloexec(src, 0).ok();
        slot.insert(fd.and_then(|fd| free_space(&fd).map(|free| (fd, free))));
    }
}

/// Free bytes (for unprivileged users) after committing pending work.
fn free_space(fd: &OwnedFd) -> Option<u64> {
    cowlink_sys::sync_filesystem(fd.as_fd()).ok()?;
    let s = fs::fstatvfs(fd).ok()?;
    Some(s.f_bavail * s.f_frsize)
}

/// Carry out one group; returns the source's device once it was opened.
/// Targets of an edge-only group that differ from the source go to
/// `differ` (source, target), not to the report's `changed`. The free
/// space is read first when `free_before` is given (measuring).
fn dedupe_group(
    g: &DedupeGroup,
    report: &mut DedupeReport,
    differ: &mut Vec<(PathBuf, PathBuf)>,
    run: &Run,
    tally: &Counters<'_>,
    free_before: Option<&FreeBefore>,
) -> Option<u64> {
    let op = Operation::Dedupe;
    let src = match open_read(&g.source) {
        Ok(fd) => fd,
        Err(e) => {
            report
                .errors
                .push(Error::from_errno(op, e).with_src(&g.source));
            return None;
        }
    };
    let dev = match cowlink_sys::fstat(&src) {
        Ok(st) if st.st_size as u64 == g.size => st.st_dev,
        Ok(_) => {
            report.changed.push(g.source.clone());
            return None;
        }
        Err(e) => {
            report
                .errors
                .push(Error::from_errno(op, e).with_src(&g.source));
            return None;
        }
    };
    if let Some(free_before) = free_before {
        measure_once(free_before, dev, &src);
    }
    let mut done = 0u64;
    for batch in g.targets.chunks(cowlink_sys::DEDUPE_MAX_DESTS) {
        // Open every target of the batch; a size change means it changed.
        let mut live: Vec<(&PathBuf, OwnedFd)> = Vec::new();
        for t in batch {
            let fd = match open_read(t) {
                Ok(fd) => fd,
                Err(e) => {
                    report.errors.push(Error::from_errno(op, e).with_src(t));
                    continue;
                }
            };
            match cowlink_sys::fstat(&fd) {
                Ok(st) if st.st_size as u64 == g.size => live.push((t, fd)),
                Ok(_) => report.changed.push(t.clone()),
                Err(e) => report.errors.push(Error::from_errno(op, e).with_src(t)),
            }
        }
        let mut off = 0u64;
        while off < g.size && !live.is_empty() && !run.cancelled() {
            let len = CHUNK.min(g.size - off);
            let dests: Vec<(rustix::fd::BorrowedFd<'_>, u64)> =
                live.iter().map(|(_, fd)| (fd.as_fd(), off)).collect();
            let results = cowlink_sys::fideduperange(src.as_fd(), off, len, &dests);
            drop(dests);
            let mut keep = Vec::with_capacity(live.len());
            match results {
                Ok(results) => {
                    for ((t, fd), r) in live.into_iter().zip(results) {
                        match r.status {
                            cowlink_sys::DedupeStatus::Same => keep.push((t, fd)),
                            cowlink_sys::DedupeStatus::Differs if g.blake3.is_none() => {
                                differ.push((g.source.clone(), t.clone()))
                            }
                            cowlink_sys::DedupeStatus::Differs => report.changed.push(t.clone()),
                            cowlink_sys::DedupeStatus::Error(e) => report
                                .errors
                                .push(Error::from_errno(op, e).with_src(&g.source).with_dst(t)),
                        }
                    }
                }
                Err(e) => {
                    for (t, _) in live {
                        report
                            .errors
                            .push(Error::from_errno(op, e).with_src(&g.source).with_dst(t));
                    }
                }
            }
            live = keep;
            let finished = if off + len == g.size { live.len() } else { 0 };
            tally.done(finished as u64, len * live.len() as u64);
            off += len;
        }
        if off < g.size {
            // Cancelled between chunks: the shared prefix stays shared,
            // the rest is untouched; not counted as deduplicated.
            live.clear();
        }
        done += live.len() as u64;
    }
    report.targets_deduped += done;
    report.bytes_compared += g.size * done;
    // The group's expected bytes, for the targets now sharing in full.
    if !g.targets.is_empty() {
        report.bytes_reclaimed +=
            (u128::from(g.reclaimable) * u128::from(done) / g.targets.len() as u128) as u64;
    }
    Some(dev)
}
