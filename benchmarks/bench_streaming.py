"""Out-of-core streaming benchmark: StreamedMatrix iterations against the H2D transfer floor.

Measures, in one run:
1. pinned and pageable host-to-device bandwidth (1 GiB copies, medians);
2. for a dense dask array, a CSR one (mmchain) and a GMM E-step (diag): the time per iteration
   with ``max_gpu_bytes`` = a quarter of X (the rest streamed every iteration from pinned host
   memory), the transfer floor (streamed bytes / measured pinned bandwidth), the overlap achieved
   (1 = kernels fully hidden under copies, measured against the in-memory kernel time), and the
   same operator with EVERY chunk resident (one device matrix, one kernel launch per call;
   the run stops if the chunks do not all fit) against the in-memory tensor (target: within 10 %);
3. a short logistic-regression fit on the dask array streamed vs resident vs in-memory (when
   ``algorithms.LogisticRegression`` exists). A dask fit builds its StreamedMatrix (materialise
   + upload) inside ``fit``: that set-up is timed alone too, and ``solver_s = fit_s - setup_s``
   is compared with the in-memory fit of a tensor already on the device.

Targets: streamed within 1.25x of the transfer floor; resident within 10 % of in-memory.

Run from the repository root:
``python benchmarks/bench_streaming.py [--quick] [--scale S] [--reps R] [--out PATH]``.
``--quick`` uses tiny shapes (a CPU smoke run). JSON goes to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo (algorithms)
from _common import markdown_table, write_json  # noqa: E402

import dask.array as da  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import fusedml  # noqa: E402
from fusedml.mmchain import mmchain  # noqa: E402
from fusedml.streaming import StreamedMatrix  # noqa: E402


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn, reps):
    """Median wall milliseconds of ``fn`` (synchronised; streamed calls last tens of ms)."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def h2d_bandwidth(nbytes, reps):
    """(pinned, pageable) host-to-device GB/s, medians of ``reps`` copies of ``nbytes``."""
    if not torch.cuda.is_available():
        return float("nan"), float("nan")
    n = nbytes // 4
    dst = torch.empty(n, dtype=torch.float32, device="cuda")
    out = []
    for pin in (True, False):
        src = torch.empty(n, dtype=torch.float32, pin_memory=pin).fill_(1.0)
        ms = median_ms(lambda: dst.copy_(src, non_blocking=pin), reps)
        out.append(nbytes / (ms * 1e-3) / 1e9)
    return tuple(out)


def make_dense(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g).numpy()


def make_csr(n, d, nnz_row, seed=1):
    g = torch.Generator().manual_seed(seed)
    col = torch.randint(0, d, (n, nnz_row), generator=g, dtype=torch.int32)
    col, _ = torch.sort(col, dim=1)
    # Duplicate columns within a row: shift to keep indices strictly increasing (stay < d).
    col = torch.minimum(col + torch.arange(nnz_row, dtype=torch.int32), torch.tensor(d - 1, dtype=torch.int32))
    col = torch.cummax(col, dim=1).values
    val = torch.rand(n, nnz_row, generator=g)
    indptr = np.arange(0, n * nnz_row + 1, nnz_row, dtype=np.int64)
    A = sp.csr_matrix((val.numpy().ravel(), col.numpy().ravel(), indptr), shape=(n, d))
    A.sum_duplicates()  # the cummax can repeat a column at the end of a row: merge
    return A


def resident_engine(X, dev, block):
    """All chunks resident (no budget set: the operator may use memory as an in-memory call would)."""
    R = StreamedMatrix(X, device=dev, block_bytes=block)
    if R.resident_chunks != R.n_chunks:
        raise RuntimeError(f"'resident' must hold every chunk on the device, got {R.resident_chunks} of "
                           f"{R.n_chunks} (not enough free device memory: lower --scale)")
    return R


