//! Matrix products: MUL_MAT (with the Hadamard hint), MUL_MAT_ID (MoE: its
//! expert ids are range-checked at run time, see `graph.rs`), OUT_PROD.

use super::common::*;

/// MUL_MAT: `ggml_compute_forward_mul_mat` (ggml-cpu.c).
pub(super) fn check_mul_mat(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let (a, b) = (src(0)?, src(1)?);
    let ai = info(a)?;
    let transposed = a.nb[0] > a.nb[1];
    let hadamard = r.op_params[1] == HINT_SRC0_IS_HADAMARD;
    // With the Hadamard hint the kernel never reads src0 nor
    // converts src1: ggml_compute_forward_fwht (ops.cpp) reads
    // src1 rows as F32 or F16 (GGML_ABORT on any other type), and
    // ggml_backend_cpu_device_supports_op accepts exactly those two
    // for an F32 src0 and result. Without the hint, src1 must be
    // one the vec_dot path converts.
    let src1_ok = if hadamard {
        a.ty == GGML_TYPE_F32 && matches!(b.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
    } else {
        mul_mat_src1_ok(a.ty, b.ty)
    };
    // ggml_mul_mat's builder rules, and ggml_compute_forward_mul_mat
    // (ggml-cpu.c): GGML_ASSERT(ne0 == ne01, ne1 == ne11, ne2 ==
    // ne12, ne3 == ne13), GGML_ASSERT(nb00 == type size of src0),
    // GGML_ASSERT(nb10 == type size of src1); r2 = ne12 / ne02,
    // r3 = ne13 / ne03 divide; src0 needs a vec_dot.
    if a.ne[0] != b.ne[0]
        || !divides(a.ne[2], b.ne[2])
        || !divides(a.ne[3], b.ne[3])
        || transposed
        || !cpu_mul_mat_src0(a.ty)
        || u64::from(a.nb[0]) != ai.type_size
        || !src1_ok
        || r.ty != GGML_TYPE_F32
        || r.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]
        || !rows_contiguous(b)
        || !is_contiguous(r)
    {
        return refuse(op, "mul_mat shapes/types");
    }
    // "dst cannot be transposed or permuted": GGML_ASSERT(nb0 ==
    // sizeof(float)), GGML_ASSERT(nb0 <= nb1), (nb1 <= nb2),
    // (nb2 <= nb3), on size-1 dims too (there and in the tiled
    // driver, tiled/tiled.cpp).
    if r.nb[0] != 4 || !strides_ordered(r) {
        return refuse(
            op,
            "mul_mat result strides must be nb0 = 4 <= nb1 <= nb2 <= nb3",
        );
    }
    // The tiled K-quant driver (tiled/tiled.cpp) reads a src1 that
    // is already Q8_K at `(flat row) * nb[1]`, counting rows over
    // dims 1..3 as one run.
    if cpu_types::tiled_mul_mat_src0(a.ty) && b.ty != GGML_TYPE_F32 && !flat_walk(b) {
        return refuse(
            op,
            "mul_mat of a tiled type by Q8_K needs src1 rows nb[1] apart",
        );
    }
    // op_params[1] == GGML_HINT_SRC0_IS_HADAMARD makes the kernel
    // ignore src0 and run ggml_compute_forward_fwht (ops.cpp): it
    // GGML_ASSERTs (n & (n - 1)) == 0 for n = ne10 and writes n
    // floats into each dst row, whose length is ne0 = ne01. So K
    // must be a power of two and src0 the square K x K Hadamard
    // matrix (as llama_mul_mat_hadamard builds it).
    if hadamard {
        let k = b.ne[0];
        if !k.is_power_of_two() || a.ne[1] != k {
            return refuse(
                op,
                format!(
                    "hadamard mul_mat needs a square src0 of a power-of-two size, \
                     got K = {k}, {} rows",
                    a.ne[1]
                ),
            );
        }
    }
    Ok(())
}

