//! File primitives, above the ground and below every feature: how data
//! moves (`transfer`: clone or copy, with the [`mode`] vocabulary), how a
//! destination name comes into being (`place`), what metadata follows
//! (`meta`), the pure rules over what stat says (`facts`), the checks on
//! sources and destinations (`files`), backup names (`backup`), and a
//! destination's new version made from its old one by rewriting only the
//! blocks that differ (`delta`). Nothing here walks a tree or knows a
//! feature.

#[cfg(unix)]
pub mod backup;
#[cfg(unix)]
pub mod delta;
#[cfg(unix)]
pub mod facts;
#[cfg(unix)]
pub(crate) mod files;
pub mod meta;
pub mod mode;
pub mod place;
#[cfg(unix)]
pub(crate) mod transfer;
