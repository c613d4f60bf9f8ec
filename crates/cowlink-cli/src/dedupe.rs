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
/// Works on XFS, Btrfs and other filesystems whose dedupe passes a trial;
/// refuses ext4, tmpfs and ZFS (cannot), NFS and CIFS clients (unsafe:
/// their dedupe has cloned without comparing), and never pairs files of
/// different filesystems.
///
/// Examples:
///   cowlink dedupe --dry-run ~/src     # show what would be shared
///   cowlink dedupe ~/src ~/builds      # do it
///   cowlink dedupe --min-size 1M --json /srv/assets
///   cowlink dedupe --store ~/.cache/cowlink/store ~/projects
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

    /// Print JSON: the plan, and with it the result
    #[arg(long)]
    json: bool,

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
    // The space given back is always measured: --measure asks for nothing
    // more.
    let _always_measured = args.measure;
    let progress = Arc::new(Progress::new());
    let opts = DedupeOptions {
        min_size: args.min_size,
        stores: args.stores.clone(),
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
                count(plan.groups.len() as u64, "duplicate group", "duplicate groups"),
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
