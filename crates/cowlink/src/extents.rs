//! File layout through FIEMAP: which byte ranges map to which disk blocks,
//! which of those blocks are shared with other files, and (on Btrfs) who
//! the other files are.
//!
//! [`extents`] maps a whole file with `FIEMAP_FLAG_SYNC` (so delayed
//! allocations have real addresses) and loops until the extent flagged
//! LAST, so files with any number of extents are listed completely. The
//! answer, a [`FileLayout`], carries every extent and the totals people ask
//! for: shared bytes, holes, fragments.
//!
//! Who shares: on Btrfs the kernel keeps back references, so
//! [`btrfs_refs`] asks it for every file reference to each extent (root
//! only). On any FIEMAP filesystem, [`shared_within`] matches the physical
//! ranges of a given set of files against each other.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};

/// One mapped extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    /// Offset in the file, bytes.
    pub logical: u64,
    /// Offset on the device, bytes (the Btrfs logical address on Btrfs).
    pub physical: u64,
    /// Length, bytes.
    pub length: u64,
    /// Raw `FIEMAP_EXTENT_*` flags.
    pub flags: u32,
    /// For an encoded (compressed) Btrfs extent, its real sizes, which
    /// FIEMAP does not give: read from Btrfs's own file extent items, which
    /// needs root. `None` for other extents, and for encoded ones whose
    /// sizes could not be read (then the disk space they take is unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoded: Option<Encoded>,
}

/// The sizes of a compressed extent. FIEMAP reports a compressed extent's
/// file bytes (`length`) from the start of the compressed data on disk
/// (`physical`), so `physical + length` is not where it ends: its end is
/// `physical + disk_length`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Encoded {
    /// Bytes the whole compressed extent takes on disk.
    pub disk_length: u64,
    /// Bytes of the whole extent once decompressed (a file may reference
    /// only part of them).
    pub ram_length: u64,
    /// Where this file's reference starts inside the decompressed extent:
    /// 0 unless it references only a later part (a range cloned out of
    /// the middle of a compressed extent). FIEMAP gives every part the
    /// extent's own address, so this is what tells the parts apart.
    pub offset: u64,
}

/// The flags people care about, by name, in the order [`Extent::flag_names`]
/// lists them.
const FLAG_NAMES: [(u32, &str); 7] = [
    (cowlink_sys::FIEMAP_EXTENT_SHARED, "shared"),
    (cowlink_sys::FIEMAP_EXTENT_UNWRITTEN, "unwritten"),
    (cowlink_sys::FIEMAP_EXTENT_DELALLOC, "delalloc"),
    (cowlink_sys::FIEMAP_EXTENT_DATA_INLINE, "inline"),
    (cowlink_sys::FIEMAP_EXTENT_ENCODED, "encoded"),
    (cowlink_sys::FIEMAP_EXTENT_UNKNOWN, "unknown"),
    (cowlink_sys::FIEMAP_EXTENT_LAST, "last"),
];

impl Extent {
    /// An extent as FIEMAP reports it (no compressed sizes known).
    pub fn new(logical: u64, physical: u64, length: u64, flags: u32) -> Extent {
        Extent {
            logical,
            physical,
            length,
            flags,
            encoded: None,
        }
    }

    /// The blocks are shared with another file (FIEMAP_EXTENT_SHARED).
    pub fn is_shared(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_SHARED != 0
    }

    /// Allocated but unwritten; reads as zeros (FIEMAP_EXTENT_UNWRITTEN).
    pub fn is_unwritten(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_UNWRITTEN != 0
    }

    /// The last extent of the file (FIEMAP_EXTENT_LAST).
    pub fn is_last(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_LAST != 0
    }

    /// Stored inside filesystem metadata, not in data blocks
    /// (FIEMAP_EXTENT_DATA_INLINE; small files on Btrfs).
    pub fn is_inline(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_DATA_INLINE != 0
    }

