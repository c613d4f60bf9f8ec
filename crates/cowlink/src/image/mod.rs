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
//! Trust: every file is opened, and every name inside an image resolved,
//! in [`chain`] (regular files and block devices only, declared formats
//! obeyed, plain file names only, bounded depth), and held with QEMU's
//! own locks ([`lock`]) for the whole operation. Images are walked once
//! to check them before anything is written, with memory bounded by the
//! image file's size ([`Qcow2::walk`]).
//!
//! By default both operations are atomic: the new raw image is built in
//! an unnamed file beside the destination (for a commit, starting as a
//! clone of the old base: constant time on XFS and Btrfs, else a copy that
//! keeps holes) and replaces the name only when complete, with the old
//! file's owner, mode, extended attributes, ACLs and `+C`. An error,
//! ENOSPC or a cancel leaves the old image exactly as it was, and no
//! temporary. A block device, and a base the caller asks for
//! ([`ImageOptions::in_place`]), is written in place instead, never
//! replaced.

pub mod chain;
pub mod lock;
pub mod qcow2;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use cowlink_sys::InodeFlags;
use rustix::fd::BorrowedFd;
use rustix::fs::{self, FileType, CWD};
use rustix::io::Errno;
use serde::Serialize;

use crate::ground::error::{Error, ErrorKind, Operation};
use crate::ground::fskind::FsKind;
use crate::name::quoted;
use crate::prim::meta::Preserve;
use crate::prim::place::{Overwrite, PendingFile};
use crate::run::Run;
use chain::{open_node, Format, Node, NodeKind};
use lock::Access;
pub use qcow2::{Piece, PieceSource, Qcow2};

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
    /// Bytes of the old base (convert: of the raw bottom image) shared
    /// whole by one clone.
    pub start_cloned_bytes: u64,
    /// Bytes of data of the old base (convert: of the raw bottom image)
    /// copied because it could not be cloned (holes are kept as holes and
    /// not counted).
    pub start_copied_bytes: u64,
    /// Whether the base was written in place (not replaced).
    pub in_place: bool,
    /// Whether the filesystem clones between these files.
    pub clones: bool,
    /// Why not, when it does not.
    pub no_clone_reason: Option<String>,
    /// The images applied, bottom first (convert: the whole chain).
    #[serde(flatten, serialize_with = "crate::name::json::layers")]
    pub layers: Vec<PathBuf>,
    /// The external data files their clusters came from, if any.
    #[serde(flatten, serialize_with = "crate::name::json::data_files")]
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
    /// Commit straight into the base (range clones and writes, as
    /// `qemu-img commit` does) instead of building a new base beside it
    /// and renaming it over the old one. A block-device base is always
    /// written in place. Not atomic: a crash or an error part-way leaves
    /// the base partly committed (committing the same overlay again
    /// completes it), so a cancel is not honoured once writing began.
    pub in_place: bool,
    /// Cancellation (checked between ranges); nothing is replaced after it.
    pub run: Run,
}

fn err(op_path: &Path) -> impl Fn(Errno) -> Error + '_ {
    move |e| Error::from_errno(Operation::Image, e).with_src(op_path)
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
    layer.walk(&mut |p| {
        if run.cancel.is_cancelled() {
            return Err(Error::new(Operation::Image, ErrorKind::Cancelled).with_src(layer.path()));
        }
        match p.source {
            PieceSource::Unallocated => report.skipped_bytes += p.len,
            PieceSource::Zero => {
                punch(dst, p.guest, p.len).map_err(&e)?;
                report.zeroed_bytes += p.len;
            }
            PieceSource::Compressed { host, len } => {
                layer.inflate(host, len, &mut inflated)?;
                write_all_at(dst, &inflated[..p.len as usize], p.guest).map_err(&e)?;
                report.copied_for(CopyReason::Compressed, p.len);
            }
            PieceSource::Data { host } => {
                let plan = data_plan(&p, host, clones, block);
                let Some((start, end)) = plan.clone else {
                    copy_range(src, host, dst, p.guest, p.len).map_err(&e)?;
                    report.copied_for(plan.reason, p.len);
                    return Ok(());
                };
                // The block-aligned middle is cloned; ragged edges copied.
                let h = host + (start - p.guest);
                if start > p.guest {
                    copy_range(src, host, dst, p.guest, start - p.guest).map_err(&e)?;
                    report.copied_for(plan.reason, start - p.guest);
                }
                match cowlink_sys::ficlonerange(dst, src, h, end - start, start) {
                    Ok(()) => {
                        report.cloned_bytes += end - start;
                        report.cloned_ranges += 1;
                    }
                    // Not possible here after all (a NOCOW file on Btrfs
                    // cannot share with a COW one: EINVAL): copied.
                    Err(x) if crate::ground::error::is_not_possible_here(x) => {
                        copy_range(src, h, dst, start, end - start).map_err(&e)?;
                        report.copied_for(CopyReason::NoClone, end - start);
                    }
                    Err(x) => return Err(e(x)),
                }
                if p.guest + p.len > end {
                    let n = p.guest + p.len - end;
                    copy_range(src, h + (end - start), dst, end, n).map_err(&e)?;
                    report.copied_for(plan.reason, n);
                }
            }
        }
        Ok(())
    })
}

