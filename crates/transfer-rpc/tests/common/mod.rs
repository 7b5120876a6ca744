//! Shared helpers for the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

#[cfg(feature = "ggml")]
pub mod crash_harness;

use transfer_rpc::client::{Client, ClientConfig};
use transfer_rpc::protocol::RpcTensor;
use transfer_rpc::server::peer::PeerAllow;
use transfer_rpc::server::{RefusingBackend, Server, ServerConfig, ServerHandle};

/// Copies to servers on this machine's loopback.
pub fn loopback_peers() -> PeerAllow {
    PeerAllow::parse(&["loopback".to_string()]).unwrap()
}

/// Starts a server on an ephemeral 127.0.0.1 port.
/// Direct copies may go to loopback peers unless the test set a policy
/// (the server's own default is none; see `peer_policy` tests).
pub fn start(mut config: ServerConfig) -> ServerHandle {
    config.bind = "127.0.0.1:0".into();
    if config.peer_allow == PeerAllow::default() {
        config.peer_allow = loopback_peers();
    }
    Server::bind(config, Arc::new(RefusingBackend))
        .unwrap()
        .spawn()
        .unwrap()
}

/// A server with a 64 MiB quota.
pub fn start_default() -> ServerHandle {
    start(ServerConfig {
        memory_quota: 64 << 20,
        max_buffer_size: 64 << 20,
        ..ServerConfig::default()
    })
}

pub fn connect(h: &ServerHandle) -> Client {
    Client::connect(&h.endpoint(), ClientConfig::default()).unwrap()
}

pub fn connect_with(h: &ServerHandle, cfg: ClientConfig) -> Client {
    Client::connect(&h.endpoint(), cfg).unwrap()
}

/// A 1-D F32 tensor of `n` elements at `offset` in buffer `(handle, base)`.
pub fn f32_tensor(id: u64, handle: u64, base: u64, offset: u64, n: u32) -> RpcTensor {
    RpcTensor {
        id,
        ty: 0,
        buffer: handle,
        ne: [n, 1, 1, 1],
        nb: [4, 4 * n, 4 * n, 4 * n],
        data: base + offset,
        ..RpcTensor::default()
    }
}

/// Allocates a buffer and returns `(handle, base)`.
pub fn alloc(c: &mut Client, size: u64) -> (u64, u64) {
    let (h, s) = c.alloc_buffer(0, size).unwrap().unwrap();
    assert_eq!(s, size);
    let base = c.buffer_get_base(h).unwrap();
    (h, base)
}

