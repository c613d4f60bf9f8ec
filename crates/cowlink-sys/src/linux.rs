//! The Linux platform: the kernel's ioctls (clone, dedupe, FIEMAP, the
//! Btrfs backreference look-ups, loop devices), OFD locks, and the typed
//! wrappers over the rustix calls only Linux has (`O_TMPFILE`,
//! `copy_file_range`, `fallocate` modes, `openat2`, `syncfs`, inode flags,
//! xattrs as Linux names them, `/proc`).
//!
//! Each ioctl wrapper wraps exactly one ioctl, takes borrowed file
//! descriptors, and returns the kernel's answer as a
//! [`rustix::io::Errno`] on failure; it never decides what an error
//! *means*.
//!
//! The ioctl numbers come from `linux-raw-sys` (generated from the kernel
//! UAPI headers). The FIEMAP structs are declared here because
//! `linux-raw-sys` does not export `linux/fiemap.h`; their layout is checked
//! against the kernel's by the size assertions below.

use linux_raw_sys::general::{file_clone_range, file_dedupe_range, file_dedupe_range_info};
use rustix::fd::{AsRawFd, BorrowedFd};
use rustix::io::Errno;

use crate::fanotify::*;
use crate::types::*;
use rustix::ioctl::{ioctl, Opcode, Updater};

const FICLONERANGE: Opcode = linux_raw_sys::ioctl::FICLONERANGE as Opcode;
const FIDEDUPERANGE: Opcode = linux_raw_sys::ioctl::FIDEDUPERANGE as Opcode;
const FS_IOC_FIEMAP: Opcode = linux_raw_sys::ioctl::FS_IOC_FIEMAP as Opcode;

/// `ioctl(dst, FICLONE, src)`: make all of `dst` share the blocks of `src`.
///
/// `dst` must be open for writing and `src` for reading. The kernel replaces
/// `dst`'s contents and size with `src`'s. Errors are the kernel's:
/// `EXDEV` (different filesystems), `EOPNOTSUPP` (no reflink support),
/// `EINVAL`, `EISDIR`, `EBADF`, `ENOSPC`, `EPERM`, `ETXTBSY`, ...
///
/// See `ioctl_ficlone(2)`.
pub fn ficlone(dst: BorrowedFd<'_>, src: BorrowedFd<'_>) -> Result<(), Errno> {
    rustix::fs::ioctl_ficlone(dst, src)
}

/// `ioctl(dst, FICLONERANGE, {src, src_offset, len, dst_offset})`: make
/// `len` bytes of `dst` at `dst_offset` share the blocks of `src` at
/// `src_offset`.
///
/// `len == 0` means "to the end of `src`". Offsets must be multiples of the
/// filesystem block size, and so must `len` unless the range ends at the end
/// of `src`; otherwise the kernel answers `EINVAL`.
///
/// See `ioctl_ficlonerange(2)`.
pub fn ficlonerange(
    dst: BorrowedFd<'_>,
    src: BorrowedFd<'_>,
    src_offset: u64,
    len: u64,
    dst_offset: u64,
) -> Result<(), Errno> {
    let mut arg = file_clone_range {
        src_fd: i64::from(src.as_raw_fd()),
        src_offset,
        src_length: len,
        dest_offset: dst_offset,
    };
    // SAFETY: FICLONERANGE is `_IOW(0x94, 13, struct file_clone_range)`; the
    // kernel reads exactly one `file_clone_range`, which `arg` is, and it
    // lives for the duration of the call.
    unsafe {
        ioctl(
            dst,
            Updater::<FICLONERANGE, file_clone_range>::new(&mut arg),
        )
    }
}

#[repr(C)]
struct DedupeBuf {
    hdr: file_dedupe_range,
    info: [file_dedupe_range_info; DEDUPE_MAX_DESTS],
}

/// `ioctl(src, FIDEDUPERANGE, ...)`: for each `(fd, offset)` destination,
/// share `len` bytes of `src` at `src_offset` if, and only if, the kernel
/// finds them byte-for-byte identical under lock.
///
/// At most [`DEDUPE_MAX_DESTS`] destinations per call (`EINVAL` otherwise,
/// without calling the kernel). The kernel clamps `len` (to 1 GiB on current
/// kernels). Returns one result per destination, in order.
///
/// See `ioctl_fideduperange(2)`.
pub fn fideduperange(
    src: BorrowedFd<'_>,
    src_offset: u64,
    len: u64,
    dests: &[(BorrowedFd<'_>, u64)],
) -> Result<Vec<DedupeResult>, Errno> {
    if dests.len() > DEDUPE_MAX_DESTS {
        return Err(Errno::INVAL);
    }
    let zero_info = file_dedupe_range_info {
        dest_fd: 0,
        dest_offset: 0,
        bytes_deduped: 0,
        status: 0,
        reserved: 0,
    };
    let mut buf = Box::new(DedupeBuf {
        hdr: file_dedupe_range {
            src_offset,
            src_length: len,
            dest_count: dests.len() as u16,
            reserved1: 0,
            reserved2: 0,
            info: linux_raw_sys::general::__IncompleteArrayField::new(),
        },
        info: [zero_info; DEDUPE_MAX_DESTS],
    });
    for (slot, (fd, off)) in buf.info.iter_mut().zip(dests) {
        slot.dest_fd = i64::from(fd.as_raw_fd());
        slot.dest_offset = *off;
    }
    // SAFETY: FIDEDUPERANGE is `_IOWR(0x94, 54, struct file_dedupe_range)`
    // followed by `dest_count` `file_dedupe_range_info` entries. `DedupeBuf`
    // is `repr(C)`: the header (24 bytes, its trailing flexible array is
    // zero-sized) is immediately followed by the info array, which has room
    // for `dest_count` entries. The kernel writes only inside those entries.
    unsafe { ioctl(src, Updater::<FIDEDUPERANGE, DedupeBuf>::new(&mut buf))? };
    Ok(buf.info[..dests.len()]
        .iter()
        .map(|i| DedupeResult {
            status: match i.status {
                s if s < 0 => DedupeStatus::Error(Errno::from_raw_os_error(-s)),
                s if s as u32 == linux_raw_sys::general::FILE_DEDUPE_RANGE_DIFFERS => {
                    DedupeStatus::Differs
                }
                _ => DedupeStatus::Same,
            },
            bytes_deduped: i.bytes_deduped,
        })
        .collect())
}

#[repr(C)]
struct FiemapBuf<const N: usize> {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; N],
}

/// `ioctl(fd, FS_IOC_FIEMAP, ...)`: map the extents of the file range
/// `[start, start + len)` into `out`, returning how many were mapped: up
/// to [`FIEMAP_FIRST_BATCH`] while `out` is empty, else up to
/// [`FIEMAP_BATCH`]. Callers loop, starting after the last extent
/// returned, until one carries [`FIEMAP_EXTENT_LAST`] or none are returned.
///
/// `EOPNOTSUPP` means the filesystem has no FIEMAP (tmpfs, ZFS).
///
/// See the kernel's `Documentation/filesystems/fiemap.rst`.
pub fn fiemap(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    flags: u32,
    out: &mut Vec<FiemapExtent>,
) -> Result<usize, Errno> {
    if out.is_empty() {
        fiemap_n::<FIEMAP_FIRST_BATCH>(fd, start, len, flags, out)
    } else {
        fiemap_n::<FIEMAP_BATCH>(fd, start, len, flags, out)
    }
}

fn fiemap_n<const N: usize>(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    flags: u32,
    out: &mut Vec<FiemapExtent>,
) -> Result<usize, Errno> {
    let mut buf = Box::new(FiemapBuf::<N> {
        start,
        length: len,
        flags,
        mapped_extents: 0,
        extent_count: N as u32,
        reserved: 0,
        extents: [FiemapExtent::default(); N],
    });
    // SAFETY: FS_IOC_FIEMAP is `_IOWR('f', 11, struct fiemap)` followed by
    // `extent_count` `struct fiemap_extent`s. `FiemapBuf` is `repr(C)` with
    // the header fields in kernel order (32 bytes) and room for exactly
    // `extent_count` (= N) extents; the kernel writes no further.
    unsafe { ioctl(fd, Updater::<FS_IOC_FIEMAP, FiemapBuf<N>>::new(&mut buf))? };
    let n = (buf.mapped_extents as usize).min(N);
    out.extend_from_slice(&buf.extents[..n]);
    Ok(n)
}

const BTRFS_IOC_LOGICAL_INO_V2: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_LOGICAL_INO_V2 as Opcode;
const BTRFS_IOC_INO_PATHS: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_INO_PATHS as Opcode;

/// Header of the kernel's `struct btrfs_data_container`, in `u64` words.
const CONTAINER_HEADER_WORDS: usize = 2;

/// `ioctl(fd, BTRFS_IOC_LOGICAL_INO_V2, ...)`: every file reference whose
/// data covers the Btrfs logical address `logical` (FIEMAP's "physical"
/// offset on Btrfs), in any subvolume of the filesystem `fd` is on.
///
/// `size` is the answer buffer in bytes (24 per reference, plus 16); when it
/// is too small the kernel still succeeds and the second element of the
/// result says how many bytes were missing, so the caller can retry with a
/// larger buffer (up to [`BTRFS_LOGICAL_INO_MAX`]).
///
/// Needs `CAP_SYS_ADMIN` (`EPERM` otherwise); `ENOTTY` off Btrfs; `ENOENT`
/// when no extent covers the address.
pub fn btrfs_logical_ino(
    fd: BorrowedFd<'_>,
    logical: u64,
    size: usize,
) -> Result<(Vec<BtrfsRef>, u32), Errno> {
    logical_ino(fd, logical, size, 0)
}

/// `BTRFS_LOGICAL_INO_ARGS_IGNORE_OFFSET`: answer every reference to the
/// extent holding the address, whatever part of the extent it covers.
const LOGICAL_INO_IGNORE_OFFSET: u64 = 1;

/// [`btrfs_logical_ino`] with `BTRFS_LOGICAL_INO_ARGS_IGNORE_OFFSET`: every
/// file reference to *any part* of the extent that holds `logical`. An
/// extent stays allocated while any part of it is referenced, so this is
/// the list of what keeps its blocks in use. `offset` of each reference is
/// the file offset where that reference's range starts.
pub fn btrfs_extent_holders(
    fd: BorrowedFd<'_>,
    logical: u64,
    size: usize,
) -> Result<(Vec<BtrfsRef>, u32), Errno> {
    logical_ino(fd, logical, size, LOGICAL_INO_IGNORE_OFFSET)
}

fn logical_ino(
    fd: BorrowedFd<'_>,
    logical: u64,
    size: usize,
    flags: u64,
) -> Result<(Vec<BtrfsRef>, u32), Errno> {
    let size = size.clamp(CONTAINER_HEADER_WORDS * 8, BTRFS_LOGICAL_INO_MAX);
    let mut buf = vec![0u64; size / 8];
    let mut arg = linux_raw_sys::btrfs::btrfs_ioctl_logical_ino_args {
        logical,
        size: (buf.len() * 8) as u64,
        reserved: [0; 3],
        flags,
        inodes: buf.as_mut_ptr() as u64,
    };
    // SAFETY: BTRFS_IOC_LOGICAL_INO_V2 is `_IOWR(0x94, 59, struct
    // btrfs_ioctl_logical_ino_args)`. The kernel reads `arg` and writes at
    // most `arg.size` bytes to `arg.inodes`, which points at `buf`, a live
    // allocation of exactly that many bytes that is not otherwise borrowed
    // during the call.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_LOGICAL_INO_V2, linux_raw_sys::btrfs::btrfs_ioctl_logical_ino_args>::new(
                &mut arg,
            ),
        )?
    };
    let (count, missing) = container_header(&buf);
    let vals = &buf[CONTAINER_HEADER_WORDS..];
    let n = (count as usize).min(vals.len()) / 3 * 3;
    let refs = vals[..n]
        .chunks_exact(3)
        .map(|t| BtrfsRef {
            inode: t[0],
            offset: t[1],
            root: t[2],
        })
        .collect();
    Ok((refs, missing))
}

