//! The messages between a server and its compute worker process, over a
//! Unix stream socket pair. Each message is `len u32 | tag u8 | body`;
//! MAP carries the buffer's memfd as SCM_RIGHTS ancillary data on the same
//! send, so it arrives with the message's first bytes.
//!
//! | tag | direction | body |
//! |---|---|---|
//! | 1 MAP | server → worker | `handle u64 \| base u64 \| size u64` + memfd |
//! | 2 UNMAP | server → worker | `handle u64` |
//! | 3 COMPUTE | server → worker | `key u64 \|` the validated graph ([`super::worker_graph`]) |
//! | 4 RESULT | worker → server | `code u8 \| reason bytes` ([`RESULT_OK`], [`RESULT_ERROR`], [`RESULT_NOT_HELD`]) |
//! | 5 RUN | server → worker | `key u64`: run the graph kept under `key` again |
//!
//! A graph sent with a non-zero key is kept by the worker (a bounded
//! [`super::compute::KeyedCache`]) until a buffer is unmapped or replaced;
//! RUN answers [`RESULT_NOT_HELD`] when it no longer has it, and the server
//! sends COMPUTE.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// MAP.
pub const TAG_MAP: u8 = 1;
/// UNMAP.
pub const TAG_UNMAP: u8 = 2;
/// COMPUTE.
pub const TAG_COMPUTE: u8 = 3;
/// RESULT.
pub const TAG_RESULT: u8 = 4;
/// RUN.
pub const TAG_RUN: u8 = 5;

/// RESULT: the graph ran.
pub const RESULT_OK: u8 = 1;
/// RESULT: the graph was refused or failed (the reason follows).
pub const RESULT_ERROR: u8 = 0;
/// RESULT: RUN named a graph the worker does not keep (any more).
pub const RESULT_NOT_HELD: u8 = 2;

/// Largest message accepted (a graph payload of the default limits is
/// ~160 MB; the worker trusts its server, this only stops a corrupted
/// length from allocating without bound).
pub const MAX_MESSAGE: usize = 1 << 30;

fn sendmsg_all(sock: RawFd, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut sent = 0usize;
    let mut fd = fd;
    while sent < bytes.len() {
        let rest = bytes.get(sent..).unwrap_or_default();
        let mut iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // Room for one descriptor, aligned as cmsghdr wants.
        let mut control = [0u64; 4];
        // SAFETY: zeroed msghdr is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(f) = fd.take() {
            // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: msg_control points at `control` (32 bytes >= space
            // for one int); CMSG_FIRSTHDR returns its start.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), f.as_raw_fd());
            }
        }
        // SAFETY: msg describes live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// Sends one message (with `fd` attached to it, if any).
pub fn send(
    sock: BorrowedFd<'_>,
    tag: u8,
    body: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let len = u32::try_from(body.len() + 1)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message too large"))?;
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.push(tag);
    frame.extend_from_slice(body);
    sendmsg_all(sock.as_raw_fd(), &frame, fd)
}

/// Bytes a [`Receiver`] reads ahead at most.
const READ_AHEAD: usize = 64 << 10;

