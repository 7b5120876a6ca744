//! ENGINE_* between in-process servers over the real libfabric `tcp`
//! provider on loopback. Skips, saying why, where libfabric cannot load.
#![cfg(feature = "engine")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::RpcError;
use transfer_rpc::client::{Client, ClientConfig, EngineWrite, InboundLane, open_engine_boundary};
use transfer_rpc::engine_link::{EngineLink, EngineLinkConfig};
use transfer_rpc::protocol::engine::{CloseKind, LaneId, MAX_ENGINE_BYTES, OutboundId};
use transfer_rpc::protocol::{Command, RpcTensor};
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{ServerConfig, ServerHandle};

const N: u32 = 4096; // f32 elements per boundary tensor (16 KiB)
const TENSOR_OFFSET: u64 = 256;

/// The backend these tests run the engine link over: libfabric `tcp` on
/// loopback by default; `TRANSFER_RPC_TEST_ENGINE=ibverbs` runs the same
/// tests over the native verbs backend (what `cargo xtask test` does inside
/// its soft-RoCE VM).
fn test_provider() -> String {
    std::env::var("TRANSFER_RPC_TEST_ENGINE").unwrap_or_else(|_| "tcp".into())
}

fn link_with(peer_timeout: Duration) -> Option<Arc<EngineLink>> {
    let provider = test_provider();
    let mut c = if provider == transfer_rpc::engine_link::NATIVE_VERBS {
        EngineLinkConfig::new(provider.as_str())
    } else {
        EngineLinkConfig::loopback(provider.as_str())
    };
    c.peer_timeout = peer_timeout;
    c.settle_timeout = Duration::from_secs(10);
    match EngineLink::open(c) {
        Ok(l) => Some(l),
        // Asked for by name (the VM run): not opening is a failure.
        Err(e) if std::env::var_os("TRANSFER_RPC_TEST_ENGINE").is_some() => {
            panic!("TRANSFER_RPC_TEST_ENGINE={provider}: cannot open the engine: {e}")
        }
        // A failure instead where TRANSFER_REQUIRE names the provider.
        Err(e) => {
            transfer_core::testing::skip_or_fail(&provider, format!("cannot open the engine: {e}"));
            None
        }
    }
}

fn link() -> Option<Arc<EngineLink>> {
    link_with(Duration::from_secs(5))
}

fn server(link: &Arc<EngineLink>) -> ServerHandle {
    // Verbs engine addresses (GIDs) carry no IP the policy could match: the
    // server allows them only under `any` (README, "Copies go only where the
    // operator allows"); tcp's are loopback (`start`'s default here).
    let peer_allow = if test_provider() == "ibverbs" {
        PeerAllow::parse(&["any".to_string()]).unwrap()
    } else {
        PeerAllow::default()
    };
    start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        engine: Some(Arc::clone(link)),
        peer_allow,
        ..ServerConfig::default()
    })
}

fn client(h: &ServerHandle) -> Client {
    connect_with(
        h,
        ClientConfig {
            stats: true,
            ..ClientConfig::default()
        },
    )
}

fn pattern(bytes: usize, seed: u32) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) as u8)
        .collect()
}

/// One side of a boundary: a client, its buffer and a tensor in it.
struct Side {
    c: Client,
    handle: u64,
    t: RpcTensor,
}

fn side(h: &ServerHandle, buffer: u64, n: u32) -> Side {
    let mut c = client(h);
    let (handle, base) = alloc(&mut c, buffer);
    let t = f32_tensor(1, handle, base, TENSOR_OFFSET, n);
    Side { c, handle, t }
}

/// Opens a lane from `a` to `b` covering `b`'s tensor.
fn open(a: &mut Side, b: &mut Side, bytes: u64) -> (InboundLane, OutboundId) {
    let ia = a.c.engine_info().unwrap();
    let ib = b.c.engine_info().unwrap();
    assert!(ia.has_engine() && ib.has_engine());
    assert_ne!(ia.address, ib.address);
    let inb =
        b.c.engine_open_inbound(b.handle, TENSOR_OFFSET, bytes, &ia.address)
            .unwrap()
            .expect("inbound refused");
    let out =
        a.c.engine_open_outbound(&ib.address, &inb.descriptor, inb.lane)
            .unwrap()
            .expect("outbound refused");
    (inb, out)
}

