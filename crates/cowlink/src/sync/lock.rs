//! One sync per destination at a time, nested destinations included:
//! `flock`s on the destination directory and on the directories above it.
//!
//! The rule. A run that writes into DST takes `LOCK_EX` on DST and
//! `LOCK_SH` on each ancestor of DST on DST's filesystem (an ancestor
//! this user cannot open to read cannot be locked: the walk goes on above
//! it, and the run is refused if another holds `LOCK_EX` on it, as the
//! kernel's lock table says; a run into that ancestor started later does
//! not see this one). A dry run takes `LOCK_SH` on DST and on the same ancestors.
//! So:
//! - two runs into one DST refuse each other (a dry run and a run too);
//! - a run into DST and a run into a directory inside it refuse each
//!   other, whichever started first: the inner run's `LOCK_SH` on DST
//!   meets the outer run's `LOCK_EX`. A lock on DST alone would let
//!   both write the inner directory at once;
//! - runs into siblings (`dst/a/` and `dst/b/`) run together: both only
//!   share their common ancestors; so do dry runs, whatever their DSTs;
//! - a dry run of a directory inside a running DST is refused (it would
//!   read entries being written), a dry run of DST while a run writes a
//!   directory inside it is not (its own `LOCK_SH` meets the other's
//!   `LOCK_SH`): the price of keeping dry runs cheap to lock.
//!
//! A run that makes its missing DST takes `LOCK_SH` on the directory it
//! makes DST in, and above, before making it: a run into one of those
//! refuses it before anything is made.
//!
//! A snapshot run (`sync --snapshot ROOT`, and `snapshot prune`) is a run
//! into ROOT: `LOCK_EX` on ROOT, `LOCK_SH` above, held from before its
//! snapshot is begun until it is sealed; the sync into the snapshot's
//! directory takes no lock of its own (ROOT's covers it). So `sync SRC/
//! ROOT/` and `sync SRC/ ROOT/<snapshot>/` refuse a snapshot run, and the
//! other way round. Its dry run is a dry run of the newest complete
//! snapshot. A snapshot begun through the library (`SnapshotSet::begin`)
//! holds `LOCK_SH` on ROOT and above until it is sealed or dropped: a
//! sync into ROOT or above refuses it, a sync into its directory (the
//! caller filling it) does not.
//!
//! The walk goes up DST's filesystem: `..` on DST's mount, and at the
//! root of a mount that is not the filesystem's root (a bind mount of a
//! directory, a Btrfs `subvol=` mount) on through another mount of the
//! same filesystem that reaches the parent (found in the mount table,
//! checked by identity). A bind mount of a directory inside a running
//! DST is that directory, whichever path reaches it. A run never crosses
//! a mount point inside its DST, so nothing on another filesystem can be
//! written by two.
//! A Btrfs subvolume is no mount point: ROOT above a snapshot that is a
//! subvolume is still locked.
//!
//! Locking directories, not files, keeps every bookkeeping file out of
//! DST, works for every user who can open DST, and ends with the process,
//! even after `kill -9`. A refused run names the holder from the kernel's
//! lock table (`/proc/locks`), which lists each `flock` with its process
//! and inode.

use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation};

/// The most ancestors walked: deeper than any real tree.
const MAX_DEPTH: usize = 4096;

/// The locks of one run; released when dropped (or when the process
/// ends).
#[derive(Debug)]
pub(crate) struct Held {
    _fds: Vec<OwnedFd>,
}

