//! GRAPH_COMPUTE checks: every id resolvable, no cycles, ops in range, custom
//! ops refused, source arity, the shapes of the ops that index memory with
//! tensor data (GET_ROWS, GET_ROWS_BACK, SET_ROWS, ADD_ID, MUL_MAT_ID,
//! SSM_SCAN) and (when the index data already sits in memory) index
//! ranges. A node may be listed more
//! than once (test-backend-ops' perf mode repeats one node): it runs each
//! time, as in ggml.
//!
//! Index ranges checked here are an early refusal only: index tensors live
//! in buffers that any session holding the handle may write, and a stored
//! graph runs again on GRAPH_RECOMPUTE. So every index node is also listed
//! for a run-time check ([`ValidatedGraph::upfront_index_checks`],
//! [`ValidatedGraph::deferred_index_checks`]) that a compute backend makes
//! on every execution, against the memory it holds locked while it runs.

use std::collections::{HashMap, HashSet};

use super::op_shapes::is_contiguous;
use super::ops::{
    GGML_GLU_OP_COUNT, GGML_OP_ADD_ID, GGML_OP_COUNT, GGML_OP_CPY, GGML_OP_GET_ROWS,
    GGML_OP_GET_ROWS_BACK, GGML_OP_GLU, GGML_OP_MUL_MAT_ID, GGML_OP_SET_ROWS, GGML_OP_SSM_SCAN,
    GGML_OP_UNARY, GGML_UNARY_OP_COUNT, is_custom,
};
use super::tensor::{BufferLookup, CheckedTensor, check_tensor, check_view};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, GGML_TYPE_I64};
use crate::error::{Result, RpcError};
use crate::protocol::graph::GraphPayload;
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

const CALL: &str = "GRAPH_COMPUTE";

/// Size limits of one graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// Most nodes accepted.
    pub max_nodes: usize,
    /// Most tensors accepted.
    pub max_tensors: usize,
    /// Most index elements read to check GET_ROWS / SET_ROWS ranges.
    pub max_index_elements: u64,
}

/// Most (index tensor, earlier node) extent pairs compared to decide which
/// index checks can run before the first node; past it every index node is
/// checked right before it runs (always safe, only more segments). Bounds
/// validation work for graphs with many index nodes in one buffer.
const MAX_OVERLAP_COMPARISONS: u64 = 1 << 22;

impl Default for GraphLimits {
    fn default() -> Self {
        GraphLimits {
            max_nodes: 1 << 18,
            max_tensors: 1 << 19,
            max_index_elements: 1 << 24,
        }
    }
}

/// A graph that passed every check, with ids resolved to indices.
#[derive(Debug, Clone)]
pub struct ValidatedGraph {
    /// Device index (below the server's device count).
    pub device: u32,
    /// The tensor records.
    pub tensors: Vec<RpcTensor>,
    /// Their checked layouts (same order).
    pub checked: Vec<CheckedTensor>,
    /// Nodes as indices into `tensors`, in execution order.
    pub nodes: Vec<usize>,
    /// Sources of each tensor as indices.
    pub srcs: Vec<[Option<usize>; MAX_SRC]>,
    /// View source of each tensor as an index.
    pub view_src: Vec<Option<usize>>,
    /// Index nodes (GET_ROWS, GET_ROWS_BACK, SET_ROWS, ADD_ID, MUL_MAT_ID,
    /// SSM_SCAN: see [`index_slot`]) whose index bytes no node listed before them writes:
    /// a compute backend must range-check them (with [`check_index_node`])
    /// against current memory before it runs the first node, on every
    /// execution (GRAPH_COMPUTE and GRAPH_RECOMPUTE), while it holds the
    /// buffers locked for the run. Each node at most once.
    pub upfront_index_checks: Vec<usize>,
    /// Index nodes whose index bytes an earlier node may write (indices
    /// computed inside the graph, or memory aliased by a node): a compute
    /// backend must run the nodes before each of them, then range-check
    /// its indices, on every execution, under the same locks. In execution
    /// order; a node listed twice may appear twice.
    pub deferred_index_checks: Vec<usize>,
    /// The position in `nodes` of each entry of `deferred_index_checks`:
    /// the nodes before it run first.
    pub deferred_index_positions: Vec<usize>,
}

