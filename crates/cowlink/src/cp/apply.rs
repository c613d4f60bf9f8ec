//! Carrying out GNU cp's decisions: per operand, stat the source and the
//! destination, ask [`super::decide`] what to do, then do it (backups,
//! removals, the copy). Directory operands stream through
//! [`copy_tree`], which holds nothing for the whole tree.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::decide::{
    self, BackupHow, Decision, ExistingFacts, Followed, KeepReason, Refusal, SameFileFacts,
    StatFacts, ThroughLink,
};
use super::{io_words, Ask, CpEvent, CpObserver, CpOptions, CpReport, Deref, Operand};
use crate::ground::error::{Error, ErrorKind, Operation};
use crate::name::quoted;
use crate::prim::mode::{Method, Outcome};
use crate::run::Progress;
use crate::tree::{copy_tree, LinkKind, SkipReason, TreeEvent};

/// The `-i` callback as passed down (see [`Ask`]).
type AskFn<'f> = dyn FnMut(&decide::Prompt<'_>) -> bool + Send + 'f;

/// What a directory operand's tree copy reports to: its events become
/// [`CpEvent::Tree`], and `-i`'s questions about its entries go to the
/// caller's callback (the tree asks one at a time; the lock makes the
/// callback shareable with the worker threads).
struct TreeBridge<'b, 'f> {
    observer: &'b dyn CpObserver,
    src: &'b Path,
    dst: &'b Path,
    ask: std::sync::Mutex<&'b mut AskFn<'f>>,
}

impl crate::tree::Observer for TreeBridge<'_, '_> {
    fn event(&self, event: &TreeEvent<'_>) {
        self.observer.event(&CpEvent::Tree {
            src: self.src,
            dst: self.dst,
            event,
        })
    }

    fn may_replace(&self, prompt: &decide::Prompt<'_>) -> bool {
        let mut ask = self.ask.lock().unwrap_or_else(|p| p.into_inner());
        (*ask)(prompt)
    }
}

/// What earlier operands did, for the rules that span operands.
#[derive(Default)]
struct Seen {
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

/// A failed operand: GNU's words, and the error kind and errno behind them.
struct Refused {
    message: String,
    kind: ErrorKind,
    errno: Option<i32>,
}

impl Refused {
    fn rule(r: &Refusal, src: &Path, dst: &Path, target: Option<&Path>) -> Self {
        Refused {
            message: r.message(src, dst, target),
            kind: r.kind(),
            errno: None,
        }
    }

    fn io(message: String, e: &std::io::Error) -> Self {
        Refused {
            message,
            kind: ErrorKind::Io,
            errno: e.raw_os_error(),
        }
    }
}

/// One operand to carry out, once the rules have been applied.
struct Job {
    dst: PathBuf,
    write_into: bool,
    as_file: bool,
    is_dir: bool,
    dir_existed: bool,
    /// The backup made of the old destination (restored if the copy fails).
    backup: Option<PathBuf>,
    /// Link to this earlier copy of the same source (preserved links).
    link_to: Option<PathBuf>,
    follow: bool,
}

/// Copy each operand in order with GNU cp's rules (see [`super::copy`]);
/// `into_target`: the destinations were formed under `-t DIR`.
pub fn copy_operands(
    ops: &[Operand],
    into_target: bool,
    o: &CpOptions,
    observer: &dyn CpObserver,
    mut ask: Option<Ask<'_>>,
) -> CpReport {
    let tally = o
        .run
        .progress
        .clone()
        .unwrap_or_else(|| Arc::new(Progress::new()));
    let mut tree = o.tree_options();
    tree.run = tree.run.clone().with_progress(Arc::clone(&tally));
    let into_dir = into_target || ops.len() > 1 || ops.first().is_some_and(|j| j.into_dir);
    let mut seen = Seen::default();
    let mut any_tree = false;
    let mut no = |_: &decide::Prompt<'_>| false;
    for op in ops {
        if o.run.cancelled() {
            break;
        }
        let ask: &mut AskFn<'_> = match ask.as_mut() {
            Some(a) => &mut **a,
            None => &mut no,
        };
        let a = Apply {
            o,
            tree: &tree,
            tally: &tally,
            observer,
            src: &op.src,
            dst: &op.dst,
        };
        any_tree |= a.operand(into_dir, &mut seen, ask);
    }
    let totals = crate::tree::TreeReport::from_totals(tally.totals(), o.run.cancelled());
    CpReport { totals, any_tree }
}