/// `(elem_cnt, bytes_missing)` of a `struct btrfs_data_container` held in
/// native-endian `u64` words: `bytes_left`, `bytes_missing` are the first
/// word's two halves, `elem_cnt`, `elem_missed` the second's.
fn container_header(buf: &[u64]) -> (u32, u32) {
    let w0 = buf[0].to_ne_bytes();
    let w1 = buf[1].to_ne_bytes();
    let missing = u32::from_ne_bytes([w0[4], w0[5], w0[6], w0[7]]);
    let count = u32::from_ne_bytes([w1[0], w1[1], w1[2], w1[3]]);
    (count, missing)
}

/// `ioctl(fd, BTRFS_IOC_INO_PATHS, ...)`: the paths (relative to the root
/// of the subvolume `fd` is in) of every hard link of inode `inode` of that
/// subvolume. The kernel answers at most 4 KiB of paths; names beyond that
/// are left out.
///
/// Needs `CAP_SYS_ADMIN` (`EPERM` otherwise); `ENOTTY` off Btrfs.
pub fn btrfs_ino_paths(fd: BorrowedFd<'_>, inode: u64) -> Result<Vec<Vec<u8>>, Errno> {
    let mut buf = vec![0u64; 4096 / 8];
    let mut arg = linux_raw_sys::btrfs::btrfs_ioctl_ino_path_args {
        inum: inode,
        size: (buf.len() * 8) as u64,
        reserved: [0; 4],
        fspath: buf.as_mut_ptr() as u64,
    };
    // SAFETY: BTRFS_IOC_INO_PATHS is `_IOWR(0x94, 35, struct
    // btrfs_ioctl_ino_path_args)`. The kernel writes at most `arg.size`
    // bytes to `arg.fspath`, which points at `buf`, a live allocation of
    // exactly that size not otherwise borrowed during the call.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_INO_PATHS, linux_raw_sys::btrfs::btrfs_ioctl_ino_path_args>::new(
                &mut arg,
            ),
        )?
    };
    let (count, _) = container_header(&buf);
    // The answer as bytes: `val[i]` is the offset of path i's NUL-terminated
    // string, counted from the start of `val`.
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let val = &bytes[CONTAINER_HEADER_WORDS * 8..];
    let vals = &buf[CONTAINER_HEADER_WORDS..];
    let mut paths = Vec::new();
    for &off in vals.iter().take(count as usize) {
        let Some(rest) = val.get(off as usize..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        paths.push(rest[..end].to_vec());
    }
    Ok(paths)
}

const BTRFS_IOC_SPACE_INFO: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_SPACE_INFO as Opcode;

/// `BTRFS_SPACE_INFO_GLOBAL_RSV`: the global reserve's entry, space held
/// back for the filesystem's own use rather than used.
const SPACE_INFO_GLOBAL_RSV: u64 = 1 << 49;

/// Room for this many space kinds in one answer; Btrfs has at most one per
/// block group type and profile in use (data, metadata, system, mixed,
/// each in one profile unless a conversion is under way), plus the global
/// reserve.
const SPACE_SLOTS: usize = 32;

/// `struct btrfs_ioctl_space_args` followed by room for [`SPACE_SLOTS`]
/// `struct btrfs_ioctl_space_info`.
#[repr(C)]
struct SpaceBuf {
    space_slots: u64,
    total_spaces: u64,
    spaces: [linux_raw_sys::btrfs::btrfs_ioctl_space_info; SPACE_SLOTS],
}

/// `ioctl(fd, BTRFS_IOC_SPACE_INFO, ...)`: the bytes the Btrfs filesystem
/// `fd` is on uses for data, metadata and system (their `used_bytes`,
/// before the profile's copies; the global reserve left out). Unlike
/// statfs, which follows data alone, it grows when metadata does.
/// Unprivileged.
///
/// `ENOTTY` off Btrfs; `EOVERFLOW` if the filesystem has more kinds of
/// space than one answer holds.
pub fn btrfs_space_used(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut buf = Box::new(SpaceBuf {
        space_slots: SPACE_SLOTS as u64,
        total_spaces: 0,
        spaces: [linux_raw_sys::btrfs::btrfs_ioctl_space_info {
            flags: 0,
            total_bytes: 0,
            used_bytes: 0,
        }; SPACE_SLOTS],
    });
    // SAFETY: BTRFS_IOC_SPACE_INFO is `_IOWR(0x94, 20, struct
    // btrfs_ioctl_space_args)` followed by `space_slots` `struct
    // btrfs_ioctl_space_info`. `SpaceBuf` is `repr(C)`: the two header
    // words in kernel order, then room for exactly `space_slots` entries;
    // the kernel writes no further.
    unsafe { ioctl(fd, Updater::<BTRFS_IOC_SPACE_INFO, SpaceBuf>::new(&mut buf))? };
    if buf.total_spaces > SPACE_SLOTS as u64 {
        return Err(Errno::OVERFLOW);
    }
    Ok(buf.spaces[..buf.total_spaces as usize]
        .iter()
        .filter(|s| s.flags & SPACE_INFO_GLOBAL_RSV == 0)
        .map(|s| s.used_bytes)
        .sum())
}

const BTRFS_IOC_FS_INFO: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_FS_INFO as Opcode;

/// `ioctl(fd, BTRFS_IOC_FS_INFO, ...)`: the UUID of the Btrfs filesystem
/// `fd` is on. Every subvolume has a device number of its own; this names
/// the filesystem they share. Unprivileged.
///
/// `ENOTTY` off Btrfs.
pub fn btrfs_fsid(fd: BorrowedFd<'_>) -> Result<[u8; 16], Errno> {
    // SAFETY: the struct is plain integers and byte arrays: all zeros is
    // a valid value (and what the kernel expects of `flags` here).
    let mut arg: Box<linux_raw_sys::btrfs::btrfs_ioctl_fs_info_args> =
        Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: BTRFS_IOC_FS_INFO is `_IOR(0x94, 31, struct
    // btrfs_ioctl_fs_info_args)` (the kernel also reads its `flags`);
    // `arg` is exactly that struct and lives for the duration of the call.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_FS_INFO, linux_raw_sys::btrfs::btrfs_ioctl_fs_info_args>::new(
                &mut arg,
            ),
        )?
    };
    Ok(arg.fsid)
}

const BTRFS_IOC_GET_SUBVOL_INFO: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_GET_SUBVOL_INFO as Opcode;

/// The UUID of the Btrfs subvolume `fd` is in (`BTRFS_IOC_GET_SUBVOL_INFO`,
/// unprivileged): its own for ever, where its id is given to a new
/// subvolume once it is deleted and the filesystem mounted again.
///
/// `ENOTTY` off Btrfs (or before Linux 4.18).
pub fn btrfs_subvol_uuid(fd: BorrowedFd<'_>) -> Result<[u8; 16], Errno> {
    // SAFETY: the struct is plain integers and arrays: all zeroes is a
    // valid value.
    let mut arg: Box<linux_raw_sys::btrfs::btrfs_ioctl_get_subvol_info_args> =
        Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: BTRFS_IOC_GET_SUBVOL_INFO is `_IOR(0x94, 60, struct
    // btrfs_ioctl_get_subvol_info_args)`: the kernel writes that struct,
    // which `arg` is, and it lives for the duration of the call.
    unsafe {
        ioctl(
            fd,
            Updater::<
                BTRFS_IOC_GET_SUBVOL_INFO,
                linux_raw_sys::btrfs::btrfs_ioctl_get_subvol_info_args,
            >::new(&mut arg),
        )?
    };
    Ok(arg.uuid)
}

const BTRFS_IOC_INO_LOOKUP: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_INO_LOOKUP as Opcode;

