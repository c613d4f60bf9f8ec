//! True disk usage of a set of paths on copy-on-write filesystems: what is
//! exclusive, what is shared inside the set, what is shared with files
//! outside it, and how much sharing saves.
//!
//! The walk (the walker, `crate::walk`) maps every regular file with FIEMAP (without
//! forcing writeback) in parallel. Extents flagged shared are collected as
//! physical ranges per device; a sweep over their boundaries then finds,
//! for every piece of disk, how many references to it lie inside each
//! scope (the whole set, each argument, each directory). A piece referenced
//! twice or more inside a scope is "shared inside" it; referenced once but
//! flagged shared, it is "shared outside" (with a file or snapshot the
//! scope does not contain).
//!
//! The figures match `btrfs filesystem du`: `data` is its "Total",
//! `exclusive` its "Exclusive" and `shared` its "Set shared". Inline
//! extents are left out of `data` as it does (inline data lives in
//! metadata). Data not yet written back (delayed allocation) has no address;
//! it counts as exclusive (new data is never shared), where `btrfs
//! filesystem du` leaves it out until writeback.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::fd::AsFd;
use rustix::fs::{self, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::extents::{extents_fd, fiemap_error};
use crate::ground::error::{Error, Operation, Result};
use crate::ground::lock;
use crate::walk::{self, DirInfo, Entry, Visitor};

/// Space figures for a set of files (each file counted once, whatever
/// number of names or arguments it is reached by).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Regular files.
    pub files: u64,
    /// Directories (their own size is not counted, as `btrfs filesystem du`).
    pub dirs: u64,
    /// Symbolic links, FIFOs, sockets, devices.
    pub others: u64,
    /// Apparent size: the sum of `st_size` of files and symbolic links.
    pub apparent: u64,
    /// What `stat` says is allocated (`st_blocks` × 512), as `du` shows.
    pub allocated: u64,
    /// Bytes of data extents the files reference (each reference counted).
    pub data: u64,
    /// Bytes in extents no other file or snapshot references.
    pub exclusive: u64,
    /// Distinct bytes on disk referenced by two or more files of the set.
    pub shared_inside: u64,
    /// Distinct bytes on disk referenced once in the set but shared with
    /// files (or snapshots) outside it.
    pub shared_outside: u64,
    /// `shared_inside + shared_outside`: all distinct shared bytes (the
    /// "Set shared" of `btrfs filesystem du`).
    pub shared: u64,
    /// The distinct data bytes on disk: the exclusive extents' disk size
    /// plus `shared`. Without compression that is `exclusive + shared`; a
    /// compressed extent counts its compressed size (as `compsize`'s "Disk
    /// Usage").
    pub on_disk: u64,
    /// The space the set would take more if nothing in it were shared:
    /// what its references would take on disk one by one (`data`, or the
    /// compressed size of compressed extents), less `on_disk`.
    pub saved: u64,
    /// Bytes stored inline in metadata (small files on Btrfs).
    pub inline: u64,
    /// Bytes written but not yet allocated (delayed allocation); part of
    /// `data` and `exclusive`.
    pub pending: u64,
    /// Regular files whose extents could not be mapped (see the errors).
    pub unmapped: u64,
    /// Bytes in compressed extents whose size on disk could not be read
    /// (it takes root): part of `data` and `exclusive` as usual, but left
    /// out of every disk figure. When it is not 0, `shared`,
    /// `shared_inside`, `shared_outside`, `on_disk` and `saved` are unknown
    /// and serialize as `null`.
    pub unknown_disk: u64,
    /// Disk cost of the references (`data` with compressed extents at
    /// their compressed size), for `saved`.
    data_disk: u64,
    /// Disk size of the exclusive extents, for `on_disk`.
    exclusive_disk: u64,
}

impl Usage {
    /// Whether the disk figures (`shared*`, `on_disk`, `saved`) are known:
    /// no compressed extent of unknown size was met.
    pub fn disk_known(&self) -> bool {
        self.unknown_disk == 0
    }
}

