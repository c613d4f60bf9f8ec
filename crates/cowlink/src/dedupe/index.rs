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
//! One record per directory: table `records` maps a directory's inode to
//! its absolute path and the entries of the files met in it, by inode
//! (sorted; inodes and times delta-coded). An entry holds the identity the file was learned
//! under (size, mtime, ctime, birth time where the filesystem gives one)
//! and what was learned: the planning hash (BLAKE3 of the whole content
//! for a file of two edges or less, of its first and last 4 KiB
//! otherwise), the whole-file BLAKE3 of a larger file where one was
//! computed, and the extent-layout facts (bytes held alone and, for a file
//! whose every block is shared, a fingerprint of its logical → physical
//! runs). A record per directory rather than a key per file: a rerun does
//! one lookup per directory, redb's per-key cost (its B-tree's offsets,
//! half-filled leaves after splits) is paid once per directory, the path
//! is kept once per directory, and pruning is per directory. The cost: a
//! change to one file rewrites its directory's record, and a directory of
//! many files is one large value.
//!
//! An entry is trusted only while the file's identity is equal in every
//! field: content changed under a restored mtime still moves the ctime,
//! which no caller can set; a replaced file has a new birth time or ctime
//! even where its inode number is reused; a rename or a new hard link
//! moves the ctime too (the file is read again: correct, at the cost of
//! one read). A directory renamed keeps its inode, and its files their
//! identities: they are found under the new path. A file given as a walk
//! root (no directory walked) is not indexed. A match is still proven by
//! `FIDEDUPERANGE`, which compares every byte under lock: the index only
//! decides what need not be read. The identity covers the content, not
//! the layout: extents move with no time changed (a compressing Btrfs
//! defragment, another tool's dedupe), so an entry whose layout would
//! spare work (every block shared, or none held alone) has its file
//! mapped again (one FIEMAP, no byte read) before the layout is used, a
//! sample of them each run. The hashes are kept whole (32 bytes),
//! though a planning hash needs fewer bits: a plan shows the BLAKE3 of
//! each group, and an index hash must compare equal to one read this run.
//!
//! On Btrfs, as root, the identity need not even be read: Btrfs writes a
//! file's inode item in the transaction of every change to it, its
//! extents' included, so each record holds a transaction committed
//! before its files were looked at, and one tree search per range of
//! its inodes names those written since. The others are taken from
//! their entries with no `statx` and no sample; the written ones have
//! their layout mapped again every time. The rules (when a record is
//! given a run's transaction, balances, filesystems put back, reused
//! subvolume ids, files mounted over a name) are at `DirProof`.
//!
//! After the walk, the record of every directory walked is rebuilt from
//! the files met in it: a file gone from it is dropped then (pruned), and
//! a record equal to the stored one (same check, below) is not written,
//! so an unchanged rerun writes nothing. Records of directories under the
//! walked roots that the walk did not meet (removed, or moved out) are
//! removed at the end of planning; that scan of every record is skipped
//! when the run met every record the index held. What is learned after
//! the walk (larger files' layouts and hashes while planning, the layouts
//! of the files shared while executing) is held and applied to the
//! records of their directories once, at the run's end: in one
//! transaction, or in the copy when the file is due for a rewrite (a
//! first run: written in place, it would rewrite most records only for
//! the copy to read them again). A hard link in two directories has an
//! entry in each; what is learned after the walk goes to the name the
//! plan kept (a stale layout under another name only costs a dedupe call
//! that shares nothing new).
//!
//! Each record ends with 8 bytes of BLAKE3 over its directory's inode
//! number and its bytes: a damaged record is dropped and its directory's
//! files read again, never trusted. A database redb cannot open, or one
//! of another format ([`FORMAT`]), is removed and rebuilt, with a note in
//! the report.
//!
//! Every page's checksum is checked when a run opens the database
//! (`Database::check_integrity`: redb trusts its pages once open, and a
//! damaged one can make it panic), unless the file is exactly as a run
//! that ended cleanly left it, and its pages were all checked within a
//! day: that run writes a seal into the lock file after closing the
//! database and syncing it (the file's device, inode, size, mtime and
//! ctime, and when its pages were last checked), and the next run reads
//! the seal and removes it before it opens the file. A write to the file
//! by anything else moves its ctime, which no one can set back; a run
//! killed, or one whose write or read failed, that met a damaged record
//! or a redb panic, or that finds another file at the path at its end,
//! leaves no seal; a file or seal not owned by the user running, or that
//! others may write, is not trusted, nor a seal that is not the lock
//! file's one line. A damage that moves no time (a disk's) is found
//! within a day; a run that meets it first has redb's panics caught (at
//! open, in each read, when the database closes) and goes on without
//! what it could not read. A power loss can keep a seal whose removal
//! never reached the disk, over a file a later run changed: that run's
//! unclean close makes redb recover (and check) the file when it is next
//! opened. The check reads the whole file twice (its checksums, then its
//! allocations): about 30 ms of a 0.5 s rerun over 150,000 files.
//!
//! Crash rules: what the walk learned is written in one redb write
//! transaction per filesystem when the walk ends (committed, fsync), and
//! what was learned after it in a second one at the run's end (or in the
//! rewrite's copy, renamed over the file). redb commits are atomic, and
//! so is the rename, so a `kill -9` at any point leaves the last
//! committed state: at worst a run's learning is lost, and the next run
//! reads those files again (an entry written before its file's layout was
//! read says so, and the layout is read next time). An entry is only ever
//! written with the identity its file had before it was read, so a file
//! written while being read is read again next time.
//!
//! No claim outlives a change of the file it describes: what is learnt
//! of a file (its layout, its hashes, its layout after sharing) is kept
//! only if the file was still the one the walk saw after it was read
//! (its stamp, checked on the descriptor read), and is applied only to
//! an entry of that identity. A clone's hash is read once, from the first
//! file of its cluster, and given to every member under its own
//! identity: that file, rewritten between its map and its read, would
//! otherwise give its unchanged clones the hash of bytes they never
//! held, trusted run after run.
//!
//! Size on disk: redb splits a full B-tree leaf in half, allocates pages
//! in powers of two, and copies every page a transaction changes, so a
//! first run (every record written, then most rewritten after sharing)
//! leaves a file several times what it holds, which redb's compaction
//! does not give back. New records are written in a scattered order of
//! their keys (`scatter`; in key order every leaf is left half empty),
//! but in key order into an index that held nothing (see
//! `Indexes::write_order`), and changed records in key order; a file
//! more than 1.5 times what it holds, and at least twice its size
//! after its last rewrite (meta key `compacted`), is rewritten at the end of the run:
//! copied into `<key>.redb.new`, then renamed over the old one (atomic: a
//! crash leaves one whole file or the other; a copy left by a crash is
//! removed when the index is next opened, and a second Ctrl-C removes it
//! on the way out). What is left is redb's
//! growth by regions: the file's apparent size runs ahead of the pages
//! in use (not written, so not allocated on disk). Storing records in
//! pieces of 2 KiB, so that no value outgrows a page, was measured to
//! change neither.
//!
//! Memory: records are built one directory at a time from the plan's own
//! candidates (no second copy of what was learned), lookups keep a
//! bounded number of decoded records ([`CACHED_ENTRIES`]), and redb's
//! cache is small: a run reads each record once.
//!
//! An index directory inside the tree being deduplicated is fine: the
//! walk leaves the index's own files there alone (they are written while
//! the run reads), and walks the rest (`Indexes::own_file`).
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use redb::{Database, ReadOnlyTable, ReadableTable, ReadableTableMetadata, TableDefinition};
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, FlockOperation};

use super::{stages, FileStamp};
use crate::ground::lock;

/// The records' format. An index of another format is rebuilt. 2: table
/// `meta` records the device the index was last opened on, which tells a
/// same-UUID copy of a filesystem from the original. 3: one record per
/// directory (table `records`) instead of one entry per file. 4: an
/// entry's times are differences from the entry before it. 5: a record
/// holds the Btrfs transaction its files are known unchanged since
/// (`Record::since`).
pub const FORMAT: u32 = 5;

const RECORDS: TableDefinition<u64, &[u8]> = TableDefinition::new("records");
/// The index's own facts, by key: `format` ([`FORMAT`]); `dev`, the
/// device it was last opened on; `transid`, the Btrfs transaction the
/// last run as root committed; `subvol`, the UUID of the Btrfs subvolume
/// that run met under the key (see [`Indexes::open`]); `distrust`, the
/// transaction up to which no record is trusted, the last one a run saw
/// before a run found the filesystem gone back (see
/// [`FsIndex::find_proof`]); [`COMPACTED`] and [`SHARING`].
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// Key of [`META`] set, synced, before a run first shares a file of the
/// index's filesystem ([`Indexes::sharing`]), and removed by the run's
/// last, synced commit ([`Indexes::persist`]). Found when the index is
/// opened, it tells of a run stopped while sharing: the files it shared
/// kept their identities (a dedupe changes no time) but not their
/// blocks, and the layouts it learnt since its last batch was written
/// were lost, so every layout held is forgotten ([`forget_layouts`]).
const SHARING: &str = "sharing";

/// Key of [`META`]: the file's size (little-endian u64) right after it
/// was last rewritten ([`rewrite`]). See [`Indexes::finish`].
const COMPACTED: &str = "compacted";

/// Entries of decoded records kept for the walk's lookups (the least
/// recently used records go first, but never the eight most recent).
/// A directory's entries are looked up while the walk is in it,
/// so a few records cover the walk's threads; a record let go is read
/// again if needed.
pub const CACHED_ENTRIES: usize = 1 << 13;

/// Decoded records kept whatever their size: the walk's threads each
/// look up in a directory of their own (or share a large one), and a
/// directory larger than [`CACHED_ENTRIES`] must not be let go while a
/// thread is still in it (evicted by age alone, a large directory is
/// decoded again each time another thread enters a small one). Eight
/// covers the walk's threads on most machines; more threads only cost
/// decodes, never a wrong answer.
const KEPT_RECORDS: usize = 8;

/// redb's cache: each record is read once per run, so a large cache buys
/// little and shows in the run's peak memory.
const DB_CACHE: usize = 4 << 20;
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
    /// Of [`IndexReport::unchanged`], files known unchanged without even
    /// a `stat`: on Btrfs, as root, no transaction after their record's
    /// wrote their inode.
    pub unstated: u64,
    /// Index files whose every page was checked when this run opened
    /// them (new ones included); the others were exactly as the run
    /// before left them, their pages checked less than a day ago (see
    /// the module's notes on the seal).
    #[serde(default)]
    pub verified: u64,
    /// Entries written: those of the directory records rewritten after
    /// the walk (a record is rewritten whole when one of its files
    /// changed), and those updated later (layouts and hashes learnt,
    /// layouts after sharing). A record rewritten only to note a later
    /// Btrfs transaction, every entry as it was, is not counted.
    pub written: u64,
    /// Entries of files gone from the walked paths (from their
    /// directory, or with it), removed.
    pub pruned: u64,
    /// Files whose layout, as the index held it, a fresh map found
    /// wrong: blocks moved or unshared while the file's times stayed
    /// (another program's dedupe or clone, a defragment, the deletion of
    /// a file they were shared with). Found by the sampled recheck or
    /// `--recheck-layouts`; each is written as mapped. A file counts
    /// once, however many names it has.
    #[serde(default)]
    pub corrected: u64,
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
    /// Bytes in extents no other file shared when mapped (0 unless
    /// `mapped`).
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
}

/// The identity an entry is trusted under (with the inode, its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ident {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    btime_ns: Option<i64>,
}

impl Ident {
    /// The identity of `id`.
    pub fn of(id: &cowlink_sys::FileId) -> Ident {
        Ident {
            size: id.size,
            mtime_ns: id.mtime_ns,
            ctime_ns: id.ctime_ns,
            btime_ns: id.btime_ns,
        }
    }
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
        self.ident() == Ident::of(id)
    }

    fn ident(&self) -> Ident {
        Ident {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            btime_ns: self.btime_ns,
        }
    }

    /// The stamp of the file this entry was learned of: inode `ino` on
    /// device `dev` (its record's), with the entry's identity.
    pub fn stamp(&self, dev: u64, ino: u64) -> FileStamp {
        FileStamp::of(&cowlink_sys::FileId {
            dev,
            ino,
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            btime_ns: self.btime_ns,
            ..Default::default()
        })
    }

    /// The identity part of an entry for `id`; nothing learned yet.
    pub fn of(id: &cowlink_sys::FileId) -> Entry {
        Entry {
            size: id.size,
            mtime_ns: id.mtime_ns,
            ctime_ns: id.ctime_ns,
            btime_ns: id.btime_ns,
            ..Entry::default()
        }
    }

    /// Append the entry to `v`: flags, size (varint), mtime and ctime as
    /// they are (8 bytes each: nanoseconds rarely compress; a copied
    /// file's mtime is its source's), the birth time as its distance from
    /// the ctime (zigzag varint: a file written once has its ctime a
    /// moment after its birth), then what is known.
    /// Append the entry to `v`; its times as differences from `prev`'s
    /// (the entry before it in its record, or none), which are small
    /// within a directory (files made or unpacked together): five to ten
    /// bytes instead of sixteen.
    fn encode(&self, prev: Option<&Entry>, v: &mut Vec<u8>) {
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
        put_var(v, self.size);
        let (m, c) = prev.map_or((0, 0), |p| (p.mtime_ns, p.ctime_ns));
        put_var(v, zigzag(self.mtime_ns.wrapping_sub(m)));
        put_var(v, zigzag(self.ctime_ns.wrapping_sub(c)));
        if let Some(b) = self.btime_ns {
            put_var(v, zigzag(b.wrapping_sub(self.ctime_ns)));
        }
        if self.mapped {
            put_var(v, self.exclusive);
        }
        if let Some(s) = self.shared {
            v.extend_from_slice(&s.to_le_bytes());
        }
        if let Some(h) = &self.hash {
            v.extend_from_slice(h);
        }
        if let Some(h) = &self.whole {
            v.extend_from_slice(h);
        }
    }

    /// Read past an entry [`Entry::encode`] wrote, keeping nothing: what
    /// [`Entry::decode`] would accept, without building it.
    fn skip(r: &mut Reader<'_>) -> Option<()> {
        let flags = r.byte()?;
        if flags & !(F_BTIME | F_SHARED | F_INLINE | F_MAPPED | F_HASH | F_WHOLE) != 0 {
            return None;
        }
        for _ in 0..3 + u8::from(flags & F_BTIME != 0) + u8::from(flags & F_MAPPED != 0) {
            r.var()?;
        }
        let fixed = [(F_SHARED, 8), (F_HASH, 32), (F_WHOLE, 32)];
        for (f, n) in fixed {
            if flags & f != 0 {
                r.take(n)?;
            }
        }
        Some(())
    }

    /// The entry [`Entry::encode`] wrote after `prev`.
    fn decode(prev: Option<&Entry>, r: &mut Reader<'_>) -> Option<Entry> {
        let flags = r.byte()?;
        if flags & !(F_BTIME | F_SHARED | F_INLINE | F_MAPPED | F_HASH | F_WHOLE) != 0 {
            return None;
        }
        let (m, c) = prev.map_or((0, 0), |p| (p.mtime_ns, p.ctime_ns));
        let size = r.var()?;
        let mut e = Entry {
            size,
            mtime_ns: m.wrapping_add(unzigzag(r.var()?)),
            ctime_ns: c.wrapping_add(unzigzag(r.var()?)),
            ..Entry::default()
        };
        if flags & F_BTIME != 0 {
            e.btime_ns = Some(e.ctime_ns.wrapping_add(unzigzag(r.var()?)));
        }
        e.inline = flags & F_INLINE != 0;
        e.mapped = flags & F_MAPPED != 0;
        if e.mapped {
            e.exclusive = r.var()?;
        }
        if flags & F_SHARED != 0 {
            e.shared = Some(r.u64()?);
        }
        if flags & F_HASH != 0 {
            e.hash = Some(r.take(32)?.try_into().ok()?);
        }
        if flags & F_WHOLE != 0 {
            e.whole = Some(r.take(32)?.try_into().ok()?);
        }
        Some(e)
    }
}

