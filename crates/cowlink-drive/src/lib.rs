//! Dev drives: a volume that clones, made from an image file, for the many
//! developers whose disk is ext4.
//!
//! A drive is a sparse image file holding XFS (with reflink) or Btrfs,
//! attached to a loop device with direct I/O (the image's pages are not
//! cached a second time in the host's page cache) and `AUTOCLEAR` (the
//! device detaches itself when the drive is unmounted), and mounted with
//! `noatime`. [`create`] makes one in steps, each undone if a later one
//! fails, so a refusal or a failure leaves no image, loop device, mount,
//! record or boot entry behind; [`mount`], [`unmount`] and [`remove`] are
//! idempotent; [`list`] and [`status`] report each drive with what is
//! wrong with it (lost mount options, a loop device without direct I/O).
//!
//! What makes an image "a cowlink drive" is its record: one small JSON
//! file per drive in [`Places::state_dir`] (image, mount point,
//! filesystem, and the identities taken when `create` made them: the
//! image's device and inode, its filesystem's UUID, the mount point
//! directory's device and inode). A drive is recognised by those
//! identities, never by a path string: `remove`, `unmount`, `mount` and
//! `persist` all pass through `own` (a file) or `drive_mounted_at` (a
//! mount: a loop device whose backing device and inode, from
//! `LOOP_GET_STATUS64`, are a record's image, holding the recorded UUID,
//! mounted on the recorded directory) and refuse anything else with the
//! reason. Loop devices are matched to images the same way, so a name
//! reached through a bind mount, or one sysfs trims, is still the same
//! file. Records written before the identities existed are accepted only
//! when the image is what `create` makes (the recorded filesystem,
//! labelled `cowlink`), and are then migrated. Everything else (mounted or
//! not, loop state, use, whether it persists) is read live from the kernel
//! each time.
//!
//! [`create`] checks for cancellation ([`CreateOptions::cancel`]: Ctrl-C,
//! SIGTERM) between its steps; every step made is undone, last first, on a
//! cancel as on an error.
//!
//! Layout: this file has the operations and their reports; `device` the
//! kernel side (superblocks, loop devices, mounts, processes holding
//! files); `persist` the boot entry (a systemd unit or an fstab line).
//!
//! Everything here but [`list`], [`status`] and a dry run needs root.
//!
//! A crate of its own, apart from the `cowlink` library: it runs as root,
//! runs mkfs and writes systemd units, which a build tool or the Python
//! wheel embedding the library should neither compile nor carry. It uses
//! only the library's public API (errors, names, the mount table, probe);
//! its loop-device ioctls are in `cowlink-sys`. Linux only.
#![deny(missing_docs)]

mod device;
mod persist;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use device::FileId;
pub use device::{Holder, LoopState};
pub use persist::{watch_unit, write_unit, PersistKind, PersistPlan, PersistWith, Places};

use cowlink::name::quoted;
use cowlink::{Error, ErrorKind, Operation};

/// The filesystem a drive holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum DriveFs {
    /// XFS with reflink (`mkfs.xfs -m reflink=1`).
    #[default]
    Xfs,
    /// Btrfs.
    Btrfs,
}

impl DriveFs {
    /// The kernel's name for it (`xfs`, `btrfs`).
    pub fn name(self) -> &'static str {
        match self {
            DriveFs::Xfs => "xfs",
            DriveFs::Btrfs => "btrfs",
        }
    }

    /// The program that makes it.
    pub fn mkfs(self) -> &'static str {
        match self {
            DriveFs::Xfs => "mkfs.xfs",
            DriveFs::Btrfs => "mkfs.btrfs",
        }
    }

    /// The Debian/Fedora package holding [`mkfs`](Self::mkfs).
    pub fn package(self) -> &'static str {
        match self {
            DriveFs::Xfs => "xfsprogs",
            DriveFs::Btrfs => "btrfs-progs",
        }
    }

    /// `mkfs` arguments: label `cowlink`, 4 KiB sectors (so the loop
    /// device can use 4 KiB blocks, which direct I/O needs on disks with
    /// 4 KiB sectors), reflink on for XFS.
    fn mkfs_args(self, image: &Path) -> Vec<OsString> {
        let words: &[&str] = match self {
            DriveFs::Xfs => &["-q", "-m", "reflink=1", "-s", "size=4096", "-L", "cowlink"],
            DriveFs::Btrfs => &["-q", "--sectorsize", "4096", "-L", "cowlink"],
        };
        let mut v: Vec<OsString> = words.iter().map(OsString::from).collect();
        v.push(image.into());
        v
    }
}

impl std::fmt::Display for DriveFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Options for [`create`].
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The image's size in bytes (the filesystem's size; the file is
    /// sparse and fills as data is written).
    pub size: u64,
    /// Where to mount it: an empty directory, made if missing.
    pub mount: PathBuf,
    /// The filesystem.
    pub fs: DriveFs,
    /// Who gets the mount root (`uid`, `gid`); `None` leaves it to root.
    pub owner: Option<(u32, u32)>,
    /// Bring it back at boot, and how.
    pub persist: Option<PersistWith>,
    /// Allow a size beyond the free space of the image's filesystem.
    pub sparse_ok: bool,
    /// Check everything and say what would be written, but change nothing.
    pub dry_run: bool,
    /// Cancelled (Ctrl-C, SIGTERM): the step under way finishes, every
    /// step made is undone, and [`create`] fails with `Cancelled`.
    pub cancel: cowlink::CancelToken,
    /// For tests of the undo: after this step (0 = before any, 1 = mount
    /// point made … 8 = boot entry written) wait, saying so on stderr,
    /// until cancelled.
    #[doc(hidden)]
    pub pause_after_step: Option<u32>,
}

/// The steps of [`create`], in order: each is undone if a later one fails
/// or the run is cancelled.
const CREATE_STEPS: [&str; 8] = [
    "mount point made",
    "image made",
    "filesystem made",
    "loop device attached",
    "mounted",
    "owner set",
    "record written",
    "boot entry written",
];

/// Between two steps of [`create`]: the test pause, then the cancel check
/// (`Cancelled` unwinds every step made so far).
fn checkpoint(
    op: Operation,
    image: &Path,
    options: &CreateOptions,
    step: u32,
) -> Result<(), Error> {
    if options.pause_after_step == Some(step) {
        let name = match step {
            0 => "nothing made yet",
            n => CREATE_STEPS.get(n as usize - 1).copied().unwrap_or("?"),
        };
        eprintln!("cowlink: paused after step {step} ({name})");
        while !options.cancel.is_cancelled() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    match options.cancel.is_cancelled() {
        true => Err(Error::new(op, ErrorKind::Cancelled)
            .with_src(image)
            .with_reason("interrupted: every step made was undone")),
        false => Ok(()),
    }
}

/// What [`create`] did (or, on a dry run, would do).
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    /// The image file.
    pub image: PathBuf,
    /// The mount point.
    pub mount: PathBuf,
    /// The filesystem.
    pub fs: DriveFs,
    /// The image's size.
    pub size: u64,
    /// Nothing was changed.
    pub dry_run: bool,
    /// The boot entry written (or to be written).
    pub persist: Option<PersistPlan>,
    /// The drive as it now stands (`None` on a dry run).
    pub drive: Option<DriveInfo>,
}

/// A drive as it stands.
#[derive(Debug, Clone, Serialize)]
pub struct DriveInfo {
    /// The image file.
    pub image: PathBuf,
    /// Where it belongs.
    pub mount_point: PathBuf,
    /// Its filesystem.
    pub fs: DriveFs,
    /// The image file exists.
    pub image_exists: bool,
    /// The image's size (the filesystem's size).
    pub size: Option<u64>,
    /// Bytes the image takes on the host (it is sparse).
    pub image_allocated: Option<u64>,
    /// Mounted on [`mount_point`](Self::mount_point).
    pub mounted: bool,
    /// Mounted somewhere else instead.
    pub mounted_elsewhere: Option<PathBuf>,
    /// The filesystem's total and used bytes, when mounted.
    pub fs_total: Option<u64>,
    /// Used bytes, when mounted.
    pub fs_used: Option<u64>,
    /// Whether a trial clone works there, when mounted.
    pub reflink: Option<bool>,
    /// Why not, when it does not.
    pub reflink_reason: Option<String>,
    /// The mount options, when mounted.
    pub mount_options: Option<String>,
    /// The loop device, when attached.
    pub loop_device: Option<LoopState>,
    /// The mount root's owner, when mounted.
    pub owner_uid: Option<u32>,
    /// How it comes back at boot, if it does.
    pub persist: Option<PersistKind>,
    /// The unit or fstab holding the boot entry.
    pub persist_file: Option<PathBuf>,
    /// What is wrong, in words.
    pub warnings: Vec<String>,
}

