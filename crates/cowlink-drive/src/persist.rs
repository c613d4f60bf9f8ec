//! Bringing a drive back at boot: the text that does it and where it goes.
//!
//! With systemd (PID 1 is systemd: `/run/systemd/system` exists) a drive
//! persists as a service unit, `cowlink-drive-<escaped mount point>.service`,
//! enabled by a link in `local-fs.target.wants/`. It is a service, not a
//! `.mount` unit, because mount(8)'s `loop` option cannot ask for direct
//! I/O (util-linux has no such option) and a `.mount` unit runs no command
//! of its own: the service runs `cowlink drive mount`, which attaches the
//! loop device with direct I/O and mounts with `noatime`, exactly as
//! `drive create` did, and `cowlink drive unmount` when stopped.
//! `RequiresMountsFor=` orders it after the mounts holding the image and
//! the mount point, and `After=local-fs-pre.target` after
//! `systemd-remount-fs.service`: a machine booted with `ro` on its kernel
//! command line (Debian's and Ubuntu's default) has its root read-only
//! until then, and an image on it cannot be opened for writing. Without
//! that line the unit raced the remount and lost it ("cannot open the
//! image: read-only file system"), so the drive did not come back; found
//! by `scripts/boot-check`, which boots a real Debian twice.
//!
//! Without systemd the drive persists as an `/etc/fstab` line (`loop,
//! noatime,nofail`) under a comment naming cowlink. mount(8) then attaches
//! the loop device without direct I/O; `drive status` warns, and `cowlink
//! drive mount IMAGE DIR` switches it on for the running system.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::DriveFs;

/// How a drive comes back at boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PersistKind {
    /// A systemd service unit.
    Systemd,
    /// An `/etc/fstab` line.
    Fstab,
}

/// Which persistence to use, as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum PersistWith {
    /// systemd where it runs, else fstab.
    #[default]
    Auto,
    /// A systemd unit (also where systemd is not running: for an image
    /// that boots elsewhere).
    Systemd,
    /// An fstab line.
    Fstab,
}

/// Where drive state and boot configuration live. [`Places::system`] is
/// the real system; tests and packagers point them elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Places {
    /// One JSON record per drive (`/var/lib/cowlink/drives`).
    pub state_dir: PathBuf,
    /// systemd system units (`/etc/systemd/system`).
    pub unit_dir: PathBuf,
    /// The fstab file (`/etc/fstab`).
    pub fstab: PathBuf,
    /// Whether systemd manages this system (PID 1).
    pub systemd: bool,
    /// The cowlink program the unit runs (absolute).
    pub program: PathBuf,
}

impl Places {
    /// The system's places, with `program` as the cowlink binary.
    pub fn system(program: PathBuf) -> Places {
        Places {
            state_dir: PathBuf::from("/var/lib/cowlink/drives"),
            unit_dir: PathBuf::from("/etc/systemd/system"),
            fstab: PathBuf::from("/etc/fstab"),
            systemd: Path::new("/run/systemd/system").is_dir(),
            program,
        }
    }
}

/// What persisting a drive writes: the kind, the file, and the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PersistPlan {
    /// Unit or fstab line.
    pub kind: PersistKind,
    /// The file written (the unit, or the fstab).
    pub file: PathBuf,
    /// The unit's whole text, or the fstab lines added.
    pub text: String,
}

/// `systemd-escape --path`, byte for byte (systemd's
/// `unit_name_path_escape`): `/home/u/dev drive` → `home-u-dev\x20drive`.
/// Empty components and `.` components are dropped, `/` alone is `-`; a
/// leading `.`, `-`, `\` and every byte outside `[0-9A-Za-z:_.]` become
/// `\xNN`; `/` becomes `-`. `None` for a path with a `..` component, which
/// systemd refuses.
pub(crate) fn systemd_escape_path(p: &Path) -> Option<String> {
    let bytes = p.as_os_str().as_encoded_bytes();
    let parts: Vec<&[u8]> = bytes
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if parts.iter().any(|c| *c == b"..") {
        return None;
    }
    if parts.is_empty() {
        return Some("-".into());
    }
    let joined = parts.join(&b'/');
    let mut out = String::with_capacity(joined.len());
    for (i, &b) in joined.iter().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || b":_.".contains(&b) => out.push(b as char),
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    Some(out)
}

