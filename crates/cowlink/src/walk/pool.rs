//! The walker engine: a work-stealing pool of directory jobs.
//!
//! Work is a [`Job`]: open a walk root, open one subdirectory, or read the
//! next batch of a directory's entries. Each worker has a LIFO deque
//! (depth-first: the newest subdirectory is taken next); an idle worker
//! steals the oldest job of another, so wide trees spread out and deep ones
//! do not pile up. Entries that are not directories are handed to the
//! [`Driver`] inline by the worker that read their batch.
//!
//! Descriptors stay bounded by depth × threads whatever the width of a
//! directory: a subdirectory waits as a name and a reference to its parent,
//! and is opened only when its job runs.
//!
//! A directory (`Driver::Dir`) is shared (`Arc`) by every job below it.
//! When the last one lets go ([`Pool::release`]) the driver finishes it
//! (the copy sets the directory's metadata then) and may hand back its
//! parent, which is released the same way, iteratively, so a 10,000-level
//! chain needs no stack.
//!
//! Idle workers park on a condition variable instead of spinning (a
//! spinning thread takes the core the filesystem needs); a push wakes one.
//!
//! With [`Threads::Adaptive`] only some workers take jobs at a time, and
//! the calling thread measures which number handles more entries per
//! second ([`Tuner`]): where the best count differs from machine to machine
//! (cloning into Btrfs: one thread was faster on one machine, two on
//! another; docs/ARCHITECTURE.md, concurrency), the walk finds out for
//! itself instead of trusting one measurement.

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::run::{Threads, Tuner};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use rustix::fs::{Dir, FileType};
use rustix::io::Errno;

/// Entries read from a directory per job: small enough to share a large
/// directory between threads, large enough to amortize the job overhead.
pub(crate) const BATCH: usize = 128;

/// What to do after an entry was handed to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The entry is a directory to walk into: queue it.
    Descend,
    /// The entry was dealt with.
    Done,
}

/// What a walk does at each step; the pool decides only the order.
pub(crate) trait Driver: Sync {
    /// A walk root before it is opened.
    type Root: Send;
    /// An open directory.
    type Dir: Send + Sync;

    /// Open a walk root (`None`: it was not a directory, or failed; the
    /// driver has dealt with it).
    fn open_root(&self, root: Self::Root) -> Option<Arc<Self::Dir>>;
    /// Open the subdirectory `name` of `parent` (`None`: failed, reported).
    fn open(&self, parent: &Arc<Self::Dir>, name: &CStr) -> Option<Arc<Self::Dir>>;
    /// Where the directory's unread entries are (`None` once all are read).
    fn reader<'d>(&self, dir: &'d Self::Dir) -> &'d Mutex<Option<Dir>>;
    /// Reading the directory failed with `e`; the rest of it is skipped.
    fn read_failed(&self, dir: &Self::Dir, e: Errno);
    /// One entry of `dir`, typed as `getdents` gave it (possibly
    /// `Unknown`), with the inode number it gave (`d_ino`: the file's, but
    /// for a mount point or a Btrfs subvolume). Answer [`Next::Descend`]
    /// to have the pool open it.
    fn entry(&self, dir: &Arc<Self::Dir>, name: &CStr, file_type: FileType, ino: u64) -> Next;
    /// Everything below `dir` is done; returns the parent to release next.
    fn finish(&self, dir: Self::Dir) -> Option<Arc<Self::Dir>>;
    /// Whether to stop starting new work (cancelled, or asked to stop).
    fn stopped(&self) -> bool;
}

enum Job<D: Driver> {
    Root(D::Root),
    /// Open the subdirectory `name` of `parent` and read it.
    Open {
        parent: Arc<D::Dir>,
        name: CString,
    },
    /// Read and hand out the next batch of entries.
    Read(Arc<D::Dir>),
}

/// The scheduler around one driver.
struct Pool<'d, D: Driver> {
    driver: &'d D,
    /// Workers allowed to take jobs (the first `limit` of them).
    limit: AtomicUsize,
    /// Entries handed to the driver so far (what the tuner measures).
    entries: AtomicU64,
    /// Set for [`Threads::Adaptive`]; only the calling thread uses it.
    tuner: Option<Mutex<Tuner>>,
    /// Jobs queued or running; the pool stops when it reaches zero.
    pending: AtomicUsize,
    injector: Injector<Job<D>>,
    /// Workers parked for lack of work, and where they wait.
    sleepers: AtomicUsize,
    idle: Mutex<()>,
    wakeup: Condvar,
}

/// Counts a job as finished when dropped; the last one wakes every parked
/// worker so they can see the pool is done.
struct JobDone<'p, 'd, D: Driver>(&'p Pool<'d, D>);

impl<D: Driver> Drop for JobDone<'_, '_, D> {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.wake(true);
        }
    }
}

/// Walk from `roots` with `threads` workers (the calling thread is one of
/// them), until every job is done. If a thread cannot be started the walk
/// goes on with fewer.
pub(crate) fn run<D: Driver>(driver: &D, roots: Vec<D::Root>, threads: usize) {
    run_with(driver, roots, Threads::Fixed(threads))
}

