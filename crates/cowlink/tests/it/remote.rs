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
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_never_removes_the_objects_of_a_push_in_progress_but_does_those_of_a_dead_one() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_vs_push");
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
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_push_waits_while_a_remote_gc_holds_its_lock() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("push_waits");
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
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_cancel_ends_the_wait_for_a_remote_gc_and_leaves_no_marker() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("push_cancel");
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

/// A remote at another endpoint (a relay in front of the server).
fn remote_via(endpoint: &str, prefix: &str) -> Remote {
    let mut c =
        RemoteConfig::parse(&format!("s3://{}/{prefix}", cowlink_testfs::s3::BUCKET)).unwrap();
    c.endpoint = Some(endpoint.to_string());
    c.region = Some("us-east-1".into());
    c.keys = Some(Keys {
        access_key: ACCESS_KEY.into(),
        secret_key: SECRET_KEY.into(),
    });
    Remote::open(c).unwrap()
}

/// The digests of the objects of `tree(…, seed, n)`.
fn tree_digests(seed: u64, n: usize) -> Vec<Digest> {
    (0..n)
        .map(|i| Digest::of(&cowlink_testfs::data(3000, seed * 1000 + i as u64)))
        .collect()
}

/// The server's file of the object `d` under `prefix`.
fn object_file(s3: &S3Server, prefix: &str, d: &Digest) -> std::path::PathBuf {
    let h = d.to_hex();
    s3.file(&format!("{prefix}/objects/{}/{h}", &h[..2]))
}

/// Issue 44, item 7: a push busy with one object for longer than the
/// grace period (a slow uplink) stays alive for gc: its markers are
/// rewritten on a timer, not when an object finishes. The test takes
/// about 9 s: the upload must outlast the grace period by more than the
/// servers' one-second clock. (With the timer off, the first gc takes the
/// push for dead and removes its 5 small objects.)
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_push_busy_with_one_object_longer_than_the_grace_period_keeps_its_objects() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("push_outlives_grace");
    let store = Store::open(x.path().join("st")).unwrap();
    let root = tree(x.path(), "t", 6, 5);
    // One large object: 16 MiB (one PUT) at 2 MiB/s takes 8 s.
    fs::write(root.join("large"), cowlink_testfs::data(16 << 20, 66)).unwrap();
    let m = store.add_tree(&root).unwrap().digest;
    let slow = cowlink_testfs::relay::slow_uplink(&s3.endpoint(), 2 << 20);
    let pusher = remote_via(&slow, "g").with_marker_refresh(Duration::from_millis(300));
    let gc = remote(&s3, "g");
    let grace = Duration::from_secs(3);
    let done = std::sync::atomic::AtomicBool::new(false);
    let report = std::thread::scope(|sc| {
        let push = sc.spawn(|| {
            let r = store.push(&pusher, &[m]);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        for wait in [4500, 1500] {
            std::thread::sleep(Duration::from_millis(wait));
            let g = gc.gc(None, grace).unwrap();
            assert!(
                !done.load(std::sync::atomic::Ordering::SeqCst),
                "the push ended before gc ran: the uplink is not slow enough to test anything"
            );
            assert_eq!(
                g.pushes_protected, 1,
                "the live push was taken for dead: {g:?}"
            );
            assert_eq!(g.objects_removed, 0, "{g:?}");
            assert_eq!(g.markers_removed, 0, "{g:?}");
        }
        push.join().unwrap().unwrap()
    });
    assert_eq!(report.objects_uploaded, 6);
    assert_eq!(report.objects_reuploaded, 0, "{report:?}");
    for d in tree_digests(6, 5) {
        assert!(object_file(&s3, "g", &d).is_file(), "{d} is gone");
    }
    assert!(pulls_whole(x.path(), &gc, &m, "fresh"));
    assert!(
        fs::read_dir(s3.file("g/pending")).map_or(true, |mut d| d.next().is_none()),
        "a marker was left (written again after the push removed it)"
    );
}

/// Issue 44, item 7: before it publishes, a push checks again that
/// every object is there, and uploads again one a gc removed meanwhile.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn publish_uploads_again_an_object_that_vanished_after_the_upload() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("publish_recheck");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 7, 4)).unwrap().digest;
    let r = remote(&s3, "q");
    let mut p = store.start_push(&r, &[m]).unwrap();
    p.upload().unwrap();
    let gone = tree_digests(7, 4);
    fs::remove_file(object_file(&s3, "q", &gone[1])).unwrap();
    // And one replaced by a truncated copy: the size tells.
    fs::write(object_file(&s3, "q", &gone[2]), b"short").unwrap();
    let report = p.publish().unwrap();
    assert_eq!(report.objects_reuploaded, 2, "{report:?}");
    assert_eq!(report.objects_uploaded, 6, "{report:?}");
    assert!(pulls_whole(x.path(), &r, &m, "fresh"));
}

/// Near misses of cowlink's keys for the digest `h` (hex), relative to
/// the prefix: each must be left alone by gc and never count as present.
fn near_misses(h: &str) -> Vec<String> {
    let f = &h[..2];
    let wrong = if f == "00" { "01" } else { "00" };
    vec![
        format!("objects/{f}/{f}/{h}"),
        format!("objects/{h}"),
        format!("objects/{f}/{h}.meta"),
        format!("objects/{f}/{h}.partial"),
        format!("objects/{wrong}/{h}"),
        format!("objects/{}/{}", f.to_uppercase(), h.to_uppercase()),
        format!("objects/{f}/{}", &h[..63]),
        format!("objects/{f}/{h}0"),
        format!("objects/{f}/x{h}"),
        format!("manifests/{h}.partial"),
        format!("manifests/{f}/{h}"),
        format!("manifests/{}", h.to_uppercase()),
        format!("pending/{h}"),
        format!("pending/{h}.a.b"),
        format!("pending/{f}/{h}.id"),
        format!("locks/{h}"),
        "locks/gc".to_string(),
        "locks/gc.a.b".to_string(),
    ]
}

/// Issue 44, items 8 and 9: gc removes only keys of cowlink's exact
/// layout. A table of near misses (for several digests, among them those
/// of real objects and of the manifest) is left whole and named in the
/// report; a grace over ten years is refused, naming it.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_leaves_every_near_miss_of_its_layout_alone() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_near_misses");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 8, 3)).unwrap().digest;
    let r = remote(&s3, "n");
    store.push(&r, &[m]).unwrap();
    let mut hexes: Vec<String> = tree_digests(8, 3).iter().map(|d| d.to_hex()).collect();
    hexes.push(m.to_hex());
    hexes.push(Digest::of(b"on no list").to_hex());
    let mut planted = Vec::new();
    for h in &hexes {
        for k in near_misses(h) {
            let p = s3.file(&format!("n/{k}"));
            if p.exists() {
                continue; // the same key from two digests' tables
            }
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, b"not cowlink's").unwrap();
            planted.push(p);
        }
    }
    // Keys beside the prefix are not even listed.
    let h = &hexes[4];
    let beside = s3.file(&format!("nn/objects/{}/{h}", &h[..2]));
    fs::create_dir_all(beside.parent().unwrap()).unwrap();
    fs::write(&beside, b"x").unwrap();

    let e = r
        .gc(None, Duration::from_secs(10_000_000_000_000_000))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("10000000000000000 s"), "{e}");
    assert!(r.gc(None, Duration::MAX).is_err());

    let g = r.gc(None, Duration::ZERO).unwrap();
    assert_eq!(
        g.objects_removed + g.manifests_removed + g.markers_removed,
        0,
        "{g:?}"
    );
    assert_eq!(g.objects_kept, 3);
    // gc names nothing of `locks/` (a push's concern), and removes
    // only its own lock there and others' dead ones.
    let listed = planted
        .iter()
        .filter(|p| !p.starts_with(s3.file("n/locks")));
    assert_eq!(g.keys_left_alone, listed.clone().count() as u64, "{g:?}");
    assert!(g.left_alone.len() < 100, "raise the cap or plant fewer");
    for p in &planted {
        assert!(p.is_file(), "gc removed {}", p.display());
    }
    for p in listed {
        let key = p.strip_prefix(s3.file("")).unwrap().to_str().unwrap();
        assert!(
            g.left_alone.iter().any(|s| s.ends_with(key)),
            "{key} is not named as left alone"
        );
    }
    assert!(beside.is_file());
    // `remote ls` shows only the real manifest.
    let listed: Vec<Digest> = r.manifests().unwrap().iter().map(|m| m.digest).collect();
    assert_eq!(listed, vec![m]);
    assert!(pulls_whole(x.path(), &r, &m, "fresh"));
}

/// Issue 44, item 10: with more than 1000 objects (a push lists
/// `objects/`, over two pages, instead of a HEAD each) an object is
/// present only under its exact key with its exact size; a near miss
/// never stands in for it.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_near_miss_key_never_counts_as_present_when_a_push_lists_objects() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("push_near_misses");
    let store = Store::open(x.path().join("st")).unwrap();
    let n = 1001;
    let a = tree(x.path(), "a", 9, n);
    let ma = store.add_tree(&a).unwrap().digest;
    let r = remote(&s3, "l");
    let first = store.push(&r, &[ma]).unwrap();
    assert_eq!(first.objects_uploaded, n as u64);
    assert_eq!(first.requests.head, 1, "the push did not list: {first:?}");
    // Some objects vanish, each leaving a near miss of its key behind;
    // one is left truncated under its own key.
    let ds = tree_digests(9, n);
    let mut planted = Vec::new();
    for (i, d) in ds.iter().enumerate().take(9) {
        fs::remove_file(object_file(&s3, "l", d)).unwrap();
        let k = near_misses(&d.to_hex())
            .into_iter()
            .filter(|k| k.starts_with("objects/"))
            .nth(i)
            .unwrap();
        let p = s3.file(&format!("l/{k}"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, cowlink_testfs::data(3000, 9000 + i as u64)).unwrap();
        planted.push(p);
    }
    fs::write(object_file(&s3, "l", &ds[9]), b"short").unwrap();
    // A new manifest naming them all (and one more object).
    fs::write(a.join("extra"), b"one more").unwrap();
    let mb = store.add_tree(&a).unwrap().digest;
    let second = store.push(&r, &[mb]).unwrap();
    assert_eq!(second.objects, n as u64 + 1);
    assert_eq!(second.objects_uploaded, 9 + 1 + 1, "{second:?}");
    // The lock check, then `objects/` twice (before the upload and before
    // publishing), over two pages each.
    assert!(second.requests.list >= 5, "one page only: {second:?}");
    for p in &planted {
        assert!(p.is_file(), "the push removed {}", p.display());
    }
    assert!(pulls_whole(x.path(), &r, &mb, "fresh"));
}

