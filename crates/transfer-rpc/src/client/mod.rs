//! A ggml-rpc client with every command and the stage-boundary copy.

pub mod config;
pub mod connection;
pub mod engine;
pub mod stage_copy;
pub mod stats;
pub mod trace;

pub use config::ClientConfig;
pub use connection::{COALESCE_BOUND, Client};
pub use engine::{EngineBoundary, EngineInfo, EngineWrite, InboundLane, open_engine_boundary};
pub use stage_copy::{CopyPath, copy_between};
pub use stats::{CommandStats, Stats};
