"""Host cost of the public GMM E-step and of a GaussianMixture fit (where the time goes).

``bench_gmm.py`` times ``gmm_estep`` beside its kernels (``ms_call`` / ``ms_call_host``); at a
million rows the call is several times the kernel. This probe splits that up, per shape:

* ``host_us``: the call's own host time, back-to-back calls with one sync at the end (parameters
  on the host: the call never waits on the GPU, so this is the launch-side cost alone) and the
  same with the parameters on the GPU (one device-to-host read per call);
* ``kernel_ms`` / ``call_ms``: ``do_bench`` of the data pass alone and of the public call;
* cProfile's top functions per call (own and cumulative us);
* one ``GaussianMixture`` fit (``--fit``) with cProfile's top functions: initialisation,
  E-steps, M-steps.

    python benchmarks/gmm_host_probe.py [--shapes 1048576x16x16 ...] [--fit 1000000x16x16] [--out F]

Without CUDA it runs under ``TRITON_INTERPRET=1`` on tiny shapes (a smoke run of the script).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import torch  # noqa: E402

if not torch.cuda.is_available():  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _common  # noqa: E402
import fusedml  # noqa: E402
from bench_gmm import make_problem  # noqa: E402
from fusedml.gmm._prep import validate  # noqa: E402
from fusedml.gmm.fused import _operands, estep_fused  # noqa: E402
from host_overhead import per_call_us, profile_table  # noqa: E402

SHAPES = ["1048576x2x2", "1048576x16x16", "4194304x16x16", "4194304x32x8s", "1048576x2x128"]


def _parse(spec):
    ct = "spherical" if spec.endswith("s") else "diag"
    N, D, K = (int(v) for v in spec.rstrip("s").split("x"))
    return N, D, K, ct


def probe_estep(spec, dev, calls, top):
    N, D, K, ct = _parse(spec)
    X, w, mu, pc = make_problem(N, D, K, ct, dev)
    wh, muh, pch = (t.cpu().numpy() for t in (w, mu, pc))
    call_host = lambda: fusedml.gmm_estep(X, wh, muh, pch, ct, check_finite=False)  # noqa: E731
    call_dev = lambda: fusedml.gmm_estep(X, w, mu, pc, ct, check_finite=False)  # noqa: E731
    prep = validate(X, w, mu, pc, ct, check_finite=False)
    ops = _operands(prep)
    kernel = lambda: estep_fused(prep, False, ops=ops)  # noqa: E731
    row = {"shape": spec, "N": N, "D": D, "K": K, "cov": ct,
           "host_us_host_params": per_call_us(call_host, calls, dev),
           "host_us_gpu_params": per_call_us(call_dev, calls, dev),
           "host_us_kernel_only": per_call_us(kernel, calls, dev),
           "kernel_ms": _common.bench_ms(kernel), "call_ms": _common.bench_ms(call_host),
           "call_ms_gpu_params": _common.bench_ms(call_dev)}
    row["profile"] = profile_table(call_host, dev, top, calls)
    row["profile_kernel"] = profile_table(kernel, dev, top, calls)
    print(f"\n== {spec} {ct}: host us/call {row['host_us_host_params']:.0f} (GPU parameters "
          f"{row['host_us_gpu_params']:.0f}, data pass alone {row['host_us_kernel_only']:.0f}); kernel "
          f"{row['kernel_ms']:.3f} ms, call {row['call_ms']:.3f} ms ({row['call_ms_gpu_params']:.3f})")
    print(row["profile"])
    print("data pass alone:\n" + row["profile_kernel"])
    return row


def probe_primitives(dev, calls):
    """Host us per call of the pieces a data pass is made of (this host's speed: the probe's
    rows move with it between machines)."""
    from fusedml import _launch
    from fusedml.gmm import fused

    t = torch.empty(1024, device=dev)
    td = torch.empty(1024, dtype=torch.float64, device=dev)
    prims = {
        "torch.empty(1024)": lambda: torch.empty(1024, device=dev),
        "split into 4 views": lambda: t.split([256, 256, 256, 256]),
        "view": lambda: t.view(32, 32),
        "current_stream().cuda_stream": lambda: torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0,
        "is_current_stream_capturing": lambda: torch.cuda.is_current_stream_capturing() if dev.type == "cuda" else 0,
        "triton driver stream": _launch._stream if dev.type == "cuda" else (lambda: 0),
        "launch key of 20 args": lambda: tuple(map(_launch._key, (t,) * 12 + (1024,) * 8)),
        "finish kernel launch (10 args)": lambda: _launch.launch(
            fused._diag_finish_kernel, (1,), (t, t, t, t, td, td, 4, 4, 2, 2), dict(BP=64, BKD=16), num_warps=4),
    }
    out = {name: per_call_us(fn, calls, dev) for name, fn in prims.items()}
    print("\n== host primitives (us/call): " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()))
    return out


def probe_fit(spec, dev, top):
    from algorithms import GaussianMixture
    import datasets

    N, D, K, _ = _parse(spec)
    ds = datasets.make_gmm(N, D, K, separation=4.0, covariance_type="diag", seed=0)
    X = torch.as_tensor(ds.X).to(dev)
    kw = dict(covariance_type="diag", max_iter=100, tol=1e-3, random_state=0, reg_covar=1e-6, backend="fused")
    GaussianMixture(K, **kw).fit(X)  # compile
    import time
    t0 = time.perf_counter()
    est = GaussianMixture(K, **kw).fit(X)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    prof = profile_table(lambda: GaussianMixture(K, **kw).fit(X), dev, top, 1)
    print(f"\n== fit {spec}: {1e3 * wall:.1f} ms, {est.n_iter_} EM iterations")
    print(prof)
    phases = phase_times(lambda: GaussianMixture(K, **kw).fit(X), dev)
    print("phases (synchronised wall ms, calls): " + ", ".join(f"{k} {v[0]:.2f} ({v[1]})" for k, v in phases.items()))
    kernels = None
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            GaussianMixture(K, **kw).fit(X)
            torch.cuda.synchronize()
        kernels = p.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
        print(kernels)
    return {"shape": spec, "fit_ms": 1e3 * wall, "n_iter": est.n_iter_, "profile": prof, "phases": phases,
            "kernels": kernels}


def phase_times(fn, dev):
    """Synchronised wall time (ms) and call count of the fit's phases: the functions below,
    wrapped with a device sync before and after (the sum is not the fit: phases nest)."""
    import time

    import algorithms.mixture as mixture
    import fusedml.gmm as gmm

    targets = [(mixture, "_kmeans_plusplus"), (mixture, "_lloyd"), (mixture, "_choice_p"),
               (mixture, "_hard_stats"), (mixture.GaussianMixture, "_initialize_parameters"),
               (gmm, "gmm_estep"), (gmm, "gmm_mstep")]
    acc = {name: [0.0, 0] for _, name in targets}
    saved = []

    def wrap(owner, name):
        f = getattr(owner, name)
        saved.append((owner, name, f))

        def timed(*a, **k):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = f(*a, **k)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            acc[name][0] += 1e3 * (time.perf_counter() - t0)
            acc[name][1] += 1
            return r
        setattr(owner, name, timed)

    try:
        for owner, name in targets:
            wrap(owner, name)
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        acc["fit"] = [1e3 * (time.perf_counter() - t0), 1]
    finally:
        for owner, name, f in saved:
            setattr(owner, name, f)
    return {k: (v[0], v[1]) for k, v in acc.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=None, help="NxDxK, suffix s for spherical")
    ap.add_argument("--fit", default=None, help="NxDxK of the profiled fit ('' for none; default 1000000x16x16, "
                                                 "400x3x2 without CUDA)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=22)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = args.shapes or (SHAPES if dev.type == "cuda" else ["256x3x2", "256x4x3s"])
    calls = args.calls if dev.type == "cuda" else 2
    rows = [probe_estep(s, dev, calls, args.top) for s in shapes]
    prims = probe_primitives(dev, calls)
    fit = args.fit if args.fit is not None else ("1000000x16x16" if dev.type == "cuda" else "400x3x2")
    if fit:
        rows.append(probe_fit(fit, dev, args.top))
    print("\nshape | host us (host params) | host us (GPU params) | kernel ms | call ms")
    for r in rows:
        if "kernel_ms" in r:
            print(f"{r['shape']} | {r['host_us_host_params']:.0f} | {r['host_us_gpu_params']:.0f} | "
                  f"{r['kernel_ms']:.3f} | {r['call_ms']:.3f}")
        else:
            print(f"fit {r['shape']} | {r['fit_ms']:.1f} ms | {r['n_iter']} iterations")
    print(_common.write_json("gmm_host_probe", rows, {"args": vars(args), "host_primitives_us": prims},
                                 args.out))
    return rows


if __name__ == "__main__":
    main()
