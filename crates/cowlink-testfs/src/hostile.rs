//! A misbehaving S3 endpoint for tests, on 127.0.0.1: the answers a real
//! server cannot be made to give (a `Content-Length` of a terabyte,
//! listings that never end, keys with escapes and newlines, error bodies
//! that try to write to the terminal, `503` with `Retry-After`, a body
//! that stalls or drips). It checks no signature: a test's [`Script`]
//! sees each request and says what to answer.
//!
//! Plain HTTP/1.1 on std threads (one per connection, keep-alive), no
//! dependencies; every request is logged ([`Hostile::log`]) with the
//! time it arrived, so a test can count requests and see the waits
//! between them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request as the endpoint read it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `PUT`, …
    pub method: String,
    /// The path, percent-decoded, without the query (`/bucket/key`).
    pub path: String,
    /// The query's pairs, percent-decoded.
    pub query: Vec<(String, String)>,
    /// The headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// When it arrived.
    pub at: Instant,
    /// The body of a POST (other bodies are read and dropped).
    pub body: Vec<u8>,
}

impl Request {
    /// The query value of `k`.
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    }

    /// The header `k` (lower-case).
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is a ListObjectsV2 request.
    pub fn is_list(&self) -> bool {
        self.method == "GET" && self.q("list-type") == Some("2")
    }
}

/// What the endpoint answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A whole answer; `Content-Length` is the body's unless `headers`
    /// give one (a lie, when a test wants one).
    Full {
        /// The status code.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// The status line and headers (with the true `Content-Length`), then
    /// the body `chunk` bytes at a time, one chunk per `every`.
    Drip {
        /// The status code.
        status: u16,
        /// The body.
        body: Vec<u8>,
        /// Bytes per chunk.
        chunk: usize,
        /// The wait between chunks.
        every: Duration,
    },
    /// The status line and headers announcing `len` bytes, the first
    /// `sent` bytes of `body`, then silence (the connection stays open
    /// until the endpoint stops).
    Stall {
        /// The body's length as announced.
        len: u64,
        /// The bytes sent before the stall.
        sent: Vec<u8>,
    },
    /// Read the request and never answer (the connection stays open
    /// until the endpoint stops).
    Silent,
    /// Close the connection without a word.
    Close,
}

impl Reply {
    /// `status` with an XML body.
    pub fn xml(status: u16, body: impl Into<String>) -> Reply {
        Reply::Full {
            status,
            headers: vec![("Content-Type".into(), "application/xml".into())],
            body: body.into().into_bytes(),
        }
    }

    /// An S3 error answer, the code and message put in as given (a
    /// hostile message is not escaped).
    pub fn s3_error(status: u16, code: &str, message: &str) -> Reply {
        Reply::xml(
            status,
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
                 <Message>{message}</Message><Region>eu-north-1</Region>\
                 <RequestId>1</RequestId></Error>"
            ),
        )
    }

    /// `200` with `body` (an object's bytes).
    pub fn bytes(body: impl Into<Vec<u8>>) -> Reply {
        Reply::Full {
            status: 200,
            headers: vec![(
                "Last-Modified".into(),
                "Wed, 01 Jan 2025 00:00:00 GMT".into(),
            )],
            body: body.into(),
        }
    }

    /// Add a header to a [`Reply::Full`].
    pub fn with_header(mut self, k: &str, v: &str) -> Reply {
        if let Reply::Full { headers, .. } = &mut self {
            headers.push((k.into(), v.into()));
        }
        self
    }
}

/// One ListObjectsV2 page: `keys` (name, size) as given (not escaped:
/// a test may send what it likes), truncated with `next` as the
/// continuation token when there is one.
pub fn list_page(keys: &[(&str, u64)], next: Option<&str>) -> Reply {
    let mut x = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult \
         xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>",
    );
    for (k, size) in keys {
        x += &format!(
            "<Contents><Key>{k}</Key><LastModified>2025-01-01T00:00:00.000Z</LastModified>\
             <Size>{size}</Size><ETag>\"e\"</ETag></Contents>"
        );
    }
    x += &format!("<KeyCount>{}</KeyCount>", keys.len());
    match next {
        Some(t) => {
            x += &format!(
                "<IsTruncated>true</IsTruncated><NextContinuationToken>{t}</NextContinuationToken>"
            )
        }
        None => x += "<IsTruncated>false</IsTruncated>",
    }
    x += "</ListBucketResult>";
    Reply::xml(200, x)
}

/// What a test answers to each request.
pub type Script = dyn Fn(&Request) -> Reply + Send + Sync;

/// The running endpoint; stopped when dropped.
pub struct Hostile {
    port: u16,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Hostile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hostile").field("port", &self.port).finish()
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(hex, 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status_text(s: u16) -> &'static str {
    match s {
        200 => "OK",
        204 => "No Content",
        206 => "Partial Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

impl Hostile {
    /// Start the endpoint on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// When no port can be bound.
    pub fn start(script: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port for the endpoint");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let (l, s) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (script, log, stop) = (script.clone(), l.clone(), s.clone());
                        std::thread::spawn(move || serve(conn, &*script, &log, &stop));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Hostile { port, log, stop }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The requests so far.
    pub fn log(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(conn: TcpStream, script: &Script, log: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    // Head and body go out in separate writes: without this, Nagle's
    // algorithm and the client's delayed ACK add 40 ms to every answer.
    let _ = conn.set_nodelay(true);
    let mut w = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut r = BufReader::new(conn);
    loop {
        // The request line (waiting while the client keeps the
        // connection idle).
        let mut line = String::new();
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match r.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => break,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            match r.read_line(&mut h) {
                Ok(0) => return,
                Ok(_) => {}
                Err(_) => continue,
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len.min(64 << 20)];
        let mut got = 0;
        while got < body.len() {
            match r.read(&mut body[got..]) {
                Ok(0) => return,
                Ok(n) => got += n,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
        let method_is_post = method == "POST";
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let query = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        let req = Request {
            method,
            path: decode(path),
            query,
            body: if method_is_post { body } else { Vec::new() },
            headers,
            at: Instant::now(),
        };
        log.lock().unwrap().push(req.clone());
        let head = |status: u16, len: u64, extra: &[(String, String)]| {
            let mut h = format!("HTTP/1.1 {status} {}\r\n", status_text(status));
            if !extra
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            {
                h += &format!("Content-Length: {len}\r\n");
            }
            for (k, v) in extra {
                h += &format!("{k}: {v}\r\n");
            }
            h + "\r\n"
        };
        match script(&req) {
            Reply::Full {
                status,
                headers,
                body,
            } => {
                let h = head(status, body.len() as u64, &headers);
                if w.write_all(h.as_bytes()).is_err() {
                    return;
                }
                if req.method != "HEAD" && w.write_all(&body).is_err() {
                    return;
                }
                // A lying Content-Length leaves the connection unusable.
                if headers
                    .iter()
                    .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                {
                    let _ = w.flush();
                    return;
                }
            }
            Reply::Drip {
                status,
                body,
                chunk,
                every,
            } => {
                let h = head(status, body.len() as u64, &[]);
                if w.write_all(h.as_bytes()).is_err() {
                    return;
                }
                for c in body.chunks(chunk.max(1)) {
                    std::thread::sleep(every);
                    if stop.load(Ordering::Relaxed) || w.write_all(c).is_err() {
                        return;
                    }
                }
            }
            Reply::Stall { len, sent } => {
                let h = head(200, len, &[]);
                let _ = w.write_all(h.as_bytes());
                let _ = w.write_all(&sent);
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
            Reply::Silent => {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
            Reply::Close => return,
        }
    }
}
