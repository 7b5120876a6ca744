//! Connections and memory outside the buffer quota, attacked the way an
//! outside client would: silent sockets, a HELLO that never comes, a frame
//! that never ends, payloads declared far larger than their target, more
//! sessions from one address than its share, copies to a destination the
//! operator did not allow. Each case: the attacker is refused (or closed),
//! and a fresh client is still served.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::{Client, ClientConfig, CopyPath, copy_between};
use transfer_rpc::protocol::frame::encode_request;
use transfer_rpc::protocol::request::SET_TENSOR_HEADER_SIZE;
use transfer_rpc::protocol::{Command, HelloRequest, Request};
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{Server, ServerConfig, ServerHandle};

fn hello_frame() -> Vec<u8> {
    encode_request(
        Command::Hello,
        &Request::Hello(HelloRequest::default()).encode_payload(),
    )
}

/// Waits until the server closes `s` (EOF or reset); returns how long it took.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            Err(_) => return Some(t0.elapsed()),
        }
    }
}

fn served_quickly(h: &ServerHandle) -> Duration {
    let t0 = Instant::now();
    let mut c = Client::connect(
        &h.endpoint(),
        ClientConfig {
            connect_timeout: Some(Duration::from_secs(5)),
            io_timeout: Some(Duration::from_secs(5)),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    assert_eq!(c.device_count().unwrap(), 1);
    t0.elapsed()
}

#[test]
fn five_hundred_silent_connections_do_not_stop_a_fresh_client() {
    let h = start_default();
    let silent: Vec<TcpStream> = (0..500)
        .map(|_| TcpStream::connect(h.addr()).unwrap())
        .collect();
    // Give the accept loop time to take them all.
    std::thread::sleep(Duration::from_millis(300));
    let took = served_quickly(&h);
    println!("fresh client served in {took:?} behind 500 silent connections");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let (pending, sessions) = h.shared().admission.counts();
    assert!(
        pending <= 64,
        "pending connections bounded per address: {pending}"
    );
    assert!(sessions <= 1);
    drop(silent);
}

#[test]
fn a_connection_without_hello_is_closed_at_the_deadline() {
    let h = start(ServerConfig {
        hello_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let mut s = TcpStream::connect(h.addr()).unwrap();
    let took = closed_within(&mut s, Duration::from_secs(5)).expect("closed");
    assert!(took >= Duration::from_millis(200), "{took:?}");
    // Trickling the HELLO does not extend the deadline beyond each read's.
    let mut s = TcpStream::connect(h.addr()).unwrap();
    s.write_all(&hello_frame()[..3]).unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)).is_some());
    served_quickly(&h);
}

#[test]
fn a_frame_that_stops_mid_way_is_closed_after_the_frame_timeout() {
    let h = start(ServerConfig {
        frame_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let mut s = TcpStream::connect(h.addr()).unwrap();
    s.write_all(&hello_frame()).unwrap();
    let mut answer = [0u8; 8 + 3];
    s.read_exact(&mut answer).unwrap();
    // A GRAPH_COMPUTE header announcing 1000 bytes, then silence.
    let mut head = vec![Command::GraphCompute.byte()];
    head.extend_from_slice(&1000u64.to_le_bytes());
    head.extend_from_slice(&[0u8; 10]);
    s.write_all(&head).unwrap();
    let took = closed_within(&mut s, Duration::from_secs(5)).expect("closed");
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert_eq!(h.shared().budget.used(), 0);
    served_quickly(&h);
}

#[test]
fn sessions_from_one_address_are_capped() {
    let h = start(ServerConfig {
        max_connections_per_address: 2,
        hello_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let a = connect(&h);
    let b = connect(&h);
    let refused = Client::connect(&h.endpoint(), ClientConfig::default());
    assert!(refused.is_err(), "third session from one address");
    drop(a);
    // The slot comes back once the first session has ended.
    let t0 = Instant::now();
    loop {
        match Client::connect(&h.endpoint(), ClientConfig::default()) {
            Ok(_) => break,
            Err(e) if t0.elapsed() > Duration::from_secs(5) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    drop(b);
}

/// Sends a header announcing `size` payload bytes of `cmd` (after HELLO)
/// and `prefix` of the payload; returns the stream.
fn announce(h: &ServerHandle, cmd: Command, size: u64, prefix: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(h.addr()).unwrap();
    s.write_all(&hello_frame()).unwrap();
    let mut answer = [0u8; 8 + 3];
    s.read_exact(&mut answer).unwrap();
    let mut head = vec![cmd.byte()];
    head.extend_from_slice(&size.to_le_bytes());
    head.extend_from_slice(prefix);
    s.write_all(&head).unwrap();
    s
}

#[test]
fn payloads_larger_than_their_target_are_refused_before_they_are_read() {
    let h = start_default();
    let mut c = connect(&h);
    let (buf, base) = alloc(&mut c, 4096);
    let t = f32_tensor(1, buf, base, 0, 1024);
    // SET_TENSOR announcing 1 GiB of data for a 4 KiB tensor: refused on
    // the header, nothing read, nothing reserved.
    let header = Request::SetTensor {
        tensor: Box::new(t.clone()),
        cache_flag: 0,
        offset: 0,
        data: &[],
    }
    .encode_payload();
    assert_eq!(header.len(), SET_TENSOR_HEADER_SIZE);
    let mut s = announce(
        &h,
        Command::SetTensor,
        (SET_TENSOR_HEADER_SIZE as u64) + (1 << 30),
        &header,
    );
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    // A fixed-size command announcing 1 GiB.
    let mut s = announce(&h, Command::GetAlignment, 1 << 30, &[]);
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_eq!(h.shared().budget.used(), 0);
    // The owner's session and data are untouched.
    c.set_tensor(&t, 0, &[7u8; 4096]).unwrap();
    assert_eq!(c.get_tensor(&t, 0, 4096).unwrap(), vec![7u8; 4096]);
}

#[test]
fn payloads_share_one_inflight_budget() {
    let h = start(ServerConfig {
        inflight_budget: 1 << 20,
        frame_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    // Larger than the whole budget: refused at once.
    let mut s = announce(&h, Command::GraphCompute, 2 << 20, &[]);
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    // Two graphs of 600 KiB each, both held open: the second cannot get its
    // bytes while the first holds them, and is refused after the wait.
    let _first = announce(&h, Command::GraphCompute, 600 << 10, &[]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(h.shared().budget.used(), 600 << 10);
    let mut second = announce(&h, Command::GraphCompute, 600 << 10, &[]);
    assert!(closed_within(&mut second, Duration::from_secs(3)).is_some());
    // Once the first is closed by its frame timeout, the budget is back.
    let t0 = Instant::now();
    while h.shared().budget.used() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "budget not returned");
        std::thread::sleep(Duration::from_millis(20));
    }
    served_quickly(&h);
}

#[test]
fn large_uploads_stream_into_their_buffer() {
    let h = start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        // Less than the upload: it goes through in pieces.
        inflight_budget: 8 << 20,
        ..ServerConfig::default()
    });
    let mut c = connect(&h);
    let n = 32 << 20;
    let (buf, base) = alloc(&mut c, n);
    let t = f32_tensor(1, buf, base, 0, (n / 4) as u32);
    let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    c.set_tensor(&t, 0, &data).unwrap();
    assert_eq!(
        c.get_tensor(&t, n - 4096, 4096).unwrap(),
        data[(n - 4096) as usize..]
    );
    assert_eq!(h.shared().budget.used(), 0);
}

#[test]
fn copies_go_nowhere_unless_the_operator_allows() {
    // Built directly: the test helper would allow loopback.
    let strict = |allow: PeerAllow| {
        Server::bind(
            ServerConfig {
                bind: "127.0.0.1:0".into(),
                memory_quota: 1 << 20,
                max_buffer_size: 1 << 20,
                peer_allow: allow,
                ..ServerConfig::default()
            },
            std::sync::Arc::new(transfer_rpc::server::RefusingBackend),
        )
        .unwrap()
        .spawn()
        .unwrap()
    };
    let dst = start_default();
    for (allow, expect) in [
        (PeerAllow::default(), CopyPath::Hub),
        (
            PeerAllow::parse(&["10.0.0.0/8".into()]).unwrap(),
            CopyPath::Hub,
        ),
        (
            PeerAllow::parse(&["127.0.0.1/32".into()]).unwrap(),
            CopyPath::Direct,
        ),
    ] {
        let src = strict(allow.clone());
        let mut a = connect(&src);
        let mut b = connect(&dst);
        let (ha, ba) = alloc(&mut a, 64);
        let (hb, bb) = alloc(&mut b, 64);
        let (ta, tb) = (f32_tensor(1, ha, ba, 0, 16), f32_tensor(2, hb, bb, 0, 16));
        a.set_tensor(&ta, 0, &[3u8; 64]).unwrap();
        assert_eq!(
            copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
            expect,
            "{allow:?}"
        );
        assert_eq!(b.get_tensor(&tb, 0, 64).unwrap(), vec![3u8; 64]);
    }
}
