//! Block-level updates across filesystems: the new version of a
//! destination file made as a clone of its old version with only the
//! blocks that differ from the source rewritten.
//!
//! When a changed file cannot be cloned from its source (another
//! filesystem, another machine's export), copying it whole would give the
//! destination new blocks for every byte, and an earlier snapshot that
//! shares the old version would share nothing with the new one. Here the
//! new version starts as a `FICLONE` of the old one in an unnamed
//! temporary (`O_TMPFILE`, through `prim::place`) of the destination's
//! directory; each block of the source is compared with the same block of
//! the clone, and only blocks that differ are written (which unshares
//! exactly those blocks). The result is truncated or extended to the
//! source's size, blocks that are holes in the source are punched, the
//! caller applies metadata, and [`PendingUpdate::commit`] links it over the
//! old name atomically (`rename`). The old inode, and every snapshot
//! sharing its blocks, is never written.
//!
//! **Granularity.** One block of the destination filesystem (`f_bsize`,
//! 4 KiB on XFS, Btrfs and ext4). It is the unit copy-on-write unshares:
//! writing part of a block costs the whole block, so a finer comparison
//! saves nothing, and a coarser one rewrites (and stores again) unchanged
//! bytes around every change: 16 times the new space for scattered small
//! changes at 64 KiB. Only very large files get a larger block (a power of
//! two multiple), so that a block-hash record stays under
//! [`MAX_DEFAULT_BLOCKS`] hashes (128 MiB); blocks are always aligned, as
//! clones require.
//!
//! **Comparing.** Without a record, both files are read once: the source
//! and the old version. The old version rather than its clone: they hold
//! the same blocks, but a fresh clone's page cache is always empty, while
//! the old version's may hold what a recent write or read left (reading
//! the clone of a cached image went to the disk for every block).
//! The old version's identity (see [`FileIdentity`]) is checked before
//! the clone and after the pass, so what was compared is what was cloned;
//! an old version that changed gives [`ErrorKind::ContentChanged`]. With
//! a [`BlockRecord`] of the old version that is proven current (it names
//! the old file's size, modification and change times to the nanosecond
//! and inode, and these still hold after the clone), only the source is
//! read and hashed: an unchanged destination block is not read again. Both
//! ways the source is hashed, so the new version's record comes for free.
//!
//! **A source that changes** while it is read (its size, modification or
//! change time differ after the pass from before) gives
//! [`ErrorKind::ContentChanged`]: the temporary is dropped, nothing is
//! linked, and the caller copies again or reports. A source that shrinks
//! under the reading is caught at once (a read ends early). Like every
//! stat-based check (rsync's, cp's), it cannot see a same-size rewrite
//! that lands within one tick of the filesystem's clock (a few ms on
//! ext4 and XFS) of the first stat.
//!
//! **No reflink** on the destination (ext4, tmpfs): the old version
//! cannot be cloned, and the new one is a plain full copy of the source
//! (holes kept), reported as [`DeltaMethod::FullCopy`].

use std::path::{Component, Path};

use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, FileType, Mode, OFlags};
use rustix::io::{self, Errno};

use super::place::{Overwrite, PendingFile};
use super::transfer::data_segments;
use crate::ground::error::{is_not_possible_here, Error, ErrorKind, Operation, Result};

const OP: Operation = Operation::Delta;

/// The smallest block a record or an update uses.
pub const MIN_BLOCK: u64 = 512;
/// The largest block a record or an update uses (16 MiB).
pub const MAX_BLOCK: u64 = 16 << 20;
/// The most blocks a record holds (a record of more would exceed 128 GiB;
/// parsing checks the length against this before anything else).
pub const MAX_BLOCKS: u64 = 1 << 32;
/// The most blocks an update cuts a file into: a larger file gets a larger
/// block by default (an explicit one must respect it), so its hashes, held
/// in memory, and its record stay under 128 MiB.
pub const MAX_DEFAULT_BLOCKS: u64 = 1 << 22;
/// Bytes read (and compared) at once.
const CHUNK: u64 = 1 << 20;

/// Which version of a file a [`BlockRecord`] describes: what any write,
/// truncate or replacement changes. The change time cannot be set by
/// users, so a file rewritten and given back its old modification time is
/// still told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct FileIdentity {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds.
    pub mtime_sec: i64,
    /// Modification time, nanoseconds (below 10⁹).
    pub mtime_nsec: u32,
    /// Change time (inode change), seconds.
    pub ctime_sec: i64,
    /// Change time, nanoseconds (below 10⁹).
    pub ctime_nsec: u32,
    /// Inode number.
    pub ino: u64,
}

impl FileIdentity {
    /// The identity of the file `st` describes.
    pub fn of(st: &cowlink_sys::Stat) -> FileIdentity {
        FileIdentity {
            size: st.st_size as u64,
            mtime_sec: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec as u32,
            ctime_sec: st.st_ctime,
            ctime_nsec: st.st_ctime_nsec as u32,
            ino: st.st_ino,
        }
    }

