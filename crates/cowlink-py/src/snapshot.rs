//! `cowlink.SnapshotSet`: snapshot sets (`cowlink snapshot`): begin a
//! snapshot (a clone of the newest complete one), complete it, list the
//! snapshots with their usage, prune by age.

use std::path::PathBuf;
use std::sync::Mutex;

use cowlink::snapshot::{
    Begun as LibBegun, KeepPolicy, Snapshot as LibSnapshot, SnapshotSet as LibSet,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::control::{CancelToken, Control};
use crate::errors::to_py;
use crate::path::FsPath;
use crate::records::{error_list, record, word, Usage};

record!(
    /// One snapshot of a set.
    Snapshot {
        /// Its name under the root: the UTC time it was begun
        /// ("20261126T024549.123456Z").
        name: String,
        /// Its directory.
        path: PathBuf,
        /// "cloning", "open" (in progress), "complete" or "removing".
        state: String,
        /// "tree" (files cloned from the base) or "subvolume" (Btrfs).
        kind: String,
        /// The snapshot it was cloned from.
        base: Option<String>,
        /// Whether its directory exists.
        present: bool,
        /// Its usage measured with the other snapshots (`exclusive`: what
        /// only it holds), when asked for and present.
        usage: Option<Py<Usage>>,
    }
);

record!(
    /// What `SnapshotSet.prune` decided for one snapshot.
    Verdict {
        /// The snapshot's name.
        name: String,
        /// "policy", "newest", "in_use", "replaced" (kept), "remove" or
        /// "unfinished" (removed, or to be removed in a dry run).
        verdict: String,
        /// Whether it stays.
        kept: bool,
        /// Its removal failed (see `errors`).
        failed: bool,
    }
);

record!(
    /// What `SnapshotSet.prune` did.
    PruneReport {
        /// Every recorded snapshot, oldest first.
        snapshots: Vec<Py<Verdict>>,
        /// Unreadable records and failed removals, as OSError.
        errors: Vec<Py<PyAny>>,
        /// Nothing was removed.
        dry_run: bool,
    }
);

fn snapshot(py: Python<'_>, s: &LibSnapshot, usage: Option<&cowlink::Usage>) -> PyResult<Snapshot> {
    Ok(Snapshot {
        name: s.name.clone(),
        path: s.path.clone(),
        state: word(&s.state),
        kind: word(&s.kind),
        base: s.base.clone(),
        present: s.present,
        usage: usage.map(|u| Py::new(py, Usage::from(u))).transpose()?,
    })
}

/// A snapshot root: `ROOT/<UTC time>/` per snapshot, bookkeeping in
/// `ROOT/.cowlink`. Made (one level) when missing.
#[pyclass(module = "cowlink", frozen)]
pub struct SnapshotSet {
    inner: LibSet,
}

#[pymethods]
impl SnapshotSet {
    #[new]
    fn new(py: Python<'_>, root: FsPath) -> PyResult<Self> {
        let inner = py
            .detach(|| LibSet::open(&root))
            .map_err(|e| to_py(py, &e))?;
        Ok(SnapshotSet { inner })
    }

    /// The root.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.root().to_path_buf()
    }

    /// Every snapshot, oldest first. With `usage=True`, each with its
    /// disk usage from one walk of them all (a long walk: Ctrl-C, an
    /// exception from `on_progress` or `cancel` stop it).
    #[pyo3(signature = (*, usage=false, threads=None, on_progress=None, cancel=None))]
    fn list(
        &self,
        py: Python<'_>,
        usage: bool,
        threads: Option<usize>,
        on_progress: Option<Bound<'_, PyAny>>,
        cancel: Option<Bound<'_, CancelToken>>,
    ) -> PyResult<Vec<Snapshot>> {
        if !usage {
            let (snaps, _) = py.detach(|| self.inner.list()).map_err(|e| to_py(py, &e))?;
            return snaps.iter().map(|s| snapshot(py, s, None)).collect();
        }
        let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
        let set = self.inner.clone().with_run(control.run());
        let mut listing = control
            .drive(py, || set.list_usage())?
            .map_err(|e| to_py(py, &e))?;
        if let Some(e) = listing.errors.first() {
            return Err(to_py(py, e));
        }
        if listing.cancelled {
            return Err(to_py(
                py,
                &cowlink::Error::new(cowlink::Operation::Snapshot, cowlink::ErrorKind::Cancelled)
                    .with_src(self.inner.root())
                    .with_reason("the usage walk was cancelled"),
            ));
        }
        listing
            .snapshots
            .drain(..)
            .map(|s| snapshot(py, &s.snapshot, s.usage.as_ref()))
            .collect()
    }

    /// Begin a snapshot: resume the one in progress under its name, or
    /// make a new one as a clone of the newest complete one. The set is
    /// locked until it is completed or dropped. As a context manager,
    /// leaving the block without an exception completes it.
    fn begin(&self, py: Python<'_>) -> PyResult<Begun> {
        let b = py
            .detach(|| self.inner.begin())
            .map_err(|e| to_py(py, &e))?;
        Ok(Begun {
            path: b.path().to_path_buf(),
            name: b.name().to_string(),
            base: b.base().map(str::to_string),
            resumed: b.resumed(),
            kind: word(&b.kind()),
            inner: Mutex::new(Some(b)),
        })
    }

    /// Remove the snapshots the rules do not keep (restic's
    /// `--keep-last/--keep-daily/--keep-weekly`, days and weeks in UTC);
    /// never the newest complete one, one in progress, or a directory
    /// this tool did not make. At least one rule must be given.
    #[pyo3(signature = (*, keep_last=0, keep_daily=0, keep_weekly=0, dry_run=false))]
    fn prune(
        &self,
        py: Python<'_>,
        keep_last: u32,
        keep_daily: u32,
        keep_weekly: u32,
        dry_run: bool,
    ) -> PyResult<PruneReport> {
        let keep = KeepPolicy {
            last: keep_last,
            daily: keep_daily,
            weekly: keep_weekly,
        };
        if keep == KeepPolicy::default() {
            return Err(PyValueError::new_err(
                "give at least one of keep_last, keep_daily, keep_weekly",
            ));
        }
        let r = py
            .detach(|| self.inner.prune(&keep, dry_run))
            .map_err(|e| to_py(py, &e))?;
        let snapshots = r
            .snapshots
            .iter()
            .map(|(s, v)| {
                Py::new(
                    py,
                    Verdict {
                        name: s.name.clone(),
                        verdict: word(v),
                        kept: v.keeps(),
                        failed: r.failed.contains(&s.name),
                    },
                )
            })
            .collect::<PyResult<_>>()?;
        Ok(PruneReport {
            snapshots,
            errors: error_list(py, &r.errors)?,
            dry_run,
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let path = self.inner.root().into_pyobject(py)?;
        Ok(format!("SnapshotSet({})", path.str()?.repr()?))
    }
}

/// A snapshot begun by `SnapshotSet.begin()`: write into `path`, then
/// `complete()`.
#[pyclass(module = "cowlink", frozen)]
pub struct Begun {
    /// The snapshot's directory.
    #[pyo3(get)]
    path: PathBuf,
    /// Its name.
    #[pyo3(get)]
    name: String,
    /// The snapshot it was cloned from (None for the first).
    #[pyo3(get)]
    base: Option<String>,
    /// Whether an interrupted snapshot was resumed.
    #[pyo3(get)]
    resumed: bool,
    /// "tree" or "subvolume".
    #[pyo3(get)]
    kind: String,
    /// The library's begun snapshot, until completed or released.
    inner: Mutex<Option<LibBegun>>,
}

impl Begun {
    fn take(&self) -> PyResult<LibBegun> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| PyValueError::new_err("this snapshot was already completed or released"))
    }
}

#[pymethods]
impl Begun {
    /// Seal it: write the filesystem back, then its completion mark. The
    /// set's lock is released.
    fn complete(&self, py: Python<'_>) -> PyResult<Snapshot> {
        let b = self.take()?;
        let s = py.detach(|| b.complete()).map_err(|e| to_py(py, &e))?;
        snapshot(py, &s, None)
    }

    /// Release the lock without completing: the snapshot stays in
    /// progress, and the next `begin()` resumes it.
    fn release(&self) -> PyResult<()> {
        self.take().map(drop)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let held = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if held {
            if kind.is_none() {
                self.complete(py)?;
            } else {
                self.release()?;
            }
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("Begun(name={:?}, resumed={})", self.name, self.resumed)
    }
}
