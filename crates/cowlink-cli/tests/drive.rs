//! `cowlink drive` as root, with real loop devices: images live on the ext4
//! test filesystem (the case a drive is for); records, units and the fstab
//! go to the test's own directory. Every check of "what is left" is made
//! with the system's own tools (`losetup`, `/proc/self/mountinfo`,
//! `statfs`), not with cowlink's report.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cowlink_testfs::{names, testfs};

mod common;
use common::{bin, text};

/// A test's world: where images go, and private state, unit and fstab
/// places.
struct World {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl World {
    fn new(dir: tempfile::TempDir) -> World {
        let root = dir.path().to_path_buf();
        fs::create_dir(root.join("etc")).unwrap();
        World { _dir: dir, root }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `cowlink drive ARGS` with this world's places.
    fn drive(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
        self.command(args).output().unwrap()
    }

    fn command(&self, args: &[&dyn AsRef<std::ffi::OsStr>]) -> Command {
        let mut c = bin();
        c.arg("drive")
            .env("COWLINK_DRIVE_STATE_DIR", self.p("etc/state"))
            .env("COWLINK_SYSTEMD_UNIT_DIR", self.p("etc/units"))
            .env("COWLINK_FSTAB", self.p("etc/fstab"))
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
        for a in args {
            c.arg(a.as_ref());
        }
        c
    }

    /// `drive status DIR --json`, which must succeed.
    fn status(&self, dir: &Path) -> serde_json::Value {
        serde_json::from_str(&ok(&self.drive(&[&"status", &dir, &"--json"]))).unwrap()
    }

    /// Records left in the state directory.
    fn records(&self) -> Vec<String> {
        match self.p("etc/state").is_dir() {
            true => names(&self.p("etc/state")),
            false => Vec::new(),
        }
    }
}

impl Drop for World {
    /// A failed test must not leave mounts or loop devices behind.
    fn drop(&mut self) {
        for m in mounts_under(&self.root) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        for d in loops_of_dir(&self.root) {
            let _ = Command::new("losetup").arg("-d").arg(&d).status();
        }
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A refusal: exit 2 and an error naming `words`.
fn refused(out: &Output, words: &[&str]) {
    failed_with(out, 2, words);
}

/// The command exited with `code` and its stderr holds every one of `words`.
fn failed_with(out: &Output, code: i32, words: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr: {err}\nstdout: {}",
        text(&out.stdout)
    );
    for w in words {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
}

/// `mount -o remount,OPTION DIR`, which must succeed.
fn remount(dir: &Path, option: &str) {
    let st = Command::new("mount")
        .arg("-o")
        .arg(format!("remount,{option}"))
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success(), "remount,{option} {}", dir.display());
}

/// Loop devices (per losetup) whose backing file is `image`.
fn loops_of(image: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .args(["-n", "-O", "NAME", "-j"])
        .arg(image)
        .output()
        .unwrap();
    text(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .collect()
}

/// Loop devices (per losetup) backed by any file under `dir`.
fn loops_of_dir(dir: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .args(["-n", "-l", "-O", "NAME,BACK-FILE"])
        .output()
        .unwrap();
    text(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, back) = l.trim().split_once(char::is_whitespace)?;
            back.trim()
                .starts_with(dir.to_str()?)
                .then(|| name.to_owned())
        })
        .collect()
}

/// `losetup`'s direct I/O column for `dev`.
fn dio(dev: &str) -> String {
    let out = Command::new("losetup")
        .args(["-n", "-O", "DIO"])
        .arg(dev)
        .output()
        .unwrap();
    text(&out.stdout).trim().to_owned()
}

/// Mount points at or under `dir`, from the kernel's table.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let t = fs::read_to_string("/proc/self/mountinfo").unwrap();
    cowlink::mountinfo::parse(&t)
        .into_iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .map(|m| m.mount_point)
        .collect()
}

/// The mount on exactly `dir`: (source, fstype, per-mount options).
fn mount_of(dir: &Path) -> Option<(String, String, String)> {
    let t = fs::read_to_string("/proc/self/mountinfo").unwrap();
    cowlink::mountinfo::parse(&t)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == dir)
        .map(|m| (m.source, m.fstype, m.options))
}

/// Nothing of a drive is left: no image, no loop device, no mount, no
/// record.
fn nothing_left(w: &World, image: &Path) {
    assert!(!image.exists(), "{} left behind", image.display());
    assert_eq!(loops_of(image), Vec::<String>::new(), "loop device left");
    assert_eq!(
        loops_of_dir(&w.root),
        Vec::<String>::new(),
        "loop device left"
    );
    assert_eq!(mounts_under(&w.root), Vec::<PathBuf>::new(), "mount left");
    assert_eq!(w.records(), Vec::<String>::new(), "record left");
}

