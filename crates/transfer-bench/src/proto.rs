//! The side channel between bench roles: one JSON object per line over TCP.
//!
//! It carries only control: engine addresses, region descriptors, and
//! requests such as "checksum this range" or "echo immediates". All data
//! moves through the engine (or the raw baseline loop).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use serde::{Deserialize, Serialize};

use crate::error::{Result, io, protocol};

/// Longest accepted line (addresses and descriptors are a few hundred bytes).
const MAX_LINE: usize = 1 << 20;

/// Driver -> server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Request {
    /// Introduces the driver; the server answers with its engines.
    Hello {
        /// The driver's engine address (postcard bytes).
        driver_addr: Vec<u8>,
        /// A driver region the server writes replies into (descriptor bytes).
        driver_region: Vec<u8>,
        /// The driver's caller-driven engine and its reply region, for the
        /// caller-progress latency rows.
        #[serde(default)]
        driver_caller: Option<(Vec<u8>, Vec<u8>)>,
    },
    /// Checksum of `len` bytes at `offset` of engine `engine`'s region.
    Checksum {
        /// Engine index on the server.
        engine: usize,
        /// First byte.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// Wait until `count` immediates `imm` arrived at each listed engine.
    WaitImm {
        /// Engine indices.
        engines: Vec<usize>,
        /// The immediate.
        imm: u32,
        /// How many per engine.
        count: u64,
    },
    /// For `iters` rounds, each listed engine waits for one `imm` and
    /// answers with a zero-byte write carrying `reply_imm` to the driver.
    Echo {
        /// Engine indices.
        engines: Vec<usize>,
        /// Immediate the driver sends.
        imm: u32,
        /// Immediate the server answers with.
        reply_imm: u32,
        /// Rounds.
        iters: u64,
    },
    /// Drive the server's caller-driven engine on the session thread: answer
    /// each `imm` with a zero-byte `reply_imm` write and echo every message,
    /// until `stop_imm` arrives; then answer Done.
    CallerServe {
        /// Immediate the driver sends.
        imm: u32,
        /// Immediate the server answers with.
        reply_imm: u32,
        /// Ends the phase.
        stop_imm: u32,
    },
    /// The server process's CPU time so far (answer: [`Response::CpuTime`]).
    CpuTime,
    /// Opens a bare domain (no engine) with a region of `len` bytes for the
    /// raw baseline and drives it until [`Request::RawStop`].
    RawStart {
        /// Region length.
        len: u64,
        /// Poll without pause (the target of the caller-progress rows
        /// does); otherwise sleep and wake as an engine's worker does.
        busy: bool,
    },
    /// Stops the raw sink; answers with the checksum of its first `len` bytes.
    RawStop {
        /// Bytes to checksum.
        len: u64,
    },
    /// Ends the session.
    Bye,
}

/// Server -> driver.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Response {
    /// Answer to Hello: per engine, its address and region descriptor.
    Engines {
        /// `(address bytes, descriptor bytes)` per engine.
        engines: Vec<(Vec<u8>, Vec<u8>)>,
        /// Provider name.
        provider: String,
        /// The server's caller-driven engine and region, when it has one.
        #[serde(default)]
        caller: Option<(Vec<u8>, Vec<u8>)>,
    },
    /// Answer to RawStart: the sink's NIC address and its region.
    RawSink {
        /// NIC address bytes.
        nic: Vec<u8>,
        /// Remote base address.
        base: u64,
        /// Remote key.
        key: u64,
    },
    /// A checksum.
    Checksum(u64),
    /// User + system CPU time of the server process, in nanoseconds.
    CpuTime(u64),
    /// Done.
    Done,
    /// The request failed.
    Error(String),
}

/// A framed connection.
pub struct Channel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Channel {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Result<Self> {
        stream
            .set_nodelay(true)
            .map_err(io("side channel: set_nodelay"))?;
        let writer = stream.try_clone().map_err(io("side channel: clone"))?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Sends one message.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<()> {
        let mut line =
            serde_json::to_vec(msg).map_err(|e| protocol("side channel: encode", e.to_string()))?;
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .map_err(io("side channel: write"))
    }

    /// Receives one message; `None` at end of stream.
    pub fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> Result<Option<T>> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(io("side channel: read"))?;
        if n == 0 {
            return Ok(None);
        }
        if line.len() > MAX_LINE {
            return Err(protocol("side channel: read", "line too long"));
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| protocol("side channel: decode", e.to_string()))
    }

    /// Sends a request and waits for its response.
    pub fn call(&mut self, req: &Request) -> Result<Response> {
        self.send(req)?;
        match self.recv()? {
            Some(Response::Error(e)) => Err(protocol("server", e)),
            Some(r) => Ok(r),
            None => Err(protocol("side channel", "server closed the connection")),
        }
    }
}

use std::io::Read as _;
