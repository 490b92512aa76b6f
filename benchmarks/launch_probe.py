"""Launch probes of the dense mmchain kernels, one question each.

    python benchmarks/launch_probe.py --probe coop --shape 4096,65536 --out results/coop_sweep.json
    python benchmarks/launch_probe.py --probe small --out results/small_prefetch.json

``coop``: the cooperative wide-row kernel (m = 1) over column block x warps x rows held ahead
(``num_programs`` is an upper bound: the launcher caps the grid to the compiled kernel's
residency). ``small``: the unrolled m <= 4 kernel with and without its register prefetch, on the
shapes where the two measured opposite (2M x 128, m = 4 and the solvers' 1M x 100, m = 3 with
the intercept), crossed over D, m and the intercept. Each point: ``fusedml.mmchain`` timed with
``triton.testing.do_bench`` (median) and checked against float64; one line per point.
``bf16``: 2M x 128 bf16 storage, m = 1, one or two tiles prefetched in registers. ``tiles``:
tile rows x warps x programs around the model's picks (m <= 4 and bf16).
"""
import argparse
import json

import torch
import triton

import fusedml
from fusedml.mmchain import launch


SMALL_SHAPES = ((2_000_000, 128, 4), (1_000_000, 100, 3), (2_000_000, 100, 4), (1_000_000, 128, 3), (2_000_000, 256, 3))


def small_probe(dev, sms=None):
    """The m <= 4 kernel, prefetch off / on, at the model's other launch parameters."""
    rows = []
    for N, D, m in SMALL_SHAPES:
        X = torch.randn(N, D, device=dev)
        X64 = X.double()
        for icpt in (False, True):
            Dx = D + icpt
            Y, V = torch.randn(Dx, m, device=dev), torch.rand(N, m, device=dev)
            Xi = torch.cat([X64, torch.ones(N, 1, dtype=X64.dtype, device=dev)], 1) if icpt else X64
            ref = Xi.T @ (V.double() * (Xi @ Y.double()))
            base = launch.dense_config(N, D, m, X.dtype, launch.gpu_info(dev))
            Ps = torch.softmax(torch.randn(N, m, device=dev), 1)  # the multinomial Hessian's softmax form
            T = Xi @ Y.double()
            Pt = Ps.double() * T
            ref_sm = Xi.T @ (Pt - Ps.double() * Pt.sum(1, keepdim=True))
            for pf, v_op in ((False, "mul"), (True, "mul"), (False, "softmax"), (True, "softmax")):
                cfg = {"prefetch": pf}
                VV, r = (V, ref) if v_op == "mul" else (Ps, ref_sm)
                f = lambda: fusedml.mmchain(X, Y, VV, intercept=icpt, v_op=v_op, backend="fused", config=cfg)  # noqa: E731
                err = float((f().double() - r).norm() / r.norm())
                ms = triton.testing.do_bench(f, warmup=5, rep=40)
                floor = X.numel() * 4 / 4.28e12 * 1e3
                rows.append({"shape": f"{N}x{D}", "m": m, "intercept": icpt, "prefetch": pf, "v_op": v_op,
                             "model": f"{base.mode} bn={base.block_n} w={base.num_warps} P={base.num_programs} "
                                      f"prefetch={base.prefetch}", "ms": ms, "%floor": 100 * floor / ms, "rel_err": err})
                print(f"{N}x{D} m={m} intercept={icpt} {v_op} prefetch={pf}: {ms:.4f} ms {100 * floor / ms:.1f} % "
                      f"err {err:.1e}  (model: {rows[-1]['model']})", flush=True)
            if D > 128 and icpt:  # the solvers' two-read form at rows > 128 values (matvec, then X^T p)
                def two():
                    t = fusedml.matvec(X, Y, intercept=True, backend="fused")
                    pt = Ps * t
                    return fusedml.mmchain(X, None, pt - Ps * pt.sum(1, keepdim=True), intercept=True, backend="fused")
                ms = triton.testing.do_bench(two, warmup=5, rep=40)
                err = float((two().double() - ref_sm).norm() / ref_sm.norm())
                rows.append({"shape": f"{N}x{D}", "m": m, "intercept": True, "v_op": "softmax two reads", "ms": ms,
                             "rel_err": err})
                print(f"{N}x{D} m={m} softmax as matvec + X^T p: {ms:.4f} ms err {err:.1e}", flush=True)
        del X, X64, Xi
    return rows


def bf16_probe(dev, sms):
    """2M x 128 bf16, m = 1: one or two tiles prefetched, over tile rows x warps x programs per SM."""
    rows = []
    N, D = 2_000_000, 128
    X = torch.randn(N, D, device=dev).to(torch.bfloat16)
    y, v = torch.randn(D, device=dev), torch.rand(N, device=dev)
    ref = X.double().T @ (v.double() * (X.double() @ y.double()))
    floor = X.numel() * 2 / 4.28e12 * 1e3
    for depth in (1, 2):
        for bn, w, per_sm in ((32, 16, 3), (32, 16, 2), (16, 8, 4), (16, 8, 6), (32, 8, 4), (32, 8, 3), (64, 16, 2)):
            cfg = {"prefetch": depth, "block_n": bn, "num_warps": w, "num_programs": per_sm * sms}
            f = lambda: fusedml.mmchain(X, y, v, backend="fused", config=cfg)  # noqa: E731
            err = float((f().double() - ref).norm() / ref.norm())
            ms = triton.testing.do_bench(f, warmup=5, rep=40)
            rows.append({"shape": f"{N}x{D} bf16", "config": cfg, "ms": ms, "%floor": 100 * floor / ms, "rel_err": err})
            print(f"bf16 {N}x{D} prefetch={depth} bn={bn} w={w} {per_sm}/SM: {ms:.4f} ms {100 * floor / ms:.1f} % "
                  f"err {err:.1e}", flush=True)
    return rows


