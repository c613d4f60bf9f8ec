//! Reclaim the space of identical files, safely: plan, then execute.
//!
//! [`plan`] walks the paths in parallel (the walker, `crate::walk`) and narrows
//! candidates step by step, each step cheaper than the next: same
//! filesystem and size (≥ `min_size`); files that already share all their
//! blocks with each other (FIEMAP: same logical → physical runs, all
//! flagged shared) are one *cluster* and are read once, not once per name;
//! same BLAKE3 of the first and last 4 KiB; same BLAKE3 of everything. Hard
//! links of one inode count once. The plan lists, per group of identical
//! files, the source (a member of the largest cluster, so the fewest files
//! change), the targets, and the bytes expected back. It is plain data
//! (serde), so it can be shown, saved, reviewed.
//!
//! [`execute`] only ever calls `FIDEDUPERANGE`: the kernel locks both files,
//! compares the bytes and shares blocks only if they are equal. A target
//! written since the plan is reported as changed and keeps its new data —
//! never FICLONE over a file hashed earlier. Ranges go in block-aligned
//! chunks of at most 1 GiB, to up to 127 targets per call (the 4 KiB
//! request limit); the unaligned tail is allowed because it ends at EOF of
//! both files. Times, mode and owner are untouched (dedupe is not a write).
//! What was reclaimed is measured (free space before and after, per
//! filesystem, after a `syncfs`), never taken from the kernel's
//! `bytes_deduped`. Groups run in the order of their source paths, not of
//! their size: neighbours on disk share allocation-group locks and btree
//! blocks (`bench/dedupe-floor` over one /usr/share plan: 2.13 s in path
//! order, 2.34 s in size order, one run each). Sharing is not re-read with
//! FIEMAP afterwards (one more ioctl per target, on the hot path): the
//! kernel answers for each target, and the free space is measured.
//!
//! Refused: NFS and CIFS/SMB clients (their dedupe cloned without
//! comparing), filesystems whose trial dedupe fails (ext4, tmpfs, ZFS...),
//! and groups across filesystems (groups are per device).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::extents::{extents_fd, Extent};
use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;
use crate::run::{Phase, Run};
use crate::walk::{self, DirInfo, Entry, Visitor};

/// Bytes hashed from each end of a file for the partial hash.
const EDGE: u64 = 4096;
/// Largest range given to one `FIDEDUPERANGE` call.
pub const CHUNK: u64 = 1 << 30;

/// How [`plan`] works.
#[derive(Debug, Clone)]
pub struct DedupeOptions {
    /// Smallest file considered, in bytes (default 1: every non-empty
    /// file holds a block of its own on XFS, so even a 1-byte duplicate
    /// gives back a block; Btrfs keeps small files inline in its metadata,
    /// and those are reported in [`Plan::inline_skipped`] instead).
    pub min_size: u64,
    /// Threads for walking, hashing and executing (0: one per core),
    /// cancellation, and progress: [`Phase::Scan`] (entries seen),
    /// [`Phase::Hash`] (bytes hashed of the total to hash),
    /// [`Phase::Dedupe`] (target bytes compared and shared, of the total).
    pub run: Run,
}

impl Default for DedupeOptions {
    fn default() -> Self {
        DedupeOptions {
            min_size: 1,
            run: Run::default(),
        }
    }
}

/// Identical files: one source and the targets to share its blocks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    /// Size of every file in the group.
    pub size: u64,
    /// BLAKE3 of the content, hex.
    pub blake3: String,
    /// The file whose blocks the targets will share.
    pub source: PathBuf,
    /// The files that will be made to share the source's blocks.
    pub targets: Vec<PathBuf>,
    /// Files of the group that already share the source's blocks.
    pub already_shared: Vec<PathBuf>,
    /// Bytes expected back: the targets' blocks that no other file shares.
    pub reclaimable: u64,
}

