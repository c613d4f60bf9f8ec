//! The fanotify event-record parser (`cowlink_sys::parse_events`) on
//! arbitrary bytes: it never panics, never reads past the buffer, and
//! what it returns holds together: at most one event per 24 bytes,
//! handles of at most MAX_HANDLE_SZ bytes, names non-empty and free of
//! `/` and NUL.
#![no_main]

use cowlink_sys::{parse_events, FAN_METADATA_LEN, MAX_HANDLE_SZ};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    let _ = parse_events(data, &mut out);
    assert!(out.len() <= data.len() / FAN_METADATA_LEN);
    for ev in &out {
        if let Some(h) = &ev.dir {
            assert!(h.bytes.len() <= MAX_HANDLE_SZ);
        }
        if let Some(n) = &ev.name {
            assert!(!n.is_empty() && !n.contains(&b'/') && !n.contains(&0));
        }
    }
});
