//! Reclaim the space of identical files, safely: plan, then execute.
//!
//! [`plan`] walks the paths in parallel (the walker, `crate::walk`) and narrows
//! candidates step by step, each step cheaper than the next: same
//! filesystem and size (≥ `min_size`); files that already share all their
//! blocks with each other (FIEMAP: same logical → physical runs, all
//! flagged shared) are one *cluster* and are read once, not once per name;
//! same BLAKE3 of the first and last 4 KiB; same BLAKE3 of everything. Hard
//! links of one inode count once. Small files (at most the two 4 KiB
//! edges) are opened once, during the walk, relative to their directory:
//! their layout is read and their bytes hashed whole there, so their
//! groups are final as soon as the walk ends. Inline ones (Btrfs) are
//! only counted: no name kept, no candidate (most small files on Btrfs are
//! inline, and their candidates were most of the plan's memory). A larger
//! file is opened for its layout and, unless all its blocks are shared
//! (then it may be skipped unread), its edges are hashed in that open.
//! The plan lists, per group of identical files, the source (a member of
//! the largest cluster, so the fewest files change), the targets, and the
//! bytes expected back. It is plain data (serde), so it can be shown,
//! saved, reviewed.
//!
//! [`dedupe`] is [`plan`] and [`execute()`] overlapped: the small files'
//! groups are handed to the executor when the walk ends and run while the
//! larger files are read; the rest follow. It also skips the whole-file
//! hash of larger files: `FIDEDUPERANGE` compares every byte before it
//! shares, so their groups come from the edges alone and the kernel's
//! comparison is the proof. A target it finds different (the ends matched,
//! the middle did not) is taken out of its group, and those targets and
//! their sources are planned again with whole-file hashes (`settle`). The
//! cost moves to the rare near-duplicate, which is read twice; the common
//! case reads each large file once, in the kernel, instead of twice. On
//! three copies of a real `/usr/share` the `FIDEDUPERANGE` calls, not the
//! reading, set the pace (see docs/benchmarks.md). A plan meant to be
//! shown or kept ([`plan`], `--dry-run`) is hashed whole.
//!
//! [`execute()`] only ever calls `FIDEDUPERANGE`: the kernel locks both files,
//! compares the bytes and shares blocks only if they are equal. A target
//! written since the plan is reported as changed and keeps its new data —
//! never FICLONE over a file hashed earlier. Ranges go in block-aligned
//! chunks of at most 1 GiB, to up to 127 targets per call (the 4 KiB
//! request limit); the unaligned tail is allowed because it ends at EOF of
//! both files. Times, mode and owner are untouched (dedupe is not a write).
//! What the plan expects back comes from the extent maps read while
//! planning: the bytes each target holds alone (FIEMAP extents not flagged
//! shared), plus, once, the extent of a cluster of clones that all become
//! targets (a forced source: a store object, a file the caller may not
//! change). What the report says came back is measured, never estimated:
//! the space in use before the first group on each filesystem and at the
//! end, each after a `syncfs` (statfs; on Btrfs its data and metadata
//! bytes), never the kernel's `bytes_deduped`, which counts bytes
//! compared, not freed. The final `syncfs` waits for the filesystem
//! to commit (on Btrfs, three copies of /usr/share: 1.76 s measured
//! against 1.58 s from the maps, paired, in docs/benchmarks.md), and for
//! other programs' pending writes too; a run with nothing to share pays
//! none of it. Space never grows: a target is shared only if its blocks
//! come back, or in measured batches where the filesystem cannot say
//! (see `execute.rs`); the report names each target skipped and why.
//!
//! Store objects ([`DedupeOptions::stores`]) are walked with the paths and
//! are sources only: a file equal to an object shares the object's blocks,
//! the object is never a target (its bytes are never changed by dedupe in
//! any case; its layout is not changed either).
//!
//! Groups run in the order of their source paths, not of their
//! size: neighbours on disk share allocation-group locks and btree blocks
//! (`bench/dedupe-floor` over one /usr/share plan: 2.13 s in path order,
//! 2.34 s in size order, one run each). Sharing is not re-read with
//! FIEMAP afterwards (one more ioctl per target, on the hot path): the
//! kernel answers for each target.
//!
//! Refused: NFS and CIFS/SMB clients (their dedupe cloned without
//! comparing), filesystems whose trial dedupe fails (ext4, tmpfs, ZFS...),
//! and groups across filesystems (groups are per device, except that the
//! subvolumes of one Btrfs filesystem, each with a device number of its
//! own, are grouped together: `FIDEDUPERANGE` shares between them).

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, OsStr};
use std::num::NonZeroU64;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rayon::prelude::*;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, FileType, OFlags};
use rustix::io::Errno;

use crate::extents::extents_fd;
use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;
use crate::ground::lock;
use crate::prim::files::open_deep;
use crate::probe::Answer;
use crate::run::{Phase, Run};
use crate::walk::{self, DirInfo, Entry, Visitor};

mod exclude;
mod execute;
pub mod index;
mod stages;
pub mod watch;

pub use exclude::Exclude;
pub use execute::{execute, DedupeReport, FileStamp, SkipReason, SkippedTarget, UNPROVEN_BATCH};
pub use index::IndexReport;
use index::{DirProof, Entry as IndexEntry, FsIndex, Indexes, Learnt, Record, Unstated, Update};
use stages::{layout_facts, Cand, Name, Names, Span, Times};

/// Bytes hashed from each end of a file for the partial hash.
const EDGE: u64 = 4096;

/// The largest file a Btrfs tree search is believed inline for: Btrfs's
/// default `max_inline`, the most a file's bytes may take inline
/// uncompressed. A same-size rewrite of a file up to this size is inline
/// again once written back whatever its bytes; a larger inline file is
/// inline only compressed, and a rewrite may not compress (see
/// `Collect::inline_by_search`).
const SEARCH_INLINE_MAX: u64 = 2048;

/// The largest size a Btrfs tree search in directory `dirfd` is
/// believed inline for: [`SEARCH_INLINE_MAX`], or the `max_inline` the
/// filesystem is mounted with when smaller (a file inline under a larger
/// one and rewritten is written back to a regular extent). Btrfs shows
/// `max_inline` among a mount's options only when not the default; read
/// from `/proc/self/mountinfo`, the line of `dirfd`'s mount (by its id:
/// a Btrfs file's device number is its subvolume's, not the mount's). 0
/// (no search believed) when that cannot be read. Read once per device
/// and run: a remount during the run is not seen.
fn inline_limit(dirfd: BorrowedFd<'_>) -> u64 {
    let Ok(id) = cowlink_sys::mount_id(dirfd) else {
        return 0;
    };
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let want = id.to_string();
    text.lines()
        .filter(|l| l.split(' ').next() == Some(want.as_str()))
        .filter_map(|l| l.split_once(" - ").map(|(_, r)| r))
        // fstype, source, then the filesystem's own options.
        .filter_map(|r| r.split(' ').nth(2))
        .flat_map(|o| o.split(','))
        .filter_map(|o| o.strip_prefix("max_inline="))
        .map(|n| n.parse().unwrap_or(0))
        .fold(SEARCH_INLINE_MAX, u64::min)
}

/// Largest range given to one `FIDEDUPERANGE` call.
pub const CHUNK: u64 = 1 << 30;

/// How [`plan`] works.
#[derive(Debug, Clone)]
pub struct DedupeOptions {
    /// Smallest file considered, in bytes (default 1: every non-empty
    /// file holds a block of its own on XFS, so even a 1-byte duplicate
    /// gives back a block; Btrfs keeps small files inline in its metadata,
    /// and those are reported in [`DedupePlan::inline_skipped`] instead).
    pub min_size: u64,
    /// Threads for walking, hashing and executing (0: one per core),
    /// cancellation, and progress: [`Phase::Scan`] (entries seen),
    /// [`Phase::Hash`] (bytes hashed of the total to hash),
    /// [`Phase::Dedupe`] (target bytes compared and shared, of the total).
    pub run: Run,
    /// Content-addressed stores ([`crate::store::Store`]) whose objects
    /// serve as sources: a file equal to an object comes to share the
    /// object's blocks. Objects are only ever sources, never changed
    /// (not even their layout), also when a path given to dedupe reaches
    /// them. Each must be a store (its `cowlink-store` marker present).
    pub stores: Vec<PathBuf>,
    /// Paths left alone (`--exclude`): never read, never a source nor a
    /// target; an excluded directory is not opened. Empty by default.
    pub exclude: Exclude,
    /// The directory of the persistent indexes (one per filesystem, see
    /// [`index`]), or `None` (the default) to plan from nothing. With an
    /// index, a file whose identity (inode, size, mtime, ctime, birth
    /// time) is unchanged since a run learnt it is not read again; what
    /// is shared is still proven by `FIDEDUPERANGE`.
    /// [`index::default_dir`] is where the command line keeps them.
    pub index: Option<PathBuf>,
    /// Which files the index says share every block (or hold none
    /// alone) are mapped again ([`LayoutRecheck`]).
    pub layout_recheck: LayoutRecheck,
    /// Whether [`dedupe`] returns the groups it carried out in
    /// [`DedupePlan::groups`] (the default). Without, the planner hands
    /// the groups over in batches, waits while the executor is a batch
    /// behind, and each batch is dropped once carried out: the run holds
    /// the paths of a batch or two rather than of every duplicate (over
    /// three copies of a real tree, those paths were a fifth of a first
    /// run's peak memory). [`DedupePlan::groups_found`] still counts
    /// them. The command line keeps them only to print them (`--json`,
    /// `--verbose`). [`plan`] always returns its groups.
    pub keep_groups: bool,
}

impl Default for DedupeOptions {
    fn default() -> Self {
        DedupeOptions {
            min_size: 1,
            run: Run::default(),
            stores: Vec::new(),
            exclude: Exclude::default(),
            index: None,
            layout_recheck: LayoutRecheck::default(),
            keep_groups: true,
        }
    }
}

/// Extents can move while a file's identity stays: a compressing Btrfs
/// defragment or another tool's dedupe leaves the ctime. An index entry
/// that says a file shares every block (or holds none alone) spares the
/// work of reading it; a stale one would skip a duplicate that is no
/// longer shared. Mapping such a file again costs an open and a FIEMAP
/// (no byte read), which on a tree deduplicated before is most of a
/// rerun's cost beyond the metadata walk. An entry that says a file is
/// inline (Btrfs) spares even that, and goes stale the same way (another
/// tool's dedupe puts an inline file on a regular extent): such a file is
/// mapped again, as a new file is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LayoutRecheck {
    /// One such file in [`RECHECK_ONE_IN`], chosen afresh each run (by
    /// inode and a random number of the run): a layout moved behind the
    /// index is found within a few runs (after 50 runs, 96% of such
    /// files), at a sixteenth of the cost.
    #[default]
    Sample,
    /// Every such file, every run (`--recheck-layouts`).
    Every,
    /// Never: the index's layouts are trusted while the identity holds.
    Never,
}

/// [`LayoutRecheck::Sample`] maps again one file in this many.
pub const RECHECK_ONE_IN: u64 = 16;

impl LayoutRecheck {
    /// Whether inode `ino` is mapped again in a run whose random number
    /// is `salt`.
    pub(crate) fn picks(self, ino: u64, salt: u64) -> bool {
        match self {
            LayoutRecheck::Every => true,
            LayoutRecheck::Never => false,
            LayoutRecheck::Sample => {
                // splitmix64 of the inode and the run's number: every
                // inode equally likely in each run, independently of
                // the runs before.
                mix64((ino ^ salt).wrapping_add(0x9e37_79b9_7f4a_7c15)) % RECHECK_ONE_IN == 0
            }
        }
    }
}