/// `x` as LEB128.
fn put_var(v: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        v.push(x as u8 | 0x80);
        x >>= 7;
    }
    v.push(x as u8);
}

/// `x` with its sign in the lowest bit, so a small negative number is a
/// short varint.
fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

fn unzigzag(x: u64) -> i64 {
    ((x >> 1) as i64) ^ -((x & 1) as i64)
}

/// Reads a record's fields; `None` when it ends early or a number is
/// malformed.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn var(&mut self) -> Option<u64> {
        let mut x = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let part = u64::from(b & 0x7f);
            if shift == 63 && part > 1 {
                return None;
            }
            x |= part << shift;
            if b & 0x80 == 0 {
                return Some(x);
            }
        }
        None
    }
}

/// An inode number's mark for [`Indexes::stored_as`]: a mix of it with
/// a key drawn once per process, so that no set of inode numbers is
/// chosen to make two sums meet.
pub(super) fn ino_mark(ino: u64) -> u64 {
    static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let key = *KEY.get_or_init(|| {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(0x0063_6f77_6c69_6e6b_u64)
    });
    super::mix64(ino ^ key)
}

/// A directory's record: its absolute path (for pruning) and the entries
/// of the files met in it, sorted by inode, one per inode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Record {
    pub path: Vec<u8>,
    /// On Btrfs, a transaction committed before any file of the record
    /// was looked at: a file whose inode item no later transaction wrote
    /// is as its entry says, layout included (see [`Indexes::walked`]).
    /// 0: none known.
    pub since: u64,
    pub files: Vec<(u64, Entry)>,
}

impl Record {
    /// The bytes stored for directory `dir`: the path, the transaction,
    /// the count, each
    /// entry after its inode's distance from the last (inodes of one
    /// directory are often near each other), and the check.
    fn encode(&self, dir: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(16 + self.path.len() + self.files.len() * 80);
        put_var(&mut v, self.path.len() as u64);
        v.extend_from_slice(&self.path);
        put_var(&mut v, self.since);
        put_var(&mut v, self.files.len() as u64);
        let mut last = 0;
        let mut prev = None;
        for (ino, e) in &self.files {
            debug_assert!(*ino >= last, "entries sorted by inode");
            put_var(&mut v, ino - last);
            last = *ino;
            e.encode(prev, &mut v);
            prev = Some(e);
        }
        let check = check(dir, &v);
        v.extend_from_slice(&check);
        v
    }

    /// A stored record's head, read from `r` (at the start of its body):
    /// its path, its transaction and its number of entries, which each
    /// take 5 bytes at least (no count beyond that is read).
    fn header<'a>(r: &mut Reader<'a>) -> Option<(&'a [u8], u64, u64)> {
        let whole = r.0.len() as u64;
        let len = usize::try_from(r.var()?).ok()?;
        let path = r.take(len)?;
        let since = r.var()?;
        let n = r.var()?;
        (n <= whole / 5).then_some((path, since, n))
    }

    /// The record in `b`, if its check holds and it reads whole.
    fn decode(dir: u64, b: &[u8]) -> Option<Record> {
        let body = checked(dir, b)?;
        let mut r = Reader(body);
        let (path, since, n) = Record::header(&mut r)?;
        let path = path.to_vec();
        let mut files = Vec::with_capacity(n as usize);
        let mut last = 0u64;
        for i in 0..n {
            let d = r.var()?;
            if i > 0 && d == 0 {
                return None;
            }
            last = last.checked_add(d)?;
            let e = Entry::decode(files.last().map(|(_, p)| p), &mut r)?;
            files.push((last, e));
        }
        r.0.is_empty().then_some(Record { path, since, files })
    }

    /// Of the record stored as `body` (its check taken off, and found
    /// right), how many entries `self` lacks (files gone), read without
    /// decoding the entries; `None` where `body` does not read whole.
    fn lost_from(&self, body: &[u8]) -> Option<u64> {
        let mut r = Reader(body);
        let (_, _, n) = Record::header(&mut r)?;
        let (mut last, mut lost, mut kept) = (0u64, 0, self.files.iter().peekable());
        for i in 0..n {
            let d = r.var()?;
            if i > 0 && d == 0 {
                return None;
            }
            last = last.checked_add(d)?;
            Entry::skip(&mut r)?;
            // Both sorted by inode: step past the new record's smaller ones.
            while kept.next_if(|(ino, _)| *ino < last).is_some() {}
            if kept.peek().is_none_or(|(ino, _)| *ino != last) {
                lost += 1;
            }
        }
        r.0.is_empty().then_some(lost)
    }

    /// The entry of inode `ino`.
    pub fn get(&self, ino: u64) -> Option<&Entry> {
        let i = self.files.binary_search_by_key(&ino, |(k, _)| *k).ok()?;
        Some(&self.files[i].1)
    }
}

/// Decode `bytes` as the stored record of directory `dir`, and encode
/// what was read again: `None` where the record is refused (its check
/// fails, or it does not read whole). Not an interface: the index's
/// records are its own. This is the entry of the fuzz target
/// `index_record` and of its corpus replay in the test suite, which hold
/// that decoding bytes from disk ends, never panics, allocates no more
/// than their length allows, and that what it accepts encodes to bytes
/// it reads back as the same record.
#[doc(hidden)]
pub fn reencoded_record(dir: u64, bytes: &[u8]) -> Option<Vec<u8>> {
    Record::decode(dir, bytes).map(|r| r.encode(dir))
}

fn check(dir: u64, body: &[u8]) -> [u8; CHECK] {
    let mut h = blake3::Hasher::new();
    h.update(&dir.to_le_bytes());
    h.update(body);
    let mut out = [0; CHECK];
    out.copy_from_slice(&h.finalize().as_bytes()[..CHECK]);
    out
}

/// The inode ranges a record's files are searched in: runs of its inode
/// numbers (sorted) with gaps of at most 16 between neighbours, the gap
/// widened eightfold until there are at most 8 + files/8 ranges. One
/// range over the whole record would take in every inode made between
/// its first and last file (a directory's files and its subdirectories'
/// trees interleave when a tree is copied), and the search copies every
/// item of every leaf written since in its range.
fn search_ranges(files: &[(u64, Entry)]) -> Vec<(u64, u64)> {
    let limit = 8 + files.len() / 8;
    let mut gap = 16u64;
    loop {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &(ino, _) in files {
            match out.last_mut() {
                Some((_, hi)) if ino.saturating_sub(*hi) <= gap => *hi = ino,
                _ => out.push((ino, ino)),
            }
        }
        if out.len() <= limit || gap > u64::MAX / 8 {
            return out;
        }
        gap *= 8;
    }
}

/// Take the exclusive `flock` on the index's lock file `lk`, trying a few
/// times over about a quarter of a second before calling it held. A lock
/// released by a run can still be held for a moment by a process another
/// thread of the same program forked before it execs (the descriptor is
/// close-on-exec, but shared until the exec): taken at once, a run right
/// after another of the same program would find its own index "in use"
/// and go on without it, sharing what the index knows to leave alone.
fn lock_soon(lk: &std::fs::File) -> bool {
    for wait_ms in [0u64, 5, 10, 20, 40, 80, 100] {
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        if fs::flock(lk.as_fd(), FlockOperation::NonBlockingLockExclusive).is_ok() {
            return true;
        }
    }
    false
}

/// The body of the stored bytes `b` of directory `dir`'s record, if its
/// check holds.
fn checked(dir: u64, b: &[u8]) -> Option<&[u8]> {
    let (body, sum) = b.split_at_checked(b.len().checked_sub(CHECK)?)?;
    (check(dir, body) == sum).then_some(body)
}

/// The check at the end of stored bytes `b`.
fn tail(b: &[u8]) -> Option<[u8; CHECK]> {
    b.get(b.len().checked_sub(CHECK)?..)?.try_into().ok()
}

/// Whether two encoded records (without their checks) hold the same path
/// and entries, whatever their transactions.
fn same_but_since(a: &[u8], b: &[u8]) -> bool {
    // (The path's length and the path, then the transaction.)
    let split = |x: &[u8]| -> Option<(usize, usize)> {
        let mut r = Reader(x);
        let len = usize::try_from(r.var()?).ok()?;
        r.take(len)?;
        let at = x.len() - r.0.len();
        r.var()?;
        Some((at, x.len() - r.0.len()))
    };
    match (split(a), split(b)) {
        (Some((a0, a1)), Some((b0, b1))) => a[..a0] == b[..b0] && a[a1..] == b[b1..],
        _ => false,
    }
}

/// `path` made absolute against the working directory (lexically: no
/// symbolic link is resolved, so a tree given the same way twice is
/// recorded the same way).
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// [`absolute`], as bytes, borrowed where `path` is absolute already and
/// has nothing to make plain (no `.` component, no repeated or trailing
/// separator): the walk's paths below an absolute root, in a rerun's
/// check of every directory met.
pub(super) fn absolute_bytes(path: &Path) -> std::borrow::Cow<'_, [u8]> {
    let b = path.as_os_str().as_bytes();
    let plain = b.len() > 1
        && b[0] == b'/'
        && b[1] != b'/'
        && !b.ends_with(b"/")
        && !b.ends_with(b"/.")
        && !b.windows(2).any(|w| w == b"//")
        && !b.windows(3).any(|w| w == b"/./");
    match plain {
        true => std::borrow::Cow::Borrowed(b),
        false => std::borrow::Cow::Owned(absolute(path).into_os_string().into_vec()),
    }
}

/// The index of one filesystem, open and locked for a run.
pub(super) struct FsIndex {
    file: PathBuf,
    db: Db,
    /// The records as they were when the run began, until the walk is
    /// over ([`Indexes::walked`]): a read transaction left open keeps
    /// every page the run's writes replace, and the file grew by several
    /// times its content.
    read: RwLock<Option<ReadOnlyTable<u64, &'static [u8]>>>,
    /// Records when the run began.
    held: u64,
    /// Every page of the file was checked when this run opened it.
    verified: bool,
    /// Held for the run: the lock file, `flock`ed; sealed when let go
    /// (after `db`, declared above it, is closed).
    lock: IndexLock,
    /// Records that failed their check (dropped, their files read again).
    damaged: AtomicU64,
    unchanged: AtomicU64,
    unstated: AtomicU64,
    /// The inodes whose layout claim a fresh map found wrong
    /// ([`IndexReport::corrected`]).
    corrected: Mutex<HashSet<u64>>,
    state: Mutex<State>,
    /// redb failed (panicked) reading it: a damage its checks missed.
    /// Nothing more is read or written; the file is removed at commit.
    broken: AtomicBool,
    /// This run set [`SHARING`]: its end removes it
    /// ([`Indexes::persist`]).
    lazy: AtomicBool,
    /// [`SHARING`] is set (synced) for this run.
    sharing: Mutex<bool>,
    /// On Btrfs, as root: the transaction committed when the index was
    /// opened, before the walk looked at any file of it (see
    /// [`FsIndex::proof`]).
    since_now: Option<u64>,
    /// Tree searches are refused here (no `CAP_SYS_ADMIN`).
    unsearchable: AtomicBool,
    /// [`DirProof::None`], shared.
    no_proof: Arc<DirProof>,
    /// The transaction of the filesystem's last relocation (a balance),
    /// when `since_now` is known (`u64::MAX` where it cannot be read):
    /// only after one can a file's extents have moved with its inode
    /// item left as it was.
    relocated_at: u64,
    /// The filesystem's transaction is before one a run of this index
    /// saw: it went back (see [`FsIndex::find_proof`]); or the Btrfs
    /// subvolume is another than the last run met under this index's key
    /// (its id given again). No record's transaction is trusted this run.
    went_back: bool,
    /// A run found the filesystem gone back: records whose transaction
    /// is at most this (the last one a run saw before) belong to the
    /// history undone, and are never trusted by transaction.
    distrust: u64,
}

impl Drop for FsIndex {
    /// The database is closed first, and a database redb failed on (a
    /// panic, now or while it closes), or one with a record found
    /// damaged, is not sealed: the next run checks every page (its lock,
    /// let go after this, seals the others).
    fn drop(&mut self) {
        // redb writes its allocator state on the way out, reading the
        // tree: a damage there is the file's, not the run's.
        if let Some(db) = self.db.0.take() {
            let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
            if closed.is_err() {
                self.broken.store(true, Ordering::Relaxed);
            }
        }
        if self.broken.load(Ordering::Relaxed) || self.damaged.load(Ordering::Relaxed) > 0 {
            self.lock.sealable.store(false, Ordering::Relaxed);
        }
    }
}

/// An index's open database, there until the index is let go (then
/// closed by [`FsIndex`]'s drop, a panic caught).
struct Db(Option<Database>);

impl std::ops::Deref for Db {
    type Target = Database;
    fn deref(&self) -> &Database {
        // Taken only by the drop.
        self.0
            .as_ref()
            .expect("the database is open while its index is")
    }
}

/// How the walk may know the files of one directory's record on Btrfs
/// without a `statx` each ([`FsIndex::proof`]).
///
/// The rule: a record's [`Record::since`] is a transaction committed
/// before any of its files was looked at. Every change to a file (a
/// write, truncation, clone, dedupe, defragment, a change of owner,
/// mode, links or any time) writes its inode item in the transaction it
/// belongs to, so an inode whose item no later transaction wrote is as
/// its entry says, its layout included, unless a balance moved its
/// extents (which rewrites its file extent items, not its inode item:
/// one in a leaf written since has the file `statx`ed and its layout
/// mapped again); one tree search per directory,
/// after a commit (an inode's update waits in memory until one), names
/// the others and gives their identity from the item. A record is
/// given this run's transaction only when each of its entries is known
/// that way, or was read, or mapped again, this run: a layout claim the
/// sampled recheck left unchecked is never certified.
pub(super) enum DirProof {
    /// Nothing known by transaction: each file is `statx`ed and a layout
    /// claim checked by sample, as off Btrfs.
    None,
    /// The record's inodes written since its transaction, with their
    /// identity now (`None`: an extent item of theirs was rewritten, as a
    /// balance does, with their inode item left: `statx`ed and mapped
    /// again); the rest are unchanged. `refresh`: the search copied
    /// items of leaves written since (for other items' sake, such as a
    /// neighbour's): the record is rebuilt with this run's transaction,
    /// so the next search skips them.
    Searched {
        written: HashMap<u64, Option<cowlink_sys::FileId>>,
        refresh: bool,
    },
    /// No record, or one without a transaction: each file is `statx`ed,
    /// and a layout claim that would spare work is mapped again, so the
    /// rebuilt record is certified.
    Remap,
}

