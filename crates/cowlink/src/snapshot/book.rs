//! The bookkeeping under `ROOT/.cowlink/`: the format mark, the lock, one
//! record per snapshot, and the block-hash records' directory.
//!
//! Every file here is read as untrusted (another program or user may have
//! written it): opened without following links, read up to a cap, parsed
//! strictly; a record that does not parse is reported and its snapshot
//! left alone. Records are replaced atomically (a temporary, `fsync`,
//! `rename`, `fsync` of the directory), so a crash leaves the old record
//! or the new one, never a torn one.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::stamp::Stamp;
use super::{Kind, State};
use crate::ground::error::{Error, ErrorKind, Operation, Result};

/// The bookkeeping directory's name under the root.
pub(crate) const META: &str = ".cowlink";
/// The format mark's name and first line.
const FORMAT_FILE: &str = "snapshots";
const FORMAT_LINE: &str = "cowlink snapshot set 1\n";
/// The lock file.
pub(crate) const LOCK: &str = "lock";
/// The records' directory.
pub(crate) const RECORDS: &str = "records";
/// The block-hash records' directory (one subdirectory per snapshot).
pub(crate) const BLOCKS: &str = "blocks";
/// Where prune moves a snapshot before removing it (see
/// `SnapshotSet::remove_one`).
pub(crate) const ASIDE: &str = "removing";
/// Largest record read.
const RECORD_CAP: u64 = 16 * 1024;

pub(crate) fn err(path: impl AsRef<Path>, e: Errno) -> Error {
    Error::from_errno(Operation::Snapshot, e).with_src(path)
}

pub(crate) fn cstr(name: &str) -> CString {
    // Names here are snapshot names or fixed words: never a NUL.
    CString::new(name).unwrap_or_default()
}

/// One snapshot's record, `records/<name>.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Record {
    /// Always 1.
    pub format: u32,
    pub state: State,
    pub kind: Kind,
    /// The complete snapshot it was cloned from.
    pub base: Option<String>,
    /// Who the snapshot's directory is, once it exists: what prune checks
    /// before it removes anything, and `begin` before it clones from it.
    pub id: Option<DirId>,
    /// When `complete` was called (microseconds since the epoch).
    pub completed: Option<u64>,
}

/// A directory's identity: its inode number with its creation time (so
/// a later directory that reused the inode is told apart), and on Btrfs
/// its subvolume id (every subvolume's root is inode 256). The device
/// number is compared only where no creation time is known: it changes
/// when a filesystem is mounted from another device, and a Btrfs
/// subvolume's changes on every mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DirId {
    pub dev: u64,
    pub ino: u64,
    pub birth: Option<(i64, u32)>,
    pub subvol: Option<u64>,
}

impl DirId {
    /// The identity of the directory `name` in `dir` (not followed if a
    /// link), or `None` when there is no directory by that name.
    pub fn of(dir: BorrowedFd<'_>, name: &str) -> std::result::Result<Option<DirId>, Errno> {
        let fd = match fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(None),
            Err(e) => return Err(e),
        };
        DirId::of_fd(fd.as_fd()).map(Some)
    }

    /// The identity of the open directory `fd`.
    pub fn of_fd(fd: BorrowedFd<'_>) -> std::result::Result<DirId, Errno> {
        let st = cowlink_sys::fstat(fd)?;
        let subvol = (st.st_ino == cowlink_sys::BTRFS_SUBVOL_ROOT_INO)
            .then(|| cowlink_sys::btrfs_root_id(fd).ok())
            .flatten();
        Ok(DirId {
            dev: st.st_dev,
            ino: st.st_ino,
            birth: cowlink_sys::birth_time(fd).unwrap_or(None),
            subvol,
        })
    }

    /// Whether `now` is the directory this identity was taken of.
    pub fn same(&self, now: &DirId) -> bool {
        self.ino == now.ino
            && self.subvol == now.subvol
            && match (self.birth, now.birth) {
                (Some(a), Some(b)) => a == b,
                _ => self.dev == now.dev,
            }
    }
}

/// Records by snapshot name, in name order.
pub(crate) type Records = Vec<(String, Record)>;

/// The open bookkeeping directory.
#[derive(Debug)]
pub(crate) struct Book {
    pub meta: OwnedFd,
    pub records: OwnedFd,
    pub path: PathBuf,
}

