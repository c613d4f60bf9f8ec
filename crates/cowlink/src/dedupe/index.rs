//! The dedupe index: per filesystem, what earlier runs learned of each
//! file, so a rerun reads only what changed.
//!
//! One [redb] database per filesystem, `<dir>/<key>.redb`, where `key` is
//! the filesystem's UUID (`FS_IOC_GETFSUUID`) followed, on Btrfs, by the
//! subvolume's id (inode numbers repeat across subvolumes, which all
//! answer the one UUID; where Btrfs does not answer `FS_IOC_GETFSUUID`,
//! `BTRFS_IOC_FS_INFO` gives the same UUID). Without a UUID (a kernel
//! before 6.5, or a filesystem that has none) the key is the device number, `dev-HEX`:
//! stable while the device stays attached, so at worst a re-attached loop
//! device starts a new index. Device numbers are not the key otherwise:
//! they change when a loop device is re-attached and differ per Btrfs
//! subvolume. A block copy of a filesystem answers the same UUID: an index
//! last opened on another device that is mounted now with the same key
//! is the original's, and the copy gets `<key>-dev-<dev>` (see
//! `open_keyed`).
//!
//! Table `files` maps an inode number to its entry: the identity it was
//! learned under (size, mtime, ctime, birth time where the filesystem
//! gives one) and what was learned (the planning hash: BLAKE3 of the whole
//! content for a file of two edges or less, of its first and last 4 KiB
//! otherwise; the whole-file BLAKE3 of a larger file where one was
//! computed; the extent-layout facts: bytes held alone and, for a file
//! whose every block is shared, a fingerprint of its logical → physical
//! runs), and where it was met: its directory's inode and its own name
//! (table `dirs` maps a directory's inode to its path, so a path's long
//! common part is kept once per directory, not once per file). Where is
//! only for pruning: after a walk, the entries of files under its roots
//! that it did not meet are removed. An entry is trusted only while the file's identity is equal in
//! every field: content changed under a restored mtime still moves the
//! ctime, which no caller can set; a replaced file has a new birth time
//! or ctime even where its inode number is reused; a rename or a new hard
//! link moves the ctime too (the file is read again: correct, at the cost
//! of one read). A match is still proven by `FIDEDUPERANGE`, which
//! compares every byte under lock: the index only decides what need not
//! be read.
//!
//! Each entry ends with 8 bytes of BLAKE3 over its inode number and its
//! bytes: a damaged entry is dropped and its file read again, never
//! trusted. A database redb cannot open, or one of another format
//! ([`FORMAT`]), is removed and rebuilt, with a note in the report.
//!
//! Crash rules: what a run learned is written in one redb write
//! transaction per filesystem, committed (fsync) when planning ends; the
//! layouts of the files a run shared are rewritten in a second one after
//! executing. redb commits are atomic, so a `kill -9` at any point leaves
//! the last committed state: at worst a run's learning is lost, and the
//! next run reads those files again. An entry is only ever written with
//! the identity its file had before it was read, so a file written while
//! being read is read again next time.
//!
//! A lock file `<key>.lock` next to the database (`flock`, exclusive,
//! holding the holder's pid and command line) keeps two runs from using
//! one index at once; a run that finds it held goes on without the index
//! for that filesystem and says who holds it.
//!
//! Why redb: an embedded, transactional (copy-on-write B-tree, atomic
//! commits) key-value store in pure Rust, so the core still
//! cross-compiles for macOS and Windows without a C toolchain (SQLite and
//! LMDB are C); maintained, and 2.x keeps the workspace's Rust 1.85.

// redb's error is large (160 bytes); it is returned on the cold path of
// a failed index write only, which becomes a note in the report.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use redb::{Database, ReadOnlyTable, ReadableTable, ReadableTableMetadata, TableDefinition};
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, FlockOperation};

use crate::ground::lock;

/// The entries' format. An index of another format is rebuilt. 2: table
/// `meta` records the device the index was last opened on, which tells a
/// same-UUID copy of a filesystem from the original (an index of format 1
/// cannot say which of the two it was learned on).
pub const FORMAT: u32 = 2;

const FILES: TableDefinition<u64, &[u8]> = TableDefinition::new("files");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Directory inode → absolute path: a file's entry holds its directory's
/// inode and its own name, not its whole path (the path is only for
/// pruning, and most of a path is its directory's, repeated per file).
const DIRS: TableDefinition<u64, &[u8]> = TableDefinition::new("dirs");

/// Where the indexes live by default: `/var/lib/cowlink/index` for root,
/// else `$XDG_STATE_HOME/cowlink/index`, else
/// `~/.local/state/cowlink/index`. `None` when neither is known.
pub fn default_dir() -> Option<PathBuf> {
    if rustix::process::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/cowlink/index"));
    }
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(s) = nonempty("XDG_STATE_HOME") {
        return Some(PathBuf::from(s).join("cowlink/index"));
    }
    nonempty("HOME").map(|h| PathBuf::from(h).join(".local/state/cowlink/index"))
}

