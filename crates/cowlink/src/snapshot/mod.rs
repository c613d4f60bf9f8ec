//! Snapshot sets: versions of a tree under one root, each a clone of the
//! one before, so every unchanged block is stored once.
//!
//! ```text
//! ROOT/
//!   20261126T024549.123456Z/     a snapshot (ISO 8601 basic UTC, µs)
//!   20261127T024601.004211Z/     the next one, a clone of the first
//!   .cowlink/                    bookkeeping, never inside a snapshot
//!     snapshots                  format mark: "cowlink snapshot set 1"
//!     lock                       flock(2) while a run writes; holds its pid
//!     records/<name>.json        one per snapshot this tool made
//!     blocks/<name>/             per-file block-hash records of <name>
//!     removing/<name>/           a snapshot prune moved aside to remove
//! ```
//!
//! A record (`{"format":1,"state":…,"kind":…,"base":…,"id":{"dev":…,
//! "ino":…,"birth":[s,ns],"subvol":…},"completed":…}`) is what makes a
//! directory a snapshot: `list` shows only recorded names, and `prune`
//! removes only a recorded directory that is still the one recorded
//! (inode and creation time, and subvolume id on Btrfs). Anything else the
//! user puts under ROOT is never touched. `state` goes `cloning` (being
//! made from `base`) → `open` (made; the caller fills it) → `complete`
//! (sealed by [`Begun::complete`] after a `syncfs`), and `removing` once a
//! prune has begun to remove it. Records are replaced atomically and
//! durably, so a crash at any point leaves a state the next run reads
//! right: a snapshot is listed complete only after its contents were
//! written back and its mark was.
//!
//! [`SnapshotSet::begin`] takes the set's lock (a second run is refused,
//! naming the holder's pid), then either resumes the snapshot in progress
//! under its original name (a `cloning` one finishes its clone first:
//! files already complete are kept, see [`TreeOptions::resume`]) or makes
//! a new one as a clone of the newest complete snapshot:
//! - on Btrfs, a subvolume snapshot (`BTRFS_IOC_SNAP_CREATE`, constant
//!   time) when that snapshot is a subvolume; the first snapshot of a set
//!   on Btrfs is made a subvolume for that reason;
//! - elsewhere the tree copy in [`LinkMode::Clone`] with everything
//!   preserved (`cp -a --reflink=always`): clone or fail, never a silent
//!   full copy. On a filesystem that cannot clone, `begin` fails.
//!
//! Whichever way it is made, the snapshot's directory is opened once,
//! never through a link, and its identity recorded (still `cloning`)
//! before anything is cloned into it; a resumed snapshot is opened the
//! same way and must be the recorded directory. Everything after writes
//! through that descriptor ([`Begun::dir`]), never through the name,
//! which anyone who can write in ROOT could swap for a link or another
//! directory between two steps.
//!
//! The caller writes into [`Begun::dir`] (sync does:
//! [`crate::sync::sync_into_snapshot`]) and calls [`Begun::complete`],
//! which seals it only while its name still holds that directory.
//! Dropping a [`Begun`] without completing it leaves the snapshot in
//! progress for the next `begin` to resume.
//!
//! `sync --snapshot` and `prune` also lock ROOT as a sync destination
//! (`LOCK_EX` on ROOT, `LOCK_SH` above it: see `crate::sync::lock`), so a
//! plain sync into ROOT, above it or into one of its snapshots never runs
//! at the same time. A [`Begun`] of the library holds `LOCK_SH` on ROOT
//! and above for its whole life, so a sync into ROOT or above it never
//! runs while a snapshot is made and filled, and the caller can still
//! fill it with a sync into its directory.
//!
//! [`TreeOptions::resume`]: crate::tree::TreeOptions::resume
//! [`LinkMode::Clone`]: crate::LinkMode::Clone

mod book;
mod policy;
mod remove;
mod stamp;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;
use crate::ground::lock;
use crate::usage::{Usage, UsageOptions};
use book::{err, Book, Record};

pub use policy::{KeepPolicy, Verdict};
pub use stamp::Stamp;

/// Where a snapshot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Being made as a clone of its base; the next `begin` finishes it.
    Cloning,
    /// Made; being filled by its caller (a sync); resumed by the next
    /// `begin`.
    Open,
    /// Sealed: its contents were written back before the mark.
    Complete,
    /// A prune began to remove it; the next prune finishes.
    Removing,
}

/// How a snapshot's directory was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A directory whose files are clones of the base's (or empty).
    Tree,
    /// A Btrfs subvolume (a snapshot of the base's subvolume, or new).
    Subvolume,
}

/// One snapshot of a set.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// Its name under the root.
    pub name: String,
    /// `ROOT/name`.
    #[serde(serialize_with = "crate::name::json::path")]
    pub path: PathBuf,
    /// The time it was begun (microseconds since the epoch, UTC; the
    /// name says the same).
    #[serde(rename = "time_us")]
    pub time: Stamp,
    /// Where it is in its life; only [`State::Complete`] ones are whole.
    pub state: State,
    /// Tree or subvolume.
    pub kind: Kind,
    /// The snapshot it was cloned from.
    pub base: Option<String>,
    /// Whether its directory exists and, once recorded, is still the one
    /// this tool made (a snapshot being cloned or removed may have none;
    /// a directory renamed into its name is not it).
    pub present: bool,
}

impl Snapshot {
    /// Whether it is complete.
    pub fn is_complete(&self) -> bool {
        self.state == State::Complete
    }
}

struct Inner {
    root: PathBuf,
    root_fd: OwnedFd,
    book: Option<Book>,
    run: crate::run::Run,
    /// The caller holds ROOT's sync lock ([`SnapshotSet::open_locked`]):
    /// `begin` must not take it again (`flock` refuses a second
    /// description even in the same process).
    root_locked: bool,
}

