//! `cowlink cp`: clone files (and, with -r, directory trees) like cp.

use cowlink::name::quoted;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use cowlink::tree::{copy_tree, Action, SkipReason, Tally, TreeEvent, TreeOptions};
use cowlink::Run;
use cowlink::{
    clone_file, CloneOptions, Error, ErrorKind, Method, Outcome, Overwrite, Preserve, Reflink,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::out::{errln, out, outln};
use crate::{human_bytes, human_duration, Exit};

/// Clone files where the filesystem can share blocks, copy where it cannot.
///
/// `cowlink cp SRC DEST` clones SRC to the file DEST (or into DEST if it is
/// a directory); `cowlink cp SRC... DIR` clones each SRC into DIR. The copy
/// is atomic: DEST appears complete, with its metadata, or not at all.
///
/// Trees (-r, -a) are copied in parallel over open directories. -a keeps
/// modes, owners, nanosecond times, xattrs and ACLs, symlinks as symlinks,
/// hardlinks as hardlinks, FIFOs and device nodes. A failing entry is
/// reported and the copy goes on (exit 1 at the end). Ctrl-C stops
/// promptly: every file already present is complete, no temporary is left,
/// exit 130.
///
/// Examples:
///   cowlink cp -v big.img copy.img          # says "cloned" or "copied"
///   cowlink cp --reflink=always a b         # clone or fail, never copy
///   cowlink cp -a build/ staging/           # a tree, with all metadata
///   cowlink cp -a --dry-run build/ staging/ # what would be done
///   cowlink cp -a --json src/ dst/ | jq .summary
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CpArgs {
    /// When to share blocks: auto = clone, else the fastest correct copy;
    /// always = clone or fail (bare --reflink means this); never = always a
    /// physical copy
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        default_value = "auto",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "always"
    )]
    reflink: Reflink,

    /// Replace existing destination files (atomically; other hardlinks of a
    /// replaced file keep their content)
    #[arg(short = 'f', long, conflicts_with = "no_clobber")]
    force: bool,

    /// Skip existing destination files silently (default: report an error).
    /// Like GNU cp -n this keeps whatever exists, even a file an interrupted
    /// run left half written: use --resume to continue a copy
    #[arg(short = 'n', long)]
    no_clobber: bool,

    /// Continue an interrupted copy: keep each destination file that has
    /// its source's size and modification time (a finished copy), replace
    /// every other one atomically. Implies --preserve=timestamps, so every
    /// file this run finishes is recognised next time
    #[arg(long, conflicts_with_all = ["no_clobber", "force"])]
    resume: bool,

    /// Make every file complete-or-absent under its name even after a
    /// crash or kill -9 (an unnamed file linked into place per file; up to
    /// 2x slower per file on XFS). Without it, files in directories this
    /// run creates are written under their final names and removed on
    /// error or Ctrl-C
    #[arg(long)]
    atomic: bool,

    /// Same as --preserve=mode,ownership,timestamps
    #[arg(short = 'p')]
    preserve_default: bool,

    /// Preserve these attributes beyond the permission bits (which are always
    /// kept, less the umask): mode, ownership, timestamps, xattr, all
    #[arg(
        long,
        value_enum,
        value_name = "ATTR,...",
        value_delimiter = ',',
        num_args = 0..,
        require_equals = true,
        default_missing_value = "mode,ownership,timestamps"
    )]
    preserve: Vec<PreserveArg>,

    /// Copy directories recursively, in parallel (symbolic links inside are
    /// copied as links)
    #[arg(short = 'r', short_alias = 'R', long)]
    recursive: bool,

    /// Archive, like cp -a: -r with --preserve=all, hardlinks inside the
    /// tree kept as hardlinks
    #[arg(short = 'a', long)]
    archive: bool,

    /// Copy all SRC arguments into DIR
    #[arg(short = 't', long, value_name = "DIR", value_parser = crate::PathArg)]
    target_directory: Option<PathBuf>,

    /// Treat DEST as a file name, never as a directory to copy into
    #[arg(short = 'T', long, conflicts_with = "target_directory")]
    no_target_directory: bool,

    /// Follow symbolic links in SRC (copy what they point to)
    #[arg(short = 'L', long)]
    dereference: bool,

    /// Copy with N threads, at most 64 (default: chosen per destination
    /// filesystem: 1 when cloning into Btrfs, else one per core)
    #[arg(short = 'j', long, value_name = "N", value_parser = crate::threads_arg)]
    jobs: Option<usize>,

    /// Show a progress bar (default: only when stderr is a terminal)
    #[arg(long, overrides_with = "no_progress")]
    progress: bool,

    /// Never show a progress bar
    #[arg(long)]
    no_progress: bool,

    /// Print what would be done, change nothing
    #[arg(long)]
    dry_run: bool,

    /// Print one line per entry: cloned or copied, size and time
    #[arg(short, long)]
    verbose: bool,

    /// Print the outcome of every entry and a summary as JSON on stdout
    #[arg(long)]
    json: bool,

    /// SRC... DEST, or SRC... with -t DIR
    #[arg(required = true, value_name = "PATH", value_parser = crate::PathArg)]
    paths: Vec<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PreserveArg {
    Mode,
    Ownership,
    Timestamps,
    Xattr,
    All,
}

