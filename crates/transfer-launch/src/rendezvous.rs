//! The rendezvous over TCP: every rank sends its blob to rank 0, rank 0
//! answers every rank with all blobs in rank order.
//!
//! Bounded everywhere: one deadline for the whole exchange
//! ([`Options::timeout`]), a shorter one per incoming hello so a mute
//! connection cannot hold rank 0 ([`Options::hello_timeout`]), retries with
//! backoff while rank 0 is not up yet, frame sizes from [`Limits`].
//! Rank 0 refuses, with a reason the rank prints, a hello from another job
//! (token mismatch: two jobs on one port), a rank out of range and a rank
//! that already joined; a rank announcing another world size fails the
//! whole rendezvous (the job is misconfigured), and so does the deadline,
//! after telling every joined rank why.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::env::{Endpoint, LaunchInfo};
use crate::error::{LaunchError, Result, io};
use crate::wire::{self, Hello, Limits, Reply};

/// How a rendezvous waits and what it accepts.
#[derive(Debug, Clone)]
pub struct Options {
    /// Deadline of the whole exchange, on every rank.
    pub timeout: Duration,
    /// Rank 0's deadline for one connection's hello.
    pub hello_timeout: Duration,
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
/// How often rank 0 polls its non-blocking listener.
const ACCEPT_POLL: Duration = Duration::from_millis(10);
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
/// order (this rank's own included).
pub fn rendezvous(info: &LaunchInfo, blob: &[u8], opts: &Options) -> Result<Vec<Vec<u8>>> {
    let token = token(info);
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
        gather(&listener, &token, info.world_size, blob, opts)
    } else {
        join(
            &info.rendezvous,
            &token,
            info.world_size,
            info.rank,
            blob,
            opts,
        )
    }
}

