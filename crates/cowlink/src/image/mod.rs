//! Disk images: commit a qcow2 overlay into its raw base, and convert a
//! qcow2 chain to a raw image, by cloning clusters rather than copying
//! bytes.
//!
//! A qcow2 image stores each data cluster at a cluster-aligned offset of
//! its file ([`qcow2`] reads where). On a filesystem that clones
//! (`FICLONERANGE`: XFS, Btrfs) an allocated cluster can therefore be
//! shared into a raw image at its guest offset in time that grows with the
//! number of clusters, not their bytes. What cannot be cloned is copied
//! and counted with its reason ([`CopyReason`]): compressed clusters,
//! subclusters and clusters not aligned to the filesystem's block, or a
//! filesystem that cannot clone at all. An image that keeps its data in an
//! external data file is cloned from that file. Zero clusters become holes
//! (`FALLOC_FL_PUNCH_HOLE`), never written zeros; unallocated ones are left
//! alone (they read from below).
//!
//! Both operations are atomic: the new raw image is built in an unnamed
//! file beside the destination (for a commit, starting as a clone of the
//! old base: constant time on XFS and Btrfs) and replaces the name only
//! when complete. An error, ENOSPC or a cancel leaves the old image exactly
//! as it was, and no temporary. Images QEMU has open are refused: QEMU
//! marks them with byte-range locks ([`cowlink_sys::ofd_lock_held`]).

pub mod qcow2;

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fd::BorrowedFd;
use rustix::fs::{self, FallocateFlags, Mode, CWD};
use rustix::io::Errno;
use serde::Serialize;

use crate::ground::error::{Error, ErrorKind, Operation};
use crate::prim::place::{Overwrite, PendingFile};
use crate::run::Run;
pub use qcow2::{Piece, Qcow2, Source};

/// Why a range was copied rather than cloned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyReason {
    /// A compressed cluster (inflated, then written).
    Compressed,
    /// Part of a cluster (extended L2 subclusters) smaller than the
    /// filesystem block or not aligned to it.
    Subcluster,
    /// A cluster smaller than the filesystem block, or not aligned to it.
    Unaligned,
    /// The filesystem cannot clone (ext4, tmpfs, different filesystems).
    NoClone,
}

/// What an image operation did (or, for [`map`], would do), in bytes and
/// ranges.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImageReport {
    /// Guest bytes cloned (blocks shared with the image file, none written).
    pub cloned_bytes: u64,
    /// Ranges cloned (`FICLONERANGE` calls).
    pub cloned_ranges: u64,
    /// Guest bytes copied, by reason.
    pub copied: Vec<(CopyReason, u64)>,
    /// Guest bytes made zero (holes punched).
    pub zeroed_bytes: u64,
    /// Guest bytes left alone (unallocated: they read from the base).
    pub skipped_bytes: u64,
    /// Virtual disk size.
    pub size: u64,
    /// Whether the filesystem clones between these files.
    pub clones: bool,
    /// Why not, when it does not.
    pub no_clone_reason: Option<String>,
    /// The images applied, bottom first (convert: the whole chain).
    pub layers: Vec<PathBuf>,
    /// The external data files their clusters came from, if any.
    pub data_files: Vec<PathBuf>,
}

impl ImageReport {
    /// Total bytes copied.
    pub fn copied_bytes(&self) -> u64 {
        self.copied.iter().map(|(_, n)| n).sum()
    }

    fn copied_for(&mut self, reason: CopyReason, n: u64) {
        match self.copied.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, total)) => *total += n,
            None => self.copied.push((reason, n)),
        }
    }
}

/// Options for [`commit`] and [`convert`].
#[derive(Debug, Clone, Default)]
pub struct ImageOptions {
    /// The raw base to commit into (default: the overlay's backing file).
    pub base: Option<PathBuf>,
    /// Cancellation (checked between ranges); nothing is replaced after it.
    pub run: Run,
}

fn err(op_path: &Path) -> impl Fn(Errno) -> Error + '_ {
    move |e| Error::from_errno(Operation::Image, e).with_src(op_path)
}