/// What [`mount`] and [`unmount`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Done now.
    Done,
    /// Already so: nothing to do (direct I/O may have been switched on).
    Already,
}

/// The record that makes an image a cowlink drive: with the image's and
/// the mount point's identity (device and inode), so that a drive is
/// recognised as cowlink's own by what the file is, never by a name.
/// Records written before the identities existed (`image_id` absent) are
/// "legacy": see `own`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    image: PathBuf,
    mount: PathBuf,
    fs: DriveFs,
    /// The image file's device and inode, taken when it was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image_id: Option<FileId>,
    /// The mount point directory's device and inode (the directory itself,
    /// beneath any mount), taken when the drive was mounted on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mount_id: Option<FileId>,
    /// The UUID mkfs gave the image's filesystem (hex): with `image_id`,
    /// it tells the drive from a file that later got the same inode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image_uuid: Option<String>,
}

/// Whether the superblock `sb` is the one the record `r` was made with
/// (a record without a UUID: any); the reason when not.
fn same_filesystem(r: &Record, sb: Option<&device::Superblock>) -> Result<(), String> {
    let Some(want) = &r.image_uuid else {
        // No UUID recorded (a record from before they were, or edited):
        // at least what create makes, the recorded filesystem labelled
        // `cowlink`, never any file that has the identity.
        return match sb {
            Some(sb) if sb.fs == r.fs && sb.label == b"cowlink" => Ok(()),
            Some(sb) => Err(format!(
                "its record holds no filesystem UUID, and it holds {} labelled {:?}, not the \
                 {} labelled \"cowlink\" that drive create makes",
                sb.fs,
                String::from_utf8_lossy(&sb.label),
                r.fs
            )),
            None => Err(
                "its record holds no filesystem UUID, and it holds neither an XFS nor a Btrfs \
                 filesystem"
                    .into(),
            ),
        };
    };
    match sb {
        Some(sb) if &sb.uuid_hex() == want => Ok(()),
        Some(sb) => Err(format!(
            "it holds the {} filesystem {}, not the drive's {want} (the drive's file is gone \
             and another took its inode, or it was formatted again)",
            sb.fs,
            sb.uuid_hex()
        )),
        None => Err(format!(
            "it holds no XFS or Btrfs filesystem, not the drive's {want}"
        )),
    }
}

fn record_path(places: &Places, image: &Path) -> PathBuf {
    let h = blake3::hash(image.as_os_str().as_encoded_bytes()).to_hex();
    places.state_dir.join(format!("{}.json", &h[..16]))
}

/// The largest record read (a record is a few hundred bytes; anything
/// bigger in the state directory is not one).
const RECORD_MAX: u64 = 64 << 10;

fn read_record_file(p: &Path) -> Option<Record> {
    use std::io::Read;
    let f = device::open_image(p).ok()?;
    let mut text = Vec::new();
    f.take(RECORD_MAX).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

fn records(places: &Places) -> Vec<Record> {
    let Ok(dir) = fs::read_dir(&places.state_dir) else {
        return Vec::new();
    };
    let mut v: Vec<Record> = dir
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| read_record_file(&e.path()))
        .collect();
    v.sort_by(|a, b| a.image.cmp(&b.image));
    v
}

fn write_record(places: &Places, r: &Record) -> io::Result<()> {
    fs::create_dir_all(&places.state_dir)?;
    let text = serde_json::to_string_pretty(r).map_err(io::Error::other)? + "\n";
    persist::write_atomic(&record_path(places, &r.image), &text, 0o644)
}

fn remove_record(places: &Places, image: &Path) -> io::Result<()> {
    match fs::remove_file(record_path(places, image)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether the image behind a legacy record (one without identities) is
/// what [`create`] made: the filesystem the record names, labelled
/// `cowlink`. The reason when not.
fn legacy_image_matches(r: &Record) -> Result<(), String> {
    match device::superblock(&r.image) {
        Ok(Some(sb)) if sb.fs == r.fs && sb.label == b"cowlink" => Ok(()),
        Ok(Some(sb)) if sb.fs != r.fs => Err(format!("it holds {}, not {}", sb.fs, r.fs)),
        Ok(Some(sb)) => Err(format!(
            "its filesystem label is {:?}, not the \"cowlink\" that drive create gives",
            String::from_utf8_lossy(&sb.label)
        )),
        Ok(None) => Err("it holds neither an XFS nor a Btrfs filesystem".into()),
        Err(e) => Err(format!("cannot read it: {e}")),
    }
}

/// The record of the file `id` holding the superblock `sb`: among the
/// records with that device and inode (more than one when a drive's image
/// was deleted behind cowlink's back and a later drive's image got its
/// inode), the one whose filesystem UUID is `sb`'s. `None` when no record
/// has the identity; the first mismatch's reason when none matches.
fn record_with_id<'a>(
    all: &'a [Record],
    id: FileId,
    sb: Option<&device::Superblock>,
) -> Option<Result<&'a Record, String>> {
    let mut first_why = None;
    for r in all.iter().filter(|r| r.image_id == Some(id)) {
        match same_filesystem(r, sb) {
            Ok(()) => return Some(Ok(r)),
            Err(why) => {
                first_why.get_or_insert(why);
            }
        }
    }
    first_why.map(Err)
}

/// **The one rule for "is this cowlink's drive?"**, used by every
/// operation that could destroy or detach something (`remove`, `unmount`,
/// `mount` over a recorded image): the file `image` (a regular file whose
/// metadata is `meta`) is a drive when a record holds its device and
/// inode. A legacy record (written before records held them) for the same
/// path is accepted when the image is what `create` made (the record's
/// filesystem, label `cowlink`), and is then migrated: the identities are
/// written into it. Anything else is refused with the reason.
fn own(op: Operation, places: &Places, image: &Path, meta: &fs::Metadata) -> Result<Record, Error> {
    let not_ours = |why: String| {
        Error::new(op, ErrorKind::InvalidInput)
            .with_src(image)
            .with_reason(why)
    };
    if !meta.is_file() {
        return Err(not_ours(format!(
            "it is not a cowlink drive: a drive's image is a regular file, this is {}",
            file_type_name(&meta.file_type())
        )));
    }
    let id = FileId::of(meta);
    let all = records(places);
    let sb = device::superblock(image).ok().flatten();
    match record_with_id(&all, id, sb.as_ref()) {
        Some(Ok(r)) => return Ok(r.clone()),
        Some(Err(why)) => {
            return Err(not_ours(format!(
                "it is not the drive a record names, though it has that drive's {id}: {why}; \
                 nothing was done"
            )))
        }
        None => {}
    }
    if let Some(r) = all.iter().find(|r| r.image == image) {
        return match r.image_id {
            Some(was) => Err(not_ours(format!(
                "it is not the image cowlink made under this name: the drive record names \
                 the file with {was}, this one has {id} (was it replaced?); nothing was done"
            ))),
            None => match legacy_image_matches(r) {
                Ok(()) => {
                    let mut r = r.clone();
                    r.image_id = Some(id);
                    r.image_uuid = device::superblock(image)
                        .ok()
                        .flatten()
                        .map(|sb| sb.uuid_hex());
                    if rustix::process::geteuid().is_root() {
                        let _ = write_record(places, &r);
                    }
                    Ok(r)
                }
                Err(why) => Err(not_ours(format!(
                    "its drive record was written by an older cowlink, and the image is not \
                     what drive create made ({why}); nothing was done"
                ))),
            },
        };
    }
    Err(not_ours(
        "it is not a cowlink drive: no drive record names this file (cowlink changes only \
         the drives `drive create` made; see `cowlink drive list`)"
            .into(),
    ))
}

