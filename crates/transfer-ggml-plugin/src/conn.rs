//! One server connection and its ordered command stream: ggml's
//! asynchronous calls (tensor writes and reads, graph computes, event
//! records) queue jobs that one worker thread runs in order on the
//! connection; synchronous calls first wait for the queue to drain, then run
//! on the caller's thread. Every wait has a deadline; the first failure
//! closes the connection for good and every later call fails fast (the host
//! sees a failed graph compute, never a hang or an abort).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use transfer_rpc::client::{Client, ClientConfig};

use crate::abi::LOG_ERROR;
use crate::error::{PluginError, Result};
use crate::host;

/// Environment variable: seconds a server may take to answer (default 300).
pub const ENV_TIMEOUT: &str = "TRANSFER_RPC_TIMEOUT_S";
/// Environment variable: `CLIENT_ENDPOINT=PEER_ENDPOINT[,...]`, the
/// address other servers reach a server by when it differs from this
/// process's (a proxy or NAT in front of the servers): the destination a
/// COPY_TENSOR_TO names. Unlisted servers are reached at their own endpoint.
pub const ENV_PEER_MAP: &str = "TRANSFER_RPC_PEER_MAP";
/// Environment variable: `0` turns the marks off (every COPY_TENSOR_TO
/// answered to this process before the destination's next command, as
/// before the marks; `cargo xtask bench llama-plugin --answered` compares).
pub const ENV_MARKS: &str = "TRANSFER_RPC_MARKS";
/// Jobs queued per connection before an asynchronous call waits for room.
const QUEUE_CAP: usize = 1024;
/// How long a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle worker checks for shutdown.
const IDLE_TICK: Duration = Duration::from_millis(500);

/// A command run on the connection by the worker.
pub type Work = Box<dyn FnOnce(&mut Client, &Conn) -> transfer_rpc::Result<()> + Send>;

