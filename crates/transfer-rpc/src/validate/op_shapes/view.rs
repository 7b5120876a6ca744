//! Views and copies: NONE (leaves), RESHAPE, VIEW, PERMUTE, TRANSPOSE (they
//! only re-describe their source's memory) and DUP, CONT, CPY (type
//! conversion through `ggml_compute_forward_dup`).

use super::common::*;

/// NONE: a leaf (weights, inputs); nothing runs.
pub(super) fn check_none(_r: &RpcTensor) -> Result<()> {
    Ok(())
}

/// RESHAPE: a view of a contiguous source with its element count.
pub(super) fn check_reshape(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    view_src: Option<&RpcTensor>,
) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let a = src(0)?;
    if r.ty != a.ty
        || nelements(r) != nelements(a)
        || !is_contiguous(a)
        || !is_contiguous(r)
        || view_src.is_none()
    {
        return refuse(
            op,
            "reshape of a non-contiguous tensor or element count change",
        );
    }
    Ok(())
}

/// VIEW, PERMUTE, TRANSPOSE: views that keep their source's type.
pub(super) fn check_view(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    view_src: Option<&RpcTensor>,
) -> Result<()> {
    let op = r.op;
    let src = |i: usize| source(s, op, i);
    let a = src(0)?;
    if r.ty != a.ty || view_src.is_none() {
        return refuse(op, "views must keep the type and have a view source");
    }
    if op != GGML_OP_VIEW && nelements(r) != nelements(a) {
        return refuse(op, "permute/transpose must keep the element count");
    }
    Ok(())
}

/// DUP, CONT and CPY: `ggml_compute_forward_dup` (ops.cpp; CPY and CONT
/// call it too), which picks a path by the (src0, dst) types.
pub(super) fn check_copy(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let Some(a) = s[0] else {
        return refuse(op, "copy needs a source");
    };
    // Every path: GGML_ASSERT(ggml_nelements(dst) == ggml_nelements(src0)).
    if nelements(r) != nelements(a) {
        return refuse(op, "copy source and result element counts differ");
    }
    if op == OP_CPY {
        // ggml_cpy's result is a view of src1; the dequantizing path
        // below computes dst offsets from src1's shape and strides.
        let Some(b) = s[1] else {
            return refuse(op, "cpy needs a destination");
        };
        if r.ty != b.ty || r.ne != b.ne || r.nb != b.nb {
            return refuse(op, "cpy result must have its destination's layout");
        }
    }
    let (from, to) = (a.ty, r.ty);
    if from == to {
        // dup_bytes: memcpy of whole blocks, for any type. When dst is
        // contiguous but the pair is neither both contiguous (dup_same_cont)
        // nor same-shaped with packed rows (copy by rows), it copies rows of
        // `ne00 * type_size` bytes: for a block type that is block_size
        // times the row, written past dst's end.
        let flat_dst_path = is_contiguous(r)
            && !is_contiguous(a)
            && !(r.ne == a.ne && rows_contiguous(a) && rows_contiguous(r));
        if cpu_types::is_quantized(from) && flat_dst_path {
            return refuse(
                op,
                "same-type copy of blocks into a contiguous result of another shape \
                 needs a contiguous source",
            );
        }
        return Ok(());
    }
    let float_like = |t: u32| float(t);
    if float_like(from) && float_like(to) {
        // dup_flt between F32 / F16 / BF16: element-wise, any strides.
        return Ok(());
    }
    if (from == GGML_TYPE_F32 && to == GGML_TYPE_I32)
        || (from == GGML_TYPE_I32 && to == GGML_TYPE_F32)
    {
        // dup_flt<float, int32_t> / dup_flt<int32_t, float>.
        return Ok(());
    }
    if float_like(from) && cpu_types::is_quantized(to) {
        // dup_to_q: GGML_ABORT unless dst is contiguous, nb00 ==
        // sizeof(src_t) and dst has a from_float. Each source row of ne00
        // elements is converted into params->wdata at (ne00 +
        // CACHE_LINE_SIZE_F32) * ith floats, which ggml_graph_plan sizes
        // by dst's ne[0]: ne00 may not exceed it. quantize_row_q writes
        // whole blocks: ne00 is a multiple of dst's block size.
        let block = type_info(to).map_or(u64::MAX, |i| i.block_size);
        let a_ts = type_info(from).map_or(0, |i| i.type_size);
        if !cpu_types::has_from_float(to)
            || !is_contiguous(r)
            || u64::from(a.nb[0]) != a_ts
            || a.ne[0] > r.ne[0]
            || u64::from(a.ne[0]) % block != 0
        {
            return refuse(
                op,
                "quantizing copy needs a contiguous destination with a from_float, \
                 packed source rows of whole blocks no longer than the result's",
            );
        }
        return Ok(());
    }
    if cpu_types::quantized_with_to_float(from) && to == GGML_TYPE_F32 {
        // dup_from_q: reads src1 (GGML_TENSOR_BINARY_OP_LOCALS), a null
        // pointer for DUP / CONT; GGML_ASSERT(nb10 == sizeof(float)),
        // GGML_ASSERT(ne10 % qk == 0 || ggml_is_contiguous(dst)).
        let block = type_info(from).map_or(u64::MAX, |i| i.block_size);
        let ok =
            op == OP_CPY && r.nb[0] == 4 && (u64::from(r.ne[0]) % block == 0 || is_contiguous(r));
        if !ok {
            return refuse(
                op,
                "dequantizing copy needs CPY into F32 with packed rows of whole blocks",
            );
        }
        return Ok(());
    }
    // I32 to anything but F32, F16 / BF16 to I32 (dup_to_q with an unsized
    // work buffer), quantized to anything but F32 or itself, and the other
    // integer types: GGML_ABORT or a null call.
    refuse(
        op,
        format!(
            "ggml-cpu has no copy from {} to {}",
            type_info(from).map_or("?", |i| i.name),
            type_info(to).map_or("?", |i| i.name)
        ),
    )
}
