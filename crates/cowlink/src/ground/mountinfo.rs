//! Parsing `/proc/self/mountinfo` (see `proc_pid_mountinfo(5)`).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo: a mount as this process sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount ID (field 1).
    pub id: u32,
    /// Parent mount ID (field 2).
    pub parent: u32,
    /// `major:minor` of the filesystem's device (field 3).
    pub dev: (u32, u32),
    /// Where it is mounted (field 5), unescaped.
    pub mount_point: PathBuf,
    /// Per-mount options (field 6); contains `ro` for read-only mounts.
    pub options: String,
    /// Filesystem type (`xfs`, `fuse.sshfs`, ...).
    pub fstype: String,
    /// Mount source (device path, server:/export, or a name).
    pub source: String,
}

impl MountEntry {
    /// Mounted read-only (per-mount option).
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Undo mountinfo's octal escapes (`\040` for space, `\011`, `\012`, `\134`).
pub(crate) fn unescape(field: &str) -> OsString {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// Parse the text of a mountinfo file. Malformed lines are skipped.
pub(crate) fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let id = l.next()?.parse().ok()?;
    let parent = l.next()?.parse().ok()?;
    let (maj, min) = l.next()?.split_once(':')?;
    let dev = (maj.parse().ok()?, min.parse().ok()?);
    let _root = l.next()?;
    let mount_point = PathBuf::from(unescape(l.next()?));
    let options = l.next()?.to_string();
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape(r.next().unwrap_or(""))
        .to_string_lossy()
        .into_owned();
    Some(MountEntry {
        id,
        parent,
        dev,
        mount_point,
        options,
        fstype,
        source,
    })
}

/// The mounts a path walk from `root` can reach: the mount containing
/// `root` and every visible mount below it, in mountinfo order. A mount
/// hidden by a later mount on the same point is left out.
pub(crate) fn at_or_under(mounts: &[MountEntry], root: impl AsRef<Path>) -> Vec<MountEntry> {
    let root = root.as_ref();
    // The last mount on a mount point is the visible one.
    let mut visible: Vec<&MountEntry> = Vec::new();
    for m in mounts {
        visible.retain(|v| v.mount_point != m.mount_point);
        visible.push(m);
    }
    let containing = visible
        .iter()
        .filter(|m| root.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
        .map(|m| m.id);
    visible
        .into_iter()
        .filter(|m| {
            Some(m.id) == containing || (m.mount_point.starts_with(root) && m.mount_point != root)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid - proc proc rw
40 22 7:0 / /mnt/my\\040disk rw,relatime - xfs /dev/loop0 rw,attr2
41 40 7:1 / /mnt/my\\040disk/inner ro,relatime - btrfs /dev/loop1 ro
42 22 0:50 / /home/auto rw - autofs systemd-1 rw
43 40 0:51 / /mnt/my\\040disk/inner rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_fields_and_escapes() {
        let m = parse(SAMPLE);
        assert_eq!(m.len(), 6);
        assert_eq!(m[2].mount_point, PathBuf::from("/mnt/my disk"));
        assert_eq!(m[2].fstype, "xfs");
        assert_eq!(m[2].dev, (7, 0));
        assert!(m[3].read_only());
        assert!(!m[2].read_only());
        assert_eq!(m[4].fstype, "autofs");
    }

    #[test]
    fn selects_containing_and_nested_visible_mounts() {
        let m = parse(SAMPLE);
        let sel = at_or_under(&m, Path::new("/mnt/my disk"));
        let points: Vec<_> = sel
            .iter()
            .map(|e| (e.mount_point.clone(), e.fstype.clone()))
            .collect();
        // The btrfs mount at inner is hidden by the later tmpfs.
        assert_eq!(
            points,
            vec![
                (PathBuf::from("/mnt/my disk"), "xfs".to_string()),
                (PathBuf::from("/mnt/my disk/inner"), "tmpfs".to_string()),
            ]
        );
        let sel = at_or_under(&m, Path::new("/home"));
        let points: Vec<_> = sel.iter().map(|e| e.fstype.as_str()).collect();
        assert_eq!(points, vec!["ext4", "autofs"]);
    }
}
