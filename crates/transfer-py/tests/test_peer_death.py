"""A peer killed mid-stream: the survivor gets an error or a timeout, never
a hang or a crash, and its engine keeps working."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import transfer
from peers import PEER_TIMEOUT, Peer

TIMEOUT = 30.0


def test_sender_killed_mid_stream(engine: Any, provider: str, imm: int) -> None:
    """The peer streams writes into us; we wait per chunk; it dies."""
    buf = np.zeros(1 << 16, np.uint8)
    region = engine.register(buf)
    p = Peer(provider)
    try:
        p.call("connect", engine.address)
        src, _ = p.call("register", 1 << 16)
        dst = p.call("remote", region.descriptor)
        p.start("stream", src, dst, imm, 1 << 16, 1_000_000)
        engine.wait_imm(imm, 20, timeout=TIMEOUT)  # the stream is flowing
        p.kill()
        start = time.monotonic()
        # Arrivals stop: a big wait times out instead of hanging.
        try:
            engine.wait_imm(imm, 1_000_000_000, timeout=1.0)
        except transfer.TransferTimeout:
            pass
        assert time.monotonic() - start < 10
    finally:
        p.kill()
    # The survivor still works: a new peer writes into it.
    q = Peer(provider)
    try:
        q.call("connect", engine.address)
        src, _ = q.call("register", 64)
        dst = q.call("remote", region.descriptor)
        q.call("write", src, dst, nbytes=64, imm=imm + 1)
        engine.wait_imm(imm + 1, 1, timeout=TIMEOUT)
    finally:
        q.close()


def test_receiver_killed_mid_stream(engine: Any, provider: str, imm: int) -> None:
    """We stream writes into the peer; it dies; our writes fail in bounded time."""
    p = Peer(provider)
    try:
        p.call("connect", engine.address)
        _, desc = p.call("register", 1 << 16)
        dst = engine.connect(p.call("address")).remote(desc)
        src = engine.register(np.ones(1 << 16, np.uint8))
        for _ in range(20):
            engine.write(src, dst, imm=imm).wait(TIMEOUT)
        p.kill()
        start = time.monotonic()
        error = None
        # Within the peer timeout (plus slack) a write must fail.
        while time.monotonic() - start < PEER_TIMEOUT * 5 + 10:
            try:
                engine.write(src, dst, imm=imm).wait(TIMEOUT)
            except transfer.TransferError as e:
                error = e
                break
        assert error is not None, "writes to a dead peer kept succeeding"
        assert error.kind in ("peer_unreachable", "timeout", "backend", "remote_access"), error
        # Further writes fail too (fast), and nothing crashed.
        try:
            engine.write(src, dst, imm=imm).wait(TIMEOUT)
        except transfer.TransferError:
            pass
    finally:
        p.kill()


def test_async_waiter_survives_a_dead_sender(engine: Any, provider: str, imm: int) -> None:
    import asyncio

    region = engine.register(np.zeros(4096, np.uint8))
    p = Peer(provider)
    try:
        p.call("connect", engine.address)
        src, _ = p.call("register", 4096)
        dst = p.call("remote", region.descriptor)
        p.start("stream", src, dst, imm, 4096, 1_000_000)

        async def main() -> None:
            await asyncio.wait_for(engine.expect_imm(imm, 5), TIMEOUT)
            p.kill()
            try:
                await asyncio.wait_for(engine.expect_imm(imm, 1_000_000_000), 1.0)
            except TimeoutError:
                pass

        asyncio.run(main())
    finally:
        p.kill()
