//! Differential op test: every case is built with ggml's own op builders,
//! computed by ggml-cpu in this process (the reference), and computed by
//! our server from the same graph sent over the wire (run with
//! `--features ggml`). Cases sweep the shapes, types, strides (permuted and
//! strided views), broadcasting and op_params of llama.cpp's
//! test-backend-ops for the ops ggml's RPC server serves; only cases that
//! ggml-cpu itself computes are generated (a case it aborts on would take
//! the test down before the server sees it).
//!
//! A case passes when the server's output equals ggml's within the
//! suite's tolerance (normalised mean squared error), or when the server
//! refuses the graph (answered with an error, connection closed, server
//! still serving). A wrong result fails the test at once. Refusals are
//! counted per op and must not exceed the recorded ceilings in
//! [`MAX_REFUSED`] (coverage only goes up).
#![cfg(feature = "ggml")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use llama_cpp_sys_2 as sys;
use transfer_rpc::client::Client;
use transfer_rpc::protocol::{GraphPayload, RpcTensor};

type T = *mut sys::ggml_tensor;

/// Refused cases per op, measured; a change that serves more lowers these.
/// (The op name is ggml's `ggml_op_desc` of the output node.)
/// Issue 11: every case here is served (0 refused, 0 wrong).
const MAX_REFUSED: &[(&str, usize)] = &[];

/// A small deterministic generator (xorshift64*): the same cases and data
/// on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// What a leaf is filled with.
#[derive(Clone, Copy)]
enum Fill {
    Uniform(f32, f32),
    /// Integer indices in `0..n`.
    Index(i64),
    /// Zeros (destinations written by the graph).
    Zero,
    /// I32 rows of distinct indices in `0..n` (router choices).
    Rows(i64),
}

/// One case under construction: a ggml context with real memory (the
/// reference computes in it) and the leaves to fill.
struct Case {
    ctx: *mut sys::ggml_context,
    leaves: Vec<(T, Fill)>,
}

impl Drop for Case {
    fn drop(&mut self) {
        // SAFETY: ctx came from ggml_init and is freed once.
        unsafe { sys::ggml_free(self.ctx) };
    }
}

impl Case {
    fn new() -> Case {
        let params = sys::ggml_init_params {
            mem_size: 256 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain constructor.
        let ctx = unsafe { sys::ggml_init(params) };
        assert!(!ctx.is_null());
        Case {
            ctx,
            leaves: Vec::new(),
        }
    }

    fn tensor(&mut self, ty: sys::ggml_type, ne: [i64; 4], fill: Fill) -> T {
        // SAFETY: live context with room (256 MiB for the largest case).
        let t = unsafe { sys::ggml_new_tensor_4d(self.ctx, ty, ne[0], ne[1], ne[2], ne[3]) };
        assert!(!t.is_null());
        self.leaves.push((t, fill));
        t
    }

    fn input(&mut self, ty: sys::ggml_type, ne: [i64; 4]) -> T {
        self.tensor(ty, ne, Fill::Uniform(-1.0, 1.0))
    }
}

fn nbytes(t: T) -> usize {
    // SAFETY: t is a live tensor.
    unsafe { sys::ggml_nbytes(t) }
}

/// Fills a contiguous leaf.
fn fill(t: T, how: Fill, rng: &mut Rng) {
    // SAFETY: t is live and owns `nbytes` bytes at `data` (contiguous leaf
    // of a context with memory).
    let (ty, data, ne0) = unsafe { ((*t).type_, (*t).data, (*t).ne[0]) };
    let n_bytes = nbytes(t);
    // SAFETY: t is live.
    let n = unsafe { sys::ggml_nelements(t) } as usize;
    match how {
        Fill::Zero => {
            // SAFETY: the tensor's own bytes.
            unsafe { std::ptr::write_bytes(data.cast::<u8>(), 0, n_bytes) };
        }
        Fill::Index(max) => {
            for i in 0..n {
                let v = (rng.next() % max.max(1) as u64) as i64;
                // SAFETY: i < n elements of the integer type.
                unsafe {
                    match ty {
                        sys::GGML_TYPE_I8 => *data.cast::<i8>().add(i) = v as i8,
                        sys::GGML_TYPE_I16 => *data.cast::<i16>().add(i) = v as i16,
                        sys::GGML_TYPE_I32 => *data.cast::<i32>().add(i) = v as i32,
                        _ => *data.cast::<i64>().add(i) = v,
                    }
                }
            }
        }
        Fill::Rows(n_rows) => {
            // Each row of ne0 indices is a partial shuffle of 0..n_rows
            // (distinct experts per token, as a router's top-k gives).
            let n_rows = n_rows.max(1) as usize;
            let per_row = ne0.max(1) as usize;
            for r in 0..n / per_row {
                let mut pick: Vec<i32> = (0..n_rows as i32).collect();
                for i in 0..per_row {
                    let k = i % n_rows;
                    let j = k + (rng.next() % (n_rows - k) as u64) as usize;
                    pick.swap(k, j);
                    // SAFETY: r * per_row + i < n elements of I32.
                    unsafe { *data.cast::<i32>().add(r * per_row + i) = pick[k] };
                }
            }
        }
        Fill::Uniform(lo, hi) => {
            let vals: Vec<f32> = (0..n).map(|_| rng.uniform(lo, hi)).collect();
            // SAFETY: conversions write exactly the tensor's bytes.
            unsafe {
                match ty {
                    sys::GGML_TYPE_F32 => {
                        std::ptr::copy_nonoverlapping(vals.as_ptr(), data.cast::<f32>(), n)
                    }
                    sys::GGML_TYPE_F16 => {
                        sys::ggml_fp32_to_fp16_row(vals.as_ptr(), data.cast(), n as i64)
                    }
                    _ => {
                        let rows = n as i64 / ne0;
                        sys::ggml_quantize_chunk(
                            ty,
                            vals.as_ptr(),
                            data,
                            0,
                            rows,
                            ne0,
                            std::ptr::null(),
                        );
                    }
                }
            }
        }
    }
}

/// Every tensor the graph reaches, sources first.
fn closure(nodes: &[T]) -> Vec<T> {
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    let mut stack: Vec<(T, bool)> = nodes.iter().rev().map(|&n| (n, false)).collect();
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t as usize) {
            continue;
        }
        stack.push((t, true));
        // SAFETY: live tensors of the case's context.
        let (srcs, view) = unsafe { ((*t).src, (*t).view_src) };
        for s in srcs.iter().chain(std::iter::once(&view)) {
            if !s.is_null() && !seen.contains(&(*s as usize)) {
                stack.push((*s, false));
            }
        }
    }
    order
}

/// Output values as f32 (any type with a `to_float`).
fn floats_of(t: T, bytes: &[u8]) -> Vec<f32> {
    // SAFETY: t is live; traits are static.
    let (ty, n) = unsafe { ((*t).type_, sys::ggml_nelements(t) as usize) };
    match ty {
        sys::GGML_TYPE_F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        sys::GGML_TYPE_I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
        sys::GGML_TYPE_I8 => bytes.iter().map(|&b| b as i8 as f32).collect(),
        sys::GGML_TYPE_I16 => bytes
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32)
            .collect(),
        sys::GGML_TYPE_I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        _ => {
            let mut out = vec![0f32; n];
            // SAFETY: traits of a valid type; to_float reads n elements of
            // contiguous data in `bytes` (which holds nbytes).
            unsafe {
                let traits = sys::ggml_get_type_traits(ty);
                let f = (*traits).to_float.expect("type without to_float");
                f(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64);
            }
            out
        }
    }
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (f64::from(*g), f64::from(*w));
        // Equal values (infinities of masks included) and NaN in both.
        if g == w || (g.is_nan() && w.is_nan()) {
            continue;
        }
        err += (g - w) * (g - w);
        norm += w * w;
    }
    if norm == 0.0 { err } else { err / norm }
}

enum Outcome {
    Equal,
    Refused(String),
}

