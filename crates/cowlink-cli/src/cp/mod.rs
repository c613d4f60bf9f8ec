//! `cowlink cp`: clone files (and, with -r, directory trees) like cp.
//!
//! This file reads the options and reports; `gnu.rs` holds GNU cp's rules
//! for each command-line operand.

use cowlink::name::quoted;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use cowlink::cp::{Backup, CpEvent, CpOptions, Deref, Sparse, Target, Update};
use cowlink::run::Progress;
use cowlink::tree::{Action, LinkKind, SkipReason, TreeEvent};
use cowlink::Run;
use cowlink::{CloneOptions, Error, ErrorKind, LinkMode, Method, Outcome, Preserve};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::out::{errln, out, outln, prog};
use crate::{human_bytes, human_duration, Exit};

/// GNU's `--reflink=always|auto|never`, onto the library's one
/// [`LinkMode`] (always: clone, auto: auto, never: copy).
fn reflink_arg() -> impl clap::builder::TypedValueParser<Value = LinkMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["auto", "always", "never"])
        .map(|w: String| LinkMode::from_reflink(&w).expect("one of the possible values"))
}

/// Clone files where the filesystem can share blocks, copy where it cannot
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
        value_parser = reflink_arg(),
        value_name = "WHEN",
        default_value = "auto",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "always"
    )]
    reflink: LinkMode,

    /// Existing destination files are replaced by default, atomically
    /// (other hardlinks of a replaced file keep their content) and keeping
    /// their permission bits unless -p. -f also replaces what cannot be
    /// opened (a symlink loop) and names taken by -l/-s links
    #[arg(short = 'f', long)]
    force: bool,

    /// Keep existing destination files (same as --update=none). Like GNU
    /// cp -n this keeps whatever exists, even a file an interrupted run
    /// left half written: use --resume to continue a copy
    #[arg(short = 'n', long, overrides_with = "interactive")]
    no_clobber: bool,

    /// Ask before replacing an existing destination (answer y to replace)
    #[arg(short = 'i', long, overrides_with = "no_clobber")]
    interactive: bool,

    /// Which existing destinations to replace: all (default), none,
    /// none-fail (fail for each), older (only when older than the source;
    /// bare --update and -u mean this)
    #[arg(
        long,
        value_enum,
        value_name = "WHICH",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "older"
    )]
    update: Option<UpdateArg>,

    /// Same as --update=older
    #[arg(short = 'u')]
    update_older: bool,

    /// Remove each existing destination file before copying (it gets the
    /// source's mode, not the old file's)
    #[arg(long)]
    remove_destination: bool,

    /// Back up each existing destination file first; CONTROL: numbered
    /// (t), existing (nil, the default), simple (never), none (off).
    /// Default from VERSION_CONTROL
    #[arg(
        long,
        value_name = "CONTROL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = ""
    )]
    backup: Option<String>,

    /// Like --backup, without an argument
    #[arg(short = 'b')]
    backup_default: bool,

    /// Backup suffix instead of ~ (or SIMPLE_BACKUP_SUFFIX); implies backups
    #[arg(short = 'S', long, value_name = "SUFFIX")]
    suffix: Option<OsString>,

    /// Make hardlinks to the source files instead of copies
    #[arg(short = 'l', long, overrides_with = "symbolic_link")]
    link: bool,

    /// Make symbolic links to the source files instead of copies
    #[arg(short = 's', long, overrides_with = "link")]
    symbolic_link: bool,

    /// Copy only attributes, no data
    #[arg(long)]
    attributes_only: bool,

    /// With -r, read FIFOs and devices met in the tree as data into regular
    /// files (a FIFO waits for a writer) instead of recreating them
    #[arg(long)]
    copy_contents: bool,

    /// Holes in copies: auto (keep the source's holes, the default), always
    /// (also leave zero blocks as holes), never (fill holes; as GNU cp, this
    /// makes --reflink=auto copy). A clone shares the source's layout
    #[arg(long, value_enum, value_name = "WHEN")]
    sparse: Option<SparseArg>,

    /// Name each destination by the full source path under DIR
    /// (cp --parents a/b/f DIR makes DIR/a/b/f)
    #[arg(long)]
    parents: bool,

    /// Remove trailing slashes from each source
    #[arg(long)]
    strip_trailing_slashes: bool,

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
    /// kept, less the umask): mode, ownership, timestamps, links, xattr, all
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

    /// Do not preserve these attributes
    #[arg(
        long,
        value_enum,
        value_name = "ATTR,...",
        value_delimiter = ',',
        require_equals = true
    )]
    no_preserve: Vec<PreserveArg>,

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

    /// Follow symbolic links in SRC (copy what they point to); the default
    /// without -r
    #[arg(short = 'L', long, overrides_with_all = ["no_dereference", "deref_args"])]
    dereference: bool,

    /// Never follow symbolic links in SRC; the default with -r and -a
    #[arg(short = 'P', long, overrides_with_all = ["dereference", "deref_args"])]
    no_dereference: bool,

    /// Follow symbolic links named on the command line only
    #[arg(short = 'H', overrides_with_all = ["dereference", "no_dereference"])]
    deref_args: bool,

    /// Same as --no-dereference --preserve=links
    #[arg(short = 'd')]
    no_deref_preserve_links: bool,

    /// Copy with N threads, at most 64 (default: chosen per destination
    /// filesystem: when cloning into Btrfs, 1 or one per core, whichever
    /// measures faster while copying; else one per core)
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

    /// Where -a, -p, -d, --preserve and --no-preserve stood on the command
    /// line (see [`CpArgs::note_order`]); empty: in that fixed order.
    #[arg(skip)]
    attr_order: Vec<(usize, AttrStep)>,
}

