"""Fixtures: this process's engine and a peer process, per provider."""

from __future__ import annotations

import faulthandler
import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

from peers import Peer, open_engine

# Both must open on the CI host; a test that cannot open one fails.
PROVIDERS = os.environ.get("TRANSFER_PY_PROVIDERS", "tcp,shm").split(",")

_imms = itertools.count(1000)

# No test may hang CI: past this, dump every thread's stack and exit.
WATCHDOG_S = 240


@pytest.fixture(autouse=True)
def watchdog() -> Iterator[None]:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module", params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def engine(provider: str) -> Iterator[Any]:
    e = open_engine(provider)
    yield e
    e.close()


@pytest.fixture(scope="module")
def peer(provider: str, engine: Any) -> Iterator[Peer]:
    p = Peer(provider)
    p.call("connect", engine.address)
    yield p
    p.close()


@pytest.fixture
def imm() -> int:
    """A fresh immediate value, so tests sharing an engine never mix counts."""
    return next(_imms)
