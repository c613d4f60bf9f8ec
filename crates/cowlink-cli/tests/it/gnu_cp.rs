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

/// Replacing entries inside a tree: backups (simple, numbered, existing
/// with a suffix), `--remove-destination` (the new file takes the
/// source's mode), with `-l`, and `--attributes-only` (an old file keeps
/// its data unless it is removed or backed up first).
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn backups_and_removals_inside_trees_as_gnu_does() {
    let x = testfs!(Xfs);
    let merge = |d: &Path| {
        write(d, "s/f", "new\n", 0o755);
        write(d, "s/sub/g", "new g\n", 0o644);
        write(d, "d/s/f", "old\n", 0o444);
        write(d, "d/s/sub/g", "old g\n", 0o600);
        write(d, "d/s/sub/g.~3~", "older g\n", 0o600);
        symlink("f", d.join("s/l")).unwrap();
        write(d, "d/s/l", "old file where a link goes\n", 0o644);
    };
    for (name, args) in [
        ("rb", "-rb s d"),
        ("r-numbered", "-r --backup=numbered s d"),
        ("r-existing", "-r --backup=existing -S .bak s d"),
        ("r-remove", "-r --remove-destination s d"),
        ("rl-b", "-rl -b s d"),
        ("rl-remove", "-rl --remove-destination s d"),
    ] {
        same_as_gnu(x.path(), name, &merge, args, "");
    }
    // GNU refuses a symlink over a file with --attributes-only and
    // without -f ("cannot create symbolic link"); the tree copy replaces
    // it. Left out here (a known difference).
    let files = |d: &Path| {
        merge(d);
        fs::remove_file(d.join("s/l")).unwrap();
    };
    for (name, args) in [
        ("r-attr", "-r --attributes-only s d"),
        (
            "r-attr-remove",
            "-r --attributes-only --remove-destination s d",
        ),
        ("r-attr-b", "-r --attributes-only -b s d"),
    ] {
        same_as_gnu(x.path(), name, &files, args, "");
    }
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

/// A small deterministic generator (xorshift64*), so that a failing case
/// is rebuilt from its seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len() as u64) as usize]
    }
}

/// One step of building a tree; the same list builds GNU's side and ours.
#[derive(Debug, Clone)]
enum Make {
    Dir(PathBuf),
    File {
        at: PathBuf,
        data: Vec<u8>,
        /// Length with a hole after the data.
        len: u64,
        mode: u32,
        /// Seconds since the epoch.
        mtime: u64,
    },
    Symlink(PathBuf, PathBuf),
    Hardlink(PathBuf, PathBuf),
    Fifo(PathBuf),
    DirMode(PathBuf, u32),
}

impl Make {
    fn apply(&self, root: &Path) {
        use std::os::unix::ffi::OsStrExt;
        match self {
            Make::Dir(p) => fs::create_dir_all(root.join(p)).unwrap(),
            Make::File {
                at,
                data,
                len,
                mode,
                mtime,
            } => {
                let p = root.join(at);
                let _ = fs::remove_file(&p);
                let f = fs::File::create(&p).unwrap();
                use std::os::unix::fs::FileExt;
                f.write_all_at(data, 0).unwrap();
                f.set_len(*len).unwrap();
                f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(*mtime))
                    .unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
            }
            Make::Symlink(at, to) => symlink(to, root.join(at)).unwrap(),
            Make::Hardlink(at, to) => fs::hard_link(root.join(to), root.join(at)).unwrap(),
            Make::Fifo(at) => {
                let c = std::ffi::CString::new(root.join(at).as_os_str().as_bytes()).unwrap();
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    c.as_c_str(),
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o644),
                    0,
                )
                .unwrap();
            }
            Make::DirMode(p, mode) => {
                fs::set_permissions(root.join(p), fs::Permissions::from_mode(*mode)).unwrap()
            }
        }
    }
}

/// Names a user can meet: plain, with spaces, a newline, bytes that are
/// not UTF-8, a leading dash, a backup-like suffix.
fn odd_name(rng: &mut Rng, i: usize) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let stem: &[u8] = match rng.below(7) {
        0 => b"with space",
        1 => b"new\nline",
        2 => b"\xff\xfebin",
        3 => b"-dash",
        4 => b"f~",
        _ => b"f",
    };
    let mut v = stem.to_vec();
    v.extend_from_slice(format!("{i}").as_bytes());
    PathBuf::from(std::ffi::OsString::from_vec(v))
}

