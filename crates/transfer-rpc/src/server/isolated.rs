//! Graph compute in a worker process, so that a crash inside a compute
//! kernel cannot take the server (and every other session) down.
//!
//! The validator encodes every precondition of every ggml-cpu kernel it
//! lets through; this is the second wall for the ones it misses. Each
//! device gets one worker process (`transfer-rpc-compute`, this crate's
//! binary) started on first use. Buffers live in memfds
//! ([`super::host_memory`]): the worker maps the ones a graph touches
//! (handed over once, SCM_RIGHTS) and keeps them mapped until they are
//! freed, so no bytes are copied for a compute. The server validates the
//! graph, write-locks its buffers, sends the graph, and waits for the
//! answer; the worker checks every tensor of the validated graph against
//! its own mappings (not the whole graph again: [`super::worker_graph`])
//! and runs it on ggml-cpu. The worker keeps the graphs it checked (bounded, by the
//! key of the session's stored graph): GRAPH_RECOMPUTE sends only the key,
//! and the worker reruns its validated graph and its ggml tensors, with
//! the index checks done again (upstream's RECOMPUTE reuses its graph the
//! same way; each RECOMPUTE re-encoded, re-sent and re-validated the graph
//! before: ~1 ms for a 300-node graph, see `tests/graph_overhead.rs`).
//! If the worker dies (abort, fault) or overruns the compute
//! timeout, it is killed and reaped, the session that sent the graph gets
//! an error (its connection closes, as for any refused graph), and the
//! next graph starts a fresh worker. Computes on one device are serialised
//! anyway (the device lock), so a crash only ever loses the graph that
//! caused it.
//!
//! What it does not contain: a kernel that writes out of bounds without
//! faulting can still change bytes of buffers mapped in the worker (each
//! buffer sits between guard pages, so a linear overrun faults).

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::compute::{ComputeBackend, PREPARED_GRAPHS};
use super::registry::{Buffer, BufferRegistry};
use super::worker_graph;
use super::worker_ipc::{
    Pace, RESULT_NOT_HELD, RESULT_OK, Receiver, TAG_COMPUTE, TAG_MAP, TAG_RESULT, TAG_RUN,
    TAG_UNMAP, TIMED_WAIT_MAX, core_spare, poll_readable, poll_readable_around, send,
};
use crate::error::{Result, RpcError};
use crate::validate::{GraphLimits, ValidatedGraph};

const CALL: &str = "GRAPH_COMPUTE (worker)";

fn fail<T>(reason: impl Into<String>) -> Result<T> {
    Err(RpcError::Compute {
        call: CALL,
        reason: reason.into(),
    })
}

/// How workers are started.
#[derive(Debug, Clone)]
pub struct IsolatedConfig {
    /// The `transfer-rpc-compute` executable.
    pub program: PathBuf,
    /// Devices the server advertises.
    pub devices: u32,
    /// Compute threads per worker.
    pub threads: usize,
    /// Longest a graph may compute before its worker is killed.
    pub timeout: Duration,
    /// Extra environment for the workers.
    pub env: Vec<(String, String)>,
    /// The server's graph limits (the workers validate with the same).
    pub limits: GraphLimits,
}

/// libgomp's wait for the worker's compute threads, unless the operator
/// set one: spin about 10,000 rounds (well under a millisecond) before
/// sleeping, instead of libgomp's 300,000 (milliseconds). The barriers
/// inside a graph are microseconds apart and stay spinning; between
/// graphs, threads that spin for milliseconds take the cores the server,
/// the client and the next pipeline stage need. Measured on this 2-core
/// machine under load (`compute_isolation`, set+compute+get of a small
/// matmul, 2 threads): 57 ms per graph with libgomp's default, 0.9 ms
/// with 10,000, 0.25 ms passive.
fn omp_wait_default() -> Vec<(&'static str, &'static str)> {
    let set = |k: &str| std::env::var_os(k).is_some();
    if set("OMP_WAIT_POLICY") || set("GOMP_SPINCOUNT") {
        Vec::new()
    } else {
        vec![("GOMP_SPINCOUNT", "10000")]
    }
}

