//! Output that never stops the work.
//!
//! stdout and stderr belong to the user: a reader that goes away
//! (`cowlink cp -r --json a b | head`) or a closed descriptor (`2>&-`) ends
//! our output to that stream, never the operation. Every print in the CLI
//! goes through [`outln!`], [`out!`], [`errln!`] or an [`Out`]; a failed
//! write is dropped (and the stream left alone from then on), the copy or
//! scan goes on, and the exit status is the operation's.

use std::io::{self, Write};

/// A writer that swallows write errors: after the first one it writes
/// nothing more and reports success, so `?` on output never aborts work.
pub struct Out<W: Write> {
    inner: W,
    closed: bool,
}

impl<W: Write> Out<W> {
    /// Wrap `inner`.
    pub fn new(inner: W) -> Self {
        Out {
            inner,
            closed: false,
        }
    }
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.closed && self.inner.write_all(buf).is_err() {
            self.closed = true;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.closed && self.inner.flush().is_err() {
            self.closed = true;
        }
        Ok(())
    }
}

/// Standard output, locked, with errors swallowed.
pub fn stdout() -> Out<io::StdoutLock<'static>> {
    Out::new(io::stdout().lock())
}

/// `v` as pretty JSON and a newline: how every `--json` report is
/// printed.
pub fn json(out: &mut impl Write, v: &impl serde::Serialize) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, v)?;
    writeln!(out)
}

/// `n` and its noun, singular for one: `count(1, "file", "files")` is
/// "1 file", `count(0, ...)` "0 files". Every summary line counts with it.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `println!` that never panics on a closed stdout.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// `print!` that never panics on a closed stdout.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($t)*);
    }};
}

/// `eprintln!` that never panics on a closed stderr.
macro_rules! errln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}

pub(crate) use {errln, out, outln};

static PROG: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// The name messages start with: `cowlink`, or `cp` when the binary was
/// invoked under that name (a drop-in for GNU cp; see [`set_prog`]).
pub fn prog() -> &'static str {
    PROG.get().copied().unwrap_or("cowlink")
}

/// Set the name messages start with (once, at startup).
pub fn set_prog(name: &'static str) {
    let _ = PROG.set(name);
}

/// Make writes to a stdout the shell closed (`cp -v a b >&-`) fail, as
/// they do for GNU cp, instead of vanishing.
///
/// Before `main`, the Rust runtime puts `/dev/null`, opened for reading
/// and writing, on any closed standard descriptor; writes to it would
/// then succeed. A `/dev/null` open read-write on fd 1 is taken as that
/// (a shell's `>/dev/null` opens it write-only; only `1<>/dev/null` looks
/// the same) and replaced by `/dev/null` opened read-only: fd 1 stays
/// taken, so nothing opened later lands on it, and writes fail with EBADF
/// like writes to a closed descriptor (which std's stdout swallows: see
/// [`stdout_closed`]).
pub fn closed_stdout_fails() {
    use rustix::fs::{fcntl_getfl, fstat, major, minor, open, FileType, Mode, OFlags};
    use std::os::fd::AsFd;
    let stdout = io::stdout();
    let fd = stdout.as_fd();
    let reopened = fcntl_getfl(fd).is_ok_and(|f| f & OFlags::RWMODE == OFlags::RDWR)
        && fstat(fd).is_ok_and(|st| {
            FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice
                && (major(st.st_rdev), minor(st.st_rdev)) == (1, 3)
        });
    if reopened {
        if let Ok(null) = open("/dev/null", OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
            let _ = rustix::stdio::dup2_stdout(&null);
        }
        STDOUT_CLOSED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Set when stdout was closed at start (see [`closed_stdout_fails`]).
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether stdout was closed when we started: std's stdout drops writes
/// that fail with EBADF, so a writer that must fail asks this.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(count(1, "file", "files"), "1 file");
        assert_eq!(count(0, "file", "files"), "0 files");
        assert_eq!(count(2, "directory", "directories"), "2 directories");
    }
}
