"""Where a fit's time goes: GPU busy time against wall time, per kernel, and host syncs.

For each case the script

1. times the fit's building blocks on their own (``matvec``, ``X^T v``, the Hessian chain
   ``X^T (h ⊙ X s)``) three ways: GPU time (``do_bench`` median), wall time per call when
   launched back to back (host launch cost hidden behind the GPU if the call is cheap on the
   host), and wall time per call with a sync after each (the latency a solver decision pays);
2. profiles one warm ``fit`` with ``torch.profiler`` and reports the wall time, the summed GPU
   kernel time (busy fraction = how much of the fit the GPU works), the number of launches and
   of device-to-host syncs, and the kernels that take the most time.

    python benchmarks/profile_fit.py [--shape 1000000x100] [--algo logistic] [--out FILE]

On the CPU (no CUDA) it runs a tiny shape with the interpreter as a smoke test.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fusedml  # noqa: E402
from _common import H200_BANDWIDTH, bench_ms, device, write_json  # noqa: E402

_SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy ", "cudaMemcpy", "cudaEventSynchronize")


def _wall_per_call(fn, n, sync_each):
    fn()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
        if sync_each and torch.cuda.is_available():
            torch.cuda.synchronize()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / n


def operator_rows(X, backend, n_calls):
    """GPU ms, back-to-back wall ms and synced wall ms of the three products a solver uses."""
    N, D = X.shape
    dev = X.device
    g = torch.Generator(device=dev).manual_seed(0)
    s = torch.randn(D + 1, generator=g, device=dev)
    h = torch.rand(N, generator=g, device=dev)
    z = torch.randn(D + 1, generator=g, device=dev)
    cases = {
        "matvec [X,1] s": lambda: fusedml.matvec(X, s, intercept=True, backend=backend),
        "X^T v + b z": lambda: fusedml.mmchain(X, None, v=h, z=z, beta=0.5, intercept=True, backend=backend),
        "X^T (h*(X s)) + b z": lambda: fusedml.mmchain(X, s, v=h, z=z, beta=0.5, intercept=True, backend=backend),
    }
    floor_ms = 1e3 * X.numel() * X.element_size() / H200_BANDWIDTH
    rows = []
    for name, fn in cases.items():
        gpu = bench_ms(fn)
        rows.append({"op": name, "backend": backend, "gpu_ms": gpu,
                     "wall_ms_back_to_back": _wall_per_call(fn, n_calls, False),
                     "wall_ms_synced": _wall_per_call(fn, n_calls, True),
                     "floor_ms_per_read": floor_ms})
    return rows


def profile_fit(make, X, y, n_top=8, trace=None, stacks=False):
    """Profile one warm fit: wall, summed kernel time, launches, syncs, top kernels; with ``trace``
    (a path) also the fit's Chrome trace, for its GPU idle gaps (``benchmarks/trace_gaps.py``), and
    with ``stacks`` a second fit's trace with Python stacks (``-stack.json``; huge under the
    Triton interpreter)."""
    from torch.profiler import ProfilerActivity, profile

    make().fit(X, y)  # warm: compiles, caches
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    est = make()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        est.fit(X, y)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    if trace:
        prof.export_chrome_trace(trace)
    if trace and stacks:
        est2 = make()  # again with Python stacks: slower, but names the host code behind each gap
        with profile(activities=acts, with_stack=True) as prof2:
            est2.fit(X, y)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        prof2.export_chrome_trace(trace.replace(".json", "-stack.json"))
    kern, n_launch, n_sync, sync_us = {}, 0, 0, 0.0
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        is_gpu = dt is not None and "CUDA" in str(dt)
        if is_gpu:
            k = kern.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        elif e.name.startswith("cudaLaunchKernel") or e.name.startswith("cuLaunchKernel"):
            n_launch += 1
        elif any(e.name.startswith(s) for s in _SYNC_NAMES):
            n_sync += 1
            sync_us += e.cpu_time_total
    busy_us = sum(v[1] for v in kern.values())
    top = sorted(kern.items(), key=lambda kv: -kv[1][1])[:n_top]
    return {
        "wall_ms": 1e3 * wall,
        "gpu_busy_ms": busy_us / 1e3,
        "busy_fraction": busy_us / 1e3 / (1e3 * wall) if wall > 0 else None,
        "launches": n_launch,
        "syncs": n_sync,
        "sync_wait_ms": sync_us / 1e3,
        "n_iter": int(np.max(est.n_iter_)) if hasattr(est, "n_iter_") else None,
        "fit_info": getattr(est, "_fit_info", None),
        "top_kernels": [{"name": n[:90], "count": c, "ms": us / 1e3} for n, (c, us) in top],
    }


def host_profile(make, X, y, k):
    """Print the ``k`` host functions with the most own time, then the most cumulative time, in one
    warm fit (cProfile)."""
    import cProfile
    import pstats

    make().fit(X, y)
    pr = cProfile.Profile()
    pr.enable()
    make().fit(X, y)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(k)
    # the same by cumulative time, in microseconds (print_stats rounds to milliseconds)
    rows = sorted(((ct, tt, nc, f) for f, (cc, nc, tt, ct, _) in st.stats.items()), reverse=True)[:k]
    print(f"{'cum us':>9} {'own us':>9} {'calls':>6}  function")
    for ct, tt, nc, (path, line, name) in rows:
        print(f"{1e6 * ct:9.0f} {1e6 * tt:9.0f} {nc:6d}  {os.path.basename(path)}:{line}({name})")


def main(argv=None):
    from algorithms import GaussianMixture, LinearSVC, LogisticRegression, PoissonRegressor, Ridge
    from datasets.synthetic import make_dense, make_gmm

    algos = {
        "logistic": (LogisticRegression, "binary", {"C": 1.0, "tol": 1e-6, "max_iter": 100}),
        "multinomial": (LogisticRegression, "multiclass", {"C": 1.0, "tol": 1e-6, "max_iter": 100}),
        "linearsvc": (LinearSVC, "binary", {"C": 1.0, "tol": 1e-6, "max_iter": 100}),
        "poisson": (PoissonRegressor, "counts", {"alpha": 1e-3, "tol": 1e-6, "max_iter": 100}),
        "ridge": (Ridge, "regression", {"alpha": 1.0, "tol": 1e-6, "max_iter": 100}),
        # the end-to-end benchmark's mixture: K = 16 diagonal components on synthetic-gmm data
        "gmm": (GaussianMixture, "gmm", {"n_components": 16, "covariance_type": "diag", "max_iter": 100,
                                          "tol": 1e-3, "random_state": 0, "reg_covar": 1e-6}),
    }
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", default=None, help="NxD (repeatable); default 1000000x100")
    ap.add_argument("--algo", action="append", choices=sorted(algos), default=None)
    ap.add_argument("--backends", nargs="+", default=["fused", "ops"])
    ap.add_argument("--calls", type=int, default=50, help="calls per wall-time measurement")
    ap.add_argument("--cprofile", type=int, default=0, metavar="K",
                    help="also print the K host functions with the most own and cumulative time in one fused fit")
    ap.add_argument("--trace-dir", default=None, help="write each profiled fit's Chrome trace here")
    ap.add_argument("--trace-stacks", action="store_true", help="with --trace-dir: also a trace with Python stacks")
    ap.add_argument("--csr", default=None, metavar="NxD:NNZ:PROFILE",
                    help="fit CSR data instead (datasets.make_csr, e.g. 1000000x100000:32:powerlaw); the shapes "
                         "are ignored and the operators' table skipped")
    ap.add_argument("--top", type=int, default=5, help="kernels per fit in the printed table")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = device()
    shapes = args.shape or (["1000000x100"] if dev.type == "cuda" else ["300x6"])
    if args.csr:
        shape, _, rest = args.csr.partition(":")
        nnz, _, profile = rest.partition(":")
        if dev.type != "cuda":
            shape, nnz = "300x40", "6"
        shapes, csr = [shape], (float(nnz or 32), profile or "uniform")
    algo_names = args.algo or ["logistic"]
    if dev.type != "cuda":
        args.calls = 2
    op_rows, fit_rows = [], []
    for shape in shapes:
        n, d = (int(s) for s in shape.lower().split("x"))
        for be in args.backends:
            if args.csr:
                from datasets.synthetic import make_csr

                make_data = lambda task, **kw: make_csr(n, d, csr[0], csr[1], task, device=dev, return_torch=True,  # noqa: E731
                                                        **{k: v for k, v in kw.items() if k == "signal"})
            else:
                make_data = lambda task, **kw: make_dense(n, d, task, device=dev, return_torch=True, **kw)  # noqa: E731
            ds = make_data("binary")
            if any(a != "gmm" for a in algo_names) and not args.csr:
                op_rows += [dict(r, shape=shape) for r in operator_rows(ds.X, be, args.calls)]
            for a in algo_names:
                cls, task, params = algos[a]
                if task == "gmm":
                    ds = make_gmm(n, d, params["n_components"], separation=4.0, covariance_type="diag",
                                  device=dev, return_torch=True)
                elif task != "binary":
                    ds = make_data(task, signal=0.5)
                trace = None
                if args.trace_dir:
                    os.makedirs(args.trace_dir, exist_ok=True)
                    trace = os.path.join(args.trace_dir, f"trace-{a}-{shape}-{be}.json")
                r = profile_fit(lambda: cls(backend=be, **params), ds.X, ds.y, n_top=max(8, args.top), trace=trace,
                                stacks=args.trace_stacks)
                if args.cprofile and be == "fused":
                    host_profile(lambda: cls(backend=be, **params), ds.X, ds.y, args.cprofile)
                fit_rows.append(dict(r, shape=shape, algo=a, backend=be))
    print("| shape | op | backend | GPU ms | wall ms back-to-back | wall ms synced | floor ms |")
    print("|---|---|---|---|---|---|---|")
    for r in op_rows:
        print(f"| {r['shape']} | {r['op']} | {r['backend']} | {r['gpu_ms']:.3f} | {r['wall_ms_back_to_back']:.3f} "
              f"| {r['wall_ms_synced']:.3f} | {r['floor_ms_per_read']:.3f} |")
    print()
    print("| shape | algo | backend | wall ms | GPU busy ms | busy | launches | syncs | iters |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in fit_rows:
        print(f"| {r['shape']} | {r['algo']} | {r['backend']} | {r['wall_ms']:.2f} | {r['gpu_busy_ms']:.2f} "
              f"| {100 * (r['busy_fraction'] or 0):.0f} % | {r['launches']} | {r['syncs']} | {r['n_iter']} |")
        for k in r["top_kernels"][:args.top]:
            print(f"|  | {k['name'][:60]} | | {k['ms']:.3f} | x{k['count']} | | | | |")
    path = write_json("profile_fit", fit_rows, extra={"operators": op_rows}, out=args.out)
    print("saved", path)


if __name__ == "__main__":
    main()
