//! The decisions of a sync, as pure functions: from what `lstat` says of a
//! source entry and of the destination entry of the same name (plus the
//! few comparisons only the caller can make: contents, extended
//! attributes, a link's target) to one [`Action`] and the attributes that
//! differ ([`Changes`]). No filesystem here, so every rule is table-tested.
//!
//! The rules, in order:
//! - no destination entry: create it;
//! - a destination entry of another type: replace it as an entry (a
//!   symbolic link where a directory is expected is removed, never
//!   followed);
//! - a regular file whose data differs (size, modification time, or
//!   contents with `--checksum`), that an interrupted copy left (the
//!   unfinished mark), or that shares its inode with other names while its
//!   source does not: replace it with a new inode;
//! - a symbolic link or special file that differs in anything: recreate
//!   it (cheaper than changing it in place, and atomic by rename);
//! - otherwise only metadata that differs (mode, owner, times, extended
//!   attributes) is set, in place;
//! - nothing differs: keep it untouched (its inode and ctime stay).

use cowlink_sys::Stat;
use rustix::fs::FileType;

use crate::prim::place::left_unfinished;

/// The type of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A character or block device.
    Device,
    /// A FIFO or socket.
    Special,
}

impl EntryKind {
    /// The kind of an entry of mode `st_mode`.
    pub(crate) fn of_mode(st_mode: u32) -> EntryKind {
        match cowlink_sys::file_type(st_mode) {
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            FileType::CharacterDevice | FileType::BlockDevice => EntryKind::Device,
            FileType::Fifo | FileType::Socket => EntryKind::Special,
            _ => EntryKind::File,
        }
    }

    /// rsync's letter for the kind in an itemized line.
    fn letter(self) -> char {
        match self {
            EntryKind::File => 'f',
            EntryKind::Dir => 'd',
            EntryKind::Symlink => 'L',
            EntryKind::Device => 'D',
            EntryKind::Special => 'S',
        }
    }
}

/// What a sync does with one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Leave the destination entry as it is.
    Keep,
    /// Create the entry (the destination has no such name).
    Create,
    /// Replace the destination's data with a new inode (clone or copy),
    /// or recreate a symbolic link or special file.
    Replace,
    /// Set metadata (mode, owner, times, extended attributes) in place.
    Metadata,
    /// Remove an entry of another type and create the source's.
    ReplaceType,
    /// Make the name a hardlink to the copy of an earlier name of the same
    /// source inode.
    Hardlink,
    /// Remove the entry (`--delete`): the source has no such name.
    Delete,
}

/// The attributes found different, as rsync's itemize letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Changes {
    /// Contents differ (`--checksum`): `c`.
    pub checksum: bool,
    /// Size differs: `s`.
    pub size: bool,
    /// Modification time differs: `t`.
    pub time: bool,
    /// Permission bits differ: `p`.
    pub perms: bool,
    /// Owner differs: `o`.
    pub owner: bool,
    /// Group differs: `g`.
    pub group: bool,
    /// Extended attributes (and ACLs) differ: `x`.
    pub xattrs: bool,
}

impl Changes {
    /// Whether anything differs.
    pub fn any(&self) -> bool {
        self.checksum
            || self.size
            || self.time
            || self.perms
            || self.owner
            || self.group
            || self.xattrs
    }
}

/// What the plan needs to know of an entry: a summary of its `lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    pub(crate) kind: EntryKind,
    /// All of `st_mode` (type and bits).
    pub(crate) mode: u32,
    pub(crate) size: u64,
    pub(crate) mtime: (i64, u64),
    /// Status change time: when its metadata (xattrs too) last changed.
    pub(crate) ctime: (i64, u64),
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) nlink: u64,
    pub(crate) rdev: u64,
}

impl Facts {
    pub(crate) fn of(st: &Stat) -> Facts {
        Facts {
            kind: EntryKind::of_mode(st.st_mode),
            mode: st.st_mode,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink,
            rdev: st.st_rdev,
        }
    }
}

