//! Can these paths clone? Answered honestly, in advance.
//!
//! "Does reflink work here" is decided by a real trial: two unnamed
//! (`O_TMPFILE`) scratch files in the directory, one block written to the
//! first, `FICLONE` into the second. Dedupe is tried the same way with
//! `FIDEDUPERANGE`. Scratch files have no names, so nothing is left behind
//! even if the process dies. Answers are cached per filesystem (device
//! number) until [`clear_cache`].
//!
//! For a pair ([`between`]) with a regular source file, the trial clones
//! the first block of the real source into a scratch file next to the
//! destination; that also catches kernels older than 5.18, which refuse to
//! clone across two mounts of one filesystem.
//!
//! Nothing here errors or hangs on odd mounts: every filesystem is probed
//! on a helper thread with a deadline, autofs triggers and kernel pseudo
//! filesystems are not touched, and what cannot be known is answered
//! [`Answer::Unknown`] with the reason.

#[cfg(unix)]
use std::collections::HashMap;
#[cfg(unix)]
use std::path::Path;
use std::path::PathBuf;
#[cfg(unix)]
use std::sync::{mpsc, LazyLock, Mutex};
#[cfg(unix)]
use std::time::Duration;

#[cfg(unix)]
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
#[cfg(unix)]
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags};
#[cfg(unix)]
use rustix::io::Errno;

#[cfg(unix)]
use crate::ground::error::{errno_text, is_not_possible_here, Error, Operation, Result};
use crate::ground::fskind::{CloneLimit, FsKind};
#[cfg(unix)]
use crate::ground::mountinfo;
#[cfg(unix)]
pub use crate::ground::mountinfo::MountEntry;
#[cfg(not(unix))]
pub use crate::stdfs::{between, clear_cache, filesystem, tree};

/// How long one filesystem may take to answer before it is "unknown".
#[cfg(unix)]
const DEADLINE: Duration = Duration::from_secs(5);
/// Size of the scratch data written for a trial.
#[cfg(unix)]
const TRIAL_BYTES: usize = 4096;

/// Yes, no, or unknown — with the reason for the latter two.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "answer", content = "reason", rename_all = "lowercase")]
pub enum Answer {
    /// It works (a trial succeeded).
    Yes,
    /// It does not work, and why.
    No(String),
    /// It could not be determined, and why.
    Unknown(String),
}

impl Answer {
    /// Whether the answer is [`Answer::Yes`].
    pub fn is_yes(&self) -> bool {
        matches!(self, Answer::Yes)
    }

    /// The reason, for `No` and `Unknown`.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Answer::Yes => None,
            Answer::No(r) | Answer::Unknown(r) => Some(r),
        }
    }

    /// "yes", "no" or "unknown".
    pub fn word(&self) -> &'static str {
        match self {
            Answer::Yes => "yes",
            Answer::No(_) => "no",
            Answer::Unknown(_) => "unknown",
        }
    }
}

/// What one filesystem can do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FsFacts {
    /// The directory that was probed.
    #[serde(flatten, serialize_with = "crate::name::json::path")]
    pub path: PathBuf,
    /// Filesystem kind (from the statfs magic when it answered).
    pub kind: FsKind,
    /// The statfs `f_type` magic, when statfs answered.
    pub magic: Option<u64>,
    /// The device number (`st_dev`) of the probed directory.
    pub device: Option<u64>,
    /// Block size (clone alignment unit), when statfs answered.
    pub block_size: Option<u64>,
    /// Whether files here can share blocks (trial clone).
    pub reflink: Answer,
    /// Whether the kernel deduplicates here (trial FIDEDUPERANGE).
    pub dedupe: Answer,
    /// References per block allowed, where known.
    pub clone_limit: CloneLimit,
}

#[cfg(unix)]
impl FsFacts {
    fn unknown(path: PathBuf, kind: FsKind, reason: String) -> FsFacts {
        FsFacts {
            path,
            kind,
            magic: None,
            device: None,
            block_size: None,
            reflink: Answer::Unknown(reason.clone()),
            dedupe: Answer::Unknown(reason),
            clone_limit: kind.clone_limit(),
        }
    }
}

