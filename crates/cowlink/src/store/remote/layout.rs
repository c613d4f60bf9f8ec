//! The remote's key layout, and the one test of whether a key is
//! cowlink's: [`classify`]. Every step that deletes, aborts, counts as
//! present or trusts a key of the remote (gc, push's presence check, the
//! listing of manifests) asks it first; a key it does not recognise is
//! left alone and never stands in for one it would.
//!
//! ```text
//! PREFIX/objects/ab/<64 hex>        ab = the digest's first two digits
//! PREFIX/manifests/<64 hex>
//! PREFIX/pending/<64 hex>.<ID>      ID: 1–255 of [A-Za-z0-9_-]
//! PREFIX/locks/gc.<ID>
//! ```
//!
//! Hex digits are lower case. Nothing else matches: no suffix
//! (`.partial`, `.meta`), no extra or missing directory level, no other
//! fan-out directory, no upper case.

use crate::store::manifest::Digest;

/// A key of cowlink's layout, below the remote's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `objects/ab/<hex>`.
    Object(Digest),
    /// `manifests/<hex>`.
    Manifest(Digest),
    /// `pending/<hex>.<id>`: a push of the manifest in progress.
    Pending(Digest, String),
    /// `locks/gc.<id>`: a gc in progress.
    Lock(String),
}

/// Longest id of a marker or lock.
const ID_MAX: usize = 255;

/// Whether `s` is an id of a marker or a lock (what [`marker_id`](super::marker_id) makes).
pub(crate) fn is_id(s: &str) -> bool {
    (1..=ID_MAX).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `s` made into an id: every other character becomes `-`, cut to the
/// longest id (at a character boundary, since all are ASCII then).
pub(crate) fn to_id(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    out.truncate(ID_MAX);
    if out.is_empty() {
        out.push('-');
    }
    out
}

/// The prefix as the server spells it: what the S3 client makes of
/// `prefix` when it builds a key (each part percent-encoded where it holds
/// a character such as `~` or `%`). Listed keys are judged against this,
/// never against the prefix as the user typed it.
pub(crate) fn server_prefix(prefix: &str) -> String {
    object_store::path::Path::from(prefix).as_ref().to_string()
}

/// The client's key for `raw`, a key the server listed that [`classify`]
/// recognised: exactly `raw`, never re-encoded (`None` if the client
/// cannot spell it so).
pub(crate) fn exact_key(raw: &str) -> Option<object_store::path::Path> {
    object_store::path::Path::parse(raw)
        .ok()
        .filter(|k| k.as_ref() == raw)
}

/// A digest spelled exactly as cowlink spells it (64 lower-case hex).
fn digest(s: &str) -> Option<Digest> {
    s.parse().ok()
}

/// What `key` is in the layout under `prefix` (`""` or `a/b`, no slash
/// at either end), or `None` when it is not exactly a key cowlink writes.
pub(crate) fn classify(prefix: &str, key: &str) -> Option<Layout> {
    let rel = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('/')?
    };
    let mut parts = rel.split('/');
    let area = parts.next()?;
    let a = parts.next()?;
    let b = parts.next();
    if parts.next().is_some() {
        return None;
    }
    match (area, b) {
        ("objects", Some(name)) => {
            let d = digest(name)?;
            (name.get(..2) == Some(a)).then_some(Layout::Object(d))
        }
        ("manifests", None) => digest(a).map(Layout::Manifest),
        ("pending", None) => {
            let (hex, id) = a.split_once('.')?;
            (is_id(id)).then_some(Layout::Pending(digest(hex)?, id.to_string()))
        }
        ("locks", None) => {
            let id = a.strip_prefix("gc.")?;
            is_id(id).then(|| Layout::Lock(id.to_string()))
        }
        _ => None,
    }
}

/// The relative name of `key` directly in `area` under `prefix`.
fn name_in<'k>(prefix: &str, area: &str, key: &'k str) -> Option<&'k str> {
    let rel = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('/')?
    };
    let name = rel.strip_prefix(area)?.strip_prefix('/')?;
    (!name.contains('/')).then_some(name)
}

