"""Zero-byte immediate ping-pong between two processes, from Python.

The Python counterpart of the bench's `imm_pingpong` row: the driver writes
0 bytes with immediate PING into the echo process, which answers with
immediate PONG; one round trip per iteration, median and p99 reported.

    python examples/imm_pingpong.py --provider tcp --iters 1000
    python examples/imm_pingpong.py --mode spin     # poll take_imm, as the Rust bench does

Modes: "wait" blocks in `Engine.wait_imm` (GIL released, woken by the
engine's worker: what most applications do); "spin" polls
`Engine.take_imm` (a busy core, as the Rust bench and fi_pingpong do).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

import numpy as np

import transfer

PING, PONG = 1, 2


def open_engine(provider: str) -> transfer.Engine:
    return transfer.Engine(provider=provider, bind="127.0.0.1")


def await_imm(engine: transfer.Engine, imm: int, mode: str) -> None:
    if mode == "wait":
        engine.wait_imm(imm, 1, timeout=30)
        return
    deadline = time.monotonic() + 30
    while engine.take_imm(imm, 1) == 0:
        # Yield as the Rust bench does: on few cores the engine's worker
        # needs the CPU this loop would hold.
        os.sched_yield()
        if time.monotonic() > deadline:
            raise TimeoutError("no immediate within 30 s")


def echo(conn: Any, provider: str, iters: int, mode: str) -> None:
    engine = open_engine(provider)
    region = engine.register(np.zeros(64, np.uint8))
    conn.send((engine.address, region.descriptor))
    address, descriptor = conn.recv()
    dst = engine.connect(address).remote(descriptor)
    sent = []
    for _ in range(iters):
        await_imm(engine, PING, mode)
        sent.append(engine.write(region, dst, nbytes=0, imm=PONG))
    for t in sent:
        t.wait(30)
    conn.send("done")
    conn.recv()
    engine.close()


def run(provider: str, iters: int, mode: str, warmup: int = 100) -> list[float]:
    """Round-trip times in microseconds."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=echo, args=(there, provider, iters + warmup, mode))
    proc.start()
    engine = open_engine(provider)
    try:
        region = engine.register(np.zeros(64, np.uint8))
        address, descriptor = here.recv()
        here.send((engine.address, region.descriptor))
        dst = engine.connect(address).remote(descriptor)
        samples = []
        sent = []
        for i in range(iters + warmup):
            t0 = time.perf_counter()
            sent.append(engine.write(region, dst, nbytes=0, imm=PING))
            await_imm(engine, PONG, mode)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1e6)
        for t in sent:
            t.wait(30)
        here.recv()
        here.send("bye")
        return samples
    finally:
        proc.join(30)
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", default="tcp")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--mode", choices=["wait", "spin", "both"], default="both")
    args = ap.parse_args()
    modes = ["wait", "spin"] if args.mode == "both" else [args.mode]
    for mode in modes:
        s = sorted(run(args.provider, args.iters, mode))
        p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
        print(
            f"imm_pingpong python {args.provider} mode={mode}: "
            f"median {statistics.median(s):.1f} us, p99 {p99:.1f} us over {len(s)} round trips"
        )


if __name__ == "__main__":
    main()
