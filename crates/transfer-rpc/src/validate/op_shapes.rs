//! Per-op shape and type rules for graphs that a real compute backend will
//! run. ggml's kernels `GGML_ASSERT` (abort the process) or index out of
//! bounds when a node's shape does not match what ggml's own op builders
//! would have produced; the wire carries shapes the client chose. So a
//! backend accepts an allowlist of ops (those a dense llama graph uses),
//! each checked here against the builder's rules; every other op is refused.

use super::graph::ValidatedGraph;
use super::ops::{
    GGML_OP_GET_ROWS, GGML_OP_GLU, GGML_OP_NONE, GGML_OP_PERMUTE, GGML_OP_RESHAPE,
    GGML_OP_SET_ROWS, GGML_OP_TRANSPOSE, GGML_OP_UNARY, GGML_OP_VIEW,
};
use super::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, TypeInfo, type_info};
use crate::error::{Result, RpcError};
use crate::protocol::tensor::{MAX_SRC, RpcTensor};

const CALL: &str = "GRAPH_COMPUTE op check";
const GGML_TYPE_BF16: u32 = 30;

const OP_DUP: u32 = 1;
const OP_ADD: u32 = 2;
const OP_SUB: u32 = 6;
const OP_MUL: u32 = 7;
const OP_DIV: u32 = 8;
const OP_SCALE: u32 = 32;
const OP_CPY: u32 = 34;
const OP_CONT: u32 = 35;
const OP_NORM: u32 = 24;
const OP_RMS_NORM: u32 = 25;
const OP_MUL_MAT: u32 = 29;
const OP_SOFT_MAX: u32 = 46;
const OP_ROPE: u32 = 48;
const OP_FLASH_ATTN_EXT: u32 = 74;

fn refuse<T>(op: u32, reason: impl Into<String>) -> Result<T> {
    Err(RpcError::refused(
        CALL,
        format!("op {op}: {}", reason.into()),
    ))
}

fn info(t: &RpcTensor) -> Result<TypeInfo> {
    type_info(t.ty).ok_or_else(|| RpcError::refused(CALL, "invalid type"))
}

fn nelements(t: &RpcTensor) -> u64 {
    t.ne.iter().map(|&n| u64::from(n)).product()
}

/// Rows are contiguous: the first dimension is packed.
fn rows_contiguous(t: &RpcTensor) -> bool {
    type_info(t.ty).is_some_and(|i| u64::from(t.nb[0]) == i.type_size)
}

/// `ggml_is_contiguous`: packed in all dimensions (size-1 dims ignored).
pub fn is_contiguous(t: &RpcTensor) -> bool {
    let Some(i) = type_info(t.ty) else {
        return false;
    };
    let mut next = i.type_size;
    if t.ne[0] != 1 && u64::from(t.nb[0]) != next {
        return false;
    }
    next = next.saturating_mul(u64::from(t.ne[0]) / i.block_size);
    for d in 1..4 {
        if t.ne[d] != 1 {
            if u64::from(t.nb[d]) != next {
                return false;
            }
            next = next.saturating_mul(u64::from(t.ne[d]));
        }
    }
    true
}

fn float(ty: u32) -> bool {
    matches!(ty, GGML_TYPE_F32 | GGML_TYPE_F16 | GGML_TYPE_BF16)
}

/// Types ggml-cpu has no row kernels for: `type_traits_cpu` (ggml-cpu.c)
/// gives them no `vec_dot`, so MUL_MAT would call a null pointer, and
/// `ggml_compute_forward_get_rows` (ops.cpp) aborts on them or, for q8_1
/// (no `to_float`), calls a null pointer. Every other known type has both.
const CPU_NO_ROW_KERNELS: [&str; 7] = ["q8_1", "q8_K", "i8", "i16", "i32", "i64", "f64"];

/// A MUL_MAT `src0` type ggml-cpu multiplies (it has a `vec_dot`).
fn cpu_mul_mat_src0(ty: u32) -> bool {
    type_info(ty).is_some_and(|i| !CPU_NO_ROW_KERNELS.contains(&i.name))
}

/// A GET_ROWS source ggml-cpu reads: the MUL_MAT types plus I32 (copied
/// by the f32 path).
fn cpu_get_rows_src(ty: u32) -> bool {
    ty == GGML_TYPE_I32 || cpu_mul_mat_src0(ty)
}

