//! Random-weight llama GGUFs (F32, F16, Q8_0 or Q4_0 weights) for tests
//! and benchmarks, and the small GGUF v3 writer behind them.

use std::fmt;
use std::path::Path;

use llama_cpp_sys_2 as sys;

use crate::error::{Result, RpcError};
use crate::validate::types::{GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_Q4_0, type_info};

const ALIGN: usize = 32;
/// `GGML_TYPE_Q8_0`.
const GGML_TYPE_Q8_0: u32 = 8;

/// One tensor of a [`GgufWriter`]: name, shape, ggml type, encoded data.
#[derive(Debug)]
struct WrittenTensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

/// A minimal GGUF v3 writer: scalar/string metadata and tensors of any
/// ggml type (F32 from values, others from bytes ggml encoded).
#[derive(Debug, Default)]
pub struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<WrittenTensor>,
}

/// The ggml type of a synthetic model's weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightType {
    /// 32-bit floats.
    #[default]
    F32,
    /// IEEE half floats (`ggml_fp32_to_fp16_row`).
    F16,
    /// Blocks of 32 8-bit values with an F16 scale (`ggml_quantize_chunk`).
    Q8_0,
    /// Blocks of 32 4-bit values with an F16 scale (`ggml_quantize_chunk`).
    Q4_0,
}

impl WeightType {
    /// Every supported weight type.
    pub const ALL: [WeightType; 4] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::Q8_0,
        WeightType::Q4_0,
    ];

    /// The `ggml_type` value.
    pub fn ggml_type(self) -> u32 {
        match self {
            WeightType::F32 => GGML_TYPE_F32,
            WeightType::F16 => GGML_TYPE_F16,
            WeightType::Q8_0 => GGML_TYPE_Q8_0,
            WeightType::Q4_0 => GGML_TYPE_Q4_0,
        }
    }

    /// The name ggml prints (`f32`, `f16`, `q8_0`, `q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
        }
    }

    /// Elements per block: a row length must be a multiple of it.
    pub fn block_size(self) -> u64 {
        type_info(self.ggml_type()).map_or(1, |i| i.block_size)
    }

    /// Parses a name as [`WeightType::name`] prints it (case-insensitive).
    pub fn parse(s: &str) -> Result<WeightType> {
        WeightType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                RpcError::refused(
                    "weight type",
                    format!("{s:?} (expected one of f32, f16, q8_0, q4_0)"),
                )
            })
    }

    /// `data`, rows of `n_per_row` values, encoded as this type by ggml
    /// itself, so the bytes are exactly what llama.cpp's tools write.
    pub fn encode(self, data: &[f32], n_per_row: u64) -> Result<Vec<u8>> {
        const CALL: &str = "WeightType::encode";
        let block = self.block_size();
        if n_per_row == 0 || n_per_row % block != 0 || data.len() as u64 % n_per_row != 0 {
            return Err(RpcError::refused(
                CALL,
                format!(
                    "{} values in rows of {n_per_row}: rows must be whole and a multiple of {block} ({})",
                    data.len(),
                    self.name()
                ),
            ));
        }
        let n =
            i64::try_from(data.len()).map_err(|_| RpcError::refused(CALL, "tensor too large"))?;
        let per_row =
            i64::try_from(n_per_row).map_err(|_| RpcError::refused(CALL, "row too long"))?;
        match self {
            WeightType::F32 => Ok(data.iter().flat_map(|v| v.to_le_bytes()).collect()),
            WeightType::F16 => {
                let mut half = vec![0u16; data.len()];
                // SAFETY: both buffers hold exactly `n` elements;
                // ggml_fp16_t is a u16 and the function only reads `n` f32s
                // and writes `n` halves.
                unsafe { sys::ggml_fp32_to_fp16_row(data.as_ptr(), half.as_mut_ptr(), n) };
                Ok(half.iter().flat_map(|v| v.to_le_bytes()).collect())
            }
            WeightType::Q8_0 | WeightType::Q4_0 => {
                let ty = self.ggml_type() as sys::ggml_type;
                let nrows = n / per_row;
                // SAFETY: a pure size computation for a valid type.
                let row_bytes = unsafe { sys::ggml_row_size(ty, per_row) };
                let len = usize::try_from(nrows)
                    .ok()
                    .and_then(|r| r.checked_mul(row_bytes))
                    .ok_or_else(|| RpcError::refused(CALL, "tensor too large"))?;
                let mut out = vec![0u8; len];
                // SAFETY: `data` holds `nrows * per_row` f32s, `out` the
                // `nrows` encoded rows ggml_row_size says they take;
                // `per_row` is a multiple of the block size (checked above,
                // ggml asserts it) and these types need no imatrix (null).
                let written = unsafe {
                    sys::ggml_quantize_chunk(
                        ty,
                        data.as_ptr(),
                        out.as_mut_ptr().cast(),
                        0,
                        nrows,
                        per_row,
                        std::ptr::null(),
                    )
                };
                if written != out.len() {
                    return Err(RpcError::refused(
                        CALL,
                        format!("ggml_quantize_chunk wrote {written} of {} bytes", out.len()),
                    ));
                }
                Ok(out)
            }
        }
    }
}

