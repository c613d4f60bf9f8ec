//! Run control: the one contract every long operation takes.
//!
//! A tree copy, a usage report, a dedupe plan or execution, a store ingest,
//! checkout or verify all take a [`Run`]: how many worker threads, a
//! [`CancelToken`] to stop them, and an optional [`Progress`] to report to.
//! The caller owns all three; the library only reads the token and writes
//! the counters.
//!
//! - **Threads**: `0` always means "choose for me". What is chosen depends
//!   on the work: [`default_threads`] for work bound by the destination
//!   filesystem (tree copies, checkouts), one per core for reading work
//!   (walks, hashing). Any request is capped at [`MAX_THREADS`].
//! - **Cancel**: after [`CancelToken::cancel`] the workers finish the item
//!   they are on (a file is complete under its name or removed; a store
//!   object is stored whole or not at all), start nothing new, and the
//!   operation returns: reports say `cancelled`, operations that return a
//!   `Result` fail with [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled).
//! - **Progress**: the one progress type: a [`Phase`] and four counters
//!   that start from zero in each phase, plus [`Totals`] by kind (files,
//!   bytes, cloned, copied, skipped, errors...) that no phase resets, all
//!   lock-free atomics read from any thread while the operation runs (a
//!   display thread polls [`Progress::snapshot`] and
//!   [`Progress::totals`]). A tree copy counts into both; a front end
//!   copying many arguments counts its single files in with
//!   [`Progress::count_file`].
// Off Unix only the counters and the cancel token serve (the tree copy
// there runs on the calling thread): the thread tuning, used by the
// descriptor-based engines, is compiled but idle.
#![cfg_attr(not(unix), allow(dead_code))]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ground::fskind::FsKind;
use crate::prim::mode::{Method, Outcome};

/// The most worker threads any operation uses, whatever is asked: past a
/// few per core, threads only contend for the filesystem's locks.
pub const MAX_THREADS: usize = 64;

/// The default number of worker threads for work whose destination
/// filesystem sets the pace (tree copies and store checkouts), but for
/// clone-bound work into Btrfs, which measures: `default_workers`.
///
/// Measured on a real system tree (see docs/ARCHITECTURE.md
/// "Concurrency"): cloning into Btrfs is slower with two threads than with
/// one (its b-tree locks serialize the work and a second thread only adds
/// contention), so clone-bound work on Btrfs gets one thread. Everywhere
/// else, and for data copies, one thread per core.
pub fn default_threads(fs: FsKind, clone_bound: bool) -> usize {
    match fs {
        FsKind::Btrfs if clone_bound => 1,
        _ => cores(),
    }
}

/// The workers a tree copy uses when not told: [`default_threads`], except
/// clone-bound work on Btrfs, which measures one thread against one per
/// core while it runs and keeps the faster (`walk::pool::Tuner`). One
/// thread was the faster there on one machine (2.50 s against 2.94 s for
/// the bare floor loop over a real /usr, 2026-11-23) and two on another
/// (4.90 s against 3.98 s, 2026-11-24): the answer is the machine's, so it
/// is measured on it. Store checkouts follow the same policy (their rayon
/// pool keeps every thread; a [`Gate`] holds back those not wanted).
pub(crate) fn default_workers(fs: FsKind, clone_bound: bool) -> Threads {
    match (fs, clone_bound, cores()) {
        (FsKind::Btrfs, true, high) if high > 1 => Threads::Adaptive { low: 1, high },
        _ => Threads::Fixed(default_threads(fs, clone_bound)),
    }
}

/// How many of a pool's workers take jobs (the walker's, `walk::pool`;
/// a checkout's pool keeps every thread and a [`Gate`] holds the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Threads {
    /// This many, throughout.
    Fixed(usize),
    /// `low` or `high`, whichever hands more entries per second to the
    /// driver, tried in turns while the work runs ([`Tuner`]).
    Adaptive {
        /// The fewer workers.
        low: usize,
        /// The more workers (also the number of threads started).
        high: usize,
    },
}