/// Sends the case's graph to the server, computes it here, compares.
fn run(
    server: &transfer_rpc::server::ServerHandle,
    mut case: Case,
    out: T,
    tol: f64,
    repeat: usize,
    rng: &mut Rng,
) -> Outcome {
    // SAFETY: live context; the graph holds up to 64 nodes here.
    let (graph, nodes) = unsafe {
        let g = sys::ggml_new_graph_custom(case.ctx, 256, false);
        sys::ggml_build_forward_expand(g, out);
        let n = sys::ggml_graph_n_nodes(g);
        let nodes: Vec<T> = (0..n).map(|i| sys::ggml_graph_node(g, i)).collect();
        (g, nodes)
    };
    for (t, how) in std::mem::take(&mut case.leaves) {
        fill(t, how, rng);
    }
    let all = closure(&nodes);
    // Place every tensor that owns memory; views resolve to their source.
    let align = 64u64;
    let mut offsets: HashMap<usize, u64> = HashMap::new();
    let mut size = 0u64;
    for &t in &all {
        // SAFETY: live tensor.
        if unsafe { (*t).view_src }.is_null() {
            offsets.insert(t as usize, size);
            size = (size + nbytes(t) as u64).next_multiple_of(align);
        }
    }
    let mut c: Client = connect(server);
    let (buf, base) = alloc(&mut c, size.max(64));
    let rpc: Vec<RpcTensor> = all
        .iter()
        .map(|&t| {
            // SAFETY: live tensors.
            let tr = unsafe { &*t };
            let (owner, extra) = if tr.view_src.is_null() {
                (t, 0)
            } else {
                (tr.view_src, tr.view_offs as u64)
            };
            let mut src = [0u64; 10];
            for (d, s) in src.iter_mut().zip(tr.src.iter()) {
                *d = *s as u64;
            }
            RpcTensor {
                id: t as u64,
                ty: tr.type_,
                buffer: buf,
                ne: tr.ne.map(|v| v as u32),
                nb: tr.nb.map(|v| v as u32),
                op: tr.op,
                op_params: tr.op_params,
                flags: tr.flags,
                src,
                view_src: tr.view_src as u64,
                view_offs: tr.view_offs as u64,
                data: base + offsets[&(owner as usize)] + extra,
                ..RpcTensor::default()
            }
        })
        .collect();
    // Upload every leaf that owns memory (before the reference runs: some
    // ops write into their sources).
    for (&t, r) in all.iter().zip(&rpc) {
        // SAFETY: live tensor.
        let (op, view) = unsafe { ((*t).op, (*t).view_src) };
        if op == sys::GGML_OP_NONE && view.is_null() {
            // SAFETY: a contiguous leaf's own bytes.
            let bytes = unsafe { std::slice::from_raw_parts((*t).data.cast::<u8>(), nbytes(t)) };
            c.set_tensor(r, 0, bytes).unwrap();
        }
    }
    // SAFETY: the graph and its memory are live.
    let status = unsafe { sys::ggml_graph_compute_with_ctx(case.ctx, graph, 2) };
    assert_eq!(status, sys::GGML_STATUS_SUCCESS);
    let payload = GraphPayload {
        device: 0,
        nodes: (0..repeat)
            .flat_map(|_| nodes.iter().map(|&n| n as u64))
            .collect(),
        tensors: rpc.clone(),
    };
    if let Err(e) = c.graph_compute(&payload) {
        return Outcome::Refused(e.to_string());
    }
    let out_rpc = rpc
        .iter()
        .find(|r| r.id == out as u64)
        .expect("output placed");
    // GRAPH_COMPUTE has no answer: a refusal shows on the next command.
    let got = match c.get_tensor(out_rpc, 0, nbytes(out) as u64) {
        Ok(b) => b,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    // SAFETY: the output's own bytes (contiguous: every case's output is).
    let want = unsafe { std::slice::from_raw_parts((*out).data.cast::<u8>(), nbytes(out)) };
    let (g, w) = (floats_of(out, &got), floats_of(out, want));
    let err = nmse(&g, &w);
    assert!(
        err <= tol,
        "wrong result: NMSE {err:e} > {tol:e} (first values {:?} vs {:?})",
        &g[..g.len().min(4)],
        &w[..w.len().min(4)]
    );
    Outcome::Equal
}

/// A case: its description, a builder, its tolerance, and how many times
/// the graph sent to the server lists its nodes (test-backend-ops' perf
/// mode repeats them; the reference runs them once: the cases repeated
/// compute the same values every time).
struct Spec {
    desc: String,
    tol: f64,
    build: Box<dyn Fn(&mut Case) -> T>,
    repeat: usize,
}

fn spec(desc: String, tol: f64, build: impl Fn(&mut Case) -> T + 'static) -> Spec {
    Spec {
        desc,
        tol,
        build: Box::new(build),
        repeat: 1,
    }
}

/// `s` with its node list sent `n` times over.
fn repeated(mut s: Spec, n: usize) -> Spec {
    s.desc = format!("{} (nodes listed {n} times)", s.desc);
    s.repeat = n;
    s
}

const F32: sys::ggml_type = sys::GGML_TYPE_F32;
const F16: sys::ggml_type = sys::GGML_TYPE_F16;

/// Swaps dims 1 and 2 of a fresh contiguous input of shape `ne` (the
/// permuted operands of test-backend-ops: rows stay contiguous, which
/// ggml-cpu's kernels require of dim 0).
fn permuted_input(c: &mut Case, ty: sys::ggml_type, ne: [i64; 4]) -> T {
    let t = c.input(ty, [ne[0], ne[2], ne[1], ne[3]]);
    // SAFETY: live context and tensor.
    unsafe { sys::ggml_permute(c.ctx, t, 0, 2, 1, 3) }
}

/// A strided view: every other row of a tensor twice as tall.
fn strided_input(c: &mut Case, ty: sys::ggml_type, ne: [i64; 4]) -> T {
    let t = c.input(ty, [ne[0], ne[1] * 2, ne[2], ne[3]]);
    // SAFETY: live tensor; the view stays inside it.
    unsafe {
        let nb = (*t).nb;
        sys::ggml_view_4d(
            c.ctx,
            t,
            ne[0],
            ne[1],
            ne[2],
            ne[3],
            nb[1] * 2,
            nb[2],
            nb[3],
            0,
        )
    }
}

fn cases() -> Vec<Spec> {
    let mut v = Vec::new();
    // Binary ops with broadcasting (test_bin_bcast), f32 and f16, plus
    // permuted operands.
    type Bin = unsafe extern "C" fn(*mut sys::ggml_context, T, T) -> T;
    let bins: [(&str, Bin); 4] = [
        ("add", sys::ggml_add),
        ("sub", sys::ggml_sub),
        ("mul", sys::ggml_mul),
        ("div", sys::ggml_div),
    ];
    for (name, f) in bins {
        for ty in [F32, F16] {
            for nr in [
                [1, 1, 1, 1],
                [2, 1, 1, 1],
                [1, 2, 1, 1],
                [1, 1, 2, 1],
                [1, 1, 1, 2],
                [2, 2, 2, 2],
            ] {
                let ne = [16i64, 10, 4, 3];
                v.push(spec(
                    format!("{name} {ty} ne {ne:?} nr {nr:?}"),
                    1e-7,
                    move |c| {
                        let a = c.input(
                            ty,
                            [ne[0] * nr[0], ne[1] * nr[1], ne[2] * nr[2], ne[3] * nr[3]],
                        );
                        let b = c.tensor(ty, ne, Fill::Uniform(0.5, 1.5));
                        // SAFETY: live context and tensors.
                        unsafe { f(c.ctx, a, b) }
                    },
                ));
            }
            v.push(spec(format!("{name} {ty} permuted a"), 1e-7, move |c| {
                let a = permuted_input(c, ty, [16, 10, 4, 3]);
                let b = c.tensor(ty, [16, 10, 4, 3], Fill::Uniform(0.5, 1.5));
                // SAFETY: as above.
                unsafe { f(c.ctx, a, b) }
            }));
        }
    }
    // Unary ops (test_unary), contiguous and strided.
    let unary = [
        sys::GGML_UNARY_OP_ABS,
        sys::GGML_UNARY_OP_SGN,
        sys::GGML_UNARY_OP_NEG,
        sys::GGML_UNARY_OP_STEP,
        sys::GGML_UNARY_OP_TANH,
        sys::GGML_UNARY_OP_ELU,
        sys::GGML_UNARY_OP_RELU,
        sys::GGML_UNARY_OP_SIGMOID,
        sys::GGML_UNARY_OP_GELU,
        sys::GGML_UNARY_OP_GELU_QUICK,
        sys::GGML_UNARY_OP_SILU,
        sys::GGML_UNARY_OP_HARDSWISH,
        sys::GGML_UNARY_OP_HARDSIGMOID,
        sys::GGML_UNARY_OP_EXP,
        sys::GGML_UNARY_OP_GELU_ERF,
    ];
    for op in unary {
        for ty in [F32, F16] {
            for strided in [false, true] {
                v.push(spec(
                    format!("unary {op} {ty} strided {strided}"),
                    1e-7,
                    move |c| {
                        let ne = [128, 2, 2, 2];
                        let a = if strided {
                            strided_input(c, ty, ne)
                        } else {
                            c.input(ty, ne)
                        };
                        // SAFETY: live context and tensor.
                        unsafe { sys::ggml_unary(c.ctx, a, op) }
                    },
                ));
            }
        }
    }
    // GLU (test_glu): fused (one input, halves) and split, swapped.
    let glus = [
        sys::GGML_GLU_OP_REGLU,
        sys::GGML_GLU_OP_GEGLU,
        sys::GGML_GLU_OP_SWIGLU,
        sys::GGML_GLU_OP_GEGLU_ERF,
        sys::GGML_GLU_OP_GEGLU_QUICK,
    ];
    for op in glus {
        for ty in [F32, F16] {
            for swapped in [false, true] {
                v.push(spec(
                    format!("glu {op} {ty} swapped {swapped}"),
                    1e-7,
                    move |c| {
                        let a = c.input(ty, [128, 2, 2, 2]);
                        // SAFETY: live context and tensor.
                        unsafe { sys::ggml_glu(c.ctx, a, op, swapped) }
                    },
                ));
            }
            v.push(spec(format!("glu split {op} {ty}"), 1e-7, move |c| {
                let a = c.input(ty, [64, 3, 2, 1]);
                let b = c.input(ty, [64, 3, 2, 1]);
                // SAFETY: as above.
                unsafe { sys::ggml_glu_split(c.ctx, a, b, op) }
            }));
        }
    }
    v.push(spec("swiglu_oai f32".into(), 1e-7, |c| {
        let a = c.input(F32, [64, 3, 2, 1]);
        let b = c.input(F32, [64, 3, 2, 1]);
        // SAFETY: as above.
        unsafe { sys::ggml_swiglu_oai(c.ctx, a, b, 1.702, 7.0) }
    }));
    // Norms (test_norm / test_rms_norm), contiguous and strided rows.
    for eps in [1e-6f32, 1e-5] {
        for strided in [false, true] {
            for rms in [false, true] {
                v.push(spec(
                    format!("norm rms {rms} eps {eps} strided {strided}"),
                    1e-7,
                    move |c| {
                        let ne = [64, 5, 4, 3];
                        let a = if strided {
                            strided_input(c, F32, ne)
                        } else {
                            c.input(F32, ne)
                        };
                        // SAFETY: live context and tensor.
                        unsafe {
                            if rms {
                                sys::ggml_rms_norm(c.ctx, a, eps)
                            } else {
                                sys::ggml_norm(c.ctx, a, eps)
                            }
                        }
                    },
                ));
            }
        }
    }
    // Scale (test_scale).
    for (s, b) in [(2.0f32, 0.0f32), (0.5, 1.0)] {
        v.push(spec(format!("scale {s} bias {b}"), 1e-7, move |c| {
            let a = c.input(F32, [10, 10, 10, 10]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_scale_bias(c.ctx, a, s, b) }
        }));
    }
    // Matrix multiplication (test_mul_mat): weight types, batches and
    // broadcasting, permuted activations.
    let weights = [
        (F32, 1e-4),
        (F16, 5e-4),
        (sys::GGML_TYPE_BF16, 5e-4),
        (sys::GGML_TYPE_Q4_0, 5e-4),
        (sys::GGML_TYPE_Q4_1, 5e-4),
        (sys::GGML_TYPE_Q5_0, 5e-4),
        (sys::GGML_TYPE_Q5_1, 5e-4),
        (sys::GGML_TYPE_Q8_0, 5e-4),
        (sys::GGML_TYPE_Q2_K, 5e-4),
        (sys::GGML_TYPE_Q3_K, 5e-4),
        (sys::GGML_TYPE_Q4_K, 5e-4),
        (sys::GGML_TYPE_Q5_K, 5e-4),
        (sys::GGML_TYPE_Q6_K, 5e-4),
        (sys::GGML_TYPE_IQ4_NL, 5e-4),
    ];
    for (ta, tol) in weights {
        for (m, n, k) in [(16i64, 1i64, 256i64), (16, 8, 256), (33, 3, 512)] {
            for (bs, nr) in [
                ([1i64, 1i64], [1i64, 1i64]),
                ([3, 2], [1, 1]),
                ([3, 2], [2, 1]),
            ] {
                v.push(spec(
                    format!("mul_mat {ta}xf32 m{m} n{n} k{k} bs{bs:?} nr{nr:?}"),
                    tol,
                    move |c| {
                        let a = c.input(ta, [k, m, bs[0], bs[1]]);
                        let b = c.input(F32, [k, n, bs[0] * nr[0], bs[1] * nr[1]]);
                        // SAFETY: live context and tensors.
                        unsafe { sys::ggml_mul_mat(c.ctx, a, b) }
                    },
                ));
            }
        }
        v.push(spec(
            format!("mul_mat {ta}xf32 permuted b"),
            tol,
            move |c| {
                let a = c.input(ta, [256, 16, 2, 1]);
                let b = permuted_input(c, F32, [256, 4, 2, 1]);
                // SAFETY: as above.
                unsafe { sys::ggml_mul_mat(c.ctx, a, b) }
            },
        ));
    }
    v.push(spec("mul_mat f16xf16".into(), 5e-4, |c| {
        let a = c.input(F16, [256, 16, 2, 1]);
        let b = c.input(F16, [256, 4, 2, 1]);
        // SAFETY: as above.
        unsafe { sys::ggml_mul_mat(c.ctx, a, b) }
    }));
    // Row gather and scatter (test_get_rows, test_set_rows).
    for ty in [F32, F16, sys::GGML_TYPE_Q4_0, sys::GGML_TYPE_Q8_0] {
        for b in [1i64, 3] {
            v.push(spec(format!("get_rows {ty} batch {b}"), 1e-7, move |c| {
                let a = c.input(ty, [256, 5, b, 1]);
                let idx = c.tensor(sys::GGML_TYPE_I32, [3, b, 1, 1], Fill::Index(5));
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_get_rows(c.ctx, a, idx) }
            }));
        }
    }
    for ty in [F32, F16, sys::GGML_TYPE_Q8_0, sys::GGML_TYPE_Q4_0] {
        for ti in [sys::GGML_TYPE_I64, sys::GGML_TYPE_I32] {
            v.push(spec(format!("set_rows {ty} idx {ti}"), 1e-6, move |c| {
                let dst = c.tensor(ty, [256, 7, 2, 1], Fill::Zero);
                let src = c.input(F32, [256, 3, 2, 1]);
                let idx = c.tensor(ti, [3, 2, 1, 1], Fill::Index(7));
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_set_rows(c.ctx, dst, src, idx) }
            }));
        }
    }
    // Copies and conversions (test_cpy, test_cont, test_dup).
    for (from, to) in [
        (F32, F32),
        (F32, F16),
        (F16, F32),
        (F16, F16),
        (F32, sys::GGML_TYPE_Q8_0),
        (F32, sys::GGML_TYPE_Q4_0),
        (F32, sys::GGML_TYPE_BF16),
    ] {
        for permute in [false, true] {
            v.push(spec(
                format!("cpy {from}->{to} permuted src {permute}"),
                1e-6,
                move |c| {
                    let ne = [256, 4, 4, 2];
                    let a = if permute {
                        permuted_input(c, from, [256, 4, 4, 2])
                    } else {
                        c.input(from, ne)
                    };
                    // SAFETY: live tensors; the destination has a's shape.
                    unsafe {
                        let shape = (*a).ne;
                        let b = c.tensor(to, shape, Fill::Zero);
                        sys::ggml_cpy(c.ctx, a, b)
                    }
                },
            ));
        }
    }
    for ty in [F32, F16, sys::GGML_TYPE_I32] {
        v.push(spec(format!("cont {ty} of a transpose"), 1e-7, move |c| {
            let a = if ty == sys::GGML_TYPE_I32 {
                c.tensor(ty, [8, 6, 2, 1], Fill::Index(1000))
            } else {
                c.input(ty, [8, 6, 2, 1])
            };
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_cont(c.ctx, sys::ggml_transpose(c.ctx, a)) }
        }));
        v.push(spec(format!("dup {ty}"), 1e-7, move |c| {
            let a = if ty == sys::GGML_TYPE_I32 {
                c.tensor(ty, [8, 6, 2, 1], Fill::Index(1000))
            } else {
                c.input(ty, [8, 6, 2, 1])
            };
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_dup(c.ctx, a) }
        }));
    }
    // RoPE (test_rope): modes normal, NEOX, multi-section, vision; full and
    // partial rotation; with and without YaRN extension.
    for ty in [F32, F16] {
        for (mode, n_dims) in [(0, 64), (0, 32), (2, 64), (2, 32), (8, 64), (24, 32)] {
            for ext in [0.0f32, 1.0] {
                v.push(spec(
                    format!("rope {ty} mode {mode} dims {n_dims} ext {ext}"),
                    1e-6,
                    move |c| {
                        let heads = 4;
                        let a = c.input(ty, [64, heads, 3, 1]);
                        let multi = mode & 8 != 0;
                        let pos_len = if multi { 3 * 4 } else { 3 };
                        let pos =
                            c.tensor(sys::GGML_TYPE_I32, [pos_len, 1, 1, 1], Fill::Index(100));
                        // SAFETY: live context and tensors.
                        unsafe {
                            if multi {
                                let mut sections = if mode == 24 {
                                    [8, 8, 0, 0]
                                } else {
                                    [16, 8, 8, 0]
                                };
                                sys::ggml_rope_multi(
                                    c.ctx,
                                    a,
                                    pos,
                                    std::ptr::null_mut(),
                                    n_dims,
                                    sections.as_mut_ptr(),
                                    mode,
                                    4096,
                                    10000.0,
                                    1.0,
                                    ext,
                                    1.0,
                                    32.0,
                                    1.0,
                                )
                            } else {
                                sys::ggml_rope_ext(
                                    c.ctx,
                                    a,
                                    pos,
                                    std::ptr::null_mut(),
                                    n_dims,
                                    mode,
                                    4096,
                                    10000.0,
                                    1.0,
                                    ext,
                                    1.0,
                                    32.0,
                                    1.0,
                                )
                            }
                        }
                    },
                ));
            }
        }
    }
    // Softmax (test_soft_max): masks of both types with broadcasting,
    // ALiBi, sinks.
    for mask_ty in [None, Some(F32), Some(F16)] {
        for max_bias in [0.0f32, 8.0] {
            if mask_ty.is_none() && max_bias > 0.0 {
                continue; // ALiBi needs a mask (ggml_soft_max_ext asserts it)
            }
            for sinks in [false, true] {
                v.push(spec(
                    format!("soft_max mask {mask_ty:?} max_bias {max_bias} sinks {sinks}"),
                    1e-6,
                    move |c| {
                        let a = c.input(F32, [32, 4, 8, 1]);
                        let mask = match mask_ty {
                            Some(t) => c.input(t, [32, 4, 1, 1]),
                            None => std::ptr::null_mut(),
                        };
                        // SAFETY: live context and tensors.
                        unsafe {
                            let r = sys::ggml_soft_max_ext(c.ctx, a, mask, 0.125, max_bias);
                            if sinks {
                                let s = c.input(F32, [8, 1, 1, 1]);
                                sys::ggml_soft_max_add_sinks(r, s);
                            }
                            r
                        }
                    },
                ));
            }
        }
    }
    // Flash attention (test_flash_attn_ext): head sizes, GQA, KV types,
    // masks, ALiBi, softcap, sinks, precision.
    for kv_ty in [F16, F32, sys::GGML_TYPE_Q8_0, sys::GGML_TYPE_Q4_0] {
        for (hs, nh, nr, kv, nb) in [(64i64, 4i64, 1i64, 96i64, 1i64), (128, 2, 4, 256, 3)] {
            for (max_bias, softcap, sinks) in [
                (0.0f32, 0.0f32, false),
                (8.0, 0.0, false),
                (0.0, 10.0, true),
            ] {
                v.push(spec(
                    format!("flash_attn_ext kv {kv_ty} hs {hs} nh {nh}x{nr} kv {kv} nb {nb} bias {max_bias} cap {softcap} sinks {sinks}"),
                    5e-4,
                    move |c| {
                        let q = c.input(F32, [hs, nb, nh * nr, 1]);
                        let k = c.input(kv_ty, [hs, kv, nh, 1]);
                        let vv = c.input(kv_ty, [hs, kv, nh, 1]);
                        let mask = c.tensor(F16, [kv, nb, 1, 1], Fill::Uniform(-1.0, 0.0));
                        // SAFETY: live context and tensors.
                        unsafe {
                            let r = sys::ggml_flash_attn_ext(
                                c.ctx, q, k, vv, mask, 1.0 / (hs as f32).sqrt(), max_bias, softcap,
                            );
                            if sinks {
                                let s = c.input(F32, [nh * nr, 1, 1, 1]);
                                sys::ggml_flash_attn_ext_add_sinks(r, s);
                            }
                            sys::ggml_flash_attn_ext_set_prec(r, sys::GGML_PREC_F32);
                            r
                        }
                    },
                ));
            }
        }
    }
    more_existing_op_cases(&mut v);
    new_op_cases(&mut v);
    batch2_op_cases(&mut v);
    vision_op_cases(&mut v);
    misc_op_cases(&mut v);
    train_op_cases(&mut v);
    issue22_cases(&mut v);
    v
}

