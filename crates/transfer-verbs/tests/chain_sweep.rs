//! Measurement, not a check (ignored by default): paged-write throughput
//! against WRs per doorbell and the signalling interval, on whatever verbs
//! device is present. Run: `chain_sweep --ignored --nocapture`.

#![allow(clippy::unwrap_used)] // measurement helper

use std::time::{Duration, Instant};

use transfer_core::{PagedWriteRequest, Pages, TransferEngine};
use transfer_verbs::{VerbsConfig, VerbsDomain};

fn engine(cfg: &VerbsConfig) -> TransferEngine {
    TransferEngine::builder()
        .group(VerbsDomain::open_many(cfg, 1).unwrap())
        .build()
        .unwrap()
}

#[test]
#[ignore = "measurement; run explicitly on a device"]
fn chain_sweep() {
    if VerbsDomain::open(VerbsConfig::from_env()).is_err() {
        eprintln!("skipped: no verbs device");
        return;
    }
    let pages = 2048usize;
    let page = 4096u64;
    eprintln!("paged write of {pages} x {page} B, best of 5");
    for (chain, interval) in [
        (1, 16),
        (2, 16),
        (4, 16),
        (8, 16),
        (16, 16),
        (4, 1),
        (4, 64),
    ] {
        let cfg = VerbsConfig::from_env()
            .chain_len(chain)
            .signal_interval(interval);
        let (a, b) = (engine(&cfg), engine(&cfg));
        let src = a.alloc_host(pages * page as usize, 0).unwrap();
        let dst = b.alloc_host(pages * page as usize, 0).unwrap();
        let peer = a.peer(b.address()).unwrap();
        let t = a.remote(&peer, dst.remote().clone()).unwrap();
        let idx: Vec<u32> = (0..pages as u32).collect();
        let mut best = Duration::MAX;
        for round in 0..6 {
            let t0 = Instant::now();
            a.paged_write(PagedWriteRequest {
                src: &src,
                src_pages: Pages {
                    indices: idx.clone(),
                    stride: page,
                    offset: 0,
                },
                dst: &t,
                dst_pages: Pages {
                    indices: idx.clone(),
                    stride: page,
                    offset: 0,
                },
                page_len: page,
                imm: None,
            })
            .unwrap()
            .wait_timeout(Duration::from_secs(120))
            .unwrap();
            // Round 0 includes the handshake.
            if round > 0 {
                best = best.min(t0.elapsed());
            }
        }
        let gbps = (pages as f64 * page as f64 * 8.0) / best.as_secs_f64() / 1e9;
        eprintln!(
            "chain_len {chain:2} signal_interval {interval:2}: {:8.1} us/page, {gbps:6.2} Gbit/s",
            best.as_secs_f64() * 1e6 / pages as f64
        );
    }
}
