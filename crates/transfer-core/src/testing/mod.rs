//! A deterministic in-memory fabric for transfer-core's own tests.
//!
//! This is a test double, not a product backend: it moves bytes with
//! `memcpy` between regions of one process. It is seeded, executes posted
//! operations in a random order when asked (as EFA SRD may), completes them
//! a few at a time, and injects failures, so the engine's logic (order
//! independence, sharding, error delivery, teardown) is tested without
//! hardware. The real backends live in `transfer-efa` and `transfer-verbs`.

mod domain;
mod fabric;

pub use domain::TestDomain;
pub use fabric::{TestFabric, TestFabricConfig};
