//! GNU cp's decisions, pure: given what stat says of a source and of its
//! destination, and the options, what happens. Nothing here makes a
//! system call; `apply` gathers the facts, calls these functions
//! per operand and carries out the answer. The order of the checks is
//! GNU's (copy.c `copy_internal`, `same_file_ok`), so the refusals come
//! with the same precedence as there.

use std::path::Path;

use super::{Backup, CpOptions, Deref, Update};
pub use crate::prim::backup::{backup_name, backup_number};
pub use crate::prim::facts::{complete_copy, mode_string, not_older, FileKind, Prompt, StatFacts};
use crate::tree::LinkKind;

/// Why cp refuses an operand; [`Refusal::message`] gives GNU's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A directory without `-r`.
    OmitDirectory,
    /// A directory copied into itself or below.
    IntoItself,
    /// Source and destination are the same file, and copying would lose it.
    SameFile,
    /// `--update=none-fail` met an existing destination.
    NotReplacing,
    /// An existing destination that cannot be written, without `-f`.
    NotWritable,
    /// A directory over an existing non-directory.
    NonDirWithDir,
    /// A non-directory over an existing directory.
    DirWithNonDir,
    /// The destination is a file this run created (two sources, one name).
    JustCreated,
    /// Writing through a symbolic link this run created.
    ThroughJustCreated,
    /// Writing through a dangling symbolic link (outside POSIXLY_CORRECT).
    DanglingSymlink,
    /// The backup name is the source: backing up would destroy it.
    BackupDestroysSource,
    /// A symlink or special file cannot take a name that exists.
    NameTaken(FileKind),
}

impl Refusal {
    /// GNU's words for this refusal of `src` → `dst` (`link_target`: the
    /// target of a source symlink, for [`Refusal::NameTaken`]).
    pub fn message(&self, src: &Path, dst: &Path, link_target: Option<&Path>) -> String {
        use crate::name::quoted;
        let (s, d) = (quoted(src), quoted(dst));
        match self {
            Refusal::OmitDirectory => format!("-r not specified; omitting directory {s}"),
            Refusal::IntoItself => {
                format!("cannot copy a directory, {s}, into itself, {d}")
            }
            Refusal::SameFile => format!("{s} and {d} are the same file"),
            Refusal::NotReplacing => format!("not replacing {d}"),
            Refusal::NotWritable => {
                format!("cannot create regular file {d}: Permission denied")
            }
            Refusal::NonDirWithDir => {
                format!("cannot overwrite non-directory {d} with directory {s}")
            }
            Refusal::DirWithNonDir => {
                format!("cannot overwrite directory {d} with non-directory")
            }
            Refusal::JustCreated => format!("will not overwrite just-created {d} with {s}"),
            Refusal::ThroughJustCreated => {
                format!("will not copy {s} through just-created symlink {d}")
            }
            Refusal::DanglingSymlink => format!("not writing through dangling symlink {d}"),
            Refusal::BackupDestroysSource => {
                format!("backing up {d} might destroy source;  {s} not copied")
            }
            Refusal::NameTaken(kind) => {
                let what = match kind {
                    FileKind::Symlink => format!(
                        "symbolic link {d} to {}",
                        quoted(link_target.unwrap_or(Path::new("")))
                    ),
                    FileKind::Fifo => format!("fifo {d}"),
                    _ => format!("special file {d}"),
                };
                format!("cannot create {what}: File exists")
            }
        }
    }

    /// The library's error kind for this refusal.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            Refusal::OmitDirectory | Refusal::DirWithNonDir => K::IsDirectory,
            Refusal::NonDirWithDir => K::NotADirectory,
            Refusal::SameFile | Refusal::BackupDestroysSource => K::SameFile,
            Refusal::NotReplacing | Refusal::NameTaken(_) | Refusal::JustCreated => {
                K::AlreadyExists
            }
            Refusal::NotWritable => K::PermissionDenied,
            Refusal::DanglingSymlink => K::NotFound,
            Refusal::IntoItself | Refusal::ThroughJustCreated => K::InvalidInput,
        }
    }
}

