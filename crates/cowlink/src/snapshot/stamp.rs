//! Snapshot names: the UTC time a snapshot was begun, in ISO 8601's basic
//! format with microseconds, `20261126T024549.123456Z`.
//!
//! The format is fixed-width, so names sort as times do; it has no `:` (not
//! allowed in names on SMB shares and Windows) and no `/`. Microseconds
//! make two snapshots begun in one second distinct, and
//! [`Stamp::after`] makes a new name sort after every existing one even
//! when the clock stepped back.
//!
//! The calendar arithmetic is Howard Hinnant's `days_from_civil` /
//! `civil_from_days` (proleptic Gregorian, exact for every year here): a
//! few lines that keep a date crate out of the core library, which the
//! Python wheel compiles.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds in a day.
const DAY_US: u64 = 86_400_000_000;
/// Length of a name: `YYYYMMDDTHHMMSS.uuuuuuZ`.
pub(crate) const NAME_LEN: usize = 23;
/// The last instant a four-digit year can name (9999-12-31, end of day).
pub(crate) const MAX_US: u64 = 253_402_300_800_000_000 - 1;

/// A snapshot's time: microseconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Stamp(pub u64);

impl Stamp {
    /// The current time (the epoch if the clock is before it).
    pub fn now() -> Stamp {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Stamp((d.as_micros() as u64).min(MAX_US))
    }

    /// `self`, or one microsecond after `newest` when `self` is not later
    /// than it: a new snapshot always sorts last.
    pub fn after(self, newest: Option<Stamp>) -> Stamp {
        match newest {
            Some(n) if self <= n => Stamp(n.0 + 1),
            _ => self,
        }
    }

    /// The day (days since 1970-01-01, UTC).
    pub fn day(self) -> i64 {
        (self.0 / DAY_US) as i64
    }

    /// The ISO 8601 week, as the day number of its Monday (weeks start
    /// on Monday; 1970-01-01 was a Thursday).
    pub fn week(self) -> i64 {
        let d = self.day();
        d - (d + 3).rem_euclid(7)
    }

    /// The name: `YYYYMMDDTHHMMSS.uuuuuuZ`.
    pub fn name(self) -> String {
        let (y, m, d) = civil_from_days(self.day());
        let us = self.0 % DAY_US;
        let secs = us / 1_000_000;
        format!(
            "{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{:06}Z",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            us % 1_000_000
        )
    }

    /// The time a name stands for, or `None` when `name` is not exactly a
    /// name [`Stamp::name`] makes (so a directory the user made, or any
    /// other file name, is never taken for a snapshot).
    pub fn parse(name: &str) -> Option<Stamp> {
        let b = name.as_bytes();
        if b.len() != NAME_LEN || b[8] != b'T' || b[15] != b'.' || b[22] != b'Z' {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<u64> {
            b[r].iter().try_fold(0u64, |acc, c| {
                c.is_ascii_digit().then(|| acc * 10 + u64::from(c - b'0'))
            })
        };
        let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
        let (h, mi, s, us) = (num(9..11)?, num(11..13)?, num(13..15)?, num(16..22)?);
        if y < 1970 || !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
            return None;
        }
        if h > 23 || mi > 59 || s > 59 {
            return None;
        }
        let days = days_from_civil(y as i64, mo as u32, d as u32) as u64;
        let st = Stamp(days * DAY_US + ((h * 60 + mi) * 60 + s) * 1_000_000 + us);
        // Exactly one spelling per time: the name must round-trip.
        (st.name() == name).then_some(st)
    }
}

