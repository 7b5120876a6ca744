"""Every operation between two real processes, checked byte for byte."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import transfer
from peers import Peer

MiB = 1 << 20
TIMEOUT = 30.0


def random_bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def remote(engine: Any, peer: Peer, nbytes: int) -> tuple[int, transfer.RemoteRegion]:
    idx, desc = peer.call("register", nbytes)
    return idx, engine.connect(peer.call("address")).remote(desc)


def test_engine_properties(engine: Any, provider: str) -> None:
    assert isinstance(engine.address, bytes) and len(engine.address) > 0
    assert provider in engine.provider
    assert engine.backend == "libfabric"
    assert engine.nics == 1
    assert not engine.closed
    assert "Engine" in repr(engine)


@pytest.mark.parametrize("nbytes", [1, 4096, 3 * MiB + 17])
def test_single_write(engine: Any, peer: Peer, imm: int, nbytes: int) -> None:
    idx, dst = remote(engine, peer, nbytes)
    data = random_bytes(nbytes, nbytes)
    src = engine.register(data)
    t = engine.write(src, dst, imm=imm)
    t.wait(TIMEOUT)
    assert t.done() and t.exception() is None
    peer.call("wait_write", imm, TIMEOUT, nbytes=nbytes)
    assert peer.call("read", idx) == data.tobytes()


def test_write_offsets_leave_the_rest(engine: Any, peer: Peer, imm: int) -> None:
    idx, dst = remote(engine, peer, 8192)
    data = random_bytes(8192, 1)
    src = engine.register(data)
    engine.write(src, dst, src_offset=100, dst_offset=5000, nbytes=3000, imm=imm).wait(TIMEOUT)
    peer.call("wait_write", imm, TIMEOUT, nbytes=3000)
    got = np.frombuffer(peer.call("read", idx), dtype=np.uint8)
    assert (got[5000:8000] == data[100:3100]).all()
    assert not got[:5000].any() and not got[8000:].any()


def test_immediate_only_write(engine: Any, peer: Peer, imm: int) -> None:
    _, dst = remote(engine, peer, 64)
    src = engine.register(np.zeros(64, np.uint8))
    engine.write(src, dst, nbytes=0, imm=imm).wait(TIMEOUT)
    peer.call("wait_imm", imm, 1, TIMEOUT)


@pytest.mark.parametrize(
    "make_pages",
    [
        lambda p: np.asarray(p, dtype=np.uint32),
        lambda p: np.asarray(p, dtype=np.int64),
        lambda p: np.asarray(p, dtype=np.int32),
        list,
        lambda p: memoryview(np.asarray(p, dtype=np.uint32)),
    ],
    ids=["uint32", "int64", "int32", "list", "memoryview"],
)
def test_paged_write(engine: Any, peer: Peer, imm: int, make_pages: Any) -> None:
    page, n_src, n_dst = 1024, 64, 48
    idx, dst = remote(engine, peer, n_dst * page)
    data = random_bytes(n_src * page, 7)
    src = engine.register(data)
    rng = np.random.default_rng(3)
    src_pages = rng.choice(n_src, 20, replace=False)
    dst_pages = rng.choice(n_dst, 20, replace=False)
    engine.write_paged(
        src, make_pages(src_pages), dst, make_pages(dst_pages), page, imm=imm
    ).wait(TIMEOUT)
    peer.call("wait_write", imm, TIMEOUT, pages=20)
    got = np.frombuffer(peer.call("read", idx), dtype=np.uint8).reshape(n_dst, page)
    want = np.zeros((n_dst, page), np.uint8)
    want[dst_pages] = data.reshape(n_src, page)[src_pages]
    assert (got == want).all()


def test_paged_write_with_strides_and_offsets(engine: Any, peer: Peer, imm: int) -> None:
    # Layer-major KV layout: page p of layer l at l * layer_bytes + p * stride.
    page, stride, layers, pages = 256, 512, 3, 8
    layer_bytes = pages * stride
    idx, dst = remote(engine, peer, layers * layer_bytes)
    data = random_bytes(layers * layer_bytes, 11)
    src = engine.register(data)
    ids = np.array([5, 0, 7], np.uint32)
    for layer in range(layers):
        off = layer * layer_bytes
        engine.write_paged(
            src, ids, dst, ids, page, src_stride=stride, dst_stride=stride,
            src_offset=off, dst_offset=off, imm=imm,
        ).wait(TIMEOUT)
    peer.call("wait_write", imm, TIMEOUT, pages=3)
    got = np.frombuffer(peer.call("read", idx), dtype=np.uint8)
    want = np.zeros_like(data)
    for layer in range(layers):
        for p in ids:
            s = layer * layer_bytes + int(p) * stride
            want[s : s + page] = data[s : s + page]
    assert (got == want).all()


def test_scatter(engine: Any, peer: Peer, imm: int) -> None:
    i1, d1 = remote(engine, peer, 4096)
    i2, d2 = remote(engine, peer, 4096)
    data = random_bytes(8192, 5)
    src = engine.register(data)
    engine.scatter(src, [(d1, 0, 96, 1000), (d2, 4096, 0, 4096)], imm=imm).wait(TIMEOUT)
    n = peer.call("expected_imms", nbytes=1000) + peer.call("expected_imms", nbytes=4096)
    peer.call("wait_imm", imm, n, TIMEOUT)
    got1 = np.frombuffer(peer.call("read", i1), dtype=np.uint8)
    got2 = np.frombuffer(peer.call("read", i2), dtype=np.uint8)
    assert (got1[96:1096] == data[:1000]).all() and not got1[:96].any()
    assert (got2 == data[4096:]).all()


def test_barrier_two_peers(engine: Any, peer: Peer, provider: str, imm: int) -> None:
    other = Peer(provider)
    try:
        other.call("connect", engine.address)
        _, d1 = remote(engine, peer, 64)
        _, d2 = remote(engine, other, 64)
        engine.barrier([d1, d2], imm).wait(TIMEOUT)
        for p in (peer, other):
            assert p.call("expected_imms", barrier=True) == 1
            p.call("wait_imm", imm, 1, TIMEOUT)
        engine.barrier(d1, imm).wait(TIMEOUT)  # one target, no list
        peer.call("wait_imm", imm, 1, TIMEOUT)
    finally:
        other.close()


def test_peer_writes_here(engine: Any, peer: Peer, imm: int) -> None:
    """The other direction: the peer writes, this process waits on immediates."""
    buf = bytearray(65536)
    region = engine.register(buf)
    assert region.obj is buf and region.nbytes == 65536
    src_idx, _ = peer.call("register", 65536)
    data = random_bytes(65536, 9)
    peer.call("fill", src_idx, data.tobytes())
    dst = peer.call("remote", region.descriptor)
    sender = engine.connect(peer.call("address"))
    expect = engine.expect_imm(imm, engine.expected_imms(sender, nbytes=65536))
    assert expect.cancellable and not expect.done()
    peer.call("write", src_idx, dst, imm=imm)
    expect.wait(TIMEOUT)
    assert bytes(buf) == data.tobytes()


def test_messages_both_ways(engine: Any, peer: Peer) -> None:
    engine.start_recv_pool(16, 4096)
    peer.call("start_recv_pool", 16, 4096)
    here = engine.connect(peer.call("address"))
    msgs = [b"", b"x", bytes(range(256)) * 16]
    for m in msgs:
        engine.send(here, m).wait(TIMEOUT)
        assert peer.call("recv", TIMEOUT) == m
    for m in msgs:
        peer.call("send", m)
        assert engine.recv(TIMEOUT) == m
    assert engine.try_recv() is None
    engine.send(here, bytearray(b"bytearray too")).wait(TIMEOUT)
    assert peer.call("recv", TIMEOUT) == b"bytearray too"
    with pytest.raises(transfer.TransferTimeout):
        engine.recv(0.05)
    # asyncio receive
    async def main() -> bytes:
        task = asyncio.ensure_future(engine.recv_async())
        await asyncio.sleep(0.05)
        assert not task.done()
        peer.start("send", b"async")
        msg = await asyncio.wait_for(task, TIMEOUT)
        peer.finish()
        return msg

    assert asyncio.run(main()) == b"async"

    # Receives cancelled by their timeout leave nothing registered (each
    # used to keep a notifier until the next message arrived).
    async def timed_out() -> None:
        for _ in range(200):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(engine.recv_async(), 0.001)

    asyncio.run(timed_out())
    assert engine._recv_notifiers() == 0


def test_asyncio(engine: Any, peer: Peer, imm: int) -> None:
    buf = np.zeros(3 * 4096, np.uint8)
    region = engine.register(buf)
    src_idx, _ = peer.call("register", 3 * 4096)
    data = random_bytes(3 * 4096, 13)
    peer.call("fill", src_idx, data.tobytes())
    dst = peer.call("remote", region.descriptor)
    sender = engine.connect(peer.call("address"))
    n = engine.expected_imms(sender, nbytes=4096)
    _, my_dst = remote(engine, peer, 4096)
    my_src = engine.register(random_bytes(4096, 14))

    async def main() -> None:
        # Three layers, awaited concurrently, each on its own immediate.
        waits = [engine.expect_imm(imm + i, n) for i in range(3)]
        for i in range(3):
            peer.start("write", src_idx, dst, src_offset=i * 4096, dst_offset=i * 4096,
                       nbytes=4096, imm=imm + i)
            await asyncio.sleep(0)
            peer.finish()
        await asyncio.wait_for(asyncio.gather(*waits), TIMEOUT)
        # Await our own write.
        await engine.write(my_src, my_dst)
        # A timed-out expectation is withdrawn: the next arrival goes to the
        # next expectation, not to the abandoned one.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(engine.expect_imm(imm + 10, 1), 0.1)
        later = engine.expect_imm(imm + 10, 1)
        peer.call("write", src_idx, dst, nbytes=0, imm=imm + 10)
        await asyncio.wait_for(later, TIMEOUT)

    asyncio.run(main())
    assert (buf == data).all()
    assert engine.imm_value(imm + 10) == 0


def test_blocking_wait_releases_the_gil(engine: Any, peer: Peer, imm: int) -> None:
    import threading

    t = engine.expect_imm(imm, 1)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    th = threading.Thread(target=spin)
    th.start()
    with pytest.raises(transfer.TransferTimeout):
        t.wait(0.3)
    stop.set()
    th.join()
    assert ticks > 1000  # the other thread ran while we waited
    assert t.cancel() and not t.cancel()
    with pytest.raises(transfer.TransferError) as e:
        t.wait(0)
    assert e.value.kind == "cancelled"


def test_take_imm_polling(engine: Any, peer: Peer, imm: int) -> None:
    region = engine.register(np.zeros(64, np.uint8))
    src_idx, _ = peer.call("register", 64)
    dst = peer.call("remote", region.descriptor)
    for _ in range(3):
        peer.call("write", src_idx, dst, nbytes=0, imm=imm)
    from peers import wait_until

    assert wait_until(lambda: engine.imm_value(imm) == 3, TIMEOUT)
    assert engine.take_imm(imm, 2) == 2
    assert engine.take_imm(imm, 5) == 1
    assert engine.imm_dropped == 0


def test_threads_submit_concurrently(engine: Any, peer: Peer, imm: int) -> None:
    """Many Python threads share one engine; every byte lands."""
    import threading

    threads, writes, chunk = 4, 25, 2048
    idx, dst = remote(engine, peer, threads * writes * chunk)
    data = random_bytes(threads * writes * chunk, 21)
    src = engine.register(data)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            pending = []
            for w in range(writes):
                off = (t * writes + w) * chunk
                pending.append(engine.write(src, dst, src_offset=off, dst_offset=off,
                                            nbytes=chunk, imm=imm))
            for p in pending:
                p.wait(TIMEOUT)
        except BaseException as e:
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert not errors, errors
    per_write = peer.call("expected_imms", nbytes=chunk)
    peer.call("wait_imm", imm, threads * writes * per_write, TIMEOUT)
    assert peer.call("read", idx) == data.tobytes()


@pytest.mark.parametrize(
    "make_rows",
    [
        lambda r: np.asarray(r, dtype=np.uint64),
        lambda r: np.asarray(r, dtype=np.int64).reshape(-1),
        lambda r: np.asarray(r, dtype=np.int32),
        lambda r: [tuple(int(x) for x in row) for row in r],
    ],
    ids=["uint64", "int64-flat", "int32", "tuples"],
)
def test_write_batch_one_region(engine: Any, peer: Peer, imm: int, make_rows: Any) -> None:
    idx, dst = remote(engine, peer, 16384)
    data = random_bytes(16384, 9)
    src = engine.register(data)
    rows = [(0, 8192, 100), (4096, 0, 4096), (12000, 13000, 3000)]
    t = engine.write_batch(src, dst, make_rows(rows), imm=imm)
    t.wait(TIMEOUT)
    assert t.done() and t.exception() is None
    n = sum(peer.call("expected_imms", nbytes=r[2]) for r in rows)
    peer.call("wait_imm", imm, n, TIMEOUT)
    got = np.frombuffer(peer.call("read", idx), dtype=np.uint8)
    want = np.zeros(16384, np.uint8)
    for s, d, n_ in rows:
        want[d : d + n_] = data[s : s + n_]
    assert (got == want).all()


def test_write_batch_several_regions(engine: Any, peer: Peer, imm: int) -> None:
    # Zero-copy from several buffers (numpy, bytearray) in one call.
    idx, dst = remote(engine, peer, 8192)
    a = random_bytes(4096, 1)
    b = bytearray(random_bytes(4096, 2).tobytes())
    ra, rb = engine.register(a), engine.register(b)
    engine.write_batch(
        [ra, rb], dst, [np.array([[0, 0, 2048]], np.uint64), [(2048, 2048, 2048), (0, 4096, 4096)]],
        imm=imm,
    ).wait(TIMEOUT)
    n = sum(peer.call("expected_imms", nbytes=k) for k in (2048, 2048, 4096))
    peer.call("wait_imm", imm, n, TIMEOUT)
    got = np.frombuffer(peer.call("read", idx), dtype=np.uint8)
    bb = np.frombuffer(bytes(b), np.uint8)
    assert (got[:2048] == a[:2048]).all()
    assert (got[2048:4096] == bb[2048:4096]).all()
    assert (got[4096:] == bb).all()


def test_write_batch_refuses_bad_rows(engine: Any, peer: Peer) -> None:
    _, dst = remote(engine, peer, 4096)
    src = engine.register(np.zeros(4096, np.uint8))
    with pytest.raises(transfer.InvalidArgument):
        engine.write_batch(src, dst, np.zeros((2, 2), np.uint64))
    with pytest.raises(transfer.InvalidArgument):
        engine.write_batch(src, dst, np.array([[0, 0, -1]], np.int64))
    with pytest.raises(transfer.InvalidArgument):
        engine.write_batch(src, dst, np.zeros((0, 3), np.uint64))
    with pytest.raises(transfer.InvalidArgument):
        engine.write_batch([src], dst, [])
    with pytest.raises(transfer.TransferError):
        # Past the destination's end: refused by the engine at submit.
        engine.write_batch(src, dst, [(0, 4000, 200)]).wait(TIMEOUT)


class DLPackOnly:
    """Host memory seen only through DLPack, as a torch CPU tensor is (no
    buffer protocol): numpy's own `__dlpack__` (numpy >= 1.22) gives the
    same kind of capsule torch does, so this takes torch's path without
    torch in the test venv."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kw: Any) -> Any:
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self.a.__dlpack_device__()


