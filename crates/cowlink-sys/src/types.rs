//! The types the platform layer's calls answer with: the same on every
//! target, so callers never name a platform.

use crate::Errno;

/// How many destinations one `FIDEDUPERANGE` call accepts: the request must
/// fit in one 4 KiB page (header of 24 bytes, 32 bytes per destination;
/// the Linux module checks this against the kernel's struct sizes).
pub const DEDUPE_MAX_DESTS: usize = 127;

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

/// How many extents one [`fiemap`](crate::fiemap) call returns at most.
pub const FIEMAP_BATCH: usize = 256;

/// How many extents the first [`fiemap`](crate::fiemap) call of a file asks for: most
/// files have one or two, and a small request costs less to set up.
pub const FIEMAP_FIRST_BATCH: usize = 8;

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

/// A Btrfs inode changed after a transaction: its inode item, as
/// [`btrfs_inodes_changed_since`](crate::btrfs_inodes_changed_since) returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtrfsChanged {
    /// The transaction that last wrote the inode item.
    pub transid: u64,
    /// The inode as `statx` would describe it, `dev` given by the caller
    /// (the subvolume's device number). `blocks` is the bytes written to
    /// disk (`nbytes`) in 512-byte blocks, without data not written back.
    /// `None` where its inode item was not written since, but one of its
    /// file extent items lies in a leaf written since: its extents may
    /// have moved with no inode item written (a balance relocates them
    /// so), and only a `statx` gives its identity.
    pub id: Option<FileId>,
    /// The inode number.
    pub ino: u64,
}

/// One file extent item of a Btrfs inode (`struct btrfs_file_extent_item`
/// under an `EXTENT_DATA` key), as [`btrfs_file_extents`](crate::btrfs_file_extents) reads it.
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

/// What `statfs(2)` says of a filesystem, in the words each platform has:
/// Linux names a filesystem by its `f_type` magic, the BSDs and macOS by
/// the type name `f_fstypename`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsStat {
    /// The `f_type` magic (`linux/magic.h`), where the platform has one
    /// that names the filesystem (Linux only).
    pub magic: Option<u64>,
    /// The filesystem type's name (`apfs`, `zfs`), where the platform
    /// reports one (macOS and the BSDs; Linux has it only in mountinfo).
    pub type_name: Option<String>,
    /// The block size: the unit of clone alignment (`f_bsize`).
    pub block_size: u64,
}

/// Inode attribute flags (`chattr`), as Linux's `FS_IOC_GETFLAGS` numbers
/// them. Platforms without them answer `EOPNOTSUPP` to
/// [`inode_flags`](crate::inode_flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InodeFlags(pub u32);

impl InodeFlags {
    /// `FS_SYNC_FL` (`chattr +S`): writes are synchronous.
    pub const SYNC: InodeFlags = InodeFlags(0x0000_0008);
    /// `FS_IMMUTABLE_FL` (`chattr +i`): cannot be changed or removed.
    pub const IMMUTABLE: InodeFlags = InodeFlags(0x0000_0010);
    /// `FS_APPEND_FL` (`chattr +a`): can only be appended to.
    pub const APPEND: InodeFlags = InodeFlags(0x0000_0020);
    /// `FS_NODUMP_FL` (`chattr +d`): skipped by dump.
    pub const NODUMP: InodeFlags = InodeFlags(0x0000_0040);
    /// `FS_NOATIME_FL` (`chattr +A`): access times are not updated.
    pub const NOATIME: InodeFlags = InodeFlags(0x0000_0080);
    /// `FS_NOCOW_FL` (`chattr +C`): Btrfs writes in place, never shares.
    pub const NOCOW: InodeFlags = InodeFlags(0x0080_0000);
    /// `FS_CASEFOLD_FL`: a directory whose names are looked up
    /// case-insensitively (ext4, f2fs, tmpfs with `casefold`).
    pub const CASEFOLD: InodeFlags = InodeFlags(0x4000_0000);

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: InodeFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set.
    pub fn intersects(self, other: InodeFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether no flag is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for InodeFlags {
    type Output = InodeFlags;
    fn bitor(self, rhs: InodeFlags) -> InodeFlags {
        InodeFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitAnd for InodeFlags {
    type Output = InodeFlags;
    fn bitand(self, rhs: InodeFlags) -> InodeFlags {
        InodeFlags(self.0 & rhs.0)
    }
}

/// What a dedupe index needs to know of a file to tell whether it changed:
/// `stat`'s fields plus the birth time where the platform and the
/// filesystem give one (Linux `statx`, `STATX_BTIME`). Times are
/// nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileId {
    /// The device the file is on (`st_dev`).
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    /// The owner's user id.
    pub uid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last data change.
    pub mtime_ns: i64,
    /// Last status change (data, owner, mode, links, rename).
    pub ctime_ns: i64,
    /// Creation, where known.
    pub btime_ns: Option<i64>,
}

/// Nanoseconds since the epoch from seconds and nanoseconds (saturating:
/// a time past the year 2262 is clamped, never wrapped).
pub fn time_ns(sec: i64, nsec: u64) -> i64 {
    sec.saturating_mul(1_000_000_000)
        .saturating_add(nsec.min(999_999_999) as i64)
}

/// The major and minor numbers of a device number in Linux's encoding
/// (the one [`Stat`](crate::Stat)'s `st_dev` carries, and `/proc/self/mountinfo`
/// prints as `major:minor`): glibc's `gnu_dev_major`/`gnu_dev_minor`.
pub fn dev_major_minor(dev: u64) -> (u32, u32) {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff);
    (major as u32, minor as u32)
}

#[cfg(test)]
mod dev_tests {
    #[test]
    fn dev_numbers_split_as_the_kernel_joins_them() {
        for (ma, mi) in [
            (0u32, 0u32),
            (8, 1),
            (259, 3),
            (7, 1_048_575),
            (4095, 255),
            (4096, 256),
        ] {
            let dev = rustix::fs::makedev(ma, mi);
            assert_eq!(super::dev_major_minor(dev as u64), (ma, mi));
        }
    }
}
