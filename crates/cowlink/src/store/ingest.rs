//! Getting files into the store: `add`/`add_file` (one file: clone or copy
//! into an unnamed temporary, hash, link under the digest; EEXIST means
//! already stored), `add_tree` (the walk's visitor `TreeIngest` stores
//! every file and records every entry; one `syncfs` before the manifest
//! is written), and `write_manifest`.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::prim::files::open_source;
use crate::prim::mode::{LinkMode, Method};
use crate::prim::place::Overwrite;
use crate::prim::transfer::{transfer, transfer_error, Source};
use crate::run::Phase;
use crate::walk::{self, DirInfo, Entry, Visitor};

use super::layout::{manifest_rel, mark_unchanged, object_rel, write_all};
use super::manifest::{Digest, EntryKind, Manifest, ManifestEntry};
use super::{store_err, Store};

/// What [`Store::add_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Added {
    /// The object's digest.
    pub digest: Digest,
    /// Its size.
    pub bytes: u64,
    /// How the bytes got into the store.
    pub method: Method,
    /// `false` when the store already had these bytes (nothing new kept).
    pub new: bool,
}

/// What [`Store::add_tree`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AddedTree {
    /// The manifest's digest: what to check out later.
    pub digest: Digest,
    /// The manifest.
    #[serde(skip)]
    pub manifest: Manifest,
    /// Regular files.
    pub files: u64,
    /// Directories below the root.
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Files whose content was new to the store.
    pub new_objects: u64,
    /// Files cloned into the store (the rest were copied).
    pub cloned: u64,
}

/// The walk visitor of [`Store::add_tree`].
struct TreeIngest<'a> {
    store: &'a Store,
    root: &'a Path,
    entries: Mutex<Vec<ManifestEntry>>,
    errors: Mutex<Vec<Error>>,
    new_objects: AtomicU64,
    cloned: AtomicU64,
}

impl TreeIngest<'_> {
    fn rel(&self, path: &Path) -> Result<String> {
        let rel = path.strip_prefix(self.root).unwrap_or(path);
        rel.to_str().map(str::to_owned).ok_or_else(|| {
            Error::new(Operation::Store, ErrorKind::InvalidInput)
                .with_src(path)
                .with_reason("the name is not valid UTF-8, which manifests cannot hold")
        })
    }

    fn push(&self, path: String, kind: EntryKind) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ManifestEntry { path, kind });
    }

    fn fail(&self, e: Error) {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    fn file(&self, e: &Entry<'_>, path: &Path) -> Result<EntryKind> {
        let err = |x: Errno| store_err(path, x);
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match fs::openat(
            e.dirfd,
            e.name,
            flags | cowlink_sys::O_NOATIME,
            Mode::empty(),
        ) {
            Err(Errno::PERM) => fs::openat(e.dirfd, e.name, flags, Mode::empty()),
            r => r,
        }
        .map_err(err)?;
        let st = cowlink_sys::fstat(&fd).map_err(err)?;
        let added = self.store.ingest(fd.as_fd(), &st, path, false)?;
        if added.new {
            self.new_objects.fetch_add(1, Ordering::Relaxed);
        }
        if added.method == Method::Reflink {
            self.cloned.fetch_add(1, Ordering::Relaxed);
        }
        self.store.tick(added.bytes);
        Ok(EntryKind::File {
            digest: added.digest,
            size: added.bytes,
            mode: st.st_mode & 0o7777,
        })
    }
}

impl TreeIngest<'_> {
    /// Record one entry of the walk.
    fn take(&self, e: Entry<'_>) {
        let path = e.path();
        let rel = match self.rel(&path) {
            Ok(r) => r,
            Err(err) => return self.fail(err),
        };
        let ft = match e.file_type {
            Some(t) => t,
            None => match cowlink_sys::statat(e.dirfd, e.name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => cowlink_sys::file_type(st.st_mode),
                Err(x) => return self.fail(store_err(&path, x)),
            },
        };
        let kind = match ft {
            FileType::RegularFile => self.file(&e, &path),
            FileType::Symlink => fs::readlinkat(e.dirfd, e.name, Vec::new())
                .map_err(|x| store_err(&path, x))
                .and_then(|t| {
                    t.into_string().map_err(|_| {
                        Error::new(Operation::Store, ErrorKind::InvalidInput)
                            .with_src(&path)
                            .with_reason(
                                "the link's target is not valid UTF-8, which manifests cannot hold",
                            )
                    })
                })
                .map(|target| EntryKind::Symlink { target }),
            other => Err(Error::new(Operation::Store, ErrorKind::NotRegularFile)
                .with_src(&path)
                .with_reason(format!(
                    "{} cannot be stored (only files, directories and symbolic links)",
                    crate::prim::files::file_type_name(cowlink_sys::file_type_bits(other))
                ))),
        };
        match kind {
            Ok(kind) => self.push(rel, kind),
            Err(err) => self.fail(err),
        }
    }
}

