//! The `serve` role: engines that receive, checksum and echo on request.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use transfer_core::{
    Domain, DoneFlag, EngineAddress, HostBuffer, IdlePolicy, LocalRegion, MemoryLocation,
    MemorySpan, Notify, Peer, RemoteRegion, RemoteTarget, TransferEngine, WriteRequest,
};

use crate::backend::{BackendOpts, GUARD, idle_policy};
use crate::caller::{self, CallerSide};
use crate::error::{BenchError, Result, io, protocol};
use crate::proto::{Channel, Request, Response};
use crate::verify::checksum;

/// Receive-pool echo: buffers and size.
const ECHO_BUFFERS: usize = 64;
const ECHO_BUFFER_LEN: usize = 64 * 1024;

struct Served {
    engine: Arc<TransferEngine>,
    region: LocalRegion,
}

struct RawSink {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Vec<u8>>>,
}

/// Serves drivers one after another on `listener` until a driver says Bye
/// with `once` set, or forever.
pub fn serve(
    listener: &TcpListener,
    opts: &BackendOpts,
    engines: usize,
    region_len: u64,
    once: bool,
) -> Result<()> {
    let len =
        usize::try_from(region_len).map_err(|_| BenchError::Usage("region too large".into()))?;
    let driver: Arc<Mutex<Option<Peer>>> = Arc::new(Mutex::new(None));
    // The caller-progress latency rows need one more engine; without it
    // they are left out, the rest of the bench runs.
    let caller = match CallerSide::open(opts, true) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("transfer-bench serve: no caller-driven engine: {e}");
            None
        }
    };
    let mut served = Vec::new();
    for i in 0..engines.max(1) {
        let engine = Arc::new(opts.engine()?);
        let region = engine.alloc_host(len, 0)?;
        if i == 0 {
            start_echo_pool(&engine, driver.clone())?;
        }
        served.push(Served { engine, region });
    }
    loop {
        let (stream, _) = listener.accept().map_err(io("serve: accept"))?;
        let mut chan = Channel::new(stream)?;
        let result = session(&mut chan, &served, caller.as_ref(), opts, &driver);
        if let Err(e) = &result {
            eprintln!("transfer-bench serve: session ended: {e}");
            let _ = chan.send(&Response::Error(e.to_string()));
        }
        if once {
            return result;
        }
    }
}

fn start_echo_pool(engine: &Arc<TransferEngine>, driver: Arc<Mutex<Option<Peer>>>) -> Result<()> {
    let weak: Weak<TransferEngine> = Arc::downgrade(engine);
    engine.start_recv_pool(ECHO_BUFFERS, ECHO_BUFFER_LEN, move |bytes| {
        let peer = driver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let (Some(e), Some(p)) = (weak.upgrade(), peer) {
            // Echo failures surface on the driver as a missing reply.
            let _ = e.submit_send(&p, bytes, Notify::callback(|_| {}));
        }
    })?;
    Ok(())
}

fn session(
    chan: &mut Channel,
    served: &[Served],
    caller: Option<&CallerSide>,
    opts: &BackendOpts,
    driver: &Mutex<Option<Peer>>,
) -> Result<()> {
    let mut replies: Vec<RemoteTarget> = Vec::new();
    let mut caller_reply: Option<RemoteTarget> = None;
    let mut raw: Option<RawSink> = None;
    while let Some(req) = chan.recv::<Request>()? {
        let resp = match req {
            Request::Hello {
                driver_addr,
                driver_region,
                driver_caller,
            } => {
                caller_reply = match (caller, &driver_caller) {
                    (Some(c), Some((addr, region))) => Some(c.set_peer(addr, region)?),
                    _ => None,
                };
                let addr = EngineAddress::from_bytes(&driver_addr)?;
                let region = RemoteRegion::from_bytes(&driver_region)?;
                replies.clear();
                for s in served {
                    let peer = s.engine.peer(&addr)?;
                    replies.push(s.engine.remote(&peer, region.clone())?);
                }
                let first = served
                    .first()
                    .ok_or_else(|| protocol("serve", "no engine"))?;
                *driver.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(first.engine.peer(&addr)?);
                let mut engines = Vec::new();
                for s in served {
                    engines.push((
                        s.engine.address().to_bytes()?,
                        s.region.remote().to_bytes()?,
                    ));
                }
                Response::Engines {
                    engines,
                    provider: opts.provider()?.to_string(),
                    caller: caller.map(CallerSide::describe).transpose()?,
                }
            }
            Request::Checksum {
                engine,
                offset,
                len,
            } => {
                let s = pick(served, engine)?;
                let mut buf =
                    vec![0u8; usize::try_from(len).map_err(|_| protocol("checksum", "length"))?];
                s.region.read_at(
                    usize::try_from(offset).map_err(|_| protocol("checksum", "offset"))?,
                    &mut buf,
                )?;
                Response::Checksum(checksum(&buf))
            }
            Request::WaitImm {
                engines,
                imm,
                count,
            } => {
                for e in engines {
                    pick(served, e)?.engine.wait_imm(imm, count, GUARD)?;
                }
                Response::Done
            }
            Request::Echo {
                engines,
                imm,
                reply_imm,
                iters,
            } => {
                echo(served, &replies, &engines, imm, reply_imm, iters)?;
                Response::Done
            }
            Request::CallerServe {
                imm,
                reply_imm,
                stop_imm,
            } => {
                let (Some(c), Some(reply)) = (caller, &caller_reply) else {
                    return Err(protocol("caller serve", "no caller-driven engine pair"));
                };
                Response::Checksum(caller::serve_phase(c, reply, imm, reply_imm, stop_imm)?)
            }
            Request::CpuTime => Response::CpuTime(
                crate::cpu::process_cpu()
                    .map_or(0, |c| u64::try_from(c.as_nanos()).unwrap_or(u64::MAX)),
            ),
            Request::RawStart { len, busy } => {
                if raw.is_some() {
                    return Err(protocol("raw", "raw sink already running"));
                }
                let (sink, resp) = raw_start(opts, len, busy)?;
                raw = Some(sink);
                resp
            }
            Request::RawStop { len } => {
                let sink = raw.take().ok_or_else(|| protocol("raw", "no raw sink"))?;
                sink.stop.store(true, Ordering::Release);
                let buf = sink
                    .thread
                    .join()
                    .map_err(|_| protocol("raw", "sink thread panicked"))??;
                let n = usize::try_from(len).unwrap_or(usize::MAX).min(buf.len());
                Response::Checksum(checksum(&buf[..n]))
            }
            Request::Bye => {
                chan.send(&Response::Done)?;
                return Ok(());
            }
        };
        chan.send(&resp)?;
    }
    Ok(())
}

