"""Whole linear (or GaussianMixture) fits under two settings of the library's switches, in one process.

The settings alternate fit by fit (``--fits`` each, after a warm fit each), so the machine's drift
between runs cancels: the A/B for host-side changes, whose ~0.1-1 ms effects drown in the
+-1 ms that separate processes and machine starts move a fit by. Each setting is a list of
``NAME=VALUE`` (the switches are read at each fit: ``FUSEDML_SOLVE_AHEAD``, ``FUSEDML_CG_LAG``,
``FUSEDML_CAPTURE_AFTER``, ``FUSEDML_FUSED_CG``, ...), or ``package.module:ATTRIBUTE=LITERAL`` for a
switch read once at import (``fusedml._launch:SKIP_EMPTY_HOOKS=False``). Reports the median wall time per setting,
fit and backend, and B's saving over A.

    python benchmarks/env_ab.py --a FUSEDML_SOLVE_AHEAD=0 --b FUSEDML_SOLVE_AHEAD=1 \\
        [--shapes 1000000x100 2000000x256] [--algos ...] [--fits 21] [--dask ROWS] [--out FILE]

Without CUDA it runs a tiny shape under the interpreter (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def parse_setting(items) -> dict:
    """``["NAME=VALUE", ...]`` -> ``{NAME: VALUE}`` (an empty VALUE unsets NAME)."""
    out = {}
    for it in items:
        name, sep, value = it.partition("=")
        if not sep or not name:
            raise SystemExit(f"env_ab: a setting is NAME=VALUE, got {it!r}")
        out[name] = value
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", nargs="+", required=True, metavar="NAME=VALUE", help="setting A (the baseline)")
    ap.add_argument("--b", nargs="+", required=True, metavar="NAME=VALUE", help="setting B")
    ap.add_argument("--shapes", nargs="+", default=["1000000x100", "2000000x256"])
    ap.add_argument("--algos", nargs="+", default=["logistic", "linearsvc", "poisson", "ridge"],
                    choices=_common.LINEAR_FIT_ALGOS + _common.GMM_FIT_ALGOS,
                    help="linear fits, or GaussianMixture fits (gmm-TYPE: K = 16 on mixture data of the shape)")
    ap.add_argument("--backends", nargs="+", default=["fused", "ops"])
    ap.add_argument("--fits", type=int, default=21, help="fits per setting (alternating)")
    ap.add_argument("--dask", type=int, default=0, metavar="ROWS",
                    help="fit a Dask array of ROWS-row chunks of X (a StreamedMatrix per fit, its upload "
                         "included); 0: X in GPU memory")
    ap.add_argument("--csr", default=None, metavar="NNZ:PROFILE",
                    help="linear fits on a CSR matrix of each shape (NNZ nonzeros per row, row-length PROFILE "
                         "uniform|constant|powerlaw, e.g. 32:powerlaw) instead of dense Gaussian X")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    settings = {"A": parse_setting(args.a), "B": parse_setting(args.b)}
    dev = _common.device()
    if dev.type != "cuda":
        args.shapes, args.fits = ["400x8"], 2
    rows = []
    print(f"A = {settings['A']}, B = {settings['B']}")
    print("| shape | fit | backend | A ms | B ms | saved ms | iters |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.shapes:
        N, D = (int(s) for s in spec.split("x"))
        data = {}
        linear = _common.linear_fit_cases
        if args.csr:
            nnz, _, profile = args.csr.partition(":")
            linear = lambda N, D, dev: _common.csr_fit_cases(N, D, dev, float(nnz), profile or "uniform")  # noqa: E731
        for kind, make_cases in (("linear", linear), ("gmm", _common.gmm_fit_cases)):
            if any(a.startswith("gmm-") == (kind == "gmm") for a in args.algos):
                X, cases = make_cases(N, D, dev)
                if args.dask:
                    import dask.array as da

                    X = da.from_array(X.cpu().numpy(), chunks=(args.dask, D))
                    cases = {k: (make, None if y is None else y.cpu().numpy()) for k, (make, y) in cases.items()}
                data[kind] = X, cases
        for algo in args.algos:
            X, cases = data["gmm" if algo.startswith("gmm-") else "linear"]
            for be in args.backends:
                make, y = cases[algo]
                ts, last = _common.alternate_fits(lambda make=make, be=be: make(be), X, y, ("A", "B"),
                                                  lambda m: _common.set_env(settings[m]), args.fits, dev)
                iters = {m: int(np.max(e.n_iter_)) for m, e in last.items()}
                med = {m: sorted(v)[len(v) // 2] for m, v in ts.items()}
                rows.append({"shape": spec, "algo": algo, "backend": be, "fits": args.fits, "a_ms": med["A"],
                             "b_ms": med["B"], "saved_ms": med["A"] - med["B"], "n_iter": iters, "all_ms": ts})
                print(f"| {spec} | {algo} | {be} | {med['A']:.2f} | {med['B']:.2f} | {med['A'] - med['B']:+.2f} "
                      f"| {iters['B']} |", flush=True)
    path = _common.write_json("env_ab", rows, extra={"args": vars(args), "settings": settings}, out=args.out)
    print("saved", path)


if __name__ == "__main__":
    main()