/// `ioctl(fd, BTRFS_IOC_INO_LOOKUP, {treeid: 0, objectid: 256})`: the id
/// of the Btrfs subvolume (tree) that `fd` is in. Unprivileged.
///
/// `ENOTTY` off Btrfs.
pub fn btrfs_root_id(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut arg = Box::new(linux_raw_sys::btrfs::btrfs_ioctl_ino_lookup_args {
        treeid: 0,
        // BTRFS_FIRST_FREE_OBJECTID: the root directory of every subvolume.
        objectid: 256,
        name: [0; 4080],
    });
    // SAFETY: BTRFS_IOC_INO_LOOKUP is `_IOWR(0x94, 18, struct
    // btrfs_ioctl_ino_lookup_args)`; `arg` is exactly that struct (4096
    // bytes, checked below) and lives for the duration of the call.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_INO_LOOKUP, linux_raw_sys::btrfs::btrfs_ioctl_ino_lookup_args>::new(
                &mut arg,
            ),
        )?
    };
    Ok(arg.treeid)
}

/// `FS_IOC_GETFSUUID`: `_IOR(0x15, 0, struct fsuuid2)` (not in
/// `linux-raw-sys`'s ioctl list).
const FS_IOC_GETFSUUID: Opcode =
    rustix::ioctl::opcode::read::<linux_raw_sys::general::fsuuid2>(0x15, 0);

/// `ioctl(fd, FS_IOC_GETFSUUID)`: the UUID of the filesystem `fd` is on
/// (kernel 6.5 and later; XFS, ext4, Btrfs and others). Unprivileged.
/// Every Btrfs subvolume answers its filesystem's UUID.
///
/// `ENOTTY` where the kernel or the filesystem has none to give.
pub fn fs_uuid(fd: BorrowedFd<'_>) -> Result<Vec<u8>, Errno> {
    // SAFETY: FS_IOC_GETFSUUID reads into exactly one `struct fsuuid2`
    // (17 bytes, no padding), which the Getter provides.
    let got = unsafe {
        ioctl(
            fd,
            rustix::ioctl::Getter::<FS_IOC_GETFSUUID, linux_raw_sys::general::fsuuid2>::new(),
        )?
    };
    let len = usize::from(got.len).min(got.uuid.len());
    Ok(got.uuid[..len].to_vec())
}

/// `statx(dir, name)` without following a symbolic link: [`FileId`],
/// the birth time included where the filesystem records one (XFS, Btrfs,
/// ext4 do), in the one call the walk makes per entry anyway.
pub fn file_id_at<P: rustix::path::Arg>(dir: BorrowedFd<'_>, name: P) -> Result<FileId, Errno> {
    file_id_with(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
}

/// [`file_id_at`] of the open file `fd` itself (`AT_EMPTY_PATH`).
pub fn file_id(fd: BorrowedFd<'_>) -> Result<FileId, Errno> {
    file_id_with(fd, c"", rustix::fs::AtFlags::EMPTY_PATH)
}

fn file_id_with<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
    flags: rustix::fs::AtFlags,
) -> Result<FileId, Errno> {
    use rustix::fs::StatxFlags;
    let want = StatxFlags::TYPE
        | StatxFlags::MODE
        | StatxFlags::UID
        | StatxFlags::INO
        | StatxFlags::SIZE
        | StatxFlags::BLOCKS
        | StatxFlags::MTIME
        | StatxFlags::CTIME
        | StatxFlags::BTIME;
    let x = rustix::fs::statx(dir, name, flags, want)?;
    let t = |s: rustix::fs::StatxTimestamp| time_ns(s.tv_sec, u64::from(s.tv_nsec));
    let has = |f: StatxFlags| x.stx_mask & f.bits() != 0;
    Ok(FileId {
        dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
        ino: x.stx_ino,
        mode: u32::from(x.stx_mode),
        uid: x.stx_uid,
        size: x.stx_size,
        blocks: x.stx_blocks,
        mtime_ns: t(x.stx_mtime),
        ctime_ns: t(x.stx_ctime),
        btime_ns: has(StatxFlags::BTIME).then(|| t(x.stx_btime)),
    })
}

const BTRFS_IOC_TREE_SEARCH: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_TREE_SEARCH as Opcode;
/// `BTRFS_EXTENT_DATA_KEY`: the item type of a file extent.
const BTRFS_EXTENT_DATA_KEY: u32 = 108;

/// The `N` bytes of `b` from `at` (the caller checked the length).
fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut v = [0u8; N];
    v.copy_from_slice(&b[at..at + N]);
    v
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes(b, at))
}

/// `ioctl(fd, BTRFS_IOC_TREE_SEARCH, ...)` over the file extent items of
/// inode `inode` in the subvolume `fd` is in: every `EXTENT_DATA` item, in
/// file order. This is how `compsize` learns the on-disk (compressed) size
/// of an extent, which FIEMAP does not report.
///
/// `EPERM` without `CAP_SYS_ADMIN`; `ENOTTY` off Btrfs.
pub fn btrfs_file_extents(fd: BorrowedFd<'_>, inode: u64) -> Result<Vec<BtrfsFileExtent>, Errno> {
    let mut out = Vec::new();
    let mut from = 0u64;
    loop {
        match search_file_extents(fd, inode, from, 4096, &mut out)? {
            Some(last) if last < u64::MAX => from = last + 1,
            _ => return Ok(out),
        }
    }
}

/// The first file extent item of inode `inode` (the one at the lowest file
/// offset), in one tree search: enough to tell a Btrfs file whose data is
/// inline in its metadata (the only item, [`BtrfsFileExtent::kind`] 0)
/// without opening it. `fd` is any descriptor in the same subvolume, such
/// as the directory holding the file. `None` when the inode has no file
/// extent items (empty, or only a hole).
///
/// `EPERM` without `CAP_SYS_ADMIN`; `ENOTTY` off Btrfs.
pub fn btrfs_first_file_extent(
    fd: BorrowedFd<'_>,
    inode: u64,
) -> Result<Option<BtrfsFileExtent>, Errno> {
    let mut out = Vec::with_capacity(1);
    search_file_extents(fd, inode, 0, 1, &mut out)?;
    Ok(out.into_iter().next())
}

/// The first `max` file extent items of inode `inode` (at most 16), in
/// file order, in one tree search: the first tells a file whose data is
/// inline, and a second says it is not the only item (an extent
/// preallocated past the end, say). `fd` is any descriptor in the same
/// subvolume. Empty when the inode has no file extent items.
///
/// `EPERM` without `CAP_SYS_ADMIN`; `ENOTTY` off Btrfs.
pub fn btrfs_leading_file_extents(
    fd: BorrowedFd<'_>,
    inode: u64,
    max: u32,
) -> Result<Vec<BtrfsFileExtent>, Errno> {
    let max = max.min(16);
    let mut out = Vec::with_capacity(max as usize);
    search_file_extents(fd, inode, 0, max, &mut out)?;
    out.truncate(max as usize);
    Ok(out)
}

const BTRFS_IOC_START_SYNC: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_START_SYNC as Opcode;
const BTRFS_IOC_WAIT_SYNC: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_WAIT_SYNC as Opcode;
/// `BTRFS_INODE_ITEM_KEY`: the item type of an inode.
const BTRFS_INODE_ITEM_KEY: u32 = 1;

/// `BTRFS_IOC_START_SYNC` then `BTRFS_IOC_WAIT_SYNC` on the filesystem
/// `fd` is on: the running transaction, if any, is committed, and its id
/// returned (with none running, the last committed one). After it, every
/// change made before the call is in the trees a tree search reads (an
/// inode's update is held back in memory until a commit), and every
/// change made after it belongs to a later transaction.
///
/// `ENOTTY` off Btrfs.
pub fn btrfs_commit(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    // SAFETY: BTRFS_IOC_START_SYNC is `_IOR(0x94, 24, __u64)`: the kernel
    // writes one u64, which the Getter provides.
    let transid = unsafe {
        ioctl(
            fd,
            rustix::ioctl::Getter::<BTRFS_IOC_START_SYNC, u64>::new(),
        )?
    };
    // SAFETY: BTRFS_IOC_WAIT_SYNC is `_IOW(0x94, 22, __u64)`: the kernel
    // reads one u64 from the pointer, which lives for the call.
    unsafe {
        ioctl(
            fd,
            rustix::ioctl::Setter::<BTRFS_IOC_WAIT_SYNC, u64>::new(transid),
        )?
    };
    Ok(transid)
}

/// The transaction that last wrote the data relocation tree of the Btrfs
/// filesystem `fd` is on (the root item of tree -9, which only a
/// relocation writes: a balance, a device removed, a shrink, finished or
/// cancelled). Before a transaction `t`, no extent of any file moved
/// after `t` without its inode item being written.
///
/// `EPERM` without `CAP_SYS_ADMIN`; `ENOTTY` off Btrfs; `ENOENT` where
/// the tree has no root item.
pub fn btrfs_relocated_at(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    const HEADER: usize = std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_header>();
    // `BTRFS_DATA_RELOC_TREE_OBJECTID` (-9) and `BTRFS_ROOT_ITEM_KEY`.
    const DATA_RELOC: u64 = u64::MAX - 8;
    const ROOT_ITEM: u32 = 132;
    let (n, buf) = tree_search(
        fd,
        1,
        (DATA_RELOC, ROOT_ITEM, 0),
        (DATA_RELOC, ROOT_ITEM, u64::MAX),
        0,
        16,
    )?;
    let mut at = 0;
    let mut latest = None;
    for _ in 0..n {
        if at + HEADER > buf.len() {
            break;
        }
        let h = &buf[at..at + HEADER];
        let typ = u32::from_ne_bytes(bytes(h, 24));
        let len = u32::from_ne_bytes(bytes(h, 28)) as usize;
        let item = buf.get(at + HEADER..at + HEADER + len).unwrap_or(&[]);
        at += HEADER + len;
        // struct btrfs_root_item: an inode item (160 bytes), then the
        // tree's generation.
        if typ == ROOT_ITEM && item.len() >= 168 {
            latest = latest.max(Some(le64(item, 160)));
        }
    }
    latest.ok_or(Errno::NOENT)
}

