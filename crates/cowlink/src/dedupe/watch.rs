//! Dedupe that follows the filesystem: `cowlink dedupe --watch`.
//!
//! [`Watcher`] learns what changed from fanotify. Each watched root's
//! filesystem gets one filesystem mark (`FAN_MARK_FILESYSTEM`) in a group
//! that reports the directory by file handle and the entry by name
//! (`FAN_REPORT_DFID_NAME`), for two events: `FAN_CLOSE_WRITE` (a writer
//! closed the file: it is worth deduplicating now, not while it is being
//! written) and `FAN_MOVED_TO` (a file or, with `FAN_ONDIR`, a directory
//! renamed into place). `FAN_MODIFY` is not asked for: it comes once per
//! `write(2)` and would fill the kernel's queue during bulk writes for
//! nothing the close does not tell; the cost is that a file kept open for
//! writing is seen only when it is closed. Each event's directory handle
//! is opened (`open_by_handle_at`) and named through `/proc`, and the
//! path is kept if it lies under a root and no `--exclude` pattern covers
//! it. Events caused by this process are dropped (its own dedupe must not
//! wake it again).
//!
//! Btrfs: a subvolume other than the top level has an fsid of its own, and
//! the kernel refuses a filesystem mark on it with `EXDEV`. Three tiers,
//! each reported ([`WatchScope`]):
//! 1. a filesystem mark through the mount point that holds the root: when
//!    that mount shows the top-level subvolume, the mark is accepted there
//!    and covers the whole filesystem, directory-entry events included;
//! 2. else a mount mark (`FAN_MARK_MOUNT`) on that mount: files written
//!    through it, not through other mounts; a mount mark carries no
//!    directory-entry events, so a file renamed into place is seen only
//!    through its writer's close;
//! 3. else (the subvolume mounted by itself, `subvol=`: on 6.18 both marks
//!    above are refused there too) an inode mark on every directory under
//!    the root (`FAN_EVENT_ON_CHILD`), a new directory marked when its
//!    `FAN_CREATE`/`FAN_MOVED_TO` arrives, at most [`MAX_DIR_MARKS`] in
//!    all. Files closed in a new directory before its mark is set raise
//!    no event, but the directory's own event is a change: the batch it
//!    starts walks the roots and finds them. If a mark is refused, the
//!    next batch rescans.
//!
//! [`Pending`] batches the changes: a batch runs once nothing new came for
//! the quiet period (or when the oldest change has waited
//! [`WatchOptions::max_delay`], so a steady trickle cannot postpone it for
//! ever). The set is capped ([`WatchOptions::max_pending`]); past the cap,
//! after a queue overflow (`FAN_Q_OVERFLOW`: the kernel dropped events)
//! or after records that do not parse, the paths are dropped and the next
//! batch is a rescan of every root. The kernel's queue is its default
//! bounded one (16384 events), so memory stays bounded on both sides.
//!
//! [`dedupe_batch`] is the one step a batch runs: [`super::dedupe`] over
//! the roots on the filesystems that saw a change (every root for a
//! rescan), with the roots' `--exclude` patterns, because a new file's
//! duplicate may be any old file. With the persistent index (the
//! default) that walk reads only new and changed files; every unchanged
//! one is answered from its directory's record, so a batch costs a
//! metadata walk of the roots plus the changed files. Without an index
//! each batch reads every candidate again. An index that answered "which
//! indexed files have this size and edge hash" would spare the walk too;
//! the batch's signature already carries the changed paths for that.
//!
//! The loop ([`run`]) starts with a rescan (what is already there is
//! deduplicated first; the marks are set before it, so nothing written
//! meanwhile is missed) and stops at the run's cancel: between batches at
//! once, during a batch as [`super::dedupe`] stops (groups already done
//! share their blocks, the others are untouched).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use cowlink_sys::{FanEvent, FanMark, FAN_CLOSE_WRITE, FAN_CREATE, FAN_MOVED_TO, FAN_ONDIR};

