//! The pipeline of stages and its greedy decode loop.
//!
//! Every step feeds one token per stream (prompt tokens first, one step at
//! a time, through the same graph; prompts may differ in length, see
//! [`Pipeline::greedy`]). The embeddings are looked up on the
//! coordinator from `token_embd` and sent to stage 0; positions, KV cells
//! and the mask are sent to every stage; the logits come back from the
//! last stage and the next token is their argmax.

use std::time::Instant;

use super::boundary::{Arm, Boundary, Fallback};
use super::counters::CounterTable;
use super::model::{EmbeddingTable, LlamaModel};
use super::placement::split_layers;
use super::stage::{Stage, stage_error};
use super::stage_graph::StageShape;
use crate::client::{ClientConfig, Stats};
use crate::error::{Result, RpcError};

/// F16 bit patterns of the mask values.
const F16_ZERO: u16 = 0x0000;
const F16_NEG_INF: u16 = 0xFC00;

/// Positions, KV cells and mask of one step (shared by every stage).
type StepInputs = (Vec<u8>, Vec<u8>, Vec<u8>);

/// How to build a pipeline.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Servers, one per stage, in stage order.
    pub endpoints: Vec<String>,
    /// Where the servers reach each other (the destination of a direct
    /// copy), one per stage like `endpoints`; `None`: `endpoints`. Differs
    /// when the coordinator reaches the servers through a relay that the
    /// servers cannot use (the bench's user-space delay proxy).
    pub peer_endpoints: Option<Vec<String>>,
    /// Tensor-split ratios (one per stage).
    pub ratios: Vec<f64>,
    /// Requested boundary path.
    pub arm: Arm,
    /// Independent streams (B): tokens per step.
    pub streams: u32,
    /// KV cells per stream (prompt length + generated tokens at least).
    pub ctx: u32,
    /// Client settings for every stage connection (stats are forced on).
    pub client: ClientConfig,
    /// How long a destination waits for an engine write's immediates
    /// before the step is redone on the fallback path (the server caps
    /// it).
    pub engine_wait_ms: u32,
}

/// A model layer-split over servers.
#[derive(Debug)]
pub struct Pipeline {
    /// The stages, in order.
    pub stages: Vec<Stage>,
    /// The boundaries (`stages.len() - 1`).
    pub boundaries: Vec<Boundary>,
    /// Fallbacks chosen when the boundaries were negotiated.
    pub fallbacks: Vec<Fallback>,
    token_embd: EmbeddingTable,
    n_embd: usize,
    n_vocab: usize,
    streams: u32,
    ctx: u32,
}

/// The result of a greedy decode.
#[derive(Debug, Clone, Default)]
pub struct DecodeOutput {
    /// Generated tokens per stream.
    pub tokens: Vec<Vec<i32>>,
    /// Logits per stream (when asked for): those its tokens were chosen
    /// from, `n_new` per stream.
    pub logits: Vec<Vec<Vec<f32>>>,
    /// Wall time of every generating step (a step at which at least one
    /// stream generates; see [`Pipeline::greedy`]), seconds.
    pub step_secs: Vec<f64>,
    /// Wall time of all generating steps, seconds.
    pub decode_secs: f64,
    /// Counters of the steady generating steps (the one step that carries
    /// GRAPH_COMPUTE instead of GRAPH_RECOMPUTE is left out).
    pub counters: CounterTable,
    /// Direct copies that fell back to the hub at run time.
    pub runtime_fallbacks: u64,
}

/// The tokens of step `i`, one per stream: the prompt's while it lasts,
/// then the token generated at step `i - 1`; a stream that has all its
/// tokens repeats its last one (see [`Pipeline::greedy`]).
fn step_tokens(prompts: &[Vec<i32>], generated: &[Vec<i32>], i: usize) -> Result<Vec<i32>> {
    prompts
        .iter()
        .zip(generated)
        .map(|(p, g)| {
            p.get(i)
                .or_else(|| g.get(i - p.len()).or_else(|| g.last()))
                .copied()
                .ok_or_else(|| RpcError::refused("greedy decode", format!("no token for step {i}")))
        })
        .collect()
}

