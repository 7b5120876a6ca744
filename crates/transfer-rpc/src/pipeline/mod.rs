//! The pipeline coordinator: a llama-architecture GGUF layer-split over
//! RPC servers, decoding greedily for B independent streams.
//!
//! - [`gguf`], [`model`]: the model file and its hyperparameters.
//! - [`synthetic`]: random-weight llama GGUFs for tests and benchmarks.
//! - [`placement`]: tensor-split ratios to layer ranges.
//! - [`remote_alloc`], [`stage_graph`], [`stage`]: one stage on one server
//!   (buffers, llama graph built with ggml's builders, weights, KV cache).
//! - [`boundary`]: how the hidden state crosses each stage boundary (hub,
//!   direct, and the hooks an engine path uses).
//! - [`decode`]: the greedy decode loop; [`groups`]: G pipelines at once in
//!   a ring over the same servers; [`counters`], [`report`]: what a run
//!   measured.

pub mod boundary;
pub mod counters;
pub mod decode;
pub mod gguf;
pub mod groups;
pub mod md5;
pub mod model;
pub mod placement;
pub mod remote_alloc;
pub mod report;
pub mod stage;
pub mod stage_graph;
pub mod synthetic;

pub use boundary::{Arm, Boundary, BoundaryPath, Fallback};
pub use decode::{
    DecodeOutput, Pipeline, PipelineConfig, argmax, default_prompts, prompts_of_lengths,
};
pub use groups::{GroupRun, GroupsResult, RunSpec, ring_endpoints, run_groups};
pub use model::{LlamaHparams, LlamaModel};
pub use report::RunReport;
pub use synthetic::{GgufWriter, SyntheticSpec};
