//! Copy vs clone per file size, and `clone_file`'s overhead over the bare
//! syscalls, measured in-process (a process spawn costs ~1 ms, far more
//! than a clone, so hyperfine cannot time single clones).
//!
//! For each size one source file is written and synced; then N times each:
//! - copy:  `clone_file` with `LinkMode::Copy` (a physical read/write copy)
//! - clone: `clone_file` with `LinkMode::Clone`
//! - bare:  open(src), openat(dst, O_CREAT|O_EXCL), ioctl(FICLONE), close ×2
//! - bare + atomic link: open(src), O_TMPFILE, ioctl(FICLONE), linkat, close ×2
//!
//! Each destination is deleted after it is timed (not timed), so every
//! operation creates a new file. Copies run in their own phase; the three
//! clone variants rotate (order shifted each round) so drift hits all alike. Prints a Markdown table of
//! medians in µs.
//!
//! Usage: cargo run --release --example clonebench -- DIR [--copies N] [--full]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cowlink::{clone_file, CloneOptions, LinkMode};
use rustix::fs::{self, Mode, OFlags};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn median(v: &mut [Duration]) -> f64 {
    v.sort();
    let n = v.len();
    let mid = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    };
    mid.as_secs_f64() * 1e6
}

fn make_source(path: &Path, size: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut left = size;
    let mut buf = vec![0u8; (MIB as usize).min(size.max(1) as usize)];
    while left > 0 {
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
}

fn bare_clone(src: &Path, dst: &Path) {
    let s = fs::open(src, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let d = fs::open(
        dst,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    fs::ioctl_ficlone(&d, &s).unwrap();
}

/// The bare sequence made atomic the way `clone_file` does it: an
/// O_TMPFILE in the directory, FICLONE, then linkat into place.
fn bare_atomic(src: &Path, dst: &Path) {
    let s = fs::open(src, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let dir = dst.parent().unwrap();
    let d = fs::open(
        dir,
        OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    fs::ioctl_ficlone(&d, &s).unwrap();
    if fs::linkat(&d, c"", fs::CWD, dst, fs::AtFlags::EMPTY_PATH).is_err() {
        let p = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&d));
        fs::linkat(fs::CWD, &*p, fs::CWD, dst, fs::AtFlags::SYMLINK_FOLLOW).unwrap();
    }
}

fn size_name(s: u64) -> String {
    match s {
        0 => "0 B".into(),
        s if s < KIB => format!("{s} B"),
        s if s < MIB => format!("{} KiB", s / KIB),
        s if s < 1024 * MIB => format!("{} MiB", s / MIB),
        s => format!("{} GiB", s / (1024 * MIB)),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut dir: Option<PathBuf> = None;
    let mut copies = 50usize;
    let mut full = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--copies" => {
                copies = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--copies N")
            }
            "--full" => full = true,
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = dir.expect("usage: clonebench DIR [--copies N] [--full]");
    let work = dir.join(format!(".clonebench-{}", std::process::id()));
    std::fs::create_dir(&work).expect("cannot create the work directory");
    let _cleanup = RemoveOnDrop(work.clone());
    let mut sizes = vec![0, 1, KIB, 16 * KIB, 256 * KIB, MIB, 16 * MIB];
    if full {
        sizes.push(1024 * MIB);
    }
    let sfs = fs::statfs(&work).unwrap();
    println!(
        "filesystem {} (magic {:#x}), {copies} operations per size, medians in µs\n",
        cowlink::FsKind::from_magic(sfs.f_type as u64),
        sfs.f_type
    );
    println!(
        "| size | copy (µs) | clone (µs) | copy / clone | bare FICLONE (µs) | bare + atomic link (µs) | clone_file / bare |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let never = CloneOptions {
        link: LinkMode::Copy,
        ..Default::default()
    };
    let always = CloneOptions {
        link: LinkMode::Clone,
        ..Default::default()
    };
    for &size in &sizes {
        let src = work.join("src");
        make_source(&src, size);
        // A 1 GiB physical copy per round would take the whole run: fewer.
        let n = if size >= 1024 * MIB {
            copies.min(5)
        } else {
            copies
        };
        let (mut copy, mut clone, mut bare, mut atomic) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let dst = work.join("dst");
        // Copies first, in their own phase: deleting a physical copy leaves
        // background work (XFS inode inactivation) that would slow whatever
        // is timed next.
        for _ in 0..n {
            let t = Instant::now();
            clone_file(&src, &dst, &never).unwrap();
            copy.push(t.elapsed());
            std::fs::remove_file(&dst).unwrap();
        }
        rustix::fs::sync();
        // Clone, bare and bare-atomic rotate, the order shifting every round.
        for round in 0..n {
            for k in 0..3 {
                let t = Instant::now();
                match (round + k) % 3 {
                    0 => {
                        clone_file(&src, &dst, &always).unwrap();
                        clone.push(t.elapsed());
                    }
                    1 => {
                        bare_clone(&src, &dst);
                        bare.push(t.elapsed());
                    }
                    _ => {
                        bare_atomic(&src, &dst);
                        atomic.push(t.elapsed());
                    }
                }
                std::fs::remove_file(&dst).unwrap();
            }
        }
        let (mc, ml, mb, ma) = (
            median(&mut copy),
            median(&mut clone),
            median(&mut bare),
            median(&mut atomic),
        );
        println!(
            "| {} | {mc:.0} | {ml:.0} | {:.1}× | {mb:.0} | {ma:.0} | {:.2}× |",
            size_name(size),
            mc / ml,
            ml / mb
        );
        std::fs::remove_file(&src).unwrap();
    }
}

/// Removes the work directory however `main` ends (a panic included).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
