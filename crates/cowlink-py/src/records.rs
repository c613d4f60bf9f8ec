//! The result objects: frozen, read-only records with a `repr` that shows
//! every field, made from the library's own result types. Nothing here
//! computes anything the library did not.

use std::path::PathBuf;

use cowlink::extents::FileLayout as LibLayout;
use cowlink::probe::{Answer as LibAnswer, FsFacts as LibFacts};
use pyo3::prelude::*;

use crate::errors;

/// A record class: the struct, `#[pyclass(frozen, get_all)]`, and a
/// `__repr__` naming every field.
macro_rules! record {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[pyclass(module = "cowlink", frozen, get_all)]
        #[derive(Debug)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }

        #[pymethods]
        impl $name {
            fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
                let parts: Vec<String> = vec![$(
                    format!("{}={}", stringify!($field), slf.getattr(stringify!($field))?.repr()?)
                ),*];
                Ok(format!("{}({})", stringify!($name), parts.join(", ")))
            }
        }
    };
}
pub(crate) use record;

/// The library's word for an enum value (`"reflink"`, `"copy_offload"`).
pub fn word<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        other => format!("{other:?}"),
    }
}

/// Library errors as a list of Python exception objects.
pub fn error_list(py: Python<'_>, errs: &[cowlink::Error]) -> PyResult<Vec<Py<PyAny>>> {
    errs.iter()
        .map(|e| errors::exception(py, e).map(Bound::unbind))
        .collect()
}

record!(
    /// What a clone or copy did.
    Outcome {
        /// "reflink", "copy_offload", "read_write", "hardlink", "delta" or
        /// "skipped".
        method: String,
        /// Bytes the destination received.
        bytes: u64,
    }
);

impl From<cowlink::Outcome> for Outcome {
    fn from(o: cowlink::Outcome) -> Self {
        Outcome {
            method: word(&o.method),
            bytes: o.bytes,
        }
    }
}

/// Yes, no or unknown, with the reason for the latter two. True only for
/// yes.
#[pyclass(module = "cowlink", frozen, get_all)]
#[derive(Debug)]
pub struct Answer {
    /// "yes", "no" or "unknown".
    pub answer: &'static str,
    /// Why not, or why unknown.
    pub reason: Option<String>,
}

#[pymethods]
impl Answer {
    fn __bool__(&self) -> bool {
        self.answer == "yes"
    }

    fn __repr__(&self) -> String {
        match &self.reason {
            Some(r) => format!("Answer(answer={:?}, reason={r:?})", self.answer),
            None => format!("Answer(answer={:?}, reason=None)", self.answer),
        }
    }
}

impl From<&LibAnswer> for Answer {
    fn from(a: &LibAnswer) -> Self {
        Answer {
            answer: a.word(),
            reason: a.reason().map(str::to_owned),
        }
    }
}

record!(
    /// What one filesystem can do.
    FsFacts {
        /// The path asked about.
        path: PathBuf,
        /// The filesystem: "xfs", "btrfs", "ext4", "tmpfs", ….
        kind: String,
        /// statfs f_type.
        magic: Option<u64>,
        /// Device number.
        device: Option<u64>,
        /// Block size: range clones must be aligned to it.
        block_size: Option<u64>,
        /// Whether files here can be cloned (a trial clone).
        reflink: Py<Answer>,
        /// Whether identical ranges can be deduplicated here.
        dedupe: Py<Answer>,
        /// How many times one block may be shared ("none" for no limit).
        clone_limit: String,
    }
);

impl FsFacts {
    pub fn new(py: Python<'_>, f: &LibFacts) -> PyResult<Self> {
        Ok(FsFacts {
            path: f.path.clone(),
            kind: f.kind.to_string(),
            magic: f.magic,
            device: f.device,
            block_size: f.block_size,
            reflink: Py::new(py, Answer::from(&f.reflink))?,
            dedupe: Py::new(py, Answer::from(&f.dedupe))?,
            clone_limit: f.clone_limit.to_string(),
        })
    }
}

record!(
    /// Whether files can be cloned from one place to another.
    Support {
        /// Facts about the source's filesystem.
        src: Py<FsFacts>,
        /// Facts about the destination's filesystem.
        dst: Py<FsFacts>,
        /// Both on one filesystem.
        same_filesystem: bool,
        /// Whether a clone from src to dst works, and why not.
        reflink: Py<Answer>,
    }
);

record!(
    /// One mounted filesystem under a tree, and what it can do.
    MountSupport {
        /// Where it is mounted.
        mount_point: PathBuf,
        /// The mount's source (device or server).
        source: String,
        /// The filesystem type as mounted.
        fstype: String,
        /// Mounted read-only.
        read_only: bool,
        /// What it can do.
        facts: Py<FsFacts>,
    }
);

record!(
    /// One extent of a file (FIEMAP).
    Extent {
        /// Offset in the file.
        logical: u64,
        /// Offset on the device (0 where the filesystem gives none).
        physical: u64,
        /// Length in bytes.
        length: u64,
        /// FIEMAP_EXTENT_* flags.
        flags: u32,
        /// The flags by name ("shared", "unwritten", "last", …).
        flag_names: Vec<&'static str>,
        /// Its blocks are shared with another file or snapshot.
        shared: bool,
    }
);

record!(
    /// A range of a file with no data (reads as zeros).
    Hole {
        /// Offset in the file.
        offset: u64,
        /// Length in bytes.
        length: u64,
    }
);

