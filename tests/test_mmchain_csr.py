"""Kernel-level tests of the fused CSR kernels (fusedml/mmchain/csr.py) under the Triton interpreter.

References are the literal float64 formula on the densified matrix; every buffer the kernels must
fully overwrite is NaN-poisoned (csr.POISON_OUTPUTS).
"""
import dataclasses
import importlib
import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fusedml
from fusedml import CSRMatrix

# `fusedml.mmchain` is also the public function's name: import the submodule by path.
csr = importlib.import_module("fusedml.mmchain.csr")

TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 2e-5, torch.bfloat16: 2e-5}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(csr, "POISON_OUTPUTS", True)


def make_csr(rng, n, d, lengths, idx=torch.int32, dtype=torch.float32):
    """Random CSR with the given row lengths, sorted unique columns, values ~ N(0, 1)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assert lengths.shape == (n,) and lengths.max(initial=0) <= d
    crow = np.zeros(n + 1, dtype=np.int64)
    crow[1:] = np.cumsum(lengths)
    cols = [np.sort(rng.choice(d, size=int(k), replace=False)) for k in lengths]
    col = np.concatenate(cols) if n else np.zeros(0, np.int64)
    val = rng.standard_normal(col.size)
    return CSRMatrix(torch.from_numpy(crow).to(idx), torch.from_numpy(col.astype(np.int64)).to(idx),
                     torch.from_numpy(val).to(dtype), (n, d))


def dense64(A, intercept=False):
    X = torch.zeros(A.shape, dtype=torch.float64)
    crow, col = A.crow.long(), A.col.long()
    rows = torch.repeat_interleave(torch.arange(A.shape[0]), crow[1:] - crow[:-1])
    X[rows, col] = A.val.double()
    if intercept:
        X = torch.cat([X, torch.ones(A.shape[0], 1, dtype=torch.float64)], 1)
    return X


def reference(A, y, v, z, alpha, beta, intercept=False, v_op="mul"):
    X = dense64(A, intercept)
    if y is None:
        p = v.double()
    else:
        t = X @ y.double()
        vv = torch.ones_like(t) if v is None else v.double()
        p = vv * t if v_op == "mul" else vv * (t - (vv * t).sum(1, keepdim=True))
    w = alpha * X.T @ p
    if z is not None:
        w = w + beta * z.double()
    return w


def relerr(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def randn(rng, *shape, dtype=torch.float32):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def profile_lengths(rng, name):
    """(n, d, lengths) for a named row-length profile."""
    if name == "one_row":
        return 1, 37, [20]
    if name == "one_col":
        return 45, 1, rng.integers(0, 2, 45)
    if name == "empty_rows":
        lens = rng.integers(0, 6, 70)
        lens[::3] = 0
        return 70, 29, lens
    if name == "ragged":  # sizes not dividing any block
        return 37, 23, rng.integers(1, 23, 37)
    if name == "power_law":  # one row past the long-row threshold (1024) among short rows
        lens = np.minimum(rng.zipf(2.0, 60), 40)
        lens[17] = 2500
        return 60, 3000, lens
    if name == "all_empty":
        return 9, 5, np.zeros(9, np.int64)
    raise KeyError(name)


PROFILES = ["one_row", "one_col", "empty_rows", "ragged", "power_law", "all_empty"]


@pytest.mark.parametrize("idx", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("profile", PROFILES)
def test_mmchain_profiles(rng, profile, idx):
    n, d, lens = profile_lengths(rng, profile)
    A = make_csr(rng, n, d, lens, idx)
    for m, intercept in ((1, False), (3, True)):
        dx = d + intercept
        y, v, z = randn(rng, dx, m), randn(rng, n, m), randn(rng, dx, m)
        w = csr.csr_mmchain_fused(A, y, v, z, 0.7, -0.4, intercept=intercept)
        assert w.shape == (dx, m) and w.dtype == torch.float32
        ref = reference(A, y, v, z, 0.7, -0.4, intercept)
        assert relerr(w, ref) < TOL[torch.float32], (m, intercept)


@pytest.mark.parametrize("profile", ["empty_rows", "power_law", "one_row"])
def test_matvec_profiles(rng, profile):
    n, d, lens = profile_lengths(rng, profile)
    A = make_csr(rng, n, d, lens, torch.int64)
    for m, intercept in ((1, True), (4, False)):
        y = randn(rng, d + intercept, m)
        t = csr.csr_matvec_fused(A, y, intercept=intercept)
        ref = dense64(A, intercept) @ y.double()
        assert t.shape == (n, m)
        assert relerr(t, ref) < TOL[torch.float32]
        if intercept:  # empty rows hold exactly the intercept
            empty = (A.crow[1:] == A.crow[:-1])
            assert torch.equal(t[empty], y[-1].expand(int(empty.sum()), m))


def check_value_dtype(rng, A, config=None):
    """mmchain on A's storage dtype against the reference (fp32 accumulation, fp64 for fp64); returns y."""
    n, d = A.shape
    dtype = A.val.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if dtype == torch.bfloat16 and fusedml.interpret_mode():
        probe = csr.csr_matvec_fused(A, torch.ones(d, 1, dtype=acc))
        if float(probe.abs().sum()) == 0.0:
            pytest.skip("the Triton interpreter yields zeros for bf16 loads; bf16 runs on the GPU only")
    y, v, z = randn(rng, d + 1, 2, dtype=acc), randn(rng, n, 2, dtype=acc), randn(rng, d + 1, 2, dtype=acc)
    w = csr.csr_mmchain_fused(A, y, v, z, 1.3, 0.5, intercept=True, config=config)
    assert w.dtype == acc
    # The reference uses the stored (rounded) values: only the accumulation is under test.
    assert relerr(w, reference(A, y, v, z, 1.3, 0.5, True)) < TOL[dtype]
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp64", "fp16", "bf16"])
def test_value_dtypes(rng, dtype):
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens, torch.int32, dtype)
    y = check_value_dtype(rng, A)
    t = csr.csr_matvec_fused(A, y, intercept=True)
    assert relerr(t, dense64(A, True) @ y.double()) < TOL[dtype]


@pytest.mark.parametrize("m", [3, 16])
def test_matrix_y_softmax_and_options(rng, m):
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens)
    y, z = randn(rng, d + 1, m), randn(rng, d + 1, m)
    v = torch.from_numpy(rng.dirichlet(np.ones(m), n)).float()
    for v_op in ("mul", "softmax"):
        w = csr.csr_mmchain_fused(A, y, v, z, 0.9, 2.0, intercept=True, v_op=v_op)
        assert relerr(w, reference(A, y, v, z, 0.9, 2.0, True, v_op)) < TOL[torch.float32], v_op
    # v=None (ones), z=None
    w = csr.csr_mmchain_fused(A, y[:d], None, None, 1.0, 0.0)
    assert relerr(w, reference(A, y[:d], None, None, 1.0, 0.0)) < TOL[torch.float32]


def test_y_none_and_v_broadcast(rng):
    n, d, lens = profile_lengths(rng, "empty_rows")
    A = make_csr(rng, n, d, lens)
    v, z = randn(rng, n, 5), randn(rng, d + 1, 5)
    w = csr.csr_mmchain_fused(A, None, v, z, -0.3, 0.25, intercept=True)
    assert relerr(w, reference(A, None, v, z, -0.3, 0.25, True)) < TOL[torch.float32]
    # v [N, 1] broadcast over the m columns of y
    y, v1 = randn(rng, d, 4), randn(rng, n, 1)
    w = csr.csr_mmchain_fused(A, y, v1, None, 1.0, 0.0)
    assert relerr(w, reference(A, y, v1.expand(n, 4), None, 1.0, 0.0)) < TOL[torch.float32]


# Forced schedules: binned with tiny tiles (many bins, long rows split in several chunks and loop
# pieces) and ordered with a loop (rows longer than the tile width).
FORCED = {
    "binned_small": {"ordered": False, "tile": 32, "l_min": 2, "long_threshold": 32, "piece": 8, "chunk": 24},
    "ordered_loop": {"ordered": True, "single": False, "lanes": 4, "block_r": 8},
    "ordered_single": {"ordered": True, "single": True, "lanes": 64, "block_r": 2},
}