/// Whether a source can clone to a destination.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Support {
    /// The source side.
    pub src: FsFacts,
    /// The destination side (its directory).
    pub dst: FsFacts,
    /// Both on one filesystem (same device, or a trial proved it).
    pub same_filesystem: bool,
    /// Whether cloning from `src` to `dst` works.
    pub reflink: Answer,
}

/// One mount found by [`tree`] and what it can do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MountSupport {
    /// Where it is mounted.
    #[serde(flatten, serialize_with = "crate::name::json::mount_point")]
    pub mount_point: PathBuf,
    /// What is mounted (device, server export, name).
    pub source: String,
    /// The type name from mountinfo.
    pub fstype: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// What the filesystem can do.
    pub facts: FsFacts,
}

/// (reflink, dedupe) answers of one filesystem.
#[cfg(unix)]
type Trial = (Answer, Answer);
/// Per filesystem (device number): its trial answers.
#[cfg(unix)]
static FS_CACHE: LazyLock<Mutex<HashMap<u64, Trial>>> = LazyLock::new(Default::default);
/// Per (source device, destination device): can one clone to the other.
#[cfg(unix)]
static PAIR_CACHE: LazyLock<Mutex<HashMap<(u64, u64), Answer>>> = LazyLock::new(Default::default);

/// Forget every cached answer (after remounting, for example).
#[cfg(unix)]
pub fn clear_cache() {
    FS_CACHE.lock().unwrap_or_else(|p| p.into_inner()).clear();
    PAIR_CACHE.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// Look up `key`, or compute and remember it. Only definite answers are
/// remembered: "unknown" may be about one directory (not writable), not
/// about the filesystem.
#[cfg(unix)]
fn cached_or<K: std::hash::Hash + Eq, V: Clone>(
    cache: &Mutex<HashMap<K, V>>,
    key: K,
    definite: impl Fn(&V) -> bool,
    compute: impl FnOnce() -> V,
) -> V {
    if let Some(v) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return v.clone();
    }
    let v = compute();
    if definite(&v) {
        cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, v.clone());
    }
    v
}

#[cfg(unix)]
fn is_definite(a: &Answer) -> bool {
    !matches!(a, Answer::Unknown(_))
}

/// Run `f` on a helper thread; `None` if it has not answered by `deadline`
/// (the thread is left to finish on its own, e.g. on a stale NFS mount).
#[cfg(unix)]
fn with_deadline<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("cowlink-probe".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    match spawned {
        Ok(_) => rx.recv_timeout(deadline).ok(),
        Err(_) => None,
    }
}

#[cfg(unix)]
fn no_answer(path: &Path, kind: FsKind) -> FsFacts {
    FsFacts::unknown(
        path.to_path_buf(),
        kind,
        format!(
            "no answer within {} s (stale network mount or hung device?)",
            DEADLINE.as_secs()
        ),
    )
}

/// An unnamed scratch file in `dir`, opened read-write. Falls back to a
/// named file that is unlinked at once where `O_TMPFILE` is unsupported.
#[cfg(unix)]
fn scratch(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    match cowlink_sys::open_unnamed(dir, Path::new("."), OFlags::RDWR, Mode::RUSR | Mode::WUSR) {
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
            let name = format!(
                ".cowlink-probe-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            )
            .replace(['(', ')'], "");
            let flags = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC;
            let fd = fs::openat(dir, &*name, flags, Mode::RUSR | Mode::WUSR)?;
            let _ = fs::unlinkat(dir, &*name, AtFlags::empty());
            Ok(fd)
        }
        r => r,
    }
}

#[cfg(unix)]
fn scratch_with_data(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let fd = scratch(dir)?;
    let data = [0x5au8; TRIAL_BYTES];
    let mut done = 0;
    while done < data.len() {
        done += rustix::io::pwrite(&fd, &data[done..], done as u64)?;
    }
    Ok(fd)
}

/// Why no trial could be made, completed with what we know of the kind.
#[cfg(unix)]
fn untried(kind: FsKind, why: String) -> Answer {
    if kind.never_reflinks() {
        Answer::No(format!("{kind}: {}", kind.reflink_hint()))
    } else {
        Answer::Unknown(format!("{why}; {}", kind.reflink_hint()))
    }
}