/// A one-shot completion flag with a deadline wait.
#[derive(Default)]
pub struct Done {
    set: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    /// Marks it complete.
    pub fn set(&self) {
        *self.set.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Waits up to `timeout`; true when complete.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.set.lock().unwrap_or_else(|p| p.into_inner());
        while !*g {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = match self.cv.wait_timeout(g, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }
}

enum Job {
    /// A command, at its position on the stream ([`Conn::post_at`]).
    Run(u64, Work),
    Signal(Arc<Done>),
    Wait(Arc<Done>),
}

struct Queue {
    jobs: VecDeque<Job>,
    /// A job is running (popped but not finished).
    busy: bool,
    failed: Option<String>,
}

/// A connection to one server.
pub struct Conn {
    endpoint: String,
    /// Where other servers reach this one ([`ENV_PEER_MAP`]).
    peer_endpoint: String,
    timeout: Duration,
    /// The server serves COPY_TENSOR_TO (it can be the source of a direct copy).
    copy_to: bool,
    /// The server serves PEER_BARRIER (it can be a destination).
    peer_barrier: bool,
    /// `TRANSFER_RPC_P2P` (default on): direct copies allowed.
    p2p: bool,
    /// The server runs an engine and serves ENGINE_* (its HELLO says so).
    engine: bool,
    /// ENGINE_INFO's answer, asked once (`None` until then).
    engine_info: Mutex<Option<transfer_rpc::client::EngineInfo>>,
    /// The server serves the marks (MARK_WAIT, COPY_TENSOR_TO_MARK).
    marks: bool,
    /// This connection's mark key (MARK_OPEN, asked once; `Some(None)`:
    /// refused, marks not used).
    mark_key: Mutex<Option<Option<u64>>>,
    /// The last mark handed out on this connection (1, 2, ...).
    last_mark: std::sync::atomic::AtomicU64,
    /// Marks handed out since the last job that may read this server's
    /// buffers was queued (see [`Conn::take_mark`]).
    marks_in_window: std::sync::atomic::AtomicU64,
    /// Every command sent so far is known to have run on the server (the
    /// last one was answered). Cleared before each command, set by the
    /// callers whose last command was answered ([`Conn::settled_by`]).
    settled: std::sync::atomic::AtomicBool,
    /// `settled` as it was when the running command started.
    settled_before: std::sync::atomic::AtomicBool,
    /// Position the next queued job gets (1, 2, ...).
    next_pos: std::sync::atomic::AtomicU64,
    /// Position of the last queued job that may read this server's
    /// buffers (a graph, a copy's or write's source, a read): what a write
    /// into one of its buffers by another server must come after.
    last_reader: std::sync::atomic::AtomicU64,
    /// What this process knows the server has executed.
    known: Mutex<Known>,
    client: Mutex<Option<Client>>,
    queue: Mutex<Queue>,
    cv: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// `endpoint`'s entry in a [`ENV_PEER_MAP`] value, or itself.
pub fn peer_endpoint_of(endpoint: &str, map: Option<&str>) -> String {
    map.into_iter()
        .flat_map(|m| m.split(','))
        .filter_map(|e| e.trim().split_once('='))
        .find(|(from, _)| from.trim() == endpoint)
        .map_or_else(|| endpoint.to_owned(), |(_, to)| to.trim().to_owned())
}

/// The answer deadline from [`ENV_TIMEOUT`].
pub fn timeout_from_env() -> Duration {
    std::env::var(ENV_TIMEOUT)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(Duration::from_secs(300), Duration::from_secs)
}

impl Conn {
    /// Connects (HELLO, the extension probe) and starts the worker.
    pub fn connect(endpoint: &str) -> Result<Arc<Conn>> {
        let timeout = timeout_from_env();
        let config = ClientConfig {
            connect_timeout: Some(CONNECT_TIMEOUT),
            io_timeout: Some(timeout),
            ..ClientConfig::from_env()
        };
        let client = Client::connect(endpoint, config).map_err(|source| PluginError::Rpc {
            endpoint: endpoint.to_owned(),
            source,
        })?;
        let conn = Arc::new(Conn {
            endpoint: endpoint.to_owned(),
            peer_endpoint: peer_endpoint_of(endpoint, std::env::var(ENV_PEER_MAP).ok().as_deref()),
            timeout,
            copy_to: client.supports_copy_to(),
            peer_barrier: client.supports_peer_barrier(),
            p2p: client.config().p2p,
            engine: client.supports_engine(),
            engine_info: Mutex::new(None),
            marks: client.supports_marks()
                && std::env::var(ENV_MARKS).map_or(true, |v| v.trim() != "0"),
            mark_key: Mutex::new(None),
            last_mark: std::sync::atomic::AtomicU64::new(0),
            marks_in_window: std::sync::atomic::AtomicU64::new(0),
            settled: std::sync::atomic::AtomicBool::new(false),
            settled_before: std::sync::atomic::AtomicBool::new(false),
            next_pos: std::sync::atomic::AtomicU64::new(1),
            last_reader: std::sync::atomic::AtomicU64::new(0),
            known: Mutex::new(Known::default()),
            client: Mutex::new(Some(client)),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                busy: false,
                failed: None,
            }),
            cv: Condvar::new(),
            worker: Mutex::new(None),
        });
        pin_library();
        let weak = Arc::downgrade(&conn);
        let handle = std::thread::Builder::new()
            .name(format!("trpc-{endpoint}"))
            .spawn(move || worker(weak))
            .map_err(|e| PluginError::Rpc {
                endpoint: endpoint.to_owned(),
                source: transfer_rpc::RpcError::io("spawn worker", e),
            })?;
        *conn.worker.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(conn)
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Where other servers reach this one (the COPY_TENSOR_TO destination).
    pub fn peer_endpoint(&self) -> &str {
        &self.peer_endpoint
    }

    /// The answer deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Marks the stream settled: the command just run was answered, and a
    /// server answers in order, so everything sent before it has run.
    pub fn settled_by(&self) {
        self.settled
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Inside a command run on the connection: true when everything sent
    /// before it is known to have run on the server.
    pub fn was_settled(&self) -> bool {
        self.settled_before
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Can this server send a direct copy to `dst`? Both must serve the
    /// extension (a stock server does not) and `TRANSFER_RPC_P2P` not be off.
    pub fn can_copy_to(&self, dst: &Conn) -> bool {
        self.p2p && self.copy_to && dst.peer_barrier
    }

    /// The server's engine (ENGINE_INFO, asked once and kept), or `None`
    /// when it has none: it does not serve ENGINE_* or answered without an
    /// address.
    pub fn engine_info(&self) -> Result<Option<transfer_rpc::client::EngineInfo>> {
        if !self.engine || !self.p2p {
            return Ok(None);
        }
        let mut g = self.engine_info.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(self.call("ENGINE_INFO", |c| c.engine_info())?);
        }
        Ok(g.clone().filter(|i| i.has_engine()))
    }

    /// True when this server serves the marks and `TRANSFER_RPC_P2P` is
    /// not off: a direct copy into it can be ordered before its next
    /// command by the server itself (MARK_WAIT).
    pub fn serves_marks(&self) -> bool {
        self.p2p && self.marks
    }

    /// This connection's mark key (MARK_OPEN once, after the queue
    /// drained); `None` when the server refused one (logged).
    pub fn mark_key(&self) -> Result<Option<u64>> {
        if !self.serves_marks() {
            return Ok(None);
        }
        let mut g = self.mark_key.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            let key = self.call("MARK_OPEN", |c| c.mark_open())?;
            if key.is_none() {
                host::log(
                    crate::abi::LOG_WARN,
                    &format!(
                        "{}: MARK_OPEN refused; copies into it are ordered through this process",
                        self.endpoint
                    ),
                );
            }
            *g = Some(key);
        }
        Ok(g.flatten())
    }

    /// The next mark of this connection, or `None` when
    /// [`MARKS_IN_WINDOW`] marks were handed out since the last job that
    /// may read its buffers was queued. Why that bound suffices: the
    /// server keeps `transfer_rpc::server::marks::SLOTS` (64) marks per
    /// key, a mark in slot `seq % 64`, and a copy queued after such a job
    /// lands only once the server ran it (the write-after-read rule of a
    /// boundary), so after every MARK_WAIT queued before it: the marks in
    /// flight are those of the current window, fewer than 64.
    pub fn take_mark(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let q = self.lock_queue();
        if self.marks_in_window.load(Ordering::Acquire) >= MARKS_IN_WINDOW {
            return None;
        }
        self.marks_in_window.fetch_add(1, Ordering::AcqRel);
        let seq = self.last_mark.fetch_add(1, Ordering::AcqRel) + 1;
        drop(q);
        Some(seq)
    }

    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed_error(&self, reason: &str) -> PluginError {
        PluginError::Failed {
            endpoint: self.endpoint.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Marks the connection failed (first reason wins, logged once) and
    /// closes it.
    pub fn fail(&self, reason: &str) {
        {
            let mut q = self.lock_queue();
            if q.failed.is_some() {
                return;
            }
            q.failed = Some(reason.to_owned());
            self.cv.notify_all();
        }
        host::log(
            LOG_ERROR,
            &format!(
                "{}: {reason}; the server is unusable for the rest of this run",
                self.endpoint
            ),
        );
        if let Ok(mut c) = self.client.try_lock() {
            *c = None;
        }
    }

    /// `Some(reason)` once the connection failed.
    pub fn failure(&self) -> Option<String> {
        self.lock_queue().failed.clone()
    }

    /// Runs `f` with the queue lock held if the connection has not failed
    /// (what an asynchronous read does before writing host memory: a
    /// synchronize that timed out marks the connection failed under the same
    /// lock, so no late write reaches memory the host took back).
    pub fn if_alive<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        let q = self.lock_queue();
        if q.failed.is_some() {
            return None;
        }
        let r = f();
        drop(q);
        Some(r)
    }

    /// Queues the job `make` builds from its position; `reads`: the job
    /// may read the server's buffers (see `last_reader`).
    fn push_with(&self, make: impl FnOnce(u64) -> Job, reads: bool) -> Result<u64> {
        use std::sync::atomic::Ordering;
        let deadline = Instant::now() + self.timeout;
        let mut q = self.lock_queue();
        let mut make = Some(make);
        loop {
            if let Some(r) = &q.failed {
                return Err(self.failed_error(r));
            }
            if q.jobs.len() < QUEUE_CAP {
                // Under the queue lock: positions follow queue order.
                let pos = self.next_pos.fetch_add(1, Ordering::AcqRel);
                if reads {
                    self.last_reader.store(pos, Ordering::Release);
                    self.marks_in_window.store(0, Ordering::Release);
                }
                if let Some(make) = make.take() {
                    q.jobs.push_back(make(pos));
                }
                self.cv.notify_all();
                return Ok(pos);
            }
            let now = Instant::now();
            if now >= deadline {
                drop(q);
                self.fail("command queue stayed full past the deadline");
                return Err(PluginError::Timeout {
                    call: "queue",
                    endpoint: self.endpoint.clone(),
                    secs: self.timeout.as_secs(),
                });
            }
            q = match self.cv.wait_timeout(q, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    fn push(&self, job: Job) -> Result<()> {
        self.push_with(|_| job, false).map(drop)
    }

    /// Queues `work` after everything queued before (a command that may
    /// read the server's buffers).
    pub fn post(&self, work: Work) -> Result<()> {
        self.post_at(work).map(drop)
    }

    /// [`Conn::post`], answering the job's position on the stream.
    pub fn post_at(&self, work: Work) -> Result<u64> {
        self.push_with(|pos| Job::Run(pos, work), true)
    }

    /// Queues `work`, a command that reads none of the server's buffers
    /// (a small input SET_TENSOR, PEER_BARRIER, ENGINE_WAIT): another
    /// server's write into this one need not wait for it. Its position.
    pub fn post_no_read(&self, work: Work) -> Result<u64> {
        self.push_with(|pos| Job::Run(pos, work), false)
    }

    /// Queues a marker; the returned flag is set when the worker reaches it.
    pub fn record(&self) -> Result<Arc<Done>> {
        let d = Arc::new(Done::default());
        self.push(Job::Signal(d.clone()))?;
        Ok(d)
    }

    /// Makes the stream wait for `done` (set by another connection's worker).
    pub fn wait_for(&self, done: Arc<Done>) -> Result<()> {
        self.push(Job::Wait(done))
    }

    /// True when every job queued so far that may read this server's
    /// buffers is known to have been executed by it: a write into them by
    /// another server (a stage boundary) needs no barrier first. Known
    /// from answers on this connection and, through [`Conn::note_wait`],
    /// from answers on the connections that waited for its writes.
    pub fn readers_done(&self) -> bool {
        let last = self.last_reader.load(std::sync::atomic::Ordering::Acquire);
        self.known.lock().unwrap_or_else(|p| p.into_inner()).done >= last
    }

    /// Records that the job at `pos` on this stream (an ENGINE_WAIT) ends
    /// only after the job at `src_pos` on `src` (its ENGINE_WRITE) was
    /// executed there: once this server is known past `pos`, `src` is
    /// known past `src_pos`. At most [`KNOWN_WAITS`] are kept (the oldest
    /// is forgotten: knowledge lost, never wrong).
    pub fn note_wait(&self, pos: u64, src: &Arc<Conn>, src_pos: u64) {
        let mut k = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if k.waits.len() >= KNOWN_WAITS {
            k.waits.pop_front();
        }
        k.waits.push_back((pos, Arc::downgrade(src), src_pos));
    }

    /// The server executed every job up to `pos`; so did the sources of
    /// the waits among them, up to their writes (and so on).
    fn advance(&self, pos: u64) {
        let mut next = self.advance_one(pos);
        // Each step only raises a `done` and removes the waits it passes:
        // the walk ends (bounded by the waits recorded).
        while let Some((conn, p)) = next.pop() {
            if let Some(c) = conn.upgrade() {
                next.extend(c.advance_one(p));
            }
        }
    }

    fn advance_one(&self, pos: u64) -> Vec<(std::sync::Weak<Conn>, u64)> {
        let mut k = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if pos <= k.done {
            return Vec::new();
        }
        k.done = pos;
        let mut passed = Vec::new();
        k.waits.retain(|(at, src, src_pos)| {
            if *at <= pos {
                passed.push((src.clone(), *src_pos));
                false
            } else {
                true
            }
        });
        passed
    }

    /// Waits until every queued job ran; a timeout fails the connection.
    pub fn synchronize(&self, call: &'static str) -> Result<()> {
        // Nothing queued and nothing running: drained already, no marker
        // and no hand-off to the worker and back (llama.cpp synchronizes
        // every backend twice per decode step, mostly drained ones).
        // Under the queue lock, which the worker releases only after it
        // finished a job: its effects are visible here.
        {
            let q = self.lock_queue();
            if let Some(r) = &q.failed {
                return Err(self.failed_error(r));
            }
            if q.jobs.is_empty() && !q.busy {
                return Ok(());
            }
        }
        let d = self.record()?;
        self.await_done(&d, call)
    }

    /// Waits for a marker; a timeout fails the connection.
    pub fn await_done(&self, d: &Done, call: &'static str) -> Result<()> {
        if d.wait(self.timeout) {
            return match self.failure() {
                Some(r) => Err(self.failed_error(&r)),
                None => Ok(()),
            };
        }
        self.fail(&format!("{call} timed out"));
        Err(PluginError::Timeout {
            call,
            endpoint: self.endpoint.clone(),
            secs: self.timeout.as_secs(),
        })
    }

    /// A synchronous command: after the queue drained, on this thread.
    pub fn call<R>(
        &self,
        call: &'static str,
        f: impl FnOnce(&mut Client) -> transfer_rpc::Result<R>,
    ) -> Result<R> {
        self.synchronize(call)?;
        self.run_now(f)
    }

    /// Runs `f` on the connection now (the caller ordered it).
    pub fn run_now<R>(&self, f: impl FnOnce(&mut Client) -> transfer_rpc::Result<R>) -> Result<R> {
        self.run_at(0, f)
    }

    /// [`Conn::run_now`] for the queued job at `pos` (0: not a queued job):
    /// when it marks the stream settled and its posted answers check out,
    /// the server is known to have executed every job up to `pos`.
    fn run_at<R>(
        &self,
        pos: u64,
        f: impl FnOnce(&mut Client) -> transfer_rpc::Result<R>,
    ) -> Result<R> {
        let mut guard = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = self.failure() {
            // `fail` could not close a connection another thread was using.
            *guard = None;
            return Err(self.failed_error(&r));
        }
        let Some(client) = guard.as_mut() else {
            let r = self.failure().unwrap_or_else(|| "connection closed".into());
            return Err(self.failed_error(&r));
        };
        // Under the client lock: commands on a connection run one at a time.
        let before = self
            .settled
            .swap(false, std::sync::atomic::Ordering::AcqRel);
        self.settled_before
            .store(before, std::sync::atomic::Ordering::Release);
        let flush = |client: &mut Client| {
            // Requests the client kept (ClientConfig::coalesce) go out
            // unless the next queued job is a command too, which will
            // flush them with its own: a burst posted back to back (a
            // step's inputs and graph) is one write, a lone command is
            // written at once. Measured (strace, llama-bench tg, 4
            // servers): 10.9 send calls per decode step instead of 47.0;
            // tg t/s unchanged within noise. A host that queues a step's
            // inputs slower than the worker sends them (the first stage)
            // still sends them one by one: the worker does not wait for
            // more. Under the client lock, then the queue's (the order
            // `run_at` already takes them in).
            let next_is_command =
                pos > 0 && matches!(self.lock_queue().jobs.front(), Some(Job::Run(..)));
            if next_is_command {
                Ok(())
            } else {
                client.flush()
            }
        };
        match f(client)
            .and_then(|v| check_posted(client).map(|()| v))
            .and_then(|v| flush(client).map(|()| v))
        {
            Ok(v) => {
                if pos > 0 && self.settled.load(std::sync::atomic::Ordering::Acquire) {
                    self.advance(pos);
                }
                Ok(v)
            }
            Err(source) => {
                *guard = None;
                drop(guard);
                self.fail(&source.to_string());
                Err(PluginError::Rpc {
                    endpoint: self.endpoint.clone(),
                    source,
                })
            }
        }
    }
}

/// Marks a connection hands out between two jobs that may read its
/// buffers: below the server's 64 slots per key.
pub const MARKS_IN_WINDOW: u64 = 48;

/// Waits a connection remembers for [`Conn::note_wait`] (a decode step
/// adds one per boundary into it; answers clear them every step).
const KNOWN_WAITS: usize = 256;

/// What a connection knows its server executed.
#[derive(Default)]
struct Known {
    /// Every job up to this position was executed by the server.
    done: u64,
    /// ENGINE_WAITs not yet known executed: (position here, the writing
    /// connection, its ENGINE_WRITE's position there).
    waits: VecDeque<(u64, std::sync::Weak<Conn>, u64)>,
}

/// Posted commands (ENGINE_WRITE / ENGINE_WAIT of the engine path) a
/// connection may have unanswered before their answers are read.
pub const POSTED_CAP: usize = 64;

/// Checks the answers of posted commands read so far (an ordinary call
/// reads those sent before it); past [`POSTED_CAP`] unread ones, reads them
/// (the server has answered or is about to: it serves in order). A 0 fails
/// the connection: a write that did not land, or a wait that timed out,
/// means a stage computed on stale input.
pub fn check_posted(c: &mut Client) -> transfer_rpc::Result<()> {
    let answers = if c.posted_len() > POSTED_CAP {
        c.collect_posted()?
    } else {
        c.take_answers()
    };
    if answers.iter().all(|&ok| ok) {
        Ok(())
    } else {
        Err(transfer_rpc::RpcError::RemoteFailure {
            call: "ENGINE_WRITE/ENGINE_WAIT/COPY_TENSOR_TO_MARK/MARK_WAIT (posted)",
        })
    }
}

/// Marks this library RTLD_NODELETE before its first thread starts: a host
/// that unloads backends (ggml_backend_unload, the registry's destructor at
/// exit) must not unmap code our worker threads still run.
fn pin_library() {
    static PINNED: std::sync::Once = std::sync::Once::new();
    PINNED.call_once(|| {
        let Some(path) = crate::backend::self_path() else {
            return;
        };
        let Ok(c) = std::ffi::CString::new(path) else {
            return;
        };
        // SAFETY: RTLD_NOLOAD only takes a reference to this already loaded
        // library, adding NODELETE; the handle is deliberately kept.
        let _ = unsafe {
            libc::dlopen(
                c.as_ptr(),
                libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
            )
        };
    });
}

fn worker(conn: std::sync::Weak<Conn>) {
    loop {
        let Some(c) = conn.upgrade() else { return };
        let job = {
            let mut q = c.lock_queue();
            q.busy = false;
            match q.jobs.pop_front() {
                Some(j) => {
                    q.busy = true;
                    c.cv.notify_all();
                    Some(j)
                }
                None => {
                    let _ = c.cv.wait_timeout(q, IDLE_TICK);
                    None
                }
            }
        };
        let Some(job) = job else { continue };
        match job {
            Job::Signal(d) => d.set(),
            Job::Wait(d) => {
                if !d.wait(c.timeout) {
                    c.fail("waiting for another server's event timed out");
                }
            }
            Job::Run(pos, work) => {
                if c.failure().is_none() {
                    let cc = c.clone();
                    let _ = c.run_at(pos, move |client| work(client, &cc));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection with no server and no worker: jobs only queue.
    fn detached(endpoint: &str) -> Arc<Conn> {
        Arc::new(Conn {
            endpoint: endpoint.to_owned(),
            peer_endpoint: endpoint.to_owned(),
            timeout: Duration::from_secs(1),
            copy_to: true,
            peer_barrier: true,
            p2p: true,
            engine: false,
            engine_info: Mutex::new(None),
            marks: true,
            mark_key: Mutex::new(Some(Some(7))),
            last_mark: std::sync::atomic::AtomicU64::new(0),
            marks_in_window: std::sync::atomic::AtomicU64::new(0),
            settled: std::sync::atomic::AtomicBool::new(false),
            settled_before: std::sync::atomic::AtomicBool::new(false),
            next_pos: std::sync::atomic::AtomicU64::new(1),
            last_reader: std::sync::atomic::AtomicU64::new(0),
            known: Mutex::new(Known::default()),
            client: Mutex::new(None),
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                busy: false,
                failed: None,
            }),
            cv: Condvar::new(),
            worker: Mutex::new(None),
        })
    }

    fn job() -> Work {
        Box::new(|_, _| Ok(()))
    }

    /// A decode step over three stages: an answer on the last one proves,
    /// through the ENGINE_WAITs before it, that the earlier stages ran
    /// their graphs and writes; inputs set after do not undo that; a new
    /// graph does.
    #[test]
    fn answers_prove_earlier_stages_ran() {
        let (a, b, c) = (detached("a"), detached("b"), detached("c"));
        // Nothing queued that reads: a write may land at once.
        assert!(b.readers_done());
        let _ = a.post_at(job()).unwrap(); // a's graph
        let wa = a.post_at(job()).unwrap(); // a's ENGINE_WRITE to b
        let wb_wait = b.post_no_read(job()).unwrap(); // b's ENGINE_WAIT
        b.note_wait(wb_wait, &a, wa);
        let _ = b.post_at(job()).unwrap(); // b's graph
        let wb = b.post_at(job()).unwrap(); // b's ENGINE_WRITE to c
        let wc_wait = c.post_no_read(job()).unwrap();
        c.note_wait(wc_wait, &b, wb);
        let _ = c.post_at(job()).unwrap(); // c's graph
        let logits = c.post_at(job()).unwrap(); // c's GET_TENSOR
        assert!(!a.readers_done() && !b.readers_done() && !c.readers_done());
        // An answer before the wait proves nothing about the sources.
        c.advance(wc_wait - 1);
        assert!(!a.readers_done() && !b.readers_done());
        c.advance(logits);
        assert!(a.readers_done() && b.readers_done() && c.readers_done());
        // Small inputs of the next step read nothing.
        let _ = b.post_no_read(job()).unwrap();
        assert!(b.readers_done());
        // A new graph does.
        let _ = b.post_at(job()).unwrap();
        assert!(!b.readers_done());
        assert!(a.readers_done());
    }

    /// A wait whose source connection is gone is skipped, and the bound
    /// on remembered waits forgets the oldest (knowledge lost, never wrong).
    #[test]
    fn forgotten_waits_prove_nothing() {
        let (a, b) = (detached("a"), detached("b"));
        let wa = a.post_at(job()).unwrap();
        let first = b.post_no_read(job()).unwrap();
        b.note_wait(first, &a, wa);
        for _ in 0..KNOWN_WAITS {
            let p = b.post_no_read(job()).unwrap();
            let gone = detached("gone");
            b.note_wait(p, &gone, 1);
        }
        let last = b.post_at(job()).unwrap();
        b.advance(last);
        assert!(b.readers_done());
        assert!(!a.readers_done(), "the forgotten wait proved a's write");
    }

    #[test]
    fn peer_map() {
        let m = Some("127.0.0.1:51001=10.0.0.2:50052, 127.0.0.1:51002 = 10.0.0.3:50052");
        assert_eq!(peer_endpoint_of("127.0.0.1:51002", m), "10.0.0.3:50052");
        assert_eq!(peer_endpoint_of("127.0.0.1:51001", m), "10.0.0.2:50052");
        assert_eq!(peer_endpoint_of("127.0.0.1:51003", m), "127.0.0.1:51003");
        assert_eq!(peer_endpoint_of("a:1", None), "a:1");
        assert_eq!(peer_endpoint_of("a:1", Some("garbage")), "a:1");
    }
}
