//! GNU cp's rules for command-line operands, as coreutils' own tests check
//! them: which name a source is copied to (`DIR/.`, `--parents`), what
//! happens to an existing destination (overwrite, `-n`, `-u`, `-i`,
//! backups, `--remove-destination`, writing through symbolic links and
//! into FIFOs and devices), and the refusals with GNU's words (the same
//! file, a directory into itself, a just-created file, a dangling link).
//!
//! The data itself moves through the library ([`cowlink::clone_file`],
//! [`cowlink::tree::copy_tree`], [`cowlink::PreallocWriter`]); this module
//! only decides, per operand, what to ask of it.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use cowlink::name::quoted;
use cowlink::tree::LinkKind;

/// Which symbolic links among the sources are followed (`-L`, `-H`, `-P`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deref {
    /// Every one (`-L`; the default without `-r`).
    Always,
    /// Those named on the command line (`-H`).
    CommandLine,
    /// None (`-P`, `-d`; the default with `-r` and `-a`).
    Never,
}

/// How backups of replaced files are named (`--backup=CONTROL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backup {
    /// `NAME~` (`simple`, `never`).
    Simple,
    /// `NAME.~N~` (`numbered`, `t`).
    Numbered,
    /// Numbered if numbered backups exist, else simple (`existing`, `nil`).
    Existing,
}

impl Backup {
    /// GNU's CONTROL words; `None` for `none`/`off` (no backups).
    pub fn parse(word: &str) -> Result<Option<Backup>, String> {
        const WORDS: [(&str, Option<Backup>); 8] = [
            ("none", None),
            ("off", None),
            ("simple", Some(Backup::Simple)),
            ("never", Some(Backup::Simple)),
            ("existing", Some(Backup::Existing)),
            ("nil", Some(Backup::Existing)),
            ("numbered", Some(Backup::Numbered)),
            ("t", Some(Backup::Numbered)),
        ];
        // As GNU: the word, or a prefix of only one word.
        if let Some((_, b)) = WORDS.iter().find(|(w, _)| *w == word) {
            return Ok(*b);
        }
        let hits: Vec<_> = WORDS.iter().filter(|(w, _)| w.starts_with(word)).collect();
        match hits.as_slice() {
            [(_, b)] if !word.is_empty() => Ok(*b),
            _ => Err(format!(
                "invalid argument '{word}' for 'backup type'\nValid arguments are:\n  - 'none', 'off'\n  - 'simple', 'never'\n  - 'existing', 'nil'\n  - 'numbered', 't'"
            )),
        }
    }

    /// The name the backup of `dst` gets.
    fn name(self, dst: &Path, suffix: &OsStr) -> PathBuf {
        let simple = || {
            let mut n = dst.as_os_str().to_owned();
            n.push(suffix);
            PathBuf::from(n)
        };
        let highest = || highest_numbered(dst);
        match self {
            Backup::Simple => simple(),
            Backup::Existing if highest() == 0 => simple(),
            Backup::Existing | Backup::Numbered => {
                let mut n = dst.as_os_str().to_owned();
                n.push(format!(".~{}~", highest() + 1));
                PathBuf::from(n)
            }
        }
    }
}

/// The highest N of an existing `NAME.~N~` beside `dst` (0: none).
fn highest_numbered(dst: &Path) -> u64 {
    let dir = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Some(base) = dst.file_name() else {
        return 0;
    };
    let mut prefix = base.as_bytes().to_vec();
    prefix.extend_from_slice(b".~");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let rest = name.as_bytes().strip_prefix(prefix.as_slice())?;
            let digits = rest.strip_suffix(b"~")?;
            std::str::from_utf8(digits).ok()?.parse::<u64>().ok()
        })
        .max()
        .unwrap_or(0)
}

/// `--update[=WHICH]` (`-u` is `older`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Update {
    /// Replace every existing destination (the default).
    All,
    /// Replace none, silently (as `-n`).
    None,
    /// Replace none, and fail for each.
    NoneFail,
    /// Replace a destination only if it is older than its source.
    Older,
}