/// splitmix64's finaliser: a bijection of 64 bits whose every input bit
/// moves every output bit (the recheck's pick, the index's inode marks).
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The directories the walk starts from: `paths`, then the objects
/// directory of each store in `stores` (the walk roots from the returned
/// index on are store objects: sources only). A store whose objects
/// directory does not exist yet holds nothing and adds no root.
///
/// A path that is a symbolic link to a directory is walked as that
/// directory, as `link/` would be: the caller named it, and a link has
/// no blocks to share. One to anything else, or a path that is neither
/// a file nor a directory (a FIFO, a device), is an error of its own in
/// the third list (the run goes on with the other paths), not a silent
/// nothing.
fn walk_roots<P: AsRef<Path>>(
    paths: &[P],
    stores: &[PathBuf],
) -> Result<(Vec<PathBuf>, usize, Vec<Error>)> {
    let mut roots: Vec<PathBuf> = Vec::with_capacity(paths.len());
    let mut refused = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let refuse = |why: &str| {
            Error::new(Operation::Dedupe, ErrorKind::InvalidInput)
                .with_src(p)
                .with_reason(why.to_string())
        };
        // Missing or unreadable: the walk reports it, as for any path.
        let Ok(st) = cowlink_sys::lstat(p) else {
            roots.push(p.to_path_buf());
            continue;
        };
        match cowlink_sys::file_type(st.st_mode) {
            FileType::Directory | FileType::RegularFile => roots.push(p.to_path_buf()),
            FileType::Symlink => match cowlink_sys::stat(p).map(|t| cowlink_sys::file_type(t.st_mode)) {
                Ok(FileType::Directory) => {
                    let mut dir = p.as_os_str().to_os_string();
                    dir.push("/");
                    roots.push(dir.into());
                }
                Ok(FileType::RegularFile) => refused.push(refuse(
                    "a symbolic link to a file: links have no blocks to share; give the file it points to",
                )),
                Ok(_) => refused.push(refuse(
                    "a symbolic link to something that is neither a file nor a directory",
                )),
                Err(Errno::NOENT) => refused.push(
                    Error::from_errno(Operation::Dedupe, Errno::NOENT)
                        .with_src(p)
                        .with_reason("a symbolic link to nothing: its target does not exist"),
                ),
                Err(e) => refused.push(Error::from_errno(Operation::Dedupe, e).with_src(p)),
            },
            _ => refused.push(refuse(
                "neither a regular file nor a directory: nothing to deduplicate",
            )),
        }
    }
    let fixed_from = roots.len();
    for store in stores {
        let marker = store.join(crate::store::MARKER_NAME);
        match cowlink_sys::lstat(&marker) {
            Ok(st) if cowlink_sys::file_type(st.st_mode) == FileType::RegularFile => {}
            Ok(_) | Err(Errno::NOENT) | Err(Errno::NOTDIR) => {
                return Err(Error::new(Operation::Dedupe, ErrorKind::InvalidInput)
                    .with_src(store)
                    .with_reason(format!(
                        "not a cowlink store (no {} file in it)",
                        crate::store::MARKER_NAME
                    )))
            }
            Err(e) => return Err(Error::from_errno(Operation::Dedupe, e).with_src(store)),
        }
        let objects = store.join("objects");
        if cowlink_sys::lstat(&objects).is_ok() {
            roots.push(objects);
        }
    }
    Ok((roots, fixed_from, refused))
}

/// Identical files: one source and the targets to share its blocks.
///
/// In JSON each path is a string (lossy for names that are not UTF-8) with
/// a `*_bytes` companion holding the exact bytes where needed; reading a
/// plan back takes the exact bytes when they are there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "GroupWire")]
pub struct DedupeGroup {
    /// Size of every file in the group.
    pub size: u64,
    /// BLAKE3 of the whole content, hex. `None` for a group that
    /// [`dedupe`] formed from the first and last 4 KiB alone: the kernel
    /// compares every byte before it shares, so a whole-file hash would
    /// only read the same bytes once more. A target the kernel finds
    /// different is taken out of the group and grouped again by a
    /// whole-file hash (see [`DedupeReport::regrouped`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blake3: Option<String>,
    /// The file whose blocks the targets will share.
    #[serde(flatten, serialize_with = "crate::name::json::source")]
    pub source: PathBuf,
    /// The files that will be made to share the source's blocks.
    #[serde(flatten, serialize_with = "crate::name::json::targets")]
    pub targets: Vec<PathBuf>,
    /// Files of the group that already share the source's blocks.
    #[serde(flatten, serialize_with = "crate::name::json::already_shared")]
    pub already_shared: Vec<PathBuf>,
    /// Bytes expected back, from the extent maps: the targets' blocks that
    /// no other file shares, and the extent of a cluster of clones that
    /// all become targets. What came back is measured
    /// ([`DedupeReport::bytes_reclaimed`]).
    pub reclaimable: u64,
    /// Which file `source` named when the plan was made: [`execute()`]
    /// carries out the group only if it still does. `None` in a plan that
    /// does not record it (made by hand or by an older version): such a
    /// group is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_stamp: Option<FileStamp>,
    /// Which file each target named, in the order of `targets`: a target
    /// that is no longer that file is left as it is (and one without a
    /// stamp is refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_stamps: Vec<FileStamp>,
}

/// [`DedupeGroup`] as JSON has it: each path field next to its exact bytes.
#[derive(serde::Deserialize)]
struct GroupWire {
    size: u64,
    #[serde(default)]
    blake3: Option<String>,
    source: String,
    #[serde(default)]
    source_bytes: Option<Vec<u8>>,
    targets: Vec<String>,
    #[serde(default)]
    targets_bytes: Option<Vec<Option<Vec<u8>>>>,
    #[serde(default)]
    already_shared: Vec<String>,
    #[serde(default)]
    already_shared_bytes: Option<Vec<Option<Vec<u8>>>>,
    reclaimable: u64,
    #[serde(default)]
    source_stamp: Option<FileStamp>,
    #[serde(default)]
    target_stamps: Vec<FileStamp>,
}

impl From<GroupWire> for DedupeGroup {
    fn from(w: GroupWire) -> DedupeGroup {
        use crate::name::json::{read_many, read_one};
        DedupeGroup {
            size: w.size,
            blake3: w.blake3,
            source: read_one(w.source, w.source_bytes),
            targets: read_many(w.targets, w.targets_bytes),
            already_shared: read_many(w.already_shared, w.already_shared_bytes),
            reclaimable: w.reclaimable,
            source_stamp: w.source_stamp,
            target_stamps: w.target_stamps,
        }
    }
}

/// What [`plan`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DedupePlan {
    /// Groups with at least one target, largest reclaim first (empty
    /// after a [`dedupe`] without [`DedupeOptions::keep_groups`]).
    pub groups: Vec<DedupeGroup>,
    /// How many groups were found: the length of [`DedupePlan::groups`]
    /// where they are kept.
    #[serde(default)]
    pub groups_found: u64,
    /// Regular files the walk saw (store objects included).
    pub files_scanned: u64,
    /// Files of at least `min_size` on a filesystem that can deduplicate.
    pub candidates: u64,
    /// Bytes read for hashing.
    pub bytes_hashed: u64,
    /// Groups whose files all share blocks already (nothing to do).
    pub groups_already_shared: u64,
    /// Files skipped because they already share the source's blocks.
    pub files_already_shared: u64,
    /// Extra names of hard-linked files (one inode is one file).
    pub hardlinks_skipped: u64,
    /// Files whose data lives inline in the filesystem's metadata (small
    /// files on Btrfs): they have no blocks to share, so they are not
    /// shareable and nothing is claimed for them.
    #[serde(default)]
    pub inline_skipped: u64,
    /// Duplicates left alone because the caller may not change them
    /// (`FIDEDUPERANGE` needs the target's owner, write permission, or
    /// `CAP_SYS_ADMIN`); they can still be a group's source.
    #[serde(default)]
    pub not_permitted: u64,
    /// Files that could not be read, and filesystems refused (sorted by
    /// path). Not read back from a saved plan.
    #[serde(skip_deserializing)]
    pub errors: Vec<Error>,
    /// What the index did (`None` without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexReport>,
}

impl DedupePlan {
    /// Targets in all groups.
    pub fn targets(&self) -> u64 {
        self.groups.iter().map(|g| g.targets.len() as u64).sum()
    }

    /// Bytes expected back in all groups.
    pub fn reclaimable(&self) -> u64 {
        self.groups.iter().map(|g| g.reclaimable).sum()
    }
}

#[derive(Default)]
struct Collect {
    /// The candidates and their names, and (with an index) the times
    /// the walk saw of each candidate, by the same place: kept apart,
    /// only the index's records need them, and planning lets them go
    /// once those are written (24 bytes a candidate).
    files: Mutex<(Vec<Cand>, Names, Vec<Times>)>,
    /// In the order met (the first is returned when nothing could be
    /// walked).
    errors: Mutex<Vec<Error>>,
    /// Directories there but not walked whole: not read whole (see
    /// [`walk::scan::Visitor::unreadable`]), holding a file that could
    /// not be examined, or excluded. The index keeps what it holds of
    /// them and below them: a run forgets only what it saw gone.
    unwalked: Mutex<Vec<PathBuf>>,
    min_size: u64,
    /// The caller's effective user id.
    euid: u32,
    /// Walk roots from this index on are store objects: sources only.
    fixed_from: usize,
    /// Per device: whether a small file's layout may be learnt from a
    /// Btrfs tree search on its directory (Btrfs, until a search is
    /// refused), and then the largest size it is believed inline for
    /// (see [`inline_limit`]).
    searchable: RwLock<HashMap<u64, Option<u64>>>,
    /// Inline files, kept apart from `files` without their names.
    inline: Mutex<SetAside>,
    /// Regular files below `min_size`, or of holes only: counted as
    /// scanned, nothing more.
    below_min: AtomicU64,
    /// `--exclude`, and the walk's roots its paths are relative to.
    exclude: Exclude,
    roots: Vec<PathBuf>,
    /// The indexes, when the run keeps them.
    indexes: Option<Arc<Indexes>>,
    /// Which indexed layouts are mapped again, and this run's random
    /// number for [`LayoutRecheck::Sample`].
    recheck: LayoutRecheck,
    salt: u64,
    /// Each walked directory's device and inode, by the walk's id: the
    /// index's records are per directory.
    dir_keys: RwLock<Vec<(u64, u64)>>,
    /// The directories (device, inode) something is mounted in, as the
    /// run began ([`mount_dirs`]); `None` when not known, or without an
    /// index to prove files unchanged by.
    mount_dirs: Option<HashSet<(u64, u64)>>,
}

/// The directories (device, inode) holding a mount point. A name there
/// may have a file mounted on it, while its directory entry gives the
/// inode under the mount: only a `statx` of the name tells them apart,
/// so no file of such a directory is known by transaction alone. Only
/// mount points below one of the walk's `roots` are looked at (a `stat`
/// elsewhere could wait on an unanswering network filesystem). `None`
/// when the mount table or a root cannot be read.
fn mount_dirs(roots: &[PathBuf]) -> Option<HashSet<(u64, u64)>> {
    use std::os::unix::fs::MetadataExt;
    let text = cowlink_sys::mount_table().ok()?;
    let roots: Vec<PathBuf> = roots
        .iter()
        .map(std::fs::canonicalize)
        .collect::<std::io::Result<_>>()
        .ok()?;
    Some(
        crate::ground::mountinfo::parse(&text)
            .into_iter()
            .filter(|m| roots.iter().any(|r| m.mount_point.starts_with(r)))
            .filter_map(|m| {
                let st = std::fs::metadata(m.mount_point.parent()?).ok()?;
                Some((st.dev(), st.ino()))
            })
            .collect(),
    )
}

