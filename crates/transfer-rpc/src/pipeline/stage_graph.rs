//! One stage's graph: built with ggml's own op builders (llama-cpp-sys-2)
//! in a no-alloc ggml context, mirroring llama.cpp's llama graph
//! (`src/models/llama.cpp`, `build_attn` / `build_attn_mha` with flash
//! attention and an F16 KV cache, `build_ffn` with SwiGLU), then placed in
//! the stage's remote buffers and serialised to a [`GraphPayload`].
//!
//! The graph has one shape for every step: `n_tokens` = B tokens (one per
//! stream), a KV cache of B × ctx cells per layer split into one stream of
//! ctx cells per decode stream (llama.cpp's non-unified layout: attention
//! runs per stream, so streams cannot see each other), and a mask of B × ctx
//! entries that hides the cells not written yet. So the server keeps the
//! graph and every later step is a GRAPH_RECOMPUTE with new inputs. (A
//! unified cache would need a B × B·ctx mask: 4 MB per stage and step at
//! B = 32, ctx = 2048, against 128 KB here; measured at 4 stages, B = 4,
//! ctx = 40: SET_TENSOR requests went from 11.0 KB to 7.1 KB per step.)

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::ops::Range;

use llama_cpp_sys_2 as sys;

use super::model::{LAYER_TENSORS, LlamaHparams, layer_tensor_name};
use super::remote_alloc::{LinearAllocator, RemoteBuffer};
use crate::error::{Result, RpcError};
use crate::protocol::tensor::{MAX_NAME, MAX_SRC};
use crate::protocol::{GraphPayload, RpcTensor};

const CALL: &str = "stage graph";
/// `LLAMA_ROPE_TYPE_NORM`: llama rotates adjacent pairs.
const ROPE_MODE_NORM: i32 = 0;
/// llama.cpp's YaRN defaults when the model does not use YaRN (ext_factor 0
/// turns the ramp off, so beta values do not change the result).
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;

fn fail<T>(reason: impl Into<String>) -> Result<T> {
    Err(RpcError::Refused {
        call: CALL,
        reason: reason.into(),
    })
}

/// What a stage computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageShape {
    /// Layers of this stage.
    pub layers: Range<u32>,
    /// The stage holding the last layer also applies the final norm and the
    /// output matrix, and outputs logits.
    pub is_last: bool,
    /// Tokens per step (B streams, one token each).
    pub n_tokens: u32,
    /// KV cells per layer (B × context; stream b owns cells
    /// `b*ctx .. (b+1)*ctx`).
    pub kv_size: u32,
}

/// Which remote buffer a tensor lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// Weights, written once.
    Weights = 0,
    /// KV cache and step inputs.
    State = 1,
    /// Graph intermediates and the stage output.
    Compute = 2,
}

/// Bytes each of the three buffers needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSizes(pub [u64; 3]);

/// The serialised stage: the graph and the tensors the coordinator writes
/// and reads, all with remote buffer handles and addresses.
#[derive(Debug, Clone)]
pub struct StageGraph {
    /// GRAPH_COMPUTE payload (device 0).
    pub payload: GraphPayload,
    /// Hidden state in: F32 `[n_embd, n_tokens]` (embeddings on stage 0,
    /// the previous stage's output otherwise).
    pub hidden_in: RpcTensor,
    /// Positions: I32 `[n_tokens]`.
    pub pos: RpcTensor,
    /// KV cell of each token: I64 `[n_tokens]`.
    pub kv_idx: RpcTensor,
    /// Attention mask: F16 `[ctx, 1, 1, n_tokens]`, one row per stream
    /// over its own `ctx` cells.
    pub mask: RpcTensor,
    /// Output: hidden state F32 `[n_embd, n_tokens]`, or logits F32
    /// `[n_vocab, n_tokens]` on the last stage.
    pub output: RpcTensor,
    /// Weights to upload: GGUF name and destination.
    pub weights: Vec<(String, RpcTensor)>,
}

