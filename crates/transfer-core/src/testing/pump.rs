//! A background driver for caller-driven engines in tests: the conformance
//! suite's cases are written against engines that move on their own, so a
//! harness that hands out [`crate::ProgressMode::Caller`] engines gives
//! each one a plain polling thread, as an application's event loop would.
//! The suite's own waits then race that thread for the same NICs, which is
//! the concurrency caller progress must get right.

use crate::engine::TransferEngine;

/// Starts a thread that calls `progress` on `engine` until it is dropped;
/// nothing for an engine with worker threads.
pub fn drive_in_background(engine: &TransferEngine) {
    let Some(handle) = engine.progress_handle() else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("transfer-test-pump".into())
        .spawn(move || {
            while !handle.is_closed() {
                if !handle.progress() {
                    std::thread::yield_now();
                }
            }
        });
    // Without the pump the cases fail on their timeouts, naming what hung.
    drop(spawned);
}
