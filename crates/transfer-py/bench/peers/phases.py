"""What the two processes of one engine run: issue 20's rows
("primitives") and WORKLOADS.md's kv workload, written once against the
adapter interface (eng_*.py). The initiator drives; the target answers
commands on the side channel (a multiprocessing pipe), and checks the
bytes it received after every timed phase (a mismatch raises)."""

from __future__ import annotations

from typing import Any

import numpy as np

from common import MiB, KiB, Mismatch, mix, now_ns, pattern, percentile, shuffle

# One registered buffer per process: writes go from the local "out" half
# to the remote "in" half.
IN = 32 * MiB
BUF = 64 * MiB
PAGE = 16 * KiB
PAGES = 256
POOL = 512

KEY_ECHO, KEY_BACK, KEY_PAGED = 11, 12, 13
# The echo phase's last write: the target stops echoing.
ECHO_STOP = 0xEC0_57_0B_0000_0000


def sync(conn: Any) -> None:
    conn.send(("sync",))
    if conn.recv() != "ok":
        raise RuntimeError("side channel: bad sync reply")


def check(conn: Any, *cmd: Any) -> None:
    conn.send(cmd)
    r = conn.recv()
    if r != "ok":
        raise Mismatch(str(r))


# ---- initiator --------------------------------------------------------