struct Worker {
    child: Child,
    sock: UnixStream,
    rx: Receiver,
    /// Buffers this worker has mapped, by handle.
    mapped: HashMap<u64, Weak<Buffer>>,
    /// Keys of the graphs this worker may still keep, least recently run
    /// first: those it ran, mirrored with its own cache's entry bound
    /// ([`PREPARED_GRAPHS`], least recently used out). A key not here was
    /// never kept (a fresh GRAPH_COMPUTE's key) or is gone, so its graph
    /// goes with COMPUTE at once instead of a RUN the worker can only
    /// answer with NOT_HELD: one round trip (two process wake-ups) less per
    /// GRAPH_COMPUTE. A key here the worker dropped anyway (its tensor
    /// bound) still gets NOT_HELD, then COMPUTE.
    kept: VecDeque<u64>,
    /// How long requests took lately, answer included: the timed wait
    /// aims at [`Pace::expected`]; without a spare core the next request
    /// polls for up to twice the last one ([`ANSWER_POLL_MAX`]).
    answers: Pace,
    /// The worker's compute threads leave a core spare, so a session may
    /// time its wait for an answer ([`TIMED_WAIT_MAX`]).
    spare_core: bool,
}

/// Longest a request polls for the worker's answer before it blocks.
///
/// Why poll at all: a blocked session thread is woken when the answer
/// comes, and each wake-up costs tens of microseconds here (2-core VM: a
/// one-ADD graph through the worker +45..+70 us over ggml's own server,
/// in-process -3..-11 us; `tests/graph_overhead.rs`). A decode step's graph
/// on a small model is that short, so the hop was a visible share of
/// llama-bench tg. Graphs whose last run took longer than this never poll
/// (their compute dwarfs the wake-up); the poll yields the core between
/// looks, so compute threads on the same core go first.
const ANSWER_POLL_MAX: Duration = Duration::from_micros(200);

