//! GNU cp's semantics as a library: which name each source is copied to
//! (`DIR/.`, `--parents`, `-t`, `-T`), what happens to an existing
//! destination (replace or keep, backups and their suffix, the same-file
//! rules, `-n`/`-u`/`--update=`, `-i` through a callback,
//! `--remove-destination`, writing through symbolic links and into FIFOs
//! and devices), `--attributes-only`, `--sparse`, `--copy-contents`,
//! `--resume`, and the modes of new files under the umask.
//!
//! Split in two: [`decide`] holds the decisions, pure functions of what
//! stat says of a source and its destination ([`StatFacts`]) and of the
//! options, unit-tested without a filesystem; `apply` gathers the facts
//! per command-line operand, calls the decisions and carries them out
//! (backups, removals, the copy itself through [`crate::clone_file`] or,
//! for directories, the streaming [`crate::tree::copy_tree`], which holds
//! nothing for the whole tree).
//!
//! [`copy`] is the whole of `cp SRC... DEST`: [`operands`] then
//! [`copy_operands`]. Both the CLI and the Python binding call it.

mod apply;
pub mod decide;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::prim::backup::Backup;
pub use crate::prim::mode::Sparse;
pub use apply::copy_operands;
pub use decide::{FileKind, KeepReason, Prompt, Refusal, StatFacts};

use crate::ground::error::{Error, ErrorKind, Operation};
use crate::prim::meta::Preserve;
use crate::prim::mode::{LinkMode, Outcome};
use crate::tree::{LinkKind, SkipReason, TreeEvent, TreeReport};

/// Which symbolic links among the sources are followed (`-L`, `-H`, `-P`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deref {
    /// Every one (`-L`; GNU's default without `-r`).
    #[default]
    Always,
    /// Those named as operands (`-H`).
    CommandLine,
    /// None (`-P`, `-d`; GNU's default with `-r` and `-a`).
    Never,
}

impl Deref {
    /// GNU's default: follow every source symlink, except when copying
    /// recursively (`-r`, `-a`) without `-l`.
    pub fn gnu_default(recursive: bool, link: Option<LinkKind>) -> Deref {
        if recursive && link != Some(LinkKind::Hard) {
            Deref::Never
        } else {
            Deref::Always
        }
    }
}

/// `--update[=WHICH]` (`-u` is `older`, `-n` is `none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Update {
    /// Replace every existing destination (GNU's default).
    #[default]
    All,
    /// Replace none, silently.
    None,
    /// Replace none, and fail for each.
    NoneFail,
    /// Replace a destination only if it is older than its source.
    Older,
}

