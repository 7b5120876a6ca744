//! `xtask link-probe sink ADDR` / `xtask link-probe send ADDR BYTES`: a bulk
//! TCP transfer between two namespace hosts that proves the shaping works
//! (std-only, so no python or netcat on the hosts). The sink reads to EOF
//! and answers one byte; the sender's time includes that answer, so the
//! rate covers every byte having arrived.
//!
//! `xtask link-probe echo ADDR` / `xtask link-probe ping ADDR COUNT`: round
//! trips of one byte, which prove the delay (netem's or the delay proxy's).
//! The pinger prints `MIN MEDIAN MAX` in milliseconds.

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
        [mode, addr] if mode == "echo" => echo(addr),
        [mode, addr, count] if mode == "ping" => {
            let count: usize = count
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("link-probe: `{count}` is not a positive count"))?;
            let ms = ping(addr, count)?;
            println!("{:.3} {:.3} {:.3}", ms.min, ms.median, ms.max);
            Ok(())
        }
        _ => Err(
            "usage: xtask link-probe sink ADDR | send ADDR BYTES | echo ADDR | ping ADDR COUNT"
                .into(),
        ),
    }
}

/// Round-trip times of a ping, milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundTrips {
    /// Fastest round trip.
    pub min: f64,
    /// Median round trip.
    pub median: f64,
    /// Slowest round trip.
    pub max: f64,
}

/// Echoes every byte back, one thread per connection, until killed.
fn echo(addr: &str) -> Result<(), String> {
    let l = TcpListener::bind(addr).map_err(|e| format!("link-probe: bind {addr}: {e}"))?;
    for conn in l.incoming() {
        let Ok(mut c) = conn else { continue };
        std::thread::spawn(move || {
            let _ = c.set_nodelay(true);
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = c.read(&mut buf) {
                if c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

/// `count` round trips of one byte to an echo at `addr` (after one
/// untimed warm-up).
fn ping(addr: &str, count: usize) -> Result<RoundTrips, String> {
    if count == 0 {
        return Err("link-probe: ping needs at least one round trip".into());
    }
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
    s.set_nodelay(true)
        .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(10))))
        .map_err(|e| format!("link-probe: {e}"))?;
    let mut times = Vec::with_capacity(count);
    let mut byte = [0u8; 1];
    for i in 0..=count {
        let start = Instant::now();
        s.write_all(&[i as u8])
            .and_then(|()| s.read_exact(&mut byte))
            .map_err(|e| format!("link-probe: ping {addr}: {e}"))?;
        if byte[0] != i as u8 {
            return Err(format!(
                "link-probe: ping {addr}: the echo sent another byte"
            ));
        }
        if i > 0 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(RoundTrips {
        min: times[0],
        median: times[times.len() / 2],
        max: times[times.len() - 1],
    })
}

/// Reads the pinger's `MIN MEDIAN MAX` line.
pub fn parse_round_trips(out: &str) -> Option<RoundTrips> {
    let v: Vec<f64> = out
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<Vec<f64>, _>>()
        .ok()?;
    match v[..] {
        [min, median, max] if min <= median && median <= max => {
            Some(RoundTrips { min, median, max })
        }
        _ => None,
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

    #[test]
    fn pings_an_echo_over_loopback() -> Result<(), String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
        drop(l);
        let a = addr.clone();
        std::thread::spawn(move || echo(&a));
        let rt = ping(&addr, 5)?;
        assert!(rt.min > 0.0 && rt.min <= rt.median && rt.median <= rt.max);
        let line = format!("{:.3} {:.3} {:.3}", rt.min, rt.median, rt.max);
        assert!(parse_round_trips(&line).is_some());
        assert_eq!(
            parse_round_trips("0.5 4.25 9"),
            Some(RoundTrips {
                min: 0.5,
                median: 4.25,
                max: 9.0
            })
        );
        assert_eq!(parse_round_trips("3 2 1"), None);
        assert_eq!(parse_round_trips("1 2"), None);
        assert_eq!(parse_round_trips("a b c"), None);
        Ok(())
    }
}