/// Take a run's locks on the open destination directory `dir` (`shown`
/// for messages): `LOCK_EX` on it (`LOCK_SH` when `shared`: a dry run)
/// and `LOCK_SH` on each ancestor on its mount. They last as long as the
/// answer.
///
/// # Errors
/// `InUse`, naming the holder, when another run holds a lock that
/// conflicts; the lock on `dir` itself cannot be taken.
pub(crate) fn take(dir: BorrowedFd<'_>, shown: &Path, shared: bool) -> Result<Held, Error> {
    let cannot = |e: Errno| {
        Error::from_errno(Operation::Sync, e)
            .with_dst(shown)
            .with_reason("cannot lock the destination directory")
    };
    // A description of its own: the locks belong to it, not to the
    // caller's descriptor, and end with the answer.
    let own = fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(cannot)?;
    let mut fds = Vec::new();
    match lock_one(own.as_fd(), shared) {
        Ok(()) => fds.push(own),
        Err(Refused::Held(who)) => {
            let reason = if shared {
                format!("a sync into this directory is running ({who} holds its lock)")
            } else {
                format!(
                    "another sync into this directory or into a directory inside it is \
                     running ({who} holds its lock)"
                )
            };
            return Err(in_use(shown, reason));
        }
        Err(Refused::Failed(e)) => return Err(cannot(e)),
    }
    if let Some(up) = parent_of(dir) {
        lock_chain(up, shown, shown, 1, &mut fds)?;
    }
    Ok(Held { _fds: fds })
}

/// The directory above `dir` on its filesystem: its `..` on its mount;
/// at the root of a mount that is not the filesystem's root (a bind mount
/// of a directory, a Btrfs `subvol=` mount), the same parent reached
/// through another mount of that filesystem. A directory bind-mounted
/// elsewhere is the one inside another run's DST, whatever path reaches
/// it: without this, a run into the alias would lock nothing above it
/// and write beside the run into the outer directory. `None` at the
/// filesystem's root, or when no mount this process sees reaches the
/// parent.
fn parent_of(dir: BorrowedFd<'_>) -> Option<OwnedFd> {
    match cowlink_sys::open_parent_same_mount(dir) {
        Ok(up) if same_dir(dir, up.as_fd()) => alias_parent(dir),
        Ok(up) => Some(up),
        Err(Errno::XDEV) => alias_parent(dir),
        Err(_) => None,
    }
}

/// [`parent_of`] at a mount's root: from the mount table, the path of
/// `dir` inside its filesystem (the mount's root field), and a mount of
/// the same filesystem whose root holds that path's parent. The parent
/// found is checked by identity (its entry of `dir`'s name is `dir`), so
/// a stale table or a name renamed since is never locked in its place.
fn alias_parent(dir: BorrowedFd<'_>) -> Option<OwnedFd> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let mnt_id = cowlink_sys::mount_id(dir).ok()?;
    let table = cowlink_sys::mount_table().ok()?;
    let mounts = mount_roots(&table);
    let mine = mounts.iter().find(|m| u64::from(m.id) == mnt_id)?;
    let name = mine.root.file_name()?;
    let parent = mine.root.parent()?;
    let want = cowlink_sys::fstat(dir).ok()?;
    // Mounts of the filesystem whose root holds the parent, the widest
    // first (the most ancestors reachable through it).
    let mut via: Vec<&MountRoot> = mounts
        .iter()
        .filter(|m| m.dev == mine.dev && m.id != mine.id && parent.starts_with(&m.root))
        .collect();
    via.sort_by_key(|m| m.root.components().count());
    via.into_iter().find_map(|m| {
        let rel = parent.strip_prefix(&m.root).ok()?;
        let path = CString::new(m.mount_point.join(rel).as_os_str().as_bytes()).ok()?;
        let up = fs::open(
            path.as_c_str(),
            cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let name = CString::new(name.as_bytes()).ok()?;
        let child = fs::openat(
            &up,
            name.as_c_str(),
            cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let got = cowlink_sys::fstat(&child).ok()?;
        ((got.st_dev, got.st_ino) == (want.st_dev, want.st_ino)).then_some(up)
    })
}

/// What [`alias_parent`] needs of one mount: its id, its filesystem's
/// device, the directory of the filesystem at its root, and where it is.
struct MountRoot {
    id: u32,
    dev: (u32, u32),
    root: PathBuf,
    mount_point: PathBuf,
}

/// The fields of `/proc/self/mountinfo` text [`alias_parent`] reads
/// (`36 35 98:0 /mnt1 /mnt2 rw - ext3 /dev/root rw`); malformed lines
/// are skipped.
fn mount_roots(table: &str) -> Vec<MountRoot> {
    let unescape = |f: &str| PathBuf::from(crate::ground::mountinfo::unescape(f));
    table
        .lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let id = f.next()?.parse().ok()?;
            let _parent = f.next()?;
            let (maj, min) = f.next()?.split_once(':')?;
            let dev = (maj.parse().ok()?, min.parse().ok()?);
            let root = unescape(f.next()?);
            let mount_point = unescape(f.next()?);
            Some(MountRoot {
                id,
                dev,
                root,
                mount_point,
            })
        })
        .collect()
}

