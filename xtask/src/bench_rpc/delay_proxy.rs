//! `xtask delay-proxy --delay 2ms --map LISTEN=TARGET[,LISTEN=TARGET...]`:
//! link delay in user space, for kernels without sch_netem.
//!
//! For every mapping it listens on LISTEN; each accepted connection gets
//! its own connection to TARGET, and bytes flow both ways, each chunk
//! released `delay` after it was read (one-way delay per direction, so a
//! round trip through the proxy costs the link's own RTT + 2 × delay).
//! Order is kept (one FIFO queue per direction), a half-close (EOF) is
//! passed on after the same delay, and a broken side closes the other.
//! The bench runs it in the coordinator's namespace, so only the
//! coordinator's connections are delayed: the servers reach each other
//! directly.
//!
//! Threads, not an event loop: two per direction of a connection (a reader
//! stamping chunks, a writer releasing them when due). The bench needs one
//! connection per group per server, a few dozen threads at most.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;
use std::time::{Duration, Instant};

/// Bytes read at once: one chunk of the queue.
const CHUNK: usize = 64 << 10;
/// Chunks queued per direction before the reader waits (at most
/// CHUNK × this = 64 MiB). Far above what a delayed link holds in flight
/// (200 Mbit/s × 5 ms = 125 KB), so it never throttles; it only bounds the
/// memory a peer that stops reading can pin.
const QUEUE_CHUNKS: usize = 1024;

/// One listener and where its connections go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// `host:port` to listen on.
    pub listen: String,
    /// `host:port` each accepted connection is forwarded to.
    pub target: String,
}

