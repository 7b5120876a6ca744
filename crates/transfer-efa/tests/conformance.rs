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
    // Every case but `refused_requests` (below).
    transfer_core::conformance_tests!(@cases harness(Provider::Shm);
        write_single, write_with_imm, zero_byte_imm_write, write_sharded_multi_nic,
        paged_write, paged_write_multi_nic, scatter_group, barrier_group,
        send_recv_pool, imm_expect_before_and_after, many_threads,
        flag_and_future_notifications, unregister_rules,
        malformed_wire_input, drop_with_transfers_in_flight);
    transfer_core::conformance_tests!(@two_process harness(Provider::Shm));

    /// Last libfabric release whose shm source has the wedge below (read in
    /// v1.17.0 through v1.22.0; measured on the installed 1.17.0).
    const SHM_WEDGE_UNTIL: u32 = (1 << 16) | 22;

    /// `refused_requests` on shm: the case runs (not `#[ignore]`d, issue
    /// 22) and, up to libfabric 1.22, must fail exactly at its last step
    /// for a reason inside shm that no engine can undo; on a later
    /// libfabric it must pass unchanged.
    ///
    /// Why (libfabric 1.17.0 shm, delivery-complete writes, which the
    /// engine uses so that a refused write is reported at all):
    /// - The target's `smr_progress_cmd_rma` returns as soon as
    ///   `ofi_mr_map_verify` refuses the key or range, before it writes the
    ///   response the writer waits for; so the refused `fi_writemsg`
    ///   (returned 0) never completes, neither as success nor as error.
    /// - Small writes use shm's SAR protocol: `smr_format_sar` sets the
    ///   peer's `sar_status`, which only that response clears
    ///   (`smr_progress_resp_entry`); until then `smr_generic_rma` answers
    ///   every `fi_writemsg` to that peer with `-FI_EAGAIN`. Measured with
    ///   a C program against the installed 1.17.0 (two shm endpoints, 64 B
    ///   writes): a good write completes; the wrong-key write returns 0 and
    ///   has no completion after 3 s; the next good write got -FI_EAGAIN
    ///   (-11) 1013 times in 3 s, never 0.
    /// - Large writes (64 KiB, CMA iov protocol) post, but
    ///   `smr_progress_resp` stops at the unanswered response at the head of
    ///   the writer endpoint's response queue, so the next good write's
    ///   completion never came either (measured, 3 s) — for any peer of
    ///   that endpoint.
    /// - Without FI_DELIVERY_COMPLETE a 64 B wrong-key write completes as a
    ///   success (the refusal is lost: the case's "wrong key succeeded"
    ///   check), and a 64 KiB one wedges as above.
    ///
    /// Only closing the endpoint clears that state, and that unlinks the
    /// shared-memory region every peer has mapped under this engine's
    /// published address. So the engine reports the refused write by its
    /// peer timeout and marks the peer dead (the case's "write after
    /// failures" is then refused at once instead of hanging), which is what
    /// this test checks on the affected versions.
    #[test]
    fn refused_requests() {
        let Some(h) = harness(Provider::Shm) else {
            return;
        };
        let lib = Library::load().expect("harness() loaded it");
        let r = transfer_core::conformance::run_case(&h, "refused_requests");
        if lib.version() > SHM_WEDGE_UNTIL {
            assert!(r.is_ok(), "libfabric {}: {r:?}", lib.version_string());
            return;
        }
        let e = match r {
            Ok(()) => panic!(
                "refused_requests passes on shm with libfabric {}: the wedge is gone, \
                 drop SHM_WEDGE_UNTIL and require the pass",
                lib.version_string()
            ),
            Err(e) => e,
        };
        // Every earlier step passed (refusals at submit, the wrong key and
        // the lying length reported as errors); only the write after them
        // fails, on the peer the refused write wedged.
        assert!(
            e.starts_with("write after failures") && e.contains("dead"),
            "libfabric {}: failed elsewhere than at the known shm wedge: {e}",
            lib.version_string()
        );
        println!(
            "libfabric {} shm: a refused write wedges its peer (see the test's comment): {e}",
            lib.version_string()
        );
    }
}
