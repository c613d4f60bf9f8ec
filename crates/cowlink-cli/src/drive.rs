//! `cowlink drive`: make, mount and inspect a dev drive (a loop-mounted
//! image holding a filesystem that clones). The crate
//! [`cowlink_drive`] does the work; this module resolves the owner and
//! where state lives, asks for root with the exact `sudo` line, and
//! renders the reports.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use cowlink::name::quoted;
use cowlink_drive::{
    self as drive, Change, CreateOptions, DriveFs, DriveInfo, PersistKind, PersistWith, Places,
};

use crate::out::{errln, outln};
use crate::{human_bytes, Exit};

/// Make a volume that clones, on a machine whose disk cannot
///
/// A dev drive is a sparse image file holding XFS (with reflink) or Btrfs,
/// loop-mounted with direct I/O (pages are not cached twice) and noatime,
/// its root owned by you. On ext4, where `cowlink probe .` says "no",
/// it gives builds, caches and checkouts constant-time clones.
///
/// `create` checks everything before it makes anything, and undoes every
/// step if a later one fails or Ctrl-C/SIGTERM arrives: a refusal, an
/// error or an interruption leaves no image, loop device, mount, record or
/// boot entry behind. `mount`, `unmount` and `remove` may be run again
/// safely. All but `list` and `status` need root.
///
/// A drive is recognised by its record, which holds the image's device and
/// inode and its filesystem's UUID: `remove` deletes only an image
/// `create` made, and `unmount` unmounts only a drive cowlink mounted on
/// its own mount point; anything else is refused with the reason.
///
/// Boot entries (--persist): a systemd unit running `cowlink drive mount`
/// where systemd runs (`/etc/systemd/system/cowlink-drive-*.service`,
/// enabled for local-fs.target), else an /etc/fstab line (`loop,noatime,
/// nofail`; mount(8) cannot ask for direct I/O, `drive status` says so).
/// `drive mount IMAGE DIR --persist` writes a drive's entry again, e.g.
/// when `drive status` says its unit is from an older cowlink.
///
/// State: one record per drive in /var/lib/cowlink/drives. For tests and
/// packaging, COWLINK_DRIVE_STATE_DIR, COWLINK_SYSTEMD_UNIT_DIR and
/// COWLINK_FSTAB move the records, the units and the fstab elsewhere.
///
/// Examples:
///   sudo cowlink drive create ~/dev.img --size 50G --mount ~/dev
///   sudo cowlink drive create /var/dev.img --size 50G --mount /srv/dev --fs btrfs --persist
///   sudo cowlink drive create /var/dev.img --size 50G --mount /srv/dev --persist --dry-run
///   cowlink drive list
///   cowlink drive status ~/dev
///   cowlink bench ~/dev "$PWD" --quick          # is it faster than where you work now?
///   sudo cowlink drive unmount ~/dev
///   sudo cowlink drive remove ~/dev.img --yes
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DriveArgs {
    #[command(subcommand)]
    command: DriveCommand,
}

