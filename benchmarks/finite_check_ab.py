"""The linear fits' NaN / inf check of X: up front (a read of X and a sync of its own) against
deferred into the solver's first host copy (the default since session 38), in one process.

Both modes fit the same data, alternating fit by fit (``--fits`` a mode, after a warm fit each),
so the machine's drift between runs cancels; the up-front mode is the estimators' own code with
``as_design_matrix(check="defer")`` turned back into ``check=True``. Reports the median wall time
of each mode per fit and backend, and the difference.

    python benchmarks/finite_check_ab.py [--shapes 1000000x100 2000000x256] [--fits 21] [--out FILE]

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

import algorithms._base as base  # noqa: E402

_DEFERRED = base._check_design


def _up_front(t, name, check, info):
    return _DEFERRED(t, name, True if check == "defer" else check, info)


def _enter(mode):
    base._check_design = _up_front if mode == "up front" else _DEFERRED

    def leave():
        base._check_design = _DEFERRED
    return leave


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1000000x100", "2000000x256"])
    ap.add_argument("--algos", nargs="+", default=["logistic", "linearsvc", "poisson", "ridge"],
                    choices=["logistic", "linearsvc", "poisson", "ridge"])
    ap.add_argument("--backends", nargs="+", default=["fused", "ops"])
    ap.add_argument("--fits", type=int, default=21, help="fits per mode (alternating)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    if dev.type != "cuda":
        args.shapes, args.fits = ["400x8"], 2
    modes = ("up front", "deferred")
    rows = []
    print("| shape | fit | backend | up front ms | deferred ms | saved ms | iters |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.shapes:
        N, D = (int(s) for s in spec.split("x"))
        X, cases = _common.linear_fit_cases(N, D, dev)
        for algo in args.algos:
            for be in args.backends:
                make, y = cases[algo][0], cases[algo][1]
                ts, last = _common.alternate_fits(lambda make=make, be=be: make(be), X, y, modes, _enter,
                                                  args.fits, dev)
                iters = {m: int(np.max(e.n_iter_)) for m, e in last.items()}
                med = {m: sorted(v)[len(v) // 2] for m, v in ts.items()}
                rows.append({"shape": spec, "algo": algo, "backend": be, "fits": args.fits,
                             "up_front_ms": med["up front"], "deferred_ms": med["deferred"],
                             "saved_ms": med["up front"] - med["deferred"], "n_iter": iters,
                             "all_ms": ts})
                print(f"| {spec} | {algo} | {be} | {med['up front']:.2f} | {med['deferred']:.2f} "
                      f"| {med['up front'] - med['deferred']:+.2f} | {iters['deferred']} |", flush=True)
    path = _common.write_json("finite_check_ab", rows, extra={"args": vars(args)}, out=args.out)
    print("saved", path)


if __name__ == "__main__":
    main()
