//! `cowlink.PreallocWriter`: a new file written through a binary
//! file-like object, with its size announced up front (the space is
//! reserved, so ENOSPC comes at once, not half-way). The file appears
//! under its name only on a clean `close()` or a `with` block left without
//! an exception; otherwise nothing is left.

use std::io::Write;
use std::path::PathBuf;

use cowlink::{Overwrite, PreallocOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::errors::to_py;
use crate::ops::choose;
use crate::path::FsPath;

/// A new file at `path` of about `size` bytes, written with `write()`.
#[pyclass(module = "cowlink", unsendable)]
pub struct PreallocWriter {
    inner: Option<cowlink::PreallocWriter>,
    path: PathBuf,
}

impl PreallocWriter {
    fn open(&mut self) -> PyResult<&mut cowlink::PreallocWriter> {
        self.inner
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("I/O operation on closed file."))
    }
}

#[pymethods]
impl PreallocWriter {
    #[new]
    #[pyo3(signature = (path, size, *, mode=0o666, overwrite="refuse", fsync=false))]
    fn new(
        py: Python<'_>,
        path: FsPath,
        size: u64,
        mode: u32,
        overwrite: &str,
        fsync: bool,
    ) -> PyResult<Self> {
        let path = path.0;
        let options = PreallocOptions {
            fsync,
            mode,
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
            inner: Some(inner),
            path,
        })
    }

    /// Write bytes-like `data`; returns the number of bytes written.
    fn write(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let owned;
        let bytes: &[u8] = if let Ok(b) = data.cast::<PyBytes>() {
            b.as_bytes()
        } else if let Ok(b) = data.cast::<PyByteArray>() {
            owned = b.to_vec();
            &owned
        } else {
            // memoryview, array, … : whatever bytes() accepts.
            owned = py
                .get_type::<PyBytes>()
                .call1((data,))?
                .cast_into::<PyBytes>()?
                .as_bytes()
                .to_vec();
            &owned
        };
        let path = self.path.clone();
        let w = self.open()?;
        w.write_all(bytes).map_err(|e| {
            to_py(
                py,
                &cowlink::Error::from_io(cowlink::Operation::Write, &e).with_dst(&path),
            )
        })?;
        Ok(bytes.len())
    }

    /// Complete the file and give it its name. Idempotent.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(w) = self.inner.take() {
            py.detach(|| w.finish()).map_err(|e| to_py(py, &e))?;
        }
        Ok(())
    }

    /// Drop the file: nothing is left under its name. Idempotent.
    fn discard(&mut self) {
        if let Some(w) = self.inner.take() {
            w.cancel();
        }
    }

    /// Whether the file was closed or discarded.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    /// The destination path.
    #[getter]
    fn name(&self) -> PathBuf {
        self.path.clone()
    }

    /// Bytes written so far.
    fn tell(&mut self) -> PyResult<u64> {
        Ok(self.open()?.written())
    }

    /// Whether the announced size was reserved on disk (fallocate worked).
    #[getter]
    fn preallocated(&mut self) -> PyResult<bool> {
        Ok(self.open()?.preallocated())
    }

    /// Nothing to do: data goes to the kernel on each write.
    fn flush(&mut self) -> PyResult<()> {
        self.open().map(|_| ())
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
        &mut self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            self.discard();
        } else {
            self.close(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "PreallocWriter({:?}, {})",
            self.path,
            if self.inner.is_some() {
                "open"
            } else {
                "closed"
            }
        )
    }
}
