//! The remote tier: a store's objects and manifests on any S3-compatible
//! object store (AWS S3, MinIO, Ceph RGW, Garage, versitygw, SeaweedFS),
//! shared by many machines. Each machine downloads an object once into
//! its local store and clones it from there into as many workspaces as it
//! needs.
//!
//! ```text
//! s3://BUCKET/PREFIX/objects/ab/abcd…     object bytes, named by BLAKE3
//! s3://BUCKET/PREFIX/manifests/abcd…      manifests, named by BLAKE3
//! s3://BUCKET/PREFIX/pending/abcd….ID     a push in progress (its manifest)
//! s3://BUCKET/PREFIX/locks/gc.ID          a remote gc in progress
//! ```
//!
//! **Push** ([`Store::push`](crate::store::Store::push), stages in `push.rs`) uploads every object a
//! manifest names that the remote lacks, then the manifest: the remote
//! never holds a manifest whose objects are missing. A manifest already
//! on the remote costs one HEAD and nothing else.
//!
//! **Pull** ([`Store::pull`](crate::store::Store::pull), `pull.rs`) treats the remote as untrusted:
//! every object is streamed into an unnamed, preallocated file in the
//! store, hashed as it arrives, and linked under its name only when the
//! BLAKE3 matches; a wrong object fails the pull naming its digest and
//! nothing of it is kept. An object of at least [`RESUME_MIN`] bytes goes
//! to a named partial file, `tmp/<hex>.partial` (`partial.rs`), instead:
//! a pull killed, interrupted or cut off by the network leaves it, and
//! the next pull rehashes it and asks only for the rest (a range GET);
//! the digest over all the bytes still decides, and a partial that does
//! not verify is dropped and the object downloaded whole. Objects are
//! made durable in batches (one `syncfs` before a batch is named), so a
//! crash leaves whole objects or none. A manifest is written locally
//! only after all its objects.
//!
//! **Garbage collection** ([`Remote::gc`], `gc.rs`) must never remove an
//! object a concurrent push relies on. The rule, which needs the strong
//! read-after-write and list-after-write consistency S3 has had since
//! 2020 (and MinIO, Garage and versitygw have):
//!
//! 1. A push first writes `pending/<manifest>.<id>` (the manifest's
//!    bytes), then looks for `locks/gc.*`. While a gc lock dated within
//!    [`LOCK_STALE`] of the server's time (either side) exists, the push
//!    waits; only then does it ask which objects the remote has. After
//!    the manifest is uploaded the pending marker is deleted.
//! 2. A gc first writes its lock, then reads the pending markers, then
//!    the manifests, and keeps every object a kept manifest or a pending
//!    marker younger than the grace period names. With `--keep` it still
//!    keeps a manifest a live marker names or one uploaded at or after
//!    its lock's second; it re-reads a stale marker before removing it,
//!    and removes the locks of gcs that died.
//!
//! Either a push's marker is written before gc reads the markers (so gc
//! keeps its objects), or after gc's lock exists (so the push sees the
//! lock and waits until gc is done before it relies on any object).
//! Ages are saturating differences of the server's own `Last-Modified`
//! times, never of a client's clock, and a grace period is at most
//! [`MAX_GRACE`]. A push rewrites its markers, and a gc its lock, every
//! [`MARKER_REFRESH`] on a timer task of their own, whatever their
//! transfers do, so only a push dead for longer than the grace period
//! loses its protection; and before publishing, a push checks again that
//! every object is there (exact key, exact size) and uploads any that
//! went. gc also aborts incomplete multipart uploads older than the grace
//! period, unless a live push names their object.
//!
//! **Only cowlink's keys.** One function (`layout.rs`) says whether a
//! key is exactly one cowlink writes; gc deletes nothing else (it names
//! what it leaves alone) and a push counts nothing else as present.
//!
//! Everything is counted ([`Requests`]): how many GET, PUT, HEAD, LIST
//! and DELETE requests an operation made, and the bytes each way.
//!
//! **Everything a server says is untrusted and bounded.** Every request
//! passes one guarded HTTP client (`http.rs`): retries end on time
//! ([`RetryPolicy::timeout`]) and honour `Retry-After`, each retry signed
//! afresh; a request fails when the server is silent for
//! [`RetryPolicy::idle`], never because a flowing transfer is long; no
//! buffer is sized by a `Content-Length`, error bodies are read up to
//! [`ERROR_BODY_MAX`] and other non-object bodies up to
//! [`SMALL_BODY_MAX`]; manifests and markers up to [`MAX_MANIFEST_BYTES`],
//! objects up to their manifest's size. Listings (`list.rs`) refuse a
//! repeated continuation token, stop after [`MAX_EMPTY_PAGES`] pages
//! without a new key or [`MAX_PAGES`] pages, and leave out keys no
//! cowlink key could be. A refusal's S3 code becomes plain words, and
//! any server text in a message is quoted like a file name (`fault.rs`).

