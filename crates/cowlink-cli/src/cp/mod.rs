//! `cowlink cp`: clone files (and, with -r, directory trees) like cp.
//!
//! This file reads the options and reports; `gnu.rs` holds GNU cp's rules
//! for each command-line operand.

mod gnu;

use cowlink::name::quoted;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use cowlink::tree::{copy_tree, Action, LinkKind, SkipReason, TreeEvent, TreeOptions};
use cowlink::{
    clone_file, CloneOptions, Error, ErrorKind, LinkMode, Method, Outcome, Overwrite, Placement,
    Preserve,
};
use cowlink::{Progress, Run};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::os::unix::ffi::OsStrExt;

use crate::out::{errln, out, outln, prog};
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
/// GNU's `--reflink=always|auto|never`, onto the library's one
/// [`LinkMode`] (always: clone, auto: auto, never: copy).
fn reflink_arg() -> impl clap::builder::TypedValueParser<Value = LinkMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["auto", "always", "never"])
        .map(|w: String| LinkMode::from_reflink(&w).expect("one of the possible values"))
}

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
    update: Option<gnu::Update>,

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

    /// Holes in copies: auto (keep the source's holes, the default), always,
    /// never. Clones share the source's layout whatever this says
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

/// Run `cowlink cp`.
pub fn run(args: CpArgs) -> Result<Exit> {
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
        gnu::Deref::Always
    } else if args.deref_args {
        gnu::Deref::CommandLine
    } else if args.no_dereference
        || args.no_deref_preserve_links
        || args.archive
        || (recursive && link != Some(LinkKind::Hard))
    {
        gnu::Deref::Never
    } else {
        gnu::Deref::Always
    };
    let update = if args.no_clobber {
        gnu::Update::None
    } else if args.update_older {
        gnu::Update::Older
    } else {
        args.update.unwrap_or(gnu::Update::All)
    };
    let backup = match (&args.backup, args.backup_default || args.suffix.is_some()) {
        (None, false) => None,
        (word, _) => {
            let word = match word.as_deref() {
                Some(w) if !w.is_empty() => w.to_string(),
                _ => std::env::var("VERSION_CONTROL").unwrap_or_default(),
            };
            let kind = if word.is_empty() {
                Some(gnu::Backup::Existing)
            } else {
                gnu::Backup::parse(&word).map_err(anyhow::Error::msg)?
            };
            let suffix = args
                .suffix
                .clone()
                .filter(|s| !s.is_empty())
                .or_else(|| std::env::var_os("SIMPLE_BACKUP_SUFFIX").filter(|s| !s.is_empty()))
                .unwrap_or_else(|| "~".into());
            kind.map(|k| (k, suffix))
        }
    };
    if backup.is_some() && update == gnu::Update::None {
        bail!(
            "options --backup and --no-clobber are mutually exclusive\nTry '{}' for more information.",
            if prog() == "cp" { "cp --help" } else { "cowlink cp --help" }
        );
    }
    let rules = gnu::Rules {
        deref,
        backup,
        force: args.force,
        remove_destination: args.remove_destination,
        interactive: args.interactive,
        update,
        link,
        copy_contents: args.copy_contents,
        attributes_only: args.attributes_only,
        preserve_links: links,
        recursive,
        gnu_verbose: prog() == "cp",
        parents: args.parents,
        sparse: match args.sparse {
            Some(SparseArg::Always) => Some(gnu::Sparse::Always),
            Some(SparseArg::Never) => Some(gnu::Sparse::Never),
            _ => None,
        },
    };
    let options = CloneOptions {
        link: args.reflink,
        // GNU cp replaces existing files unless told otherwise; links are
        // made only where nothing is (or -f removed it).
        overwrite: if matches!(update, gnu::Update::None) {
            Overwrite::Skip
        } else if link.is_some() && !args.force {
            Overwrite::Refuse
        } else {
            Overwrite::Replace
        },
        preserve,
        attributes_only: args.attributes_only,
        default_mode: no_mode && !preserve.mode,
        // A single file named on the command line is complete or absent
        // even after a crash; trees choose per directory (`--atomic`).
        placement: Placement::Atomic,
    };
    let jobs = plan(&args, &|p| match std::fs::metadata(p) {
        Ok(m) => Ok(Some(m.is_dir())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    })?;
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
        gnu_verbose: rules.gnu_verbose,
        json: args.json,
        recursive,
        tally: Arc::new(Progress::new()),
        wrote_record: AtomicBool::new(false),
        stdout_failed: AtomicBool::new(false),
        out: Mutex::new(std::io::stdout()),
        bar,
        quiet_dir: Mutex::new(None),
    };
    if args.json {
        out!("{{\n  \"results\": [");
    }
    let tree = TreeOptions {
        file: options,
        hardlinks: links,
        dereference: deref == gnu::Deref::Always,
        atomic: args.atomic,
        resume: args.resume,
        link,
        update_older: update == gnu::Update::Older,
        copy_contents: args.copy_contents && recursive,
        dry_run: args.dry_run,
        run: Run::default()
            .with_threads(threads)
            .with_cancel(cancel.clone())
            .with_progress(Arc::clone(&reporter.tally)),
    };
    let start = Instant::now();
    let finished = AtomicBool::new(false);
    let mut any_tree = false;
    let into_dir =
        args.target_directory.is_some() || jobs.len() > 1 || jobs.first().is_some_and(|j| j.2);
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
        let mut seen = gnu::Seen::default();
        for (src, dst, _) in &jobs {
            if cancel.is_cancelled() {
                break;
            }
            any_tree |= copy_operand(&reporter, &tree, &rules, &mut seen, src, dst, into_dir);
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
    } else if any_tree && !rules.gnu_verbose && (args.verbose || args.dry_run || show_progress) {
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

/// What `plan` needs to know of a path: `None` when it does not exist,
/// else whether it is a directory (following symbolic links).
type IsDir<'a> = &'a dyn Fn(&Path) -> std::io::Result<Option<bool>>;

/// One operand: source, destination, and whether the destination was
/// formed inside a target directory.
type Job = (PathBuf, PathBuf, bool);

/// Resolve the command line into (source, destination, into a directory)
/// triples with GNU cp's rules: a destination that is a directory receives
/// the sources under their last component (`DIR/.` is named `.`, so its
/// content merges into the target), or under their whole path with
/// `--parents`. Pure but for `is_dir`, so the rules are unit-tested
/// without files.
fn plan(args: &CpArgs, is_dir: IsDir<'_>) -> Result<Vec<Job>> {
    let strip = |p: &PathBuf| -> PathBuf {
        if !args.strip_trailing_slashes {
            return p.clone();
        }
        let b = p.as_os_str().as_bytes();
        let end = b.iter().rposition(|c| *c != b'/').map_or(1, |i| i + 1);
        PathBuf::from(std::ffi::OsStr::from_bytes(&b[..end]))
    };
    let sources_all: Vec<PathBuf> = args.paths.iter().map(strip).collect();
    let (sources, target): (&[PathBuf], &Path) = match &args.target_directory {
        Some(dir) => {
            match is_dir(dir) {
                Ok(Some(true)) => {}
                Ok(Some(false)) => bail!("target directory {}: Not a directory", quoted(dir)),
                Ok(None) => bail!(
                    "target directory {}: No such file or directory",
                    quoted(dir)
                ),
                Err(e) => bail!("target directory {}: {}", quoted(dir), io_words(&e)),
            }
            (&sources_all, dir.as_path())
        }
        None => {
            if sources_all.len() < 2 {
                bail!(
                    "missing destination file operand after {}\nUsage: {} [OPTIONS] SRC... DEST (see --help)",
                    quoted(&args.paths[0]),
                    if prog() == "cp" { "cp" } else { "cowlink cp" }
                );
            }
            let (last, rest) = args.paths.split_last().expect("two or more paths");
            let rest = &sources_all[..rest.len()];
            if args.no_target_directory {
                if rest.len() > 1 {
                    bail!("extra operand {}", quoted(&args.paths[2]));
                }
                return Ok(vec![(rest[0].clone(), last.clone(), false)]);
            }
            // As GNU: a last operand that cannot be examined is a file
            // name for one source (the copy then says why), an error for
            // several.
            let last_is_dir = match is_dir(last) {
                Ok(d) => d,
                Err(_) if rest.len() == 1 && !args.parents => Some(false),
                Err(e) => bail!("target {}: {}", quoted(last), io_words(&e)),
            };
            if rest.len() == 1 && last_is_dir != Some(true) && !args.parents {
                let src_is_dir =
                    is_dir(&rest[0]).ok().flatten() == Some(true) && args.recursive || args.archive;
                if last.as_os_str().as_bytes().ends_with(b"/") && !src_is_dir {
                    bail!(
                        "cannot create regular file {}: Not a directory",
                        quoted(last)
                    );
                }
                return Ok(vec![(rest[0].clone(), last.clone(), false)]);
            }
            match last_is_dir {
                Some(true) => {}
                Some(false) if args.parents && rest.len() == 1 => {
                    bail!("with --parents, the destination must be a directory")
                }
                Some(false) => bail!("target {} is not a directory", quoted(last)),
                None => bail!("target {}: No such file or directory", quoted(last)),
            }
            (rest, last.as_path())
        }
    };
    sources
        .iter()
        .map(|src| {
            let dst = if args.parents {
                let rel = src.as_os_str().as_bytes();
                let rel = rel.strip_prefix(b"/").unwrap_or(rel);
                gnu::join(target, std::ffi::OsStr::from_bytes(rel))
            } else {
                gnu::join(target, gnu::base_name(src))
            };
            Ok((src.clone(), dst, true))
        })
        .collect()
}

/// An I/O error in GNU's words ("Permission denied"), without Rust's
/// "(os error 13)".
fn io_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

/// `--parents`: create the directories between the target and `dst`
/// that are missing, each with its source directory's permission bits.
fn make_parents(src: &Path, dst: &Path, preserve: Preserve) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (Some(sp), Some(dp)) = (src.parent(), dst.parent()) else {
        return Ok(());
    };
    if std::fs::symlink_metadata(src).is_err() {
        return Ok(()); // the copy says why
    }
    let chain: Vec<(&Path, &Path)> = sp.ancestors().zip(dp.ancestors()).collect();
    for (s, d) in chain.into_iter().rev() {
        if s.as_os_str().is_empty() {
            continue;
        }
        if std::fs::symlink_metadata(d).is_ok() {
            // With -p, GNU gives existing directories on the way the
            // source's permissions again.
            if preserve.mode && std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
                let mode = std::fs::metadata(s)?.permissions().mode() & 0o7777;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?;
            }
            continue;
        }
        std::fs::create_dir(d)?;
        let m = std::fs::metadata(s)?;
        let mode = m.permissions().mode() & 0o7777;
        // As GNU since 8.25: the source directory's mode only when modes
        // are preserved, else the default for new directories.
        let mode = if preserve.mode {
            mode
        } else {
            0o777 & !umask_now()
        };
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// The process umask, read once from /proc (umask(2) would change it).
fn umask_now() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .unwrap_or(0o022)
    })
}

