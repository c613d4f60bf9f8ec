//! Windows: the few calls the core's file-level operations need, on
//! handles (`std::fs::File`) rather than descriptors.
//!
//! Windows has no `openat` family, no `FICLONE` and no errno, so the
//! descriptor-based functions of `linux.rs` and `portable.rs` do not exist
//! here; the core builds its Windows file operations on `std::fs` and asks
//! this module only for:
//! - [`Errno`]: the POSIX error numbers the core classifies (with Linux's
//!   values, so a JSON report carries the same number on every system),
//!   translated from the Win32 codes `std::io::Error` carries;
//! - [`clone_file_data`] and [`clone_file_range`]:
//!   `FSCTL_DUPLICATE_EXTENTS_TO_FILE`, the block-sharing clone of ReFS
//!   and Dev Drives. Elsewhere (NTFS, FAT, network shares) the volume
//!   refuses it and the answer is `EOPNOTSUPP`, so `auto` copies;
//! - [`scratch_file`]: a file the system removes when it is closed, for
//!   the probe's trials;
//! - [`open_for_times`]: a handle to set a directory's times through;
//! - [`fs_stat_path`]: the volume's file system name and cluster size.
//!
//! Not here, and so not in the core on Windows: dedupe, FIEMAP, the Btrfs
//! look-ups, OFD locks, `O_TMPFILE`, extended attributes, the mount table.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::path::Path;

use windows_sys::Win32::Foundation as w;
use windows_sys::Win32::Storage::FileSystem::{
    GetDiskFreeSpaceW, GetVolumeInformationW, GetVolumePathNameW, DELETE,
    FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_DELETE_ON_CLOSE, FILE_WRITE_ATTRIBUTES,
};
use windows_sys::Win32::System::Ioctl::{
    DUPLICATE_EXTENTS_DATA, FSCTL_DUPLICATE_EXTENTS_TO_FILE, FSCTL_GET_INTEGRITY_INFORMATION,
    FSCTL_GET_INTEGRITY_INFORMATION_BUFFER,
};
use windows_sys::Win32::System::IO::DeviceIoControl;

use crate::types::FsStat;

/// A POSIX error number, as the core classifies errors on every platform.
///
/// The numbers are Linux's, so that a report's `errno` field means the same
/// on every system; [`Errno::from_io_error`] translates the Win32 codes a
/// `std::io::Error` carries on Windows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(i32);

macro_rules! errnos {
    ($($name:ident = $n:literal, $text:literal;)*) => {
        impl Errno {
            $(
                #[doc = concat!("`E", stringify!($name), "`: ", $text, ".")]
                pub const $name: Errno = Errno($n);
            )*

            fn text(self) -> Option<&'static str> {
                match self.0 {
                    $($n => Some($text),)*
                    _ => None,
                }
            }
        }
    };
}

errnos! {
    PERM = 1, "operation not permitted";
    NOENT = 2, "no such file or directory";
    INTR = 4, "interrupted system call";
    IO = 5, "input/output error";
    NXIO = 6, "no such device or address";
    BADF = 9, "bad file descriptor";
    AGAIN = 11, "resource temporarily unavailable";
    NOMEM = 12, "cannot allocate memory";
    ACCESS = 13, "permission denied";
    BUSY = 16, "device or resource busy";
    EXIST = 17, "file exists";
    XDEV = 18, "invalid cross-device link";
    NODEV = 19, "no such device";
    NOTDIR = 20, "not a directory";
    ISDIR = 21, "is a directory";
    INVAL = 22, "invalid argument";
    MFILE = 24, "too many open files";
    NOTTY = 25, "inappropriate ioctl for device";
    TXTBSY = 26, "text file busy";
    FBIG = 27, "file too large";
    NOSPC = 28, "no space left on device";
    ROFS = 30, "read-only file system";
    MLINK = 31, "too many links";
    PIPE = 32, "broken pipe";
    NAMETOOLONG = 36, "file name too long";
    NOSYS = 38, "function not implemented";
    NOTEMPTY = 39, "directory not empty";
    LOOP = 40, "too many levels of symbolic links";
    OVERFLOW = 75, "value too large for defined data type";
    OPNOTSUPP = 95, "operation not supported";
    STALE = 116, "stale file handle";
    DQUOT = 122, "disk quota exceeded";
    CANCELED = 125, "operation canceled";
}