def case_row(name, S_stream, S_res, in_memory_fn, stream_fn, res_fn, bw, reps):
    """One table row: streamed time vs the transfer floor, resident vs in-memory.

    overlap = (floor + compute - streamed) / min(floor, compute) clipped to [0, 1], where compute
    is the in-memory kernel time scaled to the streamed fraction of X: 1 when the kernels hide
    entirely under the copies, 0 when copies and kernels run one after the other.
    """
    t_stream = median_ms(stream_fn(S_stream), reps)
    stream_blocks = S_stream.stats.blocks
    t_res = median_ms(res_fn(S_res), reps)
    res_blocks = S_res.stats.blocks
    t_mem = median_ms(in_memory_fn, reps)
    floor = S_stream.streamed_bytes / (bw * 1e9) * 1e3 if bw == bw else float("nan")
    frac = S_stream.streamed_bytes / S_stream.nbytes
    compute = t_mem * frac  # kernel time of the streamed part, were it in memory
    overlap = (floor + compute - t_stream) / min(floor, compute) if floor == floor and compute > 0 else float("nan")
    return {
        "case": name, "GB": S_stream.nbytes / 1e9, "chunks": S_stream.n_chunks,
        "resident_chunks": S_stream.resident_chunks, "streamed_GB": S_stream.streamed_bytes / 1e9,
        "blocks_per_call": stream_blocks,
        "streamed_ms": t_stream, "floor_ms": floor, "x_floor": t_stream / floor if floor == floor else float("nan"),
        "overlap": max(min(overlap, 1.0), 0.0) if overlap == overlap else float("nan"),
        "resident_all_chunks": S_res.resident_chunks == S_res.n_chunks, "resident_blocks_per_call": res_blocks,
        "resident_ms": t_res, "in_memory_ms": t_mem, "resident_vs_mem": t_res / t_mem,
        "h2d_GB_per_iter": S_stream.stats.h2d_bytes / 1e9,
    }


def mmchain_row(name, X, Xdev, budget, dev, block, pin_bw, reps):
    """One mmchain row: the streamed engine (``budget`` bytes on the GPU) and the all-resident one
    against ``Xdev``, the same matrix in device memory; ``rel_err`` of the streamed result."""
    S = StreamedMatrix(X, device=dev, max_gpu_bytes=budget, host_cache=True, block_bytes=block)
    R = resident_engine(X, dev, block)
    y = torch.randn(X.shape[1], device=dev)
    v = torch.rand(X.shape[0], device=dev)

    def call(M):
        return lambda: mmchain(M, y, v)

    row = case_row(name, S, R, call(Xdev), call, call, pin_bw, reps)
    w_s, w_m = mmchain(S, y, v).double(), mmchain(Xdev, y, v).double()
    row["rel_err"] = float((w_s - w_m).norm() / w_m.norm())
    print(row, file=sys.stderr)
    return row