/// Trial clone and trial dedupe in `dir`.
#[cfg(unix)]
fn trial(dir: &Path, dirfd: BorrowedFd<'_>, kind: FsKind) -> Trial {
    let a = match scratch_with_data(dirfd) {
        Ok(fd) => fd,
        Err(e) => return no_scratch(dir, kind, e),
    };
    let reflink = clone_answer(
        kind,
        scratch(dirfd).and_then(|b| cowlink_sys::ficlone(b.as_fd(), a.as_fd())),
    );
    let dedupe = if kind.is_network_client() {
        network_dedupe()
    } else {
        match scratch_with_data(dirfd) {
            Err(e) => Answer::Unknown(format!("cannot make a scratch file: {}", errno_text(e))),
            Ok(c) => dedupe_answer(
                kind,
                cowlink_sys::fideduperange(a.as_fd(), 0, TRIAL_BYTES as u64, &[(c.as_fd(), 0)])
                    .map(|r| r[0].status),
            ),
        }
    };
    (reflink, dedupe)
}

/// The answers when no scratch file could be made in `dir` (errno `e`):
/// the kind decides where it can (a filesystem that never clones), else
/// unknown. Not being allowed to write there says nothing of the
/// filesystem, so those answers carry no hint about how it was made.
#[cfg(unix)]
fn no_scratch(dir: &Path, kind: FsKind, e: Errno) -> Trial {
    let why = format!(
        "cannot make a scratch file in {} to try: {}",
        crate::name::quoted(dir),
        errno_text(e)
    );
    if matches!(e, Errno::ACCESS | Errno::PERM | Errno::ROFS) && !kind.never_reflinks() {
        let dedupe = match kind.is_network_client() {
            true => network_dedupe(),
            false => Answer::Unknown(why.clone()),
        };
        return (Answer::Unknown(why), dedupe);
    }
    let dedupe = if kind.is_network_client() {
        network_dedupe()
    } else {
        untried(kind, why.clone())
    };
    (untried(kind, why), dedupe)
}

/// The answer a trial clone on `kind` gives.
#[cfg(unix)]
fn clone_answer(kind: FsKind, r: std::result::Result<(), Errno>) -> Answer {
    match r {
        Ok(()) => Answer::Yes,
        Err(e) if is_not_possible_here(e) => Answer::No(format!(
            "{kind} refused a trial clone ({}): {}",
            errno_text(e),
            kind.reflink_hint()
        )),
        Err(e) => Answer::Unknown(format!("trial clone failed: {}", errno_text(e))),
    }
}

/// The answer a trial dedupe of identical data on `kind` gives.
#[cfg(unix)]
fn dedupe_answer(kind: FsKind, r: std::result::Result<cowlink_sys::DedupeStatus, Errno>) -> Answer {
    match r {
        Ok(cowlink_sys::DedupeStatus::Same) => Answer::Yes,
        Ok(cowlink_sys::DedupeStatus::Differs) => {
            Answer::Unknown("trial dedupe saw identical data as different".into())
        }
        Ok(cowlink_sys::DedupeStatus::Error(e)) | Err(e) => dedupe_refused(kind, e),
    }
}

#[cfg(unix)]
fn dedupe_refused(kind: FsKind, e: Errno) -> Answer {
    if is_not_possible_here(e) {
        Answer::No(format!("{kind} refused a trial dedupe ({})", errno_text(e)))
    } else {
        Answer::Unknown(format!("trial dedupe failed: {}", errno_text(e)))
    }
}

#[cfg(unix)]
fn network_dedupe() -> Answer {
    Answer::No(
        "refused on network filesystem clients: their dedupe has cloned without comparing on some kernels".into(),
    )
}

