//! Recursive copy of a directory tree, sequential and path-based.
//!
//! This is the simple walk behind `cowlink cp -r`: directories are created,
//! regular files go through [`clone_file`] (so each file is atomic and says
//! how it was copied), symbolic links are recreated as links (never
//! followed), and directory modes and times are set after their contents.
//! Special files (FIFOs, devices, sockets) are reported as per-entry
//! errors, and hardlinks inside the tree are copied as separate files.
//! Per-entry failures are recorded and the walk goes on.
//!
//! The parallel, fd-based tree engine with full `cp -a` semantics replaces
//! this module's internals; its interface (events, report) stays.

use std::path::{Path, PathBuf};

use rustix::fs::{self, AtFlags, FileType, Mode, CWD};
use rustix::io::Errno;

use crate::clone::{clone_file, CloneOptions, Method, Outcome};
use crate::error::{errno_text, Error, ErrorKind, Operation};
use crate::meta::times_of;
use crate::write::Overwrite;

/// Options for [`copy_tree`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TreeOptions {
    /// Per-file options (reflink mode, overwrite, preserve).
    pub file: CloneOptions,
}

/// What happened to one entry.
#[derive(Debug)]
pub enum TreeEvent<'a> {
    /// A regular file was cloned or copied.
    File {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
        /// How.
        outcome: Outcome,
    },
    /// A directory was created (or an existing one merged into).
    Dir {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
    },
    /// A symbolic link was recreated.
    Symlink {
        /// Source path.
        src: &'a Path,
        /// Destination path.
        dst: &'a Path,
    },
    /// An entry failed; the walk continues.
    Failed(&'a Error),
}

/// Totals of a tree copy.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct TreeReport {
    /// Regular files copied.
    pub files: u64,
    /// Directories created or merged.
    pub dirs: u64,
    /// Symbolic links recreated.
    pub symlinks: u64,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Files cloned.
    pub cloned: u64,
    /// Files copied (any copy method).
    pub copied: u64,
    /// Entries that failed.
    pub errors: u64,
}

enum Step {
    Enter(PathBuf, PathBuf),
    Leave(PathBuf, PathBuf, fs::Stat, u32),
}

/// Copy the directory `src` to `dst` (created if missing, merged into if it
/// is an existing directory). `on_event` hears about every entry.
///
/// # Errors
/// Returns `Err` only when nothing could start: `src` is not a directory,
/// `dst` is inside `src`, or `dst` cannot be created. Everything else is a
/// per-entry failure, passed to `on_event` and counted in the report.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    options: &TreeOptions,
    on_event: &mut dyn FnMut(TreeEvent<'_>),
) -> Result<TreeReport, Error> {
    let op = Operation::CopyTree;
    let st = fs::stat(src).map_err(|e| Error::from_errno(op, e).with_src(src).with_dst(dst))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(Error::new(op, ErrorKind::NotADirectory)
            .with_src(src)
            .with_reason("source is not a directory"));
    }
    if let (Ok(s), Some(d)) = (std::fs::canonicalize(src), canonical_dest(dst)) {
        if d.starts_with(&s) {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(src)
                .with_dst(dst)
                .with_reason("cannot copy a directory into itself"));
        }
    }
    let mut report = TreeReport::default();
    let mut stack = vec![Step::Enter(src.to_path_buf(), dst.to_path_buf())];
    let mut first = true;
    while let Some(step) = stack.pop() {
        match step {
            Step::Enter(s, d) => match enter_dir(&s, &d) {
                Ok((st, created_mode)) => {
                    first = false;
                    report.dirs += 1;
                    on_event(TreeEvent::Dir { src: &s, dst: &d });
                    stack.push(Step::Leave(s.clone(), d.clone(), st, created_mode));
                    let entries = match read_sorted(&s) {
                        Ok(e) => e,
                        Err(e) => {
                            report.errors += 1;
                            on_event(TreeEvent::Failed(&e));
                            continue;
                        }
                    };
                    for name in entries.into_iter().rev() {
                        let (cs, cd) = (s.join(&name), d.join(&name));
                        match fs::lstat(&cs).map(|st| FileType::from_raw_mode(st.st_mode)) {
                            Ok(FileType::Directory) => stack.push(Step::Enter(cs, cd)),
                            Ok(t) => copy_entry(&cs, &cd, t, options, &mut report, on_event),
                            Err(e) => {
                                let err = Error::from_errno(op, e).with_src(&cs).with_dst(&cd);
                                report.errors += 1;
                                on_event(TreeEvent::Failed(&err));
                            }
                        }
                    }
                }
                Err(e) if first => return Err(e),
                Err(e) => {
                    report.errors += 1;
                    on_event(TreeEvent::Failed(&e));
                }
            },
            Step::Leave(s, d, st, created_mode) => {
                if let Err(e) = leave_dir(&d, &st, created_mode, options) {
                    let err = Error::from_errno(op, e)
                        .with_src(&s)
                        .with_dst(&d)
                        .with_reason(format!("cannot set directory metadata: {}", errno_text(e)));
                    report.errors += 1;
                    on_event(TreeEvent::Failed(&err));
                }
            }
        }
    }
    Ok(report)
}

/// The canonical form of a destination that may not exist yet.
fn canonical_dest(dst: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(dst).ok().or_else(|| {
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(dst.file_name()?))
    })
}