fn is_leap(y: u64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of the date `y-m-d` (Hinnant).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `(y, m, d)` of a day number (Hinnant).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_times() {
        assert_eq!(Stamp(0).name(), "19700101T000000.000000Z");
        // 2026-11-26 02:45:49.123456 UTC = 1795661149.123456
        let t = Stamp(1_795_661_149_123_456);
        assert_eq!(t.name(), "20261126T024549.123456Z");
        assert_eq!(Stamp::parse("20261126T024549.123456Z"), Some(t));
        // 2000-02-29 (leap day of a century leap year) 23:59:59.999999
        let t = Stamp(951_868_799_999_999);
        assert_eq!(t.name(), "20000229T235959.999999Z");
        assert_eq!(Stamp(MAX_US).name(), "99991231T235959.999999Z");
    }

    #[test]
    fn round_trips_and_sorts_like_time() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut prev: Option<(Stamp, String)> = None;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let t = Stamp(x % MAX_US);
            let n = t.name();
            assert_eq!(n.len(), NAME_LEN);
            assert_eq!(Stamp::parse(&n), Some(t), "{n}");
            if let Some((pt, pn)) = &prev {
                assert_eq!(pt.cmp(&t), pn.cmp(&n), "{pn} vs {n}");
            }
            prev = Some((t, n));
        }
    }

    #[test]
    fn refuses_what_it_would_not_write() {
        for bad in [
            "",
            "latest",
            "20261126T024549Z",
            "20261126T024549.123456",
            "20261126T024549.123456Z/",
            "20261126t024549.123456Z",
            "20261126T024549,123456Z",
            "20260230T000000.000000Z",
            "20250229T000000.000000Z",
            "20261326T000000.000000Z",
            "20261126T240000.000000Z",
            "20261126T006000.000000Z",
            "19691231T235959.999999Z",
            "2026112+T024549.123456Z",
            "２0261126T024549.12345Z",
        ] {
            assert_eq!(Stamp::parse(bad), None, "{bad}");
        }
        assert!(Stamp::parse("20240229T000000.000000Z").is_some());
    }

    #[test]
    fn days_and_iso_weeks() {
        let at = |n: &str| Stamp::parse(n).unwrap();
        // 2026-11-23 is a Monday, 2026-11-29 the Sunday of that week.
        let mon = at("20261123T000000.000000Z");
        let sun = at("20261129T235959.999999Z");
        let next = at("20261130T000000.000000Z");
        assert_eq!(mon.week(), sun.week());
        assert_ne!(sun.week(), next.week());
        assert_eq!(next.week() - mon.week(), 7);
        assert_eq!(sun.day() - mon.day(), 6);
        // Weeks run across the new year: 2020-12-31 (Thu) and 2021-01-03
        // (Sun) are both in ISO week 2020-W53.
        assert_eq!(
            at("20201231T120000.000000Z").week(),
            at("20210103T120000.000000Z").week()
        );
        // Before the first Monday after the epoch.
        assert_eq!(Stamp(0).week(), -3);
    }

    /// Any string: parsing never panics, and what it accepts is exactly
    /// what `name` writes for that time.
    #[test]
    fn parse_accepts_only_its_own_names() {
        let mut x: u64 = 0xDEAD_BEEF_1234_5678;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet = b"0123456789TZ.:-/ \xff";
        for _ in 0..50_000 {
            // A valid name with a few bytes changed, or random bytes.
            let mut b = Stamp(next() % MAX_US).name().into_bytes();
            if next() % 4 == 0 {
                b = (0..next() % 30)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                    .collect();
            } else {
                for _ in 0..1 + next() % 3 {
                    let i = (next() % b.len() as u64) as usize;
                    b[i] = alphabet[(next() % alphabet.len() as u64) as usize];
                }
            }
            let Ok(s) = std::str::from_utf8(&b) else {
                continue;
            };
            if let Some(t) = Stamp::parse(s) {
                assert_eq!(t.name(), s);
            }
        }
    }

    #[test]
    fn after_keeps_names_increasing() {
        let n = Stamp(100);
        assert_eq!(Stamp(50).after(Some(n)), Stamp(101));
        assert_eq!(Stamp(100).after(Some(n)), Stamp(101));
        assert_eq!(Stamp(200).after(Some(n)), Stamp(200));
        assert_eq!(Stamp(7).after(None), Stamp(7));
    }
}
