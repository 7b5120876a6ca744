//! The sweeps. Each verifies the data it moved and returns report rows.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use transfer_core::{
    DoneFlag, Notify, PagedWriteRequest, Pages, Pending, RemoteTarget, Slice, WriteRequest,
    WriteShape,
};

use crate::backend::GUARD;
use crate::baseline::pingpong;
use crate::driver::Driver;
use crate::error::{BenchError, Result, protocol};
use crate::plan::{Plan, human_size};
use crate::proto::{Request, Response};
use crate::results::{Figure, Metric, Row};
use crate::server::{wait_flag, wait_flags};
use crate::stats;
use crate::verify::checksum;

fn bw(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9)
}

pub(crate) fn fig(value: f64) -> Figure {
    Figure {
        value,
        latency: None,
    }
}

pub(crate) fn lat_fig(samples: &[Duration]) -> Figure {
    let l = stats::latency(samples);
    Figure {
        value: l.map_or(f64::NAN, |l| l.p50_us),
        latency: l,
    }
}

/// Keeps at most `window` transfers in flight; when full, waits for the
/// oldest: a short yielding poll, then a blocking wait, so that on small
/// machines the waiting thread gives its core to the NIC workers.
pub(crate) fn windowed(
    window: usize,
    count: usize,
    mut submit: impl FnMut(usize, Notify) -> Result<()>,
) -> Result<Duration> {
    let mut q: VecDeque<Pending> = VecDeque::with_capacity(window);
    let start = Instant::now();
    for i in 0..count {
        if q.len() >= window {
            if let Some(p) = q.pop_front() {
                wait_pending(p)?;
            }
        }
        let (n, p) = Notify::pending();
        submit(i, n)?;
        q.push_back(p);
    }
    for p in q {
        wait_pending(p)?;
    }
    Ok(start.elapsed())
}

/// `count` writes of `len` bytes from the start of the driver's source to
/// the start of `t` (each with `imm` when set), `window` in flight; returns
/// the time from the first submit to the last completion.
pub(crate) fn timed_writes(
    d: &Driver,
    t: &RemoteTarget,
    window: usize,
    count: usize,
    len: u64,
    imm: Option<u32>,
) -> Result<Duration> {
    windowed(window, count, |_, n| {
        Ok(d.engine.submit_write(
            WriteRequest {
                src: &d.src,
                src_offset: 0,
                dst: t,
                dst_offset: 0,
                len,
                imm,
            },
            n,
        )?)
    })
}

fn wait_pending(p: Pending) -> Result<()> {
    let poll_until = Instant::now() + Duration::from_micros(20);
    while !p.is_done() && Instant::now() < poll_until {
        std::thread::yield_now();
    }
    Ok(p.wait_timeout(GUARD)?)
}

/// Waits for `flag` under the bench's failure guard.
fn spin_flag(flag: &DoneFlag) -> Result<()> {
    wait_flag(flag, Instant::now() + GUARD)
}

/// Spins until `n` immediates `imm` were taken.
fn spin_imm(d: &Driver, imm: u32, n: u64) -> Result<()> {
    let deadline = Instant::now() + GUARD;
    let mut got = 0;
    while got < n {
        got += d.engine.take_imm(imm, n - got);
        if Instant::now() > deadline {
            return Err(protocol(
                "wait",
                format!("only {got} of {n} immediates arrived"),
            ));
        }
        std::thread::yield_now();
    }
    Ok(())
}

/// Interleaved repeats of throughput points: engine, baseline, engine, ...
/// The row reports the medians and the spread of the per-repeat ratios
/// (run-to-run noise on a shared 2-core VM was +-30 % for either alone).
pub(crate) const REPEATS: usize = 3;

/// Single-write bandwidth against the raw loop, size by size.
pub fn write_bandwidth(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let t = d.first()?;
    let mut rows = Vec::new();
    for &size in &plan.bw_sizes {
        pb.set_message(format!("write bandwidth {}", human_size(size)));
        let count = plan.bw_count(size);
        let src = d.src.clone();
        let req = |imm| WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: size,
            imm,
        };
        d.engine.write(req(None))?.wait_timeout(GUARD)?;
        let bytes = size * count as u64;
        let (mut engine, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..REPEATS {
            // A pattern the warm-up (or the previous repeat) did not leave
            // at the destination: the check after the run sees these writes.
            d.fresh_pattern(size)?;
            let el = timed_writes(d, &t, plan.window, count, size, None)?;
            d.verify_prefix("write_bw", size)?;
            engine.push(bw(bytes, el));
            let r = d.raw_point("write_bw", size as usize, count, plan.window, None, false)?;
            raw.push(bw(bytes, r.elapsed));
        }
        let row = Row::from_repeats(
            "write_bw",
            human_size(size),
            size,
            Metric::Bandwidth,
            &engine,
            "raw provider loop",
            &raw,
        )
        .verified();
        rows.push(if size >= 1 << 20 {
            row.with_target(">= 0.95")
        } else {
            row
        });
        pb.inc(1);
    }
    Ok(rows)
}

