"""Probe: ``[X, 1] W`` for 2 <= m <= 8 on wide rows with one accumulator per right-hand side.

The library's matvec for m > 1 on rows over 128 values (the multinomial loss pass's first read)
runs the padded FMA ``tl.dot``: 16 columns of work for m, the operands staged through shared
memory; it sits at cuBLAS's speed, ~50 % of the read-once floor at 2M x 256, m = 3-5 (0.96 ms).
Here each right-hand side keeps its own ``[BN, BK]`` register accumulator across the column
chunks (x times a broadcast row of ``W``: m FMAs per element, x's load layout throughout) and
reduces along the row once per row tile, with small ``BK`` so a row stays within a warp.

    python benchmarks/matvec_probe.py [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/matvec_probe.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch
import triton
import triton.language as tl

import _common
import fusedml


@triton.jit
def _fma(a, x, yrow, cm, NM: tl.constexpr, J: tl.constexpr):
    # one right-hand side's accumulator: a += x * W[cols, J] (a no-op past the last one)
    if J < NM:
        a += x * tl.load(yrow + J, mask=cm, other=0.0)[None, :]
    return a


@triton.jit
def _out(T, a, rows, rmask, yi_ptr, NM: tl.constexpr, J: tl.constexpr):
    if J < NM:
        tl.store(T + rows * NM + J, tl.sum(a, 1) + tl.load(yi_ptr + J), mask=rmask)


@triton.jit
def _matvec_rhs_kernel(X, Y, T, N, D, stride_xn, stride_yd,
                       NM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_D: tl.constexpr):
    # X [N, D] row-major, Y [D + 1, NM] contiguous (last row: intercept), T [N, NM]
    rows = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    rmask = rows < N
    ar = tl.max_contiguous(tl.multiple_of(tl.arange(0, BK), BK), BK)
    a0 = tl.zeros([BN, BK], tl.float32)
    a1 = tl.zeros([BN, BK], tl.float32)
    a2 = tl.zeros([BN, BK], tl.float32)
    a3 = tl.zeros([BN, BK], tl.float32)
    a4 = tl.zeros([BN, BK], tl.float32)
    a5 = tl.zeros([BN, BK], tl.float32)
    a6 = tl.zeros([BN, BK], tl.float32)
    a7 = tl.zeros([BN, BK], tl.float32)
    for k in range(0, D, BK):
        cols = k + ar
        cm = cols < D
        if EVEN_D:
            x = tl.load(X + rows[:, None] * stride_xn + cols[None, :], mask=rmask[:, None], other=0.0)
        else:
            x = tl.load(X + rows[:, None] * stride_xn + cols[None, :], mask=rmask[:, None] & cm[None, :], other=0.0)
        x = x.to(tl.float32)
        yrow = Y + cols * stride_yd
        a0 = _fma(a0, x, yrow, cm, NM, 0)
        a1 = _fma(a1, x, yrow, cm, NM, 1)
        a2 = _fma(a2, x, yrow, cm, NM, 2)
        a3 = _fma(a3, x, yrow, cm, NM, 3)
        a4 = _fma(a4, x, yrow, cm, NM, 4)
        a5 = _fma(a5, x, yrow, cm, NM, 5)
        a6 = _fma(a6, x, yrow, cm, NM, 6)
        a7 = _fma(a7, x, yrow, cm, NM, 7)
    yi = Y + D * stride_yd
    _out(T, a0, rows, rmask, yi, NM, 0)
    _out(T, a1, rows, rmask, yi, NM, 1)
    _out(T, a2, rows, rmask, yi, NM, 2)
    _out(T, a3, rows, rmask, yi, NM, 3)
    _out(T, a4, rows, rmask, yi, NM, 4)
    _out(T, a5, rows, rmask, yi, NM, 5)
    _out(T, a6, rows, rmask, yi, NM, 6)
    _out(T, a7, rows, rmask, yi, NM, 7)


def matvec_rhs(X, W, bn, bk, warps, stages=3):
    """``[X, 1] W`` (X ``[N, D]`` row-major, W ``[D + 1, m]``, 1 <= m <= 8) by the probe kernel."""
    N, D = X.shape
    m = W.shape[1]
    W = W.contiguous()
    T = torch.empty(N, m, dtype=torch.float32, device=X.device)
    _matvec_rhs_kernel[(triton.cdiv(N, bn),)](X, W, T, N, D, X.stride(0), W.stride(0), NM=m, BN=bn, BK=bk,
                                               EVEN_D=D % bk == 0, num_warps=warps, num_stages=stages)
    return T


def operands(N, D, m, dtype, dev, gen):
    """``(X [N, D] in dtype, W [D + 1, m] fp32, float64 [X, 1] W, floor ms of one read of X)``."""
    X = torch.randn(N, D, generator=gen, device=dev).to(dtype)
    W = 0.1 * torch.randn(D + 1, m, generator=gen, device=dev)
    want = torch.cat([X.double(), torch.ones(N, 1, dtype=torch.float64, device=dev)], 1) @ W.double()
    return X, W, want, X.numel() * X.element_size() / _common.H200_BANDWIDTH * 1e3


def rel_err(got, want) -> float:
    return float((got.double() - want).norm() / want.norm())


CASES = [(2_000_000, 256, 3), (2_000_000, 256, 5), (1_000_000, 512, 8), (4_000_000, 64, 3), (1_000_000, 100, 5)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    gen = torch.Generator(device=dev).manual_seed(36)
    rows, best_rows = [], []
    for N, D, m in CASES:
        if args.quick:
            N = 100
        X, W, want, floor_ms = operands(N, D, m, torch.float32, dev, gen)

        def err(got):
            return rel_err(got, want)

        base = {"N": N, "D": D, "m": m, "floor_ms": floor_ms}
        lib = lambda: fusedml.matvec(X, W, intercept=True, backend="fused")  # noqa: E731
        ops = lambda: torch.addmm(W[D], X, W[:D])  # noqa: E731
        for name, fn in (("library", lib), ("ops", ops)):
            ms = None if args.quick else _common.bench_ms(fn)
            rows.append(dict(base, kernel=name, ms=ms, rel_err=err(fn())))
        grid = [(16, 32, 4, 3)] if args.quick else itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (3,))
        probe = []
        for bn, bk, warps, stages in grid:
            if bk > max(16, triton.next_power_of_2(D)) or m * bn * bk / (32 * warps) > 128:
                continue
            fn = lambda: matvec_rhs(X, W, bn, bk, warps, stages)  # noqa: E731
            r = dict(base, kernel=f"rhs BN={bn} BK={bk} w={warps} s={stages}", tile=(bn, bk, warps, stages),
                     rel_err=err(fn()))
            r["ms"] = None if args.quick else _common.bench_ms(fn)
            probe.append(r)
        rows += probe
        # the library's mode="small" kernel at the probe's best tile (quick: its first), one program per
        # tile and persistent (16 programs per SM)
        best = probe[0] if args.quick else min(probe, key=lambda r: r["ms"])
        bn, bk, warps, stages = best["tile"]
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
        for progs in (-(-N // bn), 16 * sms):
            cfg = dict(mode="small", block_n=bn, block_d=bk, num_warps=warps, num_stages=stages, num_programs=progs)
            fn = lambda: fusedml.matvec(X, W, intercept=True, backend="fused", config=cfg)  # noqa: E731
            rows.append(dict(base, kernel=f"library small BN={bn} BK={bk} w={warps} programs={progs}",
                             ms=None if args.quick else _common.bench_ms(fn), rel_err=err(fn())))
        if not args.quick:
            lib_ms = next(r["ms"] for r in rows if r["kernel"] == "library" and r["N"] == N and r["m"] == m)
            ops_ms = next(r["ms"] for r in rows if r["kernel"] == "ops" and r["N"] == N and r["m"] == m)
            best_rows.append(dict(base, best=best["kernel"], best_ms=best["ms"], best_pct=100 * floor_ms / best["ms"],
                                  library_ms=lib_ms, library_pct=100 * floor_ms / lib_ms, ops_ms=ops_ms,
                                  vs_library=lib_ms / best["ms"], vs_ops=ops_ms / best["ms"], rel_err=best["rel_err"]))
    for r in rows:
        if r["ms"]:
            r["%floor"] = 100 * r["floor_ms"] / r["ms"]
    print(_common.markdown_table(rows, ["N", "D", "m", "kernel", "ms", "%floor", "rel_err"]))
    if best_rows:
        print(_common.markdown_table(best_rows, ["N", "D", "m", "floor_ms", "best", "best_ms", "best_pct", "library_ms",
                                                 "library_pct", "ops_ms", "vs_library", "vs_ops", "rel_err"]))
    print("wrote", _common.write_json("matvec_probe", rows, extra={"best": best_rows}, out=args.out))
    return 1 if any(r["rel_err"] > 1e-5 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
