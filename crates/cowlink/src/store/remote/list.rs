//! Listing keys: ListObjectsV2 signed with object_store's signer, sent
//! through the guarded client and read here, page by page.
//!
//! object_store's own listing fails as a whole on one key it cannot hold
//! (a control character, an empty or `..` part), and follows
//! continuation tokens for ever. Here a listing is checked as it goes:
//!
//! - a continuation token may not come back;
//! - a key listed again is dropped, and at most [`MAX_EMPTY_PAGES`] pages
//!   in a row may bring no new key (a server that repeats its pages, or
//!   sends empty ones for ever, is caught). Order is not checked: real
//!   servers mangle keys XML cannot carry (versitygw writes U+FFFD for a
//!   control character), which breaks the order of what they send;
//! - a listing has at most `max_pages` pages (a bound on time and
//!   memory);
//! - a key object_store cannot name is not cowlink's (every key cowlink
//!   writes is hex and dots): it is skipped and counted, never fatal.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use http::Method;
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{HttpClient, HttpRequest};
use object_store::path::Path as Key;
use object_store::ObjectMeta;
use quick_xml::events::Event;

use super::fault::shown;

/// Pages in a row without a new key a listing accepts before it stops
/// (S3 may answer an empty page that is truncated, rarely more than a few
/// times).
pub const MAX_EMPTY_PAGES: usize = 100;

/// Pages of one listing, at most (10 million keys at 1000 a page).
pub const MAX_PAGES: usize = 10_000;

/// One listed key as the server sent it: key, size, upload time, ETag.
pub(super) type Listed = (String, u64, Option<DateTime<Utc>>, Option<String>);

/// One page as the server sent it.
#[derive(Debug, Default)]
pub(super) struct Page {
    pub keys: Vec<Listed>,
    pub truncated: bool,
    pub next: Option<String>,
    pub url_encoded: bool,
}

/// What went wrong reading a listing (the message's reason).
#[derive(Debug)]
pub(super) enum ListError {
    /// The request failed: the text of the failure (an S3 error body or a
    /// transport error).
    Request(String),
    /// The answer is not a listing, or breaks the rules above.
    Bad(String),
}

/// Read one ListObjectsV2 answer.
pub(super) fn parse_page(body: &[u8]) -> Result<Page, String> {
    let mut r = quick_xml::Reader::from_reader(body);
    let mut page = Page::default();
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut cur: Option<Listed> = None;
    let mut seen_root = false;
    let mut buf = Vec::new();
    loop {
        let ev = r
            .read_event_into(&mut buf)
            .map_err(|e| format!("not a listing (bad XML: {})", shown(&e.to_string())))?;
        match ev {
            Event::Start(e) => {
                let name = e.name().as_ref().to_vec();
                if path.is_empty() {
                    if name != b"ListBucketResult" {
                        return Err(format!(
                            "not a listing (its root is {})",
                            shown(&String::from_utf8_lossy(&name))
                        ));
                    }
                    seen_root = true;
                }
                if path.len() == 1 && name == b"Contents" {
                    cur = Some((String::new(), 0, None, None));
                }
                path.push(name);
            }
            Event::End(_) => {
                if path.len() == 2 && path[1] == b"Contents" {
                    if let Some(c) = cur.take() {
                        page.keys.push(c);
                    }
                }
                path.pop();
            }
            Event::Text(t) => {
                let raw = String::from_utf8_lossy(t.as_ref()).into_owned();
                let text = quick_xml::escape::unescape(&raw)
                    .map(|c| c.into_owned())
                    .map_err(|_| format!("not a listing (bad escape in {})", shown(&raw)))?;
                text_of(&path, text, &mut page, &mut cur)?;
            }
            Event::GeneralRef(g) => {
                // `&amp;` and friends arrive as references in this version
                // of quick-xml: decode and append to the current field.
                let name = String::from_utf8_lossy(g.as_ref()).into_owned();
                let text = quick_xml::escape::unescape(&format!("&{name};"))
                    .map(|c| c.into_owned())
                    .map_err(|_| format!("not a listing (unknown entity {})", shown(&name)))?;
                text_of(&path, text, &mut page, &mut cur)?;
            }
            Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    if !seen_root {
        return Err("not a listing (no ListBucketResult)".to_string());
    }
    Ok(page)
}

/// Append `text` to the field `path` names.
fn text_of(
    path: &[Vec<u8>],
    text: String,
    page: &mut Page,
    cur: &mut Option<Listed>,
) -> Result<(), String> {
    let names: Vec<&[u8]> = path.iter().map(Vec::as_slice).collect();
    match names.as_slice() {
        [_, b"IsTruncated"] => page.truncated = text.trim() == "true",
        [_, b"NextContinuationToken"] => page.next.get_or_insert_with(String::new).push_str(&text),
        [_, b"EncodingType"] => page.url_encoded = text.trim() == "url",
        [_, b"Contents", field] => {
            let Some(c) = cur.as_mut() else {
                return Ok(());
            };
            match *field {
                b"Key" => c.0.push_str(&text),
                b"Size" => {
                    c.1 = text
                        .trim()
                        .parse()
                        .map_err(|_| format!("not a listing (a size of {})", shown(&text)))?
                }
                b"LastModified" => {
                    c.2 = DateTime::parse_from_rfc3339(text.trim())
                        .ok()
                        .map(|d| d.with_timezone(&Utc))
                }
                b"ETag" => c.3.get_or_insert_with(String::new).push_str(&text),
                _ => {}
            }
        }
        _ => {}
    }
    Ok(())
}

/// `%XX` decoding of a key listed with `encoding-type=url`.
fn url_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(h, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `%XX` encoding of a query value (RFC 3986 unreserved kept).
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out += &format!("%{b:02X}");
        }
    }
    out
}

