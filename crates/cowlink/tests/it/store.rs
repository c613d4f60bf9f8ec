//! The content-addressed store on real filesystems: materialized files
//! share the objects' blocks, writes to them never reach the store, ext4
//! copies, hostile manifests are refused, reference limits roll over to
//! new generations, verify quarantines, gc keeps what is referenced.

use std::fs;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use cowlink::store::{
    CheckoutOptions, Digest, EntryKind, LinkMode, LinkVerdict, Manifest, ManifestEntry, Store,
};
use cowlink::{ErrorKind, Method};
use cowlink_testfs::{data, names, temporaries, testfs, write_file};

use crate::same_blocks;

const KIB: usize = 1024;

/// A tree with files of several sizes (one duplicated), modes, nesting,
/// an empty directory, a read-only directory and relative symlinks.
/// Returns the regular files' relative paths.
fn source_tree(root: &Path) -> Vec<&'static str> {
    let files: [(&str, usize, u64, u32); 7] = [
        ("empty", 0, 0, 0o644),
        ("one", 1, 1, 0o600),
        ("bin/tool", 300 * KIB, 2, 0o755),
        ("lib/big.so", 3 * 1024 * KIB, 3, 0o644),
        ("lib/same.so", 3 * 1024 * KIB, 3, 0o644),
        ("ro/readme", 70 * KIB, 4, 0o444),
        ("a/b/c/deep", 130 * KIB, 5, 0o640),
    ];
    for (rel, len, seed, mode) in files {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        write_file(&p, &data(len, seed));
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    fs::create_dir(root.join("emptydir")).unwrap();
    symlink("../lib/big.so", root.join("bin/link")).unwrap();
    symlink("missing", root.join("dangling")).unwrap();
    fs::set_permissions(root.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    files.iter().map(|f| f.0).collect()
}

fn digest_of(m: &Manifest, rel: &str) -> Digest {
    m.entries
        .iter()
        .find_map(|e| match e.kind {
            EntryKind::File { digest, .. } if e.path == rel => Some(digest),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{rel} not in the manifest"))
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Every file, mode and link target of `src` is in `dst`.
fn assert_same_tree(src: &Path, dst: &Path, files: &[&str]) {
    for rel in files {
        let (a, b) = (src.join(rel), dst.join(rel));
        assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap(), "{rel}");
        assert_eq!(mode(&a), mode(&b), "mode of {rel}");
    }
    for d in ["bin", "lib", "ro", "a/b/c", "emptydir"] {
        assert_eq!(mode(&src.join(d)), mode(&dst.join(d)), "mode of {d}/");
    }
    for l in ["bin/link", "dangling"] {
        assert_eq!(
            fs::read_link(src.join(l)).unwrap(),
            fs::read_link(dst.join(l)).unwrap()
        );
    }
}

fn clones_share_and_writes_stay_private(dir: &Path) {
    let (src, store_dir) = (dir.join("src"), dir.join("store"));
    let files = source_tree(&src);
    let store = Store::open(&store_dir).unwrap();
    let added = store.add_tree(&src).unwrap();
    assert_eq!((added.files, added.symlinks), (7, 2));
    // big.so and same.so are one object.
    assert_eq!(added.new_objects, 6);
    assert_eq!(added.cloned, 7, "every file cloned into the store");
    let m = store.manifest(&added.digest).unwrap();
    assert_eq!(m, added.manifest);
    assert_eq!(digest_of(&m, "lib/big.so"), digest_of(&m, "lib/same.so"));
    let stats = store.stats().unwrap();
    assert_eq!((stats.objects, stats.manifests), (6, 1));
    assert_eq!(stats.bytes_saved, 3 * 1024 * KIB as u64);

    let (m1, m2) = (dir.join("m1"), dir.join("m2"));
    for d in [&m1, &m2] {
        let r = store.checkout(&m, d, &CheckoutOptions::default()).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!((r.files, r.cloned, r.copied, r.symlinks), (7, 7, 0, 2));
        assert_same_tree(&src, d, &files);
    }
    for rel in [
        "bin/tool",
        "lib/big.so",
        "lib/same.so",
        "ro/readme",
        "a/b/c/deep",
    ] {
        let obj = store.object_path(&digest_of(&m, rel));
        assert!(
            same_blocks(&obj, &m1.join(rel)),
            "{rel} shares the object's blocks"
        );
        assert!(
            same_blocks(&obj, &m2.join(rel)),
            "{rel} shares the object's blocks"
        );
    }
    // Write into the middle of one materialization.
    let target = m1.join("lib/big.so");
    let f = fs::OpenOptions::new().write(true).open(&target).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"CHANGED", 1 << 20).unwrap();
    f.sync_all().unwrap();
    let obj = store.object_path(&digest_of(&m, "lib/big.so"));
    let original = data(3 * 1024 * KIB, 3);
    assert_eq!(fs::read(&obj).unwrap(), original, "object unchanged");
    assert_eq!(
        fs::read(m2.join("lib/big.so")).unwrap(),
        original,
        "other place unchanged"
    );
    assert_eq!(
        fs::read(m1.join("lib/same.so")).unwrap(),
        original,
        "same object elsewhere unchanged"
    );
    assert!(same_blocks(&obj, &m2.join("lib/big.so")));
    assert!(!same_blocks(&obj, &target));
    let v = store.verify().unwrap();
    assert!(v.is_clean(), "{v:?}");
    assert_eq!(v.objects, 6);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn clones_share_and_writes_stay_private_on_xfs() {
    let d = testfs!(Xfs);
    clones_share_and_writes_stay_private(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn clones_share_and_writes_stay_private_on_btrfs() {
    let d = testfs!(Btrfs);
    clones_share_and_writes_stay_private(d.path());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn hardlink_mode_is_write_through_and_verify_quarantines() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), &data(64 * KIB, 9));
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let o = store
        .materialize(&digest, dir.join("h"), LinkMode::Hardlink)
        .unwrap();
    assert_eq!(o.method, Method::Hardlink);
    let (h, obj) = (dir.join("h"), store.object_path(&digest));
    assert_eq!(
        fs::metadata(&h).unwrap().ino(),
        fs::metadata(&obj).unwrap().ino()
    );
    assert_eq!(
        mode(&h),
        0o444,
        "a hardlink has the object's read-only mode"
    );
    // The documented failure mode: writing through the link changes the object.
    fs::set_permissions(&h, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&h, b"oops").unwrap();
    let v = store.verify().unwrap();
    assert_eq!(v.corrupt.len(), 1, "{v:?}");
    let q = v.corrupt[0]
        .quarantined
        .as_ref()
        .expect("moved to quarantine");
    assert!(q.starts_with(dir.join("store/quarantine")));
    assert!(!store.contains(&digest));
    assert!(store.verify().unwrap().is_clean());
    let e = store
        .materialize(&digest, dir.join("again"), LinkMode::Clone)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(!dir.join("again").exists());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn ext4_clone_is_refused_and_auto_copies_identically() {
    let d = testfs!(Ext4);
    let dir = d.path();
    let src = dir.join("src");
    let files = source_tree(&src);
    let store = Store::open(dir.join("store")).unwrap();
    let added = store.add_tree(&src).unwrap();
    assert_eq!(added.cloned, 0, "ext4 cannot clone into the store");
    let m = added.manifest;
    // Refused before anything is written (was: a partial tree of
    // directories and symlinks, every file failing).
    let e = store
        .checkout(&m, dir.join("clone"), &CheckoutOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotSupported, "{e}");
    assert!(e.to_string().contains("nothing was written"), "{e}");
    assert!(!dir.join("clone").exists());
    assert!(temporaries(dir).is_empty());
    let auto = CheckoutOptions {
        link: LinkMode::Auto,
        ..Default::default()
    };
    let r = store.checkout(&m, dir.join("auto"), &auto).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!((r.files, r.cloned, r.copied), (7, 0, 7));
    assert_same_tree(&src, &dir.join("auto"), &files);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn copy_mode_gives_blocks_of_their_own() {
    let d = testfs!(Btrfs);
    let dir = d.path();
    write_file(&dir.join("f"), &data(256 * KIB, 4));
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let o = store
        .materialize(&digest, dir.join("c"), LinkMode::Copy)
        .unwrap();
    assert_eq!(o.method, Method::ReadWrite);
    rustix::fs::syncfs(fs::File::open(dir).unwrap()).unwrap();
    assert!(!same_blocks(&store.object_path(&digest), &dir.join("c")));
    assert_eq!(fs::read(dir.join("c")).unwrap(), data(256 * KIB, 4));
    let e = store
        .materialize(&digest, dir.join("c"), LinkMode::Clone)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
}

fn entry(path: &str, kind: EntryKind) -> ManifestEntry {
    ManifestEntry {
        path: path.into(),
        kind,
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn hostile_manifests_write_nothing() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), b"payload");
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let file = |p: &str| {
        entry(
            p,
            EntryKind::File {
                digest,
                size: 7,
                mode: 0o644,
            },
        )
    };
    let link = |p: &str, t: &str| entry(p, EntryKind::Symlink { target: t.into() });
    fs::create_dir(dir.join("victim")).unwrap();
    let cases: Vec<(Vec<ManifestEntry>, &str)> = vec![
        (vec![file("ok"), file("../victim/evil")], "path traversal"),
        (vec![file("a/../../victim/evil")], "path traversal"),
        (
            vec![file(&format!("{}/evil", dir.join("victim").display()))],
            "absolute",
        ),
        (
            vec![link("out", "sub"), file("out/evil")],
            "not a directory in the manifest",
        ),
        (vec![link("out", "/etc")], "points outside the tree"),
        (
            vec![link("s", "."), link("l", "s/../victim")],
            "points outside the tree",
        ),
        // A target no kernel stores: refused before the file is placed.
        (
            vec![file("ok"), link("l", &"x/".repeat(2048))],
            "longer than PATH_MAX",
        ),
        (
            vec![file("ok"), link("l", &"y".repeat(5000))],
            "longer than PATH_MAX",
        ),
    ];
    for (i, (entries, why)) in cases.into_iter().enumerate() {
        let dest = dir.join(format!("dest{i}"));
        let m = Manifest::new(entries);
        let e = store
            .checkout(&m, &dest, &CheckoutOptions::default())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(why), "case {i}: {e}");
        assert!(!dest.exists(), "case {i}: nothing created");
    }
    assert!(names(&dir.join("victim")).is_empty());
    // Escaping links are placed only when explicitly allowed.
    let m = Manifest::new(vec![link("out", "/etc")]);
    let allow = CheckoutOptions {
        external_symlinks: true,
        ..Default::default()
    };
    store.checkout(&m, dir.join("allowed"), &allow).unwrap();
    assert_eq!(
        fs::read_link(dir.join("allowed/out")).unwrap(),
        Path::new("/etc")
    );
    // A destination that is not empty (here: holding a symlink out) is refused.
    fs::create_dir(dir.join("busy")).unwrap();
    symlink("../victim", dir.join("busy/x")).unwrap();
    let m = Manifest::new(vec![file("x/evil")]);
    let e = store
        .checkout(&m, dir.join("busy"), &CheckoutOptions::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert!(names(&dir.join("victim")).is_empty());
    // A manifest tampered with in the store is refused by its digest.
    let good = store
        .write_manifest(&Manifest::new(vec![file("x")]))
        .unwrap();
    let mpath = dir.join("store/manifests").join(good.to_hex());
    fs::set_permissions(&mpath, fs::Permissions::from_mode(0o644)).unwrap();
    let tampered = String::from_utf8(fs::read(&mpath).unwrap())
        .unwrap()
        .replace("\"x\"", "\"../x\"");
    fs::write(&mpath, tampered).unwrap();
    let e = store.manifest(&good).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ContentChanged, "{e}");
    // Bytes laid out otherwise than cowlink writes them (spaces after the
    // commas), even named by their own digest, are refused: a manifest is
    // only ever its canonical bytes; bytes that are no manifest at all
    // are refused as such.
    let m = Manifest::new(vec![file("y"), file("z")]);
    let spaced = String::from_utf8(m.to_bytes()).unwrap().replace(',', ", ");
    let not_json = format!("{}!", String::from_utf8(m.to_bytes()).unwrap());
    for (text, why) in [
        (spaced, "canonical form"),
        (not_json, "not a cowlink manifest"),
    ] {
        let digest = Digest::of(text.as_bytes());
        fs::write(dir.join("store/manifests").join(digest.to_hex()), &text).unwrap();
        let e = store.manifest(&digest).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(why), "{e}");
        let e = store.manifest_bytes(&digest).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_reference_limit_rolls_over_to_new_generations() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), &data(128 * KIB, 6));
    let store = Store::open(dir.join("store")).unwrap().with_clone_limit(3);
    let digest = store.add(dir.join("f")).unwrap();
    // One manifest naming the same object ten times.
    let m = Manifest::new(
        (0..10)
            .map(|i| {
                entry(
                    &format!("copy{i}"),
                    EntryKind::File {
                        digest,
                        size: 128 * KIB as u64,
                        mode: 0o644,
                    },
                )
            })
            .collect(),
    );
    let r = store
        .checkout(&m, dir.join("out"), &CheckoutOptions::default())
        .unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!((r.files, r.cloned), (10, 10));
    assert_eq!(r.generations_created, 3, "3 + 3 + 3 + 1 clones");
    let hex = digest.to_hex();
    let objs = names(&dir.join("store/objects").join(&hex[..2]));
    assert_eq!(
        objs,
        [
            hex.clone(),
            format!("{hex}.g1"),
            format!("{hex}.g2"),
            format!("{hex}.g3")
        ]
    );
    // Each generation has blocks of its own and at most 3 clones.
    let gens: Vec<_> = objs
        .iter()
        .map(|n| dir.join("store/objects").join(&hex[..2]).join(n))
        .collect();
    for (i, a) in gens.iter().enumerate() {
        for b in &gens[i + 1..] {
            assert!(!same_blocks(a, b));
        }
        let users = (0..10)
            .filter(|c| same_blocks(a, &dir.join(format!("out/copy{c}"))))
            .count();
        assert!(
            (1..=3).contains(&users),
            "{users} clones of {}",
            a.display()
        );
    }
    for c in 0..10 {
        assert_eq!(
            fs::read(dir.join(format!("out/copy{c}"))).unwrap(),
            data(128 * KIB, 6)
        );
    }
    // Hardlinks roll over the same way; verify checks generations too.
    let store = Store::open(dir.join("store")).unwrap().with_clone_limit(2);
    for i in 0..5 {
        let o = store
            .materialize(&digest, dir.join(format!("h{i}")), LinkMode::Hardlink)
            .unwrap();
        assert_eq!(o.method, Method::Hardlink);
    }
    let v = store.verify().unwrap();
    assert!(v.is_clean(), "{v:?}");
    assert_eq!(v.objects, 4);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn gc_keeps_what_kept_manifests_use() {
    let d = testfs!(Btrfs);
    let dir = d.path();
    let (a, b) = (dir.join("a"), dir.join("b"));
    fs::create_dir_all(&a).unwrap();
    fs::create_dir_all(&b).unwrap();
    write_file(&a.join("shared"), &data(8 * KIB, 1));
    write_file(&b.join("shared"), &data(8 * KIB, 1));
    write_file(&a.join("only-a"), &data(8 * KIB, 2));
    write_file(&b.join("only-b"), &data(8 * KIB, 3));
    write_file(&dir.join("loose"), &data(8 * KIB, 4));
    let store = Store::open(dir.join("store")).unwrap();
    let ta = store.add_tree(&a).unwrap();
    let tb = store.add_tree(&b).unwrap();
    let loose = store.add(dir.join("loose")).unwrap();
    // A temporary of a process that no longer exists.
    let stale = dir.join("store/tmp/.object.cowlink-4000000-7.tmp");
    fs::write(&stale, b"partial").unwrap();
    let e = store.gc(Some(&[loose])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "not a manifest: {e}");
    assert!(store.contains(&loose), "a refused gc removes nothing");
    let r = store.gc(Some(&[ta.digest])).unwrap();
    assert_eq!((r.manifests_kept, r.manifests_removed), (1, 1));
    assert_eq!(r.objects_removed, 2, "only-b and loose");
    assert_eq!(r.temporaries_removed, 1);
    assert!(!stale.exists());
    assert!(!store.contains(&loose));
    assert!(!store.contains(&digest_of(&tb.manifest, "only-b")));
    assert!(store.contains(&digest_of(&tb.manifest, "shared")));
    assert_eq!(store.manifests().unwrap(), [ta.digest]);
    let out = dir.join("out");
    let r = store
        .checkout(&ta.manifest, &out, &CheckoutOptions::default())
        .unwrap();
    assert!(r.errors.is_empty());
    assert_eq!(fs::read(out.join("only-a")).unwrap(), data(8 * KIB, 2));
    assert!(store.verify().unwrap().is_clean());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn stale_temporaries_go_when_the_store_is_opened() {
    let d = testfs!(Xfs);
    let root = d.path().join("store");
    drop(Store::open(&root).unwrap());
    let stale = root.join("tmp/.object.cowlink-4000001-1.tmp");
    let live = root.join(format!("tmp/.object.cowlink-{}-99.tmp", std::process::id()));
    fs::write(&stale, b"x").unwrap();
    fs::write(&live, b"x").unwrap();
    drop(Store::open(&root).unwrap());
    assert!(!stale.exists(), "dead process's temporary removed");
    assert!(live.exists(), "a live process's temporary is left alone");
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn bad_inputs_get_clear_errors() {
    let d = testfs!(Xfs);
    let dir = d.path();
    // Not a store, not empty: refused, nothing written.
    fs::create_dir(dir.join("docs")).unwrap();
    fs::write(dir.join("docs/notes.txt"), b"mine").unwrap();
    let e = Store::open(dir.join("docs")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("not a cowlink store"), "{e}");
    assert_eq!(names(&dir.join("docs")), ["notes.txt"]);

    let store = Store::open(dir.join("store")).unwrap();
    let e = store.add(dir.join("nope")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = store.add(dir).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IsDirectory, "{e}");
    // A tree with a FIFO cannot be stored completely: refused, named.
    let t = dir.join("tree");
    fs::create_dir(&t).unwrap();
    fs::write(t.join("ok"), b"ok").unwrap();
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    rustix::fs::mknodat(
        rustix::fs::CWD,
        t.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let e = store.add_tree(&t).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotRegularFile, "{e}");
    assert!(
        e.to_string().contains("pipe") && e.to_string().contains("FIFO"),
        "{e}"
    );
    assert!(store.manifests().unwrap().is_empty());
    let e = store.add_tree(t.join("ok")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotADirectory, "{e}");
    let unknown: Digest = "ab".repeat(32).parse().unwrap();
    let e = store.manifest(&unknown).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = store
        .materialize(&unknown, dir.join("x"), LinkMode::Auto)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(!dir.join("x").exists());
    // Same content twice: one object.
    fs::write(dir.join("twin"), b"ok").unwrap();
    let a = store.add_file(t.join("ok")).unwrap();
    let b = store.add_file(dir.join("twin")).unwrap();
    assert_eq!(a.digest, b.digest);
    assert!(!b.new);
    assert_eq!(a.digest, Digest::of(b"ok"));
}

/// A store whose `tmp/` (or another part of its layout) is a symbolic
/// link to the user's files is refused by every command, and nothing
/// behind the link is deleted or moved.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_symlink_in_the_layout_is_never_followed() {
    let d = testfs!(Xfs);
    let dir = d.path();
    let store_dir = dir.join("store");
    write_file(&dir.join("f"), &data(8 * KIB, 1));
    let digest = Store::open(&store_dir).unwrap().add(dir.join("f")).unwrap();
    let precious = dir.join("precious");
    fs::create_dir(&precious).unwrap();
    for i in 0..3 {
        write_file(&precious.join(format!("doc{i}")), &data(100, i));
    }
    let hex = digest.to_hex();
    for part in [
        "tmp",
        "quarantine",
        "manifests",
        &format!("objects/{}", &hex[..2]),
    ] {
        let p = store_dir.join(part);
        let aside = dir.join("aside");
        fs::rename(&p, &aside).unwrap();
        symlink(&precious, &p).unwrap();
        let e = Store::open(&store_dir).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{part}: {e}");
        assert!(e.to_string().contains("tampered"), "{e}");
        assert_eq!(names(&precious), ["doc0", "doc1", "doc2"], "{part}");
        fs::remove_file(&p).unwrap();
        fs::rename(&aside, &p).unwrap();
    }
    // Restored, the store works again: gc and verify leave the user's
    // files alone and find the store clean.
    let store = Store::open(&store_dir).unwrap();
    store.gc(None).unwrap();
    assert!(store.verify().unwrap().is_clean());
    assert_eq!(names(&precious), ["doc0", "doc1", "doc2"]);
}

/// An object file replaced by a symbolic link to a user's file: verify
/// quarantines the link itself, never the file it points to.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn verify_moves_a_planted_link_not_its_target() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), &data(8 * KIB, 2));
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let obj = store.object_path(&digest);
    fs::remove_file(&obj).unwrap();
    let victim = dir.join("victim");
    write_file(&victim, &data(8 * KIB, 3));
    symlink(&victim, &obj).unwrap();
    let v = store.verify().unwrap();
    assert_eq!(v.corrupt.len(), 1, "{v:?}");
    assert_eq!(
        fs::read(&victim).unwrap(),
        data(8 * KIB, 3),
        "target untouched"
    );
    let q = v.corrupt[0].quarantined.as_ref().unwrap();
    assert!(fs::symlink_metadata(q).unwrap().file_type().is_symlink());
}

fn one_file_manifest(digest: Digest, size: u64, mode: u32) -> Manifest {
    Manifest::new(vec![ManifestEntry {
        path: "f".into(),
        kind: EntryKind::File { digest, size, mode },
    }])
}

/// Set-id bits from a manifest are dropped unless asked for; a size that
/// disagrees with the object is an error.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn manifests_cannot_set_setid_bits_or_lie_about_sizes() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), &data(5000, 4));
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let m = one_file_manifest(digest, 5000, 0o6755);
    let r = store
        .checkout(&m, dir.join("plain"), &CheckoutOptions::default())
        .unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(mode(&dir.join("plain/f")), 0o755, "set-id bits dropped");
    let opts = CheckoutOptions {
        setid: true,
        ..Default::default()
    };
    let r = store.checkout(&m, dir.join("asked"), &opts).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(mode(&dir.join("asked/f")), 0o6755, "kept when asked");

    let liar = one_file_manifest(digest, 4000, 0o644);
    let r = store
        .checkout(&liar, dir.join("liar"), &CheckoutOptions::default())
        .unwrap();
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].kind(), ErrorKind::InvalidInput);
    assert!(r.errors[0].to_string().contains("4000"), "{}", r.errors[0]);
    assert!(!dir.join("liar/f").exists(), "nothing placed");
}

