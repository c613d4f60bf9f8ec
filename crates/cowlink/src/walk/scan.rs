//! The read-only walk of the inspection features (`usage`, `dedupe`'s
//! planning, the store's ingest), driven by the one walker engine
//! ([`pool`]) that also drives the tree copy.
//!
//! Every directory is opened relative to its parent's descriptor
//! (`openat`, `O_NOFOLLOW`), so paths of any length and depth work and a
//! directory swapped for a symlink mid-walk is not followed. Entries reach
//! the [`Visitor`] from the pool's batches, so a huge flat directory is
//! shared between threads as well as a deep tree. Symbolic links are never
//! followed; the visitor sees them as entries. Descriptors stay bounded by
//! depth × threads, as the engine promises.
//!
//! The walk stops early when the run is cancelled or the visitor answers
//! [`ControlFlow::Break`]: no new directory is opened and no new entry is
//! handed out.

use std::ffi::{CStr, CString, OsStr};
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, Dir, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::pool::{self, Next};
use crate::ground::error::{Error, Operation};
use crate::run::Run;

/// A directory met by the walk.
#[derive(Debug)]
pub(crate) struct DirInfo {
    /// Dense id, in the order directories were opened (0 for the first).
    pub id: usize,
    /// The parent directory's id (`None` for a walk root).
    pub parent: Option<usize>,
    /// Index of the walk root this directory is under.
    pub root: usize,
    /// The path, as given plus the names below it.
    pub path: PathBuf,
}

/// One non-directory entry (or a root that is not a directory).
pub(crate) struct Entry<'a> {
    /// The directory holding it (`None` when the entry is a walk root).
    pub dir: Option<&'a DirInfo>,
    /// Index of the walk root.
    pub root: usize,
    /// The directory descriptor to open `name` relative to.
    pub dirfd: BorrowedFd<'a>,
    /// The name inside `dirfd`.
    pub name: &'a std::ffi::CStr,
    /// The walk root's own path, when the entry is a walk root (else
    /// the path is its directory's joined with `name`: see
    /// [`Entry::path`]).
    root_path: Option<&'a Path>,
    /// The type from the directory entry, when the filesystem gave one.
    pub file_type: Option<FileType>,
    /// The inode number from the directory entry (`d_ino`; `None` for a
    /// walk root). The file's own but where something is mounted on the
    /// name: only a `stat` of the name is sure.
    pub ino: Option<u64>,
}

impl Entry<'_> {
    /// The full path, for reports and for names kept. Built when asked:
    /// most entries of a large walk never need theirs (a rerun of
    /// dedupe keeps a directory and a name), and a path per entry was an
    /// allocation and a copy per file.
    pub fn path(&self) -> PathBuf {
        match (self.dir, self.root_path) {
            (Some(d), _) => d.path.join(OsStr::from_bytes(self.name.to_bytes())),
            (None, Some(p)) => p.to_path_buf(),
            (None, None) => PathBuf::from(OsStr::from_bytes(self.name.to_bytes())),
        }
    }

    /// The length in bytes of [`Entry::path`], without building it.
    pub fn path_len(&self) -> usize {
        match (self.dir, self.root_path) {
            (Some(d), _) => {
                let dir = d.path.as_os_str().len();
                let sep = usize::from(dir > 0 && !d.path.as_os_str().as_bytes().ends_with(b"/"));
                dir + sep + self.name.to_bytes().len()
            }
            (None, Some(p)) => p.as_os_str().len(),
            (None, None) => self.name.to_bytes().len(),
        }
    }
}

