//! A progress line on stderr, redrawn ten times a second from a closure
//! that reads the library's atomic counters. Shown only on a terminal.

use std::io::IsTerminal;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

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
