//! `cowlink dedupe`: make identical files share their blocks, safely.

use cowlink::name::{quoted, shown};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use cowlink::dedupe::watch::{self as dwatch, Rescan, WatchBatch, WatchOptions, WatchScope};
use cowlink::dedupe::{self, DedupeOptions, DedupePlan, Exclude};
use cowlink::{Progress, Run};
use serde::Serialize;

use crate::out::{count, errln, outln};
use crate::{human_bytes, human_duration, Exit};

/// Reclaim the space of identical files: make them share blocks
///
/// Finds files with identical content (same size, then BLAKE3 of both
/// ends; hard links count once; files already sharing all their blocks
/// are skipped without being read) and asks the kernel to deduplicate
/// them with FIDEDUPERANGE. The kernel compares every byte under lock and
/// shares blocks only if they are equal, so files over 8 KiB are not read
/// whole beforehand: one whose middle differs is then hashed whole and
/// grouped again, and a file written since the scan keeps its new
/// content. --dry-run hashes everything, so the plan it shows is exact.
/// Nothing is ever copied over a file. Times, mode and owner stay as they
/// were.
///
/// Space never grows: a file is shared only if its blocks come back. One
/// whose blocks a snapshot, a reflinked copy or another file also holds
/// (Btrfs names them, to root) is skipped and listed with the reason.
/// XFS does not name them: a file whose shared blocks no other file of its
/// group maps is skipped the same way; one whose shared blocks the group
/// maps too runs last, in small batches with the space in use read around
/// each, and the run stops sharing such files there once a batch grew it.
/// The space reported back is measured: space in use before and after
/// (on Btrfs data and metadata), each after syncing the filesystem (other
/// programs' writes move it too).
///
/// --store DIR makes the objects of a cowlink store sources: a file equal
/// to an object comes to share the object's blocks (a checkout's clones
/// do already); objects are never changed.
///
/// An index per filesystem remembers what each run learnt of each file
/// (its hashes and extent layout, under its inode, size, mtime, ctime
/// and birth time): a rerun reads only files new or changed since, and
/// still finds their duplicates among the others. It lives in
/// /var/lib/cowlink/index for root, else $XDG_STATE_HOME/cowlink/index
/// (~/.local/state/cowlink/index), or $COWLINK_INDEX_DIR where set;
/// --index DIR puts it elsewhere,
/// --no-index runs without. A damaged index, or one of another version,
/// is rebuilt with a message. One in use by another run (a watch, say)
/// is not waited for: this run goes on without it and says so, naming
/// the index.
///
/// Works on XFS, Btrfs and other filesystems whose dedupe passes a trial;
/// refuses ext4, tmpfs and ZFS (cannot), NFS and CIFS clients (unsafe:
/// their dedupe has cloned without comparing), and never pairs files of
/// different filesystems.
///
/// --watch keeps going (root): it dedupes what is there, then follows
/// the filesystem with fanotify and dedupes again a quiet period after
/// files are written or moved in. It stops cleanly on SIGTERM or Ctrl-C
/// and then exits 0. On a Btrfs subvolume other than the top level the
/// kernel refuses a filesystem-wide watch; the mount holding it is
/// watched instead (it says so). --install-unit writes a systemd service
/// that runs the same watch at boot.
///
/// Examples:
///   cowlink dedupe --dry-run ~/src     # show what would be shared
///   cowlink dedupe ~/src ~/builds      # do it
///   cowlink dedupe --min-size 1M --json /srv/assets
///   cowlink dedupe --store ~/.cache/cowlink/store ~/projects
///   cowlink dedupe --exclude '*.tmp' --exclude .git ~/src
///   sudo cowlink dedupe --watch --quiet-period 5s /srv/builds
///   sudo cowlink dedupe --watch --install-unit /srv/builds
///   cowlink dedupe --index /srv/.cowlink-index /srv   # keep the index there
///   cowlink dedupe --no-index /mnt/once               # plan from nothing
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DedupeArgs {
    /// Show the plan (groups, sources, targets, bytes expected) and change
    /// nothing
    #[arg(short = 'n', long)]
    dry_run: bool,

    /// Ignore files smaller than this (bytes; suffixes K, M, G). The default,
    /// 1, takes every non-empty file: on XFS even a 1-byte file holds a
    /// whole block that a duplicate can give back (Btrfs keeps small files
    /// inline in metadata: those are counted as not shareable)
    #[arg(long, value_name = "SIZE", default_value = "1", value_parser = crate::size_arg)]
    min_size: u64,

    /// Worker threads for scanning and hashing [default: number of CPUs]
    #[arg(short = 'j', long, value_name = "N", value_parser = crate::threads_arg)]
    threads: Option<usize>,

    /// Accepted for scripts written before the space given back was always
    /// measured; changes nothing
    #[arg(long, hide = true, conflicts_with = "dry_run")]
    measure: bool,

    /// A cowlink store whose objects serve as sources (repeatable): files
    /// equal to an object share its blocks; objects are never changed
    #[arg(long = "store", value_name = "DIR", value_parser = crate::PathArg)]
    stores: Vec<PathBuf>,

    /// Print JSON: the plan, and with it the result (every group's paths
    /// are then held to the end: more memory on a large tree)
    #[arg(long)]
    json: bool,

    /// Keep the index (one file per filesystem) in this directory
    /// [default: /var/lib/cowlink/index for root, else
    /// $XDG_STATE_HOME/cowlink/index]
    #[arg(long, value_name = "DIR", conflicts_with = "no_index")]
    index: Option<PathBuf>,

    /// Use no index: read every candidate, as if for the first time, and
    /// keep nothing for the next run
    #[arg(long)]
    no_index: bool,

    /// Map again every file the index says shares all its blocks or is
    /// inline (by default one in 16 per run, at random; on Btrfs as root,
    /// every file written since the last run, and no other): extents moved
    /// by a defragment or another tool's dedupe leave the file's times
    /// alone
    #[arg(long, conflicts_with = "no_index")]
    recheck_layouts: bool,

    /// Show every group (source and targets; held to the end, as with
    /// --json)
    #[arg(short, long)]
    verbose: bool,

    /// Leave matching paths alone (repeatable). Without a `/` the pattern
    /// matches a name at any depth (`*.tmp`, `.git`); with one, the path
    /// below the PATH given (`build/out`, `logs/**/*.gz`). An excluded
    /// directory is not entered; an excluded file is never changed nor
    /// used as a source
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,

    /// Keep watching (root): dedupe now, then again after files are
    /// written or moved in (fanotify), until SIGTERM or Ctrl-C
    #[arg(long, conflicts_with = "dry_run")]
    watch: bool,

    /// With --watch: how long no file may change before the changes are
    /// deduplicated (`500ms`, `3s`, `1m`; a bare number is seconds)
    #[arg(long, value_name = "TIME", default_value = "3s", value_parser = duration_arg, requires = "watch")]
    quiet_period: std::time::Duration,

    /// With --watch: most changed paths kept between two runs; past it
    /// they are dropped and the next run rescans every PATH
    #[arg(long, value_name = "N", default_value_t = 16384, requires = "watch")]
    max_pending: usize,

    /// With --watch: write a systemd service that runs this watch at boot
    /// (into --unit-dir), check it with systemd-analyze, and stop
    #[arg(long, requires = "watch")]
    install_unit: bool,

    /// Where --install-unit writes the unit
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/etc/systemd/system",
        requires = "install_unit"
    )]
    unit_dir: PathBuf,

    /// Files and directories to deduplicate
    #[arg(required = true, value_name = "PATH", value_parser = crate::PathArg)]
    paths: Vec<PathBuf>,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    plan: &'a DedupePlan,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a dedupe::DedupeReport>,
    elapsed_ms: u128,
}

