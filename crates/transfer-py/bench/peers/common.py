"""Shared pieces of the peers bench: the WORKLOADS.md RNG and fill
pattern (vectorised with numpy), statistics, JSON Lines records."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

MASK = (1 << 64) - 1
KiB = 1 << 10
MiB = 1 << 20


def now_ns() -> int:
    """CLOCK_MONOTONIC: one clock for every process of this host, so a
    receiver's timestamp and a sender's compare."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class SplitMix64:
    def __init__(self, seed: int) -> None:
        self.state = seed & MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def mix(x: int) -> int:
    return SplitMix64(x).next()


def mix_np(x: np.ndarray) -> np.ndarray:
    """`mix` of every element (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def shuffle(n: int, seed: int) -> np.ndarray:
    """WORKLOADS.md's Shuffle(n, seed)."""
    a = list(range(n))
    rng = SplitMix64(seed)
    for i in range(n - 1, 0, -1):
        j = rng.next() % (i + 1)
        a[i], a[j] = a[j], a[i]
    return np.asarray(a, dtype=np.int64)


_ROWS: dict[int, np.ndarray] = {}


def _row(unit: int) -> np.ndarray:
    """(i*131 + (i >> 12)) mod 256 for i in 0..unit, as uint8."""
    r = _ROWS.get(unit)
    if r is None:
        i = np.arange(unit, dtype=np.uint64)
        r = ((i * np.uint64(131) + (i >> np.uint64(12))) & np.uint64(0xFF)).astype(np.uint8)
        _ROWS[unit] = r
    return r


def pattern(tags: np.ndarray, it: int, unit: int) -> np.ndarray:
    """The fill of units with these tags at iteration `it`: shape
    (len(tags), unit) uint8 (WORKLOADS.md "Fill pattern")."""
    h = mix_np(np.asarray(tags, dtype=np.uint64) ^ np.uint64((it << 48) & MASK))
    out = (_row(unit)[None, :] + (h & np.uint64(0xFF)).astype(np.uint8)[:, None]).astype(np.uint8)
    if unit >= 8:
        out[:, :8] = h.view(np.uint8).reshape(-1, 8)
    return out


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=np.float64)))


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


class Mismatch(Exception):
    """Bytes at the receiver differ from what was sent: the run fails."""
