//! The two listings the remote's protocol rests on, made by hand:
//! keys ([`Remote::list_keys`], `ListObjectsV2`) and incomplete multipart
//! uploads ([`Remote::list_uploads`], `ListMultipartUploads`: S3 keeps,
//! and bills, the parts of an upload never completed nor aborted, such
//! as a push killed mid-object; remote gc aborts the old ones).
//!
//! object_store 0.14 cannot list uploads at all, and its key listing
//! parses every key into its `Path`, which fails the whole listing on a
//! key it cannot parse (a control character, an empty or `.` segment,
//! written by another tool under the prefix) and silently drops a
//! trailing `/` (so `objects/ab/<hex>/` would pass for the object). Both
//! requests are built here, signed with object_store's own SigV4 signer
//! ([`AwsAuthorizer`]) and sent with its own HTTP client, so they carry
//! the same keys, region and endpoint as every other request; keys come
//! back as the server's exact strings, for `layout.rs` to judge. The
//! answers are untrusted: a body is read up to [`BODY_MAX`], pages are
//! bounded by [`PAGES_MAX`] and a page that does not move the listing on
//! ends it with an error.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{HttpRequest, HttpRequestBody};

use crate::ground::error::{Error, ErrorKind, Operation, Result};

use super::Remote;

/// The largest answer read for one page (1000 uploads take about 400 KiB).
const BODY_MAX: usize = 8 << 20;
/// The most pages read (10 million uploads).
const PAGES_MAX: usize = 10_000;

/// An incomplete multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upload {
    /// The key being uploaded.
    pub key: String,
    /// The upload's id.
    pub id: String,
    /// When it was started, by the server's clock.
    pub initiated: DateTime<Utc>,
}

/// A key of the remote as the server listed it, exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// The key, exactly as the server spells it (never re-encoded).
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its upload time, by the server's clock.
    pub last_modified: DateTime<Utc>,
}

#[derive(serde::Deserialize, Debug)]
#[serde(rename_all = "PascalCase")]
struct Page {
    #[serde(default)]
    is_truncated: bool,
    next_key_marker: Option<String>,
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<XmlUpload>,
}

#[derive(serde::Deserialize, Debug)]
#[serde(rename_all = "PascalCase")]
struct XmlUpload {
    key: String,
    upload_id: String,
    initiated: String,
}

/// `s` percent-encoded for a query value (everything but RFC 3986's
/// unreserved characters), the way SigV4 canonicalizes it.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Where the next page starts: key marker and upload id marker.
type Marker = (String, String);

/// Parse one page of a `ListMultipartUploads` answer.
fn parse_page(body: &[u8]) -> std::result::Result<(Vec<Upload>, Option<Marker>), String> {
    let text = std::str::from_utf8(body).map_err(|_| "the answer is not UTF-8".to_string())?;
    let page: Page =
        quick_xml::de::from_str(text).map_err(|e| format!("unreadable answer: {e}"))?;
    let mut out = Vec::with_capacity(page.uploads.len());
    for u in page.uploads {
        let initiated = DateTime::parse_from_rfc3339(&u.initiated)
            .map_err(|_| format!("unreadable upload time {:?}", u.initiated))?
            .with_timezone(&Utc);
        out.push(Upload {
            key: u.key,
            id: u.upload_id,
            initiated,
        });
    }
    let next = if page.is_truncated {
        Some((
            page.next_key_marker.unwrap_or_default(),
            page.next_upload_id_marker.unwrap_or_default(),
        ))
    } else {
        None
    };
    Ok((out, next))
}

/// One signed GET request to the bucket, its answer bounded.
struct Lister {
    base: String,
    region: String,
    credential: AwsCredential,
    client: object_store::client::HttpClient,
    /// `s3://BUCKET/PREFIX/`, for messages.
    shown: String,
    what: &'static str,
}

impl Remote {
    /// A lister for this remote; `what` is named in its errors.
    fn lister(&self, op: Operation, what: &'static str) -> Result<Lister> {
        // Through the remote's one guarded HTTP client (http.rs): its
        // retries on time, idle time-out and re-signing apply here too.
        let base = self.bucket_url.clone();
        let shown = format!("s3://{}/{}", self.config.bucket, self.server_prefix());
        let _ = (op, what);
        Ok(Lister {
            base,
            region: self.region.clone(),
            credential: AwsCredential {
                key_id: self.credential.key_id.clone(),
                secret_key: self.credential.secret_key.clone(),
                token: self.credential.token.clone(),
            },
            client: self.http.clone(),
            shown,
            what,
        })
    }

