//! Cloning a whole file ([`clone_file`]) or a byte range ([`clone_range`]).
//!
//! `clone_file` is a small state machine: try `FICLONE`; when the kernel
//! says "not possible here" and the mode allows it, copy instead
//! (`prim::transfer`); report the method actually used. The destination is
//! written through `prim::place::PendingFile`, so it appears complete,
//! with its metadata, or not at all.

#[cfg(unix)]
use std::path::Path;

#[cfg(unix)]
use cowlink_sys::Stat;
#[cfg(unix)]
use rustix::fd::AsFd;
#[cfg(unix)]
use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, CWD};
#[cfg(unix)]
use rustix::io::Errno;

#[cfg(unix)]
use crate::ground::error::{errno_text, Error, ErrorKind, Operation, Result};
#[cfg(unix)]
use crate::prim::files::{create_reason, file_type_name, open_source, split_dest};
#[cfg(unix)]
use crate::prim::meta;
use crate::prim::meta::Preserve;
use crate::prim::mode::{LinkMode, Sparse};
#[cfg(unix)]
use crate::prim::mode::{Method, Outcome};
#[cfg(unix)]
use crate::prim::place::{left_unfinished, place_name, NewFile, UNFINISHED_MARK};
use crate::prim::place::{Overwrite, Placement};
#[cfg(unix)]
use crate::prim::transfer::{transfer, transfer_error, Source};

/// Options for [`clone_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CloneOptions {
    /// How the file is placed: [`LinkMode::Auto`] by default (clone where
    /// possible, else copy); [`LinkMode::Hardlink`] links the destination
    /// to the source's inode (metadata and `attributes_only` do not apply).
    pub link: LinkMode,
    /// What to do when the destination exists.
    pub overwrite: Overwrite,
    /// Metadata to carry beyond permission bits.
    pub preserve: Preserve,
    /// Carry only the metadata, no data (`cp --attributes-only`): a new
    /// destination is created empty; an existing regular file keeps its
    /// content and gets the metadata `preserve` names.
    pub attributes_only: bool,
    /// New files and directories get the mode a new file or directory gets
    /// (`0666` or `0777`, less the umask) instead of the source's
    /// permission bits (`cp --no-preserve=mode`, say to get a writable
    /// copy of a read-only tree). Ignored with `preserve.mode`; a replaced
    /// file keeps its old mode either way.
    pub default_mode: bool,
    /// How [`clone_file`] brings a new name into being.
    /// [`Placement::Atomic`] (the default): an unnamed file linked into
    /// place when complete, so the name is complete or absent even after a
    /// crash. [`Placement::Direct`]: created under its final name (with
    /// `O_EXCL`, so never over anything) carrying the unfinished mark until
    /// its final mode is set, and removed on any error; a `SIGKILL` or
    /// power cut can leave it partial, marked. Direct is cheaper per file
    /// (no `O_TMPFILE` bookkeeping): for callers that place many small
    /// files in a directory they own. Replacing an existing name is atomic
    /// either way. A tree copy chooses per directory instead (see
    /// `TreeOptions::atomic`).
    pub placement: Placement,
    /// How a data copy treats holes (`cp --sparse`); a clone keeps the
    /// source's layout whatever this says. [`Sparse::Auto`] by default.
    pub sparse: Sparse,
}

impl Default for CloneOptions {
    /// Clone where possible, else copy ([`LinkMode::Auto`]); refuse an
    /// existing destination; permission bits only; atomic placement.
    fn default() -> Self {
        CloneOptions {
            link: LinkMode::Auto,
            overwrite: Overwrite::default(),
            preserve: Preserve::default(),
            attributes_only: false,
            default_mode: false,
            placement: Placement::default(),
            sparse: Sparse::Auto,
        }
    }
}

