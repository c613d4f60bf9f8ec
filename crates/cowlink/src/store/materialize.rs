//! Placing store objects at destinations: one file
//! ([`Store::materialize`]) or a whole manifest
//! ([`Store::checkout`]).
//!
//! A single object is written to an unnamed temporary and linked into
//! place complete. A tree goes to a new or empty directory, where nothing
//! can be overwritten, so its files are created under their final names
//! and removed on error ([`Placement::Direct`]; `atomic` for unnamed
//! temporaries). Before an object is placed its size and modification-time
//! mark are checked, and it is rehashed when either says it changed.
//!
//! A tree is one parallel walk of its directories ([`Walk`]): a task per
//! directory opens it once, makes its subdirectories (each with its final
//! mode when the umask allows) and hands each to a new task, then places
//! its files (64 per task) and makes its symbolic links. Files start as
//! soon as their directory exists, not after every directory is made.
//! Last, the remaining directory modes are set deepest first (a read-only
//! directory would have refused the files created in it). Directories are
//! opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the
//! destination, so nothing is ever written through a symbolic link,
//! whatever the manifest says or anyone does to the destination meanwhile;
//! descriptors stay one per running task.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, Mode, OFlags};
use rustix::io::Errno;

use super::layout::{self, object_rel};
use super::manifest::{Digest, EntryKind, Manifest, ManifestEntry};
use super::paths::{NodeKind, PathTree};
use super::Store;
use crate::ground::error::{errno_text, is_not_possible_here, Error, ErrorKind, Operation, Result};
use crate::prim::files::split_dest;
use crate::prim::mode::{LinkMode, Method, Outcome};
use crate::prim::place::{NewFile, Overwrite, Placement};

/// Options for [`Store::checkout`].
#[derive(Debug, Clone)]
pub struct CheckoutOptions {
    /// How to place files: [`LinkMode::Clone`] by default.
    pub link: LinkMode,
    /// Rehash every object before placing it. Without it an object is
    /// rehashed only when it shows signs of change since it was stored
    /// (its size, or its modification time no longer the store's mark),
    /// which catches every write through the kernel but not silent bit rot
    /// (that is what [`Store::verify`] is for).
    pub verify: bool,
    /// Keep set-user-ID and set-group-ID bits that the manifest asks for.
    /// Off by default: a manifest is untrusted input, and a set-id file
    /// checked out by root would run as root.
    pub setid: bool,
    /// Make every file complete-or-absent even after a crash (an
    /// `O_TMPFILE` linked into place). Without it files are created under
    /// their final names (the destination is new or empty, so nothing is
    /// overwritten) and removed on error; a `SIGKILL` can leave a partial
    /// one.
    pub atomic: bool,
    /// Create symbolic links whose target is absolute or leaves the tree
    /// (refused by default: a later write through such a link by another
    /// program would land outside the destination).
    pub external_symlinks: bool,
}

impl Default for CheckoutOptions {
    /// Clones ([`LinkMode::Clone`]), rehashing only objects that show a
    /// sign of change, set-id bits dropped, not crash-atomic, external
    /// symbolic links refused.
    fn default() -> Self {
        CheckoutOptions {
            link: LinkMode::Clone,
            verify: false,
            setid: false,
            atomic: false,
            external_symlinks: false,
        }
    }
}

/// What [`Store::checkout`] did.
#[derive(Debug, Default, serde::Serialize)]
pub struct CheckoutReport {
    /// Regular files placed.
    pub files: u64,
    /// Directories created (the destination itself not counted).
    pub dirs: u64,
    /// Symbolic links created.
    pub symlinks: u64,
    /// Bytes of the files placed.
    pub bytes: u64,
    /// Files sharing the object's blocks.
    pub cloned: u64,
    /// Files physically copied.
    pub copied: u64,
    /// Files hardlinked to the object.
    pub hardlinked: u64,
    /// New object generations made because a reference limit was reached.
    pub generations_created: u64,
    /// Entries that failed (the others were placed).
    pub errors: Vec<Error>,
    /// The run was cancelled: files, links and directories not yet started
    /// were not placed (every file placed is complete; one being written
    /// was removed); the directories made got their modes.
    pub cancelled: bool,
}