/// What [`FsIndex::unstated`] knows of one file.
pub(super) enum Unstated {
    /// Unchanged since its record's transaction: the identity its entry
    /// holds, and the entry (counted as unchanged).
    Unchanged(cowlink_sys::FileId, Entry),
    /// Written since (its times may be the same: a dedupe, an access):
    /// its identity now, from its inode item.
    Written(cowlink_sys::FileId),
    /// Its inode item unchanged since (so its identity and content, and
    /// an inline claim), but one of its file extent items lies in a
    /// leaf written since, which a balance's move of its extents would
    /// also do: a layout claim is mapped again.
    Relocatable(cowlink_sys::FileId, Entry),
}

/// The records a run met, and those decoded for its lookups.
#[derive(Default)]
struct State {
    /// Per directory inode met: the check of its record as the run found
    /// it (`None`: there was none, or it was damaged).
    met: HashMap<u64, Option<[u8; CHECK]>>,
    /// Per record decoded this run: its number of entries, the sum of
    /// their inodes' [`ino_mark`]s, and its path (see
    /// [`Indexes::stored_as`]).
    shape: HashMap<u64, (usize, u64, Box<[u8]>)>,
    /// Decoded records, each with when it was last used (a count of
    /// switches between records), and their entries in all.
    cache: HashMap<u64, (Arc<Record>, u64)>,
    /// The cached records by when they were last used, the least
    /// recently used first: eviction takes the first. A scan of the
    /// cache per record decoded costs a step per record cached, 8,192
    /// per directory once the cache is full of one-file directories.
    by_use: BTreeMap<u64, u64>,
    uses: u64,
    cached: usize,
    /// Per directory whose record is decoded: how its files are known
    /// (let go with the record).
    proofs: HashMap<u64, Arc<DirProof>>,
    /// Directories whose rebuilt record may be given this run's
    /// transaction ([`DirProof`]), and those where a claim was trusted
    /// unchecked (which may not).
    certified: HashSet<u64>,
    uncertified: HashSet<u64>,
}

impl State {
    /// Directory `dir`'s cached record, marked used now.
    fn touch(&mut self, dir: u64) -> Option<Arc<Record>> {
        let (r, used) = self.cache.get_mut(&dir)?;
        // Already the most recent (the walk's lookups come a directory
        // at a time): nothing moves.
        if *used != self.uses {
            self.by_use.remove(used);
            self.uses += 1;
            *used = self.uses;
            self.by_use.insert(self.uses, dir);
        }
        Some(r.clone())
    }

    /// Cache `rec`, directory `dir`'s record, as used now; let the least
    /// recently used go while the cache holds more than
    /// [`CACHED_ENTRIES`] entries, but never the [`KEPT_RECORDS`] most
    /// recent.
    fn keep(&mut self, dir: u64, rec: Arc<Record>) {
        self.uses += 1;
        self.cached += rec.files.len();
        if let Some((old, used)) = self.cache.insert(dir, (rec, self.uses)) {
            self.cached -= old.files.len();
            self.by_use.remove(&used);
        }
        self.by_use.insert(self.uses, dir);
        while self.cached > CACHED_ENTRIES && self.cache.len() > KEPT_RECORDS {
            let Some((_, old)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((r, _)) = self.cache.remove(&old) {
                self.cached -= r.files.len();
            }
            self.proofs.remove(&old);
        }
    }
}

impl FsIndex {
    /// The entry of the file `id` in the directory of inode `dir`, if its
    /// identity is `id`'s; counts it as unchanged.
    pub fn lookup(&self, dir: u64, id: &cowlink_sys::FileId) -> Option<Entry> {
        if self.broken.load(Ordering::Relaxed) {
            return None;
        }
        let rec = self.record(dir)?;
        let e = rec.get(id.ino)?;
        if !e.matches(id) {
            return None;
        }
        self.unchanged.fetch_add(1, Ordering::Relaxed);
        Some(e.clone())
    }

    /// [`DirProof::None`]: for a directory whose files are all to be
    /// `statx`ed.
    pub fn no_proof(&self) -> Arc<DirProof> {
        self.no_proof.clone()
    }

    /// How the files of directory `dir` (open as `dirfd`, on device
    /// `dev`) are known this run; found once per directory while its
    /// record stays cached.
    pub fn proof(&self, dir: u64, dirfd: BorrowedFd<'_>, dev: u64) -> Arc<DirProof> {
        // Off Btrfs, or not root: the one answer, without a lock.
        if self.since_now.is_none() {
            return self.no_proof.clone();
        }
        if let Some(p) = lock(&self.state).proofs.get(&dir) {
            return p.clone();
        }
        let p = Arc::new(self.find_proof(dir, dirfd, dev));
        let mut st = lock(&self.state);
        if !matches!(*p, DirProof::None) {
            st.certified.insert(dir);
        }
        // A search's answer is kept only while its record is (it holds
        // inodes); the others hold nothing and are kept for the walk.
        if st.cache.contains_key(&dir) || !matches!(*p, DirProof::Searched { .. }) {
            st.proofs.insert(dir, p.clone());
        }
        p
    }

    fn find_proof(&self, dir: u64, dirfd: BorrowedFd<'_>, dev: u64) -> DirProof {
        if self.since_now.is_none()
            || self.broken.load(Ordering::Relaxed)
            || self.unsearchable.load(Ordering::Relaxed)
        {
            return DirProof::None;
        }
        let Some(rec) = self.record(dir) else {
            return DirProof::Remap;
        };
        if rec.files.is_empty() {
            return DirProof::Remap;
        }
        // A transaction later than this run's: the filesystem went back
        // (an image or a block device snapshot put back, a same-UUID copy
        // mounted in its place) since the record was written, and the
        // inode items it holds may be older than the record yet not
        // what it learnt. Nothing is known by transaction there.
        if rec.since == 0
            || self.went_back
            || rec.since <= self.distrust
            || self.since_now.is_some_and(|t| rec.since > t)
        {
            return DirProof::Remap;
        }
        // A leaf changed since holds about a hundred items; ranges wider
        // than that per file are searched only while few changed in them.
        let mut most = rec.files.len().saturating_mul(32).saturating_add(1024);
        let mut written = HashMap::new();
        let mut refresh = false;
        for (lo, hi) in search_ranges(&rec.files) {
            match cowlink_sys::btrfs_inodes_changed_since(dirfd, dev, lo, hi, rec.since, most) {
                Ok(Some((changed, seen))) => {
                    written.extend(changed.into_iter().map(|c| (c.ino, c.id)));
                    refresh |= seen > 0;
                    most -= seen.min(most);
                }
                Ok(None) => return DirProof::None,
                Err(_) => {
                    self.unsearchable.store(true, Ordering::Relaxed);
                    return DirProof::None;
                }
            }
        }
        DirProof::Searched { written, refresh }
    }

    /// The layout claim of inode `ino`, mapped again, was found wrong
    /// (under one of its names).
    pub fn corrected(&self, ino: u64) {
        lock(&self.corrected).insert(ino);
    }

    /// What the index knows of the regular file (by its directory entry)
    /// of inode `ino` in directory `dir` without a `statx`, by `proof`.
    pub fn unstated(&self, dir: u64, dev: u64, ino: u64, proof: &DirProof) -> Option<Unstated> {
        let DirProof::Searched { written, .. } = proof else {
            return None;
        };
        // Its inode item was written since (`Some`), or only one of its
        // file extent items lies in a leaf written since (`None`).
        let listed = written.get(&ino);
        if let Some(Some(id)) = listed {
            return (cowlink_sys::file_type(id.mode) == rustix::fs::FileType::RegularFile)
                .then_some(Unstated::Written(*id));
        }
        let rec = self.record(dir)?;
        let e = rec.get(ino)?;
        // The bytes held alone come from the layout: without one the
        // file is mapped, and its blocks are taken from `statx`.
        if !e.mapped {
            return None;
        }
        self.unstated.fetch_add(1, Ordering::Relaxed);
        self.unchanged.fetch_add(1, Ordering::Relaxed);
        let id = cowlink_sys::FileId {
            dev,
            ino,
            mode: 0o100_600,
            uid: 0,
            size: e.size,
            blocks: e.exclusive.div_ceil(512),
            mtime_ns: e.mtime_ns,
            ctime_ns: e.ctime_ns,
            btime_ns: e.btime_ns,
        };
        // A file extent item in a leaf written since is what a balance
        // leaves, but also what any change to another item of that leaf
        // does: a layout claim is mapped again only where a relocation
        // ran since the record's transaction.
        Some(match listed {
            Some(None) if self.relocated_at > rec.since => Unstated::Relocatable(id, e.clone()),
            _ => Unstated::Unchanged(id, e.clone()),
        })
    }

    /// A layout claim of a file in directory `dir` was trusted without
    /// being mapped again or proven by transaction (a sampled recheck
    /// that did not pick it, or none asked for).
    pub fn uncertify(&self, dir: u64) {
        if self.since_now.is_some() {
            lock(&self.state).uncertified.insert(dir);
        }
    }

    /// The transaction a record rebuilt this run for directory `dir` is
    /// given: this run's where each of its files was known by
    /// [`DirProof`], read, or mapped again; else none.
    pub fn since_for(&self, dir: u64) -> u64 {
        let st = lock(&self.state);
        match self.since_now {
            Some(t) if st.certified.contains(&dir) && !st.uncertified.contains(&dir) => t,
            _ => 0,
        }
    }

    /// Directory `dir`'s record as the run began, decoded (once while it
    /// stays cached).
    fn record(&self, dir: u64) -> Option<Arc<Record>> {
        {
            let mut st = lock(&self.state);
            if let Some(r) = st.touch(dir) {
                return Some(r);
            }
            if let Some(None) = st.met.get(&dir) {
                return None;
            }
        }
        let read = self.read.read().unwrap_or_else(|e| e.into_inner());
        let table = read.as_ref()?;
        // redb trusts its pages: a damaged file can make it panic. That
        // is an index to rebuild, not a run to lose.
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // A read that fails (an I/O error) leaves no seal either.
            let v = table
                .get(dir)
                .map_err(|_| self.lock.sealable.store(false, Ordering::Relaxed));
            v.ok().flatten().map(|v| {
                let b = v.value();
                (tail(b), Record::decode(dir, b))
            })
        }));
        drop(read);
        // (The record's check, the record; whether it was damaged.)
        let (sum, rec, damaged) = match got {
            Ok(Some((sum, Some(rec)))) => (sum, Some(Arc::new(rec)), false),
            Ok(Some((_, None))) => (None, None, true),
            Ok(None) => (None, None, false),
            Err(_) => {
                self.broken.store(true, Ordering::Relaxed);
                return None;
            }
        };
        let mut st = lock(&self.state);
        if let std::collections::hash_map::Entry::Vacant(v) = st.met.entry(dir) {
            if damaged {
                self.damaged.fetch_add(1, Ordering::Relaxed);
            }
            v.insert(sum);
            if let Some(r) = &rec {
                let marks = r
                    .files
                    .iter()
                    .fold(0u64, |s, (ino, _)| s.wrapping_add(ino_mark(*ino)));
                st.shape.insert(
                    dir,
                    (r.files.len(), marks, r.path.clone().into_boxed_slice()),
                );
            }
        }
        let rec = rec?;
        if let Some(r) = st.touch(dir) {
            return Some(r);
        }
        // An empty record (a directory of subdirectories only) is not
        // kept: it spares no read, and the cache is bounded by the
        // entries it holds, which such records would not count.
        if !rec.files.is_empty() {
            st.keep(dir, rec.clone());
        }
        Some(rec)
    }

    /// The walk entered directory `dir`: its record is looked up now,
    /// whether or not a file of it is looked up later, so that the end of
    /// the walk knows a directory with no candidate as stored unchanged
    /// ([`Indexes::stored_as`]) instead of reading its record again to
    /// rebuild it (3,052 of 9,961 directories of three copies of
    /// `/usr/share`).
    pub fn entered(&self, dir: u64) {
        if !self.broken.load(Ordering::Relaxed) {
            let _ = self.record(dir);
        }
    }

    /// Whether records may be left of directories the run did not meet:
    /// the index held more when the run began than the run met.
    fn may_hold_others(&self) -> bool {
        let met = lock(&self.state)
            .met
            .values()
            .filter(|c| c.is_some())
            .count() as u64;
        self.held > met
    }
}

/// The indexes of one run, one per filesystem met, opened on first use.
pub(super) struct Indexes {
    dir: PathBuf,
    /// The directory's (device, inode), made if missing (`None`: it
    /// could not be made or examined): the walk leaves the index's own
    /// files alone ([`Indexes::own_file`]).
    dir_id: Option<(u64, u64)>,
    by_dev: RwLock<HashMap<u64, Option<Arc<FsIndex>>>>,
    notes: Mutex<Vec<String>>,
    written: AtomicU64,
    pruned: AtomicU64,
    /// Per device whose index another run holds: the file that tells
    /// its next opener this run shared behind it ([`Indexes::sharing`]).
    in_use: Mutex<HashMap<u64, PathBuf>>,
    /// What was learnt after the walk, written at the run's end
    /// ([`Indexes::finish`]).
    later: Mutex<Later>,
    /// Per device the walk entered: the Btrfs transaction committed
    /// before it looked at any file there ([`Indexes::entering`]).
    since: RwLock<HashMap<u64, Option<u64>>>,
    /// Devices [`Indexes::open_if_kept`] looked for a kept index of.
    probed: Mutex<HashSet<u64>>,
}

/// What a run learnt after its walk: the planning's updates
/// ([`Indexes::update`]) and the layouts after sharing
/// ([`Indexes::relayout`]).
#[derive(Default)]
struct Later {
    updates: Vec<Update>,
    relaid: Vec<Relaid>,
}

/// What pruning needs of a walk: the directories it met, as (device,
/// inode), and its roots (as the index records paths: absolute, links
/// and `..` resolved).
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    pub dirs: &'a HashSet<(u64, u64)>,
    pub roots: &'a [PathBuf],
    /// Directories there but not read whole (as recorded): what is held
    /// of them and below them is kept.
    pub kept: &'a [Vec<u8>],
}

/// Something learnt of a file after the walk: on device `dev`, in the
/// directory of inode `dir`, the file of inode `ino`, while it was the
/// file of `stamp` (its identity as the walk saw it, checked after the
/// reading). Applied only to an entry of that identity (see
/// [`Change::stamp`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Update {
    pub dev: u64,
    pub dir: u64,
    pub ino: u64,
    pub stamp: FileStamp,
    pub what: Learnt,
}

/// What was learnt.
#[derive(Debug, Clone, Copy)]
pub(super) enum Learnt {
    /// The layout facts: bytes held alone, the runs' fingerprint when
    /// all shared, inline; and the edges' hash where they were read with
    /// it.
    Layout {
        exclusive: u64,
        shared: Option<u64>,
        inline: bool,
        hash: Option<[u8; 32]>,
    },
    /// The planning hash.
    Hash([u8; 32]),
    /// The whole-file hash.
    Whole([u8; 32]),
}

