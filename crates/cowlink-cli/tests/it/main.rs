//! The `cowlink` command's integration tests, one binary (one link
//! instead of one per file): a module per command. Most need the
//! loop-mounted test filesystems and are `#[ignore]`d with the reason;
//! `scripts/test` runs them with `--include-ignored`. Shared helpers are
//! in `common` (running the binary) and `cowlink-testfs`.

mod common;

mod bench;
mod cli;
mod dedupe_index;
mod docgen;
mod drive;
mod gnu_cp;
mod image;
mod inspect;
mod output;
mod remote;
mod run_control;
mod snapshot;
mod store;
mod sync;
mod tree;
mod watch;
