//! The platform layer of cowlink: every call that only some operating
//! systems have goes through this crate, and this crate is the only one
//! with `unsafe` code.
//!
//! One module per platform implements the same functions with the same
//! signatures: `linux.rs` (the kernel's ioctls through rustix and
//! linux-raw-sys, `O_TMPFILE`, `copy_file_range`, `fallocate` modes,
//! `openat2`, OFD locks, `/proc`) and `portable.rs` for every other Unix,
//! which answers "not possible here" (`EOPNOTSUPP`, `ENOTTY` for the
//! Btrfs calls) so the core's fallbacks run: `auto` copies instead of
//! cloning, a unnamed temporary becomes a named one, FIEMAP reports no
//! extents. `windows.rs` has no descriptors to offer: it gives the
//! core's `std::fs`-based Windows path the errno type, the volume facts,
//! scratch files and `FSCTL_DUPLICATE_EXTENTS_TO_FILE` (the ReFS clone).
//! The answer types ([`FsStat`], [`DedupeResult`], ...) are shared. A
//! port (macOS `clonefile`, FreeBSD `copy_file_range`) adds or fills a
//! module here and changes no caller.
//!
//! Every function takes borrowed descriptors (handles on Windows) and
//! returns the system's answer as an [`Errno`]; it never decides what an
//! error *means*. Classification, fallbacks and messages live in the safe
//! `cowlink` crate.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod types;
pub use types::*;
mod fanotify;
pub use fanotify::*;

/// The error every call answers with: the system's errno on Unix. On
/// Windows, a POSIX error number translated from the Win32 code, so the
/// core classifies errors one way everywhere.
#[cfg(unix)]
pub use rustix::io::Errno;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::*;

#[cfg(all(unix, not(target_os = "linux")))]
mod portable;
// Built on Linux too under test, so the fallbacks other systems run are
// exercised on real filesystems by this crate's tests.
#[cfg(all(test, target_os = "linux"))]
#[allow(dead_code)]
mod portable;
#[cfg(all(unix, not(target_os = "linux")))]
pub use portable::*;

/// Let the C allocator keep up to `keep` bytes of freed heap for reuse
/// before it hands memory back to the system, and serve requests below
/// half of that from the heap rather than from a mapping of their own.
///
/// glibc's defaults (128 KiB, and a mapping threshold that moves) suit a
/// process that frees rarely. A walk that reads an index decodes and
/// drops a record per directory on each of its threads, and with the
/// defaults every thread's heap was shrunk and faulted in again over and
/// over: about one page fault per file walked. A few MiB kept per heap
/// cost that much peak memory and spare the faults.
///
/// A binary calls this once at start, before its threads. Elsewhere than
/// glibc it does nothing: other allocators have their own policies.
pub fn malloc_keep_freed(keep: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let keep = libc::c_int::try_from(keep).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets glibc's tuning values; it checks them
        // and answers 0 for one it refuses, which leaves the default.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, keep);
            libc::mallopt(libc::M_MMAP_THRESHOLD, keep / 2);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = keep;
}

/// Hand the C allocator's free memory back to the system now: the free
/// pages of every heap, not only those past the trim threshold
/// ([`malloc_keep_freed`]) at each heap's top. For a program that has
/// just let go of a large structure and is about to grow others: the
/// freed pages would otherwise stay counted in its resident memory,
/// scattered between live blocks where no threshold reaches them.
///
/// glibc's `malloc_trim`; elsewhere it does nothing.
pub fn malloc_release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks and only
    // returns pages no block uses; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