@pytest.mark.parametrize("strategy", ["scatter", "gather"])
@pytest.mark.parametrize("forced", list(FORCED))
def test_forced_schedules(rng, forced, strategy):
    lens = rng.integers(0, 12, 40)
    lens[5], lens[30] = 100, 61
    A = make_csr(rng, 40, 130, lens, torch.int64)
    cfg = FORCED[forced]
    if forced == "ordered_single":
        cfg = dict(cfg, lanes=128)
    # gather: the same forced launch for the pass over the CSC copy (its columns are A's rows)
    cfg = dict(cfg, strategy=strategy, gather=dict(cfg))
    y, v, z = randn(rng, 131, 3), randn(rng, 40, 3), randn(rng, 131, 3)
    ref = reference(A, y, v, z, 0.5, 1.5, True, "softmax")
    w = csr.csr_mmchain_fused(A, y, v, z, 0.5, 1.5, intercept=True, v_op="softmax", config=cfg)
    assert relerr(w, ref) < TOL[torch.float32]
    wn = csr.csr_mmchain_fused(A, None, v, None, 2.0, 0.0, intercept=True, config=cfg)
    assert relerr(wn, reference(A, None, v, None, 2.0, 0.0, True)) < TOL[torch.float32]
    t = csr.csr_matvec_fused(A, y, intercept=True, config=cfg)
    assert relerr(t, dense64(A, True) @ y.double()) < TOL[torch.float32]
    wd = csr.csr_mmchain_fused(A, y, v, z, 0.5, 1.5, intercept=True, v_op="softmax", deterministic=True,
                               config=cfg)
    assert relerr(wd, ref) < TOL[torch.float32]


def test_deterministic_bitwise(rng):
    # Column 0 is in every row: a 1500-long "row" of the transpose (the long-row path there too).
    n, d = 1500, 40
    lens = rng.integers(1, 6, n)
    A = make_csr(rng, n, d, lens)
    col = A.col.clone()
    col[A.crow[:-1].long()] = 0  # first entry of each row -> column 0 (stays sorted and unique)
    A = CSRMatrix(A.crow, col, A.val, A.shape)
    y, v, z = randn(rng, d + 1, 2), randn(rng, n, 2), randn(rng, d + 1, 2)
    w1 = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, intercept=True, deterministic=True)
    w2 = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, intercept=True, deterministic=True)
    assert torch.equal(w1, w2)
    assert relerr(w1, reference(A, y, v, z, 0.3, 1.0, True)) < TOL[torch.float32]
    wn = csr.csr_mmchain_fused(A, None, v, None, 1.0, 0.0, deterministic=True)
    assert torch.equal(wn, csr.csr_mmchain_fused(A, None, v, None, 1.0, 0.0, deterministic=True))
    assert relerr(wn, reference(A, None, v, None, 1.0, 0.0)) < TOL[torch.float32]


def test_inputs_not_modified(rng):
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens)
    y, v, z = randn(rng, d + 1, 2), randn(rng, n, 2), randn(rng, d + 1, 2)
    before = [t.clone() for t in (A.crow, A.col, A.val, y, v, z)]
    for det in (False, True):
        csr.csr_mmchain_fused(A, y, v, z, 1.0, 1.0, intercept=True, deterministic=det)
    for a, b in zip(before, (A.crow, A.col, A.val, y, v, z)):
        assert torch.equal(a, b)


def test_stats_config_and_cache(rng):
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens)
    st = csr.csr_stats(A)
    assert st.nnz == int(np.sum(lens)) and st.max_len == int(np.max(lens)) and sum(st.hist) == n
    ref_hist = np.bincount([0 if k == 0 else 1 + int(np.ceil(np.log2(k))) for k in lens])
    assert list(st.hist) == list(ref_hist)
    cfg = csr.csr_config(A)
    assert not cfg.ordered and cfg.long_threshold < st.max_len  # skewed: binned + long rows
    uniform = make_csr(rng, 64, 100, np.full(64, 32))
    cu = csr.csr_config(uniform)
    assert cu.ordered and cu.single and cu.lanes == 32 and cu.block_r * cu.lanes == cu.tile
    c16 = csr.csr_config(uniform, m=16)
    assert c16.tile < cu.tile  # registers: smaller tiles for wide m
    assert len(csr.csr_sweep_configs(uniform)) > 3
    # The cache follows the matrix object and is dropped after an in-place change of its structure.
    assert csr._structure(A) is csr._structure(A)
    s1 = csr._structure(A)
    A.col.add_(0)  # bumps the version counter
    assert csr._structure(A) is not s1


def test_bad_inputs(rng):
    A = make_csr(rng, 10, 8, rng.integers(0, 4, 10))
    y = torch.randn(8, 2)
    with pytest.raises(ValueError, match="y must have 9 rows"):
        csr.csr_mmchain_fused(A, y, None, None, intercept=True)
    with pytest.raises(ValueError, match="m must be between"):
        csr.csr_mmchain_fused(A, torch.randn(8, 17), None, None)
    with pytest.raises(ValueError, match="v is required"):
        csr.csr_mmchain_fused(A, None, None, None)
    with pytest.raises(ValueError, match="softmax"):
        csr.csr_mmchain_fused(A, None, torch.randn(10, 2), None, v_op="softmax")
    with pytest.raises(ValueError, match="v_op"):
        csr.csr_mmchain_fused(A, y, None, None, v_op="exp")
    with pytest.raises(TypeError, match="accumulation dtype"):
        csr.csr_mmchain_fused(A, y.double(), None, None)
    with pytest.raises(ValueError, match="v must have m=2 columns"):
        csr.csr_mmchain_fused(A, y, torch.randn(10, 3), None)
    with pytest.raises(ValueError, match="z must have 8 rows"):
        csr.csr_mmchain_fused(A, y, None, torch.randn(7, 2))
    with pytest.raises(TypeError, match="CSRMatrix"):
        csr.csr_mmchain_fused(A.to_dense(), y, None, None)
    with pytest.raises(TypeError, match="config"):
        csr.csr_mmchain_fused(A, y, None, None, config=3)
    with pytest.raises(ValueError, match="y must have 8 rows"):
        csr.csr_matvec_fused(A, torch.randn(9, 1))


def test_public_api_fused(rng):
    mmchain_mod = importlib.import_module("fusedml.mmchain")
    if not hasattr(mmchain_mod, "mmchain"):
        pytest.skip("public fusedml.mmchain not available yet")
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens)
    S = sp.csr_matrix((A.val.numpy(), A.col.numpy(), A.crow.numpy()), shape=A.shape)
    y, v, z = randn(rng, d + 1, 3), torch.rand(n), randn(rng, d + 1, 3)
    w = fusedml.mmchain(S, y, v, z, 0.5, 1.0, intercept=True, backend="fused")
    assert relerr(w, reference(A, y, v[:, None].expand(n, 3), z, 0.5, 1.0, True)) < TOL[torch.float32]
    w1 = fusedml.mmchain(A, y[:d, 0], v, None, backend="fused", deterministic=True)
    assert w1.shape == (d,)
    assert relerr(w1, reference(A, y[:d, :1], v[:, None], None, 1.0, 0.0)[:, 0]) < TOL[torch.float32]
    t = fusedml.matvec(A, y, intercept=True, backend="fused")
    assert relerr(t, dense64(A, True) @ y.double()) < TOL[torch.float32]


# ------------------------------------------------------------------------------------------------
# The gather strategy (CSC copy, two atomic-free passes) and the scatter/gather model
# ------------------------------------------------------------------------------------------------
GATHER = {"strategy": "gather"}