/// An object changed after it was stored is never placed: checkout
/// notices (the mtime is no longer the store's mark), rehashes, refuses.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn checkout_never_spreads_a_changed_object() {
    let d = testfs!(Xfs);
    let dir = d.path();
    let src = dir.join("src");
    fs::create_dir(&src).unwrap();
    write_file(&src.join("a"), &data(64 * KIB, 5));
    write_file(&src.join("b"), &data(64 * KIB, 6));
    let store = Store::open(dir.join("store")).unwrap();
    let added = store.add_tree(&src).unwrap();
    let m = store.manifest(&added.digest).unwrap();
    // Flip one byte of a's object, as a write through a hardlink would.
    let obj = store.object_path(&digest_of(&m, "a"));
    fs::set_permissions(&obj, fs::Permissions::from_mode(0o644)).unwrap();
    let f = fs::OpenOptions::new().write(true).open(&obj).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"X", 100).unwrap();
    drop(f);
    let r = store
        .checkout(&m, dir.join("out"), &CheckoutOptions::default())
        .unwrap();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].kind(), ErrorKind::Corrupt, "{}", r.errors[0]);
    assert!(
        !dir.join("out/a").exists(),
        "the corrupt object was not placed"
    );
    assert_eq!(fs::read(dir.join("out/b")).unwrap(), data(64 * KIB, 6));
    // Restoring the byte (the mtime stays changed) is rehashed and accepted,
    // and marked so the next checkout needs no rehash.
    let f = fs::OpenOptions::new().write(true).open(&obj).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &data(64 * KIB, 5)[100..101], 100).unwrap();
    drop(f);
    let opts = CheckoutOptions {
        verify: true,
        ..Default::default()
    };
    let r = store.checkout(&m, dir.join("out2"), &opts).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(fs::read(dir.join("out2/a")).unwrap(), data(64 * KIB, 5));
    assert_eq!(
        fs::metadata(&obj).unwrap().mtime(),
        0,
        "marked unchanged again"
    );
}

