"""Session 17 investigation: the unrolled kernel of session 16 (``fusedml/mmchain/_dense_s16.py``) against
the current one on the same Hessian product (16M x 64, m = 3, mul form, intercept): times, the
compiled kernels' registers / spills / persistent grid, and their SASS loop instruction counts.
Run under ``ncu --kernel-name regex:_mmchain_small --launch-skip 2 --launch-count 2`` for profiles.

    python benchmarks/small_ab.py [--shape 16000000,64,3] [--form mul] [--ncu]
"""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _common import bench_ms  # noqa: E402


def loop_hist(kernel):
    from _sm90 import sass

    L = sass(kernel).splitlines()
    ins = [(int(m.group(1), 16), l) for l in L for m in [re.match(r"\s+/\*([0-9a-f]{4})\*/\s+(.*)", l)] if m]
    best = None
    for a, l in ins:
        m = re.search(r"BRA\s.*?0x([0-9a-f]+)", l)
        if m:
            t = int(m.group(1), 16)
            if t < a and (best is None or a - t > best[1] - best[0]):
                best = (t, a)
    body = [l for a, l in ins if best and best[0] <= a <= best[1]]
    ops = collections.Counter(re.sub(r"^\s*/\*[0-9a-f]*\*/\s*(@!?U?P\w+\s+)?", "", l).split()[0] for l in body)
    ldg = [i for i, l in enumerate(body) if "LDG.E.128" in l]
    return len(body), ldg, dict(sorted(ops.items()))


def compiled(fn):
    out = []
    for v in fn.device_caches.values():
        for k in v[0].values():
            if hasattr(k, "n_regs"):
                out.append(k)
    return out


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
        print(name, "resident", {k[3]: v for k, v in mod._RESIDENT.items()} if False else list(mod._RESIDENT.values()))
        for k in compiled(mod._mmchain_small_kernel):
            n, ldg, ops = loop_hist(k)
            print(name, "regs", k.n_regs, "spills", k.n_spills, "shared", k.metadata.shared, "loop", n,
                  "ldg128 at", ldg)
            print("   ", ops)


if __name__ == "__main__":
    main()
