//! What a server's refusal means, in plain words: the one reader of S3
//! error answers (`<Error><Code>…</Code><Message>…</Message></Error>`,
//! found in object_store's error text or in an answer this crate read
//! itself) and the one place their words reach a message.
//!
//! Everything here comes from the server and is untrusted: a code is used
//! only when it is a plain word (letters, digits, `.`), and every other
//! piece of server text (its message, a region, an excerpt of a body that
//! is not an S3 error) is shown through the project's name-quoting rule
//! ([`crate::ground::name::quoted`]), so a server cannot write escape
//! sequences or line breaks to the user's terminal.

use std::path::Path;

use crate::ground::error::ErrorKind;
use crate::ground::name::quoted;

/// A server's refusal, as far as it could be read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Fault {
    /// The HTTP status, when known.
    pub status: Option<u16>,
    /// The S3 error code (`AccessDenied`), only when it is a plain word.
    pub code: Option<String>,
    /// The server's message, raw (quote it before showing it).
    pub message: Option<String>,
    /// The region the server names (`AuthorizationHeaderMalformed`).
    pub region: Option<String>,
    /// The retry loop's note ("gave up after 3 tries in 2.0 s: …").
    pub retry: Option<String>,
}

/// Server text, bounded and quoted for a message.
pub(super) fn shown(text: &str) -> String {
    let t: String = text.chars().take(300).collect();
    let more = if t.len() < text.len() { "…" } else { "" };
    format!("{}{more}", quoted(Path::new(&t)))
}

/// The text of the first `<tag>…</tag>` in `text`, XML entities decoded.
fn element(text: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = text.find(&open)? + open.len();
    let len = text[start..].find(&format!("</{tag}>"))?;
    let raw = &text[start..start + len];
    Some(
        quick_xml::escape::unescape(raw)
            .map(|c| c.into_owned())
            .unwrap_or_else(|_| raw.to_string()),
    )
}

