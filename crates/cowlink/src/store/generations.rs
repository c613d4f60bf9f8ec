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
use rustix::fs::{self, AtFlags};
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
        let st = cowlink_sys::fstat(&src).map_err(|e| merr(want.shown, e).with_src(path()))?;
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
        let st =
            cowlink_sys::fstat(&base).map_err(|e| super::store_err(self.object_path(digest), e))?;
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
        fs::fchmod(pending.fd(), cowlink_sys::raw_mode(0o444)).map_err(err)?;
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
                // Where the platform cannot name an open file, link the
                // object's path (its last component is never followed).
                cowlink_sys::link_fd(src.as_fd(), dir, name).or_else(|e| match e {
                    Errno::OPNOTSUPP => fs::linkat(
                        rustix::fs::CWD,
                        self.root.join(&rel),
                        dir,
                        name,
                        AtFlags::empty(),
                    ),
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

#[cfg(test)]
mod tests {
    //! The generation choice, with a reference limit injected, on tmpfs
    //! (`/dev/shm`: no root, no test filesystems). Hardlinks count
    //! references the way clones do on XFS, so the limit is exercised
    //! without a filesystem that clones.
    use super::super::{CheckoutOptions, LinkMode, Store};
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

    fn shm() -> tempfile::TempDir {
        let d = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let magic = rustix::fs::statfs(d.path()).unwrap().f_type as u64;
        assert_eq!(magic, 0x0102_1994, "/dev/shm is not tmpfs");
        d
    }

    /// Five files of the same bytes and one other.
    fn tree(d: &std::path::Path) -> std::path::PathBuf {
        let src = d.join("src");
        std::fs::create_dir(&src).unwrap();
        for i in 0..5 {
            std::fs::write(src.join(format!("same{i}")), vec![7u8; 10_000]).unwrap();
        }
        std::fs::write(src.join("other"), b"other").unwrap();
        src
    }

    fn opts(link: LinkMode) -> CheckoutOptions {
        CheckoutOptions {
            link,
            ..Default::default()
        }
    }

    #[test]
    fn a_reference_limit_moves_on_to_new_generations_of_the_same_bytes() {
        let d = shm();
        let st = Store::open(d.path().join("st"))
            .unwrap()
            .with_clone_limit(2);
        let added = st.add_tree(tree(d.path())).unwrap();
        let dst = d.path().join("dst");
        let r = st
            .checkout(&added.manifest, &dst, &opts(LinkMode::Hardlink))
            .unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!((r.files, r.hardlinked), (6, 6));
        // Five uses at two per generation: generations 0, 1 and 2.
        assert_eq!(r.generations_created, 2);
        let mut by_inode: BTreeMap<u64, usize> = BTreeMap::new();
        for i in 0..5 {
            let p = dst.join(format!("same{i}"));
            assert_eq!(std::fs::read(&p).unwrap(), vec![7u8; 10_000]);
            *by_inode
                .entry(std::fs::metadata(&p).unwrap().ino())
                .or_default() += 1;
        }
        let mut uses: Vec<usize> = by_inode.into_values().collect();
        uses.sort();
        assert_eq!(uses, [1, 2, 2], "never more than the limit per generation");
        // A later checkout starts from the newest generation, and verify
        // finds every generation intact.
        let r = st
            .checkout(
                &added.manifest,
                d.path().join("dst2"),
                &opts(LinkMode::Hardlink),
            )
            .unwrap();
        assert_eq!(
            r.generations_created, 2,
            "generation 2 had one use left, then 3 and 4"
        );
        let v = st.verify().unwrap();
        assert!(v.corrupt.is_empty(), "{:?}", v.corrupt);
    }

    #[test]
    fn where_cloning_is_not_possible_clone_refuses_and_auto_copies() {
        let d = shm();
        let st = Store::open(d.path().join("st")).unwrap();
        let added = st.add_tree(tree(d.path())).unwrap();
        let dst = d.path().join("clone");
        let e = st
            .checkout(&added.manifest, &dst, &opts(LinkMode::Clone))
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::NotSupported, "{e}");
        assert!(!dst.exists(), "nothing is made when the clone trial fails");
        for link in [LinkMode::Auto, LinkMode::Copy] {
            let dst = d.path().join(format!("{link:?}"));
            let r = st.checkout(&added.manifest, &dst, &opts(link)).unwrap();
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            assert_eq!(
                (r.copied, r.cloned, r.generations_created),
                (6, 0, 0),
                "{link:?}"
            );
            assert_eq!(std::fs::read(dst.join("other")).unwrap(), b"other");
            // A copy is a file of its own: writable, not the object.
            let m = std::fs::metadata(dst.join("same0")).unwrap();
            assert_eq!(m.nlink(), 1);
            assert_ne!(m.mode() & 0o200, 0);
        }
    }
}
