//! Index attacks that need real compute (run with `--features ggml`): a
//! GET_ROWS / SET_ROWS index tensor that was valid at GRAPH_COMPUTE is
//! rewritten out of range (by the same session or by another session that
//! holds the buffer handle) and the stored graph is re-run with
//! GRAPH_RECOMPUTE; or a node of the graph itself overwrites an index that
//! sat valid in memory at validation. ggml's kernels abort the process on
//! such indices (`GGML_ASSERT(i1 >= 0 && i1 < ne1)`), so each case must be
//! refused at run time: the offending connection closes with a logged
//! reason, the server keeps serving, and valid re-runs stay correct.
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};
use transfer_rpc::server::ServerHandle;

const COMPUTE: i32 = 16;
const GGML_OP_ADD: u32 = 2;
const GGML_OP_VIEW: u32 = 37;
const GGML_OP_GET_ROWS: u32 = 40;
const GGML_OP_SET_ROWS: u32 = 42;
const GGML_TYPE_I32: u32 = 26;
const GGML_TYPE_I64: u32 = 27;
/// Rows of the GET_ROWS table and of the SET_ROWS destination.
const ROWS: u32 = 5;
/// Elements per row.
const COLS: u32 = 4;

/// A 1-D index tensor of `n` elements of type `ty` (I32 or I64).
fn index(id: u64, b: u64, base: u64, offset: u64, ty: u32, n: u32) -> RpcTensor {
    let w = if ty == GGML_TYPE_I64 { 8 } else { 4 };
    RpcTensor {
        id,
        ty,
        buffer: b,
        ne: [n, 1, 1, 1],
        nb: [w, w * n, w * n, w * n],
        data: base + offset,
        ..RpcTensor::default()
    }
}

fn index_bytes(ty: u32, idx: &[i64]) -> Vec<u8> {
    if ty == GGML_TYPE_I64 {
        idx.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        idx.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
    }
}

/// Out-of-range index values for a tensor of `ty` addressing `ROWS` rows:
/// negative, exactly the row count, and the largest value of the type.
fn bad_indices(ty: u32) -> Vec<[i64; 2]> {
    let (min, max) = if ty == GGML_TYPE_I64 {
        (i64::MIN, i64::MAX)
    } else {
        (i64::from(i32::MIN), i64::from(i32::MAX))
    };
    vec![[0, -1], [i64::from(ROWS), 0], [1, max], [min, 2]]
}

/// One graph of a session, its index tensor and what it computes.
struct Case {
    graph: GraphPayload,
    /// The index tensor a client rewrites.
    idx: RpcTensor,
    /// The tensor the graph writes (GET_ROWS result / SET_ROWS destination).
    out: RpcTensor,
    /// The result expected for given (valid) indices.
    expect: fn(&[i64; 2]) -> Vec<f32>,
    /// True when a run only writes the rows its indices name (SET_ROWS):
    /// rows of earlier runs stay.
    writes_named_rows_only: bool,
}

/// GET_ROWS of a `[COLS, ROWS]` table holding `0..20`, indices `[2]` in
/// memory (`computed_index`: read through a VIEW node, so the check is
/// deferred to the point after that node).
fn get_rows_case(c: &mut Client, idx: [i64; 2], computed_index: bool) -> Case {
    let (b, base) = alloc(c, 1 << 16);
    let table = mat(1, b, base, 0, COLS, ROWS);
    let tv: Vec<f32> = (0..COLS * ROWS).map(|i| i as f32).collect();
    c.set_tensor(&table, 0, &f32_bytes(&tv)).unwrap();
    let leaf = index(2, b, base, 512, GGML_TYPE_I32, 2);
    c.set_tensor(&leaf, 0, &index_bytes(GGML_TYPE_I32, &idx))
        .unwrap();
    let mut tensors = vec![table, leaf.clone()];
    let mut nodes = vec![];
    let mut ix_id = 2;
    if computed_index {
        let mut v = leaf.clone();
        v.id = 6;
        v.op = GGML_OP_VIEW;
        v.src[0] = 2;
        v.view_src = 2;
        v.flags = COMPUTE;
        tensors.push(v);
        nodes.push(6);
        ix_id = 6;
    }
    let mut r = mat(3, b, base, 1024, COLS, 2);
    r.op = GGML_OP_GET_ROWS;
    r.src[0] = 1;
    r.src[1] = ix_id;
    r.flags = COMPUTE;
    tensors.push(r.clone());
    nodes.push(3);
    Case {
        graph: GraphPayload {
            device: 0,
            nodes,
            tensors,
        },
        idx: leaf,
        out: r,
        expect: |idx| {
            idx.iter()
                .flat_map(|&row| (0..COLS).map(move |k| (row as u32 * COLS + k) as f32))
                .collect()
        },
        writes_named_rows_only: false,
    }
}