/// Chooses between two worker counts by measuring both, again and again:
/// a trial of `high` then one of `low` (each [`Tuner::TRIAL`] long), then
/// the faster of the two for [`Tuner::KEEP`], then trials again. A tree's
/// parts differ (a directory of large files, one of tiny ones), so one
/// early verdict is not trusted for the whole walk; the price is the time
/// spent on trials of the slower count, about a tenth of the walk.
#[derive(Debug)]
pub(crate) struct Tuner {
    low: usize,
    high: usize,
    stage: Stage,
    /// When the current stage began, and the entries done by then.
    since: Instant,
    at: u64,
    /// Entries per second of the trial of `high`.
    high_rate: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Stage {
    TryHigh,
    TryLow,
    Keep,
}

impl Tuner {
    /// How long each count is tried.
    pub(crate) const TRIAL: Duration = Duration::from_millis(200);
    /// How long the winner runs before the next trials.
    pub(crate) const KEEP: Duration = Duration::from_millis(3000);

    /// A tuner starting (at `now`) with a trial of `high`.
    pub(crate) fn new(low: usize, high: usize, now: Instant) -> Tuner {
        Tuner {
            low,
            high,
            stage: Stage::TryHigh,
            since: now,
            at: 0,
            high_rate: 0.0,
        }
    }

    /// The worker count to start with.
    pub(crate) fn first(&self) -> usize {
        self.high
    }

    /// Given the time and the entries done so far, the worker count to
    /// switch to, if it changes.
    pub(crate) fn tick(&mut self, now: Instant, done: u64) -> Option<usize> {
        let spent = now.saturating_duration_since(self.since);
        let long = match self.stage {
            Stage::TryHigh | Stage::TryLow => Self::TRIAL,
            Stage::Keep => Self::KEEP,
        };
        if spent < long {
            return None;
        }
        let rate = done.saturating_sub(self.at) as f64 / spent.as_secs_f64();
        let (stage, count) = match self.stage {
            Stage::TryHigh => {
                self.high_rate = rate;
                (Stage::TryLow, self.low)
            }
            // More threads unless fewer were faster.
            Stage::TryLow if rate > self.high_rate => (Stage::Keep, self.low),
            Stage::TryLow => (Stage::Keep, self.high),
            Stage::Keep => (Stage::TryHigh, self.high),
        };
        self.stage = stage;
        self.since = now;
        self.at = done;
        Some(count)
    }
}

/// Lets at most a [`Tuner`]'s current count of threads through at once,
/// for work spread over a thread pool that cannot shrink (rayon): the
/// pool keeps every thread, and those over the count wait here. Each pass
/// counts `items` done, which is what the tuner measures.
pub(crate) struct Gate {
    state: std::sync::Mutex<GateState>,
    freed: std::sync::Condvar,
}

struct GateState {
    inside: usize,
    limit: usize,
    done: u64,
    tuner: Tuner,
}

impl Gate {
    /// A gate choosing between `low` and `high` threads.
    pub(crate) fn new(low: usize, high: usize) -> Gate {
        let tuner = Tuner::new(low.max(1), high.max(low).max(1), Instant::now());
        Gate {
            state: std::sync::Mutex::new(GateState {
                inside: 0,
                limit: tuner.first(),
                done: 0,
                tuner,
            }),
            freed: std::sync::Condvar::new(),
        }
    }