/// A directory that cannot be made (no inode left on the destination) is
/// one error that says how much below it was left out; the checkout goes
/// on with the rest and reports each failure.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_directory_that_cannot_be_made_is_reported_with_what_it_left_out() {
    let (x, t) = (testfs!(Xfs), testfs!(TinyExt4));
    write_file(&x.path().join("f"), &data(3000, 9));
    let store = Store::open(x.path().join("store")).unwrap();
    let digest = store.add(x.path().join("f")).unwrap();
    let file = |path: &str| ManifestEntry {
        path: path.into(),
        kind: EntryKind::File {
            digest,
            size: 3000,
            mode: 0o644,
        },
    };
    let m = Manifest::new(vec![
        file("d/a"),
        file("d/b"),
        file("d/e/c"),
        ManifestEntry {
            path: "d/l".into(),
            kind: EntryKind::Symlink { target: "a".into() },
        },
        file("top"),
    ]);
    // The destination exists; then every inode left is taken.
    let dest = t.path().join("dest");
    fs::create_dir(&dest).unwrap();
    let fill = t.path().join("fill");
    fs::create_dir(&fill).unwrap();
    let mut taken = 0;
    while fs::File::create(fill.join(taken.to_string())).is_ok() {
        taken += 1;
    }
    assert!(taken > 100, "only {taken} inodes could be taken");
    let opts = CheckoutOptions {
        link: LinkMode::Copy,
        ..Default::default()
    };
    let r = store.checkout(&m, &dest, &opts).unwrap();
    fs::remove_dir_all(&fill).unwrap();
    assert_eq!((r.files, r.dirs, r.symlinks), (0, 0, 0));
    assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
    let texts: Vec<String> = r.errors.iter().map(|e| e.to_string()).collect();
    let d = texts
        .iter()
        .find(|t| t.contains("dest/d"))
        .expect("d's error");
    assert!(d.contains("the 5 entries below it were not placed"), "{d}");
    assert!(r.errors.iter().all(|e| e.kind() == ErrorKind::NoSpace));
    assert!(texts.iter().any(|t| t.contains("dest/top")), "{texts:?}");
    assert_eq!(fs::read_dir(&dest).unwrap().count(), 0, "nothing partial");

    // With inodes back, the same manifest is placed whole.
    let r = store.checkout(&m, &dest, &opts).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!((r.files, r.dirs, r.symlinks), (4, 2, 1));
    assert_eq!(fs::read(dest.join("d/e/c")).unwrap(), data(3000, 9));
    assert_eq!(fs::read_link(dest.join("d/l")).unwrap(), Path::new("a"));
}