def test_register_dlpack_is_zero_copy(engine: Any, peer: Peer, imm: int) -> None:
    a = random_bytes(8192, 11).view(np.float32).reshape(32, 64)
    r = engine.register(DLPackOnly(a))
    assert r.nbytes == a.nbytes and r.ptr == a.ctypes.data
    # A contiguous slice: its first byte, its length.
    tail = a[8:]
    r2 = engine.register(DLPackOnly(tail))
    assert r2.nbytes == tail.nbytes and r2.ptr == tail.ctypes.data
    idx, dst = remote(engine, peer, 8192)
    engine.write(r, dst, imm=imm).wait(TIMEOUT)
    peer.call("wait_imm", imm, peer.call("expected_imms", nbytes=8192), TIMEOUT)
    assert peer.call("read", idx) == a.tobytes()


@pytest.mark.parametrize("kind", ["dlpack", "numpy", "bytes"])
def test_write_batch_from_unregistered_memory(engine: Any, peer: Peer, imm: int, kind: str) -> None:
    import gc
    import weakref

    idx, dst = remote(engine, peer, 16384)
    data = random_bytes(16384, 21)
    want = np.zeros(16384, np.uint8)
    rows = [(0, 8192, 4096), (4096, 0, 8192), (15000, 15000, 1384)]
    for s, d, n in rows:
        want[d : d + n] = data[s : s + n]
    # The call's only reference to the memory is the argument: the transfer
    # keeps it (the capsule and its exporter) until it is dropped.
    src: Any = {"dlpack": lambda: DLPackOnly(data.copy()), "numpy": data.copy, "bytes": data.tobytes}[kind]()
    alive = weakref.ref(src) if kind == "dlpack" else None
    t = engine.write_batch(src, dst, np.asarray(rows, np.uint64), imm=imm)
    del src
    gc.collect()
    if alive is not None:
        assert alive() is not None
    t.wait(TIMEOUT)
    n = sum(peer.call("expected_imms", nbytes=r[2]) for r in rows)
    peer.call("wait_imm", imm, n, TIMEOUT)
    assert peer.call("read", idx) == want.tobytes()
    del t
    gc.collect()
    if alive is not None:
        assert alive() is None  # unregistered and released with the transfer


