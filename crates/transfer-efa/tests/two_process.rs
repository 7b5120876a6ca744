//! Two separate processes over a real provider: this test binary re-runs
//! itself as the peer (`peer_main`, active only with TRANSFER_EFA_PEER_ROLE
//! set), they exchange engine addresses and region descriptors over the
//! child's stdin/stdout, and every transfer is verified on the other side.
//! Also: the peer process killed in the middle of a stream of writes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use transfer_core::{
    EngineAddress, Notify, PagedWriteRequest, Pages, RemoteRegion, RemoteTarget, TransferEngine,
    TransferError, WriteRequest, WriteShape,
};
use transfer_efa::{Config, Library, Provider, open_loopback_domains};

const ROLE: &str = "TRANSFER_EFA_PEER_ROLE";
const GUARD: Duration = Duration::from_secs(60);
const REGION: usize = 4 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn config(provider: &str) -> Config {
    Config::loopback(Provider::parse(provider)).with_peer_timeout(Duration::from_secs(3))
}

fn engine(provider: &str) -> TransferEngine {
    let domains = open_loopback_domains(&config(provider), 1).unwrap();
    TransferEngine::builder().group(domains).build().unwrap()
}

/// The peer process: serves line commands on stdin until EXIT.
#[test]
fn peer_main() {
    let Ok(provider) = std::env::var(ROLE) else {
        return;
    };
    let e = Arc::new(engine(&provider));
    let region = e.alloc_host(REGION, 0).unwrap();
    let driver: Arc<Mutex<Option<transfer_core::Peer>>> = Arc::default();
    let (weak, d2) = (Arc::downgrade(&e), driver.clone());
    e.start_recv_pool(8, 4096, move |bytes| {
        if let (Some(e), Some(p)) = (weak.upgrade(), d2.lock().unwrap().clone()) {
            let _ = e.submit_send(&p, bytes, Notify::callback(|_| {}));
        }
    })
    .unwrap();
    let mut out = std::io::stdout();
    writeln!(
        out,
        "ADDR {} {}",
        hex(&e.address().to_bytes().unwrap()),
        hex(&region.remote().to_bytes().unwrap())
    )
    .unwrap();
    out.flush().unwrap();
    let mut back: Option<RemoteTarget> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        let reply = match w.as_slice() {
            ["PEER", addr, desc] => {
                let p = e
                    .peer(&EngineAddress::from_bytes(&unhex(addr)).unwrap())
                    .unwrap();
                back = Some(
                    e.remote(&p, RemoteRegion::from_bytes(&unhex(desc)).unwrap())
                        .unwrap(),
                );
                *driver.lock().unwrap() = Some(p);
                "OK".to_string()
            }
            ["WAIT", imm, count] => {
                match e.wait_imm(imm.parse().unwrap(), count.parse().unwrap(), GUARD) {
                    Ok(()) => "OK".into(),
                    Err(err) => format!("ERR {err}"),
                }
            }
            ["SUM", off, len] => {
                let mut buf = vec![0u8; len.parse().unwrap()];
                region.read_at(off.parse().unwrap(), &mut buf).unwrap();
                format!("SUM {}", checksum(&buf))
            }
            ["ECHO", imm, reply, n] => {
                let t = back.as_ref().unwrap();
                for _ in 0..n.parse::<u32>().unwrap() {
                    e.wait_imm(imm.parse().unwrap(), 1, GUARD).unwrap();
                    let req = WriteRequest {
                        src: &region,
                        src_offset: 0,
                        dst: t,
                        dst_offset: 0,
                        len: 0,
                        imm: Some(reply.parse().unwrap()),
                    };
                    e.write(req).unwrap().wait_timeout(GUARD).unwrap();
                }
                "OK".into()
            }
            ["EXIT"] => break,
            other => format!("ERR unknown {other:?}"),
        };
        writeln!(out, "{reply}").unwrap();
        out.flush().unwrap();
    }
}

struct PeerProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: EngineAddress,
    region: RemoteRegion,
}