/// Copy one command-line operand with GNU cp's rules; returns whether it
/// was a tree copy.
fn copy_operand(
    r: &Reporter,
    tree: &TreeOptions,
    rules: &gnu::Rules,
    seen: &mut gnu::Seen,
    src: &Path,
    dst: &Path,
    into_dir: bool,
) -> bool {
    let refuse_errno = |msg: String, errno: Option<i32>| {
        let e = match errno {
            Some(n) => Error::from_errno(
                cowlink::Operation::Clone,
                rustix::io::Errno::from_raw_os_error(n),
            ),
            None => Error::new(cowlink::Operation::Clone, ErrorKind::InvalidInput),
        }
        .with_src(src)
        .with_dst(dst)
        .with_reason(msg.clone());
        r.tally.count_failed();
        r.eprint(&format!("{}: {msg}", prog()));
        r.record(&Record {
            error: Some(e),
            ..Record::new(src, dst, "failed")
        });
    };
    let refuse = |msg: String| refuse_errno(msg, None);
    if tree.dry_run {
        return plan_one(r, tree, src, dst);
    }
    if rules.parents {
        if let Err(e) = make_parents(src, dst, r.options.preserve) {
            refuse(format!(
                "cannot make directory {}: {}",
                quoted(dst.parent().unwrap_or(dst)),
                io_words(&e)
            ));
            return false;
        }
    }
    let job = match rules.plan(src, dst, into_dir, seen, &|w| {
        r.eprint(&format!("{}: {w}", prog()))
    }) {
        Ok(gnu::Plan::Nothing) => return false,
        Ok(gnu::Plan::Copy(job)) => job,
        Err(gnu::Refusal(msg, errno)) => {
            refuse_errno(msg, errno);
            return false;
        }
    };
    let dst = job.dst.as_path();
    let t = Instant::now();
    let fail_msg = |msg: String| {
        gnu::restore_backup(&job);
        refuse(msg);
    };
    let ok = |bytes: u64, method: Method| {
        r.tally.count_file(&Outcome { method, bytes });
        r.done(
            src,
            dst,
            Outcome { method, bytes },
            Some(t.elapsed()),
            job.backup.as_deref(),
        );
    };
    let mut tree_copy = false;
    if let Some(first) = &job.link_to {
        if std::fs::symlink_metadata(dst).is_ok_and(|m| !m.is_dir()) {
            // As GNU: the name is taken by the link to the first copy.
            let _ = std::fs::remove_file(dst);
        }
        match gnu::hardlink(first, dst, false) {
            Ok(()) => ok(0, Method::Hardlink),
            Err(m) => fail_msg(m),
        }
    } else if let (Some(kind), false) = (tree.link, job.is_dir) {
        let made = match kind {
            LinkKind::Hard => gnu::hardlink(src, dst, job.follow),
            LinkKind::Symbolic => gnu::symlink_to(src, dst),
        };
        match made {
            Ok(()) => ok(0, Method::Hardlink),
            Err(m) => fail_msg(m),
        }
    } else if job.write_into {
        match gnu::write_into(src, dst) {
            Ok(n) => ok(n, Method::ReadWrite),
            Err(e) => fail_msg(format!("cannot write to {}: {}", quoted(dst), io_words(&e))),
        }
    } else if job.as_file && !is_regular(src, job.follow) {
        let mode = std::fs::metadata(src).map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode()
        });
        match gnu::copy_contents(src, dst, mode.unwrap_or(0o644)) {
            Ok(n) => ok(n, Method::ReadWrite),
            Err(e) => {
                gnu::restore_backup(&job);
                r.tally.count_failed();
                r.failed(src, dst, &e);
            }
        }
    } else if job.as_file {
        let mut options = r.options;
        if tree.resume {
            if cowlink::is_complete_copy(src, dst) {
                r.tally.count_skipped();
                r.skipped(src, dst, SkipReason::Complete);
                return false;
            }
            options.overwrite = Overwrite::Replace;
        }
        match clone_file(src, dst, &options) {
            Ok(o) => {
                if let Err(e) = after_file(rules, dst, o.method) {
                    fail_msg(format!("{}: {}", quoted(dst), io_words(&e)));
                    return false;
                }
                r.tally.count_file(&o);
                r.done(src, dst, o, Some(t.elapsed()), job.backup.as_deref());
            }
            Err(e) => {
                gnu::restore_backup(&job);
                r.tally.count_failed();
                r.failed(src, dst, &e);
            }
        }
    } else {
        if job.dst_dir_existed {
            *r.quiet_dir.lock().unwrap_or_else(|p| p.into_inner()) = Some(dst.to_path_buf());
        }
        let from = follow_operand(src, job.follow);
        let observer = |ev: &TreeEvent<'_>| r.tree_event(ev, (src, dst));
        if let Err(e) = crate::interrupt::graceful(|| copy_tree(&from, dst, tree, &observer)) {
            gnu::restore_backup(&job);
            r.tally.count_failed();
            r.failed(src, dst, &e);
        }
        tree_copy = job.is_dir;
    }
    rules.record(&job, seen);
    tree_copy
}

