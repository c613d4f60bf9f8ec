//! Python bindings of the cowlink library, imported as `cowlink` (this is
//! its native part, `cowlink._cowlink`; `python/cowlink` re-exports it).
//!
//! A thin layer: every function parses its Python arguments into the
//! library's options, calls the library with the GIL released, and turns
//! the result into a read-only record (records.rs) or the error into an
//! `OSError` (errors.rs). Long operations run under control.rs, which
//! keeps Ctrl-C and progress callbacks working while they run.

mod control;
mod dedupe;
mod errors;
mod ops;
mod path;
mod records;
mod snapshot;
mod store;
mod sync;
mod writer;

use pyo3::prelude::*;

#[pymodule]
fn _cowlink(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(ops::clone_file, m)?)?;
    m.add_function(wrap_pyfunction!(ops::clone_range, m)?)?;
    m.add_function(wrap_pyfunction!(ops::copytree, m)?)?;
    m.add_function(wrap_pyfunction!(ops::copy, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync, m)?)?;
    m.add_function(wrap_pyfunction!(sync::sync_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(ops::extents, m)?)?;
    m.add_function(wrap_pyfunction!(ops::usage, m)?)?;
    m.add_function(wrap_pyfunction!(ops::probe_filesystem, m)?)?;
    m.add_function(wrap_pyfunction!(ops::probe_between, m)?)?;
    m.add_function(wrap_pyfunction!(ops::probe_tree, m)?)?;
    m.add_function(wrap_pyfunction!(dedupe::plan, m)?)?;
    m.add_function(wrap_pyfunction!(dedupe::execute, m)?)?;
    m.add_function(wrap_pyfunction!(dedupe::run, m)?)?;
    m.add_function(wrap_pyfunction!(dedupe::watch, m)?)?;
    m.add_class::<control::CancelToken>()?;
    m.add_class::<control::Progress>()?;
    m.add_class::<records::Outcome>()?;
    m.add_class::<records::Answer>()?;
    m.add_class::<records::FsFacts>()?;
    m.add_class::<records::Support>()?;
    m.add_class::<records::MountSupport>()?;
    m.add_class::<records::Extent>()?;
    m.add_class::<records::Hole>()?;
    m.add_class::<records::FileLayout>()?;
    m.add_class::<records::Usage>()?;
    m.add_class::<records::TreeReport>()?;
    m.add_class::<sync::SyncReport>()?;
    m.add_class::<sync::SnapshotSyncReport>()?;
    m.add_class::<dedupe::Plan>()?;
    m.add_class::<dedupe::Group>()?;
    m.add_class::<dedupe::DedupeReport>()?;
    m.add_class::<dedupe::SkippedTarget>()?;
    m.add_class::<dedupe::IndexReport>()?;
    m.add_class::<dedupe::WatchScope>()?;
    m.add_class::<dedupe::WatchBatch>()?;
    m.add_class::<dedupe::WatchSummary>()?;
    m.add_class::<store::Store>()?;
    m.add_class::<store::Added>()?;
    m.add_class::<store::AddedTree>()?;
    m.add_class::<store::CheckoutReport>()?;
    m.add_class::<store::Corrupt>()?;
    m.add_class::<store::VerifyReport>()?;
    m.add_class::<store::GcReport>()?;
    m.add_class::<store::StoreStats>()?;
    m.add_class::<writer::PreallocWriter>()?;
    m.add_class::<snapshot::SnapshotSet>()?;
    m.add_class::<snapshot::Begun>()?;
    m.add_class::<snapshot::Snapshot>()?;
    m.add_class::<snapshot::Verdict>()?;
    m.add_class::<snapshot::PruneReport>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