impl Learnt {
    fn apply(&self, e: &mut Entry) {
        match *self {
            Learnt::Layout {
                exclusive,
                shared,
                inline,
                hash,
            } => {
                e.exclusive = exclusive;
                e.shared = shared;
                e.inline = inline;
                e.mapped = true;
                if hash.is_some() {
                    e.hash = hash;
                }
            }
            Learnt::Hash(h) => e.hash = Some(h),
            Learnt::Whole(h) => e.whole = Some(h),
        }
    }
}

/// A file shared whole with its group's source during the run: on
/// device `dev`, in the directory of inode `dir`, the file of inode
/// `ino` now shares every block, on runs of fingerprint `shared`. Only
/// made for a file whose stamp is still the one the walk saw (`stamp`,
/// the identity its entry holds): sharing moves no time. Less than half
/// an [`Update`]: a first run holds one per file it shared until it ends.
#[derive(Debug, Clone, Copy)]
pub(super) struct Relaid {
    pub dev: u64,
    pub dir: u64,
    pub ino: u64,
    pub stamp: FileStamp,
    pub shared: u64,
}

impl Relaid {
    /// `shared` of a file moved during the run whose layout after it is
    /// not known: the layout its entry holds is forgotten (a run's
    /// fingerprint of runs is never 0).
    pub const MOVED: u64 = 0;
}

/// The sources' check a run ends with ([`Indexes::finish_checked`]):
/// the fingerprints of the runs some source of the run was not found on
/// again when it ended.
pub(super) type NotFound<'a> = Box<dyn FnOnce() -> HashSet<u64> + Send + 'a>;

/// A [`NotFound`], asked at most once. A check that panicked (its
/// message printed by the panic hook) has found nothing: every layout
/// learnt while sharing is forgotten, not trusted unchecked.
struct Check<'a> {
    pending: Option<NotFound<'a>>,
    /// `Some(None)`: the check panicked.
    found: Option<Option<HashSet<u64>>>,
}

impl Check<'_> {
    /// The fingerprints not found (waits for the check the first time);
    /// `None` if it failed.
    fn not_found(&mut self) -> Option<&HashSet<u64>> {
        let pending = &mut self.pending;
        self.found
            .get_or_insert_with(|| match pending.take() {
                Some(f) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok(),
                None => Some(HashSet::new()),
            })
            .as_ref()
    }

    /// Whether what was learnt on runs `shared` is to be forgotten.
    fn gone(&mut self, shared: u64) -> bool {
        shared != Relaid::MOVED && self.not_found().is_none_or(|g| g.contains(&shared))
    }

    /// Of `relaid`, those learnt on runs not found, as forgotten
    /// ([`Relaid::MOVED`]), in the same order.
    fn corrections(&mut self, relaid: &[Relaid]) -> Vec<Relaid> {
        if self.not_found().is_some_and(HashSet::is_empty) {
            return Vec::new();
        }
        (relaid.iter())
            .filter(|r| self.gone(r.shared))
            .map(|r| Relaid {
                shared: Relaid::MOVED,
                ..*r
            })
            .collect()
    }

    /// Forget, in `relaid`, what was learnt on runs not found.
    fn correct(&mut self, relaid: &mut [Relaid]) {
        if self.not_found().is_some_and(HashSet::is_empty) {
            return;
        }
        for r in relaid.iter_mut() {
            if self.gone(r.shared) {
                r.shared = Relaid::MOVED;
            }
        }
    }
}

/// What [`Indexes::write`] applies to one entry of a record: an
/// [`Update`] or a [`Relaid`].
trait Change {
    /// Device, directory inode, file inode.
    fn key(&self) -> (u64, u64, u64);
    /// The identity of the file when this was learnt of it.
    ///
    /// A fact is applied only to an entry of that identity: an entry
    /// written for another (the file changed between the walk that
    /// wrote the entry and the reading that learnt the fact, or a file
    /// given as a root was walked again later) keeps what it has. So a
    /// fact never outlives a change of the file it describes: the file
    /// that changed no longer has the entry's identity, and an entry of
    /// the file as it is now is only ever given facts read from it.
    fn stamp(&self) -> FileStamp;
    fn apply(&self, e: &mut Entry);
}

/// Apply `u` to `e`, the entry of inode `ino` on device `dev`, if `e` is
/// of the identity `u` was learnt under ([`Change::stamp`]); whether `e`
/// changed.
fn apply_to<C: Change>(u: &C, dev: u64, ino: u64, e: &mut Entry) -> bool {
    if e.stamp(dev, ino) != u.stamp() {
        return false;
    }
    let was = e.clone();
    u.apply(e);
    *e != was
}

impl Change for Update {
    fn key(&self) -> (u64, u64, u64) {
        (self.dev, self.dir, self.ino)
    }
    fn stamp(&self) -> FileStamp {
        self.stamp
    }
    fn apply(&self, e: &mut Entry) {
        self.what.apply(e);
    }
}

impl Change for Relaid {
    fn key(&self) -> (u64, u64, u64) {
        (self.dev, self.dir, self.ino)
    }
    fn stamp(&self) -> FileStamp {
        self.stamp
    }
    fn apply(&self, e: &mut Entry) {
        if self.shared == Relaid::MOVED {
            // A claim that spares no work: the next run plans it as a
            // file holding its blocks alone (its hashes still hold: a
            // dedupe moves no byte).
            e.exclusive = e.size.max(1);
            e.shared = None;
            e.inline = false;
        } else {
            e.exclusive = 0;
            e.shared = Some(self.shared);
        }
        e.mapped = true;
    }
}

/// What was learnt after the walk of the files of one filesystem: the
/// planning's updates and the layouts after sharing, each sorted by
/// [`Change::key`].
#[derive(Clone, Copy, Default)]
struct Facts<'a> {
    updates: &'a [Update],
    relaid: &'a [Relaid],
}

impl<'a> Facts<'a> {
    /// Those of `updates` and `relaid` on device `dev`.
    fn of(updates: &'a [Update], relaid: &'a [Relaid], dev: u64) -> Facts<'a> {
        Facts {
            updates: of_key(updates, |k| k.0.cmp(&dev)),
            relaid: of_key(relaid, |k| k.0.cmp(&dev)),
        }
    }

    fn is_empty(&self) -> bool {
        self.updates.is_empty() && self.relaid.is_empty()
    }

    /// The directories they are about, in key order, once each.
    fn dirs(&self) -> Vec<u64> {
        let mut dirs: Vec<u64> = (self.updates.iter().map(|u| u.key().1))
            .chain(self.relaid.iter().map(|u| u.key().1))
            .collect();
        dirs.sort_unstable();
        dirs.dedup();
        dirs
    }

    /// Whether any is about directory `dir`.
    fn about(&self, dir: u64) -> bool {
        let at = |k: (u64, u64, u64)| k.1.cmp(&dir);
        !of_key(self.updates, at).is_empty() || !of_key(self.relaid, at).is_empty()
    }

    /// Apply those about directory `dir` to its record `rec`: the
    /// planning's first, then the layouts after sharing (which were
    /// learnt later, and win). The entries changed.
    fn apply(&self, dir: u64, rec: &mut Record) -> u64 {
        fn run<C: Change>(run: &[C], rec: &mut Record) -> u64 {
            let mut n = 0;
            for u in run {
                let (dev, _, ino) = u.key();
                if let Ok(i) = rec.files.binary_search_by_key(&ino, |(k, _)| *k) {
                    n += u64::from(apply_to(u, dev, ino, &mut rec.files[i].1));
                }
            }
            n
        }
        let at = |k: (u64, u64, u64)| k.1.cmp(&dir);
        run(of_key(self.updates, at), rec) + run(of_key(self.relaid, at), rec)
    }
}

/// Sort what was learnt after the walk by [`Change::key`], as
/// [`Facts::apply`] takes it. Not stable (a stable sort takes a buffer of
/// half the list, 3 MB of a first run's layouts over 148,716 files): the
/// layouts learnt after sharing are applied after every planning read,
/// and no two of one file disagree (the executor keeps only the last
/// group's, see `execute::last_group_wins`). Two planning reads of one
/// file's layout are of the same blocks: a file moved before the second
/// has a fact after sharing that replaces both.
fn in_key_order(updates: &mut [Update], relaid: &mut [Relaid]) {
    updates.sort_unstable_by_key(|u| u.key());
    relaid.sort_unstable_by_key(|u| u.key());
}

/// The run of `changes` (sorted by [`Change::key`]) whose keys `at` finds
/// equal.
fn of_key<C: Change>(changes: &[C], at: impl Fn((u64, u64, u64)) -> std::cmp::Ordering) -> &[C] {
    let lo = changes.partition_point(|u| at(u.key()).is_lt());
    let hi = changes.partition_point(|u| at(u.key()).is_le());
    &changes[lo..hi]
}

impl Indexes {
    /// Indexes kept under `dir` (created when first needed).
    pub fn new(dir: &Path) -> Indexes {
        // Made now, not when the walk first needs an index, so that a
        // directory inside the tree walked is known before the walk
        // reaches it. A failure is reported when an index is opened.
        let _ = std::fs::create_dir_all(dir);
        let dir_id = cowlink_sys::stat(dir).ok().map(|st| (st.st_dev, st.st_ino));
        Indexes {
            dir: dir.to_path_buf(),
            dir_id,
            by_dev: RwLock::default(),
            notes: Mutex::default(),
            written: AtomicU64::new(0),
            pruned: AtomicU64::new(0),
            in_use: Mutex::default(),
            later: Mutex::default(),
            since: RwLock::default(),
            probed: Mutex::default(),
        }
    }

    /// The directory the indexes are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `name`, in the directory of (device, inode) `dir()`, is one
    /// of the index's own files (a database, its lock, a rewrite's copy,
    /// the mark of a run that shared behind another's index). An index
    /// kept inside the tree being deduplicated is written while the run
    /// reads it: the walk leaves these alone, and only these (a user's
    /// own files beside them are walked).
    pub fn own_file(&self, dir: impl FnOnce() -> Option<(u64, u64)>, name: &[u8]) -> bool {
        // (The last byte first: this is asked of every name walked.)
        matches!(name.last(), Some(b'b' | b'k' | b'w' | b'd'))
            && [".redb", ".lock", ".redb.new", ".moved"]
                .iter()
                .any(|ext| name.ends_with(ext.as_bytes()))
            && self.dir_id.is_some()
            && dir() == self.dir_id
    }