/// `own`, and `image` must be the name the record holds: a drive is
/// mounted and persisted under one name only (another name, a hard link or
/// the directory reached another way, would make a second record and a
/// second boot entry for one image).
fn own_by_this_name(
    op: Operation,
    places: &Places,
    image: &Path,
    meta: &fs::Metadata,
) -> Result<Record, Error> {
    let r = own(op, places, image, meta)?;
    if !same_name(&r.image, image) {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(image)
            .with_reason(format!(
                "it is another name (a hard link, or its directory reached another way) for \
                 the drive image {}: use that name",
                quoted(&r.image)
            )));
    }
    Ok(r)
}

/// Whether `given` (absolute, its existing part resolved) is the name a
/// record holds, `recorded`: the same string, or the recorded name now
/// resolving to it (its directory was moved and a symlink left in its
/// place). A hard link or the directory reached through a bind mount is
/// not the same name.
fn same_name(recorded: &Path, given: &Path) -> bool {
    recorded == given || fs::canonicalize(recorded).is_ok_and(|c| c == given)
}

/// Steps to undo, last first, unless [`Undo::done`].
#[derive(Default)]
struct Undo(Vec<Box<dyn FnOnce()>>);

impl Undo {
    fn push(&mut self, f: impl FnOnce() + 'static) {
        self.0.push(Box::new(f));
    }
    fn done(mut self) {
        self.0.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        while let Some(f) = self.0.pop() {
            f();
        }
    }
}

/// How long an undo waits for a loop device it let go to detach.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a drive command waits for another one to finish.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Held while a drive command changes anything: an exclusive `flock` on
/// the state directory itself (no lock file to leave behind), released
/// when dropped or when the process dies. Every operation that attaches,
/// mounts, unmounts, detaches, deletes or writes a record or boot entry
/// takes it first, before its checks, so that two commands never act on
/// what the other is changing: two `mount`s of one image would otherwise
/// both find it unmounted and attach it twice (two filesystems over one
/// image: corruption), a `remove` could delete an image a `mount` is
/// attaching.
struct StateLock(#[allow(dead_code)] rustix::fd::OwnedFd);

fn lock_state(
    op: Operation,
    places: &Places,
    cancel: Option<&cowlink::CancelToken>,
) -> Result<StateLock, Error> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let dir = &places.state_dir;
    let fail = |e: io::Error| Error::from_io(op, &e).with_src(dir);
    fs::create_dir_all(dir).map_err(fail)?;
    let fd = rustix::fs::open(
        dir,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(e.into()))?;
    let start = std::time::Instant::now();
    loop {
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(StateLock(fd)),
            Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(fail(e.into())),
        }
        if cancel.is_some_and(|c| c.is_cancelled()) {
            return Err(Error::new(op, ErrorKind::Cancelled)
                .with_src(dir)
                .with_reason(
                    "interrupted while waiting for another drive command; nothing was done",
                ));
        }
        if start.elapsed() > LOCK_WAIT {
            return Err(Error::new(op, ErrorKind::InUse)
                .with_src(dir)
                .with_reason(format!(
                    "another cowlink drive command has held this state directory for over {} s; \
                 nothing was done (try again when it has finished)",
                    LOCK_WAIT.as_secs()
                )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn require_root(op: Operation, path: &Path) -> Result<(), Error> {
    match rustix::process::geteuid().is_root() {
        true => Ok(()),
        false => Err(Error::new(op, ErrorKind::PermissionDenied)
            .with_src(path)
            .with_reason("needs root (it attaches a loop device and mounts)")),
    }
}

/// `p` made absolute against the current directory, `.` and `..` resolved
/// through the parts that exist; must be UTF-8 (it goes into unit files).
fn absolute(op: Operation, p: &Path) -> Result<PathBuf, Error> {
    let abs = std::path::absolute(p).map_err(|e| Error::from_io(op, &e).with_src(p))?;
    // Resolve the longest existing ancestor, keep the rest as written.
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    let resolved = loop {
        match fs::canonicalize(&existing) {
            Ok(c) => break c,
            Err(_) => match (
                existing.file_name().map(|n| n.to_owned()),
                existing.parent(),
            ) {
                (Some(n), Some(parent)) => {
                    rest.push(n);
                    existing = parent.to_path_buf();
                }
                _ => break existing,
            },
        }
    };
    let full = rest.into_iter().rev().fold(resolved, |acc, n| acc.join(n));
    if full.to_str().is_none() {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(p)
            .with_reason("drive paths must be valid UTF-8 (they are written into boot entries)"));
    }
    Ok(full)
}

/// Find a program on `PATH`, or in the sbin directories a non-login root
/// shell may lack.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn gib(n: u64) -> String {
    format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
}

/// The logical block size for a loop device over an image whose
/// filesystem has `sector`-byte sectors.
fn block_size_for(sector: u32) -> u32 {
    match sector {
        s if s >= 4096 => 4096,
        s if s.is_power_of_two() && s >= 512 => s,
        _ => 512,
    }
}

/// Make a drive: `image` of `options.size` bytes, formatted, attached,
/// mounted on `options.mount`, owned, recorded, persisted if asked; see
/// the module documentation.
///
/// # Errors
/// Refusals, before anything is made: not root (`PermissionDenied`),
/// `image` exists (`AlreadyExists`), the mount point is not an empty
/// directory or is a mount point already (`AlreadyExists`/`InUse`/
/// `NotADirectory`), the `mkfs` program is missing (`NotSupported`: this
/// machine cannot make the filesystem yet; the reason names the package),
/// the size exceeds the free space (`NoSpace`, unless
/// `sparse_ok`), the boot entry's unit exists (`AlreadyExists`). A failing
/// step (`mkfs`, loop setup, mount, writing the record or entry) fails the
/// whole and undoes every earlier step.
pub fn create(image: &Path, options: &CreateOptions, places: &Places) -> Result<Created, Error> {
    let op = Operation::DriveCreate;
    let image = absolute(op, image)?;
    let mount = absolute(op, &options.mount)?;
    let fs_ = options.fs;
    if options.size == 0 {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(&image)
            .with_reason("the size must be more than 0"));
    }
    if options.size > i64::MAX as u64 {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(&image)
            .with_reason(format!(
                "the size {} is more than the largest file Linux can make ({} bytes, 8 EiB)",
                options.size,
                i64::MAX
            )));
    }
    let _lock = match options.dry_run {
        true => None,
        false => {
            require_root(op, &image)?;
            Some(lock_state(op, places, Some(&options.cancel))?)
        }
    };
    // Refusals, before anything is made.
    if fs::symlink_metadata(&image).is_ok() {
        return Err(Error::new(op, ErrorKind::AlreadyExists)
            .with_src(&image)
            .with_reason("the image file already exists (remove it, or choose another name)"));
    }
    let image_dir = image.parent().unwrap_or(Path::new("/")).to_path_buf();
    if !image_dir.is_dir() {
        return Err(Error::new(op, ErrorKind::NotFound)
            .with_src(&image)
            .with_reason(format!(
                "its directory {} does not exist",
                quoted(&image_dir)
            )));
    }
    refuse_mount_over_image(op, &image, &mount)?;
    refuse_mount_over_state(op, places, &mount)?;
    let mount_exists = check_mount_point(op, &mount)?;
    // Not `NotFound`: that kind means a path given that does not exist (a
    // failed operation, exit 1); a missing tool means the command cannot
    // start here, like every other refusal (exit 2).
    let Some(mkfs) = find_program(fs_.mkfs()) else {
        return Err(Error::new(op, ErrorKind::NotSupported)
            .with_src(&image)
            .with_reason(format!(
                "{} is not installed: install the {} package (apt install {} / dnf install {})",
                fs_.mkfs(),
                fs_.package(),
                fs_.package(),
                fs_.package()
            )));
    };
    let free = rustix::fs::statvfs(&image_dir)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .map_err(|e| Error::from_errno(op, e).with_src(&image_dir))?;
    if options.size > free && !options.sparse_ok {
        return Err(Error::new(op, ErrorKind::NoSpace)
            .with_src(&image)
            .with_reason(format!(
                "{} is more than the {} free on {}: the drive could fill the host's disk \
             (add --sparse-ok to make it anyway: the image grows only as data is written)",
                gib(options.size),
                gib(free),
                quoted(&image_dir)
            )));
    }
    let plan = options
        .persist
        .map(|with| persist::plan(with, places, &image, &mount, fs_))
        .transpose()
        .map_err(|(p, why)| unexpressible(op, &p, why))?;
    if let Some(p) = &plan {
        if p.kind == PersistKind::Systemd && p.file.exists() {
            return Err(Error::new(op, ErrorKind::AlreadyExists)
                .with_src(&image)
                .with_reason(format!(
                    "the boot unit {} already exists: another drive is set to mount on {}",
                    quoted(&p.file),
                    quoted(&mount)
                )));
        }
    }
    let created = |drive| Created {
        image: image.clone(),
        mount: mount.clone(),
        fs: fs_,
        size: options.size,
        dry_run: options.dry_run,
        persist: plan.clone(),
        drive,
    };
    if options.dry_run {
        return Ok(created(None));
    }

    let mut undo = Undo::default();
    // The image made, once it is: what the undo must see detached.
    let mut made: Option<FileId> = None;
    let steps = (|| -> Result<Created, Error> {
        let undo = &mut undo;
        let step = |n: u32| checkpoint(op, &image, options, n);
        step(0)?;
        if !mount_exists {
            fs::create_dir(&mount).map_err(|e| Error::from_io(op, &e).with_src(&mount))?;
            let m = mount.clone();
            undo.push(move || drop(fs::remove_dir(m)));
        }
        let mount_id = device::dir_id_beneath_mounts(&mount)
            .ok()
            .flatten()
            .ok_or_else(|| {
                Error::new(op, ErrorKind::NotFound)
                    .with_src(&mount)
                    .with_reason("the mount point vanished while the drive was being made")
            })?;
        step(1)?;
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&image)
            .map_err(|e| Error::from_io(op, &e).with_src(&image))?;
        let image_id = file
            .metadata()
            .map(|m| FileId::of(&m))
            .map_err(|e| Error::from_io(op, &e).with_src(&image))?;
        made = Some(image_id);
        {
            // Undone by identity: only the file made here is removed, even if
            // the name was replaced meanwhile.
            let i = image.clone();
            undo.push(move || remove_if_same(&i, image_id));
            // Runs after the unmount and after the device was let go: a
            // device still held a moment by a prober must be gone before the
            // command says everything was undone.
            undo.push(move || {
                let _ = device::await_detached(image_id, DETACH_WAIT);
            });
        }
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_len(options.size)
                .and_then(|()| file.set_permissions(fs::Permissions::from_mode(0o600)))
                .map_err(|e| Error::from_io(op, &e).with_src(&image))?;
            drop(file);
        }
        step(2)?;
        let out = Command::new(&mkfs)
            .args(fs_.mkfs_args(&image))
            .output()
            .map_err(|e| {
                Error::from_io(op, &e)
                    .with_src(&image)
                    .with_reason(format!("cannot run {}: {e}", quoted(&mkfs)))
            })?;
        // A Ctrl-C from the terminal also reaches mkfs: the cancel is what
        // happened, not mkfs's failure. mkfs may be seen dead of it before
        // this process's handler has marked the cancel: its death by SIGINT or
        // SIGTERM is the cancel too.
        {
            use std::os::unix::process::ExitStatusExt;
            if matches!(out.status.signal(), Some(2 | 15)) {
                // SIGINT, SIGTERM.
                options.cancel.cancel();
            }
        }
        step(3)?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            // What it said before any usage text, at most 3 lines.
            let said: Vec<&str> = err
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .filter(|l| !l.trim().is_empty())
                .take(3)
                .collect();
            let said = said.join(" / ");
            return Err(Error::new(op, ErrorKind::Io)
                .with_src(&image)
                .with_reason(format!("{} failed ({}): {said}", fs_.mkfs(), out.status)));
        }
        let image_uuid = device::superblock(&image)
            .ok()
            .flatten()
            .map(|sb| sb.uuid_hex());
        let attached = attach(op, &image, image_id, 4096)?;
        step(4)?;
        mount_attached(op, &attached, &image, &mount, fs_, undo)?;
        step(5)?;
        if let Some((uid, gid)) = options.owner {
            std::os::unix::fs::chown(&mount, Some(uid), Some(gid))
                .map_err(|e| Error::from_io(op, &e).with_src(&mount))?;
        }
        step(6)?;
        let record = Record {
            image: image.clone(),
            mount: mount.clone(),
            fs: fs_,
            image_id: Some(image_id),
            mount_id: Some(mount_id),
            image_uuid,
        };
        write_record(places, &record)
            .map_err(|e| Error::from_io(op, &e).with_src(&places.state_dir))?;
        let (p2, i2) = (places.clone(), image.clone());
        undo.push(move || drop(remove_record(&p2, &i2)));
        step(7)?;
        if let Some(p) = &plan {
            persist::apply(p, places).map_err(|e| Error::from_io(op, &e).with_src(&p.file))?;
            let (p2, i2, m2) = (places.clone(), image.clone(), mount.clone());
            undo.push(move || drop(persist::remove(&p2, &i2, &m2)));
        }
        step(8)?;
        attached.keep();
        Ok(created(Some(info(&record, places))))
    })();
    match steps {
        Ok(c) => {
            undo.done();
            Ok(c)
        }
        Err(e) => {
            drop(undo);
            Err(undone(e, made, true))
        }
    }
}