    /// Whether `physical` is a real, comparable disk address: not inline,
    /// not delayed, not unknown.
    pub fn has_address(&self) -> bool {
        self.flags
            & (cowlink_sys::FIEMAP_EXTENT_DATA_INLINE
                | cowlink_sys::FIEMAP_EXTENT_DELALLOC
                | cowlink_sys::FIEMAP_EXTENT_UNKNOWN)
            == 0
    }

    /// The flags by name: "shared", "unwritten", "delalloc", "inline",
    /// "encoded", "unknown", "last".
    pub fn flag_names(&self) -> Vec<&'static str> {
        FLAG_NAMES
            .iter()
            .filter(|(bit, _)| self.flags & bit != 0)
            .map(|&(_, name)| name)
            .collect()
    }

    /// One past the last byte on the device, for an extent stored as is
    /// (see [`Extent::disk_range`] for compressed ones).
    pub fn physical_end(&self) -> u64 {
        self.physical.saturating_add(self.length)
    }

    /// Stored encoded, i.e. compressed (FIEMAP_EXTENT_ENCODED).
    pub fn is_encoded(&self) -> bool {
        self.flags & cowlink_sys::FIEMAP_EXTENT_ENCODED != 0
    }

    /// The device bytes this extent keeps in use, `[start, end)`: its
    /// physical range when stored as is, the whole compressed extent when
    /// encoded. `None` without an address, or when encoded with sizes that
    /// could not be read.
    pub fn disk_range(&self) -> Option<(u64, u64)> {
        if !self.has_address() {
            return None;
        }
        match (self.is_encoded(), self.encoded) {
            (false, _) => Some((self.physical, self.physical_end())),
            (true, Some(e)) => Some((self.physical, self.physical.saturating_add(e.disk_length))),
            (true, None) => None,
        }
    }

    /// The device bytes this reference would take if it shared nothing:
    /// its length when stored as is; for a compressed extent, its share of
    /// the compressed size (all of it when the file references the whole
    /// extent). `None` when encoded with unknown sizes.
    pub fn disk_cost(&self) -> Option<u64> {
        match (self.is_encoded(), self.encoded) {
            (false, _) => Some(self.length),
            (true, Some(e)) if e.ram_length > 0 => Some(
                ((e.disk_length as u128 * self.length as u128).div_ceil(e.ram_length as u128)
                    as u64)
                    .min(e.disk_length),
            ),
            (true, Some(e)) => Some(e.disk_length),
            (true, None) => None,
        }
    }
}

/// A range of the file with no extent: reads as zeros, takes no space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Hole {
    /// Offset in the file, bytes.
    pub offset: u64,
    /// Length, bytes.
    pub length: u64,
}

/// Where a file's bytes live: its extents and the totals derived from them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileLayout {
    /// The file's size (`st_size`).
    pub size: u64,
    /// Bytes allocated to the file as `stat` reports them (`st_blocks` × 512).
    pub allocated: u64,
    /// The filesystem device (`st_dev`); physical offsets compare only
    /// within one device.
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
    /// Every extent, in file order.
    pub extents: Vec<Extent>,
    /// Every hole inside `[0, size)`, in file order.
    pub holes: Vec<Hole>,
    /// Sum of extent lengths.
    pub mapped_bytes: u64,
    /// Bytes in extents flagged shared.
    pub shared_bytes: u64,
    /// Bytes in unwritten (preallocated) extents.
    pub unwritten_bytes: u64,
    /// Bytes stored inline in metadata.
    pub inline_bytes: u64,
    /// Bytes of `[0, size)` covered by no extent.
    pub hole_bytes: u64,
    /// Physically contiguous runs of extents: 1 for a perfectly contiguous
    /// file, 0 for a file with no extents.
    pub fragments: u64,
    /// Bytes in compressed extents whose size on disk could not be read
    /// (not root): what they share, and with whom, is unknown, and the
    /// sharing figures leave them out.
    pub unknown_disk_bytes: u64,
}

