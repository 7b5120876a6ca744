//! Row gathers and scatters: GET_ROWS, SET_ROWS. Their indices are
//! range-checked on every run (`graph.rs`); the rules here are the shapes
//! and types (GET_ROWS_BACK is a training op, `train.rs`).

use super::common::*;

/// GET_ROWS (its indices are range-checked on every run, `graph.rs`).
pub(super) fn check_get_rows(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let a = src(0)?;
    // ggml_compute_forward_get_rows (ops.cpp): quantized sources
    // dequantize, F16 / BF16 convert, F32 / I32 copy ne00 elements
    // of 4 bytes; every path writes floats (or the I32 bits) into
    // a packed dst row and reads a packed source row (assert(nb00
    // == type size)).
    let ok_type = (r.ty == GGML_TYPE_F32 && cpu_get_rows_src(a.ty))
        || (a.ty == GGML_TYPE_I32 && r.ty == GGML_TYPE_I32);
    if !ok_type || !rows_contiguous(r) || !rows_contiguous(a) {
        return refuse(op, "get_rows types");
    }
    Ok(())
}

/// SET_ROWS (its indices are range-checked on every run, `graph.rs`).
pub(super) fn check_set_rows(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    // ggml_compute_forward_set_rows (ops.cpp): src0 F32 / F16
    // (GGML_ABORT otherwise, checked with the indices in graph.rs),
    // rows of nc = ne00 elements written with the dst type's
    // from_float (called unchecked: null for the iq2 / iq3 / iq1
    // types and the integers but I32) into packed dst rows, read
    // from packed src0 rows. nc is dst's ne[0] (graph.rs), a whole
    // number of dst blocks (check_shape).
    if !cpu_types::has_from_float(r.ty) || !rows_contiguous(r) || !rows_contiguous(src(0)?) {
        return refuse(
            op,
            "set_rows destination needs a from_float and packed rows",
        );
    }
    Ok(())
}