/// SET_ROWS writing two rows `[100..104]`, `[200..204]` into a zeroed
/// `[COLS, ROWS]` destination at the rows named by the indices (`ty`).
fn set_rows_case(c: &mut Client, idx: [i64; 2], ty: u32) -> Case {
    let (b, base) = alloc(c, 1 << 16);
    let dst = mat(1, b, base, 0, COLS, ROWS);
    c.set_tensor(&dst, 0, &vec![0u8; (4 * COLS * ROWS) as usize])
        .unwrap();
    let rows = mat(2, b, base, 256, COLS, 2);
    let rv: Vec<f32> = [100.0, 101.0, 102.0, 103.0, 200.0, 201.0, 202.0, 203.0].to_vec();
    c.set_tensor(&rows, 0, &f32_bytes(&rv)).unwrap();
    let ix = index(3, b, base, 512, ty, 2);
    c.set_tensor(&ix, 0, &index_bytes(ty, &idx)).unwrap();
    let mut r = dst.clone();
    r.id = 4;
    r.op = GGML_OP_SET_ROWS;
    r.src[0] = 2;
    r.src[1] = 3;
    r.src[2] = 1;
    r.view_src = 1;
    r.flags = COMPUTE;
    Case {
        graph: GraphPayload {
            device: 0,
            nodes: vec![4],
            tensors: vec![dst.clone(), rows, ix.clone(), r],
        },
        idx: ix,
        out: dst,
        expect: |idx| {
            let mut want = vec![0.0f32; (COLS * ROWS) as usize];
            for (j, &row) in idx.iter().enumerate() {
                for k in 0..COLS as usize {
                    want[row as usize * COLS as usize + k] = (100 * (j + 1) + k) as f32;
                }
            }
            want
        },
        writes_named_rows_only: true,
    }
}

fn read_out(c: &mut Client, case: &Case) -> Vec<f32> {
    let n = case.out.ne[0] as u64 * case.out.ne[1] as u64 * 4;
    floats(&c.get_tensor(&case.out, 0, n).unwrap())
}

