//! A llama-architecture model: hyperparameters from the `llama.*` keys and
//! the tensors each layer needs, with their shapes checked.

use std::path::Path;

use llama_cpp_sys_2 as sys;

use super::gguf::{GgufFile, MetaValue, TensorInfo, tensor_nbytes};
use crate::error::{Result, RpcError};
use crate::validate::types::GGML_TYPE_F32;

const CALL: &str = "llama model";

/// Hyperparameters of a llama model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaHparams {
    /// Embedding width.
    pub n_embd: u32,
    /// Number of layers.
    pub n_layer: u32,
    /// Attention heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Feed-forward width.
    pub n_ff: u32,
    /// Vocabulary size.
    pub n_vocab: u32,
    /// Size of one head.
    pub head_dim: u32,
    /// Rotary dimensions (llama: the whole head).
    pub n_rot: u32,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_freq_base: f32,
    /// Training context (RoPE's `n_ctx_orig`).
    pub n_ctx_train: u32,
}

impl LlamaHparams {
    /// Width of the K (and V) rows of one token: `head_dim * n_head_kv`.
    pub fn n_embd_kv(&self) -> u32 {
        self.head_dim * self.n_head_kv
    }
}

/// Names of the per-layer weight tensors, in upload order.
pub const LAYER_TENSORS: [&str; 9] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// GGUF name of a layer tensor.
pub fn layer_tensor_name(layer: u32, what: &str) -> String {
    format!("blk.{layer}.{what}.weight")
}

/// A parsed llama GGUF.
#[derive(Debug)]
pub struct LlamaModel {
    /// Hyperparameters.
    pub hparams: LlamaHparams,
    /// The file (tensor data is read from it on demand).
    pub file: GgufFile,
    /// Name of the output matrix (`output.weight`, or `token_embd.weight`
    /// when the embeddings are tied).
    pub output_name: String,
}

fn key_u32(f: &GgufFile, key: &str) -> Result<u32> {
    f.get(key)
        .and_then(MetaValue::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| RpcError::malformed(CALL, format!("missing or bad key {key}")))
}

fn key_f32_or(f: &GgufFile, key: &str, default: f32) -> Result<f32> {
    match f.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_f64()
            .map(|x| x as f32)
            .filter(|x| x.is_finite())
            .ok_or_else(|| RpcError::malformed(CALL, format!("bad key {key}"))),
    }
}

impl LlamaModel {
    /// Opens a GGUF and checks it is a llama model this coordinator runs.
    pub fn open(path: &Path) -> Result<LlamaModel> {
        let file = GgufFile::open(path)?;
        let arch = file
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .unwrap_or("");
        if arch != "llama" {
            return Err(RpcError::refused(
                CALL,
                format!("architecture {arch:?} (only \"llama\" is supported)"),
            ));
        }
        let n_embd = key_u32(&file, "llama.embedding_length")?;
        let n_head = key_u32(&file, "llama.attention.head_count")?;
        let n_head_kv = match file.get("llama.attention.head_count_kv") {
            None => n_head,
            Some(_) => key_u32(&file, "llama.attention.head_count_kv")?,
        };
        let n_vocab = match file.get("llama.vocab_size") {
            Some(_) => key_u32(&file, "llama.vocab_size")?,
            None => match file.get("tokenizer.ggml.tokens") {
                Some(MetaValue::Array { len, .. }) => u32::try_from(*len)
                    .map_err(|_| RpcError::malformed(CALL, "vocabulary too large"))?,
                _ => return Err(RpcError::malformed(CALL, "no vocabulary size")),
            },
        };
        if n_head == 0 || n_head_kv == 0 || n_embd % n_head != 0 || n_head % n_head_kv != 0 {
            return Err(RpcError::malformed(
                CALL,
                "head counts do not divide the width",
            ));
        }
        let head_dim = n_embd / n_head;
        let n_rot = match file.get("llama.rope.dimension_count") {
            None => head_dim,
            Some(_) => key_u32(&file, "llama.rope.dimension_count")?,
        };
        if n_rot != head_dim {
            return Err(RpcError::refused(CALL, "partial rotary dimensions"));
        }
        // What the stage graph does not implement is refused rather than
        // run with silently different numbers.
        let scaling = file
            .get("llama.rope.scaling.type")
            .and_then(MetaValue::as_str)
            .unwrap_or("none");
        let factor = key_f32_or(&file, "llama.rope.scaling.factor", 1.0)?;
        if (scaling != "none" && factor != 1.0) || file.tensor("rope_freqs.weight").is_some() {
            return Err(RpcError::refused(CALL, "RoPE scaling / frequency factors"));
        }
        if key_f32_or(&file, "llama.attention.scale", 0.0)? != 0.0 {
            return Err(RpcError::refused(CALL, "a custom attention scale"));
        }
        if file
            .tensors
            .iter()
            .any(|t| t.name.ends_with(".bias") || t.name.ends_with("attn_qkv.weight"))
        {
            return Err(RpcError::refused(CALL, "bias or fused QKV tensors"));
        }
        if file
            .get("llama.expert_count")
            .and_then(MetaValue::as_u64)
            .unwrap_or(0)
            > 0
        {
            return Err(RpcError::refused(CALL, "mixture-of-experts llama models"));
        }
        let hparams = LlamaHparams {
            n_embd,
            n_layer: key_u32(&file, "llama.block_count")?,
            n_head,
            n_head_kv,
            n_ff: key_u32(&file, "llama.feed_forward_length")?,
            n_vocab,
            head_dim,
            n_rot,
            rms_eps: key_f32_or(&file, "llama.attention.layer_norm_rms_epsilon", 1e-5)?,
            rope_freq_base: key_f32_or(&file, "llama.rope.freq_base", 10000.0)?,
            n_ctx_train: key_u32(&file, "llama.context_length")?,
        };
        if hparams.n_layer == 0 || hparams.n_ff == 0 || n_vocab == 0 {
            return Err(RpcError::malformed(
                CALL,
                "zero layers, ffn width or vocabulary",
            ));
        }
        let output_name = if file.tensor("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        }
        .to_owned();
        let m = LlamaModel {
            hparams,
            file,
            output_name,
        };
        m.check_shapes()?;
        Ok(m)
    }

    /// The info of a tensor that must exist.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.file
            .tensor(name)
            .ok_or_else(|| RpcError::malformed(CALL, format!("tensor {name} is missing")))
    }

