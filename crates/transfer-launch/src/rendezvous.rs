//! The rendezvous over TCP: every rank sends its blob to rank 0, rank 0
//! answers every rank with all blobs in rank order.
//!
//! Bounded everywhere: one deadline for the whole exchange
//! ([`Options::timeout`]), one per incoming connection's hello
//! ([`Options::hello_timeout`]), retries with backoff while rank 0 is not up
//! yet, frame sizes from [`Limits`], at most [`Options::max_pending`]
//! connections read at once. Rank 0 reads all pending connections side by
//! side (non-blocking), so a mute or garbage connection costs a slot, never
//! the time of the ranks behind it; when the slots are full the oldest
//! pending connection is dropped with a "busy" reply and its rank (if it is
//! one) connects again.
//!
//! Every connection starts with a challenge from rank 0 (a fresh nonce).
//! With a job secret ([`JobSecret`], `TRANSFER_JOB_SECRET`) a hello carries
//! an HMAC over that nonce and its content, checked before anything in it
//! is believed, and rank 0's list carries one over the rank's own nonce:
//! without the secret a connection can neither take a rank nor fail the
//! job, and a rank believes no list it was not sent by the holder of the
//! secret. Without a secret the rendezvous trusts whoever reaches the port.
//!
//! Rank 0 refuses, with a reason the rank prints, a hello that fails
//! authentication, a hello from another job (token mismatch: two jobs on
//! one port), a rank out of range and a rank that already joined; a rank
//! announcing another world size fails the whole rendezvous (the job is
//! misconfigured), and so does the deadline, after telling every joined
//! rank why.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::auth::{self, JobSecret, NONCE_LEN};
use crate::deadline::Deadline;
use crate::env::{Endpoint, LaunchInfo};
use crate::error::{LaunchError, Result, io};
use crate::wire::{self, Challenge, Hello, Limits, Reply};

/// How a rendezvous waits and what it accepts.
#[derive(Debug, Clone)]
pub struct Options {
    /// Deadline of the whole exchange, on every rank.
    pub timeout: Duration,
    /// Rank 0's deadline for one connection's hello, from its accept.
    pub hello_timeout: Duration,
    /// Connections rank 0 reads at once; a newer one pushes the oldest out.
    pub max_pending: usize,
    /// Size bounds.
    pub limits: Limits,
    /// Address rank 0 listens on (its port is the rendezvous port).
    pub listen_ip: IpAddr,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(120),
            hello_timeout: Duration::from_secs(10),
            max_pending: 256,
            limits: Limits::default(),
            listen_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        }
    }
}

/// Longest single connect attempt while rank 0 may not be up yet.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);
/// Retry backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long rank 0 sleeps when no connection had anything new.
const POLL: Duration = Duration::from_millis(5);
/// Connections accepted per pass, so reading the pending ones is not starved.
const ACCEPT_BATCH: usize = 64;
/// Refusals kept for the final error message.
const KEEP_REFUSALS: usize = 8;

/// The job token on the wire: convention and job id, so a torchrun job and
/// a Slurm job with the same id do not mix either.
pub fn token(info: &LaunchInfo) -> String {
    let mut t = format!("{}:{}", info.convention.name(), info.job);
    // `detect` keeps the job id short; the cut (on a character boundary) is a last guard.
    let mut end = t.len().min(wire::MAX_TOKEN);
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    t.truncate(end);
    t
}

/// Exchanges `blob` with every rank of `info`'s job: rank 0 listens on the
/// rendezvous port, the others connect to it. Returns all blobs, in rank
/// order (this rank's own included). Authenticated with `info.secret` when
/// there is one.
pub fn rendezvous(info: &LaunchInfo, blob: &[u8], opts: &Options) -> Result<Vec<Vec<u8>>> {
    let token = token(info);
    let secret = info.secret.as_ref();
    if info.rank == 0 {
        let addr = SocketAddr::new(opts.listen_ip, info.rendezvous.port);
        let listener = TcpListener::bind(addr).map_err(|e| LaunchError::Io {
            call: if e.kind() == ErrorKind::AddrInUse {
                "rank 0: the rendezvous port is taken (another job? set TRANSFER_RENDEZVOUS=host:port)"
            } else {
                "rank 0: bind the rendezvous port"
            },
            source: e,
        })?;
        gather(&listener, &token, info.world_size, blob, secret, opts)
    } else {
        join(
            &info.rendezvous,
            &token,
            info.world_size,
            info.rank,
            blob,
            secret,
            opts,
        )
    }
}