/// Issue 44, item 14: gc aborts the incomplete multipart uploads (of a
/// push killed mid-object) older than the grace period, under its prefix
/// and of its layout only; a younger one, and an old one of an object a
/// live push names, stay. About 5 s: ages are whole seconds of the
/// server's clock.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_aborts_old_incomplete_uploads_and_keeps_young_ones() {
    use object_store::multipart::MultipartStore;
    use object_store::path::Path as Key;
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_uploads");
    let client = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(cowlink_testfs::s3::BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let start = |key: String| -> (Key, String) {
        rt.block_on(async {
            let k = Key::from(key);
            let id = client.create_multipart(&k).await.unwrap();
            client
                .put_part(&k, &id, 0, bytes::Bytes::from(vec![7u8; 1000]).into())
                .await
                .unwrap();
            (k, id)
        })
    };
    let obj = |prefix: &str, seed: &[u8], tail: &str| {
        let h = Digest::of(seed).to_hex();
        format!("{prefix}/objects/{}/{h}{tail}", &h[..2])
    };
    // A push in progress (its marker kept fresh) whose object is uploading.
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 10, 2)).unwrap().digest;
    let pusher = remote(&s3, "u").with_marker_refresh(Duration::from_millis(300));
    let live = store.start_push(&pusher, &[m]).unwrap();
    let live_object = tree_digests(10, 2)[0].to_hex();
    let live_up = start(format!("u/objects/{}/{live_object}", &live_object[..2]));
    let old = start(obj("u", b"old", ""));
    let near = start(obj("u", b"near", ".partial"));
    let beside = start(obj("v", b"beside", ""));
    std::thread::sleep(Duration::from_millis(4500));
    let young = start(obj("u", b"young", ""));

    let g = remote(&s3, "u").gc(None, Duration::from_secs(3)).unwrap();
    assert_eq!(g.uploads_not_listed, None);
    assert_eq!((g.uploads_aborted, g.uploads_kept), (1, 2), "{g:?}");
    assert_eq!(g.pushes_protected, 1);
    assert!(
        g.left_alone.iter().any(|k| k.contains(&near.1)),
        "the near miss is not named: {g:?}"
    );
    // An aborted upload takes no more parts; the others do.
    let alive = |(k, id): &(Key, String)| {
        rt.block_on(client.put_part(k, id, 1, bytes::Bytes::from_static(b"x").into()))
            .is_ok()
    };
    assert!(!alive(&old), "the old upload was not aborted");
    for (what, u) in [
        ("young", &young),
        ("live", &live_up),
        ("near miss", &near),
        ("beside", &beside),
    ] {
        assert!(alive(u), "the {what} upload was aborted");
    }
    drop(live);
}

/// Compatibility: a pending marker whose id an older version spelled
/// otherwise (here with dots and non-ASCII) still protects its push's
/// objects while young, and gc never removes it, young or old.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn an_older_versions_marker_protects_while_young_and_is_never_removed() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_old_marker");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 11, 4)).unwrap().digest;
    let r = remote(&s3, "o");
    store.push(&r, &[m]).unwrap();
    // The manifest is not published yet: only the marker names the objects.
    let manifest = s3.file(&format!("o/manifests/{m}"));
    let marker = s3.file(&format!("o/pending/{m}.büild.host-12-34"));
    fs::create_dir_all(marker.parent().unwrap()).unwrap();
    fs::copy(&manifest, &marker).unwrap();
    fs::remove_file(&manifest).unwrap();
    let g = r.gc(None, Duration::from_secs(3600)).unwrap();
    assert_eq!((g.pushes_protected, g.objects_removed), (1, 0), "{g:?}");
    assert_eq!(g.keys_left_alone, 1, "{g:?}");
    // Old: it protects nothing any more, and is still left alone.
    let g = r.gc(None, Duration::ZERO).unwrap();
    assert_eq!((g.pushes_protected, g.objects_removed), (0, 4), "{g:?}");
    assert_eq!(g.markers_removed, 0);
    assert!(marker.is_file());
}

// ---------------------------------------------------------------------
// A hostile endpoint and a faulty network: bounded reads, retries on
// time, idleness, S3 errors in plain words, hostile server text.

use std::time::Instant;

use cowlink::store::remote::{RetryPolicy, MAX_EMPTY_PAGES};
use cowlink_testfs::hostile::{list_page, Hostile, Reply, Request};
use cowlink_testfs::toxiproxy::Toxiproxy;

/// A remote at `endpoint` (prefix `c`) with this retry policy.
fn remote_at(endpoint: &str, retry: RetryPolicy) -> Remote {
    let mut c = RemoteConfig::parse("s3://cowlink-test/c").unwrap();
    c.endpoint = Some(endpoint.to_string());
    c.region = Some("us-east-1".into());
    c.keys = Some(Keys {
        access_key: ACCESS_KEY.into(),
        secret_key: SECRET_KEY.into(),
    });
    c.retry = retry;
    Remote::open(c).unwrap()
}

/// Short timeouts, so that fault tests take seconds.
fn quick(timeout_ms: u64, idle_ms: u64) -> RetryPolicy {
    RetryPolicy {
        max_backoff: Duration::from_millis(50),
        timeout: Duration::from_millis(timeout_ms),
        idle: Duration::from_millis(idle_ms),
        ..RetryPolicy::default()
    }
}

/// No control character (ESC, newline, BEL…) and no bidirectional
/// override reaches a message.
fn assert_clean(text: &str) {
    assert!(
        !text
            .chars()
            .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
        "server text reached the message raw: {text:?}"
    );
}

/// A store on XFS with one manifest naming one file of `size` bytes: the
/// manifest's digest and bytes, the object's digest and bytes.
fn one_file_store(dir: &Path, size: usize) -> (Digest, Vec<u8>, Digest, Vec<u8>) {
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    let data = cowlink_testfs::data(size, 7);
    fs::write(src.join("f"), &data).unwrap();
    let store = Store::open(dir.join("origin")).unwrap();
    let m = store.add_tree(&src).unwrap().digest;
    let mbytes = fs::read(dir.join("origin/manifests").join(m.to_hex())).unwrap();
    let o: Digest = blake3::hash(&data).to_hex().parse().unwrap();
    (m, mbytes, o, data)
}

/// The endpoint serving `manifest` and `object` (by key suffix), with
/// `object_reply` deciding how the object's bytes go out.
fn serving(
    m: Digest,
    mbytes: Vec<u8>,
    o: Digest,
    object_reply: impl Fn(&Request) -> Reply + Send + Sync + 'static,
) -> Hostile {
    Hostile::start(move |r| {
        if r.path.ends_with(&format!("manifests/{}", m.to_hex())) {
            Reply::bytes(mbytes.clone())
        } else if r
            .path
            .ends_with(&format!("objects/{}/{}", &o.to_hex()[..2], o.to_hex()))
        {
            object_reply(r)
        } else {
            Reply::s3_error(404, "NoSuchKey", "no")
        }
    })
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn what_a_server_claims_never_sizes_a_buffer() {
    let x = testfs!(Xfs);
    let (m, mbytes, o, data) = one_file_store(x.path(), 5000);
    let tib = "1099511627776";
    // A manifest said to be a terabyte: refused unread (the old client
    // allocated it and aborted).
    let h = Hostile::start(move |_| Reply::Full {
        status: 200,
        headers: vec![("Content-Length".into(), tib.into())],
        body: b"{}".to_vec(),
    });
    let fresh = Store::open(x.path().join("a")).unwrap();
    let e = fresh
        .pull(&remote_at(&h.endpoint(), quick(2000, 2000)), &[m])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains(tib), "{e}");
    assert!(fresh.manifests().unwrap().is_empty());

    // An object whose answer claims another size than its manifest's, a
    // shorter body, a longer one: each refused by digest, nothing kept.
    let n = data.len();
    for (what, reply) in [
        (
            "a terabyte",
            Reply::bytes(data.clone()).with_header("Content-Length", tib),
        ),
        ("one byte short", Reply::bytes(data[..n - 1].to_vec())),
        ("one byte long", {
            let mut d = data.clone();
            d.push(0);
            Reply::bytes(d)
        }),
    ] {
        let h = serving(m, mbytes.clone(), o, move |_| reply.clone());
        let fresh = Store::open(x.path().join(format!("b{}", what.len()))).unwrap();
        let e = fresh
            .pull(&remote_at(&h.endpoint(), quick(2000, 2000)), &[m])
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}");
        assert!(!fresh.contains(&o), "{what}");
        assert!(fresh.manifests().unwrap().is_empty(), "{what}");
    }
}

