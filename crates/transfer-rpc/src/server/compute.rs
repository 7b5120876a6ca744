//! The compute backend behind GRAPH_COMPUTE / GRAPH_RECOMPUTE.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::registry::BufferRegistry;
use crate::error::{Result, RpcError};
use crate::validate::ValidatedGraph;

/// A validated graph as a session keeps it for GRAPH_RECOMPUTE.
#[derive(Debug, Clone)]
pub struct StoredGraph {
    /// The graph.
    pub graph: Arc<ValidatedGraph>,
    /// Unique for the life of the process ([`next_graph_key`]): backends
    /// key what they prepared for the graph by it.
    pub key: u64,
    /// [`BufferRegistry::removals`] when it was validated: while unchanged,
    /// every buffer it names is still there and GRAPH_RECOMPUTE need not
    /// check its tensors again.
    pub removals: u64,
    /// Its estimated work ([`super::fair::graph_work`]).
    pub work: u64,
}

/// A new graph key (never 0: 0 means "do not keep").
pub fn next_graph_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Most entries a [`KeyedCache`] keeps.
pub const PREPARED_GRAPHS: usize = 8;

/// What a backend prepared for recent graphs, by graph key, least recently
/// used first out. Bounded in entries ([`PREPARED_GRAPHS`]) and in the
/// tensors they hold together (at most one largest-allowed graph's worth),
/// so a backend holds no more than one graph of the limits would.
#[derive(Debug)]
pub struct KeyedCache<T> {
    entries: VecDeque<(u64, T, usize)>,
    tensors: usize,
}

impl<T> Default for KeyedCache<T> {
    fn default() -> Self {
        KeyedCache {
            entries: VecDeque::new(),
            tensors: 0,
        }
    }
}

impl<T> KeyedCache<T> {
    /// Removes and returns the entry for `key`.
    pub fn take(&mut self, key: u64) -> Option<T> {
        let i = self.entries.iter().position(|(k, _, _)| *k == key)?;
        let (_, v, n) = self.entries.remove(i)?;
        self.tensors -= n;
        Some(v)
    }

    /// Keeps `value` (of `tensors` tensors) under `key` as the most recent
    /// entry, dropping the oldest past the bounds (`max_tensors` together).
    pub fn put(&mut self, key: u64, value: T, tensors: usize, max_tensors: usize) {
        drop(self.take(key));
        if tensors > max_tensors {
            return;
        }
        while self.entries.len() >= PREPARED_GRAPHS || self.tensors + tensors > max_tensors {
            match self.entries.pop_front() {
                Some((_, _, n)) => self.tensors -= n,
                None => break,
            }
        }
        self.tensors += tensors;
        self.entries.push_back((key, value, tensors));
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.tensors = 0;
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

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

    /// [`ComputeBackend::compute`] for a graph a session keeps under `key`
    /// ([`StoredGraph::key`]; 0: not kept): a backend may reuse what it
    /// prepared for that key the last time (upstream's GRAPH_RECOMPUTE
    /// reuses its ggml graph), never the index checks.
    fn compute_keyed(
        &self,
        graph: &ValidatedGraph,
        memory: &BufferRegistry,
        key: u64,
    ) -> Result<()> {
        let _ = key;
        self.compute(graph, memory)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_cache_is_bounded_and_least_recently_used() {
        let mut c = KeyedCache::default();
        for k in 1..=10u64 {
            c.put(k, k, 1, 100);
        }
        assert_eq!(c.len(), PREPARED_GRAPHS);
        assert_eq!(c.take(1), None, "oldest dropped");
        assert_eq!(c.take(10), Some(10));
        // By tensors: a 60-tensor graph and a 50-tensor one do not fit 100.
        c.clear();
        c.put(1, 1, 60, 100);
        c.put(2, 2, 50, 100);
        assert_eq!((c.take(1), c.len()), (None, 1));
        c.put(3, 3, 101, 100);
        assert_eq!(c.take(3), None, "larger than the bound: not kept");
        assert_eq!(c.take(2), Some(2));
        assert!(c.is_empty());
    }
}
