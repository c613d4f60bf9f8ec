//! The planning stages as functions over groups of candidates: each takes
//! what the last one left and narrows it, without touching a filesystem
//! (the walk, the layouts and the hashes are read by `plan`, which calls
//! these in order). Unit-tested on made-up candidates.
//!
//! Every candidate lives in one dense array for the whole plan, sorted in
//! place so that each size group, and each cluster within it, is a
//! contiguous [`Span`]; the stages pass spans, never copies or vectors of
//! their own per group. Names are kept apart ([`Names`]): each directory's
//! path once, each file's own name in one arena. After clustering each
//! candidate is cut to what the later stages read ([`Member`]). A vector
//! per group and per cluster, with a whole path per candidate, cost heap
//! blocks per file and held the list one and a half times while grouping
//! by size: over 223,547 real files on XFS the plan's peak RSS went from
//! 112 to 62 MiB, the same plan byte for byte (docs/benchmarks.md, "Peak memory").

use rayon::iter::{IndexedParallelIterator, IntoParallelRefIterator, ParallelIterator};
use rayon::slice::ParallelSliceMut;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::{index, DedupeGroup, FileStamp};
use crate::extents::Extent;

/// Where the candidates' names are kept: each directory's path once, by
/// the walk's directory id, and each candidate's own name in one byte
/// arena. A path per candidate (its directory's path again in each, and a
/// heap block each) was 19 MB of a plan over 223,547 real files with
/// absolute paths; the names alone, back to back, are a fifth of that.
#[derive(Debug, Default, Clone)]
pub(super) struct Names {
    dirs: Vec<Option<Box<Path>>>,
    /// Each directory's path as a key whose byte order is the order of
    /// paths (by the same id; see [`order_key`]).
    keys: Vec<Box<[u8]>>,
    /// Each directory's device and inode (by the same id), for the index.
    dir_ids: Vec<(u64, u64)>,
    /// Per directory (by the same id): what the walk met in it
    /// ([`Met`]).
    met: Vec<Met>,
    bytes: Vec<u8>,
}

/// What the walk met in one directory, for telling whether its record
/// would be rebuilt into the one stored (see `record_walk`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Met {
    /// Candidates met (names: two hard links count twice).
    pub names: u32,
    /// Those the index held exactly as they are now.
    pub known: u32,
    /// The sum of [`index::ino_mark`] over the inodes of those known: a
    /// record holds one entry per inode, so two names of one inode would
    /// count for a file gone were the counts alone compared.
    pub marks: u64,
}

/// A candidate's name in [`Names`]: its directory and its own name, or,
/// for a file given as a walk root, its whole path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Name {
    at: u64,
    len: u32,
    /// The directory's id, or [`Name::ROOT`].
    dir: u32,
}

impl Name {
    /// No directory: the name is the whole path (a file given as a root).
    const ROOT: u32 = u32::MAX;
}

impl Names {
    /// Record directory `id`'s path (the walk's dense id), and its device
    /// and inode.
    pub fn dir(&mut self, id: usize, path: &Path, dev: u64, ino: u64) {
        if self.dirs.len() <= id {
            self.dirs.resize(id + 1, None);
            self.keys.resize(id + 1, Box::default());
            self.dir_ids.resize(id + 1, (0, 0));
            self.met.resize(id + 1, Met::default());
        }
        self.dirs[id] = Some(path.into());
        self.keys[id] = order_key(path);
        self.dir_ids[id] = (dev, ino);
    }

    /// The directories recorded: (device, inode) and path.
    pub fn dirs(&self) -> impl Iterator<Item = ((u64, u64), &Path)> {
        self.dirs_met().map(|(id, p, _)| (id, p))
    }

    /// [`Names::dirs`], each with what the walk met in it
    /// ([`Names::met`]).
    pub fn dirs_met(&self) -> impl Iterator<Item = ((u64, u64), &Path, Met)> {
        self.dir_ids
            .iter()
            .zip(&self.dirs)
            .zip(
                self.met
                    .iter()
                    .copied()
                    .chain(std::iter::repeat(Met::default())),
            )
            .filter_map(|((&id, p), m)| Some((id, p.as_deref()?, m)))
    }

    /// Count a candidate, inode `ino`, met in directory `dir` (the walk's
    /// id), `known` if the index held it exactly as it is now.
    pub fn met(&mut self, dir: usize, ino: u64, known: bool) {
        if self.met.len() <= dir {
            self.met.resize(dir + 1, Met::default());
        }
        let m = &mut self.met[dir];
        m.names = m.names.saturating_add(1);
        if known {
            m.known = m.known.saturating_add(1);
            m.marks = m.marks.wrapping_add(index::ino_mark(ino));
        }
    }

    /// The device and inode of a name's directory (`None` for a name
    /// given as a root).
    pub fn dir_key(&self, n: Name) -> Option<(u64, u64)> {
        match n.dir {
            Name::ROOT => None,
            d => self.dir_ids.get(d as usize).copied(),
        }
    }

    /// The device and inode of the directory of walk id `dir`.
    pub fn dir_key_of(&self, dir: u32) -> Option<(u64, u64)> {
        self.dir_ids.get(dir as usize).copied()
    }

    /// For a name given as a root (a whole path): its directory's device
    /// and inode, if the file there is still inode `ino` on that device
    /// (a file on another device than its directory is not indexed).
    pub fn root_dir_key(&self, n: Name, ino: u64) -> Option<(u64, u64)> {
        if n.dir != Name::ROOT {
            return None;
        }
        let path = self.own(n);
        let parent = match path.parent()? {
            p if p.as_os_str().is_empty() => Path::new("."),
            p => p,
        };
        // Followed, as the path's own lookup follows it (a root given as
        // `link/`): the record is the directory's, not the link's.
        let dir = cowlink_sys::stat(parent).ok()?;
        let file = cowlink_sys::lstat(path).ok()?;
        (file.st_ino == ino && file.st_dev == dir.st_dev).then_some((dir.st_dev, dir.st_ino))
    }

    /// Keep `name`, found in directory `dir` (`None`: `name` is a whole
    /// path, given as a root).
    pub fn push(&mut self, dir: Option<usize>, name: &OsStr) -> Name {
        let at = self.bytes.len() as u64;
        self.bytes.extend_from_slice(name.as_bytes());
        let dir = dir.map_or(Name::ROOT, |d| {
            u32::try_from(d).expect("fewer than 2^32 directories")
        });
        Name {
            at,
            len: u32::try_from(name.len()).expect("a name under 4 GiB"),
            dir,
        }
    }

    /// Drop the spare room the arena grew with.
    pub fn shrink(&mut self) {
        self.bytes.shrink_to_fit();
    }

    fn own(&self, n: Name) -> &Path {
        Path::new(OsStr::from_bytes(
            &self.bytes[n.at as usize..n.at as usize + n.len as usize],
        ))
    }

    fn dir_of(&self, n: Name) -> Option<&Path> {
        match n.dir {
            Name::ROOT => None,
            d => self.dirs[d as usize].as_deref(),
        }
    }

    /// The whole path, without spare room (a plan's groups keep every
    /// path they are given; a join left up to as much again unused).
    pub fn path(&self, n: Name) -> PathBuf {
        let mut p = PathBuf::with_capacity(self.path_len(n));
        if let Some(d) = self.dir_of(n) {
            p.push(d);
        }
        p.push(self.own(n));
        p
    }