/// One option that chooses attributes to preserve. GNU applies them left
/// to right, so `--no-preserve=mode --preserve=all` keeps the mode and
/// `-a --no-preserve=mode` does not.
#[derive(Clone, Copy, Debug)]
enum AttrStep {
    Archive,
    P,
    D,
    Set(PreserveArg, bool),
}

/// The attributes a copy keeps, after every option that chooses them.
struct Attrs {
    preserve: Preserve,
    links: bool,
    /// `--no-preserve=mode` given last (new files get the default mode).
    no_mode: bool,
}

impl CpArgs {
    /// Record where the attribute options stood in `m` (the matches these
    /// arguments were parsed from), so that they apply in that order.
    pub fn note_order(&mut self, m: &clap::ArgMatches) {
        let at =
            |id: &str| -> Vec<usize> { m.indices_of(id).map(|i| i.collect()).unwrap_or_default() };
        let mut steps = Vec::new();
        // A flag not given still has an index (its default's): skip those.
        for (id, given, step) in [
            ("archive", self.archive, AttrStep::Archive),
            ("preserve_default", self.preserve_default, AttrStep::P),
            (
                "no_deref_preserve_links",
                self.no_deref_preserve_links,
                AttrStep::D,
            ),
        ] {
            if given {
                steps.extend(at(id).into_iter().map(|i| (i, step)));
            }
        }
        for (id, values, on) in [
            ("preserve", &self.preserve, true),
            ("no_preserve", &self.no_preserve, false),
        ] {
            let idx = at(id);
            for (k, p) in values.iter().enumerate() {
                // A bare --preserve's implied values share its index.
                let i = idx.get(k).or(idx.last()).copied().unwrap_or(0);
                steps.push((i, AttrStep::Set(*p, on)));
            }
        }
        steps.sort_by_key(|s| s.0);
        self.attr_order = steps;
    }

