//! cowlink: copy-on-write file cloning for Linux.
//!
//! On XFS, Btrfs, bcachefs, OpenZFS ≥ 2.2 and others, a file can be cloned
//! in constant time: both names share the same blocks until one is written.
//! This crate clones files and byte ranges, falls back to the fastest
//! correct copy where cloning cannot work, always says which happened, and
//! tells in advance whether two paths can clone.
//!
//! ```no_run
//! use cowlink::{clone_file, CloneOptions, LinkMode, Method};
//!
//! let outcome = clone_file("big.img", "copy.img", &CloneOptions::default())?;
//! if outcome.method == Method::Reflink {
//!     println!("cloned {} bytes without copying", outcome.bytes);
//! }
//!
//! // Clone or fail, never copy:
//! let strict = CloneOptions { link: LinkMode::Clone, ..Default::default() };
//! let support = cowlink::probe::between("big.img", "/mnt/other")?;
//! if !support.reflink.is_yes() {
//!     eprintln!("cannot clone: {}", support.reflink.reason().unwrap_or(""));
//! }
//! # let _ = strict;
//! # Ok::<(), cowlink::Error>(())
//! ```
//!
//! Layers, bottom up (each imports only from those below it):
//! - `ground`: the one [`error`] type, filesystem kinds ([`FsKind`]), the
//!   mount table, how [`name`]s are shown in output, hashing;
//! - `prim`: file primitives: the link-mode words ([`LinkMode`],
//!   [`Method`], [`Outcome`]), moving data (clone or copy), placing a
//!   destination name ([`Placement`], [`Overwrite`]), metadata
//!   ([`Preserve`]);
//! - [`run`]: the run-control contract every long operation takes
//!   ([`Run`]: threads, a [`CancelToken`], [`Progress`] with a [`Phase`]);
//! - `walk`: the one walker engine (a work-stealing pool over open
//!   directory descriptors), driven by the tree copy and by the read-only
//!   scan of the inspection features;
//! - features: [`clone`](clone_file) (whole file and range),
//!   [`PreallocWriter`], [`tree`] (directory copy), [`extents`] (FIEMAP),
//!   [`usage`](mod@usage) (true disk usage), [`dedupe`], [`store`]
//!   (content-addressed store), [`probe`] (capabilities).
//!
//! Cargo features, all off by default, so a build tool or the Python
//! wheel compiles only the file-level core (no async runtime, no image
//! decoders):
//! - `remote`: the S3-compatible tier of the store (`store::remote`;
//!   brings tokio and object_store);
//! - `image`: qcow2 disk images, read, committed and converted by cloning
//!   ranges (`image`; brings the zlib and zstd decoders);
//! - `bench`: what to use on a volume, and volumes compared (`bench`);
//! - `clap`: `clap::ValueEnum` on the mode enums, for command lines.
//!
//! Dev drives (a loop-mounted volume that clones: root, mkfs, systemd)
//! are the separate crate `cowlink-drive`.
//!
//! Platforms: Linux clones; on other systems the core builds and copies.
//! Every call only some systems have goes through `cowlink-sys`, the
//! platform layer (one module per platform behind the same functions):
//! there, cloning answers "not supported" (so [`LinkMode::Auto`] copies
//! and [`LinkMode::Clone`] fails with that reason) and [`probe`] reports
//! the filesystem kind as [`FsKind::Unknown`] with the reason.
//! `bench` and `drive` are Linux only. On Windows the file-level API
//! ([`clone_file`], [`clone_range`], [`tree::copy_tree`], [`probe`]) runs
//! on `std::fs` and clones on ReFS and Dev Drives
//! (`FSCTL_DUPLICATE_EXTENTS_TO_FILE`); the descriptor-based engines
//! (`cp`, `dedupe`, `extents`, `usage`, `store`, `image`, the mount table,
//! [`PreallocWriter`]) are Unix only.
#![deny(missing_docs)]

mod ground;
mod prim;
#[cfg(not(unix))]
mod stdfs;
// Built on Linux too under test, so the Windows path's logic runs on the
// real test filesystems (with Linux's clone calls in place of Windows').
#[cfg(all(test, unix))]
#[allow(dead_code)]
mod stdfs;
#[cfg(unix)]
mod walk;

#[cfg(all(feature = "bench", target_os = "linux"))]
pub mod bench;
mod clone;
#[cfg(unix)]
pub mod cp;
#[cfg(unix)]
pub mod dedupe;
#[cfg(unix)]
pub mod extents;
#[cfg(all(feature = "image", unix))]
pub mod image;
#[cfg(unix)]
mod prealloc;
pub mod probe;
pub mod run;
#[cfg(unix)]
pub mod snapshot;
#[cfg(unix)]
pub mod store;
#[cfg(unix)]
pub mod sync;
pub mod tree;
#[cfg(unix)]
pub mod usage;

pub use clone::CloneOptions;
#[cfg(unix)]
pub use clone::{clone_file, clone_range};
pub use ground::error::{Error, ErrorKind, Operation, Result};
pub use ground::fskind::{CloneLimit, FsKind};
pub use ground::{error, name};
#[cfg(unix)]
pub use prealloc::{PreallocOptions, PreallocWriter};
#[cfg(unix)]
pub use prim::delta;
pub use prim::meta::Preserve;
pub use prim::mode::{LinkMode, Method, Outcome, Sparse};
#[cfg(unix)]
pub use prim::place::{is_complete_copy, left_unfinished, remove_unfinished};
pub use prim::place::{Overwrite, Placement};
pub use run::{CancelToken, Phase, Progress, Run, Totals};
#[cfg(not(unix))]
pub use stdfs::{clone_file, clone_range, remove_unfinished};
#[cfg(unix)]
pub use usage::{usage, Usage};