/// A snapshot root, opened (see the module notes for the layout).
#[derive(Clone)]
pub struct SnapshotSet {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SnapshotSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotSet")
            .field("root", &self.inner.root)
            .finish()
    }
}

/// Open the directory `name` of `dir` to read it, never through a
/// symbolic link (`ELOOP`, or `ENOTDIR` for another type).
fn open_dir_nofollow(dir: BorrowedFd<'_>, name: &str) -> std::result::Result<OwnedFd, Errno> {
    fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// `mkdir ROOT` (0755), an existing one kept.
fn make_root(root: &Path) -> Result<()> {
    match fs::mkdir(root, cowlink_sys::raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(err(root, e).with_reason(format!("cannot create the snapshot root: {e}"))),
    }
}

fn open_root(root: &Path) -> Result<OwnedFd> {
    fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT => err(root, e).with_reason("the snapshot root does not exist"),
        Errno::NOTDIR => err(root, e).with_reason("the snapshot root is not a directory"),
        e => err(root, e),
    })
}

impl SnapshotSet {
    /// Open the snapshot set at `root` for writing, making `root` (one
    /// level: its parent must exist) and its bookkeeping when missing.
    ///
    /// # Errors
    /// `root` cannot be made or opened; its `.cowlink` is not a directory
    /// or holds another format (`Corrupt`).
    pub fn open(root: impl AsRef<Path>) -> Result<SnapshotSet> {
        let root = root.as_ref();
        make_root(root)?;
        let root_fd = open_root(root)?;
        let book = Book::open(root_fd.as_fd(), root, true)?;
        Ok(SnapshotSet::from_parts(root, root_fd, book))
    }

    /// [`SnapshotSet::open`] for a snapshot run: ROOT is locked as a sync
    /// destination (`LOCK_EX` on it, `LOCK_SH` above: see
    /// `crate::sync::lock`) before its bookkeeping is made or read, so a
    /// sync into ROOT, into a directory above it or into one of its
    /// snapshots never runs at the same time.
    pub(crate) fn open_locked(root: &Path) -> Result<(SnapshotSet, crate::sync::lock::Held)> {
        // A root to be made: runs into the directories above refuse this
        // one before it is made (see `crate::sync::lock::take_above_new`).
        let mut above = None;
        if fs::stat(root).is_err() {
            let parent = match root.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let opath = cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            if let Ok(pfd) = fs::open(parent, opath, Mode::empty()) {
                above = Some(crate::sync::lock::take_above_new(pfd.as_fd(), root)?);
            }
        }
        make_root(root)?;
        let root_fd = open_root(root)?;
        let held = crate::sync::lock::take(root_fd.as_fd(), root, false)?;
        drop(above);
        let book = Book::open(root_fd.as_fd(), root, true)?;
        let mut set = SnapshotSet::from_parts(root, root_fd, book);
        if let Some(inner) = Arc::get_mut(&mut set.inner) {
            inner.root_locked = true;
        }
        Ok((set, held))
    }

    /// The newest complete snapshot whose directory is still the recorded
    /// one, opened (never through a link) and checked on the descriptor,
    /// for a dry run to compare against; `None` when the set has none.
    ///
    /// # Errors
    /// The records cannot be read.
    pub(crate) fn newest_complete(&self) -> Result<Option<(Snapshot, OwnedFd)>> {
        let Some(book) = &self.inner.book else {
            return Ok(None);
        };
        let (records, _) = book.records()?;
        for (name, rec) in records.iter().rev() {
            let Some(want) = rec.id.filter(|_| rec.state == State::Complete) else {
                continue;
            };
            let Ok(dir) = open_dir_nofollow(self.inner.root_fd.as_fd(), name) else {
                continue;
            };
            if book::DirId::of_fd(dir.as_fd()).is_ok_and(|now| want.same(&now)) {
                return Ok(Some((self.snapshot(name.clone(), rec), dir)));
            }
        }
        Ok(None)
    }

    /// Open an existing snapshot root to read it (list, prune), creating
    /// nothing. A directory without bookkeeping is a set with no
    /// snapshots.
    ///
    /// # Errors
    /// `root` is missing or not a directory; bookkeeping of another format.
    pub fn open_existing(root: impl AsRef<Path>) -> Result<SnapshotSet> {
        let root = root.as_ref();
        let root_fd = open_root(root)?;
        let book = Book::open(root_fd.as_fd(), root, false)?;
        Ok(SnapshotSet::from_parts(root, root_fd, book))
    }

