"""Probe: dense rows whose byte length is not a multiple of 16 (odd feature counts).

The dense kernels read a row with 16-byte vector loads only when the row stride and D are
multiples of the vector (``mmchain.dense._vec``); rows of 55 fp32 values, or of 137 bf16 values,
are read with 2- or 4-byte loads. This times, per width, the m = 1 passes of a fit on the fused
backend (``mmchain``, ``matvec``, the logistic ``loss_gradient``), the same passes on X copied into
rows padded with zero columns to the next multiple of the vector, and the operator-level code
(``ops``: cuBLAS GEMVs), each against the read-once floor of the unpadded X; with ``--fits``,
whole logistic fits, binary and 5-class (fused, fused on the padded copy, ops), medians of the given count.

    python benchmarks/odd_width_probe.py [--widths 55 56 ...] [--fits 5] [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/odd_width_probe.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import torch

import _common
import fusedml
from fusedml.mmchain.dense import aligned_rows

#: (N, D, dtype): odd and aligned widths side by side
CASES = [(1_000_000, 55, "float32"), (1_000_000, 56, "float32"), (1_000_000, 101, "float32"),
         (1_000_000, 100, "float32"), (2_000_000, 27, "float32"), (2_000_000, 28, "float32"),
         (1_000_000, 137, "bfloat16"), (1_000_000, 144, "bfloat16")]


def padded(X: torch.Tensor) -> torch.Tensor:
    """X copied into rows of a whole number of 16-byte vectors, the added columns zero."""
    v = 16 // X.element_size()
    D = X.shape[1]
    Dp = -(-D // v) * v
    Xp = torch.zeros(X.shape[0], Dp, dtype=X.dtype, device=X.device)
    Xp[:, :D] = X
    return Xp


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fits", type=int, default=0, help="whole logistic fits per variant (0: none)")
    ap.add_argument("--only", nargs="*", default=None, help="NxD[:dtype] cases instead of the default list")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    gen = torch.Generator(device=dev).manual_seed(40)
    cases = CASES
    if args.only:
        cases = []
        for s in args.only:
            shape, _, dt = s.partition(":")
            n, d = (int(t) for t in shape.split("x"))
            cases.append((n, d, dt or "float32"))
    rows = []
    for N, D, dt in cases:
        if args.quick:
            N = 64
        dtype = getattr(torch, dt)
        X = torch.randn(N, D, generator=gen, device=dev).to(dtype)
        Xp = padded(X)
        Dp = Xp.shape[1]
        y = torch.randn(D + 1, generator=gen, device=dev) / D ** 0.5
        yp = torch.zeros(Dp + 1, device=dev)
        yp[:D], yp[Dp] = y[:D], y[D]
        v = torch.rand(N, generator=gen, device=dev)
        lbl = (torch.rand(N, generator=gen, device=dev) < 0.5).float()
        floor_ms = X.numel() * X.element_size() / _common.H200_BANDWIDTH * 1e3
        Xf = X.float()

        def ops_chain():
            return Xf.T @ (v * (Xf @ y[:D] + y[D])) if dtype == torch.float32 else X.T @ (v * (X @ y[:D].to(dtype)))

        passes = {
            "mmchain": (lambda A, b: fusedml.mmchain(A, b, v, intercept=True, backend="fused")),
            "matvec": (lambda A, b: fusedml.matvec(A, b, intercept=True, backend="fused")),
            "loss_gradient": (lambda A, b: fusedml.loss_gradient(A, b, lbl, loss="logistic", intercept=True,
                                                                 backend="fused").grad),
        }
        for name, fn in passes.items():
            want = fn(X, y)
            got_p = fn(Xp, yp)
            if name != "matvec":  # drop the padded columns' entries of a [Dp + 1] result
                got_p = torch.cat([got_p[:D], got_p[Dp:]])
            err = float((got_p.double() - want.double()).norm() / want.double().norm())
            base = {"N": N, "D": D, "dtype": dt, "pass": name, "floor_ms": floor_ms}
            Xv = aligned_rows(X)
            got_v = fn(Xv, y)
            err_v = float((got_v.double() - want.double()).norm() / want.double().norm())
            for variant, f in (("fused", lambda: fn(X, y)), (f"fused padded to {Dp}", lambda: fn(Xp, yp)),
                               ("fused aligned view", lambda: fn(Xv, y))):
                if variant == "fused aligned view" and Xv is X:
                    continue
                ms = _common.bench_ms(f)
                rows.append(dict(base, variant=variant, ms=ms, floor_pct=100 * floor_ms / ms,
                                 padded_vs_plain_rel=err if "padded" in variant else
                                 err_v if "aligned" in variant else None))
            if name == "mmchain" and dtype == torch.float32:
                ms = _common.bench_ms(ops_chain)
                rows.append(dict(base, variant="ops", ms=ms, floor_pct=100 * floor_ms / ms))
        pad_ms = _common.bench_ms(lambda: aligned_rows(X))
        rows.append({"N": N, "D": D, "dtype": dt, "pass": "pad copy", "variant": f"to {Dp}", "ms": pad_ms,
                     "floor_ms": floor_ms, "floor_pct": 100 * floor_ms / pad_ms})
        if args.fits and dtype == torch.float32:
            from algorithms import LogisticRegression

            cls = torch.randint(0, 5, (N,), generator=gen, device=dev)
            for (variant, A, be), (fit, target) in itertools.product(
                    (("fused", X, "fused"), ("fused aligned view", None, "fused"), ("ops", X, "ops")),
                    (("logistic fit", lbl), ("5-class fit", cls))):
                ts, est = [], None
                for i in range(args.fits + 1):
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    Xa = aligned_rows(X) if A is None else A  # the aligned fit pays for its copy
                    est = LogisticRegression(C=1.0, backend=be).fit(Xa, target)
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    if i:
                        ts.append(1e3 * (time.perf_counter() - t0))
                rows.append({"N": N, "D": D, "dtype": dt, "pass": fit, "variant": variant,
                             "ms": statistics.median(ts), "n_iter": int(est.n_iter_[0]) if hasattr(est.n_iter_, "__len__")
                             else int(est.n_iter_), "floor_ms": floor_ms})
    cols = ["N", "D", "dtype", "pass", "variant", "ms", "floor_pct", "padded_vs_plain_rel", "n_iter"]
    path = _common.write_json("odd_width_probe", rows, {"args": vars(args)}, out=args.out)
    print(_common.markdown_table(rows, cols))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
