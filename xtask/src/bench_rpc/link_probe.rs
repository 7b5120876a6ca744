//! `xtask link-probe sink ADDR` / `xtask link-probe send ADDR BYTES`: a bulk
//! TCP transfer between two namespace hosts that proves the shaping works
//! (std-only, so no python or netcat on the hosts). The sink reads to EOF
//! and answers one byte; the sender's time includes that answer, so the
//! rate covers every byte having arrived.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Runs the probe subcommand; the sender prints `BYTES SECONDS`.
pub fn run(args: &[String]) -> Result<(), String> {
    match args {
        [mode, addr] if mode == "sink" => sink(addr),
        [mode, addr, bytes] if mode == "send" => {
            let bytes: u64 = bytes
                .parse()
                .map_err(|_| format!("link-probe: `{bytes}` is not a byte count"))?;
            let secs = send(addr, bytes)?;
            println!("{bytes} {secs:.6}");
            Ok(())
        }
        _ => Err("usage: xtask link-probe sink ADDR | send ADDR BYTES".into()),
    }
}

fn sink(addr: &str) -> Result<(), String> {
    let l = TcpListener::bind(addr).map_err(|e| format!("link-probe: bind {addr}: {e}"))?;
    let (mut s, _) = l.accept().map_err(|e| format!("link-probe: accept: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| format!("link-probe: {e}"))?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(format!("link-probe: read: {e}")),
        }
    }
    s.write_all(b"k")
        .map_err(|e| format!("link-probe: ack: {e}"))
}

fn send(addr: &str, bytes: u64) -> Result<f64, String> {
    // The sink starts in another process: retry the connect for a while.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                return Err(format!("link-probe: connect {addr}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let buf = vec![0x5au8; 1 << 16];
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n])
            .map_err(|e| format!("link-probe: write: {e}"))?;
        left -= n as u64;
    }
    s.shutdown(Shutdown::Write)
        .map_err(|e| format!("link-probe: shutdown: {e}"))?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack)
        .map_err(|e| format!("link-probe: no answer from the sink: {e}"))?;
    Ok(start.elapsed().as_secs_f64())
}

/// Reads the sender's `BYTES SECONDS` line as bits per second.
pub fn parse_rate(out: &str) -> Option<f64> {
    let mut it = out.split_whitespace();
    let bytes: f64 = it.next()?.parse().ok()?;
    let secs: f64 = it.next()?.parse().ok()?;
    (secs > 0.0).then(|| bytes * 8.0 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_over_loopback_is_timed() -> Result<(), String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
        drop(l);
        let a = addr.clone();
        let sink = std::thread::spawn(move || sink(&a));
        let secs = send(&addr, 3 << 20)?;
        assert!(secs > 0.0);
        assert_eq!(sink.join().map_err(|_| "sink thread")?, Ok(()));
        assert_eq!(parse_rate("1000000 0.5"), Some(16e6));
        assert_eq!(parse_rate("x 1"), None);
        assert_eq!(parse_rate("10 0"), None);
        Ok(())
    }
}