/// Reads messages, keeping descriptors that arrive with them in order.
/// Reads ahead (up to [`READ_AHEAD`] bytes), so that a message, and the
/// MAP / UNMAP messages sent before a COMPUTE, cost one `recvmsg` together
/// instead of two each (length and tag, then body): per graph, one system
/// call less on each side of the hop.
#[derive(Debug, Default)]
pub struct Receiver {
    fds: VecDeque<OwnedFd>,
    /// Read-ahead bytes: `buf[pos..end]` not yet taken.
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl Receiver {
    /// One `recvmsg` into `out`: the bytes read (0 only at end of stream),
    /// descriptors queued in arrival order. Linux ends a stream read after
    /// the first message that carries descriptors, so one read receives at
    /// most one set (one MAP's descriptor: the control buffer's room).
    fn recv_some(&mut self, sock: RawFd, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut iov = libc::iovec {
                iov_base: out.as_mut_ptr().cast(),
                iov_len: out.len(),
            };
            let mut control = [0u64; 8];
            // SAFETY: zeroed msghdr is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: msg describes live buffers for the duration of the call.
            let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: walking the control buffer the kernel filled, with the
            // CMSG_* accessors; each SCM_RIGHTS entry holds whole ints.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let data = libc::CMSG_DATA(c).cast::<RawFd>();
                        let header = libc::CMSG_LEN(0) as usize;
                        let count = ((*c).cmsg_len - header) / std::mem::size_of::<RawFd>();
                        for i in 0..count {
                            let raw = std::ptr::read_unaligned(data.add(i));
                            self.fds.push_back(OwnedFd::from_raw_fd(raw));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            return Ok(n as usize);
        }
    }

    /// Fills `out` from the read-ahead bytes, then from the socket
    /// (exactly: nothing past `out` is read).
    fn recv_exact(&mut self, sock: RawFd, out: &mut [u8]) -> io::Result<()> {
        let have = self.end - self.pos;
        let mut got = have.min(out.len());
        if let (Some(dst), Some(src)) = (out.get_mut(..got), self.buf.get(self.pos..self.pos + got))
        {
            dst.copy_from_slice(src);
        }
        self.pos += got;
        while got < out.len() {
            let rest = out.get_mut(got..).unwrap_or_default();
            let n = self.recv_some(sock, rest)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            got += n;
        }
        Ok(())
    }

    /// Reads ahead until at least `need` (<= [`READ_AHEAD`]) bytes wait.
    fn fill(&mut self, sock: RawFd, need: usize) -> io::Result<()> {
        if self.buf.len() < READ_AHEAD {
            self.buf.resize(READ_AHEAD, 0);
        }
        if self.pos == self.end {
            (self.pos, self.end) = (0, 0);
        }
        while self.end - self.pos < need {
            if self.buf.len() - self.pos < need {
                self.buf.copy_within(self.pos..self.end, 0);
                (self.pos, self.end) = (0, self.end - self.pos);
            }
            let mut spare = std::mem::take(&mut self.buf);
            let n = self.recv_some(sock, spare.get_mut(self.end..).unwrap_or_default());
            self.buf = spare;
            match n? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => self.end += n,
            }
        }
        Ok(())
    }

    /// The next message: its tag and body.
    pub fn recv(&mut self, sock: BorrowedFd<'_>) -> io::Result<(u8, Vec<u8>)> {
        let raw = sock.as_raw_fd();
        // Length and tag, and whatever follows that has arrived.
        self.fill(raw, 5)?;
        let mut head = [0u8; 5];
        self.recv_exact(raw, &mut head)?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len == 0 || len > MAX_MESSAGE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad message length",
            ));
        }
        let mut body = crate::io::zeroed(len - 1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "message"))?;
        self.recv_exact(raw, &mut body)?;
        Ok((head[4], body))
    }

    /// Whether a message may already wait here, read ahead (then
    /// [`Receiver::recv`] does not block for its first bytes).
    pub fn has_read_ahead(&self) -> bool {
        self.end > self.pos
    }

    /// The oldest descriptor received and not yet taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }
}

/// Polls `sock` for readability for up to `window`, giving the core away
/// between polls, and gives up early once a yield shows another thread
/// wants the core ([`YIELD_SHARED`]); returns whether it became readable. The caller blocks in
/// its read afterwards either way: this only spares it the wake-up when
/// the answer comes within the window.
pub fn poll_readable(sock: BorrowedFd<'_>, window: Duration) -> bool {
    poll_window(sock, window, true)
}

/// [`poll_readable`], with the give-up on a shared core optional (tests of
/// the window itself turn it off: on a loaded machine it ends any poll).
fn poll_window(sock: BorrowedFd<'_>, window: Duration, give_up_when_shared: bool) -> bool {
    let end = Instant::now() + window;
    loop {
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout: the call only reads the
        // descriptor's state.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n != 0 {
            // Readable, hung up or an error: the read reports which.
            return n > 0;
        }
        let before = Instant::now();
        if before >= end {
            return false;
        }
        std::thread::yield_now();
        if give_up_when_shared && before.elapsed() > YIELD_SHARED {
            return false;
        }
    }
}