    fn expect_shape(&self, name: &str, ne0: u32, ne1: u32) -> Result<()> {
        let t = self.tensor(name)?;
        if t.ne != [u64::from(ne0), u64::from(ne1), 1, 1] {
            return Err(RpcError::malformed(
                CALL,
                format!(
                    "tensor {name} has shape {:?}, expected [{ne0}, {ne1}]",
                    t.ne
                ),
            ));
        }
        Ok(())
    }

    fn check_shapes(&self) -> Result<()> {
        let h = &self.hparams;
        self.expect_shape("token_embd.weight", h.n_embd, h.n_vocab)?;
        self.expect_shape("output_norm.weight", h.n_embd, 1)?;
        self.expect_shape(&self.output_name, h.n_embd, h.n_vocab)?;
        for l in 0..h.n_layer {
            let n = |w: &str| layer_tensor_name(l, w);
            self.expect_shape(&n("attn_norm"), h.n_embd, 1)?;
            self.expect_shape(&n("attn_q"), h.n_embd, h.head_dim * h.n_head)?;
            self.expect_shape(&n("attn_k"), h.n_embd, h.n_embd_kv())?;
            self.expect_shape(&n("attn_v"), h.n_embd, h.n_embd_kv())?;
            self.expect_shape(&n("attn_output"), h.head_dim * h.n_head, h.n_embd)?;
            self.expect_shape(&n("ffn_norm"), h.n_embd, 1)?;
            self.expect_shape(&n("ffn_gate"), h.n_embd, h.n_ff)?;
            self.expect_shape(&n("ffn_up"), h.n_embd, h.n_ff)?;
            self.expect_shape(&n("ffn_down"), h.n_ff, h.n_embd)?;
            for w in ["attn_norm", "ffn_norm"] {
                if self.tensor(&n(w))?.ty != GGML_TYPE_F32 {
                    return Err(RpcError::refused(CALL, "norm weights must be F32"));
                }
            }
        }
        if self.tensor("output_norm.weight")?.ty != GGML_TYPE_F32 {
            return Err(RpcError::refused(CALL, "norm weights must be F32"));
        }
        Ok(())
    }

    /// The token embedding table, kept as stored (rows are converted to
    /// f32 when looked up, so a quantized table stays small).
    pub fn read_token_embd(&mut self) -> Result<EmbeddingTable> {
        let info = self.tensor("token_embd.weight")?.clone();
        let data = self.file.read_tensor(&info)?;
        EmbeddingTable::new(info.ty, self.hparams.n_embd, self.hparams.n_vocab, data)
    }
}

/// The token embedding table on the coordinator.
#[derive(Debug, Clone)]
pub struct EmbeddingTable {
    ty: u32,
    n_embd: usize,
    n_vocab: usize,
    row_bytes: usize,
    to_float: sys::ggml_to_float_t,
    data: Vec<u8>,
}

impl EmbeddingTable {
    /// Wraps `n_vocab` rows of `n_embd` values of ggml type `ty`.
    pub fn new(ty: u32, n_embd: u32, n_vocab: u32, data: Vec<u8>) -> Result<EmbeddingTable> {
        let ne = [u64::from(n_embd), 1, 1, 1];
        let row_bytes = usize::try_from(tensor_nbytes(ty, &ne)?)
            .map_err(|_| RpcError::refused(CALL, "embedding row too large"))?;
        if (row_bytes as u64).checked_mul(u64::from(n_vocab)) != Some(data.len() as u64) {
            return Err(RpcError::malformed(
                CALL,
                "token_embd size does not match its shape",
            ));
        }
        let to_float = if ty == GGML_TYPE_F32 {
            None
        } else {
            // SAFETY: ggml_get_type_traits indexes a static table; `ty` is a
            // type the GGUF reader knows (checked by tensor_nbytes above).
            let traits = unsafe { sys::ggml_get_type_traits(ty) };
            // SAFETY: non-null pointers from ggml_get_type_traits point into
            // that static table.
            let f = (!traits.is_null())
                .then(|| unsafe { (*traits).to_float })
                .flatten();
            if f.is_none() {
                return Err(RpcError::refused(
                    CALL,
                    format!("token_embd type {ty} has no conversion to f32"),
                ));
            }
            f
        };
        Ok(EmbeddingTable {
            ty,
            n_embd: n_embd as usize,
            n_vocab: n_vocab as usize,
            row_bytes,
            to_float,
            data,
        })
    }

