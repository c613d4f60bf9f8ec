//! The block-hash record reader against arbitrary bytes (see
//! block_record_check.rs, shared with the corpus replay of the test suite).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("block_record_check.rs");

fuzz_target!(|data: &[u8]| check(data));