impl Fault {
    /// Read a fault from any error text (object_store's, with the
    /// answer's body in it, or a body alone).
    pub fn parse(text: &str) -> Fault {
        let status = text
            .split("status code: ")
            .nth(1)
            .and_then(|r| r.get(..3))
            .and_then(|s| s.parse().ok());
        let code = element(text, "Code").filter(|c| {
            (1..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
        });
        let retry = text
            .rfind("[retry: ")
            .and_then(|i| text[i + 8..].split(']').next())
            .map(str::to_string);
        Fault {
            status,
            code,
            message: element(text, "Message").filter(|m| !m.trim().is_empty()),
            region: element(text, "Region"),
            retry,
        }
    }

    /// The server's own words, quoted: " (the server said: '…')".
    fn said(&self) -> String {
        match &self.message {
            Some(m) => format!(" (the server said: {})", shown(m)),
            None => String::new(),
        }
    }

    /// The kind and plain words for a known S3 code; `keys_from` says
    /// where the keys came from, `region` is the one used.
    pub fn words(&self, keys_from: &str, region: &str) -> Option<(ErrorKind, String)> {
        let said = self.said();
        let code = self.code.as_deref()?;
        let keys = format!("(keys from {keys_from})");
        Some(match code {
            "InvalidAccessKeyId" | "XAdminUserNotFound" | "InvalidClientTokenId" => (
                ErrorKind::PermissionDenied,
                format!("the server does not know this access key {keys}"),
            ),
            "SignatureDoesNotMatch" => (
                ErrorKind::PermissionDenied,
                format!("the secret key is wrong (the signature does not match) {keys}"),
            ),
            "AccessDenied" | "AllAccessDisabled" | "AccountProblem" => (
                ErrorKind::PermissionDenied,
                format!(
                    "access denied: the keys are valid, but the bucket's policy or the keys' \
                     permissions forbid this {keys}{said}"
                ),
            ),
            "ExpiredToken" | "TokenRefreshRequired" | "InvalidToken" => (
                ErrorKind::PermissionDenied,
                format!("the session token (AWS_SESSION_TOKEN) has expired or is invalid {keys}"),
            ),
            "RequestTimeTooSkewed" | "RequestExpired" => (
                ErrorKind::InvalidInput,
                "this machine's clock differs from the server's by more than 15 minutes, so \
                 the server refuses every signed request; set the clock (NTP) and try again \
                 (the keys are not at fault)"
                    .to_string(),
            ),
            "AuthorizationHeaderMalformed"
            | "IllegalLocationConstraintException"
            | "PermanentRedirect"
            | "IncorrectEndpoint" => {
                let want = match &self.region {
                    Some(r) => format!(
                        "; the server expects region {}: use --region or AWS_REGION",
                        shown(r)
                    ),
                    None => ": check --region, AWS_REGION and the endpoint".to_string(),
                };
                (
                    ErrorKind::InvalidInput,
                    format!("the bucket is not in region '{region}'{want}"),
                )
            }
            "SlowDown" | "ServiceUnavailable" | "Throttling" | "TooManyRequests" => (
                ErrorKind::Io,
                format!(
                    "the server kept asking to slow down ({code}){}",
                    self.retry_shown()
                ),
            ),
            "InternalError" => (
                ErrorKind::Io,
                format!(
                    "the server failed with an internal error{}{said}",
                    self.retry_shown()
                ),
            ),
            "NoSuchKey" => (
                ErrorKind::NotFound,
                "the remote has no such key".to_string(),
            ),
            "InvalidBucketName" => (
                ErrorKind::InvalidInput,
                format!("the server refuses the bucket's name{said}"),
            ),
            "NotImplemented" => (
                ErrorKind::NotSupported,
                format!("the server does not support this request{said}"),
            ),
            _ => return None,
        })
    }

    /// "; gave up after 3 tries in 2.0 s: …" when the retry loop said why.
    pub fn retry_shown(&self) -> String {
        match &self.retry {
            Some(r) => format!("; {r}"),
            None => String::new(),
        }
    }

    /// The server's answer, in short, for a message about an answer no
    /// rule above knows: "503 SlowDown: 'message'".
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(s) = self.status {
            parts.push(s.to_string());
        }
        if let Some(c) = &self.code {
            parts.push(c.clone());
        }
        if parts.is_empty() && self.message.is_none() {
            return None;
        }
        if self.code.is_none() {
            // No body (a HEAD): the status alone, in words.
            let words = match self.status {
                Some(500) => Some("an internal error of the server"),
                Some(502) => Some("bad gateway"),
                Some(503) => Some("service unavailable: the server is busy or asks to slow down"),
                Some(504) => Some("gateway timeout"),
                Some(429) => Some("too many requests: the server asks to slow down"),
                _ => None,
            };
            if let Some(w) = words {
                parts.push(format!("({w})"));
            }
        }
        let mut s = format!("the server answered {}", parts.join(" "));
        if let Some(m) = &self.message {
            s += &format!(": {}", shown(m));
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "Error performing GET http://h/b/k in 1s - Server returned non-2xx \
        status code: 403 Forbidden: <?xml version=\"1.0\"?><Error><Code>RequestTimeTooSkewed\
        </Code><Message>The difference &amp; more</Message></Error>";

    #[test]
    fn codes_and_messages_are_read() {
        let f = Fault::parse(BODY);
        assert_eq!(f.status, Some(403));
        assert_eq!(f.code.as_deref(), Some("RequestTimeTooSkewed"));
        assert_eq!(f.message.as_deref(), Some("The difference & more"));
        let (kind, words) = f.words("profile 'x'", "us-east-1").unwrap();
        assert_eq!(kind, ErrorKind::InvalidInput);
        assert!(
            words.contains("clock") && !words.contains("keys from"),
            "{words}"
        );
    }

    /// Every piece of hostile server text comes out without a control
    /// character, whatever rule shows it.
    #[test]
    fn hostile_server_text_is_quoted() {
        let hostile = [
            "\u{1b}[2J\u{1b}[H",
            "line\nbreak",
            "bell\u{7}",
            "\u{202e}reversed",
            "&#27;[31m",
            "tab\there",
            "\r\n",
        ];
        let codes = [
            "AccessDenied",
            "AuthorizationHeaderMalformed",
            "SlowDown",
            "InternalError",
            "Unknown\u{1b}Code",
            "Weird",
        ];
        for h in hostile {
            for code in codes {
                let xml = format!(
                    "status code: 400 x: <Error><Code>{code}</Code><Message>{h}</Message>\
                     <Region>{h}</Region></Error>\n[retry: gave up after 2 tries in 1.0 s]"
                );
                let f = Fault::parse(&xml);
                let text = f
                    .words("k", "r")
                    .map(|(_, w)| w)
                    .or_else(|| f.summary())
                    .unwrap();
                assert!(
                    !text.chars().any(|c| c.is_control() || c == '\u{202e}'),
                    "{code} {h:?}: {text:?}"
                );
            }
        }
    }
}