/// The inodes numbered `lo..=hi` in the subvolume `fd` is in whose inode
/// item a transaction after `since` wrote, from their inode items; `dev`
/// is put in each [`FileId`]. An inode left out was not changed since
/// `since`: no write, truncation, clone, dedupe, defragment, change of
/// owner, mode, links or times (an access time included), as each of
/// those writes the inode item in the transaction it belongs to.
/// Changes not yet committed are not seen: call [`btrfs_commit`] first.
/// Nor are changes whose data is not written back yet: a write waits for
/// its write-back to record the new size, and one in the same clock tick
/// as the last leaves the times alone; `syncfs` before the commit.
///
/// One tree search per 4 KiB of results; leaves no transaction after
/// `since` wrote are skipped whole, so a range nothing changed in costs
/// one call. Also returned: how many items (of any type) the kernel
/// copied, those of leaves a later transaction wrote for another item's
/// sake included. `Ok(None)` when more than `max_items` came back: the
/// caller's range was too wide to be worth it.
///
/// A balance (relocation) rewrites file extent items, and the leaves
/// holding them, to move their extents, but no inode item: an inode with
/// a file extent item in a leaf written after `since` is listed too,
/// without an identity (`id: None`), as its layout may have moved.
///
/// `EPERM` without `CAP_SYS_ADMIN`; `ENOTTY` off Btrfs.
pub fn btrfs_inodes_changed_since(
    fd: BorrowedFd<'_>,
    dev: u64,
    lo: u64,
    hi: u64,
    since: u64,
    max_items: usize,
) -> Result<Option<(Vec<BtrfsChanged>, usize)>, Errno> {
    const HEADER: usize = std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_header>();
    let mut out = Vec::new();
    // Inodes with a file extent item in a leaf written since.
    let mut extents = std::collections::BTreeSet::new();
    let mut seen = 0usize;
    // The next key to search from: (objectid, type, offset).
    let mut from = (lo, 0u32, 0u64);
    let done = |mut out: Vec<BtrfsChanged>, extents: std::collections::BTreeSet<u64>| {
        let listed: std::collections::HashSet<u64> = out.iter().map(|c| c.ino).collect();
        out.extend(
            extents
                .into_iter()
                .filter(|i| !listed.contains(i))
                .map(|ino| BtrfsChanged {
                    transid: 0,
                    id: None,
                    ino,
                }),
        );
        out
    };
    loop {
        let (n, buf) = tree_search(
            fd,
            0,
            (from.0, from.1, from.2),
            (hi, 255, u64::MAX),
            since.saturating_add(1),
            u32::MAX,
        )?;
        if n == 0 {
            return Ok(Some((done(out, extents), seen)));
        }
        seen += n;
        if seen > max_items {
            return Ok(None);
        }
        let mut at = 0;
        let mut last = from;
        for _ in 0..n {
            if at + HEADER > buf.len() {
                break;
            }
            // btrfs_ioctl_search_header: transid, objectid, offset (u64),
            // type, len (u32), in host order.
            let h = &buf[at..at + HEADER];
            let objectid = u64::from_ne_bytes(bytes(h, 8));
            let offset = u64::from_ne_bytes(bytes(h, 16));
            let typ = u32::from_ne_bytes(bytes(h, 24));
            let len = u32::from_ne_bytes(bytes(h, 28)) as usize;
            let item = buf.get(at + HEADER..at + HEADER + len).unwrap_or(&[]);
            at += HEADER + len;
            last = (objectid, typ, offset);
            // struct btrfs_inode_item (little endian, packed, 160
            // bytes): generation 0, transid 8, size 16, nbytes 24,
            // block_group 32, nlink 40, uid 44, gid 48, mode 52, rdev
            // 56, flags 64, sequence 72, reserved 80, then the times
            // (u64 seconds, u32 nanoseconds): atime 112, ctime 124,
            // mtime 136, otime 148.
            if typ == BTRFS_EXTENT_DATA_KEY && objectid >= lo {
                extents.insert(objectid);
            }
            if typ != BTRFS_INODE_ITEM_KEY || item.len() < 160 || objectid < lo {
                continue;
            }
            let transid = le64(item, 8);
            if transid <= since {
                continue;
            }
            let le32 = |at: usize| u32::from_le_bytes(bytes(item, at));
            let t = |at: usize| time_ns(le64(item, at) as i64, u64::from(le32(at + 8)));
            out.push(BtrfsChanged {
                transid,
                ino: objectid,
                id: Some(FileId {
                    dev,
                    ino: objectid,
                    mode: le32(52),
                    uid: le32(44),
                    size: le64(item, 16),
                    blocks: le64(item, 24) / 512,
                    mtime_ns: t(136),
                    ctime_ns: t(124),
                    btime_ns: Some(t(148)),
                }),
            });
        }
        // Past the last key returned.
        from = match last {
            (o, t, off) if off < u64::MAX => (o, t, off + 1),
            (o, t, _) if t < 255 => (o, t + 1, 0),
            (o, _, _) if o < hi => (o + 1, 0, 0),
            _ => return Ok(Some((done(out, extents), seen))),
        };
    }
}

/// One `BTRFS_IOC_TREE_SEARCH` call over tree `tree` (0: the subvolume
/// `fd` is in) for the items from key `min` to key `max` (object id,
/// type, offset; compared as one key, so every type between two object
/// ids is in range) in leaves written at or after transaction
/// `min_transid`, at most `nr` of them and as many as fit in 3,992
/// bytes: how many came, and the bytes (each a 32-byte
/// `btrfs_ioctl_search_header` in host order, then the item).
fn tree_search(
    fd: BorrowedFd<'_>,
    tree: u64,
    min: (u64, u32, u64),
    max: (u64, u32, u64),
    min_transid: u64,
    nr: u32,
) -> Result<(usize, [u8; 3992]), Errno> {
    use linux_raw_sys::btrfs::{btrfs_ioctl_search_args, btrfs_ioctl_search_key};
    // On the stack: the walk makes one call per small Btrfs file.
    let mut arg = btrfs_ioctl_search_args {
        key: btrfs_ioctl_search_key {
            tree_id: tree,
            min_objectid: min.0,
            max_objectid: max.0,
            min_offset: min.2,
            max_offset: max.2,
            min_transid,
            max_transid: u64::MAX,
            min_type: min.1,
            max_type: max.1,
            nr_items: nr,
            unused: 0,
            unused1: 0,
            unused2: 0,
            unused3: 0,
            unused4: 0,
        },
        buf: [0; 3992],
    };
    // SAFETY: BTRFS_IOC_TREE_SEARCH is `_IOWR(0x94, 17, struct
    // btrfs_ioctl_search_args)`; `arg` is exactly that struct (4096
    // bytes, checked below) and lives for the duration of the call. The
    // kernel writes at most `buf`'s length of results into `buf`.
    unsafe {
        ioctl(
            fd,
            Updater::<BTRFS_IOC_TREE_SEARCH, btrfs_ioctl_search_args>::new(&mut arg),
        )?
    };
    Ok((arg.key.nr_items as usize, arg.buf.map(|c| c as u8)))
}

/// One `BTRFS_IOC_TREE_SEARCH` call for at most `max_items` of inode
/// `inode`'s file extent items from file offset `from`, appended to `out`.
/// Returns the key offset of the last item the kernel returned, or `None`
/// when it returned none (nothing more to read).
fn search_file_extents(
    fd: BorrowedFd<'_>,
    inode: u64,
    from: u64,
    max_items: u32,
    out: &mut Vec<BtrfsFileExtent>,
) -> Result<Option<u64>, Errno> {
    const HEADER: usize = std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_header>();
    let (n, buf) = tree_search(
        fd,
        0,
        (inode, BTRFS_EXTENT_DATA_KEY, from),
        (inode, BTRFS_EXTENT_DATA_KEY, u64::MAX),
        0,
        max_items,
    )?;
    if n == 0 {
        return Ok(None);
    }
    let mut at = 0;
    let mut last = from;
    for _ in 0..n {
        if at + HEADER > buf.len() {
            break;
        }
        // btrfs_ioctl_search_header: transid, objectid, offset (u64),
        // type, len (u32), in host order.
        let h = &buf[at..at + HEADER];
        let offset = u64::from_ne_bytes(bytes(h, 16));
        let typ = u32::from_ne_bytes(bytes(h, 24));
        let len = u32::from_ne_bytes(bytes(h, 28)) as usize;
        let item = buf.get(at + HEADER..at + HEADER + len).unwrap_or(&[]);
        at += HEADER + len;
        last = offset;
        // struct btrfs_file_extent_item (little endian, packed):
        // generation 0, ram_bytes 8, compression 16, encryption 17,
        // other_encoding 18, type 20; then, for regular and
        // preallocated extents, disk_bytenr 21, disk_num_bytes 29,
        // offset 37, num_bytes 45 (53 bytes).
        if typ != BTRFS_EXTENT_DATA_KEY || item.len() < 21 {
            continue;
        }
        let kind = item[20];
        let full = item.len() >= 53 && kind != 0;
        out.push(BtrfsFileExtent {
            file_offset: offset,
            kind,
            compression: item[16],
            ram_bytes: le64(item, 8),
            disk_bytenr: if full { le64(item, 21) } else { 0 },
            disk_num_bytes: if full { le64(item, 29) } else { 0 },
            offset: if full { le64(item, 37) } else { 0 },
            num_bytes: if full { le64(item, 45) } else { le64(item, 8) },
        });
    }
    Ok(Some(last))
}

