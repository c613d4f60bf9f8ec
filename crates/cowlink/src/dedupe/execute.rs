//! Carrying out a plan: `FIDEDUPERANGE` only, in chunks of at most
//! [`CHUNK`], groups in source-path order, the space given back measured
//! before and after (see the module notes in `mod.rs`).
//!
//! Space never grows. Before a target is shared, its extent map says
//! whether its blocks would come back: a target whose extents no other
//! file shares gives them back. One with shared extents gives them back
//! only if every other holder is in its group (the source, or other
//! targets leaving them too). Btrfs names the holders (`LOGICAL_INO_V2`,
//! root only): a target whose blocks are also held by a snapshot, a
//! reflinked copy or any file outside the group is skipped and reported
//! ([`SkipReason::HeldElsewhere`]); sharing it would free nothing, and on
//! Btrfs it unshares the subvolume's metadata from its snapshots, which is
//! how usage grows. Where the holders cannot be named (XFS keeps only a
//! count; Btrfs without root), a shared extent that no other file of the
//! group maps is held outside it: skipped too. Targets whose shared
//! extents the group does map, but maybe not alone, run after the others,
//! in batches (1, 2, 4, … up to [`UNPROVEN_BATCH`] targets) with the space
//! in use read around each, after a `syncfs` (on Btrfs data and metadata,
//! `BTRFS_IOC_SPACE_INFO`, since statfs there follows data alone): when a
//! batch grows it, the rest of those targets on that filesystem are
//! skipped ([`SkipReason::UsageGrew`]). The growth is then at most one
//! batch's.
//!
//! Each path is the file the plan named, or it is left alone. Between
//! planning and executing a path can come to name another file: a hard
//! link to a store object, a copy with the same bytes, a file of a
//! snapshot reached through a directory swapped for a symbolic link.
//! `FIDEDUPERANGE` compares bytes, not identities, so it would share the
//! planned source's blocks into that file (moving a store object's
//! extents, or those of a file outside the run). The plan records each
//! source's and target's [`FileStamp`] (device, inode, size, mtime, ctime,
//! birth time, from the walk's `statx`); every open here is checked
//! against it on the descriptor (`statx` of the open file, so no later
//! rename can slip between the check and the ioctls, which all go to that
//! descriptor), and a file that is not the one planned is reported in
//! [`DedupeReport::changed`] and never opened for sharing again. A group
//! whose source is not the one planned is not carried out at all. The
//! opens are these: the source and the targets of each group
//! (`dedupe_group`), and again for the targets run later in measured
//! batches (each checked again, as the path may have changed in between).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs;

use super::index::{Indexes, Relaid};
use super::{open_read, DedupeGroup, DedupeOptions, DedupePlan, CHUNK};
use crate::extents::extents_fd;
use crate::ground::error::{Error, ErrorKind, Operation};
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
    /// Space given back, measured: the fall of the space in use on each
    /// filesystem where something was shared, from before its first group
    /// to the end, each read after a `syncfs`, summed. Space in use is
    /// statfs's blocks not free, and on Btrfs its data, metadata and
    /// system bytes (`BTRFS_IOC_SPACE_INFO`: statfs there follows data
    /// alone). Never an estimate: a group's [`DedupeGroup::reclaimable`] is
    /// what the plan expected. Other programs' writes during the run move
    /// it too.
    pub bytes_reclaimed: u64,
    /// Growth of the space in use instead, summed over the filesystems
    /// where it grew (0 unless something else wrote during the run, or a
    /// batch of targets whose holders could not be named grew usage: see
    /// [`SkipReason::UsageGrew`]).
    #[serde(default)]
    pub bytes_grown: u64,
    /// The space in use on every filesystem involved could be read before
    /// and after (else that filesystem is missing from both figures).
    pub measured: bool,
    /// Identical targets left alone because sharing them would not give
    /// space back, each with the reason.
    pub skipped: Vec<SkippedTarget>,
    /// Targets (or sources) that changed since the plan: left untouched
    /// from the first differing chunk on. That is also every path that no
    /// longer names the file planned (its [`FileStamp`] differs: another
    /// file put in its place, or the file itself changed: data, size,
    /// mode, owner, links): nothing is shared into it or from it. A group
    /// whose source is listed here was not carried out (its targets were
    /// left as they were).
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

/// A target identical to its source, left as it was because sharing it
/// would not give its space back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SkippedTarget {
    /// The target.
    #[serde(flatten, serialize_with = "crate::name::json::path")]
    pub path: PathBuf,
    /// Why, as a kind.
    pub reason: SkipReason,
    /// Why, in words: who else holds its blocks, or how much usage grew.
    pub detail: String,
}

/// Why a target was skipped ([`SkippedTarget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Btrfs names a holder of some of its extents outside its group (a
    /// snapshot, a reflinked copy, another file): those blocks stay in use
    /// whatever happens to the target.
    HeldElsewhere,
    /// Its extents are shared with files the filesystem does not name
    /// (XFS, or Btrfs without root), and a batch of such targets on this
    /// filesystem grew the space in use: the run stopped sharing them there.
    UsageGrew,
    /// Its extents are shared with files the filesystem does not name, and
    /// the space in use could not be read to check the outcome.
    Unmeasurable,
}

/// Most targets whose holders cannot be named that run between two
/// readings of the space in use (the batches grow 1, 2, 4, … up to this):
/// small first, so a growth is caught early (one target's worth), larger
/// later, so a long run of such targets does not pay two `syncfs` each.
pub const UNPROVEN_BATCH: usize = 64;

/// Which file a path named when the plan was made: 64 bits of BLAKE3 over
/// its device, inode, size, mtime, ctime and birth time, as `statx` gives
/// them ([`cowlink_sys::FileId`]). [`execute`] shares nothing into, nor
/// from, a file whose stamp is not the planned one (see the module notes).
///
/// A stamp rather than the fields: every candidate carries one through the
/// whole plan (whose candidates are its peak memory), 8 bytes instead of
/// 48, and a plan in JSON carries 16 hex digits per path. A file that is
/// not the planned one passes only by matching 64 bits by chance, and even
/// then the kernel compares every byte before it shares. ctime moves with
/// any change to the file (data, mode, owner, links, a rename), so such a
/// file is skipped too: a missed dedupe, never a wrong one. Device numbers
/// can change when a filesystem is mounted again (a loop device attached
/// anew): a plan kept across that is refused as a whole, file by file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FileStamp(pub u64);

impl FileStamp {
    /// The stamp of a file `statx` described as `id`.
    pub fn of(id: &cowlink_sys::FileId) -> FileStamp {
        // One 50-byte block, hashed in one call (one BLAKE3 compression):
        // a version byte, the fields little-endian, and whether a birth
        // time is known. Every candidate of the walk takes this path: one
        // call was 130-150 ns per stamp in a release build here, an
        // incremental hasher fed field by field 430 ns (a statx by path
        // is about 1.5 us).
        let mut block = [0u8; 50];
        block[0] = 1;
        let fields = [
            id.dev,
            id.ino,
            id.size,
            id.mtime_ns as u64,
            id.ctime_ns as u64,
            id.btime_ns.unwrap_or(0) as u64,
        ];
        for (i, v) in fields.into_iter().enumerate() {
            block[1 + 8 * i..9 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        block[49] = u8::from(id.btime_ns.is_some());
        let mut first = [0u8; 8];
        first.copy_from_slice(&blake3::hash(&block).as_bytes()[..8]);
        FileStamp(u64::from_le_bytes(first))
    }

    /// The stamp of the file at `path` now (a symbolic link at its end is
    /// not followed): what a plan made now would record for it, for a
    /// plan put together by other means.
    ///
    /// # Errors
    /// `path` cannot be examined (`statx`), naming it.
    pub fn of_path(path: &Path) -> crate::Result<FileStamp> {
        cowlink_sys::file_id_at(fs::CWD, path)
            .map(|id| FileStamp::of(&id))
            .map_err(|e| Error::from_errno(Operation::Dedupe, e).with_src(path))
    }
}

impl std::fmt::Display for FileStamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl serde::Serialize for FileStamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FileStamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FileStamp, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(serde::de::Error::custom(format!(
                "a file stamp is 16 hex digits, not {text:?}"
            )));
        }
        u64::from_str_radix(&text, 16)
            .map(FileStamp)
            .map_err(serde::de::Error::custom)
    }
}

impl DedupeGroup {
    /// The stamp the plan recorded for target `i` (`None` where it
    /// recorded none: a plan made by hand or by an older version).
    pub fn target_stamp(&self, i: usize) -> Option<FileStamp> {
        self.target_stamps.get(i).copied()
    }

    /// Keep the targets (with their stamps) for which `keep` is true.
    pub(super) fn retain_targets(&mut self, mut keep: impl FnMut(&Path) -> bool) {
        let stamps = std::mem::take(&mut self.target_stamps);
        let mut stamps = stamps.into_iter().map(Some).chain(std::iter::repeat(None));
        let mut kept_stamps = Vec::new();
        let mut all_stamped = true;
        self.targets.retain(|t| {
            let stamp = stamps.next().flatten();
            let kept = keep(t);
            if kept {
                match stamp {
                    Some(s) if all_stamped => kept_stamps.push(s),
                    _ => all_stamped = false,
                }
            }
            kept
        });
        // Stamps stay aligned with their targets: past a target without
        // one, none is kept (those targets are refused, as before).
        self.target_stamps = kept_stamps;
    }
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
///
/// The index ([`DedupeOptions::index`]) is not written here: what the
/// files shared now hold is learnt by [`dedupe`](super::dedupe), which maps
/// each group's source as the plan handed it over. An indexed run after a
/// [`plan`](super::plan) and `execute` finds the files as the plan left
/// them in the index (not yet shared) and has the kernel compare them
/// again, which shares nothing twice and then learns their layouts.
pub fn execute(plan: &DedupePlan, opts: &DedupeOptions) -> DedupeReport {
    let tally = Counters::new(&opts.run);
    let (files, bytes) = totals(&plan.groups);
    tally.show(files, bytes);
    let mut ex = Executor::new(&opts.run, &tally);
    ex.sources_only(&opts.stores);
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
    /// Files and bytes added to the totals before it was shown.
    more: Mutex<(u64, u64)>,
}

impl<'a> Counters<'a> {
    pub(super) fn new(run: &'a Run) -> Self {
        Counters {
            run,
            held: Mutex::new((false, 0, 0)),
            more: Mutex::new((0, 0)),
        }
    }

    /// Enter [`Phase::Dedupe`] for all the groups (`files` targets of
    /// `bytes` in all), with what was done so far.
    pub(super) fn show(&self, files: u64, bytes: u64) {
        let mut held = lock(&self.held);
        let more = *lock(&self.more);
        self.run
            .enter(Phase::Dedupe, files + more.0, bytes + more.1);
        self.run.done(held.1, held.2);
        held.0 = true;
    }

