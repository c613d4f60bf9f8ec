//! The `cowlink` command: clap arguments in, library calls, output out.
//!
//! Exit codes: 0 everything done; 1 some operations failed (each reported
//! on stderr); 2 usage error or nothing could start; 130 interrupted
//! (Ctrl-C or SIGTERM), after cleaning up.

mod interrupt;
mod out;

mod bench;
mod cp;
mod dedupe;
mod drive;
mod du;
mod extents;
mod image;
mod probe;
mod progress;
mod remote;
mod store;

use std::process::ExitCode;

use crate::out::errln;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Copy-on-write file cloning for Linux.
///
/// On XFS, Btrfs, bcachefs, OpenZFS ≥ 2.2 and other copy-on-write
/// filesystems a clone takes constant time and no space: both names share
/// the same blocks until one is written. cowlink clones where it can, copies
/// where it must, and always says which it did.
#[derive(Parser, Debug)]
#[command(
    name = "cowlink",
    version,
    propagate_version = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    // Documented by CpArgs (short and long help with examples). As in GNU
    // cp, a long option may be abbreviated (`--rec`) and a repeated option
    // is allowed, the last one winning (`--reflink=auto --reflink=never`).
    #[command(infer_long_args = true, args_override_self = true)]
    Cp(cp::CpArgs),
    /// Tell whether paths can clone, and what their filesystems can do.
    Probe(probe::ProbeArgs),
    // Documented by ExtentsArgs, DuArgs, DedupeArgs, StoreArgs and
    // BenchArgs, ImageArgs and DriveArgs (long help with examples).
    Extents(extents::ExtentsArgs),
    Du(du::DuArgs),
    Dedupe(dedupe::DedupeArgs),
    Store(store::StoreArgs),
    Bench(bench::BenchArgs),
    Image(image::ImageArgs),
    Drive(drive::DriveArgs),
}

/// How the process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Everything done.
    Ok,
    /// Some operations failed.
    Failed,
    /// Usage error or fatal error.
    Fatal,
    /// Stopped by Ctrl-C (SIGINT) or SIGTERM after cleaning up.
    Interrupted,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(match e {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Fatal => 2,
            Exit::Interrupted => 130,
        })
    }
}

/// `cowlink cp` under the name `cp`: a binary invoked as `cp` (a symlink
/// or hardlink named so on PATH) is a drop-in for GNU cp.
#[derive(Parser, Debug)]
#[command(
    name = "cp",
    version,
    max_term_width = 100,
    infer_long_args = true,
    args_override_self = true
)]
struct AsCp {
    #[command(flatten)]
    cp: cp::CpArgs,
}

/// Whether the program was invoked under the name `cp`.
fn invoked_as_cp() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n == std::ffi::OsStr::new("cp"))
        })
        .unwrap_or(false)
}

fn main() -> ExitCode {
    out::closed_stdout_fails();
    let command = if invoked_as_cp() {
        out::set_prog("cp");
        let parsed = AsCp::command()
            .try_get_matches()
            .and_then(|m| AsCp::from_arg_matches(&m).map(|a| (a, m)));
        match parsed {
            Ok((mut a, m)) => {
                a.cp.note_order(&m);
                Command::Cp(a.cp)
            }
            // As GNU cp: a usage error exits 1 (help and version 0).
            Err(e) => {
                use std::io::Write as _;
                let printed = e.print().is_ok() && std::io::stdout().flush().is_ok();
                return ExitCode::from(if e.use_stderr() || !printed { 1 } else { 0 });
            }
        }
    } else {
        let m = Cli::command().get_matches();
        let mut command = Cli::from_arg_matches(&m)
            .unwrap_or_else(|e| e.exit())
            .command;
        if let (Command::Cp(args), Some(("cp", sub))) = (&mut command, m.subcommand()) {
            args.note_order(sub);
        }
        command
    };
    // Signals from here on go through one handler (see `interrupt`).
    let _ = interrupt::token();
    let result = match command {
        Command::Cp(args) => cp::run(args),
        Command::Probe(args) => probe::run(args),
        Command::Extents(args) => extents::run(args),
        Command::Du(args) => du::run(args),
        Command::Dedupe(args) => dedupe::run(args),
        Command::Store(args) => store::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Image(args) => image::run(args),
        Command::Drive(args) => drive::run(args),
    };
    match result {
        Ok(exit) => exit.into(),
        // Output cut short by the reader (`| head`): not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            Exit::Ok.into()
        }
        Err(e) => {
            errln!("{}: {e:#}", out::prog());
            // A path that does not exist is an operation that failed (1),
            // as with GNU cp and du; anything else that stops a command
            // before it could start is 2.
            let missing = e.chain().any(|c| {
                c.downcast_ref::<cowlink::Error>()
                    .is_some_and(|e| e.kind() == cowlink::ErrorKind::NotFound)
            });
            // GNU cp knows one failure status.
            if missing || out::prog() == "cp" {
                Exit::Failed
            } else {
                Exit::Fatal
            }
            .into()
        }
    }
}

/// Parses a path argument: any bytes but none (clap's own parser calls an
/// empty path "a value is required", as if none had been given).
#[derive(Clone, Copy, Debug)]
pub struct PathArg;

impl clap::builder::TypedValueParser for PathArg {
    type Value = std::path::PathBuf;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        if value.is_empty() {
            let name = arg.map(|a| a.to_string()).unwrap_or_else(|| "PATH".into());
            return Err(clap::Error::raw(
                clap::error::ErrorKind::InvalidValue,
                format!("an empty string given for {name} names no file\n"),
            ));
        }
        Ok(value.into())
    }
}

/// Parses `-j N`: a whole number of threads, at least 1 (leaving `-j` out
/// chooses the default).
pub fn threads_arg(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => {
            Err("0 threads cannot work; give 1 or more, or leave -j out for the default".into())
        }
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a number of threads")),
    }
}

/// `-j N` as used: at most [`cowlink::tree::MAX_THREADS`], saying so when
/// more were asked for (every subcommand with `-j` applies this rule).
pub fn capped_threads(n: usize) -> usize {
    let max = cowlink::tree::MAX_THREADS;
    if n > max {
        errln!(
            "{}: -j {n} is more threads than help; using {max}",
            out::prog()
        );
    }
    n.min(max)
}

/// Raise the soft limit on open files to the hard limit (deep trees hold
/// descriptors per level).
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

/// Parses a size: "4096", "4K", "1M", "20G", "20GiB", "1T" → bytes
/// (powers of 1024, as `truncate` and `qemu-img` count).
pub fn size_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| {
            t.strip_suffix('B')
                .filter(|r| r.ends_with(|c: char| c.is_ascii_alphabetic()))
        })
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix '{c}' (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size (examples: 4096, 4K, 1M, 20G)"))
}

/// Bytes for people: "0 B", "1023 B", "1.5 KiB", "16.0 MiB".
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A duration for people: "35 µs", "4.2 ms", "1.30 s".
pub fn human_duration(d: std::time::Duration) -> String {
    let us = d.as_micros();
    if us < 1000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(size_arg("20G"), Ok(20 << 30));
        assert_eq!(size_arg("20GiB"), Ok(20 << 30));
        assert_eq!(size_arg("512MB"), Ok(512 << 20));
        assert!(size_arg("1X").is_err() && size_arg("B").is_err());
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(16 << 20), "16.0 MiB");
        assert_eq!(
            human_duration(std::time::Duration::from_micros(35)),
            "35 µs"
        );
        assert_eq!(
            human_duration(std::time::Duration::from_micros(4200)),
            "4.2 ms"
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