/// A small deterministic generator (xorshift64*): the same cases each run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Where the link at `link` leads, step by step on the real filesystem:
/// each name looked up with `lstat`, each symbolic link's target read
/// back from the disk (`readlink`) and spliced in, at most 40 links, a
/// missing name taken as a directory (as `realpath -m` does). Returns
/// whether a step left `dest`, or `None` past 40 links.
fn kernel_walk(dest: &Path, link: &Path) -> Option<bool> {
    use std::ffi::OsString;
    use std::path::Component;
    let parts = |p: &Path| -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect()
    };
    let mut cur = parts(link.parent().unwrap());
    let mut todo: std::collections::VecDeque<OsString> = std::collections::VecDeque::new();
    let first = fs::read_link(link).unwrap();
    if first.is_absolute() {
        cur.clear();
    }
    todo.extend(parts(&first));
    let (mut followed, mut left) = (1, false);
    let inside = parts(dest);
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            cur.pop();
        } else {
            let mut p = std::path::PathBuf::from("/");
            p.extend(&cur);
            p.push(&c);
            match fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => {
                    followed += 1;
                    if followed > 40 {
                        return None;
                    }
                    let t = fs::read_link(&p).unwrap();
                    if t.is_absolute() {
                        cur.clear();
                    }
                    for part in parts(&t).into_iter().rev() {
                        todo.push_front(part);
                    }
                }
                _ => cur.push(c),
            }
        }
        left |= !cur.starts_with(&inside);
    }
    Some(left)
}

