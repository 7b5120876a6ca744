//! The engine extension under a hostile sender (issue 11): a peer that holds
//! one lane's descriptor rewrites it to reach the rest of the buffer, or
//! guesses another registration's key. Over the real libfabric `tcp`
//! provider on loopback (skips, or fails under TRANSFER_REQUIRE, where it
//! cannot open).
#![cfg(feature = "engine")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use transfer_core::{EngineAddress, RemoteKey, RemoteRegion, WriteRequest};
use transfer_rpc::client::EngineWrite;
use transfer_rpc::engine_link::ticket::LaneTicket;
use transfer_rpc::engine_link::{EngineLink, EngineLinkConfig};
use transfer_rpc::server::{ServerConfig, ServerHandle};

fn link() -> Option<Arc<EngineLink>> {
    let mut c = EngineLinkConfig::loopback("tcp");
    c.peer_timeout = Duration::from_secs(2);
    match EngineLink::open(c) {
        Ok(l) => Some(l),
        Err(e) => {
            transfer_core::testing::skip_or_fail("tcp", format!("cannot open the engine: {e}"));
            None
        }
    }
}

fn server(link: &Arc<EngineLink>) -> ServerHandle {
    start(ServerConfig {
        memory_quota: 16 << 20,
        max_buffer_size: 16 << 20,
        engine: Some(Arc::clone(link)),
        ..ServerConfig::default()
    })
}

const BUF: u64 = 64 << 10;
const LANE_AT: u64 = 8192;
const LANE_LEN: u64 = 1024;

/// Writes `len` bytes of 0xEE from `attacker`'s engine to `desc` at
/// `offset`; waits for whatever the sender learns.
fn hostile_write(attacker: &EngineLink, victim: &[u8], desc: RemoteRegion, offset: u64, len: u64) {
    let e = attacker.engine();
    let src = e.alloc_host(len as usize, 0).unwrap();
    src.write_at(0, &vec![0xEE; len as usize]).unwrap();
    let addr = EngineAddress::from_bytes(victim).unwrap();
    let peer = e.peer(&addr).unwrap();
    let Ok(target) = e.remote(&peer, desc) else {
        return;
    };
    if let Ok(p) = e.write(WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &target,
        dst_offset: offset,
        len,
        imm: None,
    }) {
        let _ = p.wait_timeout(Duration::from_secs(3));
    }
    // A refused write reaches the target after the sender's completion on
    // tcp: give it time to land if it were going to.
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn a_lane_descriptor_reaches_its_range_and_nothing_else() {
    let (Some(attacker), Some(lb)) = (link(), link()) else {
        return;
    };
    let sb = server(&lb);
    let mut owner = connect(&sb);
    let (h, base) = alloc(&mut owner, BUF);
    let whole = f32_tensor(1, h, base, 0, (BUF / 4) as u32);
    let lane = owner
        .engine_open_inbound(h, LANE_AT, LANE_LEN, attacker.address_bytes())
        .unwrap()
        .expect("inbound lane");
    let desc = LaneTicket::from_bytes(&lane.descriptor).unwrap().data;
    assert_eq!(desc.len, LANE_LEN);

    // 1. The descriptor rewritten to start at the buffer's first byte and
    //    span all of it (what a whole-buffer registration allowed).
    let mut widened = desc.clone();
    widened.len = BUF;
    for nic in &mut widened.nics {
        nic.base = nic.base.wrapping_sub(LANE_AT);
    }
    hostile_write(&attacker, lb.address_bytes(), widened, 0, BUF);
    // 2. The lane's own base, running past its end.
    let mut longer = desc.clone();
    longer.len = BUF;
    hostile_write(&attacker, lb.address_bytes(), longer, 0, LANE_LEN + 4096);
    // 3. Neighbouring keys (a counter would have named other buffers).
    for delta in [1u64, 2, u64::MAX] {
        let mut guessed = desc.clone();
        for nic in &mut guessed.nics {
            nic.key = RemoteKey(nic.key.0.wrapping_add(delta));
        }
        hostile_write(&attacker, lb.address_bytes(), guessed, 0, 64);
    }

    let bytes = owner.get_tensor(&whole, 0, BUF).unwrap();
    let outside: Vec<usize> = bytes
        .iter()
        .enumerate()
        .filter(|&(i, &b)| {
            let i = i as u64;
            b != 0 && !(LANE_AT..LANE_AT + LANE_LEN).contains(&i)
        })
        .map(|(i, _)| i)
        .collect();
    assert!(
        outside.is_empty(),
        "{} bytes outside the lane were written (first at {:?})",
        outside.len(),
        outside.first()
    );

    // Closing the lane unregisters its range.
    assert_eq!(lb.targets(), 1);
    assert!(
        owner
            .engine_close(
                transfer_rpc::protocol::engine::CloseKind::Inbound,
                lane.lane.0
            )
            .unwrap()
    );
    assert_eq!(lb.targets(), 0);
}