/// A signed LIST of keys below one prefix.
pub(super) struct Lister<'a> {
    pub http: &'a HttpClient,
    pub credential: &'a AwsCredential,
    pub region: &'a str,
    /// `http://host:port/bucket` or `https://bucket.s3.region.amazonaws.com`.
    pub bucket_url: &'a str,
    pub max_pages: usize,
    /// Counted per page sent.
    pub on_page: &'a (dyn Fn() + Sync),
}

/// Keys listed, and the keys skipped because object_store cannot name
/// them (quoted for messages).
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) keys: Vec<ObjectMeta>,
    pub(crate) skipped: Vec<String>,
    /// Every key below the prefix exactly as the server spells it (once
    /// each), with size and upload time, whether object_store can name it
    /// or not: what gc and push judge with `layout.rs`.
    pub(crate) raw: Vec<(String, u64, Option<DateTime<Utc>>)>,
}

impl Lister<'_> {
    /// Every key below `prefix` (which ends in `/`).
    pub async fn list(&self, prefix: &str) -> Result<Listing, ListError> {
        let mut out = Listing::default();
        let mut token: Option<String> = None;
        let mut tokens: HashSet<String> = HashSet::new();
        let mut seen: HashSet<String> = HashSet::new();
        let mut empty = 0usize;
        for _ in 0..self.max_pages {
            let page = self.page(prefix, token.as_deref()).await?;
            let mut new = false;
            for (raw, size, modified, etag) in page.keys {
                let key = match page.url_encoded {
                    true => url_decode(&raw)
                        .ok_or_else(|| ListError::Bad(format!("a bad key {}", shown(&raw))))?,
                    false => raw,
                };
                if !seen.insert(key.clone()) {
                    continue;
                }
                new = true;
                if !key.starts_with(prefix) {
                    out.skipped.push(shown(&key));
                    continue;
                }
                out.raw.push((key.clone(), size, modified));
                match Key::parse(&key) {
                    Ok(location) => out.keys.push(ObjectMeta {
                        location,
                        last_modified: modified.unwrap_or_default(),
                        size,
                        e_tag: etag,
                        version: None,
                    }),
                    Err(_) => out.skipped.push(shown(&key)),
                }
            }
            empty = if new { 0 } else { empty + 1 };
            if page.truncated && empty > MAX_EMPTY_PAGES {
                return Err(ListError::Bad(format!(
                    "the server sent {empty} pages in a row without a new key and still said \
                     there was more (a listing that would never end)"
                )));
            }
            match (page.truncated, page.next) {
                (false, _) => return Ok(out),
                (true, None) => {
                    return Err(ListError::Bad(
                        "the server said the listing goes on but gave no continuation token"
                            .to_string(),
                    ))
                }
                (true, Some(t)) => {
                    if !tokens.insert(t.clone()) {
                        return Err(ListError::Bad(format!(
                            "the server sent the continuation token {} twice (a listing that \
                             would never end)",
                            shown(&t)
                        )));
                    }
                    token = Some(t);
                }
            }
        }
        Err(ListError::Bad(format!(
            "the listing has more than {} pages (over {} keys): stopped",
            self.max_pages,
            self.max_pages * 1000
        )))
    }

    async fn page(&self, prefix: &str, token: Option<&str>) -> Result<Page, ListError> {
        let mut q = format!(
            "list-type=2&encoding-type=url&prefix={}",
            url_encode(prefix)
        );
        if let Some(t) = token {
            q += &format!("&continuation-token={}", url_encode(t));
        }
        let uri = format!("{}?{q}", self.bucket_url.trim_end_matches('/'));
        let mut req: HttpRequest =
            http::Request::new(object_store::client::HttpRequestBody::empty());
        *req.method_mut() = Method::GET;
        *req.uri_mut() = uri
            .parse()
            .map_err(|e| ListError::Request(format!("a bad URL {uri}: {e}")))?;
        AwsAuthorizer::new(self.credential, "s3", self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| ListError::Request(e.to_string()))?;
        (self.on_page)();
        let r = self.http.execute(req).await.map_err(|e| {
            let mut s = e.to_string();
            let mut cur = std::error::Error::source(&e);
            while let Some(c) = cur {
                s = format!("{s}: {c}");
                cur = c.source();
            }
            ListError::Request(s)
        })?;
        let status = r.status();
        let body = collect(r.into_body(), super::http::SMALL_BODY_MAX)
            .await
            .map_err(|e| ListError::Request(format!("reading a listing: {e}")))?;
        if !status.is_success() {
            return Err(ListError::Request(format!(
                "status code: {} {}",
                status.as_u16(),
                String::from_utf8_lossy(&body)
            )));
        }
        parse_page(&body).map_err(ListError::Bad)
    }
}

