//! Ctrl-C and SIGTERM, the same way for every subcommand.
//!
//! While an operation that honours the library's [`CancelToken`] runs (a
//! tree copy, `du`, `dedupe`, a store ingest, checkout or verify), the
//! first signal cancels it: workers finish the item they are on, the
//! operation returns, the subcommand reports what was done and exits 130.
//! Outside such an operation, or at a second signal, the process exits 130
//! at once after removing files it was writing under their final names;
//! everything else it writes is unnamed until complete, so nothing partial
//! is left either way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use cowlink::CancelToken;

/// Whether a cancellable operation is running.
static GRACEFUL: AtomicBool = AtomicBool::new(false);

/// Whether an operation that must undo its steps is running: every signal
/// only cancels it, never exits (`drive create`).
static STEADFAST: AtomicBool = AtomicBool::new(false);

/// The process's cancel token, with the signal handler installed on first
/// use.
pub fn token() -> CancelToken {
    static TOKEN: OnceLock<CancelToken> = OnceLock::new();
    TOKEN
        .get_or_init(|| {
            let token = CancelToken::new();
            let handler_token = token.clone();
            let _ = ctrlc::set_handler(move || {
                if STEADFAST.load(Ordering::SeqCst) {
                    handler_token.cancel();
                    return;
                }
                if handler_token.is_cancelled() || !GRACEFUL.load(Ordering::SeqCst) {
                    cowlink::remove_unfinished();
                    std::process::exit(130);
                }
                handler_token.cancel();
            });
            token
        })
        .clone()
}

/// Run `f` as a cancellable operation: a signal during it cancels
/// [`token`] instead of exiting.
pub fn graceful<R>(f: impl FnOnce() -> R) -> R {
    let _ = token();
    GRACEFUL.store(true, Ordering::SeqCst);
    let r = f();
    GRACEFUL.store(false, Ordering::SeqCst);
    r
}

/// Mark the start (`true`) or end of a cancellable operation that
/// [`graceful`] cannot wrap (it runs inside a library call).
pub fn set_graceful(on: bool) {
    let _ = token();
    GRACEFUL.store(on, Ordering::SeqCst);
}

/// Run `f`, which undoes its own steps when [`token`] is cancelled: every
/// signal during it (a second Ctrl-C too) only cancels, so the undo always
/// runs to its end.
pub fn steadfast<R>(f: impl FnOnce() -> R) -> R {
    let _ = token();
    STEADFAST.store(true, Ordering::SeqCst);
    let r = f();
    STEADFAST.store(false, Ordering::SeqCst);
    r
}

/// Whether a signal cancelled the run.
pub fn interrupted() -> bool {
    token().is_cancelled()
}