/// Rank 0's side on an already bound listener.
pub fn gather(
    listener: &TcpListener,
    token: &str,
    world_size: usize,
    blob: &[u8],
    opts: &Options,
) -> Result<Vec<Vec<u8>>> {
    check_world(world_size, &opts.limits)?;
    wire::check_blob(blob.len(), &opts.limits)?;
    let deadline = Instant::now() + opts.timeout;
    let mut blobs: Vec<Option<Vec<u8>>> = vec![None; world_size];
    blobs[0] = Some(blob.to_vec());
    let mut joined: Vec<(usize, TcpStream)> = Vec::new();
    let mut from: Vec<Option<SocketAddr>> = vec![None; world_size];
    let mut refusals: Vec<String> = Vec::new();
    listener
        .set_nonblocking(true)
        .map_err(io("rank 0: set the listener non-blocking"))?;
    while joined.len() + 1 < world_size {
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = (1..world_size).filter(|&r| blobs[r].is_none()).collect();
            let mut detail = format!(
                ": {} of {world_size} ranks joined; missing ranks {}",
                joined.len() + 1,
                short_list(&missing)
            );
            if !refusals.is_empty() {
                detail += &format!("; refused: {}", refusals.join("; "));
            }
            fail_all(
                &mut joined,
                &format!(
                    "rank 0 timed out waiting for ranks {}",
                    short_list(&missing)
                ),
                &opts.limits,
            );
            return Err(LaunchError::Timeout {
                what: "rendezvous at rank 0",
                after: opts.timeout,
                detail,
            });
        }
        let (mut stream, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL.min(deadline - now));
                continue;
            }
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
                fail_all(&mut joined, &format!("rank 0 failed: {e}"), &opts.limits);
                return Err(io("rank 0: accept")(e));
            }
        };
        let hello_deadline = (now + opts.hello_timeout).min(deadline);
        let hello = stream
            .set_nonblocking(false)
            .map_err(io("rank 0: set a connection blocking"))
            .and_then(|()| {
                read_frame(
                    &mut stream,
                    opts.limits.max_hello(),
                    hello_deadline,
                    "rank 0: read a hello",
                )
            })
            .and_then(|body| wire::decode_hello(&body, &opts.limits));
        let hello = match hello {
            Ok(h) => h,
            Err(e) => {
                refuse(&mut stream, &format!("bad hello: {e}"), &opts.limits);
                keep(&mut refusals, format!("{peer}: bad hello: {e}"));
                continue;
            }
        };
        if hello.token != token {
            let why = format!(
                "job token mismatch: rank 0 runs {token:?}, this rank {:?} \
                 (two jobs on one port? set TRANSFER_RENDEZVOUS or TRANSFER_JOB_ID)",
                hello.token
            );
            refuse(&mut stream, &why, &opts.limits);
            keep(&mut refusals, format!("{peer}: {why}"));
            continue;
        }
        let rank = hello.rank as usize;
        if hello.world_size as usize != world_size {
            let why = format!(
                "world size mismatch: rank {rank} at {peer} says {}, rank 0 says {world_size}",
                hello.world_size
            );
            refuse(&mut stream, &why, &opts.limits);
            fail_all(&mut joined, &why, &opts.limits);
            return Err(LaunchError::Rank { rank, reason: why });
        }
        if rank == 0 || rank >= world_size {
            let why = format!("rank {rank} from {peer} is out of range 1..{world_size}");
            refuse(&mut stream, &why, &opts.limits);
            keep(&mut refusals, why);
            continue;
        }
        if let Some(first) = from[rank] {
            let why = format!(
                "rank {rank} already joined from {first}; refused the duplicate from {peer}"
            );
            refuse(&mut stream, &why, &opts.limits);
            keep(&mut refusals, why);
            continue;
        }
        from[rank] = Some(peer);
        blobs[rank] = Some(hello.blob);
        joined.push((rank, stream));
    }
    let all: Vec<Vec<u8>> = blobs.into_iter().flatten().collect();
    let body = wire::encode_reply(&Reply::Accepted(all.clone()), &opts.limits)?;
    let frame = wire::frame(&body)?;
    let mut lost = Vec::new();
    for (rank, stream) in &mut joined {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        let sent = stream
            .set_write_timeout(Some(left))
            .and_then(|()| stream.write_all(&frame))
            .and_then(|()| stream.flush());
        if let Err(e) = sent {
            lost.push((*rank, e.to_string()));
        }
        // The rank reads to the end of the frame; closing tells it no more comes.
        let _ = stream.shutdown(std::net::Shutdown::Write);
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

/// A rank's side: connects to rank 0 (retrying until the deadline while it
/// is not up), sends the hello, waits for the list.
pub fn join(
    rendezvous: &Endpoint,
    token: &str,
    world_size: usize,
    rank: usize,
    blob: &[u8],
    opts: &Options,
) -> Result<Vec<Vec<u8>>> {
    check_world(world_size, &opts.limits)?;
    if rank == 0 || rank >= world_size {
        return Err(LaunchError::Rank {
            rank,
            reason: format!("cannot join as rank {rank} of {world_size}"),
        });
    }
    let hello = Hello {
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
    };
    let frame = wire::frame(&wire::encode_hello(&hello, &opts.limits)?)?;
    let deadline = Instant::now() + opts.timeout;
    let mut stream = connect_retry(rendezvous, deadline, opts.timeout)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    stream
        .set_write_timeout(Some(left))
        .and_then(|()| stream.write_all(&frame))
        .map_err(io("send the hello to rank 0"))?;
    let body = read_frame(
        &mut stream,
        opts.limits.max_reply(),
        deadline,
        "wait for rank 0's list",
    )
    .map_err(|e| match e {
        LaunchError::Timeout { what, detail, .. } => LaunchError::Timeout {
            what,
            after: opts.timeout,
            detail,
        },
        e => e,
    })?;
    match wire::decode_reply(&body, &opts.limits)? {
        Reply::Refused(why) => Err(LaunchError::Refused(why)),
        Reply::Accepted(blobs) if blobs.len() != world_size => Err(LaunchError::Wire(format!(
            "rank 0 sent {} blobs for a world of {world_size}",
            blobs.len()
        ))),
        Reply::Accepted(blobs) if blobs[rank] != blob => Err(LaunchError::Wire(format!(
            "rank 0's list holds another blob at rank {rank}"
        ))),
        Reply::Accepted(blobs) => Ok(blobs),
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
    let mut head = [0u8; 4];
    read_exact_by(s, &mut head, deadline, what)?;
    let len = wire::frame_len(head, max)?;
    let mut body = vec![0u8; len];
    read_exact_by(s, &mut body, deadline, what)?;
    Ok(body)
}

/// `read_exact` with one deadline over all the reads it takes.
fn read_exact_by(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &'static str,
) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(LaunchError::Timeout {
                what,
                after: Duration::ZERO,
                detail: format!(": {got} of {} bytes arrived", buf.len()),
            });
        }
        s.set_read_timeout(Some(left)).map_err(io(what))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(io(what)(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("peer closed after {got} of {} bytes", buf.len()),
                )));
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(io(what)(e)),
        }
    }
    Ok(())
}

/// Tells one connection why it is refused; best effort, it is dropped next.
fn refuse(s: &mut TcpStream, why: &str, limits: &Limits) {
    if let Ok(frame) =
        wire::encode_reply(&Reply::Refused(why.into()), limits).and_then(|b| wire::frame(&b))
    {
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = s.write_all(&frame);
    }
}

/// Refuses every rank that joined: the rendezvous failed as a whole.
fn fail_all(joined: &mut [(usize, TcpStream)], why: &str, limits: &Limits) {
    for (_, s) in joined {
        refuse(s, why, limits);
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