struct Apply<'a> {
    o: &'a CpOptions,
    tree: &'a crate::tree::TreeOptions,
    tally: &'a Progress,
    observer: &'a dyn CpObserver,
    src: &'a Path,
    dst: &'a Path,
}

fn meta(p: &Path, follow: bool) -> std::io::Result<std::fs::Metadata> {
    if follow {
        std::fs::metadata(p)
    } else {
        std::fs::symlink_metadata(p)
    }
}

impl Apply<'_> {
    fn refused(&self, r: Refused, dst: &Path) {
        // A system error keeps the kind its errno classifies to.
        let e = match r.errno {
            Some(n) => Error::from_errno(Operation::Copy, rustix::io::Errno::from_raw_os_error(n)),
            None => Error::new(Operation::Copy, r.kind),
        }
        .with_src(self.src)
        .with_dst(dst)
        .with_reason(r.message.clone());
        self.tally.count_failed();
        self.observer.event(&CpEvent::Failed {
            src: self.src,
            dst,
            error: &e,
            message: Some(&r.message),
        });
    }

    fn failed(&self, dst: &Path, e: &Error) {
        self.tally.count_failed();
        self.observer.event(&CpEvent::Failed {
            src: self.src,
            dst,
            error: e,
            message: None,
        });
    }

    /// One operand; returns whether it was a tree copy.
    fn operand(&self, into_dir: bool, seen: &mut Seen, ask: &mut AskFn<'_>) -> bool {
        let (src, dst) = (self.src, self.dst);
        if self.o.dry_run {
            return self.dry_run();
        }
        if self.o.parents {
            if let Err(e) = make_parents(src, dst, self.o) {
                let msg = format!(
                    "cannot make directory {}: {}",
                    quoted(dst.parent().unwrap_or(dst)),
                    io_words(&e)
                );
                self.refused(Refused::io(msg, &e), dst);
                return false;
            }
        }
        let job = match self.plan(into_dir, seen, ask) {
            Ok(Some(job)) => job,
            Ok(None) => return false,
            Err(r) => {
                self.refused(r, dst);
                return false;
            }
        };
        let tree_copy = self.carry_out(&job, ask);
        if let Ok(m) = std::fs::symlink_metadata(&job.dst) {
            if !m.is_dir() {
                seen.created.insert((m.dev(), m.ino()));
            }
        }
        tree_copy
    }

    fn kept(&self, dst: &Path, reason: KeepReason) -> Result<Option<Job>, Refused> {
        self.observer.event(&CpEvent::Kept {
            src: self.src,
            dst,
            reason,
        });
        Ok(None)
    }

    /// Gather the facts and apply the rules: the job to do, `None` when
    /// there is nothing to do.
    fn plan(
        &self,
        into_dir: bool,
        seen: &mut Seen,
        ask: &mut AskFn<'_>,
    ) -> Result<Option<Job>, Refused> {
        let (o, src, named) = (self.o, self.src, self.dst);
        let follow = matches!(o.deref, Deref::Always | Deref::CommandLine);
        let src_meta = meta(src, follow).map_err(|e| {
            Refused::io(format!("cannot stat {}: {}", quoted(src), io_words(&e)), &e)
        })?;
        let s = StatFacts::of(&src_meta);
        let role = decide::role(o, &s).map_err(|r| Refused::rule(&r, src, named, None))?;
        let sid = s.id();
        if into_dir
            && !role.is_dir
            && o.backup.is_none()
            && !seen.sources.insert((sid.0, sid.1, resolved_name(src)))
        {
            self.observer.event(&CpEvent::Warning(&format!(
                "warning: source file {} specified more than once",
                quoted(src)
            )));
            return Ok(None);
        }
        if role.is_dir {
            if seen.dirs.get(&sid).is_some_and(|d| d == named) {
                self.observer.event(&CpEvent::Warning(&format!(
                    "warning: source directory {} specified more than once",
                    quoted(src)
                )));
                return Ok(None);
            }
            seen.dirs.insert(sid, named.to_path_buf());
            if into_itself(src, named) {
                return Err(Refused::rule(&Refusal::IntoItself, src, named, None));
            }
        }
        let stat_dst = |p: &Path| match std::fs::symlink_metadata(p) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Refused::io(
                format!("cannot stat {}: {}", quoted(p), io_words(&e)),
                &e,
            )),
        };
        let mut dst = named.to_path_buf();
        let mut existing = stat_dst(&dst)?;
        if !role.use_lstat
            && existing
                .as_ref()
                .is_some_and(|m| m.file_type().is_symlink())
        {
            let just_created = existing
                .as_ref()
                .is_some_and(|m| seen.created.contains(&(m.dev(), m.ino())));
            let followed = match std::fs::metadata(&dst) {
                Ok(_) => Ok(Followed::Exists),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Followed::Dangling),
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                    Ok(Followed::Loop)
                }
                Err(e) => Err(e),
            };
            let followed = followed.map_err(|e| {
                Refused::io(
                    format!("cannot stat {}: {}", quoted(&dst), io_words(&e)),
                    &e,
                )
            })?;
            match decide::through_link(o, just_created, followed) {
                Err(r) => return Err(Refused::rule(&r, src, &dst, None)),
                Ok(Some(ThroughLink::Through)) => {
                    dst = std::fs::canonicalize(&dst).unwrap_or(dst);
                    existing = std::fs::symlink_metadata(&dst).ok();
                }
                Ok(Some(ThroughLink::CreateTarget)) => {
                    // POSIX: create the file the link names.
                    let target = std::fs::read_link(&dst).map_err(|e| {
                        Refused::io(
                            format!("cannot read {}: {}", quoted(&dst), io_words(&e)),
                            &e,
                        )
                    })?;
                    dst = match dst.parent() {
                        Some(p) if target.is_relative() => p.join(target),
                        _ => target,
                    };
                    existing = None;
                }
                Ok(Some(ThroughLink::RemoveLoop)) => {
                    remove(&dst)?;
                    existing = None;
                }
                Ok(None) => {
                    let e =
                        std::io::Error::from_raw_os_error(rustix::io::Errno::LOOP.raw_os_error());
                    return Err(Refused::io(
                        format!(
                            "cannot create regular file {}: {}",
                            quoted(&dst),
                            io_words(&e)
                        ),
                        &e,
                    ));
                }
            }
        }
        let mut job = Job {
            dst,
            write_into: false,
            as_file: role.as_file,
            is_dir: role.is_dir,
            dir_existed: false,
            backup: None,
            link_to: None,
            follow,
        };
        if let Some(old) = existing {
            let old_f = StatFacts::of(&old);
            let lst = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| StatFacts::of(&m));
            let st = |p: &Path| std::fs::metadata(p).ok().map(|m| StatFacts::of(&m));
            let named_target = st(named);
            let facts = ExistingFacts {
                src: s,
                old: old_f,
                same: SameFileFacts {
                    src: s,
                    dst: old_f,
                    src_link: lst(src),
                    dst_link: lst(named),
                    src_target: st(src),
                    dst_target: named_target,
                    same_name: resolved_name(src) == resolved_name(named),
                },
                backup_over_self: o.force
                    && o.backup.is_some()
                    && src == named
                    && named_target.is_some_and(|m| m.kind == decide::FileKind::File),
                writable: rustix::fs::access(&job.dst, rustix::fs::Access::WRITE_OK).is_ok(),
                just_created: seen.created.contains(&old_f.id()),
                src_is_dot: matches!(super::base_name(src).as_bytes(), b"." | b".."),
            };
            let decision = decide::existing(o, role, &facts, &job.dst, ask).map_err(|r| {
                let d = if r == Refusal::SameFile {
                    named
                } else {
                    &job.dst
                };
                let target = (r == Refusal::NameTaken(decide::FileKind::Symlink))
                    .then(|| std::fs::read_link(src).unwrap_or_default());
                Refused::rule(&r, src, d, target.as_deref())
            })?;
            let r = match decision {
                Decision::Keep(reason) => return self.kept(&job.dst, reason),
                Decision::Replace(r) => r,
            };
            job.dir_existed = r.dir_existed;
            job.write_into = r.write_into;
            if let Some(how) = r.backup {
                let backup = self.back_up(&s, &job.dst, how)?;
                if how == BackupHow::CopySelf {
                    return self.kept(&job.dst, KeepReason::Same);
                }
                job.backup = Some(backup);
            }
            if r.remove_first {
                remove(&job.dst)?;
            }
        }
        // As GNU: with links preserved, a followed symlink can meet its
        // target among the operands, so followed sources count too.
        if o.preserve_links && !role.is_dir && (s.nlink > 1 || follow) {
            match seen.links.get(&sid) {
                Some(first) => job.link_to = Some(first.clone()),
                None => {
                    seen.links.insert(sid, job.dst.clone());
                }
            }
        }
        Ok(Some(job))
    }

    /// Move the destination aside as its backup, as GNU does (or, for
    /// `cp -fb F F`, copy F to its backup name).
    fn back_up(&self, s: &StatFacts, dst: &Path, how: BackupHow) -> Result<PathBuf, Refused> {
        let o = self.o;
        let kind = o.backup.expect("a backup was decided");
        let highest = if kind == super::Backup::Simple {
            0
        } else {
            highest_numbered(dst)
        };
        let name = decide::backup_name(kind, dst, o.suffix(), highest);
        let at_name = std::fs::symlink_metadata(&name)
            .ok()
            .map(|m| StatFacts::of(&m));
        if decide::backup_destroys_source(kind, at_name.as_ref(), s) {
            return Err(Refused::rule(
                &Refusal::BackupDestroysSource,
                self.src,
                dst,
                None,
            ));
        }
        let result = match (how, o.link) {
            (BackupHow::CopySelf, Some(LinkKind::Hard)) => std::fs::hard_link(dst, &name),
            (BackupHow::CopySelf, Some(LinkKind::Symbolic)) => {
                symlink_to(self.src, &name).map_err(std::io::Error::other)
            }
            (BackupHow::CopySelf, None) => crate::clone_file(
                dst,
                &name,
                &crate::CloneOptions {
                    overwrite: crate::Overwrite::Replace,
                    preserve: crate::Preserve::ALL,
                    ..Default::default()
                },
            )
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string())),
            (BackupHow::Rename, _) => std::fs::rename(dst, &name),
        };
        result.map_err(|e| {
            Refused::io(
                format!("cannot backup {}: {}", quoted(dst), io_words(&e)),
                &e,
            )
        })?;
        Ok(name)
    }

    /// Do the job; returns whether it was a tree copy.
    fn carry_out(&self, job: &Job, ask: &mut AskFn<'_>) -> bool {
        let (o, src) = (self.o, self.src);
        let dst = job.dst.as_path();
        let t = Instant::now();
        let restore = || {
            if let Some(b) = &job.backup {
                if std::fs::symlink_metadata(dst).is_err() {
                    let _ = std::fs::rename(b, dst);
                }
            }
        };
        let fail_msg = |msg: String| {
            restore();
            self.refused(
                Refused {
                    message: msg,
                    kind: ErrorKind::Io,
                    errno: None,
                },
                dst,
            );
        };
        let fail = |e: &Error| {
            restore();
            self.failed(dst, e);
        };
        let ok = |outcome: Outcome| {
            self.tally.count_file(&outcome);
            self.observer.event(&CpEvent::Copied {
                src,
                dst,
                outcome,
                elapsed: t.elapsed(),
                backup: job.backup.as_deref(),
            });
        };
        let linked = Outcome {
            method: Method::Hardlink,
            bytes: 0,
        };
        if let Some(first) = &job.link_to {
            if std::fs::symlink_metadata(dst).is_ok_and(|m| !m.is_dir()) {
                // As GNU: the name is taken by the link to the first copy.
                let _ = std::fs::remove_file(dst);
            }
            match hardlink(first, dst, false) {
                Ok(()) => ok(linked),
                Err(m) => fail_msg(m),
            }
        } else if let (Some(kind), false) = (o.link, job.is_dir) {
            let made = match kind {
                LinkKind::Hard => hardlink(src, dst, job.follow),
                LinkKind::Symbolic => symlink_to(src, dst),
            };
            match made {
                Ok(()) => ok(linked),
                Err(m) => fail_msg(m),
            }
        } else if job.write_into {
            match write_into(src, dst) {
                Ok(n) => ok(Outcome {
                    method: Method::ReadWrite,
                    bytes: n,
                }),
                Err(e) => fail_msg(format!("cannot write to {}: {}", quoted(dst), io_words(&e))),
            }
        } else if job.as_file && !meta(src, job.follow).is_ok_and(|m| m.is_file()) {
            let mode = meta(src, job.follow).map_or(0o644, |m| m.mode());
            match copy_contents(src, dst, mode, self.tree.file.default_mode) {
                Ok(n) => ok(Outcome {
                    method: Method::ReadWrite,
                    bytes: n,
                }),
                Err(e) => fail(&e),
            }
        } else if job.as_file {
            let mut options = self.tree.file;
            if o.resume {
                let complete = match (meta(src, job.follow), std::fs::symlink_metadata(dst)) {
                    (Ok(s), Ok(d)) => decide::complete_copy(&StatFacts::of(&s), &StatFacts::of(&d)),
                    _ => false,
                };
                if complete {
                    self.tally.count_skipped();
                    self.observer.event(&CpEvent::Skipped {
                        src,
                        dst,
                        reason: SkipReason::Complete,
                    });
                    return false;
                }
                options.overwrite = crate::Overwrite::Replace;
            }
            match crate::clone_file(src, dst, &options) {
                Ok(outcome) if outcome.method == Method::Skipped => {
                    self.tally.count_skipped();
                    self.observer.event(&CpEvent::Skipped {
                        src,
                        dst,
                        reason: SkipReason::Exists,
                    });
                }
                Ok(outcome) => ok(outcome),
                Err(e) => fail(&e),
            }
        } else {
            self.observer.event(&CpEvent::TreeStart {
                dst,
                dir_existed: job.dir_existed,
            });
            let from = follow_operand(src, job.follow);
            let observer = TreeBridge {
                observer: self.observer,
                src,
                dst,
                ask: std::sync::Mutex::new(ask),
            };
            let result = copy_tree(&from, dst, self.tree, &observer);
            self.observer.event(&CpEvent::TreeEnd);
            if let Err(e) = result {
                fail(&e);
            }
            return job.is_dir;
        }
        false
    }

    /// A dry run of one operand (the tree copy reports what it would do,
    /// for a single file too); returns whether it was a directory.
    fn dry_run(&self) -> bool {
        let (src, dst) = (self.src, self.dst);
        let is_dir = meta(src, self.tree.dereference).is_ok_and(|m| m.is_dir())
            || (!self.o.recursive && src.is_dir());
        if is_dir && !self.o.recursive {
            let e = Error::new(Operation::Clone, ErrorKind::IsDirectory)
                .with_src(src)
                .with_dst(dst)
                .with_reason("source is a directory (omitted)");
            self.failed(dst, &e);
            return false;
        }
        let observer = |ev: &TreeEvent<'_>| {
            self.observer.event(&CpEvent::Tree {
                src,
                dst,
                event: ev,
            })
        };
        self.observer.event(&CpEvent::TreeStart {
            dst,
            dir_existed: false,
        });
        let result = copy_tree(src, dst, self.tree, &observer);
        self.observer.event(&CpEvent::TreeEnd);
        if let Err(e) = result {
            // Nothing could start: not counted by the tree.
            self.failed(dst, &e);
        }
        is_dir
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
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| decide::backup_number(base, &e.file_name()))
        .max()
        .unwrap_or(0)
}