use super::{DedupeOptions, DedupePlan, DedupeReport, Exclude};
use crate::ground::error::{Error, Operation, Result};

/// The events a filesystem mark asks for.
const FS_MASK: u64 = FAN_CLOSE_WRITE | FAN_MOVED_TO | FAN_ONDIR;
/// The events a mount mark can carry (no directory-entry events).
const MOUNT_MASK: u64 = FAN_CLOSE_WRITE;
/// `FAN_EVENT_ON_CHILD`: an inode mark on a directory reports its entries.
const FAN_EVENT_ON_CHILD: u64 = 0x0800_0000;
/// The events an inode mark on a directory asks for: its files' closes,
/// and names created or moved in (new directories get marks of their own).
const DIR_MASK: u64 = FS_MASK | FAN_CREATE | FAN_EVENT_ON_CHILD;
/// Most directories watched by inode marks (tier 3 of the module doc), all roots together (the
/// kernel's own per-user limit, `fs.fanotify.max_user_marks`, may be
/// lower: a mark it refuses ends the watch's start with its error).
pub const MAX_DIR_MARKS: usize = 65_536;
/// Bytes read from the group at once: a few hundred events.
const READ_BUF: usize = 64 * 1024;
/// Longest wait for events between two looks at the cancel flag.
const TICK: Duration = Duration::from_millis(250);

/// How [`run`] watches and batches.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// What each batch's dedupe does (threads, cancel, `--exclude`,
    /// `--min-size`, `--measure`). Its run's cancel stops the watch.
    pub dedupe: DedupeOptions,
    /// How long no new change must come before a batch runs (default 3 s).
    pub quiet_period: Duration,
    /// Longest a change waits for its batch while changes keep coming
    /// (default 60 s).
    pub max_delay: Duration,
    /// Most changed paths kept between batches (default 16384); past it
    /// they are dropped and the next batch rescans every root.
    pub max_pending: usize,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            dedupe: DedupeOptions::default(),
            quiet_period: Duration::from_secs(3),
            max_delay: Duration::from_secs(60),
            max_pending: 16384,
        }
    }
}

/// What a watched root is watched by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// A filesystem mark: every change on the filesystem, through any
    /// mount, creates and renames included.
    Filesystem,
    /// A mount mark (Btrfs subvolume, where a filesystem mark is refused):
    /// files closed after writing through the mount that holds the root.
    Mount,
    /// Inode marks on every directory under the root (a Btrfs subvolume
    /// mounted by itself, where filesystem and mount marks are both
    /// refused): each new directory is marked as it appears.
    Directories,
}

/// One watched root and what watches it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WatchScope {
    /// The root, as resolved (absolute, no symbolic links).
    pub root: PathBuf,
    /// The mark that covers it.
    pub mark: MarkKind,
    /// Why the mark is not a filesystem mark, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Why a batch rescans every root instead of the changed paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rescan {
    /// The watch started: what is already there.
    Start,
    /// The kernel's event queue overflowed (`FAN_Q_OVERFLOW`): events
    /// were lost.
    QueueOverflow,
    /// More changed paths came than [`WatchOptions::max_pending`].
    PendingFull,
    /// Event records did not parse: what they said is unknown.
    Unreadable,
    /// A new directory under a root watched directory by directory could
    /// not be marked (the kernel's mark limit): later changes in it raise
    /// no event, and are taken up by the next batch something else starts.
    MarkRefused,
}

/// The changes a batch covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Changed paths (files, or directories moved in), sorted.
    pub paths: Vec<PathBuf>,
    /// Set when the batch must rescan every root.
    pub rescan: Option<Rescan>,
}