fn write<'a>(out: OutboundId, src: &'a RpcTensor, size: u64, seq: u32) -> EngineWrite<'a> {
    EngineWrite {
        outbound: out,
        src,
        src_offset: 0,
        size,
        dst_offset: 0,
        seq,
    }
}

#[test]
fn steps_land_on_the_destination() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let bytes = u64::from(N) * 4;
    let (mut a, mut b) = (side(&sa, 1 << 20, N), side(&sb, 1 << 20, N));
    assert!(a.c.supports_engine() && b.c.supports_engine());
    let (inb, out) = open(&mut a, &mut b, bytes);
    a.c.take_stats();
    b.c.take_stats();
    let steps = 40u32;
    for seq in 0..steps {
        let data = pattern(bytes as usize, seq);
        a.c.set_tensor(&a.t, 0, &data).unwrap();
        assert!(a.c.engine_write(&write(out, &a.t, bytes, seq)).unwrap());
        assert!(b.c.engine_wait(inb.lane, seq, bytes, 5000).unwrap());
        assert_eq!(b.c.get_tensor(&b.t, 0, bytes).unwrap(), data, "step {seq}");
    }
    let sa_stats = a.c.take_stats().unwrap();
    assert_eq!(sa_stats.get(Command::EngineWrite).count, u64::from(steps));
    assert_eq!(
        sa_stats.get(Command::EngineWrite).response_bytes,
        9 * u64::from(steps)
    );
    assert_eq!(
        b.c.take_stats().unwrap().get(Command::EngineWait).count,
        u64::from(steps)
    );
    // A partial write into the middle of the lane's range.
    let part = pattern(1024, 77);
    a.c.set_tensor(&a.t, 0, &part).unwrap();
    let w = EngineWrite {
        dst_offset: 4096,
        ..write(out, &a.t, 1024, steps)
    };
    assert!(a.c.engine_write(&w).unwrap());
    assert!(b.c.engine_wait(inb.lane, steps, 1024, 5000).unwrap());
    assert_eq!(b.c.get_tensor(&b.t, 4096, 1024).unwrap(), part);
    assert!(a.c.engine_close(CloseKind::Outbound, out.0).unwrap());
    assert!(b.c.engine_close(CloseKind::Inbound, inb.lane.0).unwrap());
    assert!(!b.c.engine_close(CloseKind::Inbound, inb.lane.0).unwrap());
    assert_eq!(lb.lanes().live(), 0);
}

#[test]
fn pipelined_steps_collect_once() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let bytes = u64::from(N) * 4;
    let (mut a, mut b) = (side(&sa, 1 << 20, N), side(&sb, 1 << 20, N));
    let boundary = open_engine_boundary(&mut a.c, &mut b.c, b.handle, TENSOR_OFFSET, bytes)
        .unwrap()
        .expect("boundary refused");
    let (inb, out) = (
        InboundLane {
            lane: boundary.lane,
            descriptor: Vec::new(),
        },
        boundary.outbound,
    );
    let steps = 30u32;
    for seq in 0..steps {
        let data = pattern(bytes as usize, 1000 + seq);
        // SET_TENSOR waits on the server for the previous step's write.
        a.c.set_tensor(&a.t, 0, &data).unwrap();
        a.c.post_engine_write(&write(out, &a.t, bytes, seq))
            .unwrap();
        b.c.post_engine_wait(inb.lane, seq, bytes, 5000).unwrap();
        if seq % 10 == 9 {
            // An ordinary call reads the posted answers first, in order.
            assert_eq!(b.c.get_tensor(&b.t, 0, bytes).unwrap(), data);
        }
    }
    assert_eq!(a.c.posted_len(), steps as usize);
    let wa = a.c.collect_posted().unwrap();
    let wb = b.c.collect_posted().unwrap();
    assert_eq!(wa, vec![true; steps as usize]);
    assert_eq!(wb, vec![true; steps as usize]);
    assert_eq!(a.c.posted_len(), 0);
    // One step split in 4 posted writes to 4 quarters, one collect each.
    let data = pattern(bytes as usize, 9);
    a.c.set_tensor(&a.t, 0, &data).unwrap();
    let q = bytes / 4;
    for i in 0..4u32 {
        let w = EngineWrite {
            src_offset: u64::from(i) * q,
            dst_offset: u64::from(i) * q,
            ..write(out, &a.t, q, 500 + i)
        };
        a.c.post_engine_write(&w).unwrap();
        b.c.post_engine_wait(inb.lane, 500 + i, q, 5000).unwrap();
    }
    assert_eq!(a.c.collect_posted().unwrap(), vec![true; 4]);
    assert_eq!(b.c.collect_posted().unwrap(), vec![true; 4]);
    assert_eq!(b.c.get_tensor(&b.t, 0, bytes).unwrap(), data);
    // A posted wait that times out answers false among trues.
    b.c.post_engine_wait(inb.lane, 9999, bytes, 20).unwrap();
    assert_eq!(b.c.collect_posted().unwrap(), vec![false]);
}

