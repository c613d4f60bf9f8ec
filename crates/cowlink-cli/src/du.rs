//! `cowlink du`: how much space files really take when blocks are shared.

use cowlink::name::shown;
use std::cmp::Ordering;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use cowlink::usage::{self, PathUsage, Usage, UsageOptions};
use cowlink::{Progress, Run};
use serde::Serialize;

use crate::out::errln;
use crate::{human_bytes, Exit};

/// Show true disk usage: exclusive, shared and saved bytes of a tree
///
/// `du` counts a cloned file twice; `cowlink du` maps every file's extents
/// (FIEMAP, any filesystem that has it: XFS, Btrfs, ext4, bcachefs...) and
/// counts each block of the disk once. Columns:
///
///   TOTAL      data bytes the files reference (a clone counts in full)
///   EXCLUSIVE  bytes no other file or snapshot references
///   SHARED     distinct bytes shared (inside the path or with files outside
///              it); with EXCLUSIVE, what the path really occupies
///   OUTSIDE    the part of SHARED shared only with files outside the path
///   SAVED      TOTAL - EXCLUSIVE - SHARED: space sharing saves in the path
///
/// Hard links count once, symbolic links are not followed, directories'
/// own sizes are not counted. TOTAL, EXCLUSIVE and SHARED are the "Total",
/// "Exclusive" and "Set shared" of `btrfs filesystem du`, and work on XFS.
///
/// Examples:
///   cowlink du -s build/          # one line: the whole tree
///   cowlink du cache/ worktrees/  # every directory, each argument, the set
///   cowlink du -s --json dir      # every figure, in bytes
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DuArgs {
    /// Show only one line per argument (and the set), not every directory
    #[arg(short, long)]
    summarize: bool,

    /// Print sizes in bytes instead of KiB/MiB/GiB
    #[arg(short, long)]
    bytes: bool,

    /// Worker threads [default: number of CPUs]
    #[arg(short = 'j', long, value_name = "N", value_parser = crate::threads_arg)]
    threads: Option<usize>,

    /// Print JSON (every figure, in bytes)
    #[arg(long)]
    json: bool,

    /// Files and directories to measure
    #[arg(required = true, value_name = "PATH", value_parser = crate::PathArg)]
    paths: Vec<PathBuf>,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    total: &'a Usage,
    args: &'a [PathUsage],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    dirs: &'a [PathUsage],
    errors: &'a [cowlink::Error],
}

/// Run `cowlink du`.
pub fn run(args: DuArgs) -> Result<Exit> {
    let progress = Arc::new(Progress::new());
    let opts = UsageOptions {
        per_dir: !args.summarize,
        run: Run::default()
            .with_threads(args.threads.map_or(0, crate::capped_threads))
            .with_cancel(crate::interrupt::token())
            .with_progress(Arc::clone(&progress)),
    };
    let bar = crate::progress::for_run(!args.json, &progress);
    let report = crate::interrupt::graceful(|| usage::usage_report(&args.paths, &opts));
    bar.finish();
    if report.cancelled {
        // Figures of a partial walk would read as the answer: none.
        errln!("cowlink: interrupted; nothing was reported");
        return Ok(Exit::Interrupted);
    }
    let mut out = crate::out::stdout();
    if args.json {
        crate::out::json(
            &mut out,
            &JsonOut {
                total: &report.total,
                args: &report.args,
                dirs: &report.dirs,
                errors: &report.errors,
            },
        )?;
    } else {
        let size = |n: u64| {
            if args.bytes {
                n.to_string()
            } else {
                human_bytes(n)
            }
        };
        // Disk figures of compressed extents whose size could not be read
        // are unknown: "?", never a wrong number.
        let disk = |u: &Usage, n: u64| {
            if u.disk_known() {
                size(n)
            } else {
                "?".to_string()
            }
        };
        let row = |out: &mut dyn Write, u: &Usage, name: &str| {
            writeln!(
                out,
                "{:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {}",
                size(u.data),
                size(u.exclusive),
                disk(u, u.shared),
                disk(u, u.shared_outside),
                disk(u, u.saved),
                name
            )
        };
        // A path that could not be read has its error, not a 0 B row.
        let readable: Vec<&PathUsage> = report
            .args
            .iter()
            .filter(|a| {
                a.usage != Usage::default()
                    || !report
                        .errors
                        .iter()
                        .any(|e| e.src() == Some(a.path.as_path()))
            })
            .collect();
        if !readable.is_empty() {
            writeln!(
                out,
                "{:>11}  {:>11}  {:>11}  {:>11}  {:>11}  PATH",
                "TOTAL", "EXCLUSIVE", "SHARED", "OUTSIDE", "SAVED"
            )?;
        }
        let mut dirs: Vec<&PathUsage> = report.dirs.iter().collect();
        // Children before their parents, as du prints.
        dirs.sort_by(|a, b| post_order(&a.path, &b.path));
        let args_paths: Vec<&Path> = report.args.iter().map(|a| a.path.as_path()).collect();
        for d in dirs {
            if !args_paths.contains(&d.path.as_path()) {
                row(&mut out, &d.usage, &shown(&d.path))?;
            }
        }
        for a in &readable {
            row(&mut out, &a.usage, &shown(&a.path))?;
        }
        if report.args.len() > 1 {
            row(&mut out, &report.total, "total (the set)")?;
        }
        out.flush()?;
        if !report.total.disk_known() {
            errln!(
                "cowlink: {} of compressed data: its size on disk is read from Btrfs's extent items, which takes root; shared and saved figures are unknown (?)",
                human_bytes(report.total.unknown_disk)
            );
        }
    }
    if !args.json {
        for e in &report.errors {
            errln!("cowlink: {e}");
        }
    }
    Ok(if report.errors.is_empty() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// Path order in which every directory comes after everything below it.
fn post_order(a: &Path, b: &Path) -> Ordering {
    let (mut x, mut y) = (a.components(), b.components());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Greater,
            (Some(_), None) => return Ordering::Less,
            (Some(p), Some(q)) if p == q => continue,
            (Some(p), Some(q)) => return name(p).cmp(name(q)),
        }
    }
}

fn name(c: Component<'_>) -> &std::ffi::OsStr {
    c.as_os_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_come_after_their_contents() {
        let mut v = vec!["a", "a/b", "a/b/c", "a/d", "ab"];
        v.sort_by(|x, y| post_order(Path::new(x), Path::new(y)));
        assert_eq!(v, vec!["a/b/c", "a/b", "a/d", "a", "ab"]);
    }
}
