//! Command bytes: all of upstream protocol 7.0 plus this crate's extension.

use crate::error::{Result, RpcError};

/// First command byte of the transfer-rpc extension.
///
/// Upstream uses 0..=18 (19 is its internal count) and closes a connection on
/// any byte at or above its count. The extension lives at 0xC0.. so it never
/// collides with commands upstream may add later, and an upstream server that
/// receives one simply closes the connection (which our client treats as
/// "extension unsupported" on a throwaway probe connection).
pub const EXT_BASE: u8 = 0xC0;

/// Every command this crate can encode or decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Command {
    /// Allocate a buffer on a device.
    AllocBuffer = 0,
    /// Alignment of a device's buffers.
    GetAlignment = 1,
    /// Largest single buffer of a device.
    GetMaxSize = 2,
    /// Base address of a buffer.
    BufferGetBase = 3,
    /// Free a buffer.
    FreeBuffer = 4,
    /// Fill a buffer with a byte.
    BufferClear = 5,
    /// Write tensor data.
    SetTensor = 6,
    /// Write tensor data from the server's hash cache.
    SetTensorHash = 7,
    /// Read tensor data.
    GetTensor = 8,
    /// Copy one tensor to another on the same server.
    CopyTensor = 9,
    /// Run a graph.
    GraphCompute = 10,
    /// Free and total memory of a device.
    GetDeviceMemory = 11,
    /// Initialise a tensor in its buffer.
    InitTensor = 12,
    /// Allocation size of a tensor.
    GetAllocSize = 13,
    /// Version and capability handshake (always first).
    Hello = 14,
    /// Number of devices.
    DeviceCount = 15,
    /// Re-run the last graph of a device.
    GraphRecompute = 16,
    /// Fill a tensor range with a byte.
    MemsetTensor = 17,
    /// Extension: which extension features the server has (empty request).
    ExtQuery = EXT_BASE,
    /// Extension: server-to-server copy of a tensor.
    CopyTensorTo = EXT_BASE + 1,
    /// Extension: answers once every earlier command on the connection is done.
    PeerBarrier = EXT_BASE + 2,
    /// Engine extension: the server's engine backend and address.
    EngineInfo = EXT_BASE + 3,
    /// Engine extension: register a buffer range as a write target, get a lane.
    EngineOpenInbound = EXT_BASE + 4,
    /// Engine extension: resolve a remote region (and lane) to write to.
    EngineOpenOutbound = EXT_BASE + 5,
    /// Engine extension: post a write-with-immediate of a local tensor range.
    EngineWrite = EXT_BASE + 6,
    /// Engine extension: wait until one write on a lane has arrived.
    EngineWait = EXT_BASE + 7,
    /// Engine extension: close an inbound lane or an outbound target.
    EngineClose = EXT_BASE + 8,
    /// Mark extension: a mark key for this session (server/marks.rs).
    MarkOpen = EXT_BASE + 9,
    /// Mark extension: answers once a mark of this session's key landed.
    MarkWait = EXT_BASE + 10,
    /// Mark extension: a mark landed (sent by a source server after its data).
    PeerMark = EXT_BASE + 11,
    /// Mark extension: COPY_TENSOR_TO followed by PEER_MARK on the destination.
    CopyTensorToMark = EXT_BASE + 12,
}

impl Command {
    /// Every command, in byte order.
    pub const ALL: [Command; 31] = [
        Command::AllocBuffer,
        Command::GetAlignment,
        Command::GetMaxSize,
        Command::BufferGetBase,
        Command::FreeBuffer,
        Command::BufferClear,
        Command::SetTensor,
        Command::SetTensorHash,
        Command::GetTensor,
        Command::CopyTensor,
        Command::GraphCompute,
        Command::GetDeviceMemory,
        Command::InitTensor,
        Command::GetAllocSize,
        Command::Hello,
        Command::DeviceCount,
        Command::GraphRecompute,
        Command::MemsetTensor,
        Command::ExtQuery,
        Command::CopyTensorTo,
        Command::PeerBarrier,
        Command::EngineInfo,
        Command::EngineOpenInbound,
        Command::EngineOpenOutbound,
        Command::EngineWrite,
        Command::EngineWait,
        Command::EngineClose,
        Command::MarkOpen,
        Command::MarkWait,
        Command::PeerMark,
        Command::CopyTensorToMark,
    ];