    /// Run `f` (which does `items` units of work) once fewer than the
    /// current count of threads are inside.
    pub(crate) fn pass<R>(&self, items: u64, f: impl FnOnce() -> R) -> R {
        {
            let mut st = crate::ground::lock(&self.state);
            loop {
                let (now, done) = (Instant::now(), st.done);
                if let Some(n) = st.tuner.tick(now, done) {
                    st.limit = n;
                    self.freed.notify_all();
                }
                if st.inside < st.limit {
                    break;
                }
                st = self
                    .freed
                    .wait_timeout(st, Duration::from_millis(20))
                    .map_or_else(|e| e.into_inner().0, |(g, _)| g);
            }
            st.inside += 1;
        }
        // Leaves even if `f` panics, so no thread waits for ever.
        struct Leave<'a>(&'a Gate, u64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let mut st = crate::ground::lock(&self.0.state);
                st.inside -= 1;
                st.done += self.1;
                self.0.freed.notify_one();
            }
        }
        let _leave = Leave(self, items);
        f()
    }
}

/// One thread per core (at least 1, at most [`MAX_THREADS`]): the default
/// for reading work (walks, hashing).
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
}

/// `requested` threads, or `auto()` when `requested` is 0; never 0, never
/// more than [`MAX_THREADS`].
pub fn resolve_threads(requested: usize, auto: impl FnOnce() -> usize) -> usize {
    let n = match requested {
        0 => auto(),
        n => n,
    };
    n.clamp(1, MAX_THREADS)
}

/// A cancellation token: clone it, hand one copy to an operation (in its
/// [`Run`]) and call [`CancelToken::cancel`] on another, from any thread or
/// a signal handler's thread.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask every operation holding this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What an operation is doing, for progress displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Phase {
    /// Walking the paths (files counted as they are seen).
    #[default]
    Scan = 0,
    /// Reading and hashing contents (bytes counted).
    Hash = 1,
    /// Cloning or copying files into place (files and bytes counted).
    Copy = 2,
    /// Asking the kernel to share identical blocks (bytes counted).
    Dedupe = 3,
    /// Re-reading stored objects to check them (files and bytes counted).
    Verify = 4,
    /// Finished.
    Done = 5,
    /// Sending objects to a remote store (files and bytes counted).
    Upload = 6,
    /// Fetching objects from a remote store (files and bytes counted).
    Download = 7,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Scan,
            1 => Phase::Hash,
            2 => Phase::Copy,
            3 => Phase::Dedupe,
            4 => Phase::Verify,
            6 => Phase::Upload,
            7 => Phase::Download,
            _ => Phase::Done,
        }
    }
}

/// What a running total counts ([`Totals`] has one field per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    Files,
    Dirs,
    Symlinks,
    Hardlinks,
    Specials,
    Bytes,
    Cloned,
    Copied,
    Skipped,
    Errors,
}

/// Live counters, written by the worker threads and read by a display:
/// the one progress type of every long operation.
///
/// Two sets: the current [`Phase`] with its files and bytes done and
/// expected ([`Progress::snapshot`]), which each phase starts at zero (a
/// total of 0 means "not known": a walk's is never known, a checkout's is
/// known up front); and [`Totals`] by kind ([`Progress::totals`]), which
/// only grow, so one `Progress` can total several operations (a tree copy
/// counts into the one in its [`Run`]).
#[derive(Debug, Default)]
pub struct Progress {
    phase: AtomicU8,
    files_done: AtomicU64,
    files_total: AtomicU64,
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
    totals: [AtomicU64; 10],
}

/// What was placed so far, by kind: a [`Progress`]'s running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    /// Regular files cloned or copied.
    pub files: u64,
    /// Directories created.
    pub dirs: u64,
    /// Symbolic links created.
    pub symlinks: u64,
    /// Hardlinks made.
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes recreated.
    pub specials: u64,
    /// Bytes of the files cloned or copied.
    pub bytes: u64,
    /// Files whose blocks are shared (cloned).
    pub cloned: u64,
    /// Files copied.
    pub copied: u64,
    /// Entries kept as they were.
    pub skipped: u64,
    /// Entries that failed.
    pub errors: u64,
}

