//! `cowlink sync`: keep a mirror in step by cloning (arguments into
//! `cowlink::sync::SyncOptions`, events into itemized lines or JSON).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use cowlink::name::shown;
use cowlink::sync::{itemize, Action, Changes, EntryKind, SyncEvent, SyncOptions, SyncReport};
use cowlink::{Method, Progress, Run};
use serde::Serialize;

use crate::out::{errln, out, outln};
use crate::{human_bytes, human_duration, Exit};

/// Make DST equal SRC, touching only what differs, cloning what changed
///
/// As `rsync -aHAX`: afterwards DST holds what `cp -a` would have made
/// (modes, owners, nanosecond times, extended attributes and ACLs,
/// hardlinks, symbolic links, FIFOs and devices). An entry whose size and
/// modification time match (contents, with --checksum) is not touched.
/// New and changed files are cloned from SRC where the filesystem allows
/// (or from an equal file in a --reflink-dest directory), copied where it
/// does not.
///
/// rsync's trailing-slash rule: `SRC/` syncs the contents of SRC into
/// DST, `SRC` syncs the directory itself into DST/SRC.
///
/// DST is the declared mirror: entries inside it are replaced and, with
/// --delete, removed; nothing inside it is followed (a symbolic link
/// where a directory belongs is replaced), mount points inside it are not
/// crossed, and nothing outside it is written. One sync per DST at a time,
/// nested ones included: a second sync into DST, into a directory inside
/// it or into one above it is refused, naming the process holding it
/// (syncs into sibling directories run together). A changed file is
/// a new inode renamed over the old name, so after a crash every name
/// holds its old or its new content, and a rerun converges. A source
/// file that changes while it is read is read again (three times at
/// most), then reported and left out, never placed torn.
///
/// --dry-run (and --itemize-changes) print one line per change, as
/// `rsync -i`: YXcstpoguax then the path. Y: `>` data placed, `c` created
/// (directory, link, special), `h` hardlink, `.` metadata only,
/// `*deleting`. X: f file, d directory, L link, D device, S FIFO or
/// socket. Then c contents (or link target), s size, t time, p
/// permissions, o owner, g group, x extended attributes or ACLs; `.`
/// where equal, `+++++++++` for a new entry.
///
/// --snapshot ROOT keeps versions instead of one mirror: each run makes
/// ROOT/<UTC time>/ as a clone of the newest complete snapshot (a
/// subvolume snapshot on Btrfs), syncs SRC into it with --delete
/// --delete-excluded (a snapshot is SRC as it was), and then marks it
/// complete. Unchanged files share every block with the snapshot before;
/// a changed file is cloned from SRC (or, from another filesystem, only
/// its differing blocks are written). An interrupted run is never listed
/// complete and the next run resumes it under its name. `cowlink snapshot
/// ls ROOT` shows what each holds; `cowlink snapshot prune` removes old ones.
///
/// Examples:
///   cowlink sync src/ /mnt/mirror/            # contents of src into the mirror
///   cowlink sync --snapshot /backup/home ~/   # a new snapshot of ~ under /backup/home
///   cowlink sync -n --delete src/ mirror/     # what would change, deletions too
///   cowlink sync --exclude '*.o' --exclude target/ src/ mirror/
///   cowlink sync --reflink-dest ../2024-06-01 src/ backups/2024-06-02/
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct SyncArgs {
    /// Remove entries of DST that SRC lacks (excluded ones are spared)
    #[arg(long)]
    delete: bool,

    /// With --delete, remove excluded entries from DST too
    #[arg(long, requires = "delete")]
    delete_excluded: bool,

    /// Leave out what matches PATTERN (gitignore syntax, relative to the
    /// synced directory: `*.o`, `/build`, `cache/`, `!keep.o`, `a/**/z`)
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,

    /// Read exclusion patterns from FILE, one per line (`#` comments;
    /// UTF-8: a line that is not is refused with its number)
    #[arg(long, value_name = "FILE", value_parser = crate::PathArg)]
    exclude_from: Vec<PathBuf>,

    /// Compare files by contents (BLAKE3) instead of size and time, and
    /// extended attributes always (else only of files whose source
    /// changed since the copy)
    #[arg(short = 'c', long)]
    checksum: bool,

    /// Clone files equal to their counterpart in DIR from there
    /// (repeatable; a relative DIR is taken from DST, as rsync's
    /// --link-dest)
    #[arg(long, value_name = "DIR", value_parser = crate::PathArg)]
    reflink_dest: Vec<PathBuf>,

    /// Print the changes that would be made, make none
    #[arg(short = 'n', long)]
    dry_run: bool,

    /// Print one line per change made, as rsync -i
    #[arg(short = 'i', long)]
    itemize_changes: bool,

    /// Give every name its own copy instead of keeping hardlink groups
    #[arg(long)]
    no_hardlinks: bool,

    /// Sync with N threads, at most 64 (default: chosen per destination
    /// filesystem)
    #[arg(short = 'j', long, value_name = "N", value_parser = crate::threads_arg)]
    jobs: Option<usize>,

    /// Show a progress line (default: only when stderr is a terminal)
    #[arg(long, overrides_with = "no_progress")]
    progress: bool,

    /// Never show progress
    #[arg(long)]
    no_progress: bool,

    /// Print every change and a summary as JSON on stdout
    #[arg(long)]
    json: bool,

    /// The source: `SRC/` for its contents, `SRC` for the directory itself
    #[arg(value_name = "SRC", value_parser = crate::PathArg)]
    src: PathBuf,

    /// Make a new snapshot under ROOT and sync into it, instead of DST
    #[arg(long, value_name = "ROOT", value_parser = crate::PathArg, conflicts_with_all = ["dst", "reflink_dest"])]
    snapshot: Option<PathBuf>,

    /// The destination directory (created if missing)
    #[arg(value_name = "DST", value_parser = crate::PathArg, required_unless_present = "snapshot")]
    dst: Option<PathBuf>,
}