impl Visitor for TreeIngest<'_> {
    fn dir(&self, dir: &DirInfo, st: &Stat, _: rustix::fd::BorrowedFd<'_>) {
        if dir.parent.is_none() {
            return; // the root itself
        }
        match self.rel(&dir.path) {
            Ok(rel) => self.push(
                rel,
                EntryKind::Dir {
                    mode: st.st_mode & 0o7777,
                },
            ),
            Err(e) => self.fail(e),
        }
    }

    fn entry(&self, e: Entry<'_>) -> std::ops::ControlFlow<()> {
        self.take(e);
        std::ops::ControlFlow::Continue(())
    }

    fn counted_by_walk(&self) -> bool {
        false // files are counted as they are stored
    }

    fn error(&self, err: Error) {
        self.fail(err);
    }
}

impl Store {
    /// Add one file; return its digest. See [`add_file`](Self::add_file).
    pub fn add(&self, path: impl AsRef<Path>) -> Result<Digest> {
        self.add_file(path).map(|a| a.digest)
    }

    /// Add the regular file `path` (symbolic links are followed) and say
    /// how. The object is made durable (`fsync`) before it is named.
    ///
    /// # Errors
    /// As for [`crate::clone_file`]'s source (`NotFound`, `IsDirectory`,
    /// `NotRegularFile`, `PermissionDenied`), `ContentChanged` when a copied
    /// source changed while it was read, `NoSpace`, `Io`.
    pub fn add_file(&self, path: impl AsRef<Path>) -> Result<Added> {
        let path = path.as_ref();
        let _lock = self.lock(false)?;
        let (fd, st) = open_source(Operation::Store, path)?;
        let added = self.ingest(fd.as_fd(), &st, path, true)?;
        self.tick(added.bytes);
        Ok(added)
    }

