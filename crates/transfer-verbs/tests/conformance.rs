//! The transfer-core conformance suite, unchanged, over real verbs devices
//! (soft-RoCE in the VM harness, ConnectX on hardware). Skips, saying why,
//! where libibverbs or a device is missing, unless `TRANSFER_REQUIRE`
//! names `verbs` (the VM run sets it): then that is a failure.

use transfer_core::conformance::Harness;
use transfer_core::{Result, TransferEngine};
use transfer_verbs::{VerbsConfig, VerbsDomain};

struct VerbsHarness {
    cfg: VerbsConfig,
}

impl Harness for VerbsHarness {
    fn engines(&self, count: usize, nics: usize) -> Result<Vec<TransferEngine>> {
        (0..count)
            .map(|_| {
                TransferEngine::builder()
                    .group(VerbsDomain::open_many(&self.cfg, nics)?)
                    .build()
            })
            .collect()
    }
}

/// The harness, or `None`: skipped, saying why, or a failure when
/// `TRANSFER_REQUIRE` names `verbs` (or `rxe`), as in the soft-RoCE VM.
fn harness() -> Option<VerbsHarness> {
    use transfer_core::testing::skip_or_fail;
    if !transfer_verbs::library_available() {
        skip_or_fail(
            "verbs",
            "libibverbs.so.1 cannot be loaded (apt-get install libibverbs1 ibverbs-providers)",
        );
        return None;
    }
    match transfer_verbs::devices() {
        Ok(d) if d.is_empty() => {
            skip_or_fail("verbs", "no RDMA device (load a NIC driver or rdma_rxe)");
            return None;
        }
        Err(e) => {
            skip_or_fail("verbs", format!("listing devices failed: {e}"));
            return None;
        }
        Ok(_) => {}
    }
    let cfg = VerbsConfig::from_env();
    if let Err(e) = VerbsDomain::open(cfg.clone()) {
        skip_or_fail("verbs", format!("cannot open a verbs domain: {e}"));
        return None;
    }
    Some(VerbsHarness { cfg })
}

transfer_core::conformance_tests!(harness());