/// The inline files the walk met, and per device the shortest of their
/// names (the one a device with nothing but inline files is probed by).
#[derive(Default)]
struct SetAside {
    files: Vec<stages::Inline>,
    shortest: HashMap<u64, PathBuf>,
    /// With an index: each inline file met in a directory, for that
    /// directory's record (so the next run knows it is inline from the
    /// index, not from a tree search per file).
    indexed: Vec<InlineSeen>,
    /// With an index: the stored entries of files left out of the run
    /// (excluded, or below `--min-size`) and unchanged, by the walk's id
    /// of their directory (see [`Collect::keep`]).
    kept: Vec<Kept>,
}

/// The stored entry of a file left out of the run, kept: the walk's id
/// of its directory, its inode, the entry.
type Kept = (u32, u64, IndexEntry);

/// An inline file as its directory's record keeps it.
struct InlineSeen {
    /// The walk's id of its directory.
    dir: u32,
    ino: u64,
    size: u64,
    times: Times,
}

impl Collect {
    /// Record one entry of the walk.
    fn take(&self, e: Entry<'_>) {
        if e.file_type.is_some_and(|t| t != FileType::RegularFile) {
            return;
        }
        if self.index_own(&e) {
            return;
        }
        // An excluded file is not a candidate; with an index, what it
        // holds of the file, unchanged, is kept (below).
        let excluded = !self.exclude.is_empty() && self.excluded(e.root, &e.path());
        if excluded && self.indexes.is_none() {
            return;
        }
        // On Btrfs, as root, a file of an indexed directory is known by
        // transaction (see `index::DirProof`), without a statx.
        let proof = self.dir_proof(&e);
        let unstated = proof.as_ref().and_then(|(ix, dir, dev, p)| {
            ix.unstated(*dir, *dev, e.ino?, p)
                .filter(|_| e.file_type == Some(FileType::RegularFile))
        });
        // A layout claim is mapped again: always where the file was
        // written since its record's transaction (a dedupe, a
        // defragment), or where the record is to be certified; never
        // where the transaction proves it unchanged; else by sample.
        // (An inline claim, by the same rule; but extents a balance
        // moves are never inline: a relocatable file's claim holds.)
        let (remap, remap_inline) = match (&unstated, proof.as_ref().map(|p| &*p.3)) {
            (Some(Unstated::Written(_)), _)
            | (None, Some(DirProof::Remap | DirProof::Searched { .. })) => {
                let r = self.recheck != LayoutRecheck::Never;
                (r, r)
            }
            (Some(Unstated::Relocatable(..)), _) => (
                self.recheck != LayoutRecheck::Never,
                self.recheck == LayoutRecheck::Every,
            ),
            (Some(Unstated::Unchanged(..)), _) => {
                let r = self.recheck == LayoutRecheck::Every;
                (r, r)
            }
            _ => (false, false),
        };
        let sampled = proof
            .as_ref()
            .is_none_or(|p| matches!(*p.3, DirProof::None));
        // Written since its record's transaction, or in a directory
        // whose search met leaves written since: the record is rebuilt,
        // to be given this run's.
        let refresh = matches!(unstated, Some(Unstated::Written(_)))
            || proof
                .as_ref()
                .is_some_and(|p| matches!(*p.3, DirProof::Searched { refresh: true, .. }));
        // Claims proven by transaction: every one, or an inline one.
        let proven = matches!(unstated, Some(Unstated::Unchanged(..)));
        let proven_inline = proven || matches!(unstated, Some(Unstated::Relocatable(..)));
        let st = match &unstated {
            Some(
                Unstated::Unchanged(id, _) | Unstated::Relocatable(id, _) | Unstated::Written(id),
            ) => *id,
            // statx: the birth time comes with the rest, for the index.
            None => match cowlink_sys::file_id_at(e.dirfd, e.name) {
                Ok(st) => st,
                // Not looked at, as without an index.
                Err(_) if excluded => return,
                Err(err) => {
                    // Not gone: its directory's record is kept as it is
                    // (a directory listed but not searchable).
                    if let (Some(d), false) = (e.dir, err == rustix::io::Errno::NOENT) {
                        self.unwalked(&d.path);
                    }
                    return self
                        .error(Error::from_errno(Operation::Dedupe, err).with_src(e.path()));
                }
            },
        };
        // Stated now (not known by transaction): `statx` counts blocks
        // waiting to be written too.
        let stated = unstated.is_none();
        let picks = |ino| remap || (sampled && self.recheck.picks(ino, self.salt));
        let picks_inline = |ino| remap_inline || (sampled && self.recheck.picks(ino, self.salt));
        if cowlink_sys::file_type(st.mode) != FileType::RegularFile {
            return;
        }
        let size = st.size;
        // A file of holes only (no block, none waiting to be written) has
        // nothing to share: left out as a file below the minimum size is.
        // (Taken in, copies of it were "shared" again on every run, and
        // counted as reclaimable.)
        let below_min = size < self.min_size.max(1) || (stated && st.blocks == 0);
        if below_min || excluded {
            if below_min && !excluded {
                self.below_min.fetch_add(1, Ordering::Relaxed);
            }
            // Left out of this run, not gone: its entry stays.
            let stored = match (unstated, &proof) {
                (Some(Unstated::Unchanged(_, entry) | Unstated::Relocatable(_, entry)), _) => {
                    Some(entry)
                }
                (_, Some((fs, dir, dev, _))) if size > 0 => {
                    (*dev == st.dev).then(|| fs.lookup(*dir, &st)).flatten()
                }
                _ => None,
            };
            if let (Some(entry), Some((fs, dir, _, _))) = (stored, &proof) {
                self.keep(&e, st.ino, entry);
                // Trusted unchecked: the record is not certified.
                fs.uncertify(*dir);
            }
            return;
        }
        // What the kernel asks of a dedupe target: root, the owner, or
        // write permission (checked only when the first two fail).
        let euid = self.euid;
        let may_change = e.root < self.fixed_from
            && (euid == 0
                || st.uid == euid
                || fs::accessat(e.dirfd, e.name, fs::Access::WRITE_OK, fs::AtFlags::EACCESS)
                    .is_ok());
        let mut c = Cand {
            name: Name::default(),
            dev: st.dev,
            ino: st.ino,
            size,
            shared: None,
            runs: 0,
            // Until the layout is read.
            exclusive: st.blocks * 512,
            inline: false,
            hash: None,
            mapped: false,
            may_change,
            known: false,
            whole: None,
            stamp: FileStamp::of(&st),
            changed: false,
        };
        let times = Times::new(st.mtime_ns, st.ctime_ns, st.btime_ns);
        // Unchanged since a run learnt it: take what was learnt, read
        // nothing. Looked up in its directory's record (a file on another
        // device than its directory, a bind mount, is not indexed).
        let hit = match (unstated, &proof) {
            // Its entry, known by transaction.
            (Some(Unstated::Unchanged(_, entry) | Unstated::Relocatable(_, entry)), _) => {
                Some(entry)
            }
            (_, Some((fs, dir, dev, _))) => {
                (*dev == st.dev).then(|| fs.lookup(*dir, &st)).flatten()
            }
            (_, None) => None,
        };
        // What the index holds of it, to tell whether it still holds it
        // exactly (see `record_walk`).
        let held = hit.clone();
        // A layout claim mapped again and found wrong is counted.
        let corrected = || {
            if let Some((fs, ..)) = &proof {
                fs.corrected(st.ino);
            }
        };
        // An inline claim picked to be mapped again.
        let mut inline_checked = false;
        if let Some(hit) = hit {
            // A claim that would spare work, trusted unchecked: the
            // directory's record cannot be given this run's transaction.
            let spares = hit.inline || hit.shared.is_some() || hit.exclusive == 0;
            let checked = if hit.inline {
                proven_inline || picks_inline(st.ino)
            } else {
                proven || picks(st.ino)
            };
            if hit.mapped && spares && !checked {
                if let Some((fs, dir, _, _)) = &proof {
                    fs.uncertify(*dir);
                }
            }
            // An entry written before its file was mapped (a run stopped
            // after the walk, a file without a partner then) gives only the
            // identity: the file is mapped, and hashed, as a new one.
            c.known = hit.mapped;
            c.mapped = hit.mapped;
            if hit.mapped {
                c.exclusive = hit.exclusive;
                c.shared = hit.shared.and_then(NonZeroU64::new);
                c.inline = hit.inline;
            }
            // An inline claim sets the file aside unread, and another
            // tool's dedupe moves an inline file onto a regular extent
            // leaving its times: one picked is taken as a new file
            // (mapped, below), not trusted.
            if c.inline && picks_inline(st.ino) {
                inline_checked = true;
                c.known = false;
                c.mapped = false;
                c.inline = false;
                c.shared = None;
                c.exclusive = st.blocks * 512;
            }
            // A layout that would spare work (every block shared, or
            // none held alone) is mapped again: extents move without
            // the identity moving (a compressing Btrfs defragment, or
            // another tool's dedupe, leaves the ctime), and a stale
            // claim would skip a duplicate. One FIEMAP, nothing read.
            if c.mapped && !c.inline && (c.shared.is_some() || c.exclusive == 0) && picks(st.ino) {
                let fresh = open_read_at(e.dirfd, e.name).ok().and_then(|fd| {
                    // Written back first: see `read_layout`.
                    let list = extents_fd(fd.as_fd(), true).ok()?;
                    // Mapped as the file the walk saw, or not at all
                    // (see `still_walked`).
                    still_walked(fd.as_fd(), c.stamp).then_some(list)
                });
                match fresh {
                    Some(list) => {
                        c.exclusive = 0;
                        layout_facts(&list, &mut c);
                        let now = (c.exclusive, c.shared.map(NonZeroU64::get), c.inline);
                        if now != (hit.exclusive, hit.shared, false) {
                            corrected();
                        }
                    }
                    // Not mapped again: taken as a new file.
                    None => {
                        c.known = false;
                        c.mapped = false;
                        c.shared = None;
                        c.exclusive = st.blocks * 512;
                    }
                }
            }
            c.hash = hit.hash;
            c.whole = hit.whole.map(Box::new);
            if c.inline {
                return self.set_aside(c, times, &e, held.as_ref());
            }
        }
        if size <= 2 * EDGE && !c.mapped {
            // Small files are read now, while their directory is open
            // (no path to walk again), in the walk's threads. Inline
            // ones (Btrfs) need not be opened at all: the tree search
            // says so when its inline extent holds the file's whole
            // size (see `inline_by_search` for why the size).
            let searched = self.inline_by_search(e.dirfd, st.dev, st.ino, size) == Some(true);
            if searched {
                c.inline = true;
            } else if let Ok(fd) = open_read_at(e.dirfd, e.name) {
                if !read_layout(fd.as_fd(), &mut c) {
                    return self.error(changed_while_read(&e.path()));
                }
            }
            if inline_checked && !c.inline {
                corrected();
            }
            if c.inline {
                return self.set_aside(c, times, &e, held.as_ref());
            }
        }
        let known = !refresh && held.is_some_and(|h| entry_of(&c, &times) == h);
        let mut files = lock(&self.files);
        let (files, names, walked) = &mut *files;
        c.name = match e.dir {
            Some(d) => {
                names.met(d.id, c.ino, known);
                names.push(Some(d.id), OsStr::from_bytes(e.name.to_bytes()))
            }
            None => names.push(None, e.path().as_os_str()),
        };
        files.push(c);
        if self.indexes.is_some() {
            walked.push(times);
        }
    }