    /// Per device, the path of its shortest name among `names` (device,
    /// name), the first met of equal ones. Names of one directory in a
    /// row (the walk's order) share the directory's length, looked up
    /// once: a lookup per name (into each directory's path) took 5 ms
    /// over 148,716 names.
    pub fn shortest_per_device(
        &self,
        names: impl Iterator<Item = (u64, Name)>,
    ) -> HashMap<u64, PathBuf> {
        let mut best: HashMap<u64, (usize, Name)> = HashMap::new();
        let keep = |best: &mut HashMap<u64, (usize, Name)>, dev: u64, len: usize, n: Name| {
            let e = best.entry(dev).or_insert((len, n));
            if len < e.0 {
                *e = (len, n);
            }
        };
        // The directory of the last name and its part of the length; the
        // shortest of the current run of one device.
        let mut dir: Option<(u32, usize)> = None;
        let mut run: Option<(u64, usize, Name)> = None;
        for (dev, n) in names {
            let dir_len = match dir {
                Some((d, l)) if d == n.dir => l,
                _ => {
                    let l = self.path_len(n) - n.len as usize;
                    dir = Some((n.dir, l));
                    l
                }
            };
            let len = dir_len + n.len as usize;
            match &mut run {
                Some(r) if r.0 == dev => {
                    if len < r.1 {
                        *r = (dev, len, n);
                    }
                }
                _ => {
                    if let Some((d, l, m)) = run.replace((dev, len, n)) {
                        keep(&mut best, d, l, m);
                    }
                }
            }
        }
        if let Some((d, l, m)) = run {
            keep(&mut best, d, l, m);
        }
        best.into_iter()
            .map(|(d, (_, n))| (d, self.path(n)))
            .collect()
    }

    /// The length in bytes of the whole path (a separator is added only
    /// where the directory's path does not end in one, as `push` does).
    pub fn path_len(&self, n: Name) -> usize {
        match self.dir_of(n) {
            Some(d) => {
                let d = d.as_os_str().as_bytes();
                d.len() + usize::from(!d.ends_with(b"/")) + n.len as usize
            }
            None => n.len as usize,
        }
    }

    fn components(&self, n: Name) -> impl Iterator<Item = Component<'_>> {
        let dir = self.dir_of(n).map(Path::components).into_iter().flatten();
        dir.chain(self.own(n).components())
    }

    /// The order of the whole paths (as `Path`s compare), without
    /// building them. Names in two directories compare by their
    /// directories' keys ([`order_key`]) and then their own names; a
    /// name given as a root (a whole path) by components. Walking the
    /// components of both paths for every comparison was most of an
    /// unchanged rerun's planning after the walk (clusters of a file's
    /// copies, each sorted by path).
    pub fn cmp(&self, a: Name, b: Name) -> Ordering {
        if a.dir == b.dir {
            return self.own(a).cmp(self.own(b));
        }
        match (self.keys.get(a.dir as usize), self.keys.get(b.dir as usize)) {
            (Some(ka), Some(kb)) if a.dir != Name::ROOT && b.dir != Name::ROOT => {
                let n = ka.len().min(kb.len());
                match ka[..n].cmp(&kb[..n]) {
                    Ordering::Equal => {
                        // One directory's key is the start of the other's:
                        // the rest of each path, own name included.
                        let own = |x: Name| [&[0, NORMAL][..], self.own(x).as_os_str().as_bytes()];
                        let rest_a = own(a);
                        let rest_b = own(b);
                        let ta = ka[n..].iter().chain(rest_a.iter().flat_map(|s| s.iter()));
                        let tb = kb[n..].iter().chain(rest_b.iter().flat_map(|s| s.iter()));
                        ta.cmp(tb)
                    }
                    o => o,
                }
            }
            _ => self.components(a).cmp(self.components(b)),
        }
    }
}

/// The tag of a plain name in an [`order_key`].
const NORMAL: u8 = 5;

/// `path` as bytes whose order is the order of paths as `Path`s compare
/// them (component by component, each component's kind first, as
/// `Component` orders them, then its bytes): each component as a tag
/// byte and its bytes, separated by a 0 byte, which no name holds, so a
/// component that is the start of another sorts first.
fn order_key(path: &Path) -> Box<[u8]> {
    let mut key = Vec::with_capacity(path.as_os_str().len() + 8);
    for (i, c) in path.components().enumerate() {
        if i > 0 {
            key.push(0);
        }
        let (tag, bytes): (u8, &[u8]) = match c {
            Component::Prefix(p) => (1, p.as_os_str().as_bytes()),
            Component::RootDir => (2, b""),
            Component::CurDir => (3, b""),
            Component::ParentDir => (4, b""),
            Component::Normal(n) => (NORMAL, n.as_bytes()),
        };
        key.push(tag);
        key.extend_from_slice(bytes);
    }
    key.into_boxed_slice()
}

/// A candidate file during planning.
#[derive(Debug, Clone, Default)]
pub(super) struct Cand {
    pub name: Name,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// A fingerprint of the logical→physical runs when every extent is
    /// shared (else `None`), unwritten ones left out as holes: 64 bits
    /// of BLAKE3 over the runs. Two files
    /// with equal fingerprints are taken to hold the same blocks; a false
    /// match (2^-64 within one size group) only makes a duplicate look
    /// already shared, and `FIDEDUPERANGE` compares whatever is shared.
    /// A fingerprint rather than the runs: the index keeps it in 8 bytes,
    /// and a candidate holds no heap block for it.
    pub shared: Option<std::num::NonZeroU64>,
    /// The fingerprint of the runs whether shared or not, where every
    /// extent has its blocks (none delayed or inline); 0 when not known.
    /// Unwritten extents are left out, as holes (see [`layout_facts`]). A target shared whole with this file as its source
    /// takes these runs (see `execute::Learn`).
    pub runs: u64,
    /// Bytes in extents not flagged shared.
    pub exclusive: u64,
    /// BLAKE3 of the whole file for files of at most two edges; for larger
    /// ones, of their two edges, then (for a plan that is hashed whole) of
    /// the whole file. Taken while the file was open for its layout where
    /// possible (one open per small file); a larger file not sharing all
    /// its blocks is a cluster of its own in a group of two or more, so
    /// its edges are needed whatever the others hold. `None` until read,
    /// or when reading failed.
    pub hash: Option<[u8; 32]>,
    /// The data is inline in metadata (no extent to share).
    pub inline: bool,
    /// The layout was read (during the walk, for small files).
    pub mapped: bool,
    /// The caller may make this file share another's blocks (root, its
    /// owner, or write permission); otherwise it can only be a source.
    pub may_change: bool,
    /// What the plan knows of it came from the index: nothing of the file
    /// was read.
    pub known: bool,
    /// The whole-file hash of a larger file, from the index.
    pub whole: Option<Box<[u8; 32]>>,
    /// Which file it is (from the walk's `statx`, on its own device): the
    /// plan records it for execution to check.
    pub stamp: FileStamp,
    /// Found written or replaced since the walk when its layout was
    /// read: dropped before clustering.
    pub changed: bool,
}

/// A file's times as the walk saw them, in nanoseconds: 24 bytes, where
/// an `Option` birth time would take 32 (one is held per candidate
/// through the walk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Times {
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// [`Times::NO_BIRTH`] where the filesystem gives none.
    btime_ns: i64,
}

impl Times {
    /// No birth time: no time `statx` gives is this far back (it would
    /// not fit 64 bits of nanoseconds).
    const NO_BIRTH: i64 = i64::MIN;

    pub fn new(mtime_ns: i64, ctime_ns: i64, btime_ns: Option<i64>) -> Times {
        Times {
            mtime_ns,
            ctime_ns,
            btime_ns: btime_ns.unwrap_or(Times::NO_BIRTH),
        }
    }

    /// The birth time, where the filesystem gives one.
    pub fn btime_ns(&self) -> Option<i64> {
        (self.btime_ns != Times::NO_BIRTH).then_some(self.btime_ns)
    }
}

/// A contiguous logical → physical run of a file's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(super) struct Run {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    /// Where the run starts inside a compressed Btrfs extent, when not at
    /// its start ([`crate::extents::Encoded::offset`]; 0 otherwise, and
    /// where it is not known: without root). FIEMAP gives every part of
    /// a compressed extent the extent's address, so two files holding
    /// different parts of one, of one length at one offset, would
    /// otherwise have one fingerprint and be taken as copies.
    pub at: u64,
}

