"""Multi-GPU scaling of the dask.distributed path (``fusedml.distributed.fit_distributed``).

    python benchmarks/bench_distributed.py [--gpus 1 2 4] [--rows N] [--out PATH]

For each worker count (one Dask worker process per GPU, ``local_gpu_cluster``; on a host
without GPUs, CPU worker processes and small data): logistic regression on dense and on CSR data,
and the Gaussian mixture, on the SAME data (strong scaling: the rows split evenly over the
workers, each GPU holding its share). Reported per case: time per iteration (the fit's
distributed iterations, data already resident on the workers), scaling efficiency
``t_1 / (n t_n)``, the bytes that travel between processes per iteration (parameters sent to
every partition plus the partial results of the tree reduction: measured from the objects'
sizes, not modelled) and the relative difference of the fitted model to the one-worker model.
Data are generated on the workers from a seed (nothing of size N crosses the network).
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402


def _dense_chunk(i, rows, d, seed):
    rng = np.random.default_rng([seed, i])
    X = rng.standard_normal((rows, d), dtype=np.float32)
    w = np.random.default_rng(seed).standard_normal(d)
    y = (X @ w + rng.logistic(size=rows) > 0).astype(np.float32)
    return X, y


def _csr_chunk(i, rows, d, nnz_row, seed):
    import scipy.sparse as sp

    rng = np.random.default_rng([seed, i])
    col = rng.integers(0, d, size=rows * nnz_row).astype(np.int32)
    X = sp.csr_matrix((rng.standard_normal(rows * nnz_row).astype(np.float32), col,
                       np.arange(0, rows * nnz_row + 1, nnz_row, dtype=np.int64)), shape=(rows, d))
    X.sum_duplicates()
    X.sort_indices()
    w = np.random.default_rng(seed).standard_normal(d)
    y = (X @ w + rng.logistic(size=rows) > 0).astype(np.float32)
    return X, y


def _gmm_chunk(i, rows, d, k, seed):
    rng = np.random.default_rng([seed, i])
    means = np.random.default_rng(seed).standard_normal((k, d)) * 4
    lab = rng.integers(0, k, size=rows)
    return (means[lab] + rng.standard_normal((rows, d))).astype(np.float32), None


def make_dask(kind, n, d, chunks, seed, **kw):
    """Row-chunked dask arrays ``(X, y)`` whose chunks are generated where they are computed."""
    import dask
    import dask.array as da
    import scipy.sparse as sp

    gen = {"dense": _dense_chunk, "csr": _csr_chunk, "gmm": _gmm_chunk}[kind]
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    xs, ys = [], []
    for i in range(chunks):
        r = int(bounds[i + 1] - bounds[i])
        part = dask.delayed(gen, pure=True, nout=2)(i, r, d, *kw.values(), seed)
        meta = sp.csr_matrix((0, d), dtype=np.float32) if kind == "csr" else np.empty((0, d), np.float32)
        xs.append(da.from_delayed(part[0], shape=(r, d), dtype=np.float32, meta=meta))
        ys.append(da.from_delayed(part[1], shape=(r,), dtype=np.float32) if kind != "gmm" else None)
    X = da.concatenate(xs, axis=0)
    return X, (None if kind == "gmm" else da.concatenate(ys))


class _Traffic:
    """Counts pickled bytes of what the design's map/reduce sends and gets back per call."""

    def __init__(self, design):
        self.bytes = 0
        self.calls = 0
        orig = design._map_reduce

        def counted(fn, *args):
            out = orig(fn, *args)
            n_parts = design.n_partitions
            sent = len(pickle.dumps(args)) * n_parts  # the parameters go to every partition's task
            back = len(pickle.dumps(out))
            # tree reduction: every partition's partial result (same size as the sum) moves once
            self.bytes += sent + back * n_parts
            self.calls += 1
            return out

        design._map_reduce = counted