/// Everything GNU cp decides, as one configuration. `Default` is plain
/// `cp SRC DEST` with `--reflink=auto` ([`LinkMode::Auto`]).
#[derive(Debug, Clone)]
pub struct CpOptions {
    /// How data is placed: GNU's `--reflink=always|auto|never` are
    /// [`LinkMode::Clone`], [`LinkMode::Auto`] and [`LinkMode::Copy`]
    /// ([`LinkMode::from_reflink`]).
    pub link_mode: LinkMode,
    /// Metadata to carry beyond the permission bits.
    pub preserve: Preserve,
    /// `--no-preserve=mode`: new files get the default mode (`0666`/`0777`
    /// less the umask), not the source's.
    pub default_mode: bool,
    /// `--attributes-only`: no data is copied.
    pub attributes_only: bool,
    /// Which source symlinks are followed.
    pub deref: Deref,
    /// Back up replaced destinations, named so.
    pub backup: Option<Backup>,
    /// The simple backup suffix (empty: `~`).
    pub suffix: OsString,
    /// `-f`: remove a destination that cannot be opened, and let links
    /// (`-l`, `-s`) replace existing names.
    pub force: bool,
    /// `--remove-destination`: remove each existing destination first.
    pub remove_destination: bool,
    /// `-i`: ask (through the caller's callback) before replacing.
    pub interactive: bool,
    /// Which existing destinations are replaced.
    pub update: Update,
    /// `-l` / `-s`: links in place of copies.
    pub link: Option<LinkKind>,
    /// `--copy-contents`: read FIFOs and devices as data, even with `-r`.
    pub copy_contents: bool,
    /// Hardlinked sources stay hardlinked (`-a`, `-d`, `--preserve=links`).
    pub preserve_links: bool,
    /// `-r`: copy directories.
    pub recursive: bool,
    /// `--parents`: the source's path is kept under the target directory,
    /// whose missing directories are created.
    pub parents: bool,
    /// `--sparse`: holes in copies that are not clones. As GNU cp:
    /// `Never` also turns `--reflink=auto` into a plain copy (a clone, or
    /// `copy_file_range`, would keep the source's holes), `Always` still
    /// clones where it can, and `--reflink=always` with anything but
    /// `Auto` is a usage error ([`operands`] refuses it).
    pub sparse: Sparse,
    /// `--resume`: keep destinations that are complete copies (size and
    /// modification time), replace any other atomically. Implies
    /// preserved timestamps.
    pub resume: bool,
    /// Every file complete-or-absent even after a crash (see
    /// [`crate::tree::TreeOptions::atomic`]).
    pub atomic: bool,
    /// Report what would be done, change nothing.
    pub dry_run: bool,
    /// Write through dangling destination symlinks (GNU does with
    /// `POSIXLY_CORRECT` set).
    pub posixly_correct: bool,
    /// Threads, cancellation and progress: every file copied, skipped or
    /// failed is counted into `run.progress` (read it while the copy runs).
    pub run: crate::run::Run,
}

impl Default for CpOptions {
    fn default() -> Self {
        CpOptions {
            link_mode: LinkMode::Auto,
            preserve: Preserve::default(),
            default_mode: false,
            attributes_only: false,
            deref: Deref::default(),
            backup: None,
            suffix: OsString::new(),
            force: false,
            remove_destination: false,
            interactive: false,
            update: Update::default(),
            link: None,
            copy_contents: false,
            preserve_links: false,
            recursive: false,
            parents: false,
            sparse: Sparse::default(),
            resume: false,
            atomic: false,
            dry_run: false,
            posixly_correct: false,
            run: crate::run::Run::default(),
        }
    }
}

impl CpOptions {
    /// `cp -a`: recursive, every attribute, hardlinks kept, no symlink
    /// followed.
    pub fn archive() -> Self {
        CpOptions {
            preserve: Preserve::ALL,
            preserve_links: true,
            recursive: true,
            deref: Deref::Never,
            ..CpOptions::default()
        }
    }

    /// The per-file options these settings give [`crate::clone_file`].
    pub fn clone_options(&self) -> crate::CloneOptions {
        let mut preserve = self.preserve;
        if self.resume {
            preserve.timestamps = true;
        }
        crate::CloneOptions {
            // As GNU's cp.c: --sparse=never turns --reflink=auto into
            // never, so the copy has blocks of its own everywhere.
            link: match (self.sparse, self.link_mode) {
                (Sparse::Never, LinkMode::Auto) => LinkMode::Copy,
                (_, link) => link,
            },
            sparse: self.sparse,
            // GNU replaces existing files unless told otherwise; links are
            // made only where nothing is (or -f, --remove-destination or a
            // backup took the old name away).
            overwrite: if self.update == Update::None {
                crate::Overwrite::Skip
            } else if self.link.is_some()
                && !self.force
                && !self.remove_destination
                && self.backup.is_none()
            {
                crate::Overwrite::Refuse
            } else {
                crate::Overwrite::Replace
            },
            preserve,
            attributes_only: self.attributes_only,
            default_mode: self.default_mode && !preserve.mode,
            // A file named as an operand is complete or absent even after
            // a crash; trees choose per directory (`atomic`).
            placement: crate::Placement::Atomic,
        }
    }