#[test]
fn endless_or_broken_listings_stop_with_a_clear_error() {
    let key = |i: usize| format!("c/manifests/{:064x}", i);
    type Script = Box<dyn Fn(&Request, usize) -> Reply + Send + Sync>;
    let cases: Vec<(&str, Script, &str, usize)> = vec![
        (
            "the same token again",
            Box::new(|_, _| list_page(&[], Some("again"))),
            "twice",
            3,
        ),
        (
            "new tokens, the same key on every page",
            Box::new(move |_, n| list_page(&[(&key(1), 1)], Some(&format!("t{n}")))),
            "without a new key",
            MAX_EMPTY_PAGES + 2,
        ),
        (
            "new tokens, the same two pages in turn",
            Box::new(move |_, n| list_page(&[(&key(n % 2), 1)], Some(&format!("t{n}")))),
            "without a new key",
            MAX_EMPTY_PAGES + 3,
        ),
        (
            "new tokens, empty pages for ever",
            Box::new(|_, n| list_page(&[], Some(&format!("t{n}")))),
            "without a new key",
            MAX_EMPTY_PAGES + 2,
        ),
        (
            "new tokens, new keys for ever",
            Box::new(move |_, n| list_page(&[(&key(n), 1)], Some(&format!("t{n}")))),
            "more than 20 pages",
            20,
        ),
        (
            "truncated without a token",
            Box::new(|_, _| {
                Reply::xml(
                    200,
                    "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                )
            }),
            "no continuation token",
            1,
        ),
        (
            "not a listing",
            Box::new(|_, _| Reply::xml(200, "<Whatever/>")),
            "not a listing",
            1,
        ),
        (
            "escapes in a token",
            Box::new(|_, _| list_page(&[], Some("\u{1b}[2J"))),
            "twice",
            3,
        ),
    ];
    for (what, script, says, most) in cases {
        let pages = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let p = pages.clone();
        let h = Hostile::start(move |r| {
            let n = p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            script(r, n)
        });
        let r = remote_at(&h.endpoint(), quick(2000, 2000)).with_max_pages(match most {
            20 => 20,
            _ => 1000,
        });
        let e = r.manifests().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert_clean(&e.to_string());
        assert!(h.count() <= most, "{what}: {} LISTs", h.count());
        assert_eq!(r.requests().list as usize, h.count(), "{what}");
    }
}

#[test]
fn hostile_keys_in_a_listing_are_left_out_not_fatal() {
    let good = format!("c/manifests/{:064x}", 7);
    let hostile = [
        "c/manifests/\u{1b}[2J\u{1b}[Hcleared",
        "c/manifests/a\nb",
        "c/manifests/..",
        "c/manifests/x//y",
        "c/manifests/\u{7}bell",
        "c/manifests/\u{202e}txt.exe",
    ];
    // Sent raw, and sent URL-encoded (as a server answering
    // encoding-type=url does).
    for encoded in [false, true] {
        let mut keys: Vec<String> = hostile.iter().map(|k| k.to_string()).collect();
        keys.push(good.clone());
        keys.sort();
        let shown: Vec<String> = keys
            .iter()
            .map(|k| match encoded {
                true => k
                    .bytes()
                    .map(|b| match b {
                        b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' => (b as char).to_string(),
                        _ => format!("%{b:02X}"),
                    })
                    .collect(),
                false => k.clone(),
            })
            .collect();
        let h = Hostile::start(move |_| {
            let page: Vec<(&str, u64)> = shown.iter().map(|k| (k.as_str(), 3)).collect();
            let Reply::Full { status, body, .. } = list_page(&page, None) else {
                unreachable!()
            };
            let body = String::from_utf8(body).unwrap();
            let body = match encoded {
                true => body.replace("<Name>", "<EncodingType>url</EncodingType><Name>"),
                false => body,
            };
            Reply::xml(status, body)
        });
        let r = remote_at(&h.endpoint(), quick(2000, 2000));
        let ls = r.manifests().unwrap();
        assert_eq!(ls.len(), 1, "encoded {encoded}: {ls:?}");
        assert_eq!(ls[0].digest.to_hex(), format!("{:064x}", 7));
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn hostile_keys_on_a_real_server_break_neither_ls_nor_gc() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("hostile_keys");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 9, 3)).unwrap().digest;
    let r = remote(&s3, "c");
    store.push(&r, &[m]).unwrap();
    // Keys no client library can write, put behind the server's back.
    let names = ["\u{1b}[2Jclear", "new\nline", "bell\u{7}", "\u{202e}rtl"];
    for area in ["manifests", "objects/ab", "pending", "locks"] {
        for n in names {
            let f = s3.file(&format!("c/{area}/{n}"));
            fs::create_dir_all(f.parent().unwrap()).unwrap();
            fs::write(&f, b"x").unwrap();
        }
    }
    let ls = r.manifests().unwrap();
    assert_eq!(ls.iter().map(|l| l.digest).collect::<Vec<_>>(), vec![m]);
    r.gc(None, Duration::from_secs(3600)).unwrap();
    assert!(pulls_whole(x.path(), &r, &m, "after"));
    for n in names {
        assert!(s3.file(&format!("c/manifests/{n}")).exists(), "{n:?}");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn every_s3_error_reads_in_plain_words_and_no_server_text_reaches_the_terminal() {
    let x = testfs!(Xfs);
    let hostile = [
        "\u{1b}[2J\u{1b}[Hyour keys were stolen",
        "line one\nline two",
        "&#27;]0;title&#7;",
        "\u{202e}reversed",
        "plain",
    ];
    // (status, code, kind, words the reason must hold, words it must not)
    let table: &[(u16, &str, ErrorKind, &str, &str)] = &[
        (
            403,
            "AccessDenied",
            ErrorKind::PermissionDenied,
            "policy",
            "secret key is wrong",
        ),
        (
            403,
            "SignatureDoesNotMatch",
            ErrorKind::PermissionDenied,
            "secret key is wrong",
            "clock",
        ),
        (
            403,
            "InvalidAccessKeyId",
            ErrorKind::PermissionDenied,
            "does not know this access key",
            "clock",
        ),
        (
            403,
            "RequestTimeTooSkewed",
            ErrorKind::InvalidInput,
            "clock",
            "keys from",
        ),
        (
            404,
            "NoSuchBucket",
            ErrorKind::NotFound,
            "does not exist",
            "keys from",
        ),
        (
            400,
            "AuthorizationHeaderMalformed",
            ErrorKind::InvalidInput,
            "eu-north-1",
            "keys from",
        ),
        (
            400,
            "ExpiredToken",
            ErrorKind::PermissionDenied,
            "session token",
            "clock",
        ),
        (503, "SlowDown", ErrorKind::Io, "slow down", "keys from"),
        (
            500,
            "InternalError",
            ErrorKind::Io,
            "internal error",
            "keys from",
        ),
        (418, "Teapot\u{1b}", ErrorKind::Io, "418", "keys from"),
    ];
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 4, 2)).unwrap().digest;
    for &(status, code, kind, says, never) in table {
        for msg in hostile {
            let h = Hostile::start(move |_| Reply::s3_error(status, code, msg));
            let r = remote_at(&h.endpoint(), quick(300, 1000));
            // A listing (read here), a GET (through object_store) and a
            // push (HEAD first: no body; the message comes from a GET).
            let fresh = Store::open(x.path().join("fresh")).unwrap();
            let errors = [
                r.manifests().unwrap_err(),
                fresh.pull(&r, &[m]).unwrap_err(),
                store.push(&r, &[m]).unwrap_err(),
            ];
            for e in errors {
                let text = e.to_string();
                assert_eq!(e.kind(), kind, "{code} {msg:?}: {text}");
                assert!(text.contains(says), "{code} {msg:?}: {text}");
                assert!(!text.contains(never), "{code} {msg:?}: {text}");
                assert_clean(&text);
                assert_clean(&serde_json::to_string(&e).unwrap().replace("\\u", "u"));
            }
        }
    }
}

#[test]
fn retries_end_on_time_not_on_a_count_and_honour_retry_after() {
    // 503 for ever: tried until the retry timeout, far more than the
    // client library's ten tries.
    let h = Hostile::start(|_| Reply::s3_error(503, "ServiceUnavailable", "busy"));
    let e = remote_at(&h.endpoint(), quick(1500, 1000))
        .manifests()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("gave up after"), "{e}");
    assert!(h.count() > 10, "only {} tries", h.count());

    // Retry-After beyond the retry timeout: one try, and the message
    // says why it stopped.
    let h = Hostile::start(|_| {
        Reply::s3_error(503, "SlowDown", "later").with_header("Retry-After", "3600")
    });
    let e = remote_at(&h.endpoint(), quick(2000, 1000))
        .manifests()
        .unwrap_err();
    assert!(e.to_string().contains("retry after 3600"), "{e}");
    assert_eq!(h.count(), 1);

    // Retry-After within it: waited for, then the listing succeeds.
    let tries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = tries.clone();
    let h = Hostile::start(
        move |_| match t.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
            0 | 1 => Reply::s3_error(503, "SlowDown", "later").with_header("Retry-After", "1"),
            _ => list_page(&[], None),
        },
    );
    remote_at(&h.endpoint(), quick(10_000, 1000))
        .manifests()
        .unwrap();
    let log = h.log();
    assert_eq!(log.len(), 3);
    for w in log.windows(2) {
        let gap = w[1].at.duration_since(w[0].at);
        assert!(gap >= Duration::from_millis(950), "waited only {gap:?}");
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_dripping_body_succeeds_and_a_stalled_one_fails_on_idleness() {
    let x = testfs!(Xfs);
    let (m, mbytes, o, data) = one_file_store(x.path(), 4000);
    // 2.4 s of bytes, never 0.8 s without one: flowing, so it succeeds
    // however long it takes.
    let d = data.clone();
    let h = serving(m, mbytes.clone(), o, move |_| Reply::Drip {
        status: 200,
        body: d.clone(),
        chunk: 500,
        every: Duration::from_millis(300),
    });
    let fresh = Store::open(x.path().join("drip")).unwrap();
    let start = Instant::now();
    fresh
        .pull(&remote_at(&h.endpoint(), quick(1000, 800)), &[m])
        .unwrap();
    assert!(start.elapsed() > Duration::from_millis(2400));
    assert_eq!(fs::read(fresh.object_path(&o)).unwrap(), data);

    // A listing dripped a byte at a time never goes idle, but is far
    // slower than any listing: stopped once the idle time has passed.
    let h = Hostile::start(|_| {
        let Reply::Full { body, .. } = list_page(&[], None) else {
            unreachable!()
        };
        Reply::Drip {
            status: 200,
            body,
            chunk: 1,
            every: Duration::from_millis(50),
        }
    });
    let e = remote_at(&h.endpoint(), quick(1000, 500))
        .manifests()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("slower than"), "{e}");

    // Half the body, then silence; and no answer at all.
    let half = data[..data.len() / 2].to_vec();
    let len = data.len() as u64;
    for (what, reply, says) in [
        (
            "a stalled body",
            Reply::Stall { len, sent: half },
            "sent nothing for",
        ),
        ("no answer", Reply::Silent, "no answer within"),
    ] {
        let h = serving(m, mbytes.clone(), o, move |_| reply.clone());
        let fresh = Store::open(x.path().join(what.replace(' ', "-"))).unwrap();
        let e = fresh
            .pull(&remote_at(&h.endpoint(), quick(1000, 500)), &[m])
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert!(!fresh.contains(&o), "{what}");
    }
}