/// Facts for the directory `dir` (which must exist), without a deadline.
#[cfg(unix)]
fn facts_of_dir(dir: &Path) -> Result<FsFacts> {
    let err = |e: Errno| Error::from_errno(Operation::Probe, e).with_src(dir);
    let dirfd = fs::open(
        dir,
        cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(err)?;
    let st = cowlink_sys::fstat(&dirfd).map_err(err)?;
    let sfs = cowlink_sys::fs_stat(dirfd.as_fd()).map_err(err)?;
    let kind = FsKind::of_stat(&sfs);
    let (reflink, dedupe) = if let Some(why) = cowlink_sys::CLONE_UNAVAILABLE {
        let named = sfs.type_name.as_deref().unwrap_or("unnamed");
        let no = Answer::No(format!("filesystem kind {kind} ({named}): {why}"));
        (no.clone(), no)
    } else if kind == FsKind::Pseudo {
        let no = Answer::No(format!("{kind} filesystem: holds no file data"));
        (no.clone(), no)
    } else {
        cached_or(
            &FS_CACHE,
            st.st_dev,
            |t: &Trial| is_definite(&t.0) && is_definite(&t.1),
            || trial(dir, dirfd.as_fd(), kind),
        )
    };
    Ok(FsFacts {
        path: dir.to_path_buf(),
        kind,
        magic: sfs.magic,
        device: Some(st.st_dev),
        block_size: Some(sfs.block_size),
        reflink,
        dedupe,
        clone_limit: kind.clone_limit(),
    })
}

/// The directory a path's facts are about: itself if a directory, else
/// its parent.
#[cfg(unix)]
fn dir_of(path: &Path) -> Result<PathBuf> {
    match cowlink_sys::stat(path) {
        Ok(st) if cowlink_sys::file_type(st.st_mode) == FileType::Directory => {
            Ok(path.to_path_buf())
        }
        Ok(_) => Ok(parent_of(path)),
        Err(e) => Err(Error::from_errno(Operation::Probe, e).with_src(path)),
    }
}

#[cfg(unix)]
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// What the filesystem holding `path` can do.
///
/// # Errors
/// `NotFound` or `PermissionDenied` for the path itself. A filesystem that
/// does not answer within the deadline gives `Unknown` answers, not an error.
#[cfg(unix)]
pub fn filesystem(path: impl AsRef<Path>) -> Result<FsFacts> {
    // Even the first `stat` of the path can hang (a FUSE server or NFS
    // server that never answers): everything runs under the deadline.
    let p = path.as_ref().to_path_buf();
    let shown = p.clone();
    with_deadline(DEADLINE, move || facts_of_dir(&dir_of(&p)?))
        .unwrap_or_else(|| Ok(no_answer(&shown, FsKind::Other)))
}

/// Whether `src` can be cloned to `dst`.
///
/// `src` is a file or directory; `dst` is a directory, or a file path whose
/// directory exists. When `src` is a readable regular file the answer comes
/// from cloning its first block into a scratch file next to `dst`.
///
/// # Errors
/// `NotFound` when `src` or `dst`'s directory does not exist.
#[cfg(unix)]
pub fn between(src: impl AsRef<Path>, dst: impl AsRef<Path>) -> Result<Support> {
    let (src, dst) = (src.as_ref().to_path_buf(), dst.as_ref().to_path_buf());
    let (s, d) = (src.clone(), dst.clone());
    // Every step, the first `stat` of each path included, under the deadline.
    match with_deadline(DEADLINE, move || between_checked(s, d)) {
        Some(r) => r,
        None => {
            let reason = no_answer(&dst, FsKind::Other).reflink;
            Ok(Support {
                src: no_answer(&src, FsKind::Other),
                dst: no_answer(&dst, FsKind::Other),
                same_filesystem: false,
                reflink: reason,
            })
        }
    }
}

/// `between` without the deadline: check both paths, then probe.
#[cfg(unix)]
fn between_checked(src: PathBuf, dst: PathBuf) -> Result<Support> {
    let src_st = cowlink_sys::stat(&src)
        .map_err(|e| Error::from_errno(Operation::Probe, e).with_src(&src))?;
    let dst_dir = match cowlink_sys::stat(&dst) {
        Ok(st) if cowlink_sys::file_type(st.st_mode) == FileType::Directory => dst.clone(),
        Ok(_) | Err(Errno::NOENT) => parent_of(&dst),
        Err(e) => return Err(Error::from_errno(Operation::Probe, e).with_src(&dst)),
    };
    cowlink_sys::stat(&dst_dir).map_err(|e| {
        Error::from_errno(Operation::Probe, e)
            .with_src(&dst_dir)
            .with_reason(format!(
                "destination directory {}: {}",
                crate::name::quoted(&dst_dir),
                errno_text(e)
            ))
    })?;
    between_inner(&src, src_st.st_mode, &dst_dir)
}

#[cfg(unix)]
fn between_inner(src: &Path, src_mode: u32, dst_dir: &Path) -> Result<Support> {
    let src_is_file = cowlink_sys::file_type(src_mode) == FileType::RegularFile;
    let src_facts = facts_of_dir(&if src_is_file {
        parent_of(src)
    } else {
        src.to_path_buf()
    })?;
    let dst_facts = facts_of_dir(dst_dir)?;
    let (sdev, ddev) = (src_facts.device.unwrap_or(0), dst_facts.device.unwrap_or(0));
    let swap = src_is_file && is_active_swap(src);
    let (reflink, same) = pair_verdict(&src_facts, &dst_facts, src_is_file, swap, |different| {
        cached_or(&PAIR_CACHE, (sdev, ddev), is_definite, || {
            pair_trial(src, dst_dir, different)
        })
    });
    Ok(Support {
        src: src_facts,
        dst: dst_facts,
        same_filesystem: same,
        reflink,
    })
}

/// Whether a source can clone to a destination, from what is known of
/// both filesystems, whether the source is a regular file and an active
/// swap file; `trial` clones the real source (given the words for
/// "different filesystems") and is called only when nothing else decides.
/// Returns the answer and whether both are on one filesystem (same device,
/// or a trial clone proved it).
#[cfg(unix)]
fn pair_verdict(
    src: &FsFacts,
    dst: &FsFacts,
    src_is_file: bool,
    swap: bool,
    trial: impl FnOnce(&str) -> Answer,
) -> (Answer, bool) {
    let same = src.device.unwrap_or(0) == dst.device.unwrap_or(0);
    let different = format!("different filesystems ({} → {})", src.kind, dst.kind);
    if let Answer::No(r) = &dst.reflink {
        (Answer::No(r.clone()), same)
    } else if swap {
        // Of this file only: not cached for the pair of filesystems.
        (Answer::No(crate::ground::error::SWAP_REASON.into()), same)
    } else if src_is_file {
        let answer = trial(&different);
        let proved = answer.is_yes();
        (answer, same || proved)
    } else if same {
        (dst.reflink.clone(), same)
    } else if src.kind == FsKind::Btrfs && dst.kind == FsKind::Btrfs {
        (
            Answer::Unknown(
                "different Btrfs devices (subvolumes of one filesystem can clone); probe a file to be sure".into(),
            ),
            same,
        )
    } else {
        (Answer::No(different), same)
    }
}

/// Whether `path` is an active swap file (listed in /proc/swaps, whose
/// names are escaped as in mountinfo).
#[cfg(unix)]
fn is_active_swap(path: &Path) -> bool {
    let Ok(st) = cowlink_sys::stat(path) else {
        return false;
    };
    let Some(swaps) = cowlink_sys::swaps() else {
        return false;
    };
    swaps.lines().skip(1).any(|line| {
        let Some(name) = line.split_whitespace().next() else {
            return false;
        };
        cowlink_sys::stat(mountinfo::unescape(name).as_os_str())
            .is_ok_and(|s| (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino))
    })
}

/// Clone the first block of the real source into a scratch file in `dst_dir`.
#[cfg(unix)]
fn pair_trial(src: &Path, dst_dir: &Path, different: &str) -> Answer {
    let sfd = match fs::open(
        src,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => return Answer::Unknown(format!("cannot open the source: {}", errno_text(e))),
    };
    let dfd = match fs::open(
        dst_dir,
        cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            return Answer::Unknown(format!("cannot open the destination: {}", errno_text(e)))
        }
    };
    let (size, block) = match (cowlink_sys::fstat(&sfd), cowlink_sys::fs_stat(sfd.as_fd())) {
        (Ok(st), Ok(sfs)) => (st.st_size as u64, sfs.block_size),
        (Err(e), _) | (_, Err(e)) => return Answer::Unknown(errno_text(e)),
    };
    // One aligned block, or to EOF (len 0) for files smaller than a block.
    let len = if size >= block { block } else { 0 };
    let target = match scratch(dfd.as_fd()) {
        Ok(fd) => fd,
        Err(e) => {
            return Answer::Unknown(format!(
                "cannot make a scratch file in {}: {}",
                crate::name::quoted(dst_dir),
                errno_text(e)
            ))
        }
    };
    match cowlink_sys::ficlonerange(target.as_fd(), sfd.as_fd(), 0, len, 0) {
        Ok(()) => Answer::Yes,
        Err(Errno::XDEV) => Answer::No(different.to_string()),
        Err(e) if is_not_possible_here(e) => {
            Answer::No(format!("trial clone refused: {}", errno_text(e)))
        }
        Err(e) => Answer::Unknown(format!("trial clone failed: {}", errno_text(e))),
    }
}

