//! Measure, on a volume, what to use there: copy, clone or hardlink.
//!
//! [`bench`](fn@bench) runs three workloads inside a temporary directory that is
//! removed however the run ends (also on cancel):
//!
//! 1. copy vs clone vs hardlink of one source per file size (0 B to
//!    16 MiB; [`Level::Full`] adds 256 MiB and 1 GiB), N times each:
//!    median, min, max and the ratios;
//! 2. small-file metadata work: create, stat, read and delete thousands of
//!    files (the pattern that makes "faster" RAM-disk CI agents slower);
//! 3. four concurrent writers streaming large files with 8 KiB or 1 MiB
//!    writes, with and without preallocation: throughput, fragments per
//!    file (FIEMAP) and read-back speed with the cache dropped.
//!
//! Then [`verdict()`] (pure: numbers in, a decision and the numbers behind
//! it out) says which method to use and why. Rendering (tables, JSON, the
//! SVG chart, the words of the verdict) is the front end's.
//!
//! Layout: this file has the options, the report types and the driver;
//! `workloads` the three measurements; `verdict` the decision.

mod compare;
mod verdict;
mod workloads;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

pub use compare::{compare, BenchGroup, Comparison, GroupResult, WorkloadResult};
pub use verdict::{verdict, Advice, Verdict, WriterAdvice, REFERENCE_SIZE};
pub use workloads::Strategy;

use crate::ground::error::{Error, ErrorKind, Operation};
use crate::run::Run;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// How much to measure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Level {
    /// Fewer repetitions and smaller workloads: a few seconds.
    Quick,
    /// Well under 30 seconds.
    #[default]
    Standard,
    /// Adds 256 MiB and 1 GiB files and larger writers: minutes, ~3 GiB.
    Full,
}

/// Workload sizes for a [`Level`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPlan {
    /// File sizes for the copy/clone/hardlink comparison.
    pub sizes: Vec<u64>,
    /// Operations timed per size and method.
    pub copies: usize,
    /// Files in the metadata workload.
    pub meta_files: usize,
    /// Files each of the 4 writers writes.
    pub writer_files: usize,
    /// Size of each writer's file.
    pub writer_file_size: u64,
}

impl BenchPlan {
    /// The workloads of `level`.
    pub fn new(level: Level) -> BenchPlan {
        let mut sizes = vec![0, 1, KIB, 16 * KIB, 256 * KIB, MIB, 16 * MIB];
        if level == Level::Full {
            sizes.extend([256 * MIB, 1024 * MIB]);
        }
        let (copies, meta_files, writer_files, writer_file_size) = match level {
            Level::Quick => (5, 2000, 2, 8 * MIB),
            Level::Standard => (15, 10_000, 2, 32 * MIB),
            Level::Full => (10, 10_000, 4, 64 * MIB),
        };
        BenchPlan {
            sizes,
            copies,
            meta_files,
            writer_files,
            writer_file_size,
        }
    }
}

/// Options for [`bench`](fn@bench).
#[derive(Debug, Clone, Default)]
pub struct BenchOptions {
    /// How much to measure.
    pub level: Level,
    /// Cancellation (threads are fixed by the workloads: 4 writers).
    pub run: Run,
}

/// What the run is doing, for a progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Asking the filesystem whether it can clone.
    Probe,
    /// Timing copy, clone and hardlink of one file of this size.
    Sizes(u64),
    /// The small-file metadata workload, with this many files.
    Metadata(usize),
    /// The 4-writer workload with this strategy.
    Writers(Strategy),
}

/// Latency of one operation over N runs, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    /// Median.
    pub median_us: f64,
    /// Fastest run.
    pub min_us: f64,
    /// Slowest run.
    pub max_us: f64,
}

impl Latency {
    /// Median, min and max of `v`.
    ///
    /// # Panics
    /// If `v` is empty (every [`BenchPlan`] times at least 5 operations).
    pub fn of(mut v: Vec<Duration>) -> Latency {
        v.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let n = v.len();
        let median = if n % 2 == 1 {
            us(v[n / 2])
        } else {
            (us(v[n / 2 - 1]) + us(v[n / 2])) / 2.0
        };
        Latency {
            median_us: median,
            min_us: us(v[0]),
            max_us: us(v[n - 1]),
        }
    }
}

/// Copy, clone and hardlink of one file size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeRow {
    /// The file size.
    pub bytes: u64,
    /// Operations timed per method.
    pub copies: usize,
    /// Copying without cloning.
    pub copy: Latency,
    /// Cloning (`None` where reflink does not work).
    pub clone: Option<Latency>,
    /// Making a hard link.
    pub hardlink: Latency,
    /// Copy median / clone median.
    pub copy_vs_clone: Option<f64>,
    /// Clone median / hardlink median.
    pub clone_vs_hardlink: Option<f64>,
}

/// The small-file metadata workload's rates (operations per second).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metadata {
    /// Files in the workload.
    pub files: usize,
    /// Creating and writing 100 bytes.
    pub create_per_s: f64,
    /// `stat`.
    pub stat_per_s: f64,
    /// Opening and reading to the end.
    pub read_per_s: f64,
    /// Deleting.
    pub delete_per_s: f64,
}

/// One writer strategy's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WriterRow {
    /// The strategy.
    pub strategy: Strategy,
    /// Concurrent writers.
    pub writers: usize,
    /// Files written in all.
    pub files: usize,
    /// Bytes written in all.
    pub bytes: u64,
    /// Writing and syncing, MB/s (10^6 bytes).
    pub write_mb_per_s: f64,
    /// Fragments per file (FIEMAP), when the filesystem reports extents.
    pub fragments_per_file: Option<f64>,
    /// Reading every file back after dropping its cached pages, MB/s.
    pub readback_mb_per_s: f64,
}

