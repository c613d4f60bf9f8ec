//! Carrying metadata from a source file to its copy.
//!
//! A clone (FICLONE) copies data only. Permission bits are always carried:
//! the destination is created with the source's bits and the umask applies,
//! as `cp` does, so an executable stays executable. [`Preserve`] adds the
//! exact mode (set-id and sticky bits, no umask), ownership, nanosecond
//! timestamps and extended attributes (which include POSIX ACLs).
//!
//! Order matters and is fixed here: owner first (chown clears set-id bits
//! and file capabilities), then xattrs, then mode (an ACL write changes the
//! group bits), then times last (every other change touches ctime only, but
//! data writes would move mtime).

#[cfg(unix)]
use cowlink_sys::Stat;
#[cfg(unix)]
use rustix::fd::BorrowedFd;
#[cfg(unix)]
use rustix::fs::{self, Gid, Timespec, Timestamps, Uid};
#[cfg(unix)]
use rustix::io::Errno;

/// Which metadata to carry beyond the permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Preserve {
    /// Exact mode bits, including set-id and sticky, ignoring the umask.
    pub mode: bool,
    /// Owner and group (needs privileges; without them only the group is
    /// attempted and a refusal is ignored, as `cp -p` does).
    pub ownership: bool,
    /// Access and modification times, to the nanosecond.
    pub timestamps: bool,
    /// Extended attributes, including POSIX ACLs and security labels.
    pub xattrs: bool,
}

impl Preserve {
    /// Nothing beyond the permission bits (`cp`'s default).
    pub const NONE: Preserve = Preserve {
        mode: false,
        ownership: false,
        timestamps: false,
        xattrs: false,
    };
    /// `cp -p`: mode, ownership, timestamps.
    pub const P: Preserve = Preserve {
        mode: true,
        ownership: true,
        timestamps: true,
        xattrs: false,
    };
    /// `cp -a`: everything.
    pub const ALL: Preserve = Preserve {
        mode: true,
        ownership: true,
        timestamps: true,
        xattrs: true,
    };
}

/// A metadata step that failed, for the error message.
#[derive(Debug)]
#[cfg(unix)]
pub(crate) struct MetaError {
    pub(crate) what: String,
    pub(crate) errno: Errno,
}

#[cfg(unix)]
fn fail(what: impl Into<String>) -> impl FnOnce(Errno) -> MetaError {
    move |errno| MetaError {
        what: what.into(),
        errno,
    }
}

/// Apply `preserve` from `src` (with its `st`) to the open file `dst`.
#[cfg(unix)]
pub(crate) fn apply(
    src: BorrowedFd<'_>,
    st: &Stat,
    dst: BorrowedFd<'_>,
    preserve: Preserve,
) -> Result<(), MetaError> {
    apply_with_mode(
        src,
        st,
        dst,
        preserve,
        preserve.mode.then_some(st.st_mode & 0o7777),
    )
}

/// What a file we just created has already: its owner and mode. Steps
/// that would set the same values again are skipped (a tree copy saves
/// two system calls per file this way).
#[derive(Debug, Clone, Copy)]
#[cfg(unix)]
pub(crate) struct Created {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mode: u32,
}

#[cfg(unix)]
impl Created {
    /// What `open(O_CREAT)` gives a file made with `mode` in a directory
    /// whose new files get group `gid`, if the umask is known.
    pub(crate) fn predict(mode: u32, gid: u32) -> Option<Created> {
        static EUID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        Some(Created {
            uid: *EUID.get_or_init(|| rustix::process::geteuid().as_raw()),
            gid,
            mode: (mode & 0o777 & !umask()?) | (mode & crate::prim::place::UNFINISHED_MARK),
        })
    }
}

/// Clear the unfinished mark of a file whose mode is otherwise final.
#[cfg(unix)]
pub(crate) fn clear_mark(dst: BorrowedFd<'_>) -> Result<(), MetaError> {
    let st = cowlink_sys::fstat(dst).map_err(fail("read the mode"))?;
    let mode = st.st_mode & 0o7777 & !crate::prim::place::UNFINISHED_MARK;
    fs::fchmod(dst, cowlink_sys::raw_mode(mode)).map_err(fail("set the mode"))
}