/// Every mount this process sees, in the kernel's order (of several on
/// one mount point, the last is the visible one), from
/// `/proc/self/mountinfo`. Nothing is probed: this is the table only, for
/// callers that match mounts to devices (volume tooling); [`tree`] says
/// what each mount under a root can do.
///
/// # Errors
/// When the mount table cannot be read (or this system has none in
/// Linux's format).
#[cfg(unix)]
pub fn mounts() -> Result<Vec<MountEntry>> {
    let text = cowlink_sys::mount_table()
        .map_err(|e| Error::from_io(Operation::Probe, &e).with_src(cowlink_sys::MOUNT_TABLE))?;
    Ok(mountinfo::parse(&text))
}

/// Every mount at or under `root` (the mount holding `root` first), from
/// `/proc/self/mountinfo`, with what each can do. Mounts are probed in
/// parallel, each with a deadline; autofs triggers and pseudo filesystems
/// are reported without being touched.
///
/// # Errors
/// Only when `root` cannot be resolved or mountinfo cannot be read.
#[cfg(unix)]
pub fn tree(root: impl AsRef<Path>) -> Result<Vec<MountSupport>> {
    let root = root.as_ref();
    let r = root.to_path_buf();
    // Resolving the root stats every component, and one of them may be a
    // mount that never answers: then the root is taken as written (made
    // absolute), and that mount's row says it did not answer.
    let canon = match with_deadline(DEADLINE, move || std::fs::canonicalize(r)) {
        Some(resolved) => {
            resolved.map_err(|e| Error::from_io(Operation::Probe, &e).with_src(root))?
        }
        None => std::path::absolute(root)
            .map_err(|e| Error::from_io(Operation::Probe, &e).with_src(root))?,
    };
    let text = cowlink_sys::mount_table()
        .map_err(|e| Error::from_io(Operation::Probe, &e).with_src(cowlink_sys::MOUNT_TABLE))?;
    let mounts = mountinfo::at_or_under(&mountinfo::parse(&text), &canon);
    let handles: Vec<_> = mounts
        .into_iter()
        .map(|m| {
            let (tx, rx) = mpsc::channel();
            let mp = m.mount_point.clone();
            let kind = FsKind::from_name(&m.fstype);
            let probe = !matches!(kind, FsKind::Pseudo | FsKind::Autofs);
            if probe {
                let _ = std::thread::Builder::new()
                    .name("cowlink-probe".into())
                    .spawn(move || {
                        let _ = tx.send(facts_of_dir(&mp));
                    });
            }
            (m, kind, probe, rx)
        })
        .collect();
    let deadline = std::time::Instant::now() + DEADLINE;
    Ok(handles
        .into_iter()
        .map(|(m, kind, probe, rx)| {
            let facts = if !probe {
                untouched(&m, kind)
            } else {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(Ok(f)) => f,
                    Ok(Err(e)) => FsFacts::unknown(m.mount_point.clone(), kind, e.reason()),
                    Err(_) => no_answer(&m.mount_point, kind),
                }
            };
            MountSupport {
                read_only: m.read_only(),
                mount_point: m.mount_point,
                source: m.source,
                fstype: m.fstype,
                facts,
            }
        })
        .collect())
}