impl Errno {
    /// The errno with this (Linux) number.
    pub const fn from_raw_os_error(raw: i32) -> Errno {
        Errno(raw)
    }

    /// This errno's (Linux) number.
    pub const fn raw_os_error(self) -> i32 {
        self.0
    }

    /// The errno an I/O error stands for: its Win32 code translated, or
    /// its kind where the code has no POSIX counterpart. `None` for an
    /// error without either (a custom error of kind `Other`).
    pub fn from_io_error(e: &io::Error) -> Option<Errno> {
        if let Some(code) = e.raw_os_error() {
            if let Some(n) = from_win32(code as u32) {
                return Some(n);
            }
        }
        from_kind(e.kind())
    }

    /// The `std::io::ErrorKind` of this errno.
    pub fn kind(self) -> io::ErrorKind {
        io::Error::from(self).kind()
    }
}

/// The Win32 codes with a POSIX counterpart the core distinguishes.
fn from_win32(code: u32) -> Option<Errno> {
    Some(match code {
        w::ERROR_FILE_NOT_FOUND | w::ERROR_PATH_NOT_FOUND | w::ERROR_INVALID_DRIVE => Errno::NOENT,
        w::ERROR_ACCESS_DENIED => Errno::ACCESS,
        w::ERROR_PRIVILEGE_NOT_HELD => Errno::PERM,
        w::ERROR_FILE_EXISTS | w::ERROR_ALREADY_EXISTS => Errno::EXIST,
        w::ERROR_DIR_NOT_EMPTY => Errno::NOTEMPTY,
        w::ERROR_DIRECTORY => Errno::NOTDIR,
        w::ERROR_NOT_SAME_DEVICE => Errno::XDEV,
        w::ERROR_DISK_FULL | w::ERROR_HANDLE_DISK_FULL => Errno::NOSPC,
        w::ERROR_WRITE_PROTECT => Errno::ROFS,
        w::ERROR_SHARING_VIOLATION | w::ERROR_LOCK_VIOLATION => Errno::BUSY,
        w::ERROR_INVALID_NAME | w::ERROR_INVALID_PARAMETER => Errno::INVAL,
        w::ERROR_FILENAME_EXCED_RANGE => Errno::NAMETOOLONG,
        w::ERROR_TOO_MANY_OPEN_FILES => Errno::MFILE,
        w::ERROR_NOT_ENOUGH_MEMORY | w::ERROR_OUTOFMEMORY => Errno::NOMEM,
        w::ERROR_INVALID_FUNCTION | w::ERROR_NOT_SUPPORTED | w::ERROR_CALL_NOT_IMPLEMENTED => {
            Errno::OPNOTSUPP
        }
        w::ERROR_CANT_RESOLVE_FILENAME => Errno::LOOP,
        w::ERROR_OPERATION_ABORTED => Errno::CANCELED,
        w::ERROR_CRC | w::ERROR_IO_DEVICE => Errno::IO,
        _ => return None,
    })
}

