//! The words for how data reaches a destination, and the one rule for
//! falling back: the mode asked for ([`Reflink`] for clones and copies,
//! [`LinkMode`] for store checkouts, which adds hardlinks to it), the
//! method actually used ([`Method`], in an [`Outcome`]), and [`Step`], the
//! small state machine every feature drives: clone first (unless a copy
//! was asked for); after a failed clone, [`Reflink::after`] says whether to
//! copy, to retry from another physical copy of the same bytes (a store
//! object's next generation, when a per-block reference limit was hit), or
//! to fail. `prim::transfer` drives it for files and trees, the store's
//! checkout drives it with its generations.

use rustix::io::Errno;

use crate::ground::error::is_not_possible_here;

/// Whether to share blocks, with `cp --reflink` semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Reflink {
    /// Clone or fail: never copies (`copy_file_range` may silently copy, so
    /// it never backs this mode).
    #[cfg_attr(
        feature = "clap",
        value(help = "Clone, or fail where cloning is not possible")
    )]
    Always,
    /// Clone when possible, else the fastest correct copy (the default).
    #[default]
    #[cfg_attr(feature = "clap", value(help = "Clone where possible, else copy"))]
    Auto,
    /// Never share blocks: always a physical copy with read/write.
    #[cfg_attr(feature = "clap", value(help = "Always a physical copy"))]
    Never,
}

/// How a checked-out file relates to its store object: the [`Reflink`]
/// modes under the store's names, plus hardlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum LinkMode {
    /// Share the object's blocks (a reflink): instant, no space, and a
    /// write to the file copies only what it touches, never reaching the
    /// store. Fails where the filesystem cannot clone (the default;
    /// [`Reflink::Always`]).
    #[default]
    #[cfg_attr(
        feature = "clap",
        value(help = "Share the object's blocks; fail where the filesystem cannot")
    )]
    Clone,
    /// A physical copy with blocks of its own ([`Reflink::Never`]).
    #[cfg_attr(feature = "clap", value(help = "Physical copy"))]
    Copy,
    /// A hardlink to the object itself. **Write-through**: the file *is*
    /// the object, so writing to it (after making it writable) corrupts
    /// the store and every other place it was materialized. Its mode is the
    /// object's (read-only), not the manifest's. Only for callers that
    /// never write and want the last microsecond.
    #[cfg_attr(
        feature = "clap",
        value(help = "Hardlink to the object: WRITE-THROUGH, a write corrupts the store")
    )]
    Hardlink,
    /// Clone where possible, else copy ([`Reflink::Auto`]).
    #[cfg_attr(feature = "clap", value(help = "Clone where possible, else copy"))]
    Auto,
}

impl LinkMode {
    /// The [`Reflink`] mode this is, for data placed by clone or copy
    /// (`None` for [`LinkMode::Hardlink`]).
    pub fn reflink(self) -> Option<Reflink> {
        match self {
            LinkMode::Clone => Some(Reflink::Always),
            LinkMode::Auto => Some(Reflink::Auto),
            LinkMode::Copy => Some(Reflink::Never),
            LinkMode::Hardlink => None,
        }
    }
}

impl From<Reflink> for LinkMode {
    fn from(r: Reflink) -> LinkMode {
        match r {
            Reflink::Always => LinkMode::Clone,
            Reflink::Auto => LinkMode::Auto,
            Reflink::Never => LinkMode::Copy,
        }
    }
}

/// One step of placing data: what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Share the source's blocks.
    Clone,
    /// Copy the data; `offload` allows `copy_file_range` (which may share
    /// or copy server-side: never used for [`Reflink::Never`]).
    Copy {
        /// Whether `copy_file_range` may be used.
        offload: bool,
    },
    /// Clone again from another physical copy of the same bytes: this
    /// source reached a per-block reference limit (`EMLINK`, `EOVERFLOW`).
    NextSource,
    /// Give up with this errno.
    Fail(Errno),
}

impl Reflink {
    /// The first step for this mode.
    pub(crate) fn first_step(self) -> Step {
        match self {
            Reflink::Never => Step::Copy { offload: false },
            Reflink::Always | Reflink::Auto => Step::Clone,
        }
    }

    /// The step after a clone failed with `errno`. `other_source` says
    /// whether the caller can offer another physical copy of the same
    /// bytes (the store's generations); without one a reference limit is a
    /// failure like any other.
    pub(crate) fn after(self, errno: Errno, other_source: bool) -> Step {
        match errno {
            Errno::MLINK | Errno::OVERFLOW if other_source => Step::NextSource,
            e if self == Reflink::Auto && is_not_possible_here(e) => Step::Copy { offload: true },
            e => Step::Fail(e),
        }
    }
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
    /// A hardlink to the same inode (store checkouts with
    /// [`LinkMode::Hardlink`]).
    Hardlink,
    /// Nothing was written: the destination existed and
    /// [`Overwrite::Skip`](crate::Overwrite::Skip) keeps it (`bytes` is 0).
    Skipped,
}

impl Method {
    /// A word for people: "cloned", "copied (copy_file_range)", ...
    pub fn describe(self) -> &'static str {
        match self {
            Method::Reflink => "cloned",
            Method::CopyOffload => "copied (copy_file_range)",
            Method::ReadWrite => "copied (read/write)",
            Method::Hardlink => "hardlinked",
            Method::Skipped => "skipped (destination exists)",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_state_machine() {
        use Reflink::*;
        assert_eq!(Never.first_step(), Step::Copy { offload: false });
        assert_eq!(Always.first_step(), Step::Clone);
        assert_eq!(Auto.first_step(), Step::Clone);
        // Not possible here: auto copies, always fails.
        for e in [Errno::XDEV, Errno::OPNOTSUPP, Errno::INVAL, Errno::TXTBSY] {
            assert_eq!(Auto.after(e, false), Step::Copy { offload: true });
            assert_eq!(Always.after(e, true), Step::Fail(e));
        }
        // Real errors are never hidden by a copy.
        for e in [Errno::NOSPC, Errno::IO, Errno::ACCESS, Errno::NOENT] {
            assert_eq!(Auto.after(e, true), Step::Fail(e));
        }
        // A reference limit: another source if there is one, else a failure.
        assert_eq!(Always.after(Errno::MLINK, true), Step::NextSource);
        assert_eq!(Auto.after(Errno::OVERFLOW, true), Step::NextSource);
        assert_eq!(Auto.after(Errno::MLINK, false), Step::Fail(Errno::MLINK));
    }

    #[test]
    fn link_modes_are_reflink_modes_plus_hardlink() {
        for r in [Reflink::Always, Reflink::Auto, Reflink::Never] {
            assert_eq!(LinkMode::from(r).reflink(), Some(r));
        }
        assert_eq!(LinkMode::Hardlink.reflink(), None);
    }
}
