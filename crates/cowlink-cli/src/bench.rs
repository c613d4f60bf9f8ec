//! `cowlink bench`: measure, on the user's own volume, copy vs clone vs
//! hardlink, small-file metadata speed, and large-file writer strategies,
//! then say which method to use here.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use cowlink::{clone_file, CancelToken, CloneOptions, PreallocWriter, Reflink};
use serde::Serialize;

use crate::out::errln;
use crate::progress::Spinner;
use crate::{human_bytes, Exit};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Measure what to use on this volume: copy, clone or hardlink.
///
/// Runs in DIR (default: the current directory) inside a temporary
/// directory that is removed afterwards, also on Ctrl-C:
///
///   1. copy vs clone vs hardlink of one source per file size (0 B to
///      16 MiB; --full adds 256 MiB and 1 GiB), N times each: median, min,
///      max, ratios;
///   2. small-file metadata work: create, stat, read and delete 10,000
///      files (the pattern that made "faster" RAM-disk CI agents slower);
///   3. 4 concurrent writers streaming large files with 8 KiB or 1 MiB
///      writes, with and without preallocation: throughput, fragments per
///      file (FIEMAP) and read-back speed with the page cache dropped;
///   4. a verdict: which link method to use here and why, and whether
///      reflink works at all (with the probe's reason).
///
/// The default run takes well under 30 seconds; --quick a few seconds;
/// --full minutes (and needs ~3 GiB free).
///
/// Examples:
///   cowlink bench                       # here
///   cowlink bench /mnt/builds --full --svg latency.svg
///   cowlink bench /srv --quick --json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Where to measure [default: the current directory]
    #[arg(value_name = "DIR", value_parser = crate::PathArg)]
    dir: Option<PathBuf>,

    /// Fewer repetitions and smaller workloads (a few seconds)
    #[arg(long, conflicts_with = "full")]
    quick: bool,

    /// Add 256 MiB and 1 GiB files and larger writer workloads (minutes)
    #[arg(long)]
    full: bool,

    /// Print the results as JSON
    #[arg(long)]
    json: bool,

    /// Draw the size/latency chart (log scales) as SVG into FILE
    #[arg(long, value_name = "FILE", value_parser = crate::PathArg)]
    svg: Option<PathBuf>,
}

/// Workload sizes for a run level.
struct Plan {
    sizes: Vec<u64>,
    copies: usize,
    meta_files: usize,
    writer_files: usize,
    writer_file_size: u64,
}

impl Plan {
    fn new(quick: bool, full: bool) -> Plan {
        let mut sizes = vec![0, 1, KIB, 16 * KIB, 256 * KIB, MIB, 16 * MIB];
        if full {
            sizes.extend([256 * MIB, 1024 * MIB]);
        }
        match (quick, full) {
            (true, _) => Plan {
                sizes,
                copies: 5,
                meta_files: 2000,
                writer_files: 2,
                writer_file_size: 8 * MIB,
            },
            (_, true) => Plan {
                sizes,
                copies: 10,
                meta_files: 10_000,
                writer_files: 4,
                writer_file_size: 64 * MIB,
            },
            _ => Plan {
                sizes,
                copies: 15,
                meta_files: 10_000,
                writer_files: 2,
                writer_file_size: 32 * MIB,
            },
        }
    }
}

/// Latency of one operation over N runs, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    median_us: f64,
    min_us: f64,
    max_us: f64,
}

