//! File primitives, above the ground and below every feature: how data
//! moves (`transfer`: clone or copy, with the [`mode`] vocabulary), how a
//! destination name comes into being (`place`), what metadata follows
//! (`meta`), the pure rules over what stat says (`facts`), and the checks on sources and destinations (`files`). Nothing
//! here walks a tree or knows a feature.

pub mod backup;
pub mod facts;
pub(crate) mod files;
pub mod meta;
pub mod mode;
pub mod place;
pub(crate) mod transfer;
