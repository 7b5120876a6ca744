//! Graph validation of the index nodes added in issue 11 (ADD_ID and
//! MUL_MAT_ID read expert ids from tensor data, like GET_ROWS / SET_ROWS
//! read row indices) and of graphs that list a node more than once:
//! expert ids are range-checked now when they sit in memory, and listed
//! for the backend's run-time check (before the first node, or after the
//! node that may write them, per position).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use transfer_rpc::RpcError;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::BufferRegistry;
use transfer_rpc::validate::{GraphLimits, ValidatedGraph, index_slot, validate_graph};

const I32: u32 = 26;
const OP_ADD: u32 = 2;
const OP_ADD_ID: u32 = 3;
const OP_MUL_MAT_ID: u32 = 30;
const OP_GET_ROWS: u32 = 40;
const OP_GET_ROWS_BACK: u32 = 41;

struct Fixture {
    reg: BufferRegistry,
    handle: u64,
    base: u64,
}

fn fixture() -> Fixture {
    let reg = BufferRegistry::new(1 << 20);
    let b = reg.alloc(1, 0, 8192).unwrap();
    Fixture {
        reg,
        handle: b.handle,
        base: b.base,
    }
}

impl Fixture {
    /// A packed F32 tensor `ne` at `offset`.
    fn t(&self, id: u64, offset: u64, ne: [u32; 4]) -> RpcTensor {
        let mut t = f32_tensor(id, self.handle, self.base, offset, ne[0]);
        t.ne = ne;
        t.nb = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]];
        t
    }

    /// I32 ids `vals` shaped `ne` at `offset`, written to memory.
    fn ids(&self, id: u64, offset: u64, ne: [u32; 4], vals: &[i32]) -> RpcTensor {
        let mut t = self.t(id, offset, ne);
        t.ty = I32;
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.reg.write("test", self.handle, offset, &bytes).unwrap();
        t
    }

    fn graph(
        &self,
        nodes: Vec<u64>,
        tensors: Vec<RpcTensor>,
    ) -> transfer_rpc::Result<ValidatedGraph> {
        validate_graph(
            GraphPayload {
                device: 0,
                nodes,
                tensors,
            },
            1,
            &self.reg,
            &GraphLimits::default(),
        )
    }

    fn refused(&self, nodes: Vec<u64>, tensors: Vec<RpcTensor>, what: &str) {
        match self.graph(nodes, tensors) {
            Err(RpcError::Refused { reason, .. }) => println!("refused ({what}): {reason}"),
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
    }
}

fn op(mut t: RpcTensor, op: u32, srcs: &[u64]) -> RpcTensor {
    t.op = op;
    for (slot, &s) in t.src.iter_mut().zip(srcs) {
        *slot = s;
    }
    t
}

/// MUL_MAT_ID of 4 experts [8, 4] by [8, 2, 3] activations with ids
/// [2, 3] `vals` at 1024.
fn mul_mat_id(f: &Fixture, vals: &[i32]) -> Vec<RpcTensor> {
    let a = f.t(1, 0, [8, 4, 4, 1]);
    let b = f.t(2, 512, [8, 2, 3, 1]);
    let ids = f.ids(3, 1024, [2, 3, 1, 1], vals);
    let r = op(f.t(4, 2048, [4, 2, 3, 1]), OP_MUL_MAT_ID, &[1, 2, 3]);
    vec![a, b, ids, r]
}

/// ADD_ID of [8, 2, 3] rows plus rows `vals` [2, 3] of a [8, 5] bias.
fn add_id(f: &Fixture, vals: &[i32]) -> Vec<RpcTensor> {
    let a = f.t(1, 0, [8, 2, 3, 1]);
    let b = f.t(2, 512, [8, 5, 1, 1]);
    let ids = f.ids(3, 1024, [2, 3, 1, 1], vals);
    let r = op(f.t(4, 2048, [8, 2, 3, 1]), OP_ADD_ID, &[1, 2, 3]);
    vec![a, b, ids, r]
}

#[test]
fn expert_ids_are_range_checked() {
    let f = fixture();
    assert_eq!(index_slot(OP_MUL_MAT_ID), Some(2));
    assert_eq!(index_slot(OP_ADD_ID), Some(2));
    assert_eq!(index_slot(OP_GET_ROWS), Some(1));
    assert_eq!(index_slot(OP_ADD), None);

    let v = f
        .graph(vec![4], mul_mat_id(&f, &[0, 3, 1, 2, 3, 0]))
        .unwrap();
    assert_eq!(v.upfront_index_checks, vec![3]);
    f.refused(
        vec![4],
        mul_mat_id(&f, &[0, 4, 1, 2, 3, 0]),
        "expert 4 of 4",
    );
    f.refused(vec![4], mul_mat_id(&f, &[0, 1, -1, 2, 3, 0]), "expert -1");
    let v = f.graph(vec![4], add_id(&f, &[4, 0, 1, 2, 3, 4])).unwrap();
    assert_eq!(v.upfront_index_checks, vec![3]);
    f.refused(vec![4], add_id(&f, &[5, 0, 1, 2, 3, 4]), "bias row 5 of 5");
    // Ids must be I32 (the kernels read int32_t).
    let mut g = add_id(&f, &[0; 6]);
    g[2].ty = 0;
    f.refused(vec![4], g, "F32 ids");
}

