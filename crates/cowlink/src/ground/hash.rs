//! BLAKE3 of a whole open file, shared by dedupe and the store.
//!
//! One read buffer per thread, sized for the file: zeroing a 1 MiB buffer
//! for every small file cost more than hashing it.

use rustix::fd::BorrowedFd;
use rustix::io::Errno;

/// Largest read.
const READ_BUF: usize = 1 << 20;

thread_local! {
    static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Free this thread's read buffer (up to [`READ_BUF`]): a pool done
/// hashing calls it on each of its threads, so the buffers do not outlive
/// the reading while the rest of a plan is built.
pub(crate) fn release_buffer() {
    BUF.take();
}

/// Hash everything `fd` yields from its current position to end of file.
/// `size_hint` (the expected size) only sizes the buffer. Returns the hash
/// and the number of bytes read; `count` hears every chunk.
pub(crate) fn hash_fd(
    fd: BorrowedFd<'_>,
    size_hint: u64,
    count: &dyn Fn(u64),
) -> Result<([u8; 32], u64), Errno> {
    hash_from(fd, None, size_hint, count)
}

/// [`hash_fd`] from offset 0 with `pread`, leaving the file position alone.
pub(crate) fn hash_fd_at(
    fd: BorrowedFd<'_>,
    size_hint: u64,
    count: &dyn Fn(u64),
) -> Result<([u8; 32], u64), Errno> {
    hash_from(fd, Some(0), size_hint, count)
}

fn hash_from(
    fd: BorrowedFd<'_>,
    mut offset: Option<u64>,
    size_hint: u64,
    count: &dyn Fn(u64),
) -> Result<([u8; 32], u64), Errno> {
    let mut h = blake3::Hasher::new();
    let mut total = 0u64;
    BUF.with_borrow_mut(|buf| -> Result<(), Errno> {
        let want = usize::try_from(size_hint)
            .unwrap_or(READ_BUF)
            .clamp(4096, READ_BUF);
        if buf.len() < want {
            buf.resize(want, 0);
        }
        loop {
            let got = match offset {
                Some(off) => rustix::io::pread(fd, &mut buf[..want], off),
                None => rustix::io::read(fd, &mut buf[..want]),
            };
            let n = match got {
                Ok(n) => n,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(());
            }
            h.update(&buf[..n]);
            total += n as u64;
            if let Some(off) = offset.as_mut() {
                *off += n as u64;
            }
            count(n as u64);
        }
    })?;
    Ok((*h.finalize().as_bytes(), total))
}

/// Lower-case hex of a hash.
pub(crate) fn hex(h: &[u8; 32]) -> String {
    // blake3's table-driven encoder: every object path and every manifest
    // name is one of these, and `write!("{:02x}")` per byte showed in
    // checkout profiles.
    blake3::Hash::from_bytes(*h).to_hex().to_string()
}