fn from_kind(kind: io::ErrorKind) -> Option<Errno> {
    use io::ErrorKind as K;
    Some(match kind {
        K::NotFound => Errno::NOENT,
        K::PermissionDenied => Errno::ACCESS,
        K::AlreadyExists => Errno::EXIST,
        K::InvalidInput => Errno::INVAL,
        K::Interrupted => Errno::INTR,
        K::Unsupported => Errno::OPNOTSUPP,
        K::OutOfMemory => Errno::NOMEM,
        K::IsADirectory => Errno::ISDIR,
        K::NotADirectory => Errno::NOTDIR,
        K::DirectoryNotEmpty => Errno::NOTEMPTY,
        K::StorageFull => Errno::NOSPC,
        K::ReadOnlyFilesystem => Errno::ROFS,
        K::CrossesDevices => Errno::XDEV,
        K::FileTooLarge => Errno::FBIG,
        K::ResourceBusy => Errno::BUSY,
        _ => return None,
    })
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Errno({}, {:?})",
            self.0,
            self.text().unwrap_or("unknown")
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.text() {
            Some(t) => f.write_str(t),
            None => write!(f, "error {}", self.0),
        }
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> io::Error {
        use io::ErrorKind as K;
        let kind = match e {
            Errno::NOENT => K::NotFound,
            Errno::ACCESS | Errno::PERM => K::PermissionDenied,
            Errno::EXIST => K::AlreadyExists,
            Errno::INVAL => K::InvalidInput,
            Errno::INTR => K::Interrupted,
            Errno::OPNOTSUPP | Errno::NOSYS | Errno::NOTTY => K::Unsupported,
            Errno::NOMEM => K::OutOfMemory,
            Errno::ISDIR => K::IsADirectory,
            Errno::NOTDIR => K::NotADirectory,
            Errno::NOTEMPTY => K::DirectoryNotEmpty,
            Errno::NOSPC | Errno::DQUOT => K::StorageFull,
            Errno::ROFS => K::ReadOnlyFilesystem,
            Errno::XDEV => K::CrossesDevices,
            Errno::FBIG => K::FileTooLarge,
            Errno::BUSY => K::ResourceBusy,
            _ => K::Other,
        };
        io::Error::new(kind, e.to_string())
    }
}

/// Whether this platform has a clone call at all. `None`: Windows has one
/// (`FSCTL_DUPLICATE_EXTENTS_TO_FILE`), and whether a pair of files clones
/// is the volume's answer (ReFS and Dev Drives yes, NTFS no).
pub const CLONE_UNAVAILABLE: Option<&str> = None;

/// `s` as a NUL-terminated UTF-16 string, for the wide Win32 calls.
fn wide(s: &std::ffi::OsStr) -> Vec<u16> {
    use std::os::windows::ffi::OsStrExt;
    s.encode_wide().chain(std::iter::once(0)).collect()
}

/// The volume `path` is on: its file system's name (`NTFS`, `ReFS`,
/// `FAT32`) from `GetVolumeInformationW` and its cluster size from
/// `GetDiskFreeSpaceW`, both asked of the volume's root
/// (`GetVolumePathNameW`, so a volume mounted in a folder answers for
/// itself). No magic number: Windows names file systems.
pub fn fs_stat_path(path: &Path) -> Result<FsStat, Errno> {
    std::fs::metadata(path).map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    let name = wide(path.as_os_str());
    let mut root = [0u16; 1024];
    // SAFETY: `name` is NUL-terminated; `root` is a local buffer whose
    // length in characters is passed.
    if unsafe { GetVolumePathNameW(name.as_ptr(), root.as_mut_ptr(), root.len() as u32) } == 0 {
        return Err(last_error());
    }
    let mut fs_name = [0u16; 64];
    let (mut serial, mut max_component, mut flags) = (0u32, 0u32, 0u32);
    // SAFETY: `root` was NUL-terminated by the call above; the name
    // buffer is a local whose length in characters is passed; the volume
    // label is not asked for (null, length 0).
    let ok = unsafe {
        GetVolumeInformationW(
            root.as_ptr(),
            std::ptr::null_mut(),
            0,
            &mut serial,
            &mut max_component,
            &mut flags,
            fs_name.as_mut_ptr(),
            fs_name.len() as u32,
        )
    };
    let type_name = (ok != 0).then(|| {
        let end = fs_name
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(fs_name.len());
        String::from_utf16_lossy(&fs_name[..end]).to_lowercase()
    });
    let (mut per_cluster, mut sector, mut free, mut total) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: as above; the four outputs are locals.
    let ok = unsafe {
        GetDiskFreeSpaceW(
            root.as_ptr(),
            &mut per_cluster,
            &mut sector,
            &mut free,
            &mut total,
        )
    };
    let block_size = if ok != 0 {
        u64::from(per_cluster) * u64::from(sector)
    } else {
        0
    };
    Ok(FsStat {
        magic: None,
        type_name,
        // 4 KiB, the default cluster of NTFS and ReFS, where the volume
        // does not say.
        block_size: if block_size == 0 { 4096 } else { block_size },
    })
}