/// What the index did in one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexReport {
    /// The index files used, one per filesystem.
    pub files: Vec<PathBuf>,
    /// Files whose identity matched their entry: nothing of them was read.
    pub unchanged: u64,
    /// Entries written (files read this run, and layouts after sharing).
    pub written: u64,
    /// Entries of files gone from the walked paths, removed.
    pub pruned: u64,
    /// Things the user should know: an index rebuilt (damaged, another
    /// format), damaged entries dropped, an index in use by another run.
    pub notes: Vec<String>,
}

/// What an entry says of a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Entry {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: Option<i64>,
    /// Bytes in extents no other file shared when mapped.
    pub exclusive: u64,
    /// Fingerprint of the runs when every extent was shared.
    pub shared: Option<u64>,
    pub inline: bool,
    /// The layout facts are known.
    pub mapped: bool,
    /// The planning hash (whole for small files, edges for larger ones).
    pub hash: Option<[u8; 32]>,
    /// The whole-file hash of a larger file.
    pub whole: Option<[u8; 32]>,
    /// The inode of the directory the file was met in (its path is in the
    /// `dirs` table), or 0 when `name` is a whole path (a file given as a
    /// root).
    pub dir: u64,
    /// The file's name in `dir`.
    pub name: Vec<u8>,
}

const F_BTIME: u8 = 1;
const F_SHARED: u8 = 2;
const F_INLINE: u8 = 4;
const F_MAPPED: u8 = 8;
const F_HASH: u8 = 16;
const F_WHOLE: u8 = 32;
const CHECK: usize = 8;

impl Entry {
    /// Whether `id` is the identity this entry was learned under.
    pub fn matches(&self, id: &cowlink_sys::FileId) -> bool {
        self.size == id.size
            && self.mtime_ns == id.mtime_ns
            && self.ctime_ns == id.ctime_ns
            && self.btime_ns == id.btime_ns
    }

    /// The identity part of an entry for `id`, met as `name` in the
    /// directory of inode `dir` (0: `name` is a whole absolute path);
    /// nothing learned yet.
    pub fn of(id: &cowlink_sys::FileId, dir: u64, name: &[u8]) -> Entry {
        Entry {
            size: id.size,
            mtime_ns: id.mtime_ns,
            ctime_ns: id.ctime_ns,
            btime_ns: id.btime_ns,
            dir,
            name: name.to_vec(),
            ..Entry::default()
        }
    }

    fn encode(&self, ino: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(128 + self.name.len());
        let flags = [
            (self.btime_ns.is_some(), F_BTIME),
            (self.shared.is_some(), F_SHARED),
            (self.inline, F_INLINE),
            (self.mapped, F_MAPPED),
            (self.hash.is_some(), F_HASH),
            (self.whole.is_some(), F_WHOLE),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .fold(0, |f, (_, b)| f | b);
        v.push(flags);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.mtime_ns.to_le_bytes());
        v.extend_from_slice(&self.ctime_ns.to_le_bytes());
        if let Some(b) = self.btime_ns {
            v.extend_from_slice(&b.to_le_bytes());
        }
        v.extend_from_slice(&self.exclusive.to_le_bytes());
        if let Some(s) = self.shared {
            v.extend_from_slice(&s.to_le_bytes());
        }
        if let Some(h) = &self.hash {
            v.extend_from_slice(h);
        }
        if let Some(h) = &self.whole {
            v.extend_from_slice(h);
        }
        v.extend_from_slice(&self.dir.to_le_bytes());
        v.extend_from_slice(&self.name);
        let check = check(ino, &v);
        v.extend_from_slice(&check);
        v
    }

    /// The entry in `b`, if its check holds and it reads whole.
    fn decode(ino: u64, b: &[u8]) -> Option<Entry> {
        let (body, sum) = b.split_at_checked(b.len().checked_sub(CHECK)?)?;
        if check(ino, body) != sum {
            return None;
        }
        let (&flags, mut rest) = body.split_first()?;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (a, b) = rest.split_at_checked(n)?;
            rest = b;
            Some(a)
        };
        let u = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let mut e = Entry {
            size: u(take(8)?),
            mtime_ns: u(take(8)?) as i64,
            ctime_ns: u(take(8)?) as i64,
            ..Entry::default()
        };
        if flags & F_BTIME != 0 {
            e.btime_ns = Some(u(take(8)?) as i64);
        }
        e.exclusive = u(take(8)?);
        if flags & F_SHARED != 0 {
            e.shared = Some(u(take(8)?));
        }
        e.inline = flags & F_INLINE != 0;
        e.mapped = flags & F_MAPPED != 0;
        if flags & F_HASH != 0 {
            e.hash = Some(take(32)?.try_into().expect("32 bytes"));
        }
        if flags & F_WHOLE != 0 {
            e.whole = Some(take(32)?.try_into().expect("32 bytes"));
        }
        e.dir = u(take(8)?);
        e.name = rest.to_vec();
        Some(e)
    }
}