/// One entry of `--json` output. Paths that are not UTF-8 are written
/// with U+FFFD in place of the bytes JSON cannot hold, plus their exact
/// bytes in `src_bytes`/`dst_bytes` (see [`cowlink::name`]).
#[derive(Serialize, Debug)]
struct Record<'a> {
    #[serde(flatten, serialize_with = "cowlink::name::json::src")]
    src: &'a Path,
    #[serde(flatten, serialize_with = "cowlink::name::json::dst")]
    dst: &'a Path,
    /// ok, planned, skipped, failed
    status: &'static str,
    /// file, dir, symlink, hardlink, special
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<Method>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    micros: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Error>,
}

impl<'a> Record<'a> {
    fn new(src: &'a Path, dst: &'a Path, status: &'static str) -> Self {
        Record {
            src,
            dst,
            status,
            kind: None,
            method: None,
            bytes: None,
            micros: None,
            error: None,
        }
    }
}

/// The end-of-run totals (the `summary` of `--json`).
#[derive(Serialize, Debug, Default)]
struct Summary {
    files: u64,
    dirs: u64,
    symlinks: u64,
    hardlinks: u64,
    specials: u64,
    bytes: u64,
    cloned: u64,
    copied: u64,
    skipped: u64,
    failed: u64,
    elapsed_ms: u64,
    /// The same, exact, for the summary line (a sub-millisecond copy is
    /// not "0 µs").
    #[serde(skip)]
    elapsed: Duration,
    dry_run: bool,
    cancelled: bool,
}

/// Everything that prints: verbose lines, errors, JSON records, progress.
/// Called from worker threads, hence the lock on output. Counting is the
/// library's: tree copies count into `tally` themselves, and `copy_one`
/// counts what it does outside a tree.
struct Reporter {
    options: CloneOptions,
    verbose: bool,
    json: bool,
    recursive: bool,
    tally: Arc<Tally>,
    /// Whether a JSON record was written yet (for the commas).
    wrote_record: AtomicBool,
    out: Mutex<std::io::Stdout>,
    bar: Option<ProgressBar>,
}

impl Reporter {
    /// Print a line on stdout without tearing the progress bar (not with
    /// --json, which owns stdout).
    fn print(&self, line: &str) {
        if self.json {
            return;
        }
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let write = || {
            let mut o = out.lock();
            let _ = writeln!(o, "{line}");
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    fn eprint(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| errln!("{line}")),
            None => errln!("{line}"),
        }
    }

    fn record(&self, r: &Record<'_>) {
        if !self.json {
            return;
        }
        let text = serde_json::to_string(r).expect("records serialize");
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let first = !self.wrote_record.swap(true, Ordering::Relaxed);
        let mut o = out.lock();
        let _ = write!(o, "{}\n    {text}", if first { "" } else { "," });
    }

    /// An existing destination kept (`-n`, or `--resume` found it complete).
    fn skipped(&self, src: &Path, dst: &Path, reason: SkipReason) {
        if self.verbose {
            let why = match reason {
                SkipReason::Complete => "already complete",
                _ => "destination exists",
            };
            self.eprint(&format!(
                "{} -> {}: skipped, {why}",
                quoted(src),
                quoted(dst)
            ));
        }
        self.record(&Record::new(src, dst, "skipped"));
    }

