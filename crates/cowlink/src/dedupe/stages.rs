//! The planning stages as functions over groups of candidates: each takes
//! what the last one left and narrows it, without touching a filesystem
//! (the walk, the layouts and the hashes are read by `plan`, which calls
//! these in order). Unit-tested on made-up candidates.

use std::collections::HashMap;
use std::path::PathBuf;

use super::Group;
use crate::extents::Extent;

/// A candidate file during planning.
#[derive(Debug, Clone, Default)]
pub(super) struct Cand {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Logical→physical runs when every extent is shared (else `None`).
    pub shared_runs: Option<Vec<Run>>,
    /// Bytes in extents not flagged shared.
    pub exclusive: u64,
    /// The data is inline in metadata (no extent to share).
    pub inline: bool,
    /// For files of at most two edges: the hash of all their bytes, taken
    /// while the file was open for its layout (one open per small file).
    pub small_hash: Option<[u8; 32]>,
    /// For larger files not sharing all their blocks: the hash of their
    /// two edges, taken while the file was open for its layout. Such a file
    /// is a cluster of its own in a group of two or more, so its edges are
    /// needed whatever the others hold.
    pub edge_hash: Option<[u8; 32]>,
    /// The layout was read (during the walk, for small files).
    pub mapped: bool,
    /// The caller may make this file share another's blocks (root, its
    /// owner, or write permission); otherwise it can only be a source.
    pub may_change: bool,
}

/// A contiguous logical → physical run of a file's extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Run {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
}

/// Fill `shared_runs`, `exclusive` and `inline` from a file's extents.
pub(super) fn layout_facts(list: &[Extent], c: &mut Cand) {
    let mut runs: Vec<Run> = Vec::new();
    let mut all_shared = !list.is_empty();
    c.inline = list.iter().any(Extent::is_inline);
    for x in list {
        if !x.is_shared() || !x.has_address() || x.is_unwritten() {
            all_shared = false;
            c.exclusive += x.length;
        }
        match runs.last_mut() {
            Some(r) if r.logical + r.length == x.logical && r.physical + r.length == x.physical => {
                r.length += x.length
            }
            _ => runs.push(Run {
                logical: x.logical,
                physical: x.physical,
                length: x.length,
            }),
        }
    }
    c.shared_runs = all_shared.then_some(runs);
}

/// One inode is one file: keep the name that sorts first. Returns the
/// files left and how many names were dropped.
pub(super) fn one_per_inode(mut files: Vec<Cand>) -> (Vec<Cand>, u64) {
    files.sort_by(|a, b| (a.dev, a.ino, &a.path).cmp(&(b.dev, b.ino, &b.path)));
    let before = files.len();
    files.dedup_by(|b, a| (a.dev, a.ino) == (b.dev, b.ino));
    let dropped = (before - files.len()) as u64;
    (files, dropped)
}

/// Groups of two or more files on the same device with the same size,
/// each in inode order.
///
/// Grouped in place: sorted by device, size and inode (no scratch
/// buffer), then each group split off the end into a vector of its own
/// length while the list left shrinks as it empties. Moving every
/// candidate into a map of growing vectors held the list twice while
/// grouping (a few MB of a plan's peak over 223,547 real files on XFS:
/// docs/benchmarks.md, "Peak memory").
pub(super) fn by_size(mut files: Vec<Cand>) -> Vec<Vec<Cand>> {
    files.sort_unstable_by_key(|c| (c.dev, c.size, c.ino));
    let mut groups = Vec::new();
    while let Some(last) = files.last() {
        let key = (last.dev, last.size);
        let start = files.partition_point(|c| (c.dev, c.size) < key);
        if files.len() - start > 1 {
            groups.push(files.split_off(start));
        } else {
            files.truncate(start);
        }
        if files.capacity() > 2 * files.len() + 1024 {
            files.shrink_to_fit();
        }
    }
    groups
}

