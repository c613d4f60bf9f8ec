//! Listing and collecting the remote: [`Remote::manifests`] and
//! [`Remote::gc`], under the rule described in `mod.rs` (a gc writes its
//! lock first, then reads the pending pushes, then the manifests; it keeps
//! every object a kept manifest or a live pending push names).
//!
//! Requests for one gc: 1 PUT and 1 HEAD (the lock and the server's
//! clock), one LIST page per 1000 keys of `locks/`, `pending/`,
//! `manifests/` and `objects/` and per 1000 incomplete multipart uploads, one GET per kept
//! manifest and live pending push, one HEAD and one DELETE per stale
//! marker, one DELETE per other key removed or upload aborted, and 1
//! DELETE for the lock.
//!
//! gc touches only keys of cowlink's exact layout (`layout.rs`): any
//! other key below the prefix, however much it looks like one, is left
//! alone and named in the report.

use std::collections::HashSet;
use std::time::Duration;

use object_store::path::Path as Key;

use bytes::Bytes;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::store::manifest::{Digest, Manifest};

use super::layout::{loose_marker, Layout};
use super::push::{lock_is_live, objects_of, Refresher};
#[cfg(doc)]
use super::LOCK_STALE;
use super::{marker_id, server_age, Area, Remote, RequestCounts, MAX_GRACE};

/// At most this many keys left alone are named in a report (all are
/// counted).
const LEFT_ALONE_SHOWN: usize = 100;

/// A manifest on the remote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RemoteManifest {
    /// Its digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was uploaded, by the server's clock (`YYYY-MM-DD HH:MM:SS UTC`).
    pub uploaded: String,
}

/// What a remote gc did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RemoteGcReport {
    /// Manifests kept.
    pub manifests_kept: u64,
    /// Manifests removed (not kept).
    pub manifests_removed: u64,
    /// Pushes in progress whose objects were kept.
    pub pushes_protected: u64,
    /// Pending markers of pushes dead for longer than the grace period,
    /// removed.
    pub markers_removed: u64,
    /// Locks of other gcs that died (more than [`LOCK_STALE`] away from
    /// the server's time, which pushes no longer wait for), removed.
    pub locks_removed: u64,
    /// Objects kept.
    pub objects_kept: u64,
    /// Objects removed.
    pub objects_removed: u64,
    /// Bytes of the objects removed.
    pub bytes_removed: u64,
    /// Incomplete multipart uploads (of a push that died mid-object)
    /// older than the grace period, aborted.
    pub uploads_aborted: u64,
    /// Incomplete multipart uploads kept: younger than the grace period,
    /// or of an object a live push names.
    pub uploads_kept: u64,
    /// Why incomplete uploads could not be listed (the rest of the gc was
    /// done), e.g. a server without `ListMultipartUploads`.
    pub uploads_not_listed: Option<String>,
    /// Keys below the prefix (and uploads) that are not exactly of
    /// cowlink's layout: never removed, never trusted.
    pub keys_left_alone: u64,
    /// The first 100 of them, as `s3://BUCKET/KEY`.
    pub left_alone: Vec<String>,
    /// Requests made.
    pub requests: RequestCounts,
}

impl Remote {
    /// The manifests on the remote, sorted by digest (one LIST page per
    /// 1000).
    ///
    /// # Errors
    /// `PermissionDenied`, `NotFound` (no such bucket), `Io`.
    pub fn manifests(&self) -> Result<Vec<RemoteManifest>> {
        let mut v: Vec<RemoteManifest> = self
            .block_on(self.list_keys(Operation::Remote, Area::Manifests))?
            .into_iter()
            .filter_map(|m| {
                let Some(Layout::Manifest(digest)) = self.layout_of(&m.key) else {
                    return None; // not cowlink's: not a manifest
                };
                Some(RemoteManifest {
                    digest,
                    bytes: m.size,
                    uploaded: m.last_modified.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                })
            })
            .collect();
        v.sort_by_key(|m| m.digest);
        Ok(v)
    }

