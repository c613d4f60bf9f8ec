//! `cowlink.PreallocWriter`: a new file written through a binary
//! file-like object, with its size announced up front (the space is
//! reserved, so ENOSPC comes at once, not half-way). The file appears
//! under its name only on a clean `close()` or a `with` block left without
//! an exception; otherwise nothing is left.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use cowlink::{Overwrite, PreallocOptions};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyMemoryView};

use crate::errors::to_py;
use crate::ops::choose;
use crate::path::FsPath;

/// A new file at `path` of about `size` bytes, written with `write()`.
///
/// Usable from any thread: the class is frozen and the open file sits
/// behind a mutex that every method takes with the GIL released, so
/// writes from several threads are applied one after the other and a
/// `close()` in one thread makes the next `write()` in another raise
/// `ValueError` as a closed file does.
#[pyclass(module = "cowlink", frozen)]
pub struct PreallocWriter {
    inner: Mutex<Option<cowlink::PreallocWriter>>,
    path: PathBuf,
}

/// The permission bits a new file may be given.
const MAX_MODE: i64 = 0o7777;

/// `mode` as permission bits: an int in 0..=0o7777, else ValueError naming
/// it (TypeError for what is not an int, as `os.open`).
fn mode_bits(mode: &Bound<'_, PyAny>) -> PyResult<u32> {
    if !mode.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "mode must be an int, not {}",
            mode.get_type().name()?
        )));
    }
    match mode.extract::<i64>() {
        Ok(m) if (0..=MAX_MODE).contains(&m) => Ok(m as u32),
        _ => Err(PyValueError::new_err(format!(
            "mode {} is out of range (0o0..0o7777)",
            oct(mode)?
        ))),
    }
}

/// `size` as a byte count: an int a file can have (0..2**63, off_t), else
/// ValueError naming it (TypeError for what is not an int).
fn size_bytes(size: &Bound<'_, PyAny>) -> PyResult<u64> {
    if !size.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "size must be an int, not {}",
            size.get_type().name()?
        )));
    }
    match size.extract::<i64>() {
        Ok(n) if n >= 0 => Ok(n as u64),
        _ => Err(PyValueError::new_err(format!(
            "size {size} is out of range (0..2**63)"
        ))),
    }
}

fn oct(n: &Bound<'_, PyAny>) -> PyResult<String> {
    let builtins = PyModule::import(n.py(), "builtins")?;
    builtins.getattr("oct")?.call1((n,))?.extract()
}

/// The bytes of a bytes-like object (anything with the buffer protocol),
/// as `io`'s `write` takes; `TypeError` for the rest (an int, a str, a
/// list, a range), which `bytes()` would have turned into bytes.
fn buffer_bytes<'py>(data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(b.clone());
    }
    let py = data.py();
    let view =
        py.get_type::<PyMemoryView>()
            .call1((data,))
            .map_err(|_| match data.get_type().name() {
                Ok(n) => {
                    PyTypeError::new_err(format!("a bytes-like object is required, not '{n}'"))
                }
                Err(e) => e,
            })?;
    Ok(view.call_method0("tobytes")?.cast_into::<PyBytes>()?)
}

impl PreallocWriter {
    /// Run `f` on the open file, holding its lock with the GIL released;
    /// `ValueError` when it was closed.
    fn with_open<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut cowlink::PreallocWriter) -> T + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            guard.as_mut().map(f)
        })
        .ok_or_else(|| PyValueError::new_err("I/O operation on closed file."))
    }

    /// Take the file out (it is closed from now on, in every thread).
    fn take(&self, py: Python<'_>) -> Option<cowlink::PreallocWriter> {
        py.detach(|| self.inner.lock().unwrap_or_else(|p| p.into_inner()).take())
    }
}

#[pymethods]
impl PreallocWriter {
    #[new]
    #[pyo3(signature = (path, size, *, mode=None, overwrite="refuse", fsync=false))]
    fn new(
        py: Python<'_>,
        path: FsPath,
        size: &Bound<'_, PyAny>,
        mode: Option<&Bound<'_, PyAny>>,
        overwrite: &str,
        fsync: bool,
    ) -> PyResult<Self> {
        let path = path.0;
        let size = size_bytes(size)?;
        let options = PreallocOptions {
            fsync,
            mode: mode.map_or(Ok(0o666), mode_bits)?,
            overwrite: choose(
                "overwrite",
                overwrite,
                &[
                    ("refuse", Overwrite::Refuse),
                    ("replace", Overwrite::Replace),
                ],
            )?,
        };
        let inner = py
            .detach(|| cowlink::PreallocWriter::with_options(&path, size, &options))
            .map_err(|e| to_py(py, &e))?;
        Ok(PreallocWriter {
            inner: Mutex::new(Some(inner)),
            path,
        })
    }

    /// Write bytes-like `data` (bytes, bytearray, memoryview, array, …);
    /// returns the number of bytes written.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let data = buffer_bytes(data)?;
        let bytes = data.as_bytes();
        self.with_open(py, |w| w.write_all(bytes))?.map_err(|e| {
            to_py(
                py,
                &cowlink::Error::from_io(cowlink::Operation::Write, &e).with_dst(&self.path),
            )
        })?;
        Ok(bytes.len())
    }

    /// Complete the file and give it its name. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(w) = self.take(py) {
            py.detach(|| w.finish()).map_err(|e| to_py(py, &e))?;
        }
        Ok(())
    }

    /// Drop the file: nothing is left under its name. Idempotent.
    fn discard(&self, py: Python<'_>) {
        if let Some(w) = self.take(py) {
            py.detach(|| w.cancel());
        }
    }

    /// Whether the file was closed or discarded.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            self.inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none()
        })
    }

    /// The destination path.
    #[getter]
    fn name(&self) -> PathBuf {
        self.path.clone()
    }

    /// Bytes written so far.
    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_open(py, |w| w.written())
    }

    /// Whether the announced size was reserved on disk (fallocate worked).
    #[getter]
    fn preallocated(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_open(py, |w| w.preallocated())
    }

    /// Nothing to do: data goes to the kernel on each write.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with_open(py, |_| ())
    }

    fn writable(&self) -> bool {
        true
    }

    fn readable(&self) -> bool {
        false
    }

    fn seekable(&self) -> bool {
        false
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving the `with` block: complete the file, or discard it when an
    /// exception is on its way out.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            self.discard(py);
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    /// `PreallocWriter('/the/path', open)` (or `closed`).
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let path = self.path.as_path().into_pyobject(py)?;
        Ok(format!(
            "PreallocWriter({}, {})",
            path.str()?.repr()?,
            if self.closed(py) { "closed" } else { "open" }
        ))
    }
}