impl FileLayout {
    /// The layout of a file of `size` bytes (`allocated` bytes on disk) with
    /// these extents; computes the totals.
    pub fn from_extents(size: u64, allocated: u64, extents: Vec<Extent>) -> FileLayout {
        let mut layout = FileLayout {
            size,
            allocated,
            dev: 0,
            ino: 0,
            holes: Vec::new(),
            mapped_bytes: 0,
            shared_bytes: 0,
            unwritten_bytes: 0,
            inline_bytes: 0,
            hole_bytes: 0,
            fragments: 0,
            unknown_disk_bytes: 0,
            extents,
        };
        let mut covered = 0u64; // file offset up to which extents were seen
        let mut prev: Option<&Extent> = None;
        for e in &layout.extents {
            layout.mapped_bytes += e.length;
            if e.is_shared() {
                layout.shared_bytes += e.length;
            }
            if e.is_unwritten() {
                layout.unwritten_bytes += e.length;
            }
            if e.is_inline() {
                layout.inline_bytes += e.length;
            }
            if e.has_address() && e.disk_range().is_none() {
                layout.unknown_disk_bytes += e.length;
            }
            let contiguous = prev.is_some_and(|p| {
                e.has_address() && p.disk_range().is_some_and(|(_, end)| end == e.physical)
            });
            if !contiguous {
                layout.fragments += 1;
            }
            if e.logical > covered && covered < size {
                let end = e.logical.min(size);
                layout.holes.push(Hole {
                    offset: covered,
                    length: end - covered,
                });
            }
            covered = covered.max(e.logical.saturating_add(e.length));
            prev = Some(e);
        }
        if covered < size {
            layout.holes.push(Hole {
                offset: covered,
                length: size - covered,
            });
        }
        layout.hole_bytes = layout.holes.iter().map(|h| h.length).sum();
        layout
    }

    /// Whether any block of the file is shared with another file or
    /// snapshot: whether it is (partly) a copy-on-write link.
    pub fn is_cow_link(&self) -> bool {
        self.shared_bytes > 0
    }

    /// The disk ranges `(physical, length)` the file uses, in file order,
    /// with physically contiguous extents merged: two files on the same
    /// blocks have equal runs however their extents are split.
    pub fn physical_runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for e in &self.extents {
            match out.last_mut() {
                Some((p, n)) if *p + *n == e.physical => *n += e.length,
                _ => out.push((e.physical, e.length)),
            }
        }
        out
    }

    /// Shared bytes as a fraction of mapped bytes (0.0 with no extents).
    pub fn shared_fraction(&self) -> f64 {
        if self.mapped_bytes == 0 {
            0.0
        } else {
            self.shared_bytes as f64 / self.mapped_bytes as f64
        }
    }
}

/// All extents of an open file, in file order. FIEMAP with
/// `FIEMAP_FLAG_SYNC` when `sync` (dirty data is written first, so it has
/// an address), repeated until the extent flagged LAST.
///
/// # Errors
/// The kernel's errno: `EOPNOTSUPP` when the filesystem has no FIEMAP
/// (tmpfs, ZFS).
pub fn extents_fd(fd: BorrowedFd<'_>, sync: bool) -> std::result::Result<Vec<Extent>, Errno> {
    let flags = if sync {
        cowlink_sys::FIEMAP_FLAG_SYNC
    } else {
        0
    };
    let mut raw = Vec::new();
    let mut start = 0u64;
    loop {
        let before = raw.len();
        let n = cowlink_sys::fiemap(fd, start, u64::MAX - start, flags, &mut raw)?;
        if n == 0 {
            break;
        }
        let last = raw[raw.len() - 1];
        if last.flags & cowlink_sys::FIEMAP_EXTENT_LAST != 0 || raw.len() == before {
            break;
        }
        start = last.logical + last.length;
    }
    let mut list: Vec<Extent> = raw
        .into_iter()
        .map(|e| Extent::new(e.logical, e.physical, e.length, e.flags))
        .collect();
    if list.iter().any(Extent::is_encoded) {
        encoded_sizes(fd, &mut list);
    }
    Ok(list)
}