/// Changes waiting for their batch: a capped set of paths, or a rescan.
#[derive(Debug)]
pub struct Pending {
    paths: BTreeSet<PathBuf>,
    cap: usize,
    rescan: Option<Rescan>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Pending {
    /// An empty set that keeps at most `cap` paths.
    pub fn new(cap: usize) -> Pending {
        Pending {
            paths: BTreeSet::new(),
            cap: cap.max(1),
            rescan: None,
            first: None,
            last: None,
        }
    }

    fn touch(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.last = Some(now);
    }

    /// A path changed at `now`. Past the cap the paths are dropped and a
    /// rescan is due instead.
    pub fn add(&mut self, path: PathBuf, now: Instant) {
        self.touch(now);
        if self.rescan.is_some() {
            return;
        }
        if self.paths.len() >= self.cap && !self.paths.contains(&path) {
            return self.rescan(Rescan::PendingFull, now);
        }
        self.paths.insert(path);
    }

    /// Something was lost at `now`: the next batch rescans every root (the
    /// paths are dropped, the rescan covers them). The first reason stays.
    pub fn rescan(&mut self, why: Rescan, now: Instant) {
        self.touch(now);
        self.paths.clear();
        self.rescan.get_or_insert(why);
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.rescan.is_none()
    }

    /// Paths waiting (0 when a rescan is due).
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// How long from `now` until the batch is due: zero when it is due,
    /// `None` when nothing waits. A start rescan is due at once; others
    /// after `quiet` without a new change, or `max_delay` after the first.
    pub fn due_in(&self, now: Instant, quiet: Duration, max_delay: Duration) -> Option<Duration> {
        if self.is_empty() {
            return None;
        }
        if self.rescan == Some(Rescan::Start) {
            return Some(Duration::ZERO);
        }
        let (first, last) = (self.first?, self.last?);
        let by_quiet = (last + quiet).saturating_duration_since(now);
        let by_delay = (first + max_delay).saturating_duration_since(now);
        Some(by_quiet.min(by_delay))
    }

    /// Take what is waiting, leaving the set empty.
    pub fn take(&mut self) -> Changes {
        self.first = None;
        self.last = None;
        Changes {
            paths: std::mem::take(&mut self.paths).into_iter().collect(),
            rescan: self.rescan.take(),
        }
    }
}

/// A watched root: its resolved path and a descriptor on it (the mount
/// `open_by_handle_at` decodes handles against).
#[derive(Debug)]
struct Root {
    path: PathBuf,
    mark: MarkKind,
    dev: u64,
    fd: OwnedFd,
}

/// A fanotify group with marks covering the roots.
#[derive(Debug)]
pub struct Watcher {
    group: OwnedFd,
    roots: Vec<Root>,
    scopes: Vec<WatchScope>,
    exclude: Exclude,
    own_pid: i32,
    buf: Vec<u8>,
    events: Vec<FanEvent>,
    /// Directories with inode marks ([`MarkKind::Directories`]).
    dir_marks: usize,
}

impl Watcher {
    /// Create the group and mark every root's filesystem (a mount mark
    /// where the kernel refuses a filesystem mark with `EXDEV`). Paths
    /// under the roots that `exclude` covers are dropped as events come.
    ///
    /// # Errors
    /// A root that cannot be resolved or is not a directory; no fanotify
    /// (`NotSupported`); not allowed (`PermissionDenied`: fanotify needs
    /// `CAP_SYS_ADMIN`, decoding handles `CAP_DAC_READ_SEARCH`); a mark
    /// refused for another reason. Each names the root.
    pub fn new<P: AsRef<Path>>(roots: &[P], exclude: &Exclude) -> Result<Watcher> {
        let op = Operation::Dedupe;
        let group = cowlink_sys::fanotify_init_dfid_name().map_err(|e| {
            Error::from_errno(op, e).with_reason(format!(
                "cannot watch: fanotify_init failed ({}); the watch needs root (CAP_SYS_ADMIN) and Linux 5.9 or later",
                e
            ))
        })?;
        let mut w = Watcher {
            group,
            roots: Vec::new(),
            scopes: Vec::new(),
            exclude: exclude.clone(),
            own_pid: std::process::id() as i32,
            buf: vec![0; READ_BUF],
            events: Vec::new(),
            dir_marks: 0,
        };
        for root in roots {
            let root = root.as_ref();
            let path = std::fs::canonicalize(root).map_err(|e| {
                Error::from_errno(op, Errno::from_io_error(&e).unwrap_or(Errno::IO)).with_src(root)
            })?;
            let fd = rustix::fs::open(
                &path,
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| Error::from_errno(op, e).with_src(root))?;
            let dev = cowlink_sys::fstat(&fd)
                .map_err(|e| Error::from_errno(op, e).with_src(root))?
                .st_dev;
            let scope = w.mark(&path).map_err(|e| e.with_src(root))?;
            let mark = scope.mark;
            w.scopes.push(scope);
            w.roots.push(Root {
                path,
                mark,
                dev,
                fd,
            });
        }
        Ok(w)
    }

