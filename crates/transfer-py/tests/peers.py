"""A peer process for the tests: an engine in a child process (spawned, not
forked) that runs commands sent over a pipe, so that every test moves bytes
between two real processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Any

import numpy as np

# Small enough to keep the suite quick on two shared cores.
PEER_TIMEOUT = 2.0
CALL_TIMEOUT = 60.0


def open_engine(provider: str, nics: int | None = 1) -> Any:
    """An engine on `provider` bound to loopback; `nics=None`: the
    engine's default (two endpoints on tcp, one on shm)."""
    import transfer

    return transfer.Engine(
        provider=provider, nics=nics, bind="127.0.0.1", peer_timeout=PEER_TIMEOUT
    )


class _Server:
    """Runs in the child."""

    def __init__(self, provider: str, nics: int) -> None:
        self.engine = open_engine(provider, nics)
        self.arrays: list[np.ndarray] = []
        self.regions: list[Any] = []
        self.remotes: list[Any] = []
        self.peer: Any = None

    # -- commands ----------------------------------------------------
    def address(self) -> bytes:
        return self.engine.address

    def register(self, nbytes: int) -> tuple[int, bytes]:
        arr = np.zeros(nbytes, dtype=np.uint8)
        region = self.engine.register(arr)
        self.arrays.append(arr)
        self.regions.append(region)
        return len(self.regions) - 1, region.descriptor

    def fill(self, idx: int, data: bytes) -> None:
        self.arrays[idx][:] = np.frombuffer(data, dtype=np.uint8)

    def read(self, idx: int) -> bytes:
        return self.arrays[idx].tobytes()

    def connect(self, address: bytes) -> None:
        self.peer = self.engine.connect(address)

    def remote(self, descriptor: bytes) -> int:
        self.remotes.append(self.peer.remote(descriptor))
        return len(self.remotes) - 1

    def write(self, src: int, dst: int, **kw: Any) -> None:
        self.engine.write(self.regions[src], self.remotes[dst], **kw).wait(CALL_TIMEOUT)

    def stream(self, src: int, dst: int, imm: int, nbytes: int, count: int) -> None:
        """Writes `count` times, waiting for each; killed mid-way by the test."""
        for _ in range(count):
            self.engine.write(self.regions[src], self.remotes[dst], nbytes=nbytes, imm=imm).wait(
                CALL_TIMEOUT
            )

    def send(self, data: bytes) -> None:
        self.engine.send(self.peer, data).wait(CALL_TIMEOUT)

    def start_recv_pool(self, count: int, size: int) -> None:
        self.engine.start_recv_pool(count, size)

    def recv(self, timeout: float) -> bytes:
        return self.engine.recv(timeout)

    def expected_imms(self, **shape: Any) -> int:
        return self.engine.expected_imms(self.peer, **shape)

    def wait_imm(self, imm: int, count: int, timeout: float) -> None:
        self.engine.wait_imm(imm, count, timeout)

    def wait_write(self, imm: int, timeout: float, **shape: Any) -> None:
        """Waits for one logical transfer of `shape` from the test process."""
        self.engine.wait_imm(imm, self.engine.expected_imms(self.peer, **shape), timeout)

    def imm_value(self, imm: int) -> int:
        return self.engine.imm_value(imm)


def _serve(conn: Any, provider: str, nics: int) -> None:
    try:
        server = _Server(provider, nics)
    except BaseException as e:  # reported to the test, which fails with it
        conn.send(("err", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        name, args, kwargs = msg
        if name == "exit":
            server.engine.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(server, name)(*args, **kwargs)))
        except BaseException as e:
            kind = getattr(e, "kind", None)
            conn.send(("err", (type(e).__name__, kind, str(e), traceback.format_exc())))


class PeerError(Exception):
    """A command failed in the peer: `.name` (exception class), `.kind`."""

    def __init__(self, name: str, kind: str | None, message: str, tb: str) -> None:
        super().__init__(f"{name}({kind}): {message}\n{tb}")
        self.name = name
        self.kind = kind


class Peer:
    """The test side of a peer process."""

    def __init__(self, provider: str, nics: int = 1) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, provider, nics), daemon=True)
        self.proc.start()
        child.close()
        status, value = self._reply(CALL_TIMEOUT)
        if status != "ok":
            self.kill()
            raise RuntimeError(f"peer failed to start: {value}")

    def _reply(self, timeout: float) -> tuple[str, Any]:
        try:
            if not self.conn.poll(timeout):
                self.kill()
                raise TimeoutError(f"peer did not answer within {timeout} s")
            return self.conn.recv()
        except (EOFError, OSError) as e:
            raise RuntimeError(f"peer process exited (code {self.proc.exitcode})") from e

    def call(self, name: str, *args: Any, timeout: float = CALL_TIMEOUT, **kwargs: Any) -> Any:
        self.conn.send((name, args, kwargs))
        status, value = self._reply(timeout)
        if status != "ok":
            raise PeerError(*value)
        return value

    def start(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Sends a command without waiting for its reply (see `finish`)."""
        self.conn.send((name, args, kwargs))

    def finish(self, timeout: float = CALL_TIMEOUT) -> Any:
        status, value = self._reply(timeout)
        if status != "ok":
            raise PeerError(*value)
        return value

    def kill(self) -> None:
        if self.proc.is_alive() and self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("exit", timeout=10)
            except (OSError, EOFError, TimeoutError):
                pass
        self.proc.join(10)
        self.kill()


def wait_until(cond: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()