#[derive(Subcommand, Debug)]
enum DriveCommand {
    /// Make an image, a filesystem that clones in it, and mount it
    #[command(
        after_help = "Examples:\n  sudo cowlink drive create ~/dev.img --size 50G --mount ~/dev\n  sudo cowlink drive create /var/dev.img --size 50G --mount /srv/dev --fs btrfs --persist"
    )]
    Create(CreateArgs),
    /// List every drive
    ///
    /// Image, mount point, filesystem, size and use, reflink, boot entry,
    /// loop device and direct I/O.
    #[command(after_help = "Examples:\n  cowlink drive list\n  cowlink drive list --json")]
    List {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Show one drive, by mount point or image
    ///
    /// With warnings for lost mount options and a loop device without
    /// direct I/O.
    #[command(after_help = "Examples:\n  cowlink drive status ~/dev")]
    Status {
        /// The drive's mount point or image
        #[arg(value_name = "DIR", value_parser = crate::PathArg)]
        path: PathBuf,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Mount a drive's image (again)
    ///
    /// Switches direct I/O on if it is already mounted without. An image
    /// with no record is taken only when
    /// it is what create makes (XFS or Btrfs labelled "cowlink": a drive
    /// whose record was lost)
    #[command(
        after_help = "Examples:\n  sudo cowlink drive mount ~/dev.img ~/dev\n  sudo cowlink drive mount ~/dev.img ~/dev --persist   # and at boot"
    )]
    Mount {
        /// The image file
        #[arg(value_name = "IMAGE", value_parser = crate::PathArg)]
        image: PathBuf,
        /// Where to mount it (an empty directory, made if missing)
        #[arg(value_name = "DIR", value_parser = crate::PathArg)]
        dir: PathBuf,
        /// Refuse unless the image holds this filesystem
        #[arg(long, value_enum)]
        fs: Option<DriveFs>,
        /// Also write its boot entry, as `create --persist` does, replacing
        /// the one written before for this drive (e.g. by an older cowlink;
        /// without HOW, of the kind already there)
        #[arg(long, value_enum, value_name = "HOW", num_args = 0..=1, default_missing_value = "auto")]
        persist: Option<PersistWith>,
    },
    /// Unmount a drive; its loop device detaches with it
    ///
    /// Names the processes holding files open on it when it is busy.
    #[command(after_help = "Examples:\n  sudo cowlink drive unmount ~/dev")]
    Unmount {
        /// The drive's mount point
        #[arg(value_name = "DIR", value_parser = crate::PathArg)]
        dir: PathBuf,
    },
    /// Delete a drive: its boot entry, its record and its image
    ///
    /// The image goes with all its data. Only an image `create` made is
    /// deleted; refused while mounted, attached or open; needs --yes.
    #[command(after_help = "Examples:\n  sudo cowlink drive remove ~/dev.img --yes")]
    Remove {
        /// The image file
        #[arg(value_name = "IMAGE", value_parser = crate::PathArg)]
        image: PathBuf,
        /// Yes, delete the image and everything in it
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Args, Debug)]
struct CreateArgs {
    /// The image file to make (must not exist)
    #[arg(value_name = "IMAGE", value_parser = crate::PathArg)]
    image: PathBuf,

    /// The drive's size: 50G, 512M, 1T (the file is sparse: it takes
    /// space only as data is written)
    #[arg(long, value_name = "SIZE", value_parser = crate::size_arg)]
    size: u64,

    /// Where to mount it: an empty directory (made if missing)
    #[arg(long, value_name = "DIR", value_parser = crate::PathArg)]
    mount: PathBuf,

    /// The filesystem
    #[arg(long, value_enum, default_value_t = DriveFs::Xfs)]
    fs: DriveFs,

    /// Mount it again at boot: a systemd unit where systemd runs, else an
    /// fstab line (or name the kind)
    #[arg(long, value_enum, value_name = "HOW", num_args = 0..=1, default_missing_value = "auto")]
    persist: Option<PersistWith>,

    /// Who owns the mount root: a user name, UID or UID:GID [default: the
    /// user who ran sudo (SUDO_UID), else root]
    #[arg(long, value_name = "USER")]
    owner: Option<String>,

    /// Allow a size beyond the free space where the image goes
    #[arg(long)]
    sparse_ok: bool,

    /// Check everything and print what would be made and written (the boot
    /// entry's text included), changing nothing
    #[arg(long)]
    dry_run: bool,

    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// Where state and boot entries live: the system's, or the environment's
/// overrides (the one place they are read).
fn places() -> Places {
    let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("cowlink"));
    let mut p = Places::system(program);
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("COWLINK_DRIVE_STATE_DIR") {
        p.state_dir = d;
    }
    if let Some(d) = var("COWLINK_SYSTEMD_UNIT_DIR") {
        p.unit_dir = d;
    }
    if let Some(f) = var("COWLINK_FSTAB") {
        p.fstab = f;
    }
    p
}

/// A word as a shell would need it.
fn shell_word(w: &OsString) -> String {
    let s = w.to_string_lossy();
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    match plain {
        true => s.into_owned(),
        false => format!("'{}'", s.replace('\'', "'\\''")),
    }
}

/// Refuse without root, giving the command line to run instead.
fn need_root(what: &str) -> Result<(), anyhow::Error> {
    need_root_for(what, "it attaches a loop device and mounts")
}

/// Refuse without root, saying `why` it is needed and giving the command
/// line to run instead (`sudo` and this very command line).
pub(crate) fn need_root_for(what: &str, why: &str) -> Result<(), anyhow::Error> {
    if rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let mut words: Vec<OsString> = std::env::args_os().collect();
    if let Some(first) = words.first_mut() {
        if let Ok(exe) = std::env::current_exe() {
            *first = exe.into();
        }
    }
    let line: Vec<String> = words.iter().map(shell_word).collect();
    Err(anyhow!(
        "{what} needs root ({why}); run:\n  sudo {}",
        line.join(" ")
    ))
}