def column_heavy(rng, idx=torch.int32):
    """Power-law rows and power-law columns: column 0 in every row (a long CSC row), most of the
    500 columns empty (empty CSC rows), a row past the long-row threshold."""
    n, d = 1300, 500
    lens = np.minimum(rng.zipf(1.8, n), 30)
    lens[::7] = 0
    lens[100] = 400
    A = make_csr(rng, n, d // 4, np.minimum(lens, d // 4), idx)  # columns < 125: 375 empty
    col = A.col.clone()
    nz = A.crow[1:] > A.crow[:-1]
    col[A.crow[:-1][nz].long()] = 0  # first entry of each non-empty row -> column 0
    return CSRMatrix(A.crow, col, A.val, (n, d))


@pytest.mark.parametrize("idx", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("profile", ["empty_rows", "power_law", "one_col", "all_empty", "column_heavy"])
def test_gather_forms(rng, profile, idx):
    if profile == "column_heavy":
        A = column_heavy(rng, idx)
        n, d = A.shape
    else:
        n, d, lens = profile_lengths(rng, profile)
        A = make_csr(rng, n, d, lens, idx)
    for m, intercept, v_op in ((1, False, "mul"), (3, True, "softmax"), (16, True, "mul")):
        dx = d + intercept
        y, z = randn(rng, dx, m), randn(rng, dx, m)
        v = torch.from_numpy(rng.dirichlet(np.ones(m), n)).float() if v_op == "softmax" else randn(rng, n, m)
        w = csr.csr_mmchain_fused(A, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op, config=GATHER)
        assert w.shape == (dx, m) and w.dtype == torch.float32
        assert relerr(w, reference(A, y, v, z, 0.7, -0.4, intercept, v_op)) < TOL[torch.float32], (m, v_op)
    # y=None (w = alpha A^T v + beta z), v=None (ones), v [N, 1] broadcast
    v, z = randn(rng, n, 2), randn(rng, d + 1, 2)
    w = csr.csr_mmchain_fused(A, None, v, z, -1.5, 0.25, intercept=True, config=GATHER)
    assert relerr(w, reference(A, None, v, z, -1.5, 0.25, True)) < TOL[torch.float32]
    y, v1 = randn(rng, d, 4), randn(rng, n, 1)
    w = csr.csr_mmchain_fused(A, y, None, None, 1.0, 0.0, config=GATHER)
    assert relerr(w, reference(A, y, None, None, 1.0, 0.0)) < TOL[torch.float32]
    w = csr.csr_mmchain_fused(A, y, v1, None, 2.0, 0.0, config=GATHER)
    assert relerr(w, reference(A, y, v1.expand(n, 4), None, 2.0, 0.0)) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=["fp64", "fp16", "bf16"])
def test_gather_value_dtypes(rng, dtype):
    A = column_heavy(rng)
    A = CSRMatrix(A.crow, A.col, A.val.to(dtype), A.shape)
    check_value_dtype(rng, A, config=GATHER)
    assert csr._structure(A).csc.AT.val.dtype == dtype  # the copy keeps the storage dtype


def test_gather_bitwise_and_agrees_with_scatter(rng):
    A = column_heavy(rng)
    n, d = A.shape
    y, v, z = randn(rng, d + 1, 3), randn(rng, n, 3), randn(rng, d + 1, 3)
    kw = dict(intercept=True, v_op="softmax")
    w1 = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, config=GATHER, **kw)
    w2 = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, config=GATHER, **kw)
    wd = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, deterministic=True, **kw)
    assert torch.equal(w1, w2) and torch.equal(w1, wd)  # deterministic=True is the gather path
    ws = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, config={"strategy": "scatter"}, **kw)
    assert relerr(w1, ws) < TOL[torch.float32]
    # deterministic also when memory="low" (the only atomic-free path builds the copy)
    wl = csr.csr_mmchain_fused(A, y, v, z, 0.3, 1.0, deterministic=True, config={"memory": "low"}, **kw)
    assert torch.equal(wl, wd)


def test_gather_cache_invalidation(rng):
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens)
    y, v = randn(rng, d, 2), randn(rng, n, 2)
    w1 = csr.csr_mmchain_fused(A, y, v, None, config=GATHER)
    c1 = csr._structure(A).csc
    assert csr.csr_mmchain_fused(A, y, v, None, config=GATHER).data_ptr() != w1.data_ptr()
    assert csr._structure(A).csc is c1  # cached
    A.val.mul_(2)  # in place: same tensor, bumped version -> the copy is rebuilt
    w2 = csr.csr_mmchain_fused(A, y, v, None, config=GATHER)
    assert csr._structure(A).csc is not c1
    assert relerr(w2, reference(A, y, v, None, 1.0, 0.0)) < TOL[torch.float32]
    assert relerr(w2, 4 * w1) < TOL[torch.float32]  # A^T (v ⊙ (A y)) is quadratic in the values
    B = CSRMatrix(A.crow, A.col, -A.val, A.shape)  # same structure, another value tensor
    w3 = csr.csr_mmchain_fused(B, y, v, None, config=GATHER)
    assert relerr(w3, reference(B, y, v, None, 1.0, 0.0)) < TOL[torch.float32]
    w4 = csr.csr_mmchain_fused(A, None, v, None, config=GATHER)  # back to A: rebuilt again
    assert relerr(w4, reference(A, None, v, None, 1.0, 0.0)) < TOL[torch.float32]