/// Like [`apply`] for a file just created with the properties `created`.
#[cfg(unix)]
pub(crate) fn apply_created(
    src: BorrowedFd<'_>,
    st: &Stat,
    dst: BorrowedFd<'_>,
    preserve: Preserve,
    created: Created,
) -> Result<(), MetaError> {
    // chown as root keeps the mode unless set-id bits are involved; those
    // never match `created.mode` (creation drops them), so mode is set then.
    let chown_needed = preserve.ownership && (st.st_uid, st.st_gid) != (created.uid, created.gid);
    let mut mode = preserve.mode.then_some(st.st_mode & 0o7777);
    if mode.is_none() && created.mode & crate::prim::place::UNFINISHED_MARK != 0 {
        // Created with the mark of an unfinished file: the final mode
        // clears it.
        mode = Some(created.mode & !crate::prim::place::UNFINISHED_MARK);
    }
    if mode == Some(created.mode) {
        mode = None;
    }
    if chown_needed {
        let keep = chown(dst, st)?;
        mode = mode.map(|m| m & !(0o6000 & !keep));
    }
    if preserve.xattrs && copy_xattrs(src, dst)? && preserve.mode {
        // An ACL may have changed the group bits: set the mode after all.
        mode = Some(st.st_mode & 0o7777);
    } else if !preserve.xattrs && preserve.mode && copy_acls(src, dst)? {
        mode = Some(st.st_mode & 0o7777);
    }
    if let Some(mode) = mode {
        fs::fchmod(dst, cowlink_sys::raw_mode(mode)).map_err(fail("set the mode"))?;
    }
    if preserve.timestamps {
        fs::futimens(dst, &times_of(st)).map_err(fail("preserve timestamps"))?;
    }
    Ok(())
}

/// The permission bits a copy of a file of mode `st_mode` is created with
/// (the umask then applies): the source's, or with `default_mode` those
/// any new file (`0666`) or directory or socket (`0777`) gets.
#[cfg(unix)]
pub(crate) fn creation_bits(st_mode: u32, default_mode: bool) -> u32 {
    if !default_mode {
        return st_mode & 0o777;
    }
    match cowlink_sys::file_type(st_mode) {
        fs::FileType::Directory | fs::FileType::Socket => 0o777,
        _ => 0o666,
    }
}

/// The process umask, read once through the platform layer (reading it
/// with umask(2) would change it for a moment under other threads);
/// `None` where the platform cannot tell.
#[cfg(unix)]
pub(crate) fn umask() -> Option<u32> {
    static UMASK: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UMASK.get_or_init(cowlink_sys::umask)
}

/// Give `dst` the owner and group of `st`. Returns the set-id bits that
/// may stay: as cp does, a file whose owner (or group) could not be kept
/// loses its set-user-ID (set-group-ID) bit, so nobody gains a privilege
/// by copying.
#[cfg(unix)]
fn chown(dst: BorrowedFd<'_>, st: &Stat) -> Result<u32, MetaError> {
    let uid = Uid::from_raw(st.st_uid);
    let gid = Gid::from_raw(st.st_gid);
    match fs::fchown(dst, Some(uid), Some(gid)) {
        Ok(()) => Ok(0o6000),
        Err(Errno::PERM) if !rustix::process::geteuid().is_root() => {
            // Like cp -p: try the group alone, ignore a refusal.
            Ok(match fs::fchown(dst, None, Some(gid)) {
                Ok(()) => 0o2000,
                Err(_) => 0,
            })
        }
        Err(e) => Err(fail("preserve ownership")(e)),
    }
}

