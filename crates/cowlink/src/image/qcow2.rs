//! A reader of qcow2 metadata: the header, its extensions, the L1 and L2
//! tables, and nothing else (no refcounts, no snapshots, no writing).
//!
//! Image files are untrusted input. Every offset is checked against the
//! file's length and the cluster alignment the format requires, table sizes
//! against what the virtual size needs, and every host cluster may be used
//! once only (data, L2 tables, the L1 table, the header); anything else is
//! an [`ErrorKind::Corrupt`] error that names the image and the fault,
//! found before anything is written.
//!
//! Layout facts (QEMU's `docs/interop/qcow2.txt`): big-endian header with
//! magic `QFI\xfb`; version 2 or 3; `cluster_bits` 9..=21; L1 entries hold
//! an L2 table's offset in bits 9..=55; L2 entries hold a data cluster's
//! offset in bits 9..=55 and, in version 3, bit 0 "reads as zero"; bit 62
//! marks a compressed cluster, whose descriptor packs host offset and
//! length; with extended L2 entries (incompatible bit 4) each entry has a
//! second word of two 32-bit subcluster bitmaps (allocated low, zero high).
//! With an external data file (incompatible bit 2, its name in header
//! extension `0x44415441`) data clusters live in that file, each at its
//! guest offset; offset 0 is told from "unallocated" by bit 63 (`COPIED`),
//! and compressed clusters cannot occur.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::ground::error::{Error, ErrorKind, Operation};

const MAGIC: u32 = 0x5146_49fb;
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const COMPRESSED: u64 = 1 << 62;
/// L2 bit 63: the cluster's refcount is 1 (with an external data file, it
/// tells a cluster at host offset 0 from an unallocated one).
const COPIED: u64 = 1 << 63;
/// QEMU's largest L1 table: 32 MiB (`QCOW_MAX_L1_SIZE`), 4 Mi entries.
const L1_LIMIT: u64 = (32 << 20) / 8;
/// Virtual sizes beyond this are refused (qcow2's own limit is 2^61;
/// nothing real comes near 2^56, 64 PiB).
const SIZE_LIMIT: u64 = 1 << 56;

/// The incompatible feature bits this reader understands.
const INCOMPAT_DIRTY: u64 = 1;
const INCOMPAT_CORRUPT: u64 = 2;
const INCOMPAT_DATA_FILE: u64 = 4;
const INCOMPAT_COMPRESSION: u64 = 8;
const INCOMPAT_EXTL2: u64 = 16;

/// Where the bytes of one guest range come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceSource {
    /// Stored uncompressed in the image file at this host offset.
    Data {
        /// Host offset of the range's first byte.
        host: u64,
    },
    /// One compressed cluster: `len` bytes at host offset `host` inflate
    /// to the cluster.
    Compressed {
        /// Host offset of the compressed bytes.
        host: u64,
        /// Upper bound of their length.
        len: u64,
    },
    /// Reads as zeros (a zero cluster or subcluster).
    Zero,
    /// Not allocated here: reads from the backing image.
    Unallocated,
}

/// One guest range of an image and where its bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Guest (virtual disk) offset.
    pub guest: u64,
    /// Length in bytes.
    pub len: u64,
    /// Where the bytes come from.
    pub source: PieceSource,
    /// Whether the range is smaller than a cluster because of extended L2
    /// subclusters (reported apart: such ranges are seldom clonable).
    pub subcluster: bool,
}

/// An external data file: where an image's data clusters are.
#[derive(Debug)]
struct DataFile {
    path: PathBuf,
    file: File,
    len: u64,
}

