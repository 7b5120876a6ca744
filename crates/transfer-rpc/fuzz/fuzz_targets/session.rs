//! Whole sessions (alloc, set, mutated template graphs of every served op,
//! recompute, get, free, raw frames) against the real ggml-cpu compute.
//! A GGML_ASSERT, a fault or a sanitizer report is a finding.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use transfer_rpc::fuzz::SessionFuzzer;
use transfer_rpc::server::{GgmlCpuBackend, Server, ServerConfig};
use transfer_rpc::validate::GraphLimits;

fn fuzzer() -> &'static SessionFuzzer {
    static F: OnceLock<SessionFuzzer> = OnceLock::new();
    F.get_or_init(|| {
        let server = Server::bind(
            ServerConfig {
                bind: "127.0.0.1:0".into(),
                memory_quota: 64 << 20,
                max_buffer_size: 16 << 20,
                ..ServerConfig::default()
            },
            Arc::new(GgmlCpuBackend::new(1, 1, GraphLimits::default())),
        )
        .expect("bind");
        SessionFuzzer::new(Arc::clone(server.shared()))
    })
}

fuzz_target!(|data: &[u8]| {
    fuzzer().run(data);
});
