//! `cowlink snapshot ls|prune` on the real test filesystems: the listing's
//! figures and JSON, prune's verdicts, dry run, exit codes, and what it
//! never touches. The snapshots are made through the library (`cowlink
//! sync --snapshot` makes them from the command line).

use std::fs;
use std::path::Path;

use cowlink::snapshot::SnapshotSet;
use cowlink_testfs::{data, testfs};

use crate::common::{cowlink, json, ok, text};

/// Three complete snapshots under `root`: `same` written in the first
/// and cloned into the others, `changes` rewritten in each; their names.
fn three(root: &Path) -> Vec<String> {
    let set = SnapshotSet::open(root).unwrap();
    (0..3u64)
        .map(|i| {
            let b = set.begin().unwrap();
            if i == 0 {
                fs::write(b.path().join("same"), data(256 << 10, 9)).unwrap();
            }
            fs::write(b.path().join("changes"), data(64 << 10, i)).unwrap();
            b.complete().unwrap().name
        })
        .collect()
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ls_shows_each_snapshot_with_exclusive_and_shared_bytes() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let names = three(&root);
    let open = SnapshotSet::open(&root)
        .unwrap()
        .begin()
        .unwrap()
        .name()
        .to_string();
    rustix::fs::sync();
    let out = cowlink(&[&"snapshot", &"ls", &"--bytes", &root]);
    let s = ok(&out);
    let lines: Vec<&str> = s.lines().collect();
    assert!(lines[0].starts_with("SNAPSHOT"), "{s}");
    // The first two hold their own version of `changes` alone (rewritten
    // in the next, not cloned) and share `same` with the others; the third
    // shares everything with the one in progress, its clone.
    let want = [
        (64u64 << 10, 256u64 << 10),
        (64 << 10, 256 << 10),
        (0, 320 << 10),
    ];
    for ((line, name), (excl, shared)) in lines[1..4].iter().zip(&names).zip(want) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w[..2], [name.as_str(), "complete"], "{s}");
        assert_eq!(w[2], (320u64 << 10).to_string(), "total: {s}");
        assert_eq!(w[3], excl.to_string(), "exclusive: {s}");
        assert_eq!(w[4], shared.to_string(), "shared: {s}");
    }
    let w: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(w[..2], [open.as_str(), "in-progress"], "{s}");
    assert_eq!(w[3..5], ["0", &(320u64 << 10).to_string()], "{s}");
    // Distinct bytes: `same` once, `changes` three times.
    assert!(
        lines[5].ends_with(&format!("on disk {}", (256 + 3 * 64) << 10)),
        "{s}"
    );

    let v = json(&cowlink(&[&"snapshot", &"ls", &"--json", &root]));
    let snaps = v["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 4);
    assert_eq!(snaps[0]["name"], names[0].as_str());
    assert_eq!(snaps[0]["state"], "complete");
    assert!(snaps[0]["time_us"].as_u64().unwrap() < snaps[1]["time_us"].as_u64().unwrap());
    assert_eq!(snaps[3]["state"], "open");
    assert_eq!(snaps[0]["usage"]["exclusive"], 64 << 10);
    assert_eq!(v["total"]["shared_inside"], 320 << 10);
    assert_eq!(v["errors"].as_array().unwrap().len(), 0);

    // Not a snapshot set: nothing listed; a missing root: exit 1.
    let empty = x.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert!(ok(&cowlink(&[&"snapshot", &"ls", &empty])).contains("no snapshots"));
    assert!(!empty.join(".cowlink").exists(), "ls made bookkeeping");
    let out = cowlink(&[&"snapshot", &"ls", &x.path().join("missing")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn prune_keeps_by_rule_and_dry_run_removes_nothing() {
    let x = testfs!(Xfs);
    let root = x.path().join("snaps");
    let names = three(&root);
    fs::create_dir(root.join("users-own")).unwrap();

    // No rule: a usage error, nothing removed.
    let out = cowlink(&[&"snapshot", &"prune", &root]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--keep-last"),
        "{}",
        text(&out.stderr)
    );

    let out = cowlink(&[&"snapshot", &"prune", &root, &"--keep-last", &"1", &"-n"]);
    let s = ok(&out);
    assert!(
        s.contains(&format!("would remove        {}", names[0])),
        "{s}"
    );
    assert!(
        s.contains(&format!("would remove        {}", names[1])),
        "{s}"
    );
    assert!(
        s.contains(&format!("keep (newest)       {}", names[2])),
        "{s}"
    );
    assert!(names.iter().all(|n| root.join(n).exists()));

    let v = json(&cowlink(&[
        &"snapshot",
        &"prune",
        &"--json",
        &root,
        &"--keep-daily",
        &"1",
        &"--keep-last",
        &"2",
    ]));
    let verdicts: Vec<(&str, bool)> = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["verdict"].as_str().unwrap(), s["kept"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        verdicts,
        [("remove", false), ("policy", true), ("newest", true)]
    );
    assert!(!root.join(&names[0]).exists());
    assert!(root.join(&names[1]).exists() && root.join(&names[2]).exists());
    assert!(root.join("users-own").exists());

    // Another process holds the set: refused, naming it, exit 2.
    let begun = SnapshotSet::open(&root).unwrap().begin().unwrap();
    let out = cowlink(&[&"snapshot", &"prune", &root, &"--keep-last", &"1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("in use by process {}", std::process::id())),
        "{err}"
    );
    assert!(root.join(&names[1]).exists());
    drop(begun);
}