    /// The walk opened a directory, `fd`, on device `dev`, and will look
    /// at its files next. The first time a device is met, on Btrfs, as
    /// root (a tree search needs it), the filesystem is synced and
    /// committed: the transaction's id is what the records
    /// rebuilt this run on `dev` are known unchanged since (see
    /// [`DirProof`]).
    pub fn entering(&self, dev: u64, fd: BorrowedFd<'_>) {
        if self
            .since
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&dev)
        {
            return;
        }
        let mut map = self.since.write().unwrap_or_else(|e| e.into_inner());
        map.entry(dev).or_insert_with(|| {
            let btrfs = crate::ground::fskind::FsKind::of_fd(fd)
                .is_ok_and(|k| k == crate::ground::fskind::FsKind::Btrfs);
            if !btrfs || !rustix::process::geteuid().is_root() {
                return None;
            }
            // Data not yet written back has not written its inode's item
            // (a write in the same tick as the last one leaves the times
            // as they were, and the size waits for the write-back): the
            // filesystem is synced, then committed again.
            cowlink_sys::sync_filesystem(fd).ok()?;
            cowlink_sys::btrfs_commit(fd).ok()
        });
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
        // A panic while it is opened is redb meeting a damage in pages a
        // seal let go unchecked (see `Seal`): the run goes on without it,
        // and leaves no seal, so the next run checks every page.
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.open(dev, fd)));
        let opened = match got {
            Ok(Ok(ix)) => Some(Arc::new(ix)),
            Ok(Err(note)) => {
                self.note(note);
                None
            }
            Err(_) => {
                self.note(format!(
                    "an index in {} could not be read (damaged); this run goes on without it, \
                     and the next one checks it whole",
                    crate::name::quoted(&self.dir)
                ));
                None
            }
        };
        map.insert(dev, opened.clone());
        opened
    }

    /// Open the index of device `dev` (`fd` open on a directory there)
    /// if one is kept already: a walk that meets no file of a filesystem
    /// (every file there removed, or emptied) still prunes what its index
    /// holds of them. None is made: a filesystem without files to index
    /// gets no index file. Asked once per device.
    pub fn open_if_kept(&self, dev: u64, fd: BorrowedFd<'_>) {
        let known = (self.by_dev.read())
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&dev);
        if known || !lock(&self.probed).insert(dev) {
            return;
        }
        if self.dir.join(format!("{}.redb", fs_key(dev, fd))).is_file() {
            let _ = self.of(dev, fd);
        }
    }

    /// The walk is over: let go of the snapshots it read (see
    /// [`FsIndex::read`]) and of the records decoded for it.
    pub fn walked(&self) {
        let map = self.by_dev.read().unwrap_or_else(|e| e.into_inner());
        let mut old = Vec::new();
        for ix in map.values().flatten() {
            *ix.read.write().unwrap_or_else(|e| e.into_inner()) = None;
            let mut st = lock(&ix.state);
            old.push((
                std::mem::take(&mut st.cache),
                std::mem::take(&mut st.by_use),
                std::mem::take(&mut st.proofs),
            ));
            st.cached = 0;
        }
        // Freed on a thread of its own, beside the serial work that
        // follows the walk: thousands of decoded records took 9-12 ms
        // to free, of an unchanged 480 ms rerun over 148,716 files.
        // (Where no thread can be made, they are freed here.)
        let _ = std::thread::Builder::new().spawn(move || drop(old));
    }

    /// End the run: write what was learnt after the walk
    /// ([`Indexes::update`], [`Indexes::relayout`]), remove [`SHARING`],
    /// and rewrite each index
    /// into a new file where its file is more than one and a half times
    /// what it holds and at least twice its size after its last rewrite
    /// (a first run writes every record, rewrites many of them after
    /// planning, and redb's copy-on-write pages and power-of-two
    /// allocations leave most of the file free or unused, which its own
    /// compaction does not give back). What the indexes did, in all.
    ///
    /// An index due for a rewrite before what was learnt is written
    /// takes it in its copy ([`rewrite`]): written in place first, it
    /// would rewrite most of a first run's records only for the copy to
    /// read them again.
    ///
    /// The second condition: redb grows its file by doubling, so even a
    /// file just rewritten is up to twice the pages it uses (17.4 MB for
    /// 9.3 MB of records over 154,608 files). Judged against its content
    /// alone, any run that wrote one record (one file changed, a watch's
    /// batch) would rewrite the whole index (about 0.3 s there). So a
    /// rewrite waits until the file has grown to twice what the last one
    /// left, which takes writing about the index's size again. Rewrites
    /// only when no one else holds the indexes.
    pub fn finish(self: Arc<Self>) -> IndexReport {
        self.finish_checked(None)
    }

    /// [`Indexes::finish`], with the layouts learnt while sharing
    /// ([`Indexes::relayout`]) handed over before their sources were
    /// mapped again: `check` maps them and gives the fingerprints of the
    /// runs some source was not found on (see `execute::Recheck`). A
    /// file learnt on such runs is forgotten instead (as
    /// [`Relaid::MOVED`]), in the same transaction as the rest, so the
    /// crash rules are those of [`Indexes::finish`]. A first run's
    /// rewrite copies the index while the sources are mapped, and takes
    /// the check's answer just before it commits.
    pub fn finish_checked(self: Arc<Self>, check: Option<NotFound<'_>>) -> IndexReport {
        let mut check = Check {
            pending: check,
            found: None,
        };
        let Later {
            mut updates,
            mut relaid,
        } = std::mem::take(&mut *lock(&self.later));
        in_key_order(&mut updates, &mut relaid);
        let me = match Arc::try_unwrap(self) {
            Ok(me) => me,
            Err(shared) => {
                check.correct(&mut relaid);
                shared.change(&updates, &relaid, None);
                shared.persist();
                return shared.report();
            }
        };
        {
            let map = me.by_dev.read().unwrap_or_else(|e| e.into_inner());
            for (&dev, ix) in map.iter() {
                let Some(ix) = ix else { continue };
                me.end(ix, &updates, &mut relaid, dev, &mut check);
            }
        }
        me.report()
    }

    /// [`Indexes::finish`] for the index `ix` of device `dev`: what was
    /// learnt of its files after the walk is among `updates` and
    /// `relaid` (both in key order), `check` the sources' check.
    fn end(
        &self,
        ix: &FsIndex,
        updates: &[Update],
        relaid: &mut [Relaid],
        dev: u64,
        check: &mut Check<'_>,
    ) {
        if self.drop_broken(ix) {
            return;
        }
        *ix.read.write().unwrap_or_else(|e| e.into_inner()) = None;
        let facts = Facts::of(updates, relaid, dev);
        if !facts.is_empty() && wasteful(ix) {
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut late = || check.corrections(facts.relaid);
                rewrite(ix, facts, ix.lazy.load(Ordering::Relaxed), &mut late)
            }));
            if let Ok(Ok(n)) = res {
                self.written.fetch_add(n, Ordering::Relaxed);
                ix.lazy.store(false, Ordering::Relaxed);
                return;
            }
            // Failed (no room, or a damage met reading every record): the
            // file is as the last commit left it, but it gets no seal.
            ix.lock.sealable.store(false, Ordering::Relaxed);
        }
        if !facts.is_empty() {
            check.correct(relaid);
            let facts = Facts::of(updates, relaid, dev);
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.write(ix, facts, None)
            }));
            self.wrote(ix, res);
        }
        self.persist_one(ix);
        // A run that wrote nothing leaves the file alone.
        if self.written.load(Ordering::Relaxed) + self.pruned.load(Ordering::Relaxed) == 0
            || ix.broken.load(Ordering::Relaxed)
        {
            return;
        }
        if wasteful(ix) {
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rewrite(ix, Facts::default(), false, &mut Vec::new)
            }));
            if !matches!(res, Ok(Ok(_))) {
                ix.lock.sealable.store(false, Ordering::Relaxed);
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

    /// Whether the record of directory `dir` on `dev`, as this run read
    /// it, holds the inodes of the files the walk met there (`met`: as
    /// many, the same sum of marks) under `path`: with every file met
    /// found unchanged in it, the record it would be rebuilt into is the
    /// one stored, and need not be built.
    ///
    /// Each name met counts; the record holds one entry per inode. Two
    /// names of one inode where a file was deleted give the count of the
    /// record, not its sum (the sum of keyed marks of a multiset of its
    /// inodes equals the record's only for the record's own set, but
    /// with odds of 2^-64 per directory).
    pub fn stored_as(&self, dev: u64, dir: u64, met: stages::Met, path: &[u8]) -> bool {
        let Some(ix) = self.opened(dev) else {
            return false;
        };
        let st = lock(&ix.state);
        st.shape.get(&dir).is_some_and(|(n, marks, p)| {
            *n == met.names as usize && *marks == met.marks && **p == *path
        })
    }

    /// The order to write new records of device `dev` in, by their
    /// directory's inode: key order into an index that held nothing when
    /// the run began (each leaf is filled and written once, where a
    /// scattered order, with redb's small write buffer, writes most
    /// leaves back and reads them again several times; the leaves it
    /// leaves half empty go in the rewrite a first run ends with), else
    /// scattered ([`scatter`]).
    pub fn write_order(&self, dev: u64) -> fn(u64) -> u64 {
        match self.opened(dev) {
            Some(ix) if ix.held == 0 => |k| k,
            _ => scatter,
        }
    }

    /// Let go of what [`Indexes::stored_as`] answers from.
    pub fn forget_stored(&self) {
        let map = self.by_dev.read().unwrap_or_else(|e| e.into_inner());
        for ix in map.values().flatten() {
            lock(&ix.state).shape = HashMap::new();
        }
    }

    /// Write the records of the directories walked on device `dev`, as
    /// `(directory inode, record)` (each record's entries sorted by
    /// inode), in one transaction. A record equal to the stored one is
    /// not written; entries the stored one had and the new one lacks
    /// (files gone) count as pruned.
    pub fn put_dirs(&self, dev: u64, recs: impl Iterator<Item = (u64, Record)>) {
        let Some(ix) = self.opened(dev) else { return };
        if self.drop_broken(&ix) {
            return;
        }
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            || -> Result<(), redb::Error> {
                let txn = ix.db.begin_write()?;
                let (mut written, mut pruned) = (0, 0);
                let mut changed = false;
                {
                    let mut t = txn.open_table(RECORDS)?;
                    let mut st = lock(&ix.state);
                    for (dir, rec) in recs {
                        let old = match st.met.get(&dir) {
                            Some(sum) => *sum,
                            // Not looked up in the walk (no file of its
                            // own): as stored, if whole.
                            None => {
                                let sum = t.get(dir)?.and_then(|v| {
                                    let b = v.value();
                                    let whole = checked(dir, b).is_some();
                                    if !whole {
                                        ix.damaged.fetch_add(1, Ordering::Relaxed);
                                    }
                                    tail(b).filter(|_| whole)
                                });
                                st.met.insert(dir, sum);
                                sum
                            }
                        };
                        let b = rec.encode(dir);
                        if old.is_some_and(|sum| b.ends_with(&sum)) {
                            continue;
                        }
                        // Rewritten only to note a later transaction
                        // (every entry as it was): not counted as written.
                        // (Read without decoding its entries: a change spread
                        // over a tree rewrites records of many more entries,
                        // 114,117 for 1,486 files replaced, whose decoding
                        // took a quarter of the write.)
                        let mut same = false;
                        if let Some(v) = t.get(dir)? {
                            let was = v.value();
                            // Checked already when the walk read it (its
                            // check is the one met), or now.
                            let body = match old.filter(|sum| was.ends_with(sum)) {
                                Some(_) => was.get(..was.len() - CHECK),
                                None => checked(dir, was),
                            };
                            if let Some(body) = body {
                                same = same_but_since(body, &b[..b.len() - CHECK]);
                                pruned += rec.lost_from(body).unwrap_or(0);
                            }
                        }
                        t.insert(dir, b.as_slice())?;
                        if !same {
                            written += rec.files.len() as u64;
                        }
                        changed = true;
                    }
                }
                if changed {
                    txn.commit()?;
                } else {
                    txn.abort()?;
                }
                self.written.fetch_add(written, Ordering::Relaxed);
                self.pruned.fetch_add(pruned, Ordering::Relaxed);
                Ok(())
            },
        ));
        self.wrote(&ix, res);
    }

    /// The outcome of a write to `ix`: a failure becomes a note, a panic
    /// (redb met a damage) removes the file.
    fn wrote(&self, ix: &FsIndex, res: std::thread::Result<Result<(), redb::Error>>) {
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                ix.lock.sealable.store(false, Ordering::Relaxed);
                self.note(format!(
                    "index {}: not updated: {e}",
                    crate::name::quoted(&ix.file)
                ))
            }
            Err(_) => {
                ix.lock.sealable.store(false, Ordering::Relaxed);
                ix.broken.store(true, Ordering::Relaxed);
                self.drop_broken(ix);
            }
        }
    }

    /// Keep `updates` for the records of their directories, written at
    /// the run's end with the layouts learnt while sharing
    /// ([`Indexes::finish`]: one transaction, or the rewrite a first run
    /// ends with, instead of one more rewrite of most of a first run's
    /// records), and now, on each device in `seen`, remove the records of
    /// directories under its roots that the walk did not meet.
    pub fn update(&self, updates: Vec<Update>, seen: Option<Seen<'_>>) {
        lock(&self.later).updates.extend(updates);
        self.change(&[], &[], seen);
    }

    /// Keep the layouts of the files a run shared whole (see
    /// [`Relaid`]), written at the run's end ([`Indexes::finish`]): a
    /// record is rewritten once however many of its files were shared
    /// (written in batches as they come, a first run's large records
    /// would be rewritten by most batches).
    pub fn relayout(&self, relaid: Vec<Relaid>) {
        lock(&self.later).relaid.extend(relaid);
    }

    /// Write `updates` and `relaid` (each sorted by [`Change::key`]) and
    /// prune as `seen` says: one transaction per filesystem.
    fn change(&self, updates: &[Update], relaid: &[Relaid], seen: Option<Seen<'_>>) {
        let mut devs: Vec<u64> = (updates.iter().map(|u| u.key().0))
            .chain(relaid.iter().map(|u| u.key().0))
            .collect();
        if let Some(seen) = seen {
            devs.extend(seen.dirs.iter().map(|&(d, _)| d));
        }
        devs.sort_unstable();
        devs.dedup();
        for dev in devs {
            let Some(ix) = self.opened(dev) else { continue };
            if self.drop_broken(&ix) {
                continue;
            }
            let facts = Facts::of(updates, relaid, dev);
            // Every record held was met: none can be of a directory gone,
            // and the scan (every record read) would be most of an
            // unchanged rerun's index work.
            let prune = seen.filter(|_| ix.may_hold_others());
            if facts.is_empty() && prune.is_none() {
                continue;
            }
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.write(&ix, facts, prune.map(|s| (s, dev)))
            }));
            self.wrote(&ix, res);
        }
    }

    /// Apply `facts` to the records of their directories in key order
    /// (records are replaced, not added, so the order leaves the leaves
    /// as full as any other, and each leaf is written once; in a
    /// scattered order most would be written back and read again), and
    /// prune.
    fn write(
        &self,
        ix: &FsIndex,
        facts: Facts<'_>,
        prune: Option<(Seen<'_>, u64)>,
    ) -> Result<(), redb::Error> {
        let txn = ix.db.begin_write()?;
        let mut changed = false;
        {
            let mut t = txn.open_table(RECORDS)?;
            for dir in facts.dirs() {
                let Some(mut rec) = t.get(dir)?.and_then(|v| Record::decode(dir, v.value())) else {
                    continue;
                };
                let n = facts.apply(dir, &mut rec);
                if n > 0 {
                    t.insert(dir, rec.encode(dir).as_slice())?;
                    self.written.fetch_add(n, Ordering::Relaxed);
                    changed = true;
                }
            }
            if let Some((seen, dev)) = prune {
                let under = |p: &[u8]| {
                    let p = Path::new(std::ffi::OsStr::from_bytes(p));
                    seen.roots.iter().any(|r| p.starts_with(r))
                        && !(seen.kept.iter())
                            .any(|k| p.starts_with(Path::new(std::ffi::OsStr::from_bytes(k))))
                };
                let mut gone = Vec::new();
                let mut files = 0;
                for row in t.iter()? {
                    let (k, v) = row?;
                    let dir = k.value();
                    if seen.dirs.contains(&(dev, dir)) {
                        continue;
                    }
                    // A damaged record goes too.
                    match Record::decode(dir, v.value()) {
                        Some(r) if !under(&r.path) => {}
                        Some(r) => {
                            files += r.files.len() as u64;
                            gone.push(dir);
                        }
                        None => gone.push(dir),
                    }
                }
                self.pruned.fetch_add(files, Ordering::Relaxed);
                changed |= !gone.is_empty();
                for dir in gone {
                    t.remove(dir)?;
                }
            }
        }
        if changed {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        Ok(())
    }

    /// Before the first file of device `dev` is shared in this run: set
    /// [`SHARING`] in its index, synced, so that a crash from here until
    /// [`Indexes::persist`] is seen by the next run. One `fdatasync` per
    /// filesystem per run that shares; threads sharing on `dev` wait for
    /// it. An index that cannot be marked is dropped (removed, rebuilt by
    /// the next run): it could be left claiming layouts that are gone.
    ///
    /// A run that found the index in use shares behind it: it leaves a
    /// file next to it instead ([`moved_mark`]), read by its next opener.
    pub fn sharing(&self, dev: u64) {
        let Some(ix) = self.opened(dev) else {
            let Some(mark) = lock(&self.in_use).remove(&dev) else {
                return;
            };
            let made = own_file(&mark).and_then(|f| {
                let dir = std::fs::File::open(&self.dir).map_err(|e| e.to_string())?;
                f.sync_all()
                    .and_then(|()| dir.sync_all())
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = made {
                self.note(format!(
                    "index in use: cannot leave {}: {e}; its layouts may be stale until mapped again",
                    crate::name::quoted(&mark)
                ));
            }
            return;
        };
        let mut marked = lock(&ix.sharing);
        if *marked || self.drop_broken(&ix) {
            return;
        }
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            || -> Result<(), redb::Error> {
                let txn = ix.db.begin_write()?;
                txn.open_table(META)?.insert(SHARING, [1u8].as_slice())?;
                txn.commit()?;
                Ok(())
            },
        ));
        *marked = true;
        ix.lazy.store(true, Ordering::Relaxed);
        if !matches!(res, Ok(Ok(()))) {
            ix.broken.store(true, Ordering::Relaxed);
            self.drop_broken(&ix);
        }
    }

    /// The run's end: remove [`SHARING`] from each index it set it in,
    /// in a commit of its own (after every layout learnt was written).
    fn persist(&self) {
        let map = self.by_dev.read().unwrap_or_else(|e| e.into_inner());
        for ix in map.values().flatten() {
            self.persist_one(ix);
        }
    }

    /// [`Indexes::persist`] for `ix`.
    fn persist_one(&self, ix: &FsIndex) {
        if !ix.lazy.swap(false, Ordering::Relaxed) || self.drop_broken(ix) {
            return;
        }
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            || -> Result<(), redb::Error> {
                let txn = ix.db.begin_write()?;
                txn.open_table(META)?.remove(SHARING)?;
                txn.commit()?;
                Ok(())
            },
        ));
        self.wrote(ix, res);
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
            r.unstated += ix.unstated.load(Ordering::Relaxed);
            r.verified += u64::from(ix.verified);
            r.corrected += lock(&ix.corrected).len() as u64;
            let damaged = ix.damaged.load(Ordering::Relaxed);
            if damaged > 0 {
                r.notes.push(format!(
                    "index {}: {damaged} damaged directory records dropped (their files were read again)",
                    crate::name::quoted(&ix.file)
                ));
            }
        }
        r.files.sort();
        r.files.dedup();
        r
    }
    fn open(&self, dev: u64, fd: BorrowedFd<'_>) -> Result<FsIndex, String> {
        let since_now = self
            .since
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
            .copied()
            .flatten();
        // On Btrfs, the subvolume's own UUID: its id (in the key) is
        // given again to a new one after it is deleted and the filesystem
        // mounted again.
        let subvol = since_now.and_then(|_| cowlink_sys::btrfs_subvol_uuid(fd).ok());
        // Read after the commit `entering` made, so a relocation before
        // this run is seen.
        let relocated_at = match since_now {
            Some(_) => cowlink_sys::btrfs_relocated_at(fd).unwrap_or(u64::MAX),
            None => 0,
        };
        let mut ix = self.open_keyed(dev, fs_key(dev, fd), true, since_now, subvol)?;
        ix.relocated_at = relocated_at;
        Ok(ix)
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
    fn open_keyed(
        &self,
        dev: u64,
        key: String,
        check: bool,
        since_now: Option<u64>,
        subvol: Option<[u8; 16]>,
    ) -> Result<FsIndex, String> {
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
        if !lock_soon(&lk) {
            let mut holder = String::new();
            let _ = (&lk).take(4096).read_to_string(&mut holder);
            // The holder's line (a run ending writes its seal instead).
            let holder = holder.lines().find(|l| l.starts_with("pid "));
            lock(&self.in_use).insert(dev, moved_mark(&file));
            return Err(format!(
                "index {} is in use by {}; this run goes on without it",
                shown(&file),
                holder.unwrap_or("another run")
            ));
        }
        // The seal the last run left, taken away: a run that does not
        // end cleanly leaves none.
        let mut was = String::new();
        let _ = (&lk).take(4096).read_to_string(&mut was);
        let seal = Seal::parse(&was).filter(|_| owned(&lk));
        let _ = lk.set_len(0);
        let _ = lk.rewind();
        let _ = writeln!(lk, "pid {} ({})", std::process::id(), command_line());
        // A rewrite's copy left by a run killed before its rename (see
        // [`rewrite`]): the old file is whole; the copy only holds space.
        // Under the lock, so no run is writing it.
        let _ = std::fs::remove_file(file.with_extension("redb.new"));
        let (db, checked, verified, at) = self.open_db(&file, seal)?;
        let ix_file = file.clone();
        if check {
            // The device the index was last opened on.
            match meta_u64(&db, "dev") {
                Some(d) if d == dev => {}
                Some(d) if mounted_with_key(d, &key) => {
                    drop(db);
                    drop(lk);
                    return self.open_keyed(
                        dev,
                        format!("{key}-dev-{dev:x}"),
                        false,
                        since_now,
                        subvol,
                    );
                }
                _ => set_meta(&db, "dev", &dev.to_le_bytes())
                    .map_err(|e| format!("index {}: {e}", shown(&file)))?,
            }
        }
        // The latest transaction a run of this index committed: one
        // later than this run's means the filesystem went back.
        let went_back = match since_now {
            Some(t) => {
                let seen = meta_u64(&db, "transid");
                if seen != Some(t) {
                    set_meta(&db, "transid", &t.to_le_bytes())
                        .map_err(|e| format!("index {}: {e}", shown(&file)))?;
                }
                // Another subvolume under the id (see `open`): its inode
                // items are of its own history.
                let was = meta(&db, "subvol").and_then(|v| <[u8; 16]>::try_from(v).ok());
                if let Some(u) = subvol.filter(|u| was != Some(*u)) {
                    set_meta(&db, "subvol", &u)
                        .map_err(|e| format!("index {}: {e}", shown(&file)))?;
                }
                let back = seen.is_some_and(|seen| seen > t)
                    || subvol.is_some_and(|u| was.is_some_and(|w| w != u));
                // Records this run does not walk keep a transaction of
                // the history undone: none up to the last one a run saw
                // is trusted again, in this run or any later one.
                let floor = meta_u64(&db, "distrust").unwrap_or(0);
                let floor = match seen {
                    Some(seen) if back && seen > floor => {
                        set_meta(&db, "distrust", &seen.to_le_bytes())
                            .map_err(|e| format!("index {}: {e}", shown(&file)))?;
                        seen
                    }
                    _ => floor,
                };
                (back, floor)
            }
            None => (false, 0),
        };
        let (went_back, distrust) = went_back;
        let mark = moved_mark(&file);
        let moved = cowlink_sys::lstat(&mark).is_ok();
        if moved || was_sharing(&db) {
            forget_layouts(&db).map_err(|e| format!("index {}: {e}", shown(&file)))?;
            if moved {
                let _ = std::fs::remove_file(&mark);
            }
        }
        let read = db
            .begin_read()
            .ok()
            .and_then(|t| t.open_table(RECORDS).ok());
        let held = read
            .as_ref()
            .map_or(u64::MAX, |r| r.len().unwrap_or(u64::MAX));
        Ok(FsIndex {
            file,
            db: Db(Some(db)),
            read: RwLock::new(read),
            held,
            verified,
            lock: IndexLock {
                file: lk,
                db: ix_file,
                at: Mutex::new(at),
                checked,
                sealable: AtomicBool::new(true),
            },
            damaged: AtomicU64::new(0),
            unchanged: AtomicU64::new(0),
            unstated: AtomicU64::new(0),
            corrected: Mutex::default(),
            state: Mutex::default(),
            broken: Default::default(),
            lazy: Default::default(),
            sharing: Mutex::default(),
            since_now,
            unsearchable: Default::default(),
            no_proof: Arc::new(DirProof::None),
            relocated_at: u64::MAX,
            went_back,
            distrust,
        })
    }

    /// Open (or create) the database at `file`, rebuilding it when it is
    /// damaged or of another format.
    /// Also returned: when its pages were last all checked, and whether
    /// that was now.
    /// (And the file opened, by device and inode.)
    fn open_db(&self, file: &Path, seal: Option<Seal>) -> Result<Opened, String> {
        let shown = crate::name::quoted(file).to_string();
        let builder = || {
            let mut b = Database::builder();
            b.set_cache_size(DB_CACHE);
            b
        };
        // Opened by this process, never through a link: the directory
        // may be writable by others, and redb would fill an empty file a
        // symlink points at.
        let own = own_file(file).map_err(|e| format!("index {shown}: {e}; going on without it"))?;
        // Every page's checksum, once per run: redb trusts its pages once
        // open (a damaged one can make it panic), and this is the one
        // check that reads them all; unless the file is as a run that
        // ended cleanly left it, checked within a day (see `Seal`).
        let now = unix_now();
        let at = file_at(&own);
        let sealed = seal.filter(|s| own.metadata().is_ok_and(|m| s.holds(&m, now)));
        let checked = sealed.map_or(now, |s| s.checked);
        let opened = std::panic::catch_unwind(move || {
            let mut db = builder().create_file(own)?;
            if sealed.is_some() {
                return Ok(db);
            }
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
        // No room (a full filesystem: redb's open overwrites its header,
        // which needs a new block where the file's blocks are shared with
        // a reflinked copy), a quota or a read-only mount says nothing of
        // the file: it is kept for a run that can write it, and this one
        // goes on without it. Removed, everything it held would be read
        // again, and a full filesystem could not even hold a new one.
        let kept = |e: &dyn std::fmt::Display| {
            format!("index {shown}: {e}; going on without it (the index is kept)")
        };
        let why = match opened {
            Ok(db) => match format_of(&db) {
                Ok(Some(FORMAT)) => return Ok((db, checked, sealed.is_none(), at)),
                Ok(None) => {
                    write_format(&db).map_err(|e| format!("index {shown}: {e}"))?;
                    return Ok((db, checked, sealed.is_none(), at));
                }
                Ok(Some(other)) => format!("is of format {other}, this version uses {FORMAT}"),
                Err(redb::Error::Io(e)) if no_room(&e) => return Err(kept(&e)),
                Err(e) => format!("cannot be read ({e})"),
            },
            Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))) if no_room(&e) => {
                return Err(kept(&e))
            }
            Err(e) => format!("cannot be read ({e})"),
        };
        self.note(format!(
            "index {shown} {why}: rebuilt (every file is read again)"
        ));
        std::fs::remove_file(file).map_err(|e| format!("index {shown}: cannot remove: {e}"))?;
        let own = own_file(file).map_err(|e| format!("index {shown}: {e}; going on without it"))?;
        let at = file_at(&own);
        let db = builder()
            .create_file(own)
            .map_err(|e| format!("index {shown}: {e}"))?;
        write_format(&db).map_err(|e| format!("index {shown}: {e}"))?;
        Ok((db, now, true, at))
    }
}

