//! moe: dispatch + combine (WORKLOADS.md, "moe") over E ranks.
//!
//! Rank r's region: its T dispatch rows (H bytes, fp8), then the dispatch
//! rows it receives (one area per source rank, in rank order, slot k of
//! source s at k*H), then the combine rows it sends back (same slots, 2H
//! bytes, bf16), then the combine rows it receives (one area per
//! destination rank), then its dispatch rows packed per destination rank.
//! Every rank knows every rank's layout (the routing is
//! computed from the seed), so no counts or offsets move in the timed part.

use std::sync::Arc;
use std::time::Instant;

use transfer_core::{DoneFlag, LocalRegion, Notify, WriteRequest, WriteShape};

use crate::backend::GUARD;
use crate::error::{BenchError, Result, protocol};
use crate::workloads::coord::{Ctx, RankWork, Remote, imm};
use crate::workloads::signal;
use crate::workloads::signal::wait_flags;
use crate::workloads::spec::{MoeParams, Routing};
use crate::workloads::unit_io::{check_unit, write_unit};

/// Byte offsets of one rank's areas.
#[derive(Debug, Clone)]
struct Layout {
    /// Dispatch rows received from source s.
    drecv: Vec<u64>,
    /// Combine rows to send back to source s.
    csend: Vec<u64>,
    /// Combine rows received from destination d.
    crecv: Vec<u64>,
    /// Dispatch rows packed for destination d (its tokens in order).
    dsend: Vec<u64>,
    len: u64,
}

fn layout(rt: &Routing, p: &MoeParams, r: usize) -> Layout {
    let e = p.ranks as usize;
    let (h, c) = (p.hidden, 2 * p.hidden);
    let mut off = p.tokens * h;
    let mut drecv = Vec::with_capacity(e);
    for s in 0..e {
        drecv.push(off);
        off += rt.count[s][r] * h;
    }
    let mut csend = Vec::with_capacity(e);
    for s in 0..e {
        csend.push(off);
        off += rt.count[s][r] * c;
    }
    let mut crecv = Vec::with_capacity(e);
    for d in 0..e {
        crecv.push(off);
        off += rt.count[r][d] * c;
    }
    let mut dsend = Vec::with_capacity(e);
    for d in 0..e {
        dsend.push(off);
        off += rt.count[r][d] * h;
    }
    Layout {
        drecv,
        csend,
        crecv,
        dsend,
        len: off.max(1),
    }
}

struct Moe {
    p: MoeParams,
    rt: Routing,
    layouts: Vec<Layout>,
    region: LocalRegion,
    /// The weighted sums (T x H f32), kept so the work is not optimised away.
    out: Vec<f32>,
}

/// Opens one rank.
pub fn setup(ctx: &Ctx, params: &serde_json::Value) -> Result<Box<dyn RankWork>> {
    let p: MoeParams = serde_json::from_value(params.clone())
        .map_err(|e| BenchError::Usage(format!("moe params: {e}")))?;
    p.check().map_err(BenchError::Usage)?;
    if p.ranks as usize != ctx.world {
        return Err(BenchError::Usage(format!(
            "moe: E={} but the job has {} ranks",
            p.ranks, ctx.world
        )));
    }
    let rt = p.routing();
    let layouts: Vec<Layout> = (0..ctx.world).map(|r| layout(&rt, &p, r)).collect();
    let len = usize::try_from(layouts[ctx.rank].len)
        .map_err(|_| BenchError::Usage("moe: region too large".into()))?;
    let region = ctx.engine.alloc_host(len, 0)?;
    let out = vec![0f32; (p.tokens * p.hidden) as usize];
    Ok(Box::new(Moe {
        p,
        rt,
        layouts,
        region,
        out,
    }))
}

impl RankWork for Moe {
    fn region(&self) -> &LocalRegion {
        &self.region
    }

