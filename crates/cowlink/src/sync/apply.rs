//! Carrying out a sync: the driver of the walker engine
//! (`crate::walk::pool`) over the source, each directory open on both
//! sides, each name decided by `plan` and applied with the file
//! primitives. Every destination name is reached relative to its open
//! parent and never followed.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Dir, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;

use super::filter::Filter;
use super::plan::{self, Action, Changes, EntryKind, Facts, Rules, Seen};
use super::{Observer, SyncEvent, SyncOptions, SyncReport};
use crate::ground::error::{errno_text, Error, ErrorKind, Operation};
use crate::prim::meta::{self, Preserve};
use crate::prim::mode::{LinkMode, Method, Outcome};
use crate::prim::place::{NewFile, Overwrite, Placement, UNFINISHED_MARK};
use crate::prim::transfer::{transfer, transfer_error, Source};
use crate::run::Count;
use crate::tree::copy::make_dir;
use crate::tree::links::LinkTable;
use crate::walk::pool::{self, Driver as _, Next};

const OP: Operation = Operation::Sync;

/// How often a source file that changes while it is read is read again
/// before it is reported.
const READ_ATTEMPTS: usize = 3;

fn os(name: &CStr) -> &Path {
    Path::new(OsStr::from_bytes(name.to_bytes()))
}

fn cstr(p: &Path) -> Result<CString, Error> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        Error::new(OP, ErrorKind::InvalidInput)
            .with_src(p)
            .with_reason("name contains a NUL byte")
    })
}

/// A directory being synced, open on both sides.
pub(super) struct Node {
    src_path: PathBuf,
    dst_path: PathBuf,
    /// Whether `dst_path` names a destination (not in a dry run against
    /// nothing, where no destination path exists to name).
    named: bool,
    /// Path below the destination root.
    rel: PathBuf,
    src: OwnedFd,
    /// `None` in a dry run where the destination directory does not exist.
    dst: Option<OwnedFd>,
    /// The destination directory's stat before this run changed anything
    /// in it: what its itemized line compares.
    dst_before: Option<Stat>,
    /// The destination directory's device and inode, when it is open.
    dst_id: Option<(u64, u64)>,
    reader: Mutex<Option<Dir>>,
    /// Created by this run (so it holds nothing old).
    created: bool,
    /// The group new files get in it, if predictable.
    new_gid: Option<u32>,
    placement: Placement,
    /// False for the parent of a single-entry sync: not ours to finish.
    finish: bool,
    parent: Option<Arc<Node>>,
}

impl Node {
    fn paths(&self, name: &CStr) -> (PathBuf, PathBuf, PathBuf) {
        let n = os(name);
        (
            self.src_path.join(n),
            self.dst_path.join(n),
            self.rel.join(n),
        )
    }
}

#[derive(Default)]
struct Counters {
    created: AtomicU64,
    replaced: AtomicU64,
    metadata: AtomicU64,
    deleted: AtomicU64,
    hardlinked: AtomicU64,
    unchanged: AtomicU64,
    bytes: AtomicU64,
    cloned: AtomicU64,
    from_reflink_dest: AtomicU64,
    copied: AtomicU64,
    by_blocks: AtomicU64,
    errors: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct Syncer<'a> {
    opts: &'a SyncOptions,
    observer: &'a dyn Observer,
    filter: Filter,
    rules: Rules,
    counts: Counters,
    links: LinkTable,
    /// The destination root (for hardlinks to earlier names).
    root_dst: Option<OwnedFd>,
    /// Its device: a directory inside DST on another is a mount point.
    root_dev: u64,
    /// `--reflink-dest` directories, open.
    basis_dirs: Vec<(PathBuf, OwnedFd)>,
}

/// What a planned entry carries into its application.
struct Entry<'n> {
    node: &'n Node,
    name: &'n CStr,
    src: PathBuf,
    dst: PathBuf,
    rel: PathBuf,
}

impl Entry<'_> {
    fn err(&self, e: Errno) -> Error {
        let err = Error::from_errno(OP, e).with_src(&self.src);
        if self.node.named {
            err.with_dst(&self.dst)
        } else {
            err
        }
    }

    fn src_err(&self, e: Errno) -> Error {
        let err = self.err(e);
        match e {
            Errno::NOENT => err.with_reason("source vanished during the sync"),
            Errno::ACCESS | Errno::PERM => err.with_reason("permission denied reading the source"),
            Errno::LOOP | Errno::NOTDIR => err.with_reason("source changed type during the sync"),
            _ => err,
        }
    }

    fn dst_err(&self, e: Errno) -> Error {
        let err = self.err(e);
        match e {
            Errno::NOSPC => err.with_reason("no space left on the destination filesystem"),
            Errno::DQUOT => err.with_reason("disk quota exceeded on the destination filesystem"),
            Errno::ACCESS | Errno::PERM => {
                err.with_reason("permission denied writing the destination")
            }
            _ => err,
        }
    }

    /// An error removing the destination entry (`why`), naming a mount
    /// point inside it as the reason when there is one.
    fn remove_err(&self, e: Errno, why: &str) -> Error {
        match e {
            Errno::XDEV => self.err(e).with_reason(format!("{why}: {MOUNT_POINT}")),
            e => self
                .dst_err(e)
                .with_reason(format!("{why}: {}", errno_text(e))),
        }
    }

    /// An error opening the destination entry ([`open_dst_file`]).
    fn dst_open_err(&self, e: Errno) -> Error {
        match e {
            Errno::XDEV => self.err(e).with_reason(MOUNT_POINT),
            e => self.dst_err(e),
        }
    }

    fn dst_dir(&self) -> Option<BorrowedFd<'_>> {
        self.node.dst.as_ref().map(|d| d.as_fd())
    }
}

fn lstat_at(dir: Option<BorrowedFd<'_>>, name: &CStr) -> Result<Option<Stat>, Errno> {
    let Some(dir) = dir else { return Ok(None) };
    match cowlink_sys::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn open_file(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK;
    fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty())
}

fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    fs::openat(dir, name, flags, Mode::empty())
}

/// Open the entry `name` of the destination directory `dir` to read it:
/// never through a symbolic link, and never through a mount point (a bind
/// mount of DST's own filesystem included, which `st_dev` does not tell
/// apart): `EXDEV` then, so nothing outside DST is read as DST's or
/// written through.
fn open_dst_file(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK;
    cowlink_sys::open_same_mount(dir, name, flags)
}

/// Open the subdirectory `name` of the destination directory `dir`,
/// refusing a link and a mount point (`EXDEV`), as [`open_dst_file`].
fn open_dst_dir(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    cowlink_sys::open_dir_same_mount(dir, name)
}

/// The reason given for an `EXDEV` from [`open_dst_file`] or
/// [`open_dst_dir`].
const MOUNT_POINT: &str = "the destination entry is a mount point (another filesystem, a \
                           subvolume or a bind mount inside the destination); sync does \
                           not cross it";