/// The whole life of a drive with filesystem `fs` (statfs magic `magic`).
fn lifecycle(w: &World, fs_name: &str, magic: u64) {
    let (img, mnt) = (w.p("dev.img"), w.p("dev"));
    let out = ok(&w.drive(&[
        &"create",
        &img,
        &"--size",
        &"1G",
        &"--mount",
        &mnt,
        &"--fs",
        &fs_name,
        &"--owner",
        &"65534:65534",
    ]));
    assert!(out.contains("reflink: yes"), "{out}");
    assert!(
        out.contains("cowlink bench"),
        "suggests the comparison: {out}"
    );

    // The mount is the filesystem asked for, through a loop device with
    // direct I/O, noatime, owned as asked.
    let st = rustix::fs::statfs(&mnt).unwrap();
    assert_eq!(st.f_type as u64, magic);
    let (source, fstype, options) = mount_of(&mnt).expect("mounted");
    assert_eq!(fstype, fs_name);
    assert!(options.split(',').any(|o| o == "noatime"), "{options}");
    assert_eq!(loops_of(&img), std::slice::from_ref(&source));
    assert_eq!(dio(&source), "1", "direct I/O on {source}");
    let m = fs::metadata(&mnt).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534));
    // The image is sparse.
    let im = fs::metadata(&img).unwrap();
    assert_eq!(im.len(), 1 << 30);
    assert!(im.blocks() * 512 < im.len() / 4, "{} blocks", im.blocks());

    // Reflink works: a clone shares its blocks (FIEMAP), bytes equal.
    let data = cowlink_testfs::data(1 << 20, 5);
    cowlink_testfs::write_file(&mnt.join("a"), &data);
    let c = bin()
        .args(["cp", "--reflink=always"])
        .arg(mnt.join("a"))
        .arg(mnt.join("b"))
        .output()
        .unwrap();
    ok(&c);
    assert_eq!(fs::read(mnt.join("b")).unwrap(), data);
    let layout = cowlink::extents::extents(mnt.join("b")).unwrap();
    assert_eq!(layout.shared_bytes, 1 << 20, "{layout:?}");

    // status and list agree with the kernel.
    let s = w.status(&mnt);
    assert_eq!(s["mounted"], true);
    assert_eq!(s["fs"], fs_name);
    assert_eq!(s["reflink"], true);
    assert_eq!(s["loop_device"]["device"], source.as_str());
    assert_eq!(s["loop_device"]["direct_io"], true);
    assert_eq!(s["owner_uid"], 65534);
    assert_eq!(s["warnings"], serde_json::json!([]));
    let l: serde_json::Value = serde_json::from_str(&ok(&w.drive(&[&"list", &"--json"]))).unwrap();
    assert_eq!(l.as_array().unwrap().len(), 1);
    assert_eq!(l[0]["image"], img.to_str().unwrap());

    // status says what went wrong behind its back: the mount lost
    // noatime, the loop device lost direct I/O. `drive mount` on the
    // mounted drive switches direct I/O back on.
    remount(&mnt, "strictatime");
    let off = Command::new("losetup")
        .arg("--direct-io=off")
        .arg(&source)
        .status()
        .unwrap();
    assert!(off.success());
    assert_eq!(dio(&source), "0");
    let s = w.status(&mnt);
    let warnings: Vec<String> = s["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("lost its noatime"), "{warnings:?}");
    assert!(
        warnings[1].contains(&source) && warnings[1].contains("direct I/O"),
        "{warnings:?}"
    );
    let plain = w.drive(&[&"status", &mnt]);
    ok(&plain);
    let said = text(&plain.stderr);
    assert!(
        said.contains("warning: ") && said.contains("noatime") && said.contains("direct I/O"),
        "{said}"
    );
    assert!(ok(&w.drive(&[&"mount", &img, &mnt])).contains("already mounted"));
    assert_eq!(
        dio(&source),
        "1",
        "drive mount switched direct I/O on again"
    );
    remount(&mnt, "noatime");
    let s = w.status(&mnt);
    assert_eq!(s["warnings"], serde_json::json!([]));

    // unmount → mount → unmount → remove, each twice (idempotent).
    ok(&w.drive(&[&"unmount", &mnt]));
    assert!(mount_of(&mnt).is_none());
    assert_eq!(
        loops_of(&img),
        Vec::<String>::new(),
        "AUTOCLEAR detached it"
    );
    assert!(ok(&w.drive(&[&"unmount", &mnt])).contains("nothing to do"));
    ok(&w.drive(&[&"mount", &img, &mnt]));
    let (source, _, _) = mount_of(&mnt).expect("mounted again");
    assert_eq!(dio(&source), "1");
    assert_eq!(fs::read(mnt.join("a")).unwrap(), data, "data survives");
    assert!(ok(&w.drive(&[&"mount", &img, &mnt])).contains("already mounted"));
    assert_eq!(loops_of(&img).len(), 1, "a second mount adds no device");
    ok(&w.drive(&[&"unmount", &mnt]));
    // remove asks for --yes first, and deletes nothing without it.
    refused(&w.drive(&[&"remove", &img]), &["--yes"]);
    assert!(img.exists());
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(w, &img);
    assert!(ok(&w.drive(&[&"remove", &img, &"--yes"])).contains("nothing to remove"));
}

