//! kv: disaggregated prefill -> decode (WORKLOADS.md, "kv"). Rank 0 is the
//! prefill process, rank 1 the decode process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use transfer_core::{
    DoneFlag, LocalRegion, Notify, PagedWriteRequest, Pages, ProgressMode, WriteShape,
};

use crate::backend::GUARD;
use crate::error::{BenchError, Result, protocol};
use crate::workloads::coord::{Ctx, RankWork, Remote, imm};
use crate::workloads::signal::wait_flags;
use crate::workloads::signal::{self, Armed};
use crate::workloads::spec::{KvParams, fill, shuffle};
use crate::workloads::unit_io::check_unit;

/// How often the prefill, waiting for decode's ack, looks at its writes.
const ACK_CHECK: Duration = Duration::from_millis(50);

/// Waits for decode's ack; a write of this iteration that failed ends the
/// wait with its error (decode then never acks, and the wait would
/// otherwise last the whole guard and say only that the ack never came).
fn wait_ack(ctx: &Ctx, flags: &[Arc<DoneFlag>]) -> Result<()> {
    let deadline = Instant::now() + GUARD;
    let mut ack = signal::arm(&ctx.engine, imm::ACK, 1, "decode's ack");
    loop {
        if ack.wait_until((Instant::now() + ACK_CHECK).min(deadline))? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(protocol("workloads: wait", "decode's ack never arrived"));
        }
        if let Some(Err(e)) = flags.iter().find_map(|f| f.result().filter(Result::is_err)) {
            return Err(e.into());
        }
    }
}

/// Ranks of a kv run.
pub const RANKS: usize = 2;

struct Kv {
    p: KvParams,
    region: LocalRegion,
    /// Decode: destination page of (r, l, p) at index (r*L + l)*P + p.
    perm: Vec<u32>,
}

/// Opens rank 0 (prefill: R*L*P*B source bytes) or rank 1 (decode: the pool).
pub fn setup(ctx: &Ctx, params: &serde_json::Value) -> Result<Box<dyn RankWork>> {
    let p: KvParams = serde_json::from_value(params.clone())
        .map_err(|e| BenchError::Usage(format!("kv params: {e}")))?;
    if ctx.world != RANKS {
        return Err(BenchError::Usage(format!(
            "kv runs on {RANKS} ranks, not {}",
            ctx.world
        )));
    }
    p.check().map_err(BenchError::Usage)?;
    let len = if ctx.rank == 0 {
        p.total_bytes()
    } else {
        p.pool_pages() * p.page_bytes
    };
    let len = usize::try_from(len).map_err(|_| BenchError::Usage("kv: region too large".into()))?;
    let region = ctx.engine.alloc_host(len, 0)?;
    let perm = if ctx.rank == 1 {
        shuffle(p.pool_pages() as usize, p.seed)
    } else {
        Vec::new()
    };
    Ok(Box::new(Kv { p, region, perm }))
}

impl RankWork for Kv {
    fn region(&self) -> &LocalRegion {
        &self.region
    }

    fn iterate(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        if ctx.rank == 0 {
            self.prefill(ctx, peers, it)
        } else {
            self.decode(ctx, peers, it)
        }
    }
}

fn other(peers: &[Option<Remote>]) -> Result<&Remote> {
    peers
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| protocol("kv", "no peer"))
}

