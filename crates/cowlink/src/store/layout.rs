//! The store's layout on disk: the marker, the lock, object and manifest
//! names (`objects/ab/<hex>[.gN]`, `manifests/<hex>`), opening the layout
//! without following symbolic links (`openat2` beneath the root), named
//! temporaries and their cleanup, and reading manifests back (`manifest`,
//! `manifests`, `list`). Every other stage goes through these functions
//! to touch the store's directories.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Dir, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::prim::place::{Overwrite, PendingFile};

use super::manifest::{Digest, FileTotals, Manifest, Streamed};
use super::{store_err, Store};

/// First line of the marker file.
pub(super) const MARKER: &str = "cowlink-store 1\n";
pub(crate) const MARKER_NAME: &str = "cowlink-store";
/// Names a store directory holds; anything else means "not a store".
pub(super) const LAYOUT: [&str; 6] = [
    "cowlink-store",
    "lock",
    "objects",
    "manifests",
    "tmp",
    "quarantine",
];

/// A regular file's name in `objects/`: its digest and generation.
pub(super) fn parse_object_name(name: &[u8]) -> Option<(Digest, u32)> {
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

pub(super) fn manifest_rel(d: &Digest) -> String {
    format!("manifests/{}", d.to_hex())
}

/// The suffix of a partly downloaded object in `tmp/`
/// (`tmp/<hex>.partial`): kept when a pull is cut off, so that the next
/// pull resumes it (`remote/partial.rs`). Never an object: only its
/// verified bytes are ever named under `objects/`.
pub(crate) const PARTIAL_SUFFIX: &str = ".partial";

/// How long [`Store::gc`] keeps a partly downloaded object that nothing
/// has written to: a pull killed and rerun within a day resumes, and a
/// store left alone longer gets its space back. Every write renews the
/// file's mtime, so a partial being written is never this old.
pub const PARTIAL_GRACE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The object a name in `tmp/` is the partial download of: exactly
/// `<64 hex digits>.partial`, nothing else.
pub(crate) fn parse_partial_name(name: &[u8]) -> Option<Digest> {
    let s = std::str::from_utf8(name).ok()?;
    let hex = s.strip_suffix(PARTIAL_SUFFIX)?;
    let d: Digest = hex.parse().ok()?;
    (d.to_hex() == hex).then_some(d)
}

/// Whether a temporary named `.HINT.cowlink-PID-N.tmp` belongs to a
/// process that no longer exists (in this PID namespace).
pub(super) fn temp_owner_is_dead(name: &[u8]) -> bool {
    let s = String::from_utf8_lossy(name);
    let Some(rest) = s.rsplit_once(".cowlink-").map(|(_, r)| r) else {
        return false;
    };
    let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    !cowlink_sys::process_exists(pid)
}

/// Open `rel` below `root` with `flags`, following no symbolic link on the
/// way (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): the one
/// way the store opens its own layout and checkout destinations.
pub(crate) fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
) -> std::result::Result<OwnedFd, Errno> {
    let open = |at: BorrowedFd<'_>, p: &str, flags: OFlags| {
        cowlink_sys::open_beneath(at, p, flags, Mode::empty())
    };
    if rel.len() < PATH_CHUNK {
        return open(root, if rel.is_empty() { "." } else { rel }, flags);
    }
    // Longer than the kernel takes at once (PATH_MAX): walk down in
    // pieces, each beneath the directory the last one opened, so a deep
    // tree works as `cp -a`'s does and nothing may escape either.
    let mut dir: Option<OwnedFd> = None;
    let mut rest = rel;
    while rest.len() >= PATH_CHUNK {
        // Cut at a '/' (a char boundary, whatever the bytes before it).
        let cut = rest.as_bytes()[..PATH_CHUNK]
            .iter()
            .rposition(|&b| b == b'/')
            .ok_or(Errno::NAMETOOLONG)?;
        let at = dir.as_ref().map_or(root, |d| d.as_fd());
        let next = open(at, &rest[..cut], cowlink_sys::O_PATH | OFlags::DIRECTORY)?;
        dir = Some(next);
        rest = &rest[cut + 1..];
    }
    let at = dir.as_ref().map_or(root, |d| d.as_fd());
    open(at, rest, flags)
}