    /// Remove every object on the remote that no kept manifest and no live
    /// pending push names. `keep`: the manifests to keep (the others are
    /// removed first); `None` keeps them all. A manifest a live push is
    /// publishing, or one uploaded since this gc began (by the server's
    /// clock, to the second), is kept whatever `keep` says: its push
    /// reported success. A pending push older than
    /// `grace` (by the server's clock) is taken for dead: its marker is
    /// removed and its objects are kept only if a manifest names them.
    ///
    /// Only keys of cowlink's exact layout are removed; anything else
    /// below the prefix is counted and named in
    /// [`RemoteGcReport::left_alone`]. Incomplete multipart uploads of
    /// objects older than `grace` are aborted, unless a live push names
    /// their object.
    ///
    /// # Errors
    /// `InvalidInput` for a `grace` over [`MAX_GRACE`] (nothing is
    /// done), `NotFound` when a manifest in `keep` is not on the remote
    /// (nothing is removed then), `Corrupt` when a kept manifest or a live
    /// marker does not match its digest (nothing is removed), and the
    /// request errors.
    pub fn gc(&self, keep: Option<&[Digest]>, grace: Duration) -> Result<RemoteGcReport> {
        check_grace(grace)?;
        let before = self.requests();
        let lock = Key::from(super::layout::key_of(
            &self.config.prefix,
            &Layout::Lock(marker_id()),
        ));
        self.block_on(self.put(Operation::Remote, &lock, Bytes::new()))?;
        // Rewritten on a timer while gc runs, however long one listing or
        // one batch of deletes takes: pushes wait for it while it lives.
        let refresher = Refresher::start(self, vec![(lock.clone(), Bytes::new())]);
        let r = self.block_on(self.gc_locked(&lock, keep, grace));
        self.block_on(refresher.stop(self));
        // The lock goes whatever happened (a failed gc removed nothing it
        // should not have; a stale lock only delays pushes).
        let _ = self.block_on(self.delete(Operation::Remote, &lock));
        let mut report = r?;
        report.requests = self.requests().since(&before);
        Ok(report)
    }

    async fn gc_locked(
        &self,
        lock: &object_store::path::Path,
        keep: Option<&[Digest]>,
        grace: Duration,
    ) -> Result<RemoteGcReport> {
        let op = Operation::Remote;
        let mut report = RemoteGcReport::default();
        let now = self
            .head(op, lock)
            .await?
            .map(|m| m.last_modified)
            .ok_or_else(|| {
                Error::new(op, ErrorKind::Io)
                    .with_src(self.shown(lock))
                    .with_reason("the gc lock vanished just after it was written")
            })?;
        // Locks of gcs that died (killed mid-run): no push waits for one
        // any more, and nothing else would ever remove it. Only keys of
        // the exact layout; a lock near miss is a push's concern only.
        for m in self.list_keys(op, Area::Locks).await? {
            let (Some(Layout::Lock(_)), Some(key)) =
                (self.layout_of(&m.key), super::layout::exact_key(&m.key))
            else {
                continue;
            };
            if key != *lock && !lock_is_live(now, m.last_modified) {
                self.delete(op, &key).await?;
                report.locks_removed += 1;
            }
        }
        let mut used: HashSet<Digest> = HashSet::new();
        // The manifests live pushes are publishing: never removed, even
        // when `keep` does not name them (a push that reports success
        // must leave its manifest on the remote).
        let mut publishing: HashSet<Digest> = HashSet::new();
        // Pushes in progress, read after our lock is visible.
        let mut stale = Vec::new();
        for m in self.list_keys(op, Area::Pending).await? {
            let young = server_age(now, m.last_modified) < grace;
            let exact = super::layout::exact_key(&m.key);
            let (Some(Layout::Pending(d, _)), Some(key)) = (self.layout_of(&m.key), &exact) else {
                report.leave_alone(self.shown_raw(&m.key));
                // A marker spelled otherwise (an older version's id) still
                // protects its objects while young, if it holds the
                // manifest it names; it is never removed.
                let loose = loose_marker(&self.server_prefix(), &m.key);
                if let (Some(d), Some(key)) = (loose, exact) {
                    if young {
                        if let Ok(manifest) = self.checked_manifest(&key, &d).await {
                            used.extend(objects_of(std::iter::once(&manifest)));
                            publishing.insert(d);
                            report.pushes_protected += 1;
                        }
                    }
                }
                continue;
            };
            if !young {
                stale.push((key.clone(), m.last_modified));
                continue;
            }
            let manifest = self.checked_manifest(key, &d).await?;
            used.extend(objects_of(std::iter::once(&manifest)));
            publishing.insert(d);
            report.pushes_protected += 1;
        }
        // What live pushes name: their multipart uploads are kept too.
        let live = used.clone();
        // Then the manifests.
        let mut listed: Vec<Digest> = Vec::new();
        // Manifests uploaded since this gc began (by the server's clock,
        // in whole seconds: the lock's own second counts as since): a
        // push that published while gc ran, its marker already gone
        // when gc read the markers. The user choosing `keep` never saw
        // them; they are kept, as are those live pushes are publishing.
        let mut new: HashSet<Digest> = HashSet::new();
        for m in self.list_keys(op, Area::Manifests).await? {
            match self.layout_of(&m.key) {
                Some(Layout::Manifest(d)) => {
                    listed.push(d);
                    if m.last_modified.timestamp() >= now.timestamp() || publishing.contains(&d) {
                        new.insert(d);
                    }
                }
                _ => report.leave_alone(self.shown_raw(&m.key)),
            }
        }
        let kept: HashSet<Digest> = match keep {
            None => listed.iter().copied().collect(),
            Some(k) => {
                let there: HashSet<&Digest> = listed.iter().collect();
                if let Some(gone) = k.iter().find(|d| !there.contains(d)) {
                    return Err(Error::new(op, ErrorKind::NotFound)
                        .with_src(self.shown(&self.manifest_key(gone)))
                        .with_reason(format!(
                            "cannot keep manifest {gone}: the remote has no such manifest \
                             (nothing was removed)"
                        )));
                }
                k.iter().chain(&new).copied().collect()
            }
        };
        for d in &kept {
            let m = self.checked_manifest(&self.manifest_key(d), d).await?;
            used.extend(objects_of(std::iter::once(&m)));
        }
        // Manifests go before their objects: the remote never holds a
        // manifest whose objects are missing.
        for d in listed.iter().filter(|d| !kept.contains(d)) {
            self.delete(op, &self.manifest_key(d)).await?;
            report.manifests_removed += 1;
        }
        report.manifests_kept = kept.len() as u64;
        for m in self.list_keys(op, Area::Objects).await? {
            let exact = super::layout::exact_key(&m.key);
            let (Some(Layout::Object(d)), Some(key)) = (self.layout_of(&m.key), exact) else {
                report.leave_alone(self.shown_raw(&m.key));
                continue;
            };
            if used.contains(&d) {
                report.objects_kept += 1;
                continue;
            }
            self.delete(op, &key).await?;
            report.objects_removed += 1;
            report.bytes_removed += m.size;
        }
        // A marker is removed only if it is still the one judged stale:
        // one rewritten since (its push showed life while this gc ran,
        // after a long stall) stays, so the next gc sees the push alive.
        // Whole seconds: a HEAD's time has no finer ones, a listing's
        // may (MinIO).
        for (key, listed) in stale {
            match self.head(op, &key).await? {
                Some(m) if m.last_modified.timestamp() <= listed.timestamp() => {
                    self.delete(op, &key).await?;
                    report.markers_removed += 1;
                }
                _ => {}
            }
        }
        // Incomplete multipart uploads. A server that cannot list them
        // does not stop the gc: the report says so.
        match self.list_uploads(op).await {
            Err(e) => report.uploads_not_listed = Some(e.to_string()),
            Ok(uploads) => {
                for u in uploads {
                    // Only a key that is exactly of the layout, and that
                    // the client can name without re-encoding it.
                    let ours = match (self.layout_of(&u.key), super::layout::exact_key(&u.key)) {
                        (Some(Layout::Object(d)), Some(_)) => Some(d),
                        _ => None,
                    };
                    let Some(d) = ours else {
                        report.leave_alone(format!(
                            "{} (incomplete upload {})",
                            self.shown_raw(&u.key),
                            u.id
                        ));
                        continue;
                    };
                    if live.contains(&d) || server_age(now, u.initiated) < grace {
                        report.uploads_kept += 1;
                        continue;
                    }
                    self.abort_upload(op, &u).await?;
                    report.uploads_aborted += 1;
                }
            }
        }
        Ok(report)
    }

