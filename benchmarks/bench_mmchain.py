"""Benchmark ``fusedml.mmchain`` (fused) against the operator-level torch baselines.

For each case: fused time (do_bench median), effective GB/s and % of the read-once floor
(bytes(X) / 4.28 TB/s; CSR bytes = 8 per nonzero + 4 per row pointer), speedup over "ops"
(dense: two cuBLAS GEMV/GEMM; CSR: cached transpose and ``X.t()`` on the fly), the launch model's
pick against the best of a small sweep around it, and the relative error against a float64
reference computed from fresh random inputs.

    python benchmarks/bench_mmchain.py                 # full run on the GPU (~4 min)
    TRITON_INTERPRET=1 python benchmarks/bench_mmchain.py --quick   # CPU smoke run (< 1 min)
    python benchmarks/bench_mmchain.py --cases dense-2Mx128,csr-4Mx100k --no-sweep
    python benchmarks/bench_mmchain.py --csr-strategies   # CSR: each strategy's best vs the model (~60 s)
    python benchmarks/bench_mmchain.py --dense-sweep      # dense: the weak cases' launch sweep (~60 s)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import _common  # noqa: E402
import fusedml  # noqa: E402
from fusedml import CSRMatrix  # noqa: E402
from fusedml.mmchain import launch  # noqa: E402

# name: (kind, N, D, m, dtype, extra); quick shapes run under the interpreter
FULL = {
    "dense-8Mx32": ("dense", 8_000_000, 32, 1, torch.float32, {}),
    "dense-2Mx128": ("dense", 2_000_000, 128, 1, torch.float32, {}),
    "dense-500kx512": ("dense", 500_000, 512, 1, torch.float32, {}),
    "dense-125kx2048": ("dense", 125_000, 2048, 1, torch.float32, {}),
    "dense-16kx16384": ("dense", 16_384, 16_384, 1, torch.float32, {}),
    "dense-4kx65536": ("dense", 4_096, 65_536, 1, torch.float32, {}),
    "dense-2Mx128-bf16": ("dense", 2_000_000, 128, 1, torch.bfloat16, {}),
    "dense-2Mx128-m4": ("dense", 2_000_000, 128, 4, torch.float32, {}),
    "csr-4Mx100k": ("csr", 4_000_000, 100_000, 1, torch.float32, {"nnz_row": 32}),
    "csr-1Mx1M": ("csr", 1_000_000, 1_000_000, 1, torch.float32, {"nnz_row": 100}),
    "csr-powerlaw": ("csr", 2_000_000, 1_000_000, 1, torch.float32, {"nnz_row": 5, "heavy": 20, "heavy_nnz": 100_000}),
}
#: Named cases outside "all": CSR with m > 1 (the multinomial passes; rows of y / w / p padded to a
#: power of two since session 26), run by name (``--cases``).
EXTRA = {
    "csr-4Mx100k-m3": ("csr", 4_000_000, 100_000, 3, torch.float32, {"nnz_row": 32}),
    "csr-4Mx100k-m4": ("csr", 4_000_000, 100_000, 4, torch.float32, {"nnz_row": 32}),
    "csr-1Mx1M-m3": ("csr", 1_000_000, 1_000_000, 3, torch.float32, {"nnz_row": 100}),
    "csr-4Mx100k-m5": ("csr", 4_000_000, 100_000, 5, torch.float32, {"nnz_row": 32}),
}
QUICK_EXTRA = {
    "csr-4Mx100k-m3": ("csr", 1000, 1000, 3, torch.float32, {"nnz_row": 8}),
    "csr-4Mx100k-m4": ("csr", 1000, 1000, 4, torch.float32, {"nnz_row": 8}),
    "csr-1Mx1M-m3": ("csr", 500, 5000, 3, torch.float32, {"nnz_row": 20}),
    "csr-4Mx100k-m5": ("csr", 1000, 1000, 5, torch.float32, {"nnz_row": 8}),
}
QUICK = {
    "dense-8Mx32": ("dense", 512, 32, 1, torch.float32, {}),
    "dense-2Mx128": ("dense", 256, 128, 1, torch.float32, {}),
    "dense-500kx512": ("dense", 64, 512, 1, torch.float32, {}),
    "dense-125kx2048": ("dense", 16, 2048, 1, torch.float32, {}),
    "dense-16kx16384": ("dense", 4, 16_384, 1, torch.float32, {}),
    "dense-4kx65536": ("dense", 2, 32_768, 1, torch.float32, {}),
    "dense-2Mx128-bf16": ("dense", 256, 128, 1, torch.bfloat16, {}),
    "dense-2Mx128-m4": ("dense", 128, 128, 4, torch.float32, {}),
    "csr-4Mx100k": ("csr", 1000, 1000, 1, torch.float32, {"nnz_row": 8}),
    "csr-1Mx1M": ("csr", 500, 5000, 1, torch.float32, {"nnz_row": 20}),
    "csr-powerlaw": ("csr", 1000, 5000, 1, torch.float32, {"nnz_row": 5, "heavy": 2, "heavy_nnz": 2000}),
}


def make_csr(N: int, D: int, lengths: torch.Tensor, dtype, dev, gen) -> CSRMatrix:
    """Random CSR with the given row lengths, built on ``dev`` with torch (sorted unique columns).

    Row n's columns are ``sort(r) + rank`` with ``r`` uniform in ``[0, D - len_n]``: distinct,
    increasing, inside ``[0, D)``.
    """
    lengths = lengths.to(dev, torch.int64)
    crow = torch.zeros(N + 1, dtype=torch.int64, device=dev)
    crow[1:] = torch.cumsum(lengths, 0)
    nnz = int(crow[-1])
    row = torch.repeat_interleave(torch.arange(N, device=dev), lengths, output_size=nnz)
    span = (D - lengths + 1)[row]
    r = (torch.rand(nnz, device=dev, generator=gen, dtype=torch.float64) * span).long().clamp_max(span - 1)
    key = row * D + r
    key, _ = torch.sort(key)
    rank = torch.arange(nnz, device=dev) - crow[:-1][row]
    col = key - row * D + rank
    val = torch.randn(nnz, device=dev, generator=gen, dtype=torch.float32).to(dtype)
    return CSRMatrix(crow.to(torch.int32), col.to(torch.int32), val, (N, D))


def make_case(spec, dev, seed):
    kind, N, D, m, dtype, extra = spec
    gen = torch.Generator(device=dev).manual_seed(seed)
    if kind == "dense":
        X = torch.randn(N, D, device=dev, generator=gen, dtype=torch.float32).to(dtype)
        nbytes = X.numel() * X.element_size()
    else:
        lengths = torch.full((N,), extra["nnz_row"], dtype=torch.int64)
        if extra.get("heavy"):
            heavy = torch.randperm(N, generator=torch.Generator().manual_seed(seed))[: extra["heavy"]]
            lengths[heavy] = extra["heavy_nnz"]
        X = make_csr(N, D, lengths, dtype, dev, gen)
        nbytes = X.nnz * (X.val.element_size() + X.col.element_size()) + (N + 1) * X.crow.element_size()
    yshape = (D,) if m == 1 else (D, m)
    y = torch.randn(yshape, device=dev, generator=gen)
    v = torch.rand((N,) if m == 1 else (N, m), device=dev, generator=gen)
    return X, y, v, nbytes


def reference64(X, y, v):
    """float64 ``X^T (v * (X y))`` on X's device."""
    y64, v64 = y.double(), v.double()
    if isinstance(X, CSRMatrix):
        A = torch.sparse_csr_tensor(X.crow.long(), X.col.long(), X.val.double(), X.shape, check_invariants=False)
        t = A @ (y64 if y64.ndim == 2 else y64[:, None])
        p = (v64 if v64.ndim == 2 else v64[:, None]) * t
        w = A.t().to_sparse_csr() @ p
        return w if y.ndim == 2 else w[:, 0]
    X64 = X.double()
    return X64.T @ (v64 * (X64 @ y64))


