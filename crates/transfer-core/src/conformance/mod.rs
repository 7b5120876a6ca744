//! The conformance suite: the contract every backend runs unchanged over its
//! real provider.
//!
//! A backend supplies a [`Harness`] that builds engines able to reach each
//! other, then expands [`conformance_tests!`](crate::conformance_tests) in
//! an integration test, which makes one `#[test]` per case. Every case
//! verifies data byte for byte and counts immediates exactly; none asserts
//! timings (timeouts are failure guards only).

/// Fails a case with a formatted reason when `cond` is false.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return Err(format!($($msg)*));
        }
    };
}

mod cases;
pub mod two_process;
mod util;

pub use cases::CASES;
pub use util::block_on;

use crate::engine::TransferEngine;
use crate::error::Result;

/// Builds engines for the suite.
pub trait Harness: Sync {
    /// `count` engines with `nics` NICs each (one domain group), all able to
    /// reach each other. A harness that cannot provide `nics` NICs returns
    /// an error naming why; cases needing several NICs then say they skip.
    fn engines(&self, count: usize, nics: usize) -> Result<Vec<TransferEngine>>;

    /// Whether the harness can give engines more than one NIC.
    fn multi_nic(&self) -> bool {
        true
    }

    /// Whether engines built in two processes can reach each other (false
    /// for in-memory fabrics); the two-process cases skip otherwise.
    fn cross_process(&self) -> bool {
        true
    }
}

/// One conformance case.
pub struct Case {
    /// Name (also the generated test's name).
    pub name: &'static str,
    /// The check; `Err` is a failure with its reason.
    pub run: fn(&dyn Harness) -> std::result::Result<(), String>,
}

/// Runs every case, returning the names of failures with reasons.
pub fn run_all(h: &dyn Harness) -> Vec<(&'static str, String)> {
    CASES
        .iter()
        .filter_map(|c| (c.run)(h).err().map(|e| (c.name, e)))
        .collect()
}

/// Runs one case by name (used by [`conformance_tests!`](crate::conformance_tests)).
pub fn run_case(h: &dyn Harness, name: &str) -> std::result::Result<(), String> {
    let case = CASES
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("no conformance case named {name}"))?;
    (case.run)(h)
}

/// Expands to one `#[test]` per conformance case, over the harness given
/// by `$harness` (an expression evaluated in each test).
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            write_single, write_with_imm, zero_byte_imm_write, write_sharded_multi_nic,
            paged_write, paged_write_multi_nic, paged_layer_imm_after_pages, scatter_group, barrier_group,
            send_recv_pool, imm_expect_before_and_after, many_threads,
            flag_and_future_notifications, refused_requests, unregister_rules,
            malformed_wire_input, drop_with_transfers_in_flight);
        $crate::conformance_tests!(@two_process $harness);
    };
    (@two_process $harness:expr) => {
        /// The peer process of the two-process cases (a no-op unless spawned as one).
        #[test]
        fn two_process_peer() {
            let Some(h) = $harness else { return };
            let result = $crate::conformance::two_process::peer_main(&h, module_path!());
            assert!(result.is_ok(), "two-process peer failed: {:?}", result);
        }

        #[test]
        fn two_process_every_operation() {
            let Some(h) = $harness else { return };
            let result = $crate::conformance::two_process::every_operation(&h, module_path!());
            assert!(result.is_ok(), "conformance case two_process_every_operation failed: {:?}", result);
        }

        #[test]
        fn two_process_peer_killed_mid_stream() {
            let Some(h) = $harness else { return };
            let result = $crate::conformance::two_process::peer_killed_mid_stream(&h, module_path!());
            assert!(result.is_ok(), "conformance case two_process_peer_killed_mid_stream failed: {:?}", result);
        }
    };
    (@cases $harness:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let harness = $harness;
                let Some(h) = harness else { return };
                let result = $crate::conformance::run_case(&h, stringify!($name));
                assert!(result.is_ok(), "conformance case {} failed: {:?}", stringify!($name), result);
            }
        )*
    };
}