/// One change in `--json` output. A path that is not UTF-8 has its exact
/// bytes in `path_bytes` (see [`cowlink::name`]).
#[derive(Serialize)]
struct Record<'a> {
    #[serde(flatten, serialize_with = "cowlink::name::json::path")]
    path: &'a Path,
    kind: EntryKind,
    action: Action,
    changes: Changes,
    /// The `rsync -i` columns.
    itemize: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<Method>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
}

#[derive(Serialize)]
struct Failure<'a> {
    error: &'a cowlink::Error,
}

/// Prints events from worker threads.
struct Printer {
    json: bool,
    lines: bool,
    first: AtomicBool,
    out: Mutex<crate::out::Out<std::io::Stdout>>,
}

impl Printer {
    /// One JSON record; the first opens the document, so a sync that
    /// cannot start leaves stdout empty.
    fn record(&self, text: &str) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let sep = if self.first.swap(false, Ordering::Relaxed) {
            "{\n  \"changes\": [\n    "
        } else {
            ",\n    "
        };
        let _ = write!(out, "{sep}{text}");
    }

    fn event(&self, ev: &SyncEvent<'_>) {
        match ev {
            SyncEvent::Item {
                path,
                kind,
                action,
                changes,
                outcome,
                ..
            } => {
                if *action == Action::Keep {
                    return;
                }
                let line = itemize(*action, *kind, changes);
                if self.json {
                    let r = Record {
                        path,
                        kind: *kind,
                        action: *action,
                        changes: *changes,
                        itemize: line,
                        method: outcome.map(|o| o.method),
                        bytes: outcome.map(|o| o.bytes),
                    };
                    self.record(&serde_json::to_string(&r).expect("records serialize"));
                } else if self.lines {
                    let shown_path = if path.as_os_str().is_empty() {
                        "./".into()
                    } else if *kind == EntryKind::Dir && *action != Action::Delete {
                        format!("{}/", shown(path))
                    } else {
                        shown(path).into_owned()
                    };
                    let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = writeln!(out, "{line} {shown_path}");
                }
            }
            SyncEvent::Failed(e) => {
                errln!("cowlink sync: {e}");
                if self.json {
                    let f = Failure { error: e };
                    self.record(&serde_json::to_string(&f).expect("errors serialize"));
                }
            }
            _ => {}
        }
    }
}

