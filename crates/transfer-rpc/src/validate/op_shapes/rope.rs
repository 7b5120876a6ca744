//! Rotary position embedding: ROPE and ROPE_BACK (ROPE's kernel with
//! `forward = false`), and the frequency-factor read past a source's extent
//! (a graph-level check: it needs the source's placement).

use super::common::*;

/// Reads a kernel makes past a source's own extent: they must at least
/// stay inside the source's buffer (the bytes read there are discarded).
pub(super) fn check_reads_past_extent(g: &ValidatedGraph, n: usize) -> Result<()> {
    let r = &g.tensors[n];
    if !matches!(r.op, OP_ROPE | OP_ROPE_BACK) || nelements(r) == 0 {
        return Ok(());
    }
    let Some(c) = g.srcs[n][2] else {
        return Ok(());
    };
    // ggml_rope_cache_init (ops.cpp) reads freq_factors[i0 / 2] for every
    // even i0 < ne0, not only the n_dims / 2 factors the kernel asserts
    // (`src2->ne[0] >= n_dims / 2`): ne0 / 2 floats from the tensor's
    // start (ne0 is even, see check_node). Partial-rotary models give
    // n_dims / 2 factors, so the read may pass the tensor's end; refuse it
    // only where it would pass the end of the buffer.
    let need = 4 * (u64::from(r.ne[0]) / 2);
    let room = g
        .checked
        .get(c)
        .and_then(|t| t.placement)
        .map_or(0, |(region, off)| region.size.saturating_sub(off));
    if need > room {
        return refuse(
            r.op,
            format!("rope reads {need} bytes of frequency factors, {room} left in their buffer"),
        );
    }
    Ok(())
}

/// ROPE and ROPE_BACK: `ggml_compute_forward_rope_flt` (ops.cpp), all five
/// modes.
pub(super) fn check_rope(r: &RpcTensor, s: &[Option<&RpcTensor>; MAX_SRC]) -> Result<()> {
    let op = r.op;
    let (Some(a), Some(b)) = (s[0], s[1]) else {
        return refuse(op, "rope needs two sources");
    };
    // op_params the kernel reads: [1] n_dims, [2] mode, [4] n_ctx_orig,
    // [5..=10] float yarn parameters (any value: float math only),
    // [11..=14] sections (multi-rope only), [15] n_offs.
    let n_dims = i64::from(r.op_params[1]);
    let mode = r.op_params[2];
    let n_offs = i64::from(r.op_params[15]);
    let ne0 = i64::from(a.ne[0]);
    let vector = b.ne[1] == 1 && b.ne[2] == 1 && b.ne[3] == 1;
    // The kernel's `switch (mode)`: NORMAL 0, NEOX 2, MROPE 8, VISION 24,
    // IMROPE 40; GGML_ABORT("rope type not supported") on any other.
    // `mode & GGML_ROPE_TYPE_MROPE` (8, 24, 40) reads 4 positions per
    // token (pos[i2 + ne2 * k], k < 4) and the sections.
    if !matches!(
        mode,
        ROPE_NORMAL | ROPE_NEOX | ROPE_MROPE | ROPE_VISION | ROPE_IMROPE
    ) {
        return refuse(op, format!("rope mode {mode} is not supported"));
    }
    let multi = mode & ROPE_MROPE != 0;
    let positions = u64::from(a.ne[2]) * if multi { 4 } else { 1 };
    // ggml_compute_forward_rope: F16 / F32 source only (GGML_ABORT on
    // BF16 and the rest), dst of the same type;
    // GGML_ASSERT(src1->type == GGML_TYPE_I32), positions read as a
    // packed int32 array (the builder's `a->ne[2] == b->ne[0]`, times 4
    // for multi-rope, ggml_is_vector(b)); GGML_ASSERT(nb0 == nb00),
    // GGML_ASSERT(nb0 == sizeof(T)).
    if b.ty != GGML_TYPE_I32
        || !vector
        || !rows_contiguous(b)
        || u64::from(b.ne[0]) != positions
        || r.ne != a.ne
        || r.ty != a.ty
        || !matches!(a.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
        || !rows_contiguous(a)
        || !rows_contiguous(r)
    {
        return refuse(op, "rope shapes/types");
    }
    // GGML_ASSERT(n_dims <= ne0), GGML_ASSERT(n_dims % 2 == 0) (n_dims 0
    // makes theta_scale pow(base, -inf): refused as the builder's callers
    // never send it).
    if n_dims <= 0 || n_dims % 2 != 0 || n_dims > ne0 {
        return refuse(op, format!("rope n_dims {n_dims} for rows of {ne0}"));
    }
    // GGML_ASSERT(n_offs >= 0), GGML_ASSERT(n_offs % 2 == 0),
    // GGML_ASSERT(n_offs + n_dims <= ne0).
    if n_offs < 0 || n_offs % 2 != 0 || n_offs + n_dims > ne0 {
        return refuse(
            op,
            format!("rope n_offs {n_offs} with n_dims {n_dims} for rows of {ne0}"),
        );
    }
    // The pass that copies the channels outside [n_offs, n_offs + n_dims)
    // copies pairs dst[i0], dst[i0 + 1] for even i0 < ne0: with ne0 odd
    // (n_dims is even, so some channel is left) its last pair writes one
    // element past the row.
    if ne0 % 2 != 0 {
        return refuse(op, format!("rope rows of odd length {ne0}"));
    }
    if multi {
        // ggml_mrope_cache_init: `sector = (i0 / 2) % sect_dims` over the
        // four sections, GGML_ASSERT(sect_dims <= ne0); the kernel
        // GGML_ASSERTs sections[0] > 0 || sections[1] > 0 || sections[2]
        // > 0. Negative sections could make the sum 0 (division by zero).
        // imrope compares `sector < 3 * sections[k]` in int.
        let sections: [i64; 4] = std::array::from_fn(|k| i64::from(r.op_params[11 + k]));
        let sum: i64 = sections.iter().sum();
        if sections.iter().any(|&x| x < 0)
            || sections[..3].iter().all(|&x| x == 0)
            || sum > ne0
            || sections.iter().any(|&x| 3 * x > i64::from(i32::MAX))
        {
            return refuse(op, format!("rope sections {sections:?} for rows of {ne0}"));
        }
    }
    // VISION rotates pairs (i, i + n_dims) over the whole row:
    // GGML_ASSERT(n_dims == ne0 / 2), GGML_ASSERT(n_offs == 0).
    if mode == ROPE_VISION && (n_dims != ne0 / 2 || n_offs != 0) {
        return refuse(
            op,
            format!("vision rope needs n_dims = ne0 / 2 and no offset, got {n_dims} / {n_offs}"),
        );
    }
    if let Some(c) = s[2] {
        // GGML_ASSERT(src2->type == GGML_TYPE_F32), GGML_ASSERT(src2->ne[0]
        // >= n_dims / 2); read as a packed float array (its reach past
        // the tensor: check_reads_past_extent).
        if c.ty != GGML_TYPE_F32 || i64::from(c.ne[0]) < n_dims / 2 || !rows_contiguous(c) {
            return refuse(op, "rope frequency factors");
        }
    }
    Ok(())
}
