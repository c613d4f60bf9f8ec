//! [`compare`]: every workload of [`bench`](fn@super::bench) on several
//! directories in one run, interleaved, with ratios and a verdict per
//! group of workloads — the check that a "faster" volume (a RAM disk, a
//! loop-mounted drive, a network cache) is not slower for the work at
//! hand.
//!
//! Interleaving: the workloads run as steps (one file size, the metadata
//! loop, one writer strategy), and each step runs on every directory
//! before the next step starts, in turn order A B C then C B A, so a
//! machine that warms up or slows down over the run does not favour the
//! directory measured first.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::{BenchOptions, BenchPlan, BenchReport, Parts, Site, Stage, Strategy};
use crate::ground::error::{Error, ErrorKind, Operation};

/// A family of workloads judged together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchGroup {
    /// Copying files (no clone), all sizes.
    Copy,
    /// Cloning files, all sizes.
    Clone,
    /// Making hard links.
    Hardlink,
    /// Creating, stating, reading and deleting small files.
    Metadata,
    /// Streaming large files from 4 writers.
    Write,
    /// Reading large files back with the cache dropped.
    ReadBack,
}

impl BenchGroup {
    /// The group in words, for a verdict sentence.
    pub fn words(self) -> &'static str {
        match self {
            BenchGroup::Copy => "copying files",
            BenchGroup::Clone => "cloning files",
            BenchGroup::Hardlink => "hard links",
            BenchGroup::Metadata => "small-file metadata work",
            BenchGroup::Write => "large-file writes",
            BenchGroup::ReadBack => "large-file reads",
        }
    }
}

/// One workload measured on every directory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadResult {
    /// What was measured ("copy 16.0 MiB", "metadata stat", "write buffered-1m").
    pub workload: String,
    /// Its group.
    pub group: BenchGroup,
    /// The unit of [`values`](Self::values): "µs" (lower is better) or a
    /// rate, "files/s" or "MB/s" (higher is better).
    pub unit: &'static str,
    /// The value per directory, in the order given (`None`: not possible
    /// there, e.g. cloning where reflink does not work).
    pub values: Vec<Option<f64>>,
    /// Time per directory relative to the first directory: 1.4 means 1.4×
    /// slower than the first, 0.5 twice as fast.
    pub slowdown: Vec<Option<f64>>,
}

/// One group's verdict: the geometric mean of its workloads' slowdowns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupResult {
    /// The group.
    pub group: BenchGroup,
    /// Per directory, relative to the first (`None` where the group could
    /// not run, e.g. no reflink).
    pub slowdown: Vec<Option<f64>>,
}

/// Everything [`compare`] measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The directories, in the order given.
    pub dirs: Vec<PathBuf>,
    /// The full report of each directory (as [`bench`](fn@super::bench)
    /// gives it, with its own verdict).
    pub reports: Vec<BenchReport>,
    /// Every workload side by side.
    pub workloads: Vec<WorkloadResult>,
    /// One line per group.
    pub groups: Vec<GroupResult>,
    /// Wall time of the whole run, in seconds.
    pub elapsed_s: f64,
}

/// One step of the interleaved run.
#[derive(Debug, Clone, Copy)]
enum Step {
    Size(u64),
    Metadata,
    Writer(Strategy),
}