/// Issue 11: a client with a session on the *sending* server names another
/// tenant's lane (its own ticket, the victim's lane id) and sends the
/// immediate the victim waits for. The victim's wait must not succeed on
/// it; the real write still completes the next wait with the real data.
#[test]
fn a_stray_immediate_does_not_complete_another_sessions_wait() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let n = 1024u32;
    let bytes = u64::from(n) * 4;
    // The victim: a lane on B, an outbound from its session on A.
    let mut vb = connect(&sb);
    let (hb, bb) = alloc(&mut vb, BUF);
    let vdst = f32_tensor(1, hb, bb, 0, n);
    let lane = vb
        .engine_open_inbound(hb, 0, bytes, la.address_bytes())
        .unwrap()
        .expect("victim lane");
    let mut va = connect(&sa);
    let (ha, ba) = alloc(&mut va, BUF);
    let vsrc = f32_tensor(1, ha, ba, 0, n);
    let vout = va
        .engine_open_outbound(lb.address_bytes(), &lane.descriptor, lane.lane)
        .unwrap()
        .expect("victim outbound");
    // The attacker: a lane of its own on B (a valid ticket), used from its
    // own session on A under the victim's lane id.
    let mut xb = connect(&sb);
    let (hx, _) = alloc(&mut xb, BUF);
    let own = xb
        .engine_open_inbound(hx, 0, bytes, la.address_bytes())
        .unwrap()
        .expect("attacker lane");
    let mut xa = connect(&sa);
    let (hxa, bxa) = alloc(&mut xa, BUF);
    let xsrc = f32_tensor(1, hxa, bxa, 0, n);
    let xout = xa
        .engine_open_outbound(lb.address_bytes(), &own.descriptor, lane.lane)
        .unwrap()
        .expect("the sender cannot tell the lane id is not the ticket's");
    let spoof = |seq| EngineWrite {
        outbound: xout,
        src: &xsrc,
        src_offset: 0,
        size: bytes,
        dst_offset: 0,
        seq,
    };
    assert!(xa.engine_write(&spoof(0)).unwrap());
    assert!(
        !vb.engine_wait(lane.lane, 0, bytes, 500).unwrap(),
        "a stray immediate completed the victim's wait"
    );
    // The real write completes the victim's next wait, with its data.
    let data: Vec<u8> = (0..bytes).map(|i| (i % 253) as u8).collect();
    va.set_tensor(&vsrc, 0, &data).unwrap();
    let real = EngineWrite {
        outbound: vout,
        src: &vsrc,
        src_offset: 0,
        size: bytes,
        dst_offset: 0,
        seq: 1,
    };
    assert!(va.engine_write(&real).unwrap());
    assert!(vb.engine_wait(lane.lane, 1, bytes, 5000).unwrap());
    assert_eq!(vb.get_tensor(&vdst, 0, bytes).unwrap(), data);
}