/// Take out files whose data is inline (no blocks to share), then groups
/// left with fewer than two. Returns how many files were taken out.
pub(super) fn drop_inline(groups: &mut Vec<Vec<Cand>>) -> u64 {
    let mut dropped = 0;
    for g in groups.iter_mut() {
        let before = g.len();
        g.retain(|c| !c.inline);
        dropped += (before - g.len()) as u64;
    }
    groups.retain(|g| g.len() > 1);
    dropped
}

/// A file the walk found inline (Btrfs): nothing to share, so no name is
/// kept, only what its count needs. Most small files on Btrfs are inline
/// (96,402 of 143,835 in three copies of a /usr/share); a [`Cand`] with
/// its path for each was most of the plan's memory, and on a virtual
/// machine each fresh page of it a fault costing some microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Inline {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

/// How [`count_inline`] counted the inline files set aside.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct InlineCount {
    /// Inodes (one per file, whatever its names).
    pub inodes: u64,
    /// Inodes with a partner of the same device and size: the files
    /// [`drop_inline`] would have taken out of a size group.
    pub partnered: u64,
    /// Names beyond the first of an inode.
    pub hardlinks: u64,
}

/// Count the inline files set aside by the walk as the candidates are
/// counted: one per inode, and, as [`drop_inline`] counts, only those with
/// a partner of the same device and size, inline or not, in `files`.
pub(super) fn count_inline(mut inline: Vec<Inline>, files: &[Cand]) -> InlineCount {
    inline.sort_unstable();
    let before = inline.len();
    inline.dedup_by_key(|i| (i.dev, i.ino));
    let hardlinks = (before - inline.len()) as u64;
    let mut same: HashMap<(u64, u64), u64> = HashMap::new();
    for i in &inline {
        *same.entry((i.dev, i.size)).or_default() += 1;
    }
    let mut partners = same.clone();
    for c in files {
        if let Some(n) = partners.get_mut(&(c.dev, c.size)) {
            *n += 1;
        }
    }
    InlineCount {
        inodes: inline.len() as u64,
        partnered: same
            .iter()
            .filter(|(key, _)| partners[key] > 1)
            .map(|(_, &n)| n)
            .sum(),
        hardlinks,
    }
}

/// Size groups split into clusters: files whose every block is shared, on
/// the same runs, hold the same bytes by construction and are read once.
#[derive(Debug, Default)]
pub(super) struct Clusters {
    /// Each cluster's members, sorted by path (the first is the one read).
    pub clusters: Vec<Vec<Cand>>,
    /// Per size group with more than one cluster: its cluster ids.
    pub groups: Vec<Vec<usize>>,
    /// Size groups that were one cluster (nothing to do).
    pub groups_already_shared: u64,
    /// Files in those groups beyond the first of each.
    pub files_already_shared: u64,
}

/// Split each size group into [`Clusters`].
pub(super) fn clusters(size_groups: Vec<Vec<Cand>>) -> Clusters {
    let mut out = Clusters::default();
    for g in size_groups {
        let first = out.clusters.len();
        let mut ids = Vec::new();
        let mut by_runs: HashMap<Vec<Run>, usize> = HashMap::new();
        for c in g {
            let known = c.shared_runs.as_ref().and_then(|r| by_runs.get(r)).copied();
            match known {
                Some(id) => out.clusters[id].push(c),
                None => {
                    if let Some(runs) = &c.shared_runs {
                        by_runs.insert(runs.clone(), out.clusters.len());
                    }
                    ids.push(out.clusters.len());
                    out.clusters.push(vec![c]);
                }
            }
        }
        for cl in &mut out.clusters[first..] {
            cl.sort_by(|a, b| a.path.cmp(&b.path));
        }
        if ids.len() == 1 {
            out.groups_already_shared += 1;
            out.files_already_shared += out.clusters[ids[0]].len() as u64 - 1;
            continue;
        }
        out.groups.push(ids);
    }
    out
}

/// Within each group of cluster ids, the sets of two or more that have
/// the same hash (ids without a hash are left out: reading them failed).
pub(super) fn split_by(
    groups: &[Vec<usize>],
    hashes: &HashMap<usize, [u8; 32]>,
) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for ids in groups {
        let mut by: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        for &id in ids {
            if let Some(h) = hashes.get(&id) {
                by.entry(*h).or_default().push(id);
            }
        }
        out.extend(by.into_values().filter(|v| v.len() > 1));
    }
    out
}