    /// The attributes to keep, applying the options in command-line order.
    fn attrs(&self) -> Attrs {
        let steps: Vec<AttrStep> = if self.attr_order.is_empty() {
            let flags = [
                (self.archive, AttrStep::Archive),
                (self.preserve_default, AttrStep::P),
                (self.no_deref_preserve_links, AttrStep::D),
            ];
            flags
                .into_iter()
                .filter_map(|(on, step)| on.then_some(step))
                .chain(self.preserve.iter().map(|p| AttrStep::Set(*p, true)))
                .chain(self.no_preserve.iter().map(|p| AttrStep::Set(*p, false)))
                .collect()
        } else {
            self.attr_order.iter().map(|s| s.1).collect()
        };
        let mut a = Attrs {
            preserve: Preserve::NONE,
            links: false,
            no_mode: false,
        };
        for step in steps {
            match step {
                AttrStep::Archive => {
                    a.preserve = Preserve::ALL;
                    a.links = true;
                }
                AttrStep::P => {
                    a.preserve = Preserve {
                        xattrs: a.preserve.xattrs,
                        ..Preserve::P
                    }
                }
                AttrStep::D => a.links = true,
                AttrStep::Set(p, on) => match p {
                    PreserveArg::Mode => {
                        a.preserve.mode = on;
                        a.no_mode = !on;
                    }
                    PreserveArg::Ownership => a.preserve.ownership = on,
                    PreserveArg::Timestamps => a.preserve.timestamps = on,
                    PreserveArg::Links => a.links = on,
                    PreserveArg::Xattr => a.preserve.xattrs = on,
                    PreserveArg::All => {
                        a.preserve = if on { Preserve::ALL } else { Preserve::NONE };
                        a.links = on;
                        a.no_mode = !on;
                    }
                },
            }
        }
        if self.resume {
            a.preserve.timestamps = true;
        }
        a
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PreserveArg {
    Mode,
    Ownership,
    Timestamps,
    #[value(alias = "link")]
    Links,
    Xattr,
    All,
}

/// `--update[=WHICH]` (`-u` is `older`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum UpdateArg {
    /// Replace every existing destination (the default).
    All,
    /// Replace none, silently (as `-n`).
    None,
    /// Replace none, and fail for each.
    NoneFail,
    /// Replace a destination only if it is older than its source.
    Older,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SparseArg {
    Auto,
    Always,
    Never,
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
    /// `-v` lines in GNU's form, `'a' -> 'b'` (when invoked as `cp`).
    gnu_verbose: bool,
    /// An operand's destination directory that existed before: GNU names
    /// no line for it.
    quiet_dir: Mutex<Option<PathBuf>>,
    json: bool,
    recursive: bool,
    tally: Arc<Progress>,
    /// Whether a JSON record was written yet (for the commas).
    wrote_record: AtomicBool,
    /// Whether writing a line to stdout failed (the work goes on).
    stdout_failed: AtomicBool,
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
            if crate::out::stdout_closed()
                || writeln!(o, "{line}").and_then(|()| o.flush()).is_err()
            {
                self.stdout_failed.store(true, Ordering::Relaxed);
            }
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
                SkipReason::Declined => "not replaced (answered no)",
                SkipReason::NotOlder => "destination is not older",
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

    fn done(
        &self,
        src: &Path,
        dst: &Path,
        o: Outcome,
        elapsed: Option<Duration>,
        backup: Option<&Path>,
    ) {
        if o.method == Method::Skipped {
            return self.skipped(src, dst, SkipReason::Exists);
        }
        if self.verbose && self.gnu_verbose {
            let backup = backup
                .filter(|b| !b.as_os_str().is_empty())
                .map(|b| format!(" (backup: {})", quoted(b)))
                .unwrap_or_default();
            self.print(&format!("{} -> {}{backup}", quoted(src), quoted(dst)));
        } else if self.verbose {
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
        let quiet = || {
            kind == "dir"
                && self
                    .quiet_dir
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_deref()
                    == Some(dst)
        };
        if self.verbose && self.gnu_verbose && !planned {
            if !quiet() {
                self.print(&format!("{} -> {}", quoted(src), quoted(dst)));
            }
        } else if self.verbose || planned {
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
        self.eprint(&format!("{}: {e}{}", prog(), self.hint(e)));
        self.record(&Record {
            error: Some(e.clone()),
            ..Record::new(src, dst, "failed")
        });
    }

    fn hint(&self, e: &Error) -> &'static str {
        match (self.options.link, e.kind()) {
            (LinkMode::Clone, ErrorKind::CrossDevice | ErrorKind::NotSupported) => {
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
            TreeEvent::File { src, dst, outcome } => self.done(src, dst, outcome, None, None),
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

    /// An event of the library's cp.
    fn cp_event(&self, ev: &CpEvent<'_>) {
        match *ev {
            CpEvent::Tree { src, dst, event } => self.tree_event(event, (src, dst)),
            CpEvent::TreeStart { dst, dir_existed } => {
                if dir_existed {
                    *self.quiet_dir.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(dst.to_path_buf());
                }
                crate::interrupt::set_graceful(true);
            }
            CpEvent::TreeEnd => crate::interrupt::set_graceful(false),
            CpEvent::Copied {
                src,
                dst,
                outcome,
                elapsed,
                backup,
            } => self.done(src, dst, outcome, Some(elapsed), backup),
            CpEvent::Skipped { src, dst, reason } => self.skipped(src, dst, reason),
            CpEvent::Failed {
                src,
                dst,
                error,
                message: Some(message),
            } => {
                self.eprint(&format!("{}: {message}", prog()));
                self.record(&Record {
                    error: Some(error.clone()),
                    ..Record::new(src, dst, "failed")
                });
            }
            CpEvent::Failed {
                src, dst, error, ..
            } => self.failed(src, dst, error),
            CpEvent::Warning(w) => self.eprint(&format!("{}: {w}", prog())),
            _ => {}
        }
    }

    fn summary(&self, elapsed: Duration, dry_run: bool, cancelled: bool) -> Summary {
        let t = self.tally.totals();
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
        let t = self.tally.totals();
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
        "{verb} {}, {}, {} ({} cloned, {} copied)",
        crate::out::count(s.files, "file", "files"),
        crate::out::count(s.dirs, "dir", "dirs"),
        human_bytes(s.bytes),
        s.cloned,
        s.copied
    );
    for (n, one, many) in [
        (s.symlinks, "symlink", "symlinks"),
        (s.hardlinks, "hardlink", "hardlinks"),
        (s.specials, "special file", "special files"),
        (s.skipped, "skipped", "skipped"),
        (s.failed, "failed", "failed"),
    ] {
        if n > 0 {
            line.push_str(&format!(", {}", crate::out::count(n, one, many)));
        }
    }
    line.push_str(&format!(" in {}", human_duration(s.elapsed)));
    if s.cancelled {
        line.push_str(" — cancelled");
    }
    line
}

/// The library's configuration for these arguments (GNU's defaults and
/// environment: VERSION_CONTROL, SIMPLE_BACKUP_SUFFIX, POSIXLY_CORRECT).
fn options(args: &CpArgs) -> Result<CpOptions> {
    let Attrs {
        preserve,
        links,
        no_mode,
    } = args.attrs();
    let recursive = args.recursive || args.archive;
    let link = if args.link {
        Some(LinkKind::Hard)
    } else if args.symbolic_link {
        Some(LinkKind::Symbolic)
    } else {
        None
    };
    let deref = if args.dereference {
        Deref::Always
    } else if args.deref_args {
        Deref::CommandLine
    } else if args.no_dereference
        || args.no_deref_preserve_links
        || args.archive
        || (recursive && link != Some(LinkKind::Hard))
    {
        Deref::Never
    } else {
        Deref::Always
    };
    let update = if args.no_clobber {
        Update::None
    } else if args.update_older {
        Update::Older
    } else {
        match args.update {
            None | Some(UpdateArg::All) => Update::All,
            Some(UpdateArg::None) => Update::None,
            Some(UpdateArg::NoneFail) => Update::NoneFail,
            Some(UpdateArg::Older) => Update::Older,
        }
    };
    let backup = match (&args.backup, args.backup_default || args.suffix.is_some()) {
        (None, false) => None,
        (word, _) => {
            let word = match word.as_deref() {
                Some(w) if !w.is_empty() => w.to_string(),
                _ => std::env::var("VERSION_CONTROL").unwrap_or_default(),
            };
            if word.is_empty() {
                Some(Backup::Existing)
            } else {
                Backup::parse(&word).map_err(|e| anyhow::Error::msg(e.reason()))?
            }
        }
    };
    if backup.is_some() && update == Update::None {
        bail!(
            "options --backup and --no-clobber are mutually exclusive\nTry '{}' for more information.",
            if prog() == "cp" { "cp --help" } else { "cowlink cp --help" }
        );
    }
    let suffix = args
        .suffix
        .clone()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var_os("SIMPLE_BACKUP_SUFFIX").filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "~".into());
    // 0: the library's default.
    let threads = args.jobs.map_or(0, crate::capped_threads);
    Ok(CpOptions {
        link_mode: args.reflink,
        preserve,
        default_mode: no_mode,
        attributes_only: args.attributes_only,
        deref,
        backup,
        suffix,
        force: args.force,
        remove_destination: args.remove_destination,
        interactive: args.interactive,
        update,
        link,
        copy_contents: args.copy_contents,
        preserve_links: links,
        recursive,
        parents: args.parents,
        sparse: match args.sparse {
            Some(SparseArg::Always) => Sparse::Always,
            Some(SparseArg::Never) => Sparse::Never,
            _ => Sparse::Auto,
        },
        resume: args.resume,
        atomic: args.atomic,
        dry_run: args.dry_run,
        posixly_correct: std::env::var_os("POSIXLY_CORRECT").is_some(),
        run: Run::default()
            .with_threads(threads)
            .with_cancel(crate::interrupt::token())
            .with_progress(Arc::new(Progress::new())),
    })
}

/// Ask on stderr, read the answer from stdin: yes when it starts with y.
fn ask(reporter: &Reporter, prompt: &cowlink::cp::Prompt<'_>) -> bool {
    use std::io::BufRead;
    let question = || {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{}: {}", prog(), prompt.question());
        let _ = err.flush();
    };
    match &reporter.bar {
        Some(bar) => bar.suspend(question),
        None => question(),
    }
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    matches!(line.trim_start().chars().next(), Some('y' | 'Y'))
}

/// Run `cowlink cp`: arguments → [`CpOptions`] → [`cowlink::cp`] → output.
pub fn run(args: CpArgs) -> Result<Exit> {
    let o = options(&args)?;
    if args.target_directory.is_none() && args.paths.len() < 2 {
        bail!(
            "missing destination file operand after {}\nUsage: {} [OPTIONS] SRC... DEST (see --help)",
            quoted(&args.paths[0]),
            if prog() == "cp" { "cp" } else { "cowlink cp" }
        );
    }
    let (sources, dest) = match &args.target_directory {
        Some(dir) => (&args.paths[..], dir.as_path()),
        None => {
            let (last, rest) = args.paths.split_last().expect("two or more paths");
            (rest, last.as_path())
        }
    };
    let target = Target {
        directory: args.target_directory.is_some(),
        no_directory: args.no_target_directory,
        strip_trailing_slashes: args.strip_trailing_slashes,
    };
    let ops = cowlink::cp::operands(sources, dest, target, &o, &|p| match std::fs::metadata(p) {
        Ok(m) => Ok(Some(m.is_dir())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    })
    .map_err(|e| anyhow::Error::msg(e.reason()))?;
    let cancel = crate::interrupt::token();
    // Deep trees hold two descriptors per level; raise the soft limit.
    crate::raise_fd_limit();

    // A bar on a terminal; with --progress elsewhere (logs, CI), a plain
    // line every second instead.
    let terminal = std::io::stderr().is_terminal();
    let show_progress =
        !args.no_progress && !args.dry_run && o.recursive && (args.progress || terminal);
    let bar = (show_progress && terminal).then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}").expect("valid template"),
        );
        bar
    });
    let gnu_verbose = prog() == "cp";
    let reporter = Reporter {
        options: o.clone_options(),
        verbose: args.verbose,
        gnu_verbose,
        json: args.json,
        recursive: o.recursive,
        tally: Arc::clone(o.run.progress.as_ref().expect("set above")),
        wrote_record: AtomicBool::new(false),
        stdout_failed: AtomicBool::new(false),
        out: Mutex::new(std::io::stdout()),
        bar,
        quiet_dir: Mutex::new(None),
    };
    if args.json {
        out!("{{\n  \"results\": [");
    }
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
                            errln!("{}: {message}", prog());
                            last_line = Instant::now();
                        }
                        None => {}
                    }
                    std::thread::park_timeout(Duration::from_millis(100));
                }
            })
        });
        let observer = |ev: &CpEvent<'_>| reporter.cp_event(ev);
        let mut answer = |p: &cowlink::cp::Prompt<'_>| ask(&reporter, p);
        let report =
            cowlink::cp::copy_operands(&ops, target.directory, &o, &observer, Some(&mut answer));
        any_tree = report.any_tree;
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
    } else if any_tree && !gnu_verbose && (args.verbose || args.dry_run || show_progress) {
        errln!("{}", summary_line(&summary));
    }
    if prog() == "cp" && reporter.stdout_failed.load(Ordering::Relaxed) {
        // GNU cp fails when its output cannot be written (`-v >&-`).
        if crate::out::stdout_closed() {
            errln!("cp: write error: Bad file descriptor");
        } else {
            errln!("cp: write error");
        }
        return Ok(Exit::Failed);
    }
    Ok(if summary.cancelled {
        errln!(
            "{}: interrupted; entries already copied are complete, nothing partial was left",
            prog()
        );
        Exit::Interrupted
    } else if summary.failed > 0 {
        Exit::Failed
    } else {
        Exit::Ok
    })
}
