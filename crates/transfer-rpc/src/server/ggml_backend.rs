//! Graph compute on ggml's CPU backend (feature `ggml`).
//!
//! The graph arrives validated ([`crate::validate::validate_graph`]); this
//! backend additionally applies the per-op allowlist and shape rules of
//! [`crate::validate::op_shapes`], asks ggml whether it supports every
//! node, write-locks every buffer the graph touches, rebuilds the tensors
//! in a no-alloc ggml context pointing into those buffers, and runs the
//! nodes. Every index tensor (GET_ROWS, GET_ROWS_BACK, SET_ROWS, ADD_ID,
//! MUL_MAT_ID and SSM_SCAN read rows, experts or states by tensor data) is
//! range-checked in the locked memory on every execution (GRAPH_COMPUTE
//! and GRAPH_RECOMPUTE alike): those no node writes before the first node
//! runs; those an earlier node may write (computed indices) split the
//! graph: the nodes before run first, then the indices are checked, then
//! the rest runs.
//!
//! The ggml tensors of a graph are built once and kept (bounded, by the
//! key of the session's stored graph) while its buffers stay where they
//! were: GRAPH_RECOMPUTE reruns them, with every index check done again.
//!
//! The buffer write locks are taken before the first check and released
//! after the last node, so no other session's SET_TENSOR, SET_TENSOR_HASH,
//! MEMSET_TENSOR, BUFFER_CLEAR or COPY_TENSOR (nor a peer's direct copy,
//! which arrives as SET_TENSOR) can change an index between its check and
//! the kernel that reads it. One writer ignores those locks: with feature
//! `engine`, a remote peer given an ENGINE_OPEN_INBOUND lane on a buffer
//! writes it with the NIC at any time. So the kernels do not read indices
//! from the shared buffers at all: each check reads the indices into a
//! private copy, checks the copy, and the index node reads that copy
//! ([`PinnedIndices`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use llama_cpp_sys_2 as sys;

use super::compute::{ComputeBackend, KeyedCache};
use super::registry::{BufferRegistry, LockedMemory};
use crate::error::{Result, RpcError};
use crate::validate::op_shapes::check_graph_ops;
use crate::validate::{
    BufferLookup, GraphLimits, Region, ValidatedGraph, check_index_bytes, index_slot, index_tensor,
};

const CALL: &str = "GRAPH_COMPUTE (ggml)";

fn fail<T>(reason: impl Into<String>) -> Result<T> {
    Err(RpcError::Compute {
        call: CALL,
        reason: reason.into(),
    })
}

/// An owned `ggml_backend_t`.
struct BackendPtr(sys::ggml_backend_t);

// SAFETY: a ggml CPU backend may be used from any thread as long as calls
// are not concurrent; every use goes through the `Mutex` that owns it.
unsafe impl Send for BackendPtr {}

impl Drop for BackendPtr {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_backend_cpu_init and is freed once.
        unsafe { sys::ggml_backend_free(self.0) }
    }
}

/// One device: its ggml backend and the graphs prepared on it.
#[derive(Default)]
struct Device {
    backend: Option<BackendPtr>,
    prepared: KeyedCache<Prepared>,
}

/// ggml's CPU backend, one instance per device, created on first use.
pub struct GgmlCpuBackend {
    threads: i32,
    devices: Vec<Mutex<Device>>,
    limits: GraphLimits,
}

impl std::fmt::Debug for GgmlCpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgmlCpuBackend(threads {})", self.threads)
    }
}

impl GgmlCpuBackend {
    /// A backend for `devices` devices using `threads` compute threads each.
    pub fn new(devices: u32, threads: usize, limits: GraphLimits) -> Self {
        GgmlCpuBackend {
            threads: i32::try_from(threads.max(1)).unwrap_or(1),
            devices: (0..devices.max(1))
                .map(|_| Mutex::new(Device::default()))
                .collect(),
            limits,
        }
    }
}

/// Frees a ggml context and wrapped buffers on every exit path.
struct Scratch {
    ctx: *mut sys::ggml_context,
    buffers: Vec<sys::ggml_backend_buffer_t>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for &b in &self.buffers {
            // SAFETY: each came from ggml_backend_cpu_buffer_from_ptr, freed once;
            // freeing a from_ptr buffer does not free the memory it wraps.
            unsafe { sys::ggml_backend_buffer_free(b) }
        }
        if !self.ctx.is_null() {
            // SAFETY: ctx came from ggml_init and is freed once.
            unsafe { sys::ggml_free(self.ctx) }
        }
    }
}