    fn from_parts(root: &Path, root_fd: OwnedFd, book: Option<Book>) -> SnapshotSet {
        SnapshotSet {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                root_fd,
                book,
                run: crate::run::Run::default(),
                root_locked: false,
            }),
        }
    }

    /// Run long steps (the clone of a tree, the usage walk) with `run`'s
    /// threads, cancel token and progress.
    pub fn with_run(self, run: crate::run::Run) -> SnapshotSet {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|a| Inner {
            root: a.root.clone(),
            root_fd: rustix::io::fcntl_dupfd_cloexec(&a.root_fd, 0)
                .expect("dup of a live descriptor"),
            book: a.book.as_ref().map(|b| Book {
                meta: rustix::io::fcntl_dupfd_cloexec(&b.meta, 0)
                    .expect("dup of a live descriptor"),
                records: rustix::io::fcntl_dupfd_cloexec(&b.records, 0)
                    .expect("dup of a live descriptor"),
                path: b.path.clone(),
            }),
            run: a.run.clone(),
            root_locked: a.root_locked,
        });
        SnapshotSet {
            inner: Arc::new(Inner { run, ..inner }),
        }
    }

    /// The root as given.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    fn book(&self) -> Result<&Book> {
        self.inner.book.as_ref().ok_or_else(|| {
            Error::new(Operation::Snapshot, ErrorKind::NotFound)
                .with_src(&self.inner.root)
                .with_reason("not a snapshot set (no .cowlink bookkeeping)")
        })
    }

    /// Every snapshot this tool recorded, oldest first, and the records
    /// that could not be read (their snapshots are left alone).
    ///
    /// # Errors
    /// The records' directory cannot be read.
    pub fn list(&self) -> Result<(Vec<Snapshot>, Vec<Error>)> {
        let Some(book) = &self.inner.book else {
            return Ok((Vec::new(), Vec::new()));
        };
        let (records, bad) = book.records()?;
        let snaps = records
            .into_iter()
            .map(|(name, r)| self.snapshot(name, &r))
            .collect();
        Ok((snaps, bad))
    }

    fn snapshot(&self, name: String, r: &Record) -> Snapshot {
        // Once recorded, only the recorded directory counts: another one
        // renamed into the name is not this snapshot (and `ls` must not
        // measure it as one).
        let present = match r.id {
            Some(_) => self.is_recorded_dir(&name, r),
            None => cowlink_sys::statat(
                &self.inner.root_fd,
                name.as_str(),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok_and(|st| cowlink_sys::file_type(st.st_mode) == FileType::Directory),
        };
        Snapshot {
            path: self.inner.root.join(&name),
            time: Stamp::parse(&name).expect("records are listed by valid names"),
            name,
            state: r.state,
            kind: r.kind,
            base: r.base.clone(),
            present,
        }
    }

    /// Each snapshot with its disk usage: what only it holds and what it
    /// shares, from one walk of all of them together (the du engine,
    /// [`crate::usage`](mod@crate::usage)).
    ///
    /// # Errors
    /// The records cannot be read. Errors of the walk are in the answer.
    pub fn list_usage(&self) -> Result<Listing> {
        let (snaps, mut errors) = self.list()?;
        // A snapshot with a mount inside is not measured: the walk would
        // count what is mounted there as the snapshot's own (removing the
        // snapshot would not free it; prune refuses such a snapshot).
        let measured: Vec<bool> = snaps
            .iter()
            .map(|s| {
                s.present
                    && match self.refuse_mounts(&s.path, "not measured") {
                        Ok(()) => true,
                        Err(e) => {
                            errors.push(e);
                            false
                        }
                    }
            })
            .collect();
        let paths: Vec<PathBuf> = snaps
            .iter()
            .zip(&measured)
            .filter(|(_, m)| **m)
            .map(|(s, _)| s.path.clone())
            .collect();
        let report = crate::usage::usage_report(
            &paths,
            &UsageOptions {
                run: self.inner.run.clone(),
                per_dir: false,
            },
        );
        let mut usages = report.args.into_iter();
        let entries = snaps
            .into_iter()
            .zip(measured)
            .map(|(s, measured)| {
                let usage = if measured {
                    usages.next().map(|u| u.usage)
                } else {
                    None
                };
                SnapshotUsage { snapshot: s, usage }
            })
            .collect();
        errors.extend(report.errors);
        Ok(Listing {
            snapshots: entries,
            total: report.total,
            errors,
            cancelled: report.cancelled,
        })
    }

    /// Begin a snapshot: resume the one in progress, or make a new one as
    /// a clone of the newest complete one (see the module notes). The set
    /// stays locked until the answer is completed or dropped.
    ///
    /// # Errors
    /// Another run holds the set (`InUse`, naming its pid); the clone
    /// failed (the snapshot stays in progress, to be resumed); the
    /// bookkeeping cannot be written.
    pub fn begin(&self) -> Result<Begun> {
        let book = self.book()?;
        let lock = book.lock()?;
        // Making and filling a snapshot writes into ROOT: no sync into
        // ROOT or above it at the same time (its `--delete` would remove
        // the snapshot being cloned and the bookkeeping). `LOCK_SH`, as a
        // dry run of ROOT, not `LOCK_EX`: the caller fills the snapshot
        // with a sync into its directory (`sync_into_snapshot`, or a plain
        // sync into `path`), which takes `LOCK_SH` on ROOT too. After the
        // set's own lock, as `prune`, so a second snapshot run is named by
        // that one. `sync --snapshot` holds `LOCK_EX` on ROOT already.
        let root_lock = if self.inner.root_locked {
            None
        } else {
            Some(crate::sync::lock::take(
                self.inner.root_fd.as_fd(),
                &self.inner.root,
                true,
            )?)
        };
        // A name taken by someone else before the snapshot's directory
        // was made there is given up (its record forgotten: nothing of
        // this tool's is under it) and the next free name is taken; a few
        // times, then the run fails.
        let mut attempts = 0;
        loop {
            match self.begin_locked(book) {
                Err(Taken(name)) if attempts < 3 => {
                    attempts += 1;
                    book.forget(&name)?;
                }
                Err(Taken(name)) => {
                    book.forget(&name)?;
                    return Err(name_taken(&self.inner.root.join(name)));
                }
                Ok(r) => {
                    let (name, record, resumed, dir) = r?;
                    return Ok(Begun {
                        set: self.clone(),
                        path: self.inner.root.join(&name),
                        blocks: book.blocks_dir(&name),
                        name,
                        record,
                        resumed,
                        dir,
                        _lock: lock,
                        _root_lock: root_lock,
                    });
                }
            }
        }
    }

    /// [`SnapshotSet::begin`] with the lock held: the snapshot's name,
    /// record and whether it was resumed; `Err(Taken)` when its name was
    /// taken by something else before its directory was made.
    fn begin_locked(&self, book: &Book) -> std::result::Result<Result<Opened>, Taken> {
        let (records, _) = match book.records() {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let r = self.begin_records(book, &records);
        match r {
            Err((_, Some(name))) => Err(Taken(name)),
            Err((e, _)) => Ok(Err(e)),
            Ok(v) => Ok(Ok(v)),
        }
    }

    fn begin_records(
        &self,
        book: &Book,
        records: &book::Records,
    ) -> std::result::Result<Opened, (Error, Option<String>)> {
        let plain = |e: Error| (e, None);
        let root = &self.inner.root;
        let unfinished = records
            .iter()
            .rev()
            .find(|(_, r)| matches!(r.state, State::Cloning | State::Open));
        let (name, mut rec, resumed) = match unfinished {
            Some((name, r)) => (name.clone(), r.clone(), true),
            None => {
                let newest = records.iter().filter_map(|(n, _)| Stamp::parse(n)).max();
                let mut time = Stamp::now().after(newest);
                // A name already used by something else under the root
                // (the user's own directory, however unlikely) is skipped.
                while cowlink_sys::statat(
                    &self.inner.root_fd,
                    time.name().as_str(),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .is_ok()
                {
                    time = Stamp(time.0 + 1);
                }
                // Names end at 9999-12-31: past that one a name would not
                // read back, and the snapshot would never be listed. Only a
                // record left by a clock set far ahead gets here.
                if time.0 > stamp::MAX_US {
                    let last = newest.map_or_else(|| time.name(), Stamp::name);
                    return Err(plain(Error::new(Operation::Snapshot, ErrorKind::InvalidInput)
                        .with_src(root.join(&last))
                        .with_reason(format!(
                            "no name is left after the snapshot {last} (names end at 9999-12-31; a clock set far ahead made it): remove it, or rename it and its record"
                        ))));
                }
                let base = records
                    .iter()
                    .rev()
                    .find(|(n, r)| r.state == State::Complete && self.is_recorded_dir(n, r))
                    .map(|(n, _)| n.clone());
                let kind = self.plan_kind(base.as_deref());
                let rec = Record {
                    format: 1,
                    state: State::Cloning,
                    kind,
                    base,
                    id: None,
                    completed: None,
                };
                let name = time.name();
                book.write(&name, &rec).map_err(plain)?;
                (name, rec, false)
            }
        };
        // An open snapshot whose directory went away is made again; one
        // whose directory was replaced by something else is refused.
        if rec.state == State::Open && !self.is_recorded_dir(&name, &rec) {
            let taken = cowlink_sys::statat(
                &self.inner.root_fd,
                name.as_str(),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok();
            if taken {
                return Err(plain(not_resumable(&root.join(&name))));
            }
            rec.state = State::Cloning;
            rec.id = None;
            book.write(&name, &rec).map_err(plain)?;
        }
        let dir = if rec.state == State::Cloning {
            let base_id = self.check_base(records, &rec).map_err(plain)?;
            // Only a name-taken answer of `make` gives the name up: the
            // record of a snapshot this tool never made a directory for.
            let dir = self
                .make(book, &name, &mut rec, base_id, resumed)
                .map_err(|e| {
                    let taken = is_name_taken(&e);
                    (e, taken.then(|| name.clone()))
                })?;
            rec.state = State::Open;
            book.write(&name, &rec).map_err(plain)?;
            dir
        } else {
            // Resumed open: the directory checked above, opened once and
            // checked again on the descriptor (the name may have been
            // swapped in between). The sync writes through it.
            let path = root.join(&name);
            let replaced = || not_resumable(&path);
            let dir = open_dir_nofollow(self.inner.root_fd.as_fd(), &name).map_err(|e| {
                plain(match e {
                    Errno::NOENT | Errno::LOOP | Errno::NOTDIR => replaced(),
                    e => err(&path, e),
                })
            })?;
            let now = book::DirId::of_fd(dir.as_fd()).map_err(|e| plain(err(&path, e)))?;
            if !rec.id.is_some_and(|want| want.same(&now)) {
                return Err(plain(replaced()));
            }
            dir
        };
        Ok((name, rec, resumed, dir))
    }

    /// Refuse to clone from a base that is no longer the complete
    /// snapshot its record describes: a resumed clone (or one made again
    /// after its directory went away) would otherwise copy whatever now
    /// has the base's name, a link to a directory outside the root
    /// included. Answers the base's recorded identity, which [`Self::make`]
    /// checks again on the descriptor the clone reads from (the name may
    /// be swapped in between).
    fn check_base(&self, records: &book::Records, rec: &Record) -> Result<Option<book::DirId>> {
        let Some(base) = &rec.base else {
            return Ok(None);
        };
        let ok = records
            .iter()
            .find(|(n, _)| n == base)
            .filter(|(n, r)| r.state == State::Complete && self.is_recorded_dir(n, r))
            .and_then(|(_, r)| r.id);
        if ok.is_some() {
            return Ok(ok);
        }
        Err(base_changed(&self.inner.root.join(base), base))
    }

    /// Whether `name` is still the directory its record describes.
    fn is_recorded_dir(&self, name: &str, r: &Record) -> bool {
        match (r.id, book::DirId::of(self.inner.root_fd.as_fd(), name)) {
            (Some(want), Ok(Some(now))) => want.same(&now),
            _ => false,
        }
    }

    fn on_btrfs(&self) -> bool {
        crate::prim::files::kind_of(self.inner.root_fd.as_fd()) == FsKind::Btrfs
    }

    /// Subvolume when the root is on Btrfs and the base (if any) is a
    /// subvolume; a tree otherwise.
    fn plan_kind(&self, base: Option<&str>) -> Kind {
        if !self.on_btrfs() {
            return Kind::Tree;
        }
        match base {
            None => Kind::Subvolume,
            Some(b) => match cowlink_sys::statat(&self.inner.root_fd, b, AtFlags::SYMLINK_NOFOLLOW)
            {
                Ok(st) if st.st_ino == cowlink_sys::BTRFS_SUBVOL_ROOT_INO => Kind::Subvolume,
                _ => Kind::Tree,
            },
        }
    }

    /// Make (or finish making) the directory of `name` as `rec` says,
    /// and answer it open: the caller writes through this descriptor,
    /// never through the name. `rec` gets the kind it was made as and the
    /// directory's identity, recorded (still `cloning`) as soon as the
    /// directory exists, before anything is cloned into it: a resumed
    /// clone then goes on only in that directory, and a directory renamed
    /// into the name meanwhile is refused as not this tool's.
    fn make(
        &self,
        book: &Book,
        name: &str,
        rec: &mut Record,
        base_id: Option<book::DirId>,
        resumed: bool,
    ) -> Result<OwnedFd> {
        let root_fd = self.inner.root_fd.as_fd();
        let path = self.inner.root.join(name);
        let cname = book::cstr(name);
        let existing = cowlink_sys::statat(root_fd, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        if existing.is_none() {
            // The directory recorded (if any) is gone: the one made now is
            // recorded in its place.
            rec.id = None;
        }
        // Open the directory by its name, never through a link, and take
        // it for the snapshot's only if it is the recorded one (or, with
        // none recorded yet, record it): the one check every way of making
        // it ends with.
        let adopt = |rec: &mut Record, kind: Kind| -> Result<OwnedFd> {
            let dir = open_dir_nofollow(root_fd, name).map_err(|e| match e {
                Errno::NOENT | Errno::LOOP | Errno::NOTDIR => name_taken(&path),
                e => err(&path, e),
            })?;
            let now = book::DirId::of_fd(dir.as_fd()).map_err(|e| err(&path, e))?;
            if kind == Kind::Subvolume && now.ino != cowlink_sys::BTRFS_SUBVOL_ROOT_INO {
                return Err(name_taken(&path));
            }
            rec.kind = kind;
            match rec.id {
                // Only a resumed snapshot has one recorded already.
                Some(want) if !want.same(&now) => return Err(not_resumable(&path)),
                Some(_) => {}
                None => {
                    rec.id = Some(now);
                    book.write(name, rec)?;
                }
            }
            Ok(dir)
        };
        if let Some(st) = &existing {
            // This tool only ever makes a directory under the name, and a
            // new snapshot's name was free when it was chosen: something
            // else there now was put by someone else, and is not used.
            if cowlink_sys::file_type(st.st_mode) != FileType::Directory || !resumed {
                return Err(name_taken(&path));
            }
            // A subvolume is made in one step: if it is there, it is whole.
            if rec.kind == Kind::Subvolume
                && st.st_ino == cowlink_sys::BTRFS_SUBVOL_ROOT_INO
                && self.on_btrfs()
            {
                return adopt(rec, Kind::Subvolume);
            }
        }
        // The base, opened once and checked to be the recorded snapshot:
        // the clone reads through this descriptor, so a directory renamed
        // into the base's name meanwhile is never what gets cloned.
        let base = match &rec.base {
            None => None,
            Some(b) => {
                let shown = self.inner.root.join(b);
                let fd = open_dir_nofollow(root_fd, b).map_err(|e| match e {
                    Errno::NOENT | Errno::LOOP | Errno::NOTDIR => base_changed(&shown, b),
                    e => err(&shown, e),
                })?;
                let now = book::DirId::of_fd(fd.as_fd()).map_err(|e| err(&shown, e))?;
                if !base_id.is_some_and(|want| want.same(&now)) {
                    return Err(base_changed(&shown, b));
                }
                Some((fd, shown))
            }
        };
        if existing.is_none() && rec.kind == Kind::Subvolume {
            let made = match &base {
                None => cowlink_sys::btrfs_subvol_create(root_fd, &cname),
                Some((base_fd, _)) => {
                    cowlink_sys::btrfs_snapshot_create(root_fd, &cname, base_fd.as_fd())
                }
            };
            match made {
                Ok(()) => return adopt(rec, Kind::Subvolume),
                // Not allowed or not possible here: a tree of clones does
                // the same in linear time.
                Err(
                    Errno::PERM | Errno::ACCESS | Errno::NOTTY | Errno::OPNOTSUPP | Errno::INVAL,
                ) => {}
                Err(e) => {
                    return Err(
                        err(&path, e).with_reason(format!("cannot make a Btrfs subvolume: {e}"))
                    )
                }
            }
        }
        // The directory is made here (only the owner may enter it until
        // the clone gives it the base's mode) and cloned into through its
        // descriptor, so a link or directory someone renames into the
        // name meanwhile is never written through.
        match fs::mkdirat(
            root_fd,
            name,
            cowlink_sys::raw_mode(if base.is_some() { 0o700 } else { 0o755 }),
        ) {
            Ok(()) => {}
            Err(Errno::EXIST) if existing.is_some() => {}
            Err(Errno::EXIST) => return Err(name_taken(&path)),
            Err(e) => return Err(err(&path, e)),
        }
        let dst = adopt(rec, Kind::Tree)?;
        if let Some((base_fd, shown)) = &base {
            // What is mounted inside the base is not part of it (a
            // subvolume snapshot leaves it out too).
            self.refuse_mounts(shown, "not cloned")?;
            // The tree engine takes a path: the descriptor's own
            // (`/proc/self/fd/N/.`, the directory it holds, wherever
            // it is renamed to), not the base's name.
            let pinned = PathBuf::from(format!(
                "/proc/self/fd/{}/.",
                std::os::fd::AsRawFd::as_raw_fd(base_fd)
            ));
            let into = PathBuf::from(format!(
                "/proc/self/fd/{}/.",
                std::os::fd::AsRawFd::as_raw_fd(&dst)
            ));
            self.clone_tree(&pinned, shown, &into, &path)?;
        }
        Ok(dst)
    }

    /// `cp -a --reflink=always base into`, merging into what a crash left;
    /// `shown` and `path` are the base's and the snapshot's names under
    /// the root, for messages (`base` and `into` are descriptor paths).
    fn clone_tree(&self, base: &Path, shown: &Path, into: &Path, path: &Path) -> Result<()> {
        let mut opts = crate::tree::TreeOptions::archive();
        opts.file.link = crate::prim::mode::LinkMode::Clone;
        // Always merging: the directory exists (made by `make`, or left
        // by a crash).
        opts.resume = true;
        opts.run = self.inner.run.clone();
        let first: Mutex<Option<Error>> = Mutex::new(None);
        let observer = |ev: &crate::tree::TreeEvent<'_>| {
            if let crate::tree::TreeEvent::Failed(e) = ev {
                lock(&first).get_or_insert_with(|| (*e).clone());
            }
        };
        let report =
            crate::tree::copy_tree(base, into, &opts, &observer).map_err(|e| e.with_src(path))?;
        if let Some(e) = first.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(Error::new(Operation::Snapshot, e.kind())
                .with_src(path)
                .with_reason(format!(
                    "{} of the clone of {} failed, the first: {e} (the snapshot stays in progress; run again to resume)",
                    report.errors,
                    crate::name::quoted(shown)
                )));
        }
        if report.cancelled {
            return Err(Error::new(Operation::Snapshot, ErrorKind::Cancelled)
                .with_src(path)
                .with_reason("cancelled while cloning (the snapshot stays in progress)"));
        }
        Ok(())
    }

    /// Decide which snapshots `keep` keeps and, unless `dry_run`, remove
    /// the others, stopping early when the set's run is cancelled. Only recorded, complete snapshots (and those a former
    /// prune began to remove) are ever removed; never the newest complete
    /// one, one in progress, or the base of one being cloned. A directory
    /// whose device and inode are not the recorded ones is not removed.
    ///
    /// # Errors
    /// Another run holds the set; the records cannot be read. Errors
    /// removing one snapshot are in the answer, and the prune goes on.
    pub fn prune(&self, keep: &KeepPolicy, dry_run: bool) -> Result<Pruned> {
        let Some(book) = &self.inner.book else {
            return Ok(Pruned::default());
        };
        let lock = book.lock()?;
        // Removing snapshots writes into ROOT: no sync into it (or into a
        // snapshot, or above it) at the same time. After the set's own
        // lock, so a snapshot run holding both is named by that one.
        let dir_lock =
            crate::sync::lock::take(self.inner.root_fd.as_fd(), &self.inner.root, dry_run)?;
        let (records, errors) = book.records()?;
        let mut out = Pruned {
            errors,
            ..Pruned::default()
        };
        // A complete snapshot whose directory is gone is only a record to
        // forget; one whose directory is not the one recorded is left out
        // of the policy (it may not count as the newest) and left alone.
        let mut cands = Vec::new();
        let mut entries = Vec::new();
        for (name, rec) in records {
            let snap = self.snapshot(name, &rec);
            let mut state = rec.state;
            let mut foreign = false;
            if state == State::Complete {
                match book::DirId::of(self.inner.root_fd.as_fd(), &snap.name) {
                    Ok(None) => state = State::Removing,
                    Ok(Some(now)) if rec.id.is_some_and(|want| want.same(&now)) => {}
                    _ => foreign = true,
                }
            }
            if foreign {
                out.errors.push(replaced(&snap.path));
            } else {
                cands.push(policy::Candidate {
                    name: snap.name.clone(),
                    time: snap.time,
                    completed: rec.completed.map(Stamp),
                    state,
                    base: snap.base.clone(),
                });
            }
            entries.push((snap, rec, foreign));
        }
        let mut verdicts = policy::decide(&cands, keep).into_iter();
        for (snap, rec, foreign) in entries {
            let verdict = if foreign {
                Verdict::Replaced
            } else {
                verdicts.next().expect("one verdict per candidate")
            };
            if verdict.keeps() || dry_run {
                out.snapshots.push((snap, verdict));
                continue;
            }
            if self.inner.run.cancelled() {
                out.cancelled = true;
                break;
            }
            match self.remove_one(book, &snap, rec) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Cancelled => {
                    out.cancelled = true;
                    out.failed.push(snap.name.clone());
                    out.snapshots.push((snap, verdict));
                    break;
                }
                Err(e) => {
                    out.errors.push(e);
                    out.failed.push(snap.name.clone());
                }
            }
            out.snapshots.push((snap, verdict));
        }
        drop((dir_lock, lock));
        Ok(out)
    }

    fn remove_one(&self, book: &Book, snap: &Snapshot, mut rec: Record) -> Result<()> {
        let root_fd = self.inner.root_fd.as_fd();
        // Nothing (or no directory) by that name: only the record goes.
        if let Some(now) = book::DirId::of(root_fd, &snap.name).map_err(|e| err(&snap.path, e))? {
            if !rec.id.is_some_and(|want| want.same(&now)) {
                return Err(replaced(&snap.path));
            }
            self.refuse_mounts(&snap.path, "not removed")?;
            if rec.state != State::Removing {
                rec.state = State::Removing;
                book.write(&snap.name, &rec)?;
            }
            // Removal works by name, and anyone who can write in the root
            // can rename another directory into that name between the
            // check above and the removal. So the snapshot is first moved
            // aside, into the bookkeeping, and what arrived there is
            // checked again before anything is removed (and moved back
            // when it is not the snapshot).
            let aside = book.aside(true)?.expect("created when missing");
            match cowlink_sys::rename_noreplace(
                root_fd,
                Path::new(&snap.name),
                aside.as_fd(),
                Path::new(&snap.name),
            ) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => {
                    return Err(err(&snap.path, e).with_reason(format!(
                        "cannot move it aside into {} before removing it: {e}",
                        crate::name::quoted(&book.path.join(book::ASIDE))
                    )))
                }
            }
        }
        self.finish_aside(book, snap, &rec)?;
        book.forget_blocks(&snap.name, &self.inner.run.cancel)?;
        book.forget(&snap.name)
    }

    /// Remove what a prune moved aside as `ROOT/.cowlink/removing/<name>`
    /// when it is the recorded snapshot; move anything else back to
    /// `ROOT/<name>` (it was renamed into the snapshot's name while the
    /// prune ran) and report it.
    fn finish_aside(&self, book: &Book, snap: &Snapshot, rec: &Record) -> Result<()> {
        let Some(aside) = book.aside(false)? else {
            return Ok(());
        };
        let shown = book.path.join(book::ASIDE).join(&snap.name);
        let cname = book::cstr(&snap.name);
        match cowlink_sys::statat(aside.as_fd(), snap.name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(err(&shown, e)),
            Ok(_) => {}
        }
        let top = match cowlink_sys::open_dir_same_mount(aside.as_fd(), &cname) {
            Ok(fd) => Some(fd),
            Err(Errno::LOOP | Errno::NOTDIR | Errno::XDEV) => None,
            Err(e) => return Err(err(&shown, e)),
        };
        let ours = match &top {
            Some(fd) => {
                let now = book::DirId::of_fd(fd.as_fd()).map_err(|e| err(&shown, e))?;
                rec.id.is_some_and(|want| want.same(&now))
            }
            None => false,
        };
        if !ours {
            drop(top);
            return match cowlink_sys::rename_noreplace(
                aside.as_fd(),
                Path::new(&snap.name),
                self.inner.root_fd.as_fd(),
                Path::new(&snap.name),
            ) {
                Ok(()) => Err(replaced(&snap.path)),
                Err(e) => Err(err(&shown, e).with_reason(format!(
                    "this is not the snapshot (it was renamed into its name during a prune) and it cannot be moved back to {}: {e}; move it back by hand",
                    crate::name::quoted(&snap.path)
                ))),
            };
        }
        let top = top.expect("checked above");
        // A subvolume goes in one call where allowed (root, or
        // user_subvol_rm_allowed); else file by file, then the empty
        // subvolume by rmdir.
        let is_subvol = rec.id.is_some_and(|id| id.subvol.is_some());
        if is_subvol && cowlink_sys::btrfs_subvol_delete(aside.as_fd(), &cname).is_ok() {
            return Ok(());
        }
        remove::remove_opened_tree(aside.as_fd(), top, cname, &shown, &self.inner.run.cancel)
    }

    /// Refuse to remove, clone or measure `path` when a mount point is at
    /// or under it (`what`: "not removed", "not cloned", "not measured").
    /// The removal's descriptor walk would stop there too, this says so
    /// before anything is removed; the clone and the usage walk would
    /// cross it and take what is mounted for the snapshot's contents.
    fn refuse_mounts(&self, path: &Path, what: &str) -> Result<()> {
        let Ok(canon) = std::fs::canonicalize(path) else {
            return Ok(());
        };
        let Ok(text) = cowlink_sys::mount_table() else {
            return Ok(());
        };
        let mounts = crate::ground::mountinfo::parse(&text);
        // The mount the snapshot is on is not inside it; one on the
        // snapshot's own directory is.
        if let Some(m) = crate::ground::mountinfo::at_or_under(&mounts, &canon)
            .iter()
            .find(|m| m.mount_point.starts_with(&canon))
        {
            return Err(Error::new(Operation::Snapshot, ErrorKind::InUse)
                .with_src(path)
                .with_reason(format!(
                    "{what}: {} is mounted inside it; unmount it first",
                    crate::name::quoted(&m.mount_point)
                )));
        }
        Ok(())
    }
}

