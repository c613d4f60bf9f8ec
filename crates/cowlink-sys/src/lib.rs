//! The platform layer of cowlink.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod linux;
pub use linux::*;
