"""Public-API coverage: small, seeded tests of public functions and methods no other test calls.

CPU only (Triton interpreter); every test checks values, not just that a call runs.
"""
import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import datasets
import fusedml
from fusedml import CSRMatrix, as_csr, as_matrix, interpret_mode
from fusedml import bench
from fusedml._validation import check_finite, is_sparse
from fusedml.mmchain import csr as csr_mod
from fusedml.mmchain import launch
from fusedml.mmchain.reference import matvec_reference

# Row lengths 0, 1, 2, 3, 4, 5 over D = 7 (nnz = 15).
LENGTHS = [0, 1, 2, 3, 4, 5]


def _known_csr(dtype=torch.float32, index_dtype=torch.int32):
    crow = torch.tensor(np.concatenate([[0], np.cumsum(LENGTHS)]), dtype=index_dtype)
    col = torch.cat([torch.arange(n) for n in LENGTHS]).to(index_dtype)  # row i: columns 0..i-1
    val = torch.arange(1, 16, dtype=torch.float64).to(dtype)
    return CSRMatrix(crow, col, val, (6, 7))


def _dense_of_known():
    D = np.zeros((6, 7))
    k = 1
    for i, n in enumerate(LENGTHS):
        for j in range(n):
            D[i, j] = k
            k += 1
    return D


# ------------------------------------------------------------------------------------------------
# CSRMatrix methods and the validation helpers
# ------------------------------------------------------------------------------------------------
def test_csrmatrix_properties_and_row_lengths():
    A = _known_csr()
    assert A.nnz == 15 and A.dtype == torch.float32 and A.device == torch.device("cpu")
    rl = A.row_lengths()
    assert rl.shape == (6,) and rl.tolist() == LENGTHS
    np.testing.assert_array_equal(A.to_dense().numpy(), _dense_of_known())


def test_csrmatrix_to_casts_values_and_leaves_self_unchanged():
    A = _known_csr(torch.float32, torch.int64)
    B = A.to(dtype=torch.float64)
    assert B.dtype == torch.float64 and B.shape == A.shape
    assert B.crow.dtype == torch.int64 and B.col.dtype == torch.int64  # index dtype kept
    assert A.dtype == torch.float32  # frozen input untouched
    np.testing.assert_array_equal(B.to_dense().numpy(), _dense_of_known())
    C = A.to(device="cpu")
    assert C.dtype == torch.float32 and torch.equal(C.val, A.val)
    assert A.to().val is A.val  # nothing to do: shared, not copied


def test_csrmatrix_to_scipy_values_and_half_precision():
    A = _known_csr(torch.float64)
    S = A.to_scipy()
    assert sp.issparse(S) and S.format == "csr" and S.shape == (6, 7) and S.dtype == np.float64
    np.testing.assert_array_equal(S.toarray(), _dense_of_known())
    Sh = _known_csr(torch.float16).to_scipy()
    assert Sh.dtype == np.float32  # numpy has no bfloat16: half precision comes back as float32
    np.testing.assert_array_equal(Sh.toarray(), _dense_of_known())


def test_csrmatrix_to_torch_shares_memory_and_round_trips():
    A = _known_csr(torch.float32, torch.int64)
    T = A.to_torch()
    assert T.layout == torch.sparse_csr and tuple(T.shape) == (6, 7)
    assert T.values().data_ptr() == A.val.data_ptr()
    B = as_csr(T)
    assert torch.equal(B.crow, A.crow) and torch.equal(B.col, A.col) and torch.equal(B.val, A.val)


def test_as_csr_from_scipy_and_rejections():
    D = _dense_of_known()
    B = as_csr(sp.csr_matrix(D.astype(np.float32)))
    assert B.shape == (6, 7) and B.nnz == 15 and B.dtype == torch.float32
    np.testing.assert_array_equal(B.to_dense().numpy(), D)
    with pytest.raises(TypeError, match="csc"):
        as_csr(sp.csc_matrix(D))
    with pytest.raises(TypeError, match="expected a CSR"):
        as_csr(np.ones((2, 2)))
    bad = sp.csr_matrix((np.ones(2), np.array([1, 0]), np.array([0, 2])), shape=(1, 3))  # unsorted row
    with pytest.raises(ValueError, match="sorted"):
        as_csr(bad)
    assert as_csr(bad, check_structure=False).nnz == 2