// Layout checks against the kernel UAPI (linux/fiemap.h, linux/fs.h).
const _: () = assert!(std::mem::size_of::<FiemapExtent>() == 56);
const _: () = assert!(std::mem::size_of::<FiemapBuf<FIEMAP_BATCH>>() == 32 + 56 * FIEMAP_BATCH);
const _: () =
    assert!(std::mem::size_of::<FiemapBuf<FIEMAP_FIRST_BATCH>>() == 32 + 56 * FIEMAP_FIRST_BATCH);
const _: () = assert!(std::mem::size_of::<file_dedupe_range>() == 24);
const _: () = assert!(std::mem::size_of::<file_dedupe_range_info>() == 32);
const _: () = assert!(
    DEDUPE_MAX_DESTS
        == (4096 - std::mem::size_of::<file_dedupe_range>())
            / std::mem::size_of::<file_dedupe_range_info>()
);
const _: () =
    assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_logical_ino_args>() == 56);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_ino_path_args>() == 56);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_data_container>() == 16);
const _: () =
    assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_ino_lookup_args>() == 4096);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_args>() == 4096);
const _: () =
    assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_fs_info_args>() == 1024);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::general::fsuuid2>() == 17);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_header>() == 32);

/// `fcntl(fd, F_OFD_GETLK)` for a write lock over the whole file: the type
/// of a conflicting lock another open file description holds (`F_RDLCK` or
/// `F_WRLCK` as `Some`), or `None` when nothing would conflict. Works on a
/// descriptor open for reading only, unlike taking a lock. QEMU marks the
/// disk images it has open with shared locks on a few bytes, so any lock
/// found means "in use".
pub fn ofd_lock_held(fd: BorrowedFd<'_>) -> Result<Option<i16>, Errno> {
    let mut lk = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: F_OFD_GETLK reads and writes exactly one `struct flock`,
    // which `lk` is, initialised, with l_pid 0 as OFD locks require; `fd`
    // is a live descriptor for the duration of the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut lk) };
    if r < 0 {
        return Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    Ok((lk.l_type != libc::F_UNLCK as i16).then_some(lk.l_type))
}

/// `fcntl(fd, F_OFD_GETLK)` for a write lock over `len` bytes at `start`:
/// the type of a lock another open file description holds there
/// (`F_RDLCK` or `F_WRLCK` as `Some`), or `None` when nothing would
/// conflict. Locks of `fd`'s own open file description never conflict.
/// This is QEMU's `qemu_lock_fd_test` (block/file-posix.c), which tests
/// one lock byte at a time.
pub fn ofd_lock_test(fd: BorrowedFd<'_>, start: u64, len: u64) -> Result<Option<i16>, Errno> {
    let mut lk = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: i64::try_from(start).map_err(|_| Errno::INVAL)?,
        l_len: i64::try_from(len).map_err(|_| Errno::INVAL)?,
        l_pid: 0,
    };
    // SAFETY: F_OFD_GETLK reads and writes exactly one `struct flock`,
    // which `lk` is, initialised, with l_pid 0 as OFD locks require; `fd`
    // is a live descriptor for the duration of the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_GETLK, &mut lk) };
    if r < 0 {
        return Err(last_errno());
    }
    Ok((lk.l_type != libc::F_UNLCK as i16).then_some(lk.l_type))
}

/// `fcntl(fd, F_OFD_SETLK)`: take a shared (`F_RDLCK`, `shared` true) or
/// exclusive (`F_WRLCK`) lock on `len` bytes at `start` for `fd`'s open
/// file description, without waiting (`EAGAIN` when another holds a
/// conflicting lock), or release it (`unlock`). The lock lives as long as
/// the open file description. QEMU's `qemu_lock_fd`/`qemu_unlock_fd`
/// take the same shared locks on its permission bytes.
pub fn ofd_lock_set(
    fd: BorrowedFd<'_>,
    start: u64,
    len: u64,
    shared: bool,
    unlock: bool,
) -> Result<(), Errno> {
    let l_type = match (unlock, shared) {
        (true, _) => libc::F_UNLCK,
        (false, true) => libc::F_RDLCK,
        (false, false) => libc::F_WRLCK,
    };
    let mut lk = libc::flock {
        l_type: l_type as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: i64::try_from(start).map_err(|_| Errno::INVAL)?,
        l_len: i64::try_from(len).map_err(|_| Errno::INVAL)?,
        l_pid: 0,
    };
    // SAFETY: F_OFD_SETLK reads exactly one `struct flock`, which `lk` is,
    // initialised, with l_pid 0 as OFD locks require; `fd` is a live
    // descriptor for the duration of the call.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut lk) };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(())
}

fn last_errno() -> Errno {
    Errno::from_raw_os_error(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

// Loop devices (linux/loop.h): attach a file with LOOP_CONFIGURE, detach,
// switch direct I/O. State is read back from sysfs by the library.

// libc::Ioctl: the request type of ioctl(2), c_ulong in glibc, c_int in musl.
const LOOP_CTL_GET_FREE: libc::Ioctl = linux_raw_sys::loop_device::LOOP_CTL_GET_FREE as _;
const LOOP_CONFIGURE: Opcode = linux_raw_sys::loop_device::LOOP_CONFIGURE as Opcode;
const LOOP_CLR_FD: Opcode = linux_raw_sys::loop_device::LOOP_CLR_FD as Opcode;
const LOOP_SET_DIRECT_IO: Opcode = linux_raw_sys::loop_device::LOOP_SET_DIRECT_IO as Opcode;
const LOOP_GET_STATUS64: Opcode = linux_raw_sys::loop_device::LOOP_GET_STATUS64 as Opcode;

/// `LO_FLAGS_AUTOCLEAR`: the device detaches itself when its last user
/// (a mount, an open descriptor) goes away.
pub const LOOP_FLAG_AUTOCLEAR: u32 = linux_raw_sys::loop_device::LO_FLAGS_AUTOCLEAR as u32;
/// `LO_FLAGS_DIRECT_IO`: the device reads and writes its backing file with
/// `O_DIRECT`, so pages are not cached twice.
pub const LOOP_FLAG_DIRECT_IO: u32 = linux_raw_sys::loop_device::LO_FLAGS_DIRECT_IO as u32;

/// `ioctl(/dev/loop-control, LOOP_CTL_GET_FREE)`: the number of a free loop
/// device (`/dev/loopN`), created by the kernel if none is free. Another
/// process may take it before we configure it; `loop_configure` then
/// answers `EBUSY` and the caller asks again.
pub fn loop_ctl_get_free(control: BorrowedFd<'_>) -> Result<u32, Errno> {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns the device
    // number or -1; `control` is a live descriptor for the call.
    let r = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
    if r < 0 {
        return Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ));
    }
    Ok(r as u32)
}

/// `ioctl(device, LOOP_CONFIGURE, {fd: backing, block_size, flags})`: attach
/// `backing` to the loop device `device` in one step, with the logical
/// block size `block_size` (512 to 4096, a power of two) and `flags`
/// (`LOOP_FLAG_*`). `EBUSY`: the device is already attached.
pub fn loop_configure(
    device: BorrowedFd<'_>,
    backing: BorrowedFd<'_>,
    block_size: u32,
    flags: u32,
) -> Result<(), Errno> {
    // SAFETY: `loop_config` is plain old data (integers and byte arrays);
    // all-zero is its documented "no offset, no size limit, no name" value.
    let mut config: linux_raw_sys::loop_device::loop_config = unsafe { std::mem::zeroed() };
    config.fd = backing.as_raw_fd() as u32;
    config.block_size = block_size;
    config.info.lo_flags = flags;
    // SAFETY: LOOP_CONFIGURE reads exactly one `struct loop_config`, which
    // the setter holds for the duration of the call; `backing` stays open
    // for the call (the kernel takes its own reference).
    unsafe {
        ioctl(
            device,
            rustix::ioctl::Setter::<LOOP_CONFIGURE, _>::new(config),
        )
    }
}

/// `ioctl(device, LOOP_CLR_FD)`: detach the loop device's backing file. If
/// something else still holds the device (a mount), the kernel only marks it
/// to detach when that goes away.
pub fn loop_clear(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_CLR_FD takes no argument.
    unsafe { ioctl(device, rustix::ioctl::NoArg::<LOOP_CLR_FD>::new()) }
}

/// `ioctl(device, LOOP_SET_DIRECT_IO, on)`: switch direct I/O on an attached
/// loop device. `EINVAL` when the backing file's filesystem or the block
/// size does not allow it.
pub fn loop_set_direct_io(device: BorrowedFd<'_>, on: bool) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_DIRECT_IO takes an unsigned long by value (0 or 1).
    unsafe {
        ioctl(
            device,
            rustix::ioctl::IntegerSetter::<LOOP_SET_DIRECT_IO>::new_usize(usize::from(on)),
        )
    }
}

/// What `LOOP_GET_STATUS64` says of an attached loop device: the backing
/// file's identity as the kernel holds it (not a path, which may have been
/// renamed, deleted or trimmed), and the device's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopStatus {
    /// `st_dev` of the backing file (`lo_device`).
    pub backing_dev: u64,
    /// `st_ino` of the backing file (`lo_inode`).
    pub backing_ino: u64,
    /// The device's flags (`LOOP_FLAG_*`, `lo_flags`).
    pub flags: u32,
    /// Where the data starts in the backing file (`lo_offset`).
    pub offset: u64,
}

/// `ioctl(device, LOOP_GET_STATUS64)`: the backing file's device and inode
/// and the device's flags. `ENXIO`: the device is not attached.
pub fn loop_get_status64(device: BorrowedFd<'_>) -> Result<LoopStatus, Errno> {
    // SAFETY: LOOP_GET_STATUS64 writes exactly one `struct loop_info64`
    // (plain old data: integers and byte arrays) into the getter's buffer.
    let info = unsafe {
        ioctl(
            device,
            rustix::ioctl::Getter::<LOOP_GET_STATUS64, linux_raw_sys::loop_device::loop_info64>::new(),
        )
    }?;
    Ok(LoopStatus {
        backing_dev: info.lo_device,
        backing_ino: info.lo_inode,
        flags: info.lo_flags,
        offset: info.lo_offset,
    })
}

