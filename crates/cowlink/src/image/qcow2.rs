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

    /// Images built in memory (a memfd: no filesystem, no root), field
    /// by field, so that every header field and table entry can be set to
    /// what a hostile image would hold.
    mod built {
        use super::super::*;
        use std::os::unix::fs::FileExt;

        /// One qcow2 image: header fields, extensions, tables and raw
        /// writes. [`Img::bytes`] lays it out; anything not written reads
        /// as zeros.
        #[derive(Clone, Debug)]
        pub(super) struct Img {
            pub magic: u32,
            pub version: u32,
            pub backing_offset: u64,
            pub backing_len: u32,
            pub backing_name: Vec<u8>,
            pub cluster_bits: u32,
            pub size: u64,
            pub crypt: u32,
            pub l1_size: u32,
            pub l1_offset: u64,
            pub refcount_offset: u64,
            pub refcount_clusters: u32,
            pub snapshots: u32,
            pub snapshots_offset: u64,
            pub incompat: u64,
            pub compat: u64,
            pub autoclear: u64,
            pub refcount_order: u32,
            pub header_len: u32,
            pub compression: u8,
            /// Header extensions (type, payload), written after the header.
            pub exts: Vec<(u32, Vec<u8>)>,
            /// L1 entries, written at `l1_offset`.
            pub l1: Vec<u64>,
            /// Raw bytes at an offset (L2 tables, data).
            pub writes: Vec<(u64, Vec<u8>)>,
            /// The file's length (grown to fit what is written unless
            /// `cut` is set).
            pub len: u64,
            /// Cut the file to `len` after laying it out.
            pub cut: bool,
        }

        impl Img {
            /// A valid, empty version 3 image: L1 table in cluster 1.
            pub fn v3(cluster_bits: u32, size: u64) -> Img {
                let c = 1u64 << cluster_bits;
                let per_l1 = (c / 8) * c;
                let l1_size = size.div_ceil(per_l1).max(1) as u32;
                // The header's cluster, then the L1 table's clusters.
                let len = c + (l1_size as u64 * 8).div_ceil(c).max(1) * c;
                Img {
                    magic: MAGIC,
                    version: 3,
                    backing_offset: 0,
                    backing_len: 0,
                    backing_name: Vec::new(),
                    cluster_bits,
                    size,
                    crypt: 0,
                    l1_size,
                    l1_offset: c,
                    refcount_offset: 0,
                    refcount_clusters: 0,
                    snapshots: 0,
                    snapshots_offset: 0,
                    incompat: 0,
                    compat: 0,
                    autoclear: 0,
                    refcount_order: 4,
                    header_len: 104,
                    compression: 0,
                    exts: Vec::new(),
                    l1: Vec::new(),
                    writes: Vec::new(),
                    len,
                    cut: false,
                }
            }

            /// A valid, empty version 2 image.
            pub fn v2(cluster_bits: u32, size: u64) -> Img {
                Img {
                    version: 2,
                    header_len: 72,
                    ..Img::v3(cluster_bits, size)
                }
            }

            pub fn cluster(&self) -> u64 {
                1 << self.cluster_bits
            }

            /// Write `bytes` at `at`.
            pub fn put(mut self, at: u64, bytes: &[u8]) -> Img {
                self.writes.push((at, bytes.to_vec()));
                self
            }

            /// A whole L2 table in cluster `n` (`entries` first, zeros
            /// after: 8-byte words, two per entry with extended L2), with
            /// L1 entry `i` pointing to it.
            pub fn l2(mut self, i: usize, n: u64, entries: &[u64]) -> Img {
                let at = n * self.cluster();
                if self.l1.len() <= i {
                    self.l1.resize(i + 1, 0);
                }
                self.l1[i] = at | COPIED;
                let mut raw: Vec<u8> = entries.iter().flat_map(|e| e.to_be_bytes()).collect();
                raw.resize(raw.len().max(self.cluster() as usize), 0);
                self.put(at, &raw)
            }

            /// Lay the image out.
            pub fn bytes(&self) -> Vec<u8> {
                let mut b = vec![0u8; self.len as usize];
                let put = |b: &mut Vec<u8>, at: u64, bytes: &[u8]| {
                    let end = at as usize + bytes.len();
                    if b.len() < end {
                        b.resize(end, 0);
                    }
                    b[at as usize..end].copy_from_slice(bytes);
                };
                let mut h = Vec::new();
                h.extend(self.magic.to_be_bytes());
                h.extend(self.version.to_be_bytes());
                h.extend(self.backing_offset.to_be_bytes());
                h.extend(self.backing_len.to_be_bytes());
                h.extend(self.cluster_bits.to_be_bytes());
                h.extend(self.size.to_be_bytes());
                h.extend(self.crypt.to_be_bytes());
                h.extend(self.l1_size.to_be_bytes());
                h.extend(self.l1_offset.to_be_bytes());
                h.extend(self.refcount_offset.to_be_bytes());
                h.extend(self.refcount_clusters.to_be_bytes());
                h.extend(self.snapshots.to_be_bytes());
                h.extend(self.snapshots_offset.to_be_bytes());
                assert_eq!(h.len(), 72);
                if self.version >= 3 {
                    h.extend(self.incompat.to_be_bytes());
                    h.extend(self.compat.to_be_bytes());
                    h.extend(self.autoclear.to_be_bytes());
                    h.extend(self.refcount_order.to_be_bytes());
                    h.extend(self.header_len.to_be_bytes());
                    if self.header_len > 104 {
                        h.push(self.compression);
                    }
                }
                put(&mut b, 0, &h);
                let mut at = if self.version >= 3 {
                    self.header_len as u64
                } else {
                    72
                };
                for (kind, data) in &self.exts {
                    let mut e = Vec::new();
                    e.extend(kind.to_be_bytes());
                    e.extend((data.len() as u32).to_be_bytes());
                    e.extend(data);
                    e.resize(8 + data.len().div_ceil(8) * 8, 0);
                    put(&mut b, at, &e);
                    at += e.len() as u64;
                }
                if !self.backing_name.is_empty() {
                    put(&mut b, self.backing_offset, &self.backing_name);
                }
                let l1: Vec<u8> = self.l1.iter().flat_map(|e| e.to_be_bytes()).collect();
                if !l1.is_empty() {
                    put(&mut b, self.l1_offset, &l1);
                }
                for (at, bytes) in &self.writes {
                    put(&mut b, *at, bytes);
                }
                if self.cut {
                    b.truncate(self.len as usize);
                }
                b
            }

            pub fn open(&self) -> Result<Qcow2, Error> {
                open_bytes(&self.bytes())
            }

            /// The error opening gives (panics when it opens).
            pub fn refused(&self) -> Error {
                match self.open() {
                    Ok(q) => panic!("opened, but should be refused: {self:?} -> {q:?}"),
                    Err(e) => e,
                }
            }

            /// Open and walk, collected.
            pub fn map(&self) -> Result<Vec<Piece>, Error> {
                self.open()?.map()
            }
        }

        /// Open `bytes` as an image held in memory.
        pub fn open_bytes(bytes: &[u8]) -> Result<Qcow2, Error> {
            let fd =
                rustix::fs::memfd_create("cowlink-qcow2-test", rustix::fs::MemfdFlags::CLOEXEC)
                    .expect("memfd_create");
            let f = File::from(fd);
            f.write_all_at(bytes, 0).expect("write to the memfd");
            Qcow2::from_file(Path::new("mem.qcow2"), f, bytes.len() as u64)
        }
    }

    use built::{open_bytes, Img};

    const K: u64 = 1024;
    const M: u64 = 1 << 20;

    fn kind(e: &Error) -> ErrorKind {
        e.kind()
    }

    /// The error is of `kind` and its reason says `what`.
    #[track_caller]
    fn says(e: Error, k: ErrorKind, what: &str) {
        assert_eq!(kind(&e), k, "{e}");
        assert!(e.reason().contains(what), "{e:?} does not say {what:?}");
        assert_eq!(e.src(), Some(Path::new("mem.qcow2")), "the image is named");
    }

    fn piece(guest: u64, len: u64, source: PieceSource) -> Piece {
        Piece {
            guest,
            len,
            source,
            subcluster: false,
        }
    }

    #[test]
    fn empty_images_of_both_versions_open_and_read_from_the_backing() {
        for img in [Img::v2(16, 10 * M), Img::v3(16, 10 * M)] {
            let q = img.open().unwrap();
            assert_eq!(q.version, img.version);
            assert_eq!(
                (q.size, q.cluster_bits, q.cluster_size()),
                (10 * M, 16, 64 * K)
            );
            assert!(!q.extended_l2 && q.backing.is_none() && q.data_name.is_none());
            assert_eq!(
                q.map().unwrap(),
                vec![piece(0, 10 * M, PieceSource::Unallocated)]
            );
        }
    }

    #[test]
    fn the_magic_and_the_minimal_length_are_required() {
        let mut img = Img::v3(16, M);
        img.magic = 0x5146_49fa;
        says(img.refused(), ErrorKind::Corrupt, "magic");
        assert!(!has_magic(b"QFI"));
        assert!(has_magic(b"QFI\xfb"));
        for n in [0, 3, 4, 71] {
            let b = Img::v2(16, M).bytes();
            let e = open_bytes(&b[..n]).unwrap_err();
            says(e, ErrorKind::Corrupt, "not a qcow2 image");
        }
        // A version 3 header cut between 72 and 104 bytes.
        let b = Img::v3(16, M).bytes();
        says(
            open_bytes(&b[..100]).unwrap_err(),
            ErrorKind::Corrupt,
            "truncated",
        );
    }

    #[test]
    fn only_versions_2_and_3_exist() {
        for v in [0, 1, 4, u32::MAX] {
            let mut img = Img::v3(16, M);
            img.version = v;
            says(img.refused(), ErrorKind::Corrupt, "version");
        }
    }

    #[test]
    fn cluster_bits_are_bounded_9_to_21() {
        for bits in [0, 8, 22, 63, 64, u32::MAX] {
            let mut img = Img::v3(16, M);
            img.cluster_bits = bits;
            says(img.refused(), ErrorKind::Corrupt, "cluster_bits");
        }
        for bits in [9, 12, 21] {
            let q = Img::v3(bits, 4 * M).open().unwrap();
            assert_eq!(q.cluster_size(), 1 << bits);
            let m = q.map().unwrap();
            assert_eq!(
                m,
                vec![piece(0, 4 * M, PieceSource::Unallocated)],
                "bits {bits}"
            );
        }
    }

    #[test]
    fn the_virtual_size_is_bounded_and_counted_in_whole_sectors() {
        let mut img = Img::v3(16, M);
        img.size = (1 << 56) + 1;
        says(img.refused(), ErrorKind::Corrupt, "virtual size");
        img.size = u64::MAX;
        says(img.refused(), ErrorKind::Corrupt, "virtual size");
        // As QEMU: a size that is not whole sectors is cut down.
        let mut img = Img::v3(16, M);
        img.size = M + 511;
        let q = img.open().unwrap();
        assert_eq!(q.size, M);
        // Zero size: no ranges at all.
        let q = Img::v3(16, 0).open().unwrap();
        assert_eq!(q.size, 0);
        assert_eq!(q.map().unwrap(), vec![]);
    }

    #[test]
    fn encrypted_images_are_not_supported() {
        for crypt in [1, 2, 77] {
            let mut img = Img::v3(16, M);
            img.crypt = crypt;
            says(img.refused(), ErrorKind::NotSupported, "encrypted");
        }
    }

    #[test]
    fn refcount_and_snapshot_fields_are_not_read() {
        // The reader reads no refcounts and no snapshots: garbage in their
        // fields changes nothing (QEMU's own check would find it; a commit
        // never trusts them).
        let mut img = Img::v3(16, M);
        img.refcount_offset = u64::MAX;
        img.refcount_clusters = u32::MAX;
        img.snapshots = u32::MAX;
        img.snapshots_offset = 0x1234_5678_9abc;
        img.refcount_order = 99;
        let q = img.open().unwrap();
        assert_eq!(
            q.map().unwrap(),
            vec![piece(0, M, PieceSource::Unallocated)]
        );
    }

    #[test]
    fn the_version_3_header_length_is_checked_as_qemu_does() {
        // The minor item: header_length 0 was accepted.
        for len in [0, 72, 103] {
            let mut img = Img::v3(16, M);
            img.header_len = len;
            says(img.refused(), ErrorKind::Corrupt, "header_length");
        }
        // Past the first cluster, or past the end of the file.
        let mut img = Img::v3(9, M);
        img.header_len = 513;
        says(img.refused(), ErrorKind::Corrupt, "header_length");
        let mut img = Img::v3(16, M);
        img.header_len = 200;
        img.len = 150;
        img.l1_offset = 0; // whatever: the header is checked first
        img.cut = true;
        says(img.refused(), ErrorKind::Corrupt, "header_length");
        // Longer headers are fine, and the extensions start after them.
        let mut img = Img::v3(16, M);
        img.header_len = 112;
        img.exts = vec![(0xE279_2ACA, b"raw".to_vec())];
        img.backing_offset = 1024;
        img.backing_name = b"base.raw".to_vec();
        img.backing_len = 8;
        let q = img.open().unwrap();
        assert_eq!(
            q.backing,
            Some(("base.raw".to_string(), Some("raw".to_string())))
        );
    }

    #[test]
    fn incompatible_features_are_refused_unless_understood() {
        let mut img = Img::v3(16, M);
        img.incompat = INCOMPAT_DIRTY;
        says(img.refused(), ErrorKind::InUse, "dirty");
        img.incompat = INCOMPAT_CORRUPT;
        says(img.refused(), ErrorKind::Corrupt, "marked corrupt");
        for bit in 5..64 {
            img.incompat = 1 << bit;
            says(
                img.refused(),
                ErrorKind::NotSupported,
                "unknown incompatible",
            );
        }
        // Version 2 has no feature fields: the bytes there are the
        // extensions' (zeros here), never features.
        let mut img = Img::v2(16, M);
        img.incompat = INCOMPAT_DIRTY | (1 << 40);
        img.open().unwrap();
    }

    #[test]
    fn compatible_and_autoclear_features_are_ignored() {
        let mut img = Img::v3(16, M);
        img.compat = u64::MAX;
        img.autoclear = u64::MAX;
        assert_eq!(
            img.map().unwrap(),
            vec![piece(0, M, PieceSource::Unallocated)]
        );
    }

    #[test]
    fn the_compression_type_counts_only_with_its_feature_bit() {
        let mut img = Img::v3(16, M);
        img.header_len = 112;
        img.compression = 1;
        assert!(!img.open().unwrap().zstd, "no feature bit: zlib");
        img.incompat = INCOMPAT_COMPRESSION;
        assert!(img.open().unwrap().zstd);
        img.compression = 0;
        assert!(!img.open().unwrap().zstd);
        for t in [2, 9, 255] {
            img.compression = t;
            says(img.refused(), ErrorKind::NotSupported, "compression type");
        }
        // With a 104-byte header there is no compression byte: zlib.
        let mut img = Img::v3(16, M);
        img.incompat = INCOMPAT_COMPRESSION;
        assert!(!img.open().unwrap().zstd);
    }

    #[test]
    fn extended_l2_needs_clusters_of_16_kib() {
        let mut img = Img::v3(13, M);
        img.incompat = INCOMPAT_EXTL2;
        says(img.refused(), ErrorKind::Corrupt, "extended L2");
        let mut img = Img::v3(14, M);
        img.incompat = INCOMPAT_EXTL2;
        assert!(img.open().unwrap().extended_l2);
    }

    #[test]
    fn the_l1_size_must_cover_the_virtual_size_within_qemus_limit() {
        // 64 KiB clusters: one L1 entry maps 512 MiB.
        let mut img = Img::v3(16, 1024 * M);
        assert_eq!(img.l1_size, 2);
        img.open().unwrap();
        img.l1_size = 1;
        says(img.refused(), ErrorKind::Corrupt, "needs 2");
        img.l1_size = 0;
        says(img.refused(), ErrorKind::Corrupt, "L1 table of 0 entries");
        // The minor item: 32 Mi entries (QEMU allows 4 Mi).
        img.l1_size = 32 << 20;
        says(img.refused(), ErrorKind::Corrupt, "at most");
        img.l1_size = u32::MAX;
        says(img.refused(), ErrorKind::Corrupt, "at most");
        // Exactly QEMU's limit is fine, when the table is in the file.
        let mut img = Img::v3(16, M);
        img.l1_size = (L1_LIMIT) as u32;
        img.len = 64 * K + L1_LIMIT * 8;
        assert_eq!(img.open().unwrap().l1.len() as u64, L1_LIMIT);
        // A virtual size that needs more than the limit is refused before
        // anything is allocated: 512-byte clusters map 32 KiB per entry.
        let mut img = Img::v3(9, 1 << 50);
        img.l1_size = L1_LIMIT as u32;
        says(img.refused(), ErrorKind::Corrupt, "needs");
    }

    #[test]
    fn the_l1_table_must_be_aligned_and_inside_the_file() {
        for (off, why) in [
            (0, "zero"),
            (64 * K + 8, "misaligned"),
            (4 * 64 * K, "past the end"),
            (u64::MAX - 8 * K + 1, "overflows"),
            ((u64::MAX >> 16) << 16, "overflows, aligned"),
        ] {
            let mut img = Img::v3(16, M);
            img.l1_offset = off;
            says(img.refused(), ErrorKind::Corrupt, "L1 table at");
            let _ = why;
        }
        // Starting inside the file, ending past it.
        let mut img = Img::v3(16, 512 * M * 9000);
        img.len = 2 * 64 * K;
        img.cut = true;
        assert!(img.l1_size as u64 * 8 > 64 * K);
        says(img.refused(), ErrorKind::Corrupt, "past the end");
    }

    #[test]
    fn backing_names_are_bounded_plain_text_in_the_first_cluster() {
        let with = |off: u64, len: u32, name: &[u8]| {
            let mut img = Img::v3(16, M);
            img.backing_offset = off;
            img.backing_len = len;
            img.backing_name = name.to_vec();
            img
        };
        let q = with(512, 8, b"base.img").open().unwrap();
        assert_eq!(q.backing, Some(("base.img".to_string(), None)));
        for img in [
            with(512, 0, b""),                // empty
            with(512, 1024, &[b'a'; 1024]),   // longer than 1023 bytes
            with(64 * K - 4, 8, b"base.img"), // runs past the first cluster
            with(64 * K, 8, b"base.img"),     // starts past it
            with(u64::MAX - 2, 8, b""),       // offset + length overflows
        ] {
            says(img.refused(), ErrorKind::Corrupt, "backing file name");
        }
        for bad in [&b"bad\xff"[..], b"a\0b"] {
            let img = with(512, bad.len() as u32, bad);
            says(
                img.refused(),
                ErrorKind::Corrupt,
                "not UTF-8 or holds a NUL",
            );
        }
        // 1023 bytes is QEMU's bound, and fine.
        let q = with(512, 1023, &[b'n'; 1023]).open().unwrap();
        assert_eq!(q.backing.unwrap().0.len(), 1023);
    }

    #[test]
    fn header_extensions_are_read_bounded_and_checked() {
        // Backing format and an unknown extension (skipped, padded).
        let mut img = Img::v3(16, M);
        img.exts = vec![(0x1234_5678, vec![7; 13]), (0xE279_2ACA, b"qcow2".to_vec())];
        img.backing_offset = 4096;
        img.backing_len = 4;
        img.backing_name = b"b.qc".to_vec();
        let q = img.open().unwrap();
        assert_eq!(q.backing, Some(("b.qc".into(), Some("qcow2".into()))));
        // A format with no backing file is read and then unused.
        let mut img = Img::v3(16, M);
        img.exts = vec![(0xE279_2ACA, b"raw".to_vec())];
        assert_eq!(img.open().unwrap().backing, None);
        // An extension running into the backing name, or past the first
        // cluster, is refused, not cut.
        let mut img = Img::v3(16, M);
        img.exts = vec![(0xE279_2ACA, vec![b'r'; 64])];
        img.backing_offset = 150;
        img.backing_len = 4;
        img.backing_name = b"base".to_vec();
        says(img.refused(), ErrorKind::Corrupt, "header extension");
        // (512-byte clusters: the first cluster ends at 0x200.)
        let img = Img::v3(9, 4 * K).put(104, &[0, 0, 0, 9, 0, 0, 1, 0xa0]);
        says(img.refused(), ErrorKind::Corrupt, "runs past");
        // An end marker with a length that runs past is refused too (QEMU).
        let img = Img::v3(9, 4 * K).put(104, &[0, 0, 0, 0, 0, 0, 2, 0]);
        says(img.refused(), ErrorKind::Corrupt, "runs past");
        // One that ends exactly at the end of the first cluster is fine.
        let img = Img::v3(9, 4 * K).put(104, &[0, 0, 0, 9, 0, 0, 1, 0x90]);
        img.open().unwrap();
        // Empty and NUL-holding names.
        for bad in [&b""[..], b"x\0y", b"\xfe"] {
            let mut img = Img::v3(16, M);
            img.exts = vec![(0xE279_2ACA, bad.to_vec())];
            says(img.refused(), ErrorKind::Corrupt, "backing format");
        }
    }

    #[test]
    fn an_external_data_file_must_be_named_and_attached() {
        let mut img = Img::v3(16, M);
        img.incompat = INCOMPAT_DATA_FILE;
        says(img.refused(), ErrorKind::NotSupported, "does not name it");
        img.exts = vec![(0x4441_5441, b"data.raw".to_vec())];
        let q = img.open().unwrap();
        assert_eq!(q.data_name.as_deref(), Some("data.raw"));
        // Not attached: the walk refuses rather than read the image file.
        says(q.map().unwrap_err(), ErrorKind::NotSupported, "not open");
        // The name without the feature bit is ignored.
        img.incompat = 0;
        assert_eq!(img.open().unwrap().data_name, None);
        // Named but empty: refused.
        img.incompat = INCOMPAT_DATA_FILE;
        img.exts = vec![(0x4441_5441, Vec::new())];
        says(img.refused(), ErrorKind::Corrupt, "external data file name");
    }

    fn attached(img: &Img, data_len: u64) -> Qcow2 {
        let mut q = img.open().unwrap();
        let fd = rustix::fs::memfd_create("data", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let f = File::from(fd);
        f.set_len(data_len).unwrap();
        q.attach_data(PathBuf::from("data.raw"), f, data_len);
        q
    }

    #[test]
    fn clusters_in_an_external_data_file_sit_at_their_guest_offset() {
        let c = 64 * K;
        let mut img = Img::v3(16, 4 * c);
        img.incompat = INCOMPAT_DATA_FILE;
        img.exts = vec![(0x4441_5441, b"data.raw".to_vec())];
        // Guest 0 at host 0 (told from unallocated by COPIED), guest c at
        // c, then unallocated, then (hostile) guest 3c at host 0.
        let ok = img.clone().l2(0, 2, &[COPIED, c | COPIED, 0]);
        let q = attached(&ok, 4 * c);
        assert_eq!(q.external_data(), Some(Path::new("data.raw")));
        assert_eq!(
            q.map().unwrap(),
            vec![
                piece(0, 2 * c, PieceSource::Data { host: 0 }),
                piece(2 * c, 2 * c, PieceSource::Unallocated)
            ]
        );
        let moved = img.clone().l2(0, 2, &[0, 0, 0, c | COPIED]);
        says(
            attached(&moved, 4 * c).map().unwrap_err(),
            ErrorKind::Corrupt,
            "same offset",
        );
        let past = img.clone().l2(0, 2, &[0, 0, 0, (3 * c) | COPIED]);
        says(
            attached(&past, 3 * c).map().unwrap_err(),
            ErrorKind::Corrupt,
            "inside the file",
        );
        let compressed = img.clone().l2(0, 2, &[COMPRESSED | 4096]);
        says(
            attached(&compressed, 4 * c).map().unwrap_err(),
            ErrorKind::Corrupt,
            "compressed",
        );
    }

    #[test]
    fn l1_and_l2_entries_map_to_the_right_sources() {
        let c = 64 * K;
        // 8 clusters; L2 in cluster 2, data in clusters 3, 4, 7.
        let img = Img::v3(16, 8 * c).l2(
            0,
            2,
            &[
                (3 * c) | COPIED,
                (4 * c) | COPIED, // contiguous with the first: merged
                0,                // unallocated
                1,                // zero flag, no host
                (6 * c) | 1,      // zero flag with a (preallocated) host
                (7 * c) | COPIED,
                0,
                0,
            ],
        );
        let img = Img { len: 8 * c, ..img };
        assert_eq!(
            img.map().unwrap(),
            vec![
                piece(0, 2 * c, PieceSource::Data { host: 3 * c }),
                piece(2 * c, c, PieceSource::Unallocated),
                piece(3 * c, 2 * c, PieceSource::Zero),
                piece(5 * c, c, PieceSource::Data { host: 7 * c }),
                piece(6 * c, 2 * c, PieceSource::Unallocated),
            ]
        );
        // The preallocated zero cluster's host counts as used.
        let img = Img::v3(16, 2 * c).l2(0, 2, &[(3 * c) | 1, 3 * c]);
        let img = Img { len: 4 * c, ..img };
        says(img.map().unwrap_err(), ErrorKind::Corrupt, "already in use");
    }

    #[test]
    fn the_last_cluster_is_cut_at_the_virtual_size() {
        let c = 64 * K;
        let img = Img::v3(16, c + 4 * K).l2(0, 2, &[3 * c, 5 * c]);
        let img = Img { len: 6 * c, ..img };
        assert_eq!(
            img.map().unwrap(),
            vec![
                piece(0, c, PieceSource::Data { host: 3 * c }),
                piece(c, 4 * K, PieceSource::Data { host: 5 * c })
            ]
        );
    }

    #[test]
    fn data_running_past_the_end_of_the_file_reads_as_zeros() {
        // A data cluster that starts inside the file and ends past it (the
        // last, partly written host cluster).
        let c = 64 * K;
        let img = Img::v3(16, 2 * c).l2(0, 2, &[3 * c]);
        let img = Img {
            len: 3 * c + 100,
            cut: true,
            ..img
        };
        assert_eq!(
            img.map().unwrap(),
            vec![
                piece(0, 100, PieceSource::Data { host: 3 * c }),
                piece(100, c - 100, PieceSource::Zero),
                piece(c, c, PieceSource::Unallocated)
            ]
        );
    }

    #[test]
    fn zero_flags_are_refused_in_version_2() {
        // The minor item: QEMU refuses them.
        let c = 64 * K;
        let img = Img::v2(16, 2 * c).l2(0, 2, &[1]);
        says(img.map().unwrap_err(), ErrorKind::Corrupt, "version 2");
        let img = Img::v3(16, 2 * c).l2(0, 2, &[1]);
        assert_eq!(
            img.map().unwrap(),
            vec![
                piece(0, c, PieceSource::Zero),
                piece(c, c, PieceSource::Unallocated)
            ]
        );
    }

    #[test]
    fn l2_tables_must_be_aligned_and_inside_the_file() {
        let c = 64 * K;
        for l1e in [2 * c + 512, 9 * c, OFFSET_MASK & !(c - 1)] {
            let mut img = Img::v3(16, 2 * c);
            img.l1 = vec![l1e];
            says(
                img.map().unwrap_err(),
                ErrorKind::Corrupt,
                "L1 entry 0 points to an L2 table",
            );
        }
        // Bits outside the offset mask are ignored, as in QEMU (COPIED,
        // reserved bits): only the masked offset counts.
        let mut img = Img::v3(16, 2 * c);
        img.l1 = vec![(1 << 63) | 0x1ff];
        assert_eq!(
            img.map().unwrap(),
            vec![piece(0, 2 * c, PieceSource::Unallocated)]
        );
    }

    #[test]
    fn data_clusters_must_be_aligned_and_inside_the_file() {
        let c = 64 * K;
        for e in [3 * c + 512, 3 * c, 1 << 54, OFFSET_MASK & !(c - 1)] {
            let img = Img::v3(16, 2 * c).l2(0, 2, &[e]);
            says(
                img.map().unwrap_err(),
                ErrorKind::Corrupt,
                "misaligned or past the end",
            );
        }
    }

    #[test]
    fn no_host_cluster_serves_twice() {
        let c = 64 * K;
        for (what, entries) in [
            ("data twice", vec![3 * c, 3 * c]),
            ("data on the header", vec![0x1fe | (1 << 63), 0]),
            ("data on the L1 table", vec![c, 0]),
            ("data on its own L2 table", vec![2 * c, 0]),
        ] {
            let img = Img::v3(16, 2 * c).l2(0, 2, &entries);
            let img = Img { len: 4 * c, ..img };
            match img.map() {
                Err(e) => says(e, ErrorKind::Corrupt, "already in use"),
                // An entry of only flag bits (no offset) is unallocated.
                Ok(m) if what == "data on the header" => {
                    assert_eq!(m[0].source, PieceSource::Unallocated)
                }
                Ok(m) => panic!("{what}: accepted: {m:?}"),
            }
        }
        // One L2 table behind two L1 entries: the 1 TiB image with
        // every L1 entry at one L2 table is refused at the second entry,
        // in memory bounded by the file, not the virtual size.
        let mut img = Img::v3(16, 1 << 40);
        img.l1 = vec![(2 * c) | COPIED; img.l1_size as usize];
        img.len = 3 * c;
        let e = img.map().unwrap_err();
        says(e, ErrorKind::Corrupt, "the L2 table of L1 entry 1");
    }

    #[test]
    fn compressed_clusters_are_bounded_by_the_file() {
        let c = 64 * K;
        // 64 KiB clusters: x = 62 - 8 = 54 offset bits, then 8 bits of
        // additional 512-byte sectors.
        let desc = |host: u64, sectors: u64| COMPRESSED | ((sectors - 1) << 54) | host;
        let img = Img::v3(16, 2 * c).l2(0, 2, &[desc(3 * c + 100, 2)]);
        let img = Img { len: 4 * c, ..img };
        assert_eq!(
            img.map().unwrap(),
            vec![
                piece(
                    0,
                    c,
                    PieceSource::Compressed {
                        host: 3 * c + 100,
                        len: 1024 - 100
                    }
                ),
                piece(c, c, PieceSource::Unallocated)
            ]
        );
        // The length is cut at the end of the file.
        let img = Img::v3(16, 2 * c).l2(0, 2, &[desc(3 * c, 256)]);
        let img = Img {
            len: 3 * c + 700,
            cut: true,
            ..img
        };
        assert_eq!(
            img.map().unwrap()[0].source,
            PieceSource::Compressed {
                host: 3 * c,
                len: 700
            }
        );
        // Starting past the end: refused.
        let img = Img::v3(16, 2 * c).l2(0, 2, &[desc(5 * c, 1)]);
        says(
            img.map().unwrap_err(),
            ErrorKind::Corrupt,
            "compressed cluster",
        );
        // Two compressed clusters in one host cluster are fine (QEMU packs
        // them), and never merged into one range.
        let img = Img::v3(16, 2 * c).l2(0, 2, &[desc(3 * c, 1), desc(3 * c + 512, 1)]);
        let img = Img { len: 4 * c, ..img };
        assert_eq!(img.map().unwrap().len(), 2);
    }

    #[test]
    fn compressed_clusters_inflate_or_are_refused() {
        let c = 64 * K;
        let plain: Vec<u8> = (0..c).map(|i| (i % 251) as u8).collect();
        let mut deflated = Vec::new();
        let mut z = flate2::write::DeflateEncoder::new(&mut deflated, flate2::Compression::fast());
        std::io::Write::write_all(&mut z, &plain).unwrap();
        z.finish().unwrap();
        let zstd = ruzstd::encoding::compress_to_vec(
            &plain[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        for (frames, is_zstd) in [(deflated, false), (zstd, true)] {
            let mut img = Img::v3(16, c).put(3 * c, &frames);
            if is_zstd {
                img.incompat = INCOMPAT_COMPRESSION;
                img.header_len = 112;
                img.compression = 1;
            }
            let q = img.open().unwrap();
            let mut out = vec![0u8; c as usize];
            q.inflate(3 * c, frames.len() as u64, &mut out).unwrap();
            assert!(
                out == plain,
                "zstd {is_zstd}: the cluster inflates to its bytes"
            );
            // Cut short, or garbage: corrupt, never a panic.
            let e = q
                .inflate(3 * c, frames.len() as u64 / 2, &mut out)
                .unwrap_err();
            says(e, ErrorKind::Corrupt, "does not inflate");
            let e = q.inflate(4, 64, &mut out).unwrap_err();
            says(e, ErrorKind::Corrupt, "does not inflate");
        }
    }

    #[test]
    fn extended_l2_subclusters_map_and_their_bitmaps_are_checked() {
        let c = 64 * K;
        let sub = c / 32;
        let ext = |entries: &[(u64, u64)]| {
            let mut img = Img::v3(16, 2 * c);
            img.incompat = INCOMPAT_EXTL2;
            let flat: Vec<u64> = entries.iter().flat_map(|&(e, b)| [e, b]).collect();
            let img = img.l2(0, 2, &flat);
            Img { len: 4 * c, ..img }
        };
        // All allocated: one whole cluster; a mixed bitmap: subclusters.
        let m = ext(&[(3 * c, 0xffff_ffff), (0, 0xffff_ffff << 32)])
            .map()
            .unwrap();
        assert_eq!(
            m,
            vec![
                piece(0, c, PieceSource::Data { host: 3 * c }),
                piece(c, c, PieceSource::Zero)
            ]
        );
        let m = ext(&[(3 * c, 0b01 | (0b10 << 32)), (0, 0)]).map().unwrap();
        let s = |guest, len, source| Piece {
            guest,
            len,
            source,
            subcluster: true,
        };
        assert_eq!(
            &m[..3],
            &[
                s(0, sub, PieceSource::Data { host: 3 * c }),
                s(sub, sub, PieceSource::Zero),
                s(2 * sub, 30 * sub, PieceSource::Unallocated)
            ]
        );
        assert_eq!(m[3], piece(c, c, PieceSource::Unallocated));
        says(
            ext(&[(3 * c, 1 | (1 << 32)), (0, 0)]).map().unwrap_err(),
            ErrorKind::Corrupt,
            "both allocated and zero",
        );
        says(
            ext(&[(0, 1), (0, 0)]).map().unwrap_err(),
            ErrorKind::Corrupt,
            "no host cluster",
        );
    }

    /// The reader's promises on any bytes: `Ok` or a typed error, never a
    /// panic; ranges non-empty, in order, without gaps, covering exactly
    /// the virtual size and inside the file. Over images derived from
    /// valid ones by flipping header and table bytes (deterministic
    /// xorshift; the fuzz target does the same at length).
    #[test]
    fn mutated_images_are_refused_or_mapped_within_their_promises() {
        let c = 4 * K;
        let bases = [
            Img::v3(12, 8 * c)
                .l2(
                    0,
                    2,
                    &[3 * c, (4 * c) | COPIED, 1, COMPRESSED | (5 * c), 0, 6 * c],
                )
                .put(7 * c, &[0]),
            {
                let mut i = Img::v3(14, 64 * 16 * K);
                i.incompat = INCOMPAT_EXTL2;
                let i = i.l2(0, 2, &[3 * 16 * K, 0xffff_ffff, 0, 1 << 40]);
                Img {
                    len: 5 * 16 * K,
                    ..i
                }
            },
            Img::v2(9, 64 * K)
                .l2(0, 2, &[3 * 512, 4 * 512])
                .put(5 * 512, &[1]),
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut opened = 0;
        for round in 0..3000 {
            let base = &bases[round % bases.len()];
            let mut b = base.bytes();
            let cluster = base.cluster() as usize;
            for _ in 0..1 + rnd() % 4 {
                // Mostly the header, the L1 and the L2 table.
                let region = match rnd() % 3 {
                    0 => 0..112.min(b.len()),
                    1 => cluster..cluster + 64,
                    _ => 2 * cluster..2 * cluster + 64,
                };
                let at = region.start + (rnd() as usize % region.len());
                b[at] ^= 1 << (rnd() % 8);
            }
            let Ok(q) = open_bytes(&b) else { continue };
            opened += 1;
            let mut next = 0;
            let len = b.len() as u64;
            let _ = q.walk(&mut |p| {
                assert!(p.len > 0, "empty range {p:?}");
                assert_eq!(p.guest, next, "a gap or overlap before {p:?}");
                next = p.guest + p.len;
                assert!(next <= q.size, "{p:?} beyond {}", q.size);
                match p.source {
                    PieceSource::Data { host } => {
                        assert!(host + p.len <= len, "{p:?} past the end")
                    }
                    PieceSource::Compressed { host, len: l } => {
                        assert!(host + l <= len, "{p:?} past the end");
                        let mut out = vec![0u8; q.cluster_size() as usize];
                        let _ = q.inflate(host, l, &mut out);
                    }
                    PieceSource::Zero | PieceSource::Unallocated => {}
                }
                Ok(())
            });
        }
        assert!(
            opened > 300,
            "the mutations must leave openable images ({opened})"
        );
    }

    #[test]
    fn an_error_from_the_callback_stops_the_walk() {
        let c = 64 * K;
        let img = Img::v3(16, 4 * c).l2(0, 2, &[3 * c, 0, 1, 0]);
        let img = Img { len: 4 * c, ..img };
        let q = img.open().unwrap();
        let mut seen = 0;
        let e = q
            .walk(&mut |_| {
                seen += 1;
                Err(Error::new(Operation::Image, ErrorKind::Cancelled))
            })
            .unwrap_err();
        assert_eq!((seen, e.kind()), (1, ErrorKind::Cancelled));
    }
}
