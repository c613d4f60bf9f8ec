//! Copying a directory tree in parallel, with `cp -a` semantics.
//!
//! [`copy_tree`] walks the source over open directory file descriptors
//! (`openat`, `mkdirat`, `getdents64`, `fstat`: no path is resolved twice)
//! on a work-stealing pool of threads. Each thread works depth-first on its
//! own deque; idle threads steal the oldest (shallowest) work of others, so
//! wide trees spread out and deep ones do not pile up. Directories are read
//! in batches and a batch is a unit of work, so a directory with 200,000
//! entries is shared between threads too and never held in memory at once.
//!
//! Memory and open files grow with depth × threads, not with the number of
//! files: a directory is held open only while it or something below it is
//! being copied. A directory's own metadata (mode, owner, xattrs, times) is
//! set when the last piece of work below it finishes, so its times are
//! those of the source even though entries were created inside it.
//!
//! Every regular file goes through the same steps as [`crate::clone_file`]:
//! clone, or copy when the [`LinkMode`](crate::LinkMode) allows; placed
//! as [`Placement`](crate::Placement) decides: created under its name in a
//! directory this run made (removed on error or cancel), or written to an
//! unnamed temporary and linked into place complete over existing names
//! (and everywhere with [`TreeOptions::atomic`]). An error or a cancel never
//! leaves a partial file; only `SIGKILL` or a power cut can, and
//! [`TreeOptions::resume`] recognises it. Per-entry failures are reported
//! to the [`Observer`], counted in the
//! [`TreeReport`], and the walk goes on.
//!
//! Layout, in import order: this file has the public types; `links` the
//! hardlink table; `node` an open directory pair; `ctx` what the run lends
//! to every entry (options, observer, counters); `entry` what happens to
//! one entry (file, symlink, hardlink, FIFO/device); `copy` the driver of
//! the walker engine (`crate::walk::pool`): directories and their
//! completion. `copy` calls `entry`, never the reverse.

#[cfg(unix)]
pub(crate) mod copy;
#[cfg(unix)]
mod ctx;
#[cfg(unix)]
mod entry;
#[cfg(unix)]
pub(crate) mod links;
#[cfg(unix)]
mod node;

use std::path::Path;

use crate::clone::CloneOptions;
use crate::ground::error::Error;
use crate::prim::mode::Outcome;

#[cfg(unix)]
pub use crate::prim::backup::Backups;
#[cfg(unix)]
pub use crate::prim::facts::Prompt;
#[cfg(not(unix))]
pub use crate::stdfs::copy_tree;
#[cfg(unix)]
pub use copy::copy_tree;

pub use crate::run::{default_threads, CancelToken, MAX_THREADS};

