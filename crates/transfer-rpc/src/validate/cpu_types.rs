//! What ggml-cpu can do with each type: the function pointers of
//! `type_traits_cpu` (ggml-cpu.c: `from_float`, `vec_dot`, `vec_dot_type`)
//! and `type_traits` (ggml.c: `to_float`) of the llama.cpp that
//! llama-cpp-sys-2 0.1.161 vendors. A kernel calls these pointers without
//! checking them, so a null entry is a null call: the op rules ask here
//! before letting a type reach such a call.

use super::types::type_info;

fn name(ty: u32) -> Option<&'static str> {
    type_info(ty).map(|i| i.name)
}

/// `type_traits_cpu[ty].vec_dot_type` for the types that also have a
/// `vec_dot` (MUL_MAT / MUL_MAT_ID `src0`, FLASH_ATTN_EXT K); `None` for
/// types without one (q8_1, q8_K, the integers, f64: a null `vec_dot`).
pub fn vec_dot_type(ty: u32) -> Option<u32> {
    let vdt = match name(ty)? {
        "f32" => "f32",
        "f16" => "f16",
        "bf16" => "bf16",
        "q1_0" | "q2_0" | "q4_0" | "q5_0" | "q8_0" | "mxfp4" | "nvfp4" | "iq4_nl" => "q8_0",
        "q4_1" | "q5_1" => "q8_1",
        "q2_K" | "q3_K" | "q4_K" | "q5_K" | "q6_K" | "iq2_xxs" | "iq2_xs" | "iq3_xxs" | "iq1_s"
        | "iq3_s" | "iq2_s" | "iq4_xs" | "iq1_m" | "tq1_0" | "tq2_0" => "q8_K",
        _ => return None,
    };
    (0..super::types::GGML_TYPE_COUNT).find(|&t| name(t) == Some(vdt))
}

/// `type_traits_cpu[ty].from_float` is set: rows of `ty` can be written
/// from floats (CPY / DUP destinations, SET_ROWS destinations, the
/// vec_dot conversion of activations). iq2_xxs, iq2_xs, iq3_xxs, iq3_s,
/// iq2_s, iq1_s and iq1_m have none (they need `ggml_quantize_init`), nor
/// have i8, i16, i64 and f64.
pub fn has_from_float(ty: u32) -> bool {
    matches!(
        name(ty),
        Some(
            "f32"
                | "f16"
                | "bf16"
                | "i32"
                | "q1_0"
                | "q2_0"
                | "q4_0"
                | "q4_1"
                | "q5_0"
                | "q5_1"
                | "q8_0"
                | "q8_1"
                | "mxfp4"
                | "nvfp4"
                | "q2_K"
                | "q3_K"
                | "q4_K"
                | "q5_K"
                | "q6_K"
                | "iq4_nl"
                | "iq4_xs"
                | "q8_K"
                | "tq1_0"
                | "tq2_0"
        )
    )
}

/// A block-quantized type (`ggml_is_quantized`): block size above one.
pub fn is_quantized(ty: u32) -> bool {
    type_info(ty).is_some_and(|i| i.block_size > 1)
}

/// `type_traits[ty].to_float` is set for a quantized type: every one but
/// q8_1 and q8_K (dequantizing CPY to F32, GET_ROWS, FLASH_ATTN_EXT V).
pub fn quantized_with_to_float(ty: u32) -> bool {
    is_quantized(ty) && !matches!(name(ty), Some("q8_1" | "q8_K"))
}

/// src0 types `ggml_compute_forward_mul_mat_tiled` / `_id_tiled`
/// (tiled/tiled.cpp) take over: they walk `src1` rows as one flat run of
/// `nb[1]` steps when `src1` is already the vec_dot type (Q8_K).
pub fn tiled_mul_mat_src0(ty: u32) -> bool {
    matches!(
        name(ty),
        Some(
            "q2_K"
                | "q3_K"
                | "q4_K"
                | "q5_K"
                | "q6_K"
                | "iq4_xs"
                | "iq2_xxs"
                | "iq2_xs"
                | "iq2_s"
                | "iq3_xxs"
                | "iq3_s"
                | "iq1_s"
                | "iq1_m"
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trait_table_spot_checks() {
        assert_eq!(vec_dot_type(0), Some(0));
        assert_eq!(vec_dot_type(1), Some(1));
        assert_eq!(vec_dot_type(30), Some(30));
        assert_eq!(vec_dot_type(2), Some(8)); // q4_0 -> q8_0
        assert_eq!(vec_dot_type(3), Some(9)); // q4_1 -> q8_1
        assert_eq!(vec_dot_type(12), Some(15)); // q4_K -> q8_K
        assert_eq!(vec_dot_type(39), Some(8)); // mxfp4 -> q8_0
        for no_vec_dot in [9, 15, 24, 25, 26, 27, 28, 4, 31, 99] {
            assert_eq!(vec_dot_type(no_vec_dot), None, "{no_vec_dot}");
        }
        for with in [0, 1, 2, 8, 9, 12, 15, 20, 23, 26, 30, 39] {
            assert!(has_from_float(with), "{with}");
        }
        for without in [16, 17, 18, 19, 21, 22, 29, 24, 25, 27, 28] {
            assert!(!has_from_float(without), "{without}");
        }
        assert!(quantized_with_to_float(2) && quantized_with_to_float(16));
        assert!(!quantized_with_to_float(9) && !quantized_with_to_float(15));
        assert!(!quantized_with_to_float(0) && !quantized_with_to_float(30));
        assert!(tiled_mul_mat_src0(12) && !tiled_mul_mat_src0(2));
    }
}