impl Latency {
    fn of(mut v: Vec<Duration>) -> Latency {
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

#[derive(Debug, Serialize)]
struct SizeRow {
    bytes: u64,
    copies: usize,
    copy: Latency,
    clone: Option<Latency>,
    hardlink: Latency,
    /// copy median / clone median.
    copy_vs_clone: Option<f64>,
    /// clone median / hardlink median.
    clone_vs_hardlink: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Metadata {
    files: usize,
    create_per_s: f64,
    stat_per_s: f64,
    read_per_s: f64,
    delete_per_s: f64,
}

#[derive(Debug, Serialize)]
struct WriterRow {
    strategy: &'static str,
    writers: usize,
    files: usize,
    bytes: u64,
    /// Writing and syncing, MB/s (10^6 bytes).
    write_mb_per_s: f64,
    /// Fragments per file (FIEMAP), when the filesystem reports extents.
    fragments_per_file: Option<f64>,
    /// Reading every file back after dropping its cached pages, MB/s.
    readback_mb_per_s: f64,
}

#[derive(Debug, Serialize)]
struct ReflinkWorks {
    works: bool,
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct Verdict {
    /// "clone" or "copy".
    method: &'static str,
    why: String,
    writers: String,
}

#[derive(Debug, Serialize)]
struct Report {
    dir: PathBuf,
    filesystem: String,
    reflink: ReflinkWorks,
    sizes: Vec<SizeRow>,
    metadata: Metadata,
    writers: Vec<WriterRow>,
    verdict: Verdict,
    elapsed_s: f64,
}

/// Where the run stands, for the progress line.
#[derive(Default)]
struct Stage(Mutex<String>);

impl Stage {
    fn set(&self, s: impl Into<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = s.into();
    }
    fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Removes the work directory however the run ends.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Run `cowlink bench`.
pub fn run(args: BenchArgs) -> Result<Exit> {
    let start = Instant::now();
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let meta = fs::metadata(&dir).with_context(|| format!("cannot use '{}'", dir.display()))?;
    if !meta.is_dir() {
        bail!("'{}' is not a directory", dir.display());
    }
    let plan = Plan::new(args.quick, args.full);
    let work = WorkDir(dir.join(format!(".cowlink-bench-{}", std::process::id())));
    fs::create_dir(&work.0)
        .with_context(|| format!("cannot create a work directory in '{}'", dir.display()))?;
    // Ctrl-C cancels the process's token (see `interrupt`): the current
    // workload stops at its next check and the work directory is removed.
    let stop = crate::interrupt::token();
    let stage = Arc::new(Stage::default());
    let s2 = Arc::clone(&stage);
    let bar = Spinner::start(!args.json, move || s2.get());
    let result = crate::interrupt::graceful(|| measure(&work.0, &dir, &plan, &stage, &stop));
    bar.finish();
    drop(work);
    if stop.is_cancelled() {
        errln!("cowlink: interrupted; removed the work directory");
        return Ok(Exit::Interrupted);
    }
    let mut report = result?;
    report.elapsed_s = start.elapsed().as_secs_f64();
    if let Some(svg) = &args.svg {
        draw_svg(svg, &report).with_context(|| format!("cannot write '{}'", svg.display()))?;
    }
    if args.json {
        let mut out = crate::out::stdout();
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_text(&report)?;
    }
    Ok(Exit::Ok)
}

fn check(stop: &CancelToken) -> Result<()> {
    if stop.is_cancelled() {
        bail!("interrupted");
    }
    Ok(())
}

/// Deterministic, incompressible bytes.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn write_source(path: &Path, size: u64) -> Result<()> {
    let mut f = File::create(path)?;
    let mut buf = vec![0u8; (size.min(MIB)) as usize];
    let mut left = size;
    let mut seed = size + 1;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n], seed);
        f.write_all(&buf[..n])?;
        left -= n as u64;
        seed += 1;
    }
    f.sync_all()?;
    Ok(())
}

fn measure(
    work: &Path,
    dir: &Path,
    plan: &Plan,
    stage: &Stage,
    stop: &CancelToken,
) -> Result<Report> {
    stage.set("probing reflink");
    let facts = cowlink::probe::filesystem(work)?;
    let works = facts.reflink.is_yes();
    let reflink = ReflinkWorks {
        works,
        reason: facts.reflink.reason().map(str::to_owned),
    };
    let filesystem = facts.kind.to_string();

    // 1. copy vs clone vs hardlink per size.
    let mut sizes = Vec::new();
    let copy_opts = CloneOptions {
        reflink: Reflink::Never,
        ..Default::default()
    };
    let clone_opts = CloneOptions {
        reflink: Reflink::Always,
        ..Default::default()
    };
    for &size in &plan.sizes {
        stage.set(format!("copy vs clone vs hardlink: {}", human_bytes(size)));
        let src = work.join(format!("src-{size}"));
        write_source(&src, size)?;
        let dst = work.join("dst");
        let time = |op: &dyn Fn() -> Result<()>| -> Result<Latency> {
            let mut v = Vec::with_capacity(plan.copies);
            for _ in 0..plan.copies {
                check(stop)?;
                let t = Instant::now();
                op()?;
                v.push(t.elapsed());
                fs::remove_file(&dst)?;
            }
            Ok(Latency::of(v))
        };
        let copy = time(&|| {
            clone_file(&src, &dst, &copy_opts)
                .map(drop)
                .map_err(Into::into)
        })?;
        let clone = if works {
            Some(time(&|| {
                clone_file(&src, &dst, &clone_opts)
                    .map(drop)
                    .map_err(Into::into)
            })?)
        } else {
            None
        };
        let hardlink = time(&|| fs::hard_link(&src, &dst).map_err(Into::into))?;
        fs::remove_file(&src)?;
        sizes.push(SizeRow {
            bytes: size,
            copies: plan.copies,
            copy,
            clone,
            hardlink,
            copy_vs_clone: clone.map(|c| copy.median_us / c.median_us),
            clone_vs_hardlink: clone.map(|c| c.median_us / hardlink.median_us),
        });
    }

    // 2. metadata-heavy small files.
    stage.set(format!("metadata: {} small files", plan.meta_files));
    let metadata = metadata_workload(&work.join("meta"), plan.meta_files, stop)?;

    // 3. concurrent large-file writers.
    let mut writers = Vec::new();
    for strategy in Strategy::ALL {
        check(stop)?;
        stage.set(format!("4 writers: {}", strategy.name()));
        writers.push(writer_workload(
            &work.join(strategy.name()),
            strategy,
            plan,
            stop,
        )?);
    }

    let verdict = verdict(&reflink, &sizes, &writers);
    Ok(Report {
        dir: dir.to_path_buf(),
        filesystem,
        reflink,
        sizes,
        metadata,
        writers,
        verdict,
        elapsed_s: 0.0,
    })
}

fn metadata_workload(dir: &Path, n: usize, stop: &CancelToken) -> Result<Metadata> {
    fs::create_dir(dir)?;
    let names: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("f{i:05}.o"))).collect();
    let mut body = [0u8; 100];
    fill(&mut body, 7);
    let rate = |t: Instant| n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for p in &names {
        File::create(p)?.write_all(&body)?;
    }
    let create_per_s = rate(t);
    check(stop)?;
    let t = Instant::now();
    for p in &names {
        fs::metadata(p)?;
    }
    let stat_per_s = rate(t);
    let t = Instant::now();
    let mut buf = Vec::with_capacity(128);
    for p in &names {
        buf.clear();
        File::open(p)?.read_to_end(&mut buf)?;
    }
    let read_per_s = rate(t);
    check(stop)?;
    let t = Instant::now();
    for p in &names {
        fs::remove_file(p)?;
    }
    let delete_per_s = rate(t);
    fs::remove_dir(dir)?;
    Ok(Metadata {
        files: n,
        create_per_s,
        stat_per_s,
        read_per_s,
        delete_per_s,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    Small,
    Large,
    PreallocSmall,
    PreallocLarge,
}

impl Strategy {
    const ALL: [Strategy; 4] = [
        Strategy::Small,
        Strategy::Large,
        Strategy::PreallocSmall,
        Strategy::PreallocLarge,
    ];

    fn name(self) -> &'static str {
        match self {
            Strategy::Small => "small-8k",
            Strategy::Large => "buffered-1m",
            Strategy::PreallocSmall => "prealloc+small-8k",
            Strategy::PreallocLarge => "prealloc+buffered-1m",
        }
    }

    fn chunk(self) -> usize {
        match self {
            Strategy::Small | Strategy::PreallocSmall => 8 * KIB as usize,
            Strategy::Large | Strategy::PreallocLarge => MIB as usize,
        }
    }
}

