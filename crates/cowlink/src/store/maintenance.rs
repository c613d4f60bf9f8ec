//! Keeping a store healthy: `stats` (what it holds and saves), `verify`
//! (rehash every object and manifest in parallel; mismatches move to
//! `quarantine/`), and `gc` (under the exclusive lock: drop manifests not
//! kept, then objects no manifest uses, then dead temporaries).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use rustix::fd::AsFd;
use rustix::fs::{self, AtFlags};
use rustix::io::Errno;

use crate::ground::error::{Error, ErrorKind, Operation, Result};
use crate::run::Phase;

use super::layout::manifest_rel;
use super::manifest::{Digest, EntryKind};
use super::{store_err, Store};

/// One object or manifest that failed [`Store::verify`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Corrupt {
    /// Where it was.
    #[serde(flatten, serialize_with = "crate::name::json::path")]
    pub path: PathBuf,
    /// Where it is now (under `quarantine/`).
    #[serde(flatten, serialize_with = "crate::name::json::quarantined")]
    pub quarantined: Option<PathBuf>,
    /// What is wrong.
    pub problem: String,
}

/// What [`Store::verify`] found.
#[derive(Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Object files hashed (generations included).
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Manifests checked.
    pub manifests: u64,
    /// Objects or manifests whose bytes do not match their name, or that
    /// cannot be parsed; moved to `quarantine/`.
    pub corrupt: Vec<Corrupt>,
    /// Objects referenced by a manifest that the store lacks:
    /// `(manifest, object)`.
    pub missing: Vec<(Digest, Digest)>,
}

impl VerifyReport {
    /// Whether everything checked out.
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty() && self.missing.is_empty()
    }
}

/// What [`Store::gc`] removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct GcReport {
    /// Manifests kept.
    pub manifests_kept: u64,
    /// Manifests removed (not in the keep list).
    pub manifests_removed: u64,
    /// Object files removed (generations included).
    pub objects_removed: u64,
    /// Their sizes, summed.
    pub bytes_removed: u64,
    /// Leftover temporaries of dead processes removed.
    pub temporaries_removed: u64,
    /// Partly downloaded objects (`tmp/<hex>.partial`) removed: untouched
    /// for [`PARTIAL_GRACE`](crate::store::PARTIAL_GRACE), or not regular
    /// files. Never counted as objects.
    pub partials_removed: u64,
    /// Their sizes, summed.
    pub partial_bytes_removed: u64,
    /// Files in `manifests/` or `objects/` that were not regular files
    /// (a FIFO, a device, a link: damage, never read), moved to
    /// `quarantine/`.
    pub quarantined: Vec<Corrupt>,
}

/// What [`Store::stats`] counts.
#[derive(Debug, Default, serde::Serialize)]
pub struct StoreStats {
    /// Distinct objects.
    pub objects: u64,
    /// Extra physical generations (see [`LinkMode`](crate::LinkMode)).
    pub generations: u64,
    /// Sum of the distinct objects' sizes.
    pub object_bytes: u64,
    /// Blocks the object files hold (`st_blocks`; shared blocks count
    /// fully, as `du` does).
    pub allocated_bytes: u64,
    /// Manifests.
    pub manifests: u64,
    /// Files listed by all manifests together.
    pub manifest_files: u64,
    /// Their sizes summed: what plain copies of every stored tree take.
    pub manifest_bytes: u64,
    /// `manifest_bytes` minus the size of the distinct objects they use:
    /// space saved by storing each content once.
    pub bytes_saved: u64,
}

