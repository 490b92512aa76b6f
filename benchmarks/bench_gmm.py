"""Benchmark of the fused GMM E-step (fusedml.gmm_estep) against the operator-level torch E-step.

For each configuration: ms per E-step data pass (do_bench median of the launch + float64 partial
reduction, parameters prepared once), % of the read-once floor bytes(X) / 4.28e12, achieved
TFLOP/s (useful flops: distances + statistics), the path the model picks, the speed-up over "ops"
(torch GEMMs + logsumexp + N x K responsibilities), the single-sweep speed-up over the forced
two-pass path (for every single-sweep shape), the ``tl.dot`` plan's time where the register form
runs (``ms_tl_dot``), and the relative error of N_k, S1, S2 and the log-likelihood against a
float64 E-step on the same data. Also the public ``gmm_estep`` call time (validation included).

Usage::

    python benchmarks/bench_gmm.py                 # 7 configurations incl. the 4 targets (< 45 s on an H200)
    python benchmarks/bench_gmm.py --full          # all 29 configurations (a few minutes)
    python benchmarks/bench_gmm.py --configs 1,2,0,3,16,17,18,19,4,5,6,7   # the README's table (session 19)
    python benchmarks/bench_gmm.py --precision tf32
    python benchmarks/bench_gmm.py --sweep         # launch-variant sweep on the target shapes (< 60 s)
    python benchmarks/bench_gmm.py --sweep --no-targets --configs 1,2 --sweep-precisions fp32 \
        --variants '^single reg'                   # chosen shapes and variants only
    python benchmarks/bench_gmm.py --quick         # CPU smoke run under the Triton interpreter

A configuration that fails (compile error, out of resources, ...) is recorded with its error and the
run continues. ``--precision auto`` (default) is the library's per-shape rule
(``fusedml.gmm.model.auto_precision``); each row records the precision that ran.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from dataclasses import replace

if "--quick" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import fusedml  # noqa: E402
from fusedml.gmm._prep import validate  # noqa: E402
from fusedml.gmm.fused import _operands, estep_fused  # noqa: E402
from fusedml.gmm.model import auto_precision, plan_launch, reg_prefetch, reg_tile  # noqa: E402
from fusedml.gmm.ops import estep_ops  # noqa: E402

BW = 4.28e12  # measured H200 read bandwidth, bytes/s (shared/PERFORMANCE.md)
OPS_LIMIT = 20e9  # skip "ops" when its N x K temporaries would pass ~20 GB

# (N, D, K, covariance_type); the four targets of the brief are marked.
CONFIGS = [
    (1 << 20, 2, 2, "diag"),
    (4 << 20, 16, 16, "diag"),  # target <= 0.30 ms
    (16 << 20, 8, 8, "diag"),
    (16 << 20, 32, 32, "diag"),
    (1 << 20, 64, 64, "diag"),  # target <= 0.20 ms
    (1 << 20, 32, 256, "diag"),  # target <= 0.30 ms
    (4 << 20, 64, 128, "diag"),
    (4 << 20, 256, 16, "diag"),
    (1 << 20, 16, 512, "diag"),
    (1 << 20, 128, 1024, "diag"),  # target <= 4 ms
    (4 << 20, 32, 64, "spherical"),
    (4 << 20, 16, 16, "tied"),
    (1 << 20, 64, 32, "tied"),
    (4 << 20, 8, 8, "full"),
    (1 << 20, 16, 16, "full"),
    (1 << 20, 32, 64, "full"),
    # session 19: the register form (K x D <= 256) and its limits (16-32 threads per row)
    (4 << 20, 16, 64, "diag"),
    (4 << 20, 32, 8, "spherical"),
    (1 << 20, 2, 128, "diag"),
    (1 << 20, 16, 16, "diag"),  # the end-to-end GaussianMixture fit's shape
    # session 20: spherical register tiles (quadratic term and moment per row: KI doubles)
    (4 << 20, 16, 16, "spherical"),
    (16 << 20, 8, 8, "spherical"),
    # session 27: full covariance at BD = 64 (the single sweep spills at every tile: two-pass)
    (1 << 20, 64, 16, "full"),
    # session 31: full covariance tiles the planner picks untimed: BD = 16 with K > 16, padded features (BD = 32)
    (1 << 20, 16, 64, "full"),
    (1 << 20, 24, 20, "full"),
    (1 << 20, 28, 8, "full"),
    (1 << 20, 16, 32, "full"),  # BD = 16, K > 16 (session 31's pick was timed at K = 64)
    (1 << 20, 16, 20, "full"),
    (1 << 20, 16, 48, "full"),
]
DEFAULT = [1, 4, 5, 9, 2, 6, 7]  # the four targets, then 16M x 8, 4M x 64 K=128, 4M x 256 K=16 (crashed in s2)
QUICK = [(300, 3, 3, "diag"), (300, 5, 20, "diag"), (257, 4, 5, "spherical"), (300, 3, 3, "tied"),
         (300, 3, 4, "full")]
TARGETS = {(4 << 20, 16, 16, "diag"): 0.30, (1 << 20, 64, 64, "diag"): 0.20, (1 << 20, 32, 256, "diag"): 0.30,
           (1 << 20, 128, 1024, "diag"): 4.0}


def _bench(fn, quick, rep=25):
    """Median ms (``do_bench`` on CUDA; a single timed call in the CPU smoke run)."""
    return _common.bench_ms(fn, warmup=5, rep=rep)


def make_problem(N, D, K, ct, device, seed=0):
    """Data drawn from a random mixture; parameters: the truth perturbed (an EM iterate)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    f64 = torch.float64
    means = torch.randn(K, D, generator=g, dtype=f64) * 3.0 + 5.0
    w = torch.rand(K, generator=g, dtype=f64) + 0.5
    w = w / w.sum()
    if ct == "diag":
        sd = torch.rand(K, D, generator=g, dtype=f64) + 0.5
    elif ct == "spherical":
        sd = (torch.rand(K, 1, generator=g, dtype=f64) + 0.5).expand(K, D)
    if ct in ("diag", "spherical"):
        L = None
    else:
        A = torch.randn(K if ct == "full" else 1, D, D, generator=g, dtype=f64) / math.sqrt(D)
        cov = A @ A.transpose(1, 2) + 0.5 * torch.eye(D, dtype=f64)
        L = torch.linalg.cholesky(cov)
    z = torch.multinomial(w, N, replacement=True, generator=g).to(device)
    eps = torch.randn(N, D, device=device, dtype=torch.float32, generator=torch.Generator(device=device).manual_seed(seed))
    if L is None:
        X = means.to(device).float()[z] + eps * sd.to(device).float()[z]
    else:
        Ld = L.to(device).float()
        X = means.to(device).float()[z] + (torch.einsum("kij,nj->ni", Ld, eps) if ct == "tied"
                                           else torch.einsum("nij,nj->ni", Ld[z], eps))
        del Ld
    # parameters of an EM iterate: truth perturbed
    mu = means + 0.1 * torch.randn(K, D, generator=g, dtype=f64)
    if ct in ("diag", "spherical"):
        pc = 1.0 / (sd * 1.1)
        pc = pc if ct == "diag" else pc[:, 0].contiguous()
    else:
        covp = L @ L.transpose(1, 2) * 1.1
        Lc = torch.linalg.cholesky(covp)
        eye = torch.eye(D, dtype=f64).expand_as(Lc)
        pc = torch.linalg.solve_triangular(Lc, eye, upper=False).transpose(1, 2)
        pc = pc if ct == "full" else pc[0]
    return X.contiguous(), w.to(device), mu.to(device), pc.contiguous().to(device)