/// Run `cowlink dedupe`.
pub fn run(args: DedupeArgs) -> Result<Exit> {
    let exclude = match Exclude::new(&args.exclude) {
        Ok(x) => x,
        Err(e) => {
            errln!("cowlink: {e}");
            return Ok(Exit::Fatal);
        }
    };
    if args.watch {
        return watch(args, exclude);
    }
    let start = Instant::now();
    // The space given back is always measured: --measure asks for nothing
    // more.
    let _always_measured = args.measure;
    let progress = Arc::new(Progress::new());
    let index = index_dir(&args);
    let opts = DedupeOptions {
        min_size: args.min_size,
        stores: args.stores.clone(),
        exclude,
        index,
        layout_recheck: recheck(&args),
        // The groups are printed only with these.
        keep_groups: args.json || args.verbose,
        run: Run::default()
            .with_threads(args.threads.map_or(0, crate::capped_threads))
            .with_cancel(crate::interrupt::token())
            .with_progress(Arc::clone(&progress)),
    };
    let bar = crate::progress::for_run(!args.json, &progress);
    // A dry run only plans; otherwise planning and executing overlap (the
    // small files' groups run while the larger files are still hashed).
    let planned = match args.dry_run {
        true => crate::interrupt::graceful(|| dedupe::plan(&args.paths, &opts)).map(|p| (p, None)),
        false => crate::interrupt::graceful(|| dedupe::dedupe(&args.paths, &opts))
            .map(|(p, r)| (p, Some(r))),
    };
    let (plan, report) = match planned {
        Ok(p) => p,
        Err(_) if crate::interrupt::interrupted() => {
            bar.finish();
            errln!("cowlink: interrupted while planning; nothing was changed");
            return Ok(Exit::Interrupted);
        }
        Err(e) => {
            bar.finish();
            errln!("cowlink: {e}");
            return Ok(Exit::Failed);
        }
    };
    bar.finish();
    if let Some(r) = report.as_ref().filter(|r| r.cancelled) {
        if r.groups == 0 {
            errln!("cowlink: interrupted before any group was started; nothing was changed");
            return Ok(Exit::Interrupted);
        }
        errln!(
            "cowlink: interrupted; groups already done share their blocks, the others were left as they were"
        );
    }
    let cancelled = report.as_ref().is_some_and(|r| r.cancelled);
    let done = |failed: bool| {
        if cancelled {
            Exit::Interrupted
        } else if failed {
            Exit::Failed
        } else {
            Exit::Ok
        }
    };

    let mut out = crate::out::stdout();
    // A file changed since the scan is protected, not a failure.
    let failed = !plan.errors.is_empty() || report.as_ref().is_some_and(|r| !r.errors.is_empty());
    if args.json {
        let result = report.as_ref();
        crate::out::json(
            &mut out,
            &JsonOut {
                plan: &plan,
                result,
                elapsed_ms: start.elapsed().as_millis(),
            },
        )?;
        return Ok(done(failed));
    }

    if args.dry_run || args.verbose {
        for g in &plan.groups {
            writeln!(
                out,
                "{} × {} ({}), {} expected back; source {}",
                g.targets.len(),
                human_bytes(g.size),
                g.blake3.as_deref().map_or("ends equal", |h| &h[..16]),
                human_bytes(g.reclaimable),
                shown(&g.source)
            )?;
            for t in &g.targets {
                writeln!(out, "    {}", shown(t))?;
            }
        }
    }
    for e in &plan.errors {
        errln!("cowlink: {e}");
    }
    if let Some(ix) = &plan.index {
        for n in &ix.notes {
            errln!("cowlink: {n}");
        }
    }
    let mut skipped = format!(
        "skipped: {} already shared, {}, {} inline (not shareable)",
        plan.files_already_shared,
        count(plan.hardlinks_skipped, "hard link", "hard links"),
        plan.inline_skipped
    );
    if plan.not_permitted > 0 {
        skipped += &format!(
            ", {} not yours to change (dedupe needs the owner, write permission or root)",
            plan.not_permitted
        );
    }
    match &report {
        None => writeln!(
            out,
            "dry run: {} scanned, {}, {}, {} expected back, {} hashed; {}; {}",
            count(plan.files_scanned, "file", "files"),
            count(
                plan.groups.len() as u64,
                "duplicate group",
                "duplicate groups"
            ),
            count(plan.targets(), "target", "targets"),
            human_bytes(plan.reclaimable()),
            human_bytes(plan.bytes_hashed),
            skipped,
            human_duration(start.elapsed())
        )?,
        Some(r) => {
            for c in &r.changed {
                errln!(
                    "cowlink: {} changed since it was scanned; left as it is",
                    quoted(c)
                );
            }
            for e in &r.errors {
                errln!("cowlink: {e}");
            }
            for k in &r.skipped {
                errln!("cowlink: {} left as it is: {}", quoted(&k.path), k.detail);
            }
            writeln!(
                out,
                "{} scanned, {}, {} hashed; {} deduplicated, {} reclaimed ({}); {}, {} changed, {}; {}",
                count(plan.files_scanned, "file", "files"),
                count(plan.groups_found, "duplicate group", "duplicate groups"),
                human_bytes(plan.bytes_hashed),
                count(r.targets_deduped, "file", "files"),
                human_bytes(r.bytes_reclaimed),
                match r.measured {
                    true => "measured",
                    false => "not measured everywhere: space in use unreadable",
                },
                skipped,
                r.changed.len(),
                count((r.errors.len() + plan.errors.len()) as u64, "error", "errors"),
                human_duration(start.elapsed())
            )?;
            if !r.skipped.is_empty() {
                writeln!(
                    out,
                    "{} identical to their source but left as they were: sharing them would not give space back",
                    count(r.skipped.len() as u64, "file", "files")
                )?;
            }
            if r.bytes_grown > 0 {
                writeln!(
                    out,
                    "space in use grew by {} during the run (other programs' writes count too)",
                    human_bytes(r.bytes_grown)
                )?;
            }
            if r.regrouped > 0 {
                writeln!(
                    out,
                    "{} their group's first and last 4 KiB but not every byte; {} hashed whole and grouped again",
                    match r.regrouped {
                        1 => "1 file matched".to_string(),
                        n => format!("{n} files matched"),
                    },
                    if r.regrouped == 1 { "it was" } else { "they were" }
                )?;
            }
        }
    }
    if let Some(ix) = &plan.index {
        // On Btrfs, as root: how many were known without a stat.
        let unstated = match ix.unstated {
            0 => String::new(),
            n => format!(", {n} of them not even stat'ed (Btrfs transaction)"),
        };
        // Layouts that changed behind the index (another tool's dedupe,
        // a partner deleted).
        let corrected = match ix.corrected {
            0 => String::new(),
            n => format!(
                " ({} found stale and corrected)",
                count(n, "layout", "layouts")
            ),
        };
        writeln!(
            out,
            "index: {} not read (unchanged){unstated}, {} written{corrected}, {} of files gone removed",
            count(ix.unchanged, "file", "files"),
            count(ix.written, "entry", "entries"),
            count(ix.pruned, "entry", "entries"),
        )?;
    }
    Ok(done(failed))
}