impl fmt::Display for WeightType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        GgufWriter::default()
    }

    /// Adds a u32 metadata value.
    pub fn add_u32(&mut self, key: &str, v: u32) {
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&4u32.to_le_bytes());
        self.kv.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
    }

    /// Adds an f32 metadata value.
    pub fn add_f32(&mut self, key: &str, v: f32) {
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&6u32.to_le_bytes());
        self.kv.extend_from_slice(&v.to_le_bytes());
        self.n_kv += 1;
    }

    /// Adds a string metadata value.
    pub fn add_str(&mut self, key: &str, v: &str) {
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        put_str(&mut self.kv, v);
        self.n_kv += 1;
    }

    /// Adds an array of strings.
    pub fn add_str_array(&mut self, key: &str, v: &[String]) {
        self.array_header(key, 8, v.len());
        for x in v {
            put_str(&mut self.kv, x);
        }
    }

    /// Adds an array of f32.
    pub fn add_f32_array(&mut self, key: &str, v: &[f32]) {
        self.array_header(key, 6, v.len());
        for x in v {
            self.kv.extend_from_slice(&x.to_le_bytes());
        }
    }

    /// Adds an array of i32.
    pub fn add_i32_array(&mut self, key: &str, v: &[i32]) {
        self.array_header(key, 5, v.len());
        for x in v {
            self.kv.extend_from_slice(&x.to_le_bytes());
        }
    }

    fn array_header(&mut self, key: &str, elem_type: u32, len: usize) {
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&9u32.to_le_bytes());
        self.kv.extend_from_slice(&elem_type.to_le_bytes());
        self.kv.extend_from_slice(&(len as u64).to_le_bytes());
        self.n_kv += 1;
    }

    /// Adds an F32 tensor of shape `dims` (ggml order, `dims[0]` = row length).
    pub fn add_tensor_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> Result<()> {
        self.add_tensor_as(name, dims, WeightType::F32, data)
    }

    /// Adds a tensor of shape `dims` holding `data` encoded as `ty` by ggml
    /// (`dims[0]` must be a multiple of the type's block size).
    pub fn add_tensor_as(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: WeightType,
        data: &[f32],
    ) -> Result<()> {
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| RpcError::refused("GgufWriter", "shape overflows"))?;
        if dims.is_empty() || dims.len() > 4 || n != data.len() as u64 {
            return Err(RpcError::refused(
                "GgufWriter",
                format!(
                    "tensor {name}: shape {dims:?} does not hold {} values",
                    data.len()
                ),
            ));
        }
        let bytes = ty
            .encode(data, dims[0])
            .map_err(|e| RpcError::refused("GgufWriter", format!("tensor {name}: {e}")))?;
        self.tensors.push(WrittenTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty: ty.ggml_type(),
            data: bytes,
        });
        Ok(())
    }

    /// The encoded file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += (t.data.len() as u64).next_multiple_of(ALIGN as u64);
        }
        out.resize(out.len().next_multiple_of(ALIGN), 0);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            out.resize(out.len().next_multiple_of(ALIGN), 0);
        }
        out
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|e| RpcError::io("GgufWriter::write", e))
    }
}

