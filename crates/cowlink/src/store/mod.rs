//! A content-addressed store: one copy of each file on disk, cloned into
//! as many places as needed.
//!
//! ```text
//! STORE/cowlink-store        marker and format version
//! STORE/lock                 flock: adders share it, gc takes it alone
//! STORE/objects/ab/abcd…     objects, named by BLAKE3, mode 0444
//! STORE/objects/ab/abcd….g1  a further physical generation of the same bytes
//! STORE/manifests/abcd…      tree manifests (JSON), named by their BLAKE3
//! STORE/tmp/                 named temporaries (only where O_TMPFILE is missing)
//! STORE/quarantine/          objects and manifests that failed verify
//! ```
//!
//! [`Store::add`] clones the file into an unnamed temporary in the store
//! (`O_TMPFILE`; a copy where cloning is not possible), hashes it, and
//! links it into place under its digest. What is hashed is what was
//! stored: a copy is hashed through the temporary's descriptor (its pages
//! were just written, so this reads memory); a clone shares the source's
//! blocks as they were at the instant of the clone, so the source is
//! hashed (its pages are usually cached, the clone's never are: hashing
//! the clone read every byte from disk again and made ingest 2–3× slower)
//! and its inode, size, mtime and ctime must be unchanged from before the
//! clone to after the hash, else the add fails with `ContentChanged`.
//! [`Store::verify`] rehashes the objects themselves. Linking fails
//! atomically when the object exists: that is the dedupe. Readers never
//! see a partial object and a crash leaves nothing under a final name.
//!
//! [`Store::materialize_tree`] (in `materialize`) places files with
//! [`LinkMode`]: clones by default, so writing to a materialized file never
//! touches the store. When a filesystem refuses another clone or link of an
//! object (a per-block reference limit), a fresh physical copy becomes a
//! new generation and cloning continues from it.
//!
//! Concurrency: adders hold a shared `flock` on `STORE/lock` (they never
//! wait for each other); [`Store::gc`] holds it exclusively, so it never
//! removes an object an in-flight add is about to reference, and every
//! named temporary it finds belongs to a dead process. Materializing and
//! reading take no lock. Objects and manifests are immutable once named.

mod manifest;
mod materialize;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Dir, FileType, FlockOperation, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::prim::files::open_source;
use crate::prim::mode::{Method, Reflink};
use crate::prim::place::{Overwrite, PendingFile};
use crate::prim::transfer::{transfer, transfer_error};
use crate::run::{Phase, Run};
use crate::scan::{self, DirInfo, Entry, Visitor};

pub use manifest::{
    BadDigest, Digest, EntryKind, Manifest, ManifestEntry, MANIFEST_FORMAT, MANIFEST_VERSION,
};
pub use materialize::{LinkMode, MaterializeOptions, MaterializeReport};

/// First line of the marker file.
const MARKER: &str = "cowlink-store 1\n";
const MARKER_NAME: &str = "cowlink-store";
/// Names a store directory holds; anything else means "not a store".
const LAYOUT: [&str; 6] = [
    "cowlink-store",
    "lock",
    "objects",
    "manifests",
    "tmp",
    "quarantine",
];

/// A store rooted at a directory. Cheap to share between threads; every
/// method takes `&self`.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    dir: OwnedFd,
    /// `tmp/`, opened without following symbolic links: every temporary
    /// is made here.
    tmp: Option<OwnedFd>,
    run: Run,
    /// Injected reference limit (clones or links per object generation,
    /// counted by this `Store`).
    clone_limit: Option<u64>,
    uses: Mutex<HashMap<(Digest, u32), u64>>,
    /// Newest generation seen per object, once any generation exists.
    generations: Mutex<HashMap<Digest, u32>>,
    any_generation: AtomicBool,
}

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

/// One object or manifest that failed [`Store::verify`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Corrupt {
    /// Where it was.
    pub path: PathBuf,
    /// Where it is now (under `quarantine/`).
    pub quarantined: Option<PathBuf>,
    /// What is wrong.
    pub problem: String,
}

/// What [`Store::verify`] found.
#[derive(Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Object files hashed (generations included).
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Manifests checked.
    pub manifests: u64,
    /// Objects or manifests whose bytes do not match their name, or that
    /// cannot be parsed; moved to `quarantine/`.
    pub corrupt: Vec<Corrupt>,
    /// Objects referenced by a manifest that the store lacks:
    /// `(manifest, object)`.
    pub missing: Vec<(Digest, Digest)>,
}

