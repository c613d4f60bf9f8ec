//! Keeping a destination tree in step with a source: `cowlink sync SRC/
//! DST/`.
//!
//! Afterwards DST equals SRC as `cp -a` would make it (modes, owners,
//! nanosecond times, extended attributes and ACLs, hardlink groups,
//! symbolic links, FIFOs and devices), and only what differs was touched:
//! an unchanged entry keeps its inode and its ctime. New and changed files
//! are cloned from SRC where the filesystems allow, copied where not.
//!
//! The shape is the project's: `plan` decides, purely, from what `lstat`
//! says of the source and destination entries (and, when asked, whether
//! contents, extended attributes or link targets are equal) what to do
//! with each name; `apply` walks SRC on the one walker engine
//! (`crate::walk::pool`), in parallel, and carries the decisions out with
//! the file primitives of `crate::prim` (transfer, placement, metadata)
//! and the tree copy's directory creation. `filter` holds the exclusions
//! (gitignore syntax) and `lock` the one-run-per-destination lock.
//!
//! DST is the user's declared mirror. Inside it nothing is followed:
//! every directory is opened relative to its parent with `O_NOFOLLOW`, so
//! a symbolic link where a directory is expected is replaced as an entry,
//! and a mount point (another device, a nested Btrfs subvolume, or a bind
//! mount of DST's own filesystem, which shares its device number) is
//! refused, not entered: every destination entry that is read or changed
//! in place is opened with `openat2(RESOLVE_NO_XDEV)`. A device node or
//! FIFO planted where a file is expected is never opened, and an inode
//! DST shares with names outside its hardlink group (a `cp -al` copy) is
//! replaced, never changed in place. DST inside SRC (or SRC inside DST,
//! with `--delete`) is refused by identity, whatever aliases the paths.
//! Nothing is written outside DST, and
//! no bookkeeping file is written inside it (the locks are `flock`s on
//! DST's directory and the directories above it, so that nested
//! destinations exclude each other: see `lock`).
//!
//! A snapshot run writes into a directory `SnapshotSet::begin` made or
//! checked against its record, through the descriptor `begin` opened
//! ([`crate::snapshot::Begun::dir`]); the snapshot's name is never
//! reopened, so a link or another directory renamed into it meanwhile is
//! never written through, and the seal refuses a name that no longer
//! holds the directory written. A dry run with no complete snapshot to
//! compare against has no destination at all: every entry is new.
//!
//! Crash semantics: a name in DST never holds a mix of old and new
//! content. A changed file is written to a new inode (an `O_TMPFILE`, or
//! under its final name only in a directory this run created) and linked
//! over the old name by `rename`; a new file in a new directory carries
//! the unfinished mark and no source time until it is complete. A
//! directory's metadata is set after everything below it. So after a
//! `kill -9` every name is either old or new, and a rerun sees what is left
//! to do and converges. A source file that changes while it is read
//! (its size, modification or change time moved between the `fstat`s
//! before and after) is read again, up to three times, then reported as
//! `ContentChanged` and not placed.

mod apply;
mod filter;
pub(crate) mod lock;
pub mod plan;

use std::path::{Path, PathBuf};

use rustix::fd::AsFd;

use crate::ground::error::Error;
use crate::prim::mode::Outcome;

pub use filter::{patterns_from, EXCLUDE_LINES_MAX, EXCLUDE_LINE_MAX};
pub use plan::{itemize, Action, Changes, EntryKind};

/// Options for [`sync`]. `Default`: `cp -a` semantics, size and time
/// comparison, nothing deleted, every core.
#[derive(Debug, Clone, Default)]
pub struct SyncOptions {
    /// Compare regular files by contents (BLAKE3 of both) instead of size
    /// and modification time, and extended attributes always (`--checksum`).
    /// Without it, a file's extended attributes are compared only when
    /// the source's ctime is not older than its copy's (any change to
    /// them moves it).
    pub checksum: bool,
    /// Remove destination entries the source lacks (`--delete`); entries
    /// an exclusion matches are spared unless [`delete_excluded`] is set.
    ///
    /// [`delete_excluded`]: SyncOptions::delete_excluded
    pub delete: bool,
    /// With [`delete`](SyncOptions::delete): remove excluded entries from
    /// the destination too, as rsync's `--delete-excluded`.
    pub delete_excluded: bool,
    /// Exclusions, one gitignore line each (`--exclude`, and the lines of
    /// `--exclude-from` files: see [`patterns_from`]), matched against
    /// paths relative to the synced directory.
    pub exclude: Vec<String>,
    /// Directories to clone unchanged files from (`--reflink-dest`, as
    /// rsync's `--link-dest`): a file whose counterpart there (same
    /// relative path) has the source's size and modification time (or
    /// contents, with [`checksum`](SyncOptions::checksum)) is cloned from
    /// it. A relative directory is taken from the destination, as rsync
    /// does.
    pub reflink_dest: Vec<PathBuf>,
    /// Report what would be done without changing anything.
    pub dry_run: bool,
    /// Do not keep the source's hardlink groups: each name gets its own
    /// copy (`rsync -a` without `-H`). By default they are kept.
    pub no_hardlinks: bool,
    /// Threads (0: chosen from the destination filesystem), cancellation
    /// and progress ([`Phase::Copy`](crate::run::Phase::Copy): files and
    /// bytes placed).
    pub run: crate::run::Run,
}