/// Shape and seed of a synthetic llama model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticSpec {
    /// Embedding width.
    pub n_embd: u32,
    /// Number of layers.
    pub n_layer: u32,
    /// Attention heads.
    pub n_head: u32,
    /// Key/value heads (grouped-query attention when below `n_head`).
    pub n_head_kv: u32,
    /// Feed-forward width.
    pub n_ff: u32,
    /// Vocabulary size.
    pub n_vocab: u32,
    /// Seed of the weights.
    pub seed: u64,
    /// Type of every matrix: the layers' and also `token_embd` and
    /// `output`, as `llama-quantize --pure` writes them; norm weights stay
    /// F32 (ggml's norm ops and llama.cpp want them so).
    pub weight_type: WeightType,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            n_embd: 256,
            n_layer: 4,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 512,
            n_vocab: 128,
            seed: 1,
            weight_type: WeightType::F32,
        }
    }
}

/// splitmix64: a tiny, well-distributed generator; weights only need to be
/// reproducible from the seed, not cryptographic.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn fill(&mut self, n: u64, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + scale * self.unit()).collect()
    }
}

impl SyntheticSpec {
    /// Checks the shape is one llama.cpp accepts.
    pub fn check(&self) -> Result<()> {
        let ok = self.n_embd > 0
            && self.n_layer > 0
            && self.n_head > 0
            && self.n_head_kv > 0
            && self.n_ff > 0
            && self.n_vocab > 0
            && self.n_embd % self.n_head == 0
            && self.n_head % self.n_head_kv == 0
            && (self.n_embd / self.n_head) % 2 == 0;
        if !ok {
            return Err(RpcError::refused(
                "synthetic model",
                format!(
                    "{self:?}: sizes must be positive, n_embd divisible by n_head into an even head size, n_head by n_head_kv"
                ),
            ));
        }
        // Every matrix row is n_embd long except ffn_down's (n_ff); ggml
        // quantizes whole blocks only.
        let block = self.weight_type.block_size();
        if u64::from(self.n_embd) % block != 0 || u64::from(self.n_ff) % block != 0 {
            return Err(RpcError::refused(
                "synthetic model",
                format!(
                    "{} weights: n_embd ({}) and n_ff ({}) must be multiples of the block size {block}",
                    self.weight_type, self.n_embd, self.n_ff
                ),
            ));
        }
        Ok(())
    }

    /// The GGUF of a random-weight llama model without a tokenizer (token
    /// ids in, logits out).
    pub fn build(&self) -> Result<GgufWriter> {
        self.build_with(false)
    }

    /// The same model with a vocabulary llama.cpp can tokenize any text
    /// with (see [`byte_vocab`]), so that its programs (llama-completion,
    /// llama-server) run it from a text prompt. `n_vocab` must be at least
    /// [`BYTE_VOCAB_MIN`].
    pub fn build_tokenizable(&self) -> Result<GgufWriter> {
        self.build_with(true)
    }

