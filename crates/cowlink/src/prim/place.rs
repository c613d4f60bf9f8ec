//! How a destination name comes into being: the one placement primitive
//! that `clone_file`, tree copies, store checkouts and `PreallocWriter`
//! share.
//!
//! Two ways, chosen per situation by [`Placement`]:
//!
//! - **Atomic** ([`PendingFile`]): the data goes to an `O_TMPFILE` in the
//!   destination directory, an inode with no name, linked into place
//!   (`linkat`) only when complete with its metadata. An error, a cancel or
//!   a crash at any point leaves nothing under the final name. Replacing an
//!   existing name links to a temporary name and `rename`s it over (atomic
//!   swap; a hardlink of the old file keeps its old content). This is what
//!   protects an existing name, and it is the only way used over one.
//! - **Direct** ([`NewFile`] with [`Placement::Direct`]): `openat(O_CREAT |
//!   O_EXCL)` under the final name, in a directory this run created (so no
//!   name there can be anyone else's), and `unlinkat` on error or cancel.
//!   On XFS with several threads `O_TMPFILE` + `linkat` cost 2.2× a plain
//!   create (the unlinked-inode list is one lock), and nothing in a new
//!   directory needs protecting. The price: a process killed with
//!   `SIGKILL`, or a power cut, can leave a partly written file under its
//!   final name. Such a file never has the source's modification time
//!   (times are set last), which is how `cp --resume` recognises it; see
//!   README "Crash semantics".
//!
//! Unfinished direct files are registered ([`remove_unfinished`]), so a
//! forced exit (a second Ctrl-C) can remove them before the process ends.
//!
//! Filesystems without `O_TMPFILE` (some network and FUSE filesystems) get a
//! named temporary (`.NAME.cowlink-PID-N.tmp`) that is removed on drop and
//! renamed with `RENAME_NOREPLACE` on success. Only that fallback can leave a
//! temporary behind, and only if the process is killed.

#[cfg(unix)]
use std::ffi::{OsStr, OsString};
#[cfg(unix)]
use std::os::unix::ffi::{OsStrExt, OsStringExt};
#[cfg(unix)]
use std::path::{Path, PathBuf};
#[cfg(unix)]
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(unix)]
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
#[cfg(unix)]
use rustix::fs::{self, AtFlags, Mode, OFlags};
#[cfg(unix)]
use rustix::io::Errno;

#[cfg(unix)]
use super::facts::StatFacts;

/// What to do when the destination name already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Overwrite {
    /// Fail with `AlreadyExists` (the default).
    #[default]
    Refuse,
    /// Atomically replace the destination. Other hardlinks of the old file
    /// keep the old content: nothing is written through them.
    Replace,
    /// Keep an existing destination as it is (`cp -n`): nothing is
    /// written, and the result says so ([`Method::Skipped`] for one file,
    /// [`TreeEvent::Skipped`] and [`TreeReport::skipped`] in a tree). What
    /// exists is not inspected: a partial file left by a killed run is
    /// kept too (use [`TreeOptions::resume`] to recopy those).
    ///
    /// [`Method::Skipped`]: crate::Method::Skipped
    /// [`TreeEvent::Skipped`]: crate::tree::TreeEvent::Skipped
    /// [`TreeReport::skipped`]: crate::tree::TreeReport::skipped
    /// [`TreeOptions::resume`]: crate::tree::TreeOptions::resume
    Skip,
}

#[cfg(unix)]
enum TempName {
    /// `O_TMPFILE`: no name until `persist`.
    Anonymous,
    /// Fallback: a named temporary, removed on drop unless persisted.
    Named(PathBuf),
}

/// A destination file being written, not yet visible under its final name.
///
/// Names (the directory to create in, the final name, temporaries) are
/// relative to `dir`: the current directory for path-based calls, an open
/// directory for the tree engine (no path resolution per file).
#[cfg(unix)]
pub(crate) struct PendingFile<'d> {
    file: OwnedFd,
    dir: BorrowedFd<'d>,
    temp: TempName,
}

#[cfg(unix)]
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary name next to `name`, unique within this process and short
/// enough for NAME_MAX.
#[cfg(unix)]
pub(crate) fn temp_name(name: &OsStr) -> OsString {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let stem = &name.as_bytes()[..name.len().min(200)];
    let mut v = Vec::with_capacity(stem.len() + 40);
    v.push(b'.');
    v.extend_from_slice(stem);
    v.extend_from_slice(format!(".cowlink-{}-{n}.tmp", std::process::id()).as_bytes());
    OsString::from_vec(v)
}