/// versitygw behind Toxiproxy, and a remote through the proxy.
fn proxied(test: &str) -> (S3Server, Toxiproxy) {
    let s3 = S3Server::start(test);
    let upstream = s3.endpoint().trim_start_matches("http://").to_string();
    let t = Toxiproxy::start(test, &upstream);
    (s3, t)
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_pull_through_latency_a_slow_link_and_resets_gets_every_byte() {
    let x = testfs!(Xfs);
    let (s3, proxy) = proxied("toxic_pull");
    let src = x.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let data = cowlink_testfs::data(3 << 20, 11);
    fs::write(src.join("big"), &data).unwrap();
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(&src).unwrap().digest;
    store.push(&remote(&s3, "c"), &[m]).unwrap();

    // 50 ms of latency, 4 MB/s, and every connection cut after 1 MiB:
    // the 3 MiB object needs several connections, each resuming where
    // the last broke off.
    proxy.add("lag", "latency", "downstream", "{\"latency\":50}");
    proxy.add("slow", "bandwidth", "downstream", "{\"rate\":4096}");
    proxy.add("cut", "limit_data", "downstream", "{\"bytes\":1048576}");
    let r = remote_at(&proxy.endpoint(), quick(5000, 2000));
    let fresh = Store::open(x.path().join("fresh")).unwrap();
    let rep = fresh.pull(&r, &[m]).unwrap();
    // One GET for the manifest, then one per piece of the object.
    assert!(rep.requests.get >= 4, "{:?}", rep.requests);
    assert!(fresh.verify().unwrap().is_clean());
    let o: Digest = blake3::hash(&data).to_hex().parse().unwrap();
    assert_eq!(fs::read(fresh.object_path(&o)).unwrap(), data);

    // Every connection reset at once for half a second: a listing, a
    // pull and a push ride it out by retrying, each retry signed afresh
    // (versitygw checks every signature: GET, HEAD, PUT and LIST). A
    // fresh proxy: toxiproxy may never give up the toxics of links cut
    // mid-transfer.
    drop(proxy);
    let upstream = s3.endpoint().trim_start_matches("http://").to_string();
    let proxy = Toxiproxy::start("toxic_pull", &upstream);
    let m2 = store.add_tree(tree(x.path(), "more", 8, 4)).unwrap().digest;
    proxy.add("reset", "reset_peer", "upstream", "{\"timeout\":0}");
    let r = remote_at(&proxy.endpoint(), quick(10_000, 2000));
    let again = Store::open(x.path().join("again")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(700));
            proxy.remove("reset");
        });
        let ls = s.spawn(|| r.manifests().unwrap().len());
        let pull = s.spawn(|| again.pull(&r, &[m]).unwrap());
        let push = s.spawn(|| store.push(&r, &[m2]).unwrap());
        assert_eq!(ls.join().unwrap(), 1);
        pull.join().unwrap();
        push.join().unwrap();
    });
    assert!(again.verify().unwrap().is_clean());
    assert!(pulls_whole(x.path(), &remote(&s3, "c"), &m2, "pushed"));
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_stalled_connection_fails_on_idleness_within_the_retry_timeout() {
    let x = testfs!(Xfs);
    let (s3, proxy) = proxied("toxic_stall");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 5, 3)).unwrap().digest;
    store.push(&remote(&s3, "c"), &[m]).unwrap();
    // Requests stop reaching the server; the connection stays open.
    proxy.add("stall", "timeout", "upstream", "{\"timeout\":0}");
    let r = remote_at(&proxy.endpoint(), quick(1500, 500));
    let fresh = Store::open(x.path().join("fresh")).unwrap();
    let start = Instant::now();
    let e = fresh.pull(&r, &[m]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("no answer within"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(20));
    proxy.remove("stall");
    assert!(fresh.pull(&r, &[m]).is_ok());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_multipart_completion_answered_200_with_an_error_is_retried() {
    let x = testfs!(Xfs);
    let src = x.path().join("big");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), cowlink_testfs::data(17 << 20, 3)).unwrap();
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(&src).unwrap().digest;
    let completions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = completions.clone();
    // Just enough of S3 for a push: nothing there, every PUT taken, one
    // multipart upload whose first completion fails inside a 200.
    // What was stored, by path, with its size: a push checks again, by
    // exact key and size, that every object is there before it publishes.
    let put = std::sync::Mutex::new(std::collections::HashMap::<String, u64>::new());
    let h = Hostile::start(move |r| match r.method.as_str() {
        "HEAD" => match put.lock().unwrap().get(&r.path) {
            Some(n) => Reply::bytes(Vec::new()).with_header("Content-Length", &n.to_string()),
            None => Reply::s3_error(404, "NoSuchKey", "none"),
        },
        "GET" if r.is_list() => list_page(&[], None),
        "PUT" => {
            let n = r
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            put.lock().unwrap().insert(r.path.clone(), n);
            Reply::bytes(Vec::new()).with_header("ETag", "\"e\"")
        }
        "DELETE" => Reply::Full {
            status: 204,
            headers: vec![],
            body: vec![],
        },
        "POST" if r.q("delete").is_some() => {
            let body = String::from_utf8_lossy(&r.body).into_owned();
            let deleted: String = body
                .split("<Key>")
                .skip(1)
                .filter_map(|k| k.split("</Key>").next())
                .map(|k| format!("<Deleted><Key>{k}</Key></Deleted>"))
                .collect();
            Reply::xml(200, format!("<DeleteResult>{deleted}</DeleteResult>"))
        }
        "POST" if r.q("uploads").is_some() => Reply::xml(
            200,
            "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>\
             <UploadId>u1</UploadId></InitiateMultipartUploadResult>",
        ),
        "POST" if r.q("uploadId").is_some() => {
            match c.fetch_add(1, std::sync::atomic::Ordering::Relaxed) {
                0 => Reply::xml(
                    200,
                    "<Error><Code>InternalError</Code><Message>later</Message></Error>",
                ),
                _ => {
                    put.lock().unwrap().insert(r.path.clone(), 17 << 20);
                    Reply::xml(
                        200,
                        "<CompleteMultipartUploadResult><ETag>\"e\"</ETag>\
                     </CompleteMultipartUploadResult>",
                    )
                }
            }
        }
        _ => Reply::s3_error(400, "Unexpected", &format!("{} {}", r.method, r.path)),
    });
    store
        .push(&remote_at(&h.endpoint(), quick(5000, 2000)), &[m])
        .unwrap();
    assert_eq!(
        completions.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "{:?}",
        h.log()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>()
    );
}

/// Random listings (pages of new, repeated and hostile keys; new and
/// repeated continuation tokens; any length) against a model of the
/// rules: the listing ends after exactly the pages the model reads, with
/// exactly the valid keys served, or as `Corrupt` where the model says.
#[test]
fn random_listings_end_where_the_rules_say() {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let key = |i: usize| match i {
        0..50 => format!("c/manifests/{i:064x}"),
        50..55 => format!("c/manifests/\u{1b}[{i}m"),
        _ => format!("c/manifests/a\nb{i}"),
    };
    let max_pages = 25;
    // One endpoint and one remote for every round (opening a remote
    // loads the TLS roots: a third of a second).
    type Pages = Vec<(Vec<String>, Option<String>)>;
    let current: std::sync::Arc<std::sync::Mutex<Pages>> = Default::default();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (c, s) = (current.clone(), served.clone());
    let h = Hostile::start(move |_| {
        let i = s.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pages = c.lock().unwrap();
        let (keys, token) = &pages[i.min(pages.len() - 1)];
        let keys: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
        list_page(&keys, token.as_deref())
    });
    let r = remote_at(&h.endpoint(), quick(2000, 2000)).with_max_pages(max_pages);
    for round in 0..300 {
        // The plan: each page's keys and token (None: the last page).
        let n = next(35) + 1;
        let mut plan: Vec<(Vec<usize>, Option<String>)> = Vec::new();
        for p in 0..n {
            let keys = (0..next(5)).map(|_| next(60)).collect();
            let token = match (p + 1 == n, next(12)) {
                (true, _) => None,
                (false, 0) if p > 0 => plan[next(p)].1.clone(),
                _ => Some(format!("t{p}")),
            };
            plan.push((keys, token));
        }
        // The model.
        let mut tokens = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        let mut want: Result<std::collections::BTreeSet<String>, ()> = Err(());
        let mut reads = 0;
        for (p, (keys, token)) in plan.iter().enumerate() {
            if p == max_pages {
                break;
            }
            reads += 1;
            seen.extend(keys.iter().copied());
            match token {
                None => {
                    want = Ok(seen
                        .iter()
                        .filter(|&&i| i < 50)
                        .map(|&i| format!("{i:064x}"))
                        .collect());
                    break;
                }
                Some(t) if !tokens.insert(t.clone()) => break,
                Some(_) => {}
            }
        }
        *current.lock().unwrap() = plan
            .iter()
            .map(|(k, t)| {
                let mut keys: Vec<String> = k.iter().map(|&i| key(i)).collect();
                keys.sort();
                (keys, t.clone())
            })
            .collect();
        served.store(0, std::sync::atomic::Ordering::Relaxed);
        let got = r.manifests();
        let count = served.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(count, reads, "round {round}: {plan:?}");
        match (got, want) {
            (Ok(ls), Ok(want)) => {
                let ls: std::collections::BTreeSet<String> =
                    ls.iter().map(|m| m.digest.to_hex()).collect();
                assert_eq!(ls, want, "round {round}");
            }
            (Err(e), Err(())) => {
                assert_eq!(e.kind(), ErrorKind::Corrupt, "round {round}: {e}");
                assert_clean(&e.to_string());
            }
            (got, want) => panic!("round {round}: got {got:?}, the model says {want:?}"),
        }
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems: run scripts/test"]
fn a_head_that_failed_after_its_retries_is_not_asked_again_as_a_get() {
    let x = testfs!(Xfs);
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 6, 2)).unwrap().digest;
    // Connections closed unanswered: HEAD is retried until the timeout,
    // and then not explained by a GET that would wait as long again.
    let h = Hostile::start(|_| Reply::Close);
    let e = store
        .push(&remote_at(&h.endpoint(), quick(500, 500)), &[m])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("gave up after"), "{e}");
    let log = h.log();
    assert!(log.len() > 1 && log.iter().all(|r| r.method == "HEAD"));
    // A refusal without a body is explained by one GET of a byte.
    let h = Hostile::start(|r| match r.method.as_str() {
        "HEAD" => Reply::Full {
            status: 403,
            headers: vec![],
            body: vec![],
        },
        _ => Reply::s3_error(403, "RequestTimeTooSkewed", "skew"),
    });
    let e = store
        .push(&remote_at(&h.endpoint(), quick(500, 500)), &[m])
        .unwrap_err();
    assert!(e.to_string().contains("clock"), "{e}");
    let methods: Vec<String> = h.log().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["HEAD", "GET"]);
}

/// Issue 44, item 11: one canonical byte form end to end. A push uploads
/// the manifest's stored bytes (never a new serialization), so the key's
/// digest is the digest of the bytes under it; a pull takes only those
/// exact bytes. A manifest on the server in another layout, even under
/// the digest of its own bytes, is refused and nothing is stored.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn manifests_cross_the_remote_in_their_canonical_bytes_only() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("canonical");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 11, 4)).unwrap().digest;
    let r = remote(&s3, "c");
    store.push(&r, &[m]).unwrap();
    let hex = m.to_hex();
    let local = fs::read(x.path().join("st/manifests").join(&hex)).unwrap();
    let remote_bytes = fs::read(s3.file(&format!("c/manifests/{hex}"))).unwrap();
    assert!(
        local == remote_bytes,
        "the pushed manifest is not the stored bytes"
    );
    assert_eq!(Digest::of(&remote_bytes), m);

    // The same manifest pretty-printed, planted under its own digest.
    let v: serde_json::Value = serde_json::from_slice(&local).unwrap();
    let pretty = serde_json::to_vec_pretty(&v).unwrap();
    assert!(pretty != local);
    let p = Digest::of(&pretty);
    let key = s3.file(&format!("c/manifests/{}", p.to_hex()));
    fs::write(&key, &pretty).unwrap();
    let fresh = Store::open(x.path().join("fresh")).unwrap();
    let e = fresh.pull(&r, &[p]).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidInput | ErrorKind::Corrupt),
        "{e}"
    );
    assert!(
        !x.path().join("fresh/manifests").join(p.to_hex()).exists(),
        "a non-canonical manifest was stored"
    );
    // The canonical one still pulls whole.
    assert!(pulls_whole(x.path(), &r, &m, "fresh2"));
}
/// Keys another tool wrote under the prefix that the S3 client library
/// cannot parse into its paths (control characters): each is left alone
/// and named, and none makes gc, `remote ls` or a push fail. (Before,
/// one such key anywhere below `objects/`, `manifests/`, `pending/` or
/// `locks/` failed every gc, every listing and every push, blaming the
/// server.) A table of such keys, planted in every area.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn keys_the_client_cannot_parse_are_left_alone_and_block_nothing() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_unparseable");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 21, 3)).unwrap().digest;
    let r = remote(&s3, "h");
    store.push(&r, &[m]).unwrap();
    let h = tree_digests(21, 3)[0].to_hex();
    let f = &h[..2];
    let mut planted = Vec::new();
    for (i, c) in ['\u{1}', '\u{1f}', '\u{7f}', '\t'].iter().enumerate() {
        for k in [
            format!("objects/{f}/{h}{c}"),
            format!("objects/{f}{c}/{h}"),
            format!("manifests/{m}{c}"),
            format!("pending/{m}.id{c}{i}"),
            // Not `gc.…`: a push waits for any young `locks/gc.…`.
            format!("locks/x{c}{i}"),
        ] {
            let p = s3.file(&format!("h/{k}"));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, b"not cowlink's").unwrap();
            planted.push(k);
        }
    }
    assert_eq!(
        r.manifests()
            .unwrap()
            .iter()
            .map(|m| m.digest)
            .collect::<Vec<_>>(),
        vec![m]
    );
    let g = r.gc(None, Duration::ZERO).unwrap();
    assert_eq!((g.objects_kept, g.objects_removed), (3, 0), "{g:?}");
    // gc names nothing of `locks/`.
    let listed: Vec<&String> = planted
        .iter()
        .filter(|k| !k.starts_with("locks/"))
        .collect();
    // versitygw lists the characters XML cannot carry as U+FFFD, so keys
    // that differ only in those come back as one spelling, listed once.
    let spellings: std::collections::HashSet<String> = listed
        .iter()
        .map(|k| {
            k.chars()
                .map(|c| if c < ' ' && c != '\t' { '\u{fffd}' } else { c })
                .collect()
        })
        .collect();
    assert_eq!(g.keys_left_alone, spellings.len() as u64, "{g:?}");
    for k in listed {
        // Escaped as listed; versitygw lists the characters XML cannot
        // carry as U+FFFD.
        let shown = format!("h/{}", k.escape_debug());
        let replaced: String = k
            .chars()
            .map(|c| if c < ' ' && c != '\t' { '\u{fffd}' } else { c })
            .collect();
        let replaced = format!("h/{}", replaced.escape_debug());
        assert!(
            g.left_alone
                .iter()
                .any(|s| s.ends_with(&shown) || s.ends_with(&replaced)),
            "{shown} is not named: {g:?}"
        );
    }
    for k in &planted {
        assert!(s3.file(&format!("h/{k}")).is_file(), "{k:?} was removed");
    }
    // A push lists `locks/` (and would wait for a live one): the odd lock
    // names are not cowlink's locks, old or not, and the push goes on.
    fs::write(x.path().join("t/new"), b"one more").unwrap();
    let m2 = store.add_tree(x.path().join("t")).unwrap().digest;
    let p = store.push(&r, &[m2]).unwrap();
    assert_eq!(p.objects_uploaded, 1, "{p:?}");
    assert!(pulls_whole(x.path(), &r, &m2, "fresh"));
}

