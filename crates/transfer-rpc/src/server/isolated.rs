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
//! answer; the worker validates again against its own view and runs it on
//! ggml-cpu. If the worker dies (abort, fault) or overruns the compute
//! timeout, it is killed and reaped, the session that sent the graph gets
//! an error (its connection closes, as for any refused graph), and the
//! next graph starts a fresh worker. Computes on one device are serialised
//! anyway (the device lock), so a crash only ever loses the graph that
//! caused it.
//!
//! What it does not contain: a kernel that writes out of bounds without
//! faulting can still change bytes of buffers mapped in the worker (each
//! buffer sits between guard pages, so a linear overrun faults).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::compute::ComputeBackend;
use super::registry::{Buffer, BufferRegistry};
use super::worker_ipc::{Receiver, TAG_COMPUTE, TAG_MAP, TAG_RESULT, TAG_UNMAP, send};
use crate::error::{Result, RpcError};
use crate::protocol::GraphPayload;
use crate::validate::ValidatedGraph;

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
}

struct Worker {
    child: Child,
    sock: UnixStream,
    rx: Receiver,
    /// Buffers this worker has mapped, by handle.
    mapped: HashMap<u64, Weak<Buffer>>,
}

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
        ])
        .envs(cfg.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
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

    fn compute(&mut self, payload: &[u8]) -> std::io::Result<std::result::Result<(), String>> {
        send(self.sock.as_fd(), TAG_COMPUTE, payload, None)?;
        let (tag, body) = self.rx.recv(self.sock.as_fd())?;
        if tag != TAG_RESULT || body.is_empty() {
            return Err(std::io::Error::other("unexpected answer from the worker"));
        }
        Ok(if body.first() == Some(&1) {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(body.get(1..).unwrap_or_default()).into_owned())
        })
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
        let payload = GraphPayload {
            device: graph.device,
            nodes: graph
                .nodes
                .iter()
                .filter_map(|&i| graph.tensors.get(i).map(|t| t.id))
                .collect(),
            tensors: graph.tensors.clone(),
        }
        .encode();
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
        let outcome = worker
            .prune(Some(registry))
            .and_then(|()| buffers.iter().try_for_each(|b| worker.map(b)))
            .map_err(|e| e.to_string())
            .and_then(|()| {
                // The buffers stay write-locked while the worker computes,
                // as for in-process compute.
                registry
                    .with_locked(CALL, &handles, |_| worker.compute(&payload))
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())
            });
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => fail(reason),
            Err(io) => {
                let ended = slot.take().map(Worker::end).unwrap_or_default();
                self.restarts.fetch_add(1, Ordering::Relaxed);
                fail(format!("{ended} ({io}); the next graph starts a new one"))
            }
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
