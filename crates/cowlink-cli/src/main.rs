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
mod docgen;
mod drive;
mod du;
mod extents;
mod image;
mod probe;
mod progress;
mod remote;
mod snapshot;
mod store;
mod sync;

use std::process::ExitCode;

use crate::out::errln;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Copy-on-write file cloning for Linux
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
    max_term_width = 100,
    after_help = ROOT_EXAMPLES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The first steps, shown under `cowlink --help` and in cowlink(1).
const ROOT_EXAMPLES: &str = "\
Examples:
  cowlink probe .                         # can this directory clone?
  cowlink cp -a --reflink=auto src/ dst/  # clone a tree, copy where it cannot
  cowlink du -s dst/                      # what the clones share and save
  cowlink dedupe --dry-run ~/src          # identical files that could share blocks
  cowlink completions bash > ~/.local/share/bash-completion/completions/cowlink

Each command has its own help (`cowlink cp --help`) and man page (`man cowlink-cp`).";

#[derive(Subcommand, Debug)]
enum Command {
    // Documented by CpArgs (short and long help with examples). As in GNU
    // cp, a long option may be abbreviated (`--rec`) and a repeated option
    // is allowed, the last one winning (`--reflink=auto --reflink=never`).
    #[command(infer_long_args = true, args_override_self = true)]
    Cp(cp::CpArgs),
    Probe(probe::ProbeArgs),
    // Documented by ProbeArgs, ExtentsArgs, DuArgs, DedupeArgs, StoreArgs,
    // BenchArgs, ImageArgs, SnapshotArgs, DriveArgs, CompletionsArgs and ManArgs (a
    // one-line summary, then long help with examples; the test
    // `tests::every_command_has_summary_and_examples` holds them to it).
    Extents(extents::ExtentsArgs),
    Du(du::DuArgs),
    Dedupe(dedupe::DedupeArgs),
    Store(store::StoreArgs),
    Sync(sync::SyncArgs),
    Bench(bench::BenchArgs),
    Image(image::ImageArgs),
    Snapshot(snapshot::SnapshotArgs),
    Drive(drive::DriveArgs),
    Completions(docgen::CompletionsArgs),
    Man(docgen::ManArgs),
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
    cowlink::run::keep_freed_heap();
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
        Command::Sync(args) => sync::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Image(args) => image::run(args),
        Command::Snapshot(args) => snapshot::run(args),
        Command::Drive(args) => drive::run(args),
        Command::Completions(args) => docgen::completions(args, Cli::command()),
        Command::Man(args) => docgen::man(args, Cli::command()),
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

    /// The words of a command line in an example, from `cowlink` to the end
    /// of the command (a comment, a pipe, a redirection or the `)` of a
    /// `$(…)`), quotes removed; None when the line runs no cowlink.
    fn example_words(line: &str) -> Option<Vec<String>> {
        let spaced = line.replace("$(", " ");
        let mut words = spaced.split_whitespace().skip_while(|w| *w != "cowlink");
        let first = words.next()?;
        let mut out = vec![first.to_string()];
        for w in words {
            if w.starts_with('#') || ["|", ">", ">>", "&&", "||", ";"].contains(&w) {
                break;
            }
            if let Some(w) = w.strip_suffix(')') {
                out.push(w.trim_matches('"').to_string());
                break;
            }
            out.push(w.trim_matches('"').to_string());
        }
        Some(out)
    }

    /// Every command and subcommand: a one-line summary in one style
    /// (sentence case, no trailing period, at most 90 characters), its own
    /// examples (an "Examples:" section in its long help or after-help with
    /// at least one line running that very command), and every example a
    /// command line the parser accepts. Walks the clap tree, so a command
    /// added, renamed or moved is checked without touching this test.
    #[test]
    fn every_command_has_summary_and_examples() {
        fn walk(cmd: &clap::Command, path: &[&str], problems: &mut Vec<String>) {
            let name = path.join(" ");
            match cmd.get_about().map(|a| a.to_string()) {
                None => problems.push(format!("`{name}`: no summary")),
                Some(a) => {
                    let mut bad = Vec::new();
                    if a.contains('\n') {
                        bad.push("more than one line");
                    }
                    if a.trim_end().ends_with(['.', ':', ';', ',']) {
                        bad.push("ends with punctuation");
                    }
                    if !a.chars().next().is_some_and(char::is_uppercase) {
                        bad.push("does not start with a capital letter");
                    }
                    if a.chars().count() > 90 {
                        bad.push("longer than 90 characters");
                    }
                    if a != a.trim() {
                        bad.push("has surrounding spaces");
                    }
                    for b in bad {
                        problems.push(format!("`{name}`: summary {b}: {a:?}"));
                    }
                }
            }
            let texts = [
                cmd.get_long_about(),
                cmd.get_after_long_help(),
                cmd.get_after_help(),
            ];
            let mut examples = Vec::new();
            for t in texts.into_iter().flatten() {
                let t = t.to_string();
                if let (_, Some(ex)) = docgen::split_examples(&t) {
                    examples.extend(ex.lines().map(str::to_string));
                }
            }
            if examples.is_empty() {
                problems.push(format!("`{name}`: no \"Examples:\" section"));
            }
            let mut runs_itself = false;
            for line in &examples {
                let Some(words) = example_words(line) else {
                    continue;
                };
                // The command's words in order, options between them
                // allowed (`cowlink store --remote URL push`).
                let mut rest = words.iter();
                if path.iter().all(|p| rest.any(|w| w == p)) {
                    runs_itself = true;
                }
                match Cli::command().try_get_matches_from(&words) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            clap::error::ErrorKind::DisplayHelp
                                | clap::error::ErrorKind::DisplayVersion
                        ) => {}
                    Err(e) => problems.push(format!(
                        "`{name}`: example {:?} does not parse: {}",
                        line.trim(),
                        e.render()
                    )),
                }
            }
            if !examples.is_empty() && !runs_itself {
                problems.push(format!("`{name}`: no example runs `{name}`"));
            }
            for sub in cmd.get_subcommands() {
                let mut p = path.to_vec();
                p.push(sub.get_name());
                walk(sub, &p, problems);
            }
        }
        let mut root = Cli::command().disable_help_subcommand(true);
        root.build();
        let mut problems = Vec::new();
        walk(&root, &["cowlink"], &mut problems);
        assert!(
            problems.is_empty(),
            "{} problems in the help:\n{}",
            problems.len(),
            problems.join("\n")
        );
    }

    #[test]
    fn example_words_cut_at_the_command() {
        assert_eq!(
            example_words("  M=$(cowlink store add-tree out)   # prints it").unwrap(),
            ["cowlink", "store", "add-tree", "out"]
        );
        assert_eq!(
            example_words("  sudo cowlink cp -a \"$PWD\" b | jq .x").unwrap(),
            ["cowlink", "cp", "-a", "$PWD", "b"]
        );
        assert_eq!(example_words("  export COWLINK_REMOTE=s3://b/p"), None);
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
