//! Output never stops the work: a reader that goes away (`| head`) or a
//! closed stderr ends cowlink's output to that stream, never the copy, and
//! the exit status stays the copy's (never a panic's 101).

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use cowlink_testfs::testfs;

use crate::common::{bin, text};

/// `n` small files under `dir/src`, and a dangling symbolic link when
/// `broken` (copied with -L, it fails with a message on stderr).
fn tree(dir: &Path, n: usize, broken: bool) -> std::path::PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..n {
        fs::write(
            src.join("sub").join(format!("f{i:05}")),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    if broken {
        std::os::unix::fs::symlink("/nonexistent/target", src.join("a-dangling-link")).unwrap();
    }
    src
}

fn copied(dst: &Path, n: usize) {
    for i in 0..n {
        let p = dst.join("sub").join(format!("f{i:05}"));
        assert_eq!(
            fs::read_to_string(&p).unwrap_or_default(),
            format!("file {i}\n"),
            "{} missing or wrong after the output was cut",
            p.display()
        );
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_reader_that_goes_away_never_stops_a_copy() {
    let fs_ = testfs!(Xfs);
    let n = 3000; // --json output well over a pipe's 64 KiB
    let src = tree(fs_.path(), n, false);
    let dst = fs_.path().join("dst");
    let mut child = bin()
        .args(["cp", "-r", "--json", "-j", "2"])
        .arg(&src)
        .arg(&dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's reader is gone now (as after `| head -c 100`).
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "exit status must be the copy's; stderr: {}",
        text(&out.stderr)
    );
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    copied(&dst, n);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_closed_stderr_never_stops_a_copy() {
    let fs_ = testfs!(Xfs);
    let n = 500;
    let src = tree(fs_.path(), n, true);
    // Two ways to lose stderr: a pipe whose reader is gone, and a closed
    // descriptor (`2>&-`).
    for (i, closed) in [false, true].into_iter().enumerate() {
        let dst = fs_.path().join(format!("dst{i}"));
        let status = if closed {
            Command::new("sh")
                .arg("-c")
                .arg(r#"exec "$0" cp -rL "$1" "$2" 2>&-"#)
                .arg(env!("CARGO_BIN_EXE_cowlink"))
                .arg(&src)
                .arg(&dst)
                .status()
                .unwrap()
        } else {
            let mut child = bin()
                .args(["cp", "-rL", "-v"])
                .arg(&src)
                .arg(&dst)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            drop(child.stderr.take());
            child.wait().unwrap()
        };
        // The dangling link fails (exit 1); nothing panics (101), and
        // every other file is copied.
        assert_eq!(status.code(), Some(1), "closed={closed}");
        copied(&dst, n);
        assert!(!dst.join("a-dangling-link").exists());
    }
}

/// The exact bytes of a name from `--json`: the `<key>_bytes` field when
/// the name is not UTF-8, else the `<key>` string.
fn exact(v: &serde_json::Value, key: &str) -> Vec<u8> {
    match v.get(format!("{key}_bytes")) {
        Some(b) => b
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap() as u8)
            .collect(),
        None => v[key].as_str().unwrap().as_bytes().to_vec(),
    }
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn names_are_escaped_in_text_and_exact_in_json() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let x = testfs!(Xfs);
    let src = x.path().join("src");
    let names: [&[u8]; 3] = [b"bad\xff", b"a\nb", b"esc\x1b[31mred"];
    fs::create_dir_all(src.join(OsStr::from_bytes(b"dir\xfe"))).unwrap();
    for n in names {
        fs::write(src.join(OsStr::from_bytes(n)), vec![7u8; 5000]).unwrap();
    }
    let raw_in = |b: &[u8]| {
        // No name reaches a terminal with its newline, escape or bad byte.
        !b.windows(2).any(|w| w == b"a\nb") && !b.contains(&0x1b) && !b.contains(&0xff)
    };

    // Text: each name shown once, escaped the way bash reads it back.
    let out = bin()
        .args(["cp", "-rv"])
        .arg(&src)
        .arg(x.path().join("dst"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for q in [r"a\nb'", r"bad\xff'", r"esc\x1b[31mred'", r"dir\xfe'"] {
        assert!(shown.contains(q), "{q} not in {shown}");
    }
    assert!(raw_in(&out.stdout), "{shown}");
    let out = bin().args(["dedupe", "-n"]).arg(&src).output().unwrap();
    assert!(
        raw_in(&out.stdout) && raw_in(&out.stderr),
        "{}",
        text(&out.stdout)
    );
    let out = bin().arg("du").arg(&src).output().unwrap();
    assert!(raw_in(&out.stdout), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains(r"dir\xfe'"),
        "{}",
        text(&out.stdout)
    );

    // JSON: every path names its file exactly; it is parsed, never cut.
    let out = bin()
        .args(["cp", "-r", "--json"])
        .arg(&src)
        .arg(x.path().join("d2"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    let mut seen = 0;
    for r in v["results"].as_array().unwrap() {
        let (s, d) = (exact(r, "src"), exact(r, "dst"));
        assert!(Path::new(OsStr::from_bytes(&s)).exists(), "{r}");
        assert!(Path::new(OsStr::from_bytes(&d)).exists(), "{r}");
        seen += 1;
    }
    assert_eq!(seen, 5, "{v}");

    let files: Vec<_> = names
        .iter()
        .map(|n| src.join(OsStr::from_bytes(n)))
        .collect();
    let mut c = bin();
    c.args(["extents", "--json"]).args(&files);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = json(&out);
    let got: Vec<Vec<u8>> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| exact(f, "path"))
        .collect();
    let want: Vec<Vec<u8>> = files
        .iter()
        .map(|f| f.as_os_str().as_bytes().to_vec())
        .collect();
    assert_eq!(got, want);

    let out = bin()
        .args(["dedupe", "-n", "--json"])
        .arg(&src)
        .output()
        .unwrap();
    let v = json(&out);
    let g = &v["plan"]["groups"][0];
    let mut members = vec![exact(g, "source")];
    let targets = g["targets"].as_array().unwrap();
    let bytes = g.get("targets_bytes").and_then(|b| b.as_array().cloned());
    for (i, t) in targets.iter().enumerate() {
        members.push(match bytes.as_ref().map(|b| &b[i]) {
            Some(serde_json::Value::Array(a)) => {
                a.iter().map(|n| n.as_u64().unwrap() as u8).collect()
            }
            _ => t.as_str().unwrap().as_bytes().to_vec(),
        });
    }
    members.sort();
    let mut want = want.clone();
    want.sort();
    assert_eq!(members, want, "{g}");

    let out = bin().args(["du", "--json"]).arg(&src).output().unwrap();
    let v = json(&out);
    assert!(
        v["dirs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| exact(d, "path").ends_with(b"dir\xfe")),
        "{v}"
    );

    // An error names the file exactly too.
    let missing = x.path().join(OsStr::from_bytes(b"gone\xff"));
    let out = bin()
        .args(["cp", "--json"])
        .arg(&missing)
        .arg(x.path().join("z"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    let e = &v["results"][0]["error"];
    assert_eq!(exact(e, "src"), missing.as_os_str().as_bytes(), "{e}");
    assert!(
        text(&out.stderr).contains(r"gone\xff'"),
        "{}",
        text(&out.stderr)
    );
}
