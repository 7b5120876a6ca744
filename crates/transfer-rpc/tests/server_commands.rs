//! Every command end to end against an in-process server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use transfer_rpc::client::ClientConfig;
use transfer_rpc::hash::fnv1a64;
use transfer_rpc::protocol::{Command, RpcTensor};
use transfer_rpc::server::ServerConfig;

#[test]
fn standard_commands_round_trip() {
    let h = start_default();
    let mut c = connect_with(
        &h,
        ClientConfig {
            stats: true,
            ..ClientConfig::default()
        },
    );
    assert_eq!(c.server_version().major, 7);
    assert_eq!(c.device_count().unwrap(), 1);
    assert_eq!(c.get_alignment(0).unwrap(), 64);
    assert_eq!(c.get_max_size(0).unwrap(), 64 << 20);
    let (free0, total) = c.get_device_memory(0).unwrap();
    assert_eq!((free0, total), (64 << 20, 64 << 20));

    let (buf, base) = alloc(&mut c, 4096);
    assert_eq!(c.get_device_memory(0).unwrap().0, (64 << 20) - 4096);
    let t = f32_tensor(1, buf, base, 64, 8);
    let vals: Vec<f32> = (0..8).map(|i| i as f32 * 1.5).collect();
    c.set_tensor(&t, 0, &f32_bytes(&vals)).unwrap();
    assert_eq!(c.get_tensor(&t, 0, 32).unwrap(), f32_bytes(&vals));
    assert_eq!(c.get_tensor(&t, 8, 8).unwrap(), f32_bytes(&vals[2..4]));

    // COPY_TENSOR inside the server.
    let t2 = f32_tensor(2, buf, base, 1024, 8);
    assert!(c.copy_tensor(&t, &t2).unwrap());
    assert_eq!(c.get_tensor(&t2, 0, 32).unwrap(), f32_bytes(&vals));
    // Destination too small: answered 0, connection stays.
    let small = f32_tensor(3, buf, base, 4096 - 16, 4);
    assert!(!c.copy_tensor(&t, &small).unwrap());

    c.memset_tensor(&t2, 4, 8, 0xAB).unwrap();
    let got = c.get_tensor(&t2, 0, 16).unwrap();
    assert_eq!(&got[4..12], &[0xAB; 8]);

    c.init_tensor(&t).unwrap();
    let srcs: [RpcTensor; 10] = Default::default();
    assert_eq!(c.get_alloc_size(0, &t, &srcs).unwrap(), 32);
    let q = RpcTensor {
        ty: 2,
        ne: [64, 2, 1, 1],
        nb: [18, 36, 72, 72],
        ..RpcTensor::default()
    };
    assert_eq!(c.get_alloc_size(0, &q, &srcs).unwrap(), 72);

    c.buffer_clear(buf, 7).unwrap();
    assert_eq!(c.get_tensor(&t, 0, 32).unwrap(), vec![7u8; 32]);

    c.free_buffer(buf).unwrap();
    assert_eq!(c.get_device_memory(0).unwrap().0, 64 << 20);
    // The handle is gone: using it closes the connection.
    assert!(c.get_tensor(&t, 0, 4).is_err());

    let mut c = connect_with(
        &h,
        ClientConfig {
            stats: true,
            ..ClientConfig::default()
        },
    );
    assert!(c.probe_extensions().is_some());
    assert!(c.peer_barrier().unwrap());
    let st = c.take_stats().unwrap();
    assert_eq!(st.get(Command::Hello).count, 1);
    assert_eq!(st.get(Command::Hello).request_bytes, 9 + 24);
    assert_eq!(st.get(Command::Hello).response_bytes, 8 + 28);
    assert_eq!(st.get(Command::PeerBarrier).response_bytes, 9);
    assert_eq!(c.take_stats().unwrap().total().count, 0);
    println!("{st}");
}

#[test]
fn buffers_freed_on_disconnect_and_quota_refusal() {
    let h = start_default();
    {
        let mut c = connect(&h);
        alloc(&mut c, 1 << 20);
        alloc(&mut c, 1 << 20);
        assert_eq!(h.shared().registry.len(), 2);
        // Over the quota: answered with handle 0, connection stays.
        assert!(c.alloc_buffer(0, 1 << 40).unwrap().is_none());
        assert_eq!(c.device_count().unwrap(), 1);
    }
    // The session thread frees on disconnect; wait for it (no timing assert).
    while h.shared().live_sessions() > 0 {
        std::thread::yield_now();
    }
    assert_eq!(h.shared().registry.len(), 0);
    assert_eq!(h.shared().registry.used(), 0);
}

#[test]
fn set_tensor_hash_uses_cache_dir() {
    let dir = std::env::temp_dir().join(format!("trpc-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let h = start(ServerConfig {
        memory_quota: 1 << 20,
        max_buffer_size: 1 << 20,
        cache_dir: Some(dir.clone()),
        ..ServerConfig::default()
    });
    let mut c = connect(&h);
    let (buf, base) = alloc(&mut c, 4096);
    let t = f32_tensor(1, buf, base, 0, 256);
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    let hash = fnv1a64(&data);
    assert!(!c.set_tensor_hash(&t, 0, hash).unwrap(), "cold cache");
    c.set_tensor_cached(&t, 0, &data, true).unwrap();
    c.buffer_clear(buf, 0).unwrap();
    assert!(c.set_tensor_hash(&t, 0, hash).unwrap(), "warm cache");
    assert_eq!(c.get_tensor(&t, 0, 1024).unwrap(), data);
    // A planted file whose content does not match its name is ignored.
    std::fs::write(dir.join(format!("{:016x}", 0x1234u64)), b"evil").unwrap();
    assert!(!c.set_tensor_hash(&t, 0, 0x1234).unwrap());
    // Cached data larger than the tensor's room is not written.
    assert!(!c.set_tensor_hash(&t, 1000, hash).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn graph_compute_is_refused_without_a_backend() {
    use transfer_rpc::protocol::GraphPayload;
    let h = start_default();
    let mut c = connect(&h);
    let (buf, base) = alloc(&mut c, 4096);
    let a = f32_tensor(1, buf, base, 0, 4);
    let b = f32_tensor(2, buf, base, 64, 4);
    let mut sum = f32_tensor(3, buf, base, 128, 4);
    sum.op = 2; // ADD
    sum.src[0] = 1;
    sum.src[1] = 2;
    let g = GraphPayload {
        device: 0,
        nodes: vec![3],
        tensors: vec![a, b, sum],
    };
    c.graph_compute(&g).unwrap();
    assert!(is_closed(&mut c), "refusing backend closes the connection");
    let mut other = connect(&h);
    assert_eq!(other.device_count().unwrap(), 1);
}

#[test]
fn many_sessions_at_once() {
    let h = start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        max_connections: 4,
        ..ServerConfig::default()
    });
    let ep = h.endpoint();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let ep = ep.clone();
            std::thread::spawn(move || {
                let mut c =
                    transfer_rpc::client::Client::connect(&ep, ClientConfig::default()).unwrap();
                let (buf, base) = alloc(&mut c, 4096);
                let t = f32_tensor(1, buf, base, 0, 16);
                let data = vec![i as u8; 64];
                for _ in 0..20 {
                    c.set_tensor(&t, 0, &data).unwrap();
                    assert_eq!(c.get_tensor(&t, 0, 64).unwrap(), data);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
