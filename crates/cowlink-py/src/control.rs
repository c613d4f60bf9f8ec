//! Running a long operation from Python: the work runs on a helper thread
//! with the GIL released, while the calling thread wakes at a bounded rate
//! to run Python's signal handlers (so Ctrl-C raises `KeyboardInterrupt`)
//! and the caller's `on_progress`. An exception from either cancels the
//! operation through the library's [`cowlink::CancelToken`]; the library
//! then finishes or removes what it was writing, and the exception
//! propagates once it has returned.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cowlink::{Phase, Progress as LibProgress, Run};
use pyo3::prelude::*;

/// How often the calling thread wakes while an operation runs.
const TICK: Duration = Duration::from_millis(100);

/// A cancellation token: pass it as `cancel=` and call `cancel()` from any
/// thread to stop the operation (it stops cleanly, as after Ctrl-C).
#[pyclass(module = "cowlink", frozen)]
#[derive(Default)]
pub struct CancelToken(pub cowlink::CancelToken);

#[pymethods]
impl CancelToken {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Ask every operation holding this token to stop.
    fn cancel(&self) {
        self.0.cancel();
    }

    /// Whether `cancel()` was called.
    #[getter]
    fn cancelled(&self) -> bool {
        self.0.is_cancelled()
    }

    fn __repr__(&self) -> String {
        format!("CancelToken(cancelled={})", self.cancelled())
    }
}

/// Where a running operation stands, as handed to `on_progress`.
#[pyclass(module = "cowlink", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct Progress {
    /// "scan", "hash", "copy", "dedupe", "verify", "upload", "download" or
    /// "done".
    pub phase: &'static str,
    /// Files (or entries) done in this phase.
    pub files_done: u64,
    /// Files expected in this phase (0: not known).
    pub files_total: u64,
    /// Bytes done in this phase.
    pub bytes_done: u64,
    /// Bytes expected in this phase (0: not known).
    pub bytes_total: u64,
}

#[pymethods]
impl Progress {
    fn __repr__(&self) -> String {
        format!(
            "Progress(phase={:?}, files_done={}, files_total={}, bytes_done={}, bytes_total={})",
            self.phase, self.files_done, self.files_total, self.bytes_done, self.bytes_total
        )
    }
}

fn phase_word(p: Phase) -> &'static str {
    match p {
        Phase::Scan => "scan",
        Phase::Hash => "hash",
        Phase::Copy => "copy",
        Phase::Dedupe => "dedupe",
        Phase::Verify => "verify",
        Phase::Upload => "upload",
        Phase::Download => "download",
        _ => "done",
    }
}

/// The run-control arguments every long operation takes.
pub struct Control<'py> {
    run: Run,
    on_progress: Option<Bound<'py, PyAny>>,
}

impl<'py> Control<'py> {
    /// From the `threads`, `on_progress` and `cancel` arguments;
    /// `TypeError` when `on_progress` is not callable (before any work).
    pub fn new(
        threads: Option<usize>,
        on_progress: Option<Bound<'py, PyAny>>,
        cancel: Option<&CancelToken>,
    ) -> PyResult<Self> {
        if let Some(cb) = &on_progress {
            if !cb.is_callable() {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "on_progress must be callable, not {}",
                    cb.get_type().name()?
                )));
            }
        }
        let mut run = Run::default().with_threads(threads.unwrap_or(0));
        if let Some(c) = cancel {
            run = run.with_cancel(c.0.clone());
        }
        if on_progress.is_some() {
            run = run.with_progress(Arc::new(LibProgress::new()));
        }
        Ok(Control { run, on_progress })
    }

    /// The library's run control to hand to the operation.
    pub fn run(&self) -> Run {
        self.run.clone()
    }

    fn report(&self) -> PyResult<()> {
        let (Some(cb), Some(p)) = (&self.on_progress, &self.run.progress) else {
            return Ok(());
        };
        let s = p.snapshot();
        cb.call1((Progress {
            phase: phase_word(s.phase),
            files_done: s.files_done,
            files_total: s.files_total,
            bytes_done: s.bytes_done,
            bytes_total: s.bytes_total,
        },))?;
        Ok(())
    }

    /// Run `work` on a helper thread with the GIL released; see the module
    /// notes. Returns the work's value, or the first exception raised by a
    /// signal handler or `on_progress` (after the work has stopped).
    pub fn drive<T: Send>(&self, py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&done);
        std::thread::scope(|s| {
            let worker = s.spawn(move || {
                // Tell the waiter even if the work panics.
                struct Finish(Arc<(Mutex<bool>, Condvar)>);
                impl Drop for Finish {
                    fn drop(&mut self) {
                        *self.0 .0.lock().unwrap_or_else(|p| p.into_inner()) = true;
                        self.0 .1.notify_all();
                    }
                }
                let _finish = Finish(flag);
                work()
            });
            let mut raised: Option<PyErr> = None;
            loop {
                let finished = py.detach(|| {
                    let (lock, cv) = &*done;
                    let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                    let (guard, _) = cv
                        .wait_timeout_while(guard, TICK, |d| !*d)
                        .unwrap_or_else(|p| p.into_inner());
                    *guard
                });
                if finished {
                    break;
                }
                if raised.is_none() {
                    if let Err(e) = py.check_signals().and_then(|()| self.report()) {
                        self.run.cancel.cancel();
                        raised = Some(e);
                    }
                }
            }
            let value = match worker.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            if raised.is_none() {
                // A last report, so the caller sees the final counts.
                if let Err(e) = self.report() {
                    raised = Some(e);
                }
            }
            match raised {
                Some(e) => Err(e),
                None => Ok(value),
            }
        })
    }
}
