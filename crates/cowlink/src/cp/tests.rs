//! Table tests of cp's pure decisions: no filesystem. The same-file
//! matrix is coreutils' tests/cp/same-file.sh (coreutils 9.1), its
//! expected output verbatim; the other tables are the cases coreutils'
//! cp tests check (backup, update, interactive, special files).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::decide::*;
use super::*;

fn st(kind: FileKind, ino: u64, nlink: u64) -> StatFacts {
    StatFacts {
        kind,
        dev: 1,
        ino,
        size: 4,
        mtime: 100,
        mtime_nsec: 0,
        mode: match kind {
            FileKind::Symlink => 0o120777,
            FileKind::Dir => 0o40755,
            FileKind::Fifo => 0o10644,
            _ => 0o100644,
        },
        nlink,
    }
}

/// The directory same-file.sh builds for one `args`: names, their lstat,
/// and a symlink's target.
struct World(Vec<(&'static str, StatFacts, Option<&'static str>)>);

impl World {
    fn of(args: &str) -> World {
        let hardlink = args.contains("hardlink");
        let hlsl = args.contains("hlsl");
        let foo = st(FileKind::File, 1, if hardlink { 2 } else { 1 });
        let mut w = vec![("foo", foo, None)];
        if args.contains("symlink") {
            w.push(("symlink", st(FileKind::Symlink, 2, 1), Some("foo")));
        }
        if hardlink {
            w.push(("hardlink", foo, None));
        }
        if args.contains("sl1") {
            w.push(("sl1", st(FileKind::Symlink, 3, 1), Some("foo")));
        }
        if args.contains("sl2") {
            let sl2 = st(FileKind::Symlink, 4, if hlsl { 2 } else { 1 });
            w.push(("sl2", sl2, Some("foo")));
            if hlsl {
                w.push(("hlsl", sl2, Some("foo")));
            }
        }
        World(w)
    }

    fn lstat(&self, name: &str) -> Option<StatFacts> {
        self.0.iter().find(|e| e.0 == name).map(|e| e.1)
    }

    fn target(&self, name: &str) -> Option<&'static str> {
        self.0.iter().find(|e| e.0 == name).and_then(|e| e.2)
    }

    fn stat(&self, name: &str) -> Option<StatFacts> {
        match self.target(name) {
            Some(t) => self.stat(t),
            None => self.lstat(name),
        }
    }
}

/// cp's options for same-file.sh's option words.
fn options_of(word: &str) -> CpOptions {
    let mut o = CpOptions::default();
    if word == "--rem" {
        o.remove_destination = true;
        return o;
    }
    for c in word.trim_start_matches('-').chars() {
        match c {
            'd' => {
                o.deref = Deref::Never;
                o.preserve_links = true;
            }
            'f' => o.force = true,
            'b' => o.backup = Some(Backup::Numbered),
            'l' => o.link = Some(LinkKind::Hard),
            's' => o.link = Some(LinkKind::Symbolic),
            other => panic!("option {other}"),
        }
    }
    o
}

/// What the library decides for `cp OPTIONS SRC DST` in `w`, gathering
/// the facts as `apply` does.
fn decide_in(w: &World, o: &CpOptions, src: &str, dst: &str) -> Result<Decision, Refusal> {
    let follow = o.deref != Deref::Never;
    let s = if follow { w.stat(src) } else { w.lstat(src) }.expect("source exists");
    let role = role(o, &s)?;
    let mut old = w.lstat(dst).expect("destination exists");
    let mut dst_name = dst;
    if !role.use_lstat && old.kind == FileKind::Symlink {
        assert_eq!(
            through_link(o, false, Followed::Exists),
            Ok(Some(ThroughLink::Through))
        );
        dst_name = w.target(dst).expect("a link");
        old = w.lstat(dst_name).expect("its target");
    }
    let facts = ExistingFacts {
        src: s,
        old,
        same: SameFileFacts {
            src: s,
            dst: old,
            src_link: w.lstat(src),
            dst_link: w.lstat(dst),
            src_target: w.stat(src),
            dst_target: w.stat(dst),
            same_name: src == dst,
        },
        backup_over_self: o.force
            && o.backup.is_some()
            && src == dst
            && w.stat(dst).is_some_and(|m| m.kind == FileKind::File),
        writable: true,
        just_created: false,
        src_is_dot: false,
    };
    existing(o, role, &facts, Path::new(dst_name), &mut |_| true)
}