/// The plan's groups from clusters with equal full hashes. The source is
/// the first path of a cluster holding files the caller may not change
/// (they can only be a source), else of the largest cluster (fewest files
/// change); targets are the files of the other clusters the caller may
/// change. Returns the groups, largest reclaimable first (ties by source
/// path), how many files were already shared with their source, and how
/// many duplicates were left alone because the caller may not change them.
///
/// The groups take their paths out of `clusters` (each cluster is in one
/// group at most): read anything else of a cluster's paths before.
pub(super) fn groups(
    clusters: &mut [Vec<Cand>],
    cluster_groups: &[Vec<usize>],
    full: &HashMap<usize, [u8; 32]>,
) -> (Vec<Group>, u64, u64) {
    let mut out = Vec::new();
    let (mut already, mut not_permitted) = (0, 0);
    for mut members in split_by(cluster_groups, full) {
        let hash = full[&members[0]];
        {
            let clusters = &*clusters;
            let fixed = |id: usize| clusters[id].iter().filter(|c| !c.may_change).count();
            members.sort_by(|&a, &b| {
                fixed(b)
                    .cmp(&fixed(a))
                    .then(clusters[b].len().cmp(&clusters[a].len()))
                    .then(clusters[a][0].path.cmp(&clusters[b][0].path))
            });
        }
        // The paths move from the clusters into the group (a cluster is in
        // one group at most): no second copy of every name.
        let mut targets: Vec<(PathBuf, u64)> = Vec::new();
        for &m in &members[1..] {
            for c in clusters[m].iter_mut() {
                match c.may_change {
                    true => targets.push((std::mem::take(&mut c.path), c.exclusive)),
                    false => not_permitted += 1,
                }
            }
        }
        let src = &mut clusters[members[0]];
        already += src.len() as u64 - 1;
        if targets.is_empty() {
            continue;
        }
        targets.sort_by(|a, b| a.0.cmp(&b.0));
        out.push(Group {
            size: src[0].size,
            blake3: Some(crate::ground::hash::hex(&hash)),
            source: std::mem::take(&mut src[0].path),
            reclaimable: targets.iter().map(|t| t.1).sum(),
            targets: targets.into_iter().map(|t| t.0).collect(),
            already_shared: src[1..]
                .iter_mut()
                .map(|c| std::mem::take(&mut c.path))
                .collect(),
        });
    }
    order(&mut out);
    (out, already, not_permitted)
}