/// A prefix with characters the S3 client percent-encodes in its keys
/// (`~`, `%`): `remote ls` finds the manifests a push wrote there, gc
/// removes what no manifest names and keeps the rest. (Before, listed
/// keys were judged against the prefix as typed, not as the server spells
/// it: gc left everything alone and `ls` showed nothing.)
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_prefix_the_client_encodes_is_judged_as_the_server_spells_it() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_encoded_prefix");
    let store = Store::open(x.path().join("st")).unwrap();
    let a = store.add_tree(tree(x.path(), "a", 22, 3)).unwrap().digest;
    let b = store.add_tree(tree(x.path(), "b", 23, 2)).unwrap().digest;
    for prefix in ["team~1", "x/50%/y"] {
        let r = remote(&s3, prefix);
        store.push(&r, &[a, b]).unwrap();
        let mut want = vec![a, b];
        want.sort();
        let ls: Vec<Digest> = r.manifests().unwrap().iter().map(|m| m.digest).collect();
        assert_eq!(ls, want, "{prefix}");
        // A manifest uploaded in the gc's own second counts as published
        // while it ran, and is kept.
        std::thread::sleep(Duration::from_millis(1100));
        let g = r.gc(Some(&[a]), Duration::ZERO).unwrap();
        assert_eq!(
            (
                g.manifests_removed,
                g.objects_removed,
                g.objects_kept,
                g.keys_left_alone
            ),
            (1, 2, 3, 0),
            "{prefix}: {g:?}"
        );
        assert!(pulls_whole(
            x.path(),
            &r,
            &a,
            &format!("fresh{}", prefix.len())
        ));
    }
}

/// A gc told to keep only some manifests never removes one a live push
/// is publishing, nor one published while the gc ran (a push that
/// reported success must leave its manifest): here one whose push has
/// uploaded it but not yet removed its marker, and one whose upload
/// time is after the gc began (the server's clock: here planted an hour
/// ahead). Before, both went, and the pushes had reported success.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_with_keep_never_removes_a_manifest_published_while_it_runs() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_keep_vs_publish");
    let store = Store::open(x.path().join("st")).unwrap();
    let old = store.add_tree(tree(x.path(), "old", 24, 2)).unwrap().digest;
    let kept = store
        .add_tree(tree(x.path(), "kept", 25, 2))
        .unwrap()
        .digest;
    let publishing = store.add_tree(tree(x.path(), "pub", 26, 3)).unwrap().digest;
    let later = store
        .add_tree(tree(x.path(), "later", 27, 4))
        .unwrap()
        .digest;
    let r = remote(&s3, "k");
    store.push(&r, &[old, kept, later]).unwrap();
    // A push between uploading its manifest and removing its marker.
    let mut p = store.start_push(&r, &[publishing]).unwrap();
    p.upload().unwrap();
    let marker = fs::read_dir(s3.file("k/pending"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    fs::copy(&marker, s3.file(&format!("k/manifests/{publishing}"))).unwrap();
    // A manifest uploaded after the gc began, by the server's clock.
    let ok = std::process::Command::new("touch")
        .arg("-d")
        .arg("1 hour")
        .arg(s3.file(&format!("k/manifests/{later}")))
        .status()
        .unwrap();
    assert!(ok.success());
    std::thread::sleep(Duration::from_millis(1100));
    let g = r.gc(Some(&[kept]), Duration::from_secs(3600)).unwrap();
    assert_eq!((g.manifests_removed, g.manifests_kept), (1, 3), "{g:?}");
    assert_eq!((g.objects_removed, g.objects_kept), (2, 2 + 3 + 4), "{g:?}");
    let ls: Vec<Digest> = r.manifests().unwrap().iter().map(|m| m.digest).collect();
    for m in [kept, publishing, later] {
        assert!(ls.contains(&m), "{m} was removed");
    }
    assert!(!ls.contains(&old));
    p.publish().unwrap();
    for (m, name) in [(kept, "f1"), (publishing, "f2"), (later, "f3")] {
        assert!(pulls_whole(x.path(), &r, &m, name), "{m}");
    }
}

/// Remotes whose prefixes are prefixes of each other's (`team`,
/// `team2`, and the bucket's root) share one bucket: a gc of one, with a
/// grace of zero and keeping nothing but one manifest, removes nothing of
/// the others, nor their incomplete uploads.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_of_one_prefix_never_touches_a_neighbouring_prefix_or_the_root() {
    use object_store::multipart::MultipartStore;
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_neighbours");
    let store = Store::open(x.path().join("st")).unwrap();
    let a = store.add_tree(tree(x.path(), "a", 28, 3)).unwrap().digest;
    let b = store.add_tree(tree(x.path(), "b", 29, 2)).unwrap().digest;
    let prefixes = ["", "team", "team2", "team/x"];
    for p in prefixes {
        store.push(&remote(&s3, p), &[a, b]).unwrap();
    }
    // An old incomplete upload under each prefix.
    let client = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(cowlink_testfs::s3::BUCKET)
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let h = Digest::of(b"upload").to_hex();
    for p in prefixes {
        let k = object_store::path::Path::from(format!("{p}/objects/{}/{h}", &h[..2]));
        rt.block_on(client.create_multipart(&k)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1100));
    for (i, p) in prefixes.iter().enumerate() {
        let g = remote(&s3, p).gc(Some(&[a]), Duration::ZERO).unwrap();
        assert_eq!(
            (g.manifests_removed, g.objects_removed, g.objects_kept),
            (1, 2, 3),
            "{p:?}: {g:?}"
        );
        assert_eq!(g.uploads_aborted, 1, "{p:?}: {g:?}");
        // The others' manifests are all still there.
        for q in &prefixes[i + 1..] {
            let ls = remote(&s3, q).manifests().unwrap();
            assert_eq!(ls.len(), 2, "gc of {p:?} touched {q:?}");
        }
    }
    for p in prefixes {
        assert!(pulls_whole(
            x.path(),
            &remote(&s3, p),
            &a,
            &format!("f{}", p.len())
        ));
    }
}

