//! The two-process cases: the test binary re-runs itself as the peer (the
//! generated `two_process_peer` test, active only when
//! [`PEER_ENV`] names its module), the two exchange engine addresses and
//! region descriptors over the child's stdin/stdout, and the peer process
//! verifies every byte it received. Also: the peer SIGKILLed mid-stream.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Harness;
use super::util::pattern;
use crate::addr::EngineAddress;
use crate::completion::Notify;
use crate::engine::TransferEngine;
use crate::memory::RemoteRegion;
use crate::peer::{Peer, RemoteTarget};
use crate::request::{PagedWriteRequest, Pages, WriteRequest};
use crate::shard::WriteShape;

type R = std::result::Result<(), String>;

/// Set in the child to the module path of the suite it serves.
pub const PEER_ENV: &str = "TRANSFER_CONFORMANCE_PEER";

const GUARD: Duration = Duration::from_secs(60);
const REGION: usize = 4 << 20;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> std::result::Result<Vec<u8>, String> {
    if s.len() % 2 != 0 {
        return Err("odd hex length".into());
    }
    (0..s.len() / 2)
        .map(|i| {
            u8::from_str_radix(s.get(2 * i..2 * i + 2).unwrap_or(""), 16).map_err(|e| e.to_string())
        })
        .collect()
}

fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

fn one_engine(h: &dyn Harness) -> std::result::Result<TransferEngine, String> {
    h.engines(1, 1)
        .map_err(err("building an engine"))?
        .pop()
        .ok_or_else(|| "harness built no engine".to_string())
}

/// The peer side: serves line commands on stdin until EXIT or end of input.
/// Returns at once (Ok) unless this process was spawned as the peer of `module`.
pub fn peer_main(h: &dyn Harness, module: &str) -> R {
    if std::env::var(PEER_ENV).ok().as_deref() != Some(module) {
        return Ok(());
    }
    let e = Arc::new(one_engine(h)?);
    let region = e.alloc_host(REGION, 0).map_err(err("alloc"))?;
    let driver: Arc<Mutex<Option<Peer>>> = Arc::default();
    let (weak, d2) = (Arc::downgrade(&e), driver.clone());
    e.start_recv_pool(8, 4096, move |bytes| {
        let peer = d2.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let (Some(e), Some(p)) = (weak.upgrade(), peer) {
            let _ = e.submit_send(&p, bytes, Notify::callback(|_| {}));
        }
    })
    .map_err(err("recv pool"))?;
    let mut out = std::io::stdout();
    let addr = e.address().to_bytes().map_err(err("address"))?;
    let desc = region.remote().to_bytes().map_err(err("descriptor"))?;
    writeln!(out, "ADDR {} {}", hex(&addr), hex(&desc)).map_err(err("stdout"))?;
    out.flush().map_err(err("stdout"))?;
    let mut back: Option<RemoteTarget> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(err("stdin"))?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> std::result::Result<u64, String> {
            w.get(i)
                .ok_or("missing argument")?
                .parse::<u64>()
                .map_err(|e| e.to_string())
        };
        let reply: std::result::Result<String, String> = match w.first().copied() {
            Some("PEER") => (|| {
                let a = EngineAddress::from_bytes(&unhex(w.get(1).ok_or("addr")?)?)
                    .map_err(err("addr"))?;
                let d = RemoteRegion::from_bytes(&unhex(w.get(2).ok_or("desc")?)?)
                    .map_err(err("desc"))?;
                let p = e.peer(&a).map_err(err("peer"))?;
                back = Some(e.remote(&p, d).map_err(err("remote"))?);
                *driver.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
                Ok("OK".to_string())
            })(),
            Some("WAIT") => (|| {
                let imm = u32::try_from(num(1)?).map_err(|e| e.to_string())?;
                e.wait_imm(imm, num(2)?, GUARD).map_err(err("wait_imm"))?;
                Ok("OK".to_string())
            })(),
            Some("SUM") => (|| {
                let mut buf = vec![0u8; usize::try_from(num(2)?).map_err(|e| e.to_string())?];
                region
                    .read_at(
                        usize::try_from(num(1)?).map_err(|e| e.to_string())?,
                        &mut buf,
                    )
                    .map_err(err("read"))?;
                Ok(format!("SUM {}", checksum(&buf)))
            })(),
            Some("ECHO") => (|| {
                let t = back.as_ref().ok_or("PEER first")?;
                let imm = u32::try_from(num(1)?).map_err(|e| e.to_string())?;
                let reply = u32::try_from(num(2)?).map_err(|e| e.to_string())?;
                for _ in 0..num(3)? {
                    e.wait_imm(imm, 1, GUARD).map_err(err("wait_imm"))?;
                    let req = WriteRequest {
                        src: &region,
                        src_offset: 0,
                        dst: t,
                        dst_offset: 0,
                        len: 0,
                        imm: Some(reply),
                    };
                    e.write(req)
                        .map_err(err("write"))?
                        .wait_timeout(GUARD)
                        .map_err(err("write"))?;
                }
                Ok("OK".to_string())
            })(),
            Some("EXIT") | None => break,
            Some(other) => Err(format!("unknown command {other}")),
        };
        let text = reply.unwrap_or_else(|e| format!("ERR {e}"));
        writeln!(out, "{text}").map_err(err("stdout"))?;
        out.flush().map_err(err("stdout"))?;
    }
    Ok(())
}