mod config;
mod fault;
mod gc;
mod http;
mod layout;
mod list;
mod partial;
mod pull;
mod push;
mod uploads;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{BackoffConfig, ClientOptions, ObjectMeta, ObjectStore, RetryConfig};

pub use self::http::{ERROR_BODY_MAX, MIN_UPLOAD_RATE, SMALL_BODY_MAX};
pub use list::{MAX_EMPTY_PAGES, MAX_PAGES};
pub use partial::RESUME_MIN;

use crate::ground::error::{Error, ErrorKind, Operation, Result};

pub use config::{Keys, RemoteConfig, RetryPolicy};
pub use gc::{RemoteGcReport, RemoteManifest};
pub use pull::PullReport;
pub use push::{Push, PushReport};

use super::manifest::{Digest, EntryKind, Manifest};

/// A gc lock older than this (by the server's clock) belongs to a gc that
/// died; pushes stop waiting for it.
pub const LOCK_STALE: Duration = Duration::from_secs(10 * 60);

/// The most bytes a manifest or pending marker fetched from the remote may
/// have (about two million entries); a larger one is refused unread.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// How often a long push rewrites its pending marker (and a long gc its
/// lock), so that neither looks abandoned while it runs.
pub const MARKER_REFRESH: Duration = Duration::from_secs(60);

/// The longest grace period a remote gc accepts (ten years): longer is
/// surely a mistake, and every age below it fits every clock type used.
pub const MAX_GRACE: Duration = Duration::from_secs(3653 * 86400);

/// How long before `now` the server's clock says `then` was, saturating:
/// a `then` after `now` is age zero, and no difference overflows.
pub(crate) fn server_age(
    now: chrono::DateTime<chrono::Utc>,
    then: chrono::DateTime<chrono::Utc>,
) -> Duration {
    now.signed_duration_since(then)
        .to_std()
        .unwrap_or(Duration::ZERO)
}

/// Requests made and bytes moved, as counted by the client.
#[derive(Debug, Default)]
pub struct Requests {
    get: AtomicU64,
    put: AtomicU64,
    head: AtomicU64,
    list: AtomicU64,
    delete: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

/// A copy of [`Requests`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestCounts {
    /// GET requests (objects and manifests downloaded).
    pub get: u64,
    /// PUT requests (whole objects, multipart parts and their create and
    /// complete calls, manifests, markers, locks).
    pub put: u64,
    /// HEAD requests (does the remote have this?).
    pub head: u64,
    /// LIST requests (one per page of up to 1000 keys).
    pub list: u64,
    /// DELETE requests.
    pub delete: u64,
    /// Bytes sent in request bodies.
    pub bytes_up: u64,
    /// Bytes received in response bodies.
    pub bytes_down: u64,
}

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.get + self.put + self.head + self.list + self.delete
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        RequestCounts {
            get: self.get - before.get,
            put: self.put - before.put,
            head: self.head - before.head,
            list: self.list - before.list,
            delete: self.delete - before.delete,
            bytes_up: self.bytes_up - before.bytes_up,
            bytes_down: self.bytes_down - before.bytes_down,
        }
    }
}

