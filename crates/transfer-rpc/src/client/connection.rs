//! One client connection to a ggml-rpc server, with every command.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

use super::config::ClientConfig;
use super::stats::Stats;
use crate::error::{Result, RpcError};
use crate::protocol::frame::{REQUEST_HEADER_SIZE, decode_response_header};
use crate::protocol::hello::{
    FEATURE_COPY_TENSOR_TO, FEATURE_ENGINE, FEATURE_PEER_BARRIER, FEATURE_PEER_MARK, HelloRequest,
};
use crate::protocol::response::response_size;
use crate::protocol::tensor::MAX_SRC;
use crate::protocol::{
    Command, ExtInfo, GraphPayload, HelloResponse, Request, Response, RpcTensor,
};

/// A connected, HELLO-negotiated client.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    endpoint: String,
    config: ClientConfig,
    stats: Option<Stats>,
    server_version: HelloResponse,
    ext: Option<Option<ExtInfo>>,
    /// Commands sent whose one-byte answer has not been read yet, in order.
    posted: VecDeque<Command>,
    /// Answers of posted commands read early (before an ordinary call).
    answers: Vec<bool>,
    /// Request bytes not yet written ([`ClientConfig::coalesce`]): at most
    /// [`COALESCE_BOUND`] plus one frame's head, written by
    /// [`Client::flush`], before any answer is read, or at the bound.
    out: Vec<u8>,
}

/// Request bytes a coalescing client keeps before it writes them: a decode
/// step's posted burst on one connection (input SET_TENSORs of ~300 bytes,
/// a GRAPH_RECOMPUTE, marks) is a few KiB; tensor data past this goes out
/// directly, without a copy.
pub const COALESCE_BOUND: usize = 64 * 1024;

