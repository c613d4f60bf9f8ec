//! Placing store objects at destinations: one file
//! ([`Store::materialize`]) or a whole manifest
//! ([`Store::materialize_tree`]).
//!
//! Every file is written to an unnamed temporary in its destination
//! directory and linked into place complete, with its mode. A tree goes to
//! a new or empty directory: directories first (sequentially, so parents
//! exist), then files in parallel, a batch of one directory's files per
//! task, then symbolic links, then directory modes deepest first (a
//! read-only directory would refuse the files created in it). Parent
//! directories are opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so nothing is ever written through a symbolic
//! link, whatever the manifest says or anyone does to the destination
//! meanwhile.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;

use super::{object_rel, Digest, EntryKind, Manifest, Store};
use crate::clone::{split_dest, transfer_error};
use crate::error::{errno_text, is_not_possible_here, Error, ErrorKind, Operation, Result};
use crate::write::{Overwrite, PendingFile};
use crate::{Method, Outcome};

/// How a materialized file relates to its store object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkMode {
    /// Share the object's blocks (a reflink): instant, no space, and a
    /// write to the file copies only what it touches, never reaching the
    /// store. Fails where the filesystem cannot clone (the default).
    #[default]
    Clone,
    /// A physical copy with blocks of its own.
    Copy,
    /// A hardlink to the object itself. **Write-through**: the file *is*
    /// the object, so writing to it (after making it writable) corrupts
    /// the store and every other place it was materialized. Its mode is the
    /// object's (read-only), not the manifest's. Only for callers that
    /// never write and want the last microsecond.
    Hardlink,
    /// Clone where possible, else copy.
    Auto,
}

/// Options for [`Store::materialize_tree`].
#[derive(Debug, Clone, Default)]
pub struct MaterializeOptions {
    /// How to place files.
    pub link: LinkMode,
    /// Create symbolic links whose target is absolute or leaves the tree
    /// (refused by default: a later write through such a link by another
    /// program would land outside the destination).
    pub external_symlinks: bool,
}

/// What [`Store::materialize_tree`] did.
#[derive(Debug, Default, serde::Serialize)]
pub struct MaterializeReport {
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
    #[serde(serialize_with = "crate::error::serialize_errors")]
    pub errors: Vec<Error>,
}

#[derive(Default)]
struct Counters {
    files: AtomicU64,
    bytes: AtomicU64,
    cloned: AtomicU64,
    copied: AtomicU64,
    hardlinked: AtomicU64,
    generations: AtomicU64,
}

impl Counters {
    fn count(&self, o: Outcome) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(o.bytes, Ordering::Relaxed);
        match o.method {
            Method::Reflink => &self.cloned,
            Method::Hardlink => &self.hardlinked,
            Method::CopyOffload | Method::ReadWrite => &self.copied,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// A file to place: name in its directory, object, mode.
type FileItem<'a> = (&'a str, &'a Digest, u32);

/// Files handed to one task.
const BATCH: usize = 64;

fn merr(dst: impl AsRef<Path>, e: Errno) -> Error {
    Error::from_errno(Operation::Materialize, e).with_dst(dst)
}

/// Open the directory `rel` below `root` without following any symbolic
/// link and without leaving `root`.
fn open_beneath(root: BorrowedFd<'_>, rel: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    fs::openat2(
        root,
        if rel.is_empty() { "." } else { rel },
        flags | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
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
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            merr(dest, e).with_src(&obj).with_reason(match e {
                Errno::NOENT => format!("directory '{}' does not exist", parent.display()),
                _ => errno_text(e),
            })
        })?;
        let name = dest.file_name().map(Path::new).unwrap_or(dest);
        let gens = AtomicU64::new(0);
        self.place(dir.as_fd(), name, digest, None, link, dest, &gens)
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
    pub fn materialize_tree(
        &self,
        manifest: &Manifest,
        dest: impl AsRef<Path>,
        options: &MaterializeOptions,
    ) -> Result<MaterializeReport> {
        let dest = dest.as_ref();
        manifest.validate(&manifest.digest().to_hex(), options.external_symlinks)?;
        let root = prepare_dest(dest)?;
        let root = root.as_fd();
        let mut report = MaterializeReport::default();
        let errors = Mutex::new(Vec::new());
        let fail = |e: Error| errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);