/// Options for [`copy_tree`]. `Default` is `cp -r` with `--reflink=auto`
/// on as many threads as there are cores; [`TreeOptions::archive`] is
/// `cp -a`.
#[derive(Debug, Clone, Default)]
pub struct TreeOptions {
    /// Per-file options: reflink mode, overwrite, metadata to preserve
    /// (applied to directories, symlinks and special files too).
    pub file: CloneOptions,
    /// Recreate hardlinks inside the source tree as hardlinks (`cp -a`,
    /// `--preserve=links`). Without it each name gets its own copy.
    pub hardlinks: bool,
    /// Follow symbolic links in the source (`cp -L`). Without it they are
    /// copied as symbolic links, never followed.
    pub dereference: bool,
    /// Make every file complete-or-absent under its name even after a
    /// crash (`O_TMPFILE` + `linkat` everywhere). Without it, files in
    /// directories this run creates are created under their final name and
    /// removed on error or cancel; only a `SIGKILL` or power cut can leave
    /// a partial one (see [`crate::Placement`]). Costs up to 2× per file
    /// on XFS with several threads.
    pub atomic: bool,
    /// Resume an interrupted copy: an existing destination file with the
    /// source's size and modification time (to the nanosecond) is kept and
    /// counted as skipped; any other existing file is replaced atomically.
    /// Needs `file.preserve.timestamps` (otherwise no file could match).
    pub resume: bool,
    /// Make links to the source files instead of copies (`cp -rl`,
    /// `cp -rs`): directories are still created, symbolic links and
    /// special files still recreated; each regular file becomes a hardlink
    /// to, or a symbolic link naming, its source. `file.link` set to
    /// [`LinkMode::Hardlink`](crate::LinkMode::Hardlink) is the same as
    /// `Some(LinkKind::Hard)` here.
    pub link: Option<LinkKind>,
    /// Keep an existing destination file that is not older than its source
    /// (`cp -u`, `--update=older`), counted as skipped
    /// ([`SkipReason::NotOlder`]); replace one that is older.
    pub update_older: bool,
    /// Read FIFOs and devices met inside the tree as data into regular
    /// files (`cp -R --copy-contents`) instead of recreating them; a FIFO
    /// blocks the copy until something writes to it and closes it.
    pub copy_contents: bool,
    /// Back up each existing destination that is not a directory before
    /// replacing it (`cp -r --backup`): it is renamed to its backup name
    /// in the same directory, and renamed back if the copy fails. The
    /// replacement then takes the source's mode, not the old file's.
    #[cfg(unix)]
    pub backup: Option<Backups>,
    /// Replaced files take the source's mode rather than keeping the old
    /// file's (`cp -r --remove-destination`). The old file is still
    /// replaced atomically rather than removed first.
    pub remove_destination: bool,
    /// Ask before replacing (`cp -i`): for each destination that exists
    /// and is not a directory, [`Observer::may_replace`] is asked GNU cp's
    /// question; a no keeps it, counted as skipped
    /// ([`SkipReason::Declined`]). Questions come from the worker threads
    /// one at a time; with one thread ([`crate::run::Run::threads`]) they
    /// come in a fixed order, which answers piped in by a script need.
    pub interactive: bool,
    /// Walk the source and report what would be done ([`TreeEvent::Planned`])
    /// without creating or changing anything at the destination.
    pub dry_run: bool,
    /// Threads (0: chosen from the destination filesystem and the work,
    /// [`default_threads`]), cancellation and progress ([`Phase::Copy`]:
    /// files and bytes placed). After a cancel the workers finish the entry
    /// they are on (a file is either complete under its name or removed),
    /// start nothing new, set the metadata of the directories they created,
    /// and `copy_tree` returns with [`TreeReport::cancelled`] set.
    ///
    /// [`Phase::Copy`]: crate::run::Phase::Copy
    pub run: crate::run::Run,
}

impl TreeOptions {
    /// The permission bits withheld from a new directory until it is
    /// complete, as GNU cp does: with owners preserved, everything for the
    /// group and others (the directory may be about to change hands); with
    /// modes preserved, their write bits.
    #[cfg(unix)]
    pub(crate) fn dir_withheld(&self) -> u32 {
        if self.file.preserve.ownership {
            0o077
        } else if self.file.preserve.mode {
            0o022
        } else {
            0
        }
    }

    /// The permission bits a copy of an entry of mode `st_mode` is created
    /// with (see [`CloneOptions::default_mode`]).
    #[cfg(unix)]
    pub(crate) fn new_bits(&self, st_mode: u32) -> u32 {
        crate::prim::meta::creation_bits(
            st_mode,
            self.file.default_mode && !self.file.preserve.mode,
        )
    }

    /// `cp -a`: every attribute preserved, hardlinks kept, links not
    /// followed, `--reflink=auto`.
    pub fn archive() -> Self {
        TreeOptions {
            file: CloneOptions {
                preserve: crate::prim::meta::Preserve::ALL,
                ..CloneOptions::default()
            },
            hardlinks: true,
            ..TreeOptions::default()
        }
    }
}

/// The kind of a special file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    /// A named pipe.
    Fifo,
    /// A UNIX domain socket (recreated as an unconnected socket inode).
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

/// What a dry run would do with one entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    /// Create (or merge into) a directory.
    Dir,
    /// Clone or copy a regular file of `bytes` bytes.
    File {
        /// The file's size.
        bytes: u64,
    },
    /// Recreate a symbolic link.
    Symlink,
    /// Link to the copy of an earlier name of the same source inode.
    Hardlink,
    /// Recreate a FIFO, socket or device node.
    Special {
        /// Which kind.
        kind: SpecialKind,
    },
}

