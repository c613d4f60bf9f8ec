//! Network faults from a real fault-injection proxy: Toxiproxy
//! (`toxiproxy-server`, installed by `scripts/setup`), started on
//! 127.0.0.1 in front of a test server. A test adds toxics (latency, a
//! bandwidth limit, resets, a stall) and removes them through its HTTP
//! API.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running toxiproxy-server with one proxy; stopped when dropped.
#[derive(Debug)]
pub struct Toxiproxy {
    child: Child,
    api: u16,
    listen: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Where toxiproxy-server is: `$COWLINK_TOXIPROXY`, `PATH`,
/// `$GOPATH/bin`, `~/go/bin`.
fn find_bin() -> Option<PathBuf> {
    crate::go_bin("COWLINK_TOXIPROXY", "toxiproxy-server")
}

/// One HTTP request to the API; the status and body.
fn call(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, out))
}

impl Toxiproxy {
    /// Start toxiproxy-server and a proxy from a free port of 127.0.0.1 to
    /// `upstream` (`127.0.0.1:PORT`).
    ///
    /// # Panics
    /// When toxiproxy-server is not installed (the test fails, naming it),
    /// or does not come up.
    pub fn start(test: &str, upstream: &str) -> Toxiproxy {
        let Some(bin) = find_bin() else {
            panic!("{test} needs toxiproxy-server, which is not installed: run scripts/setup");
        };
        let api = free_port();
        let child = Command::new(&bin)
            .args(["-host", "127.0.0.1", "-port", &api.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let listen = free_port();
        let t = Toxiproxy { child, api, listen };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let body = format!(
                "{{\"name\":\"s3\",\"listen\":\"127.0.0.1:{listen}\",\"upstream\":\"{upstream}\",\
                 \"enabled\":true}}"
            );
            match call(api, "POST", "/proxies", &body) {
                Ok((201, _)) => break,
                Ok((s, b)) => panic!("toxiproxy refused the proxy ({s}): {b}"),
                Err(_) => {
                    assert!(
                        Instant::now() < deadline,
                        "toxiproxy-server did not come up"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        t
    }

    /// The proxy's endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.listen)
    }

    /// Add the toxic `name` of `kind` (`latency`, `bandwidth`,
    /// `reset_peer`, `timeout`, `slicer`…) on the `downstream` (server to
    /// client) or `upstream` stream, with `attributes` as JSON
    /// (`{"latency":200}`).
    ///
    /// # Panics
    /// When toxiproxy refuses it.
    pub fn add(&self, name: &str, kind: &str, stream: &str, attributes: &str) {
        let body = format!(
            "{{\"name\":\"{name}\",\"type\":\"{kind}\",\"stream\":\"{stream}\",\"toxicity\":1.0,\
             \"attributes\":{attributes}}}"
        );
        let (s, b) = call(self.api, "POST", "/proxies/s3/toxics", &body).expect("toxiproxy's API");
        assert!(
            s == 200 || s == 201,
            "toxiproxy refused the toxic ({s}): {b}"
        );
    }

    /// Remove the toxic `name`.
    ///
    /// Only while no client was killed or cut off mid-transfer: a
    /// `bandwidth` toxic whose output nobody reads any more can hold the
    /// removal (and so this call) forever. A test that needs full speed
    /// after such a kill goes straight to the server instead.
    ///
    /// # Panics
    /// When toxiproxy refuses, or gives no answer within 10 s.
    pub fn remove(&self, name: &str) {
        let (s, b) = call(
            self.api,
            "DELETE",
            &format!("/proxies/s3/toxics/{name}"),
            "",
        )
        .expect("toxiproxy's API");
        assert!(s == 204 || s == 200, "toxiproxy kept the toxic ({s}): {b}");
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