    /// The index of an entry's directory, the directory's inode and
    /// device, and how its files are known ([`DirProof`]); `None` for a
    /// walk root or without an index.
    fn dir_proof(&self, e: &Entry<'_>) -> Option<(Arc<FsIndex>, u64, u64, Arc<DirProof>)> {
        let ix = self.indexes.as_ref()?;
        let d = e.dir?;
        let (dev, dir) = *self
            .dir_keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(d.id)?;
        let fs = ix.of(dev, e.dirfd)?;
        // A directory something is mounted in: each name is `statx`ed
        // (its entry's inode is the one under the mount).
        if self
            .mount_dirs
            .as_ref()
            .is_none_or(|m| m.contains(&(dev, dir)))
        {
            let p = fs.no_proof();
            return Some((fs, dir, dev, p));
        }
        let p = fs.proof(dir, e.dirfd, dev);
        Some((fs, dir, dev, p))
    }

    /// Whether the entry is one of the index's own files, in the index's
    /// directory inside the tree walked or given as a path itself
    /// ([`Indexes::own_file`]).
    fn index_own(&self, e: &Entry<'_>) -> bool {
        let Some(ix) = &self.indexes else {
            return false;
        };
        let key = || match e.dir {
            Some(d) => {
                let keys = self.dir_keys.read().unwrap_or_else(|e| e.into_inner());
                keys.get(d.id).copied()
            }
            // A file given as a path: its directory, open beside it.
            None => cowlink_sys::fstat(e.dirfd)
                .ok()
                .map(|st| (st.st_dev, st.st_ino)),
        };
        ix.own_file(key, e.name.to_bytes())
    }

    /// Directory `path` is there but not walked whole (see
    /// [`Collect::unwalked`]).
    fn unwalked(&self, path: &Path) {
        if self.indexes.is_some() {
            lock(&self.unwalked).push(path.to_path_buf());
        }
    }

    /// Whether `path` (below walk root `root`) is excluded by its own name
    /// or path (its directories were checked when the walk reached them).
    fn excluded(&self, root: usize, path: &Path) -> bool {
        if self.exclude.is_empty() {
            return false;
        }
        let base = self.roots.get(root).map_or(Path::new(""), |r| r.as_path());
        path.strip_prefix(base)
            .is_ok_and(|rel| !rel.as_os_str().is_empty() && self.exclude.excludes_entry(rel))
    }

    /// Keep the stored `entry` of file `ino`, met at `e` and left out of
    /// this run (excluded, or below `--min-size`), for its directory's
    /// record: a run with other options has not pruned it. Counted as met
    /// in the directory, and known.
    fn keep(&self, e: &Entry<'_>, ino: u64, entry: IndexEntry) {
        let Some(d) = e.dir else { return };
        lock(&self.files).1.met(d.id, ino, true);
        lock(&self.inline).kept.push((d.id as u32, ino, entry));
    }

    /// Keep an inline file apart, without its name (unless its path is
    /// its device's shortest yet). With an index, it is counted as met in
    /// its entry's directory, `known` if the index held it (`held`) as it
    /// is.
    fn set_aside(&self, c: Cand, times: Times, e: &Entry<'_>, held: Option<&IndexEntry>) {
        let dir = e.dir.map(|d| d.id);
        // (A file on another device than its directory is not indexed.)
        let same_dev = |dir: usize| {
            let keys = self.dir_keys.read().unwrap_or_else(|e| e.into_inner());
            keys.get(dir).is_some_and(|&(dev, _)| dev == c.dev)
        };
        let seen = match (&self.indexes, dir) {
            (Some(_), Some(dir)) if same_dev(dir) => {
                let seen = InlineSeen {
                    dir: dir as u32,
                    ino: c.ino,
                    size: c.size,
                    times,
                };
                lock(&self.files)
                    .1
                    .met(dir, c.ino, held == Some(&inline_entry(&seen)));
                Some(seen)
            }
            _ => None,
        };
        let mut aside = lock(&self.inline);
        aside.indexed.extend(seen);
        aside.files.push(stages::Inline {
            dev: c.dev,
            ino: c.ino,
            size: c.size,
        });
        match aside.shortest.get_mut(&c.dev) {
            Some(p) if p.as_os_str().len() <= e.path_len() => {}
            Some(p) => *p = e.path(),
            None => {
                aside.shortest.insert(c.dev, e.path());
            }
        }
    }

    /// Whether file `ino`'s data is inline in Btrfs metadata, from one tree
    /// search on its directory `dirfd` (device `dev`): about a quarter of the
    /// cost of opening the file and mapping its extents
    /// (`bench/inline-probe`), and most small files on Btrfs are inline.
    /// `None` where the search is not available (another filesystem, or no
    /// `CAP_SYS_ADMIN`) or failed: the caller maps the file instead.
    ///
    /// The search reads the extents as last written back: a file grown,
    /// shrunk or replaced and not yet written back still shows its old
    /// inline extent. So the answer is yes only when that extent starts
    /// the file and holds all `size` bytes of it as `statx` gives them
    /// now; otherwise the file is mapped (written back first).
    ///
    /// A file rewritten in place at the same size, not yet written back,
    /// is inline again once it is only when its bytes fit inline as they
    /// are: Btrfs also inlines a file of up to a block whose *compressed*
    /// data fits `max_inline`, and such a file rewritten with bytes that
    /// do not compress lands in a regular extent. So the answer is yes
    /// only up to [`SEARCH_INLINE_MAX`] bytes, or the mount's smaller
    /// `max_inline` ([`inline_limit`]); a larger (compressed)
    /// inline file is mapped, an open and a FIEMAP more for a file that
    /// is rare outside a compressed mount. And only when the inline extent
    /// is the file's only item: one with an extent preallocated past its
    /// end (`fallocate` keeping the size) is, rewritten, written back to a
    /// regular extent. Kept in the index under the
    /// file's new identity (writeback moves no time), a wrong yes would
    /// set the file aside every run.
    fn inline_by_search(
        &self,
        dirfd: BorrowedFd<'_>,
        dev: u64,
        ino: u64,
        size: u64,
    ) -> Option<bool> {
        let known = self
            .searchable
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
            .copied();
        let remember = |limit: Option<u64>| {
            self.searchable
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(dev, limit);
        };
        let limit = known.unwrap_or_else(|| {
            let btrfs = FsKind::of_fd(dirfd).is_ok_and(|k| k == FsKind::Btrfs);
            let limit = btrfs.then(|| inline_limit(dirfd));
            remember(limit);
            limit
        })?;
        // Two items: a second (an extent preallocated past the end) means
        // a rewrite is not inline once written back.
        match cowlink_sys::btrfs_leading_file_extents(dirfd, ino, 2) {
            Ok(items) => Some(match items.as_slice() {
                [x] => x.kind == 0 && x.file_offset == 0 && x.ram_bytes == size && size <= limit,
                _ => false,
            }),
            // Not allowed (no CAP_SYS_ADMIN), or not answered here.
            Err(Errno::PERM | Errno::NOTTY | Errno::OPNOTSUPP | Errno::INVAL) => {
                remember(None);
                None
            }
            Err(_) => None,
        }
    }
}

impl Visitor for Collect {
    fn dir(&self, dir: &DirInfo, st: &cowlink_sys::Stat, fd: BorrowedFd<'_>) {
        if let Some(ix) = &self.indexes {
            // Before any file below is looked at (see `index::DirProof`).
            ix.entering(st.st_dev, fd);
            // An index kept for this filesystem is opened even if the
            // walk meets no file of it: what it holds of files gone is
            // pruned all the same.
            ix.open_if_kept(st.st_dev, fd);
            // (Only where the index is open already: a directory of
            // subdirectories alone opens none, as before.)
            if let Some(fs) = ix.opened(st.st_dev) {
                fs.entered(st.st_ino);
            }
            let mut keys = self.dir_keys.write().unwrap_or_else(|e| e.into_inner());
            if keys.len() <= dir.id {
                keys.resize(dir.id + 1, (0, 0));
            }
            keys[dir.id] = (st.st_dev, st.st_ino);
        }
        lock(&self.files)
            .1
            .dir(dir.id, &dir.path, st.st_dev, st.st_ino);
    }

    fn entry(&self, e: Entry<'_>) -> std::ops::ControlFlow<()> {
        self.take(e);
        std::ops::ControlFlow::Continue(())
    }

    fn error(&self, err: Error) {
        lock(&self.errors).push(err);
    }

    fn unreadable(&self, path: &Path) {
        self.unwalked(path);
    }

    fn skip_dir(&self, root: usize, path: &Path) -> bool {
        let skip = self.excluded(root, path);
        if skip {
            self.unwalked(path);
        }
        skip
    }
}

/// Find groups of identical files under `paths` and how to deduplicate
/// them. Reads files, changes nothing.
///
/// # Errors
/// Only when no path could be walked at all; per-file problems and
/// refused filesystems are listed in [`DedupePlan::errors`].
pub fn plan<P: AsRef<Path>>(paths: &[P], opts: &DedupeOptions) -> Result<DedupePlan> {
    let indexes = opts.index.as_deref().map(|d| Arc::new(Indexes::new(d)));
    let mut plan = find(paths, opts, Compare::Hash, None, indexes.as_ref())?;
    plan.index = indexes.map(|ix| ix.finish());
    Ok(plan)
}

/// Who confirms that the files of a group larger than two edges are
/// identical.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    /// A whole-file BLAKE3, before anything runs: a plan to show or keep.
    Hash,
    /// The kernel, byte for byte, when `FIDEDUPERANGE` runs: the groups
    /// come from the edges alone and a whole-file read is saved. A target
    /// found different is grouped again by hash (`settle`).
    Kernel,
}