#[cfg(unix)]
fn untouched(m: &MountEntry, kind: FsKind) -> FsFacts {
    let (reflink, dedupe) = if kind == FsKind::Autofs {
        let why = "autofs trigger: not probed, to avoid mounting or hanging".to_string();
        (Answer::Unknown(why.clone()), Answer::Unknown(why))
    } else {
        let no = Answer::No(format!(
            "{} is a pseudo filesystem: holds no file data",
            m.fstype
        ));
        (no.clone(), no)
    };
    FsFacts {
        path: m.mount_point.clone(),
        kind,
        magic: None,
        device: None,
        block_size: None,
        reflink,
        dedupe,
        clone_limit: CloneLimit::Unknown,
    }
}

#[cfg(test)]
mod tests {
    //! The probe's reasoning from given facts: what each trial outcome,
    //! refusal and pair of filesystems means, without a filesystem.
    use super::*;

    fn facts(kind: FsKind, device: u64, reflink: Answer) -> FsFacts {
        FsFacts {
            path: PathBuf::from(format!("/mnt/{device}")),
            kind,
            magic: None,
            device: Some(device),
            block_size: Some(4096),
            dedupe: reflink.clone(),
            reflink,
            clone_limit: kind.clone_limit(),
        }
    }

    const KINDS: [FsKind; 6] = [
        FsKind::Xfs,
        FsKind::Btrfs,
        FsKind::Ext4,
        FsKind::Tmpfs,
        FsKind::Nfs,
        FsKind::Other,
    ];