record!(
    /// How one file is laid out on disk.
    FileLayout {
        /// Apparent size.
        size: u64,
        /// st_blocks × 512.
        allocated: u64,
        /// Device number.
        dev: u64,
        /// Inode number.
        ino: u64,
        /// The extents, in file order.
        extents: Vec<Py<Extent>>,
        /// The holes, in file order.
        holes: Vec<Py<Hole>>,
        /// Bytes in extents.
        mapped_bytes: u64,
        /// Bytes in shared extents.
        shared_bytes: u64,
        /// Bytes allocated but unwritten (read as zeros).
        unwritten_bytes: u64,
        /// Bytes stored inline in metadata.
        inline_bytes: u64,
        /// Bytes in holes.
        hole_bytes: u64,
        /// Physically discontiguous runs.
        fragments: u64,
        /// Bytes of compressed extents whose disk size is unknown.
        unknown_disk_bytes: u64,
        /// shared_bytes / mapped_bytes (0.0 for an empty file).
        shared_fraction: f64,
    }
);

impl FileLayout {
    pub fn new(py: Python<'_>, l: &LibLayout) -> PyResult<Self> {
        Ok(FileLayout {
            size: l.size,
            allocated: l.allocated,
            dev: l.dev,
            ino: l.ino,
            extents: l
                .extents
                .iter()
                .map(|e| {
                    Py::new(
                        py,
                        Extent {
                            logical: e.logical,
                            physical: e.physical,
                            length: e.length,
                            flags: e.flags,
                            flag_names: e.flag_names(),
                            shared: e.is_shared(),
                        },
                    )
                })
                .collect::<PyResult<_>>()?,
            holes: l
                .holes
                .iter()
                .map(|h| {
                    Py::new(
                        py,
                        Hole {
                            offset: h.offset,
                            length: h.length,
                        },
                    )
                })
                .collect::<PyResult<_>>()?,
            mapped_bytes: l.mapped_bytes,
            shared_bytes: l.shared_bytes,
            unwritten_bytes: l.unwritten_bytes,
            inline_bytes: l.inline_bytes,
            hole_bytes: l.hole_bytes,
            fragments: l.fragments,
            unknown_disk_bytes: l.unknown_disk_bytes,
            shared_fraction: l.shared_fraction(),
        })
    }
}

record!(
    /// True disk usage of a set of files, each counted once. The disk
    /// figures are None when a compressed extent's size could not be read.
    Usage {
        /// Regular files.
        files: u64,
        /// Directories.
        dirs: u64,
        /// Symbolic links, FIFOs, sockets, devices.
        others: u64,
        /// Sum of st_size.
        apparent: u64,
        /// What du shows (st_blocks × 512).
        allocated: u64,
        /// Bytes of data extents referenced (each reference counted).
        data: u64,
        /// Bytes nothing else references.
        exclusive: u64,
        /// Distinct bytes shared between files of the set.
        shared_inside: Option<u64>,
        /// Distinct bytes shared only with files outside the set.
        shared_outside: Option<u64>,
        /// All distinct shared bytes.
        shared: Option<u64>,
        /// The distinct bytes on disk.
        on_disk: Option<u64>,
        /// What sharing saves.
        saved: Option<u64>,
        /// Bytes inline in metadata.
        inline: u64,
        /// Bytes written but not yet allocated.
        pending: u64,
        /// Files whose extents could not be mapped.
        unmapped: u64,
        /// Bytes in compressed extents of unknown disk size.
        unknown_disk: u64,
    }
);

impl From<&cowlink::Usage> for Usage {
    fn from(u: &cowlink::Usage) -> Self {
        let known = |v: u64| u.disk_known().then_some(v);
        Usage {
            files: u.files,
            dirs: u.dirs,
            others: u.others,
            apparent: u.apparent,
            allocated: u.allocated,
            data: u.data,
            exclusive: u.exclusive,
            shared_inside: known(u.shared_inside),
            shared_outside: known(u.shared_outside),
            shared: known(u.shared),
            on_disk: known(u.on_disk),
            saved: known(u.saved),
            inline: u.inline,
            pending: u.pending,
            unmapped: u.unmapped,
            unknown_disk: u.unknown_disk,
        }
    }
}

record!(
    /// Totals of a tree copy.
    TreeReport {
        /// Regular files cloned or copied.
        files: u64,
        /// Directories created or merged into.
        dirs: u64,
        /// Symbolic links recreated.
        symlinks: u64,
        /// Names linked to an earlier copy of the same file.
        hardlinks: u64,
        /// FIFOs, sockets and devices recreated.
        specials: u64,
        /// Bytes of regular files.
        bytes: u64,
        /// Files whose blocks are shared with the source.
        cloned: u64,
        /// Files physically copied.
        copied: u64,
        /// Files kept because they already matched.
        skipped: u64,
        /// Entries that failed.
        errors: u64,
        /// Stopped by a CancelToken before the end.
        cancelled: bool,
    }
);

impl From<&cowlink::tree::TreeReport> for TreeReport {
    fn from(r: &cowlink::tree::TreeReport) -> Self {
        TreeReport {
            files: r.files,
            dirs: r.dirs,
            symlinks: r.symlinks,
            hardlinks: r.hardlinks,
            specials: r.specials,
            bytes: r.bytes,
            cloned: r.cloned,
            copied: r.copied,
            skipped: r.skipped,
            errors: r.errors,
            cancelled: r.cancelled,
        }
    }
}