/// Like [`apply`], with the mode to set (if any) given by the caller: a
/// directory copy may need its mode restored even when modes are not
/// preserved (it was opened up to work inside).
#[cfg(unix)]
pub(crate) fn apply_with_mode(
    src: BorrowedFd<'_>,
    st: &Stat,
    dst: BorrowedFd<'_>,
    preserve: Preserve,
    mode: Option<u32>,
) -> Result<(), MetaError> {
    let mut mode = mode;
    if preserve.ownership {
        let keep = chown(dst, st)?;
        mode = mode.map(|m| m & !(0o6000 & !keep));
    }
    if preserve.xattrs {
        copy_xattrs(src, dst)?;
    } else if preserve.mode {
        copy_acls(src, dst)?;
    }
    if let Some(mode) = mode {
        fs::fchmod(dst, cowlink_sys::raw_mode(mode)).map_err(fail("set the mode"))?;
    }
    if preserve.timestamps {
        fs::futimens(dst, &times_of(st)).map_err(fail("preserve timestamps"))?;
    }
    Ok(())
}

/// A stat's access and modification times, to the nanosecond.
#[cfg(unix)]
pub(crate) fn times_of(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    }
}

/// Copy every extended attribute of `src` to `dst`; says whether there
/// were any.
#[cfg(unix)]
fn copy_xattrs(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<bool, MetaError> {
    copy_xattrs_matching(src, dst, |_| true)
}

/// Copy the POSIX ACLs only (`cp -p`: an ACL is part of the mode);
/// a filesystem without them has none to copy.
#[cfg(unix)]
fn copy_acls(src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> Result<bool, MetaError> {
    match copy_xattrs_matching(src, dst, is_acl) {
        Err(m) if m.errno == Errno::OPNOTSUPP => Ok(false),
        r => r,
    }
}

/// The POSIX ACL attributes: part of the mode for `cp -p`, which carries
/// them without `--preserve=xattr`.
#[cfg(unix)]
fn is_acl(name: &[u8]) -> bool {
    cowlink_sys::is_acl_xattr(name)
}

/// Copy the extended attributes of `src` whose names `keep` accepts.
#[cfg(unix)]
fn copy_xattrs_matching(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<bool, MetaError> {
    let names = match list_xattrs(src) {
        Ok(n) => n,
        // The source filesystem has no xattrs at all: nothing to carry.
        Err(Errno::OPNOTSUPP) => return Ok(false),
        Err(e) => return Err(fail("list extended attributes")(e)),
    };
    if names.is_empty() {
        return Ok(false);
    }
    let mut any = false;
    for name in names
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty() && keep(n))
    {
        any = true;
        let shown = String::from_utf8_lossy(name).into_owned();
        let cname = std::ffi::CString::new(name).expect("xattr names have no NUL");
        let value =
            get_xattr(src, &cname).map_err(fail(format!("read extended attribute '{shown}'")))?;
        match cowlink_sys::set_xattr(dst, &cname, &value) {
            Ok(()) => {}
            Err(e) => return Err(fail(format!("preserve extended attribute '{shown}'"))(e)),
        }
    }
    Ok(any)
}

#[cfg(unix)]
pub(crate) fn list_xattrs(fd: BorrowedFd<'_>) -> Result<Vec<u8>, Errno> {
    // Most files have no or few attributes: one call with a small buffer,
    // asking for the size only when it is too small.
    let mut buf = vec![0u8; 256];
    match cowlink_sys::list_xattrs(fd, &mut buf[..]) {
        Ok(got) => {
            buf.truncate(got);
            return Ok(buf);
        }
        Err(Errno::RANGE) => {}
        Err(e) => return Err(e),
    }
    loop {
        let n = cowlink_sys::list_xattrs_len(fd)?;
        let mut buf = vec![0u8; n];
        match cowlink_sys::list_xattrs(fd, &mut buf[..]) {
            Ok(got) => {
                buf.truncate(got);
                return Ok(buf);
            }
            Err(Errno::RANGE) => continue, // grew between the calls
            Err(e) => return Err(e),
        }
    }
}

#[cfg(unix)]
pub(crate) fn get_xattr(fd: BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<Vec<u8>, Errno> {
    loop {
        let n = cowlink_sys::get_xattr_len(fd, name)?;
        let mut buf = vec![0u8; n];
        match cowlink_sys::get_xattr(fd, name, &mut buf[..]) {
            Ok(got) => {
                buf.truncate(got);
                return Ok(buf);
            }
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
}
