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
