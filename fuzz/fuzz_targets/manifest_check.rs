// The manifest reader and validator against arbitrary bytes: shared by
// the cargo-fuzz target `manifest` and the corpus replay the test suite
// runs on stable over fuzz/seeds (crates/cowlink/tests/store.rs), so
// both run the same checks.
//
// Properties: reading never panics and ends (the validator is linear in
// the bytes); what is accepted in canonical form is exactly its own
// serialization; any accepted manifest, written canonically, is read
// back equal by the canonical reader; a manifest accepted without
// external links has every link verdict `Inside`.

use cowlink::store::{LinkVerdict, Manifest};

/// Run every check on one input.
pub fn check(data: &[u8]) {
    let canonical = Manifest::from_canonical_bytes(data, "fuzz");
    if let Ok(m) = &canonical {
        assert_eq!(m.to_bytes(), data, "canonical bytes are their own form");
    }
    let Ok(m) = Manifest::from_bytes(data, "fuzz") else {
        assert!(canonical.is_err(), "the canonical reader is stricter");
        return;
    };
    let sorted = Manifest::new(m.entries.clone());
    let bytes = sorted.to_bytes();
    let back =
        Manifest::from_canonical_bytes(&bytes, "fuzz").expect("a written manifest reads back");
    assert_eq!(back, sorted);
    assert_eq!(back.digest(), cowlink::store::Digest::of(&bytes));
    let verdicts = m.link_verdicts("fuzz").expect("valid paths");
    let inside = verdicts.iter().all(|(_, v)| *v == LinkVerdict::Inside);
    assert_eq!(m.validate("fuzz", false).is_ok(), inside);
}
