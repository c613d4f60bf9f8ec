// The block-hash record reader against arbitrary bytes: shared by the
// cargo-fuzz target `block_record` and the corpus replay the test suite
// runs on stable over fuzz/seeds/block_record
// (crates/cowlink/tests/it/delta.rs), so both run the same checks.
//
// Properties: reading never panics and ends (it is linear in the bytes,
// and allocates no more than the input's length); what is accepted is
// exactly its own serialization, with one hash per block of the size it
// names. The same bytes with a correct trailing checksum are read too, so
// the checks behind the checksum are reached, not only its mismatch.

use cowlink::delta::BlockRecord;
use cowlink::ErrorKind;

fn check_one(data: &[u8]) {
    match BlockRecord::from_bytes(data) {
        Ok(r) => {
            assert_eq!(r.to_bytes(), data, "an accepted record is its own form");
            let blocks = r.identity().size.div_ceil(r.block_size());
            assert_eq!(r.hashes().len() as u64, blocks);
            assert!(r.block_size().is_power_of_two());
        }
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::NotSupported),
            "{e}"
        ),
    }
}

/// Run every check on one input.
pub fn check(data: &[u8]) {
    check_one(data);
    if data.len() >= 32 {
        let mut sealed = data.to_vec();
        let n = sealed.len() - 32;
        let sum = blake3_of(&sealed[..n]);
        sealed[n..].copy_from_slice(&sum);
        check_one(&sealed);
    }
}

/// The checksum a record ends with: BLAKE3 of the bytes before it.
fn blake3_of(body: &[u8]) -> [u8; 32] {
    *blake3::hash(body).as_bytes()
}