#[derive(Default)]
struct Counters {
    dirs: AtomicU64,
    symlinks: AtomicU64,
    files: AtomicU64,
    bytes: AtomicU64,
    cloned: AtomicU64,
    copied: AtomicU64,
    hardlinked: AtomicU64,
    generations: AtomicU64,
}

impl Counters {
    fn count(&self, o: Outcome) {
        let counter = match o.method {
            Method::Reflink => &self.cloned,
            Method::Hardlink => &self.hardlinked,
            Method::CopyOffload | Method::ReadWrite | Method::Delta => &self.copied,
            // A checkout goes into a new or empty directory: never skips.
            Method::Skipped => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(o.bytes, Ordering::Relaxed);
    }
}

/// A file to place: name in its directory, object, mode, size.
type FileItem<'a> = (&'a str, &'a Digest, u32, u64);

/// Where and how one object is placed.
pub(super) struct Want<'a> {
    pub dir: BorrowedFd<'a>,
    pub name: &'a Path,
    /// The path shown in messages.
    pub shown: &'a Path,
    pub digest: &'a Digest,
    /// Exact permission bits to set (`None`: what creation gives).
    pub mode: Option<u32>,
    /// The size the manifest promises.
    pub size: Option<u64>,
}

/// What stays the same for every object of one call.
pub(super) struct How<'a> {
    pub link: LinkMode,
    pub placement: Placement,
    pub verify: bool,
    pub gens: &'a AtomicU64,
}

/// Files handed to one task.
const BATCH: usize = 64;

/// A symbolic link to make: name in its directory, target, path.
type LinkItem<'a> = (&'a str, &'a str, &'a str);

/// One directory of the tree: what to make in it.
struct Node<'a> {
    /// Relative to the destination (`""` for the destination itself).
    path: &'a str,
    mode: u32,
    /// Indexes of the subdirectories in [`Tree::nodes`].
    subdirs: Vec<usize>,
    files: Vec<FileItem<'a>>,
    links: Vec<LinkItem<'a>>,
    /// Created by this call (its final mode may still be due).
    made: AtomicBool,
}

/// A manifest as directories, each with its entries; node 0 is the
/// destination, and every parent comes before its children.
struct Tree<'a> {
    nodes: Vec<Node<'a>>,
}

impl<'a> Tree<'a> {
    /// The directories of `paths` (the manifest's tree, listed and
    /// implied ones, parents first); the files and links come from
    /// `entries`. Set-id bits (of files and directories) are kept only
    /// with `setid`.
    ///
    /// Each directory's lists are made at their final length, straight
    /// from the manifest (each entry's directory looked up once, then the
    /// entries counted, then placed). Building a list of every file first
    /// and moving it into lists grown by doubling held both at once: 26 MB
    /// for 223,547 files, the largest part of a checkout's peak after the
    /// manifest itself. Built from the tree the validation made, in time
    /// linear in the manifest's bytes: no path is looked up by its whole
    /// text (a 30,000-level path has 30,000 prefixes).
    fn new(paths: &PathTree<'a>, entries: &'a [ManifestEntry], setid: bool) -> Self {
        let node = |path, mode| Node {
            path,
            mode,
            subdirs: Vec::new(),
            files: Vec::new(),
            links: Vec::new(),
            made: AtomicBool::new(false),
        };
        let keep = |mode: u32| if setid { mode } else { mode & !0o6000 };
        let mut nodes = vec![node("", 0)];
        // The tree's node → this tree's directory.
        let mut index = vec![u32::MAX; paths.nodes.len()];
        index[0] = 0;
        for (k, n) in paths.nodes.iter().enumerate().skip(1) {
            if n.kind != NodeKind::Dir {
                continue;
            }
            let mode = match entries.get(n.entry as usize).map(|e| &e.kind) {
                Some(EntryKind::Dir { mode }) => keep(*mode),
                _ => 0o755,
            };
            let i = nodes.len();
            let parent = index[n.parent as usize] as usize;
            nodes[parent].subdirs.push(i);
            nodes.push(node(n.path, mode));
            index[k] = i as u32;
        }
        // Each entry's directory, found once; then how many files and
        // links each directory holds.
        let at: Vec<u32> = paths
            .of_entry
            .iter()
            .map(|&k| index[paths.nodes[k as usize].parent as usize])
            .collect();
        drop(index);
        let mut counts = vec![(0usize, 0usize); nodes.len()];
        for (e, &i) in entries.iter().zip(&at) {
            match e.kind {
                EntryKind::File { .. } => counts[i as usize].0 += 1,
                EntryKind::Symlink { .. } => counts[i as usize].1 += 1,
                EntryKind::Dir { .. } => {}
            }
        }
        for (n, (files, links)) in nodes.iter_mut().zip(counts) {
            n.files.reserve_exact(files);
            n.links.reserve_exact(links);
        }
        for (e, &i) in entries.iter().zip(&at) {
            let name = split_rel(&e.path).1;
            let node = &mut nodes[i as usize];
            match &e.kind {
                EntryKind::File { digest, mode, size } => {
                    // Set-id bits from an untrusted manifest only on request.
                    node.files.push((name, digest, keep(*mode), *size))
                }
                EntryKind::Symlink { target } => node.links.push((name, target.as_str(), &e.path)),
                EntryKind::Dir { .. } => {}
            }
        }
        Tree { nodes }
    }

