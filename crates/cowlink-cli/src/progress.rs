//! A progress line on stderr, redrawn ten times a second from a closure
//! that reads the library's atomic counters. Shown only on a terminal.

use std::io::IsTerminal;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use cowlink::run::{Phase, Progress, ProgressSnapshot};
use indicatif::{ProgressBar, ProgressStyle};

use crate::human_bytes;

/// A running progress line; [`Spinner::finish`] clears it.
pub struct Spinner {
    stop: Option<(Sender<()>, JoinHandle<()>)>,
}

impl Spinner {
    /// Start drawing `message()` when `wanted` and stderr is a terminal.
    pub fn start(wanted: bool, message: impl Fn() -> String + Send + 'static) -> Spinner {
        if !wanted || !std::io::stderr().is_terminal() {
            return Spinner { stop: None };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let handle = std::thread::spawn(move || {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
                    .expect("valid template"),
            );
            loop {
                bar.set_message(message());
                bar.tick();
                if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                    break;
                }
            }
            bar.finish_and_clear();
        });
        Spinner {
            stop: Some((tx, handle)),
        }
    }

    /// Stop and clear the line.
    pub fn finish(self) {
        if let Some((tx, h)) = self.stop {
            let _ = tx.send(());
            let _ = h.join();
        }
    }
}

/// Start a spinner that renders the library's [`Progress`] (see
/// [`describe`]).
pub fn for_run(wanted: bool, progress: &Arc<Progress>) -> Spinner {
    let p = Arc::clone(progress);
    Spinner::start(wanted, move || describe(&p.snapshot()))
}

/// One line for any phase of any operation: what it is doing, how far.
pub fn describe(s: &ProgressSnapshot) -> String {
    let of = |done: u64, total: u64, unit: &dyn Fn(u64) -> String| match total {
        0 => unit(done),
        t => format!("{} of {}", unit(done), unit(t)),
    };
    let count = |n: u64| n.to_string();
    let bytes = |n: u64| human_bytes(n);
    match s.phase {
        Phase::Scan => format!("scanning: {} entries", s.files_done),
        Phase::Hash => format!("hashing: {}", of(s.bytes_done, s.bytes_total, &bytes)),
        Phase::Copy => format!(
            "placing: {} files, {}",
            of(s.files_done, s.files_total, &count),
            of(s.bytes_done, s.bytes_total, &bytes)
        ),
        Phase::Dedupe => format!("deduplicating: {}", of(s.bytes_done, s.bytes_total, &bytes)),
        Phase::Verify => format!(
            "verifying: {} objects, {}",
            of(s.files_done, s.files_total, &count),
            human_bytes(s.bytes_done)
        ),
        Phase::Upload => format!(
            "uploading: {} objects, {}",
            of(s.files_done, s.files_total, &count),
            of(s.bytes_done, s.bytes_total, &bytes)
        ),
        Phase::Download => format!(
            "downloading: {} objects, {}",
            of(s.files_done, s.files_total, &count),
            of(s.bytes_done, s.bytes_total, &bytes)
        ),
        _ => "finishing".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_reads_as_a_sentence() {
        let mut s = ProgressSnapshot {
            phase: Phase::Hash,
            bytes_done: 1 << 20,
            bytes_total: 4 << 20,
            ..Default::default()
        };
        assert_eq!(describe(&s), "hashing: 1.0 MiB of 4.0 MiB");
        s.phase = Phase::Copy;
        s.files_done = 3;
        assert_eq!(describe(&s), "placing: 3 files, 1.0 MiB of 4.0 MiB");
        s.phase = Phase::Scan;
        assert_eq!(describe(&s), "scanning: 3 entries");
        s.bytes_total = 0;
        s.phase = Phase::Dedupe;
        assert_eq!(describe(&s), "deduplicating: 1.0 MiB");
    }
}
