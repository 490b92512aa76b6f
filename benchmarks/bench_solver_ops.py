"""The X passes of the linear-model solvers, fused against the operator-level baseline.

A Newton (TRON) or L-BFGS iteration of LogisticRegression, LinearSVC and the GLMs touches X in
two kinds of pass (see ``algorithms/_solvers.py``):

* the objective-and-gradient evaluation: ``eta = [X,1] w``, the loss, the Hessian weights and
  ``X^T l'(eta) + l2 w`` -- ``fusedml.loss_gradient``: ONE read of X fused; the "ops" backend
  composes it from a GEMV, torch pointwise ops and a transposed GEMV (two reads);
* one Hessian product per CG step: ``X^T (h * ([X,1] s)) + l2 s`` -- ``fusedml.mmchain``: one
  read fused, two on "ops".

Plus, for reference, the single-read building blocks ``matvec`` and ``X^T v``. Every case runs at
the end-to-end benchmark's dense shapes (fp32, with the intercept column), times fused and ops
side by side (``do_bench`` median), reports ms, GB/s, % of the read-once floor (``bytes(X) /
4.28 TB/s``) and the speedup, and checks the fused result against float64 on fresh inputs.
``--sweep`` also times launch configurations around the model's pick (each compiles once).

    python benchmarks/bench_solver_ops.py [--shapes 1000000x100 ...] [--sweep] [--out FILE]

Without CUDA it runs tiny shapes under ``TRITON_INTERPRET=1`` (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fusedml  # noqa: E402
from fusedml.mmchain import launch  # noqa: E402
from _common import H200_BANDWIDTH, bench_ms, device, markdown_table, write_json  # noqa: E402

L2 = 1e-3


def make_case(N, D, m, dev, seed):
    """X [N, D] fp32 N(0,1), coefficients, targets and weights for the passes (fresh per seed)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    X = torch.randn(N, D, generator=g, device=dev)
    w = 0.1 * torch.randn(D + 1, m, generator=g, device=dev)
    if m == 1:
        y = (torch.rand(N, 1, generator=g, device=dev) < 0.5).float()
    else:
        y = torch.nn.functional.one_hot(torch.randint(0, m, (N,), generator=g, device=dev), m).float()
    h = torch.rand(N, m, generator=g, device=dev)
    return X, w, y, h


def passes(X, w, y, h, m):
    """name -> (callable(backend, config), float64 reference callable)."""
    loss = "logistic" if m == 1 else "multinomial"
    sq = (lambda a: a[:, 0]) if m == 1 else (lambda a: a)
    ws, ys, hs = sq(w), sq(y), sq(h)

    def X64():
        return torch.cat([X.double(), torch.ones(X.shape[0], 1, dtype=torch.float64, device=X.device)], 1)

    def ref_lossgrad():
        from fusedml.mmchain.lossgrad import loss_terms

        A = X64()
        eta = A @ w.double()
        _, gr, _ = loss_terms(loss, eta, y.double())
        return sq(A.T @ gr + L2 * w.double())

    def ref_hess():
        A = X64()
        return sq(A.T @ (h.double() * (A @ w.double())) + L2 * w.double())

    def ref_softmax():
        A = X64()
        T = A @ w.double()
        return A.T @ (h.double() * (T - (h.double() * T).sum(1, keepdim=True))) + L2 * w.double()

    def ref_matvec():
        return sq(X64() @ w.double())

    def ref_xtv():
        return sq(X64().T @ h.double() + L2 * w.double())

    out = {
        f"loss+grad ({loss})": (lambda be, cfg: fusedml.loss_gradient(
            X, ws, ys, loss=loss, z=ws, beta=L2, intercept=True, backend=be, config=cfg).grad, ref_lossgrad),
        "hessian X^T(h*(Xs))": (lambda be, cfg: fusedml.mmchain(
            X, ws, v=hs, z=ws, beta=L2, intercept=True, backend=be, config=cfg), ref_hess),
        "matvec [X,1]s": (lambda be, cfg: fusedml.matvec(X, ws, intercept=True, backend=be, config=cfg), ref_matvec),
        "X^T v": (lambda be, cfg: fusedml.mmchain(
            X, None, v=hs, z=ws, beta=L2, intercept=True, backend=be, config=cfg), ref_xtv),
    }
    if m > 1:  # the multinomial Hessian product (the solvers' form for m > 1)
        out["hessian softmax"] = (lambda be, cfg: fusedml.mmchain(
            X, w, v=h, z=w, beta=L2, intercept=True, v_op="softmax", backend=be, config=cfg), ref_softmax)
    return out


