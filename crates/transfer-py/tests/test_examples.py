"""The examples run and check their bytes (small sizes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=180, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("extra", [[], ["--asyncio"]], ids=["blocking", "asyncio"])
def test_kv_transfer(provider: str, extra: list[str]) -> None:
    out = run(
        str(EXAMPLES / "kv_transfer.py"), "--provider", provider, "--layers", "4",
        "--pages", "32", "--request-pages", "9", *extra,
    )
    assert out.rstrip().endswith(": ok"), out


def test_imm_pingpong(provider: str) -> None:
    out = run(str(EXAMPLES / "imm_pingpong.py"), "--provider", provider, "--iters", "50")
    assert out.count("median") == 2, out
