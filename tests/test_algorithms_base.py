"""Shared machinery: objective derivatives by finite differences, solvers, parameters, pickling,
input handling and bad inputs for every linear estimator."""
import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import algorithms
from algorithms import (
    GammaRegressor,
    GeneralizedLinearRegressor,
    LinearRegression,
    LinearSVC,
    LogisticRegression,
    NotFittedError,
    PoissonRegressor,
    Ridge,
    TweedieRegressor,
)
from algorithms._loss import (
    BinomialLoss,
    GLMLoss,
    LinearObjective,
    MultinomialLoss,
    SquaredHingeLoss,
    get_family,
    get_link,
)
from algorithms._solvers import conjugate_gradient, tron


def _objective(rng, kind, weighted, n=40, d=4):
    X = torch.from_numpy(rng.normal(size=(n, d)))
    w = torch.from_numpy(rng.uniform(0.2, 2.0, size=n)) if weighted else 1.0 / n
    if kind == "binomial":
        loss, T, K = BinomialLoss(), torch.from_numpy((rng.uniform(size=(n, 1)) > 0.5) * 1.0), 1
    elif kind == "multinomial":
        y = torch.from_numpy(rng.integers(0, 3, size=n))
        loss, T, K = MultinomialLoss(), torch.nn.functional.one_hot(y, 3).double(), 3
    elif kind == "hinge":
        loss, T, K = SquaredHingeLoss(), torch.from_numpy(np.where(rng.uniform(size=(n, 3)) > 0.5, 1.0, -1.0)), 3
    elif kind == "poisson":
        loss, T, K = GLMLoss(get_family("poisson"), get_link("log")), torch.from_numpy(rng.poisson(2.0, size=(n, 1)) * 1.0), 1
    else:  # gamma with log link: non-canonical, Fisher Hessian
        loss, T, K = GLMLoss(get_family("gamma"), get_link("log")), torch.from_numpy(rng.gamma(2.0, size=(n, 1))), 1
    obj = LinearObjective(X, loss, T, w, 0.3, n_cols=K, fit_intercept=True, backend="cpu",
                          dtype=torch.float64, device=X.device)
    return X, obj


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
@pytest.mark.parametrize("kind", ["binomial", "multinomial", "hinge", "poisson", "gamma-log"])
def test_gradient_and_hessian_by_finite_differences(rng, kind, weighted):
    X, obj = _objective(rng, kind, weighted)
    W = torch.from_numpy(rng.normal(size=(obj.n_rows, obj.n_cols)) * 0.3)
    st = obj.evaluate(W)
    g, hs = obj.gradient(st)
    h = 1e-6
    E = torch.eye(W.numel(), dtype=torch.float64).reshape(-1, *W.shape)
    fd = torch.stack([(obj.evaluate(W + h * e)["f"] - obj.evaluate(W - h * e)["f"]).sum() / (2 * h) for e in E])
    torch.testing.assert_close(g.reshape(-1), fd.reshape(-1), rtol=1e-6, atol=1e-8)
    S = torch.from_numpy(rng.normal(size=W.shape))
    Hs = obj.hessp(hs, S)
    if kind == "gamma-log":
        # Fisher weight h'(eta)^2 / V(mu) = mu^2 / mu^2 = 1: H = X~^T diag(c) X~ + 0.3 mask
        Xt = torch.cat([X, torch.ones(len(X), 1, dtype=X.dtype)], 1)
        c = obj.weights if isinstance(obj.weights, torch.Tensor) else torch.full((len(X),), obj.weights)
        ref = Xt.T @ (c[:, None] * (Xt @ S)) + 0.3 * obj.mask * S
    else:
        def grad_at(Wp):
            return obj.gradient(obj.evaluate(Wp))[0]
        ref = (grad_at(W + h * S) - grad_at(W - h * S)) / (2 * h)
    torch.testing.assert_close(Hs, ref, rtol=1e-5, atol=1e-7)


def test_tron_independent_problems_equal_separate_solves(rng):
    # K independent squared-hinge problems solved together == solved one at a time
    X, obj = _objective(rng, "hinge", True)
    stop = lambda g, gn, g0: gn <= 1e-7 * g0  # noqa: E731
    res = tron(obj, obj.zeros(), max_iter=100, stop=stop)
    for j in range(obj.n_cols):
        oj = LinearObjective(X, SquaredHingeLoss(), obj.target[:, j:j + 1], obj.weights, 0.3, n_cols=1,
                             fit_intercept=True, backend="cpu", dtype=torch.float64, device=X.device)
        rj = tron(oj, oj.zeros(), max_iter=100, stop=stop)
        torch.testing.assert_close(res.W[:, j], rj.W[:, 0], rtol=1e-9, atol=1e-12)
        assert res.n_iter[j] == rj.n_iter[0]


def test_conjugate_gradient_solves_spd_system(rng):
    A = torch.from_numpy(rng.normal(size=(8, 8)))
    A = A @ A.T + torch.eye(8, dtype=torch.float64)
    B = torch.from_numpy(rng.normal(size=(8, 2)))
    res = conjugate_gradient(lambda P: A @ P, B, tol=1e-12, max_iter=100)
    torch.testing.assert_close(res.W, torch.linalg.solve(A, B), rtol=1e-9, atol=1e-10)
    assert res.converged


ESTIMATORS = [
    (LogisticRegression, "class"), (LinearSVC, "class"), (Ridge, "reg"), (LinearRegression, "reg"),
    (PoissonRegressor, "count"), (GammaRegressor, "pos"), (TweedieRegressor, "count"),
    (GeneralizedLinearRegressor, "reg"),
]