/// Open the directory `rel` below `root` one component at a time, never
/// following a symbolic link (names need not be UTF-8, which `openat2`'s
/// wrapper requires).
fn open_below(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, Errno> {
    let mut cur = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    for c in rel.components() {
        let std::path::Component::Normal(n) = c else {
            return Err(Errno::XDEV);
        };
        let n = CString::new(n.as_bytes()).map_err(|_| Errno::INVAL)?;
        cur = open_dst_dir(cur.as_fd(), &n)?;
    }
    Ok(cur)
}

/// XFS's own names for a POSIX ACL, listed to root beside the
/// `system.posix_acl_*` names that carry the same ACL: not attributes of
/// their own (setting the ACL makes them), so never compared or removed.
fn is_xfs_acl(name: &[u8]) -> bool {
    name == b"trusted.SGI_ACL_FILE" || name == b"trusted.SGI_ACL_DEFAULT"
}

/// The extended attributes of `fd`, sorted by name, with their values.
fn xattrs(fd: BorrowedFd<'_>) -> Result<Vec<(CString, Vec<u8>)>, Errno> {
    let names = match meta::list_xattrs(fd) {
        Ok(n) => n,
        Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut v = Vec::new();
    for n in names
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty() && !is_xfs_acl(n))
    {
        let name = CString::new(n).map_err(|_| Errno::INVAL)?;
        match meta::get_xattr(fd, &name) {
            Ok(val) => v.push((name, val)),
            Err(Errno::NODATA) => {}
            Err(e) => return Err(e),
        }
    }
    v.sort();
    Ok(v)
}

/// The extended attributes of the entry `name` of `dir` (not followed),
/// read by name: two calls for a file without any, where opening it
/// takes four.
fn xattrs_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<Vec<(CString, Vec<u8>)>, Errno> {
    let mut buf = vec![0u8; 256];
    let got = loop {
        match cowlink_sys::list_xattrs_at(dir, name, &mut buf) {
            Ok(n) => break n,
            Err(Errno::RANGE) => {
                let n = cowlink_sys::list_xattrs_at(dir, name, &mut [])?;
                buf.resize(n.max(buf.len() * 2), 0);
            }
            // No way to reach it by name here: open it.
            Err(Errno::OPNOTSUPP) => return xattrs(open_file(dir, name)?.as_fd()),
            Err(e) => return Err(e),
        }
    };
    buf.truncate(got);
    let mut v = Vec::new();
    for n in buf
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty() && !is_xfs_acl(n))
    {
        let attr = CString::new(n).map_err(|_| Errno::INVAL)?;
        let mut val = Vec::new();
        loop {
            let len = match cowlink_sys::get_xattr_at(dir, name, &attr, &mut []) {
                Ok(len) => len,
                Err(Errno::NODATA) => break,
                Err(e) => return Err(e),
            };
            val.resize(len, 0);
            if len == 0 {
                v.push((attr, val));
                break;
            }
            match cowlink_sys::get_xattr_at(dir, name, &attr, &mut val) {
                Ok(got) => {
                    val.truncate(got);
                    v.push((attr, val));
                    break;
                }
                Err(Errno::RANGE) => continue,
                Err(Errno::NODATA) => break,
                Err(e) => return Err(e),
            }
        }
    }
    v.sort();
    Ok(v)
}

/// Remove from `dst` the extended attributes `src_has` lacks.
fn drop_extra_xattrs(src_has: &[(CString, Vec<u8>)], dst: BorrowedFd<'_>) -> Result<(), Errno> {
    for (name, _) in xattrs(dst)? {
        if !src_has.iter().any(|(n, _)| *n == name) {
            match cowlink_sys::remove_xattr(dst, &name) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Whether two stats of one source file show it unchanged in between.
fn steady(a: &Stat, b: &Stat) -> bool {
    (
        a.st_size,
        a.st_mtime,
        a.st_mtime_nsec,
        a.st_ctime,
        a.st_ctime_nsec,
    ) == (
        b.st_size,
        b.st_mtime,
        b.st_mtime_nsec,
        b.st_ctime,
        b.st_ctime_nsec,
    )
}

/// Remove the entry `name` of `dir`: a directory with everything in it,
/// never following a link and never entering another device (`EXDEV`).
fn remove_entry(dir: BorrowedFd<'_>, name: &CStr, root_dev: u64) -> Result<(), Errno> {
    match fs::unlinkat(dir, name, AtFlags::empty()) {
        // `EBUSY`: a mount point, which the open below names as such.
        Err(Errno::ISDIR | Errno::PERM | Errno::BUSY) => {}
        r => return r,
    }
    let sub = open_dst_dir(dir, name)?;
    if cowlink_sys::fstat(&sub)?.st_dev != root_dev {
        return Err(Errno::XDEV);
    }
    let mut reader = Dir::new(rustix::io::fcntl_dupfd_cloexec(&sub, 0)?)?;
    let mut names = Vec::new();
    while let Some(e) = reader.read() {
        let e = e?;
        let n = e.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
        }
    }
    for n in names {
        remove_entry(sub.as_fd(), &n, root_dev)?;
    }
    fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

impl pool::Driver for Syncer<'_> {
    type Root = Arc<Node>;
    type Dir = Node;

    fn open_root(&self, root: Arc<Node>) -> Option<Arc<Node>> {
        Some(root)
    }

    fn open(&self, parent: &Arc<Node>, name: &CStr) -> Option<Arc<Node>> {
        self.open_pair(parent, name)
            .map_err(|e| self.fail(e))
            .ok()
            .flatten()
    }

    fn reader<'d>(&self, dir: &'d Node) -> &'d Mutex<Option<Dir>> {
        &dir.reader
    }

    fn read_failed(&self, dir: &Node, e: Errno) {
        self.fail(
            Error::from_errno(OP, e)
                .with_src(&dir.src_path)
                .with_reason(format!("cannot read the directory: {}", errno_text(e))),
        );
    }

    fn entry(&self, dir: &Arc<Node>, name: &CStr, t: FileType, _: u64) -> Next {
        let (src, dst, rel) = dir.paths(name);
        let e = Entry {
            node: dir,
            name,
            src,
            dst,
            rel,
        };
        let t = match t {
            FileType::Unknown => {
                match cowlink_sys::statat(&dir.src, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => cowlink_sys::file_type(st.st_mode),
                    Err(er) => {
                        self.fail(e.src_err(er));
                        return Next::Done;
                    }
                }
            }
            t => t,
        };
        if self.filter.excluded(&e.rel, t == FileType::Directory) {
            return Next::Done;
        }
        if t == FileType::Directory {
            return Next::Descend;
        }
        if let Err(err) = self.entry_of(&e) {
            if !(err.kind() == ErrorKind::Cancelled && self.cancelled()) {
                self.fail(err);
            }
        }
        Next::Done
    }

    fn finish(&self, mut node: Node) -> Option<Arc<Node>> {
        let parent = node.parent.take();
        if node.finish {
            if self.opts.delete && !self.cancelled() {
                self.delete_extras(&node);
            }
            if let Err(e) = self.dir_metadata(&node) {
                self.fail(e);
            }
        }
        parent
    }

    fn stopped(&self) -> bool {
        self.cancelled()
    }
}

