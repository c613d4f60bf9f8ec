//! `cowlink.Store`: the content-addressed store (`cowlink store`): add
//! files and trees, check trees out as clones, verify, collect garbage.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cowlink::store::{CheckoutOptions, Digest, LinkMode, Store as LibStore};
use cowlink::Run;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::control::{CancelToken, Control};
use crate::errors::to_py;
use crate::path::FsPath;
use crate::records::{error_list, record, word};

record!(
    /// What `Store.add` did.
    Added {
        /// The object's digest (hex).
        digest: String,
        /// Its size.
        bytes: u64,
        /// How the bytes got into the store ("reflink", "copy_offload", …).
        method: String,
        /// False when the store already had these bytes.
        new: bool,
    }
);

record!(
    /// What `Store.add_tree` did.
    AddedTree {
        /// The manifest's digest (hex): what to check out later.
        digest: String,
        /// Regular files.
        files: u64,
        /// Directories below the root.
        dirs: u64,
        /// Symbolic links.
        symlinks: u64,
        /// Bytes of regular files.
        bytes: u64,
        /// Files whose content was new to the store.
        new_objects: u64,
        /// Files cloned into the store (the rest were copied).
        cloned: u64,
    }
);

record!(
    /// What `Store.checkout` did.
    CheckoutReport {
        /// Regular files placed.
        files: u64,
        /// Directories created.
        dirs: u64,
        /// Symbolic links created.
        symlinks: u64,
        /// Bytes of the files placed.
        bytes: u64,
        /// Files sharing the object's blocks.
        cloned: u64,
        /// Files physically copied.
        copied: u64,
        /// Files hardlinked to the object.
        hardlinked: u64,
        /// New object generations made because a reference limit was hit.
        generations_created: u64,
        /// Entries that failed, as OSError (the others were placed).
        errors: Vec<Py<PyAny>>,
        /// Stopped early by a CancelToken (every file placed is complete).
        cancelled: bool,
    }
);

record!(
    /// A damaged object found by `Store.verify`.
    Corrupt {
        /// The object file.
        path: PathBuf,
        /// Where it was moved aside, if it was.
        quarantined: Option<PathBuf>,
        /// What is wrong.
        problem: String,
    }
);

record!(
    /// What `Store.verify` found.
    VerifyReport {
        /// Objects checked.
        objects: u64,
        /// Their bytes.
        bytes: u64,
        /// Manifests checked.
        manifests: u64,
        /// Damaged objects.
        corrupt: Vec<Py<Corrupt>>,
        /// (manifest, object) pairs whose object is missing.
        missing: Vec<(String, String)>,
        /// Nothing corrupt, nothing missing.
        clean: bool,
    }
);

record!(
    /// What `Store.gc` removed.
    GcReport {
        /// Manifests kept.
        manifests_kept: u64,
        /// Manifests removed.
        manifests_removed: u64,
        /// Object files removed.
        objects_removed: u64,
        /// Their sizes, summed.
        bytes_removed: u64,
        /// Leftover temporaries of dead processes removed.
        temporaries_removed: u64,
    }
);

record!(
    /// What `Store.stats` counts.
    StoreStats {
        /// Distinct objects.
        objects: u64,
        /// Extra physical generations.
        generations: u64,
        /// Bytes of the objects.
        object_bytes: u64,
        /// Bytes the objects take on disk.
        allocated_bytes: u64,
        /// Manifests.
        manifests: u64,
        /// Files the manifests name.
        manifest_files: u64,
        /// Bytes of the files the manifests name.
        manifest_bytes: u64,
        /// manifest_bytes less object_bytes: what sharing saves.
        bytes_saved: u64,
    }
);

fn digest(s: &str) -> PyResult<Digest> {
    s.parse()
        .map_err(|e| PyValueError::new_err(format!("not a digest: {s:?} ({e})")))
}

/// A content-addressed store at `path` (created if missing). Objects are
/// kept once; checkouts are clones of them, so a write to a checked-out
/// file never changes the store.
///
/// Shareable between threads: the class is frozen, every method takes
/// `&self`, and each call works on a library store value of its own,
/// leased from `idle` (see [`Store::lease`]), so a call in one thread never
/// sees another's run control, and `.path` and `repr()` need nothing but
/// the immutable root.
#[pyclass(module = "cowlink", frozen)]
pub struct Store {
    /// The directory, made absolute (symbolic links are not resolved).
    root: PathBuf,
    /// `(st_dev, st_ino)` of that directory when it was first opened: a
    /// value opened later for a concurrent call must be the same store.
    identity: (u64, u64),
    /// Library store values no call is using (at most [`MAX_IDLE`]).
    idle: Mutex<Vec<LibStore>>,
}