    /// Mark what covers `path`: its filesystem; where that is refused with
    /// `EXDEV` (a Btrfs subvolume), the filesystem through the mount
    /// point that holds `path` (the top-level subvolume when the mount
    /// shows it), else that mount.
    fn mark(&mut self, path: &Path) -> Result<WatchScope> {
        let op = Operation::Dedupe;
        let scope = |mark, note: Option<String>| WatchScope {
            root: path.to_path_buf(),
            mark,
            note,
        };
        match cowlink_sys::fanotify_mark(self.group.as_fd(), FanMark::Filesystem, FS_MASK, path) {
            Ok(()) => return Ok(scope(MarkKind::Filesystem, None)),
            Err(Errno::XDEV) => {}
            Err(e) => {
                return Err(Error::from_errno(op, e)
                    .with_reason(format!("cannot watch: fanotify_mark failed ({e})")))
            }
        }
        let why =
            "a filesystem mark on it is refused (EXDEV: a Btrfs subvolume, whose fsid is its own)";
        let Some(mp) = mount_point_of(path) else {
            return Err(Error::from_errno(op, Errno::XDEV).with_reason(format!(
                "cannot watch: {why}, and its mount point is not in the mount table"
            )));
        };
        if cowlink_sys::fanotify_mark(self.group.as_fd(), FanMark::Filesystem, FS_MASK, &mp).is_ok()
        {
            return Ok(scope(
                MarkKind::Filesystem,
                Some(format!(
                    "{why}; the whole filesystem is watched through its mount point {}",
                    crate::name::quoted(&mp)
                )),
            ));
        }
        match cowlink_sys::fanotify_mark(self.group.as_fd(), FanMark::Mount, MOUNT_MASK, &mp) {
            Ok(()) => {
                return Ok(scope(
                    MarkKind::Mount,
                    Some(format!(
                        "{why}; watching the mount {} instead: files closed after writing through it \
                         (renames seen through their writer's close; other mounts of the filesystem not seen)",
                        crate::name::quoted(&mp)
                    )),
                ))
            }
            Err(Errno::XDEV) => {}
            Err(e) => {
                return Err(Error::from_errno(op, e).with_reason(format!(
                    "cannot watch: {why}, and so is a mark on its mount {} ({e})",
                    crate::name::quoted(&mp)
                )))
            }
        }
        // The mount shows the subvolume itself (mounted with subvol=):
        // only inode marks are allowed, one per directory.
        let before = self.dir_marks;
        self.mark_tree(path, path)?;
        Ok(scope(
            MarkKind::Directories,
            Some(format!(
                "{why}, and so are marks on its mount {} (it mounts this subvolume); \
                 watching its {} directories one by one instead (new ones as they appear)",
                crate::name::quoted(&mp),
                self.dir_marks - before
            )),
        ))
    }

