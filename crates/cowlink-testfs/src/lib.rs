//! Test support: the real filesystems `scripts/testfs up` mounts, and the
//! helpers the integration tests share.
//!
//! A test asks for a filesystem with [`testfs!`] ([`Fs::dir`]). The path
//! comes from an environment variable (`COWLINK_TEST_XFS`, ...). When it
//! is set, the filesystem kind is asserted with `statfs` first, so a broken
//! setup fails instead of silently testing the root filesystem. When it is
//! unset the test **fails**, naming the variable: there is no skip path, so
//! a test can never pass without having run. Tests that need these
//! filesystems (or root, or the test servers) carry
//! `#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]`
//! ([`NEEDS_TESTFS`] says it in words): plain `cargo test` reports them as
//! ignored, and `scripts/test` runs them with `--include-ignored`. A new
//! filesystem test that forgets the attribute fails under plain
//! `cargo test` instead of passing.
#![deny(missing_docs)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

pub mod hostile;
pub mod relay;
pub mod s3;
pub mod toxiproxy;

/// The test filesystems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    /// XFS made with reflink=1.
    Xfs,
    /// Btrfs.
    Btrfs,
    /// Btrfs mounted with `compress=zstd` (1 GiB).
    BtrfsZstd,
    /// ext4 (no reflink).
    Ext4,
    /// tmpfs (no reflink, no FIEMAP).
    Tmpfs,
    /// A small ext4 (32 MiB) for filling up: ENOSPC tests.
    TinyExt4,
    /// A small XFS (300 MiB, reflink=1) for filling up: ENOSPC tests.
    TinyXfs,
    /// A small ext4 (64 MiB) for filling up during a tree copy.
    SmallExt4,
    /// A small ext4 (48 MiB) that a library tree copy fills mid-transfer.
    FillExt4,
}

impl Fs {
    /// The environment variable naming this filesystem's mount point.
    pub fn var(self) -> &'static str {
        match self {
            Fs::Xfs => "COWLINK_TEST_XFS",
            Fs::Btrfs => "COWLINK_TEST_BTRFS",
            Fs::BtrfsZstd => "COWLINK_TEST_BTRFS_ZSTD",
            Fs::Ext4 => "COWLINK_TEST_EXT4",
            Fs::Tmpfs => "COWLINK_TEST_TMPFS",
            Fs::TinyExt4 => "COWLINK_TEST_TINY_EXT4",
            Fs::TinyXfs => "COWLINK_TEST_TINY_XFS",
            Fs::SmallExt4 => "COWLINK_TEST_SMALL_EXT4",
            Fs::FillExt4 => "COWLINK_TEST_FILL_EXT4",
        }
    }

    /// The statfs magic this filesystem must have.
    pub fn magic(self) -> u64 {
        match self {
            Fs::Xfs | Fs::TinyXfs => 0x5846_5342,
            Fs::Btrfs | Fs::BtrfsZstd => 0x9123_683e,
            Fs::Ext4 | Fs::TinyExt4 | Fs::SmallExt4 | Fs::FillExt4 => 0xef53,
            Fs::Tmpfs => 0x0102_1994,
        }
    }

    /// A fresh, empty directory on this filesystem for one test, removed
    /// when dropped. While it lives the test shares the test filesystems
    /// with others; [`serial`] waits until no one else uses them.
    ///
    /// # Panics
    /// When the variable is unset (the test was run without
    /// `scripts/testfs up`: it fails, never passes unrun), or set to a path
    /// that is not this kind of filesystem.
    #[track_caller]
    pub fn dir(self, test: &str) -> TestDir {
        let root = match std::env::var_os(self.var()) {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => panic!(
                "{test} needs {:?}, but {} is not set: run it through scripts/test, or \
                 `eval \"$(sudo scripts/testfs up)\"` first and pass --include-ignored",
                self,
                self.var()
            ),
        };
        assert_kind(&root, self);
        let hold = Shared::take();
        // Module paths hold "::", and a ':' in a path breaks what lists
        // paths with it (PATH, systemd's unit settings).
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-", test.replace("::", "-")))
            .tempdir_in(&root)
            .unwrap_or_else(|e| panic!("cannot make a test dir in {}: {e}", root.display()));
        TestDir { dir, _hold: hold }
    }
}

