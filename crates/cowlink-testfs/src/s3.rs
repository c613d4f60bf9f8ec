//! A real S3-compatible server for tests: versitygw (the Versity S3
//! Gateway, installed by `scripts/setup` with `go install`) serving a
//! temporary directory with its POSIX backend, on 127.0.0.1.
//!
//! Each object is a plain file below `data_dir()/BUCKET/`, so a test can
//! see what the server holds, alter an object behind the server's back,
//! or watch that nothing was rewritten. [`S3Server::kill`] and
//! [`S3Server::start_again`] stop and restart it on the same port and data.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The access key the test server accepts.
pub const ACCESS_KEY: &str = "cowlink-test";
/// The secret key the test server accepts.
pub const SECRET_KEY: &str = "cowlink-test-secret-key";
/// The bucket every test server starts with.
pub const BUCKET: &str = "cowlink-test";

/// A running versitygw, stopped when dropped.
#[derive(Debug)]
pub struct S3Server {
    bin: PathBuf,
    data: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    access: String,
    secret: String,
}

/// Where versitygw is: `$COWLINK_VERSITYGW`, `PATH`, `$GOPATH/bin`,
/// `~/go/bin`.
fn find_bin() -> Option<PathBuf> {
    crate::go_bin("COWLINK_VERSITYGW", "versitygw")
}

impl S3Server {
    /// Start a server with an empty bucket [`BUCKET`].
    ///
    /// # Panics
    /// When versitygw is not installed (the test fails, naming it: tests
    /// that need it are `#[ignore]`d and run by `scripts/test`), or does
    /// not come up.
    pub fn start(test: &str) -> S3Server {
        S3Server::start_keyed(test, ACCESS_KEY, SECRET_KEY)
    }

    /// [`start`](Self::start) with other keys (a secret with the
    /// characters profile files treat specially, say).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    pub fn start_keyed(test: &str, access: &str, secret: &str) -> S3Server {
        let Some(bin) = find_bin() else {
            panic!(
                "{test} needs versitygw, which is not installed: run scripts/setup \
                 (go install github.com/versity/versitygw/cmd/versitygw)"
            );
        };
        let data = tempfile::Builder::new()
            .prefix("cowlink-s3-")
            .tempdir()
            .expect("a temporary data directory");
        std::fs::create_dir(data.path().join(BUCKET)).expect("the bucket directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut s = S3Server {
            bin,
            data,
            port,
            child: None,
            access: access.to_string(),
            secret: secret.to_string(),
        };
        s.start_again();
        s
    }

    /// Start the server again (after [`kill`](Self::kill)) on the same
    /// port and data, and wait until it answers.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let child = Command::new(&self.bin)
            .args([
                "--access",
                &self.access,
                "--secret",
                &self.secret,
                "--quiet",
            ])
            .arg("--port")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("posix")
            .arg(self.data.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "versitygw did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kill the server (SIGKILL) and wait for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// The directory holding the bucket directories.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The file the server keeps `KEY` of [`BUCKET`] in.
    pub fn file(&self, key: &str) -> PathBuf {
        self.data.path().join(BUCKET).join(key)
    }

    /// The environment a client needs: keys, endpoint, region.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", self.access.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_REGION", "us-east-1".to_string()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}