/// A copy of a [`Progress`]'s counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ProgressSnapshot {
    /// The phase.
    pub phase: Phase,
    /// Files (or entries) done in this phase.
    pub files_done: u64,
    /// Files expected in this phase (0: not known).
    pub files_total: u64,
    /// Bytes done in this phase.
    pub bytes_done: u64,
    /// Bytes expected in this phase (0: not known).
    pub bytes_total: u64,
}

impl Progress {
    /// A progress at [`Phase::Scan`] with every counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    /// Every counter, read now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            phase: self.phase(),
            files_done: self.files_done.load(Ordering::Relaxed),
            files_total: self.files_total.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
        }
    }

    /// Add `n` to the running total of `c`.
    pub(crate) fn add(&self, c: Count, n: u64) {
        self.totals[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Count a file placed on its own (by [`clone_file`](crate::clone_file)):
    /// a file and its bytes, cloned or copied; [`Method::Skipped`] counts
    /// as skipped and [`Method::Hardlink`] as a hardlink only.
    pub fn count_file(&self, outcome: &Outcome) {
        match outcome.method {
            Method::Skipped => self.add(Count::Skipped, 1),
            Method::Hardlink => self.add(Count::Hardlinks, 1),
            m => {
                self.add(Count::Files, 1);
                self.add(Count::Bytes, outcome.bytes);
                self.add(
                    match m {
                        Method::Reflink => Count::Cloned,
                        _ => Count::Copied,
                    },
                    1,
                );
            }
        }
    }

    /// Count an entry kept as it was (an existing or already complete
    /// destination).
    pub fn count_skipped(&self) {
        self.add(Count::Skipped, 1);
    }

    /// Count a failed entry.
    pub fn count_failed(&self) {
        self.add(Count::Errors, 1);
    }

    /// The running totals now.
    pub fn totals(&self) -> Totals {
        let get = |c: Count| self.totals[c as usize].load(Ordering::Relaxed);
        Totals {
            files: get(Count::Files),
            dirs: get(Count::Dirs),
            symlinks: get(Count::Symlinks),
            hardlinks: get(Count::Hardlinks),
            specials: get(Count::Specials),
            bytes: get(Count::Bytes),
            cloned: get(Count::Cloned),
            copied: get(Count::Copied),
            skipped: get(Count::Skipped),
            errors: get(Count::Errors),
        }
    }

    /// Start `phase` with the totals known so far (0 when unknown).
    pub(crate) fn enter(&self, phase: Phase, files_total: u64, bytes_total: u64) {
        self.files_done.store(0, Ordering::Relaxed);
        self.bytes_done.store(0, Ordering::Relaxed);
        self.files_total.store(files_total, Ordering::Relaxed);
        self.bytes_total.store(bytes_total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// Expect more work in this phase than its totals said.
    pub(crate) fn more(&self, files: u64, bytes: u64) {
        self.files_total.fetch_add(files, Ordering::Relaxed);
        self.bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Count work done.
    pub(crate) fn done(&self, files: u64, bytes: u64) {
        if files > 0 {
            self.files_done.fetch_add(files, Ordering::Relaxed);
        }
        if bytes > 0 {
            self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

/// How a long operation runs: threads, cancellation, progress.
/// `Default` is automatic threads, a token nobody cancels, no progress.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Worker threads; 0 chooses per operation (see the module notes).
    /// Capped at [`MAX_THREADS`].
    pub threads: usize,
    /// Stop early when this token is cancelled.
    pub cancel: CancelToken,
    /// Counters to report to.
    pub progress: Option<Arc<Progress>>,
}

impl Run {
    /// Use `n` threads (0: automatic).
    pub fn with_threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }

    /// Stop when `cancel` is cancelled.
    pub fn with_cancel(mut self, cancel: CancelToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Report to `progress`.
    pub fn with_progress(mut self, progress: Arc<Progress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// The thread count for this run, `auto()` when none was asked.
    pub(crate) fn threads_or(&self, auto: impl FnOnce() -> usize) -> usize {
        resolve_threads(self.threads, auto)
    }

    /// The workers for work that places files on a filesystem of kind
    /// `fs`: the count asked for, or, when none was, [`default_workers`].
    pub(crate) fn workers_for(&self, fs: FsKind, clone_bound: bool) -> Threads {
        match self.threads {
            0 => default_workers(fs, clone_bound),
            _ => Threads::Fixed(self.threads_or(|| 1)),
        }
    }

    /// Whether the run was cancelled.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Enter `phase` (when a progress is attached).
    pub(crate) fn enter(&self, phase: Phase, files_total: u64, bytes_total: u64) {
        if let Some(p) = &self.progress {
            p.enter(phase, files_total, bytes_total);
        }
    }

    /// Mark the run finished, keeping the last phase's counters.
    pub(crate) fn finish(&self) {
        if let Some(p) = &self.progress {
            p.phase.store(Phase::Done as u8, Ordering::Relaxed);
        }
    }

    /// Expect more work in this phase (when a progress is attached).
    pub(crate) fn more(&self, files: u64, bytes: u64) {
        if let Some(p) = &self.progress {
            p.more(files, bytes);
        }
    }

    /// Count work done (when a progress is attached).
    pub(crate) fn done(&self, files: u64, bytes: u64) {
        if let Some(p) = &self.progress {
            p.done(files, bytes);
        }
    }
}

/// How much freed heap a program keeps per allocator heap: see
/// [`keep_freed_heap`].
pub const KEPT_FREED_HEAP: usize = 2 << 20;

/// Whether the program asked for [`keep_freed_heap`]: then it also gets
/// [`release_free_heap`] between a run's phases.
static TUNED_HEAP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Between phases of a long run that let go of a large structure (a
/// dedupe's candidates once grouped, its records once written): hand the
/// allocator's free memory back to the system, so that the freed pages,
/// scattered between the blocks still in use on each thread's heap, are
/// not counted in the run's peak while the next phase grows. A
/// millisecond or two each time. Only in a program that called
/// [`keep_freed_heap`]; a host process's allocator is left alone.
pub(crate) fn release_free_heap() {
    if TUNED_HEAP.load(std::sync::atomic::Ordering::Relaxed) {
        cowlink_sys::malloc_release_free();
    }
}

/// For a program built on this library: let the C allocator keep up to
/// [`KEPT_FREED_HEAP`] of freed memory per heap for reuse, and give the
/// rest back between a run's phases (after a dedupe lets go of its
/// candidates, for one). Call it once at start, before any thread.
///
/// A dedupe rerun reads its index a directory at a time on every walk
/// thread, decoding and dropping a record each time. With glibc's
/// defaults each thread's heap was given back and faulted in again over
/// and over, about a page fault per file walked: over 154,608 files on
/// XFS the rerun spent 0.76× the CPU with 8 MiB kept, for 4 MiB more peak
/// memory (docs/benchmarks.md). 2 MiB keeps that (a rerun over 184,092
/// files: wall 1.03×, CPU 1.03× of 8 MiB's, within the noise) and its
/// peak 7 MiB lower. A library loaded by another program (the
/// Python module) leaves the host's allocator alone and does not call it.
pub fn keep_freed_heap() {
    cowlink_sys::malloc_keep_freed(KEPT_FREED_HEAP);
    TUNED_HEAP.store(true, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_threads_means_auto_and_requests_are_capped() {
        assert_eq!(resolve_threads(0, || 3), 3);
        assert_eq!(resolve_threads(5, || 3), 5);
        assert_eq!(resolve_threads(0, || 0), 1);
        assert_eq!(resolve_threads(1000, || 3), MAX_THREADS);
        assert_eq!(default_threads(FsKind::Btrfs, true), 1);
        assert_eq!(default_threads(FsKind::Btrfs, false), cores());
        assert_eq!(default_threads(FsKind::Xfs, true), cores());
        assert!((1..=MAX_THREADS).contains(&cores()));
    }

    #[test]
    fn a_phase_starts_from_zero_with_its_totals() {
        let p = Progress::new();
        assert_eq!(p.phase(), Phase::Scan);
        p.done(3, 0);
        p.enter(Phase::Hash, 0, 100);
        p.done(0, 40);
        assert_eq!(
            p.snapshot(),
            ProgressSnapshot {
                phase: Phase::Hash,
                files_done: 0,
                files_total: 0,
                bytes_done: 40,
                bytes_total: 100,
            }
        );
        for ph in [
            Phase::Scan,
            Phase::Hash,
            Phase::Copy,
            Phase::Dedupe,
            Phase::Verify,
            Phase::Done,
        ] {
            p.enter(ph, 0, 0);
            assert_eq!(p.phase(), ph);
        }
    }

    #[test]
    fn totals_count_by_method_and_outlive_phases() {
        let t = Progress::new();
        t.count_file(&Outcome {
            method: Method::Reflink,
            bytes: 10,
        });
        t.count_file(&Outcome {
            method: Method::CopyOffload,
            bytes: 5,
        });
        t.count_file(&Outcome {
            method: Method::Skipped,
            bytes: 0,
        });
        t.count_file(&Outcome {
            method: Method::Hardlink,
            bytes: 7,
        });
        t.count_failed();
        t.add(Count::Dirs, 2);
        t.enter(Phase::Copy, 3, 0);
        let r = t.totals();
        assert_eq!(
            (
                r.files,
                r.bytes,
                r.cloned,
                r.copied,
                r.skipped,
                r.errors,
                r.dirs,
                r.hardlinks
            ),
            (2, 15, 1, 1, 1, 1, 2, 1)
        );
        assert_eq!(t.snapshot().files_done, 0, "a phase resets only its own");
    }

    #[test]
    fn a_cancel_reaches_every_clone_of_the_token() {
        let run = Run::default();
        let other = run.clone();
        assert!(!other.cancelled());
        run.cancel.cancel();
        assert!(other.cancelled());
    }

    #[test]
    fn the_tuner_keeps_the_faster_count_and_tries_again_later() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut t = Tuner::new(1, 2, t0);
        assert_eq!(t.first(), 2);
        // Nothing changes before a trial has run its length.
        assert_eq!(t.tick(ms(100), 1_000), None);
        // high: 4,000 entries in 200 ms; then low: 5,000 in 200 ms.
        assert_eq!(t.tick(ms(200), 4_000), Some(1));
        assert_eq!(t.tick(ms(400), 9_000), Some(1), "low was faster: kept");
        assert_eq!(t.tick(ms(3000), 50_000), None);
        assert_eq!(t.tick(ms(3400), 60_000), Some(2), "trials again");
        // high: 6,000 in 200 ms; low: 2,000 in 200 ms: high is kept.
        assert_eq!(t.tick(ms(3600), 66_000), Some(1));
        assert_eq!(t.tick(ms(3800), 68_000), Some(2));
        // A tie keeps the larger count.
        let mut t = Tuner::new(1, 2, t0);
        assert_eq!(t.tick(ms(200), 1_000), Some(1));
        assert_eq!(t.tick(ms(400), 2_000), Some(2));
    }

    #[test]
    fn a_gate_lets_every_pass_through_never_more_than_high_at_once() {
        let gate = Gate::new(1, 2);
        let inside = AtomicU64::new(0);
        let most = AtomicU64::new(0);
        let passed = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        gate.pass(1, || {
                            let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_micros(200));
                            inside.fetch_sub(1, Ordering::SeqCst);
                        });
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(passed.load(Ordering::SeqCst), 600);
        assert!(most.load(Ordering::SeqCst) <= 2, "at most `high` inside");
        let st = crate::ground::lock(&gate.state);
        assert_eq!((st.inside, st.done), (0, 600));
    }
}