    /// The identity of the open file `fd`.
    pub fn of_fd(fd: BorrowedFd<'_>) -> std::result::Result<FileIdentity, Errno> {
        cowlink_sys::fstat(fd).map(|st| FileIdentity::of(&st))
    }
}

/// The BLAKE3 hash of every block of one version of a file, with that
/// version's [`FileIdentity`]: what lets an update skip reading the old
/// version.
///
/// Binary form (little-endian), version 1:
///
/// | bytes | field |
/// |---|---|
/// | 8 | magic `CLBLKREC` |
/// | 4 | format version (1) |
/// | 4 | block size (a power of two, [`MIN_BLOCK`]..=[`MAX_BLOCK`]) |
/// | 8 | size |
/// | 8 + 4 | modification time (seconds, nanoseconds) |
/// | 8 + 4 | change time (seconds, nanoseconds) |
/// | 8 | inode |
/// | 8 | block count (= size / block size, rounded up) |
/// | 32 × count | BLAKE3 of each block (the last one may be short; a hole hashes as zeros) |
/// | 32 | BLAKE3 of everything before |
///
/// [`from_bytes`](Self::from_bytes) treats its input as untrusted: every
/// length is checked before anything is allocated, every failure is a
/// typed error ([`ErrorKind::Corrupt`], or [`ErrorKind::NotSupported`] for
/// a newer version), and it never panics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRecord {
    block_size: u64,
    identity: FileIdentity,
    hashes: Vec<[u8; 32]>,
}

/// Bytes before the hashes.
const HEADER: usize = 8 + 4 + 4 + 8 + 12 + 12 + 8 + 8;

impl BlockRecord {
    /// The magic the binary form starts with.
    pub const MAGIC: [u8; 8] = *b"CLBLKREC";
    /// The format version written (and the only one read).
    pub const VERSION: u32 = 1;

    /// A record from its parts. `InvalidInput` when the block size is not
    /// a power of two in [`MIN_BLOCK`]..=[`MAX_BLOCK`] or the number of
    /// hashes does not cover `identity.size`.
    pub fn new(block_size: u64, identity: FileIdentity, hashes: Vec<[u8; 32]>) -> Result<Self> {
        let bad = |why: String| Err(Error::new(OP, ErrorKind::InvalidInput).with_reason(why));
        if !valid_block(block_size) {
            return bad(format!(
                "block size {block_size} is not a power of two from {MIN_BLOCK} to {MAX_BLOCK}"
            ));
        }
        let want = identity.size.div_ceil(block_size);
        if hashes.len() as u64 != want {
            return bad(format!(
                "{} hashes for {} bytes in blocks of {block_size} (want {want})",
                hashes.len(),
                identity.size
            ));
        }
        Ok(BlockRecord {
            block_size,
            identity,
            hashes,
        })
    }

    /// Hash every block of the open file `fd` (from offset 0, leaving its
    /// position alone): the record of a file no update has made yet (the
    /// first snapshot). The file's identity is taken before and after
    /// reading; a file that changed meanwhile gives `ContentChanged`.
    pub fn of_file(fd: BorrowedFd<'_>, block_size: u64) -> Result<Self> {
        let err = |e: Errno| Error::from_errno(OP, e);
        if !valid_block(block_size) {
            return Err(Error::new(OP, ErrorKind::InvalidInput).with_reason(format!(
                "block size {block_size} is not a power of two from {MIN_BLOCK} to {MAX_BLOCK}"
            )));
        }
        let before = FileIdentity::of_fd(fd).map_err(err)?;
        let size = before.size;
        let mut hashes =
            Vec::with_capacity(size.div_ceil(block_size).min(MAX_DEFAULT_BLOCKS) as usize);
        let chunk = CHUNK.max(block_size);
        let mut buf = vec![0u8; chunk.min(size.max(1)) as usize];
        let mut pos = 0;
        while pos < size {
            let len = chunk.min(size - pos);
            read_exact_at(fd, &mut buf[..len as usize], pos)
                .map_err(err)?
                .then_some(())
                .ok_or_else(changed_error)?;
            for b in buf[..len as usize].chunks(block_size as usize) {
                hashes.push(*blake3::hash(b).as_bytes());
            }
            pos += len;
        }
        if FileIdentity::of_fd(fd).map_err(err)? != before {
            return Err(changed_error());
        }
        BlockRecord::new(block_size, before, hashes)
    }

    /// The block size, bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The version of the file this record describes.
    pub fn identity(&self) -> &FileIdentity {
        &self.identity
    }

    /// The hash of each block, in file order.
    pub fn hashes(&self) -> &[[u8; 32]] {
        &self.hashes
    }

    /// Whether this record describes the file `st` describes, as it is now.
    pub fn is_current_for(&self, st: &cowlink_sys::Stat) -> bool {
        self.identity == FileIdentity::of(st)
    }

