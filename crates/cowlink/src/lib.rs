//! cowlink: copy-on-write file cloning for Linux.
//!
//! On XFS, Btrfs, bcachefs, OpenZFS ≥ 2.2 and others, a file can be cloned
//! in constant time: both names share the same blocks until one is written.
//! This crate clones files and byte ranges, falls back to the fastest
//! correct copy where cloning cannot work, always says which happened, and
//! tells in advance whether two paths can clone.
//!
//! ```no_run
//! use cowlink::{clone_file, CloneOptions, Method, Reflink};
//!
//! let outcome = clone_file("big.img", "copy.img", &CloneOptions::default())?;
//! if outcome.method == Method::Reflink {
//!     println!("cloned {} bytes without copying", outcome.bytes);
//! }
//!
//! // Clone or fail, never copy:
//! let strict = CloneOptions { reflink: Reflink::Always, ..Default::default() };
//! let support = cowlink::probe::between("big.img", "/mnt/other")?;
//! if !support.reflink.is_yes() {
//!     eprintln!("cannot clone: {}", support.reflink.reason().unwrap_or(""));
//! }
//! # let _ = strict;
//! # Ok::<(), cowlink::Error>(())
//! ```
//!
//! Module map: [`clone`](clone_file) (whole file and range), `copy` (the
//! fallback data copy), `meta` ([`Preserve`]), `place` (how a destination
//! name comes into being: [`Placement`],
//! [`Overwrite`]), [`probe`] (capabilities), [`extents`] (FIEMAP),
//! [`tree`] (directory copy), [`usage`] (true disk usage), [`dedupe`],
//! [`store`] (content-addressed store), [`error`] (one
//! error type). Linux only.
#![deny(missing_docs)]

mod clone;
mod copy;
pub mod dedupe;
pub mod error;
pub mod extents;
mod fskind;
mod hash;
mod meta;
pub mod mountinfo;
mod place;
mod prealloc;
pub mod probe;
mod scan;
pub mod store;
pub mod tree;
pub mod usage;

pub use clone::{clone_file, clone_range, CloneOptions, Method, Outcome, Reflink};
pub use error::{Error, ErrorKind, Operation, Result};
pub use fskind::{CloneLimit, FsKind};
pub use meta::Preserve;
pub use place::{is_complete_copy, remove_unfinished, Overwrite, Placement};
pub use prealloc::{PreallocOptions, PreallocWriter};
pub use usage::{usage, Usage};
