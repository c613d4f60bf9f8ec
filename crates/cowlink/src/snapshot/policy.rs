//! Which snapshots a prune keeps: pure code over names, times and states,
//! so every policy is tested without a filesystem.
//!
//! The rules are restic's `forget` rules (borg's `prune` counts the same
//! way, except that borg does not let a snapshot kept by one rule count for
//! the next):
//! - `keep_last N`: the N newest complete snapshots;
//! - `keep_daily N`: for each of the N newest UTC days that have a complete
//!   snapshot, the newest snapshot of that day;
//! - `keep_weekly N`: the same per ISO week (Monday to Sunday, UTC).
//!
//! Each rule looks at every complete snapshot on its own and the kept set
//! is their union, so one snapshot may satisfy several rules. Days and
//! weeks are UTC, as the names are, so a prune answers the same in every
//! time zone. A snapshot completed before the time its name says (named
//! past one a clock set ahead made) counts for the day it was completed.
//!
//! Whatever the rules say, the newest complete snapshot is kept (it is
//! the base of the next one), a snapshot in progress is kept (it is
//! resumed by the next run), and so is a snapshot an unfinished clone
//! still reads from. Only snapshots this tool recorded are candidates: a
//! directory the user put under the root never reaches this code.

use std::collections::BTreeSet;

use super::stamp::Stamp;
use super::State;

/// How many snapshots of each kind a prune keeps (see the module notes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeepPolicy {
    /// The newest N complete snapshots.
    pub last: u32,
    /// The newest snapshot of each of the newest N days that have one.
    pub daily: u32,
    /// The newest snapshot of each of the newest N ISO weeks that have one.
    pub weekly: u32,
}

/// Why a snapshot is kept, or that it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Kept by `keep_last`, `keep_daily` or `keep_weekly`.
    Policy,
    /// The newest complete snapshot: always kept.
    Newest,
    /// In progress, or still read by one in progress: always kept.
    InUse,
    /// Its directory is not the one this tool made (the user replaced
    /// it): never removed, and not counted by the rules.
    Replaced,
    /// Removed by the prune.
    Remove,
    /// Its removal was begun by an earlier prune and is finished now.
    Unfinished,
}

impl Verdict {
    /// Whether the snapshot stays.
    pub fn keeps(self) -> bool {
        !matches!(self, Verdict::Remove | Verdict::Unfinished)
    }
}

/// One snapshot as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub name: String,
    pub time: Stamp,
    /// When it was completed, if it was.
    pub completed: Option<Stamp>,
    pub state: State,
    /// The snapshot it was cloned from, for one still cloning.
    pub base: Option<String>,
}

impl Candidate {
    /// The time its day and week are taken from: its name's, unless it
    /// was completed before that. A name is pushed past the newest one
    /// when the clock was once set ahead (see [`Stamp::after`]), so after
    /// such a snapshot every later one is named a few microseconds after
    /// it whatever day it was made; its completion then says the day.
    /// The order (which is newest) stays the names'.
    fn when(&self) -> Stamp {
        self.completed.map_or(self.time, |c| c.min(self.time))
    }
}

