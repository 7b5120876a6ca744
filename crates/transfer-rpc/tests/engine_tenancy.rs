//! Issue 22, the engine link between tenants, over the real libfabric `tcp`
//! provider on loopback (skips, or fails under TRANSFER_REQUIRE, where it
//! cannot open): one tenant's immediate flood on its own lane must not make
//! another tenant's immediates be dropped, and ENGINE_OPEN_OUTBOUND goes
//! only where `--peer-allow` says, decided before anything is resolved.
#![cfg(feature = "engine")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use transfer_core::{EngineAddress, TransferEngine};
use transfer_rpc::client::{Client, EngineWrite};
use transfer_rpc::engine_link::session_state::nic_host;
use transfer_rpc::engine_link::{EngineLink, EngineLinkConfig};
use transfer_rpc::protocol::RpcTensor;
use transfer_rpc::protocol::engine::{CloseKind, LaneId, OutboundId, lane_imm};
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{ServerConfig, ServerHandle};

/// An engine on libfabric tcp bound to loopback whose engine-wide cap on
/// unexpected immediates is `engine_cap` (small, so that the flood of the
/// old engine-wide accounting takes 300 writes, not 65,536).
fn link(engine_cap: usize, per_session: usize) -> Option<Arc<EngineLink>> {
    let backend = transfer::Backend::libfabric("tcp")
        .bind("127.0.0.1")
        .peer_timeout(Duration::from_secs(2));
    let domains = match backend.open_domains() {
        Ok(d) => d,
        Err(e) => {
            transfer_core::testing::skip_or_fail("tcp", format!("cannot open tcp: {e}"));
            return None;
        }
    };
    let engine = domains
        .add_to(TransferEngine::builder().max_unexpected_imms(engine_cap))
        .build()
        .unwrap();
    let mut c = EngineLinkConfig::loopback("tcp");
    c.peer_timeout = Duration::from_secs(2);
    c.max_unexpected_imms_per_session = per_session;
    Some(EngineLink::with_engine(engine, "tcp".into(), c).unwrap())
}

fn server(link: &Arc<EngineLink>, allow: PeerAllow) -> ServerHandle {
    start(ServerConfig {
        memory_quota: 16 << 20,
        max_buffer_size: 16 << 20,
        engine: Some(Arc::clone(link)),
        peer_allow: allow,
        ..ServerConfig::default()
    })
}

/// A client with a 4 KiB buffer and a 1 KiB tensor in it.
fn tenant(h: &ServerHandle) -> (Client, u64, RpcTensor) {
    let mut c = connect(h);
    let (b, base) = alloc(&mut c, 4096);
    (c, b, f32_tensor(1, b, base, 0, 256))
}

/// Opens a lane from `src` (on server A) into `dst`'s buffer (on server B).
fn lane(src: &mut Client, dst: &mut Client, dst_buf: u64) -> (LaneId, Option<OutboundId>) {
    let a = src.engine_info().unwrap().address;
    let b = dst.engine_info().unwrap().address;
    let inb = dst
        .engine_open_inbound(dst_buf, 0, 1024, &a)
        .unwrap()
        .expect("inbound");
    let out = src
        .engine_open_outbound(&b, &inb.descriptor, inb.lane)
        .unwrap();
    (inb.lane, out)
}

fn write(out: OutboundId, t: &RpcTensor, seq: u32) -> EngineWrite<'_> {
    EngineWrite {
        outbound: out,
        src: t,
        src_offset: 0,
        size: 64,
        dst_offset: 0,
        seq,
    }
}