/// The longest unit name systemd loads (`UNIT_NAME_MAX` - 1).
const UNIT_NAME_MAX: usize = 255;

/// The unit's file name for a drive mounted on `mount`, or why there can
/// be none.
pub(crate) fn unit_name(mount: &Path) -> Result<String, String> {
    let escaped = systemd_escape_path(mount)
        .ok_or_else(|| "systemd cannot name a unit after a path with `..` in it".to_string())?;
    let name = format!("cowlink-drive-{escaped}.service");
    match name.len() > UNIT_NAME_MAX {
        true => Err(format!(
            "the unit's name for this mount point would be {} characters, more than \
             systemd's {UNIT_NAME_MAX} (choose a shorter mount point)",
            name.len()
        )),
        false => Ok(name),
    }
}

/// Whether `p` can be written into a systemd unit at all: systemd has no
/// way to say a control character (a newline above all: it would end the
/// setting and start another) in `RequiresMountsFor=` or `Description=`,
/// and the path must be UTF-8 and absolute. The reason when not.
pub(crate) fn unit_path_expressible(p: &Path) -> Result<(), String> {
    let Some(s) = p.to_str() else {
        return Err("it is not valid UTF-8, which a systemd unit cannot hold".into());
    };
    if !p.is_absolute() {
        return Err("it is not an absolute path".into());
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!(
            "it holds the control character {c:?}, which a systemd unit cannot express \
             (a newline would start a new setting); rename it, or use --persist=fstab"
        ));
    }
    Ok(())
}

