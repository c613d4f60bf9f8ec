//! The symbolic-link resolver against the kernel's way written out
//! plainly (see symlinks_check.rs, shared with the corpus replay of the
//! test suite).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("symlinks_check.rs");

fuzz_target!(|data: &[u8]| check(data));
