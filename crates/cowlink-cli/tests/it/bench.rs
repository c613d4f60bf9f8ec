//! `cowlink bench --quick` on the real test filesystems: what it reports
//! where reflink works (XFS) and where it does not (ext4), that it leaves
//! the directory as it found it, and its SVG chart.

use std::fs;
use std::path::Path;
use std::process::Output;

use cowlink_testfs::{names, testfs};

use crate::common;
use crate::common::{cowlink, text};

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

/// Run `bench --quick --json --svg` in `root/here` (holding one file of
/// ours); check the directory is left as found and the common fields.
fn quick(root: &Path) -> (serde_json::Value, String) {
    let here = root.join("here");
    fs::create_dir(&here).unwrap();
    fs::write(here.join("mine.txt"), b"keep me").unwrap();
    let before = names(&here);
    let svg = root.join("chart.svg");
    let r = json(&cowlink(&[
        &"bench", &here, &"--quick", &"--json", &"--svg", &svg,
    ]));
    assert_eq!(names(&here), before, "bench leaves DIR as it found it");
    assert_eq!(fs::read(here.join("mine.txt")).unwrap(), b"keep me");
    let sizes = r["sizes"].as_array().unwrap();
    let bytes: Vec<u64> = sizes.iter().map(|s| s["bytes"].as_u64().unwrap()).collect();
    assert_eq!(bytes, [0, 1, 1024, 16384, 262144, 1 << 20, 16 << 20]);
    for s in sizes {
        for m in ["copy", "hardlink"] {
            let l = &s[m];
            let (min, med, max) = (
                l["min_us"].as_f64().unwrap(),
                l["median_us"].as_f64().unwrap(),
                l["max_us"].as_f64().unwrap(),
            );
            assert!(
                0.0 < min && min <= med && med <= max,
                "{m} at {}: {l}",
                s["bytes"]
            );
        }
    }
    assert_eq!(r["metadata"]["files"], 2000);
    for k in ["create_per_s", "stat_per_s", "read_per_s", "delete_per_s"] {
        assert!(r["metadata"][k].as_f64().unwrap() > 0.0, "{k}");
    }
    let writers = r["writers"].as_array().unwrap();
    let strategies: Vec<&str> = writers
        .iter()
        .map(|w| w["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        strategies,
        [
            "small-8k",
            "buffered-1m",
            "prealloc+small-8k",
            "prealloc+buffered-1m"
        ]
    );
    for w in writers {
        assert_eq!(w["writers"], 4);
        assert_eq!(w["bytes"], 8 * (8 << 20), "8 files of 8 MiB");
        assert!(w["fragments_per_file"].as_f64().unwrap() >= 1.0, "{w}");
        assert!(
            w["write_mb_per_s"].as_f64().unwrap() > 0.0
                && w["readback_mb_per_s"].as_f64().unwrap() > 0.0
        );
    }
    (r, fs::read_to_string(&svg).unwrap())
}

/// The SVG parses as XML and has one coloured line per method, labelled.
fn series(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("invalid SVG: {e}"));
    let mut strokes: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter_map(|n| n.attribute("stroke"))
        .filter(|s| *s != "#000000")
        .collect();
    strokes.sort();
    strokes.dedup();
    let labels: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .filter(|t| ["copy", "clone", "hardlink"].contains(t))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        strokes.len(),
        labels.len(),
        "one line per labelled series: {strokes:?} {labels:?}"
    );
    labels
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn xfs_clone_works_and_beats_copy_at_16_mib() {
    let x = testfs!(Xfs);
    let (r, svg) = quick(x.path());
    assert_eq!(r["reflink"]["works"], true, "{}", r["reflink"]);
    assert_eq!(r["filesystem"], "xfs");
    let big = &r["sizes"][6];
    assert!(
        big["clone"]["median_us"].as_f64().unwrap() < big["copy"]["median_us"].as_f64().unwrap(),
        "clone faster than copy at 16 MiB: {big}"
    );
    assert!(big["copy_vs_clone"].as_f64().unwrap() > 1.0);
    assert_eq!(r["verdict"]["method"], "clone");
    assert!(r["verdict"]["why"]
        .as_str()
        .unwrap()
        .contains("faster than copy at 16 MiB"));
    assert_eq!(series(&svg), ["copy", "clone", "hardlink"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ext4_says_why_reflink_fails_and_still_measures() {
    let e = testfs!(Ext4);
    let (r, svg) = quick(e.path());
    assert_eq!(r["reflink"]["works"], false);
    let reason = r["reflink"]["reason"].as_str().unwrap();
    assert!(reason.contains("ext4"), "{reason}");
    for s in r["sizes"].as_array().unwrap() {
        assert!(s["clone"].is_null() && s["copy_vs_clone"].is_null(), "{s}");
    }
    assert_eq!(r["verdict"]["method"], "copy");
    assert!(r["verdict"]["why"].as_str().unwrap().contains(reason));
    assert_eq!(series(&svg), ["copy", "hardlink"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn text_output_and_bad_directories() {
    let x = testfs!(Xfs);
    let out = cowlink(&[&"bench", &x.path(), &"--quick"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for want in [
        "reflink works",
        "copy/clone",
        "small files",
        "prealloc+buffered-1m",
        "verdict: use clone",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    assert!(names(x.path()).is_empty());
    // A missing path is an operation that failed (1), as everywhere.
    let out = cowlink(&[&"bench", &x.path().join("missing")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("missing"),
        "{}",
        text(&out.stderr)
    );
    fs::write(x.path().join("file"), b"").unwrap();
    let out = cowlink(&[&"bench", &x.path().join("file")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a directory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sigint_stops_the_bench_and_removes_its_work_directory() {
    let x = testfs!(Xfs);
    let child = common::bin()
        .arg("bench")
        .arg(x.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let work = x.path().join(format!(".cowlink-bench-{}", child.id()));
    let start = std::time::Instant::now();
    while !fs::read_dir(&work).is_ok_and(|mut d| d.next().is_some()) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "no work started"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    common::sigint(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("removed the work directory"));
    assert!(!work.exists(), "the work directory was left behind");
    assert!(names(x.path()).is_empty(), "{:?}", names(x.path()));
}

/// `bench A B --quick --json`: both directories measured in one run, every
/// workload with a value per directory and a ratio to the first, a verdict
/// per kind of work; both left as found.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn two_directories_are_compared_workload_by_workload() {
    let (x, e) = (testfs!(Xfs), testfs!(Ext4));
    let (a, b) = (e.path().to_path_buf(), x.path().to_path_buf());
    let (before_a, before_b) = (names(&a), names(&b));
    let r = json(&cowlink(&[&"bench", &a, &b, &"--quick", &"--json"]));
    assert_eq!((names(&a), names(&b)), (before_a, before_b));
    let reports = r["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0]["filesystem"], "ext4");
    assert_eq!(reports[1]["filesystem"], "xfs");
    assert_eq!(reports[0]["reflink"]["works"], false);
    assert_eq!(reports[1]["reflink"]["works"], true);
    let workloads = r["workloads"].as_array().unwrap();
    // 7 sizes × (copy, clone, hardlink) + 4 metadata + 4 writers × 2.
    assert_eq!(workloads.len(), 7 * 3 + 4 + 4 * 2);
    for w in workloads {
        let name = w["workload"].as_str().unwrap();
        let values = w["values"].as_array().unwrap();
        let slow = w["slowdown"].as_array().unwrap();
        assert_eq!((values.len(), slow.len()), (2, 2), "{name}");
        if name.starts_with("clone ") {
            // ext4 cannot clone: no value there, so no ratio.
            assert!(
                values[0].is_null() && values[1].as_f64().unwrap() > 0.0,
                "{w}"
            );
            assert!(slow[1].is_null(), "{w}");
            continue;
        }
        let (v0, v1) = (values[0].as_f64().unwrap(), values[1].as_f64().unwrap());
        assert!(v0 > 0.0 && v1 > 0.0, "{w}");
        assert_eq!(slow[0].as_f64(), Some(1.0), "{w}");
        // The ratio is the values' ratio, time up or rate down.
        let expect = match w["unit"].as_str().unwrap() {
            "µs" => v1 / v0,
            _ => v0 / v1,
        };
        assert!(
            (slow[1].as_f64().unwrap() - expect).abs() < 1e-9 * expect,
            "{w}"
        );
    }
    let verdicts: Vec<&str> = r["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(verdicts.len(), 6, "{verdicts:?}");
    assert!(verdicts
        .iter()
        .any(|v| v.starts_with("for small-file metadata work ")));
    assert!(
        verdicts
            .iter()
            .any(|v| v.contains("can clone") && v.contains("cannot and must copy")),
        "{verdicts:?}"
    );

    // One directory twice, or a chart of two: refused, nothing made.
    let same = cowlink(&[&"bench", &a, &a, &"--quick"]);
    assert_eq!(same.status.code(), Some(2), "{}", text(&same.stderr));
    assert!(text(&same.stderr).contains("given twice"));
    let svg = e.path().join("c.svg");
    let chart = cowlink(&[&"bench", &a, &b, &"--quick", &"--svg", &svg]);
    assert_eq!(chart.status.code(), Some(2));
    assert!(!svg.exists());
}