def _model_launch(X, m):
    """The model's launch of the dense product on ``X`` with m right-hand sides."""
    cfg = launch.dense_config(X.shape[0], X.shape[1], m, X.dtype, launch.gpu_info(X.device),
                              stride_xn=X.stride(0), stride_xd=X.stride(1))
    return launch.product_config(cfg, X.shape[1], X.dtype)


def dense_sweep(X, m, quick):
    """A grid around the model's pick: block_n x {1/2, 2}, warps x {1/2, 2}, programs x {1/2, 2},
    plus per strategy: prefetch on/off (onchip), the padded ``tl.dot`` for small m (tf32x3 and ieee), and for wide
    rows ("coop") narrower and wider column blocks, fewer rows held ahead, half the grid, session
    10's launch, two launches and the former "chunked" strategy."""
    base = _model_launch(X, m)
    bn_min = 16 if base.mode == "dot" else 1
    sms = launch.gpu_info(X.device).sm_count
    grid = [{}]
    if base.strategy == "coop":
        grid += [{"block_d": base.block_d // 2, "num_warps": 1}, {"block_d": 2 * base.block_d, "num_warps": 4},
                 {"prefetch": 1}, {"prefetch": 0}, {"num_programs": base.num_programs // 2},
                 {"block_d": 2 * base.block_d, "num_warps": 8, "prefetch": 1, "num_programs": 2 * sms},  # session 10's
                 {"two_pass": True},
                 {"strategy": "chunked", "block_n": 4, "block_d": 16384, "num_warps": 8, "num_programs": 2 * sms}]
        return grid[:2] if quick else grid
    for f in (0.5, 2):
        bn = int(base.block_n * f)
        if bn >= bn_min and (base.strategy == "chunked" or bn * base.block_d <= 65536):
            grid.append({"block_n": bn})
    for f in (0.5, 2):
        w = int(base.num_warps * f)
        if 2 <= w <= 16:
            grid.append({"num_warps": w})
    for f in (0.5, 2):
        grid.append({"num_programs": max(1, int(base.num_programs * f))})
    if base.strategy == "onchip" and base.mode in ("vector", "small") and base.block_n * base.block_d <= 8192:
        grid.append({"prefetch": not base.prefetch})
    if base.mode == "vector" and X.shape[1] >= 8192:  # wide rows that still fit on chip: the coop split
        grid.append({"strategy": "coop", "block_n": 1, "block_d": 2048, "num_warps": 2, "num_programs": 4 * sms,
                     "prefetch": 2})
    if base.mode == "small":  # the padded tl.dot (tf32x3 tensor cores, then ieee FMAs) at its former best launch
        dot = {"mode": "dot", "m_pad": 16, "block_n": 64, "num_warps": 4, "num_programs": 4 * sms, "prefetch": False}
        grid += [dot, dict(dot, dot_precision="ieee"), dict(dot, block_n=16), dict(dot, block_n=32, num_warps=8)]
    if base.mode == "dot":  # the fp32 FMA form the tensor-core default replaced
        grid.append({"dot_precision": "ieee"})
        grid.append({"num_programs": base.num_programs * 3 // 2})
    if base.strategy == "chunked":
        for f in (0.5, 2):
            grid.append({"block_d": max(16, int(base.block_d * f))})
    return grid[:2] if quick else grid


#: The dense cases below 87 % of the floor in the 2026-12-02 session-2 H200 run.
WEAK_DENSE = "dense-2Mx128-bf16,dense-2Mx128-m4,dense-4kx65536"


def dense_config_sweep(names, specs, dev, quick=False):
    """Per dense case: the model's pick and every point of :func:`dense_sweep` (ms, % of floor),
    the best, ``model/best``, "ops", and the model pick's error against float64 on fresh inputs.

    Built for one GPU call of at most ~60 s (each point compiles once; ~9 points per case).
    """
    rows = []
    for name in names:
        spec = specs[name]
        if spec[0] != "dense":
            continue
        t0 = time.time()
        X, y, v, nbytes = make_case(spec, dev, seed=1)
        m = spec[3]
        floor = nbytes / _common.H200_BANDWIDTH * 1e3
        cfg = _model_launch(X, m)
        row = {"case": name, "floor_ms": floor, "model": repr(cfg)}
        rep = 10 if quick else 40
        ref = reference64(X, y, v)
        points, worst = [], 0.0
        for over in dense_sweep(X, m, quick):
            fn = lambda over=over: fusedml.mmchain(X, y, v, backend="fused", config=over)  # noqa: E731
            try:
                err = float((fn().double() - ref).norm() / ref.norm())  # compiles outside the timing
                ms = _common.bench_ms(fn, rep=rep)
            except Exception as e:  # a point that does not launch is reported, not fatal
                print(f"  {name}: {over} failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            points.append((ms, over))
            worst = max(worst, err)
            print(f"  {name} {over}: {ms:.4f} ms ({100 * floor / ms:.1f} % of floor) rel_err={err:.2e}", flush=True)
        wd = [fusedml.mmchain(X, y, v, backend="fused", deterministic=True) for _ in range(2)]
        row["det_repeatable"] = bool(torch.equal(wd[0], wd[1]))
        row["rel_err_det"] = float((wd[0].double() - ref).norm() / ref.norm())
        row["worst_sweep_rel_err"] = worst
        del ref, wd
        model_ms = next((ms for ms, over in points if not over), float("nan"))
        best_ms, best = min(points, key=lambda p: p[0]) if points else (float("nan"), None)
        row.update({"model_ms": model_ms, "%floor": 100 * floor / model_ms, "best_ms": best_ms, "best": repr(best),
                    "best_%floor": 100 * floor / best_ms, "model/best": model_ms / best_ms,
                    "sweep": [(ms, repr(o)) for ms, o in points]})
        row["ops_ms"] = _common.bench_ms(lambda: fusedml.mmchain(X, y, v, backend="ops"), rep=rep)
        row["speedup_ops"] = row["ops_ms"] / model_ms
        X2, y2, v2, _ = make_case(spec, dev, seed=2)
        row["rel_err"] = float((fusedml.mmchain(X2, y2, v2, backend="fused").double() - reference64(X2, y2, v2)).norm()
                               / reference64(X2, y2, v2).norm())
        row["s"] = time.time() - t0
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "sweep"}, flush=True)
        rows.append(row)
        X = X2 = None  # free the device memory
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    cols = ["case", "floor_ms", "model_ms", "%floor", "best_ms", "best_%floor", "model/best", "best", "ops_ms",
            "speedup_ops", "rel_err", "worst_sweep_rel_err", "det_repeatable", "s"]
    print(_common.markdown_table(rows, cols))
    return rows


def run_case(name, spec, args, dev):
    kind, N, D, m, dtype, extra = spec
    row = {"case": name, "kind": kind, "N": N, "D": D, "m": m, "dtype": str(dtype).replace("torch.", "")}
    X, y, v, nbytes = make_case(spec, dev, seed=1)
    row["MB"] = nbytes / 1e6
    row["floor_ms"] = nbytes / _common.H200_BANDWIDTH * 1e3
    rep = 20 if args.quick else 100

    def fused(cfg=None):
        return fusedml.mmchain(X, y, v, backend="fused", config=cfg)

    if kind == "csr":
        # CSR "auto" scatters on a matrix's first call and builds the cached CSC copy (a sort, plus
        # new kernel compiles) on its second: do that here, not inside do_bench, whose 5-call
        # estimate would otherwise include it and leave ~1 timed repetition (0.70 ms vs 0.27 ms on
        # the H200 power-law case, 2026-12-02 s2).
        fused()
        fused()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    row["fused_ms"] = _common.bench_ms(fused, rep=rep)
    row["GB/s"] = nbytes / (row["fused_ms"] * 1e-3) / 1e9
    row["%floor"] = 100.0 * row["floor_ms"] / row["fused_ms"]
    if kind == "dense":
        row["ops_ms"] = _common.bench_ms(lambda: fusedml.mmchain(X, y, v, backend="ops"), rep=rep)
        row["speedup_ops"] = row["ops_ms"] / row["fused_ms"]
        cfg = _model_launch(X, m)
        row["model"] = f"{cfg.strategy} bn={cfg.block_n} bd={cfg.block_d} w={cfg.num_warps} P={cfg.num_programs}"
        grid = dense_sweep(X, m, args.quick) if args.sweep else []
    else:
        for variant in ("cached", "on_the_fly"):
            ms = _common.bench_ms(lambda: fusedml.mmchain(X, y, v, backend="ops", config={"ops_transpose": variant}),
                                  rep=rep if variant == "cached" else max(rep, 200))
            row[f"ops_{variant}_ms"] = ms
            row[f"speedup_{variant}"] = ms / row["fused_ms"]
        from fusedml.mmchain import csr as csr_mod

        row["model"] = repr(csr_mod.csr_config(X, m, dtype))[:80]
        grid = list(csr_mod.csr_sweep_configs(X, m, dtype)) if args.sweep else []
        # every point compiles new kernels: the model's pick, the other strategy, then the nearest
        # variants of each (csr_sweep_configs orders them so)
        head, rest = grid[:2], grid[2:]
        by = [[c for c in rest if c.strategy == st] for st in ("gather", "scatter")]
        rest = [c for pair in zip(*by) for c in pair] + by[0][len(by[1]):] + by[1][len(by[0]):]
        grid = head if args.quick else (head + rest)[:args.max_csr_sweep]
    if grid:
        sweep = []
        for cfg in grid:
            try:
                sweep.append((_common.bench_ms(lambda: fused(cfg), rep=max(10, rep // 3)), repr(cfg)))
            except Exception as e:  # a sweep point that does not launch (e.g. out of resources)
                print(f"  {name}: sweep point {cfg} failed: {type(e).__name__}: {e}", file=sys.stderr)
        # the model's pick is the sweep's first point (dense: {}, CSR: csr_sweep_configs' first),
        # timed like every other point; a separate re-timing of it would compare two runs' noise
        first = sweep and sweep[0][1] == repr(grid[0])
        model_ms = sweep[0][0] if first else _common.bench_ms(fused, rep=max(10, rep // 3))
        best = min(sweep + [(model_ms, "model")])
        row["sweep"] = sweep
        row["sweep_best_ms"], row["sweep_best"] = best
        row["model/best"] = model_ms / best[0]
    # correctness: fresh inputs, float64 reference
    X2, y2, v2, _ = make_case(spec, dev, seed=2)
    w = fusedml.mmchain(X2, y2, v2, backend="fused")
    ref = reference64(X2, y2, v2)
    row["rel_err"] = float((w.double() - ref).norm() / ref.norm())
    X = X2 = None  # free the device memory
    return row


def csr_strategy_sweep(names, specs, dev, quick=False):
    """Per CSR case: each strategy's best time over a small launch grid, the model's predictions
    and pick, cuSPARSE (ops, cached transpose) and one SpMV; one line per case plus a table.

    Built for one GPU call of at most ~60 s (each grid point compiles its kernels once; 3 cases x
    about 6 points). The model's constants live in ``fusedml.mmchain.csr`` (``csr_config``).
    """
    from fusedml.mmchain import csr as csr_mod

    rows = []
    for name in names:
        spec = specs[name]
        if spec[0] != "csr":
            continue
        t0 = time.time()
        X, y, v, nbytes = make_case(spec, dev, seed=1)
        m = spec[3]
        y2, v2 = y.reshape(X.shape[1], -1), v.reshape(X.shape[0], -1)
        model = csr_mod.csr_config(X, m, X.val.dtype)
        sc = csr_mod.csr_config(X, m, X.val.dtype, strategy="scatter")
        ga = csr_mod.csr_config(X, m, X.val.dtype, strategy="gather")

        def scaled(c, f=1, warps=None):  # tile x f (rows per program follow), optionally warps
            if c is None:
                return None
            tile = max(64, int(c.tile * f))
            w = warps or c.num_warps
            return dataclasses.replace(c, tile=tile, block_r=max(1, tile // c.lanes) if c.ordered else c.block_r,
                                       num_warps=w, long_warps=w, gather=scaled(c.gather, f, warps))

        def flip(c):  # the other L1 setting for A's stream (and the copy's)
            g = None if c.gather is None else dataclasses.replace(c.gather, l1_bypass=not c.gather.l1_bypass)
            return dataclasses.replace(c, l1_bypass=not c.l1_bypass, gather=g)

        def looped(c):  # the CSC pass with half-width tiles looped (less lane waste on ~Poisson columns)
            g = c.gather
            if g is None or g.lanes < 64 or not g.ordered:
                return None
            lanes = g.lanes // 2
            return dataclasses.replace(c, gather=dataclasses.replace(
                g, lanes=lanes, single=False, block_r=max(1, g.tile // lanes)))

        grid = {"scatter": [sc], "gather": [ga]}
        if not quick:  # 6 points per case, each compiling its kernels once: the whole run <~60 s
            grid["scatter"] += [flip(sc)]
            grid["gather"] += [c for c in (flip(ga), looped(ga), scaled(ga, 2)) if c is not None]
        row = {"case": name, "nnz": X.nnz, "floor_ms": nbytes / _common.H200_BANDWIDTH * 1e3,
               "model_pick": model.strategy, "pred_scatter_ms": model.pred_scatter_ms,
               "pred_gather_ms": model.pred_gather_ms}
        for strat, cfgs in grid.items():
            best = (float("inf"), None)
            for cfg in cfgs:
                fn = lambda cfg=cfg: csr_mod.csr_mmchain_fused(X, y2, v2, None, config=cfg)  # noqa: E731
                try:
                    fn()  # compile (and for gather, build the cached copy) outside the timing
                    ms = _common.bench_ms(fn, rep=20 if quick else 60)
                except Exception as e:  # a grid point that does not launch is reported, not fatal
                    print(f"  {name}: {cfg} failed: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                label = f"tile={cfg.tile} w={cfg.num_warps} l1b={int(cfg.l1_bypass)}"
                if cfg.gather is not None:
                    g = cfg.gather
                    label += (f" | csc tile={g.tile} L={g.lanes}{'' if g.single else ' loop'}"
                              f"{'' if g.ordered else ' binned'} w={g.num_warps} l1b={int(g.l1_bypass)}")
                print(f"  {name} {strat:7s} {ms:8.4f} ms  {label}", flush=True)
                best = min(best, (ms, label))
            row[f"{strat}_ms"], row[f"{strat}_best_cfg"] = best
        fused = lambda: fusedml.mmchain(X, y, v, backend="fused")  # noqa: E731
        fused()
        fused()  # auto: the second call on a matrix builds the copy
        row["auto_ms"] = _common.bench_ms(fused, rep=20 if quick else 60)
        row["ops_cached_ms"] = _common.bench_ms(
            lambda: fusedml.mmchain(X, y, v, backend="ops", config={"ops_transpose": "cached"}), rep=20 if quick else 60)
        At = torch.sparse_csr_tensor(X.crow, X.col, X.val.float(), X.shape, check_invariants=False)
        row["spmv_ms"] = _common.bench_ms(lambda: At @ y2, rep=20 if quick else 60)
        best_strat = min(("scatter", "gather"), key=lambda k: row[f"{k}_ms"])
        row["best"] = best_strat
        row["model_ok"] = best_strat == model.strategy
        row["auto/ops_cached"] = row["auto_ms"] / row["ops_cached_ms"]
        row["pred/meas_gather"] = model.pred_gather_ms / row["gather_ms"]
        row["pred/meas_scatter"] = model.pred_scatter_ms / row["scatter_ms"]
        row["s"] = time.time() - t0
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        rows.append(row)
        X = At = None  # free the device memory
        csr_mod._CACHE.clear()  # the CSC copies (and the ops transposes) of this case
        from fusedml.mmchain import ops as ops_mod

        ops_mod.clear_transpose_cache()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    cols = ["case", "floor_ms", "scatter_ms", "pred_scatter_ms", "gather_ms", "pred_gather_ms", "best",
            "model_pick", "model_ok", "auto_ms", "ops_cached_ms", "auto/ops_cached", "spmv_ms", "s"]
    print(_common.markdown_table(rows, cols))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run under TRITON_INTERPRET=1)")
    ap.add_argument("--cases", default="all", help="comma-separated case names (default: all): " + ",".join(FULL)
                    + "; by name only: " + ",".join(EXTRA))
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/mmchain-<gpu>-<date>.json)")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the config sweep")
    ap.add_argument("--max-csr-sweep", type=int, default=14, help="sweep points per CSR case (each compiles)")
    ap.add_argument("--dense-sweep", action="store_true",
                    help="only the dense launch sweep (model vs each point; default cases: the weak ones, ~60 s)")
    ap.add_argument("--csr-strategies", action="store_true",
                    help="only the CSR strategy sweep (each strategy's best vs the model's prediction; ~60 s)")
    args = ap.parse_args(argv)
    dev = _common.device()
    if dev.type == "cpu" and not fusedml.interpret_mode():
        ap.error("no CUDA device: run with TRITON_INTERPRET=1 (and --quick) for a CPU smoke run")
    specs = QUICK if args.quick else FULL
    if args.dense_sweep and args.cases == "all":
        args.cases = WEAK_DENSE
    names = list(specs) if args.cases == "all" else [c.strip() for c in args.cases.split(",") if c.strip()]
    specs = {**specs, **(QUICK_EXTRA if args.quick else EXTRA)}
    unknown = [n for n in names if n not in specs]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {list(specs)}")
    if args.dense_sweep:
        rows = dense_config_sweep(names, specs, dev, quick=args.quick)
        _common.write_json("mmchain-dense-sweep", rows, {"args": vars(args)}, args.out)
        return rows
    if args.csr_strategies:
        csr_names = [n for n in names if specs[n][0] == "csr"]
        rows = csr_strategy_sweep(csr_names, specs, dev, quick=args.quick)
        if args.out:
            _common.write_json("mmchain-csr-strategies", rows, {"args": vars(args)}, args.out)
        return rows
    rows = []
    t_start = time.time()
    for name in names:
        try:
            row = run_case(name, specs[name], args, dev)
        except Exception as e:  # keep the other cases; the row records the failure
            row = {"case": name, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    path = _common.write_json("mmchain", rows, {"args": vars(args)}, args.out)
    print(f"\nwrote {path} ({time.time() - t_start:.0f} s)\n")
    cols = ["case", "dtype", "MB", "floor_ms", "fused_ms", "GB/s", "%floor", "ops_ms", "speedup_ops",
            "ops_cached_ms", "speedup_cached", "ops_on_the_fly_ms", "speedup_on_the_fly", "model/best",
            "rel_err", "error"]
    print(_common.markdown_table(rows, cols))
    return rows


if __name__ == "__main__":
    main()