/// `500ms`, `3s`, `2m`, or a bare number of seconds (fractions allowed).
fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" | "min" => 60.0,
        _ => return Err(format!("{s:?}: give a time such as 500ms, 3s or 1m")),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: give a time such as 500ms, 3s or 1m"))?;
    if !v.is_finite() || v < 0.0 || v * scale > 86_400.0 {
        return Err(format!("{s:?}: between 0 and 24 hours"));
    }
    Ok(std::time::Duration::from_secs_f64(v * scale))
}

/// One watch batch as `--json` prints it (one JSON object per line).
#[derive(Serialize)]
struct JsonBatch<'a> {
    changed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    rescan: Option<Rescan>,
    roots: &'a [PathBuf],
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a DedupePlan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a dedupe::DedupeReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    elapsed_ms: u128,
}

/// Where the persistent index lives: `--no-index`, `--index DIR`,
/// `COWLINK_INDEX_DIR` (the default moved: tests, and machines whose
/// /var/lib is read-only), else the library's default for this user.
fn index_dir(args: &DedupeArgs) -> Option<PathBuf> {
    match (args.no_index, &args.index) {
        (true, _) => None,
        (false, Some(dir)) => Some(dir.clone()),
        (false, None) => std::env::var_os("COWLINK_INDEX_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(dedupe::index::default_dir),
    }
}

/// `cowlink dedupe --watch`: each batch is a dedupe over the roots that
/// changed, with the index, so unchanged files are not read again.
/// `--recheck-layouts`: every indexed layout mapped again, else a sample.
fn recheck(args: &DedupeArgs) -> dedupe::LayoutRecheck {
    if args.recheck_layouts {
        dedupe::LayoutRecheck::Every
    } else {
        dedupe::LayoutRecheck::Sample
    }
}

fn watch(args: DedupeArgs, exclude: Exclude) -> Result<Exit> {
    crate::drive::need_root_for(
        "cowlink dedupe --watch",
        "fanotify on a whole filesystem needs CAP_SYS_ADMIN",
    )?;
    if args.install_unit {
        return install_unit(&args);
    }
    let opts = WatchOptions {
        dedupe: DedupeOptions {
            min_size: args.min_size,
            stores: args.stores.clone(),
            exclude,
            index: index_dir(&args),
            layout_recheck: recheck(&args),
            // A batch reports counts only.
            keep_groups: false,
            run: Run::default()
                .with_threads(args.threads.map_or(0, crate::capped_threads))
                .with_cancel(crate::interrupt::token()),
        },
        quiet_period: args.quiet_period,
        max_pending: args.max_pending,
        ..WatchOptions::default()
    };
    let json = args.json;
    let mut started = |scopes: &[WatchScope]| {
        for s in scopes {
            if json {
                if let Ok(line) = serde_json::to_string(&serde_json::json!({ "watching": s })) {
                    outln!("{line}");
                }
                continue;
            }
            let by = match s.mark {
                dwatch::MarkKind::Filesystem => "its whole filesystem",
                dwatch::MarkKind::Mount => "the mount that holds it",
                dwatch::MarkKind::Directories => "marks on each of its directories",
            };
            outln!("watching {} (by {by})", shown(&s.root));
            if let Some(n) = &s.note {
                errln!("cowlink: {}: {n}", shown(&s.root));
            }
        }
    };
    let mut on_batch = |b: &WatchBatch| report_batch(b, json);
    let result =
        crate::interrupt::graceful(|| dwatch::run(&args.paths, &opts, &mut started, &mut on_batch));
    match result {
        Ok(sum) => {
            if json {
                if let Ok(line) = serde_json::to_string(&serde_json::json!({ "stopped": sum })) {
                    outln!("{line}");
                }
            } else {
                outln!(
                    "stopped: {}, {} deduplicated, {} reclaimed, {}",
                    count(sum.batches, "run", "runs"),
                    count(sum.targets_deduped, "file", "files"),
                    human_bytes(sum.bytes_reclaimed),
                    count(sum.errors, "error", "errors")
                );
            }
            // Stopping is how a watch ends: a signal is its normal end.
            Ok(Exit::Ok)
        }
        Err(e) => {
            errln!("cowlink: {e}");
            Ok(Exit::Failed)
        }
    }
}

/// Print one batch: a line (and its errors), or a JSON line.
fn report_batch(b: &WatchBatch, json: bool) {
    let why = match b.rescan {
        Some(Rescan::Start) => "start: every path".to_string(),
        Some(Rescan::QueueOverflow) => "rescan: the kernel's event queue overflowed".to_string(),
        Some(Rescan::PendingFull) => "rescan: more changes than --max-pending".to_string(),
        Some(Rescan::Unreadable) => "rescan: unreadable events".to_string(),
        Some(Rescan::MarkRefused) => "rescan: a new directory could not be watched".to_string(),
        None => count(b.changed as u64, "changed path", "changed paths"),
    };
    if json {
        let (plan, result, error) = match &b.outcome {
            Ok((p, r)) => (Some(p), Some(r), None),
            Err(e) => (None, None, Some(e.to_string())),
        };
        let line = JsonBatch {
            changed: b.changed,
            rescan: b.rescan,
            roots: &b.roots,
            plan,
            result,
            error,
            elapsed_ms: b.elapsed.as_millis(),
        };
        if let Ok(line) = serde_json::to_string(&line) {
            outln!("{line}");
        }
        return;
    }
    match &b.outcome {
        Err(e) => errln!("cowlink: {why}: {e}"),
        Ok((plan, r)) => {
            for e in plan.errors.iter().chain(&r.errors) {
                errln!("cowlink: {e}");
            }
            // An index in use by another run, or rebuilt: as a single
            // run says it.
            for n in plan.index.iter().flat_map(|ix| &ix.notes) {
                errln!("cowlink: {n}");
            }
            outln!(
                "{why}: {} scanned, {}, {} deduplicated, {} reclaimed, {} changed meanwhile; {}",
                count(plan.files_scanned, "file", "files"),
                count(plan.groups_found, "duplicate group", "duplicate groups"),
                count(r.targets_deduped, "file", "files"),
                human_bytes(r.bytes_reclaimed),
                r.changed.len(),
                human_duration(b.elapsed)
            );
        }
    }
}

/// `--install-unit`: write the service, check it, say how to start it.
fn install_unit(args: &DedupeArgs) -> Result<Exit> {
    let program = std::env::current_exe()?;
    let mut roots = Vec::new();
    for p in &args.paths {
        match std::fs::canonicalize(p) {
            Ok(r) => roots.push(r),
            Err(e) => {
                errln!("cowlink: {}: {e}", quoted(p));
                return Ok(Exit::Failed);
            }
        }
    }
    let mut words: Vec<String> = vec!["dedupe".into(), "--watch".into()];
    words.push(format!(
        "--quiet-period={}ms",
        args.quiet_period.as_millis()
    ));
    words.push(format!("--max-pending={}", args.max_pending));
    words.push(format!("--min-size={}", args.min_size));
    if let Some(j) = args.threads {
        words.push(format!("--threads={j}"));
    }
    if args.measure {
        words.push("--measure".into());
    }
    for x in &args.exclude {
        words.push(format!("--exclude={x}"));
    }
    words.push("--".into());
    words.extend(roots.iter().map(|r| r.to_string_lossy().into_owned()));
    let (name, text) = match cowlink_drive::watch_unit(&program, &words, &roots) {
        Ok(u) => u,
        Err(why) => {
            errln!("cowlink: cannot write a systemd unit: {why}");
            return Ok(Exit::Failed);
        }
    };
    let file = match cowlink_drive::write_unit(&args.unit_dir, &name, &text) {
        Ok(f) => f,
        Err(e) => {
            errln!(
                "cowlink: cannot write {}: {e}",
                quoted(&args.unit_dir.join(&name))
            );
            return Ok(Exit::Failed);
        }
    };
    outln!("wrote {}", shown(&file));
    match std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()
    {
        Ok(v) if v.status.success() => outln!("systemd-analyze verify: no complaint"),
        Ok(v) => errln!(
            "cowlink: systemd-analyze verify complains about {}:\n{}",
            quoted(&file),
            String::from_utf8_lossy(&v.stderr).trim_end()
        ),
        Err(_) => errln!("cowlink: systemd-analyze is not installed; the unit was not checked"),
    }
    if std::path::Path::new("/run/systemd/system").is_dir() {
        outln!(
            "start it now and at boot:\n  systemctl daemon-reload && systemctl enable --now {name}"
        );
    } else {
        outln!(
            "systemd is not running here (PID 1 is not systemd): the unit is written, not started; \
             where systemd runs:\n  systemctl enable --now {name}"
        );
    }
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::duration_arg;
    use crate::size_arg as parse_size;

    #[test]
    fn times_with_units() {
        use std::time::Duration;
        assert_eq!(duration_arg("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(duration_arg("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration_arg("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(duration_arg("2"), Ok(Duration::from_secs(2)));
        assert_eq!(duration_arg("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["", "s", "3h", "-1s", "nan", "1e9"] {
            assert!(duration_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("K").is_err());
    }
}
