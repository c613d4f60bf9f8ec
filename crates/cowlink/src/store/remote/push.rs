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
//! 3. **publish**: upload the manifests, then remove the markers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
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

use super::{marker_id, Area, Remote, RequestCounts, LOCK_STALE, MARKER_REFRESH};

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
    todo: Vec<(Digest, Manifest, Key)>,
    report: PushReport,
    before: RequestCounts,
    refreshed: Instant,
    /// The store's shared lock: a local gc waits until the push is done.
    _lock: rustix::fd::OwnedFd,
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
                let marker = remote.key(Area::Pending, &format!("{}.{id}", d.to_hex()));
                todo.push((d, m, marker));
            }
        }
        let mut push = Push {
            store: self,
            remote,
            todo,
            report,
            before,
            refreshed: Instant::now(),
            _lock: lock,
        };
        if !push.todo.is_empty() {
            let started = Instant::now();
            push.write_markers()?;
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
        self.todo.iter().map(|(d, _, _)| *d).collect()
    }

    fn write_markers(&mut self) -> Result<()> {
        let r = self.remote.block_on(self.put_markers());
        self.refreshed = Instant::now();
        r
    }

    /// Write (or rewrite, as a sign of life) every pending marker.
    async fn put_markers(&self) -> Result<()> {
        for (_, m, key) in &self.todo {
            self.remote
                .put(Operation::Push, key, Bytes::from(m.to_bytes()))
                .await?;
        }
        Ok(())
    }

    /// Wait while a live remote gc lock exists; `true` when it waited. A
    /// cancel ends the wait with [`ErrorKind::Cancelled`] within 0.1 s.
    async fn wait_for_gc(&self) -> Result<bool> {
        let op = Operation::Push;
        let remote = self.remote;
        let mut waited = false;
        loop {
            let locks = remote.list(op, Area::Locks).await?;
            if locks.is_empty() {
                return Ok(waited);
            }
            // The server's clock: our marker's upload time.
            let marker = &self.todo[0].2;
            let now = match remote.head(op, marker).await? {
                Some(m) => m.last_modified,
                None => return Ok(waited),
            };
            let live = locks.iter().any(|l| {
                let age = now.signed_duration_since(l.last_modified);
                age.num_milliseconds() < LOCK_STALE.as_millis() as i64
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
            // Keep our marker fresh (and our clock reading new).
            self.put_markers().await?;
        }
    }

    /// Best-effort removal of the pending markers (after a failure).
    fn abandon(&mut self) {
        let remote = self.remote;
        let todo = std::mem::take(&mut self.todo);
        remote.block_on(async {
            for (_, _, key) in &todo {
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
        let op = Operation::Push;
        let remote = self.remote;
        let store = self.store;
        let wanted = super::objects_named(self.todo.iter().map(|(_, m, _)| m));
        self.report.objects = wanted.len() as u64;
        let missing: Vec<(Digest, u64)> = remote.block_on(async {
            if wanted.len() > LIST_ABOVE {
                let there: HashMap<Digest, u64> = remote
                    .list(op, Area::Objects)
                    .await?
                    .into_iter()
                    .filter_map(|m| Some((Remote::digest_of(&m.location)?, m.size)))
                    .collect();
                Ok(wanted
                    .iter()
                    .filter(|(d, s)| there.get(d) != Some(s))
                    .copied()
                    .collect())
            } else {
                let heads = futures::stream::iter(wanted.iter())
                    .map(|(d, s)| async move {
                        let m = remote.head(op, &remote.object_key(d)).await?;
                        Ok::<_, Error>((m.map(|m| m.size) != Some(*s)).then_some((*d, *s)))
                    })
                    .buffer_unordered(remote.transfers())
                    .collect::<Vec<_>>()
                    .await;
                heads
                    .into_iter()
                    .filter_map(|r| r.transpose())
                    .collect::<Result<Vec<_>>>()
            }
        })?;
        self.report.objects_present = self.report.objects - missing.len() as u64;
        let total: u64 = missing.iter().map(|(_, s)| s).sum();
        store.run.enter(Phase::Upload, missing.len() as u64, total);
        let uploaded = remote.block_on(async {
            let mut results = futures::stream::iter(missing.iter())
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
                if self.refreshed.elapsed() > MARKER_REFRESH {
                    self.put_markers().await?;
                    self.refreshed = Instant::now();
                }
            }
            Ok::<_, Error>((n, bytes))
        });
        let (n, bytes) = uploaded.map_err(|e| {
            if e.kind() == ErrorKind::Cancelled {
                Error::new(op, ErrorKind::Cancelled)
                    .with_src(remote.url())
                    .with_reason("cancelled: no manifest was uploaded; objects already sent stay")
            } else {
                e
            }
        })?;
        self.report.objects_uploaded = n;
        self.report.bytes_uploaded = bytes;
        Ok(())
    }

    /// Stage 3: upload the manifests (their objects are all on the remote
    /// now) and remove the pending markers.
    pub fn publish(mut self) -> Result<PushReport> {
        let op = Operation::Push;
        let remote = self.remote;
        let todo = std::mem::take(&mut self.todo);
        let r = remote.block_on(async {
            for (d, m, marker) in &todo {
                remote
                    .put(op, &remote.manifest_key(d), Bytes::from(m.to_bytes()))
                    .await?;
                remote.delete(op, marker).await?;
            }
            Ok::<_, Error>(())
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