fn summary_line(r: &SyncReport, elapsed: std::time::Duration) -> String {
    format!(
        "{}{} created, {} replaced, {} metadata only, {} hardlinked, {} deleted, {} unchanged; \
         {} placed ({} cloned, {} copied{}{}){} in {}",
        if r.dry_run {
            "dry run: would have "
        } else {
            ""
        },
        r.created,
        r.replaced,
        r.metadata,
        r.hardlinked,
        r.deleted,
        r.unchanged,
        human_bytes(r.bytes),
        r.cloned,
        r.copied,
        if r.by_blocks > 0 {
            format!(", {} by changed blocks", r.by_blocks)
        } else {
            String::new()
        },
        if r.cloned_from_reflink_dest > 0 {
            format!(", {} from --reflink-dest", r.cloned_from_reflink_dest)
        } else {
            String::new()
        },
        if r.errors > 0 {
            format!("; {} failed", r.errors)
        } else {
            String::new()
        },
        human_duration(elapsed),
    )
}

/// The most an `--exclude-from` file may hold: far more than any list of
/// patterns, and a bound on what a file that never ends (`/dev/zero`, a
/// runaway pipe) can make us hold in memory.
const EXCLUDE_FILE_MAX: u64 = 16 << 20;

/// How long an `--exclude-from` FIFO that no process has opened to
/// write is waited for: long enough for a writer started with the sync to
/// open it, short enough that a FIFO nobody writes to fails instead of
/// hanging.
const EXCLUDE_FIFO_WAIT: Duration = Duration::from_secs(3);

/// The bytes of the `--exclude-from` file `f`, bounded by
/// [`EXCLUDE_FILE_MAX`]: a regular file, a pipe or FIFO (`<(...)`,
/// `/dev/stdin`), or a character device; a directory is refused. A FIFO
/// is opened without waiting for a writer (a plain open would wait
/// forever): one that gets no writer within [`EXCLUDE_FIFO_WAIT`] is
/// refused.
fn read_exclude_file(f: &Path) -> Result<Vec<u8>> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::io::Read;
    let cannot = || format!("cannot read the exclude file {}", shown(f));
    let mut text = Vec::new();
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(f, flags, Mode::empty())
        .map_err(std::io::Error::from)
        .with_context(cannot)?;
    let st = rustix::fs::fstat(&fd)
        .map_err(std::io::Error::from)
        .with_context(cannot)?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => anyhow::bail!(
            "the exclude file {} is a directory, not a list of patterns",
            shown(f)
        ),
        FileType::Fifo => text = wait_for_writer(&fd, f)?,
        _ => {}
    }
    // Blocking again: a writer (or a terminal) is read to its end.
    rustix::fs::fcntl_setfl(&fd, OFlags::empty())
        .map_err(std::io::Error::from)
        .with_context(cannot)?;
    std::fs::File::from(fd)
        .take(EXCLUDE_FILE_MAX + 1 - text.len() as u64)
        .read_to_end(&mut text)
        .with_context(cannot)?;
    if text.len() as u64 > EXCLUDE_FILE_MAX {
        anyhow::bail!(
            "the exclude file {} is larger than {} MiB: not a list of patterns",
            shown(f),
            EXCLUDE_FILE_MAX >> 20
        );
    }
    Ok(text)
}

/// Wait, up to [`EXCLUDE_FIFO_WAIT`], until the FIFO `fd` (opened
/// without blocking) has a writer; answers what was read meanwhile. A
/// read finding no data answers end of file at once when no process
/// holds the FIFO open to write, `EAGAIN` when one does and has not
/// written yet. A writer that came, wrote nothing and left looks like
/// none: a FIFO that gives nothing is refused, never taken for an empty
/// list.
fn wait_for_writer(fd: &rustix::fd::OwnedFd, f: &Path) -> Result<Vec<u8>> {
    let start = Instant::now();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match rustix::io::read(fd, &mut buf[..]) {
            Ok(0) if start.elapsed() < EXCLUDE_FIFO_WAIT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(0) => anyhow::bail!(
                "the exclude file {} is a FIFO that no process writes to (waited {} s); \
                 start its writer first",
                shown(f),
                EXCLUDE_FIFO_WAIT.as_secs()
            ),
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(rustix::io::Errno::AGAIN) => return Ok(Vec::new()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(std::io::Error::from(e))
                    .with_context(|| format!("cannot read the exclude file {}", shown(f)))
            }
        }
    }
}