/// The forms test-backend-ops runs that ggml-cpu computes and the rules
/// refused before issue 22: binary ops whose src1 is permuted (rows not
/// packed, test_bin_bcast's perm1) in F32, F16 and BF16 with broadcasting,
/// NORM of non-packed rows (test_norm's noncontig_rows, with and without
/// the half view), GLU of rows of odd length (test_glu's {5, 7, 11, 13}),
/// SUM of a source permuted in dims 0 and 1 (test_sum's `{1, 0, 2, 3}`),
/// SCALE of BF16.
fn issue22_cases(v: &mut Vec<Spec>) {
    const BF16: sys::ggml_type = sys::GGML_TYPE_BF16;
    type Bin = unsafe extern "C" fn(*mut sys::ggml_context, T, T) -> T;
    let bins: [(&str, Bin); 4] = [
        ("add", sys::ggml_add),
        ("sub", sys::ggml_sub),
        ("mul", sys::ggml_mul),
        ("div", sys::ggml_div),
    ];
    for (name, f) in bins {
        for ty in [F32, F16, BF16] {
            for (ne, nr) in [
                ([1i64, 1, 8, 1], [1i64, 1, 1, 1]),
                ([10, 5, 4, 3], [1, 1, 1, 1]),
                ([10, 5, 4, 3], [2, 1, 1, 1]),
                ([10, 5, 4, 3], [1, 2, 2, 2]),
                ([10, 5, 4, 3], [2, 2, 2, 2]),
            ] {
                let tol = if ty == F32 { 1e-7 } else { 1e-5 };
                v.push(spec(
                    format!("{name} {ty} ne {ne:?} nr {nr:?} permuted b"),
                    tol,
                    move |c| {
                        let a = c.input(
                            ty,
                            [ne[0] * nr[0], ne[1] * nr[1], ne[2] * nr[2], ne[3] * nr[3]],
                        );
                        // test_bin_bcast's perm1: b stored [ne1, ne2, ne0,
                        // ne3] and permuted (1, 2, 0, 3) back to ne.
                        let b = c.tensor(ty, [ne[1], ne[2], ne[0], ne[3]], Fill::Uniform(0.5, 1.5));
                        // SAFETY: live context and tensors.
                        unsafe { f(c.ctx, a, sys::ggml_permute(c.ctx, b, 1, 2, 0, 3)) }
                    },
                ));
            }
        }
    }
    for n in [64i64, 1025] {
        for half_view in [false, true] {
            v.push(spec(
                format!("norm of non-packed rows n {n} half view {half_view}"),
                1e-6,
                move |c| {
                    let a = c.input(F32, [5, n, 4, 3]);
                    // SAFETY: live context and tensors; the view stays
                    // inside the permuted tensor.
                    unsafe {
                        let mut a = sys::ggml_permute(c.ctx, a, 1, 0, 2, 3);
                        if half_view {
                            let (ne, nb) = ((*a).ne, (*a).nb);
                            a = sys::ggml_view_4d(
                                c.ctx,
                                a,
                                ne[0] / 2,
                                ne[1] / 2,
                                ne[2] / 2,
                                ne[3] / 2,
                                nb[1],
                                nb[2],
                                nb[3],
                                0,
                            );
                        }
                        sys::ggml_norm(c.ctx, a, 1e-6)
                    }
                },
            ));
        }
    }
    let glus = [
        sys::GGML_GLU_OP_REGLU,
        sys::GGML_GLU_OP_GEGLU,
        sys::GGML_GLU_OP_SWIGLU,
        sys::GGML_GLU_OP_GEGLU_ERF,
        sys::GGML_GLU_OP_GEGLU_QUICK,
    ];
    for op in glus {
        for ty in [F32, F16, BF16] {
            for swapped in [false, true] {
                for strided in [false, true] {
                    let tol = if ty == F32 { 1e-7 } else { 1e-5 };
                    v.push(spec(
                        format!("glu {op} {ty} odd rows swapped {swapped} strided {strided}"),
                        tol,
                        move |c| {
                            let ne = [5i64, 7, 11, 13];
                            // test_glu's v = 1: a view of the first ne0 of
                            // rows three times as long.
                            let a = if strided {
                                let t = c.input(ty, [ne[0] * 3, ne[1], ne[2], ne[3]]);
                                // SAFETY: live tensor; the view stays inside it.
                                unsafe {
                                    let nb = (*t).nb;
                                    sys::ggml_view_4d(
                                        c.ctx, t, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3],
                                        0,
                                    )
                                }
                            } else {
                                c.input(ty, ne)
                            };
                            // SAFETY: live context and tensor.
                            unsafe { sys::ggml_glu(c.ctx, a, op, swapped) }
                        },
                    ));
                }
            }
        }
    }
    // test_scale's BF16 cases (scale_bf16), with and without bias.
    for (sc, bias) in [(2.0f32, 1.0f32), (0.5, 0.0)] {
        v.push(spec(
            format!("scale bf16 {sc} bias {bias}"),
            1e-5,
            move |c| {
                let a = c.input(BF16, [100, 10, 10, 10]);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_scale_bias(c.ctx, a, sc, bias) }
            },
        ));
    }
    v.push(spec("sum permuted 1 0 2 3".into(), 1e-6, |c| {
        let a = c.input(F32, [33, 256, 1, 1]);
        // SAFETY: live context and tensor.
        unsafe { sys::ggml_sum(c.ctx, sys::ggml_permute(c.ctx, a, 1, 0, 2, 3)) }
    }));
}

/// Transposes dims 1 and 2 of a fresh contiguous leaf of `ty`, `fill`.
fn permuted_leaf(c: &mut Case, ty: sys::ggml_type, ne: [i64; 4], how: Fill) -> T {
    let t = c.tensor(ty, [ne[0], ne[2], ne[1], ne[3]], how);
    // SAFETY: live context and tensor.
    unsafe { sys::ggml_permute(c.ctx, t, 0, 2, 1, 3) }
}

/// Cases of the ops served before issue 11 that their first rules
/// refused: more copy type pairs, MUL_MAT src1 types, every rope mode
/// with frequency factors, flash attention K/V types and paths, more
/// SET_ROWS destinations.
fn more_existing_op_cases(v: &mut Vec<Spec>) {
    const BF16: sys::ggml_type = sys::GGML_TYPE_BF16;
    const I32: sys::ggml_type = sys::GGML_TYPE_I32;
    // Float to every block type with a from_float (test_cpy), plain and
    // by rows (permuted source).
    let quant_dst = [
        sys::GGML_TYPE_Q4_1,
        sys::GGML_TYPE_Q5_0,
        sys::GGML_TYPE_Q5_1,
        sys::GGML_TYPE_Q8_0,
        sys::GGML_TYPE_Q2_K,
        sys::GGML_TYPE_Q4_K,
        sys::GGML_TYPE_Q6_K,
        sys::GGML_TYPE_IQ4_NL,
        sys::GGML_TYPE_IQ4_XS,
        sys::GGML_TYPE_MXFP4,
        sys::GGML_TYPE_TQ2_0,
    ];
    for from in [F32, F16, BF16] {
        for to in quant_dst {
            for permute in [false, true] {
                v.push(spec(
                    format!("cpy {from}->{to} permuted src {permute}"),
                    1e-6,
                    move |c| {
                        let ne = [256, 2, 3, 4];
                        let a = if permute {
                            permuted_input(c, from, ne)
                        } else {
                            c.input(from, ne)
                        };
                        // SAFETY: live tensors; the destination has a's shape.
                        unsafe {
                            let b = c.tensor(to, (*a).ne, Fill::Zero);
                            sys::ggml_cpy(c.ctx, a, b)
                        }
                    },
                ));
            }
        }
    }
    // Block types to F32 (dequantizing copy), plain and by rows; the same
    // block type into another shape (both contiguous) and by rows.
    for from in [
        sys::GGML_TYPE_Q4_0,
        sys::GGML_TYPE_Q8_0,
        sys::GGML_TYPE_Q4_K,
        sys::GGML_TYPE_IQ4_NL,
        BF16,
        F16,
    ] {
        for permute in [false, true] {
            v.push(spec(
                format!("cpy {from}->f32 permuted src {permute}"),
                1e-6,
                move |c| {
                    let ne = [256, 2, 3, 4];
                    let a = if permute {
                        permuted_input(c, from, ne)
                    } else {
                        c.input(from, ne)
                    };
                    // SAFETY: as above.
                    unsafe {
                        let b = c.tensor(F32, (*a).ne, Fill::Zero);
                        sys::ggml_cpy(c.ctx, a, b)
                    }
                },
            ));
        }
    }
    // ggml_cast: a CPY whose src[1] is the result itself (test-backend-ops'
    // TOPK_QSA casts its F16 mask so; refused as a cycle before).
    v.push(spec("cast f16->f32".into(), 1e-7, |c| {
        let a = c.input(sys::GGML_TYPE_F16, [64, 3, 2, 1]);
        // SAFETY: live context and tensor.
        unsafe { sys::ggml_cast(c.ctx, a, F32) }
    }));
    for ty in [sys::GGML_TYPE_Q4_0, sys::GGML_TYPE_Q8_0] {
        v.push(spec(format!("cpy {ty}->{ty} reshaped"), 1e-7, move |c| {
            let a = c.input(ty, [32, 5, 7, 3]);
            // SAFETY: as above.
            unsafe {
                let b = c.tensor(ty, [32, 7, 5, 3], Fill::Zero);
                sys::ggml_cpy(c.ctx, a, b)
            }
        }));
        v.push(spec(format!("cont {ty} by rows"), 1e-7, move |c| {
            let a = permuted_input(c, ty, [64, 3, 4, 2]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_cont(c.ctx, a) }
        }));
    }
    // Integer copies: I32 <-> F32, same-type I32 / I16 copies of
    // permuted and transposed sources (test_cpy, test_dup).
    for (from, to) in [(F32, I32), (I32, F32), (I32, I32)] {
        for permute in [false, true] {
            v.push(spec(
                format!("cpy {from}->{to} permuted src {permute}"),
                1e-7,
                move |c| {
                    let ne = [256, 2, 3, 4];
                    let how = if from == I32 {
                        Fill::Index(1000)
                    } else {
                        Fill::Uniform(-100.0, 100.0)
                    };
                    let a = if permute {
                        permuted_leaf(c, from, ne, how)
                    } else {
                        c.tensor(from, ne, how)
                    };
                    // SAFETY: as above.
                    unsafe {
                        let b = c.tensor(to, (*a).ne, Fill::Zero);
                        sys::ggml_cpy(c.ctx, a, b)
                    }
                },
            ));
        }
    }
    for ty in [sys::GGML_TYPE_I16, I32, sys::GGML_TYPE_I8] {
        v.push(spec(format!("dup {ty} permuted"), 1e-7, move |c| {
            let a = permuted_leaf(c, ty, [10, 8, 3, 1], Fill::Index(100));
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_dup(c.ctx, a) }
        }));
    }
    // MUL_MAT with src1 of the vec_dot type (F16 x F16, BF16 x BF16,
    // Q8_0 activations for Q4_0 / Q8_0) and BF16 activations for F32
    // weights, plain and batched; permuted src1.
    for (ta, tb) in [
        (F16, F16),
        (BF16, BF16),
        (F32, BF16),
        (sys::GGML_TYPE_Q4_0, sys::GGML_TYPE_Q8_0),
        (sys::GGML_TYPE_Q8_0, sys::GGML_TYPE_Q8_0),
    ] {
        for (n, bs) in [(1i64, [1i64, 1i64]), (9, [3, 2])] {
            v.push(spec(
                format!("mul_mat {ta}x{tb} n{n} bs{bs:?}"),
                5e-4,
                move |c| {
                    let a = c.input(ta, [256, 16, bs[0], bs[1]]);
                    let b = c.input(tb, [256, n, bs[0] * 2, bs[1]]);
                    // SAFETY: live context and tensors.
                    unsafe { sys::ggml_mul_mat(c.ctx, a, b) }
                },
            ));
        }
        v.push(spec(
            format!("mul_mat {ta}x{tb} permuted b"),
            5e-4,
            move |c| {
                let a = c.input(ta, [256, 16, 2, 1]);
                let b = permuted_input(c, tb, [256, 4, 2, 1]);
                // SAFETY: as above.
                unsafe { sys::ggml_mul_mat(c.ctx, a, b) }
            },
        ));
    }
    // RoPE: interleaved multi-rope, and every mode with frequency
    // factors (test_rope ff) and a partial rotation.
    for ty in [F32, F16] {
        for (mode, n_dims) in [(0, 64), (2, 32), (8, 64), (24, 32), (40, 64), (40, 32)] {
            for ff in [false, true] {
                v.push(spec(
                    format!("rope {ty} mode {mode} dims {n_dims} ff {ff}"),
                    1e-6,
                    move |c| {
                        let a = c.input(ty, [64, 4, 3, 2]);
                        let multi = mode & 8 != 0;
                        let pos_len = if multi { 3 * 4 } else { 3 };
                        let pos = c.tensor(I32, [pos_len, 1, 1, 1], Fill::Index(100));
                        let freq = if ff {
                            c.tensor(F32, [32, 1, 1, 1], Fill::Uniform(0.9, 1.1))
                        } else {
                            std::ptr::null_mut()
                        };
                        let mut sections = match mode {
                            24 => [8, 8, 0, 0],
                            40 => [11, 11, 10, 0],
                            _ => [16, 8, 8, 0],
                        };
                        // SAFETY: live context and tensors.
                        unsafe {
                            if multi {
                                sys::ggml_rope_multi(
                                    c.ctx,
                                    a,
                                    pos,
                                    freq,
                                    n_dims,
                                    sections.as_mut_ptr(),
                                    mode,
                                    4096,
                                    10000.0,
                                    1.0,
                                    0.5,
                                    1.0,
                                    32.0,
                                    1.0,
                                )
                            } else {
                                sys::ggml_rope_ext(
                                    c.ctx, a, pos, freq, n_dims, mode, 4096, 10000.0, 1.0, 0.5,
                                    1.0, 32.0, 1.0,
                                )
                            }
                        }
                    },
                ));
            }
        }
    }
    // Flash attention: BF16 and K-quant K/V (head size 256), the tiled
    // prefill path (64 query rows, F16 / F32 K == V) and the split-KV
    // decode path (one query, 512 keys), each with sinks.
    for (kv_ty, hs, nb, kv) in [
        (BF16, 64i64, 3i64, 96i64),
        (sys::GGML_TYPE_Q4_K, 256, 2, 64),
        (sys::GGML_TYPE_IQ4_NL, 64, 2, 64),
        (F16, 64, 64, 128),
        (F32, 64, 64, 128),
        (F16, 64, 1, 512),
        (F32, 128, 1, 640),
    ] {
        for sinks in [false, true] {
            v.push(spec(
                format!("flash_attn_ext kv {kv_ty} hs {hs} nb {nb} kv {kv} sinks {sinks}"),
                5e-4,
                move |c| {
                    let (nh, nr) = (2i64, 2i64);
                    let q = c.input(F32, [hs, nb, nh * nr, 1]);
                    let k = c.input(kv_ty, [hs, kv, nh, 1]);
                    let vv = c.input(kv_ty, [hs, kv, nh, 1]);
                    let mask = c.tensor(F16, [kv, nb, 1, 1], Fill::Uniform(-1.0, 0.0));
                    // SAFETY: live context and tensors.
                    unsafe {
                        let r = sys::ggml_flash_attn_ext(
                            c.ctx,
                            q,
                            k,
                            vv,
                            mask,
                            1.0 / (hs as f32).sqrt(),
                            0.0,
                            0.0,
                        );
                        if sinks {
                            let s = c.input(F32, [nh * nr, 1, 1, 1]);
                            sys::ggml_flash_attn_ext_add_sinks(r, s);
                        }
                        sys::ggml_flash_attn_ext_set_prec(r, sys::GGML_PREC_F32);
                        r
                    }
                },
            ));
        }
    }
    // SET_ROWS into more destination types, from F32 and F16 rows.
    for ty in [
        BF16,
        sys::GGML_TYPE_Q5_1,
        sys::GGML_TYPE_Q4_K,
        sys::GGML_TYPE_IQ4_NL,
        I32,
    ] {
        for src_ty in [F32, F16] {
            v.push(spec(
                format!("set_rows {ty} from {src_ty}"),
                1e-6,
                move |c| {
                    let dst = c.tensor(ty, [256, 7, 2, 1], Fill::Zero);
                    let src = c.tensor(src_ty, [256, 3, 2, 1], Fill::Uniform(-8.0, 8.0));
                    let idx = c.tensor(sys::GGML_TYPE_I64, [3, 2, 1, 1], Fill::Index(7));
                    // SAFETY: live context and tensors.
                    unsafe { sys::ggml_set_rows(c.ctx, dst, src, idx) }
                },
            ));
        }
    }
}