/// The reason every test that needs the test filesystems is ignored by
/// plain `cargo test`; `#[ignore = ...]` takes a literal, so the tests
/// spell it out: `needs the loop-mounted test filesystems: run scripts/test`.
pub const NEEDS_TESTFS: &str = "needs the loop-mounted test filesystems: run scripts/test";

/// A test's directory on one of the test filesystems ([`Fs::dir`]),
/// removed when dropped; dereferences to its [`tempfile::TempDir`].
#[derive(Debug)]
pub struct TestDir {
    // Dropped first: the directory goes before the share is given back.
    dir: tempfile::TempDir,
    _hold: Shared,
}

impl std::ops::Deref for TestDir {
    type Target = tempfile::TempDir;
    fn deref(&self) -> &tempfile::TempDir {
        &self.dir
    }
}

/// Who uses the test filesystems: tests holding a [`TestDir`] share them;
/// a test holding [`serial`]'s guard (one that measures free space, which
/// any other test's writes would disturb) has them alone. One lock for the
/// whole test binary, since all its tests write to the same filesystems.
struct Users {
    shared: usize,
    alone: Option<std::thread::ThreadId>,
    /// Tests waiting in [`serial`]: new tests wait behind them, so that a
    /// stream of short tests cannot keep them waiting to the end.
    waiting: usize,
}

