"""Probe: the tensor-core diag single sweep (``fusedml/gmm/mma.py``) against the register form.

First a correctness check on the GPU (fresh random problems of odd shapes, sample weights and
per-row log-likelihoods, against the float64 operator-level E-step), then, per shape, the model's
plan (the register form) and the mma kernel over warps, row groups per warp and programs per SM,
side by side in one run (``do_bench`` medians), with each one's error against float64.

    python benchmarks/gmm_mma_probe.py [--shapes 4194304x16x16,...] [--out PATH]

``--fit NxDxK[,...]``: whole ``GaussianMixture`` fits (diag, the end-to-end benchmark's settings, and
20 EM iterations at ``tol=0``) with ``"auto"`` taking the tensor-core form from any row count or
never (``model.MMA_MIN_ROWS``), interleaved on the same data: the row threshold's evidence.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import fusedml  # noqa: E402
from bench_gmm import BW, make_problem, rel  # noqa: E402
from fusedml.gmm import fused  # noqa: E402
from fusedml.gmm._prep import validate  # noqa: E402
from fusedml.gmm.fused import _operands, estep_fused  # noqa: E402
from fusedml.gmm.mma import TILE_WORDS, _diag_mma_kernel  # noqa: E402
from fusedml.gmm.model import gpu_info, plan_launch  # noqa: E402
from fusedml.gmm.ops import estep_ops  # noqa: E402


def run_mma(prep, ops, P, WN, R):
    """One E-step with the mma kernel on P programs: ``(ll, nk, s1, s2)``."""
    X, N, D, K = prep.X, prep.N, prep.D, prep.K
    dev = X.device
    n_blocks = -(-N // (8 * WN * R))
    P = max(1, min(P, n_blocks))
    scr, pnk, ps1, ps2, pll = fused._partials(dev, [P * TILE_WORDS.value, P * K, P * K * D, P * K * D], P)
    off32 = fused.offsets_fit_int32(X, n_blocks * 8 * WN * R, 16)
    _diag_mma_kernel[(P,)](X, X.stride(0), ops["G"], ops["W1"], ops["W2"], ops["CONST"], scr, pnk, ps1, ps2, pll,
                           N, D, K, n_blocks, pll, pll, WN=WN, R=R, OFF32=off32, num_warps=WN)
    return fused._diag_finish(prep, ops, pnk, ps1, ps2, pll)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def fits(dev, N, D, K, repeat):
    """Interleaved GaussianMixture fits with the tensor-core E-step forced on and off (``"auto"``'s
    row threshold set to 0 / never): wall time medians, iterations, lower bound."""
    import statistics
    import time

    from algorithms import GaussianMixture
    from algorithms._base import ConvergenceWarning
    from datasets.synthetic import make_gmm
    from fusedml.gmm import model

    X = make_gmm(N, D, K, seed=0, device=dev, return_torch=True).X
    rows = []
    for label, params in (("e2e", dict(max_iter=100, tol=1e-3)), ("20 iter", dict(max_iter=20, tol=0.0))):
        times = {"mma": [], "fp32": []}
        info = {}
        for rep in range(repeat + 1):  # the first round warms up (compiles, plans)
            for form, thr in (("mma", 0), ("fp32", 1 << 62)):
                saved, model.MMA_MIN_ROWS = model.MMA_MIN_ROWS, thr
                try:
                    gm = GaussianMixture(K, covariance_type="diag", reg_covar=1e-6, random_state=0, **params)
                    _sync(dev)
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():  # the fixed 20 iterations do not converge
                        warnings.simplefilter("ignore", ConvergenceWarning)
                        gm.fit(X)
                    _sync(dev)
                    dt = time.perf_counter() - t0
                finally:
                    model.MMA_MIN_ROWS = saved
                if rep:
                    times[form].append(dt * 1e3)
                info[form] = (gm.n_iter_, float(gm.lower_bound_))
        for form, ts in times.items():
            rows.append(dict(case="fit", N=N, D=D, K=K, fit=label, form=form, ms_median=statistics.median(ts),
                             ms_min=min(ts), ms_all=[round(t, 2) for t in ts], n_iter=info[form][0],
                             lower_bound=info[form][1]))
    return rows


def errors(res, ref):
    names = ("ll", "nk", "s1", "s2")
    return {f"err_{n}": rel(a, b) for n, a, b in zip(names, res, ref) if a is not None and b is not None}


#: the odd shapes checked on the GPU (``--check-shapes``)
CHECK_SHAPES = "37x7x5,1000x16x16,4099x13x11,777x16x3,20000x1x16,65537x16x16,300001x9x9"


def check(dev, seed, shapes=CHECK_SHAPES):
    """Odd shapes (``NxDxK,...``) on the GPU against float64: the fragment plumbing on the hardware."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for N, D, K in _common.shape_list(shapes):
        X, w, mu, pc = make_problem(N, D, K, "diag", dev, seed=int(torch.randint(0, 1 << 30, (1,), generator=g)))
        prep = validate(X, w, mu, pc, "diag", check_finite=False)
        ops = _operands(prep)
        ref = estep_ops(validate(X.double(), w, mu, pc, "diag", check_finite=False), False)[1:]
        for WN, R in ((4, 1), (2, 2), (8, 1)):
            res = run_mma(prep, ops, 3, WN, R)
            row = {"case": "check", "N": N, "D": D, "K": K, "WN": WN, "R": R, **errors(res, ref)}
            row["ok"] = all(v <= 1e-4 for k, v in row.items() if k.startswith("err_"))
            rows.append(row)
        # the public call (precision="tf32x3": this kernel where it applies), and with sample weights and the
        # per-row log-likelihoods (the same kernel since session 33)
        for sw in (None, (torch.rand(N, generator=g) + 0.5).to(dev)):
            lp = sw is not None
            st = fusedml.gmm_estep(X, w, mu, pc, "diag", sample_weight=sw, precision="tf32x3", backend="fused",
                                   return_log_prob=lp)
            rs = estep_ops(validate(X.double(), w, mu, pc, "diag", sample_weight=sw, check_finite=False), lp)
            row = {"case": "check", "N": N, "D": D, "K": K, "WN": "public", "R": "sw, log_prob" if lp else "",
                   **errors((st.log_likelihood, st.nk, st.s1, st.s2), rs[1:])}
            if lp:
                row["err_log_prob"] = rel(st.log_prob, rs[0])
            row["ok"] = all(v <= 1e-4 for k, v in row.items() if k.startswith("err_"))
            rows.append(row)
    return rows