fn check(ino: u64, body: &[u8]) -> [u8; CHECK] {
    let mut h = blake3::Hasher::new();
    h.update(&ino.to_le_bytes());
    h.update(body);
    let mut out = [0; CHECK];
    out.copy_from_slice(&h.finalize().as_bytes()[..CHECK]);
    out
}

/// `path` made absolute against the working directory (lexically: no
/// symbolic link is resolved, so a tree given the same way twice is
/// recorded the same way).
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The index of one filesystem, open and locked for a run.
pub(super) struct FsIndex {
    file: PathBuf,
    db: Database,
    /// The entries and directories as they were when the run began,
    /// until the walk is over ([`Indexes::walked`]): a read transaction
    /// left open keeps every page the run's writes replace, and the file
    /// grew by several times its content.
    read: RwLock<Option<Snapshot>>,
    /// Entries when the run began.
    held: u64,
    /// Held for the run: the lock file, `flock`ed.
    _lock: std::fs::File,
    /// Entries that failed their check (dropped, read again).
    damaged: AtomicU64,
    unchanged: AtomicU64,
    /// The keys of the entries this run met: looked up and found
    /// (whatever their identity), or put. When the table holds no more,
    /// no entry can be of a file gone, and the pruning scan is skipped.
    met: Mutex<HashSet<u64>>,
    /// Inode numbers whose entry was found damaged: removed when written.
    bad: Mutex<Vec<u64>>,
    /// redb failed (panicked) reading it: a damage its checks missed.
    /// Nothing more is read or written; the file is removed at commit.
    broken: std::sync::atomic::AtomicBool,
}

/// What a run reads of an index while walking.
struct Snapshot {
    files: ReadOnlyTable<u64, &'static [u8]>,
    dirs: ReadOnlyTable<u64, &'static [u8]>,
}

impl FsIndex {
    /// Whether the index has directory `ino` at `path` already.
    pub fn has_dir(&self, ino: u64, path: &[u8]) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let read = self.read.read().unwrap_or_else(|e| e.into_inner());
        let Some(r) = read.as_ref() else {
            return false;
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            r.dirs
                .get(ino)
                .ok()
                .flatten()
                .is_some_and(|v| v.value() == path)
        }))
        .unwrap_or(false)
    }

    /// Whether this run met every entry the index held when it began
    /// (nothing can be pruned, if nothing was written since).
    fn all_met(&self) -> bool {
        self.held <= lock(&self.met).len() as u64 && lock(&self.bad).is_empty()
    }

    /// The entry of inode `ino` if its identity is `id`; counts it as
    /// unchanged.
    pub fn lookup(&self, id: &cowlink_sys::FileId) -> Option<Entry> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        let read = self.read.read().unwrap_or_else(|e| e.into_inner());
        let table = &read.as_ref()?.files;
        // redb trusts its pages: a damaged file can make it panic. That
        // is an index to rebuild, not a run to lose.
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            table.get(id.ino).ok().flatten().map(|v| v.value().to_vec())
        }));
        let got = match got {
            Ok(got) => got?,
            Err(_) => {
                self.broken.store(true, Ordering::Relaxed);
                return None;
            }
        };
        let e = Entry::decode(id.ino, &got);
        if e.is_some() {
            lock(&self.met).insert(id.ino);
        }
        match e {
            Some(e) if e.matches(id) => {
                self.unchanged.fetch_add(1, Ordering::Relaxed);
                Some(e)
            }
            Some(_) => None,
            None => {
                self.damaged.fetch_add(1, Ordering::Relaxed);
                lock(&self.bad).push(id.ino);
                None
            }
        }
    }
}

/// The indexes of one run, one per filesystem met, opened on first use.
pub(super) struct Indexes {
    dir: PathBuf,
    by_dev: RwLock<HashMap<u64, Option<Arc<FsIndex>>>>,
    notes: Mutex<Vec<String>>,
    written: AtomicU64,
    pruned: AtomicU64,
}

/// What pruning needs of a walk: the files and directories it met, as
/// (device, inode), and its roots (absolute).
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    pub files: &'a HashSet<(u64, u64)>,
    pub dirs: &'a HashSet<(u64, u64)>,
    pub roots: &'a [PathBuf],
}

/// A file's layout as it is now: inode, identity, bytes held alone,
/// fingerprint of its runs when all shared.
type Layout = (u64, cowlink_sys::FileId, u64, Option<u64>);