/// Index of the largest value (the first one on ties, like llama.cpp's
/// greedy sampler and the reference loop).
pub fn argmax(v: &[f32]) -> i32 {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &x) in v.iter().enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0 as i32
}

/// Deterministic prompts: `streams` prompts of `len` tokens below `n_vocab`.
pub fn default_prompts(streams: u32, len: u32, n_vocab: u32) -> Vec<Vec<i32>> {
    prompts_of_lengths(&vec![len; streams as usize], n_vocab)
}

/// Deterministic prompts of the given lengths (one per stream), with the
/// token pattern of [`default_prompts`]: stream b's prompt is the first
/// `lens[b]` tokens of the same infinite sequence, so a ragged set is the
/// uniform one truncated or extended per stream.
pub fn prompts_of_lengths(lens: &[u32], n_vocab: u32) -> Vec<Vec<i32>> {
    (0u32..)
        .zip(lens)
        .map(|(b, &len)| {
            (0..len)
                .map(|i| ((1 + 37 * b + 11 * i + (b * i) % 7) % n_vocab.max(1)) as i32)
                .collect()
        })
        .collect()
}

impl Pipeline {
    /// Connects every stage, uploads its weights and negotiates the
    /// boundaries.
    pub fn new(model: &mut LlamaModel, config: &PipelineConfig) -> Result<Pipeline> {
        let hp = model.hparams;
        if config.endpoints.len() != config.ratios.len() {
            return Err(RpcError::refused(
                "pipeline",
                format!(
                    "{} servers but {} tensor-split ratios",
                    config.endpoints.len(),
                    config.ratios.len()
                ),
            ));
        }
        let peers = config.peer_endpoints.as_ref().unwrap_or(&config.endpoints);
        if peers.len() != config.endpoints.len() {
            return Err(RpcError::refused(
                "pipeline",
                format!(
                    "{} servers but {} peer endpoints",
                    config.endpoints.len(),
                    peers.len()
                ),
            ));
        }
        if config.streams == 0 || config.ctx == 0 {
            return Err(RpcError::refused(
                "pipeline",
                "streams and context must be positive",
            ));
        }
        let kv_size = config
            .streams
            .checked_mul(config.ctx)
            .filter(|&k| i32::try_from(k).is_ok())
            .ok_or_else(|| RpcError::refused("pipeline", "streams × context overflows"))?;
        let ranges = split_layers(hp.n_layer, &config.ratios)?;
        let last = ranges.len() - 1;
        let client = ClientConfig {
            stats: true,
            ..config.client.clone()
        };
        let mut stages = Vec::with_capacity(ranges.len());
        for (i, ((ep, peer), layers)) in config.endpoints.iter().zip(peers).zip(ranges).enumerate()
        {
            let shape = StageShape {
                layers,
                is_last: i == last,
                n_tokens: config.streams,
                kv_size,
            };
            stages.push(Stage::setup(i, ep, peer, client.clone(), model, shape)?);
        }
        let mut boundaries = Vec::new();
        let mut fallbacks = Vec::new();
        for i in 1..stages.len() {
            let (before, after) = stages.split_at_mut(i);
            let (b, f) = Boundary::negotiate(
                config.arm,
                &mut before[i - 1],
                &mut after[0],
                config.engine_wait_ms,
            )?;
            boundaries.push(b);
            fallbacks.extend(f);
        }
        let token_embd = model.read_token_embd()?;
        let mut p = Pipeline {
            stages,
            boundaries,
            fallbacks,
            token_embd,
            n_embd: hp.n_embd as usize,
            n_vocab: hp.n_vocab as usize,
            streams: config.streams,
            ctx: config.ctx,
        };
        p.take_stats();
        Ok(p)
    }

    /// The arm each boundary uses.
    pub fn arms_used(&self) -> Vec<Arm> {
        self.boundaries.iter().map(|b| b.path.arm()).collect()
    }