impl Store {
    /// Counts and sizes of what the store holds.
    pub fn stats(&self) -> Result<StoreStats> {
        let mut s = StoreStats::default();
        let mut sizes: HashMap<Digest, u64> = HashMap::new();
        for (d, g, rel) in self.object_files()? {
            let st = cowlink_sys::statat(&self.dir, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| store_err(self.root.join(&rel), e))?;
            s.allocated_bytes += st.st_blocks as u64 * 512;
            if g == 0 {
                s.objects += 1;
                s.object_bytes += st.st_size as u64;
                sizes.insert(d, st.st_size as u64);
            } else {
                s.generations += 1;
            }
        }
        let mut used: HashSet<Digest> = HashSet::new();
        for m in self.manifests()? {
            s.manifests += 1;
            let Ok(manifest) = self.manifest(&m) else {
                continue;
            };
            for e in &manifest.entries {
                if let EntryKind::File { digest, size, .. } = e.kind {
                    s.manifest_files += 1;
                    s.manifest_bytes += size;
                    used.insert(digest);
                }
            }
        }
        let distinct: u64 = used.iter().filter_map(|d| sizes.get(d)).sum();
        s.bytes_saved = s.manifest_bytes.saturating_sub(distinct);
        Ok(s)
    }

    /// Rehash every object and manifest. Those whose bytes do not match
    /// their name (or that are not valid manifests) are moved to
    /// `quarantine/` and reported; objects that manifests need but the
    /// store lacks are reported as missing.
    pub fn verify(&self) -> Result<VerifyReport> {
        let objects = self.object_files()?;
        self.run.enter(Phase::Verify, objects.len() as u64, 0);
        let corrupt = Mutex::new(Vec::new());
        let bytes = AtomicU64::new(0);
        self.install(|| {
            objects.par_iter().for_each(|(d, _, rel)| {
                if self.run.cancelled() {
                    return;
                }
                // (problem, whether it is damage to move away)
                let problem = match self.hash_file(rel) {
                    Ok((h, n)) => {
                        bytes.fetch_add(n, Ordering::Relaxed);
                        self.tick(n);
                        (h != d.0).then(|| (format!("content hashes to {}", Digest(h)), true))
                    }
                    Err(e) => {
                        let err = self.read_error(Operation::Store, rel, e);
                        // Damage (not a regular file) moves; an error
                        // reading a good file (EACCES, EMFILE, EIO) is
                        // reported and the file left where it is.
                        let damaged = err.kind() == ErrorKind::Corrupt;
                        Some((err.reason().to_string(), damaged))
                    }
                };
                if let Some((problem, damaged)) = problem {
                    let c = match damaged {
                        true => self.quarantine(rel, problem),
                        false => self.unmoved(rel, problem),
                    };
                    corrupt.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                }
            })
        });
        if self.run.cancelled() {
            return Err(Error::new(Operation::Store, ErrorKind::Cancelled)
                .with_src(&self.root)
                .with_reason("verify cancelled before every object was read"));
        }
        let mut report = VerifyReport {
            objects: objects.len() as u64,
            bytes: bytes.into_inner(),
            corrupt: corrupt.into_inner().unwrap_or_default(),
            ..Default::default()
        };
        for m in self.manifests()? {
            report.manifests += 1;
            match self.manifest(&m) {
                Ok(manifest) => {
                    let mut seen = HashSet::new();
                    for e in &manifest.entries {
                        if let EntryKind::File { digest, .. } = e.kind {
                            if seen.insert(digest) && !self.contains(&digest) {
                                report.missing.push((m, digest));
                            }
                        }
                    }
                }
                Err(e) => {
                    let rel = manifest_rel(&m);
                    let c = match e.kind() {
                        ErrorKind::Corrupt
                        | ErrorKind::ContentChanged
                        | ErrorKind::InvalidInput => self.quarantine(&rel, e.reason().to_string()),
                        _ => self.unmoved(&rel, e.reason().to_string()),
                    };
                    report.corrupt.push(c);
                }
            }
        }
        report.corrupt.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(report)
    }

    pub(super) fn hash_file(&self, rel: &str) -> std::result::Result<([u8; 32], u64), Errno> {
        let fd = self.open_in_layout(rel)?;
        crate::ground::hash::hash_fd(fd.as_fd(), cowlink_sys::fstat(&fd)?.st_size as u64, &|_| {})
    }

