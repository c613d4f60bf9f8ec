//! `cowlink.dedupe`: find identical files (`plan`), inspect or save the
//! plan as JSON, then share their blocks (`execute`); or both at once,
//! overlapped (`run`), as `cowlink dedupe` does.

use std::path::PathBuf;

use cowlink::dedupe::{self as lib, DedupeOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::control::{CancelToken, Control};
use crate::errors::to_py;
use crate::path::FsPath;
use crate::records::{error_list, record};

record!(
    /// Files with identical content: `targets` will share `source`'s blocks.
    Group {
        /// Size of each file.
        size: u64,
        /// BLAKE3 of the whole content, hex; None for a group that `run`
        /// formed from the first and last 4 KiB (the kernel compared every
        /// byte when it deduplicated).
        blake3: Option<String>,
        /// The file whose blocks the others will share.
        source: PathBuf,
        /// The files to deduplicate against `source`.
        targets: Vec<PathBuf>,
        /// Files of the group that already share `source`'s blocks.
        already_shared: Vec<PathBuf>,
        /// Bytes that deduplicating would free.
        reclaimable: u64,
    }
);

/// What `execute` would do: groups of identical files and scan totals.
/// `to_json()` and `Plan.from_json()` keep it between runs (the same format
/// as the `plan` object of `cowlink dedupe --dry-run --json`).
#[pyclass(module = "cowlink", frozen)]
pub struct Plan(pub lib::DedupePlan);

#[pymethods]
impl Plan {
    /// The groups, largest first.
    #[getter]
    fn groups(&self) -> Vec<Group> {
        self.0
            .groups
            .iter()
            .map(|g| Group {
                size: g.size,
                blake3: g.blake3.clone(),
                source: g.source.clone(),
                targets: g.targets.clone(),
                already_shared: g.already_shared.clone(),
                reclaimable: g.reclaimable,
            })
            .collect()
    }

    /// Files looked at.
    #[getter]
    fn files_scanned(&self) -> u64 {
        self.0.files_scanned
    }

    /// Files whose size matched another's.
    #[getter]
    fn candidates(&self) -> u64 {
        self.0.candidates
    }

    /// Bytes read to compare contents.
    #[getter]
    fn bytes_hashed(&self) -> u64 {
        self.0.bytes_hashed
    }

    /// Files to deduplicate, over all groups.
    #[getter]
    fn targets(&self) -> u64 {
        self.0.targets()
    }

    /// Bytes deduplicating would free, over all groups.
    #[getter]
    fn reclaimable(&self) -> u64 {
        self.0.reclaimable()
    }

    /// Entries that could not be read while planning (as OSError).
    #[getter]
    fn errors(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        error_list(py, &self.0.errors)
    }

    /// The plan as JSON text.
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string_pretty(&self.0).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// A plan from JSON text made by `to_json()` (or the `plan` object of
    /// `cowlink dedupe --dry-run --json`).
    #[staticmethod]
    ///
    /// The text is untrusted: besides its form, every group's
    /// `reclaimable` must fit in what its targets hold (size × targets),
    /// so the totals cannot overflow.
    fn from_json(text: &str) -> PyResult<Plan> {
        let bad = |why: String| PyValueError::new_err(format!("not a cowlink dedupe plan: {why}"));
        let plan: lib::DedupePlan = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut total = 0u64;
        for (i, g) in plan.groups.iter().enumerate() {
            let most = g.size.checked_mul(g.targets.len() as u64);
            if most.is_none_or(|m| g.reclaimable > m) {
                return Err(bad(format!(
                    "group {i} claims {} reclaimable bytes from {} targets of {} bytes",
                    g.reclaimable,
                    g.targets.len(),
                    g.size
                )));
            }
            total = total
                .checked_add(g.reclaimable)
                .ok_or_else(|| bad("the groups' reclaimable bytes overflow".into()))?;
        }
        Ok(Plan(plan))
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(groups={}, targets={}, reclaimable={}, files_scanned={})",
            self.0.groups.len(),
            self.0.targets(),
            self.0.reclaimable(),
            self.0.files_scanned
        )
    }
}

record!(
    /// What `execute` did.
    DedupeReport {
        /// Groups processed.
        groups: u64,
        /// Files now sharing their group's blocks.
        targets_deduped: u64,
        /// Bytes the kernel compared.
        bytes_compared: u64,
        /// Space given back, measured: the fall of the space in use
        /// (statfs; on Btrfs data and metadata) from before to after, each
        /// after a sync, on the filesystems where something was shared.
        bytes_reclaimed: u64,
        /// Growth of the space in use instead (0 unless other programs
        /// wrote during the run, or a measured batch of targets grew it).
        bytes_grown: u64,
        /// The space in use on every filesystem involved could be read.
        measured: bool,
        /// Identical targets left as they were because sharing them would
        /// not give space back.
        skipped: Vec<Py<SkippedTarget>>,
        /// Files left alone because they changed since the plan.
        changed: Vec<PathBuf>,
        /// Targets of a group formed from the file edges alone (`blake3`
        /// None) that the kernel found different from their source; they
        /// were hashed whole and grouped again.
        regrouped: u64,
        /// Failures (as OSError); the other groups were still done.
        errors: Vec<Py<PyAny>>,
        /// Stopped early by a CancelToken.
        cancelled: bool,
    }
);