    /// The byte on the wire.
    pub fn byte(self) -> u8 {
        self as u8
    }

    /// Decodes a command byte (18, upstream's client-internal NONE, is refused).
    pub fn from_byte(b: u8) -> Result<Command> {
        Command::ALL
            .iter()
            .copied()
            .find(|c| c.byte() == b)
            .ok_or(RpcError::UnknownCommand(b))
    }

    /// True for the transfer-rpc extension commands.
    pub fn is_extension(self) -> bool {
        self.byte() >= EXT_BASE
    }

    /// True for the ENGINE_* commands (served only by a server with an engine).
    pub fn is_engine(self) -> bool {
        (Command::EngineInfo.byte()..=Command::EngineClose.byte()).contains(&self.byte())
    }

    /// Upper-case name as in upstream's enum (without the `RPC_CMD_` prefix).
    pub fn name(self) -> &'static str {
        match self {
            Command::AllocBuffer => "ALLOC_BUFFER",
            Command::GetAlignment => "GET_ALIGNMENT",
            Command::GetMaxSize => "GET_MAX_SIZE",
            Command::BufferGetBase => "BUFFER_GET_BASE",
            Command::FreeBuffer => "FREE_BUFFER",
            Command::BufferClear => "BUFFER_CLEAR",
            Command::SetTensor => "SET_TENSOR",
            Command::SetTensorHash => "SET_TENSOR_HASH",
            Command::GetTensor => "GET_TENSOR",
            Command::CopyTensor => "COPY_TENSOR",
            Command::GraphCompute => "GRAPH_COMPUTE",
            Command::GetDeviceMemory => "GET_DEVICE_MEMORY",
            Command::InitTensor => "INIT_TENSOR",
            Command::GetAllocSize => "GET_ALLOC_SIZE",
            Command::Hello => "HELLO",
            Command::DeviceCount => "DEVICE_COUNT",
            Command::GraphRecompute => "GRAPH_RECOMPUTE",
            Command::MemsetTensor => "MEMSET_TENSOR",
            Command::ExtQuery => "EXT_QUERY",
            Command::CopyTensorTo => "COPY_TENSOR_TO",
            Command::PeerBarrier => "PEER_BARRIER",
            Command::EngineInfo => "ENGINE_INFO",
            Command::EngineOpenInbound => "ENGINE_OPEN_INBOUND",
            Command::EngineOpenOutbound => "ENGINE_OPEN_OUTBOUND",
            Command::EngineWrite => "ENGINE_WRITE",
            Command::EngineWait => "ENGINE_WAIT",
            Command::EngineClose => "ENGINE_CLOSE",
            Command::MarkOpen => "MARK_OPEN",
            Command::MarkWait => "MARK_WAIT",
            Command::PeerMark => "PEER_MARK",
            Command::CopyTensorToMark => "COPY_TENSOR_TO_MARK",
        }
    }

    /// True when the server sends a response to this command.
    ///
    /// From protocol 6.0 on, commands that cannot fail visibly have no response;
    /// a failure closes the connection.
    pub fn has_response(self) -> bool {
        !matches!(
            self,
            Command::FreeBuffer
                | Command::BufferClear
                | Command::SetTensor
                | Command::GraphCompute
                | Command::InitTensor
                | Command::GraphRecompute
                | Command::MemsetTensor
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_match_upstream() {
        for c in Command::ALL {
            assert_eq!(Command::from_byte(c.byte()).ok(), Some(c));
        }
        assert_eq!(Command::Hello.byte(), 14);
        assert_eq!(Command::MemsetTensor.byte(), 17);
        assert!(Command::from_byte(18).is_err());
        assert!(Command::from_byte(19).is_err());
        assert_eq!(Command::from_byte(0xC3).ok(), Some(Command::EngineInfo));
        assert_eq!(Command::from_byte(0xC8).ok(), Some(Command::EngineClose));
        assert_eq!(Command::from_byte(0xC9).ok(), Some(Command::MarkOpen));
        assert_eq!(
            Command::from_byte(0xCC).ok(),
            Some(Command::CopyTensorToMark)
        );
        assert!(Command::from_byte(0xCD).is_err());
        assert!(Command::EngineWait.is_engine() && !Command::PeerBarrier.is_engine());
        assert!(!Command::MarkWait.is_engine() && Command::MarkWait.is_extension());
    }
}