/// A TCP connection to `to` from local address `source` (any port), the
/// connect bounded by `timeout` (Linux applies SO_SNDTIMEO to connect).
pub fn connect_from(
    source: std::net::IpAddr,
    to: &std::net::SocketAddr,
    timeout: Option<std::time::Duration>,
) -> std::io::Result<TcpStream> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    fn sockaddr(a: &std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: all-zero bytes are a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            std::net::SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for
                // sockaddr_in; one value is written into it.
                unsafe { std::ptr::write((&raw mut ss).cast::<libc::sockaddr_in>(), sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            std::net::SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { std::ptr::write((&raw mut ss).cast::<libc::sockaddr_in6>(), sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (ss, len as libc::socklen_t)
    }
    let last = std::io::Error::last_os_error;
    let domain = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (local, local_len) = sockaddr(&std::net::SocketAddr::new(source, 0));
    // SAFETY: `local` is a valid socket address of `local_len` bytes.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const local).cast(), local_len) } != 0 {
        return Err(last());
    }
    if let Some(t) = timeout {
        let tv = libc::timeval {
            tv_sec: t.as_secs().try_into().unwrap_or(libc::time_t::MAX),
            tv_usec: t.subsec_micros().into(),
        };
        // SAFETY: `tv` is a live timeval of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(last());
        }
    }
    let (remote, remote_len) = sockaddr(to);
    // SAFETY: `remote` is a valid socket address of `remote_len` bytes.
    if unsafe { libc::connect(fd.as_raw_fd(), (&raw const remote).cast(), remote_len) } != 0 {
        return Err(last());
    }
    Ok(TcpStream::from(fd))
}

fn open(endpoint: &str, config: &ClientConfig) -> Result<TcpStream> {
    let stream = match (config.source, config.connect_timeout) {
        (Some(source), timeout) => {
            let addrs = endpoint
                .to_socket_addrs()
                .map_err(|e| RpcError::io("connect: resolve", e))?;
            let mut last = None;
            let mut found = None;
            for a in addrs.filter(|a| a.is_ipv4() == source.is_ipv4()) {
                match connect_from(source, &a, timeout) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match (found, last) {
                (Some(s), _) => s,
                (None, Some(e)) => return Err(RpcError::io("connect", e)),
                (None, None) => {
                    return Err(RpcError::refused(
                        "connect",
                        "endpoint has no address of the source's family",
                    ));
                }
            }
        }
        (None, None) => TcpStream::connect(endpoint).map_err(|e| RpcError::io("connect", e))?,
        (None, Some(t)) => {
            let addrs = endpoint
                .to_socket_addrs()
                .map_err(|e| RpcError::io("connect: resolve", e))?;
            let mut last = None;
            let mut found = None;
            for a in addrs {
                match TcpStream::connect_timeout(&a, t) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match (found, last) {
                (Some(s), _) => s,
                (None, Some(e)) => return Err(RpcError::io("connect", e)),
                (None, None) => {
                    return Err(RpcError::refused("connect", "endpoint resolves to nothing"));
                }
            }
        }
    };
    stream
        .set_nodelay(true)
        .map_err(|e| RpcError::io("connect: set_nodelay", e))?;
    stream
        .set_read_timeout(config.io_timeout)
        .and_then(|()| stream.set_write_timeout(config.io_timeout))
        .map_err(|e| RpcError::io("connect: set timeouts", e))?;
    Ok(stream)
}

impl Client {
    /// Connects to `endpoint` (`host:port`) and performs HELLO, refusing a
    /// server whose version an upstream 7.0 client would refuse.
    pub fn connect(endpoint: &str, config: ClientConfig) -> Result<Client> {
        let mut c = Client::connect_plain(endpoint, config)?;
        if c.config.probe_extensions && c.ext_query().is_err() {
            // An upstream server closed the connection: start over,
            // remembering that the extension is absent.
            let mut again = Client::connect_plain(endpoint, c.config.clone())?;
            again.ext = Some(None);
            if let (Some(old), Some(new)) = (c.stats.as_ref(), again.stats.as_mut()) {
                new.merge(old);
            }
            c = again;
        }
        Ok(c)
    }

    /// Connects and performs HELLO only (no extension probe).
    pub fn connect_plain(endpoint: &str, config: ClientConfig) -> Result<Client> {
        let stream = open(endpoint, &config)?;
        let stats = config.stats.then(Stats::default);
        let mut c = Client {
            stream,
            endpoint: endpoint.to_owned(),
            config,
            stats,
            server_version: HelloResponse::ours(),
            ext: None,
            posted: VecDeque::new(),
            answers: Vec::new(),
            out: Vec::new(),
        };
        let resp = c.call(&Request::Hello(HelloRequest::default()), 0)?;
        let Response::Hello(h) = resp else {
            return Err(RpcError::malformed("HELLO", "unexpected response"));
        };
        h.check_compatible()?;
        c.server_version = h;
        Ok(c)
    }

    /// Changes the read/write timeout of the connection.
    pub fn set_io_timeout(&mut self, timeout: Option<std::time::Duration>) -> Result<()> {
        self.stream
            .set_read_timeout(timeout)
            .and_then(|()| self.stream.set_write_timeout(timeout))
            .map_err(|e| RpcError::io("set_io_timeout", e))?;
        self.config.io_timeout = timeout;
        Ok(())
    }

    /// The endpoint this client connected to (what COPY_TENSOR_TO sends to
    /// a source server when this client is the destination).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Overrides the endpoint advertised to other servers (when they reach
    /// this server by another address than the client does).
    pub fn set_endpoint(&mut self, endpoint: &str) {
        self.endpoint = endpoint.to_owned();
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The version the server announced.
    pub fn server_version(&self) -> HelloResponse {
        self.server_version
    }

    /// Counters, when enabled.
    pub fn stats(&self) -> Option<&Stats> {
        self.stats.as_ref()
    }

    /// When counters are enabled (`TRANSFER_RPC_STATS=1`), prints the table
    /// of this step to stderr under `label` and resets it.
    pub fn print_stats(&mut self, label: &str) {
        if let Some(st) = self.take_stats() {
            eprintln!("transfer-rpc stats [{label}] {}:\n{st}", self.endpoint);
        }
    }

    /// Returns the counters and resets them (per-step tables).
    pub fn take_stats(&mut self) -> Option<Stats> {
        self.stats.as_mut().map(Stats::take)
    }

    pub(super) fn send(&mut self, req: &Request<'_>) -> Result<u64> {
        let cmd = req.command();
        let written = if let Request::SetTensor {
            tensor,
            cache_flag,
            offset,
            data,
        } = req
        {
            // Avoid copying the data into a frame buffer.
            let head = Request::SetTensor {
                tensor: tensor.clone(),
                cache_flag: *cache_flag,
                offset: *offset,
                data: &[],
            }
            .encode_payload();
            let size = (head.len() + data.len()) as u64;
            if !self.config.coalesce {
                let mut frame = Vec::with_capacity(REQUEST_HEADER_SIZE + head.len());
                frame.push(cmd.byte());
                frame.extend_from_slice(&size.to_le_bytes());
                frame.extend_from_slice(&head);
                self.stream
                    .write_all(&frame)
                    .and_then(|()| self.stream.write_all(data))
                    .map_err(|e| RpcError::io(cmd.name(), e))?;
                return Ok(self.sent(cmd, REQUEST_HEADER_SIZE as u64 + size));
            }
            self.out.push(cmd.byte());
            self.out.extend_from_slice(&size.to_le_bytes());
            self.out.extend_from_slice(&head);
            if self.out.len() + data.len() <= COALESCE_BOUND {
                // Small data (a decode step's inputs): one write with its
                // head, and with the frames around it when coalescing.
                self.out.extend_from_slice(data);
                self.flush_unless_coalescing(cmd)?;
            } else {
                self.write_out(cmd.name())?;
                self.stream
                    .write_all(data)
                    .map_err(|e| RpcError::io(cmd.name(), e))?;
            }
            REQUEST_HEADER_SIZE as u64 + size
        } else {
            let frame = req.encode_frame();
            if self.out.is_empty() && !self.config.coalesce {
                self.stream
                    .write_all(&frame)
                    .map_err(|e| RpcError::io(cmd.name(), e))?;
            } else {
                self.out.extend_from_slice(&frame);
                self.flush_unless_coalescing(cmd)?;
            }
            frame.len() as u64
        };
        Ok(self.sent(cmd, written))
    }

    /// Counts and traces a request of `written` bytes; returns `written`.
    fn sent(&mut self, cmd: Command, written: u64) -> u64 {
        if let Some(s) = self.stats.as_mut() {
            s.record(cmd, written, 0);
        }
        if super::trace::enabled() {
            super::trace::event(format_args!(
                "{} SEND {} {written}",
                self.endpoint,
                cmd.name()
            ));
        }
        written
    }

    /// Writes the kept bytes unless this client coalesces and they are
    /// under [`COALESCE_BOUND`].
    fn flush_unless_coalescing(&mut self, cmd: Command) -> Result<()> {
        if !self.config.coalesce || self.out.len() >= COALESCE_BOUND {
            self.write_out(cmd.name())?;
        }
        Ok(())
    }

    /// Writes the kept request bytes (one write); a failure is reported
    /// against `call` (the command that caused the write, or "flush").
    fn write_out(&mut self, call: &'static str) -> Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = self.stream.write_all(&self.out);
        let len = self.out.len();
        self.out.clear();
        if self.out.capacity() > 2 * COALESCE_BOUND {
            self.out.shrink_to(COALESCE_BOUND);
        }
        r.map_err(|e| RpcError::io(call, e))?;
        if super::trace::enabled() && self.config.coalesce {
            super::trace::event(format_args!("{} FLUSH {len}", self.endpoint));
        }
        Ok(())
    }

    /// Writes the requests a coalescing client ([`ClientConfig::coalesce`])
    /// kept. Its owner calls this before it waits for anything other than
    /// this connection's answers (which flush by themselves): a kept
    /// command may be what another party waits for. A no-op when nothing
    /// is kept.
    pub fn flush(&mut self) -> Result<()> {
        self.write_out("flush")
    }

    /// Request bytes kept by a coalescing client, not yet written.
    pub fn unflushed(&self) -> usize {
        self.out.len()
    }

    fn recv(&mut self, cmd: Command, expected_data: usize) -> Result<Response> {
        let waited_from = super::trace::now_us();
        let mut head = [0u8; 8];
        self.stream
            .read_exact(&mut head)
            .map_err(|e| RpcError::io(cmd.name(), e))?;
        let size = decode_response_header(&head, &self.config.limits)?;
        if !response_size(cmd, expected_data).is_some_and(|r| r.allows(size)) {
            return Err(RpcError::malformed(
                cmd.name(),
                format!("server declared a {size}-byte response"),
            ));
        }
        let payload = crate::io::read_payload(&mut self.stream, size, cmd.name())?;
        if let Some(s) = self.stats.as_mut() {
            s.add_response(cmd, 8 + size as u64);
        }
        if super::trace::enabled() {
            super::trace::event(format_args!(
                "{} RECV {} {} waited {} us",
                self.endpoint,
                cmd.name(),
                8 + size,
                super::trace::now_us().saturating_sub(waited_from)
            ));
        }
        Response::decode(cmd, &payload, expected_data)
    }

    pub(super) fn call(&mut self, req: &Request<'_>, expected_data: usize) -> Result<Response> {
        // The request goes out before the answers of posted commands are
        // read: the server answers in order, so they still come first,
        // but the request no longer waits for them to cross the link. A
        // read of the last stage's logits posted behind a MARK_WAIT or an
        // ENGINE_WAIT used to be sent only once that wait's answer was
        // back here: one more client round trip per decode step. Posted
        // answers are 9 bytes each and their callers keep few unread (the
        // plugin at most 64), so the server never blocks writing them
        // while this request is being written.
        if self.config.early_send {
            self.send(req)?;
            self.write_out(req.command().name())?;
            self.drain_posted()?;
        } else {
            self.write_out(req.command().name())?;
            self.drain_posted()?;
            self.send(req)?;
            self.write_out(req.command().name())?;
        }
        self.recv(req.command(), expected_data)
    }

    /// Sends a command whose one-byte status answer is read later, by
    /// [`Client::collect_posted`] or before the next ordinary call.
    pub(super) fn post_status(&mut self, req: &Request<'_>) -> Result<()> {
        self.send(req)?;
        self.posted.push_back(req.command());
        Ok(())
    }

    fn drain_posted(&mut self) -> Result<()> {
        while let Some(cmd) = self.posted.front().copied() {
            let ok = match self.recv(cmd, 0)? {
                Response::Status(v) => v != 0,
                _ => return Err(RpcError::malformed(cmd.name(), "unexpected response")),
            };
            self.posted.pop_front();
            self.answers.push(ok);
        }
        Ok(())
    }

    /// Reads the answers of every posted command (ENGINE_WRITE, ENGINE_WAIT
    /// sent with `post_*`), in the order they were sent, including those an
    /// ordinary call already read on the way. `true` = that command answered 1.
    pub fn collect_posted(&mut self) -> Result<Vec<bool>> {
        self.flush()?;
        self.drain_posted()?;
        Ok(std::mem::take(&mut self.answers))
    }

    /// The answers of posted commands that ordinary calls already read on
    /// the way (in order), without reading any more: never blocks.
    pub fn take_answers(&mut self) -> Vec<bool> {
        std::mem::take(&mut self.answers)
    }

    /// Posted commands whose answers have not been collected yet.
    pub fn posted_len(&self) -> usize {
        self.posted.len() + self.answers.len()
    }

    fn call_u64(&mut self, req: &Request<'_>) -> Result<u64> {
        match self.call(req, 0)? {
            Response::U64(v) => Ok(v),
            _ => Err(RpcError::malformed(
                req.command().name(),
                "unexpected response",
            )),
        }
    }

    pub(super) fn call_status(&mut self, req: &Request<'_>) -> Result<bool> {
        match self.call(req, 0)? {
            Response::Status(v) => Ok(v != 0),
            _ => Err(RpcError::malformed(
                req.command().name(),
                "unexpected response",
            )),
        }
    }

    /// ALLOC_BUFFER: `(handle, size)`; `None` when the server refused.
    pub fn alloc_buffer(&mut self, device: u32, size: u64) -> Result<Option<(u64, u64)>> {
        match self.call(&Request::AllocBuffer { device, size }, 0)? {
            Response::AllocBuffer { remote_ptr: 0, .. } => Ok(None),
            Response::AllocBuffer {
                remote_ptr,
                remote_size,
            } => Ok(Some((remote_ptr, remote_size))),
            _ => Err(RpcError::malformed("ALLOC_BUFFER", "unexpected response")),
        }
    }

    /// GET_ALIGNMENT.
    pub fn get_alignment(&mut self, device: u32) -> Result<u64> {
        self.call_u64(&Request::GetAlignment { device })
    }

    /// GET_MAX_SIZE.
    pub fn get_max_size(&mut self, device: u32) -> Result<u64> {
        self.call_u64(&Request::GetMaxSize { device })
    }

    /// BUFFER_GET_BASE.
    pub fn buffer_get_base(&mut self, remote_ptr: u64) -> Result<u64> {
        self.call_u64(&Request::BufferGetBase { remote_ptr })
    }

    /// FREE_BUFFER (no response).
    pub fn free_buffer(&mut self, remote_ptr: u64) -> Result<()> {
        self.send(&Request::FreeBuffer { remote_ptr }).map(drop)
    }

    /// BUFFER_CLEAR (no response).
    pub fn buffer_clear(&mut self, remote_ptr: u64, value: u8) -> Result<()> {
        self.send(&Request::BufferClear { remote_ptr, value })
            .map(drop)
    }

    /// SET_TENSOR (no response).
    pub fn set_tensor(&mut self, tensor: &RpcTensor, offset: u64, data: &[u8]) -> Result<()> {
        self.set_tensor_cached(tensor, offset, data, false)
    }

    /// SET_TENSOR asking the server to store the data in its hash cache.
    pub fn set_tensor_cached(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        data: &[u8],
        cache: bool,
    ) -> Result<()> {
        self.send(&Request::SetTensor {
            tensor: Box::new(tensor.clone()),
            cache_flag: u8::from(cache),
            offset,
            data,
        })
        .map(drop)
    }

    /// SET_TENSOR_HASH: true when the server had the data cached and wrote it.
    pub fn set_tensor_hash(&mut self, tensor: &RpcTensor, offset: u64, hash: u64) -> Result<bool> {
        self.call_status(&Request::SetTensorHash {
            tensor: Box::new(tensor.clone()),
            offset,
            hash,
        })
    }

    /// GET_TENSOR.
    pub fn get_tensor(&mut self, tensor: &RpcTensor, offset: u64, size: u64) -> Result<Vec<u8>> {
        let expected = usize::try_from(size)
            .map_err(|_| RpcError::refused("GET_TENSOR", "size does not fit in memory"))?;
        self.config.limits.check("GET_TENSOR", size)?;
        match self.call(
            &Request::GetTensor {
                tensor: Box::new(tensor.clone()),
                offset,
                size,
            },
            expected,
        )? {
            Response::Data(d) => Ok(d),
            _ => Err(RpcError::malformed("GET_TENSOR", "unexpected response")),
        }
    }

    /// COPY_TENSOR within one server.
    pub fn copy_tensor(&mut self, src: &RpcTensor, dst: &RpcTensor) -> Result<bool> {
        self.call_status(&Request::CopyTensor {
            src: Box::new(src.clone()),
            dst: Box::new(dst.clone()),
        })
    }

    /// GRAPH_COMPUTE (no response; a refusal closes the connection).
    pub fn graph_compute(&mut self, graph: &GraphPayload) -> Result<()> {
        self.send(&Request::GraphCompute(Box::new(graph.clone())))
            .map(drop)
    }

    /// GET_DEVICE_MEMORY: `(free, total)`.
    pub fn get_device_memory(&mut self, device: u32) -> Result<(u64, u64)> {
        match self.call(&Request::GetDeviceMemory { device }, 0)? {
            Response::DeviceMemory { free, total } => Ok((free, total)),
            _ => Err(RpcError::malformed(
                "GET_DEVICE_MEMORY",
                "unexpected response",
            )),
        }
    }

    /// INIT_TENSOR (no response).
    pub fn init_tensor(&mut self, tensor: &RpcTensor) -> Result<()> {
        self.send(&Request::InitTensor {
            tensor: Box::new(tensor.clone()),
        })
        .map(drop)
    }

    /// GET_ALLOC_SIZE.
    pub fn get_alloc_size(
        &mut self,
        device: u32,
        tensor: &RpcTensor,
        srcs: &[RpcTensor; MAX_SRC],
    ) -> Result<u64> {
        self.call_u64(&Request::GetAllocSize {
            device,
            tensor: Box::new(tensor.clone()),
            srcs: Box::new(srcs.clone()),
        })
    }

    /// DEVICE_COUNT.
    pub fn device_count(&mut self) -> Result<u32> {
        match self.call(&Request::DeviceCount, 0)? {
            Response::DeviceCount(n) => Ok(n),
            _ => Err(RpcError::malformed("DEVICE_COUNT", "unexpected response")),
        }
    }

    /// GRAPH_RECOMPUTE (no response).
    pub fn graph_recompute(&mut self, device: u32) -> Result<()> {
        self.send(&Request::GraphRecompute { device }).map(drop)
    }

    /// MEMSET_TENSOR (no response).
    pub fn memset_tensor(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        size: u64,
        value: u8,
    ) -> Result<()> {
        self.send(&Request::MemsetTensor {
            tensor: Box::new(tensor.clone()),
            offset,
            size,
            value,
        })
        .map(drop)
    }

    /// EXT_QUERY on this connection. A server without the extension closes
    /// the connection: only use this on a connection that may be dropped
    /// ([`Client::connect`] does it once, before any state exists).
    pub fn ext_query(&mut self) -> Result<ExtInfo> {
        match self.call(&Request::ExtQuery, 0) {
            Ok(Response::Ext(e)) => {
                self.ext = Some(Some(e));
                Ok(e)
            }
            Ok(_) => Err(RpcError::malformed("EXT_QUERY", "unexpected response")),
            Err(RpcError::Io { .. }) => {
                self.ext = Some(None);
                Err(RpcError::ExtensionUnsupported { call: "EXT_QUERY" })
            }
            Err(e) => Err(e),
        }
    }

    /// What the server said about the extension at connect time (`None`
    /// when it does not serve it or was not asked).
    pub fn probe_extensions(&self) -> Option<ExtInfo> {
        self.ext.flatten()
    }

    /// True when the server serves COPY_TENSOR_TO (asked at connect time).
    pub fn supports_copy_to(&self) -> bool {
        self.probe_extensions()
            .is_some_and(|e| e.has(FEATURE_COPY_TENSOR_TO))
    }

    /// True when the server has an engine and serves ENGINE_* (asked at
    /// connect time).
    pub fn supports_engine(&self) -> bool {
        self.probe_extensions()
            .is_some_and(|e| e.has(FEATURE_ENGINE))
    }

    /// False when the server is known not to serve ENGINE_* (an unprobed
    /// connection is given the benefit of the doubt).
    pub(super) fn engine_allowed(&self) -> bool {
        match self.ext {
            None => true,
            Some(e) => e.is_some_and(|e| e.has(FEATURE_ENGINE)),
        }
    }

    /// True when the server serves PEER_BARRIER, i.e. can be the
    /// destination of a direct copy.
    pub fn supports_peer_barrier(&self) -> bool {
        self.probe_extensions()
            .is_some_and(|e| e.has(FEATURE_PEER_BARRIER))
    }

    /// COPY_TENSOR_TO: asks this (source) server to write `size` bytes of
    /// `src` into `dst` on the server at `endpoint`. `Ok(false)` means a
    /// recoverable failure: fall back to the hub path.
    pub fn copy_tensor_to(
        &mut self,
        src: &RpcTensor,
        dst: &RpcTensor,
        size: u64,
        endpoint: &str,
    ) -> Result<bool> {
        self.call_status(&Self::copy_request(src, dst, size, endpoint, None))
    }

    /// PEER_BARRIER: returns once every earlier command on this connection
    /// has been executed.
    pub fn peer_barrier(&mut self) -> Result<bool> {
        self.call_status(&Request::PeerBarrier)
    }

    /// True when the server serves the marks (MARK_OPEN, MARK_WAIT,
    /// PEER_MARK, COPY_TENSOR_TO_MARK; asked at connect time).
    pub fn supports_marks(&self) -> bool {
        self.probe_extensions()
            .is_some_and(|e| e.has(FEATURE_PEER_MARK))
    }

    /// MARK_OPEN: a mark key of this session; `None` when the server
    /// refused (the session holds its limit of keys).
    pub fn mark_open(&mut self) -> Result<Option<u64>> {
        self.call_u64(&Request::MarkOpen)
            .map(|k| (k != 0).then_some(k))
    }

    /// MARK_WAIT: `true` once mark `seq` of this session's `key` landed
    /// (PEER_MARK from a source server), `false` after `timeout_ms` (capped
    /// by the server) or for a key this session does not hold.
    pub fn mark_wait(&mut self, key: u64, seq: u64, timeout_ms: u32) -> Result<bool> {
        self.call_status(&Request::MarkWait {
            key,
            seq,
            timeout_ms,
        })
    }

    /// [`Client::mark_wait`] without reading the answer (see
    /// [`Client::collect_posted`]): the server holds this connection's next
    /// command until the mark landed.
    pub fn post_mark_wait(&mut self, key: u64, seq: u64, timeout_ms: u32) -> Result<()> {
        self.post_status(&Request::MarkWait {
            key,
            seq,
            timeout_ms,
        })
    }

    /// PEER_MARK: mark `seq` of `key` landed on this (destination) server;
    /// `false` for a key nobody there holds.
    pub fn peer_mark(&mut self, key: u64, seq: u64) -> Result<bool> {
        self.call_status(&Request::PeerMark { key, seq })
    }

    /// COPY_TENSOR_TO_MARK: [`Client::copy_tensor_to`], then the source
    /// server sends PEER_MARK(`key`, `seq`) to the destination after the
    /// data. `Ok(false)`: the copy or the mark did not land.
    pub fn copy_tensor_to_mark(
        &mut self,
        src: &RpcTensor,
        dst: &RpcTensor,
        size: u64,
        endpoint: &str,
        mark: (u64, u64),
    ) -> Result<bool> {
        self.call_status(&Self::copy_request(src, dst, size, endpoint, Some(mark)))
    }

    /// [`Client::copy_tensor_to_mark`] without reading the answer (see
    /// [`Client::collect_posted`]).
    pub fn post_copy_tensor_to_mark(
        &mut self,
        src: &RpcTensor,
        dst: &RpcTensor,
        size: u64,
        endpoint: &str,
        mark: (u64, u64),
    ) -> Result<()> {
        self.post_status(&Self::copy_request(src, dst, size, endpoint, Some(mark)))
    }

    fn copy_request(
        src: &RpcTensor,
        dst: &RpcTensor,
        size: u64,
        endpoint: &str,
        mark: Option<(u64, u64)>,
    ) -> Request<'static> {
        Request::CopyTensorTo {
            src: Box::new(src.clone()),
            dst: Box::new(dst.clone()),
            size,
            mark,
            endpoint: endpoint.to_owned(),
        }
    }

    /// Sends raw bytes (tests and fuzzing of servers).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.flush()?;
        self.stream
            .write_all(bytes)
            .map_err(|e| RpcError::io("send_raw", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::encode_response;
    use std::net::TcpListener;
    use std::time::Duration;

    /// One request frame off the socket: (command byte, payload).
    fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
        let mut h = [0u8; REQUEST_HEADER_SIZE];
        s.read_exact(&mut h)?;
        let mut size = [0u8; 8];
        size.copy_from_slice(&h[1..]);
        let mut p = vec![0u8; u64::from_le_bytes(size) as usize];
        s.read_exact(&mut p)?;
        Ok((h[0], p))
    }

    fn answer(s: &mut TcpStream, r: &Response) -> std::io::Result<()> {
        s.write_all(&encode_response(&r.encode_payload()))
    }

    /// A listener on a free loopback port, and its address.
    fn listener() -> Result<(TcpListener, String)> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| RpcError::io("bind", e))?;
        let addr = l
            .local_addr()
            .map_err(|e| RpcError::io("local_addr", e))?
            .to_string();
        Ok((l, addr))
    }

    /// A server that answers a posted command only once the next request
    /// arrived (as a MARK_WAIT is answered only once a copy landed, which
    /// may be long after the client wants to send more): an ordinary call
    /// after a post must be sent before the posted answer is read. A
    /// client reading first would wait here until its io timeout and fail.
    #[test]
    fn a_call_is_sent_before_the_answers_of_posted_commands_are_read() -> Result<()> {
        let (l, addr) = listener()?;
        let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
            let (mut s, _) = l.accept()?;
            let (hello, _) = read_frame(&mut s)?;
            answer(&mut s, &Response::Hello(HelloResponse::ours()))?;
            let (posted, _) = read_frame(&mut s)?;
            let (called, _) = read_frame(&mut s)?;
            answer(&mut s, &Response::Status(1))?;
            answer(&mut s, &Response::DeviceCount(3))?;
            Ok(vec![hello, posted, called])
        });
        let config = ClientConfig {
            probe_extensions: false,
            io_timeout: Some(Duration::from_secs(20)),
            ..ClientConfig::default()
        };
        let mut c = Client::connect(&addr, config)?;
        c.post_mark_wait(7, 1, 1000)?;
        assert_eq!(c.device_count()?, 3);
        assert_eq!(c.collect_posted()?, vec![true]);
        let seen = server
            .join()
            .map_err(|_| RpcError::refused("test", "server thread panicked"))?
            .map_err(|e| RpcError::io("test server", e))?;
        assert_eq!(
            seen,
            [
                Command::Hello.byte(),
                Command::MarkWait.byte(),
                Command::DeviceCount.byte()
            ]
        );
        Ok(())
    }

    /// A coalescing client keeps requests without an answer until a call
    /// (or a flush) writes them, in order, ahead of the call's own request.
    #[test]
    fn coalesced_requests_go_out_in_order_with_the_next_call() -> Result<()> {
        let (l, addr) = listener()?;
        let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
            let (mut s, _) = l.accept()?;
            let (hello, _) = read_frame(&mut s)?;
            answer(&mut s, &Response::Hello(HelloResponse::ours()))?;
            let mut seen = vec![hello];
            for _ in 0..4 {
                seen.push(read_frame(&mut s)?.0);
            }
            answer(&mut s, &Response::Status(1))?;
            answer(&mut s, &Response::DeviceCount(2))?;
            seen.push(read_frame(&mut s)?.0);
            Ok(seen)
        });
        let config = ClientConfig {
            probe_extensions: false,
            io_timeout: Some(Duration::from_secs(20)),
            coalesce: true,
            ..ClientConfig::default()
        };
        let mut c = Client::connect(&addr, config)?;
        let t = RpcTensor::default();
        c.set_tensor(&t, 0, &[1, 2, 3, 4])?;
        c.post_mark_wait(7, 1, 1000)?;
        c.graph_recompute(0)?;
        assert!(c.unflushed() > 0, "requests without an answer are kept");
        assert_eq!(c.device_count()?, 2);
        assert_eq!(c.unflushed(), 0);
        assert_eq!(c.collect_posted()?, vec![true]);
        c.graph_recompute(1)?;
        c.flush()?;
        let seen = server
            .join()
            .map_err(|_| RpcError::refused("test", "server thread panicked"))?
            .map_err(|e| RpcError::io("test server", e))?;
        assert_eq!(
            seen,
            [
                Command::Hello.byte(),
                Command::SetTensor.byte(),
                Command::MarkWait.byte(),
                Command::GraphRecompute.byte(),
                Command::DeviceCount.byte(),
                Command::GraphRecompute.byte(),
            ]
        );
        Ok(())
    }
}
