//! The ground floor: what every other layer stands on and which imports
//! nothing of the crate but itself. The one error type, filesystem kinds
//! and their limits, the mount table, and hashing.

pub mod error;
pub mod fskind;
pub(crate) mod hash;
pub mod mountinfo;
