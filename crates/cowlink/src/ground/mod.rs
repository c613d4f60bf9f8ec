//! The ground floor: what every other layer stands on and which imports
//! nothing of the crate but itself. The one error type, filesystem kinds
//! and their limits, the mount table, how names are shown in output, hashing,
//! and [`lock`].

pub mod error;
pub mod fskind;
#[cfg(unix)]
pub(crate) mod hash;
#[cfg(unix)]
pub(crate) mod mountinfo;
pub mod name;

/// Lock a mutex, taking the data even if a thread panicked holding it (the
/// collectors only push to vectors, which a panic cannot leave half-done).
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
