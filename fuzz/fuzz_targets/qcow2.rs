//! The qcow2 reader against arbitrary bytes: opening, resolving the names
//! an image carries, walking every range and inflating every compressed
//! cluster must give `Ok` or a typed error, never a panic, an abort, a
//! hang or an allocation beyond the limits; the ranges must tile the
//! virtual size and point inside the file (`cowlink::image::qcow2::exercise`
//! asserts it; the same function runs over generated cases on stable in
//! the CLI's image tests).
//!
//! The reader works on files, so each input is written to one file in the
//! directory `COWLINK_FUZZ_SCRATCH` names (bench/fuzz-qcow2 makes one on
//! /dev/shm and removes it), else in the system's temporary directory.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::var_os("COWLINK_FUZZ_SCRATCH")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        dir.join(format!("cowlink-fuzz-{}.qcow2", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    std::fs::write(path, data).expect("write the input");
    let _ = cowlink::image::qcow2::exercise(path);
});
