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

use crate::common;
use crate::common::{bin, ok, text};

/// A test's world: where images go, and private state, unit and fstab
/// places.
struct World {
    _dir: cowlink_testfs::TestDir,
    root: PathBuf,
}

impl World {
    fn new(dir: cowlink_testfs::TestDir) -> World {
        let root = dir.path().to_path_buf();
        fs::create_dir(root.join("etc")).unwrap();
        World { _dir: dir, root }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `drive create ARGS`, paused after step `step`
    /// (`COWLINK_DRIVE_TEST_PAUSE_AFTER_STEP`): the child, once it says
    /// so, and the rest of its stderr to read.
    fn paused_create(
        &self,
        args: &[&dyn AsRef<std::ffi::OsStr>],
        step: u32,
    ) -> (
        std::process::Child,
        std::io::BufReader<std::process::ChildStderr>,
    ) {
        let mut c = self.command(&[&[&"create" as &dyn AsRef<std::ffi::OsStr>], args].concat());
        c.env("COWLINK_DRIVE_TEST_PAUSE_AFTER_STEP", step.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(
            line.contains(&format!("paused after step {step}")),
            "step {step}: {line}"
        );
        (child, err)
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
    cowlink::probe::mounts()
        .unwrap()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .map(|m| m.mount_point)
        .collect()
}

/// The mount on exactly `dir`: (source, fstype, per-mount options).
fn mount_of(dir: &Path) -> Option<(String, String, String)> {
    cowlink::probe::mounts()
        .unwrap()
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_xfs_drive_is_made_mounted_and_removed_without_leftovers() {
    let d = testfs!(Ext4);
    lifecycle(&World::new(d), "xfs", 0x5846_5342);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_btrfs_drive_is_made_mounted_and_removed_without_leftovers() {
    let d = testfs!(Ext4);
    lifecycle(&World::new(d), "btrfs", 0x9123_683e);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn refusals_leave_nothing_behind() {
    let d = testfs!(Ext4);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_failing_mkfs_leaves_no_image_loop_device_or_mount_point() {
    let d = testfs!(Ext4);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_missing_mkfs_is_refused_naming_its_package_and_nothing_is_made() {
    let d = testfs!(Ext4);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn persist_dry_run_prints_a_valid_unit_and_changes_nothing() {
    let d = testfs!(Ext4);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn persist_writes_the_boot_entry_and_remove_takes_it_away() {
    let d = testfs!(Ext4);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_old_boot_unit_is_flagged_and_mount_persist_writes_it_again() {
    let d = testfs!(Ext4);
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
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn remove_and_unmount_are_refused_while_a_process_holds_a_file_on_the_drive() {
    let d = testfs!(Ext4);
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

/// A loop device this test attached (through the kernel's loop control:
/// `losetup -f` asks `/dev/loop-control` for a free device), detached on
/// drop only while it still holds the file it was given.
struct TestLoop {
    dev: String,
    file: PathBuf,
}

impl TestLoop {
    fn attach(file: &Path) -> TestLoop {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .unwrap();
        let dev = ok(&out).trim().to_owned();
        assert!(dev.starts_with("/dev/loop"), "{dev}");
        TestLoop {
            dev,
            file: file.to_path_buf(),
        }
    }
}

impl Drop for TestLoop {
    fn drop(&mut self) {
        if loops_of(&self.file).contains(&self.dev) {
            let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        }
        // A device still open elsewhere for a moment (udev probing it)
        // is only marked to detach on its last close: wait until it is
        // gone, so what follows sees the file unattached.
        for _ in 0..100 {
            if !loops_of(&self.file).contains(&self.dev) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// A mount this test made (`mount ARGS... DIR`), unmounted on drop.
struct TestMount(PathBuf);

impl TestMount {
    fn new(args: &[&dyn AsRef<std::ffi::OsStr>], dir: &Path) -> TestMount {
        fs::create_dir_all(dir).unwrap();
        let mut c = Command::new("mount");
        for a in args {
            c.arg(a.as_ref());
        }
        let st = c.arg(dir).status().unwrap();
        assert!(st.success(), "mount {}", dir.display());
        TestMount(dir.to_path_buf())
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if mount_of(&self.0).is_some() {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
}

/// Make a filesystem image the user owns: `mkfs.FS ARGS FILE` on a sparse
/// file of `size` bytes.
fn user_image(file: &Path, mkfs: &str, args: &[&str], size: u64) {
    fs::File::create(file).unwrap().set_len(size).unwrap();
    let out = Command::new(mkfs).args(args).arg(file).output().unwrap();
    ok(&out);
}

/// Rewrite every record in `w` as the release before identities wrote
/// it (image, mount, fs only).
fn make_records_legacy(w: &World) {
    for n in w.records() {
        let p = w.p("etc/state").join(n);
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        let o = v.as_object_mut().unwrap();
        assert!(o.remove("image_id").is_some() && o.remove("mount_id").is_some());
        assert!(o.remove("image_uuid").is_some());
        fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}

/// Whether the records of `w` all hold identities.
fn records_have_ids(w: &World) -> bool {
    w.records().iter().all(|n| {
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(w.p("etc/state").join(n)).unwrap()).unwrap();
        v["image_id"]["ino"].is_u64()
            && v["mount_id"]["ino"].is_u64()
            && v["image_uuid"].as_str().is_some_and(|u| u.len() == 32)
    })
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn remove_refuses_every_file_drive_create_did_not_make() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // A drive of our own, so that records exist beside the foreign files.
    let (img, mnt) = (w.p("own.img"), w.p("own"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));

    // The table of foreign files: (name, how it is made, words of the
    // refusal). Each must survive `remove --yes` byte for byte.
    type Make = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Make, &[&str])> = vec![
        (
            "notes.txt",
            Box::new(|p| fs::write(p, b"my notes\n").unwrap()),
            &["not a cowlink drive", "no drive record"],
        ),
        (
            "ext4.img",
            Box::new(|p| user_image(p, "mkfs.ext4", &["-q", "-F"], 64 << 20)),
            &["not a cowlink drive"],
        ),
        (
            "mine.xfs",
            Box::new(|p| user_image(p, "mkfs.xfs", &["-q", "-L", "mine"], 300 << 20)),
            &["not a cowlink drive"],
        ),
        (
            // Even labelled as create labels: no record, not ours.
            "labelled.xfs",
            Box::new(|p| user_image(p, "mkfs.xfs", &["-q", "-L", "cowlink"], 300 << 20)),
            &["not a cowlink drive", "no drive record"],
        ),
        (
            "mine.btrfs",
            Box::new(|p| user_image(p, "mkfs.btrfs", &["-q", "-L", "cowlink"], 128 << 20)),
            &["not a cowlink drive"],
        ),
        (
            "fifo",
            Box::new(|p| {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    p,
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o600),
                    0,
                )
                .unwrap()
            }),
            &["not a cowlink drive", "FIFO"],
        ),
        (
            // A device node in the test's own directory (never /dev).
            "null-dev",
            Box::new(|p| {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    p,
                    rustix::fs::FileType::CharacterDevice,
                    rustix::fs::Mode::from_raw_mode(0o600),
                    rustix::fs::makedev(1, 3),
                )
                .unwrap()
            }),
            &["not a cowlink drive"],
        ),
        (
            "a-dir",
            Box::new(|p| fs::create_dir(p).unwrap()),
            &["not a cowlink drive", "directory"],
        ),
        (
            // Another name of the drive's image (a hard link): not
            // deleted under that name, the drive is named instead.
            "hardlink.img",
            Box::new(|p| fs::hard_link(w_img(p), p).unwrap()),
            &["another name", "own.img"],
        ),
        (
            "ends-in-space.img ",
            Box::new(|p| fs::write(p, b"x").unwrap()),
            &["not a cowlink drive"],
        ),
    ];
    fn w_img(p: &Path) -> PathBuf {
        p.with_file_name("own.img")
    }
    for (name, make, words) in &cases {
        let p = w.p(name);
        make(&p);
        let before = fs::symlink_metadata(&p).unwrap();
        let bytes = before.is_file().then(|| fs::read(&p).unwrap());
        let mut c = w.command(&[&"remove", &p, &"--yes"]);
        let out = run_bounded(&mut c, 20);
        refused(&out, words);
        let after = fs::symlink_metadata(&p).unwrap_or_else(|_| panic!("{name} was deleted"));
        assert_eq!(
            (after.dev(), after.ino()),
            (before.dev(), before.ino()),
            "{name}"
        );
        if let Some(b) = bytes {
            assert!(fs::read(&p).unwrap() == b, "{name} changed");
        }
    }
    assert!(img.exists(), "the drive itself is untouched");
    // Nor is it mounted under the other name (one record, one name).
    refused(
        &w.drive(&[&"mount", &w.p("hardlink.img"), &mnt]),
        &["another name", "own.img"],
    );
    assert!(mount_of(&mnt).is_none());
    assert_eq!(w.records().len(), 1);

    // The drive's name now holds another file (the image was replaced):
    // refused, the file kept.
    fs::rename(&img, w.p("moved.img")).unwrap();
    fs::write(&img, b"not the drive").unwrap();
    refused(
        &w.drive(&[&"remove", &img, &"--yes"]),
        &["not the image cowlink made", "replaced"],
    );
    assert_eq!(fs::read(&img).unwrap(), b"not the drive");
    // The image under another name is still the drive (by identity); with
    // a second name (the hard link) deleting one name would not delete it.
    refused(
        &w.drive(&[&"remove", &w.p("moved.img"), &"--yes"]),
        &["another name", "hard link"],
    );
    assert!(w.p("moved.img").exists() && w.p("hardlink.img").exists());
    fs::remove_file(&img).unwrap();
    fs::rename(w.p("moved.img"), &img).unwrap();
    fs::remove_file(w.p("hardlink.img")).unwrap();
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

/// Run `c`, killing it after `secs` seconds (a FIFO must never hang a
/// command): the test fails then.
fn run_bounded(c: &mut Command, secs: u64) -> Output {
    use std::process::Stdio;
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output().unwrap()));
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out,
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("the command hung for {secs} s");
        }
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn legacy_records_keep_working_and_are_migrated_only_for_what_create_made() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("old.img"), w.p("old"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    make_records_legacy(&w);
    assert!(!records_have_ids(&w));
    // status, unmount, mount, remove all work on the legacy record, and
    // the first of them that may write migrates it.
    assert_eq!(w.status(&mnt)["mounted"], true);
    ok(&w.drive(&[&"unmount", &mnt]));
    assert!(records_have_ids(&w), "migrated by unmount");
    make_records_legacy(&w);
    ok(&w.drive(&[&"mount", &img, &mnt]));
    assert!(records_have_ids(&w), "migrated by mount");
    ok(&w.drive(&[&"unmount", &mnt]));
    make_records_legacy(&w);
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);

    // A legacy record naming a user's own image (what create never makes:
    // another label, another filesystem): remove and mount refuse it.
    for (name, mkfs, args, size) in [
        (
            "mine.xfs",
            "mkfs.xfs",
            &["-q", "-L", "mine"][..],
            300u64 << 20,
        ),
        ("mine.ext4", "mkfs.ext4", &["-q", "-F"][..], 64 << 20),
    ] {
        let p = w.p(name);
        user_image(&p, mkfs, args, size);
        let before = fs::read(&p).unwrap();
        fs::create_dir_all(w.p("etc/state")).unwrap();
        let rec = serde_json::json!({"image": p, "mount": w.p("m"), "fs": "xfs"});
        fs::write(w.p("etc/state/legacy.json"), rec.to_string()).unwrap();
        refused(
            &w.drive(&[&"remove", &p, &"--yes"]),
            &["older cowlink", "not what drive create made"],
        );
        assert!(fs::read(&p).unwrap() == before, "{name} changed");
        let m = w.p("m");
        let out = w.drive(&[&"mount", &p, &m]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(mount_of(&m).is_none());
        fs::remove_file(w.p("etc/state/legacy.json")).unwrap();
        fs::remove_file(&p).unwrap();
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_mounted_image_is_found_by_identity_through_any_name() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // Names sysfs mangles or that look like its markers.
    for name in [
        "dev.img ",
        "dev.img (deleted)",
        "sp ace\\x.img",
        "é 日本.img",
    ] {
        fs::create_dir_all(w.p("sd")).unwrap();
        let (img, mnt) = (w.p("sd").join(name), w.p("mnt"));
        ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
        refused(
            &w.drive(&[&"remove", &img, &"--yes"]),
            &["mounted on", "mnt"],
        );
        // The same directory through a bind mount: still the mounted
        // image.
        let bind = TestMount::new(&[&"--bind", &w.p("sd")], &w.p("bind"));
        let other = bind.0.join(name);
        refused(
            &w.drive(&[&"remove", &other, &"--yes"]),
            &["mounted on", "mnt"],
        );
        assert!(img.exists(), "{name:?} kept");
        // Attached but not mounted (a loop device of the test's own).
        ok(&w.drive(&[&"unmount", &mnt]));
        let lp = TestLoop::attach(&img);
        refused(
            &w.drive(&[&"remove", &other, &"--yes"]),
            &["attached to", &lp.dev],
        );
        drop(lp);
        // Unmounted, through the other name: refused, naming the drive.
        refused(&w.drive(&[&"remove", &other, &"--yes"]), &["another name"]);
        drop(bind);
        ok(&w.drive(&[&"remove", &img, &"--yes"]));
        nothing_left(&w, &img);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn unmount_refuses_every_mount_cowlink_did_not_make() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("own.img"), w.p("own"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));

    // A tmpfs.
    let t = TestMount::new(&[&"-t", &"tmpfs", &"none"], &w.p("tmp"));
    refused(&w.drive(&[&"unmount", &t.0]), &["not a drive", "tmpfs"]);
    assert!(mount_of(&t.0).is_some());
    drop(t);

    // The user's own XFS image, loop-mounted by hand (even labelled as
    // create labels).
    for label in ["mine", "cowlink"] {
        let mine = w.p(&format!("{label}.xfs"));
        user_image(&mine, "mkfs.xfs", &["-q", "-L", label], 300 << 20);
        let lp = TestLoop::attach(&mine);
        let m = TestMount::new(&[&lp.dev], &w.p(&format!("{label}-mnt")));
        refused(
            &w.drive(&[&"unmount", &m.0]),
            &["not a cowlink drive", "no drive record"],
        );
        assert!(mount_of(&m.0).is_some(), "still mounted");
        assert_eq!(
            loops_of(&mine),
            std::slice::from_ref(&lp.dev),
            "still attached"
        );
        drop(m);
        drop(lp);
    }

    // cowlink's own drive image, mounted by hand elsewhere: the image is
    // a drive, the mount is not cowlink's.
    let lp = TestLoop::attach(&img);
    let m = TestMount::new(&[&lp.dev], &w.p("by-hand"));
    refused(
        &w.drive(&[&"unmount", &m.0]),
        &["mounted there, but not by cowlink", "own"],
    );
    assert!(mount_of(&m.0).is_some());
    assert_eq!(loops_of(&img), std::slice::from_ref(&lp.dev));
    drop(m);
    drop(lp);

    // Nothing mounted: nothing to do.
    assert!(ok(&w.drive(&[&"unmount", &mnt])).contains("nothing to do"));
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_mount_point_holding_the_image_is_refused() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    fs::create_dir_all(w.p("d/sd")).unwrap();
    let img = w.p("d/sd/x.img");
    let bind = TestMount::new(&[&"--bind", &w.p("d/sd")], &w.p("b"));
    // The image's directory, an ancestor, the directory through a bind
    // mount, and through `..`.
    let ancestors = [w.p("d/sd"), w.p("d"), bind.0.clone(), w.p("d/sd/../sd")];
    for m in &ancestors {
        let before = names(&w.p("d/sd"));
        refused(
            &w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", m]),
            &["over its own image"],
        );
        assert_eq!(names(&w.p("d/sd")), before);
        assert!(!img.exists() && loops_of_dir(&w.root).is_empty() && w.records().is_empty());
        assert_eq!(
            mounts_under(&w.root),
            std::slice::from_ref(&bind.0),
            "only the test's bind mount"
        );
    }
    // `drive mount` of an existing drive: the same rule.
    let mnt = w.p("ok");
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));
    for m in &ancestors {
        refused(&w.drive(&[&"mount", &img, m]), &["over its own image"]);
        assert_eq!(
            mounts_under(&w.root),
            std::slice::from_ref(&bind.0),
            "only the test's bind mount"
        );
        assert!(loops_of(&img).is_empty());
    }
    drop(bind);
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

/// A device the undo lets go while another process still has it open (as
/// udev or blkid may, probing it after mkfs) detaches only on that last
/// close: the command waits for it before it says everything was undone.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_undo_waits_for_a_device_held_open_by_another_process_to_detach() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // Paused after step 4 (attached, not mounted) and step 5 (mounted).
    for step in [4, 5] {
        let (img, mnt) = (w.p("h.img"), w.p("h"));
        let (mut child, mut err) =
            w.paused_create(&[&img, &"--size", &"1G", &"--mount", &mnt], step);
        let devs = loops_of(&img);
        assert_eq!(devs.len(), 1, "step {step}: {devs:?}");
        // The "prober": holds the device for 400 ms after the signal.
        let held = fs::File::open(&devs[0]).unwrap();
        let prober = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(400));
            drop(held);
        });
        common::sigint(&child);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        let st = child.wait().unwrap();
        // Checked before the prober is joined: the command itself must
        // have seen the device go.
        let left = loops_of_dir(&w.root);
        prober.join().unwrap();
        assert_eq!(st.code(), Some(130), "step {step}: {rest}");
        assert!(rest.contains("undone"), "{rest}");
        assert_eq!(left, Vec::<String>::new(), "step {step}: loop device left");
        nothing_left(&w, &img);
        assert!(!mnt.exists(), "step {step}: mount point left");
    }
}

/// A device another process holds past the undo's wait (5 s): the
/// command does not say nothing is left; it names the device that still
/// holds the deleted image, which goes once the holder lets go.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn an_undo_names_a_device_another_process_still_holds() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("l.img"), w.p("l"));
    let (mut child, mut err) = w.paused_create(&[&img, &"--size", &"1G", &"--mount", &mnt], 4);
    let devs = loops_of(&img);
    assert_eq!(devs.len(), 1, "{devs:?}");
    let held = fs::File::open(&devs[0]).unwrap();
    common::sigint(&child);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130), "{rest}");
    assert!(
        rest.contains(&format!("{} still holds the image, deleted", devs[0]))
            && !rest.contains("no image, mount, loop device"),
        "{rest}"
    );
    // Still there while held; gone once let go.
    assert_eq!(loops_of_dir(&w.root), devs);
    drop(held);
    for _ in 0..200 {
        if loops_of_dir(&w.root).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    nothing_left(&w, &img);
    assert!(!mnt.exists(), "mount point left");
}

/// `drive mount` interrupted at random moments (SIGINT or SIGTERM, 0-40 ms
/// in): it is made whole (exit 0, mounted and recorded) or undone whole
/// (exit 130: no mount, no mount point it made, no loop device), never
/// half.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_signal_during_mount_makes_it_whole_or_undoes_it() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let img = w.p("m.img");
    let first = w.p("m0");
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &first]));
    ok(&w.drive(&[&"unmount", &first]));
    let mut rng = fastrand::Rng::with_seed(49);
    let (mut made, mut undone) = (0, 0);
    for i in 0..40 {
        let mnt = w.p(&format!("m-{i}"));
        let mut c = w.command(&[&"mount", &img, &mnt]);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let child = c.spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_micros(rng.u64(..40_000)));
        let sig = if rng.bool() { "-INT" } else { "-TERM" };
        let _ = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status();
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        match out.status.code() {
            Some(0) => {
                made += 1;
                assert!(
                    mount_of(&mnt).is_some(),
                    "run {i}: exit 0, not mounted: {err}"
                );
                assert_eq!(loops_of(&img).len(), 1, "run {i}");
                ok(&w.drive(&[&"unmount", &mnt]));
            }
            // Killed before its handler was in place, or stopped by it
            // before the mount began (at its very start: nothing is made
            // yet, nothing said), or interrupted and undone (said so).
            None | Some(130) => {
                undone += 1;
                if !err.trim().is_empty() {
                    assert!(err.contains("interrupted"), "run {i}: {err}");
                }
                assert!(mount_of(&mnt).is_none(), "run {i}: mount left: {err}");
                assert!(!mnt.exists(), "run {i}: mount point left: {err}");
                assert_eq!(loops_of(&img), Vec::<String>::new(), "run {i}: {err}");
            }
            other => panic!("run {i}: {other:?}: {err}"),
        }
        assert!(
            mounts_under(&w.root).is_empty(),
            "run {i}: {:?}",
            mounts_under(&w.root)
        );
    }
    eprintln!("{made} mounts made whole, {undone} undone");
    assert!(
        undone > 0,
        "no run was interrupted: the test proves nothing"
    );
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_signal_at_each_step_of_create_undoes_every_step() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let fstab = w.p("etc/fstab");
    fs::write(&fstab, "UUID=x / ext4 defaults 0 1\n").unwrap();
    let steps = 8;
    // Steps 0 (before anything) to 8 (boot entry written), with SIGINT
    // and SIGTERM, and a second signal during the undo; both boot entry
    // kinds.
    for step in 0..=steps {
        for (sig, twice) in [("INT", false), ("TERM", step % 3 == 0)] {
            let (img, mnt) = (w.p("c.img"), w.p("c"));
            let persist = if step % 2 == 0 {
                "--persist=systemd"
            } else {
                "--persist=fstab"
            };
            let (mut child, mut err) = w.paused_create(
                &[
                    &img,
                    &"--size",
                    &"1G",
                    &"--mount",
                    &mnt,
                    &"--fs",
                    &(if step % 4 == 1 { "btrfs" } else { "xfs" }),
                    &persist,
                ],
                step,
            );
            let kill = |s: &str| {
                Command::new("kill")
                    .arg(format!("-{s}"))
                    .arg(child.id().to_string())
                    .status()
                    .unwrap()
            };
            kill(sig);
            if twice {
                kill(sig);
            }
            let mut rest = String::new();
            std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
            let st = child.wait().unwrap();
            assert_eq!(st.code(), Some(130), "step {step} SIG{sig}: {rest}");
            assert!(
                rest.contains("interrupted") && rest.contains("undone"),
                "{rest}"
            );
            nothing_left(&w, &img);
            assert!(
                !mnt.exists(),
                "step {step}: the mount point it made is left"
            );
            let units = w.p("etc/units");
            let unit_files: Vec<String> = match units.is_dir() {
                true => names(&units)
                    .into_iter()
                    .filter(|n| n.ends_with(".service"))
                    .collect(),
                false => Vec::new(),
            };
            assert_eq!(unit_files, Vec::<String>::new(), "step {step}: unit left");
            if units.join("local-fs.target.wants").is_dir() {
                assert_eq!(
                    names(&units.join("local-fs.target.wants")),
                    Vec::<String>::new()
                );
            }
            assert_eq!(
                fs::read_to_string(&fstab).unwrap(),
                "UUID=x / ext4 defaults 0 1\n",
                "step {step}: fstab entry left"
            );
        }
    }
    // An existing empty mount point is kept (not made by create).
    fs::create_dir(w.p("kept")).unwrap();
    let img = w.p("k.img");
    let (mut child, _err) = w.paused_create(&[&img, &"--size", &"1G", &"--mount", &w.p("kept")], 5);
    common::sigint(&child);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    nothing_left(&w, &img);
    assert!(w.p("kept").is_dir(), "a mount point it did not make stays");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn unit_file_paths_are_escaped_quoted_or_refused() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // An injection attempt: refused before anything is made.
    let evil = w.p("x\n[Service]\nExecStartPre=touch cowlink-pwned\n");
    let img = w.p("e.img");
    for with in ["--persist=systemd", "--persist=systemd --dry-run"] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"create", &img, &"--size", &"1G", &"--mount", &evil];
        let words: Vec<&str> = with.split(' ').collect();
        for a in &words {
            args.push(a);
        }
        refused(&w.drive(&args), &["control character", "boot entry"]);
        nothing_left(&w, &img);
        assert!(!evil.exists() && !w.p("etc/units").exists());
    }
    // Expressible hostile names: the dry run's unit passes systemd's own
    // check, and its name is what systemd-escape says.
    for name in [
        "a b\\c",
        "-x:y",
        "%h$USER",
        "q\"uote'",
        ".dot",
        "é 日本",
        "tail\\",
    ] {
        let (img, mnt) = (w.p(&format!("{name}.img")), w.p(name));
        let out = ok(&w.drive(&[
            &"create",
            &img,
            &"--size",
            &"1G",
            &"--mount",
            &mnt,
            &"--persist=systemd",
            &"--dry-run",
            &"--json",
        ]));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let file = PathBuf::from(v["persist"]["file"].as_str().unwrap());
        let unit_text = v["persist"]["text"].as_str().unwrap();
        let esc = Command::new("systemd-escape")
            .args(["--path", "--"])
            .arg(&mnt)
            .output()
            .unwrap();
        let want = format!("cowlink-drive-{}.service", text(&esc.stdout).trim());
        assert_eq!(
            file.file_name().unwrap().to_str().unwrap(),
            want,
            "{name:?}"
        );
        // Verified under a name without `:` (systemd-analyze verify takes
        // `:` in a file name as a separator; systemd itself loads such
        // units: device units are full of them).
        let f = w.p("verify").join(want.replace(':', "_"));
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(&f, unit_text).unwrap();
        if let Ok(v) = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&f)
            .output()
        {
            assert!(
                v.status.success() && !text(&v.stderr).contains(".service:"),
                "{name:?}: {}",
                text(&v.stderr)
            );
        }
        nothing_left(&w, &img);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sizes_beyond_any_file_are_refused_in_words() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("big.img"), w.p("big"));
    for extra in [
        &[][..],
        &["--sparse-ok"][..],
        &["--sparse-ok", "--dry-run"][..],
    ] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
            &"create",
            &img,
            &"--size",
            &"18446744073709551615",
            &"--mount",
            &mnt,
        ];
        for a in extra {
            args.push(a);
        }
        let out = w.drive(&args);
        let err = text(&out.stderr);
        assert!(!err.contains("out of range integral"), "{err}");
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("big.img"), "{err}");
        nothing_left(&w, &img);
        assert!(!mnt.exists());
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn list_without_root_says_unknown_not_no_when_no_trial_can_run() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&w.root, fs::Permissions::from_mode(0o755)).unwrap();
    let (img, mnt) = (w.p("l.img"), w.p("l"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    for dir in ["etc", "etc/state"] {
        fs::set_permissions(w.p(dir), fs::Permissions::from_mode(0o755)).unwrap();
    }
    let nobody = |json: bool| {
        let inner = w.command(&[&"list"]);
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(inner.get_program())
            .args(inner.get_args());
        if json {
            c.arg("--json");
        }
        for (k, v) in inner.get_envs() {
            if let Some(v) = v {
                c.env(k, v);
            }
        }
        ok(&c.output().unwrap())
    };
    let v: serde_json::Value = serde_json::from_str(&nobody(true)).unwrap();
    assert_eq!(v[0]["mounted"], true, "{v}");
    assert_eq!(v[0]["reflink"], serde_json::Value::Null, "{v}");
    assert!(v[0]["reflink_reason"].is_string(), "{v}");
    let table = nobody(false);
    assert!(
        table.contains("unknown") && !table.contains(" NO "),
        "{table}"
    );
    // As root the trial runs: yes.
    assert_eq!(w.status(&mnt)["reflink"], true);
    ok(&w.drive(&[&"unmount", &mnt]));
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_file_that_takes_a_drive_s_inode_is_not_the_drive() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("gone.img"), w.p("gone"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));
    // The drive's image is deleted behind cowlink's back and a user's own
    // image gets its device and inode (made certain here by writing the
    // new file's identity into the record, as inode reuse would).
    fs::remove_file(&img).unwrap();
    let mine = w.p("mine.xfs");
    user_image(&mine, "mkfs.xfs", &["-q", "-L", "cowlink"], 300 << 20);
    let m = fs::metadata(&mine).unwrap();
    let rec = w.p("etc/state").join(&w.records()[0]);
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&rec).unwrap()).unwrap();
    v["image_id"] = serde_json::json!({"dev": m.dev(), "ino": m.ino()});
    fs::write(&rec, v.to_string()).unwrap();
    let before = fs::read(&mine).unwrap();
    refused(
        &w.drive(&[&"remove", &mine, &"--yes"]),
        &["not the drive a record names", "filesystem"],
    );
    refused(&w.drive(&[&"mount", &mine, &w.p("m2")]), &["not the drive"]);
    assert!(mount_of(&w.p("m2")).is_none());
    assert!(
        fs::read(&mine).unwrap() == before,
        "the user's image changed"
    );
    // Mounted by hand on the drive's own mount point: unmount refuses.
    let lp = TestLoop::attach(&mine);
    let tm = TestMount::new(&[&lp.dev], &mnt);
    refused(&w.drive(&[&"unmount", &mnt]), &["not a cowlink drive"]);
    assert!(mount_of(&mnt).is_some());
    drop(tm);
    drop(lp);
    assert!(mine.exists());
    // The drive's leftovers (record, mount point) go with remove of the
    // name whose file is gone.
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    assert!(w.records().is_empty() && !mnt.exists());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ctrl_c_to_the_process_group_while_mkfs_runs_undoes_everything() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // A mkfs that says it started and then waits: the terminal's Ctrl-C
    // reaches it and cowlink together (the whole foreground group).
    let bin_dir = w.p("fakebin");
    fs::create_dir(&bin_dir).unwrap();
    let started = w.p("mkfs-started");
    let fake = bin_dir.join("mkfs.xfs");
    fs::write(
        &fake,
        format!("#!/bin/sh\ntouch '{}'\nexec sleep 60\n", started.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let (img, mnt) = (w.p("g.img"), w.p("g"));
    let mut c = w.command(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]);
    c.env(
        "PATH",
        format!(
            "{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            bin_dir.display()
        ),
    );
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    c.stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Up to 60 s: on a loaded machine the run up to mkfs can take seconds.
    for _ in 0..6000 {
        if started.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(started.exists(), "the fake mkfs never ran");
    assert!(img.exists() && mnt.is_dir(), "steps 1 and 2 were made");
    let st = Command::new("kill")
        .args(["-INT", "--"])
        .arg(format!("-{}", child.id()))
        .status()
        .unwrap();
    assert!(st.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    nothing_left(&w, &img);
    assert!(!mnt.exists());
}

/// Run every command in `cs` at once; their outputs, in order.
fn all_at_once(cs: Vec<Command>) -> Vec<Output> {
    let children: Vec<std::process::Child> = cs
        .into_iter()
        .map(|mut c| {
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn drive_commands_run_at_once_never_attach_or_mount_one_image_twice() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // Btrfs: the kernel mounts two loop devices over one Btrfs image as two
    // filesystems (XFS would refuse the duplicate UUID), so only cowlink's
    // own serialisation keeps the image from being written by two.
    let (img, mnt) = (w.p("race.img"), w.p("race"));
    ok(&w.drive(&[
        &"create", &img, &"--size", &"1G", &"--mount", &mnt, &"--fs", &"btrfs",
    ]));
    ok(&w.drive(&[&"unmount", &mnt]));
    for round in 0..4 {
        // Several mounts of one image on different directories at once:
        // exactly one wins, the others are refused as "already mounted".
        let dirs: Vec<PathBuf> = (0..4).map(|i| w.p(&format!("m{round}-{i}"))).collect();
        let outs = all_at_once(
            dirs.iter()
                .map(|m| w.command(&[&"mount", &img, m]))
                .collect(),
        );
        let won = outs.iter().filter(|o| o.status.success()).count();
        assert_eq!(won, 1, "round {round}: {won} mounts succeeded");
        for o in outs.iter().filter(|o| !o.status.success()) {
            refused(o, &["already mounted"]);
        }
        assert_eq!(mounts_under(&w.root).len(), 1, "round {round}");
        assert_eq!(loops_of(&img).len(), 1, "round {round}: loop devices");
        let at = mounts_under(&w.root).pop().unwrap();
        // An unmount, a mount elsewhere and a remove at once: whatever
        // order they run in, the image is never mounted twice nor deleted
        // while attached, and the survivors are consistent.
        let other = w.p(&format!("o{round}"));
        let outs = all_at_once(vec![
            w.command(&[&"unmount", &at]),
            w.command(&[&"mount", &img, &other]),
            w.command(&[&"remove", &img, &"--yes"]),
        ]);
        let mounts = mounts_under(&w.root);
        assert!(mounts.len() <= 1, "round {round}: {mounts:?}");
        if img.exists() {
            assert_eq!(loops_of(&img).len(), mounts.len(), "round {round}");
            assert!(!outs[2].status.success());
            for m in mounts {
                ok(&w.drive(&[&"unmount", &m]));
            }
        } else {
            assert!(outs[2].status.success(), "{}", text(&outs[2].stderr));
            assert!(mounts.is_empty() && loops_of_dir(&w.root).is_empty());
            assert!(w.records().is_empty());
            ok(&w.drive(&[
                &"create", &img, &"--size", &"1G", &"--mount", &mnt, &"--fs", &"btrfs",
            ]));
            ok(&w.drive(&[&"unmount", &mnt]));
        }
    }
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_drive_is_its_own_though_a_stale_record_holds_its_inode() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // A drive's image deleted by hand leaves its record; a later drive's
    // image gets the same device and inode (written into the stale record
    // here, as inode reuse does). The stale record sorts before and after
    // the live one.
    for stale_name in ["a-stale", "z-stale"] {
        let (old, old_mnt) = (w.p(&format!("{stale_name}.img")), w.p(stale_name));
        ok(&w.drive(&[&"create", &old, &"--size", &"1G", &"--mount", &old_mnt]));
        ok(&w.drive(&[&"unmount", &old_mnt]));
        fs::remove_file(&old).unwrap();
        let (img, mnt) = (w.p("m-live.img"), w.p("m-live"));
        ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
        let m = fs::metadata(&img).unwrap();
        let state = w.p("etc/state");
        let stale = w
            .records()
            .into_iter()
            .map(|n| state.join(n))
            .find(|p| fs::read_to_string(p).unwrap().contains(stale_name))
            .unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&stale).unwrap()).unwrap();
        v["image_id"] = serde_json::json!({"dev": m.dev(), "ino": m.ino()});
        fs::write(&stale, v.to_string()).unwrap();
        // The stale record is not shown mounted where the live drive is.
        let st = w.status(&old);
        assert_eq!(st["mounted"], false, "{st}");
        assert_eq!(st["mounted_elsewhere"], serde_json::Value::Null, "{st}");
        assert_eq!(st["loop_device"], serde_json::Value::Null, "{st}");
        assert_eq!(w.status(&mnt)["mounted"], true);
        // The live drive is still recognised by every operation.
        ok(&w.drive(&[&"unmount", &mnt]));
        assert!(mount_of(&mnt).is_none());
        ok(&w.drive(&[&"mount", &img, &mnt]));
        ok(&w.drive(&[&"mount", &img, &mnt, &"--persist=fstab"]));
        ok(&w.drive(&[&"unmount", &mnt]));
        ok(&w.drive(&[&"remove", &img, &"--yes"]));
        assert!(!img.exists() && !mnt.exists());
        // The stale drive's leftovers go by its name.
        ok(&w.drive(&[&"remove", &old, &"--yes"]));
        nothing_left(&w, &img);
        assert!(!old_mnt.exists());
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_drive_never_takes_or_removes_another_drive_s_boot_unit_on_a_shared_mount_point() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // Two drives recorded on one mount point (one mounted at a time); the
    // first is brought back at boot by a unit named after that point.
    let (a, b, mnt) = (w.p("a.img"), w.p("b.img"), w.p("shared dir"));
    ok(&w.drive(&[
        &"create",
        &a,
        &"--size",
        &"1G",
        &"--mount",
        &mnt,
        &"--persist=systemd",
    ]));
    ok(&w.drive(&[&"unmount", &mnt]));
    ok(&w.drive(&[&"create", &b, &"--size", &"1G", &"--mount", &mnt]));
    let units = w.p("etc/units");
    let unit = units.join(
        names(&units)
            .into_iter()
            .find(|n| n.ends_with(".service"))
            .unwrap(),
    );
    let a_unit = fs::read_to_string(&unit).unwrap();
    // B is not brought back at boot, and is not told to rewrite A's unit.
    let st = w.status(&b);
    assert_eq!(st["persist"], serde_json::Value::Null, "{st}");
    assert!(!st["warnings"].to_string().contains("boot unit"), "{st}");
    assert_eq!(w.status(&a)["persist"], "systemd");
    // B cannot take A's unit, but may be persisted by fstab.
    refused(
        &w.drive(&[&"mount", &b, &mnt, &"--persist=systemd"]),
        &["another drive"],
    );
    ok(&w.drive(&[&"mount", &b, &mnt, &"--persist=fstab"]));
    assert_eq!(fs::read_to_string(&unit).unwrap(), a_unit);
    // Removing B removes its fstab entry, not A's unit, nor the mount
    // point A is recorded on.
    ok(&w.drive(&[&"unmount", &mnt]));
    ok(&w.drive(&[&"remove", &b, &"--yes"]));
    assert_eq!(fs::read_to_string(&unit).unwrap(), a_unit);
    assert!(units
        .join("local-fs.target.wants")
        .join(unit.file_name().unwrap())
        .symlink_metadata()
        .is_ok());
    assert!(!fs::read_to_string(w.p("etc/fstab"))
        .unwrap_or_default()
        .contains("b.img"));
    assert!(mnt.is_dir());
    assert_eq!(w.status(&a)["persist"], "systemd");
    // A's own remove takes its unit.
    ok(&w.drive(&[&"remove", &a, &"--yes"]));
    assert!(!unit.exists());
    nothing_left(&w, &a);
    assert!(!mnt.exists());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_drive_moved_behind_cowlink_s_back_is_removed_by_its_new_name_and_a_link_is_not() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // (what is done to the drive after create, the name it then has, whether
    // `mount` under the recorded name still works)
    type Move = fn(&World) -> PathBuf;
    let moves: [(&str, Move, bool); 3] = [
        (
            "directory moved, a symlink left in its place",
            |w| {
                fs::rename(w.p("dir"), w.p("dir2")).unwrap();
                std::os::unix::fs::symlink("dir2", w.p("dir")).unwrap();
                w.p("dir/d.img")
            },
            true,
        ),
        (
            "directory renamed",
            |w| {
                fs::rename(w.p("dir"), w.p("dir2")).unwrap();
                w.p("dir2/d.img")
            },
            false,
        ),
        (
            "image renamed",
            |w| {
                fs::rename(w.p("dir/d.img"), w.p("dir/e.img")).unwrap();
                w.p("dir/e.img")
            },
            false,
        ),
    ];
    let fstab = w.p("etc/fstab");
    for (what, mv, mountable) in moves {
        fs::write(&fstab, "UUID=x / ext4 defaults 0 1\n").unwrap();
        fs::create_dir(w.p("dir")).unwrap();
        let (img, mnt) = (w.p("dir/d.img"), w.p("m"));
        ok(&w.drive(&[
            &"create",
            &img,
            &"--size",
            &"1G",
            &"--mount",
            &mnt,
            &"--persist=fstab",
        ]));
        ok(&w.drive(&[&"unmount", &mnt]));
        let now = mv(&w);
        if mountable {
            ok(&w.drive(&[&"mount", &now, &mnt]));
            ok(&w.drive(&[&"mount", &now, &mnt, &"--persist=fstab"]));
            assert_eq!(w.records().len(), 1, "{what}: one record");
            assert_eq!(
                fs::read_to_string(&fstab)
                    .unwrap()
                    .matches("loop,noatime")
                    .count(),
                1,
                "{what}: one boot entry"
            );
            ok(&w.drive(&[&"unmount", &mnt]));
        }
        // A hard link beside it is another name: refused, nothing done.
        let link = w.p("link.img");
        fs::hard_link(&now, &link).unwrap();
        refused(&w.drive(&[&"remove", &link, &"--yes"]), &["another name"]);
        fs::remove_file(&link).unwrap();
        let out = ok(&w.drive(&[&"remove", &now, &"--yes"]));
        assert!(out.contains("boot entry"), "{what}: {out}");
        assert!(!now.exists(), "{what}: image left");
        assert!(w.records().is_empty(), "{what}: record left");
        assert_eq!(
            fs::read_to_string(&fstab).unwrap(),
            "UUID=x / ext4 defaults 0 1\n",
            "{what}: boot entry left"
        );
        nothing_left(&w, &now);
        for p in ["dir", "dir2"] {
            let p = w.p(p);
            if p.symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
            {
                fs::remove_file(&p).unwrap();
            } else if p.exists() {
                fs::remove_dir_all(&p).unwrap();
            }
        }
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn hostile_records_never_make_a_user_file_a_drive() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // A drive, so that the state directory is real; then records edited
    // to name a user's files by their device and inode.
    let (img, mnt) = (w.p("d.img"), w.p("d"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));
    let text = w.p("notes.txt");
    fs::write(&text, b"my notes").unwrap();
    let xfs = w.p("mine.xfs");
    user_image(&xfs, "mkfs.xfs", &["-q", "-L", "data"], 300 << 20);
    let btrfs_cowlink = w.p("mine.btrfs");
    user_image(
        &btrfs_cowlink,
        "mkfs.btrfs",
        &["-q", "-L", "cowlink"],
        300 << 20,
    );
    let state = w.p("etc/state");
    for victim in [&text, &xfs, &btrfs_cowlink] {
        let m = fs::metadata(victim).unwrap();
        let id = serde_json::json!({"dev": m.dev(), "ino": m.ino()});
        let before = fs::read(victim).unwrap();
        // (record fields) — every one names the victim by identity.
        let hostile = [
            serde_json::json!({"image": victim, "mount": w.p("v"), "fs": "xfs", "image_id": id}),
            serde_json::json!({"image": w.p("elsewhere.img"), "mount": w.p("v"), "fs": "xfs", "image_id": id}),
            serde_json::json!({"image": victim, "mount": w.p("v"), "fs": "xfs", "image_id": id, "image_uuid": ""}),
            serde_json::json!({"image": victim, "mount": w.p("v"), "fs": "xfs", "image_id": id, "image_uuid": "00000000000000000000000000000000"}),
        ];
        for (i, r) in hostile.iter().enumerate() {
            let rec = state.join(format!("{i:016x}.json"));
            fs::write(&rec, r.to_string()).unwrap();
            refused(
                &w.drive(&[&"remove", victim, &"--yes"]),
                &["not the drive a record names"],
            );
            assert_eq!(fs::read(victim).unwrap(), before, "{r}");
            fs::remove_file(&rec).unwrap();
        }
    }
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_drive_is_never_mounted_over_cowlink_s_own_records_units_or_fstab() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("d.img"), w.p("d"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));
    // Empty, so that nothing but their role refuses them.
    let state = w.p("etc/state");
    for name in names(&state) {
        fs::rename(state.join(&name), w.p(&name)).unwrap();
    }
    fs::create_dir_all(w.p("etc/units")).unwrap();
    std::os::unix::fs::symlink(&state, w.p("to-state")).unwrap();
    let targets = [
        state.clone(),
        w.p("etc/units"),
        w.p("etc"),
        w.p("to-state"),
        w.p("etc/units/../state"),
    ];
    for (i, t) in targets.iter().enumerate() {
        let img2 = w.p(&format!("n{i}.img"));
        refused(
            &w.drive(&[&"create", &img2, &"--size", &"1G", &"--mount", t]),
            &["cowlink's own files"],
        );
        assert!(!img2.exists() && mounts_under(&w.root).is_empty());
    }
    for name in names(&w.root).into_iter().filter(|n| n.ends_with(".json")) {
        fs::rename(w.p(&name), state.join(&name)).unwrap();
    }
    for t in &targets[..2] {
        refused(&w.drive(&[&"mount", &img, t]), &["cowlink's own files"]);
        assert!(mounts_under(&w.root).is_empty());
    }
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn mount_leaves_a_user_s_own_loop_device_over_the_image_alone() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (img, mnt) = (w.p("d.img"), w.p("d"));
    ok(&w.drive(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));
    // The user's own device over the drive's image (losetup -f), read-only
    // and read-write: refused, the device kept attached.
    for ro in [false, true] {
        let lp = match ro {
            false => TestLoop::attach(&img),
            true => {
                let out = Command::new("losetup")
                    .args(["-f", "--show", "-r"])
                    .arg(&img)
                    .output()
                    .unwrap();
                TestLoop {
                    dev: ok(&out).trim().to_owned(),
                    file: img.clone(),
                }
            }
        };
        refused(
            &w.drive(&[&"mount", &img, &mnt]),
            &["attached to", &lp.dev, "losetup -d"],
        );
        assert_eq!(loops_of(&img), vec![lp.dev.clone()]);
        assert!(mount_of(&mnt).is_none() && mnt.is_dir());
        drop(lp);
    }
    ok(&w.drive(&[&"mount", &img, &mnt]));
    ok(&w.drive(&[&"unmount", &mnt]));
    ok(&w.drive(&[&"remove", &img, &"--yes"]));
    nothing_left(&w, &img);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn mkfs_killed_by_the_terminal_s_signal_is_an_interrupt_whichever_is_seen_first() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    // The signal reaches mkfs, and cowlink sees mkfs dead of it before its
    // own handler has run (made certain here: only mkfs gets it).
    for sig in ["INT", "TERM"] {
        let bin_dir = w.p(&format!("bin-{sig}"));
        fs::create_dir(&bin_dir).unwrap();
        let fake = bin_dir.join("mkfs.xfs");
        fs::write(&fake, format!("#!/bin/sh\nkill -{sig} $$\nsleep 5\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
        let (img, mnt) = (w.p("s.img"), w.p("s"));
        let mut c = w.command(&[&"create", &img, &"--size", &"1G", &"--mount", &mnt]);
        c.env(
            "PATH",
            format!("{}:/usr/bin:/bin:/usr/sbin:/sbin", bin_dir.display()),
        );
        let out = c.output().unwrap();
        failed_with(&out, 130, &["interrupted", "undone"]);
        nothing_left(&w, &img);
        assert!(!mnt.exists());
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_copy_of_a_drive_is_the_user_s_file_not_a_drive() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    for fs_name in ["xfs", "btrfs"] {
        let (img, mnt) = (w.p("d.img"), w.p("d"));
        ok(&w.drive(&[
            &"create", &img, &"--size", &"1G", &"--mount", &mnt, &"--fs", &fs_name,
        ]));
        ok(&w.drive(&[&"unmount", &mnt]));
        let copy = w.p("copy.img");
        let st = Command::new("cp")
            .arg("--sparse=always")
            .arg(&img)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(st.success());
        let before = fs::metadata(&copy).unwrap().len();
        refused(
            &w.drive(&[&"mount", &copy, &w.p("c")]),
            &["copy of the drive"],
        );
        assert!(mounts_under(&w.root).is_empty() && loops_of_dir(&w.root).is_empty());
        assert_eq!(w.records().len(), 1, "{fs_name}: the copy was recorded");
        refused(
            &w.drive(&[&"remove", &copy, &"--yes"]),
            &["not a cowlink drive"],
        );
        assert_eq!(fs::metadata(&copy).unwrap().len(), before);
        // Mounted by hand (while the drive is mounted too, for Btrfs),
        // the copy is never unmounted by cowlink.
        ok(&w.drive(&[&"mount", &img, &mnt]));
        if fs_name == "btrfs" {
            let lp = TestLoop::attach(&copy);
            let tm = TestMount::new(&[&lp.dev], &w.p("c"));
            refused(&w.drive(&[&"unmount", &w.p("c")]), &["not a cowlink drive"]);
            assert!(mount_of(&w.p("c")).is_some());
            drop(tm);
            drop(lp);
        }
        ok(&w.drive(&[&"unmount", &mnt]));
        ok(&w.drive(&[&"remove", &img, &"--yes"]));
        nothing_left(&w, &img);
        // The drive gone, its copy is taken as a drive whose record was
        // lost (it is what create makes), and then is one.
        ok(&w.drive(&[&"mount", &copy, &w.p("c")]));
        ok(&w.drive(&[&"unmount", &w.p("c")]));
        ok(&w.drive(&[&"remove", &copy, &"--yes"]));
        nothing_left(&w, &copy);
        let _ = fs::remove_dir(w.p("c"));
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn remove_never_follows_a_symlink_named_to_another_drive() {
    let d = testfs!(Ext4);
    let w = World::new(d);
    let (a, b) = (w.p("a.img"), w.p("b.img"));
    ok(&w.drive(&[&"create", &a, &"--size", &"1G", &"--mount", &w.p("a")]));
    ok(&w.drive(&[&"create", &b, &"--size", &"1G", &"--mount", &w.p("b")]));
    ok(&w.drive(&[&"unmount", &w.p("a")]));
    ok(&w.drive(&[&"unmount", &w.p("b")]));
    // A's name replaced by a symlink to B (absolute and relative), and a
    // new name that is a symlink to B.
    fs::rename(&a, w.p("a-moved.img")).unwrap();
    for (link, to) in [
        (a.clone(), b.clone()),
        (a.clone(), PathBuf::from("b.img")),
        (w.p("to-b.img"), b.clone()),
    ] {
        std::os::unix::fs::symlink(&to, &link).unwrap();
        refused(&w.drive(&[&"remove", &link, &"--yes"]), &["symlink"]);
        assert!(b.is_file() && link.symlink_metadata().is_ok());
        assert_eq!(w.records().len(), 2);
        fs::remove_file(&link).unwrap();
    }
    fs::rename(w.p("a-moved.img"), &a).unwrap();
    for img in [&a, &b] {
        ok(&w.drive(&[&"remove", img, &"--yes"]));
    }
    nothing_left(&w, &a);
    nothing_left(&w, &b);
}