/// Idle store values kept for later calls; more concurrent calls than
/// this open a value of their own and close it when they return.
const MAX_IDLE: usize = 4;

/// A library store value lent to one call, with that call's run control;
/// given back (with the default run control) when dropped.
struct Lease<'a> {
    owner: &'a Store,
    store: Option<LibStore>,
}

impl std::ops::Deref for Lease<'_> {
    type Target = LibStore;
    fn deref(&self) -> &LibStore {
        self.store
            .as_ref()
            .expect("a lease holds its store until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.store.take() {
            let mut idle = self.owner.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(s.with_run(Run::default()));
            }
        }
    }
}

fn identity(root: &Path) -> std::io::Result<(u64, u64)> {
    let m = std::fs::metadata(root)?;
    Ok((m.dev(), m.ino()))
}

impl Store {
    /// The Python exception for `e`, which names the store's directory
    /// when the library named no path.
    fn fail(&self, py: Python<'_>, e: &cowlink::Error) -> PyErr {
        if e.src().is_none() && e.dst().is_none() {
            to_py(py, &e.clone().with_src(&self.root))
        } else {
            to_py(py, e)
        }
    }

    /// The one way a method gets at the library store: a value of its own
    /// for the length of the call, running under `run`. An idle value is
    /// reused; when every value is busy in another thread, the store is
    /// opened again (with the GIL released) and must still be the
    /// directory this `Store` first opened.
    fn lease(&self, py: Python<'_>, run: Run) -> PyResult<Lease<'_>> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let store = match idle {
            Some(s) => s,
            None => py
                .detach(|| {
                    // Checked before (open would create a store where
                    // none is) and after (the directory opened).
                    let same = || matches!(identity(&self.root), Ok(id) if id == self.identity);
                    let replaced = || {
                        cowlink::Error::new(
                            cowlink::Operation::Store,
                            cowlink::ErrorKind::ContentChanged,
                        )
                        .with_src(&self.root)
                        .with_reason("the store directory was replaced since this Store was opened")
                    };
                    if !same() {
                        return Err(replaced());
                    }
                    let s = LibStore::open(&self.root)?;
                    if !same() {
                        return Err(replaced());
                    }
                    Ok(s)
                })
                .map_err(|e| self.fail(py, &e))?,
        };
        Ok(Lease {
            owner: self,
            store: Some(store.with_run(run)),
        })
    }
}

#[pymethods]
impl Store {
    #[new]
    fn new(py: Python<'_>, path: FsPath) -> PyResult<Self> {
        // Made absolute (not resolved) now: a store opened again for a
        // concurrent call after os.chdir() is still this one.
        let path = std::path::absolute(&path).unwrap_or(path.0);
        let (inner, id) = py
            .detach(|| {
                let s = LibStore::open(&path)?;
                let id = identity(s.root()).map_err(|e| {
                    cowlink::Error::from_io(cowlink::Operation::Store, &e).with_src(s.root())
                })?;
                Ok::<_, cowlink::Error>((s, id))
            })
            .map_err(|e| {
                let e = if e.src().is_none() {
                    e.with_src(&path)
                } else {
                    e
                };
                to_py(py, &e)
            })?;
        Ok(Store {
            root: inner.root().to_path_buf(),
            identity: id,
            idle: Mutex::new(vec![inner]),
        })
    }