    /// Add `files` of `bytes` in all to the work expected: files shared
    /// that the plan did not list as targets.
    fn more(&self, files: u64, bytes: u64) {
        let held = lock(&self.held);
        if held.0 {
            self.run.more(files, bytes);
        } else {
            let mut more = lock(&self.more);
            more.0 += files;
            more.1 += bytes;
        }
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
/// The space in use on a filesystem is read before its first group runs.
pub(super) struct Executor<'a> {
    run: &'a Run,
    tally: &'a Counters<'a>,
    pool: Option<rayon::ThreadPool>,
    /// What the groups share between threads: space in use before, and
    /// whether Btrfs names the holders of extents.
    fs: FsState,
    /// Devices where something was shared: only their space in use can have
    /// grown because of us (elsewhere a change is someone else's).
    shared_on: HashSet<u64>,
    /// Filesystems where a batch of targets whose holders could not be
    /// named grew the space in use, and by how much: no more such targets
    /// run there.
    grew_on: HashMap<FsKey, u64>,
    /// (source, target) of edge-only groups whose bytes differ.
    unsettled: Vec<(PathBuf, PathBuf)>,
    /// The sources of edge-only groups that may lose every target to
    /// `unsettled`, with their planned number of targets (see
    /// [`Executor::groups_emptied`]). Only groups with a target found
    /// different or handed back are held: rare, unlike the groups.
    split: HashMap<PathBuf, usize>,
    /// With an index: the layouts of the files shared, learnt on the way.
    learn: Option<Learn>,
    report: DedupeReport,
    /// Stale mates shared (see [`Executor::mates_shared`]).
    mates: u64,
}

/// What the executor learns for the index as it shares: the layout of
/// each file it shared, as it is afterwards, so the next run sees the
/// file shared and reads nothing of it.
///
/// A target shared whole maps the same extents as its source, and the
/// source keeps its own: after a group, the source and each target
/// shared whole share every block, on the source's runs. Those runs'
/// fingerprint comes from the plan, which mapped the source
/// ([`Executor::source_runs`]), and the source is mapped again when the
/// run ends (once per group, [`Layouts::split`]) to check it
/// still has those runs: another program's dedupe moves a file's blocks
/// and leaves its times, and the targets then take the blocks it was
/// moved to. A source the plan did not map this run (known from the
/// index) is mapped before any of its targets is shared, and checked
/// against those runs the same way (only "every block shared" at the
/// end would take a source moved onto another file's blocks after its
/// group for the truth). A file is learnt under the stamp it
/// was opened with, the one planned (checked again after the map for
/// the source): sharing moves no time, so its index entry, written from
/// the walk's identity, is its own, and a write since moved its ctime,
/// so the next run does not trust that entry.
///
/// Why at the end and not after each group: on XFS a source's map
/// (FIEMAP reads the refcount B-tree under its allocation group's
/// buffer locks) waits on the other threads' dedupe calls, and theirs
/// on it. Mapped after each group, the sources of a first run over
/// 148,716 files on XFS made its sharing 0.7 s longer (phase times, two
/// runs each way); mapped at the end, with nothing else running, they
/// take 0.35-0.4 s. What waiting gives up: a source moved by another
/// program and then moved back to its planned blocks while the run
/// shares has its targets learnt on runs they may not hold. The index
/// then takes them as already shared, which frees nothing and loses
/// nothing, until the sampled recheck maps them. Mapping every shared
/// file again by path after the run cost 1.2 s of a 6.5 s first run
/// over 154,608 files on XFS: the targets are not mapped, only each
/// group's source.
///
/// What is learnt is held (24 bytes a file, 4.4 MB over 184,092 files,
/// and each directory's path once) and
/// written when the run ends ([`Layouts::split`] hands it to
/// `Indexes::finish`), after planning has let go of its memory. Written
/// in batches as it comes, a first run's large records would be
/// rewritten by most batches while planning still holds its candidates
/// (14 MB more at the peak over 154,608 files on XFS). Nothing is lost
/// by waiting: a run killed while sharing leaves its index marked, and
/// the next run forgets every layout anyway (`Indexes::sharing`).
struct Learn {
    ix: Arc<Indexes>,
    /// The directories of the files shared, each once.
    dirs: Mutex<Dirs>,
    /// The runs of the sources of groups handed over, by the source's
    /// stamp (taken out when its group is done).
    runs: Mutex<HashMap<FileStamp, u64>>,
    /// Learnt, waiting for its source to be mapped again.
    waiting: Mutex<Waiting>,
}

/// The directories of the files a run shared: each has a place, by its
/// path's bytes (hashed as bytes: a `Path` hashes component by
/// component, several times slower, and this is asked of every file
/// shared), and its device and inode there, which the index's records
/// are keyed by (`None`: it could not be examined).
#[derive(Default)]
struct Dirs {
    by_path: HashMap<Box<[u8]>, u32>,
    keys: Vec<Option<(u64, u64)>>,
}

/// Files shared whole, waiting for their group's source to be mapped
/// again at the run's end (see [`Learn`]). Packed: a first run holds
/// one source a group (47,874 over 148,716 files on XFS) and one
/// [`Held`] a file moved until it ends.
#[derive(Default)]
struct Waiting {
    /// The sources' file names, one after the other.
    names: Vec<u8>,
    /// Each group's source: its directory's place in [`Dirs`], the end
    /// of its name in `names` (it starts where the previous one ends),
    /// its stamp as planned, and the fingerprint of the runs its targets
    /// took.
    sources: Vec<(u32, usize, FileStamp, u64)>,
    /// The source and the targets of each group, as they will be learnt
    /// once the source's fingerprint is known. In the order learnt.
    files: Vec<Held>,
    /// Where in `files` the facts of the regrouping begin (see
    /// [`Executor::regrouping`]).
    late_from: Option<usize>,
}

/// A file moved by a call of the run, until its layout after the call
/// is known: a [`Relaid`] of 24 bytes rather than 40.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// Its directory's place in [`Dirs`].
    dir: u32,
    /// The place of its group's source in [`Waiting::sources`], or
    /// [`MOVED`] for a file whose blocks a call moved but whose layout
    /// is not known after it.
    source: u32,
    ino: u64,
    stamp: FileStamp,
}

/// In [`Held::source`]: a file moved by a call of the run, whose layout
/// after it is not known (a target shared in part, or shorter than
/// asked): the index forgets the layout it holds of it
/// ([`Relaid::MOVED`]).
const MOVED: u32 = u32::MAX;

impl Learn {
    /// The place of the directory holding `path` in [`Dirs`], and its
    /// device and inode (`None` when it could not be examined); `None`
    /// for a path without a parent.
    fn dir_of(&self, path: &Path) -> Option<(u32, Option<(u64, u64)>)> {
        let parent = path.parent()?;
        let at = match parent.as_os_str().is_empty() {
            true => Path::new("."),
            false => parent,
        };
        let bytes = at.as_os_str().as_bytes();
        {
            let d = lock(&self.dirs);
            if let Some(&place) = d.by_path.get(bytes) {
                return Some((place, d.keys[place as usize]));
            }
        }
        // Followed: the path's own lookup follows a link there (a root
        // given as `link/`), and the walk keyed its record by the
        // directory it read, not by the link.
        // A path past PATH_MAX is opened in pieces.
        let got = cowlink_sys::stat(at)
            .ok()
            .or_else(|| {
                let flags = cowlink_sys::O_PATH | fs::OFlags::DIRECTORY | fs::OFlags::CLOEXEC;
                let fd = crate::prim::files::open_deep(at, flags).ok()?;
                cowlink_sys::fstat(fd.as_fd()).ok()
            })
            .map(|st| (st.st_dev, st.st_ino));
        let mut d = lock(&self.dirs);
        // (Another thread may have met it meanwhile.)
        if let Some(&place) = d.by_path.get(bytes) {
            return Some((place, d.keys[place as usize]));
        }
        let place = u32::try_from(d.keys.len()).expect("fewer than 2^32 directories");
        d.by_path.insert(bytes.into(), place);
        d.keys.push(got);
        Some((place, got))
    }

    /// That the file `ino` on `dev`, found at `path` and still the file
    /// of `stamp` (as planned), was moved by the group of the source at
    /// `source` in [`Waiting::sources`] (or [`MOVED`]).
    fn held(&self, path: &Path, dev: u64, ino: u64, stamp: FileStamp, source: u32) -> Option<Held> {
        let (dir, key) = self.dir_of(path)?;
        (key?.0 == dev).then_some(Held {
            dir,
            source,
            ino,
            stamp,
        })
    }

    /// Hold what group sharing `source` (device, inode, stamp as planned,
    /// the plan's runs `runs`) taught of it and of its targets shared
    /// whole (path, device, inode, stamp), until the source is mapped
    /// again ([`Layouts::split`]).
    fn await_source(
        &self,
        source: &Path,
        (dev, ino, planned): (u64, u64, FileStamp),
        runs: u64,
        shared_whole: &[(&PathBuf, u64, u64, FileStamp)],
    ) {
        let (Some((dir, _)), Some(name)) = (self.dir_of(source), source.file_name()) else {
            self.moved(shared_whole);
            return;
        };
        // Looked up before the lock is taken (a directory new to the run
        // is `stat`ed); the source's place is known under it.
        let held: Vec<Held> = std::iter::once((source, dev, ino, planned))
            .chain(
                shared_whole
                    .iter()
                    .map(|&(p, d, i, s)| (p.as_path(), d, i, s)),
            )
            .filter_map(|(p, d, i, s)| self.held(p, d, i, s, 0))
            .collect();
        if held.is_empty() {
            return;
        }
        let mut w = lock(&self.waiting);
        let at = u32::try_from(w.sources.len()).expect("fewer than 2^32 groups");
        w.files
            .extend(held.into_iter().map(|h| Held { source: at, ..h }));
        w.names.extend_from_slice(name.as_bytes());
        let end = w.names.len();
        w.sources.push((dir, end, planned, runs));
    }

