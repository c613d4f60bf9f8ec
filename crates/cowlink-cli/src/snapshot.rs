//! `cowlink snapshot ls|prune`: the snapshot sets `cowlink sync
//! --snapshot` fills, listed with their true usage and pruned by age.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use clap::{Args, Subcommand};
use cowlink::name::shown;
use cowlink::snapshot::{KeepPolicy, Snapshot, SnapshotSet, State, Verdict};
use cowlink::{Progress, Run};
use serde::Serialize;

use crate::out::errln;
use crate::{human_bytes, Exit};

/// List and prune snapshot sets (ROOT/<UTC time>/ clones of each other)
///
/// A snapshot set is a directory ROOT holding one directory per version,
/// named by the UTC time it was begun (20261126T024549.123456Z). Each is a
/// clone of the one before (a Btrfs subvolume snapshot where ROOT is on
/// Btrfs), so unchanged blocks are stored once; bookkeeping lives in
/// ROOT/.cowlink, never inside a snapshot. `cowlink sync --snapshot ROOT
/// SRC/` makes them. A snapshot interrupted while being made is never
/// listed as complete and is resumed, under its name, by the next run.
///
/// prune keeps, as restic and borg do: the N newest (--keep-last), the
/// newest of each of the N newest days that have one (--keep-daily), and
/// the newest of each of the N newest ISO weeks (--keep-weekly), days and
/// weeks in UTC; a snapshot kept by one rule also counts for the others.
/// Whatever the rules, the newest complete snapshot and one in progress
/// are kept. Only snapshots cowlink recorded are removed, and only when
/// their directory is still the one it made; removal never follows a
/// symbolic link and stops at a mount point inside a snapshot.
///
/// Examples:
///   cowlink snapshot ls /backup/home                  # each snapshot: exclusive and shared bytes
///   cowlink snapshot ls --json /backup/home           # every figure, in bytes
///   cowlink snapshot prune /backup/home --keep-daily 7 --keep-weekly 4 -n
///   cowlink snapshot prune /backup/home --keep-last 10
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct SnapshotArgs {
    /// Print JSON on stdout instead of text
    #[arg(long, global = true)]
    json: bool,

    /// Print sizes in bytes instead of KiB/MiB/GiB
    #[arg(short, long, global = true)]
    bytes: bool,

    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// List each snapshot with the bytes only it holds and the bytes it shares
    #[command(
        after_help = "Examples:\n  cowlink snapshot ls /backup/home\n  cowlink snapshot ls -j 4 --json /backup/home"
    )]
    Ls {
        /// Worker threads for the usage walk [default: number of CPUs]
        #[arg(short = 'j', long, value_name = "N", value_parser = crate::threads_arg)]
        threads: Option<usize>,

        /// The snapshot root
        #[arg(value_name = "ROOT", value_parser = crate::PathArg)]
        root: PathBuf,
    },
    /// Remove old snapshots, keeping the newest per rule
    #[command(
        after_help = "Examples:\n  cowlink snapshot prune /backup/home --keep-daily 7 --keep-weekly 4\n  cowlink snapshot prune /backup/home --keep-last 3 --dry-run"
    )]
    Prune {
        /// Keep the N newest complete snapshots
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_last: u32,

        /// Keep the newest snapshot of each of the N newest days (UTC) that have one
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_daily: u32,

        /// Keep the newest snapshot of each of the N newest ISO weeks (UTC) that have one
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep_weekly: u32,

        /// Say what would be removed; remove nothing
        #[arg(short = 'n', long)]
        dry_run: bool,

        /// The snapshot root
        #[arg(value_name = "ROOT", value_parser = crate::PathArg)]
        root: PathBuf,
    },
}

/// Run `cowlink snapshot`.
pub fn run(args: SnapshotArgs) -> Result<Exit> {
    match args.command {
        SnapshotCommand::Ls { threads, ref root } => ls(&args, root, threads),
        SnapshotCommand::Prune {
            keep_last,
            keep_daily,
            keep_weekly,
            dry_run,
            ref root,
        } => {
            let keep = KeepPolicy {
                last: keep_last,
                daily: keep_daily,
                weekly: keep_weekly,
            };
            if keep == KeepPolicy::default() {
                errln!(
                    "cowlink: snapshot prune: give at least one of --keep-last, --keep-daily, --keep-weekly (nothing asked would keep only the newest snapshot)"
                );
                return Ok(Exit::Fatal);
            }
            prune(&args, root, &keep, dry_run)
        }
    }
}

fn state_word(s: &Snapshot) -> &'static str {
    match (s.state, s.present) {
        (_, false) if s.state != State::Complete => "partial",
        (State::Complete, false) => "missing",
        (State::Cloning, _) => "cloning",
        (State::Open, _) => "in-progress",
        (State::Complete, _) => "complete",
        (State::Removing, _) => "removing",
    }
}

