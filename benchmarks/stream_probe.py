"""What a segmented gather stream costs, step by step (the CSR cache-blocking question).

``gather_probe.py`` showed random gathers from an L1-sized slice at ~436 G/s; a CSR pass built on
tiled streams (``out[key[j]] += val[j] * vec[idx[j]]``, keys sorted; session 8, not kept) ran far
below that. This probe times the same stream with its steps added one at a time, on a stream
shaped like pass 1 of the power-law 1M x 100k matrix (32M nonzeros, 7 column tiles of 16384, ~4.5
nonzeros per (row, tile) segment):

* ``gather``    -- ``sum val * vec[idx]`` (8 B per nonzero, the probe's kernel);
* ``+keys``     -- also loads the segment id and the next one (12 B per nonzero);
* ``+scan``     -- also the per-block segmented ``tl.associative_scan`` (its result summed);
* ``+stores``   -- the whole pass: owner stores and boundary atomics of the segment totals.

and the same for the kept stream format (``fusedml.mmchain.csr._make_stream``: a 16-bit index in
the tile with the segment flags, 6 B per nonzero, per-segment output ids):

* ``v2 gather`` -- ``sum val * vec[base + idx]``;
* ``v2 +scan``  -- also the segmented scan (its totals at the segment ends summed);
* ``v2 pass``   -- the library's pass (``_stream_pass``: one atomic per segment).

    python benchmarks/stream_probe.py [--nnz 33554432] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():  # a smoke run of the script under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import bench_ms, device, write_json  # noqa: E402

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fusedml.mmchain import csr  # noqa: E402
from fusedml.mmchain.csr import _seg_add as _seg_cnt_add  # noqa: E402  (the library's scan)

STEPS = ("gather", "+keys", "+scan", "+stores")
V2_STEPS = ("v2 gather", "v2 +scan", "v2 pass")


@triton.jit
def _seg_add(k1, v1, k2, v2):
    return k2, tl.where(k1 == k2, v1 + v2, v2)


@triton.jit
def _stream_kernel(KEY, IDX, VAL, VEC, OUT, ACC, nnz, n_blocks, BLOCK: tl.constexpr, STEP: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for b in range(pid, n_blocks, nprog):
        o = b * BLOCK + offs
        m = o < nnz
        i = tl.load(IDX + o, mask=m, other=0, cache_modifier=".cg")
        v = tl.load(VAL + o, mask=m, other=0.0, cache_modifier=".cg")
        prod = v * tl.load(VEC + i, mask=m, other=0.0)
        if STEP == 0:
            acc += prod
        else:
            k = tl.load(KEY + o, mask=m, other=2147483647, cache_modifier=".cg")
            kn = tl.load(KEY + o + 1, mask=(o + 1) < nnz, other=2147483647, cache_modifier=".cg")
            if STEP == 1:
                acc += prod + (k != kn).to(tl.float32)
            else:
                _, tot = tl.associative_scan((k, prod), 0, _seg_add)
                end = m & ((k != kn) | (offs == BLOCK - 1))
                if STEP == 2:
                    acc += tl.where(end, tot, 0.0)
                else:
                    k0 = tl.load(KEY + b * BLOCK)
                    tl.store(OUT + k, tot, mask=end & (k != k0) & (offs != BLOCK - 1))
                    tl.atomic_add(OUT + k, tot, mask=end & ((k == k0) | (offs == BLOCK - 1)), sem="relaxed")
    tl.store(ACC + pid, tl.sum(acc, axis=0))


@triton.jit
def _v2_kernel(KEY, VAL, TILE, VEC, ACC, n_blocks, per, BLOCK: tl.constexpr, STEP: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for b in range(pid, n_blocks, nprog):
        o = b * BLOCK + offs
        kk = tl.load(KEY + o, cache_modifier=".cg").to(tl.int32)
        v = tl.load(VAL + o, cache_modifier=".cg")
        prod = v * tl.load(VEC + tl.load(TILE + b) * per + (kk & 0x3FFF))
        if STEP == 0:
            acc += prod
        else:
            _, tot = tl.associative_scan((((kk >> 14) & 1).to(tl.float32), prod), 0, _seg_cnt_add)
            acc += tl.where((kk < 0) | (offs == BLOCK - 1), tot, 0.0)
    tl.store(ACC + pid, tl.sum(acc, axis=0))


def run_v2(step, sp, vec, programs):
    """One launch of the v2 probe kernel (step 0, 1) or the library's pass (step 2) on stream ``sp``."""
    if step == 2:
        return csr._stream_pass(sp, vec)
    acc = torch.empty(programs, device=vec.device)
    _v2_kernel[(programs,)](sp.key, sp.val, sp.tile, vec, acc, sp.key.numel() // sp.block, sp.per, BLOCK=sp.block,
                            STEP=step, num_warps=csr.STREAM_WARPS)
    return acc


