//! The one place where a file an image operation touches is opened, and
//! the one place where a name an image carries becomes a path.
//!
//! Images are untrusted: a guest writes the bytes of its raw disk, and a
//! raw disk whose first cluster looks like a qcow2 header would, if it
//! were parsed as qcow2, name any host file as its "backing file" and have
//! `convert` copy it into the output. So:
//!
//! - **Files** ([`open_node`]): opened without blocking (`O_NONBLOCK`: a
//!   FIFO cannot hang the command) and accepted only as a regular file or
//!   a block device, checked on the opened descriptor. A block device's
//!   length is its size (`lseek(SEEK_END)`), not `st_size` (0). Every file
//!   takes QEMU's locks ([`super::lock`]) for the duration.
//! - **Names** ([`plain_name`]): a backing file or external data file name
//!   must be a plain file name. `json:` and every protocol prefix
//!   (`nbd:`, `file:`, `http:`: a `:` before the first `/`, as QEMU's
//!   `path_has_protocol` reads it) are refused; relative names are
//!   relative to the image's directory.
//! - **Formats** ([`Format`]): a declared backing format is obeyed (a
//!   backing declared raw is raw, whatever its bytes say). Only a name
//!   without a declared format is probed, and an image found to be qcow2
//!   by probing is not trusted with names of its own: a backing file or an
//!   external data file in it is refused.
//! - **Depth**: at most [`MAX_DEPTH`] images in a chain, and none twice
//!   (same device and inode).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self, FileType, Mode, OFlags, SeekFrom};
use rustix::io::Errno;

use super::lock::{self, Access, Held};
use super::qcow2::{self, Qcow2};
use crate::ground::error::{Error, ErrorKind, Operation};
use crate::name::quoted;

/// The longest backing chain read (QEMU has no fixed limit; real chains
/// are a few images deep).
pub const MAX_DEPTH: usize = 64;

/// What kind of file an image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A regular file.
    File,
    /// A block device (an LVM volume, a partition, a loop device).
    Block,
}

/// An opened image file: regular or a block device, locked.
#[derive(Debug)]
pub struct Node {
    /// The path it was opened by.
    pub path: PathBuf,
    /// The open file (its locks live as long as it does).
    pub file: File,
    /// Regular file or block device.
    pub kind: NodeKind,
    /// Its length in bytes (a device's size).
    pub len: u64,
    /// Device and inode, to tell files apart.
    pub id: (u64, u64),
    /// QEMU's locks held on it (none on a filesystem without OFD locks).
    pub lock: Option<Held>,
}

fn io_err(path: &Path) -> impl Fn(Errno) -> Error + '_ {
    move |e| Error::from_errno(Operation::Image, e).with_src(path)
}

/// Open `path` (`what` says what it is, for messages) for reading, or for
/// reading and writing with `write`, and take QEMU's locks for `access`.
/// Only a regular file or a block device is accepted; anything else (a
/// FIFO, a character device, a socket, a directory) is `NotRegularFile`
/// or `IsDirectory` and is never read. A block device opened for writing
/// is opened exclusively (`O_EXCL`: refused while mounted or held by the
/// kernel).
pub fn open_node(path: &Path, what: &str, write: bool, access: Access) -> Result<Node, Error> {
    let e = io_err(path);
    // Look before opening: opening some devices has effects (a tape
    // rewinds, a terminal becomes ours); a FIFO is harmless with O_NONBLOCK
    // but is refused all the same.
    let st = cowlink_sys::stat(path).map_err(|x| match x {
        Errno::NOENT => e(x).with_reason(format!("the {what} does not exist")),
        _ => e(x),
    })?;
    check_type(path, what, st.st_mode)?;
    let is_block = cowlink_sys::file_type(st.st_mode) == FileType::BlockDevice;
    let mut flags = OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    flags |= if write { OFlags::RDWR } else { OFlags::RDONLY };
    if write && is_block {
        flags |= OFlags::EXCL;
    }
    let fd = fs::open(path, flags, Mode::empty()).map_err(|x| match x {
        Errno::BUSY => e(x).with_reason(format!(
            "the {what} is a block device in use (mounted, or held by the kernel)"
        )),
        Errno::PERM if write => e(x).with_reason(format!(
            "the {what} is immutable or append-only (chattr +i or +a); it cannot be \
             written (chattr -i -a first)"
        )),
        _ => e(x),
    })?;
    let st = cowlink_sys::fstat(&fd).map_err(&e)?;
    // Replaced between the stat and the open? Check what was opened.
    check_type(path, what, st.st_mode)?;
    // Regular files and block devices do not block; reads and writes
    // proceed as usual without the flag.
    let fl = fs::fcntl_getfl(&fd).map_err(&e)?;
    fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK).map_err(&e)?;
    let kind = match cowlink_sys::file_type(st.st_mode) {
        FileType::BlockDevice => NodeKind::Block,
        _ => NodeKind::File,
    };
    let len = match kind {
        NodeKind::File => st.st_size as u64,
        NodeKind::Block => fs::seek(&fd, SeekFrom::End(0)).map_err(&e)?,
    };
    let file = File::from(fd);
    let held = lock::take(path, &file, access)?;
    Ok(Node {
        path: path.to_path_buf(),
        file,
        kind,
        len,
        id: (st.st_dev, st.st_ino),
        lock: held,
    })
}

