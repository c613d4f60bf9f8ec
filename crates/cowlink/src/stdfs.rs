//! The file-level operations on `std::fs` alone, for targets without POSIX
//! descriptors (Windows): [`clone_file`], [`clone_range`], [`copy_tree`]
//! and the probe ([`filesystem`], [`between`], [`tree`]), with the Unix
//! engine's signatures, option types and error kinds. The platform layer
//! gives the clone (`FSCTL_DUPLICATE_EXTENTS_TO_FILE`, ReFS and Dev
//! Drives), the errno translation and scratch files; where a volume cannot
//! clone it answers "not possible here" and `auto` copies, as on Unix.
//!
//! Simpler than the Unix engine, on purpose (it only has to be correct):
//! - a new name is always written as a named temporary next to it and
//!   moved into place complete ([`Placement::Direct`] is treated as
//!   atomic); refusing an existing name is a hardlink of the temporary,
//!   which fails atomically when the name exists;
//! - the tree copy walks one directory at a time on the calling thread
//!   (`TreeOptions::run.threads` is ignored), keeping a list of the
//!   directories whose times are set last; a cancel stops it between
//!   entries, not inside one file's copy; `atomic` and `copy_contents`
//!   change nothing (every name is placed atomically, and Windows has no
//!   FIFOs or devices in a tree);
//! - metadata is what `std::fs` carries: the read-only attribute and, with
//!   `preserve.timestamps`, the access and modification times. Owners,
//!   ACLs and alternate streams are not copied; hardlinks inside a tree
//!   are not recognised (std has no stable file id here), so each name
//!   gets its own copy;
//! - a file is the same file as another when both paths canonicalise to
//!   one name (hardlinked names are not detected);
//! - nothing is cached by the probe, and there is no mount table for
//!   [`tree`].

use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cowlink_sys::Errno;