    fn iterate(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<Vec<f64>> {
        let dispatch = self.dispatch(ctx, peers, it)?;
        let combine = self.combine(ctx, peers, it)?;
        Ok(vec![dispatch, combine])
    }
}

fn peer(peers: &[Option<Remote>], d: usize) -> Result<&Remote> {
    peers
        .get(d)
        .and_then(Option::as_ref)
        .ok_or_else(|| protocol("moe", format!("no rank {d}")))
}

impl Moe {
    /// Copies `len` bytes inside this rank's region (self rows, packing):
    /// one memcpy, where read_at + write_at through a scratch buffer made two.
    fn copy_rows(&self, from: u64, to: u64, len: u64) -> Result<()> {
        let (from, to, len) = (from as usize, to as usize, len as usize);
        let size = self.region.len();
        let fits = |a: usize| a.checked_add(len).is_some_and(|end| end <= size);
        if !fits(from) || !fits(to) || (from < to + len && to < from + len) {
            return Err(protocol(
                "moe",
                "row copy outside the region or overlapping",
            ));
        }
        // SAFETY: both ranges lie inside the region (checked above) and do
        // not overlap; the region lives as long as `self`. Peers write only
        // the receive areas, never the token rows or the packing area this
        // copies between, and only between barriers this rank takes part in.
        unsafe {
            let base = self.region.as_ptr();
            std::ptr::copy_nonoverlapping(base.add(from), base.add(to), len);
        }
        Ok(())
    }