/// GNU cp's settings, resolved from the command line once.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Which source symlinks are followed.
    pub deref: Deref,
    /// Whether (and how) replaced files are backed up, with the suffix.
    pub backup: Option<(Backup, OsString)>,
    /// `-f`: remove a destination that cannot be opened, and replace
    /// existing names with links (`-l`, `-s`).
    pub force: bool,
    /// `--remove-destination`: remove each existing destination first.
    pub remove_destination: bool,
    /// `-i`: ask before replacing.
    pub interactive: bool,
    /// What happens to existing destinations.
    pub update: Update,
    /// `-l` / `-s`: links in place of copies.
    pub link: Option<LinkKind>,
    /// `--copy-contents`: read FIFOs and devices as data, even with `-r`.
    pub copy_contents: bool,
    /// `--attributes-only`: no data is copied.
    pub attributes_only: bool,
    /// Hardlinked sources stay hardlinked (`-a`, `-d`, `--preserve=links`).
    pub preserve_links: bool,
    /// `-r`.
    pub recursive: bool,
    /// Print GNU's `'a' -> 'b'` lines for `-v` (invoked as `cp`).
    pub gnu_verbose: bool,
    /// `--parents`: the directories on the way are created.
    pub parents: bool,
    /// `--sparse=always` or `never` (auto: the copy keeps the holes).
    pub sparse: Option<Sparse>,
}

/// `--sparse=always|never`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sparse {
    /// Runs of zeros become holes.
    Always,
    /// Holes are filled.
    Never,
}

/// What earlier operands did, for the rules that span operands.
#[derive(Default)]
pub struct Seen {
    /// Sources already copied into the target directory (non-directories),
    /// by identity and resolved name: the same name twice is a repeat, a
    /// second hardlink is not.
    sources: HashSet<(u64, u64, PathBuf)>,
    /// Directories already copied, with their destination.
    dirs: HashMap<(u64, u64), PathBuf>,
    /// Destination files this run created.
    created: HashSet<(u64, u64)>,
    /// With preserved links: the first copy of each multiply-linked source.
    links: HashMap<(u64, u64), PathBuf>,
}

/// A refusal in GNU's words (printed after `cp: `), failing the operand,
/// with the system's error number when one caused it.
pub struct Refusal(pub String, pub Option<i32>);

/// What to do with one operand, once the rules have been applied.
pub enum Plan {
    /// Nothing (kept, skipped, or a repeated source): success.
    Nothing,
    /// Copy (or link) `src` to `dst`; `dst` may differ from the operand's
    /// name when it was a symbolic link written through.
    Copy(Job),
}

/// One operand to carry out.
pub struct Job {
    /// The destination to write.
    pub dst: PathBuf,
    /// The existing destination when it is a FIFO or device that GNU
    /// writes into rather than replaces.
    pub write_into: bool,
    /// Whether the source is read as data (a regular file, or a FIFO or
    /// device copied as a file).
    pub as_file: bool,
    /// Whether the source is a directory.
    pub is_dir: bool,
    /// Whether the destination directory already existed.
    pub dst_dir_existed: bool,
    /// The backup made of the old destination (restored if the copy fails).
    pub backup: Option<PathBuf>,
    /// Link to this earlier copy of the same source (preserved links).
    pub link_to: Option<PathBuf>,
    /// Follow a source symlink at this operand.
    pub follow: bool,
}

