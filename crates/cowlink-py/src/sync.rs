//! `cowlink.sync()`: Python arguments into `cowlink::sync::SyncOptions`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::Mutex;

use cowlink::sync::{SyncEvent, SyncOptions};
use cowlink::Error;
use pyo3::prelude::*;

use crate::control::{CancelToken, Control};
use crate::errors::to_py;
use crate::path::FsPath;
use crate::records::record;

record!(
    /// What a sync did (in a dry run, would have done).
    SyncReport {
        /// Entries created.
        created: u64,
        /// Entries whose data was replaced, or replaced by another type.
        replaced: u64,
        /// Entries whose metadata only was set.
        metadata: u64,
        /// Entries removed (`delete`).
        deleted: u64,
        /// Names made hardlinks to an earlier name's copy.
        hardlinked: u64,
        /// Entries left untouched because they matched.
        unchanged: u64,
        /// Bytes of files placed.
        bytes: u64,
        /// Files sharing their blocks with their source.
        cloned: u64,
        /// Files cloned from a `reflink_dest` directory.
        cloned_from_reflink_dest: u64,
        /// Files physically copied.
        copied: u64,
        /// Of those, files from another filesystem made as a clone of
        /// their old version with only the differing blocks written.
        by_blocks: u64,
        /// Entries that failed.
        errors: u64,
        /// Stopped by a CancelToken before the end.
        cancelled: bool,
        /// Nothing was changed.
        dry_run: bool,
    }
);

impl From<&cowlink::sync::SyncReport> for SyncReport {
    fn from(r: &cowlink::sync::SyncReport) -> Self {
        SyncReport {
            created: r.created,
            replaced: r.replaced,
            metadata: r.metadata,
            deleted: r.deleted,
            hardlinked: r.hardlinked,
            unchanged: r.unchanged,
            bytes: r.bytes,
            cloned: r.cloned,
            cloned_from_reflink_dest: r.cloned_from_reflink_dest,
            copied: r.copied,
            by_blocks: r.by_blocks,
            errors: r.errors,
            cancelled: r.cancelled,
            dry_run: r.dry_run,
        }
    }
}

/// `src` as the library reads it: with `contents`, its contents (a
/// trailing slash); with `contents=False`, the directory itself (none);
/// left `None`, as given (rsync's rule; `pathlib` drops the slash, so
/// pass `contents=True` with a `Path`).
fn source_path(src: PathBuf, contents: Option<bool>) -> PathBuf {
    let mut b = src.into_os_string().into_vec();
    match contents {
        Some(true) if !b.ends_with(b"/") => b.push(b'/'),
        Some(false) => {
            while b.len() > 1 && b.ends_with(b"/") {
                b.pop();
            }
        }
        _ => {}
    }
    PathBuf::from(OsString::from_vec(b))
}

/// Make `dst` equal `src` as `rsync -aHAX` would, touching only what
/// differs and cloning what changed where the filesystem allows (see
/// `cowlink sync --help`). `contents=True` syncs the contents of `src`
/// into `dst`, `False` the directory itself into `dst/NAME`; `None` (the
/// default) follows rsync's trailing-slash rule on the string given.
/// `delete` removes what `src` lacks (`delete_excluded`: excluded entries
/// too); `exclude` takes gitignore patterns; `checksum` compares
/// contents; `reflink_dest` names directories (relative ones taken from
/// `dst`) whose equal files are cloned. Failed entries do not stop the
/// sync; at the end they are raised together as `TreeError` (with
/// `errors` and `report`). Ctrl-C, `cancel` or an exception from
/// `on_progress` stops it cleanly: every name is old or new, and a rerun
/// converges.
#[pyfunction]
#[pyo3(signature = (src, dst, *, contents=None, delete=false, delete_excluded=false, exclude=Vec::new(), checksum=false, reflink_dest=Vec::new(), dry_run=false, hardlinks=true, threads=None, on_progress=None, cancel=None))]
#[allow(clippy::too_many_arguments)]
pub fn sync(
    py: Python<'_>,
    src: FsPath,
    dst: FsPath,
    contents: Option<bool>,
    delete: bool,
    delete_excluded: bool,
    exclude: Vec<String>,
    checksum: bool,
    reflink_dest: Vec<FsPath>,
    dry_run: bool,
    hardlinks: bool,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<SyncReport> {
    let src = source_path(src.0, contents);
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let options = SyncOptions {
        checksum,
        delete,
        delete_excluded,
        exclude,
        reflink_dest: reflink_dest.into_iter().map(|p| p.0).collect(),
        dry_run,
        no_hardlinks: !hardlinks,
        run: control.run(),
    };
    let failed: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    let observe = |ev: &SyncEvent<'_>| {
        if let SyncEvent::Failed(e) = ev {
            failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((*e).clone());
        }
    };
    let result = control.drive(py, || cowlink::sync::sync(&src, &dst, &options, &observe))?;
    let report = result.map_err(|e| to_py(py, &e))?;
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    let report = SyncReport::from(&report);
    if failed.is_empty() {
        return Ok(report);
    }
    Err(crate::errors::tree_failures(
        py,
        &failed,
        "the entries could not be synced",
        "sync",
        Some(&src),
        Some(&dst.0),
        report,
    )?)
}