/// The options the decisions depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// Compare regular files by contents, not size and time.
    pub(crate) checksum: bool,
    /// Owners can be set (running as root): compare them.
    pub(crate) owners: bool,
    /// Extended attributes are carried: compare them.
    pub(crate) xattrs: bool,
    /// Hardlink groups are kept.
    pub(crate) hardlinks: bool,
}

/// What only the caller can find out, asked for by [`needs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Seen {
    /// The regular files' contents are equal.
    pub(crate) same_content: Option<bool>,
    /// The extended attributes are equal.
    pub(crate) same_xattrs: Option<bool>,
    /// The symbolic links' targets are equal.
    pub(crate) same_target: Option<bool>,
}

/// Which comparisons [`decide`] will want for this pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Needs {
    pub(crate) content: bool,
    pub(crate) xattrs: bool,
    pub(crate) target: bool,
}

/// The comparisons to make before deciding on `src` against `dst`.
pub(crate) fn needs(src: &Facts, dst: Option<&Facts>, rules: &Rules) -> Needs {
    let Some(dst) = dst.filter(|d| d.kind == src.kind) else {
        return Needs::default();
    };
    let file = src.kind == EntryKind::File;
    Needs {
        content: file && rules.checksum && src.size == dst.size && !unfinished(src, dst),
        // The quick check, for extended attributes: every change to them
        // moves the source's ctime, and a sync leaves the destination's
        // ctime later than the source's. So a source whose ctime is older
        // than its copy's has not changed since, and listing both (two
        // calls per file, as many as the stats) is skipped; --checksum
        // always compares. An attribute edited in DST alone is found with
        // --checksum, as contents edited there with their time kept are.
        xattrs: rules.xattrs
            && matches!(src.kind, EntryKind::File | EntryKind::Dir)
            && (rules.checksum || src.ctime >= dst.ctime),
        target: src.kind == EntryKind::Symlink,
    }
}

fn unfinished(src: &Facts, dst: &Facts) -> bool {
    left_unfinished(src.mode, dst.mode)
}

/// The metadata differences of two entries of the same kind.
fn metadata(src: &Facts, dst: &Facts, seen: &Seen, rules: &Rules) -> Changes {
    Changes {
        time: src.mtime != dst.mtime,
        perms: src.kind != EntryKind::Symlink && src.mode & 0o7777 != dst.mode & 0o7777,
        owner: rules.owners && src.uid != dst.uid,
        group: rules.owners && src.gid != dst.gid,
        xattrs: seen.same_xattrs == Some(false),
        ..Changes::default()
    }
}

impl Changes {
    fn all() -> Changes {
        Changes {
            checksum: true,
            size: true,
            time: true,
            perms: true,
            owner: true,
            group: true,
            xattrs: true,
        }
    }
}

/// The decision for one name: the source entry `src` (its directory
/// entries are handled by the caller) against the destination entry
/// `dst`, if any.
pub(crate) fn decide(
    src: &Facts,
    dst: Option<&Facts>,
    seen: &Seen,
    rules: &Rules,
) -> (Action, Changes) {
    let Some(dst) = dst else {
        return (Action::Create, Changes::all());
    };
    if dst.kind != src.kind {
        return (Action::ReplaceType, Changes::all());
    }
    let mut ch = metadata(src, dst, seen, rules);
    match src.kind {
        EntryKind::File => {
            ch.size = src.size != dst.size;
            ch.checksum = rules.checksum && !ch.size && seen.same_content == Some(false);
            let data = if rules.checksum {
                ch.size || ch.checksum
            } else {
                ch.size || ch.time
            };
            let split = rules.hardlinks && src.nlink == 1 && dst.nlink > 1;
            // An inode with names beyond the source's group (a DST made
            // with `cp -al` from an earlier copy, or groups not kept) is
            // not this name's alone: metadata set on it in place would
            // change those other names, outside DST too. A new inode
            // (a clone, cheap) is made instead.
            let shared = if rules.hardlinks {
                dst.nlink > src.nlink
            } else {
                dst.nlink > 1
            };
            if data || split || unfinished(src, dst) || (shared && ch.any()) {
                return (Action::Replace, ch);
            }
        }
        EntryKind::Dir => {}
        EntryKind::Symlink => {
            // A link's own mode means nothing on Linux; its target is its
            // data.
            ch.checksum = seen.same_target == Some(false);
            if ch.any() {
                return (Action::Replace, ch);
            }
        }
        EntryKind::Device | EntryKind::Special => {
            ch.checksum = src.rdev != dst.rdev || src.mode & 0o170000 != dst.mode & 0o170000;
            if ch.any() {
                return (Action::Replace, ch);
            }
        }
    }
    if ch.any() {
        (Action::Metadata, ch)
    } else {
        (Action::Keep, ch)
    }
}