/// Plan and execute in one go, as [`plan`] then [`execute()`] would, but with
/// the two overlapping: the groups of small files (at most two edges, read
/// whole with their layout) are final before the larger files are read,
/// and are deduplicated while that goes on. Larger files are grouped on
/// their edges alone ([`DedupeGroup::blake3`] is `None`): the kernel's comparison
/// confirms every byte, and a target it finds different is taken out of
/// its group and grouped again with a whole-file hash
/// ([`DedupeReport::regrouped`]). The returned plan is what was carried
/// out: the groups [`plan`] would give, but for those hashes.
///
/// # Errors
/// As [`plan`]. A cancel, even while planning, is not an error: the report
/// says [`DedupeReport::cancelled`], and the plan holds the groups that
/// were handed to the executor by then (groups already done share their
/// blocks, the rest are untouched).
pub fn dedupe<P: AsRef<Path>>(
    paths: &[P],
    opts: &DedupeOptions,
) -> Result<(DedupePlan, DedupeReport)> {
    let run = &opts.run;
    let tally = execute::Counters::new(run);
    let indexes = opts.index.as_deref().map(|d| Arc::new(Indexes::new(d)));
    let ix = indexes.as_ref();
    let out = std::thread::scope(|s| {
        // Without `keep_groups` the planner waits while a batch is
        // queued, so that only a batch or two of paths is alive.
        let (tx, rx) = match opts.keep_groups {
            true => {
                let (tx, rx) = std::sync::mpsc::channel::<Handed>();
                (Sender::Open(tx), rx)
            }
            false => {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Handed>(1);
                (Sender::Bounded(tx), rx)
            }
        };
        // The executor keeps the groups it was handed (when asked to):
        // after a cancel while planning they are the plan.
        let worker = s.spawn(|| {
            let mut ex = execute::Executor::new(run, &tally);
            ex.sources_only(&opts.stores);
            if let Some(ix) = ix {
                ex.learn_layouts(ix.clone());
            }
            let (mut handed, mut found) = (Vec::new(), 0u64);
            for (batch, (groups, runs)) in rx.into_iter().enumerate() {
                ex.source_runs(runs);
                ex.start(&groups);
                // The groups' own allocations, freed on the executor's
                // threads, stay in their heaps between the learnt layouts
                // growing there: given back every few batches (over
                // 184,092 files on XFS, a first run's peak 3 MiB lower).
                if batch % RELEASE_EVERY == RELEASE_EVERY - 1 {
                    crate::run::release_free_heap();
                }
                found += groups.len() as u64;
                if opts.keep_groups {
                    handed.extend(groups);
                }
            }
            (ex, handed, found)
        });
        // The groups go to the executor, not copied: what the Dedupe
        // phase will count is added up on the way.
        let (mut files, mut bytes) = (0, 0);
        let planned = find(
            paths,
            opts,
            Compare::Kernel,
            Some(&mut |groups: Vec<DedupeGroup>, runs| {
                let (f, b) = execute::totals(&groups);
                (files, bytes) = (files + f, bytes + b);
                tx.send((groups, runs));
            }),
            ix,
        );
        if planned.is_ok() {
            tally.show(files, bytes);
        }
        drop(tx);
        let (mut ex, handed, found) = worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        match planned {
            Ok(mut plan) => {
                plan.groups = handed;
                stages::order(&mut plan.groups);
                settle(&mut plan, opts, &mut ex, ix);
                // Files taken as already shared and found not to, shared
                // by the run: among the targets deduplicated instead.
                plan.files_already_shared =
                    plan.files_already_shared.saturating_sub(ex.mates_shared());
                // The files shared now hold other blocks: their layouts,
                // as the executor learnt them, so the next run sees them
                // shared and reads neither (handed to the index at the
                // end, see `end_together`).
                let layouts = ex.take_layouts();
                Ok((plan, ex, layouts))
            }
            Err(e) if e.kind() == ErrorKind::Cancelled => {
                // What was shared before the cancel, as it is now.
                let layouts = ex.take_layouts();
                let plan = DedupePlan {
                    // Counted as handed over: none are kept without
                    // `keep_groups`.
                    groups_found: found,
                    groups: handed,
                    ..DedupePlan::default()
                };
                Ok((plan, ex, layouts))
            }
            Err(e) => Err(e),
        }
    });
    // The space in use measured at the end, and the layouts learnt while
    // sharing written (see `Indexes::finish`): the report counts them.
    match (out, indexes) {
        (Ok((mut plan, ex, layouts)), Some(ix)) => {
            let (report, index) = end_together(ex, ix, layouts);
            plan.index = Some(index);
            Ok((plan, report))
        }
        (Ok((plan, ex, _)), None) => Ok((plan, ex.finish())),
        (Err(e), ix) => {
            if let Some(ix) = ix {
                ix.finish();
            }
            Err(e)
        }
    }
}

/// End a run: the executor's last measure of the space in use
/// ([`execute::Executor::finish`], a `syncfs` of each filesystem shared
/// on: on Btrfs, the commit that frees what was shared, 0.5-1 s after a
/// first run over 184,092 files), beside the layouts learnt while
/// sharing (`layouts`: handed to the index, and their sources mapped
/// again, [`execute::Layouts::split`], which only reads) and the
/// indexes' last write ([`Indexes::finish_checked`], and on a first run
/// the index's rewrite, beside the sources' map). The write runs beside the
/// measure too where the index is kept on none of the filesystems
/// measured (its writes would count as space in use there), else after
/// it.
fn end_together(
    ex: execute::Executor<'_>,
    ix: Arc<Indexes>,
    layouts: Option<execute::Layouts>,
) -> (DedupeReport, IndexReport) {
    let beside = !ex.measures(ix.dir());
    std::thread::scope(|s| {
        let learnt = s.spawn(move || {
            let check = layouts.map(|l| {
                let recheck = l.split();
                let mapped = s.spawn(move || recheck.run());
                Box::new(move || {
                    mapped
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p))
                }) as index::NotFound<'_>
            });
            match beside {
                true => Ok(ix.finish_checked(check)),
                false => Err((ix, check)),
            }
        });
        let report = ex.finish();
        match learnt
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        {
            Ok(index) => (report, index),
            Err((ix, check)) => (report, ix.finish_checked(check)),
        }
    })
}

/// A batch of groups handed to the executor, with its sources' runs.
type Handed = (Vec<DedupeGroup>, stages::SourceRuns);

/// The planner's end of the channel to the executor: unbounded when the
/// groups are kept anyway, else bounded (see
/// [`DedupeOptions::keep_groups`]).
enum Sender {
    Open(std::sync::mpsc::Sender<Handed>),
    Bounded(std::sync::mpsc::SyncSender<Handed>),
}

impl Sender {
    /// Hand `batch` over (an executor gone has panicked: the panic is
    /// resumed where it is joined).
    fn send(&self, batch: Handed) {
        let _ = match self {
            Sender::Open(tx) => tx.send(batch),
            Sender::Bounded(tx) => tx.send(batch),
        };
    }
}

/// Targets of edge-only groups that the kernel found different from their
/// source: take them out of their groups in `plan` (with the bytes they
/// were expected to give back), plan them again with their sources and
/// whole-file hashes, and carry out what is identical after all. After a
/// cancel they are only taken out.
///
/// The bytes a target was expected to give back are read again from its
/// extent map: the kernel shared nothing of it, and a target is in one
/// group only, so the map is the one the plan read (unless something else
/// wrote to it since). Such targets are rare; keeping every larger
/// target's path and bytes in a map for them held a copy of those paths
/// through the whole run.
fn settle(
    plan: &mut DedupePlan,
    opts: &DedupeOptions,
    ex: &mut execute::Executor<'_>,
    ix: Option<&Arc<Indexes>>,
) {
    let unsettled = ex.take_unsettled();
    if unsettled.is_empty() {
        return;
    }
    let out: std::collections::HashSet<(&Path, &Path)> = unsettled
        .iter()
        .map(|(s, t)| (s.as_path(), t.as_path()))
        .collect();
    for g in plan.groups.iter_mut().filter(|g| g.blake3.is_none()) {
        let (source, mut lost) = (g.source.clone(), 0u64);
        g.retain_targets(|t| {
            let gone = out.contains(&(source.as_path(), t));
            if gone {
                lost = lost.saturating_add(exclusive_bytes(t));
            }
            !gone
        });
        g.reclaimable = g.reclaimable.saturating_sub(lost);
    }
    let before = plan.groups.len();
    plan.groups.retain(|g| !g.targets.is_empty());
    // Without the groups, the executor tells which lost every target.
    plan.groups_found -= match opts.keep_groups {
        true => (before - plan.groups.len()) as u64,
        false => ex.groups_emptied(&unsettled),
    };
    if opts.run.cancelled() {
        return;
    }
    if let Some(second) = regroup(&unsettled, opts, ix) {
        ex.regrouping();
        ex.start(&second.groups);
        plan.bytes_hashed += second.bytes_hashed;
        plan.groups_found += second.groups_found;
        if opts.keep_groups {
            plan.groups.extend(second.groups);
            stages::order(&mut plan.groups);
        }
        plan.errors.extend(second.errors);
    }
}

/// The plan, with whole-file hashes, of the sources and targets of
/// `unsettled` (pairs the kernel found different), planned quietly (no
/// progress of its own). `None` when it could not be made (cancelled).
///
/// With the run's indexes `ix`, the whole-file hashes are recorded, so
/// the next run splits such a pair by them instead of asking the kernel
/// again.
fn regroup(
    unsettled: &[(PathBuf, PathBuf)],
    opts: &DedupeOptions,
    ix: Option<&Arc<Indexes>>,
) -> Option<DedupePlan> {
    // A store object is no candidate here: planned as a plain path it
    // could become a target. Without it the targets it differs from are
    // grouped among themselves.
    let objects: Vec<PathBuf> = opts.stores.iter().map(|s| s.join("objects")).collect();
    let mut paths: Vec<&Path> = unsettled
        .iter()
        .flat_map(|(s, t)| [s.as_path(), t.as_path()])
        .filter(|p| !objects.iter().any(|o| p.starts_with(o)))
        .collect();
    paths.sort();
    paths.dedup();
    if paths.len() < 2 {
        return None;
    }
    let quiet = DedupeOptions {
        min_size: opts.min_size,
        stores: Vec::new(),
        exclude: opts.exclude.clone(),
        run: Run {
            progress: None,
            ..opts.run.clone()
        },
        index: None,
        layout_recheck: opts.layout_recheck,
        keep_groups: true,
    };
    find(&paths, &quiet, Compare::Hash, None, ix).ok()
}

/// The bytes of `path` in extents no other file shares (0 if its map
/// cannot be read).
fn exclusive_bytes(path: &Path) -> u64 {
    let Ok(fd) = open_read(path) else { return 0 };
    let Ok(list) = extents_fd(fd.as_fd(), false) else {
        return 0;
    };
    let mut c = Cand::default();
    layout_facts(&list, &mut c);
    c.exclusive
}