/// `err` (a cancel, or a step that failed) once every step made was
/// undone: a cancel says so, and either says what is still there (a
/// loop device over `image`, attached by this command, that another
/// process keeps open: the kernel detaches it only when that lets go).
/// `made`: the image was made by this command (and so was deleted).
fn undone(err: Error, image: Option<FileId>, made: bool) -> Error {
    let left: Vec<String> = image
        .map(device::loops_of)
        .unwrap_or_default()
        .into_iter()
        .map(|(_, s)| s.device.display().to_string())
        .collect();
    let cancelled = err.kind() == ErrorKind::Cancelled;
    match (left.is_empty(), cancelled) {
        (true, false) => err,
        (true, true) => err.with_reason(match made {
            true => UNDONE,
            false => "interrupted: nothing was mounted (every step made was undone)",
        }),
        (false, _) => {
            let what = match cancelled {
                true => "interrupted: every step made was undone".to_string(),
                false => format!("{}; every step made was undone", err.reason()),
            };
            err.with_reason(format!(
                "{what}, but {} still holds the image{}: another process has it open \
                 (or a mount of it was detached lazily, being in use); the kernel detaches it \
                 when that lets go (see fuser -v {})",
                left.join(", "),
                if made { ", deleted" } else { "" },
                left[0]
            ))
        }
    }
}

/// What an interrupted [`create`] or [`mount`] says when nothing of it is
/// left.
const UNDONE: &str =
    "interrupted: every step made was undone (no image, mount, loop device, record or boot \
     entry is left)";

/// Remove `path` if it is still the file `id` (an undo removes only what
/// it made).
fn remove_if_same(path: &Path, id: FileId) {
    if fs::symlink_metadata(path).is_ok_and(|m| FileId::of(&m) == id) {
        let _ = fs::remove_file(path);
    }
}

/// Attach `image` (the file `id`) to a loop device with logical block size
/// `block`; detached again when dropped unless kept.
fn attach(op: Operation, image: &Path, id: FileId, block: u32) -> Result<device::Attached, Error> {
    let attached = device::attach(image, block).map_err(|(e, what)| {
        Error::from_errno(op, e)
            .with_src(image)
            .with_reason(format!("cannot {what}: {}", errno_text(e)))
    })?;
    // The name may have been replaced between the checks and the open:
    // the device must hold the very file checked.
    if attached.backing() != Some(id) {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(image)
            .with_reason(
                "the image was replaced while it was being attached; nothing was mounted",
            ));
    }
    Ok(attached)
}

/// Mount the attached device on `mount`; the unmount goes on `undo`.
fn mount_attached(
    op: Operation,
    attached: &device::Attached,
    image: &Path,
    mount: &Path,
    fs_: DriveFs,
    undo: &mut Undo,
) -> Result<(), Error> {
    device::mount(&attached.path(), mount, fs_).map_err(|e| {
        Error::from_errno(op, e)
            .with_src(image)
            .with_dst(mount)
            .with_reason(format!("mount failed: {}", errno_text(e)))
    })?;
    let m = mount.to_path_buf();
    undo.push(move || device::unmount_for_undo(&m));
    Ok(())
}