/// How a source is treated, from its type and the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// The source is a directory (copied as a tree).
    pub is_dir: bool,
    /// The source is read as data: a regular file, or a FIFO or device
    /// copied as a file (`--copy-contents`, or without `-r`).
    pub as_file: bool,
    /// The destination is examined without following a symlink there:
    /// only a regular file copied as data is written through one (GNU's
    /// `use_lstat`).
    pub use_lstat: bool,
}

/// The role of a source (stat as the options follow it), or GNU's
/// refusal of a directory without `-r`.
pub fn role(o: &CpOptions, src: &StatFacts) -> Result<Role, Refusal> {
    let is_dir = src.is_dir();
    if is_dir && !o.recursive {
        return Err(Refusal::OmitDirectory);
    }
    let special = src.is_special();
    let as_file = src.is_file() || (special && (o.copy_contents || !o.recursive));
    let use_lstat = !as_file || o.link.is_some() || o.backup.is_some() || o.remove_destination;
    Ok(Role {
        is_dir,
        as_file,
        use_lstat,
    })
}

/// What following the symlink at the destination found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Followed {
    /// It names an existing file.
    Exists,
    /// It names nothing.
    Dangling,
    /// It loops (ELOOP).
    Loop,
}

/// What to do with a symbolic link found at the destination of a file
/// that is written through links ([`Role::use_lstat`] false).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThroughLink {
    /// Write into the file it names.
    Through,
    /// Create the file it names (POSIXLY_CORRECT, dangling link).
    CreateTarget,
    /// Remove the looping link and create the file (`-f`).
    RemoveLoop,
}

/// GNU's rules for a destination that is a symbolic link, when the
/// source is written through it. `just_created`: this run made the link.
/// `loop_refusal`: a loop without `-f` is an error the caller reports in
/// the system's words (`Ok(None)`).
pub fn through_link(
    o: &CpOptions,
    just_created: bool,
    followed: Followed,
) -> Result<Option<ThroughLink>, Refusal> {
    if just_created {
        return Err(Refusal::ThroughJustCreated);
    }
    Ok(match followed {
        Followed::Exists => Some(ThroughLink::Through),
        Followed::Dangling if o.posixly_correct => Some(ThroughLink::CreateTarget),
        Followed::Dangling => return Err(Refusal::DanglingSymlink),
        Followed::Loop if o.force => Some(ThroughLink::RemoveLoop),
        Followed::Loop => None,
    })
}

/// What stat says of a source and an existing destination, for the
/// same-file rules. "Followed" stats are `None` when following fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SameFileFacts {
    /// The source as cp reads it (followed or not, per [`Deref`]).
    pub src: StatFacts,
    /// The destination as cp examines it (after writing through a link).
    pub dst: StatFacts,
    /// `lstat` of the source name.
    pub src_link: Option<StatFacts>,
    /// `lstat` of the destination name.
    pub dst_link: Option<StatFacts>,
    /// `stat` of the source name (links followed).
    pub src_target: Option<StatFacts>,
    /// `stat` of the destination name (links followed).
    pub dst_target: Option<StatFacts>,
    /// Source and destination name the same directory entry.
    pub same_name: bool,
}

/// The verdict of the same-file rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameFile {
    /// Copying is fine.
    Proceed,
    /// Fine, and there is nothing to do (`cp -l F F`).
    Done,
    /// Refused: copying would truncate or lose the source.
    Refuse,
}