/// A connection to one remote store (`s3://BUCKET/PREFIX`). Opening it
/// contacts nothing; the first request shows whether the bucket and the
/// keys are right.
#[derive(Debug)]
pub struct Remote {
    config: RemoteConfig,
    /// Where the keys came from, for messages.
    keys_from: String,
    /// The endpoint resolved at open (`None`: AWS), for messages.
    endpoint: Option<String>,
    client: Arc<AmazonS3>,
    runtime: tokio::runtime::Runtime,
    requests: Requests,
    /// How often a push rewrites its pending markers.
    marker_refresh: Duration,
    /// The same guarded HTTP client object_store uses, for the requests
    /// signed here (listings).
    http: object_store::client::HttpClient,
    /// The keys, for signing those requests.
    credential: object_store::aws::AwsCredential,
    /// The region in use, for signing and messages.
    region: String,
    /// The bucket's URL (path style at an endpoint, else AWS's virtual
    /// host).
    bucket_url: String,
    /// Pages of one listing, at most ([`MAX_PAGES`]).
    max_pages: usize,
}

/// What kind of key of the remote's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Area {
    Objects,
    Manifests,
    Pending,
    Locks,
}

impl Area {
    fn dir(self) -> &'static str {
        match self {
            Area::Objects => "objects",
            Area::Manifests => "manifests",
            Area::Pending => "pending",
            Area::Locks => "locks",
        }
    }
}

