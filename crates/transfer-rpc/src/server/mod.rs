//! A threaded ggml-rpc TCP server.
//!
//! One thread per connection. Connections are admitted by [`admission`]:
//! bounded sessions (in total and per client address), bounded connections
//! waiting for their HELLO (the oldest is closed to make room, so silent
//! sockets cannot lock clients out), a deadline for the HELLO and for every
//! frame once it has started. Sessions share one
//! [`BufferRegistry`]; each owns the buffers it allocated and frees them on
//! disconnect. Bad input closes only its own connection, with a logged
//! reason. Sessions take turns on a device graph by graph ([`fair`]), and a
//! device is held only around compute, never while talking to another server.

pub mod admission;
pub mod budget;
pub mod cache;
pub mod compute;
#[cfg(feature = "ggml")]
pub mod compute_worker;
pub mod config;
mod dispatch;
pub mod fair;
#[cfg(feature = "ggml")]
pub mod ggml_backend;
pub mod host_memory;
pub mod isolated;
pub mod marks;
pub mod peer;
pub mod registry;
pub mod session;
pub mod worker_graph;
pub mod worker_ipc;

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use cache::HashCache;
pub use compute::{ComputeBackend, RefusingBackend};
pub use config::ServerConfig;
#[cfg(feature = "ggml")]
pub use ggml_backend::GgmlCpuBackend;
pub use registry::{BufferLimits, BufferRegistry};

use crate::error::{Result, RpcError};
use admission::{Admission, AdmissionLimits};
use budget::InflightBudget;
use session::Session;

/// State shared by every session of a server.
pub struct Shared {
    /// Configuration.
    pub config: ServerConfig,
    /// All buffers.
    pub registry: Arc<BufferRegistry>,
    /// Graph compute.
    pub backend: Arc<dyn ComputeBackend>,
    /// One first-come, first-served queue per device ([`fair`]).
    pub device_queues: Vec<fair::DeviceQueue>,
    /// SET_TENSOR_HASH cache.
    pub cache: Option<HashCache>,
    stop: AtomicBool,
    next_session: AtomicU64,
    live: Mutex<HashMap<u64, TcpStream>>,
    closed_with_error: AtomicU64,
    /// Pending connections and session slots.
    pub admission: Arc<Admission>,
    /// Bytes requests hold outside the buffer quota.
    pub budget: Arc<InflightBudget>,
    /// Mark keys of the sessions (MARK_OPEN, MARK_WAIT, PEER_MARK).
    pub marks: marks::Marks,
}

impl Shared {
    /// Writes one log line to stderr.
    pub fn log(&self, msg: &str) {
        eprintln!("transfer-rpc-server: {msg}");
        // With `-v`, one line per command: the server's side of a
        // client's timeline (`TRANSFER_RPC_TRACE`, same file, same clock).
        crate::client::trace::event(format_args!("server {msg}"));
    }

    /// Connections closed because of refused or malformed input so far.
    pub fn refused_connections(&self) -> u64 {
        self.closed_with_error.load(Ordering::Relaxed)
    }

    /// True once the server is shutting down.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sessions currently connected.
    pub fn live_sessions(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A bound, not yet serving, server.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
}

impl Server {
    /// Binds `config.bind` and prepares the shared state. `max_buffers` is
    /// lowered to what the descriptor limit can hold next to the
    /// connections (see [`fit_descriptors`]).
    pub fn bind(mut config: ServerConfig, backend: Arc<dyn ComputeBackend>) -> Result<Server> {
        if let Some(fit) = fit_descriptors(&config) {
            if fit < config.max_buffers {
                eprintln!(
                    "transfer-rpc-server: the descriptor limit (ulimit -n) holds {fit} buffers next to \
                     the connections; --max-buffers lowered from {}",
                    config.max_buffers
                );
                config.max_buffers = fit;
            }
        }
        let listener =
            TcpListener::bind(&config.bind).map_err(|e| RpcError::io("Server::bind", e))?;
        let cache = config
            .cache_dir
            .as_deref()
            .map(|dir| HashCache::open(dir, config.cache_max_bytes))
            .transpose()?;
        let admission = Admission::new(AdmissionLimits {
            max_sessions: config.max_connections,
            max_sessions_per_address: config.max_connections_per_address,
            max_pending: config.max_pending,
            max_pending_per_address: config.max_pending_per_address,
        });
        let shared = Arc::new(Shared {
            registry: Arc::new(BufferRegistry::with_limits(
                config.memory_quota,
                BufferLimits {
                    per_session: config.max_buffers_per_session,
                    total: config.max_buffers,
                },
            )),
            backend,
            device_queues: (0..config.devices)
                .map(|_| fair::DeviceQueue::default())
                .collect(),
            cache,
            stop: AtomicBool::new(false),
            next_session: AtomicU64::new(1),
            live: Mutex::new(HashMap::new()),
            closed_with_error: AtomicU64::new(0),
            admission,
            budget: InflightBudget::with_share(config.inflight_budget, config.inflight_per_address),
            marks: marks::Marks::default(),
            config,
        });
        Ok(Server { shared, listener })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| RpcError::io("Server::local_addr", e))
    }

