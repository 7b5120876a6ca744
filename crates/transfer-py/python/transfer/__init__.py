"""transfer: point-to-point RDMA-style transfers for LLM systems.

The Rust TransferEngine (crates/transfer-core) over libfabric (EFA, tcp,
shm): register memory, hand peers a descriptor, write into their memory
with optional 32-bit immediates that the receiver counts.

    import numpy as np, transfer
    eng = transfer.Engine(provider="tcp", bind="127.0.0.1")
    kv = eng.register(np.zeros(1 << 20, np.uint8))
    # send eng.address and kv.descriptor to the peer; on the peer:
    dst = peer_eng.connect(addr).remote(desc)
    peer_eng.write(src_region, dst, imm=7).wait()
    # receiver:
    eng.wait_imm(7, eng.expected_imms(sender_addr, nbytes=1 << 20), timeout=5)
"""

from ._errors import (
    EngineShutdown,
    InvalidArgument,
    PeerUnreachable,
    TransferError,
    TransferTimeout,
)
from ._native import Engine, Peer, Region, RemoteRegion, Transfer

__all__ = [
    "Engine",
    "EngineShutdown",
    "InvalidArgument",
    "Peer",
    "PeerUnreachable",
    "Region",
    "RemoteRegion",
    "Transfer",
    "TransferError",
    "TransferTimeout",
]