impl VerifyReport {
    /// Whether everything checked out.
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty() && self.missing.is_empty()
    }
}

/// What [`Store::gc`] removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct GcReport {
    /// Manifests kept.
    pub manifests_kept: u64,
    /// Manifests removed (not in the keep list).
    pub manifests_removed: u64,
    /// Object files removed (generations included).
    pub objects_removed: u64,
    /// Their sizes, summed.
    pub bytes_removed: u64,
    /// Leftover temporaries of dead processes removed.
    pub temporaries_removed: u64,
}

/// What [`Store::stats`] counts.
#[derive(Debug, Default, serde::Serialize)]
pub struct StoreStats {
    /// Distinct objects.
    pub objects: u64,
    /// Extra physical generations (see [`LinkMode`]).
    pub generations: u64,
    /// Sum of the distinct objects' sizes.
    pub object_bytes: u64,
    /// Blocks the object files hold (`st_blocks`; shared blocks count
    /// fully, as `du` does).
    pub allocated_bytes: u64,
    /// Manifests.
    pub manifests: u64,
    /// Files listed by all manifests together.
    pub manifest_files: u64,
    /// Their sizes summed: what plain copies of every stored tree take.
    pub manifest_bytes: u64,
    /// `manifest_bytes` minus the size of the distinct objects they use:
    /// space saved by storing each content once.
    pub bytes_saved: u64,
}

/// A regular file's name in `objects/`: its digest and generation.
fn parse_object_name(name: &[u8]) -> Option<(Digest, u32)> {
    let s = std::str::from_utf8(name).ok()?;
    let (hex, gen) = match s.split_once(".g") {
        Some((h, g)) => (h, g.parse::<u32>().ok().filter(|g| *g > 0)?),
        None => (s, 0),
    };
    Some((hex.parse().ok()?, gen))
}

/// The path of an object generation, relative to the store root.
pub(crate) fn object_rel(d: &Digest, gen: u32) -> String {
    let hex = d.to_hex();
    match gen {
        0 => format!("objects/{}/{hex}", &hex[..2]),
        g => format!("objects/{}/{hex}.g{g}", &hex[..2]),
    }
}

/// The modification time every object gets when it is stored: the store's
/// mark that its bytes have not been written since. Any write through the
/// kernel (`write`, `mmap`, `truncate`, a clone into it) sets the mtime to
/// the current time, so an object whose mtime is no longer this was
/// changed, and checkout rehashes it before placing it. (Only a deliberate
/// `utimensat` back to the mark, or bit rot, escapes this; `verify` rehashes
/// everything.)
pub(crate) const UNCHANGED_MTIME: i64 = 0;

/// Give an object the [`UNCHANGED_MTIME`] mark (best effort: a store
/// shared read-only with us cannot be marked, and is then rehashed).
pub(crate) fn mark_unchanged(fd: BorrowedFd<'_>) {
    let mark = fs::Timestamps {
        last_access: fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: fs::Timespec {
            tv_sec: UNCHANGED_MTIME,
            tv_nsec: 0,
        },
    };
    let _ = fs::futimens(fd, &mark);
}

/// Whether an object still carries the [`UNCHANGED_MTIME`] mark.
pub(crate) fn is_marked_unchanged(st: &Stat) -> bool {
    st.st_mtime == UNCHANGED_MTIME && st.st_mtime_nsec == 0
}

fn manifest_rel(d: &Digest) -> String {
    format!("manifests/{}", d.to_hex())
}

fn store_err(path: impl AsRef<Path>, e: Errno) -> Error {
    Error::from_errno(Operation::Store, e).with_src(path)
}

