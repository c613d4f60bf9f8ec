//! Atomic destinations: data goes to an unnamed file, and a name appears
//! only when the file is complete.
//!
//! [`PendingFile::create`] makes an `O_TMPFILE` in the destination
//! directory: an inode with no name, so a crash, an error or a cancel at any
//! point leaves nothing behind. [`PendingFile::persist`] links it into place:
//! `linkat` (with `AT_EMPTY_PATH`, or through /proc/self/fd) for "refuse if it exists" (atomic: EEXIST if someone created the
//! name meanwhile) or link-to-temporary-name plus `rename` for "replace"
//! (atomic swap; a hardlink of the old destination keeps its old content).
//!
//! Filesystems without `O_TMPFILE` (some network and FUSE filesystems) get a
//! named temporary (`.NAME.cowlink-PID-N.tmp`) that is removed on drop and
//! renamed with `RENAME_NOREPLACE` on success. Only that fallback can leave a
//! temporary behind, and only if the process is killed.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Mode, OFlags, RenameFlags, CWD};
use rustix::io::Errno;

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
}

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
pub(crate) struct PendingFile<'d> {
    file: OwnedFd,
    dir: BorrowedFd<'d>,
    temp: TempName,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);
/// Set once `linkat(AT_EMPTY_PATH)` was refused (it needs
/// CAP_DAC_READ_SEARCH on many kernels); later links go through /proc.
static EMPTY_PATH_REFUSED: AtomicBool = AtomicBool::new(false);

/// A temporary name next to `name`, unique within this process and short
/// enough for NAME_MAX.
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
fn temp_path(dst: &Path) -> PathBuf {
    dst.with_file_name(temp_name(dst.file_name().unwrap_or_default()))
}

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
        let flags = OFlags::TMPFILE | access | OFlags::CLOEXEC;
        match fs::openat(dir, parent, flags, mode) {
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

    /// Give the file its final name `dst`.
    ///
    /// With [`Overwrite::Refuse`] an existing name gives `EEXIST` and
    /// nothing changes. With [`Overwrite::Replace`] the name is swapped
    /// atomically. On any error the temporary is gone afterwards.
    pub(crate) fn persist(mut self, dst: &Path, overwrite: Overwrite) -> Result<(), Errno> {
        match std::mem::replace(&mut self.temp, TempName::Anonymous) {
            TempName::Anonymous => match overwrite {
                Overwrite::Refuse => self.link_anonymous(dst),
                Overwrite::Replace => {
                    let tmp = temp_path(dst);
                    self.link_anonymous(&tmp)?;
                    // From here the named temporary must go if rename fails.
                    self.temp = TempName::Named(tmp.clone());
                    fs::renameat(self.dir, &tmp, self.dir, dst)?;
                    self.temp = TempName::Anonymous;
                    Ok(())
                }
            },
            TempName::Named(tmp) => {
                self.temp = TempName::Named(tmp.clone());
                match overwrite {
                    Overwrite::Replace => fs::renameat(self.dir, &tmp, self.dir, dst)?,
                    Overwrite::Refuse => {
                        match fs::renameat_with(
                            self.dir,
                            &tmp,
                            self.dir,
                            dst,
                            RenameFlags::NOREPLACE,
                        ) {
                            Ok(()) => {}
                            // The filesystem lacks RENAME_NOREPLACE: link (atomic
                            // no-clobber); the drop removes the temporary name.
                            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                                return fs::linkat(self.dir, &tmp, self.dir, dst, AtFlags::empty());
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

    /// `linkat` an `O_TMPFILE` into place as `name`.
    fn link_anonymous(&self, name: &Path) -> Result<(), Errno> {
        if !EMPTY_PATH_REFUSED.load(Ordering::Relaxed) {
            match fs::linkat(&self.file, c"", self.dir, name, AtFlags::EMPTY_PATH) {
                Err(Errno::NOENT | Errno::PERM) => {
                    EMPTY_PATH_REFUSED.store(true, Ordering::Relaxed)
                }
                r => return r,
            }
        }
        // /proc/self/fd/N with AT_SYMLINK_FOLLOW works without privileges.
        let proc_path = format!(
            "/proc/self/fd/{}",
            rustix::fd::AsRawFd::as_raw_fd(&self.file)
        );
        fs::linkat(CWD, &*proc_path, self.dir, name, AtFlags::SYMLINK_FOLLOW)
    }
}

impl Drop for PendingFile<'_> {
    fn drop(&mut self) {
        if let TempName::Named(tmp) = &self.temp {
            let _ = fs::unlinkat(self.dir, tmp, AtFlags::empty());
        }
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
