"""Markdown tables for the README from saved benchmark JSON (no GPU needed).

    python benchmarks/report.py benchmarks/results/mmchain-*.json benchmarks/results/gmm-*.json ...

Each file is recognised by its rows (bench_mmchain, bench_solver_ops, bench_gmm,
bench_end_to_end, bench_streaming) and printed as one table with the columns the README shows.
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402


def _fmt(x):
    if isinstance(x, float):
        return f"{x:.3g}"
    return "" if x is None else str(x)


def mmchain_table(rows):
    out = []
    for r in rows:
        row = {"case": r["case"], "dtype": r["dtype"], "floor ms": r.get("floor_ms"), "fused ms": r.get("fused_ms"),
               "% of floor": r.get("%floor"), "rel err": r.get("rel_err")}
        if r.get("kind") == "csr":
            row["ops ms"] = f"{_fmt(r.get('ops_cached_ms'))} (cached XT) / {_fmt(r.get('ops_on_the_fly_ms'))} (X.t())"
            row["speed-up"] = f"{_fmt(r.get('speedup_cached'))}x / {_fmt(r.get('speedup_on_the_fly'))}x"
        else:
            row["ops ms"] = r.get("ops_ms")
            row["speed-up"] = f"{_fmt(r.get('speedup_ops'))}x"
        row["model / sweep best"] = r.get("model/best")
        out.append(row)
    cols = ["case", "dtype", "floor ms", "fused ms", "% of floor", "ops ms", "speed-up", "model / sweep best", "rel err"]
    return _common.markdown_table(out, cols)


def gmm_table(rows):
    out = []
    for r in rows:
        out.append({"N x D, K": f"{r['N']:,} x {r['D']}, {r['K']}", "cov": r["cov"], "precision": r.get("precision"),
                    "path": r.get("path"), "fused ms": r.get("ms"), "target ms": r.get("target_ms"),
                    "% of floor": r.get("pct_floor"), "TFLOP/s": r.get("tflops"), "ops ms": r.get("ms_ops"),
                    "speed-up vs ops": r.get("speedup_ops"), "single / two-pass": r.get("single_over_two"),
                    "max rel err": max(r.get(k) or 0.0 for k in ("err_nk", "err_s1", "err_s2", "err_ll"))})
    return _common.markdown_table(out, list(out[0]))


def solver_ops_table(rows):
    """bench_solver_ops rows: each solver pass, fused (model pick and sweep best) against ops."""
    out = []
    for r in rows:
        out.append({"N x D": r["shape"], "m": r["m"], "pass": r["pass"], "floor ms": r["floor_ms"],
                    "fused ms": r["fused_ms"], "% of floor": r["%floor"], "sweep best ms": r.get("best_ms"),
                    "ops ms": r["ops_ms"], "speed-up": f"{_fmt(r['speedup'])}x", "rel err": r["rel_err"]})
    cols = ["N x D", "m", "pass", "floor ms", "fused ms", "% of floor", "sweep best ms", "ops ms", "speed-up",
            "rel err"]
    return _common.markdown_table(out, cols)


def main(paths):
    from fusedml import bench

    for p in paths:
        with open(p) as f:
            d = json.load(f)
        rows = d["rows"]
        print(f"\n<!-- {os.path.basename(p)} -->")
        if rows and "pass" in rows[0]:
            print(solver_ops_table(rows))
        elif rows and "fused_ms" in rows[0]:
            print(mmchain_table(rows))
        elif rows and "single_over_two" in rows[0]:
            print(gmm_table(rows))
        elif rows and "algorithm" in rows[0]:
            print(bench.summary_table(rows))
        else:
            cols = sorted({k for r in rows for k in r if not isinstance(r[k], (list, dict))})
            print(_common.markdown_table(rows, cols))


if __name__ == "__main__":
    main(sys.argv[1:])
