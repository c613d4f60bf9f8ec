//! cowlink errors as Python exceptions.
//!
//! Every library error becomes an `OSError`: the kinds Python has a class
//! for become that class (built from the errno, so `FileNotFoundError`,
//! `PermissionError`, `FileExistsError`, `IsADirectoryError`, …), and
//! cowlink's own kinds become subclasses of `OSError` declared here. The
//! text is the library's reason, `errno` is the kernel's (or the kind's, see
//! [`errno_for`]: never None), `filename` and `filename2` are the source and destination (as
//! `str`, with surrogate escapes for names that are not UTF-8, as `os`
//! gives them), `message` is the library's whole sentence and `kind` its
//! kind word (`"not_found"`, `"cross_device"`, …).

use cowlink::{Error, ErrorKind};
use pyo3::create_exception;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use rustix::io::Errno;

create_exception!(
    cowlink,
    NotSupportedError,
    PyOSError,
    "The filesystem cannot do this (no reflink, no dedupe, no FIEMAP)."
);
create_exception!(
    cowlink,
    CrossDeviceError,
    PyOSError,
    "Source and destination are on different filesystems."
);
create_exception!(
    cowlink,
    UnalignedError,
    PyOSError,
    "A range offset or length is not a multiple of the filesystem block size."
);
create_exception!(
    cowlink,
    LinkLimitError,
    PyOSError,
    "Too many links or references to one inode or block."
);
create_exception!(
    cowlink,
    ContentChangedError,
    PyOSError,
    "The data changed between two steps that needed it unchanged."
);
create_exception!(
    cowlink,
    SameFileError,
    PyOSError,
    "Source and destination are the same file."
);
create_exception!(
    cowlink,
    NotRegularFileError,
    PyOSError,
    "The source is a FIFO, socket or device, which cannot be cloned."
);
create_exception!(
    cowlink,
    CorruptError,
    PyOSError,
    "Stored data or an image is damaged or was tampered with."
);
create_exception!(
    cowlink,
    InUseError,
    PyOSError,
    "Another program holds the file (its byte-range locks)."
);
create_exception!(
    cowlink,
    CancelledError,
    PyOSError,
    "The operation was cancelled through a CancelToken."
);
create_exception!(
    cowlink,
    TreeError,
    PyOSError,
    "Some entries of a tree copy failed; `errors` lists them (as OSError) and `report` has the totals."
);

/// The kind's word, as the library serializes it (`"not_found"`).
fn kind_word(kind: ErrorKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{kind:?}"))
}

/// The Python exception for a library error.
pub fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    match exception(py, e) {
        Ok(v) => PyErr::from_value(v),
        Err(fail) => fail,
    }
}

/// The errno an error of `kind` reports when the kernel gave none: the
/// kind's usual one, and for the kinds no errno names the nearest the
/// kernel itself uses (the rule: every exception has an errno, so
/// `e.errno` is never None).
pub fn errno_for(kind: ErrorKind) -> i32 {
    let errno = kind.usual_errno().unwrap_or(match kind {
        // What FICLONE and copy_file_range answer for both.
        ErrorKind::SameFile | ErrorKind::NotRegularFile => Errno::INVAL,
        // Try again: the content settles, or the caller retries.
        ErrorKind::ContentChanged => Errno::AGAIN,
        // EFSCORRUPTED, as the kernel's filesystems report damage.
        ErrorKind::Corrupt => Errno::UCLEAN,
        _ => Errno::IO,
    });
    errno.raw_os_error()
}

/// The exception object for `e` (see the module notes).
pub fn exception<'py>(py: Python<'py>, e: &Error) -> PyResult<Bound<'py, PyAny>> {
    let kind = e.kind();
    let class = match kind {
        ErrorKind::NotSupported => py.get_type::<NotSupportedError>(),
        ErrorKind::CrossDevice => py.get_type::<CrossDeviceError>(),
        ErrorKind::Unaligned => py.get_type::<UnalignedError>(),
        ErrorKind::LinkLimit => py.get_type::<LinkLimitError>(),
        ErrorKind::ContentChanged => py.get_type::<ContentChangedError>(),
        ErrorKind::SameFile => py.get_type::<SameFileError>(),
        ErrorKind::NotRegularFile => py.get_type::<NotRegularFileError>(),
        ErrorKind::Corrupt => py.get_type::<CorruptError>(),
        ErrorKind::InUse => py.get_type::<InUseError>(),
        ErrorKind::Cancelled => py.get_type::<CancelledError>(),
        // OSError(errno, text) picks the built-in subclass for the errno.
        _ => py.get_type::<PyOSError>(),
    };
    let errno = e.raw_os_error().unwrap_or_else(|| errno_for(kind));
    // As Python's own: strerror is the reason, and str() adds the names
    // from filename and filename2 ("[Errno 2] source does not exist:
    // 'a' -> 'b'"); `message` is the library's whole sentence.
    let value = class.call1((errno, e.reason()))?;
    let mut names = [e.src(), e.dst()].into_iter().flatten();
    if let Some(first) = names.next() {
        value.setattr("filename", first.as_os_str())?;
    }
    if let Some(second) = names.next() {
        value.setattr("filename2", second.as_os_str())?;
    }
    value.setattr("message", e.to_string())?;
    value.setattr("kind", kind_word(kind))?;
    Ok(value)
}

/// Register the exception classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NotSupportedError", py.get_type::<NotSupportedError>())?;
    m.add("CrossDeviceError", py.get_type::<CrossDeviceError>())?;
    m.add("UnalignedError", py.get_type::<UnalignedError>())?;
    m.add("LinkLimitError", py.get_type::<LinkLimitError>())?;
    m.add("ContentChangedError", py.get_type::<ContentChangedError>())?;
    m.add("SameFileError", py.get_type::<SameFileError>())?;
    m.add("NotRegularFileError", py.get_type::<NotRegularFileError>())?;
    m.add("CorruptError", py.get_type::<CorruptError>())?;
    m.add("InUseError", py.get_type::<InUseError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    m.add("TreeError", py.get_type::<TreeError>())?;
    Ok(())
}

/// The `TreeError` a call raises after it went on past failed entries: an
/// OSError as the entries' are (the first failure's errno; `filename` and
/// `filename2` the call's paths), with every failure in `errors`, the
/// call's result in `report`, and `kind` naming the operation. `what` is
/// the sentence's subject ("the entries could not be copied").
pub fn tree_failures<R: pyo3::PyClass + Into<pyo3::PyClassInitializer<R>>>(
    py: Python<'_>,
    failed: &[Error],
    what: &str,
    kind: &str,
    filename: Option<&std::path::Path>,
    filename2: Option<&std::path::Path>,
    report: R,
) -> PyResult<PyErr> {
    let first = &failed[0];
    let errno = first
        .raw_os_error()
        .unwrap_or_else(|| errno_for(first.kind()));
    let err = TreeError::new_err((
        errno,
        format!("{} of {what}; the first: {first}", failed.len()),
    ));
    let value = err.value(py);
    if let Some(f) = filename {
        value.setattr("filename", f.as_os_str())?;
    }
    if let Some(f) = filename2 {
        value.setattr("filename2", f.as_os_str())?;
    }
    value.setattr("message", value.getattr("strerror")?)?;
    value.setattr("kind", kind)?;
    value.setattr("errors", crate::records::error_list(py, failed)?)?;
    value.setattr("report", Py::new(py, report)?)?;
    Ok(err)
}