def test_as_matrix_and_is_sparse():
    X = np.arange(6, dtype=np.float32).reshape(2, 3)
    M = as_matrix(X)
    assert isinstance(M, torch.Tensor) and M.shape == (2, 3) and torch.equal(M, torch.from_numpy(X))
    assert isinstance(as_matrix(sp.csr_matrix(X)), CSRMatrix)
    assert is_sparse(sp.coo_matrix(X)) and is_sparse(_known_csr()) and not is_sparse(X)
    with pytest.raises(ValueError, match="empty"):
        as_matrix(np.zeros((0, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="coo"):
        as_matrix(sp.coo_matrix(X))


def test_check_finite_counts():
    check_finite(torch.tensor([1.0, 2.0]), "a")
    check_finite(torch.tensor([1, 2]), "ints")  # integer tensors are not checked
    with pytest.raises(ValueError, match=r"w contains 2 NaN and 1 infinite"):
        check_finite(torch.tensor([float("nan"), 1.0, float("inf"), float("nan")]), "w")


def test_interpret_mode_follows_environment(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpret_mode() is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert interpret_mode() is False
    monkeypatch.delenv("TRITON_INTERPRET")
    assert interpret_mode() is False


def test_matvec_reference_intercept(rng):
    X = rng.standard_normal((9, 4))
    y = rng.standard_normal(5)
    t = matvec_reference(torch.from_numpy(X), torch.from_numpy(y), intercept=True)
    assert t.dtype == torch.float64 and t.shape == (9,)
    np.testing.assert_allclose(t.numpy(), X @ y[:4] + y[4], rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# Launch models
# ------------------------------------------------------------------------------------------------
def test_gpu_info_under_interpreter_is_h200_profile():
    g = launch.gpu_info("cpu")
    assert g == launch.H200_PROFILE
    assert g.sm_count == 132 and g.regs_per_sm == 65536
    assert g.smem_per_sm == 228 * 1024 and g.l2_bytes == 60 * 1024 * 1024 and g.max_threads_per_sm == 2048
    for f in dataclasses.fields(g):
        if f.name != "name":
            assert isinstance(getattr(g, f.name), int) and getattr(g, f.name) > 0


def _pow2(x):
    return x >= 1 and (x & (x - 1)) == 0


@pytest.mark.parametrize("N,D,m,dtype", [(1000, 8, 1, torch.float32), (100_000, 300, 4, torch.float32),
                                         (5000, 64, 3, torch.float64), (10, 20_000, 1, torch.float32)])
def test_dense_config_invariants(N, D, m, dtype):
    c = launch.dense_config(N, D, m, dtype)
    assert c.strategy in ("onchip", "coop", "chunked") and c.mode in ("vector", "small", "dot", "elementwise")
    assert _pow2(c.block_n) and _pow2(c.block_d) and _pow2(c.num_warps)
    assert c.m_pad >= m and _pow2(c.m_pad)
    assert (c.mode == "vector") == (m == 1)
    if m > 1:
        small = m <= launch.SMALL_M and D <= 1024
        assert c.mode == ("small" if small else ("elementwise" if dtype == torch.float64 else "dot"))
    if c.strategy == "onchip":
        assert c.block_d >= D
    assert 1 <= c.num_programs and c.num_stages >= 1
    # The matvec launch reuses the same tile, except fp32 rows over 128 values with a few right-hand
    # sides (one accumulator each over short column chunks); overrides replace only known fields.
    mv = launch.matvec_config(N, D, m, dtype)
    if dtype == torch.float32 and 2 <= m <= launch.MATVEC_SMALL_M_PICK[0] and D > 128:
        assert mv.mode == "small" and mv.block_d < D and mv.num_programs == -(-N // mv.block_n)
    else:
        assert mv.block_d == c.block_d and mv.block_n >= c.block_n and mv.mode != "small"
    o = c.with_overrides({"num_warps": 2, "not_a_field": 7})
    assert o.num_warps == 2 and o.block_n == c.block_n and c.with_overrides(None) is c


def test_csr_stats_known_matrix():
    A = _known_csr()
    st = csr_mod.csr_stats(A)
    assert (st.n_rows, st.n_cols, st.nnz, st.max_len) == (6, 7, 15, 5)
    # bins: empty | len 1 | len 2 | len (2, 4] | len (4, 8]
    assert st.hist == (1, 1, 1, 2, 1)
    assert st.index_bytes == 4 and st.mean_len == pytest.approx(2.5)
    assert [st.quantile_cover(q) for q in (1 / 6, 0.5, 5 / 6, 1.0)] == [1, 2, 4, 8]
    ct = csr_mod.csr_stats(A, axis=1)  # column j holds rows j+1..5: lengths 5, 4, 3, 2, 1, 0, 0
    assert (ct.n_rows, ct.n_cols, ct.nnz, ct.max_len) == (7, 6, 15, 5)
    assert ct.hist == (2, 1, 1, 2, 1)


def test_csr_config_and_sweep_invariants():
    A = _known_csr()
    c = csr_mod.csr_config(A, m=1, dtype=torch.float32)
    assert c.strategy in ("scatter", "gather")
    for w in (1, 2, 4, c.tile, 4 * c.tile):
        assert c.bin_block_r(w) == max(1, c.tile // w)
    k = c.launch_key()
    assert k.strategy == "scatter" and k.gather is None and k.tile == c.tile and k.block_r == c.block_r
    sweep = csr_mod.csr_sweep_configs(A, m=1)
    assert len(sweep) >= 1 and all(isinstance(s, csr_mod.CSRConfig) for s in sweep)


# ------------------------------------------------------------------------------------------------
# GMM statistics
# ------------------------------------------------------------------------------------------------
def test_gmmstats_merge_equals_whole(rng):
    X = rng.standard_normal((40, 3))
    w = np.array([0.3, 0.7])
    mu = rng.standard_normal((2, 3))
    pc = np.ones((2, 3))
    whole = fusedml.gmm_estep(X, w, mu, pc, "diag", backend="cpu", return_log_prob=True)
    a = fusedml.gmm_estep(X[:15], w, mu, pc, "diag", backend="cpu", return_log_prob=True)
    b = fusedml.gmm_estep(X[15:], w, mu, pc, "diag", backend="cpu", return_log_prob=True)
    m = a.merge(b)
    for f in ("log_likelihood", "nk", "s1", "s2", "log_prob"):
        torch.testing.assert_close(getattr(m, f), getattr(whole, f), rtol=1e-10, atol=1e-10)
    assert m.log_prob.shape == (40,)
    other = fusedml.gmm_estep(X[15:], w, mu + 1.0, pc, "diag", backend="cpu")
    with pytest.raises(ValueError, match="different centres"):
        a.merge(other)


# ------------------------------------------------------------------------------------------------
# Estimator methods
# ------------------------------------------------------------------------------------------------
def test_logistic_predict_log_proba_matches_log_of_proba(rng):
    from algorithms import LogisticRegression

    X = rng.standard_normal((60, 4))
    y = (X[:, 0] + 0.5 * rng.standard_normal(60) > 0).astype(np.int64)
    est = LogisticRegression(backend="cpu").fit(X, y)
    lp = np.asarray(est.predict_log_proba(X))
    assert lp.shape == (60, 2)
    np.testing.assert_allclose(np.exp(lp), np.asarray(est.predict_proba(X)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.exp(lp).sum(1), 1.0, rtol=1e-5)


def test_glm_linear_predictor_is_xw_plus_b(rng):
    from algorithms import GammaRegressor

    X = rng.standard_normal((50, 3)) * 0.3
    y = np.exp(X @ np.array([0.5, -0.2, 0.1]) + 0.3) * rng.gamma(5.0, 0.2, 50)
    est = GammaRegressor(backend="cpu").fit(X, y)
    eta = np.asarray(est.linear_predictor(X))
    np.testing.assert_allclose(eta, X @ np.asarray(est.coef_) + float(est.intercept_), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(est.predict(X)), np.exp(eta), rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# datasets and bench helpers
# ------------------------------------------------------------------------------------------------
def test_datasets_describe():
    for name in datasets.list_datasets():
        text = datasets.describe(name)
        assert isinstance(text, str) and len(text) > 20
    with pytest.raises(ValueError, match="unknown dataset"):
        datasets.describe("no_such_set")


def test_bench_dataspec_with_n():
    s = bench.parse_dataset("synthetic-csr:200x50:5:uniform")
    assert (s.kind, s.n, s.d, s.nnz_per_row, s.profile) == ("csr", 200, 50, 5.0, "uniform")
    t = s.with_n(30)
    assert (t.n, t.d, t.text) == (30, 50, "synthetic-csr:30x50:5:uniform")
    assert bench.parse_dataset(t.text) == t
    b = bench.parse_dataset("iris")
    assert b.with_n(10) is b


def test_bench_make_data_and_host_copy():
    algo = next(a for a in bench.ALGORITHMS.values() if a.task == "binary")
    assert isinstance(algo, bench.AlgoSpec)
    spec = bench.parse_dataset("synthetic-csr:200x50:5:uniform")
    ds = bench.make_data(spec, algo, seed=0)
    assert ds.task == "binary"
    X, y = bench.host_copy(ds)
    assert sp.issparse(X) and X.format == "csr" and X.shape == (200, 50) and X.dtype == np.float32
    assert X.nnz == pytest.approx(1000, rel=0.2)
    assert isinstance(y, np.ndarray) and y.shape == (200,) and set(np.unique(y)) <= {0, 1}
    again = bench.make_data(spec, algo, seed=0)
    np.testing.assert_array_equal(bench.host_copy(again)[0].toarray(), X.toarray())  # seeded
    gmm_spec = bench.parse_dataset("synthetic-gmm:100x4:3")
    msg = bench.make_data(gmm_spec, algo)
    assert isinstance(msg, str) and "gmm" in msg
    # multiclass data: 5 classes by default (the benchmark's multinomial rows), or as asked
    multi = next(a for a in bench.ALGORITHMS.values() if a.task == "multiclass")
    dense = bench.parse_dataset("synthetic-dense:300x6")
    assert len(np.unique(bench.host_copy(bench.make_data(dense, multi, seed=0))[1])) == 5
    assert len(np.unique(bench.host_copy(bench.make_data(dense, multi, seed=0, n_classes=3))[1])) == 3
    with pytest.raises(bench.BenchError, match="n_classes"):
        bench.make_data(dense, multi, n_classes=2)


def test_bound_launch_only_forms():
    """``BoundMMChain.launch_only`` and ``BoundLossGradient.launch_only`` accumulate onto what the
    caller left in ``out`` (the bound call's own first step, ``beta * z``): with that start the
    same result as the full call; with another start, that start plus the product; None off the
    bound fused dense path."""
    g = torch.Generator().manual_seed(11)
    X = torch.randn(300, 9, generator=g)
    y, z = torch.randn(10, generator=g), torch.randn(10, generator=g)
    v = torch.rand(300, generator=g)
    op = fusedml.bind_mmchain(X, y, v=v, z=z, beta=0.3, intercept=True, backend="fused")
    full = op().clone()
    bare = op.launch_only()
    assert bare is not None and op.out.shape == (10, 1)
    op.out.copy_((0.3 * z).reshape(10, 1))
    torch.testing.assert_close(bare(), full)
    op.out.zero_()
    torch.testing.assert_close(bare(), full - 0.3 * z, rtol=1e-5, atol=1e-5)
    ops = fusedml.bind_mmchain(X, y, v=v, intercept=True, backend="ops")
    assert ops.launch_only() is None and ops.out is None

    W = torch.zeros(10, 1)
    t = (torch.rand(300, 1, generator=g) < 0.5).float()
    lg = fusedml.bind_loss_gradient(X, W, t, loss="logistic", z=W, beta=0.2, intercept=True, backend="fused",
                                    objective="sum")
    W.copy_(torch.randn(10, 1, generator=g))
    r = lg()
    grad, obj = r.grad.clone(), r.objective.clone()
    go = lg.launch_only()
    assert go is not None and lg.out.shape == (10, 1)
    lg.out.copy_(0.2 * W)
    r2 = go()
    torch.testing.assert_close(r2.grad, grad)
    torch.testing.assert_close(r2.objective, obj)
    assert fusedml.bind_loss_gradient(X, W, t, loss="logistic", intercept=True, backend="ops").launch_only() is None


def test_submodules_reachable_from_the_package():
    """``import fusedml`` then ``fusedml.streaming`` / ``fusedml.distributed`` (as the README writes
    them) in a fresh interpreter: they are loaded on first access (dask only then); they were
    AttributeErrors unless something had imported them."""
    import subprocess
    import sys

    code = ("import sys, fusedml; assert 'fusedml.streaming' not in sys.modules; "
            "print(fusedml.streaming.StreamedMatrix.__name__, fusedml.distributed.fit_distributed.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["StreamedMatrix", "fit_distributed"], r.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        fusedml.nothing  # noqa: B018
