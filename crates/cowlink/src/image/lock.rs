//! QEMU's image locks, taken the way QEMU takes them, so that cowlink and
//! QEMU (a running guest, `qemu-img`, `qemu-io`) see each other, and two
//! cowlink runs see each other too.
//!
//! QEMU (`block/file-posix.c`, `raw_apply_lock_bytes` and
//! `raw_check_lock_bytes`) marks every image file it has open with shared
//! OFD locks (`F_OFD_SETLK`, `F_RDLCK`) on single bytes: byte
//! `100 + i` ([`PERM_BASE`]) for each permission bit `i` it holds, and
//! byte `200 + i` ([`SHARED_BASE`]) for each permission it does *not* let
//! others have. Before using the file it tests (`F_OFD_GETLK` for a write
//! lock) byte `200 + i` for each permission it wants (someone refuses to
//! share it) and byte `100 + i` for each permission it will not share
//! (someone holds it). Shared locks never block each other, so taking and
//! then testing is race-free: of two openers that conflict, at least the
//! second to test sees the first.
//!
//! The permissions (QEMU's `BLK_PERM_*`): consistent read, write, write
//! without changing the guest's view, resize. A reader of an image
//! ([`Access::Read`]: convert's layers, commit's overlay) holds consistent
//! read and shares read and unchanging writes, so a running guest
//! (which holds write) and `qemu-img commit` (which wants write on both
//! images) conflict with it. A writer ([`Access::Write`]: commit's base,
//! convert's existing destination) holds read, write and resize and
//! shares the same two.
//!
//! A lock lives as long as the open file description it was taken on, so
//! a [`Held`] lock belongs to the descriptor that reads (or writes) the
//! image and is released when the file is closed.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation};

/// First permission byte (`RAW_LOCK_PERM_BASE`).
pub const PERM_BASE: u64 = 100;
/// First "not shared" byte (`RAW_LOCK_SHARED_BASE`).
pub const SHARED_BASE: u64 = 200;

/// `BLK_PERM_CONSISTENT_READ`.
const READ: u32 = 1;
/// `BLK_PERM_WRITE`.
const WRITE: u32 = 2;
/// `BLK_PERM_WRITE_UNCHANGED`.
const WRITE_UNCHANGED: u32 = 4;
/// `BLK_PERM_RESIZE`.
const RESIZE: u32 = 8;
/// The permissions QEMU 6 and later know (`BLK_PERM_ALL`).
const ALL: u32 = READ | WRITE | WRITE_UNCHANGED | RESIZE;
const NAMES: [&str; 4] = ["consistent read", "write", "write unchanged", "resize"];

/// What cowlink does with an image file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads it, and needs it not to change meanwhile.
    Read,
    /// Writes or replaces it.
    Write,
}

impl Access {
    /// (held, shared) permission bits, as QEMU would ask for them.
    fn perms(self) -> (u32, u32) {
        let shared = READ | WRITE_UNCHANGED;
        match self {
            Access::Read => (READ, shared),
            Access::Write => (READ | WRITE | RESIZE, shared),
        }
    }
}

/// The lock bytes `access` takes: `(byte, what it stands for)`.
pub fn bytes_taken(access: Access) -> Vec<u64> {
    let (perm, shared) = access.perms();
    let mut v = Vec::new();
    for i in 0..4u64 {
        if perm & (1 << i) != 0 {
            v.push(PERM_BASE + i);
        }
    }
    for i in 0..4u64 {
        if (ALL & !shared) & (1 << i) != 0 {
            v.push(SHARED_BASE + i);
        }
    }
    v
}

/// The lock bytes `access` must find free, with the permission each one
/// protects: another holder of byte `200 + i` refuses to share a
/// permission we want; of byte `100 + i`, holds one we do not share.
fn bytes_tested(access: Access) -> Vec<(u64, &'static str, bool)> {
    let (perm, shared) = access.perms();
    let mut v = Vec::new();
    for i in 0..4u64 {
        if perm & (1 << i) != 0 {
            v.push((SHARED_BASE + i, NAMES[i as usize], false));
        }
    }
    for i in 0..4u64 {
        if (ALL & !shared) & (1 << i) != 0 {
            v.push((PERM_BASE + i, NAMES[i as usize], true));
        }
    }
    v
}