use crate::clone::CloneOptions;
use crate::ground::error::{is_not_possible_here, Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;
use crate::prim::mode::{LinkMode, Method, Outcome, Step};
use crate::prim::place::Overwrite;
use crate::probe::{Answer, FsFacts, MountSupport, Support};
use crate::run::{Phase, Progress};
use crate::tree::{Action, LinkKind, Observer, SkipReason, TreeEvent, TreeOptions, TreeReport};

#[cfg(windows)]
use cowlink_sys as sys;

/// Built on Linux under test, with Linux's counterparts of the Windows
/// calls (`FICLONE`, `FICLONERANGE`, a scratch file unlinked at once), so
/// that this module's logic runs on the real test filesystems.
#[cfg(all(test, unix))]
mod sys {
    use std::fs::File;
    use std::os::fd::AsFd;
    use std::path::Path;

    use cowlink_sys::Errno;

    pub fn clone_cluster_size(file: &File) -> Result<u64, Errno> {
        cowlink_sys::fs_stat(file.as_fd()).map(|s| s.block_size)
    }

    pub fn clone_file_range(
        dst: &File,
        src: &File,
        src_offset: u64,
        len: u64,
        dst_offset: u64,
    ) -> Result<(), Errno> {
        // Windows takes a last cluster that runs past the source's end;
        // Linux takes the same request as a range ending at the end.
        let size = cowlink_sys::fstat(src.as_fd())?.st_size as u64;
        let len = len.min(size.saturating_sub(src_offset));
        cowlink_sys::ficlonerange(dst.as_fd(), src.as_fd(), src_offset, len, dst_offset)
    }

    pub fn clone_file_data(dst: &File, src: &File, _len: u64) -> Result<(), Errno> {
        cowlink_sys::ficlone(dst.as_fd(), src.as_fd())
    }

    pub fn scratch_file(dir: &Path, name: &str) -> Result<File, Errno> {
        let path = dir.join(name);
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        let _ = std::fs::remove_file(&path);
        Ok(f)
    }

    pub fn fs_stat_path(path: &Path) -> Result<cowlink_sys::FsStat, Errno> {
        cowlink_sys::fs_stat_path(path)
    }

    pub fn open_for_times(path: &Path) -> Result<File, Errno> {
        File::open(path).map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
    }
}

fn io_errno(e: &io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// Temporary names are unique within the process by this counter and
/// across processes by the process id.
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

fn temp_path(dst: &Path, what: &str) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(dst.file_name().unwrap_or_default());
    name.push(format!(
        ".cowlink-{what}-{}-{}",
        std::process::id(),
        NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
    ));
    dst.with_file_name(name)
}

/// A file being written under a temporary name: removed on drop unless
/// moved into place.
struct Pending {
    path: PathBuf,
    file: Option<File>,
}

impl Pending {
    fn create(dst: &Path) -> io::Result<Pending> {
        loop {
            let path = temp_path(dst, "tmp");
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(Pending {
                        path,
                        file: Some(file),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn file(&self) -> &File {
        self.file.as_ref().expect("open until placed")
    }

    /// Close the file and give it the name `dst`: over an existing file
    /// when `replace`, else only if the name is free (`EEXIST` otherwise).
    fn place(mut self, dst: &Path, replace: bool) -> io::Result<()> {
        drop(self.file.take());
        if replace {
            fs::rename(&self.path, dst)?;
        } else {
            match fs::hard_link(&self.path, dst) {
                Ok(()) => {
                    let _ = fs::remove_file(&self.path);
                }
                // No hardlinks on this volume (FAT): check, then move. A
                // name created between the two is replaced.
                Err(e) if io_errno(&e) == Errno::OPNOTSUPP => {
                    if fs::symlink_metadata(dst).is_ok() {
                        return Err(io::Error::from(Errno::EXIST));
                    }
                    fs::rename(&self.path, dst)?;
                }
                Err(e) => return Err(e),
            }
        }
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        drop(self.file.take());
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A refused clone, with the reason where the volume cannot clone at all.
fn clone_error(op: Operation, e: Errno) -> Error {
    let err = Error::from_errno(op, e);
    match e {
        Errno::OPNOTSUPP => {
            err.with_reason("this volume cannot share blocks (only ReFS and Dev Drives can)")
        }
        Errno::XDEV => err.with_reason("different volumes: a clone stays within one volume"),
        _ => err,
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// Read/write copy of all of `src` into `dst`, from the start.
fn copy_data(src: &mut File, dst: &File) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut out = dst;
    let mut total = 0;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// The source's times on `file`, when `options` preserve them.
fn set_times(file: &File, st: &Metadata, options: &CloneOptions) -> io::Result<()> {
    if options.preserve.timestamps {
        let mut times = fs::FileTimes::new().set_modified(st.modified()?);
        if let Ok(a) = st.accessed() {
            times = times.set_accessed(a);
        }
        file.set_times(times)?;
    }
    Ok(())
}

/// The source's read-only attribute (its permission bits here) on the
/// placed name; a default mode (`--no-preserve=mode`) gives a writable
/// copy. Set after placing: a read-only temporary could not be removed
/// once hardlinked into place.
fn set_readonly(path: &Path, st: &Metadata, options: &CloneOptions) -> io::Result<()> {
    let default_mode = options.default_mode && !options.preserve.mode;
    if st.permissions().readonly() && !default_mode {
        fs::set_permissions(path, st.permissions())?;
    }
    Ok(())
}

/// Clone `src` to the new file `dst`, or copy it when `options.link`
/// allows and the volume cannot clone (see the Unix `clone_file`, whose
/// contract this keeps). Windows clones on ReFS and Dev Drives with
/// `FSCTL_DUPLICATE_EXTENTS_TO_FILE`.
///
/// # Errors
/// As on Unix: `NotFound`, `IsDirectory`, `NotRegularFile`,
/// `PermissionDenied`, `AlreadyExists` (unless [`Overwrite::Replace`]),
/// `SameFile`, `CrossDevice` and `NotSupported` (with
/// [`LinkMode::Clone`] or [`LinkMode::Hardlink`] only), `NoSpace`, `Io`.
pub fn clone_file(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &CloneOptions,
) -> Result<Outcome> {
    match place_file(src.as_ref(), dst.as_ref(), options) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && options.overwrite == Overwrite::Skip => {
            Ok(Outcome {
                method: Method::Skipped,
                bytes: 0,
            })
        }
        r => r,
    }
}

fn place_file(src: &Path, dst: &Path, options: &CloneOptions) -> Result<Outcome> {
    let op = match options.link {
        LinkMode::Copy => Operation::Copy,
        _ => Operation::Clone,
    };
    let err = |e: &io::Error| Error::from_io(op, e).with_src(src).with_dst(dst);
    let mut src_file = File::open(src).map_err(|e| err(&e))?;
    let st = src_file.metadata().map_err(|e| err(&e))?;
    if st.is_dir() {
        return Err(Error::new(op, ErrorKind::IsDirectory)
            .with_src(src)
            .with_dst(dst)
            .with_reason("source is a directory"));
    }
    if !st.is_file() {
        return Err(Error::new(op, ErrorKind::NotRegularFile)
            .with_src(src)
            .with_dst(dst)
            .with_reason("source is not a regular file"));
    }
    let replace = options.overwrite == Overwrite::Replace;
    match fs::symlink_metadata(dst) {
        Ok(_) if !replace => {
            return Err(Error::new(op, ErrorKind::AlreadyExists)
                .with_src(src)
                .with_dst(dst)
                .with_reason("destination already exists"));
        }
        Ok(old) if old.is_dir() => {
            return Err(Error::new(op, ErrorKind::IsDirectory)
                .with_src(src)
                .with_dst(dst)
                .with_reason("destination is a directory"));
        }
        Ok(_) if same_file(src, dst) => {
            return Err(Error::new(op, ErrorKind::SameFile)
                .with_src(src)
                .with_dst(dst)
                .with_reason("source and destination are the same file"));
        }
        _ => {}
    }
    if options.link == LinkMode::Hardlink {
        let link = |to: &Path| fs::hard_link(src, to).map_err(|e| err(&e));
        if replace && fs::symlink_metadata(dst).is_ok() {
            let tmp = temp_path(dst, "link");
            link(&tmp)?;
            if let Err(e) = fs::rename(&tmp, dst) {
                let _ = fs::remove_file(&tmp);
                return Err(err(&e));
            }
        } else {
            link(dst)?;
        }
        return Ok(Outcome {
            method: Method::Hardlink,
            bytes: 0,
        });
    }
    let pending = Pending::create(dst).map_err(|e| err(&e))?;
    let len = st.len();
    let method = if options.attributes_only {
        Method::ReadWrite
    } else {
        // The one fallback rule (`LinkMode::after`): `auto` copies where
        // the volume cannot clone, `always` fails with the reason.
        let mut step = options.link.first_step();
        loop {
            match step {
                Step::Clone => match sys::clone_file_data(pending.file(), &src_file, len) {
                    Ok(()) => break Method::Reflink,
                    Err(e) => {
                        pending.file().set_len(0).map_err(|e| err(&e))?;
                        step = options.link.after(e, false);
                    }
                },
                Step::Copy { .. } => {
                    copy_data(&mut src_file, pending.file()).map_err(|e| err(&e))?;
                    break Method::ReadWrite;
                }
                Step::NextSource | Step::Fail(_) => {
                    let e = match step {
                        Step::Fail(e) => e,
                        _ => Errno::MLINK,
                    };
                    return Err(clone_error(op, e).with_src(src).with_dst(dst));
                }
            }
        }
    };
    set_times(pending.file(), &st, options).map_err(|e| err(&e))?;
    pending.place(dst, replace).map_err(|e| err(&e))?;
    set_readonly(dst, &st, options).map_err(|e| err(&e))?;
    Ok(Outcome {
        method,
        bytes: if options.attributes_only { 0 } else { len },
    })
}

/// Clone `len` bytes of `src` at `src_offset` into the existing file `dst`
/// at `dst_offset` (`len` 0: to the end of `src`). Clone only, never a
/// copy: offsets and length must be multiples of the volume's cluster
/// size, except a length that ends at the end of `src`.
///
/// # Errors
/// `Unaligned`, `CrossDevice`, `NotSupported`, `NotFound`, `IsDirectory`,
/// `NotRegularFile`, `PermissionDenied`, `InvalidInput` (range past the end
/// of `src`), `NoSpace`, `Io`.
pub fn clone_range(
    src: impl AsRef<Path>,
    src_offset: u64,
    dst: impl AsRef<Path>,
    dst_offset: u64,
    len: u64,
) -> Result<Outcome> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let op = Operation::CloneRange;
    let err = |e: &io::Error| Error::from_io(op, e).with_src(src).with_dst(dst);
    let src_file = File::open(src).map_err(|e| err(&e))?;
    let src_size = src_file.metadata().map_err(|e| err(&e))?.len();
    let dst_file = File::options().write(true).open(dst).map_err(|e| {
        let r = err(&e);
        if r.kind() == ErrorKind::NotFound {
            r.with_reason("destination does not exist (range cloning writes into an existing file)")
        } else {
            r
        }
    })?;
    if !dst_file.metadata().map_err(|e| err(&e))?.is_file() {
        return Err(Error::new(op, ErrorKind::NotRegularFile)
            .with_src(src)
            .with_dst(dst)
            .with_reason("destination is not a regular file"));
    }
    let effective_len = if len == 0 {
        src_size.saturating_sub(src_offset)
    } else {
        len
    };
    let Some(end) = src_offset
        .checked_add(effective_len)
        .filter(|&end| end <= src_size)
    else {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!(
                "range {src_offset}+{effective_len} goes past the end of the source ({src_size} bytes)"
            )));
    };
    let refused = |e: Errno| clone_error(op, e).with_src(src).with_dst(dst);
    let cluster = sys::clone_cluster_size(&src_file).map_err(refused)?;
    for (what, v) in [
        ("source offset", src_offset),
        ("destination offset", dst_offset),
    ] {
        if v % cluster != 0 {
            return Err(Error::new(op, ErrorKind::Unaligned)
                .with_src(src)
                .with_dst(dst)
                .with_reason(format!(
                    "{what} {v} is not a multiple of the volume's cluster size ({cluster} bytes)"
                )));
        }
    }
    let ends_at_eof = end == src_size;
    if effective_len % cluster != 0 && !ends_at_eof {
        return Err(Error::new(op, ErrorKind::Unaligned)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!(
                "length {effective_len} is not a multiple of the volume's cluster size ({cluster} bytes)"
            )));
    }
    // The destination must hold the whole range before blocks are shared
    // into it; a tail shorter than a cluster is shared as its whole cluster
    // and the length set here keeps what lies beyond.
    let dst_end = dst_offset.saturating_add(effective_len);
    let old_len = dst_file.metadata().map_err(|e| err(&e))?.len();
    // A partial last cluster is shared whole: it would overwrite what the
    // destination holds past the range, so only at the destination's end.
    if effective_len % cluster != 0 && dst_end < old_len {
        return Err(Error::new(op, ErrorKind::Unaligned)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!(
                "length {effective_len} is not a multiple of the volume's cluster size \
                 ({cluster} bytes): an unaligned tail may only be cloned to the end of the destination"
            )));
    }
    if dst_end > old_len {
        dst_file.set_len(dst_end).map_err(|e| err(&e))?;
    }
    let shared = effective_len.div_ceil(cluster) * cluster;
    sys::clone_file_range(&dst_file, &src_file, src_offset, shared, dst_offset).map_err(refused)?;
    dst_file
        .set_len(dst_end.max(old_len))
        .map_err(|e| err(&e))?;
    Ok(Outcome {
        method: Method::Reflink,
        bytes: effective_len,
    })
}

/// Remove every file a direct placement of this process left unfinished
/// under its final name: none here, where every name is placed from a
/// temporary (a forced exit can leave only a `.NAME.cowlink-tmp-*`).
pub fn remove_unfinished() -> usize {
    0
}

/// One entry to copy: where from, where to.
struct Job {
    src: PathBuf,
    dst: PathBuf,
}

struct Tree<'a> {
    opts: &'a TreeOptions,
    observer: &'a dyn Observer,
    counts: Progress,
}

impl Tree<'_> {
    fn failed(&self, e: Error) {
        self.counts.count_failed();
        if let Some(p) = &self.opts.run.progress {
            p.count_failed();
        }
        self.observer.event(&TreeEvent::Failed(&e));
    }

    fn counted(&self, c: crate::run::Count) {
        self.counts.add(c, 1);
        if let Some(p) = &self.opts.run.progress {
            p.add(c, 1);
        }
    }

    fn file_done(&self, src: &Path, dst: &Path, outcome: Outcome) {
        self.counts.count_file(&outcome);
        if let Some(p) = &self.opts.run.progress {
            p.count_file(&outcome);
            p.done(1, outcome.bytes);
        }
        match outcome.method {
            Method::Skipped => self.observer.event(&TreeEvent::Skipped {
                src,
                dst,
                reason: SkipReason::Exists,
            }),
            Method::Hardlink => self.observer.event(&TreeEvent::Hardlink { src, dst }),
            _ => self.observer.event(&TreeEvent::File { src, dst, outcome }),
        }
    }

    fn skipped(&self, src: &Path, dst: &Path, reason: SkipReason) {
        self.counts.count_skipped();
        if let Some(p) = &self.opts.run.progress {
            p.count_skipped();
        }
        self.observer
            .event(&TreeEvent::Skipped { src, dst, reason });
    }

    fn meta_of(&self, p: &Path) -> io::Result<Metadata> {
        if self.opts.dereference {
            fs::metadata(p)
        } else {
            fs::symlink_metadata(p)
        }
    }

    /// Copy one entry that is not a directory.
    fn entry(&self, job: &Job, st: &Metadata) -> Result<()> {
        let (src, dst) = (job.src.as_path(), job.dst.as_path());
        let op = Operation::CopyTree;
        let err = |e: &io::Error| Error::from_io(op, e).with_src(src).with_dst(dst);
        if st.file_type().is_symlink() {
            if self.opts.dry_run {
                return self.planned(src, dst, Action::Symlink);
            }
            let target = fs::read_link(src).map_err(|e| err(&e))?;
            symlink_like(src, &target, dst).map_err(|e| err(&e))?;
            self.counted(crate::run::Count::Symlinks);
            self.observer.event(&TreeEvent::Symlink { src, dst });
            return Ok(());
        }
        if !st.is_file() {
            return Err(Error::new(op, ErrorKind::NotRegularFile)
                .with_src(src)
                .with_dst(dst)
                .with_reason("not a regular file, directory or symbolic link"));
        }
        if self.opts.dry_run {
            return self.planned(src, dst, Action::File { bytes: st.len() });
        }
        let mut file = self.opts.file;
        if let Ok(old) = fs::symlink_metadata(dst) {
            let same_time = || old.modified().ok() == st.modified().ok();
            if self.opts.resume && old.is_file() && old.len() == st.len() && same_time() {
                self.skipped(src, dst, SkipReason::Complete);
                return Ok(());
            }
            if self.opts.update_older
                && old.modified().ok() >= st.modified().ok()
                && old.modified().is_ok()
            {
                self.skipped(src, dst, SkipReason::NotOlder);
                return Ok(());
            }
            if self.opts.resume || self.opts.update_older {
                file.overwrite = Overwrite::Replace;
            }
        }
        match self.opts.link {
            Some(LinkKind::Symbolic) => {
                symlink_like(src, src, dst).map_err(|e| err(&e))?;
                self.counted(crate::run::Count::Symlinks);
                self.observer.event(&TreeEvent::Symlink { src, dst });
                return Ok(());
            }
            Some(LinkKind::Hard) => file.link = LinkMode::Hardlink,
            None => {}
        }
        let outcome = clone_file(src, dst, &file).map_err(|e| e.with_src(src).with_dst(dst))?;
        self.file_done(src, dst, outcome);
        Ok(())
    }

    fn planned(&self, src: &Path, dst: &Path, action: Action) -> Result<()> {
        self.observer
            .event(&TreeEvent::Planned { src, dst, action });
        Ok(())
    }

    /// Create (or merge into) the directory `job.dst`; nothing in a dry
    /// run.
    fn dir(&self, job: &Job) -> io::Result<()> {
        if self.opts.dry_run {
            return Ok(());
        }
        match fs::create_dir(&job.dst) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && job.dst.is_dir() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(windows)]
fn symlink_like(src: &Path, target: &Path, dst: &Path) -> io::Result<()> {
    // Windows tells a link to a directory from a link to a file.
    if fs::metadata(src).map(|m| m.is_dir()).unwrap_or(false) {
        std::os::windows::fs::symlink_dir(target, dst)
    } else {
        std::os::windows::fs::symlink_file(target, dst)
    }
}

#[cfg(unix)]
fn symlink_like(_src: &Path, target: &Path, dst: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, dst)
}

/// Copy `src` to `dst` with `cp -r` semantics for the entry itself (the
/// Unix engine's contract): a directory with everything in it, merged
/// into an existing directory; anything else as one entry.
///
/// # Errors
/// `Err` only when nothing could start: `src` is missing, `dst` is inside
/// `src`, or the destination directory cannot be created. Everything else
/// is passed to `observer` and counted in [`TreeReport::errors`].
pub fn copy_tree(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &TreeOptions,
    observer: &dyn Observer,
) -> Result<TreeReport, Error> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let op = Operation::CopyTree;
    let err = |e: &io::Error| Error::from_io(op, e).with_src(src).with_dst(dst);
    let tree = Tree {
        opts: options,
        observer,
        counts: Progress::default(),
    };
    if let Some(p) = &options.run.progress {
        p.enter(Phase::Copy, 0, 0);
    }
    let cancel = &options.run.cancel;
    let st = tree.meta_of(src).map_err(|e| {
        let r = err(&e);
        if r.kind() == ErrorKind::NotFound {
            r.with_reason("source does not exist")
        } else {
            r
        }
    })?;
    let root = Job {
        src: src.to_path_buf(),
        dst: dst.to_path_buf(),
    };
    if !st.is_dir() {
        if let Err(e) = tree.entry(&root, &st) {
            tree.failed(e);
        }
        return Ok(TreeReport::from_totals(tree.counts.totals(), false));
    }
    if same_file(src, dst) {
        return Err(Error::new(op, ErrorKind::SameFile)
            .with_src(src)
            .with_dst(dst)
            .with_reason("source and destination are the same directory"));
    }
    if let (Ok(s), Some(parent)) = (fs::canonicalize(src), dst.parent()) {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if let Ok(d) = fs::canonicalize(parent) {
            if d.starts_with(&s) {
                return Err(Error::new(op, ErrorKind::InvalidInput)
                    .with_src(src)
                    .with_dst(dst)
                    .with_reason("cannot copy a directory into itself"));
            }
        }
    }
    tree.dir(&root).map_err(|e| err(&e))?;
    // Directories are finished (times, read-only) after their content, in
    // the reverse order of their creation: children before parents.
    let mut finish: Vec<(Job, Metadata)> = Vec::new();
    let mut todo = vec![(root, st)];
    let mut cancelled = false;
    while let Some((job, st)) = todo.pop() {
        if cancel.is_cancelled() {
            cancelled = true;
            break;
        }
        let (s, d) = (job.src.as_path(), job.dst.as_path());
        if options.dry_run {
            observer.event(&TreeEvent::Planned {
                src: s,
                dst: d,
                action: Action::Dir,
            });
        } else {
            observer.event(&TreeEvent::Dir { src: s, dst: d });
        }
        tree.counted(crate::run::Count::Dirs);
        let read = match fs::read_dir(s) {
            Ok(r) => r,
            Err(e) => {
                tree.failed(Error::from_io(op, &e).with_src(s).with_dst(d));
                continue;
            }
        };
        for item in read {
            if cancel.is_cancelled() {
                cancelled = true;
                break;
            }
            let item = match item {
                Ok(i) => i,
                Err(e) => {
                    tree.failed(Error::from_io(op, &e).with_src(s).with_dst(d));
                    continue;
                }
            };
            let child = Job {
                src: item.path(),
                dst: d.join(item.file_name()),
            };
            let cst = match tree.meta_of(&child.src) {
                Ok(m) => m,
                Err(e) => {
                    tree.failed(
                        Error::from_io(op, &e)
                            .with_src(&child.src)
                            .with_dst(&child.dst),
                    );
                    continue;
                }
            };
            if cst.is_dir() {
                match tree.dir(&child) {
                    Ok(()) => todo.push((child, cst)),
                    Err(e) => tree.failed(
                        Error::from_io(op, &e)
                            .with_src(&child.src)
                            .with_dst(&child.dst),
                    ),
                }
            } else if let Err(e) = tree.entry(&child, &cst) {
                tree.failed(e);
            }
        }
        finish.push((job, st));
    }
    if !options.dry_run && options.file.preserve.timestamps {
        for (job, st) in finish.iter().rev() {
            let set = sys::open_for_times(&job.dst)
                .map_err(io::Error::from)
                .and_then(|f| set_times(&f, st, &options.file));
            if let Err(e) = set {
                tree.failed(Error::from_io(op, &e).with_src(&job.src).with_dst(&job.dst));
            }
        }
    }
    Ok(TreeReport::from_totals(tree.counts.totals(), cancelled))
}