/// A byte range of the state buffer holding several step inputs back to
/// back, written with one SET_TENSOR (as a 1-D I8 tensor). Measured on 4
/// stages, B = 4 (debug build, loopback): 13 SET_TENSOR and 13.5 KB of
/// requests per step with one command per input, 4 and 11.0 KB with blocks.
#[derive(Debug, Clone)]
pub struct InputBlock {
    /// The range as a tensor record.
    pub tensor: RpcTensor,
    /// Remote address of its first byte.
    pub start: u64,
    /// Its length in bytes.
    pub len: u64,
}

const GGML_TYPE_I8: u32 = 24;

impl StageGraph {
    /// The block from the hidden state in (stage 0, which also receives the
    /// embeddings) or from the positions (later stages) to the end of the
    /// mask.
    pub fn input_block(&self, with_hidden: bool) -> Result<InputBlock> {
        let first = if with_hidden {
            &self.hidden_in
        } else {
            &self.pos
        };
        let parts = [&self.hidden_in, &self.pos, &self.kv_idx, &self.mask];
        let mut prev_end = first.data;
        for t in parts.iter().skip(usize::from(!with_hidden)) {
            let n = crate::validate::check_shape(CALL, t)?.1;
            if t.buffer != first.buffer || t.data < prev_end {
                return fail("step inputs are not laid out back to back");
            }
            prev_end = t
                .data
                .checked_add(n)
                .ok_or_else(|| RpcError::refused(CALL, "overflow"))?;
        }
        let len = prev_end - first.data;
        let len32 =
            u32::try_from(len).map_err(|_| RpcError::refused(CALL, "step inputs exceed 4 GiB"))?;
        let mut tensor = RpcTensor {
            id: 1,
            ty: GGML_TYPE_I8,
            buffer: first.buffer,
            ne: [len32, 1, 1, 1],
            nb: [1, len32, len32, len32],
            data: first.data,
            ..RpcTensor::default()
        };
        tensor.set_name("step_inputs");
        Ok(InputBlock {
            tensor,
            start: first.data,
            len,
        })
    }
}

/// Owns a ggml context.
struct Ctx(*mut sys::ggml_context);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_init (non-null) and is freed once.
        unsafe { sys::ggml_free(self.0) }
    }
}

type T = *mut sys::ggml_tensor;

/// A stage graph built in a no-alloc context, not yet placed.
pub struct BuiltStage {
    /// Owns every tensor the pointers below refer to.
    _ctx: Ctx,
    nodes: Vec<T>,
    leaves: HashMap<usize, (BufferKind, Option<String>)>,
    hidden_in: T,
    pos: T,
    kv_idx: T,
    mask: T,
    output: T,
    weights: Vec<(String, T)>,
}

impl std::fmt::Debug for BuiltStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BuiltStage({} nodes)", self.nodes.len())
    }
}

struct Builder {
    ctx: *mut sys::ggml_context,
    gf: *mut sys::ggml_cgraph,
    leaves: HashMap<usize, (BufferKind, Option<String>)>,
    weights: Vec<(String, T)>,
}

fn checked(t: T, what: &str) -> Result<T> {
    if t.is_null() {
        return fail(format!("ggml returned no tensor for {what}"));
    }
    Ok(t)
}