def probe(dev, N, D, K, sm):
    X, w, mu, pc = make_problem(N, D, K, "diag", dev)
    prep = validate(X, w, mu, pc, "diag", check_finite=False)
    ops = _operands(prep)
    prep64 = validate(X.double(), w, mu, pc, "diag", check_finite=False)
    ref = tuple(estep_ops(prep64, False)[1:])
    del prep64
    floor = N * D * 4 / BW * 1e3
    plan = plan_launch(N, K, D, "diag", X.dtype, dev, precision="fp32")
    base = dict(N=N, D=D, K=K, floor_ms=floor)
    plan_tc = plan_launch(N, K, D, "diag", X.dtype, dev, precision="tf32x3")
    rows = [dict(base, variant=f"model ({plan.form}, BN {plan.BN}, {plan.num_warps} warps)",
                 ms=_common.bench_ms(lambda: estep_fused(prep, False, precision="fp32", plan=plan, ops=ops)),
                 **errors(tuple(estep_fused(prep, False, precision="fp32", plan=plan, ops=ops)[1:]), ref))]
    rows.append(dict(base, variant=f"tf32x3 model ({plan_tc.form})",
                     ms=_common.bench_ms(lambda: estep_fused(prep, False, precision="tf32x3", plan=plan_tc, ops=ops)),
                     **errors(tuple(estep_fused(prep, False, precision="tf32x3", plan=plan_tc, ops=ops)[1:]), ref)))
    # with row weights and the per-row log-likelihoods: both forms (the mma form's since session 33)
    sw = torch.rand(N, device=dev) + 0.5
    prep_w = validate(X, w, mu, pc, "diag", sample_weight=sw, check_finite=False)
    prep64 = validate(X.double(), w, mu, pc, "diag", sample_weight=sw, check_finite=False)
    ref_w = tuple(estep_ops(prep64, False)[1:])
    del prep64
    for name, prec, pl in (("model", "fp32", plan), ("tf32x3 model", "tf32x3", plan_tc)):
        rows.append(dict(base, variant=f"{name} ({pl.form}), sample weights + log_prob",
                         ms=_common.bench_ms(lambda: estep_fused(prep_w, True, precision=prec, plan=pl, ops=ops)),
                         **errors(tuple(estep_fused(prep_w, True, precision=prec, plan=pl, ops=ops)[1:]), ref_w)))
    for WN, R, per_sm in ((4, 1, 3), (4, 1, 4), (4, 1, 5), (8, 1, 2), (2, 1, 8), (2, 1, 10)):
        P = sm * per_sm
        try:
            ms = _common.bench_ms(lambda: run_mma(prep, ops, P, WN, R))
            err = errors(run_mma(prep, ops, P, WN, R), ref)
        except Exception as e:  # noqa: BLE001 (a probe: record and go on)
            rows.append(dict(base, variant=f"mma WN {WN} R {R} P {per_sm}/SM", error=repr(e)[:200]))
            continue
        rows.append(dict(base, variant=f"mma WN {WN} R {R} P {per_sm}/SM", ms=ms, **err))
    best = min(r["ms"] for r in rows[1:] if "ms" in r and "weights" not in r["variant"])
    for r in rows:
        if "ms" in r:
            r["pct_floor"] = 100 * floor / r["ms"]
            r["model_over_this"] = rows[0]["ms"] / r["ms"]
    rows[0]["best_mma_ms"] = best
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-shapes", default=CHECK_SHAPES)
    ap.add_argument("--shapes", default="4194304x16x16,1048576x16x16,4194304x12x16,16777216x16x16,4194304x16x12")
    ap.add_argument("--seed", type=int, default=None, help="check-problem seed (default: random)")
    ap.add_argument("--fit", default="", help="NxDxK[,...]: GaussianMixture fits with the form on / off")
    ap.add_argument("--fit-repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    sm = gpu_info(dev)["sm_count"]
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rows = check(dev, seed, args.check_shapes)
    print(_common.markdown_table(rows, ["N", "D", "K", "WN", "R", "err_ll", "err_nk", "err_s1",
                                        "err_s2", "err_log_prob", "ok"]))
    path = _common.write_json("gmm_mma_probe", rows, {"check_seed": seed}, out=args.out)
    for N, D, K in _common.shape_list(args.shapes):
        rows += probe(dev, N, D, K, sm)
        torch.cuda.empty_cache()  # the probe's tensors are gone with its frame
        path = _common.write_json("gmm_mma_probe", rows, {"check_seed": seed}, out=args.out)
    for N, D, K in _common.shape_list(args.fit):
        rows += fits(dev, N, D, K, args.fit_repeat)
        path = _common.write_json("gmm_mma_probe", rows, {"check_seed": seed}, out=args.out)
    print(_common.markdown_table([r for r in rows if r.get("case") == "fit"],
                                 ["N", "D", "K", "fit", "form", "ms_median", "ms_min", "n_iter", "lower_bound"]))
    print(_common.markdown_table([r for r in rows if r.get("case") not in ("check", "fit")],
                                 ["N", "D", "K", "variant", "ms", "pct_floor", "model_over_this", "err_nk", "err_s1",
                                  "err_s2", "err_ll", "error"]))
    print("wrote", path)
    return rows


if __name__ == "__main__":
    main()