/// Changes to write, per device: entries to put, and updates to the
/// hashes of entries put earlier in the same run.
#[derive(Default)]
pub(super) struct Pending {
    dirs: HashMap<u64, Vec<(u64, Vec<u8>)>>,
    put: HashMap<u64, Vec<(u64, Entry)>>,
    hashes: HashMap<u64, Vec<(u64, Learnt)>>,
}

/// One filesystem's share of a [`Pending`].
struct Work {
    dirs: Vec<(u64, Vec<u8>)>,
    puts: Vec<(u64, Entry)>,
    learnt: Vec<(u64, Learnt)>,
}

impl Work {
    fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.puts.is_empty() && self.learnt.is_empty()
    }
}

/// A hash learnt after an entry was put.
#[derive(Debug, Clone, Copy)]
pub(super) enum Learnt {
    /// The planning hash.
    Hash([u8; 32]),
    /// The whole-file hash.
    Whole([u8; 32]),
}

impl Pending {
    /// Record that directory `ino` on `dev` is at `path` (absolute).
    pub fn dir(&mut self, dev: u64, ino: u64, path: &[u8]) {
        self.dirs.entry(dev).or_default().push((ino, path.to_vec()));
    }

    /// Put `e` as inode `ino`'s entry on device `dev`.
    pub fn put(&mut self, dev: u64, ino: u64, e: Entry) {
        self.put.entry(dev).or_default().push((ino, e));
    }

    /// Record a hash learnt of inode `ino` on `dev` (put this run).
    pub fn learnt(&mut self, dev: u64, ino: u64, h: Learnt) {
        self.hashes.entry(dev).or_default().push((ino, h));
    }

    fn is_empty(&self) -> bool {
        self.put.is_empty() && self.hashes.is_empty() && self.dirs.is_empty()
    }
}

impl Indexes {
    /// Indexes kept under `dir` (created when first needed).
    pub fn new(dir: &Path) -> Indexes {
        Indexes {
            dir: dir.to_path_buf(),
            by_dev: RwLock::default(),
            notes: Mutex::default(),
            written: AtomicU64::new(0),
            pruned: AtomicU64::new(0),
        }
    }

    /// The index of device `dev`, opened on first use from `fd` (a file or
    /// directory on it); `None` when it cannot be used (a note says why).
    pub fn of(&self, dev: u64, fd: BorrowedFd<'_>) -> Option<Arc<FsIndex>> {
        if let Some(got) = self
            .by_dev
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
        {
            return got.clone();
        }
        let mut map = self.by_dev.write().unwrap_or_else(|e| e.into_inner());
        if let Some(got) = map.get(&dev) {
            return got.clone();
        }
        let opened = match self.open(dev, fd) {
            Ok(ix) => Some(Arc::new(ix)),
            Err(note) => {
                self.note(note);
                None
            }
        };
        map.insert(dev, opened.clone());
        opened
    }

    /// The walk is over: let go of the snapshots it read (see
    /// [`FsIndex::read`]).
    pub fn walked(&self) {
        let map = self.by_dev.read().unwrap_or_else(|e| e.into_inner());
        for ix in map.values().flatten() {
            *ix.read.write().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Rewrite each index compactly where most of its file is free pages
    /// (a first run's bulk inserts and copy-on-write commits leave them).
    /// Takes the indexes back from the run: only when no one else holds
    /// them.
    pub fn finish(self: Arc<Self>) {
        let Ok(me) = Arc::try_unwrap(self) else {
            return;
        };
        // A run that wrote nothing leaves the file alone.
        if me.written.load(Ordering::Relaxed) + me.pruned.load(Ordering::Relaxed) == 0 {
            return;
        }
        let map = me.by_dev.into_inner().unwrap_or_else(|e| e.into_inner());
        for ix in map.into_values().flatten() {
            let Ok(mut ix) = Arc::try_unwrap(ix) else {
                continue;
            };
            if ix.broken.load(Ordering::Relaxed) {
                continue;
            }
            *ix.read.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
            let wasteful = (|| -> Result<bool, redb::Error> {
                let txn = ix.db.begin_write()?;
                let st = txn.stats()?;
                txn.abort()?;
                let used = st.stored_bytes() + st.metadata_bytes();
                let size = std::fs::metadata(&ix.file).map_or(0, |m| m.len());
                Ok(size > 2 * used + (1 << 20))
            })();
            if wasteful.unwrap_or(false) {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ix.db.compact()));
            }
        }
    }

    /// The index of device `dev` if it was opened.
    pub fn opened(&self, dev: u64) -> Option<Arc<FsIndex>> {
        self.by_dev
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
            .cloned()
            .flatten()
    }

    fn note(&self, s: String) {
        lock(&self.notes).push(s);
    }