static USERS: Mutex<Users> = Mutex::new(Users {
    shared: 0,
    alone: None,
    waiting: 0,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// The shares this thread holds (to refuse `serial()` after `testfs!`,
    /// which would wait for itself).
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn users() -> std::sync::MutexGuard<'static, Users> {
    USERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// One test's share of the test filesystems.
#[derive(Debug)]
struct Shared {
    counted: bool,
}

impl Shared {
    fn take() -> Shared {
        let me = std::thread::current().id();
        let mut u = users();
        if u.alone == Some(me) {
            // The test that has them alone makes its own directories.
            return Shared { counted: false };
        }
        // A test that holds a share already takes another at once: waiting
        // behind a serial test that waits for it would never end.
        let mine = HELD.with(|h| h.get()) > 0;
        while u.alone.is_some() || (u.waiting > 0 && !mine) {
            u = CHANGED.wait(u).unwrap_or_else(|e| e.into_inner());
        }
        u.shared += 1;
        HELD.with(|h| h.set(h.get() + 1));
        Shared { counted: true }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.counted {
            users().shared -= 1;
            HELD.with(|h| h.set(h.get().saturating_sub(1)));
            CHANGED.notify_all();
        }
    }
}

/// The test filesystems for this test alone, while the guard lives.
#[derive(Debug)]
pub struct Serial(());

impl Drop for Serial {
    fn drop(&mut self) {
        users().alone = None;
        CHANGED.notify_all();
    }
}

/// Wait until no other test of this binary uses the test filesystems,
/// then keep them for this test until the guard is dropped: for tests
/// that measure free space or fill a filesystem. Call it first, before
/// [`testfs!`].
///
/// # Panics
/// When this thread already holds a [`TestDir`] (it would wait for itself).
pub fn serial() -> Serial {
    assert_eq!(
        HELD.with(|h| h.get()),
        0,
        "serial() must come before testfs!: this test holds a shared test directory"
    );
    let me = std::thread::current().id();
    let mut u = users();
    u.waiting += 1;
    while u.alone.is_some() || u.shared > 0 {
        u = CHANGED.wait(u).unwrap_or_else(|e| e.into_inner());
    }
    u.waiting -= 1;
    u.alone = Some(me);
    Serial(())
}

/// What `rsync` would change to make tree `b` equal tree `a`, itemized
/// (empty when equal): contents by checksum, modes, owners, groups,
/// links, devices and specials, hardlinks, ACLs and xattrs, and with
/// `times` the modification times too (store manifests do not record
/// directory times, so the store's tests leave them out). `--delete`
/// reports names only `b` has.
///
/// # Panics
/// When rsync is missing or fails.
pub fn rsync_diff(a: &Path, b: &Path, times: bool) -> String {
    let flags = if times { "-aniHAX" } else { "-rlpgoDniHAX" };
    let out = std::process::Command::new("rsync")
        .args([flags, "--checksum", "--delete"])
        .arg(format!("{}/", a.display()))
        .arg(format!("{}/", b.display()))
        .output()
        .expect("rsync is installed (scripts/setup)");
    assert!(
        out.status.success(),
        "rsync failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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

/// A fresh directory on a test filesystem, named after the test's module
/// and line: `let dir = testfs!(Xfs);` ([`Fs::dir`]; fails when the
/// filesystem is not mounted).
#[macro_export]
macro_rules! testfs {
    ($fs:ident) => {
        $crate::Fs::$fs.dir(concat!(module_path!(), "-", line!()))
    };
}

/// Deterministic pseudo-random bytes (xorshift), different per seed:
/// incompressible test data whose equality can be checked.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Write `bytes` to a new file at `p` and flush it to disk.
///
/// # Panics
/// When the file cannot be written.
pub fn write_file(p: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
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

/// Every name under `dir` (recursively) that looks like one of cowlink's
/// named temporaries (`.NAME.cowlink-PID-N.tmp`).
///
/// # Panics
/// When `dir` cannot be read.
pub fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_name().to_string_lossy().contains(".cowlink-") {
                found.push(e.path());
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

/// Build, under `root` (created), a source tree with everything `cp -a`
/// must carry: files of several sizes, relative/absolute/dangling/looping
/// symlinks and a symlink to a directory, hardlinks within and across
/// directories (and one to a name outside the tree), modes (exec, private,
/// read-only, setuid, setgid and sticky directories, a read-only directory
/// with contents), owners, nanosecond times, xattrs and ACLs (access and
/// default), a FIFO, a socket and (as root) a character device, empty
/// directories, odd names (non-UTF-8, newline, leading dash, 255 bytes)
/// and `deep` levels of nesting. Returns the number of regular-file names.
///
/// # Panics
/// On any failure to build (the test cannot mean anything then).
pub fn rich_tree(root: &Path, deep: usize) -> usize {
    use rustix::fs::{self as rfs, AtFlags, FileType, Mode, Timespec, Timestamps, XattrFlags, CWD};
    use std::ffi::OsStr;
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{symlink, PermissionsExt};

    let p = |rel: &str| root.join(rel);
    let write = |rel: &Path, len: usize, seed: u8| {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        fs::write(rel, data).unwrap();
    };
    let chmod = |rel: &Path, mode: u32| {
        fs::set_permissions(rel, fs::Permissions::from_mode(mode)).unwrap();
    };
    let mut files = 0;
    for d in [
        "a",
        "b",
        "a/sub",
        "empty/nested",
        "setgid",
        "sticky",
        "ro",
        "acl",
    ] {
        fs::create_dir_all(p(d)).unwrap();
    }
    for (i, (rel, len)) in [
        ("a/small", 100),
        ("a/block", 4096),
        ("a/odd", 70_001),
        ("a/sub/big", 3 << 20),
        ("b/empty-file", 0),
        ("setgid/in-setgid", 5000),
        ("sticky/in-sticky", 8192),
        ("ro/inside-ro", 12_000),
        ("acl/with-acl", 6000),
        ("-leading-dash", 4100),
        ("new\nline", 4200),
        ("with space", 4300),
    ]
    .into_iter()
    .enumerate()
    {
        write(&p(rel), len, i as u8);
        files += 1;
    }
    for (name, seed) in [
        (OsStr::from_bytes(b"caf\xe9-latin1"), 40u8),
        (OsStr::new(&"n".repeat(255)), 41),
    ] {
        write(&root.join(name), 5000, seed);
        files += 1;
    }
    // Modes.
    write(&p("a/exec"), 4096 + 17, 50);
    chmod(&p("a/exec"), 0o755);
    write(&p("a/private"), 9000, 51);
    chmod(&p("a/private"), 0o600);
    write(&p("a/readonly"), 4500, 52);
    chmod(&p("a/readonly"), 0o444);
    write(&p("a/setuid"), 4600, 53);
    chmod(&p("a/setuid"), 0o4755);
    files += 4;
    chmod(&p("setgid"), 0o2775);
    chmod(&p("sticky"), 0o1777);
    // Hardlinks: within a directory, across directories, and to a name
    // outside the tree (so only one of its names is inside).
    fs::hard_link(p("a/odd"), p("a/odd-link")).unwrap();
    fs::hard_link(p("a/odd"), p("b/odd-link-elsewhere")).unwrap();
    let outside = root.with_extension("outside");
    write(&outside, 4096, 60);
    fs::hard_link(&outside, p("b/linked-outside")).unwrap();
    files += 3;
    // Symlinks.
    symlink("small", p("a/rel-link")).unwrap();
    symlink("/etc/hostname", p("abs-link")).unwrap();
    symlink("nowhere/at/all", p("dangling")).unwrap();
    symlink("loop2", p("loop1")).unwrap();
    symlink("loop1", p("loop2")).unwrap();
    symlink("self", p("self")).unwrap();
    symlink("a", p("dir-link")).unwrap();
    // Owners (as root), nanosecond times, xattrs, ACLs.
    if rustix::process::geteuid().is_root() {
        rfs::chown(
            p("a/private"),
            Some(rfs::Uid::from_raw(1234)),
            Some(rfs::Gid::from_raw(5678)),
        )
        .unwrap();
        rfs::chown(
            p("b"),
            Some(rfs::Uid::from_raw(4321)),
            Some(rfs::Gid::from_raw(8765)),
        )
        .unwrap();
        rfs::chownat(
            CWD,
            p("a/rel-link"),
            Some(rfs::Uid::from_raw(777)),
            None,
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
        rfs::mknodat(
            CWD,
            p("null-dev"),
            FileType::CharacterDevice,
            Mode::from_raw_mode(0o640),
            rfs::makedev(1, 3),
        )
        .unwrap();
    }
    rfs::mknodat(
        CWD,
        p("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o620),
        0,
    )
    .unwrap();
    drop(std::os::unix::net::UnixListener::bind(p("sock")).unwrap());
    rfs::setxattr(p("a/small"), "user.color", b"blue", XattrFlags::empty()).unwrap();
    rfs::setxattr(p("a"), "user.dir-note", b"kept", XattrFlags::empty()).unwrap();
    for args in [&["-m", "u:1234:rwx"][..], &["-d", "-m", "u:1234:rx"][..]] {
        let target = if args[0] == "-d" {
            p("acl")
        } else {
            p("acl/with-acl")
        };
        let ok = std::process::Command::new("setfacl")
            .args(args)
            .arg(&target)
            .status()
            .unwrap();
        assert!(
            ok.success(),
            "setfacl {args:?} failed (is the acl package installed?)"
        );
    }
    let ns = |s: i64, n: i64| Timespec {
        tv_sec: s,
        tv_nsec: n as _,
    };
    for (i, rel) in ["a/small", "a/odd", "a/sub/big", "b/empty-file"]
        .iter()
        .enumerate()
    {
        let t = Timestamps {
            last_access: ns(1_600_000_000 + i as i64, 111_111_111),
            last_modification: ns(1_500_000_000 + i as i64, 123_456_789 + i as i64),
        };
        rfs::utimensat(CWD, p(rel), &t, AtFlags::empty()).unwrap();
    }
    let t = Timestamps {
        last_access: ns(1_400_000_000, 5),
        last_modification: ns(1_400_000_001, 987_654_321),
    };
    rfs::utimensat(CWD, p("a/rel-link"), &t, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    // Deep nesting, with a file at the bottom.
    let mut deep_dir = p("deep");
    for _ in 0..deep {
        deep_dir.push("d");
    }
    fs::create_dir_all(&deep_dir).unwrap();
    write(&deep_dir.join("bottom"), 4096, 70);
    files += 1;
    // Read-only directory last: nothing can be created in it afterwards.
    chmod(&p("ro"), 0o555);
    files
}

/// A FUSE mount whose server never answers: the first access below it
/// blocks (killably, as a stale network mount does) until this is dropped.
/// Made by opening `/dev/fuse` and mounting with its descriptor, then never
/// reading from it. Dropping closes the descriptor, which aborts the
/// connection (blocked calls fail with `ENOTCONN`), then detaches the mount.
/// Lives in the system temporary directory, never inside a test filesystem,
/// so a crash cannot keep one of those busy.
pub struct DeadFuse {
    dir: PathBuf,
    dev: Option<rustix::fd::OwnedFd>,
}

impl DeadFuse {
    /// Mount one (root only). `Err` says why it could not be made.
    pub fn mount() -> Result<DeadFuse, String> {
        use rustix::fd::AsRawFd;
        use rustix::fs::{Mode, OFlags};
        let dev = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
        let dir = std::env::temp_dir().join(format!("cowlink-dead-fuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let data = std::ffi::CString::new(format!(
            "fd={},rootmode=40000,user_id=0,group_id=0",
            dev.as_raw_fd()
        ))
        .expect("no NUL");
        rustix::mount::mount(
            "cowlink-dead",
            &dir,
            "fuse.cowlink-dead",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            Some(data.as_c_str()),
        )
        .map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            format!("cannot mount FUSE on {}: {e}", dir.display())
        })?;
        Ok(DeadFuse {
            dir,
            dev: Some(dev),
        })
    }

    /// The mount point (do not touch it from the test process itself).
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for DeadFuse {
    fn drop(&mut self) {
        drop(self.dev.take());
        let _ = rustix::mount::unmount(&self.dir, rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A chain of `levels` directories named `d` below `root` (made relative
/// to descriptors, so it may go far beyond PATH_MAX), with the files
/// `a` and `b` (`bytes` each, identical) at every level in `files_at`.
/// Returns the path of the deepest directory.
pub fn deep_chain(root: &Path, levels: usize, files_at: &[usize], bytes: &[u8]) -> PathBuf {
    use rustix::fs::{Mode, OFlags};
    std::fs::create_dir_all(root).unwrap();
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(root, flags, Mode::empty()).unwrap();
    let mut path = root.to_path_buf();
    for level in 1..=levels {
        rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, "d", flags, Mode::empty()).unwrap();
        path.push("d");
        if files_at.contains(&level) {
            for name in ["a", "b"] {
                let f = rustix::fs::openat(
                    &dir,
                    name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                let mut f = std::fs::File::from(f);
                f.write_all(bytes).unwrap();
            }
        }
    }
    path
}

/// Where a Go-installed test server binary `name` is: the variable `var`
/// when set, else `PATH`, `$GOPATH/bin`, `~/go/bin`.
pub fn go_bin(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(g) = std::env::var_os("GOPATH") {
        dirs.push(PathBuf::from(g).join("bin"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(h).join("go/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The process's umask, as `/proc/self/status` reports it (reading it
/// with `umask(2)` would change it for every thread meanwhile).
///
/// # Panics
/// When `/proc` is not mounted.
pub fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .expect("a Umask: line");
    u32::from_str_radix(line.trim(), 8).expect("an octal umask")
}