/// `--owner`, else the user behind sudo.
fn owner(asked: Option<&str>) -> Result<Option<(u32, u32)>> {
    let Some(a) = asked else {
        let id = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        return Ok(match (id("SUDO_UID"), id("SUDO_GID")) {
            (Some(u), Some(g)) => Some((u, g)),
            (Some(u), None) => Some((u, primary_gid(u).unwrap_or(u))),
            _ => None,
        });
    };
    if let Some((u, g)) = a.split_once(':') {
        if let (Ok(u), Ok(g)) = (u.parse(), g.parse()) {
            return Ok(Some((u, g)));
        }
    }
    if let Ok(u) = a.parse::<u32>() {
        return Ok(Some((u, primary_gid(u).unwrap_or(u))));
    }
    match uzers::get_user_by_name(a) {
        Some(u) => Ok(Some((u.uid(), u.primary_group_id()))),
        None => Err(anyhow!("--owner {a}: no such user")),
    }
}

fn primary_gid(uid: u32) -> Option<u32> {
    uzers::get_user_by_uid(uid).map(|u| u.primary_group_id())
}

/// Run `cowlink drive`.
pub fn run(args: DriveArgs) -> Result<Exit> {
    let places = places();
    match args.command {
        DriveCommand::Create(a) => create(a, &places),
        DriveCommand::List { json } => {
            let drives = drive::list(&places);
            if json {
                print_json(&drives)?;
            } else if drives.is_empty() {
                outln!("no drives (make one with: sudo cowlink drive create IMAGE --size 50G --mount DIR)");
            } else {
                print_table(&drives);
            }
            Ok(Exit::Ok)
        }
        DriveCommand::Status { path, json } => {
            let d = drive::status(&path, &places)?;
            match json {
                true => print_json(&d)?,
                false => print_status(&d),
            }
            Ok(Exit::Ok)
        }
        DriveCommand::Mount {
            image,
            dir,
            fs,
            persist,
        } => {
            need_root("cowlink drive mount")?;
            // Every signal only cancels, from here to the end: the mount
            // is undone whole, or made whole (a signal after it was made
            // changes nothing: its boot entry is written, if asked).
            let token = crate::interrupt::token();
            crate::interrupt::steadfast(|| mount_arm(&image, &dir, fs, persist, &places, &token))
        }
        DriveCommand::Unmount { dir } => {
            need_root("cowlink drive unmount")?;
            match drive::unmount(&dir, &places)? {
                Change::Done => outln!("unmounted {}", quoted(&dir)),
                Change::Already => outln!("{} is not mounted: nothing to do", quoted(&dir)),
            }
            Ok(Exit::Ok)
        }
        DriveCommand::Remove { image, yes } => {
            need_root("cowlink drive remove")?;
            let r = drive::remove(&image, yes, &places)?;
            if !r.image_deleted && !r.record_removed && !r.persist_removed {
                outln!("{}: no such drive: nothing to remove", quoted(&image));
            } else {
                outln!(
                    "removed {}{}{}",
                    quoted(&image),
                    match r.image_deleted {
                        true => format!(" (freed {})", human_bytes(r.freed)),
                        false => " (the image was already gone)".into(),
                    },
                    match r.persist_removed {
                        true => " and its boot entry",
                        false => "",
                    }
                );
            }
            Ok(Exit::Ok)
        }
    }
}

/// `drive mount`, run steadfast (see the caller).
fn mount_arm(
    image: &std::path::Path,
    dir: &std::path::Path,
    fs: Option<drive::DriveFs>,
    persist: Option<drive::PersistWith>,
    places: &drive::Places,
    token: &cowlink::CancelToken,
) -> Result<Exit> {
    let (change, mut d) = match drive::mount(image, dir, fs, places, token) {
        Err(e) if e.kind() == cowlink::ErrorKind::Cancelled => {
            errln!("cowlink: {}", e.reason());
            return Ok(Exit::Interrupted);
        }
        r => r?,
    };
    let lp = d.loop_device.as_ref();
    match change {
        Change::Done => outln!(
            "mounted {} on {} ({}{})",
            quoted(&d.image),
            quoted(&d.mount_point),
            d.fs,
            lp.map(|l| format!(", {}{}", l.device.display(), dio_words(l.direct_io)))
                .unwrap_or_default()
        ),
        Change::Already => outln!(
            "{} is already mounted on {}{}",
            quoted(&d.image),
            quoted(&d.mount_point),
            lp.map(|l| dio_words(l.direct_io)).unwrap_or_default()
        ),
    }
    if let Some(with) = persist {
        let p = drive::persist(&d.image, &d.mount_point, with, places)?;
        outln!("boot entry written: {}", quoted(&p.file));
        d = drive::status(&d.mount_point, places)?;
    }
    warn(&d);
    Ok(Exit::Ok)
}

