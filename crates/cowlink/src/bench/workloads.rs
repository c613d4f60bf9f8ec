//! The three measurements of [`bench`](fn@super::bench), each in its own
//! subdirectory of the work directory, each checking for a cancel between
//! operations.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::{BenchPlan, Latency, Metadata, SizeRow, Stage, WriterRow, KIB, MIB};
use crate::clone::{clone_file, CloneOptions};
use crate::ground::error::{Error, ErrorKind, Operation};
use crate::prealloc::PreallocWriter;
use crate::prim::mode::LinkMode;
use crate::run::Run;

/// How a writer writes a large file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Unbuffered 8 KiB writes.
    Small,
    /// 1 MiB buffered writes.
    Large,
    /// 8 KiB writes into a [`PreallocWriter`].
    PreallocSmall,
    /// 1 MiB writes into a [`PreallocWriter`].
    PreallocLarge,
}

impl Strategy {
    /// Every strategy, in the order they are measured.
    pub const ALL: [Strategy; 4] = [
        Strategy::Small,
        Strategy::Large,
        Strategy::PreallocSmall,
        Strategy::PreallocLarge,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Small => "small-8k",
            Strategy::Large => "buffered-1m",
            Strategy::PreallocSmall => "prealloc+small-8k",
            Strategy::PreallocLarge => "prealloc+buffered-1m",
        }
    }

    fn chunk(self) -> usize {
        match self {
            Strategy::Small | Strategy::PreallocSmall => 8 * KIB as usize,
            Strategy::Large | Strategy::PreallocLarge => MIB as usize,
        }
    }
}

impl Serialize for Strategy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// What every workload needs.
pub(super) struct Workloads<'a> {
    pub work: &'a Path,
    pub plan: &'a BenchPlan,
    pub run: &'a Run,
    pub stage: &'a (dyn Fn(Stage) + Sync),
}

const OP: Operation = Operation::Bench;

/// An I/O error on `path`, as the library's error.
fn io_err(path: &Path) -> impl Fn(io::Error) -> Error + '_ {
    move |e| Error::from_io(OP, &e).with_src(path)
}

/// Deterministic, incompressible bytes.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn write_source(path: &Path, size: u64) -> io::Result<()> {
    let mut f = File::create(path)?;
    let mut buf = vec![0u8; (size.min(MIB)) as usize];
    let mut left = size;
    let mut seed = size + 1;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n], seed);
        f.write_all(&buf[..n])?;
        left -= n as u64;
        seed += 1;
    }
    f.sync_all()
}