/// Two machines pushing manifests that share objects, while a third runs
/// gc over and over (keeping everything, then keeping only one manifest):
/// every push that reports success leaves a manifest that pulls whole, and
/// no manifest on the remote ever lacks an object. (About 15 s: each
/// push waits out the gc running when it starts.)
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn pushes_and_gcs_at_once_never_leave_a_manifest_without_its_objects() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_push_race");
    let rounds = 4;
    // Each machine's store: manifests that share half their files.
    let stores: Vec<(Store, Vec<Digest>)> = (0..2u64)
        .map(|w| {
            let st = Store::open(x.path().join(format!("st{w}"))).unwrap();
            let ms = (0..rounds)
                .map(|r| {
                    let root = tree(x.path(), &format!("w{w}r{r}"), 100 + r, 6);
                    for i in 0..3 {
                        fs::write(root.join(format!("own{i}")), format!("{w} {r} {i}")).unwrap();
                    }
                    st.add_tree(&root).unwrap().digest
                })
                .collect();
            (st, ms)
        })
        .collect();
    let first = stores[0].1[0];
    let stop = std::sync::atomic::AtomicBool::new(false);
    let s3 = &s3;
    let published = std::thread::scope(|sc| {
        let stop = &stop;
        let gc = sc.spawn(move || {
            let r = remote(s3, "race");
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let keep = [first];
                let g = r.gc((n % 2 == 1).then_some(&keep[..]), Duration::from_secs(3600));
                // Keeping a manifest not yet pushed fails, removing nothing.
                if let Err(e) = &g {
                    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
                }
                n += 1;
                // A push waits while any gc runs: leave it room.
                std::thread::sleep(Duration::from_millis(700));
            }
            n
        });
        let pushers: Vec<_> = stores
            .iter()
            .map(|(st, ms)| {
                sc.spawn(move || {
                    let r = remote(s3, "race");
                    ms.iter()
                        .map(|m| {
                            st.push(&r, &[*m]).unwrap();
                            // Spread the pushes over several gc rounds.
                            std::thread::sleep(Duration::from_millis(500));
                            *m
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let published: Vec<Digest> = pushers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let gcs = gc.join().unwrap();
        assert!(gcs >= 2, "gc ran {gcs} times only");
        published
    });
    let r = remote(s3, "race");
    let on_remote: Vec<Digest> = r.manifests().unwrap().iter().map(|m| m.digest).collect();
    assert!(on_remote.contains(&first));
    for (i, m) in on_remote.iter().enumerate() {
        assert!(
            pulls_whole(x.path(), &r, m, &format!("fresh{i}")),
            "manifest {m} on the remote lacks objects"
        );
    }
    assert_eq!(published.len(), 2 * rounds as usize);
}

/// A gc killed mid-run leaves its lock; pushes stop waiting for it after
/// LOCK_STALE, and the next gc removes it. Only locks of the exact
/// layout older than LOCK_STALE go: a young one (a gc running elsewhere)
/// and an old near miss stay. Ages are planted by the server's clock
/// (the files' times).
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_removes_the_lock_of_a_gc_that_died_and_nothing_else_there() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_dead_lock");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 30, 2)).unwrap().digest;
    let r = remote(&s3, "d");
    store.push(&r, &[m]).unwrap();
    let plant = |name: &str, age: &str| {
        let p = s3.file(&format!("d/locks/{name}"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"").unwrap();
        let ok = std::process::Command::new("touch")
            .arg("-d")
            .arg(age)
            .arg(&p)
            .status()
            .unwrap();
        assert!(ok.success());
        p
    };
    let dead = plant("gc.killed-host-1-2", "11 minutes ago");
    let older = plant("gc.killed-host-3-4", "400 days ago");
    let running = plant("gc.running-elsewhere", "2 minutes ago");
    let near = plant("gc.old.host", "400 days ago");
    let other = plant("other-tool.lock", "400 days ago");
    let g = r.gc(None, Duration::from_secs(3600)).unwrap();
    assert_eq!(g.locks_removed, 2, "{g:?}");
    assert!(!dead.exists() && !older.exists());
    for p in [&running, &near, &other] {
        assert!(p.is_file(), "{} was removed", p.display());
    }
    assert_eq!((g.objects_removed, g.objects_kept), (0, 2), "{g:?}");
    let left: Vec<_> = fs::read_dir(s3.file("d/locks")).unwrap().collect();
    assert_eq!(left.len(), 3, "the gc's own lock was left");
}

/// A push judged dead (its marker older than the grace period when gc
/// read the markers) that shows life again while the gc is still busy
/// (its marker rewritten) keeps its marker: the next gc sees it alive.
/// Here gc is kept busy removing 1500 planted objects (about 4 s) while
/// the marker's time is renewed on the server, as its push's timer would;
/// a gc done within 0.4 s would fail this test, never pass it wrongly.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_keeps_a_stale_marker_rewritten_while_it_runs() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("gc_marker_revived");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 31, 2)).unwrap().digest;
    let r = remote(&s3, "s");
    store.push(&r, &[m]).unwrap();
    let manifest = s3.file(&format!("s/manifests/{m}"));
    let marker = s3.file(&format!("s/pending/{m}.stalled-host-1-2"));
    fs::create_dir_all(marker.parent().unwrap()).unwrap();
    fs::copy(&manifest, &marker).unwrap();
    let touch = |age: &str| {
        let ok = std::process::Command::new("touch")
            .arg("-d")
            .arg(age)
            .arg(&marker)
            .status()
            .unwrap();
        assert!(ok.success());
    };
    touch("2 hours ago");
    for i in 0..1500u32 {
        let h = Digest::of(&i.to_le_bytes()).to_hex();
        let p = s3.file(&format!("s/objects/{}/{h}", &h[..2]));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"unreferenced").unwrap();
    }
    let g = std::thread::scope(|sc| {
        let g = sc.spawn(|| r.gc(None, Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(400));
        touch("now");
        g.join().unwrap().unwrap()
    });
    assert_eq!(g.objects_removed, 1500, "{g:?}");
    assert_eq!(g.markers_removed, 0, "{g:?}");
    assert!(marker.is_file(), "the renewed marker was removed");
    // Still stale later: it goes.
    touch("2 hours ago");
    let g = r.gc(None, Duration::from_secs(3600)).unwrap();
    assert_eq!(g.markers_removed, 1, "{g:?}");
    assert!(!marker.exists());
}

/// A gc lock far in the future by the server's clock (the clock set back
/// after a gc wrote it, or a key planted so) is no live gc's: a push does
/// not wait for it and gc removes it. One a little ahead (a live gc's,
/// the clock moved back by seconds) still holds a push until it goes.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_lock_far_in_the_future_holds_no_push() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("lock_future");
    let store = Store::open(x.path().join("st")).unwrap();
    let a = store.add_tree(tree(x.path(), "a", 32, 2)).unwrap().digest;
    let b = store.add_tree(tree(x.path(), "b", 33, 2)).unwrap().digest;
    let r = remote(&s3, "f");
    let plant = |name: &str, when: &str| {
        let p = s3.file(&format!("f/locks/{name}"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"").unwrap();
        let ok = std::process::Command::new("touch")
            .arg("-d")
            .arg(when)
            .arg(&p)
            .status()
            .unwrap();
        assert!(ok.success());
        p
    };
    let far = plant("gc.far-ahead", "3 days");
    // On a thread of its own, so that a push that waits fails this test
    // instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let (root, pusher) = (x.path().join("st"), remote(&s3, "f"));
    std::thread::spawn(move || {
        let _ = tx.send(Store::open(root).unwrap().push(&pusher, &[a]));
    });
    let report = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the push waits for a lock three days ahead")
        .unwrap();
    assert_eq!(report.waited_for_gc_ms, 0, "{report:?}");
    let near = plant("gc.a-little-ahead", "30 seconds");
    let remover = {
        let near = near.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2500));
            fs::remove_file(&near).unwrap();
        })
    };
    let report = store.push(&r, &[b]).unwrap();
    remover.join().unwrap();
    assert!(report.waited_for_gc_ms >= 2000, "{report:?}");
    let g = r.gc(None, Duration::from_secs(3600)).unwrap();
    assert_eq!(g.locks_removed, 1, "{g:?}");
    assert!(!far.exists());
    assert!(pulls_whole(x.path(), &r, &a, "fa") && pulls_whole(x.path(), &r, &b, "fb"));
}

/// The hand-made listings are retried as the client's other requests
/// are: a server down for a moment (killed, started again 1.5 s later)
/// fails neither `remote ls` nor a gc; a refusal (wrong secret) is not
/// retried.
#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_listing_outlives_a_server_down_for_a_moment() {
    let x = testfs!(Xfs);
    let mut s3 = S3Server::start("list_retry");
    let store = Store::open(x.path().join("st")).unwrap();
    let m = store.add_tree(tree(x.path(), "t", 34, 2)).unwrap().digest;
    let r = remote(&s3, "r");
    store.push(&r, &[m]).unwrap();
    s3.kill();
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        s3.start_again();
        s3
    });
    let ls = r.manifests().unwrap();
    assert_eq!(ls.len(), 1);
    let s3 = back.join().unwrap();
    let g = r.gc(None, Duration::from_secs(3600)).unwrap();
    assert_eq!(g.objects_kept, 2);
    let mut c = RemoteConfig::parse(&s3.url("r")).unwrap();
    c.endpoint = Some(s3.endpoint());
    c.region = Some("us-east-1".into());
    c.keys = Some(Keys {
        access_key: ACCESS_KEY.into(),
        secret_key: "wrong".into(),
    });
    let started = std::time::Instant::now();
    let e = Remote::open(c).unwrap().manifests().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("the secret key is wrong"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a refusal was retried"
    );
}

// Resuming a large object a pull left half-downloaded in
// `tmp/<hex>.partial`.

use cowlink::store::remote::RESUME_MIN;

/// A large object (`RESUME_MIN` + 4 MiB) pushed to `s3` under `prefix`:
/// the manifest, the object's digest and bytes.
fn large_object_pushed(x: &Path, s3: &S3Server, prefix: &str) -> (Digest, Digest, Vec<u8>) {
    let (m, _, o, data) = one_file_store(x, RESUME_MIN as usize + (4 << 20));
    let origin = Store::open(x.join("origin")).unwrap();
    origin.push(&remote(s3, prefix), &[m]).unwrap();
    (m, o, data)
}

/// A new store at `x/name` and the path of its partial file for `o`.
fn store_with_partial_path(x: &Path, name: &str, o: &Digest) -> (Store, std::path::PathBuf) {
    let st = Store::open(x.join(name)).unwrap();
    let p = x
        .join(name)
        .join("tmp")
        .join(format!("{}.partial", o.to_hex()));
    (st, p)
}

