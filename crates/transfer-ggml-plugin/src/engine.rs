//! The engine path of a stage boundary: when both servers run a
//! TransferEngine (`transfer-rpc-server --engine …`, HELLO's engine bit),
//! the source server writes the boundary straight into the destination's
//! buffer with a write-with-immediate (ENGINE_WRITE), and the destination
//! waits for that immediate (ENGINE_WAIT) before its next graph. This is
//! what transfer-rpc's own coordinator does (`pipeline::boundary`, arm
//! `engine`), here one lane per destination range the host copies into.
//!
//! A lane is opened on the first copy into a range (ENGINE_INFO on both,
//! once per server; ENGINE_OPEN_INBOUND on the destination, then
//! ENGINE_OPEN_OUTBOUND on the source) and kept; at most [`MAX_LANES`] are
//! open, after which copies use COPY_TENSOR_TO. A pair whose engines cannot
//! talk (no engine on one side, different backends, a refused open) uses
//! COPY_TENSOR_TO, logged once per pair when both had an engine. Freeing
//! the destination buffer closes its lanes. Per copy, both commands are
//! posted (answers read later, see `conn::check_posted`): the destination
//! server holds its next graph until the write arrived.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use transfer_rpc::protocol::engine::{CloseKind, LaneId, OutboundId};

use crate::abi::LOG_WARN;
use crate::conn::Conn;
use crate::error::Result;
use crate::host;

/// Environment variable: `0` keeps boundaries on COPY_TENSOR_TO even when
/// both servers run an engine.
pub const ENV_ENGINE: &str = "TRANSFER_RPC_ENGINE";
/// Lanes open at once over all pairs (a layer split has one or a few
/// destination ranges per boundary: llama.cpp's pipeline keeps 4 copies of
/// each stage input).
pub const MAX_LANES: usize = 64;

/// One open lane: the source server writes with `outbound`, the
/// destination waits on `lane`.
pub struct Lane {
    /// The source's connection (its outbound target is closed with it).
    pub src: Arc<Conn>,
    /// Inbound lane on the destination.
    pub lane: LaneId,
    /// Outbound target on the source.
    pub outbound: OutboundId,
    /// Bytes of the destination range.
    pub size: u64,
    seq: AtomicU32,
}

impl Lane {
    /// The next write's sequence number (the destination waits for it).
    pub fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    src: String,
    dst: String,
    buffer: u64,
    offset: u64,
    size: u64,
}

#[derive(Default)]
struct Lanes {
    open: HashMap<Key, Arc<Lane>>,
    /// Pairs (source, destination) that do not take the engine path.
    off: Vec<(String, String)>,
}

static LANES: Mutex<Option<Lanes>> = Mutex::new(None);

fn with_lanes<R>(f: impl FnOnce(&mut Lanes) -> R) -> R {
    let mut g = LANES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Lanes::default))
}

fn enabled() -> bool {
    std::env::var(ENV_ENGINE).map_or(true, |v| v.trim() != "0")
}

/// Marks a pair off the engine path; `why` is logged once when given.
fn pair_off(src: &Conn, dst: &Conn, why: Option<&str>) {
    let first = with_lanes(|l| {
        let pair = (src.endpoint().to_owned(), dst.endpoint().to_owned());
        if l.off.contains(&pair) {
            false
        } else {
            l.off.push(pair);
            true
        }
    });
    if let (true, Some(why)) = (first, why) {
        host::log(
            LOG_WARN,
            &format!(
                "{} -> {}: no engine path ({why}); boundary copies use COPY_TENSOR_TO",
                src.endpoint(),
                dst.endpoint()
            ),
        );
    }
}

/// The lane for a copy from `sc` into `size` bytes at `offset` of buffer
/// `buffer` on `dc`, opened on first use; `None`: use COPY_TENSOR_TO.
/// Called on the host's thread; the opening calls wait for both streams
/// to drain (once per range).
pub fn lane_for(
    sc: &Arc<Conn>,
    dc: &Arc<Conn>,
    buffer: u64,
    offset: u64,
    size: u64,
) -> Result<Option<Arc<Lane>>> {
    if !enabled() || size == 0 {
        return Ok(None);
    }
    let key = Key {
        src: sc.endpoint().to_owned(),
        dst: dc.endpoint().to_owned(),
        buffer,
        offset,
        size,
    };
    let (found, off, full) = with_lanes(|l| {
        (
            l.open.get(&key).cloned(),
            l.off.contains(&(key.src.clone(), key.dst.clone())),
            l.open.len() >= MAX_LANES,
        )
    });
    if let Some(lane) = found {
        return Ok(Some(lane));
    }
    if off || full {
        return Ok(None);
    }
    let (Some(from), Some(to)) = (sc.engine_info()?, dc.engine_info()?) else {
        // Not both with an engine: the plain direct path, nothing to say.
        pair_off(sc, dc, None);
        return Ok(None);
    };
    if from.backend != to.backend {
        pair_off(sc, dc, Some("the servers' engines use different backends"));
        return Ok(None);
    }
    let inbound = dc.call("ENGINE_OPEN_INBOUND", |c| {
        c.engine_open_inbound(buffer, offset, size, &from.address)
    })?;
    let Some(inbound) = inbound else {
        pair_off(
            sc,
            dc,
            Some("the destination refused ENGINE_OPEN_INBOUND (see its log)"),
        );
        return Ok(None);
    };
    let outbound = sc.call("ENGINE_OPEN_OUTBOUND", |c| {
        c.engine_open_outbound(&to.address, &inbound.descriptor, inbound.lane)
    })?;
    let Some(outbound) = outbound else {
        dc.call("ENGINE_CLOSE", |c| {
            c.engine_close(CloseKind::Inbound, inbound.lane.0)
        })?;
        pair_off(
            sc,
            dc,
            Some("the source refused ENGINE_OPEN_OUTBOUND: peer unreachable or not allowed"),
        );
        return Ok(None);
    };
    let lane = Arc::new(Lane {
        src: sc.clone(),
        lane: inbound.lane,
        outbound,
        size,
        seq: AtomicU32::new(0),
    });
    with_lanes(|l| l.open.insert(key, lane.clone()));
    Ok(Some(lane))
}

/// Closes the lanes into `buffer` on `dst` (before the buffer is freed):
/// ENGINE_CLOSE of the inbound lane on `dst`, of the outbound target on
/// its source. Refusals are ignored (the session may have closed them).
pub fn forget_buffer(dst: &Conn, buffer: u64) {
    let gone: Vec<Arc<Lane>> = with_lanes(|l| {
        let keys: Vec<Key> = l
            .open
            .keys()
            .filter(|k| k.dst == dst.endpoint() && k.buffer == buffer)
            .cloned()
            .collect();
        keys.iter().filter_map(|k| l.open.remove(k)).collect()
    });
    for lane in gone {
        let (inb, out) = (lane.lane.0, lane.outbound.0);
        let _ = dst.call("ENGINE_CLOSE", |c| c.engine_close(CloseKind::Inbound, inb));
        let _ = lane
            .src
            .call("ENGINE_CLOSE", |c| c.engine_close(CloseKind::Outbound, out));
    }
}
