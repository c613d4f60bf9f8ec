//! The tree copy as a driver of the walker copier (`crate::walk::pool`):
//! opening each source directory and creating its copy, typing and handing
//! every other entry to `entry.rs`, and setting a directory's metadata
//! when the copier reports everything below it done ([`DirNode`] is the
//! copier's directory).

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, Dir, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::ctx::Ctx;
use super::entry;
use super::links::LinkTable;
use super::node::DirNode;
use super::{Observer, TreeEvent, TreeOptions, TreeReport};
use crate::ground::error::{errno_text, Error, ErrorKind, Operation};
use crate::prim::place::Placement;
use crate::run::{Count, Progress};
use crate::walk::pool::{self, Next};

/// The copy's side of the walk: the run's [`Ctx`].
struct Copier<'a> {
    ctx: Ctx<'a>,
}

impl pool::Driver for Copier<'_> {
    type Root = Arc<DirNode>;
    type Dir = DirNode;

    fn open_root(&self, root: Arc<DirNode>) -> Option<Arc<DirNode>> {
        Some(root)
    }

    fn open(&self, parent: &Arc<DirNode>, name: &CStr) -> Option<Arc<DirNode>> {
        self.open_dir(parent, name)
            .map_err(|e| self.ctx.fail(e))
            .ok()
    }

    fn reader<'d>(&self, dir: &'d DirNode) -> &'d Mutex<Option<Dir>> {
        &dir.reader
    }

    fn read_failed(&self, dir: &DirNode, e: Errno) {
        self.ctx.fail(
            Error::from_errno(Operation::CopyTree, e)
                .with_src(&dir.src_path)
                .with_reason(format!("cannot read the directory: {}", errno_text(e))),
        );
    }

    fn entry(&self, dir: &Arc<DirNode>, name: &CStr, t: FileType, _: u64) -> Next {
        match self.entry_type(dir, name, t) {
            Ok(FileType::Directory) => return Next::Descend,
            Ok(t) => entry::copy_single(&self.ctx, dir, name, name, t),
            Err(e) => {
                let (s, d) = dir.paths(name);
                let err = Error::from_errno(Operation::CopyTree, e)
                    .with_src(&s)
                    .with_dst(&d);
                self.ctx.fail(match e {
                    Errno::NOENT => err.with_reason("source vanished during the copy"),
                    _ => err,
                });
            }
        }
        Next::Done
    }

    fn finish(&self, mut dir: DirNode) -> Option<Arc<DirNode>> {
        let parent = dir.parent.take();
        self.finish_dir(dir);
        parent
    }

    fn stopped(&self) -> bool {
        self.ctx.cancelled()
    }
}

