"""Fixtures: this process's engine and a peer process, per provider."""

from __future__ import annotations

import faulthandler
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peers import Peer, open_engine

# Both must open on the CI host; a test that cannot open one fails.
PROVIDERS = os.environ.get("TRANSFER_PY_PROVIDERS", "tcp,shm").split(",")

_imms = itertools.count(1000)

# No test may hang CI: past this, dump every thread's stack and exit.
WATCHDOG_S = 240


SHM = Path("/dev/shm")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session", autouse=True)
def shm_hygiene() -> Iterator[None]:
    """libfabric's shm files outlive their processes (transfer-efa leaks
    the endpoints, a killed peer cannot clean up), 16 MiB each in
    /dev/shm: remove those this run created, once their process is gone
    (or is this one, at the end)."""
    before = set(os.listdir(SHM)) if SHM.is_dir() else set()
    yield
    if not SHM.is_dir():
        return
    me = os.getpid()
    for name in set(os.listdir(SHM)) - before:
        head = name.split("-", 1)[0]
        if not head.isdigit():
            continue
        pid = int(head)
        if pid == me or not _pid_alive(pid):
            (SHM / name).unlink(missing_ok=True)


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
