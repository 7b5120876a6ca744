//! The COMPUTE message's graph: a [`ValidatedGraph`] as the server already
//! validated it, so that the compute worker does not resolve, validate and
//! encode it a second time.
//!
//! Before, the server re-encoded the graph in the wire format and the
//! worker ran `validate_graph` on it again (id map, acyclicity, per-op
//! index checks): a 300-node graph's first GRAPH_COMPUTE cost ~0.95 ms
//! more through the worker than in-process (`tests/graph_overhead.rs`).
//! Now the server sends the records with their sources already resolved to
//! positions, and the worker makes only the checks its isolation rests
//! on, in one linear pass: every index in range (a bad one would panic
//! it), every tensor's data range inside a buffer it has mapped from the
//! server (the same check as the server's, [`check_tensor`], against its
//! own mappings), every view inside its source. The graph's structure
//! (acyclic, op arity and shapes of the index ops) is the server's
//! validation; the worker trusts its server, not the client, and still
//! applies the op shape rules and ggml's support check before it builds
//! the graph, and every index check at run time (`ggml_backend.rs`).
//!
//! `device u32 | n_tensors u32 | n_nodes u32 | n_upfront u32 | n_deferred u32 |
//!  rpc_tensor[n_tensors] | (src u32[MAX_SRC] | view_src u32)[n_tensors] |
//!  nodes u32[n_nodes] | upfront u32[n_upfront] | (deferred u32 | position u32)[n_deferred]`,
//! with [`NONE`] for an absent source.

use crate::error::{Result, RpcError};
use crate::protocol::tensor::{MAX_SRC, RPC_TENSOR_SIZE, RpcTensor};
use crate::protocol::wire::{Reader, WireWrite};
use crate::validate::tensor::check_view;
use crate::validate::{BufferLookup, GraphLimits, ValidatedGraph, check_tensor, index_tensor};

const CALL: &str = "compute worker: COMPUTE";

/// An absent source or view source.
const NONE: u32 = u32::MAX;

fn refuse<T>(reason: impl Into<String>) -> Result<T> {
    Err(RpcError::refused(CALL, reason))
}

fn position(i: Option<usize>) -> u32 {
    i.and_then(|i| u32::try_from(i).ok()).unwrap_or(NONE)
}

/// Appends `g` to `out`.
pub fn encode(g: &ValidatedGraph, out: &mut Vec<u8>) {
    let n = g.tensors.len();
    out.reserve(
        20 + n * (RPC_TENSOR_SIZE + 4 * (MAX_SRC + 1))
            + 4 * (g.nodes.len()
                + g.upfront_index_checks.len()
                + 2 * g.deferred_index_checks.len()),
    );
    out.put_u32(g.device);
    for len in [
        n,
        g.nodes.len(),
        g.upfront_index_checks.len(),
        g.deferred_index_checks.len(),
    ] {
        out.put_u32(len as u32);
    }
    for t in &g.tensors {
        t.encode_into(out);
    }
    for (s, v) in g.srcs.iter().zip(&g.view_src) {
        for &i in s {
            out.put_u32(position(i));
        }
        out.put_u32(position(*v));
    }
    for &i in g.nodes.iter().chain(&g.upfront_index_checks) {
        out.put_u32(position(Some(i)));
    }
    for (&i, &p) in g
        .deferred_index_checks
        .iter()
        .zip(&g.deferred_index_positions)
    {
        out.put_u32(position(Some(i)));
        out.put_u32(position(Some(p)));
    }
}

/// `count` items of `each` bytes, checked against what is left before
/// anything is allocated.
fn counted(r: &Reader<'_>, count: u32, each: usize) -> Result<usize> {
    let count = count as usize;
    match count.checked_mul(each) {
        Some(b) if b <= r.remaining() => Ok(count),
        _ => Err(RpcError::malformed(
            CALL,
            format!("{count} items do not fit the message"),
        )),
    }
}

/// Reads positions below `below`.
fn positions(r: &mut Reader<'_>, count: usize, below: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let i = r.u32()? as usize;
        if i >= below {
            return refuse(format!("position {i} of {below}"));
        }
        out.push(i);
    }
    Ok(out)
}