/// Cases of the ops added to the allowlist in issue 11, mirroring
/// test-backend-ops: MoE (MUL_MAT_ID, ADD_ID, with router ids in memory
/// or computed in the graph by ARGSORT / TOP_K), reductions, sorts, shape
/// ops, element-wise ops, ACC / SET, DIAG_MASK_INF; and graphs that list
/// their nodes twice.
fn new_op_cases(v: &mut Vec<Spec>) {
    const BF16: sys::ggml_type = sys::GGML_TYPE_BF16;
    const I32: sys::ggml_type = sys::GGML_TYPE_I32;
    // MUL_MAT_ID (test_mul_mat_id): experts of each type, n_used of
    // n_mats per token, src1 one row per slot or broadcast (b), 1 to 17
    // tokens; 32 tokens for 2 of 4 K-quant experts reach the tiled path.
    let expert_types = [
        (F32, 1e-4),
        (F16, 5e-4),
        (BF16, 5e-4),
        (sys::GGML_TYPE_Q4_0, 5e-4),
        (sys::GGML_TYPE_Q8_0, 5e-4),
        (sys::GGML_TYPE_Q4_K, 5e-4),
        (sys::GGML_TYPE_IQ4_NL, 5e-4),
    ];
    for (ta, tol) in expert_types {
        for (n_mats, n_used) in [(4i64, 2i64), (8, 4), (4, 1)] {
            for bcast in [false, true] {
                for n in [1i64, 5, 17] {
                    v.push(spec(
                        format!("mul_mat_id {ta} {n_used}/{n_mats} b {bcast} n {n}"),
                        tol,
                        move |c| {
                            let (m, k) = (32, 256);
                            let a = c.input(ta, [k, m, n_mats, 1]);
                            let ids = c.tensor(I32, [n_used, n, 1, 1], Fill::Rows(n_mats));
                            let b = c.input(F32, [k, if bcast { 1 } else { n_used }, n, 1]);
                            // SAFETY: live context and tensors.
                            unsafe { sys::ggml_mul_mat_id(c.ctx, a, b, ids) }
                        },
                    ));
                }
            }
        }
        v.push(spec(format!("mul_mat_id {ta} 2/4 n 32"), tol, move |c| {
            let a = c.input(ta, [256, 64, 4, 1]);
            let ids = c.tensor(I32, [2, 32, 1, 1], Fill::Rows(4));
            let b = c.input(F32, [256, 2, 32, 1]);
            // SAFETY: as above.
            unsafe { sys::ggml_mul_mat_id(c.ctx, a, b, ids) }
        }));
    }
    // The MoE block as llama.cpp builds it: router logits -> argsort
    // (descending) -> top-k view -> MUL_MAT_ID experts and ADD_ID biases;
    // the ids are computed in the graph, so the server checks them after
    // the argsort ran. TOP_K as the router too.
    for (top_k_op, repeat) in [(false, 1), (true, 1), (false, 2)] {
        let s = spec(format!("moe block top_k op {top_k_op}"), 5e-4, move |c| {
            let (n_embd, n_ff, n_mats, n_used, n_tok) = (64i64, 32i64, 8i64, 2i64, 6i64);
            let x = c.input(F32, [n_embd, n_tok, 1, 1]);
            let router = c.input(F32, [n_embd, n_mats, 1, 1]);
            let experts = c.input(F16, [n_embd, n_ff, n_mats, 1]);
            let bias = c.input(F32, [n_ff, n_mats, 1, 1]);
            // SAFETY: live context and tensors; views stay inside.
            unsafe {
                let logits = sys::ggml_mul_mat(c.ctx, router, x);
                let ids = if top_k_op {
                    sys::ggml_top_k(c.ctx, logits, n_used as i32)
                } else {
                    sys::ggml_argsort_top_k(c.ctx, logits, n_used as i32)
                };
                let x3 = sys::ggml_reshape_3d(c.ctx, x, n_embd, 1, n_tok);
                let y = sys::ggml_mul_mat_id(c.ctx, experts, x3, ids);
                let y = sys::ggml_add_id(c.ctx, y, bias, ids);
                sys::ggml_cont(c.ctx, y)
            }
        });
        v.push(if repeat > 1 { repeated(s, repeat) } else { s });
    }
    // ADD_ID (test_add_id).
    for n_embd in [32i64, 129] {
        for (n_mats, n_used) in [(4i64, 1i64), (4, 2), (8, 4)] {
            for n_tok in [1i64, 32] {
                v.push(spec(
                    format!("add_id {n_embd} {n_used}/{n_mats} tokens {n_tok}"),
                    1e-7,
                    move |c| {
                        let a = c.input(F32, [n_embd, n_used, n_tok, 1]);
                        let b = c.input(F32, [n_embd, n_mats, 1, 1]);
                        let ids = c.tensor(I32, [n_used, n_tok, 1, 1], Fill::Rows(n_mats));
                        // SAFETY: live context and tensors.
                        unsafe { sys::ggml_add_id(c.ctx, a, b, ids) }
                    },
                ));
            }
        }
    }
    // CONCAT (test_concat): every dim, element-wise types (also with a
    // permuted first operand) and block types by rows.
    let concat_types = [
        F32,
        F16,
        BF16,
        sys::GGML_TYPE_I8,
        sys::GGML_TYPE_I16,
        I32,
        sys::GGML_TYPE_I64,
        sys::GGML_TYPE_Q4_0,
        sys::GGML_TYPE_Q8_0,
    ];
    for ty in concat_types {
        let int = matches!(
            ty,
            sys::GGML_TYPE_I8 | sys::GGML_TYPE_I16 | I32 | sys::GGML_TYPE_I64
        );
        let quant = matches!(ty, sys::GGML_TYPE_Q4_0 | sys::GGML_TYPE_Q8_0);
        for dim in 0..4usize {
            for permuted in [false, true] {
                if permuted && (quant || dim == 0) {
                    continue;
                }
                v.push(spec(
                    format!("concat {ty} dim {dim} permuted a {permuted}"),
                    1e-7,
                    move |c| {
                        let how = if int {
                            Fill::Index(100)
                        } else {
                            Fill::Uniform(-1.0, 1.0)
                        };
                        let ne: [i64; 4] = if quant { [64, 5, 3, 2] } else { [11, 12, 5, 3] };
                        let mut ne_b = ne;
                        ne_b[dim] = if quant && dim == 0 { 128 } else { 7 };
                        let a = if permuted {
                            permuted_leaf(c, ty, ne, how)
                        } else {
                            c.tensor(ty, ne, how)
                        };
                        let b = c.tensor(ty, ne_b, how);
                        // SAFETY: live context and tensors.
                        unsafe { sys::ggml_concat(c.ctx, a, b, dim as i32) }
                    },
                ));
            }
        }
    }
    // REPEAT (test_repeat).
    for (ty, nr) in [
        (F32, [1i64, 1, 1, 1]),
        (F32, [2, 1, 1, 1]),
        (F32, [1, 2, 1, 1]),
        (F32, [1, 1, 2, 1]),
        (F32, [1, 1, 1, 2]),
        (I32, [2, 1, 1, 1]),
        (sys::GGML_TYPE_I16, [1, 1, 1, 2]),
        (BF16, [2, 1, 1, 1]),
        (F16, [2, 2, 2, 2]),
    ] {
        v.push(spec(format!("repeat {ty} nr {nr:?}"), 1e-7, move |c| {
            let ne = [10i64, 5, 4, 3];
            let how = if matches!(ty, I32 | sys::GGML_TYPE_I16) {
                Fill::Index(1000)
            } else {
                Fill::Uniform(-1.0, 1.0)
            };
            let a = c.tensor(ty, ne, how);
            // SAFETY: live context and tensor.
            unsafe {
                sys::ggml_repeat_4d(
                    c.ctx,
                    a,
                    ne[0] * nr[0],
                    ne[1] * nr[1],
                    ne[2] * nr[2],
                    ne[3] * nr[3],
                )
            }
        }));
    }
    // ARGSORT (test_argsort) both orders, TOP_K (test_top_k).
    for order in [sys::GGML_SORT_ORDER_ASC, sys::GGML_SORT_ORDER_DESC] {
        for ne in [
            [16i64, 10, 10, 10],
            [60, 10, 10, 10],
            [1023, 2, 1, 3],
            [1025, 2, 1, 3],
            [7, 1, 1, 1],
        ] {
            v.push(spec(format!("argsort {order} {ne:?}"), 0.0, move |c| {
                let a = c.input(F32, ne);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_argsort(c.ctx, a, order) }
            }));
        }
    }
    for (ne, k) in [
        ([1i64, 2, 1, 3], 1),
        ([4, 2, 1, 3], 4),
        ([16, 10, 10, 10], 3),
        ([60, 10, 10, 10], 7),
        ([1025, 2, 1, 3], 15),
        ([2059, 1, 2, 1], 100),
    ] {
        v.push(spec(format!("top_k {ne:?} k {k}"), 0.0, move |c| {
            let a = c.input(F32, ne);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_top_k(c.ctx, a, k) }
        }));
    }
    // Reductions (test_sum, test_sum_rows, test_mean, test_argmax).
    for permuted in [false, true] {
        v.push(spec(format!("sum permuted {permuted}"), 1e-6, move |c| {
            let ne = [11, 5, 6, 3];
            let a = if permuted {
                permuted_input(c, F32, ne)
            } else {
                c.input(F32, ne)
            };
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_sum(c.ctx, a) }
        }));
    }
    for ty in [F16, BF16] {
        v.push(spec(format!("sum {ty}"), 1e-4, move |c| {
            let a = c.input(ty, [33, 4, 2, 1]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_sum(c.ctx, a) }
        }));
    }
    for ne in [[10i64, 5, 4, 3], [33, 256, 1, 1], [32769, 1, 1, 1]] {
        for mean in [false, true] {
            v.push(spec(
                format!("sum_rows mean {mean} {ne:?}"),
                1e-6,
                move |c| {
                    let a = c.input(F32, ne);
                    // SAFETY: live context and tensor.
                    unsafe {
                        if mean {
                            sys::ggml_mean(c.ctx, a)
                        } else {
                            sys::ggml_sum_rows(c.ctx, a)
                        }
                    }
                },
            ));
        }
    }
    v.push(spec("sum_rows strided".into(), 1e-6, |c| {
        let a = strided_input(c, F32, [16, 5, 6, 3]);
        // SAFETY: live context and tensor.
        unsafe { sys::ggml_sum_rows(c.ctx, a) }
    }));
    for ne in [[32i64, 1], [100, 10], [1024, 12], [5438, 3]] {
        v.push(spec(format!("argmax {ne:?}"), 0.0, move |c| {
            let a = c.input(F32, [ne[0], ne[1], 1, 1]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_argmax(c.ctx, a) }
        }));
    }
    // Element-wise (test_clamp, test_sqr, test_sqrt, test_l2_norm).
    for ty in [F32, F16] {
        for ne in [[10i64, 5, 4, 3], [7, 1, 5, 3]] {
            v.push(spec(format!("clamp {ty} {ne:?}"), 1e-7, move |c| {
                let a = c.input(ty, ne);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_clamp(c.ctx, a, -0.5, 0.5) }
            }));
            v.push(spec(format!("sqr {ty} {ne:?}"), 1e-7, move |c| {
                let a = c.input(ty, ne);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_sqr(c.ctx, a) }
            }));
            v.push(spec(format!("sqrt {ty} {ne:?}"), 1e-7, move |c| {
                let a = c.tensor(ty, ne, Fill::Uniform(0.1, 2.0));
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_sqrt(c.ctx, a) }
            }));
        }
        v.push(spec(format!("sqr {ty} strided"), 1e-7, move |c| {
            let a = strided_input(c, ty, [16, 5, 4, 3]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_sqr(c.ctx, a) }
        }));
    }
    for eps in [0.0f32, 1e-6, 1e-1] {
        for strided in [false, true] {
            v.push(spec(
                format!("l2_norm eps {eps} strided {strided}"),
                1e-6,
                move |c| {
                    let ne = [64, 5, 4, 3];
                    let a = if strided {
                        strided_input(c, F32, ne)
                    } else {
                        c.input(F32, ne)
                    };
                    // SAFETY: live context and tensor.
                    unsafe { sys::ggml_l2_norm(c.ctx, a, eps) }
                },
            ));
        }
    }
    // PAD (test_pad, test_pad_ext, circular).
    for (ne, lp, rp, circular) in [
        ([512i64, 16, 1, 1], [0i32, 0, 0, 0], [1i32, 1, 0, 0], false),
        ([33, 17, 2, 1], [0, 0, 0, 0], [4, 3, 0, 0], true),
        ([33, 17, 2, 3], [1, 2, 1, 0], [3, 4, 0, 1], false),
        ([33, 17, 2, 3], [3, 2, 1, 0], [3, 4, 2, 1], true),
        ([1024, 2, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], false),
    ] {
        v.push(spec(
            format!("pad {ne:?} lp {lp:?} rp {rp:?} circular {circular}"),
            1e-7,
            move |c| {
                let a = c.input(F32, ne);
                // SAFETY: live context and tensor.
                unsafe {
                    if circular {
                        sys::ggml_pad_ext_circular(
                            c.ctx, a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3],
                        )
                    } else {
                        sys::ggml_pad_ext(
                            c.ctx, a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3],
                        )
                    }
                }
            },
        ));
    }
    // ACC (test_acc): b added into a at row 1 (and at a column offset).
    for (ne_a, ne_b, col) in [
        ([256i64, 17, 1, 1], [256i64, 16, 1, 1], 0usize),
        ([256, 17, 2, 3], [256, 16, 2, 3], 0),
        ([256, 17, 2, 3], [128, 16, 2, 3], 64),
        ([256, 17, 2, 3], [64, 16, 2, 3], 192),
    ] {
        v.push(spec(
            format!("acc {ne_a:?} + {ne_b:?} at column {col}"),
            1e-7,
            move |c| {
                let a = c.input(F32, ne_a);
                let b = c.input(F32, ne_b);
                // SAFETY: live tensors; the view stays inside a.
                unsafe {
                    let nb = (*a).nb;
                    sys::ggml_acc(c.ctx, a, b, nb[1], nb[2], nb[3], nb[1] + 4 * col)
                }
            },
        ));
    }
    // SET (test_set): a slice of a, along dims 1..3, F32 and I32.
    for ty in [F32, I32] {
        for dim in 1..4usize {
            v.push(spec(format!("set {ty} dim {dim}"), 1e-7, move |c| {
                let ne = [6i64, 5, 4, 3];
                let mut ne_b = ne;
                ne_b[dim] = 2;
                let how = if ty == I32 {
                    Fill::Index(1000)
                } else {
                    Fill::Uniform(-1.0, 1.0)
                };
                let a = c.tensor(ty, ne, how);
                let b = c.tensor(ty, ne_b, how);
                // SAFETY: live tensors; the view (from index 1 of dim)
                // stays inside a.
                unsafe {
                    let nb = (*a).nb;
                    sys::ggml_set(c.ctx, a, b, nb[1], nb[2], nb[3], nb[dim])
                }
            }));
        }
    }
    // DIAG_MASK_INF (test_diag_mask_inf).
    for ne in [[10i64, 10, 1, 1], [10, 10, 3, 1], [10, 10, 3, 2]] {
        v.push(spec(format!("diag_mask_inf {ne:?}"), 1e-7, move |c| {
            let a = c.input(F32, ne);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_diag_mask_inf(c.ctx, a, 5) }
        }));
    }
    // Graphs listing their nodes twice: a matmul chain, and GET_ROWS of
    // indices computed by ARGMAX (checked before each of its runs).
    v.push(repeated(
        spec("mul_mat chain".into(), 1e-4, |c| {
            let a = c.input(F32, [64, 32, 1, 1]);
            let b = c.input(F32, [64, 8, 1, 1]);
            let w = c.input(F32, [32, 16, 1, 1]);
            // SAFETY: live context and tensors.
            unsafe {
                let h = sys::ggml_mul_mat(c.ctx, a, b);
                sys::ggml_mul_mat(c.ctx, w, h)
            }
        }),
        3,
    ));
    v.push(repeated(
        spec("get_rows of argmax".into(), 1e-7, |c| {
            let table = c.input(F32, [16, 10, 1, 1]);
            let scores = c.input(F32, [10, 4, 1, 1]);
            // SAFETY: live context and tensors.
            unsafe {
                let idx = sys::ggml_argmax(c.ctx, scores);
                sys::ggml_get_rows(c.ctx, table, idx)
            }
        }),
        2,
    ));
}