    /// Files (path, device, inode, stamp as planned) whose blocks a call
    /// of this run moved, with no layout to learn of them after it: the
    /// layout the index holds of them (the walk's, the planning's, or one
    /// learnt from an earlier group of the run) is forgotten, not kept.
    fn moved(&self, files: &[(&PathBuf, u64, u64, FileStamp)]) {
        if files.is_empty() {
            return;
        }
        let facts: Vec<Held> = (files.iter())
            .filter_map(|&(p, d, i, s)| self.held(p, d, i, s, MOVED))
            .collect();
        lock(&self.waiting).files.extend(facts);
    }
}

/// What the run learnt of the files it moved (`held`, in the order
/// learnt), with the regrouping's facts from `late_from` on: a file the
/// regrouping taught of is learnt from it alone. Its earlier groups' facts
/// are of blocks it left (a source of those groups made a target in the
/// regrouping). The groups of one pass are disjoint, so what remains of a
/// file agrees (a source whose deferred targets ran in a later batch is
/// learnt twice, alike), and the index may apply it in any order.
fn last_group_wins(mut held: Vec<Relaid>, late_from: Option<usize>) -> Vec<Relaid> {
    let Some(from) = late_from.filter(|&f| f < held.len()) else {
        return held;
    };
    let late: HashSet<(u64, u64)> = held[from..].iter().map(|r| (r.dev, r.ino)).collect();
    let mut at = 0;
    held.retain(|r| {
        at += 1;
        at > from || !late.contains(&(r.dev, r.ino))
    });
    held
}

/// Whether the source `path`, mapped again now (see [`Learn`]), is
/// still the file `planned` on the runs of fingerprint `runs`, the ones
/// its targets took. If not, nothing of its group is learnt.
fn mapped_again(path: &Path, planned: FileStamp, runs: u64) -> bool {
    let Ok(fd) = open_read(path) else {
        return false;
    };
    // Another program's dedupe moves a file's blocks and leaves its
    // times, so the stamp alone cannot tell that the source still has the
    // runs its targets took: they must be the ones mapped before it was
    // shared (by the plan, or by the executor for a source the plan did
    // not map). Only "every block shared" would take a source moved
    // onto another file's blocks after its group for the truth. One stamp
    // check, after the map, covers the time before it too: a write moves
    // the ctime before its data lands, and the ctime never comes back to
    // the planned one.
    runs_of(&fd) == Some(runs)
        && cowlink_sys::file_id(fd.as_fd()).is_ok_and(|id| FileStamp::of(&id) == planned)
}

/// The fingerprint of the runs of the open file `fd` ([`super::stages::Cand::runs`]),
/// where it can be mapped and every extent has its blocks.
fn runs_of(fd: &OwnedFd) -> Option<u64> {
    let list = extents_fd(fd.as_fd(), false).ok()?;
    let mut c = super::stages::Cand::default();
    super::layout_facts(&list, &mut c);
    (c.runs != 0).then_some(c.runs)
}

/// The fingerprint of the runs of the open file `fd`, mapped with its
/// dirty pages written back, where every block it has is shared.
fn all_shared_runs(fd: &OwnedFd) -> Option<u64> {
    let list = extents_fd(fd.as_fd(), true).ok()?;
    let mut c = super::stages::Cand::default();
    super::layout_facts(&list, &mut c);
    c.shared.map(|f| f.get()).filter(|&f| f == c.runs)
}

/// Per filesystem (device), shared by the groups running in parallel.
#[derive(Default)]
struct FsState {
    /// Space in use ([`in_use`]) before anything ran there, per filesystem,
    /// with a descriptor to read it again (`None`: it could not be read);
    /// and the filesystem of each device met.
    used_before: Mutex<Measures>,
    /// Whether `LOGICAL_INO_V2` answers there (Btrfs, as root); absent
    /// until asked.
    names_holders: Mutex<HashMap<u64, bool>>,
    /// The stores' objects directories: files under them are sources only,
    /// never made targets here (see [`stale_mates`]).
    sources_only: Vec<PathBuf>,
}

/// The space in use per filesystem, and which filesystem each device is.
#[derive(Default)]
struct Measures {
    used: HashMap<FsKey, Option<(OwnedFd, u64)>>,
    fs_of: HashMap<u64, FsKey>,
}

/// What the space in use belongs to: a filesystem. Each Btrfs subvolume
/// has a device number of its own but they share one space (read per
/// device, the same fall would count once per subvolume), so Btrfs is
/// named by its UUID; elsewhere a device is a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum FsKey {
    Dev(u64),
    Btrfs([u8; 16]),
}

/// A group's targets (on device `dev`) whose extents are shared with
/// holders the filesystem does not name: run later, in measured batches.
struct Unproven {
    dev: u64,
    group: DedupeGroup,
}

/// A target run later, in a measured batch: its device, its group's index
/// among those deferred, its path, its stamp and size.
type Deferred<'g> = (u64, usize, &'g PathBuf, FileStamp, u64);

/// What one group's run gives back to [`Executor::start`], and what a
/// run of many gives back, summed in group order. A part per group, kept
/// until every group had run, held a report's worth of empty vectors per
/// group (about 200 bytes each, for tens of thousands of groups at once).
#[derive(Default)]
struct Part {
    report: DedupeReport,
    differ: Vec<(PathBuf, PathBuf)>,
    /// Targets handed back to run later: the index of their group in
    /// the run, its device, and each target's path and stamp.
    unproven: Vec<(usize, u64, PathBuf, FileStamp)>,
    /// Devices where something was shared.
    shared_on: HashSet<u64>,
    /// Edge-only groups with a target found different or handed back:
    /// their source and how many targets they were planned with.
    split: Vec<(PathBuf, usize)>,
    /// Stale mates shared (see `GroupPart::mates`).
    mates: u64,
}

impl Part {
    /// Add `later`, the part of groups after this one's.
    fn append(&mut self, later: Part) {
        add_groups(&mut self.report, later.report);
        self.differ.extend(later.differ);
        self.unproven.extend(later.unproven);
        self.shared_on.extend(later.shared_on);
        self.split.extend(later.split);
        self.mates += later.mates;
    }
}

/// Add to `to` what the groups of `from` report (the counts and lists a
/// group's run fills; the space measured is the executor's own).
fn add_groups(to: &mut DedupeReport, from: DedupeReport) {
    to.groups += from.groups;
    to.targets_deduped += from.targets_deduped;
    to.bytes_compared += from.bytes_compared;
    to.changed.extend(from.changed);
    to.skipped.extend(from.skipped);
    to.errors.extend(from.errors);
}

/// What [`dedupe_group`] gives back of one group: its report, the targets
/// found different, and those handed back to run later.
#[derive(Default)]
struct GroupPart {
    report: DedupeReport,
    differ: Vec<(PathBuf, PathBuf)>,
    unproven: Vec<(PathBuf, FileStamp)>,
    /// Stale mates (see `stale_mates`) shared: counted among the targets
    /// deduplicated, no longer among the files already shared.
    mates: u64,
}

/// How [`dedupe_group`] treats targets with shared extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proving {
    /// Share only the targets proven to give their blocks back; hand the
    /// unproven ones back.
    Sort,
    /// Share every target (a measured batch of unproven ones).
    Measured,
}

impl<'a> Executor<'a> {
    /// An executor on `run`'s threads, counting progress in `tally`.
    pub(super) fn new(run: &'a Run, tally: &'a Counters<'a>) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(run.threads_or(crate::run::cores))
            .build()
            .ok();
        Executor {
            run,
            tally,
            pool,
            fs: FsState::default(),
            shared_on: HashSet::new(),
            grew_on: HashMap::new(),
            unsettled: Vec::new(),
            split: HashMap::new(),
            learn: None,
            report: DedupeReport::default(),
            mates: 0,
        }
    }

    /// The stores of the run (`DedupeOptions::stores`): their objects are
    /// never made targets, not even as a plan's already shared files.
    pub(super) fn sources_only(&mut self, stores: &[PathBuf]) {
        self.fs.sources_only = stores.iter().map(|s| s.join("objects")).collect();
    }

    /// Learn the layout of every file shared and hand it to `ix` (see
    /// [`Learn`]) at [`Layouts::split`].
    ///
    /// The planning's own updates of the index ([`Indexes::update`]) are
    /// applied before these at the run's end, so a layout learnt here is
    /// never overwritten by the one read before sharing.
    pub(super) fn learn_layouts(&mut self, ix: Arc<Indexes>) {
        self.learn = Some(Learn {
            ix,
            dirs: Mutex::default(),
            runs: Mutex::default(),
            waiting: Mutex::default(),
        });
    }

    /// The runs of the sources of groups about to be started, by their
    /// stamps (from the plan: see [`Learn`]).
    pub(super) fn source_runs(&mut self, runs: super::stages::SourceRuns) {
        if let Some(learn) = &self.learn {
            lock(&learn.runs).extend(runs);
        }
    }

    /// What was learnt while sharing, to be handed to the index
    /// ([`Layouts::split`]), with the executor's threads: done with, the
    /// executor only measures ([`Executor::finish`]), and the two run
    /// side by side (on Btrfs the measure's `syncfs` commits, a
    /// fraction of a second after a first run).
    pub(super) fn take_layouts(&mut self) -> Option<Layouts> {
        let learn = self.learn.take()?;
        Some(Layouts {
            learn,
            pool: self.pool.take(),
        })
    }
}

/// The layouts an [`Executor`] learnt, taken from it
/// ([`Executor::take_layouts`]).
pub(super) struct Layouts {
    learn: Learn,
    pool: Option<rayon::ThreadPool>,
}

impl Layouts {
    /// Hand what was learnt while sharing to the index now, and return
    /// the check of it, to run beside the index's last write
    /// ([`Recheck::run`]): each file moved is learnt on its source's runs
    /// as planned (or, a file moved without a layout to learn, as moved,
    /// its layout forgotten), and the check maps each group's source
    /// again (see [`Learn`]) and names the runs some source was not found
    /// on, whose files the index then forgets in the same commit
    /// (`Indexes::finish_checked`). Mapped first and written after, the
    /// sources of a first run over 148,650 files on XFS took 0.31-0.38 s
    /// before the index's rewrite began (a copy of every record, 0.2-0.25
    /// s on one thread), with nothing else to do on the other core. A
    /// cancelled run learns too, for what it shared before the cancel (at
    /// most a few microseconds a group). Lets go of the indexes: they are
    /// the caller's to finish.
    pub(super) fn split(self) -> Recheck {
        let Layouts { learn, pool } = self;
        let w = std::mem::take(&mut *lock(&learn.waiting));
        let dirs = std::mem::take(&mut *lock(&learn.dirs));
        lock(&learn.runs).clear();
        // A file of two groups (a target regrouped after the kernel
        // found it different, a source made a target there) has two
        // facts, in order.
        let late_from = w.late_from;
        let held: Vec<Relaid> = (w.files.into_iter())
            .filter_map(|h| {
                let shared = match h.source {
                    MOVED => Relaid::MOVED,
                    at => w.sources[at as usize].3,
                };
                let (dev, dir) = dirs.keys[h.dir as usize]?;
                Some(Relaid {
                    dev,
                    dir,
                    ino: h.ino,
                    stamp: h.stamp,
                    shared,
                })
            })
            .collect();
        learn.ix.relayout(last_group_wins(held, late_from));
        // Each directory's path, by its place.
        let mut paths: Vec<Box<[u8]>> = vec![Box::default(); dirs.keys.len()];
        for (p, at) in dirs.by_path {
            paths[at as usize] = p;
        }
        Recheck {
            paths,
            names: w.names,
            sources: w.sources,
            pool,
        }
    }
}

/// The sources of a run's groups, to be mapped again when it ends
/// ([`Layouts::split`]).
pub(super) struct Recheck {
    /// Each directory's path, by its place in [`Dirs`].
    paths: Vec<Box<[u8]>>,
    /// As in [`Waiting`].
    names: Vec<u8>,
    sources: Vec<(u32, usize, FileStamp, u64)>,
    pool: Option<rayon::ThreadPool>,
}