impl Syncer<'_> {
    fn cancelled(&self) -> bool {
        self.opts.run.cancelled()
    }

    fn fail(&self, e: Error) {
        bump(&self.counts.errors, 1);
        self.progress(Count::Errors, 1);
        self.observer.event(&SyncEvent::Failed(&e));
    }

    fn progress(&self, c: Count, n: u64) {
        if let Some(p) = &self.opts.run.progress {
            p.add(c, n);
        }
    }

    fn item(&self, rel: &Path, kind: EntryKind, action: Action, changes: Changes) {
        self.item_with(rel, kind, action, changes, None);
    }

    fn item_with(
        &self,
        rel: &Path,
        kind: EntryKind,
        action: Action,
        changes: Changes,
        outcome: Option<Outcome>,
    ) {
        let c = &self.counts;
        match action {
            Action::Keep => bump(&c.unchanged, 1),
            Action::Create => bump(&c.created, 1),
            Action::Replace | Action::ReplaceType => bump(&c.replaced, 1),
            Action::Metadata => bump(&c.metadata, 1),
            Action::Hardlink => bump(&c.hardlinked, 1),
            Action::Delete => bump(&c.deleted, 1),
        }
        match (action, kind) {
            (Action::Keep, _) => self.progress(Count::Skipped, 1),
            (Action::Hardlink, _) => self.progress(Count::Hardlinks, 1),
            (Action::Delete | Action::Metadata, _) => {}
            (_, EntryKind::Dir) => self.progress(Count::Dirs, 1),
            (_, EntryKind::Symlink) => self.progress(Count::Symlinks, 1),
            (_, EntryKind::Device | EntryKind::Special) => self.progress(Count::Specials, 1),
            (_, EntryKind::File) => {}
        }
        if let Some(o) = outcome {
            bump(&c.bytes, o.bytes);
            self.progress(Count::Files, 1);
            self.progress(Count::Bytes, o.bytes);
            self.opts.run.done(1, o.bytes);
            if o.method == Method::Reflink {
                bump(&c.cloned, 1);
                self.progress(Count::Cloned, 1);
            } else {
                bump(&c.copied, 1);
                self.progress(Count::Copied, 1);
                if o.method == Method::Delta {
                    bump(&c.by_blocks, 1);
                }
            }
        }
        self.observer.event(&SyncEvent::Item {
            path: rel,
            kind,
            action,
            changes,
            outcome,
        });
    }

    /// Open the source subdirectory `name` of `parent` and make its
    /// destination a directory we can work in: create it, replace another
    /// type, or open the existing one (refusing another device).
    fn open_pair(&self, parent: &Arc<Node>, name: &CStr) -> Result<Option<Arc<Node>>, Error> {
        let (src_path, dst_path, rel) = parent.paths(name);
        let e = Entry {
            node: parent,
            name,
            src: src_path,
            dst: dst_path,
            rel,
        };
        let src = open_dir(parent.src.as_fd(), name).map_err(|x| e.src_err(x))?;
        let st = cowlink_sys::fstat(&src).map_err(|x| e.src_err(x))?;
        // A source directory that is the destination directory this one
        // goes into, or one above it (a bind mount of DST inside SRC):
        // entering it would copy it into itself without end.
        let id = (st.st_dev, st.st_ino);
        let mut up = Some(parent);
        while let Some(n) = up {
            if n.dst_id == Some(id) {
                return Err(e
                    .err(Errno::LOOP)
                    .with_kind(ErrorKind::InvalidInput)
                    .with_reason(
                        "the source directory is a destination directory it would be copied \
                     into (a mount of the destination inside the source); not copied into \
                     itself",
                    ));
            }
            up = n.parent.as_ref();
        }
        let old = lstat_at(e.dst_dir(), name).map_err(|x| e.dst_err(x))?;
        let (action, changes) = match &old {
            None => (Action::Create, Changes::default()),
            Some(d) if EntryKind::of_mode(d.st_mode) == EntryKind::Dir => {
                (Action::Keep, Changes::default())
            }
            Some(_) => (Action::ReplaceType, Changes::default()),
        };
        if action != Action::Keep {
            self.item(&e.rel, EntryKind::Dir, action, changes);
        }
        let (dst, created, new_gid, placement) = match (e.dst_dir(), self.opts.dry_run) {
            (None, _) => (None, true, None, Placement::Atomic),
            (Some(_), true) if action != Action::Keep => (None, true, None, Placement::Atomic),
            (Some(dir), true) => {
                let fd = open_dst_dir(dir, name).map_err(|x| match x {
                    Errno::XDEV => e.err(x).with_reason(MOUNT_POINT),
                    x => e.dst_err(x),
                })?;
                (Some(fd), false, None, Placement::Atomic)
            }
            (Some(dir), false) => {
                if old.as_ref().is_some_and(|o| o.st_dev != self.root_dev) {
                    return Err(e.err(Errno::XDEV).with_reason(MOUNT_POINT));
                }
                // An existing directory is entered only if it is no mount
                // point: a bind mount of DST's filesystem has DST's device.
                let existing = match action {
                    Action::Keep => Some(open_dst_dir(dir, name).map_err(|x| match x {
                        Errno::XDEV => e.err(x).with_reason(MOUNT_POINT),
                        x => e.dst_err(x),
                    })?),
                    _ => None,
                };
                if let (Some(fd), true) = (&existing, self.rules.owners) {
                    // Privileged, an existing directory needs no u+rwx
                    // added to work in: its mode is not touched at all.
                    let fd = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|x| e.dst_err(x))?;
                    (Some(fd), false, None, Placement::Atomic)
                } else {
                    if action == Action::ReplaceType {
                        remove_entry(dir, name, self.root_dev).map_err(|x| {
                            e.remove_err(x, "cannot remove the entry a directory replaces")
                        })?;
                    }
                    let made = make_dir(dir, name, st.st_mode & 0o777, 0o077, false).map_err(
                        |(x, why)| match why {
                            Some(why) => e.dst_err(x).with_reason(why),
                            None => e.dst_err(x),
                        },
                    )?;
                    let created = action != Action::Keep;
                    if let Some(checked) = &existing {
                        let id =
                            |f: BorrowedFd<'_>| cowlink_sys::fstat(f).map(|s| (s.st_dev, s.st_ino));
                        let (a, b) = (id(checked.as_fd()), id(made.fd.as_fd()));
                        if a.map_err(|x| e.dst_err(x))? != b.map_err(|x| e.dst_err(x))? {
                            return Err(e
                                .err(Errno::AGAIN)
                                .with_kind(ErrorKind::ContentChanged)
                                .with_reason("destination changed during the sync"));
                        }
                    }
                    (Some(made.fd), created, made.new_gid, made.placement)
                }
            }
        };
        let reader = rustix::io::fcntl_dupfd_cloexec(&src, 0)
            .and_then(Dir::new)
            .map_err(|x| e.src_err(x))?;
        // What the directory was before this run: `old`, taken before
        // any u+rwx was added to work in it.
        let dst_before = match (&dst, action) {
            (Some(_), Action::Keep) => old,
            (Some(d), _) => Some(cowlink_sys::fstat(d).map_err(|x| e.dst_err(x))?),
            (None, _) => None,
        };
        let dst_id = match &dst {
            Some(d) => {
                let s = cowlink_sys::fstat(d).map_err(|x| e.dst_err(x))?;
                Some((s.st_dev, s.st_ino))
            }
            None => None,
        };
        Ok(Some(Arc::new(Node {
            src_path: e.src,
            dst_path: e.dst,
            named: parent.named,
            rel: e.rel,
            src,
            dst,
            dst_before,
            dst_id,
            reader: Mutex::new(Some(reader)),
            created,
            new_gid,
            placement,
            finish: true,
            parent: Some(parent.clone()),
        })))
    }

    /// Set a finished directory's metadata where it differs from its
    /// source's (always for one this run created).
    fn dir_metadata(&self, node: &Node) -> Result<(), Error> {
        let err = |x: Errno| {
            let err = Error::from_errno(OP, x).with_src(&node.src_path);
            if node.named {
                err.with_dst(&node.dst_path)
            } else {
                err
            }
        };
        let st = cowlink_sys::fstat(&node.src).map_err(err)?;
        let Some(dst) = &node.dst else { return Ok(()) };
        let d = cowlink_sys::fstat(dst).map_err(err)?;
        let src_x = if self.rules.xattrs {
            Some(xattrs(node.src.as_fd()).map_err(err)?)
        } else {
            None
        };
        let same_xattrs = match &src_x {
            Some(s) => Some(*s == xattrs(dst.as_fd()).map_err(err)?),
            None => None,
        };
        let seen = Seen {
            same_xattrs,
            ..Seen::default()
        };
        let (action, _) = plan::decide(&Facts::of(&st), Some(&Facts::of(&d)), &seen, &self.rules);
        // The line compares what the directory was before entries changed
        // in it (which moves its times); what is set compares what it is.
        let before = node.dst_before.as_ref().unwrap_or(&d);
        let (told, changes) = plan::decide(
            &Facts::of(&st),
            Some(&Facts::of(before)),
            &seen,
            &self.rules,
        );
        if node.created {
            // Reported when it was created; its metadata is part of that.
        } else if told == Action::Metadata {
            self.item(&node.rel, EntryKind::Dir, told, changes);
        } else if !node.rel.as_os_str().is_empty() {
            self.item(&node.rel, EntryKind::Dir, Action::Keep, changes);
        }
        if self.opts.dry_run || (action == Action::Keep && !node.created) {
            return Ok(());
        }
        self.set_metadata(node.src.as_fd(), &st, dst.as_fd(), src_x.as_deref())
            .map_err(|(what, x)| {
                err(x).with_reason(format!("cannot {what} of the directory: {}", errno_text(x)))
            })
    }

    /// Carry every attribute of `src` (its stat `st`, its extended
    /// attributes `src_x` if known) to the open `dst`, removing extended
    /// attributes the source lacks.
    fn set_metadata(
        &self,
        src: BorrowedFd<'_>,
        st: &Stat,
        dst: BorrowedFd<'_>,
        src_x: Option<&[(CString, Vec<u8>)]>,
    ) -> Result<(), (String, Errno)> {
        if self.rules.xattrs {
            let own;
            let src_x = match src_x {
                Some(x) => x,
                None => {
                    own = xattrs(src).map_err(|e| ("read extended attributes".to_string(), e))?;
                    &own
                }
            };
            drop_extra_xattrs(src_x, dst)
                .map_err(|e| ("remove extended attributes".to_string(), e))?;
        }
        meta::apply(src, st, dst, Preserve::ALL).map_err(|m| (m.what, m.errno))
    }

    /// `--delete`: remove what the destination directory holds and the
    /// source lacks (and, with `--delete-excluded`, what is excluded).
    fn delete_extras(&self, node: &Node) {
        let Some(dst) = &node.dst else { return };
        let reader = rustix::io::fcntl_dupfd_cloexec(dst, 0).and_then(Dir::new);
        let mut reader = match reader {
            Ok(r) => r,
            Err(x) => {
                return self.fail(
                    Error::from_errno(OP, x)
                        .with_dst(&node.dst_path)
                        .with_reason("cannot read the destination directory"),
                )
            }
        };
        let mut gone = Vec::new();
        while let Some(ent) = reader.read() {
            let Ok(ent) = ent else { break };
            let name = ent.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let Ok(Some(d)) = lstat_at(Some(dst.as_fd()), name) else {
                continue;
            };
            let kind = EntryKind::of_mode(d.st_mode);
            let rel = node.rel.join(os(name));
            let remove = if self.filter.excluded(&rel, kind == EntryKind::Dir) {
                self.opts.delete_excluded
            } else {
                matches!(
                    cowlink_sys::statat(&node.src, name, AtFlags::SYMLINK_NOFOLLOW),
                    Err(Errno::NOENT)
                )
            };
            if remove {
                gone.push((name.to_owned(), rel, kind));
            }
        }
        for (name, rel, kind) in gone {
            if !self.opts.dry_run {
                if let Err(x) = remove_entry(dst.as_fd(), &name, self.root_dev) {
                    let err = Error::from_errno(OP, x).with_dst(node.dst_path.join(os(&name)));
                    self.fail(match x {
                        Errno::XDEV => err.with_reason(
                            "a mount point is inside the destination entry; sync does not \
                             cross it (nothing below it was touched)",
                        ),
                        _ => err.with_reason(format!("cannot delete: {}", errno_text(x))),
                    });
                    continue;
                }
            }
            self.item(&rel, kind, Action::Delete, Changes::default());
        }
    }

    /// Decide on and apply one entry that is not a directory.
    fn entry_of(&self, e: &Entry<'_>) -> Result<(), Error> {
        let st = cowlink_sys::statat(&e.node.src, e.name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|x| e.src_err(x))?;
        let grouped = self.rules.hardlinks
            && st.st_nlink > 1
            && cowlink_sys::file_type(st.st_mode) == FileType::RegularFile;
        if !grouped {
            return self.single(e, &st);
        }
        let root = self.root_dst.as_ref().map(|r| r.as_fd());
        let link = |leader: &Path| -> Result<(), Error> {
            let (lparent, lname) = split(leader);
            let lname = cstr(lname)?;
            // The leader's copy, reached without following anything.
            let ldir = root.map(|r| open_below(r, lparent)).transpose();
            let ldir = ldir.map_err(|x| e.dst_err(x).with_reason("cannot reach the first name"))?;
            let lst = match &ldir {
                Some(d) => lstat_at(Some(d.as_fd()), &lname).map_err(|x| e.dst_err(x))?,
                None => None,
            };
            let old = lstat_at(e.dst_dir(), e.name).map_err(|x| e.dst_err(x))?;
            let id = |s: &Stat| (s.st_dev, s.st_ino);
            let action = plan::decide_link(old.as_ref().map(id), lst.as_ref().map(id));
            if action == Action::Hardlink && !self.opts.dry_run {
                let (Some(dir), Some(ldir)) = (e.dst_dir(), &ldir) else {
                    return Err(e.err(Errno::NOENT));
                };
                if let Some(o) = &old {
                    if EntryKind::of_mode(o.st_mode) == EntryKind::Dir {
                        remove_entry(dir, e.name, self.root_dev).map_err(|x| {
                            e.remove_err(x, "cannot remove the directory this name replaces")
                        })?;
                    }
                }
                crate::prim::place::place_name(dir, e.name, true, |d, n| {
                    fs::linkat(ldir, &lname, d, n, AtFlags::empty())
                })
                .map_err(|x| e.dst_err(x))?;
            }
            self.item(&e.rel, EntryKind::File, action, Changes::default());
            Ok(())
        };
        self.links
            .link_or_copy(&st, e.rel.clone(), false, link, || self.single(e, &st))
            .map(|_| ())
    }

    /// Decide on and apply one entry on its own (no hardlink group).
    fn single(&self, e: &Entry<'_>, st: &Stat) -> Result<(), Error> {
        let old = lstat_at(e.dst_dir(), e.name).map_err(|x| e.dst_err(x))?;
        let s = Facts::of(st);
        let d = old.as_ref().map(Facts::of);
        let needs = plan::needs(&s, d.as_ref(), &self.rules);
        let mut seen = Seen::default();
        let mut sfd = None;
        let mut src_x = None;
        if needs.content {
            let dir = e.dst_dir().expect("a destination entry was found");
            let a = open_file(e.node.src.as_fd(), e.name).map_err(|x| e.src_err(x))?;
            let b = open_dst_file(dir, e.name).map_err(|x| e.dst_open_err(x))?;
            let h = |fd: BorrowedFd<'_>| crate::ground::hash::hash_fd_at(fd, s.size, &|_| {});
            let ha = h(a.as_fd()).map_err(|x| e.src_err(x))?;
            let hb = h(b.as_fd()).map_err(|x| e.dst_err(x))?;
            seen.same_content = Some(ha == hb);
            sfd = Some(a);
        }
        if needs.xattrs {
            let dir = e.dst_dir().expect("a destination entry was found");
            let xa = xattrs_at(e.node.src.as_fd(), e.name).map_err(|x| e.src_err(x))?;
            let xb = xattrs_at(dir, e.name).map_err(|x| e.dst_err(x))?;
            seen.same_xattrs = Some(xa == xb);
            src_x = Some(xa);
        }
        if needs.target {
            let dir = e.dst_dir().expect("a destination entry was found");
            let a = fs::readlinkat(&e.node.src, e.name, Vec::new()).map_err(|x| e.src_err(x))?;
            let b = fs::readlinkat(dir, e.name, Vec::new()).map_err(|x| e.dst_err(x))?;
            seen.same_target = Some(a == b);
        }
        let (action, changes) = plan::decide(&s, d.as_ref(), &seen, &self.rules);
        if self.opts.dry_run || action == Action::Keep {
            self.item(&e.rel, s.kind, action, changes);
            return Ok(());
        }
        let dir = e
            .dst_dir()
            .expect("outside dry runs the destination is open");
        if action == Action::ReplaceType
            && old
                .as_ref()
                .is_some_and(|o| EntryKind::of_mode(o.st_mode) == EntryKind::Dir)
        {
            // `rename` cannot put a file over a directory: the directory
            // goes first (the name is absent, never mixed, meanwhile).
            remove_entry(dir, e.name, self.root_dev)
                .map_err(|x| e.remove_err(x, "cannot remove the directory this entry replaces"))?;
        }
        let mut outcome = None;
        match (action, s.kind) {
            (Action::Metadata, EntryKind::File) => {
                let sfd = match sfd {
                    Some(f) => f,
                    None => open_file(e.node.src.as_fd(), e.name).map_err(|x| e.src_err(x))?,
                };
                let dfd = open_dst_file(dir, e.name).map_err(|x| e.dst_open_err(x))?;
                let now = cowlink_sys::fstat(&dfd).map_err(|x| e.dst_err(x))?;
                if old.as_ref().map(|o| (o.st_dev, o.st_ino)) != Some((now.st_dev, now.st_ino)) {
                    return Err(e
                        .err(Errno::AGAIN)
                        .with_kind(ErrorKind::ContentChanged)
                        .with_reason("destination changed during the sync"));
                }
                let st = cowlink_sys::fstat(&sfd).map_err(|x| e.src_err(x))?;
                self.set_metadata(sfd.as_fd(), &st, dfd.as_fd(), src_x.as_deref())
                    .map_err(|(what, x)| {
                        e.err(x)
                            .with_reason(format!("cannot {what}: {}", errno_text(x)))
                    })?;
            }
            (_, EntryKind::File) => {
                let sfd = open_file(e.node.src.as_fd(), e.name).map_err(|x| e.src_err(x))?;
                outcome = Some(self.place_file(e, sfd.as_fd())?);
            }
            (_, EntryKind::Symlink) => {
                let target =
                    fs::readlinkat(&e.node.src, e.name, Vec::new()).map_err(|x| e.src_err(x))?;
                crate::prim::place::place_name(dir, e.name, true, |d, n| {
                    fs::symlinkat(target.as_c_str(), d, n)
                })
                .map_err(|x| e.dst_err(x))?;
                self.name_metadata(e, st, false)?;
            }
            (_, EntryKind::Device | EntryKind::Special) => {
                let t = cowlink_sys::file_type(st.st_mode);
                let mode = cowlink_sys::raw_mode(st.st_mode & 0o777);
                crate::prim::place::place_name(dir, e.name, true, |d, n| {
                    cowlink_sys::mknodat(d, n, t, mode, st.st_rdev)
                })
                .map_err(|x| match x {
                    Errno::PERM => e
                        .dst_err(x)
                        .with_reason("creating device nodes needs privileges (CAP_MKNOD)"),
                    x => e.dst_err(x),
                })?;
                self.name_metadata(e, st, true)?;
            }
            (_, EntryKind::Dir) => unreachable!("directories are opened, not placed"),
        }
        self.item_with(&e.rel, s.kind, action, changes, outcome);
        Ok(())
    }

    /// Owner, mode and times of a link or special file just placed, by
    /// name and without following it.
    fn name_metadata(&self, e: &Entry<'_>, st: &Stat, with_mode: bool) -> Result<(), Error> {
        let dir = e
            .dst_dir()
            .expect("outside dry runs the destination is open");
        let what = |what: &'static str| {
            move |x: Errno| {
                e.err(x)
                    .with_reason(format!("cannot {what}: {}", errno_text(x)))
            }
        };
        let (uid, gid) = (Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid));
        match fs::chownat(dir, e.name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(()) | Err(Errno::PERM) => {}
            Err(x) => return Err(what("preserve ownership")(x)),
        }
        if with_mode {
            // Never through a symbolic link swapped in under the name.
            let mode = cowlink_sys::raw_mode(st.st_mode & 0o7777);
            cowlink_sys::chmod_nofollow(dir, e.name, mode).map_err(|x| match x {
                Errno::LOOP => e
                    .err(x)
                    .with_kind(ErrorKind::ContentChanged)
                    .with_reason("destination changed during the sync"),
                x => what("set the mode")(x),
            })?;
        }
        fs::utimensat(dir, e.name, &meta::times_of(st), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(what("preserve timestamps"))
    }

    /// An open `--reflink-dest` file equal to the source of `e` (stat
    /// `st`), if one of the directories has it.
    fn basis(&self, e: &Entry<'_>, sfd: BorrowedFd<'_>, st: &Stat) -> Option<OwnedFd> {
        let (parent, name) = split(&e.rel);
        let name = cstr(name).ok()?;
        let hash = |f: BorrowedFd<'_>| {
            crate::ground::hash::hash_fd_at(f, st.st_size as u64, &|_| {})
                .ok()
                .map(|(h, _)| h)
        };
        // The source's hash, once, and only if a candidate needs it.
        let mut src_hash = None;
        for (_, root) in &self.basis_dirs {
            let Ok(dir) = open_below(root.as_fd(), parent) else {
                continue;
            };
            // Looked at before it is opened: opening a device node can
            // act on hardware, and a FIFO is nobody's data.
            match lstat_at(Some(dir.as_fd()), &name) {
                Ok(Some(b)) if cowlink_sys::file_type(b.st_mode) == FileType::RegularFile => {}
                _ => continue,
            }
            let Ok(fd) = open_file(dir.as_fd(), &name) else {
                continue;
            };
            let Ok(b) = cowlink_sys::fstat(&fd) else {
                continue;
            };
            if cowlink_sys::file_type(b.st_mode) != FileType::RegularFile || b.st_size != st.st_size
            {
                continue;
            }
            let equal = if self.rules.checksum {
                let mine = *src_hash.get_or_insert_with(|| hash(sfd));
                mine.is_some() && mine == hash(fd.as_fd())
            } else {
                (b.st_mtime, b.st_mtime_nsec) == (st.st_mtime, st.st_mtime_nsec)
            };
            if equal {
                return Some(fd);
            }
        }
        None
    }

    /// **The one step that replaces a regular file's data**: a new inode
    /// with the source's data and metadata, linked over the name `e` (or
    /// created under it in a directory this run made). The data is cloned
    /// from an equal `--reflink-dest` file, else cloned from the source,
    /// else copied. A source that changes while it is read is read again
    /// (up to [`READ_ATTEMPTS`] times) and never placed torn.
    fn place_file(&self, e: &Entry<'_>, sfd: BorrowedFd<'_>) -> Result<Outcome, Error> {
        let dir = e
            .dst_dir()
            .expect("outside dry runs the destination is open");
        let name = os(e.name);
        let placement = e.node.placement;
        let forced_exit = forced_exit_path(dir, name, &e.dst);
        for _ in 0..READ_ATTEMPTS {
            let st = cowlink_sys::fstat(sfd).map_err(|x| e.src_err(x))?;
            if cowlink_sys::file_type(st.st_mode) != FileType::RegularFile {
                return Err(e
                    .err(Errno::INVAL)
                    .with_kind(ErrorKind::NotRegularFile)
                    .with_reason("source changed type during the sync"));
            }
            let marked = placement == Placement::Direct;
            let bits = (st.st_mode & 0o777) | if marked { UNFINISHED_MARK } else { 0 };
            let file = NewFile::create(
                dir,
                Path::new("."),
                name,
                cowlink_sys::raw_mode(bits),
                placement,
                &forced_exit,
            )
            .map_err(|x| e.dst_err(x))?;
            let dfd = file.fd();
            let basis = self.basis(e, sfd, &st);
            let from_basis = basis
                .as_ref()
                .is_some_and(|b| cowlink_sys::ficlone(dfd, b.as_fd()).is_ok());
            // From another filesystem, the old version (if there is one) is
            // cloned and only the blocks that differ are written, so its
            // unchanged blocks stay shared with every earlier copy
            // (snapshots). Same filesystem: the source is cloned as ever.
            let mut from_source = false;
            if !from_basis && placement != Placement::Direct {
                match cowlink_sys::ficlone(dfd, sfd) {
                    Ok(()) => from_source = true,
                    // No old version to reuse: copied into `file` below.
                    Err(Errno::XDEV) => match self.by_blocks(e, sfd, &st, dir)? {
                        ByBlocks::Done(o) => return Ok(o),
                        ByBlocks::Again => continue,
                        ByBlocks::No => {}
                    },
                    Err(_) => {}
                }
            }
            let done = if from_basis || from_source {
                Outcome {
                    method: Method::Reflink,
                    bytes: st.st_size as u64,
                }
            } else {
                let failed = |x: Errno| transfer_error(OP, &e.src, &e.dst, x, sfd, dfd);
                let cancelled = || self.cancelled();
                transfer(
                    sfd,
                    dfd,
                    Source::of(&st),
                    LinkMode::Auto,
                    &|| Ok(()),
                    &failed,
                    &cancelled,
                )?
            };
            let after = cowlink_sys::fstat(sfd).map_err(|x| e.src_err(x))?;
            if !steady(&st, &after) {
                continue; // dropped: nothing is placed
            }
            let created = e
                .node
                .new_gid
                .filter(|_| e.node.created)
                .and_then(|gid| meta::Created::predict(bits, gid));
            let src_x = if self.rules.xattrs {
                Some(xattrs(sfd).map_err(|x| e.src_err(x))?)
            } else {
                None
            };
            match created {
                Some(c) => meta::apply_created(sfd, &st, dfd, Preserve::ALL, c)
                    .map_err(|m| (m.what, m.errno)),
                None => self.set_metadata(sfd, &st, dfd, src_x.as_deref()),
            }
            .map_err(|(what, x)| {
                e.err(x)
                    .with_reason(format!("cannot {what}: {}", errno_text(x)))
            })?;
            file.commit(name, Overwrite::Replace)
                .map_err(|x| e.dst_err(x))?;
            if from_basis {
                bump(&self.counts.from_reflink_dest, 1);
            }
            return Ok(done);
        }
        Err(e
            .err(Errno::AGAIN)
            .with_kind(ErrorKind::ContentChanged)
            .with_reason(format!(
                "source changed while it was read, {READ_ATTEMPTS} times; not placed"
            )))
    }

    /// The old version of `e` in DST, cloned, with only the blocks that
    /// differ from the source written ([`crate::delta`]), metadata set, and
    /// renamed over the name. `No` when there is no old regular file or
    /// its filesystem cannot clone; `Again` when the source (or the old
    /// version) changed while it was read.
    fn by_blocks(
        &self,
        e: &Entry<'_>,
        sfd: BorrowedFd<'_>,
        st: &Stat,
        dir: BorrowedFd<'_>,
    ) -> Result<ByBlocks, Error> {
        // Only a regular file is opened (never a device node or FIFO
        // planted under the name); its type is checked again once open.
        match lstat_at(Some(dir), e.name) {
            Ok(Some(o)) if cowlink_sys::file_type(o.st_mode) == FileType::RegularFile => {}
            _ => return Ok(ByBlocks::No),
        }
        let old = match open_dst_file(dir, e.name) {
            Ok(old) => old,
            Err(Errno::XDEV) => return Err(e.dst_open_err(Errno::XDEV)),
            Err(_) => return Ok(ByBlocks::No),
        };
        match cowlink_sys::fstat(&old) {
            Ok(o) if cowlink_sys::file_type(o.st_mode) == FileType::RegularFile => {}
            _ => return Ok(ByBlocks::No),
        }
        let cancelled = || self.cancelled();
        let target = crate::delta::Target {
            dir,
            name: Path::new(os(e.name)),
            shown: &e.dst,
        };
        let opts = crate::delta::DeltaOptions {
            cancelled: Some(&cancelled),
            ..Default::default()
        };
        let pending = match crate::delta::prepare(sfd, &e.src, old.as_fd(), target, &opts) {
            Ok(p) => p,
            Err(x) if x.kind() == ErrorKind::ContentChanged => return Ok(ByBlocks::Again),
            Err(x) => return Err(x),
        };
        // Without reflink the update is a plain full copy: placed the same way.
        let method = match pending.report().method {
            crate::delta::DeltaMethod::CloneAndPatch => Method::Delta,
            crate::delta::DeltaMethod::FullCopy => Method::ReadWrite,
        };
        let src_x = if self.rules.xattrs {
            Some(xattrs(sfd).map_err(|x| e.src_err(x))?)
        } else {
            None
        };
        self.set_metadata(sfd, st, pending.fd(), src_x.as_deref())
            .map_err(|(what, x)| {
                e.err(x)
                    .with_reason(format!("cannot {what}: {}", errno_text(x)))
            })?;
        pending.commit()?;
        Ok(ByBlocks::Done(Outcome {
            method,
            bytes: st.st_size as u64,
        }))
    }

    fn report(&self) -> SyncReport {
        let c = &self.counts;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SyncReport {
            created: g(&c.created),
            replaced: g(&c.replaced),
            metadata: g(&c.metadata),
            deleted: g(&c.deleted),
            hardlinked: g(&c.hardlinked),
            unchanged: g(&c.unchanged),
            bytes: g(&c.bytes),
            cloned: g(&c.cloned),
            cloned_from_reflink_dest: g(&c.from_reflink_dest),
            copied: g(&c.copied),
            by_blocks: g(&c.by_blocks),
            errors: g(&c.errors),
            cancelled: self.cancelled(),
            dry_run: self.opts.dry_run,
        }
    }
}