/// Refuse an image another program (QEMU) holds locked.
fn check_unlocked(path: &Path, file: &File) -> Result<(), Error> {
    match cowlink_sys::ofd_lock_held(file.as_fd()) {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(Error::new(Operation::Image, ErrorKind::InUse)
            .with_src(path)
            .with_reason("the image is in use: another program (QEMU, qemu-img, qemu-io) holds a lock on it; shut the guest down or close it first")),
        // No OFD locks here (an old kernel, some network filesystems):
        // nothing to learn, and nothing QEMU could have taken either.
        Err(Errno::INVAL | Errno::NOSYS) => Ok(()),
        Err(e) => Err(err(path)(e)),
    }
}

/// The raw format check: a backing file must not be qcow2 (or named so).
fn check_raw_backing(top: &Qcow2, base: &Path) -> Result<(), Error> {
    if let Some((_, Some(fmt))) = &top.backing {
        if fmt != "raw" {
            return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                .with_src(top.path())
                .with_reason(format!(
                    "the backing image {} is {fmt}; only a raw base can be committed into",
                    crate::name::quoted(base)
                )));
        }
    }
    if Qcow2::is_qcow2(base).map_err(|e| Error::from_io(Operation::Image, &e).with_src(base))? {
        return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
            .with_src(base)
            .with_reason("this base is a qcow2 image; only a raw base can be committed into (convert it first)"));
    }
    Ok(())
}

/// Whether the filesystem clones from the file `src` into the directory
/// of `dst` (the project's one probe, cached per pair of filesystems), and
/// why not. Nothing is written: a trial `FICLONERANGE` of length 0 would
/// clone the whole source (0 means "to the end").
fn clones_between(src: &Path, dst: &Path) -> (bool, Option<String>) {
    match crate::probe::between(src, dst).map(|s| s.reflink) {
        Ok(crate::probe::Answer::Yes) => (true, None),
        Ok(crate::probe::Answer::No(why) | crate::probe::Answer::Unknown(why)) => {
            (false, Some(why))
        }
        Err(e) => (false, Some(e.to_string())),
    }
}

/// How a data range is placed: the block-aligned middle `clone`d (guest
/// offsets `start..end`) when the filesystem clones and host and guest
/// offsets agree within the block, the rest copied for `reason`.
struct DataPlan {
    clone: Option<(u64, u64)>,
    reason: CopyReason,
}

fn data_plan(p: &Piece, host: u64, clones: bool, block: u64) -> DataPlan {
    if !clones {
        return DataPlan {
            clone: None,
            reason: CopyReason::NoClone,
        };
    }
    let reason = if p.subcluster {
        CopyReason::Subcluster
    } else {
        CopyReason::Unaligned
    };
    let start = p.guest.next_multiple_of(block);
    let end = (p.guest + p.len) / block * block;
    let clone = (host % block == p.guest % block && end > start).then_some((start, end));
    DataPlan { clone, reason }
}

/// Apply one qcow2 layer's ranges onto `dst` (a raw image being built).
fn apply(
    layer: &Qcow2,
    pieces: &[Piece],
    dst: BorrowedFd<'_>,
    clones: bool,
    block: u64,
    run: &Run,
    report: &mut ImageReport,
) -> Result<(), Error> {
    // Data ranges come from the external data file when there is one.
    let (data_path, data_file) = layer.data_file();
    let src = data_file.as_fd();
    let e = err(data_path);
    let mut inflated = vec![0u8; layer.cluster_size() as usize];
    for p in pieces {
        if run.cancel.is_cancelled() {
            return Err(Error::new(Operation::Image, ErrorKind::Cancelled).with_src(layer.path()));
        }
        match p.source {
            Source::Unallocated => report.skipped_bytes += p.len,
            Source::Zero => {
                punch(dst, p.guest, p.len).map_err(&e)?;
                report.zeroed_bytes += p.len;
            }
            Source::Compressed { host, len } => {
                layer.inflate(host, len, &mut inflated)?;
                write_all_at(dst, &inflated[..p.len as usize], p.guest).map_err(&e)?;
                report.copied_for(CopyReason::Compressed, p.len);
            }
            Source::Data { host } => {
                let plan = data_plan(p, host, clones, block);
                let Some((start, end)) = plan.clone else {
                    copy_range(src, host, dst, p.guest, p.len).map_err(&e)?;
                    report.copied_for(plan.reason, p.len);
                    continue;
                };
                // The block-aligned middle is cloned; ragged edges copied.
                let h = host + (start - p.guest);
                if start > p.guest {
                    copy_range(src, host, dst, p.guest, start - p.guest).map_err(&e)?;
                    report.copied_for(plan.reason, start - p.guest);
                }
                cowlink_sys::ficlonerange(dst, src, h, end - start, start).map_err(&e)?;
                report.cloned_bytes += end - start;
                report.cloned_ranges += 1;
                if p.guest + p.len > end {
                    let n = p.guest + p.len - end;
                    copy_range(src, h + (end - start), dst, end, n).map_err(&e)?;
                    report.copied_for(plan.reason, n);
                }
            }
        }
    }
    Ok(())
}