impl Copier<'_> {
    /// Open the subdirectory `name`, create (or merge into) its copy.
    fn open_dir(&self, parent: &Arc<DirNode>, name: &CStr) -> Result<Arc<DirNode>, Error> {
        let (src_path, dst_path) = parent.paths(name);
        let err = |e: Errno| {
            Error::from_errno(Operation::CopyTree, e)
                .with_src(&src_path)
                .with_dst(&dst_path)
        };
        let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        if !self.ctx.opts.dereference {
            flags |= OFlags::NOFOLLOW;
        }
        let src = fs::openat(&parent.src, name, flags, Mode::empty()).map_err(|e| match e {
            Errno::NOENT => err(e).with_reason("source directory vanished during the copy"),
            Errno::ACCESS | Errno::PERM => {
                err(e).with_reason("permission denied opening the source directory")
            }
            Errno::NOTDIR | Errno::LOOP => {
                err(e).with_reason("source changed type during the copy")
            }
            _ => err(e),
        })?;
        let st = cowlink_sys::fstat(&src).map_err(err)?;
        if self.ctx.opts.dereference {
            let mut up = Some(parent);
            while let Some(p) = up {
                if (p.st.st_dev, p.st.st_ino) == (st.st_dev, st.st_ino) {
                    return Err(Error::new(Operation::CopyTree, ErrorKind::InvalidInput)
                        .with_src(&src_path)
                        .with_dst(&dst_path)
                        .with_reason(format!(
                            "symbolic link loop: this is the directory {} again",
                            crate::name::quoted(&p.src_path)
                        )));
                }
                up = p.parent.as_ref();
            }
        }
        let rel = parent.rel.join(OsStr::from_bytes(name.to_bytes()));
        let node = if self.ctx.opts.dry_run {
            self.ctx.emit(TreeEvent::Planned {
                src: &src_path,
                dst: &dst_path,
                action: super::Action::Dir,
            });
            new_node(src_path, dst_path, rel, src, None, st, Some(parent.clone()))?
        } else {
            let made = make_dir(
                parent.dst_fd(),
                name,
                self.ctx.opts.new_bits(st.st_mode),
                self.ctx.opts.dir_withheld(),
                self.ctx.opts.atomic,
            )
            .map_err(|(e, why)| match why {
                Some(why) => err(e).with_reason(why),
                None => err(e),
            })?;
            self.ctx.emit(TreeEvent::Dir {
                src: &src_path,
                dst: &dst_path,
            });
            new_node(
                src_path,
                dst_path,
                rel,
                src,
                Some(made),
                st,
                Some(parent.clone()),
            )?
        };
        self.ctx.count(Count::Dirs, 1);
        Ok(node)
    }

    /// The type of an entry, from `getdents` when it says, else from a stat
    /// (and always from a stat of the target when following symlinks).
    fn entry_type(&self, node: &DirNode, name: &CStr, t: FileType) -> Result<FileType, Errno> {
        let follow = self.ctx.opts.dereference && t == FileType::Symlink;
        if t != FileType::Unknown && !follow {
            return Ok(t);
        }
        let flags = if self.ctx.opts.dereference {
            fs::AtFlags::empty()
        } else {
            fs::AtFlags::SYMLINK_NOFOLLOW
        };
        let st = cowlink_sys::statat(&node.src, name, flags)?;
        Ok(cowlink_sys::file_type(st.st_mode))
    }

    fn finish_dir(&self, node: DirNode) {
        let Some(dst) = node.dst.as_ref().filter(|_| node.finish) else {
            return;
        };
        let preserve = self.ctx.opts.file.preserve;
        let mode = if preserve.mode {
            Some(node.st.st_mode & 0o7777)
        } else if node.mode_changed {
            Some(node.final_mode)
        } else {
            None
        };
        if let Err(m) = crate::prim::meta::apply_with_mode(
            node.src.as_fd(),
            &node.st,
            dst.as_fd(),
            preserve,
            mode,
        ) {
            self.ctx.fail(
                Error::from_errno(Operation::CopyTree, m.errno)
                    .with_src(&node.src_path)
                    .with_dst(&node.dst_path)
                    .with_reason(format!(
                        "cannot {} of the directory: {}",
                        m.what,
                        errno_text(m.errno)
                    )),
            );
        }
    }
}

fn new_node(
    src_path: PathBuf,
    dst_path: PathBuf,
    rel: PathBuf,
    src: OwnedFd,
    made: Option<Made>,
    st: Stat,
    parent: Option<Arc<DirNode>>,
) -> Result<Arc<DirNode>, Error> {
    // The reader gets its own descriptor: reading moves a file position,
    // `openat` on `src` does not care, and the reader closes at the end.
    let reader = rustix::io::fcntl_dupfd_cloexec(&src, 0)
        .and_then(Dir::new)
        .map_err(|e| {
            Error::from_errno(Operation::CopyTree, e)
                .with_src(&src_path)
                .with_reason(format!("cannot read the directory: {}", errno_text(e)))
        })?;
    let (dst, final_mode, mode_changed, new_gid, placement) = match made {
        Some(m) => (Some(m.fd), m.mode, m.changed, m.new_gid, m.placement),
        None => (None, 0, false, None, Placement::Atomic),
    };
    Ok(Arc::new(DirNode {
        src_path,
        dst_path,
        rel,
        src,
        dst,
        reader: Mutex::new(Some(reader)),
        st,
        final_mode,
        mode_changed,
        new_gid,
        finish: true,
        placement,
        parent,
    }))
}

/// A destination directory, created or merged into.
pub(crate) struct Made {
    pub(crate) fd: OwnedFd,
    /// The mode it should end with if modes are not preserved.
    pub(crate) mode: u32,
    /// Its mode was changed (u+rwx added) to work inside it.
    pub(crate) changed: bool,
    /// The group new files get in it, if predictable.
    pub(crate) new_gid: Option<u32>,
    /// How files get their names in it: directly when this run created
    /// it (unless every name must be crash-atomic).
    pub(crate) placement: Placement,
}