/// The kernel's text for an errno ("no such file or directory"), worded
/// as the core library words it in every error it reports, for reasons
/// that say which step failed.
fn errno_text(e: rustix::io::Errno) -> String {
    Error::from_errno(Operation::DriveStatus, e).reason()
}

/// "a directory", "a FIFO", ...: what a path that should be a drive's
/// image is instead, in words.
fn file_type_name(t: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match t {
        t if t.is_dir() => "a directory",
        t if t.is_fifo() => "a FIFO",
        t if t.is_socket() => "a socket",
        t if t.is_char_device() => "a character device",
        t if t.is_block_device() => "a block device",
        t if t.is_symlink() => "a symbolic link",
        t if t.is_file() => "a regular file",
        _ => "of unknown type",
    }
}

/// A path a boot entry cannot hold, as an error.
fn unexpressible(op: Operation, p: &Path, why: String) -> Error {
    Error::new(op, ErrorKind::InvalidInput)
        .with_src(p)
        .with_reason(format!("cannot write it into a boot entry: {why}"))
}

/// Refuse a mount point that is the image's directory or one of its
/// ancestors (compared by device and inode, so a bind mount or another
/// name for the same directory is caught): the drive would hide its own
/// image. `image` is absolute with its existing part resolved.
fn refuse_mount_over_image(op: Operation, image: &Path, mount: &Path) -> Result<(), Error> {
    let Ok(m) = fs::metadata(mount) else {
        return Ok(()); // made empty by us: it cannot hold the image
    };
    let mid = FileId::of(&m);
    for dir in image.ancestors().skip(1) {
        if fs::metadata(dir).is_ok_and(|d| FileId::of(&d) == mid) {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(mount)
                .with_dst(image)
                .with_reason(format!(
                    "the mount point is {} the image's own directory{}: the drive would be \
                     mounted over its own image (choose a mount point outside {})",
                    if dir == image.parent().unwrap_or(dir) {
                        ""
                    } else {
                        "an ancestor of"
                    },
                    if dir == mount {
                        String::new()
                    } else {
                        format!(" ({})", quoted(dir))
                    },
                    quoted(dir)
                )));
        }
    }
    Ok(())
}

/// Refuse a mount point that is, or is an ancestor of, a place cowlink
/// keeps its own files in (the state directory with the records, the
/// unit directory, the fstab's directory), compared by device and inode:
/// the drive would hide its own record, and the next command would find
/// records, units or an fstab inside the drive.
fn refuse_mount_over_state(op: Operation, places: &Places, mount: &Path) -> Result<(), Error> {
    let Ok(m) = fs::metadata(mount) else {
        return Ok(()); // made empty by us: it holds nothing
    };
    let mid = FileId::of(&m);
    let fstab_dir = places.fstab.parent().unwrap_or(Path::new("/"));
    for (what, place) in [
        ("the drive records' directory", places.state_dir.as_path()),
        ("the boot units' directory", places.unit_dir.as_path()),
        ("the fstab's directory", fstab_dir),
    ] {
        for dir in place.ancestors() {
            if fs::metadata(dir).is_ok_and(|d| FileId::of(&d) == mid) {
                return Err(Error::new(op, ErrorKind::InvalidInput)
                    .with_src(mount)
                    .with_reason(format!(
                        "the mount point is {what} {} or holds it: the drive would hide \
                         cowlink's own files (choose another mount point)",
                        quoted(place)
                    )));
            }
        }
    }
    Ok(())
}

/// Check a mount point for [`create`] and [`mount`]: an empty directory
/// that is not a mount point, or missing (then its parent must exist).
/// Returns whether it exists.
fn check_mount_point(op: Operation, mount: &Path) -> Result<bool, Error> {
    match fs::symlink_metadata(mount) {
        Ok(m) if !m.is_dir() => Err(Error::new(op, ErrorKind::NotADirectory)
            .with_src(mount)
            .with_reason("the mount point is not a directory")),
        Ok(_) => {
            if let Some(m) = device::mount_rooted_at(mount) {
                return Err(Error::new(op, ErrorKind::InUse)
                    .with_src(mount)
                    .with_reason(format!(
                        "it is already a mount point ({} from {})",
                        m.fstype, m.source
                    )));
            }
            let n = fs::read_dir(mount)
                .map_err(|e| Error::from_io(op, &e).with_src(mount))?
                .count();
            if n > 0 {
                return Err(Error::new(op, ErrorKind::AlreadyExists)
                    .with_src(mount)
                    .with_reason(format!(
                    "the mount point is not empty ({n} {}): a drive mounted there would hide them",
                    if n == 1 { "entry" } else { "entries" }
                )));
            }
            Ok(true)
        }
        Err(_) => match mount.parent().map(Path::is_dir) {
            Some(true) => Ok(false),
            _ => Err(Error::new(op, ErrorKind::NotFound)
                .with_src(mount)
                .with_reason("neither the mount point nor its parent directory exists")),
        },
    }
}

/// Every drive with a record, as it stands.
pub fn list(places: &Places) -> Vec<DriveInfo> {
    records(places).iter().map(|r| info(r, places)).collect()
}

/// The drive whose mount point or image is `path` (by name, or by device
/// and inode for the image).
///
/// # Errors
/// `NotFound` when no drive has that mount point or image.
pub fn status(path: &Path, places: &Places) -> Result<DriveInfo, Error> {
    let op = Operation::DriveStatus;
    let p = absolute(op, path)?;
    let id = fs::metadata(&p).ok().map(|m| FileId::of(&m));
    let rooted = device::mount_rooted_at(&p).map(|m| m.id);
    records(places)
        .into_iter()
        .find(|r| {
            r.mount == p
                || r.image == p
                || (id.is_some() && r.image_id == id)
                || (rooted.is_some() && device::mount_rooted_at(&r.mount).map(|m| m.id) == rooted)
        })
        .map(|r| info(&r, places))
        .ok_or_else(|| {
            Error::new(op, ErrorKind::NotFound)
                .with_src(path)
                .with_reason(
                    "no cowlink drive has this mount point or image (see `cowlink drive list`)",
                )
        })
}

/// The identity of a record's image: the recorded one, or for a legacy
/// record the file now under its name.
fn image_id(r: &Record) -> Option<FileId> {
    r.image_id
        .or_else(|| fs::metadata(&r.image).ok().map(|m| FileId::of(&m)))
}

fn info(r: &Record, places: &Places) -> DriveInfo {
    let meta = fs::metadata(&r.image)
        .ok()
        .filter(|m| r.image_id.is_none_or(|id| id == FileId::of(m)));
    // A record whose file is gone, while another record's image (under
    // that one's name) now has its device and inode (reused): the mounts
    // and loop devices of that identity are the other drive's.
    let reaches =
        |x: &Record| fs::metadata(&x.image).is_ok_and(|m| x.image_id == Some(FileId::of(&m)));
    let shadowed = meta.is_none()
        && r.image_id.is_some()
        && records(places)
            .iter()
            .any(|o| o.image != r.image && o.image_id == r.image_id && reaches(o));
    let id = image_id(r).filter(|_| !shadowed);
    let mounts = id.map(device::mounts_of).unwrap_or_default();
    let at_mount = device::mount_rooted_at(&r.mount).map(|m| m.id);
    let here = mounts.iter().find(|(m, _)| Some(m.id) == at_mount);
    let elsewhere = mounts
        .iter()
        .find(|(m, _)| Some(m.id) != at_mount)
        .map(|(m, _)| m.mount_point.clone());
    let loop_device = here
        .map(|(_, l)| l.clone())
        .or_else(|| mounts.first().map(|(_, l)| l.clone()))
        .or_else(|| {
            id.and_then(|id| device::loops_of(id).into_iter().next())
                .map(|(_, l)| l)
        });
    let mut d = DriveInfo {
        image: r.image.clone(),
        mount_point: r.mount.clone(),
        fs: r.fs,
        image_exists: meta.is_some(),
        size: meta.as_ref().map(|m| m.len()),
        image_allocated: meta.as_ref().map(|m| m.blocks() * 512),
        mounted: here.is_some(),
        mounted_elsewhere: elsewhere,
        fs_total: None,
        fs_used: None,
        reflink: None,
        reflink_reason: None,
        mount_options: here.map(|(m, _)| m.options.clone()),
        loop_device,
        owner_uid: None,
        persist: None,
        persist_file: None,
        warnings: Vec::new(),
    };
    if let Some((kind, file)) = persist::find(places, &r.image, &r.mount) {
        d.persist = Some(kind);
        d.persist_file = Some(file);
    }
    if d.mounted {
        if let Ok(s) = rustix::fs::statvfs(&r.mount) {
            d.fs_total = Some(s.f_blocks * s.f_frsize);
            d.fs_used = Some((s.f_blocks - s.f_bfree) * s.f_frsize);
        }
        d.owner_uid = fs::metadata(&r.mount).ok().map(|m| m.uid());
        if let Ok(f) = cowlink::probe::filesystem(&r.mount) {
            // Unknown (without root: no scratch file could be made) is
            // not "no".
            d.reflink = match &f.reflink {
                cowlink::probe::Answer::Yes => Some(true),
                cowlink::probe::Answer::No(_) => Some(false),
                cowlink::probe::Answer::Unknown(_) => None,
            };
            d.reflink_reason = f.reflink.reason().map(str::to_owned);
        }
    }
    d.warnings = warnings(&d);
    if !d.image_exists && fs::symlink_metadata(&r.image).is_ok() {
        d.warnings.push(format!(
            "the file now named {} is not the drive's image (it was replaced)",
            quoted(&r.image)
        ));
    }
    if let (Some(PersistKind::Systemd), Some(file)) = (d.persist, &d.persist_file) {
        let stale = fs::read_to_string(file)
            .is_ok_and(|t| persist::unit_is_stale(&t, &r.image, &r.mount, r.fs));
        if stale {
            d.warnings.push(format!(
                "its boot unit {} was written by an older cowlink and may fail at boot \
                 (`sudo cowlink drive mount {} {} --persist` writes it again)",
                quoted(file),
                quoted(&r.image),
                quoted(&r.mount)
            ));
        }
    }
    d
}