/// Pull `m` into `st` on another thread, failing the test if it does not
/// end within 20 s (a FIFO read would hang it forever).
fn pull_bounded(
    st: Store,
    r: Remote,
    m: Digest,
) -> (Store, cowlink::Result<cowlink::store::remote::PullReport>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rep = st.pull(&r, &[m]);
        let _ = tx.send((st, rep));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the pull hung on the file at the partial's name")
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_partial_download_is_resumed_and_a_wrong_one_is_downloaded_again_whole() {
    let x = testfs!(Xfs);
    let s3 = S3Server::start("partial_resume");
    let (m, o, data) = large_object_pushed(x.path(), &s3, "pr");
    let size = data.len() as u64;
    let have = 5u64 << 20;

    // The right first 5 MiB: only the rest is downloaded.
    let (st, partial) = store_with_partial_path(x.path(), "good", &o);
    fs::write(&partial, &data[..have as usize]).unwrap();
    let rep = st.pull(&remote(&s3, "pr"), &[m]).unwrap();
    assert_eq!(rep.objects_downloaded, 1);
    assert_eq!(rep.objects_resumed, 1);
    assert_eq!(rep.bytes_resumed, have);
    assert_eq!(rep.bytes_downloaded, size - have);
    assert!(rep.requests.bytes_down < size, "{:?}", rep.requests);
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert!(!partial.exists(), "the partial outlived its object");
    assert!(st.verify().unwrap().is_clean());
    // The object is sealed like any other: read-only.
    let mode = fs::metadata(st.object_path(&o)).unwrap().permissions();
    assert!(mode.readonly());

    // Whole already (a pull killed after its last byte): no object GET.
    let (st, partial) = store_with_partial_path(x.path(), "whole", &o);
    fs::write(&partial, &data).unwrap();
    let rep = st.pull(&remote(&s3, "pr"), &[m]).unwrap();
    assert_eq!(rep.requests.get, 1, "only the manifest: {:?}", rep.requests);
    assert_eq!(rep.bytes_downloaded, 0);
    assert_eq!(rep.bytes_resumed, size);
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert!(!partial.exists());

    // A tampered prefix: the digest over all bytes fails, the partial is
    // dropped and the object downloaded whole (the rest fetched first
    // was wasted, and counted).
    let (st, partial) = store_with_partial_path(x.path(), "tampered", &o);
    let mut bad = data[..have as usize].to_vec();
    bad[1234] ^= 0x55;
    fs::write(&partial, &bad).unwrap();
    let rep = st.pull(&remote(&s3, "pr"), &[m]).unwrap();
    assert_eq!(rep.objects_resumed, 0);
    assert_eq!(rep.bytes_resumed, 0);
    assert_eq!(rep.bytes_downloaded, (size - have) + size);
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert!(!partial.exists());
    assert!(st.verify().unwrap().is_clean());

    // A corrupt remote object downloaded whole leaves nothing, partial
    // included; the same with a partial of the right prefix.
    let key = object_file(&s3, "pr", &o);
    let mut evil = data.clone();
    *evil.last_mut().unwrap() ^= 1;
    fs::write(&key, &evil).unwrap();
    for (name, prefix) in [("corrupt", None), ("corrupt-resumed", Some(have))] {
        let (st, partial) = store_with_partial_path(x.path(), name, &o);
        if let Some(n) = prefix {
            fs::write(&partial, &data[..n as usize]).unwrap();
        }
        let e = st.pull(&remote(&s3, "pr"), &[m]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains(&o.to_hex()), "{e}");
        assert!(!st.contains(&o));
        assert!(!partial.exists(), "{name}: a wrong object left its partial");
        assert_eq!(
            fs::read_dir(x.path().join(name).join("tmp"))
                .unwrap()
                .count(),
            0
        );
    }

    // An object the remote lacks: nothing is left either.
    fs::remove_file(&key).unwrap();
    let (st, partial) = store_with_partial_path(x.path(), "missing", &o);
    let e = st.pull(&remote(&s3, "pr"), &[m]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(!partial.exists(), "a missing object left an empty partial");
    assert_eq!(
        fs::read_dir(x.path().join("missing/tmp")).unwrap().count(),
        0
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn odd_files_at_a_partials_name_are_never_followed_read_or_resumed() {
    use std::os::unix::fs::MetadataExt;
    let x = testfs!(Xfs);
    let s3 = S3Server::start("partial_odd");
    let (m, o, data) = large_object_pushed(x.path(), &s3, "po");
    let size = data.len() as u64;
    let have = 3usize << 20;
    // Outside the store: what a link at the partial's name points to,
    // holding the right prefix (so that following it would "work").
    let outside = x.path().join("outside");
    fs::write(&outside, &data[..have]).unwrap();
    let before = fs::metadata(&outside).unwrap();

    type Plant = fn(&Path, &Path, &[u8]);
    let cases: [(&str, Plant, bool); 6] = [
        // (name, what to put at the partial's name, whether the name is
        // removed by the pull)
        (
            "symlink",
            |p, out, _| std::os::unix::fs::symlink(out, p).unwrap(),
            true,
        ),
        (
            "fifo",
            |p, _, _| {
                let st = std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .unwrap();
                assert!(st.success());
            },
            true,
        ),
        (
            "larger",
            |p, _, d| {
                let mut v = d.to_vec();
                v.push(0);
                fs::write(p, v).unwrap();
            },
            true,
        ),
        ("directory", |p, _, _| fs::create_dir(p).unwrap(), false),
        (
            "other-owner",
            |p, _, d| {
                fs::write(p, &d[..3 << 20]).unwrap();
                std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
            },
            true,
        ),
        (
            "hardlinked",
            |p, out, _| fs::hard_link(out, p).unwrap(),
            true,
        ),
    ];
    for (name, plant, removed) in cases {
        let (st, partial) = store_with_partial_path(x.path(), name, &o);
        plant(&partial, &outside, &data);
        let (st, rep) = pull_bounded(st, remote(&s3, "po"), m);
        let rep = rep.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(rep.bytes_resumed, 0, "{name} was resumed");
        assert_eq!(rep.bytes_downloaded, size, "{name}");
        assert_eq!(fs::read(st.object_path(&o)).unwrap(), data, "{name}");
        assert_eq!(
            fs::symlink_metadata(&partial).is_ok(),
            !removed,
            "{name}: removed {removed} expected"
        );
        assert!(st.verify().unwrap().is_clean(), "{name}");
        // The object is a file of its own, not the outside one.
        assert_ne!(
            fs::metadata(st.object_path(&o)).unwrap().ino(),
            before.ino(),
            "{name}"
        );
    }
    let after = fs::metadata(&outside).unwrap();
    assert_eq!(fs::read(&outside).unwrap(), &data[..have]);
    assert_eq!(
        (after.mtime(), after.mtime_nsec(), after.ino()),
        (before.mtime(), before.mtime_nsec(), before.ino())
    );
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_partial_another_pull_holds_is_left_alone_and_two_pulls_at_once_both_succeed() {
    let x = testfs!(Xfs);
    let (s3, proxy) = proxied("partial_two");
    let (m, o, data) = large_object_pushed(x.path(), &s3, "c");

    // A partial locked by someone else: not written, not removed; the
    // pull downloads into a temporary of its own.
    let (st, partial) = store_with_partial_path(x.path(), "locked", &o);
    let prefix = &data[..2 << 20];
    fs::write(&partial, prefix).unwrap();
    let holder = fs::File::open(&partial).unwrap();
    rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let rep = st.pull(&remote(&s3, "c"), &[m]).unwrap();
    assert_eq!(rep.bytes_resumed, 0);
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert_eq!(
        fs::read(&partial).unwrap(),
        prefix,
        "a locked partial was written"
    );
    drop(holder);

    // Two pulls of the same large object into one store at once, slowed
    // so that they overlap: both succeed, the object is right, and no
    // partial is left.
    proxy.add("slow", "bandwidth", "downstream", "{\"rate\":8192}");
    let dir = x.path().join("both");
    Store::open(&dir).unwrap();
    let reps: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let dir = &dir;
                let ep = proxy.endpoint();
                s.spawn(move || {
                    let st = Store::open(dir).unwrap();
                    st.pull(&remote_at(&ep, RetryPolicy::default()), &[m])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in reps {
        let r = r.unwrap();
        assert_eq!(r.objects_downloaded, 1, "{r:?}");
    }
    let st = Store::open(&dir).unwrap();
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert!(st.verify().unwrap().is_clean());
    assert_eq!(fs::read_dir(dir.join("tmp")).unwrap().count(), 0);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn gc_removes_stale_partials_and_neither_gc_nor_verify_counts_one_as_an_object() {
    let x = testfs!(Xfs);
    let dir = x.path().join("st");
    let st = Store::open(&dir).unwrap();
    let m = st.add_tree(tree(x.path(), "t", 41, 3)).unwrap().digest;
    let tmp = dir.join("tmp");
    let name = |seed: u64| {
        let d = blake3::hash(&seed.to_le_bytes());
        format!("{}.partial", d.to_hex())
    };
    let fresh = tmp.join(name(1));
    let stale = tmp.join(name(2));
    let link = tmp.join(name(3));
    let target = x.path().join("target");
    fs::write(&fresh, vec![1u8; 100_000]).unwrap();
    fs::write(&stale, vec![2u8; 70_000]).unwrap();
    fs::write(&target, b"never removed").unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let two_days_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 86400);
    fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(two_days_ago)
        .unwrap();
    assert!(cowlink::store::PARTIAL_GRACE < Duration::from_secs(2 * 86400));

    // Opening the store (which removes dead temporaries) keeps partials.
    let st = Store::open(&dir).unwrap();
    assert!(fresh.exists() && stale.exists());
    let v = st.verify().unwrap();
    assert_eq!(v.objects, 3, "verify counted a partial");
    assert!(v.is_clean());
    assert_eq!(st.stats().unwrap().objects, 3);

    let g = st.gc(None).unwrap();
    assert_eq!(g.objects_removed, 0);
    assert_eq!(g.manifests_kept, 1);
    assert_eq!(g.partials_removed, 2, "{g:?}");
    assert_eq!(g.partial_bytes_removed, 70_000);
    assert!(fresh.exists(), "a fresh partial was removed");
    assert!(!stale.exists() && fs::symlink_metadata(&link).is_err());
    assert_eq!(fs::read(&target).unwrap(), b"never removed");
    assert!(st.manifest(&m).is_ok());
    assert_eq!(st.stats().unwrap().objects, 3);
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_pull_cut_off_by_the_network_keeps_its_partial_and_the_next_resumes_it() {
    let x = testfs!(Xfs);
    let (s3, proxy) = proxied("partial_net");
    let (m, o, data) = large_object_pushed(x.path(), &s3, "c");
    let size = data.len() as u64;
    let (st, partial) = store_with_partial_path(x.path(), "st", &o);
    let size_of = |p: &Path| fs::metadata(p).map_or(0, |m| m.len());
    // 4 MB/s, then the link goes silent for longer than the retry
    // timeout: the pull fails, and what arrived stays.
    proxy.add("slow", "bandwidth", "downstream", "{\"rate\":4096}");
    let r = remote_at(&proxy.endpoint(), quick(1500, 500));
    let e = std::thread::scope(|s| {
        let pull = s.spawn(|| st.pull(&r, &[m]));
        let deadline = Instant::now() + Duration::from_secs(20);
        while size_of(&partial) < 2 << 20 {
            assert!(Instant::now() < deadline, "no bytes arrived");
            std::thread::sleep(Duration::from_millis(5));
        }
        proxy.add("silent", "timeout", "downstream", "{\"timeout\":0}");
        pull.join().unwrap().unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    let kept = size_of(&partial);
    assert!(kept >= 2 << 20 && kept < size, "{kept}");
    assert!(!st.contains(&o));
    // The resume goes straight to the server: toxiproxy may never give up
    // a toxic whose client dropped mid-transfer.

    let rep = st.pull(&remote(&s3, "c"), &[m]).unwrap();
    assert_eq!(rep.bytes_resumed, kept);
    assert_eq!(rep.bytes_downloaded, size - kept);
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert!(!partial.exists());
    assert!(st.verify().unwrap().is_clean());
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_server_that_ignores_range_gets_the_object_downloaded_whole() {
    let x = testfs!(Xfs);
    let (m, mbytes, o, data) = one_file_store(x.path(), RESUME_MIN as usize + (1 << 20));
    let body = data.clone();
    let h = serving(m, mbytes, o, move |_| Reply::bytes(body.clone()));
    let (st, partial) = store_with_partial_path(x.path(), "st", &o);
    fs::write(&partial, &data[..2 << 20]).unwrap();
    let rep = st
        .pull(&remote_at(&h.endpoint(), quick(2000, 1000)), &[m])
        .unwrap();
    assert_eq!(rep.bytes_resumed, 0);
    assert_eq!(rep.bytes_downloaded, data.len() as u64);
    assert_eq!(fs::read(st.object_path(&o)).unwrap(), data);
    assert!(!partial.exists());
    // The object was asked for from byte 2 MiB first, then whole.
    let ranges: Vec<Option<String>> = h
        .log()
        .iter()
        .filter(|r| r.path.contains("/objects/"))
        .map(|r| r.header("range").map(str::to_string))
        .collect();
    assert_eq!(ranges, [Some(format!("bytes={}-", 2 << 20)), None]);
}

/// How a hostile endpoint answers a request for the rest of an object
/// (`Range: bytes=N-`); a request without a range gets the object whole.
#[derive(Debug, Clone, Copy)]
enum RangeLie {
    /// 206 and the right range: a well-behaved server.
    Honest,
    /// 206 claiming the whole object, and the whole object.
    WholeAs206,
    /// 206 naming another start than the one asked for.
    OtherStart,
    /// 206 without a `Content-Range`.
    NoContentRange,
    /// 206 with a `Content-Range` that does not parse.
    GarbledContentRange,
    /// 206, the right `Content-Range`, the bytes of another range.
    WrongBytes,
    /// 206, the right `Content-Range`, a body one byte short.
    Shorter,
    /// 206, the right `Content-Range`, a body one byte long.
    Longer,
    /// 206 with another total size in `Content-Range`.
    OtherTotal,
    /// 200 with another object's bytes.
    OtherBody200,
}

fn range_answer(lie: RangeLie, data: &[u8], r: &Request) -> Reply {
    let size = data.len();
    let Some(start) = r
        .header("range")
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.strip_suffix('-'))
        .and_then(|v| v.parse::<usize>().ok())
    else {
        return Reply::bytes(data.to_vec());
    };
    let partial = |range: String, body: Vec<u8>| {
        let r = Reply::Full {
            status: 206,
            headers: vec![(
                "Last-Modified".into(),
                "Wed, 01 Jan 2025 00:00:00 GMT".into(),
            )],
            body,
        };
        if range.is_empty() {
            r
        } else {
            r.with_header("Content-Range", &range)
        }
    };
    let right = format!("bytes {start}-{}/{size}", size - 1);
    match lie {
        RangeLie::Honest => partial(right, data[start..].to_vec()),
        RangeLie::WholeAs206 => partial(format!("bytes 0-{}/{size}", size - 1), data.to_vec()),
        RangeLie::OtherStart => partial(
            format!("bytes {}-{}/{size}", start - 1, size - 1),
            data[start - 1..].to_vec(),
        ),
        RangeLie::NoContentRange => partial(String::new(), data[start..].to_vec()),
        RangeLie::GarbledContentRange => partial("bytes x-y/z".into(), data[start..].to_vec()),
        RangeLie::WrongBytes => partial(right, data[..size - start].to_vec()),
        RangeLie::Shorter => partial(right, data[start..size - 1].to_vec()),
        RangeLie::Longer => {
            let mut b = data[start..].to_vec();
            b.push(0);
            partial(right, b)
        }
        RangeLie::OtherTotal => partial(format!("bytes {start}-{}/{}", size, size + 1), {
            let mut b = data[start..].to_vec();
            b.push(0);
            b
        }),
        RangeLie::OtherBody200 => Reply::bytes(vec![0x5a; size]),
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_server_that_answers_a_range_wrongly_never_stores_a_wrong_object_or_wedges_the_pull() {
    let x = testfs!(Xfs);
    let (m, mbytes, o, data) = one_file_store(x.path(), RESUME_MIN as usize + (1 << 20));
    let size = data.len() as u64;
    let have = 2usize << 20;
    let lies = [
        RangeLie::Honest,
        RangeLie::WholeAs206,
        RangeLie::OtherStart,
        RangeLie::NoContentRange,
        RangeLie::GarbledContentRange,
        RangeLie::WrongBytes,
        RangeLie::Shorter,
        RangeLie::Longer,
        RangeLie::OtherTotal,
        RangeLie::OtherBody200,
    ];
    for lie in lies {
        let body = data.clone();
        let h = serving(m, mbytes.clone(), o, move |r| range_answer(lie, &body, r));
        let (st, partial) = store_with_partial_path(x.path(), &format!("{lie:?}"), &o);
        fs::write(&partial, &data[..have]).unwrap();
        let r = remote_at(&h.endpoint(), quick(2000, 1000));
        // Whatever the server claims, the object stored is the right one,
        // and a pull against the same server gets it at the latest on its
        // second try: a server whose range answers cannot be used costs a
        // whole download, never a partial that fails every pull after.
        let mut errors = Vec::new();
        for _ in 0..2 {
            match st.pull(&r, &[m]) {
                Ok(_) => break,
                Err(e) => {
                    assert!(!st.contains(&o), "{lie:?}: {e}");
                    errors.push(e.to_string());
                }
            }
        }
        assert!(
            st.contains(&o),
            "{lie:?}: two pulls failed, the partial kept at {} bytes: {errors:?}",
            fs::metadata(&partial).map_or(0, |m| m.len())
        );
        assert_eq!(fs::read(st.object_path(&o)).unwrap(), data, "{lie:?}");
        assert!(st.verify().unwrap().is_clean(), "{lie:?}");
        assert!(!partial.exists(), "{lie:?}");
        assert!(size > have as u64);
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_full_disk_mid_pull_leaves_a_clean_store_and_the_next_pull_finishes() {
    let x = testfs!(Xfs);
    for tiny in [cowlink_testfs::Fs::TinyExt4, cowlink_testfs::Fs::TinyXfs] {
        let t = tiny.dir("full-disk-pull");
        full_disk_pull(t.path(), x.path());
    }
}

/// The cases of [`a_full_disk_mid_pull_leaves_a_clean_store_and_the_next_pull_finishes`]
/// on the small filesystem `t`.
fn full_disk_pull(t: &Path, x: &Path) {
    let (m, mbytes, o, data) = one_file_store(x, RESUME_MIN as usize + (4 << 20));
    let body = data.clone();
    let h = serving(m, mbytes, o, move |r| {
        range_answer(RangeLie::Honest, &body, r)
    });
    let free = || {
        let v = rustix::fs::statvfs(t).unwrap();
        v.f_bavail * v.f_frsize
    };
    // (free bytes left for the object, the partial an earlier pull left;
    // root may use the blocks ext4 reserves, about 1.3 MiB more)
    let cases = [
        (1u64 << 20, 0usize),
        (6 << 20, 0),
        (6 << 20, 3 << 20),
        (1 << 20, 8 << 20),
    ];
    for (i, (room, prefix)) in cases.into_iter().enumerate() {
        let name = format!("s{i}");
        let (st, partial) = store_with_partial_path(t, &name, &o);
        if prefix > 0 {
            fs::write(&partial, &data[..prefix]).unwrap();
        }
        let filler = t.join("filler");
        let take = free().saturating_sub(room);
        let ok = std::process::Command::new("fallocate")
            .args(["-l", &take.to_string()])
            .arg(&filler)
            .status()
            .unwrap();
        assert!(ok.success());
        let r = remote_at(&h.endpoint(), quick(2000, 1000));
        let e = st.pull(&r, &[m]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpace, "case {i}: {e}");
        assert!(!st.contains(&o), "case {i}");
        // Nothing but the partial, and only a prefix of the object.
        for ent in fs::read_dir(t.join(&name).join("tmp")).unwrap() {
            let p = ent.unwrap().path();
            assert_eq!(p, partial, "case {i}: a temporary was left");
            let kept = fs::read(&p).unwrap();
            assert_eq!(kept[..], data[..kept.len()], "case {i}");
        }
        fs::remove_file(&filler).unwrap();
        let rep = st.pull(&r, &[m]).unwrap();
        assert_eq!(rep.objects_downloaded, 1, "case {i}");
        assert_eq!(fs::read(st.object_path(&o)).unwrap(), data, "case {i}");
        assert!(st.verify().unwrap().is_clean(), "case {i}");
        assert_eq!(
            fs::read_dir(t.join(&name).join("tmp")).unwrap().count(),
            0,
            "case {i}"
        );
        // Free the room for the next case.
        drop(st);
        fs::remove_dir_all(t.join(&name)).unwrap();
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_partial_resumes_the_same_on_btrfs_ext4_xfs_and_tmpfs() {
    use cowlink_testfs::Fs;
    let x = testfs!(Xfs);
    let (m, mbytes, o, data) = one_file_store(x.path(), RESUME_MIN as usize + (3 << 20));
    let body = data.clone();
    let h = serving(m, mbytes, o, move |r| {
        range_answer(RangeLie::Honest, &body, r)
    });
    let size = data.len() as u64;
    for fs_ in [Fs::Btrfs, Fs::Ext4, Fs::Xfs, Fs::Tmpfs] {
        let t = fs_.dir(&format!("resume-{fs_:?}"));
        // A right prefix, one off by a byte, and the whole object.
        for (name, have, flip) in [
            ("prefix", 5usize << 20, false),
            ("bad", 5 << 20, true),
            ("whole", data.len(), false),
        ] {
            let (st, partial) = store_with_partial_path(t.path(), name, &o);
            let mut p = data[..have].to_vec();
            if flip {
                p[have / 2] ^= 1;
            }
            fs::write(&partial, &p).unwrap();
            let rep = st
                .pull(&remote_at(&h.endpoint(), quick(2000, 1000)), &[m])
                .unwrap_or_else(|e| panic!("{fs_:?} {name}: {e}"));
            let resumed = if flip { 0 } else { have as u64 };
            assert_eq!(rep.bytes_resumed, resumed, "{fs_:?} {name}");
            assert_eq!(rep.objects_downloaded, 1, "{fs_:?} {name}");
            assert_eq!(
                fs::read(st.object_path(&o)).unwrap(),
                data,
                "{fs_:?} {name}"
            );
            let meta = fs::metadata(st.object_path(&o)).unwrap();
            assert!(meta.permissions().readonly(), "{fs_:?} {name}");
            assert_eq!(meta.len(), size);
            assert!(st.verify().unwrap().is_clean(), "{fs_:?} {name}");
            assert_eq!(
                fs::read_dir(t.path().join(name).join("tmp"))
                    .unwrap()
                    .count(),
                0,
                "{fs_:?} {name}"
            );
        }
    }
}

#[test]
#[ignore = "needs the loop-mounted test filesystems and the S3 test servers: run scripts/test"]
fn a_partial_swapped_under_a_pull_never_reaches_outside_or_stores_wrong_bytes() {
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let x = testfs!(Xfs);
    let (m, mbytes, o, data) = one_file_store(x.path(), RESUME_MIN as usize + (2 << 20));
    let body = data.clone();
    let h = serving(m, mbytes, o, move |r| {
        range_answer(RangeLie::Honest, &body, r)
    });
    let outside = x.path().join("outside");
    fs::write(&outside, &data[..1 << 20]).unwrap();
    let before = fs::metadata(&outside).unwrap();
    let mut stored = 0;
    for round in 0..8 {
        let name = format!("r{round}");
        let (st, partial) = store_with_partial_path(x.path(), &name, &o);
        let tmp = partial.parent().unwrap().to_path_buf();
        let stop = AtomicBool::new(false);
        let res = std::thread::scope(|s| {
            // Plants, at the partial's name and over and over, a link to
            // the outside file, a hard link to it, a FIFO, a wrong prefix
            // and a right one, each swapped in by an atomic rename.
            s.spawn(|| {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let c = tmp.join(format!("cand{i}"));
                    match (i + round) % 5 {
                        0 => std::os::unix::fs::symlink(&outside, &c).unwrap(),
                        1 => fs::hard_link(&outside, &c).unwrap(),
                        2 => {
                            rustix::fs::mknodat(
                                rustix::fs::CWD,
                                &c,
                                rustix::fs::FileType::Fifo,
                                rustix::fs::Mode::from_raw_mode(0o600),
                                0,
                            )
                            .unwrap();
                        }
                        3 => fs::write(&c, vec![0x77u8; 1 << 20]).unwrap(),
                        _ => fs::write(&c, &data[..1 << 20]).unwrap(),
                    }
                    let _ = fs::rename(&c, &partial);
                    i += 1;
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
            let r = remote_at(&h.endpoint(), quick(2000, 1000));
            let (st, rep) = pull_bounded(st, r, m);
            stop.store(true, Ordering::Relaxed);
            (st, rep)
        });
        let (st, rep) = res;
        // Whatever was at the name, and even when it was swapped after
        // the pull locked and verified its file, the object is stored.
        match rep {
            Ok(_) => {
                stored += 1;
                assert_eq!(fs::read(st.object_path(&o)).unwrap(), data, "round {round}");
                assert_ne!(
                    fs::metadata(st.object_path(&o)).unwrap().ino(),
                    before.ino(),
                    "round {round}"
                );
            }
            Err(e) => panic!("round {round}: {e}"),
        }
        assert!(st.verify().unwrap().is_clean(), "round {round}");
    }
    let after = fs::metadata(&outside).unwrap();
    // (Its link count is not compared: the planter's last hard links
    // stay in the stores' tmp/.)
    assert_eq!(fs::read(&outside).unwrap(), &data[..1 << 20]);
    assert_eq!(
        (after.mtime(), after.mtime_nsec(), after.ino(), after.len()),
        (
            before.mtime(),
            before.mtime_nsec(),
            before.ino(),
            before.len()
        )
    );
    assert_eq!(stored, 8);
}