/// A run of consecutive indices: candidates of one size group or one
/// cluster in [`Clusters::files`], or clusters of one group in
/// [`Clusters::clusters`]. Half the size of a `Range<usize>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// The indices `start..end`.
    pub fn new(start: usize, end: usize) -> Span {
        let idx = |i: usize| u32::try_from(i).expect("fewer than 2^32 candidates");
        Span {
            start: idx(start),
            end: idx(end),
        }
    }

    /// The indices, to slice with.
    pub fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    /// The first index.
    pub fn first(self) -> usize {
        self.start as usize
    }

    /// How many indices.
    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }
}

/// Fill `shared`, `exclusive` and `inline` from a file's extents.
pub(super) fn layout_facts(list: &[Extent], c: &mut Cand) {
    let mut runs: Vec<Run> = Vec::new();
    let mut all_shared = !list.is_empty();
    let mut all_placed = !list.is_empty();
    c.inline = list.iter().any(Extent::is_inline);
    for x in list {
        let at = x.encoded.map_or(0, |e| e.offset);
        // Unwritten (preallocated) blocks read as zeros and hold no data:
        // taken as a hole. Sharing gives nothing back there on XFS (a
        // target keeps its own unwritten blocks), so copies once shared
        // would otherwise look apart and be shared again every run; on
        // Btrfs a first sharing takes them along all the same.
        if x.is_unwritten() && x.has_address() && !x.is_inline() {
            continue;
        }
        if !x.has_address() || x.is_unwritten() || x.is_inline() {
            all_placed = false;
        }
        if !x.is_shared() || !x.has_address() || x.is_unwritten() {
            all_shared = false;
            c.exclusive += x.length;
        }
        match runs.last_mut() {
            Some(r)
                if r.logical + r.length == x.logical
                    && r.physical + r.length == x.physical
                    && r.at == 0
                    && at == 0 =>
            {
                r.length += x.length
            }
            _ => runs.push(Run {
                logical: x.logical,
                physical: x.physical,
                length: x.length,
                at,
            }),
        }
    }
    let fp = fingerprint(&runs);
    c.shared = std::num::NonZeroU64::new(fp).filter(|_| all_shared);
    c.runs = if all_placed { fp } else { 0 };
}

/// 64 bits of BLAKE3 over `runs`, never 0 (see [`Cand::runs`]).
pub(super) fn fingerprint(runs: &[Run]) -> u64 {
    let mut h = blake3::Hasher::new();
    for r in runs {
        h.update(&r.logical.to_le_bytes());
        h.update(&r.physical.to_le_bytes());
        // A part of a compressed extent past its start: its length with
        // the top bit set (no length has it), then where it starts. Every
        // other run hashes as it always did, so indexed fingerprints
        // stay valid.
        match r.at {
            0 => h.update(&r.length.to_le_bytes()),
            at => h
                .update(&(r.length | 1 << 63).to_le_bytes())
                .update(&at.to_le_bytes()),
        };
    }
    let mut b = [0; 8];
    b.copy_from_slice(&h.finalize().as_bytes()[..8]);
    u64::from_le_bytes(b).max(1)
}

/// One inode is one file: keep the name that sorts first (it may change
/// only if every name may). Returns how many names were dropped.
pub(super) fn one_per_inode(files: &mut Vec<Cand>, names: &Names) -> u64 {
    // Only the (device, inode) keys are sorted, with each file's place:
    // a candidate is large (about 180 bytes), and moving them through a
    // sort took most of this step (15-20 ms of an unchanged 550 ms
    // rerun over 148,716 files on XFS; 8-10 ms now). The files stay
    // where they are; `by_size` puts them in order next.
    let mut keys: Vec<(u64, u64, u32)> = files
        .par_iter()
        .enumerate()
        .map(|(i, c)| (c.dev, c.ino, i as u32))
        .collect();
    keys.par_sort_unstable();
    let mut extra = Vec::new();
    let mut start = 0;
    while start < keys.len() {
        let (dev, ino, _) = keys[start];
        let end = start + keys[start..].partition_point(|k| (k.0, k.1) == (dev, ino));
        if end - start > 1 {
            let run = &keys[start..end];
            let first = run
                .iter()
                .map(|k| k.2 as usize)
                .min_by(|&a, &b| names.cmp(files[a].name, files[b].name))
                .unwrap_or(start);
            // A file that may not change under one of its names (a store
            // object met again through a path given to dedupe) may not
            // change at all.
            files[first].may_change = run.iter().all(|k| files[k.2 as usize].may_change);
            extra.extend(run.iter().map(|k| k.2 as usize).filter(|&i| i != first));
        }
        start = end;
    }
    drop(keys);
    if extra.is_empty() {
        return 0;
    }
    let mut gone = vec![false; files.len()];
    for &i in &extra {
        gone[i] = true;
    }
    let mut flags = gone.into_iter();
    files.retain(|_| !flags.next().unwrap_or(false));
    extra.len() as u64
}

/// Keep the files with a partner of the same device and size, in place:
/// sorted by device, size and inode, lone files dropped. Returns the size
/// groups (two or more files each, in inode order) as spans of `files`.
pub(super) fn by_size(files: &mut Vec<Cand>) -> Vec<Span> {
    files.par_sort_unstable_by_key(|c| (c.dev, c.size, c.ino));
    partnered(files)
}

/// With `files` sorted by device and size: drop the lone ones, return the
/// spans of the rest.
fn partnered(files: &mut Vec<Cand>) -> Vec<Span> {
    let key = |c: &Cand| (c.dev, c.size);
    let mut keep = vec![false; files.len()];
    let mut start = 0;
    while start < files.len() {
        let end = start + files[start..].partition_point(|c| key(c) == key(&files[start]));
        if end - start > 1 {
            keep[start..end].fill(true);
        }
        start = end;
    }
    let mut flags = keep.into_iter();
    files.retain(|_| flags.next().unwrap_or(false));
    files.shrink_to_fit();
    let mut spans = Vec::new();
    let mut start = 0;
    while start < files.len() {
        let end = start + files[start..].partition_point(|c| key(c) == key(&files[start]));
        spans.push(Span::new(start, end));
        start = end;
    }
    spans
}

/// Take out files whose data is inline (no blocks to share), then the
/// files left without a partner. Returns how many inline files were taken
/// out, and the size groups left. `files` is as [`by_size`] left it.
pub(super) fn drop_inline(files: &mut Vec<Cand>) -> (u64, Vec<Span>) {
    let before = files.len();
    files.retain(|c| !c.inline);
    let dropped = (before - files.len()) as u64;
    (dropped, partnered(files))
}

/// A file the walk found inline (Btrfs): nothing to share, so no name is
/// kept, only what its count needs. Most small files on Btrfs are inline
/// (96,402 of 143,835 in three copies of a /usr/share); a [`Cand`] with
/// its path for each was most of the plan's memory, and on a virtual
/// machine each fresh page of it a fault costing some microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Inline {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// How [`count_inline`] counted the inline files set aside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct InlineCount {
    /// Inodes (one per file, whatever its names).
    pub inodes: u64,
    /// Inodes with a partner of the same device and size: the files
    /// [`drop_inline`] would have taken out of a size group.
    pub partnered: u64,
    /// Names beyond the first of an inode.
    pub hardlinks: u64,
}