    /// GET a manifest (or a pending marker, which holds one) and check
    /// that its bytes are the manifest `d`.
    async fn checked_manifest(
        &self,
        key: &object_store::path::Path,
        d: &Digest,
    ) -> Result<Manifest> {
        let op = Operation::Remote;
        let bytes = self.get_all(op, key).await?;
        let got = Digest::of(&bytes);
        if got != *d {
            return Err(Error::new(op, ErrorKind::Corrupt)
                .with_src(self.shown(key))
                .with_reason(format!(
                    "manifest {d} on the remote hashes to {got}; gc stops without removing \
                     anything (remove or repair that key)"
                )));
        }
        Manifest::from_bytes(&bytes, &self.shown(key))
    }
}

impl Remote {
    /// `s3://BUCKET/KEY` for a key as the server listed it, with any
    /// control character escaped.
    fn shown_raw(&self, key: &str) -> String {
        format!("s3://{}/{}", self.config.bucket, key.escape_debug())
    }
}

impl RemoteGcReport {
    /// Count (and name the first few of) a key that is not cowlink's.
    fn leave_alone(&mut self, shown: String) {
        self.keys_left_alone += 1;
        if self.left_alone.len() < LEFT_ALONE_SHOWN {
            self.left_alone.push(shown);
        }
    }
}

/// Refuse a grace period beyond [`MAX_GRACE`], naming it.
pub(crate) fn check_grace(grace: Duration) -> Result<()> {
    if grace > MAX_GRACE {
        return Err(
            Error::new(Operation::Remote, ErrorKind::InvalidInput).with_reason(format!(
                "a grace period of {} s is longer than the longest accepted, {} days (10 years)",
                grace.as_secs(),
                MAX_GRACE.as_secs() / 86400
            )),
        );
    }
    Ok(())
}