fn id(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

/// The last component of `p` as GNU's `last_component` sees it: trailing
/// slashes ignored, and `.` and `..` kept (so `DIR/.` is named `.`).
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

/// `DIR` joined with `name` as GNU does it (`d` + `.` is `d/.`).
pub fn join(dir: &Path, name: &OsStr) -> PathBuf {
    let mut v = dir.as_os_str().as_bytes().to_vec();
    if !v.ends_with(b"/") {
        v.push(b'/');
    }
    v.extend_from_slice(name.as_bytes());
    PathBuf::from(OsString::from_vec(v))
}

/// Whether a path names `.` or `..` as its last component.
fn dot_or_dotdot(p: &Path) -> bool {
    matches!(base_name(p).as_bytes(), b"." | b"..")
}

impl Rules {
    fn follows(&self) -> bool {
        matches!(self.deref, Deref::Always | Deref::CommandLine)
    }

    /// Apply GNU's rules to the operand `src` → `dst`. `into_dir` says
    /// whether the destination was formed inside a target directory
    /// (where repeated sources are warned about and skipped).
    pub fn plan(
        &self,
        src: &Path,
        dst: &Path,
        into_dir: bool,
        seen: &mut Seen,
        warn: &dyn Fn(&str),
    ) -> Result<Plan, Refusal> {
        let follow = self.follows();
        let src_meta = if follow {
            std::fs::metadata(src)
        } else {
            std::fs::symlink_metadata(src)
        }
        .map_err(|e| {
            Refusal(
                format!("cannot stat {}: {}", quoted(src), super::io_words(&e)),
                e.raw_os_error(),
            )
        })?;
        let ft = src_meta.file_type();
        let is_dir = ft.is_dir();
        if is_dir && !self.recursive {
            return Err(Refusal(
                format!("-r not specified; omitting directory {}", quoted(src)),
                None,
            ));
        }
        let sid = id(&src_meta);
        if into_dir
            && !is_dir
            && self.backup.is_none()
            && !seen.sources.insert((sid.0, sid.1, resolved_name(src)))
        {
            {
                warn(&format!(
                    "warning: source file {} specified more than once",
                    quoted(src)
                ));
                return Ok(Plan::Nothing);
            }
        }
        if is_dir {
            if seen.dirs.get(&sid).is_some_and(|d| d == dst) {
                warn(&format!(
                    "warning: source directory {} specified more than once",
                    quoted(src)
                ));
                return Ok(Plan::Nothing);
            }
            seen.dirs.insert(sid, dst.to_path_buf());
            if into_itself(src, dst) {
                return Err(Refusal(
                    format!(
                        "cannot copy a directory, {}, into itself, {}",
                        quoted(src),
                        quoted(dst)
                    ),
                    None,
                ));
            }
        }
        let special = !ft.is_file() && !is_dir && !ft.is_symlink();
        let as_file = ft.is_file() || (special && (self.copy_contents || !self.recursive));
        // A regular file is written through a symlink at the destination;
        // anything else replaces the name itself (GNU's use_lstat).
        let use_lstat =
            !as_file || self.link.is_some() || self.backup.is_some() || self.remove_destination;
        let named = dst;
        let mut dst = dst.to_path_buf();
        let mut existing = match std::fs::symlink_metadata(&dst) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(Refusal(
                    format!("cannot stat {}: {}", quoted(&dst), super::io_words(&e)),
                    None,
                ))
            }
        };
        if !use_lstat
            && existing
                .as_ref()
                .is_some_and(|m| m.file_type().is_symlink())
        {
            if existing
                .as_ref()
                .is_some_and(|m| seen.created.contains(&id(m)))
            {
                return Err(Refusal(
                    format!(
                        "will not copy {} through just-created symlink {}",
                        quoted(src),
                        quoted(&dst)
                    ),
                    None,
                ));
            }
            match std::fs::metadata(&dst) {
                Ok(_) => {
                    dst = std::fs::canonicalize(&dst).unwrap_or(dst);
                    existing = std::fs::symlink_metadata(&dst).ok();
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if std::env::var_os("POSIXLY_CORRECT").is_none() {
                        return Err(Refusal(
                            format!("not writing through dangling symlink {}", quoted(&dst)),
                            None,
                        ));
                    }
                    // POSIX: create the file the link names.
                    let target = std::fs::read_link(&dst).map_err(|e| {
                        Refusal(
                            format!("cannot read {}: {}", quoted(&dst), super::io_words(&e)),
                            None,
                        )
                    })?;
                    dst = match dst.parent() {
                        Some(p) if target.is_relative() => p.join(target),
                        _ => target,
                    };
                    existing = None;
                }
                // A symlink loop: only -f removes it.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                    if !self.force {
                        return Err(Refusal(
                            format!(
                                "cannot create regular file {}: {}",
                                quoted(&dst),
                                super::io_words(&e)
                            ),
                            None,
                        ));
                    }
                    remove(&dst)?;
                    existing = None;
                }
                Err(e) => {
                    return Err(Refusal(
                        format!("cannot stat {}: {}", quoted(&dst), super::io_words(&e)),
                        None,
                    ))
                }
            }
        }
        let mut job = Job {
            dst,
            write_into: false,
            as_file,
            is_dir,
            dst_dir_existed: false,
            backup: None,
            link_to: None,
            follow,
        };
        if let Some(old) = existing {
            let old_ft = old.file_type();
            // `cp -f -b F F`: GNU turns this into a copy of F to its
            // backup name, and F stays.
            let backup_over_self = self.force
                && self.backup.is_some()
                && src == named
                && std::fs::metadata(named).is_ok_and(|m| m.is_file());
            let mut return_now = false;
            if !backup_over_self {
                let (ok, now) = self.same_file_ok(src, &src_meta, named, &old);
                if !ok {
                    return Err(Refusal(
                        format!("{} and {} are the same file", quoted(src), quoted(named)),
                        None,
                    ));
                }
                return_now = now;
            }
            if !old_ft.is_dir() {
                match self.update {
                    Update::None => return Ok(Plan::Nothing),
                    Update::NoneFail => {
                        return Err(Refusal(format!("not replacing {}", quoted(&job.dst)), None))
                    }
                    Update::Older if !is_dir => {
                        // A file an interrupted tree copy left is never
                        // up to date, however new.
                        let newer = (old.mtime() > src_meta.mtime()
                            || (old.mtime() == src_meta.mtime()
                                && old.mtime_nsec() >= src_meta.mtime_nsec()))
                            && !cowlink::left_unfinished(src_meta.mode(), old.mode());
                        if newer {
                            return Ok(Plan::Nothing);
                        }
                    }
                    _ => {}
                }
                let writable = old_ft.is_symlink()
                    || rustix::fs::access(&job.dst, rustix::fs::Access::WRITE_OK).is_ok();
                let question = if writable {
                    format!("overwrite {}? ", quoted(&job.dst))
                } else {
                    let m = old.mode() & 0o7777;
                    format!(
                        "replace {}, overriding mode {m:04o} ({})? ",
                        quoted(&job.dst),
                        mode_string(m)
                    )
                };
                if self.interactive && !ask(&question) {
                    return Ok(Plan::Nothing);
                }
                if return_now {
                    return Ok(Plan::Nothing);
                }
                // GNU writes into the old file, which it may not open: -f
                // removes it (the copy then has the source's mode),
                // otherwise that is the failure.
                if !writable && as_file && old_ft.is_file() && self.link.is_none() {
                    if !self.force && !self.remove_destination && self.backup.is_none() {
                        return Err(Refusal(
                            format!(
                                "cannot create regular file {}: Permission denied",
                                quoted(&job.dst)
                            ),
                            None,
                        ));
                    }
                    if self.backup.is_none() {
                        remove(&job.dst)?;
                        return Ok(Plan::Copy(job));
                    }
                }
            }
            if return_now {
                return Ok(Plan::Nothing);
            }
            if is_dir && !old_ft.is_dir() {
                return Err(Refusal(
                    format!(
                        "cannot overwrite non-directory {} with directory {}",
                        quoted(&job.dst),
                        quoted(src)
                    ),
                    None,
                ));
            }
            if !old_ft.is_dir()
                && !matches!(self.backup, Some((Backup::Numbered, _)))
                && seen.created.contains(&id(&old))
            {
                return Err(Refusal(
                    format!(
                        "will not overwrite just-created {} with {}",
                        quoted(&job.dst),
                        quoted(src)
                    ),
                    None,
                ));
            }
            if !is_dir && old_ft.is_dir() {
                return Err(Refusal(
                    format!(
                        "cannot overwrite directory {} with non-directory",
                        quoted(&job.dst)
                    ),
                    None,
                ));
            }
            job.dst_dir_existed = old_ft.is_dir();
            if let Some((kind, suffix)) = &self.backup {
                if !old_ft.is_dir() && !dot_or_dotdot(src) {
                    job.backup =
                        Some(self.back_up(src, sid, &job.dst, *kind, suffix, backup_over_self)?);
                    if backup_over_self {
                        // `cp -f -b F F`: the backup is the copy.
                        return Ok(Plan::Nothing);
                    }
                }
            }
            let special_dst = !old_ft.is_file() && !old_ft.is_dir() && !old_ft.is_symlink();
            if job.backup.is_none() && !old_ft.is_dir() {
                if self.remove_destination || (self.link.is_some() && self.force) {
                    remove(&job.dst)?;
                } else if as_file && special_dst && self.link.is_none() {
                    job.write_into = true;
                } else if !as_file && self.link.is_none() {
                    // A symlink or special file takes the name itself: GNU
                    // removes the old one first when it copies data and
                    // follows no links (-R, -P), or with -f; else the name
                    // is taken.
                    if (!self.attributes_only && self.deref == Deref::Never) || self.force {
                        remove(&job.dst)?;
                    } else {
                        let what = if ft.is_symlink() {
                            let to = std::fs::read_link(src).unwrap_or_default();
                            format!("symbolic link {} to {}", quoted(&job.dst), quoted(&to))
                        } else if ft.is_fifo() {
                            format!("fifo {}", quoted(&job.dst))
                        } else {
                            format!("special file {}", quoted(&job.dst))
                        };
                        return Err(Refusal(format!("cannot create {what}: File exists"), None));
                    }
                }
            }
        }
        // As GNU: with links preserved, a followed symlink can meet its
        // target among the operands, so followed sources count too.
        if self.preserve_links && !is_dir && (src_meta.nlink() > 1 || follow) {
            match seen.links.get(&sid) {
                Some(first) => job.link_to = Some(first.clone()),
                None => {
                    seen.links.insert(sid, job.dst.clone());
                }
            }
        }
        Ok(Plan::Copy(job))
    }

    /// GNU's `same_file_ok` (copy.c), for cp: whether copying `src`
    /// (status `src_sb`, as followed or not) onto the existing `dst`
    /// (status `dst_sb`, as GNU stats it) is fine even though they may be
    /// the same file, and whether there is then nothing left to do.
    /// Refusing here is what keeps `cp F F` and its many spellings from
    /// truncating F.
    fn same_file_ok(
        &self,
        src: &Path,
        src_sb: &std::fs::Metadata,
        dst: &Path,
        dst_sb: &std::fs::Metadata,
    ) -> (bool, bool) {
        let hard = self.link == Some(LinkKind::Hard);
        let same = id(src_sb) == id(dst_sb);
        if same && hard {
            return (true, true);
        }
        let never = self.deref == Deref::Never;
        let (src_l, dst_l) = if never {
            if src_sb.is_symlink() && dst_sb.is_symlink() {
                let same_entry = same_name(src, dst);
                if !same_entry {
                    if self.backup.is_some() {
                        return (true, false);
                    }
                    if same {
                        return (true, true);
                    }
                }
                return (!same_entry, false);
            }
            (src_sb.clone(), dst_sb.clone())
        } else {
            if !same {
                return (true, false);
            }
            let (Ok(s), Ok(d)) = (
                std::fs::symlink_metadata(src),
                std::fs::symlink_metadata(dst),
            ) else {
                return (true, false);
            };
            if s.is_symlink() && d.is_symlink() && self.remove_destination {
                return (true, false);
            }
            (s, d)
        };
        let same_link = id(&src_l) == id(&dst_l);
        if self.backup.is_some() {
            if !same_link {
                // Moving the destination aside would leave a followed
                // source symlink dangling.
                return (never || !src_l.is_symlink() || dst_l.is_symlink(), false);
            }
            return (!same_name(src, dst), false);
        }
        if self.remove_destination {
            if dst_l.is_symlink() {
                return (true, false);
            }
            if same_link && dst_l.nlink() > 1 && !same_name(src, dst) {
                return (true, false);
            }
        }
        if !src_l.is_symlink() && !dst_l.is_symlink() {
            if !same_link {
                return (true, false);
            }
            if hard {
                return (true, true);
            }
        }
        if self.link == Some(LinkKind::Symbolic) && dst_l.is_symlink() {
            return (true, false);
        }
        if never {
            let followed = |m: std::fs::Metadata, p: &Path| {
                if m.is_symlink() {
                    std::fs::metadata(p).ok()
                } else {
                    Some(m)
                }
            };
            let (Some(s), Some(d)) = (followed(src_l, src), followed(dst_l.clone(), dst)) else {
                return (true, false);
            };
            if id(&s) != id(&d) {
                return (true, false);
            }
            if hard {
                // Linking over a symlink to the same file replaces it.
                return (true, !dst_l.is_symlink());
            }
        }
        (false, false)
    }

    /// Move the destination aside as its backup, as GNU does; refuse when
    /// that backup is the source itself.
    fn back_up(
        &self,
        src: &Path,
        sid: (u64, u64),
        dst: &Path,
        kind: Backup,
        suffix: &OsStr,
        same: bool,
    ) -> Result<PathBuf, Refusal> {
        let name = kind.name(dst, suffix);
        if kind != Backup::Numbered && std::fs::symlink_metadata(&name).is_ok_and(|m| id(&m) == sid)
        {
            return Err(Refusal(
                format!(
                    "backing up {} might destroy source;  {} not copied",
                    quoted(dst),
                    quoted(src)
                ),
                None,
            ));
        }
        let result = if same && self.link == Some(LinkKind::Hard) {
            std::fs::hard_link(dst, &name)
        } else if same && self.link == Some(LinkKind::Symbolic) {
            symlink_to(src, &name).map_err(std::io::Error::other)
        } else if same {
            // `cp --force --backup F F`: the backup is a copy (or the link
            // -l or -s asks for), F stays.
            cowlink::clone_file(
                dst,
                &name,
                &cowlink::CloneOptions {
                    overwrite: cowlink::Overwrite::Replace,
                    preserve: cowlink::Preserve::ALL,
                    ..Default::default()
                },
            )
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()))
        } else {
            std::fs::rename(dst, &name)
        };
        result.map_err(|e| {
            Refusal(
                format!("cannot backup {}: {}", quoted(dst), super::io_words(&e)),
                None,
            )
        })?;
        Ok(if same { PathBuf::new() } else { name })
    }

    /// After a successful copy: remember what was made.
    pub fn record(&self, job: &Job, seen: &mut Seen) {
        if let Ok(m) = std::fs::symlink_metadata(&job.dst) {
            if !m.is_dir() {
                seen.created.insert(id(&m));
            }
        }
    }
}

