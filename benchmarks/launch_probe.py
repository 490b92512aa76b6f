"""Launch probes of the dense mmchain kernels, one question each.

    python benchmarks/launch_probe.py --probe coop --shape 4096,65536 --out results/coop_sweep.json
    python benchmarks/launch_probe.py --probe grid --out results/grid_probe.json

``coop``: the cooperative wide-row kernel (m = 1) over column block x warps x rows held ahead
(``num_programs`` is an upper bound: the launcher caps the grid to the compiled kernel's
residency). ``small``: the unrolled m <= 4 kernel with and without its register prefetch, on the
shapes where the two measured opposite (2M x 128, m = 4 and the solvers' 1M x 100, m = 3 with
the intercept), crossed over D, m and the intercept. ``bf16``: 2M x 128 bf16 storage, m = 1, over
tile rows x warps x programs per SM. ``warps16``: bf16 / fp16 storage, m = 1, D = 32..2048: the
model's warps against half / double. ``tiles``: tile rows x warps x programs around the model's
picks (m <= 4 and bf16). ``grid``: the unrolled kernel at one wave of resident programs (the
launcher's cap), over tile elements per thread x warps x prefetch. ``dot``: m = 5..8 on rows over
128 values (padded ``tl.dot`` precisions and tiles, the unrolled kernel, ops). ``softmax``: the
multinomial Hessian product in one read, two reads and ops. Each point:
``fusedml.mmchain`` (or ``fusedml.matvec``) timed with ``_common.bench_ms`` (the median of
``triton.testing.do_bench``) and checked against a float64 reference; one line per point.
(Session 11's ``-s11-c``, ``-d`` and ``-f`` runs of this script took do_bench's default mean, and
its bf16 probe also tried a second prefetched tile, since removed from the kernel.)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fusedml  # noqa: E402
from _common import H200_BANDWIDTH, bench_ms, write_json  # noqa: E402
from fusedml.mmchain import launch  # noqa: E402

SMALL_SHAPES = ((2_000_000, 128, 4), (1_000_000, 100, 3), (2_000_000, 100, 4), (1_000_000, 128, 3), (2_000_000, 256, 3))
GRID_CASES = [(2_000_000, 128, 4, False, "mul"), (1_000_000, 100, 3, True, "softmax"),
              (2_000_000, 256, 3, True, "softmax"), (2_000_000, 256, 4, False, "mul"),
              (4_000_000, 64, 3, True, "softmax"), (2_000_000, 256, 3, True, "xtv"), (1_000_000, 100, 3, True, "xtv"),
              (2_000_000, 128, 4, False, "xtv"), (2_000_000, 256, 5, True, "xtv"), (2_000_000, 256, 5, True, "softmax")]
TILES_CASES = [(2_000_000, 128, 4, False, "mul", torch.float32), (1_000_000, 100, 3, True, "mul", torch.float32),
               (1_000_000, 100, 3, True, "softmax", torch.float32), (2_000_000, 128, 1, False, "mul", torch.bfloat16)]


def _ref64(X, Y, V, intercept=False, v_op="mul"):
    """float64 ``[X,1]^T (V op ([X,1] Y))`` (``[X,1]^T V`` when Y is None) on X's device
    (``fusedml.mmchain_reference`` computes on the CPU: seconds per probe case at these sizes, paid
    in device time)."""
    X64 = X.double()
    if intercept:
        X64 = torch.cat([X64, torch.ones(X64.shape[0], 1, dtype=X64.dtype, device=X.device)], 1)
    if Y is None:
        return X64.T @ V.double()
    T = X64 @ Y.double()
    V64 = V.double() if V.ndim == T.ndim else V.double()[:, None]
    P = V64 * (T - (V64 * T).sum(1, keepdim=True)) if v_op == "softmax" else V64 * T
    return X64.T @ P


def _point(f, ref, X):
    """``(ms, % of X's read-once floor, relative error of f() against ref)``; ms is a median."""
    err = float((f().double() - ref).norm() / ref.norm())
    ms = bench_ms(f, warmup=5, rep=40)
    return ms, 100 * X.numel() * X.element_size() / H200_BANDWIDTH * 1e3 / ms, err


def _model(N, D, m, dtype, dev):
    c = launch.dense_config(N, D, m, dtype, launch.gpu_info(dev))
    return f"{c.mode} bn={c.block_n} w={c.num_warps} P={c.num_programs} prefetch={c.prefetch}"


def small_probe(dev, sms=None):
    """The m <= 4 kernel, prefetch off / on, at the model's other launch parameters."""
    rows = []
    for N, D, m in SMALL_SHAPES:
        X = torch.randn(N, D, device=dev)
        model = _model(N, D, m, X.dtype, dev)
        for icpt in (False, True):
            Y, V = torch.randn(D + icpt, m, device=dev), torch.rand(N, m, device=dev)
            Ps = torch.softmax(torch.randn(N, m, device=dev), 1)  # the multinomial Hessian's softmax form
            ref, ref_sm = _ref64(X, Y, V, icpt), _ref64(X, Y, Ps, icpt, "softmax")
            for pf, v_op in ((False, "mul"), (True, "mul"), (False, "softmax"), (True, "softmax")):
                VV, r = (V, ref) if v_op == "mul" else (Ps, ref_sm)
                ms, pct, err = _point(lambda: fusedml.mmchain(X, Y, VV, intercept=icpt, v_op=v_op, backend="fused",
                                                              config={"prefetch": pf}), r, X)
                rows.append({"shape": f"{N}x{D}", "m": m, "intercept": icpt, "prefetch": pf, "v_op": v_op,
                             "model": model, "ms": ms, "%floor": pct, "rel_err": err})
                print(f"{N}x{D} m={m} intercept={icpt} {v_op} prefetch={pf}: {ms:.4f} ms {pct:.1f} % "
                      f"err {err:.1e}  (model: {model})", flush=True)
            if D > 128 and icpt:  # the solvers' two-read form at rows > 128 values (matvec, then X^T p)
                def two():
                    t = fusedml.matvec(X, Y, intercept=True, backend="fused")
                    pt = Ps * t
                    return fusedml.mmchain(X, None, pt - Ps * pt.sum(1, keepdim=True), intercept=True, backend="fused")
                ms, pct, err = _point(two, ref_sm, X)
                rows.append({"shape": f"{N}x{D}", "m": m, "intercept": True, "v_op": "softmax two reads", "ms": ms,
                             "%floor": pct, "rel_err": err})
                print(f"{N}x{D} m={m} softmax as matvec + X^T p: {ms:.4f} ms err {err:.1e}", flush=True)
        X = None  # free the device memory
    return rows


def _launch_sweep(X, Y, V, ref, grid, label, **kw):
    """Rows of ``fusedml.mmchain(X, Y, V, **kw)`` at each launch override in ``grid`` (a launch
    that does not compile or fit is reported and skipped)."""
    rows = []
    for cfg in grid:
        try:
            ms, pct, err = _point(lambda: fusedml.mmchain(X, Y, V, backend="fused", config=cfg, **kw), ref, X)
        except Exception as e:  # noqa: BLE001 -- a launch that does not fit is reported
            print(label, cfg, "error", str(e)[:100])
            continue
        rows.append({"shape": label, "config": cfg, "ms": ms, "%floor": pct, "rel_err": err})
        print(f"{label} {cfg}: {ms:.4f} ms {pct:.1f} % err {err:.1e}", flush=True)
    return rows


def bf16_probe(dev, sms):
    """2M x 128 bf16, m = 1: tile rows x warps x programs per SM."""
    N, D = 2_000_000, 128
    X = torch.randn(N, D, device=dev).to(torch.bfloat16)
    y, v = torch.randn(D, device=dev), torch.rand(N, device=dev)
    ref = _ref64(X, y, v)
    grid = [{"prefetch": True, "block_n": bn, "num_warps": w, "num_programs": per * sms}
            for bn, w, per in ((32, 16, 3), (32, 16, 2), (16, 8, 4), (16, 8, 6), (32, 8, 4), (32, 8, 3), (64, 16, 2))]
    return _launch_sweep(X, y, v, ref, grid, f"{N}x{D} bf16")


def warps16_probe(dev, sms):
    """2-byte storage (bf16, fp16), m = 1, rows of 32-2048 values: the model's warps against half and
    double at the model's tile and grid, and half the warps at 1.5x the grid, interleaved twice
    (session 31: H200 sweeps since session 12 had 2M x 128 bf16 ~2 % faster at 8 warps than the
    model's 16)."""
    rows = []
    for N, D in ((8_000_000, 32), (2_000_000, 128), (500_000, 512), (125_000, 2048)):
        for dt in (torch.bfloat16, torch.float16):
            X = torch.randn(N, D, device=dev).to(dt)
            y, v = torch.randn(D, device=dev), torch.rand(N, device=dev)
            ref = _ref64(X, y, v)
            c = launch.dense_config(N, D, 1, dt, launch.gpu_info(dev))
            grid = [{}, {"num_warps": max(1, c.num_warps // 2)}, {"num_warps": min(32, 2 * c.num_warps)},
                    {"num_warps": max(1, c.num_warps // 2), "num_programs": c.num_programs * 3 // 2}]
            label = f"{N}x{D} {str(dt)[6:]} ({_model(N, D, 1, dt, dev)})"
            for r in (1, 2):
                for row in _launch_sweep(X, y, v, ref, grid, label):
                    rows.append(dict(row, round=r))
            X = None  # free the device memory
    return rows


def tiles_probe(dev, sms):
    """Tile rows x warps x programs around the model's picks: the m <= 4 kernel (2M x 128, m = 4; the
    solvers' 1M x 100, m = 3 with the intercept, mul and softmax) and bf16 2M x 128, m = 1."""
    rows = []
    for N, D, m, icpt, v_op, dt in TILES_CASES:
        X = torch.randn(N, D, device=dev).to(dt)
        Y, V = torch.randn(D + icpt, m, device=dev), torch.rand(N, m, device=dev)
        if v_op == "softmax":
            V = torch.softmax(torch.randn(N, m, device=dev), 1)
        if m > 1:
            tiles = [(bn, w, per) for bn, w in ((16, 8), (16, 16), (32, 16), (8, 8), (8, 4)) for per in (2, 4)]
        else:
            tiles = [(64, 16, 2), (64, 8, 4), (64, 8, 3), (128, 16, 1), (32, 16, 3), (128, 8, 2)]
        ref = _ref64(X, Y, V, icpt, v_op)
        label = f"{N}x{D} m={m} {str(dt)[6:]} icpt={icpt} {v_op}"
        sweep = _launch_sweep(X, Y, V, ref, [{"block_n": bn, "num_warps": w, "num_programs": per * sms}
                                             for bn, w, per in tiles], label, intercept=icpt, v_op=v_op)
        model = _model(N, D, m, dt, dev)
        rows += [dict(r, m=m, dtype=str(dt)[6:], intercept=icpt, v_op=v_op, model=model) for r in sweep]
        X = None  # free the device memory
    return rows


def grid_probe(dev, sms):
    """The m <= 4 kernel with its persistent grid capped to the compiled kernel's residency (one wave):
    tile elements per thread (4 / 8; X^T V also 16) x warps (4 / 8 / 16) x prefetch, over D, m, the intercept and v_op
    ("xtv": ``X^T V``, which the model sends to the padded ``tl.dot``; here forced to the unrolled kernel,
    as is m = 5..8, there with 8 columns)."""
    from fusedml.mmchain import dense

    rows = []
    for N, D, m, icpt, v_op in GRID_CASES:
        X = torch.randn(N, D, device=dev)
        Y, V = torch.randn(D + icpt, m, device=dev), torch.rand(N, m, device=dev)
        if v_op == "softmax":
            V = torch.softmax(torch.randn(N, m, device=dev), 1)
        xtv = v_op == "xtv"
        Y, v_op = (None, "mul") if xtv else (Y, v_op)
        ref = _ref64(X, Y, V, icpt, v_op)
        bd = launch._pow2_ceil(D)
        force = {"mode": "small", "m_pad": 4 if m <= 4 else 8} if xtv or m > 4 else {}
        label = f"{N}x{D} m={m} icpt={icpt} {'xtv' if xtv else v_op}"
        grid = [{**force, "block_n": ept * 32 * w // bd, "num_warps": w, "prefetch": pf, "num_programs": 64 * sms}
                for ept in ((4, 8, 16) if xtv else (4, 8)) for w in (4, 8, 16) if ept * 32 * w >= bd
                for pf in (False, True)]
        model = _model(N, D, m, X.dtype, dev)
        for r in _launch_sweep(X, Y, V, ref, grid, label, intercept=icpt, v_op=v_op):
            r.update(m=m, intercept=icpt, v_op="xtv" if xtv else v_op, model=model,
                     resident=list(dense._RESIDENT.values())[-1] if dense._RESIDENT else None)
            rows.append(r)
        # the model's own launch (its grid capped the same way) and the operator-level baseline
        for be in ("fused", "ops"):
            ms, pct, err = _point(lambda: fusedml.mmchain(X, Y, V, intercept=icpt, v_op=v_op, backend=be), ref, X)
            rows.append({"shape": label, "config": "model" if be == "fused" else "ops", "ms": ms, "%floor": pct,
                         "rel_err": err, "model": model})
            print(f"{label} {'MODEL ' + model if be == 'fused' else 'OPS'}: {ms:.4f} ms {pct:.1f} %", flush=True)
        X = None  # free the device memory
    return rows


DOT_CASES = ((2_000_000, 256, 5), (2_000_000, 256, 8), (1_000_000, 512, 5))


def dot_probe(dev, sms):
    """m = 5..8 on rows of more than 128 values: the padded ``tl.dot`` (tf32x3 / ieee) x tile rows x warps
    for ``matvec`` and the one-read ``mmchain`` (with the intercept), the unrolled kernel (m_pad 8) for
    the latter, and the operator-level baseline of each."""
    rows = []
    dots = [{"mode": "dot", "m_pad": 16, "dot_precision": p, "block_n": bn, "num_warps": w, "prefetch": False}
            for p in ("ieee", "tf32x3") for bn, w in ((16, 4), (32, 4), (32, 8), (64, 4), (64, 8))]
    for N, D, m in DOT_CASES:
        X = torch.randn(N, D, device=dev)
        Y, V = torch.randn(D + 1, m, device=dev), torch.rand(N, m, device=dev)
        X1 = torch.cat([X.double(), torch.ones(N, 1, dtype=torch.float64, device=dev)], 1)
        ref_t = X1 @ Y.double()
        ref_w = _ref64(X, Y, V, True)
        bd = launch._pow2_ceil(D)
        small = [{"mode": "small", "m_pad": 8, "block_n": ept * 32 * w // bd, "num_warps": w, "prefetch": pf,
                  "num_programs": 64 * sms} for ept, w in ((4, 8), (8, 8), (8, 4)) for pf in (False, True)]
        for op, ref, grid in (("matvec", ref_t, dots), ("mmchain", ref_w, dots + small)):
            def run(be, cfg):
                if op == "matvec":
                    return fusedml.matvec(X, Y, intercept=True, backend=be, config=cfg)
                return fusedml.mmchain(X, Y, V, intercept=True, backend=be, config=cfg)
            for cfg in grid + [None, "ops"]:
                be, c = ("ops", None) if cfg == "ops" else ("fused", cfg)
                try:
                    ms, pct, err = _point(lambda: run(be, c), ref, X)
                except Exception as e:  # noqa: BLE001 -- a launch that does not fit is reported
                    print(N, D, m, op, cfg, "error", str(e)[:100])
                    continue
                label = f"{N}x{D} m={m} {op}"
                rows.append({"shape": label, "config": cfg or "model", "ms": ms, "%floor": pct, "rel_err": err})
                print(f"{label} {cfg or 'MODEL'}: {ms:.4f} ms {pct:.1f} % err {err:.1e}", flush=True)
        X = X1 = None  # free the device memory
    return rows


SOFTMAX_CASES = ((2_000_000, 256, 5), (2_000_000, 256, 3), (1_000_000, 100, 5))


def softmax_probe(dev, sms):
    """The multinomial Hessian product ``[X,1]^T (P ⊙ (T - rowsum(P ⊙ T)))``, T = [X,1] S: one read
    (``mmchain(v_op="softmax")`` at the model's launch), two reads (``matvec``, then ``X^T p``: what
    the solvers take where the one read is not known to be faster), and ops."""
    rows = []
    for N, D, m in SOFTMAX_CASES:
        X = torch.randn(N, D, device=dev)
        S = torch.randn(D + 1, m, device=dev)
        Pm = torch.softmax(torch.randn(N, m, device=dev), 1)
        ref = _ref64(X, S, Pm, True, "softmax")

        def two(be="fused"):
            t = fusedml.matvec(X, S, intercept=True, backend=be)
            pt = Pm * t
            return fusedml.mmchain(X, None, pt - Pm * pt.sum(1, keepdim=True), intercept=True, backend=be)

        forms = {"one read": lambda: fusedml.mmchain(X, S, Pm, intercept=True, v_op="softmax", backend="fused"),
                 "two reads": two, "ops": lambda: two("ops")}
        for name, f in forms.items():
            ms, pct, err = _point(f, ref, X)
            rows.append({"shape": f"{N}x{D}", "m": m, "form": name, "ms": ms, "%floor": pct, "rel_err": err,
                         "model": _model(N, D, m, X.dtype, dev)})
            print(f"{N}x{D} m={m} softmax Hessian, {name}: {ms:.4f} ms {pct:.1f} % err {err:.1e}", flush=True)
        X = None  # free the device memory
    return rows


def coop_probe(dev, sms, shapes):
    """The cooperative kernel on ``shapes`` ("N,D"): column block x warps x rows held ahead."""
    rows = []
    for shape in shapes:
        N, D = map(int, shape.split(","))
        X = torch.randn(N, D, device=dev)
        y, v = torch.randn(D, device=dev), torch.rand(N, device=dev)
        ref = _ref64(X, y, v)
        grid = [{"strategy": "coop", "block_n": 1, "block_d": bd, "num_warps": w, "num_programs": 32 * sms,
                 "prefetch": ahead}
                for bd in (512, 1024, 2048, 4096) for w in (1, 2, 4, 8) if 4 <= bd // (32 * w) <= 32
                for ahead in (0, 1, 2)]
        sweep = _launch_sweep(X, y, v, ref, grid, shape)
        rows += sweep
        print("BEST", shape, min(sweep, key=lambda r: r["ms"]))
        X = None  # free the device memory
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", choices=["coop", "small", "bf16", "warps16", "tiles", "grid", "dot", "softmax"], default="coop")
    ap.add_argument("--shape", action="append", default=None, help="coop: N,D (repeatable; default 4096,65536)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    sms = launch.gpu_info(dev).sm_count
    if a.probe == "coop":
        rows = coop_probe(dev, sms, a.shape or ["4096,65536"])
    else:
        rows = {"small": small_probe, "bf16": bf16_probe, "warps16": warps16_probe, "tiles": tiles_probe, "grid": grid_probe,
                  "dot": dot_probe, "softmax": softmax_probe}[a.probe](dev, sms)
    print("saved", write_json(f"launch_probe_{a.probe}", rows, out=a.out))
    return rows


if __name__ == "__main__":
    main()