    /// The binary form (see the type's documentation).
    pub fn to_bytes(&self) -> Vec<u8> {
        let id = &self.identity;
        let mut v = Vec::with_capacity(HEADER + 32 * self.hashes.len() + 32);
        v.extend_from_slice(&Self::MAGIC);
        v.extend_from_slice(&Self::VERSION.to_le_bytes());
        v.extend_from_slice(&(self.block_size as u32).to_le_bytes());
        v.extend_from_slice(&id.size.to_le_bytes());
        v.extend_from_slice(&id.mtime_sec.to_le_bytes());
        v.extend_from_slice(&id.mtime_nsec.to_le_bytes());
        v.extend_from_slice(&id.ctime_sec.to_le_bytes());
        v.extend_from_slice(&id.ctime_nsec.to_le_bytes());
        v.extend_from_slice(&id.ino.to_le_bytes());
        v.extend_from_slice(&(self.hashes.len() as u64).to_le_bytes());
        for h in &self.hashes {
            v.extend_from_slice(h);
        }
        let sum = blake3::hash(&v);
        v.extend_from_slice(sum.as_bytes());
        v
    }

    /// Read the binary form. Untrusted input: see the type's
    /// documentation.
    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        let corrupt = |why: String| {
            Error::new(OP, ErrorKind::Corrupt).with_reason(format!("block record: {why}"))
        };
        if data.len() < HEADER + 32 {
            return Err(corrupt(format!(
                "{} bytes, shorter than the {} of an empty record",
                data.len(),
                HEADER + 32
            )));
        }
        let mut r = Reader(&data[..HEADER]);
        if r.take::<8>() != Self::MAGIC {
            return Err(corrupt("not a block record (wrong magic)".into()));
        }
        let version = u32::from_le_bytes(r.take());
        if version != Self::VERSION {
            return Err(Error::new(OP, ErrorKind::NotSupported).with_reason(format!(
                "block record: format version {version} is not supported (this build reads {})",
                Self::VERSION
            )));
        }
        let block_size = u32::from_le_bytes(r.take()) as u64;
        let size = u64::from_le_bytes(r.take());
        let mtime_sec = i64::from_le_bytes(r.take());
        let mtime_nsec = u32::from_le_bytes(r.take());
        let ctime_sec = i64::from_le_bytes(r.take());
        let ctime_nsec = u32::from_le_bytes(r.take());
        let ino = u64::from_le_bytes(r.take());
        let count = u64::from_le_bytes(r.take());
        if count > MAX_BLOCKS {
            return Err(corrupt(format!("{count} blocks, more than {MAX_BLOCKS}")));
        }
        // count ≤ 2^32, so this cannot overflow a u64.
        let want = HEADER as u64 + 32 * count + 32;
        if data.len() as u64 != want {
            return Err(corrupt(format!(
                "{} bytes where {count} blocks take {want}",
                data.len()
            )));
        }
        let (body, sum) = data.split_at(data.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(corrupt("checksum mismatch (damaged or truncated)".into()));
        }
        if !valid_block(block_size) {
            return Err(corrupt(format!(
                "block size {block_size} is not a power of two from {MIN_BLOCK} to {MAX_BLOCK}"
            )));
        }
        if mtime_nsec >= 1_000_000_000 || ctime_nsec >= 1_000_000_000 {
            return Err(corrupt("nanoseconds out of range".into()));
        }
        if size.div_ceil(block_size) != count {
            return Err(corrupt(format!(
                "{count} blocks do not cover {size} bytes in blocks of {block_size}"
            )));
        }
        let hashes = body[HEADER..]
            .chunks_exact(32)
            .map(|c| {
                let mut h = [0u8; 32];
                h.copy_from_slice(c);
                h
            })
            .collect();
        Ok(BlockRecord {
            block_size,
            identity: FileIdentity {
                size,
                mtime_sec,
                mtime_nsec,
                ctime_sec,
                ctime_nsec,
                ino,
            },
            hashes,
        })
    }
}

/// Fixed-size fields off the front of a slice known to be long enough.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
}

fn valid_block(b: u64) -> bool {
    b.is_power_of_two() && (MIN_BLOCK..=MAX_BLOCK).contains(&b)
}

fn changed_error() -> Error {
    Error::new(OP, ErrorKind::ContentChanged)
        .with_reason("the source changed while it was read; nothing was replaced")
}

/// How the new version was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaMethod {
    /// A clone of the old version with the differing blocks rewritten.
    CloneAndPatch,
    /// A full copy of the source: the old version could not be cloned
    /// (no reflink on the destination's filesystem).
    FullCopy,
}

/// What an update did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeltaReport {
    /// How the new version was made.
    pub method: DeltaMethod,
    /// The new version's size (the source's).
    pub size: u64,
    /// The comparison unit, bytes.
    pub block_size: u64,
    /// Blocks of the new version.
    pub blocks: u64,
    /// Blocks kept from the old version as they were (still shared with
    /// it), including holes already there.
    pub blocks_reused: u64,
    /// Blocks written from the source.
    pub blocks_written: u64,
    /// Blocks made holes (a hole of the source where the old version had
    /// data).
    pub blocks_punched: u64,
    /// Source bytes compared with the old version (by bytes or by hash);
    /// holes of the source are settled by layout and not counted, nor is
    /// anything in a full copy.
    pub bytes_compared: u64,
    /// Bytes of the old version read to compare (0 with a record).
    pub bytes_read_old: u64,
    /// Bytes written to the new version.
    pub bytes_written: u64,
    /// Whether a block-hash record of the old version replaced reading it.
    pub record_used: bool,
    /// Why a record that was given was not used.
    pub record_ignored: Option<String>,
}

