"""Host cost of one operator call and of the solvers' bookkeeping, fused against "ops".

The end-to-end fits at a million rows are bound by the host (``profile_fit.py``: the GPU is busy
14-23 % of a 1M x 100 fit). This script measures where that time goes, on data so small that
the device work is a few microseconds, so that every call's wall time is its host cost:

* one call of each operator the solvers make (``mmchain`` with the intercept and ``z``,
  ``loss_gradient``, ``matvec``) per backend;
* the primitives under them: an empty Triton launch, one torch launch, one host sync;
* one whole ``LogisticRegression`` fit per backend on tiny data (host only), with cProfile's
  top functions by own time;
* whole fits at real sizes (``--ab-shapes``, ``--ab-algos``) with a solver switch on and off
  (``--ab-var``: ``FUSEDML_CUDA_GRAPHS``, the CG steps replayed from CUDA graphs or eager;
  ``FUSEDML_CG_LAG``, device-decided CG steps queued 0 / 1 / ... steps ahead of the host;
  ``FUSEDML_FUSED_CG``, the vector half of each CG step in one launch or ~15 torch launches;
  ``FUSEDML_BIND``, the trial points, CG updates and accept-test sums as bound launches or not),
  per backend (median of ``--ab-reps``).

    python benchmarks/host_overhead.py [--calls 300] [--out FILE]
    python benchmarks/host_overhead.py --ab-only --ab-var FUSEDML_FUSED_CG --ab-algos logistic ridge

Without CUDA it runs under ``TRITON_INTERPRET=1`` (a smoke test of the script: the numbers are
the interpreter's).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

import fusedml  # noqa: E402


@triton.jit
def _empty_kernel(X, N):
    pass


def per_call_us(fn, calls, dev):
    """Mean wall time of ``fn()`` over ``calls`` back-to-back calls (one sync at the end), in us."""
    fn()
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(dev)
    return 1e6 * (time.perf_counter() - t0) / calls


def profile_table(fn, dev, top, reps):
    """cProfile of ``reps`` calls of ``fn``: the ``top`` functions by cumulative time, in us per
    call of ``fn`` (own and cumulative) with calls per ``fn`` call (pstats prints ms to 3 places,
    too coarse for a fit whose host time is a few ms)."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        fn()
    _sync(dev)
    pr.disable()
    st = pstats.Stats(pr).stats
    rows = sorted(st.items(), key=lambda kv: -kv[1][3])[:top]
    lines = [f"{'cum us':>9} {'own us':>9} {'calls':>7}  function"]
    for (path, line, name), (cc, nc, tt, ct, _) in rows:
        where = f"{os.path.relpath(path) if path.startswith('/') else path}:{line}({name})"
        lines.append(f"{1e6 * ct / reps:9.1f} {1e6 * tt / reps:9.1f} {nc / reps:7.1f}  {where[-90:]}")
    return "\n".join(lines)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


AB_VARS = {"FUSEDML_CUDA_GRAPHS": "CUDA graphs", "FUSEDML_FUSED_CG": "fused CG update",
           "FUSEDML_CAPTURE_AFTER": "CG steps captured after", "FUSEDML_CG_LAG": "CG steps queued ahead",
           "FUSEDML_BIND": "bound launches"}