    /// The shared state (registry, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Serves until shut down (blocks the calling thread).
    pub fn run(self) -> Result<()> {
        let stop = || self.shared.stop.load(Ordering::SeqCst);
        let mut failing = AcceptBackoff::default();
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) => {
                    if stop() {
                        return Ok(());
                    }
                    // Out of descriptors (EMFILE/ENFILE) or memory: the
                    // connection stays in the backlog and accept() fails
                    // again at once. Retrying at once spun a core and
                    // wrote 650,000 log lines in 4 s; back off until
                    // sessions or hello deadlines free something.
                    let (pause, report) = failing.failed();
                    if let Some(suppressed) = report {
                        self.shared.log(&format!(
                            "accept failed: {e} ({suppressed} more failures since the last report; \
                             retrying every {pause:?})"
                        ));
                    }
                    std::thread::sleep(pause);
                    continue;
                }
            };
            failing = AcceptBackoff::default();
            if stop() {
                return Ok(());
            }
            let _ = stream.set_nodelay(true);
            // Until the HELLO has arrived.
            let _ = stream.set_read_timeout(Some(self.shared.config.hello_timeout));
            let _ = stream.set_write_timeout(Some(self.shared.config.frame_timeout));
            let id = self.shared.next_session.fetch_add(1, Ordering::Relaxed);
            self.shared
                .admission
                .accepted(id, peer.ip(), stream.try_clone().ok());
            if let Ok(clone) = stream.try_clone() {
                self.shared
                    .live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id, clone);
            }
            let shared = Arc::clone(&self.shared);
            let spawned = std::thread::Builder::new()
                .name(format!("rpc-session-{id}"))
                .spawn(move || serve_connection(shared, id, stream, peer));
            if let Err(e) = spawned {
                self.shared.admission.pending_closed(id, peer.ip());
                self.shared
                    .log(&format!("cannot start a session thread: {e}"));
                self.shared
                    .live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
            }
        }
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> Result<ServerHandle> {
        let addr = self.local_addr()?;
        let shared = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new()
            .name("rpc-accept".into())
            .spawn(move || self.run())
            .map_err(|e| RpcError::io("Server::spawn", e))?;
        Ok(ServerHandle {
            addr,
            shared,
            thread: Some(thread),
        })
    }
}

/// Pause after each failed accept: doubling from 1 ms to 100 ms, one log
/// line per second at most.
#[derive(Debug, Default)]
struct AcceptBackoff {
    failures: u32,
    suppressed: u64,
    last_report: Option<Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(1);
    const MOST: Duration = Duration::from_millis(100);
    const REPORT_EVERY: Duration = Duration::from_secs(1);

    /// One more failure: how long to pause, and whether to log it (with
    /// the failures not logged since the last line).
    fn failed(&mut self) -> (Duration, Option<u64>) {
        let pause = Self::FIRST
            .saturating_mul(1u32 << self.failures.min(16))
            .min(Self::MOST);
        self.failures = self.failures.saturating_add(1);
        let now = Instant::now();
        if self
            .last_report
            .is_none_or(|t| now.duration_since(t) >= Self::REPORT_EVERY)
        {
            self.last_report = Some(now);
            (pause, Some(std::mem::take(&mut self.suppressed)))
        } else {
            self.suppressed += 1;
            (pause, None)
        }
    }
}

/// Descriptors a server needs besides its buffers: the standard ones, the
/// listener, the log, compute workers' sockets, cache files (a margin of
/// 64); three per connection waiting for its HELLO (socket, the live-list
/// and admission clones), two per session and its peer connections.
fn descriptors_besides_buffers(c: &ServerConfig) -> u64 {
    let per_session = 2 + c.max_peer_connections_per_session as u64;
    64 + 3 * c.max_pending as u64 + per_session * c.max_connections as u64
}

/// How many buffers fit in the process's descriptor limit next to
/// everything else (one memfd each), after raising the soft limit to the
/// hard one; `None` when the limit cannot be read.
pub fn fit_descriptors(c: &ServerConfig) -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct; raising the soft limit
        // up to the hard one needs no privilege. On failure the old limit
        // stays and is what we count with.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    let have: u64 = lim.rlim_cur;
    // The estimate assumes every connection slot full at once; under a
    // small limit buffers still get a quarter of it (the accept loop backs
    // off if connections then run out).
    let left = have
        .saturating_sub(descriptors_besides_buffers(c))
        .max(have / 4);
    Some(usize::try_from(left).unwrap_or(usize::MAX))
}

fn serve_connection(shared: Arc<Shared>, id: u64, mut stream: TcpStream, peer: SocketAddr) {
    let mut session = Session::new(id, peer.ip(), Arc::clone(&shared));
    if shared.config.verbose {
        shared.log(&format!("session {id}: accepted {peer}"));
    }
    if let Err(e) = session.run(&mut stream) {
        if !shared.stop.load(Ordering::SeqCst) {
            shared.closed_with_error.fetch_add(1, Ordering::Relaxed);
            shared.log(&format!(
                "session {id}: closing connection from {peer}: {e}"
            ));
        }
    }
    session.close();
    if !session.is_admitted() {
        shared.admission.pending_closed(id, peer.ip());
    }
    // A session's slot is released when `session` drops, after its buffers
    // were freed.
    drop(session);
    let _ = stream.shutdown(Shutdown::Both);
    shared
        .live
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id);
}

/// A server running on a background thread; shuts down on drop.
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl ServerHandle {
    /// Address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port` string of [`ServerHandle::addr`].
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// The shared state (registry, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops accepting, closes every live connection, joins the accept thread.
    pub fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for s in self
            .shared
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake a blocked accept().
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
