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
    let desc = RemoteRegion::from_bytes(&lane.descriptor).unwrap();
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