/// [`run`] with a fixed or an adaptive number of workers.
pub(crate) fn run_with<D: Driver>(driver: &D, roots: Vec<D::Root>, threads: Threads) {
    let (started, tuner) = match threads {
        Threads::Fixed(n) => (n.max(1), None),
        Threads::Adaptive { low, high } => {
            let (low, high) = (low.max(1), high.max(1));
            let t = Tuner::new(low.min(high), high.max(low), Instant::now());
            (high.max(low), Some(t))
        }
    };
    let pool = Pool {
        driver,
        limit: AtomicUsize::new(tuner.as_ref().map_or(started, Tuner::first)),
        entries: AtomicU64::new(0),
        tuner: tuner.map(Mutex::new),
        pending: AtomicUsize::new(roots.len()),
        injector: Injector::new(),
        sleepers: AtomicUsize::new(0),
        idle: Mutex::new(()),
        wakeup: Condvar::new(),
    };
    if roots.is_empty() {
        return;
    }
    for r in roots {
        pool.injector.push(Job::Root(r));
    }
    let workers: Vec<Worker<Job<D>>> = (0..started).map(|_| Worker::new_lifo()).collect();
    let stealers: Vec<Stealer<Job<D>>> = workers.iter().map(Worker::stealer).collect();
    let (pool, stealers) = (&pool, &stealers);
    std::thread::scope(|s| {
        let mut workers = workers.into_iter();
        let mine = workers.next().expect("at least one worker");
        for (i, w) in workers.enumerate() {
            let _ = std::thread::Builder::new()
                .name(format!("cowlink-walk-{}", i + 1))
                .spawn_scoped(s, move || pool.work(i + 1, w, stealers));
        }
        pool.work(0, mine, stealers);
    });
}