/// Before a run makes its missing destination `dst` in the directory
/// `parent`: `LOCK_SH` on `parent` and its ancestors, the locks the run
/// will hold above `dst`, so that a run into one of them refuses this one
/// before anything is made, not after. Held until the run holds its own
/// ([`take`] on the new directory).
///
/// # Errors
/// `InUse`, naming the holder, as [`take`].
pub(crate) fn take_above_new(parent: BorrowedFd<'_>, dst: &Path) -> Result<Held, Error> {
    let parent_path = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut fds = Vec::new();
    let start = fs::openat(
        parent,
        c".",
        cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    );
    if let Ok(start) = start {
        lock_chain(start, parent_path, dst, 0, &mut fds)?;
    }
    Ok(Held { _fds: fds })
}

/// Whether two open directories are one (the root is its own parent).
fn same_dir(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let id = |fd: BorrowedFd<'_>| cowlink_sys::fstat(fd).map(|s| (s.st_dev, s.st_ino));
    matches!((id(a), id(b)), (Ok(x), Ok(y)) if x == y)
}

/// `LOCK_SH` on the directory `start` (`depth` levels above `base`) and
/// on each directory above it on its mount, into `fds`; `shown` is the
/// destination, for messages. A directory this user cannot open is
/// skipped (the walk goes on above it); the walk ends at the mount's root
/// or at the root of the tree.
fn lock_chain(
    start: OwnedFd,
    base: &Path,
    shown: &Path,
    depth: usize,
    fds: &mut Vec<OwnedFd>,
) -> Result<(), Error> {
    let mut cur = start;
    for depth in depth..depth + MAX_DEPTH {
        let opened = fs::openat(
            &cur,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        );
        if opened.is_err() {
            // Not readable by this user, so not lockable: a run into it
            // (its `LOCK_EX`, in the kernel's lock table) still refuses
            // this one. A run into it that starts later cannot see this
            // one: the price of a directory this user cannot open.
            if let Some(who) = exclusive_holder(cur.as_fd()) {
                let above = dir_name(cur.as_fd()).unwrap_or_else(|| ancestor_name(base, depth));
                return Err(in_use(
                    shown,
                    format!(
                        "a sync into {}, which holds this directory, is running (process \
                         {who} holds its lock)",
                        crate::name::quoted(&above)
                    ),
                ));
            }
        }
        if let Ok(readable) = opened {
            match lock_one(readable.as_fd(), true) {
                Ok(()) => fds.push(readable),
                Err(Refused::Held(who)) => {
                    let above =
                        dir_name(readable.as_fd()).unwrap_or_else(|| ancestor_name(base, depth));
                    return Err(in_use(
                        shown,
                        format!(
                            "a sync into {}, which holds this directory, is running ({who} \
                             holds its lock)",
                            crate::name::quoted(&above)
                        ),
                    ));
                }
                // A filesystem without `flock` on directories: that
                // directory cannot take part.
                Err(Refused::Failed(_)) => {}
            }
        }
        // The filesystem's root, or no way up: the walk ends.
        let Some(up) = parent_of(cur.as_fd()) else {
            break;
        };
        cur = up;
    }
    Ok(())
}

fn in_use(shown: &Path, reason: String) -> Error {
    Error::new(Operation::Sync, ErrorKind::InUse)
        .with_dst(shown)
        .with_reason(reason)
}

/// The path of the open directory `dir` as the kernel names it, for a
/// message: the walk may have gone up through another mount than the
/// destination's path.
fn dir_name(dir: BorrowedFd<'_>) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .ok()
        .filter(|p| p.is_absolute())
}

