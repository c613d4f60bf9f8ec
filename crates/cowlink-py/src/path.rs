//! Paths from Python: `str`, `bytes` or any `os.PathLike`, as `os` takes
//! them. `str` names with surrogate escapes give back their original
//! bytes; `bytes` are taken as they are. A name with a NUL byte is a
//! `ValueError`, as in `os`.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

/// A path argument.
pub struct FsPath(pub PathBuf);

impl FromPyObject<'_, '_> for FsPath {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        static FSPATH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let py = ob.py();
        let name = FSPATH.import(py, "os", "fspath")?.call1((ob,))?;
        let bytes = if let Ok(b) = name.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            name.extract::<OsString>()?.into_vec()
        };
        // As `os` does: no call reaches the kernel with a name it would cut.
        if bytes.contains(&0) {
            return Err(PyValueError::new_err("embedded null byte"));
        }
        Ok(FsPath(PathBuf::from(OsString::from_vec(bytes))))
    }
}

impl std::ops::Deref for FsPath {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for FsPath {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}