    fn build_with(&self, vocab: bool) -> Result<GgufWriter> {
        self.check()?;
        let (e, ff, v) = (
            u64::from(self.n_embd),
            u64::from(self.n_ff),
            u64::from(self.n_vocab),
        );
        let kv = e / u64::from(self.n_head) * u64::from(self.n_head_kv);
        let mut g = GgufWriter::new();
        g.add_str("general.architecture", "llama");
        g.add_str("general.name", "transfer-rpc-synthetic");
        g.add_u32("llama.context_length", 4096);
        g.add_u32("llama.embedding_length", self.n_embd);
        g.add_u32("llama.block_count", self.n_layer);
        g.add_u32("llama.feed_forward_length", self.n_ff);
        g.add_u32("llama.attention.head_count", self.n_head);
        g.add_u32("llama.attention.head_count_kv", self.n_head_kv);
        g.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
        g.add_f32("llama.rope.freq_base", 10000.0);
        g.add_u32("llama.vocab_size", self.n_vocab);
        if vocab {
            let v = byte_vocab(self.n_vocab)?;
            g.add_str("tokenizer.ggml.model", "llama");
            g.add_str_array("tokenizer.ggml.tokens", &v.tokens);
            g.add_f32_array("tokenizer.ggml.scores", &v.scores);
            g.add_i32_array("tokenizer.ggml.token_type", &v.types);
            g.add_u32("tokenizer.ggml.unknown_token_id", 0);
            g.add_u32("tokenizer.ggml.bos_token_id", 1);
            g.add_u32("tokenizer.ggml.eos_token_id", 2);
        } else {
            g.add_str("tokenizer.ggml.model", "none");
        }
        let mut rng = SplitMix(self.seed ^ 0x7472_616E_7366_6572);
        // Matrices scaled by 1/sqrt(fan_in) keep activations O(1); the
        // output matrix is wider so greedy choices are well separated.
        let wt = self.weight_type;
        let inv = |n: u64| 1.0 / (n as f32).sqrt();
        g.add_tensor_as("token_embd.weight", &[e, v], wt, &rng.fill(e * v, 1.0, 0.0))?;
        g.add_tensor_f32("output_norm.weight", &[e], &rng.fill(e, 0.1, 1.0))?;
        g.add_tensor_as(
            "output.weight",
            &[e, v],
            wt,
            &rng.fill(e * v, 3.0 * inv(e), 0.0),
        )?;
        for l in 0..self.n_layer {
            let t = |n: &str| format!("blk.{l}.{n}.weight");
            g.add_tensor_f32(&t("attn_norm"), &[e], &rng.fill(e, 0.1, 1.0))?;
            g.add_tensor_as(
                &t("attn_q"),
                &[e, e],
                wt,
                &rng.fill(e * e, 2.0 * inv(e), 0.0),
            )?;
            g.add_tensor_as(
                &t("attn_k"),
                &[e, kv],
                wt,
                &rng.fill(e * kv, 2.0 * inv(e), 0.0),
            )?;
            g.add_tensor_as(
                &t("attn_v"),
                &[e, kv],
                wt,
                &rng.fill(e * kv, 1.5 * inv(e), 0.0),
            )?;
            g.add_tensor_as(
                &t("attn_output"),
                &[e, e],
                wt,
                &rng.fill(e * e, 1.5 * inv(e), 0.0),
            )?;
            g.add_tensor_f32(&t("ffn_norm"), &[e], &rng.fill(e, 0.1, 1.0))?;
            g.add_tensor_as(
                &t("ffn_gate"),
                &[e, ff],
                wt,
                &rng.fill(e * ff, 1.5 * inv(e), 0.0),
            )?;
            g.add_tensor_as(
                &t("ffn_up"),
                &[e, ff],
                wt,
                &rng.fill(e * ff, 1.5 * inv(e), 0.0),
            )?;
            g.add_tensor_as(
                &t("ffn_down"),
                &[ff, e],
                wt,
                &rng.fill(ff * e, 1.5 * inv(ff), 0.0),
            )?;
        }
        Ok(g)
    }

    /// Writes the model to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        self.build()?.write(path)
    }
}

/// The smallest vocabulary [`byte_vocab`] makes: `<unk>`, `<s>`, `</s>` and
/// the 256 byte tokens.
pub const BYTE_VOCAB_MIN: u32 = 3 + 256;

/// A SentencePiece-style ("llama") vocabulary llama.cpp tokenizes any text
/// with: `<unk>` `<s>` `</s>`, the byte tokens `<0x00>`..`<0xFF>` (byte
/// fallback), then `▁` and printable ASCII characters and pairs as normal
/// pieces up to `n_vocab`.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteVocab {
    /// The pieces.
    pub tokens: Vec<String>,
    /// Their scores (higher merges first).
    pub scores: Vec<f32>,
    /// llama.cpp token types (1 normal, 2 unknown, 3 control, 6 byte).
    pub types: Vec<i32>,
}

