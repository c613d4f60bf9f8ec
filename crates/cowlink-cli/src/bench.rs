//! `cowlink bench`: the library's [`cowlink::bench`] measures, on the
//! user's own volume, copy vs clone vs hardlink, small-file metadata speed
//! and large-file writer strategies, and decides; this module renders the
//! report (table, JSON, SVG chart) and words the verdict.

use cowlink::name::{quoted, shown};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use clap::Args;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use cowlink::bench::{
    self, Advice, BenchOptions, BenchReport, Latency, Level, SizeRow, Stage, Verdict, WriterAdvice,
};
use cowlink::Run;

use crate::out::errln;
use crate::progress::Spinner;
use crate::{human_bytes, Exit};

/// Measure what to use on this volume: copy, clone or hardlink
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
/// With two directories or more, every workload runs on each of them in
/// the same run, interleaved (each step on every directory before the
/// next step, in turn order A B then B A) so a machine that drifts does
/// not favour one; a table shows each workload side by side with its
/// ratio to the first directory, and a verdict per kind of work says
/// where each directory is slower or faster ("for small-file metadata
/// work /mnt/ram is 1.4× slower than /home/u/src"). Is a RAM disk, a
/// loop-mounted dev drive or a network cache really faster for your
/// work? This is how to know.
///
/// Examples:
///   cowlink bench                       # here
///   cowlink bench /mnt/builds --full --svg latency.svg
///   cowlink bench /srv --quick --json
///   cowlink bench ~/dev "$PWD"          # a dev drive against where you work now
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Where to measure [default: the current directory]; two or more
    /// are compared side by side, ratios relative to the first
    #[arg(value_name = "DIR", value_parser = crate::PathArg)]
    dirs: Vec<PathBuf>,

    /// Fewer repetitions and smaller workloads (a few seconds)
    #[arg(long, conflicts_with = "full")]
    quick: bool,

    /// Add 256 MiB and 1 GiB files and larger writer workloads (minutes)
    #[arg(long)]
    full: bool,

    /// Print the results as JSON
    #[arg(long)]
    json: bool,

    /// Draw the size/latency chart (log scales) as SVG into FILE (one
    /// directory only)
    #[arg(long, value_name = "FILE", value_parser = crate::PathArg)]
    svg: Option<PathBuf>,
}

/// Run `cowlink bench`.
pub fn run(args: BenchArgs) -> Result<Exit> {
    if args.dirs.len() >= 2 {
        return run_compare(args);
    }
    let dir = args
        .dirs
        .first()
        .cloned()
        .unwrap_or_else(|| PathBuf::from("."));
    let options = options(&args);
    let stage = Arc::new(Mutex::new(String::new()));
    let s2 = Arc::clone(&stage);
    let bar = Spinner::start(!args.json, move || {
        s2.lock().unwrap_or_else(|e| e.into_inner()).clone()
    });
    let result = crate::interrupt::graceful(|| {
        bench::bench(&dir, &options, &|s| {
            *stage.lock().unwrap_or_else(|e| e.into_inner()) = describe(s);
        })
    });
    bar.finish();
    if crate::interrupt::interrupted() {
        errln!("cowlink: interrupted; removed the work directory");
        return Ok(Exit::Interrupted);
    }
    let report = result?;
    if let Some(svg) = &args.svg {
        draw_svg(svg, &report).with_context(|| format!("cannot write {}", quoted(svg)))?;
    }
    if args.json {
        // The report as the library gives it, plus the verdict in words.
        let mut v = serde_json::to_value(&report)?;
        v["verdict"]["why"] = why(&report.verdict).into();
        v["verdict"]["writers_why"] = report.verdict.writers.map(writers_why).into();
        let mut out = crate::out::stdout();
        crate::out::json(&mut out, &v)?;
    } else {
        print_text(&report)?;
    }
    Ok(Exit::Ok)
}

/// The level and the run control: Ctrl-C cancels the process's token (see
/// `interrupt`): the current workload stops at its next check and the
/// work directories are removed.
fn options(args: &BenchArgs) -> BenchOptions {
    BenchOptions {
        level: match (args.quick, args.full) {
            (true, _) => Level::Quick,
            (_, true) => Level::Full,
            _ => Level::Standard,
        },
        run: Run::default().with_cancel(crate::interrupt::token()),
    }
}

