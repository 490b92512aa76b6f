"""Probe: the GMM E-step and the k-means Lloyd step on rows that are not whole 16-byte vectors.

Session 40 found the linear kernels reading rows of e.g. 55 fp32 values with scalar loads (the row
stride is not a multiple of the 16-byte vector) and session 41 gave the linear fits a padded copy
(``fusedml.aligned_rows``). This times, per width, one fused ``gmm_estep`` (default path and
precision) and one fused ``lloyd_step`` on X as given and on its aligned view, beside the aligned
width itself (e.g. 15 against 16), each against the read-once floor of the unpadded X (bytes / the
H200's 4.28 TB/s, as every table here; on other GPUs only a scale), plus the
copy; and the relative difference of the aligned view's statistics from X's (same data, so ~1e-7).
The E-step also runs with its kernels' ``VEC`` forced to 1 ("VEC 1": row loads as before session 43).
With ``--fits N``: whole fused ``KMeans`` and ``GaussianMixture`` (k-means start) fits with
``FUSEDML_ALIGN_ROWS=0`` (X as given) and ``auto`` (the fit's own copy where it reads it),
alternating, medians of N, iterations and results side by side.

    python benchmarks/gmm_odd_width_probe.py [--only 4194304x15x16:diag ...] [--fits 7] [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/gmm_odd_width_probe.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if "--quick" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import fusedml  # noqa: E402
from bench_gmm import make_problem  # noqa: E402
from fusedml.mmchain.dense import aligned_rows  # noqa: E402

#: (N, D, K, covariance_type): odd widths beside the aligned one
CASES = [(4 << 20, 15, 16, "diag"), (4 << 20, 16, 16, "diag"), (4 << 20, 13, 8, "diag"),
         (2 << 20, 31, 32, "diag"), (2 << 20, 32, 32, "diag"), (1 << 20, 61, 64, "diag"),
         (1 << 20, 15, 16, "full"), (1 << 20, 16, 16, "full"), (4 << 20, 6, 8, "spherical")]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _with_vec(on, run):
    """``run()``, with the GMM E-step kernels' ``VEC`` forced to 1 unless ``on``."""
    from fusedml.gmm import fused

    real = fused._vec
    if not on:
        fused._vec = lambda X, D: 1
    try:
        return run()
    finally:
        fused._vec = real


def _fits(X, K, ct, n, base, dev):
    """Whole fused fits with FUSEDML_ALIGN_ROWS=0 / auto, alternating; median ms, iterations, result."""
    from algorithms import GaussianMixture, KMeans

    makers = {"KMeans fit": lambda: KMeans(K, n_init=1, random_state=0, backend="fused"),
              "GaussianMixture fit": lambda: GaussianMixture(K, covariance_type=ct, random_state=0, backend="fused")}
    rows = []
    for name, make in makers.items():
        ts = {"0": [], "auto": []}
        last = {}
        for i in range(n + 1):
            for mode in ts:
                os.environ["FUSEDML_ALIGN_ROWS"] = mode
                _sync(dev)
                t0 = time.perf_counter()
                est = make().fit(X)
                _sync(dev)
                if i:
                    ts[mode].append(1e3 * (time.perf_counter() - t0))
                last[mode] = est
        os.environ.pop("FUSEDML_ALIGN_ROWS", None)
        for mode, t in ts.items():
            est = last[mode]
            result = est.inertia_ if name.startswith("KMeans") else est.lower_bound_
            rows.append(dict(base, **{"pass": name, "variant": f"FUSEDML_ALIGN_ROWS={mode}", "ms": statistics.median(t),
                                      "n_iter": int(est.n_iter_), "result": float(result)}))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="NxDxK:covariance cases instead of the default list")
    ap.add_argument("--fits", type=int, default=0, help="whole KMeans / GaussianMixture fits per setting (0: none)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    cases = CASES
    if args.only:
        cases = []
        for s in args.only:
            shape, _, ct = s.partition(":")
            n, d, k = (int(t) for t in shape.split("x"))
            cases.append((n, d, k, ct or "diag"))
    rows = []
    for N, D, K, ct in cases:
        if args.quick:
            N = 64
        X, w, mu, pc = make_problem(N, D, K, ct, dev)
        Xv = aligned_rows(X)
        floor_ms = X.numel() * X.element_size() / _common.H200_BANDWIDTH * 1e3
        base = {"N": N, "D": D, "K": K, "cov": ct, "row_stride": X.stride(0), "floor_ms": floor_ms}
        passes = {
            "gmm_estep": lambda A: fusedml.gmm_estep(A, w, mu, pc, ct, backend="fused", check_finite=False),
            "lloyd_step": lambda A: fusedml.lloyd_step(A, mu, backend="fused", check_finite=False),
        }
        for name, fn in passes.items():
            want, got = fn(X), fn(Xv)
            if name == "gmm_estep":
                err = max(_rel(getattr(got, f), getattr(want, f)) for f in ("nk", "s1", "s2"))
            else:
                err = max(_rel(got.sums, want.sums), _rel(got.counts, want.counts))
            variants = [("as given", X, True)] + ([(f"aligned view (stride {Xv.stride(0)})", Xv, True)]
                                                  if Xv is not X else [])
            if name == "gmm_estep":  # the E-step kernels' row loads without VEC (scalar where D is odd)
                variants += [(f"{v}, VEC 1", A, False) for v, A, _ in variants]
            for variant, A, vec in variants:
                ms = _with_vec(vec, lambda: _common.bench_ms(lambda: fn(A)))
                rows.append(dict(base, **{"pass": name, "variant": variant, "ms": ms, "floor_pct": 100 * floor_ms / ms,
                                          "aligned_vs_plain_rel": err if A is not X else None}))
        if Xv is not X:
            ms = _common.bench_ms(lambda: aligned_rows(X))
            rows.append(dict(base, **{"pass": "aligned_rows copy", "variant": f"to {Xv.stride(0)}", "ms": ms,
                                      "floor_pct": 100 * floor_ms / ms}))
        if args.fits:
            rows += _fits(X, K, ct, args.fits, base, dev)
    cols = ["N", "D", "K", "cov", "pass", "variant", "ms", "floor_pct", "aligned_vs_plain_rel", "n_iter", "result"]
    path = _common.write_json("gmm_odd_width_probe", rows, {"args": vars(args)}, out=args.out)
    print(_common.markdown_table(rows, cols))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
