//! One error type for the whole library.
//!
//! Every failure carries the operation, the path(s) involved, a [`ErrorKind`]
//! that callers match on, the errno the kernel returned (when there was one)
//! and, where we know better than the errno text, a human reason.
//!
//! [`classify`] is the single place that maps errno values to kinds, and
//! [`is_not_possible_here`] the single place that decides which clone
//! failures may fall back to copying. Keeping both here means the fallback
//! policy cannot drift between callers.

use std::io;
use std::path::{Path, PathBuf};

use cowlink_sys::Errno;

/// Result alias used throughout cowlink.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure happened. Callers match on this, never on text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The filesystem cannot do this (no reflink, no dedupe, no FIEMAP).
    NotSupported,
    /// Source and destination are on different filesystems.
    CrossDevice,
    /// A range offset or length is not a multiple of the block size.
    Unaligned,
    /// Too many links or references to one inode or block.
    LinkLimit,
    /// The destination already exists.
    AlreadyExists,
    /// A path does not exist (or is a dangling symbolic link).
    NotFound,
    /// Permission denied (EACCES, EPERM).
    PermissionDenied,
    /// No space or quota left (ENOSPC, EDQUOT).
    NoSpace,
    /// A directory was given where a file is needed.
    IsDirectory,
    /// A path component that must be a directory is not one.
    NotADirectory,
    /// The source is a FIFO, socket or device, which cannot be cloned.
    NotRegularFile,
    /// Source and destination are the same file.
    SameFile,
    /// The destination filesystem is mounted read-only.
    ReadOnly,
    /// An argument is invalid (bad name, bad range, symlink loop...).
    InvalidInput,
    /// The data changed between two steps that require it unchanged.
    ContentChanged,
    /// The operation was cancelled.
    Cancelled,
    /// Stored data or a store's own layout is damaged or was tampered with
    /// (an object whose bytes no longer match its digest, a symbolic link
    /// where the store keeps a directory).
    Corrupt,
    /// Another program holds the file (a disk image QEMU has open, by its
    /// byte-range locks).
    InUse,
    /// Any other I/O error (EIO and the rest).
    Io,
}

impl ErrorKind {
    /// The errno this kind stands for when an error carries none (a
    /// refusal the library decided itself, such as an existing
    /// destination): what bindings that speak errno (Python's `OSError`)
    /// report. `None` for kinds no errno names (same file, not a regular
    /// file, content changed, corrupt).
    pub fn usual_errno(self) -> Option<Errno> {
        Some(match self {
            ErrorKind::NotSupported => Errno::OPNOTSUPP,
            ErrorKind::CrossDevice => Errno::XDEV,
            ErrorKind::Unaligned | ErrorKind::InvalidInput => Errno::INVAL,
            ErrorKind::LinkLimit => Errno::MLINK,
            ErrorKind::AlreadyExists => Errno::EXIST,
            ErrorKind::NotFound => Errno::NOENT,
            ErrorKind::PermissionDenied => Errno::ACCESS,
            ErrorKind::NoSpace => Errno::NOSPC,
            ErrorKind::IsDirectory => Errno::ISDIR,
            ErrorKind::NotADirectory => Errno::NOTDIR,
            ErrorKind::ReadOnly => Errno::ROFS,
            ErrorKind::Cancelled => Errno::CANCELED,
            ErrorKind::InUse => Errno::BUSY,
            ErrorKind::Io => Errno::IO,
            ErrorKind::SameFile
            | ErrorKind::NotRegularFile
            | ErrorKind::ContentChanged
            | ErrorKind::Corrupt => return None,
        })
    }

    /// A short English description, used when no better reason is known.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorKind::NotSupported => "operation not supported by the filesystem",
            ErrorKind::CrossDevice => "different filesystems",
            ErrorKind::Unaligned => "range is not aligned to the filesystem block size",
            ErrorKind::LinkLimit => "too many links",
            ErrorKind::AlreadyExists => "destination already exists",
            ErrorKind::NotFound => "no such file or directory",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::NoSpace => "no space left on device",
            ErrorKind::IsDirectory => "is a directory",
            ErrorKind::NotADirectory => "not a directory",
            ErrorKind::NotRegularFile => "not a regular file",
            ErrorKind::SameFile => "source and destination are the same file",
            ErrorKind::ReadOnly => "read-only filesystem",
            ErrorKind::InvalidInput => "invalid argument",
            ErrorKind::ContentChanged => "content changed during the operation",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Corrupt => "corrupt or tampered data",
            ErrorKind::InUse => "in use by another program",
            ErrorKind::Io => "input/output error",
        }
    }
}