/// `cowlink bench DIR1 DIR2 …`: the library's interleaved comparison,
/// rendered as one table and a verdict per kind of work.
fn run_compare(args: BenchArgs) -> Result<Exit> {
    if let Some(svg) = &args.svg {
        return Err(anyhow::anyhow!(
            "--svg {} draws one directory's chart; give one DIR, or leave --svg out",
            quoted(svg)
        ));
    }
    let opts = options(&args);
    let stage = Arc::new(Mutex::new(String::new()));
    let s2 = Arc::clone(&stage);
    let bar = Spinner::start(!args.json, move || {
        s2.lock().unwrap_or_else(|e| e.into_inner()).clone()
    });
    let dirs = args.dirs.clone();
    let result = crate::interrupt::graceful(|| {
        bench::compare(&dirs, &opts, &|i, s| {
            *stage.lock().unwrap_or_else(|e| e.into_inner()) =
                format!("{}: {}", shown(&dirs[i]), describe(s));
        })
    });
    bar.finish();
    if crate::interrupt::interrupted() {
        errln!("cowlink: interrupted; removed the work directories");
        return Ok(Exit::Interrupted);
    }
    let c = result?;
    let verdicts = compare_words(&c);
    if args.json {
        let mut v = serde_json::to_value(&c)?;
        for (i, r) in c.reports.iter().enumerate() {
            v["reports"][i]["verdict"]["why"] = why(&r.verdict).into();
        }
        v["verdicts"] = verdicts.into();
        let mut out = crate::out::stdout();
        crate::out::json(&mut out, &v)?;
        return Ok(Exit::Ok);
    }
    let mut out = crate::out::stdout();
    // Columns are lettered; the legend names the directories.
    let letters: Vec<String> = (0..c.dirs.len())
        .map(|i| match i {
            0..=25 => char::from(b'A' + i as u8).to_string(),
            _ => format!("D{i}"),
        })
        .collect();
    for ((l, d), r) in letters.iter().zip(&c.dirs).zip(&c.reports) {
        writeln!(
            out,
            "{l} = {} ({}, reflink {})",
            shown(d),
            r.filesystem,
            match r.reflink.works {
                true => "works".to_string(),
                false => format!(
                    "does not work: {}",
                    r.reflink.reason.as_deref().unwrap_or("")
                ),
            }
        )?;
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec!["workload".to_string()];
    for (i, l) in letters.iter().enumerate() {
        header.push(l.clone());
        if i > 0 {
            header.push(format!("{l} vs {}", letters[0]));
        }
    }
    t.set_header(header);
    for w in &c.workloads {
        let mut row = vec![w.workload.clone()];
        for (i, v) in w.values.iter().enumerate() {
            row.push(match (v, w.unit) {
                (None, _) => "—".into(),
                (Some(x), "µs") => us(*x),
                (Some(x), unit) => format!("{x:.0} {unit}"),
            });
            if i > 0 {
                row.push(w.slowdown[i].map_or("—".into(), ratio_words));
            }
        }
        t.add_row(row);
    }
    writeln!(out, "\n{t}")?;
    writeln!(
        out,
        "\nverdict (geometric mean of each kind's workloads, same run, interleaved):"
    )?;
    for v in &verdicts {
        writeln!(out, "  {v}")?;
    }
    writeln!(out, "\n({:.1} s)", c.elapsed_s)?;
    Ok(Exit::Ok)
}

/// A slowdown as people say it: "1.40× slower", "2.10× faster", "level".
fn ratio_words(x: f64) -> String {
    match x {
        x if x > 1.1 => format!("{x:.2}× slower"),
        x if x < 1.0 / 1.1 => format!("{:.2}× faster", 1.0 / x),
        x => format!("level ({x:.2}×)"),
    }
}

/// One sentence per kind of work and directory after the first.
fn compare_words(c: &bench::Comparison) -> Vec<String> {
    let names: Vec<String> = c.dirs.iter().map(|d| shown(d).into_owned()).collect();
    let mut out = Vec::new();
    for g in &c.groups {
        for i in 1..names.len() {
            let line = match (g.slowdown[i], g.group) {
                (Some(x), grp) => match x {
                    x if x > 1.1 => format!(
                        "for {} {} is {x:.2}× slower than {}",
                        grp.words(),
                        names[i],
                        names[0]
                    ),
                    x if x < 1.0 / 1.1 => format!(
                        "for {} {} is {:.2}× faster than {}",
                        grp.words(),
                        names[i],
                        1.0 / x,
                        names[0]
                    ),
                    x => format!(
                        "for {} {} and {} are level ({x:.2}×, within 10%)",
                        grp.words(),
                        names[i],
                        names[0]
                    ),
                },
                (None, bench::BenchGroup::Clone) => {
                    let (a, b) = (c.reports[0].reflink.works, c.reports[i].reflink.works);
                    match (a, b) {
                        (false, true) => format!(
                            "{} can clone (constant time, no space); {} cannot and must copy",
                            names[i], names[0]
                        ),
                        (true, false) => format!(
                            "{} can clone (constant time, no space); {} cannot and must copy",
                            names[0], names[i]
                        ),
                        _ => format!("neither {} nor {} can clone", names[0], names[i]),
                    }
                }
                (None, grp) => format!(
                    "for {}: no comparison between {} and {}",
                    grp.words(),
                    names[i],
                    names[0]
                ),
            };
            out.push(line);
        }
    }
    out
}

fn describe(s: Stage) -> String {
    match s {
        Stage::Probe => "probing reflink".into(),
        Stage::Sizes(n) => format!("copy vs clone vs hardlink: {}", human_bytes(n)),
        Stage::Metadata(n) => format!("metadata: {n} small files"),
        Stage::Writers(w) => format!("4 writers: {}", w.name()),
    }
}

/// The verdict's method advice in words.
fn why(v: &Verdict) -> String {
    let at = v
        .basis_bytes
        .map_or_else(String::new, |b| format!(" at {}", size(b)));
    match (v.method, v.copy_vs_clone, v.clone_vs_hardlink) {
        (Advice::Clone, Some(cc), Some(ch)) => format!(
            "clone: {cc:.0}× faster than copy{at}, {ch:.1}× {} hardlink but safe \
             (a write to a clone never reaches the original; a hardlink is the same file)",
            if ch >= 1.0 { "slower than" } else { "the time of" }
        ),
        _ if v.basis_bytes.is_none() => format!(
            "copy: no {} measurement to compare with",
            size(bench::REFERENCE_SIZE)
        ),
        (_, Some(cc), _) if v.reflink_reason.is_none() => format!(
            "copy: a clone measured {:.1}× slower than a copy{at} here",
            1.0 / cc
        ),
        _ => format!(
            "copy: reflink does not work here ({}); a hardlink is {:.0}× faster than a copy{at} \
             but write-through (a write through one name changes every name): use it only for files nobody writes",
            v.reflink_reason.as_deref().unwrap_or("no reason given"),
            v.copy_vs_hardlink.unwrap_or(0.0)
        ),
    }
}

/// A workload size: whole MiB as such ("16 MiB"), anything else as usual.
fn size(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => human_bytes(b),
    }
}

