//! Layer placement: tensor-split ratios (like llama.cpp's
//! `--tensor-split 1,1,1`) to one contiguous layer range per stage.

use std::ops::Range;

use crate::error::{Result, RpcError};

const CALL: &str = "tensor split";

/// Parses `"1,1,2"` into ratios; an empty string means `stages` equal parts.
pub fn parse_tensor_split(s: &str, stages: usize) -> Result<Vec<f64>> {
    if s.trim().is_empty() {
        return Ok(vec![1.0; stages]);
    }
    s.split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .map_err(|_| RpcError::refused(CALL, format!("{p:?} is not a number")))
        })
        .collect()
}

/// Splits `n_layer` layers into `ratios.len()` contiguous ranges, in
/// proportion to the ratios (cumulative boundaries rounded to the nearest
/// layer), each stage holding at least one layer.
pub fn split_layers(n_layer: u32, ratios: &[f64]) -> Result<Vec<Range<u32>>> {
    let p = ratios.len();
    if p == 0 {
        return Err(RpcError::refused(CALL, "no stages"));
    }
    if p > n_layer as usize {
        return Err(RpcError::refused(
            CALL,
            format!("{p} stages but only {n_layer} layers (each stage needs one)"),
        ));
    }
    if let Some(r) = ratios.iter().find(|r| !r.is_finite() || **r <= 0.0) {
        return Err(RpcError::refused(
            CALL,
            format!(
                "ratio {r} (ratios must be finite and positive; drop a server instead of giving it 0)"
            ),
        ));
    }
    let total: f64 = ratios.iter().sum();
    let n = f64::from(n_layer);
    let mut ranges = Vec::with_capacity(p);
    let mut start = 0u32;
    let mut cum = 0.0;
    for (i, r) in ratios.iter().enumerate() {
        cum += r;
        let stages_left = (p - i - 1) as u32;
        let ideal = (n * cum / total).round() as u32;
        let end = if stages_left == 0 {
            n_layer
        } else {
            ideal.clamp(start + 1, n_layer - stages_left)
        };
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_and_weighted_splits() -> Result<()> {
        assert_eq!(split_layers(4, &[1.0; 4])?, vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(split_layers(4, &[1.0, 1.0])?, vec![0..2, 2..4]);
        assert_eq!(split_layers(6, &[1.0, 2.0])?, vec![0..2, 2..6]);
        assert_eq!(
            split_layers(32, &[1.0, 1.0, 1.0])?,
            vec![0..11, 11..21, 21..32]
        );
        // A tiny ratio still gets one layer.
        assert_eq!(split_layers(4, &[100.0, 0.01])?, vec![0..3, 3..4]);
        assert_eq!(split_layers(4, &[0.01, 100.0])?, vec![0..1, 1..4]);
        Ok(())
    }

    #[test]
    fn bad_ratios_are_refused() -> Result<()> {
        assert!(split_layers(2, &[1.0; 3]).is_err());
        assert!(split_layers(4, &[]).is_err());
        assert!(split_layers(4, &[1.0, 0.0]).is_err());
        assert!(split_layers(4, &[1.0, -1.0]).is_err());
        assert!(split_layers(4, &[f64::NAN, 1.0]).is_err());
        assert!(parse_tensor_split("1,x", 2).is_err());
        assert_eq!(parse_tensor_split("", 3)?, vec![1.0; 3]);
        assert_eq!(parse_tensor_split("1, 2", 2)?, vec![1.0, 2.0]);
        Ok(())
    }
}