    /// The ggml type of the stored rows.
    pub fn ty(&self) -> u32 {
        self.ty
    }

    /// Appends the embedding of `token` as little-endian f32 to `out`.
    pub fn append_row(&self, token: i32, out: &mut Vec<u8>) -> Result<()> {
        let row = usize::try_from(token)
            .ok()
            .filter(|&r| r < self.n_vocab)
            .ok_or_else(|| {
                RpcError::refused(
                    "embedding lookup",
                    format!("token {token} outside the vocabulary"),
                )
            })?;
        let start = row * self.row_bytes;
        let raw = self
            .data
            .get(start..start + self.row_bytes)
            .ok_or_else(|| RpcError::malformed("embedding lookup", "table too short"))?;
        match self.to_float {
            None => out.extend_from_slice(raw),
            Some(f) => {
                let mut v = vec![0f32; self.n_embd];
                // SAFETY: `raw` holds exactly one row of n_embd values of
                // this type (row_bytes from ggml's own size rule) and `v`
                // has room for n_embd floats.
                unsafe { f(raw.as_ptr().cast(), v.as_mut_ptr(), self.n_embd as i64) };
                out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::synthetic::{GgufWriter, SyntheticSpec};

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("trpc-model-{}-{name}", std::process::id()))
    }

    #[test]
    fn synthetic_model_round_trips() -> Result<()> {
        let spec = SyntheticSpec {
            n_embd: 32,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 48,
            n_vocab: 20,
            seed: 3,
            ..SyntheticSpec::default()
        };
        let p = temp("ok");
        spec.write(&p)?;
        let mut m = LlamaModel::open(&p)?;
        let h = m.hparams;
        assert_eq!((h.n_embd, h.n_layer, h.n_head, h.n_head_kv), (32, 2, 4, 2));
        assert_eq!(
            (h.n_ff, h.n_vocab, h.head_dim, h.n_embd_kv()),
            (48, 20, 8, 16)
        );
        assert_eq!(m.output_name, "output.weight");
        let table = m.read_token_embd()?;
        let mut row = Vec::new();
        table.append_row(19, &mut row)?;
        assert_eq!(row.len(), 32 * 4);
        assert!(table.append_row(20, &mut row).is_err());
        assert!(table.append_row(-1, &mut row).is_err());
        // Same seed, same bytes; another seed, other weights.
        let again = temp("again");
        spec.write(&again)?;
        let other = temp("other");
        SyntheticSpec { seed: 4, ..spec }.write(&other)?;
        let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| RpcError::io("test", e));
        assert_eq!(read(&p)?, read(&again)?);
        assert_ne!(read(&p)?, read(&other)?);
        for f in [p, again, other] {
            let _ = std::fs::remove_file(f);
        }
        Ok(())
    }

    #[test]
    fn f16_embedding_rows_are_converted() -> Result<()> {
        // Two rows of two F16 values: [1, 0.5] and [-2, 0].
        let bits: [u16; 4] = [0x3C00, 0x3800, 0xC000, 0x0000];
        let data = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let t = EmbeddingTable::new(1, 2, 2, data)?;
        let mut out = Vec::new();
        t.append_row(1, &mut out)?;
        t.append_row(0, &mut out)?;
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, [-2.0, 0.0, 1.0, 0.5]);
        assert!(EmbeddingTable::new(1, 2, 3, vec![0; 8]).is_err());
        Ok(())
    }

    #[test]
    fn wrong_architecture_shapes_and_sizes_are_refused() -> Result<()> {
        assert!(
            SyntheticSpec {
                n_embd: 30,
                ..SyntheticSpec::default()
            }
            .check()
            .is_err()
        );
        let p = temp("bad");
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "gpt2");
        w.write(&p)?;
        assert!(LlamaModel::open(&p).is_err());
        // A llama header whose layer tensor is missing.
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "llama");
        w.add_u32("llama.embedding_length", 8);
        w.add_u32("llama.attention.head_count", 2);
        w.add_u32("llama.block_count", 1);
        w.add_u32("llama.feed_forward_length", 8);
        w.add_u32("llama.vocab_size", 4);
        w.add_u32("llama.context_length", 16);
        w.add_tensor_f32("token_embd.weight", &[8, 4], &[0.0; 32])?;
        w.add_tensor_f32("output_norm.weight", &[8], &[1.0; 8])?;
        w.write(&p)?;
        let e = LlamaModel::open(&p)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("blk.0.attn_norm.weight"), "{e}");
        let _ = std::fs::remove_file(&p);
        Ok(())
    }
}