/// A random tree under `top`: files (empty, small, with zero runs and
/// holes, several modes and times), directories, symbolic links (to
/// siblings, dangling, to directories), hardlinks and FIFOs.
fn random_tree(rng: &mut Rng, top: &Path, steps: &mut Vec<Make>, depth: u32) {
    steps.push(Make::Dir(top.to_path_buf()));
    let mut files: Vec<PathBuf> = Vec::new();
    let n = 1 + rng.below(6) as usize;
    for i in 0..n {
        let name = top.join(odd_name(rng, i));
        match rng.below(10) {
            0..=4 => {
                let size = *rng.pick(&[0u64, 1, 100, 4096, 5000, 70_000]);
                let mut data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                if size > 4096 && rng.chance(50) {
                    data[..4096].fill(0); // a zero block for --sparse=always
                }
                let len = size + if rng.chance(20) { 1 << 20 } else { 0 };
                steps.push(Make::File {
                    at: name.clone(),
                    data,
                    len,
                    mode: *rng.pick(&[0o644, 0o600, 0o755, 0o444, 0o640]),
                    mtime: 1_000_000_000 + rng.below(1000),
                });
                files.push(name);
            }
            5 | 6 if depth < 2 => random_tree(rng, &name, steps, depth + 1),
            7 => {
                let to = match (files.last(), rng.below(3)) {
                    (Some(f), 0) => PathBuf::from(f.file_name().unwrap()),
                    (_, 1) => PathBuf::from("../nowhere"),
                    _ => PathBuf::from("."),
                };
                steps.push(Make::Symlink(name, to));
            }
            8 if !files.is_empty() => {
                let to = rng.pick(&files).clone();
                steps.push(Make::Hardlink(name, to));
            }
            9 => steps.push(Make::Fifo(name)),
            _ => {}
        }
    }
    if depth > 0 && rng.chance(15) {
        steps.push(Make::DirMode(top.to_path_buf(), 0o700));
    }
}

/// The destination before the copy: nothing, an empty directory, or an
/// earlier copy of part of the source whose files differ (content, mode,
/// time), so that the replace rules (-n, -u, -f) have work.
fn random_destination(rng: &mut Rng, source: &[Make], steps: &mut Vec<Make>) -> &'static str {
    match rng.below(3) {
        0 => "absent",
        1 => {
            steps.push(Make::Dir(PathBuf::from("d")));
            "empty"
        }
        _ => {
            steps.push(Make::Dir(PathBuf::from("d")));
            for m in source {
                let under = |p: &Path| Path::new("d").join(p);
                match m {
                    Make::Dir(p) => steps.push(Make::Dir(under(p))),
                    Make::File { at, .. } if rng.chance(60) => steps.push(Make::File {
                        at: under(at),
                        data: b"older copy\n".to_vec(),
                        len: 11,
                        mode: *rng.pick(&[0o644, 0o600, 0o444]),
                        mtime: 1_000_000_000 + rng.below(2000),
                    }),
                    _ => {}
                }
            }
            "partial"
        }
    }
}

/// Options drawn for a case: always a recursive copy, plus a random set
/// of the options (`-i` has its own test; `-s` needs absolute sources).
fn random_options(rng: &mut Rng) -> String {
    let mut o = vec![(*rng.pick(&["-r", "-R", "-a", "-rp", "-rd", "-rL", "-rH"])).to_string()];
    for (percent, opt) in [
        (20, "-n"),
        (20, "-u"),
        (20, "-f"),
        (15, "--sparse=always"),
        (15, "--sparse=never"),
        (20, "--reflink=never"),
        (15, "--preserve=mode,links"),
        (10, "--no-preserve=mode"),
        (10, "--attributes-only"),
        (10, "-l"),
        (10, "-T"),
        (10, "-b"),
        (10, "--backup=numbered"),
        (10, "--remove-destination"),
    ] {
        if rng.chance(percent) {
            o.push(opt.to_string());
        }
    }
    o.join(" ")
}

/// Random trees, random destinations and random option sets, each run by
/// GNU cp and by cowlink as cp in sibling directories: the same exit
/// status, and trees with the same names, types, modes, contents and
/// hardlinks (`rsync --checksum -niHAX`). Every case is listed before the
/// test fails, with its seed.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn random_trees_and_options_end_as_gnu_cp_leaves_them() {
    let x = testfs!(Xfs);
    let gnu_cp = named_cp(x.path(), "gnu-bin", Path::new("/bin/cp"));
    let our_cp = named_cp(x.path(), "bin", Path::new(env!("CARGO_BIN_EXE_cowlink")));
    let mut failures = Vec::new();
    let cases: u64 = std::env::var("COWLINK_CP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let first: u64 = std::env::var("COWLINK_CP_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for seed in first..first + cases {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut src = Vec::new();
        random_tree(&mut rng, Path::new("s"), &mut src, 0);
        let mut steps = src.clone();
        let dest = random_destination(&mut rng, &src, &mut steps);
        let args = format!("{} s d", random_options(&mut rng));
        let case = x.path().join(format!("case-{seed}"));
        let (g, c) = (case.join("gnu"), case.join("cowlink"));
        for d in [&g, &c] {
            fs::create_dir_all(d).unwrap();
            for m in &steps {
                m.apply(d);
            }
        }
        let gnu = run(&gnu_cp, &g, &args, "");
        let ours = run(&our_cp, &c, &args, "");
        let diff = rsync_diff(&g, &c, false);
        if gnu.status.code() != ours.status.code() || !diff.is_empty() {
            failures.push(format!(
                "seed {seed}: cp {args} (destination {dest}): exit GNU {:?} ours {:?}\n  \
                 GNU: {}\n  ours: {}\n  diff: {diff}",
                gnu.status.code(),
                ours.status.code(),
                text(&gnu.stderr).trim(),
                text(&ours.stderr).trim(),
            ));
        } else {
            let _ = fs::remove_dir_all(&case);
        }
    }
    if !failures.is_empty() && std::env::var_os("COWLINK_CP_KEEP").is_some() {
        // Keep the differing cases to look at (under the printed path).
        eprintln!("kept in {}", x.path().display());
        std::mem::forget(x);
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases differ from GNU cp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