/// [`plan`]; with `hand_over`, final groups are given to it in batches of
/// [`HAND_OVER_BATCH`] sets as soon as they are known (the small files'
/// groups, then the rest; see [`build_groups`]) and not kept: the plan returned has no groups, and the receiver holds the
/// only copy (over 223,547 files, the copy the executor was sent took a
/// whole run's peak from 175 to 143 MB). Each batch comes with its
/// sources' runs where known ([`stages::SourceRuns`]).
fn find<P: AsRef<Path>>(
    paths: &[P],
    opts: &DedupeOptions,
    compare: Compare,
    mut hand_over: Option<&mut dyn FnMut(Vec<DedupeGroup>, stages::SourceRuns)>,
    indexes: Option<&Arc<Indexes>>,
) -> Result<DedupePlan> {
    let (roots, fixed_from, refused) = walk_roots(paths, &opts.stores)?;
    let run = &opts.run;
    let cancelled = || Error::new(Operation::Dedupe, ErrorKind::Cancelled);
    run.enter(Phase::Scan, 0, 0);
    let c = Collect {
        min_size: opts.min_size,
        exclude: opts.exclude.clone(),
        roots: roots.clone(),
        euid: rustix::process::geteuid().as_raw(),
        fixed_from,
        indexes: indexes.cloned(),
        // Only a run as root knows files by transaction (see `dir_proof`).
        mount_dirs: (indexes.is_some() && rustix::process::geteuid().is_root())
            .then(|| mount_dirs(&roots))
            .flatten(),
        recheck: opts.layout_recheck,
        salt: std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::process::id(),
        ),
        ..Default::default()
    };
    walk::walk(&roots, run, Operation::Dedupe, &c);
    if run.cancelled() {
        return Err(cancelled());
    }
    let (files, mut names, mut times) = c.files.into_inner().unwrap_or_else(|e| e.into_inner());
    names.shrink();
    let SetAside {
        files: mut inline,
        shortest: inline_names,
        indexed: inline_seen,
        kept,
    } = c.inline.into_inner().unwrap_or_else(|e| e.into_inner());
    let walked = c.errors.into_inner().unwrap_or_else(|e| e.into_inner());
    // How the index records the walk's paths, and what it must keep.
    let spelled = Spelled::new(&roots);
    // Sorted, once each (a directory whose files cannot be examined is
    // named once per file).
    let mut unwalked: Vec<Vec<u8>> = (c.unwalked.into_inner())
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|p| spelled.record_path(p).into_owned())
        .collect();
    unwalked.sort_unstable();
    unwalked.dedup();
    let files_scanned = (files.len() + inline.len()) as u64 + c.below_min.into_inner();
    let nothing_walked = walked.len() >= roots.len();
    let mut errors = refused;
    errors.extend(walked);
    if files_scanned == 0 && !errors.is_empty() && nothing_walked {
        // Nothing could be walked: the (first) path's own error.
        return Err(errors.swap_remove(0));
    }
    let mut plan = DedupePlan {
        files_scanned,
        ..Default::default()
    };

    // Filesystems: refuse network clients and those that cannot dedupe.
    // Asked once per device, of its shortest path's directory (a deep one
    // may not fit PATH_MAX, which the probe needs: then of an ancestor,
    // `probe_dir`).
    // (The walk's candidates first, as they win a tie: one path built
    // per device, `Names::shortest_per_device`.)
    let mut files = files;
    let mut devices = names.shortest_per_device(files.iter().map(|c| (c.dev, c.name)));
    let shorter =
        |kept: Option<&PathBuf>, len: usize| kept.is_none_or(|p| len < p.as_os_str().len());
    for (dev, path) in inline_names {
        if shorter(devices.get(&dev), path.as_os_str().len()) {
            devices.insert(dev, path);
        }
    }
    let mut allowed: HashMap<u64, bool> = HashMap::new();
    // Btrfs subvolumes of one filesystem (by its UUID): the lowest device
    // number among them, per device.
    let mut btrfs: HashMap<[u8; 16], u64> = HashMap::new();
    let mut same_fs: HashMap<u64, u64> = HashMap::new();
    let mut devices: Vec<(u64, PathBuf)> = devices.into_iter().collect();
    devices.sort();
    for (dev, path) in devices {
        let ok = match can_dedupe(&probe_dir(&path, dev)) {
            Ok(()) => {
                if let Ok(id) = open_read(&path).and_then(|fd| cowlink_sys::btrfs_fsid(fd.as_fd()))
                {
                    same_fs.insert(dev, *btrfs.entry(id).or_insert(dev));
                }
                true
            }
            Err(e) => {
                errors.push(e);
                false
            }
        };
        allowed.insert(dev, ok);
    }
    if !times.is_empty() {
        let mut keep = files.iter().map(|c| allowed[&c.dev]);
        times.retain(|_| keep.next().unwrap_or(false));
    }
    files.retain(|c| allowed[&c.dev]);
    inline.retain(|i| allowed[&i.dev]);
    if let Some(ix) = indexes {
        // What the walk learnt (small files were read whole there), every
        // name of each file, before the names beyond one per inode and
        // the files without a partner are dropped.
        // (A filesystem without a candidate: refused by none, and its
        // index, if open, kept from an earlier run that was allowed.)
        record_walk(
            ix,
            (&files, &times, &inline_seen, &kept, &names),
            (&spelled, &unwalked),
            |dev| {
                allowed
                    .get(&dev)
                    .copied()
                    .unwrap_or_else(|| ix.opened(dev).is_some())
            },
        );
    }
    drop((inline_seen, kept, times));
    crate::run::release_free_heap();

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(run.threads_or(crate::run::cores))
        .build()
        .map_err(|e| Error::new(Operation::Dedupe, ErrorKind::Io).with_reason(e.to_string()))?;
    // One inode is one file: keep the name that sorts first.
    plan.hardlinks_skipped = pool.install(|| stages::one_per_inode(&mut files, &names));
    // The directories met, as (device, inode), for pruning the index's
    // records of those gone.
    let seen: Option<HashSet<(u64, u64)>> =
        indexes.map(|_| names.dirs().map(|(id, _)| id).collect());

    let inline = stages::count_inline(inline, &files);
    // Each Btrfs subvolume has a device number of its own, but they are
    // one filesystem and FIDEDUPERANGE shares blocks between them: from
    // here on their files are grouped as one device (inodes were told
    // apart above, by their own device; the inline count stays per
    // subvolume, it only reports).
    for c in &mut files {
        if let Some(&d) = same_fs.get(&c.dev) {
            c.dev = d;
        }
    }
    plan.hardlinks_skipped += inline.hardlinks;
    plan.candidates = files.len() as u64 + inline.inodes;
    pool.install(|| stages::by_size(&mut files));
    // The layout tells already-shared files apart without reading them.
    // Only larger files with a same-size partner are mapped here (small
    // ones were, in the walk); a failure only costs the shortcut.
    // The layouts read here go to the index with what hashing learns
    // (`learnt`), at the end of planning.
    // A file written or replaced since the walk saw it is dropped (with
    // an error saying so): what was read is not of the file the walk saw.
    let layouts: Vec<Update> = pool.install(|| {
        files
            .par_iter_mut()
            .filter_map(|c| {
                if run.cancelled() || c.mapped {
                    return None;
                }
                let fd = open_read(&names.path(c.name)).ok()?;
                if !read_layout(fd.as_fd(), c) {
                    c.changed = true;
                    return None;
                }
                let (dev, dir) = names.dir_key(c.name)?;
                (indexes.is_some() && c.mapped).then_some(Update {
                    dev,
                    dir,
                    ino: c.ino,
                    stamp: c.stamp,
                    what: Learnt::Layout {
                        exclusive: c.exclusive,
                        shared: c.shared.map(NonZeroU64::get),
                        inline: c.inline,
                        hash: c.hash,
                    },
                })
            })
            .collect()
    });
    if files.iter().any(|c| c.changed) {
        errors.extend(
            files
                .iter()
                .filter(|c| c.changed)
                .map(|c| changed_while_read(&names.path(c.name))),
        );
        files.retain(|c| !c.changed);
    }
    let mut learnt = indexes.map(|_| layouts);
    // Inline data has no blocks to share: report, never claim.
    let (inline_dropped, size_groups) = stages::drop_inline(&mut files);
    plan.inline_skipped = inline.partnered + inline_dropped;
    let mut cl = stages::clusters(files, &size_groups, &names);
    crate::run::release_free_heap();
    drop(size_groups);
    plan.groups_already_shared = cl.groups_already_shared;
    plan.files_already_shared = cl.files_already_shared;

    if run.cancelled() {
        return Err(cancelled());
    }
    let hashed = AtomicU64::new(0);
    let total: u64 = cl
        .groups
        .iter()
        .flat_map(|g| g.range())
        .map(|id| cl.rep(id).size)
        .sum();
    run.enter(Phase::Hash, 0, total);
    let count = |n: u64| {
        hashed.fetch_add(n, Ordering::Relaxed);
        run.done(0, n);
    };
    // Groups of small files whose every cluster was read whole with its
    // layout are final already: hand them over before hashing the rest.
    let (small, rest): (Vec<Span>, Vec<Span>) =
        std::mem::take(&mut cl.groups).into_iter().partition(|g| {
            g.range().all(|id| {
                let c = cl.rep(id);
                c.size <= 2 * EDGE && c.hash.is_some()
            })
        });
    count(
        small
            .iter()
            .flat_map(|g| g.range())
            .map(|id| cl.rep(id))
            .filter(|c| !c.known)
            .map(|c| c.size)
            .sum(),
    );
    let sets = stages::split_by(&mut cl, &small);
    let mut groups = Vec::new();
    build_groups(
        run,
        &mut cl,
        &sets,
        &names,
        false,
        &mut hand_over,
        &mut groups,
        &mut plan,
    );

    let hash_errors = Mutex::new(Vec::new());
    // Hash the representatives of clusters `ids` (`edges`: a larger file's
    // two ends only) and record it on them; a failure leaves no hash. With
    // `edges`, one hashed already (whole during the walk, or its edges with
    // its layout) is counted, not read; without, one whose whole hash the
    // index holds is not read. Hashes read go to the index (`learnt`), for
    // every member of the cluster: the members were mapped on the
    // representative's blocks under the identities the walk saw, so the
    // bytes are theirs, but only if the representative was still the file
    // the walk saw when read (`hash_file` checks: a representative
    // rewritten in place after it was mapped would give its clones the
    // hash of bytes they never held, kept under their unchanged
    // identities, run after run).
    let mut hash_reps = |cl: &mut stages::Clusters, ids: &[usize], edges: bool| {
        let got: Vec<(usize, Option<[u8; 32]>, bool)> = pool.install(|| {
            ids.par_iter()
                .filter_map(|&id| {
                    if run.cancelled() {
                        return None;
                    }
                    let c = cl.rep(id);
                    if edges && c.hash.is_some() {
                        if !c.known {
                            count(c.size.min(2 * EDGE));
                        }
                        return None;
                    }
                    if let (false, Some(w)) = (edges, &c.whole) {
                        return Some((id, Some(**w), false));
                    }
                    let h = hash_file(&names.path(c.name), c.size, c.stamp, edges, &count)
                        .map_err(|e| lock(&hash_errors).push(e))
                        .ok();
                    Some((id, h, true))
                })
                .collect()
        });
        for (id, h, read) in got {
            let whole = !edges && cl.rep(id).size > 2 * EDGE;
            if let (Some(p), Some(h), true) = (learnt.as_mut(), h, read) {
                let l = if whole {
                    Learnt::Whole(h)
                } else {
                    Learnt::Hash(h)
                };
                for m in &cl.files[cl.clusters[id].range()] {
                    // By the directory's own device: a Btrfs subvolume's
                    // files were grouped under another's device number.
                    // A file given as a root (the regrouping of files the
                    // kernel found different) is recorded too: its whole
                    // hash is what spares the next run asking again.
                    let key = names
                        .dir_key(m.name)
                        .or_else(|| names.root_dir_key(m.name, m.ino));
                    if let Some((dev, dir)) = key {
                        p.push(Update {
                            dev,
                            dir,
                            ino: m.ino,
                            stamp: m.stamp,
                            what: l,
                        });
                    }
                }
            }
            let rep = cl.rep_mut(id);
            rep.hash = h;
            if whole {
                rep.whole = h.map(Box::new);
            }
        }
    };
    let ids: Vec<usize> = rest.iter().flat_map(|g| g.range()).collect();
    hash_reps(&mut cl, &ids, true);

    let mut sets = stages::split_by(&mut cl, &rest);
    drop((ids, rest));
    if compare == Compare::Hash {
        // Whole-file hashes where the edges matched (a file of two edges
        // or less was read whole already).
        let ids: Vec<usize> = sets
            .iter()
            .flat_map(|s| s.range())
            .filter(|&id| cl.rep(id).size > 2 * EDGE)
            .collect();
        hash_reps(&mut cl, &ids, false);
        sets = stages::split_by(&mut cl, &sets);
    } else {
        // Sets where the index knows a whole-file hash: files whose ends
        // match but not their middle were found so by an earlier run. Hash
        // the others there whole too and split by it, rather than ask the
        // kernel again (it would read both files to find them different).
        let (mixed, plain): (Vec<Span>, Vec<Span>) = sets
            .into_iter()
            .partition(|s| s.range().any(|id| cl.rep(id).whole.is_some()));
        if !mixed.is_empty() {
            let ids: Vec<usize> = mixed
                .iter()
                .flat_map(|s| s.range())
                .filter(|&id| cl.rep(id).size > 2 * EDGE)
                .collect();
            hash_reps(&mut cl, &ids, false);
        }
        sets = plain;
        sets.extend(stages::split_by(&mut cl, &mixed));
    }
    // The reading is over: the pool's read buffers go before the groups'
    // paths are built.
    pool.broadcast(|_| crate::ground::hash::release_buffer());
    drop(pool);
    crate::run::release_free_heap();

    if run.cancelled() {
        return Err(cancelled());
    }
    errors.extend(hash_errors.into_inner().unwrap_or_else(|e| e.into_inner()));
    plan.bytes_hashed = hashed.load(Ordering::Relaxed);

    // Only edges were hashed for the larger files with `Compare::Kernel`:
    // the kernel compares.
    let kernel = compare == Compare::Kernel;
    build_groups(
        run,
        &mut cl,
        &sets,
        &names,
        kernel,
        &mut hand_over,
        &mut groups,
        &mut plan,
    );
    drop((cl, names));
    if let Some(ix) = indexes {
        // The layouts and hashes learnt, and the records of directories
        // gone pruned: once the clusters and names are gone (beside them,
        // this update would be a first run's peak), while the executor
        // shares.
        let abs = spelled.recorded_roots();
        let seen = seen.as_ref().map(|dirs| index::Seen {
            dirs,
            roots: &abs,
            kept: &unwalked,
        });
        ix.update(learnt.unwrap_or_default(), seen);
    }
    stages::order(&mut groups);
    plan.groups = groups;
    errors.sort_by(|a, b| (a.src(), a.to_string()).cmp(&(b.src(), b.to_string())));
    plan.errors = errors;
    Ok(plan)
}