/// Every figure by name; the disk figures are `null` when unknown (see
/// [`Usage::unknown_disk`]), never a wrong number.
impl serde::Serialize for Usage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let known = |v: u64| self.disk_known().then_some(v);
        let mut st = s.serialize_struct("Usage", 16)?;
        st.serialize_field("files", &self.files)?;
        st.serialize_field("dirs", &self.dirs)?;
        st.serialize_field("others", &self.others)?;
        st.serialize_field("apparent", &self.apparent)?;
        st.serialize_field("allocated", &self.allocated)?;
        st.serialize_field("data", &self.data)?;
        st.serialize_field("exclusive", &self.exclusive)?;
        st.serialize_field("shared_inside", &known(self.shared_inside))?;
        st.serialize_field("shared_outside", &known(self.shared_outside))?;
        st.serialize_field("shared", &known(self.shared))?;
        st.serialize_field("on_disk", &known(self.on_disk))?;
        st.serialize_field("saved", &known(self.saved))?;
        st.serialize_field("inline", &self.inline)?;
        st.serialize_field("pending", &self.pending)?;
        st.serialize_field("unmapped", &self.unmapped)?;
        st.serialize_field("unknown_disk", &self.unknown_disk)?;
        st.end()
    }
}

impl Usage {
    fn add_file(&mut self, f: &FileRec) {
        self.files += 1;
        self.apparent += f.apparent;
        self.allocated += f.allocated;
        self.data += f.data;
        self.exclusive += f.exclusive;
        self.data_disk += f.data_disk;
        self.exclusive_disk += f.exclusive_disk;
        self.unknown_disk += f.unknown_disk;
        self.inline += f.inline;
        self.pending += f.pending;
        self.unmapped += u64::from(!f.mapped);
    }

    fn finish(&mut self) {
        self.shared = self.shared_inside + self.shared_outside;
        self.on_disk = self.exclusive_disk + self.shared;
        self.saved = self.data_disk.saturating_sub(self.on_disk);
    }
}

/// Usage of one argument or one directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PathUsage {
    /// The path as given (or found below an argument).
    #[serde(flatten, serialize_with = "crate::name::json::path")]
    pub path: PathBuf,
    /// Its figures; "inside" means inside this path.
    pub usage: Usage,
}

/// The answer of [`usage_report`].
#[derive(Debug, Default)]
pub struct UsageReport {
    /// The whole set: all arguments together.
    pub total: Usage,
    /// Each argument on its own, in the order given.
    pub args: Vec<PathUsage>,
    /// Each directory, when [`UsageOptions::per_dir`] asked for them, in
    /// path order within each argument.
    pub dirs: Vec<PathUsage>,
    /// What could not be read or mapped. A filesystem without FIEMAP is
    /// reported once, not per file.
    pub errors: Vec<Error>,
    /// The run was cancelled: the figures cover only what was walked.
    pub cancelled: bool,
}

/// How [`usage_report`] walks.
#[derive(Debug, Clone, Default)]
pub struct UsageOptions {
    /// Threads (0: one per core), cancellation, progress ([`Phase::Scan`]:
    /// entries seen).
    ///
    /// [`Phase::Scan`]: crate::run::Phase::Scan
    pub run: crate::run::Run,
    /// Also report every directory (as `du` without `-s`).
    pub per_dir: bool,
}

/// The usage of `paths` taken together (directories walked, symbolic links
/// not followed, hard links counted once).
///
/// # Errors
/// The first error met (a missing path, a filesystem without FIEMAP...);
/// use [`usage_report`] to get figures despite errors.
pub fn usage<P: AsRef<Path>>(paths: &[P]) -> Result<Usage> {
    let mut report = usage_report(paths, &UsageOptions::default());
    match report.errors.is_empty() {
        true => Ok(report.total),
        false => Err(report.errors.swap_remove(0)),
    }
}

/// The usage of `paths`: the whole set, each argument, and (on request)
/// each directory, with every error met. Never stops at an error.
pub fn usage_report<P: AsRef<Path>>(paths: &[P], opts: &UsageOptions) -> UsageReport {
    let roots: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
    let c = Collector::default();
    opts.run.enter(crate::run::Phase::Scan, 0, 0);
    let cut_short = walk::walk(&roots, &opts.run, Operation::Usage, &c);
    let Collector {
        dirs,
        files,
        shared,
        errors,
        ..
    } = c;
    let mut dirs = dirs.into_inner().unwrap_or_else(|e| e.into_inner());
    dirs.sort_by_key(|d| d.id);
    let files = files.into_inner().unwrap_or_else(|e| e.into_inner());
    let shared = shared.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    errors.sort_by(|a, b| a.src().cmp(&b.src()));
    let mut report = aggregate(&roots, opts.per_dir, dirs, files, shared, errors);
    report.cancelled = cut_short && opts.run.cancelled();
    opts.run.finish();
    report
}