/// Make `len` bytes at `off` read as zeros without writing data: a hole,
/// else a zeroed range, else written zeros.
fn punch(fd: BorrowedFd<'_>, off: u64, len: u64) -> Result<(), Errno> {
    match cowlink_sys::punch_hole(fd, off, len) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP) => match cowlink_sys::zero_range(fd, off, len) {
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
        match cowlink_sys::copy_file_range(src, &mut off_in, dst, &mut off_out, want) {
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

/// Where a build writes: a new file that replaces the destination when
/// complete, or the destination itself.
enum Target<'a> {
    /// An unnamed file beside `dst`, starting as a copy of `start`.
    /// `old`: the file `dst` named when the operation began, locked. The
    /// name must still lead to it when the new file replaces it, and the
    /// new file takes its metadata (owner, mode, extended attributes and
    /// ACLs, inode flags); without one the new file is created as
    /// `qemu-img` creates it (`0644` less the umask, owned by the caller),
    /// never with the metadata of `start` (a convert's raw bottom image
    /// belongs to whoever owns it, not to the result).
    Replace {
        dst: &'a Path,
        start: Option<&'a Node>,
        old: Option<&'a Node>,
    },
    /// The base itself (in-place commit; a block device).
    InPlace(&'a Node),
}

/// The raw image a build starts from and its guest size: a raw file's
/// length rounded up to whole sectors, as QEMU sees it.
fn raw_size(n: &Node) -> u64 {
    n.len.next_multiple_of(512)
}

/// Build a raw image: the target gets `layers` (top first) applied bottom
/// first. With `exact` (convert) its size follows each layer's virtual
/// size on the way (what a layer does not cover of a larger one above
/// reads as zeros, as QEMU reads past the end of a backing image) and
/// ends at `size`; without (commit) it only grows. A
/// replaced target takes the old file's metadata (owner, mode, extended
/// attributes with ACLs, `+C`) and keeps holes; it replaces the name only
/// if everything succeeded.
fn build(
    target: Target<'_>,
    size: u64,
    exact: bool,
    layers: &[Qcow2],
    run: &Run,
    report: &mut ImageReport,
) -> Result<(), Error> {
    match target {
        Target::InPlace(base) => {
            let out = base.file.as_fd();
            let e = err(&base.path);
            let block = cowlink_sys::fs_stat(out).map_err(&e)?.block_size;
            let mut per_layer = clone_answers(layers, &base.path, report, true);
            if base.kind == NodeKind::Block {
                per_layer.iter_mut().for_each(|c| *c = false);
                report.clones = false;
                report.no_clone_reason = Some("the base is a block device".into());
            }
            report.in_place = true;
            if size > base.len {
                if base.kind == NodeKind::Block {
                    return Err(too_small(&base.path, base.len, size));
                }
                fs::ftruncate(out, size).map_err(&e)?;
            }
            // Once writing began, finishing is safer than stopping.
            let run = Run::default();
            for (layer, clones) in layers.iter().rev().zip(per_layer.iter().rev()) {
                apply(layer, out, *clones, block, &run, report)?;
            }
            fs::fsync(out).map_err(&e)?;
            Ok(())
        }
        Target::Replace { dst, start, old } => {
            let e = err(dst);
            let was = old.map(|n| n.id);
            let old_st = old
                .map(|n| cowlink_sys::fstat(&n.file).map_err(err(&n.path)))
                .transpose()?;
            let old_flags = old
                .and_then(|n| cowlink_sys::inode_flags(n.file.as_fd()).ok())
                .unwrap_or_default();
            if old_flags.intersects(InodeFlags::IMMUTABLE | InodeFlags::APPEND) {
                return Err(Error::new(Operation::Image, ErrorKind::PermissionDenied)
                    .with_dst(dst)
                    .with_reason(
                        "the file is immutable or append-only (chattr +i or +a); it cannot \
                         be replaced or written (chattr -i -a first)",
                    ));
            }
            let mode = old_st.as_ref().map_or(0o644, |m| m.st_mode & 0o7777);
            let pending =
                PendingFile::create_rw(CWD, parent_of(dst), dst, cowlink_sys::raw_mode(mode))
                    .map_err(&e)?;
            let out = pending.fd();
            let block = cowlink_sys::fs_stat(out).map_err(&e)?.block_size;
            let starts = start.map(|n| clones_between(&n.path, dst));
            let per_layer = clone_answers(layers, dst, report, false);
            if let Some((false, why)) = &starts {
                report.clones = false;
                report.no_clone_reason = why.clone().or(report.no_clone_reason.take());
            }
            report.clones &= start.is_some() || !layers.is_empty();
            // NOCOW (Btrfs `+C`) must be set while the file is empty.
            if old_flags.contains(InodeFlags::NOCOW) {
                let _ = cowlink_sys::set_inode_flags(out, InodeFlags::NOCOW);
            }
            if let Some(n) = start {
                let clones = starts.as_ref().is_some_and(|(c, _)| *c);
                let whole = clones
                    && n.kind == NodeKind::File
                    && cowlink_sys::ficlone(out, n.file.as_fd()).is_ok();
                if whole {
                    report.start_cloned_bytes = n.len;
                } else {
                    let cancelled = || run.cancel.is_cancelled();
                    let got = crate::prim::transfer::copy_data(
                        n.file.as_fd(),
                        out,
                        crate::prim::transfer::Source::sized(n.len),
                        n.kind == NodeKind::File,
                        &cancelled,
                    )
                    .map_err(|x| match x {
                        Errno::CANCELED => {
                            Error::new(Operation::Image, ErrorKind::Cancelled).with_dst(dst)
                        }
                        x => e(x),
                    })?;
                    report.start_copied_bytes = data_bytes(n, got.bytes);
                }
                fs::ftruncate(out, raw_size(n)).map_err(&e)?;
            }
            for (layer, clones) in layers.iter().rev().zip(per_layer.iter().rev()) {
                // Below a layer, nothing past its virtual size shows through
                // (convert); a commit keeps the base's tail.
                let now = cowlink_sys::fstat(out).map_err(&e)?.st_size as u64;
                if now < layer.size || (exact && now > layer.size) {
                    fs::ftruncate(out, layer.size).map_err(&e)?;
                }
                apply(layer, out, *clones, block, run, report)?;
            }
            let now = cowlink_sys::fstat(out).map_err(&e)?.st_size as u64;
            if now != size {
                fs::ftruncate(out, size).map_err(&e)?;
            }
            if run.cancel.is_cancelled() {
                return Err(Error::new(Operation::Image, ErrorKind::Cancelled).with_dst(dst));
            }
            if let (Some(n), Some(st)) = (old, &old_st) {
                // The owner, mode, extended attributes and ACLs of the old
                // file stay (a commit changes the contents, nothing else).
                let keep = Preserve {
                    mode: true,
                    ownership: true,
                    timestamps: false,
                    xattrs: true,
                };
                crate::prim::meta::apply(n.file.as_fd(), st, out, keep).map_err(|m| {
                    Error::from_errno(Operation::Image, m.errno)
                        .with_src(&n.path)
                        .with_reason(format!("cannot {} on the new base", m.what))
                })?;
            }
            // The inode flags a file can take once written (`chattr +d
            // +A +S`); `+C` was set while it was empty.
            let carry = old_flags & (InodeFlags::NODUMP | InodeFlags::NOATIME | InodeFlags::SYNC);
            if !carry.is_empty() {
                let now = cowlink_sys::inode_flags(out).map_err(&e)?;
                cowlink_sys::set_inode_flags(out, now | carry).map_err(&e)?;
            }
            fs::fsync(out).map_err(&e)?;
            still_names(dst, was)?;
            // A name that did not exist is created only if it still does
            // not: one another program made meanwhile is not clobbered.
            let how = match was {
                Some(_) => Overwrite::Replace,
                None => Overwrite::Refuse,
            };
            pending.persist(dst, how).map_err(|x| match x {
                Errno::EXIST => Error::new(Operation::Image, ErrorKind::InUse)
                    .with_dst(dst)
                    .with_reason(
                        "another program created this file while cowlink worked; it is left \
                         as it is and nothing was written (remove it and run again)",
                    ),
                x => e(x),
            })
        }
    }
}

/// Refuse to replace `dst` unless it still names the file `was` that the
/// operation locked when it began: another program that renamed a file
/// of its own over the name meanwhile (QEMU's locks are on the old file,
/// not the name) would lose that file to a result built from the old one.
fn still_names(dst: &Path, was: Option<(u64, u64)>) -> Result<(), Error> {
    let Some(was) = was else { return Ok(()) };
    match cowlink_sys::stat(dst) {
        Ok(st) if (st.st_dev, st.st_ino) == was => Ok(()),
        _ => Err(Error::new(Operation::Image, ErrorKind::InUse)
            .with_dst(dst)
            .with_reason(
                "another program replaced or removed this file while cowlink worked on it; \
                 its new file is left as it is and nothing was written (run again)",
            )),
    }
}

/// Whether each layer's data clones into `dst`'s filesystem (the project's
/// probe; `quiet`: without a trial, when nothing may be written), folded
/// into the report.
fn clone_answers(layers: &[Qcow2], dst: &Path, report: &mut ImageReport, quiet: bool) -> Vec<bool> {
    let answers: Vec<(bool, Option<String>)> = layers
        .iter()
        .map(|l| match quiet {
            true => clones_quietly(l.data_file().0, dst),
            false => clones_between(l.data_file().0, dst),
        })
        .collect();
    report.clones = answers.iter().all(|(c, _)| *c);
    report.no_clone_reason = answers
        .iter()
        .find(|(c, _)| !c)
        .and_then(|(_, w)| w.clone());
    if !report.clones && report.no_clone_reason.is_none() {
        report.no_clone_reason = Some("nothing to clone from".into());
    }
    answers.into_iter().map(|(c, _)| c).collect()
}

/// The bytes of data (not holes) in the first `len` bytes of `n`: what a
/// copy that keeps holes really copied (a device: all of it).
fn data_bytes(n: &Node, len: u64) -> u64 {
    if n.kind == NodeKind::Block {
        return len;
    }
    let fd = n.file.as_fd();
    let (mut pos, mut total) = (0u64, 0u64);
    while pos < len {
        let Ok(start) = cowlink_sys::seek_data(fd, pos) else {
            break;
        };
        if start >= len {
            break;
        }
        let end = cowlink_sys::seek_hole(fd, start).map_or(len, |e| e.min(len));
        if end <= start {
            return len;
        }
        total += end - start;
        pos = end;
    }
    total
}

fn too_small(path: &Path, len: u64, size: u64) -> Error {
    Error::new(Operation::Image, ErrorKind::NoSpace)
        .with_src(path)
        .with_reason(format!(
            "the base is a block device of {len} bytes; the overlay's virtual size is {size}"
        ))
}

/// Whether `src`'s data can clone into `dst`'s directory, decided without
/// writing anything: the same filesystem, of a kind that clones. Used by
/// [`map`], which promises to write nothing; a commit makes a real trial.
fn clones_quietly(src: &Path, dst: &Path) -> (bool, Option<String>) {
    let dir = parent_of(dst);
    let (Ok(a), Ok(b)) = (cowlink_sys::stat(src), cowlink_sys::stat(dir)) else {
        return (false, Some("cannot stat the files".into()));
    };
    if a.st_dev != b.st_dev {
        return (
            false,
            Some("the files are on different filesystems (predicted, not tried)".into()),
        );
    }
    match FsKind::of_path(dir) {
        Ok(FsKind::Xfs | FsKind::Btrfs) => (true, None),
        Ok(k) => (
            false,
            Some(format!(
                "{} does not clone (predicted, not tried)",
                k.name()
            )),
        ),
        Err(e) => (false, Some(e.to_string())),
    }
}

/// Refuse to write through a base that is not raw: its format as
/// declared by the overlay (when the base is the overlay's own backing
/// file), else as probed.
fn check_raw_base(q: &Qcow2, base: &Node, is_backing: bool) -> Result<(), Error> {
    let declared = match (&q.backing, is_backing) {
        (Some((_, Some(fmt))), true) => Some(Format::declared(q.path(), fmt)?),
        _ => None,
    };
    match declared {
        Some(Format::Raw) => Ok(()),
        Some(Format::Qcow2) => Err(Error::new(Operation::Image, ErrorKind::NotSupported)
            .with_src(&base.path)
            .with_reason(format!(
                "{} declares this base to be qcow2; only a raw base can be committed into \
                 (convert it first)",
                quoted(q.path())
            ))),
        None if Format::probe(base)? == Format::Qcow2 => {
            Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                .with_src(&base.path)
                .with_reason(
                    "this base is a qcow2 image (by its first bytes); only a raw base can be \
                     committed into (convert it first)",
                ))
        }
        None => Ok(()),
    }
}

/// Walk every layer once before anything is written: a corrupt image is
/// refused while the destination is untouched.
fn check_all(layers: &[Qcow2]) -> Result<(), Error> {
    for l in layers {
        l.walk(&mut |_| Ok(()))?;
    }
    Ok(())
}

/// What [`commit`] of `overlay` would do: every range's fate, with byte
/// counts, and whether the filesystem would clone between the overlay and
/// its base (or, without a base, within the overlay's directory),
/// predicted from the filesystems. `each` sees every range in guest order.
/// Writes nothing, not even a probe; takes QEMU's read locks while it
/// reads.
pub fn map(overlay: impl AsRef<Path>, each: &mut dyn FnMut(&Piece)) -> Result<ImageReport, Error> {
    let overlay = overlay.as_ref();
    let node = open_node(overlay, "image", false, Access::Read)?;
    if Format::probe(&node)? != Format::Qcow2 {
        return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
            .with_src(overlay)
            .with_reason("not a qcow2 image"));
    }
    let q = chain::open_qcow2(node, false, Access::Read)?;
    let mut report = ImageReport {
        size: q.size,
        layers: vec![overlay.to_path_buf()],
        ..Default::default()
    };
    // Cloning into the base's directory, else the overlay's.
    let target = q
        .backing
        .as_ref()
        .and_then(|(name, _)| chain::plain_name(overlay, name, "backing file").ok())
        .filter(|b| b.exists())
        .unwrap_or_else(|| overlay.to_path_buf());
    let (clones, why) = clones_quietly(q.data_file().0, &target);
    report
        .data_files
        .extend(q.external_data().map(Path::to_path_buf));
    let dir = parent_of(&target);
    let block = cowlink_sys::fs_stat_path(dir).map_err(err(dir))?.block_size;
    report.clones = clones;
    report.no_clone_reason = why;
    q.walk(&mut |p| {
        match p.source {
            PieceSource::Unallocated => report.skipped_bytes += p.len,
            PieceSource::Zero => report.zeroed_bytes += p.len,
            PieceSource::Compressed { .. } => report.copied_for(CopyReason::Compressed, p.len),
            PieceSource::Data { host } => {
                let plan = data_plan(&p, host, clones, block);
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
        each(&p);
        Ok(())
    })?;
    Ok(report)
}

/// Open the base at `path` for a commit: regular file or block device,
/// write-locked; the name must still lead to the locked file afterwards
/// (another commit may have replaced it meanwhile: then it is opened
/// again).
fn open_base(path: &Path, in_place: bool) -> Result<Node, Error> {
    for _ in 0..8 {
        let st = cowlink_sys::stat(path).map_err(|x| {
            err(path)(x).with_reason(match x {
                Errno::NOENT => "the base does not exist".to_string(),
                _ => errno_words(x),
            })
        })?;
        let block = cowlink_sys::file_type(st.st_mode) == FileType::BlockDevice;
        let node = open_node(path, "base", in_place || block, Access::Write)?;
        match cowlink_sys::stat(path) {
            Ok(now) if (now.st_dev, now.st_ino) == node.id => return Ok(node),
            _ => continue,
        }
    }
    Err(Error::new(Operation::Image, ErrorKind::InUse)
        .with_src(path)
        .with_reason("the base keeps being replaced by another program"))
}

fn errno_words(e: Errno) -> String {
    std::io::Error::from_raw_os_error(e.raw_os_error()).to_string()
}

/// Merge the qcow2 `overlay` into its raw base (`options.base`, else the
/// backing file its header names): allocated clusters cloned (or copied)
/// to their guest offsets, zero clusters punched, the rest left alone.
///
/// By default a new base is built beside the old one (a clone of it, or a
/// copy that keeps its holes), takes its owner, mode, extended attributes,
/// ACLs and `+C`, and replaces it atomically when all is done: an error,
/// a cancel or a crash leaves the old base as it was. A base with other
/// hard links is refused (replacing it would split them) unless
/// [`ImageOptions::in_place`] asks to write into it; a block-device base
/// is always written in place, and is never grown. The overlay is not
/// touched. Every file is held with QEMU's locks for the duration.
///
/// # Errors
/// `InUse` (QEMU or another commit holds either image, or a lock
/// conflicts), `Corrupt` (a damaged overlay), `NotSupported` (encryption,
/// a backing or data file name that is not a plain file name, a base that
/// is not raw), `NotRegularFile` (a FIFO, a character device), `NotFound`
/// (no base), `InvalidInput` (hard links), `Cancelled`, `NoSpace`, `Io`.
/// After any of them a replaced base is as it was.
pub fn commit(overlay: impl AsRef<Path>, options: &ImageOptions) -> Result<ImageReport, Error> {
    let overlay = overlay.as_ref();
    let node = open_node(overlay, "overlay", false, Access::Read)?;
    if Format::probe(&node)? != Format::Qcow2 {
        return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
            .with_src(overlay)
            .with_reason("not a qcow2 image"));
    }
    let overlay_id = node.id;
    let q = chain::open_qcow2(node, false, Access::Read)?;
    let backing = q
        .backing
        .as_ref()
        .map(|(name, _)| chain::plain_name(overlay, name, "backing file"))
        .transpose()?;
    let base_path = match (&options.base, &backing) {
        (Some(b), _) => b.clone(),
        (None, Some(b)) => b.clone(),
        (None, None) => {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(overlay)
                .with_reason("the overlay names no backing file; give the base with --base"))
        }
    };
    // The base's own name: a symbolic link to it stays a link (QEMU
    // writes through it; so does a commit).
    let base_path = std::fs::canonicalize(&base_path)
        .map_err(|x| Error::from_io(Operation::Image, &x).with_src(&base_path))?;
    // The overlay or its data file as the base: told before the base's
    // lock would find our own read lock and blame "another program"; and
    // checked again on the opened base.
    let same = |id: (u64, u64)| -> Result<(), Error> {
        let what = if id == overlay_id {
            "the base is the overlay itself"
        } else if q.external_data().is_some()
            && chain::file_id(q.data_file().1).is_ok_and(|d| d == id)
        {
            "the base is the overlay's external data file"
        } else {
            return Ok(());
        };
        Err(Error::new(Operation::Image, ErrorKind::SameFile)
            .with_src(overlay)
            .with_dst(&base_path)
            .with_reason(what))
    };
    if let Ok(st) = cowlink_sys::stat(&base_path) {
        same((st.st_dev, st.st_ino))?;
    }
    let base = open_base(&base_path, options.in_place)?;
    same(base.id)?;
    let is_backing = match &backing {
        Some(b) => cowlink_sys::stat(b).is_ok_and(|s| (s.st_dev, s.st_ino) == base.id),
        None => false,
    };
    if !is_backing {
        if let Some(b) = &backing {
            // Its format as declared, else as QEMU would probe it (a
            // backing file that is gone hides nothing).
            let fmt = match &q.backing {
                Some((_, Some(fmt))) => Some(Format::declared(overlay, fmt)?),
                _ => match open_node(b, "backing file", false, Access::Read) {
                    Ok(n) => Some(Format::probe(&n)?),
                    Err(e) if e.kind() == ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                },
            };
            if fmt == Some(Format::Qcow2) {
                return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                    .with_src(overlay)
                    .with_dst(&base_path)
                    .with_reason(format!(
                        "the overlay's own backing file {} is qcow2: what the overlay does not \
                         hold reads from there, so committing the overlay alone into {} would \
                         lose it (convert the chain instead)",
                        quoted(b),
                        quoted(&base_path)
                    )));
            }
        }
    }
    check_raw_base(&q, &base, is_backing)?;
    let in_place = options.in_place || base.kind == NodeKind::Block;
    if !in_place {
        let links = cowlink_sys::fstat(&base.file)
            .map_err(err(&base.path))?
            .st_nlink;
        if links > 1 {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(&base.path)
                .with_reason(format!(
                    "the base has {links} hard links; a commit replaces the file, which would \
                     leave the other names with the old contents (use --in-place to write \
                     into it)"
                )));
        }
    }
    if base.kind == NodeKind::Block && q.size > base.len {
        return Err(too_small(&base.path, base.len, q.size));
    }
    let layers = [q];
    check_all(&layers)?;
    if options.run.cancel.is_cancelled() {
        return Err(Error::new(Operation::Image, ErrorKind::Cancelled).with_dst(&base.path));
    }
    let mut report = ImageReport {
        size: layers[0].size.max(raw_size(&base)),
        layers: vec![overlay.to_path_buf()],
        ..Default::default()
    };
    report
        .data_files
        .extend(layers[0].external_data().map(Path::to_path_buf));
    // A commit never shrinks the base (QEMU grows a smaller one).
    let size = if base.kind == NodeKind::Block {
        base.len
    } else {
        layers[0].size.max(base.len)
    };
    let target = if in_place {
        Target::InPlace(&base)
    } else {
        Target::Replace {
            dst: &base_path,
            start: Some(&base),
            old: Some(&base),
        }
    };
    build(target, size, false, &layers, &options.run, &mut report)?;
    Ok(report)
}

