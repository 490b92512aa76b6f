"""Probe: the padded copy of ``fusedml.aligned_rows``, one-pass kernel against torch's copies.

Times, per shape, the copy that ``aligned_rows`` makes (``_pad_rows_kernel``: each row read once and
written whole with its zeroed padding) against the torch code it replaced (``zero_`` of the
padding columns, then a strided ``copy_``), with the bytes moved (X read, the padded copy
written) over the device-copy ceiling where one was measured (the H200's); checks both copies against X (values, zero padding).

    python benchmarks/pad_copy_probe.py [--shapes 8000000x55 ...] [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/pad_copy_probe.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import sys

import torch

import _common
import fusedml

CASES = ["8000000x55", "16000000x27", "4000000x101", "1000000x101", "1000000x55", "1000000x137:bfloat16",
         "250000x2049"]
CEILING_TBS = {"H200": 4.28}  # device copy (read + write), ../shared/PERFORMANCE.md; no other GPU measured


def torch_copy(X):
    """The copy before the kernel: zero the padding, then a strided copy of the values."""
    N, D = X.shape
    v = 16 // X.element_size()
    Dp = -(-D // v) * v
    Xp = torch.empty((N, Dp), dtype=X.dtype, device=X.device)
    Xp[:, D:].zero_()
    Xp[:, :D].copy_(X)
    return Xp[:, :D]


def check(A, X):
    N, D = X.shape
    full = A.as_strided((N, A.stride(0)), (A.stride(0), 1))
    return bool(torch.equal(A, X)) and bool((full[:, D:] == 0).all())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=CASES, help="NxD or NxD:dtype")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke run)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    shapes = ["300x55", "70x137:bfloat16"] if args.quick else args.shapes
    gpu = _common.gpu_name()
    ceiling = next((v for k, v in CEILING_TBS.items() if k in gpu), None)
    rows = []
    for spec in shapes:
        shape, _, dt = spec.partition(":")
        N, D = (int(s) for s in shape.split("x"))
        dtype = getattr(torch, dt or "float32")
        X = torch.randn(N, D, device=dev).to(dtype)
        A, B = fusedml.aligned_rows(X), torch_copy(X)
        ok = check(A, X) and check(B, X) and A.stride() == B.stride()
        moved = X.numel() * X.element_size() + N * A.stride(0) * X.element_size()
        t_new = _common.bench_ms(lambda X=X: fusedml.aligned_rows(X))
        t_old = _common.bench_ms(lambda X=X: torch_copy(X))
        row = {"shape": spec, "GB": round(moved / 1e9, 3), "torch_ms": round(t_old, 4), "kernel_ms": round(t_new, 4),
               "torch_TBs": round(moved / t_old / 1e9, 2), "kernel_TBs": round(moved / t_new / 1e9, 2),
               "kernel_pct_ceiling": round(100 * moved / t_new / 1e9 / ceiling, 1) if ceiling else None,
               "speedup": round(t_old / t_new, 2), "correct": ok}
        rows.append(row)
        print(row, flush=True)
        del X, A, B
    cols = ["shape", "GB", "torch_ms", "kernel_ms", "torch_TBs", "kernel_TBs", "kernel_pct_ceiling", "speedup", "correct"]
    print(_common.markdown_table(rows, cols))
    print("saved", _common.write_json("pad_copy_probe", rows, {"args": vars(args)}, args.out))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
