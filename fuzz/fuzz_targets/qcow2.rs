//! The qcow2 reader against arbitrary bytes: opening, mapping and
//! inflating every compressed cluster must give `Ok` or a typed error,
//! never a panic, an abort, a hang or an allocation beyond the limits.
//!
//! The reader works on files, so each input is written to one file in the
//! directory `COWLINK_FUZZ_SCRATCH` names (bench/fuzz-qcow2 makes one on
//! /dev/shm and removes it), else in the system's temporary directory.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use cowlink::image::{Qcow2, Source};
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
    let Ok(image) = Qcow2::open(path) else { return };
    let _ = image.backing_path();
    let Ok(pieces) = image.map() else { return };
    let cluster = image.cluster_size() as usize;
    let mut out = vec![0u8; cluster];
    for piece in pieces {
        assert!(piece.len > 0, "empty piece {piece:?}");
        assert!(
            piece.guest.checked_add(piece.len).is_some_and(|end| end <= image.size),
            "piece {piece:?} beyond the virtual size {}",
            image.size
        );
        if let Source::Compressed { host, len } = piece.source {
            let _ = image.inflate(host, len, &mut out);
        }
    }
});
