//! Removing a snapshot's tree without ever leaving it.
//!
//! A snapshot holds whatever the synced source held: symbolic links to
//! `/`, and possibly a mount point someone bound inside it later. Removal
//! therefore works only on descriptors: each directory is opened relative
//! to its parent with `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`
//! (`cowlink_sys::open_dir_same_mount`), so a link is unlinked as a link
//! and a mount point, even a bind mount of the same filesystem, stops the
//! removal with an error instead of emptying what is mounted there.
//!
//! The walk keeps one open descriptor per level (depth-first, a directory
//! is read again from its start after each subdirectory it held is gone),
//! so memory does not grow with the width of a directory; a tree deeper
//! than the open-file limit fails with `EMFILE`, reported, and the
//! snapshot stays recorded as being removed for the next prune.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};

/// The inode number of the empty directory a Btrfs snapshot holds where
/// its source held a nested subvolume.
const BTRFS_EMPTY_SUBVOL_DIR_INO: u64 = 2;

fn fail(path: &Path, e: Errno) -> Error {
    let e2 = Error::from_errno(Operation::Snapshot, e).with_src(path);
    match e {
        Errno::XDEV => e2.with_kind(ErrorKind::InUse).with_reason(
            "a mount point is inside the snapshot: unmount it first (nothing below it was touched)",
        ),
        _ => e2,
    }
}

/// Remove the directory `name` in `parent` and everything in it, without
/// following a symbolic link or crossing a mount point. `shown` is its
/// path, for errors.
///
/// Stops with `Cancelled` at the next directory once `cancel` is
/// cancelled (what is left is removed by the next call).
pub(crate) fn remove_tree(
    parent: BorrowedFd<'_>,
    name: &str,
    shown: &Path,
    cancel: &crate::run::CancelToken,
) -> Result<()> {
    let cname = CString::new(name).map_err(|_| fail(shown, Errno::INVAL))?;
    let top = cowlink_sys::open_dir_same_mount(parent, &cname).map_err(|e| fail(shown, e))?;
    remove_opened_tree(parent, top, cname, shown, cancel)
}

/// [`remove_tree`] of the directory `name` in `parent` already opened as
/// `top` (by [`cowlink_sys::open_dir_same_mount`]), so a caller that
/// checked `top`'s identity empties exactly that directory, whatever is
/// renamed in and out of `name` meanwhile.
pub(crate) fn remove_opened_tree(
    parent: BorrowedFd<'_>,
    top: OwnedFd,
    cname: CString,
    shown: &Path,
    cancel: &crate::run::CancelToken,
) -> Result<()> {
    // A directory on another device than the top is another filesystem
    // or, on Btrfs, another subvolume (each has its own device number):
    // one the user made inside the snapshot later, which is not the
    // snapshot's to remove (a subvolume snapshot leaves nested ones out,
    // a tree clone makes plain directories).
    let dev = cowlink_sys::fstat(&top).map_err(|e| fail(shown, e))?.st_dev;
    // (descriptor, its name in the level above, its path)
    let mut stack: Vec<(OwnedFd, CString, PathBuf)> = vec![(top, cname, shown.to_path_buf())];
    while let Some((fd, _, path)) = stack.last() {
        if cancel.is_cancelled() {
            return Err(Error::new(Operation::Snapshot, ErrorKind::Cancelled)
                .with_src(shown)
                .with_reason("cancelled while removing; the next prune finishes it"));
        }
        match empty_one_level(fd.as_fd(), path, dev)? {
            Some((sub, sub_name, sub_path)) => stack.push((sub, sub_name, sub_path)),
            None => {
                let (fd, name, path) = stack.pop().expect("not empty");
                drop(fd);
                let above = stack.last().map_or(parent, |(f, _, _)| f.as_fd());
                fs::unlinkat(above, name.as_c_str(), AtFlags::REMOVEDIR)
                    .map_err(|e| fail(&path, e))?;
            }
        }
    }
    Ok(())
}

