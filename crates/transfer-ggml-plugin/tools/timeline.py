#!/usr/bin/env python3
"""Per-step timeline of llama-bench tg from a TRANSFER_RPC_TRACE file:

  cargo xtask bench llama-plugin --dev --servers 4 --rate 100mbit --delay 1ms \
      --rounds 1 --reps 1 --pp 8 --trace /tmp/t.txt
  python3 crates/transfer-ggml-plugin/tools/timeline.py /tmp/t.txt [run ...]

Made for that bench's model (n_embd 512: a tg step sets 2048 bytes of
embedding on the first server; n_vocab 256: 1024 bytes of logits).
S1..S4: the servers in the order of their processes' ids (start order);
C: this process's client (plugin arms only; the stock arm shows servers).
Step boundary: a server's 'GET_TENSOR 1024 bytes' line (the logits read).
Runs are separated by gaps > 0.5 s between boundaries. For each run, the
tg steps (boundary gaps < 100 ms), and for every event label (its k-th
occurrence in the step) the median offset from the previous boundary."""
import sys, re, collections, statistics

lines = []
for l in open(sys.argv[1], errors='replace'):
    p = l.rstrip('\n').split(' ', 2)
    if len(p) < 3: continue
    try: lines.append((int(p[1]), int(p[0]), p[2]))
    except ValueError: continue
lines.sort()
srv_pids = sorted({pid for t, pid, w in lines if w.startswith('server ')})
# boundaries
bounds = [(t, pid) for t, pid, w in lines if w.startswith('server ') and 'GET_TENSOR 1024 bytes' in w]
runs = []
for b in bounds:
    if runs and b[0] - runs[-1][-1][0] < 500_000:
        runs[-1].append(b)
    else:
        runs.append([b])
stage_of = {}
def label(pid, w):
    if w.startswith('server '):
        m = re.match(r'server session (\d+): (.*)', w)
        what = m.group(2) if m else w[7:]
        what = re.sub(r'\d+ bytes', lambda x: x.group(0), what)
        return f'S{srv_pids.index(pid)+1} {what}'
    w = re.sub(r'waited \d+ us', 'waited', w)
    w = re.sub(r'readers_done \w+', '', w)
    return f'C {w}'
which = sys.argv[2:] and [int(x) for x in sys.argv[2:]]
for ri, run in enumerate(runs):
    if which and ri not in which: continue
    if len(run) < 10: continue
    t0, t1 = run[0][0], run[-1][0]
    pids = collections.Counter(pid for t, pid, w in lines if t0 <= t <= t1 and not w.startswith('server '))
    steps = []
    gaps = [b[0]-a[0] for a, b in zip(run, run[1:])]
    ev = [x for x in lines if t0 <= x[0] <= t1]
    j = 0
    for (a, _), (b, _) in zip(run, run[1:]):
        if b - a > 100_000: continue
        occ = collections.Counter(); st = []
        waits = collections.defaultdict(list)
        for t, pid, w in ev:
            if a < t <= b:
                lb = label(pid, w); occ[lb] += 1
                m = re.search(r'waited (\d+) us', w)
                st.append((f'{lb} #{occ[lb]}', t - a, int(m.group(1)) if m else None))
        steps.append(st)
    if not steps: continue
    tg = [s for s in steps if any(x[0].startswith('S1 SET_TENSOR 2048 bytes') for x in s)]
    if not tg: continue
    durs = [s[-1][1] for s in tg if s]
    print(f'== run {ri}: client pids {dict(pids)}, tg steps {len(tg)}, '
          f'median step {statistics.median(durs)/1000:.2f} ms (min {min(durs)/1000:.2f})')
    agg = collections.defaultdict(list); wt = collections.defaultdict(list)
    for s in tg:
        for lb, off, w in s:
            agg[lb].append(off)
            if w is not None: wt[lb].append(w)
    rows = sorted((statistics.median(v), lb, len(v)) for lb, v in agg.items() if len(v) >= len(tg)//2)
    for med, lb, n in rows:
        extra = f'  (waited {statistics.median(wt[lb]):.0f})' if wt[lb] else ''
        print(f'   {med:8.0f}  {lb}{extra}')
    sent = collections.defaultdict(int)
    for s in tg:
        for lb, off, w in s:
            m = re.match(r'C (\S+) SEND \S+ (\d+)', lb)
            if m: sent[m.group(1)] += int(m.group(2))
    print('   client bytes sent per step:', {k: v//len(tg) for k, v in sent.items()})