/// What [`plan`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// Groups with at least one target, largest reclaim first.
    pub groups: Vec<Group>,
    /// Regular files the walk saw.
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
    /// Files that could not be read, and filesystems refused (sorted by
    /// path). Not read back from a saved plan.
    #[serde(skip_deserializing)]
    pub errors: Vec<Error>,
}

impl Plan {
    /// Targets in all groups.
    pub fn targets(&self) -> u64 {
        self.groups.iter().map(|g| g.targets.len() as u64).sum()
    }

    /// Bytes expected back in all groups.
    pub fn reclaimable(&self) -> u64 {
        self.groups.iter().map(|g| g.reclaimable).sum()
    }
}

/// A candidate file during planning.
#[derive(Debug, Clone)]
struct Cand {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    /// Logical→physical runs when every extent is shared (else `None`).
    shared_runs: Option<Vec<(u64, u64, u64)>>,
    /// Bytes in extents not flagged shared.
    exclusive: u64,
    /// The data is inline in metadata (no extent to share).
    inline: bool,
    /// For files of at most two edges: the hash of all their bytes, taken
    /// while the file was open for its layout (one open per small file).
    small_hash: Option<[u8; 32]>,
}

#[derive(Default)]
struct Collect {
    files: Mutex<Vec<Cand>>,
    /// In the order met (the first is returned when nothing could be
    /// walked).
    errors: Mutex<Vec<Error>>,
    min_size: u64,
}

impl Collect {
    /// Record one entry of the walk.
    fn take(&self, e: Entry<'_>) {
        if e.file_type.is_some_and(|t| t != FileType::RegularFile) {
            return;
        }
        let st = match fs::statat(e.dirfd, e.name, fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(err) => {
                return self.error(Error::from_errno(Operation::Dedupe, err).with_src(&e.path))
            }
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return;
        }
        let size = st.st_size as u64;
        let mut c = Cand {
            path: e.path,
            dev: st.st_dev,
            ino: st.st_ino,
            size,
            shared_runs: None,
            exclusive: 0,
            inline: false,
            small_hash: None,
        };
        if size >= self.min_size.max(1) {
            c.exclusive = st.st_blocks as u64 * 512; // until the layout is read
        } else {
            c.size = 0; // below min_size: counted as scanned, not a candidate
        }
        lock(&self.files).push(c);
    }
}

impl Visitor for Collect {
    fn dir(&self, _dir: &DirInfo, _st: &fs::Stat) {}

    fn entry(&self, e: Entry<'_>) -> std::ops::ControlFlow<()> {
        self.take(e);
        std::ops::ControlFlow::Continue(())
    }

    fn error(&self, err: Error) {
        lock(&self.errors).push(err);
    }
}

