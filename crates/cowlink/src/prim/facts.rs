//! What stat says of a source and its destination ([`StatFacts`]), and
//! the pure rules over those facts that both cp's plan
//! (`cp::decide`) and the tree copy (`tree/entry.rs`) apply: whether an
//! existing destination is up to date (`-u`, [`not_older`]), whether it
//! is a complete copy (`--resume`, [`complete_copy`]), and `-i`'s
//! question ([`Prompt`]). They live here, below both, so that there is
//! one implementation and `tree/` need not import `cp/`. No system calls.

use std::path::Path;

use rustix::fs::FileType;

use super::place::left_unfinished;
use crate::ground::name::quoted;

/// The type of a file, as stat tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (only from `lstat`).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A UNIX domain socket.
    Socket,
}

/// What stat says of one name: the facts every decision works from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFacts {
    /// The type.
    pub kind: FileKind,
    /// Device of the filesystem.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds.
    pub mtime: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: i64,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Number of hardlinks.
    pub nlink: u64,
}

impl StatFacts {
    /// The facts of `m` (no system call: the metadata is already read).
    pub fn of(m: &std::fs::Metadata) -> StatFacts {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let t = m.file_type();
        let kind = if t.is_file() {
            FileKind::File
        } else if t.is_dir() {
            FileKind::Dir
        } else if t.is_symlink() {
            FileKind::Symlink
        } else if t.is_fifo() {
            FileKind::Fifo
        } else if t.is_char_device() {
            FileKind::CharDevice
        } else if t.is_block_device() {
            FileKind::BlockDevice
        } else {
            FileKind::Socket
        };
        StatFacts {
            kind,
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            mode: m.mode(),
            nlink: m.nlink(),
        }
    }

    /// The facts of a raw `stat` (the tree copy's, relative to directory
    /// descriptors).
    pub(crate) fn of_stat(st: &cowlink_sys::Stat) -> StatFacts {
        let kind = match cowlink_sys::file_type(st.st_mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            FileType::Fifo => FileKind::Fifo,
            FileType::CharacterDevice => FileKind::CharDevice,
            FileType::BlockDevice => FileKind::BlockDevice,
            _ => FileKind::Socket,
        };
        StatFacts {
            kind,
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: st.st_mtime,
            mtime_nsec: st.st_mtime_nsec as i64,
            mode: st.st_mode,
            nlink: st.st_nlink,
        }
    }

    /// Device and inode: the file's identity.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }

    pub(crate) fn is_symlink(&self) -> bool {
        self.kind == FileKind::Symlink
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }

    pub(crate) fn is_file(&self) -> bool {
        self.kind == FileKind::File
    }

    pub(crate) fn is_special(&self) -> bool {
        !matches!(
            self.kind,
            FileKind::File | FileKind::Dir | FileKind::Symlink
        )
    }
}

/// A question for the `-i` callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prompt<'a> {
    /// The destination that would be replaced.
    pub dst: &'a Path,
    /// Its permission bits, when it is not writable (GNU then says it
    /// overrides them).
    pub overriding_mode: Option<u32>,
}

impl Prompt<'_> {
    /// GNU's question, without the program name: `overwrite 'b'? `.
    pub fn question(&self) -> String {
        match self.overriding_mode {
            None => format!("overwrite {}? ", quoted(self.dst)),
            Some(m) => format!(
                "replace {}, overriding mode {m:04o} ({})? ",
                quoted(self.dst),
                mode_string(m)
            ),
        }
    }
}

/// `ls -l`'s nine permission characters for `mode`.
pub fn mode_string(mode: u32) -> String {
    "rwxrwxrwx"
        .chars()
        .enumerate()
        .map(|(i, c)| if mode & (0o400 >> i) != 0 { c } else { '-' })
        .collect()
}

/// `-u`: whether the existing `old` is at least as new as `src` (then it
/// is kept). A file an interrupted copy left is never up to date.
pub fn not_older(src: &StatFacts, old: &StatFacts) -> bool {
    (old.mtime, old.mtime_nsec) >= (src.mtime, src.mtime_nsec)
        && !left_unfinished(src.mode, old.mode)
}

/// `--resume`: whether `old` (its `lstat`) is a complete copy of `src`
/// (its `stat`): a regular file with its size and modification time, to
/// the nanosecond, without the unfinished mark. A file an interrupted run
/// left never is: times are set after the data, and a file placed under
/// its final name carries the mark until its final mode.
pub fn complete_copy(src: &StatFacts, old: &StatFacts) -> bool {
    old.is_file()
        && !left_unfinished(src.mode, old.mode)
        && old.size == src.size
        && (old.mtime, old.mtime_nsec) == (src.mtime, src.mtime_nsec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The tree copy (raw `stat`) and cp (`std::fs::Metadata`) must see the
    /// same facts, or the one rule would answer differently for them.
    #[test]
    fn raw_stat_and_metadata_give_the_same_facts() {
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"abc").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o1640)).unwrap();
        std::os::unix::fs::symlink("f", d.path().join("l")).unwrap();
        for p in [f, d.path().join("l"), d.path().to_path_buf()] {
            let raw = cowlink_sys::lstat(&p).unwrap();
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!(StatFacts::of_stat(&raw), StatFacts::of(&m), "{p:?}");
        }
    }

    fn facts(mode: u32, size: u64, mtime: (i64, i64)) -> StatFacts {
        StatFacts {
            kind: if mode & 0o170000 == 0o100000 {
                FileKind::File
            } else {
                FileKind::Symlink
            },
            dev: 1,
            ino: 2,
            size,
            mtime: mtime.0,
            mtime_nsec: mtime.1,
            mode,
            nlink: 1,
        }
    }

    #[test]
    fn up_to_date_and_complete_ignore_files_an_interrupted_run_left() {
        let src = facts(0o100644, 10, (100, 5));
        // -u: same or newer time keeps, older replaces, to the nanosecond.
        assert!(not_older(&src, &facts(0o100644, 3, (100, 5))));
        assert!(not_older(&src, &facts(0o100644, 3, (101, 0))));
        assert!(!not_older(&src, &facts(0o100644, 3, (100, 4))));
        // The unfinished mark (sticky bit the source lacks) is never kept.
        assert!(!not_older(&src, &facts(0o101644, 3, (200, 0))));
        assert!(not_older(
            &facts(0o101644, 10, (100, 5)),
            &facts(0o101644, 3, (200, 0))
        ));
        // --resume: size and time must both match, on a regular file.
        assert!(complete_copy(&src, &facts(0o100600, 10, (100, 5))));
        assert!(!complete_copy(&src, &facts(0o100644, 9, (100, 5))));
        assert!(!complete_copy(&src, &facts(0o100644, 10, (100, 6))));
        assert!(!complete_copy(&src, &facts(0o101644, 10, (100, 5))));
        assert!(!complete_copy(&src, &facts(0o120777, 10, (100, 5))));
    }
}
