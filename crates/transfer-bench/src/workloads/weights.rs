//! weights: an RL weight update (WORKLOADS.md, "weights"). Ranks 0..M are
//! trainers, M..M+N inference ranks; every rank holds one S-byte buffer.
//!
//! Our engine's form of "one immediate per (trainer, inference) pair after
//! its last tensor": the immediate rides on every tensor write of the pair
//! and the inference rank's counter for that trainer waits for all of them
//! (`expected_imms` per write). libfabric promises no order between writes,
//! so a separate zero-byte immediate after the last write would not prove
//! the earlier ones landed; the pair still completes on exactly one counter.

use std::sync::Arc;
use std::time::Instant;

use transfer_core::{DoneFlag, LocalRegion, Notify, WriteRequest, WriteShape};

use crate::backend::GUARD;
use crate::error::{BenchError, Result, protocol};
use crate::workloads::coord::{Ctx, RankWork, Remote, imm};
use crate::workloads::signal::wait_flags;
use crate::workloads::signal::{self, Armed};
use crate::workloads::spec::{Tensor, WeightsParams};
use crate::workloads::unit_io::{check_unit, write_unit};

/// Why our row is not literally the spec's notification (for the record's note).
pub const NOTE: &str = "ours: the pair's immediate rides on each of the trainer's tensor writes \
     and the inference rank counts them (a trailing zero-byte immediate in a later submit call \
     would not prove the earlier writes landed: tcp and shm order an immediate only after the \
     writes of its own call, EFA not at all)";

struct Weights {
    p: WeightsParams,
    tensors: Vec<Tensor>,
    region: LocalRegion,
}

/// Opens one rank: an S-byte buffer.
pub fn setup(ctx: &Ctx, params: &serde_json::Value) -> Result<Box<dyn RankWork>> {
    let p: WeightsParams = serde_json::from_value(params.clone())
        .map_err(|e| BenchError::Usage(format!("weights params: {e}")))?;
    if p.trainers == 0 || p.inference == 0 || (p.trainers + p.inference) as usize != ctx.world {
        return Err(BenchError::Usage(format!(
            "weights: M={} + N={} ranks, but the job has {}",
            p.trainers, p.inference, ctx.world
        )));
    }
    if p.total_bytes == 0 || p.total_bytes % 4096 != 0 || p.total_bytes > 1 << 40 {
        return Err(BenchError::Usage(
            "weights: S must be a non-zero multiple of 4 KiB, at most 1 TiB".into(),
        ));
    }
    let len = usize::try_from(p.total_bytes)
        .map_err(|_| BenchError::Usage("weights: S too large".into()))?;
    let region = ctx.engine.alloc_host(len, 0)?;
    Ok(Box::new(Weights {
        p,
        tensors: p.tensors(),
        region,
    }))
}

impl RankWork for Weights {
    fn region(&self) -> &LocalRegion {
        &self.region
    }

    fn iterate(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        if (ctx.rank as u64) < self.p.trainers {
            self.train(ctx, peers, it)
        } else {
            self.infer(ctx, peers, it)
        }
    }
}

impl Weights {
    fn owned(&self, m: u64) -> impl Iterator<Item = (u64, &Tensor)> {
        let mm = self.p.trainers;
        self.tensors
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i as u64 % mm == m)
            .map(|(i, t)| (i as u64, t))
    }

    fn train(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        let m = ctx.rank as u64;
        let mut scratch = Vec::new();
        for (i, t) in self.owned(m) {
            write_unit(&self.region, t.offset, t.len, i, it, &mut scratch)?;
        }
        let inference: Vec<&Remote> = peers
            .iter()
            .skip(self.p.trainers as usize)
            .map(|p| {
                p.as_ref()
                    .ok_or_else(|| protocol("weights", "missing inference rank"))
            })
            .collect::<Result<_>>()?;
        ctx.barrier(peers, imm::barrier(0, it))?;
        let start = Instant::now();
        let mut flags: Vec<Arc<DoneFlag>> = Vec::new();
        for (_, t) in self.owned(m) {
            for n in &inference {
                let flag = DoneFlag::new();
                ctx.engine.submit_write(
                    WriteRequest {
                        src: &self.region,
                        src_offset: t.offset,
                        dst: &n.target,
                        dst_offset: t.offset,
                        len: t.len,
                        imm: Some(imm::weights(ctx.rank)),
                    },
                    Notify::Flag(flag.clone()),
                )?;
                flags.push(flag);
            }
        }
        let mut out = Vec::new();
        if ctx.rank == 0 {
            ctx.take_imms(imm::ACK, self.p.inference, "an inference rank's ack")?;
            out.push(start.elapsed().as_secs_f64());
        }
        wait_flags(&ctx.engine, &flags)?;
        Ok(out)
    }

    fn infer(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        let mut arms: Vec<Armed> = Vec::new();
        for m in 0..self.p.trainers {
            let trainer = peers
                .get(m as usize)
                .and_then(Option::as_ref)
                .ok_or_else(|| protocol("weights", "missing trainer"))?;
            let mut count = 0u64;
            for (_, t) in self.owned(m) {
                count += ctx.engine.expected_imms(
                    &trainer.addr,
                    0,
                    0,
                    WriteShape::Single { len: t.len },
                )?;
            }
            if count > 0 {
                arms.push(signal::arm(
                    &ctx.engine,
                    imm::weights(m as usize),
                    count,
                    "a trainer's tensors",
                ));
            }
        }
        let first = peers
            .first()
            .and_then(Option::as_ref)
            .ok_or_else(|| protocol("weights", "missing trainer 0"))?;
        ctx.barrier(peers, imm::barrier(0, it))?;
        let deadline = Instant::now() + GUARD;
        for a in &mut arms {
            a.wait(deadline)?;
        }
        let ack = ctx.notify(&self.region, &first.target, imm::ACK)?;
        wait_flags(&ctx.engine, &[ack])?;
        let mut scratch = Vec::new();
        for (i, t) in self.tensors.iter().enumerate() {
            check_unit(
                &self.region,
                t.offset,
                t.len,
                i as u64,
                it,
                "weights",
                &mut scratch,
            )?;
        }
        Ok(Vec::new())
    }
}
