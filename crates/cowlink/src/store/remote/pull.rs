//! Pull: manifests and the objects the local store lacks, from the
//! remote, checked on arrival.
//!
//! A manifest is taken from the local store when it is there (no request
//! at all), else fetched and checked: its BLAKE3 must be its name. Each
//! missing object is streamed into an unnamed temporary in the store
//! (one of at least [`RESUME_MIN`] bytes into its partial file
//! `tmp/<hex>.partial` instead, resumed with a range request by the next
//! pull when this one is cut off: `partial.rs`), preallocated to the
//! manifest's size, hashed as it arrives, and kept only if the size and
//! digest match. Verified objects wait, unnamed or partial, in a batch (of at most 512, fewer under a low limit on open files); one
//! `syncfs` makes a batch durable and then each is linked
//! under its name, so after a crash an object is whole or absent. The
//! manifests are written last. Pulling holds the store's shared lock, as
//! an add does, so a local gc never runs in between.

use futures::StreamExt;
use object_store::ObjectStore;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs;
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::prim::place::PendingFile;
use crate::run::Phase;
use crate::store::layout::{mark_unchanged, write_all};
use crate::store::manifest::{Digest, Manifest};
use crate::store::{store_err, Store};

use super::partial::{partial_name, Partial, RESUME_MIN};
use super::{Remote, RequestCounts};

/// Verified objects linked into the store per `syncfs`, at most (fewer
/// where the limit on open files is low: see [`batch_files`]).
const BATCH_FILES: usize = 512;
/// Verified bytes linked into the store per `syncfs`, at most.
const BATCH_BYTES: u64 = 512 << 20;

/// What a pull did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PullReport {
    /// Manifests asked for.
    pub manifests: u64,
    /// Manifests the local store already had.
    pub manifests_local: u64,
    /// Manifests downloaded.
    pub manifests_fetched: u64,
    /// Distinct objects the manifests name.
    pub objects: u64,
    /// Of those, objects the local store already had.
    pub objects_present: u64,
    /// Objects downloaded and verified.
    pub objects_downloaded: u64,
    /// Object bytes received from the network for the objects downloaded
    /// (not those an earlier, cut-off pull had left: see
    /// `bytes_resumed`).
    pub bytes_downloaded: u64,
    /// Objects finished from the partial file an earlier pull left.
    pub objects_resumed: u64,
    /// Object bytes an earlier pull had downloaded into partial files and
    /// this one verified and kept instead of downloading them again.
    pub bytes_resumed: u64,
    /// Requests made.
    pub requests: RequestCounts,
}

/// How many verified objects a batch may hold open: [`BATCH_FILES`], or
/// what fits in half the soft limit on open files after `transfers`
/// downloads in flight (each an open file and a connection), so that a
/// process under `ulimit -n 256` pulls in smaller batches instead of
/// failing with EMFILE. The other half stays the caller's.
fn batch_files(transfers: usize) -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let room = (limit / 2).saturating_sub(2 * transfers as u64);
    (room.min(BATCH_FILES as u64) as usize).max(1)
}

/// Where a verified object waits for its batch's `syncfs`.
enum Landed<'s> {
    /// An unnamed temporary.
    Unnamed(PendingFile<'s>),
    /// Its partial file (`tmp/<hex>.partial`), still locked.
    Partial(Partial),
}

/// A verified object waiting for its batch's `syncfs`.
struct Verified<'s> {
    file: Landed<'s>,
    digest: Digest,
    size: u64,
    /// Its bytes received from the network by this pull.
    fetched: u64,
    /// Its bytes an earlier pull had left in its partial file.
    resumed: u64,
}