def test_strategy_model_and_auto(rng, monkeypatch):
    H200 = dict(sm_count=132, bandwidth=4.28e12, regs_per_sm=65536, smem_per_sm=228 * 1024, l2_bytes=50 << 20)
    n, d, k = 4_000_000, 100_000, 32  # the benchmark's 4M x 100k, 32 nnz/row, as statistics only
    rows = csr.CSRStats(n, d, n * k, k, (0,) * 6 + (n,), 4)
    cols = csr.CSRStats(d, n, n * k, 1400, (0,) * 11 + (d // 2, d - d // 2), 4)
    # cache blocking: both passes streamed (y 400 KB in 13 tiles of 32 KB, p 16 MB in 489): the
    # bytes (6 per nonzero, 4 per segment), the L1 gathers or the segments' atomics, the longest
    tiled = csr.csr_config(rows, 1, torch.float32, H200, col_stats=cols)
    assert tiled.strategy == "gather" and tiled.tile_bytes == csr.TILE_BYTES == 32 << 10
    nnz = n * k
    s1, s2 = min(nnz, n * 13), min(nnz, d * 489)
    t1 = max((nnz * 6 + 4 * s1 + 3 * n * 4) / 4.28e12, nnz / 430e9, s1 / 100e9) + 5 * csr.LAUNCH_S
    t2 = max((nnz * 6 + 4 * s2 + n * 4 + (d + 1) * 4) / 4.28e12, nnz / 430e9, s2 / 100e9) + 2 * csr.LAUNCH_S
    assert abs(tiled.pred_gather_ms - (t1 + t2) * 1e3) < 0.002
    monkeypatch.setattr(csr, "TILE_BYTES", 0)  # the untiled model, fitted to the session-2 sweep
    cfg = csr.csr_config(rows, 1, torch.float32, H200, col_stats=cols)
    floor = (n * k * 8 + (n + 1) * 4) / 4.28e12 * 1e3
    nnz = n * k
    assert cfg.strategy == "gather" and cfg.gather is not None and cfg.gather.strategy == "gather"
    # L2-operation bound, not bytes: y gathers + REDs (scatter), 2 gathers per nonzero (gather)
    assert abs(cfg.pred_scatter_ms - (nnz / 120e9 + nnz / 100e9) * 1e3) < 0.02
    assert abs(cfg.pred_gather_ms - 2 * nnz / 120e9 * 1e3) < 0.02
    assert cfg.pred_gather_ms > 5 * floor
    # the fit reproduces the measured H200 sweep (s2: gather 2.080 ms, scatter 2.345 ms) within 5 %
    assert abs(cfg.pred_gather_ms / 2.080 - 1) < 0.05 and abs(cfg.pred_scatter_ms / 2.345 - 1) < 0.05
    assert repr(cfg).startswith("CSRConfig(strategy='gather', pred_scatter_ms=")
    low = csr.csr_config(rows, 1, torch.float32, H200, memory="low")
    assert low.strategy == "scatter" and low.gather is None
    assert csr.csr_config(rows, 4, torch.float32, H200, strategy="scatter").strategy == "scatter"
    # m = 4: the scatter's REDs grow with m, the gathers stay one sector per nonzero
    m4 = csr.csr_config(rows, 4, torch.float32, H200, col_stats=cols)
    assert m4.strategy == "gather" and m4.pred_scatter_ms > 2 * m4.pred_gather_ms
    # half the SMs: half the L2-operation rates
    half = csr.csr_config(rows, 1, torch.float32, dict(H200, sm_count=66))
    assert abs(half.pred_scatter_ms - 2 * cfg.pred_scatter_ms) < 0.02
    # a gathered vector far beyond L2 adds DRAM bursts: a 100M-column y costs more than a 100k one
    wide = csr.CSRStats(n, 100_000_000, n * k, k, (0,) * 6 + (n,), 4)
    assert csr.csr_config(wide, 1, torch.float32, H200).pred_scatter_ms > cfg.pred_scatter_ms + 0.1
    assert [csr._sectors_per_gather(m, 4) for m in (1, 3, 4, 8, 12, 16)] == [1, 1.25, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="strategy"):
        csr.csr_config(rows, strategy="fast")
    A = make_csr(rng, 200, 50, rng.integers(0, 9, 200))
    y, v = randn(rng, 50, 1), randn(rng, 200, 1)
    with pytest.raises(ValueError, match="strategy"):
        csr.csr_mmchain_fused(A, y, v, None, config={"strategy": "fast"})
    with pytest.raises(ValueError, match="memory"):
        csr.csr_mmchain_fused(A, y, v, None, config={"memory": "tiny"})
    # auto: the first call on a matrix object scatters (no copy), later calls build and use the copy
    assert csr.csr_config(A).strategy == "gather"
    ref = reference(A, y, v, None, 1.0, 0.0)
    assert relerr(csr.csr_mmchain_fused(A, y, v, None), ref) < TOL[torch.float32]
    assert csr._structure(A).csc is None
    assert relerr(csr.csr_mmchain_fused(A, y, v, None), ref) < TOL[torch.float32]
    assert csr._structure(A).csc is not None
    B = make_csr(rng, 200, 50, rng.integers(0, 9, 200))
    for _ in range(2):
        csr.csr_mmchain_fused(B, y, v, None, config={"memory": "low"})
    assert csr._structure(B).csc is None  # memory="low" never builds the copy
    sweep = csr.csr_sweep_configs(A)
    assert {c.strategy for c in sweep} == {"scatter", "gather"} and sweep[0] == csr.csr_config(A)
    assert len({c.gather for c in sweep if c.strategy == "gather"}) > 3  # CSC-pass variants
    assert {c.flat for c in sweep if c.strategy == "gather"} == {0, 1, 2, 3}  # each pass flat or not
    for c in sweep[:3] + sweep[-2:]:  # the picks and a few variants run and agree
        assert relerr(csr.csr_mmchain_fused(A, y, v, None, config=c), ref) < TOL[torch.float32], c


@pytest.mark.parametrize("idx", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("m", [1, 3])
def test_long_homogeneous_rows_loop(rng, idx, m):
    """Columns all longer than a tile (the CSC copy of a uniform matrix): the model's ordered
    row loop (several rows per program, L = pow2 <= mean/4), element-wise partial sums reduced
    once, both L1 settings; against float64, with an empty column and an empty row."""
    n, d = 1500, 5
    X = np.ones((n, d))
    X[:, 3] = 0  # an empty column
    X[7] = 0  # an empty row
    S = sp.csr_matrix(X * rng.standard_normal((n, d)))
    S.sort_indices()
    A = CSRMatrix(torch.from_numpy(S.indptr).to(idx), torch.from_numpy(S.indices).to(idx),
                  torch.from_numpy(S.data).float(), S.shape)
    cs = csr.csr_stats(A, axis=1)
    pick = csr.csr_config(A, m, strategy="gather").gather
    assert pick.ordered and not pick.single and pick.lanes == 256 and pick.block_r == pick.tile // 256, pick
    assert cs.max_len > pick.tile  # rows longer than the tile: the loop, not the long-row split
    assert csr._n_launches(cs, csr._launch_params(cs, m, torch.float32, csr._DEFAULT_GPU)) == 1
    y, v, z = randn(rng, d, m), randn(rng, n, m), randn(rng, d, m)
    ref = reference(A, y, v, z, 0.5, 2.0)
    for bypass in (False, True):
        cfg = {"strategy": "gather", "l1_bypass": bypass, "gather": {"l1_bypass": bypass}}
        w = csr.csr_mmchain_fused(A, y, v, z, 0.5, 2.0, config=cfg)
        assert relerr(w, ref) < TOL[torch.float32], bypass
    # the copy's rows as a matrix of its own: the same loop serves the pass over A's rows
    AT = csr._csc(A, csr._structure(A)).AT
    At = CSRMatrix(AT.crow.clone(), AT.col.clone(), AT.val.clone(), (d, n))
    cfg_t = csr.csr_config(At, m)
    assert cfg_t.ordered and not cfg_t.single
    t = csr.csr_matvec_fused(At, v)
    assert relerr(t, dense64(At) @ v.double()) < TOL[torch.float32]


def test_l1_bypass_model_and_huge_row(rng):
    """The model bypasses L1 for A's stream only while the gathered vector is small; one huge row
    (long-row kernels, REREAD off for the gather pass) agrees with float64 either way."""
    H200 = dict(sm_count=132, bandwidth=4.28e12, regs_per_sm=65536, smem_per_sm=228 * 1024, l2_bytes=50 << 20)
    small = csr.CSRStats(4_000_000, 100_000, 128_000_000, 32, (0,) * 6 + (4_000_000,), 4)
    big = csr.CSRStats(1_000_000, 1_000_000, 100_000_000, 100, (0,) * 8 + (1_000_000,), 4)
    assert csr.csr_config(small, 1, torch.float32, H200).l1_bypass  # y: 400 KB
    assert not csr.csr_config(big, 1, torch.float32, H200).l1_bypass  # y: 4 MB
    assert not csr.csr_config(small, 4, torch.float32, H200).l1_bypass  # y: 1.6 MB
    assert csr.csr_config(small).launch_key() == dataclasses.replace(
        csr.csr_config(small), l1_bypass=not csr.csr_config(small).l1_bypass).launch_key()
    lens = rng.integers(0, 4, 50)
    lens[20] = 2900  # one huge row past the long threshold (1024)
    lens[::7] = 0
    A = make_csr(rng, 50, 3000, lens, torch.int64)
    y, v = randn(rng, 3000, 2), randn(rng, 50, 2)
    ref = reference(A, y, v, None, 1.0, 0.0)
    for strategy in ("scatter", "gather"):
        for bypass in (False, True):
            cfg = {"strategy": strategy, "l1_bypass": bypass, "gather": {"l1_bypass": bypass}}
            assert relerr(csr.csr_mmchain_fused(A, y, v, None, config=cfg), ref) < TOL[torch.float32]


@pytest.mark.parametrize("strategy", ["scatter", "gather"])
def test_public_api_strategy(rng, strategy):
    n, d, lens = profile_lengths(rng, "power_law")
    A = make_csr(rng, n, d, lens)
    S = sp.csr_matrix((A.val.numpy(), A.col.numpy(), A.crow.numpy()), shape=A.shape)
    y, v, z = randn(rng, d + 1, 3), torch.rand(n), randn(rng, d + 1, 3)
    ref = reference(A, y, v[:, None].expand(n, 3), z, 0.5, 1.0, True)
    cfg = {"strategy": strategy}
    for X in (A, S):
        w = fusedml.mmchain(X, y, v, z, 0.5, 1.0, intercept=True, backend="fused", config=cfg)
        assert relerr(w, ref) < TOL[torch.float32]
    assert (csr._structure(A).csc is not None) == (strategy == "gather")  # the config reached the kernels


# ------------------------------------------------------------------------------------------------
# Ahead-of-time compilation for the H200 (sm_90) without a GPU: catches kernels that run in the
# interpreter but do not compile (fp64, 3-D tiles, loops), and checks that the scatter is a RED.
# Runs this file as a script in a subprocess (the interpreter must be off before triton loads).
# ------------------------------------------------------------------------------------------------
def _aot_compile_variants():
    import re

    from _sm90 import compile_sm90, local_memory_in_loops, resource_usage, sass

    k_rows = csr._csr_rows_kernel

    def build(fn, types, consts, warps):
        # specialised as the JIT specialises a first launch (aligned pointers, slot_lo = prog_base = 0)
        return compile_sm90(fn, types, consts, dict(slot_lo=0, prog_base=0), num_warps=warps)

    def types(idx, val, acc):
        return dict(crow_ptr=f"*{idx}", col_ptr=f"*{idx}", val_ptr=f"*{val}", rows_ptr="*i32",
                    y_ptr=f"*{acc}", v_ptr=f"*{acc}", z_ptr=f"*{acc}", out_ptr=f"*{acc}", ipart_ptr=f"*{acc}",
                    slot_lo="i64", slot_hi="i64", prog_base="i64", n_cols="i32", coef_ptr=f"*{acc}", long_rows_ptr="*i32",
                    chunk_row_ptr="*i32", chunk_first_ptr="*i32", part_ptr=f"*{acc}", CHUNK="i64")

    base = dict(M=1, MP=1, YS=1, PS=1, VM=1, BLOCK_R=32, L=32, SINGLE=True, HAS_Y=True, HAS_V=True, HAS_Z=False,
                INTERCEPT=False, SOFTMAX=False, MODE=1, ROW_PERM=False, WIDE=False, ACC64=False, L1_BYPASS=False)
    variants = [
        ("rows m1 fp32/i32", k_rows, ("i32", "fp32", "fp32"), {}),
        ("rows m1 binned intercept", k_rows, ("i32", "fp32", "fp32"), dict(L=8, BLOCK_R=128, ROW_PERM=True, INTERCEPT=True)),
        ("rows loop i64 fp64", k_rows, ("i64", "fp64", "fp64"), dict(SINGLE=False, L=64, BLOCK_R=16, ACC64=True)),
        # m = 3: y and w padded to 4 columns (as launched), and unpadded (the gather pass over a caller's v)
        ("rows m3 softmax loop", k_rows, ("i32", "fp32", "fp32"),
         dict(M=3, MP=4, YS=4, PS=4, VM=3, L=16, BLOCK_R=8, SINGLE=False, SOFTMAX=True)),
        ("rows m3 unpadded loop", k_rows, ("i32", "fp32", "fp32"),
         dict(M=3, MP=4, YS=3, PS=3, VM=3, L=16, BLOCK_R=8, SINGLE=False)),
        ("rows m5 loop", k_rows, ("i32", "fp32", "fp32"), dict(M=5, MP=8, YS=8, PS=8, VM=5, L=16, BLOCK_R=4, SINGLE=False)),
        ("rows m16 bf16", k_rows, ("i32", "bf16", "fp32"), dict(M=16, MP=16, YS=16, PS=16, VM=16, L=32, BLOCK_R=2)),
        ("rows matvec binned fp16", k_rows, ("i32", "fp16", "fp32"), dict(MODE=0, ROW_PERM=True)),
        # gather strategy: pass 1 writes p (MODE 2), pass 2 sums over the CSC copy with the z epilogue
        ("rows p-pass m4 softmax intercept", k_rows, ("i32", "fp32", "fp32"),
         dict(M=4, MP=4, YS=4, PS=4, VM=4, L=16, BLOCK_R=64, MODE=2, SOFTMAX=True, INTERCEPT=True)),
        ("rows csc-pass m1 z loop", k_rows, ("i32", "fp32", "fp32"),
         dict(MODE=0, HAS_V=False, HAS_Z=True, SINGLE=False, L=256, BLOCK_R=4)),
        ("rows csc-pass m1 loop l1-bypass", k_rows, ("i32", "fp32", "fp32"),
         dict(MODE=0, HAS_V=False, SINGLE=False, L=256, BLOCK_R=4, L1_BYPASS=True)),
        ("rows p-pass m1 l1-bypass", k_rows, ("i32", "fp32", "fp32"), dict(MODE=2, L1_BYPASS=True)),
        ("rows scatter m4 loop l1-bypass", k_rows, ("i32", "fp32", "fp32"),
         dict(M=4, MP=4, YS=4, PS=4, VM=4, L=64, BLOCK_R=4, SINGLE=False, L1_BYPASS=True)),
        ("rows csc-pass m3 z fp64", k_rows, ("i64", "fp64", "fp64"),
         dict(M=3, MP=4, YS=4, PS=3, VM=3, MODE=0, HAS_V=False, HAS_Z=True, ROW_PERM=True, L=8, BLOCK_R=64, ACC64=True)),
        ("long partial m4 fp64", csr._csr_long_partial_kernel, ("i64", "fp64", "fp64"),
         dict(M=4, MP=4, YS=4, PS=4, PIECE=128, WIDE=False, ACC64=True, REREAD=True, L1_BYPASS=False)),
        ("long partial m1 csc-pass l1-bypass", csr._csr_long_partial_kernel, ("i32", "fp32", "fp32"),
         dict(M=1, MP=1, YS=1, PS=1, PIECE=1024, WIDE=False, ACC64=False, REREAD=False, L1_BYPASS=True)),
        ("long finish m1", csr._csr_long_finish_kernel, ("i32", "fp32", "fp32"),
         dict(M=1, MP=1, YS=1, PS=1, VM=1, PIECE=1024, HAS_Y=True, HAS_V=True, HAS_Z=False, INTERCEPT=True, SOFTMAX=False,
              MODE=1, WIDE=False, ACC64=False)),
        ("long finish p-pass m2", csr._csr_long_finish_kernel, ("i32", "fp32", "fp32"),
         dict(M=2, MP=2, YS=2, PS=2, VM=2, PIECE=1024, HAS_Y=True, HAS_V=True, HAS_Z=False, INTERCEPT=True, SOFTMAX=True,
              MODE=2, WIDE=False, ACC64=False)),
        ("long finish csc-pass z", csr._csr_long_finish_kernel, ("i32", "fp32", "fp32"),
         dict(M=1, MP=1, YS=1, PS=1, VM=1, PIECE=1024, HAS_Y=True, HAS_V=False, HAS_Z=True, INTERCEPT=False, SOFTMAX=False,
              MODE=0, WIDE=False, ACC64=False)),
    ]
    for name, fn, (idx, val, acc), over in variants:
        consts = dict(base, **over) if fn is k_rows else over
        k = build(fn, types(idx, val, acc), consts, 4)
        code = sass(k)
        regs, stack = resource_usage(k)
        scatters = consts.get("MODE", 1) == 1 and fn is not csr._csr_long_partial_kernel
        has_atom = re.search(r"\b(RED|ATOM)G?\.", code) is not None
        has_red = re.search(r"\bREDG?\.E\.ADD\.F(32|64)", code) is not None
        ptx = k.asm["ptx"]
        loops = re.findall(r"Inner Loop Header(.*?)\bbra\b", ptx, re.S)
        print(f"AOT {name}: regs={regs} stack={stack} red={has_red} shared={k.metadata.shared}")
        # A's stream bypasses L1 exactly when asked (the gathered vector keeps L1)
        assert ("ld.global.cg" in ptx) == bool(consts.get("L1_BYPASS")), f"{name}: .cg loads"
        whole_rows = consts["YS"] == consts["MP"] and consts["PS"] in (consts["M"], consts["MP"])
        for body in loops if fn is k_rows and whole_rows else ():
            # row loops gathering whole (power-of-two) rows: no per-step layout change through shared
            # memory (Triton 3.6 made one for m = 1's 2-D gather and scatter: _gather_prod; every
            # version for the 4-byte-column gathers of unpadded m = 3 rows), no 64-bit multiplies.
            assert "bar.sync" not in body, f"{name}: barrier in an inner loop\n{body[:2000]}"
            assert consts.get("ACC64") or "mul.lo.s64" not in body, f"{name}: 64-bit multiply in a loop\n{body[:2000]}"

        # a few bytes saved around the loops (Triton 3.6, padded m = 5: 8 B at 32 registers), never inside
        assert stack <= 64 and local_memory_in_loops(code) == 0, f"{name}: register spills (stack {stack} B)"
        assert has_red or not scatters, f"{name}: the scatter did not compile to RED"
        assert scatters or not has_atom, f"{name}: atomics in an atomic-free (gather) pass"


def test_kernels_compile_for_sm90():
    from _sm90 import run_aot

    run_aot(__file__, 19)


if __name__ == "__main__" and "--aot" in sys.argv:
    _aot_compile_variants()


# ------------------------------------------------------------------------------------------------
# Cache blocking of the gather strategy (flat tiled streams, CSRConfig.tile_bytes)
# ------------------------------------------------------------------------------------------------
def _check_product_forms(rng, A, cfg):
    """The mmchain (mul and softmax, with and without the intercept, z, y=None) and the matvec
    under ``cfg`` against float64 (m = 1)."""
    n, d = A.shape
    y, v, z = randn(rng, d + 1, 1), torch.rand(n, 1, dtype=torch.float32), randn(rng, d + 1, 1)
    for intercept in (False, True):
        yy, zz = (y, z) if intercept else (y[:d].contiguous(), z[:d].contiguous())
        for v_op in ("mul", "softmax"):
            w = csr.csr_mmchain_fused(A, yy, v, zz, 0.5, 2.0, intercept=intercept, v_op=v_op, config=cfg)
            assert relerr(w, reference(A, yy, v, zz, 0.5, 2.0, intercept, v_op)) < TOL[torch.float32], (intercept, v_op)
        w = csr.csr_mmchain_fused(A, None, v, zz, 0.5, 2.0, intercept=intercept, config=cfg)
        assert relerr(w, reference(A, None, v, zz, 0.5, 2.0, intercept)) < TOL[torch.float32]
        t = csr.csr_matvec_fused(A, yy, intercept=intercept, config=cfg)
        assert relerr(t, dense64(A, intercept) @ yy.double()) < TOL[torch.float32]
    return y, v


@pytest.mark.parametrize("idx", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_stream_gather_passes(rng, monkeypatch, idx):
    """Both passes as tiled streams (tiny tiles and blocks of 512 forced: segments cross blocks),
    against float64: intercept, alpha/beta/z, softmax, y=None, empty rows and columns; the solvers'
    matvec reuses the stream; deterministic=True takes the atomic-free CSC pass (bitwise
    repeatable); the streams follow A.val."""
    monkeypatch.setattr(csr, "STREAM_BLOCK", 512)
    monkeypatch.setattr(csr, "L1_VECTOR_BYTES", 0)  # tile vectors of any size
    n, d = 400, 96
    lens = rng.integers(15, 40, n)
    lens[::9] = 0  # empty rows
    A = make_csr(rng, n, d - 6, lens, idx)
    A = CSRMatrix(A.crow, A.col, A.val, (n, d))  # the last 6 columns empty
    cfg = {"strategy": "gather", "tile_bytes": 128}
    W, H, _ = csr._tile_sizes(A, 1, 128)
    assert W < d and H < n  # both passes tiled
    y, v = _check_product_forms(rng, A, cfg)
    st = csr._structure(A)
    sm = st.streams[(W, H, 0)]
    assert sm.xy.tiles == -(-d // W) and sm.xtp.tiles == -(-n // H) and int((sm.xy.val != 0).sum()) == A.nnz
    for sp_, per in ((sm.xy, W), (sm.xtp, H)):
        k = sp_.key.to(torch.int32)
        blocks = k.numel() // csr.STREAM_BLOCK
        assert k.numel() % csr.STREAM_BLOCK == 0 and sp_.seg_base.numel() == sp_.tile.numel() == blocks
        assert int(((k >> 14) & 1).sum()) == sp_.seg_out.numel() == int((k < 0).sum())  # starts, ends
        assert bool(((k & 0x3FFF) < per).all()) and sp_.per == per and bool((sp_.tile[1:] >= sp_.tile[:-1]).all())
    assert st.csc is None  # both passes streamed
    w1 = csr.csr_mmchain_fused(A, y[:d], v, None, config=cfg, deterministic=True)
    assert st.csc is not None and torch.equal(w1, csr.csr_mmchain_fused(A, y[:d], v, None, config=cfg,
                                                                        deterministic=True))
    A.val.mul_(2.0)  # in place: the streams are rebuilt (X^T (v X y) is quadratic in X)
    assert relerr(csr.csr_mmchain_fused(A, y[:d], v, None, config=cfg), 4 * w1) < TOL[torch.float32]


@pytest.mark.parametrize("flat,n,d,lo,hi", [(1, 60, 20_000, 2, 9), (2, 300, 96, 4, 13), (3, 300, 96, 4, 13)])
def test_flat_stream_passes(rng, monkeypatch, flat, n, d, lo, hi):
    """``CSRConfig.flat``: untiled passes (tiles larger than the vector) read one flat stream
    (int32 keys past 2^14 entries), alone or beside the row kernel over the copy / over A: the
    mmchain (intercept, z, y=None), the matvec and the softmax form against float64; the streams
    are built only for the passes asked; ``deterministic`` keeps the row kernels."""
    monkeypatch.setattr(csr, "STREAM_BLOCK", 256)
    monkeypatch.setattr(csr, "L1_VECTOR_BYTES", 0)
    lens = rng.integers(lo, hi, n)
    lens[::11] = 0
    A = make_csr(rng, n, d, lens, torch.int32)
    cfg = {"strategy": "gather", "tile_bytes": 1 << 20, "flat": flat}
    W, H, f = csr._tile_sizes(A, 1, 1 << 20, flat)
    assert (W, H, f) == (d, n, flat)
    y, v = _check_product_forms(rng, A, cfg)
    st = csr._structure(A)
    sm = st.streams[(d, n, flat)]
    assert (sm.xy is not None) == bool(flat & 1) and (sm.xtp is not None) == bool(flat & 2)
    if flat & 1:
        assert sm.xy.tiles == 1 and sm.xy.per == d and sm.xy.key.dtype == (torch.int32 if d > 1 << 14 else torch.int16)
    if flat & 2:
        assert sm.xtp.tiles == 1 and sm.xtp.per == n and sm.xtp.key.dtype == torch.int16
    assert (st.csc is None) == bool(flat & 2)
    w1 = csr.csr_mmchain_fused(A, y[:d], v, None, config=cfg, deterministic=True)
    assert torch.equal(w1, csr.csr_mmchain_fused(A, y[:d], v, None, config=cfg, deterministic=True))
    assert relerr(w1, reference(A, y[:d], v, None, 1.0, 0.0, False)) < TOL[torch.float32]


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") != "0",
                    reason="compiled kernels need a GPU")
@pytest.mark.parametrize("flat", [1, 2, 3])
def test_cuda_flat_streams_match_float64(flat):
    """Compiled, a wide power-law matrix (300k x 2M, int32 keys on the pass over A): every flat
    setting's mmchain (intercept, z) and matvec against a float64 product on fresh inputs."""
    import datasets

    A = datasets.make_csr(300_000, 2_000_000, 24, "powerlaw", seed=flat, device="cuda", return_torch=True).X
    n, d = A.shape
    cfg = {"strategy": "gather", "tile_bytes": csr.TILE_BYTES, "flat": flat}
    assert csr._tile_sizes(A, 1, csr.TILE_BYTES, flat)[2] == flat
    g = torch.Generator(device="cuda").manual_seed(flat)
    y, z = (torch.randn(d + 1, 1, generator=g, device="cuda") for _ in range(2))
    v = torch.rand(n, 1, generator=g, device="cuda")
    A64 = A.to(dtype=torch.float64)
    ref = csr.csr_mmchain_fused(A64, y.double(), v.double(), z.double(), 0.5, 2.0, intercept=True,
                                config={"strategy": "gather", "tile_bytes": 0})
    w = csr.csr_mmchain_fused(A, y, v, z, 0.5, 2.0, intercept=True, config=cfg)
    assert relerr(w, ref) < 1e-5
    t = csr.csr_matvec_fused(A, y, intercept=True, config=cfg)
    assert relerr(t, csr.csr_matvec_fused(A64, y.double(), intercept=True, config={"tile_bytes": 0})) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") != "0",
                    reason="compiled kernels need a GPU")
@pytest.mark.parametrize("contig", [0, 1, 2, 4])
@pytest.mark.parametrize("inline", [True, False], ids=["inline-red", "atomic-add"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_stream_totals_match_float64(monkeypatch, inline, dtype, contig):
    """Compiled, both ways the stream pass adds its segment totals (``tl.atomic_add``, the tiled
    streams' default, and inline ``red``) at each number of elements a thread (``STREAM_CONTIG``;
    0 the default), fp32 and fp64 (``red.f64``): tiled streams on both passes
    of a power-law matrix, the mmchain (intercept, z) and matvec against the float64 row kernels on
    fresh inputs."""
    import datasets

    monkeypatch.setattr(csr, "STREAM_INLINE_RED", inline)
    monkeypatch.setattr(csr, "STREAM_CONTIG", contig)
    A = datasets.make_csr(200_000, 50_000, 40, "powerlaw", seed=5, device="cuda", return_torch=True).X
    A = A.to(dtype=dtype)
    n, d = A.shape
    cfg = {"strategy": "gather", "tile_bytes": csr.TILE_BYTES}
    W, H, _ = csr._tile_sizes(A, 1, csr.TILE_BYTES)
    assert W < d and H < n  # both passes tiled
    g = torch.Generator(device="cuda").manual_seed(int(inline))
    y, z = (torch.randn(d + 1, 1, generator=g, device="cuda", dtype=dtype) for _ in range(2))
    v = torch.rand(n, 1, generator=g, device="cuda", dtype=dtype)
    A64 = A.to(dtype=torch.float64)
    ref = csr.csr_mmchain_fused(A64, y.double(), v.double(), z.double(), 0.5, 2.0, intercept=True,
                                config={"strategy": "gather", "tile_bytes": 0})
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert relerr(csr.csr_mmchain_fused(A, y, v, z, 0.5, 2.0, intercept=True, config=cfg), ref) < tol
    t = csr.csr_matvec_fused(A, y, intercept=True, config=cfg)
    assert relerr(t, csr.csr_matvec_fused(A64, y.double(), intercept=True, config={"tile_bytes": 0})) < tol


def test_model_builds_flat_streams_without_the_copy(monkeypatch):
    """The model's own pick on a power-law matrix (binned rows and columns, vectors past "L1"):
    the first gather call takes the column statistics, so both passes are flat streams from the
    start; no CSC copy is built and the matvec reads the same stream. Against float64."""
    import datasets

    monkeypatch.setattr(csr, "L1_VECTOR_BYTES", 0)
    monkeypatch.setattr(csr, "TILE_BYTES", 1 << 20)  # no tile: the vectors are smaller
    monkeypatch.setattr(csr, "STREAM_BLOCK", 256)
    A = datasets.make_csr(2000, 3000, 16, "powerlaw", seed=3, return_torch=True).X
    n, d = A.shape
    g = torch.Generator().manual_seed(3)
    y, v = torch.randn(d, 1, generator=g), torch.rand(n, 1, generator=g)
    ref = reference(A, y, v, None, 1.0, 0.0)
    for _ in range(2):
        assert relerr(csr.csr_mmchain_fused(A, y, v, None, config={"strategy": "gather"}), ref) < TOL[torch.float32]
    st = csr._structure(A)
    assert st.csc is None and list(st.streams) == [(d, n, 3)]
    calls = []
    real = csr._stream_pass
    monkeypatch.setattr(csr, "_stream_pass", lambda *a, **k: calls.append(1) or real(*a, **k))
    t = csr.csr_matvec_fused(A, y, config={"strategy": "gather"})
    assert calls and relerr(t, dense64(A) @ y.double()) < TOL[torch.float32]


def test_flat_plan_model():
    """Flat streams only for m = 1 passes whose vector outgrows L1, segments of two nonzeros or
    more on average, vectors up to 2^30 entries; ``flat`` bits only where no tile applies."""
    assert csr._flat_plan(1_000_000, 4_000_000, 32_000_000, 1, 4)
    assert not csr._flat_plan(1_000_000, 4_000_000, 32_000_000, 3, 4)  # m > 1
    assert not csr._flat_plan(1_000_000, 20_000, 32_000_000, 1, 4)  # 80 KB: gathered from L1
    assert not csr._flat_plan(1_000_000, 4_000_000, 1_500_000, 1, 4)  # 1.5 nonzeros a segment
    assert not csr._flat_plan(1000, 2**31, 10**6, 1, 4)  # past 2^30 entries
    with pytest.raises(ValueError, match="flat must be"):
        csr.check_csr_launch(dataclasses.replace(csr.csr_config(csr.CSRStats(10, 10, 20, 2, (0, 0, 10))), flat=4), 1)


def test_flat_passes_in_the_model(monkeypatch):
    """``FLAT_PASSES`` sets the gather config's ``flat`` bits and the prediction of the passes it
    streams (one launch each: the binned row passes of a wide power-law matrix took ~10)."""
    n, d, nnz = 1_000_000, 4_000_000, 32_000_000
    rows = csr.CSRStats(n, d, nnz, 5000, (0, 0, 0, 0, 0, 0, 400_000, 400_000, 150_000, 40_000, 10_000))
    cols = csr.CSRStats(d, n, nnz, 200_000, (500_000, 1_000_000, 1_000_000, 800_000, 400_000, 200_000, 80_000,
                                             15_000, 4_000, 1_000))
    monkeypatch.setattr(csr, "FLAT_PASSES", 0)
    base = csr.csr_config(rows, 1, col_stats=cols, strategy="gather")
    assert base.flat == 0
    monkeypatch.setattr(csr, "FLAT_PASSES", 3)
    cfg = csr.csr_config(rows, 1, col_stats=cols, strategy="gather")
    assert cfg.flat == 3 and cfg.pred_gather_ms < base.pred_gather_ms  # fewer launches
    assert csr.csr_config(rows, 1, col_stats=cols, strategy="scatter").flat == 0
    assert csr.csr_config(rows, 1, strategy="gather").flat == 1  # the copy's columns unknown
    # ordered rows (uniform lengths, one launch in storage order): the row kernel stays
    uni = csr.CSRStats(n, 1_000_000, 100 * n, 100, (0,) * 8 + (n,))
    assert csr.csr_config(uni, 1, strategy="gather").flat == 0
    monkeypatch.setattr(csr, "TILE_BYTES", 0)  # no streams at all
    assert csr.csr_config(rows, 1, col_stats=cols, strategy="gather").flat == 0


def test_streamed_mmchain_epilogue_equals_torch_form(rng, monkeypatch):
    """The streamed product's two-launch epilogue (``_streamed_mmchain``: p and the intercept's sum
    in one launch over several programs, the result started as beta z) against the torch-op form
    (``_STREAM_EPILOGUE = False``) and float64: with and without v, z, beta, intercept."""
    monkeypatch.setattr(csr, "STREAM_BLOCK", 512)
    monkeypatch.setattr(csr, "L1_VECTOR_BYTES", 0)
    monkeypatch.setattr(csr, "EPILOGUE_BLOCK", 128)
    n, d = 300, 96  # three of the epilogue's programs, the last one partial
    lens = rng.integers(4, 13, n)
    lens[::7] = 0
    A = make_csr(rng, n, d, lens, torch.int32)
    cfg = {"strategy": "gather", "tile_bytes": 128}
    W, H, _ = csr._tile_sizes(A, 1, 128)
    assert W < d and H < n
    y, v, z = randn(rng, d + 1, 1), torch.rand(n, 1, dtype=torch.float32), randn(rng, d + 1, 1)
    calls = []
    real = csr._streamed_mmchain
    monkeypatch.setattr(csr, "_streamed_mmchain", lambda *a: calls.append(1) or real(*a))
    for intercept, has_v, has_z, beta in ((False, True, True, 2.0), (True, True, True, 2.0), (True, False, True, 2.0),
                                          (False, True, False, 0.0), (True, True, True, 0.0)):
        yy, zz = (y, z) if intercept else (y[:d].contiguous(), z[:d].contiguous())
        vv, zv = (v if has_v else None), (zz if has_z else None)
        got = {}
        for on in (True, False):
            monkeypatch.setattr(csr, "_STREAM_EPILOGUE", on)
            got[on] = csr.csr_mmchain_fused(A, yy, vv, zv, 0.5, beta, intercept=intercept, config=cfg)
        assert got[True].shape == got[False].shape == (d + intercept, 1)
        ref = reference(A, yy, vv, zv, 0.5, beta, intercept)
        assert relerr(got[True], ref) < TOL[torch.float32] and relerr(got[False], ref) < TOL[torch.float32]
        assert relerr(got[True], got[False]) < 1e-6, (intercept, has_v, has_z, beta)
    assert len(calls) == 5  # the epilogue ran in every case where it was on


@pytest.mark.parametrize("block,per", [(2048, 100), (256, 100), (256, 70_000), (256, 64)])
def test_stream_kernel_segments(rng, monkeypatch, block, per):
    """The stream kernel alone: segments longer than a block, one per block, crossing blocks,
    empty segments and tiles, a tile filling whole blocks, a partial last tile, fp32 and fp64,
    against a float64 index_add; int16 keys, and int32 keys for tiles past 2^14 entries."""
    monkeypatch.setattr(csr, "STREAM_BLOCK", block)
    n_out, tiles = 700, 4
    outs = lambda k: torch.from_numpy(rng.integers(0, n_out, k))  # noqa: E731
    parts = [outs(2048),  # tile 0: two whole blocks; tile 1: empty
             2 * n_out + torch.cat([outs(400), torch.full((2100,), 350)]),  # one output over 3 blocks
             3 * n_out + outs(452)]
    for key in (torch.sort(torch.cat(parts)).values, torch.zeros(0, dtype=torch.int64)):
        nnz = key.numel()
        t = key // n_out
        n_vec = per * tiles - per // 3  # the last tile partial
        idx = (t * per + torch.from_numpy(rng.integers(0, per, nnz))).clamp(max=n_vec - 1).to(torch.int32)
        for dt in (torch.float32, torch.float64):
            val, vec = torch.randn(nnz, dtype=dt), torch.randn(n_vec, dtype=dt)
            ref = torch.zeros(n_out, dtype=torch.float64).index_add_(0, key % n_out,
                                                                        val.double() * vec.double()[idx.long()])
            sp_ = csr._make_stream(key, idx, val, tiles, n_out, per)
            assert sp_.key.dtype == (torch.int16 if per <= 1 << 14 else torch.int32)
            out = csr._stream_pass(sp_, vec)
            assert out.dtype == dt and out.shape == (n_out,)
            assert relerr(out, ref) < TOL[dt] if nnz else not out.any()


def test_tile_plan_model():
    """Tiles only m = 1 passes whose gathered vector outgrows L1, when the segments hold two
    nonzeros or more on average."""
    kb = csr.TILE_BYTES
    assert csr._tile_plan(1_000_000, 100_000, 32_000_000, 1, 4, kb) == kb // 4  # y 400 KB: tiled
    assert csr._tile_plan(1_000_000, 30_000, 32_000_000, 1, 4, kb) == 30_000  # y 120 KB fits in L1
    assert csr._tile_plan(1_000_000, 40_000, 32_000_000, 1, 4, kb) == kb // 4  # 160 KB does not
    assert csr._tile_plan(1_000_000, 100_000, 4_000_000, 1, 4, kb) == 100_000  # 4 nnz/row: segments of 1
    assert csr._tile_plan(1_000_000, 100_000, 32_000_000, 3, 4, kb) == 100_000  # m > 1: not streamed
    assert csr._tile_plan(10, 10**6, 10**6, 1, 4, 0) == 10**6  # tile_bytes 0: never
    assert csr._tile_plan(1000, 10**6, 10**7, 1, 4, 1 << 20) == 1 << 14  # at most 2^14 per tile
    assert csr._tile_plan(1000, 10**6, 2**31 - 10**4, 1, 4, kb) == 10**6  # the padded stream < 2^31


# ------------------------------------------------------------------------------------------------
# The gather probes of benchmarks/ (their kernels against float64; the scripts end to end)
# ------------------------------------------------------------------------------------------------
from _bench import bench_module as _bench_module  # noqa: E402


def test_gather_probe_smoke(tmp_path):
    """benchmarks/gather_probe.py: its gather kernel sums val * y[idx] (against float64), and the
    script runs end to end under the interpreter (every case, JSON written)."""
    mod = _bench_module("gather_probe")
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 700, (5000,), generator=g, dtype=torch.int32)
    val, y = torch.randn(5000, generator=g), torch.randn(700, generator=g)
    for cg in (True, False):
        out = mod.gather(idx, val, y, 3, block=256, cg=cg)
        assert abs(float(out.double().sum()) - float((val.double() * y.double()[idx.long()]).sum())) < 1e-3
    rows = mod.main(["--nnz", "2048", "--out", str(tmp_path / "g.json")])
    assert {r["case"] for r in rows} >= {"random", "tiled 64 KB", "cusparse X@y", "cusparse tiles"}
    assert (tmp_path / "g.json").exists()


def test_stream_probe_smoke(tmp_path):
    """benchmarks/stream_probe.py: the full segmented pass (scan, owner stores, boundary atomics)
    against float64 on a stream whose segments cross blocks; every step runs."""
    rows, err = _bench_module("stream_probe").main(["--rows", "300", "--tiles", "3", "--out", str(tmp_path / "s.json")])
    assert [r["step"] for r in rows] == ["gather", "+keys", "+scan", "+stores", "v2 gather", "v2 +scan", "v2 pass"]
    assert err < 1e-6


def test_bench_csr_tiles_smoke(tmp_path):
    """benchmarks/bench_csr_tiles.py under the interpreter on a ``--matrices`` spec: each tile
    setting, the streams' two ways of adding segment totals (also at one element a thread,
    ``--contig 1``), the scatter strategy and the model's pick get a row with a small error against
    float64."""
    import json

    out = tmp_path / "ct.json"
    default_red, default_contig = csr.STREAM_INLINE_RED, csr.STREAM_CONTIG
    _bench_module("bench_csr_tiles").main(["--matrices", "1500x2500:6:powerlaw", "--tiles", "0", "16384",
                                           "--scatter", "--red", "--contig", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    tb = csr.TILE_BYTES >> 10
    red = [f"fused {tb} KB, inline red", "fused flat 3, inline red",
           f"fused {tb} KB, tl.atomic_add", "fused flat 3, tl.atomic_add"]
    contig = [f"fused {tb} KB, contig 1, tl.atomic_add", "fused flat 3, contig 1, tl.atomic_add",
              f"fused {tb} KB, contig 1, inline red", "fused flat 3, contig 1, inline red"]
    assert [r["variant"] for r in rows if r["m"] == 1] == ["ops (cached X^T)", "fused gather untiled",
                                                          "fused gather tile 16 KB", *red, *red[:2], *contig,
                                                          "fused scatter", "fused auto (model)"]
    assert (csr.STREAM_INLINE_RED, csr.STREAM_CONTIG) == (default_red, default_contig)
    assert all(r["matrix"] == "powerlaw-1500x2500-6" and r["rel_err"] < 1e-5 for r in rows)


def test_csr_input_probe_smoke(tmp_path):
    """benchmarks/csr_input_probe.py on the ops backend (the fused one takes minutes under the
    interpreter): a row per fit with both inputs timed and the same coefficients."""
    rows = _bench_module("csr_input_probe").main(["--algos", "logistic", "poisson", "--backends", "ops", "--fits", "1",
                                                  "--out", str(tmp_path / "c.json")])
    assert [(r["algo"], r["backend"]) for r in rows] == [("logistic", "ops"), ("poisson", "ops")]
    assert all(r["csrmatrix_ms"] > 0 and r["torch_sparse_ms"] > 0 and r["coef_rel_diff"] < 1e-12 for r in rows)


def test_l2_state_probe_smoke(tmp_path):
    """benchmarks/l2_state_probe.py under the interpreter: the five timings of matrix B's product,
    each with a small error against float64."""
    import json

    out = tmp_path / "l2.json"
    _bench_module("l2_state_probe").main(["--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == ["first", "after A (scatter)", "again", "after a 2 x L2 copy",
                                         "after dropping A"]
    assert all(r["ms"] > 0 and r["rel_err"] < 1e-5 for r in rows)


def test_gather_spread_probe_smoke(tmp_path):
    """benchmarks/gather_spread_probe.py under the interpreter: one fresh process per padding, each
    row with both products' times and small errors against float64."""
    import json

    out = tmp_path / "spread.json"
    _bench_module("gather_spread_probe").main(["--procs", "1", "--pad-mib", "0", "1", "--copy-mib", "1",
                                               "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["proc"], r["pad_mib"]) for r in rows] == [(0, 0.0), (0, 1.0)]
    assert all(r["fused_ms"] > 0 and r["ops_ms"] > 0 and r["copy_gbps"] > 0 for r in rows)
    assert all(r["fused_rel_err"] < 1e-5 and r["ops_rel_err"] < 1e-5 for r in rows)


@pytest.mark.parametrize("config", [None, {"strategy": "gather"}, {"strategy": "scatter"}],
                         ids=["model", "gather", "scatter"])
@pytest.mark.parametrize("m", [1, 2])
def test_strided_operands(rng, config, m):
    """y, v and z given as column slices of wider tensors (strides other than 1 and m): the kernels
    index them as contiguous, so a strided z was read at the wrong offsets (errors of 4.0 against
    float64 through the public mmchain, 2.4 in loss_gradient's multinomial gradient)."""
    A = make_csr(rng, 60, 11, rng.integers(0, 8, 60))
    wide = lambda r: torch.randn(r, 3 * m, dtype=torch.float32)[:, ::3]  # noqa: E731
    y, v, z = wide(12), wide(60), wide(12)
    assert not (y.is_contiguous() or v.is_contiguous() or z.is_contiguous())
    out = fusedml.mmchain(A, y, v, z, 0.5, 2.0, intercept=True, backend="fused", config=config)
    assert relerr(out, reference(A, y, v, z, 0.5, 2.0, intercept=True)) < TOL[torch.float32]
    xtv = fusedml.mmchain(A, None, v, z[:11], 0.5, 2.0, backend="fused", config=config)
    assert relerr(xtv, reference(A, None, v, z[:11], 0.5, 2.0)) < TOL[torch.float32]
    W = torch.randn(m + 1, 12).T  # [12, m + 1], strides (1, 12)
    T = torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, m + 1, 60)), m + 1).float()
    got = fusedml.loss_gradient(A, W, T, loss="multinomial", z=W, beta=0.5, intercept=True, backend="fused")
    ref = fusedml.loss_gradient(A, W.contiguous(), T, loss="multinomial", z=W.contiguous(), beta=0.5,
                                intercept=True, backend="ops")
    assert relerr(got.grad, ref.grad.double()) < TOL[torch.float32]
