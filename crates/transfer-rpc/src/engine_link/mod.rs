//! Server side of the ENGINE_* extension: stage boundaries written
//! server-to-server over a TransferEngine (libfabric backend).
//!
//! - [`config`]: which provider and NICs the server's engine opens.
//! - [`link`]: the engine, its address and the per-buffer registration
//!   cache shared by every session of a server.
//! - [`lanes`]: server-wide lane ids (immediates are engine-wide).
//! - [`session_state`]: one session's inbound lanes, outbound targets and
//!   posted writes, and the handlers of the ENGINE_* commands.
//! - [`ticket`]: what a lane's opener gets and its sender needs: the
//!   range, the slot ring and the secret that make a wait unforgeable.
//!
//! # Memory safety
//! A registered buffer's memory is kept alive by the registration (it holds
//! the buffer's `Arc`) until the engine has unregistered it; a region that
//! cannot be unregistered yet (a write still posted, `RegionBusy`) is kept
//! and retried later, so neither a NIC reading a source nor a remote writing
//! a destination ever touches freed memory. Ordering between the engine's
//! accesses and the registry's own (SET_TENSOR, GET_TENSOR, compute) is the
//! protocol's job: a session settles its posted writes before any command
//! that could write or free their sources, and a destination reads a lane's
//! data only after ENGINE_WAIT said it arrived.

pub mod config;
pub mod lanes;
pub mod link;
pub mod session_state;
pub mod ticket;

pub use config::EngineLinkConfig;
pub use lanes::LaneTable;
pub use link::{EngineLink, NATIVE_VERBS};
pub use session_state::EngineSession;