    /// Entries below node `i` (its directories, files and links, at any
    /// depth): what a failure to make or open it leaves out.
    fn below(&self, i: usize) -> usize {
        // Without recursion: a manifest may nest thousands of levels.
        let (mut count, mut todo) = (0, vec![i]);
        while let Some(j) = todo.pop() {
            let n = &self.nodes[j];
            count += n.files.len() + n.links.len() + n.subdirs.len();
            todo.extend(&n.subdirs);
        }
        count
    }
}

/// One checkout's walk of its [`Tree`]: a task per directory opens it
/// once (beneath the destination, no symbolic link followed), makes its
/// subdirectories and hands each to a new task, then places its files
/// (a large directory's further batches as tasks of their own, each
/// opening it again) and makes its symbolic links. Work starts as soon as
/// the first directory exists: nothing waits for the whole tree of
/// directories, and no path is resolved once per link.
struct Walk<'w> {
    store: &'w Store,
    dest: &'w Path,
    tree: &'w Tree<'w>,
    how: How<'w>,
    counters: &'w Counters,
    /// Where the number of threads placing files is measured and held
    /// (cloning into Btrfs, when no count was asked for).
    gate: Option<&'w crate::run::Gate>,
    /// The mode a directory is made with.
    first_mode: &'w (dyn Fn(u32) -> u32 + Sync),
    /// Whether that is its final mode (else set once it is done with).
    final_now: &'w (dyn Fn(u32) -> bool + Sync),
    fail: &'w (dyn Fn(Error) + Sync),
}

/// A directory of the checkout, open while anything still works in it
/// (its own task, batches of its files, subdirectories not yet opened).
/// The last one done with it gives it its final mode, when that had to
/// wait (a read-only directory would refuse its files): nothing later
/// looks up a name in it, every subdirectory holds its own descriptor.
struct DirFd<'s, 'w> {
    fd: OwnedFd,
    node: usize,
    walk: &'s Walk<'w>,
}

impl Drop for DirFd<'_, '_> {
    fn drop(&mut self) {
        let w = self.walk;
        let node = &w.tree.nodes[self.node];
        if self.node == 0 || (w.final_now)(node.mode) || !node.made.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = fs::fchmod(&self.fd, cowlink_sys::raw_mode(node.mode)) {
            (w.fail)(merr(w.dest.join(node.path), e).with_reason(format!(
                "cannot set mode {:o}: {}",
                node.mode,
                errno_text(e)
            )));
        }
    }
}