impl Builder {
    fn name(&self, t: T, name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: t is a live tensor of self.ctx; ggml copies at most 63 bytes.
            unsafe { sys::ggml_set_name(t, c.as_ptr()) };
        }
    }

    fn leaf(
        &mut self,
        kind: BufferKind,
        ty: sys::ggml_type,
        ne: [i64; 4],
        name: &str,
    ) -> Result<T> {
        // SAFETY: ctx is live; the shape comes from validated hyperparameters.
        let t = unsafe { sys::ggml_new_tensor_4d(self.ctx, ty, ne[0], ne[1], ne[2], ne[3]) };
        let t = checked(t, name)?;
        self.name(t, name);
        let gguf = (kind == BufferKind::Weights).then(|| name.to_owned());
        self.leaves.insert(t as usize, (kind, gguf));
        Ok(t)
    }

    fn weight(&mut self, name: &str, ne0: u32, ne1: u32) -> Result<T> {
        let t = self.leaf(
            BufferKind::Weights,
            sys::GGML_TYPE_F32,
            [i64::from(ne0), i64::from(ne1), 1, 1],
            name,
        )?;
        self.weights.push((name.to_owned(), t));
        Ok(t)
    }

    fn expand(&self, t: T) {
        // SAFETY: gf and t belong to the live context.
        unsafe { sys::ggml_build_forward_expand(self.gf, t) };
    }
}