impl Store {
    /// Make the local store hold `manifests` and every object they name,
    /// downloading what it lacks.
    ///
    /// # Errors
    /// `NotFound` for a manifest or object the remote lacks, `Corrupt`
    /// naming the digest of a manifest or object whose bytes do not match
    /// it (nothing of it is stored), `PermissionDenied`, `Io` after the
    /// retries, `NoSpace`, `Cancelled`. Objects verified before a failure
    /// stay in the store (they are whole); no manifest is written unless
    /// every object it names is stored.
    pub fn pull(&self, remote: &Remote, manifests: &[Digest]) -> Result<PullReport> {
        let op = Operation::Pull;
        let before = remote.requests();
        let _lock = self.lock(false)?;
        let mut report = PullReport {
            manifests: manifests.len() as u64,
            ..PullReport::default()
        };
        let mut fetched: Vec<Manifest> = Vec::new();
        let mut all: Vec<Manifest> = Vec::new();
        for d in manifests {
            match self.manifest(d) {
                Ok(m) => {
                    report.manifests_local += 1;
                    all.push(m);
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let m = remote.block_on(fetch_manifest(remote, d))?;
                    report.manifests_fetched += 1;
                    all.push(m.clone());
                    fetched.push(m);
                }
                Err(e) => return Err(e),
            }
        }
        let wanted = super::objects_named(&all);
        report.objects = wanted.len() as u64;
        let missing: Vec<(Digest, u64)> = wanted
            .into_iter()
            .filter(|(d, _)| !self.contains(d))
            .collect();
        report.objects_present = report.objects - missing.len() as u64;
        let total: u64 = missing.iter().map(|(_, s)| s).sum();
        self.run.enter(Phase::Download, missing.len() as u64, total);

        let (n, bytes, resumed, mut errors) = remote.block_on(async {
            let mut results = futures::stream::iter(missing.iter())
                .map(|(d, s)| download(self, remote, *d, *s))
                .buffer_unordered(remote.transfers());
            let batch_max = batch_files(remote.transfers());
            let mut batch: Vec<Verified<'_>> = Vec::new();
            let mut batch_bytes = 0u64;
            let (mut n, mut bytes) = (0u64, 0u64);
            let mut resumed = (0u64, 0u64);
            let mut errors: Vec<Error> = Vec::new();
            while let Some(r) = results.next().await {
                match r {
                    Ok(v) => {
                        batch_bytes += v.size;
                        n += 1;
                        bytes += v.fetched;
                        if v.resumed > 0 {
                            resumed.0 += 1;
                            resumed.1 += v.resumed;
                        }
                        self.run.done(1, 0);
                        batch.push(v);
                        if batch.len() >= batch_max || batch_bytes >= BATCH_BYTES {
                            if let Err(e) = self.link_batch(&mut batch) {
                                errors.push(e);
                                break;
                            }
                            batch_bytes = 0;
                        }
                    }
                    // A wrong object: the others are still worth having.
                    Err(e) if e.kind() == ErrorKind::Corrupt => errors.push(e),
                    // Anything else (the server gone, no space, a
                    // cancel) would fail every remaining object too.
                    Err(e) => {
                        errors.push(e);
                        break;
                    }
                }
                if self.run.cancelled() {
                    break;
                }
            }
            drop(results);
            if let Err(e) = self.link_batch(&mut batch) {
                errors.push(e);
            }
            (n, bytes, resumed, errors)
        });
        report.objects_downloaded = n;
        report.bytes_downloaded = bytes;
        (report.objects_resumed, report.bytes_resumed) = resumed;
        if self.run.cancelled() {
            return Err(Error::new(op, ErrorKind::Cancelled)
                .with_src(remote.url())
                .with_reason(
                    "cancelled: objects verified so far are stored, and what arrived of large \
                     ones is kept for the next pull; no manifest was written",
                ));
        }
        if !errors.is_empty() {
            let more = errors.len() - 1;
            let first = errors.swap_remove(0);
            let why = match more {
                0 => format!("{}; no manifest was written", first.reason()),
                n => format!(
                    "{} (and {n} more failures); no manifest was written",
                    first.reason()
                ),
            };
            return Err(first.with_reason(why));
        }
        for m in &fetched {
            self.write_manifest(m)?;
        }
        self.run.finish();
        report.requests = remote.requests().since(&before);
        Ok(report)
    }

    /// Make a batch of verified objects durable (one `syncfs`), then name
    /// each; an object another process stored meanwhile is simply dropped.
    fn link_batch(&self, batch: &mut Vec<Verified<'_>>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        cowlink_sys::sync_filesystem(self.dir.as_fd()).map_err(|e| store_err(&self.root, e))?;
        for v in batch.drain(..) {
            let d = v.digest;
            let r = match v.file {
                Landed::Unnamed(pending) => self.persist_object(pending, &d, 0),
                Landed::Partial(p) => match self.persist_partial(&p, &d) {
                    // Its name was removed or replaced under the lock
                    // (`rm` in tmp/, a tool that ignores the lock): a file
                    // without a name cannot be linked, so its verified
                    // bytes are copied out instead of being thrown away.
                    Err(Errno::NOENT) => self.persist_copy(&p, &d, v.size)?,
                    r => r,
                },
            };
            match r {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(store_err(self.object_path(&d), e)),
            }
        }
        Ok(())
    }
}