    /// Put an inode mark on `top` and every directory below it that no
    /// `--exclude` pattern covers (relative to `root`; symbolic links are
    /// not followed).
    ///
    /// # Errors
    /// More than [`MAX_DIR_MARKS`] directories, or a mark the kernel
    /// refuses (`ENOSPC`: its per-user limit), naming the directory.
    fn mark_tree(&mut self, root: &Path, top: &Path) -> Result<()> {
        let op = Operation::Dedupe;
        let mut stack = vec![top.to_path_buf()];
        while let Some(dir) = stack.pop() {
            if self.dir_marks >= MAX_DIR_MARKS {
                return Err(Error::from_errno(op, Errno::NOSPC)
                    .with_src(&dir)
                    .with_reason(format!(
                        "cannot watch: more than {MAX_DIR_MARKS} directories to mark one by one"
                    )));
            }
            match cowlink_sys::fanotify_mark(self.group.as_fd(), FanMark::Inode, DIR_MASK, &dir) {
                Ok(()) => self.dir_marks += 1,
                // Gone or replaced since it was listed: nothing to watch.
                Err(Errno::NOENT | Errno::NOTDIR) => continue,
                Err(e) => {
                    return Err(Error::from_errno(op, e).with_src(&dir).with_reason(format!(
                        "cannot watch this directory: fanotify_mark failed ({e})"
                    )))
                }
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let p = e.path();
                if p.strip_prefix(root).is_ok_and(|r| self.exclude.excludes(r)) {
                    continue;
                }
                stack.push(p);
            }
        }
        Ok(())
    }

    /// What each root is watched by.
    pub fn scopes(&self) -> &[WatchScope] {
        &self.scopes
    }

    /// Wait up to `timeout` for events and add what they name to
    /// `pending` (a rescan on overflow or unreadable records).
    ///
    /// # Errors
    /// Reading the group failed (not for a signal).
    pub fn poll(&mut self, timeout: Duration, pending: &mut Pending) -> Result<()> {
        let op = Operation::Dedupe;
        match cowlink_sys::wait_readable(self.group.as_fd(), timeout) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => {
                return Err(Error::from_errno(op, e).with_reason("cannot wait for fanotify events"))
            }
        }
        // Drain what is there now, a buffer at a time, up to a bound so a
        // storm of events cannot keep this call from returning.
        for _ in 0..64 {
            self.events.clear();
            let bad = match cowlink_sys::fanotify_read(
                self.group.as_fd(),
                &mut self.buf,
                &mut self.events,
            ) {
                Ok(bad) => bad,
                Err(Errno::INTR) => return Ok(()),
                Err(e) => {
                    return Err(Error::from_errno(op, e).with_reason("cannot read fanotify events"))
                }
            };
            let now = Instant::now();
            if self.events.is_empty() {
                if bad.is_some() {
                    pending.rescan(Rescan::Unreadable, now);
                }
                return Ok(());
            }
            let events = std::mem::take(&mut self.events);
            for ev in &events {
                if ev.overflow() {
                    pending.rescan(Rescan::QueueOverflow, now);
                } else if ev.pid != self.own_pid {
                    if let Some(p) = self.resolve(ev) {
                        let dir_root = self.directory_root(&p).filter(|_| ev.mask & FAN_ONDIR != 0);
                        if let Some(root) = dir_root {
                            // A directory made or moved in under a root
                            // watched directory by directory: mark it (and
                            // what it holds). A refusal means changes
                            // there would be missed: rescan from now on.
                            if self.mark_tree(&root, &p).is_err() {
                                pending.rescan(Rescan::MarkRefused, now);
                            }
                        }
                        pending.add(p, now);
                    }
                }
            }
            self.events = events;
            if bad.is_some() {
                pending.rescan(Rescan::Unreadable, now);
            }
        }
        Ok(())
    }