pub fn run(args: SyncArgs) -> Result<Exit> {
    let mut exclude = args.exclude.clone();
    for f in &args.exclude_from {
        let text = read_exclude_file(f)?;
        exclude.extend(cowlink::sync::patterns_from(&text, f)?);
    }
    let progress = Arc::new(Progress::new());
    let options = SyncOptions {
        checksum: args.checksum,
        delete: args.delete,
        delete_excluded: args.delete_excluded,
        exclude,
        reflink_dest: args.reflink_dest.clone(),
        dry_run: args.dry_run,
        no_hardlinks: args.no_hardlinks,
        run: Run::default()
            .with_threads(args.jobs.map_or(0, crate::capped_threads))
            .with_cancel(crate::interrupt::token())
            .with_progress(Arc::clone(&progress)),
    };
    crate::raise_fd_limit();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let show_progress = !args.no_progress && !args.dry_run && (args.progress || terminal);
    let printer = Printer {
        json: args.json,
        lines: args.dry_run || args.itemize_changes,
        first: AtomicBool::new(true),
        out: Mutex::new(crate::out::Out::new(std::io::stdout())),
    };
    let start = Instant::now();
    let spinner = crate::progress::for_run(show_progress, &progress);
    // Ctrl-C: workers finish the entry they are on; every name is old or
    // new, and a rerun converges.
    let observer = |ev: &SyncEvent<'_>| printer.event(ev);
    let result = crate::interrupt::graceful(|| match &args.snapshot {
        Some(root) => cowlink::sync::sync_snapshot(&args.src, root, &options, &observer)
            .map(|s| (s.sync.clone(), Some(s))),
        None => {
            let dst = args
                .dst
                .as_ref()
                .expect("clap requires DST without --snapshot");
            cowlink::sync::sync(&args.src, dst, &options, &observer).map(|r| (r, None))
        }
    });
    spinner.finish();
    let (report, snapshot) = result?;
    if args.json {
        if printer.first.load(Ordering::Relaxed) {
            out!("{{\n  \"changes\": [");
        }
        let mut out = printer.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.flush();
        drop(out);
        match &snapshot {
            Some(snap) => outln!(
                "\n  ],\n  \"summary\": {},\n  \"snapshot\": {}\n}}",
                serde_json::to_string(&report)?,
                serde_json::to_string(snap)?
            ),
            None => outln!(
                "\n  ],\n  \"summary\": {}\n}}",
                serde_json::to_string(&report)?
            ),
        }
    } else if args.dry_run || args.itemize_changes || show_progress {
        errln!("{}", summary_line(&report, start.elapsed()));
    }
    if let (Some(snap), false) = (&snapshot, args.json) {
        let name = snap.snapshot.as_deref().unwrap_or("(none yet)");
        let path = snap.path.as_deref().map(shown).unwrap_or_default();
        if report.dry_run {
            match &snap.snapshot {
                Some(name) => errln!("cowlink sync: dry run against snapshot {name}"),
                None => errln!(
                    "cowlink sync: dry run: {} holds no complete snapshot, so every entry \
                     would be new",
                    shown(args.snapshot.as_deref().unwrap_or(Path::new(".")))
                ),
            }
        } else if snap.completed {
            errln!(
                "cowlink sync: snapshot {name} complete: {path}{}",
                if snap.resumed { " (resumed)" } else { "" }
            );
        } else {
            errln!(
                "cowlink sync: snapshot {name} left in progress, not complete: {path}; the next \
                 run resumes it"
            );
        }
    }
    Ok(if report.cancelled {
        errln!(
            "cowlink sync: interrupted; every name in the destination holds its old or its new \
             content; run again to finish"
        );
        Exit::Interrupted
    } else if report.errors > 0 {
        Exit::Failed
    } else {
        Exit::Ok
    })
}