fn dio_words(on: bool) -> &'static str {
    match on {
        true => ", direct I/O",
        false => ", without direct I/O",
    }
}

fn create(a: CreateArgs, places: &Places) -> Result<Exit> {
    if !a.dry_run {
        need_root("cowlink drive create")?;
    }
    let opts = CreateOptions {
        size: a.size,
        mount: a.mount.clone(),
        fs: a.fs,
        owner: owner(a.owner.as_deref())?,
        persist: a.persist,
        sparse_ok: a.sparse_ok,
        dry_run: a.dry_run,
        cancel: crate::interrupt::token(),
        // Tests of the undo only: wait after step N until a signal.
        pause_after_step: std::env::var("COWLINK_DRIVE_TEST_PAUSE_AFTER_STEP")
            .ok()
            .and_then(|v| v.parse().ok()),
    };
    let c = match crate::interrupt::steadfast(|| drive::create(&a.image, &opts, places)) {
        Err(e) if e.kind() == cowlink::ErrorKind::Cancelled => {
            // The library's reason says what was undone, and what another
            // process still holds, if anything.
            errln!("cowlink: {} was not made; {}", quoted(&a.image), e.reason());
            return Ok(Exit::Interrupted);
        }
        r => r?,
    };
    if a.json {
        print_json(&c)?;
        return Ok(Exit::Ok);
    }
    if c.dry_run {
        outln!(
            "would create {}: {} {} (sparse), mounted on {} with noatime through a loop device with direct I/O{}",
            quoted(&c.image),
            human_bytes(c.size),
            c.fs,
            quoted(&c.mount),
            opts.owner
                .map(|(u, g)| format!(", owned by {u}:{g}"))
                .unwrap_or_default()
        );
        if let Some(p) = &c.persist {
            outln!("would write {}:", quoted(&p.file));
            crate::out::out!("{}", p.text);
        }
        return Ok(Exit::Ok);
    }
    let d = c.drive.as_ref().expect("a drive after a real create");
    outln!(
        "created {}: {} {} (sparse: {} used on the host)",
        quoted(&d.image),
        human_bytes(c.size),
        d.fs,
        human_bytes(d.image_allocated.unwrap_or(0))
    );
    outln!(
        "mounted on {}{}, noatime{}",
        quoted(&d.mount_point),
        d.loop_device
            .as_ref()
            .map(|l| format!(" through {}{}", l.device.display(), dio_words(l.direct_io)))
            .unwrap_or_default(),
        d.owner_uid
            .map(|u| format!(", owned by uid {u}"))
            .unwrap_or_default()
    );
    outln!("{}", reflink_words(d));
    if let Some(p) = &c.persist {
        outln!(
            "at boot: {} {}",
            match p.kind {
                PersistKind::Systemd => "systemd unit",
                PersistKind::Fstab => "fstab entry in",
            },
            quoted(&p.file)
        );
    }
    warn(d);
    let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    outln!(
        "\nIs it faster than where you work now? Compare them side by side:\n  cowlink bench {} {} --quick",
        shell_word(&d.mount_point.clone().into_os_string()),
        shell_word(&here.into_os_string())
    );
    Ok(Exit::Ok)
}

fn reflink_words(d: &DriveInfo) -> String {
    match (d.reflink, &d.reflink_reason) {
        (Some(true), _) => "reflink: yes (cowlink probe: a trial clone worked)".into(),
        (Some(false), r) => format!("reflink: NO: {}", r.as_deref().unwrap_or("unknown")),
        (None, _) if !d.mounted => "reflink: unknown (not mounted)".into(),
        (None, r) => format!("reflink: unknown: {}", r.as_deref().unwrap_or("no trial")),
    }
}