/// What [`sync`] did to one name (or, in a dry run, would do), as told to
/// an [`Observer`].
#[derive(Debug)]
#[non_exhaustive]
pub enum SyncEvent<'a> {
    /// One entry was decided on (and, outside a dry run, dealt with).
    Item {
        /// The path below the destination root.
        path: &'a Path,
        /// The entry's type (the source's; the destination's for deletes).
        kind: EntryKind,
        /// What was done.
        action: Action,
        /// What differed.
        changes: Changes,
        /// For a file whose data was placed: how, and how many bytes.
        outcome: Option<Outcome>,
    },
    /// An entry failed; the sync goes on.
    Failed(&'a Error),
}

/// Hears about every entry of a [`sync`], from the worker threads (so it
/// must be `Sync`, and quick).
pub trait Observer: Sync {
    /// One entry's event.
    fn event(&self, event: &SyncEvent<'_>);
}

impl<F: Fn(&SyncEvent<'_>) + Sync> Observer for F {
    fn event(&self, event: &SyncEvent<'_>) {
        self(event)
    }
}

/// Totals of a [`sync`]; in a dry run, what would have been done.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SyncReport {
    /// Entries created (files, directories, links, special files).
    pub created: u64,
    /// Entries whose data was replaced, or replaced by another type.
    pub replaced: u64,
    /// Entries whose metadata only was set.
    pub metadata: u64,
    /// Entries removed (`--delete`); a directory counts once.
    pub deleted: u64,
    /// Names made hardlinks to an earlier name's copy.
    pub hardlinked: u64,
    /// Entries left untouched because they matched.
    pub unchanged: u64,
    /// Bytes of regular files placed.
    pub bytes: u64,
    /// Files whose blocks are shared with their source.
    pub cloned: u64,
    /// Files cloned from a `--reflink-dest` directory.
    pub cloned_from_reflink_dest: u64,
    /// Files physically copied.
    pub copied: u64,
    /// Of the copied files, those made from another filesystem as a clone
    /// of their old version with only the differing blocks written (their
    /// unchanged blocks stay shared with earlier snapshots).
    pub by_blocks: u64,
    /// Entries that failed.
    pub errors: u64,
    /// The run was cancelled before it finished.
    pub cancelled: bool,
    /// Nothing was changed: a dry run.
    pub dry_run: bool,
}

/// Make `dst` equal `src`, as `rsync -aHAX` with rsync's trailing-slash
/// rule: `src/` (or `src/.`) syncs the contents of `src` into `dst`;
/// `src` without the slash syncs the directory itself into `dst/NAME`.
/// A source that is not a directory is synced to `dst/NAME`. `dst` is
/// created if it is missing (its parent must exist).
///
/// # Errors
/// `Err` only when nothing could start: the source is missing, `dst` is
/// inside `src`, `dst` cannot be created or opened, a bad exclusion, a
/// `--reflink-dest` directory that cannot be opened, or another sync
/// holds `dst` (`InUse`, naming the process). Everything else is a
/// per-entry failure, passed to `observer` and counted in
/// [`SyncReport::errors`].
pub fn sync(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &SyncOptions,
    observer: &dyn Observer,
) -> Result<SyncReport, Error> {
    apply::run(
        src.as_ref(),
        apply::Dest::Path(dst.as_ref()),
        options,
        observer,
    )
}

/// What [`sync_snapshot`] made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SnapshotSyncReport {
    /// The snapshot's name under the root (for a dry run: the snapshot
    /// compared against, or `None` when the set has no complete one).
    pub snapshot: Option<String>,
    /// Its directory (`None` for a dry run against no snapshot).
    #[serde(flatten, serialize_with = "crate::name::json::path")]
    pub path: Option<PathBuf>,
    /// It was an interrupted snapshot, resumed under its name.
    pub resumed: bool,
    /// The complete snapshot it was cloned from.
    pub base: Option<String>,
    /// It was sealed complete. `false` after a cancel or a failed entry:
    /// it stays in progress and the next run resumes it.
    pub completed: bool,
    /// The sync into it.
    pub sync: SyncReport,
}

