"""Refusals and failures: typed exceptions, never a crash."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import transfer
from peers import Peer, open_engine

TIMEOUT = 30.0


def remote(engine: Any, peer: Peer, nbytes: int) -> transfer.RemoteRegion:
    _, desc = peer.call("register", nbytes)
    return engine.connect(peer.call("address")).remote(desc)


def test_exception_classes() -> None:
    assert issubclass(transfer.TransferTimeout, TimeoutError)
    assert issubclass(transfer.PeerUnreachable, ConnectionError)
    assert issubclass(transfer.InvalidArgument, ValueError)
    for cls in (transfer.TransferTimeout, transfer.PeerUnreachable,
                transfer.InvalidArgument, transfer.EngineShutdown):
        assert issubclass(cls, transfer.TransferError)


def test_bad_engine_arguments() -> None:
    with pytest.raises(transfer.InvalidArgument, match="backend"):
        transfer.Engine(backend="carrier-pigeon")
    with pytest.raises(transfer.InvalidArgument, match="nics"):
        transfer.Engine(provider="tcp", nics=0)
    with pytest.raises(transfer.InvalidArgument, match="peer_timeout"):
        transfer.Engine(provider="tcp", peer_timeout=-1)
    with pytest.raises(transfer.TransferError):
        transfer.Engine(provider="no-such-provider")


def test_verbs_backend_without_a_device_is_a_clear_error() -> None:
    # This machine has no RDMA device (no /sys/class/infiniband entries):
    # the verbs backend must refuse with an error naming the problem, not
    # crash; where a device exists it opens.
    import os

    devices = os.listdir("/sys/class/infiniband") if os.path.isdir("/sys/class/infiniband") else []
    if devices:
        with transfer.Engine(backend="verbs") as e:
            assert e.backend == "verbs"
        return
    with pytest.raises(transfer.TransferError) as info:
        transfer.Engine(backend="verbs")
    assert str(info.value)
    with pytest.raises(transfer.InvalidArgument, match="libfabric options"):
        transfer.Engine(backend="verbs", provider="tcp")


def test_bad_address_and_descriptor(engine: Any, peer: Peer) -> None:
    with pytest.raises(transfer.InvalidArgument) as e:
        engine.connect(b"\x00garbage")
    assert e.value.kind == "malformed"
    p = engine.connect(peer.call("address"))
    with pytest.raises(transfer.InvalidArgument):
        p.remote(b"\xff" * 10)
    with pytest.raises(transfer.InvalidArgument):
        engine.connect(12345)
    # A descriptor of this engine's own region is refused against the
    # peer if its shape does not fit (group out of range, etc.) -- and a
    # well-formed one decodes.
    mine = engine.register(np.zeros(16, np.uint8))
    assert p.remote(mine.descriptor).nbytes == 16


def test_out_of_range_refused_at_submit(engine: Any, peer: Peer) -> None:
    dst = remote(engine, peer, 1024)
    src = engine.register(np.zeros(4096, np.uint8))
    with pytest.raises(transfer.InvalidArgument, match="outside"):
        engine.write(src, dst)  # 4096 bytes into 1024
    with pytest.raises(transfer.InvalidArgument, match="outside"):
        engine.write(src, dst, dst_offset=1000, nbytes=100)
    with pytest.raises(transfer.InvalidArgument):
        engine.write(src, dst, src_offset=5000)
    with pytest.raises(transfer.InvalidArgument, match="outside"):
        engine.write_paged(src, [0, 1], dst, [0, 1], 1024)
    with pytest.raises(transfer.InvalidArgument, match="pages"):
        engine.write_paged(src, [0, 1], dst, [0], 16)
    with pytest.raises(transfer.InvalidArgument, match="0..2"):
        engine.write_paged(src, np.array([-1]), dst, [0], 16)
    with pytest.raises(transfer.InvalidArgument, match="integers"):
        engine.write_paged(src, np.array([0.5]), dst, [0], 16)
    with pytest.raises(transfer.InvalidArgument):
        engine.write_paged(src, "ab", dst, [0], 16)
    with pytest.raises(transfer.InvalidArgument, match="one-dimensional"):
        engine.write_paged(src, np.zeros((2, 2), np.uint32), dst, [0, 1, 2, 3], 16)
    with pytest.raises(transfer.InvalidArgument, match="tuple"):
        engine.scatter(src, [dst])
    with pytest.raises(OverflowError):
        engine.write(src, dst, imm=1 << 32)
    with pytest.raises(TypeError):
        engine.write(b"not a region", dst)


def test_register_refusals(engine: Any) -> None:
    with pytest.raises(transfer.InvalidArgument, match="read-only"):
        engine.register(b"immutable bytes")
    with pytest.raises(transfer.InvalidArgument, match="C-contiguous"):
        engine.register(np.zeros((8, 8), np.uint8)[:, ::2])
    with pytest.raises(transfer.InvalidArgument, match="empty"):
        engine.register(bytearray())
    with pytest.raises(transfer.InvalidArgument, match="buffer protocol"):
        engine.register(object())

    class FakeCudaTensor:
        __cuda_array_interface__ = {"data": (1 << 40, False), "shape": (4,), "typestr": "<f4"}

    with pytest.raises(transfer.InvalidArgument, match="GPU memory is not supported"):
        engine.register(FakeCudaTensor())

    class FakeDlpack:
        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)  # kDLCUDA

    with pytest.raises(transfer.InvalidArgument, match="GPU memory is not supported"):
        engine.register(FakeDlpack())
    with pytest.raises(transfer.InvalidArgument, match="GPU memory is not supported"):
        engine.register((1 << 40, 4096, "cuda:0"))
    with pytest.raises(transfer.InvalidArgument, match="null"):
        engine.register((0, 4096, "cpu"))
    with pytest.raises(transfer.InvalidArgument, match="device"):
        engine.register((1 << 40, 4096, "tpu"))
    with pytest.raises(transfer.InvalidArgument, match="ptr, nbytes, device"):
        engine.register((1, 2))


def test_region_keeps_the_object(engine: Any) -> None:
    buf = bytearray(4096)
    region = engine.register(buf)
    with pytest.raises(BufferError):
        buf.extend(b"x")  # exported: cannot move while registered
    region.unregister()
    assert not region.registered
    buf.extend(b"x")  # released
    region.unregister()  # idempotent
    # Dropping the only reference to the object keeps its memory alive.
    arr = np.arange(4096, dtype=np.uint8)
    r2 = engine.register(arr)
    ptr = arr.ctypes.data
    del arr
    gc.collect()
    assert r2.ptr == ptr and r2.obj is not None and r2.obj[5] == 5


def test_raw_pointer_region(engine: Any, peer: Peer, imm: int) -> None:
    arr = np.arange(1024, dtype=np.uint8)
    region = engine.register((arr.ctypes.data, arr.nbytes, "cpu"), owner=arr)
    assert region.obj is arr and region.ptr == arr.ctypes.data
    idx, desc = peer.call("register", 1024)
    dst = engine.connect(peer.call("address")).remote(desc)
    engine.write(region, dst, imm=imm).wait(TIMEOUT)
    peer.call("wait_write", imm, TIMEOUT, nbytes=1024)
    assert peer.call("read", idx) == arr.tobytes()


def test_unregistered_source_refused(engine: Any, peer: Peer) -> None:
    dst = remote(engine, peer, 64)
    src = engine.register(np.zeros(64, np.uint8))
    src.unregister()
    with pytest.raises(transfer.TransferError) as e:
        engine.write(src, dst)
    assert e.value.kind == "region_unregistered"


def test_objects_of_another_engine_refused(engine: Any, peer: Peer, provider: str) -> None:
    other = open_engine(provider)
    try:
        dst = remote(engine, peer, 64)
        src = other.register(np.zeros(64, np.uint8))
        with pytest.raises(transfer.InvalidArgument, match="another Engine"):
            other.write(src, dst)
        mine = engine.register(np.zeros(64, np.uint8))
        with pytest.raises(transfer.InvalidArgument, match="another Engine"):
            other.barrier([dst], 1)
        with pytest.raises(transfer.InvalidArgument, match="another Engine"):
            engine.write(src, dst)
        del mine
    finally:
        other.close()


def test_expected_imms_needs_one_shape(engine: Any) -> None:
    with pytest.raises(transfer.InvalidArgument, match="exactly one shape"):
        engine.expected_imms(engine.address)
    with pytest.raises(transfer.InvalidArgument, match="exactly one shape"):
        engine.expected_imms(engine.address, nbytes=1, barrier=True)
    assert engine.expected_imms(engine.address, nbytes=1) == 1
    with pytest.raises(transfer.InvalidArgument):
        engine.expected_imms(engine.address, nbytes=1, sender_group=3)


def test_timeouts(engine: Any, imm: int) -> None:
    with pytest.raises(transfer.TransferTimeout) as e:
        engine.wait_imm(imm, 1, timeout=0.05)
    assert e.value.kind == "timeout" and e.value.call == "wait_imm"
    with pytest.raises(transfer.InvalidArgument):
        engine.wait_imm(imm, 1, timeout=-1)
    # The withdrawn expectation does not swallow a later arrival.
    assert engine.imm_value(imm) == 0


def test_closed_engine(provider: str, peer: Peer) -> None:
    e = open_engine(provider)
    src = e.register(np.zeros(64, np.uint8))
    p = e.connect(peer.call("address"))
    _, desc = peer.call("register", 64)
    dst = p.remote(desc)
    pending = e.expect_imm(1, 1)
    e.start_recv_pool(4, 64)
    e.close()
    assert e.closed
    e.close()  # idempotent
    with pytest.raises(transfer.EngineShutdown):
        pending.wait(TIMEOUT)
    with pytest.raises(transfer.EngineShutdown):
        e.write(src, dst)
    with pytest.raises(transfer.EngineShutdown):
        e.register(np.zeros(64, np.uint8))
    with pytest.raises(transfer.EngineShutdown):
        e.recv(TIMEOUT)
    src.unregister()  # nothing left to unregister: no error
    with transfer.Engine(provider=provider, bind="127.0.0.1") as e2:
        assert not e2.closed
    assert e2.closed


def test_region_dropped_while_in_flight(engine: Any, peer: Peer, imm: int) -> None:
    dst = remote(engine, peer, 1 << 20)
    src = engine.register(np.ones(1 << 20, np.uint8))
    t = engine.write(src, dst, imm=imm)
    del src  # the transfer holds the region until it is dropped
    gc.collect()
    t.wait(TIMEOUT)
    peer.call("wait_write", imm, TIMEOUT, nbytes=1 << 20)
