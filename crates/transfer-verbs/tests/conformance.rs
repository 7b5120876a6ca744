//! The transfer-core conformance suite, unchanged, over real verbs devices
//! (soft-RoCE in the VM harness, ConnectX on hardware). Skips, saying why,
//! where libibverbs or a device is missing.

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

fn harness() -> Option<VerbsHarness> {
    if !transfer_verbs::library_available() {
        eprintln!(
            "skipped: libibverbs.so.1 cannot be loaded (apt-get install libibverbs1 ibverbs-providers)"
        );
        return None;
    }
    match transfer_verbs::devices() {
        Ok(d) if d.is_empty() => {
            eprintln!("skipped: no RDMA device (load a NIC driver or rdma_rxe)");
            return None;
        }
        Err(e) => {
            eprintln!("skipped: listing devices failed: {e}");
            return None;
        }
        Ok(_) => {}
    }
    let cfg = VerbsConfig::from_env();
    if let Err(e) = VerbsDomain::open(cfg.clone()) {
        eprintln!("skipped: cannot open a verbs domain: {e}");
        return None;
    }
    Some(VerbsHarness { cfg })
}

transfer_core::conformance_tests!(harness());