def test_dlpack_refusals(engine: Any, peer: Peer) -> None:
    _, dst = remote(engine, peer, 4096)
    a = np.zeros((64, 64), np.uint8)
    with pytest.raises(transfer.InvalidArgument, match="C-contiguous"):
        engine.register(DLPackOnly(a[:, ::2]))
    with pytest.raises(transfer.InvalidArgument, match="C-contiguous"):
        engine.write_batch(DLPackOnly(a.T), dst, [(0, 0, 64)])
    with pytest.raises(transfer.InvalidArgument, match="empty"):
        engine.register(DLPackOnly(np.zeros((0, 4), np.float32)))

    class CudaTensor:
        def __dlpack__(self, **kw: Any) -> Any:
            raise AssertionError("a device tensor must be refused before it exports")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)  # kDLCUDA

    with pytest.raises(transfer.InvalidArgument, match="GPU memory is not supported"):
        engine.write_batch(CudaTensor(), dst, [(0, 0, 64)])

    class NotACapsule:
        def __dlpack__(self, **kw: Any) -> Any:
            return b"no capsule"

    with pytest.raises(transfer.InvalidArgument, match="no capsule"):
        engine.register(NotACapsule())
    with pytest.raises(transfer.InvalidArgument, match="src must be"):
        engine.write_batch((a.ctypes.data, 64, "cpu"), dst, [(0, 0, 64)])
