//! `cowlink extents`, `du` and `dedupe` on the real test filesystems: what
//! they print, their JSON, exit codes and error messages.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use cowlink_testfs::{data, serial, testfs, write_file};

use crate::common::{cowlink, json, text};

fn clone(a: &Path, b: &Path) {
    let out = cowlink(&[&"cp", &"--reflink=always", &a, &b]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn extents_says_cow_link_and_with_whom() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let (a, b, c) = (x.path().join("a"), x.path().join("b"), x.path().join("c"));
    write_file(&a, &data(1 << 20, 1));
    clone(&a, &b);
    write_file(&c, &data(64 << 10, 2));
    let out = cowlink(&[&"extents", &a, &b, &c]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains(&format!(
            "{}: CoW link: yes, 100% of 1.0 MiB shared, 1 extent, 1 fragment; shares 1.0 MiB with {}",
            a.display(),
            b.display()
        )),
        "{s}"
    );
    assert!(
        s.contains(&format!(
            "{}: CoW link: no, 0% of 64.0 KiB shared",
            c.display()
        )),
        "{s}"
    );
    // The table: header, then one row per extent with the set column.
    assert!(
        s.contains("logical") && s.contains("physical") && s.contains("set  flags"),
        "{s}"
    );
    assert!(
        s.lines().any(|l| l.trim_end().ends_with("2  shared,last")),
        "{s}"
    );

    let out = cowlink(&[&"extents", &"--json", &a, &b]);
    assert!(out.status.success());
    let v = json(&out);
    let f = &v["files"][0];
    assert_eq!(f["cow_link"], true);
    assert_eq!(f["shared_bytes"], 1 << 20);
    assert_eq!(f["extents"][0]["length"], 1 << 20);
    assert_eq!(f["shared_with"][0]["path"], b.to_str().unwrap());
    assert_eq!(f["shared_with"][0]["bytes"], 1 << 20);
    assert_eq!(
        v["files"][0]["extents"][0]["physical"],
        v["files"][1]["extents"][0]["physical"]
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn extents_refs_on_btrfs_lists_four_references_by_path() {
    let _serial = serial();
    let b = testfs!(Btrfs);
    let a = b.path().join("a");
    write_file(&a, &data(300 << 10, 3));
    for n in ["c1", "c2", "c3"] {
        clone(&a, &b.path().join(n));
    }
    let out = cowlink(&[&"extents", &"--refs", &a]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("refs  flags"), "{s}");
    assert!(
        s.lines().any(|l| l.trim_end().ends_with("4  shared,last")),
        "{s}"
    );
    let root = fs::canonicalize(b.path()).unwrap();
    for n in ["a", "c1", "c2", "c3"] {
        let line = format!("{} at offset 0", root.join(n).display());
        assert!(s.lines().any(|l| l.trim() == line), "missing {line}: {s}");
    }
    let v = json(&cowlink(&[&"extents", &"--refs", &"--json", &a]));
    assert_eq!(v["files"][0]["refs"][0].as_array().unwrap().len(), 4);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn extents_errors_name_the_path_and_reason() {
    let _serial = serial();
    let (t, x) = (testfs!(Tmpfs), testfs!(Xfs));
    let f = t.path().join("f");
    fs::write(&f, b"data").unwrap();
    let out = cowlink(&[&"extents", &f]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        format!(
            "cowlink: cannot map extents of '{}': this filesystem (tmpfs) does not report file extents (no FIEMAP)",
            f.display()
        )
    );

    let missing = x.path().join("missing");
    let out = cowlink(&[&"extents", &missing]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing': no such file or directory"));
    // In JSON, the error as every command serializes one.
    let out = cowlink(&[&"extents", &"--json", &missing]);
    assert_eq!(out.status.code(), Some(1));
    let e = &json(&out)["errors"][0];
    assert_eq!(e["src"], missing.to_str().unwrap());
    assert_eq!(e["kind"], "not_found");
    assert_eq!(e["operation"], "extents");

    let out = cowlink(&[&"extents", &x.path()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("is a directory"),
        "{}",
        text(&out.stderr)
    );

    // Unreadable to an unprivileged user.
    let secret = x.path().join("secret");
    write_file(&secret, b"secret");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(x.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .arg("extents")
        .arg(&secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(&format!("'{}': permission denied", secret.display())),
        "{}",
        text(&out.stderr)
    );
    // --refs off Btrfs: the layout still prints, with a note saying why
    // there are no reference counts.
    let out = cowlink(&[&"extents", &"--refs", &secret]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("CoW link: no"));
    assert!(
        text(&out.stderr)
            .contains("reference counts come from Btrfs and this filesystem (xfs) is not Btrfs"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn du_reports_exclusive_shared_and_saved() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let set = x.path().join("set");
    fs::create_dir_all(set.join("sub")).unwrap();
    write_file(&set.join("a"), &data(512 << 10, 4));
    clone(&set.join("a"), &set.join("sub/b"));
    write_file(&set.join("own"), &data(64 << 10, 5));

    let out = cowlink(&[&"du", &"-s", &"--json", &set]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    let t = &v["total"];
    assert_eq!(t["data"], (1024 + 64) << 10);
    assert_eq!(t["exclusive"], 64 << 10);
    assert_eq!(t["shared"], 512 << 10);
    assert_eq!(t["shared_inside"], 512 << 10);
    assert_eq!(t["saved"], 512 << 10);
    assert_eq!(t["files"], 3);
    assert!(v.get("dirs").is_none(), "-s lists no directories");

    let out = cowlink(&[&"du", &"-b", &set]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    let lines: Vec<&str> = s.lines().collect();
    assert!(
        lines[0].contains("TOTAL") && lines[0].contains("SAVED"),
        "{s}"
    );
    // The subdirectory (shared with a file outside it), then the argument.
    let sub = format!("{}", set.join("sub").display());
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let row_sub = cols(lines[1]);
    assert_eq!(row_sub[5], sub);
    assert_eq!(&row_sub[..5], ["524288", "0", "524288", "524288", "0"]);
    let row_set = cols(lines[2]);
    assert_eq!(row_set[5], set.display().to_string());
    assert_eq!(&row_set[..5], ["1114112", "65536", "524288", "0", "524288"]);

    // Two arguments: each alone, then the set.
    let out = cowlink(&[&"du", &"-s", &"-b", &set.join("a"), &set.join("sub")]);
    let s = text(&out.stdout);
    let last = s.lines().last().unwrap();
    assert!(last.ends_with("total (the set)"), "{s}");
    assert_eq!(&cols(last)[..5], ["1048576", "0", "524288", "0", "524288"]);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn du_errors_exit_1_and_tmpfs_is_named_once() {
    let _serial = serial();
    let (t, x) = (testfs!(Tmpfs), testfs!(Xfs));
    for n in ["a", "b", "c"] {
        fs::write(t.path().join(n), b"x").unwrap();
    }
    let out = cowlink(&[&"du", &"-s", &t.path()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("(tmpfs) does not report file extents"),
        "{err}"
    );

    let out = cowlink(&[&"du", &"-s", &x.path().join("nope")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("nope': no such file or directory"));
}

/// Identical, separately written files.
fn dup_files(dir: &Path, n: usize, size: usize) -> Vec<std::path::PathBuf> {
    let bytes = data(size, 77);
    (0..n)
        .map(|i| {
            let p = dir.join(format!("dup{i}"));
            write_file(&p, &bytes);
            p
        })
        .collect()
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dedupe_dry_run_changes_nothing_then_dedupe_shares() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let files = dup_files(x.path(), 3, 1 << 20);
    let out = cowlink(&[&"dedupe", &"--dry-run", &x.path()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("2 × 1.0 MiB (") && s.contains(&format!("source {}", files[0].display())),
        "{s}"
    );
    assert!(
        s.contains("dry run: 3 files scanned, 1 duplicate group, 2 targets, 2.0 MiB expected back"),
        "{s}"
    );
    let l = cowlink::extents::extents(&files[1]).unwrap();
    assert!(!l.is_cow_link(), "a dry run must not share anything");

    let out = cowlink(&[&"dedupe", &"--json", &x.path()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["result"]["targets_deduped"], 2);
    assert_eq!(v["result"]["bytes_compared"], 2 << 20);
    // Measured: the two targets' blocks (metadata moves a little too).
    let back = v["result"]["bytes_reclaimed"].as_u64().unwrap();
    assert!(
        ((2 << 20) * 9 / 10..=(2 << 20) * 11 / 10).contains(&back),
        "{v}"
    );
    assert_eq!(v["result"]["measured"], true);
    assert_eq!(v["result"]["skipped"], serde_json::json!([]));
    assert_eq!(
        v["plan"]["groups"][0]["targets"].as_array().unwrap().len(),
        2
    );
    for f in &files {
        assert!(cowlink::extents::extents(f).unwrap().is_cow_link());
        assert_eq!(fs::read(f).unwrap(), data(1 << 20, 77));
    }
    // Again: nothing to do, everything skipped as already shared.
    let out = cowlink(&[&"dedupe", &x.path()]);
    let s = text(&out.stdout);
    assert!(
        s.contains("0 duplicate groups, 0 B hashed; 0 files deduplicated"),
        "{s}"
    );
    assert!(s.contains("skipped: 2 already shared"), "{s}");

    // --measure, accepted for older scripts: the free space is always read
    // before and after.
    let m = x.path().join("m");
    fs::create_dir(&m).unwrap();
    dup_files(&m, 2, 1 << 20);
    let out = cowlink(&[&"dedupe", &"--measure", &m]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("1 file deduplicated, "), "{s}");
    assert!(s.contains(" reclaimed (measured); "), "{s}");
    let out = cowlink(&[&"dedupe", &"--measure", &"--dry-run", &m]);
    assert_eq!(out.status.code(), Some(2), "a dry run measures nothing");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dedupe_refuses_ext4_with_exit_1_and_bad_sizes_with_exit_2() {
    let _serial = serial();
    let e = testfs!(Ext4);
    dup_files(e.path(), 2, 64 << 10);
    let out = cowlink(&[&"dedupe", &e.path()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("this filesystem cannot deduplicate: ext4 refused a trial dedupe"),
        "{err}"
    );
    let out = cowlink(&[&"dedupe", &"--min-size", &"12Q", &e.path()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown size suffix 'Q'"));
}

/// Dedupe below PATH_MAX's reach: four identical files at levels 1500 and
/// 3000 of a chain of directories (paths of 3,000 and 6,000 bytes) are
/// found, deduplicated, and their space is measured back by `du`.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dedupe_works_on_paths_longer_than_path_max() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let root = x.path().join("deep");
    cowlink_testfs::deep_chain(&root, 3000, &[1500, 3000], &data(64 << 10, 9));
    let out = cowlink(&[&"dedupe", &"--json", &root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["plan"]["groups"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["result"]["targets_deduped"], 3, "{v}");
    assert_eq!(v["result"]["errors"], serde_json::json!([]), "{v}");
    assert_eq!(v["plan"]["errors"], serde_json::json!([]), "{v}");
    let out = cowlink(&[&"du", &"-s", &"--json", &root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let du = json(&out);
    let total = &du["total"];
    assert_eq!(total["files"], 4);
    assert_eq!(total["saved"], 3 * (64 << 10), "{total}");
    fs::remove_dir_all(&root).ok();
}

fn as_nobody(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .args(args)
        .output()
        .unwrap()
}

/// Btrfs keeps small files inline in metadata. Root tells them apart with
/// a tree search on the directory, anyone else by mapping each file's
/// extents: the plans agree, and only the files in blocks are grouped.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_inline_files_are_told_apart_with_and_without_root() {
    use std::os::unix::fs::chown;
    let _serial = serial();
    let b = testfs!(Btrfs);
    let top = b.path().join("inline-or-not");
    fs::create_dir_all(&top).unwrap();
    fs::set_permissions(b.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // 100 bytes: inline; 3000 (over the default max_inline of 2 KiB): in a
    // block of its own.
    for (size, n) in [(100, 5), (3000, 3)] {
        let sub = top.join(format!("s{size}"));
        fs::create_dir(&sub).unwrap();
        for p in dup_files(&sub, n, size) {
            chown(&p, Some(65534), Some(65534)).unwrap();
        }
        chown(&sub, Some(65534), Some(65534)).unwrap();
    }
    chown(&top, Some(65534), Some(65534)).unwrap();
    let plans: Vec<serde_json::Value> = [
        cowlink(&[&"dedupe", &"--dry-run", &"--json", &top]),
        as_nobody(&[&"dedupe", &"--dry-run", &"--json", &top]),
    ]
    .iter()
    .map(|out| {
        assert!(out.status.success(), "{}", text(&out.stderr));
        json(out)["plan"].clone()
    })
    .collect();
    for p in &plans {
        assert_eq!(p["inline_skipped"], 5, "{p}");
        assert_eq!(p["groups"].as_array().unwrap().len(), 1, "{p}");
        assert_eq!(p["groups"][0]["size"], 3000, "{p}");
        assert_eq!(p["groups"][0]["targets"].as_array().unwrap().len(), 2);
    }
    assert_eq!(plans[0]["groups"], plans[1]["groups"]);
    fs::remove_dir_all(&top).unwrap();
}

/// An unprivileged caller among root's files: the probe's scratch file
/// cannot be made (not the filesystem's fault, so no "made with reflink=1"
/// and no refusal), root's files are sources only, the caller's own copy
/// is the target, and only space that was freed is claimed.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn unprivileged_dedupe_changes_only_its_own_files_and_claims_only_what_it_freed() {
    use std::os::unix::fs::chown;
    let _serial = serial();
    let x = testfs!(Xfs);
    let top = x.path().join("shared-area");
    let mine = top.join("mine");
    fs::create_dir_all(&mine).unwrap();
    fs::set_permissions(&top, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(x.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let body = data(256 << 10, 31);
    for name in ["r1", "r2"] {
        write_file(&top.join(name), &body);
    }
    write_file(&mine.join("m"), &body);
    chown(&mine, Some(65534), Some(65534)).unwrap();
    chown(mine.join("m"), Some(65534), Some(65534)).unwrap();

    let out = as_nobody(&[&"dedupe", &"--dry-run", &top]);
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{so}{se}");
    assert!(
        !se.contains("reflink=1") && !se.contains("cannot deduplicate"),
        "{se}"
    );
    assert!(so.contains("1 duplicate group, 1 target,"), "{so}");
    assert!(so.contains("1 not yours to change"), "{so}");

    let out = as_nobody(&[&"dedupe", &"--json", &top]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    let g = &v["plan"]["groups"][0];
    assert_eq!(g["source"], top.join("r1").to_str().unwrap(), "{v}");
    assert_eq!(g["targets"], serde_json::json!([mine.join("m")]), "{v}");
    assert_eq!(v["result"]["targets_deduped"], 1, "{v}");
    assert_eq!(v["result"]["errors"], serde_json::json!([]), "{v}");
    assert!(
        v["result"]["bytes_reclaimed"].as_u64().unwrap() >= 200 << 10,
        "{v}"
    );
    assert!(cowlink::extents::extents(mine.join("m"))
        .unwrap()
        .is_cow_link());
    assert!(!cowlink::extents::extents(top.join("r2"))
        .unwrap()
        .is_cow_link());
    assert_eq!(fs::read(mine.join("m")).unwrap(), body);

    // Only root's files: nothing to change, nothing claimed, no error.
    let only_root = x.path().join("root-only");
    fs::create_dir_all(&only_root).unwrap();
    for name in ["a", "b"] {
        write_file(&only_root.join(name), &body);
    }
    let out = as_nobody(&[&"dedupe", &"--json", &only_root]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["plan"]["groups"], serde_json::json!([]), "{v}");
    assert_eq!(v["plan"]["not_permitted"], 1, "{v}");
    assert_eq!(v["result"]["bytes_reclaimed"], 0, "{v}");
    fs::remove_dir_all(&top).unwrap();
    fs::remove_dir_all(&only_root).unwrap();
}

/// Compressible text: words from a small vocabulary, `len` bytes.
fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let noise = data(len, seed);
    noise
        .iter()
        .map(|b| b"abcdefgh  \n"[*b as usize % 11])
        .collect()
}

/// The number in `column` of the `TOTAL` line of `compsize -b`.
fn compsize(paths: &[&Path], column: usize) -> u64 {
    let out = Command::new("compsize")
        .arg("-b")
        .args(paths)
        .output()
        .unwrap();
    assert!(out.status.success(), "compsize: {}", text(&out.stderr));
    let t = text(&out.stdout);
    let line = t.lines().find(|l| l.starts_with("TOTAL")).unwrap();
    line.split_whitespace()
        .nth(column)
        .unwrap()
        .parse()
        .unwrap()
}

/// `btrfs filesystem du --raw -s`: (Total, Exclusive).
fn btrfs_du(p: &Path) -> (u64, u64) {
    let out = Command::new("btrfs")
        .args(["filesystem", "du", "--raw", "-s"])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    let nums: Vec<u64> = t
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .take(2)
        .map(|n| n.parse().unwrap())
        .collect();
    (nums[0], nums[1])
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn compressed_btrfs_figures_are_the_disk_truth_or_unknown() {
    let _serial = serial();
    let z = testfs!(BtrfsZstd);
    let d = z.path().join("d");
    fs::create_dir(&d).unwrap();
    let (a, b, c) = (d.join("a"), d.join("b"), d.join("c"));
    write_file(&a, &compressible(8 << 20, 1));
    clone(&a, &b);
    write_file(&c, &compressible(2 << 20, 2));
    let sync = Command::new("sync").status().unwrap();
    assert!(sync.success());
    let disk = compsize(&[&d], 2);
    assert!(
        disk < 6 << 20,
        "the data did not compress ({disk} bytes on disk)"
    );

    // du: data and exclusive as `btrfs filesystem du`, the disk figures as
    // compsize's "Disk Usage".
    let v = json(&cowlink(&[&"du", &"--json", &"-s", &d]));
    let t = &v["total"];
    let (total, exclusive) = btrfs_du(&d);
    assert_eq!(t["data"], total, "{t}");
    assert_eq!(t["exclusive"], exclusive, "{t}");
    assert_eq!(t["on_disk"], disk, "{t}");
    let shared = compsize(&[&a], 2);
    assert_eq!(t["shared_inside"], shared, "{t}");
    // Sharing saves a's compressed size once (b is its clone).
    assert_eq!(t["saved"], shared, "{t}");

    // One file alone shares nothing inside itself: all with b, outside.
    let v = json(&cowlink(&[&"du", &"--json", &"-s", &a]));
    let t = &v["total"];
    assert_eq!(
        (t["shared_inside"].as_u64(), t["saved"].as_u64()),
        (Some(0), Some(0)),
        "{t}"
    );
    assert_eq!(t["shared_outside"], shared, "{t}");

    // extents: a shares its compressed size with b, never more than it has.
    let v = json(&cowlink(&[&"extents", &"--json", &a, &b]));
    let with = &v["files"][0]["shared_with"][0];
    assert_eq!(with["bytes"], shared, "{with}");
    let out = cowlink(&[&"extents", &a]);
    assert!(
        text(&out.stdout).contains("compressed to"),
        "{}",
        text(&out.stdout)
    );

    // Not root: the compressed sizes cannot be read; the disk figures are
    // unknown (null, "?"), never a wrong number.
    let out = as_nobody(&[&"du", &"--json", &"-s", &d]);
    let v = json(&out);
    let t = &v["total"];
    assert_eq!(t["data"], total, "{t}");
    for k in [
        "shared",
        "shared_inside",
        "shared_outside",
        "on_disk",
        "saved",
    ] {
        assert!(t[k].is_null(), "{k}: {t}");
    }
    assert!(t["unknown_disk"].as_u64().unwrap() > 0, "{t}");
    let out = as_nobody(&[&"du", &"-s", &d]);
    assert!(text(&out.stdout).contains('?'), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("takes root"),
        "{}",
        text(&out.stderr)
    );
    let out = as_nobody(&[&"extents", &a, &b]);
    let shown = text(&out.stdout);
    assert!(!shown.contains("; shares"), "{shown}");
    assert!(shown.contains("is unknown"), "{shown}");
}

/// `dedupe --store`: a file equal to a store object shares the object's
/// blocks, the object stays as it was and the store verifies; a file whose
/// blocks a reflinked copy outside the paths holds is named on stderr and
/// in the JSON with its reason, and left as it was.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dedupe_store_objects_are_sources_and_files_held_elsewhere_are_named() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let st = x.path().join("store");
    let tree = x.path().join("tree");
    let out_of_set = x.path().join("outside");
    fs::create_dir_all(&tree).unwrap();
    fs::create_dir_all(&out_of_set).unwrap();
    let bytes = data(1 << 20, 90);
    write_file(&x.path().join("in"), &bytes);
    crate::common::ok(&crate::common::store(&st, &[&"add", &x.path().join("in")]));
    let objects: Vec<_> = walk_files(&st.join("objects"));
    assert_eq!(objects.len(), 1, "{objects:?}");
    let object = &objects[0];
    let object_map = cowlink::extents::extents(object).unwrap().physical_runs();
    // f equals the object; g too, but a copy outside the paths holds its
    // blocks; h is unrelated to both, and alone.
    write_file(&tree.join("f"), &bytes);
    write_file(&tree.join("g"), &bytes);
    clone(&tree.join("g"), &out_of_set.join("g"));
    write_file(&tree.join("h"), &data(1 << 20, 91));

    let out = cowlink(&[&"dedupe", &"--json", &"--store", &st, &tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    let g = &v["plan"]["groups"][0];
    assert_eq!(g["source"], object.to_str().unwrap(), "{v}");
    assert_eq!(v["result"]["targets_deduped"], 1, "{v}");
    let skipped = &v["result"]["skipped"];
    assert_eq!(skipped.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(skipped[0]["path"], tree.join("g").to_str().unwrap());
    assert_eq!(skipped[0]["reason"], "held_elsewhere");
    assert!(crate::common::shares_extents_with(object, &tree.join("f")));
    assert!(!crate::common::shares_extents_with(object, &tree.join("g")));
    assert_eq!(
        cowlink::extents::extents(object).unwrap().physical_runs(),
        object_map
    );
    let verified = crate::common::ok(&crate::common::store(&st, &[&"verify"]));
    assert!(verified.contains("all good"), "{verified}");

    // The text form names the skipped file and why, on stderr.
    write_file(&tree.join("f2"), &bytes);
    let out = cowlink(&[&"dedupe", &"--store", &st, &tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "'{}' left as it is: its blocks are also held",
            tree.join("g").display()
        )),
        "{err}"
    );
    let s = text(&out.stdout);
    assert!(s.contains("1 file deduplicated"), "{s}");
    assert!(
        s.contains("1 file identical to their source but left as they were"),
        "{s}"
    );

    // Not a store: refused, exit 1, naming the directory.
    let out = cowlink(&[&"dedupe", &"--store", &tree, &tree]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a cowlink store"),
        "{}",
        text(&out.stderr)
    );
}

/// Regular files under `dir`, sorted.
fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Without root, Btrfs does not name who holds an extent: a file whose
/// shared blocks no other file of its group maps (a snapshot holds them)
/// is still skipped, from the extent maps alone, and the space in use
/// (data and metadata) does not grow.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn btrfs_without_root_files_a_snapshot_holds_are_skipped_from_the_maps() {
    use std::os::unix::fs::chown;
    let _serial = serial();
    let b = testfs!(Btrfs);
    fs::set_permissions(b.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let sv = b.path().join("sv");
    let snap = b.path().join("snap");
    let run = |args: &[&str]| {
        let out = Command::new("btrfs").args(args).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    run(&["subvolume", "create", sv.to_str().unwrap()]);
    let body = data(1 << 20, 95);
    for n in ["a", "b"] {
        write_file(&sv.join(n), &body);
    }
    let f = fs::File::open(&sv).unwrap();
    rustix::fs::syncfs(&f).unwrap();
    run(&[
        "subvolume",
        "snapshot",
        sv.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);
    write_file(&sv.join("c"), &body);
    for p in [sv.clone(), sv.join("a"), sv.join("b"), sv.join("c")] {
        chown(&p, Some(65534), Some(65534)).unwrap();
    }
    rustix::fs::syncfs(&f).unwrap();
    let used = || {
        rustix::fs::syncfs(&f).unwrap();
        cowlink_sys::btrfs_space_used(rustix::fd::AsFd::as_fd(&f)).unwrap()
    };
    let before = used();
    let out = as_nobody(&[&"dedupe", &"--json", &sv]);
    let after = used();
    for p in [&snap, &sv] {
        run(&["subvolume", "delete", p.to_str().unwrap()]);
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(
        v["plan"]["groups"][0]["source"],
        sv.join("a").to_str().unwrap(),
        "{v}"
    );
    assert_eq!(v["result"]["targets_deduped"], 1, "{v}");
    let skipped = &v["result"]["skipped"];
    assert_eq!(skipped.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(skipped[0]["path"], sv.join("b").to_str().unwrap(), "{v}");
    assert_eq!(skipped[0]["reason"], "held_elsewhere", "{v}");
    assert!(
        skipped[0]["detail"]
            .as_str()
            .unwrap()
            .contains("no other file of the group being shared maps"),
        "{v}"
    );
    assert!(after < before, "space in use {before} then {after}");
}

/// Exact copies, near duplicates the kernel splits whole (same size and
/// edges, each another middle) and near duplicates with an equal pair
/// among the variants, in `dir`: two groups in all.
fn edge_twins(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let exact = data(100 << 10, 41);
    for n in ["e0", "e1", "e2"] {
        write_file(&dir.join(n), &exact);
    }
    let base = data(64 << 10, 42);
    for (i, n) in ["n0", "n1", "n2"].into_iter().enumerate() {
        let mut b = base.clone();
        b[32 << 10] ^= 1 + i as u8;
        write_file(&dir.join(n), &b);
    }
    let base = data(48 << 10, 43);
    write_file(&dir.join("v"), &base);
    let mut b = base.clone();
    b[24 << 10] ^= 1;
    for n in ["v0", "v1"] {
        write_file(&dir.join(n), &b);
    }
    let f = fs::File::open(dir).unwrap();
    rustix::fs::syncfs(&f).unwrap();
}

/// The summary's group count is the dry run's, whether the groups are
/// kept to print them (`--verbose`, `--json`) or not, with an edge group
/// the kernel split whole; `--verbose` and `--json` print every group.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn dedupe_counts_the_groups_the_dry_run_finds_with_and_without_verbose() {
    let _serial = serial();
    let x = testfs!(Xfs);
    let tree = |n: &str| {
        let d = x.path().join(n);
        edge_twins(&d);
        d
    };
    let out = cowlink(&[&"dedupe", &"--dry-run", &tree("dry")]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert!(s.contains(", 2 duplicate groups, 3 targets,"), "{s}");
    let out = cowlink(&[&"dedupe", &tree("plain")]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert!(s.contains(", 2 duplicate groups, "), "{s}");
    assert!(s.contains("; 3 files deduplicated"), "{s}");
    let out = cowlink(&[&"dedupe", &"--verbose", &tree("verbose")]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{s}{}", text(&out.stderr));
    assert!(s.contains(", 2 duplicate groups, "), "{s}");
    assert_eq!(s.matches("; source ").count(), 2, "{s}");
    let out = cowlink(&[&"dedupe", &"--json", &tree("json")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["plan"]["groups"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["plan"]["groups_found"], 2, "{v}");
    assert_eq!(v["result"]["targets_deduped"], 3, "{v}");
}