/// Reads index tensors straight from the locked buffers.
struct LockedLookup<'a> {
    mem: &'a HashMap<u64, LockedMemory>,
    regions: HashMap<u64, Region>,
}

impl BufferLookup for LockedLookup<'_> {
    fn region(&self, handle: u64) -> Option<Region> {
        self.regions.get(&handle).copied()
    }

    fn read(&self, handle: u64, offset: u64, len: u64) -> Option<Vec<u8>> {
        let m = self.mem.get(&handle)?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > m.len {
            return None;
        }
        let n = end - start;
        let mut out: Vec<u8> = Vec::new();
        out.try_reserve_exact(n).ok()?;
        // A raw copy, never a `&[u8]` over the buffer: an engine peer's NIC
        // may write these bytes at any time (outside the buffer locks), and
        // a shared reference would promise they do not change
        // (`host_memory.rs`). A torn read is harmless: the copy is what
        // gets checked and what the kernel reads.
        // SAFETY: [start, end) lies inside the buffer's mapping, which stays
        // mapped while this thread holds it write-locked for the compute;
        // `out` has room for `n` bytes and does not overlap the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(m.ptr.add(start), out.as_mut_ptr(), n);
            out.set_len(n);
        }
        Some(out)
    }
}

/// 64 bytes aligned like ggml's tensor data (`TENSOR_ALIGNMENT` is 32).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct IndexBlock([u8; 64]);

/// Private, checked copies of index tensors that index nodes read
/// instead of the shared buffer: what a kernel reads is exactly what was
/// checked, whoever writes the buffer after the check (an engine peer's
/// NIC write, outside the buffer locks, included).
struct PinnedIndices {
    copies: Vec<Vec<IndexBlock>>,
    /// Index elements that may still be copied in this execution: bounds
    /// the memory the copies hold.
    elements_left: u64,
}

impl PinnedIndices {
    /// Reads the indices of index node `node` from locked memory, checks
    /// them, keeps the checked copy and points the node's index source at
    /// it (a new tensor of `ctx` in a ggml buffer wrapping the copy).
    #[allow(clippy::too_many_arguments)]
    fn pin(
        &mut self,
        g: &ValidatedGraph,
        node: usize,
        lookup: &LockedLookup<'_>,
        limits: &GraphLimits,
        ctx: *mut sys::ggml_context,
        ptrs: &[*mut sys::ggml_tensor],
        scratch: &mut Scratch,
    ) -> Result<()> {
        let ix = index_tensor(g, node)?;
        let (t, c) = (&g.tensors[ix], &g.checked[ix]);
        let elements: u64 = t.ne.iter().map(|&d| u64::from(d)).product();
        if elements > self.elements_left {
            return Err(RpcError::refused(
                CALL,
                format!(
                    "the graph's index tensors hold more than {} elements in total",
                    limits.max_index_elements
                ),
            ));
        }
        self.elements_left -= elements;
        let Some((region, start)) = c.placement else {
            return fail("index tensor without a buffer");
        };
        let Some(bytes) = lookup.read(region.handle, start, c.nbytes) else {
            return fail("index tensor could not be read");
        };
        check_index_bytes(g, node, &bytes, limits)?;
        let mut copy = vec![IndexBlock([0; 64]); bytes.len().div_ceil(64).max(1)];
        // SAFETY: `copy` holds at least bytes.len() bytes (whole blocks of
        // plain bytes); the two allocations are distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                copy.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            );
        }
        let len = copy.len() * 64;
        let data = copy.as_mut_ptr().cast::<c_void>();
        // Moving `copy` into `copies` keeps its heap block where it is.
        self.copies.push(copy);
        // SAFETY: `data` is 64-byte aligned, `len` bytes long, and outlives
        // the wrapper (`copies` is dropped after `scratch`, which frees it).
        let buf = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(data, len) };
        if buf.is_null() {
            return fail("ggml_backend_cpu_buffer_from_ptr failed");
        }
        scratch.buffers.push(buf);
        // SAFETY: ctx is live and was sized with one extra tensor per index
        // node; the type and shape were validated.
        let p = unsafe {
            sys::ggml_new_tensor_4d(
                ctx,
                t.ty,
                i64::from(t.ne[0]),
                i64::from(t.ne[1]),
                i64::from(t.ne[2]),
                i64::from(t.ne[3]),
            )
        };
        if p.is_null() {
            return fail("ggml_new_tensor_4d failed");
        }
        let Some(&consumer) = ptrs.get(node) else {
            return fail("index node out of range");
        };
        let Some(slot) = g.tensors.get(node).and_then(|t| index_slot(t.op)) else {
            return fail("not an index node");
        };
        // SAFETY: p and consumer are live tensors of ctx; the copy holds the
        // index tensor's whole extent (`nbytes` under the same strides).
        unsafe {
            let tp = &mut *p;
            for k in 0..4 {
                tp.nb[k] = t.nb[k] as usize;
            }
            tp.buffer = buf;
            tp.data = data;
            (*consumer).src[slot] = p;
        }
        Ok(())
    }
}

