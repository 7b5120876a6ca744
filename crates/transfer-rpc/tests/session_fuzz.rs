//! The short fuzz pass CI runs: whole sessions from `transfer_rpc::fuzz`
//! (templates of every served op, mutated; raw frames) against the real
//! compute backend when built with `ggml` (else the validator alone).
//! Deterministic programs, bounded time; the long runs are `cargo fuzz`
//! (`fuzz/README.md`). A crash (abort, fault) fails the test binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use transfer_rpc::fuzz::{SessionFuzzer, template_programs};
use transfer_rpc::server::{ComputeBackend, Server, ServerConfig};

fn backend() -> Arc<dyn ComputeBackend> {
    #[cfg(feature = "ggml")]
    {
        Arc::new(transfer_rpc::server::GgmlCpuBackend::new(
            1,
            1,
            transfer_rpc::validate::GraphLimits::default(),
        ))
    }
    #[cfg(not(feature = "ggml"))]
    {
        Arc::new(transfer_rpc::server::RefusingBackend)
    }
}

fn fuzzer() -> SessionFuzzer {
    let server = Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 64 << 20,
            max_buffer_size: 16 << 20,
            ..ServerConfig::default()
        },
        backend(),
    )
    .unwrap();
    SessionFuzzer::new(Arc::clone(server.shared()))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn mutated_sessions_never_crash_the_server() {
    let f = fuzzer();
    for p in template_programs() {
        f.run(&p);
    }
    // Programs: a template, a few mutations, then random actions; budget
    // of seconds rather than a count, so a slow CI host still finishes.
    let budget = Duration::from_secs(
        std::env::var("TRANSFER_RPC_FUZZ_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let t0 = Instant::now();
    let mut runs = 0u64;
    while t0.elapsed() < budget {
        let len = 8 + (rng.next() % 120) as usize;
        let mut prog: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Start most programs with a mutated template graph.
        if rng.next() % 4 != 0 {
            prog[0] = 2;
        }
        f.run(&prog);
        runs += 1;
    }
    println!("{runs} session programs in {:?}", t0.elapsed());
    assert!(runs > 0);
}