/// `cowlink sync --snapshot ROOT SRC/`: make a new snapshot in the set at
/// `root` as a clone of its newest complete snapshot (a Btrfs subvolume
/// snapshot where it can; see [`crate::snapshot`]), sync `src` into it,
/// and seal it complete. A snapshot is `src` as it was, so deletion is
/// implied, excluded entries included (`--delete --delete-excluded`).
/// An interrupted run (cancel, kill, a failed entry) leaves the snapshot
/// in progress, never listed complete; the next run resumes it under its
/// original name.
///
/// The root is locked as a sync destination for the whole run (see
/// `lock` in the module notes: a sync into the root, above it or into one
/// of its snapshots refuses this run and the other way round), and the
/// sync writes only through the snapshot's directory as `begin` made or
/// checked it ([`Begun::dir`]), whatever is renamed into its name.
///
/// In a dry run nothing is made: the changes are those against the
/// newest complete snapshot, or, when the set has none (or no set is
/// there), every entry is itemized as new, with no destination path.
///
/// # Errors
/// As [`sync`], and when the set cannot be opened or begun (another run
/// holds it: `InUse`, naming the process), or the seal fails.
///
/// [`Begun::dir`]: crate::snapshot::Begun::dir
pub fn sync_snapshot(
    src: impl AsRef<Path>,
    root: impl AsRef<Path>,
    options: &SyncOptions,
    observer: &dyn Observer,
) -> Result<SnapshotSyncReport, Error> {
    let (src, root) = (src.as_ref(), root.as_ref());
    let opts = snapshot_options(options);
    if opts.dry_run {
        let set = match crate::snapshot::SnapshotSet::open_existing(root) {
            Ok(set) => Some(set),
            Err(e) if e.kind() == crate::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let newest = match &set {
            Some(set) => set.newest_complete()?,
            None => None,
        };
        let dest = match &newest {
            Some((snap, dir)) => apply::Dest::Open {
                dir: dir.as_fd(),
                shown: &snap.path,
                lock: true,
            },
            None => apply::Dest::Nothing,
        };
        let report = apply::run(src, dest, &opts, observer)?;
        let newest = newest.map(|(s, _)| s);
        return Ok(SnapshotSyncReport {
            snapshot: newest.as_ref().map(|s| s.name.clone()),
            path: newest.map(|s| s.path),
            resumed: false,
            base: None,
            completed: false,
            sync: report,
        });
    }
    let (set, _held) = crate::snapshot::SnapshotSet::open_locked(root)?;
    let set = set.with_run(opts.run.clone());
    let begun = set.begin()?;
    let report = into_begun(src, &begun, &opts, observer, false)?;
    let mut out = SnapshotSyncReport {
        snapshot: Some(begun.name().to_owned()),
        path: Some(begun.path().to_owned()),
        resumed: begun.resumed(),
        base: begun.base().map(str::to_owned),
        completed: false,
        sync: report,
    };
    if !out.sync.cancelled && out.sync.errors == 0 {
        begun.complete()?;
        out.completed = true;
    }
    Ok(out)
}

/// Sync `src` into a snapshot begun with
/// [`SnapshotSet::begin`](crate::snapshot::SnapshotSet::begin), as
/// [`sync_snapshot`] does between making and sealing it: with deletion
/// (excluded entries included), and only through the snapshot's open
/// directory ([`Begun::dir`]), never through its name, which anyone who
/// can write in the root can swap for a link or another directory. Its
/// locks are taken on that directory (and `LOCK_SH` above it, the root
/// included, which the [`Begun`](crate::snapshot::Begun) shares). Seal it
/// afterwards with
/// [`Begun::complete`](crate::snapshot::Begun::complete), which refuses
/// when the name no longer holds the directory written.
///
/// # Errors
/// As [`sync`].
///
/// [`Begun::dir`]: crate::snapshot::Begun::dir
pub fn sync_into_snapshot(
    src: impl AsRef<Path>,
    begun: &crate::snapshot::Begun,
    options: &SyncOptions,
    observer: &dyn Observer,
) -> Result<SyncReport, Error> {
    into_begun(
        src.as_ref(),
        begun,
        &snapshot_options(options),
        observer,
        true,
    )
}

fn into_begun(
    src: &Path,
    begun: &crate::snapshot::Begun,
    opts: &SyncOptions,
    observer: &dyn Observer,
    lock: bool,
) -> Result<SyncReport, Error> {
    let dest = apply::Dest::Open {
        dir: begun.dir(),
        shown: begun.path(),
        lock,
    };
    apply::run(src, dest, opts, observer)
}

/// A snapshot is the source as it was: deletion implied, excluded
/// entries included.
fn snapshot_options(options: &SyncOptions) -> SyncOptions {
    let mut opts = options.clone();
    opts.delete = true;
    opts.delete_excluded = true;
    opts
}