/// What `begin` opened: the snapshot's name, its record, whether it was
/// resumed, and its directory, open.
type Opened = (String, Record, bool, OwnedFd);

/// A snapshot's name was taken by something else before its directory
/// was made there.
struct Taken(String);

const NAME_TAKEN: &str =
    "the name of the snapshot being begun was taken by something this tool did not make";

fn name_taken(path: &Path) -> Error {
    Error::new(Operation::Snapshot, ErrorKind::AlreadyExists)
        .with_src(path)
        .with_reason(NAME_TAKEN)
}

/// Whether `e` is [`name_taken`]'s, not another `AlreadyExists` (a file
/// of the clone, say), which must not give the snapshot's name up.
fn is_name_taken(e: &Error) -> bool {
    e.kind() == ErrorKind::AlreadyExists
        && e.errno().is_none()
        && e.to_string().ends_with(NAME_TAKEN)
}

/// A snapshot in progress whose directory is no longer the one recorded.
fn not_resumable(path: &Path) -> Error {
    Error::new(Operation::Snapshot, ErrorKind::AlreadyExists)
        .with_src(path)
        .with_reason(
            "the snapshot in progress cannot be resumed: its directory was replaced by something this tool did not make",
        )
}

fn base_changed(path: &Path, base: &str) -> Error {
    Error::new(Operation::Snapshot, ErrorKind::ContentChanged)
        .with_src(path)
        .with_reason(format!(
            "the snapshot in progress is cloned from {base}, which is no longer the complete snapshot this tool recorded (replaced, moved or removed); put it back, or remove the snapshot in progress and its record to start again"
        ))
}

