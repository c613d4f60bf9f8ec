//! Filesystem kinds and what we know about each without asking the kernel.
//!
//! The kind comes from `statfs(2)`'s `f_type` magic ([`FsKind::from_magic`])
//! or from the type name in `/proc/self/mountinfo` ([`FsKind::from_name`]).
//! The static knowledge here (can it ever reflink? dedupe? a clone limit?)
//! is only used to *explain* answers and to avoid pointless trials on
//! pseudo filesystems; whether reflink works is always decided by a real
//! trial clone in [`crate::probe`].

use std::fmt;

/// A filesystem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FsKind {
    /// XFS (reflink when made with `reflink=1`, the default in current mkfs).
    Xfs,
    /// Btrfs (always reflinks).
    Btrfs,
    /// ext2/3/4 (never reflinks).
    Ext4,
    /// tmpfs (never reflinks).
    Tmpfs,
    /// ramfs.
    Ramfs,
    /// OpenZFS (block cloning from 2.2 when enabled).
    Zfs,
    /// bcachefs.
    Bcachefs,
    /// OCFS2.
    Ocfs2,
    /// F2FS.
    F2fs,
    /// NFS client (server-side clone with NFS 4.2).
    Nfs,
    /// CIFS/SMB client (server-side copy with SMB3).
    Cifs,
    /// overlayfs (clones if the upper filesystem does).
    Overlay,
    /// A FUSE filesystem.
    Fuse,
    /// FAT (vfat, msdos).
    Vfat,
    /// exFAT.
    Exfat,
    /// NTFS (ntfs3 or ntfs-3g).
    Ntfs,
    /// Read-only image filesystems (squashfs, erofs, iso9660).
    ReadOnlyImage,
    /// Kernel pseudo filesystems (proc, sysfs, cgroup, devpts, ...).
    Pseudo,
    /// The automounter's trigger directories.
    Autofs,
    /// Anything else.
    Other,
    /// The platform does not say which filesystem it is (off Linux, where
    /// statfs has no magic this table knows).
    Unknown,
}

/// Known `statfs.f_type` magics (from `linux/magic.h` and the filesystems).
const MAGICS: &[(u64, FsKind)] = &[
    (0x5846_5342, FsKind::Xfs),
    (0x9123_683e, FsKind::Btrfs),
    (0xef53, FsKind::Ext4),
    (0x0102_1994, FsKind::Tmpfs),
    (0x8584_58f6, FsKind::Ramfs),
    (0x2fc1_2fc1, FsKind::Zfs),
    (0xca45_1a4e, FsKind::Bcachefs),
    (0x7461_636f, FsKind::Ocfs2),
    (0xf2f5_2010, FsKind::F2fs),
    (0x6969, FsKind::Nfs),
    (0xff53_4d42, FsKind::Cifs),
    (0xfe53_4d42, FsKind::Cifs),
    (0x794c_7630, FsKind::Overlay),
    (0x6573_5546, FsKind::Fuse),
    (0x4d44, FsKind::Vfat),
    (0x2011_bab0, FsKind::Exfat),
    (0x5346_544e, FsKind::Ntfs),
    (0x7371_7368, FsKind::ReadOnlyImage),
    (0xe0f5_e1e2, FsKind::ReadOnlyImage),
    (0x9660, FsKind::ReadOnlyImage),
    (0x9fa0, FsKind::Pseudo),
    (0x6265_6572, FsKind::Pseudo),
    (0x0027_e0eb, FsKind::Pseudo),
    (0x6367_7270, FsKind::Pseudo),
    (0x1cd1, FsKind::Pseudo),
    (0x0187, FsKind::Autofs),
];

const PSEUDO_NAMES: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "debugfs",
    "tracefs",
    "securityfs",
    "pstore",
    "bpf",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "binfmt_misc",
    "nsfs",
    "efivarfs",
    "rpc_pipefs",
    "selinuxfs",
    "devtmpfs",
    "nfsd",
];

impl FsKind {
    /// The kind for a `statfs` `f_type` value.
    pub fn from_magic(magic: u64) -> FsKind {
        MAGICS
            .iter()
            .find(|(m, _)| *m == magic)
            .map(|(_, k)| *k)
            .unwrap_or(FsKind::Other)
    }

