//! The functions: clone_file, clone_range, copytree, extents, usage and the
//! probes. Each turns its arguments into the library's options, calls the
//! library with the GIL released, and turns the result into a record.

use std::sync::Mutex;

use cowlink::tree::{TreeEvent, TreeOptions};
use cowlink::{
    CloneOptions, Error, ErrorKind, LinkMode, Operation, Overwrite, Placement, Preserve,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::control::{CancelToken, Control};
use crate::errors::{to_py, TreeError};
use crate::path::FsPath;
use crate::records::{
    error_list, FileLayout, FsFacts, MountSupport, Outcome, Support, TreeReport, Usage,
};

/// One of `choices`, or a ValueError that lists them.
pub fn choose<T: Copy>(what: &str, given: &str, choices: &[(&str, T)]) -> PyResult<T> {
    choices
        .iter()
        .find(|(w, _)| *w == given)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<String> = choices.iter().map(|(w, _)| format!("{w:?}")).collect();
            PyValueError::new_err(format!(
                "{what} must be one of {}, not {given:?}",
                names.join(", ")
            ))
        })
}

/// The one link-mode argument, `link`: "clone" (or fail), "auto" (clone,
/// else copy), "copy" or "hardlink"; `None` is `default`. `reflink`, its
/// old spelling with `cp --reflink`'s words ("always", "auto", "never"),
/// still works for one release with a `DeprecationWarning`; both at once
/// is a `TypeError`.
pub fn link_arg(
    py: Python<'_>,
    link: Option<&str>,
    reflink: Option<&str>,
    default: LinkMode,
) -> PyResult<LinkMode> {
    match (link, reflink) {
        (Some(_), Some(_)) => Err(pyo3::exceptions::PyTypeError::new_err(
            "give link= only (reflink= is its deprecated spelling)",
        )),
        (Some(l), None) => choose(
            "link",
            l,
            &[
                ("clone", LinkMode::Clone),
                ("auto", LinkMode::Auto),
                ("copy", LinkMode::Copy),
                ("hardlink", LinkMode::Hardlink),
            ],
        ),
        (None, Some(r)) => {
            let mode = choose(
                "reflink",
                r,
                &[
                    ("auto", LinkMode::Auto),
                    ("always", LinkMode::Clone),
                    ("never", LinkMode::Copy),
                ],
            )?;
            let new = match mode {
                LinkMode::Clone => "clone",
                LinkMode::Copy => "copy",
                _ => "auto",
            };
            let msg = format!("reflink={r:?} is deprecated; use link={new:?}");
            let msg = std::ffi::CString::new(msg).expect("no NUL in the message");
            PyErr::warn(
                py,
                &py.get_type::<pyo3::exceptions::PyDeprecationWarning>(),
                &msg,
                1,
            )?;
            Ok(mode)
        }
        (None, None) => Ok(default),
    }
}

fn overwrite(given: &str) -> PyResult<Overwrite> {
    choose(
        "overwrite",
        given,
        &[
            ("refuse", Overwrite::Refuse),
            ("replace", Overwrite::Replace),
            ("skip", Overwrite::Skip),
        ],
    )
}

/// `preserve`: None (permission bits only, as cp), "all", or names among
/// "mode", "ownership", "timestamps", "xattrs".
fn preserve(given: Option<&Bound<'_, PyAny>>) -> PyResult<Preserve> {
    let Some(given) = given else {
        return Ok(Preserve::NONE);
    };
    if let Ok(s) = given.cast::<PyString>() {
        let s: String = s.extract()?;
        let s = s.as_str();
        if s == "all" {
            return Ok(Preserve::ALL);
        }
        return preserve_names(&[s.to_owned()]);
    }
    let bad = || {
        PyTypeError::new_err(
            "preserve must be None, \"all\" or an iterable of \"mode\", \"ownership\", \"timestamps\", \"xattrs\"",
        )
    };
    let mut names = Vec::new();
    for item in given.try_iter().map_err(|_| bad())? {
        names.push(item?.extract::<String>().map_err(|_| bad())?);
    }
    preserve_names(&names)
}

fn preserve_names(names: &[String]) -> PyResult<Preserve> {
    let mut p = Preserve::NONE;
    for n in names {
        match n.as_str() {
            "mode" => p.mode = true,
            "ownership" => p.ownership = true,
            "timestamps" => p.timestamps = true,
            "xattrs" => p.xattrs = true,
            other => {
                return Err(PyValueError::new_err(format!(
                    "preserve: unknown attribute {other:?} (known: \"mode\", \"ownership\", \"timestamps\", \"xattrs\", or \"all\")"
                )))
            }
        }
    }
    Ok(p)
}