def sweep_points(X, m, quick, only_precision=False):
    """Launch configurations around the model's pick (block_n, warps, programs, prefetch), and for
    m > 1 the padded ``tl.dot``'s two precisions (``only_precision``: the model and those alone)."""
    base = launch.dense_config(X.shape[0], X.shape[1], m, X.dtype, launch.gpu_info(X.device),
                               stride_xn=X.stride(0), stride_xd=X.stride(1))
    pts = [None]
    if only_precision:
        return pts + _precision_points(base)
    for f in (0.5, 2):
        if base.block_n * f >= (16 if base.mode == "dot" else 1):
            pts.append({"block_n": int(base.block_n * f)})
        if 2 <= base.num_warps * f <= 16:
            pts.append({"num_warps": int(base.num_warps * f)})
        pts.append({"num_programs": int(base.num_programs * f)})
    pts.append({"block_n": 2 * base.block_n, "num_warps": 2 * base.num_warps} if base.num_warps <= 8 else
               {"block_n": base.block_n // 2, "num_warps": base.num_warps // 2})
    # the other side of the register double buffer, with the neighbouring tile shapes and grids
    pf = {"prefetch": not base.prefetch}
    pts += [pf, dict(pf, block_n=2 * base.block_n), dict(pf, num_programs=2 * base.num_programs)]
    pts += [dict(pf, num_warps=int(base.num_warps * f)) for f in (0.5, 2) if 2 <= base.num_warps * f <= 16]
    pts += _precision_points(base)
    return pts[:2] if quick else pts


def _precision_points(base):
    pts = []
    if base.mode == "small":  # the padded tl.dot on the tensor cores (tf32x3) and with fp32 FMAs
        dot = {"mode": "dot", "m_pad": 16, "block_n": 64, "num_warps": 4, "prefetch": False}
        pts += [dot, dict(dot, dot_precision="ieee"), dict(dot, block_n=16), dict(dot, block_n=32, num_warps=8)]
        # the unrolled kernel's tiles: (warps, values of X per thread); the persistent grid follows
        # from the compiled kernel's registers (one wave), so fewer warps per program can mean more
        # programs per SM
        for w, e in ((4, 8), (4, 16), (2, 8), (8, 4), (8, 16), (16, 4)):
            pts.append({"num_warps": w, "block_n": max(1, e * 32 * w // base.block_d), "prefetch": True})
    if base.mode in ("small", "dot"):  # the loss pass and the matvec run "dot": its FMA form
        pts += [{"dot_precision": "ieee"}, {"dot_precision": "ieee", "block_n": 32},
                {"block_n": 16, "num_warps": 4}, {"block_n": 32, "num_warps": 8}, {"block_n": 32, "num_warps": 4},
                {"block_n": 64, "num_warps": 8}]
    return pts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=None, help="NxD or NxDxM (M classes; default the e2e shapes)")
    ap.add_argument("--sweep", action="store_true", help="also time launch configurations around the model")
    ap.add_argument("--sweep-precision", action="store_true",
                    help="sweep only the model's pick and the m > 1 tl.dot precisions / modes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = device()
    quick = dev.type != "cuda"
    shapes = args.shapes or (["1000000x100", "2000000x256", "4000000x64", "1000000x100x3"] if not quick
                             else ["300x10", "200x20x3"])
    rows = []
    t0 = time.time()
    for spec in shapes:
        parts = [int(s) for s in spec.lower().split("x")]
        N, D, m = parts[0], parts[1], (parts[2] if len(parts) > 2 else 1)
        X, w, y, h = make_case(N, D, m, dev, seed=len(rows) + 1)
        floor = 1e3 * X.numel() * X.element_size() / H200_BANDWIDTH
        for name, (fn, ref) in passes(X, w, y, h, m).items():
            r64 = ref()
            out = fn("fused", None)
            err = float((out.double() - r64).abs().max() / r64.abs().max())
            f_ms = bench_ms(lambda: fn("fused", None))
            o_ms = bench_ms(lambda: fn("ops", None))
            row = {"shape": f"{N}x{D}", "m": m, "pass": name, "floor_ms": floor, "fused_ms": f_ms,
                   "GB/s": X.numel() * 4 / f_ms / 1e6, "%floor": 100 * floor / f_ms, "ops_ms": o_ms,
                   "speedup": o_ms / f_ms, "rel_err": err}
            if args.sweep or args.sweep_precision:
                pts = []
                for cfg in sweep_points(X, m, quick, args.sweep_precision):
                    try:
                        pts.append((bench_ms(lambda: fn("fused", cfg)), "model" if cfg is None else str(cfg)))
                    except Exception as e:  # an invalid point for this pass: recorded, not fatal
                        pts.append((None, f"{cfg}: {type(e).__name__}"))
                ok = [p for p in pts if p[0] is not None]
                best = min(ok) if ok else (None, None)
                row.update(sweep=pts, best_ms=best[0], best=best[1],
                           best_pct_floor=None if best[0] is None else 100 * floor / best[0])
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "sweep"},
                  flush=True)
        del X, w, y, h
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    path = write_json("solver_ops", rows, {"args": vars(args), "wall_s": time.time() - t0}, args.out)
    print(f"\nwrote {path}\n")
    print(markdown_table(rows, ["shape", "m", "pass", "floor_ms", "fused_ms", "%floor", "ops_ms", "speedup",
                                "rel_err", "best_ms", "best"]))
    return rows


if __name__ == "__main__":
    main()
