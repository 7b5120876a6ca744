//! The ggml type table (ggml at protocol 7.0.0, `GGML_TYPE_COUNT` = 43).

/// Number of `ggml_type` values (including removed ones).
pub const GGML_TYPE_COUNT: u32 = 43;
/// `GGML_TYPE_F32`.
pub const GGML_TYPE_F32: u32 = 0;
/// `GGML_TYPE_F16`.
pub const GGML_TYPE_F16: u32 = 1;
/// `GGML_TYPE_Q4_0`.
pub const GGML_TYPE_Q4_0: u32 = 2;
/// `GGML_TYPE_I32`.
pub const GGML_TYPE_I32: u32 = 26;
/// `GGML_TYPE_I64`.
pub const GGML_TYPE_I64: u32 = 27;

/// Layout facts of one ggml type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    /// Name as ggml prints it.
    pub name: &'static str,
    /// Elements per block.
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
}

const fn t(name: &'static str, block_size: u64, type_size: u64) -> Option<TypeInfo> {
    Some(TypeInfo {
        name,
        block_size,
        type_size,
    })
}

/// Indexed by `ggml_type`; `None` marks a removed type.
const TABLE: [Option<TypeInfo>; GGML_TYPE_COUNT as usize] = [
    t("f32", 1, 4),
    t("f16", 1, 2),
    t("q4_0", 32, 18),
    t("q4_1", 32, 20),
    None, // q4_2 removed
    None, // q4_3 removed
    t("q5_0", 32, 22),
    t("q5_1", 32, 24),
    t("q8_0", 32, 34),
    t("q8_1", 32, 36),
    t("q2_K", 256, 84),
    t("q3_K", 256, 110),
    t("q4_K", 256, 144),
    t("q5_K", 256, 176),
    t("q6_K", 256, 210),
    t("q8_K", 256, 292),
    t("iq2_xxs", 256, 66),
    t("iq2_xs", 256, 74),
    t("iq3_xxs", 256, 98),
    t("iq1_s", 256, 50),
    t("iq4_nl", 32, 18),
    t("iq3_s", 256, 110),
    t("iq2_s", 256, 82),
    t("iq4_xs", 256, 136),
    t("i8", 1, 1),
    t("i16", 1, 2),
    t("i32", 1, 4),
    t("i64", 1, 8),
    t("f64", 1, 8),
    t("iq1_m", 256, 56),
    t("bf16", 1, 2),
    None, // q4_0_4_4 removed
    None, // q4_0_4_8 removed
    None, // q4_0_8_8 removed
    t("tq1_0", 256, 54),
    t("tq2_0", 256, 66),
    None, // iq4_nl_4_4 removed
    None, // iq4_nl_4_8 removed
    None, // iq4_nl_8_8 removed
    t("mxfp4", 32, 17),
    t("nvfp4", 64, 36),
    t("q1_0", 128, 18),
    t("q2_0", 64, 18),
];

/// Layout of `ty`, or `None` for an unknown or removed type.
pub fn type_info(ty: u32) -> Option<TypeInfo> {
    TABLE.get(ty as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_spot_checks() {
        assert_eq!(type_info(GGML_TYPE_F32).map(|t| t.type_size), Some(4));
        assert_eq!(type_info(GGML_TYPE_Q4_0).map(|t| t.block_size), Some(32));
        assert_eq!(type_info(14).map(|t| t.name), Some("q6_K"));
        assert!(type_info(4).is_none());
        assert!(type_info(31).is_none());
        assert!(type_info(GGML_TYPE_COUNT).is_none());
        assert!(type_info(u32::MAX).is_none());
    }
}