/// coreutils 9.1 tests/cp/same-file.sh, expected output (Linux: a
/// hardlink to a symlink does not follow it, so nothing is elided).
const SAME_FILE_EXPECTED: &str = "\
1 [cp: 'foo' and 'symlink' are the same file] (foo symlink -> foo)
1 -d [cp: 'foo' and 'symlink' are the same file] (foo symlink -> foo)
1 -f [cp: 'foo' and 'symlink' are the same file] (foo symlink -> foo)
1 -df [cp: 'foo' and 'symlink' are the same file] (foo symlink -> foo)
0 --rem (foo symlink)
0 -b (foo symlink symlink.~1~ -> foo)
0 -bd (foo symlink symlink.~1~ -> foo)
0 -bf (foo symlink symlink.~1~ -> foo)
0 -bdf (foo symlink symlink.~1~ -> foo)
1 -l [cp: cannot create hard link 'symlink' to 'foo'] (foo symlink -> foo)
1 -dl [cp: cannot create hard link 'symlink' to 'foo'] (foo symlink -> foo)
0 -fl (foo symlink)
0 -dfl (foo symlink)
0 -bl (foo symlink symlink.~1~ -> foo)
0 -bdl (foo symlink symlink.~1~ -> foo)
0 -bfl (foo symlink symlink.~1~ -> foo)
0 -bdfl (foo symlink symlink.~1~ -> foo)
1 -s [cp: cannot create symlink 'symlink' to 'foo'] (foo symlink -> foo)
0 -sf (foo symlink -> foo)

