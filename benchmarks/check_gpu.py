"""Correctness of the compiled kernels on a real GPU (the interpreter can hide races and tf32).

Every case draws fresh random inputs, poisons nothing it does not own, and compares the fused
result with a float64 reference computed on the same device. Prints one line per case and exits
non-zero if any case fails its tolerance.

    python benchmarks/check_gpu.py [--parts mmchain loss_gradient kmeans gmm cg] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import torch

import fusedml
from fusedml.mmchain import csr

TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 2e-3}
ROWS = []


def rel(a, b, floor=1e-300):
    """Relative norm error; ``floor`` bounds the denominator for near-zero references."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(floor))


def record(name, err, tol):
    ok = err <= tol and err == err
    ROWS.append({"case": name, "rel_err": err, "tol": tol, "ok": ok})
    print(f"{'ok  ' if ok else 'FAIL'} {name:60s} rel_err={err:.2e} tol={tol:.0e}", flush=True)


def ref_mmchain(Xd, y, v, z, alpha, beta, intercept=False, v_op="mul"):
    """Float64 literal formula on a dense float64 copy of X."""
    if intercept:
        Xd = torch.cat([Xd, torch.ones(Xd.shape[0], 1, dtype=Xd.dtype, device=Xd.device)], 1)
    if y is None:
        p = v.double()
    else:
        t = Xd @ y.double()
        vv = torch.ones_like(t) if v is None else v.double()
        if vv.ndim == 1 and t.ndim == 2:
            vv = vv[:, None]
        p = vv * t
        if v_op == "softmax":
            p = p - vv * p.sum(1, keepdim=True)
    w = alpha * (Xd.T @ p)
    if z is not None:
        w = w + beta * z.double()
    return w