impl<'w> Walk<'w> {
    /// Open node `i` (already made) in its parent `up` and fill it.
    fn dir<'s>(&'s self, s: &rayon::Scope<'s>, i: usize, up: Arc<DirFd<'s, 'w>>) {
        if self.store.run.cancelled() {
            return;
        }
        let Some(fd) = self.open(i, &up) else { return };
        drop(up);
        let fd = Arc::new(DirFd {
            fd,
            node: i,
            walk: self,
        });
        self.fill(s, i, fd);
    }

    /// Fill node `i`, opened as `fd`.
    fn fill<'s>(&'s self, s: &rayon::Scope<'s>, i: usize, fd: Arc<DirFd<'s, 'w>>) {
        let node = &self.tree.nodes[i];
        for &c in &node.subdirs {
            let sub = &self.tree.nodes[c];
            let first = cowlink_sys::raw_mode((self.first_mode)(sub.mode));
            match fs::mkdirat(&fd.fd, split_rel(sub.path).1, first) {
                Ok(()) => {
                    sub.made.store(true, Ordering::Relaxed);
                    self.counters.dirs.fetch_add(1, Ordering::Relaxed);
                    let up = Arc::clone(&fd);
                    s.spawn(move |s| self.dir(s, c, up));
                }
                Err(e) => (self.fail)(self.left_out(c, merr(self.dest.join(sub.path), e))),
            }
        }
        let mut batches = node.files.chunks(BATCH);
        let first = batches.next();
        for batch in batches {
            let fd = Arc::clone(&fd);
            s.spawn(move |_| self.files(fd.fd.as_fd(), node.path, batch));
        }
        if let Some(batch) = first {
            self.files(fd.fd.as_fd(), node.path, batch);
        }
        for (name, target, path) in &node.links {
            if self.store.run.cancelled() {
                return;
            }
            match fs::symlinkat(*target, &fd.fd, *name) {
                Ok(()) => {
                    self.counters.symlinks.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => (self.fail)(merr(self.dest.join(path), e)),
            }
        }
    }

    /// Node `i` opened in its parent `up` (its name only: no symbolic
    /// link followed, nothing beneath `up` left); on failure the error is
    /// reported with what it leaves out. One name per open: a directory
    /// 30,000 levels down costs what one at the top does.
    fn open(&self, i: usize, up: &DirFd<'_, '_>) -> Option<OwnedFd> {
        let path = self.tree.nodes[i].path;
        open_beneath(up.fd.as_fd(), split_rel(path).1, OFlags::RDONLY)
            .map_err(|e| {
                let err = merr(self.dest.join(path), e);
                let why = format!("cannot open the directory: {}", errno_text(e));
                (self.fail)(self.left_out(i, err.with_reason(why)))
            })
            .ok()
    }

    /// `err` about node `i`, saying how many entries below it were not
    /// placed because of it.
    fn left_out(&self, i: usize, err: Error) -> Error {
        match self.tree.below(i) {
            0 => err,
            n => {
                let why = format!("{}; the {n} entries below it were not placed", err.reason());
                err.with_reason(why)
            }
        }
    }

    /// Place `batch`, files of the directory `dir` (opened as `fd`).
    fn files(&self, fd: BorrowedFd<'_>, dir: &str, batch: &[FileItem<'_>]) {
        match self.gate {
            Some(g) => g.pass(batch.len() as u64, || self.place_all(fd, dir, batch)),
            None => self.place_all(fd, dir, batch),
        }
    }

    fn place_all(&self, fd: BorrowedFd<'_>, dir: &str, batch: &[FileItem<'_>]) {
        for (name, digest, mode, size) in batch {
            if self.store.run.cancelled() {
                return;
            }
            let shown = self.dest.join(dir).join(name);
            let want = Want {
                dir: fd,
                name: Path::new(name),
                shown: &shown,
                digest,
                mode: Some(*mode),
                size: Some(*size),
            };
            match self.store.place(&want, &self.how) {
                Ok(o) => {
                    self.counters.count(o);
                    self.store.tick(o.bytes);
                }
                Err(e) => (self.fail)(e),
            }
        }
    }
}

pub(super) fn merr(dst: impl AsRef<Path>, e: Errno) -> Error {
    Error::from_errno(Operation::Materialize, e).with_dst(dst)
}

/// Open the directory `rel` below `root` without following any symbolic
/// link and without leaving `root`.
fn open_beneath(root: BorrowedFd<'_>, rel: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    layout::open_beneath(root, rel, flags | OFlags::DIRECTORY)
}