    fn dispatch(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<f64> {
        let (p, r, e) = (self.p, ctx.rank, ctx.world);
        let h = p.hidden;
        let mut scratch = Vec::new();
        for t in 0..p.tokens {
            write_unit(
                &self.region,
                t * h,
                h,
                MoeParams::dispatch_tag(r as u64, t),
                it,
                &mut scratch,
            )?;
        }
        let mut count = 0u64;
        for s in (0..e).filter(|&s| s != r) {
            let n = self.rt.count[s][r];
            if n > 0 {
                count += ctx.engine.expected_imms(
                    &peer(peers, s)?.addr,
                    0,
                    0,
                    WriteShape::Single { len: n * h },
                )?;
            }
        }
        let mut armed = signal::arm(&ctx.engine, imm::DISPATCH, count, "dispatch rows");
        let mut flags: Vec<Arc<DoneFlag>> = Vec::new();
        flags.extend(ctx.barrier_then(peers, imm::barrier(0, it))?);
        let start = Instant::now();
        // Rows packed per destination, then one contiguous write each (as
        // Open MPI's alltoallv packs; its dispatch_us includes that too).
        // One paged write per destination posted one libfabric write per
        // page (every piece carries the immediate on unordered providers):
        // shm T=8 dispatch took 3.1 ms against Open MPI's 0.19 ms
        // (`bench --workload moe`, load ~7, 2 cores).
        for d in (0..e).filter(|&d| d != r) {
            let toks = &self.rt.tokens[r][d];
            if toks.is_empty() {
                continue;
            }
            let at = self.layouts[r].dsend[d];
            for (k, &t) in toks.iter().enumerate() {
                self.copy_rows(t * h, at + k as u64 * h, h)?;
            }
            let flag = DoneFlag::new();
            ctx.engine.submit_write(
                WriteRequest {
                    src: &self.region,
                    src_offset: at,
                    dst: &peer(peers, d)?.target,
                    dst_offset: self.layouts[d].drecv[r],
                    len: toks.len() as u64 * h,
                    imm: Some(imm::DISPATCH),
                },
                Notify::Flag(flag.clone()),
            )?;
            flags.push(flag);
        }
        let me = self.layouts[r].drecv[r];
        for (k, &t) in self.rt.tokens[r][r].clone().iter().enumerate() {
            self.copy_rows(t * h, me + k as u64 * h, h)?;
        }
        armed.wait(Instant::now() + GUARD)?;
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        wait_flags(&ctx.engine, &flags)?;
        // Untimed: every received row, from every source, in its slot.
        for s in 0..e {
            for (k, &t) in self.rt.tokens[s][r].iter().enumerate() {
                let at = self.layouts[r].drecv[s] + k as u64 * h;
                check_unit(
                    &self.region,
                    at,
                    h,
                    MoeParams::dispatch_tag(s as u64, t),
                    it,
                    "moe dispatch",
                    &mut scratch,
                )?;
            }
        }
        Ok(elapsed)
    }

    fn combine(&mut self, ctx: &Ctx, peers: &[Option<Remote>], it: u64) -> Result<f64> {
        let (p, r, e) = (self.p, ctx.rank, ctx.world);
        let c = 2 * p.hidden;
        let mut scratch = Vec::new();
        // The expert outputs this rank sends back, one per received row.
        for s in 0..e {
            for (k, &t) in self.rt.tokens[s][r].iter().enumerate() {
                let at = self.layouts[r].csend[s] + k as u64 * c;
                write_unit(
                    &self.region,
                    at,
                    c,
                    MoeParams::combine_tag(r as u64, s as u64, t),
                    it,
                    &mut scratch,
                )?;
            }
        }
        let mut count = 0u64;
        for d in (0..e).filter(|&d| d != r) {
            let n = self.rt.count[r][d];
            if n > 0 {
                count += ctx.engine.expected_imms(
                    &peer(peers, d)?.addr,
                    0,
                    0,
                    WriteShape::Single { len: n * c },
                )?;
            }
        }
        let mut armed = signal::arm(&ctx.engine, imm::COMBINE, count, "combine rows");
        let mut flags: Vec<Arc<DoneFlag>> = Vec::new();
        flags.extend(ctx.barrier_then(peers, imm::barrier(1, it))?);
        let start = Instant::now();
        for s in (0..e).filter(|&s| s != r) {
            let n = self.rt.count[s][r];
            if n == 0 {
                continue;
            }
            let flag = DoneFlag::new();
            ctx.engine.submit_write(
                WriteRequest {
                    src: &self.region,
                    src_offset: self.layouts[r].csend[s],
                    dst: &peer(peers, s)?.target,
                    dst_offset: self.layouts[s].crecv[r],
                    len: n * c,
                    imm: Some(imm::COMBINE),
                },
                Notify::Flag(flag.clone()),
            )?;
            flags.push(flag);
        }
        let own = self.rt.count[r][r] * c;
        if own > 0 {
            self.copy_rows(self.layouts[r].csend[r], self.layouts[r].crecv[r], own)?;
        }
        armed.wait(Instant::now() + GUARD)?;
        self.weighted_sum(r)?;
        let elapsed = start.elapsed().as_secs_f64() * 1e6;
        wait_flags(&ctx.engine, &flags)?;
        for d in 0..e {
            for (k, &t) in self.rt.tokens[r][d].iter().enumerate() {
                let at = self.layouts[r].crecv[d] + k as u64 * c;
                check_unit(
                    &self.region,
                    at,
                    c,
                    MoeParams::combine_tag(d as u64, r as u64, t),
                    it,
                    "moe combine",
                    &mut scratch,
                )?;
            }
        }
        Ok(elapsed)
    }

    /// out[t] = sum over destinations d of weight(r, t, d) * row(d, r, t), bf16 -> f32.
    fn weighted_sum(&mut self, r: usize) -> Result<()> {
        let h = self.p.hidden as usize;
        let lay = &self.layouts[r];
        let start = *lay
            .crecv
            .first()
            .ok_or_else(|| protocol("moe", "no ranks"))? as usize;
        let len = lay.len as usize - start;
        if len == 0 || self.region.len() < start + len {
            return Ok(());
        }
        // SAFETY: the combine area [start, start + len) lies inside the
        // region (checked above), which lives as long as `self`. Every
        // write into it has landed (the counter reached its target) and the
        // next ones only come after the next iteration's barrier, which
        // this rank joins after this borrow ends: nothing writes the bytes
        // while the slice is read.
        let area: &[u8] =
            unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(start), len) };
        for (t, dests) in self.rt.dests[r].iter().enumerate() {
            let out = &mut self.out[t * h..(t + 1) * h];
            out.fill(0.0);
            for (j, &(d, w)) in dests.iter().enumerate() {
                let slot = self.rt.slot[r][t][j] as usize;
                let at = (lay.crecv[d] as usize - start) + slot * 2 * h;
                let row = area
                    .get(at..at + 2 * h)
                    .ok_or_else(|| protocol("moe", "combine row out of the area"))?;
                for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *o += w * f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            }
        }
        std::hint::black_box(&self.out);
        Ok(())
    }
}
