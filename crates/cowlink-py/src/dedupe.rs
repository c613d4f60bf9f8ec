//! `cowlink.dedupe`: find identical files (`plan`), inspect or save the
//! plan as JSON, then share their blocks (`execute`); or both at once,
//! overlapped (`run`), as `cowlink dedupe` does; or keep doing it as files
//! change (`watch`, `cowlink dedupe --watch`). The options are the
//! command's: `exclude` (`--exclude`), `index` (`--index DIR`, or False
//! for `--no-index`), `recheck_layouts` (`--recheck-layouts` is "every"),
//! `stores` (`--store`).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use cowlink::dedupe::watch::{self as lib_watch, WatchOptions};
use cowlink::dedupe::{self as lib, DedupeOptions, Exclude, LayoutRecheck};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::control::{CancelToken, Control};
use crate::errors::to_py;
use crate::ops::choose;
use crate::path::FsPath;
use crate::records::{error_list, record, word};

/// The `index` argument: True (the command's default place), False (or
/// None: no index), or a directory.
#[derive(FromPyObject)]
pub enum IndexArg {
    /// True or False.
    Flag(bool),
    /// A directory for the indexes.
    Dir(FsPath),
}

/// Where the indexes go for `index`: as `cowlink dedupe` chooses, the
/// directory given, else `COWLINK_INDEX_DIR`, else the library's default
/// for this user (`/var/lib/cowlink/index` for root, else the XDG state
/// directory); `None` for no index.
fn index_dir(index: Option<IndexArg>) -> Option<PathBuf> {
    match index? {
        IndexArg::Flag(false) => None,
        IndexArg::Dir(d) => Some(d.0),
        IndexArg::Flag(true) => std::env::var_os("COWLINK_INDEX_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(lib::index::default_dir),
    }
}

/// The `recheck_layouts` argument: which files the index says share
/// every block (or hold none alone) are mapped again, "sample" (one in
/// sixteen, chosen afresh each run: the command's default), "every"
/// (`--recheck-layouts`) or "never" (the index's layouts trusted while
/// the identity holds).
fn recheck_of(given: &str) -> PyResult<LayoutRecheck> {
    choose(
        "recheck_layouts",
        given,
        &[
            ("sample", LayoutRecheck::Sample),
            ("every", LayoutRecheck::Every),
            ("never", LayoutRecheck::Never),
        ],
    )
}

/// The `exclude` patterns compiled; `ValueError` naming the first bad one.
fn exclude_of(patterns: &[String]) -> PyResult<Exclude> {
    Exclude::new(patterns).map_err(|e| PyValueError::new_err(e.to_string()))
}

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

    /// Files that share every block with another of the same content
    /// already (a reflinked copy, a file deduplicated before): nothing to
    /// do for them. The first of each set is not counted.
    #[getter]
    fn files_already_shared(&self) -> u64 {
        self.0.files_already_shared
    }

    /// Extra names of a file met more than once (hard links): counted once.
    #[getter]
    fn hardlinks_skipped(&self) -> u64 {
        self.0.hardlinks_skipped
    }

    /// Files whose data is inline in metadata (Btrfs): no blocks to share.
    #[getter]
    fn inline_skipped(&self) -> u64 {
        self.0.inline_skipped
    }

    /// Duplicates left alone because the caller may not change them
    /// (dedupe needs the owner, write permission or root).
    #[getter]
    fn not_permitted(&self) -> u64 {
        self.0.not_permitted
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

    /// What the persistent index did (None when the plan used none).
    #[getter]
    fn index(&self) -> Option<IndexReport> {
        self.0.index.as_ref().map(|r| IndexReport {
            files: r.files.clone(),
            unchanged: r.unchanged,
            unstated: r.unstated,
            verified: r.verified,
            written: r.written,
            pruned: r.pruned,
            corrected: r.corrected,
            notes: r.notes.clone(),
        })
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
    /// What the persistent index did in one plan (`Plan.index`).
    IndexReport {
        /// The index files used, one per filesystem.
        files: Vec<PathBuf>,
        /// Files whose identity (inode, size, mtime, ctime, birth time)
        /// matched their entry: nothing of them was read.
        unchanged: u64,
        /// Of `unchanged`, files known unchanged without even a stat: on
        /// Btrfs, as root, no transaction since their directory's record
        /// wrote their inode.
        unstated: u64,
        /// Index files whose every page was checked on opening (new ones
        /// included); the others were exactly as the last run left them,
        /// checked less than a day before.
        verified: u64,
        /// Entries written (files read this time, layouts after sharing).
        written: u64,
        /// Entries of files gone from the paths walked, removed.
        pruned: u64,
        /// Files whose indexed layout a fresh map found stale (blocks
        /// moved or unshared behind the index), each counted once.
        corrected: u64,
        /// What to know: an index rebuilt (damaged, another format),
        /// damaged entries dropped, an index in use by another run.
        notes: Vec<String>,
    }
);

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
        /// Files left alone because they changed since the plan, or no
        /// longer are the file it named (another file put at the path: a
        /// hard link, a copy; or the file's size, times, mode or links
        /// changed). Nothing is shared into or from them; a group whose
        /// source is listed was not carried out.
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
///
/// `exclude`: patterns of paths left alone, as `cowlink dedupe --exclude`
/// takes them (without a `/` a name at any depth, `*.tmp`, `.git`; with
/// one the path below the PATH given, `build/out`); an excluded directory
/// is not entered, an excluded file is never a source nor a target. A bad
/// pattern raises ValueError.
///
/// `index`: the persistent index (one per filesystem) that lets a rerun
/// skip the files unchanged since (same inode, size, mtime, ctime and
/// birth time); what is shared is still proven by the kernel's compare.
/// True (the default) keeps it where `cowlink dedupe` does
/// (`COWLINK_INDEX_DIR`, else `/var/lib/cowlink/index` for root, else the
/// XDG state directory), a path keeps it in that directory, False (or
/// None) uses none. `Plan.index` says what it did.
///
/// `recheck_layouts`: extents move without a file's identity moving (a
/// compressing Btrfs defragment, another tool's dedupe that keeps the
/// times), so a file the index says shares every block (or holds none
/// alone) is mapped again (one FIEMAP, nothing read): "sample" (the
/// default) one in sixteen, chosen afresh each run, so a moved layout is
/// found within a few runs; "every" all of them, as `cowlink dedupe
/// --recheck-layouts`; "never" trusts the index. Anything else raises
/// ValueError.
#[pyfunction]
#[pyo3(signature = (paths, *, min_size=1, stores=Vec::new(), exclude=Vec::new(), index=Some(IndexArg::Flag(true)), recheck_layouts="sample", threads=None, on_progress=None, cancel=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
pub fn plan(
    py: Python<'_>,
    paths: Vec<FsPath>,
    min_size: u64,
    stores: Vec<FsPath>,
    exclude: Vec<String>,
    index: Option<IndexArg>,
    recheck_layouts: &str,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<Plan> {
    let exclude = exclude_of(&exclude)?;
    let layout_recheck = recheck_of(recheck_layouts)?;
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let opts = DedupeOptions {
        min_size,
        run: control.run(),
        stores: stores.into_iter().map(|p| p.0).collect(),
        exclude,
        index: index_dir(index),
        layout_recheck,
        keep_groups: true,
    };
    control
        .drive(py, || lib::plan(&paths, &opts))?
        .map(Plan)
        .map_err(|e| to_py(py, &e))
}

/// Share blocks between the files of each group of `plan`, through the
/// kernel's FIDEDUPERANGE (which compares the bytes itself, so a file that
/// changed since the plan is never corrupted: it is reported in `changed`).
/// Each path must still name the file the plan found there (the plan
/// records its device, inode, size and times): a path that names another
/// file now, say a hard link to a store object with the same bytes, is
/// left alone and listed in `changed` too.
///
/// A target whose blocks would not come back is skipped (`skipped`), and
/// `bytes_reclaimed` is the space in use measured before and after.
/// `measure` is accepted for callers written when that was optional; it
/// changes nothing.
///
/// Nothing is written to the index that `plan` used: the next indexed run
/// has the kernel compare these files again (nothing is reclaimed twice)
/// and learns their layouts then. `run` learns them as it shares.
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
/// `stores`, `exclude`, `index` and `recheck_layouts` as in `plan`,
/// `measure` as in
/// `execute`.
#[pyfunction]
#[pyo3(signature = (paths, *, min_size=1, stores=Vec::new(), exclude=Vec::new(), index=Some(IndexArg::Flag(true)), recheck_layouts="sample", measure=true, threads=None, on_progress=None, cancel=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
pub fn run(
    py: Python<'_>,
    paths: Vec<FsPath>,
    min_size: u64,
    stores: Vec<FsPath>,
    exclude: Vec<String>,
    index: Option<IndexArg>,
    recheck_layouts: &str,
    measure: bool,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<(Plan, DedupeReport)> {
    let exclude = exclude_of(&exclude)?;
    let layout_recheck = recheck_of(recheck_layouts)?;
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let _always_measured = measure;
    let opts = DedupeOptions {
        min_size,
        run: control.run(),
        stores: stores.into_iter().map(|p| p.0).collect(),
        exclude,
        index: index_dir(index),
        layout_recheck,
        keep_groups: true,
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

record!(
    /// One watched path and what watches it (`watch`'s `on_start`).
    WatchScope {
        /// The path, resolved (absolute, no symbolic links).
        root: PathBuf,
        /// `"filesystem"` (every change on its filesystem), `"mount"` (a
        /// Btrfs subvolume, where the kernel refuses a filesystem-wide
        /// watch: files written through the mount that holds it) or
        /// `"directories"` (a subvolume mounted by itself: a mark on each
        /// directory, new ones marked as they appear).
        mark: String,
        /// Why it is not a filesystem-wide watch, when it is not.
        note: Option<String>,
    }
);

record!(
    /// One batch of `watch`: a dedupe of the paths after a change.
    WatchBatch {
        /// Changed paths the batch was for (0 for a rescan).
        changed: u64,
        /// Why it rescanned every path, when it did: `"start"`,
        /// `"queue_overflow"`, `"pending_full"`, `"unreadable"` or
        /// `"mark_refused"`.
        rescan: Option<String>,
        /// The watched paths it covered.
        roots: Vec<PathBuf>,
        /// What the dedupe found (None if it could not run).
        plan: Option<Py<Plan>>,
        /// What it did (None if it could not run).
        report: Option<Py<DedupeReport>>,
        /// Why it could not run (an OSError), else None.
        error: Option<Py<PyAny>>,
        /// How long it took, in seconds.
        elapsed: f64,
    }
);

record!(
    /// What a whole `watch` did, when it stopped.
    WatchSummary {
        /// Batches run (rescans included).
        batches: u64,
        /// Of those, rescans of every path.
        rescans: u64,
        /// Files made to share blocks.
        targets_deduped: u64,
        /// Bytes given back (as each batch's report measured them).
        bytes_reclaimed: u64,
        /// Batches that could not run, and errors within batches.
        errors: u64,
    }
);

fn watch_batch(py: Python<'_>, b: &lib_watch::WatchBatch) -> PyResult<WatchBatch> {
    let (plan, report, error) = match &b.outcome {
        Ok((p, r)) => (
            Some(Py::new(py, Plan(p.clone()))?),
            Some(Py::new(py, self::report(py, r)?)?),
            None,
        ),
        Err(e) => (None, None, Some(crate::errors::exception(py, e)?.unbind())),
    };
    Ok(WatchBatch {
        changed: b.changed as u64,
        rescan: b.rescan.as_ref().map(word),
        roots: b.roots.clone(),
        plan,
        report,
        error,
        elapsed: b.elapsed.as_secs_f64(),
    })
}

/// Call `cb` with what `make` builds, taking the GIL (from the watch's
/// thread, while the caller's thread waits with it released). The first
/// exception, from either, is kept in `raised` and cancels `run`, which
/// stops the watch; later calls do nothing.
fn call_back(
    cb: &Py<PyAny>,
    raised: &Mutex<Option<PyErr>>,
    run: &cowlink::Run,
    make: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
) {
    let mut kept = raised.lock().unwrap_or_else(|p| p.into_inner());
    if kept.is_some() {
        return;
    }
    if let Err(e) = Python::attach(|py| cb.call1(py, (make(py)?,)).map(drop)) {
        *kept = Some(e);
        run.cancel.cancel();
    }
}

/// Seconds as a Duration: finite, from 0 to a day (as the command's
/// `--quiet-period`); `ValueError` naming the argument otherwise.
fn seconds(name: &str, v: f64) -> PyResult<Duration> {
    if !v.is_finite() || !(0.0..=86_400.0).contains(&v) {
        return Err(PyValueError::new_err(format!(
            "{name} must be between 0 and 86400 seconds, not {v}"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Keep `paths` deduplicated, as `cowlink dedupe --watch` does (root: the
/// kernel's filesystem-wide watch, fanotify, needs CAP_SYS_ADMIN): first
/// a dedupe of everything there, then, after files are written (closed)
/// or moved in, another one once no change came for `quiet_period`
/// seconds (or `max_delay` seconds after the first change while changes
/// keep coming). Past `max_pending` changed paths, or when the kernel
/// dropped events, the next batch rescans every path. With the index (on
/// by default, as in `plan`) a batch reads only new and changed files.
///
/// It runs until stopped: `cancel.cancel()` (from another thread, or from
/// `on_batch`) ends it after the group in progress and returns the
/// `WatchSummary`; Ctrl-C does the same and then raises
/// KeyboardInterrupt, as every long call. `on_start(scopes)` is called
/// once the watch is set, with a `WatchScope` per path; `on_batch(batch)`
/// after each batch, with a `WatchBatch`. An exception from either stops
/// the watch and is raised once it has stopped. Changes made by this
/// process itself (its callbacks included) are not seen: the watch drops
/// them, so its own dedupe does not wake it again.
///
/// `min_size`, `stores`, `exclude`, `index` and `recheck_layouts` as in
/// `plan`. Raises
/// PermissionError without the privilege, and OSError when a path cannot
/// be watched.
#[pyfunction]
#[pyo3(signature = (paths, *, min_size=1, stores=Vec::new(), exclude=Vec::new(), index=Some(IndexArg::Flag(true)), recheck_layouts="sample", quiet_period=3.0, max_delay=60.0, max_pending=16384, threads=None, cancel=None, on_start=None, on_batch=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
pub fn watch(
    py: Python<'_>,
    paths: Vec<FsPath>,
    min_size: u64,
    stores: Vec<FsPath>,
    exclude: Vec<String>,
    index: Option<IndexArg>,
    recheck_layouts: &str,
    quiet_period: f64,
    max_delay: f64,
    max_pending: usize,
    threads: Option<usize>,
    cancel: Option<Bound<'_, CancelToken>>,
    on_start: Option<Bound<'_, PyAny>>,
    on_batch: Option<Bound<'_, PyAny>>,
) -> PyResult<WatchSummary> {
    let exclude = exclude_of(&exclude)?;
    let layout_recheck = recheck_of(recheck_layouts)?;
    let quiet_period = seconds("quiet_period", quiet_period)?;
    let max_delay = seconds("max_delay", max_delay)?;
    for (name, cb) in [("on_start", &on_start), ("on_batch", &on_batch)] {
        if let Some(cb) = cb.as_ref().filter(|cb| !cb.is_callable()) {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "{name} must be callable, not {}",
                cb.get_type().name()?
            )));
        }
    }
    let control = Control::new(threads, None, cancel.as_ref().map(Bound::get))?;
    let run = control.run();
    let opts = WatchOptions {
        dedupe: DedupeOptions {
            min_size,
            run: run.clone(),
            stores: stores.into_iter().map(|p| p.0).collect(),
            exclude,
            index: index_dir(index),
            layout_recheck,
            // A batch reports counts only.
            keep_groups: false,
        },
        quiet_period,
        max_delay,
        max_pending,
    };
    let on_start: Option<Py<PyAny>> = on_start.map(Bound::unbind);
    let on_batch: Option<Py<PyAny>> = on_batch.map(Bound::unbind);
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let result = control.drive(py, || {
        let mut started = |scopes: &[lib_watch::WatchScope]| {
            let Some(cb) = &on_start else { return };
            call_back(cb, &raised, &run, |py| {
                let list: Vec<WatchScope> = scopes
                    .iter()
                    .map(|s| WatchScope {
                        root: s.root.clone(),
                        mark: word(&s.mark),
                        note: s.note.clone(),
                    })
                    .collect();
                Ok(pyo3::types::PyList::new(py, list)?.into_any().unbind())
            });
        };
        let mut batch = |b: &lib_watch::WatchBatch| {
            let Some(cb) = &on_batch else { return };
            call_back(cb, &raised, &run, |py| {
                Ok(Py::new(py, watch_batch(py, b)?)?.into_any())
            });
        };
        lib_watch::run(&paths, &opts, &mut started, &mut batch)
    })?;
    if let Some(e) = raised.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let sum = result.map_err(|e| to_py(py, &e))?;
    Ok(WatchSummary {
        batches: sum.batches,
        rescans: sum.rescans,
        targets_deduped: sum.targets_deduped,
        bytes_reclaimed: sum.bytes_reclaimed,
        errors: sum.errors,
    })
}
