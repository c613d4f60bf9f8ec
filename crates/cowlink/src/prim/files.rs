//! Opening sources and naming destinations, with errors that say what is
//! wrong: the checks every feature makes before moving data.

use std::path::{Component, Path};

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::ground::error::{errno_text, Error, ErrorKind, Operation, Result};
use crate::ground::fskind::FsKind;

/// The longest path handed to one `open` (PATH_MAX is 4096 with its NUL).
const PATH_CHUNK: usize = 4000;

/// `open(path, flags)`, for paths longer than PATH_MAX too: those are
/// opened in pieces cut at a `/`, each relative to the directory the last
/// piece opened (how `cp -a` works, relative to descriptors). Symbolic
/// links in the directories are followed as `open` would; `flags` apply to
/// the last component.
pub(crate) fn open_deep(path: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() < PATH_CHUNK {
        return fs::open(path, flags, Mode::empty());
    }
    let mut dir: Option<OwnedFd> = None;
    let mut rest = bytes;
    while rest.len() >= PATH_CHUNK {
        let cut = rest[..PATH_CHUNK]
            .iter()
            .rposition(|&b| b == b'/')
            .ok_or(Errno::NAMETOOLONG)?;
        let piece: &[u8] = if cut == 0 { b"/" } else { &rest[..cut] };
        let at = dir.as_ref().map_or(fs::CWD, |d| d.as_fd());
        let next = fs::openat(
            at,
            piece,
            cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        dir = Some(next);
        rest = &rest[cut + 1..];
    }
    let at = dir.as_ref().map_or(fs::CWD, |d| d.as_fd());
    fs::openat(at, rest, flags, Mode::empty())
}

/// "a directory", "a FIFO", ...: a file type in words, for messages.
pub(crate) fn file_type_name(mode: u32) -> &'static str {
    match cowlink_sys::file_type(mode) {
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Symlink => "a symbolic link",
        FileType::RegularFile => "a regular file",
        FileType::Unknown => "of unknown type",
    }
}

/// Open `src` for reading as a regular file, with typed errors that say
/// what is wrong. Special files are rejected before they are opened
/// (opening a FIFO would block, a tape device might rewind).
pub(crate) fn open_source(op: Operation, src: &Path) -> Result<(OwnedFd, Stat)> {
    let err = |e: Errno| Error::from_errno(op, e).with_src(src);
    let st = match cowlink_sys::stat(src) {
        Ok(st) => st,
        Err(Errno::NOENT) => {
            let e = err(Errno::NOENT);
            return Err(match cowlink_sys::lstat(src) {
                Ok(l) if cowlink_sys::file_type(l.st_mode) == FileType::Symlink => {
                    e.with_reason("source is a dangling symbolic link")
                }
                _ => e.with_reason("source does not exist"),
            });
        }
        Err(Errno::LOOP) => {
            return Err(err(Errno::LOOP).with_reason("too many levels of symbolic links"))
        }
        Err(e) => return Err(err(e)),
    };
    check_regular(op, src, &st)?;
    let fd = fs::open(
        src,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ACCESS | Errno::PERM => err(e).with_reason("permission denied reading the source"),
        _ => err(e),
    })?;
    let st = cowlink_sys::fstat(&fd).map_err(err)?;
    // Replaced between stat and open? Check again on what we opened.
    check_regular(op, src, &st)?;
    Ok((fd, st))
}

fn check_regular(op: Operation, src: &Path, st: &Stat) -> Result<()> {
    match cowlink_sys::file_type(st.st_mode) {
        FileType::RegularFile => Ok(()),
        FileType::Directory => Err(Error::new(op, ErrorKind::IsDirectory)
            .with_src(src)
            .with_reason("source is a directory")),
        _ => Err(Error::new(op, ErrorKind::NotRegularFile)
            .with_src(src)
            .with_reason(format!(
                "source is {}; only regular files can be cloned",
                file_type_name(st.st_mode)
            ))),
    }
}

/// The directory a destination file path lives in; refuses paths that
/// name a directory (`dir/`, `.`, `..`).
pub(crate) fn split_dest(op: Operation, src: &Path, dst: &Path) -> Result<std::path::PathBuf> {
    let bad = |why: &str| {
        Error::new(op, ErrorKind::InvalidInput)
            .with_src(src)
            .with_dst(dst)
            .with_reason(why.to_string())
    };
    if dst.as_os_str().is_empty() {
        return Err(bad("empty destination path"));
    }
    match dst.components().next_back() {
        Some(Component::Normal(_)) if !dst.as_os_str().to_string_lossy().ends_with('/') => {
            let parent = match dst.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => ".".into(),
            };
            Ok(parent)
        }
        _ => Err(Error::new(op, ErrorKind::IsDirectory)
            .with_src(src)
            .with_dst(dst)
            .with_reason("destination names a directory, not a file")),
    }
}

/// The filesystem kind of an open file, for messages. Never fails.
pub(crate) fn kind_of(fd: BorrowedFd<'_>) -> FsKind {
    FsKind::of_fd(fd).unwrap_or(FsKind::Unknown)
}

pub(crate) fn create_reason(e: Errno, parent: &Path) -> String {
    match e {
        Errno::ACCESS | Errno::PERM => format!(
            "permission denied creating a file in {}",
            crate::name::quoted(parent)
        ),
        Errno::ROFS => format!(
            "{} is on a read-only filesystem",
            crate::name::quoted(parent)
        ),
        Errno::NOSPC | Errno::DQUOT => format!("no space left in {}", crate::name::quoted(parent)),
        _ => errno_text(e),
    }
}