fn open_dir_at(
    dir: BorrowedFd<'_>,
    name: &str,
    shown: &Path,
    create: bool,
) -> Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) if create => {
            match fs::mkdirat(dir, name, cowlink_sys::raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(err(shown, e).with_reason(format!("cannot create it: {e}"))),
            }
            fs::openat(dir, name, flags, Mode::empty())
                .map(Some)
                .map_err(|e| err(shown, e))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::LOOP | Errno::NOTDIR) => {
            Err(Error::new(Operation::Snapshot, ErrorKind::Corrupt)
                .with_src(shown)
                .with_reason(
                    "the snapshot set's bookkeeping is not a directory (a symbolic link or a file)",
                ))
        }
        Err(e) => Err(err(shown, e)),
    }
}

impl Book {
    /// Open `ROOT/.cowlink` (made when `create`), checking its format mark.
    pub fn open(root: BorrowedFd<'_>, root_path: &Path, create: bool) -> Result<Option<Book>> {
        let path = root_path.join(META);
        let Some(meta) = open_dir_at(root, META, &path, create)? else {
            return Ok(None);
        };
        let mark = path.join(FORMAT_FILE);
        match read_capped(meta.as_fd(), FORMAT_FILE, 256) {
            Ok(text) if text == FORMAT_LINE.as_bytes() => {}
            Ok(_) => {
                return Err(Error::new(Operation::Snapshot, ErrorKind::Corrupt)
                    .with_src(&mark)
                    .with_reason(format!(
                        "not a snapshot set of this version (expected {:?})",
                        FORMAT_LINE.trim_end()
                    )))
            }
            Err(Errno::NOENT) if create => {
                write_atomic(meta.as_fd(), FORMAT_FILE, FORMAT_LINE.as_bytes())
                    .map_err(|e| err(&mark, e))?
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(not_a_file(err(&mark, e), e)),
        }
        let records = open_dir_at(meta.as_fd(), RECORDS, &path.join(RECORDS), true)?
            .expect("created when missing");
        Ok(Some(Book {
            meta,
            records,
            path,
        }))
    }

    /// Take the set's lock, or say which process holds it.
    pub fn lock(&self) -> Result<OwnedFd> {
        let path = self.path.join(LOCK);
        let fd = fs::openat(
            &self.meta,
            LOCK,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            cowlink_sys::raw_mode(0o644),
        )
        .map_err(|e| err(&path, e))?;
        // A lock found taken is tried again for a moment before the run
        // is refused: a process forked by another thread of a program
        // that just released the lock (a Python host, a test harness)
        // holds a copy of the descriptor until it executes, so the lock
        // can look taken for a few milliseconds with no other run at all.
        // A real second run holds it for far longer than this grace.
        const GRACE: std::time::Duration = std::time::Duration::from_millis(100);
        let started = std::time::Instant::now();
        loop {
            match fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(Errno::INTR) => continue,
                Err(Errno::WOULDBLOCK) if started.elapsed() < GRACE => {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                Err(Errno::WOULDBLOCK) => {
                    let mut text = Vec::new();
                    let _ = std::fs::File::from(
                        fs::openat(
                            &self.meta,
                            LOCK,
                            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(|e| err(&path, e))?,
                    )
                    .take(64)
                    .read_to_end(&mut text);
                    let holder = std::str::from_utf8(&text)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok())
                        .map_or_else(
                            || "another process".to_string(),
                            |pid| format!("process {pid}"),
                        );
                    return Err(Error::new(Operation::Snapshot, ErrorKind::InUse)
                        .with_src(self.path.parent().unwrap_or(&self.path))
                        .with_reason(format!(
                            "the snapshot set is in use by {holder} (lock {})",
                            crate::name::quoted(&path)
                        )));
                }
                Err(e) => return Err(err(&path, e)),
            }
        }
        // Ours now: say who holds it, for the next one to name.
        // Best effort: a holder whose pid could not be written is named
        // "another process". Only a regular file of one link is written:
        // a lock someone replaced with a hard link to a file elsewhere, or
        // with a FIFO, still locks (flock does not change the file) but is
        // never truncated, so nothing outside the root is written.
        let own_file = cowlink_sys::fstat(&fd).is_ok_and(|st| {
            cowlink_sys::file_type(st.st_mode) == fs::FileType::RegularFile && st.st_nlink == 1
        });
        let f = std::fs::File::from(fd);
        if own_file {
            let pid = format!("{}\n", std::process::id());
            let _ = f.set_len(0);
            let _ = std::os::unix::fs::FileExt::write_all_at(&f, pid.as_bytes(), 0);
        }
        Ok(OwnedFd::from(f))
    }

    /// Every record: `(name, record)` in name order, and the records that
    /// could not be read (never acted on).
    pub fn records(&self) -> Result<(Records, Vec<Error>)> {
        let mut out = Vec::new();
        let mut bad = Vec::new();
        let dir = fs::Dir::read_from(&self.records).map_err(|e| err(self.path.join(RECORDS), e))?;
        for ent in dir {
            let ent = ent.map_err(|e| err(self.path.join(RECORDS), e))?;
            let file = ent.file_name().to_bytes();
            let Some(name) = file
                .strip_suffix(b".json")
                .and_then(|n| std::str::from_utf8(n).ok())
            else {
                continue;
            };
            if Stamp::parse(name).is_none() {
                continue;
            }
            let shown = self
                .path
                .join(RECORDS)
                .join(std::ffi::OsStr::from_bytes(file));
            match self.read(name) {
                Ok(r) => out.push((name.to_string(), r)),
                // Forgotten since the directory was read (a prune, or a
                // begin giving its name up): no record, not a bad one.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => bad.push(e.with_src(&shown)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((out, bad))
    }

    fn read(&self, name: &str) -> Result<Record> {
        let file = format!("{name}.json");
        let text = read_capped(self.records.as_fd(), &file, RECORD_CAP)
            .map_err(|e| not_a_file(Error::from_errno(Operation::Snapshot, e), e))?;
        let r: Record = serde_json::from_slice(&text).map_err(|e| {
            Error::new(Operation::Snapshot, ErrorKind::Corrupt)
                .with_reason(format!("not a snapshot record: {e}"))
        })?;
        if r.format != 1 {
            return Err(Error::new(Operation::Snapshot, ErrorKind::Corrupt)
                .with_reason(format!("record format {} is not 1", r.format)));
        }
        if r.base.as_deref().is_some_and(|b| Stamp::parse(b).is_none()) {
            return Err(Error::new(Operation::Snapshot, ErrorKind::Corrupt)
                .with_reason("the base is not a snapshot name"));
        }
        Ok(r)
    }

    /// Write `name`'s record durably.
    pub fn write(&self, name: &str, r: &Record) -> Result<()> {
        let file = format!("{name}.json");
        let mut text = serde_json::to_vec_pretty(r).expect("a record serializes");
        text.push(b'\n');
        write_atomic(self.records.as_fd(), &file, &text)
            .map_err(|e| err(self.path.join(RECORDS).join(&file), e))
    }

    /// Remove `name`'s record (after its snapshot is gone).
    pub fn forget(&self, name: &str) -> Result<()> {
        let file = format!("{name}.json");
        match fs::unlinkat(&self.records, file.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(err(self.path.join(RECORDS).join(&file), e)),
        }
        fs::fsync(&self.records).map_err(|e| err(self.path.join(RECORDS), e))
    }

    /// `ROOT/.cowlink/removing/`, made when `create`; `None` when it is
    /// missing and not to be made.
    pub fn aside(&self, create: bool) -> Result<Option<OwnedFd>> {
        open_dir_at(self.meta.as_fd(), ASIDE, &self.path.join(ASIDE), create)
    }

    /// `ROOT/.cowlink/blocks/<name>/`, where the block-hash records of
    /// that snapshot's files are kept.
    pub fn blocks_dir(&self, name: &str) -> PathBuf {
        self.path.join(BLOCKS).join(name)
    }

    /// Make `blocks/<name>/` if missing, each level opened without
    /// following a link.
    pub fn blocks_dir_create(&self, name: &str) -> Result<()> {
        let blocks = open_dir_at(self.meta.as_fd(), BLOCKS, &self.path.join(BLOCKS), true)?
            .expect("created when missing");
        open_dir_at(blocks.as_fd(), name, &self.blocks_dir(name), true)?;
        Ok(())
    }

    /// Remove the block-hash records of `name` (they describe files that
    /// are gone). They are plain files cowlink wrote, under a directory
    /// opened without following links.
    pub fn forget_blocks(&self, name: &str, cancel: &crate::run::CancelToken) -> Result<()> {
        let Some(blocks) = open_dir_at(self.meta.as_fd(), BLOCKS, &self.path.join(BLOCKS), false)?
        else {
            return Ok(());
        };
        match super::remove::remove_tree(blocks.as_fd(), name, &self.blocks_dir(name), cancel) {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}

/// `e` as `Corrupt` when [`read_capped`] failed because the file is not a
/// plain file of bookkeeping (a link, a directory, a FIFO, oversized):
/// someone put something else there, the same kind as a file that does
/// not parse.
fn not_a_file(e: Error, errno: Errno) -> Error {
    match errno {
        Errno::LOOP | Errno::ISDIR | Errno::INVAL | Errno::FBIG => e
            .with_kind(ErrorKind::Corrupt)
            .with_reason("not a plain file of this tool's bookkeeping (a symbolic link, a directory, a FIFO or device, or larger than any it writes)"),
        _ => e,
    }
}

/// Read the regular file `name` in `dir`, at most `cap` bytes (`EFBIG`
/// beyond), without following a link.
fn read_capped(dir: BorrowedFd<'_>, name: &str, cap: u64) -> std::result::Result<Vec<u8>, Errno> {
    let fd = fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = cowlink_sys::fstat(&fd)?;
    if cowlink_sys::file_type(st.st_mode) != fs::FileType::RegularFile {
        return Err(Errno::INVAL);
    }
    let mut out = Vec::new();
    std::fs::File::from(fd)
        .take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    if out.len() as u64 > cap {
        return Err(Errno::FBIG);
    }
    Ok(out)
}

/// Replace `name` in `dir` with `bytes`: a temporary, `fsync`, `rename`,
/// `fsync` of `dir`.
///
/// The temporary is always a new file (`O_EXCL`, after unlinking what a
/// crash or another user left by that name): opening an existing one
/// would truncate and write through a hard link to a file outside the
/// root, or block on a FIFO. One planted again between the unlink and
/// the open fails the write (`EEXIST`) instead.
fn write_atomic(dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> std::result::Result<(), Errno> {
    // A temporary name of this process and call alone: the format mark is
    // written before any lock is held, and two runs sharing one name
    // would truncate each other's file or rename it away under the other.
    // The cost: a crash between create and rename leaves a stray
    // `.NAME.tmp.PID.N` in the bookkeeping directory, never read.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = format!(".{name}.tmp.{}.{seq}", std::process::id());
    match fs::unlinkat(dir, tmp.as_str(), AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(e),
    }
    let fd = fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        cowlink_sys::raw_mode(0o644),
    )?;
    let mut f = std::fs::File::from(fd);
    let done = f
        .write_all(bytes)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
        .and_then(|()| fs::fsync(&f))
        .and_then(|()| fs::renameat(dir, tmp.as_str(), dir, name));
    if let Err(e) = done {
        let _ = fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    fs::fsync(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records are untrusted: links, non-files, oversized, malformed or
    /// unknown fields are reported and never read as snapshots; names that
    /// are not snapshot names are ignored.
    #[test]
    fn bad_records_are_reported_not_used() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::open(t.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let book = Book::open(root.as_fd(), t.path(), true).unwrap().unwrap();
        let good = Record {
            format: 1,
            state: State::Complete,
            kind: Kind::Tree,
            base: None,
            id: None,
            completed: Some(1),
        };
        let n = |i: u64| Stamp(1_700_000_000_000_000 + i).name();
        book.write(&n(0), &good).unwrap();
        let recs = t.path().join(".cowlink/records");
        let put = |i: u64, text: &[u8]| {
            std::fs::write(recs.join(format!("{}.json", n(i))), text).unwrap()
        };
        put(1, b"{not json");
        put(2, br#"{"format":2,"state":"complete","kind":"tree","base":null,"id":null,"completed":null}"#);
        put(3, br#"{"format":1,"state":"complete","kind":"tree","base":"../../etc","id":null,"completed":null}"#);
        put(4, br#"{"format":1,"state":"complete","kind":"tree","base":null,"id":null,"completed":null,"extra":1}"#);
        put(5, &vec![b' '; RECORD_CAP as usize + 1]);
        std::os::unix::fs::symlink("/etc/passwd", recs.join(format!("{}.json", n(6)))).unwrap();
        std::fs::create_dir(recs.join(format!("{}.json", n(7)))).unwrap();
        std::fs::write(recs.join("notes.json"), b"{}").unwrap();
        std::fs::write(recs.join(format!("{}.txt", n(8))), b"{}").unwrap();
        let (ok, bad) = book.records().unwrap();
        assert_eq!(ok, vec![(n(0), good)]);
        assert_eq!(bad.len(), 7, "{bad:?}");
        // The format mark of another version is refused.
        std::fs::write(
            t.path().join(".cowlink/snapshots"),
            b"cowlink snapshot set 2\n",
        )
        .unwrap();
        let e = Book::open(root.as_fd(), t.path(), true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        // A link in place of the bookkeeping directory is refused.
        let t2 = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(t.path().join(".cowlink"), t2.path().join(META)).unwrap();
        let root2 = fs::open(t2.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let e = Book::open(root2.as_fd(), t2.path(), true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
    }
}