1 [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
1 -d [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
1 -f [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
1 -df [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
1 --rem [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
1 -b [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
0 -bd (foo -> foo foo.~1~ symlink -> foo) symlink-loop symlink-loop
1 -bf [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
0 -bdf (foo -> foo foo.~1~ symlink -> foo) symlink-loop symlink-loop
0 -l (foo symlink -> foo)
0 -dl (foo symlink -> foo)
0 -fl (foo symlink -> foo)
0 -bl (foo symlink -> foo)
0 -bfl (foo symlink -> foo)
1 -s [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)
1 -sf [cp: 'symlink' and 'foo' are the same file] (foo symlink -> foo)

1 [cp: 'foo' and 'foo' are the same file] (foo)
1 -d [cp: 'foo' and 'foo' are the same file] (foo)
1 -f [cp: 'foo' and 'foo' are the same file] (foo)
1 -df [cp: 'foo' and 'foo' are the same file] (foo)
1 --rem [cp: 'foo' and 'foo' are the same file] (foo)
1 -b [cp: 'foo' and 'foo' are the same file] (foo)
1 -bd [cp: 'foo' and 'foo' are the same file] (foo)
0 -bf (foo foo.~1~)
0 -bdf (foo foo.~1~)
0 -l (foo)
0 -dl (foo)
0 -fl (foo)
0 -dfl (foo)
0 -bl (foo)
0 -bdl (foo)
0 -bfl (foo foo.~1~)
0 -bdfl (foo foo.~1~)
1 -s [cp: 'foo' and 'foo' are the same file] (foo)
1 -sf [cp: 'foo' and 'foo' are the same file] (foo)

1 [cp: 'sl1' and 'sl2' are the same file] (foo sl1 -> foo sl2 -> foo)
0 -d (foo sl1 -> foo sl2 -> foo)
1 -f [cp: 'sl1' and 'sl2' are the same file] (foo sl1 -> foo sl2 -> foo)
0 -df (foo sl1 -> foo sl2 -> foo)
0 --rem (foo sl1 -> foo sl2)
0 -b (foo sl1 -> foo sl2 sl2.~1~ -> foo)
0 -bd (foo sl1 -> foo sl2 -> foo sl2.~1~ -> foo)
0 -bf (foo sl1 -> foo sl2 sl2.~1~ -> foo)
0 -bdf (foo sl1 -> foo sl2 -> foo sl2.~1~ -> foo)
1 -l [cp: cannot create hard link 'sl2' to 'sl1'] (foo sl1 -> foo sl2 -> foo)
0 -fl (foo sl1 -> foo sl2)
0 -bl (foo sl1 -> foo sl2 sl2.~1~ -> foo)
0 -bfl (foo sl1 -> foo sl2 sl2.~1~ -> foo)
1 -s [cp: cannot create symlink 'sl2' to 'sl1'] (foo sl1 -> foo sl2 -> foo)
0 -sf (foo sl1 -> foo sl2 -> sl1)

1 [cp: 'foo' and 'hardlink' are the same file] (foo hardlink)
1 -d [cp: 'foo' and 'hardlink' are the same file] (foo hardlink)
1 -f [cp: 'foo' and 'hardlink' are the same file] (foo hardlink)
1 -df [cp: 'foo' and 'hardlink' are the same file] (foo hardlink)
0 --rem (foo hardlink)
0 -b (foo hardlink hardlink.~1~)
0 -bd (foo hardlink hardlink.~1~)
0 -bf (foo hardlink hardlink.~1~)
0 -bdf (foo hardlink hardlink.~1~)
0 -l (foo hardlink)
0 -dl (foo hardlink)
0 -fl (foo hardlink)
0 -dfl (foo hardlink)
0 -bl (foo hardlink)
0 -bdl (foo hardlink)
0 -bfl (foo hardlink)
0 -bdfl (foo hardlink)
1 -s [cp: 'foo' and 'hardlink' are the same file] (foo hardlink)
1 -sf [cp: 'foo' and 'hardlink' are the same file] (foo hardlink)

1 [cp: 'hlsl' and 'sl2' are the same file] (foo hlsl -> foo sl2 -> foo)
0 -d (foo hlsl -> foo sl2 -> foo)
1 -f [cp: 'hlsl' and 'sl2' are the same file] (foo hlsl -> foo sl2 -> foo)
0 -df (foo hlsl -> foo sl2 -> foo)
0 --rem (foo hlsl -> foo sl2)
0 -b (foo hlsl -> foo sl2 sl2.~1~ -> foo)
0 -bd (foo hlsl -> foo sl2 -> foo sl2.~1~ -> foo)
0 -bf (foo hlsl -> foo sl2 sl2.~1~ -> foo)
0 -bdf (foo hlsl -> foo sl2 -> foo sl2.~1~ -> foo)
1 -l [cp: cannot create hard link 'sl2' to 'hlsl'] (foo hlsl -> foo sl2 -> foo)
0 -dl (foo hlsl -> foo sl2 -> foo)
0 -fl (foo hlsl -> foo sl2)
0 -dfl (foo hlsl -> foo sl2 -> foo)
0 -bl (foo hlsl -> foo sl2 sl2.~1~ -> foo)
0 -bdl (foo hlsl -> foo sl2 -> foo)
0 -bfl (foo hlsl -> foo sl2 sl2.~1~ -> foo)
0 -bdfl (foo hlsl -> foo sl2 -> foo)
1 -s [cp: cannot create symlink 'sl2' to 'hlsl'] (foo hlsl -> foo sl2 -> foo)
0 -sf (foo hlsl -> foo sl2 -> hlsl)
";

const SAME_FILE_ARGS: [&str; 6] = [
    "foo symlink",
    "symlink foo",
    "foo foo",
    "sl1 sl2",
    "foo hardlink",
    "hlsl sl2",
];

/// Every row of the matrix: the library refuses with "are the same file"
/// exactly where GNU does, and decides a backup exactly where GNU's
/// listing shows one (`.~1~`) after a success.
#[test]
fn same_file_matrix_of_coreutils() {
    let groups: Vec<&str> = SAME_FILE_EXPECTED.split("\n\n").collect();
    assert_eq!(groups.len(), SAME_FILE_ARGS.len());
    let mut rows = 0;
    for (args, group) in SAME_FILE_ARGS.iter().zip(groups) {
        let (src, dst) = args.split_once(' ').expect("two names");
        let w = World::of(args);
        for line in group.lines() {
            let mut words = line.split(' ');
            let status = words.next().expect("status");
            let option = words.next().filter(|w| w.starts_with('-')).unwrap_or("");
            let o = options_of(option);
            let got = decide_in(&w, &o, src, dst);
            let case = format!("cp {option} {args}: {got:?}");
            let refused_same = line.contains("are the same file");
            assert_eq!(got == Err(Refusal::SameFile), refused_same, "{case}");
            if status == "0" {
                let backup = matches!(
                    got,
                    Ok(Decision::Replace(Replace {
                        backup: Some(_),
                        ..
                    }))
                );
                assert_eq!(backup, line.contains(".~1~"), "{case}");
            }
            rows += 1;
        }
    }
    assert_eq!(rows, 6 * 19 - 7, "every row of the matrix was checked");
}

#[test]
fn same_file_spot_checks() {
    // cp -l F F: nothing to do; cp -fb F F: the backup is the copy.
    let w = World::of("foo foo");
    assert_eq!(
        decide_in(&w, &options_of("-l"), "foo", "foo"),
        Ok(Decision::Keep(KeepReason::Same))
    );
    assert_eq!(
        decide_in(&w, &options_of("-bf"), "foo", "foo"),
        Ok(Decision::Replace(Replace {
            backup: Some(BackupHow::CopySelf),
            ..Replace::default()
        }))
    );
    // --remove-destination over a symlink to the source: removed first.
    let w = World::of("foo symlink");
    assert_eq!(
        decide_in(&w, &options_of("--rem"), "foo", "symlink"),
        Ok(Decision::Replace(Replace {
            remove_first: true,
            ..Replace::default()
        }))
    );
}

fn facts(src: StatFacts, old: StatFacts) -> ExistingFacts {
    ExistingFacts {
        src,
        old,
        same: SameFileFacts {
            src,
            dst: old,
            src_link: Some(src),
            dst_link: Some(old),
            src_target: Some(src),
            dst_target: Some(old),
            same_name: false,
        },
        backup_over_self: false,
        writable: true,
        just_created: false,
        src_is_dot: false,
    }
}

fn at(mtime: i64, nsec: i64, ino: u64) -> StatFacts {
    StatFacts {
        mtime,
        mtime_nsec: nsec,
        ..st(FileKind::File, ino, 1)
    }
}

fn run(o: &CpOptions, f: &ExistingFacts) -> Result<Decision, Refusal> {
    let role = role(o, &f.src)?;
    existing(o, role, f, Path::new("d"), &mut |_| panic!("not asked"))
}

/// tests/cp/update.sh: -n / --update=none keep, none-fail fails, older
/// keeps what is not older (to the nanosecond), all replaces.
#[test]
fn update_table() {
    let older = at(100, 0, 2);
    let same = at(200, 5, 2);
    let newer = at(200, 6, 2);
    let src = at(200, 5, 1);
    let keep = |r| Ok(Decision::Keep(r));
    let replace = Ok(Decision::Replace(Replace::default()));
    let cases: [(Update, StatFacts, Result<Decision, Refusal>); 9] = [
        (Update::All, newer, replace.clone()),
        (Update::None, older, keep(KeepReason::NoClobber)),
        (Update::None, newer, keep(KeepReason::NoClobber)),
        (Update::NoneFail, older, Err(Refusal::NotReplacing)),
        (Update::Older, older, replace.clone()),
        (Update::Older, same, keep(KeepReason::NotOlder)),
        (Update::Older, newer, keep(KeepReason::NotOlder)),
        (Update::All, older, replace.clone()),
        (Update::NoneFail, newer, Err(Refusal::NotReplacing)),
    ];
    for (update, old, want) in cases {
        let o = CpOptions {
            update,
            ..CpOptions::default()
        };
        assert_eq!(run(&o, &facts(src, old)), want, "{update:?} over {old:?}");
    }
    // A file an interrupted copy left (the unfinished mark) is never up
    // to date, however new.
    let unfinished = StatFacts {
        mode: 0o101644,
        ..newer
    };
    let o = CpOptions {
        update: Update::Older,
        ..CpOptions::default()
    };
    assert_eq!(run(&o, &facts(src, unfinished)), replace);
}

/// -i asks through the callback, with GNU's question; no keeps the file.
/// An unwritable file names the mode it overrides.
#[test]
fn interactive_asks_through_the_callback() {
    let o = CpOptions {
        interactive: true,
        ..CpOptions::default()
    };
    let src = at(200, 0, 1);
    let mut f = facts(src, at(100, 0, 2));
    for answer in [true, false] {
        let mut asked = Vec::new();
        let role = role(&o, &src).unwrap();
        let got = existing(&o, role, &f, Path::new("b"), &mut |p| {
            asked.push(p.question());
            answer
        });
        assert_eq!(asked, ["overwrite 'b'? "]);
        let want = if answer {
            Decision::Replace(Replace::default())
        } else {
            Decision::Keep(KeepReason::Declined)
        };
        assert_eq!(got, Ok(want));
    }
    f.writable = false;
    f.old.mode = 0o100444;
    let mut asked = String::new();
    let role = role(&o, &src).unwrap();
    let _ = existing(&o, role, &f, Path::new("b"), &mut |p| {
        asked = p.question();
        true
    });
    assert_eq!(asked, "replace 'b', overriding mode 0444 (r--r--r--)? ");
    // -n wins over -i: nobody is asked.
    let o = CpOptions {
        interactive: true,
        update: Update::None,
        ..CpOptions::default()
    };
    assert_eq!(
        run(&o, &f),
        Ok(Decision::Keep(KeepReason::NoClobber)),
        "-n decides first"
    );
}

/// An unwritable destination: refused, unless -f or
/// --remove-destination (then removed first) or a backup.
#[test]
fn unwritable_destination() {
    let src = at(200, 0, 1);
    let mut f = facts(src, at(100, 0, 2));
    f.writable = false;
    assert_eq!(run(&CpOptions::default(), &f), Err(Refusal::NotWritable));
    for o in [
        CpOptions {
            force: true,
            ..CpOptions::default()
        },
        CpOptions {
            remove_destination: true,
            ..CpOptions::default()
        },
    ] {
        assert_eq!(
            run(&o, &f),
            Ok(Decision::Replace(Replace {
                remove_first: true,
                ..Replace::default()
            }))
        );
    }
    let o = CpOptions {
        backup: Some(Backup::Simple),
        ..CpOptions::default()
    };
    assert_eq!(
        run(&o, &f),
        Ok(Decision::Replace(Replace {
            backup: Some(BackupHow::Rename),
            ..Replace::default()
        }))
    );
}

/// Directory/non-directory clashes, just-created names (tests/cp/
/// into-self.sh, tests/cp/cp-HL.sh), FIFOs written into, names a symlink
/// cannot take (tests/cp/special-f.sh).
#[test]
fn kinds_and_names() {
    let file = at(1, 0, 1);
    let dir = st(FileKind::Dir, 5, 2);
    let rec = CpOptions {
        recursive: true,
        ..CpOptions::default()
    };
    assert_eq!(
        role(&CpOptions::default(), &dir),
        Err(Refusal::OmitDirectory)
    );
    assert_eq!(run(&rec, &facts(dir, file)), Err(Refusal::NonDirWithDir));
    assert_eq!(run(&rec, &facts(file, dir)), Err(Refusal::DirWithNonDir));
    assert_eq!(
        run(&rec, &facts(dir, st(FileKind::Dir, 6, 2))),
        Ok(Decision::Replace(Replace {
            dir_existed: true,
            ..Replace::default()
        }))
    );
    let mut f = facts(file, at(1, 0, 2));
    f.just_created = true;
    assert_eq!(run(&rec, &f), Err(Refusal::JustCreated));
    // Numbered backups make a new name each time: allowed.
    let numbered = CpOptions {
        backup: Some(Backup::Numbered),
        ..CpOptions::default()
    };
    assert!(run(&numbered, &f).is_ok());
    // A file's data goes into an existing FIFO.
    let fifo = st(FileKind::Fifo, 7, 1);
    assert_eq!(
        run(&CpOptions::default(), &facts(file, fifo)),
        Ok(Decision::Replace(Replace {
            write_into: true,
            ..Replace::default()
        }))
    );
    // With -R, a FIFO source is recreated: -R -P removes the old name,
    // -R -L (following) finds it taken unless -f.
    let fifo_src = st(FileKind::Fifo, 8, 1);
    let never = CpOptions {
        recursive: true,
        deref: Deref::Never,
        ..CpOptions::default()
    };
    let remove = Ok(Decision::Replace(Replace {
        remove_first: true,
        ..Replace::default()
    }));
    assert_eq!(run(&never, &facts(fifo_src, file)), remove);
    assert_eq!(
        run(&rec, &facts(fifo_src, file)),
        Err(Refusal::NameTaken(FileKind::Fifo))
    );
    let forced = CpOptions {
        force: true,
        ..rec.clone()
    };
    assert_eq!(run(&forced, &facts(fifo_src, file)), remove);
    // --copy-contents reads it as data instead.
    let contents = CpOptions {
        copy_contents: true,
        ..rec.clone()
    };
    assert!(role(&contents, &fifo_src).unwrap().as_file);
    assert!(!role(&rec, &fifo_src).unwrap().as_file);
    // Without -r a FIFO is read as data too.
    assert!(role(&CpOptions::default(), &fifo_src).unwrap().as_file);
}

/// A symlink at the destination: written through, created (POSIXLY_CORRECT),
/// looped (-f removes it), refused when this run made it.
#[test]
fn destination_symlinks() {
    let o = CpOptions::default();
    let posix = CpOptions {
        posixly_correct: true,
        ..CpOptions::default()
    };
    let force = CpOptions {
        force: true,
        ..CpOptions::default()
    };
    let cases = [
        (&o, false, Followed::Exists, Ok(Some(ThroughLink::Through))),
        (&o, false, Followed::Dangling, Err(Refusal::DanglingSymlink)),
        (
            &posix,
            false,
            Followed::Dangling,
            Ok(Some(ThroughLink::CreateTarget)),
        ),
        (&o, false, Followed::Loop, Ok(None)),
        (
            &force,
            false,
            Followed::Loop,
            Ok(Some(ThroughLink::RemoveLoop)),
        ),
        (&o, true, Followed::Exists, Err(Refusal::ThroughJustCreated)),
    ];
    for (o, created, followed, want) in cases {
        assert_eq!(through_link(o, created, followed), want, "{followed:?}");
    }
    // Only a regular file copied as data is written through a link.
    let file = at(1, 0, 1);
    assert!(!role(&o, &file).unwrap().use_lstat);
    for o in [
        CpOptions {
            link: Some(LinkKind::Hard),
            ..CpOptions::default()
        },
        CpOptions {
            backup: Some(Backup::Simple),
            ..CpOptions::default()
        },
        CpOptions {
            remove_destination: true,
            ..CpOptions::default()
        },
    ] {
        assert!(role(&o, &file).unwrap().use_lstat, "{o:?}");
    }
}

/// Backup names (tests/cp/backup-1.sh, backup-is-src.sh): simple with the
/// suffix, numbered one above the highest, existing switches on the
/// first numbered one; a backup that is the source is refused.
#[test]
fn backups() {
    let d = Path::new("dir/f");
    let sfx = OsStr::new("~");
    assert_eq!(backup_name(Backup::Simple, d, sfx, 7), Path::new("dir/f~"));
    assert_eq!(
        backup_name(Backup::Simple, d, OsStr::new(".bak"), 0),
        Path::new("dir/f.bak")
    );
    assert_eq!(
        backup_name(Backup::Numbered, d, sfx, 0),
        Path::new("dir/f.~1~")
    );
    assert_eq!(
        backup_name(Backup::Numbered, d, sfx, 9),
        Path::new("dir/f.~10~")
    );
    assert_eq!(
        backup_name(Backup::Existing, d, sfx, 0),
        Path::new("dir/f~")
    );
    assert_eq!(
        backup_name(Backup::Existing, d, sfx, 2),
        Path::new("dir/f.~3~")
    );
    let b = OsStr::new("f");
    assert_eq!(backup_number(b, OsStr::new("f.~12~")), Some(12));
    for not in ["f.~~", "f.~1", "f~", "g.~1~", "f.~1a~", "f.~-1~"] {
        assert_eq!(backup_number(b, OsStr::new(not)), None, "{not}");
    }
    let src = at(1, 0, 1);
    let other = at(1, 0, 2);
    assert!(backup_destroys_source(Backup::Simple, Some(&src), &src));
    assert!(!backup_destroys_source(Backup::Numbered, Some(&src), &src));
    assert!(!backup_destroys_source(Backup::Simple, Some(&other), &src));
    assert!(!backup_destroys_source(Backup::Simple, None, &src));
    // Backups of `.` and `..` are never made.
    let mut f = facts(src, other);
    f.src_is_dot = true;
    let o = CpOptions {
        backup: Some(Backup::Simple),
        ..CpOptions::default()
    };
    assert_eq!(run(&o, &f), Ok(Decision::Replace(Replace::default())));
}

#[test]
fn backup_words_and_prefixes() {
    assert_eq!(Backup::parse("t").unwrap(), Some(Backup::Numbered));
    assert_eq!(Backup::parse("nil").unwrap(), Some(Backup::Existing));
    assert_eq!(Backup::parse("sim").unwrap(), Some(Backup::Simple));
    assert_eq!(Backup::parse("off").unwrap(), None);
    let e = Backup::parse("n").unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidInput);
    assert!(Backup::parse("bogus").is_err());
}

/// Modes of new files: the source's less the umask, or the default mode
/// (`--no-preserve=mode`); resume recognises a finished copy only.
#[test]
fn modes_and_resume() {
    assert_eq!(new_mode(FileKind::File, 0o100755, false, 0o022), 0o755);
    assert_eq!(new_mode(FileKind::File, 0o100777, false, 0o027), 0o750);
    assert_eq!(new_mode(FileKind::File, 0o100755, true, 0o022), 0o644);
    assert_eq!(new_mode(FileKind::Dir, 0o40700, true, 0o002), 0o775);
    assert_eq!(default_mode(FileKind::File, 0), 0o666);
    let src = at(5, 7, 1);
    assert!(complete_copy(&src, &at(5, 7, 2)));
    assert!(!complete_copy(&src, &at(5, 8, 2)));
    assert!(!complete_copy(
        &src,
        &StatFacts {
            size: 3,
            ..at(5, 7, 2)
        }
    ));
    assert!(!complete_copy(
        &src,
        &StatFacts {
            mode: 0o101644,
            ..at(5, 7, 2)
        }
    ));
    assert!(!complete_copy(&src, &st(FileKind::Symlink, 2, 1)));
}

/// Operands over a made-up tree: `d/` and `e/` are directories, `f` a
/// file, everything else missing.
fn operands_of(line: &str) -> Result<Vec<(String, String)>, String> {
    let mut o = CpOptions::default();
    let mut target = Target::default();
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut t_dir = None;
    let mut words = line.split(' ');
    while let Some(w) = words.next() {
        match w {
            "-r" => o.recursive = true,
            "--parents" => o.parents = true,
            "--strip-trailing-slashes" => target.strip_trailing_slashes = true,
            "-T" => target.no_directory = true,
            "-t" => t_dir = words.next().map(PathBuf::from),
            p => paths.push(p.into()),
        }
    }
    let dest = match t_dir {
        Some(d) => {
            target.directory = true;
            d
        }
        None => paths.pop().expect("a destination"),
    };
    let is_dir = |p: &Path| {
        Ok(match p.to_str().unwrap().trim_end_matches('/') {
            "d" | "e" => Some(true),
            "f" => Some(false),
            _ => None,
        })
    };
    operands(&paths, &dest, target, &o, &is_dir)
        .map(|v| {
            v.into_iter()
                .map(|op| (op.src.display().to_string(), op.dst.display().to_string()))
                .collect()
        })
        .map_err(|e| e.reason())
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn operands_follow_gnu() {
    assert_eq!(operands_of("a b").unwrap(), pairs(&[("a", "b")]));
    assert_eq!(operands_of("x/a d").unwrap(), pairs(&[("x/a", "d/a")]));
    assert_eq!(
        operands_of("a b d").unwrap(),
        pairs(&[("a", "d/a"), ("b", "d/b")])
    );
    assert_eq!(
        operands_of("a b f").unwrap_err(),
        "target 'f' is not a directory"
    );
    assert_eq!(
        operands_of("a b nothere").unwrap_err(),
        "target 'nothere': No such file or directory"
    );
    assert_eq!(
        operands_of("a new/").unwrap_err(),
        "cannot create regular file 'new/': Not a directory"
    );
    assert_eq!(
        operands_of("-t e a b").unwrap(),
        pairs(&[("a", "e/a"), ("b", "e/b")])
    );
    assert_eq!(operands_of("-T a d").unwrap(), pairs(&[("a", "d")]));
    assert_eq!(operands_of("-T a b d").unwrap_err(), "extra operand 'd'");
    assert_eq!(operands_of("-r x/. d").unwrap(), pairs(&[("x/.", "d/.")]));
    assert_eq!(
        operands_of("--parents a/b/f d").unwrap(),
        pairs(&[("a/b/f", "d/a/b/f")])
    );
    assert_eq!(
        operands_of("--parents a f").unwrap_err(),
        "with --parents, the destination must be a directory"
    );
    assert_eq!(
        operands_of("--strip-trailing-slashes x/ d").unwrap(),
        pairs(&[("x", "d/x")])
    );
    assert_eq!(base_name(Path::new("a/b/")), "b");
    assert_eq!(base_name(Path::new("../x/..")), "..");
    assert_eq!(join(Path::new("d/"), OsStr::new(".")), Path::new("d/."));
}
