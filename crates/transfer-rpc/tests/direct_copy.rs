//! Server-to-server direct copies among in-process servers, with fallbacks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use transfer_rpc::client::{Client, ClientConfig, CopyPath, copy_between};
use transfer_rpc::protocol::{Command, RpcTensor};
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{ServerConfig, ServerHandle};

fn small() -> ServerConfig {
    ServerConfig {
        memory_quota: 16 << 20,
        max_buffer_size: 16 << 20,
        ..ServerConfig::default()
    }
}

fn stats_cfg() -> ClientConfig {
    ClientConfig {
        stats: true,
        ..ClientConfig::default()
    }
}

/// A client with a 1 MiB buffer and a tensor of `n` f32 in it.
fn setup(h: &ServerHandle, n: u32) -> (Client, RpcTensor) {
    let mut c = connect_with(h, stats_cfg());
    let (b, base) = alloc(&mut c, 1 << 20);
    let t = f32_tensor(1, b, base, 256, n);
    (c, t)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n * 4)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn wait_sessions(h: &ServerHandle, n: usize) {
    while h.shared().live_sessions() > n {
        std::thread::yield_now();
    }
}

#[test]
fn three_servers_direct_chain() {
    let (sa, sb, sc) = (start(small()), start(small()), start(small()));
    let n = 1000;
    let (mut a, ta) = setup(&sa, n);
    let (mut b, tb) = setup(&sb, n);
    let (mut c, tc) = setup(&sc, n);
    let data = pattern(n as usize, 3);
    a.set_tensor(&ta, 0, &data).unwrap();
    a.take_stats();

    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Direct
    );
    assert_eq!(b.get_tensor(&tb, 0, 4000).unwrap(), data);
    assert_eq!(
        copy_between(&mut b, &tb, &mut c, &tc).unwrap(),
        CopyPath::Direct
    );
    assert_eq!(c.get_tensor(&tc, 0, 4000).unwrap(), data);

    // The coordinator only sent the small COPY_TENSOR_TO request.
    let st = a.take_stats().unwrap();
    assert_eq!(st.get(Command::CopyTensorTo).count, 1);
    assert_eq!(st.get(Command::GetTensor).count, 0);
    assert!(st.total().request_bytes < 1000);

    // A second copy reuses the cached peer connection; new data lands.
    let data2 = pattern(n as usize, 77);
    a.set_tensor(&ta, 0, &data2).unwrap();
    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Direct
    );
    assert_eq!(b.get_tensor(&tb, 0, 4000).unwrap(), data2);
    // Probe connections close asynchronously; wait for them, then count.
    wait_sessions(&sb, 2);
    assert_eq!(
        sb.shared().live_sessions(),
        2,
        "client + one cached peer connection"
    );

    // Peer connections close with the session that asked.
    drop(a);
    wait_sessions(&sb, 1);
    assert_eq!(sb.shared().live_sessions(), 1);
    assert_eq!(b.get_tensor(&tb, 0, 4000).unwrap(), data2);
}

#[test]
fn hub_when_p2p_disabled_gives_same_data() {
    let (sa, sb) = (start(small()), start(small()));
    let n = 300;
    let mut a = connect_with(
        &sa,
        ClientConfig {
            p2p: false,
            stats: true,
            ..ClientConfig::default()
        },
    );
    let (ab, abase) = alloc(&mut a, 1 << 20);
    let ta = f32_tensor(1, ab, abase, 0, n);
    let (mut b, tb) = setup(&sb, n);
    let data = pattern(n as usize, 9);
    a.set_tensor(&ta, 0, &data).unwrap();
    a.take_stats();
    b.take_stats();
    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(b.get_tensor(&tb, 0, 1200).unwrap(), data);
    let sa_stats = a.take_stats().unwrap();
    let sb_stats = b.take_stats().unwrap();
    assert_eq!(sa_stats.get(Command::GetTensor).count, 1);
    assert_eq!(sa_stats.get(Command::GetTensor).response_bytes, 8 + 1200);
    assert_eq!(sb_stats.get(Command::SetTensor).count, 1);
    assert_eq!(
        sb_stats.get(Command::SetTensor).request_bytes,
        9 + 296 + 1 + 8 + 1200
    );
}

#[test]
fn destination_down_answers_zero_and_falls_back() {
    let (sa, sb) = (start(small()), start(small()));
    let dead = {
        let d = start(small());
        d.endpoint()
    }; // dropped: nothing listens there any more
    let (mut a, ta) = setup(&sa, 64);
    let (mut b, tb) = setup(&sb, 64);
    let data = pattern(64, 1);
    a.set_tensor(&ta, 0, &data).unwrap();
    // Raw answer: 0, and the connection stays usable.
    assert!(!a.copy_tensor_to(&ta, &tb, 256, &dead).unwrap());
    assert_eq!(a.device_count().unwrap(), 1);
    // The client reaches b, the source does not (advertised address is dead).
    b.set_endpoint(&dead);
    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(b.get_tensor(&tb, 0, 256).unwrap(), data);
}