/// What GNU does to a copied file beyond the copy: `--sparse=always`
/// turns runs of zeros into holes, `--sparse=never` fills every hole (a
/// clone keeps its source's layout either way). (The default mode of
/// `--no-preserve=mode` is the library's `CloneOptions::default_mode`.)
fn after_file(rules: &gnu::Rules, dst: &Path, method: Method) -> std::io::Result<()> {
    use rustix::fs::{fallocate, FallocateFlags};
    use std::os::unix::fs::FileExt;
    if method == Method::Reflink || method == Method::Skipped {
        return Ok(());
    }
    match rules.sparse {
        Some(gnu::Sparse::Always) => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dst)?;
            let len = f.metadata()?.len();
            const BLOCK: u64 = 4096;
            let mut buf = vec![0u8; BLOCK as usize];
            let mut off = 0;
            while off < len {
                let n = f.read_at(&mut buf, off)?;
                if n == 0 {
                    break;
                }
                if n as u64 == BLOCK && buf.iter().all(|b| *b == 0) {
                    fallocate(
                        &f,
                        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                        off,
                        BLOCK,
                    )?;
                }
                off += n as u64;
            }
        }
        Some(gnu::Sparse::Never) => {
            let f = std::fs::OpenOptions::new().write(true).open(dst)?;
            let len = f.metadata()?.len();
            if len > 0 {
                fallocate(&f, FallocateFlags::KEEP_SIZE, 0, len)?;
            }
        }
        None => {}
    }
    Ok(())
}