record!(
    /// A target identical to its source, left as it was because sharing it
    /// would not give space back.
    SkippedTarget {
        /// The target.
        path: PathBuf,
        /// `"held_elsewhere"` (a snapshot, reflinked copy or other file
        /// holds its blocks), `"usage_grew"` (a measured batch of such
        /// targets grew the space in use) or `"unmeasurable"`.
        reason: String,
        /// Why, in words.
        detail: String,
    }
);

/// Find files with identical content under `paths` (files of at least
/// `min_size` bytes); nothing is changed. Objects of the cowlink stores
/// in `stores` are sources only: files equal to one share its blocks.
/// `index`: a directory of persistent indexes (one per filesystem): files
/// unchanged since a run with the same index learnt them are not read
/// again.
#[pyfunction]
#[pyo3(signature = (paths, *, min_size=1, stores=Vec::new(), threads=None, on_progress=None, cancel=None, index=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
pub fn plan(
    py: Python<'_>,
    paths: Vec<FsPath>,
    min_size: u64,
    stores: Vec<FsPath>,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
    index: Option<PathBuf>,
) -> PyResult<Plan> {
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let opts = DedupeOptions {
        min_size,
        run: control.run(),
        stores: stores.into_iter().map(|p| p.0).collect(),
        index,
        ..DedupeOptions::default()
    };
    control
        .drive(py, || lib::plan(&paths, &opts))?
        .map(Plan)
        .map_err(|e| to_py(py, &e))
}

/// Share blocks between the files of each group of `plan`, through the
/// kernel's FIDEDUPERANGE (which compares the bytes itself, so a file that
/// changed since the plan is never corrupted: it is reported in `changed`).
///
/// A target whose blocks would not come back is skipped (`skipped`), and
/// `bytes_reclaimed` is the space in use measured before and after.
/// `measure` is accepted for callers written when that was optional; it
/// changes nothing.
#[pyfunction]
#[pyo3(signature = (plan, *, measure=true, threads=None, on_progress=None, cancel=None))]
pub fn execute(
    py: Python<'_>,
    plan: Bound<'_, Plan>,
    measure: bool,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<DedupeReport> {
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let _always_measured = measure;
    let opts = DedupeOptions {
        run: control.run(),
        ..DedupeOptions::default()
    };
    let plan = plan.get();
    let r = control.drive(py, || lib::execute(&plan.0, &opts))?;
    report(py, &r)
}

/// Plan and deduplicate in one call, the two overlapping as in `cowlink
/// dedupe`: the groups of small files are deduplicated while the larger
/// files are still being read. Larger files are grouped on their first
/// and last 4 KiB (their `blake3` is None) and the kernel compares every
/// byte before it shares. Returns the plan as carried out and what was
/// done. A cancel, even while planning, is reported in
/// `cancelled`; the plan then holds only the groups started by then.
/// `stores` and `index` as in `plan`, `measure` as in `execute`.
#[pyfunction]
#[pyo3(signature = (paths, *, min_size=1, stores=Vec::new(), measure=true, threads=None, on_progress=None, cancel=None, index=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
pub fn run(
    py: Python<'_>,
    paths: Vec<FsPath>,
    min_size: u64,
    stores: Vec<FsPath>,
    measure: bool,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
    index: Option<PathBuf>,
) -> PyResult<(Plan, DedupeReport)> {
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let _always_measured = measure;
    let opts = DedupeOptions {
        min_size,
        run: control.run(),
        stores: stores.into_iter().map(|p| p.0).collect(),
        index,
        ..DedupeOptions::default()
    };
    let (plan, r) = control
        .drive(py, || lib::dedupe(&paths, &opts))?
        .map_err(|e| to_py(py, &e))?;
    Ok((Plan(plan), report(py, &r)?))
}

fn report(py: Python<'_>, r: &lib::DedupeReport) -> PyResult<DedupeReport> {
    Ok(DedupeReport {
        groups: r.groups,
        targets_deduped: r.targets_deduped,
        bytes_compared: r.bytes_compared,
        bytes_reclaimed: r.bytes_reclaimed,
        bytes_grown: r.bytes_grown,
        measured: r.measured,
        skipped: r
            .skipped
            .iter()
            .map(|k| {
                Py::new(
                    py,
                    SkippedTarget {
                        path: k.path.clone(),
                        reason: match k.reason {
                            lib::SkipReason::HeldElsewhere => "held_elsewhere",
                            lib::SkipReason::UsageGrew => "usage_grew",
                            lib::SkipReason::Unmeasurable => "unmeasurable",
                        }
                        .to_string(),
                        detail: k.detail.clone(),
                    },
                )
            })
            .collect::<PyResult<_>>()?,
        changed: r.changed.clone(),
        regrouped: r.regrouped,
        errors: error_list(py, &r.errors)?,
        cancelled: r.cancelled,
    })
}