/// Count the inline files set aside by the walk as the candidates are
/// counted: one per inode, and, as [`drop_inline`] counts, only those with
/// a partner of the same device and size, inline or not, in `files`.
pub(super) fn count_inline(mut inline: Vec<Inline>, files: &[Cand]) -> InlineCount {
    inline.sort_unstable();
    let before = inline.len();
    inline.dedup_by_key(|i| (i.dev, i.ino));
    let hardlinks = (before - inline.len()) as u64;
    let mut same: HashMap<(u64, u64), u64> = HashMap::new();
    for i in &inline {
        *same.entry((i.dev, i.size)).or_default() += 1;
    }
    let mut partners = same.clone();
    for c in files {
        if let Some(n) = partners.get_mut(&(c.dev, c.size)) {
            *n += 1;
        }
    }
    InlineCount {
        inodes: inline.len() as u64,
        partnered: same
            .iter()
            .filter(|(key, _)| partners[key] > 1)
            .map(|(_, &n)| n)
            .sum(),
        hardlinks,
    }
}

/// What the stages after clustering need of a candidate: a smaller
/// record than a [`Cand`] (the index's updates find a member's directory
/// by its name, so no device is kept; the stamp is kept for execute's
/// check that each path is still the planned file). Over 223,547 real files the plan's end (the candidates and the
/// groups' paths at once) was its peak.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub name: Name,
    pub size: u64,
    /// Bytes in extents not flagged shared; on the representative of a
    /// cluster of several, the bytes of the cluster's shared extents.
    pub exclusive: u64,
    /// [`Cand::runs`].
    pub runs: u64,
    pub hash: Option<[u8; 32]>,
    pub may_change: bool,
    pub ino: u64,
    /// The hash came from the index (not read this run).
    pub known: bool,
    /// The whole-file hash, from the index or read this run.
    pub whole: Option<Box<[u8; 32]>>,
    pub stamp: FileStamp,
}

impl From<Cand> for Member {
    fn from(c: Cand) -> Member {
        Member {
            ino: c.ino,
            known: c.known,
            whole: c.whole,
            name: c.name,
            size: c.size,
            exclusive: c.exclusive,
            runs: c.runs,
            hash: c.hash,
            may_change: c.may_change,
            stamp: c.stamp,
        }
    }
}

/// Size groups split into clusters: files whose every block is shared, on
/// the same runs, hold the same bytes by construction and are read once.
#[derive(Debug, Default)]
pub(super) struct Clusters {
    /// Every candidate, as a [`Member`], each cluster's members together and sorted by path
    /// (the first is the one read: its *representative*).
    pub files: Vec<Member>,
    /// Each cluster's span of `files`.
    pub clusters: Vec<Span>,
    /// Per size group with more than one cluster: its span of `clusters`.
    pub groups: Vec<Span>,
    /// Size groups that were one cluster (nothing to do).
    pub groups_already_shared: u64,
    /// Files in those groups beyond the first of each.
    pub files_already_shared: u64,
    /// Files beyond the first of clusters [`split_by`] left out of every
    /// set (no other cluster of their hash, or no hash): already shared
    /// among themselves, with nothing to share them with. Handed on, and
    /// reset, by [`groups`], so each is counted once.
    pub left_shared: u64,
}

impl Clusters {
    /// The representative of cluster `id`: the member read for all.
    pub fn rep(&self, id: usize) -> &Member {
        &self.files[self.clusters[id].first()]
    }

    /// [`Clusters::rep`], to record its hash.
    pub fn rep_mut(&mut self, id: usize) -> &mut Member {
        &mut self.files[self.clusters[id].first()]
    }
}

/// Split each size group (spans of `files`, as [`by_size`] left it) into
/// [`Clusters`], in place: a group's files are sorted by their shared
/// runs, then path, so each cluster is a span.
pub(super) fn clusters(mut files: Vec<Cand>, size_groups: &[Span], names: &Names) -> Clusters {
    let mut out = Clusters::default();
    for g in size_groups {
        let members = &mut files[g.range()];
        // Files not sharing every block (no runs) sort first; each is a
        // cluster of its own. Only a cluster of several needs its members
        // in path order (the order of clusters does not matter), so paths
        // are compared there alone.
        members.sort_unstable_by_key(|c| c.shared);
        // A group that is one cluster (every member on the same shared
        // runs: what an unchanged rerun meets everywhere) has nothing to
        // do, and its paths are not compared.
        if members.len() > 1
            && members[0].shared.is_some()
            && members[0].shared == members[members.len() - 1].shared
        {
            out.groups_already_shared += 1;
            out.files_already_shared += g.len() as u64 - 1;
            continue;
        }
        let first = out.clusters.len();
        let mut start = 0;
        while start < members.len() {
            let mut end = start + 1;
            if let Some(runs) = members[start].shared {
                while end < members.len() && members[end].shared == Some(runs) {
                    end += 1;
                }
                // Every block of a cluster's file is shared, so what it
                // holds is about its size (the layout keeps only a
                // fingerprint of its runs: the last block's tail and holes
                // are not told apart here; this is the plan's estimate, the
                // reclaimed figure is measured).
                let held = members[start].size;
                members[start..end].sort_unstable_by(|a, b| names.cmp(a.name, b.name));
                // The cluster's blocks are the same extents for all its
                // members: they come back if every member becomes a target
                // (a forced source, such as a store object, in another
                // cluster) and nothing outside holds them. Counted once,
                // on the representative (its own `exclusive` is 0: every
                // block is shared).
                if end - start > 1 {
                    members[start].exclusive = held;
                }
                // On the same blocks, so the same bytes: a hash any
                // member holds (from the index) is the representative's,
                // which is then not read. A whole-file hash is learnt
                // only for the files a regrouping read, not their
                // clones.
                let (rep, rest) = members[start..end].split_at_mut(1);
                let rep = &mut rep[0];
                if rep.hash.is_none() {
                    rep.hash = rest.iter().find_map(|m| m.hash);
                    rep.known |= rep.hash.is_some();
                }
                if rep.whole.is_none() {
                    rep.whole = rest.iter().find_map(|m| m.whole.clone());
                }
            }
            out.clusters
                .push(Span::new(g.first() + start, g.first() + end));
            start = end;
        }
        if out.clusters.len() - first == 1 {
            out.groups_already_shared += 1;
            out.files_already_shared += g.len() as u64 - 1;
            continue;
        }
        out.groups.push(Span::new(first, out.clusters.len()));
    }
    // The same buffer, each record shortened (in place: a collect into
    // smaller items of the same alignment reuses it), then cut to size.
    out.files = files.into_iter().map(Member::from).collect();
    out.files.shrink_to_fit();
    out
}

/// Within each group (a span of clusters), the sets of two or more clusters
/// whose representatives have the same hash, as spans of clusters (the
/// group's clusters are reordered by hash to make them so). Clusters
/// without a hash are left out: reading them failed. The members beyond
/// the first of a cluster left out are counted in
/// [`Clusters::left_shared`]: a tree and its reflinked copy is all such
/// clusters once its files' sizes collide.
pub(super) fn split_by(cl: &mut Clusters, groups: &[Span]) -> Vec<Span> {
    let Clusters {
        files,
        clusters,
        left_shared,
        ..
    } = cl;
    let hash = |s: &Span| files[s.first()].hash;
    let mut out = Vec::new();
    for g in groups {
        let ids = &mut clusters[g.range()];
        ids.sort_unstable_by_key(hash);
        let mut start = 0;
        while start < ids.len() {
            let h = hash(&ids[start]);
            let end = start + ids[start..].partition_point(|s| hash(s) == h);
            if h.is_some() && end - start > 1 {
                out.push(Span::new(g.first() + start, g.first() + end));
            } else {
                *left_shared += ids[start..end]
                    .iter()
                    .map(|s| s.len() as u64 - 1)
                    .sum::<u64>();
            }
            start = end;
        }
    }
    out
}

