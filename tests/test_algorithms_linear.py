"""LinearRegression / Ridge (CG on the normal equations) against scikit-learn."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from algorithms import LinearRegression, Ridge

sklm = pytest.importorskip("sklearn.linear_model")


def _rel(a, b):
    return np.linalg.norm(np.atleast_1d(np.asarray(a) - np.asarray(b))) / np.linalg.norm(np.atleast_1d(b))


def _data(rng, n=150, d=6, m=None):
    X = rng.normal(size=(n, d)) + rng.normal(size=d) * 3.0  # non-centred columns
    W = rng.normal(size=(d,) if m is None else (d, m))
    return X, X @ W + 2.0 + 0.1 * rng.normal(size=(n,) if m is None else (n, m))


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("m", [None, 3], ids=["1d", "3targets"])
def test_ridge_matches_sklearn(rng, fit_intercept, weighted, m):
    X, y = _data(rng, m=m)
    sw = rng.uniform(0.3, 3.0, size=len(X)) if weighted else None
    ours = Ridge(alpha=3.0, fit_intercept=fit_intercept, tol=1e-10, backend="cpu").fit(X, y, sample_weight=sw)
    ref = sklm.Ridge(alpha=3.0, fit_intercept=fit_intercept).fit(X, y, sample_weight=sw)
    assert np.shape(ours.coef_) == np.shape(ref.coef_)
    assert _rel(ours.coef_, ref.coef_) <= 1e-6
    if fit_intercept:
        assert _rel(ours.intercept_, ref.intercept_) <= 1e-6
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-6, atol=1e-8)
    assert ours.score(X, y, sw) == pytest.approx(ref.score(X, y, sample_weight=sw), rel=1e-8)


def test_linear_regression_matches_sklearn_and_min_norm(rng):
    X, y = _data(rng)
    ours = LinearRegression(tol=1e-12, backend="cpu").fit(X, y)
    ref = sklm.LinearRegression().fit(X, y)
    assert _rel(ours.coef_, ref.coef_) <= 1e-6 and abs(ours.intercept_ - ref.intercept_) <= 1e-6
    # rank deficient (duplicated column): CG from zero reaches the minimum-norm solution
    Xd = np.hstack([X[:, :3], X[:, :1]])
    ours = LinearRegression(tol=1e-12, fit_intercept=False, backend="cpu").fit(Xd, y)
    np.testing.assert_allclose(ours.coef_, np.linalg.lstsq(Xd, y, rcond=None)[0], rtol=1e-6, atol=1e-8)


def test_diabetes():
    ds = pytest.importorskip("sklearn.datasets")
    X, y = ds.load_diabetes(return_X_y=True)
    for alpha in (0.01, 1.0):
        ours = Ridge(alpha=alpha, tol=1e-10, backend="cpu").fit(X, y)
        ref = sklm.Ridge(alpha=alpha).fit(X, y)
        assert _rel(ours.coef_, ref.coef_) <= 1e-4
        assert ours.score(X, y) == pytest.approx(ref.score(X, y), rel=1e-8)


def test_per_target_alpha(rng):
    X, y = _data(rng, m=2)
    ours = Ridge(alpha=[0.5, 10.0], tol=1e-10, backend="cpu").fit(X, y)
    for j, a in enumerate([0.5, 10.0]):
        ref = sklm.Ridge(alpha=a).fit(X, y[:, j])
        assert _rel(ours.coef_[j], ref.coef_) <= 1e-6


def test_backends_formats_torch_and_repeated_rows(rng):
    X, y = _data(rng, n=100, d=5)
    X[rng.uniform(size=X.shape) < 0.4] = 0.0
    ref = Ridge(alpha=1.0, tol=1e-10, backend="cpu").fit(X, y)
    for backend in ("ops", "fused"):
        for Xi in (X, sp.csr_matrix(X)):
            m = Ridge(alpha=1.0, tol=1e-10, backend=backend).fit(Xi, y)
            assert m.n_iter_ == ref.n_iter_ and _rel(m.coef_, ref.coef_) <= 1e-9
    mt = Ridge(alpha=1.0, tol=1e-10, backend="cpu").fit(torch.from_numpy(X), torch.from_numpy(y))
    assert isinstance(mt.coef_, torch.Tensor) and isinstance(mt.predict(torch.from_numpy(X)), torch.Tensor)
    np.testing.assert_allclose(mt.coef_.numpy(), ref.coef_, rtol=1e-10)
    rep = rng.integers(0, 4, size=len(y))
    a = Ridge(alpha=1.0, tol=1e-12, backend="cpu").fit(X, y, sample_weight=rep)
    b = Ridge(alpha=1.0, tol=1e-12, backend="cpu").fit(np.repeat(X, rep, 0), np.repeat(y, rep))
    assert _rel(a.coef_, b.coef_) <= 1e-8


def test_float32(rng):
    X, y = _data(rng)
    m = Ridge(alpha=1.0, tol=1e-5, backend="cpu").fit(X.astype(np.float32), y.astype(np.float32))
    ref = sklm.Ridge(alpha=1.0).fit(X, y)
    assert m.coef_.dtype == np.float32 and _rel(m.coef_, ref.coef_) <= 1e-4


@pytest.mark.parametrize("cls", [LinearRegression, Ridge])
def test_float32_columns_far_from_zero(rng, cls):
    """Float32 columns whose means are hundreds of standard deviations from 0 (and a constant one):
    the implicit centring's ``X^T S X p - S mu mu^T p`` cancelled them (coefficients 0.3 off, no
    warning), so such an X is centred in a copy, as scikit-learn does; X is left as it was."""
    Z = rng.normal(size=(500, 5))
    X = np.hstack([Z + 300.0, np.full((500, 1), 7.0)]).astype(np.float32)
    y = Z @ np.ones(5) + 0.01 * rng.normal(size=500)
    X0 = X.copy()
    kw = {} if cls is LinearRegression else {"alpha": 1e-3}
    ref = getattr(sklm, cls.__name__)(**kw).fit(X.astype(np.float64), y)
    for backend, rows in (("cpu", 500), ("ops", 500), ("fused", 120)):
        m = cls(tol=1e-8, backend=backend, **kw).fit(X[:rows], y[:rows])
        r = ref if rows == 500 else getattr(sklm, cls.__name__)(**kw).fit(X[:rows].astype(np.float64), y[:rows])
        assert m._fit_info["shifted"]
        assert _rel(m.coef_, r.coef_) <= 1e-4 and abs(m.intercept_ - r.intercept_) <= 1e-3 * abs(r.intercept_)
    np.testing.assert_array_equal(X, X0)
    mt = cls(tol=1e-8, backend="cpu", **kw).fit(torch.from_numpy(X), torch.from_numpy(y))
    assert _rel(mt.coef_.numpy(), ref.coef_) <= 1e-4
    centred = cls(tol=1e-8, backend="cpu", **kw).fit(Z.astype(np.float32), y)  # the implicit form stays
    assert not centred._fit_info["shifted"]


def test_dask_columns_far_from_zero(rng):
    """A dask X far from zero against its spread (the implicit centring was 20 % off) is shifted by
    its leading rows' means as its chunks are read: the fit equals the in-memory one and X is left as
    it was. Leading rows unlike the rest (or unknown chunk sizes) still leave such columns: a warning;
    centred data neither shifts nor warns."""
    import warnings

    da = pytest.importorskip("dask.array")
    Z = rng.normal(size=(600, 3)).astype(np.float32)
    y = Z @ np.array([0.5, -1.0, 2.0], np.float32)
    Xf = Z + np.float32([300, 0, -7e3])
    ref = sklm.Ridge().fit(Xf.astype(np.float64), y)
    Xd = da.from_array(Xf, chunks=(200, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for backend in ("cpu", "ops"):
            m = Ridge(tol=1e-8, backend=backend).fit(Xd, y)
            assert m._fit_info["shifted"] and _rel(m.coef_, ref.coef_) <= 1e-4, backend
            assert abs(m.intercept_ - ref.intercept_) <= 1e-4 * abs(ref.intercept_) + 1e-4
        assert not Ridge(backend="cpu").fit(da.from_array(Z, chunks=(200, 3)), y)._fit_info["shifted"]
    np.testing.assert_array_equal(Xd.compute(), Xf)
    n = 5000  # the leading 4096 rows lie 2000 above the rest
    Zl = rng.normal(size=(n, 2)).astype(np.float32)
    Xl = Zl + np.where(np.arange(n)[:, None] < 4096, 1000, -1000).astype(np.float32) * np.float32([1, 0])
    with pytest.warns(RuntimeWarning, match="after the shift by its leading rows"):
        Ridge(backend="cpu").fit(da.from_array(Xl, chunks=(1000, 2)), Zl.sum(1))
    Xu = da.from_array(Xf, chunks=(200, 3))
    Xu = Xu[Xu[:, 1] > -np.inf]  # unknown chunk sizes: no leading-row shift
    assert np.isnan(Xu.shape[0])
    with pytest.warns(RuntimeWarning, match="lie far from zero"):
        Ridge(backend="cpu").fit(Xu, y)


@pytest.mark.skipif(not torch.cuda.is_available() or __import__("os").environ.get("TRITON_INTERPRET", "0") != "0",
                    reason="compiled kernels need a GPU")
def test_cuda_shifted_fits_match_float64():
    """Compiled: float32 columns far from zero (fresh data), in memory (a shifted copy) and as dask
    chunks (shifted as streamed), fused and ops, against scikit-learn in float64; columns at scales
    1e-2 ... 1e2 in memory (Jacobi-scaled CG)."""
    da = pytest.importorskip("dask.array")
    g = np.random.default_rng()
    Z = g.normal(size=(200_000, 24))
    X = (Z + g.uniform(-1e3, 1e3, size=24)).astype(np.float32)
    y = Z @ g.normal(size=24) + 0.1 * g.normal(size=len(Z))
    ref = sklm.Ridge(alpha=1.0).fit(X.astype(np.float64), y)
    for data in (torch.from_numpy(X).cuda(), da.from_array(X, chunks=(50_000, 24))):
        for backend in ("fused", "ops"):
            m = Ridge(alpha=1.0, tol=1e-7, backend=backend).fit(data, torch.from_numpy(y).float().cuda()
                                                                 if isinstance(data, torch.Tensor) else y)
            coef = m.coef_.cpu().numpy() if isinstance(m.coef_, torch.Tensor) else m.coef_
            assert m._fit_info["shifted"] and _rel(coef, ref.coef_) <= 1e-4, (type(data), backend)
            assert abs(float(m.intercept_) - ref.intercept_) <= 1e-3 * (1 + abs(ref.intercept_))
    Xs = (Z * np.logspace(-2, 2, 24)).astype(np.float32)
    ref = sklm.Ridge(alpha=1.0).fit(Xs.astype(np.float64), y)
    for backend in ("fused", "ops"):
        m = Ridge(alpha=1.0, tol=1e-7, backend=backend).fit(torch.from_numpy(Xs).cuda(), torch.from_numpy(y).float().cuda())
        assert m._fit_info["scaled"] and _rel(m.coef_.cpu().numpy(), ref.coef_) <= 1e-4, backend


@pytest.mark.parametrize("cls", [LinearRegression, Ridge])
def test_ill_conditioned_normal_equations_warn(rng, cls):
    """Without an intercept, a column of ones beside one near 1000 +- 1 makes X^T X's condition
    number ~1e12: CG's residual test stops after 2 steps with R^2 0.18 against scikit-learn's 0.998
    (review of session 52), so such fits warn; at tol 1e-12 they reach the solution. Well-conditioned
    fits, duplicate columns and a column of ones with an intercept do not warn."""
    import warnings

    n = 500
    x1, x2 = rng.normal(1000.0, 1.0, n), rng.normal(size=n)
    X = np.c_[np.ones(n), x1, x2]
    y = 3.0 + 2.0 * (x1 - 1000) - x2 + 0.1 * rng.normal(size=n)
    kw = {} if cls is LinearRegression else {"alpha": 1e-8}
    with pytest.warns(RuntimeWarning, match="ill-conditioned"):
        cls(fit_intercept=False, backend="cpu", **kw).fit(X, y)
    ref = getattr(sklm, cls.__name__)(fit_intercept=False, **kw).fit(X, y)
    tight = cls(fit_intercept=False, tol=1e-13, max_iter=50, backend="cpu", **kw).fit(X, y)
    assert tight.score(X, y) > 0.99 and _rel(tight.coef_, ref.coef_) < 1e-3
    Z = rng.normal(size=(300, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fi, A in ((True, Z), (False, np.c_[Z, Z[:, :1]]), (True, np.c_[np.ones(300), Z]), (True, X)):
            cls(fit_intercept=fi, backend="cpu", **kw).fit(A, A @ np.ones(A.shape[1]))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_columns_of_different_scales_use_jacobi_scaled_cg(rng, dtype):
    """Columns at scales 1e-3 ... 1e3 (unstandardised data): CG runs on the Jacobi-scaled system,
    reaching the least-squares solution (numpy's lstsq; scikit-learn's LinearRegression drops the
    1e-3 column here) in 4 steps where the plain system took 8 (float64) / 16 (float32) and warned
    of its conditioning; standard-normal columns keep the plain system."""
    import warnings

    n = 2000
    Z = rng.normal(size=(n, 5))
    X = Z * np.array([1e-3, 1.0, 1e3, 10.0, 1e-2])
    y = Z @ np.array([1.0, -2.0, 0.5, 1.0, 3.0]) + 0.1 * rng.normal(size=n)
    ref = np.linalg.lstsq(np.c_[X, np.ones(n)], y, rcond=None)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for backend in ("cpu", "ops"):
            m = LinearRegression(backend=backend).fit(X.astype(dtype), y.astype(dtype))
            assert m._fit_info["scaled"] and m.n_iter_ <= 5, (backend, m.n_iter_)
            tol = 1e-5 if dtype == np.float64 else 2e-3
            assert np.abs(m.coef_ / ref[:5] - 1).max() < tol and abs(m.intercept_ - ref[5]) < 1e-2
            r = Ridge(alpha=1e-3, backend=backend).fit(X.astype(dtype), y.astype(dtype))
            sk = sklm.Ridge(alpha=1e-3).fit(X, y)
            assert r._fit_info["scaled"] and _rel(r.coef_, sk.coef_) < (1e-6 if dtype == np.float64 else 1e-4)
        assert not LinearRegression(backend="cpu").fit(Z.astype(dtype), y)._fit_info["scaled"]
