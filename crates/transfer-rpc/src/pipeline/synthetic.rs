//! Random-weight llama GGUFs (F32) for tests and benchmarks, and the small
//! GGUF v3 writer behind them.

use std::path::Path;

use crate::error::{Result, RpcError};

const ALIGN: usize = 32;

/// A minimal GGUF v3 writer: scalar/string metadata and F32 tensors.
#[derive(Debug, Default)]
pub struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
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

    /// Adds an F32 tensor of shape `dims` (ggml order, `dims[0]` = row length).
    pub fn add_tensor_f32(&mut self, name: &str, dims: &[u64], data: &[f32]) -> Result<()> {
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
        self.tensors
            .push((name.into(), dims.to_vec(), data.to_vec()));
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
        for (name, dims, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&0u32.to_le_bytes()); // F32
            out.extend_from_slice(&offset.to_le_bytes());
            offset += (data.len() as u64 * 4).next_multiple_of(ALIGN as u64);
        }
        out.resize(out.len().next_multiple_of(ALIGN), 0);
        for (_, _, data) in &self.tensors {
            for v in data {
                out.extend_from_slice(&v.to_le_bytes());
            }
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
        Ok(())
    }

    /// The GGUF of a random-weight llama model.
    pub fn build(&self) -> Result<GgufWriter> {
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
        g.add_str("tokenizer.ggml.model", "none");
        let mut rng = SplitMix(self.seed ^ 0x7472_616E_7366_6572);
        // Matrices scaled by 1/sqrt(fan_in) keep activations O(1); the
        // output matrix is wider so greedy choices are well separated.
        let inv = |n: u64| 1.0 / (n as f32).sqrt();
        g.add_tensor_f32("token_embd.weight", &[e, v], &rng.fill(e * v, 1.0, 0.0))?;
        g.add_tensor_f32("output_norm.weight", &[e], &rng.fill(e, 0.1, 1.0))?;
        g.add_tensor_f32(
            "output.weight",
            &[e, v],
            &rng.fill(e * v, 3.0 * inv(e), 0.0),
        )?;
        for l in 0..self.n_layer {
            let t = |n: &str| format!("blk.{l}.{n}.weight");
            g.add_tensor_f32(&t("attn_norm"), &[e], &rng.fill(e, 0.1, 1.0))?;
            g.add_tensor_f32(&t("attn_q"), &[e, e], &rng.fill(e * e, 2.0 * inv(e), 0.0))?;
            g.add_tensor_f32(&t("attn_k"), &[e, kv], &rng.fill(e * kv, 2.0 * inv(e), 0.0))?;
            g.add_tensor_f32(&t("attn_v"), &[e, kv], &rng.fill(e * kv, 1.5 * inv(e), 0.0))?;
            g.add_tensor_f32(
                &t("attn_output"),
                &[e, e],
                &rng.fill(e * e, 1.5 * inv(e), 0.0),
            )?;
            g.add_tensor_f32(&t("ffn_norm"), &[e], &rng.fill(e, 0.1, 1.0))?;
            g.add_tensor_f32(
                &t("ffn_gate"),
                &[e, ff],
                &rng.fill(e * ff, 1.5 * inv(e), 0.0),
            )?;
            g.add_tensor_f32(&t("ffn_up"), &[e, ff], &rng.fill(e * ff, 1.5 * inv(e), 0.0))?;
            g.add_tensor_f32(
                &t("ffn_down"),
                &[ff, e],
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