    fn open(&self, dev: u64, fd: BorrowedFd<'_>) -> Result<FsIndex, String> {
        self.open_keyed(dev, fs_key(dev, fd), true)
    }

    /// Open the index named `key` for device `dev`. With `check`, an
    /// index last used on another device that is mounted now and answers
    /// the same key belongs to a copy of this filesystem (a cloned image
    /// keeps its UUID, and its inodes their identities while their
    /// layouts differ): this one then gets an index of its own,
    /// `<key>-dev-<dev>`. A device number is not stable (a re-attached
    /// loop device), so the copy's index is rebuilt when it moves: one
    /// full read, never a wrong trust. Two copies mounted one after the
    /// other on one device cannot be told apart; the kernel's compare
    /// still proves every match.
    fn open_keyed(&self, dev: u64, key: String, check: bool) -> Result<FsIndex, String> {
        let shown = |p: &Path| crate::name::quoted(p).to_string();
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            format!(
                "index directory {}: {e}; going on without an index",
                shown(&self.dir)
            )
        })?;
        let file = self.dir.join(format!("{key}.redb"));
        let lock_path = self.dir.join(format!("{key}.lock"));
        let mut lk = own_file(&lock_path)
            .map_err(|e| format!("index lock {}: {e}; going on without it", shown(&lock_path)))?;
        if fs::flock(lk.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err() {
            let mut holder = String::new();
            let _ = lk.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(format!(
                "index {} is in use by {}; this run goes on without it",
                shown(&file),
                if holder.is_empty() {
                    "another run"
                } else {
                    holder
                }
            ));
        }
        let _ = lk.set_len(0);
        let _ = lk.rewind();
        let _ = writeln!(lk, "pid {} ({})", std::process::id(), command_line());
        let db = self.open_db(&file)?;
        if check {
            match last_dev(&db) {
                Some(d) if d == dev => {}
                Some(d) if mounted_with_key(d, &key) => {
                    drop(db);
                    drop(lk);
                    return self.open_keyed(dev, format!("{key}-dev-{dev:x}"), false);
                }
                _ => write_dev(&db, dev).map_err(|e| format!("index {}: {e}", shown(&file)))?,
            }
        }
        let read = db.begin_read().ok().and_then(|t| {
            Some(Snapshot {
                files: t.open_table(FILES).ok()?,
                dirs: t.open_table(DIRS).ok()?,
            })
        });
        let held = read
            .as_ref()
            .map_or(u64::MAX, |r| r.files.len().unwrap_or(u64::MAX));
        Ok(FsIndex {
            file,
            db,
            read: RwLock::new(read),
            held,
            _lock: lk,
            damaged: AtomicU64::new(0),
            unchanged: AtomicU64::new(0),
            met: Mutex::default(),
            bad: Mutex::default(),
            broken: Default::default(),
        })
    }

    /// Open (or create) the database at `file`, rebuilding it when it is
    /// damaged or of another format.
    fn open_db(&self, file: &Path) -> Result<Database, String> {
        let shown = crate::name::quoted(file).to_string();
        let builder = || {
            let mut b = Database::builder();
            // The cache bounds the memory redb keeps of the file; a rerun
            // looks each entry up once, so a large cache buys little.
            b.set_cache_size(16 << 20);
            b
        };
        // Opened by this process, never through a link: the directory
        // may be writable by others, and redb would fill an empty file a
        // symlink points at.
        let own = own_file(file).map_err(|e| format!("index {shown}: {e}; going on without it"))?;
        let opened = std::panic::catch_unwind(move || {
            let mut db = builder().create_file(own)?;
            // Every page's checksum, once per run: redb trusts its pages
            // once open (a damaged one can make it panic), and this is
            // the one check that reads them all.
            match db.check_integrity()? {
                true => Ok(db),
                false => Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
                    "repaired after a damage".into(),
                ))),
            }
        });
        let opened = opened.unwrap_or_else(|_| {
            Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(
                "damaged".into(),
            )))
        });
        let why = match opened {
            Ok(db) => match format_of(&db) {
                Ok(Some(FORMAT)) => return Ok(db),
                Ok(None) => {
                    write_format(&db).map_err(|e| format!("index {shown}: {e}"))?;
                    return Ok(db);
                }
                Ok(Some(other)) => format!("is of format {other}, this version uses {FORMAT}"),
                Err(e) => format!("cannot be read ({e})"),
            },
            Err(e) => format!("cannot be read ({e})"),
        };
        self.note(format!(
            "index {shown} {why}: rebuilt (every file is read again)"
        ));
        std::fs::remove_file(file).map_err(|e| format!("index {shown}: cannot remove: {e}"))?;
        let own = own_file(file).map_err(|e| format!("index {shown}: {e}; going on without it"))?;
        let db = builder()
            .create_file(own)
            .map_err(|e| format!("index {shown}: {e}"))?;
        write_format(&db).map_err(|e| format!("index {shown}: {e}"))?;
        Ok(db)
    }

    /// Write `pending`, and prune, on each device in `seen` (the inodes
    /// the walk met there, as (device, inode)), the entries whose path lies
    /// under one of `roots` and whose inode was not met. One transaction
    /// per filesystem.
    pub fn commit(&self, pending: Pending, seen: Option<Seen<'_>>) {
        let mut devs: HashSet<u64> = pending.put.keys().copied().collect();
        devs.extend(pending.hashes.keys().copied());
        devs.extend(pending.dirs.keys().copied());
        if let Some(seen) = seen {
            devs.extend(seen.files.iter().map(|&(d, _)| d));
        }
        if devs.is_empty() && pending.is_empty() {
            return;
        }
        let Pending {
            mut dirs,
            mut put,
            mut hashes,
        } = pending;
        for dev in devs {
            let Some(ix) = self.opened(dev) else { continue };
            if self.drop_broken(&ix) {
                continue;
            }
            let work = Work {
                dirs: dirs.remove(&dev).unwrap_or_default(),
                puts: put.remove(&dev).unwrap_or_default(),
                learnt: hashes.remove(&dev).unwrap_or_default(),
            };
            let prune = seen.map(|s| (s, dev));
            if work.is_empty() && prune.is_none_or(|_| ix.all_met()) {
                // Nothing to write, nothing to prune: no transaction (an
                // unchanged rerun commits nothing).
                continue;
            }
            let wrote = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.write(&ix, work, prune)
            }));
            match wrote {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.note(format!(
                    "index {}: not updated: {e}",
                    crate::name::quoted(&ix.file)
                )),
                Err(_) => {
                    ix.broken.store(true, Ordering::Relaxed);
                    self.drop_broken(&ix);
                }
            }
        }
    }

    fn write(
        &self,
        ix: &FsIndex,
        work: Work,
        prune: Option<(Seen<'_>, u64)>,
    ) -> Result<(), redb::Error> {
        let Work {
            dirs,
            mut puts,
            learnt,
        } = work;
        let txn = ix.db.begin_write()?;
        {
            let mut d = txn.open_table(DIRS)?;
            for (ino, path) in dirs {
                if d.get(ino)?.is_some_and(|v| v.value() == path.as_slice()) {
                    continue;
                }
                d.insert(ino, path.as_slice())?;
            }
            let mut t = txn.open_table(FILES)?;
            for ino in std::mem::take(&mut *lock(&ix.bad)) {
                t.remove(ino)?;
            }
            // In key order: a B-tree's cheapest way in.
            puts.sort_unstable_by_key(|(ino, _)| *ino);
            let n = puts.len() as u64;
            let mut met = lock(&ix.met);
            for (ino, e) in puts {
                t.insert(ino, e.encode(ino).as_slice())?;
                met.insert(ino);
            }
            drop(met);
            let mut updated = 0;
            for (ino, h) in learnt {
                let Some(mut e) = t.get(ino)?.and_then(|v| Entry::decode(ino, v.value())) else {
                    continue;
                };
                match h {
                    Learnt::Hash(h) => e.hash = Some(h),
                    Learnt::Whole(h) => e.whole = Some(h),
                }
                t.insert(ino, e.encode(ino).as_slice())?;
                updated += 1;
            }
            self.written.fetch_add(n + updated, Ordering::Relaxed);
            // Every entry was met (found by a lookup or put new): none
            // can be of a file gone, and the scan (every entry decoded)
            // would be most of an unchanged rerun's index work.
            let met = lock(&ix.met).len() as u64;
            let prune = prune.filter(|_| t.len().map_or(true, |n| n > met));
            if let Some((seen, dev)) = prune {
                let under = |p: &[u8]| {
                    let p = Path::new(std::ffi::OsStr::from_bytes(p));
                    seen.roots.iter().any(|r| p.starts_with(r))
                };
                let mut paths: HashMap<u64, Vec<u8>> = HashMap::new();
                for row in d.iter()? {
                    let (k, v) = row?;
                    paths.insert(k.value(), v.value().to_vec());
                }
                let mut gone = Vec::new();
                for row in t.iter()? {
                    let (k, v) = row?;
                    let ino = k.value();
                    if seen.files.contains(&(dev, ino)) {
                        continue;
                    }
                    // An undecodable entry goes too, and one whose
                    // directory is unknown.
                    let goes = match Entry::decode(ino, v.value()) {
                        Some(e) if e.dir == 0 => under(&e.name),
                        Some(e) => paths.get(&e.dir).is_none_or(|p| under(p)),
                        None => true,
                    };
                    if goes {
                        gone.push(ino);
                    }
                }
                self.pruned.fetch_add(gone.len() as u64, Ordering::Relaxed);
                for ino in gone {
                    t.remove(ino)?;
                }
                for (ino, p) in paths {
                    if !seen.dirs.contains(&(dev, ino)) && under(&p) {
                        d.remove(ino)?;
                    }
                }
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Record the layouts of `paths` as they are now (after sharing), for
    /// those whose entry's identity still matches.
    pub fn relayout(&self, paths: &[&Path]) {
        let mut by_dev: HashMap<u64, Vec<Layout>> = HashMap::new();
        for p in paths {
            let Ok(fd) = super::open_read(p) else {
                continue;
            };
            let Ok(id) = cowlink_sys::file_id(fd.as_fd()) else {
                continue;
            };
            let Ok(list) = crate::extents::extents_fd(fd.as_fd(), false) else {
                continue;
            };
            let mut c = super::Cand::default();
            super::layout_facts(&list, &mut c);
            by_dev
                .entry(id.dev)
                .or_default()
                .push((id.ino, id, c.exclusive, c.shared));
        }
        for (dev, list) in by_dev {
            let Some(ix) = self.opened(dev) else { continue };
            if self.drop_broken(&ix) {
                continue;
            }
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                || -> Result<u64, redb::Error> {
                    let txn = ix.db.begin_write()?;
                    let mut n = 0;
                    {
                        let mut t = txn.open_table(FILES)?;
                        for (ino, id, exclusive, shared) in list {
                            let Some(mut e) =
                                t.get(ino)?.and_then(|v| Entry::decode(ino, v.value()))
                            else {
                                continue;
                            };
                            if !e.matches(&id) {
                                continue;
                            }
                            e.exclusive = exclusive;
                            e.shared = shared;
                            e.mapped = true;
                            t.insert(ino, e.encode(ino).as_slice())?;
                            n += 1;
                        }
                    }
                    txn.commit()?;
                    Ok(n)
                },
            ));
            match res {
                Ok(Ok(n)) => {
                    self.written.fetch_add(n, Ordering::Relaxed);
                }
                Ok(Err(e)) => self.note(format!(
                    "index {}: layouts not updated: {e}",
                    crate::name::quoted(&ix.file)
                )),
                Err(_) => {
                    ix.broken.store(true, Ordering::Relaxed);
                    self.drop_broken(&ix);
                }
            }
        }
    }

    /// Whether `ix` broke while being read; if so, its file is removed
    /// (once), to be rebuilt by the next run.
    fn drop_broken(&self, ix: &FsIndex) -> bool {
        if !ix.broken.load(Ordering::Relaxed) {
            return false;
        }
        if std::fs::remove_file(&ix.file).is_ok() {
            self.note(format!(
                "index {} is damaged: removed, the next run rebuilds it",
                crate::name::quoted(&ix.file)
            ));
        }
        true
    }

    /// What the indexes did so far.
    pub fn report(&self) -> IndexReport {
        let map = self.by_dev.read().unwrap_or_else(|e| e.into_inner());
        let mut r = IndexReport {
            written: self.written.load(Ordering::Relaxed),
            pruned: self.pruned.load(Ordering::Relaxed),
            notes: lock(&self.notes).clone(),
            ..IndexReport::default()
        };
        for ix in map.values().flatten() {
            r.files.push(ix.file.clone());
            r.unchanged += ix.unchanged.load(Ordering::Relaxed);
            let damaged = ix.damaged.load(Ordering::Relaxed);
            if damaged > 0 {
                r.notes.push(format!(
                    "index {}: {damaged} damaged entries dropped (those files were read again)",
                    crate::name::quoted(&ix.file)
                ));
            }
        }
        r.files.sort();
        r.files.dedup();
        r
    }
}

fn format_of(db: &Database) -> Result<Option<u32>, redb::Error> {
    let txn = db.begin_read()?;
    let t = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // A database with entries but no format is not one of ours.
    let Some(v) = t.get("format")? else {
        return Ok(Some(0));
    };
    let v = v.value();
    Ok(Some(match <[u8; 4]>::try_from(v) {
        Ok(b) => u32::from_le_bytes(b),
        Err(_) => 0,
    }))
}

/// The device the index was last opened on (`None` before any).
fn last_dev(db: &Database) -> Option<u64> {
    let txn = db.begin_read().ok()?;
    let t = txn.open_table(META).ok()?;
    let v = t.get("dev").ok()??;
    Some(u64::from_le_bytes(<[u8; 8]>::try_from(v.value()).ok()?))
}

fn write_dev(db: &Database, dev: u64) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(META)?
        .insert("dev", dev.to_le_bytes().as_slice())?;
    txn.commit()?;
    Ok(())
}