        // Directories: listed ones and implied parents, parents first.
        let mut dirs: BTreeMap<&str, u32> = BTreeMap::new();
        let mut files: BTreeMap<&str, Vec<FileItem<'_>>> = BTreeMap::new();
        let mut links = Vec::new();
        for e in &manifest.entries {
            let (parent, name) = split_rel(&e.path);
            let mut p = parent;
            while !p.is_empty() && !dirs.contains_key(p) {
                dirs.insert(p, 0o755);
                p = split_rel(p).0;
            }
            match &e.kind {
                EntryKind::Dir { mode } => {
                    dirs.insert(&e.path, *mode);
                }
                EntryKind::File { digest, mode, .. } => {
                    files.entry(parent).or_default().push((name, digest, *mode))
                }
                EntryKind::Symlink { target } => {
                    links.push((parent, name, target.as_str(), &e.path))
                }
            }
        }
        if let Some(p) = &self.progress {
            p.files_total
                .store(manifest.file_totals().0, Ordering::Relaxed);
        }
        for path in dirs.keys() {
            let (parent, name) = split_rel(path);
            let made = open_beneath(root, parent, OFlags::PATH)
                .and_then(|fd| fs::mkdirat(&fd, name, Mode::from_raw_mode(0o700)));
            match made {
                Ok(()) => report.dirs += 1,
                Err(e) => fail(merr(dest.join(path), e)),
            }
        }

