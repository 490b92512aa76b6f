"""Host cost of one public ``fusedml.mmchain`` call against its GPU time (why a short case's
``do_bench`` median moves between runs).

For each case of ``bench_mmchain.py``: ``do_bench`` medians of the call as a user makes it
(``config=None``), of the same call with the model's config passed explicitly, and of the "ops"
baseline, in alternating rounds; the host time of one call (``--calls`` calls queued without a
synchronisation: when it exceeds the GPU time, ``do_bench`` measures the host); and a cProfile
of the default call's host path (the top ``--top`` functions by own time).

    python benchmarks/call_probe.py [--cases csr-powerlaw csr-4Mx100k] [--rounds 3] [--out FILE]

Without CUDA it runs the quick shapes under the interpreter (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _common  # noqa: E402
import bench_mmchain  # noqa: E402
import fusedml  # noqa: E402


def host_us(fn, calls: int, dev) -> float:
    """Microseconds of host time per call of ``fn`` over ``calls`` calls queued back to back."""
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return 1e6 * t / calls


def profile_top(fn, calls: int, top: int) -> str:
    """cProfile of ``calls`` calls of ``fn``: the ``top`` functions by own time."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["csr-powerlaw", "csr-4Mx100k", "dense-2Mx128"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    table = bench_mmchain.FULL if dev.type == "cuda" else bench_mmchain.QUICK
    if dev.type != "cuda":
        args.rounds, args.calls = 1, 2
    rows = []
    print("| case | default ms | explicit config ms | ops ms | host us / call (default, explicit) |")
    print("|---|---|---|---|---|")
    for name in args.cases:
        X, y, v, _ = bench_mmchain.make_case(table[name], dev, seed=1)
        m = 1 if y.ndim == 1 else y.shape[1]
        fused = lambda: fusedml.mmchain(X, y, v, backend="fused")  # noqa: E731
        cfg = {}
        if isinstance(X, fusedml.CSRMatrix):
            from fusedml.mmchain import csr as csr_mod

            fused(), fused()  # the first call scatters, the second builds the cached copy
            cfg = csr_mod.csr_sweep_configs(X, m, X.val.dtype)[0]  # the model's pick, as the sweep times it
        explicit = lambda: fusedml.mmchain(X, y, v, backend="fused", config=cfg)  # noqa: E731
        ops = lambda: fusedml.mmchain(X, y, v, backend="ops")  # noqa: E731
        explicit(), ops()
        row = {"case": name, "default_ms": [], "explicit_ms": [], "ops_ms": [], "host_default_us": [],
               "host_explicit_us": []}
        for r in range(args.rounds):
            order = [("default", fused), ("explicit", explicit)]
            for key, fn in (order if r % 2 == 0 else order[::-1]):
                row[f"{key}_ms"].append(_common.bench_ms(fn))
                row[f"host_{key}_us"].append(host_us(fn, args.calls, dev))
            row["ops_ms"].append(_common.bench_ms(ops))
        row["profile_default"] = profile_top(fused, args.calls, args.top)
        rows.append(row)
        med = {k: sorted(row[k])[len(row[k]) // 2] for k in ("default_ms", "explicit_ms", "ops_ms",
                                                            "host_default_us", "host_explicit_us")}
        print(f"| {name} | {med['default_ms']:.3f} | {med['explicit_ms']:.3f} | {med['ops_ms']:.3f} "
              f"| {med['host_default_us']:.0f}, {med['host_explicit_us']:.0f} |", flush=True)
    for row in rows:
        print(f"\n--- {row['case']}: host profile of {args.calls} default calls\n{row['profile_default']}")
    path = _common.write_json("call_probe", rows, extra={"args": vars(args)}, out=args.out)
    print("saved", path)


if __name__ == "__main__":
    main()