/// Fill [`Extent::encoded`] from Btrfs's file extent items (the tree
/// search `compsize` uses). Needs root: without it, or off Btrfs, the
/// sizes stay unknown.
fn encoded_sizes(fd: BorrowedFd<'_>, list: &mut [Extent]) {
    let Ok(st) = cowlink_sys::fstat(fd) else {
        return;
    };
    let Ok(items) = cowlink_sys::btrfs_file_extents(fd, st.st_ino) else {
        return;
    };
    for e in list.iter_mut().filter(|e| e.is_encoded()) {
        // FIEMAP reports a compressed extent at its item's file offset,
        // from the start of its compressed data.
        if let Some(i) = items.iter().find(|i| {
            i.file_offset == e.logical && i.disk_bytenr == e.physical && i.compression != 0
        }) {
            e.encoded = Some(Encoded {
                disk_length: i.disk_num_bytes,
                ram_length: i.ram_bytes,
                offset: i.offset,
            });
        }
    }
}

/// The error for a failed FIEMAP on `path`, with the reason people need.
pub(crate) fn fiemap_error(path: &Path, e: Errno) -> Error {
    let err = Error::from_errno(Operation::Extents, e).with_src(path);
    match e {
        Errno::OPNOTSUPP | Errno::NOTTY | Errno::NOSYS => {
            err.with_kind(ErrorKind::NotSupported).with_reason(format!(
                "{} does not report file extents (no FIEMAP)",
                fs_name(path)
            ))
        }
        _ => err,
    }
}

/// "this filesystem (tmpfs)" for messages; "this filesystem" if unknown.
fn fs_name(path: &Path) -> String {
    match crate::ground::fskind::FsKind::of_path(path) {
        Ok(kind) => format!("this filesystem ({})", kind.name()),
        Err(_) => "this filesystem".into(),
    }
}

/// The layout of the file at `path`: every extent and the totals.
///
/// # Errors
/// `NotFound`, `PermissionDenied`; `IsDirectory` for a directory and
/// `NotRegularFile` for FIFOs, sockets and devices; `NotSupported` when the
/// filesystem has no FIEMAP (tmpfs, ZFS), naming the filesystem.
pub fn extents(path: impl AsRef<Path>) -> Result<FileLayout> {
    let path = path.as_ref();
    let op = Operation::Extents;
    let fd = fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| Error::from_errno(op, e).with_src(path))?;
    let st = cowlink_sys::fstat(&fd).map_err(|e| Error::from_errno(op, e).with_src(path))?;
    match cowlink_sys::file_type(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(Error::new(op, ErrorKind::IsDirectory)
                .with_src(path)
                .with_reason("is a directory; extents are mapped per file"))
        }
        _ => {
            return Err(Error::new(op, ErrorKind::NotRegularFile)
                .with_src(path)
                .with_reason(format!(
                    "is a {}, which has no extents",
                    crate::prim::files::file_type_name(st.st_mode)
                )))
        }
    }
    let list = extents_fd(fd.as_fd(), true).map_err(|e| fiemap_error(path, e))?;
    let mut layout = FileLayout::from_extents(st.st_size as u64, st.st_blocks as u64 * 512, list);
    layout.dev = st.st_dev;
    layout.ino = st.st_ino;
    Ok(layout)
}

/// One file reference to a Btrfs data extent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileRef {
    /// The subvolume (tree id) holding the file.
    pub root: u64,
    /// The file's inode number in that subvolume.
    pub inode: u64,
    /// Offset in that file where the referencing range starts.
    pub offset: u64,
    /// The file's names, when asked for and when the file is in the same
    /// subvolume as the one asked about (empty otherwise).
    #[serde(flatten, serialize_with = "crate::name::json::paths")]
    pub paths: Vec<PathBuf>,
}

