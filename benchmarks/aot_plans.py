"""Every kernel launch of the benchmarks' calls, compiled for sm_90 on a machine without a GPU.

The launch models pick tiles from the shape, dtype and GPU (the H200's profile when there is no CUDA
device), so what the H200 compiles for a benchmark case can be found on the CPU: each call runs
under the Triton interpreter with its launches recorded and **not executed**
(``tests/_sm90.record_launches(execute=False)``: the shapes are the benchmarks' own, up to 4 GB of
X, and nothing is computed), then every distinct launch is compiled for sm_90 as the JIT would
specialise it. Reports per launch: registers, stack bytes, local-memory instructions inside loops
(spills paid per iteration), shared memory, or the compile error; the calls whose host code failed
on the uncomputed outputs are listed (their later launches are missing).

    python benchmarks/aot_plans.py [--parts mmchain csr solver gmm kmeans] [--match REGEX] [--out F.json]

A launch that does not compile, or needs more shared memory than an sm_90 block may use, exits 1.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE, os.path.join(os.path.dirname(_HERE), "tests")]

import fusedml  # noqa: E402
from _sm90 import compile_descriptors, record_launches  # noqa: E402

CPU = torch.device("cpu")


def _mmchain_calls(csr: bool):
    import bench_mmchain as bm

    for name, spec in {**bm.FULL, **bm.EXTRA}.items():
        if (spec[0] == "csr") != csr:
            continue
        X, y, v, _ = bm.make_case(spec, CPU, seed=1)
        if csr:
            for strategy in ("scatter", "gather"):
                yield f"{name} {strategy}", lambda X=X, y=y, v=v, s=strategy: fusedml.mmchain(
                    X, y, v, backend="fused", config={"strategy": s})
        else:
            yield name, lambda X=X, y=y, v=v: fusedml.mmchain(X, y, v, backend="fused")
            yield f"{name} deterministic", lambda X=X, y=y, v=v: fusedml.mmchain(X, y, v, backend="fused",
                                                                                 deterministic=True)
        yield f"{name} matvec", lambda X=X, y=y: fusedml.matvec(X, y, backend="fused")


def _solver_calls():
    import bench_solver_ops as bs

    for spec in ("1000000x100", "2000000x256", "4000000x64", "1000000x100x3", "16000000x64x5", "2000000x256x5"):
        N, D, *m = (int(s) for s in spec.split("x"))
        m = m[0] if m else 1
        X, w, y, h = bs.make_case(N, D, m, CPU, seed=1)
        for name, (fn, _) in bs.passes(X, w, y, h, m).items():
            yield f"{spec} {name}", lambda fn=fn: fn("fused", None)


def _gmm_calls():
    import bench_gmm as bg

    for N, D, K, ct in bg.CONFIGS:
        X = torch.zeros(N, D)
        w = torch.full((K,), 1.0 / K, dtype=torch.float64)
        mu = 0.1 * torch.randn(K, D, dtype=torch.float64)
        pc = {"full": torch.eye(D, dtype=torch.float64).repeat(K, 1, 1), "tied": torch.eye(D, dtype=torch.float64),
              "diag": torch.ones(K, D, dtype=torch.float64), "spherical": torch.ones(K, dtype=torch.float64)}[ct]
        for path in ("auto", "single", "two_pass"):
            for prec in ("auto", "fp32") if ct in ("diag", "full") else ("fp32",):
                yield f"{N}x{D} K={K} {ct} {path} {prec}", lambda X=X, p=(w, mu, pc), ct=ct, path=path, prec=prec: (
                    fusedml.gmm_estep(X, *p, ct, backend="fused", path=path, precision=prec, check_finite=False))
        yield f"{N}x{D} K={K} {ct} score", lambda X=X, p=(w, mu, pc), ct=ct: fusedml.gmm_score(
            X, *p, ct, backend="fused")


def _kmeans_calls():
    import bench_kmeans as bk

    for N, D, K in bk.CASES:
        X = torch.zeros(N, D)
        yield f"{N}x{D} K={K}", lambda X=X, K=K: fusedml.lloyd_step(X, torch.randn(K, X.shape[1], dtype=torch.float64),
                                                                  backend="fused")


PARTS = {"mmchain": lambda: _mmchain_calls(False), "csr": lambda: _mmchain_calls(True), "solver": _solver_calls,
         "gmm": _gmm_calls, "kmeans": _kmeans_calls}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--match", default=None, help="only the calls whose name matches this regular expression")
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args(argv)
    import triton

    t0, launches, host_errors = time.time(), [], []
    for part in args.parts:
        with record_launches(execute=False) as rec:
            for name, call in PARTS[part]():
                if args.match and not re.search(args.match, name):
                    continue
                rec.origin = f"{part}: {name}"
                try:
                    call()
                except Exception as e:  # host code on uncomputed outputs: the launches so far are kept
                    host_errors.append(f"{part}: {name}: {type(e).__name__}: {str(e)[:160]}")
        launches += rec.launches
        print(f"{part}: {len(rec.launches)} distinct launches ({time.time() - t0:.0f} s)", flush=True)
    results = compile_descriptors(launches)
    bad = [r for r in results if "error" in r]
    spills = [r for r in results if "error" not in r and r["loop_spills"]]
    for r in results:
        print(r)
    for e in host_errors:
        print(f"HOST {e}")
    print(f"\ntriton {triton.__version__}: {len(results)} distinct launches, {len(bad)} do not compile or fit, "
          f"{len(spills)} spill inside a loop, {sum(r.get('stack', 0) > 0 for r in results)} use a stack; "
          f"{len(host_errors)} calls stopped on the host ({time.time() - t0:.0f} s)")
    for r in spills:
        print(f"SPILL {r}")
    for r in bad:
        print(f"FAIL {r}")
    if args.out:
        import json

        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "torch": torch.__version__, "target": "sm_90",
                       "parts": args.parts, "launches": results, "host_errors": host_errors}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