/// Random trees of directories, files and symbolic links (names a, b, c;
/// targets of `a`, `b`, `c`, `.`, `..`, now and then absolute) are
/// checked out with every link allowed, and each link's verdict from the
/// manifest alone is compared with where the resolution of the
/// materialized link on disk goes (`kernel_walk`: links read back with
/// `readlink`), and with the kernel's own `realpath` wherever that
/// resolves (or fails with `ELOOP`). The checkout's own name is no name of the
/// generator, so a resolution that leaves it never comes back.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn link_verdicts_agree_with_the_kernel_on_random_trees() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), b"payload");
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let names = ["a", "b", "c"];
    let allow = CheckoutOptions {
        external_symlinks: true,
        ..Default::default()
    };
    let (mut inside, mut outside, mut loops, mut trees) = (0, 0, 0, 0);
    for case in 0..1200 {
        let mut entries = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..rng.below(8) + 2 {
            let path: Vec<&str> = (0..rng.below(3) + 1)
                .map(|_| names[rng.below(3) as usize])
                .collect();
            let path = path.join("/");
            if !seen.insert(path.clone()) {
                continue;
            }
            let kind = match rng.below(4) {
                0 => EntryKind::Dir { mode: 0o755 },
                1 => EntryKind::File {
                    digest,
                    size: 7,
                    mode: 0o644,
                },
                _ => {
                    let mut t: Vec<&str> = (0..rng.below(6) + 1)
                        .map(|_| ["a", "b", "c", ".", "..", ".."][rng.below(6) as usize])
                        .collect();
                    if rng.below(25) == 0 {
                        t.insert(0, "");
                    }
                    EntryKind::Symlink {
                        target: t.join("/"),
                    }
                }
            };
            entries.push(entry(&path, kind));
        }
        let m = Manifest::new(entries);
        let Ok(verdicts) = m.link_verdicts("m") else {
            continue;
        };
        if verdicts.is_empty() {
            continue;
        }
        trees += 1;
        let dest = dir.join(format!("dest-{case}"));
        let r = store.checkout(&m, &dest, &allow).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // Refused without permission exactly when a link is not inside.
        let refused = m.validate("m", false).is_err();
        assert_eq!(
            refused,
            verdicts.iter().any(|(_, v)| *v != LinkVerdict::Inside)
        );
        let canon_dest = fs::canonicalize(&dest).unwrap();
        for (path, verdict) in verdicts {
            let link = canon_dest.join(path);
            let walked = kernel_walk(&canon_dest, &link);
            let kernel = fs::canonicalize(&link);
            let why = format!(
                "{path}: verdict {verdict:?}, walk {walked:?}, kernel {kernel:?} in {:?}",
                m.entries
            );
            match verdict {
                LinkVerdict::Inside => {
                    assert_eq!(walked, Some(false), "{why}");
                    // Where the kernel resolves it at all, it is inside.
                    if let Ok(k) = &kernel {
                        assert!(k.starts_with(&canon_dest), "{why}");
                    }
                    inside += 1;
                }
                LinkVerdict::Outside => {
                    assert_eq!(walked, Some(true), "{why}");
                    if let Ok(k) = &kernel {
                        assert!(!k.starts_with(&canon_dest), "{why}");
                    }
                    outside += 1;
                }
                LinkVerdict::TooManyLinks => {
                    assert_ne!(walked, Some(false), "{why}");
                    loops += 1;
                }
            }
            if kernel.as_ref().err().and_then(|e| e.raw_os_error()) == Some(40) {
                assert_ne!(verdict, LinkVerdict::Inside, "{why}");
            }
        }
    }
    assert!(
        trees > 300 && inside > 250 && outside > 120 && loops > 80,
        "{trees} trees: {inside} inside, {outside} outside, {loops} loops"
    );
}

