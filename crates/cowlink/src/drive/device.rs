//! The kernel side of a drive: which filesystem an image holds, loop
//! devices (attach with `LOOP_CONFIGURE`, state from sysfs), the mount
//! table, `mount(2)`/`umount(2)`, and which processes hold files on a
//! mount or an image open.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use serde::Serialize;

use super::DriveFs;
use crate::ground::mountinfo::{self, MountEntry};

/// The filesystem an image holds, and its sector size, from the
/// superblock: XFS ("XFSB" at 0, `sb_sectsize` at 102, big-endian) or
/// Btrfs ("_BHRfS_M" at 64 KiB + 64, `sectorsize` at 64 KiB + 144).
pub(crate) fn detect(image: &Path) -> io::Result<Option<(DriveFs, u32)>> {
    let mut f = File::open(image)?;
    let mut head = [0u8; 104];
    if f.read_exact(&mut head).is_ok() && &head[..4] == b"XFSB" {
        return Ok(Some((
            DriveFs::Xfs,
            u32::from(u16::from_be_bytes([head[102], head[103]])),
        )));
    }
    let mut sb = [0u8; 152];
    f.seek(SeekFrom::Start(0x10000))?;
    if f.read_exact(&mut sb).is_ok() && &sb[64..72] == b"_BHRfS_M" {
        let sector = u32::from_le_bytes([sb[144], sb[145], sb[146], sb[147]]);
        return Ok(Some((DriveFs::Btrfs, sector)));
    }
    Ok(None)
}

/// A loop device as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoopState {
    /// `/dev/loopN`.
    pub device: PathBuf,
    /// The backing file.
    pub backing_file: PathBuf,
    /// Reads and writes go to the backing file with `O_DIRECT`.
    pub direct_io: bool,
    /// Detaches itself when unmounted.
    pub autoclear: bool,
    /// Logical block size in bytes.
    pub block_size: u32,
}

fn sys_text(p: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim_end().to_owned())
}

/// The state of `/dev/loopN`, when it is attached.
pub(crate) fn loop_state(n: u32) -> Option<LoopState> {
    let base = PathBuf::from(format!("/sys/block/loop{n}"));
    let backing = sys_text(base.join("loop/backing_file"))?;
    let backing = backing.strip_suffix(" (deleted)").unwrap_or(&backing);
    Some(LoopState {
        device: PathBuf::from(format!("/dev/loop{n}")),
        backing_file: PathBuf::from(backing),
        direct_io: sys_text(base.join("loop/dio")).as_deref() == Some("1"),
        autoclear: sys_text(base.join("loop/autoclear")).as_deref() == Some("1"),
        block_size: sys_text(base.join("queue/logical_block_size"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(512),
    })
}

/// Every attached loop device.
pub(crate) fn loops() -> Vec<(u32, LoopState)> {
    let Ok(dir) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<(u32, LoopState)> = dir
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("loop")?.parse().ok()?;
            Some((n, loop_state(n)?))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

/// The loop devices whose backing file is `image` (an absolute, resolved
/// path).
pub(crate) fn loops_of(image: &Path) -> Vec<(u32, LoopState)> {
    loops()
        .into_iter()
        .filter(|(_, s)| s.backing_file == image)
        .collect()
}

/// The number of a loop device path (`/dev/loop7` → 7).
pub(crate) fn loop_number(source: &str) -> Option<u32> {
    source.strip_prefix("/dev/loop")?.parse().ok()
}

/// An attached loop device, detached on drop unless [`Attached::keep`]
/// was called (the mount then holds it, and `AUTOCLEAR` detaches it when
/// the mount goes).
pub(crate) struct Attached {
    pub number: u32,
    fd: Option<OwnedFd>,
}

impl Attached {
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }

    /// Let go of the device: from now on the mount keeps it.
    pub(crate) fn keep(mut self) {
        self.fd = None;
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            let _ = cowlink_sys::loop_clear(fd.as_fd());
        }
    }
}

/// Attach `image` to a free loop device with `AUTOCLEAR` and direct I/O
/// (without direct I/O when the kernel refuses it for this file: the
/// state then says so), with logical block size `block_size`.
pub(crate) fn attach(image: &Path, block_size: u32) -> Result<Attached, (Errno, &'static str)> {
    let backing = rustix::fs::open(image, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| (e, "open the image"))?;
    let control = rustix::fs::open(
        "/dev/loop-control",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| (e, "open /dev/loop-control"))?;
    let auto = cowlink_sys::LOOP_FLAG_AUTOCLEAR;
    let dio = cowlink_sys::LOOP_FLAG_DIRECT_IO;
    let mut last = Errno::BUSY;
    // Another process may take the free device between asking and
    // configuring (EBUSY): ask again.
    for _ in 0..32 {
        let n = cowlink_sys::loop_ctl_get_free(control.as_fd())
            .map_err(|e| (e, "find a free loop device"))?;
        let path = format!("/dev/loop{n}");
        let dev = rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| (e, "open the loop device"))?;
        let r =
            match cowlink_sys::loop_configure(dev.as_fd(), backing.as_fd(), block_size, auto | dio)
            {
                Err(Errno::INVAL) => {
                    cowlink_sys::loop_configure(dev.as_fd(), backing.as_fd(), block_size, auto)
                }
                r => r,
            };
        match r {
            Ok(()) => {
                return Ok(Attached {
                    number: n,
                    fd: Some(dev),
                })
            }
            Err(Errno::BUSY) => last = Errno::BUSY,
            Err(e) => return Err((e, "attach the image to a loop device")),
        }
    }
    Err((last, "find a free loop device"))
}