/// One accepted connection whose hello is not complete yet.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    /// The nonce this connection's hello MAC must cover.
    challenge: [u8; NONCE_LEN],
    deadline: Instant,
    /// The frame header, then the body, as far as it arrived.
    buf: Vec<u8>,
    /// The body length, once the header is in.
    want: Option<usize>,
}

/// What one read pass over a pending connection gave.
enum Step {
    Waiting,
    Hello(Vec<u8>),
    Failed(String),
}

impl Pending {
    /// Reads what has arrived, without blocking.
    fn step(&mut self, max: usize, now: Instant) -> Step {
        let mut chunk = [0u8; 4096];
        loop {
            let need = match self.want {
                None => 4 - self.buf.len(),
                Some(n) => n - self.buf.len(),
            };
            if need == 0 {
                match self.want {
                    None => {
                        let head = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
                        match wire::frame_len(head, max) {
                            Ok(n) => {
                                self.want = Some(n);
                                self.buf.clear();
                                continue;
                            }
                            Err(e) => return Step::Failed(format!("bad hello: {e}")),
                        }
                    }
                    Some(_) => return Step::Hello(std::mem::take(&mut self.buf)),
                }
            }
            let n = need.min(chunk.len());
            match self.stream.read(&mut chunk[..n]) {
                Ok(0) => {
                    return Step::Failed(format!(
                        "closed before its hello was complete ({} bytes)",
                        self.buf.len()
                    ));
                }
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return if now >= self.deadline {
                        Step::Failed("no complete hello before its deadline".into())
                    } else {
                        Step::Waiting
                    };
                }
                Err(e) => return Step::Failed(format!("read a hello: {e}")),
            }
        }
    }
}

/// A rank that joined: its connection and the nonce its list MAC covers.
struct Joined {
    rank: usize,
    stream: TcpStream,
    nonce: [u8; NONCE_LEN],
}

/// Rank 0's side on an already bound listener; `secret`, when given, is
/// required of every rank.
pub fn gather(
    listener: &TcpListener,
    token: &str,
    world_size: usize,
    blob: &[u8],
    secret: Option<&JobSecret>,
    opts: &Options,
) -> Result<Vec<Vec<u8>>> {
    check_world(world_size, &opts.limits)?;
    wire::check_blob(blob.len(), &opts.limits)?;
    let deadline = Instant::now() + opts.timeout;
    let max_pending = opts.max_pending.max(1);
    let mut g = Gather {
        token,
        world_size,
        secret,
        opts,
        blobs: vec![None; world_size],
        from: vec![None; world_size],
        joined: Vec::new(),
        refusals: Vec::new(),
    };
    g.blobs[0] = Some(blob.to_vec());
    let mut pending: VecDeque<Pending> = VecDeque::new();
    listener
        .set_nonblocking(true)
        .map_err(io("rank 0: set the listener non-blocking"))?;
    while g.joined.len() + 1 < world_size {
        let now = Instant::now();
        if now >= deadline {
            return Err(g.timed_out());
        }
        let mut busy = false;
        for _ in 0..ACCEPT_BATCH {
            let (stream, peer) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // A client that gave up between SYN and accept, or a signal.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    g.fail_all(&format!("rank 0 failed: {e}"));
                    return Err(io("rank 0: accept")(e));
                }
            };
            busy = true;
            if pending.len() >= max_pending
                && let Some(mut old) = pending.pop_front()
            {
                let why = format!(
                    "rank 0 has {max_pending} connections pending; dropped the oldest, \
                     unread (connect again)"
                );
                send_best_effort(&mut old.stream, &Reply::Busy(why), &opts.limits);
                keep(
                    &mut g.refusals,
                    format!("{}: dropped unread ({max_pending} pending)", old.peer),
                );
            }
            match open(
                stream,
                peer,
                secret.is_some(),
                (now + opts.hello_timeout).min(deadline),
            ) {
                Ok(p) => pending.push_back(p),
                Err(why) => keep(&mut g.refusals, format!("{peer}: {why}")),
            }
        }
        let max = opts.limits.max_hello();
        let mut i = 0;
        while i < pending.len() {
            let step = pending[i].step(max, now);
            if matches!(step, Step::Waiting) {
                i += 1;
                continue;
            }
            busy = true;
            let Some(mut p) = pending.remove(i) else {
                break;
            };
            match step {
                Step::Waiting => {}
                Step::Failed(why) => {
                    refuse(&mut p.stream, &why, &opts.limits);
                    keep(&mut g.refusals, format!("{}: {why}", p.peer));
                }
                Step::Hello(body) => g.admit(p, &body)?,
            }
        }
        if !busy {
            std::thread::sleep(POLL.min(deadline.saturating_duration_since(now)));
        }
    }
    drop(pending);
    g.send_lists(deadline)
}