    /// The keys under this remote's prefix and `area`, exactly as the
    /// server spells them, with sizes and upload times; one LIST request
    /// per 1000 keys. A key of any spelling is listed, never an error:
    /// `layout.rs` decides what it is.
    ///
    /// # Errors
    /// `PermissionDenied` (403), `NotFound` (no such bucket), `Io` for
    /// any other refusal, an answer that cannot be read, or a listing
    /// that does not end.
    pub(crate) async fn list_keys(&self, op: Operation, area: super::Area) -> Result<Vec<Listed>> {
        // The one key listing (`list.rs`: its continuation, repeat and
        // page rules, through the guarded client), keys kept exact.
        let listing = self.list_all(op, area).await?;
        Ok(listing
            .raw
            .into_iter()
            .map(|(key, size, t)| Listed {
                key,
                size,
                last_modified: t.unwrap_or_default(),
            })
            .collect())
    }

    /// GET `url` signed, counted as one LIST; the body of a success. A
    /// refusal of a listing of `keys` is explained as any other request's
    /// (`Remote::error`: unknown access key, wrong secret, no bucket).
    ///
    /// A failure that may pass (no answer, a 5xx, a cut body: `Io`) is
    /// tried again as the client's other requests are, under the
    /// remote's retry policy (tries, backoff, total time); a refusal is
    /// not.
    async fn signed_get(
        &self,
        op: Operation,
        l: &Lister,
        url: &str,
        keys: Option<&object_store::path::Path>,
    ) -> Result<Vec<u8>> {
        let policy = &self.config.retry;
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            match self.signed_get_once(op, l, url, keys).await {
                Err(e)
                    if e.kind() == ErrorKind::Io
                        && tries < policy.max_retries
                        && started.elapsed() + backoff < policy.timeout =>
                {
                    tries += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(policy.max_backoff);
                }
                r => return r,
            }
        }
    }

    async fn signed_get_once(
        &self,
        op: Operation,
        l: &Lister,
        url: &str,
        keys: Option<&object_store::path::Path>,
    ) -> Result<Vec<u8>> {
        let mut req: HttpRequest = http::Request::builder()
            .method(http::Method::GET)
            .uri(url)
            .body(HttpRequestBody::empty())
            .map_err(|e| l.fail(op, ErrorKind::InvalidInput, e.to_string()))?;
        AwsAuthorizer::new(&l.credential, "s3", &l.region)
            .try_authorize(&mut req, None)
            .map_err(|e| l.fail(op, ErrorKind::InvalidInput, e.to_string()))?;
        self.requests.list.fetch_add(1, Ordering::Relaxed);
        let resp = l
            .client
            .execute(req)
            .await
            .map_err(|e| l.fail(op, ErrorKind::Io, format!("{e}")))?;
        let status = resp.status();
        let mut body = Vec::new();
        let mut stream = resp.into_body().bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| l.fail(op, ErrorKind::Io, format!("{e}")))?;
            if body.len() + chunk.len() > BODY_MAX {
                return Err(l.fail(
                    op,
                    ErrorKind::Io,
                    format!("the server's answer is larger than {BODY_MAX} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        self.requests
            .bytes_down
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        if !status.is_success() {
            let code = s3_code(&body).unwrap_or_default();
            if let Some(key) = keys {
                let source = format!("the server answered {status} {code}").into();
                let path = key.to_string();
                let e = match status.as_u16() {
                    401 | 403 => object_store::Error::PermissionDenied { path, source },
                    404 => object_store::Error::NotFound { path, source },
                    _ => object_store::Error::Generic {
                        store: "S3",
                        source,
                    },
                };
                return Err(self.error(op, key, e));
            }
            let kind = match status.as_u16() {
                403 => ErrorKind::PermissionDenied,
                404 if code.contains("NoSuchBucket") => ErrorKind::NotFound,
                _ => ErrorKind::Io,
            };
            return Err(l.fail(op, kind, format!("the server answered {status} {code}")));
        }
        Ok(body)
    }

    /// The incomplete multipart uploads of keys below this remote's
    /// prefix (the whole bucket for an empty prefix).
    ///
    /// # Errors
    /// `PermissionDenied` (403), `Io` for any other refusal, an answer
    /// that cannot be read, or a listing that does not end.
    pub(crate) async fn list_uploads(&self, op: Operation) -> Result<Vec<Upload>> {
        let l = self.lister(op, "incomplete multipart uploads")?;
        let prefix = match self.server_prefix().as_str() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let mut out = Vec::new();
        let mut marker: Option<Marker> = None;
        for _ in 0..PAGES_MAX {
            let mut url = format!(
                "{}?uploads=&max-uploads=1000&prefix={}",
                l.base,
                encode(&prefix)
            );
            if let Some((k, u)) = &marker {
                url.push_str(&format!("&key-marker={}", encode(k)));
                if !u.is_empty() {
                    url.push_str(&format!("&upload-id-marker={}", encode(u)));
                }
            }
            let body = self.signed_get(op, &l, &url, None).await?;
            let (page, next) = parse_page(&body).map_err(|e| l.fail(op, ErrorKind::Io, e))?;
            out.extend(page);
            match next {
                None => return Ok(out),
                Some(n) if Some(&n) == marker.as_ref() || n.0.is_empty() => {
                    return Err(l.fail(
                        op,
                        ErrorKind::Io,
                        "the server's listing does not move on (the same page again)".into(),
                    ))
                }
                Some(n) => marker = Some(n),
            }
        }
        Err(l.fail(
            op,
            ErrorKind::Io,
            format!("the listing did not end after {PAGES_MAX} pages"),
        ))
    }

    /// Abort the multipart upload `u` (one DELETE; an upload already gone
    /// counts as done).
    pub(crate) async fn abort_upload(&self, op: Operation, u: &Upload) -> Result<()> {
        use object_store::multipart::MultipartStore;
        // The upload's key exactly as listed, never re-encoded.
        let key = super::layout::exact_key(&u.key).ok_or_else(|| {
            Error::new(op, ErrorKind::InvalidInput)
                .with_src(format!(
                    "s3://{}/{}",
                    self.config.bucket,
                    u.key.escape_debug()
                ))
                .with_reason("the client cannot name this key exactly; the upload is left alone")
        })?;
        self.requests.delete.fetch_add(1, Ordering::Relaxed);
        match self.client.abort_multipart(&key, &u.id).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(op, &key, e)),
        }
    }
}