impl Workloads<'_> {
    fn check(&self) -> Result<(), Error> {
        match self.run.cancelled() {
            true => Err(Error::new(OP, ErrorKind::Cancelled).with_src(self.work)),
            false => Ok(()),
        }
    }

    /// 1. Copy vs clone vs hardlink of one source per size.
    pub(super) fn sizes(&self, reflink_works: bool) -> Result<Vec<SizeRow>, Error> {
        self.plan
            .sizes
            .iter()
            .map(|&size| self.size_row(size, reflink_works))
            .collect()
    }

    /// Copy vs clone vs hardlink of one source of `size` bytes.
    pub(super) fn size_row(&self, size: u64, reflink_works: bool) -> Result<SizeRow, Error> {
        let copy_opts = CloneOptions {
            link: LinkMode::Copy,
            ..Default::default()
        };
        let clone_opts = CloneOptions {
            link: LinkMode::Clone,
            ..Default::default()
        };
        (self.stage)(Stage::Sizes(size));
        let src = self.work.join(format!("src-{size}"));
        write_source(&src, size).map_err(io_err(&src))?;
        let dst = self.work.join("dst");
        let time = |op: &dyn Fn() -> Result<(), Error>| -> Result<Latency, Error> {
            let mut v = Vec::with_capacity(self.plan.copies);
            for _ in 0..self.plan.copies {
                self.check()?;
                let t = Instant::now();
                op()?;
                v.push(t.elapsed());
                fs::remove_file(&dst).map_err(io_err(&dst))?;
            }
            Ok(Latency::of(v))
        };
        let copy = time(&|| clone_file(&src, &dst, &copy_opts).map(drop))?;
        let clone = match reflink_works {
            true => Some(time(&|| clone_file(&src, &dst, &clone_opts).map(drop))?),
            false => None,
        };
        let hardlink = time(&|| fs::hard_link(&src, &dst).map_err(io_err(&dst)))?;
        fs::remove_file(&src).map_err(io_err(&src))?;
        Ok(SizeRow {
            bytes: size,
            copies: self.plan.copies,
            copy,
            clone,
            hardlink,
            copy_vs_clone: clone.map(|c| copy.median_us / c.median_us),
            clone_vs_hardlink: clone.map(|c| c.median_us / hardlink.median_us),
        })
    }

    /// 2. Create, stat, read and delete many small files.
    pub(super) fn metadata(&self) -> Result<Metadata, Error> {
        let n = self.plan.meta_files;
        (self.stage)(Stage::Metadata(n));
        let dir = self.work.join("meta");
        fs::create_dir(&dir).map_err(io_err(&dir))?;
        let names: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("f{i:05}.o"))).collect();
        let mut body = [0u8; 100];
        fill(&mut body, 7);
        let rate = |t: Instant| n as f64 / t.elapsed().as_secs_f64();
        let each = |f: &dyn Fn(&Path) -> io::Result<()>| -> Result<f64, Error> {
            self.check()?;
            let t = Instant::now();
            for p in &names {
                f(p).map_err(io_err(p))?;
            }
            Ok(rate(t))
        };
        let create_per_s = each(&|p| File::create(p)?.write_all(&body))?;
        let stat_per_s = each(&|p| fs::metadata(p).map(drop))?;
        let read_per_s = each(&|p| {
            let mut buf = Vec::with_capacity(128);
            File::open(p)?.read_to_end(&mut buf).map(drop)
        })?;
        let delete_per_s = each(&|p| fs::remove_file(p))?;
        fs::remove_dir(&dir).map_err(io_err(&dir))?;
        Ok(Metadata {
            files: n,
            create_per_s,
            stat_per_s,
            read_per_s,
            delete_per_s,
        })
    }

    /// 3. Four concurrent writers, once per [`Strategy`].
    pub(super) fn writers(&self) -> Result<Vec<WriterRow>, Error> {
        Strategy::ALL.into_iter().map(|s| self.writer(s)).collect()
    }

    /// Four concurrent writers with `strategy`.
    pub(super) fn writer(&self, strategy: Strategy) -> Result<WriterRow, Error> {
        self.check()?;
        (self.stage)(Stage::Writers(strategy));
        let dir = &self.work.join(strategy.name());
        const WRITERS: usize = 4;
        fs::create_dir(dir).map_err(io_err(dir))?;
        let mut data = vec![0u8; 4 * MIB as usize];
        fill(&mut data, 11);
        let size = self.plan.writer_file_size;
        let t = Instant::now();
        let results: Vec<Result<Vec<PathBuf>, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let data = &data;
                    s.spawn(move || -> Result<Vec<PathBuf>, Error> {
                        let mut paths = Vec::new();
                        for f in 0..self.plan.writer_files {
                            self.check()?;
                            let p = dir.join(format!("w{w}-f{f}"));
                            write_one(&p, size, strategy, data)?;
                            paths.push(p);
                        }
                        Ok(paths)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut paths = Vec::new();
        for r in results {
            paths.extend(r?);
        }
        File::open(dir)
            .and_then(|d| {
                cowlink_sys::sync_filesystem(rustix::fd::AsFd::as_fd(&d)).map_err(Into::into)
            })
            .map_err(io_err(dir))?;
        let write_s = t.elapsed().as_secs_f64();
        let bytes = size * paths.len() as u64;
        let frags: Option<Vec<u64>> = paths
            .iter()
            .map(|p| crate::extents::extents(p).ok().map(|l| l.fragments))
            .collect();
        // Read back with the cache dropped (pages are clean after syncfs).
        let t = Instant::now();
        let mut buf = vec![0u8; MIB as usize];
        for p in &paths {
            self.check()?;
            read_uncached(p, &mut buf).map_err(io_err(p))?;
        }
        let read_s = t.elapsed().as_secs_f64();
        fs::remove_dir_all(dir).map_err(io_err(dir))?;
        Ok(WriterRow {
            strategy,
            writers: WRITERS,
            files: paths.len(),
            bytes,
            write_mb_per_s: bytes as f64 / 1e6 / write_s,
            fragments_per_file: frags.map(|f| f.iter().sum::<u64>() as f64 / f.len().max(1) as f64),
            readback_mb_per_s: bytes as f64 / 1e6 / read_s,
        })
    }
}

/// Write one file of `size` bytes from `data` (cycled) with `strategy`.
fn write_one(path: &Path, size: u64, strategy: Strategy, data: &[u8]) -> Result<(), Error> {
    let chunk = strategy.chunk();
    let mut left = size;
    let mut pos = 0usize;
    let mut next = |w: &mut dyn Write| -> io::Result<()> {
        while left > 0 {
            let n = (left as usize).min(chunk).min(data.len() - pos);
            w.write_all(&data[pos..pos + n])?;
            pos = (pos + n) % data.len();
            left -= n as u64;
        }
        Ok(())
    };
    match strategy {
        Strategy::Small => File::create(path)
            .and_then(|mut f| next(&mut f))
            .map_err(io_err(path)),
        Strategy::Large => File::create(path)
            .and_then(|f| {
                let mut w = BufWriter::with_capacity(chunk, f);
                next(&mut w)?;
                w.flush()
            })
            .map_err(io_err(path)),
        Strategy::PreallocSmall | Strategy::PreallocLarge => {
            let mut w = PreallocWriter::create(path, size)?;
            next(&mut w).map_err(io_err(path))?;
            w.finish().map(drop)
        }
    }
}

/// Read `path` to the end after asking the kernel to drop its cached pages.
fn read_uncached(path: &Path, buf: &mut [u8]) -> io::Result<()> {
    let mut f = File::open(path)?;
    cowlink_sys::drop_cached_pages(rustix::fd::AsFd::as_fd(&f))?;
    let mut h = blake3::Hasher::new();
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    std::hint::black_box(h.finalize());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filler_is_deterministic_and_not_constant() {
        let (mut a, mut b) = ([0u8; 64], [0u8; 64]);
        fill(&mut a, 3);
        fill(&mut b, 3);
        assert_eq!(a, b);
        assert!(a.windows(8).any(|w| w != &a[..8]));
        fill(&mut b, 4);
        assert_ne!(a, b);
    }

    #[test]
    fn strategies_serialize_as_their_names() {
        let names: Vec<String> = Strategy::ALL
            .iter()
            .map(|s| {
                serde_json::to_value(s)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "small-8k",
                "buffered-1m",
                "prealloc+small-8k",
                "prealloc+buffered-1m"
            ]
        );
    }
}