/// A parsed qcow2 image.
#[derive(Debug)]
pub struct Qcow2 {
    path: PathBuf,
    file: File,
    file_len: u64,
    /// Virtual disk size in bytes (whole 512-byte sectors, as QEMU counts
    /// it: a header size that is not a multiple of 512 is cut down).
    pub size: u64,
    /// log2 of the cluster size.
    pub cluster_bits: u32,
    /// Extended L2 entries (32 subclusters per cluster).
    pub extended_l2: bool,
    /// qcow2 version (2 or 3).
    pub version: u32,
    /// The backing file's name as the header gives it (relative names are
    /// relative to the image's directory) and its format, if named.
    /// Untrusted text: resolve it through the image module's one rule
    /// for names an image carries, never by hand.
    pub backing: Option<(String, Option<String>)>,
    /// The external data file's name as the header extension gives it,
    /// when the image keeps its data in one (untrusted, as `backing`).
    pub data_name: Option<String>,
    l1: Vec<u64>,
    l1_offset: u64,
    /// Compressed clusters are zstd frames (else raw deflate, zlib's).
    zstd: bool,
    /// The external data file, once attached.
    data: Option<DataFile>,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether `head` (a file's first bytes) starts with the qcow2 magic.
pub fn has_magic(head: &[u8]) -> bool {
    head.len() >= 4 && be32(head, 0) == MAGIC
}

/// The host clusters in use, so that a cluster serving twice (an L2
/// table, a data cluster, the L1 table, the header) is found when its
/// second use is met. One bit per cluster of the file while that is at
/// most [`BITMAP_LIMIT`] bits; beyond (a huge, probably sparse, file of
/// small clusters) a set of the clusters actually claimed, each claim
/// being an entry read from the file. Either way memory follows what the
/// file holds, not what its header claims.
enum Used {
    Bits(Vec<u64>, u64, u32),
    Set(std::collections::HashSet<u64>, u64, u32),
}

/// The largest bitmap of clusters kept (16 MiB).
const BITMAP_LIMIT: u64 = 1 << 27;

impl Used {
    fn new(file_len: u64, cluster_bits: u32) -> Used {
        let n = file_len.div_ceil(1 << cluster_bits);
        if n <= BITMAP_LIMIT {
            Used::Bits(vec![0; n.div_ceil(64) as usize], n, cluster_bits)
        } else {
            Used::Set(Default::default(), n, cluster_bits)
        }
    }

    /// Claim the cluster at `host` (aligned, inside the file) for `what`.
    fn claim(&mut self, host: u64, what: &str) -> Result<(), String> {
        let twice = || {
            format!(
                "{what} at {host:#x} uses a host cluster already in use (the header, the L1 \
                 table, an L2 table or a data cluster)"
            )
        };
        let past = || format!("{what} at {host:#x} is past the end of the file");
        match self {
            Used::Bits(bits, n, cluster_bits) => {
                let i = host >> *cluster_bits;
                if i >= *n {
                    return Err(past());
                }
                let (w, b) = ((i / 64) as usize, i % 64);
                match bits.get_mut(w) {
                    Some(word) if *word & (1 << b) != 0 => Err(twice()),
                    Some(word) => {
                        *word |= 1 << b;
                        Ok(())
                    }
                    None => Err(past()),
                }
            }
            Used::Set(set, n, cluster_bits) => {
                let i = host >> *cluster_bits;
                if i >= *n {
                    return Err(past());
                }
                match set.insert(i) {
                    true => Ok(()),
                    false => Err(twice()),
                }
            }
        }
    }
}

impl Qcow2 {
    /// Whether the file at `path` starts with the qcow2 magic.
    pub fn is_qcow2(path: impl AsRef<Path>) -> std::io::Result<bool> {
        let path = path.as_ref();
        let f = File::open(path)?;
        let mut b = [0u8; 4];
        Ok(f.read_exact_at(&mut b, 0).is_ok() && has_magic(&b))
    }

    /// Open and check the image at `path` (header, extensions, L1 table).
    /// The external data file, if the image names one, is not opened:
    /// [`Qcow2::attach_data`] gives it.
    pub fn open(path: impl AsRef<Path>) -> Result<Qcow2, Error> {
        let path = path.as_ref();
        let io = |e: std::io::Error| Error::from_io(Operation::Image, &e).with_src(path);
        let file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        Qcow2::from_file(path, file, file_len)
    }

    /// Check the image in `file` (opened from `path`, `file_len` bytes
    /// long): header, extensions, L1 table.
    pub fn from_file(path: &Path, file: File, file_len: u64) -> Result<Qcow2, Error> {
        let io = |e: std::io::Error| Error::from_io(Operation::Image, &e).with_src(path);
        let corrupt = |why: String| {
            Error::new(Operation::Image, ErrorKind::Corrupt)
                .with_src(path)
                .with_reason(why)
        };
        let mut h = [0u8; 104];
        let have = file_len.min(104) as usize;
        file.read_exact_at(&mut h[..have], 0).map_err(io)?;
        if have < 72 || be32(&h, 0) != MAGIC {
            return Err(corrupt(
                "not a qcow2 image (no QFI\\xfb magic at offset 0)".into(),
            ));
        }
        let version = be32(&h, 4);
        if !(2..=3).contains(&version) {
            return Err(corrupt(format!(
                "qcow2 version {version} (only 2 and 3 exist)"
            )));
        }
        let backing_offset = be64(&h, 8);
        let backing_len = be32(&h, 16) as u64;
        let cluster_bits = be32(&h, 20);
        if !(9..=21).contains(&cluster_bits) {
            return Err(corrupt(format!(
                "cluster_bits {cluster_bits} (must be 9 to 21)"
            )));
        }
        let cluster = 1u64 << cluster_bits;
        let size = be64(&h, 24);
        if size > SIZE_LIMIT {
            return Err(corrupt(format!("virtual size {size} is absurd")));
        }
        // QEMU counts whole sectors (total_sectors = size / 512).
        let size = size / 512 * 512;
        let crypt = be32(&h, 32);
        if crypt != 0 {
            return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                .with_src(path)
                .with_reason("the image is encrypted; its clusters cannot be cloned as they are"));
        }
        let l1_size = be32(&h, 36) as u64;
        let l1_offset = be64(&h, 40);
        let (incompat, header_len, compression) = if version == 3 {
            if have < 104 {
                return Err(corrupt("truncated version 3 header".into()));
            }
            let header_len = be32(&h, 100) as u64;
            // As QEMU: the version 3 header is at least 104 bytes and
            // fits the first cluster.
            if header_len < 104 || header_len > cluster || header_len > file_len {
                return Err(corrupt(format!(
                    "header_length {header_len} (a version 3 header is 104 bytes or more, \
                     inside the first cluster of {cluster} bytes and the file)"
                )));
            }
            let compression = if header_len > 104 {
                let mut c = [0u8; 1];
                file.read_exact_at(&mut c, 104).map_err(io)?;
                c[0]
            } else {
                0
            };
            (be64(&h, 72), header_len, compression)
        } else {
            (0, 72, 0)
        };
        if incompat & INCOMPAT_DIRTY != 0 {
            return Err(Error::new(Operation::Image, ErrorKind::InUse)
                .with_src(path)
                .with_reason("the image is marked dirty: it is open in QEMU, or QEMU did not close it cleanly (`qemu-img check -r all` repairs it)"));
        }
        if incompat & INCOMPAT_CORRUPT != 0 {
            return Err(corrupt("the image is marked corrupt by QEMU".into()));
        }
        let unknown = incompat
            & !(INCOMPAT_DIRTY
                | INCOMPAT_CORRUPT
                | INCOMPAT_DATA_FILE
                | INCOMPAT_COMPRESSION
                | INCOMPAT_EXTL2);
        if unknown != 0 {
            return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                .with_src(path)
                .with_reason(format!("unknown incompatible qcow2 features {unknown:#x}")));
        }
        // The compression type counts only with its incompatible bit.
        let zstd = match (incompat & INCOMPAT_COMPRESSION != 0, compression) {
            (false, _) | (true, 0) => false,
            (true, 1) => true,
            (true, other) => {
                return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                    .with_src(path)
                    .with_reason(format!(
                        "unknown compression type {other} (qcow2 knows 0, zlib, and 1, zstd)"
                    )))
            }
        };
        let extended_l2 = incompat & INCOMPAT_EXTL2 != 0;
        if extended_l2 && cluster_bits < 14 {
            return Err(corrupt(
                "extended L2 entries need clusters of 16 KiB or more".into(),
            ));
        }
        // L1: enough entries for the virtual size, at most QEMU's 32 MiB
        // table, inside the file.
        let l2_entries = cluster / if extended_l2 { 16 } else { 8 };
        let per_l1 = l2_entries * cluster;
        let needed = size.div_ceil(per_l1);
        if l1_size < needed || l1_size > L1_LIMIT {
            return Err(corrupt(format!(
                "L1 table of {l1_size} entries for a virtual size that needs {needed} \
                 (QEMU allows at most {L1_LIMIT})"
            )));
        }
        let l1_end = l1_offset.checked_add(l1_size * 8);
        if l1_offset % cluster != 0 || l1_offset == 0 || l1_end.is_none_or(|e| e > file_len) {
            return Err(corrupt(format!(
                "L1 table at {l1_offset:#x} is misaligned or past the end of the file ({file_len} bytes)"
            )));
        }
        let mut raw = vec![0u8; (l1_size * 8) as usize];
        file.read_exact_at(&mut raw, l1_offset).map_err(io)?;
        let l1: Vec<u64> = raw.chunks_exact(8).map(|c| be64(c, 0)).collect();
        drop(raw);
        // As QEMU: the extensions end where the backing file name starts,
        // else at the end of the first cluster.
        let ext_end = match backing_offset {
            0 => cluster,
            off => off.min(cluster),
        };
        let ext = extensions(&file, header_len, file_len, ext_end).map_err(corrupt)?;
        let data_name =
            match (incompat & INCOMPAT_DATA_FILE != 0, ext.data_file) {
                (false, _) => None,
                (true, None) => return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                    .with_src(path)
                    .with_reason(
                        "the image keeps its data in an external data file but does not name it \
                         (QEMU is told it with data-file= at run time); name it in the image with \
                         qemu-img amend -o data_file=FILE",
                    )),
                (true, Some(name)) => Some(name),
            };
        // Backing file name (inside the first cluster, at most 1023 bytes,
        // as QEMU reads it) and format.
        let backing = if backing_offset != 0 {
            let end = backing_offset.checked_add(backing_len);
            if backing_len == 0
                || backing_len > 1023
                || end.is_none_or(|e| e > file_len.min(cluster))
            {
                return Err(corrupt(format!(
                    "backing file name of {backing_len} bytes at {backing_offset:#x} is empty, \
                     longer than 1023 bytes or outside the first cluster"
                )));
            }
            let mut name = vec![0u8; backing_len as usize];
            file.read_exact_at(&mut name, backing_offset).map_err(io)?;
            let name = String::from_utf8(name)
                .ok()
                .filter(|n| !n.contains('\0'))
                .ok_or_else(|| corrupt("backing file name is not UTF-8 or holds a NUL".into()))?;
            Some((name, ext.backing_format))
        } else {
            None
        };
        Ok(Qcow2 {
            path: path.to_path_buf(),
            file,
            file_len,
            size,
            cluster_bits,
            extended_l2,
            version,
            backing,
            data_name,
            l1,
            l1_offset,
            zstd,
            data: None,
        })
    }

    /// Give the image its external data file (`file`, opened from `path`,
    /// `len` bytes long), the one [`Qcow2::data_name`] names.
    pub fn attach_data(&mut self, path: PathBuf, file: File, len: u64) {
        self.data = Some(DataFile { path, file, len });
    }

    /// The cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// The image file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The image's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where [`PieceSource::Data`] offsets point: the external data file, if
    /// the image has one, else the image file itself.
    pub fn data_file(&self) -> (&Path, &File) {
        match &self.data {
            Some(d) => (&d.path, &d.file),
            None => (&self.path, &self.file),
        }
    }

    /// The external data file's path, if the image has one attached.
    pub fn external_data(&self) -> Option<&Path> {
        self.data.as_ref().map(|d| d.path.as_path())
    }

    /// Every guest range of the image, collected: [`Qcow2::walk`] into a
    /// vector (memory grows with the number of ranges; the image module
    /// walks instead).
    pub fn map(&self) -> Result<Vec<Piece>, Error> {
        let mut v = Vec::new();
        self.walk(&mut |p| {
            v.push(p);
            Ok(())
        })?;
        Ok(v)
    }

    /// Call `f` with every guest range of the image and where its bytes
    /// come from, in guest order, adjacent ranges of one kind (and
    /// contiguous on the host) merged. Checks every L2 table and data
    /// offset on the way, and that no host cluster serves twice, as it
    /// goes: memory is one L2 table and one bit per host cluster, whatever
    /// the image claims. An error from `f` stops the walk.
    pub fn walk(&self, f: &mut dyn FnMut(Piece) -> Result<(), Error>) -> Result<(), Error> {
        let cluster = self.cluster_size();
        let corrupt = |why: String| {
            Error::new(Operation::Image, ErrorKind::Corrupt)
                .with_src(&self.path)
                .with_reason(why)
        };
        let io = |e: std::io::Error| Error::from_io(Operation::Image, &e).with_src(&self.path);
        if self.data_name.is_some() && self.data.is_none() {
            return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                .with_src(&self.path)
                .with_reason("the image's external data file is not open"));
        }
        let entry_len = if self.extended_l2 { 16 } else { 8 };
        let l2_entries = cluster / entry_len;
        let mut used = Used::new(self.file_len, self.cluster_bits);
        used.claim(0, "the header").map_err(corrupt)?;
        let l1_bytes = self.l1.len() as u64 * 8;
        for k in 0..l1_bytes.div_ceil(cluster) {
            used.claim(self.l1_offset + k * cluster, "the L1 table")
                .map_err(corrupt)?;
        }
        let mut pending: Option<Piece> = None;
        let mut push = |p: Piece| -> Result<(), Error> {
            if let Some(last) = pending.as_mut() {
                let contiguous =
                    last.guest + last.len == p.guest && last.subcluster == p.subcluster;
                let merged = match (last.source, p.source) {
                    (PieceSource::Data { host: a }, PieceSource::Data { host: b }) => {
                        a + last.len == b
                    }
                    (PieceSource::Zero, PieceSource::Zero)
                    | (PieceSource::Unallocated, PieceSource::Unallocated) => true,
                    _ => false,
                };
                if contiguous && merged {
                    last.len += p.len;
                    return Ok(());
                }
            }
            match pending.replace(p) {
                Some(done) => f(done),
                None => Ok(()),
            }
        };
        // Data that starts inside the file and runs past its end reads
        // as zeros beyond it, as QEMU reads it (the last host cluster of
        // an extended-L2 image is often written only in part).
        let file_len = self.file_len;
        let data_len = self.data.as_ref().map_or(file_len, |d| d.len);
        let data = |push: &mut dyn FnMut(Piece) -> Result<(), Error>,
                    guest: u64,
                    len: u64,
                    host: u64,
                    subcluster: bool|
         -> Result<(), Error> {
            let inside = data_len.saturating_sub(host).min(len);
            if inside > 0 {
                push(Piece {
                    guest,
                    len: inside,
                    source: PieceSource::Data { host },
                    subcluster,
                })?;
            }
            if inside < len {
                push(Piece {
                    guest: guest + inside,
                    len: len - inside,
                    source: PieceSource::Zero,
                    subcluster,
                })?;
            }
            Ok(())
        };
        let mut table = vec![0u8; cluster as usize];
        for (i, &l1e) in self.l1.iter().enumerate() {
            let base = i as u64 * l2_entries * cluster;
            if base >= self.size {
                break;
            }
            let span = (l2_entries * cluster).min(self.size - base);
            let l2_off = l1e & OFFSET_MASK;
            if l2_off == 0 {
                push(Piece {
                    guest: base,
                    len: span,
                    source: PieceSource::Unallocated,
                    subcluster: false,
                })?;
                continue;
            }
            if l2_off % cluster != 0 || l2_off + cluster > self.file_len {
                return Err(corrupt(format!(
                    "L1 entry {i} points to an L2 table at {l2_off:#x}, misaligned or past the end of the file"
                )));
            }
            used.claim(l2_off, &format!("the L2 table of L1 entry {i}"))
                .map_err(corrupt)?;
            self.file.read_exact_at(&mut table, l2_off).map_err(io)?;
            let count = span.div_ceil(cluster);
            for j in 0..count {
                let guest = base + j * cluster;
                let len = cluster.min(self.size - guest);
                let at = (j * entry_len) as usize;
                let e = be64(&table, at);
                let bitmap = if self.extended_l2 {
                    be64(&table, at + 8)
                } else {
                    0
                };
                if e & COMPRESSED != 0 && self.data.is_some() {
                    return Err(corrupt(format!(
                        "the cluster at guest {guest:#x} is compressed, which an image with an external data file cannot have"
                    )));
                }
                if e & COMPRESSED != 0 {
                    let x = 62 - (self.cluster_bits - 8);
                    let host = e & ((1u64 << x) - 1);
                    let sectors = ((e >> x) & ((1u64 << (self.cluster_bits - 8)) - 1)) + 1;
                    let clen = sectors * 512 - (host & 511);
                    if host >= self.file_len {
                        return Err(corrupt(format!(
                            "compressed cluster at guest {guest:#x} points past the end of the file"
                        )));
                    }
                    push(Piece {
                        guest,
                        len,
                        source: PieceSource::Compressed {
                            host,
                            len: clen.min(self.file_len - host),
                        },
                        subcluster: false,
                    })?;
                    continue;
                }
                let host = e & OFFSET_MASK;
                let zero = e & 1 != 0;
                if zero && self.version == 2 {
                    // QEMU: "Zero cluster entry found in pre-v3 image".
                    return Err(corrupt(format!(
                        "the cluster at guest {guest:#x} has the zero flag, which a version 2 \
                         image cannot have"
                    )));
                }
                // In a data file offset 0 is a cluster like any other.
                let has_host = host != 0 || (self.data.is_some() && e & COPIED != 0);
                if has_host {
                    match &self.data {
                        None if host % cluster != 0 || host >= self.file_len => {
                            return Err(corrupt(format!(
                                "the cluster at guest {guest:#x} points to {host:#x}, misaligned or past the end of the file ({} bytes)",
                                self.file_len
                            )));
                        }
                        None => used
                            .claim(host, &format!("the data cluster of guest {guest:#x}"))
                            .map_err(corrupt)?,
                        Some(d) if host != guest || host >= d.len => {
                            return Err(corrupt(format!(
                                "the cluster at guest {guest:#x} points to {host:#x} of the external data file {} ({} bytes); it must be the same offset, inside the file",
                                crate::name::quoted(&d.path),
                                d.len
                            )));
                        }
                        Some(_) => {}
                    }
                }
                if !self.extended_l2 {
                    if zero {
                        push(Piece {
                            guest,
                            len,
                            source: PieceSource::Zero,
                            subcluster: false,
                        })?;
                    } else if has_host {
                        data(&mut push, guest, len, host, false)?;
                    } else {
                        push(Piece {
                            guest,
                            len,
                            source: PieceSource::Unallocated,
                            subcluster: false,
                        })?;
                    }
                    continue;
                }
                // 32 subclusters: allocated (low bits), zero (high bits).
                let sub = cluster / 32;
                let (alloc, zeros) = (bitmap as u32, (bitmap >> 32) as u32);
                if alloc & zeros != 0 {
                    return Err(corrupt(format!(
                        "the cluster at guest {guest:#x} has subclusters both allocated and zero"
                    )));
                }
                if alloc != 0 && !has_host {
                    return Err(corrupt(format!(
                        "the cluster at guest {guest:#x} has allocated subclusters but no host cluster"
                    )));
                }
                let whole = alloc == u32::MAX || zeros == u32::MAX || (alloc == 0 && zeros == 0);
                for k in 0..32u64 {
                    let g = guest + k * sub;
                    if g >= guest + len {
                        break;
                    }
                    let l = sub.min(guest + len - g);
                    if alloc >> k & 1 != 0 {
                        data(&mut push, g, l, host + k * sub, !whole)?;
                        continue;
                    }
                    let source = if zeros >> k & 1 != 0 {
                        PieceSource::Zero
                    } else {
                        PieceSource::Unallocated
                    };
                    push(Piece {
                        guest: g,
                        len: l,
                        source,
                        subcluster: !whole,
                    })?;
                }
            }
        }
        if let Some(last) = pending.take() {
            f(last)?;
        }
        Ok(())
    }

    /// Read one compressed cluster (`len` bytes at `host`) and inflate it
    /// into `out` (one cluster long).
    pub fn inflate(&self, host: u64, len: u64, out: &mut [u8]) -> Result<(), Error> {
        let mut raw = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut raw, host)
            .map_err(|e| Error::from_io(Operation::Image, &e).with_src(&self.path))?;
        let whole = if self.zstd {
            unzstd(&raw, out)
        } else {
            let mut d = flate2::Decompress::new(false);
            let r = d.decompress(&raw, out, flate2::FlushDecompress::Finish);
            r.is_ok() && d.total_out() as usize == out.len()
        };
        match whole {
            true => Ok(()),
            false => Err(Error::new(Operation::Image, ErrorKind::Corrupt)
                .with_src(&self.path)
                .with_reason(format!(
                    "the compressed cluster at {host:#x} does not inflate to one cluster"
                ))),
        }
    }
}

