"""Two NICs (domains) per engine on both sides: writes are sharded and
the receiver's count of immediates (`expected_imms`) matches the sender's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from peers import Peer, open_engine

TIMEOUT = 30.0
MiB = 1 << 20


@pytest.fixture(scope="module")
def pair(provider: str) -> Iterator[tuple[Any, Peer]]:
    e = open_engine(provider, nics=2)
    p = Peer(provider, nics=2)
    p.call("connect", e.address)
    yield e, p
    p.close()
    e.close()


@pytest.mark.parametrize("nbytes", [4096, 4 * MiB + 123])
def test_sharded_single_write(pair: tuple[Any, Peer], imm: int, nbytes: int) -> None:
    engine, peer = pair
    assert engine.nics == 2
    idx, desc = peer.call("register", nbytes)
    dst = engine.connect(peer.call("address")).remote(desc)
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    engine.write(engine.register(data), dst, imm=imm).wait(TIMEOUT)
    n = peer.call("expected_imms", nbytes=nbytes)
    if nbytes > MiB:
        assert n >= 1
    peer.call("wait_imm", imm, n, TIMEOUT)
    assert peer.call("read", idx) == data.tobytes()
    assert peer.call("imm_value", imm) == 0  # exactly the expected count arrived


def test_paged_write_over_two_nics(pair: tuple[Any, Peer], imm: int) -> None:
    engine, peer = pair
    page, n = 8192, 40
    idx, desc = peer.call("register", n * page)
    dst = engine.connect(peer.call("address")).remote(desc)
    data = np.random.default_rng(1).integers(0, 256, n * page, dtype=np.uint8)
    pages = np.arange(n, dtype=np.uint32)[::-1].copy()
    engine.write_paged(engine.register(data), pages, dst, np.arange(n, dtype=np.uint32), page,
                       imm=imm).wait(TIMEOUT)
    count = peer.call("expected_imms", pages=n, page_len=page)
    peer.call("wait_imm", imm, count, TIMEOUT)
    got = np.frombuffer(peer.call("read", idx), dtype=np.uint8).reshape(n, page)
    assert (got == data.reshape(n, page)[pages]).all()
    assert peer.call("imm_value", imm) == 0


def test_batch_rows_over_two_nics(pair: tuple[Any, Peer], imm: int) -> None:
    """Adjacent rows of one batch, split into a contiguous run per NIC:
    every byte lands and exactly the expected immediates arrive."""
    engine, peer = pair
    row, n = 4096, 64
    idx, desc = peer.call("register", n * row)
    dst = engine.connect(peer.call("address")).remote(desc)
    data = np.random.default_rng(2).integers(0, 256, n * row, dtype=np.uint8)
    rows = np.zeros((n, 3), np.uint64)
    rows[:, 0] = np.arange(n, dtype=np.uint64) * row
    rows[:, 1] = rows[:, 0]
    rows[:, 2] = row
    engine.write_batch(engine.register(data), dst, rows, imm=imm).wait(TIMEOUT)
    count = n * peer.call("expected_imms", nbytes=row)
    peer.call("wait_imm", imm, count, TIMEOUT)
    assert peer.call("read", idx) == data.tobytes()
    assert peer.call("imm_value", imm) == 0


def test_default_endpoints(provider: str) -> None:
    """Two endpoints (a connection each per peer) on tcp by default, one on
    shm; a default engine talks to a one-endpoint peer."""
    e = open_engine(provider, nics=None)
    try:
        assert e.nics == (2 if provider == "tcp" else 1)
        p = Peer(provider, nics=1)
        try:
            p.call("connect", e.address)
            nbytes = 3 * MiB + 5
            idx, desc = p.call("register", nbytes)
            dst = e.connect(p.call("address")).remote(desc)
            data = np.random.default_rng(3).integers(0, 256, nbytes, dtype=np.uint8)
            e.write(e.register(data), dst, imm=7).wait(TIMEOUT)
            p.call("wait_imm", 7, p.call("expected_imms", nbytes=nbytes), TIMEOUT)
            assert p.call("read", idx) == data.tobytes()
        finally:
            p.close()
    finally:
        e.close()