/// One word of an `Exec*=` or list setting, quoted for systemd (every
/// value cowlink writes into a unit is quoted: it never ends in a `\`,
/// which would join the next line to it). Control characters are refused
/// before this ([`unit_path_expressible`]).
fn unit_word(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A path in free text (`Description=`, comments): as it is when plain,
/// else quoted as [`unit_word`] does, so it never ends in a `\\`.
fn text_word(s: &str) -> String {
    let plain = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:@,=".contains(c));
    match plain {
        true => s.to_owned(),
        false => unit_word(s),
    }
}

/// The systemd unit for a drive.
pub(crate) fn unit_text(program: &Path, image: &Path, mount: &Path, fs: DriveFs) -> String {
    let (img, dir, prog) = (
        image.to_string_lossy(),
        mount.to_string_lossy(),
        program.to_string_lossy(),
    );
    let parent = |p: &Path| {
        p.parent()
            .unwrap_or(Path::new("/"))
            .to_string_lossy()
            .into_owned()
    };
    let mut needs = vec![unit_word(&parent(image))];
    if parent(mount) != parent(image) {
        needs.push(unit_word(&parent(mount)));
    }
    let describe = format!("cowlink drive {} on {}", text_word(&img), text_word(&dir));
    format!(
        "# Written by `cowlink drive create --persist` or `drive mount --persist`;\n\
         # removed by `cowlink drive remove`.\n\
         # Mounts the image {} ({fs}) on {} with options noatime,\n\
         # through a loop device with direct I/O.\n\
         [Unit]\n\
         Description={describe}\n\
         DefaultDependencies=no\n\
         RequiresMountsFor={}\n\
         After=local-fs-pre.target\n\
         Conflicts=umount.target\n\
         Before=local-fs.target umount.target\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         RemainAfterExit=yes\n\
         ExecStart={} drive mount --fs {fs} {} {}\n\
         ExecStop={} drive unmount {}\n\
         \n\
         [Install]\n\
         WantedBy=local-fs.target\n",
        text_word(&img),
        text_word(&dir),
        needs.join(" "),
        unit_word(&prog),
        unit_word(&img),
        unit_word(&dir),
        unit_word(&prog),
        unit_word(&dir),
        fs = fs.name(),
    )
}

/// A path as an fstab field: space, backslash, `#` and every control
/// character in octal (`\040`), as mount(8) reads them back.
fn fstab_field(p: &Path) -> String {
    let mut out = String::new();
    for c in p.to_string_lossy().chars() {
        match c {
            ' ' | '\\' | '#' => out.push_str(&format!("\\{:03o}", c as u32)),
            c if c.is_ascii_control() => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The marker comment above a drive's fstab line.
fn fstab_marker(image: &Path) -> String {
    format!("# cowlink drive {}", fstab_field(image))
}

/// The fstab lines for a drive (marker comment and entry).
pub(crate) fn fstab_lines(image: &Path, mount: &Path, fs: DriveFs) -> String {
    format!(
        "{}\n{} {} {} loop,noatime,nofail 0 0\n",
        fstab_marker(image),
        fstab_field(image),
        fstab_field(mount),
        fs.name()
    )
}

/// What persisting `image` on `mount` would write under `places`, or why
/// it cannot be written (a path a systemd unit cannot express, a unit
/// name too long).
pub(crate) fn plan(
    with: PersistWith,
    places: &Places,
    image: &Path,
    mount: &Path,
    fs: DriveFs,
) -> Result<PersistPlan, (PathBuf, String)> {
    let systemd = match with {
        PersistWith::Auto => places.systemd,
        PersistWith::Systemd => true,
        PersistWith::Fstab => false,
    };
    match systemd {
        true => {
            for p in [image, mount, &places.program] {
                unit_path_expressible(p).map_err(|why| (p.to_path_buf(), why))?;
            }
            let name = unit_name(mount).map_err(|why| (mount.to_path_buf(), why))?;
            Ok(PersistPlan {
                kind: PersistKind::Systemd,
                file: places.unit_dir.join(name),
                text: unit_text(&places.program, image, mount, fs),
            })
        }
        false => Ok(PersistPlan {
            kind: PersistKind::Fstab,
            file: places.fstab.clone(),
            text: fstab_lines(image, mount, fs),
        }),
    }
}

/// Write `text` to `path` through a temporary file and a rename, with
/// `mode`.
pub(crate) fn write_atomic(path: &Path, text: &str, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.cowlink-{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Carry out `plan`: write the unit and its `wants` link, or append the
/// fstab lines. Undone by [`remove`].
pub(crate) fn apply(plan: &PersistPlan, places: &Places) -> io::Result<()> {
    match plan.kind {
        PersistKind::Systemd => {
            fs::create_dir_all(&places.unit_dir)?;
            write_atomic(&plan.file, &plan.text, 0o644)?;
            let wants = places.unit_dir.join("local-fs.target.wants");
            fs::create_dir_all(&wants)?;
            let link = wants.join(plan.file.file_name().unwrap_or_default());
            match std::os::unix::fs::symlink(&plan.file, &link) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                    let _ = fs::remove_file(&plan.file);
                    return Err(e);
                }
                _ => {}
            }
            reload(places);
            Ok(())
        }
        PersistKind::Fstab => {
            use std::os::unix::fs::PermissionsExt;
            let (old, mode) = match fs::read_to_string(&plan.file) {
                Ok(t) => (t, fs::metadata(&plan.file)?.permissions().mode() & 0o7777),
                Err(e) if e.kind() == io::ErrorKind::NotFound => (String::new(), 0o644),
                Err(e) => return Err(e),
            };
            let sep = if old.is_empty() || old.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            write_atomic(&plan.file, &format!("{old}{sep}{}", plan.text), mode)
        }
    }
}

/// Write the boot entry of `plan` for `image` on `mount`, replacing the
/// one cowlink wrote before for them, of either kind: a unit is
/// overwritten in one rename, an fstab entry replaced in one rewrite of
/// the file, and the entry of the other kind (if any) removed only after
/// the new one is in place, so the drive always has a boot entry.
pub(crate) fn rewrite(
    plan: &PersistPlan,
    places: &Places,
    image: &Path,
    mount: &Path,
) -> io::Result<()> {
    match plan.kind {
        PersistKind::Systemd => {
            apply(plan, places)?;
            remove_fstab_entry(places, image)
        }
        PersistKind::Fstab => {
            use std::os::unix::fs::PermissionsExt;
            let (old, mode) = match fs::read_to_string(&plan.file) {
                Ok(t) => (t, fs::metadata(&plan.file)?.permissions().mode() & 0o7777),
                Err(e) if e.kind() == io::ErrorKind::NotFound => (String::new(), 0o644),
                Err(e) => return Err(e),
            };
            let kept = without_fstab_entry(&old, image);
            let sep = if kept.is_empty() || kept.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            write_atomic(&plan.file, &format!("{kept}{sep}{}", plan.text), mode)?;
            remove_unit(places, image, mount)
        }
    }
}

/// Whether the unit `text` differs from the one this version writes for
/// `image` on `mount`, comments and the program it runs aside (a unit written by an
/// older cowlink: before 2026-11-24 units lacked `After=local-fs-pre.target`
/// and failed at boot on a root mounted read-only until then).
pub(crate) fn unit_is_stale(text: &str, image: &Path, mount: &Path, fs: DriveFs) -> bool {
    // `ExecStart=PROGRAM drive mount ...` → `ExecStart= drive mount ...`;
    // PROGRAM is one word, quoted by `unit_word` if it needs to be.
    let without_program = |l: &str| -> String {
        let Some((key, rest)) = l.split_once('=') else {
            return l.to_owned();
        };
        if key != "ExecStart" && key != "ExecStop" {
            return l.to_owned();
        }
        let after = match rest.strip_prefix('"') {
            Some(q) => {
                let mut escaped = false;
                let end = q.char_indices().find(|&(_, c)| {
                    let close = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    close
                });
                end.map_or("", |(i, _)| &q[i + 1..])
            }
            None => rest.find(' ').map_or("", |i| &rest[i..]),
        };
        format!("{key}={after}")
    };
    let body = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(without_program)
            .collect()
    };
    body(text) != body(&unit_text(Path::new("cowlink"), image, mount, fs))
}

/// Tell a running systemd to read the units again (best effort).
fn reload(places: &Places) {
    if places.systemd {
        let _ = std::process::Command::new("systemctl")
            .arg("daemon-reload")
            .status();
    }
}

/// Remove what [`apply`] wrote for `image` on `mount`, whichever kind it
/// was; a missing file or line is not an error.
pub(crate) fn remove(places: &Places, image: &Path, mount: &Path) -> io::Result<()> {
    remove_unit(places, image, mount)?;
    remove_fstab_entry(places, image)
}

/// Whether the unit `text` is the boot entry of the drive `image` on
/// `mount`: its `ExecStart=` runs `drive mount ... IMAGE MOUNT`. A unit is
/// named after its mount point only, and two drives may be recorded on
/// one mount point (one at a time mounted): the unit of one is never the
/// other's.
pub(crate) fn unit_mounts(text: &str, image: &Path, mount: &Path) -> bool {
    // Quoted, as this version writes them; bare when every character is
    // plain (as older units may hold them).
    let (img, dir) = (image.to_string_lossy(), mount.to_string_lossy());
    let tails = [
        format!(" {} {}", unit_word(&img), unit_word(&dir)),
        format!(" {} {}", text_word(&img), text_word(&dir)),
    ];
    text.lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .filter_map(|l| {
            l.split_once(" drive mount ")
                .map(|(_, args)| format!(" {}", args.trim_end()))
        })
        .any(|args| tails.iter().any(|t| args.ends_with(t.as_str())))
}

/// The unit file for `mount`, when one is there and it is not the boot
/// entry of `image` (another drive's, or a file cowlink cannot read).
pub(crate) fn unit_of_another(places: &Places, image: &Path, mount: &Path) -> Option<PathBuf> {
    let unit = places.unit_dir.join(unit_name(mount).ok()?);
    match fs::symlink_metadata(&unit) {
        Err(_) => None,
        Ok(_) => match read_unit(&unit) {
            Some(t) if unit_mounts(&t, image, mount) => None,
            _ => Some(unit),
        },
    }
}

/// A unit file's text (a regular file, at most 64 KiB), or `None`.
fn read_unit(unit: &Path) -> Option<String> {
    use std::io::Read;
    let f = super::device::open_image(unit).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut t = String::new();
    f.take(64 << 10).read_to_string(&mut t).ok()?;
    Some(t)
}

/// Remove the unit of `image` for `mount` and its `wants` link, if there
/// (a unit there for another drive stays).
fn remove_unit(places: &Places, image: &Path, mount: &Path) -> io::Result<()> {
    // No name: no unit can have been written for it.
    let Ok(name) = unit_name(mount) else {
        return Ok(());
    };
    let gone = |r: io::Result<()>| match r {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    let wants = places.unit_dir.join("local-fs.target.wants").join(&name);
    let unit = places.unit_dir.join(&name);
    if unit_of_another(places, image, mount).is_some() {
        return Ok(());
    }
    let had = unit.exists() || wants.symlink_metadata().is_ok();
    gone(fs::remove_file(wants))?;
    gone(fs::remove_file(unit))?;
    if had {
        reload(places);
    }
    Ok(())
}

/// Remove cowlink's fstab entry for `image`, if there.
fn remove_fstab_entry(places: &Places, image: &Path) -> io::Result<()> {
    let text = match fs::read_to_string(&places.fstab) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let kept = without_fstab_entry(&text, image);
    if kept != text {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&places.fstab)?.permissions().mode() & 0o7777;
        write_atomic(&places.fstab, &kept, mode)?;
    }
    Ok(())
}

/// Whether `places` hold a boot entry for `image` on `mount`, and which.
pub(crate) fn find(places: &Places, image: &Path, mount: &Path) -> Option<(PersistKind, PathBuf)> {
    if let Ok(name) = unit_name(mount) {
        let unit = places.unit_dir.join(name);
        if unit.exists() && unit_of_another(places, image, mount).is_none() {
            return Some((PersistKind::Systemd, unit));
        }
    }
    let text = fs::read_to_string(&places.fstab).ok()?;
    (without_fstab_entry(&text, image) != text).then(|| (PersistKind::Fstab, places.fstab.clone()))
}

/// `text` without the marker comment and the entry cowlink wrote for
/// `image`.
fn without_fstab_entry(text: &str, image: &Path) -> String {
    let marker = fstab_marker(image);
    let field = fstab_field(image);
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l == marker {
            if let Some(next) = lines.peek() {
                if next.split_whitespace().next() == Some(field.as_str()) {
                    lines.next();
                }
            }
            continue;
        }
        out.push(l);
    }
    let mut s = out.join("\n");
    if text.ends_with('\n') && !s.is_empty() {
        s.push('\n');
    }
    s
}

/// A systemd service for `cowlink dedupe --watch`: its file name
/// (`cowlink-dedupe-watch-<first root, escaped as systemd-escape --path
/// does>.service`) and its text. `args` are the words after the program
/// (`dedupe --watch ... ROOT...`), `roots` the watched roots (absolute):
/// each is quoted as the drive units quote their words, and the unit
/// waits for the mounts holding them (`RequiresMountsFor=`). The service
/// runs at idle I/O priority and nice 10, and restarts 30 s after a
/// failure; SIGTERM stops it (the watch exits 0).
///
/// # Errors
/// A root or the program that a unit cannot hold (not UTF-8, relative,
/// a control character, `..`), or a name longer than systemd loads.
pub fn watch_unit(
    program: &Path,
    args: &[String],
    roots: &[PathBuf],
) -> Result<(String, String), String> {
    let first = roots.first().ok_or("no root to watch")?;
    for p in roots.iter().map(PathBuf::as_path).chain([program]) {
        unit_path_expressible(p).map_err(|why| format!("{}: {why}", p.display()))?;
    }
    if let Some(c) = args.iter().flat_map(|a| a.chars()).find(|c| c.is_control()) {
        return Err(format!(
            "an argument holds the control character {c:?}, which a unit cannot express"
        ));
    }
    let escaped = systemd_escape_path(first)
        .ok_or_else(|| "systemd cannot name a unit after a path with `..` in it".to_string())?;
    let name = format!("cowlink-dedupe-watch-{escaped}.service");
    if name.len() > UNIT_NAME_MAX {
        return Err(format!(
            "the unit's name would be {} characters, more than systemd's {UNIT_NAME_MAX}",
            name.len()
        ));
    }
    let shown: Vec<String> = roots
        .iter()
        .map(|r| text_word(&r.to_string_lossy()))
        .collect();
    let needs: Vec<String> = roots
        .iter()
        .map(|r| unit_word(&r.to_string_lossy()))
        .collect();
    let mut exec = vec![unit_word(&program.to_string_lossy())];
    exec.extend(args.iter().map(|a| unit_word(a)));
    let text = format!(
        "# Written by `cowlink dedupe --watch --install-unit`.\n\
         # Keeps identical files under {} sharing their blocks as they\n\
         # are written (fanotify; root). SIGTERM stops it cleanly.\n\
         [Unit]\n\
         Description=cowlink dedupe watch on {}\n\
         RequiresMountsFor={}\n\
         After=local-fs.target\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={}\n\
         Nice=10\n\
         IOSchedulingClass=idle\n\
         Restart=on-failure\n\
         RestartSec=30\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n",
        shown.join(" "),
        shown.join(" "),
        needs.join(" "),
        exec.join(" "),
    );
    Ok((name, text))
}

/// Write the unit `text` as `dir/name` (through a temporary file and a
/// rename, mode 0644), creating `dir` if needed; the path written.
///
/// # Errors
/// The directory cannot be created or the file written.
pub fn write_unit(dir: &Path, name: &str, text: &str) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    let path = dir.join(name);
    write_atomic(&path, text, 0o644)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_escape_as_systemd_does() {
        let e = |p: &str| systemd_escape_path(Path::new(p)).unwrap();
        assert_eq!(e("/"), "-");
        assert_eq!(e("/home/u/dev"), "home-u-dev");
        assert_eq!(e("/srv/my drive/.cache-x"), "srv-my\\x20drive-.cache\\x2dx");
        assert_eq!(e("/.hidden"), "\\x2ehidden");
        assert_eq!(e("//a/./b:c/"), "a-b:c");
        assert_eq!(e("/a\\b\nc"), "a\\x5cb\\x0ac");
        assert_eq!(systemd_escape_path(Path::new("/a/../b")), None);
    }

    /// A small deterministic generator (xorshift64*), for generated cases
    /// without a dependency.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
            &from[(self.next() % from.len() as u64) as usize]
        }
    }

    /// Hostile path components: newlines, spaces, unicode, `-`, `\`, `:`,
    /// dots, quotes, specifiers, control characters.
    fn hostile_names(seed: u64, n: usize) -> Vec<String> {
        let pieces = [
            "a",
            "Z",
            "0",
            "-",
            "\\",
            ":",
            ".",
            "_",
            " ",
            "\n",
            "\t",
            "é",
            "日本",
            "🦀",
            "%",
            "$",
            "\"",
            "'",
            "[Service]",
            "=",
            "#",
            ";",
            "\u{7f}",
            "\u{1}",
            "..",
            "x-y",
            "\\x2d",
        ];
        let mut g = Gen(seed);
        (0..n)
            .map(|_| {
                let len = 1 + g.next() % 6;
                let mut name: String = (0..len).map(|_| *g.pick(&pieces)).collect();
                if name == "." || name == ".." {
                    name.push('x');
                }
                name
            })
            .collect()
    }

    /// The real `systemd-escape --path` on each path, one run.
    fn systemd_escape(paths: &[String]) -> Option<Vec<String>> {
        let out = std::process::Command::new("systemd-escape")
            .arg("--path")
            .arg("--")
            .args(paths)
            .output()
            .ok()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        Some(text.split_whitespace().map(str::to_owned).collect())
    }

    #[test]
    fn a_unit_is_the_boot_entry_of_its_own_image_only_over_generated_paths() {
        let names: Vec<String> = hostile_names(5, 200)
            .into_iter()
            .filter(|n| !n.chars().any(char::is_control))
            .collect();
        let prog = Path::new("/usr/bin/cowlink");
        for (i, a) in names.iter().enumerate() {
            let img = PathBuf::from(format!("/var/{a}.img"));
            let mnt = PathBuf::from(format!("/srv/{a}"));
            let text = unit_text(prog, &img, &mnt, DriveFs::Xfs);
            assert!(
                unit_mounts(&text, &img, &mnt),
                "{img:?} not found in\n{text}"
            );
            for b in names.iter().skip(i + 1).take(40) {
                // Another image on the same mount point, or names shifted
                // between the two words.
                for other in [
                    format!("/var/{b}.img"),
                    format!("/var/{a}"),
                    format!("/srv/{a}"),
                    format!("/var/{a}.img\" \"/srv"),
                ] {
                    let other = PathBuf::from(other);
                    if other != img {
                        assert!(
                            !unit_mounts(&text, &other, &mnt),
                            "{other:?} taken for {img:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[ignore = "needs systemd-escape (systemd): run scripts/test"]
    fn escapes_match_the_real_systemd_escape_over_generated_paths() {
        let mut paths: Vec<String> = Vec::new();
        for (i, names) in [hostile_names(7, 300), hostile_names(91, 300)]
            .iter()
            .enumerate()
        {
            for (k, n) in names.iter().enumerate() {
                paths.push(match (i + k) % 3 {
                    0 => format!("/{n}"),
                    1 => format!("/srv/{n}/d"),
                    _ => format!("//{n}/./x:{n}/"),
                });
            }
        }
        paths.retain(|p| !p.split('/').any(|c| c == ".."));
        // No skip: a comparison that did not run must not pass.
        let theirs = systemd_escape(&paths).expect("systemd-escape (systemd) is installed");
        assert_eq!(theirs.len(), paths.len());
        for (p, t) in paths.iter().zip(&theirs) {
            assert_eq!(&systemd_escape_path(Path::new(p)).unwrap(), t, "path {p:?}");
        }
    }

    /// The settings of a unit's text: (section, key) in order.
    fn settings(text: &str) -> Vec<(String, String)> {
        let mut section = String::new();
        let mut out = Vec::new();
        for l in text.lines() {
            if l.starts_with('#') || l.trim().is_empty() {
                continue;
            }
            if l.starts_with('[') {
                section = l.to_owned();
                continue;
            }
            let key = l.split_once('=').map(|(k, _)| k).unwrap_or(l);
            out.push((section.clone(), key.to_owned()));
        }
        out
    }

    #[test]
    fn no_generated_path_changes_a_unit_s_settings_or_gets_in_unescaped() {
        let places = Places {
            state_dir: "/s".into(),
            unit_dir: "/u".into(),
            fstab: "/f".into(),
            systemd: true,
            program: "/usr/bin/cowlink".into(),
        };
        let plain = unit_text(
            &places.program,
            Path::new("/i.img"),
            Path::new("/m"),
            DriveFs::Xfs,
        );
        let want = settings(&plain);
        let (mut refused, mut written) = (0, 0);
        for n in hostile_names(1234, 400) {
            let (img, dir) = (
                PathBuf::from(format!("/img/{n}.img")),
                PathBuf::from(format!("/mnt/{n}")),
            );
            match plan(PersistWith::Systemd, &places, &img, &dir, DriveFs::Xfs) {
                Err((p, why)) => {
                    refused += 1;
                    assert!(n.chars().any(char::is_control), "{n:?} refused: {why}");
                    assert!(p == img || p == dir);
                    assert!(why.contains("control character"), "{why}");
                }
                Ok(pl) => {
                    written += 1;
                    assert!(!n.chars().any(char::is_control), "{n:?} was written");
                    assert_eq!(settings(&pl.text), want, "{n:?}:\n{}", pl.text);
                    for l in pl.text.lines() {
                        assert!(!l.ends_with('\\'), "a line ends in a backslash: {l:?}");
                    }
                    // The name is a single file name systemd accepts.
                    let name = pl.file.file_name().unwrap().to_str().unwrap();
                    assert!(name.len() <= UNIT_NAME_MAX && !name.contains('/'));
                }
            }
            // fstab fields never hold a raw space, tab, newline or `#`.
            let line = fstab_lines(&img, &dir, DriveFs::Xfs);
            assert_eq!(line.lines().count(), 2, "{line:?}");
            let entry = line.lines().nth(1).unwrap();
            assert_eq!(entry.split_whitespace().count(), 6, "{entry:?}");
        }
        assert!(
            refused > 20 && written > 20,
            "{refused} refused, {written} written"
        );
    }

    #[test]
    fn a_unit_name_beyond_systemd_s_limit_is_refused() {
        let long = PathBuf::from(format!("/{}", "d".repeat(240)));
        let why = unit_name(&long).unwrap_err();
        assert!(why.contains("255"), "{why}");
        assert!(unit_name(Path::new("/srv/dev")).is_ok());
    }

    #[test]
    fn fstab_entries_round_trip() {
        let img = Path::new("/var/img/dev drive.img");
        let lines = fstab_lines(img, Path::new("/mnt/dev"), DriveFs::Xfs);
        assert!(lines.contains("/var/img/dev\\040drive.img /mnt/dev xfs loop,noatime,nofail 0 0"));
        let before = "UUID=1 / ext4 defaults 0 1\n";
        let with = format!("{before}{lines}");
        assert_eq!(without_fstab_entry(&with, img), before);
        // Another image's entry stays.
        assert_eq!(without_fstab_entry(&with, Path::new("/other.img")), with);
    }

    #[test]
    fn a_watch_unit_quotes_its_words_and_refuses_what_a_unit_cannot_say() {
        let roots = vec![PathBuf::from("/srv/my builds"), PathBuf::from("/data/100%")];
        let args: Vec<String> = [
            "dedupe",
            "--watch",
            "--exclude=$HOME*",
            "--",
            "/srv/my builds",
            "/data/100%",
        ]
        .map(String::from)
        .to_vec();
        let (name, text) = watch_unit(Path::new("/usr/bin/cowlink"), &args, &roots).unwrap();
        assert_eq!(name, "cowlink-dedupe-watch-srv-my\\x20builds.service");
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        assert_eq!(
            exec,
            "\"/usr/bin/cowlink\" \"dedupe\" \"--watch\" \"--exclude=$$HOME*\" \"--\" \"/srv/my builds\" \"/data/100%%\""
        );
        assert!(
            text.contains("RequiresMountsFor=\"/srv/my builds\" \"/data/100%%\"\n"),
            "{text}"
        );
        let keys: Vec<(String, String)> = settings(&text);
        assert!(
            keys.contains(&("[Service]".into(), "Type".into())),
            "{keys:?}"
        );
        assert!(keys.contains(&("[Install]".into(), "WantedBy".into())));

        let nl = vec![PathBuf::from("/srv/a\nb")];
        assert!(watch_unit(Path::new("/usr/bin/cowlink"), &args, &nl).is_err());
        let rel = vec![PathBuf::from("srv")];
        assert!(watch_unit(Path::new("/usr/bin/cowlink"), &args, &rel).is_err());
        let bad_arg = vec!["--exclude=a\nb".to_string()];
        assert!(watch_unit(Path::new("/usr/bin/cowlink"), &bad_arg, &roots).is_err());
        assert!(watch_unit(Path::new("/usr/bin/cowlink"), &args, &[]).is_err());
    }

    #[test]
    fn unit_words_are_quoted_for_systemd() {
        assert_eq!(unit_word("/a b/100%"), "\"/a b/100%%\"");
        assert_eq!(unit_word("x\"$y"), "\"x\\\"$$y\"");
    }

    #[test]
    fn a_unit_is_stale_when_it_differs_but_for_comments_and_the_program() {
        let (img, dir) = (Path::new("/var/dev.img"), Path::new("/srv/dev"));
        let now = unit_text(Path::new("/usr/local/bin/cowlink"), img, dir, DriveFs::Xfs);
        assert!(!unit_is_stale(&now, img, dir, DriveFs::Xfs));
        let moved = unit_text(Path::new("/opt/my tools/cowlink"), img, dir, DriveFs::Xfs);
        assert!(moved.contains("ExecStart=\"/opt/my tools/cowlink\" drive mount"));
        assert!(!unit_is_stale(&moved, img, dir, DriveFs::Xfs));
        let commented = now.replace("# Written by", "# Once written by");
        assert!(!unit_is_stale(&commented, img, dir, DriveFs::Xfs));
        let old = now.replace("After=local-fs-pre.target\n", "");
        assert!(unit_is_stale(&old, img, dir, DriveFs::Xfs));
        assert!(unit_is_stale(&now, img, dir, DriveFs::Btrfs));
    }
}