def random_csr(n, d, nnz_row, dev, powerlaw=False, index_dtype=torch.int32, dtype=torch.float32):
    g = torch.Generator(device=dev).manual_seed(int(time.time_ns() % 2**31))
    if powerlaw:
        lens = torch.full((n,), nnz_row, device=dev, dtype=torch.int64)
        heavy = torch.randint(0, n, (max(1, n // 2000),), device=dev, generator=g)
        lens[heavy] = min(d, 20000)
        lens[:3] = 0  # empty rows
    else:
        lens = torch.randint(0, 2 * nnz_row + 1, (n,), device=dev, generator=g).clamp_max(d)
    crow = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    crow[1:] = lens.cumsum(0)
    nnz = int(crow[-1])
    # Sorted unique columns per row: random keys, then sort within rows by (row, col).
    row = torch.repeat_interleave(torch.arange(n, device=dev), lens)
    col = torch.randint(0, d, (nnz,), device=dev, generator=g)
    key = row * d + col
    key = torch.unique(key)  # sorted, unique
    row, col = key // d, key % d
    lens = torch.bincount(row, minlength=n)
    crow = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    crow[1:] = lens.cumsum(0)
    val = torch.randn(col.numel(), device=dev, generator=g).to(dtype)
    return fusedml.CSRMatrix(crow.to(index_dtype), col.to(index_dtype), val, (n, d))


def check_mmchain(dev):
    for (n, d) in [(1, 1), (1000, 1), (3, 7000), (100_003, 37), (200_000, 128), (20_001, 513),
                   (4096, 2048), (1000, 20_000), (64, 100_000)]:
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            if dtype == torch.float64 and n * d > 3e7:
                continue
            X = torch.randn(n, d, device=dev).to(dtype)
            y = torch.randn(d, device=dev)
            v = torch.rand(n, device=dev)
            z = torch.randn(d, device=dev)
            acc = torch.float64 if dtype == torch.float64 else torch.float32
            w = fusedml.mmchain(X, y.to(acc), v.to(acc), z.to(acc), 0.7, -1.3, backend="fused")
            record(f"dense {n}x{d} {str(dtype)[6:]}", rel(w, ref_mmchain(X.double(), y, v, z, 0.7, -1.3)), TOL[dtype])
    # the cooperative wide-row kernel at the benchmark's shape (16 programs per row, 16 row groups
    # in one launch): atomics and deterministic, with the intercept, and X^T v
    Xw = torch.randn(4096, 65536, device=dev)
    Xw64 = Xw.double()
    yw, vw, zw = torch.randn(65537, device=dev), torch.rand(4096, device=dev), torch.randn(65537, device=dev)
    for det in (False, True):
        w = fusedml.mmchain(Xw, yw, vw, zw, 0.7, -1.3, intercept=True, deterministic=det, backend="fused")
        record(f"dense coop 4096x65536 intercept det={det}",
               rel(w, ref_mmchain(Xw64, yw, vw, zw, 0.7, -1.3, intercept=True)), TOL[torch.float32])
    record("dense coop 4096x65536 X^T v", rel(fusedml.mmchain(Xw, None, vw, backend="fused"),
                                              ref_mmchain(Xw64, None, vw, None, 1, 0)), TOL[torch.float32])
    del Xw, Xw64
    # strided / transposed X, matrix y, intercept, softmax, X^T v, deterministic.
    X = torch.randn(3000, 300, device=dev)
    Xt = torch.randn(300, 3000, device=dev).T
    y = torch.randn(300, device=dev)
    record("dense column-major 3000x300", rel(fusedml.mmchain(Xt, y, backend="fused"), ref_mmchain(Xt.double(), y, None, None, 1, 0)), TOL[torch.float32])
    record("dense row-sliced X[:, ::2]", rel(fusedml.mmchain(X[:, ::2], y[:150], backend="fused"), ref_mmchain(X[:, ::2].double(), y[:150], None, None, 1, 0)), TOL[torch.float32])
    for m in (1, 4, 16):
        Y = torch.randn(300, m, device=dev)
        V = torch.rand(3000, m, device=dev)
        record(f"dense matrix-y m={m}", rel(fusedml.mmchain(X, Y, V, backend="fused"), ref_mmchain(X.double(), Y, V, None, 1, 0)), TOL[torch.float32])
        record(f"dense softmax m={m}", rel(fusedml.mmchain(X, Y, V, v_op="softmax", backend="fused"), ref_mmchain(X.double(), Y, V, None, 1, 0, v_op="softmax")), 5e-5)
    for d in (64, 100, 256):  # m = 5..8 (unrolled as launch.unrolled_wide_m says)
        Xs = torch.randn(20_011, d, device=dev)
        for m in (5, 6, 8):
            Y, Z = torch.randn(d + 1, m, device=dev), torch.randn(d + 1, m, device=dev)
            V = torch.rand(20_011, m, device=dev)
            for v_op in ("softmax", "mul"):
                record(f"dense {v_op} intercept m={m} 20011x{d}",
                       rel(fusedml.mmchain(Xs, Y, V, Z, 0.9, 0.3, intercept=True, v_op=v_op, backend="fused"),
                           ref_mmchain(Xs.double(), Y, V, Z, 0.9, 0.3, intercept=True, v_op=v_op)), 5e-5)
            record(f"dense plain m={m} 20011x{d}", rel(fusedml.mmchain(Xs, Y[:d], V, backend="fused"),
                                                       ref_mmchain(Xs.double(), Y[:d], V, None, 1, 0)), TOL[torch.float32])
    yi = torch.randn(301, device=dev)
    v = torch.rand(3000, device=dev)
    record("dense intercept", rel(fusedml.mmchain(X, yi, v, intercept=True, backend="fused"), ref_mmchain(X.double(), yi, v, None, 1, 0, intercept=True)), TOL[torch.float32])
    u = torch.randn(3000, device=dev)
    record("dense X^T v (y=None)", rel(fusedml.mmchain(X, None, u, backend="fused"), ref_mmchain(X.double(), None, u, None, 1, 0)), TOL[torch.float32])
    record("dense matvec", rel(fusedml.matvec(X, y, backend="fused"), X.double() @ y.double()), TOL[torch.float32])
    Xb = torch.randn(500_000, 64, device=dev)
    yb = torch.randn(64, device=dev)
    w1 = fusedml.mmchain(Xb, yb, deterministic=True, backend="fused")
    same = all(torch.equal(w1, fusedml.mmchain(Xb, yb, deterministic=True, backend="fused")) for _ in range(5))
    record("dense deterministic bitwise repeat", 0.0 if same else 1.0, 0.0)

    for (n, d, k, pl, idx) in [(1, 5, 3, False, torch.int32), (50_000, 1000, 8, False, torch.int32),
                               (200_000, 100_000, 32, False, torch.int32), (100_000, 50_000, 5, True, torch.int32),
                               (20_000, 3000, 16, False, torch.int64)]:
        A = random_csr(n, d, k, dev, powerlaw=pl, index_dtype=idx)
        Xd = A.to_dense().double() if n * d < 2e9 else None
        y = torch.randn(d, device=dev)
        v = torch.rand(n, device=dev)
        name = f"csr {n}x{d} nnz/row~{k}{' powerlaw' if pl else ''} {str(idx)[6:]}"
        if Xd is None:
            continue
        record(name, rel(fusedml.mmchain(A, y, v, backend="fused"), ref_mmchain(Xd, y, v, None, 1, 0)), TOL[torch.float32])
        for m in (3, 4, 5):  # rows of y / w / p padded to a power of two (session 26); m = 3 in both strategies
            Y = torch.randn(d, m, device=dev)
            V = torch.rand(n, m, device=dev)
            for st in ("scatter", "gather") if m == 3 else ("auto",):
                record(name + f" m={m}{'' if st == 'auto' else ' ' + st}",
                       rel(fusedml.mmchain(A, Y, V, backend="fused", config={"strategy": st}),
                           ref_mmchain(Xd, Y, V, None, 1, 0)), TOL[torch.float32])
            record(name + f" matvec m={m}", rel(fusedml.matvec(A, Y, backend="fused"), Xd @ Y.double()),
                   TOL[torch.float32])
        yi = torch.randn(d + 1, device=dev)
        record(name + " intercept", rel(fusedml.mmchain(A, yi, v, intercept=True, backend="fused"), ref_mmchain(Xd, yi, v, None, 1, 0, intercept=True)), TOL[torch.float32])
        record(name + " matvec", rel(fusedml.matvec(A, y, backend="fused"), Xd @ y.double()), TOL[torch.float32])
        w1 = fusedml.mmchain(A, y, v, deterministic=True, backend="fused")
        same = torch.equal(w1, fusedml.mmchain(A, y, v, deterministic=True, backend="fused"))
        record(name + " deterministic", rel(w1, ref_mmchain(Xd, y, v, None, 1, 0)) if same else 1.0, TOL[torch.float32])
        if n >= 50_000:  # the cache-blocked streams, forced: 1 KB tiles of any vector (both passes tiled)
            cfg = {"strategy": "gather", "tile_bytes": 1024}
            l1, csr.L1_VECTOR_BYTES = csr.L1_VECTOR_BYTES, 0
            try:
                record(name + " streams", rel(fusedml.mmchain(A, yi, v, intercept=True, backend="fused", config=cfg),
                                              ref_mmchain(Xd, yi, v, None, 1, 0, intercept=True)), TOL[torch.float32])
                record(name + " streams matvec", rel(fusedml.matvec(A, y, backend="fused", config=cfg),
                                                     Xd @ y.double()), TOL[torch.float32])
            finally:
                csr.L1_VECTOR_BYTES = l1


def _lg_target(loss, n, m, dev):
    """Random targets of ``loss`` [n, m]: 0/1, -1/+1, one-hot rows, normal or positive observations."""
    if loss == "logistic":
        return (torch.rand(n, m, device=dev) < 0.4).float()
    if loss == "squared_hinge":
        return torch.where(torch.rand(n, m, device=dev) < 0.5, -1.0, 1.0)
    if loss == "multinomial":
        return torch.nn.functional.one_hot(torch.randint(0, m, (n,), device=dev), m).float()
    if loss == "squared_error":
        return torch.randn(n, m, device=dev)
    return 2 * torch.rand(n, m, device=dev) + 0.05


def _check_lg(name, M, X, W, y, loss, power, dev, with_eta):
    """One weighted ``loss_gradient`` of ``M`` (dense, or X as CSR) with the intercept and ``z = W``
    against float64 from the dense X: grad, loss, Hessian weights (and eta)."""
    from fusedml.mmchain.lossgrad import loss_terms

    n = X.shape[0]
    c = torch.rand(n, device=dev)
    r = fusedml.loss_gradient(M, W, y, loss=loss, power=power, sample_weight=c, alpha=0.5, z=W, beta=0.1,
                              intercept=True, backend="fused")
    A = torch.cat([X.double(), torch.ones(n, 1, dtype=torch.float64, device=dev)], 1)
    eta = A @ W.double()
    val, g, h = loss_terms(loss, eta, y.double(), power)
    record(name + " grad", rel(r.grad, 0.5 * A.T @ (g * c.double()[:, None]) + 0.1 * W.double()), TOL[torch.float32])
    record(name + " loss", rel(r.loss, (val * c.double()[:, None]).sum(0), floor=1e-30), TOL[torch.float32])
    # the squared hinge's l'' is a step at y eta = 1: an eta within fp32 rounding of the kink
    # may land on either side, so those rows (|1 - y eta| < 1e-5) are left out of the check
    keep = (1 - y.double() * eta).abs() >= 1e-5 if loss == "squared_hinge" else torch.ones_like(h, dtype=torch.bool)
    record(name + " hess", rel(r.hess[keep], h[keep], floor=1e-30), TOL[torch.float32])
    if with_eta:
        record(name + " eta", rel(r.eta, eta), TOL[torch.float32])


def check_loss_gradient(dev):
    """Every loss of ``fusedml.loss_gradient`` on rows that are (D = 100, 101 with the intercept) and
    are not (D = 64) 16-byte multiples, m = 1 and m = 3 (multinomial also 5, 7, 8; D = 200: the unrolled
    pass for m <= 4, two reads for more), with sample weights; deterministic repeat; CSR X (two reads)."""
    from fusedml.mmchain.lossgrad import loss_terms

    cases = [("logistic", 1, None), ("squared_hinge", 3, None), ("multinomial", 3, None), ("poisson", 1, None),
             ("gamma", 1, None), ("tweedie", 1, 1.5), ("squared_error", 1, None), ("multinomial", 7, None),
             ("multinomial", 5, None), ("multinomial", 8, None)]
    for n, d in ((300_000, 100), (200_000, 64), (5_003, 37), (100_003, 200)):
        X = torch.randn(n, d, device=dev)
        for loss, m, power in cases:
            W = 0.2 * torch.randn(d + 1, m, device=dev)
            y = _lg_target(loss, n, m, dev)
            _check_lg(f"loss_gradient {loss}{'' if power is None else power} m={m} {n}x{d}", X, X, W, y, loss, power,
                      dev, with_eta=True)
        for m in (1, 3):
            Y = torch.randn(d + 1, m, device=dev)
            record(f"matvec intercept m={m} {n}x{d}", rel(fusedml.matvec(X, Y, intercept=True, backend="fused"),
                                                          X.double() @ Y[:d].double() + Y[d].double()), TOL[torch.float32])
        a = fusedml.loss_gradient(X, W, y, loss=loss, intercept=True, deterministic=True, backend="fused").grad
        same = all(torch.equal(a, fusedml.loss_gradient(X, W, y, loss=loss, intercept=True, deterministic=True,
                                                        backend="fused").grad) for _ in range(3))
        record(f"loss_gradient deterministic bitwise repeat {n}x{d}", 0.0 if same else 1.0, 0.0)
    # CSR X: two reads with the pointwise terms in one launch between them (session 38)
    n, d = (100_003, 3_000) if dev.type == "cuda" else (503, 40)
    Xc = torch.randn(n, d, device=dev) * (torch.rand(n, d, device=dev) < 0.006)
    A = fusedml.as_csr(Xc.to_sparse_csr())
    for loss, m, power in cases[:6] + [("multinomial", 5, None)]:
        W = 0.2 * torch.randn(d + 1, m, device=dev)
        _check_lg(f"loss_gradient CSR {loss}{'' if power is None else power} m={m} {n}x{d}", A, Xc, W,
                  _lg_target(loss, n, m, dev), loss, power, dev, with_eta=False)
    del Xc, A
    # logistic margins up to ~40 on separable labels: every row's loss is log1p(exp(-|t|)), down
    # to ~1e-26, through the fp32 epilogue's hardware log2 / reciprocal and its log1p series
    for n, d, scale in ((300_000, 100, 0.6), (200_001, 64, 1.5)):
        X = torch.randn(n, d, device=dev)
        W = scale * torch.randn(d + 1, 1, device=dev)
        A = torch.cat([X.double(), torch.ones(n, 1, dtype=torch.float64, device=dev)], 1)
        eta = A @ W.double()
        y = (eta > 0).float()
        r = fusedml.loss_gradient(X, W, y, loss="logistic", intercept=True, backend="fused")
        val, g, h = loss_terms("logistic", eta, y.double())
        name = f"loss_gradient logistic separable |t| <= {float(eta.abs().max()):.0f} {n}x{d}"
        # t carries fp32 rounding (~1e-6 absolute at |t| ~ 30): exp(-|t|) that much relative
        record(name + " loss", rel(r.loss, val.sum(0), floor=1e-30), 1e-5)
        record(name + " grad", rel(r.grad, A.T @ g), 1e-5)
        record(name + " hess", rel(r.hess, h, floor=1e-30), TOL[torch.float32])


def check_kmeans(dev):
    """LloydIterations (kernel + finalising kernel) against lloyd_step + the host update, and a
    KMeans fit on the fused backend against the ops backend (same data, same seeding)."""
    from algorithms import KMeans
    from fusedml.kmeans import LloydIterations

    for n, d, k, weighted in ((1_000_000, 16, 16, False), (300_001, 64, 64, True), (200_000, 2, 128, False)):
        X = torch.randn(n, d, device=dev) * 2 + 1
        C = X[torch.randperm(n, device=dev)[:k]].double()
        w = torch.rand(n, device=dev) if weighted else None
        it = LloydIterations(X, w, C.mean(0), k)
        labels, new, out = it.step(C)
        r = fusedml.lloyd_step(X, C, sample_weight=w, shift=C.mean(0), backend="fused", check_finite=False)
        name = f"LloydIterations {n}x{d} K={k}{' weighted' if weighted else ''}"
        record(name + " labels", 0.0 if torch.equal(labels.long(), r.labels) else 1.0, 0.0)
        record(name + " centres", rel(new, r.sums / r.counts.clamp(min=1e-300)[:, None]), 1e-12)
        record(name + " inertia", rel(out[2:3], r.inertia.reshape(1)), 1e-12)
    X = torch.randn(1_000_000, 16, device=dev)
    X[:, 0] += 6 * torch.randint(0, 4, (1_000_000,), device=dev)
    a = KMeans(8, random_state=0, backend="fused").fit(X)
    b = KMeans(8, random_state=0, backend="ops").fit(X)
    # K = 8 on 4 blobs: each blob's split is decided by fp32 distances of boundary rows, and both fits
    # stop at scikit-learn's centre-shift tolerance (1e-4 of the variance), not at a fixed point
    record("KMeans 1Mx16 K=8 fused vs ops inertia", abs(a.inertia_ - b.inertia_) / b.inertia_, 1e-4)
    from fusedml.kmeans import candidate_distances

    C = X[:4].double() + 0.5
    closest = torch.rand(1_000_000, device=dev, dtype=torch.float64) * 50
    sw = torch.rand(1_000_000, device=dev, dtype=torch.float64)
    dist, pots = candidate_distances(X, C, closest, sw)
    ref = torch.minimum(torch.cdist(X.double(), C).T ** 2, closest[None, :])
    record("candidate_distances 1Mx16 L=4", rel(dist, ref), 1e-12)
    record("candidate_distances potentials", rel(pots, ref @ sw), 1e-12)


def check_gmm(dev):
    """GMM E-step on the GPU against a float64 operator-level E-step: every covariance type and path
    at small/odd shapes, plus the launch model's large-tile choices (pass-1 feature chunks at
    D = 128, K = 1024 with tf32x3; the fp32 fallback of tf32x3 at D = 256)."""
    if not hasattr(fusedml, "gmm_estep"):
        print("gmm_estep not available: skipped")
        return
    cases = []
    for cov in ("diag", "spherical", "full", "tied"):
        shapes = [(1, 3, 1), (100_000, 16, 16), (50_000, 5, 37), (30_000, 64, 64)]
        if cov in ("full", "tied"):  # BD = 16 at K <= 16, K <= 32 (session 31's 128-row tile) and K <= 64
            shapes = [(1, 3, 1), (20_000, 16, 16), (20_000, 12, 29), (20_000, 5, 37)]
        for (n, d, k) in shapes:
            for path in ("single", "two_pass"):
                cases.append((cov, n, d, k, path, "auto"))
    cases += [("diag", 30_000, 64, 64, "auto", "tf32x3"), ("diag", 100_000, 128, 1024, "auto", "auto"),
              ("diag", 50_000, 32, 256, "auto", "auto"), ("diag", 20_000, 256, 16, "auto", "tf32x3"),
              # small K x D over several blocks per persistent program: the register form (session 19;
              # K x D <= 256, odd K and D) and, at 32 x 32, the small tl.dot programs
              ("diag", 700_001, 8, 8, "auto", "auto"), ("spherical", 300_000, 2, 3, "auto", "auto"),
              ("diag", 1_000_003, 16, 16, "auto", "auto"), ("diag", 400_000, 32, 32, "auto", "auto"),
              ("diag", 300_001, 2, 128, "auto", "auto"), ("spherical", 200_000, 13, 24, "auto", "auto"),
              ("diag", 250_000, 1, 1, "auto", "auto"), ("diag", 250_000, 31, 5, "auto", "auto"),
              # session 20: spherical register tiles (per-row quadratic term and moment, KI doubled)
              ("spherical", 500_001, 32, 8, "auto", "auto"), ("spherical", 400_003, 8, 8, "auto", "auto"),
              ("spherical", 300_007, 16, 16, "auto", "auto"), ("spherical", 200_000, 2, 128, "auto", "auto"),
              # session 26: the tied single sweep (own-centre statistics) at the rule's tiles
              ("tied", 200_003, 64, 32, "auto", "auto"), ("tied", 300_001, 16, 64, "auto", "auto"),
              ("tied", 400_000, 32, 8, "auto", "auto"), ("tied", 100_000, 64, 64, "auto", "auto"),
              ("tied", 100_000, 128, 16, "auto", "auto"),
              # session 32: the tensor-core form ("auto" -> tf32x3 at 8 < K, D <= 16), odd shapes
              ("diag", 500_003, 13, 11, "auto", "tf32x3"), ("diag", 300_000, 9, 16, "auto", "tf32x3"),
              ("diag", 77, 16, 9, "auto", "tf32x3"), ("diag", 2_100_001, 16, 16, "auto", "auto")]
    for case in cases:
        try:
            _gmm_case(dev, *case)
        except Exception as e:  # noqa: BLE001 -- one failing case never ends the check
            record(f"gmm {' '.join(map(str, case))} ({type(e).__name__}: {str(e)[:60]})", float("inf"), 1e-4)
    for case in (("diag", 1_048_576, 2, 2), ("spherical", 1_000_003, 2, 2), ("diag", 1000, 2, 3)):
        try:
            _gmm_one_launch_case(dev, *case)
        except Exception as e:  # noqa: BLE001
            record(f"gmm one-launch {' '.join(map(str, case))} ({type(e).__name__}: {str(e)[:60]})", float("inf"), 0)


def _gmm_one_launch_case(dev, cov, n, d, k, calls=64):
    """The register form's one-launch E-step (the last program sums every program's partials):
    one launch per call, ``calls`` calls queued back to back on each of two streams at once (a
    count per stream), every result bit-identical to the first (the finish sums in a fixed order)
    and the first within 1e-4 of float64."""
    from fusedml.gmm import fused

    X = torch.randn(n, d, device=dev) * 3 + 100.0
    means = X[torch.randint(0, n, (k,), device=dev)] + 0.1 * torch.randn(k, d, device=dev)
    w = torch.full((k,), 1.0 / k, device=dev)
    pc = 1.0 / (torch.rand(k, d, device=dev) * 2 + 1.0) if cov == "diag" else 1.0 / (torch.rand(k, device=dev) + 1.0)
    names = []
    real = fused.launch

    def counting(kern, *a, **kw):
        names.append(kern.fn.__name__)
        return real(kern, *a, **kw)

    fused.launch = counting
    try:
        first = fusedml.gmm_estep(X, w, means, pc, cov, backend="fused")
        one = names == ["_diag_reg_kernel"]
        streams = [torch.cuda.Stream(dev) for _ in range(2)]
        torch.cuda.synchronize(dev)
        outs = [[] for _ in streams]
        for _ in range(calls):
            for s, o in zip(streams, outs):
                with torch.cuda.stream(s):
                    o.append(fusedml.gmm_estep(X, w, means, pc, cov, backend="fused", check_finite=False))
        torch.cuda.synchronize(dev)
    finally:
        fused.launch = real
    ref = fusedml.gmm_estep(X.double(), w.double(), means.double(), pc.double(), cov, backend="ops")
    name = f"gmm one-launch {cov} {n}x{d} K={k}"
    record(name + " one launch per call", 0.0 if one else float("inf"), 0)
    record(name + " N_k", rel(first.nk, ref.nk), 1e-4)
    record(name + " S2", rel(first.s2, ref.s2), 1e-4)
    record(name + " loglik", rel(first.log_likelihood.reshape(1), ref.log_likelihood.reshape(1)), 1e-4)
    diff = max(float((a - b).abs().max()) for o in outs for st in o
               for a, b in ((st.nk, first.nk), (st.s1, first.s1), (st.s2, first.s2),
                            (st.log_likelihood, first.log_likelihood)))
    record(name + f" {2 * calls} queued calls on 2 streams == first", diff, 0)


def _gmm_case(dev, cov, n, d, k, path, prec):
    """One GMM case: E-step statistics, M-step covariances and scoring against float64."""
    import warnings

    t0 = time.time()
    X = torch.randn(n, d, device=dev) * 3 + 100.0
    means = X[torch.randint(0, n, (k,), device=dev)] + 0.1 * torch.randn(k, d, device=dev)
    w = torch.rand(k, device=dev) + 0.1
    w = w / w.sum()
    if cov == "diag":
        pc = 1.0 / (torch.rand(k, d, device=dev) * 2 + 1.0)
    elif cov == "spherical":
        pc = 1.0 / (torch.rand(k, device=dev) * 2 + 1.0)
    else:
        shape = (k, d, d) if cov == "full" else (d, d)
        A = torch.randn(*shape, device=dev, dtype=torch.float64) * 0.1
        S = A @ A.transpose(-1, -2) + torch.eye(d, device=dev, dtype=torch.float64) * 2.0
        # scikit-learn's convention: inv(chol(S)).T, upper triangular.
        L = torch.linalg.cholesky(S)
        eye = torch.eye(d, device=dev, dtype=torch.float64).expand_as(L)
        pc = torch.linalg.solve_triangular(L, eye, upper=False).transpose(-1, -2).float()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fusedml.gmm_estep(X, w, means, pc, cov, backend="fused", path=path, precision=prec)
    ref = fusedml.gmm_estep(X.double(), w.double(), means.double(), pc.double(), cov, backend="ops")
    name = f"gmm {cov} {n}x{d} K={k} {path} {prec}"
    tol = 1e-4
    record(name + " N_k", rel(got.nk, ref.nk), tol)
    record(name + " mean", rel(got.s1 / got.nk[:, None].clamp_min(1e-30) + got.center, ref.s1 / ref.nk[:, None].clamp_min(1e-30) + ref.center), tol)
    record(name + " loglik", rel(got.log_likelihood.reshape(1), ref.log_likelihood.reshape(1)), tol)
    try:
        cov_ref = fusedml.gmm_mstep(ref, reg_covar=1e-6)[2]
    except ValueError:  # the float64 M-step itself rejects this draw (a collapsed component)
        cov_ref = None
    record(name + " S2", rel(got.s2, ref.s2), tol)
    if cov_ref is not None:
        try:
            cov_got = fusedml.gmm_mstep(got, reg_covar=1e-6)[2]
            record(name + " covariances", rel(cov_got, cov_ref, floor=1e-3 * float(X.var())), tol)
        except ValueError as e:
            if float(ref.nk.min()) >= 1.5:
                record(name + " covariances (" + str(e)[:40] + ")", float("inf"), tol)
            else:  # an empty or singleton component (covariance ~ reg_covar): beyond fp32 digits (ops fp32 too)
                print(f"     {name}: covariances not compared (min N_k {float(ref.nk.min()):.1e})", flush=True)
    lp, lab = fusedml.gmm_score(X, w, means, pc, cov, backend="fused")
    lp_ref, lab_ref = fusedml.gmm_score(X.double(), w.double(), means.double(), pc.double(), cov, backend="ops")
    record(name + " score", rel(lp, lp_ref), tol)
    msgs = "; ".join(str(c.message)[:120] for c in caught)
    print(f"     {name}: {time.time() - t0:.1f} s{'  warnings: ' + msgs if msgs else ''}", flush=True)


def check_cg(dev):
    """fusedml.cg.cg_update and trial_sums against float64 torch on fresh inputs: one problem over
    all columns, one per column (some masked), the kept step start, strided ``Ad``."""
    from fusedml.cg import cg_update, trial_sums

    g = torch.Generator(device=dev).manual_seed(int(time.time()))
    for n, K, P in ((101, 1, 1), (65537, 1, 1), (257, 5, 1), (1000, 4, 4), (100001, 1, 1)):
        for dt in (torch.float32, torch.float64):
            S, R, Dv = (torch.randn(n, K, generator=g, device=dev, dtype=dt) for _ in range(3))
            Ad = torch.randn(K, n, generator=g, device=dev, dtype=dt).t()
            rTr = torch.rand(P, generator=g, device=dev, dtype=dt) + 0.5
            mask = None if P == 1 else (torch.arange(P, device=dev) % 3 != 1).to(dt)
            cpp = K // P
            sums = lambda A, B: (A.double() * B.double()).reshape(n, P, cpp).sum((0, 2))  # noqa: E731
            dAd = sums(Dv, Ad)
            a = torch.nan_to_num(rTr.double() / dAd, nan=0.0, posinf=0.0, neginf=0.0)
            a = a if mask is None else a * mask.double()
            ac = a.repeat_interleave(cpp)[None, :]
            S1, R1 = S.double() + ac * Dv.double(), R.double() - ac * Ad.double()
            rn = sums(R1, R1)
            b = torch.nan_to_num(rn / rTr.double(), nan=0.0, posinf=0.0, neginf=0.0)
            b = b if mask is None else b * mask.double()
            S0, R0 = torch.empty_like(S), torch.empty_like(R)
            Sc, Rc = S.clone(), R.clone()
            beta, packed = torch.empty(P, device=dev, dtype=dt), torch.empty(2 * P, device=dev, dtype=dt)
            cg_update(S, R, Dv, Ad, rTr, beta, packed, mask=mask, S0=S0, R0=R0)
            torch.cuda.synchronize()
            err = max(rel(S, S1), rel(R, R1), rel(packed, torch.cat([dAd, rn])), rel(beta, b, 1e-30), rel(rTr, rn),
                      rel(S0, Sc), rel(R0, Rc))
            record(f"cg_update n={n} K={K} P={P} {str(dt)[6:]}", err, TOL[dt])
            g0, g1 = (torch.randn(n, K, generator=g, device=dev, dtype=dt) for _ in range(2))
            got = trial_sums(g0, S, R, g1, P)
            per = lambda A: A.double().reshape(n, P, cpp)  # noqa: E731
            want = torch.cat([(per(g0) * per(S)).sum((0, 2)), (per(S) * per(R)).sum((0, 2)), (per(S) ** 2).sum((0, 2)),
                              (per(g1) ** 2).sum((0, 2)), per(g1).abs().amax((0, 2))])
            record(f"trial_sums n={n} K={K} P={P} {str(dt)[6:]}", rel(got, want), 1e-12)
    check_cg_decided(dev, g)
    check_bound(dev, g)


def check_bound(dev, g):
    """fusedml.bind_mmchain on the GPU (its launches repeat through the compiled kernel): three calls,
    operands changed in place before each, against the float64 formula on the new contents."""
    for N, D, m, v_op in ((1_000_000, 100, None, "mul"), (200_000, 64, 4, "mul"), (300_000, 32, 3, "softmax")):
        X = torch.randn(N, D, generator=g, device=dev)
        shape = (D + 1,) if m is None else (D + 1, m)
        y, z = torch.empty(shape, device=dev), torch.empty(shape, device=dev)
        v = torch.empty((N,) if m is None else (N, m), device=dev)
        op = fusedml.bind_mmchain(X, y, v, z, alpha=0.5, beta=1e-2, intercept=True, v_op=v_op, backend="fused")
        err = 0.0
        for _ in range(3):
            y.normal_(generator=g)
            z.normal_(generator=g)
            v.uniform_(0.1, 1.0, generator=g)
            got = op().clone()
            err = max(err, rel(got, ref_mmchain(X.double(), y.double(), v.double(), z.double(), 0.5, 1e-2,
                                                  intercept=True, v_op=v_op)))
        record(f"bind_mmchain {N}x{D} m={m} {v_op} (3 calls)", err, TOL[torch.float32])
    from fusedml.cg import bind_cg_update, bind_trial_sums, cg_update, trial_sums
    from fusedml.mmchain.lossgrad import loss_terms

    for N, D, m, loss in ((1_000_000, 100, 1, "logistic"), (300_000, 64, 3, "multinomial")):
        X = torch.randn(N, D, generator=g, device=dev)
        y = ((torch.rand(N, 1, generator=g, device=dev) < 0.4).float() if loss == "logistic" else
             torch.nn.functional.one_hot(torch.randint(0, m, (N,), generator=g, device=dev), m).float())
        W, z = torch.empty(D + 1, m, device=dev), torch.empty(D + 1, m, device=dev)
        # the objective's launch after the pass: 0.5 * loss + 1e-2 / 2 ||z||^2 + offset, per column
        # (multinomial) or summed (logistic)
        objective = "sum" if m == 1 else "columns"
        off = torch.randn(1 if m == 1 else m, generator=g, device=dev, dtype=torch.float64)
        op = fusedml.bind_loss_gradient(X, W, y, loss=loss, alpha=0.5, z=z, beta=1e-2, intercept=True,
                                        backend="fused", objective=objective, offset=off)
        A = torch.cat([X.double(), torch.ones(N, 1, dtype=torch.float64, device=dev)], 1)
        err = err_obj = 0.0
        for _ in range(3):
            W.normal_(generator=g).mul_(0.1)
            z.normal_(generator=g)
            r = op()
            eta = A @ W.double()
            val, gr, h = loss_terms(loss, eta, y.double())
            err = max(err, rel(r.grad, 0.5 * A.T @ gr + 1e-2 * z.double()), rel(r.loss, val.sum(0), floor=1e-30),
                      rel(r.hess, h, floor=1e-30), rel(r.eta, eta))
            want = 0.5 * val.sum(0) + 5e-3 * z.double().square().sum(0)
            want = (want.sum().reshape(1) if objective == "sum" else want) + off
            err_obj = max(err_obj, rel(r.objective, want))
        record(f"bind_loss_gradient {N}x{D} m={m} {loss} (3 calls)", err, TOL[torch.float32])
        record(f"bind_loss_gradient {N}x{D} m={m} {loss} objective={objective} (3 calls)", err_obj, TOL[torch.float32])
    # bound cg_update / trial_sums: the same numbers as the checked launches, over changing contents
    for dt in (torch.float32, torch.float64):
        n, K = 10_001, 3
        mk = lambda: torch.randn(n, K, generator=g, device=dev, dtype=dt)  # noqa: E731
        bufs = [mk() for _ in range(4)]  # S, R, Dv, Ad
        twins = [b.clone() for b in bufs]
        rTr, beta, packed = (torch.rand(1, device=dev, dtype=dt) + 0.5), torch.empty(1, device=dev, dtype=dt), \
            torch.empty(2, device=dev, dtype=dt)
        rTr2, beta2, packed2 = rTr.clone(), beta.clone(), packed.clone()
        upd = bind_cg_update(*bufs, rTr, beta, packed)
        sums = bind_trial_sums(bufs[0], bufs[1], bufs[2], bufs[3], 1)
        err = 0.0
        for _ in range(3):
            for b, t in zip(bufs[2:], twins[2:]):
                t.copy_(b.normal_(generator=g))
            upd()
            cg_update(*twins, rTr2, beta2, packed2)
            err = max(err, rel(bufs[0], twins[0].double()), rel(bufs[1], twins[1].double()),
                      rel(packed, packed2.double()), rel(beta, beta2.double(), 1e-30),
                      rel(sums(), trial_sums(twins[0], twins[1], twins[2], twins[3], 1)))
        record(f"bind_cg_update / bind_trial_sums {str(dt)[6:]} (3 calls)", err, 1e-12)


def check_cg_decided(dev, g):
    """Device-decided CG steps (cg_update with a control block) run to their end on a fresh SPD
    system: without a region the solution's float64 residual meets the tolerance; with one, a
    problem that stopped at the boundary has ||S|| = delta, one that converged inside meets it."""
    from fusedml.cg import bind_cg_restart, cg_control, cg_update, control_slice

    n = 200
    for K, P, region in ((1, 1, None), (3, 1, None), (4, 4, None), (1, 1, 0.3), (4, 4, 1.0)):
        Q = torch.randn(n, n, generator=g, device=dev, dtype=torch.float64)
        A = Q @ Q.T / n + 0.5 * torch.eye(n, device=dev, dtype=torch.float64)
        B = torch.randn(n, K, generator=g, device=dev, dtype=torch.float64)
        cpp = K // P
        per = lambda T: (T * T).reshape(n, P, cpp).sum((0, 2))  # noqa: E731
        rtr = per(B).tolist()
        tol2 = [1e-10 * x for x in rtr]
        dsq = None if region is None else [region ** 2] * P
        # next_dir: the solvers' form (bind_cg_restart from -B, column-major; the kernel forms each direction)
        for dt, next_dir in ((torch.float32, False), (torch.float64, False), (torch.float32, True),
                             (torch.float64, True)):
            S, R, Dv = torch.zeros(n, K, device=dev, dtype=dt), B.to(dt).clone(), torch.zeros(n, K, device=dev, dtype=dt)
            beta = torch.zeros(P, device=dev, dtype=dt)
            if next_dir:
                for t in (S, R, Dv, beta):
                    t.fill_(float("nan"))
                bind_cg_restart(S, R, Dv, (-B).to(dt).t().contiguous().t(), beta, negate=True)()
            ctl = torch.tensor(cg_control(rtr, tol2 if dt == torch.float64 else [1e-6 * x for x in rtr], [True] * P,
                                          dsq), dtype=torch.float64, device=dev)
            for _ in range(2 * n):
                if not next_dir:
                    torch.addcmul(R, beta.repeat_interleave(cpp)[None, :], Dv, out=Dv)
                cg_update(S, R, Dv, (A @ Dv.double()).to(dt), None, beta, None, control=ctl,
                          trust_region=dsq is not None, next_direction=next_dir)
            v = ctl.tolist()
            reach = v[control_slice("reach", P)]
            res = (per(B - A @ S.double()) / per(B)).sqrt()
            tol = 2e-5 if dt == torch.float64 else 2e-3
            err = 0.0
            for j in range(P):
                if reach[j] > 0.5:
                    err = max(err, abs(float(per(S.double())[j].sqrt()) - region) / region)
                else:
                    err = max(err, float(res[j]))
            record(f"cg_update decided{' next_dir' if next_dir else ''} n={n} K={K} P={P} region={region} {str(dt)[6:]} "
                   f"(reach {sum(x > 0.5 for x in reach)}/{P})", err, tol)


def check_gmm_em(dev, N=400_000, kpp_rows=200_000):
    """The device EM loop's pieces on fresh random inputs: the one-launch M-step + operands against
    torch's float64 arithmetic, whole fits of the device loop (CUDA graphs) against the host loop,
    and the replayed k-means++ seeds against the CPU path's."""
    import algorithms.mixture as mixture
    from algorithms import GaussianMixture
    from fusedml.gmm import mstep_tensors
    from fusedml.gmm._prep import shifted_quad
    from fusedml.gmm.fused import device_operands, mstep_operands

    f64 = torch.float64
    for ct, K, D in (("diag", 16, 16), ("spherical", 8, 32), ("diag", 64, 64), ("diag", 3, 5)):
        nk = torch.rand(K, dtype=f64, device=dev) * 1e5 + 1.0
        c = torch.randn(K, D, dtype=f64, device=dev) * 3
        s1 = torch.randn(K, D, dtype=f64, device=dev) * nk[:, None] * 0.01
        s2 = torch.rand(K, D, dtype=f64, device=dev) * nk[:, None] + nk[:, None] * 0.01
        if ct == "spherical":
            s2 = s2.sum(1)
        ll = torch.randn((), dtype=f64, device=dev) * 1e6
        ref = mstep_tensors(ct, nk, c, s1, s2, 1e-6)
        ref_ops = device_operands(torch.empty(1, D, device=dev), ref[0], ref[1], ref[3], ct)
        out = {n: torch.full_like(t, float("nan")) for n, t in zip(("weights", "means", "covariances",
                                                                    "precisions_cholesky"), ref[:4])}
        out.update({n: torch.full_like(t, float("nan")) for n, t in ref_ops.items()})
        out["scal"] = torch.full((3,), float("nan"), dtype=f64, device=dev)
        mstep_operands((ll, nk, s1, s2), c, torch.tensor([1e-6], dtype=f64, device=dev), ct, torch.float32, out)
        err = max(rel(out[n], r) for n, r in zip(("weights", "means", "covariances", "precisions_cholesky"), ref[:4]))
        record(f"mstep_operands {ct} K={K} D={D} parameters (float64)", err, 1e-13)
        err = max(rel(out[n], r) for n, r in ref_ops.items())
        record(f"mstep_operands {ct} K={K} D={D} operands (fp32 rounding)", err, 2e-7)
        record(f"mstep_operands {ct} K={K} D={D} scalars", abs(float(out["scal"][0]) / float(ll) - 1)
               + float(out["scal"][1]), 1e-15)
        quad = float(shifted_quad(out["CP"], out["precisions_cholesky"], ct))
        record(f"mstep_operands {ct} K={K} D={D} fp32_quad", abs(float(out["scal"][2]) / quad - 1), 1e-12)
    for ct, K, D in (("diag", 16, 16), ("spherical", 8, 8)):
        X = torch.randn(N, D, device=dev) + torch.randint(0, 4, (N, 1), device=dev) * 3.0
        fits = {}
        for forced in (None, False):
            mixture._DEVICE_EM = forced
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fits[forced] = GaussianMixture(K, covariance_type=ct, max_iter=20, tol=0.0, random_state=0,
                                                   backend="fused").fit(X)
            finally:
                mixture._DEVICE_EM = None
        a, b = fits[None], fits[False]
        name = f"GaussianMixture {N}x{D} K={K} {ct} device loop vs host loop"
        record(name + " lower bounds", float(np.max(np.abs(np.array(a.lower_bounds_) / np.array(b.lower_bounds_) - 1))), 1e-9)
        record(name + " parameters", max(rel(getattr(a, n), getattr(b, n)) for n in ("weights_", "means_",
                                                                                     "covariances_")), 1e-7)
    from algorithms.mixture import _kmeans_plusplus

    X = torch.randn(kpp_rows, 8, device=dev) * 2
    w = torch.rand(kpp_rows, dtype=f64, device=dev) + 0.1
    keep, mixture._KPP_CAPTURE_AFTER = mixture._KPP_CAPTURE_AFTER, 2  # capture at the third centre
    for sw in (None, w):
        seed = int(torch.randint(0, 1 << 30, ()))
        a = _kmeans_plusplus(X, 16, np.random.RandomState(seed), sw, backend="fused")
        os.environ["FUSEDML_CUDA_GRAPHS"] = "0"  # the same steps, eager
        try:
            b = _kmeans_plusplus(X, 16, np.random.RandomState(seed), sw, backend="fused")
        finally:
            del os.environ["FUSEDML_CUDA_GRAPHS"]
        record(f"k-means++ replayed {kpp_rows}x8 K=16{' weighted' if sw is not None else ''} seeds = eager steps'",
               float((a != b).sum()), 0.0)
    mixture._KPP_CAPTURE_AFTER = keep


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--parts", nargs="+", default=["mmchain", "loss_gradient", "kmeans", "gmm"],
                    choices=["mmchain", "loss_gradient", "kmeans", "gmm", "cg", "gmm_em"])
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    checks = {"mmchain": check_mmchain, "loss_gradient": check_loss_gradient, "kmeans": check_kmeans,
              "gmm": check_gmm, "cg": check_cg, "gmm_em": check_gmm_em}
    for part in args.parts:
        checks[part](dev)
    bad = [r for r in ROWS if not r["ok"]]
    print(f"{len(ROWS) - len(bad)} passed, {len(bad)} failed")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": ROWS}, f, indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
