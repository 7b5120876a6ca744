//! The receiver's "it has landed" signal: an immediate counter reaching its
//! target sets a flag, through transfer-cuda's [`set_flag_on_imm`] and its
//! [`FlagSink`] abstraction. Here the flag is host memory polled by the
//! waiting thread. With a GPU the same call takes a `transfer_cuda::GpuFlag`
//! (GDRCopy mapping of GPU memory, or host-mapped pinned memory) and a
//! kernel polls it instead; nothing else in the workloads changes. That
//! form is not built here: this machine has no GPU to run it on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use transfer_core::TransferEngine;
use transfer_cuda::{FlagArm, FlagSink, set_flag_on_imm};

use crate::error::{Result, protocol};

/// A `u64` in host memory (the host form of a GPU flag).
#[derive(Debug, Default)]
pub struct HostFlag(AtomicU64);

impl FlagSink for HostFlag {
    fn set(&self, value: u64) -> transfer_cuda::Result<()> {
        self.0.store(value, Ordering::Release);
        Ok(())
    }
}

/// One armed counter: set to `value` once `count` immediates `imm` arrived.
pub struct Armed {
    flag: Arc<HostFlag>,
    arm: FlagArm,
    value: u64,
    what: &'static str,
}

/// Arms a counter on `engine`: the flag becomes `value` once `count`
/// immediates `imm` have arrived (consumed, as expectations are). `value`
/// differs per iteration so a flag left from the last one never passes.
pub fn arm(engine: &TransferEngine, imm: u32, count: u64, value: u64, what: &'static str) -> Armed {
    let flag = Arc::new(HostFlag::default());
    let arm = set_flag_on_imm(engine, imm, count, flag.clone(), value);
    Armed {
        flag,
        arm,
        value,
        what,
    }
}

impl Armed {
    /// Whether the counter reached its target.
    pub fn is_set(&self) -> bool {
        self.flag.0.load(Ordering::Acquire) == self.value
    }

    /// Polls (yielding) until the counter reached its target or `deadline` passed.
    ///
    /// Yielding, not sleeping: with waits that slept 50 µs between polls
    /// after 200 µs of yielding, kv `--quick` over tcp took 58-67 ms to the
    /// last layer against 22-35 ms with yielding (two runs each, release
    /// build, load average ~8 on 2 cores).
    pub fn wait(&self, deadline: Instant) -> Result<()> {
        while !self.is_set() {
            if let Some(e) = self.arm.error() {
                return Err(protocol("workloads: flag", e.to_string()));
            }
            if Instant::now() > deadline {
                return Err(protocol(
                    "workloads: wait",
                    format!("{} never arrived", self.what),
                ));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}