/// Clone `src` to the new file `dst`, or copy it where cloning cannot work
/// and `link` allows; returns how (`Outcome.method`) and how many bytes.
///
/// `link`: "auto" (the default: clone, else copy), "clone" (clone or
/// fail), "copy", or "hardlink" (another name for the source's inode:
/// writing to one changes the other). `reflink` ("always", "auto",
/// "never") is its deprecated spelling.
///
/// After an error there is nothing at `dst` (or the old `dst` is
/// untouched). With `atomic` (the default) the file appears under `dst`
/// only when complete, even if the process is killed or the machine
/// crashes. `atomic=False` creates it under `dst` at once (never over an
/// existing file) with the sticky bit as the mark of an unfinished copy,
/// cleared when done: cheaper per file, and only a kill or crash can leave
/// a partial, marked file. Replacing an existing file is atomic either way.
#[pyfunction]
#[pyo3(signature = (src, dst, *, link=None, overwrite="refuse", preserve=None, atomic=true, reflink=None))]
#[allow(clippy::too_many_arguments)]
pub fn clone_file(
    py: Python<'_>,
    src: FsPath,
    dst: FsPath,
    link: Option<&str>,
    overwrite: &str,
    preserve: Option<&Bound<'_, PyAny>>,
    atomic: bool,
    reflink: Option<&str>,
) -> PyResult<Outcome> {
    let options = CloneOptions {
        link: link_arg(py, link, reflink, LinkMode::Auto)?,
        overwrite: self::overwrite(overwrite)?,
        preserve: self::preserve(preserve)?,
        placement: if atomic {
            Placement::Atomic
        } else {
            Placement::Direct
        },
        ..CloneOptions::default()
    };
    py.detach(|| cowlink::clone_file(&src, &dst, &options))
        .map(Outcome::from)
        .map_err(|e| to_py(py, &e))
}

/// Clone `length` bytes of `src` at `src_offset` into the existing file
/// `dst` at `dst_offset` (both aligned to the block size, except a range
/// that ends at the end of `src`). Never copies.
#[pyfunction]
#[pyo3(signature = (src, dst, *, src_offset=0, dst_offset=0, length))]
pub fn clone_range(
    py: Python<'_>,
    src: FsPath,
    dst: FsPath,
    src_offset: u64,
    dst_offset: u64,
    length: u64,
) -> PyResult<Outcome> {
    py.detach(|| cowlink::clone_range(&src, src_offset, &dst, dst_offset, length))
        .map(Outcome::from)
        .map_err(|e| to_py(py, &e))
}

/// Copy the directory tree `src` to `dst`, cloning every file that can be
/// cloned, on several threads. With `archive` (the default) it is `cp -a`:
/// modes, owners, times and extended attributes kept, hardlinks kept,
/// symbolic links copied as links. Without it, `cp -r`.
///
/// `dst` must not exist unless `dirs_exist_ok` (then files already there
/// are replaced, each atomically, as `shutil.copytree` does). Files in
/// directories the copy creates are created under their final name,
/// marked unfinished (the sticky bit) until complete; with `atomic` every
/// file appears complete or not at all even after a kill or crash. Failed entries do not stop
/// the copy; at the end they are raised together as `TreeError` (with
/// `errors` and `report`). Ctrl-C, or an exception from `on_progress`,
/// stops the copy cleanly (no partial file is left) and propagates.
///
/// `link` places each file as in `clone_file` ("auto" by default);
/// `reflink` is its deprecated spelling.
#[pyfunction]
#[pyo3(signature = (src, dst, *, archive=true, threads=None, dirs_exist_ok=false, link=None, atomic=false, on_progress=None, cancel=None, reflink=None))]
#[allow(clippy::too_many_arguments)]
pub fn copytree(
    py: Python<'_>,
    src: FsPath,
    dst: FsPath,
    archive: bool,
    threads: Option<usize>,
    dirs_exist_ok: bool,
    link: Option<&str>,
    atomic: bool,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
    reflink: Option<&str>,
) -> PyResult<TreeReport> {
    let mut options = if archive {
        TreeOptions::archive()
    } else {
        TreeOptions::default()
    };
    options.file.link = link_arg(py, link, reflink, LinkMode::Auto)?;
    options.atomic = atomic;
    if dirs_exist_ok {
        // As shutil.copytree: files already there are replaced.
        options.file.overwrite = Overwrite::Replace;
    }
    if !dirs_exist_ok && dst.symlink_metadata().is_ok() {
        let e = Error::new(Operation::CopyTree, ErrorKind::AlreadyExists)
            .with_src(&src)
            .with_dst(&dst)
            .with_reason("destination exists (pass dirs_exist_ok=True to merge into it)");
        return Err(to_py(py, &e));
    }
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    options.run = control.run();
    let failed: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    let observe = |ev: &TreeEvent<'_>| {
        if let TreeEvent::Failed(e) = ev {
            failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((*e).clone());
        }
    };
    let result = control.drive(py, || {
        cowlink::tree::copy_tree(&src, &dst, &options, &observe)
    })?;
    let report = result.map_err(|e| to_py(py, &e))?;
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    let report = TreeReport::from(&report);
    if failed.is_empty() {
        return Ok(report);
    }
    let first = &failed[0];
    // An OSError as the entries' are: the first failure's errno, and the
    // trees as filename and filename2.
    let errno = first
        .raw_os_error()
        .unwrap_or_else(|| crate::errors::errno_for(first.kind()));
    let err = TreeError::new_err((
        errno,
        format!(
            "{} of the entries could not be copied; the first: {first}",
            failed.len()
        ),
    ));
    let value = err.value(py);
    value.setattr("filename", src.0.as_os_str())?;
    value.setattr("filename2", dst.0.as_os_str())?;
    value.setattr("message", value.getattr("strerror")?)?;
    value.setattr("kind", "tree")?;
    value.setattr("errors", error_list(py, &failed)?)?;
    value.setattr("report", Py::new(py, report)?)?;
    Err(err)
}