    /// `rel` reported as failing verification but left where it is (it
    /// could not be read, which says nothing about its bytes).
    fn unmoved(&self, rel: &str, problem: String) -> Corrupt {
        Corrupt {
            path: self.root.join(rel),
            quarantined: None,
            problem,
        }
    }

    /// Move every file of `manifests/` and `objects/` that is not a
    /// regular file (a FIFO, a device, a socket, a symbolic link, a
    /// directory) to `quarantine/`, looked at with `lstat` only: such a
    /// file is never opened.
    fn quarantine_odd_files(&self) -> Result<Vec<Corrupt>> {
        let mut out = Vec::new();
        let mut rels: Vec<String> = Vec::new();
        let fd = self
            .layout_dir("manifests")
            .map_err(|e| store_err(self.root.join("manifests"), e))?;
        for n in super::layout::list_dir(fd.as_fd())
            .map_err(|e| store_err(self.root.join("manifests"), e))?
        {
            if let Ok(d) = std::str::from_utf8(&n).unwrap_or("").parse::<Digest>() {
                rels.push(manifest_rel(&d));
            }
        }
        rels.extend(self.object_files()?.into_iter().map(|(_, _, rel)| rel));
        for rel in rels {
            let Ok(st) = cowlink_sys::statat(&self.dir, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            if cowlink_sys::file_type(st.st_mode) != fs::FileType::RegularFile {
                let what = crate::prim::files::file_type_name(st.st_mode);
                out.push(self.quarantine(&rel, format!("{what}, not a regular file")));
            }
        }
        Ok(out)
    }

    /// Move `rel` to `quarantine/` (under a unique name).
    pub(super) fn quarantine(&self, rel: &str, problem: String) -> Corrupt {
        let base = rel.rsplit('/').next().unwrap_or(rel);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let to = format!("quarantine/{base}.{stamp}");
        let moved = (|| {
            let (from, name) = self.parent_in_layout(rel)?;
            let q = self.layout_dir("quarantine")?;
            fs::renameat(&from, name, &q, &to["quarantine/".len()..])
        })()
        .is_ok();
        Corrupt {
            path: self.root.join(rel),
            quarantined: moved.then(|| self.root.join(&to)),
            problem,
        }
    }

    /// Remove every manifest not in `keep` (`None`: keep every manifest),
    /// every object that no kept manifest references, temporaries of dead
    /// processes, and partial downloads untouched for
    /// [`PARTIAL_GRACE`](crate::store::PARTIAL_GRACE).
    ///
    /// Holds the store lock exclusively: adds in other processes wait, and
    /// an add that started before holds the shared lock until its manifest
    /// is written, so gc never removes what it is about to reference. With
    /// `None` the manifests are listed under the lock, so one written just
    /// before is kept. Objects added with [`add`](Self::add) alone (no
    /// manifest) are not referenced and are removed: keep them in a
    /// manifest.
    ///
    /// # Errors
    /// `NotFound` when a digest in `keep` is not a manifest of the store
    /// (nothing is removed then).
    pub fn gc(&self, keep: Option<&[Digest]>) -> Result<GcReport> {
        let _lock = self.lock(true)?;
        let quarantined = self.quarantine_odd_files()?;
        let keep: Vec<Digest> = match keep {
            Some(k) => k.to_vec(),
            None => self.manifests()?,
        };
        let mut report = GcReport {
            quarantined,
            ..Default::default()
        };
        let keep: HashSet<Digest> = keep.iter().copied().collect();
        let mut used: HashSet<Digest> = HashSet::new();
        for d in &keep {
            let m = self.manifest(d).map_err(|e| {
                let why = format!("cannot keep manifest {d}: {}", e.reason());
                e.with_reason(why)
            })?;
            for e in &m.entries {
                if let EntryKind::File { digest, .. } = e.kind {
                    used.insert(digest);
                }
            }
        }
        for m in self.manifests()? {
            if keep.contains(&m) {
                report.manifests_kept += 1;
            } else {
                let rel = manifest_rel(&m);
                self.unlink_in_layout(&rel)
                    .map_err(|e| store_err(self.root.join(&rel), e))?;
                report.manifests_removed += 1;
            }
        }
        for (d, _, rel) in self.object_files()? {
            if used.contains(&d) {
                continue;
            }
            let size = cowlink_sys::statat(&self.dir, rel.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                .map_or(0, |s| s.st_size as u64);
            match self.unlink_in_layout(&rel) {
                Ok(()) => {
                    report.objects_removed += 1;
                    report.bytes_removed += size;
                }
                Err(Errno::NOENT) => {}
                Err(e) => return Err(store_err(self.root.join(&rel), e)),
            }
        }
        report.temporaries_removed = self.clean_temporaries(true)?;
        (report.partials_removed, report.partial_bytes_removed) = self.clean_partials()?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    //! What gc keeps and removes, on tmpfs (`/dev/shm`: no root, no test
    //! filesystems).
    use super::super::{Digest, Store};

    fn shm() -> tempfile::TempDir {
        let d = tempfile::tempdir_in("/dev/shm").expect("a directory in /dev/shm");
        let magic = rustix::fs::statfs(d.path()).unwrap().f_type as u64;
        assert_eq!(magic, 0x0102_1994, "/dev/shm is not tmpfs");
        d
    }

    fn tree(d: &std::path::Path, name: &str, files: &[(&str, &[u8])]) -> std::path::PathBuf {
        let root = d.join(name);
        std::fs::create_dir(&root).unwrap();
        for (n, b) in files {
            std::fs::write(root.join(n), b).unwrap();
        }
        root
    }

    #[test]
    fn gc_keeps_what_kept_manifests_name_and_removes_the_rest() {
        let d = shm();
        let st = Store::open(d.path().join("st")).unwrap();
        let a = st
            .add_tree(tree(
                d.path(),
                "a",
                &[("shared", b"shared"), ("a-only", b"aaaa")],
            ))
            .unwrap();
        let b = st
            .add_tree(tree(
                d.path(),
                "b",
                &[("shared", b"shared"), ("b-only", b"bbbbbbb")],
            ))
            .unwrap();
        let loose = st
            .add(tree(d.path(), "c", &[("f", b"loose")]).join("f"))
            .unwrap();
        let (shared, a_only, b_only) = (
            Digest::of(b"shared"),
            Digest::of(b"aaaa"),
            Digest::of(b"bbbbbbb"),
        );
        assert!([shared, a_only, b_only, loose]
            .iter()
            .all(|o| st.contains(o)));
        // Unknown manifests to keep: refused, nothing removed.
        let e = st.gc(Some(&[Digest::of(b"no such manifest")])).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::NotFound, "{e}");
        assert!([shared, a_only, b_only, loose]
            .iter()
            .all(|o| st.contains(o)));
        // Keep a: b's manifest, b's own object and the loose one go.
        let r = st.gc(Some(&[a.digest])).unwrap();
        assert_eq!((r.manifests_kept, r.manifests_removed), (1, 1));
        assert_eq!((r.objects_removed, r.bytes_removed), (2, 7 + 5));
        assert!(r.quarantined.is_empty());
        assert!(st.contains(&shared) && st.contains(&a_only));
        assert!(!st.contains(&b_only) && !st.contains(&loose));
        assert_eq!(st.manifests().unwrap(), vec![a.digest]);
        let _ = b;
        // Keep everything (no list): nothing more to remove.
        let r = st.gc(None).unwrap();
        assert_eq!(
            (r.manifests_kept, r.manifests_removed, r.objects_removed),
            (1, 0, 0)
        );
        assert!(st.verify().unwrap().corrupt.is_empty());
    }
}