    fn done(&self, src: &Path, dst: &Path, o: Outcome, elapsed: Option<Duration>) {
        if o.method == Method::Skipped {
            return self.skipped(src, dst, SkipReason::Exists);
        }
        if self.verbose {
            let took = elapsed
                .map(|d| format!(" in {}", human_duration(d)))
                .unwrap_or_default();
            self.print(&format!(
                "{} -> {}: {}, {}{took}",
                quoted(src),
                quoted(dst),
                o.method.describe(),
                human_bytes(o.bytes),
            ));
        }
        self.record(&Record {
            kind: Some("file"),
            method: Some(o.method),
            bytes: Some(o.bytes),
            micros: elapsed.map(|d| d.as_micros() as u64),
            ..Record::new(src, dst, "ok")
        });
    }

    /// Any other entry that went well (or, in a dry run, would be done).
    fn other(&self, src: &Path, dst: &Path, kind: &'static str, words: &str, planned: bool) {
        if self.verbose || planned {
            let prefix = if planned { "would copy " } else { "" };
            self.print(&format!(
                "{prefix}{} -> {}: {words}",
                quoted(src),
                quoted(dst)
            ));
        }
        self.record(&Record {
            kind: Some(kind),
            ..Record::new(src, dst, if planned { "planned" } else { "ok" })
        });
    }

    fn failed(&self, src: &Path, dst: &Path, e: &Error) {
        self.eprint(&format!("cowlink: {e}{}", self.hint(e)));
        self.record(&Record {
            error: Some(e.clone()),
            ..Record::new(src, dst, "failed")
        });
    }

    fn hint(&self, e: &Error) -> &'static str {
        match (self.options.reflink, e.kind()) {
            (Reflink::Always, ErrorKind::CrossDevice | ErrorKind::NotSupported) => {
                "; use --reflink=auto to copy"
            }
            (_, ErrorKind::IsDirectory)
                if e.src().is_some() && e.dst().is_some() && !self.recursive =>
            {
                "; use -r to copy directories"
            }
            _ => "",
        }
    }

    /// A tree event from a worker thread.
    fn tree_event(&self, ev: &TreeEvent<'_>, root: (&Path, &Path)) {
        match *ev {
            TreeEvent::File { src, dst, outcome } => self.done(src, dst, outcome, None),
            TreeEvent::Dir { src, dst } => self.other(src, dst, "dir", "directory", false),
            TreeEvent::Symlink { src, dst } => {
                self.other(src, dst, "symlink", "symbolic link", false)
            }
            TreeEvent::Hardlink { src, dst } => {
                self.other(src, dst, "hardlink", "hardlinked to an earlier copy", false)
            }
            TreeEvent::Special { src, dst, .. } => {
                self.other(src, dst, "special", "special file recreated", false)
            }
            TreeEvent::Planned {
                src,
                dst,
                ref action,
            } => {
                let (kind, words) = match action {
                    Action::Dir => ("dir", "directory".to_string()),
                    Action::File { bytes } => ("file", format!("file, {}", human_bytes(*bytes))),
                    Action::Symlink => ("symlink", "symbolic link".into()),
                    Action::Hardlink => ("hardlink", "hardlink".into()),
                    Action::Special { kind } => ("special", format!("special file ({kind:?})")),
                };
                self.other(src, dst, kind, &words, true);
            }
            TreeEvent::Skipped { src, dst, reason } => self.skipped(src, dst, reason),
            TreeEvent::Failed(e) => {
                self.failed(e.src().unwrap_or(root.0), e.dst().unwrap_or(root.1), e)
            }
            _ => {}
        }
    }

    fn summary(&self, elapsed: Duration, dry_run: bool, cancelled: bool) -> Summary {
        let t = self.tally.report();
        Summary {
            files: t.files,
            dirs: t.dirs,
            symlinks: t.symlinks,
            hardlinks: t.hardlinks,
            specials: t.specials,
            bytes: t.bytes,
            cloned: t.cloned,
            copied: t.copied,
            skipped: t.skipped,
            failed: t.errors,
            elapsed_ms: elapsed.as_millis() as u64,
            elapsed,
            dry_run,
            cancelled,
        }
    }

    /// The progress bar's message: counts, bytes, rate, method mix.
    fn progress_message(&self, elapsed: Duration) -> String {
        let t = self.tally.report();
        let rate = t.bytes as f64 / elapsed.as_secs_f64().max(0.001);
        format!(
            "{} files, {} dirs, {} ({}/s) · {} cloned, {} copied{}",
            t.files,
            t.dirs,
            human_bytes(t.bytes),
            human_bytes(rate as u64),
            t.cloned,
            t.copied,
            match t.errors {
                0 => String::new(),
                n => format!(" · {n} failed"),
            }
        )
    }
}

