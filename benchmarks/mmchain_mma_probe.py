"""Probe: the dense matrix-y ``mmchain`` (``X^T (V ⊙ (X Y))``, m <= 4) with ``X Y`` on the tensor cores.

The library's m <= 4 kernel ("small" mode) spends ~30 instructions per element of X, a third of
them the cross-lane row reductions of ``X Y``. Here ``X Y`` runs as 3xTF32 ``mma.sync.m16n8k8``
(rows as M: 16 rows per warp, 8 columns of y, fragments from unit-stride ``[rows, 16]`` tiles, the
GMM tensor-core form's helpers) and ``X^T P`` as FMA chains on a second, L1-resident read of the
block's rows (sm_90 compile: ~11 instructions per element). Prototype limits: fp32 X with
``D == 16 * 2^k <= 128``, N a multiple of the row block, m <= 4, no alpha / beta / z.

Checks each launch against float64 on fresh random inputs, then times it beside the library's pick
and the operator-level torch code (``do_bench`` medians), over warps and programs per SM.

    python benchmarks/mmchain_mma_probe.py [--shapes 2000000x128x4,...] [--out PATH]
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
import _common  # noqa: E402
import fusedml  # noqa: E402
from fusedml.gmm.mma import _mma3, _pair, _tf32_split  # noqa: E402

BW = 4.28e12


@triton.jit
def _bfrag(t2, WN: tl.constexpr):
    """[8 WN, 16] tile (row g = column g of y, col 4 t + 2 s + rw) -> right-operand slots of k-steps 0, 1."""
    z6 = tl.reshape(t2, (1, WN, 8, 4, 2, 2))
    za, zb = tl.split(z6)
    z00, z10 = tl.split(za)
    z01, z11 = tl.split(zb)
    return _pair(z00, z01), _pair(z10, z11)


@triton.jit
def _afrag(t2, WN: tl.constexpr):
    """[16 WN, 16] tile (row (ch, wn, g), col 4 t + 2 s + rw) -> left-operand slots [1, 2, 2, WN, 8, 4] of k-steps 0, 1."""
    z6 = tl.permute(tl.reshape(t2, (2, WN, 8, 4, 2, 2)), (0, 5, 1, 2, 3, 4))  # r, rw, wn, g, t, s
    a0, a1 = tl.split(z6)
    return tl.reshape(a0, (1, 2, 2, WN, 8, 4)), tl.reshape(a1, (1, 2, 2, WN, 8, 4))


@triton.jit
def _quarter(p, WN: tl.constexpr):
    """[16, WN] (row i WN + w) -> four [4, WN] (i = 4 q .. 4 q + 3)."""
    p4 = tl.reshape(tl.permute(tl.reshape(p, (4, 4, WN)), (1, 2, 0)), (4, WN, 2, 2))
    a, b = tl.split(p4)
    p0, p2 = tl.split(a)
    p1, p3 = tl.split(b)
    return p0, p1, p2, p3


@triton.jit
def _cols4(p2, WN: tl.constexpr):
    """[16 WN, 8] -> columns 0..3 as [16, WN] (row i WN + w)."""
    p4 = tl.permute(tl.reshape(p2, (16, WN, 2, 4)), (0, 1, 3, 2))
    pa, pb = tl.split(p4)
    qa, qb = tl.split(tl.reshape(pa, (16, WN, 2, 2)))
    c0, c2 = tl.split(qa)
    c1, c3 = tl.split(qb)
    return c0, c1, c2, c3


@triton.jit
def _pairs(v, WN: tl.constexpr):
    """[4, WN] -> rows 0, 2 and rows 1, 3 as two [2, WN] (in-thread)."""
    return tl.split(tl.permute(tl.reshape(v, (2, 2, WN)), (0, 2, 1)))


@triton.jit
def _pairs3(v, WN: tl.constexpr, BD: tl.constexpr):
    """[4, WN, BD] -> rows 0, 2 and rows 1, 3 as two [2, WN, BD] (in-thread)."""
    return tl.split(tl.permute(tl.reshape(v, (2, 2, WN, BD)), (0, 2, 3, 1)))


@triton.jit
def _xtp4(acc0, acc1, acc2, acc3, X, rows, stride_xn, colsD, c0, c1, c2, c3, WN: tl.constexpr, BD: tl.constexpr):
    x = tl.reshape(tl.load(X + rows * stride_xn + colsD), (4, WN, BD))
    if acc0.shape[0] == 4:
        acc0 += x * c0[:, :, None]
        acc1 += x * c1[:, :, None]
        acc2 += x * c2[:, :, None]
        acc3 += x * c3[:, :, None]
    else:  # [2, WN, BD] accumulators: two FMAs each, rows 0, 2 then 1, 3
        xa, xb = _pairs3(x, WN, BD)
        a0, b0 = _pairs(c0, WN)
        a1, b1 = _pairs(c1, WN)
        a2, b2 = _pairs(c2, WN)
        a3, b3 = _pairs(c3, WN)
        acc0 += xa * a0[:, :, None]
        acc1 += xa * a1[:, :, None]
        acc2 += xa * a2[:, :, None]
        acc3 += xa * a3[:, :, None]
        acc0 += xb * b0[:, :, None]
        acc1 += xb * b1[:, :, None]
        acc2 += xb * b2[:, :, None]
        acc3 += xb * b3[:, :, None]
    return acc0, acc1, acc2, acc3


@triton.jit
def _mmc4_kernel(X, stride_xn, YF, V, stride_vn, PW, N, D, M, n_blocks,
                 WN: tl.constexpr, NC: tl.constexpr, BD: tl.constexpr, PART: tl.constexpr = 0,
                 CHAINS: tl.constexpr = 1, ACCR: tl.constexpr = 4, STAGES: tl.constexpr = 1):
    # PART (diagnostics): 0 the product, 1 only X Y (its sum stored), 2 only X^T V (P = V)
    BN: tl.constexpr = 16 * WN
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    rows8 = tl.arange(0, 8 * WN)[:, None] % 8
    cols = tl.arange(0, 16)[None, :]
    rows2 = tl.arange(0, BN)[:, None]
    rows4 = tl.arange(0, 4 * WN)[:, None]
    zero = tl.zeros((1, 2, 2, WN, 8, 4), dtype=tl.float32)
    colsD = tl.arange(0, BD)[None, :]
    acc0 = tl.zeros((ACCR, WN, BD), dtype=tl.float32)  # per column of y: rows of the thread x its features
    acc1 = tl.zeros((ACCR, WN, BD), dtype=tl.float32)
    acc2 = tl.zeros((ACCR, WN, BD), dtype=tl.float32)
    acc3 = tl.zeros((ACCR, WN, BD), dtype=tl.float32)
    c8 = tl.arange(0, 8)[None, :]
    pacc = tl.zeros((8,), dtype=tl.float32)
    for blk in tl.range(pid, n_blocks, nprog, num_stages=STAGES):  # STAGES > 1: loads pipelined (cp.async)
        row0 = blk * BN
        xr = row0 + rows2
        t = zero
        t2 = zero
        if PART != 2:
            for c in tl.static_range(NC):  # X Y: 3xTF32 mma over 16-feature chunks
                b0h, b1h = _bfrag(tl.load(YF + (2 * c) * 128 + rows8 * 16 + cols), WN)
                b0l, b1l = _bfrag(tl.load(YF + (2 * c + 1) * 128 + rows8 * 16 + cols), WN)
                a0, a1 = _afrag(tl.load(X + xr * stride_xn + 16 * c + cols), WN)
                a0h, a0l = _tf32_split(a0)
                a1h, a1l = _tf32_split(a1)
                if CHAINS == 2:  # two accumulation chains: the mma's latency
                    t = _mma3(t, a0h, a0l, b0h, b0l, 1, WN)
                    t2 = _mma3(t2, a1h, a1l, b1h, b1l, 1, WN)
                else:
                    t = _mma3(t, a0h, a0l, b0h, b0l, 1, WN)
                    t = _mma3(t, a1h, a1l, b1h, b1l, 1, WN)
            t = t + t2
            p2 = tl.reshape(tl.permute(t, (0, 1, 3, 4, 5, 2)), (BN, 8))  # rows (ch, wn, g), column 2 t + rw
            p2 = p2 * tl.load(V + xr * stride_vn + c8, mask=c8 < M, other=0.0)
        else:
            p2 = tl.load(V + xr * stride_vn + c8, mask=c8 < M, other=0.0)
        if PART == 1:  # keep the product (its column sums), skip X^T P
            pacc += tl.sum(p2, axis=0)
        else:
            p0, p1, p2_, p3 = _cols4(p2, WN)
            q00, q01, q02, q03 = _quarter(p0, WN)
            q10, q11, q12, q13 = _quarter(p1, WN)
            q20, q21, q22, q23 = _quarter(p2_, WN)
            q30, q31, q32, q33 = _quarter(p3, WN)
            # X^T P on a second (L1) read of the block, 4 WN rows at a time: rows i' WN + w, FMA chains
            acc0, acc1, acc2, acc3 = _xtp4(acc0, acc1, acc2, acc3, X, row0 + rows4, stride_xn, colsD,
                                           q00, q10, q20, q30, WN, BD)
            acc0, acc1, acc2, acc3 = _xtp4(acc0, acc1, acc2, acc3, X, row0 + 4 * WN + rows4, stride_xn, colsD,
                                           q01, q11, q21, q31, WN, BD)
            acc0, acc1, acc2, acc3 = _xtp4(acc0, acc1, acc2, acc3, X, row0 + 8 * WN + rows4, stride_xn, colsD,
                                           q02, q12, q22, q32, WN, BD)
            acc0, acc1, acc2, acc3 = _xtp4(acc0, acc1, acc2, acc3, X, row0 + 12 * WN + rows4, stride_xn, colsD,
                                           q03, q13, q23, q33, WN, BD)
    o = pid * 4 * BD + tl.arange(0, BD)
    if PART == 1:
        tl.store(PW + pid * 4 * BD + tl.arange(0, 8), pacc)
    else:
        tl.store(PW + o, tl.sum(tl.sum(acc0, axis=0), axis=0))
        tl.store(PW + BD + o, tl.sum(tl.sum(acc1, axis=0), axis=0))
        tl.store(PW + 2 * BD + o, tl.sum(tl.sum(acc2, axis=0), axis=0))
        tl.store(PW + 3 * BD + o, tl.sum(tl.sum(acc3, axis=0), axis=0))


def yfrags(Y):
    """``[NC, 2, 8, 16]`` fp32: chunk c's tf32 high / low parts of ``Y^T[:, 16 c : 16 c + 16]`` (8 rows, zero-padded)."""
    D, M = Y.shape
    NC = -(-D // 16)
    yt = torch.zeros(8, NC * 16, dtype=torch.float32, device=Y.device)
    yt[:M, :D] = Y.t()
    hi = (yt.view(torch.int32) & -8192).view(torch.float32)
    lo = yt - hi
    return torch.stack([hi.view(8, NC, 16).permute(1, 0, 2), lo.view(8, NC, 16).permute(1, 0, 2)], 1).contiguous()


def run(X, Y, V, WN=4, P=None, yf=None, pw=None, part=0, chains=1, accr=4, maxnreg=None, stages=1):
    """``X^T (V ⊙ (X Y))`` ``[D, m]`` by the prototype kernel on P programs."""
    N, D = X.shape
    M = Y.shape[1]
    BN = 16 * WN
    if D % 16 or triton.next_power_of_2(D) != D or D > 128 or N % BN or M > 4:
        raise ValueError(f"prototype limits: D = 16 * 2^k <= 128, N % {BN} == 0, m <= 4 (got {N} x {D}, m = {M})")
    n_blocks = N // BN
    P = max(1, min(P or 264, n_blocks))
    if pw is None or pw.shape[0] != P:
        pw = torch.empty(P, 4, D, dtype=torch.float32, device=X.device)
    _mmc4_kernel[(P,)](X, X.stride(0), yfrags(Y) if yf is None else yf, V, V.stride(0), pw, N, D, M, n_blocks,
                       WN=WN, NC=D // 16, BD=D, PART=part, CHAINS=chains, ACCR=accr, STAGES=stages, num_warps=WN,
                       **({"maxnreg": maxnreg} if maxnreg else {}))
    return pw.sum(0)[:M].t()


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))


