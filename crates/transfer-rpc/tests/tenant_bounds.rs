//! Issue 22: what one tenant can make the server hold or wait for, attacked
//! from outside over real sockets (and a real server process where the
//! process's own limits matter). Each case: the attacker hits a bound the
//! operator set, and a well-behaved client is still served.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use transfer_rpc::client::{Client, ClientConfig};
use transfer_rpc::protocol::frame::encode_request;
use transfer_rpc::protocol::{Command, HelloRequest, Request};
use transfer_rpc::server::ServerConfig;

fn hello_frame() -> Vec<u8> {
    encode_request(
        Command::Hello,
        &Request::Hello(HelloRequest::default()).encode_payload(),
    )
}

fn quick() -> ClientConfig {
    ClientConfig {
        connect_timeout: Some(Duration::from_secs(5)),
        io_timeout: Some(Duration::from_secs(5)),
        ..ClientConfig::default()
    }
}

/// Zero-byte buffers cost a page each and a session owns at most its cap;
/// another session's allocation still succeeds.
#[test]
fn zero_size_buffers_are_charged_and_capped_per_session() {
    let h = start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        max_buffers_per_session: 16,
        ..ServerConfig::default()
    });
    let mut attacker = connect(&h);
    let (free0, total) = attacker.get_device_memory(0).unwrap();
    let mut granted = 0;
    for _ in 0..100 {
        if attacker.alloc_buffer(0, 0).unwrap().is_some() {
            granted += 1;
        }
    }
    let (free1, _) = attacker.get_device_memory(0).unwrap();
    println!("zero-size allocations granted: {granted} of 100; free {free0} -> {free1} of {total}");
    assert_eq!(granted, 16, "--max-buffers-per-session");
    assert_eq!(free0 - free1, 16 * 4096, "each charged a page");
    let mut victim = connect(&h);
    let (b, _) = alloc(&mut victim, 1 << 20);
    assert_ne!(b, 0);
    // The attacker's cap comes back when it frees.
    drop(attacker);
    let t0 = Instant::now();
    while h.shared().registry.len() != 1 {
        assert!(t0.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A server process with 64 descriptors: silent connections use them up
/// and accept() fails with EMFILE. It must back off, not spin a core and
/// flood its log, and serve again once descriptors are back.
#[test]
fn accept_errors_back_off() {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_transfer-rpc-server"));
    cmd.args(["--port", "0", "--hello-timeout-s", "3"])
        .stderr(std::process::Stdio::piped());
    // SAFETY: between fork and exec only setrlimit (async-signal-safe) runs.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut endpoint = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        eprintln!("{line}");
        if let Some(rest) = line.split("listening on ").nth(1) {
            endpoint = rest.split(',').next().map(str::to_owned);
            break;
        }
    }
    let endpoint = endpoint.expect("server started");
    let failures = Arc::new(AtomicU64::new(0));
    let f = Arc::clone(&failures);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if line.contains("accept failed") {
                f.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    // Each waiting connection holds three descriptors: 40 take them all.
    let silent: Vec<TcpStream> = (0..40)
        .filter_map(|_| TcpStream::connect(&endpoint).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id();
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_millis(1500));
    let ticks = cpu_ticks(pid) - c0;
    let wall = t0.elapsed();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu = ticks as f64 / hz / wall.as_secs_f64();
    let logged = failures.load(Ordering::Relaxed);
    println!(
        "out of descriptors: server CPU {:.0}% of a core, {logged} accept-failure log lines",
        cpu * 100.0
    );
    assert!(logged > 0, "the test did not exhaust the descriptors");
    assert!(cpu < 0.3, "accept loop spins: {:.0}% CPU", cpu * 100.0);
    assert!(logged <= 5, "{logged} log lines in 1.5 s");
    // Once the silent connections are gone it serves again.
    drop(silent);
    let t0 = Instant::now();
    loop {
        match Client::connect(&endpoint, quick()) {
            Ok(mut c) => {
                assert_eq!(c.device_count().unwrap(), 1);
                break;
            }
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "{e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until the server closes `s`; how long it took.
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

fn send_hello(s: &mut TcpStream) {
    s.write_all(&hello_frame()).unwrap();
    let mut answer = [0u8; 8 + 3];
    s.read_exact(&mut answer).unwrap();
}

/// A GRAPH_COMPUTE announcing 100 KiB (held in the in-flight budget) sent
/// one byte every 100 ms: each byte comes well inside the 500 ms frame
/// timeout, but the frame as a whole must end by its deadline.
#[test]
fn a_trickled_frame_is_closed_at_its_deadline() {
    let h = start(ServerConfig {
        frame_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    });
    let mut s = TcpStream::connect(h.addr()).unwrap();
    send_hello(&mut s);
    let mut head = vec![Command::GraphCompute.byte()];
    head.extend_from_slice(&(100u64 << 10).to_le_bytes());
    s.write_all(&head).unwrap();
    let t0 = Instant::now();
    let mut closed = None;
    let mut held = 0;
    while t0.elapsed() < Duration::from_secs(4) {
        held = held.max(h.shared().budget.used());
        if s.write_all(&[0]).is_err() {
            closed = Some(t0.elapsed());
            break;
        }
        let mut probe = s.try_clone().unwrap();
        if closed_within(&mut probe, Duration::from_millis(100)).is_some() {
            closed = Some(t0.elapsed());
            break;
        }
    }
    println!("trickled frame closed after {closed:?}, held {held} bytes of budget meanwhile");
    assert_eq!(held, 100 << 10, "the frame held its reservation");
    let took = closed.expect("a trickle kept its frame open for 4 s");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(h.shared().budget.used(), 0);
}

/// GET_TENSOR of 16 MiB taken by a client that reads 64 KiB every 100 ms
/// (progress on every write, 25 s for the whole answer): the answer has
/// one deadline, after which the connection and its budget are released.
#[test]
fn a_slow_reader_cannot_hold_an_answer_past_its_deadline() {
    let n: u64 = 16 << 20;
    let h = start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        frame_timeout: Duration::from_millis(500),
        // 16 MiB at 64 MiB/s: 250 ms on top of the timeout.
        frame_min_rate: 64 << 20,
        ..ServerConfig::default()
    });
    let mut owner = connect(&h);
    let (b, base) = alloc(&mut owner, n);
    let t = f32_tensor(1, b, base, 0, (n / 4) as u32);
    let mut s = TcpStream::connect(h.addr()).unwrap();
    send_hello(&mut s);
    let req = Request::GetTensor {
        tensor: Box::new(t),
        offset: 0,
        size: n,
    };
    s.write_all(&encode_request(Command::GetTensor, &req.encode_payload()))
        .unwrap();
    let t0 = Instant::now();
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    let mut released = None;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    while t0.elapsed() < Duration::from_secs(5) {
        if released.is_none() && got > 0 && h.shared().budget.used() == 0 {
            released = Some(t0.elapsed());
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got += k as u64,
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("slow reader: {got} of {n} bytes taken, budget released after {released:?}");
    let took = released.expect("the answer held its budget for 5 s");
    assert!(took < Duration::from_millis(2000), "{took:?}");
    assert!(got < n, "the whole answer went out");
    // The owner is still served.
    assert_eq!(
        owner
            .get_tensor(&f32_tensor(1, b, base, 0, 4), 0, 16)
            .unwrap(),
        vec![0u8; 16]
    );
}

/// An address that holds its share of sessions is refused at its HELLO at
/// once, not at the end of its HELLO deadline.
#[test]
fn a_hello_over_the_address_share_is_refused_at_once() {
    let h = start(ServerConfig {
        max_connections_per_address: 1,
        hello_timeout: Duration::from_secs(5),
        ..ServerConfig::default()
    });
    let _held = connect(&h);
    let t0 = Instant::now();
    let refused = Client::connect(&h.endpoint(), ClientConfig::default());
    let took = t0.elapsed();
    println!("second session from one address refused after {took:?}");
    assert!(refused.is_err());
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// The graph a session keeps for GRAPH_RECOMPUTE is charged against --mem
/// (GET_DEVICE_MEMORY shows it) and bounded per session: a graph padded
/// with thousands of tensors no node uses is refused, not kept.
#[test]
fn retained_graphs_are_counted_and_bounded() {
    let h = start_adding(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        max_graph_bytes_per_session: 256 << 10,
        ..ServerConfig::default()
    });
    let mut c = connect(&h);
    let (buf, base) = alloc(&mut c, 1 << 20);
    let (free0, _) = c.get_device_memory(0).unwrap();
    let g = add_graph(buf, base, 4);
    c.set_tensor(&g.tensors[0], 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    c.set_tensor(&g.tensors[1], 0, &f32_bytes(&[10.0; 4]))
        .unwrap();
    c.graph_compute(&g).unwrap();
    c.graph_recompute(0).unwrap();
    assert_eq!(
        floats(&c.get_tensor(&g.tensors[2], 0, 16).unwrap()),
        [11.0, 12.0, 13.0, 14.0]
    );
    let (free1, _) = c.get_device_memory(0).unwrap();
    println!(
        "a kept 3-tensor graph takes {} bytes of --mem",
        free0 - free1
    );
    assert!(free1 < free0, "the kept graph is not counted");
    // 5000 unused tensors beside the same node.
    let mut padded = add_graph(buf, base, 4);
    for i in 0..5000u64 {
        padded
            .tensors
            .push(f32_tensor(100 + i, buf, base, 4 * (i % 1000), 1));
    }
    c.graph_compute(&padded).unwrap();
    assert!(is_closed(&mut c), "a graph over --max-graph-mib was kept");
    // The closed session's graph and buffer are given back.
    let mut d = connect(&h);
    let t0 = Instant::now();
    while d.get_device_memory(0).unwrap().0 != 64 << 20 {
        assert!(t0.elapsed() < Duration::from_secs(5), "not given back");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SET_TENSOR_HASH reads its cache entry into memory: that memory comes
/// from the in-flight budget (without room the client is told "not
/// cached" and uploads it).
#[test]
fn hash_cache_reads_are_counted_in_the_inflight_budget() {
    let dir = std::env::temp_dir().join(format!("tenant-bounds-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let h = start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        cache_dir: Some(dir.clone()),
        inflight_budget: 8 << 20,
        inflight_per_address: 1 << 20,
        ..ServerConfig::default()
    });
    let mut c = connect(&h);
    let (buf, base) = alloc(&mut c, 4 << 20);
    let big: Vec<u8> = (0..2u32 << 20).map(|i| (i % 253) as u8).collect();
    let small = vec![9u8; 512 << 10];
    let t = f32_tensor(1, buf, base, 0, 1 << 20);
    c.set_tensor_cached(&t, 0, &big, true).unwrap();
    c.set_tensor_cached(&t, 0, &small, true).unwrap();
    let hit_small = c
        .set_tensor_hash(&t, 0, transfer_rpc::hash::fnv1a64(&small))
        .unwrap();
    let hit_big = c
        .set_tensor_hash(&t, 0, transfer_rpc::hash::fnv1a64(&big))
        .unwrap();
    println!("cache hits within a 1 MiB share: 512 KiB {hit_small}, 2 MiB {hit_big}");
    assert!(hit_small);
    assert!(!hit_big, "a 2 MiB entry read outside a 1 MiB share");
    assert_eq!(h.shared().budget.used(), 0);
    // The fallback upload streams within the share.
    c.set_tensor(&t, 0, &big).unwrap();
    assert_eq!(c.get_tensor(&t, 0, 64).unwrap(), big[..64]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A session copying to ever new destinations keeps at most
/// --max-peer-connections of them open (each is a socket here and a
/// session on the destination).
#[test]
fn peer_connections_are_capped_per_session() {
    let src = start(ServerConfig {
        max_peer_connections_per_session: 2,
        ..ServerConfig::default()
    });
    let dests: Vec<_> = (0..4).map(|_| start_default()).collect();
    let mut c = connect(&src);
    let (sb, sbase) = alloc(&mut c, 4096);
    let st = f32_tensor(1, sb, sbase, 0, 16);
    c.set_tensor(&st, 0, &[7u8; 64]).unwrap();
    let mut owners = Vec::new();
    for d in &dests {
        let mut o = connect(d);
        let (db, dbase) = alloc(&mut o, 4096);
        let dt = f32_tensor(1, db, dbase, 0, 16);
        assert!(c.copy_tensor_to(&st, &dt, 64, &d.endpoint()).unwrap());
        assert_eq!(o.get_tensor(&dt, 0, 64).unwrap(), vec![7u8; 64]);
        owners.push(o);
    }
    // Each destination: its owner's session, plus the source's peer
    // connection while it is kept.
    let peers = || -> usize { dests.iter().map(|d| d.shared().live_sessions() - 1).sum() };
    let t0 = Instant::now();
    while peers() > 2 && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "peer connections held after copies to 4 destinations: {}",
        peers()
    );
    assert_eq!(peers(), 2);
}

/// SET_TENSOR has one implementation: a whole frame handed to
/// `Session::handle_frame` (what the fuzzers drive) takes the socket's
/// streaming path, in-flight budget included. With this address's share
/// held, it waits and is refused; once the share is free it lands.
#[test]
fn set_tensor_from_a_whole_frame_takes_the_socket_path() {
    use transfer_rpc::server::session::Session;
    let h = start(ServerConfig {
        memory_quota: 16 << 20,
        max_buffer_size: 16 << 20,
        inflight_budget: 8 << 20,
        inflight_per_address: 256 << 10,
        frame_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    });
    let ip = std::net::IpAddr::from([127, 0, 0, 1]);
    h.shared().admission.accepted(1 << 40, ip, None);
    let mut s = Session::new(1 << 40, ip, Arc::clone(h.shared()));
    let hello = Request::Hello(HelloRequest::default()).encode_payload();
    s.handle_frame(Command::Hello, &hello).unwrap();
    let reply = s
        .handle_frame(
            Command::AllocBuffer,
            &Request::AllocBuffer {
                device: 0,
                size: 1 << 20,
            }
            .encode_payload(),
        )
        .unwrap();
    let Some(transfer_rpc::protocol::Response::AllocBuffer { remote_ptr, .. }) = reply else {
        panic!("{reply:?}")
    };
    let base = h.shared().registry.get(remote_ptr).unwrap().base;
    let t = f32_tensor(1, remote_ptr, base, 0, 1 << 18);
    let data = vec![0x3Cu8; 1 << 20];
    let frame = Request::SetTensor {
        tensor: Box::new(t),
        cache_flag: 0,
        offset: 0,
        data: &data,
    }
    .encode_payload();
    let held = h
        .shared()
        .budget
        .reserve_as("test", 256 << 10, Duration::ZERO, Some(ip))
        .unwrap();
    let refused = s.handle_frame(Command::SetTensor, &frame);
    println!("SET_TENSOR through handle_frame with the share held: {refused:?}");
    assert!(refused.is_err(), "a whole-frame SET_TENSOR took no budget");
    drop(held);
    s.handle_frame(Command::SetTensor, &frame).unwrap();
    assert_eq!(
        h.shared()
            .registry
            .read_range("t", remote_ptr, 0, 1 << 20)
            .unwrap(),
        data
    );
    s.close();
}

/// Copies and answers stage a piece at a time: a copy or a GET_TENSOR far
/// larger than an address's in-flight share goes through (holding at most
/// one piece), locally and to a peer.
#[test]
fn copies_larger_than_the_share_are_staged_in_pieces() {
    let cfg = || ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        inflight_budget: 8 << 20,
        inflight_per_address: 1 << 20,
        ..ServerConfig::default()
    };
    let (src, dst) = (start(cfg()), start(cfg()));
    let n: u64 = 6 << 20;
    let mut a = connect(&src);
    let (ha, ba) = alloc(&mut a, 2 * n);
    let (t1, t2) = (
        f32_tensor(1, ha, ba, 0, (n / 4) as u32),
        f32_tensor(2, ha, ba, n, (n / 4) as u32),
    );
    let data: Vec<u8> = (0..n).map(|i| (i % 241) as u8).collect();
    a.set_tensor(&t1, 0, &data).unwrap();
    assert!(a.get_tensor(&t1, 0, n).unwrap() == data, "a 6 MiB answer");
    assert!(a.copy_tensor(&t1, &t2).unwrap());
    assert_eq!(
        a.get_tensor(&t2, n - 4096, 4096).unwrap(),
        data[(n - 4096) as usize..]
    );
    let mut b = connect(&dst);
    let (hb, bb) = alloc(&mut b, n);
    let tb = f32_tensor(1, hb, bb, 0, (n / 4) as u32);
    assert!(a.copy_tensor_to(&t1, &tb, n, &dst.endpoint()).unwrap());
    assert_eq!(
        b.get_tensor(&tb, n - 4096, 4096).unwrap(),
        data[(n - 4096) as usize..]
    );
    assert_eq!(b.get_tensor(&tb, 0, 4096).unwrap(), data[..4096]);
    assert_eq!(src.shared().budget.used(), 0);
}
