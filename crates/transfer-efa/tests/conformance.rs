//! The transfer-core conformance suite, unchanged, over libfabric providers
//! on loopback: `tcp;ofi_rxm` and `shm`. Skips, saying why, where
//! libfabric or the provider is missing (fails instead for a provider
//! `TRANSFER_REQUIRE` names).

use transfer_core::conformance::Harness;
use transfer_core::{ProgressMode, Result, TransferEngine};
use transfer_efa::{LibfabricConfig, Library, Provider, open_loopback_domains};

struct LibfabricHarness {
    config: LibfabricConfig,
    progress: ProgressMode,
}

impl Harness for LibfabricHarness {
    fn engines(&self, count: usize, nics: usize) -> Result<Vec<TransferEngine>> {
        (0..count)
            .map(|_| {
                let engine = TransferEngine::builder()
                    .progress(self.progress)
                    .group(open_loopback_domains(&self.config, nics)?)
                    .build()?;
                // Caller-driven engines get a polling thread (the cases
                // expect engines that move on their own).
                transfer_core::testing::drive_in_background(&engine);
                Ok(engine)
            })
            .collect()
    }
}

/// The harness, or `None` (skipped, or failed when `TRANSFER_REQUIRE`
/// names the provider).
fn harness(provider: Provider) -> Option<LibfabricHarness> {
    let name = provider.to_string();
    if let Err(e) = Library::load() {
        transfer_core::testing::skip_or_fail(&name, e);
        return None;
    }
    let config = LibfabricConfig::loopback(provider);
    if let Err(e) = open_loopback_domains(&config, 1) {
        transfer_core::testing::skip_or_fail(&name, format!("cannot open a domain: {e}"));
        return None;
    }
    Some(LibfabricHarness {
        config,
        progress: ProgressMode::Thread,
    })
}

/// The same harness with caller-driven engines.
fn caller_driven(provider: Provider) -> Option<LibfabricHarness> {
    harness(provider).map(|h| LibfabricHarness {
        progress: ProgressMode::Caller,
        ..h
    })
}

mod tcp {
    use super::*;
    transfer_core::conformance_tests!(harness(Provider::Tcp));
}

/// Caller-driven progress over tcp: every case, each engine driven by a
/// polling thread that races the cases' own waits.
mod tcp_caller_driven {
    use super::*;
    transfer_core::conformance_tests!(caller_driven(Provider::Tcp));
}

mod shm {
    use super::*;
    // Every case, `refused_requests` included (issue 22: it was ignored;
    // the engine now replaces the transmit endpoint a refused write wedges,
    // see transfer-efa's `domain/connection.rs`).
    transfer_core::conformance_tests!(harness(Provider::Shm));
}