impl Recheck {
    /// Map each source again, in parallel (see [`Learn`]): the
    /// fingerprints of the runs of those not found on them, still the
    /// file planned (almost always none).
    pub(super) fn run(self) -> HashSet<u64> {
        let Recheck {
            paths,
            names,
            sources,
            pool,
        } = self;
        let source = |at: usize| -> PathBuf {
            let (dir, end, _, _) = sources[at];
            let start = at.checked_sub(1).map_or(0, |p| sources[p].1);
            let dir = Path::new(std::ffi::OsStr::from_bytes(&paths[dir as usize]));
            dir.join(std::ffi::OsStr::from_bytes(&names[start..end]))
        };
        let map = || -> HashSet<u64> {
            (0..sources.len())
                .into_par_iter()
                .filter_map(|at| {
                    let (_, _, planned, runs) = sources[at];
                    (!mapped_again(&source(at), planned, runs)).then_some(runs)
                })
                .collect()
        };
        match &pool {
            Some(pool) => pool.install(map),
            None => map(),
        }
    }
}

impl Executor<'_> {
    /// Carry out `groups` (in parallel) and wait for them: first every
    /// target proven to give its blocks back, then, in measured batches,
    /// those whose holders could not be named.
    pub(super) fn start(&mut self, groups: &[DedupeGroup]) {
        // Disk order (approximately: path order) rather than size order.
        let mut order: Vec<&DedupeGroup> = groups.iter().collect();
        order.sort_by(|a, b| a.source.cmp(&b.source));
        let mut part = self.run_groups(&order, Proving::Sort);
        let mut unproven: Vec<Unproven> = Vec::new();
        let mut last = usize::MAX;
        for (i, dev, t, stamp) in std::mem::take(&mut part.unproven) {
            if i != last {
                unproven.push(Unproven {
                    dev,
                    group: DedupeGroup {
                        targets: Vec::new(),
                        target_stamps: Vec::new(),
                        already_shared: Vec::new(),
                        ..order[i].clone()
                    },
                });
                last = i;
            }
            if let Some(u) = unproven.last_mut() {
                u.group.targets.push(t);
                u.group.target_stamps.push(stamp);
            }
        }
        self.absorb(part);
        self.run_unproven(unproven);
    }

    /// Run `groups` in parallel on the pool; their parts summed in group
    /// order.
    fn run_groups(&self, groups: &[&DedupeGroup], proving: Proving) -> Part {
        let learn = self.learn.as_ref();
        let (run, tally, fs) = (self.run, self.tally, &self.fs);
        let work = || -> Part {
            groups
                .par_iter()
                .enumerate()
                .fold(Part::default, |mut acc, (i, g)| {
                    if run.cancelled() {
                        return acc;
                    }
                    let mut p = GroupPart::default();
                    // A group split into measured batches was counted
                    // when it was sorted.
                    p.report.groups = u64::from(proving == Proving::Sort);
                    let dev = dedupe_group(g, &mut p, run, tally, fs, proving, learn);
                    if let (Some(d), true) = (dev, p.report.targets_deduped > 0) {
                        acc.shared_on.insert(d);
                    }
                    let edge_only = proving == Proving::Sort && g.blake3.is_none();
                    if edge_only && !(p.differ.is_empty() && p.unproven.is_empty()) {
                        acc.split.push((g.source.clone(), g.targets.len()));
                    }
                    let unproven = std::mem::take(&mut p.unproven);
                    if let Some(d) = dev {
                        acc.unproven
                            .extend(unproven.into_iter().map(|(t, st)| (i, d, t, st)));
                    }
                    acc.append(Part {
                        report: p.report,
                        differ: p.differ,
                        mates: p.mates,
                        ..Part::default()
                    });
                    acc
                })
                .reduce(Part::default, |mut a, b| {
                    a.append(b);
                    a
                })
        };
        match &self.pool {
            Some(pool) => pool.install(work),
            None => work(),
        }
    }

    /// Add the groups' results to the report.
    fn absorb(&mut self, p: Part) {
        self.shared_on.extend(p.shared_on);
        add_groups(&mut self.report, p.report);
        self.report.regrouped += p.differ.len() as u64;
        self.unsettled.extend(p.differ);
        self.split.extend(p.split);
        self.mates += p.mates;
    }

    /// How many files the plan took as already sharing their source's
    /// blocks were found not to and shared (see `stale_mates`): counted
    /// among the targets deduplicated.
    pub(super) fn mates_shared(&self) -> u64 {
        self.mates
    }

    /// Run the targets whose holders could not be named, per filesystem,
    /// in batches of growing size (targets, not groups: one group can hold
    /// many) with the space in use read around each; stop on a filesystem
    /// (skipping the rest there) once a batch grew it.
    fn run_unproven(&mut self, mut unproven: Vec<Unproven>) {
        unproven.sort_by(|a, b| (a.dev, &a.group.source).cmp(&(b.dev, &b.group.source)));
        // (device, group, target, size) in that order.
        let flat: Vec<Deferred<'_>> = unproven
            .iter()
            .enumerate()
            .flat_map(|(i, u)| {
                u.group
                    .targets
                    .iter()
                    .zip(&u.group.target_stamps)
                    .map(move |(t, &stamp)| (u.dev, i, t, stamp, u.group.size))
            })
            .collect();
        let mut rest = flat.as_slice();
        while let Some(&(dev, ..)) = rest.first() {
            let n = rest.partition_point(|u| u.0 == dev);
            let (here, after) = rest.split_at(n);
            rest = after;
            let mut batch = 1;
            let mut todo = here;
            while !todo.is_empty() && !self.run.cancelled() {
                let key = self.key_of(dev);
                if let Some(&grown) = self.grew_on.get(&key) {
                    let detail = format!(
                        "its blocks are shared with files this filesystem does not name, \
                         and sharing such files here grew the space in use by {grown} bytes: \
                         the run stopped sharing them"
                    );
                    self.skip_all(todo, SkipReason::UsageGrew, &detail);
                    break;
                }
                let Some(before) = self.used_now(dev) else {
                    let detail = "its blocks are shared with files this filesystem does not \
                                  name, and the space in use could not be read to check the outcome";
                    self.skip_all(todo, SkipReason::Unmeasurable, detail);
                    break;
                };
                let (now, later) = todo.split_at(batch.min(todo.len()));
                todo = later;
                // The batch's targets, put back into their groups.
                let mut groups: Vec<DedupeGroup> = Vec::new();
                let mut last = usize::MAX;
                for &(_, g, t, stamp, _) in now {
                    if g != last {
                        groups.push(DedupeGroup {
                            targets: Vec::new(),
                            target_stamps: Vec::new(),
                            ..unproven[g].group.clone()
                        });
                        last = g;
                    }
                    if let Some(cur) = groups.last_mut() {
                        cur.targets.push(t.clone());
                        cur.target_stamps.push(stamp);
                    }
                }
                let refs: Vec<&DedupeGroup> = groups.iter().collect();
                let part = self.run_groups(&refs, Proving::Measured);
                self.absorb(part);
                match self.used_now(dev) {
                    Some(after) if after <= before => {}
                    Some(after) => {
                        self.grew_on.insert(key, after - before);
                    }
                    None => {
                        self.grew_on.insert(key, 0);
                    }
                }
                batch = (batch * 2).min(UNPROVEN_BATCH);
            }
        }
    }

    /// Report every one of `targets` as skipped for `reason`.
    fn skip_all(&mut self, targets: &[Deferred<'_>], reason: SkipReason, detail: &str) {
        for &(_, _, t, _, size) in targets {
            // Done with, for the progress: it will not be shared.
            self.tally.done(1, size);
            self.report.skipped.push(SkippedTarget {
                path: t.clone(),
                reason,
                detail: detail.to_string(),
            });
        }
    }

    /// The space in use on device `dev` now ([`in_use`]; `None` if it was
    /// never or cannot be read).
    fn used_now(&self, dev: u64) -> Option<u64> {
        let map = lock(&self.fs.used_before);
        let key = map.fs_of.get(&dev)?;
        let (fd, _) = map.used.get(key)?.as_ref()?;
        in_use(fd)
    }

    /// The filesystem of device `dev` (the device itself until a group
    /// there was measured).
    fn key_of(&self, dev: u64) -> FsKey {
        let map = lock(&self.fs.used_before);
        map.fs_of.get(&dev).copied().unwrap_or(FsKey::Dev(dev))
    }

    /// What is started from now on regroups pairs the kernel found
    /// different: a file of such a group may have been moved by a group
    /// before, and what its new group teaches of it replaces that
    /// ([`last_group_wins`]).
    pub(super) fn regrouping(&mut self) {
        if let Some(learn) = &self.learn {
            let mut w = lock(&learn.waiting);
            w.late_from = Some(w.files.len());
        }
    }

    /// The (source, target) pairs of edge-only groups that the kernel
    /// found different since the last call.
    pub(super) fn take_unsettled(&mut self) -> Vec<(PathBuf, PathBuf)> {
        std::mem::take(&mut self.unsettled)
    }

    /// How many groups every target of which is in `unsettled` (pairs
    /// taken with [`Executor::take_unsettled`]): the groups a plan that
    /// kept them drops as empty. Counted from the sources' planned
    /// numbers of targets, for a run that keeps no groups to look in (a
    /// target is in one group only, and found different at most once).
    pub(super) fn groups_emptied(&self, unsettled: &[(PathBuf, PathBuf)]) -> u64 {
        let mut lost: HashMap<&Path, usize> = HashMap::new();
        for (s, _) in unsettled {
            *lost.entry(s.as_path()).or_default() += 1;
        }
        lost.iter()
            .filter(|&(s, n)| self.split.get(*s) == Some(n))
            .count() as u64
    }

    /// Whether the filesystem of `path` is one whose space in use this
    /// run measures (see [`Executor::finish`]): where it cannot be told,
    /// it is taken to be.
    pub(super) fn measures(&self, path: &Path) -> bool {
        let dir = fs::OFlags::RDONLY | fs::OFlags::DIRECTORY | fs::OFlags::CLOEXEC;
        let Ok(fd) = fs::open(path, dir, fs::Mode::empty()) else {
            return true;
        };
        let key = match cowlink_sys::btrfs_fsid(fd.as_fd()) {
            Ok(id) => FsKey::Btrfs(id),
            Err(_) => match cowlink_sys::file_id(fd.as_fd()) {
                Ok(id) => FsKey::Dev(id.dev),
                Err(_) => return true,
            },
        };
        lock(&self.fs.used_before).used.contains_key(&key)
    }

    /// Measure the space given back and close the run.
    pub(super) fn finish(mut self) -> DedupeReport {
        self.report.cancelled = self.run.cancelled();
        let used_before = self
            .fs
            .used_before
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        self.report.measured = true;
        let shared_on: HashSet<FsKey> = self
            .shared_on
            .iter()
            .filter_map(|d| used_before.fs_of.get(d).copied())
            .collect();
        for (key, m) in &used_before.used {
            if !shared_on.contains(key) {
                continue;
            }
            match m
                .as_ref()
                .and_then(|(fd, before)| Some((in_use(fd)?, *before)))
            {
                Some((after, before)) if after <= before => {
                    self.report.bytes_reclaimed += before - after
                }
                Some((after, before)) => self.report.bytes_grown += after - before,
                None => self.report.measured = false,
            }
        }
        self.run.finish();
        self.report
    }
}