/// Measure every workload of [`bench`](fn@super::bench) in each of
/// `dirs`, interleaved (see the module documentation); `stage` hears which
/// directory (by index) is doing what.
///
/// # Errors
/// Fewer than two directories (`InvalidInput`), the same directory twice,
/// or any error [`bench`](fn@super::bench) can give, for the directory it
/// names. Every work directory is removed in every case.
pub fn compare(
    dirs: &[PathBuf],
    options: &BenchOptions,
    stage: &(dyn Fn(usize, Stage) + Sync),
) -> Result<Comparison, Error> {
    let op = Operation::Bench;
    let start = Instant::now();
    if dirs.len() < 2 {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_reason("comparing needs two directories or more"));
    }
    let resolved: Vec<PathBuf> = dirs
        .iter()
        .map(|d| std::fs::canonicalize(d).map_err(|e| Error::from_io(op, &e).with_src(d)))
        .collect::<Result<_, _>>()?;
    for (i, r) in resolved.iter().enumerate() {
        if resolved[..i].contains(r) {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&dirs[i])
                .with_reason("given twice: compare different directories"));
        }
    }
    let stages: Vec<Box<dyn Fn(Stage) + Sync + '_>> = (0..dirs.len())
        .map(|i| Box::new(move |s| stage(i, s)) as Box<dyn Fn(Stage) + Sync>)
        .collect();
    let sites: Vec<Site> = dirs
        .iter()
        .zip(&stages)
        .map(|(d, st)| Site::open(d, st.as_ref()))
        .collect::<Result<_, _>>()?;
    let plan = BenchPlan::new(options.level);
    let mut steps: Vec<Step> = plan.sizes.iter().map(|&s| Step::Size(s)).collect();
    steps.push(Step::Metadata);
    steps.extend(Strategy::ALL.map(Step::Writer));

    let mut parts: Vec<Parts> = sites.iter().map(|_| Parts::default()).collect();
    for (k, step) in steps.iter().enumerate() {
        let mut order: Vec<usize> = (0..sites.len()).collect();
        if k % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let site = &sites[i];
            let w = site.workloads(&plan, &options.run, stages[i].as_ref());
            let p = &mut parts[i];
            match *step {
                Step::Size(size) => p.sizes.push(w.size_row(size, site.reflink.works)?),
                Step::Metadata => p.metadata = Some(w.metadata()?),
                Step::Writer(s) => p.writers.push(w.writer(s)?),
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let reports: Vec<BenchReport> = sites
        .into_iter()
        .zip(parts)
        .map(|(s, p)| s.report(p, elapsed))
        .collect();
    let workloads = side_by_side(&reports);
    let groups = group_results(&workloads, reports.len());
    Ok(Comparison {
        dirs: dirs.to_vec(),
        reports,
        workloads,
        groups,
        elapsed_s: elapsed,
    })
}

fn size_words(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// Every workload of `reports` in one row each.
fn side_by_side(reports: &[BenchReport]) -> Vec<WorkloadResult> {
    let mut rows = Vec::new();
    let mut push = |workload: String, group, unit, values: Vec<Option<f64>>| {
        let higher_better = unit != "µs";
        let base = values[0];
        let slowdown = values
            .iter()
            .map(|v| match (base, *v) {
                (Some(b), Some(v)) if b > 0.0 && v > 0.0 => {
                    Some(if higher_better { b / v } else { v / b })
                }
                _ => None,
            })
            .collect();
        rows.push(WorkloadResult {
            workload,
            group,
            unit,
            values,
            slowdown,
        });
    };
    let first = &reports[0];
    for (i, row) in first.sizes.iter().enumerate() {
        let at = |f: &dyn Fn(&super::SizeRow) -> Option<f64>| -> Vec<Option<f64>> {
            reports.iter().map(|r| r.sizes.get(i).and_then(f)).collect()
        };
        let sz = size_words(row.bytes);
        push(
            format!("copy {sz}"),
            BenchGroup::Copy,
            "µs",
            at(&|s| Some(s.copy.median_us)),
        );
        push(
            format!("clone {sz}"),
            BenchGroup::Clone,
            "µs",
            at(&|s| s.clone.map(|c| c.median_us)),
        );
        push(
            format!("hardlink {sz}"),
            BenchGroup::Hardlink,
            "µs",
            at(&|s| Some(s.hardlink.median_us)),
        );
    }
    let meta = |f: &dyn Fn(&super::Metadata) -> f64| -> Vec<Option<f64>> {
        reports.iter().map(|r| Some(f(&r.metadata))).collect()
    };
    push(
        "metadata create".into(),
        BenchGroup::Metadata,
        "files/s",
        meta(&|m| m.create_per_s),
    );
    push(
        "metadata stat".into(),
        BenchGroup::Metadata,
        "files/s",
        meta(&|m| m.stat_per_s),
    );
    push(
        "metadata read".into(),
        BenchGroup::Metadata,
        "files/s",
        meta(&|m| m.read_per_s),
    );
    push(
        "metadata delete".into(),
        BenchGroup::Metadata,
        "files/s",
        meta(&|m| m.delete_per_s),
    );
    for (i, w) in first.writers.iter().enumerate() {
        let at = |f: &dyn Fn(&super::WriterRow) -> f64| -> Vec<Option<f64>> {
            reports.iter().map(|r| r.writers.get(i).map(f)).collect()
        };
        let name = w.strategy.name();
        push(
            format!("write {name}"),
            BenchGroup::Write,
            "MB/s",
            at(&|w| w.write_mb_per_s),
        );
        push(
            format!("read back {name}"),
            BenchGroup::ReadBack,
            "MB/s",
            at(&|w| w.readback_mb_per_s),
        );
    }
    rows
}

/// The geometric mean of each group's slowdowns, per directory.
fn group_results(rows: &[WorkloadResult], n: usize) -> Vec<GroupResult> {
    let groups = [
        BenchGroup::Copy,
        BenchGroup::Clone,
        BenchGroup::Hardlink,
        BenchGroup::Metadata,
        BenchGroup::Write,
        BenchGroup::ReadBack,
    ];
    groups
        .into_iter()
        .map(|g| {
            let slowdown = (0..n)
                .map(|i| {
                    let v: Vec<f64> = rows
                        .iter()
                        .filter(|r| r.group == g)
                        .filter_map(|r| r.slowdown[i])
                        .collect();
                    (!v.is_empty())
                        .then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
                })
                .collect();
            GroupResult { group: g, slowdown }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: BenchGroup, unit: &'static str, values: &[Option<f64>]) -> WorkloadResult {
        let higher = unit != "µs";
        let b = values[0];
        WorkloadResult {
            workload: "w".into(),
            group,
            unit,
            values: values.to_vec(),
            slowdown: values
                .iter()
                .map(|x| b.zip(*x).map(|(b, x)| if higher { b / x } else { x / b }))
                .collect(),
        }
    }

    #[test]
    fn groups_take_the_geometric_mean_and_skip_what_could_not_run() {
        let rows = vec![
            row(
                BenchGroup::Metadata,
                "files/s",
                &[Some(1000.0), Some(500.0)],
            ),
            row(
                BenchGroup::Metadata,
                "files/s",
                &[Some(1000.0), Some(2000.0)],
            ),
            row(BenchGroup::Copy, "µs", &[Some(10.0), Some(40.0)]),
            row(BenchGroup::Clone, "µs", &[None, Some(5.0)]),
        ];
        let g = group_results(&rows, 2);
        let of = |k: BenchGroup| g.iter().find(|r| r.group == k).unwrap().slowdown.clone();
        // 2× slower and 2× faster cancel out.
        assert!((of(BenchGroup::Metadata)[1].unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(of(BenchGroup::Copy), [Some(1.0), Some(4.0)]);
        assert_eq!(of(BenchGroup::Clone), [None, None]);
        assert_eq!(of(BenchGroup::Write), [None, None]);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size_words(0), "0 B");
        assert_eq!(size_words(16 << 10), "16 KiB");
        assert_eq!(size_words(16 << 20), "16 MiB");
    }
}