/// Parses a delay such as `2ms`, `500us`, `1.5ms`, `0.01s` (tc's units).
pub fn parse_delay(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let n: f64 = n
        .parse()
        .map_err(|_| format!("delay `{s}`: not a number with a unit (2ms, 500us, 0.01s)"))?;
    let secs_per_unit = match unit {
        "s" | "sec" | "secs" => 1.0,
        "ms" | "msec" | "msecs" => 1e-3,
        "us" | "usec" | "usecs" => 1e-6,
        _ => return Err(format!("delay `{s}`: unit must be s, ms or us")),
    };
    let secs = n * secs_per_unit;
    if !secs.is_finite() || secs <= 0.0 || secs > 10.0 {
        return Err(format!("delay `{s}`: must be above 0 and at most 10 s"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `LISTEN=TARGET[,LISTEN=TARGET...]`.
pub fn parse_map(s: &str) -> Result<Vec<Route>, String> {
    let routes = s
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('=') {
            Some((l, t)) if l.contains(':') && t.contains(':') => Ok(Route {
                listen: l.to_string(),
                target: t.to_string(),
            }),
            _ => Err(format!(
                "delay-proxy: `{r}` is not LISTEN_HOST:PORT=TARGET_HOST:PORT"
            )),
        })
        .collect::<Result<Vec<Route>, String>>()?;
    if routes.is_empty() {
        return Err("delay-proxy: --map needs at least one LISTEN=TARGET".into());
    }
    Ok(routes)
}

/// The `--map` value for `routes` (inverse of [`parse_map`]).
pub fn map_arg(routes: &[Route]) -> String {
    routes
        .iter()
        .map(|r| format!("{}={}", r.listen, r.target))
        .collect::<Vec<_>>()
        .join(",")
}

const USAGE: &str = "usage: xtask delay-proxy --delay 2ms --map LISTEN=TARGET[,LISTEN=TARGET...]";

/// Parses the subcommand's options.
pub fn parse_args(args: &[String]) -> Result<(Duration, Vec<Route>), String> {
    let (mut delay, mut routes) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| format!("delay-proxy: {a} needs a value\n{USAGE}"))?;
        match a.as_str() {
            "--delay" => delay = Some(parse_delay(v)?),
            "--map" => routes = Some(parse_map(v)?),
            other => return Err(format!("delay-proxy: unknown option `{other}`\n{USAGE}")),
        }
    }
    match (delay, routes) {
        (Some(d), Some(r)) => Ok((d, r)),
        _ => Err(format!(
            "delay-proxy: --delay and --map are required\n{USAGE}"
        )),
    }
}

/// Runs the subcommand: binds every route, says so on stderr, then serves
/// until killed.
pub fn run(args: &[String]) -> Result<(), String> {
    let (delay, routes) = parse_args(args)?;
    let mut acceptors = Vec::new();
    for r in &routes {
        let l = TcpListener::bind(&r.listen)
            .map_err(|e| format!("delay-proxy: bind {}: {e}", r.listen))?;
        acceptors.push(serve(l, r.target.clone(), delay));
    }
    eprintln!(
        "delay-proxy: {} each way on {}",
        humantime(delay),
        map_arg(&routes)
    );
    for a in acceptors {
        a.join()
            .map_err(|_| "delay-proxy: an accept loop panicked".to_string())?;
    }
    Ok(())
}

fn humantime(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Accepts on `listener` forever, forwarding each connection to `target`
/// with `delay` each way; returns the accept loop's thread.
pub fn serve(listener: TcpListener, target: String, delay: Duration) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        loop {
            match listener.accept() {
                Ok((client, _)) => {
                    let target = target.clone();
                    thread::spawn(move || {
                        if let Err(e) = forward(client, &target, delay) {
                            eprintln!("delay-proxy: {e}");
                        }
                    });
                }
                // Out of descriptors or an aborted handshake: this
                // connection is lost, the listener is not.
                Err(e) => {
                    eprintln!("delay-proxy: accept: {e}");
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    })
}

/// Connects to `target` for `client` and starts both directions. A target
/// that cannot be reached closes the client's connection (dropped here).
fn forward(client: TcpStream, target: &str, delay: Duration) -> Result<(), String> {
    let server =
        TcpStream::connect(target).map_err(|e| format!("connect {target}: {e}; client closed"))?;
    // Small RPC messages must not wait for Nagle's timer on either hop: the
    // proxy would add its 40 ms delayed-ACK stalls to the delay it models.
    for s in [&client, &server] {
        s.set_nodelay(true)
            .map_err(|e| format!("set_nodelay: {e}"))?;
    }
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| format!("clone socket: {e}"));
    let up = (clone(&client)?, clone(&server)?);
    thread::spawn(move || pipe(up.0, up.1, delay));
    pipe(server, client, delay);
    Ok(())
}

/// What a reader hands its writer, stamped with when to release it.
enum Item {
    Data(Instant, Vec<u8>),
    /// The source sent EOF: pass on a half-close.
    Eof(Instant),
    /// The source broke: close the destination.
    Broken(Instant),
}

/// One direction: reads `from`, queues each chunk stamped `delay` later,
/// and a writer thread sends it on to `to` when due.
fn pipe(from: TcpStream, to: TcpStream, delay: Duration) {
    let (tx, rx) = sync_channel::<Item>(QUEUE_CHUNKS);
    let from_for_writer = from.try_clone().ok();
    let writer = thread::spawn(move || release(rx, to, from_for_writer));
    read_into(from, &tx, delay);
    drop(tx);
    let _ = writer.join();
}

fn read_into(mut from: TcpStream, tx: &SyncSender<Item>, delay: Duration) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let item = match from.read(&mut buf) {
            Ok(0) => Item::Eof(Instant::now() + delay),
            Ok(n) => Item::Data(Instant::now() + delay, buf[..n].to_vec()),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => Item::Broken(Instant::now() + delay),
        };
        let last = !matches!(item, Item::Data(..));
        // The writer is gone only after the destination broke; it has
        // closed this side too.
        if tx.send(item).is_err() || last {
            return;
        }
    }
}

fn wait_until(due: Instant) {
    let now = Instant::now();
    if due > now {
        thread::sleep(due - now);
    }
}