/// What [`TreeOptions::link`] makes in place of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// A hardlink to the source file (`cp -l`): the same inode.
    Hard,
    /// A symbolic link whose target is the source path as given (`cp -s`).
    Symbolic,
}

/// Why an entry was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The destination file already matched the source's size and
    /// modification time ([`TreeOptions::resume`]).
    Complete,
    /// The destination exists and [`Overwrite::Skip`] keeps it (`cp -n`).
    ///
    /// [`Overwrite::Skip`]: crate::Overwrite::Skip
    Exists,
    /// The destination is not older than the source
    /// ([`TreeOptions::update_older`]).
    NotOlder,
    /// [`Observer::may_replace`] said no ([`TreeOptions::interactive`]).
    Declined,
}

/// What happened to one entry, as told to an [`Observer`].
#[derive(Debug)]
#[non_exhaustive]
pub enum TreeEvent<'a> {
    /// A regular file was cloned or copied.
    File {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
        /// How, and how many bytes.
        outcome: Outcome,
    },
    /// A directory was created (or an existing one is being merged into).
    Dir {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
    },
    /// A symbolic link was recreated.
    Symlink {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
    },
    /// A further name of an already copied file was linked to that copy.
    Hardlink {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
    },
    /// A FIFO, socket or device node was recreated.
    Special {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
        /// Which kind.
        kind: SpecialKind,
    },
    /// Dry run: this is what would be done.
    Planned {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
        /// The action.
        action: Action,
    },
    /// An existing destination was kept.
    Skipped {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
        /// Why it was kept.
        reason: SkipReason,
    },
    /// An entry failed; the walk continues.
    Failed(&'a Error),
}

/// Hears about every entry of a [`copy_tree`] run, from the worker threads
/// (so it must be `Sync`, and quick: it runs on the copy's critical path).
pub trait Observer: Sync {
    /// One entry's event.
    fn event(&self, event: &TreeEvent<'_>);

    /// With [`TreeOptions::interactive`]: whether the existing
    /// destination `prompt.dst` may be replaced (`cp -i`'s question is
    /// [`Prompt::question`]). Never called twice at once. Observers that
    /// do not answer decline, as `cp -i` without anyone to ask does.
    #[cfg(unix)]
    fn may_replace(&self, prompt: &Prompt<'_>) -> bool {
        let _ = prompt;
        false
    }
}

impl<F: Fn(&TreeEvent<'_>) + Sync> Observer for F {
    fn event(&self, event: &TreeEvent<'_>) {
        self(event)
    }
}

/// An [`Observer`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Observer for Quiet {
    fn event(&self, _: &TreeEvent<'_>) {}
}

/// Totals of a tree copy. In a dry run, what would have been done.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TreeReport {
    /// Regular files cloned or copied (hardlinks not included).
    pub files: u64,
    /// Directories created or merged into.
    pub dirs: u64,
    /// Symbolic links recreated.
    pub symlinks: u64,
    /// Names linked to an earlier copy of the same file.
    pub hardlinks: u64,
    /// FIFOs, sockets and device nodes recreated.
    pub specials: u64,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Files whose blocks are shared with the source.
    pub cloned: u64,
    /// Files physically copied (copy_file_range or read/write).
    pub copied: u64,
    /// Files kept because they already matched ([`TreeOptions::resume`]).
    pub skipped: u64,
    /// Entries that failed.
    pub errors: u64,
    /// The run was cancelled before it finished.
    pub cancelled: bool,
}

impl TreeReport {
    /// A report of `totals` (a [`Progress`](crate::Progress)'s).
    pub fn from_totals(t: crate::run::Totals, cancelled: bool) -> TreeReport {
        TreeReport {
            files: t.files,
            dirs: t.dirs,
            symlinks: t.symlinks,
            hardlinks: t.hardlinks,
            specials: t.specials,
            bytes: t.bytes,
            cloned: t.cloned,
            copied: t.copied,
            skipped: t.skipped,
            errors: t.errors,
            cancelled,
        }
    }
}
