// The dedupe index's record reader against arbitrary bytes: shared by
// the cargo-fuzz target `index_record` and the corpus replay the test
// suite runs on stable over fuzz/seeds/index_record
// (crates/cowlink/tests/it/dedupe_hostile.rs), so both run the same
// checks.
//
// An input is a directory's inode (8 bytes, little-endian) and the bytes
// stored for it. Properties: reading never panics and ends; a record it
// accepts encodes to bytes that read back as that same encoding (the
// encoding is stable, so a record rewritten unchanged is byte-equal and
// left alone). The same bytes with a correct trailing check are read
// too, so the decoding behind the check is reached, not only its
// mismatch.

use cowlink::dedupe::index::reencoded_record;

/// The check a record ends with: 8 bytes of BLAKE3 over its directory's
/// inode and the bytes before it.
const CHECK: usize = 8;

fn check_one(dir: u64, stored: &[u8]) -> Option<Vec<u8>> {
    let again = reencoded_record(dir, stored)?;
    assert_eq!(
        reencoded_record(dir, &again).as_deref(),
        Some(again.as_slice()),
        "a record's encoding reads back as itself"
    );
    // Another directory's check never holds for it by construction of
    // the input (8 bytes of BLAKE3 would have to collide).
    Some(again)
}

/// Run every check on one input; the re-encoding of the record as given,
/// where it was accepted.
pub fn check(data: &[u8]) -> Option<Vec<u8>> {
    let (dir, stored) = data.split_at_checked(8)?;
    let dir = u64::from_le_bytes(dir.try_into().ok()?);
    let accepted = check_one(dir, stored);
    if stored.len() >= CHECK {
        let mut sealed = stored.to_vec();
        let n = sealed.len() - CHECK;
        let mut h = blake3::Hasher::new();
        h.update(&dir.to_le_bytes());
        h.update(&sealed[..n]);
        sealed[n..].copy_from_slice(&h.finalize().as_bytes()[..CHECK]);
        check_one(dir, &sealed);
    }
    accepted
}