/// A spawned peer process.
struct PeerProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: EngineAddress,
    region: RemoteRegion,
}

impl PeerProc {
    /// Re-runs this test binary as the peer of `module` (its generated
    /// `two_process_peer` test). The child is reaped in Drop.
    #[allow(clippy::zombie_processes)]
    fn spawn(module: &str) -> std::result::Result<Self, String> {
        // `module_path!()` starts with the crate name; libtest names tests without it.
        let test = match module.split_once("::") {
            Some((_, rest)) => format!("{rest}::two_process_peer"),
            None => "two_process_peer".to_string(),
        };
        let exe = std::env::current_exe().map_err(err("current_exe"))?;
        let mut child = Command::new(exe)
            .args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(PEER_ENV, module)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(err("spawning the peer"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("peer without pipes".into());
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            let n = stdout.read_line(&mut line).map_err(err("peer stdout"))?;
            if n == 0 {
                let _ = child.wait();
                return Err(format!("peer {test} exited before printing its address"));
            }
            // libtest prints "test <name> ... " before the peer's own output.
            if let Some((_, rest)) = line.trim().split_once("ADDR ") {
                let (a, d) = rest.split_once(' ').ok_or("bad ADDR line")?;
                let addr = EngineAddress::from_bytes(&unhex(a)?).map_err(err("peer address"))?;
                let region =
                    RemoteRegion::from_bytes(&unhex(d)?).map_err(err("peer descriptor"))?;
                return Ok(Self {
                    child,
                    stdin,
                    stdout,
                    addr,
                    region,
                });
            }
        }
    }

    /// The peer as `a` reaches it, and its region.
    fn target(&self, a: &TransferEngine) -> std::result::Result<(Peer, RemoteTarget), String> {
        let peer = a.peer(&self.addr).map_err(err("peer"))?;
        let t = a
            .remote(&peer, self.region.clone())
            .map_err(err("remote"))?;
        Ok((peer, t))
    }

    fn send(&mut self, cmd: &str) -> R {
        writeln!(self.stdin, "{cmd}").map_err(err("peer stdin"))?;
        self.stdin.flush().map_err(err("peer stdin"))
    }

    fn reply(&mut self, cmd: &str) -> std::result::Result<String, String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self
                .stdout
                .read_line(&mut line)
                .map_err(err("peer stdout"))?
                == 0
            {
                return Err(format!("peer died during {cmd}"));
            }
            let l = line.trim();
            if l == "OK" || l.starts_with("SUM ") {
                return Ok(l.to_string());
            }
            if let Some(e) = l.strip_prefix("ERR ") {
                return Err(format!("peer: {cmd}: {e}"));
            }
        }
    }

    fn call(&mut self, cmd: &str) -> std::result::Result<String, String> {
        self.send(cmd)?;
        self.reply(cmd)
    }

    fn sum(&mut self, off: usize, len: usize) -> std::result::Result<u64, String> {
        let r = self.call(&format!("SUM {off} {len}"))?;
        r.strip_prefix("SUM ")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad reply {r}"))
    }
}

