//! The conformance suite over the in-memory test domain, in two fabric
//! configurations: unordered delivery with offset addressing (like EFA SRD
//! and libfabric tcp's mr_mode 0), and in-order delivery with virtual
//! addresses (like ConnectX RC); both again with NICs that refuse writes
//! above a small, odd `max_write_size` (the engine splits every write);
//! and once more with caller-driven engines (no worker threads), each
//! driven by a plain polling thread as an application's event loop would,
//! racing the suite's own waits for the same NICs.

use transfer_core::conformance::Harness;
use transfer_core::testing::{TestFabric, TestFabricConfig};
use transfer_core::{ProgressMode, Result, TransferEngine};

struct TestHarness(TestFabricConfig, ProgressMode);

impl TestHarness {
    fn threads(config: TestFabricConfig) -> Self {
        Self(config, ProgressMode::Thread)
    }
}

impl Harness for TestHarness {
    fn engines(&self, count: usize, nics: usize) -> Result<Vec<TransferEngine>> {
        let fabric = TestFabric::new(self.0);
        (0..count)
            .map(|_| {
                let engine = TransferEngine::builder()
                    .progress(self.1)
                    .group(fabric.domains(nics))
                    .build()?;
                transfer_core::testing::drive_in_background(&engine);
                Ok(engine)
            })
            .collect()
    }

    /// The in-memory fabric lives in one process.
    fn cross_process(&self) -> bool {
        false
    }
}

mod unordered_offsets {
    use super::*;
    transfer_core::conformance_tests!(Some(TestHarness::threads(TestFabricConfig {
        seed: 7,
        reorder: true,
        ops_per_poll: 3,
        virt_addr: false,
        wait_fd: true,
        max_write_size: u64::MAX,
        ..TestFabricConfig::default()
    })));
}

mod in_order_virt_addr {
    use super::*;
    transfer_core::conformance_tests!(Some(TestHarness::threads(TestFabricConfig {
        seed: 11,
        reorder: false,
        ops_per_poll: 64,
        virt_addr: true,
        wait_fd: false,
        max_write_size: u64::MAX,
        ..TestFabricConfig::default()
    })));
}

mod unordered_small_max_write {
    use super::*;
    transfer_core::conformance_tests!(Some(TestHarness::threads(TestFabricConfig {
        seed: 13,
        reorder: true,
        ops_per_poll: 16,
        virt_addr: false,
        wait_fd: true,
        max_write_size: 3 * 4096 + 5,
        ..TestFabricConfig::default()
    })));
}

mod in_order_small_max_write {
    use super::*;
    transfer_core::conformance_tests!(Some(TestHarness::threads(TestFabricConfig {
        seed: 17,
        reorder: false,
        ops_per_poll: 64,
        virt_addr: true,
        wait_fd: false,
        max_write_size: 3 * 4096 + 5,
        ..TestFabricConfig::default()
    })));
}

mod caller_driven_unordered {
    use super::*;
    transfer_core::conformance_tests!(Some(TestHarness(
        TestFabricConfig {
            seed: 19,
            reorder: true,
            ops_per_poll: 3,
            virt_addr: false,
            wait_fd: true,
            max_write_size: 3 * 4096 + 5,
            ..TestFabricConfig::default()
        },
        ProgressMode::Caller
    )));
}