/// Decodes a graph [`encode`] wrote and checks what the worker's
/// isolation needs (see the module comment) against `lookup`, the
/// worker's mapped buffers.
pub fn decode(
    body: &[u8],
    devices: u32,
    lookup: &dyn BufferLookup,
    limits: &GraphLimits,
) -> Result<ValidatedGraph> {
    let mut r = Reader::new(body, CALL);
    let device = r.u32()?;
    let (n, nodes, upfront, deferred) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    if device >= devices {
        return refuse(format!("device {device} of {devices}"));
    }
    if nodes as usize > limits.max_nodes || n as usize > limits.max_tensors {
        return refuse(format!("{nodes} nodes / {n} tensors exceed the limits"));
    }
    let n = counted(&r, n, RPC_TENSOR_SIZE + 4 * (MAX_SRC + 1))?;
    let mut tensors = Vec::with_capacity(n);
    let mut checked = Vec::with_capacity(n);
    for _ in 0..n {
        let t = RpcTensor::read(&mut r)?;
        // The isolation check: the data lies inside a buffer this worker
        // mapped (same handles and bases as the server's).
        let c = check_tensor(CALL, &t, lookup)?;
        if c.placement.is_none() {
            return refuse("a tensor has no buffer");
        }
        tensors.push(t);
        checked.push(c);
    }
    let mut srcs = Vec::with_capacity(n);
    let mut view_src = Vec::with_capacity(n);
    let at = |i: u32| -> Result<Option<usize>> {
        match i {
            NONE => Ok(None),
            i if (i as usize) < n => Ok(Some(i as usize)),
            i => refuse(format!("source position {i} of {n}")),
        }
    };
    for _ in 0..n {
        let mut s = [None; MAX_SRC];
        for slot in &mut s {
            *slot = at(r.u32()?)?;
        }
        srcs.push(s);
        view_src.push(at(r.u32()?)?);
    }
    for (i, v) in view_src.iter().enumerate() {
        if let Some(v) = *v {
            check_view(CALL, &tensors[i], &checked[i], &tensors[v], &checked[v])?;
        }
    }
    let nodes = counted(&r, nodes, 4).and_then(|c| positions(&mut r, c, n))?;
    let upfront = counted(&r, upfront, 4).and_then(|c| positions(&mut r, c, n))?;
    let deferred = counted(&r, deferred, 8)?;
    let mut deferred_checks = Vec::with_capacity(deferred);
    let mut deferred_positions = Vec::with_capacity(deferred);
    for _ in 0..deferred {
        deferred_checks.extend(positions(&mut r, 1, n)?);
        deferred_positions.extend(positions(&mut r, 1, nodes.len())?);
    }
    r.finish()?;
    let g = ValidatedGraph {
        device,
        tensors,
        checked,
        nodes,
        srcs,
        view_src,
        upfront_index_checks: upfront,
        deferred_index_checks: deferred_checks,
        deferred_index_positions: deferred_positions,
    };
    // Each listed check names an index node with its index source (the
    // backend looks both up by position).
    for &i in g
        .upfront_index_checks
        .iter()
        .chain(&g.deferred_index_checks)
    {
        index_tensor(&g, i)?;
    }
    Ok(g)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::protocol::GraphPayload;
    use crate::validate::{Region, validate_graph};

    struct One(Region);

    impl BufferLookup for One {
        fn region(&self, handle: u64) -> Option<Region> {
            (handle == self.0.handle).then_some(self.0)
        }
        fn read(&self, _: u64, _: u64, len: u64) -> Option<Vec<u8>> {
            // Index 0 everywhere.
            Some(vec![0; len as usize])
        }
    }

    const BUF: Region = Region {
        handle: 7,
        base: 0x1000,
        size: 1 << 20,
    };

    fn f32_at(id: u64, off: u64, n: u32) -> RpcTensor {
        let mut t = RpcTensor {
            id,
            buffer: BUF.handle,
            data: BUF.base + off,
            ..RpcTensor::default()
        };
        t.ne = [n, 1, 1, 1];
        t.nb = [4, 4 * n, 4 * n, 4 * n];
        t
    }

    /// x + y, then GET_ROWS of that by ids, then a view of the result.
    fn graph() -> ValidatedGraph {
        let x = f32_at(1, 0, 64);
        let y = f32_at(2, 256, 64);
        let mut sum = f32_at(3, 512, 64);
        sum.op = 2;
        sum.src[0] = 1;
        sum.src[1] = 2;
        sum.ne = [16, 4, 1, 1];
        sum.nb = [4, 64, 256, 256];
        let mut ids = f32_at(4, 1024, 2);
        ids.ty = 26; // I32
        let mut rows = f32_at(5, 2048, 32);
        rows.op = 40; // GET_ROWS
        rows.src[0] = 3;
        rows.src[1] = 4;
        rows.ne = [16, 2, 1, 1];
        rows.nb = [4, 64, 128, 128];
        let mut view = f32_at(6, 2048 + 64, 16);
        view.view_src = 5;
        view.view_offs = 64;
        let payload = GraphPayload {
            device: 0,
            nodes: vec![3, 5],
            tensors: vec![x, y, sum, ids, rows, view],
        };
        validate_graph(payload, 1, &One(BUF), &GraphLimits::default()).unwrap()
    }

    fn same(a: &ValidatedGraph, b: &ValidatedGraph) {
        assert_eq!(a.device, b.device);
        assert_eq!(a.tensors, b.tensors);
        assert_eq!(a.checked, b.checked);
        assert_eq!(a.nodes, b.nodes);
        assert_eq!(a.srcs, b.srcs);
        assert_eq!(a.view_src, b.view_src);
        assert_eq!(a.upfront_index_checks, b.upfront_index_checks);
        assert_eq!(a.deferred_index_checks, b.deferred_index_checks);
        assert_eq!(a.deferred_index_positions, b.deferred_index_positions);
    }

    #[test]
    fn round_trip() {
        let mut g = graph();
        assert_eq!(g.upfront_index_checks, vec![4]);
        // A deferred check too (as if a node wrote the ids first).
        g.deferred_index_checks = vec![4];
        g.deferred_index_positions = vec![1];
        let mut b = Vec::new();
        encode(&g, &mut b);
        let back = decode(&b, 1, &One(BUF), &GraphLimits::default()).unwrap();
        same(&g, &back);
    }

    #[test]
    fn every_truncation_and_byte_flip_is_refused_or_checked() {
        let g = graph();
        let mut b = Vec::new();
        encode(&g, &mut b);
        let limits = GraphLimits::default();
        for len in 0..b.len() {
            assert!(decode(&b[..len], 1, &One(BUF), &limits).is_err(), "{len}");
        }
        // Any flipped byte decodes to something every checked property
        // holds for, or is refused; it never panics.
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0xA5;
            if let Ok(d) = decode(&c, 1, &One(BUF), &limits) {
                for (t, ch) in d.tensors.iter().zip(&d.checked) {
                    let (region, off) = ch.placement.unwrap();
                    assert_eq!(region, BUF);
                    assert!(off + ch.nbytes <= BUF.size, "{t:?}");
                }
            }
        }
    }

    #[test]
    fn memory_outside_the_mapped_buffers_is_refused() {
        let g = graph();
        let mut b = Vec::new();
        encode(&g, &mut b);
        let limits = GraphLimits::default();
        // The worker has a smaller mapping under the same handle.
        let small = Region { size: 1024, ..BUF };
        let e = decode(&b, 1, &One(small), &limits).unwrap_err();
        assert!(e.to_string().contains("outside its buffer"), "{e}");
        // No mapping at all.
        let other = Region { handle: 8, ..BUF };
        assert!(decode(&b, 1, &One(other), &limits).is_err());
        // A device the worker does not serve, limits below the graph.
        assert!(decode(&b, 0, &One(BUF), &limits).is_err());
        let tight = GraphLimits {
            max_tensors: 5,
            ..limits
        };
        assert!(decode(&b, 1, &One(BUF), &tight).is_err());
        // A source position past the records.
        let mut c = b.clone();
        let srcs_at = 20 + 6 * RPC_TENSOR_SIZE;
        c[srcs_at..srcs_at + 4].copy_from_slice(&6u32.to_le_bytes());
        assert!(decode(&c, 1, &One(BUF), &limits).is_err());
    }
}