/// Map a kernel errno to an [`ErrorKind`]. The one place that does so.
pub fn classify(errno: Errno) -> ErrorKind {
    match errno {
        Errno::OPNOTSUPP | Errno::NOTTY | Errno::NOSYS => ErrorKind::NotSupported,
        Errno::XDEV => ErrorKind::CrossDevice,
        Errno::MLINK => ErrorKind::LinkLimit,
        Errno::EXIST | Errno::NOTEMPTY => ErrorKind::AlreadyExists,
        Errno::NOENT => ErrorKind::NotFound,
        Errno::ACCESS | Errno::PERM => ErrorKind::PermissionDenied,
        Errno::NOSPC | Errno::DQUOT => ErrorKind::NoSpace,
        Errno::ISDIR => ErrorKind::IsDirectory,
        Errno::NOTDIR => ErrorKind::NotADirectory,
        Errno::ROFS => ErrorKind::ReadOnly,
        Errno::INVAL | Errno::LOOP | Errno::NAMETOOLONG => ErrorKind::InvalidInput,
        Errno::CANCELED => ErrorKind::Cancelled,
        _ => ErrorKind::Io,
    }
}

/// Whether a failed clone means "cloning is not possible here" (so `Auto`
/// may fall back to copying) rather than a real error that must be reported.
///
/// Only EXDEV, EOPNOTSUPP, ENOTTY, ENOSYS, EINVAL and ETXTBSY qualify
/// (ETXTBSY: the kernel never clones an active swap file, but reading it is
/// allowed; a clone's destination is always a new file, so the busy one is
/// the source). ENOENT, EACCES, EEXIST, ENOSPC, EDQUOT, EIO and everything
/// else are real errors: copying would hide them or make them worse.
pub fn is_not_possible_here(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::XDEV | Errno::OPNOTSUPP | Errno::NOTTY | Errno::NOSYS | Errno::INVAL | Errno::TXTBSY
    )
}

/// Why an active swap file cannot be cloned, for messages.
pub const SWAP_REASON: &str =
    "the source is an active swap file, which the kernel never clones (it can be copied)";

/// The operation that failed, used to word the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Operation {
    /// Whole-file clone or copy (`clone_file`).
    Clone,
    /// Data copy without cloning (`LinkMode::Copy`).
    Copy,
    /// Range clone (`clone_range`).
    CloneRange,
    /// Capability probe.
    Probe,
    /// Reading file layout (FIEMAP).
    Extents,
    /// Copying a directory tree.
    CopyTree,
    /// Measuring disk usage.
    Usage,
    /// Deduplicating identical files.
    Dedupe,
    /// Adding to, checking or collecting the content-addressed store.
    Store,
    /// Placing a store object or manifest at a destination.
    Materialize,
    /// Reading or parsing a store manifest (any command that reads one:
    /// checkout, gc, ls, stats, verify).
    Manifest,
    /// Writing a new file (`PreallocWriter`).
    Write,
    /// Measuring the volume (`bench`).
    Bench,
    /// Reading, committing or converting a disk image.
    Image,
    /// Making a dev drive.
    DriveCreate,
    /// Mounting a dev drive.
    DriveMount,
    /// Unmounting a dev drive.
    DriveUnmount,
    /// Deleting a dev drive.
    DriveRemove,
    /// Reporting on a dev drive.
    DriveStatus,
    /// Sending objects and manifests to a remote store.
    Push,
    /// Fetching objects and manifests from a remote store.
    Pull,
    /// Configuring, listing or collecting a remote store.
    Remote,
    /// Beginning, completing, listing or pruning a snapshot set.
    Snapshot,
    /// Keeping a destination tree in step with a source (`sync`).
    Sync,
    /// Updating a file by rewriting only the blocks that differ
    /// (`delta`), or reading a block-hash record.
    Delta,
}