/// `mkfifo` or `mknod` at `p` (device nodes only inside the test's own
/// directory, never in /dev).
fn special(p: &Path, kind: &str) {
    let status = match kind {
        "fifo" => std::process::Command::new("mkfifo").arg(p).status(),
        // /dev/null's and /dev/zero's numbers.
        "null" => std::process::Command::new("mknod")
            .arg(p)
            .args(["c", "1", "3"])
            .status(),
        "zero" => std::process::Command::new("mknod")
            .arg(p)
            .args(["c", "1", "5"])
            .status(),
        _ => unreachable!(),
    };
    assert!(status.unwrap().success(), "{kind} at {}", p.display());
}

/// FIFOs, devices and links where the store keeps objects and
/// manifests: nothing hangs or reads forever; checkout and ls refuse
/// them (Corrupt) and change nothing; verify and gc move them to
/// quarantine/; a manifest file named by the caller is refused, never
/// moved.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn special_files_in_the_store_are_refused_then_quarantined() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), b"payload");
    let store = Store::open(dir.join("store")).unwrap();
    let good = store.add(dir.join("f")).unwrap();
    let objects = dir.join("store/objects");
    let fan = |d: &Digest| objects.join(&d.to_hex()[..2]).join(d.to_hex());
    // An object that is a FIFO, one a device, one a link to a good one.
    let (fifo_obj, dev_obj, link_obj) =
        (Digest::of(b"fifo"), Digest::of(b"dev"), Digest::of(b"link"));
    special(&fan(&fifo_obj), "fifo");
    special(&fan(&dev_obj), "zero");
    symlink(fan(&good), fan(&link_obj)).unwrap();
    for (i, obj) in [fifo_obj, dev_obj, link_obj].iter().enumerate() {
        assert!(!store.contains(obj), "a special file is no object");
        let m = one_file_manifest(*obj, 4, 0o644);
        let dest = dir.join(format!("out{i}"));
        let opts = CheckoutOptions {
            link: LinkMode::Auto,
            ..Default::default()
        };
        let r = store.checkout(&m, &dest, &opts).unwrap();
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert_eq!(r.errors[0].kind(), ErrorKind::Corrupt, "{}", r.errors[0]);
        assert!(
            r.errors[0].to_string().contains("not a regular file"),
            "{}",
            r.errors[0]
        );
        assert!(!dest.join("f").exists());
    }
    // Manifests that are a FIFO and a /dev/zero: ls lists them as
    // unreadable, reading one is Corrupt; nothing moves.
    let manifests = dir.join("store/manifests");
    let (fifo_m, zero_m, null_m) = (Digest::of(b"m1"), Digest::of(b"m2"), Digest::of(b"m3"));
    special(&manifests.join(fifo_m.to_hex()), "fifo");
    special(&manifests.join(zero_m.to_hex()), "zero");
    special(&manifests.join(null_m.to_hex()), "null");
    for m in [fifo_m, zero_m, null_m] {
        let e = store.manifest(&m).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    let listed = store.list().unwrap();
    assert_eq!(listed.iter().filter(|i| i.error.is_some()).count(), 3);
    assert!(
        names(&dir.join("store/quarantine")).is_empty(),
        "ls moves nothing"
    );
    // A manifest file named by the caller: refused, left alone.
    let named = dir.join("named-fifo");
    special(&named, "fifo");
    for p in [&named, &manifests.join(zero_m.to_hex())] {
        let e = Manifest::read_file(p).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotRegularFile, "{e}");
    }
    assert!(fs::symlink_metadata(&named).unwrap().file_type().is_fifo());
    // verify moves all six; the good object stays.
    let r = store.verify().unwrap();
    assert_eq!(r.corrupt.len(), 6, "{:?}", r.corrupt);
    assert!(
        r.corrupt.iter().all(|c| c.quarantined.is_some()),
        "{:?}",
        r.corrupt
    );
    assert_eq!(names(&dir.join("store/quarantine")).len(), 6);
    assert!(store.contains(&good));
    // gc does the same with what appears later.
    special(&fan(&fifo_obj), "fifo");
    special(&manifests.join(fifo_m.to_hex()), "fifo");
    let r = store.gc(None).unwrap();
    assert_eq!(r.quarantined.len(), 2, "{:?}", r.quarantined);
    assert_eq!(names(&dir.join("store/quarantine")).len(), 8);
    assert!(!fan(&fifo_obj).exists() && !manifests.join(fifo_m.to_hex()).exists());
}