impl Store {
    /// Store the object `d` (`size` bytes) from the verified partial `p`
    /// that has no name left: copied into an unnamed temporary, hashed
    /// again on the way (the copy is what is named), made durable and
    /// named. `Ok(Err(_))` is the naming's own failure (`EEXIST` when the
    /// store has the object already).
    fn persist_copy(
        &self,
        p: &Partial,
        d: &Digest,
        size: u64,
    ) -> Result<std::result::Result<(), Errno>> {
        let tmp = self.root().join("tmp");
        let local = |e: Errno| store_err(&tmp, e);
        let pending = self.temporary("object")?;
        crate::prim::transfer::preallocate(pending.fd(), size).map_err(local)?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < size {
            let want = (size - at).min(buf.len() as u64) as usize;
            let n = match rustix::io::pread(p.fd(), &mut buf[..want], at) {
                Ok(0) => return Err(local(Errno::IO)),
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(local(e)),
            };
            hasher.update(&buf[..n]);
            write_all(pending.fd(), &buf[..n]).map_err(local)?;
            at += n as u64;
        }
        if hasher.finalize().as_bytes() != d.as_bytes() {
            return Err(Error::new(Operation::Pull, ErrorKind::Corrupt)
                .with_src(&tmp)
                .with_reason(format!(
                    "object {d} changed in its partial file after it was verified (something \
                     wrote to it without the lock), and was not stored"
                )));
        }
        seal(pending.fd(), false).map_err(local)?;
        fs::fsync(pending.fd()).map_err(local)?;
        Ok(self.persist_object(pending, d, 0))
    }
}

/// GET the manifest `d` and check it.
async fn fetch_manifest(remote: &Remote, d: &Digest) -> Result<Manifest> {
    let op = Operation::Pull;
    let key = remote.manifest_key(d);
    let bytes = remote.get_all(op, &key).await.map_err(|e| {
        if e.kind() == ErrorKind::NotFound && !e.reason().contains("bucket") {
            let why = format!("the remote has no manifest {d}");
            e.with_reason(why)
        } else {
            e
        }
    })?;
    let got = Digest::of(&bytes);
    if got != *d {
        return Err(Error::new(op, ErrorKind::Corrupt)
            .with_src(remote.shown(&key))
            .with_reason(format!(
                "manifest {d} from the remote hashes to {got}: the remote copy is damaged \
                 or was tampered with, and was not used"
            )));
    }
    // Exactly the canonical bytes, or refused: a manifest is stored
    // under the digest of the bytes it was fetched as, never re-serialized.
    let m = Manifest::from_canonical_bytes(&bytes, &remote.shown(&key))?;
    m.validate(&d.to_hex(), true)?;
    Ok(m)
}