fn divides(small: u32, big: u32) -> bool {
    small != 0 && big % small == 0
}

fn can_repeat(b: &RpcTensor, a: &RpcTensor) -> bool {
    (0..4).all(|i| divides(b.ne[i], a.ne[i]))
}

/// Checks every node of a validated graph against the allowlist.
pub fn check_graph_ops(g: &ValidatedGraph) -> Result<()> {
    for &n in &g.nodes {
        let mut srcs: [Option<&RpcTensor>; MAX_SRC] = [None; MAX_SRC];
        for (slot, s) in srcs.iter_mut().zip(g.srcs[n].iter()) {
            *slot = s.map(|i| &g.tensors[i]);
        }
        check_node(&g.tensors[n], &srcs, g.view_src[n].map(|i| &g.tensors[i]))?;
    }
    Ok(())
}

/// Checks one node against the builder rules of its op.
pub fn check_node(
    r: &RpcTensor,
    s: &[Option<&RpcTensor>; MAX_SRC],
    view_src: Option<&RpcTensor>,
) -> Result<()> {
    let op = r.op;
    let src = |i: usize| -> Result<&RpcTensor> {
        s[i].ok_or_else(|| RpcError::refused(CALL, format!("op {op}: missing source {i}")))
    };
    match op {
        GGML_OP_NONE => Ok(()),
        OP_ADD | OP_SUB | OP_MUL | OP_DIV => {
            let (a, b) = (src(0)?, src(1)?);
            if r.ne != a.ne
                || r.ty != a.ty
                || !float(a.ty)
                || !(b.ty == a.ty || b.ty == GGML_TYPE_F32)
            {
                return refuse(op, "binary op shapes/types");
            }
            if !can_repeat(b, a)
                || !rows_contiguous(a)
                || !rows_contiguous(b)
                || !rows_contiguous(r)
            {
                return refuse(
                    op,
                    "binary op operand does not broadcast or rows not packed",
                );
            }
            Ok(())
        }
        OP_SCALE | OP_NORM | OP_RMS_NORM => {
            let a = src(0)?;
            if r.ne != a.ne
                || r.ty != GGML_TYPE_F32
                || a.ty != GGML_TYPE_F32
                || !rows_contiguous(a)
                || !rows_contiguous(r)
            {
                return refuse(op, "norm/scale must be F32, same shape, packed rows");
            }
            Ok(())
        }
        GGML_OP_UNARY => {
            let a = src(0)?;
            if r.ne != a.ne
                || r.ty != a.ty
                || !float(a.ty)
                || !rows_contiguous(a)
                || !rows_contiguous(r)
            {
                return refuse(op, "unary shapes/types");
            }
            Ok(())
        }
        GGML_OP_GLU => {
            let a = src(0)?;
            if !float(a.ty) || r.ty != a.ty || !rows_contiguous(a) || !rows_contiguous(r) {
                return refuse(op, "glu types");
            }
            match s[1] {
                Some(b) => {
                    if b.ne != a.ne || b.ty != a.ty || r.ne != a.ne || !rows_contiguous(b) {
                        return refuse(op, "glu with gate: shapes");
                    }
                }
                None => {
                    if r.ne != [a.ne[0] / 2, a.ne[1], a.ne[2], a.ne[3]] || a.ne[0] % 2 != 0 {
                        return refuse(op, "glu: result must be half of src0");
                    }
                }
            }
            Ok(())
        }
        OP_MUL_MAT => {
            let (a, b) = (src(0)?, src(1)?);
            let ai = info(a)?;
            let transposed = a.nb[0] > a.nb[1];
            if a.ne[0] != b.ne[0]
                || !divides(a.ne[2], b.ne[2])
                || !divides(a.ne[3], b.ne[3])
                || transposed
                || !cpu_mul_mat_src0(a.ty)
                || u64::from(a.nb[0]) != ai.type_size
                || b.ty != GGML_TYPE_F32
                || r.ty != GGML_TYPE_F32
                || r.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]
                || !rows_contiguous(b)
                || !is_contiguous(r)
            {
                return refuse(op, "mul_mat shapes/types");
            }
            Ok(())
        }
        GGML_OP_RESHAPE => {
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
        GGML_OP_VIEW | GGML_OP_PERMUTE | GGML_OP_TRANSPOSE => {
            let a = src(0)?;
            if r.ty != a.ty || view_src.is_none() {
                return refuse(op, "views must keep the type and have a view source");
            }
            if op != GGML_OP_VIEW && nelements(r) != nelements(a) {
                return refuse(op, "permute/transpose must keep the element count");
            }
            Ok(())
        }
        OP_DUP | OP_CONT => {
            let a = src(0)?;
            if nelements(r) != nelements(a) || r.ty != a.ty || !float(a.ty) || !is_contiguous(r) {
                return refuse(op, "dup/cont shapes/types");
            }
            Ok(())
        }
        OP_CPY => {
            let (a, b) = (src(0)?, src(1)?);
            if nelements(a) != nelements(b)
                || !float(a.ty)
                || !float(b.ty)
                || r.ty != b.ty
                || r.ne != b.ne
            {
                return refuse(op, "cpy shapes/types");
            }
            Ok(())
        }
        GGML_OP_GET_ROWS => {
            let a = src(0)?;
            let ok_type = (r.ty == GGML_TYPE_F32 && cpu_get_rows_src(a.ty))
                || (a.ty == GGML_TYPE_I32 && r.ty == GGML_TYPE_I32);
            if !ok_type || !rows_contiguous(r) {
                return refuse(op, "get_rows types");
            }
            Ok(())
        }
        GGML_OP_SET_ROWS => {
            if !matches!(r.ty, GGML_TYPE_F32 | GGML_TYPE_F16)
                || !rows_contiguous(r)
                || !rows_contiguous(src(0)?)
            {
                return refuse(op, "set_rows destination must be F32/F16 with packed rows");
            }
            Ok(())
        }
        OP_ROPE => {
            let (a, b) = (src(0)?, src(1)?);
            let n_dims = r.op_params[1];
            let mode = r.op_params[2];
            let vector = b.ne[1] == 1 && b.ne[2] == 1 && b.ne[3] == 1;
            // Plain and NeoX rope only (mode 0 or 2).
            if !matches!(mode, 0 | 2)
                || b.ty != GGML_TYPE_I32
                || !vector
                || b.ne[0] != a.ne[2]
                || r.ne != a.ne
                || r.ty != a.ty
                || !float(a.ty)
                || n_dims <= 0
                || n_dims % 2 != 0
                || i64::from(n_dims) > i64::from(a.ne[0])
                || !rows_contiguous(a)
                || !rows_contiguous(r)
            {
                return refuse(op, "rope shapes/params");
            }
            if let Some(c) = s[2] {
                if c.ty != GGML_TYPE_F32 || i64::from(c.ne[0]) < i64::from(n_dims / 2) {
                    return refuse(op, "rope frequency factors");
                }
            }
            Ok(())
        }
        OP_SOFT_MAX => {
            let a = src(0)?;
            if a.ty != GGML_TYPE_F32
                || r.ty != GGML_TYPE_F32
                || r.ne != a.ne
                || !is_contiguous(a)
                || !is_contiguous(r)
            {
                return refuse(op, "soft_max shapes/types");
            }
            if let Some(m) = s[1] {
                if !matches!(m.ty, GGML_TYPE_F16 | GGML_TYPE_F32)
                    || !is_contiguous(m)
                    || m.ne[0] != a.ne[0]
                    || m.ne[1] < a.ne[1]
                    || !divides(m.ne[2], a.ne[2])
                    || !divides(m.ne[3], a.ne[3])
                {
                    return refuse(op, "soft_max mask");
                }
            }
            if s[2].is_some() {
                return refuse(op, "soft_max sinks are not supported");
            }
            Ok(())
        }
        OP_FLASH_ATTN_EXT => {
            let (q, k, v) = (src(0)?, src(1)?, src(2)?);
            if k.ne[0] != q.ne[0]
                || v.ne[1] != k.ne[1]
                || !divides(k.ne[2], q.ne[2])
                || !divides(v.ne[2], q.ne[2])
                || q.ne[3] != k.ne[3]
                || q.ne[3] != v.ne[3]
                || q.ty != GGML_TYPE_F32
                || !float(k.ty)
                || !float(v.ty)
                || r.ty != GGML_TYPE_F32
                || r.ne != [v.ne[0], q.ne[2], q.ne[1], q.ne[3]]
                || !is_contiguous(r)
                || !rows_contiguous(q)
                || !rows_contiguous(k)
                || !rows_contiguous(v)
            {
                return refuse(op, "flash_attn_ext shapes/types");
            }
            if let Some(m) = s[3] {
                if m.ty != GGML_TYPE_F16
                    || !is_contiguous(m)
                    || m.ne[0] != k.ne[1]
                    || m.ne[1] < q.ne[1]
                    || !divides(m.ne[2], q.ne[2])
                    || !divides(m.ne[3], q.ne[3])
                {
                    return refuse(op, "flash_attn_ext mask");
                }
            }
            if s[4].is_some() {
                return refuse(op, "flash_attn_ext sinks are not supported");
            }
            Ok(())
        }
        _ => refuse(op, "not on the compute allowlist"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::types::GGML_TYPE_Q4_0;

    const Q8_0: u32 = 8;
    const Q8_1: u32 = 9;
    const Q8_K: u32 = 15;
    const Q4_K: u32 = 12;

    /// A packed tensor of `ty` with `ne`.
    fn packed(ty: u32, ne: [u32; 4]) -> RpcTensor {
        let i = type_info(ty).map_or((1, 4), |i| (i.block_size, i.type_size));
        let row = u64::from(ne[0]) / i.0 * i.1;
        let nb1 = row as u32;
        RpcTensor {
            ty,
            ne,
            nb: [i.1 as u32, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]],
            ..RpcTensor::default()
        }
    }

    fn srcs<'a>(a: &'a RpcTensor, b: Option<&'a RpcTensor>) -> [Option<&'a RpcTensor>; MAX_SRC] {
        let mut s = [None; MAX_SRC];
        s[0] = Some(a);
        s[1] = b;
        s
    }

    /// MUL_MAT of a `ty` matrix [256, 8] by F32 activations [256, 3], as
    /// ggml_mul_mat builds it.
    fn mul_mat(ty: u32) -> Result<()> {
        let w = packed(ty, [256, 8, 1, 1]);
        let x = packed(GGML_TYPE_F32, [256, 3, 1, 1]);
        let mut r = packed(GGML_TYPE_F32, [8, 3, 1, 1]);
        r.op = OP_MUL_MAT;
        check_node(&r, &srcs(&w, Some(&x)), None)
    }

    /// GET_ROWS of 2 rows of a `ty` table [256, 8] into F32, as
    /// ggml_get_rows builds it.
    fn get_rows(ty: u32) -> Result<()> {
        let table = packed(ty, [256, 8, 1, 1]);
        let idx = packed(GGML_TYPE_I32, [2, 1, 1, 1]);
        let mut r = packed(GGML_TYPE_F32, [256, 2, 1, 1]);
        r.op = GGML_OP_GET_ROWS;
        check_node(&r, &srcs(&table, Some(&idx)), None)
    }

    #[test]
    fn quantized_weights_are_multiplied_and_read() {
        for ty in [GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, Q8_0, Q4_K] {
            assert!(mul_mat(ty).is_ok(), "mul_mat src0 type {ty}");
            assert!(get_rows(ty).is_ok(), "get_rows type {ty}");
        }
        // A quantized matrix whose rows are not packed blocks is refused.
        let mut w = packed(Q8_0, [256, 8, 1, 1]);
        w.nb[0] = 4;
        let x = packed(GGML_TYPE_F32, [256, 3, 1, 1]);
        let mut r = packed(GGML_TYPE_F32, [8, 3, 1, 1]);
        r.op = OP_MUL_MAT;
        assert!(check_node(&r, &srcs(&w, Some(&x)), None).is_err());
    }

    #[test]
    fn types_without_cpu_row_kernels_are_refused() {
        // ggml-cpu would call a null vec_dot / to_float or abort on these.
        for ty in [Q8_1, Q8_K, 24, 25, GGML_TYPE_I32, 27, 28] {
            assert!(mul_mat(ty).is_err(), "mul_mat src0 type {ty}");
        }
        for ty in [Q8_1, Q8_K, 24, 25, 27, 28] {
            assert!(get_rows(ty).is_err(), "get_rows type {ty}");
        }
    }
}
