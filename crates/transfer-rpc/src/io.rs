//! Reading declared-size payloads without trusting the declaration, and
//! sockets with one deadline per frame ([`Deadline`], shared with the
//! launcher's rendezvous: one reader for both).

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub use transfer_launch::deadline::Deadline;
use transfer_launch::deadline::{recv_now, time_left};

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

/// A session's reads: a [`Deadline`] (or none, between frames without an
/// idle timeout) with a buffer kept across frames, so that the frames a
/// client pipelines (SET_TENSORs, GRAPH_COMPUTE, GET_TENSOR of one llama.cpp
/// step arrive together) cost one `recv` together instead of three each
/// (command byte, size, payload; upstream's rpc-server makes those three).
/// Reads at least as large as the buffer go straight to the socket. The
/// buffer is [`FrameReader::CAPACITY`] bytes per connection, outside the
/// in-flight budget and bounded by the connection caps (256 pending and 64
/// admitted at the defaults: 20 MiB at most).
#[derive(Debug)]
pub struct FrameReader<'a> {
    stream: &'a TcpStream,
    /// `None`: no deadline.
    at: Option<Instant>,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// The socket's read timeout as this reader last set it (`None`: not
    /// known).
    timeout: Option<Option<Duration>>,
}

impl<'a> FrameReader<'a> {
    /// Bytes read ahead at most.
    pub const CAPACITY: usize = 64 << 10;

    /// Reads from `stream`, without a deadline until [`FrameReader::set`].
    pub fn new(stream: &'a TcpStream) -> Self {
        FrameReader {
            stream,
            at: None,
            buf: vec![0; Self::CAPACITY],
            pos: 0,
            end: 0,
            timeout: None,
        }
    }

    /// The deadline of the reads from now on (`None`: none).
    pub fn set(&mut self, at: Option<Instant>) {
        self.at = at;
    }

    /// One read from the socket, blocking at most until the deadline. The
    /// socket's timeout is set only when the one it has could outlast the
    /// time left, and then a second under it (so the next frames' reads,
    /// with their whole frame timeout left, find it fine): a timeout that
    /// expires with time left is waited again. Setting it before every
    /// blocking read was one system call in three (strace, llama-bench tg:
    /// 6.7 `setsockopt` per token and server).
    fn read_socket(
        stream: &TcpStream,
        at: Option<Instant>,
        timeout: &mut Option<Option<Duration>>,
        out: &mut [u8],
    ) -> std::io::Result<usize> {
        const MARGIN: Duration = Duration::from_secs(1);
        loop {
            if let Some(done) = recv_now(stream, out) {
                return done;
            }
            let left = at.map(time_left).transpose()?;
            let fine = match (*timeout, left) {
                (Some(Some(set)), Some(left)) => set <= left,
                // Waiting without a deadline: a timeout of a second or more
                // only wakes the wait now and then.
                (Some(Some(set)), None) => set >= MARGIN,
                (Some(None), None) => true,
                _ => false,
            };
            if !fine {
                let t = left.map(|l| if l > 2 * MARGIN { l - MARGIN } else { l });
                *timeout = None;
                stream.set_read_timeout(t)?;
                *timeout = Some(t);
            }
            let mut s = stream;
            match s.read(out) {
                // The socket's timeout ran out: the deadline decides.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
}

impl Read for FrameReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.end {
            if out.len() >= self.buf.len() {
                return Self::read_socket(self.stream, self.at, &mut self.timeout, out);
            }
            let n = Self::read_socket(self.stream, self.at, &mut self.timeout, &mut self.buf)?;
            self.pos = 0;
            self.end = n;
        }
        let have = self.buf.get(self.pos..self.end).unwrap_or_default();
        let n = have.len().min(out.len());
        out[..n].copy_from_slice(&have[..n]);
        self.pos += n;
        Ok(n)
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
    use std::io::Write;

    /// Frames that arrive together are read ahead and handed out in
    /// order, across the buffer's end and past its size; a frame that does
    /// not come keeps its deadline (and a trickle its whole-read deadline).
    #[test]
    fn a_frame_reader_reads_ahead_in_order_and_keeps_deadlines() -> std::io::Result<()> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let mut tx = TcpStream::connect(l.local_addr()?)?;
        let (rx, _) = l.accept()?;
        let big = FrameReader::CAPACITY + 12_345;
        let bytes: Vec<u8> = (0..(3 * big)).map(|i| (i * 7 % 251) as u8).collect();
        let sent = bytes.clone();
        let sender = std::thread::spawn(move || tx.write_all(&sent).map(|()| tx));
        let mut rd = FrameReader::new(&rx);
        rd.set(Some(Instant::now() + Duration::from_secs(30)));
        let mut got = Vec::new();
        // Small pieces, then one larger than the buffer, then the rest.
        for n in [
            1usize,
            8,
            100,
            65_000,
            big,
            3 * big - 1 - 8 - 100 - 65_000 - big,
        ] {
            let mut piece = vec![0u8; n];
            rd.read_exact(&mut piece)?;
            got.extend_from_slice(&piece);
        }
        assert!(got == bytes, "bytes differ");
        let tx = sender
            .join()
            .map_err(|_| std::io::Error::other("sender"))??;
        rd.set(Some(Instant::now() + Duration::from_millis(100)));
        let mut one = [0u8; 1];
        let e = rd.read_exact(&mut one).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::TimedOut));
        // No deadline: the next byte whenever it comes.
        rd.set(None);
        let mut tx = tx;
        tx.write_all(&[42])?;
        rd.read_exact(&mut one)?;
        assert_eq!(one, [42]);
        drop(tx);
        assert_eq!(
            rd.read_exact(&mut one).err().map(|e| e.kind()),
            Some(ErrorKind::UnexpectedEof)
        );
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