/// GET_ROWS_BACK of a [8, 4] gradient by I32 rows `vals` (shape `ne`, at
/// 1024) into a [8, 5] result: the rows index the result.
fn get_rows_back(f: &Fixture, ne: [u32; 4], vals: &[i32]) -> Vec<RpcTensor> {
    let g = f.t(1, 0, [8, 4, 1, 1]);
    let rows = f.ids(2, 1024, ne, vals);
    let r = op(f.t(3, 2048, [8, 5, 1, 1]), OP_GET_ROWS_BACK, &[1, 2]);
    vec![g, rows, r]
}

#[test]
fn get_rows_back_rows_are_range_checked() {
    let f = fixture();
    assert_eq!(index_slot(OP_GET_ROWS_BACK), Some(1));
    let v = f
        .graph(vec![3], get_rows_back(&f, [4, 1, 1, 1], &[0, 4, 4, 2]))
        .unwrap();
    assert_eq!(v.upfront_index_checks, vec![2]);
    // The bound is the result's 5 rows, not the gradient's 4.
    f.refused(
        vec![3],
        get_rows_back(&f, [4, 1, 1, 1], &[0, 5, 1, 2]),
        "row 5 of 5",
    );
    f.refused(
        vec![3],
        get_rows_back(&f, [4, 1, 1, 1], &[0, -1, 1, 2]),
        "row -1",
    );
    // The kernel reads int32_t and reads them flat.
    let mut g = get_rows_back(&f, [4, 1, 1, 1], &[0; 4]);
    g[1].ty = 27;
    g[1].nb = [8, 32, 32, 32];
    f.refused(vec![3], g, "I64 rows");
    let mut g = get_rows_back(&f, [2, 2, 1, 1], &[0; 4]);
    g[1].nb = [4, 16, 32, 32];
    f.refused(vec![3], g, "rows of a strided view");
}

#[test]
fn computed_expert_ids_are_deferred() {
    let f = fixture();
    // The ids are the result of a node of the graph (ADD of two I32s is
    // not served, but validation only looks at who writes the bytes).
    let mut g = mul_mat_id(&f, &[9; 6]);
    g[2] = op(g[2].clone(), OP_ADD, &[5, 5]);
    let mut src = f.ids(5, 4096, [2, 3, 1, 1], &[0; 6]);
    src.ty = I32;
    g.push(src);
    let v = f.graph(vec![3, 4], g).unwrap();
    assert!(v.upfront_index_checks.is_empty());
    assert_eq!(v.deferred_index_checks, vec![3]);
    assert_eq!(v.deferred_index_positions, vec![1]);
}

#[test]
fn a_node_listed_twice_runs_twice() {
    let f = fixture();
    let v = f
        .graph(
            vec![3, 3],
            vec![
                f.t(1, 0, [4, 1, 1, 1]),
                f.t(2, 16, [4, 1, 1, 1]),
                op(f.t(3, 32, [4, 1, 1, 1]), OP_ADD, &[1, 2]),
            ],
        )
        .unwrap();
    assert_eq!(v.nodes, vec![2, 2]);

    // An index node listed twice, no writer of its indices: one check
    // before the first node covers both runs.
    let v = f
        .graph(vec![4, 4], mul_mat_id(&f, &[0, 1, 2, 3, 0, 1]))
        .unwrap();
    assert_eq!(v.upfront_index_checks, vec![3]);
    assert!(v.deferred_index_checks.is_empty());
    // Out-of-range ids are refused whatever the repetition.
    f.refused(
        vec![4, 4],
        mul_mat_id(&f, &[0, 1, 2, 3, 0, 7]),
        "expert 7 of 4, twice",
    );

    // A node writing the ids between two runs: the first run is checked
    // up front, the second after that node (position 2), and the backend
    // checks before each.
    let mut g = mul_mat_id(&f, &[0, 1, 2, 3, 0, 1]);
    let mut w = op(f.t(6, 1024, [6, 1, 1, 1]), OP_ADD, &[7, 7]);
    w.ty = I32;
    g.push(w);
    g.push(f.ids(7, 4096, [6, 1, 1, 1], &[0; 6]));
    let v = f.graph(vec![4, 6, 4], g).unwrap();
    assert_eq!(v.upfront_index_checks, vec![3]);
    assert_eq!(v.deferred_index_checks, vec![3]);
    assert_eq!(v.deferred_index_positions, vec![2]);
}