impl Store {
    /// Open the store at `root`, creating it (and its parents) when it
    /// does not exist. Temporaries left by dead processes are removed.
    ///
    /// # Errors
    /// `InvalidInput` when `root` is a non-empty directory that is not a
    /// store (nothing is written there), `NotADirectory`, and the usual
    /// I/O kinds naming the path.
    pub fn open(root: impl AsRef<Path>) -> Result<Store> {
        let root = root.as_ref().to_path_buf();
        std::fs::create_dir_all(&root).map_err(|e| {
            store_err(&root, Errno::from_io_error(&e).unwrap_or(Errno::IO))
                .with_reason(format!("cannot create the store directory: {e}"))
        })?;
        let dir = fs::open(
            &root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| store_err(&root, e))?;
        let mut store = Store {
            root,
            dir,
            tmp: None,
            run: Run::default(),
            clone_limit: None,
            uses: Mutex::new(HashMap::new()),
            generations: Mutex::new(HashMap::new()),
            any_generation: AtomicBool::new(false),
        };
        store.init()?;
        if store.tmp.is_none() {
            store.open_layout()?;
        }
        store.clean_temporaries(false)?;
        Ok(store)
    }

    /// Run every operation of this store value with `run`: its threads
    /// (0, the default: chosen per destination filesystem and work for
    /// checkouts, see [`crate::run::default_threads`]; one per core for
    /// ingest and verify), its cancel token (an ingest stops before its
    /// manifest is written; a checkout places no new file; verify stops
    /// hashing), and its progress ([`Phase::Copy`] for ingest and
    /// checkout, [`Phase::Verify`]; files and bytes).
    ///
    /// [`Phase::Copy`]: crate::run::Phase::Copy
    /// [`Phase::Verify`]: crate::run::Phase::Verify
    pub fn with_run(mut self, run: Run) -> Self {
        self.run = run;
        self
    }