/// Fill `out` from the zstd frames at the start of `raw`, as QEMU writes a
/// compressed cluster: one frame or more, then padding up to the sector
/// (never read, since decoding stops when `out` is full). False when the
/// frames are broken or end before `out` is full. A frame may not ask for
/// a window above [`ZSTD_WINDOW_LIMIT`] (the input is untrusted; QEMU's
/// frames need at most the 2 MiB of its largest cluster).
fn unzstd(raw: &[u8], out: &mut [u8]) -> bool {
    use std::io::Read;
    let mut src = raw;
    let mut got = 0;
    while got < out.len() {
        let Ok(mut frame) = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(
            &mut src,
            ZSTD_WINDOW_LIMIT,
        ) else {
            return false;
        };
        let before = got;
        loop {
            match frame.read(&mut out[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(_) => return false,
            }
            if got == out.len() {
                return true;
            }
        }
        if got == before {
            return false; // an empty frame: no progress
        }
    }
    true
}

/// The largest zstd window a compressed cluster may ask for.
const ZSTD_WINDOW_LIMIT: u64 = 8 << 20;

/// What the header extensions this reader uses say.
#[derive(Default)]
struct Extensions {
    /// The backing file's format (type 0xE2792ACA).
    backing_format: Option<String>,
    /// The external data file's name (type 0x44415441).
    data_file: Option<String>,
}

/// Read the header extensions: they start after the header and end at
/// type 0, before `ext_end` (the backing file name, else the end of the
/// first cluster). As QEMU, every extension's length is checked, the end
/// marker's too: one that runs past `ext_end` is refused, not cut.
fn extensions(
    file: &File,
    header_len: u64,
    file_len: u64,
    ext_end: u64,
) -> Result<Extensions, String> {
    let mut ext = Extensions::default();
    let mut at = header_len;
    // Past the end of the file reads as zeros: the end marker.
    let end = ext_end.min(file_len);
    while at + 8 <= end {
        let mut h = [0u8; 8];
        file.read_exact_at(&mut h, at).map_err(|e| e.to_string())?;
        let (kind, len) = (be32(&h, 0), be32(&h, 4) as u64);
        if at + 8 + len > ext_end {
            return Err(format!(
                "a header extension at {at:#x} of {len} bytes runs past {ext_end:#x} (the \
                 backing file name or the end of the first cluster)"
            ));
        }
        if kind == 0 {
            break;
        }
        let text = |what: &str| -> Result<Option<String>, String> {
            let mut name = vec![0u8; len as usize];
            file.read_exact_at(&mut name, at + 8)
                .map_err(|e| e.to_string())?;
            match String::from_utf8(name) {
                Ok(s) if !s.is_empty() && !s.contains('\0') => Ok(Some(s)),
                _ => Err(format!(
                    "the {what} is empty, not UTF-8 or holds a NUL byte"
                )),
            }
        };
        match kind {
            0xE279_2ACA => ext.backing_format = text("backing format")?,
            0x4441_5441 => ext.data_file = text("external data file name")?,
            _ => {}
        }
        at += 8 + len.div_ceil(8) * 8;
    }
    Ok(ext)
}

/// Read the untrusted image at `path` as commit and convert do, writing
/// nothing: open it, resolve the names it carries through the one rule
/// ([`super::chain::plain_name`], [`super::chain::Format::declared`]),
/// attach its external data file when that resolves to a readable file,
/// walk every range and inflate every compressed cluster. Returns the
/// number of ranges, or the typed error that refused the image.
///
/// # Panics
/// Only when the reader breaks its own promises: ranges must be non-empty,
/// in guest order without gaps, cover exactly the virtual size, and point
/// inside the file. The fuzz target and the property tests call this.
#[doc(hidden)]
pub fn exercise(path: impl AsRef<Path>) -> Result<u64, Error> {
    let path = path.as_ref();
    use super::chain;
    let mut q = Qcow2::open(path)?;
    if let Some((name, fmt)) = &q.backing {
        let _ = chain::plain_name(path, name, "backing file");
        if let Some(f) = fmt {
            let _ = chain::Format::declared(path, f);
        }
    }
    if let Some(name) = q.data_name.clone() {
        let p = chain::plain_name(path, &name, "external data file")?;
        let d = chain::open_node(&p, "external data file", false, super::lock::Access::Read)?;
        q.attach_data(p, d.file, d.len);
    }
    let data_len = q.data.as_ref().map_or(q.file_len, |d| d.len);
    let mut out = vec![0u8; q.cluster_size() as usize];
    let (mut next, mut n) = (0u64, 0u64);
    q.walk(&mut |p| {
        assert!(p.len > 0, "empty range {p:?}");
        assert_eq!(p.guest, next, "a gap or overlap before {p:?}");
        next = p.guest + p.len;
        assert!(next <= q.size, "{p:?} beyond the virtual size {}", q.size);
        n += 1;
        match p.source {
            PieceSource::Data { host } => {
                assert!(
                    host + p.len <= data_len,
                    "{p:?} past the data's end {data_len}"
                )
            }
            PieceSource::Compressed { host, len } => {
                assert!(host + len <= q.file_len, "{p:?} past the end");
                let _ = q.inflate(host, len, &mut out);
            }
            PieceSource::Zero | PieceSource::Unallocated => {}
        }
        Ok(())
    })?;
    assert_eq!(next, q.size, "the ranges end before the virtual size");
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms of the used-cluster record find a second use and a
    /// cluster past the end of the file.
    #[test]
    fn used_clusters_are_found_twice_in_both_forms() {
        let forms = [Used::new(4096, 9), Used::Set(Default::default(), 8, 9)];
        for mut u in forms {
            assert!(u.claim(0, "the header").is_ok());
            assert!(u.claim(512, "an L2 table").is_ok());
            assert!(u.claim(3584, "a data cluster").is_ok());
            assert!(u
                .claim(512, "a data cluster")
                .unwrap_err()
                .contains("already in use"));
            assert!(u
                .claim(4096, "a data cluster")
                .unwrap_err()
                .contains("past the end"));
        }
        // A file of more clusters than the bitmap allows gets the set.
        assert!(matches!(Used::new(1 << 40, 9), Used::Set(..)));
        assert!(matches!(Used::new(1 << 30, 9), Used::Bits(..)));
    }
}
