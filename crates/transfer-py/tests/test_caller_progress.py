"""Caller-driven progress (`Engine(progress="caller")`): no worker threads;
waits, `done()`, `recv` and `progress()` drive the NICs on the calling
thread. Two engines in this process (the receiver driven by a Python
thread of its own, as a separate process would be), checked byte for byte."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import transfer
from peers import PEER_TIMEOUT

TIMEOUT = 30.0
N = 1 << 16


def _engine(provider: str, progress: str) -> Any:
    return transfer.Engine(
        provider=provider, bind="127.0.0.1", peer_timeout=PEER_TIMEOUT, progress=progress
    )


class Side:
    def __init__(self, provider: str, progress: str) -> None:
        self.eng = _engine(provider, progress)
        self.buf = np.zeros(N, dtype=np.uint8)
        self.region = self.eng.register(self.buf)


@pytest.fixture(scope="module")
def pair(provider: str) -> Iterator[tuple[Side, Side]]:
    """(sender, receiver), both caller-driven."""
    a, b = Side(provider, "caller"), Side(provider, "caller")
    yield a, b
    a.eng.close()
    b.eng.close()


def _dst(a: Side, b: Side) -> Any:
    return a.eng.connect(b.eng.address).remote(b.region.descriptor)


def _in_thread(f: Callable[[], None]) -> Callable[[], None]:
    """Runs `f` on a thread; the returned join re-raises its error."""
    err: list[BaseException] = []

    def run() -> None:
        try:
            f()
        except BaseException as e:  # noqa: BLE001 - handed to the joiner
            err.append(e)

    t = threading.Thread(target=run)
    t.start()

    def join() -> None:
        t.join(TIMEOUT)
        assert not t.is_alive(), "the receiver's wait never returned"
        if err:
            raise err[0]

    return join


def test_modes_and_refusals(provider: str) -> None:
    with _engine(provider, "thread") as e:
        assert e.progress_mode == "thread"
        assert e.progress() is False
    with pytest.raises(transfer.TransferError, match="progress"):
        _engine(provider, "worker")
    with pytest.raises(transfer.TransferError, match="busy_poll"):
        transfer.Engine(provider=provider, bind="127.0.0.1", busy_poll=True, progress="caller")


def test_write_batch_paged_and_imm_waits(pair: tuple[Side, Side], provider: str) -> None:
    a, b = pair
    assert a.eng.progress_mode == "caller"
    dst = _dst(a, b)
    rng = np.random.default_rng(7)
    a.buf[:] = rng.integers(0, 256, N, dtype=np.uint8)
    sender = b.eng.connect(a.eng.address)

    # One 8 B write; the receiver's wait_imm drives it (its own thread).
    n1 = b.eng.expected_imms(sender, nbytes=8)
    join = _in_thread(lambda: b.eng.wait_imm(11, n1, timeout=TIMEOUT))
    a.eng.write(a.region, dst, src_offset=8, dst_offset=8, nbytes=8, imm=11).wait(TIMEOUT)
    join()
    assert (b.buf[8:16] == a.buf[8:16]).all() and not b.buf[:8].any()

    # write_batch: three rows, one completion.
    rows = np.array([[1024, 1024, 512], [4096, 8192, 100], [20000, 30000, 4000]], dtype=np.int64)
    n2 = sum(b.eng.expected_imms(sender, nbytes=int(r[2])) for r in rows)
    join = _in_thread(lambda: b.eng.wait_imm(12, n2, timeout=TIMEOUT))
    t = a.eng.write_batch(a.region, dst, rows, imm=12)
    t.wait(TIMEOUT)
    assert t.done() and t.exception() is None
    join()
    for s, d, n in rows:
        assert (b.buf[d : d + n] == a.buf[s : s + n]).all()

    # write_paged: 8 pages of 1 KiB, scattered; the receiver polls
    # progress() + take_imm itself instead of blocking.
    page = 1024
    src_pages = np.array([40, 41, 42, 43, 50, 51, 52, 53], dtype=np.int64)
    dst_pages = np.array([3, 9, 1, 7, 60, 61, 62, 63], dtype=np.int64)
    n3 = b.eng.expected_imms(sender, pages=8, page_len=page)
    got = 0

    def poll() -> None:
        nonlocal got
        end = time.monotonic() + TIMEOUT
        while got < n3 and time.monotonic() < end:
            b.eng.progress()
            got += b.eng.take_imm(13, n3 - got)

    join = _in_thread(poll)
    t = a.eng.write_paged(a.region, src_pages, dst, dst_pages, page, imm=13)
    end = time.monotonic() + TIMEOUT
    while not t.done() and time.monotonic() < end:
        pass
    t.wait(0)
    join()
    assert got == n3
    for s, d in zip(src_pages, dst_pages, strict=True):
        assert (b.buf[d * page : (d + 1) * page] == a.buf[s * page : (s + 1) * page]).all()


def test_deadline_expires_cleanly(pair: tuple[Side, Side]) -> None:
    a, b = pair
    t0 = time.monotonic()
    with pytest.raises(transfer.TransferTimeout):
        b.eng.wait_imm(77, 1, timeout=0.05)
    assert time.monotonic() - t0 < TIMEOUT
    pending = b.eng.expect_imm(78)
    with pytest.raises(transfer.TransferTimeout):
        pending.wait(0.05)
    assert not pending.done()
    # The withdrawn wait left nothing behind: an arrival after it counts.
    join = _in_thread(lambda: b.eng.wait_imm(77, 1, timeout=TIMEOUT))
    a.eng.barrier(_dst(a, b), 77).wait(TIMEOUT)
    join()
    assert pending.cancel()


def test_thread_sender_caller_receiver_and_recv(provider: str) -> None:
    """Mixed modes interoperate; `recv` on a caller-driven engine drives it."""
    a, b = Side(provider, "thread"), Side(provider, "caller")
    try:
        b.eng.start_recv_pool(4, 256)
        a.buf[:64] = 5
        # Nothing moves the caller-driven receiver but its own waits: the
        # sender's completion needs them (rxm's and shm's acknowledgements).
        n = b.eng.expected_imms(a.eng.address, nbytes=64)
        join = _in_thread(lambda: b.eng.wait_imm(21, n, timeout=TIMEOUT))
        a.eng.write(a.region, _dst(a, b), nbytes=64, imm=21).wait(TIMEOUT)
        join()
        assert (b.buf[:64] == 5).all()
        got: list[bytes] = []
        join = _in_thread(lambda: got.append(b.eng.recv(TIMEOUT)))
        a.eng.send(a.eng.connect(b.eng.address), b"hello").wait(TIMEOUT)
        join()
        assert got == [b"hello"]
        with pytest.raises(transfer.TransferTimeout):
            b.eng.recv(0.02)
    finally:
        a.eng.close()
        b.eng.close()


def test_asyncio_awaits_drive(pair: tuple[Side, Side]) -> None:
    """`await` on caller-driven transfers: each poll drives a pass and the
    loop comes back (a busy-polling future); both sides in one loop."""
    a, b = pair
    a.buf[100:164] = 9

    async def main() -> None:
        exp = b.eng.expect_imm(31, b.eng.expected_imms(a.eng.address, nbytes=64))
        t = a.eng.write(a.region, _dst(a, b), src_offset=100, dst_offset=100, nbytes=64, imm=31)
        await asyncio.wait_for(asyncio.gather(t, exp), TIMEOUT)

    asyncio.run(main())
    assert (b.buf[100:164] == 9).all()