/// Write the qcow2 image `src` (with its whole backing chain) as the raw
/// image `dst`: a raw bottom image cloned whole (or copied, holes kept),
/// then each qcow2 layer applied from the bottom up, the size following
/// each layer's virtual size as QEMU reads the chain. `dst` is created,
/// or replaced atomically (only a regular file is replaced).
///
/// # Errors
/// As [`commit`], plus `InvalidInput` for a loop in the backing chain or
/// one deeper than [`chain::MAX_DEPTH`], and `SameFile` when `dst` is an
/// image of the chain.
pub fn convert(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &ImageOptions,
) -> Result<ImageReport, Error> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let chain = chain::open_chain(src)?;
    // A destination named through symbolic links is the file they name
    // (as `qemu-img convert` writes through them): that file is replaced,
    // the links stay links.
    let dst = &resolve_links(dst)?;
    // An existing destination: a regular file, not in the chain, and not
    // in use (QEMU's write locks, held until it is replaced).
    let old_dst = match cowlink_sys::lstat(dst) {
        Ok(_) => {
            let n = open_node(dst, "destination", false, Access::Write);
            let n = match n {
                Err(e) if e.kind() == ErrorKind::InUse => {
                    // In use by the chain itself (we hold read locks on
                    // it), or by another program.
                    let id = cowlink_sys::stat(dst).map(|s| (s.st_dev, s.st_ino)).ok();
                    if chain_holds(&chain, id) {
                        return Err(same_file(src, dst));
                    }
                    return Err(e);
                }
                x => x?,
            };
            if chain_holds(&chain, Some(n.id)) {
                return Err(same_file(src, dst));
            }
            if n.kind == NodeKind::Block {
                return Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                    .with_dst(dst)
                    .with_reason(
                        "the destination is a block device; convert writes a new raw file and \
                         never replaces a device (use qemu-img convert -n to write into it)",
                    ));
            }
            let links = cowlink_sys::fstat(&n.file).map_err(err(dst))?.st_nlink;
            if links > 1 {
                return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                    .with_dst(dst)
                    .with_reason(format!(
                        "the destination has {links} hard links; convert replaces the file, \
                         which would leave the other names with the old contents (remove it \
                         first, or convert to another name)"
                    )));
            }
            Some(n)
        }
        Err(_) => None,
    };
    check_all(&chain.layers)?;
    let size = chain.layers[0].size;
    let mut report = ImageReport {
        size,
        layers: chain
            .layers
            .iter()
            .rev()
            .map(|q| q.path().to_path_buf())
            .collect(),
        ..Default::default()
    };
    for l in chain.layers.iter().rev() {
        report
            .data_files
            .extend(l.external_data().map(Path::to_path_buf));
    }
    build(
        Target::Replace {
            dst,
            start: chain.bottom.as_ref(),
            old: old_dst.as_ref(),
        },
        size,
        true,
        &chain.layers,
        &options.run,
        &mut report,
    )?;
    Ok(report)
}