/// Groups handed to the executor at a time (see
/// [`DedupeOptions::keep_groups`]): a batch's paths are a few megabytes.
const HAND_OVER_BATCH: usize = 2048;

/// How many batches of groups the executor carries out between two
/// releases of free heap ([`crate::run::release_free_heap`]).
const RELEASE_EVERY: usize = 8;

/// Build the groups of `sets` ([`stages::groups`]) and hand them over
/// with `hand_over` in batches of [`HAND_OVER_BATCH`] sets, or keep them
/// in `groups` without one. `kernel`: the larger files' blake3 (of their
/// edges only) is dropped, the kernel compares them. Counts what they
/// count in `plan`. Stops after the batch during which `run` is
/// cancelled (the groups not handed over were never started).
#[allow(clippy::too_many_arguments)] // the planner's state, passed as is
fn build_groups(
    run: &Run,
    cl: &mut stages::Clusters,
    sets: &[Span],
    names: &stages::Names,
    kernel: bool,
    hand_over: &mut Option<&mut dyn FnMut(Vec<DedupeGroup>, stages::SourceRuns)>,
    groups: &mut Vec<DedupeGroup>,
    plan: &mut DedupePlan,
) {
    let step = match hand_over {
        Some(_) => HAND_OVER_BATCH,
        None => sets.len().max(1),
    };
    // At least one call, empty or not: it counts the members left out
    // of every set since the last ([`stages::Clusters::left_shared`]).
    let mut rest = sets;
    loop {
        let (now, later) = rest.split_at(step.min(rest.len()));
        let (mut got, already, not_permitted, runs) = stages::groups(cl, now, names);
        plan.files_already_shared += already;
        plan.not_permitted += not_permitted;
        plan.groups_found += got.len() as u64;
        if kernel {
            for g in got.iter_mut().filter(|g| g.size > 2 * EDGE) {
                g.blake3 = None;
            }
        }
        match hand_over {
            Some(give) => give(got, runs),
            None => groups.extend(got),
        }
        if later.is_empty() || run.cancelled() {
            break;
        }
        rest = later;
    }
}

/// How the index records the walk's directories: by absolute path, each
/// below its root's real path (every link and `..` resolved), so that a
/// tree walked through a link, or with `..` in its root, is recorded (and
/// pruned) as the same tree walked by its own path. The walk's own paths,
/// which a plan and a report show, are the user's.
struct Spelled {
    /// Each root as walked, and its real path.
    roots: Vec<(PathBuf, PathBuf)>,
    /// Every root's real path is its absolute one: nothing to translate.
    plain: bool,
}

impl Spelled {
    fn new(roots: &[PathBuf]) -> Spelled {
        let roots: Vec<(PathBuf, PathBuf)> = roots
            .iter()
            .map(|r| {
                let real = std::fs::canonicalize(r).unwrap_or_else(|_| index::absolute(r));
                (r.clone(), real)
            })
            .collect();
        let plain = roots
            .iter()
            .all(|(r, real)| index::absolute_bytes(r).as_ref() == real.as_os_str().as_bytes());
        Spelled { roots, plain }
    }

    /// The path the index records for `path`, a path of the walk: below
    /// the root it starts with (the longest), that root's real path.
    fn record_path<'a>(&self, path: &'a Path) -> std::borrow::Cow<'a, [u8]> {
        if self.plain {
            return index::absolute_bytes(path);
        }
        let below = (self.roots.iter())
            .filter_map(|(r, real)| Some((r, real, path.strip_prefix(r).ok()?)))
            .max_by_key(|(r, _, _)| r.components().count());
        match below {
            Some((_, real, rest)) if rest.as_os_str().is_empty() => {
                std::borrow::Cow::Owned(real.as_os_str().as_bytes().to_vec())
            }
            Some((_, real, rest)) => {
                std::borrow::Cow::Owned(real.join(rest).as_os_str().as_bytes().to_vec())
            }
            None => index::absolute_bytes(path),
        }
    }

    /// The roots as the index records them.
    fn recorded_roots(&self) -> Vec<PathBuf> {
        self.roots.iter().map(|(_, real)| real.clone()).collect()
    }
}

/// Write each walked directory's record, rebuilt from the candidates met
/// in it (`files`), one filesystem at a time, on the devices `allowed` (a
/// refused filesystem's index is left alone).
///
/// A directory whose every candidate the index held exactly as it is
/// now, as many as its record holds, under the same path, would be
/// rebuilt into the record stored: it is skipped without being built
/// (what an unchanged rerun meets everywhere; building and checking every
/// record was a tenth of such a rerun over 154,608 files). The others'
/// candidates are put in order by their places, not moved (a candidate is
/// 120 bytes, and its times 24 more).
fn record_walk(
    ix: &Indexes,
    // (`times`: of each of `files`, by the same place; `kept`: entries
    // of files left out, by the walk's id of their directory.)
    (files, times, inline, kept, names): (&[Cand], &[Times], &[InlineSeen], &[Kept], &Names),
    // (`unwalked`: sorted, as recorded.)
    (spelled, unwalked): (&Spelled, &[Vec<u8>]),
    allowed: impl Fn(u64) -> bool,
) {
    ix.walked();
    // (A directory without a candidate of its own is rebuilt unless its
    // record is stored empty, under its path: its record was looked up
    // when the walk entered it.)
    let mut met: Vec<((u64, u64), &Path, stages::Met)> = names
        .dirs_met()
        .filter(|((dev, _), _, _)| allowed(*dev))
        .collect();
    // One directory met under several paths (overlapping roots, a bind
    // mount inside the tree): recorded under the least of them, the same
    // in every run (one path, then another, was a record written again
    // by every rerun).
    met.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    let mut dirs: Vec<((u64, u64), &Path, bool)> = Vec::new();
    for same in met.chunk_by(|a, b| a.0 == b.0) {
        let ((dev, ino), path, _) = same[0];
        let recorded = spelled.record_path(path);
        let rebuilt = (same.iter())
            .any(|&(_, _, m)| m.names != m.known || !ix.stored_as(dev, ino, m, &recorded));
        // A directory not walked whole is left as stored.
        let partly = !unwalked.is_empty()
            && (same.iter()).any(|(_, p, _)| {
                let p = spelled.record_path(p);
                unwalked.binary_search_by(|u| u.as_slice().cmp(&p)).is_ok()
            });
        if rebuilt && !partly {
            let any = same.iter().any(|(_, _, m)| m.names > 0);
            dirs.push(((dev, ino), path, any));
        }
    }
    drop(met);
    ix.forget_stored();
    if dirs.is_empty() {
        return;
    }
    // The candidates of those directories, by directory and inode (none
    // to look for where no directory chosen met any: an unchanged rerun
    // rebuilds only those without candidates, and the scan of every
    // candidate cost it 4-6 ms over 148,716 files). Places, grouped by a
    // counting sort on each directory's slot: 4 bytes a candidate, where
    // a sorted list of (device, directory, inode, place) took 32, at a
    // first run's peak.
    let slots: HashMap<(u64, u64), u32> = dirs
        .iter()
        .filter(|(_, _, any)| *any)
        .enumerate()
        .map(|(slot, (id, _, _))| (*id, slot as u32))
        .collect();
    // (A place past the candidates is an inline file's.)
    let (cands, inl): (&[Cand], &[InlineSeen]) = match slots.is_empty() {
        true => (&[], &[]),
        false => (files, inline),
    };
    let slot_of: Vec<u32> = (cands.iter().map(|c| names.dir_key(c.name)))
        .chain(inl.iter().map(|s| names.dir_key_of(s.dir)))
        .map(|key| key.and_then(|k| slots.get(&k).copied()).unwrap_or(u32::MAX))
        .collect();
    let mut start = vec![0usize; slots.len() + 1];
    for &s in slot_of.iter().filter(|&&s| s != u32::MAX) {
        start[s as usize + 1] += 1;
    }
    for i in 1..start.len() {
        start[i] += start[i - 1];
    }
    let mut order = vec![0u32; start[slots.len()]];
    let mut next = start.clone();
    for (i, &s) in slot_of.iter().enumerate().filter(|&(_, &s)| s != u32::MAX) {
        order[next[s as usize]] = i as u32;
        next[s as usize] += 1;
    }
    drop((slot_of, next));
    let ino_of = |i: u32| match files.get(i as usize) {
        Some(c) => c.ino,
        None => inline[i as usize - files.len()].ino,
    };
    // By inode, then place (of two names of one inode, the first met).
    for w in start.windows(2) {
        order[w[0]..w[1]].sort_unstable_by_key(|&i| (ino_of(i), i));
    }
    // The entries kept of files left out, by directory.
    let mut kept_in: HashMap<(u64, u64), Vec<(u64, IndexEntry)>> = HashMap::new();
    for (dir, ino, entry) in kept {
        if let Some(key) = names.dir_key_of(*dir).filter(|k| slots.contains_key(k)) {
            kept_in.entry(key).or_default().push((*ino, entry.clone()));
        }
    }
    // Written per device in the index's order (`Indexes::write_order`).
    let write_order: HashMap<u64, fn(u64) -> u64> = dirs
        .iter()
        .map(|((dev, _), _, _)| (*dev, ix.write_order(*dev)))
        .collect();
    dirs.sort_unstable_by_key(|((dev, ino), _, _)| (*dev, write_order[dev](*ino)));
    for one in dirs.chunk_by(|a, b| a.0 .0 == b.0 .0) {
        let dev = one[0].0 .0;
        // Asked before `put_dirs` takes the index's state.
        let since: HashMap<u64, u64> = ix.opened(dev).map_or_else(HashMap::new, |o| {
            one.iter()
                .map(|((_, dir), _, _)| (*dir, o.since_for(*dir)))
                .collect()
        });
        let recs = one.iter().map(|&(key, path, _)| {
            let placed = match slots.get(&key) {
                Some(&s) => &order[start[s as usize]..start[s as usize + 1]],
                None => &[],
            };
            let mut entries: Vec<(u64, IndexEntry)> = placed
                .iter()
                .filter_map(|&i| match files.get(i as usize) {
                    Some(c) => (c.dev == key.0).then(|| (c.ino, entry_of(c, &times[i as usize]))),
                    None => {
                        let s = &inline[i as usize - files.len()];
                        Some((s.ino, inline_entry(s)))
                    }
                })
                .collect();
            if let Some(k) = kept_in.remove(&key) {
                // After the walk's: a stable sort keeps them second.
                entries.extend(k);
                entries.sort_by_key(|(ino, _)| *ino);
            }
            // Two names of one inode in one directory: one entry.
            entries.dedup_by_key(|(ino, _)| *ino);
            let rec = Record {
                path: spelled.record_path(path).into_owned(),
                since: since.get(&key.1).copied().unwrap_or(0),
                files: entries,
            };
            (key.1, rec)
        });
        ix.put_dirs(dev, recs);
    }
}