fn check_type(path: &Path, what: &str, mode: u32) -> Result<(), Error> {
    let kind = match cowlink_sys::file_type(mode) {
        FileType::RegularFile | FileType::BlockDevice => return Ok(()),
        FileType::Directory => {
            return Err(Error::new(Operation::Image, ErrorKind::IsDirectory)
                .with_src(path)
                .with_reason(format!("the {what} is a directory")))
        }
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::Socket => "a socket",
        _ => "not a regular file",
    };
    Err(Error::new(Operation::Image, ErrorKind::NotRegularFile)
        .with_src(path)
        .with_reason(format!(
            "the {what} is {kind}; an image must be a regular file or a block device"
        )))
}

/// The path a name from inside `image`'s header stands for (`what`: the
/// backing file, the external data file), if it is a plain file name:
/// not empty, not a `json:` description, without a protocol prefix.
/// Relative names are relative to the image's directory.
pub fn plain_name(image: &Path, name: &str, what: &str) -> Result<PathBuf, Error> {
    let refuse = |why: String| {
        Error::new(Operation::Image, ErrorKind::NotSupported)
            .with_src(image)
            .with_reason(format!(
                "the image names its {what} {name:?}, which {why}; only a plain file name is followed"
            ))
    };
    if name.is_empty() {
        return Err(refuse("is empty".into()));
    }
    if name.starts_with("json:") {
        return Err(refuse("is a json: description".into()));
    }
    // QEMU's path_has_protocol: a ':' before any '/'.
    if let Some(i) = name.find([':', '/']) {
        if name.as_bytes()[i] == b':' {
            return Err(refuse(format!(
                "starts with the protocol {}: (write ./{name} for a file of that name)",
                &name[..i]
            )));
        }
    }
    if name.contains('\0') {
        return Err(refuse("holds a NUL byte".into()));
    }
    let p = Path::new(name);
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        image.parent().unwrap_or(Path::new(".")).join(p)
    })
}

/// An image format cowlink reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Raw: the file is the disk.
    Raw,
    /// qcow2.
    Qcow2,
}

impl Format {
    /// A declared format name (`backing_fmt`).
    pub fn declared(image: &Path, fmt: &str) -> Result<Format, Error> {
        match fmt {
            "raw" => Ok(Format::Raw),
            "qcow2" => Ok(Format::Qcow2),
            other => Err(Error::new(Operation::Image, ErrorKind::NotSupported)
                .with_src(image)
                .with_reason(format!(
                    "backing format {other:?} (only raw and qcow2 are read)"
                ))),
        }
    }

    /// The format of an opened file by its first bytes (QEMU's probe:
    /// qcow2 by its magic, anything else raw).
    pub fn probe(node: &Node) -> Result<Format, Error> {
        let mut b = [0u8; 4];
        match node.file.read_exact_at(&mut b, 0) {
            Ok(()) if qcow2::has_magic(&b) => Ok(Format::Qcow2),
            Ok(()) => Ok(Format::Raw),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Format::Raw),
            Err(e) => Err(Error::from_io(Operation::Image, &e).with_src(&node.path)),
        }
    }
}

/// One image of a chain.
#[derive(Debug)]
pub enum Layer {
    /// A qcow2 image, parsed and checked (its data file attached).
    Qcow2(Qcow2),
    /// A raw image: the file itself.
    Raw(Node),
}

/// A qcow2 image opened through [`open_node`], its header checked and its
/// external data file (if any) resolved, opened and locked the same way.
/// `probed`: the image's format was found by probing a name that declared
/// none, so names inside it are not followed.
pub fn open_qcow2(node: Node, probed: bool, access: Access) -> Result<Qcow2, Error> {
    let path = node.path.clone();
    let mut q = Qcow2::from_file(&node.path, node.file, node.len)?;
    if probed && (q.backing.is_some() || q.data_name.is_some()) {
        return Err(untrusted(&path));
    }
    if let Some(name) = q.data_name.clone() {
        let dpath = plain_name(&path, &name, "external data file")?;
        let what = format!("external data file of {}", quoted(&path));
        let d = open_node(&dpath, &what, false, access)?;
        q.attach_data(dpath, d.file, d.len);
    }
    Ok(q)
}

