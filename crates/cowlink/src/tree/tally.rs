//! Running totals of copies: what [`TreeReport`] reads, kept as atomics
//! the worker threads add to as they go.

use std::sync::atomic::{AtomicU64, Ordering};

use super::TreeReport;
use crate::prim::mode::{Method, Outcome};

/// What a count is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    Files,
    Dirs,
    Symlinks,
    Hardlinks,
    Specials,
    Bytes,
    Cloned,
    Copied,
    Skipped,
    Errors,
}

/// Running totals of one or more copies, safe to read while they run.
///
/// A tree copy keeps its own for its [`TreeReport`]; give it another in
/// [`TreeOptions::tally`](super::TreeOptions::tally) to watch it live or to
/// total several copies (a front end copying many arguments counts its
/// single files in with [`Tally::file`] and [`Tally::failed`]).
#[derive(Debug, Default)]
pub struct Tally([AtomicU64; 10]);

impl Tally {
    pub(crate) fn add(&self, c: Count, n: u64) {
        self.0[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn get(&self, c: Count) -> u64 {
        self.0[c as usize].load(Ordering::Relaxed)
    }

    /// Count a file copied on its own (by [`clone_file`](crate::clone_file)):
    /// a file and its bytes, cloned or copied; [`Method::Skipped`] counts
    /// as skipped and [`Method::Hardlink`] as a hardlink only.
    pub fn file(&self, outcome: &Outcome) {
        match outcome.method {
            Method::Skipped => self.add(Count::Skipped, 1),
            Method::Hardlink => self.add(Count::Hardlinks, 1),
            m => {
                self.add(Count::Files, 1);
                self.add(Count::Bytes, outcome.bytes);
                self.add(
                    match m {
                        Method::Reflink => Count::Cloned,
                        _ => Count::Copied,
                    },
                    1,
                );
            }
        }
    }

    /// Count an entry kept as it was (an existing or already complete
    /// destination).
    pub fn skipped(&self) {
        self.add(Count::Skipped, 1);
    }

    /// Count a failed entry.
    pub fn failed(&self) {
        self.add(Count::Errors, 1);
    }

    /// The totals now (`cancelled` is left false: the tally cannot know).
    pub fn report(&self) -> TreeReport {
        TreeReport {
            files: self.get(Count::Files),
            dirs: self.get(Count::Dirs),
            symlinks: self.get(Count::Symlinks),
            hardlinks: self.get(Count::Hardlinks),
            specials: self.get(Count::Specials),
            bytes: self.get(Count::Bytes),
            cloned: self.get(Count::Cloned),
            copied: self.get(Count::Copied),
            skipped: self.get(Count::Skipped),
            errors: self.get(Count::Errors),
            cancelled: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_files_count_by_method_and_skips_count_apart() {
        let t = Tally::default();
        t.file(&Outcome {
            method: Method::Reflink,
            bytes: 10,
        });
        t.file(&Outcome {
            method: Method::CopyOffload,
            bytes: 5,
        });
        t.file(&Outcome {
            method: Method::Skipped,
            bytes: 0,
        });
        t.failed();
        t.add(Count::Dirs, 2);
        let r = t.report();
        assert_eq!(
            (r.files, r.bytes, r.cloned, r.copied, r.skipped, r.errors, r.dirs),
            (2, 15, 1, 1, 1, 1, 2)
        );
    }
}
