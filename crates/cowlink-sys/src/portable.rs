//! Every Unix but Linux: the same functions as `linux.rs`, answering with
//! what the system has and "not possible here" for the rest, so the
//! core's fallbacks run.
//!
//! - No clone call: [`ficlone`] and [`ficlonerange`] answer `EOPNOTSUPP`,
//!   which the core reports as "not supported here", so `auto` copies and
//!   `always` fails with that reason. (macOS has `clonefile(2)`, which
//!   creates a new file rather than filling an open one: a port adds it
//!   here behind the same signatures.)
//! - No dedupe, FIEMAP, Btrfs look-ups or OFD locks: `EOPNOTSUPP`
//!   (`ENOTTY` for the Btrfs calls, as Linux answers off Btrfs).
//! - No `O_TMPFILE`, `copy_file_range` or `fallocate`: the core writes a
//!   named temporary, copies with `pread`/`pwrite`, and does not
//!   preallocate.
//! - No `openat2`: [`open_beneath`] walks the path one component at a time
//!   with `O_NOFOLLOW`, refusing `..`.
//! - No `syncfs`: [`sync_filesystem`] calls `sync(2)`, which writes back
//!   every filesystem (more than asked, never less).
//! - No `/proc`: no mount table, swap list or umask; process existence by
//!   `kill(pid, 0)`.
//! - macOS: extended attributes, `SEEK_DATA`/`SEEK_HOLE`, `RENAME_EXCL`
//!   and the filesystem's type name (`f_fstypename`) through rustix.

use std::ffi::CStr;
use std::path::Path;

use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;

use crate::fanotify::*;
use crate::types::*;

/// Why this platform cannot clone at all, for messages: there is no
/// `FICLONE` here, so every clone answers "not supported".
pub const CLONE_UNAVAILABLE: Option<&str> =
    Some("cowlink clones files only on Linux (FICLONE); this system copies instead");

/// Opens a directory only to name it in `*at` calls. No `O_PATH` here: a
/// read-only open, which needs read permission on the directory.
pub const O_PATH: OFlags = OFlags::RDONLY;

/// No `O_NOATIME` here: opening for reading updates access times as usual.
pub const O_NOATIME: OFlags = OFlags::empty();

