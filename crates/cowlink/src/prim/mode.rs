//! The words for how data reaches a destination, and the one rule for
//! falling back: the [`LinkMode`] asked for (clone, clone-else-copy,
//! copy, hardlink: one type for `clone_file`, the tree copy, `cp
//! --reflink`, store checkouts and Python), the method actually used
//! ([`Method`], in an [`Outcome`]), and [`Step`], the small state machine
//! every feature drives: clone first (unless a copy was asked for); after
//! a failed clone, [`LinkMode::after`] says whether to copy, to retry from
//! another physical copy of the same bytes (a store object's next
//! generation, when a per-block reference limit was hit), or to fail.
//! `prim::transfer` drives it for files and trees, the store's checkout
//! drives it with its generations.

use cowlink_sys::Errno;

use crate::ground::error::is_not_possible_here;

/// How a data copy treats holes (`cp --sparse=WHEN`). It applies to
/// copies, never to a clone, which shares the source's blocks and layout
/// whatever this says (whether a mode still clones is the caller's rule:
/// GNU cp turns `--reflink=auto` into a copy with `Never`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sparse {
    /// Keep the source's holes (found with `SEEK_DATA`/`SEEK_HOLE` when its
    /// blocks do not cover its size), write everything else.
    #[default]
    Auto,
    /// Keep the source's holes and also leave every run of zeros that
    /// covers whole blocks unwritten, so it becomes a hole: GNU's scan in
    /// 512-byte units, by read/write (`copy_file_range` would allocate).
    Always,
    /// Fill every hole: the copy has blocks for its whole length, by
    /// read/write.
    Never,
}

/// How a file is placed, and with what fallback.
///
/// The policy words of `cp --reflink` map onto it: `always` is
/// [`LinkMode::Clone`], `auto` is [`LinkMode::Auto`], `never` is
/// [`LinkMode::Copy`] ([`LinkMode::from_reflink`]). There is no
/// `Default`: each operation documents its own, and keeps it
/// (`clone_file`, the tree copy and `cp`: [`LinkMode::Auto`]; store
/// checkouts: [`LinkMode::Clone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum LinkMode {
    /// Share the source's blocks (a reflink), or fail where the filesystem
    /// cannot (`cp --reflink=always`): never copies (`copy_file_range` may
    /// silently copy, so it never backs this mode). A write to the result
    /// copies only what it touches and never reaches the source.
    #[cfg_attr(
        feature = "clap",
        value(help = "Share the source's blocks; fail where the filesystem cannot")
    )]
    Clone,
    /// Clone where possible, else the fastest correct copy
    /// (`cp --reflink=auto`).
    #[cfg_attr(feature = "clap", value(help = "Clone where possible, else copy"))]
    Auto,
    /// A physical copy with blocks of its own, by read/write
    /// (`cp --reflink=never`).
    #[cfg_attr(feature = "clap", value(help = "Physical copy"))]
    Copy,
    /// A hardlink to the source itself, or fail (across filesystems, say).
    /// **Write-through**: the result *is* the source, so writing to it
    /// changes the source (for a store checkout: corrupts the store and
    /// every other place the object was checked out). Its mode and times
    /// are the source's. Only for callers that never write and want the
    /// last microsecond.
    #[cfg_attr(
        feature = "clap",
        value(help = "Hardlink to the source: WRITE-THROUGH, a write changes the source")
    )]
    Hardlink,
}

impl LinkMode {
    /// The mode `cp --reflink=WHEN` names: `always`, `auto` or `never`
    /// (`None` for anything else).
    pub fn from_reflink(when: &str) -> Option<LinkMode> {
        match when {
            "always" => Some(LinkMode::Clone),
            "auto" => Some(LinkMode::Auto),
            "never" => Some(LinkMode::Copy),
            _ => None,
        }
    }

    /// Whether this mode may share blocks with the source (clone-bound
    /// work: [`Clone`](Self::Clone) and [`Auto`](Self::Auto)).
    pub fn may_clone(self) -> bool {
        matches!(self, LinkMode::Clone | LinkMode::Auto)
    }
}

/// One step of placing data: what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Share the source's blocks.
    Clone,
    /// Copy the data; `offload` allows `copy_file_range` (which may share
    /// or copy server-side: never used for [`LinkMode::Copy`]).
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

impl LinkMode {
    /// The first step for this mode. [`LinkMode::Hardlink`] is placed by
    /// the caller; for data it clones or fails, as [`LinkMode::Clone`].
    pub(crate) fn first_step(self) -> Step {
        match self {
            LinkMode::Copy => Step::Copy { offload: false },
            LinkMode::Clone | LinkMode::Auto | LinkMode::Hardlink => Step::Clone,
        }
    }

    /// The step after a clone failed with `errno`. `other_source` says
    /// whether the caller can offer another physical copy of the same
    /// bytes (the store's generations); without one a reference limit is a
    /// failure like any other.
    pub(crate) fn after(self, errno: Errno, other_source: bool) -> Step {
        match errno {
            Errno::MLINK | Errno::OVERFLOW if other_source => Step::NextSource,
            e if self == LinkMode::Auto && is_not_possible_here(e) => Step::Copy { offload: true },
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
    /// A hardlink to the same inode ([`LinkMode::Hardlink`]).
    Hardlink,
    /// The destination's old version, cloned, with only the blocks that
    /// differ from the source written (`sync` from another filesystem:
    /// see [`crate::delta`]); `bytes` is the file's size.
    Delta,
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
            Method::Delta => "updated by blocks",
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
        use LinkMode::*;
        assert_eq!(Copy.first_step(), Step::Copy { offload: false });
        assert_eq!(Clone.first_step(), Step::Clone);
        assert_eq!(Auto.first_step(), Step::Clone);
        assert_eq!(Hardlink.first_step(), Step::Clone);
        // Not possible here: auto copies, clone fails.
        for e in [Errno::XDEV, Errno::OPNOTSUPP, Errno::INVAL, Errno::TXTBSY] {
            assert_eq!(Auto.after(e, false), Step::Copy { offload: true });
            assert_eq!(Clone.after(e, true), Step::Fail(e));
        }
        // Real errors are never hidden by a copy.
        for e in [Errno::NOSPC, Errno::IO, Errno::ACCESS, Errno::NOENT] {
            assert_eq!(Auto.after(e, true), Step::Fail(e));
        }
        // A reference limit: another source if there is one, else a failure.
        assert_eq!(Clone.after(Errno::MLINK, true), Step::NextSource);
        assert_eq!(Auto.after(Errno::OVERFLOW, true), Step::NextSource);
        assert_eq!(Auto.after(Errno::MLINK, false), Step::Fail(Errno::MLINK));
    }

    #[test]
    fn cp_reflink_words_map_onto_link_modes() {
        assert_eq!(LinkMode::from_reflink("always"), Some(LinkMode::Clone));
        assert_eq!(LinkMode::from_reflink("auto"), Some(LinkMode::Auto));
        assert_eq!(LinkMode::from_reflink("never"), Some(LinkMode::Copy));
        assert_eq!(LinkMode::from_reflink("clone"), None);
        assert!(LinkMode::Auto.may_clone() && LinkMode::Clone.may_clone());
        assert!(!LinkMode::Copy.may_clone() && !LinkMode::Hardlink.may_clone());
    }
}
