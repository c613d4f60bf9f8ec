//! The fanotify event records, parsed without trusting a single length.
//!
//! What `read(2)` on a fanotify descriptor returns is a run of records:
//! a 24-byte `struct fanotify_event_metadata` (`event_len`, `vers`,
//! `metadata_len`, `mask`, `fd`, `pid`) followed, for a group that reports
//! file handles (`FAN_REPORT_DFID_NAME`), by information records, each a
//! 4-byte header (`info_type`, `len`) and a body; a directory-and-name
//! record (`FAN_EVENT_INFO_TYPE_DFID_NAME`) holds the filesystem id, a
//! `struct file_handle` (`handle_bytes`, `handle_type`, the handle) and a
//! NUL-terminated name. See `fanotify(7)` and `fanotify_init(2)`.
//!
//! The kernel writes these, but the parser is written as if anyone did:
//! every length is checked against the bytes that remain before it is
//! used, a record shorter than its own header ends the parse with an
//! error, and a handle is at most [`MAX_HANDLE_SZ`] bytes, so the memory a
//! buffer can make it allocate is bounded by the buffer's own size. It is
//! plain safe code over a byte slice, shared by every platform, so it can
//! be fuzzed (`fuzz/fuzz_targets/fanotify.rs`) and tested anywhere.

/// `FAN_MODIFY`: a file was written.
pub const FAN_MODIFY: u64 = 0x0000_0002;
/// `FAN_CLOSE_WRITE`: a file opened for writing was closed.
pub const FAN_CLOSE_WRITE: u64 = 0x0000_0008;
/// `FAN_MOVED_TO`: a name was moved into a directory.
pub const FAN_MOVED_TO: u64 = 0x0000_0080;
/// `FAN_CREATE`: a name was created in a directory.
pub const FAN_CREATE: u64 = 0x0000_0100;
/// `FAN_Q_OVERFLOW`: the event queue overflowed; events were lost.
pub const FAN_Q_OVERFLOW: u64 = 0x0000_4000;
/// `FAN_ONDIR`: the event is about a directory.
pub const FAN_ONDIR: u64 = 0x4000_0000;

/// `FANOTIFY_METADATA_VERSION`: the record layout this parser reads.
pub const FANOTIFY_METADATA_VERSION: u8 = 3;
/// Size of `struct fanotify_event_metadata`.
pub const FAN_METADATA_LEN: usize = 24;
/// `MAX_HANDLE_SZ`: the largest file handle the kernel hands out.
pub const MAX_HANDLE_SZ: usize = 128;

/// `FAN_EVENT_INFO_TYPE_FID`.
const INFO_FID: u8 = 1;
/// `FAN_EVENT_INFO_TYPE_DFID_NAME`.
const INFO_DFID_NAME: u8 = 2;
/// `FAN_EVENT_INFO_TYPE_DFID`.
const INFO_DFID: u8 = 3;
/// `FAN_EVENT_INFO_TYPE_NEW_DFID_NAME` (with `FAN_RENAME`).
const INFO_NEW_DFID_NAME: u8 = 12;
/// Header (4) + `__kernel_fsid_t` (8) + `handle_bytes` and `handle_type` (8).
const FID_MIN_LEN: usize = 20;

/// What a fanotify mark covers (`fanotify_mark(2)`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanMark {
    /// `FAN_MARK_FILESYSTEM`: every object of the filesystem, through every
    /// mount of it.
    Filesystem,
    /// `FAN_MARK_MOUNT`: every object reached through one mount; no
    /// directory-entry events (`FAN_CREATE`, `FAN_MOVED_TO`).
    Mount,
    /// An inode mark: the object itself and, for a directory, its direct
    /// entries.
    Inode,
}

/// A file handle as `name_to_handle_at(2)` and fanotify give it: opaque
/// bytes and their type, to be opened with `open_by_handle_at(2)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileHandle {
    /// The filesystem id (`__kernel_fsid_t`, as `statfs` gives `f_fsid`).
    pub fsid: [i32; 2],
    /// `handle_type`.
    pub handle_type: i32,
    /// The handle's bytes (at most [`MAX_HANDLE_SZ`]).
    pub bytes: Vec<u8>,
}

/// One event of a group that reports directory handles and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanEvent {
    /// The event bits (`FAN_MODIFY`, `FAN_Q_OVERFLOW`, `FAN_ONDIR`, ...).
    pub mask: u64,
    /// The process (thread group) that caused it, as the kernel reports
    /// it (0 when it is not in this PID namespace).
    pub pid: i32,
    /// The descriptor of the event (`FAN_NOFD`, -1, in a group that
    /// reports handles). The Linux reader closes any other value.
    pub fd: i32,
    /// The directory the name is in (or the object itself, for an event
    /// with only a `FID` record).
    pub dir: Option<FileHandle>,
    /// The name in [`FanEvent::dir`] (no NUL; `.` for the directory
    /// itself). `None` when the event carried no name.
    pub name: Option<Vec<u8>>,
}

impl FanEvent {
    /// Whether the kernel dropped events before this one.
    pub fn overflow(&self) -> bool {
        self.mask & FAN_Q_OVERFLOW != 0
    }
}