impl Lister {
    fn fail(&self, op: Operation, kind: ErrorKind, why: String) -> Error {
        Error::new(op, kind)
            .with_src(&self.shown)
            .with_reason(format!("cannot list {}: {why}", self.what))
    }
}

/// The `<Code>` of an S3 error answer, shown printable only.
fn s3_code(body: &[u8]) -> Option<String> {
    let t = std::str::from_utf8(body).ok()?;
    let start = t.find("<Code>")? + 6;
    let len = t[start..].find("</Code>")?;
    let code: String = t[start..start + len]
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(64)
        .collect();
    Some(format!("({code})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_reads_and_says_where_to_go_on() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>b</Bucket><KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>p/objects/ab/x</NextKeyMarker><NextUploadIdMarker>U2</NextUploadIdMarker>
  <MaxUploads>2</MaxUploads><IsTruncated>true</IsTruncated>
  <Upload><Key>p/objects/ab/x</Key><UploadId>U1</UploadId><Initiated>2026-11-25T21:00:00.000Z</Initiated></Upload>
  <Upload><Key>p/y</Key><UploadId>U2</UploadId><Initiated>2026-11-25T21:00:01Z</Initiated><StorageClass>STANDARD</StorageClass></Upload>
</ListMultipartUploadsResult>"#;
        let (v, next) = parse_page(body).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].key, "p/objects/ab/x");
        assert_eq!(v[1].id, "U2");
        assert_eq!(next, Some(("p/objects/ab/x".into(), "U2".into())));
        let last = br#"<ListMultipartUploadsResult><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>"#;
        assert_eq!(parse_page(last).unwrap(), (vec![], None));
    }

    #[test]
    fn hostile_pages_are_errors_not_panics() {
        for body in [
            &b"\xff\xfe"[..],
            b"<ListMultipartUploadsResult><Upload><Key>k</Key></Upload></ListMultipartUploadsResult>",
            b"<ListMultipartUploadsResult><Upload><Key>k</Key><UploadId>u</UploadId><Initiated>yesterday</Initiated></Upload></ListMultipartUploadsResult>",
            b"<<<",
        ] {
            assert!(parse_page(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn query_values_are_strictly_encoded() {
        assert_eq!(encode("a/b c~"), "a%2Fb%20c~");
        assert_eq!(encode(""), "");
    }
}
