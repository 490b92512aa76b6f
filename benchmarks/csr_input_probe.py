"""What a whole CSR fit pays for being given a torch sparse CSR tensor instead of a ``CSRMatrix``.

The fused CSR kernels cache what they derive from a matrix (row and column statistics, the
cache-blocked streams) with a ``fusedml.CSRMatrix``, and the "ops" backend its transpose. A torch
sparse tensor was converted on every fit, so each fit rebuilt them (+37 ms a fused fit,
``csr_input_probe-H100-2026-12-07-s50``); since session 50 fits reuse one CSRMatrix while the
tensor's contents are unchanged (``as_csr_remembered``: a hash of them, one read a fit; README,
"Repeated calls on one CSR matrix"). This script fits the same seeded matrix given both ways
(the torch tensor shares the CSRMatrix's memory), alternating fit by fit after a warm fit each, and
reports the median wall time of each, per fit and backend, and the difference.

    python benchmarks/csr_input_probe.py [--shape 1000000x100000] [--csr 32:powerlaw]
        [--algos logistic poisson] [--backends fused ops] [--fits 5] [--out FILE]

Without CUDA it runs a tiny shape under the interpreter (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _common  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1000000x100000")
    ap.add_argument("--csr", default="32:powerlaw", metavar="NNZ:PROFILE")
    ap.add_argument("--algos", nargs="+", default=["logistic", "poisson"])
    ap.add_argument("--backends", nargs="+", default=["fused", "ops"])
    ap.add_argument("--fits", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = _common.device()
    N, D = _common.shape_list(a.shape)[0] if dev.type == "cuda" else (400, 300)
    nnz, prof = a.csr.split(":")
    M, cases = _common.csr_fit_cases(N, D, dev, float(nnz), prof)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        T = torch.sparse_csr_tensor(M.crow, M.col, M.val, M.shape)
    inputs = {"CSRMatrix": M, "torch sparse": T}

    rows = []
    for algo in a.algos:
        make_be, y = cases[algo]
        for be in a.backends:  # after a warm fit each (compiles, the CSRMatrix's caches)
            ms, last = _common.alternate_fits(lambda: make_be(be), inputs, y, tuple(inputs), lambda k: (lambda: None),
                                              a.fits, dev)
            med = {k: statistics.median(v) for k, v in ms.items()}
            coef = {k: torch.as_tensor(e.coef_).double().cpu().flatten() for k, e in last.items()}  # numpy or torch
            diff = float((coef["torch sparse"] - coef["CSRMatrix"]).norm() / coef["CSRMatrix"].norm().clamp_min(1e-300))
            rows.append(dict(shape=f"{N}x{D}", algo=algo, backend=be, csrmatrix_ms=med["CSRMatrix"],
                             torch_sparse_ms=med["torch sparse"], extra_ms=med["torch sparse"] - med["CSRMatrix"],
                             n_iter=int(torch.as_tensor(last["CSRMatrix"].n_iter_).max()),
                             coef_rel_diff=diff, fits_csrmatrix=ms["CSRMatrix"], fits_torch_sparse=ms["torch sparse"]))
    print(_common.markdown_table(rows, ["shape", "algo", "backend", "csrmatrix_ms", "torch_sparse_ms", "extra_ms",
                                        "n_iter", "coef_rel_diff"]))
    if a.out or dev.type == "cuda":
        print(_common.write_json("csr_input_probe", rows, {"args": vars(a)}, out=a.out))
    return rows


if __name__ == "__main__":
    main()