/// A body's bytes, at most `max` (an error past that), grown as they come.
pub(super) async fn collect(
    body: object_store::client::HttpResponseBody,
    max: u64,
) -> Result<Vec<u8>, String> {
    use futures::StreamExt;
    let mut s = body.bytes_stream();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        let b = b.map_err(|e| e.to_string())?;
        if (out.len() + b.len()) as u64 > max {
            return Err(format!("longer than {max} bytes"));
        }
        out.extend_from_slice(&b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_read() {
        let xml = br#"<?xml version="1.0"?><ListBucketResult><IsTruncated>true</IsTruncated>
            <EncodingType>url</EncodingType>
            <Contents><Key>p/a%0Ab</Key><Size>12</Size><LastModified>2024-01-02T03:04:05.000Z</LastModified><ETag>&quot;x&quot;</ETag></Contents>
            <Contents><Key>p/c&amp;d</Key><Size>3</Size></Contents>
            <NextContinuationToken>t&amp;1</NextContinuationToken></ListBucketResult>"#;
        let p = parse_page(xml).unwrap();
        assert!(p.truncated && p.url_encoded);
        assert_eq!(p.next.as_deref(), Some("t&1"));
        assert_eq!(p.keys.len(), 2);
        assert_eq!(p.keys[0].0, "p/a%0Ab");
        assert_eq!(url_decode(&p.keys[0].0).as_deref(), Some("p/a\nb"));
        assert_eq!(p.keys[0].1, 12);
        assert_eq!(p.keys[0].3.as_deref(), Some("\"x\""));
        assert_eq!(p.keys[1].0, "p/c&d");
        for bad in [
            &b"<Error/>"[..],
            b"",
            b"<ListBucketResult><Contents><Size>x</Size></Contents></ListBucketResult>",
        ] {
            assert!(parse_page(bad).is_err());
        }
    }
}