const _: () = assert!(std::mem::size_of::<linux_raw_sys::loop_device::loop_config>() == 304);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::loop_device::loop_info64>() == 232);

// The rustix calls only Linux has, typed so that callers never name them:
// the portable module answers the same signatures with "not here".

use rustix::fd::OwnedFd;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use std::ffi::CStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this platform has a clone call at all (`FICLONE`). `None` here:
/// whether a given pair of files clones is the filesystem's answer.
pub const CLONE_UNAVAILABLE: Option<&str> = None;

/// Opens a directory only to name it in `*at` calls (`O_PATH`: no read
/// permission needed, no access time touched).
pub const O_PATH: OFlags = OFlags::PATH;

/// Opens a file without updating its access time (`O_NOATIME`; only for
/// the file's owner or a privileged caller, `EPERM` otherwise).
pub const O_NOATIME: OFlags = OFlags::NOATIME;

/// `openat(dir, path, O_TMPFILE | access | O_CLOEXEC, mode)`: an unnamed
/// file in the directory `path`, to be linked into place with
/// [`link_fd`] when complete. `EOPNOTSUPP`, `EISDIR` or `EINVAL` where
/// the filesystem or the kernel has no `O_TMPFILE`: callers then create a
/// named temporary.
pub fn open_unnamed(
    dir: BorrowedFd<'_>,
    path: &Path,
    access: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    rfs::openat(dir, path, OFlags::TMPFILE | access | OFlags::CLOEXEC, mode)
}

/// Set once `linkat(AT_EMPTY_PATH)` was refused (it needs
/// CAP_DAC_READ_SEARCH on many kernels); later links go through /proc.
static EMPTY_PATH_REFUSED: AtomicBool = AtomicBool::new(false);

/// Give the open file `file` (unnamed, or named elsewhere) the name `name`
/// in the directory `target`: `linkat(AT_EMPTY_PATH)`, or, where that needs a
/// privilege the process lacks, `linkat` of `/proc/self/fd/N` with
/// `AT_SYMLINK_FOLLOW`, which works without one. `EEXIST` when the name is
/// taken.
pub fn link_fd(file: BorrowedFd<'_>, target: BorrowedFd<'_>, name: &Path) -> Result<(), Errno> {
    if !EMPTY_PATH_REFUSED.load(Ordering::Relaxed) {
        match rfs::linkat(file, c"", target, name, AtFlags::EMPTY_PATH) {
            Err(Errno::NOENT | Errno::PERM) => EMPTY_PATH_REFUSED.store(true, Ordering::Relaxed),
            r => return r,
        }
    }
    let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    rfs::linkat(rfs::CWD, &*proc_path, target, name, AtFlags::SYMLINK_FOLLOW)
}

/// `renameat2(old_dir, old, new_dir, new, RENAME_NOREPLACE)`: rename
/// without replacing (`EEXIST`). `EINVAL` where the filesystem lacks the
/// flag.
pub fn rename_noreplace(
    old_dir: BorrowedFd<'_>,
    old: &Path,
    new_dir: BorrowedFd<'_>,
    new: &Path,
) -> Result<(), Errno> {
    rfs::renameat_with(old_dir, old, new_dir, new, rfs::RenameFlags::NOREPLACE)
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode, RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: open `path` below `dir`
/// without following any symbolic link and without leaving `dir` (`EXDEV`
/// on `..` out, `ELOOP` on a link). `path` is at most `PATH_MAX` bytes.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    use rustix::fs::ResolveFlags;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    rfs::openat2(dir, path, flags | OFlags::CLOEXEC, mode, resolve)
}

/// `copy_file_range(2)` of up to `len` bytes from `src` at `*off_in` to
/// `dst` at `*off_out`, advancing both: the kernel copies (or the
/// filesystem shares or offloads) without a trip through user space.
/// `EXDEV`, `EINVAL`, `EOPNOTSUPP`, `ENOSYS`: not possible for this pair.
pub fn copy_file_range(
    src: BorrowedFd<'_>,
    off_in: &mut u64,
    dst: BorrowedFd<'_>,
    off_out: &mut u64,
    len: usize,
) -> Result<usize, Errno> {
    rfs::copy_file_range(src, Some(off_in), dst, Some(off_out), len)
}

/// `fallocate(fd, 0, offset, len)`: reserve blocks, extending the size.
/// `EOPNOTSUPP`, `ENOSYS` or `EINVAL` where the filesystem cannot.
pub fn allocate(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    rfs::fallocate(fd, rfs::FallocateFlags::empty(), offset, len)
}

/// `fallocate(FALLOC_FL_KEEP_SIZE)`: reserve blocks past the end without
/// changing the file's size.
pub fn allocate_keep_size(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    rfs::fallocate(fd, rfs::FallocateFlags::KEEP_SIZE, offset, len)
}

/// `fallocate(fd, PUNCH_HOLE | KEEP_SIZE, offset, len)`: free the blocks
/// of the range, which then reads as zeros. `EOPNOTSUPP` where the
/// filesystem cannot.
pub fn punch_hole(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    let flags = rfs::FallocateFlags::PUNCH_HOLE | rfs::FallocateFlags::KEEP_SIZE;
    rfs::fallocate(fd, flags, offset, len)
}

/// `fallocate(fd, ZERO_RANGE | KEEP_SIZE, offset, len)`: make the range
/// read as zeros (unwritten extents). `EOPNOTSUPP` where the filesystem
/// cannot.
pub fn zero_range(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    let flags = rfs::FallocateFlags::ZERO_RANGE | rfs::FallocateFlags::KEEP_SIZE;
    rfs::fallocate(fd, flags, offset, len)
}

/// `lseek(fd, pos, SEEK_DATA)`: the first data offset at or after `pos`.
/// `ENXIO`: only a hole follows. `EINVAL` or `EOPNOTSUPP`: no hole
/// reporting here.
pub fn seek_data(fd: BorrowedFd<'_>, pos: u64) -> Result<u64, Errno> {
    rfs::seek(fd, rfs::SeekFrom::Data(pos))
}

/// `lseek(fd, pos, SEEK_HOLE)`: the first hole offset at or after `pos`
/// (the end of the file counts as a hole).
pub fn seek_hole(fd: BorrowedFd<'_>, pos: u64) -> Result<u64, Errno> {
    rfs::seek(fd, rfs::SeekFrom::Hole(pos))
}

fn fs_stat_of(s: &rfs::StatFs) -> FsStat {
    FsStat {
        magic: Some(s.f_type as u64),
        type_name: None,
        block_size: s.f_bsize as u64,
    }
}

/// `fstatfs(2)`: the filesystem `fd` is on (its `f_type` magic).
pub fn fs_stat(fd: BorrowedFd<'_>) -> Result<FsStat, Errno> {
    rfs::fstatfs(fd).map(|s| fs_stat_of(&s))
}

/// `statfs(2)` of the filesystem `path` is on.
pub fn fs_stat_path(path: &Path) -> Result<FsStat, Errno> {
    rfs::statfs(path).map(|s| fs_stat_of(&s))
}

/// `syncfs(2)`: write back everything of the filesystem `fd` is on.
pub fn sync_filesystem(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    rfs::syncfs(fd)
}

/// `posix_fadvise(fd, 0, 0, DONTNEED)`: drop the file's clean pages from
/// the page cache, so the next read comes from the device.
pub fn drop_cached_pages(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    rfs::fadvise(fd, 0, None, rfs::Advice::DontNeed)
}

/// `ioctl(fd, FS_IOC_GETFLAGS)`: the inode's attribute flags. `ENOTTY` or
/// `EOPNOTSUPP` where the filesystem has none.
pub fn inode_flags(fd: BorrowedFd<'_>) -> Result<InodeFlags, Errno> {
    rfs::ioctl_getflags(fd).map(|f| InodeFlags(f.bits()))
}

/// `ioctl(fd, FS_IOC_SETFLAGS)`: set the inode's attribute flags (all of
/// them: read, change, write).
pub fn set_inode_flags(fd: BorrowedFd<'_>, flags: InodeFlags) -> Result<(), Errno> {
    rfs::ioctl_setflags(fd, rfs::IFlags::from_bits_retain(flags.0))
}

const ACL_ACCESS_XATTR: &CStr = c"system.posix_acl_access";
const ACL_DEFAULT_XATTR: &CStr = c"system.posix_acl_default";

/// Whether the directory `fd` may have a default ACL (which new files'
/// modes follow instead of the umask): anything but "no such attribute"
/// or "no xattrs here" counts as yes.
pub fn has_default_acl(fd: BorrowedFd<'_>) -> bool {
    !matches!(
        rfs::fgetxattr(fd, ACL_DEFAULT_XATTR, &mut [0u8; 0][..]),
        Err(Errno::NODATA | Errno::OPNOTSUPP)
    )
}

/// Whether the extended attribute `name` is a POSIX ACL (Linux keeps ACLs
/// as the two `system.posix_acl_*` attributes).
pub fn is_acl_xattr(name: &[u8]) -> bool {
    name == ACL_ACCESS_XATTR.to_bytes() || name == ACL_DEFAULT_XATTR.to_bytes()
}

/// `flistxattr(2)` into `buf`: the NUL-separated attribute names, returning
/// their length. `ERANGE`: `buf` is too small; `EOPNOTSUPP`: no xattrs.
pub fn list_xattrs(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    rfs::flistxattr(fd, buf)
}

/// `flistxattr(fd, NULL, 0)`: how many bytes the names take now.
pub fn list_xattrs_len(fd: BorrowedFd<'_>) -> Result<usize, Errno> {
    rfs::flistxattr_query(fd)
}