/// What the walk reports to.
pub(crate) trait Visitor: Sync {
    /// A directory was opened (before its entries are visited); `fd` is
    /// open on it.
    fn dir(&self, dir: &DirInfo, st: &cowlink_sys::Stat, fd: BorrowedFd<'_>);
    /// A non-directory entry. `Break` stops the walk.
    fn entry(&self, entry: Entry<'_>) -> ControlFlow<()>;
    /// A directory or root could not be opened or read.
    fn error(&self, err: Error);
    /// The directory at `path` is there but could not be opened or read
    /// whole (denied, out of descriptors, an I/O error; not one gone):
    /// what is below it was not seen, which is not to say it is gone.
    /// Reported besides [`Visitor::error`].
    fn unreadable(&self, _path: &Path) {}
    /// Whether the walk counts every entry it hands out as done in the
    /// run's progress (a visitor that counts its own work says no).
    fn counted_by_walk(&self) -> bool {
        true
    }
    /// Whether the directory at `path` (below walk root `root`) is left
    /// out: not opened, nothing below it visited (`--exclude`).
    fn skip_dir(&self, _root: usize, _path: &Path) -> bool {
        false
    }
}

/// An open directory of the walk.
struct ScanDir {
    info: DirInfo,
    fd: OwnedFd,
    reader: Mutex<Option<Dir>>,
}

struct Walk<'v> {
    visitor: &'v dyn Visitor,
    run: &'v Run,
    op: Operation,
    next_id: AtomicUsize,
    /// Set when the visitor asked to stop.
    stop: AtomicBool,
}

/// Walk `roots` with the run's threads (default: one per core), reporting
/// to `visitor` and counting entries in the run's progress. Errors are
/// reported for the operation `op` and the walk goes on. Returns whether
/// the walk was cut short (cancelled, or stopped by the visitor).
pub(crate) fn walk(roots: &[PathBuf], run: &Run, op: Operation, visitor: &dyn Visitor) -> bool {
    let w = Walk {
        visitor,
        run,
        op,
        next_id: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    let roots = roots.iter().cloned().enumerate().collect();
    pool::run(&w, roots, run.threads_or(crate::run::cores));
    pool::Driver::stopped(&w)
}

impl Walk<'_> {
    /// Directory `path` could not be opened or read: `e` reported, and,
    /// unless it is gone (removed, or replaced by something else than a
    /// directory), the directory named unreadable.
    fn dir_failed(&self, path: &Path, e: Errno) {
        self.visitor
            .error(Error::from_errno(self.op, e).with_src(path));
        if !matches!(e, Errno::NOENT | Errno::NOTDIR | Errno::LOOP) {
            self.visitor.unreadable(path);
        }
    }

    fn visit(&self, entry: Entry<'_>) {
        if self.visitor.counted_by_walk() {
            self.run.done(1, 0);
        }
        if self.visitor.entry(entry).is_break() {
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    fn new_dir(
        &self,
        parent: Option<usize>,
        root: usize,
        path: PathBuf,
        fd: OwnedFd,
        st: &cowlink_sys::Stat,
    ) -> Option<Arc<ScanDir>> {
        let info = DirInfo {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            parent,
            root,
            path,
        };
        // The reader gets its own descriptor, closed once it is read.
        let reader = match rustix::io::fcntl_dupfd_cloexec(&fd, 0).and_then(Dir::new) {
            Ok(r) => r,
            Err(e) => {
                // Open, so there (out of descriptors, most likely).
                self.visitor
                    .error(Error::from_errno(self.op, e).with_src(&info.path));
                self.visitor.unreadable(&info.path);
                return None;
            }
        };
        self.visitor.dir(&info, st, fd.as_fd());
        Some(Arc::new(ScanDir {
            info,
            fd,
            reader: Mutex::new(Some(reader)),
        }))
    }
}

impl pool::Driver for Walk<'_> {
    type Root = (usize, PathBuf);
    type Dir = ScanDir;

    fn open_root(&self, (root, path): Self::Root) -> Option<Arc<ScanDir>> {
        let path = &path;
        let err = |e| Error::from_errno(self.op, e).with_src(path);
        let st = match cowlink_sys::lstat(path) {
            Ok(st) => st,
            Err(e) => {
                self.dir_failed(path, e);
                return None;
            }
        };
        if cowlink_sys::file_type(st.st_mode) != FileType::Directory {
            let (parent, name) = split(path);
            let name = CString::new(name.as_bytes()).ok()?;
            match fs::open(
                parent,
                cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(dirfd) => self.visit(Entry {
                    dir: None,
                    root,
                    dirfd: dirfd.as_fd(),
                    name: &name,
                    root_path: Some(path),
                    file_type: Some(cowlink_sys::file_type(st.st_mode)),
                    ino: None,
                }),
                Err(e) => self.visitor.error(err(e)),
            }
            return None;
        }
        match open_dir(CWD, path.as_os_str().as_bytes()) {
            Ok((fd, st)) => self.new_dir(None, root, path.to_path_buf(), fd, &st),
            Err(e) => {
                self.dir_failed(path, e);
                None
            }
        }
    }

    fn open(&self, parent: &Arc<ScanDir>, name: &CStr) -> Option<Arc<ScanDir>> {
        let path = parent.info.path.join(OsStr::from_bytes(name.to_bytes()));
        if self.visitor.skip_dir(parent.info.root, &path) {
            return None;
        }
        match open_dir(parent.fd.as_fd(), name.to_bytes()) {
            Ok((fd, st)) => self.new_dir(Some(parent.info.id), parent.info.root, path, fd, &st),
            Err(e) => {
                self.dir_failed(&path, e);
                None
            }
        }
    }

    fn reader<'d>(&self, dir: &'d ScanDir) -> &'d Mutex<Option<Dir>> {
        &dir.reader
    }