/// The manifest a pending marker of *another spelling* names:
/// `pending/<64 hex>.<anything>`, such as one an older version wrote with
/// an id outside today's alphabet. gc never deletes such a key, but lets a
/// young one whose body is that manifest protect its objects: on this
/// side, leniency only keeps more.
pub(crate) fn loose_marker(prefix: &str, key: &str) -> Option<Digest> {
    let (hex, rest) = name_in(prefix, "pending", key)?.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    digest(hex)
}

/// Whether a push must take `key` for a gc's lock: any `locks/gc.…`.
/// A push only waits for a lock, so it is lenient: a lock an older
/// version spelled differently still makes it wait.
pub(crate) fn loose_lock(prefix: &str, key: &str) -> bool {
    name_in(prefix, "locks", key).is_some_and(|n| n.starts_with("gc."))
}

/// The key of `l` under `prefix`: the inverse of [`classify`].
pub(crate) fn key_of(prefix: &str, l: &Layout) -> String {
    let rel = match l {
        Layout::Object(d) => {
            let h = d.to_hex();
            format!("objects/{}/{h}", &h[..2])
        }
        Layout::Manifest(d) => format!("manifests/{}", d.to_hex()),
        Layout::Pending(d, id) => format!("pending/{}.{id}", d.to_hex()),
        Layout::Lock(id) => format!("locks/gc.{id}"),
    };
    if prefix.is_empty() {
        rel
    } else {
        format!("{prefix}/{rel}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(seed: u8) -> Digest {
        Digest::of(&[seed])
    }

    fn valid(seed: u8) -> Vec<Layout> {
        vec![
            Layout::Object(d(seed)),
            Layout::Manifest(d(seed)),
            Layout::Pending(d(seed), format!("host-{seed}-123_x")),
            Layout::Lock(format!("h{seed}-9")),
        ]
    }

    #[test]
    fn every_key_cowlink_writes_is_recognised() {
        for prefix in ["", "p", "a/b/c"] {
            for seed in 0..50 {
                for l in valid(seed) {
                    let k = key_of(prefix, &l);
                    assert_eq!(classify(prefix, &k), Some(l), "{k}");
                }
            }
        }
    }

    /// The reported near misses, spelled out.
    #[test]
    fn the_reported_near_misses_are_not_cowlinks() {
        let h = d(7).to_hex();
        let f = &h[..2];
        let wrong_fan = if f == "00" { "01" } else { "00" };
        let keys = [
            format!("p/objects/{f}/{f}/{h}"),
            format!("p/objects/{h}"),
            format!("p/objects/{f}/{h}.meta"),
            format!("p/objects/{f}/{h}.partial"),
            format!("p/objects/{wrong_fan}/{h}"),
            format!("p/objects/{}/{}", f.to_uppercase(), h.to_uppercase()),
            format!("p/objects/{f}/{}", &h[..63]),
            format!("p/objects/{f}/{h}0"),
            format!("p/objects/{f}/{h}/"),
            format!("p/objects//{h}"),
            format!("p/manifests/{h}.partial"),
            format!("p/manifests/{f}/{h}"),
            format!("p/pending/{h}"),
            format!("p/pending/{h}."),
            format!("p/pending/{h}.a.b"),
            format!("p/pending/{h}.a b"),
            format!("p/pending/{h}.{}", "x".repeat(256)),
            "p/locks/gc".to_string(),
            "p/locks/gc.".to_string(),
            "p/locks/other.id".to_string(),
            format!("q/objects/{f}/{h}"),
            format!("pp/objects/{f}/{h}"),
            format!("objects/{f}/{h}"),
            format!("p/p/objects/{f}/{h}"),
        ];
        for k in &keys {
            assert_eq!(classify("p", k), None, "{k}");
        }
    }

    /// Small deterministic generator (xorshift), so a failure replays.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// One random edit of `k`: a character inserted, removed, replaced,
    /// upper-cased, a segment doubled or dropped, a suffix added.
    fn mutate(k: &str, r: &mut Rng) -> String {
        const CHARS: &[u8] = b"0af9/._-Zx ";
        let mut b = k.as_bytes().to_vec();
        let i = r.below(b.len() + 1);
        match r.below(7) {
            0 => b.insert(i, CHARS[r.below(CHARS.len())]),
            1 if i < b.len() => {
                b.remove(i);
            }
            2 if i < b.len() => b[i] = CHARS[r.below(CHARS.len())],
            3 if i < b.len() => b[i] = b[i].to_ascii_uppercase(),
            4 => {
                let segs: Vec<&str> = k.split('/').collect();
                let j = r.below(segs.len());
                let mut s = segs.clone();
                s.insert(j, segs[j]);
                return s.join("/");
            }
            5 => {
                let segs: Vec<&str> = k.split('/').collect();
                let j = r.below(segs.len());
                let mut s = segs.clone();
                s.remove(j);
                return s.join("/");
            }
            _ => {
                let suffix = [".partial", ".meta", "/", "~", ".1"][r.below(5)];
                b.extend_from_slice(suffix.as_bytes());
            }
        }
        String::from_utf8(b).unwrap()
    }

    /// Generated near misses: every edit of a real key is either not
    /// cowlink's, or is exactly the key of what it is taken for (so no
    /// other spelling can ever stand in for a key of the layout).
    #[test]
    fn generated_near_misses_are_never_taken_for_another_key() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let mut rejected = 0;
        for round in 0..20_000 {
            let prefix = ["", "p", "a/b"][round % 3];
            let l = valid((round % 200) as u8).swap_remove(round % 4);
            let mut k = key_of(prefix, &l);
            for _ in 0..=r.below(3) {
                k = mutate(&k, &mut r);
            }
            match classify(prefix, &k) {
                None => rejected += 1,
                Some(got) => assert_eq!(key_of(prefix, &got), k, "{k} taken for {got:?}"),
            }
        }
        // The generator must mostly produce misses, or it tests nothing.
        assert!(rejected > 15_000, "only {rejected} near misses generated");
    }

    #[test]
    fn loose_markers_and_locks_are_recognised_only_in_place() {
        let h = d(3).to_hex();
        for prefix in ["", "p/q"] {
            let k =
                |rel: &str| key_of(prefix, &Layout::Lock("x".into())).replace("locks/gc.x", rel);
            assert_eq!(
                loose_marker(prefix, &k(&format!("pending/{h}.héllo wörld"))),
                Some(d(3))
            );
            assert_eq!(
                loose_marker(prefix, &k(&format!("pending/{h}.a.b"))),
                Some(d(3))
            );
            assert_eq!(loose_marker(prefix, &k(&format!("pending/{h}."))), None);
            assert_eq!(loose_marker(prefix, &k(&format!("pending/{h}"))), None);
            assert_eq!(loose_marker(prefix, &k(&format!("pending/x/{h}.id"))), None);
            assert_eq!(loose_marker(prefix, &k(&format!("objects/{h}.id"))), None);
            assert!(loose_lock(prefix, &k("locks/gc.old host.1")));
            assert!(!loose_lock(prefix, &k("locks/other")));
            assert!(!loose_lock(prefix, &k("locks/x/gc.1")));
        }
    }

    /// Keys are judged against the prefix as the client writes it, and a
    /// listed key is named only exactly as listed.
    #[test]
    fn encoded_prefixes_and_exact_keys() {
        for typed in ["team~1", "a/50%/b", "x{y}", "plain/p"] {
            let server = server_prefix(typed);
            let l = Layout::Object(d(9));
            let written = object_store::path::Path::from(key_of(typed, &l));
            assert_eq!(classify(&server, written.as_ref()), Some(l), "{typed}");
            assert_eq!(exact_key(written.as_ref()), Some(written.clone()));
        }
        assert_eq!(server_prefix(""), "");
        for raw in ["p/objects/ab/x/", "/p/x", "p//x", "p/./x", "p/a\u{1}"] {
            assert_eq!(exact_key(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn ids_are_made_safe() {
        assert!(is_id(&to_id("build host.example/1 2")));
        assert!(is_id(&to_id("")));
        assert!(is_id(&to_id(&"é".repeat(300))));
        assert_eq!(to_id("a.b c"), "a-b-c");
    }
}