/// Accepts one connection: non-blocking, challenged.
fn open(
    mut stream: TcpStream,
    peer: SocketAddr,
    auth: bool,
    deadline: Instant,
) -> std::result::Result<Pending, String> {
    let challenge = auth::nonce("rank 0: draw a challenge nonce").map_err(|e| e.to_string())?;
    let frame = wire::frame(&wire::encode_challenge(&Challenge {
        auth,
        nonce: challenge,
    }))
    .map_err(|e| e.to_string())?;
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("set a connection non-blocking: {e}"))?;
    let _ = stream.set_nodelay(true);
    // 45 bytes into a fresh socket's empty send buffer: all or an error.
    match stream.write(&frame) {
        Ok(n) if n == frame.len() => {}
        Ok(n) => return Err(format!("sent {n} of {} challenge bytes", frame.len())),
        Err(e) => return Err(format!("send the challenge: {e}")),
    }
    Ok(Pending {
        stream,
        peer,
        challenge,
        deadline,
        buf: Vec::new(),
        want: None,
    })
}

/// Rank 0's state while ranks join.
struct Gather<'a> {
    token: &'a str,
    world_size: usize,
    secret: Option<&'a JobSecret>,
    opts: &'a Options,
    blobs: Vec<Option<Vec<u8>>>,
    from: Vec<Option<SocketAddr>>,
    joined: Vec<Joined>,
    refusals: Vec<String>,
}