/// Why a buffer of fanotify records could not be read to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanParseError {
    /// The record's `vers` is not [`FANOTIFY_METADATA_VERSION`].
    Version(u8),
    /// A record's lengths do not fit the bytes that hold it.
    Truncated,
    /// An information record is malformed (length, handle size, name).
    BadInfo,
}

impl std::fmt::Display for FanParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FanParseError::Version(v) => write!(f, "fanotify record of version {v}, not 3"),
            FanParseError::Truncated => f.write_str("fanotify record longer than the data read"),
            FanParseError::BadInfo => f.write_str("malformed fanotify information record"),
        }
    }
}

impl std::error::Error for FanParseError {}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Parse the records in `buf` (what one `read(2)` returned), appending
/// each event to `out`.
///
/// # Errors
/// At the first record that does not hold together; the events before it
/// are in `out`. The caller cannot know what the rest said, so it treats
/// the error as lost events (the watcher rescans).
pub fn parse_events(buf: &[u8], out: &mut Vec<FanEvent>) -> Result<(), FanParseError> {
    let mut at = 0;
    while at < buf.len() {
        let rest = &buf[at..];
        if rest.len() < FAN_METADATA_LEN {
            return Err(FanParseError::Truncated);
        }
        let event_len = u32_at(rest, 0).ok_or(FanParseError::Truncated)? as usize;
        let vers = rest[4];
        let metadata_len = u16_at(rest, 6).ok_or(FanParseError::Truncated)? as usize;
        if vers != FANOTIFY_METADATA_VERSION {
            return Err(FanParseError::Version(vers));
        }
        if metadata_len < FAN_METADATA_LEN || event_len < metadata_len || event_len > rest.len() {
            return Err(FanParseError::Truncated);
        }
        let rec = &rest[..event_len];
        let mut ev = FanEvent {
            mask: u64_at(rec, 8).ok_or(FanParseError::Truncated)?,
            fd: i32_at(rec, 16).ok_or(FanParseError::Truncated)?,
            pid: i32_at(rec, 20).ok_or(FanParseError::Truncated)?,
            dir: None,
            name: None,
        };
        parse_info(&rec[metadata_len..], &mut ev)?;
        out.push(ev);
        at += event_len;
    }
    Ok(())
}

/// The information records of one event (`infos`: the bytes after its
/// metadata, up to its `event_len`).
fn parse_info(mut infos: &[u8], ev: &mut FanEvent) -> Result<(), FanParseError> {
    while !infos.is_empty() {
        if infos.len() < 4 {
            return Err(FanParseError::BadInfo);
        }
        let info_type = infos[0];
        let len = u16_at(infos, 2).ok_or(FanParseError::BadInfo)? as usize;
        if len < 4 || len > infos.len() {
            return Err(FanParseError::BadInfo);
        }
        let body = &infos[..len];
        match info_type {
            INFO_DFID_NAME | INFO_DFID | INFO_FID | INFO_NEW_DFID_NAME => {
                let (handle, name) =
                    parse_fid(body, info_type != INFO_DFID && info_type != INFO_FID)?;
                // The first directory record names the object: a rename's
                // second (new) record, or a FID after a DFID, adds nothing
                // the watcher needs.
                if ev.dir.is_none() {
                    ev.dir = Some(handle);
                    ev.name = name;
                }
            }
            // Other records (pidfd, error, range, mount): not needed here.
            _ => {}
        }
        infos = &infos[len..];
    }
    Ok(())
}