/// Completion latency of single writes (submit to local completion).
pub fn write_latency(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let t = d.first()?;
    let mut rows = Vec::new();
    for &size in &plan.lat_sizes {
        pb.set_message(format!("write latency {}", human_size(size)));
        d.fresh_pattern(size)?;
        let src = d.src.clone();
        let mut samples = Vec::with_capacity(plan.lat_iters);
        for _ in 0..plan.lat_iters {
            let flag = DoneFlag::new();
            let t0 = Instant::now();
            d.engine.submit_write(
                WriteRequest {
                    src: &src,
                    src_offset: 0,
                    dst: &t,
                    dst_offset: 0,
                    len: size,
                    imm: None,
                },
                Notify::Flag(flag.clone()),
            )?;
            spin_flag(&flag)?;
            samples.push(t0.elapsed());
        }
        d.verify_prefix("write_lat", size)?;
        let r = d.raw_point("write_lat", size as usize, plan.lat_iters, 1, None, false)?;
        rows.push(
            Row::new(
                "write_lat",
                human_size(size),
                size,
                Metric::Latency,
                lat_fig(&samples),
            )
            .with_baseline("raw provider loop", lat_fig(&r.samples))
            .verified()
            .with_target_if(size <= 8, "<= 1.3"),
        );
        pb.inc(1);
    }
    Ok(rows)
}