/// Write one file of `size` bytes from `data` (cycled) with `strategy`.
fn write_one(path: &Path, size: u64, strategy: Strategy, data: &[u8]) -> Result<()> {
    let chunk = strategy.chunk();
    let mut left = size;
    let mut pos = 0usize;
    let mut next = |w: &mut dyn Write| -> Result<()> {
        while left > 0 {
            let n = (left as usize).min(chunk).min(data.len() - pos);
            w.write_all(&data[pos..pos + n])?;
            pos = (pos + n) % data.len();
            left -= n as u64;
        }
        Ok(())
    };
    match strategy {
        Strategy::Small => next(&mut File::create(path)?),
        Strategy::Large => {
            let mut w = BufWriter::with_capacity(chunk, File::create(path)?);
            next(&mut w)?;
            w.flush().map_err(Into::into)
        }
        Strategy::PreallocSmall | Strategy::PreallocLarge => {
            let mut w = PreallocWriter::create(path, size)?;
            next(&mut w)?;
            w.finish().map(drop).map_err(Into::into)
        }
    }
}

fn writer_workload(
    dir: &Path,
    strategy: Strategy,
    plan: &Plan,
    stop: &CancelToken,
) -> Result<WriterRow> {
    const WRITERS: usize = 4;
    fs::create_dir(dir)?;
    let mut data = vec![0u8; 4 * MIB as usize];
    fill(&mut data, 11);
    let size = plan.writer_file_size;
    let t = Instant::now();
    let results: Vec<Result<Vec<PathBuf>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let data = &data;
                s.spawn(move || -> Result<Vec<PathBuf>> {
                    let mut paths = Vec::new();
                    for f in 0..plan.writer_files {
                        check(stop)?;
                        let p = dir.join(format!("w{w}-f{f}"));
                        write_one(&p, size, strategy, data)?;
                        paths.push(p);
                    }
                    Ok(paths)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a writer thread panicked"))
            })
            .collect()
    });
    let mut paths = Vec::new();
    for r in results {
        paths.extend(r?);
    }
    rustix::fs::syncfs(File::open(dir)?)?;
    let write_s = t.elapsed().as_secs_f64();
    let bytes = size * paths.len() as u64;
    let frags: Option<Vec<u64>> = paths
        .iter()
        .map(|p| cowlink::extents::extents(p).ok().map(|l| l.fragments))
        .collect();
    // Read back with the cache dropped (pages are clean after syncfs).
    let t = Instant::now();
    let mut buf = vec![0u8; MIB as usize];
    for p in &paths {
        check(stop)?;
        let mut f = File::open(p)?;
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
        let mut h = blake3::Hasher::new();
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        std::hint::black_box(h.finalize());
    }
    let read_s = t.elapsed().as_secs_f64();
    fs::remove_dir_all(dir)?;
    Ok(WriterRow {
        strategy: strategy.name(),
        writers: WRITERS,
        files: paths.len(),
        bytes,
        write_mb_per_s: bytes as f64 / 1e6 / write_s,
        fragments_per_file: frags.map(|f| f.iter().sum::<u64>() as f64 / f.len().max(1) as f64),
        readback_mb_per_s: bytes as f64 / 1e6 / read_s,
    })
}