/// GNU's `same_file_ok` (copy.c) for cp: whether copying the source onto
/// the existing destination is fine even though they may be one file.
/// Refusing here keeps `cp F F` and its many spellings from truncating F.
pub fn same_file(o: &CpOptions, f: &SameFileFacts) -> SameFile {
    use SameFile::{Done, Proceed, Refuse};
    let ok = |b: bool| if b { Proceed } else { Refuse };
    let hard = o.link == Some(LinkKind::Hard);
    let same = f.src.id() == f.dst.id();
    if same && hard {
        return Done;
    }
    let never = o.deref == Deref::Never;
    let (src_l, dst_l) = if never {
        if f.src.is_symlink() && f.dst.is_symlink() {
            if !f.same_name {
                if o.backup.is_some() {
                    return Proceed;
                }
                if same {
                    return Done;
                }
            }
            return ok(!f.same_name);
        }
        (f.src, f.dst)
    } else {
        if !same {
            return Proceed;
        }
        let (Some(s), Some(d)) = (f.src_link, f.dst_link) else {
            return Proceed;
        };
        if s.is_symlink() && d.is_symlink() && o.remove_destination {
            return Proceed;
        }
        (s, d)
    };
    let same_link = src_l.id() == dst_l.id();
    if o.backup.is_some() {
        if !same_link {
            // Moving the destination aside would leave a followed source
            // symlink dangling.
            return ok(never || !src_l.is_symlink() || dst_l.is_symlink());
        }
        return ok(!f.same_name);
    }
    if o.remove_destination {
        if dst_l.is_symlink() {
            return Proceed;
        }
        if same_link && dst_l.nlink > 1 && !f.same_name {
            return Proceed;
        }
    }
    if !src_l.is_symlink() && !dst_l.is_symlink() {
        if !same_link {
            return Proceed;
        }
        if hard {
            return Done;
        }
    }
    if o.link == Some(LinkKind::Symbolic) && dst_l.is_symlink() {
        return Proceed;
    }
    if never {
        let followed = |m: StatFacts, target: Option<StatFacts>| {
            if m.is_symlink() {
                target
            } else {
                Some(m)
            }
        };
        let (Some(s), Some(d)) = (followed(src_l, f.src_target), followed(dst_l, f.dst_target))
        else {
            return Proceed;
        };
        if s.id() != d.id() {
            return Proceed;
        }
        if hard {
            // Linking over a symlink to the same file replaces it.
            return if dst_l.is_symlink() { Proceed } else { Done };
        }
    }
    Refuse
}

/// What stat (and the run so far) says of an operand whose destination
/// exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExistingFacts {
    /// The source as cp reads it.
    pub src: StatFacts,
    /// The existing destination (`lstat`, after writing through a link).
    pub old: StatFacts,
    /// The same-file facts (see [`same_file`]).
    pub same: SameFileFacts,
    /// `cp -f -b F F`: source and destination are the same name, a
    /// regular file (GNU then backs F up by copying, and F stays).
    pub backup_over_self: bool,
    /// The destination may be opened for writing (`access(W_OK)`).
    pub writable: bool,
    /// This run created the destination.
    pub just_created: bool,
    /// The source's last component is `.` or `..` (never backed up).
    pub src_is_dot: bool,
}

/// Why an existing destination is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepReason {
    /// `-n`, `--update=none`.
    NoClobber,
    /// `-u`: the destination is not older than the source.
    NotOlder,
    /// `-i`: the answer was no.
    Declined,
    /// Source and destination are one file already (`cp -l F F`), or the
    /// backup made was the whole copy (`cp -fb F F`).
    Same,
    /// `--resume`: the destination is already a complete copy.
    Complete,
}

/// How the old destination is moved aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupHow {
    /// Renamed to the backup name (the usual case).
    Rename,
    /// `cp -fb F F`: copied (or linked, with `-l`/`-s`) to the backup
    /// name; F stays and nothing else is done.
    CopySelf,
}

/// What to do with an operand whose destination exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep the destination; nothing is copied.
    Keep(KeepReason),
    /// Go on: copy over (or into) the destination.
    Replace(Replace),
}

/// The steps before copying over an existing destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replace {
    /// Move the old destination aside first.
    pub backup: Option<BackupHow>,
    /// Remove the old destination first (the copy then takes the source's
    /// mode, not the old file's).
    pub remove_first: bool,
    /// Write the data into the existing FIFO or device (GNU does not
    /// replace those when copying a file's data).
    pub write_into: bool,
    /// The destination is an existing directory (merged into).
    pub dir_existed: bool,
}

