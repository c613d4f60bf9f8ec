//! The library's integration tests, one binary (one link instead of one
//! per file): a module per area. Most need the loop-mounted test
//! filesystems and are `#[ignore]`d with the reason; `scripts/test` runs
//! them with `--include-ignored`. Shared helpers are in `cowlink-testfs`,
//! and here when they need the library.

use std::path::Path;

mod cp;
mod dedupe;
mod dedupe_hostile;
mod dedupe_identity;
mod dedupe_index;
mod dedupe_index_end;
mod dedupe_space;
mod delta;
mod inspect;
mod prealloc;
mod real_fs;
// The S3 tier is a feature; `cargo test --workspace` (scripts/test) has it
// on, because the command enables it.
#[cfg(feature = "remote")]
mod remote;
mod snapshot;
mod store;
mod sync;
mod sync_hostile;
mod tree;
mod watch;

/// Whether `b` maps every byte to the same disk blocks as `a` (FIEMAP).
fn same_blocks(a: &Path, b: &Path) -> bool {
    let runs = |p: &Path| cowlink::extents::extents(p).unwrap().physical_runs();
    let (x, y) = (runs(a), runs(b));
    !x.is_empty() && x == y
}
