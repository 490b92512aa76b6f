"""The dispatch rule and the shared input validation."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fusedml import BackendUnavailableError, CSRMatrix, as_csr, as_matrix, resolve_backend
from fusedml._validation import check_finite, to_tensor


def test_auto_is_cpu_on_host(monkeypatch):
    monkeypatch.delenv("FUSEDML_BACKEND", raising=False)
    assert resolve_backend("auto", torch.device("cpu")) == "cpu"
    assert resolve_backend(None, torch.device("cpu")) == "cpu"


def test_auto_is_fused_on_cuda(monkeypatch):
    monkeypatch.delenv("FUSEDML_BACKEND", raising=False)
    assert resolve_backend("auto", torch.device("cuda")) == "fused"


def test_env_override_applies_to_auto_only(monkeypatch):
    monkeypatch.setenv("FUSEDML_BACKEND", "ops")
    assert resolve_backend("auto", torch.device("cpu")) == "ops"
    assert resolve_backend("cpu", torch.device("cpu")) == "cpu"
    monkeypatch.setenv("FUSEDML_BACKEND", "bogus")
    with pytest.raises(ValueError, match="FUSEDML_BACKEND"):
        resolve_backend("auto", torch.device("cpu"))


def test_fused_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("fused", torch.device("cpu")) == "fused"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match="TRITON_INTERPRET"):
        resolve_backend("fused", torch.device("cpu"))


def test_cpu_backend_rejects_device_data():
    with pytest.raises(BackendUnavailableError, match="host memory"):
        resolve_backend("cpu", torch.device("cuda"))


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cublas", torch.device("cpu"))


def test_as_matrix_dense_numpy_shares_memory_and_keeps_input(rng):
    a = rng.standard_normal((5, 3)).astype(np.float32)
    before = a.copy()
    t = as_matrix(a)
    assert isinstance(t, torch.Tensor) and t.shape == (5, 3) and t.dtype == torch.float32
    np.testing.assert_array_equal(a, before)


def test_as_matrix_rejects_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        as_matrix(np.zeros((0, 3), np.float32))
    with pytest.raises(ValueError, match="2 dimension"):
        as_matrix(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        as_matrix(np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match="strings"):
        as_matrix(np.array([["a", "b"]]))


@pytest.mark.parametrize("fmt", ["coo", "csc", "bsr", "lil"])
def test_as_matrix_rejects_non_csr_sparse(fmt):
    X = sp.random(6, 4, density=0.5, format=fmt, random_state=0, dtype=np.float32)
    with pytest.raises(TypeError, match="only CSR"):
        as_matrix(X)


def test_as_matrix_rejects_torch_coo():
    X = torch.eye(3).to_sparse()
    with pytest.raises(TypeError, match="unsupported sparse layout"):
        as_matrix(X)


@pytest.mark.parametrize("idx", [np.int32, np.int64])
def test_as_csr_scipy_roundtrip(idx, rng):
    X = sp.random(7, 5, density=0.4, format="csr", random_state=1, dtype=np.float64)
    X.indptr = X.indptr.astype(idx)
    X.indices = X.indices.astype(idx)
    A = as_csr(X)
    assert isinstance(A, CSRMatrix) and A.shape == (7, 5) and A.nnz == X.nnz
    assert A.crow.dtype == (torch.int32 if idx == np.int32 else torch.int64)
    np.testing.assert_allclose(A.to_dense().numpy(), X.toarray())
    np.testing.assert_allclose(A.to_scipy().toarray(), X.toarray())


def test_as_csr_torch_roundtrip():
    D = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    A = as_csr(D.to_sparse_csr())
    assert torch.equal(A.to_dense(), D)
    assert torch.equal(A.to_torch().to_dense(), D)


def test_as_csr_remembered_follows_every_change():
    """A torch sparse tensor gets the same CSRMatrix while unchanged; a new one after a change made
    through its accessors or through the arrays it was built from (which its version counter does
    not see); none is kept once the tensor dies; other inputs pass through as_csr."""
    import gc
    import warnings
    import weakref

    from fusedml import _validation

    S = sp.random(40, 30, density=0.2, format="csr", random_state=3, dtype=np.float32)
    crow, col, val = (torch.from_numpy(a.copy()) for a in (S.indptr, S.indices, S.data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        T = torch.sparse_csr_tensor(crow, col, val, S.shape)
    M = _validation.as_csr_remembered(T)
    assert _validation.as_csr_remembered(T) is M and M.val.data_ptr() == val.data_ptr()  # shared, not copied
    changes = (lambda: T.values().mul_(2.0), lambda: val.add_(1.0),  # the accessor's counter; no counter at all
               lambda: col.__setitem__(int(S.indptr[1]) - 1, int(col[int(S.indptr[1]) - 1]) + 1))
    for change in changes:
        change()
        M2 = _validation.as_csr_remembered(T)
        assert M2 is not M and torch.equal(M2.to_dense(), T.to_dense())
        M = M2
    assert _validation.as_csr_remembered(S) is not _validation.as_csr_remembered(S)  # scipy: converted each call
    ref = weakref.ref(T)
    T = M = M2 = None
    gc.collect()
    assert ref() is None and not any(r() is not None for r, _, _ in _validation._REMEMBERED.values())


def test_as_csr_rejects_unsorted_and_duplicates():
    unsorted = sp.csr_matrix((np.ones(3), np.array([2, 0, 1]), np.array([0, 3])), shape=(1, 3))
    with pytest.raises(ValueError, match="sorted and unique"):
        as_csr(unsorted)
    dup = sp.csr_matrix((np.ones(2), np.array([1, 1]), np.array([0, 2])), shape=(1, 3))
    with pytest.raises(ValueError, match="sorted and unique"):
        as_csr(dup)
    # Decreasing across a row boundary is fine.
    ok = sp.csr_matrix((np.ones(2), np.array([2, 0]), np.array([0, 1, 2])), shape=(2, 3))
    assert as_csr(ok).nnz == 2


def test_as_csr_rejects_bad_structure():
    bad = CSRMatrix(torch.tensor([0, 2]), torch.tensor([0, 5]), torch.ones(2), (1, 3))
    with pytest.raises(ValueError, match="column indices must lie"):
        as_csr(bad.to_torch())
    with pytest.raises(TypeError, match="floating"):
        as_csr(sp.csr_matrix(np.eye(2, dtype=np.int64)))


def test_check_finite_names_argument():
    check_finite(torch.ones(3), "v")
    with pytest.raises(ValueError, match=r"y contains 1 NaN and 1 infinite"):
        check_finite(torch.tensor([1.0, float("nan"), float("inf")]), "y")


def test_to_tensor_ndim_and_dtype():
    with pytest.raises(ValueError, match="must have 1 dimension"):
        to_tensor(np.zeros((2, 2)), "y", ndim=1)
    t = to_tensor([1, 2], "labels", allow_int=True)
    assert t.dtype == torch.int64
    assert to_tensor([1.0], "y", dtype=torch.float32).dtype == torch.float32


def _swapped(a):
    """``a`` with the same values in the other byte order (">f8" on little-endian machines)."""
    return a.astype(a.dtype.newbyteorder())


@pytest.mark.parametrize("backend", ["cpu", "fused"])
def test_byte_swapped_inputs(rng, backend):
    """Byte-swapped numpy inputs (FITS, HDF5 or network data): dense X, y, v, z and every array of a
    scipy CSR matrix give the native arrays' results, in their dtype (">f4" computes in float32),
    and stay as they were."""
    from fusedml import mmchain
    from fusedml.gmm import gmm_estep
    from fusedml.mmchain import matvec

    A = rng.normal(size=(40, 6))
    y, v, z = rng.normal(size=6), rng.random(40), rng.normal(size=6)
    for dt in (np.float64, np.float32):
        Xs, ys, vs, zs = (_swapped(a.astype(dt)) for a in (A, y, v, z))
        before = Xs.copy()
        want = mmchain(A.astype(dt), y.astype(dt), v.astype(dt), z.astype(dt), beta=0.5, backend=backend)
        got = mmchain(Xs, ys, vs, zs, beta=0.5, backend=backend)
        assert got.dtype == want.dtype and torch.equal(got, want)
        assert torch.equal(matvec(Xs, ys, backend=backend), matvec(A.astype(dt), y.astype(dt), backend=backend))
        M = sp.csr_matrix(A.astype(dt))
        Ms = sp.csr_matrix((_swapped(M.data), _swapped(M.indices), _swapped(M.indptr)), shape=M.shape)
        assert torch.equal(mmchain(Ms, ys, vs, backend=backend), mmchain(M, y.astype(dt), v.astype(dt), backend=backend))
        assert np.array_equal(Xs, before) and Xs.dtype == before.dtype
    w, mu, pc = np.full(2, 0.5), rng.normal(size=(2, 6)), np.ones((2, 6))
    g, gs = (gmm_estep(X, w, mu, pc, "diag", backend=backend) for X in (A, _swapped(A)))
    assert torch.equal(g.s1, gs.s1) and torch.equal(g.nk, gs.nk)


def test_reversed_views_and_tensors_requiring_grad(rng):
    """Numpy views with negative strides (``X[::-1]``, which torch cannot view) are copied; a torch X
    or y that requires grad gives the plain tensors' result."""
    from fusedml import mmchain

    A, y = rng.normal(size=(30, 5)), rng.normal(size=5)
    assert torch.equal(mmchain(A[::-1], y[::-1], backend="cpu"), mmchain(A[::-1].copy(), y[::-1].copy(), backend="cpu"))
    t = to_tensor(A[::-1, ::-1], "X")
    assert torch.equal(t, torch.from_numpy(A[::-1, ::-1].copy()))
    for V in (A[:, :1][:, ::-1], A[::-1][:1], A[:1, ::-1][:, :1]):  # a size-1 axis with a negative stride
        assert torch.equal(to_tensor(V, "X"), torch.from_numpy(V.copy()))
    from algorithms import GaussianMixture

    g = GaussianMixture(2, random_state=0, backend="cpu")
    assert np.array_equal(g.fit(A[:, :1][:, ::-1]).means_, g.fit(A[:, :1].copy()).means_)
    assert np.array_equal(g.fit(A).predict(A[::-1][:1]), g.predict(A[-1:].copy()))
    Ag, yg = torch.tensor(A, requires_grad=True), torch.tensor(y, requires_grad=True)
    assert torch.equal(mmchain(Ag, yg, backend="cpu"), mmchain(torch.tensor(A), torch.tensor(y), backend="cpu"))