fn read_sorted(dir: &Path) -> Result<Vec<std::ffi::OsString>, Error> {
    let op = Operation::CopyTree;
    let io = |e: std::io::Error| {
        Error::from_errno(op, Errno::from_io_error(&e).unwrap_or(Errno::IO)).with_src(dir)
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        names.push(entry.map_err(io)?.file_name());
    }
    names.sort();
    Ok(names)
}

/// Create (or accept an existing) destination directory, writable by us
/// while its contents are copied. Returns the source stat and the mode the
/// directory should end with when modes are not preserved.
fn enter_dir(s: &Path, d: &Path) -> Result<(fs::Stat, u32), Error> {
    let op = Operation::CopyTree;
    let err = |e: Errno| Error::from_errno(op, e).with_src(s).with_dst(d);
    let st = fs::stat(s).map_err(err)?;
    match fs::mkdir(d, Mode::from_raw_mode(st.st_mode & 0o777)) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            let dst_st = fs::stat(d).map_err(err)?;
            if FileType::from_raw_mode(dst_st.st_mode) != FileType::Directory {
                return Err(
                    err(Errno::EXIST).with_reason("destination exists and is not a directory")
                );
            }
            return Ok((st, dst_st.st_mode & 0o7777));
        }
        Err(e) => return Err(err(e)),
    }
    // The umask applied by mkdir gives the final mode for non-preserving copies.
    let made = fs::stat(d).map_err(err)?.st_mode & 0o7777;
    if made & 0o700 != 0o700 {
        fs::chmod(d, Mode::from_raw_mode(made | 0o700)).map_err(err)?;
    }
    Ok((st, made))
}

fn leave_dir(
    d: &Path,
    st: &fs::Stat,
    created_mode: u32,
    options: &TreeOptions,
) -> Result<(), Errno> {
    let p = options.file.preserve;
    if p.ownership {
        match fs::chown(
            d,
            Some(fs::Uid::from_raw(st.st_uid)),
            Some(fs::Gid::from_raw(st.st_gid)),
        ) {
            Ok(()) | Err(Errno::PERM) => {}
            Err(e) => return Err(e),
        }
    }
    let mode = if p.mode {
        st.st_mode & 0o7777
    } else {
        created_mode
    };
    fs::chmod(d, Mode::from_raw_mode(mode))?;
    if p.timestamps {
        fs::utimensat(CWD, d, &times_of(st), AtFlags::empty())?;
    }
    Ok(())
}

fn copy_entry(
    s: &Path,
    d: &Path,
    t: FileType,
    options: &TreeOptions,
    report: &mut TreeReport,
    on_event: &mut dyn FnMut(TreeEvent<'_>),
) {
    let op = Operation::CopyTree;
    let result = match t {
        FileType::RegularFile => clone_file(s, d, &options.file).map(|o| {
            report.files += 1;
            report.bytes += o.bytes;
            if o.method == Method::Reflink {
                report.cloned += 1;
            } else {
                report.copied += 1;
            }
            on_event(TreeEvent::File {
                src: s,
                dst: d,
                outcome: o,
            });
        }),
        FileType::Symlink => copy_symlink(s, d, options).map(|()| {
            report.symlinks += 1;
            on_event(TreeEvent::Symlink { src: s, dst: d });
        }),
        _ => Err(Error::new(op, ErrorKind::NotRegularFile)
            .with_src(s)
            .with_dst(d)
            .with_reason("special file (FIFO, socket or device) not copied")),
    };
    if let Err(e) = result {
        report.errors += 1;
        on_event(TreeEvent::Failed(&e));
    }
}

fn copy_symlink(s: &Path, d: &Path, options: &TreeOptions) -> Result<(), Error> {
    let op = Operation::CopyTree;
    let err = |e: Errno| Error::from_errno(op, e).with_src(s).with_dst(d);
    let target = fs::readlink(s, Vec::new()).map_err(err)?;
    let st = fs::lstat(s).map_err(err)?;
    match fs::symlink(&target, d) {
        Ok(()) => {}
        Err(Errno::EXIST) if options.file.overwrite == Overwrite::Replace => {
            // Replace atomically: link at a temporary name, then rename.
            let tmp = d.with_file_name(format!(
                ".{}.cowlink-{}.tmp",
                d.file_name().unwrap_or_default().to_string_lossy(),
                std::process::id()
            ));
            fs::symlink(&target, &tmp).map_err(err)?;
            if let Err(e) = fs::rename(&tmp, d) {
                let _ = fs::unlink(&tmp);
                return Err(err(e));
            }
        }
        Err(Errno::EXIST) => {
            return Err(err(Errno::EXIST).with_reason("destination already exists"))
        }
        Err(e) => return Err(err(e)),
    }
    let p = options.file.preserve;
    if p.ownership {
        let ids = (
            Some(fs::Uid::from_raw(st.st_uid)),
            Some(fs::Gid::from_raw(st.st_gid)),
        );
        match fs::chownat(CWD, d, ids.0, ids.1, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(()) | Err(Errno::PERM) => {}
            Err(e) => return Err(err(e)),
        }
    }
    if p.timestamps {
        fs::utimensat(CWD, d, &times_of(&st), AtFlags::SYMLINK_NOFOLLOW).map_err(err)?;
    }
    Ok(())
}