/// Set-id bits of directories are dropped like those of files.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn directories_lose_setid_bits_unless_asked() {
    let d = testfs!(Xfs);
    let dir = d.path();
    let store = Store::open(dir.join("store")).unwrap();
    let m = Manifest::new(vec![
        entry("sgid", EntryKind::Dir { mode: 0o2775 }),
        entry("suid", EntryKind::Dir { mode: 0o4755 }),
        entry("sticky", EntryKind::Dir { mode: 0o1777 }),
        entry("sgid/sub", EntryKind::Dir { mode: 0o2700 }),
    ]);
    store
        .checkout(&m, dir.join("plain"), &CheckoutOptions::default())
        .unwrap();
    assert_eq!(mode(&dir.join("plain/sgid")), 0o775);
    assert_eq!(mode(&dir.join("plain/suid")), 0o755);
    assert_eq!(
        mode(&dir.join("plain/sticky")),
        0o1777,
        "sticky is no set-id bit"
    );
    assert_eq!(mode(&dir.join("plain/sgid/sub")), 0o700);
    let keep = CheckoutOptions {
        setid: true,
        ..Default::default()
    };
    store.checkout(&m, dir.join("kept"), &keep).unwrap();
    assert_eq!(mode(&dir.join("kept/sgid")), 0o2775);
    assert_eq!(mode(&dir.join("kept/suid")), 0o4755);
    assert_eq!(mode(&dir.join("kept/sgid/sub")), 0o2700);
}

/// A deep chain and a wide directory check out whole: each directory is
/// opened by name in its parent, and a deferred mode is set on the
/// descriptor once its directory is done.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn deep_and_read_only_trees_check_out_whole() {
    let d = testfs!(Xfs);
    let dir = d.path();
    write_file(&dir.join("f"), b"payload");
    let store = Store::open(dir.join("store")).unwrap();
    let digest = store.add(dir.join("f")).unwrap();
    let mut entries = Vec::new();
    let mut p = String::new();
    for i in 0..3000 {
        if !p.is_empty() {
            p.push('/');
        }
        p.push_str(if i % 2 == 0 { "d" } else { "e" });
        // Every third level read-only: its mode waits for its contents.
        let m = if i % 3 == 0 { 0o555 } else { 0o755 };
        entries.push(entry(&p, EntryKind::Dir { mode: m }));
    }
    entries.push(entry(
        &format!("{p}/f"),
        EntryKind::File {
            digest,
            size: 7,
            mode: 0o444,
        },
    ));
    let m = Manifest::new(entries);
    let opts = CheckoutOptions {
        link: LinkMode::Auto,
        ..Default::default()
    };
    let r = store.checkout(&m, dir.join("deep"), &opts).unwrap();
    assert!(
        r.errors.is_empty(),
        "{:?}",
        &r.errors[..r.errors.len().min(3)]
    );
    assert_eq!((r.dirs, r.files), (3000, 1));
    // Checked through /proc/self/fd-free relative opens: walk down.
    let mut at = fs::File::open(dir.join("deep")).unwrap();
    let mut depth = 0;
    use std::os::fd::AsRawFd;
    loop {
        let name = if depth % 2 == 0 { "d" } else { "e" };
        let next = format!("/proc/self/fd/{}/{name}", at.as_raw_fd());
        let Ok(md) = fs::metadata(&next) else { break };
        let want = if depth % 3 == 0 { 0o555 } else { 0o755 };
        assert_eq!(md.mode() & 0o7777, want, "level {depth}");
        at = fs::File::open(&next).unwrap();
        depth += 1;
    }
    assert_eq!(depth, 3000);
    let f = format!("/proc/self/fd/{}/f", at.as_raw_fd());
    assert_eq!(fs::read(f).unwrap(), b"payload");
    // Wide: make everything writable again so the testfs can clean up.
    let _ = std::process::Command::new("chmod")
        .args(["-R", "u+w"])
        .arg(dir.join("deep"))
        .status();
}

