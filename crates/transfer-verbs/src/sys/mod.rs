//! Raw libibverbs FFI: `#[repr(C)]` structures, the run-time loader and the
//! inline data-path verbs. Everything above this module is safe Rust.

pub mod datapath;
pub mod extended;
pub mod loader;
pub mod types;

pub use loader::{ChannelVerbs, INSTALL_HINT, LIBRARY, Verbs, available, verbs};
pub use types::*;