/// Create the directory `name` in `dir` with permission bits `bits` (or
/// accept an existing directory), open it, and make sure we can work inside
/// it. A new directory is made without the `withheld` bits, so that no one
/// else can use it while it is filled; they are given back (less the
/// umask) with the rest of its metadata.
pub(crate) fn make_dir(
    dir: BorrowedFd<'_>,
    name: &CStr,
    bits: u32,
    withheld: u32,
    crash_atomic: bool,
) -> Result<Made, (Errno, Option<&'static str>)> {
    let created = match fs::mkdirat(dir, name, cowlink_sys::raw_mode(bits & !withheld)) {
        Ok(()) => true,
        Err(Errno::EXIST) => false,
        Err(e @ (Errno::NOSPC | Errno::DQUOT)) => {
            return Err((e, Some("no space left on the destination filesystem")))
        }
        Err(e) => return Err((e, None)),
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = fs::openat(dir, name, flags, Mode::empty()).map_err(|e| match e {
        Errno::NOTDIR | Errno::LOOP if !created => (
            Errno::EXIST,
            Some("destination exists and is not a directory"),
        ),
        e => (e, None),
    })?;
    let st = cowlink_sys::fstat(&fd).map_err(|e| (e, None))?;
    let now = st.st_mode & 0o7777;
    let mode = if created {
        now | (bits & withheld & !crate::prim::meta::umask().unwrap_or(0o022))
    } else {
        now
    };
    let changed = mode != now || now & 0o700 != 0o700;
    if now & 0o700 != 0o700 {
        fs::fchmod(&fd, cowlink_sys::raw_mode(now | 0o700)).map_err(|e| (e, None))?;
    }
    // New files' modes follow a default ACL instead of the umask: predict
    // nothing then (see meta::Created).
    let default_acl = cowlink_sys::has_default_acl(fd.as_fd());
    let new_gid = if default_acl {
        None
    } else if mode & 0o2000 != 0 {
        Some(st.st_gid)
    } else {
        Some(rustix::process::getegid().as_raw())
    };
    Ok(Made {
        fd,
        mode,
        changed,
        new_gid,
        placement: Placement::choose(created, crash_atomic),
    })
}

/// The canonical form of a destination that may not exist yet.
fn canonical_dest(dst: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(dst).ok().or_else(|| {
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(dst.file_name()?))
    })
}

