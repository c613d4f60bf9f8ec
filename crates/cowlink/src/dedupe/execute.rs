//! Carrying out a plan: `FIDEDUPERANGE` only, in chunks of at most
//! [`CHUNK`], groups in source-path order, space measured before and
//! after (see the module notes in `mod.rs`).

use std::collections::HashMap;
use std::path::PathBuf;

use rayon::prelude::*;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs;

use super::{open_read, DedupeOptions, Group, Plan, CHUNK};
use crate::ground::error::{Error, Operation};
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
    /// Free space gained, measured with `statfs` before and after (after a
    /// `syncfs`), summed over the filesystems involved.
    pub bytes_reclaimed: u64,
    /// Targets (or sources) that changed since the plan: left untouched
    /// from the first differing chunk on.
    #[serde(flatten, serialize_with = "crate::name::json::changed")]
    pub changed: Vec<PathBuf>,
    /// Targets the kernel refused, and files that could not be opened.
    pub errors: Vec<Error>,
    /// The run was cancelled: groups not started were left as they were
    /// (a started `FIDEDUPERANGE` call always completes; the kernel only
    /// shares what it found equal).
    pub cancelled: bool,
}

/// Carry out `plan` with `FIDEDUPERANGE` only, groups in parallel on
/// `opts.run`'s threads. Never fails as a whole: every problem is listed
/// in the report and the run goes on (until cancelled).
pub fn execute(plan: &Plan, opts: &DedupeOptions) -> DedupeReport {
    let run = &opts.run;
    let mut report = DedupeReport::default();
    let total: u64 = plan
        .groups
        .iter()
        .map(|g| g.size * g.targets.len() as u64)
        .sum();
    run.enter(Phase::Dedupe, plan.targets(), total);
    // Free space per filesystem before, keyed by device.
    let mut free_before: HashMap<u64, (OwnedFd, u64)> = HashMap::new();
    let mut dev_of: HashMap<&std::path::Path, u64> = HashMap::new();
    for g in &plan.groups {
        if let Ok(fd) = open_read(&g.source) {
            if let Ok(st) = fs::fstat(&fd) {
                dev_of.insert(&g.source, st.st_dev);
                if let std::collections::hash_map::Entry::Vacant(slot) =
                    free_before.entry(st.st_dev)
                {
                    if let Some(free) = free_space(&fd) {
                        slot.insert((fd, free));
                    }
                }
            }
        }
    }
    // Disk order (approximately: path order) rather than size order.
    let mut order: Vec<&Group> = plan.groups.iter().collect();
    order.sort_by(|a, b| a.source.cmp(&b.source));
    let work = || -> Vec<(Option<u64>, DedupeReport)> {
        order
            .par_iter()
            .map(|g| {
                let mut r = DedupeReport::default();
                if !run.cancelled() {
                    r.groups = 1;
                    dedupe_group(g, &mut r, run);
                }
                (dev_of.get(g.source.as_path()).copied(), r)
            })
            .collect()
    };
    let parts = match rayon::ThreadPoolBuilder::new()
        .num_threads(run.threads_or(crate::run::cores))
        .build()
    {
        Ok(pool) => pool.install(work),
        Err(_) => work(),
    };
    // Devices where something was shared: only their free space can have
    // grown because of us (elsewhere a change is someone else's).
    let mut shared_on: std::collections::HashSet<u64> = Default::default();
    for (dev, r) in parts {
        if let (Some(d), true) = (dev, r.targets_deduped > 0) {
            shared_on.insert(d);
        }
        report.groups += r.groups;
        report.targets_deduped += r.targets_deduped;
        report.bytes_compared += r.bytes_compared;
        report.changed.extend(r.changed);
        report.errors.extend(r.errors);
    }
    for (dev, (fd, before)) in &free_before {
        if !shared_on.contains(dev) {
            continue;
        }
        if let Some(after) = free_space(fd) {
            report.bytes_reclaimed += after.saturating_sub(*before);
        }
    }
    report.cancelled = run.cancelled();
    run.finish();
    report
}

/// Free bytes (for unprivileged users) after committing pending work.
fn free_space(fd: &OwnedFd) -> Option<u64> {
    fs::syncfs(fd).ok()?;
    let s = fs::fstatfs(fd).ok()?;
    Some(s.f_bavail * s.f_frsize as u64)
}

fn dedupe_group(g: &Group, report: &mut DedupeReport, run: &Run) {
    let op = Operation::Dedupe;
    let src = match open_read(&g.source) {
        Ok(fd) => fd,
        Err(e) => {
            report
                .errors
                .push(Error::from_errno(op, e).with_src(&g.source));
            return;
        }
    };
    match fs::fstat(&src) {
        Ok(st) if st.st_size as u64 == g.size => {}
        Ok(_) => {
            report.changed.push(g.source.clone());
            return;
        }
        Err(e) => {
            report
                .errors
                .push(Error::from_errno(op, e).with_src(&g.source));
            return;
        }
    }
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
            match fs::fstat(&fd) {
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
            run.done(finished as u64, len * live.len() as u64);
            off += len;
        }
        if off < g.size {
            // Cancelled between chunks: the shared prefix stays shared,
            // the rest is untouched; not counted as deduplicated.
            live.clear();
        }
        report.targets_deduped += live.len() as u64;
        report.bytes_compared += g.size * live.len() as u64;
    }
}
