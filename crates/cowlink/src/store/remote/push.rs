//! Push: manifests and the objects they name, from the local store to the
//! remote, in three stages a caller may also run one by one
//! ([`Store::start_push`], [`Push::upload`], [`Push::publish`]):
//!
//! 1. **start**: HEAD each manifest; those on the remote are done (their
//!    objects are there: a manifest is only ever uploaded after them).
//!    For the others write a pending marker, then wait while a remote gc
//!    holds its lock (the rule in `mod.rs`).
//! 2. **upload**: find which objects the remote lacks (a HEAD each for up
//!    to [`LIST_ABOVE`] objects, else one listing of `objects/`, 1000 keys
//!    a request), then upload them, `transfers` at a time; objects over
//!    [`MULTIPART_ABOVE`] go in 8 MiB parts. Each object's bytes are hashed
//!    as they are read: a damaged local object is never sent.
//! 3. **publish**: check again that every object the manifests name is
//!    on the remote (exact key, exact size) and upload any that vanished
//!    (a gc that took this push for dead); upload the manifests, then
//!    remove the markers.
//!
//! From its start to its end a push rewrites its pending markers every
//! [`MARKER_REFRESH`] on a timer of its own (a task on the remote's
//! runtime), whatever its transfers do: one object that takes hours does
//! not make the push look dead.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, WriteMultipart};

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::run::Phase;
use crate::store::layout::object_rel;
use crate::store::manifest::{Digest, EntryKind, Manifest};
use crate::store::Store;

use super::layout::Layout;
#[cfg(doc)]
use super::MARKER_REFRESH;
use super::{marker_id, server_age, Area, Remote, RequestCounts, LOCK_STALE};

/// Objects larger than this are uploaded in parts.
pub const MULTIPART_ABOVE: u64 = 16 << 20;
/// Size of one part of a multipart upload.
const PART: usize = 8 << 20;
/// With more objects to check than this, list `objects/` instead of a
/// HEAD per object.
pub const LIST_ABOVE: usize = 1000;

/// What a push did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushReport {
    /// Manifests asked for.
    pub manifests: u64,
    /// Manifests the remote already had (nothing else done for them).
    pub manifests_present: u64,
    /// Manifests uploaded.
    pub manifests_uploaded: u64,
    /// Distinct objects the uploaded manifests name.
    pub objects: u64,
    /// Of those, objects the remote already had.
    pub objects_present: u64,
    /// Objects uploaded.
    pub objects_uploaded: u64,
    /// Object bytes uploaded.
    pub bytes_uploaded: u64,
    /// Objects found missing just before the manifests were published
    /// (removed by a gc that took this push for dead) and uploaded again;
    /// also counted in `objects_uploaded`.
    pub objects_reuploaded: u64,
    /// Time spent waiting for a remote gc to finish.
    pub waited_for_gc_ms: u64,
    /// Requests made.
    pub requests: RequestCounts,
}

/// A push between its stages (see the module). Dropping it without
/// [`publish`](Self::publish) leaves pending markers on the remote, which
/// a remote gc removes once they are older than its grace period.
#[derive(Debug)]
pub struct Push<'a> {
    store: &'a Store,
    remote: &'a Remote,
    /// Manifests to upload, each with its pending marker's key.
    /// The manifest's stored bytes are what is uploaded, never a new
    /// serialization: the remote names a manifest by the digest of
    /// exactly these bytes.
    todo: Vec<(Digest, Manifest, Key, Bytes)>,
    report: PushReport,
    before: RequestCounts,
    /// The timer that keeps the markers fresh, from their first write
    /// until the push publishes or gives up.
    refresher: Option<Refresher>,
    /// The store's shared lock: a local gc waits until the push is done.
    _lock: rustix::fd::OwnedFd,
}

impl Drop for Push<'_> {
    /// A push dropped between its stages stops rewriting its markers, so
    /// that they age and a gc may take it for dead.
    fn drop(&mut self) {
        if let Some(r) = self.refresher.take() {
            let _ = r.stop.send(true);
            r.task.abort();
        }
    }
}