/// Switch direct I/O on for an attached device.
pub(crate) fn set_direct_io(n: u32) -> Result<(), Errno> {
    let dev = rustix::fs::open(
        format!("/dev/loop{n}"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    cowlink_sys::loop_set_direct_io(dev.as_fd(), true)
}

/// Detach a loop device that nothing holds any more.
pub(crate) fn detach(n: u32) -> Result<(), Errno> {
    let dev = rustix::fs::open(
        format!("/dev/loop{n}"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    cowlink_sys::loop_clear(dev.as_fd())
}

/// The mount table as this process sees it.
pub(crate) fn mounts() -> Vec<MountEntry> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|t| mountinfo::parse(&t))
        .unwrap_or_default()
}

/// The visible mount whose mount point is exactly `dir`.
pub(crate) fn mounted_at(dir: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.mount_point == dir)
}

/// Where the loop devices of `image` are mounted.
pub(crate) fn mounts_of(image: &Path) -> Vec<(MountEntry, LoopState)> {
    let attached = loops_of(image);
    mounts()
        .into_iter()
        .filter_map(|m| {
            let n = loop_number(&m.source)?;
            let (_, s) = attached.iter().find(|(k, _)| *k == n)?;
            Some((m, s.clone()))
        })
        .collect()
}

/// `mount(2)` of `device` on `dir` with `noatime`.
pub(crate) fn mount(device: &Path, dir: &Path, fs: DriveFs) -> Result<(), Errno> {
    rustix::mount::mount(
        device,
        dir,
        fs.name(),
        rustix::mount::MountFlags::NOATIME,
        None,
    )
}

/// `umount(2)`.
pub(crate) fn unmount(dir: &Path) -> Result<(), Errno> {
    rustix::mount::unmount(dir, rustix::mount::UnmountFlags::empty())
}

/// A process holding something open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Process ID.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub command: String,
    /// What it holds: an open file, or its working or root directory.
    pub path: PathBuf,
}

/// The processes with an open file, working directory or root on the
/// device `dev` (`st_dev`), or — with `inode` — with that one file open.
pub(crate) fn holders(dev: u64, inode: Option<u64>) -> Vec<Holder> {
    let me = std::process::id();
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let base = p.path();
        let mut links: Vec<PathBuf> = vec![base.join("cwd"), base.join("root")];
        if let Ok(fds) = fs::read_dir(base.join("fd")) {
            links.extend(fds.flatten().map(|e| e.path()));
        }
        for l in links {
            let Ok(m) = fs::metadata(&l) else { continue };
            let hit = m.dev() == dev && inode.is_none_or(|i| m.ino() == i);
            if hit {
                let command = sys_text(base.join("comm")).unwrap_or_default();
                let path = fs::read_link(&l).unwrap_or(l);
                out.push(Holder { pid, command, path });
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_numbers_come_from_device_paths() {
        assert_eq!(loop_number("/dev/loop12"), Some(12));
        assert_eq!(loop_number("/dev/sda1"), None);
        assert_eq!(loop_number("/dev/loop"), None);
    }
}