def _xy(rng, target, n=60, d=3):
    X = rng.normal(size=(n, d))
    z = X @ np.array([1.0, -0.5, 0.3])
    y = {"class": (z > 0).astype(int), "reg": z + 0.1 * rng.normal(size=n),
         "count": rng.poisson(np.exp(0.3 * z)).astype(float), "pos": np.exp(0.3 * z) + 0.1}[target]
    return X, y


@pytest.mark.parametrize("cls,target", ESTIMATORS, ids=[c.__name__ for c, _ in ESTIMATORS])
def test_params_clone_pickle_not_fitted(rng, cls, target):
    X, y = _xy(rng, target)
    est = cls(backend="cpu")
    params = est.get_params()
    assert params["backend"] == "cpu" and "verbose" in params
    assert est.set_params(tol=1e-7) is est and est.tol == 1e-7
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(nonsense=1)
    assert "tol=1e-07" in repr(est)
    with pytest.raises(NotFittedError, match="not fitted"):
        est.predict(X)
    skbase = pytest.importorskip("sklearn.base")
    c = skbase.clone(est)
    assert c.get_params() == est.get_params() and c is not est
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    assert est.n_features_in_ == 3 and len(est.history_) >= 1
    est2 = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(est2.predict(X), est.predict(X))
    with pytest.raises(ValueError, match="features"):
        est.predict(X[:, :2])
    assert np.isfinite(est.score(X, y))


@pytest.mark.parametrize("cls,target", ESTIMATORS, ids=[c.__name__ for c, _ in ESTIMATORS])
def test_bad_inputs(rng, cls, target):
    X, y = _xy(rng, target)
    est = cls(backend="cpu")
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(Xn, y)
    Xi = X.copy()
    Xi[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        est.fit(Xi, y)
    with pytest.raises(ValueError, match="samples"):
        est.fit(X, y[:-1])
    with pytest.raises(ValueError, match="2-D"):
        est.fit(X[:, 0], y)
    with pytest.raises(ValueError, match="empty"):
        est.fit(X[:0], y[:0])
    with pytest.raises(TypeError, match="only CSR"):
        est.fit(sp.coo_matrix(X), y)
    with pytest.raises(TypeError, match="numbers"):
        est.fit(np.array([["a", "b", "c"]] * len(y)), y)
    with pytest.raises(ValueError, match="non-negative"):
        est.fit(X, y, sample_weight=-np.ones(len(y)))
    with pytest.raises(ValueError, match="sample_weight"):
        est.fit(X, y, sample_weight=np.ones(len(y) + 1))
    with pytest.raises(ValueError, match="tol"):
        cls(tol=-1.0, backend="cpu").fit(X, y)
    if target != "class":
        yn = y.astype(float).copy()
        yn[0] = np.nan
        with pytest.raises(ValueError, match="NaN"):
            est.fit(X, yn)


@pytest.mark.parametrize("cls", [LogisticRegression, LinearSVC])
def test_classifier_bad_labels_and_params(rng, cls):
    X, y = _xy(rng, "class")
    with pytest.raises(ValueError, match="only one class"):
        cls(backend="cpu").fit(X, np.zeros(len(y)))
    with pytest.raises(ValueError, match="NaN"):
        cls(backend="cpu").fit(X, np.where(y > 0, np.nan, 1.0))
    with pytest.raises(ValueError, match="C must be > 0"):
        cls(C=0.0, backend="cpu").fit(X, y)
    with pytest.raises(ValueError, match="class_weight keys"):
        cls(class_weight={7: 1.0}, backend="cpu").fit(X, y)
    with pytest.raises(ValueError, match="max_iter"):
        cls(max_iter=0, backend="cpu").fit(X, y)
    with pytest.raises(ValueError, match="backend"):
        cls(backend="gpu").fit(X, y)
    if cls is LogisticRegression:
        with pytest.raises(ValueError, match="solver"):
            cls(solver="saga").fit(X, y)


def test_integer_and_list_inputs_and_score_weights(rng):
    X, y = _xy(rng, "class")
    Xi = np.round(X * 10).astype(np.int64)
    a = LogisticRegression(tol=1e-8, backend="cpu").fit(Xi, y)
    b = LogisticRegression(tol=1e-8, backend="cpu").fit(Xi.astype(float).tolist(), y.tolist())
    np.testing.assert_allclose(a.coef_, b.coef_)
    sw = rng.uniform(size=len(y))
    pred = a.predict(Xi)
    assert a.score(Xi, y, sample_weight=sw) == pytest.approx(((pred == y) * sw).sum() / sw.sum())


def test_fused_backend_unavailable_message(rng, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    X, y = _xy(rng, "class")
    from fusedml import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="fused"):
        LogisticRegression(backend="fused").fit(X, y)


def test_dask_input_matches_in_memory(rng):
    da = pytest.importorskip("dask.array")
    X, y = _xy(rng, "class", n=90)
    Xd = da.from_array(X, chunks=(25, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = LogisticRegression(tol=1e-8, backend="cpu").fit(Xd, y)
    b = LogisticRegression(tol=1e-8, backend="cpu").fit(X, y)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-8)
    np.testing.assert_array_equal(a.predict(Xd), b.predict(X))


def test_exports():
    for name in ("LogisticRegression", "LinearSVC", "Ridge", "LinearRegression", "PoissonRegressor",
                 "GammaRegressor", "TweedieRegressor", "GeneralizedLinearRegressor", "NotFittedError",
                 "ConvergenceWarning", "GaussianMixture", "KMeans"):
        assert hasattr(algorithms, name), name
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)