    #[test]
    fn a_trial_clone_answers_yes_no_or_unknown_by_the_errno() {
        for kind in KINDS {
            assert_eq!(clone_answer(kind, Ok(())), Answer::Yes);
            for e in [Errno::OPNOTSUPP, Errno::XDEV, Errno::INVAL] {
                let a = clone_answer(kind, Err(e));
                let Answer::No(why) = &a else {
                    panic!("{kind} {e:?}: {a:?}")
                };
                assert!(why.contains(&kind.to_string()), "{why}");
                assert!(why.contains(kind.reflink_hint()), "{why}");
            }
            // An I/O error or no space says nothing of the filesystem.
            for e in [Errno::IO, Errno::NOSPC, Errno::NOMEM] {
                assert!(
                    matches!(clone_answer(kind, Err(e)), Answer::Unknown(_)),
                    "{kind} {e:?}"
                );
            }
        }
    }

    #[test]
    fn a_trial_dedupe_answers_by_status_and_errno() {
        use cowlink_sys::DedupeStatus as S;
        let k = FsKind::Xfs;
        assert_eq!(dedupe_answer(k, Ok(S::Same)), Answer::Yes);
        assert!(
            matches!(dedupe_answer(k, Ok(S::Differs)), Answer::Unknown(r) if r.contains("different"))
        );
        for r in [
            Ok(S::Error(Errno::OPNOTSUPP)),
            Err(Errno::OPNOTSUPP),
            Err(Errno::INVAL),
        ] {
            assert!(
                matches!(dedupe_answer(k, r), Answer::No(w) if w.contains("refused a trial dedupe"))
            );
        }
        for r in [Ok(S::Error(Errno::IO)), Err(Errno::IO)] {
            assert!(matches!(dedupe_answer(k, r), Answer::Unknown(_)));
        }
    }

    #[test]
    fn without_a_scratch_file_the_kind_decides_where_it_can() {
        let dir = Path::new("/m/d");
        for kind in KINDS {
            for e in [
                Errno::ACCESS,
                Errno::PERM,
                Errno::ROFS,
                Errno::NOSPC,
                Errno::IO,
            ] {
                let (reflink, dedupe) = no_scratch(dir, kind, e);
                let denied = matches!(e, Errno::ACCESS | Errno::PERM | Errno::ROFS);
                let what = format!("{kind} {e:?}: {reflink:?} {dedupe:?}");
                if kind.never_reflinks() {
                    // ext4, tmpfs: no trial is needed to say no.
                    assert!(
                        matches!(&reflink, Answer::No(r) if r.contains(kind.reflink_hint())),
                        "{what}"
                    );
                } else {
                    assert!(
                        matches!(&reflink, Answer::Unknown(r) if r.contains("/m/d")),
                        "{what}"
                    );
                    // Not allowed to write: no hint about how it was made.
                    let hinted = reflink.reason().unwrap().contains(kind.reflink_hint());
                    assert_eq!(hinted, !denied, "{what}");
                }
                if kind.is_network_client() {
                    assert_eq!(dedupe, network_dedupe(), "{what}");
                } else if !kind.never_reflinks() {
                    assert!(matches!(dedupe, Answer::Unknown(_)), "{what}");
                }
            }
        }
    }

