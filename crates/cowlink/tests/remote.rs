//! The remote tier's rule for concurrent gc and push, through the library
//! (whose push runs in stages), against a real S3-compatible server.

use std::fs;
use std::path::Path;
use std::time::Duration;

use cowlink::store::remote::{Keys, Remote, RemoteConfig};
use cowlink::store::{Digest, Store};
use cowlink::{CancelToken, ErrorKind, Run};
use cowlink_testfs::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use cowlink_testfs::testfs;

fn remote(s3: &S3Server, prefix: &str) -> Remote {
    let mut c = RemoteConfig::parse(&s3.url(prefix)).unwrap();
    c.endpoint = Some(s3.endpoint());
    c.region = Some("us-east-1".into());
    c.keys = Some(Keys {
        access_key: ACCESS_KEY.into(),
        secret_key: SECRET_KEY.into(),
    });
    Remote::open(c).unwrap()
}

fn tree(dir: &Path, name: &str, seed: u64, n: usize) -> std::path::PathBuf {
    let root = dir.join(name);
    fs::create_dir_all(&root).unwrap();
    for i in 0..n {
        fs::write(
            root.join(format!("f{i}")),
            cowlink_testfs::data(3000, seed * 1000 + i as u64),
        )
        .unwrap();
    }
    root
}

fn pulls_whole(x: &Path, remote: &Remote, m: &Digest, name: &str) -> bool {
    let fresh = Store::open(x.join(name)).unwrap();
    fresh.pull(remote, &[*m]).is_ok() && fresh.verify().unwrap().is_clean()
}

#[test]
fn gc_never_removes_the_objects_of_a_push_in_progress_but_does_those_of_a_dead_one() {
    let Some(x) = testfs!(Xfs) else { return };
    let Some(s3) = S3Server::start("gc_vs_push") else {
        return;
    };
    let store = Store::open(x.path().join("st")).unwrap();
    let kept = store.add_tree(tree(x.path(), "kept", 1, 5)).unwrap().digest;
    let live = store.add_tree(tree(x.path(), "live", 2, 7)).unwrap().digest;
    let dead = store.add_tree(tree(x.path(), "dead", 3, 9)).unwrap().digest;
    let r = remote(&s3, "c");
    store.push(&r, &[kept]).unwrap();

    // A push that has uploaded its objects but not yet its manifest.
    let mut p = store.start_push(&r, &[live]).unwrap();
    assert_eq!(p.pending(), vec![live]);
    p.upload().unwrap();
    let g = r.gc(Some(&[kept]), Duration::from_secs(3600)).unwrap();
    assert_eq!(g.pushes_protected, 1);
    assert_eq!(g.objects_removed, 0, "{g:?}");
    assert_eq!(g.objects_kept, 5 + 7);
    let report = p.publish().unwrap();
    assert_eq!(report.manifests_uploaded, 1);
    assert!(
        pulls_whole(x.path(), &r, &live, "fresh1"),
        "the live push lost objects"
    );

    // A push that died after its uploads: once its marker is older than
    // the grace period, its objects go (here: a grace of zero).
    let mut p = store.start_push(&r, &[dead]).unwrap();
    p.upload().unwrap();
    drop(p);
    let g = r.gc(None, Duration::ZERO).unwrap();
    assert_eq!(g.markers_removed, 1);
    assert_eq!(g.objects_removed, 9);
    assert_eq!(g.manifests_kept, 2);
    assert!(pulls_whole(x.path(), &r, &kept, "fresh2"));
    assert!(pulls_whole(x.path(), &r, &live, "fresh3"));
    // And pushing it again restores it whole.
    store.push(&r, &[dead]).unwrap();
    assert!(pulls_whole(x.path(), &r, &dead, "fresh4"));
}

#[test]
fn a_push_waits_while_a_remote_gc_holds_its_lock() {
    let Some(x) = testfs!(Xfs) else { return };
    let Some(s3) = S3Server::start("push_waits") else {
        return;
    };
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 4, 3)).unwrap().digest;
    let r = remote(&s3, "w");
    // Another machine's gc is running: its lock is on the server.
    let lock = s3.file("w/locks/gc.elsewhere");
    fs::create_dir_all(lock.parent().unwrap()).unwrap();
    fs::write(&lock, b"").unwrap();
    let remover = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(2500));
        fs::remove_file(&lock).unwrap();
    });
    let report = store.push(&r, &[m]).unwrap();
    remover.join().unwrap();
    assert!(
        report.waited_for_gc_ms >= 2000,
        "the push did not wait for the gc: {report:?}"
    );
    assert_eq!(report.objects_uploaded, 3);
    assert!(pulls_whole(x.path(), &r, &m, "fresh"));
}

#[test]
fn a_cancel_ends_the_wait_for_a_remote_gc_and_leaves_no_marker() {
    let Some(x) = testfs!(Xfs) else { return };
    let Some(s3) = S3Server::start("push_cancel") else {
        return;
    };
    let cancel = CancelToken::default();
    let store = Store::open(x.path().join("st"))
        .unwrap()
        .with_run(Run::default().with_cancel(cancel.clone()));
    let m = store.add_tree(tree(x.path(), "t", 5, 3)).unwrap().digest;
    let r = remote(&s3, "c");
    // A gc that never ends: its lock stays (and stays fresh) on the server.
    let lock = s3.file("c/locks/gc.elsewhere");
    fs::create_dir_all(lock.parent().unwrap()).unwrap();
    fs::write(&lock, b"").unwrap();
    // The push runs on its own thread, so that a push deaf to the cancel
    // fails this test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(store.push(&r, &[m]));
    });
    std::thread::sleep(Duration::from_millis(1500));
    cancel.cancel();
    let e = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the push did not stop within 5 s of the cancel")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    // Nothing was uploaded, and the push's pending marker is gone again.
    let left: Vec<_> = ["c/pending", "c/objects", "c/manifests"]
        .iter()
        .filter(|d| fs::read_dir(s3.file(d)).is_ok_and(|mut it| it.next().is_some()))
        .collect();
    assert!(left.is_empty(), "left on the server: {left:?}");
}
