//! What happens to one entry of a tree: a regular file (cloned or copied,
//! atomically), a further name of an already copied file (hardlinked), a
//! symbolic link, or a FIFO, socket or device node. Everything is relative
//! to open directory descriptors.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use cowlink_sys::Stat;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self, AtFlags, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;

use super::ctx::Ctx;
use super::node::DirNode;
use super::{Action, SkipReason, SpecialKind, TreeEvent};
use crate::ground::error::{errno_text, Error, ErrorKind, Operation};
use crate::prim::facts::{complete_copy, not_older, Prompt, StatFacts};
use crate::prim::files::file_type_name;
use crate::prim::meta::{self, times_of};
use crate::prim::mode::{LinkMode, Method, Outcome};
use crate::prim::place::{NewFile, Overwrite, Placement, UNFINISHED_MARK};
use crate::prim::transfer::{transfer, transfer_error, Source};
use crate::run::Count;

fn os(name: &CStr) -> &Path {
    Path::new(OsStr::from_bytes(name.to_bytes()))
}

/// Copy the non-directory entry `name` of `node` to `dst_name` in the
/// destination directory; report the outcome or the failure.
pub(super) fn copy_single(
    eng: &Ctx<'_>,
    node: &DirNode,
    name: &CStr,
    dst_name: &CStr,
    t: FileType,
) {
    let src = node.src_path.join(os(name));
    let dst = node.dst_path.join(os(dst_name));
    let e = Entry {
        eng,
        node,
        name,
        dst_name,
        src: &src,
        dst: &dst,
    };
    let result = match t {
        FileType::RegularFile => e.regular(),
        FileType::Symlink => e.symlink(),
        FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice
            if eng.opts.copy_contents && !eng.opts.dry_run =>
        {
            e.contents()
        }
        FileType::Fifo | FileType::Socket | FileType::CharacterDevice | FileType::BlockDevice => {
            e.special(t)
        }
        _ => Err(e
            .error(Errno::INVAL)
            .with_kind(ErrorKind::NotRegularFile)
            .with_reason("source is of unknown type, which cannot be copied")),
    };
    match result {
        // Stopped by a cancel: nothing was placed, and the report says
        // the run was cancelled; not a failure of this entry.
        Err(err) if err.kind() == ErrorKind::Cancelled && eng.cancelled() => {}
        // `cp -n`: an existing name is kept, and counted as skipped.
        Err(err)
            if err.kind() == ErrorKind::AlreadyExists
                && eng.opts.file.overwrite == Overwrite::Skip =>
        {
            eng.count(Count::Skipped, 1);
            eng.emit(TreeEvent::Skipped {
                src: &src,
                dst: &dst,
                reason: SkipReason::Exists,
            });
        }
        Err(err) => eng.fail(err),
        Ok(()) => {}
    }
}

struct Entry<'e, 'a> {
    eng: &'e Ctx<'a>,
    node: &'e DirNode,
    name: &'e CStr,
    dst_name: &'e CStr,
    src: &'e Path,
    dst: &'e Path,
}

impl Entry<'_, '_> {
    fn op(&self) -> Operation {
        match self.eng.opts.file.link {
            LinkMode::Copy => Operation::Copy,
            _ => Operation::Clone,
        }
    }

    fn error(&self, e: Errno) -> Error {
        Error::from_errno(self.op(), e)
            .with_src(self.src)
            .with_dst(self.dst)
    }

    /// An error reading the source, with the usual reasons.
    fn source_error(&self, e: Errno) -> Error {
        let err = self.error(e);
        match e {
            Errno::NOENT => err.with_reason("source vanished during the copy"),
            Errno::ACCESS | Errno::PERM => err.with_reason("permission denied reading the source"),
            Errno::LOOP | Errno::NOTDIR => err.with_reason("source changed type during the copy"),
            _ => err,
        }
    }