/// The one line printed at the end of a tree copy.
fn summary_line(s: &Summary) -> String {
    let verb = if s.dry_run { "would copy" } else { "copied" };
    let mut line = format!(
        "{verb} {} files, {} dirs, {} ({} cloned, {} copied)",
        s.files,
        s.dirs,
        human_bytes(s.bytes),
        s.cloned,
        s.copied
    );
    for (n, what) in [
        (s.symlinks, "symlinks"),
        (s.hardlinks, "hardlinks"),
        (s.specials, "special files"),
        (s.skipped, "skipped"),
        (s.failed, "failed"),
    ] {
        if n > 0 {
            line.push_str(&format!(", {n} {what}"));
        }
    }
    line.push_str(&format!(" in {}", human_duration(s.elapsed)));
    if s.cancelled {
        line.push_str(" — cancelled");
    }
    line
}

/// Run `cowlink cp`.
pub fn run(args: CpArgs) -> Result<Exit> {
    let mut preserve = if args.archive {
        Preserve::ALL
    } else {
        Preserve::NONE
    };
    if args.preserve_default {
        preserve = Preserve {
            xattrs: preserve.xattrs,
            ..Preserve::P
        };
    }
    if args.resume {
        preserve.timestamps = true;
    }
    for p in &args.preserve {
        match p {
            PreserveArg::Mode => preserve.mode = true,
            PreserveArg::Ownership => preserve.ownership = true,
            PreserveArg::Timestamps => preserve.timestamps = true,
            PreserveArg::Xattr => preserve.xattrs = true,
            PreserveArg::All => preserve = Preserve::ALL,
        }
    }
    let options = CloneOptions {
        reflink: args.reflink,
        overwrite: if args.force {
            Overwrite::Replace
        } else if args.no_clobber {
            Overwrite::Skip
        } else {
            Overwrite::Refuse
        },
        preserve,
    };
    let recursive = args.recursive || args.archive;
    let jobs = plan(&args, &|p| std::fs::metadata(p).ok().map(|m| m.is_dir()))?;
    // 0: the library's default.
    let threads = args.jobs.map_or(0, crate::capped_threads);
    let cancel = crate::interrupt::token();
    // Deep trees hold two descriptors per level; raise the soft limit.
    crate::raise_fd_limit();

    // A bar on a terminal; with --progress elsewhere (logs, CI), a plain
    // line every second instead.
    let terminal = std::io::stderr().is_terminal();
    let show_progress =
        !args.no_progress && !args.dry_run && recursive && (args.progress || terminal);
    let bar = (show_progress && terminal).then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}").expect("valid template"),
        );
        bar
    });
    let reporter = Reporter {
        options,
        verbose: args.verbose,
        json: args.json,
        recursive,
        tally: Arc::new(Tally::default()),
        wrote_record: AtomicBool::new(false),
        out: Mutex::new(std::io::stdout()),
        bar,
    };
    if args.json {
        out!("{{\n  \"results\": [");
    }
    let tree = TreeOptions {
        file: options,
        hardlinks: args.archive,
        dereference: args.dereference,
        atomic: args.atomic,
        resume: args.resume,
        dry_run: args.dry_run,
        run: Run::default()
            .with_threads(threads)
            .with_cancel(cancel.clone()),
        tally: Some(Arc::clone(&reporter.tally)),
    };
    let start = Instant::now();
    let finished = AtomicBool::new(false);
    let mut any_tree = false;
    std::thread::scope(|s| {
        let ticker = show_progress.then(|| {
            let (reporter, finished) = (&reporter, &finished);
            s.spawn(move || {
                let mut last_line = Instant::now();
                while !finished.load(Ordering::Relaxed) {
                    let message = reporter.progress_message(start.elapsed());
                    match &reporter.bar {
                        Some(bar) => {
                            bar.set_message(message);
                            bar.tick();
                        }
                        None if last_line.elapsed() >= Duration::from_secs(1) => {
                            errln!("cowlink: {message}");
                            last_line = Instant::now();
                        }
                        None => {}
                    }
                    std::thread::park_timeout(Duration::from_millis(100));
                }
            })
        });
        for (src, dst) in &jobs {
            if cancel.is_cancelled() {
                break;
            }
            any_tree |= copy_one(&reporter, &tree, src, dst);
        }
        finished.store(true, Ordering::Relaxed);
        if let Some(t) = ticker {
            t.thread().unpark();
        }
    });
    if let Some(bar) = &reporter.bar {
        bar.finish_and_clear();
    }
    let summary = reporter.summary(start.elapsed(), args.dry_run, cancel.is_cancelled());
    if args.json {
        outln!(
            "\n  ],\n  \"summary\": {}\n}}",
            serde_json::to_string(&summary)?
        );
    } else if any_tree && (args.verbose || args.dry_run || show_progress) {
        errln!("{}", summary_line(&summary));
    }
    Ok(if summary.cancelled {
        errln!(
            "cowlink: interrupted; entries already copied are complete, nothing partial was left"
        );
        Exit::Interrupted
    } else if summary.failed > 0 {
        Exit::Failed
    } else {
        Exit::Ok
    })
}