/// The decision for a further name of a source inode whose first name's
/// copy is the destination inode `leader` (`(st_dev, st_ino)`): keep a
/// name that already is that inode, else link it.
pub(crate) fn decide_link(dst: Option<(u64, u64)>, leader: Option<(u64, u64)>) -> Action {
    match (dst, leader) {
        (Some(d), Some(l)) if d == l => Action::Keep,
        _ => Action::Hardlink,
    }
}

/// One line of a dry run or `--itemize-changes`, as `rsync -i` prints it:
/// eleven columns `YXcstpoguax` then the path.
///
/// - `Y`, the update: `>` data transferred (created or replaced), `c` a
///   local change (a directory, link or special file created), `h` a
///   hardlink, `.` metadata only, `*` a message (`*deleting`).
/// - `X`, the type: `f` file, `d` directory, `L` symbolic link, `D`
///   device, `S` FIFO or socket.
/// - then `c` contents (checksum, or a link's target), `s` size, `t`
///   modification time, `p` permissions, `o` owner, `g` group, `u` unused
///   (`.`), `a` unused (ACLs are extended attributes here, shown as `x`),
///   `x` extended attributes; a `.` where equal. A new entry shows
///   `+++++++++`.
pub fn itemize(action: Action, kind: EntryKind, changes: &Changes) -> String {
    if action == Action::Delete {
        return "*deleting  ".to_string();
    }
    let y = match (action, kind) {
        (Action::Hardlink, _) => 'h',
        (Action::Metadata | Action::Keep, _) => '.',
        (_, EntryKind::File) => '>',
        _ => 'c',
    };
    let mut s = String::with_capacity(11);
    s.push(y);
    s.push(kind.letter());
    if matches!(
        action,
        Action::Create | Action::ReplaceType | Action::Hardlink
    ) {
        s.push_str("+++++++++");
        return s;
    }
    let c = changes;
    for (on, l) in [
        (c.checksum, 'c'),
        (c.size, 's'),
        (c.time, 't'),
        (c.perms, 'p'),
        (c.owner, 'o'),
        (c.group, 'g'),
        (false, 'u'),
        (false, 'a'),
        (c.xattrs, 'x'),
    ] {
        s.push(if on { l } else { '.' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: Rules = Rules {
        checksum: false,
        owners: true,
        xattrs: true,
        hardlinks: true,
    };

    fn file(size: u64, mtime: i64) -> Facts {
        Facts {
            kind: EntryKind::File,
            mode: 0o100644,
            size,
            mtime: (mtime, 5),
            ctime: (mtime, 5),
            uid: 1000,
            gid: 1000,
            nlink: 1,
            rdev: 0,
        }
    }

    fn with(f: Facts, edit: impl FnOnce(&mut Facts)) -> Facts {
        let mut f = f;
        edit(&mut f);
        f
    }

    fn same() -> Seen {
        Seen {
            same_content: Some(true),
            same_xattrs: Some(true),
            same_target: Some(true),
        }
    }

    #[test]
    fn every_pair_of_entries_gets_its_action() {
        let f = file(10, 100);
        let dir = with(f, |x| {
            x.kind = EntryKind::Dir;
            x.mode = 0o40755
        });
        let link = with(f, |x| {
            x.kind = EntryKind::Symlink;
            x.mode = 0o120777
        });
        let fifo = with(f, |x| {
            x.kind = EntryKind::Special;
            x.mode = 0o10644
        });
        type Case = (&'static str, Facts, Option<Facts>, Seen, Rules, Action);
        let cases: Vec<Case> = vec![
            ("absent", f, None, same(), RULES, Action::Create),
            ("equal", f, Some(f), same(), RULES, Action::Keep),
            (
                "size",
                f,
                Some(file(11, 100)),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "mtime",
                f,
                Some(file(10, 101)),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "mtime ns",
                f,
                Some(with(f, |x| x.mtime.1 = 6)),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "mode only",
                f,
                Some(with(f, |x| x.mode = 0o100600)),
                same(),
                RULES,
                Action::Metadata,
            ),
            (
                "owner only",
                f,
                Some(with(f, |x| x.uid = 0)),
                same(),
                RULES,
                Action::Metadata,
            ),
            (
                "owner ignored without privileges",
                f,
                Some(with(f, |x| x.uid = 0)),
                same(),
                Rules {
                    owners: false,
                    ..RULES
                },
                Action::Keep,
            ),
            (
                "xattrs only",
                f,
                Some(f),
                Seen {
                    same_xattrs: Some(false),
                    ..same()
                },
                RULES,
                Action::Metadata,
            ),
            (
                "checksum: same content, other time",
                f,
                Some(file(10, 101)),
                same(),
                Rules {
                    checksum: true,
                    ..RULES
                },
                Action::Metadata,
            ),
            (
                "checksum: other content, same time",
                f,
                Some(f),
                Seen {
                    same_content: Some(false),
                    ..same()
                },
                Rules {
                    checksum: true,
                    ..RULES
                },
                Action::Replace,
            ),
            (
                "unfinished mark",
                f,
                Some(with(f, |x| x.mode = 0o101644)),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "hardlink group split",
                f,
                Some(with(f, |x| x.nlink = 2)),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "dst linked, hardlinks not kept",
                f,
                Some(with(f, |x| x.nlink = 2)),
                same(),
                Rules {
                    hardlinks: false,
                    ..RULES
                },
                Action::Keep,
            ),
            (
                "metadata of an inode shared beyond the group",
                with(f, |x| x.nlink = 2),
                Some(with(f, |x| {
                    x.nlink = 3;
                    x.mode = 0o100600;
                })),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "metadata of a group's own inode",
                with(f, |x| x.nlink = 2),
                Some(with(f, |x| {
                    x.nlink = 2;
                    x.mode = 0o100600;
                })),
                same(),
                RULES,
                Action::Metadata,
            ),
            (
                "metadata of a linked dst, hardlinks not kept",
                f,
                Some(with(f, |x| {
                    x.nlink = 2;
                    x.mode = 0o100600;
                })),
                same(),
                Rules {
                    hardlinks: false,
                    ..RULES
                },
                Action::Replace,
            ),
            (
                "file over dir",
                f,
                Some(dir),
                same(),
                RULES,
                Action::ReplaceType,
            ),
            (
                "dir over file",
                dir,
                Some(f),
                same(),
                RULES,
                Action::ReplaceType,
            ),
            (
                "symlink where a dir was",
                dir,
                Some(link),
                same(),
                RULES,
                Action::ReplaceType,
            ),
            ("dir merged", dir, Some(dir), same(), RULES, Action::Keep),
            (
                "dir times",
                dir,
                Some(with(dir, |x| x.mtime.0 = 1)),
                same(),
                RULES,
                Action::Metadata,
            ),
            ("link equal", link, Some(link), same(), RULES, Action::Keep),
            (
                "link retargeted",
                link,
                Some(link),
                Seen {
                    same_target: Some(false),
                    ..same()
                },
                RULES,
                Action::Replace,
            ),
            (
                "link mode means nothing",
                link,
                Some(with(link, |x| x.mode = 0o120755)),
                same(),
                RULES,
                Action::Keep,
            ),
            ("fifo equal", fifo, Some(fifo), same(), RULES, Action::Keep),
            (
                "fifo became socket",
                fifo,
                Some(with(fifo, |x| x.mode = 0o140644)),
                same(),
                RULES,
                Action::Replace,
            ),
            (
                "device number",
                with(fifo, |x| {
                    x.kind = EntryKind::Device;
                    x.mode = 0o20644;
                    x.rdev = 1
                }),
                Some(with(fifo, |x| {
                    x.kind = EntryKind::Device;
                    x.mode = 0o20644;
                    x.rdev = 2
                })),
                same(),
                RULES,
                Action::Replace,
            ),
        ];
        for (what, s, d, seen, rules, want) in cases {
            assert_eq!(decide(&s, d.as_ref(), &seen, &rules).0, want, "{what}");
        }
    }

    #[test]
    fn comparisons_are_asked_only_when_they_can_matter() {
        let f = file(10, 1);
        let ck = Rules {
            checksum: true,
            ..RULES
        };
        assert!(needs(&f, Some(&f), &ck).content);
        assert!(!needs(&f, Some(&file(11, 1)), &ck).content, "size decides");
        assert!(!needs(&f, Some(&f), &RULES).content, "no --checksum");
        assert!(!needs(&f, None, &ck).content);
        assert!(needs(&f, Some(&f), &RULES).xattrs, "same ctime: compared");
        let synced_later = with(f, |x| x.ctime.0 += 10);
        assert!(
            !needs(&f, Some(&synced_later), &RULES).xattrs,
            "source unchanged since its copy was made"
        );
        assert!(needs(&f, Some(&synced_later), &ck).xattrs, "--checksum");
        assert!(
            needs(&synced_later, Some(&f), &RULES).xattrs,
            "source newer"
        );
        let no_x = Rules {
            xattrs: false,
            ..RULES
        };
        assert!(!needs(&f, Some(&f), &no_x).xattrs);
        let link = with(f, |x| x.kind = EntryKind::Symlink);
        assert!(needs(&link, Some(&link), &RULES).target);
        assert!(!needs(&link, Some(&f), &RULES).target, "type differs");
    }

    #[test]
    fn later_names_link_unless_already_the_same_inode() {
        assert_eq!(decide_link(Some((1, 2)), Some((1, 2))), Action::Keep);
        assert_eq!(decide_link(Some((1, 3)), Some((1, 2))), Action::Hardlink);
        assert_eq!(decide_link(None, Some((1, 2))), Action::Hardlink);
        assert_eq!(decide_link(Some((1, 2)), None), Action::Hardlink);
    }

    #[test]
    fn itemized_lines_read_as_rsync_prints_them() {
        let f = file(10, 1);
        let (a, c) = decide(&f, None, &same(), &RULES);
        assert_eq!(itemize(a, EntryKind::File, &c), ">f+++++++++");
        let (a, c) = decide(&f, Some(&file(12, 2)), &same(), &RULES);
        assert_eq!(itemize(a, EntryKind::File, &c), ">f.st......");
        let (a, c) = decide(&f, Some(&with(f, |x| x.mode = 0o100600)), &same(), &RULES);
        assert_eq!(itemize(a, EntryKind::File, &c), ".f...p.....");
        let seen = Seen {
            same_xattrs: Some(false),
            ..same()
        };
        let (a, c) = decide(&f, Some(&f), &seen, &RULES);
        assert_eq!(itemize(a, EntryKind::File, &c), ".f........x");
        assert_eq!(
            itemize(Action::Create, EntryKind::Dir, &Changes::all()),
            "cd+++++++++"
        );
        assert_eq!(
            itemize(Action::Hardlink, EntryKind::File, &Changes::default()),
            "hf+++++++++"
        );
        assert_eq!(
            itemize(Action::Delete, EntryKind::File, &Changes::default()),
            "*deleting  "
        );
        let link = with(f, |x| x.kind = EntryKind::Symlink);
        let seen = Seen {
            same_target: Some(false),
            ..same()
        };
        let (a, c) = decide(&link, Some(&link), &seen, &RULES);
        assert_eq!(itemize(a, EntryKind::Symlink, &c), "cLc........");
    }
}