    /// The options of the tree copy of a directory operand. With `-i`
    /// (and an update rule that replaces), entries are asked about too, as
    /// GNU's `cp -ri` does, on one thread so that the questions come in a
    /// fixed order.
    pub fn tree_options(&self) -> crate::tree::TreeOptions {
        let interactive = self.interactive && matches!(self.update, Update::All | Update::Older);
        let run = match interactive {
            true => self.run.clone().with_threads(1),
            false => self.run.clone(),
        };
        crate::tree::TreeOptions {
            interactive,
            backup: self.backup.map(|kind| crate::tree::Backups {
                kind,
                suffix: self.suffix().to_owned(),
            }),
            remove_destination: self.remove_destination,
            file: self.clone_options(),
            hardlinks: self.preserve_links,
            dereference: self.deref == Deref::Always,
            atomic: self.atomic,
            resume: self.resume,
            link: self.link,
            update_older: self.update == Update::Older,
            copy_contents: self.copy_contents && self.recursive,
            dry_run: self.dry_run,
            run,
        }
    }

    fn suffix(&self) -> &OsStr {
        if self.suffix.is_empty() {
            OsStr::new("~")
        } else {
            &self.suffix
        }
    }
}

/// One command-line operand: a source and the name it is copied to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The source as named.
    pub src: PathBuf,
    /// The destination name.
    pub dst: PathBuf,
    /// The destination was formed inside a target directory (where a
    /// source named twice is warned about and skipped).
    pub into_dir: bool,
}

/// How the destination operand is read (`-t`, `-T`, `--parents`,
/// `--strip-trailing-slashes`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Target {
    /// `-t`: the destination is a directory to copy every source into.
    pub directory: bool,
    /// `-T`: the destination is a file name, never a directory to copy into.
    pub no_directory: bool,
    /// `--strip-trailing-slashes`.
    pub strip_trailing_slashes: bool,
}

/// What [`operands`] needs to know of a path: `None` when it does not
/// exist, else whether it is a directory (following symbolic links).
pub type IsDir<'a> = &'a dyn Fn(&Path) -> std::io::Result<Option<bool>>;