/// Issue 11, second batch: the remaining unary ops, LOG / SIN / COS,
/// ADD1, LEAKY_RELU, FILL, TRI, CUMSUM, GROUP_NORM, COUNT_EQUAL, ARANGE,
/// TIMESTEP_EMBEDDING, PAD_REFLECT_1D, ROLL (test-backend-ops' cases,
/// smaller).
fn batch2_op_cases(v: &mut Vec<Spec>) {
    const I32: sys::ggml_type = sys::GGML_TYPE_I32;
    // The unary ops the first sweep left out (test_unary), contiguous and
    // strided; XIELU (test_xielu).
    let unary = [
        sys::GGML_UNARY_OP_EXPM1,
        sys::GGML_UNARY_OP_SOFTPLUS,
        sys::GGML_UNARY_OP_FLOOR,
        sys::GGML_UNARY_OP_CEIL,
        sys::GGML_UNARY_OP_ROUND,
        sys::GGML_UNARY_OP_TRUNC,
    ];
    for op in unary {
        for ty in [F32, F16] {
            for strided in [false, true] {
                v.push(spec(
                    format!("unary {op} {ty} strided {strided}"),
                    1e-7,
                    move |c| {
                        let ne = [128, 2, 2, 2];
                        let a = if strided {
                            strided_input(c, ty, ne)
                        } else {
                            c.tensor(ty, ne, Fill::Uniform(-10.0, 10.0))
                        };
                        // SAFETY: live context and tensor.
                        unsafe { sys::ggml_unary(c.ctx, a, op) }
                    },
                ));
            }
        }
    }
    for ty in [F32, F16] {
        v.push(spec(format!("xielu {ty}"), 1e-6, move |c| {
            let a = c.tensor(ty, [128, 2, 2, 2], Fill::Uniform(-3.0, 3.0));
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_xielu(c.ctx, a, 0.8, 0.8, 0.5, 1e-6) }
        }));
    }
    // LOG (positive inputs), SIN, COS (test_log, test_sin, test_cos).
    type Un = unsafe extern "C" fn(*mut sys::ggml_context, T) -> T;
    let ops: [(&str, Un, f32, f32); 3] = [
        ("log", sys::ggml_log, 0.1, 10.0),
        ("sin", sys::ggml_sin, -6.0, 6.0),
        ("cos", sys::ggml_cos, -6.0, 6.0),
    ];
    for (name, f, lo, hi) in ops {
        for ty in [F32, F16] {
            for ne in [[10i64, 2, 2, 2], [128, 5, 1, 1]] {
                v.push(spec(format!("{name} {ty} {ne:?}"), 1e-6, move |c| {
                    let a = c.tensor(ty, ne, Fill::Uniform(lo, hi));
                    // SAFETY: live context and tensor.
                    unsafe { f(c.ctx, a) }
                }));
            }
        }
    }
    // ADD1 (test_add1): a scalar of the source type or F32.
    for (ty, sty) in [(F32, F32), (F16, F16), (F16, F32)] {
        v.push(spec(format!("add1 {ty} + {sty}"), 1e-7, move |c| {
            let a = c.input(ty, [10, 5, 4, 3]);
            let b = c.input(sty, [1, 1, 1, 1]);
            // SAFETY: live context and tensors.
            unsafe { sys::ggml_add1(c.ctx, a, b) }
        }));
    }
    v.push(spec("add1 strided".into(), 1e-7, |c| {
        let a = strided_input(c, F32, [10, 5, 4, 3]);
        let b = c.input(F32, [1, 1, 1, 1]);
        // SAFETY: live context and tensors.
        unsafe { sys::ggml_add1(c.ctx, a, b) }
    }));
    // LEAKY_RELU (test_leaky_relu), FILL (test_fill), TRI (test_tri).
    for ty in [F32, F16] {
        v.push(spec(format!("leaky_relu {ty}"), 1e-7, move |c| {
            let a = c.input(ty, [10, 5, 4, 3]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_leaky_relu(c.ctx, a, 0.1, false) }
        }));
        for value in [0.0f32, -2.5, 1e4] {
            v.push(spec(format!("fill {ty} {value}"), 1e-7, move |c| {
                let a = c.input(ty, [10, 5, 4, 3]);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_fill(c.ctx, a, value) }
            }));
        }
    }
    for tri in [
        sys::GGML_TRI_TYPE_UPPER_DIAG,
        sys::GGML_TRI_TYPE_UPPER,
        sys::GGML_TRI_TYPE_LOWER_DIAG,
        sys::GGML_TRI_TYPE_LOWER,
    ] {
        v.push(spec(format!("tri {tri}"), 1e-7, move |c| {
            let a = c.input(F32, [10, 10, 4, 3]);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_tri(c.ctx, a, tri) }
        }));
    }
    // CUMSUM (test_cumsum), contiguous, long rows and permuted.
    for ne in [[10i64, 5, 4, 3], [2048, 3, 1, 1]] {
        v.push(spec(format!("cumsum {ne:?}"), 1e-6, move |c| {
            let a = c.input(F32, ne);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_cumsum(c.ctx, a) }
        }));
    }
    v.push(spec("cumsum permuted".into(), 1e-6, |c| {
        let a = permuted_input(c, F32, [10, 5, 4, 3]);
        // SAFETY: live context and tensor.
        unsafe { sys::ggml_cumsum(c.ctx, a) }
    }));
    // GROUP_NORM (test_group_norm): groups dividing the channels or not.
    for (ne, groups, eps) in [
        ([64i64, 8, 32, 1], 4, 1e-6f32),
        ([64, 8, 32, 2], 32, 1e-6),
        ([9, 9, 30, 1], 4, 1e-5),
        ([9, 9, 30, 1], 7, 1e-5),
    ] {
        v.push(spec(
            format!("group_norm {ne:?} groups {groups}"),
            1e-6,
            move |c| {
                let a = c.input(F32, ne);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_group_norm(c.ctx, a, groups, eps) }
            },
        ));
    }
    // COUNT_EQUAL (test_count_equal): argmax of two score matrices.
    for ne in [[4i64, 500, 1, 1], [16, 33, 1, 1]] {
        v.push(spec(format!("count_equal {ne:?}"), 0.0, move |c| {
            let a = c.input(F32, ne);
            let b = c.input(F32, ne);
            // SAFETY: live context and tensors.
            unsafe {
                let ia = sys::ggml_argmax(c.ctx, a);
                let ib = sys::ggml_argmax(c.ctx, b);
                sys::ggml_count_equal(c.ctx, ia, ib)
            }
        }));
    }
    v.push(spec("count_equal of indices".into(), 0.0, |c| {
        let a = c.tensor(I32, [64, 8, 1, 1], Fill::Index(4));
        let b = c.tensor(I32, [64, 8, 1, 1], Fill::Index(4));
        // SAFETY: live context and tensors.
        unsafe { sys::ggml_count_equal(c.ctx, a, b) }
    }));
    // ARANGE (test_arange), TIMESTEP_EMBEDDING (test_timestep_embedding).
    for (start, stop, step) in [
        (0.0f32, 10.0f32, 1.0f32),
        (-3.0, 7.5, 0.25),
        (1.0, 2.0, 0.3),
    ] {
        v.push(spec(
            format!("arange {start} {stop} {step}"),
            1e-7,
            move |c| {
                // SAFETY: live context.
                unsafe { sys::ggml_arange(c.ctx, start, stop, step) }
            },
        ));
    }
    for (n, dim, period) in [(2i64, 320, 10000), (5, 31, 100)] {
        v.push(spec(
            format!("timestep_embedding {n} dim {dim}"),
            1e-6,
            move |c| {
                let t = c.tensor(F32, [n, 1, 1, 1], Fill::Uniform(0.0, 1000.0));
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_timestep_embedding(c.ctx, t, dim, period) }
            },
        ));
    }
    // PAD_REFLECT_1D (test_pad_reflect_1d), ROLL (test_roll).
    for (ne, p0, p1) in [
        ([512i64, 34, 2, 1], 10, 9),
        ([3000, 3, 1, 1], 2, 2),
        ([5, 2, 1, 1], 4, 0),
    ] {
        v.push(spec(
            format!("pad_reflect_1d {ne:?} {p0} {p1}"),
            1e-7,
            move |c| {
                let a = c.input(F32, ne);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_pad_reflect_1d(c.ctx, a, p0, p1) }
            },
        ));
    }
    for shifts in [[3, -2, 1, -1], [0, 0, 0, 0], [-9, 4, -3, 2]] {
        v.push(spec(format!("roll {shifts:?}"), 1e-7, move |c| {
            let a = c.input(F32, [10, 5, 4, 3]);
            // SAFETY: live context and tensor; |shift| < ne per dim.
            unsafe { sys::ggml_roll(c.ctx, a, shifts[0], shifts[1], shifts[2], shifts[3]) }
        }));
    }

    // SSM_CONV (test_ssm_conv): d_conv 3 / 4, one to four sequences.
    for (d_conv, n_t, d_inner, n_s) in [(4i64, 1i64, 96i64, 1i64), (4, 5, 64, 4), (3, 8, 33, 2)] {
        v.push(spec(
            format!("ssm_conv d_conv {d_conv} n_t {n_t} d_inner {d_inner} n_s {n_s}"),
            1e-6,
            move |c| {
                let sx = c.input(F32, [d_conv - 1 + n_t, d_inner, n_s, 1]);
                let w = c.input(F32, [d_conv, d_inner, 1, 1]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_ssm_conv(c.ctx, sx, w) }
            },
        ));
    }
    // SSM_SCAN (test_ssm_scan): Mamba-1 (per-state A, head_dim 1) and
    // Mamba-2 (scalar A per head, groups), states picked by shuffled
    // sequence ids, K = 1 and 2 (state snapshots).
    for (d_state, head_dim, n_head, n_group, n_t, n_s, mamba1, k) in [
        (16i64, 1i64, 64i64, 1i64, 8i64, 2i64, true, 1i64),
        (32, 16, 4, 2, 8, 3, false, 1),
        (32, 16, 4, 1, 6, 2, false, 2),
    ] {
        v.push(spec(
            format!(
                "ssm_scan d_state {d_state} head_dim {head_dim} n_head {n_head} \
                 n_group {n_group} n_t {n_t} n_s {n_s} mamba1 {mamba1} K {k}"
            ),
            1e-5,
            move |c| {
                let st = c.input(F32, [d_state, head_dim, n_head, n_s]);
                let x = c.input(F32, [head_dim, n_head, n_t, n_s]);
                let dt = c.input(F32, [n_head, n_t, n_s, 1]);
                let a_ne0 = if mamba1 { d_state } else { 1 };
                let a = c.tensor(F32, [a_ne0, n_head, 1, 1], Fill::Uniform(-1.0, -0.1));
                let b = c.input(F32, [d_state, n_group, n_t, n_s]);
                let cm = c.input(F32, [d_state, n_group, n_t, n_s]);
                let ids = c.tensor(I32, [n_s, 1, 1, 1], Fill::Rows(n_s));
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_ssm_scan(c.ctx, st, x, dt, a, b, cm, ids, k) }
            },
        ));
    }
}

