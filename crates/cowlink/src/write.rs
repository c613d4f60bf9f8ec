//! Atomic destinations: data goes to an unnamed file, and a name appears
//! only when the file is complete.
//!
//! [`PendingFile::create`] makes an `O_TMPFILE` in the destination
//! directory: an inode with no name, so a crash, an error or a cancel at any
//! point leaves nothing behind. [`PendingFile::persist`] links it into place:
//! `linkat` for "refuse if it exists" (atomic: EEXIST if someone created the
//! name meanwhile) or link-to-temporary-name plus `rename` for "replace"
//! (atomic swap; a hardlink of the old destination keeps its old content).
//!
//! Filesystems without `O_TMPFILE` (some network and FUSE filesystems) get a
//! named temporary (`.NAME.cowlink-PID-N.tmp`) that is removed on drop and
//! renamed with `RENAME_NOREPLACE` on success. Only that fallback can leave a
//! temporary behind, and only if the process is killed.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicU64, Ordering};

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
    Named(OsString),
}

/// A destination file being written, not yet visible under its final name.
pub(crate) struct PendingFile<'d> {
    dir: BorrowedFd<'d>,
    file: OwnedFd,
    temp: TempName,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary name next to `name`, unique within this process and short
/// enough for NAME_MAX.
fn temp_name(name: &OsStr) -> OsString {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let stem = &name.as_bytes()[..name.len().min(200)];
    let mut v = Vec::with_capacity(stem.len() + 40);
    v.push(b'.');
    v.extend_from_slice(stem);
    v.extend_from_slice(format!(".cowlink-{}-{n}.tmp", std::process::id()).as_bytes());
    OsString::from_vec(v)
}

impl<'d> PendingFile<'d> {
    /// Create an unnamed, writable file in `dir` with `mode` (the umask
    /// applies, as for `open(2)` with `O_CREAT`).
    pub(crate) fn create(dir: BorrowedFd<'d>, name: &OsStr, mode: Mode) -> Result<Self, Errno> {
        let flags = OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC;
        match fs::openat(dir, c".", flags, mode) {
            Ok(file) => Ok(PendingFile {
                dir,
                file,
                temp: TempName::Anonymous,
            }),
            // No O_TMPFILE here: EOPNOTSUPP from the filesystem, EISDIR or
            // EINVAL from kernels or layers that do not know the flag.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                let tmp = temp_name(name);
                let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC;
                let file = fs::openat(dir, &*tmp, flags, mode)?;
                Ok(PendingFile {
                    dir,
                    file,
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

    /// Give the file its final `name` in the directory.
    ///
    /// With [`Overwrite::Refuse`] an existing name gives `EEXIST` and
    /// nothing changes. With [`Overwrite::Replace`] the name is swapped
    /// atomically. On any error the temporary is gone afterwards.
    pub(crate) fn persist(mut self, name: &OsStr, overwrite: Overwrite) -> Result<(), Errno> {
        match std::mem::replace(&mut self.temp, TempName::Anonymous) {
            TempName::Anonymous => match overwrite {
                Overwrite::Refuse => self.link_anonymous(name),
                Overwrite::Replace => {
                    let tmp = temp_name(name);
                    self.link_anonymous(&tmp)?;
                    // From here the named temporary must go if rename fails.
                    self.temp = TempName::Named(tmp.clone());
                    fs::renameat(self.dir, &*tmp, self.dir, name)?;
                    self.temp = TempName::Anonymous;
                    Ok(())
                }
            },
            TempName::Named(tmp) => {
                self.temp = TempName::Named(tmp.clone());
                match overwrite {
                    Overwrite::Replace => fs::renameat(self.dir, &*tmp, self.dir, name)?,
                    Overwrite::Refuse => {
                        match fs::renameat_with(
                            self.dir,
                            &*tmp,
                            self.dir,
                            name,
                            RenameFlags::NOREPLACE,
                        ) {
                            Ok(()) => {}
                            // The filesystem lacks RENAME_NOREPLACE: link (atomic
                            // no-clobber) then drop the temporary name.
                            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                                fs::linkat(self.dir, &*tmp, self.dir, name, AtFlags::empty())?;
                                // The drop below removes the temporary name.
                                return Ok(());
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

    /// `linkat` an `O_TMPFILE` into the directory under `name`.
    fn link_anonymous(&self, name: &OsStr) -> Result<(), Errno> {
        // /proc/self/fd/N with AT_SYMLINK_FOLLOW works without privileges;
        // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH on older kernels, so it is
        // the fallback for systems without /proc.
        let proc_path = format!(
            "/proc/self/fd/{}",
            rustix::fd::AsRawFd::as_raw_fd(&self.file)
        );
        match fs::linkat(CWD, &*proc_path, self.dir, name, AtFlags::SYMLINK_FOLLOW) {
            Err(Errno::NOENT) if fs::access("/proc/self/fd", fs::Access::EXISTS).is_err() => {
                fs::linkat(&self.file, c"", self.dir, name, AtFlags::EMPTY_PATH)
            }
            r => r,
        }
    }
}

impl Drop for PendingFile<'_> {
    fn drop(&mut self) {
        if let TempName::Named(tmp) = &self.temp {
            let _ = fs::unlinkat(self.dir, &**tmp, AtFlags::empty());
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