/// The plan's order: largest reclaimable first, ties by source path.
pub(super) fn order(groups: &mut [Group]) {
    // Sources are distinct (a file is in one group at most), so the order
    // is total and an unstable sort, which needs no scratch copy, gives it.
    groups.sort_unstable_by(|a, b| {
        b.reclaimable
            .cmp(&a.reclaimable)
            .then(a.source.cmp(&b.source))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(path: &str, dev: u64, ino: u64, size: u64) -> Cand {
        Cand {
            path: path.into(),
            dev,
            ino,
            size,
            exclusive: size,
            may_change: true,
            ..Cand::default()
        }
    }

    fn shared(mut c: Cand, physical: u64) -> Cand {
        c.shared_runs = Some(vec![Run {
            logical: 0,
            physical,
            length: c.size,
        }]);
        c.exclusive = 0;
        c
    }

    #[test]
    fn layout_facts_merge_contiguous_runs_and_count_exclusive_bytes() {
        use cowlink_sys::FIEMAP_EXTENT_SHARED as SHARED;
        let mut c = cand("a", 1, 1, 8192);
        c.exclusive = 0;
        layout_facts(
            &[
                Extent::new(0, 4096, 4096, SHARED),
                Extent::new(4096, 8192, 4096, SHARED),
            ],
            &mut c,
        );
        assert_eq!(
            c.shared_runs,
            Some(vec![Run {
                logical: 0,
                physical: 4096,
                length: 8192
            }])
        );
        assert_eq!(c.exclusive, 0);

        let mut d = cand("b", 1, 2, 8192);
        d.exclusive = 0;
        layout_facts(
            &[
                Extent::new(0, 4096, 4096, SHARED),
                Extent::new(4096, 99 << 12, 4096, 0),
            ],
            &mut d,
        );
        assert_eq!(d.shared_runs, None, "not every block is shared");
        assert_eq!(d.exclusive, 4096);
    }

    #[test]
    fn hard_links_count_once_under_the_first_name() {
        let (files, dropped) = one_per_inode(vec![
            cand("z", 1, 7, 10),
            cand("a", 1, 7, 10),
            cand("m", 2, 7, 10), // same inode number, other device
        ]);
        assert_eq!(dropped, 1);
        let names: Vec<_> = files.iter().map(|c| c.path.to_str().unwrap()).collect();
        assert_eq!(names, ["a", "m"]);
    }

    #[test]
    fn size_groups_are_per_device_and_need_two() {
        let mut g = by_size(vec![
            cand("a", 1, 1, 10),
            cand("b", 1, 2, 10),
            cand("c", 2, 3, 10),
            cand("d", 1, 4, 11),
        ]);
        assert_eq!(g.len(), 1);
        g[0].sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(g[0][0].path, PathBuf::from("a"));
        assert_eq!(g[0][1].path, PathBuf::from("b"));
    }

    #[test]
    fn size_groups_hold_every_partnered_file_once_in_inode_order() {
        // Many sizes, singles among them, two devices, unsorted input:
        // enough files for the list to shrink while groups are split off.
        let mut files = Vec::new();
        for i in 0..5000u64 {
            let size = if i % 7 == 0 { 100_000 + i } else { i % 300 };
            let dev = 1 + i % 2;
            files.push(cand(&format!("f{i}"), dev, 10_000 - i, size));
        }
        let mut want: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
        for c in &files {
            want.entry((c.dev, c.size)).or_default().push(c.ino);
        }
        want.retain(|_, inos| inos.len() > 1);
        for inos in want.values_mut() {
            inos.sort_unstable();
        }
        let got: HashMap<(u64, u64), Vec<u64>> = by_size(files)
            .into_iter()
            .map(|g| ((g[0].dev, g[0].size), g.iter().map(|c| c.ino).collect()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn inline_files_are_counted_out_and_lone_files_dropped() {
        let mut i = cand("i", 1, 3, 10);
        i.inline = true;
        let mut groups = vec![
            vec![cand("a", 1, 1, 10), i],
            vec![cand("b", 1, 4, 20), cand("c", 1, 5, 20)],
        ];
        assert_eq!(drop_inline(&mut groups), 1);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0][0].path, PathBuf::from("b"));
    }

    #[test]
    fn inline_files_set_aside_count_once_and_only_with_a_partner() {
        let i = |dev, ino, size| Inline { dev, ino, size };
        let count = count_inline(
            vec![
                i(1, 7, 10), // partner: file a
                i(1, 8, 30), // partner: inode 9
                i(1, 9, 30),
                i(1, 9, 30),  // a second name of inode 9
                i(1, 10, 40), // alone
                i(2, 11, 10), // other device: alone
            ],
            &[cand("a", 1, 1, 10), cand("b", 1, 2, 20)],
        );
        assert_eq!(
            count,
            InlineCount {
                inodes: 5,
                partnered: 3,
                hardlinks: 1
            }
        );
    }

    #[test]
    fn files_on_the_same_shared_blocks_are_one_cluster() {
        // a and b share every block (same runs); c is separate; d and e
        // share with each other in a group of their own: nothing to do.
        let c = clusters(vec![
            vec![
                shared(cand("b", 1, 2, 10), 100),
                cand("c", 1, 3, 10),
                shared(cand("a", 1, 1, 10), 100),
            ],
            vec![
                shared(cand("e", 1, 5, 20), 200),
                shared(cand("d", 1, 4, 20), 200),
            ],
        ]);
        assert_eq!(c.groups.len(), 1);
        assert_eq!(c.groups[0].len(), 2);
        let first = &c.clusters[c.groups[0][0]];
        let paths: Vec<_> = first.iter().map(|f| f.path.to_str().unwrap()).collect();
        assert_eq!(paths, ["a", "b"], "members sorted by path");
        assert_eq!((c.groups_already_shared, c.files_already_shared), (1, 1));
    }

    #[test]
    fn hashes_split_groups_and_the_largest_cluster_is_the_source() {
        let mut c = clusters(vec![vec![
            shared(cand("x2", 1, 2, 10), 100),
            cand("y", 1, 3, 10),
            shared(cand("x1", 1, 1, 10), 100),
            cand("z", 1, 4, 10),
            cand("other", 1, 5, 10),
        ]]);
        let ids = &c.groups[0];
        let id_of = |p: &str| {
            *ids.iter()
                .find(|&&i| c.clusters[i][0].path == std::path::Path::new(p))
                .unwrap()
        };
        // x-cluster, y and z hash equal; "other" differs; nothing for a
        // cluster whose read failed (no hash).
        let mut full = HashMap::new();
        for p in ["x1", "y", "z"] {
            full.insert(id_of(p), [1u8; 32]);
        }
        full.insert(id_of("other"), [2u8; 32]);
        let split = split_by(&c.groups, &full);
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].len(), 3);

        let (groups, already, _) = groups(&mut c.clusters, &c.groups, &full);
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        assert_eq!(g.source, PathBuf::from("x1"), "largest cluster, first path");
        assert_eq!(g.already_shared, [PathBuf::from("x2")]);
        assert_eq!(g.targets, [PathBuf::from("y"), PathBuf::from("z")]);
        assert_eq!(g.reclaimable, 20, "the targets' exclusive bytes");
        assert_eq!(already, 1);
    }

    #[test]
    fn groups_come_largest_first_then_by_source() {
        let mut full = HashMap::new();
        let mut c = clusters(vec![
            vec![cand("s1", 1, 1, 10), cand("t1", 1, 2, 10)],
            vec![cand("s2", 1, 3, 50), cand("t2", 1, 4, 50)],
            vec![cand("a3", 1, 5, 10), cand("b3", 1, 6, 10)],
        ]);
        for (n, ids) in c.groups.iter().enumerate() {
            for &id in ids {
                full.insert(id, [n as u8; 32]);
            }
        }
        let (g, _, _) = groups(&mut c.clusters, &c.groups, &full);
        let src: Vec<_> = g.iter().map(|g| g.source.to_str().unwrap()).collect();
        assert_eq!(src, ["s2", "a3", "s1"]);
    }

    #[test]
    fn files_the_caller_may_not_change_are_sources_never_targets() {
        // root's r1 and r2 (not ours), our own m: m is the one to change,
        // sharing r1's blocks; r2 stays as it is and is counted.
        let mut r1 = cand("r1", 1, 1, 10);
        r1.may_change = false;
        let mut r2 = cand("r2", 1, 2, 10);
        r2.may_change = false;
        let mut c = clusters(vec![vec![cand("m", 1, 3, 10), r2, r1]]);
        let full: HashMap<usize, [u8; 32]> = c.groups[0].iter().map(|&i| (i, [7u8; 32])).collect();
        let (g, _, not_permitted) = groups(&mut c.clusters, &c.groups, &full);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].source, PathBuf::from("r1"));
        assert_eq!(g[0].targets, [PathBuf::from("m")]);
        assert_eq!(not_permitted, 1);

        // Nothing of ours among them: no group at all.
        let mut a = cand("a", 1, 4, 10);
        a.may_change = false;
        let mut b = cand("b", 1, 5, 10);
        b.may_change = false;
        let mut c = clusters(vec![vec![a, b]]);
        let full: HashMap<usize, [u8; 32]> = c.groups[0].iter().map(|&i| (i, [7u8; 32])).collect();
        let (g, _, not_permitted) = groups(&mut c.clusters, &c.groups, &full);
        assert!(g.is_empty());
        assert_eq!(not_permitted, 1);
    }
}
