"""Probe: the m = 4 Hessian product with row tiles held as strips of 2 (16 lanes per row).

    python benchmarks/strips_probe.py [--shape 2000000x128] [--out results/strips_probe.json]

The library's m <= 4 kernel holds a [BN, 128] fp32 tile with 4 values of a row per thread (32
lanes per row): every row's dot product with each column of y ends in a 5-level shuffle
butterfly, ~30 instructions per element of X on sm_90. Session 10 held the tile as
``[CHUNKS, BLOCK_N, CW]`` strips with CHUNKS = 4 (16 values of a row per thread, 2 shuffle levels)
and lost: 193-200 registers, one 8-warp program per SM. With CHUNKS = 2 a thread holds 8 values
of a row (16 lanes per row, 4 levels): the sm_90 AOT compile of this kernel at 16 x 128, 8 warps
has 111 registers (two programs per SM, as the library's kernel) and 141 instructions per tile
loop (17.6 per element of X, against 242-274 / 30-34 for the library's, which also masks the
columns j >= m; 8 x 128 on 4 warps: 96 registers, 143). Re-reading y from L1 every tile instead of holding it in registers did not help
there (the loads lose their 16-byte vectors: 184 registers). This probe times the strips over a
few launches next to the library's pick (``fusedml.mmchain``) and checks each against float64.
It is a probe, not a library path: m = 4, ``v_op="mul"``, no intercept, atomics. On the CPU (no
CUDA) it runs a tiny shape under the interpreter as a smoke test.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fusedml  # noqa: E402
from _common import bench_ms, device, write_json  # noqa: E402


@triton.jit
def _strips_kernel(X, YT, V, W, N, D, n_tiles, stride_xn, stride_vn,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CHUNKS: tl.constexpr, PREFETCH: tl.constexpr):
    # X [N, D] fp32 row-major, YT [4, D] (y^T, contiguous), V [N, 4], W [D, 4] zeroed (atomics).
    # A thread holds CHUNKS strips of one row (warps along rows when BLOCK_N covers them: the
    # strip sums stay in-thread); y's four columns stay in registers.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    CW: tl.constexpr = BLOCK_D // CHUNKS
    c3 = (tl.arange(0, CHUNKS)[:, None, None] * CW
          + tl.max_contiguous(tl.multiple_of(tl.arange(0, CW), CW), CW)[None, None, :])  # [CH, 1, CW]
    cm = c3 < D
    y0 = tl.load(YT + c3, mask=cm, other=0.0)
    y1 = tl.load(YT + D + c3, mask=cm, other=0.0)
    y2 = tl.load(YT + 2 * D + c3, mask=cm, other=0.0)
    y3 = tl.load(YT + 3 * D + c3, mask=cm, other=0.0)
    acc0 = tl.zeros([CHUNKS, BLOCK_N, CW], dtype=tl.float32)
    acc1 = tl.zeros([CHUNKS, BLOCK_N, CW], dtype=tl.float32)
    acc2 = tl.zeros([CHUNKS, BLOCK_N, CW], dtype=tl.float32)
    acc3 = tl.zeros([CHUNKS, BLOCK_N, CW], dtype=tl.float32)
    rows = tl.arange(0, BLOCK_N).to(tl.int64) + pid * BLOCK_N
    if PREFETCH:
        r3 = rows[None, :, None]
        x_nxt = tl.load(X + r3 * stride_xn + c3, mask=(r3 < N) & cm, other=0.0)
    for tile in range(pid, n_tiles, nprog):
        r3 = rows[None, :, None]
        if PREFETCH:
            x = x_nxt
            rn = r3 + nprog * BLOCK_N
            x_nxt = tl.load(X + rn * stride_xn + c3, mask=(rn < N) & cm, other=0.0)
        else:
            x = tl.load(X + r3 * stride_xn + c3, mask=(r3 < N) & cm, other=0.0)
        rmask = rows < N
        vb = V + rows * stride_vn
        p0 = tl.sum(tl.sum(x * y0, axis=0), axis=1) * tl.load(vb, mask=rmask, other=0.0)
        p1 = tl.sum(tl.sum(x * y1, axis=0), axis=1) * tl.load(vb + 1, mask=rmask, other=0.0)
        p2 = tl.sum(tl.sum(x * y2, axis=0), axis=1) * tl.load(vb + 2, mask=rmask, other=0.0)
        p3 = tl.sum(tl.sum(x * y3, axis=0), axis=1) * tl.load(vb + 3, mask=rmask, other=0.0)
        acc0 += x * p0[None, :, None]
        acc1 += x * p1[None, :, None]
        acc2 += x * p2[None, :, None]
        acc3 += x * p3[None, :, None]
        rows += nprog * BLOCK_N
    c2 = tl.arange(0, CHUNKS)[:, None] * CW + tl.arange(0, CW)[None, :]
    om = c2 < D
    tl.atomic_add(W + c2 * 4, tl.sum(acc0, axis=1), mask=om, sem="relaxed")
    tl.atomic_add(W + c2 * 4 + 1, tl.sum(acc1, axis=1), mask=om, sem="relaxed")
    tl.atomic_add(W + c2 * 4 + 2, tl.sum(acc2, axis=1), mask=om, sem="relaxed")
    tl.atomic_add(W + c2 * 4 + 3, tl.sum(acc3, axis=1), mask=om, sem="relaxed")


def strips_mmchain(X, Y, V, *, block_n=16, chunks=2, warps=8, programs=264, prefetch=False):
    """``X^T (V ⊙ (X Y))`` for fp32 X [N, D] (row-major, D a power of two), Y [D, 4], V [N, 4]."""
    N, D = X.shape
    assert Y.shape == (D, 4) and V.shape == (N, 4) and X.stride(1) == 1 and D & (D - 1) == 0
    W = torch.zeros(D, 4, dtype=torch.float32, device=X.device)
    n_tiles = triton.cdiv(N, block_n)
    _strips_kernel[(max(1, min(programs, n_tiles)),)](
        X, Y.T.contiguous(), V.contiguous(), W, N, D, n_tiles, X.stride(0), 4,
        BLOCK_N=block_n, BLOCK_D=D, CHUNKS=chunks, PREFETCH=prefetch, num_warps=warps)
    return W


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default=None, help="NxD (D a power of two; default 2000000x128 on CUDA)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = device()
    cuda = dev.type == "cuda"
    N, D = (int(s) for s in (a.shape or ("2000000x128" if cuda else "300x32")).lower().split("x"))
    g = torch.Generator(device="cpu").manual_seed(0)
    X = torch.randn(N, D, generator=g).to(dev)
    Y, V = torch.randn(D, 4, generator=g).to(dev), torch.rand(N, 4, generator=g).to(dev)
    X64 = X.double()
    ref = X64.T @ (V.double() * (X64 @ Y.double()))
    floor = X.numel() * 4 / 4.28e12 * 1e3
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 2
    rows = []

    def record(name, f):
        err = float((f().double() - ref).norm() / ref.norm())
        ms = bench_ms(f) if cuda else float("nan")
        rows.append({"case": name, "ms": ms, "%floor": 100 * floor / ms, "rel_err": err})
        print(f"{name}: {ms:.4f} ms {100 * floor / ms:.1f} % err {err:.1e}", flush=True)

    record("library pick (fusedml.mmchain)", lambda: fusedml.mmchain(X, Y, V, backend="fused"))
    # (block_n, chunks, warps, programs per SM, prefetch): 16 lanes per row, then session 10's 8
    launches = ((16, 2, 8, 2, False), (16, 2, 8, 2, True), (8, 2, 4, 5, False), (8, 2, 4, 4, True),
                (32, 2, 16, 1, False), (32, 4, 8, 1, False))
    for bn, ch, w, per, pf in launches if cuda else launches[:2]:
        name = f"strips bn={bn} chunks={ch} w={w} {per}/SM prefetch={pf}"
        record(name, lambda: strips_mmchain(X, Y, V, block_n=bn, chunks=ch, warps=w, programs=per * sms, prefetch=pf))
    path = write_json("strips_probe", rows, out=a.out)
    print("saved", path)
    return rows


if __name__ == "__main__":
    main()