TILES_CASES = [(2_000_000, 128, 4, False, "mul", torch.float32), (1_000_000, 100, 3, True, "mul", torch.float32),
               (1_000_000, 100, 3, True, "softmax", torch.float32), (2_000_000, 128, 1, False, "mul", torch.bfloat16)]


def tiles_probe(dev, sms):
    """Tile rows x warps x programs around the model's picks: the m <= 4 kernel (2M x 128, m = 4; the
    solvers' 1M x 100, m = 3 with the intercept, mul and softmax) and bf16 2M x 128, m = 1."""
    rows = []
    for N, D, m, icpt, v_op, dt in TILES_CASES:
        X = torch.randn(N, D, device=dev).to(dt)
        Dx = D + icpt
        Y, V = torch.randn(Dx, m, device=dev), torch.rand(N, m, device=dev)
        if v_op == "softmax":
            V = torch.softmax(torch.randn(N, m, device=dev), 1)
        floor = X.numel() * X.element_size() / 4.28e12 * 1e3
        base = launch.dense_config(N, D, m, dt, launch.gpu_info(dev))
        if m > 1:
            grid = [(bn, w, per) for bn, w in ((16, 8), (16, 16), (32, 16), (8, 8), (8, 4)) for per in (2, 4)]
        else:
            grid = [(64, 16, 2), (64, 8, 4), (64, 8, 3), (128, 16, 1), (32, 16, 3), (128, 8, 2)]
        ref = fusedml.mmchain(X, Y, V, intercept=icpt, v_op=v_op, backend="ops").double()
        for bn, w, per in grid:
            cfg = {"block_n": bn, "num_warps": w, "num_programs": per * sms}
            f = lambda: fusedml.mmchain(X, Y, V, intercept=icpt, v_op=v_op, backend="fused", config=cfg)  # noqa: E731
            try:
                err = float((f().double() - ref).norm() / ref.norm())
                ms = triton.testing.do_bench(f, warmup=5, rep=40)
            except Exception as e:  # noqa: BLE001 -- a launch that does not fit is reported
                print(N, D, m, cfg, "error", str(e)[:80])
                continue
            rows.append({"shape": f"{N}x{D}", "m": m, "dtype": str(dt)[6:], "intercept": icpt, "v_op": v_op,
                         "config": cfg, "model": f"bn={base.block_n} w={base.num_warps} P={base.num_programs}",
                         "ms": ms, "%floor": 100 * floor / ms, "rel_err_vs_ops": err})
            print(f"{N}x{D} m={m} {str(dt)[6:]} icpt={icpt} {v_op} bn={bn} w={w} {per}/SM: {ms:.4f} ms "
                  f"{100 * floor / ms:.1f} % (model {rows[-1]['model']})", flush=True)
        del X
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", choices=["coop", "small", "bf16", "tiles"], default="coop")
    ap.add_argument("--shape", action="append", default=None, help="coop: N,D (repeatable; default 4096,65536)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    sms = launch.gpu_info(dev).sm_count
    rows = {"small": small_probe, "bf16": bf16_probe, "tiles": tiles_probe}.get(a.probe, lambda d, s: [])(dev, sms) \
        if a.probe != "coop" else []
    for shape in (a.shape or ["4096,65536"]) if a.probe == "coop" else []:
        N, D = map(int, shape.split(","))
        X = torch.randn(N, D, device=dev)
        y, v = torch.randn(D, device=dev), torch.rand(N, device=dev)
        floor = X.numel() * 4 / 4.28e12 * 1e3
        ref = (X.double().T @ (v.double() * (X.double() @ y.double())))
        for bd in (512, 1024, 2048, 4096):
            for w in (1, 2, 4, 8):
                if bd // (32 * w) < 4 or bd // (32 * w) > 32:
                    continue
                for per_sm, ahead in ((32, 0), (32, 1), (32, 2)):
                    cfg = {"strategy": "coop", "block_n": 1, "block_d": bd, "num_warps": w,
                           "num_programs": per_sm * sms, "prefetch": ahead}
                    f = lambda: fusedml.mmchain(X, y, v, backend="fused", config=cfg)  # noqa: E731
                    try:
                        err = float((f().double() - ref).norm() / ref.norm())
                        ms = triton.testing.do_bench(f, warmup=5, rep=30)
                    except Exception as e:  # noqa: BLE001 -- a point that does not compile is reported
                        print(shape, cfg, "error", str(e)[:100])
                        continue
                    rows.append({"shape": shape, "config": cfg, "ms": ms, "%floor": 100 * floor / ms, "rel_err": err})
                    print(f"{shape} bd={bd} w={w} P<={per_sm}/SM rows ahead={ahead + 1}: {ms:.4f} ms "
                          f"{100 * floor / ms:.1f} % err {err:.1e}", flush=True)
        best = min((r for r in rows if r["shape"] == shape and "config" in r), key=lambda r: r["ms"])
        print("BEST", shape, best)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