    fn read_failed(&self, dir: &ScanDir, e: Errno) {
        // Opened, so not gone: whatever `e`, read in part at most.
        self.visitor
            .error(Error::from_errno(self.op, e).with_src(&dir.info.path));
        self.visitor.unreadable(&dir.info.path);
    }

    fn entry(&self, dir: &Arc<ScanDir>, name: &CStr, mut ft: FileType, ino: u64) -> Next {
        if ft == FileType::Unknown {
            ft = match cowlink_sys::statat(&dir.fd, name, fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => cowlink_sys::file_type(st.st_mode),
                Err(_) => FileType::Unknown,
            };
        }
        if ft == FileType::Directory {
            return Next::Descend;
        }
        self.visit(Entry {
            dir: Some(&dir.info),
            root: dir.info.root,
            dirfd: dir.fd.as_fd(),
            name,
            root_path: None,
            file_type: (ft != FileType::Unknown).then_some(ft),
            ino: Some(ino),
        });
        Next::Done
    }

    fn finish(&self, _: ScanDir) -> Option<Arc<ScanDir>> {
        None
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.run.cancelled()
    }
}

/// Open the directory `name` under `at` without following a symlink, and
/// stat it. Without touching its access time where allowed (the owner,
/// root): the walk only reads, and on Btrfs an access-time update in a
/// snapshotted subvolume unshares a metadata leaf from the snapshot, so a
/// read-only walk would grow usage.
fn open_dir(at: BorrowedFd<'_>, name: &[u8]) -> rustix::io::Result<(OwnedFd, cowlink_sys::Stat)> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match fs::openat(at, name, flags | cowlink_sys::O_NOATIME, Mode::empty()) {
        Err(rustix::io::Errno::PERM) => fs::openat(at, name, flags, Mode::empty()),
        other => other,
    }?;
    let st = cowlink_sys::fstat(&fd)?;
    Ok((fd, st))
}

/// `("dir", "name")` for "dir/name"; `(".", "name")` for "name".
fn split(path: &Path) -> (&Path, &OsStr) {
    let name = path.file_name().unwrap_or(path.as_os_str());
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    (parent, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Counts entries and asks to stop after `limit`.
    struct Stopper {
        seen: AtomicU64,
        limit: u64,
    }

    impl Visitor for Stopper {
        fn dir(&self, _: &DirInfo, _: &cowlink_sys::Stat, _: BorrowedFd<'_>) {}
        fn entry(&self, _: Entry<'_>) -> ControlFlow<()> {
            match self.seen.fetch_add(1, Ordering::Relaxed) + 1 >= self.limit {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        }
        fn error(&self, e: Error) {
            panic!("{e}");
        }
    }

    fn tree(files: usize) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("cowlink-scan-test-{}-{files}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for i in 0..files {
            let d = root.join(format!("d{}", i % 10));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("f{i}")), b"x").unwrap();
        }
        root
    }

    #[test]
    fn a_visitor_can_stop_the_walk_early() {
        let root = tree(2000);
        let v = Stopper {
            seen: AtomicU64::new(0),
            limit: 5,
        };
        let run = Run::default().with_threads(1);
        assert!(walk(
            std::slice::from_ref(&root),
            &run,
            Operation::Usage,
            &v
        ));
        assert_eq!(v.seen.load(Ordering::Relaxed), 5);

        let all = Stopper {
            seen: AtomicU64::new(0),
            limit: u64::MAX,
        };
        assert!(!walk(
            std::slice::from_ref(&root),
            &run,
            Operation::Usage,
            &all
        ));
        assert_eq!(all.seen.load(Ordering::Relaxed), 2000);
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_cancelled_run_walks_nothing() {
        let root = tree(50);
        let v = Stopper {
            seen: AtomicU64::new(0),
            limit: u64::MAX,
        };
        let run = Run::default();
        run.cancel.cancel();
        assert!(walk(
            std::slice::from_ref(&root),
            &run,
            Operation::Usage,
            &v
        ));
        assert_eq!(v.seen.load(Ordering::Relaxed), 0);
        std::fs::remove_dir_all(root).unwrap();
    }
}