impl Remote {
    /// Resolve `config` (environment, profile files) and build the client.
    ///
    /// # Errors
    /// `PermissionDenied` when no credentials are found, `InvalidInput` for
    /// a bad endpoint or an unreadable profile file.
    pub fn open(config: RemoteConfig) -> Result<Remote> {
        let r = config.resolve()?;
        let setup = |e: &dyn std::fmt::Display| {
            Error::new(Operation::Remote, ErrorKind::InvalidInput)
                .with_src(config.url())
                .with_reason(format!("cannot set up the S3 client: {e}"))
        };
        // Every request goes through one guarded client (http.rs): it
        // retries on time and Retry-After, times out on idleness, and
        // bounds the bodies; object_store's own retries and whole-request
        // timeout are off.
        let options = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout_disabled()
            .with_allow_http(
                r.endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://")),
            )
            .with_pool_max_idle_per_host(config.transfers.max(1));
        let credential = || object_store::aws::AwsCredential {
            key_id: r.access_key.clone(),
            secret_key: r.secret_key.clone(),
            token: r.token.clone(),
        };
        let connector =
            http::GuardConnector::new(&options, config.retry, credential(), r.region.clone())
                .map_err(|e| setup(&e))?;
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&r.region)
            .with_access_key_id(&r.access_key)
            .with_secret_access_key(&r.secret_key)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: config.retry.max_backoff,
                    base: 2.0,
                },
                max_retries: 0,
                retry_timeout: Duration::ZERO,
            })
            .with_client_options(options)
            .with_http_connector(connector.clone());
        if let Some(t) = &r.token {
            b = b.with_token(t);
        }
        if let Some(e) = &r.endpoint {
            b = b
                .with_endpoint(e)
                .with_allow_http(e.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let client = b.build().map_err(|e| setup(&e))?;
        let bucket_url = match &r.endpoint {
            Some(e) => format!("{}/{}", e.trim_end_matches('/'), config.bucket),
            None => format!("https://{}.s3.{}.amazonaws.com", config.bucket, r.region),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(crate::run::cores().clamp(1, 4))
            .thread_name("cowlink-remote")
            .enable_all()
            .build()
            .map_err(|e| Error::from_io(Operation::Remote, &e).with_src(config.url()))?;
        Ok(Remote {
            config,
            keys_from: r.keys_from,
            endpoint: r.endpoint,
            client: Arc::new(client),
            runtime,
            requests: Requests::default(),
            marker_refresh: MARKER_REFRESH,
            http: connector.0,
            credential: credential(),
            region: r.region.clone(),
            bucket_url,
            max_pages: MAX_PAGES,
        })
    }

    /// Bound the pages of one listing to `n` instead of [`MAX_PAGES`] (a
    /// smaller bound for a remote known to be small, and for tests).
    pub fn with_max_pages(mut self, n: usize) -> Remote {
        self.max_pages = n.max(1);
        self
    }

    /// The remote's `s3://BUCKET/PREFIX`.
    pub fn url(&self) -> String {
        self.config.url()
    }

    /// Requests made so far by this value.
    pub fn requests(&self) -> RequestCounts {
        let r = &self.requests;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RequestCounts {
            get: l(&r.get),
            put: l(&r.put),
            head: l(&r.head),
            list: l(&r.list),
            delete: l(&r.delete),
            bytes_up: l(&r.bytes_up),
            bytes_down: l(&r.bytes_down),
        }
    }

    /// The key of the object `d`.
    pub(crate) fn object_key(&self, d: &Digest) -> Key {
        Key::from(layout::key_of(
            &self.config.prefix,
            &layout::Layout::Object(*d),
        ))
    }

    /// The key of the manifest `d`.
    pub(crate) fn manifest_key(&self, d: &Digest) -> Key {
        Key::from(layout::key_of(
            &self.config.prefix,
            &layout::Layout::Manifest(*d),
        ))
    }

    /// `s3://BUCKET/KEY`, for messages.
    pub(crate) fn shown(&self, key: &Key) -> String {
        format!("s3://{}/{key}", self.config.bucket)
    }

    /// The prefix of `area` (for listing).
    fn area_prefix(&self, area: Area) -> Key {
        match self.config.prefix.as_str() {
            "" => Key::from(area.dir()),
            p => Key::from(format!("{p}/{}", area.dir())),
        }
    }

    /// Turn a client error on `key` into ours, with a reason a user can act
    /// on.
    pub(crate) fn error(&self, op: Operation, key: &Key, e: object_store::Error) -> Error {
        let not_found = matches!(e, object_store::Error::NotFound { .. });
        let denied = matches!(
            e,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        );
        self.fault_error(op, &self.shown(key), &error_chain(&e), not_found, denied)
    }

    /// The one place a failed request becomes an [`Error`]: the server's
    /// code in plain words (`fault.rs`), every piece of its text quoted.
    /// `text` is the failure as the client saw it (with the answer's body
    /// when there was one), `at` the key or prefix shown.
    fn fault_error(
        &self,
        op: Operation,
        at: &str,
        text: &str,
        not_found: bool,
        denied: bool,
    ) -> Error {
        let f = fault::Fault::parse(text);
        let no_bucket = || {
            (
                ErrorKind::NotFound,
                format!(
                    "the bucket '{}' does not exist at {} (create it first)",
                    self.config.bucket,
                    self.endpoint_shown()
                ),
            )
        };
        let (kind, reason) = if f.code.as_deref() == Some("NoSuchBucket") {
            no_bucket()
        } else if let Some(words) = f.words(&self.keys_from, &self.region) {
            words
        } else if not_found || f.status == Some(404) {
            (
                ErrorKind::NotFound,
                "the remote has no such key".to_string(),
            )
        } else if denied || f.status == Some(403) {
            // A HEAD's answer has no body to say which.
            (
                ErrorKind::PermissionDenied,
                format!(
                    "access denied (403): the access key is unknown, the secret key is wrong, \
                     or the bucket's policy forbids this (keys from {})",
                    self.keys_from
                ),
            )
        } else {
            let what = match f.summary() {
                Some(s) => s,
                None => {
                    let first = text.split("[retry:").next().unwrap_or(text);
                    fault::shown(first.trim())
                }
            };
            (
                ErrorKind::Io,
                format!(
                    "the server at {} failed or could not be reached: {what}{}",
                    self.endpoint_shown(),
                    f.retry_shown()
                ),
            )
        };
        Error::new(op, kind).with_src(at).with_reason(reason)
    }

    fn endpoint_shown(&self) -> &str {
        self.endpoint.as_deref().unwrap_or("AWS S3")
    }

    /// Every key below `area`, and the keys that cannot be named (quoted
    /// for messages). A listing the server breaks (a repeated
    /// continuation token, keys out of order or repeated, endless empty
    /// pages, more than the page bound) is `Corrupt`.
    pub(crate) async fn list_all(&self, op: Operation, area: Area) -> Result<list::Listing> {
        let prefix = self.area_prefix(area);
        let count = || {
            self.requests.list.fetch_add(1, Ordering::Relaxed);
        };
        let lister = list::Lister {
            http: &self.http,
            credential: &self.credential,
            region: &self.region,
            bucket_url: &self.bucket_url,
            max_pages: self.max_pages,
            on_page: &count,
        };
        let at = format!("{}/", self.shown(&prefix));
        match lister.list(&format!("{prefix}/")).await {
            Ok(l) => Ok(l),
            Err(list::ListError::Request(t)) => {
                let not_found = t.contains("status code: 404");
                let denied = t.contains("status code: 403");
                Err(self.fault_error(op, &at, &t, not_found, denied))
            }
            Err(list::ListError::Bad(why)) => Err(Error::new(op, ErrorKind::Corrupt)
                .with_src(at)
                .with_reason(format!(
                    "the server's listing cannot be used: {why}; nothing was changed"
                ))),
        }
    }

    /// HEAD `key`: its metadata, or `None` when the remote has no such key.
    pub(crate) async fn head(&self, op: Operation, key: &Key) -> Result<Option<ObjectMeta>> {
        use object_store::ObjectStoreExt;
        self.requests.head.fetch_add(1, Ordering::Relaxed);
        match self.client.head(key).await {
            Ok(m) => Ok(Some(m)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            // A HEAD's refusal has no body to say why; one GET can. (Not
            // after a failure that was retried: the GET would wait as
            // long again.)
            Err(e) if refused_without_words(&e) => Err(self.explain_denial(op, key, e).await),
            Err(e) => Err(self.error(op, key, e)),
        }
    }

    /// The error for a HEAD of `key` the server refused. The answer to a
    /// HEAD has no body, so it cannot say whether the access key is
    /// unknown, the secret wrong, the clock off or the region wrong
    /// (MinIO, AWS); one GET of the key's first byte, refused the same
    /// way, can.
    async fn explain_denial(&self, op: Operation, key: &Key, head: object_store::Error) -> Error {
        use object_store::{GetOptions, GetRange};
        self.requests.get.fetch_add(1, Ordering::Relaxed);
        let opts = GetOptions {
            range: Some(GetRange::Bounded(0..1)),
            ..GetOptions::default()
        };
        match self.client.get_opts(key, opts).await {
            Err(e) if fault::Fault::parse(&error_chain(&e)).code.is_some() => {
                self.error(op, key, e)
            }
            _ => self.error(op, key, head),
        }
    }

    /// PUT `bytes` at `key` (one request).
    pub(crate) async fn put(&self, op: Operation, key: &Key, bytes: bytes::Bytes) -> Result<()> {
        use object_store::ObjectStoreExt;
        let n = bytes.len() as u64;
        self.requests.put.fetch_add(1, Ordering::Relaxed);
        self.client
            .put(key, bytes.into())
            .await
            .map_err(|e| self.error(op, key, e))?;
        self.requests.bytes_up.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// GET `key` whole (manifests and markers), at most
    /// [`MAX_MANIFEST_BYTES`]: read as it comes, never sized by what the
    /// server claims.
    pub(crate) async fn get_all(&self, op: Operation, key: &Key) -> Result<bytes::Bytes> {
        self.get_capped(op, key, MAX_MANIFEST_BYTES).await
    }

    /// GET `key` whole, refusing more than `max` bytes (claimed or sent).
    pub(crate) async fn get_capped(
        &self,
        op: Operation,
        key: &Key,
        max: u64,
    ) -> Result<bytes::Bytes> {
        use futures::StreamExt;
        use object_store::ObjectStoreExt;
        self.requests.get.fetch_add(1, Ordering::Relaxed);
        let too_big = |n: String| {
            Error::new(op, ErrorKind::Corrupt)
                .with_src(self.shown(key))
                .with_reason(format!(
                    "the server {n}, more than the {max} bytes a manifest or marker may have: \
                     refused unread"
                ))
        };
        let r = self
            .client
            .get(key)
            .await
            .map_err(|e| self.error(op, key, e))?;
        if r.meta.size > max {
            return Err(too_big(format!("says it has {} bytes", r.meta.size)));
        }
        let mut stream = r.into_stream();
        let mut out: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.error(op, key, e))?;
            self.requests
                .bytes_down
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            if (out.len() + chunk.len()) as u64 > max {
                return Err(too_big("sent more".to_string()));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out.into())
    }

    /// DELETE `key` (absent already counts as done).
    pub(crate) async fn delete(&self, op: Operation, key: &Key) -> Result<()> {
        use object_store::ObjectStoreExt;
        self.requests.delete.fetch_add(1, Ordering::Relaxed);
        match self.client.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(op, key, e)),
        }
    }

    /// Run `f` to completion on this remote's runtime.
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Requests in flight at once.
    pub(crate) fn transfers(&self) -> usize {
        self.config.transfers.max(1)
    }

    /// What `key` (as the server listed it) is in cowlink's layout under this remote's prefix, or
    /// `None` when it is not exactly a key cowlink writes (see
    /// `layout.rs`): the one test every step that deletes or trusts a
    /// listed key passes through.
    pub(crate) fn layout_of(&self, key: &str) -> Option<layout::Layout> {
        layout::classify(&self.server_prefix(), key)
    }

    /// This remote's prefix as the server spells it (`layout.rs`).
    pub(crate) fn server_prefix(&self) -> String {
        layout::server_prefix(&self.config.prefix)
    }

    /// Rewrite a push's pending markers every `every` instead of every
    /// [`MARKER_REFRESH`] (for a fleet whose gc runs with a short grace
    /// period, and for tests). A push's markers are rewritten on this
    /// timer whatever its transfers do.
    pub fn with_marker_refresh(mut self, every: Duration) -> Remote {
        self.marker_refresh = every.max(Duration::from_millis(10));
        self
    }
}