/// The temporary path next to `dst` (which has a file name).
#[cfg(unix)]
fn temp_path(dst: &Path) -> PathBuf {
    dst.with_file_name(temp_name(dst.file_name().unwrap_or_default()))
}

#[cfg(unix)]
impl<'d> PendingFile<'d> {
    /// Create an unnamed, writable file in the directory `parent` (relative
    /// to `dir`) that will become `dst` (relative to `dir`), with `mode`
    /// (the umask applies, as for `open(2)` with `O_CREAT`).
    pub(crate) fn create(
        dir: BorrowedFd<'d>,
        parent: &Path,
        dst: &Path,
        mode: Mode,
    ) -> Result<Self, Errno> {
        Self::create_with(dir, parent, dst, mode, OFlags::WRONLY)
    }

    /// [`create`](Self::create), but readable too (the store hashes what it
    /// wrote through the same descriptor).
    pub(crate) fn create_rw(
        dir: BorrowedFd<'d>,
        parent: &Path,
        dst: &Path,
        mode: Mode,
    ) -> Result<Self, Errno> {
        Self::create_with(dir, parent, dst, mode, OFlags::RDWR)
    }

    fn create_with(
        dir: BorrowedFd<'d>,
        parent: &Path,
        dst: &Path,
        mode: Mode,
        access: OFlags,
    ) -> Result<Self, Errno> {
        match cowlink_sys::open_unnamed(dir, parent, access, mode) {
            Ok(file) => Ok(PendingFile {
                file,
                dir,
                temp: TempName::Anonymous,
            }),
            // No O_TMPFILE here: EOPNOTSUPP from the filesystem, EISDIR or
            // EINVAL from kernels or layers that do not know the flag.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                let tmp = temp_path(dst);
                let flags = OFlags::CREATE | OFlags::EXCL | access | OFlags::CLOEXEC;
                let file = fs::openat(dir, &tmp, flags, mode)?;
                Ok(PendingFile {
                    file,
                    dir,
                    temp: TempName::Named(tmp),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The file being written.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Give the file its final name `dst` (relative to the directory it
    /// was created in).
    ///
    /// With [`Overwrite::Refuse`] (and [`Overwrite::Skip`]) an existing
    /// name gives `EEXIST` and nothing changes. With [`Overwrite::Replace`] the name is swapped
    /// atomically. On any error the temporary is gone afterwards.
    pub(crate) fn persist(self, dst: &Path, overwrite: Overwrite) -> Result<(), Errno> {
        let dir = self.dir;
        self.persist_in(dir, dst, overwrite)
    }

    /// [`persist`](Self::persist) under `dst` relative to the directory
    /// `target` (on the same filesystem), e.g. a store's object directory
    /// opened without following symbolic links.
    pub(crate) fn persist_in(
        mut self,
        target: BorrowedFd<'_>,
        dst: &Path,
        overwrite: Overwrite,
    ) -> Result<(), Errno> {
        match std::mem::replace(&mut self.temp, TempName::Anonymous) {
            TempName::Anonymous => match overwrite {
                Overwrite::Refuse | Overwrite::Skip => self.link_anonymous(target, dst),
                Overwrite::Replace => {
                    let tmp = temp_path(dst);
                    self.link_anonymous(target, &tmp)?;
                    let r = fs::renameat(target, &tmp, target, dst);
                    if r.is_err() {
                        let _ = fs::unlinkat(target, &tmp, AtFlags::empty());
                    }
                    r
                }
            },
            TempName::Named(tmp) => {
                self.temp = TempName::Named(tmp.clone());
                match overwrite {
                    Overwrite::Replace => fs::renameat(self.dir, &tmp, target, dst)?,
                    Overwrite::Refuse | Overwrite::Skip => {
                        match cowlink_sys::rename_noreplace(self.dir, &tmp, target, dst) {
                            Ok(()) => {}
                            // The filesystem lacks RENAME_NOREPLACE: link (atomic
                            // no-clobber); the drop removes the temporary name.
                            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                                return fs::linkat(self.dir, &tmp, target, dst, AtFlags::empty());
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                self.temp = TempName::Anonymous;
                Ok(())
            }
        }
    }

    /// Link the unnamed file into place as `name` in `target`.
    fn link_anonymous(&self, target: BorrowedFd<'_>, name: &Path) -> Result<(), Errno> {
        cowlink_sys::link_fd(self.file.as_fd(), target, name)
    }
}

#[cfg(unix)]
impl Drop for PendingFile<'_> {
    fn drop(&mut self) {
        if let TempName::Named(tmp) = &self.temp {
            let _ = fs::unlinkat(self.dir, tmp, AtFlags::empty());
        }
    }
}

/// How a new destination file gets its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Create under the final name at once, remove it on error or cancel.
    /// Only used where nothing can be overwritten: in a directory this run
    /// created. A `SIGKILL` or power cut can leave a partial file, which
    /// never carries the source's modification time.
    Direct,
    /// Write an unnamed file and link it into place complete: a name is
    /// complete or absent even after a crash (the default for single files
    /// and for any existing directory).
    #[default]
    Atomic,
}

impl Placement {
    /// The placement for a file in a directory: direct where this run
    /// created the directory (unless every name must be crash-atomic),
    /// atomic otherwise.
    pub fn choose(dir_created_by_us: bool, crash_atomic: bool) -> Placement {
        if dir_created_by_us && !crash_atomic {
            Placement::Direct
        } else {
            Placement::Atomic
        }
    }
}

/// The mark of a file a tree copy is still writing under its final name
/// (direct placement): the sticky bit, which means nothing on a Linux
/// regular file. It is set at creation and cleared with the file's final
/// mode, so a file a `kill -9` or power cut interrupted keeps it.
#[cfg(unix)]
pub(crate) const UNFINISHED_MARK: u32 = 0o1000;

/// Whether `dst` (a destination's mode bits) carries the mark of a file an
/// interrupted copy left unfinished, where its source `src` has no sticky
/// bit of its own. Such a file is never kept as up to date (`cp -u`,
/// `--resume`): it is copied again.
#[cfg(unix)]
pub fn left_unfinished(src_mode: u32, dst_mode: u32) -> bool {
    cowlink_sys::file_type(dst_mode) == fs::FileType::RegularFile
        && dst_mode & UNFINISHED_MARK != 0
        && src_mode & UNFINISHED_MARK == 0
}

/// The permission bits a file replacing `old` keeps from it (`cp` without
/// `-p`): all of them, less the unfinished mark of a file an interrupted
/// run left.
#[cfg(unix)]
pub(crate) fn kept_mode(src_mode: u32, old_mode: u32) -> u32 {
    if left_unfinished(src_mode, old_mode) {
        old_mode & 0o7777 & !UNFINISHED_MARK
    } else {
        old_mode & 0o7777
    }
}

/// [`complete_copy`](super::facts::complete_copy) by path, for a single file: `src` followed, `dst`
/// not. False when either cannot be read.
#[cfg(unix)]
pub fn is_complete_copy(src: impl AsRef<Path>, dst: impl AsRef<Path>) -> bool {
    match (
        cowlink_sys::stat(src.as_ref()),
        cowlink_sys::lstat(dst.as_ref()),
    ) {
        (Ok(s), Ok(d)) => {
            super::facts::complete_copy(&StatFacts::of_stat(&s), &StatFacts::of_stat(&d))
        }
        _ => false,
    }
}

/// Direct files being written, by id, with the path to remove on a forced
/// exit.
#[cfg(unix)]
static UNFINISHED: std::sync::Mutex<Vec<(u64, PathBuf)>> = std::sync::Mutex::new(Vec::new());
#[cfg(unix)]
static UNFINISHED_ID: AtomicU64 = AtomicU64::new(0);

/// Remove every file that a direct placement of this process has created
/// but not finished, and return how many. For a process about to exit
/// without unwinding (a second Ctrl-C); afterwards no partial file of
/// this process is left under a final name.
#[cfg(unix)]
pub fn remove_unfinished() -> usize {
    let list = UNFINISHED.lock().unwrap_or_else(|p| p.into_inner());
    list.iter()
        .filter(|(_, p)| fs::unlink(p.as_path()).is_ok())
        .count()
}

/// A temporary file of this process that [`remove_unfinished`] removes
/// while the guard lives: one a forced exit (a second Ctrl-C) would
/// otherwise leave behind, such as an index being copied before it is
/// renamed over the old one. Dropping the guard only forgets the path.
#[cfg(unix)]
pub(crate) struct Unfinished(u64);

#[cfg(unix)]
impl Unfinished {
    /// Register `path` (absolute, or relative to a working directory
    /// that stays) until the guard is dropped.
    pub(crate) fn register(path: &Path) -> Unfinished {
        let id = UNFINISHED_ID.fetch_add(1, Ordering::Relaxed);
        UNFINISHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, path.to_path_buf()));
        Unfinished(id)
    }
}

#[cfg(unix)]
impl Drop for Unfinished {
    fn drop(&mut self) {
        let mut list = UNFINISHED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = list.iter().rposition(|(x, _)| *x == self.0) {
            list.swap_remove(i);
        }
    }
}

/// A new destination file being written, placed per [`Placement`].
#[cfg(unix)]
pub(crate) enum NewFile<'d> {
    Atomic(PendingFile<'d>),
    Direct(DirectFile<'d>),
}

/// A file created under its final name; removed on drop unless finished.
#[cfg(unix)]
pub(crate) struct DirectFile<'d> {
    file: OwnedFd,
    dir: BorrowedFd<'d>,
    name: PathBuf,
    /// Registered for [`remove_unfinished`] while it lives.
    _unfinished: Unfinished,
    finished: bool,
}

#[cfg(unix)]
impl<'d> NewFile<'d> {
    /// Create the file that becomes `dst` (relative to `dir`; `parent` is
    /// its directory, relative to `dir`) with `mode` (less the umask).
    /// `shown` is the path a forced exit removes (direct placement only).
    pub(crate) fn create(
        dir: BorrowedFd<'d>,
        parent: &Path,
        dst: &Path,
        mode: Mode,
        placement: Placement,
        shown: &Path,
    ) -> Result<Self, Errno> {
        match placement {
            Placement::Atomic => Ok(NewFile::Atomic(PendingFile::create(
                dir, parent, dst, mode,
            )?)),
            Placement::Direct => {
                let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC;
                let file = fs::openat(dir, dst, flags, mode)?;
                Ok(NewFile::Direct(DirectFile {
                    file,
                    dir,
                    name: dst.to_path_buf(),
                    _unfinished: Unfinished::register(shown),
                    finished: false,
                }))
            }
        }
    }

    /// The file being written.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            NewFile::Atomic(p) => p.fd(),
            NewFile::Direct(d) => d.file.as_fd(),
        }
    }

    /// The file is complete: give it its final name (atomic) or keep the
    /// name it has (direct). On error nothing is left under `dst`.
    pub(crate) fn commit(self, dst: &Path, overwrite: Overwrite) -> Result<(), Errno> {
        match self {
            NewFile::Atomic(p) => p.persist(dst, overwrite),
            NewFile::Direct(mut d) => {
                d.finished = true;
                Ok(())
            }
        }
    }
}

#[cfg(unix)]
impl Drop for DirectFile<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // Remove the name only while it is still our file.
            let here = cowlink_sys::statat(self.dir, &self.name, AtFlags::SYMLINK_NOFOLLOW);
            let ours = match (cowlink_sys::fstat(&self.file), here) {
                (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
                _ => false,
            };
            if ours {
                let _ = fs::unlinkat(self.dir, &self.name, AtFlags::empty());
            }
        }
        // Then `_unfinished` lets the path go.
    }
}

/// Create the name `name` in `dir` with `make(dir, name)` (`symlinkat`,
/// `linkat`, `mknodat`): directly, or, when it exists and `replace` is
/// set, at a temporary name then `rename`d over it (atomic replace).
#[cfg(unix)]
pub(crate) fn place_name(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    replace: bool,
    make: impl Fn(BorrowedFd<'_>, &std::ffi::CStr) -> Result<(), Errno>,
) -> Result<(), Errno> {
    match make(dir, name) {
        Err(Errno::EXIST) if replace => {
            let tmp = temp_name(OsStr::from_bytes(name.to_bytes()));
            let tmp = std::ffi::CString::new(tmp.into_vec()).expect("no NUL in a temp name");
            make(dir, &tmp)?;
            fs::renameat(dir, &tmp, dir, name).inspect_err(|_| {
                let _ = fs::unlinkat(dir, &tmp, AtFlags::empty());
            })
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_unique_hidden_and_short() {
        let long = OsString::from("x".repeat(255));
        let a = temp_name(&long);
        let b = temp_name(&long);
        assert_ne!(a, b);
        assert!(a.as_bytes().starts_with(b"."));
        assert!(a.len() <= 255, "{} bytes", a.len());
    }
}