/// The directory `depth` levels above `base`, for a message: from its
/// canonical path (which ".." walks the same way), or a description when
/// that cannot be had.
fn ancestor_name(base: &Path, depth: usize) -> PathBuf {
    std::fs::canonicalize(base)
        .ok()
        .and_then(|c| c.ancestors().nth(depth).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(format!("the directory {depth} levels above")))
}

/// Why [`lock_one`] did not lock.
enum Refused {
    /// Another holds a conflicting lock: who (a process, named when the
    /// lock table says).
    Held(String),
    /// `flock` itself failed.
    Failed(Errno),
}

/// `flock(fd, LOCK_EX or LOCK_SH | LOCK_NB)`.
fn lock_one(fd: BorrowedFd<'_>, shared: bool) -> Result<(), Refused> {
    let op = if shared {
        FlockOperation::NonBlockingLockShared
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    // A process that forks (another thread running a command) lends
    // the child its open file descriptions, and so its locks, until the
    // child's exec closes them: a lock no other process took is waited
    // for, a moment, before it counts as held.
    let mut waits = 0;
    loop {
        match fs::flock(fd, op) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(Errno::WOULDBLOCK) => {
                let ino = cowlink_sys::fstat(fd).map(|st| st.st_ino).unwrap_or(0);
                let me = std::process::id();
                let holder = cowlink_sys::lock_table()
                    .ok()
                    .and_then(|t| holder(&t, ino, me));
                if holder.is_none() && waits < 50 {
                    waits += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                return Err(Refused::Held(match holder {
                    Some(pid) => format!("process {pid}"),
                    None => "another process".to_string(),
                }));
            }
            Err(e) => return Err(Refused::Failed(e)),
        }
    }
}

/// The process other than this one holding an exclusive `flock` on the
/// directory `dir` (open `O_PATH`), from the lock table. The lock table
/// names the filesystem's device, which is `dir`'s own except on Btrfs
/// (a subvolume's device differs): there the inode alone is compared.
fn exclusive_holder(dir: BorrowedFd<'_>) -> Option<u32> {
    const BTRFS_SUPER_MAGIC: u64 = 0x9123_683e;
    let st = cowlink_sys::fstat(dir).ok()?;
    let btrfs = cowlink_sys::fs_stat(dir).is_ok_and(|f| f.magic == Some(BTRFS_SUPER_MAGIC));
    let dev = (!btrfs).then(|| cowlink_sys::dev_major_minor(st.st_dev as u64));
    let table = cowlink_sys::lock_table().ok()?;
    exclusive_in(&table, dev, st.st_ino, std::process::id())
}

/// [`exclusive_holder`] on the text of `/proc/locks`: a `FLOCK` `WRITE`
/// lock on inode `ino` (of device `dev`, hexadecimal `major:minor` in the
/// table, when given) held by a process other than `me`; waiters
/// (`->`) are not holders.
fn exclusive_in(table: &str, dev: Option<(u32, u32)>, ino: u64, me: u32) -> Option<u32> {
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") || f.get(3) != Some(&"WRITE") {
            return None;
        }
        let pid: u32 = f.get(4)?.parse().ok()?;
        let mut id = f.get(5)?.rsplitn(2, ':');
        let file_ino: u64 = id.next()?.parse().ok()?;
        let (maj, min) = id.next()?.split_once(':')?;
        let file_dev = (
            u32::from_str_radix(maj, 16).ok()?,
            u32::from_str_radix(min, 16).ok()?,
        );
        let same_dev = dev.is_none_or(|d| d == file_dev);
        (file_ino == ino && same_dev && pid != me).then_some(pid)
    })
}