/// `("a/b", "c")` for `"a/b/c"`, `("", "c")` for `"c"`.
fn split_rel(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

impl Store {
    /// Place the object `digest` at the new file `dest` (mode 0666 minus
    /// the umask, like any new file; [`LinkMode::Hardlink`] keeps the
    /// object's 0444). Returns how.
    ///
    /// # Errors
    /// `NotFound` (no such object, or `dest`'s directory missing),
    /// `AlreadyExists`, `NotSupported` / `CrossDevice` for
    /// [`LinkMode::Clone`] where cloning is impossible (use
    /// [`LinkMode::Auto`]), `NoSpace`, `Io`.
    pub fn materialize(
        &self,
        digest: &Digest,
        dest: impl AsRef<Path>,
        link: LinkMode,
    ) -> Result<Outcome> {
        let dest = dest.as_ref();
        let obj = self.object_path(digest);
        let parent = split_dest(Operation::Materialize, &obj, dest)?;
        let dir = fs::open(
            &parent,
            cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            merr(dest, e).with_src(&obj).with_reason(match e {
                Errno::NOENT => {
                    format!("directory {} does not exist", crate::name::quoted(&parent))
                }
                _ => errno_text(e),
            })
        })?;
        if within(self.dir.as_fd(), dir.as_fd()).map_err(|e| merr(dest, e))? {
            return Err(inside_store(&self.root, dest));
        }
        let name = dest.file_name().map(Path::new).unwrap_or(dest);
        let gens = AtomicU64::new(0);
        let want = Want {
            dir: dir.as_fd(),
            name,
            shown: dest,
            digest,
            mode: None,
            size: None,
        };
        let how = How {
            link,
            placement: Placement::Atomic,
            verify: false,
            gens: &gens,
        };
        self.place(&want, &how)
    }

    /// Recreate the tree of `manifest` in `dest` (created if missing; it
    /// must otherwise be an empty directory), in parallel, each file
    /// atomically, with the manifest's modes.
    ///
    /// The manifest is validated first: hostile paths or escaping symbolic
    /// links fail the call before anything is created. Per-file failures
    /// (a missing object, no space) are collected in the report's `errors`
    /// and the other files are still placed.
    ///
    /// # Errors
    /// `InvalidInput` for an invalid manifest, `AlreadyExists` when `dest`
    /// is a non-empty directory, `NotADirectory`, and creation errors of
    /// `dest` itself.
    pub fn checkout(
        &self,
        manifest: &Manifest,
        dest: impl AsRef<Path>,
        options: &CheckoutOptions,
    ) -> Result<CheckoutReport> {
        let dest = dest.as_ref();
        // Named by its digest only when invalid: computing it serializes
        // and hashes the whole manifest (8 MB for 50,000 files).
        let paths = manifest
            .checked_tree("the manifest", options.external_symlinks)
            .map_err(|e| e.with_src(manifest.digest().to_hex()))?;
        if options.link == LinkMode::Clone {
            self.clone_trial(manifest, dest)?;
        }
        let (root, made) = prepare_dest(dest)?;
        // A checkout inside the store would put files the manifest names
        // where the store keeps its own (an object under a digest its
        // bytes do not have, that later adds and checkouts would trust).
        if within(self.dir.as_fd(), root.as_fd()).map_err(|e| merr(dest, e))? {
            if made {
                let _ = fs::rmdir(dest);
            }
            return Err(inside_store(&self.root, dest));
        }
        // Links were judged by their exact names; a case-insensitive
        // directory would follow `UP/..` through a listed `up`.
        if casefolded(root.as_fd())
            && manifest
                .entries
                .iter()
                .any(|e| matches!(e.kind, EntryKind::Symlink { .. }))
        {
            if made {
                let _ = fs::rmdir(dest);
            }
            return Err(Error::new(Operation::Materialize, ErrorKind::NotSupported)
                .with_dst(dest)
                .with_reason(
                    "the destination is case-insensitive (casefold), and the manifest's \
                     symbolic links were checked against exact names; check out elsewhere",
                ));
        }
        let root = root.as_fd();
        let mut report = CheckoutReport::default();
        let errors = Mutex::new(Vec::new());
        let fail = |e: Error| errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);

        let tree = Tree::new(&paths, &manifest.entries, options.setid);
        drop(paths);
        let totals = manifest.file_totals();
        self.run
            .enter(crate::run::Phase::Copy, totals.files, totals.bytes);
        // A directory whose mode lets us work in it and survives the umask
        // is made with that mode at once; the others are made 0700 and get
        // their mode at the end (a read-only one would refuse its files).
        let umask = crate::prim::meta::umask();
        let final_now =
            |m: u32| m & 0o7000 == 0 && m & 0o700 == 0o700 && umask.is_some_and(|u| m & u == 0);

        let counters = Counters::default();
        let clone_bound = matches!(options.link, LinkMode::Clone | LinkMode::Auto);
        let (threads, gate) = self.threads_for(root, clone_bound);
        let walk = Walk {
            store: self,
            dest,
            tree: &tree,
            how: How {
                link: options.link,
                // The destination is new or empty: nothing to protect there.
                placement: Placement::choose(true, options.atomic),
                verify: options.verify,
                gens: &counters.generations,
            },
            counters: &counters,
            gate: gate.as_ref(),
            first_mode: &|m| if final_now(m) { m } else { 0o700 },
            final_now: &final_now,
            fail: &fail,
        };
        // The destination, opened to read (its subdirectories are
        // opened by name in it); directory modes are set as each
        // directory is done with (`DirFd`).
        let top = open_beneath(root, "", OFlags::RDONLY).map_err(|e| merr(dest, e))?;
        Store::install_n(threads, || {
            rayon::scope(|s| {
                let top = Arc::new(DirFd {
                    fd: top,
                    node: 0,
                    walk: &walk,
                });
                walk.fill(s, 0, top)
            });
        });
        report.dirs = counters.dirs.load(Ordering::Relaxed);
        report.symlinks = counters.symlinks.load(Ordering::Relaxed);
        report.files = counters.files.into_inner();
        report.bytes = counters.bytes.into_inner();
        report.cloned = counters.cloned.into_inner();
        report.copied = counters.copied.into_inner();
        report.hardlinked = counters.hardlinked.into_inner();
        report.generations_created = counters.generations.into_inner();
        report.errors = errors.into_inner().unwrap_or_default();
        report.cancelled = self.run.cancelled();
        self.run.finish();
        Ok(report)
    }

    /// Place one object per `want` and `how`; return how it was placed.
    fn place(&self, want: &Want<'_>, how: &How<'_>) -> Result<Outcome> {
        if how.link == LinkMode::Hardlink {
            return self.hardlink(want, how);
        }
        // Paths for messages are made only when a message is.
        let err = |e: Errno| merr(want.shown, e).with_src(self.object_path(want.digest));
        let create_mode = cowlink_sys::raw_mode(want.mode.map_or(0o666, |m| m & 0o777));
        let file = NewFile::create(
            want.dir,
            Path::new("."),
            want.name,
            create_mode,
            how.placement,
            want.shown,
        )
        .map_err(|e| {
            err(e).with_reason(crate::prim::files::create_reason(
                e,
                want.shown.parent().unwrap_or(want.shown),
            ))
        })?;
        let dfd = file.fd();
        let outcome = self.fill(want, how, dfd)?;
        // Creation applied the umask; set the exact bits only if it hid some.
        if let Some(m) = want.mode {
            if crate::prim::meta::umask().is_none_or(|u| m & 0o777 & u != 0) || m & 0o7000 != 0 {
                fs::fchmod(dfd, cowlink_sys::raw_mode(m)).map_err(err)?;
            }
        }
        file.commit(want.name, Overwrite::Refuse)
            .map_err(|e| match e {
                Errno::EXIST => err(e).with_reason("destination already exists"),
                _ => err(e),
            })?;
        Ok(outcome)
    }
}