/// How `path`'s file is laid out on disk (FIEMAP): extents, holes, and how
/// much is shared.
#[pyfunction]
pub fn extents(py: Python<'_>, path: FsPath) -> PyResult<FileLayout> {
    let layout = py
        .detach(|| cowlink::extents::extents(&path))
        .map_err(|e| to_py(py, &e))?;
    FileLayout::new(py, &layout)
}

/// True disk usage of the files under `paths`, each file counted once:
/// what is exclusive, what is shared inside the set and outside it. A long
/// walk: Ctrl-C, an exception from `on_progress` or `cancel` stop it
/// (`CancelledError` for `cancel`).
#[pyfunction]
#[pyo3(signature = (paths, *, threads=None, on_progress=None, cancel=None))]
pub fn usage(
    py: Python<'_>,
    paths: Vec<FsPath>,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<Usage> {
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let options = cowlink::usage::UsageOptions {
        run: control.run(),
        ..Default::default()
    };
    let mut report = control.drive(py, || cowlink::usage::usage_report(&paths, &options))?;
    if !report.errors.is_empty() {
        return Err(to_py(py, &report.errors.swap_remove(0)));
    }
    if report.cancelled {
        return Err(to_py(
            py,
            &Error::new(Operation::Usage, ErrorKind::Cancelled)
                .with_reason("usage cancelled before every file was mapped"),
        ));
    }
    Ok(Usage::from(&report.total))
}

/// What the filesystem holding `path` can do.
#[pyfunction]
pub fn probe_filesystem(py: Python<'_>, path: FsPath) -> PyResult<FsFacts> {
    let facts = py
        .detach(|| cowlink::probe::filesystem(&path))
        .map_err(|e| to_py(py, &e))?;
    FsFacts::new(py, &facts)
}

/// Whether a file at `src` can be cloned to `dst`, and why not.
#[pyfunction]
pub fn probe_between(py: Python<'_>, src: FsPath, dst: FsPath) -> PyResult<Support> {
    let s = py
        .detach(|| cowlink::probe::between(&src, &dst))
        .map_err(|e| to_py(py, &e))?;
    Ok(Support {
        src: Py::new(py, FsFacts::new(py, &s.src)?)?,
        dst: Py::new(py, FsFacts::new(py, &s.dst)?)?,
        same_filesystem: s.same_filesystem,
        reflink: Py::new(py, crate::records::Answer::from(&s.reflink))?,
    })
}

/// Every filesystem mounted at or under `root`, and what each can do.
#[pyfunction]
pub fn probe_tree(py: Python<'_>, root: FsPath) -> PyResult<Vec<MountSupport>> {
    let mounts = py
        .detach(|| cowlink::probe::tree(&root))
        .map_err(|e| to_py(py, &e))?;
    mounts
        .iter()
        .map(|m| {
            Ok(MountSupport {
                mount_point: m.mount_point.clone(),
                source: m.source.clone(),
                fstype: m.fstype.clone(),
                read_only: m.read_only,
                facts: Py::new(py, FsFacts::new(py, &m.facts)?)?,
            })
        })
        .collect()
}
