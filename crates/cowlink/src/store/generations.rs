//! Object generations: when an object has as many names as its
//! filesystem allows (`EMLINK`), or as many clones as one extent may have
//! (`EOVERFLOW` on Btrfs, or the injected limit), the checkout moves on to
//! a physical copy of it (`objects/ab/<hex>.gN`), made once and shared by
//! later checkouts. `fill` drives the shared fallback machine
//! ([`Step`]): its `NextSource` step is the next generation; `hardlink`
//! does the same on `EMLINK`. Every object is checked (size, the
//! store's mtime mark, else a rehash) before it is placed.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self, AtFlags, Mode};
use rustix::io::Errno;

use super::layout::{self, object_rel};
use super::manifest::Digest;
use super::materialize::{merr, How, Want};
use super::Store;
use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::prim::mode::{Method, Outcome, Step};
use crate::prim::transfer::{transfer_error, Source};

impl Store {
    /// Open generation `gen` of an object for placing, and make sure its
    /// bytes are still the ones stored: the size must be the manifest's
    /// and the modification time the store's mark (see
    /// [`layout::UNCHANGED_MTIME`]); otherwise, or with `verify`, the object
    /// is rehashed, and placed only if it still matches its digest.
    fn checked_object(&self, want: &Want<'_>, how: &How<'_>, gen: u32) -> Result<(OwnedFd, u64)> {
        let src = self.open_object(want.digest, gen, want.shown, how.gens)?;
        let path = || self.root.join(object_rel(want.digest, gen));
        let st = fs::fstat(&src).map_err(|e| merr(want.shown, e).with_src(path()))?;
        let size = st.st_size as u64;
        let marked = layout::is_marked_unchanged(&st);
        if !how.verify && marked && want.size.is_none_or(|s| s == size) {
            return Ok((src, size));
        }
        let path = path();
        self.ensure_intact(src.as_fd(), size, want.digest, &path, want.shown, marked)?;
        if let Some(s) = want.size.filter(|s| *s != size) {
            return Err(Error::new(Operation::Materialize, ErrorKind::InvalidInput)
                .with_src(&path)
                .with_dst(want.shown)
                .with_reason(format!(
                    "the manifest says {s} bytes but object {} has {size}; the manifest is wrong",
                    want.digest
                )));
        }
        Ok((src, size))
    }

    /// Rehash the object open as `fd` (`size` bytes, at `path`) and fail
    /// with `Corrupt` unless it still holds the bytes of `digest`; an
    /// intact object that had lost the unchanged mark (`marked`) gets it
    /// back, so the next checkout need not rehash.
    fn ensure_intact(
        &self,
        fd: BorrowedFd<'_>,
        size: u64,
        digest: &Digest,
        path: &Path,
        shown: &Path,
        marked: bool,
    ) -> Result<()> {
        let (hash, len) = crate::ground::hash::hash_fd(fd, size, &|_| {})
            .map_err(|e| merr(shown, e).with_src(path))?;
        if hash != digest.0 || len != size {
            return Err(Error::new(Operation::Materialize, ErrorKind::Corrupt)
                .with_src(path)
                .with_dst(shown)
                .with_reason(format!(
                    "the store's object {digest} changed after it was stored (its bytes now hash to {}); \
                     nothing was placed; verifying the store quarantines it",
                    Digest(hash)
                )));
        }
        if !marked {
            layout::mark_unchanged(fd);
        }
        Ok(())
    }

    /// Open generation `gen` of an object, making it first when it is a
    /// further generation that does not exist yet.
    fn open_object(
        &self,
        digest: &Digest,
        gen: u32,
        shown: &Path,
        gens: &AtomicU64,
    ) -> Result<OwnedFd> {
        let rel = object_rel(digest, gen);
        let open = || self.open_in_layout(&rel);
        match open() {
            Ok(fd) => Ok(fd),
            Err(Errno::NOENT) if gen > 0 => {
                self.make_generation(digest, gen)?;
                gens.fetch_add(1, Ordering::Relaxed);
                open().map_err(|e| merr(shown, e).with_src(self.root.join(&rel)))
            }
            Err(Errno::NOENT) => Err(Error::new(Operation::Materialize, ErrorKind::NotFound)
                .with_src(digest.to_hex())
                .with_dst(shown)
                .with_reason(
                    "the store has no such object (removed by gc, or quarantined by verify?)",
                )),
            Err(e) => {
                let err = self.read_error(Operation::Materialize, &rel, e);
                Err(err.with_dst(shown))
            }
        }
    }

