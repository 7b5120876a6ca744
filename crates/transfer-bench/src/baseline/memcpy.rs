//! memcpy bandwidth: the physical limit of a shared-memory transfer here.

use std::time::Instant;

/// Bytes per second of a single-threaded copy of `len` bytes, best of `reps`.
pub fn bandwidth(len: usize, reps: usize) -> f64 {
    let src = vec![0x5Au8; len];
    let mut dst = vec![0u8; len];
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    if best > 0.0 { len as f64 / best } else { 0.0 }
}
