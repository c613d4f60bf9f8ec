//! The one walker: a work-stealing pool over open directory descriptors
//! ([`pool`]) and the read-only walk the inspection features use
//! ([`scan`]). The tree copy (`crate::tree`) is the engine's other driver.
//!
//! Both walks open every directory relative to its parent (`openat`), so
//! depth and path length do not matter, and both keep descriptors bounded
//! by depth × threads whatever the width of a directory.

pub(crate) mod pool;
pub(crate) mod scan;

pub(crate) use scan::{walk, DirInfo, Entry, Visitor};