    /// A physical copy of an object as generation `gen` (which has blocks
    /// of its own, so it can be cloned again as often as the first).
    /// The first generation is checked like any object placed, so a
    /// changed one is never copied into a new generation.
    fn make_generation(&self, digest: &Digest, gen: u32) -> Result<()> {
        let base = self
            .open_in_layout(&object_rel(digest, 0))
            .map_err(|e| self.read_error(Operation::Store, &object_rel(digest, 0), e))?;
        let st = fs::fstat(&base).map_err(|e| super::store_err(self.object_path(digest), e))?;
        let size = st.st_size as u64;
        if !layout::is_marked_unchanged(&st) {
            let path = self.object_path(digest);
            self.ensure_intact(base.as_fd(), size, digest, &path, &path, false)?;
        }
        let rel = object_rel(digest, gen);
        let pending = self.temporary("generation")?;
        let err = |e| super::store_err(self.root.join(&rel), e);
        // Read/write only: copy_file_range could share blocks again.
        crate::prim::transfer::copy_data(
            base.as_fd(),
            pending.fd(),
            Source::of(&st),
            false,
            &|| false,
        )
        .map_err(err)?;
        fs::fchmod(pending.fd(), Mode::from_raw_mode(0o444)).map_err(err)?;
        layout::mark_unchanged(pending.fd());
        fs::fsync(pending.fd()).map_err(err)?;
        match self.persist_object(pending, digest, gen) {
            Ok(()) | Err(Errno::EXIST) => Ok(()), // or another process made it
            Err(e) => Err(err(e)),
        }
    }

    fn current_generation(&self, digest: &Digest) -> u32 {
        if !self.any_generation.load(Ordering::Relaxed) {
            return 0;
        }
        let g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        g.get(digest).copied().unwrap_or(0)
    }

    /// Generation `gen` is full: later placements start from `gen + 1`.
    fn next_generation(&self, digest: &Digest, gen: u32) -> u32 {
        self.any_generation.store(true, Ordering::Relaxed);
        let mut g = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        let cur = g.entry(*digest).or_insert(0);
        *cur = (*cur).max(gen + 1);
        *cur
    }

    /// With an injected limit: take one use of `(digest, gen)`, or say the
    /// limit is reached (as the kernel would with `EMLINK`).
    fn take_use(&self, digest: &Digest, gen: u32) -> bool {
        let Some(limit) = self.clone_limit else {
            return true;
        };
        let mut u = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        let n = u.entry((*digest, gen)).or_insert(0);
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    /// Fill the empty file `dfd` with the object's bytes per `how.link`.
    pub(super) fn fill(
        &self,
        want: &Want<'_>,
        how: &How<'_>,
        dfd: BorrowedFd<'_>,
    ) -> Result<Outcome> {
        let (digest, shown) = (want.digest, want.shown);
        let mut gen = self.current_generation(digest);
        loop {
            let (src, size) = self.checked_object(want, how, gen)?;
            let failed = |e: Errno| {
                transfer_error(
                    Operation::Materialize,
                    &self.root.join(object_rel(digest, gen)),
                    shown,
                    e,
                    src.as_fd(),
                    dfd,
                )
            };
            let copy = |offload| {
                crate::prim::transfer::copy_data(
                    src.as_fd(),
                    dfd,
                    Source::sized(size),
                    offload,
                    &|| false,
                )
                .map_err(failed)
            };
            // `place` sends hardlinks elsewhere: here the mode is a data mode.
            let mode = how.link;
            let mut step = mode.first_step();
            // The shared fallback rule; this store's generations are the
            // other sources a reference limit moves on to.
            loop {
                step = match step {
                    Step::Clone => {
                        let r = match self.take_use(digest, gen) {
                            true => cowlink_sys::ficlone(dfd, src.as_fd()),
                            false => Err(Errno::MLINK),
                        };
                        match r {
                            Ok(()) => {
                                return Ok(Outcome {
                                    method: Method::Reflink,
                                    bytes: size,
                                })
                            }
                            Err(e) => mode.after(e, true),
                        }
                    }
                    Step::Copy { offload } => return copy(offload),
                    Step::NextSource => break,
                    Step::Fail(e) => return Err(failed(e)),
                };
            }
            gen = self.next_generation(digest, gen);
        }
    }

    pub(super) fn hardlink(&self, want: &Want<'_>, how: &How<'_>) -> Result<Outcome> {
        let (dir, name, digest, shown) = (want.dir, want.name, want.digest, want.shown);
        let mut gen = self.current_generation(digest);
        loop {
            // Make sure the generation exists and is intact (and learn its size).
            let (src, size) = self.checked_object(want, how, gen)?;
            let rel = object_rel(digest, gen);
            let r = if self.take_use(digest, gen) {
                // Link the inode we opened (never a name that could have
                // been swapped for a symbolic link meanwhile).
                fs::linkat(&src, c"", dir, name, AtFlags::EMPTY_PATH).or_else(|e| match e {
                    Errno::NOENT | Errno::PERM => {
                        let proc =
                            format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&src));
                        fs::linkat(
                            rustix::fs::CWD,
                            proc.as_str(),
                            dir,
                            name,
                            AtFlags::SYMLINK_FOLLOW,
                        )
                    }
                    e => Err(e),
                })
            } else {
                Err(Errno::MLINK)
            };
            match r {
                Ok(()) => {
                    return Ok(Outcome {
                        method: Method::Hardlink,
                        bytes: size,
                    })
                }
                Err(Errno::MLINK) => gen = self.next_generation(digest, gen),
                Err(e) => {
                    let base = merr(shown, e).with_src(self.root.join(&rel));
                    return Err(match e {
                        Errno::XDEV => base.with_reason("hardlinks cannot cross filesystems"),
                        Errno::EXIST => base.with_reason("destination already exists"),
                        _ => base,
                    });
                }
            }
        }
    }
}
