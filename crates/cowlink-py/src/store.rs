//! `cowlink.Store`: the content-addressed store (`cowlink store`): add
//! files and trees, check trees out as clones, verify, collect garbage.

use std::path::PathBuf;

use cowlink::store::{Digest, LinkMode, MaterializeOptions, Store as LibStore};
use cowlink::Run;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::control::{CancelToken, Control};
use crate::errors::to_py;
use crate::ops::choose;
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
#[pyclass(module = "cowlink")]
pub struct Store {
    inner: Option<LibStore>,
}

impl Store {
    /// Run `f` on the store with `run` as its run control.
    fn with_run<T>(&mut self, run: Run, f: impl FnOnce(&LibStore) -> T) -> PyResult<T> {
        let store = self
            .inner
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("the store is busy in another call"))?;
        let store = store.with_run(run);
        let value = f(&store);
        self.inner = Some(store.with_run(Run::default()));
        Ok(value)
    }

    fn get(&self) -> PyResult<&LibStore> {
        self.inner
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the store is busy in another call"))
    }
}

#[pymethods]
impl Store {
    #[new]
    fn new(py: Python<'_>, path: FsPath) -> PyResult<Self> {
        let inner = py
            .detach(|| LibStore::open(&path))
            .map_err(|e| to_py(py, &e))?;
        Ok(Store { inner: Some(inner) })
    }

    /// The store's directory.
    #[getter]
    fn path(&self) -> PyResult<PathBuf> {
        Ok(self.get()?.root().to_path_buf())
    }

    /// Add one file's content (cloned in where the filesystem can).
    fn add(&self, py: Python<'_>, path: FsPath) -> PyResult<Added> {
        let store = self.get()?;
        let a = py
            .detach(|| store.add_file(&path))
            .map_err(|e| to_py(py, &e))?;
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
        &mut self,
        py: Python<'_>,
        path: FsPath,
        threads: Option<usize>,
        on_progress: Option<Bound<'_, PyAny>>,
        cancel: Option<Bound<'_, CancelToken>>,
    ) -> PyResult<AddedTree> {
        let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get));
        let t = self
            .with_run(control.run(), |store| {
                control.drive(py, || store.add_tree(&path))
            })??
            .map_err(|e| to_py(py, &e))?;
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
    #[pyo3(signature = (digest, dest, *, link="clone", verify=false, threads=None, on_progress=None, cancel=None))]
    #[allow(clippy::too_many_arguments)]
    fn checkout(
        &mut self,
        py: Python<'_>,
        digest: &str,
        dest: FsPath,
        link: &str,
        verify: bool,
        threads: Option<usize>,
        on_progress: Option<Bound<'_, PyAny>>,
        cancel: Option<Bound<'_, CancelToken>>,
    ) -> PyResult<CheckoutReport> {
        let d = self::digest(digest)?;
        let options = MaterializeOptions {
            link: choose(
                "link",
                link,
                &[
                    ("clone", LinkMode::Clone),
                    ("auto", LinkMode::Auto),
                    ("copy", LinkMode::Copy),
                    ("hardlink", LinkMode::Hardlink),
                ],
            )?,
            verify,
            ..MaterializeOptions::default()
        };
        let control = Control::new(threads, on_progress, cancel.as_ref().map(Bound::get));
        let r = self
            .with_run(control.run(), |store| {
                control.drive(py, || {
                    store
                        .manifest(&d)
                        .and_then(|m| store.materialize_tree(&m, &dest, &options))
                })
            })??
            .map_err(|e| to_py(py, &e))?;
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
    /// damaged objects are moved aside.
    fn verify(&self, py: Python<'_>) -> PyResult<VerifyReport> {
        let store = self.get()?;
        let r = py.detach(|| store.verify()).map_err(|e| to_py(py, &e))?;
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
        let store = self.get()?;
        let r = py
            .detach(|| store.gc(keep.as_deref()))
            .map_err(|e| to_py(py, &e))?;
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
        let store = self.get()?;
        let s = py.detach(|| store.stats()).map_err(|e| to_py(py, &e))?;
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

    fn __repr__(&self) -> String {
        match &self.inner {
            Some(s) => format!("Store({:?})", s.root()),
            None => "Store(<busy>)".into(),
        }
    }
}
