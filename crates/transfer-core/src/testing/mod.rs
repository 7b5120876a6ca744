//! Test support.
//!
//! Always there: [`require`], which turns the skip of a test whose provider
//! does not open into a failure when CI says that provider must work
//! (`TRANSFER_REQUIRE`), so that a broken provider cannot pass as "skipped".
//!
//! With the `test-domain` feature: a deterministic in-memory fabric for
//! transfer-core's own tests. This is a test double, not a product backend:
//! it moves bytes with `memcpy` between regions of one process. It is
//! seeded, executes posted operations in a random order when asked (as EFA
//! SRD may), completes them a few at a time, and injects failures, so the
//! engine's logic (order independence, sharding, error delivery, teardown)
//! is tested without hardware. The real backends live in `transfer-efa` and
//! `transfer-verbs`.

pub mod c_layout;
#[cfg(feature = "test-domain")]
mod domain;
#[cfg(feature = "test-domain")]
mod fabric;
mod pump;
pub mod require;

#[cfg(feature = "test-domain")]
pub use domain::TestDomain;
#[cfg(feature = "test-domain")]
pub use fabric::{TestFabric, TestFabricConfig};
pub use pump::drive_in_background;
pub use require::{REQUIRE_ENV, is_required, skip_or_fail};