#[allow(dead_code)]
#[path = "../../../../fuzz/fuzz_targets/manifest_check.rs"]
mod manifest_check;
#[allow(dead_code)]
#[path = "../../../../fuzz/fuzz_targets/symlinks_check.rs"]
mod symlinks_check;

/// The fuzz targets' seed corpora (fuzz/seeds/manifest, fuzz/seeds/symlinks)
/// replayed on stable through the same checks the targets run.
#[test]
fn fuzz_corpora_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    type Check = fn(&[u8]);
    let targets: [(&str, Check); 2] = [
        ("manifest", manifest_check::check),
        ("symlinks", symlinks_check::check),
    ];
    for (name, check) in targets {
        let dir = root.join(name);
        let mut n = 0;
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            let data = fs::read(&p).unwrap();
            let r = std::panic::catch_unwind(|| check(&data));
            assert!(r.is_ok(), "{name}: {} fails", p.display());
            n += 1;
        }
        assert!(n >= 5, "{name}: {n} inputs in {}", dir.display());
    }
}

/// The directory checked to be empty is the one the checkout fills: a
/// process that swaps the destination for a non-empty directory (here,
/// one holding a link `evil` to outside) between the check and the
/// checkout must not get the manifest's `x -> evil/secret` placed beside
/// that link, where it would resolve outside. Each round races a thread
/// exchanging the two directories against one checkout.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn the_destination_checked_empty_is_the_one_filled() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let d = testfs!(Xfs);
    let dir = d.path();
    let store = Store::open(dir.join("store")).unwrap();
    let outside = dir.join("outside");
    fs::create_dir(&outside).unwrap();
    let m = Manifest::new(vec![entry(
        "x",
        EntryKind::Symlink {
            target: "evil/secret".into(),
        },
    )]);
    let (dest, full) = (dir.join("race/dest"), dir.join("race/full"));
    let swaps = AtomicU64::new(0);
    for round in 0..150 {
        let _ = fs::remove_dir_all(dir.join("race"));
        fs::create_dir_all(&dest).unwrap();
        fs::create_dir(&full).unwrap();
        symlink(&outside, full.join("evil")).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let done = rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &dest,
                        rustix::fs::CWD,
                        &full,
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                    if done.is_ok() {
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            let _ = store.checkout(&m, &dest, &CheckoutOptions::default());
            stop.store(true, Ordering::Relaxed);
        });
        for p in [&dest, &full] {
            let x = p.join("x");
            if x.symlink_metadata().is_ok() {
                assert!(
                    p.join("evil").symlink_metadata().is_err(),
                    "round {round}: {} was placed beside a link it did not check out \
                     (to {:?})",
                    x.display(),
                    fs::canonicalize(p.join("evil"))
                );
            }
        }
    }
    assert!(swaps.load(Ordering::Relaxed) > 0, "the racer never swapped");
}

/// A checkout into the store itself is refused before anything is
/// placed: into an empty object shard it would plant a file under a
/// digest its bytes do not have, which `add` then reports "already
/// stored" and every later checkout trusts. Each way of naming a
/// directory in the store (directly, new, through a linked parent) is
/// tried; none is created or filled.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_checkout_into_the_store_is_refused() {
    let d = testfs!(Xfs);
    let dir = d.path();
    let root = dir.join("store");
    let store = Store::open(&root).unwrap();
    write_file(&dir.join("evil"), b"evil!!!");
    let evil = store.add(dir.join("evil")).unwrap();
    write_file(&dir.join("victim"), b"victim!");
    let victim = Digest::of(b"victim!");
    let shard = &victim.to_hex()[..2];
    let m = Manifest::new(vec![entry(
        &victim.to_hex(),
        EntryKind::File {
            digest: evil,
            size: 7,
            mode: 0o644,
        },
    )]);
    symlink(root.join("objects"), dir.join("objects-link")).unwrap();
    let dests = [
        root.join("objects").join(shard),
        dir.join("objects-link").join(shard),
        root.join("new"),
        root.join("objects").join(shard).join("new"),
    ];
    for dest in &dests {
        let existed = dest.exists();
        let e = store
            .checkout(&m, dest, &CheckoutOptions::default())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{}: {e}", dest.display());
        assert!(e.to_string().contains("inside the store"), "{e}");
        assert_eq!(dest.exists(), existed, "{}", dest.display());
    }
    // One object placed by name into the store: refused the same way.
    let e = store
        .materialize(
            &evil,
            dir.join("objects-link").join(shard).join(victim.to_hex()),
            LinkMode::Auto,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(names(&root.join("objects").join(shard)).is_empty());
    assert_eq!(store.add(dir.join("victim")).unwrap(), victim);
    store
        .checkout(&m, dir.join("elsewhere"), &CheckoutOptions::default())
        .unwrap();
    assert_eq!(
        fs::read(dir.join("elsewhere").join(victim.to_hex())).unwrap(),
        b"evil!!!"
    );
}