#[test]
fn refusals_leave_the_session_alive() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let bytes = u64::from(N) * 4;
    let (mut a, mut b) = (side(&sa, 1 << 20, N), side(&sb, 1 << 20, N));
    let (inb, out) = open(&mut a, &mut b, bytes);
    let ia = a.c.engine_info().unwrap().address;
    let ib = b.c.engine_info().unwrap().address;

    // Unknown ids.
    assert!(
        !a.c.engine_write(&write(OutboundId(999), &a.t, 4, 0))
            .unwrap()
    );
    assert!(
        !b.c.engine_wait(LaneId(inb.lane.0 + 1000), 0, 4, 10)
            .unwrap()
    );
    assert!(!a.c.engine_close(CloseKind::Outbound, 999).unwrap());
    // A lane of another session is unknown to this one.
    let mut b2 = client(&sb);
    assert!(!b2.engine_wait(inb.lane, 0, 4, 10).unwrap());
    // Source outside its tensor, or its buffer, or not a live buffer.
    let w = EngineWrite {
        src_offset: bytes - 4,
        ..write(out, &a.t, 8, 0)
    };
    assert!(!a.c.engine_write(&w).unwrap());
    let mut beyond = a.t.clone();
    beyond.data += (1 << 20) - 8;
    assert!(!a.c.engine_write(&write(out, &beyond, 4, 0)).unwrap());
    let mut dead = a.t.clone();
    dead.buffer ^= 0x5555;
    assert!(!a.c.engine_write(&write(out, &dead, 4, 0)).unwrap());
    // Destination outside the inbound range (the lane covers `bytes`).
    let w = EngineWrite {
        dst_offset: bytes - 4,
        ..write(out, &a.t, 8, 0)
    };
    assert!(!a.c.engine_write(&w).unwrap());
    // A wait larger than the lane.
    assert!(!b.c.engine_wait(inb.lane, 0, bytes + 1, 10).unwrap());
    // Inbound: garbage address, unknown buffer, range outside the buffer.
    assert!(
        b.c.engine_open_inbound(b.handle, 0, 64, b"garbage")
            .unwrap()
            .is_none()
    );
    assert!(
        b.c.engine_open_inbound(b.handle ^ 0x77, 0, 64, &ia)
            .unwrap()
            .is_none()
    );
    assert!(
        b.c.engine_open_inbound(b.handle, (1 << 20) - 8, 16, &ia)
            .unwrap()
            .is_none()
    );
    assert!(
        b.c.engine_open_inbound(b.handle, 0, 0, &ia)
            .unwrap()
            .is_none()
    );
    // Outbound: garbage address or descriptor, reserved or too large lane.
    let garbage = vec![0xA5u8; 300];
    assert!(
        a.c.engine_open_outbound(&garbage, &inb.descriptor, inb.lane)
            .unwrap()
            .is_none()
    );
    assert!(
        a.c.engine_open_outbound(&ib, &garbage, inb.lane)
            .unwrap()
            .is_none()
    );
    assert!(
        a.c.engine_open_outbound(&ib, &inb.descriptor, LaneId(0))
            .unwrap()
            .is_none()
    );
    assert!(
        a.c.engine_open_outbound(&ib, &inb.descriptor, LaneId(0x1_0000))
            .unwrap()
            .is_none()
    );
    // A wait that times out answers 0, promptly.
    let t = Instant::now();
    assert!(!b.c.engine_wait(inb.lane, 4321, bytes, 50).unwrap());
    assert!(t.elapsed() < Duration::from_secs(2));

    // Oversized and truncated lengths, as raw frames on a raw session.
    let mut raw = Raw::connect(&sb);
    let mut p = Vec::new();
    p.extend_from_slice(&b.handle.to_le_bytes());
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&64u64.to_le_bytes());
    p.extend_from_slice(&(MAX_ENGINE_BYTES as u32 + 1).to_le_bytes());
    p.extend(std::iter::repeat_n(0u8, MAX_ENGINE_BYTES + 1));
    assert_eq!(
        raw.call(Command::EngineOpenInbound, &p),
        vec![0, 0, 0, 0, 0]
    );
    let mut p = Vec::new();
    p.extend_from_slice(&(u32::MAX).to_le_bytes());
    p.extend_from_slice(b"short");
    assert_eq!(
        raw.call(Command::EngineOpenOutbound, &p),
        vec![0, 0, 0, 0, 0]
    );
    assert_eq!(raw.call(Command::EngineWrite, &[1, 2, 3]), vec![0]);
    assert_eq!(raw.call(Command::EngineWait, &[0; 12]), vec![0]);
    assert_eq!(raw.call(Command::EngineClose, &[7, 1, 0, 0, 0]), vec![0]);
    assert_eq!(raw.call(Command::DeviceCount, &[]), 1u32.to_le_bytes());

    // Everything still works on the same sessions.
    let data = pattern(bytes as usize, 5);
    a.c.set_tensor(&a.t, 0, &data).unwrap();
    assert!(a.c.engine_write(&write(out, &a.t, bytes, 1)).unwrap());
    assert!(b.c.engine_wait(inb.lane, 1, bytes, 5000).unwrap());
    assert_eq!(b.c.get_tensor(&b.t, 0, bytes).unwrap(), data);
    assert_eq!(sa.shared().refused_connections(), 0);
    assert_eq!(sb.shared().refused_connections(), 0);
}

