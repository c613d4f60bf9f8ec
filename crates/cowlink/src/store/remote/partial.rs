//! Partly downloaded objects: a large object is downloaded into
//! `tmp/<hex>.partial`, a named file that outlives a pull cut off by a
//! kill, a Ctrl-C or a network gone for longer than the retry timeout,
//! so that the next pull asks only for the rest.
//!
//! The file is the store's own and is trusted for nothing: the next pull
//! rehashes its bytes and the object's digest is checked over all of
//! them before it is named. What may be resumed is narrow:
//!
//! - Only a regular file, looked at with `lstat` first and opened with
//!   `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`: a symbolic link, a FIFO or a
//!   device at the name is never opened (a FIFO could hang the open or
//!   read, a link point anywhere); it is unlinked (a directory is left
//!   alone and the object downloaded into an unnamed temporary instead).
//! - Owned by us, with one link and no write bit for group or others: the
//!   file becomes the object itself, and whoever else could write to it
//!   could change a stored object after its digest was checked.
//! - No larger than the object.
//!
//! A verified object waits, sealed read-only (0444), in its partial
//! until its batch is made durable and linked. A pull killed then leaves
//! it whole: such a file of ours is made writable again under its lock
//! and resumed (rehashed, never trusted), not removed; one another pull
//! holds that way is left alone.
//!
//! A pull writes a partial only while it holds an exclusive `flock` on
//! it (taken without waiting: a second pull of the same object, in this
//! process or another, downloads into its own unnamed temporary), and
//! only after checking, lock held, that the name still names the file it
//! opened: a partial just named as an object by the pull that finished it
//! is never written again. When its name is removed or replaced under the
//! lock all the same (an `rm` in `tmp/`), the verified file, which has no
//! name left to link, is copied into an unnamed temporary, hashed again,
//! and that copy is stored.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::store::layout::{object_rel, PARTIAL_SUFFIX};
use crate::store::manifest::Digest;
use crate::store::Store;

/// Objects at least this large are downloaded into a partial file, kept
/// when the pull is cut off; smaller ones go to an unnamed temporary (a
/// rerun downloads them whole, in well under a second on most links).
pub const RESUME_MIN: u64 = 8 << 20;

/// How often [`Store::open_partial`] starts over when the name changes
/// under it (another pull creating, finishing or removing it).
const TRIES: usize = 4;

/// The name in `tmp/` of the partial download of `d` (`<hex>.partial`).
pub(super) fn partial_name(d: &Digest) -> String {
    format!("{}{PARTIAL_SUFFIX}", d.to_hex())
}

/// A partial download, locked for us.
#[derive(Debug)]
pub(super) struct Partial {
    /// The file, read-write, holding the exclusive `flock` until dropped.
    fd: OwnedFd,
    /// Its name in `tmp/`.
    name: String,
    /// Bytes in it when it was opened (a prefix of the object, perhaps).
    pub(super) present: u64,
}

impl Partial {
    /// The file.
    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Empty the file, to download the object whole into it.
    pub(super) fn restart(&mut self) -> Result<(), Errno> {
        fs::ftruncate(&self.fd, 0)?;
        fs::seek(&self.fd, fs::SeekFrom::Start(0))?;
        self.present = 0;
        Ok(())
    }
}

/// What [`reclaim`] made of a partial we could not open for writing.
enum Reclaim {
    /// Ours, locked, and made writable again (0600): open it again.
    Writable,
    /// Another pull holds its lock (a verified object waiting for its
    /// batch, sealed 0444): neither touched nor removed.
    Busy,
    /// Not ours to resume (another user's, linked elsewhere, larger
    /// than the object, not a regular file, gone): to be removed.
    NotOurs,
}

/// A partial at `name` that cannot be opened for writing. A pull seals a
/// verified object read-only (0444) in its partial while it waits for the
/// `syncfs` of its batch, which may take long (up to 512 objects); killed
/// then, it leaves the whole object there. Removing it, as a partial that
/// may not be resumed, would throw away bytes already verified (only
/// root could open it for writing), and while that pull still runs it
/// would unlink the name under it, so that it could not link the object
/// (`ENOENT`) and failed. So, lock held, a file of ours with one link and
/// no more bytes than the object is made writable for its owner again;
/// it is still trusted for nothing (rehashed as any partial).
fn reclaim(tmp: &OwnedFd, name: &str, size: u64) -> Result<Reclaim, Errno> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match fs::openat(tmp, name, flags | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        // Removed or renamed meanwhile: look again.
        Err(Errno::NOENT) => return Ok(Reclaim::Writable),
        Err(Errno::LOOP | Errno::NXIO | Errno::ACCESS | Errno::PERM) => {
            return Ok(Reclaim::NotOurs)
        }
        Err(e) => return Err(e),
    };
    if fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err() {
        return Ok(Reclaim::Busy);
    }
    let st = fs::fstat(&fd)?;
    match fs::statat(tmp, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(now) if now.st_ino == st.st_ino && now.st_dev == st.st_dev => {}
        Ok(_) | Err(Errno::NOENT) => return Ok(Reclaim::Writable),
        Err(e) => return Err(e),
    }
    let ours = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        && st.st_uid == rustix::process::geteuid().as_raw()
        && st.st_nlink == 1
        && u64::try_from(st.st_size).is_ok_and(|n| n <= size);
    if !ours {
        return Ok(Reclaim::NotOurs);
    }
    match fs::fchmod(&fd, cowlink_sys::raw_mode(0o600)) {
        Ok(()) => Ok(Reclaim::Writable),
        Err(Errno::PERM | Errno::ACCESS | Errno::ROFS) => Ok(Reclaim::NotOurs),
        Err(e) => Err(e),
    }
}