impl PeerProc {
    // The child is waited for in Drop (EXIT, then kill after 10 s).
    #[allow(clippy::zombie_processes)]
    fn spawn(provider: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "peer_main", "--nocapture", "--test-threads=1"])
            .env(ROLE, provider)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "peer exited before its address"
            );
            // The test harness prints "test peer_main ... " before our output.
            if let Some(rest) = line.trim().split_once("ADDR ").map(|(_, r)| r) {
                let (a, d) = rest.split_once(' ').unwrap();
                let addr = EngineAddress::from_bytes(&unhex(a)).unwrap();
                let region = RemoteRegion::from_bytes(&unhex(d)).unwrap();
                return Self {
                    child,
                    stdin,
                    stdout,
                    addr,
                    region,
                };
            }
        }
    }

    fn call(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "peer died during {cmd}"
            );
            let l = line.trim();
            if l == "OK" || l.starts_with("SUM ") || l.starts_with("ERR ") {
                return l.to_string();
            }
        }
    }

    fn sum(&mut self, off: usize, len: usize) -> u64 {
        let r = self.call(&format!("SUM {off} {len}"));
        r.strip_prefix("SUM ").unwrap().parse().unwrap()
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "EXIT");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn available(provider: &str) -> bool {
    if let Err(e) = Library::load() {
        eprintln!("SKIP: libfabric cannot be loaded: {e}");
        return false;
    }
    if let Err(e) = open_loopback_domains(&config(provider), 1) {
        eprintln!("SKIP: provider {provider} unavailable: {e}");
        return false;
    }
    true
}