fn refuse<T>(reason: impl Into<String>) -> Result<T> {
    Err(RpcError::refused(CALL, reason))
}

/// Minimum number of leading sources an op needs.
fn min_sources(op: u32) -> usize {
    match op {
        // NONE and ARANGE have no sources.
        0 | 67 => 0,
        // ADD, ADD1, ACC, SUB, MUL, DIV, CONCAT, MUL_MAT, OUT_PROD, SET,
        // CPY, GET_ROWS, GET_ROWS_BACK, ROPE.
        2 | 4 | 5 | 6 | 7 | 8 | 22 | 29 | 31 | 33 | 34 | 40 | 41 | 48 => 2,
        // ADD_ID, MUL_MAT_ID, SET_ROWS, FLASH_ATTN_EXT.
        3 | 30 | 42 | 74 => 3,
        _ => 1,
    }
}

/// Validates a parsed graph against the buffers of this server.
pub fn validate_graph(
    g: GraphPayload,
    device_count: u32,
    lookup: &dyn BufferLookup,
    limits: &GraphLimits,
) -> Result<ValidatedGraph> {
    if g.device >= device_count {
        return refuse(format!("device {} of {device_count}", g.device));
    }
    if g.nodes.len() > limits.max_nodes || g.tensors.len() > limits.max_tensors {
        return refuse(format!(
            "{} nodes / {} tensors exceed the limits {} / {}",
            g.nodes.len(),
            g.tensors.len(),
            limits.max_nodes,
            limits.max_tensors
        ));
    }
    let mut index = HashMap::with_capacity(g.tensors.len());
    for (i, t) in g.tensors.iter().enumerate() {
        if t.id == 0 {
            return refuse("tensor id 0");
        }
        if index.insert(t.id, i).is_some() {
            return refuse(format!("duplicate tensor id {:#x}", t.id));
        }
    }
    let resolve = |id: u64| -> Result<Option<usize>> {
        if id == 0 {
            return Ok(None);
        }
        match index.get(&id) {
            Some(&i) => Ok(Some(i)),
            None => refuse(format!("unresolvable tensor id {id:#x}")),
        }
    };

    let mut checked = Vec::with_capacity(g.tensors.len());
    let mut srcs = Vec::with_capacity(g.tensors.len());
    let mut view_src = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let c = check_tensor(CALL, t, lookup)?;
        if c.placement.is_none() {
            return refuse(format!("tensor {:?} has no buffer", t.name_str()));
        }
        check_op(t)?;
        let mut s = [None; MAX_SRC];
        for (slot, &id) in s.iter_mut().zip(t.src.iter()) {
            *slot = resolve(id)?;
        }
        let need = min_sources(t.op);
        if s[..need].iter().any(Option::is_none) {
            return refuse(format!("op {} needs {need} sources", t.op));
        }
        checked.push(c);
        srcs.push(s);
        view_src.push(resolve(t.view_src)?);
    }
    for (i, v) in view_src.iter().enumerate() {
        if let Some(v) = *v {
            check_view(CALL, &g.tensors[i], &checked[i], &g.tensors[v], &checked[v])?;
        }
    }

    // A node listed twice runs twice (ggml_graph_compute walks the list);
    // every per-node check below is per position.
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for &id in &g.nodes {
        let Some(i) = resolve(id)? else {
            return refuse("node id 0");
        };
        nodes.push(i);
    }

    let ops: Vec<u32> = g.tensors.iter().map(|t| t.op).collect();
    check_acyclic(&srcs, &view_src, &ops)?;

    let mut upfront = Vec::new();
    let mut upfront_set = HashSet::new();
    let mut deferred = Vec::new();
    let mut deferred_positions = Vec::new();
    let mut writes = WrittenExtents::new(&checked, &nodes);
    for (pos, &n) in nodes.iter().enumerate() {
        let t = &g.tensors[n];
        let ix = match t.op {
            GGML_OP_GET_ROWS => check_get_rows(&g.tensors, n, &srcs[n])?,
            GGML_OP_GET_ROWS_BACK => check_get_rows_back_indices(&g.tensors, &srcs[n])?,
            GGML_OP_SET_ROWS => check_set_rows(&g.tensors, n, &srcs[n])?,
            GGML_OP_ADD_ID | GGML_OP_MUL_MAT_ID => check_expert_ids(&g.tensors, n, &srcs[n])?,
            GGML_OP_SSM_SCAN => check_sequence_ids(&g.tensors, &srcs[n])?,
            _ => continue,
        };
        if writes.written_before(&checked[ix], pos) {
            deferred.push(n);
            deferred_positions.push(pos);
            continue;
        }
        // A repeated node none of whose earlier positions is preceded by a
        // write of its indices reads the same bytes each time: one check
        // before the first node covers every run.
        if !upfront_set.insert(n) {
            continue;
        }
        // Early refusal; the backend checks again under its locks.
        check_indices(
            &g.tensors[ix],
            &checked[ix],
            lookup,
            limits,
            row_bound(&g.tensors, n, &srcs[n]),
        )?;
        upfront.push(n);
    }

    Ok(ValidatedGraph {
        device: g.device,
        tensors: g.tensors,
        checked,
        nodes,
        srcs,
        view_src,
        upfront_index_checks: upfront,
        deferred_index_checks: deferred,
        deferred_index_positions: deferred_positions,
    })
}