pub fn f32_bytes(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// True when the server has closed this client's connection.
pub fn is_closed(c: &mut Client) -> bool {
    c.device_count().is_err()
}

/// A server computing on ggml's CPU backend (16 MiB quota, 2 threads).
#[cfg(feature = "ggml")]
pub fn start_ggml() -> ServerHandle {
    use transfer_rpc::server::GgmlCpuBackend;
    use transfer_rpc::validate::GraphLimits;
    Server::bind(
        ServerConfig {
            bind: "127.0.0.1:0".into(),
            memory_quota: 16 << 20,
            max_buffer_size: 16 << 20,
            peer_allow: loopback_peers(),
            ..ServerConfig::default()
        },
        Arc::new(GgmlCpuBackend::new(1, 2, GraphLimits::default())),
    )
    .unwrap()
    .spawn()
    .unwrap()
}

/// A 2-D F32 tensor `[ne0, ne1]` at `offset`.
pub fn mat(id: u64, b: u64, base: u64, offset: u64, ne0: u32, ne1: u32) -> RpcTensor {
    RpcTensor {
        id,
        ty: 0,
        buffer: b,
        ne: [ne0, ne1, 1, 1],
        nb: [4, 4 * ne0, 4 * ne0 * ne1, 4 * ne0 * ne1],
        data: base + offset,
        ..RpcTensor::default()
    }
}

/// Little-endian f32 values of `bytes`.
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A `transfer-rpc-server` process (this package's binary), killed on drop.
pub struct ServerProcess {
    pub child: std::process::Child,
    pub endpoint: String,
}

impl ServerProcess {
    /// Starts it on an ephemeral loopback port with `args` and waits for
    /// the address it prints.
    pub fn start(args: &[&str]) -> ServerProcess {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_transfer-rpc-server"))
            .args(["--port", "0", "--peer-allow", "loopback"])
            .args(args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = std::io::BufReader::new(stderr).lines();
        let mut endpoint = None;
        for line in lines.by_ref() {
            let line = line.unwrap();
            eprintln!("{line}");
            if let Some(rest) = line.split("listening on ").nth(1) {
                endpoint = rest.split(',').next().map(str::to_owned);
                break;
            }
        }
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        ServerProcess {
            child,
            endpoint: endpoint.expect("the server did not start"),
        }
    }

    /// Resident bytes of the process (Linux `/proc/PID/statm`).
    pub fn rss(&self) -> Option<u64> {
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.child.id())).ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A compute backend for tests of the server around compute (admission,
/// budgets, fairness) in builds without ggml: it computes ADD (op 2) of
/// contiguous F32 tensors of one shape in Rust, through the registry like
/// any backend, and refuses every other op.
pub struct AddBackend;

impl transfer_rpc::server::ComputeBackend for AddBackend {
    fn name(&self) -> &str {
        "test ADD"
    }

    fn compute(
        &self,
        graph: &transfer_rpc::validate::ValidatedGraph,
        memory: &transfer_rpc::server::BufferRegistry,
    ) -> transfer_rpc::Result<()> {
        use transfer_rpc::RpcError;
        const CALL: &str = "AddBackend";
        for &n in &graph.nodes {
            let t = &graph.tensors[n];
            let (Some(a), Some(b)) = (graph.srcs[n][0], graph.srcs[n][1]) else {
                return Err(RpcError::refused(CALL, "ADD needs two sources"));
            };
            if t.op != 2 || t.ty != 0 {
                return Err(RpcError::refused(CALL, "only F32 ADD"));
            }
            let len = graph.checked[n].nbytes;
            let read = |i: usize| -> transfer_rpc::Result<Vec<u8>> {
                let (r, at) = graph.checked[i].range(CALL, 0, len)?;
                memory.read_range(CALL, r.handle, at, len)
            };
            let (x, y) = (read(a)?, read(b)?);
            let sum: Vec<u8> = floats(&x)
                .iter()
                .zip(floats(&y))
                .flat_map(|(p, q)| (p + q).to_le_bytes())
                .collect();
            let (r, at) = graph.checked[n].range(CALL, 0, len)?;
            memory.write(CALL, r.handle, at, &sum)?;
        }
        Ok(())
    }
}

/// A server (ephemeral 127.0.0.1 port, loopback peers) computing with
/// [`AddBackend`].
pub fn start_adding(mut config: ServerConfig) -> ServerHandle {
    config.bind = "127.0.0.1:0".into();
    if config.peer_allow == PeerAllow::default() {
        config.peer_allow = loopback_peers();
    }
    Server::bind(config, Arc::new(AddBackend))
        .unwrap()
        .spawn()
        .unwrap()
}

/// `a + b -> sum`, `n` F32 each, at offsets 0, 4n, 8n of `(buf, base)`.
pub fn add_graph(buf: u64, base: u64, n: u32) -> transfer_rpc::protocol::GraphPayload {
    let a = f32_tensor(1, buf, base, 0, n);
    let b = f32_tensor(2, buf, base, 4 * u64::from(n), n);
    let mut sum = f32_tensor(3, buf, base, 8 * u64::from(n), n);
    sum.op = 2;
    sum.src[0] = 1;
    sum.src[1] = 2;
    transfer_rpc::protocol::GraphPayload {
        device: 0,
        nodes: vec![3],
        tensors: vec![a, b, sum],
    }
}

/// Starts ggml's own RPC server (`transfer_rpc::upstream::serve`, which
/// never returns) on a free 127.0.0.1 port, in a thread of its own.
#[cfg(feature = "upstream-rpc")]
pub fn start_upstream(threads: usize) -> String {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ep = format!("127.0.0.1:{port}");
    let serve = ep.clone();
    std::thread::spawn(move || transfer_rpc::upstream::serve(&serve, threads).unwrap());
    while std::net::TcpStream::connect(&ep).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    ep
}