#[test]
fn an_xfs_drive_is_made_mounted_and_removed_without_leftovers() {
    let Some(d) = testfs!(Ext4) else { return };
    lifecycle(&World::new(d), "xfs", 0x5846_5342);
}

#[test]
fn a_btrfs_drive_is_made_mounted_and_removed_without_leftovers() {
    let Some(d) = testfs!(Ext4) else { return };
    lifecycle(&World::new(d), "btrfs", 0x9123_683e);
}

#[test]
fn refusals_leave_nothing_behind() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    let img = w.p("r.img");
    let before = names(&w.root);

    // A mount point that is not empty.
    fs::create_dir(w.p("full")).unwrap();
    fs::write(w.p("full/keep"), b"mine").unwrap();
    let full = w.p("full");
    refused(
        &w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &full]),
        &["not empty", "full"],
    );
    assert_eq!(names(&full), ["keep"]);
    nothing_left(&w, &img);

    // An image that exists (and is not touched).
    fs::write(w.p("taken.img"), b"someone's data").unwrap();
    let taken = w.p("taken.img");
    let m = w.p("m");
    refused(
        &w.drive(&[&"create", &taken, &"--size", &"1G", &"--mount", &m]),
        &["already exists", "taken.img"],
    );
    assert_eq!(fs::read(&taken).unwrap(), b"someone's data");
    assert!(!m.exists());

    // More than the free space, without --sparse-ok.
    refused(
        &w.drive(&[&"create", &img, &"--size", &"1000T", &"--mount", &m]),
        &["free", "--sparse-ok"],
    );
    nothing_left(&w, &img);
    assert!(!m.exists());

    // Not root: the exact sudo line.
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_cowlink"))
        .args(["drive", "create"])
        .arg(w.p("n.img"))
        .args(["--size", "1G", "--mount"])
        .arg(w.p("n"))
        .output()
        .unwrap();
    refused(
        &nobody,
        &[
            "needs root",
            "sudo ",
            "drive create",
            "n.img --size 1G --mount",
        ],
    );
    assert!(!w.p("n.img").exists() && !w.p("n").exists());

    nothing_left(&w, &img);
    let mut after = names(&w.root);
    after.retain(|n| n != "full" && n != "taken.img");
    assert_eq!(after, before);
}

#[test]
fn a_failing_mkfs_leaves_no_image_loop_device_or_mount_point() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    for (fs_name, size) in [("xfs", "100M"), ("btrfs", "50M")] {
        let (img, mnt) = (w.p("small.img"), w.p("small"));
        // Below the filesystem's minimum: mkfs itself refuses.
        let out = w.drive(&[
            &"create", &img, &"--size", &size, &"--mount", &mnt, &"--fs", &fs_name,
        ]);
        refused(&out, &[&format!("mkfs.{fs_name} failed")]);
        nothing_left(&w, &img);
        assert!(!mnt.exists(), "the mount point it made is gone");
    }
}

#[test]
fn a_missing_mkfs_is_refused_naming_its_package_and_nothing_is_made() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    let (img, mnt) = (w.p("x.img"), w.p("x"));
    for (fs_name, package) in [("xfs", "xfsprogs"), ("btrfs", "btrfs-progs")] {
        // In a mount namespace of its own, every mkfs.FS cowlink could
        // find is covered by /dev/null (not a regular file): as if the
        // package were not installed, without touching the system.
        let mkfs = format!("mkfs.{fs_name}");
        let covers: Vec<String> = ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|d| format!("{d}/{mkfs}"))
            .filter(|p| Path::new(p).is_file())
            .map(|p| format!("mount --bind /dev/null {p} && "))
            .collect();
        assert!(!covers.is_empty(), "{mkfs} is not installed here");
        let inner = w.command(&[
            &"create", &img, &"--size", &"1G", &"--mount", &mnt, &"--fs", &fs_name,
        ]);
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("{}exec \"$@\"", covers.concat()))
            .arg("sh")
            .arg(inner.get_program())
            .args(inner.get_args());
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        let out = c.output().unwrap();
        // Refused like every other precondition: exit 2 (not 1, which
        // is for a path given that does not exist).
        refused(
            &out,
            &[&format!("{mkfs} is not installed"), package, "x.img"],
        );
        nothing_left(&w, &img);
        assert!(!mnt.exists(), "no mount point was made");
    }
}