/// A regular file (or link/special entry) as the walk saw it.
#[derive(Clone)]
struct FileRec {
    dir: Option<usize>,
    root: usize,
    /// `(dev, ino)`: one file met twice (hard links, or arguments that
    /// overlap) counts once.
    key: (u64, u64),
    /// Kept only for hard-linked files, to count the first name.
    path: Option<PathBuf>,
    regular: bool,
    mapped: bool,
    apparent: u64,
    allocated: u64,
    data: u64,
    exclusive: u64,
    /// `data` and `exclusive` on disk (compressed extents at their
    /// compressed size).
    data_disk: u64,
    exclusive_disk: u64,
    /// Bytes in compressed extents of unknown disk size.
    unknown_disk: u64,
    inline: u64,
    pending: u64,
}

#[derive(Debug)]
struct DirRec {
    /// `(dev, ino)`, to count a directory reached twice once in the set.
    key: (u64, u64),
    id: usize,
    parent: Option<usize>,
    root: usize,
    path: PathBuf,
}

#[derive(Default)]
struct Collector {
    dirs: Mutex<Vec<DirRec>>,
    files: Mutex<Vec<FileRec>>,
    /// `(space, start, end, file index)` of every shared extent, where
    /// `space` names the physical address space ([`Collector::space`]).
    shared: Mutex<Vec<(u64, u64, u64, usize)>>,
    /// Device number → address space, for the devices met.
    spaces: Mutex<HashMap<u64, u64>>,
    errors: Mutex<Vec<Error>>,
    /// Devices already reported as having no FIEMAP.
    no_fiemap: Mutex<Vec<u64>>,
    /// Btrfs filesystem UUID → its address space (see `space`).
    fsids: Mutex<HashMap<[u8; 16], u64>>,
}

impl Collector {
    /// The physical address space of the file open as `fd` on device
    /// `dev`: the device itself, except on Btrfs, where every subvolume
    /// (and so every subvolume snapshot) has a device number of its own
    /// but all of them address one pool of disk. There the space is the
    /// first device met of the same filesystem UUID, so an extent a
    /// snapshot shares with its origin counts as shared, not twice.
    fn space(&self, dev: u64, fd: rustix::fd::BorrowedFd<'_>) -> u64 {
        if let Some(&s) = lock(&self.spaces).get(&dev) {
            return s;
        }
        let fsid = cowlink_sys::btrfs_fsid(fd).ok();
        let mut spaces = lock(&self.spaces);
        let mut fsids = lock(&self.fsids);
        let space = match fsid {
            Some(id) => *fsids.entry(id).or_insert(dev),
            None => dev,
        };
        *spaces.entry(dev).or_insert(space)
    }