/// Whether device `dev` is mounted now (the mount table) with a
/// filesystem whose index key is `key`.
fn mounted_with_key(dev: u64, key: &str) -> bool {
    let Ok(text) = cowlink_sys::mount_table() else {
        return false;
    };
    let want = cowlink_sys::dev_major_minor(dev);
    crate::ground::mountinfo::parse(&text)
        .into_iter()
        .filter(|m| m.dev == want)
        .any(|m| {
            let Ok(d) = fs::open(
                &m.mount_point,
                fs::OFlags::DIRECTORY | fs::OFlags::RDONLY | fs::OFlags::CLOEXEC,
                fs::Mode::empty(),
            ) else {
                return false;
            };
            cowlink_sys::fstat(&d).is_ok_and(|st| st.st_dev == dev) && fs_key(dev, d.as_fd()) == key
        })
}

fn write_format(db: &Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(META)?;
        t.insert("format", FORMAT.to_le_bytes().as_slice())?;
        drop(txn.open_table(FILES)?);
        drop(txn.open_table(DIRS)?);
    }
    txn.commit()?;
    Ok(())
}

/// Open (or create) `path` for reading and writing as a file of the
/// index's own: never through a symlink (`O_NOFOLLOW`), and refused unless
/// it is a regular file with no other name (a hard link would let a write
/// land in another file; a FIFO or a device is no place for an index).
fn own_file(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        // O_NONBLOCK: opening a FIFO must not wait for a writer.
        .custom_flags(libc_flags::NOFOLLOW | libc_flags::NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => {
                "is not a regular file (a symlink)".to_string()
            }
            _ => e.to_string(),
        })?;
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.file_type().is_file() {
        return Err("is not a regular file".into());
    }
    if m.nlink() != 1 {
        return Err(format!(
            "is not a regular file of its own ({} names: a hard link)",
            m.nlink()
        ));
    }
    // Back to blocking I/O for redb and the lock's writes.
    let flags = fs::fcntl_getfl(&f).map_err(|e| e.to_string())?;
    fs::fcntl_setfl(&f, flags - fs::OFlags::NONBLOCK).map_err(|e| e.to_string())?;
    Ok(f)
}

