//! The numbers the ggml-rpc wire (protocol 7.0, `GGML_OP_COUNT` = 101)
//! gives ops, unary ops, GLU ops and types, by name: the host's own numbers
//! cross only after `ggml_op_name` / `ggml_type_name` (the op enum moves
//! between ggml releases). Generated from ggml 0.25.3's `ggml.c` tables.

/// `GGML_OP_NAME` in wire order.
pub const WIRE_OPS: [&str; 101] = [
    "NONE",
    "DUP",
    "ADD",
    "ADD_ID",
    "ADD1",
    "ACC",
    "SUB",
    "MUL",
    "DIV",
    "SQR",
    "SQRT",
    "LOG",
    "SIN",
    "COS",
    "SUM",
    "SUM_ROWS",
    "CUMSUM",
    "MEAN",
    "ARGMAX",
    "COUNT_EQUAL",
    "REPEAT",
    "REPEAT_BACK",
    "CONCAT",
    "SILU_BACK",
    "NORM",
    "RMS_NORM",
    "RMS_NORM_BACK",
    "GROUP_NORM",
    "L2_NORM",
    "MUL_MAT",
    "MUL_MAT_ID",
    "OUT_PROD",
    "SCALE",
    "SET",
    "CPY",
    "CONT",
    "RESHAPE",
    "VIEW",
    "PERMUTE",
    "TRANSPOSE",
    "GET_ROWS",
    "GET_ROWS_BACK",
    "SET_ROWS",
    "DIAG",
    "DIAG_MASK_INF",
    "DIAG_MASK_ZERO",
    "SOFT_MAX",
    "SOFT_MAX_BACK",
    "ROPE",
    "ROPE_BACK",
    "CLAMP",
    "CONV_TRANSPOSE_1D",
    "IM2COL",
    "IM2COL_BACK",
    "IM2COL_3D",
    "COL2IM_1D",
    "CONV_2D",
    "CONV_3D",
    "CONV_2D_DW",
    "CONV_TRANSPOSE_2D",
    "POOL_1D",
    "POOL_2D",
    "POOL_2D_BACK",
    "UPSCALE",
    "PAD",
    "PAD_REFLECT_1D",
    "ROLL",
    "ARANGE",
    "TIMESTEP_EMBEDDING",
    "ARGSORT",
    "TOP_K",
    "LEAKY_RELU",
    "TRI",
    "FILL",
    "FLASH_ATTN_EXT",
    "FLASH_ATTN_BACK",
    "SSM_CONV",
    "SSM_SCAN",
    "WIN_PART",
    "WIN_UNPART",
    "GET_REL_POS",
    "ADD_REL_POS",
    "RWKV_WKV6",
    "GATED_LINEAR_ATTN",
    "RWKV_WKV7",
    "SOLVE_TRI",
    "GATED_DELTA_NET",
    "LIGHTNING_INDEXER",
    "DSV4_HC_COMB",
    "DSV4_HC_PRE",
    "DSV4_HC_POST",
    "UNARY",
    "MAP_CUSTOM1",
    "MAP_CUSTOM2",
    "MAP_CUSTOM3",
    "CUSTOM",
    "CROSS_ENTROPY_LOSS",
    "CROSS_ENTROPY_LOSS_BACK",
    "OPT_STEP_ADAMW",
    "OPT_STEP_SGD",
    "GLU",
];

/// `GGML_UNARY_OP_NAME` in wire order.
pub const WIRE_UNARY_OPS: [&str; 22] = [
    "ABS",
    "SGN",
    "NEG",
    "STEP",
    "TANH",
    "ELU",
    "RELU",
    "SIGMOID",
    "GELU",
    "GELU_QUICK",
    "SILU",
    "HARDSWISH",
    "HARDSIGMOID",
    "EXP",
    "EXPM1",
    "SOFTPLUS",
    "GELU_ERF",
    "XIELU",
    "FLOOR",
    "CEIL",
    "ROUND",
    "TRUNC",
];

/// `GGML_GLU_OP_NAME` in wire order.
pub const WIRE_GLU_OPS: [&str; 7] = [
    "REGLU",
    "GEGLU",
    "SWIGLU",
    "SWIGLU_OAI",
    "GEGLU_ERF",
    "GEGLU_QUICK",
    "SWIGLU_CLAMP",
];

/// `ggml_type_name` in wire order (`None`: a removed type number).
pub const WIRE_TYPES: [Option<&str>; 43] = [
    Some("f32"),
    Some("f16"),
    Some("q4_0"),
    Some("q4_1"),
    None,
    None,
    Some("q5_0"),
    Some("q5_1"),
    Some("q8_0"),
    Some("q8_1"),
    Some("q2_K"),
    Some("q3_K"),
    Some("q4_K"),
    Some("q5_K"),
    Some("q6_K"),
    Some("q8_K"),
    Some("iq2_xxs"),
    Some("iq2_xs"),
    Some("iq3_xxs"),
    Some("iq1_s"),
    Some("iq4_nl"),
    Some("iq3_s"),
    Some("iq2_s"),
    Some("iq4_xs"),
    Some("i8"),
    Some("i16"),
    Some("i32"),
    Some("i64"),
    Some("f64"),
    Some("iq1_m"),
    Some("bf16"),
    None,
    None,
    None,
    Some("tq1_0"),
    Some("tq2_0"),
    None,
    None,
    None,
    Some("mxfp4"),
    Some("nvfp4"),
    Some("q1_0"),
    Some("q2_0"),
];

/// The wire number of the op named `name`.
pub fn wire_op(name: &str) -> Option<u32> {
    WIRE_OPS.iter().position(|&n| n == name).map(|i| i as u32)
}

/// The wire number of the unary op named `name`.
pub fn wire_unary(name: &str) -> Option<i32> {
    WIRE_UNARY_OPS
        .iter()
        .position(|&n| n == name)
        .map(|i| i as i32)
}

/// The wire number of the GLU op named `name`.
pub fn wire_glu(name: &str) -> Option<i32> {
    WIRE_GLU_OPS
        .iter()
        .position(|&n| n == name)
        .map(|i| i as i32)
}

/// The wire number of the type named `name`.
pub fn wire_type(name: &str) -> Option<u32> {
    WIRE_TYPES
        .iter()
        .position(|&n| n == Some(name))
        .map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_numbers() {
        assert_eq!(wire_op("NONE"), Some(0));
        assert_eq!(wire_op("MUL_MAT"), Some(29));
        assert_eq!(wire_op("UNARY"), Some(91));
        assert_eq!(wire_op("GLU"), Some(100));
        assert_eq!(wire_op("NOT_AN_OP"), None);
        assert_eq!(wire_unary("SILU"), Some(10));
        assert_eq!(wire_glu("SWIGLU"), Some(2));
        assert_eq!(wire_type("f32"), Some(0));
        assert_eq!(wire_type("q8_0"), Some(8));
        assert_eq!(wire_type("i32"), Some(26));
        assert_eq!(wire_type("bf16"), Some(30));
    }
}
