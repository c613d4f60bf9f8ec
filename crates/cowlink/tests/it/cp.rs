//! cp's library plan on real filesystems: `--sparse` (holes made by the
//! copy loop itself, and GNU's rule on which modes still clone).

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cowlink::cp::{copy, CpEvent, CpOptions, Sparse, Target};
use cowlink::{ErrorKind, LinkMode, Method};
use cowlink_testfs::{data, testfs};

const K: u64 = 1024;
/// Data, written zeros, a hole, data, written zeros at the end.
const LAYOUT: [(u64, u64, Fill); 5] = [
    (0, 64 * K, Fill::Data),
    (64 * K, 256 * K, Fill::Zeros),
    (320 * K, 1024 * K, Fill::Hole),
    (1344 * K, 64 * K, Fill::Data),
    (1408 * K, 128 * K, Fill::Zeros),
];
const LEN: u64 = 1536 * K;

#[derive(Clone, Copy, PartialEq)]
enum Fill {
    Data,
    Zeros,
    Hole,
}

fn source(p: &Path) {
    let f = fs::File::create(p).unwrap();
    for (i, (at, len, fill)) in LAYOUT.iter().enumerate() {
        match fill {
            Fill::Data => f.write_all_at(&data(*len as usize, i as u64 + 1), *at),
            Fill::Zeros => f.write_all_at(&vec![0; *len as usize], *at),
            Fill::Hole => Ok(()),
        }
        .unwrap();
    }
    f.set_len(LEN).unwrap();
    f.sync_all().unwrap();
}

/// Bytes allocated to `p`, after its data reached the disk.
fn allocated(p: &Path) -> u64 {
    fs::File::open(p).unwrap().sync_all().unwrap();
    fs::metadata(p).unwrap().blocks() * 512
}

/// `cp --reflink=<link> --sparse=<sparse> src dst`: the method used.
fn cp(src: &Path, dst: &Path, link: LinkMode, sparse: Sparse) -> Method {
    let o = CpOptions {
        link_mode: link,
        sparse,
        ..CpOptions::default()
    };
    let seen = Mutex::new(Vec::new());
    let observer = |ev: &CpEvent<'_>| match ev {
        CpEvent::Copied { outcome, .. } => seen.lock().unwrap().push(Ok(outcome.method)),
        CpEvent::Failed { error, .. } => seen.lock().unwrap().push(Err(error.to_string())),
        _ => {}
    };
    copy(
        &[src.to_path_buf()],
        dst,
        Target::default(),
        &o,
        &observer,
        None,
    )
    .unwrap();
    let seen = seen.into_inner().unwrap();
    match seen.as_slice() {
        [Ok(m)] => *m,
        other => panic!("{link:?} {sparse:?}: {other:?}"),
    }
}

/// Whether every extent of `p` holding data shares its blocks (a clone;
/// XFS may leave an unwritten extent of the source out of it, so the
/// extents are not compared with the source's).
fn all_shared(p: &Path) -> bool {
    let e = cowlink::extents::extents(p).unwrap().extents;
    let data: Vec<_> = e
        .iter()
        .filter(|e| e.has_address() && !e.is_unwritten())
        .collect();
    !data.is_empty() && data.iter().all(|e| e.is_shared())
}

fn shared(p: &Path) -> bool {
    cowlink::extents::extents(p)
        .unwrap()
        .extents
        .iter()
        .any(|e| e.is_shared())
}