    /// An error creating or placing the destination.
    fn dest_error(&self, e: Errno) -> Error {
        let err = self.error(e);
        match e {
            Errno::EXIST => {
                match cowlink_sys::statat(self.dst_dir(), self.dst_name, AtFlags::SYMLINK_NOFOLLOW)
                {
                    Ok(st) if cowlink_sys::file_type(st.st_mode) == FileType::Directory => err
                        .with_kind(ErrorKind::IsDirectory)
                        .with_reason("destination is an existing directory"),
                    _ => err.with_reason("destination already exists"),
                }
            }
            Errno::ISDIR => err
                .with_kind(ErrorKind::IsDirectory)
                .with_reason("destination is an existing directory"),
            Errno::NOSPC => err.with_reason("no space left on the destination filesystem"),
            Errno::DQUOT => err.with_reason("disk quota exceeded on the destination filesystem"),
            Errno::ACCESS | Errno::PERM => {
                err.with_reason("permission denied creating the destination")
            }
            _ => err,
        }
    }

    fn dst_dir(&self) -> BorrowedFd<'_> {
        self.node.dst_fd()
    }

    fn lstat(&self) -> Result<Stat, Error> {
        cowlink_sys::statat(&self.node.src, self.name, self.stat_flags())
            .map_err(|e| self.source_error(e))
    }

    fn stat_flags(&self) -> AtFlags {
        if self.eng.opts.dereference {
            AtFlags::empty()
        } else {
            AtFlags::SYMLINK_NOFOLLOW
        }
    }

    fn planned(&self, action: Action) {
        self.eng.emit(TreeEvent::Planned {
            src: self.src,
            dst: self.dst,
            action,
        });
    }

    /// A regular file: clone or copy (or link to an earlier name's copy).
    fn regular(&self) -> Result<(), Error> {
        let opts = self.eng.opts;
        if opts.dry_run {
            let st = self.lstat()?;
            return self.maybe_hardlinked(&st, || {
                self.eng.count(Count::Files, 1);
                self.eng.count(Count::Bytes, st.st_size as u64);
                self.planned(Action::File {
                    bytes: st.st_size as u64,
                });
                Ok(())
            });
        }
        let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        if !opts.dereference {
            flags |= OFlags::NOFOLLOW;
        }
        let sfd = fs::openat(&self.node.src, self.name, flags, Mode::empty())
            .map_err(|e| self.source_error(e))?;
        let st = cowlink_sys::fstat(&sfd).map_err(|e| self.source_error(e))?;
        if cowlink_sys::file_type(st.st_mode) != FileType::RegularFile {
            return Err(self
                .error(Errno::INVAL)
                .with_kind(ErrorKind::NotRegularFile)
                .with_reason(format!(
                    "source changed type during the copy (now {})",
                    file_type_name(st.st_mode)
                )));
        }
        self.maybe_hardlinked(&st, || {
            if self.eng.opts.update_older && self.not_older(&st) {
                self.eng.count(Count::Skipped, 1);
                self.eng.emit(TreeEvent::Skipped {
                    src: self.src,
                    dst: self.dst,
                    reason: SkipReason::NotOlder,
                });
                return Ok(());
            }
            if self.already_done(&st) {
                self.eng.count(Count::Skipped, 1);
                self.eng.emit(TreeEvent::Skipped {
                    src: self.src,
                    dst: self.dst,
                    reason: SkipReason::Complete,
                });
                return Ok(());
            }
            if !self.may_replace() {
                return Ok(());
            }
            if let Some(kind) = self.link_kind() {
                return self.link_to_source(kind);
            }
            let outcome = self.clone_file(sfd.as_fd(), &st)?;
            self.eng.count(Count::Files, 1);
            self.eng.count(Count::Bytes, outcome.bytes);
            opts.run.done(1, outcome.bytes);
            self.eng.count(
                if outcome.method == Method::Reflink {
                    Count::Cloned
                } else {
                    Count::Copied
                },
                1,
            );
            self.eng.emit(TreeEvent::File {
                src: self.src,
                dst: self.dst,
                outcome,
            });
            Ok(())
        })
    }

    /// Run `copy`, unless this is a further name of a file already copied
    /// (hardlinks preserved): then link to that copy instead.
    fn maybe_hardlinked(
        &self,
        st: &Stat,
        copy: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        // Following symlinks, two names can reach one file with a single
        // link count: every file is remembered then.
        if !self.eng.opts.hardlinks || (st.st_nlink < 2 && !self.eng.opts.dereference) {
            return copy();
        }
        let rel = self.node.rel.join(os(self.dst_name));
        let link = |to: &Path| -> Result<(), Error> {
            if !self.eng.opts.dry_run {
                let root = self
                    .eng
                    .root_dst
                    .as_ref()
                    .expect("a tree copy has a root")
                    .as_fd();
                self.place(|dir, name| fs::linkat(root, to, dir, name, AtFlags::empty()))?;
            }
            self.eng.count(Count::Hardlinks, 1);
            if self.eng.opts.dry_run {
                self.planned(Action::Hardlink);
            } else {
                self.eng.emit(TreeEvent::Hardlink {
                    src: self.src,
                    dst: self.dst,
                });
            }
            Ok(())
        };
        self.eng
            .links
            .link_or_copy(st, rel, self.eng.opts.dereference, link, copy)
            .map(|_| ())
    }

    /// Create a name with `make(dir, name)` (symlinkat, linkat, mknodat):
    /// directly when refusing to overwrite, else at a temporary name that
    /// is then renamed over the destination (atomic replace).
    fn place(
        &self,
        make: impl Fn(BorrowedFd<'_>, &CStr) -> Result<(), Errno>,
    ) -> Result<(), Error> {
        let replace = self.eng.opts.file.overwrite == Overwrite::Replace || self.eng.opts.resume;
        let backup = if replace { self.back_up_old()? } else { None };
        crate::prim::place::place_name(self.dst_dir(), self.dst_name, replace, make).map_err(|e| {
            self.restore(backup);
            self.dest_error(e)
        })
    }

    /// With [`TreeOptions::backup`](super::TreeOptions::backup): move an
    /// existing destination that is not a directory to its backup name in
    /// the same directory. Returns that name, for [`Entry::restore`].
    fn back_up_old(&self) -> Result<Option<CString>, Error> {
        let Some(b) = &self.eng.opts.backup else {
            return Ok(None);
        };
        let dir = self.dst_dir();
        let Ok(old) = cowlink_sys::statat(dir, self.dst_name, AtFlags::SYMLINK_NOFOLLOW) else {
            return Ok(None);
        };
        if cowlink_sys::file_type(old.st_mode) == FileType::Directory {
            return Ok(None);
        }
        let cannot = |e: Errno| {
            self.dest_error(e)
                .with_reason(format!("cannot back up the destination: {}", errno_text(e)))
        };
        // Numbered backups need the highest number already there.
        let mut names: Vec<Vec<u8>> = Vec::new();
        if b.kind != crate::prim::backup::Backup::Simple {
            for e in fs::Dir::read_from(dir).map_err(cannot)? {
                names.push(e.map_err(cannot)?.file_name().to_bytes().to_vec());
            }
        }
        let name = b.name_in(
            OsStr::from_bytes(self.dst_name.to_bytes()),
            names.iter().map(|n| OsStr::from_bytes(n)),
        );
        let name =
            CString::new(name.into_os_string().into_vec()).map_err(|_| cannot(Errno::INVAL))?;
        fs::renameat(dir, self.dst_name, dir, name.as_c_str()).map_err(cannot)?;
        Ok(Some(name))
    }

    /// Put a backup made by [`Entry::back_up_old`] back under the
    /// destination's name after a failed copy, unless something took it.
    fn restore(&self, backup: Option<CString>) {
        if let Some(b) = backup {
            let dir = self.dst_dir();
            let _ = fs::renameat_with(dir, &b, dir, self.dst_name, fs::RenameFlags::NOREPLACE);
        }
    }

    /// Clone (or copy) the open source into a new file placed as the
    /// directory's [`Placement`] says (directly in a directory this run
    /// created, else an unnamed file linked into place), set its metadata.
    fn clone_file(&self, sfd: BorrowedFd<'_>, st: &Stat) -> Result<Outcome, Error> {
        let opts = &self.eng.opts.file;
        let dir = self.dst_dir();
        // The old file keeps its data unless it is to be removed or backed
        // up first (then a new, empty one takes its name, as GNU's).
        if opts.attributes_only
            && opts.overwrite == Overwrite::Replace
            && !self.eng.opts.remove_destination
            && self.eng.opts.backup.is_none()
        {
            if let Some(done) = self.attributes_into_existing(sfd, st)? {
                return Ok(done);
            }
        }
        let dst_name = os(self.dst_name);
        // Resuming: keep what already matches, replace anything else.
        let overwrite = if self.eng.opts.resume {
            Overwrite::Replace
        } else {
            opts.overwrite
        };
        let placement = self.node.placement;
        // Under its final name, the file carries the unfinished mark until
        // its final mode is set (see `left_unfinished`).
        let marked = placement == Placement::Direct;
        let bits = self.eng.opts.new_bits(st.st_mode) | if marked { UNFINISHED_MARK } else { 0 };
        let file = NewFile::create(
            dir,
            Path::new("."),
            dst_name,
            cowlink_sys::raw_mode(bits),
            placement,
            self.dst,
        )
        .map_err(|e| self.dest_error(e))?;
        let dfd = file.fd();
        let before_copy = || match (overwrite, placement) {
            // Refuse before copying data in vain (the final link re-checks).
            (Overwrite::Refuse | Overwrite::Skip, Placement::Atomic) => {
                match cowlink_sys::statat(dir, self.dst_name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(_) => Err(self.dest_error(Errno::EXIST)),
                    Err(_) => Ok(()),
                }
            }
            _ => Ok(()),
        };
        let failed = |e: Errno| transfer_error(self.op(), self.src, self.dst, e, sfd, dfd);
        let cancelled = || self.eng.cancelled();
        // `cp --attributes-only`: a new file stays empty.
        let done = if opts.attributes_only {
            before_copy()?;
            Outcome {
                method: Method::ReadWrite,
                bytes: 0,
            }
        } else {
            transfer(
                sfd,
                dfd,
                Source::of(st).with_sparse(opts.sparse),
                opts.link,
                &before_copy,
                &failed,
                &cancelled,
            )?
        };
        let created = self
            .node
            .new_gid
            .and_then(|gid| meta::Created::predict(bits, gid));
        match created {
            Some(c) => meta::apply_created(sfd, st, dfd, opts.preserve, c),
            None if marked && !opts.preserve.mode => {
                meta::apply(sfd, st, dfd, opts.preserve).and_then(|()| meta::clear_mark(dfd))
            }
            None => meta::apply(sfd, st, dfd, opts.preserve),
        }
        .map_err(|m| {
            self.error(m.errno)
                .with_reason(format!("cannot {}: {}", m.what, errno_text(m.errno)))
        })?;
        // As cp: a file written over an existing one keeps that file's
        // permission bits unless modes are preserved.
        if opts.overwrite == Overwrite::Replace
            && !opts.preserve.mode
            && !self.eng.opts.resume
            && !self.eng.opts.remove_destination
            && self.eng.opts.backup.is_none()
            && placement == Placement::Atomic
        {
            if let Ok(old) = cowlink_sys::statat(dir, self.dst_name, AtFlags::SYMLINK_NOFOLLOW) {
                if cowlink_sys::file_type(old.st_mode) == FileType::RegularFile {
                    fs::fchmod(
                        dfd,
                        cowlink_sys::raw_mode(crate::prim::place::kept_mode(
                            st.st_mode,
                            old.st_mode,
                        )),
                    )
                    .map_err(|e| self.error(e))?;
                }
            }
        }
        // A direct file holds its final name already: nothing old is there.
        let backup = if overwrite == Overwrite::Replace && placement == Placement::Atomic {
            self.back_up_old()?
        } else {
            None
        };
        file.commit(dst_name, overwrite).map_err(|e| {
            self.restore(backup);
            self.dest_error(e)
        })?;
        Ok(done)
    }

    /// `cp --attributes-only` over an existing regular file (not the
    /// source itself): it keeps its content and gets the metadata, as
    /// GNU's and [`crate::clone_file`]'s do. `None` when there is no such
    /// file (a new, empty one is made then).
    fn attributes_into_existing(
        &self,
        sfd: BorrowedFd<'_>,
        st: &Stat,
    ) -> Result<Option<Outcome>, Error> {
        let Ok(old) = cowlink_sys::statat(self.dst_dir(), self.dst_name, AtFlags::SYMLINK_NOFOLLOW)
        else {
            return Ok(None);
        };
        if cowlink_sys::file_type(old.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        let nothing = Outcome {
            method: Method::ReadWrite,
            bytes: 0,
        };
        if (old.st_dev, old.st_ino) == (st.st_dev, st.st_ino) {
            return Ok(Some(nothing)); // the source itself: nothing to carry
        }
        let dfd = fs::openat(
            self.dst_dir(),
            self.dst_name,
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| self.dest_error(e))?;
        meta::apply(sfd, st, dfd.as_fd(), self.eng.opts.file.preserve).map_err(|m| {
            self.error(m.errno)
                .with_reason(format!("cannot {}: {}", m.what, errno_text(m.errno)))
        })?;
        Ok(Some(nothing))
    }

    /// With [`TreeOptions::update_older`](super::TreeOptions::update_older): whether an existing destination
    /// is at least as new as the source (by modification time).
    fn not_older(&self, st: &Stat) -> bool {
        cowlink_sys::statat(self.dst_dir(), self.dst_name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|d| not_older(&StatFacts::of_stat(st), &StatFacts::of_stat(&d)))
    }

    /// The kind of link every non-directory becomes (`cp -rl`, `cp -rs`),
    /// if any. `file.link` Hardlink is `link` Hard: one word for a tree.
    fn link_kind(&self) -> Option<super::LinkKind> {
        let hard = (self.eng.opts.file.link == LinkMode::Hardlink).then_some(super::LinkKind::Hard);
        self.eng.opts.link.or(hard)
    }

    /// With [`TreeOptions::link`](super::TreeOptions::link): a hardlink to the source, or a symbolic
    /// link naming it, in place of a copy.
    fn link_to_source(&self, kind: super::LinkKind) -> Result<(), Error> {
        match kind {
            super::LinkKind::Hard => {
                // Following links, the link goes to what they name.
                let flags = if self.eng.opts.dereference {
                    AtFlags::SYMLINK_FOLLOW
                } else {
                    AtFlags::empty()
                };
                self.place(|dir, name| fs::linkat(&self.node.src, self.name, dir, name, flags))?
            }
            super::LinkKind::Symbolic => {
                let target = self.src.as_os_str().as_bytes();
                self.place(|dir, name| fs::symlinkat(target, dir, name))?
            }
        }
        self.eng.count(Count::Hardlinks, 1);
        self.eng.emit(TreeEvent::Hardlink {
            src: self.src,
            dst: self.dst,
        });
        Ok(())
    }

    /// With [`TreeOptions::resume`](super::TreeOptions::resume): whether
    /// the destination is a regular file with the source's size and
    /// modification time, i.e. one a finished run placed. A file left by an
    /// interrupted run never qualifies: its times are set last.
    fn already_done(&self, st: &Stat) -> bool {
        if !self.eng.opts.resume || self.node.placement == Placement::Direct {
            return false; // a directory this run created holds nothing old
        }
        cowlink_sys::statat(self.dst_dir(), self.dst_name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|d| complete_copy(&StatFacts::of_stat(st), &StatFacts::of_stat(&d)))
    }

    /// With [`TreeOptions::interactive`](super::TreeOptions::interactive):
    /// whether an existing destination that is not a directory may be
    /// replaced, asked of the observer with GNU's question (which names
    /// the mode it overrides when the file is not writable). A no is
    /// counted and reported as skipped. True when nothing is there to
    /// replace (a directory in the way fails later with its own error).
    fn may_replace(&self) -> bool {
        if !self.eng.opts.interactive || self.eng.opts.dry_run {
            return true;
        }
        let Ok(old) = cowlink_sys::statat(self.dst_dir(), self.dst_name, AtFlags::SYMLINK_NOFOLLOW)
        else {
            return true;
        };
        let t = cowlink_sys::file_type(old.st_mode);
        if t == FileType::Directory {
            return true;
        }
        let writable = t == FileType::Symlink
            || fs::accessat(
                self.dst_dir(),
                self.dst_name,
                fs::Access::WRITE_OK,
                AtFlags::empty(),
            )
            .is_ok();
        let prompt = Prompt {
            dst: self.dst,
            overriding_mode: (!writable).then_some(old.st_mode & 0o7777),
        };
        if self.eng.may_replace(&prompt) {
            return true;
        }
        self.eng.count(Count::Skipped, 1);
        self.eng.emit(TreeEvent::Skipped {
            src: self.src,
            dst: self.dst,
            reason: SkipReason::Declined,
        });
        false
    }

    /// A symbolic link, recreated with the same target (never followed).
    fn symlink(&self) -> Result<(), Error> {
        let st = self.lstat()?;
        if self.eng.opts.dry_run {
            self.eng.count(Count::Symlinks, 1);
            self.planned(Action::Symlink);
            return Ok(());
        }
        if !self.may_replace() {
            return Ok(());
        }
        // As GNU on Linux (which can hardlink symlinks): -l links the
        // symlink itself, -s names it.
        if let Some(kind) = self.link_kind() {
            return self.link_to_source(kind);
        }
        let target = fs::readlinkat(&self.node.src, self.name, Vec::new())
            .map_err(|e| self.source_error(e))?;
        self.place(|dir, name| fs::symlinkat(target.as_c_str(), dir, name))?;
        self.name_metadata(&st, false)?;
        self.eng.count(Count::Symlinks, 1);
        self.eng.emit(TreeEvent::Symlink {
            src: self.src,
            dst: self.dst,
        });
        Ok(())
    }

    /// A FIFO or device read as data into a new regular file
    /// ([`TreeOptions::copy_contents`](super::TreeOptions::copy_contents)),
    /// placed like any copy so that a failure leaves no partial name.
    fn contents(&self) -> Result<(), Error> {
        if !self.may_replace() {
            return Ok(());
        }
        let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY;
        if !self.eng.opts.dereference {
            flags |= OFlags::NOFOLLOW;
        }
        let sfd = fs::openat(&self.node.src, self.name, flags, Mode::empty())
            .map_err(|e| self.source_error(e))?;
        let st = cowlink_sys::fstat(&sfd).map_err(|e| self.source_error(e))?;
        let placement = self.node.placement;
        let marked = placement == Placement::Direct;
        let bits = self.eng.opts.new_bits(st.st_mode) | if marked { UNFINISHED_MARK } else { 0 };
        let file = NewFile::create(
            self.dst_dir(),
            Path::new("."),
            os(self.dst_name),
            cowlink_sys::raw_mode(bits),
            placement,
            self.dst,
        )
        .map_err(|e| self.dest_error(e))?;
        let dfd = file.fd();
        let cancelled = || self.eng.cancelled();
        let bytes = crate::prim::transfer::copy_to_eof(sfd.as_fd(), dfd, &cancelled)
            .map_err(|e| transfer_error(self.op(), self.src, self.dst, e, sfd.as_fd(), dfd))?;
        let preserve = self.eng.opts.file.preserve;
        meta::apply(sfd.as_fd(), &st, dfd, preserve)
            .and_then(|()| {
                if marked && !preserve.mode {
                    meta::clear_mark(dfd)
                } else {
                    Ok(())
                }
            })
            .map_err(|m| {
                self.error(m.errno).with_reason(format!(
                    "cannot {}: {}",
                    m.what,
                    errno_text(m.errno)
                ))
            })?;
        file.commit(os(self.dst_name), self.eng.opts.file.overwrite)
            .map_err(|e| self.dest_error(e))?;
        let outcome = Outcome {
            method: Method::ReadWrite,
            bytes,
        };
        self.eng.count(Count::Files, 1);
        self.eng.count(Count::Bytes, bytes);
        self.eng.count(Count::Copied, 1);
        self.eng.opts.run.done(1, bytes);
        self.eng.emit(TreeEvent::File {
            src: self.src,
            dst: self.dst,
            outcome,
        });
        Ok(())
    }

    /// A FIFO, socket or device node, recreated with `mknodat`.
    fn special(&self, t: FileType) -> Result<(), Error> {
        let st = self.lstat()?;
        let kind = match t {
            FileType::Fifo => SpecialKind::Fifo,
            FileType::Socket => SpecialKind::Socket,
            FileType::CharacterDevice => SpecialKind::CharDevice,
            _ => SpecialKind::BlockDevice,
        };
        if self.eng.opts.dry_run {
            self.eng.count(Count::Specials, 1);
            self.planned(Action::Special { kind });
            return Ok(());
        }
        if !self.may_replace() {
            return Ok(());
        }
        // As GNU: -l links FIFOs and device nodes too, -s names them.
        if let Some(kind) = self.link_kind() {
            return self.link_to_source(kind);
        }
        let mode = cowlink_sys::raw_mode(self.eng.opts.new_bits(st.st_mode));
        self.place(|dir, name| cowlink_sys::mknodat(dir, name, t, mode, st.st_rdev))
            .map_err(|e| match e.errno() {
                Some(Errno::PERM) => e.with_reason(
                    "creating device nodes needs privileges (CAP_MKNOD); run as root or leave devices out",
                ),
                _ => e,
            })?;
        self.name_metadata(&st, true)?;
        self.eng.count(Count::Specials, 1);
        self.eng.emit(TreeEvent::Special {
            src: self.src,
            dst: self.dst,
            kind,
        });
        Ok(())
    }

    /// Owner, mode (not for symlinks) and times of a name we created,
    /// without following it.
    fn name_metadata(&self, st: &Stat, with_mode: bool) -> Result<(), Error> {
        let p = self.eng.opts.file.preserve;
        let dir = self.dst_dir();
        let what = |what: &'static str| {
            move |e: Errno| {
                self.error(e)
                    .with_reason(format!("cannot {what}: {}", errno_text(e)))
            }
        };
        if p.ownership {
            let (uid, gid) = (Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid));
            match fs::chownat(
                dir,
                self.dst_name,
                Some(uid),
                Some(gid),
                AtFlags::SYMLINK_NOFOLLOW,
            ) {
                Ok(()) | Err(Errno::PERM) => {}
                Err(e) => return Err(what("preserve ownership")(e)),
            }
        }
        if with_mode && p.mode {
            fs::chmodat(
                dir,
                self.dst_name,
                cowlink_sys::raw_mode(st.st_mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(what("set the mode"))?;
        }
        if p.timestamps {
            fs::utimensat(dir, self.dst_name, &times_of(st), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(what("preserve timestamps"))?;
        }
        Ok(())
    }
}