    #[test]
    fn a_pair_is_decided_by_the_destination_swap_trial_and_devices() {
        let yes = Answer::Yes;
        let xfs = |dev| facts(FsKind::Xfs, dev, Answer::Yes);
        let btrfs = |dev| facts(FsKind::Btrfs, dev, Answer::Yes);
        let ext4 = |dev| facts(FsKind::Ext4, dev, Answer::No("ext4 never".into()));
        let called = std::cell::Cell::new(0);
        let trial = |a: Answer| {
            let called = &called;
            move |_: &str| {
                called.set(called.get() + 1);
                a
            }
        };
        // A destination that cannot clone decides, without a trial.
        let (a, same) = pair_verdict(&xfs(1), &ext4(2), true, false, trial(yes.clone()));
        assert_eq!(
            (a, same, called.get()),
            (Answer::No("ext4 never".into()), false, 0)
        );
        // An active swap file never clones, whatever the filesystems.
        let (a, _) = pair_verdict(&xfs(1), &xfs(1), true, true, trial(yes.clone()));
        assert_eq!(a, Answer::No(crate::ground::error::SWAP_REASON.into()));
        assert_eq!(called.get(), 0);
        // A regular source: the trial answers, and a successful one proves
        // one filesystem across two devices (two mounts, subvolumes).
        let (a, same) = pair_verdict(&btrfs(1), &btrfs(2), true, false, trial(yes.clone()));
        assert_eq!((a, same, called.get()), (Answer::Yes, true, 1));
        let (a, same) = pair_verdict(&xfs(1), &xfs(2), true, false, |d: &str| {
            Answer::No(d.into())
        });
        assert_eq!(
            (a, same),
            (
                Answer::No("different filesystems (xfs → xfs)".into()),
                false
            )
        );
        // A directory source: the devices and kinds decide.
        let (a, same) = pair_verdict(
            &xfs(1),
            &xfs(1),
            false,
            false,
            trial(Answer::No("x".into())),
        );
        assert_eq!((a, same, called.get()), (Answer::Yes, true, 1));
        let (a, _) = pair_verdict(&btrfs(1), &btrfs(2), false, false, trial(yes.clone()));
        assert!(matches!(a, Answer::Unknown(r) if r.contains("subvolumes")));
        let (a, same) = pair_verdict(&btrfs(1), &xfs(2), false, false, trial(yes.clone()));
        assert_eq!(
            (a, same),
            (
                Answer::No("different filesystems (btrfs → xfs)".into()),
                false
            )
        );
        assert_eq!(called.get(), 1, "no trial for directories");
    }

    #[test]
    fn pseudo_and_autofs_mounts_are_answered_untouched() {
        let m = |fstype: &str| MountEntry {
            id: 1,
            parent: 0,
            dev: (0, 1),
            mount_point: PathBuf::from("/x"),
            options: "rw".into(),
            fstype: fstype.into(),
            source: "none".into(),
        };
        let f = untouched(&m("proc"), FsKind::Pseudo);
        assert!(matches!(&f.reflink, Answer::No(r) if r.contains("proc is a pseudo filesystem")));
        assert_eq!(f.reflink, f.dedupe);
        let f = untouched(&m("autofs"), FsKind::Autofs);
        assert!(matches!(&f.reflink, Answer::Unknown(r) if r.contains("autofs")));
        assert_eq!((f.magic, f.device), (None, None));
    }

    #[test]
    fn only_definite_answers_are_cached() {
        let cache = Mutex::new(HashMap::new());
        let n = std::cell::Cell::new(0);
        let ask = |a: Answer| {
            cached_or(&cache, 7u64, is_definite, || {
                n.set(n.get() + 1);
                a
            })
        };
        assert!(matches!(
            ask(Answer::Unknown("busy".into())),
            Answer::Unknown(_)
        ));
        assert_eq!(ask(Answer::Yes), Answer::Yes, "an unknown is asked again");
        assert_eq!(ask(Answer::No("x".into())), Answer::Yes, "a yes is kept");
        assert_eq!(n.get(), 2);
    }
}