#[test]
fn persist_dry_run_prints_a_valid_unit_and_changes_nothing() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    let (img, mnt) = (w.p("p.img"), w.p("p dir"));
    let out = ok(&w.drive(&[
        &"create",
        &img,
        &"--size",
        &"1G",
        &"--mount",
        &mnt,
        &"--persist=systemd",
        &"--dry-run",
    ]));
    nothing_left(&w, &img);
    assert!(!mnt.exists());
    assert!(!w.p("etc/units").exists(), "no unit written");
    let unit = out
        .split_once(":\n")
        .map(|(_, u)| u)
        .expect("the unit text");
    for must in [
        format!("\"{}\"", img.display()),
        format!("\"{}\"", mnt.display()),
        "--fs xfs".into(),
        "noatime".into(),
        "direct I/O".into(),
        "WantedBy=local-fs.target".into(),
        // After the root is remounted read-write (an image on it must be
        // opened for writing; scripts/boot-check boots a real system).
        "\nAfter=local-fs-pre.target\n".into(),
    ] {
        assert!(unit.contains(&must), "{must:?} not in:\n{unit}");
    }
    let name = out
        .split(['/', '\'', ' '])
        .find(|w| w.starts_with("cowlink-drive-") && w.ends_with(".service"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no unit name in {out}"));
    assert!(name.contains("\\x20dir"), "the space is escaped: {name}");
    // systemd's own check, where systemd is installed; else the shape.
    let file = w.p(&name);
    fs::write(&file, unit).unwrap();
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()
    {
        Ok(v) => assert!(
            v.status.success() && text(&v.stderr).trim().is_empty(),
            "systemd-analyze verify: {}",
            text(&v.stderr)
        ),
        Err(_) => {
            let sections: Vec<&str> = unit.lines().filter(|l| l.starts_with('[')).collect();
            assert_eq!(sections, ["[Unit]", "[Service]", "[Install]"]);
            assert!(unit.lines().any(|l| l.starts_with("ExecStart=\"/")));
        }
    }

    // The fstab kind prints the line it would add.
    let out = ok(&w.drive(&[
        &"create",
        &img,
        &"--size",
        &"1G",
        &"--mount",
        &mnt,
        &"--persist=fstab",
        &"--dry-run",
    ]));
    let line = format!(
        "{} {} xfs loop,noatime,nofail 0 0",
        img.display(),
        mnt.display().to_string().replace(' ', "\\040")
    );
    assert!(out.contains(&line), "{line} not in {out}");
    assert!(!w.p("etc/fstab").exists());
}

#[test]
fn persist_writes_the_boot_entry_and_remove_takes_it_away() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    let fstab = w.p("etc/fstab");
    fs::write(&fstab, "UUID=x / ext4 defaults 0 1\n").unwrap();
    let (a, am, b, bm) = (w.p("a.img"), w.p("a"), w.p("b.img"), w.p("b"));
    ok(&w.drive(&[
        &"create",
        &a,
        &"--size",
        &"1G",
        &"--mount",
        &am,
        &"--persist=systemd",
    ]));
    ok(&w.drive(&[
        &"create",
        &b,
        &"--size",
        &"1G",
        &"--mount",
        &bm,
        &"--persist=fstab",
    ]));
    let units = w.p("etc/units");
    let found: Vec<String> = names(&units)
        .into_iter()
        .filter(|n| n.ends_with(".service"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let unit = units.join(&found[0]);
    assert!(fs::read_to_string(&unit).unwrap().contains("ExecStart="));
    let wants = units
        .join("local-fs.target.wants")
        .join(unit.file_name().unwrap());
    assert_eq!(fs::read_link(&wants).unwrap(), unit, "enabled");
    let tab = fs::read_to_string(&fstab).unwrap();
    assert!(tab.starts_with("UUID=x / ext4 defaults 0 1\n"));
    assert!(tab.contains(&format!(
        "{} {} xfs loop,noatime,nofail 0 0",
        b.display(),
        bm.display()
    )));
    let l: serde_json::Value = serde_json::from_str(&ok(&w.drive(&[&"list", &"--json"]))).unwrap();
    let kinds: Vec<&str> = l
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["persist"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["systemd", "fstab"]);

    for mnt in [&am, &bm] {
        ok(&w.drive(&[&"unmount", mnt]));
    }
    for img in [&a, &b] {
        ok(&w.drive(&[&"remove", img, &"--yes"]));
    }
    nothing_left(&w, &a);
    nothing_left(&w, &b);
    assert!(!unit.exists() && fs::symlink_metadata(&wants).is_err());
    assert_eq!(
        fs::read_to_string(&fstab).unwrap(),
        "UUID=x / ext4 defaults 0 1\n"
    );
}

#[test]
fn an_old_boot_unit_is_flagged_and_mount_persist_writes_it_again() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    let fstab = w.p("etc/fstab");
    fs::write(&fstab, "UUID=x / ext4 defaults 0 1\n").unwrap();
    let (img, mnt) = (w.p("a.img"), w.p("a"));
    ok(&w.drive(&[
        &"create",
        &img,
        &"--size",
        &"1G",
        &"--mount",
        &mnt,
        &"--persist=systemd",
    ]));
    let warnings = |w: &World| w.status(&mnt)["warnings"].to_string();
    assert!(!warnings(&w).contains("boot unit"), "{}", warnings(&w));
    let units = w.p("etc/units");
    let name = names(&units)
        .into_iter()
        .find(|n| n.ends_with(".service"))
        .unwrap();
    let unit = units.join(&name);
    let current = fs::read_to_string(&unit).unwrap();
    // The unit as versions before 2026-11-24 wrote it.
    let old = current.replace("After=local-fs-pre.target\n", "");
    assert_ne!(old, current);
    fs::write(&unit, &old).unwrap();
    assert!(
        warnings(&w).contains("was written by an older cowlink"),
        "{}",
        warnings(&w)
    );

    // Mounted already: --persist only writes the unit again.
    let out = ok(&w.drive(&[&"mount", &img, &mnt, &"--persist"]));
    assert!(out.contains("boot entry written"), "{out}");
    assert_eq!(fs::read_to_string(&unit).unwrap(), current);
    assert!(!warnings(&w).contains("boot unit"), "{}", warnings(&w));

    // Another kind replaces the first: one entry, never none, never two.
    ok(&w.drive(&[&"mount", &img, &mnt, &"--persist=fstab"]));
    assert!(!unit.exists());
    let wants = units.join("local-fs.target.wants").join(&name);
    assert!(fs::symlink_metadata(&wants).is_err());
    let tab = fs::read_to_string(&fstab).unwrap();
    assert_eq!(tab.matches(" loop,noatime,nofail ").count(), 1, "{tab}");
    ok(&w.drive(&[&"mount", &img, &mnt, &"--persist=fstab"]));
    let again = fs::read_to_string(&fstab).unwrap();
    assert_eq!(again, tab, "written again, not added twice");
    ok(&w.drive(&[&"mount", &img, &mnt, &"--persist=systemd"]));
    assert_eq!(fs::read_to_string(&unit).unwrap(), current);
    assert_eq!(fs::read_link(&wants).unwrap(), unit, "enabled");
    assert_eq!(
        fs::read_to_string(&fstab).unwrap(),
        "UUID=x / ext4 defaults 0 1\n"
    );

    ok(&w.drive(&[&"unmount", &mnt]));
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
    assert!(!unit.exists());
}

#[test]
fn remove_and_unmount_are_refused_while_a_process_holds_a_file_on_the_drive() {
    let Some(d) = testfs!(Ext4) else { return };
    let w = World::new(d);
    let (img, mnt) = (w.p("busy.img"), w.p("busy"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    fs::write(mnt.join("open-me"), b"held").unwrap();
    let mut holder = Command::new("sleep")
        .arg("120")
        .stdin(fs::File::open(mnt.join("open-me")).unwrap())
        .spawn()
        .unwrap();
    let pid = format!("pid {} (sleep)", holder.id());
    refused(
        &w.drive(&[&"remove", &img, &"--yes"]),
        &["mounted", &pid, "open-me"],
    );
    refused(&w.drive(&[&"unmount", &mnt]), &["in use", &pid, "open-me"]);
    assert!(img.exists() && mount_of(&mnt).is_some(), "nothing was done");
    holder.kill().unwrap();
    holder.wait().unwrap();
    ok(&w.drive(&[&"unmount", &mnt]));
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}