fn verdict(reflink: &ReflinkWorks, sizes: &[SizeRow], writers: &[WriterRow]) -> Verdict {
    let at16 = sizes.iter().find(|r| r.bytes == 16 * MIB);
    let (method, why) = match at16 {
        Some(SizeRow { copy_vs_clone: Some(cc), clone_vs_hardlink: Some(ch), .. }) => (
            "clone",
            format!(
                "clone: {cc:.0}× faster than copy at 16 MiB, {ch:.1}× {} hardlink but safe \
                 (a write to a clone never reaches the original; a hardlink is the same file)",
                if *ch >= 1.0 { "slower than" } else { "the time of" }
            ),
        ),
        Some(r) => (
            "copy",
            format!(
                "copy: reflink does not work here ({}); a hardlink is {:.0}× faster than a copy at 16 MiB \
                 but write-through (a write through one name changes every name): use it only for files nobody writes",
                reflink.reason.as_deref().unwrap_or("no reason given"),
                r.copy.median_us / r.hardlink.median_us
            ),
        ),
        None => ("copy", "no 16 MiB measurement".into()),
    };
    let get = |s: Strategy| writers.iter().find(|w| w.strategy == s.name());
    let writers = match (get(Strategy::Small), get(Strategy::PreallocLarge)) {
        (Some(a), Some(b)) => {
            let frag = match (a.fragments_per_file, b.fragments_per_file) {
                (Some(x), Some(y)) => format!("fragments per file {x:.2} → {y:.2}, "),
                _ => String::new(),
            };
            format!(
                "preallocated 1 MiB writes vs unbuffered 8 KiB writes: {frag}write {:.2}×, read-back {:.2}×",
                b.write_mb_per_s / a.write_mb_per_s,
                b.readback_mb_per_s / a.readback_mb_per_s
            )
        }
        _ => String::new(),
    };
    Verdict {
        method,
        why,
        writers,
    }
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn print_text(r: &Report) -> Result<()> {
    let mut out = crate::out::stdout();
    writeln!(
        out,
        "{} ({}): reflink {}",
        r.dir.display(),
        r.filesystem,
        if r.reflink.works {
            "works".to_string()
        } else {
            format!(
                "does not work: {}",
                r.reflink.reason.as_deref().unwrap_or("")
            )
        }
    )?;
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "size",
        "copy (median, min–max)",
        "clone",
        "hardlink",
        "copy/clone",
        "clone/hardlink",
    ]);
    let lat = |l: &Latency| format!("{} ({}–{})", us(l.median_us), us(l.min_us), us(l.max_us));
    for s in &r.sizes {
        t.add_row([
            human_bytes(s.bytes),
            lat(&s.copy),
            s.clone.as_ref().map_or("—".into(), lat),
            lat(&s.hardlink),
            s.copy_vs_clone.map_or("—".into(), |x| format!("{x:.1}×")),
            s.clone_vs_hardlink
                .map_or("—".into(), |x| format!("{x:.1}×")),
        ]);
    }
    writeln!(
        out,
        "\n1. one source, {} operations per size\n{t}",
        r.sizes.first().map_or(0, |s| s.copies)
    )?;
    let m = &r.metadata;
    writeln!(
        out,
        "\n2. {} small files: create {:.0}/s, stat {:.0}/s, open+read {:.0}/s, delete {:.0}/s",
        m.files, m.create_per_s, m.stat_per_s, m.read_per_s, m.delete_per_s
    )?;
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "strategy",
        "files",
        "write+sync MB/s",
        "fragments/file",
        "read-back MB/s",
    ]);
    for w in &r.writers {
        t.add_row([
            w.strategy.to_string(),
            format!(
                "{} × {}",
                w.files,
                human_bytes(w.bytes / w.files.max(1) as u64)
            ),
            format!("{:.0}", w.write_mb_per_s),
            w.fragments_per_file
                .map_or("—".into(), |f| format!("{f:.2}")),
            format!("{:.0}", w.readback_mb_per_s),
        ]);
    }
    writeln!(out, "\n3. 4 concurrent writers\n{t}")?;
    writeln!(
        out,
        "\n4. verdict: use {}\n   {}",
        r.verdict.method, r.verdict.why
    )?;
    if !r.verdict.writers.is_empty() {
        writeln!(out, "   {}", r.verdict.writers)?;
    }
    writeln!(out, "\n({:.1} s)", r.elapsed_s)?;
    Ok(())
}