/// What is wrong with a drive, in words.
fn warnings(d: &DriveInfo) -> Vec<String> {
    let mut w = Vec::new();
    if !d.image_exists {
        w.push(format!("the image {} is missing", quoted(&d.image)));
    }
    if let Some(e) = &d.mounted_elsewhere {
        w.push(format!(
            "mounted on {} instead of {}",
            quoted(e),
            quoted(&d.mount_point)
        ));
    }
    if let Some(o) = &d.mount_options {
        if !o.split(',').any(|x| x == "noatime") {
            w.push(format!(
                "the mount has lost its noatime option (options now: {o}): every read writes an access time"
            ));
        }
    }
    if let Some(l) = &d.loop_device {
        if !l.direct_io {
            w.push(format!(
                "{} does not use direct I/O: the image's pages are cached twice \
                 (`cowlink drive mount {} {}` switches it on)",
                l.device.display(),
                quoted(&d.image),
                quoted(&d.mount_point)
            ));
        }
    }
    if d.reflink == Some(false) {
        w.push(format!(
            "reflink does not work on it: {}",
            d.reflink_reason.as_deref().unwrap_or("unknown reason")
        ));
    }
    w
}

/// Mount the drive `image` on `mount` (made if missing): attach a loop
/// device with direct I/O, mount with `noatime`, and record it. Already
/// mounted there: switches direct I/O on if it was off, and answers
/// [`Change::Already`].
///
/// An image with a record must be the recorded file (`own`); an image
/// without one is taken as a drive only when it is what `create` makes (an
/// XFS or Btrfs filesystem labelled `cowlink`: a drive whose record was
/// lost), and is recorded.
///
/// # Errors
/// Not root, `image` missing or holding neither XFS nor Btrfs (or not the
/// `fs` asked for), not a drive, `image` mounted elsewhere, the mount
/// point not an empty directory or the image's own directory, loop setup
/// or mount failing (everything undone). `Cancelled` when `cancel` was
/// cancelled (Ctrl-C, SIGTERM) before the mount was recorded: everything
/// undone, and the reason says so (or what another process still holds).
pub fn mount(
    image: &Path,
    mount_point: &Path,
    fs_asked: Option<DriveFs>,
    places: &Places,
    cancel: &cowlink::CancelToken,
) -> Result<(Change, DriveInfo), Error> {
    let op = Operation::DriveMount;
    let image = absolute(op, image)?;
    let mount = absolute(op, mount_point)?;
    require_root(op, &image)?;
    let _lock = lock_state(op, places, None)?;
    let meta = fs::metadata(&image).map_err(|e| Error::from_io(op, &e).with_src(&image))?;
    let sb = match device::superblock(&image) {
        Ok(Some(sb)) => sb,
        Ok(None) => {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&image)
                .with_reason("it holds neither an XFS nor a Btrfs filesystem"))
        }
        Err(e) => return Err(Error::from_io(op, &e).with_src(&image)),
    };
    let (fs_, sector) = (sb.fs, sb.sector);
    if let Some(asked) = fs_asked.filter(|a| *a != fs_) {
        return Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(&image)
            .with_reason(format!("it holds {fs_}, not {asked}")));
    }
    let id = FileId::of(&meta);
    let known = records(places)
        .into_iter()
        .any(|r| r.image_id == Some(id) || r.image == image);
    // A copy of a drive (`cp drive.img copy.img`: the same filesystem
    // UUID, another file) while the drive itself is still there is not a
    // drive whose record was lost: it is the user's file.
    let original = records(places).into_iter().find(|r| {
        r.image_uuid.as_deref() == Some(sb.uuid_hex().as_str())
            && fs::metadata(&r.image).is_ok_and(|m| r.image_id == Some(FileId::of(&m)))
    });
    let old = match known {
        true => Some(own_by_this_name(op, places, &image, &meta)?),
        false if original.is_some() => {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&image)
                .with_reason(format!(
                    "it is not a cowlink drive but a copy of the drive {} (the same filesystem \
                     UUID in another file); mount it with mount -o loop, or remove that drive first",
                    quoted(&original.map(|r| r.image).unwrap_or_default())
                )))
        }
        false if sb.label == b"cowlink" => None,
        false => {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&image)
                .with_reason(format!(
                    "it is not a cowlink drive: no drive record names it, and its filesystem \
                     label is {:?}, not the \"cowlink\" drive create gives (mount it with \
                     mount -o loop)",
                    String::from_utf8_lossy(&sb.label)
                )))
        }
    };
    let mut record = Record {
        // A drive keeps the name it is recorded under (its boot entries
        // hold it), though reached now through a symlink.
        image: old.as_ref().map_or(image.clone(), |o| o.image.clone()),
        mount: mount.clone(),
        fs: fs_,
        image_id: Some(id),
        mount_id: None,
        image_uuid: Some(sb.uuid_hex()),
    };
    let save = |r: &Record| {
        write_record(places, r).map_err(|e| Error::from_io(op, &e).with_src(&places.state_dir))
    };
    let mounted = device::mounts_of(id);
    let here = device::mount_rooted_at(&mount).map(|m| m.id);
    if let Some((m, l)) = mounted.iter().find(|(m, _)| Some(m.id) == here) {
        let n = device::loop_number(&m.source).unwrap_or(u32::MAX);
        if !l.direct_io {
            device::set_direct_io(n).map_err(|e| {
                Error::from_errno(op, e)
                    .with_src(&l.device)
                    .with_reason(format!("cannot switch direct I/O on: {}", errno_text(e)))
            })?;
        }
        record.mount_id = device::dir_id_beneath_mounts(&mount).ok().flatten();
        if old.as_ref() != Some(&record) {
            save(&record)?;
        }
        return Ok((Change::Already, info(&record, places)));
    }
    if let Some((m, _)) = mounted.first() {
        return Err(Error::new(op, ErrorKind::InUse)
            .with_src(&image)
            .with_reason(format!(
                "it is already mounted on {}",
                quoted(&m.mount_point)
            )));
    }
    refuse_mount_over_image(op, &image, &mount)?;
    refuse_mount_over_state(op, places, &mount)?;
    let exists = check_mount_point(op, &mount)?;
    let mut undo = Undo::default();
    if !exists {
        fs::create_dir(&mount).map_err(|e| Error::from_io(op, &e).with_src(&mount))?;
        let m = mount.clone();
        undo.push(move || drop(fs::remove_dir(m)));
    }
    record.mount_id = device::dir_id_beneath_mounts(&mount).ok().flatten();
    // A device attached over this very file but not mounted is not
    // cowlink's (its devices detach themselves when the process that
    // attached them dies unmounted: AUTOCLEAR): it is left alone, and the
    // mount refused, since two devices over one image would corrupt it.
    if let Some((_, l)) = device::loops_of(id).into_iter().next() {
        return Err(Error::new(op, ErrorKind::InUse)
            .with_src(&image)
            .with_reason(format!(
                "it is attached to {} by another program (not mounted); a second device over \
                 it would corrupt it: detach that one first (losetup -d {})",
                l.device.display(),
                l.device.display()
            )));
    }
    let attached = attach(op, &image, id, block_size_for(sector))?;
    undo.push(move || {
        let _ = device::await_detached(id, DETACH_WAIT);
    });
    let steps = (|| -> Result<(), Error> {
        mount_attached(op, &attached, &image, &mount, fs_, &mut undo)?;
        // A cancel (Ctrl-C, SIGTERM) during the steps undoes them all.
        if cancel.is_cancelled() {
            return Err(Error::new(op, ErrorKind::Cancelled).with_src(&image));
        }
        if old.as_ref() != Some(&record) {
            save(&record)?;
        }
        Ok(())
    })();
    if let Err(e) = steps {
        drop(attached);
        drop(undo);
        return Err(undone(e, Some(id), false));
    }
    attached.keep();
    undo.done();
    Ok((Change::Done, info(&record, places)))
}

