"""Benchmark the fused Lloyd step (``fusedml.lloyd_step``) against the operator-level torch step.

    python benchmarks/bench_kmeans.py [--out PATH]

Per case: ms of one Lloyd step (assignment + centre sums), effective GB/s and % of the read-once
floor bytes(X) / 4.28 TB/s, the operator-level step (blocked GEMM distances, ``argmin``,
``index_add_``: what a torch user writes) and the speed-up, and the agreement with a float64
reference on fresh random data (label agreement, relative error of the sums). One Lloyd
iteration of ``KMeans`` (and of ``GaussianMixture``'s k-means initialisation) is one such step.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402

import fusedml  # noqa: E402

CASES = [(4_194_304, 16, 16), (1_048_576, 64, 64), (16_777_216, 8, 8), (1_048_576, 2, 128),
         (1_048_576, 128, 16), (1_048_576, 32, 256)]


def _weights(N, gen, dev, on):
    """Per-row sample weights in [0.5, 1.5) (``--weights``: the weighted kernels), or None."""
    return (0.5 + torch.rand(N, generator=gen)).to(dev) if on else None


def _stepper(shift, sw):
    """``step(X, C, sw=sw, **kw)``: :func:`fusedml.lloyd_step` about ``shift`` with weights ``sw``."""
    def step(X, C, sw=sw, **kw):
        return fusedml.lloyd_step(X, C, shift=shift, sample_weight=sw, check_finite=False, **kw)
    return step


def run_case(N, D, K, dev, gen, weights=False):
    X = torch.randn(N, D, generator=gen, device="cpu").to(dev)
    X += 3.0 * torch.randn(K, D, generator=gen).to(dev)[torch.randint(0, K, (N,), generator=gen).to(dev)]
    C = X[torch.randperm(N, generator=gen)[:K].to(dev)].clone()
    shift = X.double().mean(0)
    sw = _weights(N, gen, dev, weights)

    step = _stepper(shift, sw)
    floor_ms = X.numel() * X.element_size() / _common.H200_BANDWIDTH * 1e3
    row = {"case": f"{N}x{D} K={K}" + (" weighted" if weights else ""), "N": N, "D": D, "K": K,
           "floor_ms": floor_ms}
    plan = fusedml.kmeans.lloyd_plan(N, D, K, dev)
    row["plan"] = None if plan is None else {k: plan[k] for k in ("BLOCK_N", "BLOCK_D", "BLOCK_K", "num_warps", "programs",
                                                                  "REG")}
    row["form"] = None if plan is None else "reg" if plan["REG"] else "dot" if plan["USE_DOT"] else "fma"
    f = step(X, C, backend="fused")
    row["path"] = f.backend
    o = step(X, C, backend="ops")
    # float64 reference on a row sample (labels: agreement; sums over the sample's rows)
    idx = torch.randperm(N, generator=gen)[:200_000].to(dev)
    swi = None if sw is None else sw[idx]
    r = step(X[idx].double(), C.double(), sw=swi, backend="ops")
    fs = step(X[idx], C, sw=swi, backend="fused")
    row["label_agreement"] = float((fs.labels == r.labels).double().mean())
    row["rel_err_sums"] = float((fs.sums - r.sums).norm() / r.sums.norm())
    row["ops_vs_fused_labels"] = float((f.labels == o.labels).double().mean())
    row["fused_ms"] = _common.bench_ms(lambda: step(X, C, backend="fused"))
    row["ops_ms"] = _common.bench_ms(lambda: step(X, C, backend="ops"))
    if row["form"] == "reg":  # the form the register kernel replaced (session 20), same inputs
        prev = {"REG": False}
        row["prev_ms"] = _common.bench_ms(lambda: step(X, C, backend="fused", plan=prev))
        row["reg_over_prev"] = row["prev_ms"] / row["fused_ms"]
        if plan["REG"][0] >= 2:  # half the centres per thread (session 19's diag budget)
            half = {"REG_KI": plan["REG"][0] // 2}
            row["ki_half_ms"] = _common.bench_ms(lambda: step(X, C, backend="fused", plan=half))
    row["GB/s"] = X.numel() * X.element_size() / row["fused_ms"] / 1e6
    row["%floor"] = 100 * floor_ms / row["fused_ms"]
    row["speedup_ops"] = row["ops_ms"] / row["fused_ms"]
    return row


def sweep(N, D, K, dev, gen, budget_s=12.0, forms=(False, True), weights=False):
    """Time launch-plan variants of the fused step (form, BLOCK_N, warps, programs per SM); ``forms``:
    the ``USE_DOT`` values swept; ``weights``: with sample weights (the weighted kernels)."""
    X = torch.randn(N, D, generator=gen).to(dev)
    C = X[:K].clone()
    shift = X.double().mean(0)
    sw = _weights(N, gen, dev, weights)

    step = _stepper(shift, sw)
    ref = step(X.double(), C.double(), backend="ops")
    out = []
    t_end = time.perf_counter() + budget_s
    for use_dot in forms:
        for bn in ((16, 32, 64, 128) if use_dot else (32, 64, 128, 256)):
            for warps in (4, 8):
                for per_sm in (4, 8):
                    plan = {"USE_DOT": use_dot, "BLOCK_N": bn, "num_warps": warps, "per_sm": per_sm}
                    full = fusedml.kmeans.lloyd_plan(N, D, K, dev, **plan)
                    if (full is None or time.perf_counter() > t_end
                            or (not use_dot and bn * full["BLOCK_D"] * full["BLOCK_K"] > 65536)):
                        continue
                    try:
                        r = step(X, C, backend="fused", plan=plan)
                        err = float((r.sums - ref.sums).norm() / ref.sums.norm())
                        ms = _common.bench_ms(lambda: step(X, C, backend="fused", plan=plan), rep=20)
                    except Exception:  # noqa: BLE001 - out of resources etc.: skip the variant
                        ms, err = float("nan"), float("nan")
                    out.append((ms, err, plan))
    out = sorted((o for o in out if o[0] == o[0]), key=lambda o: o[0])
    model = fusedml.kmeans.lloyd_plan(N, D, K, dev)
    return {"case": f"{N}x{D} K={K}" + (" weighted" if weights else ""), "best_ms": out[0][0], "best_err": out[0][1],
            "best": out[0][2], "top5": out[:5],
            "model": {k: model[k] for k in ("USE_DOT", "BLOCK_N", "num_warps", "programs")} if model else None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON path (default benchmarks/results/kmeans-<gpu>-<date>.json)")
    p.add_argument("--quick", action="store_true", help="small shapes (CPU smoke run)")
    p.add_argument("--sweep", action="store_true", help="time launch-plan variants of --sweep-cases")
    p.add_argument("--sweep-cases", default="0,1,2", help="indices into CASES for --sweep (default 0,1,2)")
    p.add_argument("--sweep-dot-only", action="store_true", help="--sweep over the tl.dot form alone")
    p.add_argument("--sweep-budget", type=float, default=12.0, help="seconds per swept case")
    p.add_argument("--weights", action="store_true", help="steps with per-row sample weights (the weighted kernels)")
    args = p.parse_args(argv)
    dev = _common.device()
    gen = torch.Generator().manual_seed(0)
    cases = [(1024, d, k) for (_, d, k) in CASES[:3]] if args.quick or dev.type != "cuda" else CASES
    rows = []
    if args.sweep:
        picked = [int(i) for i in args.sweep_cases.split(",")]
        for N, D, K in ([cases[i] for i in picked] if dev.type == "cuda" and not args.quick else cases[:3]):
            rows.append(sweep(N, D, K, dev, gen, forms=(True,) if args.sweep_dot_only else (False, True),
                              budget_s=args.sweep_budget, weights=args.weights))
            print(rows[-1], flush=True)
        print(_common.write_json("kmeans-sweep", rows, {"args": vars(args)}, args.out))
        return
    for N, D, K in cases:
        try:
            rows.append(run_case(N, D, K, dev, gen, weights=args.weights))
        except Exception as e:  # noqa: BLE001 - one failing case must not end the run
            rows.append({"case": f"{N}x{D} K={K}", "error": f"{type(e).__name__}: {e}"[:300]})
        print(rows[-1], flush=True)
    path = _common.write_json("kmeans", rows, {"args": vars(args)}, args.out)
    print(f"\nwrote {path}\n")
    print(_common.markdown_table(rows, ["case", "path", "form", "floor_ms", "fused_ms", "prev_ms", "ki_half_ms", "GB/s", "%floor", "ops_ms",
                                        "speedup_ops", "label_agreement", "rel_err_sums", "error"]))


if __name__ == "__main__":
    main()
