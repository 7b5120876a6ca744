//! Reading declared-size payloads without trusting the declaration, and
//! sockets with one deadline per frame.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::error::{Result, RpcError};

/// Most bytes reserved ahead of the data that has actually arrived.
const CHUNK: usize = 8 << 20;

/// `n` zero bytes, or `None` when they cannot be allocated. Zeroed with
/// one `memset`: `Vec::resize(n, 0)` is a generic byte loop, and in the
/// dev profile (CI's builds, `cargo xtask bench llama-rpc --dev`) an
/// unoptimised copy of it ends up in this crate even when the crate itself
/// is optimised (perf, llama-bench pp64 through our server built with
/// `--dev`: 3 % of all samples in `Vec::extend_with` under the session
/// threads, as much CPU as a third of the graph compute).
pub fn zeroed(n: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    out.try_reserve_exact(n).ok()?;
    // SAFETY: the reservation above makes room for `n` bytes; they are all
    // written (zeroed) before the length covers them.
    unsafe {
        std::ptr::write_bytes(out.as_mut_ptr(), 0, n);
        out.set_len(n);
    }
    Some(out)
}

/// Reads exactly `size` bytes. Memory is reserved chunk by chunk as data
/// arrives, with fallible reservation: a peer that declares a large size
/// and sends little costs little, and an allocation failure is an error,
/// not an abort.
pub fn read_payload(r: &mut impl Read, size: usize, call: &'static str) -> Result<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    while out.len() < size {
        let want = (size - out.len()).min(CHUNK);
        out.try_reserve_exact(want)
            .map_err(|_| RpcError::refused(call, format!("cannot allocate {size} bytes")))?;
        let start = out.len();
        // SAFETY: `want` bytes were reserved past `start`; they are zeroed
        // before the length covers them (one memset, see [`zeroed`]).
        unsafe {
            std::ptr::write_bytes(out.as_mut_ptr().add(start), 0, want);
            out.set_len(start + want);
        }
        if let Err(e) = r.read_exact(&mut out[start..]) {
            return Err(RpcError::io(call, e));
        }
    }
    Ok(out)
}

/// A socket with one deadline over every read and write made through it:
/// each call gets the time left as its socket timeout, and once the
/// deadline has passed every call fails with `TimedOut`. A per-call
/// timeout alone is no deadline: a peer sending (or taking) one byte just
/// inside it keeps a frame, and what the frame holds, alive for ever.
#[derive(Debug)]
pub struct Deadline<'a> {
    stream: &'a TcpStream,
    at: Instant,
}

impl<'a> Deadline<'a> {
    /// Reads and writes on `stream` that must all be done by `at`.
    pub fn new(stream: &'a TcpStream, at: Instant) -> Self {
        Deadline { stream, at }
    }

    /// Moves the deadline (e.g. once a frame's size is known).
    pub fn set(&mut self, at: Instant) {
        self.at = at;
    }

    /// The deadline.
    pub fn at(&self) -> Instant {
        self.at
    }

    fn left(&self) -> std::io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "the frame's deadline passed",
            ))
        } else {
            Ok(left)
        }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        let mut s = self.stream;
        match s.read(buf) {
            // The socket timeout is the time left: it ran out.
            Err(e) if e.kind() == ErrorKind::WouldBlock => Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "the frame's deadline passed",
            )),
            r => r,
        }
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        let mut s = self.stream;
        match s.write(buf) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "the frame's deadline passed",
            )),
            r => r,
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The deadline of a frame of `bytes` started at `start`: `timeout`, plus
/// the time `bytes` take at `min_rate` bytes per second (0: no allowance),
/// so that large frames on slow links still fit while a trickle does not.
pub fn frame_deadline(start: Instant, timeout: Duration, bytes: u64, min_rate: u64) -> Instant {
    let extra = if min_rate == 0 {
        Duration::ZERO
    } else {
        Duration::from_secs_f64(bytes as f64 / min_rate as f64)
    };
    start
        .checked_add(timeout.saturating_add(extra))
        .unwrap_or_else(|| start + Duration::from_secs(86_400 * 365))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that sends one byte inside every per-read timeout still
    /// misses the deadline of the whole read.
    #[test]
    fn a_trickle_misses_the_deadline() -> std::io::Result<()> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let mut tx = TcpStream::connect(l.local_addr()?)?;
        let (rx, _) = l.accept()?;
        let sender = std::thread::spawn(move || {
            for _ in 0..20 {
                if tx.write_all(&[1]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t0 = Instant::now();
        let mut d = Deadline::new(&rx, t0 + Duration::from_millis(300));
        let mut buf = [0u8; 20];
        let e = d.read_exact(&mut buf).err().map(|e| e.kind());
        let took = t0.elapsed();
        assert_eq!(e, Some(ErrorKind::TimedOut));
        assert!(took < Duration::from_millis(600), "{took:?}");
        drop(rx);
        let _ = sender.join();
        Ok(())
    }

    #[test]
    fn deadlines_grow_with_the_frame_at_the_minimum_rate() {
        let t = Instant::now();
        let d = frame_deadline(t, Duration::from_secs(1), 8 << 20, 4 << 20);
        assert_eq!(d - t, Duration::from_secs(3));
        assert_eq!(
            frame_deadline(t, Duration::from_secs(1), 1 << 30, 0) - t,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn short_input_is_an_error() {
        let data = [1u8; 10];
        assert!(read_payload(&mut &data[..], 11, "t").is_err());
        assert_eq!(
            read_payload(&mut &data[..], 10, "t").ok().as_deref(),
            Some(&data[..])
        );
        assert!(read_payload(&mut &data[..], 0, "t").is_ok_and(|v| v.is_empty()));
    }
}