impl Drop for PeerProc {
    fn drop(&mut self) {
        let _ = self.send("EXIT");
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

/// Every operation across two processes, verified by the peer process.
pub fn every_operation(h: &dyn Harness, module: &str) -> R {
    if !h.cross_process() {
        eprintln!("two-process cases: skipped, the harness's engines live in one process");
        return Ok(());
    }
    let a = one_engine(h)?;
    let mut p = PeerProc::spawn(module)?;
    let (peer, t) = p.target(&a)?;
    let src = a.alloc_host(REGION, 0).map_err(err("alloc"))?;
    let data = pattern(REGION, 7);
    src.write_at(0, &data).map_err(err("write_at"))?;
    let inbox = a.alloc_host(4096, 0).map_err(err("alloc"))?;
    let echoed = Arc::new(Mutex::new(Vec::new()));
    let sink = echoed.clone();
    a.start_recv_pool(8, 4096, move |b| {
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(b.to_vec())
    })
    .map_err(err("recv pool"))?;
    let me = a.address().to_bytes().map_err(err("address"))?;
    let mine = inbox.remote().to_bytes().map_err(err("descriptor"))?;
    p.call(&format!("PEER {} {}", hex(&me), hex(&mine)))?;

    // Single write with an immediate, 1 MiB + 3 at odd offsets.
    let len = (1 << 20) + 3;
    let req = WriteRequest {
        src: &src,
        src_offset: 5,
        dst: &t,
        dst_offset: 11,
        len: len as u64,
        imm: Some(41),
    };
    a.write(req)
        .map_err(err("write"))?
        .wait_timeout(GUARD)
        .map_err(err("write"))?;
    let n = a
        .imms_delivered(&t, 0, WriteShape::Single { len: len as u64 })
        .map_err(err("imms"))?;
    p.call(&format!("WAIT 41 {n}"))?;
    ensure!(
        p.sum(11, len)? == checksum(&data[5..5 + len]),
        "single write: data differs at the peer"
    );

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
    a.paged_write(req)
        .map_err(err("paged"))?
        .wait_timeout(GUARD)
        .map_err(err("paged"))?;
    let n = a
        .imms_delivered(
            &t,
            0,
            WriteShape::Paged {
                pages: pages as usize,
            },
        )
        .map_err(err("imms"))?;
    p.call(&format!("WAIT 42 {n}"))?;
    for i in 0..pages as usize {
        let s = (pages as usize - 1 - i) * 4096;
        ensure!(
            p.sum((2 << 20) + i * 4096, 4000)? == checksum(&data[s..s + 4000]),
            "page {i} differs at the peer"
        );
    }

    // Barrier (zero-byte immediate write).
    let group = a.add_group(vec![t.clone()]);
    a.barrier(&group, 43)
        .map_err(err("barrier"))?
        .wait_timeout(GUARD)
        .map_err(err("barrier"))?;
    p.call("WAIT 43 1")?;

    // Immediate ping-pong: the peer answers into our inbox.
    p.send("ECHO 44 45 20")?;
    for _ in 0..20 {
        let req = WriteRequest {
            src: &src,
            src_offset: 0,
            dst: &t,
            dst_offset: 0,
            len: 0,
            imm: Some(44),
        };
        a.write(req)
            .map_err(err("ping"))?
            .wait_timeout(GUARD)
            .map_err(err("ping"))?;
        a.wait_imm(45, 1, GUARD).map_err(err("pong"))?;
    }
    p.reply("ECHO")?;

    // Send / receive: the peer's pool echoes each message back into ours.
    let msgs: Vec<Vec<u8>> = (0..10u64)
        .map(|i| pattern(100 + i as usize * 300, i))
        .collect();
    for m in &msgs {
        a.send(&peer, m)
            .map_err(err("send"))?
            .wait_timeout(GUARD)
            .map_err(err("send"))?;
    }
    let deadline = Instant::now() + GUARD;
    while echoed.lock().unwrap_or_else(PoisonError::into_inner).len() < msgs.len() {
        ensure!(Instant::now() < deadline, "echoed messages missing");
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut got = echoed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut want = msgs;
    got.sort();
    want.sort();
    ensure!(got == want, "echoed messages differ from those sent");
    Ok(())
}

/// The peer process is SIGKILLed in the middle of a stream of writes: every
/// pending write completes in bounded time, some with an error, later writes
/// to it fail, and this process goes on with a new peer.
pub fn peer_killed_mid_stream(h: &dyn Harness, module: &str) -> R {
    if !h.cross_process() {
        eprintln!("two-process cases: skipped, the harness's engines live in one process");
        return Ok(());
    }
    let a = one_engine(h)?;
    let mut p = PeerProc::spawn(module)?;
    let (_, t) = p.target(&a)?;
    let src = a.alloc_host(REGION, 0).map_err(err("alloc"))?;
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let total = 3000usize;
    for i in 0..total {
        if i == 200 {
            p.child.kill().map_err(err("kill"))?;
            let _ = p.child.wait();
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
        // A refused submit has already run its notification.
        let _ = a.submit_write(req, notify);
    }
    let deadline = Instant::now() + GUARD;
    while done.load(Ordering::SeqCst) < total {
        ensure!(
            Instant::now() < deadline,
            "only {} of {total} writes completed after the peer died",
            done.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    ensure!(
        failed.load(Ordering::SeqCst) > 0,
        "no write failed although the peer was killed"
    );
    let req = WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t,
        dst_offset: 0,
        len: 64,
        imm: None,
    };
    let later = a.write(req).map_err(err("write"))?.wait_timeout(GUARD);
    ensure!(later.is_err(), "a write to the dead peer succeeded");
    // This process goes on: a new peer process.
    let mut q = PeerProc::spawn(module)?;
    let (_, t2) = q.target(&a)?;
    let data = pattern(4096, 3);
    src.write_at(0, &data).map_err(err("write_at"))?;
    let req = WriteRequest {
        src: &src,
        src_offset: 0,
        dst: &t2,
        dst_offset: 0,
        len: 4096,
        imm: Some(1),
    };
    a.write(req)
        .map_err(err("write"))?
        .wait_timeout(GUARD)
        .map_err(err("write to the new peer"))?;
    q.call("WAIT 1 1")?;
    ensure!(q.sum(0, 4096)? == checksum(&data), "new peer: data differs");
    Ok(())
}