impl Kv {
    fn prefill(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        let p = self.p;
        let decode = other(peers)?;
        // Untimed: this iteration's pages.
        let mut page = vec![0u8; p.page_bytes as usize];
        for r in 0..p.requests {
            for l in 0..p.layers {
                for pg in 0..p.pages_per_layer {
                    fill(&mut page, KvParams::tag(r, l, pg), it, 0);
                    let off = r * p.request_bytes() + (l * p.pages_per_layer + pg) * p.page_bytes;
                    self.region.write_at(off as usize, &page)?;
                }
            }
        }
        ctx.barrier(peers, imm::barrier(0, it))?;
        let start = Instant::now();
        let compute = Duration::from_micros(p.compute_us);
        let mut flags: Vec<Arc<DoneFlag>> = Vec::with_capacity((p.requests * p.layers) as usize);
        let mut first_post: Option<Instant> = None;
        let mut compute_end = start;
        for l in 0..p.layers {
            // The layer's "compute" for all R requests.
            let t = Instant::now();
            // The CPU thread is free while the GPU computes: with
            // caller-driven progress it drives the layers already posted.
            let caller = ctx.engine.progress_mode() == ProgressMode::Caller;
            while t.elapsed() < compute {
                if !(caller && ctx.engine.progress()) {
                    std::hint::spin_loop();
                }
            }
            if l + 1 == p.layers {
                compute_end = Instant::now();
            }
            for r in 0..p.requests {
                let flag = DoneFlag::new();
                let src: Vec<u32> = (0..p.pages_per_layer)
                    .map(|pg| (l * p.pages_per_layer + pg) as u32)
                    .collect();
                let base = ((r * p.layers + l) * p.pages_per_layer) as usize;
                let dst: Vec<u32> = (0..p.pages_per_layer as usize)
                    .map(|pg| self.perm_of(base + pg))
                    .collect::<Result<_>>()?;
                ctx.engine.submit_paged_write(
                    PagedWriteRequest {
                        src: &self.region,
                        src_pages: Pages {
                            indices: src,
                            stride: p.page_bytes,
                            offset: r * p.request_bytes(),
                        },
                        dst: &decode.target,
                        dst_pages: Pages {
                            indices: dst,
                            stride: p.page_bytes,
                            offset: 0,
                        },
                        page_len: p.page_bytes,
                        imm: Some(imm::kv(r, l, p.layers)),
                    },
                    Notify::Flag(flag.clone()),
                )?;
                first_post.get_or_insert_with(Instant::now);
                flags.push(flag);
            }
        }
        wait_ack(ctx, &flags)?;
        let ack = Instant::now();
        wait_flags(&ctx.engine, &flags)?;
        let ttll_us = ack.duration_since(compute_end).as_secs_f64() * 1e6;
        let span = ack
            .duration_since(first_post.unwrap_or(start))
            .as_secs_f64();
        let gbps = if span > 0.0 {
            p.total_bytes() as f64 / span / 1e9
        } else {
            0.0
        };
        Ok(vec![ttll_us, gbps])
    }

    /// The prefill side knows the placement too (it is computed from the seed).
    fn perm_of(&mut self, i: usize) -> Result<u32> {
        if self.perm.is_empty() {
            self.perm = shuffle(self.p.pool_pages() as usize, self.p.seed);
        }
        self.perm
            .get(i)
            .copied()
            .ok_or_else(|| protocol("kv", "page index out of the pool"))
    }

    fn decode(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        let p = self.p;
        let prefill = other(peers)?;
        // One counter per (request, layer), armed before the start: each
        // paged write delivers as many immediates as the sender's sharding says.
        let per_write = ctx.engine.expected_imms(
            &prefill.addr,
            0,
            0,
            WriteShape::PagedSized {
                pages: p.pages_per_layer as usize,
                page_len: p.page_bytes,
            },
        )?;
        let mut layers: Vec<Armed> = Vec::with_capacity((p.requests * p.layers) as usize);
        for l in 0..p.layers {
            for r in 0..p.requests {
                layers.push(signal::arm(
                    &ctx.engine,
                    imm::kv(r, l, p.layers),
                    per_write,
                    "a kv layer",
                ));
            }
        }
        ctx.barrier(peers, imm::barrier(0, it))?;
        // Decode consumes layer by layer (all requests of layer l, then l+1).
        let deadline = Instant::now() + GUARD;
        for armed in &mut layers {
            armed.wait(deadline)?;
        }
        let ack = ctx.notify(&self.region, &prefill.target, imm::ACK)?;
        wait_flags(&ctx.engine, &[ack])?;
        // Untimed: every byte of every page, where the placement puts it.
        let mut buf = Vec::new();
        for r in 0..p.requests {
            for l in 0..p.layers {
                for pg in 0..p.pages_per_layer {
                    let i = ((r * p.layers + l) * p.pages_per_layer + pg) as usize;
                    let dst = u64::from(self.perm_of(i)?) * p.page_bytes;
                    check_unit(
                        &self.region,
                        dst,
                        p.page_bytes,
                        KvParams::tag(r, l, pg),
                        it,
                        "kv",
                        &mut buf,
                    )?;
                }
            }
        }
        Ok(Vec::new())
    }
}