/// What [`Syncer::by_blocks`] did.
enum ByBlocks {
    /// Placed.
    Done(Outcome),
    /// The source or the old version changed while read: try again.
    Again,
    /// Not possible here: place the file another way.
    No,
}

/// The path by which a forced exit (a second Ctrl-C) removes an
/// unfinished file `name` of the open destination directory `dir`:
/// through the descriptor (`/proc/self/fd/N/name`), so that it is the file
/// this run made even if a directory above was swapped for a link
/// meanwhile (a snapshot's name can be); `shown` where there is no
/// `/proc`.
fn forced_exit_path(dir: BorrowedFd<'_>, name: &Path, shown: &Path) -> PathBuf {
    if cfg!(target_os = "linux") {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&dir);
        Path::new(&format!("/proc/self/fd/{fd}")).join(name)
    } else {
        shown.to_path_buf()
    }
}

/// `rel`'s parent and file name.
fn split(rel: &Path) -> (&Path, &Path) {
    (
        rel.parent().unwrap_or(Path::new("")),
        Path::new(rel.file_name().unwrap_or_default()),
    )
}

/// Whether `p` names a directory's contents by rsync's rule: it ends with
/// a slash (or is `.` or ends with `/.`).
fn contents_of(p: &Path) -> bool {
    let b = p.as_os_str().as_bytes();
    b.ends_with(b"/") || b == b"." || b.ends_with(b"/.")
}