/// Write (or write again) the boot entry of the drive `image`, mounted or
/// recorded on `mount_point`: the systemd unit or fstab line that
/// [`create`] writes with `--persist`, replacing the one written before
/// for this drive, of either kind (a unit from an older version, or an
/// fstab line where a unit is now wanted). [`PersistWith::Auto`] keeps
/// the kind already written, if any. Returns what was written.
///
/// # Errors
/// Not root; `image` not a drive (`own`); a path a unit cannot hold;
/// the files not writable.
pub fn persist(
    image: &Path,
    mount_point: &Path,
    with: PersistWith,
    places: &Places,
) -> Result<PersistPlan, Error> {
    let op = Operation::DriveMount;
    let image = absolute(op, image)?;
    let mount = absolute(op, mount_point)?;
    require_root(op, &image)?;
    let _lock = lock_state(op, places, None)?;
    let meta = fs::metadata(&image).map_err(|e| Error::from_io(op, &e).with_src(&image))?;
    let r = own_by_this_name(op, places, &image, &meta)?;
    // The boot entry holds the recorded name.
    let image = r.image.clone();
    // Asked for no kind in particular: keep the kind already there.
    let with = match (with, persist::find(places, &image, &mount)) {
        (PersistWith::Auto, Some((PersistKind::Systemd, _))) => PersistWith::Systemd,
        (PersistWith::Auto, Some((PersistKind::Fstab, _))) => PersistWith::Fstab,
        (w, _) => w,
    };
    let plan = persist::plan(with, places, &image, &mount, r.fs)
        .map_err(|(p, why)| unexpressible(op, &p, why))?;
    if plan.kind == PersistKind::Systemd {
        if let Some(unit) = persist::unit_of_another(places, &image, &mount) {
            return Err(Error::new(op, ErrorKind::AlreadyExists)
                .with_src(&image)
                .with_reason(format!(
                    "the boot unit {} is another drive's (it mounts another image on {}); \
                     nothing was written",
                    quoted(&unit),
                    quoted(&mount)
                )));
        }
    }
    persist::rewrite(&plan, places, &image, &mount)
        .map_err(|e| Error::from_io(op, &e).with_src(&plan.file))?;
    Ok(plan)
}

/// The drive mounted on `mount` (absolute), by identity: the mount there
/// must be a loop device whose backing file (device and inode, from the
/// kernel) is an image a record holds (`own`), on the directory the
/// record holds. Returns the record, the loop device's number and whether
/// it detaches itself (`AUTOCLEAR`); `Ok(None)` when nothing is mounted
/// there; a refusal naming what is mounted when it is not cowlink's.
fn drive_mounted_at(
    op: Operation,
    places: &Places,
    mount: &Path,
) -> Result<Option<(Record, u32)>, Error> {
    let Some(m) = device::mount_rooted_at(mount) else {
        return Ok(None);
    };
    let refuse = |why: String| {
        Err(Error::new(op, ErrorKind::InvalidInput)
            .with_src(mount)
            .with_reason(why))
    };
    let Some((n, fd, backing)) = device::loop_of_mount(&m) else {
        return refuse(format!(
            "it is not a drive: {} from {} is mounted there (use umount)",
            m.fstype, m.source
        ));
    };
    let sb = device::superblock_in(&mut fs::File::from(fd))
        .ok()
        .flatten();
    let Some(backing) = backing else {
        return refuse(format!(
            "{} is mounted there, and the kernel does not say which file it holds",
            m.source
        ));
    };
    let name = device::loop_state(n)
        .map(|s| quoted(&s.backing_file).to_string())
        .unwrap_or_else(|| "?".into());
    let all = records(places);
    let by_id = match record_with_id(&all, backing, sb.as_ref()) {
        Some(Ok(r)) => Some(r.clone()),
        Some(Err(why)) => {
            return refuse(format!(
                "it is not a cowlink drive: {} over {name} is mounted there: {why} (use umount)",
                m.source
            ))
        }
        None => None,
    };
    let record = by_id.or_else(|| {
        // A legacy record: the file now under its name, if it is what
        // create made.
        all.iter()
            .filter(|r| r.image_id.is_none())
            .find(|r| {
                fs::metadata(&r.image).is_ok_and(|x| FileId::of(&x) == backing)
                    && legacy_image_matches(r).is_ok()
            })
            .cloned()
    });
    let Some(mut record) = record else {
        return refuse(format!(
            "it is not a cowlink drive: {} over {name} ({backing}) is mounted there, and no \
             drive record holds that file (cowlink unmounts only the drives it mounted; use umount)",
            m.source
        ));
    };
    if let Err(why) = same_filesystem(&record, sb.as_ref()) {
        return refuse(format!(
            "it is not a cowlink drive: {} over {name} is mounted there: {why} (use umount)",
            m.source
        ));
    }
    let here = device::dir_id_beneath_mounts(mount).ok().flatten();
    let same_dir = match record.mount_id {
        Some(id) => here == Some(id),
        None => record.mount == mount,
    };
    if !same_dir {
        return refuse(format!(
            "the drive {} is mounted there, but not by cowlink: cowlink mounts it on {} \
             (use umount)",
            quoted(&record.image),
            quoted(&record.mount)
        ));
    }
    if record.image_id.is_none() || record.mount_id.is_none() {
        // Migrate a legacy record.
        record.image_id = Some(backing);
        record.mount_id = here;
        record.image_uuid = sb.as_ref().map(|sb| sb.uuid_hex());
        let _ = write_record(places, &record);
    }
    Ok(Some((record, n)))
}

/// Unmount the drive mounted on `mount_point`; its loop device detaches
/// with it. Not mounted: [`Change::Already`].
///
/// # Errors
/// Not root; what is mounted there is not a cowlink drive
/// (`InvalidInput`: not a loop device, or one over a file no record
/// holds, or a drive mounted there by hand); files are open on it
/// (`InUse`, naming the processes).
pub fn unmount(mount_point: &Path, places: &Places) -> Result<Change, Error> {
    let op = Operation::DriveUnmount;
    let mount = absolute(op, mount_point)?;
    require_root(op, &mount)?;
    let _lock = lock_state(op, places, None)?;
    let Some((record, n)) = drive_mounted_at(op, places, &mount)? else {
        return Ok(Change::Already);
    };
    let image = record.image_id;
    if let Err(e) = device::unmount(&mount) {
        let mut err = Error::from_errno(op, e).with_src(&mount);
        if e == rustix::io::Errno::BUSY {
            let dev = fs::metadata(&mount).map(|m| m.dev()).unwrap_or(0);
            err = err.with_kind(ErrorKind::InUse).with_reason(format!(
                "in use: {}",
                describe_holders(&device::holders(dev, None))
            ));
        }
        return Err(err);
    }
    // AUTOCLEAR detaches the device once the mount lets go; a device
    // attached without it (a mount(8) of an older util-linux) is detached
    // here: only that device, and only while it still holds the drive's
    // image. The kernel does it asynchronously: wait up to a second.
    let ours = |k: u32| device::loop_state(k).filter(|s| s.backing == image);
    for _ in 0..100 {
        if ours(n).is_none_or(|s| !s.autoclear) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if ours(n).is_some() {
        let _ = device::detach(n);
    }
    Ok(Change::Done)
}

fn describe_holders(h: &[Holder]) -> String {
    if h.is_empty() {
        return "the kernel says it is busy, but no process has a file open on it \
                (a bind mount or a loop device over a file on it?)"
            .into();
    }
    let shown: Vec<String> = h
        .iter()
        .take(5)
        .map(|h| format!("pid {} ({}) holds {}", h.pid, h.command, quoted(&h.path)))
        .collect();
    let more = match h.len() {
        n if n > 5 => format!(" and {} more", n - 5),
        _ => String::new(),
    };
    format!("{}{more}", shown.join(", "))
}

/// What [`remove`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removed {
    /// The image file was deleted (it existed).
    pub image_deleted: bool,
    /// Bytes the image had taken on the host.
    pub freed: u64,
    /// A boot entry was removed.
    pub persist_removed: bool,
    /// The record was removed.
    pub record_removed: bool,
    /// The (empty) mount point directory was removed.
    pub mount_removed: bool,
}