/// Rate of small writes carrying immediates, all counted by the receiver.
pub fn imm_rate(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    pb.set_message("small immediate-write rate");
    let t = d.first()?;
    let imm = d.imm();
    let size = 64u64;
    let window = plan.window * 4;
    let rate = |e: Duration| plan.imm_count as f64 / e.as_secs_f64().max(1e-9);
    let (mut engine, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..REPEATS {
        d.fresh_pattern(size)?;
        let el = timed_writes(d, &t, window, plan.imm_count, size, Some(imm))?;
        d.remote_wait_imm(0, vec![0], imm, plan.imm_count as u64)?;
        d.verify_prefix("imm_rate", size)?;
        engine.push(rate(el));
        let r = d.raw_point(
            "imm_rate",
            size as usize,
            plan.imm_count,
            window,
            Some(imm),
            false,
        )?;
        raw.push(rate(r.elapsed));
    }
    pb.inc(1);
    Ok(vec![
        Row::from_repeats(
            "imm_rate",
            format!("{} B + imm", size),
            size,
            Metric::Rate,
            &engine,
            "raw provider loop",
            &raw,
        )
        .with_target(">= 0.90")
        .verified(),
    ])
}

/// Paged writes: scattered source pages to contiguous destination pages.
pub fn paged(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let t = d.first()?;
    let mut rows = Vec::new();
    for &(page, pages) in &plan.paged {
        pb.set_message(format!("paged {} x {pages}", human_size(page)));
        if page * pages > plan.region_len {
            pb.inc(1);
            continue;
        }
        let imm = d.imm();
        let reps = ((64u64 << 20) / (page * pages)).clamp(1, 20) as usize;
        let src_pages = Pages {
            indices: (0..pages as u32).rev().collect(),
            stride: page,
            offset: 0,
        };
        let dst_pages = Pages {
            indices: (0..pages as u32).collect(),
            stride: page,
            offset: 0,
        };
        let bytes = page * pages * reps as u64;
        let (mut engine, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..REPEATS {
            d.fresh_pattern(page * pages)?;
            let src = d.src.clone();
            let el = windowed(2, reps, |_, n| {
                let req = PagedWriteRequest {
                    src: &src,
                    src_pages: src_pages.clone(),
                    dst: &t,
                    dst_pages: dst_pages.clone(),
                    page_len: page,
                    imm: Some(imm),
                };
                Ok(d.engine.submit_paged_write(req, n)?)
            })?;
            // The receiver counts what the sender's address says one paged write delivers.
            let expect = expected(
                d,
                &t,
                WriteShape::Paged {
                    pages: pages as usize,
                },
            )? * reps as u64;
            d.remote_wait_imm(0, vec![0], imm, expect)?;
            let mut want = Vec::with_capacity((page * pages) as usize);
            for i in (0..pages).rev() {
                let at = (i * page) as usize;
                want.extend_from_slice(&d.pattern[at..at + page as usize]);
            }
            if d.remote_checksum(0, 0, 0, page * pages)? != checksum(&want) {
                return Err(BenchError::Verify {
                    sweep: "paged".into(),
                    detail: format!("{page} x {pages}"),
                });
            }
            engine.push(bw(bytes, el));
            let r = d.raw_point(
                "paged",
                page as usize,
                (pages as usize) * reps,
                plan.window * 4,
                None,
                false,
            )?;
            raw.push(bw(bytes, r.elapsed));
        }
        rows.push(
            Row::from_repeats(
                "paged",
                format!("{} x {pages}", human_size(page)),
                page,
                Metric::Bandwidth,
                &engine,
                // Not the same work: the raw loop posts the same number of
                // page-sized single writes to one offset, window 64, no
                // immediates; the engine posts paged jobs (2 in flight) to
                // distinct pages with an immediate per job.
                "raw loop, page-sized single writes",
                &raw,
            )
            .verified(),
        );
        pb.inc(1);
    }
    Ok(rows)
}

/// Immediates one transfer of `shape` from this driver delivers to `t`'s engine.
fn expected(d: &Driver, t: &transfer_core::RemoteTarget, shape: WriteShape) -> Result<u64> {
    Ok(d.engine.imms_delivered(t, 0, shape)?)
}

/// Scatter: a different slice to each of G peers (every server engine).
pub fn scatter(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let targets = d.all_targets();
    let g = targets.len() as u64;
    let group = d
        .engine
        .add_group(targets.iter().map(|(_, _, t)| t.clone()).collect());
    let mut rows = Vec::new();
    for &size in &plan.scatter_sizes {
        pb.set_message(format!("scatter {} to {g} peers", human_size(size)));
        if size * g > plan.region_len {
            pb.inc(1);
            continue;
        }
        let imm = d.imm();
        let reps = ((256u64 << 20) / (size * g)).clamp(2, 200) as usize;
        let slices: Vec<Slice> = (0..g)
            .map(|i| Slice {
                src_offset: i * size,
                dst_offset: 0,
                len: size,
            })
            .collect();
        let mut runs = Vec::new();
        for _ in 0..REPEATS {
            d.fresh_pattern(size * g)?;
            let src = d.src.clone();
            let el = windowed(4, reps, |_, n| {
                Ok(d.engine
                    .submit_group_scatter(&src, &group, &slices, Some(imm), n)?)
            })?;
            runs.push(bw(size * g * reps as u64, el));
            for (i, (s, e, t)) in targets.iter().enumerate() {
                let per = expected(d, t, WriteShape::Single { len: size })?;
                d.remote_wait_imm(*s, vec![*e], imm, per * reps as u64)?;
                let want = checksum(&d.pattern[i * size as usize..(i + 1) * size as usize]);
                if d.remote_checksum(*s, *e, 0, size)? != want {
                    return Err(BenchError::Verify {
                        sweep: "scatter".into(),
                        detail: format!("peer {i}, {size} bytes"),
                    });
                }
            }
        }
        let mut row = Row::new(
            "scatter",
            format!("{} x {g} peers", human_size(size)),
            size,
            Metric::Bandwidth,
            fig(crate::results::median(&runs)),
        )
        .verified();
        row.repeats = REPEATS as u32;
        rows.push(row);
        pb.inc(1);
    }
    Ok(rows)
}

/// Barrier over G peers: driver barrier, each peer answers with an
/// immediate; the round trip until all G answers arrived.
pub fn barrier(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let targets = d.all_targets();
    let g = targets.len() as u64;
    pb.set_message(format!("barrier over {g} peers"));
    let (imm, reply) = (d.imm(), d.imm());
    let iters = plan.barrier_iters as u64;
    for (si, s) in d.servers.iter_mut().enumerate() {
        let engines: Vec<usize> = targets
            .iter()
            .filter(|(x, _, _)| *x == si)
            .map(|(_, e, _)| *e)
            .collect();
        s.chan.send(&Request::Echo {
            engines,
            imm,
            reply_imm: reply,
            iters,
        })?;
    }
    let group = d
        .engine
        .add_group(targets.iter().map(|(_, _, t)| t.clone()).collect());
    let mut samples = Vec::with_capacity(plan.barrier_iters);
    let mut flags = Vec::with_capacity(plan.barrier_iters);
    for _ in 0..iters {
        let flag = DoneFlag::new();
        let t0 = Instant::now();
        d.engine
            .submit_group_barrier(&group, imm, Notify::Flag(flag.clone()))?;
        spin_imm(d, reply, g)?;
        samples.push(t0.elapsed());
        flags.push(flag);
    }
    wait_flags(&flags)?;
    collect_done(d)?;
    pb.inc(1);
    Ok(vec![
        Row::new(
            "barrier",
            format!("{g} peers"),
            0,
            Metric::Latency,
            lat_fig(&samples),
        )
        .no_data(),
    ])
}

fn collect_done(d: &mut Driver) -> Result<()> {
    for s in &mut d.servers {
        match s.chan.recv::<Response>()? {
            Some(Response::Done) => {}
            other => return Err(protocol("echo", format!("unexpected {other:?}"))),
        }
    }
    Ok(())
}

/// Zero-byte immediate ping-pong with engine 0 of server 0, next to fi_pingpong.
pub fn imm_pingpong(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    pb.set_message("immediate ping-pong");
    let t = d.first()?;
    let (imm, reply) = (d.imm(), d.imm());
    let iters = plan.pingpong_iters as u64;
    d.servers[0].chan.send(&Request::Echo {
        engines: vec![0],
        imm,
        reply_imm: reply,
        iters,
    })?;
    let src = d.src.clone();
    let mut samples = Vec::with_capacity(plan.pingpong_iters);
    let mut flags = Vec::with_capacity(plan.pingpong_iters);
    for _ in 0..iters {
        let flag = DoneFlag::new();
        let t0 = Instant::now();
        d.engine.submit_write(
            WriteRequest {
                src: &src,
                src_offset: 0,
                dst: &t,
                dst_offset: 0,
                len: 0,
                imm: Some(imm),
            },
            Notify::Flag(flag.clone()),
        )?;
        spin_imm(d, reply, 1)?;
        samples.push(t0.elapsed());
        flags.push(flag);
    }
    wait_flags(&flags)?;
    match d.servers[0].chan.recv::<Response>()? {
        Some(Response::Done) => {}
        other => return Err(protocol("echo", format!("unexpected {other:?}"))),
    }
    pb.inc(1);
    let mut row = Row::new(
        "imm_pingpong",
        "0 B + imm RTT".into(),
        0,
        Metric::Latency,
        lat_fig(&samples),
    )
    .no_data()
    .with_target("<= 1.2");
    if let Some(pp) = fi_pingpong(d, 1, plan.pingpong_iters) {
        row = row.with_baseline(
            "fi_pingpong 1 B RTT",
            Figure {
                value: pp.rtt_us,
                latency: None,
            },
        );
    }
    Ok(vec![row])
}

/// Send/recv round trip through the server's receive pool, next to fi_pingpong.
pub fn send_recv(d: &mut Driver, plan: &Plan, pb: &ProgressBar) -> Result<Vec<Row>> {
    let peer = d.first()?.peer().clone();
    let mut rows = Vec::new();
    for &size in &plan.msg_sizes {
        pb.set_message(format!("send/recv {}", human_size(size)));
        let msg = &d.pattern[..size as usize];
        let want = checksum(msg);
        let mut samples = Vec::with_capacity(plan.pingpong_iters);
        for _ in 0..plan.pingpong_iters {
            let before = d.recv_count.load(Ordering::Acquire);
            let flag = DoneFlag::new();
            let t0 = Instant::now();
            d.engine
                .submit_send(&peer, msg, Notify::Flag(flag.clone()))?;
            let deadline = t0 + GUARD;
            while d.recv_count.load(Ordering::Acquire) == before {
                if Instant::now() > deadline {
                    return Err(protocol("send/recv", "echo never came back"));
                }
                std::thread::yield_now();
            }
            samples.push(t0.elapsed());
            spin_flag(&flag)?;
            if d.recv_sum.load(Ordering::Acquire) != want {
                return Err(BenchError::Verify {
                    sweep: "send_recv".into(),
                    detail: "echoed message differs".into(),
                });
            }
        }
        let mut row = Row::new(
            "send_recv",
            format!("{} RTT", human_size(size)),
            size,
            Metric::Latency,
            lat_fig(&samples),
        )
        .verified()
        .with_target_if(size == 64, "<= 1.3");
        if let Some(pp) = fi_pingpong(d, size as usize, plan.pingpong_iters) {
            row = row.with_baseline(
                "fi_pingpong RTT",
                Figure {
                    value: pp.rtt_us,
                    latency: None,
                },
            );
        }
        rows.push(row);
        pb.inc(1);
    }
    Ok(rows)
}

/// One fi_pingpong run on the same provider (loopback only); `None` when it
/// cannot run here (no libfabric-bin, or remote servers).
pub(crate) fn fi_pingpong(d: &Driver, size: usize, iters: usize) -> Option<pingpong::PingPong> {
    if d.opts.bind.is_some() {
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    match pingpong::run(&d.provider, size, iters, port) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("fi_pingpong baseline unavailable: {e}");
            None
        }
    }
}