/// What `plan` needs to know of a path: `None` when it does not exist,
/// else whether it is a directory (following symbolic links).
type IsDir<'a> = &'a dyn Fn(&Path) -> Option<bool>;

/// Resolve the command line into (source, destination file) pairs, with
/// cp's rules: a destination that is a directory receives the sources.
/// Pure but for `is_dir`, so the rules are unit-tested without files.
fn plan(args: &CpArgs, is_dir: IsDir<'_>) -> Result<Vec<(PathBuf, PathBuf)>> {
    let (sources, target): (&[PathBuf], Option<&Path>) = match &args.target_directory {
        Some(dir) => (&args.paths, Some(dir)),
        None => {
            if args.paths.len() < 2 {
                bail!(
                    "missing destination file operand after {}\nUsage: cowlink cp [OPTIONS] SRC... DEST (see --help)",
                    quoted(&args.paths[0])
                );
            }
            let (last, rest) = args.paths.split_last().expect("two or more paths");
            if args.no_target_directory {
                if rest.len() > 1 {
                    bail!(
                        "with -T there must be exactly one source (got {})",
                        rest.len()
                    );
                }
                return Ok(vec![(rest[0].clone(), last.clone())]);
            }
            if rest.len() == 1 && is_dir(last) != Some(true) {
                if last.as_os_str().to_string_lossy().ends_with('/') {
                    bail!("target {} is not a directory", quoted(last));
                }
                return Ok(vec![(rest[0].clone(), last.clone())]);
            }
            (rest, Some(last.as_path()))
        }
    };
    let dir = target.expect("target set above");
    match is_dir(dir) {
        Some(true) => {}
        exists => bail!(
            "target {} is not a directory{}",
            quoted(dir),
            if exists.is_some() {
                ""
            } else {
                " (it does not exist)"
            }
        ),
    }
    sources
        .iter()
        .map(|src| {
            let name = src.file_name().ok_or_else(|| {
                anyhow::anyhow!("cannot copy {}: it has no file name", quoted(src))
            })?;
            Ok((src.clone(), dir.join(name)))
        })
        .collect()
}