/// Median latency per size, one series per method, log–log.
fn draw_svg(path: &Path, r: &Report) -> Result<()> {
    use plotters::prelude::*;
    let pts = |f: &dyn Fn(&SizeRow) -> Option<f64>| -> Vec<(f64, f64)> {
        // Log scales cannot show 0 bytes: the chart starts at 1 byte.
        r.sizes
            .iter()
            .filter(|s| s.bytes > 0)
            .filter_map(|s| f(s).map(|v| (s.bytes as f64, v.max(0.1))))
            .collect()
    };
    type Series = (&'static str, RGBColor, Vec<(f64, f64)>);
    let series: Vec<Series> = [
        ("copy", RED, pts(&|s| Some(s.copy.median_us))),
        ("clone", BLUE, pts(&|s| s.clone.map(|c| c.median_us))),
        ("hardlink", GREEN, pts(&|s| Some(s.hardlink.median_us))),
    ]
    .into_iter()
    .filter(|(_, _, p)| !p.is_empty())
    .collect();
    let xmax = r.sizes.iter().map(|s| s.bytes).max().unwrap_or(1).max(2) as f64 * 2.0;
    let ymin = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(f64::MAX, f64::min)
        / 2.0;
    let ymax = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 2.0;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} ({}): median latency per file",
                r.dir.display(),
                r.filesystem
            ),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (0.5f64..xmax).log_scale(),
            (ymin.max(0.05)..ymax).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("file size (bytes)")
        .y_desc("latency (µs)")
        .x_label_formatter(&|v| human_bytes(*v as u64))
        .draw()?;
    for (name, color, points) in series {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