#[test]
fn server_without_engine_refuses() {
    let plain = start_default();
    let mut c = client(&plain);
    if let Some(l) = link() {
        let se = server(&l);
        let mut e = client(&se);
        let (h, _) = alloc(&mut e, 4096);
        assert_eq!(
            open_engine_boundary(&mut e, &mut c, h, 0, 64).unwrap(),
            None,
            "no boundary to a server without engine"
        );
        assert_eq!(
            open_engine_boundary(&mut c, &mut e, h, 0, 64).unwrap(),
            None
        );
        assert_eq!(l.lanes().live(), 0);
    }
    assert!(c.supports_copy_to() && !c.supports_engine());
    // The client knows from EXT_QUERY and does not send.
    assert!(matches!(
        c.engine_info(),
        Err(RpcError::ExtensionUnsupported { .. })
    ));
    assert!(matches!(
        c.engine_wait(LaneId(1), 0, 4, 10),
        Err(RpcError::ExtensionUnsupported { .. })
    ));
    assert_eq!(c.device_count().unwrap(), 1);
    // Sent anyway, it closes that connection only, like an unknown command.
    let mut raw = Raw::connect(&plain);
    assert!(raw.try_call(Command::EngineInfo, &[]).is_err());
    assert_eq!(c.device_count().unwrap(), 1);
    let mut again = client(&plain);
    assert_eq!(again.device_count().unwrap(), 1);
    assert_eq!(plain.shared().refused_connections(), 1);
}

#[test]
fn lanes_unique_across_sessions_and_freed_with_them() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let sb = server(&lb);
    let sender = la.address_bytes().to_vec();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let endpoint = sb.endpoint();
            let sender = sender.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&endpoint, ClientConfig::default()).unwrap();
                let (h, _) = alloc(&mut c, 1 << 16);
                let lanes: Vec<u32> = (0..8)
                    .map(|i| {
                        c.engine_open_inbound(h, i * 1024, 1024, &sender)
                            .unwrap()
                            .unwrap()
                            .lane
                            .0
                    })
                    .collect();
                (c, lanes)
            })
        })
        .collect();
    let results: Vec<(Client, Vec<u32>)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let mut all: Vec<u32> = results.iter().flat_map(|(_, l)| l.clone()).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 32, "lanes collide across sessions");
    assert!(all.iter().all(|&l| l != 0 && l <= 0xFFFF));
    assert_eq!(lb.lanes().live(), 32);
    assert_eq!(
        lb.targets(),
        32,
        "one registration per lane: its range alone"
    );
    assert_eq!(lb.registrations(), 0, "no buffer registered whole");
    drop(results);
    let t = Instant::now();
    while sb.shared().live_sessions() > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(lb.lanes().live(), 0);
    assert_eq!(lb.registrations(), 0);
    assert_eq!(lb.targets(), 0, "lane registrations end with their session");
    assert_eq!(lb.retired(), 0);
    assert!(sb.shared().registry.is_empty());
}

