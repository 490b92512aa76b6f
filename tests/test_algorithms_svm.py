"""LinearSVC (L2-regularised squared hinge, TRON) against scikit-learn / LIBLINEAR."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from algorithms import LinearSVC

sksvm = pytest.importorskip("sklearn.svm")


def _data(rng, n=200, d=6, k=2):
    X = rng.normal(size=(n, d))
    z = X @ rng.normal(size=d) + 0.7 * rng.normal(size=n)
    y = (z > 0).astype(int) if k == 2 else np.digitize(z, np.quantile(z, np.linspace(0, 1, k + 1)[1:-1]))
    return X, y


def _rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b))


def _primal(X, y, coef, icpt, C):
    """Sum over one-vs-rest problems of 1/2 ||w_k||^2 + C sum max(0, 1 - y_ik eta_ik)^2."""
    classes = np.unique(y)
    Y = np.where(y[:, None] == classes[None, :], 1.0, -1.0)
    if coef.shape[0] == 1:
        Y = Y[:, 1:]
    eta = X @ coef.T + icpt
    return 0.5 * (coef ** 2).sum() + C * (np.maximum(0, 1 - Y * eta) ** 2).sum()


@pytest.mark.parametrize("k", [2, 4], ids=["binary", "ovr4"])
def test_matches_liblinear_without_intercept(rng, k):
    X, y = _data(rng, k=k)
    ours = LinearSVC(C=0.3, tol=1e-7, fit_intercept=False, backend="cpu").fit(X, y)
    ref = sksvm.LinearSVC(C=0.3, tol=1e-12, fit_intercept=False, dual=False, max_iter=100000).fit(X, y)
    assert ours.coef_.shape == ref.coef_.shape
    assert _rel(ours.coef_, ref.coef_) <= 1e-4
    f1, f2 = _primal(X, y, ours.coef_, 0.0, 0.3), _primal(X, y, ref.coef_, 0.0, 0.3)
    assert abs(f1 - f2) <= 1e-8 * f2
    np.testing.assert_allclose(ours.decision_function(X), ref.decision_function(X), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))


@pytest.mark.parametrize("k", [2, 4], ids=["binary", "ovr4"])
@pytest.mark.parametrize("class_weight", [{0: 2.0, 1: 0.3}, "balanced"], ids=["dict", "balanced"])
def test_class_weight_matches_liblinear(rng, k, class_weight):
    """LIBLINEAR's class weights: both classes' with two; with more, problem k weighs class k only
    (its other samples keep their weights), with sample weights too. The multiclass dict case
    differed by 0.26 in a coefficient while every sample carried its class's weight in every problem."""
    X, y = _data(rng, n=300, k=k)
    sw = rng.uniform(0.2, 2.0, size=len(y))
    for s in (None, sw):
        ours = LinearSVC(C=0.5, tol=1e-8, fit_intercept=False, class_weight=class_weight, backend="cpu").fit(
            X, y, sample_weight=s)
        ref = sksvm.LinearSVC(C=0.5, tol=1e-12, fit_intercept=False, dual=False, max_iter=100000,
                              class_weight=class_weight).fit(X, y, sample_weight=s)
        assert _rel(ours.coef_, ref.coef_) <= 1e-5
        np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    fused = LinearSVC(C=0.5, tol=1e-8, fit_intercept=False, class_weight=class_weight, backend="fused").fit(
        X[:80], y[:80], sample_weight=sw[:80])  # the objective's per-problem weights on the kernels
    cpu = LinearSVC(C=0.5, tol=1e-8, fit_intercept=False, class_weight=class_weight, backend="cpu").fit(
        X[:80], y[:80], sample_weight=sw[:80])
    assert _rel(fused.coef_, cpu.coef_) <= 1e-7


def test_unpenalised_intercept_vs_large_intercept_scaling(rng):
    # LIBLINEAR penalises the weight of a constant feature `intercept_scaling`; as it grows the
    # penalty on the intercept vanishes and the problem approaches ours.
    X, y = _data(rng, k=3)
    X = X + 2.0  # a non-zero optimal intercept
    ours = LinearSVC(C=1.0, tol=1e-8, backend="cpu").fit(X, y)
    ref = sksvm.LinearSVC(C=1.0, tol=1e-12, intercept_scaling=1e3, dual=False, max_iter=100000).fit(X, y)
    assert _rel(ours.coef_, ref.coef_) <= 1e-3
    assert _rel(ours.intercept_, ref.intercept_) <= 1e-3
    # and ours is optimal for the unpenalised-intercept objective: shifting b raises it
    f0 = _primal(X, y, ours.coef_, ours.intercept_, 1.0)
    for e in (1e-3, -1e-3):
        assert _primal(X, y, ours.coef_, ours.intercept_ + e, 1.0) > f0


def test_breast_cancer():
    ds = pytest.importorskip("sklearn.datasets")
    X, y = ds.load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    ours = LinearSVC(C=0.1, tol=1e-7, fit_intercept=False, backend="cpu").fit(X, y)
    ref = sksvm.LinearSVC(C=0.1, tol=1e-12, fit_intercept=False, dual=False, max_iter=100000).fit(X, y)
    assert _rel(ours.coef_, ref.coef_) <= 1e-4
    assert ours.score(X, y) == pytest.approx(ref.score(X, y)) and ours.score(X, y) > 0.95


def test_ovr_equals_separate_binary_problems(rng):
    X, y = _data(rng, k=3)
    multi = LinearSVC(C=0.5, tol=1e-7, backend="cpu").fit(X, y)
    for j in range(3):
        b = LinearSVC(C=0.5, tol=1e-7, backend="cpu").fit(X, (y == j).astype(int))
        assert _rel(multi.coef_[j], b.coef_[0]) <= 1e-5
        assert abs(multi.intercept_[j] - b.intercept_[0]) <= 1e-5 * max(1.0, abs(b.intercept_[0]))


def test_sample_weight_repeated_rows_and_string_labels(rng):
    X, y = _data(rng, n=120, k=3)
    labels = np.array(["a", "b", "c"])[y]
    rep = rng.integers(0, 3, size=len(y))
    a = LinearSVC(tol=1e-7, backend="cpu").fit(X, labels, sample_weight=rep)
    b = LinearSVC(tol=1e-7, backend="cpu").fit(np.repeat(X, rep, 0), np.repeat(labels, rep))
    assert _rel(a.coef_, b.coef_) <= 1e-5
    np.testing.assert_array_equal(a.classes_, ["a", "b", "c"])
    assert set(a.predict(X)) <= {"a", "b", "c"}


@pytest.mark.parametrize("k", [2, 3])
def test_backends_and_formats_agree(rng, k):
    X, y = _data(rng, n=100, d=5, k=k)
    X[rng.uniform(size=X.shape) < 0.4] = 0.0
    ref = LinearSVC(tol=1e-6, backend="cpu").fit(X, y)
    for backend in ("ops", "fused"):
        for Xi in (X, sp.csr_matrix(X)):
            m = LinearSVC(tol=1e-6, backend=backend).fit(Xi, y)
            assert m.n_iter_ == ref.n_iter_
            assert _rel(m.coef_, ref.coef_) <= 1e-9
    mt = LinearSVC(tol=1e-6, backend="cpu").fit(torch.from_numpy(X), torch.from_numpy(y))
    assert isinstance(mt.coef_, torch.Tensor)
    np.testing.assert_allclose(mt.coef_.numpy(), ref.coef_)
