"""The compile-checked tiles against the tiles the model planned (and other candidates), side by side.

For each case: the library's launch (``config=None``: rows or columns from
``mmchain.dense.fitting_block_n`` / ``fitting_block_d``, the model's warps) and each alternative tile
forced through ``config``; ``do_bench`` medians, % of the read-once floor and the float64 check.
The passes are the solvers' (``bench_solver_ops.passes``: intercept, L2 term).

    python benchmarks/tile_ab.py [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/tile_ab.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import sys

import torch

import _common
import bench_solver_ops

_LOSS_M = "loss+grad (multinomial)"
_LOSS_1 = "loss+grad (logistic)"
_HESS = "hessian X^T(h*(Xs))"
_MATVEC = "matvec [X,1]s"

#: name, (N, D, m), X's dtype, pass, alternative tiles (``config``) timed beside the library's launch
CASES = [
    ("multinomial loss, rows of 55 (unaligned)", (1_000_000, 55, 7), torch.float32, _LOSS_M,
     [{"block_n": 16}]),
    ("Hessian product, 1024-value rows, fp32 FMA dot", (1_000_000, 1024, 16), torch.float32, _HESS,
     [{"num_warps": 4}]),
    ("matvec [X,1] W, 256-value rows", (2_000_000, 256, 5), torch.float32, _MATVEC, [{"block_d": 256}]),
    # m = 1 (the logistic solvers' pass): bf16 rows of 137 at 32 rows x 8 warps hold 48 B (3.6) /
    # 472 B (3.9) of local memory, 16 rows none; D = 5282 at 1 row x 8192 x 4 warps 80-280 B
    ("logistic loss, bf16 rows of 137", (1_000_000, 137, 1), torch.bfloat16, _LOSS_1,
     [{"block_n": 16}, {"block_n": 8}]),
    ("logistic loss, fp32 rows of 5282", (100_000, 5282, 1), torch.float32, _LOSS_1,
     [{"num_warps": 8}, {"strategy": "chunked", "block_d": 2048}]),
    ("logistic loss, fp32 rows of 512", (1_000_000, 512, 1), torch.float32, _LOSS_1, [{"block_n": 4}]),
]


def _operands(N, D, m, dtype, dev, gen):
    X = torch.randn(N, D, generator=gen, device=dev).to(dtype)
    w = 0.1 * torch.randn(D + 1, m, generator=gen, device=dev)
    if m == 1:
        y = torch.randint(0, 2, (N, 1), generator=gen, device=dev).float()
    else:
        y = torch.nn.functional.one_hot(torch.randint(0, m, (N,), generator=gen, device=dev), m).float()
    h = torch.rand(N, m, generator=gen, device=dev)
    return X, w, y, h


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    gen = torch.Generator(device=dev).manual_seed(36)
    rows = []
    for name, (N, D, m), dtype, pas, alts in CASES:
        if args.quick:
            N = 300
        X, w, y, h = _operands(N, D, m, dtype, dev, gen)
        fused, ref = bench_solver_ops.passes(X, w, y, h, m)[pas]
        want = ref()
        floor_ms = X.numel() * X.element_size() / _common.H200_BANDWIDTH * 1e3
        lib = None
        for cfg in [None] + alts:
            got = fused("fused", cfg)
            row = {"case": name, "dtype": str(dtype)[6:], "N": N, "D": D, "m": m, "floor_ms": floor_ms,
                   "tile": "library" if cfg is None else str(cfg),
                   "rel_err": float((got.double() - want).norm() / want.norm())}
            if not args.quick:
                row["ms"] = _common.bench_ms(lambda: fused("fused", cfg))
                row["%floor"] = 100 * floor_ms / row["ms"]
                lib = row["ms"] if cfg is None else lib
                row["library_speedup"] = row["ms"] / lib
            rows.append(row)
        del X, w, y, h
    cols = ["case", "dtype", "N", "D", "m", "floor_ms", "tile", "ms", "%floor", "library_speedup", "rel_err"]
    print(_common.markdown_table(rows, cols))
    print("wrote", _common.write_json("tile_ab", rows, out=args.out))
    return 1 if any(r["rel_err"] > 1e-5 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