/// Fill `shared_runs` and `exclusive` from a file's extents.
fn layout_facts(list: &[Extent], c: &mut Cand) {
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    let mut all_shared = !list.is_empty();
    c.inline = list.iter().any(Extent::is_inline);
    for x in list {
        if !x.is_shared() || !x.has_address() || x.is_unwritten() {
            all_shared = false;
            c.exclusive += x.length;
        }
        match runs.last_mut() {
            Some((l, p, n)) if *l + *n == x.logical && *p + *n == x.physical => *n += x.length,
            _ => runs.push((x.logical, x.physical, x.length)),
        }
    }
    c.shared_runs = all_shared.then_some(runs);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Find groups of identical files under `paths` and how to deduplicate
/// them. Reads files, changes nothing.
///
/// # Errors
/// Only when no path could be walked at all; per-file problems and
/// refused filesystems are listed in [`Plan::errors`].
pub fn plan<P: AsRef<Path>>(paths: &[P], opts: &DedupeOptions) -> Result<Plan> {
    let roots: Vec<PathBuf> = paths.iter().map(|p| p.as_ref().to_path_buf()).collect();
    let run = &opts.run;
    let cancelled = || Error::new(Operation::Dedupe, ErrorKind::Cancelled);
    run.enter(Phase::Scan, 0, 0);
    let c = Collect {
        min_size: opts.min_size,
        ..Default::default()
    };
    walk::walk(&roots, run, Operation::Dedupe, &c);
    if run.cancelled() {
        return Err(cancelled());
    }
    let files = c.files.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut errors = c.errors.into_inner().unwrap_or_else(|e| e.into_inner());
    if files.is_empty() && !errors.is_empty() && errors.len() >= roots.len() {
        // Nothing could be walked: the (first) path's own error.
        return Err(errors.swap_remove(0));
    }
    let mut plan = Plan {
        files_scanned: files.len() as u64,
        ..Default::default()
    };

    // One inode is one file: keep the name that sorts first.
    let mut files: Vec<Cand> = files.into_iter().filter(|c| c.size > 0).collect();
    files.sort_by(|a, b| (a.dev, a.ino, &a.path).cmp(&(b.dev, b.ino, &b.path)));
    let before = files.len();
    files.dedup_by(|b, a| (a.dev, a.ino) == (b.dev, b.ino));
    plan.hardlinks_skipped = (before - files.len()) as u64;

    // Filesystems: refuse network clients and those that cannot dedupe.
    let mut allowed: HashMap<u64, bool> = HashMap::new();
    for c in &files {
        if allowed.contains_key(&c.dev) {
            continue;
        }
        let ok = match can_dedupe(&c.path) {
            Ok(()) => true,
            Err(e) => {
                errors.push(e);
                false
            }
        };
        allowed.insert(c.dev, ok);
    }
    files.retain(|c| allowed[&c.dev]);
    plan.candidates = files.len() as u64;

    // Same device and size.
    let mut by_size: HashMap<(u64, u64), Vec<Cand>> = HashMap::new();
    for c in files {
        by_size.entry((c.dev, c.size)).or_default().push(c);
    }
    let mut size_groups: Vec<Vec<Cand>> = by_size.into_values().filter(|g| g.len() > 1).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(run.threads_or(crate::run::cores))
        .build()
        .map_err(|e| Error::new(Operation::Dedupe, ErrorKind::Io).with_reason(e.to_string()))?;
    // The layout tells already-shared files apart without reading them.
    // Only files with a same-size partner are mapped; a failure here only
    // costs the shortcut.
    // Small files are hashed in full while open (their "edges" are all of
    // them), so each is opened once for the whole plan.
    pool.install(|| {
        size_groups
            .par_iter_mut()
            .flat_map(|g| g.par_iter_mut())
            .for_each(|c| {
                if run.cancelled() {
                    return;
                }
                if let Ok(fd) = open_read(&c.path) {
                    if let Ok(list) = extents_fd(fd.as_fd(), false) {
                        c.exclusive = 0;
                        layout_facts(&list, c);
                    }
                    if c.size <= 2 * EDGE && !c.inline && c.shared_runs.is_none() {
                        if let Ok((h, n)) =
                            crate::ground::hash::hash_fd(fd.as_fd(), c.size, &|_| {})
                        {
                            if n == c.size {
                                c.small_hash = Some(h);
                            }
                        }
                    }
                }
            })
    });
    // Inline data has no blocks to share: report, never claim.
    for g in &mut size_groups {
        let before = g.len();
        g.retain(|c| !c.inline);
        plan.inline_skipped += (before - g.len()) as u64;
    }
    size_groups.retain(|g| g.len() > 1);

    // Within a size group, files on identical shared blocks are one cluster
    // (same bytes by construction): hash one representative per cluster.
    let mut clusters: Vec<Vec<Cand>> = Vec::new(); // each: members, rep first
    let mut cluster_groups: Vec<Vec<usize>> = Vec::new(); // size group -> cluster ids
    for g in size_groups {
        let mut ids = Vec::new();
        let mut by_runs: HashMap<Vec<(u64, u64, u64)>, usize> = HashMap::new();
        for c in g {
            match c.shared_runs.clone() {
                Some(runs) => {
                    if let Some(&id) = by_runs.get(&runs) {
                        clusters[id].push(c);
                    } else {
                        by_runs.insert(runs, clusters.len());
                        ids.push(clusters.len());
                        clusters.push(vec![c]);
                    }
                }
                None => {
                    ids.push(clusters.len());
                    clusters.push(vec![c]);
                }
            }
        }
        for cl in &mut clusters[ids[0]..] {
            cl.sort_by(|a, b| a.path.cmp(&b.path));
        }
        if ids.len() == 1 {
            // One cluster: every file already shares the same blocks.
            plan.groups_already_shared += 1;
            plan.files_already_shared += clusters[ids[0]].len() as u64 - 1;
            continue;
        }
        cluster_groups.push(ids);
    }

    if run.cancelled() {
        return Err(cancelled());
    }
    let hashed = AtomicU64::new(0);
    let total: u64 = cluster_groups
        .iter()
        .flatten()
        .map(|&id| clusters[id][0].size)
        .sum();
    run.enter(Phase::Hash, 0, total);
    let count = |n: u64| {
        hashed.fetch_add(n, Ordering::Relaxed);
        run.done(0, n);
    };
    let hash_errors = Mutex::new(Vec::new());
    // Partial hash (edges), then full hash, per cluster representative.
    let to_hash: Vec<usize> = cluster_groups.iter().flatten().copied().collect();
    let edges: HashMap<usize, [u8; 32]> = pool.install(|| {
        to_hash
            .par_iter()
            .filter_map(|&id| {
                if run.cancelled() {
                    return None;
                }
                let c = &clusters[id][0];
                if let Some(h) = c.small_hash {
                    count(c.size);
                    return Some((id, h));
                }
                hash_file(&c.path, c.size, true, &count)
                    .map_err(|e| lock(&hash_errors).push(e))
                    .ok()
                    .map(|h| (id, h))
            })
            .collect()
    });
    let mut need_full: Vec<usize> = Vec::new();
    for ids in &cluster_groups {
        let mut by_edge: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        for &id in ids {
            if let Some(h) = edges.get(&id) {
                by_edge.entry(*h).or_default().push(id);
            }
        }
        need_full.extend(by_edge.into_values().filter(|v| v.len() > 1).flatten());
    }
    let full: HashMap<usize, [u8; 32]> = pool.install(|| {
        need_full
            .par_iter()
            .filter_map(|&id| {
                if run.cancelled() {
                    return None;
                }
                let c = &clusters[id][0];
                if c.size <= 2 * EDGE {
                    return edges.get(&id).map(|h| (id, *h)); // the edges were everything
                }
                hash_file(&c.path, c.size, false, &count)
                    .map_err(|e| lock(&hash_errors).push(e))
                    .ok()
                    .map(|h| (id, h))
            })
            .collect()
    });
    if run.cancelled() {
        return Err(cancelled());
    }
    errors.extend(hash_errors.into_inner().unwrap_or_else(|e| e.into_inner()));
    plan.bytes_hashed = hashed.load(Ordering::Relaxed);

    for ids in &cluster_groups {
        let mut by_hash: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        for &id in ids {
            if let Some(h) = full.get(&id) {
                by_hash.entry(*h).or_default().push(id);
            }
        }
        for (hash, mut members) in by_hash {
            if members.len() < 2 {
                continue;
            }
            // Source: the largest cluster (fewest changes), then first path.
            members.sort_by(|&a, &b| {
                clusters[b]
                    .len()
                    .cmp(&clusters[a].len())
                    .then(clusters[a][0].path.cmp(&clusters[b][0].path))
            });
            let src_cluster = &clusters[members[0]];
            let mut targets: Vec<&Cand> = members[1..].iter().flat_map(|&m| &clusters[m]).collect();
            targets.sort_by(|a, b| a.path.cmp(&b.path));
            plan.files_already_shared += src_cluster.len() as u64 - 1;
            plan.groups.push(Group {
                size: src_cluster[0].size,
                blake3: crate::ground::hash::hex(&hash),
                source: src_cluster[0].path.clone(),
                reclaimable: targets.iter().map(|t| t.exclusive).sum(),
                targets: targets.iter().map(|t| t.path.clone()).collect(),
                already_shared: src_cluster[1..].iter().map(|c| c.path.clone()).collect(),
            });
        }
    }
    plan.groups.sort_by(|a, b| {
        b.reclaimable
            .cmp(&a.reclaimable)
            .then(a.source.cmp(&b.source))
    });
    errors.sort_by(|a, b| (a.src(), a.to_string()).cmp(&(b.src(), b.to_string())));
    plan.errors = errors;
    Ok(plan)
}

/// Open for reading without touching the access time where allowed.
fn open_read(path: &Path) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match fs::open(path, flags | OFlags::NOATIME, Mode::empty()) {
        Err(Errno::PERM) => fs::open(path, flags, Mode::empty()),
        other => other,
    }
}

