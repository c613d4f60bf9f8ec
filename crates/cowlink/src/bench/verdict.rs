//! The decision: numbers in, a method and the numbers behind it out. Pure,
//! so it is tested without a filesystem; the front end words it.

use serde::Serialize;

use super::{ReflinkWorks, SizeRow, Strategy, WriterRow, MIB};

/// The file size the method advice rests on: large enough that a copy's
/// cost shows, small enough for every run level.
pub const REFERENCE_SIZE: u64 = 16 * MIB;

/// Which method to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Advice {
    /// Clone: measured faster than copying, and safe (a write to a clone
    /// never reaches the original).
    Clone,
    /// Copy: reflink does not work here, or it measured no faster.
    Copy,
}

/// How preallocated 1 MiB writes compare with unbuffered 8 KiB writes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WriterAdvice {
    /// Fragments per file with 8 KiB writes, when FIEMAP reports them.
    pub fragments_small: Option<f64>,
    /// Fragments per file with preallocated 1 MiB writes.
    pub fragments_prealloc: Option<f64>,
    /// Write throughput, preallocated / small.
    pub write_ratio: f64,
    /// Read-back throughput, preallocated / small.
    pub readback_ratio: f64,
}

/// The verdict and the figures it rests on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// What to use.
    pub method: Advice,
    /// The size the advice rests on ([`REFERENCE_SIZE`]), `None` when it
    /// was not measured (then the advice is to copy).
    pub basis_bytes: Option<u64>,
    /// Copy median / clone median at that size.
    pub copy_vs_clone: Option<f64>,
    /// Clone median / hardlink median at that size.
    pub clone_vs_hardlink: Option<f64>,
    /// Copy median / hardlink median at that size.
    pub copy_vs_hardlink: Option<f64>,
    /// Why reflink does not work, when it does not.
    pub reflink_reason: Option<String>,
    /// The writer comparison, when both strategies were measured.
    pub writers: Option<WriterAdvice>,
}

/// Decide from the measurements: clone when reflink works and cloning the
/// reference size measured no slower than copying it, else copy.
pub fn verdict(reflink: &ReflinkWorks, sizes: &[SizeRow], writers: &[WriterRow]) -> Verdict {
    let row = sizes.iter().find(|r| r.bytes == REFERENCE_SIZE);
    let clone_wins = row
        .and_then(|r| r.copy_vs_clone)
        .is_some_and(|ratio| reflink.works && ratio >= 1.0);
    let get = |s: Strategy| writers.iter().find(|w| w.strategy == s);
    let writers = match (get(Strategy::Small), get(Strategy::PreallocLarge)) {
        (Some(a), Some(b)) => Some(WriterAdvice {
            fragments_small: a.fragments_per_file,
            fragments_prealloc: b.fragments_per_file,
            write_ratio: b.write_mb_per_s / a.write_mb_per_s,
            readback_ratio: b.readback_mb_per_s / a.readback_mb_per_s,
        }),
        _ => None,
    };
    Verdict {
        method: if clone_wins {
            Advice::Clone
        } else {
            Advice::Copy
        },
        basis_bytes: row.map(|r| r.bytes),
        copy_vs_clone: row.and_then(|r| r.copy_vs_clone),
        clone_vs_hardlink: row.and_then(|r| r.clone_vs_hardlink),
        copy_vs_hardlink: row.map(|r| r.copy.median_us / r.hardlink.median_us),
        reflink_reason: reflink.reason.clone(),
        writers,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Latency;
    use super::*;

    fn lat(us: f64) -> Latency {
        Latency {
            median_us: us,
            min_us: us,
            max_us: us,
        }
    }

    fn row(bytes: u64, copy: f64, clone: Option<f64>, hardlink: f64) -> SizeRow {
        SizeRow {
            bytes,
            copies: 5,
            copy: lat(copy),
            clone: clone.map(lat),
            hardlink: lat(hardlink),
            copy_vs_clone: clone.map(|c| copy / c),
            clone_vs_hardlink: clone.map(|c| c / hardlink),
        }
    }

    fn writer(strategy: Strategy, write: f64, read: f64, frags: Option<f64>) -> WriterRow {
        WriterRow {
            strategy,
            writers: 4,
            files: 8,
            bytes: 8 << 23,
            write_mb_per_s: write,
            fragments_per_file: frags,
            readback_mb_per_s: read,
        }
    }

    const WORKS: ReflinkWorks = ReflinkWorks {
        works: true,
        reason: None,
    };

    #[test]
    fn clone_wins_where_it_measured_faster_at_the_reference_size() {
        let sizes = [
            row(MIB, 500.0, Some(40.0), 10.0),
            row(REFERENCE_SIZE, 8000.0, Some(50.0), 10.0),
        ];
        let v = verdict(&WORKS, &sizes, &[]);
        assert_eq!(v.method, Advice::Clone);
        assert_eq!(v.basis_bytes, Some(REFERENCE_SIZE));
        assert_eq!(v.copy_vs_clone, Some(160.0));
        assert_eq!(v.clone_vs_hardlink, Some(5.0));
        assert_eq!(v.copy_vs_hardlink, Some(800.0));
        assert_eq!(v.writers, None);
    }

    #[test]
    fn copy_when_reflink_fails_or_measures_slower() {
        let no = ReflinkWorks {
            works: false,
            reason: Some("ext4 cannot clone".into()),
        };
        let v = verdict(&no, &[row(REFERENCE_SIZE, 8000.0, None, 10.0)], &[]);
        assert_eq!(v.method, Advice::Copy);
        assert_eq!(v.reflink_reason.as_deref(), Some("ext4 cannot clone"));
        assert_eq!(v.copy_vs_hardlink, Some(800.0));

        // A clone slower than a copy (a network filesystem emulating it,
        // say) is not worth it.
        let slow = verdict(
            &WORKS,
            &[row(REFERENCE_SIZE, 100.0, Some(200.0), 10.0)],
            &[],
        );
        assert_eq!(slow.method, Advice::Copy);
    }

    #[test]
    fn without_the_reference_size_the_advice_is_to_copy() {
        let v = verdict(&WORKS, &[row(MIB, 500.0, Some(40.0), 10.0)], &[]);
        assert_eq!(v.method, Advice::Copy);
        assert_eq!(v.basis_bytes, None);
        assert_eq!(v.copy_vs_clone, None);
    }

    #[test]
    fn writers_compare_preallocated_large_with_small_writes() {
        let w = [
            writer(Strategy::Small, 100.0, 400.0, Some(12.0)),
            writer(Strategy::Large, 150.0, 500.0, Some(6.0)),
            writer(Strategy::PreallocLarge, 200.0, 600.0, Some(1.0)),
        ];
        let a = verdict(&WORKS, &[], &w).writers.unwrap();
        assert_eq!(a.write_ratio, 2.0);
        assert_eq!(a.readback_ratio, 1.5);
        assert_eq!(
            (a.fragments_small, a.fragments_prealloc),
            (Some(12.0), Some(1.0))
        );
        assert_eq!(verdict(&WORKS, &[], &w[..2]).writers, None);
    }
}