impl Store {
    /// Refuse a clone-only checkout before writing anything when the
    /// destination cannot clone from the store: clone one object into an
    /// unnamed scratch file where the checkout would go (`dest`, or the
    /// directory that would hold it). No answer (no file to try, no
    /// `O_TMPFILE`, the object unreadable) lets the checkout go on and
    /// report per file as before.
    fn clone_trial(&self, manifest: &Manifest, dest: &Path) -> Result<()> {
        let Some(digest) = manifest.entries.iter().find_map(|e| match &e.kind {
            EntryKind::File { digest, .. } => Some(digest),
            _ => None,
        }) else {
            return Ok(());
        };
        let dir = match cowlink_sys::stat(dest) {
            Ok(_) => dest.to_path_buf(),
            Err(_) => match dest.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => ".".into(),
            },
        };
        let Ok(src) = self.open_in_layout(&object_rel(digest, 0)) else {
            return Ok(());
        };
        let Ok(scratch) =
            cowlink_sys::open_unnamed(fs::CWD, &dir, OFlags::RDWR, cowlink_sys::raw_mode(0o600))
        else {
            return Ok(());
        };
        match cowlink_sys::ficlone(scratch.as_fd(), src.as_fd()) {
            Err(e) if is_not_possible_here(e) => {
                let kind = crate::prim::files::kind_of(scratch.as_fd());
                let why = if e == Errno::XDEV {
                    "the store is on another filesystem".to_string()
                } else {
                    format!("{kind} cannot clone here ({})", errno_text(e))
                };
                Err(Error::new(Operation::Materialize, ErrorKind::NotSupported)
                    .with_src(&self.root)
                    .with_dst(dest)
                    .with_reason(format!(
                        "cannot clone from the store into {}: {why}; nothing was written",
                        crate::name::quoted(&dir)
                    )))
            }
            _ => Ok(()),
        }
    }
}

