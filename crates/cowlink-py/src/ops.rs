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
use crate::errors::to_py;
use crate::path::FsPath;
use crate::records::{FileLayout, FsFacts, MountSupport, Outcome, Support, TreeReport, Usage};

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
    Err(crate::errors::tree_failures(
        py,
        &failed,
        "the entries could not be copied",
        "tree",
        Some(&src.0),
        Some(&dst.0),
        report,
    )?)
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

/// `cp SRC... DST` with GNU cp's rules, from the library's cp (the same
/// code as the `cowlink cp` command): `src` is one path or a list;
/// `dst` is the new name, or the directory to copy into. The options are
/// cp's: `recursive` (-r), `archive` (-a), `dereference` ("always" -L,
/// "command-line" -H, "never" -P; default as cp), `backup` ("simple",
/// "numbered", "existing") with `suffix`, `force` (-f),
/// `remove_destination`, `update` ("all", "none" as -n, "none-fail",
/// "older" as -u), `interactive` (a callable given the question, e.g.
/// "overwrite 'b'? ", that returns whether to replace), `link` ("hard" -l,
/// "symbolic" -s), `copy_contents`, `attributes_only`, `parents`,
/// `sparse` ("auto", "always", "never"), `resume`, `preserve` (as
/// clone_file; `archive` means "all"), `default_mode` (--no-preserve=mode),
/// `target_directory` (-t: `dst` is a directory), `no_target_directory`
/// (-T). Returns the totals; a single failed operand raises its typed
/// error (FileExistsError, SameFileError, ...), several raise `TreeError`
/// with `errors` and `report`. An exception from `interactive` stops the
/// copy and propagates.
#[pyfunction]
#[pyo3(signature = (src, dst, *, recursive=false, archive=false, reflink="auto", preserve=None, default_mode=false, dereference=None, backup=None, suffix=None, force=false, remove_destination=false, update="all", interactive=None, link=None, copy_contents=false, attributes_only=false, parents=false, sparse="auto", resume=false, atomic=false, target_directory=false, no_target_directory=false, threads=None, on_progress=None, cancel=None))]
#[allow(clippy::too_many_arguments)]
pub fn copy(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    dst: FsPath,
    recursive: bool,
    archive: bool,
    reflink: &str,
    preserve: Option<&Bound<'_, PyAny>>,
    default_mode: bool,
    dereference: Option<&str>,
    backup: Option<&str>,
    suffix: Option<std::path::PathBuf>,
    force: bool,
    remove_destination: bool,
    update: &str,
    interactive: Option<Bound<'_, PyAny>>,
    link: Option<&str>,
    copy_contents: bool,
    attributes_only: bool,
    parents: bool,
    sparse: &str,
    resume: bool,
    atomic: bool,
    target_directory: bool,
    no_target_directory: bool,
    threads: Option<usize>,
    on_progress: Option<Bound<'_, PyAny>>,
    cancel: Option<Bound<'_, CancelToken>>,
) -> PyResult<TreeReport> {
    use cowlink::cp::{Backup, CpEvent, CpOptions, Deref, Sparse, Target, Update};
    use cowlink::tree::LinkKind;
    let sources: Vec<std::path::PathBuf> = match src.extract::<FsPath>() {
        Ok(p) => vec![p.0],
        Err(_) => {
            let mut v = Vec::new();
            for item in src
                .try_iter()
                .map_err(|_| PyTypeError::new_err("src must be a path or an iterable of paths"))?
            {
                v.push(item?.extract::<FsPath>()?.0);
            }
            v
        }
    };
    if let Some(cb) = &interactive {
        if !cb.is_callable() {
            return Err(PyTypeError::new_err("interactive must be callable"));
        }
    }
    let link = match link {
        None => None,
        Some(w) => Some(choose(
            "link",
            w,
            &[("hard", LinkKind::Hard), ("symbolic", LinkKind::Symbolic)],
        )?),
    };
    let recursive = recursive || archive;
    let mut preserve = self::preserve(preserve)?;
    if archive {
        preserve = Preserve::ALL;
    }
    let deref = match dereference {
        None => Deref::gnu_default(recursive || archive, link),
        Some(w) => choose(
            "dereference",
            w,
            &[
                ("always", Deref::Always),
                ("command-line", Deref::CommandLine),
                ("never", Deref::Never),
            ],
        )?,
    };
    let backup = match backup {
        None => None,
        Some(w) => Some(choose(
            "backup",
            w,
            &[
                ("simple", Backup::Simple),
                ("numbered", Backup::Numbered),
                ("existing", Backup::Existing),
            ],
        )?),
    };
    let update = choose(
        "update",
        update,
        &[
            ("all", Update::All),
            ("none", Update::None),
            ("none-fail", Update::NoneFail),
            ("older", Update::Older),
        ],
    )?;
    if backup.is_some() && update == Update::None {
        return Err(PyValueError::new_err(
            "backup and update=\"none\" are mutually exclusive",
        ));
    }
    let sparse = choose(
        "sparse",
        sparse,
        &[
            ("auto", Sparse::Auto),
            ("always", Sparse::Always),
            ("never", Sparse::Never),
        ],
    )?;
    let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
    let o = CpOptions {
        // GNU cp's own word for it (`--reflink=always|auto|never`), as
        // this call follows cp's flags.
        link_mode: choose(
            "reflink",
            reflink,
            &[
                ("auto", LinkMode::Auto),
                ("always", LinkMode::Clone),
                ("never", LinkMode::Copy),
            ],
        )?,
        preserve,
        default_mode,
        attributes_only,
        deref,
        backup,
        suffix: suffix.map(|s| s.into_os_string()).unwrap_or_default(),
        force,
        remove_destination,
        interactive: interactive.is_some(),
        update,
        link,
        copy_contents,
        preserve_links: archive,
        recursive,
        parents,
        sparse,
        resume,
        atomic,
        dry_run: false,
        posixly_correct: false,
        run: control.run(),
    };
    let target = Target {
        directory: target_directory,
        no_directory: no_target_directory,
        strip_trailing_slashes: false,
    };
    let failed: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    let observe = |ev: &CpEvent<'_>| {
        let e = match ev {
            CpEvent::Failed { error, .. } => (*error).clone(),
            CpEvent::Tree {
                event: TreeEvent::Failed(e),
                ..
            } => (*e).clone(),
            _ => return,
        };
        failed.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    };
    let asker: Option<Py<PyAny>> = interactive.map(Bound::unbind);
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let run = o.run.clone();
    let result = control.drive(py, || {
        let mut ask = |p: &cowlink::cp::Prompt<'_>| -> bool {
            let Some(cb) = &asker else { return false };
            Python::attach(|py| match cb.call1(py, (p.question(),)) {
                Ok(answer) => answer.is_truthy(py).unwrap_or(false),
                Err(e) => {
                    *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    run.cancel.cancel();
                    false
                }
            })
        };
        cowlink::cp::copy(&sources, &dst, target, &o, &observe, Some(&mut ask))
    })?;
    if let Some(e) = raised.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let report = result.map_err(|e| to_py(py, &e))?;
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    let totals = TreeReport::from(&report.totals);
    match failed.as_slice() {
        [] => Ok(totals),
        [one] => Err(to_py(py, one)),
        _ => Err(crate::errors::tree_failures(
            py,
            &failed,
            "the operands or entries could not be copied",
            "tree",
            Some(&dst.0),
            None,
            totals,
        )?),
    }
}
