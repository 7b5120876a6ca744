"""Mooncake Transfer Engine (PyPI `mooncake-transfer-engine-non-cuda`)
behind the peers bench's adapter interface: P2PHANDSHAKE metadata, the
tcp transport (its wheel has no shared-memory transport), batch
transfers. Its Python API carries a notification only on the synchronous
batch call (`batch_transfer_sync(..., notify)`); batches without one go
through `batch_transfer_async_write` + `get_batch_transfer_status`
(which blocks until the batch is done)."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import numpy as np

os.environ.setdefault("GLOG_minloglevel", "2")
os.environ.setdefault("MC_LOG_LEVEL", "WARNING")

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode  # noqa: E402

TIMEOUT_S = 60.0


class Adapter:
    name = "mooncake"

    def __init__(self, transport: str, mode: str, buf: np.ndarray) -> None:
        if transport != "tcp":
            raise ValueError("mooncake: its non-CUDA wheel has tcp only")
        self.te = TransferEngine()
        rc = self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"mooncake: initialize returned {rc}")
        self.buf = buf
        self.base = buf.ctypes.data
        rc = self.te.register_memory(self.base, buf.nbytes)
        if rc != 0:
            raise RuntimeError(f"mooncake: register_memory returned {rc}")
        self.target = ""
        self.rbase = 0
        self.me = f"mc-{os.getpid()}"
        self.cached: dict[Any, tuple[list[int], list[int], list[int]]] = {}
        self.notifs: Counter[str] = Counter()
        self.config = (
            "Mooncake TE 0.3.13 (non-CUDA wheel), tcp transport, P2PHANDSHAKE, "
            "batch_transfer_async_write + get_batch_transfer_status (blocking); "
            "with a notification batch_transfer_sync(notify), receiver polls get_notifies"
        )

    def info(self) -> dict[str, Any]:
        return {"target": f"127.0.0.1:{self.te.get_rpc_port()}", "base": self.base}

    def connect(self, info: dict[str, Any]) -> None:
        self.target = info["target"]
        self.rbase = int(info["base"])

    def prep_pages(self, page_len: int, local_off: int, n_local: int, remote_off: int, n_remote: int) -> None:
        self._pages = (page_len, local_off, remote_off)

    def _lists(self, rows: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        rows = np.asarray(rows, np.uint64)
        return (
            (rows[:, 0] + np.uint64(self.base)).tolist(),
            (rows[:, 1] + np.uint64(self.rbase)).tolist(),
            rows[:, 2].tolist(),
        )

    def _submit(self, lists: tuple[list[int], list[int], list[int]], key: int | None) -> Any:
        src, dst, lens = lists
        if key is None:
            bid = self.te.batch_transfer_async_write(self.target, src, dst, lens)
            if bid == 0:
                raise RuntimeError("mooncake: batch_transfer_async_write failed")
            return bid
        rc = self.te.batch_transfer_sync(
            self.target, src, dst, lens, TransferOpcode.Write, TransferNotify(self.me, str(key))
        )
        if rc != 0:
            raise RuntimeError(f"mooncake: batch_transfer_sync returned {rc}")
        return None

    def post(self, rows: np.ndarray, key: int | None = None, cache: Any = None) -> Any:
        lists = self.cached.get(cache) if cache is not None else None
        if lists is None:
            lists = self._lists(rows)
            if cache is not None:
                self.cached[cache] = lists
        return self._submit(lists, key)

    def post_pages(self, src_pages: np.ndarray, dst_pages: np.ndarray, key: int | None) -> Any:
        page_len, lo, ro = self._pages
        rows = np.zeros((len(src_pages), 3), np.uint64)
        rows[:, 0] = lo + np.asarray(src_pages, np.uint64) * np.uint64(page_len)
        rows[:, 1] = ro + np.asarray(dst_pages, np.uint64) * np.uint64(page_len)
        rows[:, 2] = page_len
        return self._submit(self._lists(rows), key)

    def wait(self, op: Any) -> None:
        if op is None:
            return
        rc = self.te.get_batch_transfer_status([op])
        if rc != 0:
            raise RuntimeError(f"mooncake: batch failed ({rc})")

    def wait_key(self, key: int, shape: tuple[Any, ...]) -> None:
        want = str(key)
        deadline = time.monotonic() + TIMEOUT_S
        while self.notifs[want] == 0:
            for n in self.te.get_notifies():
                self.notifs[n.msg] += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"mooncake: notification {key} did not come")
        self.notifs[want] -= 1

    def idle(self, conn: Any) -> Any:
        return conn.recv()

    def close(self) -> None:
        pass