        let counters = Counters::default();
        let batches: Vec<(&str, &[FileItem<'_>])> = files
            .iter()
            .flat_map(|(dir, v)| v.chunks(BATCH).map(move |c| (*dir, c)))
            .collect();
        self.install(|| {
            batches.par_iter().for_each(|(dir, batch)| {
                let fd = match open_beneath(root, dir, OFlags::PATH) {
                    Ok(fd) => fd,
                    Err(e) => {
                        return fail(merr(dest.join(dir), e).with_reason(format!(
                            "cannot open the directory for {} files: {}",
                            batch.len(),
                            errno_text(e)
                        )))
                    }
                };
                for (name, digest, mode) in batch.iter() {
                    let shown = dest.join(dir).join(name);
                    match self.place(
                        fd.as_fd(),
                        Path::new(name),
                        digest,
                        Some(*mode),
                        options.link,
                        &shown,
                        &counters.generations,
                    ) {
                        Ok(o) => {
                            counters.count(o);
                            self.tick(o.bytes);
                        }
                        Err(e) => fail(e),
                    }
                }
            })
        });

        for (parent, name, target, path) in links {
            let made = open_beneath(root, parent, OFlags::PATH)
                .and_then(|fd| fs::symlinkat(target, &fd, name));
            match made {
                Ok(()) => report.symlinks += 1,
                Err(e) => fail(merr(dest.join(path), e)),
            }
        }
        for (path, mode) in dirs.iter().rev() {
            let set = open_beneath(root, path, OFlags::RDONLY)
                .and_then(|fd| fs::fchmod(&fd, Mode::from_raw_mode(*mode)));
            if let Err(e) = set {
                fail(
                    merr(dest.join(path), e)
                        .with_reason(format!("cannot set mode {mode:o}: {}", errno_text(e))),
                );
            }
        }
        report.files = counters.files.into_inner();
        report.bytes = counters.bytes.into_inner();
        report.cloned = counters.cloned.into_inner();
        report.copied = counters.copied.into_inner();
        report.hardlinked = counters.hardlinked.into_inner();
        report.generations_created = counters.generations.into_inner();
        report.errors = errors.into_inner().unwrap_or_default();
        Ok(report)
    }

    /// Place one object as `name` in the directory `dir`. `mode`: exact
    /// permission bits to set (`None`: what creation gives).
    #[allow(clippy::too_many_arguments)]
    fn place(
        &self,
        dir: BorrowedFd<'_>,
        name: &Path,
        digest: &Digest,
        mode: Option<u32>,
        link: LinkMode,
        shown: &Path,
        gens: &AtomicU64,
    ) -> Result<Outcome> {
        let obj = self.object_path(digest);
        let err = |e: Errno| merr(shown, e).with_src(&obj);
        if link == LinkMode::Hardlink {
            return self.hardlink(dir, name, digest, shown, gens);
        }
        let create_mode = Mode::from_raw_mode(mode.map_or(0o666, |m| m & 0o777));
        let pending = PendingFile::create(dir, Path::new("."), name, create_mode).map_err(|e| {
            err(e).with_reason(crate::clone::create_reason(
                e,
                shown.parent().unwrap_or(shown),
            ))
        })?;
        let dfd = pending.fd();
        let outcome = self.fill(digest, dfd, link, shown, gens)?;
        if let Some(m) = mode {
            fs::fchmod(dfd, Mode::from_raw_mode(m)).map_err(err)?;
        }
        pending
            .persist(name, Overwrite::Refuse)
            .map_err(|e| match e {
                Errno::EXIST => err(e).with_reason("destination already exists"),
                _ => err(e),
            })?;
        Ok(outcome)
    }

    /// Open generation `gen` of an object, making it first when it is a
    /// further generation that does not exist yet.
    fn open_object(
        &self,
        digest: &Digest,
        gen: u32,
        shown: &Path,
        gens: &AtomicU64,
    ) -> Result<OwnedFd> {
        let rel = object_rel(digest, gen);
        let open = || {
            fs::openat(
                &self.dir,
                rel.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        };
        match open() {
            Ok(fd) => Ok(fd),
            Err(Errno::NOENT) if gen > 0 => {
                self.make_generation(digest, gen)?;
                gens.fetch_add(1, Ordering::Relaxed);
                open().map_err(|e| merr(shown, e).with_src(self.root.join(&rel)))
            }
            Err(Errno::NOENT) => Err(Error::new(Operation::Materialize, ErrorKind::NotFound)
                .with_src(digest.to_hex())
                .with_dst(shown)
                .with_reason(
                    "the store has no such object (removed by gc, or quarantined by verify?)",
                )),
            Err(e) => Err(merr(shown, e).with_src(self.root.join(&rel))),
        }
    }

    /// A physical copy of an object as generation `gen` (which has blocks
    /// of its own, so it can be cloned again as often as the first).
    fn make_generation(&self, digest: &Digest, gen: u32) -> Result<()> {
        let base = fs::openat(
            &self.dir,
            object_rel(digest, 0).as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| super::store_err(self.object_path(digest), e))?;
        let size = fs::fstat(&base)
            .map_err(|e| super::store_err(self.object_path(digest), e))?
            .st_size as u64;
        let rel = object_rel(digest, gen);
        let pending = self.temporary("tmp/generation")?;
        let err = |e| super::store_err(self.root.join(&rel), e);
        // Read/write only: copy_file_range could share blocks again.
        crate::copy::copy_data(base.as_fd(), pending.fd(), size, false, &|| false).map_err(err)?;
        fs::fchmod(pending.fd(), Mode::from_raw_mode(0o444)).map_err(err)?;
        fs::fsync(pending.fd()).map_err(err)?;
        match pending.persist(Path::new(&rel), Overwrite::Refuse) {
            Ok(()) | Err(Errno::EXIST) => Ok(()), // or another process made it
            Err(e) => Err(err(e)),
        }
    }

    fn current_generation(&self, digest: &Digest) -> u32 {
        if !self.any_generation.load(Ordering::Relaxed) {
            return 0;
        }
        let g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        g.get(digest).copied().unwrap_or(0)
    }

    /// Generation `gen` is full: later placements start from `gen + 1`.
    fn next_generation(&self, digest: &Digest, gen: u32) -> u32 {
        self.any_generation.store(true, Ordering::Relaxed);
        let mut g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        let cur = g.entry(*digest).or_insert(0);
        *cur = (*cur).max(gen + 1);
        *cur
    }

    /// With an injected limit: take one use of `(digest, gen)`, or say the
    /// limit is reached (as the kernel would with `EMLINK`).
    fn take_use(&self, digest: &Digest, gen: u32) -> bool {
        let Some(limit) = self.clone_limit else {
            return true;
        };
        let mut u = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        let n = u.entry((*digest, gen)).or_insert(0);
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    /// Fill the empty file `dfd` with the object's bytes per `link`.
    fn fill(
        &self,
        digest: &Digest,
        dfd: BorrowedFd<'_>,
        link: LinkMode,
        shown: &Path,
        gens: &AtomicU64,
    ) -> Result<Outcome> {
        let mut gen = self.current_generation(digest);
        loop {
            let src = self.open_object(digest, gen, shown, gens)?;
            let src_path = self.root.join(object_rel(digest, gen));
            let failed = |e: Errno| {
                transfer_error(
                    Operation::Materialize,
                    &src_path,
                    shown,
                    e,
                    src.as_fd(),
                    dfd,
                )
            };
            let size = fs::fstat(&src).map_err(failed)?.st_size as u64;
            let copy = |offload| {
                crate::copy::copy_data(src.as_fd(), dfd, size, offload, &|| false)
                    .map(|method| Outcome {
                        method,
                        bytes: size,
                    })
                    .map_err(failed)
            };
            if link == LinkMode::Copy {
                return copy(false);
            }
            let r = if self.take_use(digest, gen) {
                cowlink_sys::ficlone(dfd, src.as_fd())
            } else {
                Err(Errno::MLINK)
            };
            match r {
                Ok(()) => {
                    return Ok(Outcome {
                        method: Method::Reflink,
                        bytes: size,
                    })
                }
                Err(Errno::MLINK | Errno::OVERFLOW) => gen = self.next_generation(digest, gen),
                Err(e) if link == LinkMode::Auto && is_not_possible_here(e) => return copy(true),
                Err(e) => {
                    let hint = if is_not_possible_here(e) {
                        "; use --mode auto to copy instead"
                    } else {
                        ""
                    };
                    let base = failed(e);
                    let why = format!("{}{hint}", base.reason());
                    return Err(base.with_reason(why));
                }
            }
        }
    }

    fn hardlink(
        &self,
        dir: BorrowedFd<'_>,
        name: &Path,
        digest: &Digest,
        shown: &Path,
        gens: &AtomicU64,
    ) -> Result<Outcome> {
        let mut gen = self.current_generation(digest);
        loop {
            // Make sure the generation exists (and learn its size).
            let src = self.open_object(digest, gen, shown, gens)?;
            let rel = object_rel(digest, gen);
            let size = fs::fstat(&src).map_err(|e| merr(shown, e))?.st_size as u64;
            let r = if self.take_use(digest, gen) {
                fs::linkat(&self.dir, rel.as_str(), dir, name, AtFlags::empty())
            } else {
                Err(Errno::MLINK)
            };
            match r {
                Ok(()) => {
                    return Ok(Outcome {
                        method: Method::Hardlink,
                        bytes: size,
                    })
                }
                Err(Errno::MLINK) => gen = self.next_generation(digest, gen),
                Err(e) => {
                    let base = merr(shown, e).with_src(self.root.join(&rel));
                    return Err(match e {
                        Errno::XDEV => {
                            base.with_reason("hardlinks cannot cross filesystems; use --mode auto")
                        }
                        Errno::EXIST => base.with_reason("destination already exists"),
                        _ => base,
                    });
                }
            }
        }
    }
}

/// Create `dest` or accept it as an empty directory; return it opened
/// (`O_PATH`, not following a symbolic link).
fn prepare_dest(dest: &Path) -> Result<OwnedFd> {
    let err = |e: Errno| merr(dest, e);
    match fs::mkdir(dest, Mode::from_raw_mode(0o777)) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            let st = fs::lstat(dest).map_err(err)?;
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                return Err(Error::new(Operation::Materialize, ErrorKind::NotADirectory)
                    .with_dst(dest)
                    .with_reason("destination exists and is not a directory"));
            }
            let fd = fs::open(
                dest,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(err)?;
            if !super::list_dir(fd.as_fd()).map_err(err)?.is_empty() {
                return Err(Error::new(Operation::Materialize, ErrorKind::AlreadyExists)
                    .with_dst(dest)
                    .with_reason("destination directory is not empty; materialize into a new or empty directory"));
            }
        }
        Err(Errno::NOENT) => {
            return Err(err(Errno::NOENT).with_reason(format!(
                "parent directory '{}' does not exist",
                dest.parent().unwrap_or(Path::new("")).display()
            )))
        }
        Err(e) => return Err(err(e)),
    }
    fs::openat(
        CWD,
        dest,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(err)
}