impl Gather<'_> {
    /// Checks one complete hello and takes its rank, or refuses it. Only an
    /// authenticated hello (when there is a secret) can fail the rendezvous.
    fn admit(&mut self, mut p: Pending, body: &[u8]) -> Result<()> {
        let limits = &self.opts.limits;
        let peer = p.peer;
        let hello = match wire::decode_hello(body, limits) {
            Ok(h) => h,
            Err(e) => return self.refuse(&mut p.stream, format!("bad hello: {e}"), peer),
        };
        match self.secret {
            Some(secret) => {
                let unsigned = wire::unsigned_hello(&hello, limits)?;
                if !auth::ct_eq(&secret.hello_mac(&p.challenge, &unsigned), &hello.mac) {
                    let why = "authentication failed: the hello's MAC does not match this \
                               job's secret (TRANSFER_JOB_SECRET differs between ranks?)";
                    return self.refuse(&mut p.stream, why.into(), peer);
                }
            }
            None if !hello.mac.is_empty() => {
                let why = "this rank has a job secret and rank 0 has none: set \
                           TRANSFER_JOB_SECRET on every rank or on none";
                return self.refuse(&mut p.stream, why.into(), peer);
            }
            None => {}
        }
        if hello.token != self.token {
            let why = format!(
                "job token mismatch: rank 0 runs {:?}, this rank {:?} \
                 (two jobs on one port? set TRANSFER_RENDEZVOUS or TRANSFER_JOB_ID)",
                self.token, hello.token
            );
            return self.refuse(&mut p.stream, why, peer);
        }
        let world_size = self.world_size;
        let rank = hello.rank as usize;
        if hello.world_size as usize != world_size {
            let why = format!(
                "world size mismatch: rank {rank} at {peer} says {}, rank 0 says {world_size}",
                hello.world_size
            );
            refuse(&mut p.stream, &why, limits);
            self.fail_all(&why);
            return Err(LaunchError::Rank { rank, reason: why });
        }
        if rank == 0 || rank >= world_size {
            let why = format!("rank {rank} from {peer} is out of range 1..{world_size}");
            return self.refuse(&mut p.stream, why, peer);
        }
        if let Some(first) = self.from[rank] {
            let why = format!(
                "rank {rank} already joined from {first}; refused the duplicate from {peer}"
            );
            return self.refuse(&mut p.stream, why, peer);
        }
        // Blocking again: the list is written with a timeout, in one go.
        if let Err(e) = p.stream.set_nonblocking(false) {
            let why = format!("set a connection blocking: {e}");
            return self.refuse(&mut p.stream, why, peer);
        }
        self.from[rank] = Some(peer);
        self.blobs[rank] = Some(hello.blob);
        self.joined.push(Joined {
            rank,
            stream: p.stream,
            nonce: hello.nonce,
        });
        Ok(())
    }

    /// Refuses one connection and remembers why for the final error; the
    /// rendezvous goes on.
    fn refuse(&mut self, s: &mut TcpStream, why: String, peer: SocketAddr) -> Result<()> {
        refuse(s, &why, &self.opts.limits);
        let line = if why.contains(&peer.to_string()) {
            why
        } else {
            format!("{peer}: {why}")
        };
        keep(&mut self.refusals, line);
        Ok(())
    }

    /// Refuses every rank that joined: the rendezvous failed as a whole.
    fn fail_all(&mut self, why: &str) {
        for j in &mut self.joined {
            refuse(&mut j.stream, why, &self.opts.limits);
        }
    }

    fn timed_out(&mut self) -> LaunchError {
        let world_size = self.world_size;
        let missing: Vec<usize> = (1..world_size)
            .filter(|&r| self.blobs[r].is_none())
            .collect();
        let mut detail = format!(
            ": {} of {world_size} ranks joined; missing ranks {}",
            self.joined.len() + 1,
            short_list(&missing)
        );
        if !self.refusals.is_empty() {
            detail += &format!("; refused: {}", self.refusals.join("; "));
        }
        self.fail_all(&format!(
            "rank 0 timed out waiting for ranks {}",
            short_list(&missing)
        ));
        LaunchError::Timeout {
            what: "rendezvous at rank 0",
            after: self.opts.timeout,
            detail,
        }
    }

    /// Sends every joined rank the list, signed for it when there is a secret.
    fn send_lists(self, deadline: Instant) -> Result<Vec<Vec<u8>>> {
        let all: Vec<Vec<u8>> = self.blobs.into_iter().flatten().collect();
        // Encoded once; only the MAC differs between ranks.
        let unsigned =
            wire::encode_reply(&Reply::Accepted(all.clone(), Vec::new()), &self.opts.limits)?;
        let mut lost = Vec::new();
        for mut j in self.joined {
            let mac = self
                .secret
                .map(|s| s.list_mac(&j.nonce, &unsigned).to_vec())
                .unwrap_or_default();
            let (head, prefix, tail) = wire::signed_frame(&unsigned, &mac)?;
            let s = &mut j.stream;
            let sent = write_by(s, &[&head, prefix, &tail], deadline, Duration::from_secs(1));
            if let Err(e) = sent {
                lost.push((j.rank, e.to_string()));
            }
            // The rank reads to the end of the frame; closing tells it no more comes.
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        if let Some((rank, e)) = lost.first() {
            return Err(LaunchError::Rank {
                rank: *rank,
                reason: format!(
                    "left before the list reached it ({e}; {} rank(s) lost in all)",
                    lost.len()
                ),
            });
        }
        Ok(all)
    }
}