fn pick(served: &[Served], i: usize) -> Result<&Served> {
    served
        .get(i)
        .ok_or_else(|| protocol("serve", format!("no engine {i}")))
}

/// Each listed engine answers every `imm` with a zero-byte `reply_imm` write.
fn echo(
    served: &[Served],
    replies: &[RemoteTarget],
    engines: &[usize],
    imm: u32,
    reply_imm: u32,
    iters: u64,
) -> Result<()> {
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .iter()
            .map(|&e| {
                s.spawn(move || -> Result<()> {
                    let sv = pick(served, e)?;
                    let reply = replies
                        .get(e)
                        .ok_or_else(|| protocol("echo", "Hello first"))?;
                    let mut flags = Vec::with_capacity(iters as usize);
                    for _ in 0..iters {
                        let deadline = Instant::now() + GUARD;
                        // Busy-poll like fi_pingpong does: this measures the
                        // engine's latency, not the OS's wake-up latency.
                        while sv.engine.take_imm(imm, 1) == 0 {
                            if Instant::now() > deadline {
                                return Err(protocol("echo", "timed out waiting for the driver"));
                            }
                            std::thread::yield_now();
                        }
                        let flag = DoneFlag::new();
                        let req = WriteRequest {
                            src: &sv.region,
                            src_offset: 0,
                            dst: reply,
                            dst_offset: 0,
                            len: 0,
                            imm: Some(reply_imm),
                        };
                        sv.engine.submit_write(req, Notify::Flag(flag.clone()))?;
                        flags.push(flag);
                    }
                    wait_flags(&flags)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(protocol("echo", "thread panicked")))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Waits for every flag and returns the first error.
pub fn wait_flags(flags: &[Arc<DoneFlag>]) -> Result<()> {
    let deadline = Instant::now() + GUARD;
    flags.iter().try_for_each(|f| wait_flag(f, deadline))
}

/// Yields until `flag` is done (or `deadline` passes) and returns its outcome.
pub fn wait_flag(flag: &DoneFlag, deadline: Instant) -> Result<()> {
    while !flag.is_done() {
        if Instant::now() > deadline {
            return Err(protocol("wait", "completion never arrived"));
        }
        std::thread::yield_now();
    }
    Ok(flag.result().unwrap_or(Ok(()))?)
}

/// The raw baseline's sink: a bare domain driven as the engine's target is
/// (`busy`: without pause, as in the caller-progress rows; otherwise with
/// the engines' idle policy, sleeping on the domain's wait descriptor), so
/// that the ratio to the engine is not a busy sink against a sleeping one.
fn raw_start(opts: &BackendOpts, len: u64, busy: bool) -> Result<(RawSink, Response)> {
    let len = usize::try_from(len).map_err(|_| protocol("raw", "length"))?;
    let mut domain = opts.bare_domain()?;
    let buf = HostBuffer::new(len.max(1))?;
    let reg = domain.register(MemorySpan {
        ptr: buf.as_ptr(),
        len: buf.len(),
        location: MemoryLocation::Host,
        dmabuf_fd: None,
    })?;
    let resp = Response::RawSink {
        nic: domain.address().0,
        base: reg.remote.base,
        key: reg.remote.key.0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || -> Result<Vec<u8>> {
        let policy = if busy {
            IdlePolicy::busy_poll()
        } else {
            idle_policy()
        };
        transfer_core::rawloop::drive_sink(&mut domain, policy, &flag);
        let mut out = vec![0u8; buf.len()];
        // SAFETY: the domain is idle (the driver stopped writing before
        // RawStop) and `buf` is live for this whole scope.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), out.as_mut_ptr(), out.len()) };
        let _ = domain.unregister(reg.mr);
        Ok(out)
    });
    Ok((RawSink { stop, thread }, resp))
}