impl Store {
    /// The partial download of `d` (`size` bytes), locked: the one a
    /// pull left, when it may be resumed, else a new empty one. `None`
    /// when another pull is writing it, or the name cannot be used (a
    /// directory there, a filesystem without `flock`, another user's
    /// file we may not remove): the caller downloads into an unnamed
    /// temporary then. A file at the name that may not be resumed (see
    /// the module's rules) is unlinked, never opened if it is not a
    /// regular file.
    pub(super) fn open_partial(&self, d: &Digest, size: u64) -> Result<Option<Partial>, Errno> {
        let tmp = self.tmp.as_ref().expect("tmp/ is open once the store is");
        let name = partial_name(d);
        let unlink = |name: &str| match fs::unlinkat(tmp, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(true),
            Err(Errno::ISDIR | Errno::PERM | Errno::ACCESS | Errno::ROFS) => Ok(false),
            Err(e) => Err(e),
        };
        for _ in 0..TRIES {
            let found = match fs::statat(tmp, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
                Err(Errno::NOENT) => None,
                Err(e) => return Err(e),
            };
            let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC;
            let fd = match found {
                None => match fs::openat(
                    tmp,
                    name.as_str(),
                    flags | OFlags::CREATE | OFlags::EXCL,
                    cowlink_sys::raw_mode(0o600),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(e),
                },
                Some(FileType::RegularFile) => {
                    match fs::openat(tmp, name.as_str(), flags | OFlags::NONBLOCK, Mode::empty()) {
                        Ok(fd) => fd,
                        Err(Errno::NOENT) => continue,
                        // Read-only: perhaps a verified object a pull was
                        // killed holding (sealed 0444 while it waited for
                        // its batch), or one a pull holds that way now.
                        Err(Errno::ACCESS) => match reclaim(tmp, &name, size)? {
                            Reclaim::Writable => continue,
                            Reclaim::Busy => return Ok(None),
                            Reclaim::NotOurs => {
                                if unlink(&name)? {
                                    continue;
                                }
                                return Ok(None);
                            }
                        },
                        // Switched for a link or a FIFO since the lstat,
                        // or not writable by anyone (immutable): not
                        // resumable.
                        Err(Errno::LOOP | Errno::NXIO | Errno::PERM) => {
                            if unlink(&name)? {
                                continue;
                            }
                            return Ok(None);
                        }
                        Err(e) => return Err(e),
                    }
                }
                // A link, a FIFO, a socket, a device: never opened.
                Some(_) => {
                    if unlink(&name)? {
                        continue;
                    }
                    return Ok(None);
                }
            };
            match fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                // Another pull is writing it; or no flock here.
                Err(_) => return Ok(None),
            }
            let st = fs::fstat(&fd)?;
            // The name must still be this file, now that we hold the lock:
            // else it was finished and named as an object, or removed.
            match fs::statat(tmp, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(now) if now.st_ino == st.st_ino && now.st_dev == st.st_dev => {}
                Ok(_) | Err(Errno::NOENT) => continue,
                Err(e) => return Err(e),
            }
            let resumable = FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                && st.st_uid == rustix::process::geteuid().as_raw()
                && st.st_nlink == 1
                && st.st_mode & 0o022 == 0
                && u64::try_from(st.st_size).is_ok_and(|n| n <= size);
            if !resumable {
                // Locked and still at the name: ours to remove.
                if unlink(&name)? {
                    continue;
                }
                return Ok(None);
            }
            let fl = fs::fcntl_getfl(&fd)?;
            fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK)?;
            return Ok(Some(Partial {
                fd,
                name,
                present: st.st_size as u64,
            }));
        }
        Ok(None)
    }

    /// Remove the partial `p` (its bytes are wrong: the remote's object
    /// did not verify). We hold its lock, so the name is still its own.
    pub(super) fn discard_partial(&self, p: Partial) {
        let tmp = self.tmp.as_ref().expect("tmp/ is open once the store is");
        let _ = fs::unlinkat(tmp, p.name.as_str(), AtFlags::empty());
    }

    /// Name the verified partial `p` as the object `d`: its descriptor,
    /// the very file that was hashed, is linked under the object's name
    /// (atomic, never replacing: `EEXIST` when the store has the object
    /// already), never whatever the name in `tmp/` holds by then. The
    /// partial's name is removed afterwards if it still names this file.
    ///
    /// `ENOENT` when the file has no name left (its name in `tmp/` was
    /// removed or replaced under the lock, by something that ignores it):
    /// the caller still holds `p` and may copy it out.
    pub(super) fn persist_partial(&self, p: &Partial, d: &Digest) -> Result<(), Errno> {
        let tmp = self.tmp.as_ref().expect("tmp/ is open once the store is");
        let rel = object_rel(d, 0);
        let (dir, name) = self.parent_in_layout(&rel)?;
        let r = cowlink_sys::link_fd(p.fd.as_fd(), dir.as_fd(), name.as_ref());
        if matches!(r, Ok(()) | Err(Errno::EXIST)) {
            let ours = fs::fstat(&p.fd).ok();
            let named = fs::statat(tmp, p.name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok();
            if let (Some(a), Some(b)) = (ours, named) {
                if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) {
                    let _ = fs::unlinkat(tmp, p.name.as_str(), AtFlags::empty());
                }
            }
        }
        r
    }
}