/// Download the object `d` (`size` bytes) and check it: into its partial
/// file (`partial.rs`) when it is large, resuming what an earlier pull
/// left there, else into an unnamed temporary of the store.
async fn download<'s>(
    store: &'s Store,
    remote: &Remote,
    d: Digest,
    size: u64,
) -> Result<Verified<'s>> {
    let op = Operation::Pull;
    if store.run.cancelled() {
        return Err(Error::new(op, ErrorKind::Cancelled));
    }
    let key = remote.object_key(&d);
    let shown = remote.shown(&key);
    let local = |e: Errno| store_err(store.root().join("tmp"), e).with_src(&shown);
    let wrong = |why: String| {
        Error::new(op, ErrorKind::Corrupt)
            .with_src(&shown)
            .with_reason(format!(
                "object {d} from the remote {why}: the remote copy is damaged or was tampered \
                 with, and nothing of it was stored"
            ))
    };
    let partial = match size >= RESUME_MIN {
        true => store.open_partial(&d, size).map_err(|e| {
            store_err(store.root().join("tmp").join(partial_name(&d)), e).with_src(&shown)
        })?,
        false => None,
    };
    let Some(mut p) = partial else {
        let pending = store.temporary("object")?;
        crate::prim::transfer::preallocate(pending.fd(), size).map_err(local)?;
        let mut hasher = blake3::Hasher::new();
        let fetched = fetch(store, remote, d, size, pending.fd(), &mut hasher, 0).await?;
        let h = hasher.finalize();
        if h.as_bytes() != d.as_bytes() {
            return Err(wrong(format!("hashes to {} instead", h.to_hex())));
        }
        seal(pending.fd(), false).map_err(local)?;
        return Ok(Verified {
            file: Landed::Unnamed(pending),
            digest: d,
            size,
            fetched,
            resumed: 0,
        });
    };
    // The bytes an earlier pull left are hashed again (the hash goes on
    // from them), and only the rest is asked for. Nothing of them is
    // trusted: the digest over all the bytes decides, and a prefix that
    // does not verify is dropped and the object downloaded whole, once.
    let mut fetched = 0u64;
    loop {
        let mut hasher = blake3::Hasher::new();
        let have = p.present;
        let prepared = rehash(store, p.fd(), have, &mut hasher)
            .and_then(|()| fs::seek(p.fd(), fs::SeekFrom::Start(have)).map(|_| ()))
            .and_then(|()| keep_size_preallocate(p.fd(), size));
        if let Err(e) = prepared {
            if have == 0 {
                store.discard_partial(p);
            }
            if e == Errno::CANCELED {
                return Err(Error::new(op, ErrorKind::Cancelled).with_src(&shown));
            }
            return Err(local(e));
        }
        match fetch(store, remote, d, size, p.fd(), &mut hasher, have).await {
            Ok(n) => fetched += n,
            // No range requests there: the whole object, once.
            Err(e) if e.kind() == ErrorKind::NotSupported && have > 0 => {
                p.restart().map_err(local)?;
                continue;
            }
            Err(e) => {
                // A wrong object leaves nothing, nor does a failure before
                // any byte arrived (an object the remote lacks); what
                // arrived of a cut-off one (the network, a cancel, a full
                // disk) stays for the next pull.
                let empty = fs::fstat(p.fd()).is_ok_and(|st| st.st_size == 0);
                if e.kind() == ErrorKind::Corrupt || empty {
                    store.discard_partial(p);
                }
                return Err(e);
            }
        }
        let h = hasher.finalize();
        if h.as_bytes() == d.as_bytes() {
            seal(p.fd(), true).map_err(local)?;
            return Ok(Verified {
                file: Landed::Partial(p),
                digest: d,
                size,
                fetched,
                resumed: have,
            });
        }
        if have == 0 {
            store.discard_partial(p);
            return Err(wrong(format!("hashes to {} instead", h.to_hex())));
        }
        p.restart().map_err(local)?;
    }
}

/// Make a verified object mode 0444 and give it the store's unchanged
/// mark. An unnamed temporary was created 0444, so only a umask that took
/// read bits away needs a `fchmod`; a partial file (created 0600) always
/// does (`always`).
fn seal(fd: BorrowedFd<'_>, always: bool) -> std::result::Result<(), Errno> {
    if always || crate::prim::meta::umask().is_none_or(|u| u & 0o444 != 0) {
        fs::fchmod(fd, cowlink_sys::raw_mode(0o444))?;
    }
    mark_unchanged(fd);
    Ok(())
}

/// Hash the first `have` bytes of `fd` into `hasher` (progress counts
/// them: they are done, though not downloaded). `ECANCELED` on a cancel.
fn rehash(
    store: &Store,
    fd: BorrowedFd<'_>,
    have: u64,
    hasher: &mut blake3::Hasher,
) -> std::result::Result<(), Errno> {
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < have {
        if store.run.cancelled() {
            return Err(Errno::CANCELED);
        }
        let want = (have - at).min(buf.len() as u64) as usize;
        let n = match rustix::io::pread(fd, &mut buf[..want], at) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        at += n as u64;
        store.run.done(0, n as u64);
    }
    Ok(())
}