    /// Record one entry of the walk.
    fn take(&self, e: Entry<'_>) {
        let op = Operation::Usage;
        let regular = e.file_type.is_none_or(|t| t == FileType::RegularFile);
        let (st, fd) = if regular {
            match fs::openat(
                e.dirfd,
                e.name,
                OFlags::RDONLY
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => match cowlink_sys::fstat(&fd) {
                    Ok(st) => (st, Some(fd)),
                    Err(err) => return self.error(Error::from_errno(op, err).with_src(e.path())),
                },
                // A symlink, or a FIFO/socket found by an unknown d_type, or
                // a file we may not open: stat it for its sizes.
                Err(Errno::LOOP | Errno::NXIO | Errno::ACCESS | Errno::PERM) => {
                    match cowlink_sys::statat(e.dirfd, e.name, fs::AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) if cowlink_sys::file_type(st.st_mode) == FileType::RegularFile => {
                            return self
                                .error(Error::from_errno(op, Errno::ACCESS).with_src(e.path()))
                        }
                        Ok(st) => (st, None),
                        Err(err) => {
                            return self.error(Error::from_errno(op, err).with_src(e.path()))
                        }
                    }
                }
                Err(err) => return self.error(Error::from_errno(op, err).with_src(e.path())),
            }
        } else {
            match cowlink_sys::statat(e.dirfd, e.name, fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => (st, None),
                Err(err) => return self.error(Error::from_errno(op, err).with_src(e.path())),
            }
        };
        let kind = cowlink_sys::file_type(st.st_mode);
        let counts_size = matches!(kind, FileType::RegularFile | FileType::Symlink);
        let mut rec = FileRec {
            dir: e.dir.map(|d| d.id),
            root: e.root,
            key: (st.st_dev, st.st_ino),
            path: (st.st_nlink > 1).then(|| e.path()),
            regular: kind == FileType::RegularFile,
            mapped: true,
            apparent: if counts_size { st.st_size as u64 } else { 0 },
            allocated: if counts_size {
                st.st_blocks as u64 * 512
            } else {
                0
            },
            data: 0,
            exclusive: 0,
            data_disk: 0,
            exclusive_disk: 0,
            unknown_disk: 0,
            inline: 0,
            pending: 0,
        };
        let mut ranges = Vec::new();
        if let (true, Some(fd)) = (rec.regular, fd.as_ref()) {
            match extents_fd(fd.as_fd(), false) {
                Ok(list) => {
                    for x in list {
                        if x.is_inline() {
                            rec.inline += x.length;
                            continue;
                        }
                        rec.data += x.length;
                        if !x.has_address() {
                            // Not written back yet: new data, never shared.
                            rec.pending += x.length;
                            rec.exclusive += x.length;
                            rec.data_disk += x.length;
                            rec.exclusive_disk += x.length;
                            continue;
                        }
                        if !x.is_shared() {
                            rec.exclusive += x.length;
                        }
                        match (x.disk_range(), x.disk_cost()) {
                            (Some((start, end)), Some(cost)) => {
                                rec.data_disk += cost;
                                if x.is_shared() {
                                    ranges.push((start, end));
                                } else {
                                    rec.exclusive_disk += cost;
                                }
                            }
                            // Compressed, size on disk unknown (not root).
                            _ => rec.unknown_disk += x.length,
                        }
                    }
                }
                Err(err) => {
                    rec.mapped = false;
                    let unsupported = matches!(err, Errno::OPNOTSUPP | Errno::NOTTY | Errno::NOSYS);
                    let first = !unsupported || {
                        let mut seen = lock(&self.no_fiemap);
                        let first = !seen.contains(&st.st_dev);
                        if first {
                            seen.push(st.st_dev);
                        }
                        first
                    };
                    if first {
                        self.error(fiemap_error(&e.path(), err));
                    }
                }
            }
        }
        let index = {
            let mut files = lock(&self.files);
            files.push(rec);
            files.len() - 1
        };
        if let (false, Some(fd)) = (ranges.is_empty(), fd.as_ref()) {
            let space = self.space(st.st_dev, fd.as_fd());
            lock(&self.shared).extend(ranges.into_iter().map(|(s, e)| (space, s, e, index)));
        }
    }
}

impl Visitor for Collector {
    fn dir(&self, dir: &DirInfo, st: &cowlink_sys::Stat, _: rustix::fd::BorrowedFd<'_>) {
        lock(&self.dirs).push(DirRec {
            key: (st.st_dev, st.st_ino),
            id: dir.id,
            parent: dir.parent,
            root: dir.root,
            path: dir.path.clone(),
        });
    }

    fn entry(&self, e: Entry<'_>) -> std::ops::ControlFlow<()> {
        self.take(e);
        std::ops::ControlFlow::Continue(())
    }

    fn error(&self, err: Error) {
        lock(&self.errors).push(err);
    }
}

