//! `cowlink dedupe`: make identical files share their blocks, safely.

use cowlink::name::{quoted, shown};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use cowlink::dedupe::{self, DedupeOptions, DedupePlan};
use cowlink::{Progress, Run};
use serde::Serialize;

use crate::out::{count, errln};
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
/// were. The space reported back is what the files now sharing held
/// alone, read from their extent maps while planning; --measure measures
/// the free space instead.
///
/// An index per filesystem remembers what each run learnt of each file
/// (its hashes and extent layout, under its inode, size, mtime, ctime
/// and birth time): a rerun reads only files new or changed since, and
/// still finds their duplicates among the others. It lives in
/// /var/lib/cowlink/index for root, else $XDG_STATE_HOME/cowlink/index
/// (~/.local/state/cowlink/index), or $COWLINK_INDEX_DIR where set;
/// --index DIR puts it elsewhere,
/// --no-index runs without. A damaged index, or one of another version,
/// is rebuilt with a message; one in use by another run is left alone.
///
/// Works on XFS, Btrfs and other filesystems whose dedupe passes a trial;
/// refuses ext4, tmpfs and ZFS (cannot), NFS and CIFS clients (unsafe:
/// their dedupe has cloned without comparing), and never pairs files of
/// different filesystems.
///
/// Examples:
///   cowlink dedupe --dry-run ~/src     # show what would be shared
///   cowlink dedupe ~/src ~/builds      # do it
///   cowlink dedupe --min-size 1M --json /srv/assets
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

    /// Measure the space given back: free space before and after, each
    /// after syncing the filesystem. Slower (waits for the filesystem to
    /// commit, other programs' pending writes included), and on a busy
    /// filesystem their writes move the figure. Without it, the figure
    /// comes from the files' extent maps
    #[arg(long, conflicts_with = "dry_run")]
    measure: bool,

    /// Print JSON: the plan, and with it the result
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

    /// Show every group (source and targets)
    #[arg(short, long)]
    verbose: bool,

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
    let start = Instant::now();
    let progress = Arc::new(Progress::new());
    let index = match (args.no_index, &args.index) {
        (true, _) => None,
        (false, Some(dir)) => Some(dir.clone()),
        // COWLINK_INDEX_DIR: the default moved (tests, and machines
        // whose /var/lib is read-only).
        (false, None) => std::env::var_os("COWLINK_INDEX_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(dedupe::index::default_dir),
    };
    let opts = DedupeOptions {
        min_size: args.min_size,
        measure: args.measure,
        index,
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
            writeln!(
                out,
                "{} scanned, {}, {} hashed; {} deduplicated, {} reclaimed ({}); {}, {} changed, {}; {}",
                count(plan.files_scanned, "file", "files"),
                count(plan.groups.len() as u64, "duplicate group", "duplicate groups"),
                human_bytes(plan.bytes_hashed),
                count(r.targets_deduped, "file", "files"),
                human_bytes(r.bytes_reclaimed),
                match r.measured {
                    true => "measured",
                    false => "from extent maps",
                },
                skipped,
                r.changed.len(),
                count((r.errors.len() + plan.errors.len()) as u64, "error", "errors"),
                human_duration(start.elapsed())
            )?;
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
        writeln!(
            out,
            "index: {} not read (unchanged), {} written, {} of files gone removed",
            count(ix.unchanged, "file", "files"),
            count(ix.written, "entry", "entries"),
            count(ix.pruned, "entry", "entries"),
        )?;
    }
    Ok(done(failed))
}

#[cfg(test)]
mod tests {
    use crate::size_arg as parse_size;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("K").is_err());
    }
}
