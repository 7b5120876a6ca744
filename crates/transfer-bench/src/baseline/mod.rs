//! Baselines measured in the same run as the engine.

pub mod memcpy;
pub mod perftest;
pub mod pingpong;
