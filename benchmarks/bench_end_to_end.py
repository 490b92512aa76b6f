"""Issue 4: whole ``fit`` per estimator, backend="fused" vs backend="ops" on the same GPU and data,
and scikit-learn on the CPU.

Grid (defaults, float32, seeded synthetic data built on the GPU):

* dense ``1M x 100``: logistic (binary), multinomial logistic (5 classes), LinearSVC, Poisson,
  Gamma, Ridge;
* CSR ``1M x 100k``, power-law rows with 32 nnz on average: logistic, LinearSVC, Poisson, Ridge;
* Gaussian mixture ``1M x 16``, K = 16, diagonal covariances.

Every backend gets the same hyper-parameters, ``max_iter`` and ``tol``; each fused/ops timing is
the median of ``--repeat`` fits after an untimed 2-iteration warm-up fit (compilation, handles,
the ops backend's cached CSR transpose). Rows also give the time to a common objective (the
worst final objective among fused/ops, read from ``history_``). scikit-learn runs once on the
host copy; when a subsample probe predicts more than ``--sklearn-budget`` seconds it is fitted
on the subsample only and its time is scaled by rows (the row says so).

Writes ``benchmarks/results/end_to_end-<gpu>-<date>.json`` (via ``benchmarks/_common.py``), the
plots in a folder of the same stem, and prints the markdown tables last.

    python benchmarks/bench_end_to_end.py              # full GPU run (about 5 minutes on an H200)
    python benchmarks/bench_end_to_end.py --quick      # CPU smoke run, small data
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # the repository root: fusedml, algorithms, datasets

import _common  # noqa: E402

from fusedml import bench  # noqa: E402

DENSE_ALGOS = ["logistic", "logistic-multinomial", "linearsvc", "poisson", "gamma", "ridge"]
CSR_ALGOS = ["logistic", "linearsvc", "poisson", "ridge"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke run on small data (cpu/ops/sklearn backends)")
    p.add_argument("--rows", type=int, default=1_000_000, help="N of every data set")
    p.add_argument("--dense-d", type=int, default=100)
    p.add_argument("--csr-d", type=int, default=100_000)
    p.add_argument("--nnz-per-row", type=float, default=32)
    p.add_argument("--profile", default="powerlaw", choices=["uniform", "constant", "powerlaw"])
    p.add_argument("--gmm-d", type=int, default=16)
    p.add_argument("--gmm-k", type=int, default=16)
    p.add_argument("--parts", nargs="+", default=["dense", "csr", "gmm"], choices=["dense", "csr", "gmm"])
    p.add_argument("--algorithms", nargs="+", choices=list(bench.ALGORITHMS),
                   help="restrict to these algorithms")
    p.add_argument("--backends", nargs="+", choices=list(bench.BACKENDS),
                   help="default: fused ops sklearn on a GPU; cpu ops sklearn with --quick")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-iter", type=int, help="override every algorithm's max_iter (same for all backends)")
    p.add_argument("--tol", type=float, help="override every algorithm's tol (same for all backends)")
    p.add_argument("--sklearn-budget", type=float, default=60.0,
                   help="seconds above which scikit-learn is fitted on a subsample (time scaled by rows)")
    p.add_argument("--out", help="JSON path (default benchmarks/results/end_to_end-<gpu>-<date>.json)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)

    import torch

    if args.quick:
        device = "cpu"
        n = min(args.rows, 20_000)
        csr_d, gmm_k = min(args.csr_d, 2_000), min(args.gmm_k, 4)
        dense_d, gmm_d = min(args.dense_d, 20), min(args.gmm_d, 8)
        backends = args.backends or ["cpu", "ops", "sklearn"]
        repeat = 1
    else:
        if not torch.cuda.is_available():
            p.error("no CUDA GPU: run on a GPU machine, or pass --quick for the CPU smoke run")
        device = "cuda"
        n, csr_d, gmm_k, dense_d, gmm_d = args.rows, args.csr_d, args.gmm_k, args.dense_d, args.gmm_d
        backends = args.backends or ["fused", "ops", "sklearn"]
        repeat = args.repeat
    specs, pairs = [], set()
    if "dense" in args.parts:
        s = f"synthetic-dense:{n}x{dense_d}"
        specs.append(s)
        pairs |= {(s, a) for a in DENSE_ALGOS}
    if "csr" in args.parts:
        s = f"synthetic-csr:{n}x{csr_d}:{args.nnz_per_row:g}:{args.profile}"
        specs.append(s)
        pairs |= {(s, a) for a in CSR_ALGOS}
    if "gmm" in args.parts:
        s = f"synthetic-gmm:{n}x{gmm_d}:{gmm_k}"
        specs.append(s)
        pairs.add((s, "gmm"))
    algos = [a for a in bench.ALGORITHMS if args.algorithms is None or a in args.algorithms]
    t0 = time.perf_counter()
    rows = bench.run_grid(algos, specs, backends, repeat=repeat, device=device, dtype="float32",
                          max_iter=args.max_iter, tol=args.tol, seed=0, pairs=pairs,
                          sklearn_budget=args.sklearn_budget if args.sklearn_budget > 0 else None)
    wall = time.perf_counter() - t0
    path = _common.write_json("end_to_end", rows, extra={"args": vars(args), "wall_s": wall}, out=args.out)
    print(f"wrote {path}")
    if not args.no_plots:
        plot_dir = os.path.splitext(path)[0]
        os.makedirs(plot_dir, exist_ok=True)
        for f in bench.plot(rows, plot_dir):
            print(f"wrote {f}")
    print(f"\nwall time {wall:.1f} s on {bench.device_name(device)}\n")
    print(bench.summary_table(rows))
    print(bench.markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