def run(step, key, idx, val, vec, out, programs, block=1024):
    """One launch of the probe kernel with the given step (index into STEPS)."""
    nnz = idx.numel()
    nb = triton.cdiv(nnz, block)
    acc = torch.empty(programs, device=idx.device)
    _stream_kernel[(programs,)](key, idx, val, vec, out, acc, nnz, nb, BLOCK=block, STEP=step, num_warps=8)
    return acc


def make_stream(n_rows, tiles, tile_cols, per_seg, dev, seed=0):
    """Keys ``tile * n_rows + row`` sorted, ~``per_seg`` nonzeros per key, indices inside the key's tile."""
    g = torch.Generator(device=dev).manual_seed(seed)
    n_seg = n_rows * tiles
    lens = torch.poisson(torch.full((n_seg,), float(per_seg), device=dev), generator=g).to(torch.int64)
    key = torch.repeat_interleave(torch.arange(n_seg, device=dev, dtype=torch.int64), lens)
    tile = key // n_rows
    idx = tile * tile_cols + torch.randint(0, tile_cols, key.shape, device=dev, generator=g)
    val = torch.randn(key.numel(), device=dev, generator=g)
    return key.to(torch.int32), idx.to(torch.int32), val, n_seg


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tiles", type=int, default=7)
    ap.add_argument("--per-seg", type=float, default=4.5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = device()
    tile_cols = 16384
    key, idx, val, n_seg = make_stream(a.rows, a.tiles, tile_cols, a.per_seg, dev)
    vec = torch.randn(a.tiles * tile_cols, device=dev)
    out = torch.zeros(n_seg, device=dev)
    nnz = idx.numel()
    sm = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
    rows = []
    for s, name in enumerate(STEPS):
        ms = bench_ms(lambda: run(s, key, idx, val, vec, out, sm * 8))
        bytes_ = nnz * (8 if s == 0 else 12) + (n_seg * 4 if s == 3 else 0)
        rows.append(dict(step=name, nnz=nnz, segments=n_seg, ms=ms, g_nnz_s=nnz / ms / 1e6,
                         pct_floor=100 * bytes_ / 4.28e9 / ms))
    sp = csr._make_stream(key.long(), idx, val, a.tiles, a.rows, tile_cols)
    n_pad = sp.key.numel()
    for s, name in enumerate(V2_STEPS):
        ms = bench_ms(lambda: run_v2(s, sp, vec, sm * csr.STREAM_PROGRAMS_PER_SM))
        bytes_ = n_pad * 6 + (sp.seg_out.numel() * 8 if s == 2 else 0)
        rows.append(dict(step=name, nnz=nnz, segments=sp.seg_out.numel(), ms=ms, g_nnz_s=nnz / ms / 1e6,
                         pct_floor=100 * bytes_ / 4.28e9 / ms))
    t = run_v2(2, sp, vec, 0)
    ref_t = torch.zeros(a.rows, dtype=torch.float64, device=dev).index_add_(
        0, key.long() % a.rows, val.double() * vec.double()[idx.long()])
    err_v2 = float((t.double() - ref_t).norm() / ref_t.norm())
    out.zero_()
    run(3, key, idx, val, vec, out, sm * 8)
    ref = torch.zeros(n_seg, dtype=torch.float64, device=dev).index_add_(
        0, key.long(), val.double() * vec.double()[idx.long()])
    err = float((out.double() - ref).norm() / ref.norm())
    print("| step | nonzeros | segments | ms | G nnz/s | % of its bytes' floor |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['step']} | {r['nnz']} | {r['segments']} | {r['ms']:.3f} | {r['g_nnz_s']:.0f} | {r['pct_floor']:.1f} |")
    print(f"full pass against float64: relative error {err:.2e}; v2 pass {err_v2:.2e}")
    if a.out:
        write_json("stream_probe", rows, {"args": vars(a), "rel_err": err, "rel_err_v2": err_v2}, out=a.out)
    err = max(err, err_v2)
    return rows, err


if __name__ == "__main__":
    main()