impl Operation {
    fn verb(self) -> &'static str {
        match self {
            Operation::Clone => "clone",
            Operation::Copy => "copy",
            Operation::CloneRange => "clone range of",
            Operation::Probe => "probe",
            Operation::Extents => "map extents of",
            Operation::CopyTree => "copy",
            Operation::Usage => "measure",
            Operation::Dedupe => "deduplicate",
            Operation::Store => "store",
            Operation::Materialize => "materialize",
            Operation::Manifest => "read manifest",
            Operation::Write => "write",
            Operation::Bench => "measure in",
            Operation::Image => "process the image",
            Operation::DriveCreate => "create the drive",
            Operation::DriveMount => "mount the drive",
            Operation::DriveUnmount => "unmount",
            Operation::DriveRemove => "remove the drive",
            Operation::DriveStatus => "find the drive",
            Operation::Push => "push",
            Operation::Pull => "pull",
            Operation::Remote => "use the remote",
            Operation::Snapshot => "snapshot",
            Operation::Sync => "sync",
            Operation::Delta => "update by blocks",
        }
    }
}

/// A cowlink error: what was being done, to which paths, what kind of
/// failure, the errno and a reason.
///
/// Displays as "cannot clone 'a' to 'b': different filesystems (xfs → btrfs)".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct Error {
    op: Operation,
    src: Option<PathBuf>,
    dst: Option<PathBuf>,
    kind: ErrorKind,
    errno: Option<Errno>,
    reason: Option<String>,
}

impl Error {
    /// An error of `kind` for `op`, with no paths yet.
    pub fn new(op: Operation, kind: ErrorKind) -> Self {
        Error {
            op,
            src: None,
            dst: None,
            kind,
            errno: None,
            reason: None,
        }
    }

    /// An error from a kernel errno; the kind comes from [`classify`].
    pub fn from_errno(op: Operation, errno: Errno) -> Self {
        Error {
            errno: Some(errno),
            ..Error::new(op, classify(errno))
        }
    }

    /// An error from a standard-library I/O error: its errno when it has
    /// one, else [`ErrorKind::Io`] with the error's text as the reason.
    pub fn from_io(op: Operation, e: &io::Error) -> Self {
        match Errno::from_io_error(e) {
            Some(n) => Error::from_errno(op, n),
            None => Error::new(op, ErrorKind::Io).with_reason(e.to_string()),
        }
    }

    /// Set the source path (or the only path).
    pub fn with_src(mut self, p: impl AsRef<Path>) -> Self {
        self.src = Some(p.as_ref().to_path_buf());
        self
    }

    /// Set the destination path.
    pub fn with_dst(mut self, p: impl AsRef<Path>) -> Self {
        self.dst = Some(p.as_ref().to_path_buf());
        self
    }

    /// Set a human reason that replaces the generic description.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Override the kind (when the context knows better than the errno).
    pub fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The operation that failed.
    pub fn operation(&self) -> Operation {
        self.op
    }

    /// The kernel's errno, when the failure came from a system call.
    pub fn errno(&self) -> Option<Errno> {
        self.errno
    }

    /// The raw OS error number, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.errno.map(|e| e.raw_os_error())
    }

    /// The source path (or the only path involved).
    pub fn src(&self) -> Option<&Path> {
        self.src.as_deref()
    }

    /// The destination path.
    pub fn dst(&self) -> Option<&Path> {
        self.dst.as_deref()
    }

    /// The reason alone, without "cannot clone 'a' to 'b'".
    pub fn reason(&self) -> String {
        match (&self.reason, self.errno) {
            (Some(r), _) => r.clone(),
            (None, Some(e)) => errno_text(e),
            (None, None) => self.kind.describe().to_string(),
        }
    }
}

/// The kernel's text for an errno, lowercased and without "(os error N)":
/// "no such file or directory".
pub(crate) fn errno_text(e: Errno) -> String {
    let s = io::Error::from(e).to_string();
    let s = s.split(" (os error").next().unwrap_or(&s);
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

impl Error {
    fn render(&self) -> String {
        use super::name::quoted;
        let mut out = format!("cannot {}", self.op.verb());
        if let Some(s) = &self.src {
            out += &format!(" {}", quoted(s));
        }
        if let Some(d) = &self.dst {
            out += &format!(" to {}", quoted(d));
        }
        out + ": " + &self.reason()
    }
}

/// Every report serializes its errors this one way: an object with the
/// whole `message` (as displayed), the `kind` and `operation` to match on,
/// the `errno` when a system call failed, the paths involved, and the
/// `reason` alone. Paths are written as [`name::json`](super::name::json)
/// writes every path: lossy, plus `src_bytes`/`dst_bytes` with the exact
/// bytes of a name that is not UTF-8.
impl serde::Serialize for Error {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use super::name::json::Names;
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("message", &self.to_string())?;
        m.serialize_entry("kind", &self.kind)?;
        m.serialize_entry("operation", &self.op)?;
        m.serialize_entry("errno", &self.raw_os_error())?;
        self.src.put("src", "src_bytes", &mut m)?;
        self.dst.put("dst", "dst_bytes", &mut m)?;
        m.serialize_entry("reason", &self.reason())?;
        m.end()
    }
}