/// Issue 11, vision-encoder ops: IM2COL(_3D), CONV_2D_DW (WHCN and CWHN
/// layouts), CONV_2D, CONV_3D, CONV_TRANSPOSE_1D / _2D, POOL_1D, POOL_2D, UPSCALE in every mode and flag
/// (test-backend-ops' test_im2col, test_conv_2d_dw, test_pool1d,
/// test_pool2d, test_upscale(_ext), test_interpolate, smaller).
fn vision_op_cases(v: &mut Vec<Spec>) {
    // IM2COL 2D: kernel type, image type, dst type, image, kernel, s, p, d.
    type Im2col = (
        sys::ggml_type,
        sys::ggml_type,
        sys::ggml_type,
        [i64; 4],
        [i64; 4],
        i32,
        i32,
        i32,
    );
    let im2col: [Im2col; 6] = [
        (F32, F32, F32, [10, 10, 3, 1], [3, 3, 3, 1], 1, 1, 1),
        (F16, F32, F16, [10, 10, 3, 1], [3, 3, 3, 1], 1, 1, 1),
        (F16, F16, F16, [10, 10, 3, 1], [3, 3, 3, 1], 1, 1, 1),
        (F32, F32, F32, [12, 9, 4, 2], [3, 2, 4, 5], 2, 0, 1),
        (F16, F32, F32, [20, 20, 2, 1], [3, 3, 2, 1], 2, 1, 2),
        (F32, F32, F16, [14, 7, 3, 2], [5, 3, 3, 1], 1, 2, 1),
    ];
    for (kt, it, dt, ine, kne, st, pad, dil) in im2col {
        v.push(spec(
            format!(
                "im2col 2D kernel {kt} image {it} dst {dt} {ine:?} {kne:?} s {st} p {pad} d {dil}"
            ),
            1e-6,
            move |c| {
                let k = c.input(kt, kne);
                let i = c.input(it, ine);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_im2col(c.ctx, k, i, st, st, pad, pad, dil, dil, true, dt) }
            },
        ));
    }
    // IM2COL 1D (whisper's conv1d): image [L, IC, N], kernel [K, IC, OC].
    for (dt, l, ic, n, st, pad) in [(F32, 30i64, 16i64, 1i64, 1, 1), (F16, 33, 8, 2, 2, 0)] {
        v.push(spec(
            format!("im2col 1D dst {dt} L {l} IC {ic} N {n} s {st} p {pad}"),
            1e-6,
            move |c| {
                let k = c.input(F16, [3, ic, 12, 1]);
                let i = c.input(F32, [l, ic, n, 1]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_im2col(c.ctx, k, i, st, 0, pad, 0, 1, 0, false, dt) }
            },
        ));
    }
    // CONV_2D_DW: image, kernel, stride, pad, dilation, channels-last.
    type Dw = ([i64; 4], [i64; 4], i32, i32, i32, bool, sys::ggml_type);
    let dw: [Dw; 6] = [
        ([17, 34, 9, 1], [3, 3, 1, 9], 1, 0, 1, false, F32),
        ([17, 34, 9, 1], [3, 3, 1, 9], 1, 0, 1, true, F32),
        ([32, 8, 64, 1], [3, 3, 1, 64], 2, 1, 1, false, F32),
        ([32, 8, 64, 1], [3, 3, 1, 64], 2, 1, 1, true, F32),
        ([11, 13, 5, 2], [5, 3, 1, 5], 1, 2, 2, false, F16),
        ([11, 13, 5, 2], [5, 3, 1, 5], 1, 2, 2, true, F16),
    ];
    for (ine, kne, st, pad, dil, cwhn, kt) in dw {
        v.push(spec(
            format!("conv_2d_dw {ine:?} kernel {kne:?} {kt} s {st} p {pad} d {dil} cwhn {cwhn}"),
            1e-5,
            move |c| {
                let mut i = c.input(F32, ine);
                let mut k = c.input(kt, kne);
                // SAFETY: live context and tensors.
                unsafe {
                    if cwhn {
                        // Channels-most-contiguous memory, permuted back
                        // to [W, H, C, N] (test_conv_2d_dw).
                        i = sys::ggml_cont(c.ctx, sys::ggml_permute(c.ctx, i, 1, 2, 0, 3));
                        i = sys::ggml_permute(c.ctx, i, 2, 0, 1, 3);
                        k = sys::ggml_cont(c.ctx, sys::ggml_permute(c.ctx, k, 2, 3, 1, 0));
                        k = sys::ggml_permute(c.ctx, k, 3, 2, 0, 1);
                    }
                    sys::ggml_conv_2d_dw_direct(c.ctx, k, i, st, st, pad, pad, dil, dil)
                }
            },
        ));
    }
    // IM2COL_3D (test_im2col_3d): image [W, H, D, IC * N], kernel [KW,
    // KH, KD, IC * OC], F32 and F16 results.
    for (dt, ic, n, st, pad, dil) in [
        (F32, 3i64, 2i64, 1, 0, 1),
        (F16, 2, 1, 2, 1, 1),
        (F32, 1, 3, 1, 1, 2),
    ] {
        v.push(spec(
            format!("im2col_3d dst {dt} IC {ic} N {n} s {st} p {pad} d {dil}"),
            1e-6,
            move |c| {
                let k = c.input(F16, [3, 3, 2, ic * 2]);
                let i = c.input(F32, [9, 8, 6, ic * n]);
                // SAFETY: live context and tensors.
                unsafe {
                    sys::ggml_im2col_3d(
                        c.ctx, k, i, ic, st, st, st, pad, pad, pad, dil, dil, dil, dt,
                    )
                }
            },
        ));
    }
    // CONV_2D (test_conv_2d): image [W, H, IC, N], kernel [KW, KH, IC,
    // OC], stride, pad, dilation; F16 and F32 kernels.
    type Conv2d = (sys::ggml_type, [i64; 4], [i64; 4], i32, i32, i32);
    let conv2d: [Conv2d; 4] = [
        (F32, [16, 12, 3, 2], [3, 3, 3, 4], 1, 0, 1),
        (F16, [16, 12, 3, 2], [3, 3, 3, 4], 1, 0, 1),
        (F32, [13, 11, 5, 1], [5, 3, 5, 6], 2, 1, 2),
        (F16, [20, 9, 2, 3], [3, 5, 2, 3], 3, 2, 1),
    ];
    for (kt, ine, kne, st, pad, dil) in conv2d {
        v.push(spec(
            format!("conv_2d kernel {kt} {kne:?} image {ine:?} s {st} p {pad} d {dil}"),
            1e-3,
            move |c| {
                let k = c.input(kt, kne);
                let i = c.input(F32, ine);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_conv_2d_direct(c.ctx, k, i, st, st, pad, pad, dil, dil) }
            },
        ));
    }
    // CONV_3D (test_conv_3d): image [W, H, D, IC * N], kernel [KW, KH,
    // KD, IC * OC].
    for (kt, (w, h, d), (ic, n, oc), (kw, kh, kd), st, pad, dil) in [
        (
            F32,
            (10i64, 9i64, 8i64),
            (3i32, 2i32, 4i32),
            (3i64, 3i64, 3i64),
            1,
            0,
            1,
        ),
        (F16, (10, 9, 8), (3, 2, 4), (3, 3, 3), 1, 0, 1),
        (F32, (11, 7, 6), (2, 1, 3), (3, 2, 2), 2, 1, 2),
    ] {
        v.push(spec(
            format!("conv_3d kernel {kt} {w}x{h}x{d} IC {ic} N {n} OC {oc} s {st} p {pad} d {dil}"),
            1e-3,
            move |c| {
                let k = c.input(kt, [kw, kh, kd, i64::from(ic * oc)]);
                let i = c.input(F32, [w, h, d, i64::from(ic * n)]);
                // SAFETY: live context and tensors.
                unsafe {
                    sys::ggml_conv_3d_direct(
                        c.ctx, k, i, st, st, st, pad, pad, pad, dil, dil, dil, ic, n, oc,
                    )
                }
            },
        ));
    }
    // CONV_TRANSPOSE_1D (test_conv_transpose_1d): source [L, Cin],
    // kernel [K, Cout, Cin], stride.
    for (kt, l, cin, k, cout, st) in [
        (F32, 197i64, 32i64, 16i64, 32i64, 1),
        (F32, 3, 2, 2, 3, 3),
        (F32, 3, 1, 3, 2, 2),
        (F16, 13, 4, 3, 5, 2),
    ] {
        v.push(spec(
            format!("conv_transpose_1d kernel {kt} L {l} Cin {cin} K {k} Cout {cout} s {st}"),
            1e-3,
            move |c| {
                let kn = c.input(kt, [k, cout, cin, 1]);
                let i = c.input(F32, [l, cin, 1, 1]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_conv_transpose_1d(c.ctx, kn, i, st, 0, 1) }
            },
        ));
    }
    // CONV_TRANSPOSE_2D (test_conv_transpose_2d): source [W, H, Cin, N],
    // kernel [KW, KH, Cout, Cin], stride.
    for (kt, ine, kne, st) in [
        (F32, [3i64, 2, 3, 1], [2i64, 2, 1, 3], 1),
        (F16, [3, 2, 3, 1], [2, 2, 1, 3], 1),
        (F32, [10, 10, 9, 1], [3, 3, 1, 9], 2),
        (F16, [7, 5, 4, 2], [3, 2, 3, 4], 2),
    ] {
        v.push(spec(
            format!("conv_transpose_2d kernel {kt} {kne:?} source {ine:?} s {st}"),
            1e-3,
            move |c| {
                let kn = c.input(kt, kne);
                let i = c.input(F32, ine);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_conv_transpose_2d_p0(c.ctx, kn, i, st) }
            },
        ));
    }
    // OUT_PROD (test_out_prod): a [m, k, bs0, bs1] by b [n, k, bs0 * nr0,
    // bs1 * nr1] (F32 a broadcasts), b transposed or not.
    for (at, m, n, k, bs, nr, trans_b) in [
        (F32, 256i64, 16i64, 16i64, [1i64, 1i64], [1i64, 1i64], false),
        (F32, 256, 16, 16, [3, 1], [2, 1], false),
        (F32, 64, 16, 16, [3, 2], [1, 2], true),
        (F16, 256, 16, 16, [1, 1], [1, 1], false),
        (F16, 64, 8, 16, [3, 2], [1, 1], true),
    ] {
        v.push(spec(
            format!("out_prod a {at} m {m} n {n} k {k} bs {bs:?} nr {nr:?} trans_b {trans_b}"),
            1e-4,
            move |c| {
                let a = c.input(at, [m, k, bs[0], bs[1]]);
                let bne = [n, k, bs[0] * nr[0], bs[1] * nr[1]];
                // SAFETY: live context and tensors.
                unsafe {
                    let b = if trans_b {
                        let t = c.input(F32, [bne[1], bne[0], bne[2], bne[3]]);
                        sys::ggml_transpose(c.ctx, t)
                    } else {
                        c.input(F32, bne)
                    };
                    sys::ggml_out_prod(c.ctx, a, b)
                }
            },
        ));
    }
    // RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7 (test_rwkv_wkv6, test_gla,
    // test_rwkv_wkv7): head size S, H heads, T tokens over n_seqs.
    for (s_, h, t, n_seqs) in [
        (32i64, 2i64, 1i64, 1i64),
        (32, 2, 32, 1),
        (32, 2, 32, 4),
        (64, 2, 8, 2),
    ] {
        v.push(spec(
            format!("rwkv_wkv6 S {s_} H {h} T {t} seqs {n_seqs}"),
            1e-5,
            move |c| {
                let k = c.input(F32, [s_, h, t, 1]);
                let vv = c.input(F32, [s_, h, t, 1]);
                let r = c.input(F32, [s_, h, t, 1]);
                let tf = c.input(F32, [s_, h, 1, 1]);
                let td = c.tensor(F32, [s_, h, t, 1], Fill::Uniform(0.1, 0.9));
                let st = c.input(F32, [s_ * s_ * h, n_seqs, 1, 1]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_rwkv_wkv6(c.ctx, k, vv, r, tf, td, st) }
            },
        ));
        v.push(spec(
            format!("gated_linear_attn S {s_} H {h} T {t} seqs {n_seqs}"),
            1e-5,
            move |c| {
                let k = c.input(F32, [s_, h, t, 1]);
                let vv = c.input(F32, [s_, h, t, 1]);
                let q = c.input(F32, [s_, h, t, 1]);
                let g = c.tensor(F32, [s_, h, t, 1], Fill::Uniform(0.1, 0.9));
                let st = c.input(F32, [s_ * s_ * h, n_seqs, 1, 1]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_gated_linear_attn(c.ctx, k, vv, q, g, st, 0.5) }
            },
        ));
    }
    for (s_, h, t, n_seqs) in [(64i64, 1i64, 1i64, 1i64), (64, 2, 8, 1), (64, 2, 8, 4)] {
        v.push(spec(
            format!("rwkv_wkv7 S {s_} H {h} T {t} seqs {n_seqs}"),
            1e-5,
            move |c| {
                let r = c.input(F32, [s_, h, t, 1]);
                let w = c.tensor(F32, [s_, h, t, 1], Fill::Uniform(0.1, 0.9));
                let k = c.input(F32, [s_, h, t, 1]);
                let vv = c.input(F32, [s_, h, t, 1]);
                let a = c.input(F32, [s_, h, t, 1]);
                let b = c.input(F32, [s_, h, t, 1]);
                let st = c.input(F32, [s_ * s_ * h, n_seqs, 1, 1]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_rwkv_wkv7(c.ctx, r, w, k, vv, a, b, st) }
            },
        ));
    }
    // POOL_1D / POOL_2D: both pool types, windows 1 and 3, strides 1 and
    // 2, pads 0 and 1.
    let pools = [sys::GGML_OP_POOL_MAX, sys::GGML_OP_POOL_AVG];
    for op in pools {
        for (k, st, pad) in [(1, 1, 0), (1, 2, 1), (3, 1, 0), (3, 2, 1)] {
            v.push(spec(
                format!("pool_1d op {op} k {k} s {st} p {pad}"),
                1e-6,
                move |c| {
                    let a = c.input(F32, [10, 3, 2, 1]);
                    // SAFETY: live context and tensor.
                    unsafe { sys::ggml_pool_1d(c.ctx, a, op, k, st, pad) }
                },
            ));
        }
        for (ty, k0, k1, s0, s1, p0, p1) in [
            (F32, 3, 3, 1, 1, 0, 0),
            (F32, 3, 1, 2, 1, 1, 0),
            (F32, 1, 3, 1, 2, 0, 1),
            (F32, 3, 3, 2, 2, 1, 1),
            (F16, 3, 3, 2, 1, 1, 0),
        ] {
            v.push(spec(
                format!("pool_2d op {op} {ty} k {k0}x{k1} s {s0}x{s1} p {p0}x{p1}"),
                1e-3,
                move |c| {
                    let a = c.input(ty, [10, 10, 3, 2]);
                    // SAFETY: live context and tensor.
                    unsafe { sys::ggml_pool_2d(c.ctx, a, op, k0, k1, s0, s1, p0 as f32, p1 as f32) }
                },
            ));
        }
    }
    // UPSCALE: every mode, with and without ALIGN_CORNERS, up and down,
    // dims 2 and 3 too; bilinear ANTIALIAS; a scale factor 2 (test_upscale).
    let nearest = sys::GGML_SCALE_MODE_NEAREST;
    let bilinear = sys::GGML_SCALE_MODE_BILINEAR;
    let bicubic = sys::GGML_SCALE_MODE_BICUBIC;
    let align = sys::GGML_SCALE_FLAG_ALIGN_CORNERS;
    let aa = sys::GGML_SCALE_FLAG_ANTIALIAS;
    let mut upscale = Vec::new();
    for mode in [nearest, bilinear, bicubic] {
        for flags in [0, align] {
            upscale.push((mode | flags, [2i64, 5, 7, 11], [5i64, 7, 11, 13]));
            upscale.push((mode | flags, [5, 7, 11, 13], [2, 5, 7, 11]));
        }
    }
    upscale.push((bilinear | aa, [16, 12, 3, 1], [7, 5, 3, 1]));
    upscale.push((bilinear | aa, [6, 4, 3, 1], [13, 9, 3, 1]));
    for (mode, ine, out) in upscale {
        v.push(spec(
            format!("upscale mode {mode:#x} {ine:?} to {out:?}"),
            1e-5,
            move |c| {
                let a = c.input(F32, ine);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_interpolate(c.ctx, a, out[0], out[1], out[2], out[3], mode) }
            },
        ));
    }
    v.push(spec("upscale by 2, nearest".into(), 1e-6, move |c| {
        let a = c.input(F32, [8, 5, 3, 2]);
        // SAFETY: live context and tensor.
        unsafe { sys::ggml_upscale(c.ctx, a, 2, nearest) }
    }));
}