impl Worker {
    fn spawn(cfg: &IsolatedConfig, device: usize) -> Result<Worker> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| RpcError::io("compute worker socketpair", e))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
        let mut cmd = Command::new(&cfg.program);
        cmd.args([
            "--devices",
            &cfg.devices.to_string(),
            "--threads",
            &cfg.threads.to_string(),
            "--device-index",
            &device.to_string(),
            "--max-nodes",
            &cfg.limits.max_nodes.to_string(),
            "--max-tensors",
            &cfg.limits.max_tensors.to_string(),
            "--max-index-elements",
            &cfg.limits.max_index_elements.to_string(),
        ])
        .envs(cfg.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .envs(omp_wait_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        // SAFETY: runs in the child between fork and exec and calls only
        // async-signal-safe functions (dup2, fcntl).
        unsafe {
            cmd.pre_exec(move || {
                // The worker reads its socket as fd 3, without CLOEXEC.
                let rc = if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, 3)
                };
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| RpcError::io("start the compute worker (transfer-rpc-compute)", e))?;
        drop(theirs);
        ours.set_read_timeout(Some(cfg.timeout))
            .and_then(|()| ours.set_write_timeout(Some(cfg.timeout)))
            .map_err(|e| RpcError::io("compute worker socket", e))?;
        Ok(Worker {
            child,
            sock: ours,
            rx: Receiver::default(),
            mapped: HashMap::new(),
            kept: VecDeque::new(),
            answers: Pace::default(),
            spare_core: core_spare(cfg.threads),
        })
    }

    /// Unmaps buffers that are gone (or were replaced under their handle).
    fn prune(&mut self, registry: Option<&BufferRegistry>) -> std::io::Result<()> {
        let dead: Vec<u64> =
            self.mapped
                .iter()
                .filter(|(h, w)| match w.upgrade() {
                    None => true,
                    Some(b) => registry
                        .is_some_and(|r| !r.get(**h).is_some_and(|live| Arc::ptr_eq(&live, &b))),
                })
                .map(|(h, _)| *h)
                .collect();
        for h in dead {
            send(self.sock.as_fd(), TAG_UNMAP, &h.to_le_bytes(), None)?;
            self.mapped.remove(&h);
        }
        Ok(())
    }

    fn map(&mut self, b: &Arc<Buffer>) -> std::io::Result<()> {
        if self
            .mapped
            .get(&b.handle)
            .and_then(Weak::upgrade)
            .is_some_and(|m| Arc::ptr_eq(&m, b))
        {
            return Ok(());
        }
        let fd = b
            .share_fd()
            .ok_or_else(|| std::io::Error::other("cannot share the buffer's memfd"))?;
        let mut body = Vec::with_capacity(24);
        body.extend_from_slice(&b.handle.to_le_bytes());
        body.extend_from_slice(&b.base.to_le_bytes());
        body.extend_from_slice(&b.size.to_le_bytes());
        send(self.sock.as_fd(), TAG_MAP, &body, Some(fd.as_fd()))?;
        self.mapped.insert(b.handle, Arc::downgrade(b));
        Ok(())
    }

    /// Sends one request and reads its RESULT: `Ok(None)` when the worker
    /// no longer keeps the graph a RUN named.
    fn request(
        &mut self,
        tag: u8,
        body: &[u8],
    ) -> std::io::Result<Option<std::result::Result<(), String>>> {
        let started = Instant::now();
        send(self.sock.as_fd(), tag, body, None)?;
        let waiting = !self.rx.has_read_ahead();
        let due = self.answers.expected().unwrap_or(Duration::MAX);
        let last = self.answers.last().unwrap_or(Duration::MAX);
        if waiting && self.spare_core && due < TIMED_WAIT_MAX {
            poll_readable_around(self.sock.as_fd(), due);
        } else if waiting && last < ANSWER_POLL_MAX {
            poll_readable(self.sock.as_fd(), (last * 2).min(ANSWER_POLL_MAX));
        }
        let (tag, body) = self.rx.recv(self.sock.as_fd())?;
        self.answers.observe(started.elapsed());
        if tag != TAG_RESULT || body.is_empty() {
            return Err(std::io::Error::other("unexpected answer from the worker"));
        }
        Ok(match body.first() {
            Some(&RESULT_OK) => Some(Ok(())),
            Some(&RESULT_NOT_HELD) => None,
            _ => Some(Err(String::from_utf8_lossy(
                body.get(1..).unwrap_or_default(),
            )
            .into_owned())),
        })
    }

    /// Runs `graph`: by key alone when the worker still keeps it (no
    /// encoding, no second validation), else the whole graph.
    fn compute(
        &mut self,
        graph: &ValidatedGraph,
        key: u64,
    ) -> std::io::Result<std::result::Result<(), String>> {
        if key == 0 {
            return self.send_graph(graph, key);
        }
        if let Some(i) = self.kept.iter().position(|&k| k == key) {
            self.kept.remove(i);
            if let Some(done) = self.request(TAG_RUN, &key.to_le_bytes())? {
                if done.is_ok() {
                    self.kept.push_back(key);
                }
                return Ok(done);
            }
        }
        let done = self.send_graph(graph, key)?;
        if done.is_ok() {
            while self.kept.len() >= PREPARED_GRAPHS {
                self.kept.pop_front();
            }
            self.kept.push_back(key);
        }
        Ok(done)
    }

    /// COMPUTE: the whole graph as validated ([`worker_graph`]: the worker
    /// checks its tensors against its mappings, not the graph again), kept
    /// by the worker.
    fn send_graph(
        &mut self,
        graph: &ValidatedGraph,
        key: u64,
    ) -> std::io::Result<std::result::Result<(), String>> {
        let mut body = key.to_le_bytes().to_vec();
        worker_graph::encode(graph, &mut body);
        self.request(TAG_COMPUTE, &body)?
            .ok_or_else(|| std::io::Error::other("the worker did not run a COMPUTE"))
    }

    /// Kills and reaps the worker; describes how it ended.
    fn end(mut self) -> String {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => Some(s),
            _ => {
                let _ = self.child.kill();
                self.child.wait().ok()
            }
        };
        match status {
            Some(s) => match (s.code(), s.signal()) {
                (_, Some(sig)) => format!("the compute worker died of signal {sig}"),
                (Some(c), _) => format!("the compute worker exited with status {c}"),
                _ => "the compute worker ended".into(),
            },
            None => "the compute worker could not be reaped".into(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A [`ComputeBackend`] that runs graphs in worker processes.
pub struct IsolatedBackend {
    config: IsolatedConfig,
    devices: Vec<Mutex<Option<Worker>>>,
    restarts: AtomicU64,
}

impl std::fmt::Debug for IsolatedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IsolatedBackend")
            .field("program", &self.config.program)
            .field("restarts", &self.restarts())
            .finish()
    }
}

impl IsolatedBackend {
    /// The worker in `slot` failed: kill and reap it, count it, and refuse
    /// the graph that was running.
    fn lost(&self, slot: &mut Option<Worker>, io: &str) -> Result<()> {
        let ended = slot.take().map(Worker::end).unwrap_or_default();
        self.restarts.fetch_add(1, Ordering::Relaxed);
        fail(format!("{ended} ({io}); the next graph starts a new one"))
    }

    /// Workers started from `config` (lazily, one per device).
    pub fn new(config: IsolatedConfig) -> Self {
        let n = config.devices.max(1) as usize;
        IsolatedBackend {
            config,
            devices: (0..n).map(|_| Mutex::new(None)).collect(),
            restarts: AtomicU64::new(0),
        }
    }

    /// Workers lost (crashed, timed out, or unreachable) so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Process ids of the live workers.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.devices
            .iter()
            .filter_map(|d| {
                d.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map(|w| w.child.id())
            })
            .collect()
    }
}