    /// Put the content of `src` (`st` its stat) into the store.
    pub(super) fn ingest(
        &self,
        src: BorrowedFd<'_>,
        st: &Stat,
        path: &Path,
        durable: bool,
    ) -> Result<Added> {
        let op = Operation::Store;
        let err = |e: Errno| store_err(path, e);
        let pending = self.temporary("object")?;
        let failed = |e: Errno| transfer_error(op, path, &self.root, e, src, pending.fd());
        let done = transfer(
            src,
            pending.fd(),
            Source::of(st),
            LinkMode::Auto,
            &|| Ok(()),
            &failed,
            &|| false,
        )?;
        // What to hash. A copy: the stored bytes (just written, so cached).
        // A clone: it *is* the source's blocks at the moment of the clone,
        // so hash the source (cached; the new clone's pages are not) and
        // check below that nothing changed it from before the clone to
        // after the hash.
        // A pseudo file's copy holds what reading gave, not what stat said.
        let (method, size) = (done.method, done.bytes);
        let hashed = if method == Method::Reflink {
            src
        } else {
            pending.fd()
        };
        let (hash, len) = crate::ground::hash::hash_fd_at(hashed, size, &|_| {}).map_err(err)?;
        let now = cowlink_sys::fstat(src).map_err(err)?;
        let fingerprint = |a: &Stat| {
            let t = (a.st_mtime, a.st_mtime_nsec, a.st_ctime, a.st_ctime_nsec);
            (a.st_ino, a.st_size, t)
        };
        if fingerprint(st) != fingerprint(&now) || len != size {
            return Err(Error::new(op, ErrorKind::ContentChanged)
                .with_src(path)
                .with_reason("the file changed while it was being added to the store; try again"));
        }
        let digest = Digest(hash);
        // Created 0444; only an unusual umask (one that hides bits of
        // 0444) needs the mode set again.
        if crate::prim::meta::umask().is_none_or(|u| u & 0o444 != 0) {
            fs::fchmod(pending.fd(), cowlink_sys::raw_mode(0o444)).map_err(err)?;
        }
        mark_unchanged(pending.fd());
        if durable {
            fs::fsync(pending.fd()).map_err(err)?;
        }
        let rel = object_rel(&digest, 0);
        let new = match self.persist_object(pending, &digest, 0) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(store_err(self.root.join(&rel), e).with_src(path)),
        };
        Ok(Added {
            digest,
            bytes: size,
            method,
            new,
        })
    }

    /// Add every file, directory and symbolic link below `dir` and store a
    /// manifest of them; return its digest and counts.
    ///
    /// The walk is parallel and never follows symbolic links (they are
    /// recorded with their target). Objects are synced to disk once
    /// (`syncfs`) before the manifest is written, so a manifest never
    /// outlives the objects it names. A tree that cannot be stored
    /// completely is not stored: FIFOs, sockets, devices, unreadable files
    /// and names that are not UTF-8 make the call fail naming them (objects
    /// already added stay, unreferenced, until [`gc`](Self::gc)).
    pub fn add_tree(&self, dir: impl AsRef<Path>) -> Result<AddedTree> {
        let root = dir.as_ref();
        let op = Operation::Store;
        let st = cowlink_sys::stat(root).map_err(|e| store_err(root, e))?;
        if cowlink_sys::file_type(st.st_mode) != FileType::Directory {
            return Err(Error::new(op, ErrorKind::NotADirectory)
                .with_src(root)
                .with_reason(
                    "a tree to add must be a directory; a single file is added with add_file",
                ));
        }
        let _lock = self.lock(false)?;
        let ingest = TreeIngest {
            store: self,
            root,
            entries: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            new_objects: AtomicU64::new(0),
            cloned: AtomicU64::new(0),
        };
        self.run.enter(Phase::Copy, 0, 0);
        walk::walk(&[root.to_path_buf()], &self.run, op, &ingest);
        if self.run.cancelled() {
            // Objects already added stay (whole, unreferenced until gc);
            // no manifest names a tree that was not read whole.
            return Err(Error::new(op, ErrorKind::Cancelled)
                .with_src(root)
                .with_reason("cancelled: no manifest was written"));
        }
        let mut errors = ingest.errors.into_inner().unwrap_or_default();
        if !errors.is_empty() {
            let more = errors.len() - 1;
            let first = errors.swap_remove(0);
            return Err(if more > 0 {
                let why = format!("{} (and {more} more problems in the tree)", first.reason());
                first.with_reason(why)
            } else {
                first
            });
        }
        cowlink_sys::sync_filesystem(self.dir.as_fd()).map_err(|e| store_err(&self.root, e))?;
        let manifest = Manifest::new(ingest.entries.into_inner().unwrap_or_default());
        let digest = self.write_manifest(&manifest)?;
        let mut out = AddedTree {
            digest,
            files: 0,
            dirs: 0,
            symlinks: 0,
            bytes: 0,
            new_objects: ingest.new_objects.into_inner(),
            cloned: ingest.cloned.into_inner(),
            manifest,
        };
        for e in &out.manifest.entries {
            match e.kind {
                EntryKind::File { size, .. } => {
                    out.files += 1;
                    out.bytes += size;
                }
                EntryKind::Dir { .. } => out.dirs += 1,
                EntryKind::Symlink { .. } => out.symlinks += 1,
            }
        }
        Ok(out)
    }

    /// Store `manifest` (validated first) and return its digest.
    ///
    /// The text is written as it is made, through a 1 MiB buffer, never
    /// held whole (44 MB for 223,547 files, on top of the entries).
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<Digest> {
        let digest = manifest.digest();
        manifest.validate(&digest.to_hex(), true)?;
        let pending = self.temporary("manifest")?;
        let err = |e| store_err(self.root.join(manifest_rel(&digest)), e);
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            FdWrite {
                fd: pending.fd(),
                failed: None,
            },
        );
        let written = manifest
            .write_to(&mut out)
            .and_then(|()| std::io::Write::flush(&mut out).map_err(|_| Errno::IO));
        let failed = out.into_parts().0.failed;
        written.map_err(|e| err(failed.unwrap_or(e)))?;
        fs::fsync(pending.fd()).map_err(err)?;
        let dir = self
            .layout_dir("manifests")
            .map_err(|e| store_err(self.root.join("manifests"), e))?;
        match pending.persist_in(dir.as_fd(), Path::new(&digest.to_hex()), Overwrite::Refuse) {
            Ok(()) | Err(Errno::EXIST) => Ok(digest),
            Err(e) => Err(err(e)),
        }
    }
}

/// `std::io::Write` over a descriptor, keeping the errno of a failed
/// write (serde_json reports a writer's failure as its own error).
struct FdWrite<'a> {
    fd: BorrowedFd<'a>,
    failed: Option<Errno>,
}

impl std::io::Write for FdWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match write_all(self.fd, buf) {
            Ok(()) => Ok(buf.len()),
            Err(e) => {
                self.failed = Some(e);
                Err(e.into())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
