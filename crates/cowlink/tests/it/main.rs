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

/// Replay the seed corpus `fuzz/seeds/NAME` through `check` (a fuzz
/// target's own checks): each seed, then each seed cut short at every
/// length and with each byte in turn changed, none of which may panic.
/// Gives back the seeds, to be asserted on.
fn replay_corpus(name: &str, check: impl Fn(&[u8])) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(name);
    let mut seeds = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        let mut inputs = vec![bytes.clone()];
        inputs.extend((0..bytes.len()).map(|k| bytes[..k].to_vec()));
        inputs.extend((0..bytes.len()).map(|k| {
            let mut b = bytes.clone();
            b[k] = b[k].wrapping_add(1);
            b
        }));
        for input in inputs {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&input)));
            assert!(
                r.is_ok(),
                "{} (variant of {} bytes) fails",
                p.display(),
                input.len()
            );
        }
        seeds.push((p, bytes));
    }
    seeds
}