/// `fgetxattr(2)` into `buf`, returning the value's length. `ENODATA`: no
/// such attribute; `ERANGE`: `buf` is too small.
pub fn get_xattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    rfs::fgetxattr(fd, name, buf)
}

/// `fgetxattr(fd, name, NULL, 0)`: the value's length now.
pub fn get_xattr_len(fd: BorrowedFd<'_>, name: &CStr) -> Result<usize, Errno> {
    rfs::fgetxattr_query(fd, name)
}

/// `fsetxattr(2)`: create or replace the attribute `name`.
pub fn set_xattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> Result<(), Errno> {
    rfs::fsetxattr(fd, name, value, rfs::XattrFlags::empty())
}

/// `fremovexattr(2)`: remove the attribute `name`. `ENODATA`: it was not
/// there.
pub fn remove_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    rfs::fremovexattr(fd, name)
}

/// The path of `name` in the open directory `dir` through `/proc`, so a
/// path call resolves nothing but that one name.
fn proc_path_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<std::ffi::CString, Errno> {
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.to_bytes());
    std::ffi::CString::new(p).map_err(|_| Errno::INVAL)
}

/// `llistxattr(2)` of the entry `name` in `dir`, without opening it or
/// following it when it is a symbolic link: one call where
/// open + `flistxattr` + close are three. `ERANGE`: `buf` is too small
/// (an empty `buf` asks for the length).
pub fn list_xattrs_at(dir: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
    let p = proc_path_at(dir, name)?;
    if buf.is_empty() {
        return rfs::llistxattr_query(p.as_c_str());
    }
    rfs::llistxattr(p.as_c_str(), buf)
}

/// `lgetxattr(2)` of the entry `name` in `dir` (as [`list_xattrs_at`]).
/// An empty `buf` asks for the length.
pub fn get_xattr_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    attr: &CStr,
    buf: &mut [u8],
) -> Result<usize, Errno> {
    let p = proc_path_at(dir, name)?;
    if buf.is_empty() {
        return rfs::lgetxattr_query(p.as_c_str(), attr);
    }
    rfs::lgetxattr(p.as_c_str(), attr, buf)
}

/// Set the mode of the entry `name` in `dir` without following it:
/// `chmod` follows symbolic links and `fchmodat`'s `AT_SYMLINK_NOFOLLOW`
/// is not everywhere, so the entry is pinned with an `O_PATH` descriptor
/// and changed through `/proc/self/fd` (glibc's way). `ELOOP`: it is a
/// symbolic link.
pub fn chmod_nofollow(dir: BorrowedFd<'_>, name: &CStr, mode: Mode) -> Result<(), Errno> {
    let pinned = rfs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rfs::FileType::from_raw_mode(rfs::fstat(&pinned)?.st_mode) == rfs::FileType::Symlink {
        return Err(Errno::LOOP);
    }
    let via = format!("/proc/self/fd/{}", pinned.as_raw_fd());
    rfs::chmod(via.as_str(), mode)
}

/// The kernel's table of file locks (`/proc/locks`), for naming the
/// process that holds a lock another run wants.
pub fn lock_table() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/locks")
}

/// The mount table as the kernel describes it (`/proc/self/mountinfo`
/// text, parsed by the core's `mountinfo`).
pub fn mount_table() -> std::io::Result<String> {
    std::fs::read_to_string(MOUNT_TABLE)
}

/// Where [`mount_table`] reads, for messages.
pub const MOUNT_TABLE: &str = "/proc/self/mountinfo";

/// The active swap areas as the kernel lists them (`/proc/swaps` text);
/// `None` when it cannot be read.
pub fn swaps() -> Option<String> {
    std::fs::read_to_string("/proc/swaps").ok()
}

/// The process's umask without changing it (reading it with `umask(2)`
/// would change it for a moment under other threads): from
/// `/proc/self/status`. `None` when the kernel does not show it.
pub fn umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// Whether a process with id `pid` exists (in this PID namespace).
pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// This machine's host name (`/proc/sys/kernel/hostname`); empty when
/// unknown.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// `fstat`, `stat`, `lstat` and `statat`, and the [`Stat`] they fill: on
/// Linux rustix's own, whose field types (`st_mode: u32`, `st_dev: u64`,
/// ...) the other platforms' [`Stat`] copies.
pub use rustix::fs::{fstat, lstat, stat, statat, Stat};

/// The permission bits `m` (`st_mode & 0o7777` and the like) as a
/// [`Mode`] for `open`, `mkdir` and `chmod`.
pub fn raw_mode(m: u32) -> Mode {
    Mode::from_raw_mode(m)
}

/// The file type `st_mode` names.
pub fn file_type(st_mode: u32) -> rfs::FileType {
    rfs::FileType::from_raw_mode(st_mode)
}

/// `mknodat(2)`: a device node, FIFO or socket named `name` in `dir`.
pub fn mknodat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: rfs::FileType,
    mode: Mode,
    dev: u64,
) -> Result<(), Errno> {
    rfs::mknodat(dir, name, kind, mode, dev)
}

/// The `st_mode` type bits of the file type `t`.
pub fn file_type_bits(t: rfs::FileType) -> u32 {
    t.as_raw_mode()
}

// Btrfs subvolumes (linux/btrfs.h): create, snapshot and delete, each an
// ioctl on the parent directory with the new or old name in a
// `struct btrfs_ioctl_vol_args`. Snapshot sets use them so that a snapshot
// of a subvolume costs constant time.

const BTRFS_IOC_SUBVOL_CREATE: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_SUBVOL_CREATE as Opcode;
const BTRFS_IOC_SNAP_CREATE: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_SNAP_CREATE as Opcode;
const BTRFS_IOC_SNAP_DESTROY: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_SNAP_DESTROY as Opcode;

/// The inode number of every Btrfs subvolume's root directory
/// (`BTRFS_FIRST_FREE_OBJECTID`): a directory on Btrfs with this inode
/// number is a subvolume.
pub const BTRFS_SUBVOL_ROOT_INO: u64 = linux_raw_sys::btrfs::BTRFS_FIRST_FREE_OBJECTID as u64;

/// `struct btrfs_ioctl_vol_args` with `fd` and `name` (one component, no
/// `/`, at most `BTRFS_PATH_NAME_MAX` bytes: `ENAMETOOLONG`, `EINVAL`).
fn vol_args(
    fd: i64,
    name: &CStr,
) -> Result<Box<linux_raw_sys::btrfs::btrfs_ioctl_vol_args>, Errno> {
    let bytes = name.to_bytes();
    if bytes.len() > linux_raw_sys::btrfs::BTRFS_PATH_NAME_MAX as usize {
        return Err(Errno::NAMETOOLONG);
    }
    if bytes.is_empty() || bytes.contains(&b'/') {
        return Err(Errno::INVAL);
    }
    let mut arg = Box::new(linux_raw_sys::btrfs::btrfs_ioctl_vol_args {
        fd,
        name: [0; 4088],
    });
    for (d, s) in arg.name.iter_mut().zip(bytes) {
        *d = *s as std::ffi::c_char;
    }
    Ok(arg)
}

/// `ioctl(dir, BTRFS_IOC_SUBVOL_CREATE, {name})`: a new, empty subvolume
/// named `name` in the directory `dir` (on Btrfs; `ENOTTY` elsewhere,
/// `EEXIST` when the name is taken).
pub fn btrfs_subvol_create(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let mut arg = vol_args(0, name)?;
    // SAFETY: BTRFS_IOC_SUBVOL_CREATE is `_IOW(0x94, 14, struct
    // btrfs_ioctl_vol_args)`; `arg` is exactly that struct (4096 bytes,
    // size asserted below), initialised, with a NUL-terminated name, and
    // lives for the call.
    unsafe {
        ioctl(
            dir,
            Updater::<BTRFS_IOC_SUBVOL_CREATE, linux_raw_sys::btrfs::btrfs_ioctl_vol_args>::new(
                &mut *arg,
            ),
        )
    }
}

/// `ioctl(dir, BTRFS_IOC_SNAP_CREATE, {source, name})`: a writable
/// snapshot of the subvolume whose root directory `source` is, named
/// `name` in `dir`, in constant time. Subvolumes nested in the source
/// appear in the snapshot as empty directories. `EINVAL` when `source`
/// is not a subvolume's root, `EXDEV` across filesystems.
pub fn btrfs_snapshot_create(
    dir: BorrowedFd<'_>,
    name: &CStr,
    source: BorrowedFd<'_>,
) -> Result<(), Errno> {
    let mut arg = vol_args(i64::from(source.as_raw_fd()), name)?;
    // SAFETY: BTRFS_IOC_SNAP_CREATE is `_IOW(0x94, 1, struct
    // btrfs_ioctl_vol_args)`; `arg` is exactly that struct, initialised,
    // with a NUL-terminated name and `fd` a descriptor that stays open for
    // the call (`source` is borrowed across it).
    unsafe {
        ioctl(
            dir,
            Updater::<BTRFS_IOC_SNAP_CREATE, linux_raw_sys::btrfs::btrfs_ioctl_vol_args>::new(
                &mut *arg,
            ),
        )
    }
}

/// `ioctl(dir, BTRFS_IOC_SNAP_DESTROY, {name})`: delete the subvolume
/// named `name` in `dir` with everything in it (the kernel drops the
/// subvolume's tree; it follows no link and enters no mount). Needs
/// `CAP_SYS_ADMIN` or the `user_subvol_rm_allowed` mount option (`EPERM`
/// otherwise); `EBUSY` when it is mounted or a mount point.
pub fn btrfs_subvol_delete(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let mut arg = vol_args(0, name)?;
    // SAFETY: BTRFS_IOC_SNAP_DESTROY is `_IOW(0x94, 15, struct
    // btrfs_ioctl_vol_args)`; `arg` is exactly that struct, initialised,
    // with a NUL-terminated name, and lives for the call.
    unsafe {
        ioctl(
            dir,
            Updater::<BTRFS_IOC_SNAP_DESTROY, linux_raw_sys::btrfs::btrfs_ioctl_vol_args>::new(
                &mut *arg,
            ),
        )
    }
}

