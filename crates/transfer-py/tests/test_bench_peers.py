"""The peers bench (bench/peers) moves the same bytes to the same places as
the Rust and Open MPI sides of WORKLOADS.md: its RNG, shuffle and fill
pattern against the values transfer-bench's spec test pins."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "peers"))

import common  # noqa: E402


def test_splitmix_and_mix() -> None:
    r = common.SplitMix64(0)
    assert r.next() == 0xE220A8397B1DCDAF
    assert r.next() == 0x6E789E6AA1B965F4
    assert common.mix(0) == 0xE220A8397B1DCDAF
    assert int(common.mix_np(np.array([0], np.uint64))[0]) == 0xE220A8397B1DCDAF


def test_shuffle_matches_the_rust_side() -> None:
    assert common.shuffle(8, 1).tolist() == [4, 3, 2, 7, 5, 6, 0, 1]
    assert sorted(common.shuffle(1000, 7).tolist()) == list(range(1000))


def test_fill_matches_the_rust_side() -> None:
    unit = common.pattern(np.array([1]), 0, 16)[0]
    assert unit.tobytes() == bytes(
        [0xC1, 0x5C, 0x02, 0x89, 0xEC, 0x2D, 0x0A, 0x91, 0xD9, 0x5C, 0xDF, 0x62, 0xE5, 0x68, 0xEB, 0x6E]
    )
    # Past 4 KiB the (i >> 12) term counts, as in the scalar definition.
    h = common.mix(5 ^ (3 << 48))
    want = bytes((h >> (8 * i)) & 0xFF for i in range(8)) + bytes(
        (h + i * 131 + (i >> 12)) % 256 for i in range(8, 9000)
    )
    assert common.pattern(np.array([5]), 3, 9000)[0].tobytes() == want