    /// The kind for a mountinfo filesystem type name (`xfs`, `fuse.sshfs`, ...).
    pub fn from_name(name: &str) -> FsKind {
        match name {
            "xfs" => FsKind::Xfs,
            "btrfs" => FsKind::Btrfs,
            "ext2" | "ext3" | "ext4" => FsKind::Ext4,
            "tmpfs" => FsKind::Tmpfs,
            "ramfs" => FsKind::Ramfs,
            "zfs" => FsKind::Zfs,
            "bcachefs" => FsKind::Bcachefs,
            "ocfs2" => FsKind::Ocfs2,
            "f2fs" => FsKind::F2fs,
            "nfs" | "nfs4" => FsKind::Nfs,
            "cifs" | "smb3" => FsKind::Cifs,
            "overlay" => FsKind::Overlay,
            "vfat" | "msdos" => FsKind::Vfat,
            "exfat" => FsKind::Exfat,
            "ntfs" | "ntfs3" => FsKind::Ntfs,
            "squashfs" | "erofs" | "iso9660" => FsKind::ReadOnlyImage,
            "autofs" => FsKind::Autofs,
            n if n == "fuse" || n.starts_with("fuse.") || n == "fuseblk" => FsKind::Fuse,
            n if PSEUDO_NAMES.contains(&n) => FsKind::Pseudo,
            _ => FsKind::Other,
        }
    }

    /// The kind the platform layer's statfs answer names: by magic on
    /// Linux, by type name where the platform gives one, else
    /// [`FsKind::Unknown`].
    pub(crate) fn of_stat(s: &cowlink_sys::FsStat) -> FsKind {
        match (s.magic, s.type_name.as_deref()) {
            (Some(magic), _) => FsKind::from_magic(magic),
            (None, Some(name)) => match FsKind::from_name(name) {
                FsKind::Other => FsKind::Unknown,
                k => k,
            },
            (None, None) => FsKind::Unknown,
        }
    }

    /// The kind of the filesystem the open file `fd` is on.
    #[cfg(unix)]
    pub(crate) fn of_fd(fd: rustix::fd::BorrowedFd<'_>) -> Result<FsKind, cowlink_sys::Errno> {
        cowlink_sys::fs_stat(fd).map(|s| FsKind::of_stat(&s))
    }

    /// The kind of the filesystem `path` is on.
    #[cfg(unix)]
    pub(crate) fn of_path(path: &std::path::Path) -> Result<FsKind, cowlink_sys::Errno> {
        cowlink_sys::fs_stat_path(path).map(|s| FsKind::of_stat(&s))
    }

    /// A short lowercase name for messages and tables.
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
            FsKind::Ext4 => "ext4",
            FsKind::Tmpfs => "tmpfs",
            FsKind::Ramfs => "ramfs",
            FsKind::Zfs => "zfs",
            FsKind::Bcachefs => "bcachefs",
            FsKind::Ocfs2 => "ocfs2",
            FsKind::F2fs => "f2fs",
            FsKind::Nfs => "nfs",
            FsKind::Cifs => "cifs",
            FsKind::Overlay => "overlay",
            FsKind::Fuse => "fuse",
            FsKind::Vfat => "vfat",
            FsKind::Exfat => "exfat",
            FsKind::Ntfs => "ntfs",
            FsKind::ReadOnlyImage => "read-only image",
            FsKind::Pseudo => "pseudo",
            FsKind::Autofs => "autofs",
            FsKind::Other => "other",
            FsKind::Unknown => "unknown",
        }
    }

    /// Whether this kind can never share blocks between files, so a failed
    /// trial needs no further explanation. `None` when it depends on how the
    /// filesystem was made or what is behind it.
    pub fn never_reflinks(self) -> bool {
        matches!(
            self,
            FsKind::Ext4
                | FsKind::Tmpfs
                | FsKind::Ramfs
                | FsKind::Vfat
                | FsKind::Exfat
                | FsKind::Ntfs
                | FsKind::F2fs
                | FsKind::ReadOnlyImage
                | FsKind::Pseudo
                | FsKind::Autofs
        )
    }

    /// A network filesystem client, where dedupe is refused: older kernels'
    /// NFS and CIFS clients accepted FIDEDUPERANGE and cloned without
    /// comparing, which loses data.
    pub fn is_network_client(self) -> bool {
        matches!(self, FsKind::Nfs | FsKind::Cifs)
    }

    /// Why a trial clone on this kind might fail, for the probe's reason.
    pub fn reflink_hint(self) -> &'static str {
        match self {
            FsKind::Xfs => {
                "XFS shares blocks only when made with reflink=1 (mkfs.xfs -m reflink=1)"
            }
            FsKind::Btrfs => "Btrfs supports reflink; something else refused it",
            FsKind::Zfs => {
                "OpenZFS clones only from 2.2 with block cloning enabled (zfs_bclone_enabled)"
            }
            FsKind::Nfs => "NFS clones only with NFS 4.2 and a server that supports CLONE",
            FsKind::Cifs => {
                "SMB clones only with SMB3 and a server that supports duplicate extents"
            }
            FsKind::Overlay => "overlayfs clones only when its upper filesystem does",
            k if k.never_reflinks() => "this filesystem cannot share blocks between files",
            _ => "the filesystem refused to share blocks",
        }
    }

    /// The per-block clone limit where one is known.
    pub fn clone_limit(self) -> CloneLimit {
        match self {
            // XFS reference counts are 32-bit.
            FsKind::Xfs => CloneLimit::PerBlock(u64::from(u32::MAX)),
            FsKind::Btrfs | FsKind::Bcachefs => CloneLimit::Unlimited,
            _ => CloneLimit::Unknown,
        }
    }
}