/// A graph turned into ggml tensors once, kept for GRAPH_RECOMPUTE (upstream
/// keeps its ggml graph the same way): the context with one tensor per
/// record, the ggml buffers wrapping the locked memory they point into, and
/// where that memory was. Valid while no buffer was removed from the
/// registry and every buffer is still at the address it was built for.
struct Prepared {
    /// Owns (frees on drop) the context and the wrappers.
    _objects: Scratch,
    ptrs: Vec<*mut sys::ggml_tensor>,
    /// `BufferRegistry::removals` when built.
    removals: u64,
    /// Each buffer's address when built.
    memory: Vec<(u64, usize)>,
    /// Tensor records (the cache's memory bound counts them).
    tensors: usize,
}

// SAFETY: the ggml objects are only touched by the thread that holds the
// device's mutex, which owns the cache.
unsafe impl Send for Prepared {}

impl Prepared {
    fn still_valid(&self, removals: u64, mem: &HashMap<u64, LockedMemory>) -> bool {
        self.removals == removals
            && self.memory.len() == mem.len()
            && self
                .memory
                .iter()
                .all(|(h, p)| mem.get(h).is_some_and(|m| m.ptr as usize == *p))
    }
}

impl ComputeBackend for GgmlCpuBackend {
    fn name(&self) -> &str {
        "ggml-cpu"
    }

    fn compute(&self, graph: &ValidatedGraph, memory: &BufferRegistry) -> Result<()> {
        self.compute_keyed(graph, memory, 0)
    }

    fn compute_keyed(
        &self,
        graph: &ValidatedGraph,
        memory: &BufferRegistry,
        key: u64,
    ) -> Result<()> {
        let slot = self
            .devices
            .get(graph.device as usize)
            .ok_or_else(|| RpcError::refused(CALL, "no such device"))?;
        let mut dev = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if dev.backend.is_none() {
            // SAFETY: plain constructor; null is checked below.
            let b = unsafe { sys::ggml_backend_cpu_init() };
            if b.is_null() {
                return fail("ggml_backend_cpu_init failed");
            }
            // SAFETY: b is a live CPU backend.
            unsafe { sys::ggml_backend_cpu_set_n_threads(b, self.threads) };
            dev.backend = Some(BackendPtr(b));
        }
        let Some(be) = dev.backend.as_ref().map(|b| b.0) else {
            return fail("no backend");
        };
        let removals = memory.removals();
        let cached = (key != 0).then(|| dev.prepared.take(key)).flatten();
        let handles = match &cached {
            Some(p) => p.memory.iter().map(|&(h, _)| h).collect(),
            None => {
                check_graph_ops(graph)?;
                let mut hs: Vec<u64> = graph
                    .checked
                    .iter()
                    .filter_map(|c| c.placement.map(|(r, _)| r.handle))
                    .collect();
                hs.sort_unstable();
                hs.dedup();
                hs
            }
        };
        let limit = self.limits.max_tensors;
        memory.with_locked(CALL, &handles, |mem| {
            let prepared = match cached {
                Some(p) if p.still_valid(removals, mem) => p,
                // Built again when a buffer went or moved (its ops were
                // checked when it was first built).
                _ => self.build(be, graph, mem, removals)?,
            };
            self.run(be, graph, mem, &prepared)?;
            // Only a graph that ran cleanly is kept (a failed run may have
            // left an index node pointing at its dropped private copy).
            if key != 0 {
                let n = prepared.tensors;
                dev.prepared.put(key, prepared, n, limit);
            }
            Ok(())
        })?
    }