/// Clone `src` to the new file `dst`, or copy it when `options.reflink`
/// allows and cloning is not possible here.
///
/// `dst` is the full destination file name (not a directory to copy into).
/// The data goes to an unnamed temporary in `dst`'s directory and is linked
/// into place only when complete and its metadata set, so after any error
/// there is nothing under `dst` (or the old `dst` is untouched) and no
/// temporary is left.
///
/// # Errors
/// Typed by [`ErrorKind`]: `NotFound` (missing or dangling source, missing
/// destination directory), `IsDirectory`, `NotRegularFile` (FIFO, device,
/// socket), `PermissionDenied`, `AlreadyExists` (unless
/// [`Overwrite::Replace`]), `SameFile`, `CrossDevice` and `NotSupported`
/// (with [`LinkMode::Clone`] or [`LinkMode::Hardlink`] only), `NoSpace`, `ReadOnly`, `Io`.
///
/// Uses `ioctl(FICLONE)`, then `copy_file_range(2)` and `pread`/`pwrite`.
#[cfg(unix)]
pub fn clone_file(
    src: impl AsRef<Path>,
    dst: impl AsRef<Path>,
    options: &CloneOptions,
) -> Result<Outcome> {
    match place_file(src.as_ref(), dst.as_ref(), options) {
        // Keeping what exists is this mode's answer, not a failure.
        Err(e) if e.kind() == ErrorKind::AlreadyExists && options.overwrite == Overwrite::Skip => {
            Ok(Outcome {
                method: Method::Skipped,
                bytes: 0,
            })
        }
        r => r,
    }
}