/// Proof that QEMU's locks for an access are held on a file (released
/// when that file is closed).
#[derive(Debug)]
pub struct Held {
    /// The access the locks stand for.
    pub access: Access,
}

/// Take QEMU's locks for `access` on `file` (the image at `path`), then
/// check that nobody else's conflict with them. A conflict is `InUse`
/// naming the file and the permission at stake, and leaves no lock of
/// ours behind. A filesystem without OFD locks (`EINVAL`, `ENOSYS`, some
/// network filesystems) cannot carry QEMU's either: nothing is held then.
pub fn take(path: &Path, file: &File, access: Access) -> Result<Option<Held>, Error> {
    let fd = file.as_fd();
    let io = |e: Errno| Error::from_errno(Operation::Image, e).with_src(path);
    let taken = bytes_taken(access);
    for (n, &b) in taken.iter().enumerate() {
        match cowlink_sys::ofd_lock_set(fd, b, 1, true, false) {
            Ok(()) => {}
            Err(Errno::INVAL | Errno::NOSYS | Errno::NOLCK) if n == 0 => return Ok(None),
            Err(Errno::AGAIN | Errno::ACCESS) => {
                release(file, &taken);
                return Err(in_use(path, "a lock byte is held exclusively"));
            }
            Err(e) => {
                release(file, &taken);
                return Err(io(e));
            }
        }
    }
    for (b, name, we_unshare) in bytes_tested(access) {
        match cowlink_sys::ofd_lock_test(fd, b, 1) {
            Ok(None) => {}
            Ok(Some(_)) => {
                release(file, &taken);
                let why = if we_unshare {
                    format!("another program holds the \"{name}\" permission")
                } else {
                    format!("another program does not share the \"{name}\" permission")
                };
                return Err(in_use(path, &why));
            }
            Err(e) => {
                release(file, &taken);
                return Err(io(e));
            }
        }
    }
    Ok(Some(Held { access }))
}

fn release(file: &File, bytes: &[u64]) {
    for &b in bytes {
        let _ = cowlink_sys::ofd_lock_set(file.as_fd(), b, 1, true, true);
    }
}

fn in_use(path: &Path, why: &str) -> Error {
    Error::new(Operation::Image, ErrorKind::InUse)
        .with_src(path)
        .with_reason(format!(
            "the image is in use: {why} (QEMU, qemu-img, qemu-io or another cowlink holds \
             locks on it); shut the guest down or let the other command finish first"
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_bytes_are_qemus() {
        // A reader: holds read (100); refuses others write (201) and
        // resize (203).
        assert_eq!(bytes_taken(Access::Read), vec![100, 201, 203]);
        // A writer: read, write, resize (100, 101, 103); the same refusals.
        assert_eq!(bytes_taken(Access::Write), vec![100, 101, 103, 201, 203]);
        // A reader tests whether anyone refuses read (200) or holds write
        // or resize (101, 103).
        let t: Vec<u64> = bytes_tested(Access::Read).iter().map(|t| t.0).collect();
        assert_eq!(t, vec![200, 101, 103]);
        let t: Vec<u64> = bytes_tested(Access::Write).iter().map(|t| t.0).collect();
        assert_eq!(t, vec![200, 201, 203, 101, 103]);
    }

    /// Two descriptors of one file behave as two programs: readers share,
    /// a writer excludes both readers and writers, and a refused taker
    /// leaves nothing behind.
    #[test]
    fn readers_share_writers_exclude() {
        let dir = std::env::temp_dir().join(format!("cowlink-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("img");
        std::fs::write(&p, b"x").unwrap();
        let open = || File::open(&p).unwrap();
        let (a, b, c) = (open(), open(), open());
        let Some(_) = take(&p, &a, Access::Read).unwrap() else {
            std::fs::remove_dir_all(&dir).unwrap();
            return; // no OFD locks on this temporary filesystem
        };
        assert!(take(&p, &b, Access::Read).unwrap().is_some());
        let e = take(&p, &c, Access::Write).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InUse);
        assert!(e.to_string().contains("img"), "{e}");
        drop((a, b));
        // c's refused attempt left nothing: a writer on a fresh
        // descriptor now succeeds, and then excludes a reader.
        let d = open();
        assert!(take(&p, &d, Access::Write).unwrap().is_some());
        let e = take(&p, &c, Access::Read).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InUse);
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
