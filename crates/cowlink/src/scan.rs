//! A parallel, read-only directory walk for the inspection commands
//! (`usage`, and later dedupe planning).
//!
//! Every directory is opened relative to its parent's descriptor
//! (`openat`, `O_NOFOLLOW`), so paths of any length and depth work and a
//! directory swapped for a symlink mid-walk is not followed. Entries are
//! handed to a [`Visitor`] in batches of [`BATCH`] from rayon tasks, so a
//! huge flat directory is shared between threads as well as a deep tree.
//! Symbolic links are never followed; the visitor sees them as entries.
//!
//! Descriptors stay bounded by depth × threads whatever the width of a
//! directory: a subdirectory becomes a task holding only its name and a
//! shared reference to its parent's descriptor, and is opened when the
//! task runs (depth first on each thread, so a directory with 100,000
//! subdirectories holds one descriptor, not 100,000).
//!
//! The walk stops early when the run is cancelled or the visitor answers
//! [`ControlFlow::Break`]: no new directory is opened and no new entry is
//! handed out.

use std::ffi::{CString, OsStr};
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, Dir, FileType, Mode, OFlags, CWD};

use crate::ground::error::{Error, Operation};
use crate::run::Run;

/// Entries handed to one task.
const BATCH: usize = 64;

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
    /// The full path, for reports.
    pub path: PathBuf,
    /// The type from the directory entry, when the filesystem gave one.
    pub file_type: Option<FileType>,
}

/// What the walk reports to.
pub(crate) trait Visitor: Sync {
    /// A directory was opened (before its entries are visited).
    fn dir(&self, dir: &DirInfo, st: &fs::Stat);
    /// A non-directory entry. `Break` stops the walk.
    fn entry(&self, entry: Entry<'_>) -> ControlFlow<()>;
    /// A directory or root could not be opened or read.
    fn error(&self, err: Error);
    /// Whether the walk counts every entry it hands out as done in the
    /// run's progress (a visitor that counts its own work says no).
    fn counted_by_walk(&self) -> bool {
        true
    }
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
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(run.threads_or(crate::run::cores))
        .thread_name(|i| format!("cowlink-scan-{i}"))
        .build();
    let run = |w: &Walk<'_>| {
        rayon::scope(|s| {
            for (i, root) in roots.iter().enumerate() {
                let w = &w;
                s.spawn(move |s| w.root(s, i, root));
            }
        })
    };
    match pool {
        Ok(pool) => pool.install(|| run(&w)),
        // No threads to be had: walk on the global pool.
        Err(_) => run(&w),
    }
    w.stopped()
}