def _iter_ms(est):
    """Mean ms per solver iteration from the fit's ``history_`` (set-up before iteration 0 excluded)."""
    h = [r["time"] for r in (getattr(est, "history_", None) or [])]
    return 1e3 * (h[-1] - h[0]) / (len(h) - 1) if len(h) > 1 else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the full run's row counts (GPU runs)")
    args = ap.parse_args(argv)
    quick = args.quick or not torch.cuda.is_available()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reps = args.reps or (2 if quick else 5)
    if quick:
        dense_shape, dense_chunk = (20_000, 32), 2_500
        csr_shape, csr_nnz, csr_chunk = (20_000, 5_000), 8, 2_500
        gmm_shape, gmm_k, gmm_chunk = (20_000, 8), 4, 2_500
        block = 1 << 16
    else:
        sc = lambda n: max(1, int(n * args.scale))  # noqa: E731
        dense_shape, dense_chunk = (sc(8_000_000), 128), sc(500_000)      # 4.1 GB fp32, 16 chunks
        csr_shape, csr_nnz, csr_chunk = (sc(8_000_000), 100_000), 32, sc(500_000)  # 2.0 GB + row pointers
        gmm_shape, gmm_k, gmm_chunk = (sc(32_000_000), 16), 16, sc(2_000_000)      # 2.0 GB
        block = 64 << 20
    pin_bw, page_bw = h2d_bandwidth(1 << 30, 5) if not quick else (float("nan"), float("nan"))
    print(f"H2D bandwidth: pinned {pin_bw:.1f} GB/s, pageable {page_bw:.1f} GB/s", file=sys.stderr)
    rows = []

    # -- dense mmchain
    A = make_dense(*dense_shape).astype(np.float32)
    X = da.from_array(A, chunks=(dense_chunk, dense_shape[1]))
    rows.append(mmchain_row("mmchain dense fp32", X, torch.from_numpy(A).to(dev), A.nbytes // 4, dev, block,
                            pin_bw, reps))
    del A, X

    # -- CSR mmchain
    B = make_csr(*csr_shape, csr_nnz)
    Xs = da.from_array(B, chunks=(csr_chunk, csr_shape[1]), asarray=False)
    rows.append(mmchain_row("mmchain CSR fp32", Xs, fusedml.as_csr(B).to(dev), (B.data.nbytes + B.indices.nbytes) // 4,
                            dev, block, pin_bw, reps))
    del B, Xs

    # -- GMM E-step (diag)
    from fusedml.gmm import gmm_estep

    G = make_dense(*gmm_shape, seed=3).astype(np.float32)
    Xg = da.from_array(G, chunks=(gmm_chunk, gmm_shape[1]))
    K, D = gmm_k, gmm_shape[1]
    gen = torch.Generator().manual_seed(4)
    wts = torch.full((K,), 1.0 / K, dtype=torch.float64)
    mu = torch.randn(K, D, generator=gen, dtype=torch.float64).to(dev)
    pc = torch.ones(K, D, dtype=torch.float64).to(dev)
    wts = wts.to(dev)
    S = StreamedMatrix(Xg, device=dev, max_gpu_bytes=G.nbytes // 4, host_cache=True, block_bytes=block)
    R = resident_engine(Xg, dev, block)
    Gt = torch.from_numpy(G).to(dev)
    est = lambda M: (lambda: gmm_estep(M, wts, mu, pc, "diag", center=mu, check_finite=False))  # noqa: E731
    rows.append(case_row(f"gmm_estep diag K={K}", S, R, est(Gt), est, est, pin_bw, reps))
    a, b = est(S)(), est(Gt)()
    rows[-1]["rel_err"] = float((a.nk - b.nk).norm() / b.nk.norm())
    del S, R, Gt, Xg
    print(rows[-1], file=sys.stderr)

    # -- logistic regression fit, streamed vs resident (estimators build the StreamedMatrix)
    try:
        from algorithms import LogisticRegression
    except ImportError:
        LogisticRegression = None
    if LogisticRegression is not None:
        n, d = (20_000, 8) if quick else (4_000_000, 128)
        A = make_dense(n, d, seed=5).astype(np.float32)
        yv = (A[:, :4].sum(1) + np.random.default_rng(0).logistic(size=n) > 0).astype(np.int64)
        X = da.from_array(A, chunks=(n // 16, d))
        fits = {}
        for label, opts in (("streamed", {"max_gpu_bytes": A.nbytes // 4, "host_cache": True}),
                            ("resident", {"max_gpu_bytes": None})):
            with fusedml.streaming.options(**opts):
                # the fit builds its own StreamedMatrix (materialise + upload): time that set-up
                # alone too, so that the solver's time can be compared with the in-memory fit
                t0 = time.perf_counter()
                M = StreamedMatrix(X, device=dev)
                sync()
                setup = time.perf_counter() - t0
                if label == "resident" and M.resident_chunks != M.n_chunks:
                    raise RuntimeError("the resident fit does not hold every chunk on the device; lower --scale")
                del M
                t0 = time.perf_counter()
                m = LogisticRegression(C=1.0, max_iter=20, tol=1e-6).fit(X, yv)
                sync()
                fits[label] = (time.perf_counter() - t0, setup, int(np.ravel(m.n_iter_)[0]), _iter_ms(m))
        At = torch.from_numpy(A).to(dev)
        sync()
        t0 = time.perf_counter()
        m = LogisticRegression(C=1.0, max_iter=20, tol=1e-6).fit(At, yv)
        sync()
        fits["in-memory"] = (time.perf_counter() - t0, 0.0, int(np.ravel(m.n_iter_)[0]), _iter_ms(m))
        mem_solver, mem_iter = fits["in-memory"][0], fits["in-memory"][3]
        for label, (sec, setup, it, iter_ms) in fits.items():
            rows.append({"case": f"LogisticRegression fit {label}", "GB": A.nbytes / 1e9, "fit_s": sec,
                         "setup_s": setup, "solver_s": sec - setup, "solver_vs_mem": (sec - setup) / mem_solver,
                         "iter_ms": iter_ms, "iter_vs_mem": iter_ms / mem_iter if iter_ms and mem_iter else None,
                         "iters": it})
        del A, X, At

    path = write_json("streaming", rows, {"args": vars(args), "pinned_GBps": pin_bw, "pageable_GBps": page_bw},
                      out=args.out)
    print(f"wrote {path}", file=sys.stderr)
    print(f"\nH2D pinned {pin_bw:.1f} GB/s, pageable {page_bw:.1f} GB/s; targets: streamed <= 1.25x floor, "
          "resident <= 1.10x in-memory\n")
    print(markdown_table(rows, ["case", "GB", "chunks", "resident_chunks", "streamed_ms", "floor_ms", "x_floor",
                                "overlap", "resident_ms", "in_memory_ms", "resident_vs_mem", "rel_err", "fit_s",
                                "setup_s", "solver_s", "solver_vs_mem", "iter_ms", "iter_vs_mem", "iters"]))


if __name__ == "__main__":
    main()