    /// Counters of every connection since the last call, merged.
    pub fn take_stats(&mut self) -> Stats {
        let mut all = Stats::default();
        for s in &mut self.stages {
            if let Some(st) = s.client.take_stats() {
                all.merge(&st);
            }
        }
        all
    }

    fn embeddings(&self, tokens: &[i32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(tokens.len() * self.n_embd * 4);
        for &t in tokens {
            self.token_embd.append_row(t, &mut out)?;
        }
        Ok(out)
    }

    /// Step inputs shared by all stages at position `pos`: positions, KV
    /// cells (stream b owns cells `b*ctx .. (b+1)*ctx`) and the mask (one
    /// row per stream over its own cells: those up to `pos` are visible).
    fn step_inputs(&self, pos: u32) -> StepInputs {
        let b = self.streams as usize;
        let ctx = self.ctx as usize;
        let p = pos as usize;
        let positions = (0..b).flat_map(|_| (pos as i32).to_le_bytes()).collect();
        let cells = (0..b)
            .flat_map(|s| ((s * ctx + p) as i64).to_le_bytes())
            .collect();
        let mut mask = Vec::with_capacity(ctx * b * 2);
        for _stream in 0..b {
            for j in 0..ctx {
                let v = if j <= p { F16_ZERO } else { F16_NEG_INF };
                mask.extend_from_slice(&v.to_le_bytes());
            }
        }
        (positions, cells, mask)
    }

    /// Drives stages `from..` through one step and reads the last stage's
    /// output. With `from > 0` the step is being redone: the boundary into
    /// stage `from` re-sends the source's output, which is still in place.
    fn run_stages(&mut self, from: usize, embd: &[u8], inputs: &StepInputs) -> Result<Vec<u8>> {
        let (positions, cells, mask) = inputs;
        let n = self.stages.len();
        for s in from..n {
            let hidden = (s == 0).then_some(embd);
            self.stages[s].set_step_inputs(hidden, positions, cells, mask)?;
            if s > 0 {
                let (before, after) = self.stages.split_at_mut(s);
                let boundary = &mut self.boundaries[s - 1];
                if s == from {
                    boundary.after_src_compute(&mut before[s - 1], &mut after[0])?;
                }
                boundary.before_dst_compute(&mut before[s - 1], &mut after[0])?;
            }
            self.stages[s].compute()?;
            if s + 1 < n {
                let (before, after) = self.stages.split_at_mut(s + 1);
                self.boundaries[s].after_src_compute(&mut before[s], &mut after[0])?;
            }
        }
        match self.stages.last_mut() {
            Some(last) => last.read_output(),
            None => Err(RpcError::refused(
                "decode step",
                "a pipeline without stages",
            )),
        }
    }

    /// Reads the answers the engine boundaries posted by
    /// [`Pipeline::run_stages`]`(from, ..)` (on each stage's connection: the
    /// wait of the boundary into it, then the write of the boundary out of
    /// it) and returns the boundaries whose write or wait failed, in order,
    /// with the reason.
    fn collect_engine_answers(&mut self, from: usize) -> Result<Vec<(usize, String)>> {
        let n = self.stages.len();
        let mut write_ok = vec![true; n.saturating_sub(1)];
        let mut wait_ok = vec![true; n.saturating_sub(1)];
        for s in from..n {
            let wait = s > 0 && self.boundaries[s - 1].posts_answers();
            let write = s + 1 < n && self.boundaries[s].posts_answers();
            let posted = usize::from(wait) + usize::from(write);
            if posted == 0 {
                continue;
            }
            let stage = &mut self.stages[s];
            let answers = stage
                .client
                .collect_posted()
                .map_err(|e| stage_error(stage.index, &stage.endpoint, e))?;
            if answers.len() != posted {
                return Err(stage_error(
                    stage.index,
                    &stage.endpoint,
                    RpcError::malformed(
                        "engine answers",
                        format!("{} answers, {posted} posted", answers.len()),
                    ),
                ));
            }
            // Posting order on this connection: the wait into this stage,
            // then the write out of it.
            if wait {
                wait_ok[s - 1] = answers[0];
            }
            if write {
                write_ok[s] = answers[posted - 1];
            }
        }
        Ok((0..n.saturating_sub(1))
            .filter_map(|b| {
                let why = match (write_ok[b], wait_ok[b]) {
                    (true, true) => return None,
                    (false, _) => "the source refused the write or an earlier write failed",
                    (true, false) => "the write's immediates did not arrive in time",
                };
                Some((b, format!("engine step failed at boundary {b}: {why}")))
            })
            .collect())
    }

    /// One step: one token per stream at position `pos`; returns the logits
    /// (`streams` rows of `n_vocab`).
    pub fn step(&mut self, tokens: &[i32], pos: u32) -> Result<Vec<Vec<f32>>> {
        if tokens.len() != self.streams as usize {
            return Err(RpcError::refused("decode step", "one token per stream"));
        }
        if pos >= self.ctx {
            return Err(RpcError::refused(
                "decode step",
                format!("position {pos} beyond the context {}", self.ctx),
            ));
        }
        let embd = self.embeddings(tokens)?;
        let inputs = self.step_inputs(pos);
        let mut raw = self.run_stages(0, &embd, &inputs)?;
        let failed = self.collect_engine_answers(0)?;
        if let Some(&(first, _)) = failed.first() {
            // An engine boundary failed: every stage from its destination
            // on computed on stale input. Give those boundaries up and
            // redo the step from there (inputs and KV cells are rewritten,
            // so the redo is exact).
            for (b, reason) in failed {
                let (before, after) = self.stages.split_at_mut(b + 1);
                self.boundaries[b].give_up_engine(&mut before[b], &mut after[0], reason)?;
            }
            raw = self.run_stages(first + 1, &embd, &inputs)?;
            if let Some((b, reason)) = self.collect_engine_answers(first + 1)?.into_iter().next() {
                let dst = &self.stages[b + 1];
                return Err(stage_error(
                    dst.index,
                    &dst.endpoint,
                    RpcError::refused("engine boundary", reason),
                ));
            }
        }
        let Some(last) = self.stages.last() else {
            return Err(RpcError::refused(
                "decode step",
                "a pipeline without stages",
            ));
        };
        let want = self.n_vocab * self.streams as usize * 4;
        if raw.len() != want {
            return Err(stage_error(
                last.index,
                &last.endpoint,
                RpcError::malformed(
                    "read logits",
                    format!("{} bytes, expected {want}", raw.len()),
                ),
            ));
        }
        let floats: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(floats
            .chunks_exact(self.n_vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// Greedy decode: feeds the prompts (one per stream, of any non-empty
    /// lengths) and generates `n_new` tokens per stream.
    ///
    /// Every step feeds one token per stream at the same position `t` (one
    /// set of step inputs for all streams; each stream has its own KV cells
    /// and mask row, and every prompt starts at position 0): stream b feeds
    /// `prompts[b][t]` while `t < len_b` and afterwards the token it
    /// generated at step `t - 1`. Stream b's tokens are the argmax of its
    /// logits at steps `len_b - 1 ..= len_b + n_new - 2`; the run takes
    /// `max_b len_b + n_new - 1` steps.
    ///
    /// A stream that has its `n_new` tokens keeps feeding its last token
    /// (its outputs are ignored) until the others finish. That wastes its
    /// share of those steps' compute, accepted so that every step has the
    /// same batch of `streams` tokens: one graph shape, built once and
    /// re-run with GRAPH_RECOMPUTE, instead of a new graph (GRAPH_COMPUTE
    /// on every stage) whenever a stream finishes.
    ///
    /// Generating steps (those in `step_secs`, `decode_secs` and
    /// `counters`) are the steps at which at least one stream generates:
    /// `min_b len_b - 1 ..` to the end; with prompts of one length these
    /// are the steps from the prompt's last token on, as before ragged
    /// prompts were allowed.
    pub fn greedy(
        &mut self,
        prompts: &[Vec<i32>],
        n_new: u32,
        keep_logits: bool,
    ) -> Result<DecodeOutput> {
        let b = self.streams as usize;
        if prompts.len() != b || prompts.iter().any(Vec::is_empty) {
            return Err(RpcError::refused(
                "greedy decode",
                "one non-empty prompt per stream",
            ));
        }
        let max_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let min_len = prompts.iter().map(Vec::len).min().unwrap_or(0);
        if n_new == 0 || max_len as u64 + u64::from(n_new) - 1 > u64::from(self.ctx) {
            return Err(RpcError::refused(
                "greedy decode",
                format!(
                    "{max_len} prompt (the longest) + {n_new} new tokens do not fit a context of {}",
                    self.ctx
                ),
            ));
        }
        let n_new = n_new as usize;
        let mut out = DecodeOutput {
            tokens: vec![Vec::new(); b],
            logits: vec![Vec::new(); b],
            ..DecodeOutput::default()
        };
        let before: u64 = self.boundaries.iter().map(|x| x.runtime_fallbacks).sum();
        let total = max_len + n_new - 1;
        for i in 0..total {
            let tokens = step_tokens(prompts, &out.tokens, i)?;
            let t0 = Instant::now();
            let logits = self.step(&tokens, i as u32)?;
            let generating = i + 1 >= min_len;
            for (s, l) in logits.into_iter().enumerate() {
                if i + 1 >= prompts[s].len() && out.tokens[s].len() < n_new {
                    out.tokens[s].push(argmax(&l));
                    if keep_logits {
                        out.logits[s].push(l);
                    }
                }
            }
            if generating {
                let dt = t0.elapsed().as_secs_f64();
                out.step_secs.push(dt);
                out.decode_secs += dt;
            }
            let st = self.take_stats();
            if generating && (i > 0 || total == 1) {
                // Step 0 carries GRAPH_COMPUTE; it counts only when it is
                // the whole run.
                out.counters.add_step(&st);
            }
        }
        out.runtime_fallbacks = self
            .boundaries
            .iter()
            .map(|x| x.runtime_fallbacks)
            .sum::<u64>()
            - before;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ragged_prompts_extend_the_uniform_pattern() {
        let uniform = default_prompts(3, 8, 128);
        let ragged = prompts_of_lengths(&[2, 8, 5], 128);
        assert_eq!(ragged.iter().map(Vec::len).collect::<Vec<_>>(), [2, 8, 5]);
        for (r, u) in ragged.iter().zip(&uniform) {
            assert_eq!(r[..], u[..r.len()]);
        }
        assert!(ragged.iter().flatten().all(|&t| (0..128).contains(&t)));
    }

    #[test]
    fn step_tokens_feed_prompt_then_generated_then_repeat_the_last() -> Result<()> {
        let prompts = vec![vec![10, 11], vec![20, 21, 22, 23]];
        // n_new = 2: stream 0 generates at steps 1, 2; stream 1 at 3, 4.
        let generated = vec![vec![100, 101], vec![200]];
        assert_eq!(step_tokens(&prompts, &generated, 0)?, [10, 20]);
        assert_eq!(step_tokens(&prompts, &generated, 1)?, [11, 21]);
        // Stream 0 feeds what it generated at steps 1 and 2.
        assert_eq!(step_tokens(&prompts, &generated, 2)?, [100, 22]);
        assert_eq!(step_tokens(&prompts, &generated, 3)?, [101, 23]);
        // Stream 0 is done: it repeats its last token; stream 1 feeds its
        // step-3 token.
        assert_eq!(step_tokens(&prompts, &generated, 4)?, [101, 200]);
        // A stream past its prompt with nothing generated has no token.
        assert!(step_tokens(&prompts, &[vec![], vec![]], 2).is_err());
        Ok(())
    }
}
