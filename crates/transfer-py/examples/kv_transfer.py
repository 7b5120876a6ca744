"""Disaggregated prefill -> decode: a paged KV cache moved layer by layer.

Two processes. The decode process owns a paged KV cache (numpy, CPU),
registers it, allocates pages for one request and sends the prefill
process its engine address, the cache's descriptor and the page ids. The
prefill process "computes" each layer into its own paged cache and writes
that layer's pages straight into the decode process's cache with one paged
write, immediate = IMM_BASE + layer. The decode side waits per layer on
that immediate (the count comes from `expected_imms`, as in Rust) and
checks the layer byte for byte as soon as it is signalled, while later
layers are still in flight.

    python examples/kv_transfer.py                      # tcp on loopback
    python examples/kv_transfer.py --provider shm --asyncio

Layout of both caches: [layer, page, K/V, token, head, head_dim] float16,
so one page (K and V of page_tokens tokens) is contiguous and a layer's
pages are `page_bytes` apart.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import transfer

IMM_BASE = 0x4B560000  # "KV" << 16: one value per layer
TIMEOUT = 60.0


@dataclass
class Shape:
    layers: int
    pages: int  # pages in each process's pool
    page_tokens: int
    heads: int
    head_dim: int

    @property
    def page_elems(self) -> int:
        return 2 * self.page_tokens * self.heads * self.head_dim

    @property
    def page_bytes(self) -> int:
        return self.page_elems * 2  # float16

    @property
    def layer_bytes(self) -> int:
        return self.pages * self.page_bytes

    def cache(self) -> np.ndarray:
        return np.zeros(
            (self.layers, self.pages, 2, self.page_tokens, self.heads, self.head_dim), np.float16
        )


def layer_values(shape: Shape, layer: int, n_pages: int) -> np.ndarray:
    """What prefill computes for `layer` of the request (deterministic, so the decode side can check it)."""
    rng = np.random.default_rng(1000 + layer)
    return rng.standard_normal((n_pages, shape.page_elems)).astype(np.float16)


def decode(conn: Any, provider: str, shape: Shape, request_pages: int, use_asyncio: bool) -> None:
    engine = transfer.Engine(provider=provider, bind="127.0.0.1")
    cache = shape.cache()
    region = engine.register(cache)
    dst_pages = np.random.default_rng(7).choice(shape.pages, request_pages, replace=False)
    dst_pages = dst_pages.astype(np.uint32)
    conn.send((engine.address, region.descriptor, dst_pages))
    prefill = engine.connect(conn.recv())
    per_layer = engine.expected_imms(prefill, pages=request_pages, page_len=shape.page_bytes)
    flat = cache.reshape(shape.layers, shape.pages, shape.page_elems)
    arrivals: list[float] = []
    start = time.perf_counter()

    def check(layer: int) -> None:
        arrivals.append((time.perf_counter() - start) * 1e3)
        got = flat[layer, dst_pages]
        want = layer_values(shape, layer, request_pages)
        if got.tobytes() != want.tobytes():
            raise SystemExit(f"decode: layer {layer} differs")
        others = np.setdiff1d(np.arange(shape.pages), dst_pages)
        if flat[layer, others].any():
            raise SystemExit(f"decode: layer {layer} wrote outside the request's pages")

    if use_asyncio:

        async def run() -> None:
            # Every expectation set up front; awaited in layer order.
            waits = [engine.expect_imm(IMM_BASE + l, per_layer) for l in range(shape.layers)]
            conn.send("ready")
            for layer, w in enumerate(waits):
                await asyncio.wait_for(w, TIMEOUT)
                check(layer)

        asyncio.run(run())
    else:
        conn.send("ready")
        for layer in range(shape.layers):
            engine.wait_imm(IMM_BASE + layer, per_layer, timeout=TIMEOUT)
            check(layer)
    conn.send(("ok", arrivals))
    engine.close()


def prefill(provider: str, shape: Shape, request_pages: int, use_asyncio: bool) -> int:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=decode, args=(child, provider, shape, request_pages, use_asyncio))
    proc.start()
    engine = transfer.Engine(provider=provider, bind="127.0.0.1")
    try:
        cache = shape.cache()
        region = engine.register(cache)
        flat = cache.reshape(shape.layers, shape.pages, shape.page_elems)
        src_pages = np.random.default_rng(3).choice(shape.pages, request_pages, replace=False)
        src_pages = src_pages.astype(np.uint32)
        if not conn.poll(TIMEOUT):
            raise SystemExit("prefill: the decode process did not start")
        address, descriptor, dst_pages = conn.recv()
        conn.send(engine.address)
        dst = engine.connect(address).remote(descriptor)
        conn.recv()  # decode is waiting
        writes = []
        t0 = time.perf_counter()
        for layer in range(shape.layers):
            flat[layer, src_pages] = layer_values(shape, layer, request_pages)  # "compute"
            writes.append(
                engine.write_paged(
                    region, src_pages, dst, dst_pages, shape.page_bytes,
                    src_offset=layer * shape.layer_bytes,
                    dst_offset=layer * shape.layer_bytes,
                    imm=IMM_BASE + layer,
                )
            )
        for w in writes:
            w.wait(TIMEOUT)
        sent_ms = (time.perf_counter() - t0) * 1e3
        if not conn.poll(TIMEOUT):
            raise SystemExit("prefill: no answer from decode")
        status, arrivals = conn.recv()
        total = shape.layers * request_pages * shape.page_bytes
        print(
            f"kv_transfer {engine.provider}: {shape.layers} layers x {request_pages} pages x "
            f"{shape.page_bytes} B = {total / 2**20:.1f} MiB in {sent_ms:.1f} ms; decode checked "
            f"each layer on arrival (ms: {', '.join(f'{a:.1f}' for a in arrivals)}): {status}"
        )
        return 0 if status == "ok" else 1
    finally:
        proc.join(TIMEOUT)
        engine.close()
        if proc.exitcode not in (0, None):
            print(f"decode process exited with {proc.exitcode}", file=sys.stderr)
            sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--provider", default="tcp")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--pages", type=int, default=128, help="pages in each pool")
    ap.add_argument("--request-pages", type=int, default=48)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--asyncio", action="store_true", help="decode awaits with asyncio")
    a = ap.parse_args()
    shape = Shape(a.layers, a.pages, a.page_tokens, a.heads, a.head_dim)
    sys.exit(prefill(a.provider, shape, a.request_pages, a.asyncio))


if __name__ == "__main__":
    main()