/// What candidate `c` tells the index: its identity as the walk saw it,
/// and what is known of it (from the index, or read this run).
fn entry_of(c: &Cand, times: &Times) -> IndexEntry {
    let id = cowlink_sys::FileId {
        dev: c.dev,
        ino: c.ino,
        size: c.size,
        mtime_ns: times.mtime_ns,
        ctime_ns: times.ctime_ns,
        btime_ns: times.btime_ns(),
        ..Default::default()
    };
    let mut e = IndexEntry::of(&id);
    e.hash = c.hash;
    e.whole = c.whole.as_deref().copied();
    if c.mapped {
        e.mapped = true;
        e.exclusive = c.exclusive;
        e.shared = c.shared.map(NonZeroU64::get);
        e.inline = c.inline;
    }
    e
}

/// What the index keeps of an inline file: its identity, and that it is
/// inline (no blocks to share).
fn inline_entry(s: &InlineSeen) -> IndexEntry {
    IndexEntry {
        inline: true,
        mapped: true,
        exclusive: 0,
        ..IndexEntry::of(&cowlink_sys::FileId {
            ino: s.ino,
            size: s.size,
            mtime_ns: s.times.mtime_ns,
            ctime_ns: s.times.ctime_ns,
            btime_ns: s.times.btime_ns(),
            ..Default::default()
        })
    }
}

/// Open for reading without touching the access time where allowed.
/// Paths deeper than PATH_MAX are opened in pieces.
pub(super) fn open_read(path: &Path) -> rustix::io::Result<OwnedFd> {
    match open_deep(path, READ | cowlink_sys::O_NOATIME) {
        Err(Errno::PERM) => open_deep(path, READ),
        other => other,
    }
}

/// How files are opened to be read: never through a symbolic link, never
/// waiting on a FIFO swapped in.
const READ: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

/// [`open_read`] of `name` in the directory `dirfd`.
fn open_read_at(dirfd: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
    match fs::openat(
        dirfd,
        name,
        READ | cowlink_sys::O_NOATIME,
        fs::Mode::empty(),
    ) {
        Err(Errno::PERM) => fs::openat(dirfd, name, READ, fs::Mode::empty()),
        other => other,
    }
}

/// Read a candidate's layout (shared runs, exclusive bytes, inline) from
/// its extents, and, while the file is open, hash what the plan will need
/// of it: a small file whole, a larger one not sharing all its blocks at
/// its edges (a file that does may be skipped unread). So each small file
/// is opened once for the whole plan, and each larger one once less. A
/// failure only costs the shortcut.
///
/// The map is taken with the file's dirty pages written back first
/// (`FIEMAP_FLAG_SYNC`): a file overwritten in place and not yet synced
/// still maps its old blocks on disk, which a copy-on-write filesystem
/// replaces when the pages are written (Btrfs always, XFS where they are
/// shared). Mapped without, such a file sharing a clone's blocks was
/// clustered with the clone (one read for both, the clone's duplicates
/// left apart run after run), and a source's runs handed to the executor
/// were not the ones its targets took. Sharing writes the pages back
/// anyway; a clean file costs the kernel one look at its page tags.
///
/// Returns whether what was read is of the file the walk saw
/// ([`still_walked`] after the reading); when not, nothing read is kept
/// and the caller drops the candidate. The walk's identity is what the
/// index keeps these facts under: a file written or replaced between
/// the walk and this read would otherwise have its new layout and bytes
/// claimed for an identity that never held them.
fn read_layout(fd: BorrowedFd<'_>, c: &mut Cand) -> bool {
    c.mapped = true;
    if let Ok(list) = extents_fd(fd, true) {
        c.exclusive = 0;
        layout_facts(&list, c);
    }
    if !c.inline && c.shared.is_none() {
        if c.size <= 2 * EDGE {
            if let Ok((h, n)) = crate::ground::hash::hash_fd(fd, c.size, &|_| {}) {
                if n == c.size {
                    c.hash = Some(h);
                }
            }
        } else {
            c.hash = hash_edges(fd, c.size).ok().flatten();
        }
    }
    if still_walked(fd, c.stamp) {
        return true;
    }
    c.hash = None;
    c.shared = None;
    c.inline = false;
    c.runs = 0;
    false
}

/// Whether the file open as `fd` is still the one the walk saw, as
/// `stamp` (its identity: device, inode, size, times), after something
/// was read from it. A file's identity only moves forward (any write,
/// truncation or clone moves its ctime, which no caller can set back,
/// and a replacement is another inode), so the same identity after a
/// read means the same identity throughout, since the walk: what was
/// read is of the file the walk saw, and may be kept under its
/// identity.
fn still_walked(fd: BorrowedFd<'_>, stamp: FileStamp) -> bool {
    cowlink_sys::file_id(fd).is_ok_and(|id| FileStamp::of(&id) == stamp)
}

/// BLAKE3 of the first and last [`EDGE`] bytes of a file of `size` (more
/// than both edges); `None` if it ends sooner.
fn hash_edges(fd: BorrowedFd<'_>, size: u64) -> rustix::io::Result<Option<[u8; 32]>> {
    let mut h = blake3::Hasher::new();
    let mut buf = [0u8; EDGE as usize];
    for off in [0, size - EDGE] {
        let mut got = 0;
        while got < buf.len() {
            match rustix::io::pread(fd, &mut buf[got..], off + got as u64)? {
                0 => return Ok(None),
                n => got += n,
            }
        }
        h.update(&buf);
    }
    Ok(Some(*h.finalize().as_bytes()))
}

/// BLAKE3 of the first and last [`EDGE`] bytes (`edges`, for files larger
/// than both edges) or of the whole file, checking the size is unchanged
/// and that the file read is still the one the walk saw (`stamp`, see
/// [`still_walked`]): the hash is kept under the walk's identity, and
/// given to the file's clones.
fn hash_file(
    path: &Path,
    size: u64,
    stamp: FileStamp,
    edges: bool,
    count: &dyn Fn(u64),
) -> Result<[u8; 32]> {
    let op = Operation::Dedupe;
    let err = |e: Errno| Error::from_errno(op, e).with_src(path);
    let fd = open_read(path).map_err(err)?;
    let hash = if edges && size > 2 * EDGE {
        let h = hash_edges(fd.as_fd(), size)
            .map_err(err)?
            .ok_or_else(|| changed(path))?;
        count(2 * EDGE);
        h
    } else {
        let (hash, total) = crate::ground::hash::hash_fd(fd.as_fd(), size, count).map_err(err)?;
        if total != size {
            return Err(changed(path));
        }
        hash
    };
    if !still_walked(fd.as_fd(), stamp) {
        return Err(changed_while_read(path));
    }
    Ok(hash)
}

pub(super) fn changed(path: &Path) -> Error {
    Error::new(Operation::Dedupe, ErrorKind::ContentChanged)
        .with_src(path)
        .with_reason("changed size while being read")
}

/// A file found written or replaced (by another program) between the
/// walk and a read of it: left out of this run.
fn changed_while_read(path: &Path) -> Error {
    Error::new(Operation::Dedupe, ErrorKind::ContentChanged)
        .with_src(path)
        .with_reason("written or replaced by another program while this run read it; left as it is")
}

/// Whether files in directory `dir`'s filesystem may be deduplicated:
/// not a network client, and the kernel's trial dedupe there works.
fn can_dedupe(dir: &Path) -> Result<()> {
    let op = Operation::Dedupe;
    let kind = FsKind::of_path(dir).map_err(|e| Error::from_errno(op, e).with_src(dir))?;
    if kind.is_network_client() {
        return Err(Error::new(op, ErrorKind::NotSupported).with_src(dir).with_reason(format!(
            "{kind} is a network client: its dedupe has cloned without comparing, which can lose data; run cowlink on the server"
        )));
    }
    // Btrfs always dedupes, and the trial would write a scratch file into
    // the directory: under a snapshot that unshares the directory's tree
    // blocks from it for good, so a run that shares nothing would still
    // grow usage (by 32 KiB, one block in two copies, measured).
    if kind == FsKind::Btrfs {
        return Ok(());
    }
    let facts = crate::probe::filesystem(dir)?;
    match facts.dedupe {
        // No trial could be made (say, no right to write a scratch file
        // there): the kernel decides per file, and `FIDEDUPERANGE` compares
        // before it shares, so trying is safe.
        Answer::Yes | Answer::Unknown(_) => Ok(()),
        Answer::No(why) => Err(Error::new(op, ErrorKind::NotSupported)
            .with_src(dir)
            .with_reason(format!("this filesystem cannot deduplicate: {why}"))),
    }
}

/// The longest path the filesystem probe is given (PATH_MAX is 4096
/// bytes with its NUL).
const PROBE_PATH_MAX: usize = 4095;

/// The directory to probe device `dev` by ([`can_dedupe`]) for its file
/// `path`: the file's own, or, where that is longer than PATH_MAX (a deep
/// tree, its files opened in pieces), the deepest ancestor that fits and
/// is on `dev` still. (The walk came down to the file from a root that
/// fits, so one is found unless the filesystem is mounted that deep.)
fn probe_dir(path: &Path, dev: u64) -> PathBuf {
    // (A bare name's parent is the empty path: the working directory.)
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if dir.as_os_str().len() <= PROBE_PATH_MAX {
        return dir.to_path_buf();
    }
    dir.ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty() && a.as_os_str().len() <= PROBE_PATH_MAX)
        .find(|a| cowlink_sys::stat(*a).is_ok_and(|st| st.st_dev == dev))
        .unwrap_or(dir)
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_sampled_recheck_picks_a_sixteenth_and_a_new_one_each_run() {
        let picked = |salt| {
            (0..160_000u64)
                .filter(|&i| LayoutRecheck::Sample.picks(i, salt))
                .count()
        };
        for salt in [0, 1, 0x5eed, u64::MAX] {
            let n = picked(salt);
            assert!((9_000..11_000).contains(&n), "salt {salt}: {n} of 160,000");
        }
        // Consecutive inodes, any salt: each is picked in some run soon.
        for ino in 0..1000u64 {
            let first = (0..400u64).find(|&s| LayoutRecheck::Sample.picks(ino, s * 7919));
            assert!(first.is_some(), "inode {ino} never picked");
        }
        assert!((0..1000).all(|i| LayoutRecheck::Every.picks(i, 3)));
        assert!((0..1000).all(|i| !LayoutRecheck::Never.picks(i, 3)));
    }

    #[test]
    fn a_plan_reads_back_from_its_json_with_exact_names() {
        let odd = |b: &[u8]| PathBuf::from(OsStr::from_bytes(b));
        let plan = DedupePlan {
            groups: vec![DedupeGroup {
                size: 8192,
                blake3: Some("ab".repeat(32)),
                source: odd(b"/d/caf\xe9"),
                targets: vec![odd(b"/d/plain"), odd(b"/d/\xff\xfe")],
                already_shared: vec![odd(b"/d/x")],
                reclaimable: 8192,
                source_stamp: Some(FileStamp(0x0123_4567_89ab_cdef)),
                target_stamps: vec![FileStamp(1), FileStamp(u64::MAX)],
            }],
            files_scanned: 4,
            candidates: 4,
            ..DedupePlan::default()
        };
        let text = serde_json::to_string(&plan).expect("serialize");
        assert!(text.contains("source_bytes") && text.contains("targets_bytes"));
        let back: DedupePlan = serde_json::from_str(&text).expect("read back");
        assert_eq!(back, plan);
        // A plan whose names are all UTF-8 has no companions, and reads back.
        let mut plain = plan.clone();
        plain.groups[0].source = PathBuf::from("/d/a");
        plain.groups[0].targets = vec![PathBuf::from("/d/b")];
        let text = serde_json::to_string(&plain).expect("serialize");
        assert!(!text.contains("_bytes"));
        assert_eq!(
            serde_json::from_str::<DedupePlan>(&text).expect("read back"),
            plain
        );
    }
}