/// How an update runs.
#[derive(Clone, Copy, Default)]
pub struct DeltaOptions<'a> {
    /// A record of the old version; used only when it is proven current
    /// (see [`BlockRecord::is_current_for`]) and its block size fits the
    /// destination.
    pub record: Option<&'a BlockRecord>,
    /// The comparison unit: a power of two that is a multiple of the
    /// destination filesystem's block size and cuts the source into at
    /// most [`MAX_DEFAULT_BLOCKS`] blocks (their hashes are held in
    /// memory). `None`: the record's block size when one is given and
    /// fits, else the filesystem's (see the module documentation).
    pub block_size: Option<u64>,
    /// Asked between chunks (1 MiB apart); yes stops the update with
    /// [`ErrorKind::Cancelled`] and nothing is linked.
    pub cancelled: Option<&'a dyn Fn() -> bool>,
}

impl std::fmt::Debug for DeltaOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaOptions")
            .field("record", &self.record.map(|r| r.identity))
            .field("block_size", &self.block_size)
            .field("cancelled", &self.cancelled.is_some())
            .finish()
    }
}

/// Where the new version goes: the directory (an open descriptor), the
/// name in it (one component), and how both are shown in messages.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a, 'd> {
    /// The destination's directory.
    pub dir: BorrowedFd<'d>,
    /// The destination's name in `dir`: a single path component.
    pub name: &'a Path,
    /// The destination as messages name it.
    pub shown: &'a Path,
}

/// A new version, complete in its data, not yet under the destination's
/// name: apply metadata to [`fd`](Self::fd), then
/// [`commit`](Self::commit). Dropped, it vanishes (nothing is linked).
pub struct PendingUpdate<'d> {
    file: PendingFile<'d>,
    name: std::path::PathBuf,
    shown: std::path::PathBuf,
    report: DeltaReport,
    block_size: u64,
    hashes: Vec<[u8; 32]>,
}

impl std::fmt::Debug for PendingUpdate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingUpdate")
            .field("shown", &self.shown)
            .field("report", &self.report)
            .finish()
    }
}

impl<'d> PendingUpdate<'d> {
    /// The new version (readable and writable): set its metadata here.
    /// Its data must not be changed, or the record [`commit`](Self::commit)
    /// returns would not describe it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.fd()
    }

    /// What the update did.
    pub fn report(&self) -> &DeltaReport {
        &self.report
    }

    /// Link the new version over the destination's name (atomic
    /// `rename`; a hardlink of the old version keeps the old content) and
    /// return the report and the new version's block record, whose
    /// identity is taken after the link (linking changes the change time).
    pub fn commit(self) -> Result<(DeltaReport, BlockRecord)> {
        let err = |e: Errno| Error::from_errno(OP, e).with_dst(&self.shown);
        let keep = io::fcntl_dupfd_cloexec(self.file.fd(), 0).map_err(err)?;
        let PendingUpdate {
            file,
            name,
            shown,
            report,
            block_size,
            hashes,
        } = self;
        file.persist(&name, Overwrite::Replace)
            .map_err(|e| Error::from_errno(OP, e).with_dst(&shown))?;
        let identity = FileIdentity::of_fd(keep.as_fd())
            .map_err(|e| Error::from_errno(OP, e).with_dst(&shown))?;
        let record = BlockRecord::new(block_size, identity, hashes)?;
        Ok((report, record))
    }
}

