"""The compile-checked tiles of session 35 against the tiles the model planned, side by side.

For each case: the library's launch (``config=None``: rows or columns from
``mmchain.dense.fitting_block_n`` / ``fitting_block_d``, the model's warps) and the planned tile
forced through ``config``; ``do_bench`` medians, % of the read-once floor and the float64 check.

    python benchmarks/tile_ab.py [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/tile_ab.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import sys

import torch

import _common
import fusedml

#: name, (N, D, m), the call, the planned tile the library's compile check may change
CASES = [
    ("loss pass, multinomial, rows of 55 (unaligned)", (1_000_000, 55, 7), "loss", {"block_n": 16}),
    ("Hessian product, 1024-value rows, fp32 FMA dot", (1_000_000, 1024, 16), "hessian", {"num_warps": 4}),
    ("matvec [X,1] W, 256-value rows", (2_000_000, 256, 5), "matvec", {"block_d": 256}),
]


def _case(N, D, m, dev, gen):
    X = torch.randn(N, D, generator=gen, device=dev)
    W = 0.1 * torch.randn(D + 1, m, generator=gen, device=dev)
    lbl = torch.nn.functional.one_hot(torch.randint(0, m, (N,), generator=gen, device=dev), m).float()
    h = torch.rand(N, m, generator=gen, device=dev)
    return X, W, lbl, h


def _calls(kind, X, W, lbl, h):
    """``(fused(config), float64 reference)`` of one pass."""
    A = lambda: torch.cat([X.double(), torch.ones(X.shape[0], 1, dtype=torch.float64, device=X.device)], 1)  # noqa: E731
    if kind == "loss":
        def ref():
            eta = A() @ W.double()
            p = torch.softmax(eta, 1)
            return A().T @ (p - lbl.double())
        return (lambda cfg: fusedml.loss_gradient(X, W, lbl, loss="multinomial", intercept=True, backend="fused",
                                                  config=cfg).grad), ref
    if kind == "hessian":
        return (lambda cfg: fusedml.mmchain(X, W, v=h, intercept=True, backend="fused", config=cfg),
                lambda: A().T @ (h.double() * (A() @ W.double())))
    return (lambda cfg: fusedml.matvec(X, W, intercept=True, backend="fused", config=cfg),
            lambda: A() @ W.double())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    gen = torch.Generator(device=dev).manual_seed(35)
    rows = []
    for name, (N, D, m), kind, planned in CASES:
        if args.quick:
            N = 300
        X, W, lbl, h = _case(N, D, m, dev, gen)
        fused, ref = _calls(kind, X, W, lbl, h)
        want = ref()
        floor_ms = X.numel() * X.element_size() / _common.H200_BANDWIDTH * 1e3
        row = {"case": name, "N": N, "D": D, "m": m, "floor_ms": floor_ms, "planned": str(planned)}
        for side, cfg in (("library", None), ("planned", planned)):
            got = fused(cfg)
            row[f"{side}_rel_err"] = float((got.double() - want).norm() / want.norm())
            row[f"{side}_ms"] = _common.bench_ms(lambda: fused(cfg)) if not args.quick else None
        if not args.quick:
            row["speedup"] = row["planned_ms"] / row["library_ms"]
            row["library_%floor"] = 100 * floor_ms / row["library_ms"]
        rows.append(row)
        del X, W, lbl, h
    cols = ["case", "N", "D", "m", "floor_ms", "library_ms", "library_%floor", "planned", "planned_ms", "speedup",
            "library_rel_err", "planned_rel_err"]
    print(_common.markdown_table(rows, cols))
    print("wrote", _common.write_json("tile_ab", rows, out=args.out))
    bad = [r["case"] for r in rows if max(r["library_rel_err"], r["planned_rel_err"]) > 1e-5]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
