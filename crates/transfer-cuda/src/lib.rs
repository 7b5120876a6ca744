//! # transfer-cuda
//!
//! GPU memory registration and GPU-to-CPU signalling for transfer-core.
//!
//! - [`driver`](mod@driver), [`context`]: the CUDA driver API, loaded at run time
//!   (`libcuda.so.1`); no toolkit at build time, a typed error (never a
//!   panic) on machines without a driver or GPU.
//! - [`memory`], [`slots`], [`watcher`]: UVM watchers. GPU code bumps
//!   64-bit slots in host-mapped pinned memory; one thread reports
//!   `(slot, old, new)` to each slot's callback. The memory is behind
//!   [`MemoryProvider`], so the allocator and watcher run on plain host
//!   memory in tests.
//! - [`kernels`], [`signal`]: bumping a slot from a stream (embedded PTX,
//!   capturable into CUDA graphs; `cuStreamWriteValue64` as the alternative).
//! - [`gdr`], [`flag`], [`imm_flag`]: CPU-to-GPU flags through GDRCopy, or
//!   host-mapped memory without it; set when an immediate counter completes.
//! - [`layers`]: the KV-cache pattern: a slot per layer whose callback
//!   submits that layer's pages as a paged write with an immediate.
//! - [`device`], [`dmabuf`], [`register`]: device memory, dma-buf export and
//!   registration through [`transfer_core::TransferEngine::register_raw`].
//!
//! ## Testing
//!
//! Without a GPU, `cargo test -p transfer-cuda` runs the allocator, watcher
//! and engine-integration tests on plain host memory, checks the PTX with
//! `ptxas` when one is available, and dry-runs every GPU check against a
//! fake `libcuda.so.1`/`libgdrapi.so.2` (`tests/fake-libcuda`, built with
//! `cc`). `tests/gpu.rs` holds the real GPU checks; they print
//! `skipped: <reason>` without a GPU. `gpu-check.sh` builds that binary and
//! the `kv_cache` example here (no CUDA toolkit needed), and
//! `gpu-check.sh run` runs them unchanged on a GPU machine.

pub mod context;
pub mod device;
pub mod dmabuf;
pub mod driver;
pub mod error;
pub mod flag;
pub mod gdr;
mod idle;
pub mod imm_flag;
pub mod kernels;
pub mod layers;
pub mod memory;
pub mod register;
pub mod signal;
pub mod slots;
pub mod watcher;

pub use context::CudaContext;
pub use device::{DeviceBuffer, Stream};
pub use dmabuf::{DmaBuf, export_dmabuf};
pub use driver::{Driver, driver};
pub use error::{CudaError, Result};
pub use flag::{FlagBackend, FlagSink, GpuFlag};
pub use imm_flag::{FlagArm, set_flag_on_imm};
pub use kernels::DeviceKernels;
pub use layers::{LayerPages, LayerSender};
pub use memory::{MappedBlock, MemoryProvider, PinnedHostMemory, PlainHostMemory};
pub use register::{DeviceRegion, RegistrationPath, register_cuda_span, register_device_memory};
pub use signal::{SignalMethod, SlotSignal};
pub use slots::{SlotAddr, SlotAllocator, SlotId};
pub use watcher::{WatchControl, WatchEvent, Watcher, WatcherConfig, WatcherStats};