    fn buffers_freed(&self) {
        for d in &self.devices {
            // A busy device drops stale entries when it next looks them up.
            if let Ok(mut dev) = d.try_lock() {
                dev.prepared.clear();
            }
        }
    }
}

impl GgmlCpuBackend {
    /// Builds the ggml tensors of `g` over the locked memory.
    fn build(
        &self,
        be: sys::ggml_backend_t,
        g: &ValidatedGraph,
        mem: &HashMap<u64, LockedMemory>,
        removals: u64,
    ) -> Result<Prepared> {
        let n = g.tensors.len();
        // SAFETY: pure size computation.
        let mem_size =
            unsafe { n.saturating_mul(sys::ggml_tensor_overhead()) }.saturating_add(1 << 16);
        let params = sys::ggml_init_params {
            mem_size,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml_init with no_alloc only allocates its own arena; null checked.
        let ctx = unsafe { sys::ggml_init(params) };
        let mut scratch = Scratch {
            ctx,
            buffers: Vec::new(),
        };
        if ctx.is_null() {
            return fail("ggml_init failed");
        }
        let mut wrapped: HashMap<u64, sys::ggml_backend_buffer_t> = HashMap::new();
        for (&h, m) in mem {
            // SAFETY: m.ptr/m.len describe a live, 64-byte aligned allocation
            // that outlives the wrapper: the wrapper is used only while the
            // buffer is locked and still at this address (`still_valid`).
            let b = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(m.ptr.cast::<c_void>(), m.len) };
            if b.is_null() {
                return fail("ggml_backend_cpu_buffer_from_ptr failed");
            }
            scratch.buffers.push(b);
            wrapped.insert(h, b);
        }

        let mut ptrs: Vec<*mut sys::ggml_tensor> = Vec::with_capacity(n);
        for (t, c) in g.tensors.iter().zip(&g.checked) {
            let Some((region, offset)) = c.placement else {
                return fail("tensor without a buffer");
            };
            let (Some(m), Some(&buf)) = (mem.get(&region.handle), wrapped.get(&region.handle))
            else {
                return fail("buffer not locked");
            };
            let Ok(off) = usize::try_from(offset) else {
                return fail("offset too large");
            };
            if off
                .checked_add(usize::try_from(c.nbytes).unwrap_or(usize::MAX))
                .is_none_or(|e| e > m.len)
            {
                return fail("tensor outside its buffer");
            }
            // SAFETY: ctx is live; the shape was validated (type known, counts fit i64).
            let p = unsafe {
                sys::ggml_new_tensor_4d(
                    ctx,
                    t.ty,
                    i64::from(t.ne[0]),
                    i64::from(t.ne[1]),
                    i64::from(t.ne[2]),
                    i64::from(t.ne[3]),
                )
            };
            if p.is_null() {
                return fail("ggml_new_tensor_4d failed");
            }
            // SAFETY: p points to a tensor owned by ctx; the data pointer lies
            // inside the locked buffer with the tensor's whole extent (checked
            // above and by validation).
            unsafe {
                let tp = &mut *p;
                for k in 0..4 {
                    tp.nb[k] = t.nb[k] as usize;
                }
                tp.op = t.op;
                tp.op_params = t.op_params;
                tp.flags = t.flags;
                tp.buffer = buf;
                tp.data = m.ptr.add(off).cast::<c_void>();
                for (d, s) in tp.name.iter_mut().zip(t.name.iter()) {
                    *d = *s as std::os::raw::c_char;
                }
                tp.name[63] = 0;
            }
            ptrs.push(p);
        }
        for i in 0..n {
            // SAFETY: all pointers are live tensors of ctx; indices were resolved
            // by validation (in range, acyclic).
            unsafe {
                let tp = &mut *ptrs[i];
                for (k, s) in g.srcs[i].iter().enumerate() {
                    tp.src[k] = s.map_or(std::ptr::null_mut(), |j| ptrs[j]);
                }
                if let Some(v) = g.view_src[i] {
                    tp.view_src = ptrs[v];
                    tp.view_offs = g.tensors[i].view_offs as usize;
                }
            }
        }
        for &node in &g.nodes {
            // SAFETY: live backend and tensor.
            if !unsafe { sys::ggml_backend_supports_op(be, ptrs[node]) } {
                return fail(format!(
                    "ggml-cpu does not support op {} here",
                    g.tensors[node].op
                ));
            }
        }
        Ok(Prepared {
            _objects: scratch,
            ptrs,
            removals,
            memory: mem.iter().map(|(&h, m)| (h, m.ptr as usize)).collect(),
            tensors: n,
        })
    }