/// Read the space in use on `src`'s filesystem (device `dev`) unless it
/// was read already. Called before a group's first `FIDEDUPERANGE`; a group on
/// a new device waits here until its measure is taken, so no sharing there
/// comes before it. The `syncfs` also commits what the extent holders are
/// read from (Btrfs answers from its last commit).
fn measure_once(fs: &FsState, dev: u64, src: &OwnedFd) {
    let mut map = lock(&fs.used_before);
    if map.fs_of.contains_key(&dev) {
        return;
    }
    let key = match cowlink_sys::btrfs_fsid(src.as_fd()) {
        Ok(id) => FsKey::Btrfs(id),
        Err(_) => FsKey::Dev(dev),
    };
    map.fs_of.insert(dev, key);
    if let Entry::Vacant(slot) = map.used.entry(key) {
        let fd = rustix::io::fcntl_dupfd_cloexec(src, 0).ok();
        slot.insert(fd.and_then(|fd| in_use(&fd).map(|used| (fd, used))));
    }
}

/// Bytes in use on the filesystem of `fd`, after committing pending work:
/// on Btrfs its data, metadata and system bytes (`BTRFS_IOC_SPACE_INFO`),
/// since statfs there follows data alone and a dedupe that unshares
/// metadata from a snapshot grows the metadata; elsewhere statfs's blocks
/// not free.
fn in_use(fd: &OwnedFd) -> Option<u64> {
    cowlink_sys::sync_filesystem(fd.as_fd()).ok()?;
    match cowlink_sys::btrfs_space_used(fd.as_fd()) {
        Ok(used) => Some(used),
        Err(_) => {
            let s = fs::fstatvfs(fd).ok()?;
            Some(s.f_blocks.saturating_sub(s.f_bfree) * s.f_frsize)
        }
    }
}

/// Whether sharing a target would give its blocks back.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Proof {
    /// None of its extents is shared, or every holder is in its group.
    Freed,
    /// A holder outside its group keeps some of its blocks (the words say
    /// which); `outside`, the holders outside the group by (tree, inode)
    /// where Btrfs names them.
    Held {
        words: String,
        outside: Vec<(u64, u64)>,
    },
    /// Some extents are shared and the holders cannot be named.
    Unproven,
}

/// An open target: its path, descriptor and inode number.
type Live<'p> = (&'p PathBuf, OwnedFd, u64);

/// For each of `live` (targets of one group on device `dev`, whose source
/// `src` is inode `src_ino`), whether sharing it gives its blocks back,
/// from the extent maps of the group's files:
///
/// - no extent flagged shared: [`Proof::Freed`];
/// - Btrfs names the holders (root): [`Proof::Held`] when one of them is
///   neither the source nor a target of this batch that is itself not
///   held, else freed;
/// - otherwise, a shared extent that no other file of the group maps (the
///   source, or a target not held) is held by files outside the group:
///   held; if every shared extent is mapped by the group too, nobody can
///   say whether something outside also holds it: [`Proof::Unproven`].
///
/// The rules are applied until nothing changes: a target held elsewhere
/// keeps the extents it shares with the others. Targets of the group in
/// another batch of [`cowlink_sys::DEDUPE_MAX_DESTS`] count as outside: a
/// skip, never a growth.
fn prove(src: &OwnedFd, src_ino: u64, live: &[Live<'_>], dev: u64, fs: &FsState) -> Vec<Proof> {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum State {
        Freed,
        Pending,
        Held,
        Unknown,
    }
    // Per target: its shared extents as (physical, end), and every extent
    // it maps (for the overlap rule).
    let mut shared: Vec<Vec<(u64, u64)>> = Vec::with_capacity(live.len());
    let mut state: Vec<State> = Vec::with_capacity(live.len());
    // Per target: the bytes of its extents not marked shared (its own).
    let mut alone: Vec<u64> = Vec::with_capacity(live.len());
    // Every mapped range of the group: (physical, end, owner); the source
    // is owner `usize::MAX`.
    let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
    let mut any_shared = false;
    for (i, (_, fd, _)) in live.iter().enumerate() {
        let Ok(list) = extents_fd(fd.as_fd(), false) else {
            shared.push(Vec::new());
            state.push(State::Unknown);
            alone.push(0);
            continue;
        };
        alone.push(
            list.iter()
                .filter(|x| !x.is_shared() && x.has_address())
                .map(|x| x.length)
                .sum(),
        );
        let mine: Vec<(u64, u64)> = list
            .iter()
            .filter(|x| x.is_shared() && x.has_address())
            .map(|x| (x.physical, x.physical + x.length))
            .collect();
        ranges.extend(
            list.iter()
                .filter(|x| x.has_address())
                .map(|x| (x.physical, x.physical + x.length, i)),
        );
        state.push(if mine.is_empty() {
            State::Freed
        } else {
            State::Pending
        });
        any_shared |= !mine.is_empty();
        shared.push(mine);
    }
    let mut proofs: Vec<Proof> = vec![Proof::Unproven; live.len()];
    if !any_shared {
        for (p, st) in proofs.iter_mut().zip(&state) {
            if *st == State::Freed {
                *p = Proof::Freed;
            }
        }
        return proofs;
    }
    if let Ok(list) = extents_fd(src.as_fd(), false) {
        ranges.extend(
            list.iter()
                .filter(|x| x.has_address())
                .map(|x| (x.physical, x.physical + x.length, usize::MAX)),
        );
    }
    ranges.sort_unstable();
    let reach = reach(&ranges);
    // Btrfs, as root: the holders by name.
    let named: Vec<Option<HashSet<(u64, u64)>>> = live
        .iter()
        .zip(&shared)
        .zip(&state)
        .map(|(((_, fd, _), mine), st)| match st {
            State::Pending => {
                let starts: Vec<u64> = mine.iter().map(|&(p, _)| p).collect();
                named_holders(fd, &starts, dev, fs)
            }
            _ => None,
        })
        .collect();
    let root = named
        .iter()
        .any(Option::is_some)
        .then(|| cowlink_sys::btrfs_root_id(src.as_fd()).ok())
        .flatten();
    // Each target's own subvolume: a group may span several of one
    // filesystem, and inode numbers repeat between them. None for a
    // target of another filesystem (a hand-made plan's), whose numbers
    // name nothing here.
    let fsid = root.and_then(|_| cowlink_sys::btrfs_fsid(src.as_fd()).ok());
    let roots: Vec<Option<u64>> = live
        .iter()
        .map(|(_, fd, _)| {
            fsid.filter(|&id| cowlink_sys::btrfs_fsid(fd.as_fd()) == Ok(id))
                .and_then(|_| cowlink_sys::btrfs_root_id(fd.as_fd()).ok())
        })
        .collect();
    loop {
        let mut again = false;
        for i in 0..live.len() {
            if state[i] != State::Pending {
                continue;
            }
            let held = match (&named[i], root, roots[i]) {
                (Some(h), Some(root), Some(mine)) => {
                    // A target of this batch, in tree `r` (held or not).
                    let target = |r: u64, ino: u64, held: bool| {
                        live.iter()
                            .zip(&state)
                            .zip(&roots)
                            .any(|(((_, _, t), st), tr)| {
                                *t == ino && *tr == Some(r) && (held || *st != State::Held)
                            })
                    };
                    let member = |&(r, ino): &(u64, u64)| {
                        (r == root && ino == src_ino) || target(r, ino, false)
                    };
                    let mut outside: Vec<(u64, u64)> =
                        h.iter().filter(|x| !member(x)).copied().collect();
                    outside.sort_unstable();
                    outside.first().map(|&(r, ino)| {
                        let who = Holder {
                            root: r,
                            ino,
                            skipped: target(r, ino, true),
                        };
                        (
                            holder_words(&live[i].1, mine, who, outside.len(), alone[i]),
                            outside.clone(),
                        )
                    })
                }
                _ => {
                    let lone = shared[i]
                        .iter()
                        .filter(|&&(s, e)| {
                            !mapped_by_group(&ranges, &reach, (s, e), i, |j| {
                                state[j] == State::Held
                            })
                        })
                        .count();
                    (lone > 0).then(|| {
                        let words = format!(
                            "{} also held outside its group ({}, marked shared, that no other \
                             file of the group being shared maps): {}",
                            match alone[i] {
                                0 => "its blocks are",
                                _ => "some of its blocks are",
                            },
                            match lone {
                                1 => "1 extent".to_string(),
                                n => format!("{n} extents"),
                            },
                            would_free(alone[i], cowlink_sys::btrfs_fsid(src.as_fd()).is_ok())
                        );
                        (words, Vec::new())
                    })
                }
            };
            if let Some((words, outside)) = held {
                state[i] = State::Held;
                proofs[i] = Proof::Held { words, outside };
                again = true;
            }
        }
        if !again {
            break;
        }
    }
    for (i, st) in state.iter().enumerate() {
        proofs[i] = match st {
            State::Freed => Proof::Freed,
            State::Pending if named[i].is_some() && roots[i].is_some() => Proof::Freed,
            State::Pending | State::Unknown => Proof::Unproven,
            State::Held => continue,
        };
    }
    proofs
}

/// For `ranges` sorted by start: the largest end among each range and
/// those before it, so a search for overlaps can stop going back.
fn reach(ranges: &[(u64, u64, usize)]) -> Vec<u64> {
    ranges
        .iter()
        .scan(0, |m, r| {
            *m = (*m).max(r.1);
            Some(*m)
        })
        .collect()
}

/// Whether the physical range `s..e`, shared by target `me`, is also
/// mapped by another file of the group (the source, owner `usize::MAX`,
/// or a target `j` not `gone(j)`), or twice by `me` itself. `ranges` is
/// sorted by start, `reach` from [`reach`]: only ranges starting before
/// `e` are looked at, going back until none before can end after `s`.
fn mapped_by_group(
    ranges: &[(u64, u64, usize)],
    reach: &[u64],
    (s, e): (u64, u64),
    me: usize,
    gone: impl Fn(usize) -> bool,
) -> bool {
    let upto = ranges.partition_point(|r| r.0 < e);
    let mut own = 0;
    for k in (0..upto).rev() {
        if reach[k] <= s {
            break;
        }
        let (rs, re, owner) = ranges[k];
        if re <= s || rs >= e {
            continue;
        }
        if owner == me {
            own += 1;
            if own > 1 {
                return true;
            }
        } else if owner == usize::MAX || !gone(owner) {
            return true;
        }
    }
    false
}

