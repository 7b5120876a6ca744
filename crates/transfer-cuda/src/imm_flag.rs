//! Engine integration of GPU flags: an immediate counter reaching its
//! target sets a flag that a kernel polls (e.g. "all layers of this
//! request's KV cache have arrived, start decoding").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use transfer_core::TransferEngine;

use crate::error::CudaError;
use crate::flag::FlagSink;

#[derive(Default)]
struct ArmState {
    fired: AtomicBool,
    error: Mutex<Option<CudaError>>,
}

/// Follows one [`set_flag_on_imm`]: whether the flag was set, and how.
#[derive(Clone, Default)]
pub struct FlagArm(Arc<ArmState>);

impl std::fmt::Debug for FlagArm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlagArm")
            .field("fired", &self.is_fired())
            .finish()
    }
}

impl FlagArm {
    /// Whether the expectation was met and the flag write attempted.
    pub fn is_fired(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }

    /// The error of the flag write, if it failed.
    pub fn error(&self) -> Option<CudaError> {
        self.0
            .error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Sets `flag` to `value` (on the engine's callback thread) once `count`
/// immediates `imm` have arrived; those arrivals are consumed, as with
/// [`TransferEngine::expect_imm`]. Use [`TransferEngine::expected_imms`] to
/// turn "N logical writes" into the count the sender's sharding delivers.
pub fn set_flag_on_imm<F: FlagSink + ?Sized>(
    engine: &TransferEngine,
    imm: u32,
    count: u64,
    flag: Arc<F>,
    value: u64,
) -> FlagArm {
    let arm = FlagArm::default();
    let state = arm.0.clone();
    engine.expect_imm(imm, count, move || {
        if let Err(e) = flag.set(value) {
            *state.error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
        }
        state.fired.store(true, Ordering::Release);
    });
    arm
}