/// Reserve the blocks of the whole object without changing the file's
/// size, which stays the count of bytes written (what a resume reads).
/// Best effort where the filesystem cannot; `ENOSPC` is a real failure.
fn keep_size_preallocate(fd: BorrowedFd<'_>, size: u64) -> std::result::Result<(), Errno> {
    if size == 0 {
        return Ok(());
    }
    match cowlink_sys::allocate_keep_size(fd, 0, size) {
        Ok(()) | Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Stream the object `d` (`size` bytes) from byte `have` on into `fd`
/// (at its current offset), hashing it into `hasher`, which holds the
/// first `have` bytes already. The bytes received from the network.
/// The digest is the caller's to check.
async fn fetch(
    store: &Store,
    remote: &Remote,
    d: Digest,
    size: u64,
    fd: BorrowedFd<'_>,
    hasher: &mut blake3::Hasher,
    have: u64,
) -> Result<u64> {
    let op = Operation::Pull;
    let key = remote.object_key(&d);
    let shown = remote.shown(&key);
    let local = |e: Errno| store_err(store.root().join("tmp"), e).with_src(&shown);
    let wrong = |why: String| {
        Error::new(op, ErrorKind::Corrupt)
            .with_src(&shown)
            .with_reason(format!(
                "object {d} from the remote {why}: the remote copy is damaged or was tampered \
                 with, and nothing of it was stored"
            ))
    };
    // Whole already (a pull killed after its last byte): nothing to ask.
    if have > 0 && have == size {
        return Ok(0);
    }
    let mut n = have;
    // A body that breaks off (a reset, the idle timeout) is asked for
    // again from where it stopped, while the last byte arrived less than
    // the retry timeout ago: a long download survives a flaky network.
    let mut last_byte = std::time::Instant::now();
    let mut broke: Option<Error> = None;
    'get: loop {
        remote
            .requests
            .get
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let opts = object_store::GetOptions {
            range: (n > 0).then_some(object_store::GetRange::Offset(n)),
            ..object_store::GetOptions::default()
        };
        let got = match remote.client.get_opts(&key, opts).await {
            // Resuming a partial, a server (or a proxy in between) that
            // ignores Range, or answers it with another range or a
            // `Content-Range` that is missing or does not parse: the
            // caller starts over from byte 0, once. Failing instead would
            // keep the partial, and every later pull would fail the same
            // way. (After a break, the break is the news: see below.)
            Err(e) if n > 0 && broke.is_none() && unusable_range_answer(&e) => {
                return Err(Error::new(op, ErrorKind::NotSupported)
                    .with_src(&shown)
                    .with_reason(
                        "the server answered a request for the rest of the object with \
                         something else than that range (it ignores or mangles Range)",
                    ));
            }
            got => got,
        };
        let got = got
            .map_err(|e| remote.error(op, &key, e))
            .map_err(|e| match broke.take() {
                // Asking for the rest failed: the break is the news.
                Some(b) => {
                    let why = format!("{}; asking for the rest failed: {}", b.reason(), e.reason());
                    b.with_reason(why)
                }
                None => e,
            })
            .map_err(|e| {
                if e.kind() == ErrorKind::NotFound && !e.reason().contains("bucket") {
                    e.with_reason(format!(
                        "the remote lacks object {d}, which the manifest names (was it \
                         collected by a remote gc?)"
                    ))
                } else {
                    e
                }
            })?;
        // What the server claims is checked, never used to size a buffer.
        if got.meta.size != size {
            return Err(wrong(format!(
                "is {} bytes long, not the {size} its manifest says",
                got.meta.size
            )));
        }
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    let e = remote.error(op, &key, e);
                    if e.kind() == ErrorKind::Io
                        && n < size
                        && last_byte.elapsed() < remote.config.retry.timeout
                        && !store.run.cancelled()
                    {
                        broke = Some(e);
                        continue 'get;
                    }
                    return Err(e);
                }
            };
            n += chunk.len() as u64;
            last_byte = std::time::Instant::now();
            remote
                .requests
                .bytes_down
                .fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
            if n > size {
                return Err(wrong(format!(
                    "is longer than the {size} bytes its manifest says"
                )));
            }
            hasher.update(&chunk);
            write_all(fd, &chunk).map_err(local)?;
            store.run.done(0, chunk.len() as u64);
            // A cancel ends a long object at once (what arrived of a
            // large one stays in its partial for the next pull).
            if store.run.cancelled() {
                return Err(Error::new(op, ErrorKind::Cancelled).with_src(&shown));
            }
        }
        break;
    }
    if n != size {
        return Err(wrong(format!(
            "has {n} bytes, not the {size} its manifest says"
        )));
    }
    Ok(n - have)
}

/// Whether object_store refused the answer to a range request for what
/// its headers say about the range: not a `206`, no `Content-Range` or
/// one that does not parse, another range than the one asked for, or a
/// total size too small for it. Its error type is private, so its
/// messages are matched (object_store 0.14's `GetResultError` and
/// `InvalidGetRange`); a message it changes falls back to a plain failure
/// that keeps the partial, never to a wrong object.
fn unusable_range_answer(e: &object_store::Error) -> bool {
    const SAID: [&str; 5] = [
        "non-partial response",
        "Content-Range header",
        "value for CONTENT_RANGE",
        "Wanted range starting at",
        "Range started at",
    ];
    let chain = super::error_chain(e);
    let other_range = chain.contains("Requested ") && chain.contains(", got ");
    matches!(e, object_store::Error::Generic { .. })
        && (other_range || SAID.iter().any(|s| chain.contains(s)))
}