/// Resolve `sources` and `dest` into operands with GNU cp's rules: a
/// destination that is a directory receives the sources under their last
/// component (`DIR/.` is named `.`, so its content merges into the
/// target), or under their whole path with `--parents`. Pure but for
/// `is_dir`. `--reflink=always` with a `--sparse` other than `auto` is
/// refused, as GNU does. Errors are usage errors ([`ErrorKind::InvalidInput`],
/// [`ErrorKind::NotADirectory`], [`ErrorKind::NotFound`]) in GNU's words.
pub fn operands(
    sources: &[PathBuf],
    dest: &Path,
    target: Target,
    o: &CpOptions,
    is_dir: IsDir<'_>,
) -> Result<Vec<Operand>, Error> {
    let usage = |kind: ErrorKind, msg: String| {
        Err(Error::new(Operation::Copy, kind)
            .with_dst(dest)
            .with_reason(msg))
    };
    let strip = |p: &PathBuf| -> PathBuf {
        if !target.strip_trailing_slashes {
            return p.clone();
        }
        let b = p.as_os_str().as_bytes();
        let end = b.iter().rposition(|c| *c != b'/').map_or(1, |i| i + 1);
        PathBuf::from(OsStr::from_bytes(&b[..end]))
    };
    // As GNU's cp.c: a clone cannot honour a hole policy.
    if o.link_mode == LinkMode::Clone && o.sparse != Sparse::Auto {
        return usage(
            ErrorKind::InvalidInput,
            "--reflink can be used only with --sparse=auto".into(),
        );
    }
    let srcs: Vec<PathBuf> = sources.iter().map(strip).collect();
    if srcs.is_empty() {
        return usage(ErrorKind::InvalidInput, "no source operand".into());
    }
    use crate::name::quoted;
    if target.directory {
        match is_dir(dest) {
            Ok(Some(true)) => {}
            Ok(Some(false)) => {
                return usage(
                    ErrorKind::NotADirectory,
                    format!("target directory {}: Not a directory", quoted(dest)),
                )
            }
            Ok(None) => {
                return usage(
                    ErrorKind::NotFound,
                    format!(
                        "target directory {}: No such file or directory",
                        quoted(dest)
                    ),
                )
            }
            Err(e) => {
                return usage(
                    ErrorKind::Io,
                    format!("target directory {}: {}", quoted(dest), io_words(&e)),
                )
            }
        }
    } else {
        if target.no_directory {
            if srcs.len() > 1 {
                return usage(
                    ErrorKind::InvalidInput,
                    format!("extra operand {}", quoted(dest)),
                );
            }
            return Ok(vec![Operand {
                src: srcs[0].clone(),
                dst: dest.to_path_buf(),
                into_dir: false,
            }]);
        }
        // As GNU: a destination that cannot be examined is a file name
        // for one source (the copy then says why), an error for several.
        let dest_is_dir = match is_dir(dest) {
            Ok(d) => d,
            Err(_) if srcs.len() == 1 && !o.parents => Some(false),
            Err(e) => {
                return usage(
                    ErrorKind::Io,
                    format!("target {}: {}", quoted(dest), io_words(&e)),
                )
            }
        };
        if srcs.len() == 1 && dest_is_dir != Some(true) && !o.parents {
            let src_is_dir = is_dir(&srcs[0]).ok().flatten() == Some(true) && o.recursive;
            if dest.as_os_str().as_bytes().ends_with(b"/") && !src_is_dir {
                return usage(
                    ErrorKind::NotADirectory,
                    format!(
                        "cannot create regular file {}: Not a directory",
                        quoted(dest)
                    ),
                );
            }
            return Ok(vec![Operand {
                src: srcs[0].clone(),
                dst: dest.to_path_buf(),
                into_dir: false,
            }]);
        }
        match dest_is_dir {
            Some(true) => {}
            Some(false) if o.parents && srcs.len() == 1 => {
                return usage(
                    ErrorKind::NotADirectory,
                    "with --parents, the destination must be a directory".into(),
                )
            }
            Some(false) => {
                return usage(
                    ErrorKind::NotADirectory,
                    format!("target {} is not a directory", quoted(dest)),
                )
            }
            None => {
                return usage(
                    ErrorKind::NotFound,
                    format!("target {}: No such file or directory", quoted(dest)),
                )
            }
        }
    }
    Ok(srcs
        .iter()
        .map(|src| {
            let dst = if o.parents {
                let rel = src.as_os_str().as_bytes();
                let rel = rel.strip_prefix(b"/").unwrap_or(rel);
                join(dest, OsStr::from_bytes(rel))
            } else {
                join(dest, base_name(src))
            };
            Operand {
                src: src.clone(),
                dst,
                into_dir: true,
            }
        })
        .collect())
}

/// The last component of `p` as GNU's `last_component` sees it: trailing
/// slashes ignored, `.` and `..` kept (so `DIR/.` is named `.`).
pub fn base_name(p: &Path) -> &OsStr {
    let bytes = p.as_os_str().as_bytes();
    let trimmed = match bytes.iter().rposition(|b| *b != b'/') {
        Some(end) => &bytes[..=end],
        None => return OsStr::new("/"),
    };
    let start = trimmed
        .iter()
        .rposition(|b| *b == b'/')
        .map_or(0, |i| i + 1);
    OsStr::from_bytes(&trimmed[start..])
}

/// `dir` joined with `name` as GNU does it (`d` + `.` is `d/.`).
pub fn join(dir: &Path, name: &OsStr) -> PathBuf {
    let mut v = dir.as_os_str().as_bytes().to_vec();
    if !v.ends_with(b"/") {
        v.push(b'/');
    }
    v.extend_from_slice(name.as_bytes());
    PathBuf::from(OsString::from_vec(v))
}

/// An I/O error in GNU's words ("Permission denied"), without Rust's
/// "(os error 13)".
pub fn io_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