/// Copy one command-line source; returns whether it was a tree copy.
fn copy_one(r: &Reporter, tree: &TreeOptions, src: &Path, dst: &Path) -> bool {
    let meta = if tree.dereference {
        std::fs::metadata(src)
    } else {
        std::fs::symlink_metadata(src)
    };
    let ft = meta.map(|m| m.file_type()).ok();
    let is_dir = ft.is_some_and(|t| t.is_dir()) || (!r.recursive && src.is_dir());
    let is_file_like = ft.is_none_or(|t| t.is_file()) || !r.recursive;
    if is_dir && !r.recursive {
        let e = Error::new(cowlink::Operation::Clone, ErrorKind::IsDirectory)
            .with_src(src)
            .with_dst(dst)
            .with_reason("source is a directory (omitted)");
        r.tally.failed();
        r.failed(src, dst, &e);
        return false;
    }
    if !is_dir && is_file_like && !tree.dry_run {
        let t = Instant::now();
        let mut options = r.options;
        if tree.resume {
            if cowlink::is_complete_copy(src, dst) {
                r.tally.skipped();
                r.skipped(src, dst, SkipReason::Complete);
                return false;
            }
            options.overwrite = Overwrite::Replace;
        }
        match clone_file(src, dst, &options) {
            Ok(o) => {
                r.tally.file(&o);
                r.done(src, dst, o, Some(t.elapsed()));
            }
            Err(e) => {
                r.tally.failed();
                r.failed(src, dst, &e);
            }
        }
        return false;
    }
    // A directory, or with -r a symlink, FIFO or device, or a dry run.
    let observer = |ev: &TreeEvent<'_>| r.tree_event(ev, (src, dst));
    let result = crate::interrupt::graceful(|| copy_tree(src, dst, tree, &observer));
    if let Err(e) = result {
        // Nothing could start: not counted by the tree.
        r.tally.failed();
        r.failed(src, dst, &e);
    }
    is_dir
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        cp: CpArgs,
    }

    /// `plan` over a made-up tree: `d/` and `e/` are directories, `f`
    /// a file, everything else missing.
    fn plan_of(line: &str) -> Result<Vec<(String, String)>> {
        let args = Cmd::try_parse_from(std::iter::once("cp").chain(line.split(' ')))?.cp;
        let is_dir = |p: &Path| match p.to_str().unwrap().trim_end_matches('/') {
            "d" | "e" => Some(true),
            "f" => Some(false),
            _ => None,
        };
        Ok(plan(&args, &is_dir)?
            .into_iter()
            .map(|(s, d)| (s.display().to_string(), d.display().to_string()))
            .collect())
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn one_source_to_a_new_name_or_into_a_directory() {
        assert_eq!(plan_of("a b").unwrap(), pairs(&[("a", "b")]));
        assert_eq!(plan_of("a f").unwrap(), pairs(&[("a", "f")]));
        assert_eq!(plan_of("x/a d").unwrap(), pairs(&[("x/a", "d/a")]));
    }

    #[test]
    fn several_sources_need_a_directory() {
        assert_eq!(
            plan_of("a b d").unwrap(),
            pairs(&[("a", "d/a"), ("b", "d/b")])
        );
        let e = plan_of("a b f").unwrap_err().to_string();
        assert_eq!(e, "target 'f' is not a directory");
        let e = plan_of("a b nothere").unwrap_err().to_string();
        assert_eq!(e, "target 'nothere' is not a directory (it does not exist)");
    }

    #[test]
    fn a_trailing_slash_promises_a_directory() {
        let e = plan_of("a new/").unwrap_err().to_string();
        assert_eq!(e, "target 'new/' is not a directory");
        assert_eq!(plan_of("a d/").unwrap(), pairs(&[("a", "d/a")]));
    }

    #[test]
    fn t_names_the_directory_and_capital_t_the_file() {
        assert_eq!(
            plan_of("-t e a b").unwrap(),
            pairs(&[("a", "e/a"), ("b", "e/b")])
        );
        // -T: the destination is the name itself, even an existing directory.
        assert_eq!(plan_of("-T a d").unwrap(), pairs(&[("a", "d")]));
        let e = plan_of("-T a b d").unwrap_err().to_string();
        assert_eq!(e, "with -T there must be exactly one source (got 2)");
    }

    #[test]
    fn a_missing_destination_or_a_nameless_source_is_refused() {
        let e = plan_of("a").unwrap_err().to_string();
        assert!(
            e.starts_with("missing destination file operand after 'a'"),
            "{e}"
        );
        let e = plan_of("/ d").unwrap_err().to_string();
        assert_eq!(e, "cannot copy '/': it has no file name");
    }
}