/// MUL_MAT_ID: `ggml_compute_forward_mul_mat_id` (ggml-cpu.c) and its
/// tiled per-expert path. Expert ids are range-checked at run time
/// against src0's `ne[2]` matrices (graph.rs).
pub(super) fn check_mul_mat_id(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b), Some(ids)) = (s[0], s[1], s[2]) else {
        return refuse(op, "mul_mat_id needs three sources");
    };
    // ggml_mul_mat_id: !transposed(as), ids I32 2-D, as and b 3-D,
    // ids->ne[1] == b->ne[2], as->ne[0] == b->ne[0], ids->ne[0] % b->ne[1]
    // == 0 (the kernel takes src1 row `id % ne11`), result F32 [as->ne[1],
    // ids->ne[0], b->ne[2], 1]. Kernel: GGML_ASSERT(nb00 == type size),
    // (nb10 == type size), (nb0 == sizeof(float)), nb0 <= nb1 <= nb2 <=
    // nb3; src0 needs a vec_dot; a src1 that is not the vec_dot type is
    // converted with GGML_ASSERT(src1->type == GGML_TYPE_F32).
    let src1_ok = b.ty == GGML_TYPE_F32 || Some(b.ty) == cpu_types::vec_dot_type(a.ty);
    if !cpu_mul_mat_src0(a.ty)
        || !rows_contiguous(a)
        || a.nb[0] > a.nb[1]
        || a.ne[3] != 1
        || !src1_ok
        || !rows_contiguous(b)
        || b.ne[3] != 1
        || b.ne[0] != a.ne[0]
        || ids.ty != GGML_TYPE_I32
        || ids.ne[2] != 1
        || ids.ne[3] != 1
        || ids.ne[1] != b.ne[2]
        || !divides(b.ne[1], ids.ne[0])
        || r.ty != GGML_TYPE_F32
        || r.ne != [a.ne[1], ids.ne[0], b.ne[2], 1]
        || r.nb[0] != 4
        || !strides_ordered(r)
    {
        return refuse(op, "mul_mat_id shapes/types");
    }
    // The tiled path (K-quant / iq experts, tiled/tiled.cpp) reads a src1
    // that already is Q8_K at `(i11 + i12 * ne11) * nb11`.
    if cpu_types::tiled_mul_mat_src0(a.ty) && b.ty != GGML_TYPE_F32 && !flat_walk(b) {
        return refuse(
            op,
            "mul_mat_id of a tiled type by Q8_K needs src1 rows nb[1] apart",
        );
    }
    let map = u64::from(a.ne[2])
        .saturating_mul(u64::from(ids.ne[0]).saturating_mul(u64::from(ids.ne[1])))
        .saturating_mul(8)
        .saturating_add(u64::from(a.ne[2]).saturating_mul(72));
    if map > MAX_MUL_MAT_ID_MAP {
        return refuse(
            op,
            format!("mul_mat_id row map of {map} bytes exceeds {MAX_MUL_MAT_ID_MAP}"),
        );
    }
    Ok(())
}

/// OUT_PROD: `ggml_compute_forward_out_prod_{f32,f16_f32,q_f32}` by
/// src0's type (GGML_ABORT on other types).
/// GGML_ASSERT: src1 and dst F32, ne0 = ne00, ne1 = ne10, ne2 = ne12, ne3
/// = ne13, nb00 = src0's element size, nb0 = 4; F32: ne2 % ne02 == 0, ne3
/// % ne03 == 0 (a modulo by an empty dim is SIGFPE); F16 and quantized:
/// ne02 = ne12, ne03 = ne13. Thread 0 zeroes `ne0 * ne1 * ne2 * ne3` floats from dst's
/// start (contiguous); rows i01 < ne01 of src0 pair with rows i11 = i01 of
/// src1 (ggml_can_out_prod: ne01 = ne11). The F16 and quantized paths'
/// work buffer (one widened row per thread) is bounded by
/// `MAX_OUT_PROD_F16_ROW`.
pub(super) fn check_out_prod(r: &RpcTensor, a: &RpcTensor, b: &RpcTensor) -> Result<()> {
    let op = r.op;
    let broadcast_ok = match a.ty {
        GGML_TYPE_F32 => {
            a.ne[2] >= 1 && a.ne[3] >= 1 && r.ne[2] % a.ne[2] == 0 && r.ne[3] % a.ne[3] == 0
        }
        // The quantized path (`out_prod_q_f32`, every block type with a
        // `to_float`: q8_1 and q8_K have none and GGML_ABORT) asserts what
        // the F16 one does and dequantizes each src0 row into the same
        // per-thread work buffer.
        t if t == GGML_TYPE_F16 || cpu_types::quantized_with_to_float(t) => {
            a.ne[2..] == b.ne[2..] && a.ne[0] <= MAX_OUT_PROD_F16_ROW
        }
        _ => false,
    };
    if !broadcast_ok
        || b.ty != GGML_TYPE_F32
        || r.ty != GGML_TYPE_F32
        || u64::from(a.nb[0]) != type_size(a.ty)
        || r.nb[0] != 4
        || !is_contiguous(r)
        || r.ne[0] != a.ne[0]
        || r.ne[1] != b.ne[0]
        || r.ne[2..] != b.ne[2..]
        || a.ne[1] != b.ne[1]
    {
        return refuse(
            op,
            format!("out_prod of {:?} and {:?} into {:?}", a.ne, b.ne, r.ne),
        );
    }
    Ok(())
}