/// The file `path` names once the symbolic links of its last component
/// are followed, one by one, as `open(O_CREAT)` follows them: a dangling
/// link names the file it would create. Replacing that file keeps every
/// link a link (a rename over `path` itself would turn it into a regular
/// file and leave the file it named as it was).
fn resolve_links(path: &Path) -> Result<PathBuf, Error> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = path.to_path_buf();
    // The kernel's own limit on links followed in one lookup.
    for _ in 0..40 {
        match cowlink_sys::lstat(&p) {
            Ok(st) if cowlink_sys::file_type(st.st_mode) == FileType::Symlink => {
                let to = fs::readlink(&p, Vec::new()).map_err(err(&p))?;
                let to = Path::new(std::ffi::OsStr::from_bytes(to.as_bytes()));
                p = match to.is_absolute() {
                    true => to.to_path_buf(),
                    false => parent_of(&p).join(to),
                };
            }
            _ => return Ok(p),
        }
    }
    Err(err(path)(Errno::LOOP).with_reason("the destination is a loop of symbolic links"))
}

fn chain_holds(chain: &chain::Chain, id: Option<(u64, u64)>) -> bool {
    let Some(id) = id else { return false };
    chain.bottom.as_ref().is_some_and(|b| b.id == id)
        || chain.layers.iter().any(|q| {
            chain::file_id(q.file()).is_ok_and(|x| x == id)
                || q.external_data().is_some()
                    && chain::file_id(q.data_file().1).is_ok_and(|x| x == id)
        })
}