    /// The path an event names, if it lies under a root and is not
    /// excluded. `None` for an object gone since (`ESTALE`).
    fn resolve(&self, ev: &FanEvent) -> Option<PathBuf> {
        let handle = ev.dir.as_ref()?;
        let dir = self.roots.iter().find_map(|r| {
            cowlink_sys::open_by_handle(r.fd.as_fd(), handle, cowlink_sys::O_PATH | OFlags::CLOEXEC)
                .ok()
        })?;
        let dir = cowlink_sys::fd_path(dir.as_fd()).ok()?;
        let path = match ev.name.as_deref() {
            None | Some(b".") => dir,
            Some(name) => {
                dir.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name))
            }
        };
        self.admit(path)
    }

    /// The root watched directory by directory that holds `path`, if any.
    fn directory_root(&self, path: &Path) -> Option<PathBuf> {
        self.roots
            .iter()
            .find(|r| r.mark == MarkKind::Directories && path.starts_with(&r.path))
            .map(|r| r.path.clone())
    }

    /// `path` if it lies under a root and no exclude pattern covers it.
    fn admit(&self, path: PathBuf) -> Option<PathBuf> {
        let root = self.roots.iter().find(|r| path.starts_with(&r.path))?;
        let rel = path.strip_prefix(&root.path).ok()?;
        (!self.exclude.excludes(rel)).then_some(path)
    }

    /// The roots as resolved.
    pub fn roots(&self) -> Vec<PathBuf> {
        self.roots.iter().map(|r| r.path.clone()).collect()
    }

    /// The roots a batch of `changes` covers: every root for a rescan;
    /// otherwise the roots on the filesystems (devices) of the roots that
    /// hold a changed path.
    pub fn batch_roots(&self, changes: &Changes) -> Vec<PathBuf> {
        if changes.rescan.is_some() {
            return self.roots();
        }
        let devs: BTreeSet<u64> = self
            .roots
            .iter()
            .filter(|r| changes.paths.iter().any(|p| p.starts_with(&r.path)))
            .map(|r| r.dev)
            .collect();
        self.roots
            .iter()
            .filter(|r| devs.contains(&r.dev))
            .map(|r| r.path.clone())
            .collect()
    }
}

/// The mount point that holds `path` (absolute, resolved): the longest
/// mount point in `/proc/self/mountinfo` that is a prefix of it.
fn mount_point_of(path: &Path) -> Option<PathBuf> {
    let table = cowlink_sys::mount_table().ok()?;
    crate::ground::mountinfo::parse(&table)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|mp| path.starts_with(mp))
        .max_by_key(|mp| mp.as_os_str().len())
}

/// Deduplicate after `changes` under `roots` (from [`Watcher::batch_roots`]).
///
/// This is [`super::dedupe`] over `roots` with `opts` (its `--exclude`
/// patterns and its index included): a changed file's duplicate may be
/// any file, so every file under those roots is walked, but with an index
/// ([`DedupeOptions::index`](super::DedupeOptions::index), which the
/// command sets) a file unchanged since a run learnt it is not read
/// again: a batch costs a metadata walk plus the changed files. Looking
/// the changed paths up by size among indexed files, without the walk,
/// would need a by-size table in the index.
///
/// # Errors
/// As [`super::dedupe`]: only when no root could be walked.
pub fn dedupe_batch(
    roots: &[PathBuf],
    changes: &Changes,
    opts: &DedupeOptions,
) -> Result<(DedupePlan, DedupeReport)> {
    let _ = changes;
    super::dedupe(roots, opts)
}

/// One batch, as [`run`] reports it.
#[derive(Debug)]
pub struct WatchBatch {
    /// Changed paths the batch was for (0 for a rescan).
    pub changed: usize,
    /// Why it rescanned, when it did.
    pub rescan: Option<Rescan>,
    /// The roots it covered.
    pub roots: Vec<PathBuf>,
    /// What the dedupe found and did, or why it could not run.
    pub outcome: Result<(DedupePlan, DedupeReport)>,
    /// How long it took.
    pub elapsed: Duration,
}

/// What a whole watch did, when it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WatchSummary {
    /// Batches run (rescans included).
    pub batches: u64,
    /// Of those, rescans of every root.
    pub rescans: u64,
    /// Files made to share blocks.
    pub targets_deduped: u64,
    /// Bytes given back (as each batch's report counts them).
    pub bytes_reclaimed: u64,
    /// Batches that could not run, and errors within batches.
    pub errors: u64,
}