fn replaced(path: &Path) -> Error {
    Error::new(Operation::Snapshot, ErrorKind::InvalidInput)
        .with_src(path)
        .with_reason(
            "left alone: it is not the directory this tool made (its inode or creation time differs from the record)",
        )
}

/// [`SnapshotSet::list_usage`]'s answer.
#[derive(Debug, Default, serde::Serialize)]
pub struct Listing {
    /// Each snapshot, oldest first.
    pub snapshots: Vec<SnapshotUsage>,
    /// All snapshots together.
    pub total: Usage,
    /// Records that could not be read, and errors of the walk.
    pub errors: Vec<Error>,
    /// The walk was cancelled: the figures are partial.
    pub cancelled: bool,
}

/// One snapshot and its usage.
#[derive(Debug, serde::Serialize)]
pub struct SnapshotUsage {
    /// The snapshot.
    #[serde(flatten)]
    pub snapshot: Snapshot,
    /// Its figures, measured with the other snapshots: `exclusive` is
    /// what only it holds (what removing it frees), `shared` what it
    /// shares with another snapshot or file. `None` when its directory is
    /// missing, or not measured because something is mounted inside it
    /// (said in [`Listing::errors`]).
    pub usage: Option<Usage>,
}

/// [`SnapshotSet::prune`]'s answer.
#[derive(Debug, Default)]
pub struct Pruned {
    /// Every recorded snapshot, oldest first, with its verdict (in a dry
    /// run, what would be done).
    pub snapshots: Vec<(Snapshot, Verdict)>,
    /// Names whose removal failed (see `errors`).
    pub failed: Vec<String>,
    /// Unreadable records and failed removals.
    pub errors: Vec<Error>,
    /// The run was cancelled: `snapshots` ends with the last one looked
    /// at (a removal cut short is in `failed` and is finished by the next
    /// prune).
    pub cancelled: bool,
}