/// A FID-type record `rec` (header included): its handle, and its name
/// when `named`.
fn parse_fid(rec: &[u8], named: bool) -> Result<(FileHandle, Option<Vec<u8>>), FanParseError> {
    if rec.len() < FID_MIN_LEN {
        return Err(FanParseError::BadInfo);
    }
    let bad = FanParseError::BadInfo;
    let fsid = [i32_at(rec, 4).ok_or(bad)?, i32_at(rec, 8).ok_or(bad)?];
    let handle_bytes = u32_at(rec, 12).ok_or(bad)? as usize;
    let handle_type = i32_at(rec, 16).ok_or(bad)?;
    if handle_bytes > MAX_HANDLE_SZ || handle_bytes > rec.len() - FID_MIN_LEN {
        return Err(bad);
    }
    let end = FID_MIN_LEN + handle_bytes;
    let handle = FileHandle {
        fsid,
        handle_type,
        bytes: rec[FID_MIN_LEN..end].to_vec(),
    };
    if !named {
        return Ok((handle, None));
    }
    // The name runs to its NUL; the record is padded after it.
    let tail = &rec[end..];
    let nul = tail.iter().position(|&b| b == 0).ok_or(bad)?;
    let name = &tail[..nul];
    if name.is_empty() || name.contains(&b'/') {
        return Err(bad);
    }
    Ok((handle, Some(name.to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the kernel lays it out.
    fn record(mask: u64, infos: &[Vec<u8>]) -> Vec<u8> {
        let info_len: usize = infos.iter().map(Vec::len).sum();
        let mut r = Vec::new();
        r.extend_from_slice(&((FAN_METADATA_LEN + info_len) as u32).to_ne_bytes());
        r.push(FANOTIFY_METADATA_VERSION);
        r.push(0);
        r.extend_from_slice(&(FAN_METADATA_LEN as u16).to_ne_bytes());
        r.extend_from_slice(&mask.to_ne_bytes());
        r.extend_from_slice(&(-1i32).to_ne_bytes());
        r.extend_from_slice(&1234i32.to_ne_bytes());
        for i in infos {
            r.extend_from_slice(i);
        }
        r
    }

    fn dfid_name(handle: &[u8], name: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&7i32.to_ne_bytes());
        body.extend_from_slice(&9i32.to_ne_bytes());
        body.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
        body.extend_from_slice(&0x81i32.to_ne_bytes());
        body.extend_from_slice(handle);
        body.extend_from_slice(name);
        body.push(0);
        while (body.len() + 4) % 4 != 0 {
            body.push(0);
        }
        let mut r = vec![INFO_DFID_NAME, 0];
        r.extend_from_slice(&((body.len() + 4) as u16).to_ne_bytes());
        r.extend_from_slice(&body);
        r
    }

    #[test]
    fn reads_a_named_event_and_an_overflow() {
        let mut buf = record(
            FAN_CLOSE_WRITE,
            &[dfid_name(&[1, 2, 3, 4, 5, 6, 7, 8], b"new.bin")],
        );
        buf.extend(record(FAN_Q_OVERFLOW, &[]));
        let mut out = Vec::new();
        parse_events(&buf, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].mask, FAN_CLOSE_WRITE);
        assert_eq!(out[0].pid, 1234);
        assert_eq!(out[0].name.as_deref(), Some(&b"new.bin"[..]));
        let h = out[0].dir.as_ref().unwrap();
        assert_eq!((h.fsid, h.handle_type, h.bytes.len()), ([7, 9], 0x81, 8));
        assert!(out[1].overflow() && out[1].dir.is_none());
    }

    #[test]
    fn refuses_lengths_that_do_not_fit() {
        let good = record(FAN_MODIFY, &[dfid_name(&[0; 8], b"a")]);
        let mut out = Vec::new();
        // Cut anywhere inside the record: an error, never a panic.
        for cut in 1..good.len() {
            out.clear();
            assert!(parse_events(&good[..cut], &mut out).is_err(), "cut {cut}");
            assert!(out.is_empty());
        }
        // event_len past the buffer, metadata_len too small.
        let mut long = good.clone();
        long[0..4].copy_from_slice(&(good.len() as u32 + 1).to_ne_bytes());
        assert_eq!(parse_events(&long, &mut out), Err(FanParseError::Truncated));
        let mut short = good.clone();
        short[6..8].copy_from_slice(&8u16.to_ne_bytes());
        assert_eq!(
            parse_events(&short, &mut out),
            Err(FanParseError::Truncated)
        );
        // A handle length larger than its record or than MAX_HANDLE_SZ.
        let mut big = good.clone();
        big[FAN_METADATA_LEN + 12..FAN_METADATA_LEN + 16].copy_from_slice(&200u32.to_ne_bytes());
        assert_eq!(parse_events(&big, &mut out), Err(FanParseError::BadInfo));
        // Another version.
        let mut v = good.clone();
        v[4] = 2;
        assert_eq!(parse_events(&v, &mut out), Err(FanParseError::Version(2)));
        // A name with a slash, or none.
        let slash = record(FAN_MODIFY, &[dfid_name(&[0; 8], b"a/b")]);
        assert_eq!(parse_events(&slash, &mut out), Err(FanParseError::BadInfo));
        assert!(parse_events(&good, &mut out).is_ok());
    }

    #[test]
    fn never_panics_on_generated_bytes() {
        // A small xorshift: every prefix and mutation of valid records.
        let base = [
            record(FAN_CLOSE_WRITE, &[dfid_name(&[3; 12], b"file")]),
            record(FAN_Q_OVERFLOW, &[]),
        ]
        .concat();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut out = Vec::new();
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = base.clone();
            let i = (x as usize) % b.len();
            b[i] = (x >> 32) as u8;
            let cut = ((x >> 40) as usize) % (b.len() + 1);
            out.clear();
            let _ = parse_events(&b[..cut], &mut out);
            assert!(out.len() <= 2);
            for e in &out {
                assert!(e
                    .dir
                    .as_ref()
                    .is_none_or(|h| h.bytes.len() <= MAX_HANDLE_SZ));
            }
        }
    }

    #[test]
    fn the_fuzz_seeds_parse_whole() {
        // The corpus fuzz/fanotify starts from: records as the kernel
        // writes them, each parsed to its end.
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/fanotify");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let bytes = std::fs::read(e.unwrap().path()).unwrap();
            let mut out = Vec::new();
            assert_eq!(parse_events(&bytes, &mut out), Ok(()));
            assert!(!out.is_empty());
            n += 1;
        }
        assert!(n >= 4, "{n} seeds in {}", dir.display());
    }
}