    /// The store's directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.root.clone()
    }

    /// Add one file's content (cloned in where the filesystem can).
    fn add(&self, py: Python<'_>, path: FsPath) -> PyResult<Added> {
        let store = self.lease(py, Run::default())?;
        let a = py
            .detach(|| store.add_file(&path))
            .map_err(|e| self.fail(py, &e))?;
        Ok(Added {
            digest: a.digest.to_hex(),
            bytes: a.bytes,
            method: word(&a.method),
            new: a.new,
        })
    }

    /// Add a directory tree: every file's content, and a manifest of the
    /// tree whose digest `checkout` takes.
    #[pyo3(signature = (path, *, threads=None, on_progress=None, cancel=None))]
    fn add_tree(
        &self,
        py: Python<'_>,
        path: FsPath,
        threads: Option<usize>,
        on_progress: Option<Bound<'_, PyAny>>,
        cancel: Option<Bound<'_, CancelToken>>,
    ) -> PyResult<AddedTree> {
        let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
        let store = self.lease(py, control.run())?;
        let t = control
            .drive(py, || store.add_tree(&path))?
            .map_err(|e| self.fail(py, &e))?;
        Ok(AddedTree {
            digest: t.digest.to_hex(),
            files: t.files,
            dirs: t.dirs,
            symlinks: t.symlinks,
            bytes: t.bytes,
            new_objects: t.new_objects,
            cloned: t.cloned,
        })
    }

    /// Place the tree of manifest `digest` at `dest` (new or empty).
    /// `link`: "clone" (the default; fails where the filesystem cannot
    /// clone), "auto" (clone, else copy), "copy", or "hardlink" (writes
    /// through to the store: only for trees nobody writes).
    #[pyo3(signature = (digest, dest, *, link=None, verify=false, threads=None, on_progress=None, cancel=None))]
    #[allow(clippy::too_many_arguments)]
    fn checkout(
        &self,
        py: Python<'_>,
        digest: &str,
        dest: FsPath,
        link: Option<&str>,
        verify: bool,
        threads: Option<usize>,
        on_progress: Option<Bound<'_, PyAny>>,
        cancel: Option<Bound<'_, CancelToken>>,
    ) -> PyResult<CheckoutReport> {
        let d = self::digest(digest)?;
        let options = CheckoutOptions {
            link: crate::ops::link_arg(py, link, None, LinkMode::Clone)?,
            verify,
            ..CheckoutOptions::default()
        };
        let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
        let store = self.lease(py, control.run())?;
        let r = control
            .drive(py, || {
                store
                    .manifest(&d)
                    .and_then(|m| store.checkout(&m, &dest, &options))
            })?
            .map_err(|e| self.fail(py, &e))?;
        Ok(CheckoutReport {
            files: r.files,
            dirs: r.dirs,
            symlinks: r.symlinks,
            bytes: r.bytes,
            cloned: r.cloned,
            copied: r.copied,
            hardlinked: r.hardlinked,
            generations_created: r.generations_created,
            errors: error_list(py, &r.errors)?,
            cancelled: r.cancelled,
        })
    }

    /// Rehash every object and check every manifest's objects are there;
    /// damaged objects are moved aside. Ctrl-C, an exception from
    /// `on_progress` or `cancel` stop it between objects.
    #[pyo3(signature = (*, threads=None, on_progress=None, cancel=None))]
    fn verify(
        &self,
        py: Python<'_>,
        threads: Option<usize>,
        on_progress: Option<Bound<'_, PyAny>>,
        cancel: Option<Bound<'_, CancelToken>>,
    ) -> PyResult<VerifyReport> {
        let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get))?;
        let store = self.lease(py, control.run())?;
        let r = control
            .drive(py, || store.verify())?
            .map_err(|e| self.fail(py, &e))?;
        Ok(VerifyReport {
            objects: r.objects,
            bytes: r.bytes,
            manifests: r.manifests,
            corrupt: r
                .corrupt
                .iter()
                .map(|c| {
                    Py::new(
                        py,
                        Corrupt {
                            path: c.path.clone(),
                            quarantined: c.quarantined.clone(),
                            problem: c.problem.clone(),
                        },
                    )
                })
                .collect::<PyResult<_>>()?,
            missing: r
                .missing
                .iter()
                .map(|(m, o)| (m.to_hex(), o.to_hex()))
                .collect(),
            clean: r.is_clean(),
        })
    }

    /// Remove every manifest not in `keep` (None: keep every manifest) and
    /// every object no kept manifest names.
    #[pyo3(signature = (keep=None))]
    fn gc(&self, py: Python<'_>, keep: Option<Vec<String>>) -> PyResult<GcReport> {
        let keep: Option<Vec<Digest>> = keep
            .map(|k| k.iter().map(|s| digest(s)).collect::<PyResult<_>>())
            .transpose()?;
        let store = self.lease(py, Run::default())?;
        let r = Control::new(None, None, None)?
            .drive(py, || store.gc(keep.as_deref()))?
            .map_err(|e| self.fail(py, &e))?;
        Ok(GcReport {
            manifests_kept: r.manifests_kept,
            manifests_removed: r.manifests_removed,
            objects_removed: r.objects_removed,
            bytes_removed: r.bytes_removed,
            temporaries_removed: r.temporaries_removed,
        })
    }

    /// Counts and sizes of objects and manifests.
    fn stats(&self, py: Python<'_>) -> PyResult<StoreStats> {
        let store = self.lease(py, Run::default())?;
        let s = Control::new(None, None, None)?
            .drive(py, || store.stats())?
            .map_err(|e| self.fail(py, &e))?;
        Ok(StoreStats {
            objects: s.objects,
            generations: s.generations,
            object_bytes: s.object_bytes,
            allocated_bytes: s.allocated_bytes,
            manifests: s.manifests,
            manifest_files: s.manifest_files,
            manifest_bytes: s.manifest_bytes,
            bytes_saved: s.bytes_saved,
        })
    }

    /// `Store('/the/path')`, the path as `repr(str(store.path))`.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let path = self.root.as_path().into_pyobject(py)?;
        Ok(format!("Store({})", path.str()?.repr()?))
    }
}