    /// Runs the nodes of a prepared graph: index checks against the locked
    /// memory first (and between segments), every time.
    fn run(
        &self,
        be: sys::ggml_backend_t,
        g: &ValidatedGraph,
        mem: &HashMap<u64, LockedMemory>,
        prepared: &Prepared,
    ) -> Result<()> {
        let segments = g.deferred_index_checks.len() + 1;
        let index_nodes = g.upfront_index_checks.len() + g.deferred_index_checks.len();
        // This run's ggml objects (its graphs and the private index
        // copies' tensors) live in their own context, so that a prepared
        // graph's context never grows.
        // SAFETY: pure size computations.
        let mem_size =
            unsafe {
                index_nodes
                    .saturating_mul(sys::ggml_tensor_overhead())
                    .saturating_add(segments.saturating_mul(sys::ggml_graph_overhead_custom(
                        g.nodes.len().max(1),
                        false,
                    )))
                    .saturating_add(1 << 12)
            };
        let params = sys::ggml_init_params {
            mem_size,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // Declared before `scratch`, so dropped after the ggml buffers that
        // wrap these copies.
        let mut pinned = PinnedIndices {
            copies: Vec::new(),
            elements_left: self.limits.max_index_elements,
        };
        // SAFETY: ggml_init with no_alloc only allocates its own arena; null checked.
        let ctx = unsafe { sys::ggml_init(params) };
        let mut scratch = Scratch {
            ctx,
            buffers: Vec::new(),
        };
        if ctx.is_null() {
            return fail("ggml_init failed");
        }
        let ptrs = &prepared.ptrs;
        let lookup = LockedLookup {
            mem,
            // Only index checks look buffers up: the buffers of the index
            // tensors (not a map of every tensor's buffer, built on every
            // run of a llama graph: its KV stores are SET_ROWS nodes).
            regions: g
                .upfront_index_checks
                .iter()
                .chain(&g.deferred_index_checks)
                .filter_map(|&node| index_tensor(g, node).ok())
                .filter_map(|ix| g.checked.get(ix).and_then(|c| c.placement))
                .map(|(r, _)| (r.handle, r))
                .collect(),
        };
        for &node in &g.upfront_index_checks {
            pinned.pin(g, node, &lookup, &self.limits, ctx, ptrs, &mut scratch)?;
        }
        // Positions, not nodes: a node listed twice may need its indices
        // checked (and re-pinned) before each run.
        let mut cuts: Vec<usize> = g.deferred_index_positions.clone();
        cuts.sort_unstable();
        cuts.dedup();
        let mut start = 0usize;
        for end in cuts.iter().copied().chain(std::iter::once(g.nodes.len())) {
            if end > start {
                self.compute_range(be, ctx, g, ptrs, &g.nodes[start..end])?;
                start = end;
            }
            if end < g.nodes.len() {
                pinned.pin(
                    g,
                    g.nodes[end],
                    &lookup,
                    &self.limits,
                    ctx,
                    ptrs,
                    &mut scratch,
                )?;
            }
        }
        drop(scratch);
        drop(pinned);
        Ok(())
    }

    fn compute_range(
        &self,
        be: sys::ggml_backend_t,
        ctx: *mut sys::ggml_context,
        g: &ValidatedGraph,
        ptrs: &[*mut sys::ggml_tensor],
        nodes: &[usize],
    ) -> Result<()> {
        // SAFETY: ctx is live and was sized for one graph per segment.
        let cg = unsafe { sys::ggml_new_graph_custom(ctx, nodes.len(), false) };
        if cg.is_null() {
            return fail("ggml_new_graph_custom failed");
        }
        for &i in nodes {
            // SAFETY: cg has room for nodes.len() nodes; ptrs[i] is live.
            unsafe { sys::ggml_graph_add_node(cg, ptrs[i]) };
        }
        set_use_counts(cg, nodes.iter().map(|&i| (ptrs[i], g.tensors[i].use_count)));
        // SAFETY: every tensor points into locked memory validated for its
        // extent; ops were checked against the allowlist and ggml's support.
        let status = unsafe { sys::ggml_backend_graph_compute(be, cg) };
        if status != sys::GGML_STATUS_SUCCESS {
            return fail(format!("ggml_backend_graph_compute returned {status}"));
        }
        Ok(())
    }
}

/// `struct ggml_hash_set` of the vendored ggml (`ggml-impl.h`, private:
/// the bindings only see an opaque `ggml_cgraph`).
#[repr(C)]
struct HashSetLayout {
    size: usize,
    used: *mut u32,
    keys: *mut *mut sys::ggml_tensor,
}

/// `struct ggml_cgraph` of the vendored ggml (`ggml-impl.h`). Only read
/// after [`set_use_counts`] has matched it against ggml's own accessors.
#[repr(C)]
struct CgraphLayout {
    size: std::os::raw::c_int,
    n_nodes: std::os::raw::c_int,
    n_leafs: std::os::raw::c_int,
    nodes: *mut *mut sys::ggml_tensor,
    grads: *mut *mut sys::ggml_tensor,
    grad_accs: *mut *mut sys::ggml_tensor,
    leafs: *mut *mut sys::ggml_tensor,
    use_counts: *mut i32,
    visited_hash_set: HashSetLayout,
}

/// Records each node's use count (the client's `use_count`, as upstream's
/// rpc-server does) in `cg`'s hash set, as `ggml_build_forward_expand`
/// would have: ggml-cpu fuses a node with the next (RMS_NORM + MUL) only
/// when its count says the next node is its one consumer, and a graph
/// built node by node has every count 0, so it never fused (upstream's
/// server fuses). Fusion reads and writes only the two nodes' own,
/// validated extents (`ggml_compute_forward_rms_norm_f32`), so a wrong
/// count changes the client's own results at most, as upstream.
///
/// ggml keeps `ggml_cgraph` private; the layout is mirrored from the
/// vendored `ggml-impl.h` and checked against ggml's accessors on every
/// graph (size, node array, node count, a hash table large enough): on
/// any mismatch nothing is written and the graph runs unfused.
fn set_use_counts(
    cg: *mut sys::ggml_cgraph,
    nodes: impl ExactSizeIterator<Item = (*mut sys::ggml_tensor, i32)>,
) {
    let n = nodes.len();
    // SAFETY: cg is a live graph of `n` nodes (ggml_new_graph_custom, then
    // n ggml_graph_add_node); these accessors only read it.
    let (size, list, count) = unsafe {
        (
            sys::ggml_graph_size(cg),
            sys::ggml_graph_nodes(cg),
            sys::ggml_graph_n_nodes(cg),
        )
    };
    // SAFETY: a ggml_cgraph starts with at least this layout's bytes when
    // the layout matches; it is only read here, and trusted below only if
    // its fields agree with ggml's accessors.
    let layout = unsafe { &*cg.cast::<CgraphLayout>() };
    let hash = &layout.visited_hash_set;
    let matches = layout.size == size
        && layout.nodes == list
        && layout.n_nodes == count
        && usize::try_from(count).is_ok_and(|c| c == n)
        && layout.n_leafs == 0
        && hash.size >= 2 * n
        && !hash.used.is_null()
        && !hash.keys.is_null()
        && !layout.use_counts.is_null();
    if !matches {
        return;
    }
    let slots = hash.size;
    for (t, uses) in nodes {
        // ggml_hash_insert: the pointer's bits above its alignment, modulo
        // the table size, then linear probing.
        let mut i = (t as usize >> 4) % slots;
        for _ in 0..slots {
            // SAFETY: i < slots: the used bitset holds slots bits, keys and
            // use_counts hold slots entries (ggml_new_graph_custom); no other
            // thread touches the graph before it is computed.
            unsafe {
                let word = hash.used.add(i >> 5);
                let bit = 1u32 << (i & 31);
                if *word & bit == 0 {
                    *word |= bit;
                    *hash.keys.add(i) = t;
                    *layout.use_counts.add(i) = uses;
                    break;
                }
                if *hash.keys.add(i) == t {
                    break;
                }
            }
            i = (i + 1) % slots;
        }
    }
}