/// What happened to one operand (or, inside a directory operand, one
/// entry), as told to a [`CpObserver`].
#[derive(Debug)]
#[non_exhaustive]
pub enum CpEvent<'a> {
    /// An entry of a directory operand's tree copy.
    Tree {
        /// The operand's source.
        src: &'a Path,
        /// The operand's destination.
        dst: &'a Path,
        /// The tree copy's event.
        event: &'a TreeEvent<'a>,
    },
    /// A directory operand's tree copy starts (`dir_existed`: it merges
    /// into an existing directory).
    TreeStart {
        /// The destination directory.
        dst: &'a Path,
        /// It existed before.
        dir_existed: bool,
    },
    /// The tree copy that [`CpEvent::TreeStart`] announced has returned.
    TreeEnd,
    /// A file operand was copied (or linked).
    Copied {
        /// Source.
        src: &'a Path,
        /// Destination (after writing through a destination symlink).
        dst: &'a Path,
        /// How, and how many bytes.
        outcome: Outcome,
        /// How long it took.
        elapsed: Duration,
        /// The backup made of the old destination.
        backup: Option<&'a Path>,
    },
    /// An existing destination was kept by the rules (`-n`, `-u`, `-i`,
    /// the same file).
    Kept {
        /// Source.
        src: &'a Path,
        /// Destination.
        dst: &'a Path,
        /// Why.
        reason: KeepReason,
    },
    /// A file operand was skipped as the tree copy skips entries
    /// (`--resume` found it complete, `-n` kept it).
    Skipped {
        /// Source.
        src: &'a Path,
        /// Destination.
        dst: &'a Path,
        /// Why.
        reason: SkipReason,
    },
    /// The operand was refused by GNU's rules, or failed; `message` is
    /// GNU's words when the rules refused it (print it after the program
    /// name), `None` when the error's own text says it.
    Failed {
        /// Source.
        src: &'a Path,
        /// Destination.
        dst: &'a Path,
        /// The error.
        error: &'a Error,
        /// GNU's words for a refusal.
        message: Option<&'a str>,
    },
    /// A warning in GNU's words (a source named twice).
    Warning(&'a str),
}

/// Hears about every operand and entry of [`copy`]; tree entries come
/// from worker threads, hence `Sync`.
pub trait CpObserver: Sync {
    /// One event.
    fn event(&self, event: &CpEvent<'_>);
}

impl<F: Fn(&CpEvent<'_>) + Sync> CpObserver for F {
    fn event(&self, event: &CpEvent<'_>) {
        self(event)
    }
}

/// The `-i` callback: asked before replacing, replaces on `true`. Entries
/// of a directory operand are asked about from the tree copy's worker
/// thread (one question at a time), hence `Send`.
pub type Ask<'a> = &'a mut (dyn FnMut(&Prompt<'_>) -> bool + Send);

/// Totals of [`copy`].
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CpReport {
    /// Counts over every operand (tree entries and file operands).
    pub totals: TreeReport,
    /// Some operand was a directory copied as a tree.
    pub any_tree: bool,
}

/// `cp SRC... DEST`: resolve the operands against the filesystem and copy
/// each with GNU's rules. Per-operand failures are reported to `observer`
/// and counted, and the copy goes on; only usage errors return `Err`.
/// `ask` answers `-i`'s questions (without it, `-i` answers no).
pub fn copy(
    sources: &[PathBuf],
    dest: impl AsRef<Path>,
    target: Target,
    o: &CpOptions,
    observer: &dyn CpObserver,
    ask: Option<Ask<'_>>,
) -> Result<CpReport, Error> {
    let ops = operands(
        sources,
        dest.as_ref(),
        target,
        o,
        &|p| match std::fs::metadata(p) {
            Ok(m) => Ok(Some(m.is_dir())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        },
    )?;
    Ok(copy_operands(&ops, target.directory, o, observer, ask))
}

#[cfg(test)]
mod tests;
