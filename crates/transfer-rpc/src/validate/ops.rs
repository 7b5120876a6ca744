//! The ggml op table (ggml at protocol 7.0.0, `GGML_OP_COUNT` = 101).

/// Number of `ggml_op` values.
pub const GGML_OP_COUNT: u32 = 101;
/// `GGML_OP_NONE`.
pub const GGML_OP_NONE: u32 = 0;
/// `GGML_OP_ADD_ID`.
pub const GGML_OP_ADD_ID: u32 = 3;
/// `GGML_OP_MUL_MAT_ID`.
pub const GGML_OP_MUL_MAT_ID: u32 = 30;
/// `GGML_OP_CPY`: `ggml_cast` builds it with src[1] = the result itself.
pub const GGML_OP_CPY: u32 = 34;
/// `GGML_OP_RESHAPE`.
pub const GGML_OP_RESHAPE: u32 = 36;
/// `GGML_OP_VIEW`.
pub const GGML_OP_VIEW: u32 = 37;
/// `GGML_OP_PERMUTE`.
pub const GGML_OP_PERMUTE: u32 = 38;
/// `GGML_OP_TRANSPOSE`.
pub const GGML_OP_TRANSPOSE: u32 = 39;
/// `GGML_OP_GET_ROWS`.
pub const GGML_OP_GET_ROWS: u32 = 40;
/// `GGML_OP_GET_ROWS_BACK`.
pub const GGML_OP_GET_ROWS_BACK: u32 = 41;
/// `GGML_OP_SET_ROWS`.
pub const GGML_OP_SET_ROWS: u32 = 42;
/// `GGML_OP_SSM_SCAN`.
pub const GGML_OP_SSM_SCAN: u32 = 77;
/// `GGML_OP_UNARY`.
pub const GGML_OP_UNARY: u32 = 91;
/// `GGML_OP_MAP_CUSTOM1`.
pub const GGML_OP_MAP_CUSTOM1: u32 = 92;
/// `GGML_OP_MAP_CUSTOM2`.
pub const GGML_OP_MAP_CUSTOM2: u32 = 93;
/// `GGML_OP_MAP_CUSTOM3`.
pub const GGML_OP_MAP_CUSTOM3: u32 = 94;
/// `GGML_OP_CUSTOM`.
pub const GGML_OP_CUSTOM: u32 = 95;
/// `GGML_OP_GLU`.
pub const GGML_OP_GLU: u32 = 100;
/// Number of `ggml_unary_op` values.
pub const GGML_UNARY_OP_COUNT: i32 = 22;
/// Number of `ggml_glu_op` values.
pub const GGML_GLU_OP_COUNT: i32 = 7;

/// True for ops whose `op_params` carry host function pointers: executing
/// them would call an address chosen by the client.
pub fn is_custom(op: u32) -> bool {
    matches!(
        op,
        GGML_OP_MAP_CUSTOM1 | GGML_OP_MAP_CUSTOM2 | GGML_OP_MAP_CUSTOM3 | GGML_OP_CUSTOM
    )
}

/// True for ops that only re-describe memory of their source.
pub fn is_view_op(op: u32) -> bool {
    matches!(
        op,
        GGML_OP_RESHAPE | GGML_OP_VIEW | GGML_OP_PERMUTE | GGML_OP_TRANSPOSE
    )
}