/// An opened database: the database, when its pages were last all
/// checked, whether that was now, and the file by device and inode.
type Opened = (Database, u64, bool, (u64, u64));

/// A file's device and inode (zeros where it cannot be read: then no
/// file at the path matches it).
fn file_at(f: &std::fs::File) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    f.metadata().map_or((0, 0), |m| (m.dev(), m.ino()))
}

/// Seconds since the epoch (0 for a clock before it).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether `f` belongs to the user running (a file another user made in a
/// shared index directory is not trusted to say anything).
fn owned(f: &std::fs::File) -> bool {
    f.metadata().is_ok_and(|m| own_only(&m))
}

/// Whether `m` is a file of the user running that no group or other user
/// may write (an index made before its files were created 0600 can be).
fn own_only(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    m.uid() == rustix::process::geteuid().as_raw() && m.mode() & 0o022 == 0
}

/// How long a database's pages, all checked once, are trusted unchecked
/// while the file stays as sealed: a damage that moves no time (a
/// disk's) is found within this.
const SEAL_FOR_SECS: u64 = 24 * 60 * 60;

/// What a run that ended cleanly wrote into the lock file after closing
/// and syncing the database: the file as it left it (by device, inode,
/// size, mtime and ctime), and when its pages were last all checked
/// (seconds since the epoch). See the module's notes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seal {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    checked: u64,
}

impl Seal {
    fn of(m: &std::fs::Metadata, checked: u64) -> Seal {
        use std::os::unix::fs::MetadataExt;
        Seal {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: cowlink_sys::time_ns(m.mtime(), m.mtime_nsec() as u64),
            ctime_ns: cowlink_sys::time_ns(m.ctime(), m.ctime_nsec() as u64),
            checked,
        }
    }

    /// Its line in the lock file.
    fn line(&self) -> String {
        format!(
            "sealed {} {} {} {} {} {}",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns, self.checked
        )
    }

    /// The seal the lock file's text is, if it is one whole: its one
    /// line (a run writes nothing else there; a holder's line, which
    /// carries a command line, is never read as one).
    fn parse(text: &str) -> Option<Seal> {
        let line = text.strip_suffix('\n')?;
        if line.contains('\n') {
            return None;
        }
        let line = line.strip_prefix("sealed ")?;
        let words: Vec<&str> = line.split(' ').collect();
        let [dev, ino, size, mtime_ns, ctime_ns, checked] = words.as_slice() else {
            return None;
        };
        Some(Seal {
            dev: dev.parse().ok()?,
            ino: ino.parse().ok()?,
            size: size.parse().ok()?,
            mtime_ns: mtime_ns.parse().ok()?,
            ctime_ns: ctime_ns.parse().ok()?,
            checked: checked.parse().ok()?,
        })
    }

    /// Whether the database `m` is the file sealed, owned by the user
    /// running, with its pages checked less than [`SEAL_FOR_SECS`]
    /// before `now`.
    fn holds(&self, m: &std::fs::Metadata, now: u64) -> bool {
        // (A clock before the epoch reads 0: never a time to trust by.)
        own_only(m)
            && Seal::of(m, self.checked) == *self
            && self.checked > 0
            && now >= self.checked
            && now - self.checked < SEAL_FOR_SECS
    }
}

/// An index's lock file, held (`flock`ed) for a run. Let go after the
/// database is closed: then, unless a write failed, the run panicked or
/// met a damage, or the database is gone or another file now, the
/// database is synced and its [`Seal`] written over the holder's line.
struct IndexLock {
    file: std::fs::File,
    /// The database's path.
    db: PathBuf,
    /// The database the run opened (or renamed into place), by device
    /// and inode: a file put at the path meanwhile is not sealed.
    at: Mutex<(u64, u64)>,
    /// When its pages were last all checked.
    checked: u64,
    /// No write of this run failed.
    sealable: AtomicBool,
}

impl IndexLock {
    /// The database is the file `m` describes now (a rewrite renamed it
    /// into place).
    fn now_at(&self, m: &std::fs::Metadata) {
        use std::os::unix::fs::MetadataExt;
        *lock(&self.at) = (m.dev(), m.ino());
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        if std::thread::panicking() || !self.sealable.load(Ordering::Relaxed) {
            return;
        }
        let seal = (|| {
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc_flags::NOFOLLOW | libc_flags::NONBLOCK)
                .open(&self.db)
                .ok()?;
            let m = f.metadata().ok()?;
            {
                use std::os::unix::fs::MetadataExt;
                if !m.file_type().is_file() || *lock(&self.at) != (m.dev(), m.ino()) {
                    return None;
                }
            }
            // Durable before it is vouched for: a crash must not leave a
            // seal over pages that never reached the disk.
            f.sync_all().ok()?;
            Some(Seal::of(&f.metadata().ok()?, self.checked))
        })();
        if let Some(seal) = seal {
            let _ = self.file.set_len(0);
            let _ = self.file.rewind();
            let _ = writeln!(self.file, "{}", seal.line());
        }
    }
}

/// Whether an index file of `size` bytes holding `used` bytes, `compacted`
/// bytes after its last rewrite (if any), is rewritten ([`Indexes::finish`]):
/// over one and a half times what it holds (and a megabyte), and at least
/// twice what its last rewrite left.
fn bloated(size: u64, used: u64, compacted: Option<u64>) -> bool {
    size > used.saturating_add(used / 2).saturating_add(1 << 20)
        && compacted.is_none_or(|c| size >= c.saturating_mul(2))
}

/// Whether `e` is the filesystem refusing a write (no space, a quota, a
/// read-only mount), not a damage of the file being written.
fn no_room(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::NOSPC, Errno::DQUOT, Errno::ROFS]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// Whether `ix`'s file is due for a rewrite ([`bloated`]).
fn wasteful(ix: &FsIndex) -> bool {
    // Reads every page's header (redb's statistics): a damage there is
    // the file's, not the run's.
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wasteful_as_read(ix)));
    got.unwrap_or_else(|_| {
        ix.lock.sealable.store(false, Ordering::Relaxed);
        ix.broken.store(true, Ordering::Relaxed);
        false
    })
}

/// [`wasteful`], read.
fn wasteful_as_read(ix: &FsIndex) -> bool {
    (|| -> Result<bool, redb::Error> {
        let txn = ix.db.begin_write()?;
        let st = txn.stats()?;
        let compacted = txn
            .open_table(META)?
            .get(COMPACTED)?
            .and_then(|v| Some(u64::from_le_bytes(v.value().try_into().ok()?)));
        txn.abort()?;
        let used = st.stored_bytes() + st.metadata_bytes();
        let size = std::fs::metadata(&ix.file).map_or(0, |m| m.len());
        Ok(bloated(size, used, compacted))
    })()
    .unwrap_or(false)
}

