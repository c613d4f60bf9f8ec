//! Raw Linux ioctls used by cowlink (clone, dedupe, FIEMAP, the Btrfs
//! backreference look-ups, and loop devices for dev drives).
//!
//! This crate is the only place in cowlink with `unsafe` code. Each function
//! wraps exactly one ioctl, takes borrowed file descriptors, and returns the
//! kernel's answer as a [`rustix::io::Errno`] on failure; it never decides
//! what an error *means*. Classification, fallbacks and messages live in the
//! safe `cowlink` crate.
//!
//! The ioctl numbers come from `linux-raw-sys` (generated from the kernel
//! UAPI headers). The FIEMAP structs are declared here because
//! `linux-raw-sys` does not export `linux/fiemap.h`; their layout is checked
//! against the kernel's by the size assertions at the bottom of this file.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

use linux_raw_sys::general::{file_clone_range, file_dedupe_range, file_dedupe_range_info};
use rustix::fd::{AsRawFd, BorrowedFd};
use rustix::io::Errno;
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

/// How many destinations one `FIDEDUPERANGE` call accepts: the request must
/// fit in one 4 KiB page (header of 24 bytes, 32 bytes per destination).
pub const DEDUPE_MAX_DESTS: usize = (4096 - std::mem::size_of::<file_dedupe_range>())
    / std::mem::size_of::<file_dedupe_range_info>();

/// The kernel's answer for one destination of a dedupe request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupeStatus {
    /// The ranges were identical and now share blocks (`FILE_DEDUPE_RANGE_SAME`).
    Same,
    /// The ranges differ; nothing was changed (`FILE_DEDUPE_RANGE_DIFFERS`).
    Differs,
    /// The kernel refused this destination with an error.
    Error(Errno),
}

/// One destination's result: its status and the kernel's `bytes_deduped`.
///
/// `bytes_deduped` echoes the requested length even when less was shared;
/// never count savings with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DedupeResult {
    /// What the kernel did for this destination.
    pub status: DedupeStatus,
    /// The kernel's `bytes_deduped` field, as reported.
    pub bytes_deduped: u64,
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

/// `FIEMAP_FLAG_SYNC`: write dirty pages back before mapping.
pub const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// Extent flag: the last extent of the file.
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// Extent flag: data location unknown.
pub const FIEMAP_EXTENT_UNKNOWN: u32 = 0x2;
/// Extent flag: delayed allocation, not yet on disk.
pub const FIEMAP_EXTENT_DELALLOC: u32 = 0x4;
/// Extent flag: data is encoded (compressed or encrypted).
pub const FIEMAP_EXTENT_ENCODED: u32 = 0x8;
/// Extent flag: data is inline in metadata.
pub const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x200;
/// Extent flag: allocated but unwritten (reads as zeros).
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
/// Extent flag: the blocks are shared with another file or snapshot.
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// One extent as the kernel's `struct fiemap_extent` describes it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FiemapExtent {
    /// Byte offset of the extent in the file.
    pub logical: u64,
    /// Byte offset of the extent on the device.
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
    reserved64: [u64; 2],
    /// `FIEMAP_EXTENT_*` flags.
    pub flags: u32,
    reserved: [u32; 3],
}

/// How many extents one [`fiemap`] call returns at most.
pub const FIEMAP_BATCH: usize = 256;

/// How many extents the first [`fiemap`] call of a file asks for: most
/// files have one or two, and a small request costs less to set up.
pub const FIEMAP_FIRST_BATCH: usize = 8;

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

/// Largest answer `BTRFS_IOC_LOGICAL_INO_V2` accepts (the kernel clamps to
/// 16 MiB).
pub const BTRFS_LOGICAL_INO_MAX: usize = 16 << 20;

/// One file reference to a Btrfs data extent, as `LOGICAL_INO` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BtrfsRef {
    /// Inode number inside its subvolume.
    pub inode: u64,
    /// Byte offset in that file where the reference starts.
    pub offset: u64,
    /// The subvolume (tree id) holding the inode.
    pub root: u64,
}

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
    let size = size.clamp(CONTAINER_HEADER_WORDS * 8, BTRFS_LOGICAL_INO_MAX);
    let mut buf = vec![0u64; size / 8];
    let mut arg = linux_raw_sys::btrfs::btrfs_ioctl_logical_ino_args {
        logical,
        size: (buf.len() * 8) as u64,
        reserved: [0; 3],
        flags: 0,
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

const BTRFS_IOC_TREE_SEARCH: Opcode = linux_raw_sys::ioctl::BTRFS_IOC_TREE_SEARCH as Opcode;
/// `BTRFS_EXTENT_DATA_KEY`: the item type of a file extent.
const BTRFS_EXTENT_DATA_KEY: u32 = 108;

/// One file extent item of a Btrfs inode (`struct btrfs_file_extent_item`
/// under an `EXTENT_DATA` key), as [`btrfs_file_extents`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtrfsFileExtent {
    /// Offset in the file where this item's bytes start (the key offset).
    pub file_offset: u64,
    /// 0 inline, 1 regular, 2 preallocated.
    pub kind: u8,
    /// 0 none, 1 zlib, 2 lzo, 3 zstd.
    pub compression: u8,
    /// Bytes of the extent once decompressed (the whole extent, not only
    /// the part this item references).
    pub ram_bytes: u64,
    /// Where the extent starts on disk (the Btrfs logical address); 0 for
    /// a hole and for inline items.
    pub disk_bytenr: u64,
    /// Bytes the extent takes on disk (compressed size); 0 for inline.
    pub disk_num_bytes: u64,
    /// Offset inside the decompressed extent where this item's bytes start.
    pub offset: u64,
    /// Bytes of the file this item covers.
    pub num_bytes: u64,
}

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
    use linux_raw_sys::btrfs::{btrfs_ioctl_search_args, btrfs_ioctl_search_key};
    const HEADER: usize = std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_header>();
    // On the stack: the walk makes one call per small Btrfs file.
    let mut arg = btrfs_ioctl_search_args {
        key: btrfs_ioctl_search_key {
            tree_id: 0,
            min_objectid: inode,
            max_objectid: inode,
            min_offset: from,
            max_offset: u64::MAX,
            min_transid: 0,
            max_transid: u64::MAX,
            min_type: BTRFS_EXTENT_DATA_KEY,
            max_type: BTRFS_EXTENT_DATA_KEY,
            nr_items: max_items,
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
    let n = arg.key.nr_items as usize;
    if n == 0 {
        return Ok(None);
    }
    let buf: [u8; 3992] = arg.buf.map(|c| c as u8);
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
const _: () = assert!(DEDUPE_MAX_DESTS == 127);
const _: () =
    assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_logical_ino_args>() == 56);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_ino_path_args>() == 56);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_data_container>() == 16);
const _: () =
    assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_ino_lookup_args>() == 4096);
const _: () = assert!(std::mem::size_of::<linux_raw_sys::btrfs::btrfs_ioctl_search_args>() == 4096);
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
