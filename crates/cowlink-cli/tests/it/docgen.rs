//! `cowlink man` and `cowlink completions`: the pages render in man(1)
//! without a warning, one per command, and the completion scripts load in
//! their shells. scripts/setup installs man-db, groff, zsh and fish; the
//! tests that run them are ignored under plain `cargo test` and fail when
//! one is missing (no skip path).

use std::path::Path;
use std::process::{Command, Output};

fn cowlink(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cowlink"))
        .args(args)
        .output()
        .expect("run cowlink")
}

/// Whether `tool` runs: always, or the test fails naming it.
fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "{tool} is not installed (scripts/setup installs it)");
    ok
}

/// Every command of `cowlink --help`'s tree, as page names.
fn commands(prefix: &str, args: &[&str], out: &mut Vec<String>) {
    out.push(prefix.to_string());
    let help = cowlink(&[args, &["--help"]].concat());
    let text = String::from_utf8(help.stdout).unwrap();
    let mut in_commands = false;
    for line in text.lines() {
        if line == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            if line.is_empty() || !line.starts_with("  ") {
                break;
            }
            // A name is indented by two; a wrapped summary by more.
            let Some(name) = line
                .strip_prefix("  ")
                .and_then(|l| l.split_whitespace().next())
            else {
                continue;
            };
            if line.starts_with("   ") || name == "help" {
                continue;
            }
            let mut sub = args.to_vec();
            sub.push(name);
            commands(&format!("{prefix}-{name}"), &sub, out);
        }
    }
}

#[test]
#[ignore = "needs man-db and groff: run scripts/test"]
fn man_writes_one_page_per_command_and_each_renders() {
    let dir = tempfile::tempdir().unwrap();
    let out = cowlink(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let mut expected = Vec::new();
    commands("cowlink", &[], &mut expected);
    expected.sort();
    let mut written: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".1").expect("NAME.1").to_string()
        })
        .collect();
    written.sort();
    assert_eq!(written, expected, "one page per command of --help");
    assert!(written.contains(&"cowlink-store-checkout".to_string()));
    // The listing on stdout names every file written.
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().lines().count(),
        written.len()
    );

    // One page on stdout is the same page.
    let one = cowlink(&["man", "store", "checkout"]);
    assert!(one.status.success());
    assert_eq!(
        one.stdout,
        std::fs::read(dir.path().join("cowlink-store-checkout.1")).unwrap()
    );

    if !have("man") {
        return;
    }
    for name in &written {
        let page = dir.path().join(format!("{name}.1"));
        let r = Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&page)
            .env("MANWIDTH", "80")
            .output()
            .unwrap();
        let text = unformat(&String::from_utf8_lossy(&r.stdout));
        assert!(r.status.success(), "man -l {}: {r:?}", page.display());
        assert!(
            r.stderr.is_empty(),
            "man -l {} warns: {}",
            page.display(),
            String::from_utf8_lossy(&r.stderr)
        );
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "{name}: {text}"
        );
        assert!(text.contains("EXAMPLES"), "{name} has no EXAMPLES section");
    }
}

#[test]
fn man_of_an_unknown_command_names_it() {
    let out = cowlink(&["man", "store", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("cowlink store nope"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
#[ignore = "needs bash, zsh and fish: run scripts/test"]
fn completions_load_in_their_shells() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [
        ("bash", &["-n"][..]),
        ("zsh", &["-n"][..]),
        ("fish", &["-n"][..]),
    ] {
        let out = cowlink(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        // Subcommands and their options are in the script.
        assert!(
            text.contains("checkout") && text.contains("--reflink"),
            "{shell}"
        );
        let file = dir.path().join(shell);
        std::fs::write(&file, &text).unwrap();
        if !have(shell) {
            continue;
        }
        let r = Command::new(shell).args(check).arg(&file).output().unwrap();
        assert!(r.status.success(), "{shell} -n: {r:?}");
    }
    // Loaded into bash, it registers itself for `cowlink`.
    let file = dir.path().join("bash");
    let r = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p cowlink",
            shell_quote(&file)
        ))
        .output()
        .unwrap();
    assert!(r.status.success(), "{r:?}");
    assert!(String::from_utf8_lossy(&r.stdout).contains("cowlink"));
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// man's text without its overstrikes (bold is `N\x08N`, underline `_\x08N`).
fn unformat(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\x08' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out
}