/// Writes each queued item to `to` when it is due. On a write error both
/// sockets are shut, so the reader of this direction and the other
/// direction end too.
fn release(rx: Receiver<Item>, mut to: TcpStream, from: Option<TcpStream>) {
    let close_both = |to: &TcpStream| {
        let _ = to.shutdown(Shutdown::Both);
        if let Some(f) = &from {
            let _ = f.shutdown(Shutdown::Both);
        }
    };
    for item in rx {
        match item {
            Item::Data(due, bytes) => {
                wait_until(due);
                if to.write_all(&bytes).is_err() {
                    close_both(&to);
                    return;
                }
            }
            Item::Eof(due) => {
                wait_until(due);
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Item::Broken(due) => {
                wait_until(due);
                close_both(&to);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn err(e: impl std::fmt::Display) -> String {
        e.to_string()
    }

    /// A proxy on a free loopback port to `target`; returns its address.
    fn proxy_to(target: &str, delay: Duration) -> Result<String, String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let addr = l.local_addr().map_err(err)?.to_string();
        serve(l, target.to_string(), delay);
        Ok(addr)
    }

    /// An echo server on a free loopback port, one thread per connection.
    fn echo_server() -> Result<String, String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let addr = l.local_addr().map_err(err)?.to_string();
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut c = c;
                    let _ = c.set_nodelay(true);
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        match c.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if c.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = c.shutdown(Shutdown::Write);
                });
            }
        });
        Ok(addr)
    }

    fn pattern(seed: u32, len: usize) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect()
    }

    /// Sends `data` through `addr` (an echo behind the proxy) while reading
    /// the echo on another thread; returns what came back.
    fn echo_through(addr: &str, data: Vec<u8>) -> Result<Vec<u8>, String> {
        let mut c = TcpStream::connect(addr).map_err(err)?;
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(err)?;
        let mut w = c.try_clone().map_err(err)?;
        let writer = thread::spawn(move || -> Result<(), String> {
            w.write_all(&data).map_err(err)?;
            w.shutdown(Shutdown::Write).map_err(err)
        });
        let mut back = Vec::new();
        c.read_to_end(&mut back).map_err(err)?;
        writer.join().map_err(|_| "writer thread".to_string())??;
        Ok(back)
    }

    #[test]
    fn parses_delays_maps_and_options() -> Result<(), String> {
        assert_eq!(parse_delay("2ms")?, Duration::from_millis(2));
        assert_eq!(parse_delay("500us")?, Duration::from_micros(500));
        assert_eq!(parse_delay("1.5ms")?, Duration::from_micros(1500));
        assert_eq!(parse_delay("0.01s")?, Duration::from_millis(10));
        for bad in ["", "ms", "2", "2min", "0ms", "-1ms", "20s", "x2ms"] {
            assert!(parse_delay(bad).is_err(), "{bad}");
        }
        let routes = parse_map("127.0.0.1:51001=10.77.0.2:50052, 127.0.0.1:51002=10.77.0.3:50052")?;
        assert_eq!(
            routes,
            [
                Route {
                    listen: "127.0.0.1:51001".into(),
                    target: "10.77.0.2:50052".into()
                },
                Route {
                    listen: "127.0.0.1:51002".into(),
                    target: "10.77.0.3:50052".into()
                }
            ]
        );
        assert_eq!(
            map_arg(&routes),
            "127.0.0.1:51001=10.77.0.2:50052,127.0.0.1:51002=10.77.0.3:50052"
        );
        for bad in ["", ",", "a:1", "a:1=b", "a=b:2"] {
            assert!(parse_map(bad).is_err(), "{bad}");
        }
        let (d, r) = parse_args(&s(&["--delay", "3ms", "--map", "127.0.0.1:1=127.0.0.1:2"]))?;
        assert_eq!((d, r.len()), (Duration::from_millis(3), 1));
        for bad in [
            &["--delay", "3ms"][..],
            &["--map", "127.0.0.1:1=127.0.0.1:2"],
            &["--delay"],
            &["--delay", "3ms", "--map", "a:1=b:2", "--bogus", "1"],
        ] {
            assert!(parse_args(&s(bad)).is_err(), "{bad:?}");
        }
        Ok(())
    }

    #[test]
    fn forwards_bytes_intact_both_ways_with_the_delay() -> Result<(), String> {
        let delay = Duration::from_millis(5);
        let addr = proxy_to(&echo_server()?, delay)?;
        // Bulk: 3 MiB out and back, in order.
        let data = pattern(7, 3 << 20);
        assert!(echo_through(&addr, data.clone())? == data);
        // Round trips of one byte: each crosses the proxy twice.
        let mut c = TcpStream::connect(&addr).map_err(err)?;
        c.set_nodelay(true).map_err(err)?;
        let mut byte = [0u8; 1];
        for i in 0..5u8 {
            let start = Instant::now();
            c.write_all(&[i]).map_err(err)?;
            c.read_exact(&mut byte).map_err(err)?;
            let rtt = start.elapsed();
            assert_eq!(byte[0], i);
            assert!(rtt >= 2 * delay, "round trip {rtt:?} under 2 x {delay:?}");
        }
        Ok(())
    }

    #[test]
    fn serves_many_connections_at_once() -> Result<(), String> {
        let addr = proxy_to(&echo_server()?, Duration::from_millis(2))?;
        let clients: Vec<_> = (0..24u32)
            .map(|i| {
                let addr = addr.clone();
                thread::spawn(move || -> Result<bool, String> {
                    let data = pattern(i, 100_000 + 997 * i as usize);
                    Ok(echo_through(&addr, data.clone())? == data)
                })
            })
            .collect();
        for (i, c) in clients.into_iter().enumerate() {
            let intact = c.join().map_err(|_| "client thread".to_string())??;
            assert!(intact, "connection {i} got other bytes back");
        }
        Ok(())
    }

    #[test]
    fn passes_on_half_close_and_close_after_the_delay() -> Result<(), String> {
        let delay = Duration::from_millis(20);
        let l = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let target = l.local_addr().map_err(err)?.to_string();
        let addr = proxy_to(&target, delay)?;
        let mut c = TcpStream::connect(&addr).map_err(err)?;
        let (mut server, _) = l.accept().map_err(err)?;
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(err)?;
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(err)?;
        // Client half-closes: the server reads the request, then EOF, no
        // earlier than the delay.
        let start = Instant::now();
        c.write_all(b"request").map_err(err)?;
        c.shutdown(Shutdown::Write).map_err(err)?;
        let mut got = Vec::new();
        server.read_to_end(&mut got).map_err(err)?;
        assert_eq!(got, b"request");
        assert!(start.elapsed() >= delay, "EOF after {:?}", start.elapsed());
        // The other direction still works after the half-close; the
        // server's close reaches the client as EOF after the reply.
        server.write_all(b"reply").map_err(err)?;
        drop(server);
        let mut back = Vec::new();
        c.read_to_end(&mut back).map_err(err)?;
        assert_eq!(back, b"reply");
        Ok(())
    }

    #[test]
    fn an_unreachable_target_closes_the_client() -> Result<(), String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(err)?;
        let dead = l.local_addr().map_err(err)?.to_string();
        drop(l);
        let addr = proxy_to(&dead, Duration::from_millis(1))?;
        let mut c = TcpStream::connect(&addr).map_err(err)?;
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(err)?;
        let mut buf = [0u8; 8];
        // EOF or a reset, never a hang; the proxy keeps serving.
        match c.read(&mut buf) {
            Ok(n) => assert_eq!(n, 0),
            Err(e) => assert!(
                !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                "the client was left hanging: {e}"
            ),
        }
        let again = TcpStream::connect(&addr).map_err(err)?;
        drop(again);
        Ok(())
    }
}