/// Turn the walk's records into figures per scope.
fn aggregate(
    roots: &[PathBuf],
    per_dir: bool,
    dirs: Vec<DirRec>,
    files: Vec<FileRec>,
    shared: Vec<(u64, u64, u64, usize)>,
    errors: Vec<Error>,
) -> UsageReport {
    // One file met several times (hard links, overlapping arguments) counts
    // once: in the set, the name that sorts first (argument, then path)
    // counts, so the answer does not depend on thread timing; in an
    // argument (and its directories), the first name inside it.
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&files[a], &files[b]);
        (x.key, x.root, &x.path).cmp(&(y.key, y.root, &y.path))
    });
    let mut in_set = vec![false; files.len()];
    let mut in_root = vec![false; files.len()];
    for (n, &i) in order.iter().enumerate() {
        let prev = n.checked_sub(1).map(|p| &files[order[p]]);
        in_set[i] = prev.is_none_or(|p| p.key != files[i].key);
        in_root[i] = prev.is_none_or(|p| (p.key, p.root) != (files[i].key, files[i].root));
    }

    // Dense dir index: ids are dense already, but be safe with a map.
    let slot: HashMap<usize, usize> = dirs.iter().enumerate().map(|(i, d)| (d.id, i)).collect();
    let parent_slot: Vec<Option<usize>> = dirs
        .iter()
        .map(|d| d.parent.and_then(|p| slot.get(&p).copied()))
        .collect();
    let ancestors = |dir: Option<usize>, out: &mut Vec<usize>| {
        out.clear();
        let mut cur = dir.and_then(|d| slot.get(&d).copied());
        while let Some(s) = cur {
            out.push(s);
            cur = parent_slot[s];
        }
    };

    let mut total = Usage::default();
    let mut args = vec![Usage::default(); roots.len()];
    let mut per = vec![Usage::default(); if per_dir { dirs.len() } else { 0 }];
    let mut up = Vec::new();
    let distinct: std::collections::HashSet<(u64, u64)> = dirs.iter().map(|d| d.key).collect();
    total.dirs = distinct.len() as u64;
    for d in &dirs {
        args[d.root].dirs += 1;
        if per_dir {
            ancestors(Some(d.id), &mut up);
            for &a in &up {
                per[a].dirs += 1;
            }
        }
    }
    for (i, f) in files.iter().enumerate() {
        if !in_root[i] {
            continue;
        }
        let add = |u: &mut Usage| {
            if f.regular {
                u.add_file(f);
            } else {
                u.others += 1;
                u.apparent += f.apparent;
                u.allocated += f.allocated;
            }
        };
        if in_set[i] {
            add(&mut total);
        }
        add(&mut args[f.root]);
        if per_dir {
            ancestors(f.dir, &mut up);
            for &a in &up {
                add(&mut per[a]);
            }
        }
    }

    // Sweep the shared ranges: boundaries sorted per device; between two
    // boundaries the active references are constant.
    let mut events: Vec<(u64, u64, bool, usize)> = Vec::with_capacity(shared.len() * 2);
    for &(dev, start, end, file) in &shared {
        if in_root[file] && end > start {
            events.push((dev, start, true, file));
            events.push((dev, end, false, file));
        }
    }
    // At one position, ends sort before starts (false < true).
    events.sort_unstable();
    let mut active: Vec<usize> = Vec::new();
    let mut counts: HashMap<Scope, u32> = HashMap::new();
    let mut i = 0;
    while i < events.len() {
        let (dev, pos, _, _) = events[i];
        while i < events.len() && events[i].0 == dev && events[i].1 == pos {
            let (_, _, start, file) = events[i];
            if start {
                active.push(file);
            } else if let Some(k) = active.iter().position(|&f| f == file) {
                active.swap_remove(k);
            }
            i += 1;
        }
        let next = match events.get(i) {
            Some(&(d, p, _, _)) if d == dev => p,
            _ => continue, // device ends: nothing can be active
        };
        if active.is_empty() {
            continue;
        }
        let len = next - pos;
        counts.clear();
        for &f in &active {
            if in_set[f] {
                *counts.entry(Scope::Total).or_default() += 1;
            }
            *counts.entry(Scope::Arg(files[f].root)).or_default() += 1;
            if per_dir {
                ancestors(files[f].dir, &mut up);
                for &a in &up {
                    *counts.entry(Scope::Dir(a)).or_default() += 1;
                }
            }
        }
        for (&scope, &n) in &counts {
            let u = match scope {
                Scope::Total => &mut total,
                Scope::Arg(a) => &mut args[a],
                Scope::Dir(d) => &mut per[d],
            };
            if n >= 2 {
                u.shared_inside += len;
            } else {
                u.shared_outside += len;
            }
        }
    }

    total.finish();
    let args = roots
        .iter()
        .zip(args)
        .map(|(p, mut u)| {
            u.finish();
            PathUsage {
                path: p.clone(),
                usage: u,
            }
        })
        .collect();
    let mut dir_rows: Vec<(usize, PathUsage)> = dirs
        .iter()
        .zip(per)
        .map(|(d, mut u)| {
            u.finish();
            (
                d.root,
                PathUsage {
                    path: d.path.clone(),
                    usage: u,
                },
            )
        })
        .collect();
    dir_rows.sort_by(|a, b| (a.0, &a.1.path).cmp(&(b.0, &b.1.path)));
    UsageReport {
        total,
        args,
        dirs: dir_rows.into_iter().map(|(_, r)| r).collect(),
        errors,
        cancelled: false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scope {
    Total,
    Arg(usize),
    Dir(usize),
}

#[cfg(test)]
mod tests {
    //! The sweep and the per-scope counting, on made-up walk records: no
    //! filesystem needed.
    use super::*;

    const K: u64 = 4096;

    fn dir(id: usize, parent: Option<usize>, root: usize, path: &str) -> DirRec {
        DirRec {
            key: (1, 1000 + id as u64),
            id,
            parent,
            root,
            path: path.into(),
        }
    }

    /// A regular file of `blocks` 4 KiB blocks, `shared` of them shared.
    fn file(dir: usize, root: usize, ino: u64, blocks: u64, shared: u64) -> FileRec {
        FileRec {
            dir: Some(dir),
            root,
            key: (1, ino),
            path: None,
            regular: true,
            mapped: true,
            apparent: blocks * K,
            allocated: blocks * K,
            data: blocks * K,
            exclusive: (blocks - shared) * K,
            data_disk: blocks * K,
            exclusive_disk: (blocks - shared) * K,
            unknown_disk: 0,
            inline: 0,
            pending: 0,
        }
    }

    #[test]
    fn compressed_extents_count_their_compressed_size_on_disk() {
        // a and its clone b reference 32 blocks each, compressed into 10
        // blocks at 100..110 (one shared extent); c has 4 exclusive blocks
        // compressed into 1.
        let dirs = vec![dir(0, None, 0, "top")];
        let mut a = file(0, 0, 1, 32, 32);
        a.data_disk = 10 * K;
        let b = FileRec {
            key: (1, 2),
            ..a.clone()
        };
        let mut c = file(0, 0, 3, 4, 0);
        (c.data_disk, c.exclusive_disk) = (K, K);
        let shared = vec![(1, 100 * K, 110 * K, 0), (1, 100 * K, 110 * K, 1)];
        let r = aggregate(&["top".into()], false, dirs, vec![a, b, c], shared, vec![]);
        let t = r.total;
        // data and exclusive are file bytes, as `btrfs filesystem du`.
        assert_eq!((t.data, t.exclusive), (68 * K, 4 * K));
        // on disk: 10 shared + 1 exclusive; sharing saves the second 10.
        assert_eq!(
            (t.shared_inside, t.on_disk, t.saved),
            (10 * K, 11 * K, 10 * K)
        );
        assert!(t.disk_known());
    }

    #[test]
    fn unknown_compressed_sizes_make_the_disk_figures_null_never_wrong() {
        let mut a = file(0, 0, 1, 8, 0);
        a.unknown_disk = 8 * K;
        (a.data_disk, a.exclusive_disk) = (0, 0);
        let r = aggregate(
            &["top".into()],
            false,
            vec![dir(0, None, 0, "top")],
            vec![a],
            vec![],
            vec![],
        );
        assert!(!r.total.disk_known());
        let v = serde_json::to_value(r.total).unwrap();
        assert_eq!(v["data"], 8 * K);
        assert!(
            v["on_disk"].is_null() && v["saved"].is_null() && v["shared"].is_null(),
            "{v}"
        );
        assert_eq!(v["unknown_disk"], 8 * K);
    }

    #[test]
    fn a_clone_inside_the_set_is_shared_inside_and_saves_its_size() {
        // a (2 blocks) and its clone b share both blocks at disk 100..102.
        let dirs = vec![dir(0, None, 0, "top")];
        let files = vec![file(0, 0, 1, 2, 2), file(0, 0, 2, 2, 2)];
        let shared = vec![(1, 100 * K, 102 * K, 0), (1, 100 * K, 102 * K, 1)];
        let r = aggregate(&["top".into()], false, dirs, files, shared, vec![]);
        let t = r.total;
        assert_eq!((t.files, t.dirs, t.data), (2, 1, 4 * K));
        assert_eq!((t.shared_inside, t.shared_outside), (2 * K, 0));
        assert_eq!((t.on_disk, t.saved), (2 * K, 2 * K));
        assert_eq!(r.args[0].usage, t);
    }

    #[test]
    fn a_block_shared_with_a_file_outside_is_shared_outside() {
        // One file whose block is also used by something not walked.
        let r = aggregate(
            &["top".into()],
            false,
            vec![dir(0, None, 0, "top")],
            vec![file(0, 0, 1, 3, 1)],
            vec![(1, 50 * K, 51 * K, 0)],
            vec![],
        );
        let t = r.total;
        assert_eq!(
            (t.exclusive, t.shared_inside, t.shared_outside),
            (2 * K, 0, K)
        );
        assert_eq!((t.on_disk, t.saved), (3 * K, 0));
    }

    #[test]
    fn scopes_count_sharing_inside_themselves_only() {
        // top/x holds a, top/y holds its clone b: shared inside top, but
        // each subdirectory alone sees its half as shared outside.
        let dirs = vec![
            dir(0, None, 0, "top"),
            dir(1, Some(0), 0, "top/x"),
            dir(2, Some(0), 0, "top/y"),
        ];
        let files = vec![file(1, 0, 1, 1, 1), file(2, 0, 2, 1, 1)];
        let shared = vec![(1, 7 * K, 8 * K, 0), (1, 7 * K, 8 * K, 1)];
        let r = aggregate(&["top".into()], true, dirs, files, shared, vec![]);
        let by: HashMap<_, _> = r
            .dirs
            .iter()
            .map(|d| (d.path.to_str().unwrap(), d.usage))
            .collect();
        assert_eq!(by["top"].shared_inside, K);
        assert_eq!(by["top"].dirs, 3);
        assert_eq!(
            (by["top/x"].shared_inside, by["top/x"].shared_outside),
            (0, K)
        );
        assert_eq!((by["top/y"].files, by["top/y"].shared_outside), (1, K));
    }

    #[test]
    fn one_inode_counts_once_in_the_set_and_once_per_argument() {
        // The same file reached under two arguments (a hard link, or
        // overlapping arguments).
        let dirs = vec![dir(0, None, 0, "a"), dir(1, None, 1, "b")];
        let mut f0 = file(0, 0, 9, 2, 0);
        f0.path = Some("a/f".into());
        let mut f1 = file(1, 1, 9, 2, 0);
        f1.path = Some("b/f".into());
        let r = aggregate(
            &["a".into(), "b".into()],
            false,
            dirs,
            vec![f0, f1],
            vec![],
            vec![],
        );
        assert_eq!(r.total.files, 1);
        assert_eq!(r.total.data, 2 * K);
        assert_eq!((r.args[0].usage.files, r.args[1].usage.files), (1, 1));
    }

    #[test]
    fn partial_overlaps_are_swept_piece_by_piece_per_device() {
        // f0: disk [0,4) blocks; f1: [2,6); f2 on another device: [0,4).
        let dirs = vec![dir(0, None, 0, "top")];
        let mut f2 = file(0, 0, 3, 4, 4);
        f2.key = (2, 3);
        let files = vec![file(0, 0, 1, 4, 4), file(0, 0, 2, 4, 4), f2];
        let shared = vec![(1, 0, 4 * K, 0), (1, 2 * K, 6 * K, 1), (2, 0, 4 * K, 2)];
        let r = aggregate(&["top".into()], false, dirs, files, shared, vec![]);
        let t = r.total;
        // [2,4) is used by both f0 and f1; [0,2) and [4,6) by one each;
        // device 2's [0,4) by f2 alone.
        assert_eq!(t.shared_inside, 2 * K);
        assert_eq!(t.shared_outside, 4 * K + 4 * K);
        assert_eq!((t.data, t.on_disk, t.saved), (12 * K, 10 * K, 2 * K));
    }
}