/// Where [`run`] writes.
#[derive(Clone, Copy)]
pub(super) enum Dest<'a> {
    /// A path the user named: it may be reached through a symbolic link
    /// (the user's word), its last component is created when missing, and
    /// the run takes its locks ([`super::lock`]).
    Path(&'a Path),
    /// A directory the caller opened and checked (a snapshot's), written
    /// through this descriptor only and never reopened by name; `shown`
    /// names it in messages. With `lock` the run takes the locks on it;
    /// without, the caller holds locks that cover it.
    Open {
        dir: BorrowedFd<'a>,
        shown: &'a Path,
        lock: bool,
    },
    /// No destination at all: a dry run against nothing (a snapshot set
    /// without a complete snapshot), where every entry is new. Nothing
    /// is opened, locked or named as a destination.
    Nothing,
}

pub(super) fn run(
    src: &Path,
    dest: Dest<'_>,
    opts: &SyncOptions,
    observer: &dyn Observer,
) -> Result<SyncReport, Error> {
    let shown: Option<&Path> = match &dest {
        Dest::Path(p) => Some(*p),
        Dest::Open { shown, .. } => Some(*shown),
        Dest::Nothing => None,
    };
    let err = |e: Errno| {
        let x = Error::from_errno(OP, e).with_src(src);
        match shown {
            Some(d) => x.with_dst(d),
            None => x,
        }
    };
    // The same, for errors that are not of one system call.
    let refuse = |kind: ErrorKind, why: &str| {
        let x = Error::new(OP, kind).with_src(src).with_reason(why);
        match shown {
            Some(d) => x.with_dst(d),
            None => x,
        }
    };
    if matches!(dest, Dest::Nothing) && !opts.dry_run {
        return Err(refuse(
            ErrorKind::InvalidInput,
            "a sync without a destination can only be a dry run",
        ));
    }
    let contents = contents_of(src);
    let st = if contents {
        cowlink_sys::stat(src)
    } else {
        cowlink_sys::lstat(src)
    }
    .map_err(|e| match e {
        Errno::NOENT => err(e).with_reason("source does not exist"),
        _ => err(e),
    })?;
    let is_dir = cowlink_sys::file_type(st.st_mode) == FileType::Directory;
    if contents && !is_dir {
        return Err(err(Errno::NOTDIR)
            .with_kind(ErrorKind::NotADirectory)
            .with_reason("a source ending in '/' must be a directory"));
    }
    const DST_IN_SRC: &str = "the destination is inside the source";
    const SRC_IN_DST: &str = "the source is inside the destination, where --delete would remove it";
    if let Dest::Path(dst) = dest {
        if let (Ok(s), Ok(d)) = (std::fs::canonicalize(src), canonical_dest(dst)) {
            if is_dir && d.starts_with(&s) {
                return Err(refuse(ErrorKind::InvalidInput, DST_IN_SRC));
            }
            if opts.delete && s.starts_with(&d) {
                return Err(refuse(ErrorKind::InvalidInput, SRC_IN_DST));
            }
        }
    }
    // The same by identity, which an alias made by a bind mount (that no
    // path comparison sees) cannot hide: each directory's ancestors are
    // walked through "..", as the kernel resolves them.
    if is_dir {
        let src_id = (st.st_dev, st.st_ino);
        let opath = cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        // A directory that cannot be opened (a dry run into a missing
        // one) holds nothing: the steps below report it if it matters.
        let inside = |p: &Path, id: (u64, u64)| -> Result<bool, Error> {
            match fs::open(p, opath, Mode::empty()) {
                Ok(fd) => has_ancestor(fd, id).map_err(err),
                Err(_) => Ok(false),
            }
        };
        let (dst_inside, dst_id) = match &dest {
            Dest::Path(dst) => (
                inside(nearest_existing(dst), src_id)?,
                cowlink_sys::stat(*dst).ok().map(|d| (d.st_dev, d.st_ino)),
            ),
            Dest::Open { dir, .. } => {
                let fd = fs::openat(dir, c".", opath, Mode::empty()).map_err(err)?;
                let d = cowlink_sys::fstat(&fd).map_err(err)?;
                (
                    has_ancestor(fd, src_id).map_err(err)?,
                    Some((d.st_dev, d.st_ino)),
                )
            }
            Dest::Nothing => (false, None),
        };
        if dst_inside {
            return Err(refuse(ErrorKind::InvalidInput, DST_IN_SRC));
        }
        if let (true, Some(id)) = (opts.delete, dst_id) {
            if inside(src, id)? {
                return Err(refuse(ErrorKind::InvalidInput, SRC_IN_DST));
            }
        }
    }
    let filter = Filter::new(&opts.exclude)?;
    let dirflags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dst_created = false;
    let mut above = None;
    let (mut dst_fd, lock_it) = match &dest {
        // The destination itself is the user's word: it may be reached
        // through a link. Only its last component is created.
        Dest::Path(dst) => match fs::open(*dst, dirflags, Mode::empty()) {
            Ok(fd) => (Some(fd), true),
            Err(Errno::NOENT) if opts.dry_run => (None, false),
            Err(Errno::NOENT) => {
                // Runs into the directories above refuse this one before
                // it makes anything; the locks last until its own are
                // taken on the new directory.
                let parent = match dst.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                let opath = cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
                if let Ok(pfd) = fs::open(parent, opath, Mode::empty()) {
                    above = Some(super::lock::take_above_new(pfd.as_fd(), dst)?);
                }
                fs::mkdir(*dst, Mode::from_raw_mode(0o755)).map_err(|e| {
                    err(e).with_reason(format!(
                        "cannot create the destination directory: {}",
                        errno_text(e)
                    ))
                })?;
                dst_created = true;
                (
                    Some(fs::open(*dst, dirflags, Mode::empty()).map_err(err)?),
                    true,
                )
            }
            Err(e) => {
                return Err(err(e).with_reason(format!(
                    "cannot open the destination directory: {}",
                    errno_text(e)
                )))
            }
        },
        Dest::Open { dir, lock, .. } => (
            Some(rustix::io::fcntl_dupfd_cloexec(dir, 0).map_err(err)?),
            *lock,
        ),
        Dest::Nothing => (None, false),
    };
    // The checks above looked at DST's path; the run writes into the
    // directory opened since, which a rename may have put under that
    // name in between (a link into SRC): the same checks, on it.
    if let (true, Dest::Path(_), Some(fd)) = (is_dir, &dest, &dst_fd) {
        let opath = cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let here = fs::openat(fd, c".", opath, Mode::empty()).map_err(err)?;
        let d = cowlink_sys::fstat(&here).map_err(err)?;
        if has_ancestor(here, (st.st_dev, st.st_ino)).map_err(err)? {
            return Err(refuse(ErrorKind::InvalidInput, DST_IN_SRC));
        }
        if opts.delete {
            if let Ok(s) = fs::open(src, opath, Mode::empty()) {
                if has_ancestor(s, (d.st_dev, d.st_ino)).map_err(err)? {
                    return Err(refuse(ErrorKind::InvalidInput, SRC_IN_DST));
                }
            }
        }
    }
    // Held until the run returns.
    let _locks = match (&dst_fd, lock_it, shown) {
        (Some(fd), true, Some(shown)) => Some(super::lock::take(fd.as_fd(), shown, opts.dry_run)?),
        _ => None,
    };
    drop(above);
    let root_dev = match &dst_fd {
        Some(fd) => cowlink_sys::fstat(fd).map_err(err)?.st_dev,
        None => 0,
    };
    let mut basis_dirs = Vec::new();
    for d in &opts.reflink_dest {
        // A relative directory is taken from the destination: from its
        // descriptor when it is open. With no destination (a dry run
        // against nothing, which places no file) there is nothing to
        // take it from, and it is not needed.
        let (path, opened) = match (&dest, d.is_absolute()) {
            (_, true) => (d.clone(), fs::open(d, dirflags, Mode::empty())),
            (Dest::Path(dst), false) => {
                let p = dst.join(d);
                let fd = fs::open(&p, dirflags, Mode::empty());
                (p, fd)
            }
            (Dest::Open { dir, shown, .. }, false) => {
                (shown.join(d), fs::openat(dir, d, dirflags, Mode::empty()))
            }
            (Dest::Nothing, false) => continue,
        };
        let fd = opened.map_err(|e| {
            Error::from_errno(OP, e)
                .with_src(&path)
                .with_reason(format!(
                    "cannot open the --reflink-dest directory: {}",
                    errno_text(e)
                ))
        })?;
        basis_dirs.push((path, fd));
    }
    let owners = rustix::process::geteuid().is_root();
    let syncer = Syncer {
        opts,
        observer,
        filter,
        rules: Rules {
            checksum: opts.checksum,
            owners,
            xattrs: true,
            hardlinks: !opts.no_hardlinks,
        },
        counts: Counters::default(),
        links: LinkTable::default(),
        root_dst: match &dst_fd {
            Some(fd) => Some(rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(err)?),
            None => None,
        },
        root_dev,
        basis_dirs,
    };
    let name = src.file_name().map(|n| n.to_os_string());
    let (src_parent, name) = match (contents, name) {
        (false, Some(n)) => (
            match src.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
            cstr(Path::new(&n))?,
        ),
        (false, None) => {
            return Err(Error::new(OP, ErrorKind::InvalidInput)
                .with_src(src)
                .with_reason("source has no file name; add a '/' to sync its contents"))
        }
        (true, _) => (src.to_path_buf(), CString::default()),
    };
    let src_fd = fs::open(&src_parent, dirflags, Mode::empty()).map_err(err)?;
    let reader = if contents {
        Some(
            rustix::io::fcntl_dupfd_cloexec(&src_fd, 0)
                .and_then(Dir::new)
                .map_err(err)?,
        )
    } else {
        None
    };
    let dst_before = match &dst_fd {
        Some(fd) => Some(cowlink_sys::fstat(fd).map_err(err)?),
        None => None,
    };
    let top = Arc::new(Node {
        src_path: src_parent,
        dst_path: shown.map(Path::to_path_buf).unwrap_or_default(),
        named: shown.is_some(),
        rel: PathBuf::new(),
        src: src_fd,
        dst: dst_fd.take(),
        dst_id: dst_before.as_ref().map(|s| (s.st_dev, s.st_ino)),
        dst_before,
        reader: Mutex::new(reader),
        created: dst_created,
        new_gid: None,
        placement: Placement::Atomic,
        finish: contents,
        parent: None,
    });
    let fs_kind = syncer
        .root_dst
        .as_ref()
        .map_or(crate::ground::fskind::FsKind::Other, |d| {
            crate::prim::files::kind_of(d.as_fd())
        });
    let threads = opts.run.workers_for(fs_kind, true);
    opts.run.enter(crate::run::Phase::Copy, 0, 0);
    if contents {
        pool::run_with(&syncer, vec![top], threads);
    } else if is_dir {
        if let Some(node) = syncer
            .open_pair(&top, &name)
            .map_err(|e| {
                syncer.fail(e);
            })
            .ok()
            .flatten()
        {
            drop(top);
            pool::run_with(&syncer, vec![node], threads);
        }
    } else {
        syncer.entry(&top, &name, cowlink_sys::file_type(st.st_mode), st.st_ino);
    }
    opts.run.finish();
    Ok(syncer.report())
}