/// Most bytes one `FSCTL_DUPLICATE_EXTENTS_TO_FILE` call may share: ReFS
/// refuses 4 GiB and more in one request.
const DUPLICATE_MAX: u64 = 1 << 31;

fn last_error() -> Errno {
    let e = io::Error::last_os_error();
    Errno::from_io_error(&e).unwrap_or(Errno::IO)
}

/// The cluster size of the ReFS volume `file` is on
/// (`FSCTL_GET_INTEGRITY_INFORMATION`): the unit a clone must be aligned
/// to. `EOPNOTSUPP` on volumes without block cloning (NTFS answers
/// `ERROR_INVALID_FUNCTION`).
pub fn clone_cluster_size(file: &File) -> Result<u64, Errno> {
    let mut info = FSCTL_GET_INTEGRITY_INFORMATION_BUFFER::default();
    let mut returned = 0u32;
    // SAFETY: the handle is open for the call's duration (borrowed from
    // `file`); the output buffer is a local of the size passed; no
    // overlapped I/O.
    let ok = unsafe {
        DeviceIoControl(
            file.as_raw_handle(),
            FSCTL_GET_INTEGRITY_INFORMATION,
            std::ptr::null(),
            0,
            (&raw mut info).cast(),
            std::mem::size_of_val(&info) as u32,
            &mut returned,
            std::ptr::null_mut(),
        )
    };
    if ok == 0 {
        return Err(last_error());
    }
    Ok(u64::from(info.ClusterSizeInBytes).max(1))
}

/// `FSCTL_DUPLICATE_EXTENTS_TO_FILE`: `dst` shares `src`'s blocks for
/// `len` bytes from `src_offset`, at `dst_offset`. Offsets and length
/// must be multiples of the volume's cluster size ([`clone_cluster_size`]),
/// `dst` must already be as long as the range's end, and both files on the
/// same ReFS volume. `EOPNOTSUPP` where the volume cannot clone, `EXDEV`
/// across volumes, `EINVAL` for an unaligned range.
pub fn clone_file_range(
    dst: &File,
    src: &File,
    src_offset: u64,
    len: u64,
    dst_offset: u64,
) -> Result<(), Errno> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(DUPLICATE_MAX);
        let (Ok(so), Ok(to), Ok(count)) = (
            i64::try_from(src_offset + done),
            i64::try_from(dst_offset + done),
            i64::try_from(n),
        ) else {
            return Err(Errno::FBIG);
        };
        let data = DUPLICATE_EXTENTS_DATA {
            FileHandle: src.as_raw_handle(),
            SourceFileOffset: so,
            TargetFileOffset: to,
            ByteCount: count,
        };
        let mut returned = 0u32;
        // SAFETY: both handles are open for the call's duration (borrowed
        // from the `File`s); the input is a local of the size passed; no
        // output buffer, no overlapped I/O.
        let ok = unsafe {
            DeviceIoControl(
                dst.as_raw_handle(),
                FSCTL_DUPLICATE_EXTENTS_TO_FILE,
                (&raw const data).cast(),
                std::mem::size_of_val(&data) as u32,
                std::ptr::null_mut(),
                0,
                &mut returned,
                std::ptr::null_mut(),
            )
        };
        if ok == 0 {
            return Err(last_error());
        }
        done += n;
    }
    Ok(())
}

/// Clone all of `src` (`len` bytes) into the empty file `dst`: set its
/// length, then share the blocks cluster by cluster. The last cluster is
/// shared whole (ReFS accepts a range that ends in the source's last,
/// partial cluster) and the length set first keeps `dst` exactly `len`
/// bytes long. On an error `dst` may hold part of the data: the caller
/// removes it.
pub fn clone_file_data(dst: &File, src: &File, len: u64) -> Result<(), Errno> {
    let cluster = clone_cluster_size(src)?;
    dst.set_len(len)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
    if len == 0 {
        return Ok(());
    }
    clone_file_range(dst, src, 0, len.div_ceil(cluster) * cluster, 0)
}