#: the shapes checked against float64 (``--check-shapes``)
CHECK_SHAPES = "256x16x1,1024x32x4,4096x64x3,8192x128x4,65536x128x2"


def check(dev, seed, shapes=CHECK_SHAPES):
    """Each launch of the variants on ``NxDxm,...`` against float64 (fresh random inputs)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for N, D, M in _common.shape_list(shapes):
        X = torch.randn(N, D, generator=g).to(dev)
        Y = torch.randn(D, M, generator=g).to(dev)
        V = torch.rand(N, M, generator=g).to(dev)
        ref = X.double().t() @ (V.double() * (X.double() @ Y.double()))
        for WN, P, kw in ((4, 3, {}), (8, 5, {}), (4, 264, {}), (4, 5, dict(chains=2, accr=2, stages=2)),
                          (8, 3, dict(accr=2, stages=2))):
            if N % (16 * WN):
                continue
            try:
                e = rel(run(X, Y, V, WN, P, **kw), ref)
            except Exception as ex:  # noqa: BLE001 (a probe: e.g. shared memory beyond the GPU's)
                rows.append(dict(case="check", N=N, D=D, m=M, WN=WN, P=P, variant=str(kw), error=repr(ex)[:200]))
                continue
            rows.append(dict(case="check", N=N, D=D, m=M, WN=WN, P=P, variant=str(kw), err=e, ok=e <= 1e-5))
    return rows


def probe(dev, N, D, M, sm):
    g = torch.Generator(device="cpu").manual_seed(N + D + M)
    X = torch.randn(N, D, generator=g).to(dev)
    Y = torch.randn(D, M, generator=g).to(dev)
    V = torch.rand(N, M, generator=g).to(dev)
    ref = X.double().t() @ (V.double() * (X.double() @ Y.double()))
    floor = N * D * 4 / BW * 1e3
    base = dict(N=N, D=D, m=M, floor_ms=floor)
    rows = [dict(base, variant="library (fused)", ms=_common.bench_ms(lambda: fusedml.mmchain(X, Y, V)),
                 err=rel(fusedml.mmchain(X, Y, V), ref)),
            dict(base, variant="ops (torch)", ms=_common.bench_ms(lambda: X.t() @ (V * (X @ Y))),
                 err=rel(X.t() @ (V * (X @ Y)), ref))]
    yf = yfrags(Y)
    # (warps, programs per SM, part, chains, accumulator rows, pipeline stages); parts 1 / 2 time X Y alone /
    # X^T V alone (diagnostics); stages > 1: the block loop's loads pipelined through shared memory (cp.async)
    variants = [(wn, ps, 0, 1, 4, 1) for wn in (4, 8) for ps in (1, 2, 4)]
    variants += [(4, 2, 0, 2, 4, 1), (4, 2, 0, 1, 4, 2), (4, 2, 0, 2, 2, 2), (4, 1, 0, 2, 2, 3), (8, 1, 0, 2, 2, 2),
                 (4, 2, 1, 1, 4, 1), (4, 3, 1, 1, 4, 3), (4, 2, 2, 1, 4, 1), (4, 3, 2, 1, 4, 3)]
    for WN, per_sm, part, chains, accr, stages in variants:
        P = sm * per_sm
        pw = torch.empty(P, 4, D, dtype=torch.float32, device=dev)
        name = (f"mma WN {WN} P {per_sm}/SM" + (f" chains {chains}" if chains > 1 else "")
                + (f" acc {accr}" if accr != 4 else "") + (f" stages {stages}" if stages > 1 else "")
                + {0: "", 1: " (X Y only)", 2: " (X^T V only)"}[part])
        kw = dict(part=part, chains=chains, accr=accr, stages=stages)
        try:
            ms = _common.bench_ms(lambda: run(X, Y, V, WN, P, yf, pw, **kw))
            err = rel(run(X, Y, V, WN, P, **kw), ref) if part == 0 else None
        except Exception as e:  # noqa: BLE001 (a probe: record and go on)
            rows.append(dict(base, variant=name, error=repr(e)[:200]))
            continue
        rows.append(dict(base, variant=name, ms=ms, err=err))
    rows.append(dict(base, variant="mma WN 4 P 2/SM + yfrags",
                     ms=_common.bench_ms(lambda: run(X, Y, V, 4, 2 * sm)), err=rel(run(X, Y, V, 4, 2 * sm), ref)))
    lib = rows[0]["ms"]
    for r in rows:
        if "ms" in r:
            r["pct_floor"] = 100 * floor / r["ms"]
            r["library_over_this"] = lib / r["ms"]
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-shapes", default=CHECK_SHAPES)
    ap.add_argument("--shapes", default="2000000x128x4,2000000x128x2,4000000x64x4,1048576x128x3,8000000x32x4")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    sm = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rows = check(dev, seed, args.check_shapes)
    print(_common.markdown_table(rows, ["N", "D", "m", "WN", "P", "variant", "err", "ok", "error"]))
    path = _common.write_json("mmchain_mma_probe", rows, {"check_seed": seed}, out=args.out)
    for N, D, M in _common.shape_list(args.shapes):
        rows += probe(dev, N, D, M, sm)
        torch.cuda.empty_cache()  # the probe's tensors are gone with its frame
        path = _common.write_json("mmchain_mma_probe", rows, {"check_seed": seed}, out=args.out)
    print(_common.markdown_table([r for r in rows if r.get("case") != "check"],
                                 ["N", "D", "m", "variant", "ms", "pct_floor", "library_over_this", "err", "error"]))
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