/// Unlink every entry of `dir` that is not a directory; at the first
/// subdirectory, return it opened (the caller empties it, then reads `dir`
/// again). `None` when `dir` is empty.
fn empty_one_level(
    dir: BorrowedFd<'_>,
    path: &Path,
    dev: u64,
) -> Result<Option<(OwnedFd, CString, PathBuf)>> {
    let entries = fs::Dir::read_from(dir).map_err(|e| fail(path, e))?;
    for ent in entries {
        let ent = ent.map_err(|e| fail(path, e))?;
        let name: &CStr = ent.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let child = path.join(OsStr::from_bytes(name.to_bytes()));
        let is_dir = match ent.file_type() {
            FileType::Unknown => match cowlink_sys::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => cowlink_sys::file_type(st.st_mode) == FileType::Directory,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(fail(&child, e)),
            },
            t => t == FileType::Directory,
        };
        if is_dir {
            match cowlink_sys::open_dir_same_mount(dir, name) {
                Ok(fd) => {
                    let st = cowlink_sys::fstat(&fd).map_err(|e| fail(&child, e))?;
                    // A snapshot of a subvolume that held another holds an
                    // empty placeholder directory in its place (inode 2,
                    // BTRFS_EMPTY_SUBVOL_DIR_OBJECTID, on a device of its
                    // own): that one is the snapshot's, and goes.
                    if st.st_dev != dev && st.st_ino != BTRFS_EMPTY_SUBVOL_DIR_INO {
                        return Err(Error::from_errno(Operation::Snapshot, Errno::XDEV)
                            .with_src(&child)
                            .with_kind(ErrorKind::InUse)
                            .with_reason(
                                "another filesystem or Btrfs subvolume is inside the snapshot: move it out (or delete it) first; nothing below it was touched",
                            ));
                    }
                    return Ok(Some((fd, name.to_owned(), child)));
                }
                // Replaced by something else since it was listed: unlink
                // that as an entry.
                Err(Errno::LOOP | Errno::NOTDIR) => {}
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(fail(&child, e)),
            }
        }
        match fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) => {
                // A directory appeared under this name since it was listed:
                // the next reading of `dir` descends into it.
                return empty_one_level(dir, path, dev);
            }
            Err(e) => return Err(fail(&child, e)),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn removes_deep_and_wide_trees_and_never_follows_links() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        std::fs::write(outside.join("sub/keep2"), b"y").unwrap();
        let snap = t.path().join("snap");
        let mut deep = snap.clone();
        for i in 0..200 {
            deep = deep.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"f").unwrap();
        for i in 0..300 {
            std::fs::write(snap.join(format!("w{i}")), b"w").unwrap();
        }
        symlink(&outside, snap.join("to_outside_dir")).unwrap();
        symlink(outside.join("keep"), snap.join("to_outside_file")).unwrap();
        symlink("/", snap.join("d0/root")).unwrap();
        let parent = fs::open(
            t.path(),
            fs::OFlags::RDONLY | fs::OFlags::DIRECTORY,
            fs::Mode::empty(),
        )
        .unwrap();
        let go = crate::run::CancelToken::new();
        remove_tree(parent.as_fd(), "snap", &snap, &go).unwrap();
        assert!(!snap.exists());
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"x");
        assert_eq!(std::fs::read(outside.join("sub/keep2")).unwrap(), b"y");
        // The top itself may not be a link.
        symlink(&outside, t.path().join("link")).unwrap();
        let e = remove_tree(parent.as_fd(), "link", &t.path().join("link"), &go).unwrap_err();
        assert!(
            matches!(e.errno(), Some(Errno::LOOP | Errno::NOTDIR)),
            "{e}"
        );
        assert!(outside.join("keep").exists());
        let e = remove_tree(parent.as_fd(), "missing", &t.path().join("missing"), &go).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        // Cancelled: stops, and what is left is removed by the next call.
        std::fs::create_dir_all(t.path().join("c/d")).unwrap();
        let stop = crate::run::CancelToken::new();
        stop.cancel();
        let e = remove_tree(parent.as_fd(), "c", &t.path().join("c"), &stop).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled);
        assert!(t.path().join("c/d").exists());
        remove_tree(parent.as_fd(), "c", &t.path().join("c"), &go).unwrap();
        assert!(!t.path().join("c").exists());
    }
}
