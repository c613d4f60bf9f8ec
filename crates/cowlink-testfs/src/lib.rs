//! Test support: the real filesystems `scripts/testfs up` mounts.
//!
//! A test asks for a filesystem with [`Fs::dir`]. The path comes from an
//! environment variable (`COWLINK_TEST_XFS`, ...). When it is set, the
//! filesystem kind is asserted with `statfs` first, so a broken setup fails
//! instead of silently testing the root filesystem. When it is unset the
//! test is skipped with a message on the real stderr (not captured by the
//! test harness), unless `COWLINK_REQUIRE_TESTFS=1`, which makes it a
//! failure: the README test command and CI set it.
#![deny(missing_docs)]

use std::io::Write;
use std::path::{Path, PathBuf};

/// The test filesystems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    /// XFS made with reflink=1.
    Xfs,
    /// Btrfs.
    Btrfs,
    /// ext4 (no reflink).
    Ext4,
    /// tmpfs (no reflink, no FIEMAP).
    Tmpfs,
    /// A small ext4 (32 MiB) for filling up: ENOSPC tests.
    TinyExt4,
    /// A small XFS (300 MiB, reflink=1) for filling up: ENOSPC tests.
    TinyXfs,
}

impl Fs {
    /// The environment variable naming this filesystem's mount point.
    pub fn var(self) -> &'static str {
        match self {
            Fs::Xfs => "COWLINK_TEST_XFS",
            Fs::Btrfs => "COWLINK_TEST_BTRFS",
            Fs::Ext4 => "COWLINK_TEST_EXT4",
            Fs::Tmpfs => "COWLINK_TEST_TMPFS",
            Fs::TinyExt4 => "COWLINK_TEST_TINY_EXT4",
            Fs::TinyXfs => "COWLINK_TEST_TINY_XFS",
        }
    }

    /// The statfs magic this filesystem must have.
    pub fn magic(self) -> u64 {
        match self {
            Fs::Xfs | Fs::TinyXfs => 0x5846_5342,
            Fs::Btrfs => 0x9123_683e,
            Fs::Ext4 | Fs::TinyExt4 => 0xef53,
            Fs::Tmpfs => 0x0102_1994,
        }
    }

    /// A fresh, empty directory on this filesystem for one test, removed
    /// when dropped; `None` (after a loud message) when the filesystem is
    /// not configured and not required.
    ///
    /// # Panics
    /// When the variable is unset and `COWLINK_REQUIRE_TESTFS=1`, or set to
    /// a path that is not this kind of filesystem.
    pub fn dir(self, test: &str) -> Option<tempfile::TempDir> {
        let root = match std::env::var_os(self.var()) {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => {
                if std::env::var("COWLINK_REQUIRE_TESTFS").as_deref() == Ok("1") {
                    panic!(
                        "{} is not set but COWLINK_REQUIRE_TESTFS=1: run `scripts/testfs up` (as root) \
                         and export what it prints",
                        self.var()
                    );
                }
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED {test}: {} is not set (run `eval \"$(sudo scripts/testfs up)\"`)",
                    self.var()
                );
                return None;
            }
        };
        assert_kind(&root, self);
        Some(
            tempfile::Builder::new()
                .prefix(&format!("{test}-"))
                .tempdir_in(&root)
                .unwrap_or_else(|e| panic!("cannot make a test dir in {}: {e}", root.display())),
        )
    }
}

/// Panic unless `path` is on filesystem `fs`.
pub fn assert_kind(path: &Path, fs: Fs) {
    let st = rustix::fs::statfs(path).unwrap_or_else(|e| panic!("statfs {}: {e}", path.display()));
    assert_eq!(
        st.f_type as u64,
        fs.magic(),
        "{}={} is not {:?} (statfs magic {:#x})",
        fs.var(),
        path.display(),
        fs,
        st.f_type
    );
}

/// Skip-or-fail helper: `let Some(dir) = testfs!(Xfs) else { return };`
#[macro_export]
macro_rules! testfs {
    ($fs:ident) => {
        $crate::Fs::$fs.dir(concat!(module_path!(), "-", line!()))
    };
}

/// The names in `dir`, sorted: lets a test prove nothing unexpected (no
/// temporary, no partial file) is there.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