/// The directory a probe looks at: `path` itself, or the directory of a
/// file.
fn dir_of(path: &Path) -> Result<PathBuf> {
    let st = fs::metadata(path).map_err(|e| Error::from_io(Operation::Probe, &e).with_src(path))?;
    if st.is_dir() {
        return Ok(path.to_path_buf());
    }
    Ok(match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    })
}

fn no_dedupe() -> Answer {
    Answer::No("Windows has no block-sharing dedupe call; cowlink dedupes only on Linux".into())
}

fn clone_answer(r: std::result::Result<(), Errno>) -> Answer {
    match r {
        Ok(()) => Answer::Yes,
        Err(e) if is_not_possible_here(e) => Answer::No(format!(
            "this volume cannot share blocks ({e}); only ReFS and Dev Drives can"
        )),
        Err(e) => Answer::Unknown(format!("the trial clone failed: {e}")),
    }
}

/// A scratch file in `dir` holding `data`, removed when dropped.
fn scratch(dir: &Path, data: &[u8]) -> std::result::Result<File, Errno> {
    loop {
        let name = format!(
            ".cowlink-probe-{}-{}",
            std::process::id(),
            NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
        );
        match sys::scratch_file(dir, &name) {
            Ok(mut f) => {
                f.write_all(data).map_err(|e| io_errno(&e))?;
                return Ok(f);
            }
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn facts_of_dir(dir: &Path) -> FsFacts {
    let stat = sys::fs_stat_path(dir).ok();
    let kind = stat.as_ref().map_or(FsKind::Unknown, FsKind::of_stat);
    let reflink = match (scratch(dir, &[0x5a; 4096]), scratch(dir, &[])) {
        (Ok(a), Ok(b)) => clone_answer(sys::clone_file_data(&b, &a, 4096)),
        (Err(e), _) | (_, Err(e)) => {
            Answer::Unknown(format!("cannot write a scratch file here to try: {e}"))
        }
    };
    FsFacts {
        path: dir.to_path_buf(),
        kind,
        magic: None,
        device: None,
        block_size: stat.map(|s| s.block_size),
        reflink,
        dedupe: no_dedupe(),
        clone_limit: kind.clone_limit(),
    }
}

/// What the volume holding `path` can do: a trial clone between two
/// scratch files there (removed by the system on close).
///
/// # Errors
/// `NotFound` or `PermissionDenied` for the path itself.
pub fn filesystem(path: impl AsRef<Path>) -> Result<FsFacts> {
    Ok(facts_of_dir(&dir_of(path.as_ref())?))
}

/// Whether `src` can be cloned to `dst` (a directory, or a file path whose
/// directory exists): for a regular `src`, a trial clone of its first
/// cluster into a scratch file in `dst`'s directory.
///
/// # Errors
/// `NotFound` when `src` or `dst`'s directory does not exist.
pub fn between(src: impl AsRef<Path>, dst: impl AsRef<Path>) -> Result<Support> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let src_dir = dir_of(src)?;
    let dst_dir = if dst.is_dir() {
        dst.to_path_buf()
    } else {
        match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    let dst_facts = facts_of_dir(&dst_dir_checked(&dst_dir)?);
    let src_facts = facts_of_dir(&src_dir);
    let volume = |p: &Path| {
        fs::canonicalize(p)
            .ok()
            .and_then(|c| c.components().next().map(|c| c.as_os_str().to_owned()))
    };
    let same_filesystem =
        matches!((volume(&src_dir), volume(&dst_dir)), (Some(a), Some(b)) if a == b);
    let reflink = if !same_filesystem {
        Answer::No("different volumes: a clone stays within one volume".into())
    } else if fs::metadata(src).is_ok_and(|m| m.is_file() && m.len() > 0) {
        match (File::open(src), scratch(&dst_dir, &[])) {
            (Ok(s), Ok(d)) => {
                let len = s.metadata().map(|m| m.len()).unwrap_or(0);
                let r = sys::clone_cluster_size(&s).and_then(|c| {
                    let n = len.min(c);
                    d.set_len(n).map_err(|e| io_errno(&e))?;
                    sys::clone_file_range(&d, &s, 0, c, 0)
                });
                clone_answer(r)
            }
            (Err(e), _) => Answer::Unknown(format!("cannot read the source to try: {e}")),
            (_, Err(e)) => Answer::Unknown(format!("cannot write a scratch file to try: {e}")),
        }
    } else {
        dst_facts.reflink.clone()
    };
    Ok(Support {
        src: src_facts,
        dst: dst_facts,
        same_filesystem,
        reflink,
    })
}

fn dst_dir_checked(dir: &Path) -> Result<PathBuf> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(dir.to_path_buf()),
        Ok(_) => Err(Error::new(Operation::Probe, ErrorKind::NotADirectory).with_dst(dir)),
        Err(e) => Err(Error::from_io(Operation::Probe, &e).with_dst(dir)),
    }
}

/// Every mount under `root` and what it can do: not on this system, which
/// has no mount table to read (volumes mounted in folders are not listed
/// anywhere `std` reaches).
///
/// # Errors
/// Always `NotSupported`, naming the reason.
pub fn tree(root: impl AsRef<Path>) -> Result<Vec<MountSupport>> {
    Err(Error::new(Operation::Probe, ErrorKind::NotSupported)
        .with_src(root.as_ref())
        .with_reason("no mount table on this system; probe a path instead"))
}

/// Forget cached answers: nothing is cached on this system, every probe
/// runs its trial.
pub fn clear_cache() {}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use cowlink_testfs::{data, names, temporaries, testfs, write_file};
    use std::os::fd::AsFd;
    use std::time::{Duration, SystemTime};

    fn shares_blocks(p: &Path) -> bool {
        let f = File::open(p).unwrap();
        let mut out = Vec::new();
        let len = f.metadata().unwrap().len();
        cowlink_sys::fiemap(f.as_fd(), 0, len, cowlink_sys::FIEMAP_FLAG_SYNC, &mut out).unwrap();
        !out.is_empty()
            && out
                .iter()
                .all(|e| e.flags & cowlink_sys::FIEMAP_EXTENT_SHARED != 0)
    }

    fn opts(link: LinkMode, overwrite: Overwrite) -> CloneOptions {
        CloneOptions {
            link,
            overwrite,
            ..CloneOptions::default()
        }
    }

    /// Where the volume clones, `auto` and `always` share blocks; where it
    /// cannot, `auto` copies and `always` fails as not supported, leaving
    /// nothing behind.
    #[test]
    #[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
    fn clones_where_possible_and_auto_copies_elsewhere() {
        let bytes = data(300_000, 1);
        let xfs = testfs!(Xfs);
        let (src, dst) = (xfs.path().join("src"), xfs.path().join("dst"));
        write_file(&src, &bytes);
        let out = clone_file(&src, &dst, &opts(LinkMode::Auto, Overwrite::Refuse)).unwrap();
        assert_eq!(
            out,
            Outcome {
                method: Method::Reflink,
                bytes: 300_000
            }
        );
        assert_eq!(fs::read(&dst).unwrap(), bytes);
        assert!(shares_blocks(&dst));
        let copy = xfs.path().join("copy");
        let out = clone_file(&src, &copy, &opts(LinkMode::Copy, Overwrite::Refuse)).unwrap();
        assert_eq!(out.method, Method::ReadWrite);
        assert_eq!(fs::read(&copy).unwrap(), bytes);
        assert!(!shares_blocks(&copy));

        let ext4 = testfs!(Ext4);
        let (src, dst) = (ext4.path().join("src"), ext4.path().join("dst"));
        write_file(&src, &bytes);
        let e = clone_file(&src, &dst, &opts(LinkMode::Clone, Overwrite::Refuse)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
        assert_eq!(names(ext4.path()), ["src"]);
        let out = clone_file(&src, &dst, &opts(LinkMode::Auto, Overwrite::Refuse)).unwrap();
        assert_eq!(out.method, Method::ReadWrite);
        assert_eq!(fs::read(&dst).unwrap(), bytes);
        assert_eq!(names(ext4.path()), ["dst", "src"]);
    }

    /// An existing destination: refused (untouched), kept (`Skipped`) or
    /// replaced; the source itself and a directory are never replaced; no
    /// temporary is left.
    #[test]
    fn existing_destinations_are_refused_kept_or_replaced() {
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("src"), d.path().join("dst"));
        fs::write(&src, b"new").unwrap();
        fs::write(&dst, b"old").unwrap();
        let e = clone_file(&src, &dst, &opts(LinkMode::Auto, Overwrite::Refuse)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        assert!(e.to_string().contains("dst"), "{e}");
        assert_eq!(fs::read(&dst).unwrap(), b"old");
        let out = clone_file(&src, &dst, &opts(LinkMode::Auto, Overwrite::Skip)).unwrap();
        assert_eq!(out.method, Method::Skipped);
        assert_eq!(fs::read(&dst).unwrap(), b"old");
        let out = clone_file(&src, &dst, &opts(LinkMode::Copy, Overwrite::Replace)).unwrap();
        assert_eq!((out.method, out.bytes), (Method::ReadWrite, 3));
        assert_eq!(fs::read(&dst).unwrap(), b"new");
        let e = clone_file(&src, &src, &opts(LinkMode::Auto, Overwrite::Replace)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SameFile);
        fs::create_dir(d.path().join("dir")).unwrap();
        let e = clone_file(
            &src,
            d.path().join("dir"),
            &opts(LinkMode::Auto, Overwrite::Replace),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IsDirectory);
        let e = clone_file(
            d.path().join("dir"),
            d.path().join("x"),
            &CloneOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IsDirectory);
        let e = clone_file(
            d.path().join("missing"),
            d.path().join("x"),
            &CloneOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(temporaries(d.path()).is_empty());
        assert_eq!(names(d.path()), ["dir", "dst", "src"]);
    }

    /// A read-only source gives a read-only copy (after it is placed, so the
    /// temporary could be removed) and its times with `timestamps`.
    #[test]
    fn read_only_and_times_are_carried() {
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("src"), d.path().join("dst"));
        fs::write(&src, b"x").unwrap();
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        File::options()
            .write(true)
            .open(&src)
            .unwrap()
            .set_modified(when)
            .unwrap();
        let mut ro = fs::metadata(&src).unwrap().permissions();
        ro.set_readonly(true);
        fs::set_permissions(&src, ro).unwrap();
        let mut o = CloneOptions::default();
        o.preserve.timestamps = true;
        clone_file(&src, &dst, &o).unwrap();
        let m = fs::metadata(&dst).unwrap();
        assert!(m.permissions().readonly());
        assert_eq!(m.modified().unwrap(), when);
        assert!(temporaries(d.path()).is_empty());
    }

    /// The walker copies files, directories and symbolic links, sets
    /// directory times last, counts what it did, skips what `Skip` keeps,
    /// and refuses to copy a directory into itself.
    #[test]
    fn tree_copy_carries_files_dirs_links_and_times() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::create_dir(src.join("empty")).unwrap();
        fs::write(src.join("top"), b"top").unwrap();
        fs::write(src.join("a/b/deep"), data(70_000, 2)).unwrap();
        std::os::unix::fs::symlink("a/b/deep", src.join("link")).unwrap();
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_200_000_000);
        for dir in ["a/b", "a", "empty"] {
            File::open(src.join(dir))
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        let dst = d.path().join("dst");
        let mut options = TreeOptions::default();
        options.file.preserve.timestamps = true;
        let seen = std::sync::Mutex::new(Vec::new());
        let observer = |e: &TreeEvent<'_>| {
            if let TreeEvent::Failed(e) = e {
                seen.lock().unwrap().push(e.to_string());
            }
        };
        let report = copy_tree(&src, &dst, &options, &observer).unwrap();
        assert!(
            seen.lock().unwrap().is_empty(),
            "{:?}",
            seen.lock().unwrap()
        );
        assert_eq!(
            (
                report.files,
                report.dirs,
                report.symlinks,
                report.bytes,
                report.errors
            ),
            (2, 4, 1, 70_003, 0)
        );
        assert_eq!(fs::read(dst.join("a/b/deep")).unwrap(), data(70_000, 2));
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            Path::new("a/b/deep")
        );
        for dir in ["a/b", "a", "empty"] {
            assert_eq!(
                fs::metadata(dst.join(dir)).unwrap().modified().unwrap(),
                when,
                "{dir}"
            );
        }
        assert!(temporaries(&dst).is_empty());

        // Again with Skip: everything exists and is kept.
        fs::write(dst.join("top"), b"changed").unwrap();
        let mut keep = TreeOptions::default();
        keep.file.overwrite = Overwrite::Skip;
        let report = copy_tree(&src, &dst, &keep, &crate::tree::Quiet).unwrap();
        assert_eq!((report.files, report.skipped), (0, 2));
        assert_eq!(fs::read(dst.join("top")).unwrap(), b"changed");

        let e = copy_tree(&src, src.join("a/inside"), &options, &crate::tree::Quiet).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(!src.join("a/inside").exists());
        let e = copy_tree(&src, &src, &options, &crate::tree::Quiet).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SameFile, "{e}");
        let e = copy_tree(
            d.path().join("none"),
            d.path().join("x"),
            &options,
            &crate::tree::Quiet,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }

    /// A dry run reports and creates nothing; a cancelled run starts
    /// nothing and says so.
    #[test]
    fn dry_runs_create_nothing_and_cancels_stop() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        fs::create_dir_all(src.join("a")).unwrap();
        fs::write(src.join("a/f"), b"12345").unwrap();
        let planned = std::sync::Mutex::new(Vec::new());
        let observer = |e: &TreeEvent<'_>| {
            if let TreeEvent::Planned { action, .. } = e {
                planned.lock().unwrap().push(action.clone());
            }
        };
        let options = TreeOptions {
            dry_run: true,
            ..TreeOptions::default()
        };
        copy_tree(&src, d.path().join("dst"), &options, &observer).unwrap();
        assert!(!d.path().join("dst").exists());
        assert!(planned.lock().unwrap().contains(&Action::File { bytes: 5 }));
        let cancelled = TreeOptions::default();
        cancelled.run.cancel.cancel();
        let r = copy_tree(&src, d.path().join("dst"), &cancelled, &crate::tree::Quiet).unwrap();
        assert!(r.cancelled);
        assert_eq!(r.files, 0);
    }

    /// Range clones check alignment against the cluster (block) size and
    /// the source's end, and share the blocks.
    #[test]
    #[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
    fn ranges_clone_aligned_and_refuse_unaligned() {
        let t = testfs!(Xfs);
        let (src, dst) = (t.path().join("src"), t.path().join("dst"));
        let bytes = data(64 * 1024, 3);
        write_file(&src, &bytes);
        write_file(&dst, &[]);
        let e = clone_range(&src, 100, &dst, 0, 4096).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unaligned, "{e}");
        let e = clone_range(&src, 0, &dst, 0, 128 * 1024).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        let out = clone_range(&src, 8192, &dst, 4096, 16384).unwrap();
        assert_eq!((out.method, out.bytes), (Method::Reflink, 16384));
        let got = fs::read(&dst).unwrap();
        assert_eq!(got.len(), 4096 + 16384);
        assert_eq!(&got[4096..], &bytes[8192..8192 + 16384]);
        assert!(got[..4096].iter().all(|&b| b == 0));
        // To the end of the source, with an unaligned tail: only where it
        // also ends the destination, whose bytes past it stay.
        let tail = t.path().join("tail");
        write_file(&tail, &bytes[..10_000]);
        let e = clone_range(&tail, 0, &dst, 0, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unaligned, "{e}");
        assert_eq!(&fs::read(&dst).unwrap()[4096..], &bytes[8192..8192 + 16384]);
        let out = clone_range(&tail, 0, &dst, 12288, 0).unwrap();
        assert_eq!(out.bytes, 10_000);
        let got = fs::read(&dst).unwrap();
        assert_eq!(got.len(), 12288 + 10_000);
        assert_eq!(&got[12288..], &bytes[..10_000]);
        assert_eq!(&got[4096..12288], &bytes[8192..16384]);
    }

    /// The probe's trial: yes where the volume clones, no with the reason
    /// where it cannot, and no scratch file left either way.
    #[test]
    #[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
    fn the_probe_tries_and_leaves_nothing() {
        let xfs = testfs!(Xfs);
        let ext4 = testfs!(Ext4);
        let facts = filesystem(xfs.path()).unwrap();
        assert_eq!(facts.reflink, Answer::Yes);
        let facts = filesystem(ext4.path()).unwrap();
        assert!(
            matches!(facts.reflink, Answer::No(_)),
            "{:?}",
            facts.reflink
        );
        write_file(&xfs.path().join("f"), &data(10_000, 4));
        let pair = between(xfs.path().join("f"), xfs.path()).unwrap();
        assert!(pair.same_filesystem);
        assert_eq!(pair.reflink, Answer::Yes);
        assert_eq!(names(xfs.path()), ["f"]);
        assert!(names(ext4.path()).is_empty());
        let e = filesystem(xfs.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(
            tree(xfs.path()).unwrap_err().kind(),
            ErrorKind::NotSupported
        );
    }
}