/// A task on the remote's runtime that rewrites keys (a push's pending
/// markers, a gc's lock) every `Remote::marker_refresh` as a sign of
/// life, independent of what the push or gc is busy with.
#[derive(Debug)]
pub(super) struct Refresher {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// PUTs made and bytes sent, added to the remote's counts at the end.
    puts: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

impl Refresher {
    /// Start rewriting `markers` (each key with its body).
    pub(super) fn start(remote: &Remote, markers: Vec<(Key, Bytes)>) -> Refresher {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let client = Arc::clone(&remote.client);
        let every = remote.marker_refresh;
        let puts = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (p, b) = (Arc::clone(&puts), Arc::clone(&bytes));
        let task = remote.runtime.spawn(async move {
            loop {
                if tokio::time::timeout(every, stopped.changed()).await.is_ok() {
                    return; // stop asked, or the push is gone
                }
                for (key, body) in &markers {
                    if *stopped.borrow() {
                        return;
                    }
                    p.fetch_add(1, Ordering::Relaxed);
                    // A failed rewrite is tried again at the next tick; if
                    // the push is taken for dead meanwhile, publish finds
                    // and re-uploads what a gc removed.
                    if client.put(key, body.clone().into()).await.is_ok() {
                        b.fetch_add(body.len() as u64, Ordering::Relaxed);
                    }
                }
            }
        });
        Refresher {
            stop,
            task,
            puts,
            bytes,
        }
    }