/// BLAKE3 of the first and last [`EDGE`] bytes (`edges`, for files larger
/// than both edges) or of the whole file, checking the size is unchanged.
fn hash_file(path: &Path, size: u64, edges: bool, count: &dyn Fn(u64)) -> Result<[u8; 32]> {
    let op = Operation::Dedupe;
    let err = |e: Errno| Error::from_errno(op, e).with_src(path);
    let fd = open_read(path).map_err(err)?;
    let mut h = blake3::Hasher::new();
    if edges && size > 2 * EDGE {
        let mut buf = [0u8; EDGE as usize];
        for off in [0, size - EDGE] {
            let mut got = 0;
            while got < buf.len() {
                match rustix::io::pread(&fd, &mut buf[got..], off + got as u64).map_err(err)? {
                    0 => return Err(changed(path)),
                    n => got += n,
                }
            }
            h.update(&buf);
        }
        count(2 * EDGE);
        return Ok(*h.finalize().as_bytes());
    }
    let (hash, total) = crate::ground::hash::hash_fd(fd.as_fd(), size, count).map_err(err)?;
    if total != size {
        return Err(changed(path));
    }
    Ok(hash)
}

fn changed(path: &Path) -> Error {
    Error::new(Operation::Dedupe, ErrorKind::ContentChanged)
        .with_src(path)
        .with_reason("changed size while being read")
}