/// Issue 11, last part: the inference ops no earlier sweep served
/// (SOLVE_TRI, GATED_DELTA_NET, DIAG, DIAG_MASK_ZERO, the SAM window ops,
/// DeepSeek-V4's hyper-connection ops and LIGHTNING_INDEXER) and
/// quantized OUT_PROD.
fn misc_op_cases(v: &mut Vec<Spec>) {
    // SOLVE_TRI (test_solve_tri): A [n, n, b2, b3] lower triangular (only
    // the lower triangle is read; diagonal kept away from 0), B [k, n].
    for (n, k, b2, b3) in [(16i64, 8i64, 2i64, 3i64), (32, 32, 1, 1), (64, 1, 2, 1)] {
        v.push(spec(
            format!("solve_tri n {n} k {k} batch {b2}x{b3}"),
            1e-6,
            move |c| {
                let a = c.tensor(F32, [n, n, b2, b3], Fill::Uniform(0.5, 1.0));
                let b = c.input(F32, [k, n, b2, b3]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_solve_tri(c.ctx, a, b, true, true, false) }
            },
        ));
    }
    // GATED_DELTA_NET (test_gated_delta_net): head size S, H value heads,
    // q/k heads, T tokens, n_seqs sequences, q/k sequences, K state
    // slots (T >= K: every slot is written), KDA (vector gate), q and k
    // with dims 1 and 2 swapped.
    type Gdn = (i64, i64, i64, i64, i64, i64, i64, bool, bool);
    let gdn: [Gdn; 8] = [
        (32, 2, 2, 1, 1, 1, 1, false, false),
        // Qwen3-Next's sizes: head 128, 32 value heads over 16 q/k heads.
        (128, 32, 16, 4, 2, 2, 1, false, false),
        (64, 4, 4, 6, 1, 1, 4, true, false),
        (64, 4, 4, 8, 2, 2, 1, false, false),
        (32, 4, 2, 4, 2, 1, 1, false, false),
        (32, 2, 2, 4, 1, 1, 1, true, false),
        (32, 2, 2, 4, 2, 2, 3, false, false),
        (16, 3, 3, 5, 1, 1, 1, false, true),
    ];
    for (sv, h, hqk, t, n_seqs, qk_seqs, k_slots, kda, permuted) in gdn {
        v.push(spec(
            format!(
                "gated_delta_net S {sv} H {h} qk heads {hqk} T {t} seqs {n_seqs} \
                 (qk {qk_seqs}) K {k_slots} kda {kda} permuted {permuted}"
            ),
            1e-6,
            move |c| {
                let qk_ne = [sv, hqk, t, qk_seqs];
                let (q, k) = if permuted {
                    (permuted_input(c, F32, qk_ne), permuted_input(c, F32, qk_ne))
                } else {
                    (c.input(F32, qk_ne), c.input(F32, qk_ne))
                };
                let vv = c.input(F32, [sv, h, t, n_seqs]);
                let g_ne0 = if kda { sv } else { 1 };
                let g = c.tensor(F32, [g_ne0, h, t, n_seqs], Fill::Uniform(-0.5, 0.0));
                let beta = c.tensor(F32, [1, h, t, n_seqs], Fill::Uniform(0.0, 1.0));
                let st = c.input(F32, [sv, sv, h, n_seqs]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_gated_delta_net(c.ctx, q, k, vv, g, beta, st, k_slots) }
            },
        ));
    }
    // DIAG (test_diag): a row per matrix into its diagonal.
    for ne in [[10i64, 1, 1, 1], [7, 1, 3, 2]] {
        v.push(spec(format!("diag {ne:?}"), 0.0, move |c| {
            let a = c.input(F32, ne);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_diag(c.ctx, a) }
        }));
    }
    // DIAG_MASK_ZERO: as DIAG_MASK_INF, past 0 and 3.
    for n_past in [0, 3] {
        v.push(spec(
            format!("diag_mask_zero past {n_past}"),
            0.0,
            move |c| {
                let a = c.input(F32, [10, 10, 3, 2]);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_diag_mask_zero(c.ctx, a, n_past) }
            },
        ));
    }
    // SAM's windows: WIN_PART of an image with padding, WIN_UNPART back,
    // GET_REL_POS of F16 / BF16 tables, ADD_REL_POS.
    for (ne, w) in [([8i64, 13i64, 11i64, 1i64], 4), ([4, 14, 14, 1], 7)] {
        v.push(spec(format!("win_part {ne:?} w {w}"), 0.0, move |c| {
            let a = c.input(F32, ne);
            // SAFETY: live context and tensor.
            unsafe { sys::ggml_win_part(c.ctx, a, w) }
        }));
        v.push(spec(format!("win_unpart {ne:?} w {w}"), 0.0, move |c| {
            let a = c.input(F32, ne);
            // SAFETY: live context and tensors.
            unsafe {
                let p = sys::ggml_win_part(c.ctx, a, w);
                sys::ggml_win_unpart(c.ctx, p, ne[1] as i32, ne[2] as i32, w)
            }
        }));
    }
    for (ty, ch, k) in [(F16, 8i64, 5i32), (sys::GGML_TYPE_BF16, 16, 7)] {
        v.push(spec(
            format!("get_rel_pos {ty} C {ch} k {k}"),
            0.0,
            move |c| {
                let a = c.input(ty, [ch, 2 * i64::from(k) - 1, 1, 1]);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_get_rel_pos(c.ctx, a, k, k) }
            },
        ));
    }
    for (kw, kh, heads) in [(4i64, 4i64, 2i64), (3, 5, 3)] {
        v.push(spec(
            format!("add_rel_pos kw {kw} kh {kh} heads {heads}"),
            1e-7,
            move |c| {
                let a = c.input(F32, [kw * kw, kw * kh, heads, 1]);
                let pw = c.input(F32, [kw, kw, kh, heads]);
                let ph = c.input(F32, [kw, kw, kh, heads]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_add_rel_pos(c.ctx, a, pw, ph) }
            },
        ));
    }
    // DeepSeek-V4 hyper-connections (hc = 4): COMB of T tokens, PRE plain
    // and gated, POST with and without the mixing matrix.
    for t in [1i64, 5] {
        v.push(spec(format!("dsv4_hc_comb T {t}"), 1e-6, move |c| {
            let mixes = c.input(F32, [24, t, 1, 1]);
            let scale = c.input(F32, [3, 1, 1, 1]);
            let base = c.input(F32, [24, 1, 1, 1]);
            // SAFETY: live context and tensors.
            unsafe { sys::ggml_dsv4_hc_comb(c.ctx, mixes, scale, base, 1e-6, 20) }
        }));
        for gated in [false, true] {
            v.push(spec(
                format!("dsv4_hc_pre T {t} gated {gated}"),
                1e-6,
                move |c| {
                    let x = c.input(F32, [32, 4, t, 1]);
                    // SAFETY: live context and tensors.
                    unsafe {
                        if gated {
                            let gate = c.input(F32, [32, 4, t, 1]);
                            sys::ggml_dsv4_hc_pre_gated(c.ctx, x, gate, 0.5)
                        } else {
                            let w = c.input(F32, [4, t, 1, 1]);
                            sys::ggml_dsv4_hc_pre(c.ctx, x, w)
                        }
                    }
                },
            ));
        }
        for with_comb in [false, true] {
            v.push(spec(
                format!("dsv4_hc_post T {t} comb {with_comb}"),
                1e-6,
                move |c| {
                    let x = c.input(F32, [32, t, 1, 1]);
                    let residual = c.input(F32, [32, 4, t, 1]);
                    let post = c.input(F32, [4, t, 1, 1]);
                    let comb = if with_comb {
                        c.input(F32, [4, 4, t, 1])
                    } else {
                        std::ptr::null_mut()
                    };
                    // SAFETY: live context and tensors (comb may be null).
                    unsafe { sys::ggml_dsv4_hc_post(c.ctx, x, residual, post, comb) }
                },
            ));
        }
    }
    // LIGHTNING_INDEXER: F32, F16 and Q8_0 keys, one mask for every
    // stream or one per stream.
    for (kt, n_stream, mask_streams) in
        [(F32, 1i64, 1i64), (F16, 2, 1), (sys::GGML_TYPE_Q8_0, 2, 2)]
    {
        v.push(spec(
            format!("lightning_indexer k {kt} streams {n_stream} masks {mask_streams}"),
            1e-5,
            move |c| {
                let (e, heads, t, n_kv) = (64i64, 4i64, 3i64, 10i64);
                let q = c.input(F32, [e, heads, t, n_stream]);
                let k = c.input(kt, [e, 1, n_kv, n_stream]);
                let w = c.input(F32, [heads, t, 1, n_stream]);
                let m = c.input(F16, [n_kv, t, 1, mask_streams]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_lightning_indexer(c.ctx, q, k, w, m) }
            },
        ));
    }
    // COL2IM_1D (a vocoder's transposed convolution): F32, F16, BF16
    // columns, strides 1 to 4, crops 0 to 2.
    for (ty, k, oc, t_in, st, pad) in [
        (F32, 4i64, 3i64, 10i64, 2, 1),
        (F32, 3, 1, 7, 1, 0),
        (F16, 8, 2, 5, 4, 2),
        (sys::GGML_TYPE_BF16, 5, 4, 6, 3, 1),
    ] {
        v.push(spec(
            format!("col2im_1d {ty} K {k} OC {oc} T {t_in} s {st} p {pad}"),
            1e-6,
            move |c| {
                let a = c.input(ty, [k * oc, t_in, 1, 1]);
                // SAFETY: live context and tensor.
                unsafe { sys::ggml_col2im_1d(c.ctx, a, st, oc as i32, pad) }
            },
        ));
    }
    // OUT_PROD of quantized src0 (test_out_prod's quantized types).
    for (at, m, bs) in [
        (sys::GGML_TYPE_Q8_0, 64i64, [1i64, 1i64]),
        (sys::GGML_TYPE_Q4_0, 64, [2, 1]),
        (sys::GGML_TYPE_Q4_K, 256, [1, 1]),
        (sys::GGML_TYPE_Q6_K, 256, [2, 2]),
    ] {
        v.push(spec(
            format!("out_prod a {at} m {m} bs {bs:?}"),
            5e-4,
            move |c| {
                let a = c.input(at, [m, 16, bs[0], bs[1]]);
                let b = c.input(F32, [8, 16, bs[0], bs[1]]);
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_out_prod(c.ctx, a, b) }
            },
        ));
    }
}