fn untrusted(path: &Path) -> Error {
    Error::new(Operation::Image, ErrorKind::NotSupported)
        .with_src(path)
        .with_reason(
            "this backing image is qcow2 by its first bytes only (the overlay declares no \
             backing format) and names files of its own; a guest can write such a header \
             into a raw disk, so they are not followed (declare the format: \
             qemu-img rebase -u -F qcow2 -b NAME OVERLAY)",
        )
}

/// The image below `q` in its chain: its backing file, resolved by
/// [`plain_name`], opened by [`open_node`] for `access`, in the format the
/// header declares (probed only when none is declared).
pub fn backing_of(q: &Qcow2, access: Access) -> Result<Option<(Layer, bool)>, Error> {
    let Some((name, fmt)) = &q.backing else {
        return Ok(None);
    };
    let path = plain_name(q.path(), name, "backing file")?;
    let declared = fmt
        .as_deref()
        .map(|f| Format::declared(q.path(), f))
        .transpose()?;
    let node = open_node(&path, "backing file", false, access)?;
    let (format, probed) = match declared {
        Some(f) => (f, false),
        None => (Format::probe(&node)?, true),
    };
    Ok(Some(match format {
        Format::Raw => (Layer::Raw(node), probed),
        Format::Qcow2 => (Layer::Qcow2(open_qcow2(node, probed, access)?), probed),
    }))
}

/// A whole chain, top first: qcow2 images down to an optional raw bottom.
#[derive(Debug)]
pub struct Chain {
    /// The qcow2 images, top first.
    pub layers: Vec<Qcow2>,
    /// The raw image at the bottom, if the chain ends in one.
    pub bottom: Option<Node>,
}

/// Open the chain under the qcow2 image `top` (named by the user, so
/// probed: it must be qcow2), every file read-locked.
pub fn open_chain(top: impl AsRef<Path>) -> Result<Chain, Error> {
    let top = top.as_ref();
    let node = open_node(top, "image", false, Access::Read)?;
    if Format::probe(&node)? != Format::Qcow2 {
        return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
            .with_src(top)
            .with_reason("not a qcow2 image"));
    }
    let mut seen = vec![node.id];
    let mut layers = vec![open_qcow2(node, false, Access::Read)?];
    let mut bottom = None;
    loop {
        let q = layers.last().expect("one layer");
        let Some((below, _)) = backing_of(q, Access::Read)? else {
            break;
        };
        let (path, id) = match &below {
            Layer::Raw(n) => (n.path.clone(), n.id),
            Layer::Qcow2(b) => (b.path().to_path_buf(), file_id(b.file())?),
        };
        if seen.contains(&id) {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(top)
                .with_reason(format!("the backing chain loops at {}", quoted(&path))));
        }
        seen.push(id);
        if seen.len() > MAX_DEPTH {
            return Err(Error::new(Operation::Image, ErrorKind::InvalidInput)
                .with_src(top)
                .with_reason(format!(
                    "the backing chain is longer than {MAX_DEPTH} images"
                )));
        }
        match below {
            Layer::Raw(n) => {
                bottom = Some(n);
                break;
            }
            Layer::Qcow2(b) => layers.push(b),
        }
    }
    Ok(Chain { layers, bottom })
}

/// Device and inode of an open file.
pub fn file_id(f: &File) -> Result<(u64, u64), Error> {
    let st = cowlink_sys::fstat(f).map_err(|e| Error::from_errno(Operation::Image, e))?;
    Ok((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_are_followed() {
        let img = Path::new("/images/vm.qcow2");
        for bad in [
            "",
            "json:{\"file.driver\":\"file\",\"file.filename\":\"/etc/shadow\"}",
            "nbd:localhost:10809",
            "nbd+unix:///x?socket=/s",
            "file:/etc/shadow",
            "http://example.com/disk",
            "ssh://host/disk",
            "a:b",
            "null-co://",
            "base\0.raw",
        ] {
            let e = plain_name(img, bad, "backing file").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotSupported, "{bad:?}");
            assert!(e.to_string().contains("vm.qcow2"), "{e}");
        }
        for (good, path) in [
            ("base.raw", "/images/base.raw"),
            ("./a:b", "/images/./a:b"),
            ("/srv/base.raw", "/srv/base.raw"),
            ("sub/x:y.raw", "/images/sub/x:y.raw"),
            ("../up.raw", "/images/../up.raw"),
        ] {
            assert_eq!(
                plain_name(img, good, "backing file").unwrap(),
                Path::new(path),
                "{good:?}"
            );
        }
    }

    #[test]
    fn only_raw_and_qcow2_formats() {
        let img = Path::new("vm.qcow2");
        assert_eq!(Format::declared(img, "raw").unwrap(), Format::Raw);
        assert_eq!(Format::declared(img, "qcow2").unwrap(), Format::Qcow2);
        for f in ["vmdk", "file", "nbd", "json", "", "RAW", "qcow"] {
            assert_eq!(
                Format::declared(img, f).unwrap_err().kind(),
                ErrorKind::NotSupported
            );
        }
    }
}
