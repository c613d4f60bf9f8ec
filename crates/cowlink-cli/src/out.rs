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
