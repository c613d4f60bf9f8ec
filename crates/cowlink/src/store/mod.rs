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
//! STORE/tmp/abcd….partial    a large object a pull is downloading (resumed
//!                            by the next pull if this one is cut off)
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
//! [`Store::checkout`] (in `materialize`) places files with
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

mod generations;
mod ingest;
mod layout;
mod maintenance;
mod manifest;
mod materialize;
mod paths;
#[cfg(feature = "remote")]
pub mod remote;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, Operation, Result};
use crate::run::Run;

use layout::object_rel;
pub(crate) use layout::MARKER_NAME;
pub use layout::{ManifestInfo, PARTIAL_GRACE};
pub use manifest::{
    BadDigest, Digest, EntryKind, FileTotals, Manifest, ManifestEntry, MANIFEST_FORMAT,
    MANIFEST_VERSION,
};

pub use crate::prim::mode::LinkMode;
pub use ingest::{Added, AddedTree};
pub use maintenance::{Corrupt, GcReport, StoreStats, VerifyReport};
pub use materialize::{CheckoutOptions, CheckoutReport};
pub use paths::{LinkVerdict, MAX_LINKS};

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

    /// Whether the store holds the object `digest` (a regular file).
    pub fn contains(&self, digest: &Digest) -> bool {
        // Only a regular file: anything else at the name is damage that
        // verify and gc move away, not an object.
        cowlink_sys::statat(&self.dir, object_rel(digest, 0), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| cowlink_sys::file_type(st.st_mode) == fs::FileType::RegularFile)
    }

    /// Run `f` on a pool of `n` threads.
    pub(super) fn install_n<R: Send>(n: usize, f: impl FnOnce() -> R + Send) -> R {
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

    /// The threads for work placing files into `dst`
    /// ([`Run::workers_for`](crate::run::Run), the policy of tree copies):
    /// cloning into Btrfs with no count asked for, one per core behind a
    /// [`Gate`](crate::run::Gate) that measures one thread against all of
    /// them and lets through the faster count.
    fn threads_for(
        &self,
        dst: BorrowedFd<'_>,
        clone_bound: bool,
    ) -> (usize, Option<crate::run::Gate>) {
        use crate::run::Threads;
        match self
            .run
            .workers_for(crate::prim::files::kind_of(dst), clone_bound)
        {
            Threads::Fixed(n) => (n, None),
            Threads::Adaptive { low, high } => (high, Some(crate::run::Gate::new(low, high))),
        }
    }

    fn tick(&self, bytes: u64) {
        self.run.done(1, bytes);
    }
}