/// The plan's groups from sets of clusters with equal hashes (from
/// [`split_by`]). The source is the first path of a cluster holding files
/// the caller may not change (they can only be a source), else of the
/// largest cluster (fewest files change), then of a file whose blocks are
/// all shared already (freeing nothing as a target); targets are the files of the
/// other clusters the caller may change. Returns the groups, largest
/// reclaimable first (ties by source path), how many files were already
/// shared with their source (or, left out by [`split_by`] since the last
/// call, with the rest of their cluster), and how many duplicates were
/// left alone because the caller may not change them.
///
/// The groups' paths are built from `names`.
/// The groups of `sets`, the files already sharing their source's blocks,
/// and those the caller may not change; and each group's source's runs
/// ([`Cand::runs`]) by its stamp, where known.
pub(super) fn groups(
    cl: &mut Clusters,
    sets: &[Span],
    names: &Names,
) -> (Vec<DedupeGroup>, u64, u64, SourceRuns) {
    let left = std::mem::take(&mut cl.left_shared);
    let Clusters {
        files, clusters, ..
    } = cl;
    let files = &*files;
    let mut out = Vec::with_capacity(sets.len());
    let mut runs = SourceRuns::new();
    let (mut already, mut not_permitted) = (left, 0);
    for set in sets {
        {
            let fixed = |s: &Span| files[s.range()].iter().filter(|c| !c.may_change).count();
            // Among clusters of one file, one whose blocks are all shared
            // already (held by files outside the set, a snapshot, a
            // store) gives nothing back as a target: it is the source.
            let held = |s: &Span| s.len() == 1 && files[s.first()].exclusive == 0;
            clusters[set.range()].sort_by(|a, b| {
                fixed(b)
                    .cmp(&fixed(a))
                    .then(b.len().cmp(&a.len()))
                    .then(held(b).cmp(&held(a)))
                    .then_with(|| names.cmp(files[a.first()].name, files[b.first()].name))
            });
        }
        let members = &clusters[set.range()];
        let hash = files[members[0].first()]
            .hash
            .expect("a set is of clusters with a hash");
        let (mut targets, mut reclaimable) = (Vec::<(PathBuf, FileStamp)>::new(), 0);
        for m in &members[1..] {
            let cluster = &files[m.range()];
            // A cluster's shared extents (counted on its first member)
            // come back only if every member leaves them.
            let whole = cluster.len() < 2 || cluster.iter().all(|c| c.may_change);
            for (i, c) in cluster.iter().enumerate() {
                match c.may_change {
                    true => {
                        targets.push((names.path(c.name), c.stamp));
                        if i > 0 || whole {
                            reclaimable += c.exclusive;
                        }
                    }
                    false => not_permitted += 1,
                }
            }
        }
        let src = &files[members[0].range()];
        already += src.len() as u64 - 1;
        if targets.is_empty() {
            continue;
        }
        targets.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let (targets, target_stamps) = targets.into_iter().unzip();
        if src[0].runs != 0 {
            runs.push((src[0].stamp, src[0].runs));
        }
        out.push(DedupeGroup {
            size: src[0].size,
            blake3: Some(crate::ground::hash::hex(&hash)),
            source: names.path(src[0].name),
            reclaimable,
            targets,
            already_shared: src[1..].iter().map(|c| names.path(c.name)).collect(),
            source_stamp: Some(src[0].stamp),
            target_stamps,
        });
    }
    order(&mut out);
    (out, already, not_permitted, runs)
}

/// Sources' runs ([`Cand::runs`]) by their stamps.
pub(super) type SourceRuns = Vec<(FileStamp, u64)>;