fn same_file(src: &Path, dst: &Path) -> Error {
    Error::new(Operation::Image, ErrorKind::SameFile)
        .with_src(src)
        .with_dst(dst)
        .with_reason("the destination is an image of the chain being converted")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What another program may do to the name of a file being replaced
    /// while a commit or convert works: the result replaces the name only
    /// when it still leads to the file locked at the start (through a new
    /// hard link or a symbolic link to it, too); otherwise the other
    /// program's file stays, byte for byte, and the error says why.
    #[test]
    #[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
    fn a_replaced_name_is_never_clobbered() {
        let t = cowlink_testfs::testfs!(Xfs);
        type Meddle = fn(&Path, &Path);
        let cases: [(&str, Meddle, bool); 6] = [
            ("untouched", |_, _| {}, true),
            (
                "renamed over",
                |d, n| {
                    std::fs::write(d.join("other"), b"other").unwrap();
                    std::fs::rename(d.join("other"), n).unwrap();
                },
                false,
            ),
            ("removed", |_, n| std::fs::remove_file(n).unwrap(), false),
            (
                "replaced by a new file",
                |_, n| {
                    std::fs::remove_file(n).unwrap();
                    std::fs::write(n, b"other").unwrap();
                },
                false,
            ),
            (
                "a hard link of itself renamed over",
                |d, n| {
                    std::fs::hard_link(n, d.join("same")).unwrap();
                    std::fs::rename(d.join("same"), n).unwrap();
                },
                true,
            ),
            (
                "moved aside, a link to it put there",
                |d, n| {
                    std::fs::rename(n, d.join("aside")).unwrap();
                    std::os::unix::fs::symlink(d.join("aside"), n).unwrap();
                },
                true,
            ),
        ];
        for (i, (what, meddle, replaced)) in cases.into_iter().enumerate() {
            let d = t.path().join(format!("case-{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let name = d.join("base.raw");
            std::fs::write(&name, vec![7u8; 8192]).unwrap();
            let base = open_node(&name, "base", false, Access::Write).unwrap();
            meddle(&d, &name);
            let before = std::fs::read(&name).ok();
            let target = Target::Replace {
                dst: &name,
                start: Some(&base),
                old: Some(&base),
            };
            let mut report = ImageReport::default();
            let r = build(target, 8192, false, &[], &Run::default(), &mut report);
            if replaced {
                r.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(std::fs::read(&name).unwrap(), vec![7u8; 8192], "{what}");
            } else {
                let e = r.expect_err(what);
                assert_eq!(e.kind(), ErrorKind::InUse, "{what}: {e}");
                assert!(e.to_string().contains("base.raw"), "{what}: {e}");
                assert_eq!(std::fs::read(&name).ok(), before, "{what}");
            }
            let names: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
            assert!(names.len() <= 3, "{what}: a temporary was left");
        }
        // A destination that did not exist: created, unless another
        // program made it meanwhile (then its file stays).
        for made in [false, true] {
            let d = t.path().join(format!("new-{made}"));
            std::fs::create_dir_all(&d).unwrap();
            let src = d.join("bottom.raw");
            std::fs::write(&src, vec![7u8; 8192]).unwrap();
            let bottom = open_node(&src, "image", false, Access::Read).unwrap();
            let name = d.join("out.raw");
            let target = Target::Replace {
                dst: &name,
                start: Some(&bottom),
                old: None,
            };
            if made {
                std::fs::write(&name, b"other").unwrap();
            }
            let mut report = ImageReport::default();
            let r = build(target, 8192, true, &[], &Run::default(), &mut report);
            match made {
                false => assert_eq!(std::fs::read(&name).unwrap(), vec![7u8; 8192]),
                true => {
                    let e = r.expect_err("made meanwhile");
                    assert_eq!(e.kind(), ErrorKind::InUse, "{e}");
                    assert_eq!(std::fs::read(&name).unwrap(), b"other");
                }
            }
            assert_eq!(
                std::fs::read_dir(&d).unwrap().count(),
                2,
                "a temporary was left"
            );
        }
    }
}