#[test]
fn upstream_like_destination_answers_zero_and_falls_back() {
    // Like ggml's own server: no extension, one connection at a time.
    let sa = start(ServerConfig {
        peer_connect_timeout: std::time::Duration::from_millis(300),
        ..small()
    });
    let sb = start(ServerConfig {
        extensions: false,
        max_connections: 1,
        ..small()
    });
    let (mut a, ta) = setup(&sa, 64);
    let (mut b, tb) = setup(&sb, 64);
    assert!(
        b.probe_extensions().is_none(),
        "no extension on an upstream-like server"
    );
    assert_eq!(b.device_count().unwrap(), 1, "reconnected after the probe");
    let data = pattern(64, 2);
    a.set_tensor(&ta, 0, &data).unwrap();
    // Asked anyway, the source cannot get through (busy or no extension): 0.
    assert!(!a.copy_tensor_to(&ta, &tb, 256, b.endpoint()).unwrap());
    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(b.get_tensor(&tb, 0, 256).unwrap(), data);
    // The other direction: the source is upstream-like, so the client never
    // sends it COPY_TENSOR_TO.
    let data2 = pattern(64, 5);
    b.set_tensor(&tb, 0, &data2).unwrap();
    assert_eq!(
        copy_between(&mut b, &tb, &mut a, &ta).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(a.get_tensor(&ta, 0, 256).unwrap(), data2);
    assert_eq!(b.stats().unwrap().get(Command::CopyTensorTo).count, 0);
}

#[test]
fn destination_rejecting_the_write_answers_zero() {
    let (sa, sb) = (start(small()), start(small()));
    let (mut a, ta) = setup(&sa, 64);
    let (mut b, tb) = setup(&sb, 64);
    let data = pattern(64, 4);
    a.set_tensor(&ta, 0, &data).unwrap();
    // A destination tensor the destination refuses (unknown handle there).
    let mut bad = tb.clone();
    bad.buffer ^= 0x55;
    assert!(!a.copy_tensor_to(&ta, &bad, 256, b.endpoint()).unwrap());
    // Source connection and both servers fine; a good copy works again
    // (the dropped peer connection is re-opened).
    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Direct
    );
    assert_eq!(b.get_tensor(&tb, 0, 256).unwrap(), data);
    assert!(sb.shared().refused_connections() >= 1);
}

#[test]
fn source_allow_list_refuses_other_destinations() {
    let sb = start(small());
    let sa = start(ServerConfig {
        peer_allow: PeerAllow::parse(&["127.0.0.1:1".to_string()]).unwrap(),
        ..small()
    });
    let (mut a, ta) = setup(&sa, 16);
    let (mut b, tb) = setup(&sb, 16);
    let data = pattern(16, 6);
    a.set_tensor(&ta, 0, &data).unwrap();
    assert_eq!(
        copy_between(&mut a, &ta, &mut b, &tb).unwrap(),
        CopyPath::Hub
    );
    assert_eq!(b.get_tensor(&tb, 0, 64).unwrap(), data);
}

#[test]
fn malformed_copy_to_closes_only_that_connection() {
    let (sa, sb) = (start(small()), start(small()));
    let (mut a, ta) = setup(&sa, 16);
    let (mut a2, ta2) = setup(&sa, 16);
    let (b, tb) = setup(&sb, 16);
    a2.set_tensor(&ta2, 0, &pattern(16, 8)).unwrap();
    // Source range larger than the source tensor: validated like GET_TENSOR.
    assert!(a.copy_tensor_to(&ta, &tb, 1 << 30, b.endpoint()).is_err());
    assert!(is_closed(&mut a));
    assert_eq!(a2.get_tensor(&ta2, 0, 64).unwrap(), pattern(16, 8));
    // Upstream clients never see the extension: extension commands on a
    // server with it disabled close the connection like any unknown byte.
    let su = start(ServerConfig {
        extensions: false,
        ..small()
    });
    let mut u = connect(&su);
    assert!(u.peer_barrier().is_err());
    assert_eq!(connect(&su).device_count().unwrap(), 1);
}

