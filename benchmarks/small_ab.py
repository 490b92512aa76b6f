"""Session 17 investigation: the unrolled kernel of session 16 (``fusedml/mmchain/_dense_s16.py``) against
the current one on the same Hessian product (16M x 64, m = 3, mul form, intercept): times, the
compiled kernels' registers / spills / persistent grid, and their SASS loop instruction counts.
Run under ``ncu --kernel-name regex:_mmchain_small --launch-skip 2 --launch-count 2`` for profiles.

    python benchmarks/small_ab.py [--shape 16000000,64,3] [--form mul] [--ncu]
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _common import bench_ms, compiled_kernels  # noqa: E402
from _sm90 import sass  # noqa: E402
from sass_probe import loop_report  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16000000,64,3")
    ap.add_argument("--form", default="mul")
    ap.add_argument("--ncu", action="store_true", help="one launch each after the warm-up, no timing")
    args = ap.parse_args(argv)
    from fusedml.mmchain import dense as new
    from fusedml.mmchain._checks import prepare_mmchain

    try:
        old = importlib.import_module("fusedml.mmchain._dense_s16")
    except ImportError:
        sys.exit("needs the session-16 kernel module: git show c9afb96:fusedml/mmchain/dense.py "
                 "> fusedml/mmchain/_dense_s16.py")
    N, D, m = (int(v) for v in args.shape.split(","))
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    X = torch.randn(N, D, generator=g, device=dev)
    S = 0.1 * torch.randn(D + 1, m, generator=g, device=dev)
    h = torch.rand(N, m, generator=g, device=dev)
    P = prepare_mmchain(X, S, h, S, 1.0, 0.5, intercept=True, v_op=args.form, check_finite=False)
    fns = {"s16": lambda: old.dense_mmchain_fused(P), "new": lambda: new.dense_mmchain_fused(P)}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    if args.ncu:
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        return
    for name, f in fns.items():
        print(name, "ms", round(bench_ms(f), 4), flush=True)
    for name, mod in (("s16", old), ("new", new)):
        print(name, "resident", list(mod._RESIDENT.values()))
        for k in compiled_kernels(mod._mmchain_small_kernel):
            n, ldg, ops = loop_report(sass(k))
            print(name, "regs", k.n_regs, "spills", k.n_spills, "shared", k.metadata.shared, "loop", n,
                  "ldg128 at", ldg)
            print("   ", ops)


if __name__ == "__main__":
    main()