/// The longest relative path handed to one `openat2` (PATH_MAX is 4096
/// with its NUL).
const PATH_CHUNK: usize = 4000;

/// What [`open_regular`] gives for a file that is no regular file (a
/// FIFO, a device, a socket).
pub(crate) const NOT_REGULAR: Errno = Errno::NODEV;

/// Open `rel` below `root` to read, only if it is a regular file: beneath
/// `root`, no symbolic link followed (`ELOOP` for one at the end),
/// `O_NONBLOCK | O_NOCTTY` so that a FIFO or a terminal cannot hang or
/// adopt us, then `fstat`: a directory is `EISDIR`, anything else not a
/// regular file [`NOT_REGULAR`]. The descriptor is returned blocking
/// again.
pub(crate) fn open_regular(root: BorrowedFd<'_>, rel: &str) -> std::result::Result<OwnedFd, Errno> {
    let fd = open_beneath(
        root,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
    )?;
    regular(fd)
}

/// `fd` if it is a regular file (with `O_NONBLOCK` cleared), else
/// `EISDIR` or [`NOT_REGULAR`].
pub(crate) fn regular(fd: OwnedFd) -> std::result::Result<OwnedFd, Errno> {
    match cowlink_sys::file_type(cowlink_sys::fstat(&fd)?.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(Errno::ISDIR),
        _ => return Err(NOT_REGULAR),
    }
    let flags = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path beyond PATH_MAX made of multi-byte names, with a character
    /// across the cut: opened in pieces without splitting a character.
    #[test]
    fn deep_paths_with_multibyte_names_open_in_pieces() {
        let root = std::env::temp_dir().join(format!("cowlink-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let name = "é".repeat(100); // 200 bytes, 2 per character
        let mut rel = String::new();
        let mut dir = fs::open(&root, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).unwrap();
        for i in 0..30 {
            // Shift the characters by one byte every other name: byte
            // 4000 then falls inside a character.
            let n = if i % 2 == 0 {
                format!("x{name}")
            } else {
                name.clone()
            };
            fs::mkdirat(&dir, n.as_str(), cowlink_sys::raw_mode(0o755)).unwrap();
            dir = fs::openat(
                &dir,
                n.as_str(),
                OFlags::DIRECTORY | OFlags::RDONLY,
                Mode::empty(),
            )
            .unwrap();
            if !rel.is_empty() {
                rel.push('/');
            }
            rel.push_str(&n);
        }
        assert!(rel.len() > 6000);
        assert!(
            !rel.is_char_boundary(PATH_CHUNK),
            "the cut must fall inside a character"
        );
        let top = fs::open(
            &root,
            cowlink_sys::O_PATH | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        let got = open_beneath(top.as_fd(), &rel, cowlink_sys::O_PATH | OFlags::DIRECTORY).unwrap();
        let (a, b) = (
            cowlink_sys::fstat(&got).unwrap(),
            cowlink_sys::fstat(&dir).unwrap(),
        );
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

/// The names in a directory, without `.` and `..`.
pub(super) fn list_dir(fd: BorrowedFd<'_>) -> std::result::Result<Vec<Vec<u8>>, Errno> {
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

pub(super) fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> std::result::Result<(), Errno> {
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

impl Store {
    /// Check the layout ([`check_layout`](Self::check_layout)) and open
    /// `tmp/`, where every temporary is made.
    pub(super) fn open_layout(&mut self) -> Result<()> {
        self.check_layout()?;
        let tmp = self
            .layout_dir("tmp")
            .map_err(|e| store_err(self.root.join("tmp"), e))?;
        self.tmp = Some(tmp);
        Ok(())
    }

    pub(super) fn init(&mut self) -> Result<()> {
        match cowlink_sys::statat(&self.dir, MARKER_NAME, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => {
                // A regular file, and no more of it than the marker's
                // length and one byte: anything else is not our marker.
                let text = open_regular(self.dir.as_fd(), MARKER_NAME)
                    .ok()
                    .and_then(|fd| {
                        let mut t = String::new();
                        let f =
                            std::io::Read::take(std::fs::File::from(fd), MARKER.len() as u64 + 1);
                        std::io::Read::read_to_string(&mut { f }, &mut t)
                            .ok()
                            .map(|_| t)
                    })
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
        let mkdir = |p: &str| match fs::mkdirat(&self.dir, p, cowlink_sys::raw_mode(0o755)) {
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
    pub(super) fn layout_dir(&self, rel: &str) -> std::result::Result<OwnedFd, Errno> {
        open_beneath(self.dir.as_fd(), rel, OFlags::RDONLY | OFlags::DIRECTORY)
    }

    /// Refuse a store whose layout is not what cowlink made: a symbolic
    /// link, or a file where a directory belongs (or the reverse). Such a
    /// store is reported and left alone; nothing in it is touched.
    pub(super) fn check_layout(&self) -> Result<()> {
        let tampered = |rel: &str, what: &str| {
            Error::new(Operation::Store, ErrorKind::Corrupt)
                .with_src(self.root.join(rel))
                .with_reason(format!(
                    "the store's layout was tampered with: '{rel}' is {what}; \
                     the store is left alone (repair or remove it by hand)"
                ))
        };
        let check = |rel: &str, dir: bool, required: bool| -> Result<()> {
            match cowlink_sys::statat(&self.dir, rel, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => {
                    let t = cowlink_sys::file_type(st.st_mode);
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

    pub(super) fn lock_fd(&self) -> Result<OwnedFd> {
        fs::openat(
            &self.dir,
            "lock",
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            cowlink_sys::raw_mode(0o644),
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
    pub(super) fn lock(&self, exclusive: bool) -> Result<OwnedFd> {
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
    pub(super) fn temporary(&self, hint: &str) -> Result<PendingFile<'_>> {
        let tmp = self.tmp.as_ref().expect("tmp/ is open once the store is");
        PendingFile::create_rw(
            tmp.as_fd(),
            Path::new("."),
            Path::new(hint),
            cowlink_sys::raw_mode(0o444),
        )
        .map_err(|e| {
            store_err(self.root.join("tmp"), e)
                .with_reason(crate::prim::files::create_reason(e, &self.root.join("tmp")))
        })
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
        let rel = manifest_rel(digest);
        let failed = |e: std::io::Error| {
            let errno = Errno::from_io_error(&e).unwrap_or(Errno::IO);
            match errno {
                Errno::NOENT => Error::from_errno(Operation::Manifest, errno)
                    .with_src(digest.to_hex())
                    .with_reason("the store has no manifest with this digest"),
                _ => self.read_error(Operation::Manifest, &rel, errno),
            }
        };
        let mismatch = || {
            Error::new(Operation::Manifest, ErrorKind::ContentChanged)
                .with_src(&path)
                .with_reason(
                    "the manifest's bytes do not match its digest (corrupt store: run verify)",
                )
        };
        let open = || -> std::io::Result<std::fs::File> {
            Ok(std::fs::File::from(self.open_in_layout(&rel)?))
        };
        // Read in chunks, hashed and parsed as they come: the whole text is
        // never held (see `Streamed`).
        let mut file = open().map_err(failed)?;
        let mut hasher = blake3::Hasher::new();
        let mut streamed = Streamed::default();
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let n = match std::io::Read::read(&mut file, &mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(failed(e)),
            };
            hasher.update(&chunk[..n]);
            streamed.feed(&chunk[..n]);
        }
        drop(chunk);
        if Digest(*hasher.finalize().as_bytes()) != *digest {
            return Err(mismatch());
        }
        let origin = digest.to_hex();
        if let Some(m) = streamed.finish() {
            m.validate(&origin, true)?;
            return Ok(m);
        }
        // Not in canonical form, or not a manifest: read whole, for the
        // general reader and its errors (checked against the digest again,
        // in case it changed since).
        let bytes = open()
            .and_then(|mut f| {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut f, &mut v).map(|_| v)
            })
            .map_err(failed)?;
        if Digest::of(&bytes) != *digest {
            return Err(mismatch());
        }
        // Valid, perhaps, but named by the digest of other bytes than its
        // canonical ones: refused (see `Manifest::from_canonical_bytes`).
        let m = Manifest::from_vec(bytes, &origin)?;
        m.require_canonical(*digest, &origin)?;
        Ok(m)
    }

    /// The stored bytes of the manifest `digest`, checked: they hash to
    /// `digest` and are the canonical form of a valid manifest. What a
    /// push uploads: the bytes as stored, never serialized again.
    ///
    /// # Errors
    /// As [`manifest`](Self::manifest).
    pub fn manifest_bytes(&self, digest: &Digest) -> Result<Vec<u8>> {
        let rel = manifest_rel(digest);
        let fd = self.open_in_layout(&rel).map_err(|e| match e {
            Errno::NOENT => Error::from_errno(Operation::Manifest, e)
                .with_src(digest.to_hex())
                .with_reason("the store has no manifest with this digest"),
            e => self.read_error(Operation::Manifest, &rel, e),
        })?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes)
            .map_err(|e| Error::from_io(Operation::Manifest, &e).with_src(self.root.join(&rel)))?;
        if Digest::of(&bytes) != *digest {
            return Err(Error::new(Operation::Manifest, ErrorKind::ContentChanged)
                .with_src(self.root.join(&rel))
                .with_reason(
                    "the manifest's bytes do not match its digest (corrupt store: run verify)",
                ));
        }
        Manifest::from_canonical_bytes(&bytes, &digest.to_hex())?;
        Ok(bytes)
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
    pub(super) fn object_files(&self) -> Result<Vec<(Digest, u32, String)>> {
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

    /// The layout directory holding `rel` (opened without following
    /// symbolic links) and the last component of `rel`.
    pub(super) fn parent_in_layout<'r>(
        &self,
        rel: &'r str,
    ) -> std::result::Result<(OwnedFd, &'r str), Errno> {
        let (parent, name) = rel.rsplit_once('/').unwrap_or((".", rel));
        Ok((self.layout_dir(parent)?, name))
    }

    /// Open the file `rel` of the layout to read: the one way the store
    /// reads its own files (objects, manifests, the marker). Beneath the
    /// root, following no symbolic link on the way or at the end
    /// (`ELOOP`), `O_NONBLOCK` (a FIFO planted at the name cannot hang
    /// the open) and `O_NOCTTY`, and only a regular file: anything else
    /// is [`NOT_REGULAR`] (`EISDIR` for a directory), told apart for
    /// messages by [`read_error`](Self::read_error). `O_NONBLOCK` is
    /// cleared once the file is known to be regular.
    pub(crate) fn open_in_layout(&self, rel: &str) -> std::result::Result<OwnedFd, Errno> {
        open_regular(self.dir.as_fd(), rel)
    }

    /// The error for `rel` that [`open_in_layout`](Self::open_in_layout)
    /// (or a read) failed with `errno`: a file that is not a regular file
    /// (or is a symbolic link) is a damaged store ([`ErrorKind::Corrupt`],
    /// naming what it is); anything else as the errno says.
    pub(crate) fn read_error(&self, op: Operation, rel: &str, errno: Errno) -> Error {
        let path = self.root.join(rel);
        let odd = match errno {
            NOT_REGULAR | Errno::LOOP | Errno::ISDIR => {
                cowlink_sys::statat(&self.dir, rel, AtFlags::SYMLINK_NOFOLLOW)
                    .ok()
                    .filter(|st| cowlink_sys::file_type(st.st_mode) != FileType::RegularFile)
            }
            _ => None,
        };
        match odd {
            Some(st) => Error::new(op, ErrorKind::Corrupt)
                .with_src(path)
                .with_reason(format!(
                    "{}, not a regular file: the store is damaged (`cowlink store verify` \
                 moves it to quarantine/)",
                    crate::prim::files::file_type_name(st.st_mode)
                )),
            None => Error::from_errno(op, errno).with_src(path),
        }
    }
    /// Name a finished object `digest` generation `gen`; `EEXIST` when the
    /// store has it already.
    pub(super) fn persist_object(
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
    pub(super) fn unlink_in_layout(&self, rel: &str) -> std::result::Result<(), Errno> {
        let (dir, name) = self.parent_in_layout(rel)?;
        fs::unlinkat(&dir, name, AtFlags::empty())
    }

    /// Remove named temporaries in `tmp/`: all of them (`all`, under the
    /// exclusive lock) or those whose process is gone. Partial downloads
    /// (`<hex>.partial`) are not temporaries: they outlive their process
    /// on purpose, and only [`clean_partials`](Self::clean_partials)
    /// removes them.
    pub(super) fn clean_temporaries(&self, all: bool) -> Result<u64> {
        let fd = match self.layout_dir("tmp") {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(0),
            Err(e) => return Err(store_err(self.root.join("tmp"), e)),
        };
        let mut n = 0;
        for name in list_dir(fd.as_fd()).map_err(|e| store_err(self.root.join("tmp"), e))? {
            if parse_partial_name(&name).is_some() {
                continue;
            }
            if all || temp_owner_is_dead(&name) {
                match fs::unlinkat(&fd, name.as_slice(), AtFlags::empty()) {
                    Ok(()) => n += 1,
                    Err(Errno::NOENT) => {}
                    // Not ours to remove (another user's store), or a
                    // directory: leave it.
                    Err(Errno::ACCESS | Errno::PERM | Errno::ROFS | Errno::ISDIR) => {}
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

    /// Remove the partial downloads in `tmp/` that nothing wrote to for
    /// [`PARTIAL_GRACE`], and any file at a partial's name that is not a
    /// regular file (looked at with `lstat` only, never opened or
    /// followed; a directory is left alone). Called under the exclusive
    /// lock, when no pull of this store runs. The count and the bytes
    /// removed.
    pub(super) fn clean_partials(&self) -> Result<(u64, u64)> {
        let fd = match self.layout_dir("tmp") {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok((0, 0)),
            Err(e) => return Err(store_err(self.root.join("tmp"), e)),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let stale = now.saturating_sub(PARTIAL_GRACE.as_secs());
        let (mut n, mut bytes) = (0, 0);
        for name in list_dir(fd.as_fd()).map_err(|e| store_err(self.root.join("tmp"), e))? {
            if parse_partial_name(&name).is_none() {
                continue;
            }
            let Ok(st) = fs::statat(&fd, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let t = FileType::from_raw_mode(st.st_mode);
            let old = u64::try_from(st.st_mtime).unwrap_or(0) < stale;
            if t == FileType::Directory || (t == FileType::RegularFile && !old) {
                continue;
            }
            match fs::unlinkat(&fd, name.as_slice(), AtFlags::empty()) {
                Ok(()) => {
                    n += 1;
                    if t == FileType::RegularFile {
                        bytes += st.st_size as u64;
                    }
                }
                Err(Errno::NOENT | Errno::ACCESS | Errno::PERM | Errno::ROFS | Errno::ISDIR) => {}
                Err(e) => {
                    return Err(store_err(
                        self.root.join("tmp").join(OsStr::from_bytes(&name)),
                        e,
                    ))
                }
            }
        }
        Ok((n, bytes))
    }

    /// Every manifest with what it holds, sorted by digest: the entries,
    /// the files and their bytes, and when it was stored. A manifest that
    /// cannot be read is listed with its error instead of failing the list.
    ///
    /// # Errors
    /// Only when the `manifests/` directory itself cannot be read.
    pub fn list(&self) -> Result<Vec<ManifestInfo>> {
        let mut out = Vec::new();
        for digest in self.manifests()? {
            let stored =
                cowlink_sys::statat(&self.dir, manifest_rel(&digest), AtFlags::SYMLINK_NOFOLLOW)
                    .ok()
                    .map(|st| st.st_mtime.max(0) as u64);
            let mut info = ManifestInfo {
                digest,
                stored,
                entries: 0,
                totals: FileTotals::default(),
                error: None,
            };
            match self.manifest(&digest) {
                Ok(m) => {
                    info.entries = m.entries.len() as u64;
                    info.totals = m.file_totals();
                }
                Err(e) => info.error = Some(e),
            }
            out.push(info);
        }
        Ok(out)
    }
}

/// One manifest of [`Store::list`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ManifestInfo {
    /// Its digest (the name to check out).
    pub digest: Digest,
    /// When it was stored, in seconds since the epoch (its file's mtime).
    pub stored: Option<u64>,
    /// Entries (files, directories, symbolic links).
    pub entries: u64,
    /// Its regular files and their bytes.
    #[serde(flatten)]
    pub totals: FileTotals,
    /// Why it could not be read (then the counts are 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Error>,
}