/// The open flags `own_file` adds, as the raw numbers `OpenOptionsExt`
/// takes.
mod libc_flags {
    pub const NOFOLLOW: i32 = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    pub const NONBLOCK: i32 = rustix::fs::OFlags::NONBLOCK.bits() as i32;
}

/// The name of `dev`'s index: its filesystem's UUID (and Btrfs subvolume
/// id), or the device number when no UUID is given.
fn fs_key(dev: u64, fd: BorrowedFd<'_>) -> String {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    // Btrfs answers FS_IOC_GETFSUUID only on recent kernels: its own
    // ioctl gives the same UUID.
    let uuid =
        cowlink_sys::fs_uuid(fd).or_else(|_| cowlink_sys::btrfs_fsid(fd).map(|u| u.to_vec()));
    match uuid {
        Ok(u) if !u.is_empty() && u.iter().any(|&b| b != 0) => {
            match cowlink_sys::btrfs_root_id(fd) {
                Ok(id) => format!("{}-{id}", hex(&u)),
                Err(_) => hex(&u),
            }
        }
        // The raw number: its major/minor split differs per platform.
        _ => format!("dev-{dev:x}"),
    }
}

/// This process's command line, for the lock file (empty if unknown).
fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Read-only statistics of an index file, for tests and benchmarks:
/// entries and the database's size in bytes.
pub fn stats(file: &Path) -> Result<(u64, u64), String> {
    let db = Database::open(file).map_err(|e| e.to_string())?;
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let table = txn.open_table(FILES).map_err(|e| e.to_string())?;
    let n = table.len().map_err(|e| e.to_string())?;
    let size = std::fs::metadata(file).map_err(|e| e.to_string())?.len();
    Ok((n, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_and_a_changed_byte_is_refused() {
        let e = Entry {
            size: 9000,
            mtime_ns: -5,
            ctime_ns: 7,
            btime_ns: Some(3),
            exclusive: 8192,
            shared: Some(42),
            inline: false,
            mapped: true,
            hash: Some([1; 32]),
            whole: Some([2; 32]),
            dir: 12,
            name: b"caf\xe9".to_vec(),
        };
        let b = e.encode(77);
        assert_eq!(Entry::decode(77, &b), Some(e.clone()));
        assert_eq!(Entry::decode(78, &b), None, "another inode's entry");
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert_eq!(Entry::decode(77, &bad), None, "byte {i} flipped");
        }
        assert_eq!(Entry::decode(77, &b[..b.len() - 1]), None);
        let bare = Entry {
            size: 1,
            ..Entry::default()
        };
        assert_eq!(Entry::decode(1, &bare.encode(1)), Some(bare));
    }
}