/// Make the new version of `target` from the source `src` (shown as
/// `src_shown`) and the destination's current version `old`, which is
/// only cloned and read, never written (it may as well be an earlier
/// snapshot's copy of the file that a record describes).
///
/// The source is read once (and hashed); `old` is read once unless
/// `opts.record` is current for it. Errors name both paths; on any error
/// nothing is left (the temporary is unnamed).
pub fn prepare<'d>(
    src: BorrowedFd<'_>,
    src_shown: &Path,
    old: BorrowedFd<'_>,
    target: Target<'_, 'd>,
    opts: &DeltaOptions<'_>,
) -> Result<PendingUpdate<'d>> {
    let err = |e: Errno| {
        Error::from_errno(OP, e)
            .with_src(src_shown)
            .with_dst(target.shown)
    };
    let invalid = |why: String| {
        Error::new(OP, ErrorKind::InvalidInput)
            .with_src(src_shown)
            .with_dst(target.shown)
            .with_reason(why)
    };
    let changed = || changed_error().with_src(src_shown).with_dst(target.shown);
    let old_changed = || {
        Error::new(OP, ErrorKind::ContentChanged)
            .with_src(src_shown)
            .with_dst(target.shown)
            .with_reason("the old version changed while it was compared; nothing was replaced")
    };
    let mut comps = target.name.components();
    if !matches!(
        (comps.next(), comps.next()),
        (Some(Component::Normal(_)), None)
    ) {
        return Err(invalid(
            "the destination name must be one path component".into(),
        ));
    }
    let st0 = cowlink_sys::fstat(src).map_err(err)?;
    let old_st = cowlink_sys::fstat(old).map_err(err)?;
    for (st, which) in [(&st0, "source"), (&old_st, "old version")] {
        if cowlink_sys::file_type(st.st_mode) != FileType::RegularFile {
            return Err(Error::new(OP, ErrorKind::NotRegularFile)
                .with_src(src_shown)
                .with_dst(target.shown)
                .with_reason(format!("the {which} is not a regular file")));
        }
    }
    let size = st0.st_size as u64;
    let old_size = old_st.st_size as u64;
    let fs_block = cowlink_sys::fs_stat(target.dir).map_err(err)?.block_size;
    let fs_block = fs_block.clamp(MIN_BLOCK, MAX_BLOCK).next_power_of_two();
    // Hashes are kept in memory (32 bytes a block): a block size that
    // would need more than MAX_DEFAULT_BLOCKS of them is not taken.
    let fits =
        |b: u64| valid_block(b) && b % fs_block == 0 && size.div_ceil(b) <= MAX_DEFAULT_BLOCKS;
    let mut record_ignored = None;
    let block_size = match (opts.block_size, opts.record) {
        (Some(b), _) if !fits(b) => {
            return Err(invalid(format!(
                "block size {b} is not a power of two multiple of the filesystem's {fs_block} \
                 up to {MAX_BLOCK} that cuts {size} bytes into at most {MAX_DEFAULT_BLOCKS} blocks"
            )))
        }
        (Some(b), _) => b,
        (None, Some(r)) if fits(r.block_size) => r.block_size,
        (None, _) => {
            let mut b = fs_block;
            while size.div_ceil(b) > MAX_DEFAULT_BLOCKS && b < MAX_BLOCK {
                b *= 2;
            }
            b
        }
    };
    let mut record = opts.record;
    if let Some(r) = record {
        let why = if r.block_size != block_size {
            Some(format!(
                "its block size {} is not the update's {block_size}",
                r.block_size
            ))
        } else if !r.is_current_for(&old_st) {
            Some("it describes another version of the old file".to_string())
        } else {
            None
        };
        if why.is_some() {
            record = None;
            record_ignored = why;
        }
    }

    let file = PendingFile::create_rw(
        target.dir,
        Path::new("."),
        target.name,
        cowlink_sys::raw_mode(st0.st_mode as u32 & 0o777),
    )
    .map_err(err)?;
    let tmp = file.fd();
    let method = match cowlink_sys::ficlone(tmp, old) {
        Ok(()) => DeltaMethod::CloneAndPatch,
        Err(e) if is_not_possible_here(e) => DeltaMethod::FullCopy,
        Err(e) => return Err(err(e)),
    };
    if method == DeltaMethod::FullCopy && record.is_some() {
        record = None;
        record_ignored = Some("the old version cannot be cloned here".into());
    }
    // The record speaks for the clone only if the old file did not change
    // between the check and the clone.
    if let Some(r) = record {
        if !cowlink_sys::fstat(old).is_ok_and(|st| r.is_current_for(&st)) {
            record = None;
            record_ignored = Some("the old file changed while it was cloned".into());
        }
    }
    // The clone's size is the old version's; the copy starts empty.
    let start_size = match method {
        DeltaMethod::CloneAndPatch => old_size,
        DeltaMethod::FullCopy => 0,
    };
    if start_size != size {
        fs::ftruncate(tmp, size).map_err(err)?;
    }
    // Which blocks may be holes: from the source's holes (two seeks per
    // data segment), and, to punch only where needed, the new file's.
    let maybe_sparse = (st0.st_blocks as u64).saturating_mul(512) < size;
    let src_data = match maybe_sparse {
        true => data_segments(src, size).map_err(err)?,
        false if size > 0 => vec![(0, size)],
        false => Vec::new(),
    };
    let old_sparse = (old_st.st_blocks as u64).saturating_mul(512) < old_size;
    let new_data = match method {
        DeltaMethod::CloneAndPatch if maybe_sparse || old_sparse => {
            Some(data_segments(tmp, size).map_err(err)?)
        }
        _ => None,
    };

    let mut report = DeltaReport {
        method,
        size,
        block_size,
        blocks: size.div_ceil(block_size),
        blocks_reused: 0,
        blocks_written: 0,
        blocks_punched: 0,
        bytes_compared: 0,
        bytes_read_old: 0,
        bytes_written: 0,
        record_used: record.is_some(),
        record_ignored,
    };
    let bs = block_size as usize;
    let zero_block = vec![0u8; bs];
    let zero_hash = *blake3::hash(&zero_block).as_bytes();
    let mut hashes: Vec<[u8; 32]> =
        Vec::with_capacity(report.blocks.min(MAX_DEFAULT_BLOCKS) as usize);
    let chunk = CHUNK.max(block_size);
    let mut sbuf = vec![0u8; chunk.min(size.max(1)) as usize];
    let mut obuf = match (method, record) {
        (DeltaMethod::CloneAndPatch, None) => vec![0u8; sbuf.len()],
        _ => Vec::new(),
    };
    // Cursors into the segment lists, which are in file order.
    let (mut si, mut ni) = (0usize, 0usize);
    let mut pos = 0u64;
    while pos < size {
        if opts.cancelled.is_some_and(|c| c()) {
            return Err(Error::new(OP, ErrorKind::Cancelled)
                .with_src(src_shown)
                .with_dst(target.shown));
        }
        let len = chunk.min(size - pos);
        let end = pos + len;
        while si < src_data.len() && src_data[si].1 <= pos {
            si += 1;
        }
        // The blocks of this chunk that hold source data, as ranges: only
        // they are read, from the source and (to compare) from the old
        // version.
        let ranges = block_ranges(&src_data, pos, end, block_size);
        for &(a, b) in &ranges {
            let at = (a - pos) as usize..(b - pos) as usize;
            if !read_exact_at(src, &mut sbuf[at], a).map_err(err)? {
                return Err(changed());
            }
        }
        // The old bytes, when compared by reading: the old version's up to
        // its size, zeros after (as the resized clone holds them); its
        // holes (where known) read as zeros without asking.
        if method == DeltaMethod::CloneAndPatch && record.is_none() {
            for &(a, b) in &ranges {
                obuf[(a - pos) as usize..(b - pos) as usize].fill(0);
                let b = b.min(old_size);
                let mut read = |x: u64, y: u64| -> Result<()> {
                    if !read_exact_at(old, &mut obuf[(x - pos) as usize..(y - pos) as usize], x)
                        .map_err(err)?
                    {
                        return Err(old_changed());
                    }
                    report.bytes_read_old += y - x;
                    Ok(())
                };
                match &new_data {
                    _ if a >= b => {}
                    Some(segs) => {
                        let first = segs.partition_point(|&(_, e)| e <= a);
                        for &(x, y) in segs[first..].iter().take_while(|&&(x, _)| x < b) {
                            read(x.max(a), y.min(b))?;
                        }
                    }
                    None => read(a, b)?,
                }
            }
        }
        // Runs of blocks to write and to punch, as [start, end) offsets.
        let mut write: Option<(u64, u64)> = None;
        let mut punch: Option<(u64, u64)> = None;
        let mut off = pos;
        while off < end {
            let blen = block_size.min(end - off);
            let bend = off + blen;
            let i = (off / block_size) as usize;
            let in_src_data = overlaps(&src_data, &mut si, off, bend);
            enum Act {
                Keep,
                Write,
                Punch,
            }
            let act = if !in_src_data {
                hashes.push(if blen == block_size {
                    zero_hash
                } else {
                    *blake3::hash(&zero_block[..blen as usize]).as_bytes()
                });
                match method {
                    DeltaMethod::CloneAndPatch
                        if new_data
                            .as_ref()
                            .is_none_or(|n| overlaps(n, &mut ni, off, bend)) =>
                    {
                        Act::Punch
                    }
                    _ => Act::Keep,
                }
            } else {
                let b = &sbuf[(off - pos) as usize..(bend - pos) as usize];
                let h = *blake3::hash(b).as_bytes();
                hashes.push(h);
                report.bytes_compared += match method {
                    DeltaMethod::CloneAndPatch => blen,
                    DeltaMethod::FullCopy => 0,
                };
                let same = match (method, record) {
                    (DeltaMethod::FullCopy, _) => false,
                    (DeltaMethod::CloneAndPatch, None) => {
                        b == &obuf[(off - pos) as usize..(bend - pos) as usize]
                    }
                    (DeltaMethod::CloneAndPatch, Some(r)) => {
                        if off >= old_size {
                            // Past the old end the clone reads zeros.
                            b.iter().all(|&x| x == 0)
                        } else {
                            // The old block must be as long as this one:
                            // a block that straddled the old end differs.
                            let old_len = block_size.min(old_size - off);
                            old_len == blen && r.hashes.get(i) == Some(&h)
                        }
                    }
                };
                if same {
                    Act::Keep
                } else {
                    Act::Write
                }
            };
            match act {
                Act::Keep => report.blocks_reused += 1,
                Act::Write => {
                    report.blocks_written += 1;
                    report.bytes_written += blen;
                    extend(&mut write, off, bend, |s, e| {
                        write_run(tmp, &sbuf[(s - pos) as usize..(e - pos) as usize], s)
                    })
                    .map_err(err)?;
                }
                Act::Punch => {
                    report.blocks_punched += 1;
                    extend(&mut punch, off, bend, |s, e| punch_run(tmp, s, e)).map_err(err)?;
                }
            }
            off = bend;
        }
        if let Some((s, e)) = write {
            write_run(tmp, &sbuf[(s - pos) as usize..(e - pos) as usize], s).map_err(err)?;
        }
        if let Some((s, e)) = punch {
            punch_run(tmp, s, e).map_err(err)?;
        }
        pos = end;
    }
    let st1 = cowlink_sys::fstat(src).map_err(err)?;
    let same = |a: &cowlink_sys::Stat| {
        (
            a.st_size,
            a.st_mtime,
            a.st_mtime_nsec,
            a.st_ctime,
            a.st_ctime_nsec,
        )
    };
    if same(&st0) != same(&st1) {
        return Err(changed());
    }
    // What was read of the old version is what was cloned only if it did
    // not change from before the clone to now.
    if method == DeltaMethod::CloneAndPatch
        && record.is_none()
        && FileIdentity::of_fd(old).map_err(err)? != FileIdentity::of(&old_st)
    {
        return Err(old_changed());
    }
    Ok(PendingUpdate {
        file,
        name: target.name.to_path_buf(),
        shown: target.shown.to_path_buf(),
        report,
        block_size,
        hashes,
    })
}