/// GNU's rules for an existing destination, in GNU's order: the same
/// file, `-n`/`--update`, `-i` (`ask` is called with the question; it is
/// the only caller-supplied step), unwritable files, directory/non-directory
/// clashes, just-created names, backups, `--remove-destination`, and names
/// a symlink or special file cannot take.
pub fn existing(
    o: &CpOptions,
    role: Role,
    f: &ExistingFacts,
    dst: &Path,
    ask: &mut dyn FnMut(&Prompt<'_>) -> bool,
) -> Result<Decision, Refusal> {
    let old = &f.old;
    let mut nothing_left = false;
    if !f.backup_over_self {
        match same_file(o, &f.same) {
            SameFile::Refuse => return Err(Refusal::SameFile),
            SameFile::Done => nothing_left = true,
            SameFile::Proceed => {}
        }
    }
    if !old.is_dir() {
        match o.update {
            Update::None => return Ok(Decision::Keep(KeepReason::NoClobber)),
            Update::NoneFail => return Err(Refusal::NotReplacing),
            Update::Older if !role.is_dir && not_older(&f.src, old) => {
                return Ok(Decision::Keep(KeepReason::NotOlder))
            }
            _ => {}
        }
        let writable = old.is_symlink() || f.writable;
        if o.interactive {
            let prompt = Prompt {
                dst,
                overriding_mode: (!writable).then_some(old.mode & 0o7777),
            };
            if !ask(&prompt) {
                return Ok(Decision::Keep(KeepReason::Declined));
            }
        }
        if nothing_left {
            return Ok(Decision::Keep(KeepReason::Same));
        }
        // GNU writes into the old file, which it may not open: -f removes
        // it (the copy then has the source's mode), else that fails.
        if !writable && role.as_file && old.is_file() && o.link.is_none() {
            if !o.force && !o.remove_destination && o.backup.is_none() {
                return Err(Refusal::NotWritable);
            }
            if o.backup.is_none() {
                return Ok(Decision::Replace(Replace {
                    remove_first: true,
                    ..Replace::default()
                }));
            }
        }
    }
    if nothing_left {
        return Ok(Decision::Keep(KeepReason::Same));
    }
    if role.is_dir && !old.is_dir() {
        return Err(Refusal::NonDirWithDir);
    }
    if !old.is_dir() && o.backup != Some(Backup::Numbered) && f.just_created {
        return Err(Refusal::JustCreated);
    }
    if !role.is_dir && old.is_dir() {
        return Err(Refusal::DirWithNonDir);
    }
    let mut r = Replace {
        dir_existed: old.is_dir(),
        ..Replace::default()
    };
    if o.backup.is_some() && !old.is_dir() && !f.src_is_dot {
        r.backup = Some(if f.backup_over_self {
            BackupHow::CopySelf
        } else {
            BackupHow::Rename
        });
        return Ok(Decision::Replace(r));
    }
    if !old.is_dir() {
        if o.remove_destination || (o.link.is_some() && o.force) {
            r.remove_first = true;
        } else if role.as_file && old.is_special() && o.link.is_none() {
            r.write_into = true;
        } else if !role.as_file && o.link.is_none() {
            // A symlink or special file takes the name itself: GNU removes
            // the old one first when it copies data and follows no links
            // (-R, -P), or with -f; else the name is taken.
            if (!o.attributes_only && o.deref == Deref::Never) || o.force {
                r.remove_first = true;
            } else {
                return Err(Refusal::NameTaken(f.src.kind));
            }
        }
    }
    Ok(Decision::Replace(r))
}

/// Whether a backup named `backup` (its `lstat`, when it exists) would be
/// the source itself: GNU refuses then, except for numbered backups (a new
/// name each time).
pub fn backup_destroys_source(kind: Backup, backup: Option<&StatFacts>, src: &StatFacts) -> bool {
    kind != Backup::Numbered && backup.is_some_and(|b| b.id() == src.id())
}

/// The permission bits of a new file or directory that does not take the
/// source's: `0666` (`0777` for directories), less `umask`.
pub fn default_mode(kind: FileKind, umask: u32) -> u32 {
    let base = if kind == FileKind::Dir { 0o777 } else { 0o666 };
    base & !umask
}

/// The permission bits a new copy of a source of mode `src_mode` gets:
/// the source's, or with `default` the default mode; less `umask` either
/// way (as `open(2)` and `mkdir(2)` apply it).
pub fn new_mode(kind: FileKind, src_mode: u32, default: bool, umask: u32) -> u32 {
    if default {
        default_mode(kind, umask)
    } else {
        src_mode & 0o7777 & !umask
    }
}
