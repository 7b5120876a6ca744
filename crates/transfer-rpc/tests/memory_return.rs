//! Buffer memory goes back to the operating system when its session ends:
//! the resident set of a real `transfer-rpc-server` process, not only the
//! quota counter (a `Vec` per buffer stayed resident in glibc's heap once
//! its mmap threshold had grown past the buffer size).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::{Client, ClientConfig};

#[test]
fn a_finished_session_returns_its_buffers_to_the_os() {
    let server = ServerProcess::start(&["--mem", "512"]);
    let Some(before) = server.rss() else {
        println!("skipped: no /proc/PID/statm on this system");
        return;
    };
    const SIZES: [u64; 4] = [24 << 20, 40 << 20, 64 << 20, 2 << 20];
    let total: u64 = SIZES.iter().sum();
    for round in 0..3u8 {
        let mut c = Client::connect(&server.endpoint, ClientConfig::default()).unwrap();
        for &size in &SIZES {
            let (b, base) = alloc(&mut c, size);
            let t = f32_tensor(1, b, base, 0, (size / 4) as u32);
            c.set_tensor(&t, 0, &vec![round + 1; size as usize])
                .unwrap();
        }
        let during = server.rss().unwrap();
        assert!(
            during >= before + total * 9 / 10,
            "buffers written: rss {during} vs {before} before"
        );
        drop(c);
        // The session ends asynchronously; wait for the memory to go.
        let t0 = Instant::now();
        let mut after = server.rss().unwrap();
        while after >= before + (16 << 20) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            after = server.rss().unwrap();
        }
        println!(
            "round {round}: server rss {} MiB before, {} MiB with {} MiB of buffers, {} MiB after",
            before >> 20,
            during >> 20,
            total >> 20,
            after >> 20
        );
        assert!(
            after < before + (16 << 20),
            "round {round}: {} MiB still resident after the session ended",
            (after.saturating_sub(before)) >> 20
        );
    }
}