#[test]
fn self_copy_through_own_endpoint() {
    let sa = start(small());
    let (mut a, ta) = setup(&sa, 32);
    let (mut a2, _) = setup(&sa, 32);
    let mut t2 = ta.clone();
    t2.data += 4096;
    let data = pattern(32, 12);
    a.set_tensor(&ta, 0, &data).unwrap();
    assert_eq!(
        copy_between(&mut a, &ta, &mut a2, &t2).unwrap(),
        CopyPath::Direct
    );
    assert_eq!(a.get_tensor(&t2, 0, 128).unwrap(), data);
}

/// Marks: the destination's next command waits on the server for the
/// copy itself (MARK_WAIT posted before it), not for the client to see the
/// COPY's answer.
#[test]
fn a_marked_copy_orders_the_destinations_next_command() {
    let (sa, sb) = (start(small()), start(small()));
    let n = 500;
    let (mut a, ta) = setup(&sa, n);
    let (mut b, tb) = setup(&sb, n);
    assert!(a.supports_marks() && b.supports_marks());
    let data = pattern(n as usize, 5);
    a.set_tensor(&ta, 0, &data).unwrap();
    let key = b.mark_open().unwrap().expect("a mark key");
    let endpoint = b.endpoint().to_owned();
    let tb2 = tb.clone();
    // The destination's client posts the wait and its read at once; the
    // read can only be answered after the mark, which comes after the data.
    let reader = std::thread::spawn(move || {
        b.post_mark_wait(key, 1, 20_000).unwrap();
        let got = b.get_tensor(&tb2, 0, u64::from(n) * 4).unwrap();
        (got, b.collect_posted().unwrap())
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!reader.is_finished(), "the read ran before the copy landed");
    a.post_copy_tensor_to_mark(&ta, &tb, u64::from(n) * 4, &endpoint, (key, 1))
        .unwrap();
    assert_eq!(a.collect_posted().unwrap(), vec![true]);
    let (got, answers) = reader.join().unwrap();
    assert_eq!(got, data);
    assert_eq!(answers, vec![true]);
}

/// Another tenant's marks neither complete nor block a wait, and it cannot
/// wait on (or learn anything from) a key it does not hold; keys are
/// bounded per session and go with it.
#[test]
fn marks_of_another_tenant_do_not_count() {
    let (sa, sb) = (start(small()), start(small()));
    let n = 64;
    let (mut a, ta) = setup(&sa, n);
    let (mut mine, tb) = setup(&sb, n);
    let mut theirs = connect_with(&sb, stats_cfg());
    let key = mine.mark_open().unwrap().expect("a mark key");
    let other = theirs.mark_open().unwrap().expect("a mark key");
    assert_ne!(key, other);
    // The other tenant marks its own key, and guesses at ours.
    let endpoint = mine.endpoint().to_owned();
    assert!(
        a.copy_tensor_to_mark(&ta, &tb, 256, &endpoint, (other, 1))
            .unwrap()
    );
    assert!(!theirs.peer_mark(key ^ 0x5a5a, 1).unwrap());
    assert!(!theirs.mark_wait(key, 1, 5_000).unwrap(), "not its key");
    let t = std::time::Instant::now();
    assert!(
        !mine.mark_wait(key, 1, 300).unwrap(),
        "their mark ended our wait"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
    // Our own mark does; then theirs still waits for theirs only.
    assert!(
        a.copy_tensor_to_mark(&ta, &tb, 256, &endpoint, (key, 2))
            .unwrap()
    );
    assert!(mine.mark_wait(key, 2, 5_000).unwrap());
    assert!(theirs.mark_wait(other, 1, 5_000).unwrap());
    // Bounded keys per session.
    let more: Vec<_> = (0..8).map(|_| mine.mark_open().unwrap()).collect();
    assert_eq!(more.iter().filter(|k| k.is_some()).count(), 3);
    assert_eq!(sb.shared().marks.len(), 5);
    drop(mine);
    wait_sessions(&sb, 2);
    assert_eq!(sb.shared().marks.len(), 1, "keys go with their session");
    // A mark for a key nobody holds is refused, and so is the copy.
    assert!(
        !a.copy_tensor_to_mark(&ta, &tb, 256, &endpoint, (key, 3))
            .unwrap()
    );
}

/// A wait whose copy never comes (the source died) answers 0 within its
/// deadline, and the session serves on.
#[test]
fn a_wait_without_its_copy_fails_within_its_deadline() {
    let sb = start(small());
    let (mut b, tb) = setup(&sb, 16);
    let key = b.mark_open().unwrap().expect("a mark key");
    let t = std::time::Instant::now();
    b.post_mark_wait(key, 1, 500).unwrap();
    assert_eq!(b.get_tensor(&tb, 0, 64).unwrap().len(), 64);
    assert_eq!(b.collect_posted().unwrap(), vec![false]);
    let took = t.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(500) && took < std::time::Duration::from_secs(10),
        "{took:?}"
    );
}