def bw(a: Any, conn: Any, size: int, it: int, total: int) -> float:
    batch = max(8 * MiB, size)
    n = batch // size
    posts = max(4, total // batch)
    tag0 = (size << 20) | 0xB0000
    a.buf[: 2 * batch] = pattern(tag0 + np.arange(2 * n), it, size).reshape(-1)
    rows = []
    for slot in range(2):
        r = np.zeros((n, 3), np.uint64)
        r[:, 0] = slot * batch + np.arange(n, dtype=np.uint64) * size
        r[:, 1] = IN + r[:, 0]
        r[:, 2] = size
        rows.append(r)
    sync(conn)
    t0 = now_ns()
    ops = [a.post(rows[0], None, ("bw", size, 0)), a.post(rows[1], None, ("bw", size, 1))]
    for k in range(2, posts):
        s = k % 2
        a.wait(ops[s])
        ops[s] = a.post(rows[s], None, ("bw", size, s))
    a.wait(ops[posts % 2])
    a.wait(ops[(posts + 1) % 2])
    t1 = now_ns()
    check(conn, "check", IN, 2 * batch, size, tag0, it)
    return posts * batch / (t1 - t0)  # bytes per ns = GB/s


# Latency rows warm up for at least this long as well as `warm` round
# trips, inside the timed phase's own loop. Why: a process woken through
# the side channel (a pipe: a "sync" wake-up) is placed on the CPU of the
# process that woke it, so each phase starts with both engines' threads on
# one of the 2 CPUs until the scheduler moves one (~5-25 ms here); 20
# round trips measured that start-up, not the steady state: our thread
# mode's 8 B echo over shm read 5-7 us or 16-25 us per run depending on
# where a run ended up (both processes pinned to one CPU: 16-24 us; to
# two: 5-7 us). Every engine gets the same warm-up.
WARM_NS = 50_000_000


def warming(i: int, warm: int, start: int) -> bool:
    """Whether round trip `i` of a phase that began at `start` is warm-up."""
    return i < warm or now_ns() - start < WARM_NS


def lat8(a: Any, conn: Any, n: int, warm: int, it: int) -> list[float]:
    v64 = a.buf[:8].view(np.uint64)
    row = np.array([[0, IN, 8]], np.uint64)
    sync(conn)
    lats: list[float] = []
    v = 0
    i = 0
    start = now_ns()
    while len(lats) < n:
        v = mix((it << 32) ^ i)
        v64[0] = v
        warm_up = warming(i, warm, start)
        t = now_ns()
        a.wait(a.post(row, None, "w8"))
        if not warm_up:
            lats.append((now_ns() - t) / 1e3)
        i += 1
    check(conn, "check8", IN, v)
    return lats


def echo(a: Any, conn: Any, n: int, warm: int, it: int) -> list[float]:
    v64 = a.buf[8:16].view(np.uint64)
    back = a.buf[IN + 16 : IN + 24].view(np.uint64)
    row = np.array([[8, IN + 8, 8]], np.uint64)
    conn.send(("echo",))
    if conn.recv() != "ready":
        raise RuntimeError("side channel: echo not ready")
    lats: list[float] = []
    i = 0
    start = now_ns()
    while len(lats) < n:
        # Never ECHO_STOP (its low bit is clear).
        v = mix((it << 32) ^ i ^ 0xEC0) | 1
        v64[0] = v
        warm_up = warming(i, warm, start)
        t = now_ns()
        # Own completion first: NIXL (progress thread on) never completes
        # the write while this thread spins in get_new_notifs.
        a.wait(a.post(row, KEY_ECHO, "echo"))
        a.wait_key(KEY_BACK, ("rows", (8,)))
        t1 = now_ns()
        if int(back[0]) != v:
            raise Mismatch(f"echo {i}: got {int(back[0]):#x} back, sent {v:#x}")
        if not warm_up:
            lats.append((t1 - t) / 1e3)
        i += 1
    # The target echoes until this value arrives (the count of round trips
    # is the initiator's: its warm-up is timed).
    v64[0] = ECHO_STOP
    a.wait(a.post(row, KEY_ECHO, "echo"))
    if conn.recv() != "ok":
        raise Mismatch("echo: the target saw wrong bytes")
    return lats


def paged(a: Any, conn: Any, n: int, warm: int, it: int) -> list[float]:
    src = np.arange(PAGES, dtype=np.uint32)
    lats = []
    for i in range(warm + n):
        k = (it << 16) | i
        dst = shuffle(POOL, k)[:PAGES].astype(np.uint32)
        a.buf[: PAGES * PAGE] = pattern(0xFA6E0000 + np.arange(PAGES), k, PAGE).reshape(-1)
        conn.send(("paged", k))
        if conn.recv() != "ready":
            raise RuntimeError("side channel: paged not ready")
        t = now_ns()
        op = a.post_pages(src, dst, KEY_PAGED)
        a.wait(op)
        r = conn.recv()
        if r[0] != "known":
            raise Mismatch(str(r))
        if i >= warm:
            lats.append((r[1] - t) / 1e3)
    return lats


def prims_init(a: Any, conn: Any, p: dict[str, Any]) -> dict[str, Any]:
    a.prep_pages(PAGE, 0, PAGES, IN, POOL)
    it = p["rep"] + 1
    rows = p["rows"]
    out: dict[str, Any] = {}
    for size in (64 * KiB, 1 * MiB, 16 * MiB):
        if f"bw{size}" in rows:
            bw(a, conn, size, it, 2 * max(8 * MiB, size))  # warm-up
            out[f"bw{size}"] = bw(a, conn, size, it + 100, p["bw_total"])
    if "w8" in rows:
        l8 = lat8(a, conn, p["lat_n"], 20, it)
        out["w8"] = (percentile(l8, 50), percentile(l8, 99))
    if "echo" in rows:
        e = echo(a, conn, p["lat_n"], 20, it)
        out["echo"] = (percentile(e, 50), percentile(e, 99))
    if "paged" in rows:
        pg = paged(a, conn, p["paged_n"], 3, it)
        out["paged"] = (percentile(pg, 50), percentile(pg, 99))
    conn.send(("end",))
    return out


# ---- target -----------------------------------------------------------


def prims_target(a: Any, conn: Any) -> None:
    pages_in = a.buf[IN : IN + POOL * PAGE].reshape(POOL, PAGE)
    while True:
        msg = a.idle(conn)
        cmd = msg[0]
        if cmd == "sync":
            conn.send("ok")
        elif cmd == "check":
            _, off, nbytes, unit, tag0, it = msg
            want = pattern(tag0 + np.arange(nbytes // unit), it, unit).reshape(-1)
            ok = np.array_equal(a.buf[off : off + nbytes], want)
            conn.send("ok" if ok else f"write bandwidth {unit} B: bytes differ at the receiver")
        elif cmd == "check8":
            _, off, v = msg
            got = int(a.buf[off : off + 8].view(np.uint64)[0])
            conn.send("ok" if got == v else f"8 B write: got {got:#x}, want {v:#x}")
        elif cmd == "echo":
            row = np.array([[16, IN + 16, 8]], np.uint64)
            got = a.buf[IN + 8 : IN + 16]
            conn.send("ready")
            while True:
                a.wait_key(KEY_ECHO, ("rows", (8,)))
                if int(got.view(np.uint64)[0]) == ECHO_STOP:
                    break
                a.buf[16:24] = got
                a.wait(a.post(row, KEY_BACK, "back"))
            conn.send("ok")
        elif cmd == "paged":
            k = msg[1]
            dst = shuffle(POOL, k)[:PAGES]
            want = pattern(0xFA6E0000 + np.arange(PAGES), k, PAGE)
            conn.send("ready")
            a.wait_key(KEY_PAGED, ("pages", PAGES, PAGE))
            t = now_ns()
            if not np.array_equal(pages_in[dst], want):
                conn.send(("mismatch", "paged: bytes differ at the receiver"))
                raise Mismatch("paged: bytes differ at the receiver")
            conn.send(("known", t))
        elif cmd == "end":
            return
        else:
            raise RuntimeError(f"side channel: unknown command {cmd!r}")


# ---- kv (WORKLOADS.md) ------------------------------------------------


def kv_sizes(p: dict[str, Any]) -> tuple[int, int]:
    r, layers, pp, b = p["requests"], p["layers"], p["pages_per_layer"], p["page_bytes"]
    return r * layers * pp * b, 2 * r * layers * pp * b


def kv_key(it: int, r: int, layer: int, p: dict[str, Any]) -> int:
    return 1_000_000 + (it * p["requests"] + r) * p["layers"] + layer


def kv_ack(it: int) -> int:
    return 500_000 + it


def kv_fill(buf: np.ndarray, p: dict[str, Any], it: int) -> None:
    r, layers, pp, b = p["requests"], p["layers"], p["pages_per_layer"], p["page_bytes"]
    pages = buf.reshape(r * layers * pp, b)
    for ri in range(r):
        tags = (
            np.uint64(ri << 40)
            | (np.arange(layers, dtype=np.uint64)[:, None] << np.uint64(20))
            | np.arange(pp, dtype=np.uint64)[None, :]
        )
        pages[ri * layers * pp : (ri + 1) * layers * pp] = pattern(tags.reshape(-1), it, b)


def spin_us(us: int) -> None:
    end = now_ns() + us * 1000
    while now_ns() < end:
        pass


def kv_prefill(a: Any, conn: Any, p: dict[str, Any], points: list[int], iters: int) -> dict[int, list[tuple[float, float]]]:
    r, layers, pp, b = p["requests"], p["layers"], p["pages_per_layer"], p["page_bytes"]
    pool = 2 * r * layers * pp
    a.prep_pages(b, 0, r * layers * pp, 0, pool)
    perm = shuffle(pool, p["seed"]).astype(np.uint32)
    out: dict[int, list[tuple[float, float]]] = {}
    it = 0
    for c in points:
        res = []
        for k in range(iters):
            it += 1
            kv_fill(a.buf, p, it)
            conn.send(("kv", it, c))
            if conn.recv() != "ready":
                raise RuntimeError("side channel: kv not ready")
            ops = []
            t_first = 0
            t_end = 0
            for layer in range(layers):
                spin_us(c)
                if layer == layers - 1:
                    t_end = now_ns()
                for ri in range(r):
                    base = (ri * layers + layer) * pp
                    src = np.arange(base, base + pp, dtype=np.uint32)
                    if t_first == 0:
                        t_first = now_ns()
                    ops.append(a.post_pages(src, perm[base : base + pp], kv_key(it, ri, layer, p)))
            for op in ops:  # see `echo`: own completions before the ack
                a.wait(op)
            a.wait_key(kv_ack(it), ("rows", (8,)))
            t_ack = now_ns()
            msg = conn.recv()
            if msg != "ok":
                raise Mismatch(str(msg))
            if k > 0:  # the first iteration is the warm-up
                res.append(((t_ack - t_end) / 1e3, r * layers * pp * b / (t_ack - t_first)))
        out[c] = res
    conn.send(("end",))
    return out


def kv_decode(a: Any, conn: Any, p: dict[str, Any]) -> None:
    r, layers, pp, b = p["requests"], p["layers"], p["pages_per_layer"], p["page_bytes"]
    pool = 2 * r * layers * pp
    perm = shuffle(pool, p["seed"])
    pages = a.buf.reshape(pool, b)
    want = np.zeros(r * layers * pp * b, np.uint8)
    ack = np.array([[0, 0, 8]], np.uint64)
    while True:
        msg = a.idle(conn)
        if msg[0] == "sync":
            conn.send("ok")
            continue
        if msg[0] == "end":
            return
        _, it, _c = msg
        conn.send("ready")
        for layer in range(layers):
            for ri in range(r):
                a.wait_key(kv_key(it, ri, layer, p), ("pages", pp, b))
        a.wait(a.post(ack, kv_ack(it), "ack"))
        kv_fill(want, p, it)
        got = pages[perm[: r * layers * pp]]
        if not np.array_equal(got, want.reshape(-1, b)):
            conn.send("kv: bytes differ at the decode side")
            raise Mismatch("kv: bytes differ at the decode side")
        conn.send("ok")
