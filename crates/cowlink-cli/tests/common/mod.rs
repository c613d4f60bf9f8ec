//! Helpers shared by the binary's integration tests.
#![allow(dead_code)] // each test file uses its own subset

use std::process::{Command, Output};

/// The `cowlink` binary under test, as a command to add arguments to.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cowlink"))
}

/// Run `cowlink` with `args` and collect its output.
pub fn cowlink(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = bin();
    for a in args {
        c.arg(a.as_ref());
    }
    c.output().unwrap()
}

/// Output bytes as text, for messages and matching.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