/// Whether files on `path`'s filesystem may be deduplicated: not a network
/// client, and the kernel's trial dedupe there works.
fn can_dedupe(path: &Path) -> Result<()> {
    let op = Operation::Dedupe;
    let dir = path.parent().unwrap_or(Path::new("."));
    let sfs = fs::statfs(dir).map_err(|e| Error::from_errno(op, e).with_src(dir))?;
    let kind = FsKind::from_magic(sfs.f_type as u64);
    if kind.is_network_client() {
        return Err(Error::new(op, ErrorKind::NotSupported).with_src(dir).with_reason(format!(
            "{kind} is a network client: its dedupe has cloned without comparing, which can lose data; run cowlink on the server"
        )));
    }
    let facts = crate::probe::filesystem(dir)?;
    match facts.dedupe.reason() {
        None => Ok(()),
        Some(why) => Err(Error::new(op, ErrorKind::NotSupported)
            .with_src(dir)
            .with_reason(format!("this filesystem cannot deduplicate: {why}"))),
    }
}

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
    for g in &plan.groups {
        if let Ok(fd) = open_read(&g.source) {
            if let Ok(st) = fs::fstat(&fd) {
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
    let work = || -> Vec<DedupeReport> {
        order
            .par_iter()
            .map(|g| {
                let mut r = DedupeReport::default();
                if !run.cancelled() {
                    r.groups = 1;
                    dedupe_group(g, &mut r, run);
                }
                r
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
    for r in parts {
        report.groups += r.groups;
        report.targets_deduped += r.targets_deduped;
        report.bytes_compared += r.bytes_compared;
        report.changed.extend(r.changed);
        report.errors.extend(r.errors);
    }
    for (fd, before) in free_before.values() {
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