/// Builds the graph of one stage.
///
/// `weight_types` gives the ggml type of each GGUF tensor (weights are
/// uploaded as stored); `output_name` is the output matrix (`output.weight`
/// or the tied `token_embd.weight`).
pub fn build_stage(
    hp: &LlamaHparams,
    shape: &StageShape,
    weight_types: &HashMap<String, u32>,
    output_name: &str,
) -> Result<BuiltStage> {
    let n_layers = shape.layers.len();
    if n_layers == 0
        || shape.n_tokens == 0
        || shape.kv_size < shape.n_tokens
        || shape.kv_size % shape.n_tokens != 0
    {
        return fail(format!("bad stage shape {shape:?}"));
    }
    let graph_size = 64 * n_layers + 64;
    let n_tensors = 96 * n_layers + 96;
    // SAFETY: pure size computations.
    let mem_size = unsafe {
        sys::ggml_tensor_overhead() * n_tensors + sys::ggml_graph_overhead_custom(graph_size, false)
    } + (1 << 16);
    let params = sys::ggml_init_params {
        mem_size,
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    // SAFETY: ggml_init with no_alloc allocates only its own arena; null checked.
    let raw = unsafe { sys::ggml_init(params) };
    if raw.is_null() {
        return fail("ggml_init failed");
    }
    let ctx = Ctx(raw);
    // SAFETY: ctx is live and sized for a graph of graph_size nodes.
    let gf = unsafe { sys::ggml_new_graph_custom(raw, graph_size, false) };
    if gf.is_null() {
        return fail("ggml_new_graph_custom failed");
    }
    let mut b = Builder {
        ctx: raw,
        gf,
        leaves: HashMap::new(),
        weights: Vec::new(),
    };
    let wtype = |name: &str| -> Result<sys::ggml_type> {
        weight_types
            .get(name)
            .copied()
            .ok_or_else(|| RpcError::refused(CALL, format!("no type for tensor {name}")))
    };

    let t = i64::from(shape.n_tokens);
    let e = i64::from(hp.n_embd);
    let hd = i64::from(hp.head_dim);
    let n_head = i64::from(hp.n_head);
    let n_head_kv = i64::from(hp.n_head_kv);
    let n_embd_kv = i64::from(hp.n_embd_kv());
    let kv = i64::from(shape.kv_size);
    // One token per stream per step.
    let ns = t;
    let cells = kv / ns;
    let f16_row = |n: i64| -> usize {
        // SAFETY: pure size computation for a known type.
        unsafe { sys::ggml_row_size(sys::GGML_TYPE_F16, n) }
    };
    let kq_scale = 1.0 / (hp.head_dim as f32).sqrt();
    let n_ctx_orig = i32::try_from(hp.n_ctx_train).unwrap_or(i32::MAX);

    let hidden_in = b.leaf(
        BufferKind::State,
        sys::GGML_TYPE_F32,
        [e, t, 1, 1],
        "inp_hidden",
    )?;
    let pos = b.leaf(
        BufferKind::State,
        sys::GGML_TYPE_I32,
        [t, 1, 1, 1],
        "inp_pos",
    )?;
    let kv_idx = b.leaf(
        BufferKind::State,
        sys::GGML_TYPE_I64,
        [t, 1, 1, 1],
        "inp_kv_idxs",
    )?;
    let mask = b.leaf(
        BufferKind::State,
        sys::GGML_TYPE_F16,
        [cells, t / ns, 1, ns],
        "inp_kq_mask",
    )?;

    let mut inp_l = hidden_in;
    // SAFETY: every builder gets live tensors of `raw` whose shapes follow
    // from the checked hyperparameters, exactly as llama.cpp builds them;
    // every result is null-checked.
    unsafe {
        for il in shape.layers.clone() {
            let mut w = HashMap::new();
            for name in LAYER_TENSORS {
                let full = layer_tensor_name(il, name);
                let ty = wtype(&full)?;
                let (ne0, ne1) = match name {
                    "attn_norm" | "ffn_norm" => (hp.n_embd, 1),
                    "attn_q" => (hp.n_embd, hp.head_dim * hp.n_head),
                    "attn_k" | "attn_v" => (hp.n_embd, hp.n_embd_kv()),
                    "attn_output" => (hp.head_dim * hp.n_head, hp.n_embd),
                    "ffn_down" => (hp.n_ff, hp.n_embd),
                    _ => (hp.n_embd, hp.n_ff),
                };
                let wt = b.leaf(
                    BufferKind::Weights,
                    ty,
                    [i64::from(ne0), i64::from(ne1), 1, 1],
                    &full,
                )?;
                b.weights.push((full, wt));
                w.insert(name, wt);
            }
            let wg = |n: &str| {
                w.get(n)
                    .copied()
                    .ok_or_else(|| RpcError::refused(CALL, "weight"))
            };
            let k_cache = b.leaf(
                BufferKind::State,
                sys::GGML_TYPE_F16,
                [n_embd_kv, kv, 1, 1],
                &format!("cache_k_l{il}"),
            )?;
            let v_cache = b.leaf(
                BufferKind::State,
                sys::GGML_TYPE_F16,
                [n_embd_kv, kv, 1, 1],
                &format!("cache_v_l{il}"),
            )?;
            let inp_sa = inp_l;
            let mut cur = checked(sys::ggml_rms_norm(raw, inp_l, hp.rms_eps), "attn rms_norm")?;
            cur = checked(sys::ggml_mul(raw, cur, wg("attn_norm")?), "attn_norm")?;
            let q = checked(sys::ggml_mul_mat(raw, wg("attn_q")?, cur), "Qcur")?;
            let k = checked(sys::ggml_mul_mat(raw, wg("attn_k")?, cur), "Kcur")?;
            let v = checked(sys::ggml_mul_mat(raw, wg("attn_v")?, cur), "Vcur")?;
            let q = checked(sys::ggml_reshape_3d(raw, q, hd, n_head, t), "Qcur 3d")?;
            let k = checked(sys::ggml_reshape_3d(raw, k, hd, n_head_kv, t), "Kcur 3d")?;
            let v = checked(sys::ggml_reshape_3d(raw, v, hd, n_head_kv, t), "Vcur 3d")?;
            let rope = |x: T| {
                checked(
                    sys::ggml_rope_ext(
                        raw,
                        x,
                        pos,
                        std::ptr::null_mut(),
                        hp.n_rot as i32,
                        ROPE_MODE_NORM,
                        n_ctx_orig,
                        hp.rope_freq_base,
                        1.0,
                        0.0,
                        1.0,
                        YARN_BETA_FAST,
                        YARN_BETA_SLOW,
                    ),
                    "rope",
                )
            };
            let q = rope(q)?;
            let k = rope(k)?;
            b.name(q, &format!("Qcur-{il}"));
            b.name(k, &format!("Kcur-{il}"));
            b.expand(q);
            b.expand(v);
            b.expand(k);
            // KV store (llama_kv_cache::cpy_k / cpy_v, V not transposed
            // because flash attention is on).
            let k2 = checked(
                sys::ggml_view_2d(raw, k, n_embd_kv, t, (*k).nb[2], 0),
                "k view",
            )?;
            let set_k = checked(sys::ggml_set_rows(raw, k_cache, k2, kv_idx), "set_rows k")?;
            b.expand(set_k);
            let v2 = checked(
                sys::ggml_view_2d(raw, v, n_embd_kv, t, (*v).nb[2], 0),
                "v view",
            )?;
            let set_v = checked(sys::ggml_set_rows(raw, v_cache, v2, kv_idx), "set_rows v")?;
            b.expand(set_v);
            // get_k / get_v: one KV stream per decode stream (llama.cpp's
            // layout without kv_unified), `cells` cells each.
            let cache_view = |cache: T, what: &str| {
                checked(
                    sys::ggml_view_4d(
                        raw,
                        cache,
                        hd,
                        n_head_kv,
                        cells,
                        ns,
                        f16_row(hd),
                        f16_row(n_embd_kv),
                        f16_row(n_embd_kv * cells),
                        0,
                    ),
                    what,
                )
            };
            let kk = cache_view(k_cache, "k cache view")?;
            let vv = cache_view(v_cache, "v cache view")?;
            // build_attn_mha: split the batch into its streams.
            let q4 = checked(
                sys::ggml_view_4d(
                    raw,
                    q,
                    (*q).ne[0],
                    (*q).ne[1],
                    (*q).ne[2] / ns,
                    ns,
                    (*q).nb[1],
                    (*q).nb[2],
                    (*q).nb[2] * ((*q).ne[2] / ns) as usize,
                    0,
                ),
                "q streams",
            )?;
            let qp = checked(sys::ggml_permute(raw, q4, 0, 2, 1, 3), "q permute")?;
            let kp = checked(sys::ggml_permute(raw, kk, 0, 2, 1, 3), "k permute")?;
            let vp = checked(sys::ggml_permute(raw, vv, 0, 2, 1, 3), "v permute")?;
            let fa = checked(
                sys::ggml_flash_attn_ext(raw, qp, kp, vp, mask, kq_scale, 0.0, 0.0),
                "flash_attn_ext",
            )?;
            sys::ggml_prec_set_acc(fa, sys::GGML_PREC_F32);
            let attn = checked(
                sys::ggml_reshape_2d(
                    raw,
                    fa,
                    (*fa).ne[0] * (*fa).ne[1],
                    (*fa).ne[2] * (*fa).ne[3],
                ),
                "attn 2d",
            )?;
            b.expand(attn);
            cur = checked(sys::ggml_mul_mat(raw, wg("attn_output")?, attn), "attn_out")?;
            let ffn_inp = checked(sys::ggml_add(raw, cur, inp_sa), "ffn_inp")?;
            cur = checked(sys::ggml_rms_norm(raw, ffn_inp, hp.rms_eps), "ffn rms_norm")?;
            cur = checked(sys::ggml_mul(raw, cur, wg("ffn_norm")?), "ffn_norm")?;
            let up = checked(sys::ggml_mul_mat(raw, wg("ffn_up")?, cur), "ffn_up")?;
            let gate = checked(sys::ggml_mul_mat(raw, wg("ffn_gate")?, cur), "ffn_gate")?;
            cur = checked(sys::ggml_swiglu_split(raw, gate, up), "ffn_swiglu")?;
            cur = checked(sys::ggml_mul_mat(raw, wg("ffn_down")?, cur), "ffn_down")?;
            cur = checked(sys::ggml_add(raw, cur, ffn_inp), "l_out")?;
            b.name(cur, &format!("l_out-{il}"));
            inp_l = cur;
        }
        let mut out = inp_l;
        if shape.is_last {
            let norm_w = b.weight("output_norm.weight", hp.n_embd, 1)?;
            let out_name = output_name.to_owned();
            let out_ty = wtype(&out_name)?;
            let out_w = b.leaf(
                BufferKind::Weights,
                out_ty,
                [e, i64::from(hp.n_vocab), 1, 1],
                &out_name,
            )?;
            b.weights.push((out_name, out_w));
            out = checked(sys::ggml_rms_norm(raw, out, hp.rms_eps), "result_norm")?;
            out = checked(sys::ggml_mul(raw, out, norm_w), "result_norm w")?;
            out = checked(sys::ggml_mul_mat(raw, out_w, out), "result_output")?;
            b.name(out, "result_output");
        }
        b.expand(out);
        let n = sys::ggml_graph_n_nodes(gf);
        let nodes: Vec<T> = (0..n).map(|i| sys::ggml_graph_node(gf, i)).collect();
        if nodes.iter().any(|p| p.is_null()) {
            return fail("null graph node");
        }
        Ok(BuiltStage {
            leaves: b.leaves,
            weights: b.weights,
            _ctx: ctx,
            nodes,
            hidden_in,
            pos,
            kv_idx,
            mask,
            output: out,
        })
    }
}

/// Where a non-view tensor was placed: buffer and offset.
type Placement = HashMap<usize, (BufferKind, u64)>;

impl BuiltStage {
    /// Every tensor the nodes reach (sources and view sources), in an order
    /// where sources come first.
    fn closure(&self) -> Vec<T> {
        let mut seen = HashSet::new();
        let mut order = Vec::new();
        let mut stack: Vec<(T, bool)> = self
            .nodes
            .iter()
            .rev()
            .map(|&n| (n, false))
            .chain([
                (self.hidden_in, false),
                (self.pos, false),
                (self.kv_idx, false),
                (self.mask, false),
            ])
            .collect();
        while let Some((t, expanded)) = stack.pop() {
            if expanded {
                order.push(t);
                continue;
            }
            if !seen.insert(t as usize) {
                continue;
            }
            stack.push((t, true));
            // SAFETY: t is a live tensor of self.ctx; its source pointers are
            // null or tensors of the same context.
            let (srcs, view) = unsafe { ((*t).src, (*t).view_src) };
            for s in srcs.iter().chain(std::iter::once(&view)) {
                if !s.is_null() && !seen.contains(&(*s as usize)) {
                    stack.push((*s, false));
                }
            }
        }
        order
    }

    /// Lays the tensors out with `alignment`; returns the placement and the
    /// size each buffer needs.
    fn plan(&self, alignment: u64) -> Result<(Placement, BufferSizes)> {
        let mut allocs = [
            LinearAllocator::new(alignment)?,
            LinearAllocator::new(alignment)?,
            LinearAllocator::new(alignment)?,
        ];
        let mut placed = Placement::new();
        // The step inputs first and in this order, back to back in the
        // state buffer, so one SET_TENSOR writes them all
        // ([`StageGraph::input_block`]).
        for t in [self.hidden_in, self.pos, self.kv_idx, self.mask] {
            // SAFETY: t is live; ggml_nbytes reads its shape only.
            let size = unsafe { sys::ggml_nbytes(t) } as u64;
            let off = allocs[BufferKind::State as usize].alloc(size)?;
            placed.insert(t as usize, (BufferKind::State, off));
        }
        for t in self.closure() {
            // SAFETY: t is a live tensor of self.ctx.
            let (view_src, op) = unsafe { ((*t).view_src, (*t).op) };
            if !view_src.is_null() || placed.contains_key(&(t as usize)) {
                continue;
            }
            let kind = match self.leaves.get(&(t as usize)) {
                Some((k, _)) => *k,
                None if op != sys::GGML_OP_NONE => BufferKind::Compute,
                None => return fail("a leaf tensor without a role"),
            };
            // SAFETY: t is live; ggml_nbytes reads its shape only.
            let size = unsafe { sys::ggml_nbytes(t) } as u64;
            let off = allocs[kind as usize].alloc(size)?;
            placed.insert(t as usize, (kind, off));
        }
        Ok((
            placed,
            BufferSizes([allocs[0].size(), allocs[1].size(), allocs[2].size()]),
        ))
    }

    /// Buffer sizes the stage needs with `alignment`.
    pub fn sizes(&self, alignment: u64) -> Result<BufferSizes> {
        self.plan(alignment).map(|(_, s)| s)
    }

    /// Serialises the stage with its tensors placed in `buffers`
    /// (weights, state, compute: at least [`BuiltStage::sizes`] bytes each).
    pub fn serialize(&self, alignment: u64, buffers: &[RemoteBuffer; 3]) -> Result<StageGraph> {
        let (placed, sizes) = self.plan(alignment)?;
        for (b, need) in buffers.iter().zip(sizes.0) {
            if b.size < need {
                return fail(format!("buffer of {} bytes, {need} needed", b.size));
            }
        }
        let closure = self.closure();
        let mut tensors = Vec::with_capacity(closure.len());
        let mut by_ptr = HashMap::with_capacity(closure.len());
        for &t in &closure {
            let r = self.to_rpc(t, &placed, buffers)?;
            by_ptr.insert(t as usize, r.clone());
            tensors.push(r);
        }
        let get = |t: T| -> Result<RpcTensor> {
            by_ptr
                .get(&(t as usize))
                .cloned()
                .ok_or_else(|| RpcError::refused(CALL, "tensor missing from the closure"))
        };
        let payload = GraphPayload {
            device: 0,
            nodes: self.nodes.iter().map(|&n| n as u64).collect(),
            tensors,
        };
        let weights = self
            .weights
            .iter()
            .map(|(name, t)| Ok((name.clone(), get(*t)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(StageGraph {
            payload,
            hidden_in: get(self.hidden_in)?,
            pos: get(self.pos)?,
            kv_idx: get(self.kv_idx)?,
            mask: get(self.mask)?,
            output: get(self.output)?,
            weights,
        })
    }

    fn to_rpc(&self, t: T, placed: &Placement, buffers: &[RemoteBuffer; 3]) -> Result<RpcTensor> {
        // SAFETY: t and its sources are live tensors of self.ctx.
        let tr = unsafe { &*t };
        let (base, extra) = if tr.view_src.is_null() {
            (t, 0u64)
        } else {
            (tr.view_src, tr.view_offs as u64)
        };
        let Some(&(kind, off)) = placed.get(&(base as usize)) else {
            return fail("tensor without a placement");
        };
        let buf = buffers[kind as usize];
        let u32_of = |v: i64, what: &str| -> Result<u32> {
            u32::try_from(v)
                .map_err(|_| RpcError::refused(CALL, format!("{what} {v} does not fit the wire")))
        };
        let mut ne = [0u32; 4];
        let mut nb = [0u32; 4];
        for i in 0..4 {
            ne[i] = u32_of(tr.ne[i], "ne")?;
            nb[i] = u32_of(i64::try_from(tr.nb[i]).unwrap_or(i64::MAX), "nb")?;
        }
        let mut src = [0u64; MAX_SRC];
        for (d, s) in src.iter_mut().zip(tr.src.iter()) {
            *d = *s as u64;
        }
        let mut name = [0u8; MAX_NAME];
        for (d, s) in name.iter_mut().zip(tr.name.iter()).take(MAX_NAME - 1) {
            *d = *s as u8;
        }
        let data = buf
            .base
            .checked_add(off)
            .and_then(|a| a.checked_add(extra))
            .ok_or_else(|| RpcError::refused(CALL, "address overflows"))?;
        Ok(RpcTensor {
            id: t as u64,
            ty: tr.type_,
            buffer: buf.handle,
            ne,
            nb,
            op: tr.op,
            op_params: tr.op_params,
            flags: tr.flags,
            src,
            view_src: tr.view_src as u64,
            view_offs: tr.view_offs as u64,
            data,
            name,
            use_count: 0,
        })
    }

    /// Number of graph nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }
}