#[cfg(unix)]
fn place_file(src: &Path, dst: &Path, options: &CloneOptions) -> Result<Outcome> {
    let op = match options.link {
        LinkMode::Copy => Operation::Copy,
        _ => Operation::Clone,
    };
    let err = |e: Errno| Error::from_errno(op, e).with_src(src).with_dst(dst);

    let (src_fd, st) = open_source(op, src).map_err(|e| e.with_dst(dst))?;
    let parent = split_dest(op, src, dst)?;
    if options.attributes_only && options.overwrite == Overwrite::Replace {
        if let Some(old) = replaced_regular(dst, options.overwrite) {
            if (old.st_dev, old.st_ino) == (st.st_dev, st.st_ino) {
                return Ok(Outcome {
                    method: Method::Skipped,
                    bytes: 0,
                });
            }
            let dfd = fs::open(
                dst,
                OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(err)?;
            meta::apply(src_fd.as_fd(), &st, dfd.as_fd(), options.preserve).map_err(|m| {
                err(m.errno).with_reason(format!("cannot {}: {}", m.what, errno_text(m.errno)))
            })?;
            return Ok(Outcome {
                method: Method::ReadWrite,
                bytes: 0,
            });
        }
    }
    // Refusing an existing destination needs no check before a clone (the
    // final link fails atomically, and a clone costs nothing), only before
    // a data copy. Replacing needs one: never replace a directory or the
    // source itself.
    let precheck = || check_existing(op, src, dst, &st, &parent, options.overwrite);
    if options.overwrite == Overwrite::Replace {
        precheck()?;
    }
    if options.link == LinkMode::Hardlink {
        return hardlink(src, dst, &st, &parent, options.overwrite, &err);
    }
    // Direct placement only for a new name: replacing is always atomic.
    let placement = match options.overwrite {
        Overwrite::Replace => Placement::Atomic,
        Overwrite::Refuse | Overwrite::Skip => options.placement,
    };
    let direct = placement == Placement::Direct;
    // Created writable by its owner, so that extended attributes can be
    // set on a copy of a read-only file; the final mode is set below. A
    // file under its final name carries the unfinished mark until then.
    let want = meta::creation_bits(st.st_mode, options.default_mode && !options.preserve.mode);
    let mark = if direct { UNFINISHED_MARK } else { 0 };
    let pending = NewFile::create(
        CWD,
        &parent,
        dst,
        cowlink_sys::raw_mode(want | 0o200 | mark),
        placement,
        dst,
    )
    .map_err(|e| match e {
        Errno::EXIST => precheck()
            .err()
            .unwrap_or_else(|| err(e).with_reason("destination already exists")),
        Errno::NOENT => err(e).with_reason(format!(
            "directory {} does not exist",
            crate::name::quoted(&parent)
        )),
        Errno::NOTDIR => err(e).with_reason(format!(
            "{} is not a directory",
            crate::name::quoted(&parent)
        )),
        _ => err(e).with_reason(create_reason(e, &parent)),
    })?;
    let (sfd, dfd) = (src_fd.as_fd(), pending.fd());
    let before_copy = || match options.overwrite {
        // A direct file already holds the name: nothing to re-check.
        Overwrite::Refuse | Overwrite::Skip if !direct => precheck(),
        _ => Ok(()),
    };
    let failed = |e: Errno| transfer_error(op, src, dst, e, sfd, dfd);
    let done = if options.attributes_only {
        before_copy()?;
        Outcome {
            method: Method::ReadWrite,
            bytes: 0,
        }
    } else {
        transfer(
            sfd,
            dfd,
            Source::of(&st).with_sparse(options.sparse),
            options.link,
            &before_copy,
            &failed,
            &|| false,
        )?
    };
    meta::apply(sfd, &st, dfd, options.preserve).map_err(|m| {
        err(m.errno).with_reason(format!("cannot {}: {}", m.what, errno_text(m.errno)))
    })?;
    if !options.preserve.mode {
        // GNU cp's visible result: a file written over an existing one
        // keeps that file's permission bits (and, for root, its owner);
        // a new file gets the source's, less the umask.
        let mode = match replaced_regular(dst, options.overwrite) {
            Some(old) => {
                if rustix::process::geteuid().is_root() {
                    let _ = fs::fchown(
                        dfd,
                        Some(rustix::fs::Uid::from_raw(old.st_uid)),
                        Some(rustix::fs::Gid::from_raw(old.st_gid)),
                    );
                }
                Some(crate::prim::place::kept_mode(st.st_mode, old.st_mode))
            }
            None if direct || want & 0o200 == 0 => Some(want & !meta::umask().unwrap_or(0o022)),
            None => None,
        };
        if let Some(mode) = mode {
            fs::fchmod(dfd, cowlink_sys::raw_mode(mode)).map_err(|e| {
                err(e).with_reason(format!("cannot set the mode: {}", errno_text(e)))
            })?;
        }
    }
    pending
        .commit(dst, options.overwrite)
        .map_err(|e| match e {
            // Say why precisely: exists, is a directory, or is the source.
            Errno::EXIST => precheck()
                .err()
                .unwrap_or_else(|| err(e).with_reason("destination already exists")),
            Errno::ISDIR => err(e).with_reason("destination is a directory"),
            _ => err(e),
        })?;
    Ok(Outcome {
        method: done.method,
        bytes: done.bytes,
    })
}

/// The regular file `dst` that this call is about to replace, if any.
#[cfg(unix)]
fn replaced_regular(dst: &Path, overwrite: Overwrite) -> Option<Stat> {
    if overwrite != Overwrite::Replace {
        return None;
    }
    cowlink_sys::statat(CWD, dst, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .filter(|s| cowlink_sys::file_type(s.st_mode) == FileType::RegularFile)
}

/// Refuse early (before moving any data) when the destination exists and
/// may not be replaced, is a directory, or is the source itself. The final
/// link or rename re-checks atomically; this only avoids wasted work.
/// [`LinkMode::Hardlink`]: `dst` becomes another name of the source's
/// inode (symbolic links in `src` followed, as for a copy), at once, or
/// with [`Overwrite::Replace`] at a temporary name renamed over the old
/// one. Metadata is the source's own: nothing to preserve or set.
#[cfg(unix)]
fn hardlink(
    src: &Path,
    dst: &Path,
    st: &Stat,
    parent: &Path,
    overwrite: Overwrite,
    err: &dyn Fn(Errno) -> Error,
) -> Result<Outcome> {
    use std::os::unix::ffi::OsStrExt;
    let dir = fs::open(
        parent,
        cowlink_sys::O_PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err(e).with_reason(create_reason(e, parent)))?;
    let name = dst.file_name().unwrap_or_default().as_bytes();
    let name = std::ffi::CString::new(name).map_err(|_| err(Errno::INVAL))?;
    let replace = overwrite == Overwrite::Replace;
    place_name(dir.as_fd(), &name, replace, |d, n| {
        fs::linkat(CWD, src, d, n, AtFlags::SYMLINK_FOLLOW)
    })
    .map_err(|e| match e {
        Errno::EXIST => err(e).with_reason("destination already exists"),
        Errno::XDEV => err(e).with_reason("a hardlink cannot cross filesystems"),
        Errno::MLINK => err(e).with_reason("the source has the most links its filesystem allows"),
        _ => err(e),
    })?;
    Ok(Outcome {
        method: Method::Hardlink,
        bytes: st.st_size as u64,
    })
}

#[cfg(unix)]
fn check_existing(
    op: Operation,
    src: &Path,
    dst: &Path,
    st: &Stat,
    parent: &Path,
    overwrite: Overwrite,
) -> Result<()> {
    let e = |kind: ErrorKind, why: &str| {
        Error::new(op, kind)
            .with_src(src)
            .with_dst(dst)
            .with_reason(why.to_string())
    };
    let existing = match cowlink_sys::statat(CWD, dst, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(Errno::NOENT) => return Ok(()),
        Err(Errno::NOTDIR) => {
            return Err(Error::from_errno(op, Errno::NOTDIR)
                .with_src(src)
                .with_dst(dst)
                .with_reason(format!(
                    "{} is not a directory",
                    crate::name::quoted(parent)
                )))
        }
        Err(errno) => return Err(Error::from_errno(op, errno).with_src(src).with_dst(dst)),
    };
    // Same file, directly or through a symlink at the destination.
    let target = cowlink_sys::statat(CWD, dst, AtFlags::empty()).unwrap_or(existing);
    if (target.st_dev, target.st_ino) == (st.st_dev, st.st_ino) {
        return Err(e(
            ErrorKind::SameFile,
            "source and destination are the same file",
        ));
    }
    if cowlink_sys::file_type(existing.st_mode) == FileType::Directory {
        return Err(e(
            ErrorKind::IsDirectory,
            "destination is an existing directory",
        ));
    }
    match overwrite {
        Overwrite::Refuse | Overwrite::Skip if left_unfinished(st.st_mode, existing.st_mode) => {
            Err(e(
                ErrorKind::AlreadyExists,
                "destination already exists, and carries the mark of a copy an interrupted \
                 run left unfinished (the sticky bit): replace it or remove it",
            ))
        }
        Overwrite::Refuse | Overwrite::Skip => {
            Err(e(ErrorKind::AlreadyExists, "destination already exists"))
        }
        Overwrite::Replace => Ok(()),
    }
}

/// Make `len` bytes of the existing file `dst` at `dst_offset` share the
/// blocks of `src` at `src_offset` (`ioctl(FICLONERANGE)`).
///
/// `len == 0` means "to the end of `src`". Both offsets must be multiples of
/// the destination filesystem's block size, and so must `len` unless the
/// range ends exactly at the end of `src`. `dst` must already exist; it is
/// written in place (this is the primitive for merging image deltas, not an
/// atomic copy). There is no fallback: a range is cloned or nothing changes.
///
/// # Errors
/// `Unaligned` (naming the block size), `CrossDevice`, `NotSupported`,
/// `NotFound`, `IsDirectory`, `NotRegularFile`, `PermissionDenied`,
/// `InvalidInput` (range past the end of `src`, overlapping ranges in one
/// file), `NoSpace`, `Io`.
#[cfg(unix)]
pub fn clone_range(
    src: impl AsRef<Path>,
    src_offset: u64,
    dst: impl AsRef<Path>,
    dst_offset: u64,
    len: u64,
) -> Result<Outcome> {
    let (src, dst) = (src.as_ref(), dst.as_ref());
    let op = Operation::CloneRange;
    let err = |e: Errno| Error::from_errno(op, e).with_src(src).with_dst(dst);
    let (src_fd, st) = open_source(op, src).map_err(|e| e.with_dst(dst))?;
    let dst_fd = fs::open(
        dst,
        OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT => err(e)
            .with_reason("destination does not exist (range cloning writes into an existing file)"),
        Errno::ISDIR => err(e).with_reason("destination is a directory"),
        _ => err(e),
    })?;
    let dst_st = cowlink_sys::fstat(&dst_fd).map_err(err)?;
    if cowlink_sys::file_type(dst_st.st_mode) != FileType::RegularFile {
        return Err(Error::new(op, ErrorKind::NotRegularFile)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!("destination is {}", file_type_name(dst_st.st_mode))));
    }
    let src_size = st.st_size as u64;
    let block = cowlink_sys::fs_stat(dst_fd.as_fd())
        .map_err(err)?
        .block_size;
    let effective_len = if len == 0 {
        src_size.saturating_sub(src_offset)
    } else {
        len
    };
    let ends_at_eof = src_offset.checked_add(effective_len) == Some(src_size);
    let unaligned = |what: String| {
        Error::new(op, ErrorKind::Unaligned)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!(
                "{what} is not a multiple of the filesystem block size ({block} bytes); \
                 offsets must be aligned, and the length too unless the range ends at the end of the source"
            ))
    };
    if block > 0 {
        if src_offset % block != 0 {
            return Err(unaligned(format!("source offset {src_offset}")));
        }
        if dst_offset % block != 0 {
            return Err(unaligned(format!("destination offset {dst_offset}")));
        }
        if effective_len % block != 0 && !ends_at_eof {
            return Err(unaligned(format!("length {effective_len}")));
        }
    }
    if src_offset
        .checked_add(effective_len)
        .is_none_or(|end| end > src_size)
    {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(src)
            .with_dst(dst)
            .with_reason(format!(
                "range {src_offset}+{effective_len} goes past the end of the source ({src_size} bytes)"
            )));
    }
    match cowlink_sys::ficlonerange(dst_fd.as_fd(), src_fd.as_fd(), src_offset, len, dst_offset) {
        Ok(()) => Ok(Outcome {
            method: Method::Reflink,
            bytes: effective_len,
        }),
        Err(Errno::INVAL) if block > 0 && effective_len % block != 0 => Err(unaligned(format!(
            "length {effective_len} (an unaligned tail may only be cloned to the end of the destination)"
        ))),
        Err(e) => Err(transfer_error(op, src, dst, e, src_fd.as_fd(), dst_fd.as_fd())),
    }
}