/// Delete the drive `image`: its boot entry, its record and the image
/// file. Only a drive [`create`] made is deleted (`own`: its record holds
/// the file's device and inode); a name with a record but no file left
/// loses its record and boot entry; nothing at all is not an error.
///
/// # Errors
/// Not root; the file is not a drive (`InvalidInput`, with the reason);
/// the drive is mounted or its image attached to a loop device or open in
/// a process (`InUse`, naming where and who, found by device and inode);
/// `yes` not given while the image exists (`InvalidInput`: the message
/// says what would be deleted).
pub fn remove(image: &Path, yes: bool, places: &Places) -> Result<Removed, Error> {
    let op = Operation::DriveRemove;
    // A symlink named is not followed (as rm does not): deleting the
    // drive it points to under another name would leave the symlink's
    // own drive, if any, and surprise whoever typed it.
    if let Ok(m) = fs::symlink_metadata(image) {
        if m.file_type().is_symlink() {
            let to = fs::read_link(image).unwrap_or_default();
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(image)
                .with_reason(format!(
                    "it is a symlink (to {}), not a drive image: remove the drive by its own \
                     name, or the symlink with rm",
                    quoted(&to)
                )));
        }
    }
    let image = absolute(op, image)?;
    require_root(op, &image)?;
    let _lock = lock_state(op, places, None)?;
    let meta = fs::symlink_metadata(&image).ok();
    let record = match &meta {
        Some(m) => Some(own(op, places, &image, m)?),
        None => records(places).into_iter().find(|r| r.image == image),
    };
    if let Some(m) = &meta {
        let id = FileId::of(m);
        if let Some((mt, _)) = device::mounts_of(id).into_iter().next() {
            let dev = fs::metadata(&mt.mount_point).map(|x| x.dev()).unwrap_or(0);
            let holders = device::holders(dev, None);
            let open = match holders.is_empty() {
                true => String::new(),
                false => format!("; files are open on it: {}", describe_holders(&holders)),
            };
            return Err(Error::new(op, ErrorKind::InUse)
                .with_src(&image)
                .with_reason(format!(
                    "it is mounted on {}{open}: unmount it first (cowlink drive unmount {})",
                    quoted(&mt.mount_point),
                    quoted(&mt.mount_point)
                )));
        }
        if let Some((_, l)) = device::loops_of(id).into_iter().next() {
            return Err(Error::new(op, ErrorKind::InUse)
                .with_src(&image)
                .with_reason(format!(
                    "it is attached to {} (losetup -d {} detaches it)",
                    l.device.display(),
                    l.device.display()
                )));
        }
        let holders = device::holders(m.dev(), Some(m.ino()));
        if !holders.is_empty() {
            return Err(Error::new(op, ErrorKind::InUse)
                .with_src(&image)
                .with_reason(format!("it is open: {}", describe_holders(&holders))));
        }
        // Another name for the image is refused while the recorded name
        // still reaches it (a hard link, the directory reached another
        // way); a drive whose directory was moved or renamed (the
        // recorded name reaches nothing, or another file) is removed
        // under the name it has now.
        let alias = |r: &&Record| {
            !same_name(&r.image, &image)
                && fs::metadata(&r.image).is_ok_and(|x| FileId::of(&x) == FileId::of(m))
        };
        if let Some(r) = record.as_ref().filter(alias) {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&image)
                .with_reason(format!(
                    "it is another name (a hard link, or its directory reached another way) \
                     for the drive image {}: remove the drive by that name",
                    quoted(&r.image)
                )));
        }
        if m.nlink() > 1 {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&image)
                .with_reason(format!(
                    "the image has another name (a hard link: {} names): deleting one would \
                     not delete the drive; remove the other names first",
                    m.nlink()
                )));
        }
        if !yes {
            return Err(Error::new(op, ErrorKind::InvalidInput)
                .with_src(&image)
                .with_reason(format!(
                "this deletes the drive and all its data ({} in the image); add --yes to go ahead",
                gib(m.blocks() * 512)
            )));
        }
    }
    let mount = record.as_ref().map(|r| r.mount.clone());
    // Boot entries hold the recorded name.
    let named = record.as_ref().map_or(&image, |r| &r.image);
    let persist_found = mount
        .as_ref()
        .and_then(|m| persist::find(places, named, m))
        .is_some();
    if let Some(m) = &mount {
        persist::remove(places, named, m).map_err(|e| Error::from_io(op, &e).with_src(&image))?;
    }
    if let Some(r) = &record {
        remove_record(places, &r.image)
            .map_err(|e| Error::from_io(op, &e).with_src(&places.state_dir))?;
    }
    if let Some(m) = &meta {
        unlink_same(&image, FileId::of(m)).map_err(|e| Error::from_io(op, &e).with_src(&image))?;
    }
    // The mount point goes too when nothing is in it (create made it, or
    // it was made for the drive); a directory with files stays, and so
    // does anything mounted.
    // Nor does a directory another drive is recorded on.
    let others = records(places);
    let mount_removed = mount.is_some_and(|m| {
        device::mount_rooted_at(&m).is_none()
            && !others.iter().any(|o| o.mount == m)
            && record
                .as_ref()
                .and_then(|r| r.mount_id)
                .is_none_or(|id| device::dir_id_beneath_mounts(&m).ok().flatten() == Some(id))
            && fs::remove_dir(m).is_ok()
    });
    Ok(Removed {
        mount_removed,
        image_deleted: meta.is_some(),
        freed: meta.map(|m| m.blocks() * 512).unwrap_or(0),
        persist_removed: persist_found,
        record_removed: record.is_some(),
    })
}

/// Unlink `path` only if it is still the file `id`: the directory is held
/// open and the name checked in it just before the unlink.
fn unlink_same(path: &Path, id: FileId) -> io::Result<()> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let d = rustix::fs::open(
        dir,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = match rustix::fs::statat(&d, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if (st.st_dev, st.st_ino) != (id.dev, id.ino) {
        return Err(io::Error::other(
            "the file under this name changed while it was being removed; it was left alone",
        ));
    }
    match rustix::fs::unlinkat(&d, name, AtFlags::empty()) {
        Err(rustix::io::Errno::NOENT) => Ok(()),
        r => r.map_err(Into::into),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_block_size_follows_the_filesystem_sector() {
        assert_eq!(block_size_for(4096), 4096);
        assert_eq!(block_size_for(512), 512);
        assert_eq!(block_size_for(65536), 4096);
        assert_eq!(block_size_for(0), 512);
    }

    #[test]
    fn undo_runs_last_step_first_unless_done() {
        use std::sync::{Arc, Mutex};
        let log = Arc::new(Mutex::new(Vec::new()));
        {
            let mut u = Undo::default();
            for i in 0..3 {
                let l = Arc::clone(&log);
                u.push(move || l.lock().unwrap().push(i));
            }
        }
        assert_eq!(*log.lock().unwrap(), [2, 1, 0]);
        let mut u = Undo::default();
        let l = Arc::clone(&log);
        u.push(move || l.lock().unwrap().push(9));
        u.done();
        assert_eq!(log.lock().unwrap().len(), 3);
    }
}