#[test]
fn free_buffer_right_after_a_posted_write_waits() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let big = 8u32 << 20; // 32 MiB of f32: the write takes a while on tcp
    let bytes = u64::from(big) * 4;
    let (mut a, mut b) = (side(&sa, bytes + 4096, big), side(&sb, bytes + 4096, big));
    let (inb, out) = open(&mut a, &mut b, bytes);
    let data = pattern(bytes as usize, 3);
    a.c.set_tensor(&a.t, 0, &data).unwrap();
    a.c.post_engine_write(&write(out, &a.t, bytes, 7)).unwrap();
    a.c.free_buffer(a.handle).unwrap();
    // FREE_BUFFER has no answer: the next answer proves it ran.
    assert_eq!(a.c.collect_posted().unwrap(), vec![true]);
    assert_eq!(a.c.device_count().unwrap(), 1);
    assert_eq!(la.registrations(), 0);
    assert_eq!(la.retired(), 0, "the write had completed before the free");
    assert!(b.c.engine_wait(inb.lane, 7, bytes, 10_000).unwrap());
    assert!(b.c.get_tensor(&b.t, 0, bytes).unwrap() == data);
}

/// A session that ends with a write still posted: the server settles it
/// before freeing the source buffer, and the data lands whole.
#[test]
fn session_end_settles_posted_writes() {
    let (Some(la), Some(lb)) = (link(), link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let big = 8u32 << 20;
    let bytes = u64::from(big) * 4;
    let (mut a, mut b) = (side(&sa, bytes + 4096, big), side(&sb, bytes + 4096, big));
    let (inb, out) = open(&mut a, &mut b, bytes);
    let data = pattern(bytes as usize, 21);
    a.c.set_tensor(&a.t, 0, &data).unwrap();
    a.c.post_engine_write(&write(out, &a.t, bytes, 1)).unwrap();
    drop(a);
    assert!(b.c.engine_wait(inb.lane, 1, bytes, 10_000).unwrap());
    assert!(b.c.get_tensor(&b.t, 0, bytes).unwrap() == data);
    let t = Instant::now();
    while sa.shared().live_sessions() > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(sa.shared().registry.is_empty());
    assert_eq!(la.registrations(), 0);
    assert_eq!(la.retired(), 0);
}

#[test]
fn dead_destination_fails_the_next_answer() {
    // 2 s, not 500 ms: with 500 ms this test failed in 2 of 3 full runs in
    // the soft-RoCE VM (software-emulated CPU, host load 10-12) and passed
    // run alone: a live peer's answers must not miss the timeout there. A
    // dead destination is still noticed well inside the 15 s below.
    let (Some(la), Some(lb)) = (
        link_with(Duration::from_secs(2)),
        link_with(Duration::from_secs(2)),
    ) else {
        return;
    };
    let sa = server(&la);
    let mut sb = server(&lb);
    let bytes = u64::from(N) * 4;
    let (mut a, mut b) = (side(&sa, 1 << 20, N), side(&sb, 1 << 20, N));
    let (inb, out) = open(&mut a, &mut b, bytes);
    assert!(a.c.engine_write(&write(out, &a.t, bytes, 0)).unwrap());
    assert!(b.c.engine_wait(inb.lane, 0, bytes, 5000).unwrap());
    // Stop the destination and drop its engine.
    drop(b);
    sb.shutdown();
    drop(sb);
    drop(lb);
    let t = Instant::now();
    let mut answers = Vec::new();
    while t.elapsed() < Duration::from_secs(15) {
        let ok = a.c.engine_write(&write(out, &a.t, bytes, 1)).unwrap();
        answers.push(ok);
        if !ok {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(answers.last(), Some(&false), "{answers:?}");
    assert!(t.elapsed() < Duration::from_secs(15));
    // The source server and session are fine.
    assert_eq!(a.c.device_count().unwrap(), 1);
    let mut other = client(&sa);
    assert_eq!(other.device_count().unwrap(), 1);
    // The pair cannot talk any more: reopening answers 0.
    let dead_addr = {
        let l = link().unwrap();
        let addr = l.address_bytes().to_vec();
        drop(l);
        addr
    };
    assert!(
        a.c.engine_open_outbound(&dead_addr, &inb.descriptor, inb.lane)
            .unwrap()
            .is_none()
    );
}

fn two_nic_link() -> Option<Arc<EngineLink>> {
    use transfer_efa::{Config, Provider, open_loopback_domains};
    let domains = match open_loopback_domains(&Config::loopback(Provider::Tcp), 2) {
        Ok(d) => d,
        Err(e) => {
            transfer_core::testing::skip_or_fail("tcp", format!("cannot open two domains: {e}"));
            return None;
        }
    };
    let engine = transfer_core::TransferEngine::builder()
        .group(domains)
        .build()
        .unwrap();
    Some(
        EngineLink::with_engine(engine, "tcp x2".into(), EngineLinkConfig::loopback("tcp"))
            .unwrap(),
    )
}

/// Two NICs per engine: a 1 MiB write is split in two shards, each with
/// the immediate; ENGINE_WAIT waits for both (counted from the sender's
/// address and the size) and leaves nothing behind.
#[test]
fn sharded_writes_are_counted_from_the_sender_address() {
    let (Some(la), Some(lb)) = (two_nic_link(), two_nic_link()) else {
        return;
    };
    let (sa, sb) = (server(&la), server(&lb));
    let n = 1u32 << 18;
    let bytes = u64::from(n) * 4;
    let shards = lb
        .engine()
        .expected_imms(
            la.engine().address(),
            0,
            0,
            transfer_core::WriteShape::Single { len: bytes },
        )
        .unwrap();
    assert_eq!(shards, 2, "a 1 MiB write over two NICs is two shards");
    let (mut a, mut b) = (side(&sa, 2 << 20, n), side(&sb, 2 << 20, n));
    let (inb, out) = open(&mut a, &mut b, bytes);
    for seq in 0..5u32 {
        let data = pattern(bytes as usize, 40 + seq);
        a.c.set_tensor(&a.t, 0, &data).unwrap();
        assert!(a.c.engine_write(&write(out, &a.t, bytes, seq)).unwrap());
        assert!(b.c.engine_wait(inb.lane, seq, bytes, 5000).unwrap());
        assert_eq!(b.c.get_tensor(&b.t, 0, bytes).unwrap(), data);
        let imm = transfer_rpc::protocol::lane_imm(inb.lane, seq);
        assert_eq!(
            lb.engine().imm_value(imm),
            0,
            "a shard's immediate was left over"
        );
    }
}

/// A source on `shm` and a destination on `tcp` cannot talk: the boundary
/// answers `None` (fall back) and the half-open inbound lane is closed.
#[test]
fn unlike_providers_fall_back_and_close_the_lane() {
    let Some(lb) = link() else {
        return;
    };
    let la = match EngineLink::open(EngineLinkConfig::new("shm")) {
        Ok(l) => l,
        Err(e) => {
            transfer_core::testing::skip_or_fail("shm", format!("cannot open the engine: {e}"));
            return;
        }
    };
    let (sa, sb) = (server(&la), server(&lb));
    let (mut a, mut b) = (side(&sa, 1 << 16, 64), side(&sb, 1 << 16, 64));
    let t = Instant::now();
    assert_eq!(
        open_engine_boundary(&mut a.c, &mut b.c, b.handle, 0, 256).unwrap(),
        None
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(lb.lanes().live(), 0, "the half-open lane was not closed");
    assert_eq!(a.c.device_count().unwrap(), 1);
    assert_eq!(b.c.device_count().unwrap(), 1);
}

/// The CLI: two server processes started with `--engine tcp --engine-node
/// 127.0.0.1 --engine-iface lo` write a boundary between them.
#[test]
fn server_processes_started_with_engine_flags() {
    if link().is_none() {
        return;
    }
    let flags = [
        "--engine",
        "tcp",
        "--engine-node",
        "127.0.0.1",
        "--engine-iface",
        "lo",
    ];
    let (pa, pb) = (ServerProcess::start(&flags), ServerProcess::start(&flags));
    let plain = ServerProcess::start(&[]);
    let cfg = ClientConfig::default();
    let mut ca = Client::connect(&pa.endpoint, cfg.clone()).unwrap();
    let mut cb = Client::connect(&pb.endpoint, cfg.clone()).unwrap();
    let cp = Client::connect(&plain.endpoint, cfg).unwrap();
    assert!(ca.supports_engine() && cb.supports_engine() && !cp.supports_engine());
    let (ha, basea) = alloc(&mut ca, 1 << 16);
    let (hb, baseb) = alloc(&mut cb, 1 << 16);
    let mut a = Side {
        c: ca,
        handle: ha,
        t: f32_tensor(1, ha, basea, TENSOR_OFFSET, 1024),
    };
    let mut b = Side {
        c: cb,
        handle: hb,
        t: f32_tensor(1, hb, baseb, TENSOR_OFFSET, 1024),
    };
    let (inb, out) = open(&mut a, &mut b, 4096);
    let data = pattern(4096, 11);
    a.c.set_tensor(&a.t, 0, &data).unwrap();
    assert!(a.c.engine_write(&write(out, &a.t, 4096, 3)).unwrap());
    assert!(b.c.engine_wait(inb.lane, 3, 4096, 5000).unwrap());
    assert_eq!(b.c.get_tensor(&b.t, 0, 4096).unwrap(), data);
}

/// Median round trip of a 1 MiB boundary: ENGINE_WRITE + ENGINE_WAIT vs
/// COPY_TENSOR_TO (+ PEER_BARRIER inside the source server), engines on
/// libfabric tcp and shm. A measurement, not a check (the data paths are
/// tested above): `cargo test -p transfer-rpc --features engine --release
/// --test engine_link -- --ignored --nocapture measure`.
#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn measure_one_mib_boundary() {
    for provider in ["tcp", "shm"] {
        let open_link = || {
            let mut c = EngineLinkConfig::loopback(provider);
            if provider == "shm" {
                c.node = None;
            }
            EngineLink::open(c)
        };
        let (la, lb) = match (open_link(), open_link()) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("skipped {provider}: {e}");
                continue;
            }
        };
        measure_with(provider, &la, &lb);
    }
}

fn measure_with(provider: &str, la: &Arc<EngineLink>, lb: &Arc<EngineLink>) {
    let (sa, sb) = (server(la), server(lb));
    let n = 1u32 << 18; // 1 MiB of f32
    let bytes = u64::from(n) * 4;
    let (mut a, mut b) = (side(&sa, 2 << 20, n), side(&sb, 2 << 20, n));
    let (inb, out) = open(&mut a, &mut b, bytes);
    a.c.set_tensor(&a.t, 0, &pattern(bytes as usize, 1))
        .unwrap();
    let rounds = 100;
    let median = |mut v: Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let mut engine = Vec::new();
    for seq in 0..rounds {
        let t = Instant::now();
        assert!(a.c.engine_write(&write(out, &a.t, bytes, seq)).unwrap());
        assert!(b.c.engine_wait(inb.lane, seq, bytes, 5000).unwrap());
        engine.push(t.elapsed());
    }
    let endpoint = b.c.endpoint().to_owned();
    let mut copy_to = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        assert!(a.c.copy_tensor_to(&a.t, &b.t, bytes, &endpoint).unwrap());
        copy_to.push(t.elapsed());
    }
    let (e, c) = (median(engine), median(copy_to));
    eprintln!(
        "1 MiB boundary ({provider}), median of {rounds}: ENGINE_WRITE+ENGINE_WAIT {e:?}, \
         COPY_TENSOR_TO+PEER_BARRIER {c:?}"
    );
    assert_eq!(
        b.c.get_tensor(&b.t, 0, bytes).unwrap(),
        pattern(bytes as usize, 1)
    );
}

/// A raw HELLO-negotiated connection for frames the client would not send.
struct Raw(TcpStream);

impl Raw {
    fn connect(h: &ServerHandle) -> Raw {
        let s = TcpStream::connect(h.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = Raw(s);
        assert_eq!(r.call(Command::Hello, &[0; 24]).len(), 28);
        r
    }

    fn try_call(&mut self, cmd: Command, payload: &[u8]) -> std::io::Result<Vec<u8>> {
        let frame = transfer_rpc::protocol::encode_request(cmd, payload);
        self.0.write_all(&frame)?;
        let mut head = [0u8; 8];
        self.0.read_exact(&mut head)?;
        let mut p = vec![0u8; u64::from_le_bytes(head) as usize];
        self.0.read_exact(&mut p)?;
        Ok(p)
    }

    fn call(&mut self, cmd: Command, payload: &[u8]) -> Vec<u8> {
        self.try_call(cmd, payload).unwrap()
    }
}