/// The byte ranges the nodes of a graph write, by buffer, to find index
/// tensors whose bytes an earlier node may change. Every op a backend
/// accepts writes only inside its own tensor's extent (`op_shapes`), so a
/// node's extent bounds what it writes; view nodes write nothing but are
/// counted too (conservative: at worst one more checked segment).
struct WrittenExtents {
    /// Per buffer handle: (node position, start, end) of each node.
    by_buffer: HashMap<u64, Vec<(usize, u64, u64)>>,
    /// Comparisons left before every remaining check is deferred.
    budget: u64,
}

impl WrittenExtents {
    fn new(checked: &[CheckedTensor], nodes: &[usize]) -> Self {
        let mut by_buffer: HashMap<u64, Vec<(usize, u64, u64)>> = HashMap::new();
        for (pos, &n) in nodes.iter().enumerate() {
            if let Some((region, start)) = checked[n].placement {
                let end = start.saturating_add(checked[n].nbytes);
                by_buffer
                    .entry(region.handle)
                    .or_default()
                    .push((pos, start, end));
            }
        }
        WrittenExtents {
            by_buffer,
            budget: MAX_OVERLAP_COMPARISONS,
        }
    }

    /// True when a node at a position before `pos` may write bytes of the
    /// tensor `c` (or when that cannot be decided within the budget).
    fn written_before(&mut self, c: &CheckedTensor, pos: usize) -> bool {
        let Some((region, start)) = c.placement else {
            return true;
        };
        let end = start.saturating_add(c.nbytes);
        let Some(extents) = self.by_buffer.get(&region.handle) else {
            return false;
        };
        // Extents are in node order: only the prefix before `pos` matters.
        let earlier = extents.partition_point(|&(p, _, _)| p < pos);
        let cost = earlier as u64;
        if cost > self.budget {
            return true;
        }
        self.budget -= cost;
        extents[..earlier]
            .iter()
            .any(|&(_, s, e)| s < end && start < e)
    }
}

/// The source slot holding the indices of an index op: GET_ROWS (rows of
/// src0), GET_ROWS_BACK and SET_ROWS (rows of the result) read them from
/// src1; ADD_ID (rows of src1) and MUL_MAT_ID (matrices of src0) from
/// src2; SSM_SCAN (states of src0) from src6. `None` for every other op.
pub fn index_slot(op: u32) -> Option<usize> {
    match op {
        GGML_OP_GET_ROWS | GGML_OP_GET_ROWS_BACK | GGML_OP_SET_ROWS => Some(1),
        GGML_OP_ADD_ID | GGML_OP_MUL_MAT_ID => Some(2),
        GGML_OP_SSM_SCAN => Some(6),
        _ => None,
    }
}