#[cfg(test)]
mod tests {
    //! `clone_file` and `clone_range` where cloning is not possible: a
    //! tmpfs directory (`/dev/shm`), which needs neither root nor the test
    //! filesystems. What cloning does on XFS and Btrfs is tested in the
    //! integration tests on the loop-mounted filesystems.
    use super::*;
    use crate::prim::place::Overwrite;
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};

    /// A fresh directory on tmpfs, which cannot clone.
    fn shm() -> tempfile::TempDir {
        let d = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let magic = fs::statfs(d.path()).unwrap().f_type as u64;
        assert_eq!(magic, 0x0102_1994, "/dev/shm is not tmpfs");
        d
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    /// Nothing in `dir` but `names`: no temporary, no partial file.
    fn only(dir: &Path, names: &[&str]) {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        assert_eq!(v, names, "what {} holds", dir.display());
    }

    fn opts(link: LinkMode) -> CloneOptions {
        CloneOptions {
            link,
            ..Default::default()
        }
    }

    #[test]
    fn auto_copies_where_cloning_is_not_possible_and_says_so() {
        let d = shm();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let data = bytes(300_001, 7);
        std::fs::write(&a, &data).unwrap();
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o640)).unwrap();
        let out = clone_file(&a, &b, &opts(LinkMode::Auto)).unwrap();
        assert!(
            matches!(out.method, Method::CopyOffload | Method::ReadWrite),
            "{out:?}"
        );
        assert_eq!(out.bytes, data.len() as u64);
        assert!(std::fs::read(&b).unwrap() == data);
        assert_eq!(std::fs::metadata(&b).unwrap().mode() & 0o7777, 0o640);
        only(d.path(), &["a", "b"]);
        // Never: a copy of its own, by read/write (copy_file_range could
        // share blocks elsewhere).
        let c = d.path().join("c");
        let out = clone_file(&a, &c, &opts(LinkMode::Copy)).unwrap();
        assert_eq!(
            out,
            Outcome {
                method: Method::ReadWrite,
                bytes: data.len() as u64
            }
        );
        assert!(std::fs::read(&c).unwrap() == data);
    }

    #[test]
    fn always_fails_with_the_typed_kind_and_leaves_nothing() {
        let d = shm();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&a, bytes(10_000, 1)).unwrap();
        let e = clone_file(&a, &b, &opts(LinkMode::Clone)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
        assert_eq!(e.src(), Some(a.as_path()));
        assert_eq!(e.dst(), Some(b.as_path()));
        assert!(
            e.reason().contains("tmpfs"),
            "the reason names the filesystem: {e}"
        );
        only(d.path(), &["a"]);
        // An existing destination is left as it was.
        std::fs::write(&b, b"old").unwrap();
        let o = CloneOptions {
            overwrite: Overwrite::Replace,
            ..opts(LinkMode::Clone)
        };
        assert_eq!(
            clone_file(&a, &b, &o).unwrap_err().kind(),
            ErrorKind::NotSupported
        );
        assert_eq!(std::fs::read(&b).unwrap(), b"old");
        only(d.path(), &["a", "b"]);
    }

    #[test]
    fn sparse_files_keep_their_holes_and_empty_files_copy() {
        let d = shm();
        let (a, b) = (d.path().join("sparse"), d.path().join("copy"));
        let f = std::fs::File::create(&a).unwrap();
        f.write_all_at(&bytes(4096, 2), 0).unwrap();
        f.write_all_at(&bytes(8192, 3), 1 << 20).unwrap();
        f.set_len(3 << 20).unwrap(); // a trailing hole
        drop(f);
        for link in [LinkMode::Auto, LinkMode::Copy] {
            let _ = std::fs::remove_file(&b);
            let out = clone_file(&a, &b, &opts(link)).unwrap();
            assert_eq!(out.bytes, 3 << 20);
            assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
            let m = std::fs::metadata(&b).unwrap();
            assert_eq!(m.len(), 3 << 20);
            assert!(
                m.blocks() * 512 <= 64 * 1024,
                "{link:?}: the holes were filled ({} blocks)",
                m.blocks()
            );
        }
        // Zero bytes.
        let (e, e2) = (d.path().join("empty"), d.path().join("empty2"));
        std::fs::write(&e, b"").unwrap();
        let out = clone_file(&e, &e2, &opts(LinkMode::Auto)).unwrap();
        assert_eq!(out.bytes, 0);
        assert_eq!(std::fs::metadata(&e2).unwrap().len(), 0);
    }

    #[test]
    fn what_cannot_be_copied_is_refused_by_kind() {
        let d = shm();
        let p = |n: &str| d.path().join(n);
        std::fs::write(p("a"), b"x").unwrap();
        std::fs::create_dir(p("dir")).unwrap();
        fs::mknodat(
            CWD,
            p("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        std::os::unix::fs::symlink("nowhere", p("dangling")).unwrap();
        for (src, dst, kind) in [
            ("missing", "x", ErrorKind::NotFound),
            ("dangling", "x", ErrorKind::NotFound),
            ("dir", "x", ErrorKind::IsDirectory),
            ("fifo", "x", ErrorKind::NotRegularFile),
            ("a", "no/such/dir", ErrorKind::NotFound),
            ("a", "a", ErrorKind::SameFile),
        ] {
            let e = clone_file(p(src), p(dst), &opts(LinkMode::Auto)).unwrap_err();
            assert_eq!(e.kind(), kind, "{src} -> {dst}: {e}");
        }
        // Replacing a file with itself is refused too, not a truncation.
        let o = CloneOptions {
            overwrite: Overwrite::Replace,
            ..opts(LinkMode::Auto)
        };
        let e = clone_file(p("a"), p("a"), &o).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SameFile, "{e}");
        assert_eq!(std::fs::read(p("a")).unwrap(), b"x");
        // Skip: kept, and said so.
        std::fs::write(p("b"), b"old").unwrap();
        let o = CloneOptions {
            overwrite: Overwrite::Skip,
            ..opts(LinkMode::Auto)
        };
        let out = clone_file(p("a"), p("b"), &o).unwrap();
        assert_eq!(
            out,
            Outcome {
                method: Method::Skipped,
                bytes: 0
            }
        );
        assert_eq!(std::fs::read(p("b")).unwrap(), b"old");
        only(d.path(), &["a", "b", "dangling", "dir", "fifo"]);
    }

    #[test]
    fn range_clones_check_alignment_and_bounds_before_the_kernel() {
        let d = shm();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&a, bytes(3 * 4096 + 100, 4)).unwrap();
        let old = bytes(8192, 5);
        std::fs::write(&b, &old).unwrap();
        let kind =
            |so: u64, dof: u64, len: u64| clone_range(&a, so, &b, dof, len).unwrap_err().kind();
        // tmpfs blocks are 4 KiB.
        assert_eq!(kind(100, 0, 4096), ErrorKind::Unaligned);
        assert_eq!(kind(0, 100, 4096), ErrorKind::Unaligned);
        assert_eq!(kind(0, 0, 100), ErrorKind::Unaligned);
        // Past the end of the source, and offsets that overflow.
        assert_eq!(kind(0, 0, 4 * 4096), ErrorKind::InvalidInput);
        assert_eq!(kind(4 * 4096, 0, 4096), ErrorKind::InvalidInput);
        assert_eq!(kind(u64::MAX - 4095, 0, 4096), ErrorKind::InvalidInput);
        assert_eq!(kind(4096, 0, u64::MAX - 4095), ErrorKind::InvalidInput);
        // In bounds and aligned, or to the end with an unaligned tail: the
        // kernel is asked, and tmpfs cannot.
        assert_eq!(kind(0, 0, 4096), ErrorKind::NotSupported);
        assert_eq!(kind(4096, 0, 0), ErrorKind::NotSupported);
        assert_eq!(kind(4096, 4096, 2 * 4096 + 100), ErrorKind::NotSupported);
        let e = clone_range(&a, 0, &b, 0, 4096).unwrap_err();
        assert!(
            e.reason().contains("Unaligned") || e.reason().contains("tmpfs"),
            "{e}"
        );
        // Nothing was written.
        assert!(std::fs::read(&b).unwrap() == old);
        // The destination must exist and be a regular file.
        let e = clone_range(&a, 0, d.path().join("new"), 0, 4096).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.reason().contains("existing file"), "{e}");
        let e = clone_range(&a, 0, d.path(), 0, 4096).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IsDirectory, "{e}");
        only(d.path(), &["a", "b"]);
    }
}