/// A yield that took longer than this gave the core to another thread (or
/// the hypervisor took the vCPU): polling there only takes time from
/// whoever shares it (the compute it waits for, when the scheduler put
/// both on one core), so the poll gives up and blocks.
const YIELD_SHARED: Duration = Duration::from_micros(30);

/// When the next of a steady stream of messages is due: the shortest of the
/// last few intervals. A message that came while its waiter slept is seen
/// a wake-up late, so its interval reads long; the shortest of several is
/// the one a timed wait should aim at. A last interval more than twice that
/// starts a new pace (llama-bench's prompt graphs after its decode steps,
/// each ~7x as long): aiming at the old one would wake the waiter in the
/// middle of every such compute and poll there (measured: pp64 0.95x of
/// ggml's server with the shortest of four, 1.0x without timed waits).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pace {
    recent: [Option<Duration>; 4],
    next: usize,
}

impl Pace {
    /// Notes one interval.
    pub fn observe(&mut self, d: Duration) {
        if let Some(slot) = self.recent.get_mut(self.next) {
            *slot = Some(d);
        }
        self.next = (self.next + 1) % self.recent.len();
    }

    /// The last interval noted; `None` before the first.
    pub fn last(&self) -> Option<Duration> {
        self.recent
            .get((self.next + self.recent.len() - 1) % self.recent.len())
            .copied()
            .flatten()
    }

    /// The interval to expect; `None` before the first.
    pub fn expected(&self) -> Option<Duration> {
        let last = self.last()?;
        let shortest = self.recent.iter().flatten().min().copied()?;
        Some(if last > shortest * 2 { last } else { shortest })
    }
}

/// Longest interval a thread times its wait by ([`poll_readable_around`]),
/// for an answer (the session) or the next graph (the worker), where a core
/// is spare. Above this the two wake-ups of a graph are under 2.5 % of it,
/// and polling a longer compute's tail is not worth a core's time.
pub const TIMED_WAIT_MAX: Duration = Duration::from_millis(4);

/// How long before a message is due a timed wait wakes up: a wake-up's
/// cost here (40-60 us) and then some.
const WAKE_MARGIN: Duration = Duration::from_micros(100);

/// Waits for a message expected about `expected` from now: blocks in a
/// timed poll until [`WAKE_MARGIN`] before it, then polls with yields
/// until that margin (plus an eighth of `expected`, at most another margin,
/// for the jitter of a compute) after it: at most three margins of
/// polling. Returns whether `sock` became readable; the caller blocks in
/// its read afterwards either way.
///
/// Why: a thread blocked in a read is woken when the message comes, and
/// each wake-up costs 40-60 us on this 2-core VM (an idle vCPU is halted),
/// twice per graph through the worker. A decode step's graphs come at a
/// steady pace (llama-bench tg: the same graph every ~1 ms), so the timed
/// poll's own wake-up happens while the sender is still busy and the
/// message finds this thread polling. Costs at most the poll window of a
/// core per message, and only where a core is spare (the callers check).
pub fn poll_readable_around(sock: BorrowedFd<'_>, expected: Duration) -> bool {
    wait_around(sock, expected, WAKE_MARGIN, true)
}

fn wait_around(
    sock: BorrowedFd<'_>,
    expected: Duration,
    margin: Duration,
    give_up_when_shared: bool,
) -> bool {
    fine_timer_slack();
    let end = Instant::now() + expected + margin + (expected / 8).min(margin);
    if let Some(sleep) = expected.checked_sub(margin).filter(|d| !d.is_zero()) {
        let ts = libc::timespec {
            tv_sec: sleep.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(sleep.subsec_nanos()),
        };
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd and a valid timeout; no signal mask.
        let n = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
        if n != 0 {
            return n > 0;
        }
    }
    poll_window(
        sock,
        end.saturating_duration_since(Instant::now()),
        give_up_when_shared,
    )
}

/// Timed polls of this thread wake within a microsecond of their timeout,
/// not the default 50 us slack (which is as long as the margin of
/// [`poll_readable_around`]).
fn fine_timer_slack() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    DONE.with(|done| {
        if !done.get() {
            // SAFETY: PR_SET_TIMERSLACK takes a plain integer (ns) and
            // changes only this thread's timer slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
            done.set(true);
        }
    });
}