/// See [`ByteVocab`].
pub fn byte_vocab(n_vocab: u32) -> Result<ByteVocab> {
    if n_vocab < BYTE_VOCAB_MIN {
        return Err(RpcError::refused(
            "byte_vocab",
            format!(
                "n_vocab {n_vocab} is below the {BYTE_VOCAB_MIN} tokens a byte-fallback vocabulary needs"
            ),
        ));
    }
    let mut v = ByteVocab {
        tokens: vec!["<unk>".into(), "<s>".into(), "</s>".into()],
        scores: vec![0.0; 3],
        types: vec![2, 3, 3],
    };
    for b in 0..=255u8 {
        v.tokens.push(format!("<0x{b:02X}>"));
        v.scores.push(0.0);
        v.types.push(6);
    }
    let printable: Vec<char> = std::iter::once('\u{2581}')
        .chain((0x21u8..0x7F).map(char::from))
        .collect();
    let pairs = printable
        .iter()
        .flat_map(|&a| printable.iter().map(move |&b| format!("{a}{b}")));
    let pieces = printable.iter().map(|c| c.to_string()).chain(pairs);
    for p in pieces.take((n_vocab - BYTE_VOCAB_MIN) as usize) {
        // Longer pieces score higher, so the tokenizer prefers them.
        v.scores.push(-1000.0 + p.chars().count() as f32);
        v.tokens.push(p);
        v.types.push(1);
    }
    if v.tokens.len() != n_vocab as usize {
        return Err(RpcError::refused(
            "byte_vocab",
            format!("n_vocab {n_vocab} is more pieces than the vocabulary has"),
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::model::LlamaModel;

    /// ggml's own decoder for `ty` (its type traits' `to_float`).
    fn decode(ty: WeightType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
        if ty == WeightType::F32 {
            return Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect());
        }
        // SAFETY: ggml_get_type_traits indexes a static table by a valid type.
        let traits = unsafe { sys::ggml_get_type_traits(ty.ggml_type() as sys::ggml_type) };
        // SAFETY: a non-null pointer from ggml_get_type_traits points into
        // its static table.
        let to_float = (!traits.is_null())
            .then(|| unsafe { (*traits).to_float })
            .flatten()
            .ok_or_else(|| RpcError::refused("test", "no to_float"))?;
        let mut out = vec![0f32; n];
        // SAFETY: `bytes` holds the encoding of `n` values (n a multiple of
        // the block size) and `out` has room for `n` floats.
        unsafe { to_float(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
        Ok(out)
    }

    #[test]
    fn byte_vocab_covers_every_byte() -> Result<()> {
        assert!(byte_vocab(BYTE_VOCAB_MIN - 1).is_err());
        let v = byte_vocab(384)?;
        assert_eq!(v.tokens.len(), 384);
        assert_eq!(v.scores.len(), 384);
        assert_eq!(v.types.len(), 384);
        assert_eq!(v.types.iter().filter(|&&t| t == 6).count(), 256);
        assert_eq!(v.tokens[3 + 0x41], "<0x41>");
        assert_eq!(v.tokens[BYTE_VOCAB_MIN as usize], "\u{2581}");
        // Pieces are unique (llama.cpp maps text to ids).
        let mut t = v.tokens.clone();
        t.sort();
        t.dedup();
        assert_eq!(t.len(), 384);
        // The model reads back with its vocabulary size.
        let dir = std::env::temp_dir().join(format!("byte-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| RpcError::io("test", e))?;
        let path = dir.join("m.gguf");
        SyntheticSpec {
            n_vocab: 384,
            ..SyntheticSpec::default()
        }
        .build_tokenizable()?
        .write(&path)?;
        assert_eq!(LlamaModel::open(&path)?.hparams.n_vocab, 384);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn q8_0_blocks_have_ggml_layout() -> Result<()> {
        // One block: -1, -15/16, ..., 15/16. amax 1 -> scale 1/127 (F16
        // 0x2008), q = round(x * 127).
        let x: Vec<f32> = (0..32).map(|i| (i - 16) as f32 / 16.0).collect();
        let b = WeightType::Q8_0.encode(&x, 32)?;
        assert_eq!(b.len(), 34);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x2008);
        for (i, v) in x.iter().enumerate() {
            assert_eq!(b[2 + i] as i8, (v * 127.0).round() as i8, "value {i}");
        }
        Ok(())
    }

    #[test]
    fn every_type_round_trips_through_ggml_within_its_precision() -> Result<()> {
        let mut rng = SplitMix(9);
        let x = rng.fill(4 * 64, 1.0, 0.0);
        for (ty, bytes, tol) in [
            (WeightType::F32, 4 * 256, 0.0),
            (WeightType::F16, 2 * 256, 1e-3),
            (WeightType::Q8_0, 8 * 34, 1.0 / 127.0),
            (WeightType::Q4_0, 8 * 18, 1.0 / 7.0),
        ] {
            let enc = ty.encode(&x, 64)?;
            assert_eq!(enc.len(), bytes, "{ty}");
            let back = decode(ty, &enc, x.len())?;
            let err = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err <= tol, "{ty}: max error {err} > {tol}");
            assert_eq!(WeightType::parse(ty.name())?, ty);
        }
        assert!(WeightType::parse("q4_K").is_err());
        Ok(())
    }

    #[test]
    fn rows_off_the_block_size_are_refused() {
        let x = vec![0.5f32; 48];
        assert!(WeightType::Q8_0.encode(&x, 48).is_err());
        assert!(WeightType::Q4_0.encode(&x, 24).is_err());
        assert!(WeightType::F16.encode(&x, 48).is_ok());
        assert!(WeightType::F32.encode(&x, 5).is_err());
        let spec = SyntheticSpec {
            n_embd: 48,
            n_head: 4,
            n_ff: 64,
            weight_type: WeightType::Q8_0,
            ..SyntheticSpec::default()
        };
        let e = spec
            .check()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("multiples of the block size 32"), "{e}");
        assert!(
            SyntheticSpec {
                weight_type: WeightType::F16,
                ..spec
            }
            .check()
            .is_ok()
        );
        assert!(
            SyntheticSpec {
                n_embd: 64,
                n_ff: 80,
                ..spec
            }
            .check()
            .is_err()
        );
    }

    #[test]
    fn quantized_models_carry_their_types_and_sizes() -> Result<()> {
        for ty in [WeightType::F16, WeightType::Q8_0, WeightType::Q4_0] {
            let spec = SyntheticSpec {
                n_embd: 64,
                n_layer: 1,
                n_ff: 96,
                n_vocab: 16,
                weight_type: ty,
                ..SyntheticSpec::default()
            };
            let p = std::env::temp_dir().join(format!(
                "trpc-synthetic-{}-{}.gguf",
                std::process::id(),
                ty.name()
            ));
            spec.write(&p)?;
            let m = LlamaModel::open(&p)?;
            let _ = std::fs::remove_file(&p);
            let row = |n: u64| {
                let i = type_info(ty.ggml_type()).map_or((1, 0), |i| (i.block_size, i.type_size));
                n / i.0 * i.1
            };
            for (name, ne0, ne1) in [
                ("token_embd.weight", 64, 16),
                ("output.weight", 64, 16),
                ("blk.0.attn_q.weight", 64, 64),
                ("blk.0.attn_k.weight", 64, 32),
                ("blk.0.ffn_up.weight", 64, 96),
                ("blk.0.ffn_down.weight", 96, 64),
            ] {
                let t = m.tensor(name)?;
                assert_eq!(
                    (t.ty, t.ne[0], t.ne[1]),
                    (ty.ggml_type(), ne0, ne1),
                    "{name}"
                );
                assert_eq!(t.nbytes, row(ne0) * ne1, "{ty} {name}");
            }
            for name in ["output_norm.weight", "blk.0.attn_norm.weight"] {
                assert_eq!(m.tensor(name)?.ty, GGML_TYPE_F32, "{name}");
            }
        }
        Ok(())
    }
}