/// The plan's order: largest reclaimable first, ties by source path.
pub(super) fn order(groups: &mut [DedupeGroup]) {
    // Sources are distinct (a file is in one group at most), so the order
    // is total and an unstable sort, which needs no scratch copy, gives it.
    groups.sort_unstable_by(|a, b| {
        b.reclaimable
            .cmp(&a.reclaimable)
            .then(a.source.cmp(&b.source))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// The names of the test's candidates (each test runs on a thread
        /// of its own).
        static NAMES: std::cell::RefCell<Names> = Default::default();
    }

    /// The names of every candidate made so far by this test.
    fn names() -> Names {
        NAMES.with(|n| n.borrow().clone())
    }

    /// A candidate's whole path.
    fn path(name: Name) -> String {
        names().path(name).to_str().unwrap().to_string()
    }

    fn cand(path: &str, dev: u64, ino: u64, size: u64) -> Cand {
        Cand {
            name: NAMES.with(|n| n.borrow_mut().push(None, OsStr::new(path))),
            dev,
            ino,
            size,
            exclusive: size,
            may_change: true,
            ..Cand::default()
        }
    }

    fn shared(mut c: Cand, physical: u64) -> Cand {
        c.shared = std::num::NonZeroU64::new(fingerprint(&[Run {
            logical: 0,
            physical,
            length: c.size,
            at: 0,
        }]));
        c.exclusive = 0;
        c
    }

    /// [`clusters`] of size groups given as lists.
    fn clustered(size_groups: Vec<Vec<Cand>>) -> Clusters {
        let mut files = Vec::new();
        let mut spans = Vec::new();
        for g in size_groups {
            spans.push(Span::new(files.len(), files.len() + g.len()));
            files.extend(g);
        }
        clusters(files, &spans, &names())
    }

    /// Paths of a cluster's members.
    fn paths(cl: &Clusters, id: usize) -> Vec<String> {
        cl.files[cl.clusters[id].range()]
            .iter()
            .map(|c| path(c.name))
            .collect()
    }

    /// `shortest_per_device` against the plain rule (the first shortest
    /// whole path per device), over random names in random runs of
    /// directories and devices, roots among them.
    #[test]
    fn the_shortest_name_per_device_is_the_first_shortest_path() {
        for seed in 0..200u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut n = Names::default();
            let dirs = ["/a", "/a/bb", "/r/", "/ccc/d/e", "./x"];
            for (i, d) in dirs.iter().enumerate() {
                n.dir(i, Path::new(d), 1, i as u64);
            }
            let mut list = Vec::new();
            for _ in 0..rng.usize(1..60) {
                let dev = rng.u64(1..4);
                let name = "n".repeat(rng.usize(1..6));
                let name = match rng.u8(..8) {
                    0 => n.push(None, OsStr::new(&format!("/z/{name}"))),
                    _ => n.push(Some(rng.usize(..dirs.len())), OsStr::new(&name)),
                };
                for _ in 0..rng.usize(1..4) {
                    list.push((dev, name));
                }
            }
            let mut want: HashMap<u64, PathBuf> = HashMap::new();
            for &(dev, name) in &list {
                let p = n.path(name);
                if want
                    .get(&dev)
                    .is_none_or(|w| p.as_os_str().len() < w.as_os_str().len())
                {
                    want.insert(dev, p);
                }
            }
            assert_eq!(
                n.shortest_per_device(list.iter().copied()),
                want,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn names_give_and_order_whole_paths() {
        let mut n = Names::default();
        n.dir(0, Path::new("/a/b"), 1, 0);
        n.dir(1, Path::new("/a/b/c"), 1, 1);
        n.dir(3, Path::new("/a/b-c"), 1, 3);
        n.dir(2, Path::new("./x"), 1, 2);
        n.dir(4, Path::new("/r/"), 1, 4);
        let os = OsStr::new;
        let list = [
            n.push(Some(0), os("z")),
            n.push(Some(1), os("a")),
            n.push(Some(3), os("a")),
            n.push(Some(0), os("c")),
            n.push(None, os("/a/b/c/b")),
            n.push(Some(2), os("y")),
            n.push(None, os("x/y")),
            n.push(Some(0), os("c.d")),
            n.push(Some(4), os("f")),
        ];
        assert_eq!(n.path(list[8]), Path::new("/r/f"));
        assert_eq!(n.path(list[1]), Path::new("/a/b/c/a"));
        assert_eq!(n.path(list[4]), Path::new("/a/b/c/b"));
        assert_eq!(n.path(list[5]), Path::new("./x/y"));
        for &a in &list {
            assert_eq!(n.path_len(a), n.path(a).as_os_str().len());
            assert_eq!(n.path(a).capacity(), n.path_len(a), "no spare room");
            for &b in &list {
                let (pa, pb) = (n.path(a), n.path(b));
                assert_eq!(n.cmp(a, b), pa.cmp(&pb), "{pa:?} vs {pb:?}");
            }
        }
    }

    /// [`Names::cmp`] orders names as their whole paths compare, over
    /// seeded random trees: names that start other names, separators
    /// and dots around them, bytes above ASCII, absolute, relative and
    /// `./` roots, doubled and trailing slashes, and whole paths given
    /// as roots.
    #[test]
    fn names_order_as_whole_paths_over_random_trees() {
        use std::os::unix::ffi::OsStringExt;
        let parts: [&[u8]; 10] = [
            b"a",
            b"ab",
            b"a-b",
            b"a.b",
            b"b",
            b"A",
            b"a b",
            b"\xc3\xa9",
            b"\xff",
            b"0",
        ];
        for seed in 0..200u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut n = Names::default();
            let mut list = Vec::new();
            for id in 0..rng.usize(1..8) {
                let mut p: Vec<u8> = match rng.u8(..4) {
                    0 => b"/".to_vec(),
                    1 => b"./".to_vec(),
                    2 => b"/r//".to_vec(),
                    _ => Vec::new(),
                };
                for i in 0..rng.usize(1..4) {
                    if i > 0 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(parts[rng.usize(..parts.len())]);
                }
                if rng.bool() {
                    p.push(b'/');
                }
                let dir = std::ffi::OsString::from_vec(p);
                n.dir(id, Path::new(&dir), 1, id as u64);
                for _ in 0..rng.usize(1..4) {
                    let own = OsStr::from_bytes(parts[rng.usize(..parts.len())]);
                    list.push(n.push(Some(id), own));
                }
                if rng.u8(..4) == 0 {
                    let mut whole = dir.into_vec();
                    whole.extend_from_slice(b"/z");
                    list.push(n.push(None, OsStr::from_bytes(&whole)));
                }
            }
            for &a in &list {
                for &b in &list {
                    let (pa, pb) = (n.path(a), n.path(b));
                    assert_eq!(n.cmp(a, b), pa.cmp(&pb), "seed {seed}: {pa:?} vs {pb:?}");
                }
            }
        }
    }

    /// Parts of one compressed Btrfs extent (one address, one length, one
    /// file offset, as FIEMAP gives them) are told apart by where each
    /// starts inside the extent; every other layout keeps the fingerprint
    /// it always had (24 bytes a run), so indexed claims stay valid.
    #[test]
    fn parts_of_a_compressed_extent_have_fingerprints_of_their_own() {
        use crate::extents::Encoded;
        use cowlink_sys::{FIEMAP_EXTENT_ENCODED as ENC, FIEMAP_EXTENT_SHARED as SHARED};
        let mut rng = fastrand::Rng::with_seed(49);
        for _ in 0..200 {
            let (logical, physical) = (rng.u64(..1 << 20) << 12, rng.u64(1..1 << 30) << 12);
            let length = rng.u64(1..32) << 12;
            let part = |offset: u64| {
                let mut x = Extent::new(logical, physical, length, SHARED | ENC);
                x.encoded = Some(Encoded {
                    disk_length: 4096,
                    ram_length: 128 << 10,
                    offset,
                });
                let mut c = cand("a", 1, 1, logical + length);
                c.exclusive = 0;
                layout_facts(&[x], &mut c);
                c.shared.map(|f| f.get())
            };
            let (a, b) = (rng.u64(1..32) << 12, rng.u64(1..32) << 12);
            assert_ne!(part(0), part(a));
            assert_eq!(part(a) == part(b), a == b);
            // At the extent's start, and any run not compressed: the
            // fingerprint of old.
            let mut h = blake3::Hasher::new();
            for v in [logical, physical, length] {
                h.update(&v.to_le_bytes());
            }
            let old = u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().unwrap()).max(1);
            assert_eq!(part(0), Some(old));
            let mut plain = cand("b", 1, 2, logical + length);
            layout_facts(
                &[Extent::new(logical, physical, length, SHARED)],
                &mut plain,
            );
            assert_eq!(plain.shared.map(|f| f.get()), Some(old));
        }
    }

    #[test]
    fn layout_facts_merge_contiguous_runs_and_count_exclusive_bytes() {
        use cowlink_sys::FIEMAP_EXTENT_SHARED as SHARED;
        let mut c = cand("a", 1, 1, 8192);
        c.exclusive = 0;
        layout_facts(
            &[
                Extent::new(0, 4096, 4096, SHARED),
                Extent::new(4096, 8192, 4096, SHARED),
            ],
            &mut c,
        );
        assert_eq!(
            c.shared.map(|f| f.get()),
            Some(fingerprint(&[Run {
                logical: 0,
                physical: 4096,
                length: 8192,
                at: 0
            }]))
        );
        assert_eq!(c.exclusive, 0);

        let mut d = cand("b", 1, 2, 8192);
        d.exclusive = 0;
        layout_facts(
            &[
                Extent::new(0, 4096, 4096, SHARED),
                Extent::new(4096, 99 << 12, 4096, 0),
            ],
            &mut d,
        );
        assert_eq!(d.shared, None, "not every block is shared");
        assert_eq!(d.exclusive, 4096);
        // Its runs are known all the same: a target shared with it takes them.
        assert_eq!(c.runs, c.shared.unwrap().get());
        let runs = [(0, 4096), (4096, 99 << 12)].map(|(logical, physical)| Run {
            logical,
            physical,
            length: 4096,
            at: 0,
        });
        assert_eq!(d.runs, fingerprint(&runs));

        // An unwritten extent is taken as a hole: two files whose
        // written blocks are the same share all there is to share.
        let mut u = cand("u", 1, 5, 8192);
        u.exclusive = 0;
        layout_facts(
            &[
                Extent::new(0, 4096, 4096, SHARED),
                Extent::new(4096, 77 << 12, 4096, cowlink_sys::FIEMAP_EXTENT_UNWRITTEN),
            ],
            &mut u,
        );
        let written = [Run {
            logical: 0,
            physical: 4096,
            length: 4096,
            at: 0,
        }];
        assert_eq!(u.shared.map(|f| f.get()), Some(fingerprint(&written)));
        assert_eq!((u.exclusive, u.runs), (0, fingerprint(&written)));

        // An extent without its blocks (delayed, inline): a target
        // sharing it would not map the same, so no runs.
        for flag in [
            cowlink_sys::FIEMAP_EXTENT_DELALLOC,
            cowlink_sys::FIEMAP_EXTENT_DATA_INLINE,
        ] {
            let mut e = cand("c", 1, 3, 8192);
            layout_facts(
                &[
                    Extent::new(0, 4096, 4096, 0),
                    Extent::new(4096, 8192, 4096, flag),
                ],
                &mut e,
            );
            assert_eq!(e.runs, 0, "flag {flag:#x}");
        }
        let mut none = cand("d", 1, 4, 8192);
        layout_facts(&[], &mut none);
        assert_eq!(none.runs, 0, "no extent at all");
    }

    #[test]
    fn hard_links_count_once_under_the_first_name() {
        let mut files = vec![
            cand("z", 1, 7, 10),
            cand("a", 1, 7, 10),
            cand("m", 2, 7, 10), // same inode number, other device
        ];
        let dropped = one_per_inode(&mut files, &names());
        assert_eq!(dropped, 1);
        let names: Vec<_> = files.iter().map(|c| path(c.name)).collect();
        assert_eq!(names, ["a", "m"]);
    }

    #[test]
    fn size_groups_are_per_device_and_need_two() {
        let mut files = vec![
            cand("b", 1, 2, 10),
            cand("a", 1, 1, 10),
            cand("c", 2, 3, 10),
            cand("d", 1, 4, 11),
        ];
        let g = by_size(&mut files);
        assert_eq!(g, [Span::new(0, 2)]);
        assert_eq!(files.len(), 2, "the lone files are dropped");
        assert_eq!(path(files[0].name), "a", "inode order");
        assert_eq!(path(files[1].name), "b");
    }

    #[test]
    fn size_groups_hold_every_partnered_file_once_in_inode_order() {
        // Many sizes, singles among them, two devices, unsorted input:
        // enough files for the list to shrink while groups are split off.
        let mut files = Vec::new();
        for i in 0..5000u64 {
            let size = if i % 7 == 0 { 100_000 + i } else { i % 300 };
            let dev = 1 + i % 2;
            files.push(cand(&format!("f{i}"), dev, 10_000 - i, size));
        }
        let mut want: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
        for c in &files {
            want.entry((c.dev, c.size)).or_default().push(c.ino);
        }
        want.retain(|_, inos| inos.len() > 1);
        for inos in want.values_mut() {
            inos.sort_unstable();
        }
        let spans = by_size(&mut files);
        let got: HashMap<(u64, u64), Vec<u64>> = spans
            .iter()
            .map(|s| {
                let g = &files[s.range()];
                ((g[0].dev, g[0].size), g.iter().map(|c| c.ino).collect())
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(got.len(), spans.len(), "one span per size");
        assert_eq!(
            spans.iter().map(|s| s.len()).sum::<usize>(),
            files.len(),
            "nothing else is kept"
        );
    }

    #[test]
    fn inline_files_are_counted_out_and_lone_files_dropped() {
        let mut i = cand("i", 1, 3, 10);
        i.inline = true;
        let mut files = vec![
            cand("a", 1, 1, 10),
            i,
            cand("b", 1, 4, 20),
            cand("c", 1, 5, 20),
        ];
        let (dropped, groups) = drop_inline(&mut files);
        assert_eq!(dropped, 1);
        assert_eq!(groups, [Span::new(0, 2)]);
        let names: Vec<_> = files.iter().map(|c| path(c.name)).collect();
        assert_eq!(names, ["b", "c"], "a lost its partner");
    }

    #[test]
    fn inline_files_set_aside_count_once_and_only_with_a_partner() {
        let i = |dev, ino, size| Inline { dev, ino, size };
        let count = count_inline(
            vec![
                i(1, 7, 10), // partner: file a
                i(1, 8, 30), // partner: inode 9
                i(1, 9, 30),
                i(1, 9, 30),  // a second name of inode 9
                i(1, 10, 40), // alone
                i(2, 11, 10), // other device: alone
            ],
            &[cand("a", 1, 1, 10), cand("b", 1, 2, 20)],
        );
        assert_eq!(
            count,
            InlineCount {
                inodes: 5,
                partnered: 3,
                hardlinks: 1
            }
        );
    }

    #[test]
    fn files_on_the_same_shared_blocks_are_one_cluster() {
        // a and b share every block (same runs); c is separate; d and e
        // share with each other in a group of their own: nothing to do.
        let c = clustered(vec![
            vec![
                shared(cand("b", 1, 2, 10), 100),
                cand("c", 1, 3, 10),
                shared(cand("a", 1, 1, 10), 100),
            ],
            vec![
                shared(cand("e", 1, 5, 20), 200),
                shared(cand("d", 1, 4, 20), 200),
            ],
        ]);
        assert_eq!(c.groups.len(), 1);
        assert_eq!(c.groups[0].len(), 2);
        let mut found: Vec<Vec<String>> = c.groups[0].range().map(|id| paths(&c, id)).collect();
        found.sort();
        assert_eq!(found, [vec!["a", "b"], vec!["c"]], "members sorted by path");
        assert_eq!((c.groups_already_shared, c.files_already_shared), (1, 1));
    }

    /// Give every cluster whose representative is one of `paths` the hash
    /// `h`.
    fn hash(c: &mut Clusters, paths: &[&str], h: u8) {
        for id in 0..c.clusters.len() {
            if paths.contains(&path(c.rep(id).name).as_str()) {
                c.rep_mut(id).hash = Some([h; 32]);
            }
        }
    }

    #[test]
    fn hashes_split_groups_and_the_largest_cluster_is_the_source() {
        let mut c = clustered(vec![vec![
            shared(cand("x2", 1, 2, 10), 100),
            cand("y", 1, 3, 10),
            shared(cand("x1", 1, 1, 10), 100),
            cand("z", 1, 4, 10),
            cand("other", 1, 5, 10),
            cand("unread", 1, 6, 10),
        ]]);
        // x-cluster, y and z hash equal; "other" differs; nothing for a
        // cluster whose read failed (no hash).
        hash(&mut c, &["x1", "y", "z"], 1);
        hash(&mut c, &["other"], 2);
        let groups_of_size = c.groups.clone();
        let split = split_by(&mut c, &groups_of_size);
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].len(), 3);
        let mut reps: Vec<_> = split[0].range().map(|id| path(c.rep(id).name)).collect();
        reps.sort();
        assert_eq!(reps, ["x1", "y", "z"]);

        let (groups, already, _, _) = groups(&mut c, &split, &names());
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        assert_eq!(g.source, PathBuf::from("x1"), "largest cluster, first path");
        assert_eq!(g.already_shared, [PathBuf::from("x2")]);
        assert_eq!(g.targets, [PathBuf::from("y"), PathBuf::from("z")]);
        assert_eq!(g.reclaimable, 20, "the targets' exclusive bytes");
        assert_eq!(g.blake3, Some(crate::ground::hash::hex(&[1; 32])));
        assert_eq!(already, 1);
    }

    #[test]
    fn a_shared_cluster_without_a_twin_of_its_hash_counts_as_already_shared() {
        // A tree and its reflinked copy: a1/b1 and a2/b2 share every
        // block, pairwise; every file has the same size and no two pairs
        // hold the same bytes (nor does c, alone), so no set is formed, yet
        // b1 and b2 are already shared. So is a pair whose read failed (no
        // hash): its blocks are one extent whatever it holds.
        let mut c = clustered(vec![vec![
            shared(cand("a1", 1, 1, 10), 100),
            shared(cand("b1", 1, 2, 10), 100),
            shared(cand("a2", 1, 3, 10), 200),
            shared(cand("b2", 1, 4, 10), 200),
            shared(cand("a3", 1, 5, 10), 300),
            shared(cand("b3", 1, 6, 10), 300),
            cand("c", 1, 7, 10),
        ]]);
        assert_eq!(c.files_already_shared, 0, "one size group, four clusters");
        hash(&mut c, &["a1"], 1);
        hash(&mut c, &["a2"], 2);
        hash(&mut c, &["c"], 3);
        let size_groups = c.groups.clone();
        let split = split_by(&mut c, &size_groups);
        assert!(split.is_empty());
        let (groups, already, _, _) = groups(&mut c, &split, &names());
        assert!(groups.is_empty());
        assert_eq!(already, 3, "b1, b2 and b3");
        // Counted once: a second split and grouping add nothing.
        let again = split_by(&mut c, &split);
        let (_, already, _, _) = super::groups(&mut c, &again, &names());
        assert_eq!(already, 0);
    }

    #[test]
    fn a_cluster_left_by_a_second_split_counts_as_already_shared() {
        // Equal edges for the pair x1/x2 (shared) and y; the whole-file
        // hashes set them apart: x2 is already shared with x1.
        let mut c = clustered(vec![vec![
            shared(cand("x1", 1, 1, 10), 100),
            shared(cand("x2", 1, 2, 10), 100),
            cand("y", 1, 3, 10),
        ]]);
        hash(&mut c, &["x1", "y"], 1);
        let size_groups = c.groups.clone();
        let edges = split_by(&mut c, &size_groups);
        assert_eq!(edges.len(), 1);
        hash(&mut c, &["x1"], 2);
        let whole = split_by(&mut c, &edges);
        assert!(whole.is_empty());
        let (_, already, _, _) = groups(&mut c, &whole, &names());
        assert_eq!(already, 1);
    }

    #[test]
    fn a_split_splits_again_on_new_hashes() {
        // Equal edges (1) for a, b, c; then whole-file hashes set a apart.
        let mut c = clustered(vec![vec![
            cand("a", 1, 1, 10),
            cand("b", 1, 2, 10),
            cand("c", 1, 3, 10),
        ]]);
        hash(&mut c, &["a", "b", "c"], 1);
        let size_groups = c.groups.clone();
        let edges = split_by(&mut c, &size_groups);
        assert_eq!(edges.len(), 1);
        hash(&mut c, &["a"], 3);
        hash(&mut c, &["b", "c"], 4);
        let whole = split_by(&mut c, &edges);
        assert_eq!(whole.len(), 1);
        let (g, _, _, _) = groups(&mut c, &whole, &names());
        assert_eq!(g[0].source, PathBuf::from("b"));
        assert_eq!(g[0].targets, [PathBuf::from("c")]);
    }

    #[test]
    fn groups_come_largest_first_then_by_source() {
        let mut c = clustered(vec![
            vec![cand("s1", 1, 1, 10), cand("t1", 1, 2, 10)],
            vec![cand("s2", 1, 3, 50), cand("t2", 1, 4, 50)],
            vec![cand("a3", 1, 5, 10), cand("b3", 1, 6, 10)],
        ]);
        hash(&mut c, &["s1", "t1"], 0);
        hash(&mut c, &["s2", "t2"], 1);
        hash(&mut c, &["a3", "b3"], 2);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, _, _) = groups(&mut c, &sets, &names());
        let src: Vec<_> = g.iter().map(|g| g.source.to_str().unwrap()).collect();
        assert_eq!(src, ["s2", "a3", "s1"]);
    }

    #[test]
    fn each_path_keeps_its_own_stamp_through_the_sort() {
        let mut files = vec![
            cand("z", 1, 1, 10),
            cand("m", 1, 2, 10),
            cand("a", 1, 3, 10),
            cand("q", 1, 4, 10),
        ];
        for c in &mut files {
            c.stamp = FileStamp(100 + c.ino);
        }
        let mut c = clustered(vec![files]);
        hash(&mut c, &["z", "m", "a", "q"], 5);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, _, _) = groups(&mut c, &sets, &names());
        assert_eq!(g[0].source, PathBuf::from("a"));
        assert_eq!(g[0].source_stamp, Some(FileStamp(103)));
        assert_eq!(g[0].targets, ["m", "q", "z"].map(PathBuf::from));
        assert_eq!(
            g[0].target_stamps,
            [FileStamp(102), FileStamp(104), FileStamp(101)]
        );
    }

    #[test]
    fn each_group_hands_on_its_sources_runs_where_known() {
        let mut a = vec![cand("a1", 1, 1, 10), cand("a2", 1, 2, 10)];
        let mut b = vec![cand("b1", 1, 3, 20), cand("b2", 1, 4, 20)];
        for c in a.iter_mut().chain(&mut b) {
            c.stamp = FileStamp(100 + c.ino);
            c.runs = 7000 + c.ino;
        }
        // The source of the second group was not mapped this run.
        b[0].runs = 0;
        let mut c = clustered(vec![a, b]);
        hash(&mut c, &["a1", "a2"], 5);
        hash(&mut c, &["b1", "b2"], 6);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, _, runs) = groups(&mut c, &sets, &names());
        assert_eq!(g.len(), 2);
        assert_eq!(
            runs,
            [(FileStamp(101), 7001)],
            "the sources' runs, by stamp"
        );
    }

    #[test]
    fn files_the_caller_may_not_change_are_sources_never_targets() {
        // root's r1 and r2 (not ours), our own m: m is the one to change,
        // sharing r1's blocks; r2 stays as it is and is counted.
        let mut r1 = cand("r1", 1, 1, 10);
        r1.may_change = false;
        let mut r2 = cand("r2", 1, 2, 10);
        r2.may_change = false;
        let mut c = clustered(vec![vec![cand("m", 1, 3, 10), r2, r1]]);
        hash(&mut c, &["m", "r1", "r2"], 7);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, not_permitted, _) = groups(&mut c, &sets, &names());
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].source, PathBuf::from("r1"));
        assert_eq!(g[0].targets, [PathBuf::from("m")]);
        assert_eq!(not_permitted, 1);

        // Nothing of ours among them: no group at all.
        let mut a = cand("a", 1, 4, 10);
        a.may_change = false;
        let mut b = cand("b", 1, 5, 10);
        b.may_change = false;
        let mut c = clustered(vec![vec![a, b]]);
        hash(&mut c, &["a", "b"], 7);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, not_permitted, _) = groups(&mut c, &sets, &names());
        assert!(g.is_empty());
        assert_eq!(not_permitted, 1);
    }

    #[test]
    fn clones_made_targets_by_a_forced_source_count_their_shared_blocks_once() {
        // A store object (may not change) and two clones of one another
        // (a cluster): both clones move to the object's blocks, so their
        // shared extent comes back, once.
        let mut obj = cand("obj", 1, 1, 10);
        obj.may_change = false;
        let mut c = clustered(vec![vec![
            obj,
            shared(cand("c1", 1, 2, 10), 100),
            shared(cand("c2", 1, 3, 10), 100),
            cand("e", 1, 4, 10),
        ]]);
        hash(&mut c, &["obj", "c1", "e"], 7);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, _, _) = groups(&mut c, &sets, &names());
        assert_eq!(g[0].source, PathBuf::from("obj"));
        let want: Vec<PathBuf> = ["c1", "c2", "e"].iter().map(PathBuf::from).collect();
        assert_eq!(g[0].targets, want);
        assert_eq!(
            g[0].reclaimable,
            10 + 10,
            "the clones' extent once, e's own"
        );

        // One clone may not change: it keeps the extent, so nothing of
        // it comes back when the other moves.
        let mut o1 = shared(cand("o1", 1, 5, 10), 200);
        o1.may_change = false;
        let mut o2 = shared(cand("o2", 1, 6, 10), 200);
        o2.may_change = false;
        let mut g2 = shared(cand("g2", 1, 8, 10), 300);
        g2.may_change = false;
        let mut c = clustered(vec![vec![o1, o2, shared(cand("g1", 1, 7, 10), 300), g2]]);
        hash(&mut c, &["o1", "g1"], 8);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, not_permitted, _) = groups(&mut c, &sets, &names());
        assert_eq!(g[0].source, PathBuf::from("o1"));
        assert_eq!(g[0].targets, [PathBuf::from("g1")]);
        assert_eq!(not_permitted, 1);
        assert_eq!(g[0].reclaimable, 0, "g2 keeps the extent");
    }

    #[test]
    fn a_file_whose_blocks_are_held_elsewhere_is_the_source() {
        // "a" is exclusive, "b" shares all its blocks with a file outside
        // the set: as a target "b" would give nothing back, "a" would.
        let mut c = clustered(vec![vec![
            cand("a", 1, 1, 10),
            shared(cand("b", 1, 2, 10), 300),
        ]]);
        hash(&mut c, &["a", "b"], 9);
        let size_groups = c.groups.clone();
        let sets = split_by(&mut c, &size_groups);
        let (g, _, _, _) = groups(&mut c, &sets, &names());
        assert_eq!(g[0].source, PathBuf::from("b"));
        assert_eq!(g[0].targets, [PathBuf::from("a")]);
        assert_eq!(g[0].reclaimable, 10);
    }

    #[test]
    fn a_file_fixed_under_one_name_is_fixed_under_all() {
        let mut fixed = cand("store/objects/ab/abcd", 1, 9, 10);
        fixed.may_change = false;
        let mut files = vec![cand("tree/link", 1, 9, 10), fixed];
        assert_eq!(one_per_inode(&mut files, &names()), 1);
        assert_eq!(files.len(), 1);
        assert!(!files[0].may_change);
    }
}