/// Whether compute threads leave a core of this process's CPUs spare:
/// only then may a thread poll for a message instead of blocking.
pub fn core_spare(compute_threads: usize) -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() > compute_threads)
}

/// Reads a little-endian u64 at `at`.
pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_poll_sees_a_message_and_gives_up_at_its_window() {
        let (a, b) = UnixStream::pair().unwrap();
        // Nothing sent: false once the window passed, and not much later.
        let t = Instant::now();
        assert!(!poll_window(b.as_fd(), Duration::from_millis(20), false));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(20) && took < Duration::from_secs(2),
            "{took:?}"
        );
        // A message sent from another thread during the window is seen.
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            send(a.as_fd(), TAG_RESULT, &[RESULT_OK], None).unwrap();
            a
        });
        assert!(poll_window(b.as_fd(), Duration::from_secs(5), false));
        let a = sender.join().unwrap();
        assert_eq!(
            Receiver::default().recv(b.as_fd()).unwrap(),
            (TAG_RESULT, vec![RESULT_OK])
        );
        // A closed peer ends the poll at once (the read then reports it).
        drop(a);
        let t = Instant::now();
        assert!(poll_readable(b.as_fd(), Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_poll_gives_up_when_it_shares_its_core_with_a_busy_thread() {
        fn pin_to_first_cpu() {
            let first = transfer_core::topology::allowed_cpus().unwrap()[0];
            transfer_core::topology::pin_current_thread(&[first]).unwrap();
        }
        let (_a, b) = UnixStream::pair().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_to_first_cpu();
                let t = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && t.elapsed() < Duration::from_secs(20)
                {
                    std::hint::spin_loop();
                }
            })
        };
        pin_to_first_cpu();
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        assert!(!poll_readable(b.as_fd(), Duration::from_secs(10)));
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        busy.join().unwrap();
        assert!(
            took < Duration::from_secs(5),
            "polled {took:?} beside a busy thread"
        );
    }

    #[test]
    fn a_paced_stream_aims_at_its_shortest_recent_interval() {
        let mut p = Pace::default();
        assert_eq!(p.expected(), None);
        assert_eq!(p.last(), None);
        let ms = Duration::from_millis;
        for d in [5, 3, 5, 4] {
            p.observe(ms(d));
        }
        assert_eq!(p.expected(), Some(ms(3)));
        // The 3 ms interval ages out after four more.
        for d in [6, 7, 8, 9] {
            p.observe(ms(d));
        }
        assert_eq!(p.expected(), Some(ms(6)));
        // A last one more than twice the shortest sets the pace at once...
        p.observe(ms(40));
        assert_eq!(p.expected(), Some(ms(40)));
        // ...and a short one again brings back the shortest.
        p.observe(ms(7));
        assert_eq!(p.last(), Some(ms(7)));
        assert_eq!(p.expected(), Some(ms(7)));
    }

    #[test]
    fn a_timed_wait_sees_messages_early_on_time_and_gives_up_after_its_window() {
        let (a, b) = UnixStream::pair().unwrap();
        let ms = Duration::from_millis;
        // Nothing comes: false once due + margin + an eighth passed (30 +
        // 10 + 3.75 ms), and not much later.
        let t = Instant::now();
        assert!(!wait_around(b.as_fd(), ms(30), ms(10), false));
        let took = t.elapsed();
        assert!(took >= ms(43) && took < Duration::from_secs(2), "{took:?}");
        // A message long before it is due ends the timed sleep.
        let early = std::thread::spawn(move || {
            std::thread::sleep(ms(5));
            send(a.as_fd(), TAG_RESULT, &[RESULT_OK], None).unwrap();
            a
        });
        let t = Instant::now();
        assert!(wait_around(
            b.as_fd(),
            Duration::from_secs(20),
            ms(10),
            true
        ));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let a = early.join().unwrap();
        let mut r = Receiver::default();
        assert_eq!(r.recv(b.as_fd()).unwrap(), (TAG_RESULT, vec![RESULT_OK]));
        // One after the sleep, inside the polled window (10..32.5 ms), is
        // seen too (unless a loaded machine ran the sender too late).
        let t = Instant::now();
        let late = std::thread::spawn(move || {
            std::thread::sleep(ms(15));
            send(a.as_fd(), TAG_RESULT, &[RESULT_OK], None).unwrap();
            (a, t.elapsed())
        });
        let seen = wait_around(b.as_fd(), ms(20), ms(10), false);
        let (_a, sent_at) = late.join().unwrap();
        assert!(seen || sent_at > ms(32), "sent at {sent_at:?}");
        assert_eq!(r.recv(b.as_fd()).unwrap(), (TAG_RESULT, vec![RESULT_OK]));
    }

    #[test]
    fn messages_and_descriptors_cross() {
        let (a, b) = UnixStream::pair().unwrap();
        let mem = crate::server::host_memory::HostMemory::zeroed(100).unwrap();
        assert!(mem.copy_in(0, b"hello"));
        let fd = mem.share_fd().unwrap();
        // Larger than the socket buffer: the sender needs the reader going.
        let sender = std::thread::spawn(move || {
            send(a.as_fd(), TAG_MAP, &[1, 2, 3], Some(fd.as_fd())).unwrap();
            send(a.as_fd(), TAG_COMPUTE, &vec![7u8; 300_000], None).unwrap();
            a
        });
        let mut r = Receiver::default();
        let (tag, body) = r.recv(b.as_fd()).unwrap();
        assert_eq!((tag, body.as_slice()), (TAG_MAP, &[1u8, 2, 3][..]));
        let got = r.take_fd().expect("descriptor");
        // The other side maps the same pages.
        let other = crate::server::host_memory::HostMemory::map_shared(got, 100).unwrap();
        let mut out = [0u8; 5];
        assert!(other.copy_out(0, &mut out));
        assert_eq!(&out, b"hello");
        assert!(other.copy_in(0, b"HELLO"));
        assert!(mem.copy_out(0, &mut out));
        assert_eq!(&out, b"HELLO");
        let (tag, body) = r.recv(b.as_fd()).unwrap();
        assert_eq!((tag, body.len()), (TAG_COMPUTE, 300_000));
        assert!(r.take_fd().is_none());
        drop(sender.join().unwrap());
    }
    /// Messages sent back to back (as MAPs before a COMPUTE are) are read
    /// ahead together, and each MAP still gets its own descriptor.
    #[test]
    fn read_ahead_keeps_each_descriptor_with_its_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let mems: Vec<_> = (0..5u8)
            .map(|i| {
                let m = crate::server::host_memory::HostMemory::zeroed(64).unwrap();
                assert!(m.copy_in(0, &[i; 4]));
                m
            })
            .collect();
        for (i, m) in mems.iter().enumerate() {
            let fd = m.share_fd().unwrap();
            send(a.as_fd(), TAG_MAP, &[i as u8], Some(fd.as_fd())).unwrap();
            send(a.as_fd(), TAG_UNMAP, &[i as u8; 9], None).unwrap();
        }
        send(a.as_fd(), TAG_RUN, &7u64.to_le_bytes(), None).unwrap();
        let mut r = Receiver::default();
        for i in 0..5u8 {
            let (tag, body) = r.recv(b.as_fd()).unwrap();
            assert_eq!((tag, body.as_slice()), (TAG_MAP, &[i][..]));
            let fd = r.take_fd().expect("descriptor");
            let m = crate::server::host_memory::HostMemory::map_shared(fd, 64).unwrap();
            let mut out = [0u8; 4];
            assert!(m.copy_out(0, &mut out));
            assert_eq!(out, [i; 4], "MAP {i} got another buffer");
            let (tag, body) = r.recv(b.as_fd()).unwrap();
            assert_eq!((tag, body), (TAG_UNMAP, vec![i; 9]));
        }
        let (tag, body) = r.recv(b.as_fd()).unwrap();
        assert_eq!((tag, u64_at(&body, 0)), (TAG_RUN, Some(7)));
        assert!(r.take_fd().is_none());
        drop(a);
        let e = r.recv(b.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