/// The holders `(root, inode)` of the extents at the Btrfs addresses
/// `shared` of the file `fd` (on device `dev`), or `None` where the
/// filesystem does not name them (not Btrfs, not root) or the question
/// failed.
fn named_holders(
    fd: &OwnedFd,
    shared: &[u64],
    dev: u64,
    fs: &FsState,
) -> Option<HashSet<(u64, u64)>> {
    if lock(&fs.names_holders).get(&dev) == Some(&false) {
        return None;
    }
    let mut out = HashSet::new();
    for &addr in shared {
        let mut size = 64 << 10;
        let refs = loop {
            match cowlink_sys::btrfs_extent_holders(fd.as_fd(), addr, size) {
                Ok((_, missing)) if missing > 0 && size < cowlink_sys::BTRFS_LOGICAL_INO_MAX => {
                    size = (size + missing as usize + 4096).min(cowlink_sys::BTRFS_LOGICAL_INO_MAX)
                }
                // Too many holders to list in full: not proven.
                Ok((_, missing)) if missing > 0 => return None,
                Ok((refs, _)) => break refs,
                // The extent went away since the map was read.
                Err(rustix::io::Errno::NOENT) => break Vec::new(),
                Err(
                    rustix::io::Errno::NOTTY
                    | rustix::io::Errno::OPNOTSUPP
                    | rustix::io::Errno::PERM
                    | rustix::io::Errno::ACCESS
                    | rustix::io::Errno::INVAL,
                ) => {
                    lock(&fs.names_holders).insert(dev, false);
                    return None;
                }
                Err(_) => return None,
            }
        };
        out.extend(refs.into_iter().map(|r| (r.root, r.inode)));
    }
    lock(&fs.names_holders).insert(dev, true);
    Some(out)
}

/// A holder of a target's extent, outside its group.
struct Holder {
    /// Its tree (subvolume or snapshot).
    root: u64,
    /// Its inode number there.
    ino: u64,
    /// A target of the same group, itself skipped.
    skipped: bool,
}

/// In words: who else holds a target's blocks (`who`, the first of `count`
/// holders outside its group; the target is in tree `root`, open as `fd`,
/// and holds `alone` bytes of its own).
fn holder_words(fd: &OwnedFd, root: u64, who: Holder, count: usize, alone: u64) -> String {
    let Holder {
        root: r,
        ino,
        skipped,
    } = who;
    let more = match count {
        1 => String::new(),
        n => format!(" and {} more", n - 1),
    };
    let who = if r != root {
        format!("a snapshot or another subvolume (tree {r}, inode {ino}){more}")
    } else {
        // Btrfs gives the path from the subvolume's root.
        let name = match cowlink_sys::btrfs_ino_paths(fd.as_fd(), ino) {
            Ok(paths) if !paths.is_empty() => format!(
                "{} in this subvolume (inode {ino})",
                crate::name::quoted(std::path::Path::new(std::ffi::OsStr::from_bytes(&paths[0])))
            ),
            _ => format!("inode {ino} of this subvolume"),
        };
        match skipped {
            true => format!("{name}, a file of this group that is skipped itself{more}"),
            false => format!("{name}, outside this group{more}"),
        }
    };
    let which = match alone {
        0 => "its blocks are",
        _ => "some of its blocks are",
    };
    format!("{which} also held by {who}: {}", would_free(alone, true))
}

/// What sharing a target skipped as held elsewhere would give back, in
/// words: nothing, or the `alone` bytes it holds alone (its blocks held
/// elsewhere stay in use either way, and the sharing can cost metadata).
/// On Btrfs (`btrfs`) an extent is freed only whole, so sharing can also
/// free the parts of its extents no file references any more (an extent
/// partly overwritten), which no map shows.
fn would_free(alone: u64, btrfs: bool) -> String {
    match (alone, btrfs) {
        (0, _) => "sharing it would free nothing and could grow usage".into(),
        (n, false) => format!(
            "sharing it would free at most the {n} bytes it holds alone, and could grow usage"
        ),
        (n, true) => format!(
            "sharing it would free the {n} bytes it holds alone (and any part of its extents \
             nothing else references), and could grow usage"
        ),
    }
}

/// The files of `g` the plan took as already sharing the source's blocks
/// (its cluster, [`DedupeGroup::already_shared`]) that hold a target's
/// blocks outside the group (in `proofs`): added to `opened` and `stamps`
/// as targets of this batch (up to [`cowlink_sys::DEDUPE_MAX_DESTS`] of
/// them: a full batch takes them too, its calls split), and returned
/// with the stamps they were opened under, for the kernel's refusals to
/// be told apart as any target's are. Where Btrfs named the holders,
/// such a file is one of them (by tree and inode); where nothing named
/// them (XFS), it maps one of the shared extents of a target held.
///
/// Only a file of the source's filesystem (`src`, on device `dev`) is
/// taken: tree and inode numbers repeat on every other Btrfs
/// filesystem, and physical addresses on every other filesystem, so a
/// path of a hand-made plan elsewhere is never taken for a holder.
/// Never a store's object (`sources_only`: sources only), nor a file
/// this user may not change (the rule the plan's targets follow).
///
/// Such a file does not share the source's blocks, whatever the plan
/// said: its index entry kept a layout that another tool's dedupe (or a
/// run without the index) moved, leaving every time alone. Left out, the
/// target that shares its real blocks would be refused as held outside
/// its group, run after run, until the sampled recheck maps the file
/// again; shared with it, both give their blocks back. The kernel
/// compares each byte as for any target, and the proof is taken again
/// with it: a file not shown to hold a target's blocks is never added.
fn stale_mates<'g>(
    g: &'g DedupeGroup,
    (src, dev): (&OwnedFd, u64),
    proofs: &[Proof],
    opened: &mut Vec<Live<'g>>,
    stamps: &mut Vec<(FileStamp, u64)>,
    sources_only: &[PathBuf],
) -> Vec<(&'g PathBuf, Option<FileStamp>)> {
    let mut mates = Vec::new();
    if g.already_shared.is_empty() || !proofs.iter().any(|p| matches!(p, Proof::Held { .. })) {
        return mates;
    }
    // Holders Btrfs named; and the shared extents (physical start, end)
    // of the targets held where it named none.
    let mut named: HashSet<(u64, u64)> = HashSet::new();
    let mut unnamed: Vec<(u64, u64)> = Vec::new();
    for (p, (_, fd, _)) in proofs.iter().zip(opened.iter()) {
        match p {
            Proof::Held { outside, .. } if !outside.is_empty() => named.extend(outside),
            Proof::Held { .. } => {
                if let Ok(list) = extents_fd(fd.as_fd(), false) {
                    unnamed.extend(
                        list.iter()
                            .filter(|x| x.is_shared() && x.has_address())
                            .map(|x| (x.physical, x.physical + x.length)),
                    );
                }
            }
            _ => {}
        }
    }
    // Less the source's own blocks: a target that shares some of the
    // source's blocks and is held outside elsewhere makes every file of
    // the source's cluster overlap it, and such a file is no stale mate
    // (it was taken again, and shared for nothing, run after run).
    if !unnamed.is_empty() {
        if let Ok(list) = extents_fd(src.as_fd(), false) {
            let own: Vec<(u64, u64)> = list
                .iter()
                .filter(|x| x.has_address())
                .map(|x| (x.physical, x.physical + x.length))
                .collect();
            unnamed = less(&unnamed, &own);
        }
    }
    let overlaps = |fd: &OwnedFd| {
        extents_fd(fd.as_fd(), false).is_ok_and(|list| {
            list.iter().filter(|x| x.has_address()).any(|x| {
                let (s, e) = (x.physical, x.physical + x.length);
                unnamed.iter().any(|&(a, b)| s < b && a < e)
            })
        })
    };
    // The source's filesystem: a Btrfs one by its UUID (its subvolumes
    // have device numbers of their own), any other by its device.
    let fsid = cowlink_sys::btrfs_fsid(src.as_fd()).ok();
    let same_fs = |fd: &OwnedFd, d: u64| match fsid {
        Some(id) => cowlink_sys::btrfs_fsid(fd.as_fd()) == Ok(id),
        None => d == dev,
    };
    let euid = rustix::process::geteuid().as_raw();
    for m in &g.already_shared {
        if mates.len() >= cowlink_sys::DEDUPE_MAX_DESTS {
            break;
        }
        if sources_only.iter().any(|o| m.starts_with(o)) {
            continue;
        }
        let Ok(fd) = open_read(m) else { continue };
        let Ok(id) = cowlink_sys::file_id(fd.as_fd()) else {
            continue;
        };
        // Of the group's size and filesystem, and not a target already:
        // by device and inode (each Btrfs subvolume has a device number
        // of its own, and inode numbers repeat between them).
        if id.size != g.size
            || !same_fs(&fd, id.dev)
            || (opened.iter().zip(stamps.iter())).any(|(o, &(_, d))| o.2 == id.ino && d == id.dev)
        {
            continue;
        }
        let may_change = euid == 0
            || id.uid == euid
            || fs::accessat(fs::CWD, m, fs::Access::WRITE_OK, fs::AtFlags::EACCESS).is_ok();
        if !may_change {
            continue;
        }
        let holds = (!named.is_empty()
            && cowlink_sys::btrfs_root_id(fd.as_fd()).is_ok_and(|r| named.contains(&(r, id.ino))))
            || (!unnamed.is_empty() && overlaps(&fd));
        if holds {
            let stamp = FileStamp::of(&id);
            opened.push((m, fd, id.ino));
            stamps.push((stamp, id.dev));
            mates.push((m, Some(stamp)));
        }
    }
    mates
}

/// Why a path of the plan was not opened for sharing ([`open_planned`]).
enum NotPlanned {
    /// It no longer names the file planned, or that file changed: its
    /// stamp (or its size) is not the plan's.
    Changed,
    /// It could not be opened or examined, or the plan records no stamp
    /// for it.
    Failed(Error),
}

/// Open `path`, a file of `size` bytes in the plan, and check on the
/// descriptor that it is the file the plan named: its [`FileStamp`] is
/// `stamp` (returned with the descriptor and what `statx` says of it).
/// Everything done to the file afterwards goes through this
/// descriptor, so a rename after the check changes nothing.
fn open_planned(
    path: &Path,
    stamp: Option<FileStamp>,
    size: u64,
) -> Result<(OwnedFd, cowlink_sys::FileId, FileStamp), NotPlanned> {
    let op = Operation::Dedupe;
    let Some(stamp) = stamp else {
        return Err(NotPlanned::Failed(
            Error::new(op, ErrorKind::InvalidInput)
                .with_src(path)
                .with_reason(
                    "the plan does not record which file this path named (a plan made by hand \
                     or by an older version), so it is left as it is: plan again",
                ),
        ));
    };
    let failed = |e| NotPlanned::Failed(Error::from_errno(op, e).with_src(path));
    let fd = open_read(path).map_err(failed)?;
    let id = cowlink_sys::file_id(fd.as_fd()).map_err(failed)?;
    if FileStamp::of(&id) != stamp || id.size != size {
        return Err(NotPlanned::Changed);
    }
    Ok((fd, id, stamp))
}

