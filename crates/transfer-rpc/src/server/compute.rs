//! The compute backend behind GRAPH_COMPUTE / GRAPH_RECOMPUTE.

use super::registry::BufferRegistry;
use crate::error::{Result, RpcError};
use crate::validate::ValidatedGraph;

/// Runs validated graphs on a device. Implementations receive graphs that
/// passed [`crate::validate::validate_graph`], for GRAPH_COMPUTE and again
/// (the stored graph) for every GRAPH_RECOMPUTE. On every call they must
/// range-check the indices of `ValidatedGraph::upfront_index_checks` and
/// `ValidatedGraph::deferred_index_checks` against current memory, holding
/// the graph's buffers locked from the checks until the last node ran (a
/// buffer handle is a capability: another session may write the indices
/// between validation and the run). Engine NIC writes (feature `engine`)
/// ignore those locks, so the kernels must read a checked private copy of
/// the indices, not the shared buffer (as `GgmlCpuBackend` does).
/// They must refuse (not abort on) shapes their kernels cannot take.
pub trait ComputeBackend: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> &str;

    /// Computes every node of `graph`, reading and writing `memory`.
    fn compute(&self, graph: &ValidatedGraph, memory: &BufferRegistry) -> Result<()>;

    /// Buffers were freed: drop whatever the backend holds of them (a
    /// worker process's mappings keep their memory otherwise).
    fn buffers_freed(&self) {}
}

/// A backend that refuses every graph with a clear error. This crate ships
/// no ggml compute yet: results are never faked.
#[derive(Debug, Clone, Copy, Default)]
pub struct RefusingBackend;

impl ComputeBackend for RefusingBackend {
    fn name(&self) -> &str {
        "none (graph compute refused)"
    }

    fn compute(&self, _graph: &ValidatedGraph, _memory: &BufferRegistry) -> Result<()> {
        Err(RpcError::Compute {
            call: "GRAPH_COMPUTE",
            reason: "this server has no compute backend (built without ggml)".into(),
        })
    }
}
