"""CSR mmchain: the gather strategy's cache blocking (``CSRConfig.tile_bytes``: tiled nonzero
streams) against no blocking and against the operator-level baselines, side by side in one run.

For each matrix and m: ms (``do_bench`` median), % of the read-once floor, speed-up over "ops"
with the cached transpose, relative error against a float64 cuSPARSE reference on fresh inputs,
the one-off cost of building the copies, and the matvec a solver makes between Hessian products.

    python benchmarks/bench_csr_tiles.py [--quick] [--matrices NxD:NNZ:PROFILE ...] [--scatter] [--flat]
        [--l1-bypass] [--red] [--contig C ...] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402

if not torch.cuda.is_available():  # a smoke run of the script under the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import datasets  # noqa: E402
import fusedml  # noqa: E402
from fusedml.mmchain import csr  # noqa: E402


def matrices(dev, quick, specs=()):
    """``(name, CSR X)``: the default three (or a tiny one), or ``NxD:NNZ:PROFILE`` specs (datasets.make_csr)."""
    if specs:
        for spec in specs:
            yield _common.csr_from_spec(spec, dev, (2000, 3000) if quick else None)
        return
    if quick:
        yield "powerlaw-2000x3000", datasets.make_csr(2000, 3000, 16, "powerlaw", device=dev, return_torch=True).X
        return
    yield "powerlaw-1Mx100k-32 (e2e)", datasets.make_csr(1_000_000, 100_000, 32, "powerlaw", device=dev,
                                                         return_torch=True).X
    n = 4_000_000
    yield "uniform-4Mx100k-32", csr._bench_matrix(n, 100_000, torch.full((n,), 32), device=dev)
    n = 1_000_000
    yield "uniform-1Mx1M-100", csr._bench_matrix(n, 1_000_000, torch.full((n,), 100), device=dev)


def rel(a, b):
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-300))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tiles", nargs="+", type=int, default=[0, 16 << 10, 32 << 10, 64 << 10])
    ap.add_argument("--kernel", nargs="+", default=[], metavar="BLOCKxWARPSxPROGS",
                    help="also time the default tiles (csr.TILE_BYTES) with these stream-kernel settings, e.g. 2048x8x4")
    ap.add_argument("--matrices", nargs="+", default=[], metavar="NxD:NNZ:PROFILE",
                    help="these matrices instead of the default three (e.g. 1000000x4000000:32:powerlaw)")
    ap.add_argument("--scatter", action="store_true", help="also time the scatter strategy (one pass, atomics)")
    ap.add_argument("--flat", action="store_true",
                    help="also time flat streams (CSRConfig.flat 1, 2, 3) for the untiled m = 1 passes")
    ap.add_argument("--l1-bypass", action="store_true", help="also time both row passes with A loaded .cg")
    ap.add_argument("--red", action="store_true",
                    help="also time the streams (default tiles; flat 3) with their segment totals through inline "
                         "red and through tl.atomic_add (csr.STREAM_INLINE_RED), side by side")
    ap.add_argument("--contig", nargs="+", type=int, default=[], metavar="C",
                    help="also time the streams (default tiles; flat 3) with C elements a thread in the stream "
                         "kernel (csr.STREAM_CONTIG; 0: the loads' width), each way of adding totals")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = _common.device()
    quick = a.quick or dev.type != "cuda"
    bw = 4.28e12
    rows = []
    for name, A in matrices(dev, quick, a.matrices):
        n, d = A.shape
        floor_ms = (A.nnz * (A.val.element_size() + A.col.element_size()) + (n + 1) * A.crow.element_size()) / bw * 1e3
        A64 = A.to(dtype=torch.float64)
        for m in ((1, 3) if "powerlaw" in name else (1,)):
            g = torch.Generator(device=dev).manual_seed(m)
            shp = (lambda k: (k,)) if m == 1 else (lambda k: (k, m))
            y = torch.randn(*shp(d), generator=g, device=dev)
            v = torch.rand(*shp(n), generator=g, device=dev)
            ref = fusedml.mmchain(A64, y.double(), v.double(), backend="ops")
            ops = lambda: fusedml.mmchain(A, y, v, backend="ops", config={"ops_transpose": "cached"})  # noqa: E731
            ops()
            ops_ms = _common.bench_ms(ops)
            rows.append(dict(matrix=name, m=m, variant="ops (cached X^T)", ms=ops_ms, pct_floor=100 * floor_ms / ops_ms,
                             speedup=1.0, rel_err=rel(ops(), ref),
                             matvec_ms=_common.bench_ms(lambda: fusedml.matvec(A, y, backend="ops"))))
            for tb in a.tiles:
                cfg = {"strategy": "gather", "tile_bytes": tb}
                W, H, _ = csr._tile_sizes(A, m, tb) if tb else (d, n, 0)
                fn = lambda: fusedml.mmchain(A, y, v, backend="fused", config=cfg)  # noqa: E731
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = fn()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                first_ms = (time.perf_counter() - t0) * 1e3
                ms = _common.bench_ms(fn)
                row = dict(matrix=name, m=m, variant=f"fused gather tile {tb >> 10} KB" if tb else "fused gather untiled",
                           col_tiles=-(-d // W), row_tiles=-(-n // H), ms=ms, pct_floor=100 * floor_ms / ms,
                           speedup=ops_ms / ms, rel_err=rel(out, ref), first_call_ms=first_ms)
                mv = lambda: fusedml.matvec(A, y, backend="fused", config=cfg)  # noqa: E731
                row["matvec_ms"] = _common.bench_ms(mv)
                row["matvec_rel_err"] = rel(mv(), fusedml.matvec(A64, y.double(), backend="ops"))
                rows.append(row)
            def variant(label, cfg, matvec=False):
                """One row: the mmchain under ``cfg`` (and its matvec) timed, checked against float64."""
                fn = lambda: fusedml.mmchain(A, y, v, backend="fused", config=cfg)  # noqa: E731
                out = fn()
                ms = _common.bench_ms(fn)
                rows.append(dict(matrix=name, m=m, variant=label, ms=ms, pct_floor=100 * floor_ms / ms,
                                 speedup=ops_ms / ms, rel_err=rel(out, ref)))
                if matvec:
                    rows[-1]["matvec_ms"] = _common.bench_ms(lambda: fusedml.matvec(A, y, backend="fused", config=cfg))

            for spec in a.kernel if m == 1 else []:  # the stream kernel's block, warps, programs per SM
                default = csr.STREAM_BLOCK, csr.STREAM_WARPS, csr.STREAM_PROGRAMS_PER_SM
                csr.STREAM_BLOCK, csr.STREAM_WARPS, csr.STREAM_PROGRAMS_PER_SM = map(int, spec.split("x"))
                csr._structure(A).streams.clear()
                variant(f"fused {csr.TILE_BYTES >> 10} KB, stream kernel {spec}",
                        {"strategy": "gather", "tile_bytes": csr.TILE_BYTES}, matvec=True)
                csr.STREAM_BLOCK, csr.STREAM_WARPS, csr.STREAM_PROGRAMS_PER_SM = default
                csr._structure(A).streams.clear()
            for f in (1, 2, 3) if a.flat and m == 1 else ():  # untiled passes as one flat stream each
                variant(f"fused flat {f} (applies {csr._tile_sizes(A, m, csr.TILE_BYTES, f)[2]})",
                        {"strategy": "gather", "tile_bytes": csr.TILE_BYTES, "flat": f}, matvec=True)
            default_red = csr.STREAM_INLINE_RED
            for inline in (True, False, True) if a.red and m == 1 else ():  # drift: inline timed before and after
                csr.STREAM_INLINE_RED = inline
                how = "inline red" if inline else "tl.atomic_add"
                variant(f"fused {csr.TILE_BYTES >> 10} KB, {how}", {"strategy": "gather", "tile_bytes": csr.TILE_BYTES},
                        matvec=True)
                variant(f"fused flat 3, {how}", {"strategy": "gather", "tile_bytes": csr.TILE_BYTES, "flat": 3},
                        matvec=True)
            default_contig = csr.STREAM_CONTIG
            for c in a.contig if m == 1 else ():  # list 0 first and last to see the drift
                csr.STREAM_CONTIG = c
                for inline in (False, True):
                    csr.STREAM_INLINE_RED = inline
                    how = f"contig {c}, " + ("inline red" if inline else "tl.atomic_add")
                    variant(f"fused {csr.TILE_BYTES >> 10} KB, {how}", {"strategy": "gather", "tile_bytes": csr.TILE_BYTES},
                            matvec=True)
                    variant(f"fused flat 3, {how}", {"strategy": "gather", "tile_bytes": csr.TILE_BYTES, "flat": 3},
                            matvec=True)
            csr.STREAM_INLINE_RED, csr.STREAM_CONTIG = default_red, default_contig
            if a.l1_bypass:  # the row passes with A's stream kept out of L1 (the model's pick otherwise)
                variant("fused gather, .cg loads", {"strategy": "gather", "l1_bypass": True, "gather": {"l1_bypass": True}})
            if a.scatter:  # the one-pass strategy (float atomics into w) beside the gathers
                variant("fused scatter", {"strategy": "scatter"})
            auto = lambda: fusedml.mmchain(A, y, v, backend="fused")  # noqa: E731
            auto(), auto()
            ms = _common.bench_ms(auto)
            rows.append(dict(matrix=name, m=m, variant="fused auto (model)", ms=ms, pct_floor=100 * floor_ms / ms,
                             speedup=ops_ms / ms, rel_err=rel(auto(), ref)))
            rows[-1]["floor_ms"] = floor_ms
        A = A64 = None  # free the device memory
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    cols = ["matrix", "m", "variant", "col_tiles", "row_tiles", "ms", "pct_floor", "speedup", "matvec_ms",
            "rel_err", "first_call_ms"]
    print(_common.markdown_table(rows, cols))
    if a.out or dev.type == "cuda":
        print(_common.write_json("csr_tiles", rows, {"args": vars(a)}, out=a.out))


if __name__ == "__main__":
    main()