/// Create `dest` or accept it as an empty directory; return it opened
/// (not following a symbolic link): the descriptor checked empty, and
/// whether it was made here.
fn prepare_dest(dest: &Path) -> Result<(OwnedFd, bool)> {
    let err = |e: Errno| merr(dest, e);
    let not_dir = || {
        Error::new(Operation::Materialize, ErrorKind::NotADirectory)
            .with_dst(dest)
            .with_reason("destination exists and is not a directory")
    };
    let made = match fs::mkdir(dest, cowlink_sys::raw_mode(0o777)) {
        Ok(()) => true,
        Err(Errno::EXIST) => false,
        Err(Errno::NOENT) => {
            return Err(err(Errno::NOENT).with_reason(format!(
                "parent directory {} does not exist",
                crate::name::quoted(dest.parent().unwrap_or(Path::new("")))
            )))
        }
        Err(e) => return Err(err(e)),
    };
    // One open, and the directory it opened is the one checked empty and
    // the one filled: a name checked, then opened again, could by then
    // be another directory (swapped in by whoever can write its parent),
    // one whose entries the manifest's links were never resolved among.
    let fd = fs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOTDIR | Errno::LOOP => not_dir(),
        e => err(e),
    })?;
    if !layout::list_dir(fd.as_fd()).map_err(err)?.is_empty() {
        return Err(Error::new(Operation::Materialize, ErrorKind::AlreadyExists)
            .with_dst(dest)
            .with_reason(
                "destination directory is not empty; materialize into a new or empty directory",
            ));
    }
    Ok((fd, made))
}

/// Whether the directory `fd` looks names up case-insensitively (ext4,
/// f2fs, tmpfs with `casefold`: the inode flag `FS_CASEFOLD_FL`, which
/// directories made in it inherit). No answer counts as no.
fn casefolded(fd: BorrowedFd<'_>) -> bool {
    cowlink_sys::inode_flags(fd).is_ok_and(|f| f.contains(cowlink_sys::InodeFlags::CASEFOLD))
}

/// The refusal of a destination inside the store at `root`.
fn inside_store(root: &Path, dest: &Path) -> Error {
    Error::new(Operation::Materialize, ErrorKind::InvalidInput)
        .with_src(root)
        .with_dst(dest)
        .with_reason("the destination is inside the store; place it elsewhere")
}

/// Whether the directory `fd` is the directory `store` or below it: its
/// `..` chain, walked up to the root, compared by device and inode (so a
/// path through symbolic links or bind mounts is seen for what it is).
fn within(store: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> rustix::io::Result<bool> {
    let id = |st: &cowlink_sys::Stat| (st.st_dev, st.st_ino);
    let open = |at: BorrowedFd<'_>, name: &str| {
        fs::openat(
            at,
            name,
            cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let target = id(&cowlink_sys::fstat(store)?);
    let mut cur = open(fd, ".")?;
    loop {
        let here = id(&cowlink_sys::fstat(&cur)?);
        if here == target {
            return Ok(true);
        }
        let up = open(cur.as_fd(), "..")?;
        if id(&cowlink_sys::fstat(&up)?) == here {
            return Ok(false);
        }
        cur = up;
    }
}
