//! CPU cost per operation: CPU time of both processes (every thread: API,
//! workers, callbacks, the provider's own) divided by the operations of a
//! run, for the engine and for the raw provider loop doing the same writes.
//! Unlike throughput this barely moves with what else the machine runs, so
//! it shows what the engine adds on top of the provider.

use std::time::Duration;

use indicatif::ProgressBar;

use crate::driver::Driver;
use crate::error::{Result, protocol};
use crate::plan::{Plan, human_size};
use crate::proto::{Request, Response};
use crate::results::{Metric, Row};
use crate::sweeps::{REPEATS, timed_writes};

/// CPU time of this process and of server 0's.
fn both_sides(d: &mut Driver) -> Result<Duration> {
    let mine = crate::cpu::process_cpu()
        .ok_or_else(|| protocol("cpu", "this process's CPU time is unavailable"))?;
    let chan = &mut d
        .servers
        .first_mut()
        .ok_or_else(|| protocol("cpu", "no server"))?
        .chan;
    let Response::CpuTime(ns) = chan.call(&Request::CpuTime)? else {
        return Err(protocol("cpu", "unexpected answer to CpuTime"));
    };
    Ok(mine + Duration::from_nanos(ns))
}

fn per_op_us(cpu: Duration, ops: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / ops.max(1) as f64
}

/// One measured point: `count` writes of `size` bytes (with an immediate
/// when `imm`), `window` in flight, by the engine and by the raw loop.
struct Point {
    label: String,
    size: u64,
    imm: bool,
    count: usize,
    window: usize,
}

/// The CPU-per-operation rows (64 B writes with immediates, 1 MiB writes).
pub fn cpu_per_op(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let big = 1u64 << 20;
    let points = [
        Point {
            label: "64 B + imm, cpu/op".into(),
            size: 64,
            imm: true,
            count: plan.imm_count,
            window: plan.window * 4,
        },
        Point {
            label: format!("{}, cpu/op", human_size(big)),
            size: big,
            imm: false,
            count: plan.bw_count(big),
            window: plan.window,
        },
    ];
    let mut rows = Vec::new();
    for p in points {
        pb.set_message(format!("cpu per operation, {}", p.label));
        rows.push(point(d, &p)?);
        pb.inc(1);
    }
    Ok(rows)
}

fn point(d: &mut Driver, p: &Point) -> Result<Row> {
    let t = d.first()?;
    let imm = p.imm.then(|| d.imm());
    let src = d.src.clone();
    let (mut engine, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        d.fresh_pattern(p.size)?;
        let c0 = both_sides(d)?;
        timed_writes(d, &t, p.window, p.count, p.size, imm)?;
        if let Some(imm) = imm {
            // Counted by the receiver: its share of the work is in the figure.
            d.remote_wait_imm(0, vec![0], imm, p.count as u64)?;
        }
        let c1 = both_sides(d)?;
        d.verify_prefix("cpu_per_op", p.size)?;
        engine.push(per_op_us(c1.saturating_sub(c0), p.count));

        let mut setup = d.raw_setup(false)?;
        let r0 = both_sides(d)?;
        let params = transfer_core::rawloop::RawParams {
            imm,
            limit: crate::backend::GUARD,
            ..transfer_core::rawloop::RawParams::new(p.size as usize, p.count, p.window)
        };
        let run = transfer_core::rawloop::run(&mut setup.path(&src), &params, || {});
        let r1 = both_sides(d);
        d.raw_finish(setup, "cpu_per_op", if run.is_ok() { p.size } else { 0 })?;
        run?;
        raw.push(per_op_us(r1?.saturating_sub(r0), p.count));
    }
    Ok(Row::from_repeats(
        "cpu_per_op",
        p.label.clone(),
        p.size,
        Metric::CpuPerOp,
        &engine,
        "raw provider loop",
        &raw,
    )
    .with_target("<= 1.2")
    .verified())
}