/// Watch `roots` until `opts.dedupe.run` is cancelled: a rescan first,
/// then a batch ([`dedupe_batch`]) after each quiet period. `started` is
/// called once the marks are set, with what watches each root; `on_batch`
/// after each batch.
///
/// # Errors
/// Only when the watch cannot start ([`Watcher::new`]) or reading events
/// fails; a batch that fails is reported to `on_batch` and the watch goes
/// on.
pub fn run<P: AsRef<Path>>(
    roots: &[P],
    opts: &WatchOptions,
    started: &mut dyn FnMut(&[WatchScope]),
    on_batch: &mut dyn FnMut(&WatchBatch),
) -> Result<WatchSummary> {
    let mut w = Watcher::new(roots, &opts.dedupe.exclude)?;
    started(w.scopes());
    let run = &opts.dedupe.run;
    let mut pending = Pending::new(opts.max_pending);
    pending.rescan(Rescan::Start, Instant::now());
    let mut sum = WatchSummary::default();
    while !run.cancelled() {
        let wait = pending
            .due_in(Instant::now(), opts.quiet_period, opts.max_delay)
            .map_or(TICK, |d| d.min(TICK));
        if !wait.is_zero() {
            w.poll(wait, &mut pending)?;
            continue;
        }
        if pending.due_in(Instant::now(), opts.quiet_period, opts.max_delay) != Some(Duration::ZERO)
        {
            continue;
        }
        let changes = pending.take();
        let start = Instant::now();
        let broots = w.batch_roots(&changes);
        let outcome = dedupe_batch(&broots, &changes, &opts.dedupe);
        let batch = WatchBatch {
            changed: changes.paths.len(),
            rescan: changes.rescan,
            roots: broots,
            outcome,
            elapsed: start.elapsed(),
        };
        sum.batches += 1;
        sum.rescans += u64::from(batch.rescan.is_some());
        match &batch.outcome {
            Ok((plan, r)) => {
                sum.targets_deduped += r.targets_deduped;
                sum.bytes_reclaimed += r.bytes_reclaimed;
                sum.errors += (plan.errors.len() + r.errors.len()) as u64;
            }
            Err(_) => sum.errors += 1,
        }
        on_batch(&batch);
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_waits_for_quiet_and_is_capped() {
        let q = Duration::from_secs(3);
        let max = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut p = Pending::new(3);
        assert_eq!(p.due_in(t0, q, max), None);
        p.add("/r/a".into(), t0);
        assert_eq!(p.due_in(t0, q, max), Some(q));
        p.add("/r/b".into(), t0 + Duration::from_secs(2));
        assert_eq!(p.due_in(t0 + Duration::from_secs(2), q, max), Some(q));
        assert_eq!(
            p.due_in(t0 + Duration::from_secs(6), q, max),
            Some(Duration::ZERO)
        );
        // A steady trickle: due at max_delay after the first change.
        for s in 0..70 {
            p.add("/r/a".into(), t0 + Duration::from_secs(s));
        }
        assert_eq!(
            p.due_in(t0 + Duration::from_secs(60), q, max),
            Some(Duration::ZERO)
        );
        p.add("/r/c".into(), t0);
        assert_eq!(p.len(), 3);
        // Past the cap: the paths go, a rescan is due.
        p.add("/r/d".into(), t0);
        assert_eq!(p.len(), 0);
        let c = p.take();
        assert_eq!((c.paths.len(), c.rescan), (0, Some(Rescan::PendingFull)));
        assert!(p.is_empty());
    }

    #[test]
    fn an_overflow_drops_paths_for_a_rescan() {
        let t0 = Instant::now();
        let mut p = Pending::new(100);
        p.add("/r/a".into(), t0);
        p.rescan(Rescan::QueueOverflow, t0);
        p.add("/r/b".into(), t0);
        p.rescan(Rescan::Unreadable, t0);
        let c = p.take();
        assert_eq!(
            c,
            Changes {
                paths: vec![],
                rescan: Some(Rescan::QueueOverflow)
            }
        );
        let mut s = Pending::new(100);
        s.rescan(Rescan::Start, t0);
        assert_eq!(
            s.due_in(t0, Duration::from_secs(3), Duration::from_secs(60)),
            Some(Duration::ZERO)
        );
    }
}