fn ls(args: &SnapshotArgs, root: &std::path::Path, threads: Option<usize>) -> Result<Exit> {
    let progress = Arc::new(Progress::new());
    let run = Run::default()
        .with_threads(threads.map_or(0, crate::capped_threads))
        .with_cancel(crate::interrupt::token())
        .with_progress(Arc::clone(&progress));
    let set = SnapshotSet::open_existing(root)?.with_run(run);
    let bar = crate::progress::for_run(!args.json, &progress);
    let listing = crate::interrupt::graceful(|| set.list_usage());
    bar.finish();
    let listing = listing?;
    if listing.cancelled {
        errln!("cowlink: interrupted; nothing was reported");
        return Ok(Exit::Interrupted);
    }
    let mut out = crate::out::stdout();
    if args.json {
        crate::out::json(&mut out, &listing)?;
    } else {
        let size = |n: u64| {
            if args.bytes {
                n.to_string()
            } else {
                human_bytes(n)
            }
        };
        if listing.snapshots.is_empty() {
            writeln!(out, "no snapshots in {}", shown(root))?;
        } else {
            writeln!(
                out,
                "{:<24}  {:<11}  {:>11}  {:>11}  {:>11}",
                "SNAPSHOT", "STATE", "TOTAL", "EXCLUSIVE", "SHARED"
            )?;
        }
        for s in &listing.snapshots {
            let (total, excl, shared) = match &s.usage {
                Some(u) => (
                    size(u.data),
                    size(u.exclusive),
                    if u.disk_known() {
                        size(u.shared)
                    } else {
                        "?".into()
                    },
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            writeln!(
                out,
                "{:<24}  {:<11}  {:>11}  {:>11}  {:>11}",
                s.snapshot.name,
                state_word(&s.snapshot),
                total,
                excl,
                shared
            )?;
        }
        if listing.snapshots.len() > 1 {
            let t = &listing.total;
            writeln!(
                out,
                "{:<24}  {:<11}  {:>11}  {:>11}  {:>11}  on disk {}",
                "all",
                "",
                size(t.data),
                size(t.exclusive),
                if t.disk_known() {
                    size(t.shared)
                } else {
                    "?".into()
                },
                if t.disk_known() {
                    size(t.on_disk)
                } else {
                    "?".into()
                },
            )?;
        }
        out.flush()?;
        for e in &listing.errors {
            errln!("cowlink: {e}");
        }
    }
    Ok(if listing.errors.is_empty() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

#[derive(Serialize)]
struct PruneJson<'a> {
    dry_run: bool,
    cancelled: bool,
    snapshots: Vec<PruneEntry<'a>>,
    errors: &'a [cowlink::Error],
}

#[derive(Serialize)]
struct PruneEntry<'a> {
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    verdict: Verdict,
    /// Kept, or (without --dry-run) removed.
    kept: bool,
    failed: bool,
}

fn prune(
    args: &SnapshotArgs,
    root: &std::path::Path,
    keep: &KeepPolicy,
    dry_run: bool,
) -> Result<Exit> {
    let set = SnapshotSet::open_existing(root)?
        .with_run(Run::default().with_cancel(crate::interrupt::token()));
    let pruned = crate::interrupt::graceful(|| set.prune(keep, dry_run))?;
    let mut out = crate::out::stdout();
    if args.json {
        let snapshots = pruned
            .snapshots
            .iter()
            .map(|(s, v)| PruneEntry {
                snapshot: s,
                verdict: *v,
                kept: v.keeps(),
                failed: pruned.failed.contains(&s.name),
            })
            .collect();
        crate::out::json(
            &mut out,
            &PruneJson {
                dry_run,
                cancelled: pruned.cancelled,
                snapshots,
                errors: &pruned.errors,
            },
        )?;
    } else {
        for (s, v) in &pruned.snapshots {
            let word = match v {
                Verdict::Policy => "keep",
                Verdict::Newest => "keep (newest)",
                Verdict::InUse => "keep (in progress)",
                Verdict::Replaced => "keep (not ours)",
                Verdict::Remove | Verdict::Unfinished if pruned.failed.contains(&s.name) => {
                    "NOT removed"
                }
                Verdict::Remove | Verdict::Unfinished if dry_run => "would remove",
                Verdict::Remove | Verdict::Unfinished => "removed",
            };
            writeln!(out, "{word:<18}  {}", s.name)?;
        }
        out.flush()?;
        for e in &pruned.errors {
            errln!("cowlink: {e}");
        }
    }
    if pruned.cancelled {
        errln!("cowlink: interrupted; the snapshots not listed were not looked at");
        return Ok(Exit::Interrupted);
    }
    Ok(if pruned.errors.is_empty() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}