/// The operand as the tree copy should open it: a followed symlink is
/// replaced by what it names (the tree copy itself follows none with -H).
fn follow_operand(src: &Path, follow: bool) -> PathBuf {
    if follow && std::fs::symlink_metadata(src).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf())
    } else {
        src.to_path_buf()
    }
}

fn is_regular(p: &Path, follow: bool) -> bool {
    if follow {
        std::fs::metadata(p)
    } else {
        std::fs::symlink_metadata(p)
    }
    .is_ok_and(|m| m.is_file())
}

/// A dry run of one command-line source (the tree copy reports what it
/// would do, for a single file too); returns whether it was a directory.
fn plan_one(r: &Reporter, tree: &TreeOptions, src: &Path, dst: &Path) -> bool {
    let meta = if tree.dereference {
        std::fs::metadata(src)
    } else {
        std::fs::symlink_metadata(src)
    };
    let is_dir = meta.is_ok_and(|m| m.is_dir()) || (!r.recursive && src.is_dir());
    if is_dir && !r.recursive {
        let e = Error::new(cowlink::Operation::Clone, ErrorKind::IsDirectory)
            .with_src(src)
            .with_dst(dst)
            .with_reason("source is a directory (omitted)");
        r.tally.count_failed();
        r.failed(src, dst, &e);
        return false;
    }
    let observer = |ev: &TreeEvent<'_>| r.tree_event(ev, (src, dst));
    let result = crate::interrupt::graceful(|| copy_tree(src, dst, tree, &observer));
    if let Err(e) = result {
        // Nothing could start: not counted by the tree.
        r.tally.count_failed();
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
        let is_dir = |p: &Path| {
            Ok(match p.to_str().unwrap().trim_end_matches('/') {
                "d" | "e" => Some(true),
                "f" => Some(false),
                _ => None,
            })
        };
        Ok(plan(&args, &is_dir)?
            .into_iter()
            .map(|(s, d, _)| (s.display().to_string(), d.display().to_string()))
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
        assert_eq!(e, "target 'nothere': No such file or directory");
    }

    #[test]
    fn a_trailing_slash_promises_a_directory() {
        let e = plan_of("a new/").unwrap_err().to_string();
        assert_eq!(e, "cannot create regular file 'new/': Not a directory");
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
        assert_eq!(e, "extra operand 'd'");
    }

    #[test]
    fn a_missing_destination_is_refused() {
        let e = plan_of("a").unwrap_err().to_string();
        assert!(
            e.starts_with("missing destination file operand after 'a'"),
            "{e}"
        );
    }

    #[test]
    fn dir_dot_merges_into_the_target_and_parents_keep_the_path() {
        // GNU: the last component of `x/.` is `.`, so `cp -r x/. d`
        // copies x's content into d itself.
        assert_eq!(plan_of("-r x/. d").unwrap(), pairs(&[("x/.", "d/.")]));
        assert_eq!(plan_of("x/ d").unwrap(), pairs(&[("x/", "d/x")]));
        assert_eq!(
            plan_of("--parents a/b/f d").unwrap(),
            pairs(&[("a/b/f", "d/a/b/f")])
        );
        let e = plan_of("--parents a f").unwrap_err().to_string();
        assert_eq!(e, "with --parents, the destination must be a directory");
        assert_eq!(
            plan_of("--strip-trailing-slashes x/ d").unwrap(),
            pairs(&[("x", "d/x")])
        );
    }
}
