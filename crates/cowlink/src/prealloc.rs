//! Writing a file of known size in few extents, atomically:
//! [`PreallocWriter`].
//!
//! A writer that receives a large file in small pieces (a download, a sync
//! client, a decompressor) interleaves its allocations with every other
//! writer on the filesystem, and the file ends up in many fragments that
//! are slower to read back. Announcing the size with `fallocate(2)` before
//! the first byte reserves it in as few extents as the filesystem can
//! find, and fails with ENOSPC before any data is written when it does not
//! fit. `bench` part 3 (`cowlink bench`) measures the difference.
//!
//! The file is an unnamed temporary in the destination directory
//! (`O_TMPFILE`, see `write.rs`) until [`PreallocWriter::finish`] links it
//! into place, so readers never see it partial and a drop, a cancel or a
//! crash leaves nothing behind. Preallocation only ever covers this new
//! file, never blocks shared with another (that would unshare them).

use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{self, CWD};
use rustix::io::Errno;

use crate::ground::error::{Error, Operation, Result};
use crate::prim::files::{create_reason, split_dest};
use crate::prim::place::{Overwrite, PendingFile};
use crate::prim::transfer::preallocate;

/// Options for [`PreallocWriter::with_options`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreallocOptions {
    /// `fsync` the data before the file gets its name (durable on return
    /// from `finish`).
    pub fsync: bool,
    /// Permission bits of the new file (the umask applies).
    pub mode: u32,
    /// What to do when the destination exists.
    pub overwrite: Overwrite,
}

impl Default for PreallocOptions {
    fn default() -> Self {
        PreallocOptions {
            fsync: false,
            mode: 0o666,
            overwrite: Overwrite::Refuse,
        }
    }
}

/// A new file of announced size, preallocated, written in any chunk size,
/// and put in place atomically by [`finish`](Self::finish).
///
/// ```no_run
/// use std::io::Write;
/// use cowlink::PreallocWriter;
///
/// let mut w = PreallocWriter::create("assets/level1.pak", 512 << 20)?;
/// # let chunks: Vec<Vec<u8>> = Vec::new();
/// for chunk in chunks {          // e.g. 8 KiB pieces from the network
///     w.write_all(&chunk)?;
/// }
/// w.finish()?;                   // now "assets/level1.pak" exists, complete
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Writing fewer bytes than announced is fine (`finish` trims the file to
/// what was written); writing more grows it past the preallocation.
/// Dropping the writer, or [`cancel`](Self::cancel), discards everything.
pub struct PreallocWriter {
    pending: PendingFile<'static>,
    dest: PathBuf,
    announced: u64,
    written: u64,
    preallocated: bool,
    options: PreallocOptions,
}

impl std::fmt::Debug for PreallocWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreallocWriter")
            .field("dest", &self.dest)
            .field("announced", &self.announced)
            .field("written", &self.written)
            .field("preallocated", &self.preallocated)
            .finish()
    }
}

impl PreallocWriter {
    /// Start writing `dest` (which must not exist), announcing `size` bytes.
    pub fn create(dest: impl AsRef<Path>, size: u64) -> Result<Self> {
        Self::with_options(dest, size, &PreallocOptions::default())
    }

    /// Start writing `dest` with `options`.
    ///
    /// # Errors
    /// `NoSpace` when `size` bytes do not fit (nothing is written and no
    /// temporary remains), `NotFound` for a missing directory,
    /// `IsDirectory` for a path naming a directory, `PermissionDenied`,
    /// `ReadOnly`, `Io`.
    pub fn with_options(
        dest: impl AsRef<Path>,
        size: u64,
        options: &PreallocOptions,
    ) -> Result<Self> {
        let dest = dest.as_ref().to_path_buf();
        let op = Operation::Write;
        let parent = split_dest(op, &dest, &dest).map_err(|e| clear_src(e, &dest))?;
        let err = |e: Errno| Error::from_errno(op, e).with_dst(&dest);
        let pending = PendingFile::create(
            CWD,
            &parent,
            &dest,
            cowlink_sys::raw_mode(options.mode & 0o7777),
        )
        .map_err(|e| match e {
            Errno::NOENT => err(e).with_reason(format!(
                "directory {} does not exist",
                crate::name::quoted(&parent)
            )),
            _ => err(e).with_reason(create_reason(e, &parent)),
        })?;
        let preallocated = preallocate(pending.fd(), size).map_err(|e| match e {
            Errno::NOSPC | Errno::DQUOT => err(e).with_reason(format!(
                "no space for the announced {size} bytes in {} (nothing was written)",
                crate::name::quoted(&parent)
            )),
            _ => err(e),
        })?;
        Ok(PreallocWriter {
            pending,
            dest,
            announced: size,
            written: 0,
            preallocated,
            options: *options,
        })
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The size announced at creation.
    pub fn announced(&self) -> u64 {
        self.announced
    }

    /// Whether the filesystem preallocated the announced size.
    pub fn preallocated(&self) -> bool {
        self.preallocated
    }

    /// Trim the file to what was written, `fsync` it if asked, and link it
    /// into place under its name. Returns the file's size.
    ///
    /// # Errors
    /// `AlreadyExists` (with [`Overwrite::Refuse`]) when the name appeared
    /// meanwhile (the new file is discarded), `NoSpace`, `Io`.
    pub fn finish(self) -> Result<u64> {
        let err = |e: Errno| Error::from_errno(Operation::Write, e).with_dst(&self.dest);
        let fd = self.pending.fd();
        // Only when the length differs (fewer bytes than announced): a
        // truncate makes XFS flush the file's data on close.
        if cowlink_sys::fstat(fd).map_err(err)?.st_size as u64 != self.written {
            fs::ftruncate(fd, self.written).map_err(err)?;
        }
        if self.options.fsync {
            fs::fsync(fd).map_err(err)?;
        }
        let PreallocWriter {
            pending,
            dest,
            written,
            options,
            ..
        } = self;
        pending.persist(&dest, options.overwrite).map_err(|e| {
            let base = Error::from_errno(Operation::Write, e).with_dst(&dest);
            match e {
                Errno::EXIST => base.with_reason("destination already exists"),
                _ => base,
            }
        })?;
        Ok(written)
    }

    /// Discard the file: nothing remains under its name or as a temporary.
    pub fn cancel(self) {}
}

fn clear_src(e: Error, dest: &Path) -> Error {
    let why = e.reason();
    Error::new(Operation::Write, e.kind())
        .with_dst(dest)
        .with_reason(why)
}

impl io::Write for PreallocWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match rustix::io::pwrite(self.pending.fd(), buf, self.written) {
                Ok(n) => {
                    self.written += n as u64;
                    return Ok(n);
                }
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
