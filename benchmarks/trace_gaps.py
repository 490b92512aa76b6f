"""Where a profiled fit's wall time goes, from the Chrome traces of ``profile_fit.py --trace-dir``.

For the plain trace: the fit's wall time, the GPU's busy time, the host's time blocked in syncs,
and the longest GPU idle gaps with the host calls made inside them. For the ``-stack`` trace: the
inclusive host time of the library's own functions (``algorithms/``, ``fusedml/``), the time they
spent blocked in syncs, and their call counts.

    python benchmarks/trace_gaps.py TRACE.json [--top 30]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
from collections import defaultdict

_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def _load(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def summary(events, top=12):
    """Wall, GPU busy, host sync-blocked time and the largest GPU gaps of one fit's trace."""
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    host = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op") and "dur" in e]
    if not gpu or not host:
        return {}
    t0 = min(e["ts"] for e in host)
    t1 = max(max(e["ts"] + e["dur"] for e in host), max(e["ts"] + e["dur"] for e in gpu))
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    syncs = [e for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"].startswith(_SYNC)]
    blocked = sum(e["dur"] for e in _union_events(syncs))
    gaps = []
    prev = t0
    for a, b in busy:
        if a - prev > 0:
            gaps.append((a - prev, prev, a))
        prev = b
    if t1 > prev:
        gaps.append((t1 - prev, prev, t1))
    gaps.sort(reverse=True)
    rows = []
    for dur, a, b in gaps[:top]:
        inside = [e for e in host if a <= e["ts"] < b and e.get("cat") == "cuda_runtime"]
        names = defaultdict(int)
        for e in inside:
            names[e["name"]] += 1
        rows.append({"us": dur, "at_us": a - t0, "host_calls": dict(names)})
    return {"wall_us": t1 - t0, "gpu_busy_us": sum(b - a for a, b in busy), "sync_blocked_us": blocked,
            "n_kernels": len(gpu), "n_syncs": len(syncs), "gaps": rows,
            "gap_total_us": sum(g[0] for g in gaps)}


def _union_events(evs):
    return [{"dur": b - a} for a, b in _union([(e["ts"], e["ts"] + e["dur"]) for e in evs])]


def own_functions(events, top=30, roots=("algorithms/", "fusedml/")):
    """Inclusive time, sync-blocked time and calls of the library's functions in a ``-stack`` trace."""
    py = [e for e in events if e.get("cat") == "python_function" and "dur" in e]
    syncs = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"].startswith(_SYNC)]
    acc = defaultdict(lambda: [0.0, 0.0, 0])
    for e in py:
        name = e["name"]
        if not any(r in name for r in roots):
            continue
        a, b = e["ts"], e["ts"] + e["dur"]
        blocked = sum(min(b, s["ts"] + s["dur"]) - max(a, s["ts"]) for s in syncs if s["ts"] < b and s["ts"] + s["dur"] > a)
        k = name[name.find(next(r for r in roots if r in name)):]
        acc[k][0] += e["dur"]
        acc[k][1] += blocked
        acc[k][2] += 1
    return sorted(([k, *v] for k, v in acc.items()), key=lambda r: -r[1])[:top]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    for path in args.traces:
        ev = _load(path)
        print(f"== {os.path.basename(path)}")
        s = summary(ev)
        if s:
            print(f"wall {s['wall_us'] / 1e3:.2f} ms, GPU busy {s['gpu_busy_us'] / 1e3:.2f} ms, GPU idle "
                  f"{s['gap_total_us'] / 1e3:.2f} ms, host blocked in {s['n_syncs']} syncs "
                  f"{s['sync_blocked_us'] / 1e3:.2f} ms, {s['n_kernels']} GPU ops")
            for g in s["gaps"]:
                print(f"  gap {g['us']:8.1f} us at {g['at_us'] / 1e3:7.3f} ms: {g['host_calls']}")
        rows = own_functions(ev, args.top)
        if rows:
            print(f"{'incl ms':>8} {'blocked':>8} {'calls':>6}  function")
            for k, incl, blk, n in rows:
                print(f"{incl / 1e3:8.3f} {blk / 1e3:8.3f} {n:6d}  {k}")


if __name__ == "__main__":
    main()
