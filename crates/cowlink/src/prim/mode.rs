//! The words for how data reaches a destination: the mode asked for
//! ([`Reflink`]) and the method actually used ([`Method`], in an
//! [`Outcome`]). Every feature (clone, tree, store) speaks these.

/// Whether to share blocks, with `cp --reflink` semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reflink {
    /// Clone or fail: never copies (`copy_file_range` may silently copy, so
    /// it never backs this mode).
    Always,
    /// Clone when possible, else the fastest correct copy (the default).
    #[default]
    Auto,
    /// Never share blocks: always a physical copy with read/write.
    Never,
}

/// How the data actually got to the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Blocks are shared with the source (FICLONE / FICLONERANGE).
    Reflink,
    /// Copied in the kernel with `copy_file_range` (which may itself have
    /// shared blocks or copied server-side, at the filesystem's choice).
    CopyOffload,
    /// Copied through user space with read/write.
    ReadWrite,
    /// A hardlink to the same inode (used by later tree/store modes).
    Hardlink,
}

impl Method {
    /// A word for people: "cloned", "copied (copy_file_range)", ...
    pub fn describe(self) -> &'static str {
        match self {
            Method::Reflink => "cloned",
            Method::CopyOffload => "copied (copy_file_range)",
            Method::ReadWrite => "copied (read/write)",
            Method::Hardlink => "hardlinked",
        }
    }
}

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// The method actually used.
    pub method: Method,
    /// Logical bytes the destination received (the source's size).
    pub bytes: u64,
}