/// The writer comparison in words.
fn writers_why(w: WriterAdvice) -> String {
    let frag = match (w.fragments_small, w.fragments_prealloc) {
        (Some(x), Some(y)) => format!("fragments per file {x:.2} → {y:.2}, "),
        _ => String::new(),
    };
    format!(
        "preallocated 1 MiB writes vs unbuffered 8 KiB writes: {frag}write {:.2}×, read-back {:.2}×",
        w.write_ratio, w.readback_ratio
    )
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn print_text(r: &BenchReport) -> Result<()> {
    let mut out = crate::out::stdout();
    writeln!(
        out,
        "{} ({}): reflink {}",
        shown(&r.dir),
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
            w.strategy.name().to_string(),
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
    let method = match r.verdict.method {
        Advice::Clone => "clone",
        Advice::Copy => "copy",
    };
    writeln!(out, "\n4. verdict: use {method}\n   {}", why(&r.verdict))?;
    if let Some(w) = r.verdict.writers {
        writeln!(out, "   {}", writers_why(w))?;
    }
    writeln!(out, "\n({:.1} s)", r.elapsed_s)?;
    Ok(())
}

/// Median latency per size, one series per method, log–log.
fn draw_svg(path: &Path, r: &BenchReport) -> Result<()> {
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
                shown(&r.dir),
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