/// `dst` if it exists, else its parent (which must, for `dst` to be
/// made).
fn nearest_existing(dst: &Path) -> &Path {
    if cowlink_sys::stat(dst).is_ok() {
        return dst;
    }
    match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Whether the directory `fd` or one of its ancestors (reached through
/// "..", up to the root) has the identity `id` (device, inode). Bounded:
/// a chain longer than any real one is taken as not found.
fn has_ancestor(mut fd: OwnedFd, id: (u64, u64)) -> Result<bool, Errno> {
    for _ in 0..4096 {
        let st = cowlink_sys::fstat(&fd)?;
        if (st.st_dev, st.st_ino) == id {
            return Ok(true);
        }
        let up = fs::openat(
            &fd,
            c"..",
            cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let ust = cowlink_sys::fstat(&up)?;
        if (ust.st_dev, ust.st_ino) == (st.st_dev, st.st_ino) {
            return Ok(false);
        }
        fd = up;
    }
    Ok(false)
}

/// The canonical form of a destination that may not exist yet.
fn canonical_dest(dst: &Path) -> std::io::Result<PathBuf> {
    std::fs::canonicalize(dst).or_else(|_| {
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Ok(std::fs::canonicalize(parent)?.join(dst.file_name().unwrap_or_default()))
    })
}