record!(
    /// What `sync_snapshot` made.
    SnapshotSyncReport {
        /// The snapshot's name under the root; in a dry run, the snapshot
        /// compared against (None when the set has no complete one).
        snapshot: Option<String>,
        /// Its directory (None for a dry run against no snapshot).
        path: Option<PathBuf>,
        /// It was an interrupted snapshot, resumed under its name.
        resumed: bool,
        /// The complete snapshot it was cloned from.
        base: Option<String>,
        /// It was sealed complete (False after a cancel or a failed entry:
        /// it stays in progress and the next run resumes it).
        completed: bool,
        /// The sync into it.
        sync: Py<SyncReport>,
    }
);

/// `cowlink sync --snapshot ROOT SRC/`: make a new snapshot in the set at
/// `root` (`ROOT/<UTC time>/`, a clone of the newest complete snapshot, a
/// subvolume snapshot on Btrfs), sync `src` into it with deletion (a
/// snapshot is `src` as it was), and seal it complete. A cancelled or
/// failed run leaves it in progress, never listed complete; the next call
/// resumes it under its name. `contents`, `exclude`, `checksum`,
/// `dry_run` (compare against the newest complete snapshot, make
/// nothing), `hardlinks`, `threads`, `on_progress` and `cancel` are as for
/// `sync`. Failed entries are raised together as `TreeError` after the
/// run, with `report`.
#[pyfunction]
#[pyo3(signature = (src, root, *, contents=None, exclude=Vec::new(), checksum=false, dry_run=false, hardlinks=true, threads=None, on_progress=None, cancel=None))]
#[allow(clippy::too_many_arguments)]
pub fn sync_snapshot(
    py: Python<'_>,
    src: FsPath,
    root: FsPath,
    contents: Option<bool>,
    exclude: Vec<String>,
    checksum: bool,
    dry_run: bool,
    hardlinks: bool,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<SnapshotSyncReport> {
    let src = source_path(src.0, contents);
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let options = SyncOptions {
        checksum,
        exclude,
        dry_run,
        no_hardlinks: !hardlinks,
        run: control.run(),
        ..SyncOptions::default()
    };
    let failed: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    let observe = |ev: &SyncEvent<'_>| {
        if let SyncEvent::Failed(e) = ev {
            failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((*e).clone());
        }
    };
    let result = control.drive(py, || {
        cowlink::sync::sync_snapshot(&src, &root.0, &options, &observe)
    })?;
    let r = result.map_err(|e| to_py(py, &e))?;
    let report = SnapshotSyncReport {
        snapshot: r.snapshot.clone(),
        path: r.path.clone(),
        resumed: r.resumed,
        base: r.base.clone(),
        completed: r.completed,
        sync: Py::new(py, SyncReport::from(&r.sync))?,
    };
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    if failed.is_empty() {
        return Ok(report);
    }
    Err(crate::errors::tree_failures(
        py,
        &failed,
        "the entries could not be synced into the snapshot (left in progress)",
        "sync",
        Some(&src),
        r.path.as_deref(),
        report,
    )?)
}