impl<D: Driver> Pool<'_, D> {
    fn push(&self, local: &Worker<Job<D>>, job: Job<D>) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        local.push(job);
        self.wake(false);
    }

    /// Wake one parked worker (new work) or all (the pool is done).
    fn wake(&self, all: bool) {
        if self.sleepers.load(Ordering::SeqCst) == 0 {
            return;
        }
        // Taking the lock orders this after a sleeper's last look for work.
        drop(self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        if all {
            self.wakeup.notify_all();
        } else {
            self.wakeup.notify_one();
        }
    }

    /// Worker number `me` (0: the calling thread, which also tunes).
    fn work(&self, me: usize, local: Worker<Job<D>>, stealers: &[Stealer<Job<D>>]) {
        loop {
            if me == 0 {
                self.tune();
            }
            if me >= self.limit.load(Ordering::Relaxed) {
                // Not wanted for now: the others steal what is queued here.
                if self.pending.load(Ordering::SeqCst) == 0 {
                    return;
                }
                let guard = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                let _ = self
                    .wakeup
                    .wait_timeout(guard, Duration::from_millis(20))
                    .unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if let Some(job) = local.pop().or_else(|| self.steal(&local, stealers)) {
                // Counted down even if the job panics (a driver bug), so
                // the other workers stop and the panic reaches the caller.
                let _done = JobDone(self);
                self.run(job, &local);
                continue;
            }
            // Nothing to take: park until a push or the end. Registered as
            // a sleeper before the last look, under the lock a waker takes,
            // so no wakeup is lost; the timeout is only a safety net.
            let guard = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let visible = !self.injector.is_empty() || stealers.iter().any(|s| !s.is_empty());
            let done = self.pending.load(Ordering::SeqCst) == 0;
            if !visible && !done {
                let _ = self
                    .wakeup
                    .wait_timeout(guard, Duration::from_millis(20))
                    .unwrap_or_else(|p| p.into_inner());
            } else {
                drop(guard);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            if done {
                return;
            }
        }
    }

    /// Let the tuner (if any) change the number of working workers.
    fn tune(&self) {
        let Some(tuner) = &self.tuner else { return };
        let done = self.entries.load(Ordering::Relaxed);
        let change = tuner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .tick(Instant::now(), done);
        if let Some(n) = change {
            let before = self.limit.swap(n, Ordering::Relaxed);
            if n > before {
                drop(self.idle.lock().unwrap_or_else(|p| p.into_inner()));
                self.wakeup.notify_all();
            }
        }
    }

    fn steal(&self, local: &Worker<Job<D>>, stealers: &[Stealer<Job<D>>]) -> Option<Job<D>> {
        loop {
            let s = self
                .injector
                .steal_batch_and_pop(local)
                .or_else(|| stealers.iter().map(Stealer::steal).collect());
            match s {
                Steal::Success(job) => return Some(job),
                Steal::Empty => return None,
                Steal::Retry => continue,
            }
        }
    }

    fn run(&self, job: Job<D>, local: &Worker<Job<D>>) {
        match job {
            Job::Root(r) => {
                if !self.driver.stopped() {
                    if let Some(dir) = self.driver.open_root(r) {
                        self.read(dir, local);
                    }
                }
            }
            Job::Open { parent, name } => {
                if !self.driver.stopped() {
                    if let Some(dir) = self.driver.open(&parent, &name) {
                        self.read(dir, local);
                    }
                }
                self.release(parent);
            }
            Job::Read(dir) => {
                if self.driver.stopped() {
                    self.release(dir);
                } else {
                    self.read(dir, local);
                }
            }
        }
    }

    /// Read the next batch of `dir`, queue the rest, hand out the batch.
    fn read(&self, dir: Arc<D::Dir>, local: &Worker<Job<D>>) {
        let mut batch: Vec<(CString, FileType, u64)> = Vec::with_capacity(BATCH);
        let mut more = false;
        let mut read_error = None;
        {
            let mut reader = self
                .driver
                .reader(&dir)
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(d) = reader.as_mut() {
                while batch.len() < BATCH {
                    match d.read() {
                        None => break,
                        Some(Ok(e)) => {
                            let name = e.file_name();
                            if name != c"." && name != c".." {
                                batch.push((name.to_owned(), e.file_type(), e.ino()));
                            }
                        }
                        Some(Err(e)) => {
                            read_error = Some(e);
                            break;
                        }
                    }
                }
                more = batch.len() == BATCH && read_error.is_none();
                if !more {
                    // Closed as soon as it is read to the end.
                    *reader = None;
                }
            }
        }
        if more {
            self.push(local, Job::Read(dir.clone()));
        }
        if let Some(e) = read_error {
            self.driver.read_failed(&dir, e);
        }
        let handed = batch.len() as u64;
        for (name, t, ino) in batch {
            if self.driver.stopped() {
                break;
            }
            if self.driver.entry(&dir, &name, t, ino) == Next::Descend {
                let parent = dir.clone();
                self.push(local, Job::Open { parent, name });
            }
        }
        self.entries.fetch_add(handed, Ordering::Relaxed);
        self.release(dir);
    }

    /// Let go of a directory; the last one out finishes it, then lets go
    /// of the parent the driver hands back.
    fn release(&self, dir: Arc<D::Dir>) {
        let mut next = Some(dir);
        while let Some(d) = next.take() {
            if let Some(done) = Arc::into_inner(d) {
                next = self.driver.finish(done);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A driver over an in-memory description of where to descend: it
    /// never reads a real directory, so it tests ordering and completion.
    struct Counter {
        finished: AtomicUsize,
        stop: AtomicBool,
    }

    struct Node {
        reader: Mutex<Option<Dir>>,
        parent: Option<Arc<Node>>,
        depth: usize,
    }

    impl Driver for Counter {
        type Root = usize;
        type Dir = Node;
        fn open_root(&self, depth: usize) -> Option<Arc<Node>> {
            Some(Arc::new(Node {
                reader: Mutex::new(None),
                parent: None,
                depth,
            }))
        }
        fn open(&self, _: &Arc<Node>, _: &CStr) -> Option<Arc<Node>> {
            None
        }
        fn reader<'d>(&self, dir: &'d Node) -> &'d Mutex<Option<Dir>> {
            &dir.reader
        }
        fn read_failed(&self, _: &Node, _: Errno) {}
        fn entry(&self, _: &Arc<Node>, _: &CStr, _: FileType, _: u64) -> Next {
            Next::Done
        }
        fn finish(&self, dir: Node) -> Option<Arc<Node>> {
            self.finished.fetch_add(1, Ordering::SeqCst);
            // A long chain of parents, released without recursion.
            if dir.depth > 0 && dir.parent.is_none() {
                let mut chain = None;
                for d in 0..dir.depth {
                    chain = Some(Arc::new(Node {
                        reader: Mutex::new(None),
                        parent: chain,
                        depth: if d == 0 { 0 } else { usize::MAX },
                    }));
                }
                return chain;
            }
            dir.parent.clone()
        }
        fn stopped(&self) -> bool {
            self.stop.load(Ordering::Relaxed)
        }
    }

    #[test]
    fn every_root_is_finished_and_parents_are_released_iteratively() {
        let c = Counter {
            finished: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        };
        // Root 0 finishes alone; root 100_000 hands back a chain of that
        // many parents, which must all be finished without a deep stack.
        run(&c, vec![0, 3, 100_000], 2);
        assert_eq!(c.finished.load(Ordering::SeqCst), 3 + 3 + 100_000);
    }

    #[test]
    fn an_adaptive_pool_finishes_every_root_too() {
        let c = Counter {
            finished: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        };
        run_with(
            &c,
            vec![0, 3, 100_000],
            Threads::Adaptive { low: 1, high: 3 },
        );
        assert_eq!(c.finished.load(Ordering::SeqCst), 3 + 3 + 100_000);
    }

    #[test]
    fn a_stopped_walk_opens_no_root() {
        let c = Counter {
            finished: AtomicUsize::new(0),
            stop: AtomicBool::new(true),
        };
        run(&c, vec![0, 0], 4);
        assert_eq!(c.finished.load(Ordering::SeqCst), 0);
    }
}