/// Why the kernel refused one target of a `FIDEDUPERANGE` call
/// ([`refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// The target is no longer the file planned: changed.
    TargetChanged,
    /// The target is, but the source is not: the source changed.
    SourceChanged,
    /// Both are the files planned: an error of the call's own.
    Error,
}

/// What the kernel's error for one target (or its finding the target
/// different) means, given whether that target is still the file
/// planned (`target_planned`) and, asked only when it is, whether the
/// source is (`source_planned`). A source rewritten in place without a
/// change of size, after it was opened, differs from every target: it is
/// the file that changed, and the targets are not reported changed.
///
/// The kernel checks the source's size once per call, then each
/// target's range against the source's size as it is when that target's
/// turn comes: a source shrunk or replaced by another program during
/// the call has later targets refused one by one (`EINVAL`, a range
/// past the source's end) while the call itself succeeds. Those targets
/// are unchanged; the source is the file that changed, and is reported
/// so, never as an error.
fn refused(target_planned: bool, source_planned: impl FnOnce() -> bool) -> Refused {
    if !target_planned {
        Refused::TargetChanged
    } else if !source_planned() {
        Refused::SourceChanged
    } else {
        Refused::Error
    }
}

/// Carry out one group; returns the source's device once it was opened.
/// Targets of an edge-only group that differ from the source go to
/// `part.differ` (source, target), not to the report's `changed`. With
/// [`Proving::Sort`], targets not proven to give their blocks back are
/// skipped ([`SkipReason::HeldElsewhere`]) or handed back
/// (`part.unproven`).
fn dedupe_group(
    g: &DedupeGroup,
    part: &mut GroupPart,
    run: &Run,
    tally: &Counters<'_>,
    fs: &FsState,
    proving: Proving,
    learn: Option<&Learn>,
) -> Option<u64> {
    let op = Operation::Dedupe;
    let report = &mut part.report;
    let (src, dev, src_ino) = match open_planned(&g.source, g.source_stamp, g.size) {
        Ok((fd, id, _)) => (fd, id.dev, id.ino),
        Err(why) => {
            match why {
                NotPlanned::Changed => report.changed.push(g.source.clone()),
                NotPlanned::Failed(e) => report.errors.push(e),
            }
            // Done with, for the progress: none of its targets is shared.
            let n = g.targets.len() as u64;
            tally.done(n, g.size * n);
            return None;
        }
    };
    measure_once(fs, dev, &src);
    // With an index: the runs the targets will take. The plan's, or, for
    // a source the plan did not map (known from the index), mapped now,
    // before any target is shared: checked against the source's runs
    // when the run ends (see `Learn`), like the plan's.
    let runs = match (learn, g.source_stamp) {
        (Some(learn), Some(planned)) => {
            let planned_runs = lock(&learn.runs).remove(&planned);
            planned_runs.or_else(|| runs_of(&src))
        }
        _ => None,
    };
    // With an index: marked before anything of its filesystem is shared
    // (see `Indexes::sharing`).
    if let Some(learn) = learn {
        learn.ix.sharing(dev);
    }
    let mut done = 0u64;
    // Targets shared whole and still the files planned (with an index):
    // path, device, inode.
    let mut shared_whole: Vec<(&PathBuf, u64, u64, FileStamp)> = Vec::new();
    let targets: Vec<(&PathBuf, Option<FileStamp>)> = (g.targets.iter().enumerate())
        .map(|(i, t)| (t, g.target_stamp(i)))
        .collect();
    for batch in targets.chunks(cowlink_sys::DEDUPE_MAX_DESTS) {
        // Open every target of the batch: each must be the file planned.
        let mut opened: Vec<Live<'_>> = Vec::new();
        // Each target's stamp, and its device (with an index).
        let mut stamps: Vec<(FileStamp, u64)> = Vec::new();
        for &(t, stamp) in batch {
            match open_planned(t, stamp, g.size) {
                Ok((fd, id, stamp)) => {
                    // A target in another Btrfs subvolume has an index
                    // of its own.
                    if let (Some(learn), true) = (learn, id.dev != dev) {
                        learn.ix.sharing(id.dev);
                    }
                    opened.push((t, fd, id.ino));
                    stamps.push((stamp, id.dev));
                    continue;
                }
                Err(NotPlanned::Changed) => report.changed.push(t.clone()),
                Err(NotPlanned::Failed(e)) => report.errors.push(e),
            }
            // Done with, for the progress: it will not be shared.
            tally.done(1, g.size);
        }
        let mut live: Vec<(&PathBuf, OwnedFd)> = Vec::with_capacity(opened.len());
        // The stamp each target was opened under (the one planned), its
        // device and inode. (The sets of targets below are a few at a
        // time, each named by its one `&PathBuf` from the group: kept in
        // vectors, told apart by address, see `same`. Hashing a `Path`
        // hashes it component by component, and this is done for every
        // target of a run.)
        let mut opened_as: Vec<(&PathBuf, FileStamp, u64, u64)> = Vec::new();
        // Targets the kernel said it shared fewer bytes of than asked:
        // shared, but not known to be laid out as the source is.
        let mut short: Vec<&PathBuf> = Vec::new();
        let mut proofs = match proving {
            Proving::Sort => prove(&src, src_ino, &opened, dev, fs),
            Proving::Measured => vec![Proof::Freed; opened.len()],
        };
        // Files the plan took as already sharing the source's blocks and
        // found holding a target's: shared too (see `stale_mates`).
        let mates = stale_mates(
            g,
            (&src, dev),
            &proofs,
            &mut opened,
            &mut stamps,
            &fs.sources_only,
        );
        if !mates.is_empty() {
            // Work the plan's totals did not count.
            tally.more(mates.len() as u64, g.size * mates.len() as u64);
            if let Some(learn) = learn {
                for &(_, t_dev) in &stamps[stamps.len() - mates.len()..] {
                    if t_dev != dev {
                        learn.ix.sharing(t_dev);
                    }
                }
            }
            proofs = prove(&src, src_ino, &opened, dev, fs);
        }
        for (((t, fd, ino), proof), (stamp, t_dev)) in opened.into_iter().zip(proofs).zip(stamps) {
            match proof {
                Proof::Freed => {
                    if learn.is_some() {
                        opened_as.push((t, stamp, t_dev, ino));
                    }
                    live.push((t, fd))
                }
                Proof::Held { words: detail, .. } => {
                    // Done with, for the progress: it will not be shared.
                    tally.done(1, g.size);
                    // A stale mate left as it was stays what the plan
                    // counts it as: a file already shared, not a target.
                    if mates.iter().any(|(m, _)| *m == t) {
                        continue;
                    }
                    // Every block held elsewhere, though its index entry
                    // may say they are its own: such a claim is trusted,
                    // never mapped again (it spares no work), yet it
                    // decides which file of a group is the source, and a
                    // stale one kept a copy apart run after run. Learnt
                    // as it is, when it shares every block (mapped with
                    // its dirty pages written back, as the plan maps),
                    // and checked at the run's end as a source is.
                    if let Some(learn) = learn {
                        if let Some(runs) = all_shared_runs(&fd) {
                            learn.await_source(t, (t_dev, ino, stamp), runs, &[]);
                        }
                    }
                    report.skipped.push(SkippedTarget {
                        path: t.clone(),
                        reason: SkipReason::HeldElsewhere,
                        detail,
                    })
                }
                Proof::Unproven => part.unproven.push((t.clone(), stamp)),
            }
        }
        // The stamp `t` was planned with, and whether `fd` still has it.
        let planned_stamp = |t: &Path| -> Option<FileStamp> {
            batch
                .iter()
                .chain(&mates)
                .find(|(p, _)| p.as_path() == t)
                .and_then(|(_, s)| *s)
        };
        let still_planned = |fd: &OwnedFd, stamp: Option<FileStamp>| {
            cowlink_sys::file_id(fd.as_fd()).is_ok_and(|id| Some(FileStamp::of(&id)) == stamp)
        };
        // Targets a call shared some bytes of (with an index): whatever
        // else becomes of them, their blocks moved.
        let mut moved: Vec<&PathBuf> = Vec::new();
        // Whether the source was found changed under a call (reported
        // once, however many targets and chunks saw it).
        let mut source_changed = false;
        let mut off = 0u64;
        while off < g.size && !live.is_empty() && !run.cancelled() {
            let len = CHUNK.min(g.size - off);
            let mut keep = Vec::with_capacity(live.len());
            // One call per DEDUPE_MAX_DESTS targets: stale mates (see
            // `stale_mates`) can take a full batch past it.
            let mut rest = live;
            while !rest.is_empty() {
                let tail = rest.split_off(rest.len().min(cowlink_sys::DEDUPE_MAX_DESTS));
                let piece = std::mem::replace(&mut rest, tail);
                let dests: Vec<(rustix::fd::BorrowedFd<'_>, u64)> =
                    piece.iter().map(|(_, fd)| (fd.as_fd(), off)).collect();
                let results = cowlink_sys::fideduperange(src.as_fd(), off, len, &dests);
                drop(dests);
                match results {
                    Ok(results) => {
                        for ((t, fd), r) in piece.into_iter().zip(results) {
                            match r.status {
                                cowlink_sys::DedupeStatus::Same => {
                                    if r.bytes_deduped != len && !has(&short, t) {
                                        short.push(t);
                                    }
                                    if learn.is_some() && r.bytes_deduped > 0 && !has(&moved, t) {
                                        moved.push(t);
                                    }
                                    keep.push((t, fd))
                                }
                                // A source rewritten in place (same size)
                                // since it was opened differs from every
                                // target: it is the file changed, not them.
                                cowlink_sys::DedupeStatus::Differs => {
                                    match refused(still_planned(&fd, planned_stamp(t)), || {
                                        still_planned(&src, g.source_stamp)
                                    }) {
                                        Refused::SourceChanged => source_changed = true,
                                        _ if g.blake3.is_none() => {
                                            part.differ.push((g.source.clone(), t.clone()))
                                        }
                                        _ => report.changed.push(t.clone()),
                                    }
                                }
                                cowlink_sys::DedupeStatus::Error(e) => {
                                    match refused(still_planned(&fd, planned_stamp(t)), || {
                                        still_planned(&src, g.source_stamp)
                                    }) {
                                        Refused::TargetChanged => report.changed.push(t.clone()),
                                        Refused::SourceChanged => source_changed = true,
                                        Refused::Error => report.errors.push(
                                            Error::from_errno(op, e)
                                                .with_src(&g.source)
                                                .with_dst(t),
                                        ),
                                    }
                                }
                            }
                        }
                    }
                    // The source changed the same way: it is the one changed.
                    Err(_) if !still_planned(&src, g.source_stamp) => source_changed = true,
                    Err(e) => {
                        for (t, _) in piece {
                            report
                                .errors
                                .push(Error::from_errno(op, e).with_src(&g.source).with_dst(t));
                        }
                    }
                }
            }
            if source_changed && !report.changed.contains(&g.source) {
                report.changed.push(g.source.clone());
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
        part.mates += live
            .iter()
            .filter(|(t, _)| mates.iter().any(|(m, _)| m == t))
            .count() as u64;
        // Learnt under the stamp each target was opened with, the one
        // planned, which its index entry holds: its stamp is not taken
        // again. A write to it since moved its ctime (no caller can set
        // it back), so the next run finds the entry is not of the file
        // and reads the file again; what is learnt here is never
        // trusted of a changed file.
        if let Some(learn) = learn {
            let whole = |t: &PathBuf| !has(&short, t) && live.iter().any(|(l, _)| same(l, t));
            let of = |t: &PathBuf| {
                let &(t, was, t_dev, ino) = opened_as.iter().find(|o| same(o.0, t))?;
                Some((t, t_dev, ino, was))
            };
            shared_whole.extend(moved.iter().filter(|t| whole(t)).filter_map(|t| of(t)));
            let partly: Vec<_> = (moved.iter())
                .filter(|t| !whole(t))
                .filter_map(|t| of(t))
                .collect();
            learn.moved(&partly);
        }
    }
    if let Some(learn) = learn {
        match (g.source_stamp, runs) {
            // The source and the targets shared whole now share every
            // block, on the source's runs (see `Learn`): learnt once the
            // source, mapped again when the run ends, is found still the
            // file planned on those runs.
            (Some(planned), Some(runs)) if !shared_whole.is_empty() => {
                learn.await_source(&g.source, (dev, src_ino, planned), runs, &shared_whole)
            }
            // Moved onto runs not known.
            _ => learn.moved(&shared_whole),
        }
    }
    report.targets_deduped += done;
    report.bytes_compared += g.size * done;
    Some(dev)
}

/// The parts of the ranges `from` (start, end) outside every range of
/// `minus`.
fn less(from: &[(u64, u64)], minus: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(start, end) in from {
        let mut pieces = vec![(start, end)];
        for &(a, b) in minus {
            pieces = pieces
                .into_iter()
                .flat_map(|(s, e)| {
                    if b <= s || e <= a {
                        return vec![(s, e)];
                    }
                    [(s, a.min(e)), (b.max(s), e)]
                        .into_iter()
                        .filter(|(x, y)| x < y)
                        .collect()
                })
                .collect();
        }
        out.extend(pieces);
    }
    out
}

/// Whether `a` and `b` are the same name of a group's: the one
/// `&PathBuf` each target is known by while its group runs.
fn same(a: &PathBuf, b: &PathBuf) -> bool {
    std::ptr::eq(a, b)
}

/// Whether `set` holds the name `t` (see [`same`]).
fn has(set: &[&PathBuf], t: &PathBuf) -> bool {
    set.iter().any(|s| same(s, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded random facts of a few files over two passes: after
    /// [`last_group_wins`], a file the second pass taught of has only its
    /// facts, any other keeps its first pass's, and order is kept.
    #[test]
    fn the_regrouping_replaces_what_earlier_groups_taught() {
        for seed in 1..=300u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let fact = |rng: &mut fastrand::Rng| Relaid {
                dev: rng.u64(1..3),
                dir: 7,
                ino: rng.u64(1..6),
                stamp: FileStamp(rng.u64(..)),
                shared: rng.u64(..3),
            };
            let first: Vec<Relaid> = (0..rng.usize(..10)).map(|_| fact(&mut rng)).collect();
            let second: Vec<Relaid> = (0..rng.usize(..4)).map(|_| fact(&mut rng)).collect();
            let all: Vec<Relaid> = first.iter().chain(&second).copied().collect();
            let late = (!second.is_empty() || rng.bool()).then_some(first.len());
            let got = last_group_wins(all.clone(), late);
            let in_second = |r: &Relaid| second.iter().any(|s| (s.dev, s.ino) == (r.dev, r.ino));
            let want: Vec<Relaid> = match late {
                None => all,
                Some(_) => (first.iter().filter(|r| !in_second(r)))
                    .chain(&second)
                    .copied()
                    .collect(),
            };
            let key = |r: &Relaid| (r.dev, r.dir, r.ino, r.stamp, r.shared);
            assert_eq!(
                got.iter().map(key).collect::<Vec<_>>(),
                want.iter().map(key).collect::<Vec<_>>(),
                "seed {seed}"
            );
        }
    }

    /// Seeded random ranges: what `less` keeps is exactly the bytes of
    /// `from` in no range of `minus`, block by block.
    #[test]
    fn less_keeps_exactly_what_no_subtracted_range_covers() {
        for seed in 1..=300u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut ranges = |n: usize| -> Vec<(u64, u64)> {
                (0..n)
                    .map(|_| {
                        let s = rng.u64(..64);
                        (s, s + rng.u64(1..16))
                    })
                    .collect()
            };
            let (from, minus) = (ranges(3), ranges(4));
            let got = less(&from, &minus);
            for x in 0..96u64 {
                let inside = |r: &[(u64, u64)]| r.iter().filter(|&&(a, b)| a <= x && x < b).count();
                let want = match inside(&minus) {
                    0 => inside(&from),
                    _ => 0,
                };
                assert_eq!(
                    inside(&got),
                    want,
                    "seed {seed} at {x}: {from:?} - {minus:?} = {got:?}"
                );
            }
        }
    }

    #[test]
    fn a_target_refused_because_the_source_changed_is_no_error() {
        // The target changed: the source is not even asked about.
        let asked = std::cell::Cell::new(false);
        let source = |planned: bool| {
            let asked = &asked;
            move || {
                asked.set(true);
                planned
            }
        };
        assert_eq!(refused(false, source(false)), Refused::TargetChanged);
        assert!(!asked.get());
        // The target is the file planned, the source is not: the source
        // shrank or was replaced during the call.
        assert_eq!(refused(true, source(false)), Refused::SourceChanged);
        assert!(asked.get());
        // Both are: the kernel's refusal is an error of its own.
        assert_eq!(refused(true, source(true)), Refused::Error);
    }

    #[test]
    fn a_stamp_tells_every_identity_field_apart_and_reads_back_strictly() {
        let id = cowlink_sys::FileId {
            dev: 2049,
            ino: 131,
            size: 4096,
            mtime_ns: 1_700_000_000_000_000_001,
            ctime_ns: 1_700_000_000_000_000_002,
            btime_ns: Some(1_600_000_000_000_000_000),
            ..Default::default()
        };
        let base = FileStamp::of(&id);
        let others = [
            cowlink_sys::FileId { dev: 2050, ..id },
            cowlink_sys::FileId { ino: 132, ..id },
            cowlink_sys::FileId { size: 4097, ..id },
            cowlink_sys::FileId {
                mtime_ns: id.mtime_ns + 1,
                ..id
            },
            cowlink_sys::FileId {
                ctime_ns: id.ctime_ns + 1,
                ..id
            },
            cowlink_sys::FileId {
                btime_ns: None,
                ..id
            },
            cowlink_sys::FileId {
                btime_ns: Some(0),
                ..id
            },
        ];
        for o in &others {
            assert_ne!(FileStamp::of(o), base, "{o:?}");
        }
        // Mode, owner and blocks are not identity (ctime covers a change).
        let same = cowlink_sys::FileId {
            mode: 0o100600,
            uid: 7,
            blocks: 99,
            ..id
        };
        assert_eq!(FileStamp::of(&same), base);

        let text = serde_json::to_string(&base).unwrap();
        assert_eq!(text.len(), 18, "{text}");
        assert_eq!(serde_json::from_str::<FileStamp>(&text).unwrap(), base);
        for bad in [
            "\"\"",
            "\"123\"",
            "\"0123456789abcdef0\"",
            "\"0123456789abcdeg\"",
            "\"+123456789abcdef\"",
            "12",
            "null",
        ] {
            assert!(serde_json::from_str::<FileStamp>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn targets_kept_keep_their_own_stamps() {
        let mut g = DedupeGroup {
            size: 1,
            blake3: None,
            source: "s".into(),
            targets: ["a", "b", "c", "d"].map(PathBuf::from).into(),
            already_shared: Vec::new(),
            reclaimable: 0,
            source_stamp: Some(FileStamp(9)),
            target_stamps: vec![FileStamp(1), FileStamp(2), FileStamp(3), FileStamp(4)],
        };
        g.retain_targets(|t| t != Path::new("b"));
        assert_eq!(g.targets, ["a", "c", "d"].map(PathBuf::from));
        assert_eq!(g.target_stamps, [FileStamp(1), FileStamp(3), FileStamp(4)]);
        assert_eq!(g.target_stamp(1), Some(FileStamp(3)));
        assert_eq!(g.target_stamp(3), None);
        // Fewer stamps than targets (a hand-made plan): a target without
        // one never borrows the next one's.
        g.target_stamps.truncate(1);
        g.retain_targets(|t| t != Path::new("a"));
        assert_eq!(g.targets, ["c", "d"].map(PathBuf::from));
        assert!(g.target_stamps.is_empty());
        assert_eq!(g.target_stamp(0), None);
    }

    fn sorted(mut r: Vec<(u64, u64, usize)>) -> (Vec<(u64, u64, usize)>, Vec<u64>) {
        r.sort_unstable();
        let m = reach(&r);
        (r, m)
    }

    #[test]
    fn a_shared_range_is_the_group_s_when_another_member_maps_any_of_it() {
        let src = usize::MAX;
        // Target 0 maps 100..200 and 500..600; target 1 maps 150..160;
        // the source maps 900..1000.
        let (r, m) = sorted(vec![
            (100, 200, 0),
            (500, 600, 0),
            (150, 160, 1),
            (900, 1000, src),
        ]);
        let none = |_: usize| false;
        assert!(
            mapped_by_group(&r, &m, (100, 200), 0, none),
            "target 1 inside"
        );
        assert!(!mapped_by_group(&r, &m, (500, 600), 0, none), "nobody else");
        assert!(mapped_by_group(&r, &m, (950, 960), 0, none), "the source");
        // Target 1 skipped itself: it no longer counts.
        assert!(!mapped_by_group(&r, &m, (100, 200), 0, |j| j == 1));
        // Ends are exclusive: touching is not overlapping.
        assert!(!mapped_by_group(&r, &m, (160, 170), 0, none));
        assert!(mapped_by_group(&r, &m, (159, 170), 0, none));

        // A long range that starts first is still found from a late query.
        let (r, m) = sorted(vec![(0, 1000, 2), (300, 310, 0), (400, 410, 3)]);
        assert!(mapped_by_group(&r, &m, (300, 310), 0, none));
        assert!(!mapped_by_group(&r, &m, (300, 310), 0, |j| j == 2));
        // The same blocks twice in one file: both references leave with it.
        let (r, m) = sorted(vec![(0, 100, 0), (0, 100, 0)]);
        assert!(mapped_by_group(&r, &m, (0, 100), 0, none));
    }
}
