"""The matvec's one-accumulator-per-right-hand-side kernel (``mode="small"``) against the model's
launch where the model does not take it yet: bf16 / fp16 storage and m = 6-8 on rows over 128 values.

    python benchmarks/matvec_small_ab.py [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/matvec_small_ab.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import sys

import torch

import _common
import fusedml
from matvec_probe import operands, rel_err

CASES = [(2_000_000, 256, 3, torch.bfloat16), (2_000_000, 256, 5, torch.bfloat16), (2_000_000, 256, 6, torch.float32),
         (2_000_000, 256, 7, torch.float32), (2_000_000, 256, 8, torch.float32), (1_000_000, 512, 3, torch.float32)]
TILES = [(32, 64), (64, 32), (64, 64)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    gen = torch.Generator(device=dev).manual_seed(361)
    rows = []
    for N, D, m, dtype in CASES:
        N = 100 if args.quick else N
        X, W, want, floor_ms = operands(N, D, m, dtype, dev, gen)
        for name, cfg in [("model", None)] + [(f"small {bn} x {bd}", dict(mode="small", block_n=bn, block_d=bd,
                                                num_warps=4, num_stages=3, num_programs=-(-N // bn))) for bn, bd in TILES]:
            fn = lambda: fusedml.matvec(X, W, intercept=True, backend="fused", config=cfg)  # noqa: E731
            got = fn()
            ms = None if args.quick else _common.bench_ms(fn)
            rows.append(dict(N=N, D=D, m=m, dtype=str(dtype)[6:], launch=name, ms=ms, floor_ms=floor_ms,
                             rel_err=rel_err(got, want)))
    print(_common.markdown_table(rows, ["N", "D", "m", "dtype", "launch", "ms", "floor_ms", "rel_err"]))
    print("wrote", _common.write_json("matvec_small_ab", rows, out=args.out))
    return 1 if any(r["rel_err"] > 1e-5 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