/// A rank's side: connects to rank 0 (retrying until the deadline while it
/// is not up, or while it is too busy to read this connection), answers its
/// challenge with the hello, waits for the list. With `secret` the hello is
/// authenticated and only a list signed with the same secret is believed;
/// a rank 0 without a secret is refused then (no silent downgrade).
pub fn join(
    rendezvous: &Endpoint,
    token: &str,
    world_size: usize,
    rank: usize,
    blob: &[u8],
    secret: Option<&JobSecret>,
    opts: &Options,
) -> Result<Vec<Vec<u8>>> {
    check_world(world_size, &opts.limits)?;
    if rank == 0 || rank >= world_size {
        return Err(LaunchError::Rank {
            rank,
            reason: format!("cannot join as rank {rank} of {world_size}"),
        });
    }
    let mut hello = Hello {
        token: token.to_string(),
        // check_world bounds both by max_world; a u32 holds any sane world.
        world_size: u32::try_from(world_size).map_err(|_| LaunchError::Limit {
            what: "world size",
            value: world_size as u64,
            max: u64::from(u32::MAX),
        })?,
        rank: u32::try_from(rank).map_err(|_| LaunchError::Limit {
            what: "rank",
            value: rank as u64,
            max: u64::from(u32::MAX),
        })?,
        blob: blob.to_vec(),
        nonce: [0; NONCE_LEN],
        mac: Vec::new(),
    };
    // Refuses an oversized blob before any connection.
    wire::encode_hello(&hello, &opts.limits)?;
    let deadline = Instant::now() + opts.timeout;
    let timeout = |e: LaunchError| match e {
        LaunchError::Timeout { what, detail, .. } => LaunchError::Timeout {
            what,
            after: opts.timeout,
            detail,
        },
        e => e,
    };
    let mut backoff = BACKOFF_MIN;
    loop {
        let mut stream = connect_retry(rendezvous, deadline, opts.timeout)?;
        let challenge_max = wire::CHALLENGE_LEN.max(4 + 1 + 1 + 2 + wire::MAX_REASON);
        let challenge = read_frame(
            &mut stream,
            challenge_max,
            deadline,
            "wait for rank 0's challenge",
        )
        .and_then(|b| wire::decode_challenge(&b))
        .map_err(timeout)?;
        match (challenge.auth, secret) {
            (true, None) => {
                return Err(LaunchError::Auth(
                    "rank 0 requires a job secret and this rank has none: set                      TRANSFER_JOB_SECRET on every rank"
                        .into(),
                ));
            }
            (false, Some(_)) => {
                return Err(LaunchError::Auth(
                    "this rank has a job secret and rank 0 (or whoever listens there) has none:                      set TRANSFER_JOB_SECRET on every rank; not sending this rank's blob                      unauthenticated"
                        .into(),
                ));
            }
            _ => {}
        }
        hello.nonce = auth::nonce("draw a hello nonce")?;
        hello.mac = match secret {
            Some(s) => s
                .hello_mac(
                    &challenge.nonce,
                    &wire::unsigned_hello(&hello, &opts.limits)?,
                )
                .to_vec(),
            None => Vec::new(),
        };
        let frame = wire::frame(&wire::encode_hello(&hello, &opts.limits)?)?;
        write_by(&stream, &[&frame], deadline, Duration::from_millis(100))
            .map_err(io("send the hello to rank 0"))?;
        let body = read_frame(
            &mut stream,
            opts.limits.max_reply(),
            deadline,
            "wait for rank 0's list",
        )
        .map_err(timeout)?;
        let (blobs, mac) = match wire::decode_reply(&body, &opts.limits)? {
            Reply::Refused(why) => return Err(LaunchError::Refused(why)),
            Reply::Busy(_) => {
                // Dropped unread: nothing was decided, try a fresh connection.
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            Reply::Accepted(blobs, mac) => (blobs, mac),
        };
        match secret {
            Some(s) => {
                let unsigned =
                    wire::encode_reply(&Reply::Accepted(blobs.clone(), Vec::new()), &opts.limits)?;
                if !auth::ct_eq(&s.list_mac(&hello.nonce, &unsigned), &mac) {
                    return Err(LaunchError::Auth(
                        "rank 0's list does not carry this job's MAC (another secret, or not                          rank 0)"
                            .into(),
                    ));
                }
            }
            None if !mac.is_empty() => {
                return Err(LaunchError::Wire(
                    "rank 0 signed the list of a rendezvous without a secret".into(),
                ));
            }
            None => {}
        }
        if blobs.len() != world_size {
            return Err(LaunchError::Wire(format!(
                "rank 0 sent {} blobs for a world of {world_size}",
                blobs.len()
            )));
        }
        if blobs[rank] != blob {
            return Err(LaunchError::Wire(format!(
                "rank 0's list holds another blob at rank {rank}"
            )));
        }
        return Ok(blobs);
    }
}

fn connect_retry(to: &Endpoint, deadline: Instant, total: Duration) -> Result<TcpStream> {
    let mut backoff = BACKOFF_MIN;
    let mut last = String::from("no attempt");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LaunchError::Timeout {
                what: "connect to rank 0",
                after: total,
                detail: format!(" at {to}: last error: {last}"),
            });
        }
        // Resolved on every attempt: a node's name may appear late in DNS.
        match (to.host.as_str(), to.port).to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    match TcpStream::connect_timeout(&a, CONNECT_ATTEMPT.min(left)) {
                        Ok(s) => {
                            // Small frames, one each way: no Nagle delay.
                            let _ = s.set_nodelay(true);
                            return Ok(s);
                        }
                        Err(e) => last = format!("{a}: {e}"),
                    }
                }
            }
            Err(e) => last = format!("resolve {}: {e}", to.host),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Reads one frame of at most `max` body bytes before `deadline`.