/// The process holding a `flock` on inode `ino`, from the text of
/// `/proc/locks` (`1: FLOCK ADVISORY WRITE 1234 08:02:567 0 EOF`), other
/// than `me`. The device is not compared: Btrfs reports a subvolume's own
/// device to `stat` but its filesystem's here.
fn holder(table: &str, ino: u64, me: u32) -> Option<u32> {
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "->" marks a waiter, shifting the fields by one.
        let f = if f.get(1) == Some(&"->") {
            &f[1..]
        } else {
            &f[..]
        };
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = f.get(4)?.parse().ok()?;
        let file_ino: u64 = f.get(5)?.rsplit(':').next()?.parse().ok()?;
        (file_ino == ino && pid != me).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_the_lock_table() {
        let t = "1: POSIX  ADVISORY  WRITE 77 00:1a:5 0 EOF\n\
                 2: FLOCK  ADVISORY  WRITE 4321 fd:01:1234 0 EOF\n\
                 3: FLOCK  ADVISORY  WRITE 99 08:02:555 0 EOF\n";
        assert_eq!(holder(t, 1234, 1), Some(4321));
        assert_eq!(holder(t, 1234, 4321), None, "our own lock is not a holder");
        assert_eq!(holder(t, 5, 1), None, "POSIX locks are not ours");
        assert_eq!(holder(t, 9, 1), None);
    }

    #[test]
    fn an_exclusive_holder_is_read_from_the_lock_table() {
        let t = "1: FLOCK  ADVISORY  READ 55 fd:01:1234 0 EOF\n\
                 2: FLOCK  ADVISORY  WRITE 66 08:12:777 0 EOF\n\
                 2: -> FLOCK  ADVISORY  WRITE 67 08:12:1234 0 EOF\n";
        assert_eq!(exclusive_in(t, None, 1234, 1), None, "shared, or waiting");
        assert_eq!(exclusive_in(t, Some((8, 0x12)), 777, 1), Some(66));
        assert_eq!(exclusive_in(t, Some((8, 2)), 777, 1), None, "other device");
        assert_eq!(exclusive_in(t, None, 777, 1), Some(66));
        assert_eq!(exclusive_in(t, None, 777, 66), None, "our own");
    }

    #[test]
    fn mount_roots_are_read_from_the_mount_table() {
        let t = "22 1 8:2 / / rw - xfs /dev/sda2 rw\n\
                 40 22 8:2 /a/my\\040dir /mnt/b rw,relatime shared:1 - xfs /dev/sda2 rw\n\
                 bad line\n";
        let m = mount_roots(t);
        assert_eq!(m.len(), 2);
        assert_eq!((m[1].id, m[1].dev), (40, (8, 2)));
        assert_eq!(m[1].root, Path::new("/a/my dir"));
        assert_eq!(m[1].mount_point, Path::new("/mnt/b"));
    }

    fn open(p: &Path) -> OwnedFd {
        fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    /// The rule of the module notes, on one tree: nested destinations
    /// refuse each other in both orders, siblings and dry runs do not.
    #[test]
    fn nested_destinations_are_exclusive_siblings_are_not() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("dst");
        let (a, b) = (top.join("a"), top.join("b"));
        std::fs::create_dir_all(a.join("deep")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let lock = |p: &Path, shared: bool| take(open(p).as_fd(), p, shared);
        // The outer run first: every run below it is refused.
        let outer = lock(&top, false).unwrap();
        for p in [&a, &a.join("deep"), &b] {
            let e = lock(p, false).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InUse);
            assert!(e.to_string().contains("which holds this directory"), "{e}");
            assert_eq!(lock(p, true).unwrap_err().kind(), ErrorKind::InUse);
        }
        drop(outer);
        // The inner run first: the outer is refused, siblings and dry
        // runs of the outer are not.
        let inner = lock(&a, false).unwrap();
        assert_eq!(lock(&top, false).unwrap_err().kind(), ErrorKind::InUse);
        assert_eq!(lock(&a, true).unwrap_err().kind(), ErrorKind::InUse);
        assert_eq!(
            lock(&a.join("deep"), false).unwrap_err().kind(),
            ErrorKind::InUse
        );
        let sibling = lock(&b, false).unwrap();
        let dry = lock(&top, true).unwrap();
        drop((inner, sibling, dry));
        // Released: all of them again.
        drop(lock(&top, false).unwrap());
    }
}