def flops(N, D, K, ct):
    """Useful flops of one E-step: distance products + statistics products."""
    if ct in ("diag", "spherical"):
        return 8.0 * N * D * K
    return 4.0 * N * K * D * D + 4.0 * N * K * D


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run_config(cfg, args, dev, quick):
    N, D, K, ct = cfg
    X, w, mu, pc = make_problem(N, D, K, ct, dev)
    prep = validate(X, w, mu, pc, ct, check_finite=False)
    ops_ = _operands(prep)
    prec = args.precision if args.precision != "auto" else auto_precision(N, K, D, ct, dev)
    row = {"N": N, "D": D, "K": K, "cov": ct, "precision": prec}
    plan = plan_launch(N, K, D, ct, X.dtype, dev, path="auto", precision=prec)
    prec = plan.precision or prec  # fp32 when no tensor-core configuration fits
    row.update(precision=prec, path=plan.path, BN=plan.BN, BK_tile=plan.BK_tile, num_warps=plan.num_warps,
               programs=plan.programs, smem_est=plan.smem_est, regs_est=plan.regs_est)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = estep_fused(prep, False, precision=prec, plan=plan, ops=ops_)
    if caught:
        row["warnings"] = "; ".join(str(w.message)[:200] for w in caught)
    row["ms"] = _bench(lambda: estep_fused(prep, False, precision=prec, plan=plan, ops=ops_), quick)
    other = "two_pass" if plan.path == "single" else "single"
    plan_o = plan_launch(N, K, D, ct, X.dtype, dev, path=other, precision=prec)
    if cfg not in TARGETS and not args.full and not quick and plan.path != "single":
        t_o = None  # a forced single sweep only for the targets in the default run (time budget)
    elif other == "single" and not plan.single_fits:
        # far off chip (the model's estimate is past the register file): a forced single sweep
        # would spill massively and compile for minutes; not timed
        t_o = None
    else:
        t_o = _bench(lambda: estep_fused(prep, False, precision=prec, plan=plan_o, ops=ops_), quick)
    if plan.form == "reg":  # the tl.dot single sweep the register form replaced, same inputs
        plan_d = plan_launch(N, K, D, ct, X.dtype, dev, precision=prec, register_form=False)
        row["ms_tl_dot"] = _bench(lambda: estep_fused(prep, False, precision=prec, plan=plan_d, ops=ops_), quick)
        row["reg_over_tl_dot"] = row["ms_tl_dot"] / row["ms"]
    prev = reg_tile(D, K) if plan.sph else None
    if prev is not None:  # spherical: session 19's per-feature register tiles (diag's KI), same inputs
        bd, bk, ki, bn, nw = prev
        plan_p = replace(plan, reg=(bd, ki, bk // ki), BN=bn, num_warps=nw, sph=False,
                         prefetch=reg_prefetch(bn, bd))
        row["ms_prev_reg"] = _bench(lambda: estep_fused(prep, False, precision=prec, plan=plan_p, ops=ops_), quick)
        row["sph_over_prev"] = row["ms_prev_reg"] / row["ms"]
    row["form"] = plan.form
    t_single, t_two = (row["ms"], t_o) if plan.path == "single" else (t_o, row["ms"])
    row.update(ms_single=t_single, ms_two_pass=t_two,
               single_over_two=None if t_single is None or t_two is None else t_two / t_single)
    # the public call: parameters on the GPU (one transfer to the host), and on the host (none)
    row["ms_call"] = _bench(lambda: fusedml.gmm_estep(X, w, mu, pc, ct, check_finite=False, precision=args.precision),
                            quick)
    wh, muh, pch = (t.cpu().numpy() for t in (w, mu, pc))
    row["ms_call_host"] = _bench(lambda: fusedml.gmm_estep(X, wh, muh, pch, ct, check_finite=False,
                                                           precision=args.precision), quick)
    floor = N * D * X.element_size() / BW * 1e3
    row.update(floor_ms=floor, pct_floor=100.0 * floor / row["ms"], tflops=flops(N, D, K, ct) / row["ms"] / 1e9)
    ops_bytes = 5.0 * N * K * 4 + (2.0 * N * D * 4)
    if ops_bytes > OPS_LIMIT:
        row["ms_ops"] = None
        row["ops_note"] = f"skipped: N x K temporaries ~{ops_bytes / 1e9:.0f} GB"
    else:
        row["ms_ops"] = _bench(lambda: estep_ops(prep, False), quick)
        row["speedup_ops"] = row["ms_ops"] / row["ms"]
    # float64 reference: the ops E-step on float64 data (per-component centring for full/tied)
    prep64 = validate(X.double(), w, mu, pc, ct, check_finite=False)
    if 5.0 * N * K * 8 <= OPS_LIMIT * 2:
        _, ll, nk, s1, s2 = estep_ops(prep64, False)
    else:  # chunked float64 reference
        ll = nk = s1 = s2 = None
        step = max(1, int(OPS_LIMIT / (5 * K * 8)))
        from fusedml.gmm.ops import block_stats, finish
        parts = None
        for a in range(0, N, step):
            out = block_stats(prep64.X[a:a + step], None, prep64, torch.float64, False)[1:]
            parts = list(out) if parts is None else [p + o for p, o in zip(parts, out)]
        ll, nk, s1, s2 = finish(prep64, *parts)
    _, fll, fnk, fs1, fs2 = res
    row.update(err_nk=rel(fnk, nk), err_s1=rel(fs1, s1), err_s2=rel(fs2, s2), err_ll=rel(fll, ll))
    t = TARGETS.get(cfg)
    row["target_ms"] = t
    X = prep = prep64 = None  # free the device memory
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return row


def sweep_variants(base_single, base_two, prec, D, K, base_dot=None):
    """Candidate launch variants around the model's plans (the model's picks first); ``base_dot``:
    the ``tl.dot`` single-sweep plan where the model picks the register form."""
    out = []
    if base_single is not None:
        out.append(("model single", base_single))
        base_single = replace(base_single, fallback=())  # the variants run as given (fused.fitted_plan)
        if base_single.form == "reg":  # register FMAs: blocks ahead, components and rows per thread
            for pf in (2, 1, 0):
                for ki in (1, 2, 4, 8, 16):
                    for rpt in (1, 2, 4):
                        t = reg_tile(D, K, ki=ki, rows_per_thread=rpt)
                        if t is None or (t[2], t[3], pf) == (base_single.reg[1], base_single.BN, base_single.prefetch):
                            continue
                        if t[0] * t[2] * rpt > 64 or (pf == 0 and rpt == 4):  # registers; session 19's first probe
                            continue
                        out.append((f"single reg KI={ki} rows/thread={rpt} ahead={pf}",
                                    replace(base_single, reg=(t[0], t[2], t[1] // t[2]), BN=t[3], prefetch=pf)))
            # register caps (-1: the compiler's count; the model's 0 decides at the first launch),
            # fewer warps per program with the cap, blocks ahead with the cap
            for mr, nw, pf in ((-1, 4, None), (168, 4, None), (160, 4, None), (128, 4, None), (168, 4, 2),
                               (168, 2, None), (168, 2, 2), (168, 1, 2), (0, 2, 2), (0, 1, 2)):
                t = reg_tile(D, K, ki=base_single.reg[1], num_warps=nw)
                if t is None:
                    continue
                pf = base_single.prefetch if pf is None else pf
                out.append((f"single reg maxnreg={mr} warps={nw} ahead={pf}",
                            replace(base_single, BN=t[3], num_warps=nw, prefetch=pf, maxnreg=mr)))
            base_single = base_dot  # the tl.dot variants below start from the tl.dot plan
            out.append(("single tl.dot plan", base_dot))
        BD, BK = base_single.BD, base_single.BK
        cand = [("blk", 64, 4, 2), ("cat", 128, 4, 2), ("blk", 64, 8, 2), ("cat", 64, 4, 2), ("blk", 64, 4, 3),
                ("blk", 128, 8, 2), ("blk", 32, 4, 2), ("blk", 64, 4, 1), ("blk", 32, 2, 2), ("blk", 16, 4, 2),
                ("blk", 16, 2, 2), ("blk", 64, 2, 2), ("blk", 128, 2, 2), ("blk", 32, 8, 2)]
        occ = replace(base_single, occupancy_grid=True)  # grid from the compiled kernel's resources
        out.append(("single occ", occ))
        out.append(("single occ prefetch", replace(occ, prefetch=True)))
        out.append(("single prefetch", replace(base_single, prefetch=True)))
        for BN, nw in ((128, 4), (64, 4), (128, 8)):
            out.append((f"single cat BN={BN} W={nw} occ prefetch",
                        replace(occ, BN=BN, num_warps=nw, form="cat", prefetch=True)))
        out.append(("single cat BN=128 W=4 prefetch", replace(base_single, BN=128, num_warps=4, form="cat", prefetch=True)))
        if D <= 8:  # [x, x^2] is 16 wide with BD = 8: no padded features
            out.append(("single cat BD=8 BN=128 W=4 occ prefetch",
                        replace(occ, BD=8, BN=128, num_warps=4, form="cat", prefetch=True)))
        for kind, BN, nw, st in cand:
            if kind == "cat":  # one [x, x^2] operand: two dots per block instead of four
                out.append((f"single cat BN={BN} W={nw}", replace(base_single, BN=BN, num_warps=nw, form="cat")))
            elif (BN, nw, st) != (base_single.BN, base_single.num_warps, base_single.num_stages):
                out.append((f"single BN={BN} W={nw} S={st}", replace(base_single, BN=BN, num_warps=nw, num_stages=st)))
        if prec == "fp32" and BD * BK <= 1024:  # broadcast form: [BN, BD, BK] per block in registers
            for BN in (16, 32):
                out.append((f"single bcast BN={BN} W=4", replace(base_single, BN=BN, num_warps=4, form="bcast")))
    out.append(("model two_pass", base_two))
    for BN, bk, nw in ((32, 32, 4), (64, 32, 8), (32, 64, 8), (16, 64, 8), (64, 64, 8)):
        if (BN, bk, nw) != (base_two.BN, base_two.BK_tile, base_two.num_warps) and bk <= base_two.BK:
            out.append((f"two_pass BN={BN} BK={bk} W={nw}", replace(base_two, BN=BN, BK_tile=bk, num_warps=nw)))
    if base_two.BD > 16:
        out.append(("two_pass pass1 DC=16", replace(base_two, DC=16)))
    if base_two.DC < base_two.BD:  # pass 1 with x on chip across the component loop
        for lbn in (32, 64):
            out.append((f"two_pass pass1 DC=BD lse_BN={lbn}", replace(base_two, DC=base_two.BD, lse_BN=lbn)))
    return out


def sweep(args, dev):
    """Time launch variants (block sizes, warps, pipelining depth, product form, pass-1 feature
    chunk, precision) on the target shapes; print the best per shape. Stops adding variants once
    ``--budget`` seconds have passed (the model's picks always run)."""
    from fusedml.gmm.fused import _estep_plan

    rows, best = [], []
    t0 = time.time()
    cfgs = [] if args.no_targets else [c for c in CONFIGS if c in TARGETS]
    if args.configs:  # extra shapes (indices into CONFIGS) after the targets
        cfgs += [CONFIGS[int(i)] for i in args.configs.split(",") if CONFIGS[int(i)] not in cfgs]
    for ci, cfg in enumerate(cfgs):
        N, D, K, ct = cfg
        if dev.type != "cuda":  # --quick: the variants run under the interpreter on a few rows
            N = 200
        X, w, mu, pc = make_problem(N, D, K, ct, dev)
        prep = validate(X, w, mu, pc, ct, check_finite=False)
        ops_ = _operands(prep)
        shape_rows = []
        precs = args.sweep_precisions.split(",")
        first = auto_precision(N, K, D, ct, dev)  # the library's pick first: it gets the budget first
        precs = sorted(precs, key=lambda q: q != first)
        for prec in precs:
            base_t = plan_launch(N, K, D, ct, X.dtype, dev, path="two_pass", precision=prec)
            if base_t.precision and base_t.precision != prec:
                continue  # no configuration of this precision fits
            auto = plan_launch(N, K, D, ct, X.dtype, dev, path="auto", precision=prec)
            base_s = auto if auto.path == "single" else None
            # the budget is shared by the shapes left: each gets its slice, model picks always run
            slice_end = t0 + args.budget * (ci + 1) / len(cfgs)
            base_d = plan_launch(N, K, D, ct, X.dtype, dev, path="single", precision=prec, register_form=False)
            for name, p in sweep_variants(base_s, base_t, prec, D, K, base_d):
                is_model = name.startswith("model")
                if args.variants and not is_model and not re.search(args.variants, name):
                    continue
                if not is_model and time.time() > slice_end:
                    continue
                row = {"N": N, "D": D, "K": K, "cov": ct, "precision": prec, "variant": name, "path": p.path,
                       "BN": p.BN, "BK_tile": p.BK_tile, "num_warps": p.num_warps, "num_stages": p.num_stages,
                       "form": p.form, "reg": list(p.reg), "maxnreg": p.maxnreg, "DC": p.DC,
                       "model": is_model and p.path == auto.path}
                try:
                    _estep_plan(prep, False, prec, p, ops_)  # compile; errors (out of resources) land here
                    row["ms"] = _bench(lambda: _estep_plan(prep, False, prec, p, ops_), False, rep=15)
                except Exception as e:  # noqa: BLE001 -- record and continue
                    row["ms"], row["error"] = None, f"{type(e).__name__}: {str(e)[:160]}"
                rows.append(row)
                shape_rows.append(row)
                print(json.dumps(row), flush=True)
        ok = [r for r in shape_rows if r["ms"] is not None]
        if ok:
            b = min(ok, key=lambda r: r["ms"])
            m = [r for r in ok if r["model"]]
            best.append({"shape": f"{N}x{D} K={K}", "target_ms": TARGETS.get(cfg),
                         "model_ms": m[0]["ms"] if m else None,
                         "best_ms": b["ms"], "best": f"{b['precision']} {b['variant']}",
                         "model/best": (m[0]["ms"] / b["ms"]) if m else None})
        X = prep = None  # free the device memory
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print(_common.markdown_table(best, ["shape", "target_ms", "model_ms", "best_ms", "best", "model/best"]))
    return rows


TABLE_COLUMNS = ["N", "D", "K", "cov", "precision", "path", "form", "BN", "num_warps", "ms", "ms_tl_dot", "target_ms", "pct_floor", "tflops", "ms_ops", "speedup_ops",
                 "single_over_two", "ms_call", "ms_call_host", "ms_prev_reg", "err_nk", "err_s1", "err_s2", "err_ll", "error"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny CPU smoke run under the Triton interpreter")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "tf32x3", "tf32", "bf16"],
                    help="operand precision; auto = the library's per-shape rule (fusedml.gmm.model.auto_precision)")
    ap.add_argument("--full", action="store_true", help="all configurations (default: the 7 of DEFAULT)")
    ap.add_argument("--budget", type=float, default=50.0, help="--sweep: seconds of variants (model picks always run)")
    ap.add_argument("--configs", default=None, help="comma-separated indices into CONFIGS")
    ap.add_argument("--sweep", action="store_true", help="launch-parameter sweep on the target shapes")
    ap.add_argument("--no-targets", action="store_true", help="--sweep: only the shapes of --configs")
    ap.add_argument("--variants", default=None, help="--sweep: only variants whose name matches this regex")
    ap.add_argument("--sweep-precisions", default="fp32,tf32x3")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gmm-<gpu>-<date>.json)")
    args = ap.parse_args()
    quick = args.quick
    dev = torch.device("cpu" if quick else "cuda")
    if not quick and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --quick for the CPU smoke run")
    t0 = time.time()
    if args.sweep:
        rows = sweep(args, dev)
    else:
        cfgs = QUICK if quick else (CONFIGS if args.full else [CONFIGS[i] for i in DEFAULT])
        if args.configs:
            cfgs = [(QUICK if quick else CONFIGS)[int(i)] for i in args.configs.split(",")]
        rows = []
        for cfg in cfgs:
            try:
                rows.append(run_config(cfg, args, dev, quick))
            except Exception as e:  # noqa: BLE001 -- one failing configuration never ends the run
                N, D, K, ct = cfg
                rows.append({"N": N, "D": D, "K": K, "cov": ct, "precision": args.precision, "ms": None,
                             "single_over_two": None, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
    seconds = time.time() - t0
    out = _common.write_json("gmm_sweep" if args.sweep else "gmm", rows, out=args.out,
                             extra={"args": vars(args), "fusedml": fusedml.__version__, "seconds": seconds})
    print(f"wrote {out} ({seconds:.0f} s)")
    if not args.sweep:
        sp = [r["single_over_two"] for r in rows if r.get("single_over_two") is not None]
        if sp:
            print(f"median single/two-pass speed-up: {statistics.median(sp):.2f}x")
        print(_common.markdown_table(rows, TABLE_COLUMNS))


if __name__ == "__main__":
    main()