/// Undo a backup after a failed copy: the old destination comes back.
pub fn restore_backup(job: &Job) {
    if let Some(b) = &job.backup {
        if !b.as_os_str().is_empty() && std::fs::symlink_metadata(&job.dst).is_err() {
            let _ = std::fs::rename(b, &job.dst);
        }
    }
}

/// Whether `a` and `b` name the same directory entry.
fn same_name(a: &Path, b: &Path) -> bool {
    resolved_name(a) == resolved_name(b)
}

/// Remove the destination `p` to take its name, or refuse in GNU's words.
fn remove(p: &Path) -> Result<(), Refusal> {
    std::fs::remove_file(p).map_err(|e| {
        Refusal(
            format!("cannot remove {}: {}", quoted(p), super::io_words(&e)),
            None,
        )
    })
}

/// `p` with its directory resolved (`./a` and `a` are the same name).
fn resolved_name(p: &Path) -> PathBuf {
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::canonicalize(parent)
        .unwrap_or_else(|_| parent.to_path_buf())
        .join(base_name(p))
}

/// Whether copying the directory `src` to `dst` would put it inside
/// itself (`dst` is `src` or below it, after resolving both).
fn into_itself(src: &Path, dst: &Path) -> bool {
    let Ok(src) = std::fs::canonicalize(src) else {
        return false;
    };
    let name = base_name(dst);
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(parent) = std::fs::canonicalize(parent) else {
        return false;
    };
    let full = if name == "." || name == ".." {
        std::fs::canonicalize(dst).unwrap_or(parent)
    } else {
        parent.join(name)
    };
    full.starts_with(&src) && full != src
}