/// Remove the destination `p` to take its name, or refuse in GNU's words.
fn remove(p: &Path) -> Result<(), Refused> {
    std::fs::remove_file(p)
        .map_err(|e| Refused::io(format!("cannot remove {}: {}", quoted(p), io_words(&e)), &e))
}

/// `p` with its directory resolved (`./a` and `a` are the same name).
fn resolved_name(p: &Path) -> PathBuf {
    let parent = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::canonicalize(parent)
        .unwrap_or_else(|_| parent.to_path_buf())
        .join(super::base_name(p))
}

/// Whether copying the directory `src` to `dst` would put it inside
/// itself (`dst` is `src` or below it, after resolving both).
fn into_itself(src: &Path, dst: &Path) -> bool {
    let Ok(src) = std::fs::canonicalize(src) else {
        return false;
    };
    let name = super::base_name(dst);
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

/// The operand as the tree copy should open it: a followed symlink is
/// replaced by what it names (the tree copy itself follows none with -H).
fn follow_operand(src: &Path, follow: bool) -> PathBuf {
    if follow && std::fs::symlink_metadata(src).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf())
    } else {
        src.to_path_buf()
    }
}

/// `--parents`: create the directories between the target and `dst`
/// that are missing, each with its source directory's permission bits
/// when modes are preserved, else the default mode (as GNU since 8.25).
fn make_parents(src: &Path, dst: &Path, o: &CpOptions) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (Some(sp), Some(dp)) = (src.parent(), dst.parent()) else {
        return Ok(());
    };
    if std::fs::symlink_metadata(src).is_err() {
        return Ok(()); // the copy says why
    }
    let umask = crate::prim::meta::umask().unwrap_or(0o022);
    let chain: Vec<(&Path, &Path)> = sp.ancestors().zip(dp.ancestors()).collect();
    for (s, d) in chain.into_iter().rev() {
        if s.as_os_str().is_empty() {
            continue;
        }
        if std::fs::symlink_metadata(d).is_ok() {
            // With -p, GNU gives existing directories on the way the
            // source's permissions again.
            if o.preserve.mode && std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
                let mode = std::fs::metadata(s)?.permissions().mode() & 0o7777;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?;
            }
            continue;
        }
        std::fs::create_dir(d)?;
        let m = std::fs::metadata(s)?;
        let mode = if o.preserve.mode {
            m.permissions().mode() & 0o7777
        } else {
            decide::default_mode(decide::FileKind::Dir, umask)
        };
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Write the data of `src` (a FIFO, device or file read as a stream) into
/// the existing FIFO or device `dst`, as GNU cp does.
fn write_into(src: &Path, dst: &Path) -> std::io::Result<u64> {
    let mut from = std::fs::File::open(src)?;
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(dst)?;
    std::io::copy(&mut from, &mut to)
}

