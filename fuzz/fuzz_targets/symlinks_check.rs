// The symbolic-link resolver, differentially: a small tree of
// directories, files and links decoded from the input is judged by
// `Manifest::link_verdicts` (each link resolved once, memoized, in the
// manifest's tree) and by the kernel's way written out plainly here (a
// stack of components, each link's target spliced in where it is named,
// at most 40 links). Whether a link is refused may never differ. Shared
// by the cargo-fuzz target `symlinks` and the stable corpus replay.

use std::collections::{HashMap, VecDeque};

use cowlink::store::{EntryKind, LinkVerdict, Manifest, ManifestEntry, MAX_LINKS};

const NAMES: [&str; 4] = ["a", "b", "c", "s"];
const PARTS: [&str; 8] = ["a", "b", "c", "s", ".", "..", "..", ""];

/// Up to 16 entries: per entry a byte for the depth and kind, a byte for
/// the names (2 bits each), and for a link a length byte and one byte per
/// target component.
pub fn decode(data: &[u8]) -> Manifest {
    let mut it = data.iter().copied();
    let mut entries = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while entries.len() < 16 {
        let (Some(head), Some(names)) = (it.next(), it.next()) else {
            break;
        };
        let depth = (head & 3) as usize + 1;
        let path: Vec<&str> = (0..depth)
            .map(|i| NAMES[((names >> (2 * i)) & 3) as usize])
            .collect();
        let path = path.join("/");
        let kind = match (head >> 2) & 3 {
            0 => EntryKind::Dir { mode: 0o755 },
            1 => EntryKind::File {
                digest: cowlink::store::Digest::of(b""),
                size: 0,
                mode: 0o644,
            },
            _ => {
                let n = it.next().unwrap_or(1) as usize % 12 + 1;
                let t: Vec<&str> = (0..n)
                    .map(|_| PARTS[(it.next().unwrap_or(0) & 7) as usize])
                    .collect();
                let mut t = t.join("/");
                if head & 0x80 != 0 {
                    t.insert(0, '/');
                }
                if t.is_empty() {
                    t.push('.');
                }
                EntryKind::Symlink { target: t }
            }
        };
        if seen.insert(path.clone()) {
            entries.push(ManifestEntry { path, kind });
        }
    }
    Manifest::new(entries)
}

/// The kernel's way, plainly.
pub fn naive(m: &Manifest, link: &str) -> LinkVerdict {
    let kinds: HashMap<&str, &EntryKind> = m
        .entries
        .iter()
        .map(|e| (e.path.as_str(), &e.kind))
        .collect();
    let target = |p: &str| match kinds.get(p) {
        Some(EntryKind::Symlink { target }) => Some(target.clone()),
        _ => None,
    };
    let mut cur: Vec<String> = link.split('/').map(String::from).collect();
    cur.pop();
    let first = target(link).expect("a link");
    if first.starts_with('/') {
        return LinkVerdict::Outside;
    }
    let mut todo: VecDeque<String> = first.split('/').map(String::from).collect();
    let mut followed = 1;
    while let Some(c) = todo.pop_front() {
        match c.as_str() {
            "" | "." => {}
            ".." => {
                if cur.pop().is_none() {
                    return LinkVerdict::Outside;
                }
            }
            name => {
                let mut p = cur.join("/");
                if !p.is_empty() {
                    p.push('/');
                }
                p.push_str(name);
                match target(&p) {
                    Some(t) => {
                        followed += 1;
                        if followed > MAX_LINKS {
                            return LinkVerdict::TooManyLinks;
                        }
                        if t.starts_with('/') {
                            return LinkVerdict::Outside;
                        }
                        for c in t.split('/').rev() {
                            todo.push_front(c.to_string());
                        }
                    }
                    None => cur.push(name.to_string()),
                }
            }
        }
    }
    LinkVerdict::Inside
}

/// Run the comparison on one input.
pub fn check(data: &[u8]) {
    let m = decode(data);
    let Ok(verdicts) = m.link_verdicts("fuzz") else {
        return;
    };
    for (path, v) in verdicts {
        let n = naive(&m, path);
        assert_eq!(
            v == LinkVerdict::Inside,
            n == LinkVerdict::Inside,
            "{path}: {v:?} vs {n:?} in {:?}",
            m.entries
        );
    }
}