/// For each extent of `layout` (the file at `path`, on Btrfs), every file
/// reference that points at its first byte: the file itself, its clones,
/// snapshots. An extent cloned three times has four references. Extents
/// without an address (inline, delayed) get an empty list.
///
/// Commits the filesystem's pending transaction first (`syncfs`), since the
/// kernel answers from the committed state.
///
/// With `paths`, the references in the file's own subvolume are resolved
/// to names (absolute when the subvolume's root directory is reachable
/// above `path`, else relative to it).
///
/// # Errors
/// `PermissionDenied` without root (the kernel requires `CAP_SYS_ADMIN`),
/// `NotSupported` off Btrfs.
pub fn btrfs_refs(
    path: impl AsRef<Path>,
    layout: &FileLayout,
    paths: bool,
) -> Result<Vec<Vec<FileRef>>> {
    let path = path.as_ref();
    let op = Operation::Extents;
    let err = |e: Errno| {
        let err = Error::from_errno(op, e).with_src(path);
        match e {
            Errno::PERM | Errno::ACCESS => {
                err.with_reason("Btrfs answers reference queries only to root (CAP_SYS_ADMIN)")
            }
            Errno::NOTTY | Errno::OPNOTSUPP => {
                err.with_kind(ErrorKind::NotSupported).with_reason(format!(
                    "reference counts come from Btrfs and {} is not Btrfs; \
                     give all the files to compare instead",
                    fs_name(path)
                ))
            }
            _ => err,
        }
    };
    let fd = fs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(err)?;
    let own_root = cowlink_sys::btrfs_root_id(fd.as_fd()).map_err(err)?;
    // Back references are read from the last committed transaction:
    // commit first, so clones made a moment ago are counted.
    cowlink_sys::sync_filesystem(fd.as_fd()).map_err(err)?;
    let base = if paths { subvolume_root(path) } else { None };
    let mut names = std::collections::HashMap::<u64, Vec<PathBuf>>::new();
    let mut out = Vec::with_capacity(layout.extents.len());
    for e in &layout.extents {
        if !e.has_address() {
            out.push(Vec::new());
            continue;
        }
        let mut size = 64 << 10;
        let raw = loop {
            match cowlink_sys::btrfs_logical_ino(fd.as_fd(), e.physical, size) {
                Ok((refs, missing)) if missing > 0 && size < cowlink_sys::BTRFS_LOGICAL_INO_MAX => {
                    size = (size + missing as usize + 4096).min(cowlink_sys::BTRFS_LOGICAL_INO_MAX);
                    drop(refs);
                }
                Ok((refs, _)) => break refs,
                // The extent went away between FIEMAP and now.
                Err(Errno::NOENT) => break Vec::new(),
                Err(e) => return Err(err(e)),
            }
        };
        let mut refs: Vec<FileRef> = raw
            .into_iter()
            .map(|r| FileRef {
                root: r.root,
                inode: r.inode,
                offset: r.offset,
                paths: Vec::new(),
            })
            .collect();
        refs.sort_by_key(|r| (r.root, r.inode, r.offset));
        if paths {
            for r in refs.iter_mut().filter(|r| r.root == own_root) {
                if let Some(known) = names.get(&r.inode) {
                    r.paths = known.clone();
                    continue;
                }
                let found: Vec<PathBuf> = match cowlink_sys::btrfs_ino_paths(fd.as_fd(), r.inode) {
                    Ok(list) => list
                        .into_iter()
                        .map(|p| {
                            let rel = PathBuf::from(std::ffi::OsString::from_vec(p));
                            match &base {
                                Some(b) => b.join(rel),
                                None => rel,
                            }
                        })
                        .collect(),
                    Err(Errno::NOENT) => Vec::new(),
                    Err(e) => return Err(err(e)),
                };
                r.paths = found.clone();
                names.insert(r.inode, found);
            }
        }
        out.push(refs);
    }
    Ok(out)
}