/// A snapshot begun by [`SnapshotSet::begin`], holding the set's lock.
#[derive(Debug)]
pub struct Begun {
    set: SnapshotSet,
    name: String,
    path: PathBuf,
    blocks: PathBuf,
    record: Record,
    resumed: bool,
    /// The snapshot's directory, open since it was made or checked.
    dir: OwnedFd,
    _lock: OwnedFd,
    /// `LOCK_SH` on ROOT and above, when `begin` took it (not when the
    /// set's opener holds `LOCK_EX` on ROOT).
    _root_lock: Option<crate::sync::lock::Held>,
}

impl Begun {
    /// The snapshot's directory: write the new version here. The name
    /// can be swapped by anyone who can write in the root; to write only
    /// into the directory this run made and checked, write through
    /// [`Begun::dir`] (as [`crate::sync::sync_into_snapshot`] does).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The snapshot's directory, open since `begin` made it (or checked
    /// it against its record, when resumed): whatever is renamed into
    /// its name afterwards, this is the snapshot's.
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Its name under the root.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is an interrupted snapshot resumed under its name.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// The complete snapshot it was cloned from (`None` for the first).
    pub fn base(&self) -> Option<&str> {
        self.record.base.as_deref()
    }

    /// The base's directory, for a sync to compare against.
    pub fn base_path(&self) -> Option<PathBuf> {
        self.record
            .base
            .as_ref()
            .map(|b| self.set.inner.root.join(b))
    }