fn read_frame(
    s: &mut TcpStream,
    max: usize,
    deadline: Instant,
    what: &'static str,
) -> Result<Vec<u8>> {
    let mut from = Deadline::new(s, deadline);
    let mut head = [0u8; 4];
    read_exact_by(&mut from, &mut head, what)?;
    let len = wire::frame_len(head, max)?;
    let mut body = vec![0u8; len];
    read_exact_by(&mut from, &mut body, what)?;
    Ok(body)
}

/// `read_exact` under `io`'s one deadline, with how far it got in the error.
fn read_exact_by(from: &mut Deadline<'_>, buf: &mut [u8], what: &'static str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match from.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(io(what)(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("peer closed after {got} of {} bytes", buf.len()),
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                return Err(LaunchError::Timeout {
                    what,
                    after: Duration::ZERO,
                    detail: format!(": {got} of {} bytes arrived", buf.len()),
                });
            }
            Err(e) => return Err(io(what)(e)),
        }
    }
    Ok(())
}

/// Writes `parts` under one deadline, at least `floor` from now (a frame
/// sent as a deadline runs out still gets a moment).
fn write_by(
    s: &TcpStream,
    parts: &[&[u8]],
    deadline: Instant,
    floor: Duration,
) -> std::io::Result<()> {
    let mut to = Deadline::new(s, deadline.max(Instant::now() + floor));
    for p in parts {
        to.write_all(p)?;
    }
    Ok(())
}

/// Tells one connection why it is refused; best effort, it is dropped next.
fn refuse(s: &mut TcpStream, why: &str, limits: &Limits) {
    send_best_effort(s, &Reply::Refused(why.into()), limits);
}

/// Sends one small reply without waiting long: a blocking socket gets a
/// one-second write timeout, a non-blocking one takes what fits (a reply
/// of at most ~1 KiB fits the empty send buffer of a connection rank 0 has
/// only sent a challenge on).
fn send_best_effort(s: &mut TcpStream, reply: &Reply, limits: &Limits) {
    if let Ok(frame) = wire::encode_reply(reply, limits).and_then(|b| wire::frame(&b)) {
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = s.write_all(&frame);
    }
}

fn keep(refusals: &mut Vec<String>, r: String) {
    if refusals.len() < KEEP_REFUSALS {
        refusals.push(r);
    }
}

/// `[1, 2, 3]`, or the first 16 and a count.
fn short_list(ranks: &[usize]) -> String {
    let shown: Vec<String> = ranks.iter().take(16).map(usize::to_string).collect();
    let more = ranks.len().saturating_sub(16);
    if more > 0 {
        format!("[{} and {more} more]", shown.join(", "))
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// A world of at least one rank, within the limits (the wire's check).
fn check_world(n: usize, limits: &Limits) -> Result<()> {
    if n == 0 {
        return Err(LaunchError::Limit {
            what: "world size",
            value: 0,
            max: limits.max_world as u64,
        });
    }
    wire::check_world(n, limits)
}