/// The directory above `path` that is the root of its Btrfs subvolume
/// (inode 256 on the same device), if it is reachable.
fn subvolume_root(path: &Path) -> Option<PathBuf> {
    let abs = std::fs::canonicalize(path).ok()?;
    let dev = cowlink_sys::stat(&abs).ok()?.st_dev;
    let mut dir = abs.parent()?;
    loop {
        let st = cowlink_sys::stat(dir).ok()?;
        if st.st_dev != dev {
            return None;
        }
        if st.st_ino == 256 {
            return Some(dir.to_path_buf());
        }
        dir = dir.parent()?;
    }
}

/// One extent of a file in the set whose physical range overlaps an
/// extent of another (or the same) file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    /// Index of the other file in the set.
    pub file: usize,
    /// Index of its extent.
    pub extent: usize,
    /// Bytes the two extents have in common on disk.
    pub bytes: u64,
}

/// How much of one file's blocks another file of the set uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedBytes {
    /// Index of the other file in the set.
    pub file: usize,
    /// Bytes of this file's blocks it also maps.
    pub bytes: u64,
}

/// What one file of a set shares with the others ([`shared_within`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSharing {
    /// Per extent of the file (same order as [`FileLayout::extents`]), the
    /// extents of the set that overlap it physically.
    pub extents: Vec<Vec<Overlap>>,
}

impl FileSharing {
    /// The other files this file (at index `me`) shares blocks with, and
    /// how many bytes with each, largest first (ties by index).
    pub fn per_file(&self, me: usize) -> Vec<SharedBytes> {
        let mut by_file: std::collections::BTreeMap<usize, u64> = Default::default();
        for o in self.extents.iter().flatten().filter(|o| o.file != me) {
            *by_file.entry(o.file).or_default() += o.bytes;
        }
        let mut v: Vec<SharedBytes> = by_file
            .into_iter()
            .map(|(file, bytes)| SharedBytes { file, bytes })
            .collect();
        v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.file.cmp(&b.file)));
        v
    }

    /// How many files of the set (this one, at index `me`, included) use
    /// the blocks of extent `extent`.
    pub fn files_using(&self, me: usize, extent: usize) -> usize {
        let mut files: Vec<usize> = self.extents[extent]
            .iter()
            .map(|o| o.file)
            .filter(|&f| f != me)
            .collect();
        files.sort_unstable();
        files.dedup();
        1 + files.len()
    }
}