/// Issue 11, last part: the backward and optimizer ops (test-backend-ops'
/// test_silu_back, test_rms_norm_back, test_soft_max_back, test_rope with
/// forward = false, test_repeat_back, test_cross_entropy_loss(_back),
/// test_opt_step_adamw / _sgd shapes).
fn train_op_cases(v: &mut Vec<Spec>) {
    for ty in [F32, F16] {
        v.push(spec(format!("silu_back {ty}"), 1e-6, move |c| {
            let g = c.input(ty, [64, 5, 4, 3]);
            let x = c.input(ty, [64, 5, 4, 3]);
            // SAFETY: live context and tensors.
            unsafe { sys::ggml_silu_back(c.ctx, g, x) }
        }));
    }
    for eps in [0.0f32, 1e-6, 1e-1] {
        v.push(spec(format!("rms_norm_back eps {eps}"), 1e-6, move |c| {
            let dz = c.input(F32, [64, 5, 4, 3]);
            let x = c.input(F32, [64, 5, 4, 3]);
            // SAFETY: live context and tensors.
            unsafe { sys::ggml_rms_norm_back(c.ctx, dz, x, eps) }
        }));
    }
    for (ne, scale) in [([16i64, 16i64, 1i64, 1i64], 1.0f32), ([15, 7, 3, 2], 0.5)] {
        v.push(spec(
            format!("soft_max_back {ne:?} scale {scale}"),
            1e-6,
            move |c| {
                let dy = c.input(F32, ne);
                let y = c.tensor(F32, ne, Fill::Uniform(0.0, 1.0));
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_soft_max_ext_back(c.ctx, dy, y, scale, 0.0) }
            },
        ));
    }
    const I32: sys::ggml_type = sys::GGML_TYPE_I32;
    for ty in [F32, F16] {
        for (mode, n_dims, ff) in [(0, 64, false), (2, 64, true), (0, 32, true), (2, 32, false)] {
            v.push(spec(
                format!("rope_back {ty} mode {mode} n_dims {n_dims} ff {ff}"),
                1e-4,
                move |c| {
                    let a = c.input(ty, [64, 4, 3, 2]);
                    let pos = c.tensor(I32, [3, 1, 1, 1], Fill::Index(100));
                    let freq = if ff {
                        c.tensor(F32, [32, 1, 1, 1], Fill::Uniform(0.9, 1.1))
                    } else {
                        std::ptr::null_mut()
                    };
                    // SAFETY: live context and tensors.
                    unsafe {
                        sys::ggml_rope_ext_back(
                            c.ctx, a, pos, freq, n_dims, mode, 4096, 10000.0, 1.0, 0.5, 1.0, 32.0,
                            1.0,
                        )
                    }
                },
            ));
        }
    }
    for nr in [
        [1i64, 1, 1, 1],
        [2, 1, 1, 1],
        [1, 2, 1, 1],
        [1, 1, 2, 1],
        [1, 1, 1, 2],
    ] {
        v.push(spec(format!("repeat_back nr {nr:?}"), 1e-6, move |c| {
            let ne = [8i64, 6, 4, 2];
            let a = c.input(
                F32,
                [ne[0] * nr[0], ne[1] * nr[1], ne[2] * nr[2], ne[3] * nr[3]],
            );
            let b = c.input(F32, ne);
            // SAFETY: live context and tensors.
            unsafe { sys::ggml_repeat_back(c.ctx, a, b) }
        }));
    }
    for ne in [[10i64, 5, 4, 3], [30000, 1, 1, 1]] {
        v.push(spec(format!("cross_entropy_loss {ne:?}"), 1e-6, move |c| {
            let logits = c.input(F32, ne);
            let labels = c.tensor(F32, ne, Fill::Uniform(0.0, 1.0));
            // SAFETY: live context and tensors.
            unsafe { sys::ggml_cross_entropy_loss(c.ctx, logits, labels) }
        }));
    }
    for ne in [[10i64, 5, 4, 3], [30000, 1, 1, 1]] {
        v.push(spec(
            format!("cross_entropy_loss_back {ne:?}"),
            1e-6,
            move |c| {
                let grad = c.input(F32, [1, 1, 1, 1]);
                let logits = c.input(F32, ne);
                let labels = c.tensor(F32, ne, Fill::Uniform(0.0, 1.0));
                // SAFETY: live context and tensors.
                unsafe { sys::ggml_cross_entropy_loss_back(c.ctx, grad, logits, labels) }
            },
        ));
    }
    // IM2COL_BACK: the gradient of im2col's output back to the image, 2D
    // (strides 1 and 2, pad, dilation) and 1D; F32 and F16 kernels.
    type Im2colBack = (bool, sys::ggml_type, [i64; 4], [i64; 2], i32, i32, i32);
    let im2col_back: [Im2colBack; 4] = [
        (true, F32, [10, 10, 3, 2], [3, 3], 1, 1, 1),
        (true, F16, [10, 9, 2, 1], [3, 2], 2, 0, 1),
        (true, F32, [12, 12, 2, 1], [3, 3], 1, 2, 2),
        (false, F32, [20, 4, 2, 1], [3, 1], 1, 1, 1),
    ];
    for (is_2d, kt, img, kern, st, pad, dil) in im2col_back {
        v.push(spec(
            format!(
                "im2col_back 2D {is_2d} kernel {kt} image {img:?} k {kern:?} s {st} p {pad} d {dil}"
            ),
            1e-6,
            move |c| {
                let out = |n: i64, k: i64| {
                    (n + 2 * i64::from(pad) - i64::from(dil) * (k - 1) - 1) / i64::from(st) + 1
                };
                let (grad_ne, k_ne) = if is_2d {
                    let (ow, oh) = (out(img[0], kern[0]), out(img[1], kern[1]));
                    (
                        [img[2] * kern[0] * kern[1], ow, oh, img[3]],
                        [kern[0], kern[1], img[2], 1],
                    )
                } else {
                    let ow = out(img[0], kern[0]);
                    ([img[1] * kern[0], ow, img[2], 1], [kern[0], img[1], 1, 1])
                };
                let g = c.input(F32, grad_ne);
                let k = c.input(kt, k_ne);
                let mut ne = img;
                // SAFETY: live context and tensors; `ne` outlives the call.
                unsafe {
                    sys::ggml_im2col_back(
                        c.ctx,
                        g,
                        k,
                        ne.as_mut_ptr(),
                        st,
                        st,
                        pad,
                        pad,
                        dil,
                        dil,
                        is_2d,
                    )
                }
            },
        ));
    }
    // POOL_2D_BACK: both pool types over the forward input [10, 10, 3, 2].
    for op in [sys::GGML_OP_POOL_MAX, sys::GGML_OP_POOL_AVG] {
        for (k0, k1, s0, s1, p0, p1) in [(3, 3, 1, 1, 0, 0), (3, 1, 2, 1, 1, 0), (2, 2, 2, 2, 1, 1)]
        {
            v.push(spec(
                format!("pool_2d_back op {op} k {k0}x{k1} s {s0}x{s1} p {p0}x{p1}"),
                1e-6,
                move |c| {
                    let af = c.input(F32, [10, 10, 3, 2]);
                    let ow = (10 + 2 * p0 - k0) / s0 + 1;
                    let oh = (10 + 2 * p1 - k1) / s1 + 1;
                    let g = c.input(F32, [i64::from(ow), i64::from(oh), 3, 2]);
                    // SAFETY: live context and tensors.
                    unsafe {
                        sys::ggml_pool_2d_back(
                            c.ctx, g, af, op, k0, k1, s0, s1, p0 as f32, p1 as f32,
                        )
                    }
                },
            ));
        }
    }
    // GET_ROWS_BACK (test_get_rows_back): the gradient `grad` [n, r] of r
    // rows of an [n, m] table back to the table, F32 and F16 gradients;
    // its rows indices in memory, or a view of the first r / 2 of them
    // (the gradient keeps its r rows, the kernel reads r / 2), and r > m
    // (rows repeat: their gradients add).
    for ty in [F32, F16] {
        for (n, m, r, view) in [
            (1i64, 8i64, 2i64, false),
            (256, 5, 4, false),
            (256, 5, 4, true),
            (64, 10, 30, false),
        ] {
            v.push(spec(
                format!("get_rows_back {ty} n {n} m {m} r {r} view {view}"),
                1e-6,
                move |c| {
                    let table = c.input(ty, [n, m, 1, 1]);
                    let mut rows = c.tensor(I32, [r, 1, 1, 1], Fill::Index(m));
                    if view {
                        // SAFETY: live context and tensor; the view is
                        // inside it.
                        rows =
                            unsafe { sys::ggml_view_2d(c.ctx, rows, r / 2, 1, (*rows).nb[1], 0) };
                    }
                    let grad = c.input(ty, [n, r, 1, 1]);
                    // SAFETY: live context and tensors.
                    unsafe { sys::ggml_get_rows_back(c.ctx, grad, rows, table) }
                },
            ));
        }
    }
    for ne in [[10i64, 5, 4, 3], [64, 1, 1, 1]] {
        v.push(spec(format!("opt_step_adamw {ne:?}"), 1e-6, move |c| {
            let w = c.input(F32, ne);
            let grad = c.input(F32, ne);
            let m = c.input(F32, ne);
            let vv = c.tensor(F32, ne, Fill::Uniform(0.0, 1.0));
            let params = c.tensor(F32, [7, 1, 1, 1], Fill::Uniform(0.0, 1.0));
            // SAFETY: live context and tensors.
            unsafe {
                sys::ggml_set_param(w);
                sys::ggml_opt_step_adamw(c.ctx, w, grad, m, vv, params)
            }
        }));
        v.push(spec(format!("opt_step_sgd {ne:?}"), 1e-6, move |c| {
            let w = c.input(F32, ne);
            let grad = c.input(F32, ne);
            let params = c.tensor(F32, [2, 1, 1, 1], Fill::Uniform(0.0, 1.0));
            // SAFETY: live context and tensors.
            unsafe {
                sys::ggml_set_param(w);
                sys::ggml_opt_step_sgd(c.ctx, w, grad, params)
            }
        }));
    }
}

fn op_name(t: T) -> String {
    // SAFETY: static strings from ggml.
    unsafe {
        let d = sys::ggml_op_desc(t);
        std::ffi::CStr::from_ptr(d).to_string_lossy().into_owned()
    }
}

#[test]
fn every_case_equals_ggml_cpu_or_is_refused() {
    let server = start_ggml();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut table: BTreeMap<String, (usize, usize, Vec<String>)> = BTreeMap::new();
    for s in cases() {
        println!("case: {}", s.desc);
        let mut case = Case::new();
        let out = (s.build)(&mut case);
        assert!(!out.is_null(), "{}", s.desc);
        let op = op_name(out);
        let outcome = run(&server, case, out, s.tol, s.repeat, &mut rng);
        let row = table.entry(op).or_default();
        match outcome {
            Outcome::Equal => row.0 += 1,
            Outcome::Refused(why) => {
                row.1 += 1;
                row.2.push(format!("{}: {why}", s.desc));
            }
        }
    }
    // The server survived every case and still serves.
    let mut c = connect(&server);
    assert_eq!(c.device_count().unwrap(), 1);
    println!("{:<16} {:>7} {:>8}", "op", "served", "refused");
    for (op, (ok, refused, _)) in &table {
        println!("{op:<16} {ok:>7} {refused:>8}");
    }
    let ceilings: HashMap<&str, usize> = MAX_REFUSED.iter().copied().collect();
    let mut over = Vec::new();
    for (op, (_, refused, why)) in &table {
        let ceiling = ceilings.get(op.as_str()).copied().unwrap_or(0);
        if *refused > ceiling {
            over.push(format!(
                "{op}: {refused} refused (ceiling {ceiling}):\n    {}",
                why.join("\n    ")
            ));
        }
    }
    assert!(
        over.is_empty(),
        "refusals above the recorded ceilings:\n{}",
        over.join("\n")
    );
}