    /// How its directory was made.
    pub fn kind(&self) -> Kind {
        self.record.kind
    }

    /// Where the block-hash records of this snapshot's files go
    /// (`ROOT/.cowlink/blocks/<name>/`, not made until asked for: see
    /// [`Begun::blocks_dir_create`]).
    pub fn blocks_dir(&self) -> &Path {
        &self.blocks
    }

    /// [`Begun::blocks_dir`], made if missing.
    ///
    /// # Errors
    /// It cannot be made.
    pub fn blocks_dir_create(&self) -> Result<&Path> {
        self.set.book()?.blocks_dir_create(&self.name)?;
        Ok(&self.blocks)
    }

    /// Seal the snapshot: write its filesystem back (`syncfs`), then its
    /// completion mark (durably). It is listed complete from then on, and
    /// the lock is released.
    ///
    /// # Errors
    /// The write-back or the mark failed; the snapshot stays in progress.
    pub fn complete(mut self) -> Result<Snapshot> {
        let inner = &self.set.inner;
        // Sealed only while the name still holds the directory written
        // (its record is what listing and prune go by): one swapped in
        // meanwhile is not sealed as the snapshot, and the snapshot
        // stays in progress.
        let replaced = || {
            Error::new(Operation::Snapshot, ErrorKind::ContentChanged)
                .with_src(&self.path)
                .with_reason("the snapshot's directory was replaced while it was open (its name now holds another directory, a link or nothing); it stays in progress")
        };
        let now = book::DirId::of(inner.root_fd.as_fd(), &self.name)
            .map_err(|e| err(&self.path, e))?
            .ok_or_else(replaced)?;
        let mine = book::DirId::of_fd(self.dir.as_fd()).map_err(|e| err(&self.path, e))?;
        if !self
            .record
            .id
            .is_some_and(|want| want.same(&now) && want.same(&mine))
        {
            return Err(replaced());
        }
        cowlink_sys::sync_filesystem(self.dir.as_fd()).map_err(|e| err(&self.path, e))?;
        self.record.state = State::Complete;
        self.record.completed = Some(Stamp::now().0);
        self.set.book()?.write(&self.name, &self.record)?;
        Ok(self.set.snapshot(self.name.clone(), &self.record))
    }
}