/// Make `len` bytes at `off` read as zeros without writing data: a hole,
/// else a zeroed range, else written zeros.
fn punch(fd: BorrowedFd<'_>, off: u64, len: u64) -> Result<(), Errno> {
    let hole = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match fs::fallocate(fd, hole, off, len) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP) => match fs::fallocate(
            fd,
            FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
            off,
            len,
        ) {
            Ok(()) => Ok(()),
            Err(Errno::OPNOTSUPP) => {
                let zeros = vec![0u8; 1 << 20];
                let mut at = off;
                while at < off + len {
                    let n = (off + len - at).min(zeros.len() as u64) as usize;
                    write_all_at(fd, &zeros[..n], at)?;
                    at += n as u64;
                }
                Ok(())
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

fn write_all_at(fd: BorrowedFd<'_>, mut data: &[u8], mut at: u64) -> Result<(), Errno> {
    while !data.is_empty() {
        match rustix::io::pwrite(fd, data, at) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => {
                data = &data[n..];
                at += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copy `len` bytes from `src` at `from` to `dst` at `to`:
/// `copy_file_range`, else read and write.
fn copy_range(
    src: BorrowedFd<'_>,
    from: u64,
    dst: BorrowedFd<'_>,
    to: u64,
    len: u64,
) -> Result<(), Errno> {
    let (mut off_in, mut off_out) = (from, to);
    let end = from + len;
    while off_in < end {
        let want = (end - off_in).min(1 << 30) as usize;
        match fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), want) {
            Ok(0) => return Err(Errno::IO), // the image shrank under us
            Ok(_) => {}
            Err(Errno::INTR) => {}
            Err(Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => {
                let mut buf = vec![0u8; (end - off_in).min(1 << 20) as usize];
                while off_in < end {
                    let n = (end - off_in).min(buf.len() as u64) as usize;
                    let got = rustix::io::pread(src, &mut buf[..n], off_in)?;
                    if got == 0 {
                        return Err(Errno::IO);
                    }
                    write_all_at(dst, &buf[..got], off_out)?;
                    off_in += got as u64;
                    off_out += got as u64;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The directory of `p` and `p` itself, for [`PendingFile`].
fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Build a raw image at `dst` atomically: an unnamed file beside it starts
/// as a clone of the raw image `start` (or empty), grows to `size` (with
/// `exact`, is cut to it too), gets `layers` applied bottom first, takes
/// `start`'s (else 0644's) permission bits, and replaces `dst` only if
/// everything succeeded.
fn build(
    dst: &Path,
    start: Option<(&Path, &File)>,
    size: u64,
    exact: bool,
    layers: &[(Qcow2, Vec<Piece>)],
    run: &Run,
    report: &mut ImageReport,
) -> Result<(), Error> {
    let e = err(dst);
    let mode = start
        .and_then(|(_, f)| f.metadata().ok())
        .map_or(0o644, |m| m.mode() & 0o7777);
    let pending =
        PendingFile::create_rw(CWD, parent_of(dst), dst, Mode::from_raw_mode(mode)).map_err(&e)?;
    let out = pending.fd();
    let block = fs::fstatfs(out).map_err(&e)?.f_bsize as u64;
    // Whether each source clones into dst's filesystem: the raw start and
    // every layer's data file may each live elsewhere.
    let starts = start.map(|(p, _)| clones_between(p, dst));
    let per_layer: Vec<(bool, Option<String>)> = layers
        .iter()
        .map(|(l, _)| clones_between(l.data_file().0, dst))
        .collect();
    let all = starts.iter().chain(&per_layer);
    report.clones = all.clone().all(|(c, _)| *c) && (start.is_some() || !layers.is_empty());
    report.no_clone_reason = match all.clone().find(|(c, _)| !c) {
        Some((_, why)) => why.clone(),
        None if report.clones => None,
        None => Some("nothing to clone from".into()),
    };
    let clones = starts.is_some_and(|(c, _)| c);
    if let Some((_, base)) = start {
        let len = base
            .metadata()
            .map_err(|x| Error::from_io(Operation::Image, &x).with_src(dst))?
            .len();
        let whole = clones && cowlink_sys::ficlone(out, base.as_fd()).is_ok();
        if !whole {
            // Copied in steps, so that a cancel is seen within a large base.
            let step = 64 << 20;
            let mut at = 0;
            while at < len {
                if run.cancel.is_cancelled() {
                    return Err(Error::new(Operation::Image, ErrorKind::Cancelled).with_dst(dst));
                }
                let n = step.min(len - at);
                copy_range(base.as_fd(), at, out, at, n).map_err(&e)?;
                at += n;
            }
        }
        if len < size || (exact && len > size) {
            fs::ftruncate(out, size).map_err(&e)?;
        }
    } else {
        fs::ftruncate(out, size).map_err(&e)?;
    }
    for ((layer, pieces), (clones, _)) in layers.iter().zip(&per_layer) {
        apply(layer, pieces, out, *clones, block, run, report)?;
        report
            .data_files
            .extend(layer.external_data().map(Path::to_path_buf));
    }
    if run.cancel.is_cancelled() {
        return Err(Error::new(Operation::Image, ErrorKind::Cancelled).with_dst(dst));
    }
    if let Some((_, base)) = start {
        // The owner and times of the old base stay (a commit changes the
        // contents, and QEMU's view of the file, nothing else).
        let m = base
            .metadata()
            .map_err(|x| Error::from_io(Operation::Image, &x).with_src(dst))?;
        let _ = fs::fchown(
            out,
            Some(fs::Uid::from_raw(m.uid())),
            Some(fs::Gid::from_raw(m.gid())),
        );
        fs::fchmod(out, Mode::from_raw_mode(mode)).map_err(&e)?;
    }
    fs::fsync(out).map_err(&e)?;
    pending.persist(dst, Overwrite::Replace).map_err(&e)
}

/// Open and lock-check one qcow2 image, and map it.
fn open_layer(path: &Path) -> Result<(Qcow2, Vec<Piece>), Error> {
    let q = Qcow2::open(path)?;
    check_unlocked(path, q.file())?;
    if let Some(data) = q.external_data() {
        check_unlocked(data, q.data_file().1)?;
    }
    let pieces = q.map()?;
    Ok((q, pieces))
}

/// What [`commit`] of `overlay` would do: every range's fate, with byte
/// counts, and whether the filesystem clones between the overlay and its
/// base (or, without a base, within the overlay's directory). Writes
/// nothing.
pub fn map(overlay: &Path) -> Result<(ImageReport, Vec<Piece>), Error> {
    let (q, pieces) = open_layer(overlay)?;
    let mut report = ImageReport {
        size: q.size,
        layers: vec![overlay.to_path_buf()],
        ..Default::default()
    };
    // Cloning into the base's directory, else the overlay's.
    let target = q
        .backing_path()
        .filter(|b| b.exists())
        .unwrap_or_else(|| overlay.to_path_buf());
    let (clones, why) = clones_between(q.data_file().0, &target);
    report
        .data_files
        .extend(q.external_data().map(Path::to_path_buf));
    let dir = parent_of(&target);
    let block = fs::statfs(dir).map_err(err(dir))?.f_bsize as u64;
    report.clones = clones;
    report.no_clone_reason = why;
    for p in &pieces {
        match p.source {
            Source::Unallocated => report.skipped_bytes += p.len,
            Source::Zero => report.zeroed_bytes += p.len,
            Source::Compressed { .. } => report.copied_for(CopyReason::Compressed, p.len),
            Source::Data { host } => {
                let plan = data_plan(p, host, clones, block);
                let cloned = plan.clone.map_or(0, |(start, end)| end - start);
                if cloned > 0 {
                    report.cloned_bytes += cloned;
                    report.cloned_ranges += 1;
                }
                if p.len > cloned {
                    report.copied_for(plan.reason, p.len - cloned);
                }
            }
        }
    }
    Ok((report, pieces))
}

/// Merge the qcow2 `overlay` into its raw base (`options.base`, else the
/// backing file its header names): allocated clusters cloned (or copied)
/// to their guest offsets, zero clusters punched, the rest left alone. The
/// base is replaced atomically when all is done; the overlay is not
/// touched.
///
/// # Errors
/// `InUse` (QEMU holds either image), `Corrupt` (a damaged overlay),
/// `NotSupported` (encryption, an external data file the image does not
/// name, a base that is not raw), `NotFound` (no base), `Cancelled`, `NoSpace`, `Io`. After any of
/// them the base is as it was.
pub fn commit(overlay: &Path, options: &ImageOptions) -> Result<ImageReport, Error> {
    let (q, pieces) = open_layer(overlay)?;
    let base = match (&options.base, q.backing_path()) {
        (Some(b), _) => b.clone(),
        (None, Some(b)) => b,
        (None, None) => {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(overlay)
                .with_reason("the overlay names no backing file; give the base with --base"))
        }
    };
    // The base's own name: a symbolic link to it stays a link (QEMU
    // writes through it; so does a commit).
    let base = std::fs::canonicalize(&base)
        .map_err(|x| Error::from_io(Operation::Image, &x).with_src(&base))?;
    check_raw_backing(&q, &base)?;
    let base_file =
        File::open(&base).map_err(|x| Error::from_io(Operation::Image, &x).with_src(&base))?;
    check_unlocked(&base, &base_file)?;
    if base_file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(Error::new(Operation::Image, ErrorKind::IsDirectory).with_src(&base));
    }
    let mut report = ImageReport {
        size: q.size,
        layers: vec![overlay.to_path_buf()],
        ..Default::default()
    };
    let size = q.size;
    build(
        &base,
        Some((&base, &base_file)),
        size,
        false,
        &[(q, pieces)],
        &options.run,
        &mut report,
    )?;
    Ok(report)
}

/// Write the qcow2 image `src` (with its whole backing chain) as the raw
/// image `dst`: a raw bottom image cloned whole, then each qcow2 layer
/// applied from the bottom up. `dst` is created, or replaced atomically.
///
/// # Errors
/// As [`commit`], plus `InvalidInput` for a loop in the backing chain.
pub fn convert(src: &Path, dst: &Path, options: &ImageOptions) -> Result<ImageReport, Error> {
    let mut layers = Vec::new();
    let mut seen = Vec::new();
    let mut next = Some(src.to_path_buf());
    let mut bottom: Option<(PathBuf, File)> = None;
    while let Some(p) = next.take() {
        let canon = std::fs::canonicalize(&p)
            .map_err(|x| Error::from_io(Operation::Image, &x).with_src(&p))?;
        if seen.contains(&canon) {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(src)
                .with_reason(format!(
                    "the backing chain loops at {}",
                    crate::name::quoted(&p)
                )));
        }
        seen.push(canon);
        if layers.len() > 64 {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(src)
                .with_reason("the backing chain is longer than 64 images"));
        }
        if Qcow2::is_qcow2(&p).map_err(|x| Error::from_io(Operation::Image, &x).with_src(&p))? {
            let (q, pieces) = open_layer(&p)?;
            if let Some((_, Some(fmt))) = &q.backing {
                if fmt != "raw" && fmt != "qcow2" {
                    return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                        .with_src(&p)
                        .with_reason(format!(
                            "backing format {fmt} (only raw and qcow2 are read)"
                        )));
                }
            }
            next = q.backing_path();
            layers.push((q, pieces));
        } else {
            if layers.is_empty() {
                return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                    .with_src(src)
                    .with_reason("not a qcow2 image"));
            }
            let f =
                File::open(&p).map_err(|x| Error::from_io(Operation::Image, &x).with_src(&p))?;
            check_unlocked(&p, &f)?;
            bottom = Some((p, f));
        }
    }
    if dst.exists()
        && seen
            .iter()
            .any(|s| std::fs::canonicalize(dst).is_ok_and(|d| &d == s))
    {
        return Err(Error::new(Operation::Image, ErrorKind::SameFile)
            .with_src(src)
            .with_dst(dst)
            .with_reason("the destination is an image of the chain being converted"));
    }
    layers.reverse();
    let size = layers.last().map_or(0, |(q, _)| q.size);
    let mut report = ImageReport {
        size,
        layers: layers.iter().map(|(q, _)| q.path().to_path_buf()).collect(),
        ..Default::default()
    };
    // A bottom larger than the top's virtual size is cut to it.
    build(
        dst,
        bottom.as_ref().map(|(p, f)| (p.as_path(), f)),
        size,
        true,
        &layers,
        &options.run,
        &mut report,
    )?;
    Ok(report)
}