/// Waits (briefly) until the server has counted `n` refused connections.
fn wait_refused(h: &ServerHandle, n: u64) {
    for _ in 0..200 {
        if h.shared().refused_connections() >= n {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!(
        "expected {n} refused connections, server counted {}",
        h.shared().refused_connections()
    );
}

/// Valid compute, valid recompute with new indices (correct results), then
/// `bad` written into the index tensor by `writer` (the session itself when
/// `None`) and GRAPH_RECOMPUTE: that connection must close, and the server
/// must keep serving.
fn recompute_after_overwrite(
    h: &ServerHandle,
    make: &dyn Fn(&mut Client, [i64; 2]) -> Case,
    ty: u32,
    bad: [i64; 2],
    by_other_session: bool,
) {
    let refused_before = h.shared().refused_connections();
    let mut c = connect(h);
    let case = make(&mut c, [4, 1]);
    c.graph_compute(&case.graph).unwrap();
    assert_eq!(read_out(&mut c, &case), (case.expect)(&[4, 1]));
    c.set_tensor(&case.idx, 0, &index_bytes(ty, &[0, 3]))
        .unwrap();
    c.graph_recompute(0).unwrap();
    let good = read_out(&mut c, &case);
    if case.writes_named_rows_only {
        // Rows 4 and 1 of the first run stay: compare the rows this run wrote.
        let want = (case.expect)(&[0, 3]);
        for row in [0usize, 3] {
            let span = row * COLS as usize..(row + 1) * COLS as usize;
            assert_eq!(good[span.clone()], want[span], "row {row}");
        }
    } else {
        assert_eq!(good, (case.expect)(&[0, 3]));
    }

    let mut other = connect(h);
    if by_other_session {
        // The handle is a capability: another session may write the indices.
        other
            .set_tensor(&case.idx, 0, &index_bytes(ty, &bad))
            .unwrap();
        // SET_TENSOR has no answer: read the indices back so that the write
        // has happened before this session's GRAPH_RECOMPUTE arrives.
        let n = u64::from(case.idx.nb[1]);
        assert_eq!(
            other.get_tensor(&case.idx, 0, n).unwrap(),
            index_bytes(ty, &bad)
        );
    } else {
        c.set_tensor(&case.idx, 0, &index_bytes(ty, &bad)).unwrap();
    }
    c.graph_recompute(0).unwrap();
    assert!(
        is_closed(&mut c),
        "GRAPH_RECOMPUTE with indices {bad:?} (type {ty}) was not refused"
    );
    wait_refused(h, refused_before + 1);
    // The server is alive and serves the other client, and a fresh session
    // computes correctly.
    assert_eq!(other.device_count().unwrap(), 1);
    let mut fresh = connect(h);
    let case = make(&mut fresh, [2, 0]);
    fresh.graph_compute(&case.graph).unwrap();
    fresh.graph_recompute(0).unwrap();
    let got = read_out(&mut fresh, &case);
    let want = (case.expect)(&[2, 0]);
    assert_eq!(got, want);
}

#[test]
fn get_rows_recompute_rechecks_indices_in_memory() {
    let h = start_ggml();
    for bad in bad_indices(GGML_TYPE_I32) {
        for other in [false, true] {
            recompute_after_overwrite(
                &h,
                &|c, idx| get_rows_case(c, idx, false),
                GGML_TYPE_I32,
                bad,
                other,
            );
        }
    }
}

#[test]
fn get_rows_recompute_rechecks_computed_indices() {
    let h = start_ggml();
    for bad in bad_indices(GGML_TYPE_I32) {
        recompute_after_overwrite(
            &h,
            &|c, idx| get_rows_case(c, idx, true),
            GGML_TYPE_I32,
            bad,
            true,
        );
    }
}

#[test]
fn set_rows_recompute_rechecks_indices() {
    let h = start_ggml();
    for ty in [GGML_TYPE_I64, GGML_TYPE_I32] {
        for bad in bad_indices(ty) {
            for other in [false, true] {
                recompute_after_overwrite(&h, &|c, idx| set_rows_case(c, idx, ty), ty, bad, other);
            }
        }
    }
}

/// The index tensor is a plain leaf holding valid indices when the graph is
/// validated, but an earlier node (ADD, writing F32 1.0 = 0x3f800000 as
/// I32) overwrites exactly those bytes before GET_ROWS reads them. The
/// check must see the bytes the kernel will read, not those of validation.
/// Sends GRAPH_COMPUTE of ADD(x, x) = [1.0, 1.0] written at `add_offset`,
/// then GET_ROWS of the table with the I32 indices [1, 2] stored at 512;
/// returns the GET_ROWS output tensor.
fn add_then_get_rows(c: &mut Client, add_offset: u64) -> RpcTensor {
    let (b, base) = alloc(c, 1 << 16);
    let table = mat(1, b, base, 0, COLS, ROWS);
    let tv: Vec<f32> = (0..COLS * ROWS).map(|i| i as f32).collect();
    c.set_tensor(&table, 0, &f32_bytes(&tv)).unwrap();
    let ix = index(2, b, base, 512, GGML_TYPE_I32, 2);
    c.set_tensor(&ix, 0, &index_bytes(GGML_TYPE_I32, &[1, 2]))
        .unwrap();
    let x = mat(3, b, base, 768, 2, 1);
    c.set_tensor(&x, 0, &f32_bytes(&[0.5, 0.5])).unwrap();
    let mut add = mat(4, b, base, add_offset, 2, 1);
    add.op = GGML_OP_ADD;
    add.src[0] = 3;
    add.src[1] = 3;
    add.flags = COMPUTE;
    let mut r = mat(5, b, base, 1024, COLS, 2);
    r.op = GGML_OP_GET_ROWS;
    r.src[0] = 1;
    r.src[1] = 2;
    r.flags = COMPUTE;
    c.graph_compute(&GraphPayload {
        device: 0,
        nodes: vec![4, 5],
        tensors: vec![table, ix, x, add, r.clone()],
    })
    .unwrap();
    r
}

#[test]
fn index_overwritten_by_an_earlier_node_is_checked_after_it() {
    let h = start_ggml();
    // The ADD writes over the index bytes.
    let mut c = connect(&h);
    add_then_get_rows(&mut c, 512);
    assert!(is_closed(&mut c), "aliased index tensor was not refused");
    wait_refused(&h, 1);

    // The same graph with the ADD writing valid indices elsewhere runs.
    let mut c = connect(&h);
    let r = add_then_get_rows(&mut c, 2048);
    let got = floats(&c.get_tensor(&r, 0, 32).unwrap());
    assert_eq!(got, vec![4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]);
}