const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_vol_args>() == 4096);

/// `openat2(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
/// RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
/// RESOLVE_NO_XDEV)`: open the subdirectory `name` of `dir` only if
/// reaching it follows no symbolic link and crosses no mount point (a
/// bind mount of the same filesystem included): `EXDEV` then, `ELOOP` or
/// `ENOTDIR` for a link. For removing a tree without leaving it.
pub fn open_dir_same_mount(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    use rustix::fs::ResolveFlags;
    let resolve = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    rfs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    )
}

/// `statx(fd, "", AT_EMPTY_PATH, STATX_MNT_ID)`: the id of the mount `fd`
/// was opened through (the first field of `/proc/self/mountinfo`), or
/// `ENODATA` when the kernel did not say.
pub fn mount_id(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let sx = rfs::statx(
        fd,
        c"",
        rfs::AtFlags::EMPTY_PATH,
        rfs::StatxFlags::MNT_ID | rfs::StatxFlags::INO,
    )?;
    if sx.stx_mask & rfs::StatxFlags::MNT_ID.bits() == 0 {
        return Err(Errno::NODATA);
    }
    Ok(sx.stx_mnt_id)
}

/// `openat2(dir, "..", O_PATH | O_DIRECTORY | O_CLOEXEC, RESOLVE_NO_XDEV)`:
/// the parent of the directory `dir`, as a descriptor that only names it
/// (no read permission needed, so a walk goes on above a directory it may
/// not list), or `EXDEV` when reaching it crosses a mount point (`dir` is
/// the root of its mount). At the root of the process's tree the answer
/// is `dir` itself. Where `openat2` is missing (`ENOSYS`), a different
/// `st_dev` alone counts as another mount.
pub fn open_parent_same_mount(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    use rustix::fs::ResolveFlags;
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let resolve = ResolveFlags::NO_XDEV | ResolveFlags::NO_MAGICLINKS;
    match rfs::openat2(dir, "..", flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS) => {
            let fd = rfs::openat(dir, "..", flags, Mode::empty())?;
            if rfs::fstat(&fd)?.st_dev != rfs::fstat(dir)?.st_dev {
                return Err(Errno::XDEV);
            }
            Ok(fd)
        }
        r => r,
    }
}

/// `openat2(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`: open
/// the entry `name` of `dir` (any type `flags` allow) only if it is no
/// symbolic link and no mount point, a bind mount of the same filesystem
/// (which shares `st_dev`) included: `EXDEV` then. For a tree that must
/// never be written through into another place. Where `openat2` is
/// missing (`ENOSYS`), a different `st_dev` alone is refused.
pub fn open_same_mount(dir: BorrowedFd<'_>, name: &CStr, flags: OFlags) -> Result<OwnedFd, Errno> {
    use rustix::fs::ResolveFlags;
    let resolve = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rfs::openat2(dir, name, flags, Mode::empty(), resolve) {
        // No openat2 (a kernel before 5.6, or a seccomp filter that hides
        // it): the device check alone, which misses only a bind mount of
        // the same filesystem.
        Err(Errno::NOSYS) => {
            let fd = rfs::openat(dir, name, flags, Mode::empty())?;
            if rfs::fstat(&fd)?.st_dev != rfs::fstat(dir)?.st_dev {
                return Err(Errno::XDEV);
            }
            Ok(fd)
        }
        r => r,
    }
}

/// `statx(fd, "", AT_EMPTY_PATH, STATX_BTIME)`: the file's creation time
/// as `(seconds, nanoseconds)` since the epoch, or `None` when the
/// filesystem does not record one. With the inode number it tells a
/// directory from a later one that reused its inode, and unlike `st_dev`
/// it survives a remount.
pub fn birth_time(fd: BorrowedFd<'_>) -> Result<Option<(i64, u32)>, Errno> {
    let st = rfs::statx(fd, "", AtFlags::EMPTY_PATH, rfs::StatxFlags::BTIME)?;
    Ok((st.stx_mask & rfs::StatxFlags::BTIME.bits() != 0)
        .then_some((st.stx_btime.tv_sec, st.stx_btime.tv_nsec)))
}

/// `fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK |
/// FAN_REPORT_DFID_NAME, O_RDONLY | O_LARGEFILE | O_CLOEXEC)`: a
/// notification group whose events name the directory (by file handle)
/// and the entry, with no open descriptor per event. Linux ≥ 5.9; needs
/// `CAP_SYS_ADMIN`. The kernel's queue is bounded (16384 events), past
/// which it reports `FAN_Q_OVERFLOW`.
///
/// See `fanotify_init(2)`.
pub fn fanotify_init_dfid_name() -> Result<OwnedFd, Errno> {
    let flags =
        libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK | libc::FAN_REPORT_DFID_NAME;
    let event_f_flags = (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as libc::c_uint;
    // SAFETY: no pointers; the result is a new descriptor or -1.
    let fd = unsafe { libc::fanotify_init(flags, event_f_flags) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd) })
}

/// `fanotify_mark(group, FAN_MARK_ADD | kind, mask, AT_FDCWD, path)`: add
/// `mask` (the `FAN_*` event bits) on the filesystem, the mount or the
/// inode `path` names. `EXDEV`: `path` is in a Btrfs subvolume whose fsid
/// differs from its filesystem's (with a filesystem mark); `EINVAL`:
/// directory-entry events on a mount mark.
///
/// See `fanotify_mark(2)`.
pub fn fanotify_mark(
    group: BorrowedFd<'_>,
    kind: FanMark,
    mask: u64,
    path: &Path,
) -> Result<(), Errno> {
    let path =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| Errno::INVAL)?;
    let flags = libc::FAN_MARK_ADD
        | match kind {
            FanMark::Filesystem => libc::FAN_MARK_FILESYSTEM,
            FanMark::Mount => libc::FAN_MARK_MOUNT,
            FanMark::Inode => 0,
        };
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            flags,
            mask,
            libc::AT_FDCWD,
            path.as_ptr(),
        )
    };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// Read the pending events of the fanotify `group` (non-blocking) into
/// `buf` and parse them into `out` ([`parse_events`]). `Ok(None)`: all
/// parsed, or nothing pending; `Ok(Some(e))`: the records stopped making
/// sense at some point (the events before it are in `out`). Any event
/// descriptor (none in a group that reports handles) is closed.
///
/// See `fanotify(7)`.
pub fn fanotify_read(
    group: BorrowedFd<'_>,
    buf: &mut [u8],
    out: &mut Vec<FanEvent>,
) -> Result<Option<FanParseError>, Errno> {
    let n = match rustix::io::read(group, &mut *buf) {
        Ok(n) => n,
        Err(Errno::AGAIN) => return Ok(None),
        Err(e) => return Err(e),
    };
    let first = out.len();
    let parsed = parse_events(&buf[..n], out);
    for ev in &mut out[first..] {
        if ev.fd >= 0 {
            // SAFETY: the kernel opened this descriptor for us with the
            // event; nothing else holds it, and it is closed once.
            drop(unsafe { <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(ev.fd) });
            ev.fd = -1;
        }
    }
    Ok(parsed.err())
}

/// `poll(fd, POLLIN, timeout)`: whether `fd` became readable within
/// `timeout` (rounded up to a millisecond). `EINTR` answers `false`.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> Result<bool, Errno> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd, counted as one.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    match r {
        r if r < 0 => match last_errno() {
            Errno::INTR => Ok(false),
            e => Err(e),
        },
        0 => Ok(false),
        _ => Ok(p.revents & libc::POLLIN != 0),
    }
}

/// `open_by_handle_at(mount, handle, flags)`: open the object `handle`
/// names on the filesystem of `mount` (any descriptor on it). Needs
/// `CAP_DAC_READ_SEARCH`. `ESTALE`: the object is gone.
///
/// See `open_by_handle_at(2)`.
pub fn open_by_handle(
    mount: BorrowedFd<'_>,
    handle: &FileHandle,
    flags: rustix::fs::OFlags,
) -> Result<OwnedFd, Errno> {
    if handle.bytes.len() > MAX_HANDLE_SZ {
        return Err(Errno::INVAL);
    }
    // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[]; },
    // in u64 words so the header is aligned.
    let mut words = vec![0u64; (8 + handle.bytes.len()).div_ceil(8)];
    {
        let raw: &mut [u8] = bytemuck_bytes(&mut words);
        raw[0..4].copy_from_slice(&(handle.bytes.len() as u32).to_ne_bytes());
        raw[4..8].copy_from_slice(&handle.handle_type.to_ne_bytes());
        raw[8..8 + handle.bytes.len()].copy_from_slice(&handle.bytes);
    }
    // SAFETY: `words` holds a complete `struct file_handle` whose
    // `handle_bytes` matches the bytes that follow it; it outlives the call.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            words.as_mut_ptr().cast::<libc::file_handle>(),
            flags.bits() as libc::c_int,
        )
    };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { <OwnedFd as rustix::fd::FromRawFd>::from_raw_fd(fd) })
}

/// The bytes of `words` (a `u64` slice viewed as bytes, for a C struct
/// that needs 8-byte alignment).
fn bytemuck_bytes(words: &mut [u64]) -> &mut [u8] {
    let len = std::mem::size_of_val(words);
    // SAFETY: u8 has no alignment or validity requirement; the view covers
    // exactly the slice's memory and borrows it mutably for its lifetime.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

/// The path the kernel has for the open `fd` (`/proc/self/fd/N`), as seen
/// from this process's mount namespace and root. A deleted object's path
/// ends in ` (deleted)`.
pub fn fd_path(fd: BorrowedFd<'_>) -> Result<std::path::PathBuf, Errno> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
}
