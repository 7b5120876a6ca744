"""NVIDIA NIXL (PyPI `nixl`, UCX backend) behind the peers bench's adapter
interface. Two configurations:

- "thread": NIXL's default, the agent's progress thread on;
- "caller": progress thread off; the caller drives UCX by polling
  (`check_xfer_state`, `get_new_notifs`), and an idle target keeps polling
  too (one busy core per process), which UCX over tcp needs to complete
  one-sided writes.

UCX_TLS selects the transport (tcp, or sm for shared memory); sm needs
the UCX backend's `ucx_error_handling_mode=none` (UCX's sysv/posix
transports have no peer-failure handling, and NIXL's default "peer" mode
refuses them), set for both transports so they compare.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import numpy as np

os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t  # noqa: E402

SYNC = getattr(nixl_thread_sync_t, os.environ.get("PEERS_NIXL_SYNC", "NIXL_THREAD_SYNC_STRICT"))

TIMEOUT_S = float(os.environ.get("PEERS_TIMEOUT_S", "60"))


class Adapter:
    name = "nixl"

    def __init__(self, transport: str, mode: str, buf: np.ndarray) -> None:
        self.mode = mode
        self.thread = mode != "caller"
        tls = os.environ.get("UCX_TLS", "")
        self.agent = nixl_agent(
            f"{mode}-{os.getpid()}",
            nixl_agent_config(enable_prog_thread=self.thread, backends=[], sync_mode=SYNC),
        )
        self.agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
        self.buf = buf
        self.base = buf.ctypes.data
        self.reg = self.agent.register_memory([(self.base, buf.nbytes, 0, "")], "DRAM")
        self.remote = ""
        self.rbase = 0
        self.handles: dict[Any, Any] = {}
        self.notifs: Counter[bytes] = Counter()
        self.config = (
            f"NIXL 1.5.1 UCX backend, UCX_TLS={tls}, "
            + (
                "progress thread on (default)"
                if self.thread
                else "progress thread off, caller polls, idle target polls (one core each)"
            )
            + ", ucx_error_handling_mode=none, make_prepped_xfer / reposted handles, "
            "receiver polls get_new_notifs"
        )

    def info(self) -> dict[str, Any]:
        return {"md": self.agent.get_agent_metadata(), "base": self.base}

    def connect(self, info: dict[str, Any]) -> None:
        name = self.agent.add_remote_agent(info["md"])
        self.remote = name.decode() if isinstance(name, bytes) else name
        self.rbase = int(info["base"])
        self.agent.make_connection(self.remote)

    def prep_pages(self, page_len: int, local_off: int, n_local: int, remote_off: int, n_remote: int) -> None:
        loc = np.zeros((n_local, 3), np.uint64)
        loc[:, 0] = self.base + local_off + np.arange(n_local, dtype=np.uint64) * page_len
        loc[:, 1] = page_len
        rem = np.zeros((n_remote, 3), np.uint64)
        rem[:, 0] = self.rbase + remote_off + np.arange(n_remote, dtype=np.uint64) * page_len
        rem[:, 1] = page_len
        self.lp = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", loc, "DRAM")
        self.rp = self.agent.prep_xfer_dlist(self.remote, rem, "DRAM")

    def _descs(self, rows: np.ndarray) -> tuple[Any, Any]:
        rows = np.asarray(rows, np.uint64)
        loc = np.zeros((len(rows), 3), np.uint64)
        loc[:, 0] = self.base + rows[:, 0]
        loc[:, 1] = rows[:, 2]
        rem = np.zeros((len(rows), 3), np.uint64)
        rem[:, 0] = self.rbase + rows[:, 1]
        rem[:, 1] = rows[:, 2]
        return (
            self.agent.get_xfer_descs(loc, "DRAM"),
            self.agent.get_xfer_descs(rem, "DRAM"),
        )

    def post(self, rows: np.ndarray, key: int | None = None, cache: Any = None) -> Any:
        """One xfer of every row; with `cache`, the handle is made once and
        reposted (how NIXL is used for repeated transfers)."""
        notif = b"" if key is None else str(key).encode()
        h = self.handles.get(cache) if cache is not None else None
        if h is None:
            loc, rem = self._descs(rows)
            h = self.agent.initialize_xfer("WRITE", loc, rem, self.remote, notif)
            if cache is not None:
                self.handles[cache] = h
        st = self.agent.transfer(h, notif)
        if st == "ERR":
            raise RuntimeError("nixl: transfer posted with an error")
        return (h, cache is None)

    def post_pages(self, src_pages: np.ndarray, dst_pages: np.ndarray, key: int | None) -> Any:
        notif = b"" if key is None else str(key).encode()
        h = self.agent.make_prepped_xfer(
            "WRITE", self.lp, np.asarray(src_pages, np.int32), self.rp,
            np.asarray(dst_pages, np.int32), notif,
        )
        st = self.agent.transfer(h)
        if st == "ERR":
            raise RuntimeError("nixl: transfer posted with an error")
        return (h, True)

    def wait(self, op: Any) -> None:
        h, release = op
        check = self.agent.check_xfer_state
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            st = check(h)
            if st == "DONE":
                break
            if st == "ERR":
                raise RuntimeError("nixl: transfer failed")
            if time.monotonic() > deadline:
                raise TimeoutError("nixl: transfer did not finish")
        if release:
            h.release()

    def _drain(self) -> None:
        for msgs in self.agent.get_new_notifs().values():
            self.notifs.update(msgs)

    def wait_key(self, key: int, shape: tuple[Any, ...]) -> None:
        want = str(key).encode()
        deadline = time.monotonic() + TIMEOUT_S
        while self.notifs[want] == 0:
            self._drain()
            if time.monotonic() > deadline:
                raise TimeoutError(f"nixl: notification {key} did not come (have {dict(self.notifs)})")
        self.notifs[want] -= 1

    def idle(self, conn: Any) -> Any:
        if self.thread:
            return conn.recv()
        # Caller mode: nobody else drives this agent's UCX worker.
        while not conn.poll(0):
            self._drain()
        return conn.recv()

    def close(self) -> None:
        for h in self.handles.values():
            h.release()
        self.handles.clear()