/// No clone call here: `EOPNOTSUPP`.
pub fn ficlone(_dst: BorrowedFd<'_>, _src: BorrowedFd<'_>) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No clone call here: `EOPNOTSUPP`.
pub fn ficlonerange(
    _dst: BorrowedFd<'_>,
    _src: BorrowedFd<'_>,
    _src_offset: u64,
    _len: u64,
    _dst_offset: u64,
) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No dedupe call here: `EOPNOTSUPP`.
pub fn fideduperange(
    _src: BorrowedFd<'_>,
    _src_offset: u64,
    _len: u64,
    _dests: &[(BorrowedFd<'_>, u64)],
) -> Result<Vec<DedupeResult>, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No FIEMAP here: `EOPNOTSUPP`, as Linux answers on tmpfs.
pub fn fiemap(
    _fd: BorrowedFd<'_>,
    _start: u64,
    _len: u64,
    _flags: u32,
    _out: &mut Vec<FiemapExtent>,
) -> Result<usize, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_logical_ino(
    _fd: BorrowedFd<'_>,
    _logical: u64,
    _size: usize,
) -> Result<(Vec<BtrfsRef>, u32), Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_extent_holders(
    _fd: BorrowedFd<'_>,
    _logical: u64,
    _size: usize,
) -> Result<(Vec<BtrfsRef>, u32), Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_fsid(_fd: BorrowedFd<'_>) -> Result<[u8; 16], Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_space_used(_fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_ino_paths(_fd: BorrowedFd<'_>, _inode: u64) -> Result<Vec<Vec<u8>>, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_root_id(_fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_file_extents(_fd: BorrowedFd<'_>, _inode: u64) -> Result<Vec<BtrfsFileExtent>, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_first_file_extent(
    _fd: BorrowedFd<'_>,
    _inode: u64,
) -> Result<Option<BtrfsFileExtent>, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_leading_file_extents(
    _fd: BorrowedFd<'_>,
    _inode: u64,
    _max: u32,
) -> Result<Vec<BtrfsFileExtent>, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_subvol_uuid(_fd: BorrowedFd<'_>) -> Result<[u8; 16], Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_relocated_at(_fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_commit(_fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_inodes_changed_since(
    _fd: BorrowedFd<'_>,
    _dev: u64,
    _lo: u64,
    _hi: u64,
    _since: u64,
    _max_items: usize,
) -> Result<Option<(Vec<BtrfsChanged>, usize)>, Errno> {
    Err(Errno::NOTTY)
}

/// Where a directory is a Btrfs subvolume's root; never met here.
pub const BTRFS_SUBVOL_ROOT_INO: u64 = 256;

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_subvol_create(_dir: BorrowedFd<'_>, _name: &CStr) -> Result<(), Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_snapshot_create(
    _dir: BorrowedFd<'_>,
    _name: &CStr,
    _source: BorrowedFd<'_>,
) -> Result<(), Errno> {
    Err(Errno::NOTTY)
}

/// No Btrfs here: `ENOTTY`.
pub fn btrfs_subvol_delete(_dir: BorrowedFd<'_>, _name: &CStr) -> Result<(), Errno> {
    Err(Errno::NOTTY)
}

/// Open the subdirectory `name` of `dir` without following a link
/// (`O_NOFOLLOW`) and without crossing into another filesystem (`EXDEV`
/// when its `st_dev` differs from `dir`'s). Without `openat2` a bind
/// mount of the same filesystem is not told apart.
pub fn open_dir_same_mount(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let fd = rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rfs::fstat(&fd)?.st_dev != rfs::fstat(dir)?.st_dev {
        return Err(Errno::XDEV);
    }
    Ok(fd)
}

/// The id of the mount `fd` was opened through: Linux only (`ENOSYS`).
pub fn mount_id(_fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    Err(Errno::NOSYS)
}

/// The parent of the directory `dir` (opened to read: there is no
/// `O_PATH` here), or `EXDEV` when its `st_dev` differs from `dir`'s.
/// Without `openat2` a bind mount of the same filesystem is not told
/// apart. At the root of the tree the answer is `dir` itself.
pub fn open_parent_same_mount(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let fd = rfs::openat(
        dir,
        "..",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rfs::fstat(&fd)?.st_dev != rfs::fstat(dir)?.st_dev {
        return Err(Errno::XDEV);
    }
    Ok(fd)
}

/// Open the entry `name` of `dir` (any type `flags` allow) without
/// following a link (`O_NOFOLLOW`) and without crossing into another
/// filesystem (`EXDEV` when its `st_dev` differs from `dir`'s). Without
/// `openat2` a bind mount of the same filesystem is not told apart.
pub fn open_same_mount(dir: BorrowedFd<'_>, name: &CStr, flags: OFlags) -> Result<OwnedFd, Errno> {
    let fd = rfs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rfs::fstat(&fd)?.st_dev != rfs::fstat(dir)?.st_dev {
        return Err(Errno::XDEV);
    }
    Ok(fd)
}

/// No `statx` here: no creation time known.
pub fn birth_time(_fd: BorrowedFd<'_>) -> Result<Option<(i64, u32)>, Errno> {
    Ok(None)
}

/// No open-file-description locks here: `EOPNOTSUPP`.
pub fn ofd_lock_held(_fd: BorrowedFd<'_>) -> Result<Option<i16>, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No open-file-description locks here: `EOPNOTSUPP`.
pub fn ofd_lock_test(_fd: BorrowedFd<'_>, _start: u64, _len: u64) -> Result<Option<i16>, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No open-file-description locks here: `EOPNOTSUPP`.
pub fn ofd_lock_set(
    _fd: BorrowedFd<'_>,
    _start: u64,
    _len: u64,
    _shared: bool,
    _unlock: bool,
) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No `O_TMPFILE` here: `EOPNOTSUPP`, so callers create a named temporary.
pub fn open_unnamed(
    _dir: BorrowedFd<'_>,
    _path: &Path,
    _access: OFlags,
    _mode: Mode,
) -> Result<OwnedFd, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No way to name an open file here (no `AT_EMPTY_PATH`, no `/proc`):
/// `EOPNOTSUPP`, so callers link by path. [`open_unnamed`] never makes an
/// unnamed file here.
pub fn link_fd(_file: BorrowedFd<'_>, _target: BorrowedFd<'_>, _name: &Path) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// Rename without replacing (`EEXIST`): `renameatx_np(RENAME_EXCL)` on
/// macOS; elsewhere `EINVAL`, so callers link and unlink instead.
pub fn rename_noreplace(
    old_dir: BorrowedFd<'_>,
    old: &Path,
    new_dir: BorrowedFd<'_>,
    new: &Path,
) -> Result<(), Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::renameat_with(old_dir, old, new_dir, new, rfs::RenameFlags::NOREPLACE);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (old_dir, old, new_dir, new);
        Err(Errno::INVAL)
    }
}

/// Open `path` below `dir` without following any symbolic link and
/// without leaving `dir`: one component at a time, each with
/// `O_NOFOLLOW` (`ELOOP` on a link), `..` refused with `EXDEV`, as
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` answers on Linux.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    if path.starts_with('/') {
        return Err(Errno::XDEV);
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(Errno::XDEV);
    }
    let Some((last, dirs)) = parts.split_last() else {
        return rfs::openat(dir, ".", flags | OFlags::CLOEXEC, mode);
    };
    let mut at: Option<OwnedFd> = None;
    for part in dirs {
        let from = at.as_ref().map_or(dir, |d| rustix::fd::AsFd::as_fd(d));
        let walk = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        at = Some(rfs::openat(from, *part, walk, Mode::empty())?);
    }
    let from = at.as_ref().map_or(dir, |d| rustix::fd::AsFd::as_fd(d));
    rfs::openat(
        from,
        *last,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )
}

/// No `copy_file_range` here: `ENOSYS`, so callers read and write.
pub fn copy_file_range(
    _src: BorrowedFd<'_>,
    _off_in: &mut u64,
    _dst: BorrowedFd<'_>,
    _off_out: &mut u64,
    _len: usize,
) -> Result<usize, Errno> {
    Err(Errno::NOSYS)
}

/// No `fallocate` here: `EOPNOTSUPP`.
pub fn allocate(_fd: BorrowedFd<'_>, _offset: u64, _len: u64) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No `fallocate` here: `EOPNOTSUPP`.
pub fn allocate_keep_size(_fd: BorrowedFd<'_>, _offset: u64, _len: u64) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No hole punching here: `EOPNOTSUPP`.
pub fn punch_hole(_fd: BorrowedFd<'_>, _offset: u64, _len: u64) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No zeroing of ranges here: `EOPNOTSUPP`.
pub fn zero_range(_fd: BorrowedFd<'_>, _offset: u64, _len: u64) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// `lseek(fd, pos, SEEK_DATA)` on macOS; `EINVAL` (no hole reporting)
/// elsewhere.
pub fn seek_data(fd: BorrowedFd<'_>, pos: u64) -> Result<u64, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::seek(fd, rfs::SeekFrom::Data(pos));
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, pos);
        Err(Errno::INVAL)
    }
}

/// `lseek(fd, pos, SEEK_HOLE)` on macOS; `EINVAL` elsewhere.
pub fn seek_hole(fd: BorrowedFd<'_>, pos: u64) -> Result<u64, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::seek(fd, rfs::SeekFrom::Hole(pos));
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, pos);
        Err(Errno::INVAL)
    }
}

#[cfg(target_vendor = "apple")]
fn fs_stat_of(s: &rfs::StatFs) -> FsStat {
    let name: Vec<u8> = s
        .f_fstypename
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    FsStat {
        magic: None,
        type_name: Some(String::from_utf8_lossy(&name).into_owned()),
        block_size: u64::from(s.f_bsize),
    }
}

#[cfg(not(target_vendor = "apple"))]
fn fs_stat_of(s: &rfs::StatVfs) -> FsStat {
    FsStat {
        magic: None,
        type_name: None,
        block_size: s.f_frsize.max(1),
    }
}

/// The filesystem `fd` is on: its type name and block size (`fstatfs` on
/// macOS, `fstatvfs` elsewhere, without a name).
pub fn fs_stat(fd: BorrowedFd<'_>) -> Result<FsStat, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::fstatfs(fd).map(|s| fs_stat_of(&s));
    #[cfg(not(target_vendor = "apple"))]
    return rfs::fstatvfs(fd).map(|s| fs_stat_of(&s));
}

/// The filesystem `path` is on, as [`fs_stat`] says it.
pub fn fs_stat_path(path: &Path) -> Result<FsStat, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::statfs(path).map(|s| fs_stat_of(&s));
    #[cfg(not(target_vendor = "apple"))]
    return rfs::statvfs(path).map(|s| fs_stat_of(&s));
}

/// No `syncfs` here: `sync(2)`, which writes back every filesystem.
pub fn sync_filesystem(_fd: BorrowedFd<'_>) -> Result<(), Errno> {
    rfs::sync();
    Ok(())
}

/// No way to drop one file's cached pages here: `EOPNOTSUPP`.
pub fn drop_cached_pages(_fd: BorrowedFd<'_>) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No inode attribute flags here: `EOPNOTSUPP`.
pub fn inode_flags(_fd: BorrowedFd<'_>) -> Result<InodeFlags, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No inode attribute flags here: `EOPNOTSUPP`.
pub fn set_inode_flags(_fd: BorrowedFd<'_>, _flags: InodeFlags) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No POSIX default ACLs here (macOS keeps its ACLs apart from
/// extended attributes, and new files' modes follow the umask).
pub fn has_default_acl(_fd: BorrowedFd<'_>) -> bool {
    false
}

/// No attribute is an ACL here (macOS keeps ACLs apart).
pub fn is_acl_xattr(_name: &[u8]) -> bool {
    false
}

/// `flistxattr` into `buf` on macOS; `EOPNOTSUPP` elsewhere.
pub fn list_xattrs(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::flistxattr(fd, buf);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, buf);
        Err(Errno::OPNOTSUPP)
    }
}

/// `flistxattr(fd, NULL, 0)` on macOS; `EOPNOTSUPP` elsewhere.
pub fn list_xattrs_len(fd: BorrowedFd<'_>) -> Result<usize, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::flistxattr_query(fd);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = fd;
        Err(Errno::OPNOTSUPP)
    }
}

/// `fgetxattr` into `buf` on macOS; `EOPNOTSUPP` elsewhere.
pub fn get_xattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::fgetxattr(fd, name, buf);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, name, buf);
        Err(Errno::OPNOTSUPP)
    }
}

/// `fgetxattr(fd, name, NULL, 0)` on macOS; `EOPNOTSUPP` elsewhere.
pub fn get_xattr_len(fd: BorrowedFd<'_>, name: &CStr) -> Result<usize, Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::fgetxattr_query(fd, name);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, name);
        Err(Errno::OPNOTSUPP)
    }
}

/// `fsetxattr` on macOS; `EOPNOTSUPP` elsewhere.
pub fn set_xattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> Result<(), Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::fsetxattr(fd, name, value, rfs::XattrFlags::empty());
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, name, value);
        Err(Errno::OPNOTSUPP)
    }
}

/// Removing extended attributes: through rustix on macOS, `EOPNOTSUPP`
/// elsewhere.
pub fn remove_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    #[cfg(target_vendor = "apple")]
    return rfs::fremovexattr(fd, name);
    #[cfg(not(target_vendor = "apple"))]
    {
        let _ = (fd, name);
        Err(Errno::OPNOTSUPP)
    }
}

/// No `/proc` here to reach an entry by name: `EOPNOTSUPP`, and callers
/// open the entry instead.
pub fn list_xattrs_at(dir: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    let _ = (dir, name, buf);
    Err(Errno::OPNOTSUPP)
}

/// As [`list_xattrs_at`]: `EOPNOTSUPP`.
pub fn get_xattr_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    attr: &CStr,
    buf: &mut [u8],
) -> Result<usize, Errno> {
    let _ = (dir, name, attr, buf);
    Err(Errno::OPNOTSUPP)
}

/// Set the mode of the entry `name` in `dir` without following it
/// (`fchmodat` with `AT_SYMLINK_NOFOLLOW`).
pub fn chmod_nofollow(dir: BorrowedFd<'_>, name: &CStr, mode: Mode) -> Result<(), Errno> {
    rfs::chmodat(dir, name, mode, rfs::AtFlags::SYMLINK_NOFOLLOW)
}

/// No `/proc/locks` here: the holder of a lock cannot be named.
pub fn lock_table() -> std::io::Result<String> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "no lock table on this system",
    ))
}

/// No mount table in Linux's format here: an `Unsupported` error.
pub fn mount_table() -> std::io::Result<String> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "no mount table on this system (cowlink reads Linux's /proc/self/mountinfo)",
    ))
}

/// Where [`mount_table`] would read, for messages.
pub const MOUNT_TABLE: &str = "the mount table";

/// No swap list here.
pub fn swaps() -> Option<String> {
    None
}

/// No way to read the umask without changing it here: `None`.
pub fn umask() -> Option<u32> {
    None
}

/// Whether a process with id `pid` exists: `kill(pid, 0)` answers
/// success or `EPERM` (it exists, not ours), or `ESRCH`.
pub fn process_exists(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH))
}

/// This machine's host name (`uname`'s node name).
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// What `stat` says of a file, with Linux's field types (`st_mode: u32`,
/// `st_dev: u64`, `st_nlink: u64`, times as on x86_64 Linux: seconds `i64`, nanoseconds `u64`), so that
/// callers do arithmetic on one set of types everywhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Stat {
    pub st_dev: u64,
    pub st_ino: u64,
    pub st_nlink: u64,
    pub st_mode: u32,
    pub st_uid: u32,
    pub st_gid: u32,
    pub st_rdev: u64,
    pub st_size: i64,
    pub st_blksize: i64,
    pub st_blocks: i64,
    pub st_atime: i64,
    pub st_atime_nsec: u64,
    pub st_mtime: i64,
    pub st_mtime_nsec: u64,
    pub st_ctime: i64,
    pub st_ctime_nsec: u64,
}

// The widths differ between the BSDs (and some casts are to the same
// type on one of them): every field goes through `as`.
#[allow(clippy::unnecessary_cast)]
fn stat_of(s: rfs::Stat) -> Stat {
    Stat {
        st_dev: s.st_dev as u64,
        st_ino: s.st_ino as u64,
        st_nlink: s.st_nlink as u64,
        st_mode: s.st_mode as u32,
        st_uid: s.st_uid as u32,
        st_gid: s.st_gid as u32,
        st_rdev: s.st_rdev as u64,
        st_size: s.st_size as i64,
        st_blksize: s.st_blksize as i64,
        st_blocks: s.st_blocks as i64,
        st_atime: s.st_atime as i64,
        st_atime_nsec: s.st_atime_nsec as u64,
        st_mtime: s.st_mtime as i64,
        st_mtime_nsec: s.st_mtime_nsec as u64,
        st_ctime: s.st_ctime as i64,
        st_ctime_nsec: s.st_ctime_nsec as u64,
    }
}

/// `fstat(2)`, answered as [`Stat`].
pub fn fstat<Fd: rustix::fd::AsFd>(fd: Fd) -> Result<Stat, Errno> {
    rfs::fstat(fd).map(stat_of)
}

/// `stat(2)`, answered as [`Stat`].
pub fn stat<P: rustix::path::Arg>(path: P) -> Result<Stat, Errno> {
    rfs::stat(path).map(stat_of)
}

/// `lstat(2)`, answered as [`Stat`].
pub fn lstat<P: rustix::path::Arg>(path: P) -> Result<Stat, Errno> {
    rfs::lstat(path).map(stat_of)
}

/// `fstatat(2)`, answered as [`Stat`].
pub fn statat<P: rustix::path::Arg, Fd: rustix::fd::AsFd>(
    dir: Fd,
    path: P,
    flags: rfs::AtFlags,
) -> Result<Stat, Errno> {
    rfs::statat(dir, path, flags).map(stat_of)
}

/// No filesystem UUID here: `ENOTTY`, as a Linux filesystem without one
/// answers.
pub fn fs_uuid(_fd: BorrowedFd<'_>) -> Result<Vec<u8>, Errno> {
    Err(Errno::NOTTY)
}

/// `fstatat(dir, name)` without following a symbolic link, as
/// [`FileId`]; no birth time.
pub fn file_id_at<P: rustix::path::Arg>(dir: BorrowedFd<'_>, name: P) -> Result<FileId, Errno> {
    statat(dir, name, rfs::AtFlags::SYMLINK_NOFOLLOW).map(file_id_of)
}

/// [`file_id_at`] of the open file `fd` itself.
pub fn file_id(fd: BorrowedFd<'_>) -> Result<FileId, Errno> {
    fstat(fd).map(file_id_of)
}

fn file_id_of(s: Stat) -> FileId {
    FileId {
        dev: s.st_dev,
        ino: s.st_ino,
        mode: s.st_mode,
        uid: s.st_uid,
        size: s.st_size as u64,
        blocks: s.st_blocks as u64,
        mtime_ns: time_ns(s.st_mtime, s.st_mtime_nsec),
        ctime_ns: time_ns(s.st_ctime, s.st_ctime_nsec),
        btime_ns: None,
    }
}

/// The permission bits `m` as a [`Mode`] (`mode_t` is 16 bits here).
pub fn raw_mode(m: u32) -> Mode {
    Mode::from_bits_truncate((m & 0o7777) as rfs::RawMode)
}

/// The file type `st_mode` names.
pub fn file_type(st_mode: u32) -> rfs::FileType {
    rfs::FileType::from_raw_mode(st_mode as rfs::RawMode)
}

/// No `mknodat` here: `EPERM`, as an unprivileged caller gets on Linux.
pub fn mknodat(
    _dir: BorrowedFd<'_>,
    _name: &CStr,
    _kind: rfs::FileType,
    _mode: Mode,
    _dev: u64,
) -> Result<(), Errno> {
    Err(Errno::PERM)
}

/// The `st_mode` type bits of the file type `t`, widened to `u32` (the
/// same type where `mode_t` is 32 bits).
#[allow(clippy::useless_conversion)]
pub fn file_type_bits(t: rfs::FileType) -> u32 {
    u32::from(t.as_raw_mode())
}

/// No fanotify here: `EOPNOTSUPP` (the watch cannot start).
pub fn fanotify_init_dfid_name() -> Result<OwnedFd, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No fanotify here: `EOPNOTSUPP`.
pub fn fanotify_mark(
    _group: BorrowedFd<'_>,
    _kind: FanMark,
    _mask: u64,
    _path: &Path,
) -> Result<(), Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No fanotify here: `EOPNOTSUPP`.
pub fn fanotify_read(
    _group: BorrowedFd<'_>,
    _buf: &mut [u8],
    _out: &mut Vec<FanEvent>,
) -> Result<Option<FanParseError>, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No poll wrapper here: `EOPNOTSUPP` (only fanotify, absent here, uses it).
pub fn wait_readable(_fd: BorrowedFd<'_>, _timeout: std::time::Duration) -> Result<bool, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No `open_by_handle_at` here: `EOPNOTSUPP`.
pub fn open_by_handle(
    _mount: BorrowedFd<'_>,
    _handle: &FileHandle,
    _flags: OFlags,
) -> Result<OwnedFd, Errno> {
    Err(Errno::OPNOTSUPP)
}

/// No `/proc` here: `EOPNOTSUPP`.
pub fn fd_path(_fd: BorrowedFd<'_>) -> Result<std::path::PathBuf, Errno> {
    Err(Errno::OPNOTSUPP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fd::AsFd;
    use std::fs;

    fn dir() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a/b")).unwrap();
        fs::write(t.path().join("a/b/f"), b"data").unwrap();
        std::os::unix::fs::symlink("a", t.path().join("link")).unwrap();
        std::os::unix::fs::symlink("b/f", t.path().join("a/flink")).unwrap();
        let fd = rfs::open(t.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (t, fd)
    }

    #[test]
    fn open_beneath_follows_no_link_and_never_leaves() {
        let (_t, root) = dir();
        let r = root.as_fd();
        let f = open_beneath(r, "a/b/f", OFlags::RDONLY, Mode::empty()).unwrap();
        assert_eq!(fstat(&f).unwrap().st_size, 4);
        let d = open_beneath(
            r,
            "./a//b/",
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        );
        assert!(d.is_ok());
        let top = open_beneath(r, "", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert_eq!(fstat(&top).unwrap().st_ino, fstat(r).unwrap().st_ino);
        // A link on the way, or at the end, is refused.
        for p in ["link/b/f", "a/flink"] {
            let e = open_beneath(r, p, OFlags::RDONLY, Mode::empty()).unwrap_err();
            assert!(matches!(e, Errno::LOOP | Errno::NOTDIR), "{p}: {e:?}");
        }
        // Up and out, or absolute: refused as openat2 refuses them.
        for p in ["../x", "a/../a/b/f", "/etc/passwd"] {
            let e = open_beneath(r, p, OFlags::RDONLY, Mode::empty()).unwrap_err();
            assert_eq!(e, Errno::XDEV, "{p}");
        }
        // Creating a file beneath works, and not through a link.
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
        open_beneath(r, "a/b/new", flags, Mode::RUSR).unwrap();
        assert!(open_beneath(r, "link/b/new2", flags, Mode::RUSR).is_err());
        assert!(!_t.path().join("a/b/new2").exists());
    }

    #[test]
    fn clone_and_kernel_features_answer_not_here() {
        let (t, root) = dir();
        let src = rfs::open(t.path().join("a/b/f"), OFlags::RDONLY, Mode::empty()).unwrap();
        let dst = rfs::open(
            t.path().join("a/b/g"),
            OFlags::RDWR | OFlags::CREATE,
            Mode::RUSR | Mode::WUSR,
        )
        .unwrap();
        assert_eq!(ficlone(dst.as_fd(), src.as_fd()), Err(Errno::OPNOTSUPP));
        assert_eq!(
            ficlonerange(dst.as_fd(), src.as_fd(), 0, 0, 0),
            Err(Errno::OPNOTSUPP)
        );
        let dests = [(dst.as_fd(), 0)];
        assert_eq!(
            fideduperange(src.as_fd(), 0, 4, &dests),
            Err(Errno::OPNOTSUPP)
        );
        assert_eq!(
            fiemap(src.as_fd(), 0, 4, 0, &mut Vec::new()),
            Err(Errno::OPNOTSUPP)
        );
        assert_eq!(btrfs_root_id(src.as_fd()), Err(Errno::NOTTY));
        let tmp = open_unnamed(root.as_fd(), Path::new("."), OFlags::RDWR, Mode::RUSR);
        assert_eq!(tmp.err(), Some(Errno::OPNOTSUPP));
        let (mut a, mut b) = (0, 0);
        assert_eq!(
            copy_file_range(src.as_fd(), &mut a, dst.as_fd(), &mut b, 4),
            Err(Errno::NOSYS)
        );
        assert!(CLONE_UNAVAILABLE.is_some());
        // No magic: the core calls the kind unknown. The block size is real.
        let s = fs_stat(src.as_fd()).unwrap();
        assert_eq!(s.magic, None);
        assert!(s.block_size >= 512, "{s:?}");
        assert!(mount_table().is_err());
    }

    #[test]
    fn stat_keeps_linux_field_types_and_values() {
        let (t, _root) = dir();
        let p = t.path().join("a/b/f");
        let ours = stat(&p).unwrap();
        let theirs = rfs::stat(&p).unwrap();
        assert_eq!(ours.st_dev, theirs.st_dev);
        assert_eq!(ours.st_ino, theirs.st_ino);
        assert_eq!(ours.st_mode, theirs.st_mode);
        assert_eq!(ours.st_size, 4);
        assert_eq!(ours.st_mtime, theirs.st_mtime);
        assert_eq!(ours.st_mtime_nsec, theirs.st_mtime_nsec);
        assert_eq!(file_type(ours.st_mode), rfs::FileType::RegularFile);
        assert_eq!(raw_mode(0o100644), Mode::from_raw_mode(0o644));
        let link = lstat(t.path().join("link")).unwrap();
        assert_eq!(file_type(link.st_mode), rfs::FileType::Symlink);
    }

    #[test]
    fn processes_are_found_by_signal_zero() {
        assert!(process_exists(std::process::id()));
        assert!(!process_exists(i32::MAX as u32));
        assert!(!process_exists(u32::MAX));
    }
}