/// Every mode on one filesystem: the bytes are the source's; the blocks
/// are what the mode says.
fn sparse_modes(dir: &Path, clones: bool) {
    let src = dir.join("src");
    source(&src);
    let want = fs::read(&src).unwrap();
    let data_bytes = 128 * K;
    let dst = |name: &str| -> PathBuf { dir.join(name) };
    let check = |p: &Path| {
        assert!(
            fs::read(p).unwrap() == want,
            "{}: bytes differ",
            p.display()
        );
        assert_eq!(fs::metadata(p).unwrap().len(), LEN);
    };

    // A copy (--reflink=never), per mode.
    let m = cp(&src, &dst("copy-auto"), LinkMode::Copy, Sparse::Auto);
    assert_ne!(m, Method::Reflink);
    check(&dst("copy-auto"));
    let a = allocated(&dst("copy-auto"));
    assert!(
        (512 * K..LEN).contains(&a),
        "auto keeps the hole, writes the zeros: {a}"
    );

    let m = cp(&src, &dst("copy-always"), LinkMode::Copy, Sparse::Always);
    assert_eq!(m, Method::ReadWrite);
    check(&dst("copy-always"));
    let a = allocated(&dst("copy-always"));
    assert!(
        a >= data_bytes && a <= data_bytes + 64 * K,
        "always: only the data holds blocks: {a}"
    );

    let m = cp(&src, &dst("copy-never"), LinkMode::Copy, Sparse::Never);
    assert_eq!(m, Method::ReadWrite);
    check(&dst("copy-never"));
    let a = allocated(&dst("copy-never"));
    assert!(a >= LEN, "never: every byte holds a block: {a}");
    assert!(!shared(&dst("copy-never")));

    // --reflink=auto (cp's default): GNU still clones with
    // --sparse=always, and copies without holes with --sparse=never.
    let m = cp(&src, &dst("auto-always"), LinkMode::Auto, Sparse::Always);
    check(&dst("auto-always"));
    if clones {
        assert_eq!(m, Method::Reflink);
        assert!(all_shared(&dst("auto-always")));
    } else {
        assert_eq!(m, Method::ReadWrite);
        assert!(allocated(&dst("auto-always")) <= data_bytes + 64 * K);
    }
    let m = cp(&src, &dst("auto-never"), LinkMode::Auto, Sparse::Never);
    assert_eq!(
        m,
        Method::ReadWrite,
        "--sparse=never turns reflink auto off"
    );
    check(&dst("auto-never"));
    assert!(allocated(&dst("auto-never")) >= LEN);
    assert!(!shared(&dst("auto-never")));
    let m = cp(&src, &dst("auto-auto"), LinkMode::Auto, Sparse::Auto);
    check(&dst("auto-auto"));
    assert_eq!(m == Method::Reflink, clones);
    assert_eq!(all_shared(&dst("auto-auto")), clones);

    // --reflink=always takes only --sparse=auto, as GNU: refused before
    // anything is created.
    for sparse in [Sparse::Always, Sparse::Never] {
        let o = CpOptions {
            link_mode: LinkMode::Clone,
            sparse,
            ..CpOptions::default()
        };
        let e = copy(
            std::slice::from_ref(&src),
            dst("refused"),
            Target::default(),
            &o,
            &|_: &CpEvent<'_>| {},
            None,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("--sparse=auto"), "{e}");
        assert!(!dst("refused").exists());
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sparse_modes_on_xfs() {
    let d = testfs!(Xfs);
    sparse_modes(d.path(), true);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sparse_modes_on_btrfs() {
    let d = testfs!(Btrfs);
    sparse_modes(d.path(), true);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sparse_modes_on_ext4() {
    let d = testfs!(Ext4);
    sparse_modes(d.path(), false);
}

/// A tree copy takes the same modes for every file in it.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn sparse_always_reaches_files_inside_trees() {
    let d = testfs!(Ext4);
    let src = d.path().join("tree");
    fs::create_dir_all(src.join("sub")).unwrap();
    source(&src.join("sub/f"));
    let o = CpOptions {
        sparse: Sparse::Always,
        ..CpOptions::archive()
    };
    let r = copy(
        std::slice::from_ref(&src),
        d.path().join("out"),
        Target::default(),
        &o,
        &|_: &CpEvent<'_>| {},
        None,
    )
    .unwrap();
    assert_eq!((r.totals.errors, r.totals.files), (0, 1));
    let out = d.path().join("out/sub/f");
    assert!(fs::read(&out).unwrap() == fs::read(src.join("sub/f")).unwrap());
    assert!(allocated(&out) <= 192 * K, "{}", allocated(&out));
}

/// `-i` through the library: the callback hears about entries inside a
/// directory operand (GNU's question), a no keeps the file and is
/// reported as declined, a yes replaces it.
#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn interactive_callback_is_asked_about_tree_entries() {
    let d = testfs!(Xfs);
    let (src, dst) = (d.path().join("s"), d.path().join("d"));
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::create_dir_all(dst.join("sub")).unwrap();
    for (name, old) in [("keep", "old keep"), ("sub/take", "old take")] {
        fs::write(src.join(name), "new").unwrap();
        fs::write(dst.join(name), old).unwrap();
    }
    fs::write(src.join("fresh"), "new").unwrap();
    let o = CpOptions {
        recursive: true,
        interactive: true,
        ..CpOptions::default()
    };
    let asked = Mutex::new(Vec::new());
    let declined = Mutex::new(Vec::new());
    let observer = |ev: &CpEvent<'_>| {
        if let CpEvent::Tree {
            event:
                cowlink::tree::TreeEvent::Skipped {
                    dst,
                    reason: cowlink::tree::SkipReason::Declined,
                    ..
                },
            ..
        } = ev
        {
            declined.lock().unwrap().push(dst.to_path_buf());
        }
    };
    let mut ask = |p: &cowlink::cp::Prompt<'_>| {
        asked.lock().unwrap().push(p.question());
        p.dst.ends_with("take")
    };
    // `s/.` merges into `d`, so the entries are d/keep and d/sub/take.
    let r = copy(
        &[src.join(".")],
        &dst,
        Target::default(),
        &o,
        &observer,
        Some(&mut ask),
    )
    .unwrap();
    let mut asked = asked.into_inner().unwrap();
    asked.sort();
    let shown = |p: &str| cowlink::name::quoted(&dst.join(".").join(p));
    assert_eq!(
        asked,
        vec![
            format!("overwrite {}? ", shown("keep")),
            format!("overwrite {}? ", shown("sub/take")),
        ]
    );
    assert_eq!(
        declined.into_inner().unwrap(),
        vec![dst.join(".").join("keep")]
    );
    assert_eq!(fs::read_to_string(dst.join("keep")).unwrap(), "old keep");
    assert_eq!(fs::read_to_string(dst.join("sub/take")).unwrap(), "new");
    assert_eq!(fs::read_to_string(dst.join("fresh")).unwrap(), "new");
    assert_eq!((r.totals.skipped, r.totals.errors), (1, 0));
}