impl Error {
    /// Whether copying the data instead would have worked where this
    /// error stopped a clone or hardlink (different filesystems, no
    /// reflink support...): the [`LinkMode::Auto`](crate::LinkMode::Auto)
    /// fallback rule. Front ends use it to suggest the copying mode.
    pub fn copy_would_work(&self) -> bool {
        self.errno.is_some_and(is_not_possible_here)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e.errno {
            Some(errno) => io::Error::new(io::Error::from(errno).kind(), e.to_string()),
            None => io::Error::other(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_serialize_one_way_with_kind_errno_and_paths() {
        let e = Error::from_errno(Operation::Clone, Errno::XDEV)
            .with_src("a")
            .with_dst("b");
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["kind"], "cross_device");
        assert_eq!(v["operation"], "clone");
        assert_eq!(v["errno"], Errno::XDEV.raw_os_error());
        assert_eq!(v["src"], "a");
        assert_eq!(v["dst"], "b");
        assert_eq!(v["message"], e.to_string());
        assert!(e.copy_would_work());
        let none = Error::new(Operation::Store, ErrorKind::Corrupt);
        let v = serde_json::to_value(&none).unwrap();
        assert!(v["errno"].is_null() && v["src"].is_null());
        assert!(!none.copy_would_work());
    }

    #[test]
    fn fallback_policy_is_exactly_the_documented_set() {
        for e in [
            Errno::XDEV,
            Errno::OPNOTSUPP,
            Errno::NOTTY,
            Errno::NOSYS,
            Errno::INVAL,
            // An active swap file as the source (destinations are always
            // new files): never cloned, but readable.
            Errno::TXTBSY,
        ] {
            assert!(is_not_possible_here(e), "{e:?} should allow fallback");
        }
        for e in [
            Errno::NOENT,
            Errno::ACCESS,
            Errno::EXIST,
            Errno::NOSPC,
            Errno::DQUOT,
            Errno::IO,
            Errno::PERM,
        ] {
            assert!(!is_not_possible_here(e), "{e:?} must not fall back");
        }
    }

    #[test]
    fn classify_maps_the_common_errnos() {
        assert_eq!(classify(Errno::XDEV), ErrorKind::CrossDevice);
        assert_eq!(classify(Errno::OPNOTSUPP), ErrorKind::NotSupported);
        assert_eq!(classify(Errno::NOSPC), ErrorKind::NoSpace);
        assert_eq!(classify(Errno::DQUOT), ErrorKind::NoSpace);
        assert_eq!(classify(Errno::EXIST), ErrorKind::AlreadyExists);
        assert_eq!(classify(Errno::ACCESS), ErrorKind::PermissionDenied);
        assert_eq!(classify(Errno::IO), ErrorKind::Io);
    }

    #[test]
    fn a_usual_errno_classifies_back_to_its_kind() {
        use ErrorKind::*;
        for k in [
            NotSupported,
            CrossDevice,
            InvalidInput,
            LinkLimit,
            AlreadyExists,
            NotFound,
            PermissionDenied,
            NoSpace,
            IsDirectory,
            NotADirectory,
            ReadOnly,
            Cancelled,
            Io,
        ] {
            assert_eq!(classify(k.usual_errno().expect("an errno")), k);
        }
        // Two kinds borrow a broader errno: EINVAL and EBUSY.
        assert_eq!(Unaligned.usual_errno(), Some(Errno::INVAL));
        assert_eq!(InUse.usual_errno(), Some(Errno::BUSY));
        assert_eq!(SameFile.usual_errno(), None);
    }

    #[test]
    fn message_names_paths_and_reason() {
        let e = Error::from_errno(Operation::Clone, Errno::XDEV)
            .with_src("a")
            .with_dst("b")
            .with_reason("different filesystems (xfs → btrfs)");
        assert_eq!(
            e.to_string(),
            "cannot clone 'a' to 'b': different filesystems (xfs → btrfs)"
        );
        assert_eq!(e.kind(), ErrorKind::CrossDevice);
        assert_eq!(e.raw_os_error(), Some(18));
        let e = Error::from_errno(Operation::Clone, Errno::NOENT).with_src("x");
        assert_eq!(e.to_string(), "cannot clone 'x': no such file or directory");
    }
}