/// Open the directory containing `path` (for a single-entry copy).
fn parent_node(src: &Path, dst: &Path, dry_run: bool) -> Result<(Arc<DirNode>, CString), Error> {
    let op = Operation::CopyTree;
    let parent_of = |p: &Path| match p.parent() {
        Some(q) if !q.as_os_str().is_empty() => q.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = src.file_name().ok_or_else(|| {
        Error::new(op, ErrorKind::InvalidInput)
            .with_src(src)
            .with_reason("source has no file name")
    })?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let (sp, dp) = (parent_of(src), parent_of(dst));
    let src_fd = fs::openat(CWD, &sp, flags, Mode::empty())
        .map_err(|e| Error::from_errno(op, e).with_src(src))?;
    let dst_fd = if dry_run {
        None
    } else {
        Some(fs::openat(CWD, &dp, flags, Mode::empty()).map_err(|e| {
            Error::from_errno(op, e)
                .with_src(src)
                .with_dst(dst)
                .with_reason(format!(
                    "cannot open the directory {}: {}",
                    crate::name::quoted(&dp),
                    errno_text(e)
                ))
        })?)
    };
    let st = cowlink_sys::fstat(&src_fd).map_err(|e| Error::from_errno(op, e).with_src(src))?;
    let node = Arc::new(DirNode {
        src_path: sp,
        dst_path: dp,
        rel: PathBuf::new(),
        src: src_fd,
        dst: dst_fd,
        reader: Mutex::new(None),
        st,
        final_mode: 0,
        mode_changed: false,
        new_gid: None,
        finish: false,
        placement: Placement::Atomic,
        parent: None,
    });
    let cname = CString::new(name.as_bytes()).map_err(|_| {
        Error::new(op, ErrorKind::InvalidInput)
            .with_src(src)
            .with_reason("name contains a NUL byte")
    })?;
    Ok((node, cname))
}

/// Copy `src` to `dst` with `cp -r` semantics for the entry itself: a
/// directory is copied with everything in it (`dst` is created, or merged
/// into if it is an existing directory); a file, symbolic link or special
/// file is copied as one entry. `observer` hears about every entry.
///
/// `dst` is the name the copy gets, not a directory to copy into (that
/// choice is the caller's, as in `cowlink cp`).
///
/// # Errors
/// Returns `Err` only when nothing could start: `src` is missing, `dst` is
/// inside `src`, or the destination directory cannot be created. Everything
/// else is a per-entry failure, passed to `observer` and counted in
/// [`TreeReport::errors`].
pub fn copy_tree(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &TreeOptions,
    observer: &dyn Observer,
) -> Result<TreeReport, Error> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let op = Operation::CopyTree;
    let err = |e: Errno| Error::from_errno(op, e).with_src(src).with_dst(dst);
    let st = if options.dereference {
        cowlink_sys::stat(src)
    } else {
        cowlink_sys::lstat(src)
    }
    .map_err(|e| match e {
        Errno::NOENT => err(e).with_reason("source does not exist"),
        _ => err(e),
    })?;
    let mut copier = Copier {
        ctx: Ctx {
            opts: options,
            observer,
            counts: Progress::default(),
            links: LinkTable::default(),
            root_dst: None,
            asking: Mutex::new(()),
        },
    };
    if cowlink_sys::file_type(st.st_mode) != FileType::Directory {
        let (parent, name) = parent_node(src, dst, options.dry_run)?;
        let dst_name = CString::new(dst.file_name().unwrap_or_default().as_bytes())
            .map_err(|_| err(Errno::INVAL).with_reason("name contains a NUL byte"))?;
        entry::copy_single(
            &copier.ctx,
            &parent,
            &name,
            &dst_name,
            cowlink_sys::file_type(st.st_mode),
        );
        // The parents of a single entry are not ours to finish.
        drop(parent);
        return Ok(copier.ctx.report());
    }
    if let (Ok(s), Some(d)) = (std::fs::canonicalize(src), canonical_dest(dst)) {
        if d.starts_with(&s) {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(src)
                .with_dst(dst)
                .with_reason("cannot copy a directory into itself"));
        }
    }
    let src_fd = fs::open(
        src,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(err)?;
    let st = cowlink_sys::fstat(&src_fd).map_err(err)?;
    let made = if options.dry_run {
        None
    } else {
        let cdst = CString::new(dst.as_os_str().as_bytes())
            .map_err(|_| err(Errno::INVAL).with_reason("name contains a NUL byte"))?;
        let made = make_dir(
            CWD,
            &cdst,
            options.new_bits(st.st_mode),
            options.dir_withheld(),
            options.atomic,
        )
        .map_err(|(e, why)| match why {
            Some(why) => err(e).with_reason(why),
            None => err(e).with_reason(format!(
                "cannot create the destination directory: {}",
                errno_text(e)
            )),
        })?;
        copier.ctx.root_dst = Some(rustix::io::fcntl_dupfd_cloexec(&made.fd, 0).map_err(err)?);
        Some(made)
    };
    let root = new_node(
        src.to_path_buf(),
        dst.to_path_buf(),
        PathBuf::new(),
        src_fd,
        made,
        st,
        None,
    )?;
    copier.ctx.emit(if options.dry_run {
        TreeEvent::Planned {
            src,
            dst,
            action: super::Action::Dir,
        }
    } else {
        TreeEvent::Dir { src, dst }
    });
    copier.ctx.count(Count::Dirs, 1);

    let fs = copier
        .ctx
        .root_dst
        .as_ref()
        .map_or(crate::ground::fskind::FsKind::Other, |d| {
            crate::prim::files::kind_of(d.as_fd())
        });
    let clone_bound = options.file.link.may_clone();
    let threads = options.run.workers_for(fs, clone_bound);
    options.run.enter(crate::run::Phase::Copy, 0, 0);
    pool::run_with(&copier, vec![root], threads);
    Ok(copier.ctx.report())
}
