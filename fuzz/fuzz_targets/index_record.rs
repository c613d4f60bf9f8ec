//! The dedupe index's record reader against arbitrary bytes (see
//! index_record_check.rs, shared with the corpus replay of the test
//! suite).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("index_record_check.rs");

fuzz_target!(|data: &[u8]| {
    check(data);
});
