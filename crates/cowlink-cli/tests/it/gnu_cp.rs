//! `cowlink` invoked as `cp`, side by side with GNU cp: each case builds
//! the same small tree twice on XFS, runs GNU cp in one and cowlink in the
//! other with the same command line, and compares the exit status, the
//! messages and the resulting trees (`rsync -niHAX --checksum`, without
//! times: new files are made at different moments).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cowlink_testfs::{rsync_diff, testfs};

use crate::common::text;

/// A `cp` that is `target` (a symlink named cp in `root/dir`), so both
/// programs call themselves `cp` in their messages.
fn named_cp(root: &Path, dir: &str, target: &Path) -> PathBuf {
    let bin = root.join(dir);
    fs::create_dir_all(&bin).unwrap();
    let cp = bin.join("cp");
    if fs::symlink_metadata(&cp).is_err() {
        symlink(target, &cp).unwrap();
    }
    cp
}

/// Run `cp args` in `dir`, `cp` being `prog`, with `stdin` fed, umask 022.
fn run(prog: &Path, dir: &Path, args: &str, stdin: &str) -> Output {
    // Found on PATH, as a user runs it: GNU names itself by argv[0].
    let path = format!(
        "{}:{}",
        prog.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("umask 022; exec cp {args}"))
        .env("PATH", path)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// One case: `setup` builds the tree in a fresh directory (twice), then
/// `args` runs there under GNU cp and under cowlink as cp.
fn same_as_gnu(root: &Path, name: &str, setup: &dyn Fn(&Path), args: &str, stdin: &str) {
    compare_with_gnu(root, name, setup, args, stdin, true);
}

/// Like [`same_as_gnu`]; `trees` false where cowlink leaves less behind
/// than GNU on purpose (a refused copy into itself creates nothing).
fn compare_with_gnu(
    root: &Path,
    name: &str,
    setup: &dyn Fn(&Path),
    args: &str,
    stdin: &str,
    trees: bool,
) {
    let case = root.join(name);
    let (g, c) = (case.join("gnu"), case.join("cowlink"));
    for d in [&g, &c] {
        fs::create_dir_all(d).unwrap();
        setup(d);
    }
    let gnu = run(
        &named_cp(root, "gnu-bin", Path::new("/bin/cp")),
        &g,
        args,
        stdin,
    );
    let ours = run(
        &named_cp(root, "bin", Path::new(env!("CARGO_BIN_EXE_cowlink"))),
        &c,
        args,
        stdin,
    );
    assert_eq!(
        ours.status.code(),
        gnu.status.code(),
        "{name}: cp {args}: exit status; GNU said {:?}, cowlink said {:?}",
        text(&gnu.stderr),
        text(&ours.stderr)
    );
    assert_eq!(
        text(&ours.stderr),
        text(&gnu.stderr),
        "{name}: cp {args}: messages"
    );
    assert_eq!(
        text(&ours.stdout),
        text(&gnu.stdout),
        "{name}: cp {args}: -v lines"
    );
    if trees {
        assert_eq!(
            rsync_diff(&g, &c, false),
            "",
            "{name}: cp {args}: trees differ"
        );
    }
}

fn write(dir: &Path, name: &str, data: &str, mode: u32) {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(&p, data).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn existing_destinations_are_overwritten_kept_or_backed_up_as_gnu_does() {
    let x = testfs!(Xfs);
    let two = |d: &Path| {
        write(d, "a", "new\n", 0o755);
        write(d, "b", "old\n", 0o600);
    };
    // Overwrite by default, keeping the old file's mode; -p takes the
    // source's; --remove-destination makes a new file.
    same_as_gnu(x.path(), "overwrite", &two, "-v a b", "");
    same_as_gnu(x.path(), "overwrite-p", &two, "-p a b", "");
    same_as_gnu(
        x.path(),
        "remove-dest",
        &two,
        "--remove-destination a b",
        "",
    );
    // -n and --update=none keep; -u keeps a newer destination.
    same_as_gnu(x.path(), "n", &two, "-n a b", "");
    same_as_gnu(x.path(), "u-newer", &two, "-u a b", "");
    let older = |d: &Path| {
        two(d);
        let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        fs::File::options()
            .write(true)
            .open(d.join("b"))
            .unwrap()
            .set_modified(t)
            .unwrap();
    };
    same_as_gnu(x.path(), "u-older", &older, "-u a b", "");
    // -i asks; "n" keeps, "y" replaces.
    same_as_gnu(x.path(), "i-no", &two, "-i a b", "n\n");
    same_as_gnu(x.path(), "i-yes", &two, "-i a b", "y\n");
    // Backups: simple, numbered (twice), a suffix, and a refusal to back
    // up over the source.
    same_as_gnu(x.path(), "backup", &two, "-b -v a b", "");
    let numbered = |d: &Path| {
        two(d);
        write(d, "b.~1~", "older\n", 0o644);
    };
    same_as_gnu(x.path(), "numbered", &numbered, "--backup=t a b", "");
    same_as_gnu(x.path(), "suffix", &two, "-S .bak a b", "");
    let tilde = |d: &Path| {
        write(d, "a", "a\n", 0o644);
        write(d, "a~", "a-tilde\n", 0o644);
    };
    same_as_gnu(x.path(), "backup-is-src", &tilde, "--b=simple a~ a", "");
}

/// `cp -ri` into an existing tree asks about every entry it would
/// replace, not only about the operands. One question per case, so that
/// the order of a directory's entries cannot change which answer goes
/// where.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn interactive_asks_about_entries_inside_trees_as_gnu_does() {
    let x = testfs!(Xfs);
    let merge = |d: &Path| {
        write(d, "s/sub/f", "new\n", 0o644);
        write(d, "s/g", "only in the source\n", 0o644);
        write(d, "d/s/sub/f", "old\n", 0o644);
    };
    same_as_gnu(x.path(), "ri-no", &merge, "-ri s d", "n\n");
    same_as_gnu(x.path(), "ri-yes", &merge, "-ri s d", "y\n");
    same_as_gnu(x.path(), "ri-dot", &merge, "-ri s/. d/s", "n\n");
    // A read-only destination: GNU names the mode it would override.
    let read_only = |d: &Path| {
        merge(d);
        fs::set_permissions(d.join("d/s/sub/f"), fs::Permissions::from_mode(0o444)).unwrap();
    };
    same_as_gnu(x.path(), "ri-mode", &read_only, "-ri s d", "n\n");
    // A symlink of the source over a file is asked about too.
    let link = |d: &Path| {
        fs::create_dir_all(d.join("s")).unwrap();
        symlink("nowhere", d.join("s/l")).unwrap();
        write(d, "d/s/l", "file\n", 0o644);
    };
    same_as_gnu(x.path(), "ri-link-no", &link, "-ri s d", "n\n");
    same_as_gnu(x.path(), "ri-link-yes", &link, "-ri s d", "y\n");
    same_as_gnu(x.path(), "rin", &merge, "-rn s d", "");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn links_parents_and_dir_dot_name_destinations_as_gnu_does() {
    let x = testfs!(Xfs);
    let tree = |d: &Path| {
        write(d, "src/f", "f\n", 0o644);
        write(d, "src/sub/g", "g\n", 0o640);
        symlink("f", d.join("src/link")).unwrap();
        fs::hard_link(d.join("src/f"), d.join("src/f2")).unwrap();
        fs::create_dir(d.join("dst")).unwrap();
        write(d, "dst/old", "old\n", 0o644);
    };
    same_as_gnu(x.path(), "rl", &tree, "-rl src out", "");
    same_as_gnu(x.path(), "dir-dot", &tree, "-r src/. dst", "");
    same_as_gnu(x.path(), "dir-slash", &tree, "-r src/ dst", "");
    same_as_gnu(x.path(), "parents", &tree, "--parents src/sub/g dst", "");
    same_as_gnu(
        x.path(),
        "parents-p",
        &tree,
        "-p --parents src/sub/g dst",
        "",
    );
    // -d keeps hardlinked operands hardlinked; -P copies the link itself;
    // -H follows it; -L everywhere.
    same_as_gnu(x.path(), "d", &tree, "-d src/f src/f2 dst", "");
    same_as_gnu(x.path(), "P", &tree, "-P src/link dst", "");
    same_as_gnu(x.path(), "H", &tree, "-H -r src/link dst", "");
    same_as_gnu(
        x.path(),
        "a-no-links",
        &tree,
        "-a --no-preserve=links src out",
        "",
    );
    same_as_gnu(
        x.path(),
        "attributes-only",
        &tree,
        "-p --attributes-only src/f dst/old",
        "",
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn refusals_use_gnu_words_and_exit_1() {
    let x = testfs!(Xfs);
    let base = |d: &Path| {
        write(d, "a", "a\n", 0o644);
        fs::create_dir_all(d.join("dir")).unwrap();
        fs::create_dir_all(d.join("d")).unwrap();
        symlink("a", d.join("sym")).unwrap();
        symlink("no-such", d.join("dangle")).unwrap();
        write(d, "b/a", "b\n", 0o644);
    };
    same_as_gnu(x.path(), "same", &base, "a sym", "");
    same_as_gnu(x.path(), "same-name", &base, "a a", "");
    // GNU makes dir/dir before it refuses; cowlink refuses first.
    compare_with_gnu(x.path(), "into-self", &base, "-R dir dir", "", false);
    assert!(!x.path().join("into-self/cowlink/dir/dir").exists());
    same_as_gnu(x.path(), "just-created", &base, "a b/a d", "");
    same_as_gnu(x.path(), "twice", &base, "a a d", "");
    same_as_gnu(x.path(), "dangling", &base, "a dangle", "");
    same_as_gnu(x.path(), "no-r", &base, "dir d", "");
    same_as_gnu(x.path(), "missing", &base, "nothere d", "");
    same_as_gnu(x.path(), "dir-over-file", &base, "-r dir a", "");
    same_as_gnu(x.path(), "backup-and-n", &base, "-b -n a d", "");
    // A closed stdout: nothing to print is fine, -v's lines are not.
    same_as_gnu(x.path(), "closed-stdout", &base, "a d >&-", "");
    same_as_gnu(x.path(), "closed-stdout-v", &base, "-v a d >&-", "");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn same_file_spellings_and_mode_options_as_gnu_does() {
    let x = testfs!(Xfs);
    let base = |d: &Path| {
        write(d, "foo", "XYZ\n", 0o644);
        symlink("foo", d.join("symlink")).unwrap();
        fs::hard_link(d.join("foo"), d.join("hardlink")).unwrap();
        symlink("foo", d.join("sl2")).unwrap();
        fs::hard_link(d.join("sl2"), d.join("hlsl")).unwrap();
    };
    // A few of coreutils' same-file matrix: -l onto the same file is a
    // success that changes nothing (and -f must not remove the file).
    for (i, args) in [
        "-l foo foo",
        "-fl foo foo",
        "-dfl foo foo",
        "-bfl foo foo",
        "-df symlink foo",
        "-l symlink foo",
        "-b foo hardlink",
        "--rem foo hardlink",
        "-dl hlsl sl2",
    ]
    .iter()
    .enumerate()
    {
        same_as_gnu(x.path(), &format!("same-{i}"), &base, args, "");
    }
    // Attribute options apply left to right; --no-preserve=mode gives new
    // files and directories (in trees too) the default mode.
    let tree = |d: &Path| {
        write(d, "ro/f", "f\n", 0o400);
        write(d, "ro/sub/g", "g\n", 0o600);
        fs::set_permissions(d.join("ro/sub"), fs::Permissions::from_mode(0o500)).unwrap();
        fs::set_permissions(d.join("ro"), fs::Permissions::from_mode(0o705)).unwrap();
        write(d, "a", "a\n", 0o600);
    };
    for (i, args) in [
        "-r --no-preserve=mode ro out",
        "-a --no-preserve=mode ro out",
        "--no-preserve=mode -a ro out",
        "--no-preserve=mode --preserve=all a b",
        "--no-preserve=mode a b",
    ]
    .iter()
    .enumerate()
    {
        same_as_gnu(x.path(), &format!("mode-{i}"), &tree, args, "");
    }
}