/// The verdict on each candidate, in the order given.
pub(crate) fn decide(cands: &[Candidate], keep: &KeepPolicy) -> Vec<Verdict> {
    let mut complete: Vec<usize> = (0..cands.len())
        .filter(|&i| cands[i].state == State::Complete)
        .collect();
    // Newest first; the name breaks a tie (names are unique).
    complete
        .sort_by(|&a, &b| (cands[b].time, &cands[b].name).cmp(&(cands[a].time, &cands[a].name)));
    let mut kept = BTreeSet::new();
    kept.extend(complete.iter().take(keep.last as usize).copied());
    for (n, bucket) in [
        (keep.daily, Stamp::day as fn(Stamp) -> i64),
        (keep.weekly, Stamp::week),
    ] {
        let mut left = n;
        let mut last = None;
        for &i in &complete {
            if left == 0 {
                break;
            }
            let b = bucket(cands[i].when());
            if last != Some(b) {
                kept.insert(i);
                last = Some(b);
                left -= 1;
            }
        }
    }
    let newest = complete.first().copied();
    let read_by_clone: BTreeSet<&str> = cands
        .iter()
        .filter(|c| c.state == State::Cloning)
        .filter_map(|c| c.base.as_deref())
        .collect();
    cands
        .iter()
        .enumerate()
        .map(|(i, c)| match c.state {
            State::Cloning | State::Open => Verdict::InUse,
            State::Removing => Verdict::Unfinished,
            State::Complete if Some(i) == newest => Verdict::Newest,
            State::Complete if read_by_clone.contains(c.name.as_str()) => Verdict::InUse,
            State::Complete if kept.contains(&i) => Verdict::Policy,
            State::Complete => Verdict::Remove,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000_000;
    const D: u64 = 24 * H;

    fn at(name: &str) -> Stamp {
        Stamp::parse(name).unwrap()
    }

    fn complete(t: Stamp) -> Candidate {
        Candidate {
            name: t.name(),
            time: t,
            completed: None,
            state: State::Complete,
            base: None,
        }
    }

    fn kept_names(c: &[Candidate], keep: KeepPolicy) -> Vec<String> {
        decide(c, &keep)
            .iter()
            .zip(c)
            .filter(|(v, _)| v.keeps())
            .map(|(_, c)| c.name.clone())
            .collect()
    }

    #[test]
    fn table() {
        // Two snapshots a day, at 06:00 and 18:00, from Monday 2026-11-02
        // to Sunday 2026-11-22: three ISO weeks, 21 days, 42 snapshots.
        let start = at("20261102T060000.000000Z");
        let set: Vec<Candidate> = (0..42)
            .map(|i| complete(Stamp(start.0 + i * 12 * H)))
            .collect();
        let name =
            |day: u64, evening: bool| Stamp(start.0 + day * D + u64::from(evening) * 12 * H).name();
        let cases: Vec<(KeepPolicy, Vec<String>)> = vec![
            // Nothing asked: the newest only.
            (KeepPolicy::default(), vec![name(20, true)]),
            (
                KeepPolicy {
                    last: 3,
                    ..Default::default()
                },
                vec![name(19, true), name(20, false), name(20, true)],
            ),
            // The evening one of each of the last three days.
            (
                KeepPolicy {
                    daily: 3,
                    ..Default::default()
                },
                vec![name(18, true), name(19, true), name(20, true)],
            ),
            // Sunday evening of each week.
            (
                KeepPolicy {
                    weekly: 2,
                    ..Default::default()
                },
                vec![name(13, true), name(20, true)],
            ),
            // Rules overlap: last 2 = both of day 20; daily 2 = evenings of
            // days 19 and 20; weekly 3 = Sunday evenings 6, 13, 20.
            (
                KeepPolicy {
                    last: 2,
                    daily: 2,
                    weekly: 3,
                },
                vec![
                    name(6, true),
                    name(13, true),
                    name(19, true),
                    name(20, false),
                    name(20, true),
                ],
            ),
            // More asked than there are: everything (daily) or one per week.
            (
                KeepPolicy {
                    daily: 100,
                    ..Default::default()
                },
                (0..21).map(|d| name(d, true)).collect(),
            ),
            (
                KeepPolicy {
                    weekly: 100,
                    ..Default::default()
                },
                vec![name(6, true), name(13, true), name(20, true)],
            ),
            (
                KeepPolicy {
                    last: 1000,
                    ..Default::default()
                },
                set.iter().map(|c| c.name.clone()).collect(),
            ),
        ];
        for (keep, want) in cases {
            let mut want = want;
            want.sort();
            assert_eq!(kept_names(&set, keep), want, "{keep:?}");
        }
    }

    #[test]
    fn daily_counts_days_that_have_snapshots() {
        // Days 0, 1 and 10: keep_daily 2 keeps days 10 and 1, the gap
        // does not use up a count (restic's rule).
        let t0 = at("20260101T120000.000000Z");
        let set: Vec<Candidate> = [0, 1, 10]
            .iter()
            .map(|d| complete(Stamp(t0.0 + d * D)))
            .collect();
        let keep = KeepPolicy {
            daily: 2,
            ..Default::default()
        };
        assert_eq!(
            kept_names(&set, keep),
            vec![set[1].name.clone(), set[2].name.clone()]
        );
    }

    #[test]
    fn in_progress_and_their_bases_stay() {
        let t = |h: u64| Stamp(at("20260101T000000.000000Z").0 + h * H);
        let mut set = vec![complete(t(0)), complete(t(1)), complete(t(2))];
        set.push(Candidate {
            name: t(3).name(),
            time: t(3),
            completed: None,
            state: State::Cloning,
            base: Some(t(1).name()),
        });
        set.push(Candidate {
            name: t(4).name(),
            time: t(4),
            completed: None,
            state: State::Removing,
            base: None,
        });
        let v = decide(&set, &KeepPolicy::default());
        assert_eq!(
            v,
            vec![
                Verdict::Remove,
                Verdict::InUse,
                Verdict::Newest,
                Verdict::InUse,
                Verdict::Unfinished
            ]
        );
        set[3].state = State::Open;
        let v = decide(&set, &KeepPolicy::default());
        assert_eq!(
            v[1],
            Verdict::Remove,
            "an open snapshot no longer reads its base"
        );
    }

    /// Random sets of snapshots (complete, in progress, being removed, at
    /// random times over a few months, some within one second), random
    /// policies: the invariants hold for each.
    #[test]
    fn generated_sets_keep_the_invariants() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let base = at("20250101T000000.000000Z").0;
        for round in 0..3000 {
            let n = next(40) as usize;
            let mut set: Vec<Candidate> = Vec::new();
            let mut times = BTreeSet::new();
            for _ in 0..n {
                let t = if next(5) == 0 && !times.is_empty() {
                    // Close to another one: same second, same day.
                    let near = *times.iter().nth(next(times.len() as u64) as usize).unwrap();
                    Stamp(near + 1 + next(1_000_000))
                } else {
                    Stamp(base + next(120 * D))
                };
                if !times.insert(t.0) {
                    continue;
                }
                let state = match next(10) {
                    0 => State::Cloning,
                    1 => State::Open,
                    2 => State::Removing,
                    _ => State::Complete,
                };
                set.push(Candidate {
                    name: t.name(),
                    time: t,
                    completed: None,
                    state,
                    base: None,
                });
            }
            let names: Vec<String> = set.iter().map(|c| c.name.clone()).collect();
            // A clone reads a complete snapshot (a prune never starts to
            // remove one that is read, so no other state is a base).
            let bases: Vec<String> = set
                .iter()
                .filter(|c| c.state == State::Complete)
                .map(|c| c.name.clone())
                .collect();
            for c in set.iter_mut().filter(|c| c.state == State::Cloning) {
                if !bases.is_empty() && next(2) == 0 {
                    c.base = Some(bases[next(bases.len() as u64) as usize].clone());
                }
            }
            let keep = KeepPolicy {
                last: next(6) as u32,
                daily: next(10) as u32,
                weekly: next(5) as u32,
            };
            let v = decide(&set, &keep);
            assert_eq!(v.len(), set.len());
            let complete: Vec<usize> = (0..set.len())
                .filter(|&i| set[i].state == State::Complete)
                .collect();
            let ctx = format!("round {round}: {keep:?} {set:?} {v:?}");
            // The newest complete one stays.
            if let Some(&newest) = complete.iter().max_by_key(|&&i| set[i].time) {
                assert_eq!(v[newest], Verdict::Newest, "{ctx}");
            }
            // Nothing in progress goes; a removal begun is finished.
            for (i, c) in set.iter().enumerate() {
                match c.state {
                    State::Cloning | State::Open => assert_eq!(v[i], Verdict::InUse, "{ctx}"),
                    State::Removing => assert_eq!(v[i], Verdict::Unfinished, "{ctx}"),
                    State::Complete => assert!(!matches!(v[i], Verdict::Unfinished), "{ctx}"),
                }
            }
            // A base still being cloned from stays.
            for c in set.iter().filter(|c| c.state == State::Cloning) {
                if let Some(b) = &c.base {
                    let i = names.iter().position(|n| n == b).unwrap();
                    assert!(v[i].keeps(), "{ctx}");
                }
            }
            // Counts: the policy keeps no more than it asked for (plus the
            // newest and the bases), and at least min(asked, available) of
            // each rule's buckets.
            let by_policy = complete
                .iter()
                .filter(|&&i| v[i] == Verdict::Policy)
                .count();
            assert!(
                by_policy <= (keep.last + keep.daily + keep.weekly) as usize,
                "{ctx}"
            );
            let kept: Vec<usize> = complete.iter().copied().filter(|&i| v[i].keeps()).collect();
            assert!(
                kept.len() >= (keep.last as usize).min(complete.len()),
                "{ctx}"
            );
            let mut sorted = complete.clone();
            sorted.sort_by_key(|&i| std::cmp::Reverse(set[i].time));
            for &i in sorted.iter().take(keep.last as usize) {
                assert!(v[i].keeps(), "keep_last: {ctx}");
            }
            for (n, bucket) in [
                (keep.daily, Stamp::day as fn(Stamp) -> i64),
                (keep.weekly, Stamp::week),
            ] {
                // The newest snapshot of each of the newest n buckets stays.
                let mut seen = Vec::new();
                for &i in &sorted {
                    let b = bucket(set[i].time);
                    if !seen.contains(&b) {
                        seen.push(b);
                        if seen.len() <= n as usize {
                            assert!(v[i].keeps(), "bucket {b}: {ctx}");
                        }
                    }
                }
                // And no other snapshot of a bucket is kept by that rule
                // alone: every kept one is explained by some rule.
            }
            for &i in &kept {
                let explained = sorted.iter().take(keep.last as usize).any(|&j| j == i)
                    || [
                        (keep.daily, Stamp::day as fn(Stamp) -> i64),
                        (keep.weekly, Stamp::week),
                    ]
                    .iter()
                    .any(|(n, bucket)| {
                        let b = bucket(set[i].time);
                        let first_in_bucket =
                            sorted.iter().find(|&&j| bucket(set[j].time) == b) == Some(&i);
                        let mut buckets: Vec<i64> =
                            sorted.iter().map(|&j| bucket(set[j].time)).collect();
                        buckets.dedup();
                        let rank = buckets.iter().position(|&x| x == b).unwrap();
                        first_in_bucket && rank < *n as usize
                    })
                    || v[i] != Verdict::Policy;
                assert!(explained, "kept without a reason: {}: {ctx}", set[i].name);
            }
        }
    }
}