/// `ls -l`'s nine permission characters for `mode`.
fn mode_string(mode: u32) -> String {
    let mut out = String::new();
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (0o400 >> i) != 0 { c } else { '-' });
    }
    out
}

/// Ask on stderr, read the answer from stdin: yes when it starts with y.
fn ask(question: &str) -> bool {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{}: {question}", crate::out::prog());
    let _ = err.flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    matches!(line.trim_start().chars().next(), Some('y' | 'Y'))
}

/// Write the data of `src` (a FIFO, device or file read as a stream) into
/// the existing FIFO or device `dst`, as GNU cp does.
pub fn write_into(src: &Path, dst: &Path) -> std::io::Result<u64> {
    let mut from = std::fs::File::open(src)?;
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(dst)?;
    std::io::copy(&mut from, &mut to)
}

/// Copy the contents of the FIFO or device `src` into a new file `dst`
/// (complete or absent: written unnamed, linked into place at the end).
pub fn copy_contents(src: &Path, dst: &Path, mode: u32) -> Result<u64, cowlink::Error> {
    let io = |e: std::io::Error| {
        cowlink::Error::new(cowlink::Operation::Copy, cowlink::ErrorKind::Io)
            .with_src(src)
            .with_dst(dst)
            .with_reason(super::io_words(&e))
    };
    let mut from = std::fs::File::open(src).map_err(io)?;
    if std::fs::symlink_metadata(dst).is_err() {
        // A new name: as GNU, it appears at once, readable by its owner
        // only until complete (a stream can take forever); removed on
        // error.
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)
            .map_err(io)?;
        let copied = std::io::copy(&mut from, &mut to).and_then(|n| {
            to.set_permissions(std::fs::Permissions::from_mode(
                mode & 0o777 & !super::umask_now(),
            ))?;
            Ok(n)
        });
        return copied.map_err(|e| {
            let _ = std::fs::remove_file(dst);
            io(e)
        });
    }
    let mut w = cowlink::PreallocWriter::with_options(
        dst,
        0,
        &cowlink::PreallocOptions {
            mode: mode & 0o777,
            overwrite: cowlink::Overwrite::Replace,
            ..Default::default()
        },
    )?;
    let mut buf = vec![0u8; 128 << 10];
    loop {
        let n = from.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        w.write_all(&buf[..n]).map_err(io)?;
    }
    w.finish()
}