/// The distinct objects `manifests` name, with their sizes, in digest
/// order (what a push offers and a pull asks for).
pub(crate) fn objects_named<'m>(
    manifests: impl IntoIterator<Item = &'m Manifest>,
) -> Vec<(Digest, u64)> {
    let mut named: std::collections::HashMap<Digest, u64> = std::collections::HashMap::new();
    for m in manifests {
        for e in &m.entries {
            if let EntryKind::File { digest, size, .. } = e.kind {
                named.insert(digest, size);
            }
        }
    }
    let mut named: Vec<(Digest, u64)> = named.into_iter().collect();
    named.sort();
    named
}

/// Whether `e` is a refusal (a 4xx answer) whose body did not say why.
fn refused_without_words(e: &object_store::Error) -> bool {
    let f = fault::Fault::parse(&error_chain(e));
    let refused = matches!(
        e,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    ) || f.status.is_some_and(|s| (400..500).contains(&s));
    refused && f.code.is_none()
}

/// A client error and its sources, as one text (the server's answer is
/// in there somewhere).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s = format!("{s}: {t}");
        }
        cur = c.source();
    }
    s
}

/// A unique id for this process's markers and locks: host, PID and the
/// time in nanoseconds.
pub(crate) fn marker_id() -> String {
    let host = cowlink_sys::hostname();
    let host = layout::to_id(host.trim());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Cut the host, never the part that makes the id unique.
    let tail = format!("-{}-{nanos}", std::process::id());
    let host = &host[..host.len().min(200)];
    layout::to_id(&format!("{host}{tail}"))
}