#[test]
fn an_immediate_flood_on_ones_own_lane_leaves_other_tenants_alone() {
    let (Some(la), Some(lb)) = (link(256, 64), link(256, 64)) else {
        return;
    };
    let loopback = loopback_peers();
    let (sa, sb) = (server(&la, loopback.clone()), server(&lb, loopback));
    // The attacker: 300 writes with distinct seqs on its own lane, never
    // waited for (more distinct immediates than the engine-wide cap).
    let (mut att_a, _, att_t) = tenant(&sa);
    let (mut att_b, att_buf, _) = tenant(&sb);
    let (att_lane, att_out) = lane(&mut att_a, &mut att_b, att_buf);
    let att_out = att_out.expect("outbound");
    for seq in 0..300 {
        assert!(att_a.engine_write(&write(att_out, &att_t, seq)).unwrap());
    }
    // Let them land (tcp completes at the sender before placement).
    std::thread::sleep(Duration::from_millis(500));
    let dropped = lb.engine().imm_dropped();
    assert_eq!(
        lb.engine().imm_value(lane_imm(att_lane, 0)),
        1,
        "the attacker's first writes are held for its wait"
    );
    // The victim: its write lands before its wait (the usual order when
    // the destination is behind), so its immediate is held unexpected.
    let (mut vic_a, _, vic_t) = tenant(&sa);
    let (mut vic_b, vic_buf, vic_dst) = tenant(&sb);
    let (vic_lane, vic_out) = lane(&mut vic_a, &mut vic_b, vic_buf);
    let vic_out = vic_out.expect("outbound");
    vic_a.set_tensor(&vic_t, 0, &[0x5A; 64]).unwrap();
    assert!(vic_a.engine_write(&write(vic_out, &vic_t, 0)).unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let ok = vic_b.engine_wait(vic_lane, 0, 64, 2000).unwrap();
    println!(
        "attacker's flood: {dropped} of its immediates dropped; the victim's wait: {ok}; \
         engine total dropped {}",
        lb.engine().imm_dropped()
    );
    assert!(dropped >= 300 - 64, "the attacker's own account is full");
    assert!(ok, "the victim's immediate was dropped");
    assert_eq!(vic_b.get_tensor(&vic_dst, 0, 64).unwrap(), vec![0x5A; 64]);
    // Closing the lane releases what the attacker held.
    assert!(att_b.engine_close(CloseKind::Inbound, att_lane.0).unwrap());
    assert_eq!(lb.engine().imm_value(lane_imm(att_lane, 0)), 0);
}

/// `--peer-allow` for engine destinations, decided before the address is
/// resolved: a refused destination is answered at once, whether it is
/// reachable (another server on loopback) or not (an internal address).
#[test]
fn engine_open_outbound_goes_only_where_the_operator_allows() {
    let (Some(la), Some(la2), Some(lb)) = (link(4096, 64), link(4096, 64), link(4096, 64)) else {
        return;
    };
    let sa = server(&la, loopback_peers());
    let strict = server(&la2, PeerAllow::parse(&["10.0.0.0/8".into()]).unwrap());
    let sb = server(&lb, loopback_peers());
    let (mut b, b_buf, _) = tenant(&sb);
    let b_addr = b.engine_info().unwrap().address;
    let open_from = |h: &ServerHandle, dest: &[u8], b: &mut Client| {
        let mut a = connect(h);
        let a_addr = a.engine_info().unwrap().address;
        let inb = b
            .engine_open_inbound(b_buf, 0, 1024, &a_addr)
            .unwrap()
            .expect("inbound");
        let t0 = Instant::now();
        let out = a
            .engine_open_outbound(dest, &inb.descriptor, inb.lane)
            .unwrap();
        (out, t0.elapsed())
    };
    // Allowed (loopback): opened.
    let (out, _) = open_from(&sa, &b_addr, &mut b);
    assert!(out.is_some(), "a loopback destination under `loopback`");
    // Not allowed (only 10/8), though reachable: refused.
    let (out, took) = open_from(&strict, &b_addr, &mut b);
    println!("reachable but not allowed: refused after {took:?}");
    assert!(out.is_none(), "a destination outside --peer-allow");
    // The same address rewritten to an internal host: refused at once,
    // without a connection attempt (which takes the 2 s peer timeout).
    let mut forged = EngineAddress::from_bytes(&b_addr).unwrap();
    let nic = &mut forged.groups[0].nics[0].0;
    let (ip, _) = nic_host(nic).expect("a tcp NIC address has an IP");
    assert!(ip.is_loopback());
    let at = 8 + usize::from(nic[3]) + 4;
    nic[at..at + 4].copy_from_slice(&[10, 255, 255, 1]);
    assert_eq!(
        nic_host(nic).map(|(ip, _)| ip.to_string()).as_deref(),
        Some("10.255.255.1")
    );
    let (out, took) = open_from(&sa, &forged.to_bytes().unwrap(), &mut b);
    println!("internal address: refused after {took:?}");
    assert!(out.is_none());
    assert!(
        took < Duration::from_millis(500),
        "{took:?}: a connection was tried"
    );
}
