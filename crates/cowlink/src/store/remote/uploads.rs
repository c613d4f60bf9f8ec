//! Incomplete multipart uploads: S3 keeps (and bills) the parts of an
//! upload that was never completed nor aborted, such as a push killed
//! mid-object. Remote gc lists them and aborts the old ones.
//!
//! object_store 0.14 can create, complete and abort a multipart upload
//! but not list them (`ListMultipartUploads`). That one request is built
//! here, signed with object_store's own SigV4 signer
//! ([`AwsAuthorizer`]) and sent through the remote's guarded HTTP client, so it carries
//! the same keys, region and endpoint as every other request. The answer
//! is untrusted: its body is read up to [`BODY_MAX`], its pages are
//! bounded by [`PAGES_MAX`] and a page that does not move the listing on
//! ends it with an error.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use object_store::aws::AwsAuthorizer;
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

impl Remote {
    /// The incomplete multipart uploads of keys below this remote's
    /// prefix (the whole bucket for an empty prefix).
    ///
    /// # Errors
    /// `PermissionDenied` (403), `Io` for any other refusal, an answer
    /// that cannot be read, or a listing that does not end.
    pub(crate) async fn list_uploads(&self, op: Operation) -> Result<Vec<Upload>> {
        // Through the remote's one guarded HTTP client (http.rs): its
        // retries, idle time-out and re-signing apply here too.
        let base = &self.bucket_url;
        let prefix = match self.config.prefix.as_str() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let where_ = || format!("s3://{}/{prefix}", self.config.bucket);
        let fail = |kind: ErrorKind, why: String| {
            Error::new(op, kind)
                .with_src(where_())
                .with_reason(format!("cannot list incomplete multipart uploads: {why}"))
        };
        let mut out = Vec::new();
        let mut marker: Option<Marker> = None;
        for _ in 0..PAGES_MAX {
            let mut url = format!(
                "{base}?uploads=&max-uploads=1000&prefix={}",
                encode(&prefix)
            );
            if let Some((k, u)) = &marker {
                url.push_str(&format!("&key-marker={}", encode(k)));
                if !u.is_empty() {
                    url.push_str(&format!("&upload-id-marker={}", encode(u)));
                }
            }
            let mut req: HttpRequest = http::Request::builder()
                .method(http::Method::GET)
                .uri(&url)
                .body(HttpRequestBody::empty())
                .map_err(|e| fail(ErrorKind::InvalidInput, e.to_string()))?;
            AwsAuthorizer::new(&self.credential, "s3", &self.region)
                .try_authorize(&mut req, None)
                .map_err(|e| fail(ErrorKind::InvalidInput, e.to_string()))?;
            self.requests.list.fetch_add(1, Ordering::Relaxed);
            let resp = self
                .http
                .execute(req)
                .await
                .map_err(|e| fail(ErrorKind::Io, format!("{e}")))?;
            let status = resp.status();
            let mut body = Vec::new();
            let mut stream = resp.into_body().bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| fail(ErrorKind::Io, format!("{e}")))?;
                if body.len() + chunk.len() > BODY_MAX {
                    return Err(fail(
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
                let kind = if status.as_u16() == 403 {
                    ErrorKind::PermissionDenied
                } else {
                    ErrorKind::Io
                };
                return Err(fail(kind, format!("the server answered {status} {code}")));
            }
            let (page, next) = parse_page(&body).map_err(|e| fail(ErrorKind::Io, e))?;
            out.extend(page);
            match next {
                None => return Ok(out),
                Some(n) if Some(&n) == marker.as_ref() || n.0.is_empty() => {
                    return Err(fail(
                        ErrorKind::Io,
                        "the server's listing does not move on (the same page again)".into(),
                    ))
                }
                Some(n) => marker = Some(n),
            }
        }
        Err(fail(
            ErrorKind::Io,
            format!("the listing did not end after {PAGES_MAX} pages"),
        ))
    }

    /// Abort the multipart upload `u` (one DELETE; an upload already gone
    /// counts as done).
    pub(crate) async fn abort_upload(&self, op: Operation, u: &Upload) -> Result<()> {
        use object_store::multipart::MultipartStore;
        let key = object_store::path::Path::from(u.key.as_str());
        self.requests.delete.fetch_add(1, Ordering::Relaxed);
        match self.client.abort_multipart(&key, &u.id).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(op, &key, e)),
        }
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