/// Rows (or matrices) an index of index node `n` may address.
fn row_bound(ts: &[RpcTensor], n: usize, s: &[Option<usize>; MAX_SRC]) -> i64 {
    let ne = |slot: usize, d: usize| i64::from(s[slot].map_or(0, |a| ts[a].ne[d]));
    match ts[n].op {
        GGML_OP_GET_ROWS => ne(0, 1),
        GGML_OP_ADD_ID => ne(1, 1),
        GGML_OP_MUL_MAT_ID => ne(0, 2),
        GGML_OP_SSM_SCAN => ne(0, 3),
        // SET_ROWS and GET_ROWS_BACK: rows of the result
        // (`GGML_ASSERT(r >= 0 && r < dst->ne[1])` in
        // ggml_compute_forward_get_rows_back).
        _ => i64::from(ts[n].ne[1]),
    }
}

/// Range-checks the indices of index node `n` (an index into `g.tensors`)
/// from memory. A backend calls this on every execution, with
/// the graph's buffers locked: for every entry of `upfront_index_checks`
/// before the first node, and for every entry of `deferred_index_checks`
/// after computing the nodes before it.
pub fn check_index_node(
    g: &ValidatedGraph,
    n: usize,
    lookup: &dyn BufferLookup,
    limits: &GraphLimits,
) -> Result<()> {
    let ix = index_tensor(g, n)?;
    check_indices(
        &g.tensors[ix],
        &g.checked[ix],
        lookup,
        limits,
        row_bound(&g.tensors, n, &g.srcs[n]),
    )
}

/// The index tensor (an index into `g.tensors`) of index node `n`.
pub fn index_tensor(g: &ValidatedGraph, n: usize) -> Result<usize> {
    let slot = g
        .tensors
        .get(n)
        .and_then(|t| index_slot(t.op))
        .ok_or_else(|| RpcError::refused(CALL, "not an index node"))?;
    match g.srcs.get(n).and_then(|s| s[slot]) {
        Some(ix) if ix < g.tensors.len() => Ok(ix),
        _ => refuse("index node without indices"),
    }
}

/// Range-checks `bytes`, the index tensor's `nbytes` as read from memory,
/// as the indices of index node `n`. For a backend that
/// checks a private copy and hands that copy to the kernel.
pub fn check_index_bytes(
    g: &ValidatedGraph,
    n: usize,
    bytes: &[u8],
    limits: &GraphLimits,
) -> Result<()> {
    let ix = index_tensor(g, n)?;
    let t = &g.tensors[ix];
    if index_elements(t) > limits.max_index_elements {
        return refuse(format!(
            "{} indices exceed the check limit",
            index_elements(t)
        ));
    }
    check_index_values(
        t,
        &g.checked[ix],
        bytes,
        row_bound(&g.tensors, n, &g.srcs[n]),
    )
}

fn index_elements(t: &RpcTensor) -> u64 {
    t.ne.iter().map(|&n| u64::from(n)).product()
}

fn check_op(t: &RpcTensor) -> Result<()> {
    if t.op >= GGML_OP_COUNT {
        return refuse(format!("op {} out of range", t.op));
    }
    if is_custom(t.op) {
        return refuse(format!(
            "custom op {} (op_params would hold a function pointer)",
            t.op
        ));
    }
    let p0 = t.op_params[0];
    if t.op == GGML_OP_UNARY && !(0..GGML_UNARY_OP_COUNT).contains(&p0) {
        return refuse(format!("unary op {p0} out of range"));
    }
    if t.op == GGML_OP_GLU && !(0..GGML_GLU_OP_COUNT).contains(&p0) {
        return refuse(format!("glu op {p0} out of range"));
    }
    Ok(())
}