fn every_operation_across_processes(provider: &str) {
    if !available(provider) {
        return;
    }
    let a = engine(provider);
    let mut p = PeerProc::spawn(provider);
    let peer = a.peer(&p.addr).unwrap();
    let t = a.remote(&peer, p.region.clone()).unwrap();
    let src = a.alloc_host(REGION, 0).unwrap();
    let data = pattern(REGION, 7);
    src.write_at(0, &data).unwrap();
    let inbox = a.alloc_host(4096, 0).unwrap();
    let echoed = Arc::new(Mutex::new(Vec::new()));
    let sink = echoed.clone();
    a.start_recv_pool(8, 4096, move |b| sink.lock().unwrap().push(b.to_vec()))
        .unwrap();
    assert_eq!(
        p.call(&format!(
            "PEER {} {}",
            hex(&a.address().to_bytes().unwrap()),
            hex(&inbox.remote().to_bytes().unwrap())
        )),
        "OK"
    );

    // Single write with an immediate, 1 MiB + 3.
    let len = (1 << 20) + 3;
    a.write(WriteRequest {
        src: &src,
        src_offset: 5,
        dst: &t,
        dst_offset: 11,
        len: len as u64,
        imm: Some(41),
    })
    .unwrap()
    .wait_timeout(GUARD)
    .unwrap();
    let n = a
        .imms_delivered(&t, 0, WriteShape::Single { len: len as u64 })
        .unwrap();
    assert_eq!(p.call(&format!("WAIT 41 {n}")), "OK");
    assert_eq!(p.sum(11, len), checksum(&data[5..5 + len]));

    // Paged write: 64 reversed pages of 4000 bytes into consecutive 4 KiB slots.
    let pages = 64u32;
    let src_pages = Pages {
        indices: (0..pages).rev().collect(),
        stride: 4096,
        offset: 0,
    };
    let dst_pages = Pages {
        indices: (0..pages).collect(),
        stride: 4096,
        offset: 2 << 20,
    };
    let req = PagedWriteRequest {
        src: &src,
        src_pages,
        dst: &t,
        dst_pages,
        page_len: 4000,
        imm: Some(42),
    };
    a.paged_write(req).unwrap().wait_timeout(GUARD).unwrap();
    let n = a
        .imms_delivered(
            &t,
            0,
            WriteShape::Paged {
                pages: pages as usize,
            },
        )
        .unwrap();
    assert_eq!(p.call(&format!("WAIT 42 {n}")), "OK");
    for i in 0..pages as usize {
        let s = (pages as usize - 1 - i) * 4096;
        assert_eq!(
            p.sum((2 << 20) + i * 4096, 4000),
            checksum(&data[s..s + 4000]),
            "page {i}"
        );
    }

    // Barrier (zero-byte immediate write).
    let group = a.add_group(vec![t.clone()]);
    a.barrier(&group, 43).unwrap().wait_timeout(GUARD).unwrap();
    assert_eq!(p.call("WAIT 43 1"), "OK");

    // Immediate ping-pong: the peer answers into our inbox.
    writeln!(p.stdin, "ECHO 44 45 20").unwrap();
    p.stdin.flush().unwrap();
    for _ in 0..20 {
        a.write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 0,
            imm: Some(44),
        })
        .unwrap()
        .wait_timeout(GUARD)
        .unwrap();
        a.wait_imm(45, 1, GUARD).unwrap();
    }
    let mut line = String::new();
    p.stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "OK");

    // Send / receive: the peer's pool echoes each message back to ours.
    let msgs: Vec<Vec<u8>> = (0..10).map(|i| pattern(100 + i * 300, i as u8)).collect();
    for m in &msgs {
        a.send(&peer, m).unwrap().wait_timeout(GUARD).unwrap();
    }
    let deadline = Instant::now() + GUARD;
    while echoed.lock().unwrap().len() < msgs.len() {
        assert!(Instant::now() < deadline, "echoes missing");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut got = echoed.lock().unwrap().clone();
    let mut want = msgs.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn every_operation_across_processes_tcp() {
    every_operation_across_processes("tcp");
}

#[test]
fn every_operation_across_processes_shm() {
    every_operation_across_processes("shm");
}

/// The peer process is SIGKILLed in the middle of a stream of writes: every
/// pending write completes (with an error) in bounded time, later writes to
/// it fail, and this process goes on working with a new peer.
#[test]
fn peer_killed_mid_stream_tcp() {
    if !available("tcp") {
        return;
    }
    let a = engine("tcp");
    let mut p = PeerProc::spawn("tcp");
    let peer = a.peer(&p.addr).unwrap();
    let t = a.remote(&peer, p.region.clone()).unwrap();
    let src = a.alloc_host(REGION, 0).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let total = 3000usize;
    for i in 0..total {
        if i == 200 {
            p.child.kill().unwrap();
            p.child.wait().unwrap();
        }
        let (d, f) = (done.clone(), failed.clone());
        let req = WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 256 * 1024,
            imm: Some(9),
        };
        let notify = Notify::callback(move |r| {
            if r.is_err() {
                f.fetch_add(1, Ordering::SeqCst);
            }
            d.fetch_add(1, Ordering::SeqCst);
        });
        if a.submit_write(req, notify).is_err() {
            // Refused at submit: its notification already ran.
        }
    }
    let deadline = Instant::now() + GUARD;
    while done.load(Ordering::SeqCst) < total {
        assert!(
            Instant::now() < deadline,
            "only {} of {total} writes completed after the peer died",
            done.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        failed.load(Ordering::SeqCst) > 0,
        "no write failed although the peer was killed"
    );
    let later = a
        .write(WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 64,
            imm: None,
        })
        .unwrap()
        .wait_timeout(GUARD);
    assert!(later.is_err(), "a write to the dead peer succeeded");
    if let Err(e) = &later {
        assert!(!matches!(e, TransferError::Shutdown { .. }), "{e}");
    }
    // This process keeps working: a new peer process.
    let mut q = PeerProc::spawn("tcp");
    let peer2 = a.peer(&q.addr).unwrap();
    let t2 = a.remote(&peer2, q.region.clone()).unwrap();
    let data = pattern(4096, 3);
    src.write_at(0, &data).unwrap();
    a.write(WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t2,
        dst_offset: 0,
        len: 4096,
        imm: Some(1),
    })
    .unwrap()
    .wait_timeout(GUARD)
    .unwrap();
    assert_eq!(q.call("WAIT 1 1"), "OK");
    assert_eq!(q.sum(0, 4096), checksum(&data));
}
