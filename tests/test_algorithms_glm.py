"""GLM estimators against scikit-learn, across links and families, backends and inputs."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from algorithms import (
    GammaRegressor,
    GeneralizedLinearRegressor,
    LogisticRegression,
    PoissonRegressor,
    TweedieRegressor,
)

sklm = pytest.importorskip("sklearn.linear_model")


def _rel(a, b):
    return np.linalg.norm(np.atleast_1d(np.asarray(a) - np.asarray(b))) / np.linalg.norm(np.atleast_1d(b))


def _X(rng, n=200, d=5):
    return rng.normal(size=(n, d)) * 0.5


def _targets(rng, X):
    eta = 0.5 + X @ np.linspace(-0.6, 0.6, X.shape[1])
    return {
        "poisson": rng.poisson(np.exp(eta)).astype(float),
        "gamma": rng.gamma(3.0, np.exp(eta) / 3.0),
        "tweedie": rng.poisson(np.exp(eta)) * rng.gamma(2.0, 0.5, size=len(eta)),
        "normal": eta + 0.3 * rng.normal(size=len(eta)),
    }


@pytest.mark.parametrize(
    "ours,ref,yname",
    [
        (PoissonRegressor(alpha=0.05), sklm.PoissonRegressor(alpha=0.05), "poisson"),
        (GammaRegressor(alpha=0.05), sklm.GammaRegressor(alpha=0.05), "gamma"),
        (TweedieRegressor(power=1.5, alpha=0.05), sklm.TweedieRegressor(power=1.5, alpha=0.05), "tweedie"),
        (TweedieRegressor(power=0.0, alpha=0.05), sklm.TweedieRegressor(power=0.0, alpha=0.05), "normal"),
        (TweedieRegressor(power=3.0, alpha=0.05), sklm.TweedieRegressor(power=3.0, alpha=0.05), "gamma"),
        # power < 0: link="auto" is identity, as scikit-learn's (it was log: intercept 1.1 off)
        (TweedieRegressor(power=-0.5, alpha=0.05), sklm.TweedieRegressor(power=-0.5, alpha=0.05), "gamma"),
        (PoissonRegressor(alpha=0.05, solver="lbfgs"), sklm.PoissonRegressor(alpha=0.05), "poisson"),
        (PoissonRegressor(alpha=0.05, fit_intercept=False), sklm.PoissonRegressor(alpha=0.05, fit_intercept=False), "poisson"),
    ],
    ids=["poisson", "gamma-log", "tweedie1.5", "normal", "inverse-gaussian", "tweedie-0.5", "poisson-lbfgs",
         "poisson-noicpt"],
)
def test_matches_sklearn(rng, ours, ref, yname):
    X = _X(rng)
    y = _targets(rng, X)[yname]
    sw = rng.uniform(0.5, 2.0, size=len(y))
    ours.set_params(tol=1e-8, backend="cpu").fit(X, y, sample_weight=sw)
    ref.set_params(tol=1e-12, max_iter=10000).fit(X, y, sample_weight=sw)
    assert _rel(ours.coef_, ref.coef_) <= 1e-4
    if ref.fit_intercept:
        assert abs(ours.intercept_ - ref.intercept_) <= 1e-4 * max(1.0, abs(ref.intercept_))
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-4)
    assert ours.score(X, y, sw) == pytest.approx(ref.score(X, y, sw), rel=1e-6, abs=1e-8)
    assert isinstance(ours.n_iter_, int) and ours.history_[-1]["grad_norm"] <= 1e-6


def test_binomial_logit_equals_logistic_regression(rng):
    X = _X(rng)
    y = (X @ np.ones(X.shape[1]) + 0.5 * rng.normal(size=len(X)) > 0).astype(float)
    C = 2.0
    glm = GeneralizedLinearRegressor(family="binomial", alpha=1.0 / (C * len(y)), tol=1e-9, backend="cpu").fit(X, y)
    lr = LogisticRegression(C=C, tol=1e-9, backend="cpu").fit(X, y)
    assert _rel(glm.coef_, lr.coef_[0]) <= 1e-6
    np.testing.assert_allclose(glm.predict(X), lr.predict_proba(X)[:, 1], atol=1e-7)


@pytest.mark.parametrize(
    "family,link,yname",
    [("binomial", "probit", "binary"), ("binomial", "cloglog", "binary"), ("gamma", "inverse", "gamma"),
     ("poisson", "identity", "poisson"), ("inverse_gaussian", "log", "gamma")],
)
def test_non_canonical_links_reach_a_stationary_point(rng, family, link, yname):
    X = _X(rng, n=150, d=4)
    if yname == "binary":
        y = (X.sum(1) + 0.5 * rng.normal(size=len(X)) > 0).astype(float)
    elif yname == "poisson":
        y = rng.poisson(3.0 + X.sum(1).clip(-2, 2)).astype(float)
    else:
        y = rng.gamma(3.0, 1.0 / (1.0 + 0.2 * X.sum(1).clip(-2, 2)) / 3.0)
    m = GeneralizedLinearRegressor(family=family, link=link, alpha=0.01, tol=1e-8, backend="cpu").fit(X, y)
    # gradient of the objective at the solution, by central finite differences
    from algorithms._loss import GLMLoss, get_family, get_link

    loss = GLMLoss(get_family(family), get_link(link))
    yt = torch.from_numpy(y)[:, None]

    def f(wb):
        eta = torch.from_numpy(X @ wb[:-1] + wb[-1])[:, None]
        return float(loss.value(yt, eta).mean() + 0.005 * (wb[:-1] ** 2).sum())

    wb = np.append(m.coef_, m.intercept_)
    h = 1e-6
    g = np.array([(f(wb + h * e) - f(wb - h * e)) / (2 * h) for e in np.eye(len(wb))])
    assert np.abs(g).max() <= 1e-6
    assert 0.0 < m.score(X, y) <= 1.0


def test_backends_formats_and_torch(rng):
    X = _X(rng, n=120, d=5)
    X[rng.uniform(size=X.shape) < 0.4] = 0.0
    y = _targets(rng, X)["poisson"]
    ref = PoissonRegressor(alpha=0.02, tol=1e-8, backend="cpu").fit(X, y)
    for backend in ("ops", "fused"):
        for Xi in (X, sp.csr_matrix(X)):
            m = PoissonRegressor(alpha=0.02, tol=1e-8, backend=backend).fit(Xi, y)
            assert m.n_iter_ == ref.n_iter_
            assert _rel(m.coef_, ref.coef_) <= 1e-9
    mt = PoissonRegressor(alpha=0.02, tol=1e-8, backend="cpu").fit(torch.from_numpy(X), torch.from_numpy(y))
    assert isinstance(mt.coef_, torch.Tensor) and isinstance(mt.predict(torch.from_numpy(X)), torch.Tensor)
    np.testing.assert_allclose(mt.coef_.numpy(), ref.coef_)


def test_sample_weight_equals_repeated_rows(rng):
    X = _X(rng, n=100, d=4)
    y = _targets(rng, X)["gamma"]
    rep = rng.integers(0, 4, size=len(y))
    a = GammaRegressor(alpha=0.1, tol=1e-8, backend="cpu").fit(X, y, sample_weight=rep)
    b = GammaRegressor(alpha=0.1, tol=1e-8, backend="cpu").fit(np.repeat(X, rep, 0), np.repeat(y, rep))
    assert _rel(a.coef_, b.coef_) <= 1e-6


@pytest.mark.parametrize(
    "est,y_fn,match",
    [
        (PoissonRegressor(), lambda y: y - 5.0, "non-negative"),
        (GammaRegressor(), lambda y: y * 0.0, "strictly positive"),
        (GeneralizedLinearRegressor(family="binomial"), lambda y: y + 2.0, r"\[0, 1\]"),
        (TweedieRegressor(power=0.5), lambda y: y, r"<= 0 or >= 1"),
        (TweedieRegressor(power=float("nan")), lambda y: y, r"power must be finite"),
        (GeneralizedLinearRegressor(family="gumbel"), lambda y: y, "family must be one of"),
        (GeneralizedLinearRegressor(link="sqrt"), lambda y: y, "link must be one of"),
        (TweedieRegressor(link="logit"), lambda y: y, "link must be"),
        (PoissonRegressor(alpha=-1.0), lambda y: y, "alpha must be >= 0"),
        (GeneralizedLinearRegressor(family="gamma", link="inverse", fit_intercept=False), lambda y: y + 1.0,
         "invalid mean"),
    ],
    ids=["poisson-neg", "gamma-zero", "binomial-range", "tweedie-power", "tweedie-power-nan", "family", "link",
         "tweedie-link", "alpha", "inverse-start"],
)
def test_bad_inputs(rng, est, y_fn, match):
    X = _X(rng, n=30, d=3)
    y = rng.uniform(0.1, 0.9, size=30)
    with pytest.raises(ValueError, match=match):
        est.set_params(backend="cpu").fit(X, y_fn(y))


def test_score_checks_power_and_start_message(rng):
    """``score`` checks y and sample_weight as ``fit`` does (y outside the family's support gave NaN,
    a short sample_weight a torch error); a string power is rejected; the log link's start outside
    its domain says which start failed (the message's parentheses were garbled)."""
    X = _X(rng, n=60, d=3)
    y = _targets(rng, X)["poisson"]
    m = PoissonRegressor(backend="cpu").fit(X, y)
    with pytest.raises(ValueError, match="non-negative"):
        m.score(X, y - 5.0)
    with pytest.raises(ValueError, match="sample_weight has shape"):
        m.score(X, y, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        m.score(X, np.full(60, np.nan))
    with pytest.raises(TypeError, match="power must be a real number"):
        TweedieRegressor(power="1.5", backend="cpu").fit(X, y)
    with pytest.raises(ValueError, match=r"invalid mean for the normal family at the starting point \(coefficients 0 "
                                         r"and intercept link\(mean\(y\)\)\): try another link"):
        GeneralizedLinearRegressor(family="normal", link="log", backend="cpu").fit(X, y - y.mean() - 0.1)
