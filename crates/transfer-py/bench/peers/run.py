"""`cargo xtask bench --peers`: our engine (from Python) side by side with
NVIDIA NIXL and Mooncake Transfer Engine, two processes per engine on this
machine, over tcp and shared memory (issue 20's rows), plus WORKLOADS.md's
kv workload for the peers (issue 21). Runs are interleaved (every engine
once, then again), each row is the median of --repeats runs, and the
receiver checks the bytes after every timed phase (a mismatch fails).

    python run.py [--repeats 3] [--quick] [--transports tcp,shm]
                  [--engines ours,ours-caller,mooncake,nixl,nixl-caller] [--no-kv] [--no-prims]
                  [--rows bw,w8,echo,paged]
                  [--out-dir target/bench/peers] [--kv-out-dir target/bench/workloads]
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing as mp
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import KiB, MiB, median, percentile, write_jsonl  # noqa: E402

# engine key -> (adapter module, mode, transports)
ENGINES = {
    "ours": ("eng_ours", "", ("tcp", "shm")),
    # A diagnostic, not in the default list: workers busy-poll (one core each).
    "ours-busy": ("eng_ours", "busy", ("tcp", "shm")),
    # Caller-driven progress: no engine threads, the caller polls.
    "ours-caller": ("eng_ours", "caller", ("tcp", "shm")),
    # Diagnostics, not in the default list: one tcp endpoint per engine
    # (one connection per peer; the default is two, over which writes are
    # sharded as UCX stripes a NIXL stream over two TCP sockets).
    "ours-1conn": ("eng_ours", "1conn", ("tcp",)),
    "ours-caller-1conn": ("eng_ours", "caller-1conn", ("tcp",)),
    "mooncake": ("eng_mooncake", "", ("tcp",)),
    "nixl": ("eng_nixl", "thread", ("tcp", "shm")),
    "nixl-caller": ("eng_nixl", "caller", ("tcp", "shm")),
}
UCX_TLS = {"tcp": "tcp", "shm": "sm"}
CHILD_TIMEOUT_S = 600

ROWS = [
    ("bw65536", "write bandwidth, 64 KiB writes", "GB/s"),
    ("bw1048576", "write bandwidth, 1 MiB writes", "GB/s"),
    ("bw16777216", "write bandwidth, 16 MiB writes", "GB/s"),
    ("w8", "8 B write to completion", "us"),
    ("echo", "8 B write + notify, echoed RTT", "us"),
    ("paged", "256 x 16 KiB paged, until the receiver knows", "us"),
]


def child(role: str, job: str, engine: str, transport: str, conn: Any, results: Any, p: dict[str, Any]) -> None:
    """One process of a pair: builds the adapter, swaps addresses with its
    partner, runs its side, reports (initiator) or checks (target)."""
    try:
        module, mode, _ = ENGINES[engine]
        os.environ["UCX_TLS"] = UCX_TLS[transport]
        import phases

        adapter = importlib.import_module(module).Adapter
        if job == "prims":
            buf = np.zeros(phases.BUF, np.uint8)
        else:
            src, pool = phases.kv_sizes(p)
            buf = np.zeros(src if role == "init" else pool, np.uint8)
        a = adapter(transport, mode, buf)
        conn.send(a.info())
        a.connect(conn.recv())
        if role == "init":
            phases.sync(conn)
        elif a.idle(conn)[0] == "sync":
            conn.send("ok")
        if job == "prims":
            out: Any = phases.prims_init(a, conn, p) if role == "init" else phases.prims_target(a, conn)
        elif role == "init":
            out = phases.kv_prefill(a, conn, p, p["points"], p["iters"])
        else:
            out = phases.kv_decode(a, conn, p)
        if role == "init":
            results.put(("ok", a.config, out))
        a.close()
    except BaseException as e:  # noqa: BLE001 - reported to the driver
        results.put(("error", role, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        sys.exit(1)


def run_pair(job: str, engine: str, transport: str, p: dict[str, Any]) -> tuple[str, Any]:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=child, args=("init", job, engine, transport, a, results, p)),
        ctx.Process(target=child, args=("target", job, engine, transport, b, results, p)),
    ]
    for pr in procs:
        pr.start()
    try:
        r = results.get(timeout=CHILD_TIMEOUT_S)
    except Exception:
        r = ("error", "driver", f"no result within {CHILD_TIMEOUT_S} s")
    for pr in procs:
        pr.join(timeout=30 if r[0] == "ok" else 5)
        if pr.is_alive():
            pr.kill()
            pr.join()
    if r[0] != "ok":
        raise SystemExit(f"{engine} over {transport} ({job}): {r[1]} failed: {r[2]}")
    return r[1], r[2]


def record(workload: str, engine: str, transport: str, config: str, params: dict[str, Any],
           metric: str, unit: str, values: list[float], note: str = "") -> dict[str, Any]:
    return {
        "workload": workload, "engine": engine, "transport": transport, "config": config,
        "params": params, "metric": metric, "value": median(values), "unit": unit,
        "p10": percentile(values, 10) if len(values) > 1 else None,
        "p90": percentile(values, 90) if len(values) > 1 else None,
        "repeats": len(values), "verified": True, "note": note,
    }


REPORT: list[str] = []


def say(*parts: Any) -> None:
    """Prints a line of the report (stdout) and keeps it for peers.md."""
    line = " ".join(str(x) for x in parts)
    print(line, flush=True)
    REPORT.append(line)


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "GB/s":
        return f"{v:.2f}"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def prims(args: argparse.Namespace) -> None:
    p = {
        "bw_total": (64 if args.quick else 256) * MiB,
        "lat_n": 100 if args.quick else 300,
        "paged_n": 20 if args.quick else 50,
        "rows": args.rows,
    }
    cells = [(e, t) for t in args.transports for e in args.engines if t in ENGINES[e][2]]
    configs: dict[tuple[str, str], str] = {}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    for rep in range(args.repeats):
        for e, t in cells:  # interleaved: every engine once per repeat
            print(f"peers: repeat {rep + 1}/{args.repeats}: {e} over {t}", file=sys.stderr, flush=True)
            cfg, out = run_pair("prims", e, t, dict(p, rep=rep))
            configs[(e, t)] = cfg
            runs[(e, t)].append(out)
    # (row, transport) -> engine -> (value, p99 or None)
    table: dict[tuple[str, str], dict[str, tuple[float, float | None]]] = {}
    for (e, t), outs in runs.items():
        recs = []
        for key, label, unit in ROWS:
            if key not in args.rows:
                continue
            if key.startswith("bw"):
                vals = [o[key] for o in outs]
                table.setdefault((key, t), {})[e] = (median(vals), None)
                recs.append(record("primitives", ENGINE_NAME[e], t, configs[(e, t)],
                                   {"row": label, "bytes": int(key[2:])}, "write_gbps", unit, vals))
            else:
                p50 = [o[key][0] for o in outs]
                p99 = [o[key][1] for o in outs]
                table.setdefault((key, t), {})[e] = (median(p50), median(p99))
                recs.append(record("primitives", ENGINE_NAME[e], t, configs[(e, t)], {"row": label}, "p50_us", unit, p50))
                recs.append(record("primitives", ENGINE_NAME[e], t, configs[(e, t)], {"row": label}, "p99_us", unit, p99))
        write_jsonl(Path(args.out_dir) / f"{e}-primitives-{t}.jsonl", recs)
    peers = [e for e in ("mooncake", "nixl", "nixl-caller") if e in args.engines]
    extra = [e for e in ("ours-caller", "ours-busy", "ours-1conn", "ours-caller-1conn") if e in args.engines]
    ratios = [e for e in ("ours", "ours-caller", "ours-1conn", "ours-caller-1conn") if e in args.engines]
    head = (["row", "via", "ours"] + [TITLE[e] for e in extra + peers]
            + [f"{TITLE[e]} / best peer" for e in ratios])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in args.transports:
        for key, label, unit in ROWS:
            if key not in args.rows:
                continue
            cells_ = table.get((key, t), {})
            row = [label, t]
            for e in ["ours"] + extra + peers:
                v = cells_.get(e)
                if v is None:
                    row.append("n/a")
                elif v[1] is None:
                    row.append(f"{fmt(v[0], unit)} {unit}" if e == "ours" else fmt(v[0], unit))
                else:
                    row.append(f"{fmt(v[0], unit)} / {fmt(v[1], unit)}" + (f" {unit}" if e == "ours" else ""))
            best = [cells_[e][0] for e in peers if e in cells_]
            for e in ratios:
                ours = cells_.get(e)
                if best and ours:
                    b = max(best) if unit == "GB/s" else min(best)
                    ratio = ours[0] / b
                    good = ratio >= 1.0 if unit == "GB/s" else ratio <= 1.0
                    row.append(f"{ratio:.2f}{'' if good else ' (behind)'}")
                else:
                    row.append("-")
            lines.append("| " + " | ".join(row) + " |")
    say("\n## Against NIXL and Mooncake: primitives (latencies p50 / p99 in us; medians of "
          f"{args.repeats} interleaved repeats; bytes checked at the receiver)\n")
    say("\n".join(lines))
    say("\nConfigurations:")
    for (e, t), c in sorted(configs.items()):
        say(f"- {TITLE[e]} ({t}): {c}")


def kv(args: argparse.Namespace) -> None:
    base = {"layers": 8, "pages_per_layer": 64, "page_bytes": 16384, "requests": 2,
            "compute_us": 500, "seed": 1} if args.quick else {
            "layers": 32, "pages_per_layer": 64, "page_bytes": 16384, "requests": 4,
            "compute_us": 500, "seed": 1}
    reps = args.kv_repeats
    p = dict(base, points=[base["compute_us"], 0], iters=reps + 1)
    kv_engines = [e for e in args.engines]
    cells = [(e, t) for t in args.transports for e in kv_engines if t in ENGINES[e][2]]
    res: dict[tuple[str, str], tuple[str, dict[int, list[tuple[float, float]]]]] = {}
    for e, t in cells:
        print(f"peers: kv: {e} over {t}", file=sys.stderr, flush=True)
        cfg, out = run_pair("kv", e, t, p)
        res[(e, t)] = (cfg, {int(k): v for k, v in out.items()})
    note_mc = ("Mooncake's Python API carries a notification only on the synchronous batch call, "
               "so each layer's batch blocks prefill until it landed: no overlap with later layers' "
               "compute, the compute end is pushed back by the transfers, and ttll (measured from the "
               "compute end) counts only the last layer; compare kv_gbps")
    say("\n## kv (WORKLOADS.md) for the peers: time-to-last-layer p50 (us), kv GB/s\n")
    say("| transport | engine | C=500us ttll | C=0 ttll | kv GB/s (C=0) | hidden_frac |")
    say("|---|---|---|---|---|---|")
    by_file: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for t in args.transports:
        nixl_best: tuple[float, str] | None = None
        summaries = {}
        for e in kv_engines:
            if (e, t) not in res:
                continue
            cfg, out = res[(e, t)]
            c0 = out[0]
            cc = out[base["compute_us"]]
            ttll_c = median([x[0] for x in cc])
            ttll_0 = median([x[0] for x in c0])
            summaries[e] = (ttll_c, ttll_0)
            say(f"| {t} | {TITLE[e] if e != 'ours' else 'ours-py'} | {ttll_c:.0f} | {ttll_0:.0f} | "
                  f"{median([x[1] for x in c0]):.2f} | {1 - ttll_c / ttll_0:.2f} |")
            if e.startswith("nixl") and (nixl_best is None or ttll_c < nixl_best[0]):
                nixl_best = (ttll_c, e)
        for e in kv_engines:
            if (e, t) not in res:
                continue
            if e.startswith("nixl") and nixl_best and e != nixl_best[1]:
                continue  # one NIXL row per point: its better configuration
            cfg, out = res[(e, t)]
            name = KV_NAME[e]
            note = note_mc if e == "mooncake" else ""
            if e.startswith("nixl"):
                other = [o for o in summaries if o.startswith("nixl") and o != e]
                if other:
                    o = other[0]
                    note = (f"the better of NIXL's two configurations; {TITLE[o]}: ttll "
                            f"{summaries[o][0]:.0f} us (C={base['compute_us']}), {summaries[o][1]:.0f} us (C=0)")
            if e == "ours":
                note = "ours from Python (transfer-py): one write_paged with an immediate per (request, layer)"
            recs = by_file.setdefault((name, t), [])
            for c, vals in out.items():
                params = {k: base[k] for k in ("layers", "pages_per_layer", "page_bytes", "requests", "seed")}
                params["compute_us"] = c
                recs.append(record("kv", name, t, cfg, params, "ttll_us", "us", [x[0] for x in vals], note))
                recs.append(record("kv", name, t, cfg, params, "kv_gbps", "GB/s", [x[1] for x in vals], note))
            ttll_c, ttll_0 = summaries[e]
            params = {k: base[k] for k in ("layers", "pages_per_layer", "page_bytes", "requests", "compute_us", "seed")}
            h = record("kv", name, t, cfg, params, "hidden_frac", "fraction", [1 - ttll_c / ttll_0], note)
            h["repeats"] = reps
            recs.append(h)
    for (name, t), recs in by_file.items():
        write_jsonl(Path(args.kv_out_dir) / f"{name}-kv-{t}.jsonl", recs)
    say(f"\nkv records: {args.kv_out_dir}/<engine>-kv-<transport>.jsonl")


TITLE = {"ours": "ours", "ours-busy": "ours busy-poll", "ours-caller": "ours caller",
         "ours-1conn": "ours 1 conn", "ours-caller-1conn": "ours caller 1 conn", "mooncake": "Mooncake", "nixl": "NIXL", "nixl-caller": "NIXL caller"}
ENGINE_NAME = {"ours": "ours", "ours-busy": "ours", "ours-caller": "ours", "ours-1conn": "ours",
               "ours-caller-1conn": "ours", "mooncake": "mooncake", "nixl": "nixl", "nixl-caller": "nixl"}
KV_NAME = {"ours": "ours-py", "ours-busy": "ours-py-busy", "ours-caller": "ours-py-caller",
           "ours-1conn": "ours-py-1conn", "ours-caller-1conn": "ours-py-caller-1conn", "mooncake": "mooncake", "nixl": "nixl", "nixl-caller": "nixl"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--engines", default="ours,ours-caller,mooncake,nixl,nixl-caller")
    ap.add_argument("--no-kv", action="store_true")
    ap.add_argument("--no-prims", action="store_true")
    ap.add_argument("--rows", default="bw,w8,echo,paged",
                    help="primitive rows to run: bw (the three bandwidth rows), w8, echo, paged")
    ap.add_argument("--out-dir", default="target/bench/peers")
    ap.add_argument("--kv-out-dir", default="target/bench/workloads")
    args = ap.parse_args()
    args.transports = [t for t in args.transports.split(",") if t]
    args.engines = [e for e in args.engines.split(",") if e]
    want = {r for r in args.rows.split(",") if r}
    known = {"bw", "w8", "echo", "paged"}
    if not want or want - known:
        raise SystemExit(f"--rows: pick from {', '.join(sorted(known))}")
    args.rows = {k for k, _, _ in ROWS if k in want or (k.startswith("bw") and "bw" in want)}
    for e in args.engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e!r} ({', '.join(ENGINES)})")
    if args.repeats < 1 or args.kv_repeats < 1:
        raise SystemExit("--repeats and --kv-repeats must be at least 1")
    if not args.no_prims:
        prims(args)
    if not args.no_kv:
        kv(args)
    md = Path(args.out_dir) / "peers.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(REPORT) + "\n")


if __name__ == "__main__":
    main()