    /// Act as if the filesystem refused more than `n` clones or hardlinks
    /// of any one object generation (counted by this `Store` value). Real
    /// limits (ReFS allows 8175 clones of a block; XFS 2^32 − 1) are
    /// handled the same way when the kernel reports them (`EMLINK`,
    /// `EOVERFLOW`); this knob makes that path testable.
    pub fn with_clone_limit(mut self, n: u64) -> Self {
        self.clone_limit = Some(n);
        self
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of an object (its first generation).
    pub fn object_path(&self, digest: &Digest) -> PathBuf {
        self.root.join(object_rel(digest, 0))
    }

    /// Whether the store holds the object `digest`.
    pub fn contains(&self, digest: &Digest) -> bool {
        fs::statat(&self.dir, object_rel(digest, 0), AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Check the layout ([`check_layout`](Self::check_layout)) and open
    /// `tmp/`, where every temporary is made.
    fn open_layout(&mut self) -> Result<()> {
        self.check_layout()?;
        let tmp = self
            .layout_dir("tmp")
            .map_err(|e| store_err(self.root.join("tmp"), e))?;
        self.tmp = Some(tmp);
        Ok(())
    }

    fn init(&mut self) -> Result<()> {
        match fs::statat(&self.dir, MARKER_NAME, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => {
                let text = fs::openat(
                    &self.dir,
                    MARKER_NAME,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .ok()
                .and_then(|fd| std::io::read_to_string(std::fs::File::from(fd)).ok())
                .unwrap_or_default();
                if text != MARKER {
                    return Err(Error::new(Operation::Store, ErrorKind::InvalidInput)
                        .with_src(&self.root)
                        .with_reason(format!(
                            "unsupported store format ({:?}; this cowlink knows {:?})",
                            text.trim(),
                            MARKER.trim()
                        )));
                }
                return Ok(());
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(store_err(&self.root, e)),
        }
        // Not a store yet: only an empty directory (or one a concurrent or
        // interrupted init left half done) may become one.
        for name in list_dir(self.dir.as_fd()).map_err(|e| store_err(&self.root, e))? {
            if !LAYOUT.iter().any(|l| l.as_bytes() == name.as_slice()) {
                return Err(Error::new(Operation::Store, ErrorKind::InvalidInput)
                    .with_src(&self.root)
                    .with_reason(format!(
                        "the directory is not empty and is not a cowlink store (it holds '{}'); \
                         choose an empty or new directory",
                        String::from_utf8_lossy(&name)
                    )));
            }
        }
        let mkdir = |p: &str| match fs::mkdirat(&self.dir, p, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(store_err(self.root.join(p), e)),
        };
        for d in ["objects", "manifests", "tmp", "quarantine"] {
            mkdir(d)?;
        }
        for i in 0..=255u8 {
            mkdir(&format!("objects/{i:02x}"))?;
        }
        self.lock_fd()?;
        self.open_layout()?;
        // The marker goes last, atomically: a store is complete or absent.
        let pending = self.temporary("marker")?;
        write_all(pending.fd(), MARKER.as_bytes()).map_err(|e| store_err(&self.root, e))?;
        match pending.persist_in(self.dir.as_fd(), Path::new(MARKER_NAME), Overwrite::Refuse) {
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(store_err(self.root.join(MARKER_NAME), e)),
        }
    }

    /// Open the layout directory `rel` beneath the store root without
    /// following any symbolic link (`openat2` with `RESOLVE_BENEATH |
    /// RESOLVE_NO_SYMLINKS`): a store never acts through a link planted in
    /// its layout.
    fn layout_dir(&self, rel: &str) -> std::result::Result<OwnedFd, Errno> {
        open_beneath(self.dir.as_fd(), rel, OFlags::RDONLY | OFlags::DIRECTORY)
    }

    /// Refuse a store whose layout is not what cowlink made: a symbolic
    /// link, or a file where a directory belongs (or the reverse). Such a
    /// store is reported and left alone; nothing in it is touched.
    fn check_layout(&self) -> Result<()> {
        let tampered = |rel: &str, what: &str| {
            Error::new(Operation::Store, ErrorKind::Corrupt)
                .with_src(self.root.join(rel))
                .with_reason(format!(
                    "the store's layout was tampered with: '{rel}' is {what}; \
                     the store is left alone (repair or remove it by hand)"
                ))
        };
        let check = |rel: &str, dir: bool, required: bool| -> Result<()> {
            match fs::statat(&self.dir, rel, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => {
                    let t = FileType::from_raw_mode(st.st_mode);
                    let want = if dir {
                        FileType::Directory
                    } else {
                        FileType::RegularFile
                    };
                    if t == want {
                        Ok(())
                    } else {
                        Err(tampered(
                            rel,
                            &format!(
                                "{}, not {}",
                                crate::prim::files::file_type_name(st.st_mode),
                                if dir { "a directory" } else { "a regular file" }
                            ),
                        ))
                    }
                }
                Err(Errno::NOENT) if !required => Ok(()),
                Err(e) => Err(store_err(self.root.join(rel), e)),
            }
        };
        for d in ["objects", "manifests", "tmp", "quarantine"] {
            check(d, true, true)?;
        }
        check("lock", false, false)?;
        check(MARKER_NAME, false, false)?;
        for i in 0..=255u8 {
            check(&format!("objects/{i:02x}"), true, false)?;
        }
        Ok(())
    }

    fn lock_fd(&self) -> Result<OwnedFd> {
        fs::openat(
            &self.dir,
            "lock",
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .or_else(|e| match e {
            // A store others may read but we may not write: lock read-only.
            Errno::ACCESS | Errno::ROFS => fs::openat(
                &self.dir,
                "lock",
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ),
            e => Err(e),
        })
        .map_err(|e| store_err(self.root.join("lock"), e))
    }

    /// Take the store lock: shared for adders, exclusive for gc. Held
    /// until the returned descriptor is dropped.
    fn lock(&self, exclusive: bool) -> Result<OwnedFd> {
        let fd = self.lock_fd()?;
        let op = if exclusive {
            FlockOperation::LockExclusive
        } else {
            FlockOperation::LockShared
        };
        loop {
            match fs::flock(&fd, op) {
                Ok(()) => return Ok(fd),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(store_err(self.root.join("lock"), e)),
            }
        }
    }

    /// An unnamed, readable and writable file in `tmp/` (mode 0444), that
    /// becomes a name only through `persist_in`; `hint` names the named
    /// temporary where `O_TMPFILE` is missing.
    fn temporary(&self, hint: &str) -> Result<PendingFile<'_>> {
        let tmp = self.tmp.as_ref().expect("tmp/ is open once the store is");
        PendingFile::create_rw(
            tmp.as_fd(),
            Path::new("."),
            Path::new(hint),
            Mode::from_raw_mode(0o444),
        )
        .map_err(|e| {
            store_err(self.root.join("tmp"), e)
                .with_reason(crate::prim::files::create_reason(e, &self.root.join("tmp")))
        })
    }

    /// Run `f` on a pool of `n` threads.
    fn install_n<R: Send>(n: usize, f: impl FnOnce() -> R + Send) -> R {
        match rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("cowlink-store-{i}"))
            .build()
        {
            Ok(p) => p.install(f),
            Err(_) => f(),
        }
    }

    /// Run `f` on a pool of the threads asked for (default: one per core).
    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        Self::install_n(self.run.threads_or(crate::run::cores), f)
    }

    /// Run `f` on a pool of the threads asked for, or, when none were,
    /// of [`crate::run::default_threads`] for the destination `dst` and
    /// the work (the same policy as tree copies).
    fn install_for<R: Send>(
        &self,
        dst: BorrowedFd<'_>,
        clone_bound: bool,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        let n = self.run.threads_or(|| {
            crate::run::default_threads(crate::prim::files::kind_of(dst), clone_bound)
        });
        Self::install_n(n, f)
    }

    fn tick(&self, bytes: u64) {
        self.run.done(1, bytes);
    }

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
    fn ingest(&self, src: BorrowedFd<'_>, st: &Stat, path: &Path, durable: bool) -> Result<Added> {
        let op = Operation::Store;
        let err = |e: Errno| store_err(path, e);
        let pending = self.temporary("object")?;
        let size = st.st_size as u64;
        let failed = |e: Errno| transfer_error(op, path, &self.root, e, src, pending.fd());
        let done = transfer(
            src,
            pending.fd(),
            size,
            Reflink::Auto,
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
        let now = fs::fstat(src).map_err(err)?;
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
            fs::fchmod(pending.fd(), Mode::from_raw_mode(0o444)).map_err(err)?;
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
        let st = fs::stat(root).map_err(|e| store_err(root, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(Error::new(op, ErrorKind::NotADirectory)
                .with_src(root)
                .with_reason("add-tree needs a directory; use add for a file"));
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
        scan::walk(&[root.to_path_buf()], &self.run, op, &ingest);
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
        fs::syncfs(&self.dir).map_err(|e| store_err(&self.root, e))?;
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
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<Digest> {
        let digest = manifest.digest();
        manifest.validate(&digest.to_hex(), true)?;
        let bytes = manifest.to_bytes();
        let pending = self.temporary("manifest")?;
        let err = |e| store_err(self.root.join(manifest_rel(&digest)), e);
        write_all(pending.fd(), &bytes).map_err(err)?;
        fs::fsync(pending.fd()).map_err(err)?;
        let dir = self
            .layout_dir("manifests")
            .map_err(|e| store_err(self.root.join("manifests"), e))?;
        match pending.persist_in(dir.as_fd(), Path::new(&digest.to_hex()), Overwrite::Refuse) {
            Ok(()) | Err(Errno::EXIST) => Ok(digest),
            Err(e) => Err(err(e)),
        }
    }

    /// Read and validate the manifest `digest`, checking its bytes hash to
    /// its name.
    ///
    /// # Errors
    /// `NotFound` when the store has no such manifest, `ContentChanged`
    /// when its bytes do not match its digest (run `verify`),
    /// `InvalidInput` when it is not a valid manifest.
    pub fn manifest(&self, digest: &Digest) -> Result<Manifest> {
        let path = self.root.join(manifest_rel(digest));
        let read = || -> std::io::Result<Vec<u8>> {
            let fd = self.open_in_layout(&manifest_rel(digest))?;
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut v)?;
            Ok(v)
        };
        let bytes = read().map_err(|e| {
            let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
            let err = Error::from_errno(Operation::Manifest, errno).with_src(digest.to_hex());
            match errno {
                Errno::NOENT => err.with_reason("the store has no manifest with this digest"),
                _ => err,
            }
        })?;
        if Digest::of(&bytes) != *digest {
            return Err(Error::new(Operation::Manifest, ErrorKind::ContentChanged)
                .with_src(&path)
                .with_reason(
                    "the manifest's bytes do not match its digest (corrupt store: run verify)",
                ));
        }
        Manifest::from_bytes(&bytes, &digest.to_hex())
    }

    /// The manifests in the store, sorted.
    pub fn manifests(&self) -> Result<Vec<Digest>> {
        let fd = self
            .layout_dir("manifests")
            .map_err(|e| store_err(self.root.join("manifests"), e))?;
        let mut v: Vec<Digest> = list_dir(fd.as_fd())
            .map_err(|e| store_err(self.root.join("manifests"), e))?
            .iter()
            .filter_map(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .collect();
        v.sort();
        Ok(v)
    }

    /// Every object file: `(digest, generation, name relative to the root)`.
    fn object_files(&self) -> Result<Vec<(Digest, u32, String)>> {
        let mut out = Vec::new();
        for i in 0..=255u8 {
            let sub = format!("objects/{i:02x}");
            let fd = match self.layout_dir(&sub) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(store_err(self.root.join(&sub), e)),
            };
            for name in list_dir(fd.as_fd()).map_err(|e| store_err(self.root.join(&sub), e))? {
                if let Some((d, g)) = parse_object_name(&name) {
                    out.push((d, g, format!("{sub}/{}", String::from_utf8_lossy(&name))));
                }
            }
        }
        Ok(out)
    }

    /// Counts and sizes of what the store holds.
    pub fn stats(&self) -> Result<StoreStats> {
        let mut s = StoreStats::default();
        let mut sizes: HashMap<Digest, u64> = HashMap::new();
        for (d, g, rel) in self.object_files()? {
            let st = fs::statat(&self.dir, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| store_err(self.root.join(&rel), e))?;
            s.allocated_bytes += st.st_blocks as u64 * 512;
            if g == 0 {
                s.objects += 1;
                s.object_bytes += st.st_size as u64;
                sizes.insert(d, st.st_size as u64);
            } else {
                s.generations += 1;
            }
        }
        let mut used: HashSet<Digest> = HashSet::new();
        for m in self.manifests()? {
            s.manifests += 1;
            let Ok(manifest) = self.manifest(&m) else {
                continue;
            };
            for e in &manifest.entries {
                if let EntryKind::File { digest, size, .. } = e.kind {
                    s.manifest_files += 1;
                    s.manifest_bytes += size;
                    used.insert(digest);
                }
            }
        }
        let distinct: u64 = used.iter().filter_map(|d| sizes.get(d)).sum();
        s.bytes_saved = s.manifest_bytes.saturating_sub(distinct);
        Ok(s)
    }

    /// Rehash every object and manifest. Those whose bytes do not match
    /// their name (or that are not valid manifests) are moved to
    /// `quarantine/` and reported; objects that manifests need but the
    /// store lacks are reported as missing.
    pub fn verify(&self) -> Result<VerifyReport> {
        let objects = self.object_files()?;
        self.run.enter(Phase::Verify, objects.len() as u64, 0);
        let corrupt = Mutex::new(Vec::new());
        let bytes = AtomicU64::new(0);
        self.install(|| {
            objects.par_iter().for_each(|(d, _, rel)| {
                if self.run.cancelled() {
                    return;
                }
                let problem = match self.hash_file(rel) {
                    Ok((h, n)) => {
                        bytes.fetch_add(n, Ordering::Relaxed);
                        self.tick(n);
                        (h != d.0).then(|| format!("content hashes to {}", Digest(h)))
                    }
                    Err(e) => Some(format!(
                        "cannot be read: {}",
                        crate::ground::error::errno_text(e)
                    )),
                };
                if let Some(problem) = problem {
                    let c = self.quarantine(rel, problem);
                    corrupt.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                }
            })
        });
        if self.run.cancelled() {
            return Err(Error::new(Operation::Store, ErrorKind::Cancelled)
                .with_src(&self.root)
                .with_reason("verify cancelled before every object was read"));
        }
        let mut report = VerifyReport {
            objects: objects.len() as u64,
            bytes: bytes.into_inner(),
            corrupt: corrupt.into_inner().unwrap_or_default(),
            ..Default::default()
        };
        for m in self.manifests()? {
            report.manifests += 1;
            match self.manifest(&m) {
                Ok(manifest) => {
                    let mut seen = HashSet::new();
                    for e in &manifest.entries {
                        if let EntryKind::File { digest, .. } = e.kind {
                            if seen.insert(digest) && !self.contains(&digest) {
                                report.missing.push((m, digest));
                            }
                        }
                    }
                }
                Err(e) => {
                    let c = self.quarantine(&manifest_rel(&m), e.reason());
                    report.corrupt.push(c);
                }
            }
        }
        report.corrupt.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(report)
    }

    fn hash_file(&self, rel: &str) -> std::result::Result<([u8; 32], u64), Errno> {
        let fd = self.open_in_layout(rel)?;
        crate::ground::hash::hash_fd(fd.as_fd(), fs::fstat(&fd)?.st_size as u64, &|_| {})
    }

    /// The layout directory holding `rel` (opened without following
    /// symbolic links) and the last component of `rel`.
    fn parent_in_layout<'r>(&self, rel: &'r str) -> std::result::Result<(OwnedFd, &'r str), Errno> {
        let (parent, name) = rel.rsplit_once('/').unwrap_or((".", rel));
        Ok((self.layout_dir(parent)?, name))
    }

    /// Open the file `rel` of the layout read-only, following no symbolic
    /// link on the way or at the end.
    pub(crate) fn open_in_layout(&self, rel: &str) -> std::result::Result<OwnedFd, Errno> {
        open_beneath(self.dir.as_fd(), rel, OFlags::RDONLY | OFlags::NOFOLLOW)
    }

    /// Name a finished object `digest` generation `gen`; `EEXIST` when the
    /// store has it already.
    fn persist_object(
        &self,
        pending: PendingFile<'_>,
        digest: &Digest,
        gen: u32,
    ) -> std::result::Result<(), Errno> {
        let rel = object_rel(digest, gen);
        let (dir, name) = self.parent_in_layout(&rel)?;
        pending.persist_in(dir.as_fd(), Path::new(name), Overwrite::Refuse)
    }

    /// Remove the file `rel` of the layout (never through a symbolic link).
    fn unlink_in_layout(&self, rel: &str) -> std::result::Result<(), Errno> {
        let (dir, name) = self.parent_in_layout(rel)?;
        fs::unlinkat(&dir, name, AtFlags::empty())
    }

    /// Move `rel` to `quarantine/` (under a unique name).
    fn quarantine(&self, rel: &str, problem: String) -> Corrupt {
        let base = rel.rsplit('/').next().unwrap_or(rel);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let to = format!("quarantine/{base}.{stamp}");
        let moved = (|| {
            let (from, name) = self.parent_in_layout(rel)?;
            let q = self.layout_dir("quarantine")?;
            fs::renameat(&from, name, &q, &to["quarantine/".len()..])
        })()
        .is_ok();
        Corrupt {
            path: self.root.join(rel),
            quarantined: moved.then(|| self.root.join(&to)),
            problem,
        }
    }

    /// Remove every manifest not in `keep` (`None`: keep every manifest),
    /// every object that no kept manifest references, and temporaries of
    /// dead processes.
    ///
    /// Holds the store lock exclusively: adds in other processes wait, and
    /// an add that started before holds the shared lock until its manifest
    /// is written, so gc never removes what it is about to reference. With
    /// `None` the manifests are listed under the lock, so one written just
    /// before is kept. Objects added with [`add`](Self::add) alone (no
    /// manifest) are not referenced and are removed: keep them in a
    /// manifest.
    ///
    /// # Errors
    /// `NotFound` when a digest in `keep` is not a manifest of the store
    /// (nothing is removed then).
    pub fn gc(&self, keep: Option<&[Digest]>) -> Result<GcReport> {
        let _lock = self.lock(true)?;
        let keep: Vec<Digest> = match keep {
            Some(k) => k.to_vec(),
            None => self.manifests()?,
        };
        let mut report = GcReport::default();
        let keep: HashSet<Digest> = keep.iter().copied().collect();
        let mut used: HashSet<Digest> = HashSet::new();
        for d in &keep {
            let m = self.manifest(d).map_err(|e| {
                let why = format!("cannot keep manifest {d}: {}", e.reason());
                e.with_reason(why)
            })?;
            for e in &m.entries {
                if let EntryKind::File { digest, .. } = e.kind {
                    used.insert(digest);
                }
            }
        }
        for m in self.manifests()? {
            if keep.contains(&m) {
                report.manifests_kept += 1;
            } else {
                let rel = manifest_rel(&m);
                self.unlink_in_layout(&rel)
                    .map_err(|e| store_err(self.root.join(&rel), e))?;
                report.manifests_removed += 1;
            }
        }
        for (d, _, rel) in self.object_files()? {
            if used.contains(&d) {
                continue;
            }
            let size = fs::statat(&self.dir, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map_or(0, |s| s.st_size as u64);
            match self.unlink_in_layout(&rel) {
                Ok(()) => {
                    report.objects_removed += 1;
                    report.bytes_removed += size;
                }
                Err(Errno::NOENT) => {}
                Err(e) => return Err(store_err(self.root.join(&rel), e)),
            }
        }
        report.temporaries_removed = self.clean_temporaries(true)?;
        Ok(report)
    }

    /// Remove named temporaries in `tmp/`: all of them (`all`, under the
    /// exclusive lock) or those whose process is gone.
    fn clean_temporaries(&self, all: bool) -> Result<u64> {
        let fd = match self.layout_dir("tmp") {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(0),
            Err(e) => return Err(store_err(self.root.join("tmp"), e)),
        };
        let mut n = 0;
        for name in list_dir(fd.as_fd()).map_err(|e| store_err(self.root.join("tmp"), e))? {
            if all || temp_owner_is_dead(&name) {
                match fs::unlinkat(&fd, name.as_slice(), AtFlags::empty()) {
                    Ok(()) => n += 1,
                    Err(Errno::NOENT) => {}
                    // Not ours to remove (another user's store): leave it.
                    Err(Errno::ACCESS | Errno::PERM | Errno::ROFS) => {}
                    Err(e) => {
                        return Err(store_err(
                            self.root.join("tmp").join(OsStr::from_bytes(&name)),
                            e,
                        ))
                    }
                }
            }
        }
        Ok(n)
    }
}

/// Whether a temporary named `.HINT.cowlink-PID-N.tmp` belongs to a
/// process that no longer exists (in this PID namespace).
fn temp_owner_is_dead(name: &[u8]) -> bool {
    let s = String::from_utf8_lossy(name);
    let Some(rest) = s.rsplit_once(".cowlink-").map(|(_, r)| r) else {
        return false;
    };
    let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Open `rel` below `root` with `flags`, following no symbolic link on the
/// way (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): the one
/// way the store opens its own layout and checkout destinations.
pub(crate) fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
) -> std::result::Result<OwnedFd, Errno> {
    fs::openat2(
        root,
        if rel.is_empty() { "." } else { rel },
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// The names in a directory, without `.` and `..`.
fn list_dir(fd: BorrowedFd<'_>) -> std::result::Result<Vec<Vec<u8>>, Errno> {
    let mut out = Vec::new();
    for e in Dir::read_from(fd)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(n.to_vec());
        }
    }
    Ok(out)
}

fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> std::result::Result<(), Errno> {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => buf = &buf[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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

    fn file(&self, e: &Entry<'_>) -> Result<EntryKind> {
        let err = |x: Errno| store_err(&e.path, x);
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match fs::openat(e.dirfd, e.name, flags | OFlags::NOATIME, Mode::empty()) {
            Err(Errno::PERM) => fs::openat(e.dirfd, e.name, flags, Mode::empty()),
            r => r,
        }
        .map_err(err)?;
        let st = fs::fstat(&fd).map_err(err)?;
        let added = self.store.ingest(fd.as_fd(), &st, &e.path, false)?;
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
        let rel = match self.rel(&e.path) {
            Ok(r) => r,
            Err(err) => return self.fail(err),
        };
        let ft = match e.file_type {
            Some(t) => t,
            None => match fs::statat(e.dirfd, e.name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(x) => return self.fail(store_err(&e.path, x)),
            },
        };
        let kind = match ft {
            FileType::RegularFile => self.file(&e),
            FileType::Symlink => fs::readlinkat(e.dirfd, e.name, Vec::new())
                .map_err(|x| store_err(&e.path, x))
                .and_then(|t| {
                    t.into_string().map_err(|_| {
                        Error::new(Operation::Store, ErrorKind::InvalidInput)
                            .with_src(&e.path)
                            .with_reason(
                                "the link's target is not valid UTF-8, which manifests cannot hold",
                            )
                    })
                })
                .map(|target| EntryKind::Symlink { target }),
            other => Err(Error::new(Operation::Store, ErrorKind::NotRegularFile)
                .with_src(&e.path)
                .with_reason(format!(
                    "{} cannot be stored (only files, directories and symbolic links)",
                    crate::prim::files::file_type_name(other.as_raw_mode())
                ))),
        };
        match kind {
            Ok(kind) => self.push(rel, kind),
            Err(err) => self.fail(err),
        }
    }
}

impl Visitor for TreeIngest<'_> {
    fn dir(&self, dir: &DirInfo, st: &Stat) {
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
