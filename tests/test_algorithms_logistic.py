"""LogisticRegression against scikit-learn (same objective), backends, inputs, real data."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from algorithms import LinearSVC, LogisticRegression

sklm = pytest.importorskip("sklearn.linear_model")


def _data(rng, n=200, d=6, k=2):
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    z = X @ w + 0.5 * rng.normal(size=n)
    y = (z > 0).astype(int) if k == 2 else np.digitize(z, np.quantile(z, np.linspace(0, 1, k + 1)[1:-1]))
    return X, y


def _objective(X, y, coef, icpt, C, sw=None):
    """scikit-learn's objective C * sum s_i loss_i + 1/2 ||W||^2 (float64)."""
    sw = np.ones(len(y)) if sw is None else sw
    Z = X @ coef.T + icpt
    if coef.shape[0] == 1:
        z = Z[:, 0]
        t = (y == np.unique(y)[1]).astype(float)
        loss = np.logaddexp(0, z) - t * z
    else:
        loss = np.log(np.exp(Z - Z.max(1, keepdims=True)).sum(1)) + Z.max(1) - Z[np.arange(len(y)), y]
    return C * (sw * loss).sum() + 0.5 * (coef ** 2).sum()


def _rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(np.asarray(b)), 1e-300)


@pytest.mark.parametrize(
    "solver,k,fit_intercept",
    [("newton-cg", 2, True), ("newton-cg", 4, True), ("lbfgs", 2, True), ("lbfgs", 4, True), ("newton-cg", 3, False)],
    ids=["tron-binary", "tron-multinomial", "lbfgs-binary", "lbfgs-multinomial", "tron-multinomial-noicpt"],
)
def test_matches_sklearn(rng, solver, k, fit_intercept):
    X, y = _data(rng, k=k)
    C = 0.7
    ours = LogisticRegression(C=C, tol=1e-9, solver=solver, fit_intercept=fit_intercept, backend="cpu").fit(X, y)
    ref = sklm.LogisticRegression(C=C, tol=1e-12, max_iter=10000, fit_intercept=fit_intercept).fit(X, y)
    assert ours.coef_.shape == ref.coef_.shape and ours.intercept_.shape == ref.intercept_.shape
    assert _rel(ours.coef_, ref.coef_) <= 1e-4
    if fit_intercept:
        assert _rel(ours.intercept_, ref.intercept_) <= 1e-4
    f_ours = _objective(X, y, ours.coef_, ours.intercept_, C)
    f_ref = _objective(X, y, ref.coef_, ref.intercept_, C)
    assert abs(f_ours - f_ref) <= 1e-8 * abs(f_ref)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-5)
    np.testing.assert_allclose(ours.decision_function(X), ref.decision_function(X), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_allclose(ours.predict_log_proba(X), np.log(ref.predict_proba(X)), atol=1e-5)
    assert ours.score(X, y) == pytest.approx(ref.score(X, y))
    # history_: one record per iteration, objective non-increasing for the trust-region solver
    h = ours.history_
    assert h[0]["iter"] == 0 and len(h) == ours.n_iter_[0] + 1
    assert set(h[0]) >= {"iter", "objective", "grad_norm", "step", "time"}
    objs = [r["objective"] for r in h]
    assert all(b <= a + 1e-12 for a, b in zip(objs, objs[1:]))


@pytest.mark.parametrize("class_weight", ["balanced", {0: 2.0, 2: 0.5}], ids=["balanced", "dict"])
def test_weights_match_sklearn(rng, class_weight):
    X, y = _data(rng, k=3)
    sw = rng.uniform(0.2, 3.0, size=len(y))
    ours = LogisticRegression(C=2.0, tol=1e-9, class_weight=class_weight, backend="cpu").fit(X, y, sample_weight=sw)
    ref = sklm.LogisticRegression(C=2.0, tol=1e-12, max_iter=10000, class_weight=class_weight).fit(X, y, sample_weight=sw)
    assert _rel(ours.coef_, ref.coef_) <= 1e-4
    assert _rel(ours.intercept_, ref.intercept_) <= 1e-4


@pytest.mark.parametrize("k", [2, 3])
def test_sample_weight_equals_repeated_rows(rng, k):
    X, y = _data(rng, n=120, k=k)
    rep = rng.integers(0, 4, size=len(y))  # 0 drops a row
    a = LogisticRegression(tol=1e-8, backend="cpu").fit(X, y, sample_weight=rep)
    b = LogisticRegression(tol=1e-8, backend="cpu").fit(np.repeat(X, rep, 0), np.repeat(y, rep))
    assert _rel(a.coef_, b.coef_) <= 1e-6
    assert _rel(a.intercept_, b.intercept_) <= 1e-6


def test_string_labels(rng):
    X, y = _data(rng, k=3)
    names = np.array(["cat", "dog", "emu"])[y]
    m = LogisticRegression(tol=1e-8, backend="cpu").fit(X, names)
    ref = LogisticRegression(tol=1e-8, backend="cpu").fit(X, y)
    np.testing.assert_array_equal(m.classes_, ["cat", "dog", "emu"])
    np.testing.assert_array_equal(m.predict(X), np.array(["cat", "dog", "emu"])[ref.predict(X)])
    np.testing.assert_allclose(m.coef_, ref.coef_)
    assert m.score(X, names) == pytest.approx(ref.score(X, y))


@pytest.mark.parametrize("k", [2, 3], ids=["binary", "multinomial"])
def test_backends_and_formats_agree(rng, k):
    # tiny: the "fused" backend runs in the Triton interpreter here
    X, y = _data(rng, n=80, d=5, k=k)
    X[rng.uniform(size=X.shape) < 0.4] = 0.0
    models = {}
    for backend in ("cpu", "ops", "fused"):
        for fmt in ("dense", "csr"):
            Xi = X if fmt == "dense" else sp.csr_matrix(X)
            models[backend, fmt] = LogisticRegression(C=3.0, tol=1e-8, backend=backend).fit(Xi, y)
    ref = models["cpu", "dense"]
    for key, m in models.items():
        assert m.n_iter_[0] == ref.n_iter_[0], key
        assert _rel(m.coef_, ref.coef_) <= 1e-9, key
        assert _rel(m.intercept_, ref.intercept_) <= 1e-9, key


def test_weighted_multinomial_two_pass_hessian_same_model_across_backends(rng):
    X, y = _data(rng, n=100, d=4, k=3)
    sw = rng.uniform(0.5, 2.0, size=len(y))
    a = LogisticRegression(tol=1e-8, backend="cpu").fit(X, y, sample_weight=sw)
    b = LogisticRegression(tol=1e-8, backend="fused").fit(X, y, sample_weight=sw)
    assert _rel(a.coef_, b.coef_) <= 1e-9


@pytest.mark.parametrize("k", [3, 5])
def test_wide_rows_multinomial_takes_two_reads_same_model(rng, k):
    """Dense rows wider than 256 values, fused backend: the loss pass takes two reads (one_read is
    False there), the softmax Hessian product one (the unrolled m <= 4 kernel for 3 classes, the fp32
    FMA tl.dot for 5: no matvec of its own, so fewer matvecs than Hessian products); the model
    equals the cpu backend's."""
    from fusedml.mmchain.lossgrad import one_read

    X, y = _data(rng, n=32, d=300, k=k)
    assert not one_read(torch.from_numpy(X).float(), k) and one_read(torch.from_numpy(X).float(), 1)
    a = LogisticRegression(C=0.5, tol=1e-8, backend="cpu").fit(X, y)
    b = LogisticRegression(C=0.5, tol=1e-8, backend="fused").fit(X, y)
    assert _rel(a.coef_, b.coef_) <= 1e-9
    assert b._fit_info["n_lossgrad"] == 0 and 0 < b._fit_info["n_matvec"] < b._fit_info["n_mmchain"]


def test_torch_input_gives_torch_outputs(rng):
    X, y = _data(rng, k=3)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    m = LogisticRegression(tol=1e-8, backend="cpu").fit(Xt, yt)
    ref = LogisticRegression(tol=1e-8, backend="cpu").fit(X, y)
    assert isinstance(m.coef_, torch.Tensor) and isinstance(m.classes_, torch.Tensor)
    assert isinstance(m.predict(Xt), torch.Tensor) and isinstance(m.predict(X), np.ndarray)
    np.testing.assert_allclose(m.coef_.numpy(), ref.coef_)
    np.testing.assert_array_equal(m.predict(Xt).numpy(), ref.predict(X))
    assert isinstance(m.predict_proba(Xt), torch.Tensor)


def test_float32_input(rng):
    X, y = _data(rng, k=3)
    m32 = LogisticRegression(tol=1e-4, backend="cpu").fit(X.astype(np.float32), y)
    m64 = LogisticRegression(tol=1e-4, backend="cpu").fit(X, y)
    assert m32.coef_.dtype == np.float32
    assert _rel(m32.coef_, m64.coef_) <= 1e-3


def test_breast_cancer(rng):
    ds = pytest.importorskip("sklearn.datasets")
    X, y = ds.load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    for solver in ("newton-cg", "lbfgs"):
        ours = LogisticRegression(C=0.5, tol=1e-8, solver=solver, backend="cpu").fit(X, y)
        ref = sklm.LogisticRegression(C=0.5, tol=1e-12, max_iter=10000).fit(X, y)
        assert _rel(ours.coef_, ref.coef_) <= 1e-4
        assert ours.score(X, y) == pytest.approx(ref.score(X, y))
        assert ours.score(X, y) > 0.95


def test_convergence_warning_and_verbose(rng, capsys):
    from algorithms import ConvergenceWarning

    X, y = _data(rng, k=2)
    with pytest.warns(ConvergenceWarning, match="max_iter=1") as rec:
        m = LogisticRegression(max_iter=1, tol=1e-12, backend="cpu").fit(X, y)
    assert m.n_iter_[0] == 1
    assert all(r.filename == __file__ for r in rec)  # the caller's line, not the library's
    with pytest.warns(ConvergenceWarning) as rec:  # warned from deeper in the library, the same line
        LinearSVC(max_iter=1, tol=1e-12, backend="cpu").fit(*_data(rng, k=3))  # one-vs-rest, one fit per class
    assert rec and all(r.filename == __file__ for r in rec)
    LogisticRegression(verbose=1, backend="cpu").fit(X, y)
    out = capsys.readouterr().out
    assert "LogisticRegression" in out and "objective" in out


def test_csr_complex_longdouble_and_zero_total_weight(rng):
    """Review of session 52: complex CSR X was fitted on its real part (dense complex raised); CSR
    longdouble crashed inside torch (dense longdouble fits in float64); class weights zeroing every
    sample gave a ZeroDivisionError."""
    X = rng.normal(size=(40, 3))
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match="Complex data not supported"):
        LogisticRegression(backend="cpu").fit(sp.csr_matrix(X + 1j * X), y)
    a = LogisticRegression(backend="cpu").fit(sp.csr_matrix(X.astype(np.longdouble)), y)
    b = LogisticRegression(backend="cpu").fit(sp.csr_matrix(X), y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    for cw, sw in (({0: 0.0, 1: 0.0}, None), ({0: 0.0}, (y == 0).astype(float))):
        for est in (LogisticRegression(backend="cpu", class_weight=cw), LinearSVC(backend="cpu", class_weight=cw)):
            with pytest.raises(ValueError, match="sum to zero"):
                est.fit(X, y, sample_weight=sw)