impl fmt::Display for FsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many times one block may be shared.
///
/// For reference, ReFS (Windows Dev Drive) allows 8175 clones of a block;
/// no Linux filesystem we know of has a limit that low.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "limit", content = "count")]
pub enum CloneLimit {
    /// A hard limit of references per block (XFS: 2^32 − 1).
    PerBlock(u64),
    /// No hard limit (Btrfs; very many references get slow).
    Unlimited,
    /// Not known for this filesystem.
    Unknown,
}

impl fmt::Display for CloneLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloneLimit::PerBlock(n) => write!(f, "{n} per block"),
            CloneLimit::Unlimited => f.write_str("none"),
            CloneLimit::Unknown => f.write_str("unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics_and_names_agree() {
        assert_eq!(FsKind::from_magic(0x5846_5342), FsKind::Xfs);
        assert_eq!(FsKind::from_magic(0x9123_683e), FsKind::Btrfs);
        assert_eq!(FsKind::from_magic(0xef53), FsKind::Ext4);
        assert_eq!(FsKind::from_magic(0x0102_1994), FsKind::Tmpfs);
        assert_eq!(FsKind::from_magic(0x1234), FsKind::Other);
        assert_eq!(FsKind::from_name("xfs"), FsKind::Xfs);
        assert_eq!(FsKind::from_name("nfs4"), FsKind::Nfs);
        assert_eq!(FsKind::from_name("fuse.sshfs"), FsKind::Fuse);
        assert_eq!(FsKind::from_name("cgroup2"), FsKind::Pseudo);
        assert_eq!(
            FsKind::Xfs.clone_limit(),
            CloneLimit::PerBlock(4_294_967_295)
        );
        assert_eq!(FsKind::Btrfs.clone_limit(), CloneLimit::Unlimited);
    }

    #[test]
    fn statfs_answers_name_a_kind() {
        let stat = |magic, name: Option<&str>| cowlink_sys::FsStat {
            magic,
            type_name: name.map(str::to_owned),
            block_size: 4096,
        };
        assert_eq!(FsKind::of_stat(&stat(Some(0x5846_5342), None)), FsKind::Xfs);
        assert_eq!(FsKind::of_stat(&stat(Some(0x1234), None)), FsKind::Other);
        assert_eq!(FsKind::of_stat(&stat(None, Some("zfs"))), FsKind::Zfs);
        assert_eq!(FsKind::of_stat(&stat(None, Some("apfs"))), FsKind::Unknown);
        assert_eq!(FsKind::of_stat(&stat(None, None)), FsKind::Unknown);
        assert_eq!(FsKind::Unknown.name(), "unknown");
    }
}