impl ComputeBackend for IsolatedBackend {
    fn name(&self) -> &str {
        "ggml-cpu in a worker process"
    }

    fn compute(&self, graph: &ValidatedGraph, registry: &BufferRegistry) -> Result<()> {
        self.compute_keyed(graph, registry, 0)
    }

    fn compute_keyed(
        &self,
        graph: &ValidatedGraph,
        registry: &BufferRegistry,
        key: u64,
    ) -> Result<()> {
        let mut handles: Vec<u64> = graph
            .checked
            .iter()
            .filter_map(|c| c.placement.map(|(r, _)| r.handle))
            .collect();
        handles.sort_unstable();
        handles.dedup();
        let buffers = handles
            .iter()
            .map(|&h| {
                registry
                    .get(h)
                    .ok_or_else(|| RpcError::refused(CALL, format!("unknown handle {h:#x}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let slot = self
            .devices
            .get(graph.device as usize)
            .ok_or_else(|| RpcError::refused(CALL, "no such device"))?;
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(Worker::spawn(&self.config, graph.device as usize)?);
        }
        let Some(worker) = slot.as_mut() else {
            return fail("no worker");
        };
        if let Err(io) = worker
            .prune(Some(registry))
            .and_then(|()| buffers.iter().try_for_each(|b| worker.map(b)))
        {
            return self.lost(&mut slot, &io.to_string());
        }
        // The buffers stay write-locked while the worker computes, as for
        // in-process compute. A buffer freed since it was looked up (or
        // replaced under its handle) is this request's error, not the
        // worker's: the worker has mapped what was looked up.
        let ran = registry.with_locked(CALL, &handles, |_| {
            let same = buffers.iter().all(|b| {
                registry
                    .get(b.handle)
                    .is_some_and(|live| Arc::ptr_eq(&live, b))
            });
            if !same {
                return Ok(Err(
                    "a buffer of the graph was freed while it was being sent".to_string(),
                ));
            }
            worker.compute(graph, key)
        });
        match ran {
            // Freed before its lock was taken.
            Err(refused) => Err(refused),
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(reason))) => fail(reason),
            Ok(Err(io)) => self.lost(&mut slot, &io.to_string()),
        }
    }

    fn buffers_freed(&self) {
        for d in &self.devices {
            // A busy worker prunes before its next graph anyway.
            if let Ok(mut slot) = d.try_lock() {
                let failed = slot.as_mut().is_some_and(|w| w.prune(None).is_err());
                if failed {
                    if let Some(w) = slot.take() {
                        let _ = w.end();
                    }
                }
            }
        }
    }
}