/// Sharing inside a set of files, found by matching physical ranges (works
/// on every FIEMAP filesystem, needs no privileges, sees only the given
/// files): one [`FileSharing`] per layout, listing for each extent the
/// extents of the set whose physical ranges overlap it on the same device.
/// A file cloned within itself lists its own other extents too.
pub fn shared_within(layouts: &[FileLayout]) -> Vec<FileSharing> {
    let mut out: Vec<FileSharing> = layouts
        .iter()
        .map(|l| FileSharing {
            extents: vec![Vec::new(); l.extents.len()],
        })
        .collect();
    /// An extent with an address, swept in (device, start) order.
    #[derive(PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
    struct Item {
        dev: u64,
        start: u64,
        end: u64,
        file: usize,
        extent: usize,
    }
    let mut items: Vec<Item> = Vec::new();
    for (file, l) in layouts.iter().enumerate() {
        for (extent, e) in l.extents.iter().enumerate() {
            match e.disk_range() {
                Some((start, end)) if end > start => items.push(Item {
                    dev: l.dev,
                    start,
                    end,
                    file,
                    extent,
                }),
                _ => {}
            }
        }
    }
    items.sort_unstable();
    let mut active: Vec<Item> = Vec::new();
    for item in items {
        active.retain(|a| a.dev == item.dev && a.end > item.start);
        for a in &active {
            let bytes = a.end.min(item.end) - item.start;
            out[item.file].extents[item.extent].push(Overlap {
                file: a.file,
                extent: a.extent,
                bytes,
            });
            out[a.file].extents[a.extent].push(Overlap {
                file: item.file,
                extent: item.extent,
                bytes,
            });
        }
        active.push(item);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cowlink_sys::{FIEMAP_EXTENT_LAST as LAST, FIEMAP_EXTENT_SHARED as SHARED};

    #[test]
    fn totals_holes_and_fragments() {
        // [0,4K) at 100K, hole [4K,8K), [8K,12K) at 104K (contiguous with
        // the first physically), [12K,16K) shared at 200K, tail hole to 20K.
        let l = FileLayout::from_extents(
            20 << 10,
            12 << 10,
            vec![
                Extent::new(0, 100 << 10, 4 << 10, 0),
                Extent::new(8 << 10, 104 << 10, 4 << 10, 0),
                Extent::new(12 << 10, 200 << 10, 4 << 10, SHARED | LAST),
            ],
        );
        assert_eq!(l.mapped_bytes, 12 << 10);
        assert_eq!(l.shared_bytes, 4 << 10);
        assert_eq!(
            l.holes,
            vec![
                Hole {
                    offset: 4 << 10,
                    length: 4 << 10
                },
                Hole {
                    offset: 16 << 10,
                    length: 4 << 10
                }
            ]
        );
        assert_eq!(l.hole_bytes, 8 << 10);
        assert_eq!(l.fragments, 2);
        assert!(l.is_cow_link());
        assert_eq!(l.extents[2].flag_names(), vec!["shared", "last"]);
    }

    #[test]
    fn empty_and_fully_sparse_files() {
        let l = FileLayout::from_extents(0, 0, Vec::new());
        assert_eq!((l.fragments, l.hole_bytes, l.holes.len()), (0, 0, 0));
        let l = FileLayout::from_extents(1 << 20, 0, Vec::new());
        assert_eq!(l.hole_bytes, 1 << 20);
        assert!(!l.is_cow_link());
    }

    #[test]
    fn extents_past_eof_make_no_negative_hole() {
        // Preallocated beyond EOF (fallocate KEEP_SIZE).
        let l = FileLayout::from_extents(1000, 8192, vec![Extent::new(0, 0, 8192, LAST)]);
        assert_eq!(l.hole_bytes, 0);
    }

    #[test]
    fn sharing_within_a_set_matches_overlapping_ranges() {
        let mut a =
            FileLayout::from_extents(8192, 8192, vec![Extent::new(0, 1 << 20, 8192, SHARED)]);
        let mut b = FileLayout::from_extents(
            8192,
            8192,
            vec![
                Extent::new(0, 1 << 20, 4096, SHARED),
                Extent::new(4096, 5 << 20, 4096, 0),
            ],
        );
        let mut c =
            FileLayout::from_extents(4096, 4096, vec![Extent::new(0, 1 << 20, 4096, SHARED)]);
        a.dev = 1;
        b.dev = 1;
        c.dev = 2; // other filesystem: same numbers mean nothing
        let s = shared_within(&[a, b, c]);
        let o = |file, extent, bytes| Overlap {
            file,
            extent,
            bytes,
        };
        assert_eq!(s[0].extents[0], vec![o(1, 0, 4096)]);
        assert_eq!(s[1].extents[0], vec![o(0, 0, 4096)]);
        assert!(s[1].extents[1].is_empty());
        assert!(s[2].extents[0].is_empty());
        assert_eq!(
            s[0].per_file(0),
            vec![SharedBytes {
                file: 1,
                bytes: 4096
            }]
        );
        assert_eq!(s[1].files_using(1, 0), 2);
        assert_eq!(s[1].files_using(1, 1), 1);
        assert!(s[2].per_file(2).is_empty());
    }
}