    /// Stop the timer and wait (up to 10 s) for a rewrite in flight, so
    /// that no marker is written again after the push removes it.
    pub(super) async fn stop(mut self, remote: &Remote) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        let r = &remote.requests;
        r.put
            .fetch_add(self.puts.load(Ordering::Relaxed), Ordering::Relaxed);
        r.bytes_up
            .fetch_add(self.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Whether a gc lock written at `then` is a live gc's at `now` (both by
/// the server's clock): within [`LOCK_STALE`] of `now`, on either side.
/// A live gc rewrites its lock every minute at the server's current
/// time, so a lock far in the future (the server's clock set back since
/// it was written, or a key planted with a future time) is no live gc's
/// either; without this it would hold every push until that time passed.
pub(super) fn lock_is_live(
    now: chrono::DateTime<chrono::Utc>,
    then: chrono::DateTime<chrono::Utc>,
) -> bool {
    server_age(now, then) < LOCK_STALE && server_age(then, now) < LOCK_STALE
}

fn op_err(e: Error, what: &str) -> Error {
    let why = format!("{what}: {}", e.reason());
    e.with_reason(why)
}

impl Store {
    /// Upload `manifests` (all of the store's when empty) and every object
    /// they name that the remote lacks; the manifests go last.
    ///
    /// # Errors
    /// `NotFound` for a manifest or object the local store lacks,
    /// `Corrupt` for a local object whose bytes no longer match its digest
    /// (run `verify`), `PermissionDenied` and `NotFound` (bucket) from the
    /// server at once, `Io` when the server stays unreachable after the
    /// retries, `Cancelled`. No manifest is uploaded unless all its
    /// objects were.
    pub fn push(&self, remote: &Remote, manifests: &[Digest]) -> Result<PushReport> {
        let mut p = self.start_push(remote, manifests)?;
        p.upload()?;
        p.publish()
    }

    /// Stage 1 of [`push`](Self::push): read the manifests, skip those the
    /// remote has, mark the others pending and wait for any remote gc.
    pub fn start_push<'a>(&'a self, remote: &'a Remote, manifests: &[Digest]) -> Result<Push<'a>> {
        let op = Operation::Push;
        let before = remote.requests();
        let lock = self.lock(false)?;
        let digests = if manifests.is_empty() {
            self.manifests()?
        } else {
            let mut v = manifests.to_vec();
            v.sort();
            v.dedup();
            v
        };
        let mut loaded = Vec::with_capacity(digests.len());
        for d in &digests {
            loaded.push((*d, self.manifest(d)?));
        }
        let mut report = PushReport {
            manifests: loaded.len() as u64,
            ..PushReport::default()
        };
        let present: Vec<bool> = remote.block_on(async {
            let heads = futures::stream::iter(loaded.iter())
                .map(|(d, _)| async move { remote.head(op, &remote.manifest_key(d)).await })
                .buffered(remote.transfers());
            heads
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .map(|r| r.map(|m| m.is_some()))
                .collect::<Result<Vec<bool>>>()
        })?;
        let id = marker_id();
        let mut todo = Vec::new();
        for ((d, m), there) in loaded.into_iter().zip(present) {
            if there {
                report.manifests_present += 1;
            } else {
                let marker = Key::from(super::layout::key_of(
                    &remote.config.prefix,
                    &Layout::Pending(d, id.clone()),
                ));
                // The stored bytes, checked to be canonical and to hash
                // to `d`, are what the remote gets.
                let bytes = Bytes::from(self.manifest_bytes(&d)?);
                todo.push((d, m, marker, bytes));
            }
        }
        let mut push = Push {
            store: self,
            remote,
            todo,
            report,
            before,
            refresher: None,
            _lock: lock,
        };
        if !push.todo.is_empty() {
            let started = Instant::now();
            if let Err(e) = push.write_markers() {
                push.abandon();
                return Err(e);
            }
            match remote.block_on(push.wait_for_gc()) {
                Ok(true) => push.report.waited_for_gc_ms = started.elapsed().as_millis() as u64,
                Ok(false) => {}
                Err(e) => {
                    push.abandon();
                    return Err(e);
                }
            }
        }
        Ok(push)
    }
}

impl Push<'_> {
    /// Manifests that still need uploading (those the remote lacked).
    pub fn pending(&self) -> Vec<Digest> {
        self.todo.iter().map(|(d, _, _, _)| *d).collect()
    }

    /// Write every pending marker, then start the timer that rewrites
    /// them.
    fn write_markers(&mut self) -> Result<()> {
        let markers: Vec<(Key, Bytes)> = self
            .todo
            .iter()
            .map(|(_, _, key, bytes)| (key.clone(), bytes.clone()))
            .collect();
        let remote = self.remote;
        remote.block_on(async {
            for (key, body) in &markers {
                remote.put(Operation::Push, key, body.clone()).await?;
            }
            Ok::<_, Error>(())
        })?;
        self.refresher = Some(Refresher::start(remote, markers));
        Ok(())
    }

    /// Rewrite the first marker: its upload time is the server's clock.
    async fn touch_first_marker(&self) -> Result<()> {
        let (_, _, key, bytes) = &self.todo[0];
        self.remote.put(Operation::Push, key, bytes.clone()).await
    }

    /// Wait while a live remote gc lock exists; `true` when it waited. A
    /// cancel ends the wait with [`ErrorKind::Cancelled`] within 0.1 s.
    async fn wait_for_gc(&self) -> Result<bool> {
        let op = Operation::Push;
        let remote = self.remote;
        let mut waited = false;
        loop {
            let locks = remote.list_keys(op, Area::Locks).await?;
            if locks.is_empty() {
                return Ok(waited);
            }
            // The server's clock: our marker's upload time.
            let marker = &self.todo[0].2;
            let now = match remote.head(op, marker).await? {
                Some(m) => m.last_modified,
                None => return Ok(waited),
            };
            // Any `locks/gc.…` is a gc's lock (leniently: waiting is
            // the safe side, and an older version may spell ids
            // differently).
            let live = locks.iter().any(|l| {
                super::layout::loose_lock(&remote.server_prefix(), &l.key)
                    && lock_is_live(now, l.last_modified)
            });
            if !live {
                return Ok(waited);
            }
            waited = true;
            // A second between looks, cut short by a cancel (Ctrl-C).
            for _ in 0..10 {
                if self.store.run.cancelled() {
                    return Err(Error::new(op, ErrorKind::Cancelled)
                        .with_src(remote.url())
                        .with_reason(
                            "cancelled while waiting for the remote's gc; nothing was uploaded",
                        ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // A new reading of the server's clock.
            self.touch_first_marker().await?;
        }
    }

    /// Best-effort removal of the pending markers (after a failure).
    fn abandon(&mut self) {
        let remote = self.remote;
        let todo = std::mem::take(&mut self.todo);
        let refresher = self.refresher.take();
        remote.block_on(async {
            if let Some(r) = refresher {
                r.stop(remote).await;
            }
            for (_, _, key, _) in &todo {
                let _ = remote.delete(Operation::Push, key).await;
            }
        });
    }

    /// Stage 2: upload every object the manifests name that the remote
    /// lacks (or holds with the wrong size).
    pub fn upload(&mut self) -> Result<()> {
        let r = self.upload_inner();
        if r.is_err() {
            self.abandon();
        }
        r
    }

    fn upload_inner(&mut self) -> Result<()> {
        let remote = self.remote;
        let store = self.store;
        let wanted = super::objects_named(self.todo.iter().map(|(_, m, _, _)| m));
        self.report.objects = wanted.len() as u64;
        let missing = remote.block_on(missing(remote, &wanted))?;
        self.report.objects_present = self.report.objects - missing.len() as u64;
        let (n, bytes) = upload_all(store, remote, &missing)?;
        self.report.objects_uploaded = n;
        self.report.bytes_uploaded = bytes;
        Ok(())
    }

    /// Just before publishing: every object the manifests name must still
    /// be on the remote (exact key, exact size). One that is not (a gc
    /// took this push for dead: its markers went stale, or the gc ran with
    /// a grace shorter than the markers' refresh) is uploaded again and
    /// checked once more; still missing, the push fails and publishes
    /// nothing.
    fn recheck(&mut self, todo: &[(Digest, Manifest, Key, Bytes)]) -> Result<()> {
        let remote = self.remote;
        let wanted = super::objects_named(todo.iter().map(|(_, m, _, _)| m));
        let gone = remote.block_on(missing(remote, &wanted))?;
        if gone.is_empty() {
            return Ok(());
        }
        let (n, bytes) = upload_all(self.store, remote, &gone)?;
        self.report.objects_reuploaded += n;
        self.report.objects_uploaded += n;
        self.report.bytes_uploaded += bytes;
        let still = remote.block_on(missing(remote, &gone))?;
        if let Some((d, _)) = still.first() {
            return Err(Error::new(Operation::Push, ErrorKind::Io)
                .with_src(remote.shown(&remote.object_key(d)))
                .with_reason(format!(
                    "{} of the objects the manifests name vanished from the remote while the \
                     push ran, and again after being uploaded once more (is a remote gc running \
                     with a grace period shorter than the push's marker refresh?); no manifest \
                     was uploaded",
                    still.len()
                )));
        }
        Ok(())
    }

    /// Stage 3: upload the manifests (their objects are all on the remote
    /// now) and remove the pending markers.
    pub fn publish(mut self) -> Result<PushReport> {
        let op = Operation::Push;
        let remote = self.remote;
        let todo = std::mem::take(&mut self.todo);
        let r = self.recheck(&todo).and_then(|()| {
            let refresher = self.refresher.take();
            remote.block_on(async {
                let put = async {
                    for (d, _, _, bytes) in &todo {
                        remote
                            .put(op, &remote.manifest_key(d), bytes.clone())
                            .await?;
                    }
                    Ok::<_, Error>(())
                }
                .await;
                // The manifests protect their objects now (or the push
                // failed): the markers may go, and are not written again
                // after this.
                if let Some(r) = refresher {
                    r.stop(remote).await;
                }
                put?;
                for (_, _, marker, _) in &todo {
                    remote.delete(op, marker).await?;
                }
                Ok::<_, Error>(())
            })
        });
        if let Err(e) = r {
            self.todo = todo;
            self.abandon();
            return Err(e);
        }
        self.report.manifests_uploaded = todo.len() as u64;
        self.store.run.finish();
        self.report.requests = remote.requests().since(&self.before);
        Ok(self.report.clone())
    }
}

/// Which of `wanted` (digest, size) the remote lacks. The one presence
/// test of a push: an object is there only under its exact key of the
/// layout with its exact size (a HEAD each for up to [`LIST_ABOVE`],
/// else one listing of `objects/` in which only keys of the layout
/// count); `objects/<hex>.partial` and other near misses never do.
async fn missing(remote: &Remote, wanted: &[(Digest, u64)]) -> Result<Vec<(Digest, u64)>> {
    let op = Operation::Push;
    if wanted.len() > LIST_ABOVE {
        let there: HashMap<Digest, u64> = remote
            .list_keys(op, Area::Objects)
            .await?
            .into_iter()
            .filter_map(|m| match remote.layout_of(&m.key) {
                Some(Layout::Object(d)) => Some((d, m.size)),
                _ => None,
            })
            .collect();
        return Ok(wanted
            .iter()
            .filter(|(d, s)| there.get(d) != Some(s))
            .copied()
            .collect());
    }
    let heads = futures::stream::iter(wanted.iter())
        .map(|(d, s)| async move {
            let m = remote.head(op, &remote.object_key(d)).await?;
            Ok::<_, Error>((m.map(|m| m.size) != Some(*s)).then_some((*d, *s)))
        })
        .buffer_unordered(remote.transfers())
        .collect::<Vec<_>>()
        .await;
    let mut v = heads
        .into_iter()
        .filter_map(|r| r.transpose())
        .collect::<Result<Vec<_>>>()?;
    v.sort();
    Ok(v)
}

/// Upload `objects`, `transfers` at a time, with progress; the count and
/// bytes sent.
fn upload_all(store: &Store, remote: &Remote, objects: &[(Digest, u64)]) -> Result<(u64, u64)> {
    let op = Operation::Push;
    let total: u64 = objects.iter().map(|(_, s)| s).sum();
    store.run.enter(Phase::Upload, objects.len() as u64, total);
    let uploaded = remote.block_on(async {
        let mut results = futures::stream::iter(objects.iter())
            .map(|(d, s)| async move {
                if store.run.cancelled() {
                    return Err(Error::new(op, ErrorKind::Cancelled));
                }
                upload_object(store, remote, d, *s).await
            })
            .buffer_unordered(remote.transfers());
        let (mut n, mut bytes) = (0u64, 0u64);
        while let Some(r) = results.next().await {
            let size = r?;
            n += 1;
            bytes += size;
            store.run.done(1, size);
        }
        Ok::<_, Error>((n, bytes))
    });
    uploaded.map_err(|e| {
        if e.kind() == ErrorKind::Cancelled {
            Error::new(op, ErrorKind::Cancelled)
                .with_src(remote.url())
                .with_reason("cancelled: no manifest was uploaded; objects already sent stay")
        } else {
            e
        }
    })
}

/// Upload one local object, hashing what is read; return its size.
async fn upload_object(store: &Store, remote: &Remote, d: &Digest, size: u64) -> Result<u64> {
    let op = Operation::Push;
    let rel = object_rel(d, 0);
    let path = store.root().join(&rel);
    let fd = store.open_in_layout(&rel).map_err(|e| {
        let err = Error::from_errno(op, e).with_src(&path);
        if e == rustix::io::Errno::NOENT {
            op_err(
                err,
                "the local store lacks this object that the manifest names (run `cowlink store verify`)",
            )
        } else {
            err
        }
    })?;
    let mut file = std::fs::File::from(fd);
    let key = remote.object_key(d);
    let damaged = |got: blake3::Hash, n: u64| {
        Error::new(op, ErrorKind::Corrupt)
            .with_src(&path)
            .with_reason(format!(
                "the local object's {n} bytes hash to {} instead of its name {d}: \
             it is damaged and was not sent (run `cowlink store verify`)",
                got.to_hex()
            ))
    };
    let read_err = |e: std::io::Error| Error::from_io(op, &e).with_src(&path);
    if size <= MULTIPART_ABOVE {
        let mut buf = Vec::with_capacity(size as usize);
        std::io::Read::read_to_end(&mut file, &mut buf).map_err(read_err)?;
        let got = blake3::hash(&buf);
        if got.as_bytes() != d.as_bytes() || buf.len() as u64 != size {
            return Err(damaged(got, buf.len() as u64));
        }
        remote.put(op, &key, Bytes::from(buf)).await?;
        return Ok(size);
    }
    remote.requests.put.fetch_add(1, Ordering::Relaxed);
    let upload = remote
        .client
        .put_multipart(&key)
        .await
        .map_err(|e| remote.error(op, &key, e))?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
    let mut hasher = blake3::Hasher::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; PART];
    loop {
        let got = std::io::Read::read(&mut file, &mut buf).map_err(read_err)?;
        if got == 0 {
            break;
        }
        hasher.update(&buf[..got]);
        n += got as u64;
        if let Err(e) = w.wait_for_capacity(4).await {
            return Err(remote.error(op, &key, e));
        }
        w.write(&buf[..got]);
    }
    let got = hasher.finalize();
    if got.as_bytes() != d.as_bytes() || n != size {
        let _ = w.abort().await;
        return Err(damaged(got, n));
    }
    let parts = n.div_ceil(PART as u64);
    w.finish().await.map_err(|e| remote.error(op, &key, e))?;
    remote.requests.put.fetch_add(parts + 1, Ordering::Relaxed);
    remote.requests.bytes_up.fetch_add(n, Ordering::Relaxed);
    Ok(size)
}

/// The distinct objects `manifests` name.
pub(crate) fn objects_of<'m>(manifests: impl Iterator<Item = &'m Manifest>) -> HashSet<Digest> {
    let mut out = HashSet::new();
    for m in manifests {
        for e in &m.entries {
            if let EntryKind::File { digest, .. } = e.kind {
                out.insert(digest);
            }
        }
    }
    out
}
