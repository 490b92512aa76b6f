"""How fast random gathers are on this GPU as a function of the gathered vector's size.

The CSR passes (``fusedml/mmchain/csr.py``) are bound by one random gather of ``y`` per nonzero.
This probe times a stream of ``(index, value)`` pairs, ``sum_j val_j * y[idx_j]``, against

* the size of ``y`` (64 KB to 4 MB): does a vector that fits in L1 gather faster than one in L2?
* tile order: the stream sorted into ``T`` index tiles (consecutive blocks in one tile, so the
  SMs work on one tile of ``y`` at a time: a column-tiled CSR pass);
* cuSPARSE ``X @ y`` on the same nonzeros as one CSR matrix and as ``T`` column tiles.

    python benchmarks/gather_probe.py [--nnz 33554432] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():  # a smoke run of the script under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import bench_ms, device, write_json  # noqa: E402


@triton.jit
def _gather_kernel(IDX, VAL, Y, OUT, n, n_blocks, BLOCK: tl.constexpr, STREAM_CG: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for b in range(pid, n_blocks, nprog):
        o = b * BLOCK + offs  # n < 2^31
        m = o < n
        if STREAM_CG:
            i = tl.load(IDX + o, mask=m, other=0, cache_modifier=".cg")
            v = tl.load(VAL + o, mask=m, other=0.0, cache_modifier=".cg")
        else:
            i = tl.load(IDX + o, mask=m, other=0)
            v = tl.load(VAL + o, mask=m, other=0.0)
        acc += v * tl.load(Y + i, mask=m, other=0.0)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


def gather(idx, val, y, programs, block=1024, cg=True):
    n = idx.numel()
    nb = triton.cdiv(n, block)
    out = torch.empty(programs, device=idx.device, dtype=torch.float32)
    _gather_kernel[(programs,)](idx, val, y, out, n, nb, BLOCK=block, STREAM_CG=cg, num_warps=8)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--nnz", type=int, default=1 << 25)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = device()
    g = torch.Generator(device=dev).manual_seed(0)
    n = a.nnz
    val = torch.randn(n, device=dev, generator=g)
    sm = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
    rows = []
    floor_ms = n * 8 / 4.28e9
    sizes = (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20) if dev.type == "cuda" else (256 << 10,)
    for ybytes in sizes:
        D = ybytes // 4
        y = torch.randn(D, device=dev, generator=g)
        idx = torch.randint(0, D, (n,), device=dev, generator=g, dtype=torch.int32)
        for progs_per_sm in (4, 8):
            for cg in (True, False):
                ms = bench_ms(lambda: gather(idx, val, y, sm * progs_per_sm, cg=cg))
                rows.append(dict(case="random", y_kb=ybytes >> 10, tiles=1, progs_per_sm=progs_per_sm, cg=cg,
                                 ms=ms, ggather_s=n / ms / 1e6, pct_floor=100 * floor_ms / ms))
        # the same indices sorted into T tiles of 64 KB / 128 KB (a column-tiled pass)
        for tile_kb in (64, 128):
            T = max(1, ybytes // (tile_kb << 10))
            if T == 1:
                continue
            tid = idx // (D // T)
            order = torch.argsort(tid, stable=True)
            idx_t = idx[order].contiguous()
            ms = bench_ms(lambda: gather(idx_t, val, y, sm * 8, cg=True))
            rows.append(dict(case=f"tiled {tile_kb} KB", y_kb=ybytes >> 10, tiles=T, progs_per_sm=8, cg=True,
                             ms=ms, ggather_s=n / ms / 1e6, pct_floor=100 * floor_ms / ms))
    # cuSPARSE: N x D with 32 nonzeros per row, as one matrix and as T column tiles
    N, D, k = n // 32, 100_000, 32
    cols = torch.randint(0, D, (N, k), device=dev, generator=g, dtype=torch.int64).sort(1).values
    crow = torch.arange(0, N * k + 1, k, device=dev, dtype=torch.int64)
    X = torch.sparse_csr_tensor(crow, cols.reshape(-1), val[: N * k], (N, D))
    y = torch.randn(D, device=dev, generator=g)
    ms = bench_ms(lambda: X @ y)
    rows.append(dict(case="cusparse X@y", y_kb=D * 4 >> 10, tiles=1, ms=ms, ggather_s=N * k / ms / 1e6,
                     pct_floor=100 * floor_ms / ms))
    for T in (4, 8):
        w = -(-D // T)
        tiles = []
        for t in range(T):
            msk = (cols >= t * w) & (cols < (t + 1) * w)
            cnt = msk.sum(1)
            cr = torch.zeros(N + 1, device=dev, dtype=torch.int64)
            cr[1:] = cnt.cumsum(0)
            tiles.append(torch.sparse_csr_tensor(cr, (cols[msk] - t * w), val[: N * k].reshape(N, k)[msk], (N, w)))
        ys = [y[t * w:(t + 1) * w].contiguous() for t in range(T)]

        def run():
            out = tiles[0] @ ys[0]
            for t in range(1, T):
                out += tiles[t] @ ys[t]
            return out

        ms = bench_ms(run)
        rows.append(dict(case="cusparse tiles", y_kb=D * 4 >> 10, tiles=T, ms=ms, ggather_s=N * k / ms / 1e6,
                         pct_floor=100 * floor_ms / ms))
    print("| case | y KB | tiles | progs/SM | .cg | ms | G gathers/s | % floor |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['case']} | {r['y_kb']} | {r['tiles']} | {r.get('progs_per_sm', '')} | {r.get('cg', '')} | "
              f"{r['ms']:.3f} | {r['ggather_s']:.0f} | {r['pct_floor']:.1f} |")
    if a.out:
        write_json("gather_probe", rows, {"nnz": n}, out=a.out)
    return rows


if __name__ == "__main__":
    main()