/// Copy `ix`'s database into `<file>.new`, its records in a scattered
/// order ([`scatter`]: redb splits a full leaf in half, so records put in
/// key order leave every leaf half empty, and a large record among small
/// ones strands more), then rename it over the old file: atomic, so a
/// crash leaves the old file or the new one, whole (a `.new` left over
/// is removed when the index is next opened; a forced exit at a second
/// Ctrl-C removes it, see `Unfinished`). The lock is held
/// throughout; the old file is let go by the caller.
///
/// `facts` are applied to the records on the way, as [`Indexes::write`]
/// would, then the corrections `late` gives (asked for once, just before
/// the commit: see [`Indexes::finish_checked`]); with `done_sharing` ([`SHARING`] was set by this run, and
/// `facts` hold all it learnt while sharing),
/// [`SHARING`] is left out of the copy: the layouts and the mark's
/// removal land together. On an error nothing changed: the old file
/// holds what it held. The entries changed.
fn rewrite(
    ix: &FsIndex,
    facts: Facts<'_>,
    done_sharing: bool,
    late: &mut dyn FnMut() -> Vec<Relaid>,
) -> Result<u64, String> {
    let (file, db) = (&ix.file, &ix.db);
    let tmp = file.with_extension("redb.new");
    let _ = std::fs::remove_file(&tmp);
    // A forced exit (a second Ctrl-C) while it is written removes it.
    let _unfinished = crate::prim::place::Unfinished::register(&tmp);
    let mut changed = 0;
    let copied = (|| -> Result<(), String> {
        let own = own_file(&tmp)?;
        let mut b = Database::builder();
        b.set_cache_size(DB_CACHE);
        let mut new = b.create_file(own).map_err(|e| e.to_string())?;
        (|| -> Result<(), redb::Error> {
            let r = db.begin_read()?;
            let w = new.begin_write()?;
            {
                let from = r.open_table(META)?;
                let mut to = w.open_table(META)?;
                for row in from.iter()? {
                    let (k, v) = row?;
                    if done_sharing && k.value() == SHARING {
                        continue;
                    }
                    to.insert(k.value(), v.value())?;
                }
                let from = r.open_table(RECORDS)?;
                let mut to = w.open_table(RECORDS)?;
                let mut keys = Vec::with_capacity(from.len()? as usize);
                for row in from.iter()? {
                    keys.push(row?.0.value());
                }
                keys.sort_unstable_by_key(|&k| scatter(k));
                for k in keys {
                    let Some(v) = from.get(k)? else { continue };
                    let mut rec = match facts.about(k) {
                        true => Record::decode(k, v.value()),
                        false => None,
                    };
                    let n = rec.as_mut().map_or(0, |rec| facts.apply(k, rec));
                    match rec {
                        Some(rec) if n > 0 => to.insert(k, rec.encode(k).as_slice())?,
                        _ => to.insert(k, v.value())?,
                    };
                    changed += n;
                }
                // Files learnt on runs their source was not found on
                // again: forgotten, in the same commit.
                let late = late();
                let late = Facts {
                    updates: &[],
                    relaid: &late,
                };
                for dir in late.dirs() {
                    let Some(mut rec) = to.get(dir)?.and_then(|v| Record::decode(dir, v.value()))
                    else {
                        continue;
                    };
                    if late.apply(dir, &mut rec) > 0 {
                        to.insert(dir, rec.encode(dir).as_slice())?;
                    }
                }
            }
            w.commit()?;
            Ok(())
        })()
        .map_err(|e| e.to_string())?;
        // redb grows its file by regions and gives the slack back only
        // over several commits: its compaction makes them.
        // Each call moves what it can; repeated until it moves nothing
        // (bounded), or the file's size varied from one run to the next
        // (25.8 or 34.2 MB over 184,092 files).
        for _ in 0..8 {
            if !new.compact().map_err(|e| e.to_string())? {
                break;
            }
        }
        // The size it was left at, for the next run's decision (a small
        // commit, within the space compaction left).
        let size = std::fs::metadata(&tmp).map_err(|e| e.to_string())?.len();
        (|| -> Result<(), redb::Error> {
            let w = new.begin_write()?;
            w.open_table(META)?
                .insert(COMPACTED, size.to_le_bytes().as_slice())?;
            w.commit()?;
            Ok(())
        })()
        .map_err(|e| e.to_string())?;
        drop(new);
        let now = std::fs::metadata(&tmp).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, file).map_err(|e| e.to_string())?;
        // The file the run leaves, and seals, is the copy now.
        ix.lock.now_at(&now);
        if let Some(dir) = file.parent() {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    copied.map(|()| changed)
}

/// A key's place in a scattered order (the splitmix64 finalizer): the
/// order records are written in, so that a run's writes spread over the
/// B-tree's leaves instead of filling each in turn and leaving it half
/// empty.
pub(super) fn scatter(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

/// The bytes of meta key `key` (`None` when absent or unreadable).
fn meta(db: &Database, key: &str) -> Option<Vec<u8>> {
    let txn = db.begin_read().ok()?;
    let t = txn.open_table(META).ok()?;
    let v = t.get(key).ok()??;
    Some(v.value().to_vec())
}

/// Meta key `key` as a number (little endian).
fn meta_u64(db: &Database, key: &str) -> Option<u64> {
    Some(u64::from_le_bytes(
        <[u8; 8]>::try_from(meta(db, key)?).ok()?,
    ))
}

/// Set meta key `key` to `value`, in a commit of its own.
fn set_meta(db: &Database, key: &str, value: &[u8]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(META)?.insert(key, value)?;
    txn.commit()?;
    Ok(())
}

/// The file a run leaves next to the index `file` it found in use before
/// it shares files of its filesystem: it moved blocks behind the index,
/// whose entries keep their identities, so the next run to open the
/// index forgets its layouts ([`forget_layouts`]) and removes the file.
fn moved_mark(file: &Path) -> PathBuf {
    file.with_extension("moved")
}

/// Whether the last run that shared files of this index's filesystem
/// stopped before its end ([`SHARING`]).
fn was_sharing(db: &Database) -> bool {
    let Ok(txn) = db.begin_read() else {
        return false;
    };
    let Ok(t) = txn.open_table(META) else {
        return false;
    };
    t.get(SHARING).is_ok_and(|v| v.is_some())
}

/// After a run stopped while sharing: every entry's layout is forgotten
/// (identity and hashes kept), so each file is mapped again (one
/// FIEMAP, no byte read) before its layout is trusted, and [`SHARING`]
/// is removed, in one synced commit. A damaged record is left for the
/// walk to drop.
fn forget_layouts(db: &Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(RECORDS)?;
        let mut rewritten = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            let dir = k.value();
            let Some(mut rec) = Record::decode(dir, v.value()) else {
                continue;
            };
            for (_, e) in &mut rec.files {
                e.mapped = false;
                e.exclusive = 0;
                e.shared = None;
                e.inline = false;
            }
            rewritten.push((dir, rec.encode(dir)));
        }
        for (dir, bytes) in rewritten {
            t.insert(dir, bytes.as_slice())?;
        }
        txn.open_table(META)?.remove(SHARING)?;
    }
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
        drop(txn.open_table(RECORDS)?);
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
    // `args_os`: `args` panics on an argument that is not UTF-8 (a path
    // may be any bytes); shown lossily, as it is only for people.
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Read-only statistics of an index file, for tests and benchmarks:
/// file entries (in all records) and the database's size in bytes.
pub fn stats(file: &Path) -> Result<(u64, u64), String> {
    let db = Database::open(file).map_err(|e| e.to_string())?;
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let table = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
    let mut n = 0;
    for row in table.iter().map_err(|e| e.to_string())? {
        let (k, v) = row.map_err(|e| e.to_string())?;
        let rec = Record::decode(k.value(), v.value())
            .ok_or_else(|| format!("the record of directory {} is damaged", k.value()))?;
        n += rec.files.len() as u64;
    }
    let size = std::fs::metadata(file).map_err(|e| e.to_string())?.len();
    Ok((n, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Entry {
        Entry {
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
        }
    }

    /// Reading a stored record's inodes without decoding its entries
    /// counts exactly the entries a new record lacks, and the bytes'
    /// comparison says what comparing the decoded records says: over
    /// random pairs of records, entries of every shape, with and without
    /// shared inodes and a new transaction.
    #[test]
    fn records_compared_undecoded_agree_with_decoded() {
        let mut x = 7u64;
        let mut next = move || {
            x = super::super::mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
            x
        };
        let entry = |next: &mut dyn FnMut() -> u64| {
            let f = next();
            let mapped = f & 8 != 0;
            Entry {
                size: next() >> (next() % 64),
                mtime_ns: next() as i64 >> (next() % 64),
                ctime_ns: next() as i64 >> (next() % 64),
                btime_ns: (f & 1 != 0).then(|| next() as i64 >> 8),
                exclusive: if mapped { next() >> (next() % 64) } else { 0 },
                shared: (f & 2 != 0).then(&mut *next),
                inline: f & 4 != 0,
                mapped,
                hash: (f & 16 != 0).then_some([f as u8; 32]),
                whole: (f & 32 != 0).then_some([(f >> 8) as u8; 32]),
            }
        };
        let (mut equal, mut lost_some) = (0, 0);
        for round in 0..400 {
            let n = (next() % 12) as usize;
            let mut inos: Vec<u64> = (0..n).map(|_| 100 + next() % 40).collect();
            inos.sort();
            inos.dedup();
            let a = Record {
                path: b"/t/d".to_vec(),
                since: next() % 3,
                files: inos.iter().map(|&i| (i, entry(&mut next))).collect(),
            };
            // The new record: the old one, some entries dropped, changed
            // or added, or as it was (maybe a new transaction, path).
            let mut b = Record {
                path: a.path.clone(),
                since: a.since,
                files: a.files.clone(),
            };
            match next() % 4 {
                0 => {}
                1 => b.since += 1,
                2 => b.path = b"/t/e".to_vec(),
                _ => {
                    b.files.retain(|_| next() % 3 != 0);
                    for (_, e) in b.files.iter_mut() {
                        if next() % 4 == 0 {
                            *e = entry(&mut next);
                        }
                    }
                    let more = 100 + next() % 40;
                    if b.get(more).is_none() && next() % 2 == 0 {
                        b.files.push((more, entry(&mut next)));
                        b.files.sort_by_key(|(i, _)| *i);
                    }
                }
            }
            let (ea, eb) = (a.encode(5), b.encode(5));
            let body_a = checked(5, &ea).unwrap();
            let body_b = &eb[..eb.len() - CHECK];
            let lost = a.files.iter().filter(|(i, _)| b.get(*i).is_none()).count() as u64;
            assert_eq!(b.lost_from(body_a), Some(lost), "round {round}");
            let same = a.path == b.path && a.files == b.files;
            assert_eq!(same_but_since(body_a, body_b), same, "round {round}");
            equal += u64::from(same);
            lost_some += u64::from(lost > 0);
            // Cut short or grown, the stored bytes do not read whole.
            if !body_a.is_empty() {
                let cut = (next() as usize) % body_a.len();
                let mut longer = body_a.to_vec();
                longer.push(0);
                assert_eq!(b.lost_from(&longer), None, "round {round}");
                if let Some(got) = b.lost_from(&body_a[..cut]) {
                    panic!("round {round}: {cut} bytes read whole as {got}");
                }
            }
        }
        assert!(
            equal > 50 && lost_some > 50,
            "{equal} equal, {lost_some} lost some"
        );
    }

    /// A seal reads back as written, and text that is not one whole
    /// (cut short, a word too many, not numbers, beside another line) is
    /// none.
    #[test]
    fn a_seal_reads_back_and_nothing_else_passes_for_one() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x = super::super::mix64(x.wrapping_add(1));
            x
        };
        for _ in 0..500 {
            let s = Seal {
                dev: next(),
                ino: next(),
                size: next() >> (next() % 64),
                mtime_ns: next() as i64,
                ctime_ns: next() as i64,
                checked: next() >> 20,
            };
            let line = s.line();
            assert_eq!(Seal::parse(&format!("{line}\n")), Some(s));
            // Only as the file's one line: not after a holder's line (a
            // command line can hold a newline), nor without its end.
            assert_eq!(Seal::parse(&format!("pid 1 (x)\n{line}\n")), None);
            assert_eq!(Seal::parse(&format!("{line}\npid 1 (x)\n")), None);
            assert_eq!(Seal::parse(&line), None);
            let cut = (next() as usize) % line.len();
            let short = &line[..cut];
            if let Some(got) = Seal::parse(&format!("{short}\n")) {
                // Cut inside the last number only: another number, never
                // a seal of other words.
                assert_eq!((got.dev, got.ino, got.size), (s.dev, s.ino, s.size));
            }
            assert_eq!(Seal::parse(&format!("{line} 7\n")), None);
            assert_eq!(Seal::parse(&format!("{}\n", line.replace(' ', "  "))), None);
            assert_eq!(
                Seal::parse(&format!("{}\n", line.replacen("sealed", "seal", 1))),
                None
            );
        }
        assert_eq!(Seal::parse("sealed 1 2 3 4 5 x\n"), None);
        assert_eq!(Seal::parse("sealed 1 2 3 4 5 -6\n"), None);
        assert_eq!(Seal::parse(""), None);
    }

    #[test]
    fn records_read_back_and_a_changed_byte_is_refused() {
        let rec = Record {
            path: b"/a/caf\xe9".to_vec(),
            since: 0,
            files: vec![
                (3, full()),
                (
                    4,
                    Entry {
                        size: 1,
                        ..Entry::default()
                    },
                ),
                (u64::MAX, full()),
            ],
        };
        let b = rec.encode(77);
        assert_eq!(Record::decode(77, &b), Some(rec.clone()));
        assert_eq!(Record::decode(78, &b), None, "another directory's record");
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert_eq!(Record::decode(77, &bad), None, "byte {i} flipped");
        }
        assert_eq!(Record::decode(77, &b[..b.len() - 1]), None);
        assert_eq!(Record::decode(77, &[]), None);
        let empty = Record {
            path: b"/".to_vec(),
            since: 0,
            files: Vec::new(),
        };
        assert_eq!(Record::decode(5, &empty.encode(5)), Some(empty));
        assert_eq!(rec.get(4).map(|e| e.size), Some(1));
        assert_eq!(rec.get(5), None);
    }

    /// Times are coded as differences from the entry before: any times,
    /// one after another (far apart, either way, at the ends of the
    /// range), read back as they were; close ones take little room.
    #[test]
    fn times_coded_against_the_entry_before_read_back_whatever_they_are() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let edges = [i64::MIN, i64::MAX, 0, -1, 1, i64::MIN + 1, i64::MAX - 1];
        for round in 0..200 {
            let n = 1 + (next() % 40) as usize;
            let mut files = Vec::with_capacity(n);
            let time = |r: u64, x: u64| match r % 3 {
                0 => edges[(x % edges.len() as u64) as usize],
                1 => 1_700_000_000_000_000_000 + (x % 1_000_000) as i64,
                _ => x as i64,
            };
            for i in 0..n {
                let e = Entry {
                    size: next() % 100_000,
                    mtime_ns: time(next(), next()),
                    ctime_ns: time(next(), next()),
                    btime_ns: (next() % 2 == 0).then(|| time(next(), next())),
                    ..full()
                };
                files.push((i as u64 * 3 + 1, e));
            }
            let rec = Record {
                path: b"/d".to_vec(),
                since: 0,
                files,
            };
            assert_eq!(
                Record::decode(9, &rec.encode(9)),
                Some(rec),
                "round {round}"
            );
        }
        // Files made together: a few bytes of time each, not sixteen.
        let close = |i: u64| Entry {
            size: 10,
            mtime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 1_764_000_000_000_000_000 + i as i64 * 20_000,
            ..Entry::default()
        };
        let rec = |n: u64| Record {
            path: b"/d".to_vec(),
            since: 0,
            files: (1..=n).map(|i| (i, close(i))).collect(),
        };
        let per_entry = (rec(101).encode(1).len() - rec(1).encode(1).len()) / 100;
        assert!(per_entry <= 8, "{per_entry} bytes an entry");
    }

    /// A body whose check holds but whose fields do not read whole (a
    /// format this code did not write) is refused, not half-read.
    #[test]
    fn a_record_that_does_not_read_whole_is_refused() {
        let body = |v: Vec<u8>| {
            let mut b = v.clone();
            b.extend_from_slice(&check(9, &v));
            b
        };
        // A count far beyond the bytes.
        assert_eq!(
            Record::decode(9, &body(vec![1, b'/', 0xff, 0xff, 0x03])),
            None
        );
        // A varint of eleven bytes.
        assert_eq!(Record::decode(9, &body(vec![0x80; 11])), None);
        // Bytes left over.
        let mut v = Record::default().encode(9);
        v.truncate(v.len() - CHECK);
        v.push(0);
        assert_eq!(Record::decode(9, &body(v)), None);
    }

    /// Generated records, then their bytes changed (bytes flipped, cut,
    /// inserted, counts and lengths set huge) with the check made to
    /// agree, as a crafted index would: decoding never panics, never
    /// takes more entries than the bytes could hold, and what it takes
    /// reads back to the same bytes' meaning (inodes strictly rising).
    #[test]
    fn crafted_records_with_a_valid_check_never_panic_or_overreach() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..20_000u64 {
            let n = (next() % 6) as usize;
            let mut ino = next() % 1000;
            let files = (0..n)
                .map(|_| {
                    ino += 1 + next() % 3;
                    let mut e = full();
                    e.size = next() >> (next() % 64);
                    e.btime_ns = (next() % 2 == 0).then(|| next() as i64);
                    e.hash = (next() % 2 == 0).then_some([3; 32]);
                    e.whole = (next() % 3 == 0).then_some([4; 32]);
                    e.shared = (next() % 2 == 0).then(&mut next);
                    e.mapped = next() % 2 == 0;
                    if !e.mapped {
                        e.exclusive = 0;
                    }
                    (ino, e)
                })
                .collect();
            let rec = Record {
                path: b"/d".to_vec(),
                since: 0,
                files,
            };
            let dir = round;
            let mut b = rec.encode(dir);
            assert_eq!(Record::decode(dir, &b), Some(rec));
            b.truncate(b.len() - CHECK);
            match next() % 4 {
                0 => {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                1 => b.truncate((next() as usize) % b.len()),
                2 => {
                    let i = (next() as usize) % (b.len() + 1);
                    b.splice(i..i, [0xff; 9].into_iter().chain([0x01]));
                }
                _ => {
                    let i = (next() as usize) % (b.len() + 1);
                    b.insert(i, next() as u8);
                }
            }
            let sum = check(dir, &b);
            b.extend_from_slice(&sum);
            if let Some(r) = Record::decode(dir, &b) {
                assert!(r.files.len() <= b.len() / 5, "round {round}");
                assert!(r.files.windows(2).all(|w| w[0].0 < w[1].0), "round {round}");
                assert_eq!(Record::decode(dir + 1, &b), None);
            }
        }
    }

    #[test]
    fn varints_round_trip_at_their_edges() {
        for x in [0, 1, 127, 128, 16_383, 16_384, u64::MAX / 2, u64::MAX] {
            let mut v = Vec::new();
            put_var(&mut v, x);
            let mut r = Reader(&v);
            assert_eq!(r.var(), Some(x));
            assert!(r.0.is_empty());
        }
        for x in [0, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(x)), x);
        }
        assert_eq!((zigzag(-1), zigzag(1)), (1, 2));
        // Birth and change times far apart, either way round.
        for (b, c) in [(i64::MIN, i64::MAX), (i64::MAX, i64::MIN), (-3, 5)] {
            let e = Entry {
                btime_ns: Some(b),
                ctime_ns: c,
                ..Entry::default()
            };
            let mut v = Vec::new();
            e.encode(None, &mut v);
            assert_eq!(Entry::decode(None, &mut Reader(&v)), Some(e));
        }
    }

    #[test]
    fn a_rewrite_waits_for_the_file_to_double() {
        const MB: u64 = 1 << 20;
        // A first run's file, never rewritten: against its content.
        assert!(bloated(60 * MB, 10 * MB, None));
        assert!(!bloated(15 * MB, 10 * MB, None));
        // Small indexes are left alone.
        assert!(!bloated(MB, MB / 4, None));
        // Just rewritten, up to twice its content by redb's doubling:
        // kept, however much a later run writes, until it doubles.
        assert!(!bloated(17 * MB, 9 * MB, Some(17 * MB)));
        assert!(!bloated(34 * MB - 1, 9 * MB, Some(17 * MB)));
        assert!(bloated(34 * MB, 9 * MB, Some(17 * MB)));
        // Doubled because it holds twice as much: not bloated.
        assert!(!bloated(34 * MB, 24 * MB, Some(17 * MB)));
        // Sizes at the end of the range do not overflow.
        assert!(!bloated(u64::MAX, u64::MAX, None));
        assert!(bloated(u64::MAX, MB, Some(u64::MAX)));
    }

    #[test]
    fn what_is_learnt_goes_only_to_an_entry_of_the_identity_it_was_learnt_under() {
        let stored = Entry {
            hash: None,
            whole: None,
            shared: None,
            ..full()
        };
        let learnt = |stamp| Update {
            dev: 1,
            dir: 2,
            ino: 3,
            stamp,
            what: Learnt::Hash([7; 32]),
        };
        // Learnt of the file as its entry has it: applied.
        let mut e = stored.clone();
        assert!(apply_to(&learnt(e.stamp(1, 3)), 1, 3, &mut e));
        assert_eq!(e.hash, Some([7; 32]));
        // Learnt of the file after a change (here its ctime moved), or of
        // another inode, or on another device: the entry keeps what it
        // had, whatever the change.
        let later = Entry {
            ctime_ns: stored.ctime_ns + 1,
            ..stored.clone()
        };
        for stamp in [later.stamp(1, 3), stored.stamp(1, 4), stored.stamp(9, 3)] {
            let mut e = stored.clone();
            assert!(!apply_to(&learnt(stamp), 1, 3, &mut e));
            assert_eq!(e, stored);
            let mut e = stored.clone();
            let relaid = Relaid {
                dev: 1,
                dir: 2,
                ino: 3,
                stamp,
                shared: 9,
            };
            assert!(!apply_to(&relaid, 1, 3, &mut e));
            assert_eq!(e, stored);
        }
    }

    #[test]
    fn a_file_shared_whole_is_recorded_as_sharing_every_block() {
        let mut e = full();
        e.shared = None;
        e.exclusive = 4096;
        e.mapped = false;
        let was = e.clone();
        Relaid {
            dev: 1,
            dir: 2,
            ino: 3,
            stamp: e.stamp(1, 3),
            shared: 9,
        }
        .apply(&mut e);
        assert_eq!((e.exclusive, e.shared, e.mapped), (0, Some(9), true));
        // Its identity and hashes are left as they were.
        assert_eq!(
            (e.ident(), e.hash, e.whole),
            (was.ident(), was.hash, was.whole)
        );
    }

    /// Seeded random facts of the files of one record, in a shuffled
    /// order, as a run's end gets them (planning reads of a file's layout
    /// agree; so do its layouts learnt after sharing, once the executor
    /// kept its last group's): sorted and applied, each file ends with its
    /// layout learnt after sharing (on its source's runs, or forgotten as
    /// moved), or, without one, its planning read.
    #[test]
    fn layouts_learnt_after_sharing_win_over_planning_reads() {
        for seed in 1..=200u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let inos: Vec<u64> = (1..=40).collect();
            let mut rec = Record {
                path: b"/d".to_vec(),
                since: 0,
                files: inos.iter().map(|&i| (i, full())).collect(),
            };
            let stamp = |ino| full().stamp(1, ino);
            let (mut updates, mut relaid) = (Vec::new(), Vec::new());
            // Per file: (exclusive, shared) expected.
            let mut want: HashMap<u64, (u64, Option<u64>)> = HashMap::new();
            for &ino in &inos {
                let read = match rng.bool() {
                    true => (rng.u64(1..9000), None),
                    false => (0, Some(rng.u64(1..99))),
                };
                let reads = rng.usize(..3);
                for _ in 0..reads {
                    updates.push(Update {
                        dev: 1,
                        dir: 2,
                        ino,
                        stamp: stamp(ino),
                        what: Learnt::Layout {
                            exclusive: read.0,
                            shared: read.1,
                            inline: false,
                            hash: None,
                        },
                    });
                }
                let shared = match rng.bool() {
                    true => rng.u64(1..99),
                    false => Relaid::MOVED,
                };
                let after = rng.usize(..3);
                for _ in 0..after {
                    relaid.push(Relaid {
                        dev: 1,
                        dir: 2,
                        ino,
                        stamp: stamp(ino),
                        shared,
                    });
                }
                let expect = match (after, reads, shared) {
                    (0, 0, _) => (full().exclusive, full().shared),
                    (0, _, _) => read,
                    (_, _, Relaid::MOVED) => (full().size, None),
                    (_, _, fp) => (0, Some(fp)),
                };
                want.insert(ino, expect);
            }
            rng.shuffle(&mut updates);
            rng.shuffle(&mut relaid);
            in_key_order(&mut updates, &mut relaid);
            Facts {
                updates: &updates,
                relaid: &relaid,
            }
            .apply(2, &mut rec);
            for (ino, e) in &rec.files {
                assert_eq!(
                    (e.exclusive, e.shared),
                    want[ino],
                    "seed {seed}, inode {ino}"
                );
                assert!(e.mapped && !e.inline, "seed {seed}, inode {ino}");
            }
        }
    }

    /// The sources' check at a run's end, both ways the index takes it:
    /// corrections applied after what was learnt (a rewrite,
    /// [`Check::corrections`]) and what was learnt corrected first (a
    /// write, [`Check::correct`]). Over seeded random layouts learnt and
    /// runs not found, either way a file learnt on runs not found is
    /// forgotten, the others keep what was learnt, and the check is asked
    /// once; a check that panics forgets every file.
    #[test]
    fn files_learnt_on_runs_not_found_again_are_forgotten_either_way() {
        use std::sync::atomic::AtomicUsize;
        for seed in 1..=200u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let inos: Vec<u64> = (1..=30).collect();
            let fresh = || Record {
                path: b"/d".to_vec(),
                since: 0,
                files: inos.iter().map(|&i| (i, full())).collect(),
            };
            let mut relaid: Vec<Relaid> = (inos.iter())
                .map(|&ino| Relaid {
                    dev: 1,
                    dir: 2,
                    ino,
                    stamp: full().stamp(1, ino),
                    shared: match rng.u8(..4) {
                        0 => Relaid::MOVED,
                        _ => rng.u64(1..8),
                    },
                })
                .collect();
            in_key_order(&mut [], &mut relaid);
            let gone: HashSet<u64> = (1..8).filter(|_| rng.bool()).collect();
            // A check that fails forgets all.
            let fails = seed % 10 == 0;
            let asked = AtomicUsize::new(0);
            let check = || Check {
                pending: Some(Box::new(|| {
                    asked.fetch_add(1, Ordering::Relaxed);
                    assert!(!fails, "the check fails (seed {seed})");
                    gone.clone()
                })),
                found: None,
            };
            fn facts(relaid: &[Relaid]) -> Facts<'_> {
                Facts {
                    updates: &[],
                    relaid,
                }
            }
            // As a rewrite: learnt, then corrected.
            let mut after = fresh();
            facts(&relaid).apply(2, &mut after);
            let mut c = check();
            let late = c.corrections(&relaid);
            let _ = c.corrections(&relaid);
            facts(&late).apply(2, &mut after);
            // As a write: corrected, then learnt.
            let mut first = fresh();
            let mut fixed = relaid.clone();
            let mut c = check();
            c.correct(&mut fixed);
            c.correct(&mut fixed);
            facts(&fixed).apply(2, &mut first);
            assert_eq!(asked.load(Ordering::Relaxed), 2, "seed {seed}");
            for (r, ((_, a), (_, b))) in relaid.iter().zip(after.files.iter().zip(&first.files)) {
                let want = match r.shared {
                    fp if fails || fp == Relaid::MOVED || gone.contains(&fp) => (full().size, None),
                    fp => (0, Some(fp)),
                };
                assert_eq!((a.exclusive, a.shared), want, "seed {seed}: {r:?}");
                assert_eq!((b.exclusive, b.shared), want, "seed {seed}: {r:?}");
            }
        }
    }

    /// The record cache against a plain model of its rule (scan for the
    /// least recently used, let it go while over [`CACHED_ENTRIES`]
    /// entries and more than [`KEPT_RECORDS`] records), over seeded
    /// random lookups of records of random sizes: the same records are
    /// cached after every step, and a cached one is the one kept.
    #[test]
    fn the_record_cache_lets_the_least_recently_used_go() {
        for seed in 1..=8u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut st = State::default();
            // Model: dir -> (entries, last use).
            let mut model: HashMap<u64, (usize, u64)> = HashMap::new();
            let mut clock = 0u64;
            let sizes: Vec<usize> = (0..200)
                .map(|_| match rng.u8(..4) {
                    0 => rng.usize(2000..6000),
                    1 => 0,
                    _ => rng.usize(1..50),
                })
                .collect();
            for step in 0..3000 {
                // Runs of lookups in one directory, as the walk makes.
                let dir = rng.u64(..sizes.len() as u64);
                for _ in 0..rng.usize(1..4) {
                    clock += 1;
                    match st.touch(dir) {
                        Some(r) => {
                            assert_eq!(r.files.len(), sizes[dir as usize], "seed {seed}");
                            model.get_mut(&dir).expect("cached in the model").1 = clock;
                        }
                        None => {
                            assert!(!model.contains_key(&dir), "seed {seed} step {step}");
                            let files = (0..sizes[dir as usize] as u64)
                                .map(|i| (i, Entry::default()))
                                .collect();
                            st.keep(
                                dir,
                                Arc::new(Record {
                                    path: Vec::new(),
                                    since: 0,
                                    files,
                                }),
                            );
                            model.insert(dir, (sizes[dir as usize], clock));
                            loop {
                                let total: usize = model.values().map(|v| v.0).sum();
                                if total <= CACHED_ENTRIES || model.len() <= KEPT_RECORDS {
                                    break;
                                }
                                let old = *model.iter().min_by_key(|(_, v)| v.1).unwrap().0;
                                model.remove(&old);
                            }
                        }
                    }
                }
                let mut got: Vec<u64> = st.cache.keys().copied().collect();
                let mut want: Vec<u64> = model.keys().copied().collect();
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "seed {seed} step {step}");
                assert_eq!(st.cached, model.values().map(|v| v.0).sum::<usize>());
                assert_eq!(st.by_use.len(), st.cache.len());
            }
        }
    }
}