/// Copy the contents of the FIFO or device `src` into the file `dst`.
/// A new name appears at once, as GNU's does (a stream can take forever),
/// readable by its owner only until complete, and is removed on error;
/// an existing one is replaced atomically when the data is complete.
fn copy_contents(src: &Path, dst: &Path, mode: u32, default: bool) -> Result<u64, Error> {
    let io = |e: std::io::Error| {
        Error::new(Operation::Copy, ErrorKind::Io)
            .with_src(src)
            .with_dst(dst)
            .with_reason(io_words(&e))
    };
    let mut from = std::fs::File::open(src).map_err(io)?;
    let umask = crate::prim::meta::umask().unwrap_or(0o022);
    let bits = decide::new_mode(decide::FileKind::File, mode & 0o777, default, umask);
    if std::fs::symlink_metadata(dst).is_err() {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)
            .map_err(io)?;
        let copied = std::io::copy(&mut from, &mut to).and_then(|n| {
            to.set_permissions(std::fs::Permissions::from_mode(bits))?;
            Ok(n)
        });
        return copied.map_err(|e| {
            let _ = std::fs::remove_file(dst);
            io(e)
        });
    }
    let mut w = crate::PreallocWriter::with_options(
        dst,
        0,
        &crate::PreallocOptions {
            mode: mode & 0o777,
            overwrite: crate::Overwrite::Replace,
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
fn symlink_to(src: &Path, dst: &Path) -> Result<(), String> {
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
            io_words(&e)
        )
    })
}

/// A hardlink `dst` to `src` (`cp -l`, and preserved links).
fn hardlink(src: &Path, dst: &Path, follow: bool) -> Result<(), String> {
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
            io_words(&std::io::Error::from(e))
        )
    })
}
