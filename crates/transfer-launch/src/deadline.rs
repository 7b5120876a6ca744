//! Sockets with one deadline over a whole frame, both directions: the
//! rendezvous (this crate) and transfer-rpc's sessions read and write
//! through the same [`Deadline`].

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

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
        time_left(self.at)
    }
}

/// The time left until `at`, or the `TimedOut` error every reader and
/// writer here gives once it has passed.
pub fn time_left(at: Instant) -> std::io::Result<Duration> {
    let left = at.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(passed())
    } else {
        Ok(left)
    }
}

fn passed() -> std::io::Error {
    std::io::Error::new(ErrorKind::TimedOut, "the frame's deadline passed")
}

/// Bytes `stream` has for `buf` right now, without blocking and without
/// touching its timeout: `None` when it has none yet. Most reads of a frame
/// find their bytes already there (llama.cpp's client pipelines its
/// commands), and then one `recv` is all they cost: setting the socket's
/// timeout before every read was a second system call per read.
pub fn recv_now(stream: &TcpStream, buf: &mut [u8]) -> Option<std::io::Result<usize>> {
    without_waiting(|| {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the
        // duration of the call; the descriptor is the live socket's.
        unsafe {
            libc::recv(
                stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        }
    })
}

/// [`recv_now`] for writing: what the socket takes of `buf` right now.
fn send_now(stream: &TcpStream, buf: &[u8]) -> Option<std::io::Result<usize>> {
    without_waiting(|| {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the
        // duration of the call; the descriptor is the live socket's.
        unsafe {
            libc::send(
                stream.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        }
    })
}

/// Runs a non-blocking socket call (`call` returns its `ssize_t`) until it
/// is not interrupted: its byte count, `None` when it would block, or its
/// error.
fn without_waiting(mut call: impl FnMut() -> isize) -> Option<std::io::Result<usize>> {
    loop {
        let n = call();
        if n >= 0 {
            return Some(Ok(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::Interrupted => continue,
            ErrorKind::WouldBlock => return None,
            _ => return Some(Err(e)),
        }
    }
}

/// A blocking socket call made under a timeout set to the time left:
/// its timing out is the frame's deadline passing.
fn deadline_passed(r: std::io::Result<usize>) -> std::io::Result<usize> {
    match r {
        Err(e) if e.kind() == ErrorKind::WouldBlock => Err(passed()),
        r => r,
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.left()?;
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(done) = recv_now(self.stream, buf) {
            return done;
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        deadline_passed(s.read(buf))
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let left = self.left()?;
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(done) = send_now(self.stream, buf) {
            return done;
        }
        self.stream.set_write_timeout(Some(left))?;
        let mut s = self.stream;
        deadline_passed(s.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
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

    /// A writer's deadline holds too: a peer that never reads keeps a
    /// large write only until the deadline.
    #[test]
    fn a_reader_that_does_not_read_misses_the_write_deadline() -> std::io::Result<()> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let tx = TcpStream::connect(l.local_addr()?)?;
        let (_rx, _) = l.accept()?;
        let t0 = Instant::now();
        let mut d = Deadline::new(&tx, t0 + Duration::from_millis(300));
        let big = vec![7u8; 64 << 20];
        let e = d.write_all(&big).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::TimedOut));
        assert!(
            t0.elapsed() < Duration::from_millis(900),
            "{:?}",
            t0.elapsed()
        );
        Ok(())
    }
}
