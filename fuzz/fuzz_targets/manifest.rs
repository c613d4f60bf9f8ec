//! The manifest reader and validator against arbitrary bytes (see
//! manifest_check.rs, shared with the corpus replay of the test suite).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("manifest_check.rs");

fuzz_target!(|data: &[u8]| check(data));