/// A new scratch file `name` in `dir`, removed by the system when its
/// handle closes (`FILE_FLAG_DELETE_ON_CLOSE`), so a trial leaves nothing
/// behind even if the process dies: Windows' counterpart of `O_TMPFILE`.
/// `EEXIST` when the name is taken.
pub fn scratch_file(dir: &Path, name: &str) -> Result<File, Errno> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .access_mode(w::GENERIC_READ | w::GENERIC_WRITE | DELETE)
        .custom_flags(FILE_FLAG_DELETE_ON_CLOSE)
        .open(dir.join(name))
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
}

/// `path` (a file or a directory) opened only to set its attributes and
/// times (`FILE_WRITE_ATTRIBUTES`; `FILE_FLAG_BACKUP_SEMANTICS`, without
/// which Windows opens no directory).
pub fn open_for_times(path: &Path) -> Result<File, Errno> {
    std::fs::OpenOptions::new()
        .access_mode(FILE_WRITE_ATTRIBUTES)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
        .open(path)
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn win32_codes_become_the_posix_numbers_the_core_classifies() {
        let of = |code: i32| Errno::from_io_error(&io::Error::from_raw_os_error(code));
        assert_eq!(of(2), Some(Errno::NOENT)); // ERROR_FILE_NOT_FOUND
        assert_eq!(of(3), Some(Errno::NOENT)); // ERROR_PATH_NOT_FOUND
        assert_eq!(of(5), Some(Errno::ACCESS));
        assert_eq!(of(17), Some(Errno::XDEV)); // ERROR_NOT_SAME_DEVICE
        assert_eq!(of(80), Some(Errno::EXIST)); // ERROR_FILE_EXISTS
        assert_eq!(of(183), Some(Errno::EXIST)); // ERROR_ALREADY_EXISTS
        assert_eq!(of(1), Some(Errno::OPNOTSUPP)); // ERROR_INVALID_FUNCTION
        assert_eq!(of(50), Some(Errno::OPNOTSUPP)); // ERROR_NOT_SUPPORTED
        assert_eq!(of(112), Some(Errno::NOSPC)); // ERROR_DISK_FULL
        assert_eq!(of(145), Some(Errno::NOTEMPTY));
        assert_eq!(of(32), Some(Errno::BUSY)); // ERROR_SHARING_VIOLATION
        let custom = io::Error::new(io::ErrorKind::NotFound, "gone");
        assert_eq!(Errno::from_io_error(&custom), Some(Errno::NOENT));
        assert_eq!(Errno::from_io_error(&io::Error::other("?")), None);
    }

    #[test]
    fn errnos_read_and_convert_as_on_linux() {
        assert_eq!(Errno::NOENT.raw_os_error(), 2);
        assert_eq!(Errno::OPNOTSUPP.raw_os_error(), 95);
        assert_eq!(Errno::NOENT.to_string(), "no such file or directory");
        assert_eq!(Errno::XDEV.kind(), io::ErrorKind::CrossesDevices);
        assert_eq!(io::Error::from(Errno::EXIST).to_string(), "file exists");
        assert_eq!(Errno::from_raw_os_error(9999).to_string(), "error 9999");
    }

    #[test]
    fn scratch_files_vanish_on_close_and_names_stay_unique() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = scratch_file(dir.path(), "s").unwrap();
        io::Write::write_all(&mut f, b"data").unwrap();
        assert_eq!(scratch_file(dir.path(), "s").unwrap_err(), Errno::EXIST);
        drop(f);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn directory_times_are_set_through_a_handle() {
        let dir = tempfile::tempdir().unwrap();
        let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        open_for_times(dir.path())
            .unwrap()
            .set_modified(when)
            .unwrap();
        assert_eq!(
            std::fs::metadata(dir.path()).unwrap().modified().unwrap(),
            when
        );
    }

    #[test]
    fn volume_facts_name_the_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let st = fs_stat_path(dir.path()).unwrap();
        assert!(st.block_size.is_power_of_two(), "{st:?}");
        assert!(
            st.type_name.as_ref().is_some_and(|n| !n.is_empty()),
            "{st:?}"
        );
        assert_eq!(
            fs_stat_path(&dir.path().join("missing")).unwrap_err(),
            Errno::NOENT
        );
    }
}