def run(kind, n_workers, args, on_gpu):
    import distributed

    from algorithms import GaussianMixture, LogisticRegression
    from fusedml import distributed as fd

    n, d = args.rows, {"dense": args.dense_d, "csr": args.csr_d, "gmm": args.gmm_d}[kind]
    extra = {"nnz_row": args.nnz_per_row} if kind == "csr" else ({"k": args.gmm_k} if kind == "gmm" else {})
    chunks = args.chunks_per_worker * max(args.gpus)  # the same partitions for every worker count
    cluster = fd.local_gpu_cluster(n_workers=n_workers, threads_per_worker=1)
    client = distributed.Client(cluster)
    try:
        X, y = make_dask(kind, n, d, chunks, args.seed, **extra)
        def make(max_iter):
            if kind == "gmm":
                return GaussianMixture(args.gmm_k, covariance_type="diag", max_iter=max_iter, tol=0.0, random_state=0)
            return LogisticRegression(C=1.0, max_iter=max_iter, tol=1e-12)

        def fit(est):
            if kind == "gmm":
                return fd._fit_gmm(est, design, 0, 10_000)
            return fd._fit_logistic(est, design, "auto", 0)

        design = fd.DistributedDesign(X, y, client=client, backend="auto").wait()
        fit(make(1))  # warm-up: device copies and kernel compilation on every worker
        traffic = _Traffic(design)
        est = make(args.iters)
        t0 = time.perf_counter()
        fit(est)
        fit_s = time.perf_counter() - t0
        iters = max(1, len(est.history_ or []))
        model = np.concatenate([np.ravel(est.means_)] if kind == "gmm" else [np.ravel(est.coef_), np.ravel(est.intercept_)])
        design.close()
        return {"case": kind, "workers": n_workers, "device": "cuda" if on_gpu else "cpu", "N": n, "D": d,
                "partitions": chunks, "fit_s": fit_s, "iters": iters, "calls": traffic.calls,
                "ms_per_iter": 1e3 * fit_s / iters, "bytes_per_iter": traffic.bytes / iters, "model": model}
    finally:
        client.close()
        cluster.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dense-d", type=int, default=64)
    p.add_argument("--csr-d", type=int, default=50_000)
    p.add_argument("--nnz-per-row", type=int, default=16)
    p.add_argument("--gmm-d", type=int, default=16)
    p.add_argument("--gmm-k", type=int, default=16)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--chunks-per-worker", type=int, default=2)
    p.add_argument("--parts", nargs="+", default=["dense", "csr", "gmm"], choices=["dense", "csr", "gmm"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="CPU workers, small data (smoke run)")
    p.add_argument("--out", help="JSON path (default benchmarks/results/distributed-<gpu>-<date>.json)")
    args = p.parse_args(argv)
    import torch

    warnings.simplefilter("ignore", RuntimeWarning)  # fixed iteration counts: "did not converge" is expected

    on_gpu = torch.cuda.is_available() and not args.quick
    avail = torch.cuda.device_count() if on_gpu else 2
    if args.quick or not on_gpu:
        args.rows, args.dense_d, args.csr_d, args.gmm_d, args.gmm_k = 20_000, 16, 2_000, 4, 3
        args.iters = min(args.iters, 5)
    skipped = [g for g in args.gpus if g > avail]
    args.gpus = [g for g in args.gpus if g <= avail]
    rows = []
    for kind in args.parts:
        base = None
        for g in args.gpus:
            try:
                r = run(kind, g, args, on_gpu)
            except Exception as e:  # noqa: BLE001 - record and go on
                rows.append({"case": kind, "workers": g, "error": f"{type(e).__name__}: {e}"[:300]})
                print(rows[-1], flush=True)
                continue
            model = r.pop("model")
            if base is None:
                base, base_model = r, model
            r["efficiency"] = base["ms_per_iter"] * base["workers"] / (r["ms_per_iter"] * g)
            r["model_rel_diff_vs_first"] = float(np.linalg.norm(model - base_model) /
                                                 max(np.linalg.norm(base_model), 1e-300))
            rows.append(r)
            print(r, flush=True)
    path = _common.write_json("distributed", rows, {"args": vars(args), "gpus_not_available": skipped}, args.out)
    print(f"\nwrote {path}\n")
    if skipped:
        print(f"not run: {skipped} workers (this machine has {avail} GPU(s))")
    print(_common.markdown_table(rows, ["case", "workers", "device", "N", "D", "iters", "ms_per_iter", "efficiency",
                                        "bytes_per_iter", "model_rel_diff_vs_first", "error"]))


if __name__ == "__main__":
    main()
