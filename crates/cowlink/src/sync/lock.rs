//! One sync per destination at a time: an exclusive `flock` on the
//! destination directory itself (a dry run takes it shared). Locking the
//! directory, not a file, keeps every bookkeeping file out of DST, works
//! for every user who can open DST, and ends with the process, even after
//! `kill -9`. A refused run names the holder from the kernel's lock table
//! (`/proc/locks`), which lists each `flock` with its process and inode.

use std::path::Path;

use rustix::fd::BorrowedFd;
use rustix::fs::{self, FlockOperation};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation};

/// Take the lock on the open destination directory `dir` (`shown` for
/// messages); it lasts as long as `dir`'s open file description.
pub(crate) fn take(dir: BorrowedFd<'_>, shown: &Path, shared: bool) -> Result<(), Error> {
    let op = if shared {
        FlockOperation::NonBlockingLockShared
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    // A process that forks (another thread running a command) lends
    // the child its open file descriptions, and so its locks, until the
    // child's exec closes them: a lock no other process took is waited
    // for, a moment, before it counts as held.
    let mut waits = 0;
    loop {
        match fs::flock(dir, op) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(Errno::WOULDBLOCK) => {
                let ino = cowlink_sys::fstat(dir).map(|st| st.st_ino).unwrap_or(0);
                let me = std::process::id();
                let holder = cowlink_sys::lock_table()
                    .ok()
                    .and_then(|t| holder(&t, ino, me));
                if holder.is_none() && waits < 50 {
                    waits += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                let who = match holder {
                    Some(pid) => format!("process {pid}"),
                    None => "another process".to_string(),
                };
                return Err(Error::new(Operation::Sync, ErrorKind::InUse)
                    .with_dst(shown)
                    .with_reason(format!(
                        "another sync into this directory is running ({who} holds its lock)"
                    )));
            }
            Err(e) => {
                return Err(Error::from_errno(Operation::Sync, e)
                    .with_dst(shown)
                    .with_reason("cannot lock the destination directory"))
            }
        }
    }
}

/// The process holding a `flock` on inode `ino`, from the text of
/// `/proc/locks` (`1: FLOCK ADVISORY WRITE 1234 08:02:567 0 EOF`), other
/// than `me`. The device is not compared: Btrfs reports a subvolume's own
/// device to `stat` but its filesystem's here.
fn holder(table: &str, ino: u64, me: u32) -> Option<u32> {
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "->" marks a waiter, shifting the fields by one.
        let f = if f.get(1) == Some(&"->") {
            &f[1..]
        } else {
            &f[..]
        };
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = f.get(4)?.parse().ok()?;
        let file_ino: u64 = f.get(5)?.rsplit(':').next()?.parse().ok()?;
        (file_ino == ino && pid != me).then_some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::holder;

    #[test]
    fn the_holder_is_read_from_the_lock_table() {
        let t = "1: POSIX  ADVISORY  WRITE 77 00:1a:5 0 EOF\n\
                 2: FLOCK  ADVISORY  WRITE 4321 fd:01:1234 0 EOF\n\
                 3: FLOCK  ADVISORY  WRITE 99 08:02:555 0 EOF\n";
        assert_eq!(holder(t, 1234, 1), Some(4321));
        assert_eq!(holder(t, 1234, 4321), None, "our own lock is not a holder");
        assert_eq!(holder(t, 5, 1), None, "POSIX locks are not ours");
        assert_eq!(holder(t, 9, 1), None);
    }
}