fn warn(d: &DriveInfo) {
    for w in &d.warnings {
        errln!("warning: {}: {w}", quoted(&d.mount_point));
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    crate::out::json(&mut crate::out::stdout(), v)?;
    Ok(())
}

fn boot_words(d: &DriveInfo) -> &'static str {
    match d.persist {
        Some(PersistKind::Systemd) => "systemd",
        Some(PersistKind::Fstab) => "fstab",
        None => "no",
    }
}

fn print_table(drives: &[DriveInfo]) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_header([
        "image",
        "mount point",
        "fs",
        "size",
        "used",
        "reflink",
        "at boot",
        "loop",
    ]);
    for d in drives {
        let used = match (d.fs_used, d.fs_total) {
            (Some(u), Some(t)) => format!(
                "{} ({:.0}%)",
                human_bytes(u),
                100.0 * u as f64 / t.max(1) as f64
            ),
            _ => "-".into(),
        };
        let mount = match (&d.mounted, &d.mounted_elsewhere) {
            (true, _) => quoted(&d.mount_point),
            (false, Some(e)) => format!("{} (on {})", quoted(&d.mount_point), quoted(e)),
            (false, None) => format!("{} (not mounted)", quoted(&d.mount_point)),
        };
        let lp = d
            .loop_device
            .as_ref()
            .map(|l| {
                format!(
                    "{}{}",
                    l.device.display(),
                    if l.direct_io { " dio" } else { " NO dio" }
                )
            })
            .unwrap_or_else(|| "-".into());
        t.add_row([
            quoted(&d.image),
            mount,
            d.fs.to_string(),
            d.size.map(human_bytes).unwrap_or_else(|| "missing".into()),
            used,
            match d.reflink {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None if d.mounted => "unknown".into(),
                None => "-".into(),
            },
            boot_words(d).into(),
            lp,
        ]);
    }
    outln!("{t}");
    for d in drives {
        warn(d);
    }
}

fn print_status(d: &DriveInfo) {
    let row = |k: &str, v: String| outln!("{k:<12} {v}");
    row(
        "image",
        format!(
            "{} ({}{})",
            quoted(&d.image),
            d.size.map(human_bytes).unwrap_or_else(|| "missing".into()),
            d.image_allocated
                .map(|a| format!(", {} used on the host", human_bytes(a)))
                .unwrap_or_default()
        ),
    );
    row(
        "mount point",
        format!(
            "{}{}",
            quoted(&d.mount_point),
            match (d.mounted, &d.mounted_elsewhere) {
                (true, _) => String::new(),
                (false, Some(e)) => format!(" (mounted on {} instead)", quoted(e)),
                (false, None) => " (not mounted)".into(),
            }
        ),
    );
    row("filesystem", d.fs.to_string());
    if let (Some(u), Some(t)) = (d.fs_used, d.fs_total) {
        row("use", format!("{} of {}", human_bytes(u), human_bytes(t)));
    }
    row(
        "reflink",
        reflink_words(d).trim_start_matches("reflink: ").to_string(),
    );
    if let Some(o) = &d.mount_options {
        row("options", o.clone());
    }
    if let Some(l) = &d.loop_device {
        row(
            "loop",
            format!(
                "{} (direct I/O {}, autoclear {}, {}-byte blocks)",
                l.device.display(),
                if l.direct_io { "on" } else { "OFF" },
                if l.autoclear { "on" } else { "off" },
                l.block_size
            ),
        );
    }
    if let Some(u) = d.owner_uid {
        row("owner", format!("uid {u}"));
    }
    row(
        "at boot",
        match &d.persist_file {
            Some(f) => format!("{} ({})", boot_words(d), quoted(f)),
            None => "no".into(),
        },
    );
    warn(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word(&"/var/dev.img".into()), "/var/dev.img");
        assert_eq!(shell_word(&"my drive".into()), "'my drive'");
        assert_eq!(shell_word(&"it's".into()), "'it'\\''s'");
        assert_eq!(shell_word(&"".into()), "''");
    }

    #[test]
    fn owners_parse_as_ids_or_names() {
        assert_eq!(owner(Some("1000:100")).unwrap(), Some((1000, 100)));
        assert_eq!(owner(Some("root")).unwrap(), Some((0, 0)));
        assert!(owner(Some("no-such-user-here")).is_err());
    }
}