/// Iterative three-colour DFS over source and view-source edges. One
/// self-edge is ggml's own: `ggml_cast` builds a CPY whose src[1] is the
/// result itself (its destination; ggml-cpu's copy reads src[0] only, and
/// upstream's rpc-server maps a node before its sources), so that edge is
/// not followed; any other edge back to a node being walked is refused.
fn check_acyclic(
    srcs: &[[Option<usize>; MAX_SRC]],
    view_src: &[Option<usize>],
    ops: &[u32],
) -> Result<()> {
    let n = srcs.len();
    let mut colour = vec![0u8; n];
    let edge = |v: usize, k: usize| -> Option<Option<usize>> {
        if k == 1 && srcs[v][1] == Some(v) && ops.get(v) == Some(&GGML_OP_CPY) {
            Some(None)
        } else if k < MAX_SRC {
            Some(srcs[v][k])
        } else if k == MAX_SRC {
            Some(view_src[v])
        } else {
            None
        }
    };
    for root in 0..n {
        if colour[root] != 0 {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        colour[root] = 1;
        while let Some(&mut (v, ref mut k)) = stack.last_mut() {
            match edge(v, *k) {
                None => {
                    colour[v] = 2;
                    stack.pop();
                }
                Some(next) => {
                    *k += 1;
                    if let Some(w) = next {
                        match colour[w] {
                            0 => {
                                colour[w] = 1;
                                stack.push((w, 0));
                            }
                            1 => return refuse("the graph has a cycle"),
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn get(ts: &[RpcTensor], s: Option<usize>) -> Result<&RpcTensor> {
    match s {
        Some(i) => Ok(&ts[i]),
        None => refuse("missing source"),
    }
}

/// GET_ROWS(a, b): b is I32 indices, result is `[a0, b0, b1, b2]`.
fn check_get_rows(ts: &[RpcTensor], n: usize, s: &[Option<usize>; MAX_SRC]) -> Result<usize> {
    let (a, b, r) = (get(ts, s[0])?, get(ts, s[1])?, &ts[n]);
    if b.ty != GGML_TYPE_I32 {
        return refuse("GET_ROWS indices must be I32");
    }
    if a.ne[2] != b.ne[1] || a.ne[3] != b.ne[2] || b.ne[3] != 1 {
        return refuse("GET_ROWS source and index shapes disagree");
    }
    if r.ne != [a.ne[0], b.ne[0], b.ne[1], b.ne[2]] {
        return refuse("GET_ROWS result shape disagrees with its sources");
    }
    s[1].ok_or_else(|| RpcError::refused(CALL, "missing source"))
}

/// GET_ROWS_BACK(grad, rows): ggml_compute_forward_get_rows_back reads
/// its `ggml_nelements(src1)` indices flat (`((int32_t *)
/// src1->data)[i]`), so they must be I32 and contiguous (then the flat
/// read and the strided range check see the same elements); each must be
/// a row of the result (`row_bound`). The other shape rules are the op
/// rules' (`op_shapes/train.rs`).
fn check_get_rows_back_indices(ts: &[RpcTensor], s: &[Option<usize>; MAX_SRC]) -> Result<usize> {
    let rows = get(ts, s[1])?;
    if rows.ty != GGML_TYPE_I32 || !is_contiguous(rows) {
        return refuse("GET_ROWS_BACK indices must be contiguous I32");
    }
    get(ts, s[0])?;
    s[1].ok_or_else(|| RpcError::refused(CALL, "missing source"))
}

/// SET_ROWS: src0 rows (F32/F16), src1 indices (I32/I64), result a view of
/// the destination with `ne[1]` rows.
fn check_set_rows(ts: &[RpcTensor], n: usize, s: &[Option<usize>; MAX_SRC]) -> Result<usize> {
    let (b, c, r) = (get(ts, s[0])?, get(ts, s[1])?, &ts[n]);
    if c.ty != GGML_TYPE_I32 && c.ty != GGML_TYPE_I64 {
        return refuse("SET_ROWS indices must be I32 or I64");
    }
    if b.ty != GGML_TYPE_F32 && b.ty != GGML_TYPE_F16 {
        return refuse("SET_ROWS rows must be F32 or F16");
    }
    let shapes_ok = r.ne[0] == b.ne[0]
        && r.ne[2] == b.ne[2]
        && r.ne[3] == b.ne[3]
        && b.ne[1] == c.ne[0]
        && c.ne[1] != 0
        && b.ne[2] % c.ne[1] == 0
        && c.ne[2] != 0
        && b.ne[3] % c.ne[2] == 0
        && c.ne[3] == 1;
    if !shapes_ok {
        return refuse("SET_ROWS shapes disagree");
    }
    if let Some(a) = s[2].map(|i| &ts[i]) {
        if a.ne != r.ne {
            return refuse("SET_ROWS result shape differs from its destination");
        }
    }
    s[1].ok_or_else(|| RpcError::refused(CALL, "missing source"))
}

/// ADD_ID / MUL_MAT_ID: src2 holds I32 expert ids, one per (slot, token)
/// (ggml_add_id / ggml_mul_mat_id); the rest of the shape rules are the
/// op rules' (`op_shapes/binary.rs`, `matmul.rs`).
fn check_expert_ids(ts: &[RpcTensor], n: usize, s: &[Option<usize>; MAX_SRC]) -> Result<usize> {
    let ids = get(ts, s[2])?;
    if ids.ty != GGML_TYPE_I32 {
        return refuse(format!("op {} expert ids must be I32", ts[n].op));
    }
    get(ts, s[0])?;
    get(ts, s[1])?;
    s[2].ok_or_else(|| RpcError::refused(CALL, "missing source"))
}

/// SSM_SCAN: src6 holds I32 sequence ids, the states of src0 (its
/// `ne[3]`) each sequence starts from (ggml_ssm_scan); the rest of the
/// shape rules are the op rules' (`op_shapes/recurrent.rs`).
fn check_sequence_ids(ts: &[RpcTensor], s: &[Option<usize>; MAX_SRC]) -> Result<usize> {
    let ids = get(ts, s[6])?;
    if ids.ty != GGML_TYPE_I32 {
        return refuse("ssm_scan sequence ids must be I32");
    }
    get(ts, s[0])?;
    s[6].ok_or_else(|| RpcError::refused(CALL, "missing source"))
}

/// Reads an index tensor from memory and checks `0 <= index < bound`.
fn check_indices(
    t: &RpcTensor,
    c: &CheckedTensor,
    lookup: &dyn BufferLookup,
    limits: &GraphLimits,
    bound: i64,
) -> Result<()> {
    let elements = index_elements(t);
    if elements > limits.max_index_elements {
        return refuse(format!("{elements} indices exceed the check limit"));
    }
    if elements == 0 {
        return Ok(());
    }
    let Some((region, start)) = c.placement else {
        return refuse("index tensor has no buffer");
    };
    let Some(bytes) = lookup.read(region.handle, start, c.nbytes) else {
        return refuse("index tensor could not be read");
    };
    check_index_values(t, c, &bytes, bound)
}

/// Checks `0 <= index < bound` for every element of index tensor `t`,
/// whose `c.nbytes` bytes are `bytes`.
fn check_index_values(t: &RpcTensor, c: &CheckedTensor, bytes: &[u8], bound: i64) -> Result<()> {
    if index_elements(t) == 0 {
        return Ok(());
    }
    let width = c.info.type_size as usize;
    for i3 in 0..u64::from(t.ne[3]) {
        for i2 in 0..u64::from(t.ne[2]) {
            for i1 in 0..u64::from(t.ne[1]) {
                for i0 in 0..u64::from(t.ne[0]) {
                    let off = i0 * u64::from(t.nb[0])
                        + i1 * u64::from(t.nb[1])
                        + i2 * u64::from(t.nb[2])
                        + i3 * u64::from(t.nb[3]);
                    let off = off as usize;
                    let Some(raw) = bytes.get(off..off + width) else {
                        return refuse("index read out of range");
                    };
                    let v = if width == 4 {
                        let mut b = [0u8; 4];
                        b.copy_from_slice(raw);
                        i64::from(i32::from_le_bytes(b))
                    } else {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(raw);
                        i64::from_le_bytes(b)
                    };
                    if v < 0 || v >= bound {
                        return refuse(format!("row index {v} outside 0..{bound}"));
                    }
                }
            }
        }
    }
    Ok(())
}