/// A symbolic link to `src` at `dst` (`cp -s`): GNU makes relative ones
/// only in the current directory.
pub fn symlink_to(src: &Path, dst: &Path) -> Result<(), String> {
    let in_cwd = match dst.parent() {
        None => true,
        Some(p) if p.as_os_str().is_empty() => true,
        Some(p) => std::fs::canonicalize(p).ok() == std::env::current_dir().ok(),
    };
    if src.is_relative() && !in_cwd {
        return Err(format!(
            "{}: can make relative symbolic links only in current directory",
            quoted(dst)
        ));
    }
    std::os::unix::fs::symlink(src, dst).map_err(|e| {
        format!(
            "cannot create symbolic link {} to {}: {}",
            quoted(dst),
            quoted(src),
            super::io_words(&e)
        )
    })
}

/// A hardlink `dst` to `src` (`cp -l`, and preserved links).
pub fn hardlink(src: &Path, dst: &Path, follow: bool) -> Result<(), String> {
    let flags = if follow {
        rustix::fs::AtFlags::SYMLINK_FOLLOW
    } else {
        rustix::fs::AtFlags::empty()
    };
    rustix::fs::linkat(rustix::fs::CWD, src, rustix::fs::CWD, dst, flags).map_err(|e| {
        format!(
            "cannot create hard link {} to {}: {}",
            quoted(dst),
            quoted(src),
            super::io_words(&std::io::Error::from(e))
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names_keep_dot_and_dotdot() {
        assert_eq!(base_name(Path::new("a/b/")), "b");
        assert_eq!(base_name(Path::new("a/.")), ".");
        assert_eq!(base_name(Path::new("../x/..")), "..");
        assert_eq!(base_name(Path::new("f")), "f");
        assert_eq!(join(Path::new("d/"), OsStr::new(".")), Path::new("d/."));
    }

    #[test]
    fn backup_words_and_prefixes() {
        assert_eq!(Backup::parse("t"), Ok(Some(Backup::Numbered)));
        assert_eq!(Backup::parse("nil"), Ok(Some(Backup::Existing)));
        assert_eq!(Backup::parse("sim"), Ok(Some(Backup::Simple)));
        assert_eq!(Backup::parse("off"), Ok(None));
        assert!(Backup::parse("n").is_err(), "none, nil, never, numbered");
        assert!(Backup::parse("bogus").is_err());
    }
}