/// Whether reflink works on the volume, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReflinkWorks {
    /// A trial clone succeeded.
    pub works: bool,
    /// The probe's reason when it did not.
    pub reason: Option<String>,
}

/// Everything a run measured, and the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// Where it ran.
    #[serde(flatten, serialize_with = "crate::name::json::dir")]
    pub dir: PathBuf,
    /// The filesystem's name.
    pub filesystem: String,
    /// Whether reflink works there.
    pub reflink: ReflinkWorks,
    /// Copy/clone/hardlink per size.
    pub sizes: Vec<SizeRow>,
    /// The small-file workload.
    pub metadata: Metadata,
    /// The writer workloads, one row per [`Strategy`].
    pub writers: Vec<WriterRow>,
    /// What to use, from the numbers above.
    pub verdict: Verdict,
    /// Wall time of the whole run, in seconds.
    pub elapsed_s: f64,
}

/// Removes the work directory however the run ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One directory being measured: its work directory and what the probe
/// said about it.
struct Site {
    dir: PathBuf,
    work: WorkDir,
    filesystem: String,
    reflink: ReflinkWorks,
}

impl Site {
    /// Check `dir`, make the work directory in it, probe reflink there.
    fn open(dir: &Path, stage: &(dyn Fn(Stage) + Sync)) -> Result<Site, Error> {
        let op = Operation::Bench;
        let meta = std::fs::metadata(dir).map_err(|e| Error::from_io(op, &e).with_src(dir))?;
        if !meta.is_dir() {
            return Err(Error::new(op, ErrorKind::NotADirectory).with_src(dir));
        }
        let work = WorkDir(dir.join(format!(".cowlink-bench-{}", std::process::id())));
        std::fs::create_dir(&work.0).map_err(|e| {
            Error::from_io(op, &e)
                .with_src(dir)
                .with_reason(format!("cannot create a work directory there: {e}"))
        })?;
        stage(Stage::Probe);
        let facts = crate::probe::filesystem(&work.0)?;
        Ok(Site {
            dir: dir.to_path_buf(),
            work,
            filesystem: facts.kind.to_string(),
            reflink: ReflinkWorks {
                works: facts.reflink.is_yes(),
                reason: facts.reflink.reason().map(str::to_owned),
            },
        })
    }

    fn workloads<'a>(
        &'a self,
        plan: &'a BenchPlan,
        run: &'a Run,
        stage: &'a (dyn Fn(Stage) + Sync),
    ) -> workloads::Workloads<'a> {
        workloads::Workloads {
            work: &self.work.0,
            plan,
            run,
            stage,
        }
    }

    /// The report from measurements made here (removes the work directory).
    fn report(self, parts: Parts, elapsed_s: f64) -> BenchReport {
        let verdict = verdict(&self.reflink, &parts.sizes, &parts.writers);
        BenchReport {
            dir: self.dir,
            filesystem: self.filesystem,
            reflink: self.reflink,
            sizes: parts.sizes,
            metadata: parts.metadata.expect("every run measures metadata"),
            writers: parts.writers,
            verdict,
            elapsed_s,
        }
    }
}

/// The measurements of one directory, as they arrive.
#[derive(Default)]
struct Parts {
    sizes: Vec<SizeRow>,
    metadata: Option<Metadata>,
    writers: Vec<WriterRow>,
}

/// Measure in the directory `dir` (see the module documentation), telling
/// `stage` what is being measured as the run goes.
///
/// # Errors
/// `dir` is not a directory, a work directory cannot be made in it, a
/// workload fails (the error names the file), or the run was cancelled
/// ([`ErrorKind::Cancelled`]). The work directory is removed in every case.
pub fn bench(
    dir: impl AsRef<Path>,
    options: &BenchOptions,
    stage: &(dyn Fn(Stage) + Sync),
) -> Result<BenchReport, Error> {
    let dir = dir.as_ref();
    let start = Instant::now();
    let site = Site::open(dir, stage)?;
    let plan = BenchPlan::new(options.level);
    let w = site.workloads(&plan, &options.run, stage);
    let parts = Parts {
        sizes: w.sizes(site.reflink.works)?,
        metadata: Some(w.metadata()?),
        writers: w.writers()?,
    };
    Ok(site.report(parts, start.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_takes_the_middle_of_sorted_runs() {
        let ms = |v: &[u64]| v.iter().map(|&m| Duration::from_millis(m)).collect();
        let odd = Latency::of(ms(&[9, 1, 5]));
        assert_eq!(
            (odd.median_us, odd.min_us, odd.max_us),
            (5000.0, 1000.0, 9000.0)
        );
        let even = Latency::of(ms(&[4, 1, 2, 8]));
        assert_eq!(even.median_us, 3000.0);
    }

    #[test]
    fn plans_grow_with_the_level() {
        let (q, s, f) = (
            BenchPlan::new(Level::Quick),
            BenchPlan::new(Level::Standard),
            BenchPlan::new(Level::Full),
        );
        assert_eq!(q.sizes, s.sizes);
        assert_eq!(f.sizes.last(), Some(&(1024 * MIB)));
        assert!(q.copies < s.copies && q.meta_files < s.meta_files);
        assert!(s.writer_file_size < f.writer_file_size);
    }
}