/// The block-aligned ranges of `[pos, end)` (`pos` aligned, `end` aligned
/// or the end of the file) that overlap a data segment of `segs` (sorted,
/// disjoint), merged where they touch.
fn block_ranges(segs: &[(u64, u64)], pos: u64, end: u64, block: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let first = segs.partition_point(|&(_, e)| e <= pos);
    for &(s, e) in segs[first..].iter().take_while(|&&(s, _)| s < end) {
        let a = s.max(pos) / block * block;
        let b = e.min(end).div_ceil(block).saturating_mul(block).min(end);
        match out.last_mut() {
            Some((_, last)) if *last >= a => *last = (*last).max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Whether `[start, end)` overlaps any segment of `segs` (sorted,
/// disjoint), moving the cursor `i` forward past segments that end before
/// `start`.
fn overlaps(segs: &[(u64, u64)], i: &mut usize, start: u64, end: u64) -> bool {
    while *i < segs.len() && segs[*i].1 <= start {
        *i += 1;
    }
    *i < segs.len() && segs[*i].0 < end
}

/// Grow the run `run` by `[s, e)`, or flush it with `flush` and start a
/// new one when `[s, e)` does not follow it.
fn extend(
    run: &mut Option<(u64, u64)>,
    s: u64,
    e: u64,
    mut flush: impl FnMut(u64, u64) -> std::result::Result<(), Errno>,
) -> std::result::Result<(), Errno> {
    match run {
        Some((_, end)) if *end == s => *end = e,
        Some((a, b)) => {
            flush(*a, *b)?;
            *run = Some((s, e));
        }
        None => *run = Some((s, e)),
    }
    Ok(())
}

fn write_run(fd: BorrowedFd<'_>, mut data: &[u8], mut pos: u64) -> std::result::Result<(), Errno> {
    while !data.is_empty() {
        match io::pwrite(fd, data, pos) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => {
                data = &data[n..];
                pos += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Make `[s, e)` of `fd` read as zeros, as a hole where the filesystem can
/// punch one, else by writing zeros.
fn punch_run(fd: BorrowedFd<'_>, s: u64, e: u64) -> std::result::Result<(), Errno> {
    match cowlink_sys::punch_hole(fd, s, e - s) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
            let zeros = vec![0u8; (e - s).min(CHUNK) as usize];
            let mut at = s;
            while at < e {
                let n = (e - at).min(zeros.len() as u64) as usize;
                write_run(fd, &zeros[..n], at)?;
                at += n as u64;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Fill `buf` from `fd` at `pos`; `false` when the file ends first.
fn read_exact_at(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    mut pos: u64,
) -> std::result::Result<bool, Errno> {
    let mut done = 0;
    while done < buf.len() {
        match io::pread(fd, &mut buf[done..], pos) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                done += n;
                pos += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Update the file `dst` from `src` by paths: [`prepare`] with `dst` as
/// the old version, `preserve` applied from `src`, then
/// [`PendingUpdate::commit`]. `dst` must exist as a regular file (a
/// symbolic link is refused, not followed).
pub fn update_file(
    src: &Path,
    dst: &Path,
    opts: &DeltaOptions<'_>,
    preserve: crate::Preserve,
) -> Result<(DeltaReport, BlockRecord)> {
    let (sfd, st) = super::files::open_source(OP, src)?;
    let derr = |e: Errno| Error::from_errno(OP, e).with_src(src).with_dst(dst);
    let name = dst
        .file_name()
        .ok_or_else(|| {
            Error::new(OP, ErrorKind::InvalidInput)
                .with_dst(dst)
                .with_reason("the destination has no file name")
        })?
        .to_owned();
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = fs::open(
        parent,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(derr)?;
    let old = fs::openat(
        &dir,
        &name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::LOOP => derr(e)
            .with_kind(ErrorKind::NotRegularFile)
            .with_reason("the destination is a symbolic link"),
        _ => derr(e),
    })?;
    let target = Target {
        dir: dir.as_fd(),
        name: Path::new(&name),
        shown: dst,
    };
    let pending = prepare(sfd.as_fd(), src, old.as_fd(), target, opts)?;
    super::meta::apply(sfd.as_fd(), &st, pending.fd(), preserve).map_err(|m| {
        Error::from_errno(OP, m.errno)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!(
                "cannot set {}: {}",
                m.what,
                crate::ground::error::errno_text(m.errno)
            ))
    })?;
    pending.commit()
}

#[cfg(test)]
mod tests {
    //! The record's binary form (no filesystem needed) and its hashing of
    //! a file on tmpfs.
    use super::*;

    fn identity(size: u64) -> FileIdentity {
        FileIdentity {
            size,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 123_456_789,
            ctime_sec: -5,
            ctime_nsec: 999_999_999,
            ino: 0xdead_beef_0042,
        }
    }

    fn record(size: u64, block: u64) -> BlockRecord {
        let n = size.div_ceil(block);
        let hashes = (0..n)
            .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
            .collect();
        BlockRecord::new(block, identity(size), hashes).unwrap()
    }

    /// Recompute the trailing checksum after an edit of the body, so a
    /// test reaches the checks behind it.
    fn reseal(mut v: Vec<u8>) -> Vec<u8> {
        let n = v.len() - 32;
        let sum = *blake3::hash(&v[..n]).as_bytes();
        v[n..].copy_from_slice(&sum);
        v
    }

    #[test]
    fn records_read_back_equal() {
        for (size, block) in [
            (0, 4096),
            (1, 512),
            (4096, 4096),
            (10_000, 4096),
            (1 << 20, 65536),
        ] {
            let r = record(size, block);
            let bytes = r.to_bytes();
            assert_eq!(bytes.len(), HEADER + 32 * r.hashes().len() + 32);
            assert_eq!(&bytes[..8], b"CLBLKREC");
            assert_eq!(BlockRecord::from_bytes(&bytes).unwrap(), r);
        }
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_a_typed_error() {
        let bytes = record(3 * 4096 + 7, 4096).to_bytes();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            let e = BlockRecord::from_bytes(&b).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotSupported),
                "byte {i}: {e}"
            );
            assert_eq!(e.operation(), Operation::Delta);
        }
        for n in 0..bytes.len() {
            let e = BlockRecord::from_bytes(&bytes[..n]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{n} bytes: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            BlockRecord::from_bytes(&longer).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    #[test]
    fn checked_fields_are_refused_even_with_a_valid_checksum() {
        let good = record(10_000, 4096).to_bytes();
        let edit = |at: usize, val: &[u8]| {
            let mut v = good.clone();
            v[at..at + val.len()].copy_from_slice(val);
            BlockRecord::from_bytes(&reseal(v)).unwrap_err()
        };
        // Version 2: not this build's.
        let e = edit(8, &2u32.to_le_bytes());
        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
        assert!(e.to_string().contains("version 2"), "{e}");
        // Block sizes: not a power of two, too small, too large.
        for b in [4095u32, 256, 32 << 20] {
            let e = edit(12, &b.to_le_bytes());
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{b}: {e}");
        }
        // A size the hashes do not cover.
        let e = edit(16, &20_000u64.to_le_bytes());
        assert!(e.reason().contains("do not cover"), "{e}");
        // Nanoseconds of 10^9.
        let e = edit(32, &1_000_000_000u32.to_le_bytes());
        assert!(e.reason().contains("nanoseconds"), "{e}");
        // A huge count is refused by length, before any allocation.
        let e = edit(56, &u64::MAX.to_le_bytes());
        assert!(e.reason().contains("more than"), "{e}");
        let e = edit(56, &(1u64 << 31).to_le_bytes());
        assert!(e.reason().contains("bytes where"), "{e}");
    }

    #[test]
    fn new_checks_block_size_and_count() {
        let e = BlockRecord::new(3000, identity(0), vec![]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let e = BlockRecord::new(4096, identity(4097), vec![[0; 32]]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(BlockRecord::new(4096, identity(4097), vec![[0; 32]; 2]).is_ok());
    }

    #[test]
    fn a_file_record_hashes_each_block_and_names_the_version() {
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let r = BlockRecord::of_file(f.as_fd(), 4096).unwrap();
        let want: Vec<[u8; 32]> = data
            .chunks(4096)
            .map(|c| *blake3::hash(c).as_bytes())
            .collect();
        assert_eq!(r.hashes(), &want[..]);
        let st = cowlink_sys::fstat(&f).unwrap();
        assert!(r.is_current_for(&st));
        assert_eq!(r.identity().size, 10_000);
        // Any write makes it stale (the change time moves).
        std::thread::sleep(std::time::Duration::from_millis(5));
        std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        use std::os::unix::fs::FileExt;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .write_all_at(b"x", 0)
            .unwrap();
        assert!(!r.is_current_for(&cowlink_sys::fstat(&f).unwrap()));
    }
}