impl<'v> Walk<'v> {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.run.cancelled()
    }

    fn visit(&self, entry: Entry<'_>) {
        if self.visitor.counted_by_walk() {
            self.run.done(1, 0);
        }
        if self.visitor.entry(entry).is_break() {
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    fn root<'s>(&'s self, s: &rayon::Scope<'s>, root: usize, path: &Path) {
        let err = |e| Error::from_errno(self.op, e).with_src(path);
        let st = match fs::lstat(path) {
            Ok(st) => st,
            Err(e) => return self.visitor.error(err(e)),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            let (parent, name) = split(path);
            let Ok(name) = CString::new(name.as_bytes()) else {
                return;
            };
            return match fs::open(
                parent,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(dirfd) => self.visit(Entry {
                    dir: None,
                    root,
                    dirfd: dirfd.as_fd(),
                    name: &name,
                    path: path.to_path_buf(),
                    file_type: Some(FileType::from_raw_mode(st.st_mode)),
                }),
                Err(e) => self.visitor.error(err(e)),
            };
        }
        match open_dir(CWD, path.as_os_str().as_bytes()) {
            Ok((fd, st)) => {
                let info = self.new_dir(None, root, path.to_path_buf(), &st);
                self.read(s, fd, info);
            }
            Err(e) => self.visitor.error(err(e)),
        }
    }

    fn new_dir(
        &self,
        parent: Option<usize>,
        root: usize,
        path: PathBuf,
        st: &fs::Stat,
    ) -> Arc<DirInfo> {
        let info = DirInfo {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            parent,
            root,
            path,
        };
        self.visitor.dir(&info, st);
        Arc::new(info)
    }

    /// Open the subdirectory `name` of `parent` and read it. Runs as its
    /// own task, so only directories being read (and the parents of
    /// subdirectories still waiting) hold a descriptor.
    fn open<'s>(
        &'s self,
        s: &rayon::Scope<'s>,
        parent: Arc<OwnedFd>,
        pinfo: Arc<DirInfo>,
        name: CString,
    ) {
        if self.stopped() {
            return;
        }
        let path = pinfo.path.join(OsStr::from_bytes(name.to_bytes()));
        let opened = open_dir(parent.as_fd(), name.to_bytes());
        drop(parent);
        match opened {
            Ok((sub, st)) => {
                let child = self.new_dir(Some(pinfo.id), pinfo.root, path, &st);
                drop(pinfo);
                self.read(s, sub, child);
            }
            Err(e) => self
                .visitor
                .error(Error::from_errno(self.op, e).with_src(path)),
        }
    }

    /// Read the directory `fd`, spawning a task per subdirectory and per
    /// batch of other entries.
    fn read<'s>(&'s self, s: &rayon::Scope<'s>, fd: OwnedFd, info: Arc<DirInfo>) {
        let fd = Arc::new(fd);
        let mut dir = match Dir::read_from(&*fd) {
            Ok(d) => d,
            Err(e) => {
                return self
                    .visitor
                    .error(Error::from_errno(self.op, e).with_src(&info.path))
            }
        };
        let mut batch: Vec<(CString, Option<FileType>)> = Vec::new();
        for item in dir.by_ref() {
            if self.stopped() {
                return;
            }
            let e = match item {
                Ok(e) => e,
                Err(e) => {
                    self.visitor
                        .error(Error::from_errno(self.op, e).with_src(&info.path));
                    break;
                }
            };
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let mut ft = e.file_type();
            if ft == FileType::Unknown {
                ft = match fs::statat(&*fd, name, fs::AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => FileType::from_raw_mode(st.st_mode),
                    Err(_) => FileType::Unknown,
                };
            }
            if ft == FileType::Directory {
                let (parent, pinfo, name) = (Arc::clone(&fd), Arc::clone(&info), name.to_owned());
                s.spawn(move |s| self.open(s, parent, pinfo, name));
                continue;
            }
            batch.push((name.to_owned(), (ft != FileType::Unknown).then_some(ft)));
            if batch.len() == BATCH {
                self.spawn_batch(s, &fd, &info, std::mem::take(&mut batch));
            }
        }
        // The last batch runs here: this task is done reading anyway.
        self.visit_batch(&fd, &info, batch);
    }

    fn spawn_batch<'s>(
        &'s self,
        s: &rayon::Scope<'s>,
        fd: &Arc<OwnedFd>,
        info: &Arc<DirInfo>,
        batch: Vec<(CString, Option<FileType>)>,
    ) {
        let (fd, info) = (Arc::clone(fd), Arc::clone(info));
        s.spawn(move |_| self.visit_batch(&fd, &info, batch));
    }

    fn visit_batch(&self, fd: &OwnedFd, info: &DirInfo, batch: Vec<(CString, Option<FileType>)>) {
        for (name, file_type) in &batch {
            if self.stopped() {
                return;
            }
            self.visit(Entry {
                dir: Some(info),
                root: info.root,
                dirfd: fd.as_fd(),
                name,
                path: info.path.join(OsStr::from_bytes(name.to_bytes())),
                file_type: *file_type,
            });
        }
    }
}

/// Open the directory `name` under `at` without following a symlink, and
/// stat it.
fn open_dir(at: BorrowedFd<'_>, name: &[u8]) -> rustix::io::Result<(OwnedFd, fs::Stat)> {
    let fd = fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = fs::fstat(&fd)?;
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
        fn dir(&self, _: &DirInfo, _: &fs::Stat) {}
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