def env_ab(shapes, reps, dev, var="FUSEDML_CUDA_GRAPHS", algos=("logistic", "linearsvc", "ridge"), values=("1", "0")):
    """Whole fits with a solver switch at each of ``values`` (FUSEDML_CUDA_GRAPHS / FUSEDML_FUSED_CG
    "1" / "0": the CG steps replayed from CUDA graphs, or the vector half of each CG step in one
    launch; FUSEDML_CAPTURE_AFTER: eager CG steps before the capture), same data, both backends,
    the values alternating fit by fit (``_common.alternate_fits``): median wall time of ``reps`` fits."""
    what = AB_VARS[var]
    rows = []
    for spec in shapes:
        N, D = (int(s) for s in spec.split("x"))
        X, cases = _common.linear_fit_cases(N, D, dev)
        for algo in algos:
            make, y = cases[algo]
            for be in ("fused", "ops"):
                all_ms, last = _common.alternate_fits(lambda make=make, be=be: make(be), X, y, tuple(values),
                                                      lambda flag: _common.set_env({var: flag}), reps, dev)
                for flag in values:
                    ts, est = all_ms[flag], last[flag]
                    ms = sorted(ts)[len(ts) // 2]
                    info = getattr(est, "_fit_info", None) or {}
                    label = flag if var in ("FUSEDML_CAPTURE_AFTER", "FUSEDML_CG_LAG") else ("on" if flag == "1" else "off")
                    rows.append({"what": f"fit {algo} {spec}, {what} {label}",
                                 "backend": be, "us_per_call": 1e3 * ms, "n_iter": int(np.max(est.n_iter_)),
                                 "n_mmchain": info.get("n_mmchain"), "n_lossgrad": info.get("n_lossgrad"),
                                 "fit_ms_all": ts})
                    print(f"{rows[-1]['what']:<52} {be:<6} {ms:8.2f} ms  n_iter={rows[-1]['n_iter']} "
                          f"mmchain={rows[-1]['n_mmchain']} min={min(ts):.2f} max={max(ts):.2f}", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cprofile", type=int, default=60, help="top functions by cumulative time in the fit profile")
    ap.add_argument("--ab-shapes", nargs="+", default=["1000000x100", "4000000x64"],
                    help="NxD of the CUDA-graphs on/off fit comparison")
    ap.add_argument("--ab-reps", type=int, default=7)
    ap.add_argument("--ab-var", default="FUSEDML_CUDA_GRAPHS", choices=sorted(AB_VARS),
                    help="the switch the fit comparison turns on and off")
    ap.add_argument("--ab-algos", nargs="+", default=["logistic", "linearsvc", "ridge"],
                    choices=_common.LINEAR_FIT_ALGOS)
    ap.add_argument("--ab-values", nargs="+", default=["1", "0"], help="the switch's values")
    ap.add_argument("--ab-only", action="store_true", help="only the fit comparison")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    quick = dev.type != "cuda"
    calls = 3 if quick else args.calls
    N, D = (64, 8) if quick else (args.rows, 100)
    g = torch.Generator(device=dev).manual_seed(0)
    X = torch.randn(N, D, generator=g, device=dev)
    s = torch.randn(D + 1, generator=g, device=dev)
    h = torch.rand(N, generator=g, device=dev)
    lbl = (torch.rand(N, generator=g, device=dev) < 0.5).float()
    small = torch.zeros(D + 1, device=dev)
    rows, profiles = [], {}
    if args.ab_only:
        rows += env_ab(args.ab_shapes if not quick else ["400x8"], 2 if quick else args.ab_reps, dev,
                       args.ab_var, args.ab_algos, args.ab_values)
        return _finish(rows, profiles, args)

    def row(name, backend, us):
        rows.append({"what": name, "backend": backend, "us_per_call": us})
        print(f"{name:<40} {backend:<6} {us:9.1f} us", flush=True)

    row("empty Triton launch", "-", per_call_us(lambda: _empty_kernel[(1,)](X, N), calls, dev))
    row("torch.add (one launch)", "-", per_call_us(lambda: torch.add(small, small, alpha=0.5), calls, dev))
    row("host sync (2-float tolist)", "-", per_call_us(lambda: small[:2].tolist(), calls, dev))
    for be in ("fused", "ops"):
        row("mmchain X^T(h*(Xs)) + l2 s, intercept", be, per_call_us(
            lambda: fusedml.mmchain(X, s, v=h, z=s, beta=1e-3, intercept=True, backend=be), calls, dev))
        row("matvec [X,1] s", be, per_call_us(lambda: fusedml.matvec(X, s, intercept=True, backend=be), calls, dev))
        if be == "fused":
            row("loss_gradient logistic, intercept", be, per_call_us(
                lambda: fusedml.loss_gradient(X, s, lbl, loss="logistic", z=s, beta=1e-3, intercept=True,
                                              backend=be), calls, dev))
            # where one mmchain call's host time goes: validation, then the launcher alone
            from fusedml.mmchain._checks import prepare_mmchain
            from fusedml.mmchain.dense import dense_mmchain_fused

            prep = lambda: prepare_mmchain(X, s, h, s, 1.0, 1e-3, intercept=True, v_op="mul",  # noqa: E731
                                           check_finite=False)
            row("  prepare_mmchain (validation) alone", be, per_call_us(prep, calls, dev))
            Pm = prep()
            row("  dense_mmchain_fused (validated) alone", be, per_call_us(lambda: dense_mmchain_fused(Pm), calls, dev))
            # the solvers' bound forms: checked once, then the launch alone
            bound = fusedml.bind_mmchain(X, s, v=h, z=s, beta=1e-3, intercept=True, backend=be)
            row("bind_mmchain call (CG Hessian product)", be, per_call_us(bound, calls, dev))
            from fusedml import _launch  # the same with Triton's empty launch hooks and their metadata built

            skip, _launch.SKIP_EMPTY_HOOKS = _launch.SKIP_EMPTY_HOOKS, False
            try:
                row("  the same, Triton's launch hooks built", be, per_call_us(bound, calls, dev))
            finally:
                _launch.SKIP_EMPTY_HOOKS = skip
            row("bind_loss_gradient call (TRON trial point)", be, per_call_us(
                fusedml.bind_loss_gradient(X, s, lbl, loss="logistic", z=s, beta=1e-3, intercept=True,
                                           return_eta=False, backend=be), calls, dev))
            for name, fn in (("mmchain fused", lambda: fusedml.mmchain(X, s, v=h, z=s, beta=1e-3, intercept=True,
                                                                      backend="fused")),
                             ("loss_gradient fused", lambda: fusedml.loss_gradient(
                                 X, s, lbl, loss="logistic", z=s, beta=1e-3, intercept=True, backend="fused"))):
                profiles[name] = profile_table(fn, dev, 30, calls)
                print(name, "\n" + profiles[name], flush=True)

    from algorithms import LogisticRegression

    for be in ("fused", "ops"):
        def fit():
            return LogisticRegression(C=1.0, backend=be, max_iter=10).fit(X, lbl)
        est = fit()
        _sync(dev)
        t0 = time.perf_counter()
        reps = 2 if quick else 20
        for _ in range(reps):
            est = fit()
        _sync(dev)
        us = 1e6 * (time.perf_counter() - t0) / reps
        info = est.fit_info_ if hasattr(est, "fit_info_") else {}
        rows.append({"what": "LogisticRegression fit (tiny data: host only)", "backend": be, "us_per_call": us,
                     "n_iter": est.n_iter_.tolist() if hasattr(est.n_iter_, "tolist") else est.n_iter_,
                     "fit_info": {k: v for k, v in info.items() if isinstance(v, (int, float, str))}})
        print(f"{'LogisticRegression fit (host only)':<40} {be:<6} {us:9.1f} us  n_iter={est.n_iter_}", flush=True)
        profiles[be] = profile_table(fit, dev, args.cprofile, reps)
        print(profiles[be])
    rows += env_ab(args.ab_shapes if not quick else ["400x8"], 2 if quick else args.ab_reps, dev,
                   args.ab_var, args.ab_algos, args.ab_values)
    return _finish(rows, profiles, args)


def _finish(rows, profiles, args):
    path = _common.write_json("host_overhead", rows, {"args": vars(args), "cprofile": profiles}, args.out)
    print(f"\nwrote {path}\n")
    print(_common.markdown_table(rows, ["what", "backend", "us_per_call"]))
    return rows


if __name__ == "__main__":
    main()
