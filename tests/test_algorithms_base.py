"""Shared machinery: objective derivatives by finite differences, solvers, parameters, pickling,
input handling and bad inputs for every linear estimator."""
import math
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


def test_conjugate_gradient_history_recurrences_equal_direct_values(rng):
    # the recorded objective / step come from CG recurrences: they must equal direct evaluation
    A = torch.from_numpy(rng.normal(size=(10, 10)))
    A = A @ A.T + 0.5 * torch.eye(10, dtype=torch.float64)
    B = torch.from_numpy(rng.normal(size=(10, 3)))
    hist = algorithms._base.History("cg")
    res = conjugate_gradient(lambda P: A @ P, B, tol=1e-10, max_iter=4, history=hist, offset=1.5)
    assert [r["iter"] for r in hist.records] == list(range(5)) and not res.converged
    P = torch.zeros_like(B)
    for k, rec in enumerate(hist.records[1:], start=1):
        # CG is deterministic: the k-th iterate is the result of k steps
        Pk = conjugate_gradient(lambda X: A @ X, B, tol=1e-10, max_iter=k).W
        q = (0.5 * (Pk * (A @ Pk)).sum() - (B * Pk).sum()).item()
        assert rec["objective"] == pytest.approx(1.5 + q, rel=1e-9, abs=1e-12)
        assert rec["step"] == pytest.approx((Pk - P).norm(dim=0).max().item(), rel=1e-8)
        assert rec["grad_norm"] == pytest.approx((B - A @ Pk).norm(dim=0).max().item(), rel=1e-6, abs=1e-12)
        P = Pk
    torch.testing.assert_close(res.W, P)


def test_tron_cg_step_stays_inside_trust_region(rng):
    # a tiny trust radius: truncated CG must stop ON the boundary ||S|| = delta (boundary root)
    from algorithms._solvers import _trcg

    X, obj = _objective(rng, "binomial", False)
    W = obj.zeros()
    st = obj.evaluate(W)
    g, hs = obj.gradient(st)
    gnorm = [g.norm().item()]
    for delta in ([1e-3 * gnorm[0]], [0.3 * gnorm[0]]):
        S, R, n_cg, reach = _trcg(obj, hs, g, gnorm, delta, [True], 0.1, 50)
        assert reach[0]
        assert S.norm().item() == pytest.approx(delta[0], rel=1e-10)
        # R is the true residual -g - H S
        torch.testing.assert_close(R, -g - obj.hessp(hs, S), rtol=1e-8, atol=1e-12)
    # a large radius: the interior CG solution (stops on the residual test, not the boundary)
    S, R, n_cg, reach = _trcg(obj, hs, g, gnorm, [1e6], [True], 1e-8, 50)
    assert not reach[0]
    assert R.norm().item() <= 1e-8 * gnorm[0] * 1.0001


def _count_operator_calls(monkeypatch):
    import fusedml

    calls = []
    mm, mv = fusedml.mmchain, fusedml.matvec

    def mmchain(X, y, v=None, z=None, alpha=1.0, beta=0.0, **kw):
        calls.append("gradient" if y is None else "hessp")
        # the penalty / centring term rides in the same call (beta * z), never a separate pass
        if y is not None:
            assert z is not None and beta != 0.0
        return mm(X, y, v, z, alpha, beta, **kw)

    def matvec(X, y, **kw):
        calls.append("matvec")
        return mv(X, y, **kw)

    def counted(op, name):  # a bound operator whose calls (launch-only forms too) are counted
        def run():
            calls.append(name)
            return op()
        run.P = op.P
        run.persistent = getattr(op, "persistent", False)
        lo = op.launch_only()

        def run_lo():
            calls.append(name)
            return lo()
        run.launch_only, run.out = (lambda: None if lo is None else run_lo), op.out
        return run

    bind = fusedml.bind_mmchain

    def bind_mmchain(X, y, v=None, z=None, alpha=1.0, beta=0.0, **kw):  # the CG engines' bound products
        if y is not None:
            assert z is not None and beta != 0.0
        return counted(bind(X, y, v, z, alpha, beta, **kw), "gradient" if y is None else "hessp")

    lg = fusedml.loss_gradient

    def loss_gradient(X, W, target, **kw):
        calls.append("lossgrad")
        return lg(X, W, target, **kw)

    bind_lg = fusedml.bind_loss_gradient

    def bind_loss_gradient(X, W, target, **kw):  # TRON's trial points: bound passes
        return counted(bind_lg(X, W, target, **kw), "lossgrad")

    monkeypatch.setattr(fusedml, "mmchain", mmchain)
    monkeypatch.setattr(fusedml, "matvec", matvec)
    monkeypatch.setattr(fusedml, "loss_gradient", loss_gradient)
    monkeypatch.setattr(fusedml, "bind_loss_gradient", bind_loss_gradient)
    monkeypatch.setattr(fusedml, "bind_mmchain", bind_mmchain)
    return calls


@pytest.mark.parametrize("case", ["logistic", "multinomial", "linearsvc", "linearsvc-ovr", "poisson"])
def test_newton_reads_of_X_per_iteration(rng, monkeypatch, case):
    """X is read exactly as designed: per Newton iteration ONE matvec (trial margins, shared by
    loss, gradient and Hessian weights), ONE gradient mmchain (y=None) when the step is accepted,
    ONE Hessian mmchain per CG step; nothing else touches X."""
    X = rng.normal(size=(300, 5))
    z = X @ np.array([1.0, -0.5, 0.3, 0.0, 0.8])
    y = {"logistic": z > 0, "linearsvc": z > 0, "multinomial": np.digitize(z, [-0.4, 0.4]),
         "linearsvc-ovr": np.digitize(z, [-0.4, 0.4]), "poisson": rng.poisson(np.exp(0.3 * z))}[case]
    est = {"logistic": LogisticRegression(tol=1e-8), "multinomial": LogisticRegression(tol=1e-8),
           "linearsvc": LinearSVC(tol=1e-6), "linearsvc-ovr": LinearSVC(tol=1e-6),
           "poisson": PoissonRegressor(alpha=1e-3, tol=1e-8)}[case].set_params(backend="cpu")
    calls = _count_operator_calls(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y.astype(int) if y.dtype == bool else y)
    hist = est.history_
    n_outer = len(hist) - 1
    n_cg = sum(r["cg_iter"] for r in hist)
    assert n_outer >= 2 and n_cg >= n_outer
    assert calls.count("matvec") == 1 + n_outer  # start + one trial point per iteration
    assert calls.count("hessp") == n_cg  # one mmchain per CG step (all K classes / problems at once)
    # start + one per iteration (at the trial point, before the accept test); K independent
    # problems of which only some reject take one more (the merged state's gradient)
    if case == "linearsvc-ovr":
        assert 1 + n_outer <= calls.count("gradient") <= 1 + 2 * n_outer
    else:
        assert calls.count("gradient") == 1 + n_outer
    assert len(calls) == calls.count("matvec") + calls.count("hessp") + calls.count("gradient")
    assert est._fit_info["n_matvec"] == calls.count("matvec")
    assert est._fit_info["n_mmchain"] == calls.count("hessp") + calls.count("gradient")
    assert est._fit_info["n_xtv"] == calls.count("gradient")
    # the iteration order: each CG block is preceded by a gradient and followed by the trial
    # matvec, whose gradient comes right after it
    assert calls[:2] == ["matvec", "gradient"]
    for a, b in zip(calls, calls[1:]):
        if a == "hessp":
            assert b in ("hessp", "matvec")
        if a == "matvec":
            assert b == "gradient"


@pytest.mark.parametrize("case", ["logistic", "multinomial", "linearsvc", "poisson", "gamma", "weighted"])
def test_fused_newton_reads_X_once_per_iteration_plus_cg(rng, monkeypatch, case):
    """Fused backend, dense X: per Newton iteration ONE loss-gradient pass (margins, loss, gradient
    and Hessian weights from one read of X) and ONE Hessian mmchain per CG step; no matvec and no
    separate gradient pass. The model equals the ops backend's (two passes per evaluation)."""
    X = rng.normal(size=(240, 5)).astype(np.float32)
    z = X @ np.array([1.0, -0.5, 0.3, 0.0, 0.8], dtype=np.float32)
    y = {"logistic": z > 0, "weighted": z > 0, "linearsvc": z > 0, "multinomial": np.digitize(z, [-0.4, 0.4]),
         "poisson": rng.poisson(np.exp(0.3 * z)), "gamma": rng.gamma(2.0, np.exp(0.2 * z) / 2.0)}[case]
    make = {"logistic": lambda: LogisticRegression(tol=1e-6), "weighted": lambda: LogisticRegression(tol=1e-6),
            "multinomial": lambda: LogisticRegression(tol=1e-6), "linearsvc": lambda: LinearSVC(tol=1e-5),
            "poisson": lambda: PoissonRegressor(alpha=1e-3, tol=1e-6),
            "gamma": lambda: GammaRegressor(alpha=1e-3, tol=1e-6)}[case]
    sw = rng.uniform(0.5, 2.0, size=240) if case == "weighted" else None
    yy = y.astype(int) if y.dtype == bool else y
    calls = _count_operator_calls(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = make().set_params(backend="fused").fit(X, yy, sample_weight=sw)
        ref = make().set_params(backend="ops").fit(X, yy, sample_weight=sw)
    hist = est.history_
    n_outer, n_cg = len(hist) - 1, sum(r["cg_iter"] for r in hist)
    fused_calls = calls[:calls.index("matvec")]  # the ops fit follows, starting with its matvec
    assert fused_calls.count("lossgrad") == 1 + n_outer
    assert fused_calls.count("hessp") == n_cg and "gradient" not in fused_calls
    assert est._fit_info["n_lossgrad"] == 1 + n_outer and est._fit_info["n_matvec"] == 0
    assert ref._fit_info["n_lossgrad"] == 0
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("case", ["multinomial-wide", "logistic-csr", "svc-ovr-csr", "poisson-csr"])
def test_fused_newton_two_read_pass_where_one_read_does_not_apply(rng, monkeypatch, case):
    """Fused backend where the one-read pass does not apply (5 classes on rows of 136 values, CSR X):
    each evaluation is loss_gradient's two reads (a matvec and an X^T v, the pointwise loss terms
    between them in one launch), counted as such in ``_fit_info``; the model equals the ops fit's."""
    sparse = case.endswith("-csr")
    d = 12 if sparse else 136
    X = rng.normal(size=(100, d)).astype(np.float32)
    if sparse:
        X[rng.random(X.shape) < 0.6] = 0.0
    z = X[:, :5] @ np.array([1.0, -0.5, 0.3, 0.0, 0.8], dtype=np.float32)
    y = {"multinomial-wide": np.digitize(z, [-0.8, -0.3, 0.3, 0.8]), "logistic-csr": (z > 0).astype(int),
         "svc-ovr-csr": np.digitize(z, [-0.4, 0.4]), "poisson-csr": rng.poisson(np.exp(0.3 * z))}[case]
    make = {"multinomial-wide": lambda: LogisticRegression(C=0.05, max_iter=2),  # interpreted Hessians: slow
            "logistic-csr": lambda: LogisticRegression(tol=1e-6),
            "svc-ovr-csr": lambda: LinearSVC(tol=1e-5), "poisson-csr": lambda: PoissonRegressor(alpha=1e-3, tol=1e-6)}[case]
    Xin = sp.csr_matrix(X) if sparse else X
    import importlib

    lg = importlib.import_module("fusedml.mmchain.lossgrad")  # fusedml.mmchain is the function
    calls = _count_operator_calls(monkeypatch)
    terms = []
    real = lg._fused_terms
    monkeypatch.setattr(lg, "_fused_terms", lambda *a: (terms.append(1), real(*a))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = make().set_params(backend="fused").fit(Xin, y)
        ref = make().set_params(backend="ops").fit(Xin, y)
    n_outer = len(est.history_) - 1
    assert calls.count("lossgrad") >= 1 + n_outer and len(terms) == calls.count("lossgrad")
    info = est._fit_info
    # (a one-vs-rest fit whose problems accept apart takes a gradient of the merged state: one more X^T v)
    assert info["n_lossgrad"] == 0 and info["n_matvec"] == len(terms) <= info["n_xtv"]
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=2e-3, atol=2e-4)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("intercept", [True, False], ids=["intercept", "no-intercept"])
def test_ridge_reads_of_X_per_iteration(rng, monkeypatch, intercept):
    """Ridge/least-squares CG: ONE mmchain per CG step (``X^T (X p) + z`` with the penalty and the
    implicit centring in ``beta * z``), plus the right-hand side (and the column means)."""
    X = rng.normal(size=(200, 6))
    Y = X @ rng.normal(size=(6, 2)) + 0.1 * rng.normal(size=(200, 2))
    calls = _count_operator_calls(monkeypatch)
    est = Ridge(alpha=0.5, fit_intercept=intercept, tol=1e-10, backend="cpu").fit(X, Y)
    n_iter = int(np.max(est.n_iter_))
    assert calls.count("matvec") == 0
    assert calls.count("hessp") == n_iter
    assert calls.count("gradient") == 1 + int(intercept)
    assert est._fit_info["n_mmchain"] == len(calls)
    assert est._fit_info["n_xtv"] == calls.count("gradient") and est._fit_info["n_matvec"] == 0


def test_bench_operator_counts_match_the_calls(rng, monkeypatch):
    # benchmarks/bench_end_to_end.py turns _fit_info into X passes per backend
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_end_to_end.py")
    spec = importlib.util.spec_from_file_location("bench_end_to_end_counts", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] + 0.5 * rng.normal(size=200) > 0).astype(int)
    calls = _count_operator_calls(monkeypatch)
    est = LogisticRegression(tol=1e-8, backend="cpu").fit(X, y)
    n_h = calls.count("hessp")
    fused = mod.operator_counts(est._fit_info, "fused", 2.0)
    ops = mod.operator_counts(est._fit_info, "ops", 2.0)
    assert fused["x_reads"] == len(calls)
    assert ops["x_reads"] == len(calls) + n_h  # the ops chain reads X twice
    assert fused["ms_per_x_read"] == pytest.approx(2e3 / len(calls))
    assert mod.operator_counts({"n_iter": 3}, "fused", 1.0) == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=["fp32", "fp64", "fp16"])
def test_check_finite_fast(dtype):
    from algorithms._base import check_finite_fast

    X = torch.ones(50, 7, dtype=dtype)
    check_finite_fast(X, "X")
    check_finite_fast(X[:, ::2], "X")  # strided view
    big = torch.full((4, 3), torch.finfo(dtype).max, dtype=dtype)
    check_finite_fast(big, "X")  # the sum overflows, the values are finite: no error
    for bad, what in ((math.nan, "1 NaN and 0 infinite"), (math.inf, "0 NaN and 1 infinite"),
                      (-math.inf, "0 NaN and 1 infinite")):
        Y = X.clone()
        Y[3, 2] = bad
        with pytest.raises(ValueError, match=f"X contains {what}"):
            check_finite_fast(Y, "X")
    Z = X.clone()
    Z[0, 0], Z[1, 1] = math.inf, -math.inf  # inf - inf = NaN in the sum: still caught
    with pytest.raises(ValueError, match="0 NaN and 2 infinite"):
        check_finite_fast(Z, "X")
    check_finite_fast(torch.arange(5), "y")  # integers: unchecked


def test_finite_check_deferred_to_the_solver():
    """``as_design_matrix(check="defer")`` queues nothing and raises nothing; the FiniteCheck's flag
    is 1 for finite values (also where their sum overflows) and its resolve raises the exact error."""
    from algorithms._base import FiniteCheck, as_design_matrix

    X = torch.ones(40, 3)
    X[5, 1] = math.nan
    M, info = as_design_matrix(X, check="defer")
    assert M is X and isinstance(info.finite_check, FiniteCheck) and info.finite_check.flag is None
    assert as_design_matrix(X.numpy(), check=False)[1].finite_check is None
    assert info.finite_check.queue().tolist() == [0.0]
    with pytest.raises(ValueError, match="X contains 1 NaN and 0 infinite"):
        info.finite_check.resolve(0.0)
    big = FiniteCheck(torch.full((4, 3), torch.finfo(torch.float32).max), "X")
    assert big.queue().tolist() == [0.0]
    big.resolve(0.0)  # the sum overflowed, the values are finite: no error
    Xc = sp.random(30, 6, density=0.3, random_state=0, format="csr")
    Xc.data[2] = np.inf
    _, infoc = as_design_matrix(Xc, check="defer")
    assert infoc.finite_check.queue().tolist() == [0.0]
    with pytest.raises(ValueError, match="X contains 0 NaN and 1 infinite"):
        infoc.finite_check.resolve(0.0)


DEFERRED = [
    (LogisticRegression, "class", {}), (LogisticRegression, "class", {"solver": "lbfgs"}),
    (LinearSVC, "class", {}), (PoissonRegressor, "count", {}), (Ridge, "reg", {}),
]


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("cls,target,kw", DEFERRED, ids=["logistic", "logistic-lbfgs", "svc", "poisson", "ridge"])
def test_fit_reads_the_finite_check_with_the_solver_start(rng, monkeypatch, cls, target, kw, sparse):
    """The linear fits check X for NaN / inf inside the solver's first host copy, not before (no
    read of X and sync of its own): a finite X fits without the up-front check, a bad one raises
    the exact check's error (not the solver's "objective is not finite") and is not modified."""
    import algorithms._base as base

    X, y = _xy(rng, target, n=48)
    Xt = torch.tensor(X, dtype=torch.float32)
    make = (lambda A: sp.csr_matrix(A.numpy())) if sparse else (lambda A: A)
    up_front = []
    real = base.check_finite_fast
    monkeypatch.setattr(base, "check_finite_fast", lambda t, name: (up_front.append(name), real(t, name)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = cls(backend="fused", **kw).fit(make(Xt), y)
    assert up_front == [] and np.isfinite(ref.score(make(Xt), y))
    for bad, what in ((math.nan, "1 NaN and 0 infinite"), (math.inf, "0 NaN and 1 infinite")):
        Xb = Xt.clone()
        Xb[7, 1] = bad
        Xin = make(Xb)
        before = Xin.copy() if sparse else Xin.clone()
        with pytest.raises(ValueError, match=f"X contains {what}"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's NaN arithmetic in the start's pass
            cls(backend="fused", **kw).fit(Xin, y)
        if sparse:
            np.testing.assert_array_equal(Xin.data, before.data)
        else:
            assert torch.equal(Xin.isnan(), before.isnan()) and torch.equal(Xin.nan_to_num(), before.nan_to_num())


ALIGNED = [(LogisticRegression, {}, 2), (LogisticRegression, {"solver": "lbfgs"}, 2), (LogisticRegression, {}, 3),
           (LinearSVC, {}, 3), (PoissonRegressor, {}, 1), (Ridge, {}, 1), (Ridge, {}, 2)]


@pytest.mark.parametrize("cls,kw,k", ALIGNED, ids=["logistic", "logistic-lbfgs", "multinomial", "svc-ovr", "poisson",
                                                  "ridge", "ridge-2"])
@pytest.mark.parametrize("mode", ["auto", "1"])
@pytest.mark.filterwarnings("ignore::algorithms.ConvergenceWarning")  # the small Poisson fit's precision stop
def test_fused_fits_read_unaligned_rows_from_an_aligned_copy(rng, monkeypatch, cls, kw, k, mode):
    """Rows of 7 fp32 values are not whole 16-byte vectors: a fused fit reads an aligned view of a
    padded copy (``fit_design``) when FUSEDML_ALIGN_ROWS=1, or by default ("auto") when the
    coefficients have several columns (classes, one-vs-rest problems, targets), and fits the same
    model as from X itself (FUSEDML_ALIGN_ROWS=0); X is not modified; the ops / cpu backends and
    CSR X are never copied; an X that already is an aligned view is read as it is."""
    import fusedml
    from algorithms._base import fit_design

    X = torch.tensor(rng.normal(size=(90, 7)), dtype=torch.float32)
    z = X @ torch.linspace(-1, 1, 7)
    y = {Ridge: z if k == 1 else torch.stack([z, 1 - z], 1), PoissonRegressor: torch.poisson(torch.exp(0.3 * z))}.get(
        cls, torch.bucketize(z, torch.linspace(-1, 1, k - 1)).float() if k > 2 else (z > 0).float())
    before = X.clone()
    made = []
    real = fusedml.aligned_rows
    monkeypatch.setattr(fusedml, "aligned_rows", lambda M, **kw_: made.append(real(M, **kw_)) or made[-1])
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", mode)
    got = cls(backend="fused", **kw).fit(X, y)
    aligned = mode == "1" or k > 2 or (cls is Ridge and k > 1)
    assert [t.stride() for t in made] == ([(8, 1)] if aligned else []) and torch.equal(X, before)
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "0")
    ref = cls(backend="fused", **kw).fit(X, y)
    assert len(made) == int(aligned) and np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    np.testing.assert_allclose(np.asarray(got.coef_), np.asarray(ref.coef_), rtol=1e-6, atol=1e-7)
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "1")
    for backend in ("ops", "cpu"):
        assert fit_design(X, backend, 2) is X
    csr = fusedml.as_csr(X.to_sparse_csr())
    assert fit_design(csr, "fused", 2) is csr and fit_design(X, "fused", 2).stride() == (8, 1)
    view = real(X)
    assert fit_design(view, "fused", 2) is view
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "sometimes")
    with pytest.raises(ValueError, match="FUSEDML_ALIGN_ROWS"):
        fit_design(X, "fused", 2)


@pytest.mark.filterwarnings("ignore::algorithms.ConvergenceWarning")
def test_one_column_fits_copy_unaligned_rows_from_a_size(rng, monkeypatch):
    """Under ``auto`` a one-column Newton-type fit copies unaligned rows from
    ``ONE_COLUMN_COPY_BYTES`` of X on; a one-column least-squares fit never does."""
    import algorithms._loss as loss_mod
    import fusedml
    from algorithms._base import fit_design

    X = torch.tensor(rng.normal(size=(90, 7)), dtype=torch.float32)
    y = (X[:, 0] > 0).float()
    made = []
    real = fusedml.aligned_rows
    monkeypatch.setattr(fusedml, "aligned_rows", lambda M, **kw_: made.append(real(M, **kw_)) or made[-1])
    monkeypatch.delenv("FUSEDML_ALIGN_ROWS", raising=False)
    nbytes = X.numel() * X.element_size()
    for limit, copies in ((nbytes + 1, 0), (nbytes, 1)):
        made.clear()
        monkeypatch.setattr(loss_mod, "ONE_COLUMN_COPY_BYTES", limit)
        LogisticRegression(backend="fused").fit(X, y)
        Ridge(backend="fused").fit(X, X[:, 1])
        assert [t.stride() for t in made] == [(8, 1)] * copies
    assert fit_design(X, "fused", 1) is X and fit_design(X, "fused", 1, one_column_copy_bytes=nbytes).stride() == (8, 1)


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
    # flags and verbose: a string used to count as true, or failed inside int()
    with pytest.raises(ValueError, match="fit_intercept must be True or False, got 'no'"):
        cls(fit_intercept="no", backend="cpu").fit(X, y)
    with pytest.raises(ValueError, match="verbose must be an int >= 0"):
        cls(verbose="loud", backend="cpu").fit(X, y)
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


@pytest.mark.parametrize("labels", [(0, 1), (-3.0, 2.0), (7, 4)])
def test_encode_torch_labels_binary_fast_path(labels):
    """Two distinct torch labels take the sort-free path: the same classes and indices as
    ``torch.unique``; three labels, one label, NaN and inf keep the general path and its errors."""
    from algorithms._base import DataInfo, encode_labels

    g = torch.Generator().manual_seed(1)
    pick = torch.rand(50, generator=g) < 0.4
    t = torch.where(pick, torch.tensor(float(labels[0])), torch.tensor(float(labels[1])))
    if isinstance(labels[0], int):
        t = t.long()
    info = DataInfo(50, 3, torch.device("cpu"), torch.float32, "dense")
    classes, idx = encode_labels(t, info)
    want_c, want_i = torch.unique(t, sorted=True, return_inverse=True)
    assert torch.equal(classes, want_c) and classes.dtype == t.dtype and torch.equal(idx, want_i)
    three = t.clone()
    three[0] = 100
    classes3, idx3 = encode_labels(three, info)
    assert len(classes3) == 3 and torch.equal(idx3, torch.unique(three, return_inverse=True)[1])
    with pytest.raises(ValueError, match="only one class"):
        encode_labels(torch.full((50,), 2.0), info)
    for bad in (float("nan"), float("inf")):
        tb = t.double()
        tb[3] = bad
        with pytest.raises(ValueError, match="NaN|inf"):
            encode_labels(tb, info)


def test_integer_and_list_inputs_and_score_weights(rng):
    X, y = _xy(rng, "class")
    Xi = np.round(X * 10).astype(np.int64)
    a = LogisticRegression(tol=1e-8, backend="cpu").fit(Xi, y)
    b = LogisticRegression(tol=1e-8, backend="cpu").fit(Xi.astype(float).tolist(), y.tolist())
    np.testing.assert_allclose(a.coef_, b.coef_)
    sw = rng.uniform(size=len(y))
    pred = a.predict(Xi)
    assert a.score(Xi, y, sample_weight=sw) == pytest.approx(((pred == y) * sw).sum() / sw.sum())


@pytest.mark.parametrize("cls,target", ESTIMATORS, ids=[c.__name__ for c, _ in ESTIMATORS])
def test_byte_swapped_inputs(rng, cls, target):
    """Byte-swapped numpy X (dense ">f4" / ">f8", CSR), y and sample_weight: the native arrays' model
    in their dtype (``">f4"`` fits in float32), and the same predictions and score; a Dask array of
    byte-swapped chunks too."""
    da = pytest.importorskip("dask.array")
    X, y = _xy(rng, target)
    sw = rng.uniform(0.5, 2.0, size=len(y))
    sw_ = lambda a: a.astype(a.dtype.newbyteorder())  # noqa: E731
    for dt in (np.float32, np.float64):
        Xn = X.astype(dt)
        tol = 1e-8 if dt == np.float64 else 1e-5  # float32 stops at its working precision
        a = cls(tol=tol, backend="cpu").fit(Xn, y, sample_weight=sw)
        b = cls(tol=tol, backend="cpu").fit(sw_(Xn), sw_(y), sample_weight=sw_(sw))
        assert np.asarray(b.coef_).dtype == np.asarray(a.coef_).dtype
        np.testing.assert_array_equal(a.coef_, b.coef_)
        np.testing.assert_array_equal(a.predict(Xn), b.predict(sw_(Xn)))
        assert a.score(Xn, y, sample_weight=sw) == b.score(sw_(Xn), sw_(y), sample_weight=sw_(sw))
    M = sp.csr_matrix(X)
    Ms = sp.csr_matrix((sw_(M.data), sw_(M.indices), sw_(M.indptr)), shape=M.shape)
    np.testing.assert_array_equal(cls(tol=1e-8, backend="cpu").fit(M, y).coef_,
                                  cls(tol=1e-8, backend="cpu").fit(Ms, y).coef_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Dask input's note
        c = cls(tol=1e-8, backend="cpu").fit(da.from_array(sw_(X), chunks=(25, 3)), y)
    np.testing.assert_allclose(c.coef_, cls(tol=1e-8, backend="cpu").fit(X, y).coef_, rtol=1e-8)


@pytest.mark.parametrize("cls,target", ESTIMATORS, ids=[c.__name__ for c, _ in ESTIMATORS])
def test_tensors_requiring_grad_and_reversed_views(rng, cls, target):
    """A torch X that requires grad (fits and predictions use its values) and numpy views with
    negative strides (``X[::-1]``): the model of the plain arrays."""
    X, y = _xy(rng, target)
    want = cls(tol=1e-8, backend="cpu").fit(X, y)
    Xg = torch.tensor(X, requires_grad=True)
    got = cls(tol=1e-8, backend="cpu").fit(Xg, torch.tensor(y))
    np.testing.assert_array_equal(np.asarray(got.coef_.detach()), want.coef_)
    np.testing.assert_array_equal(np.asarray(got.predict(Xg)), want.predict(X))
    Xr, yr = X[::-1], y[::-1]
    np.testing.assert_array_equal(cls(tol=1e-8, backend="cpu").fit(Xr, yr).coef_,
                                  cls(tol=1e-8, backend="cpu").fit(Xr.copy(), yr.copy()).coef_)


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


# ------------------------------------------------------------------------------------------------
# CUDA graphs of the CG steps (algorithms/_solvers.py: _CGEngine, _Replay). The same engine runs
# eagerly on the CPU (every test above); these compare the replayed GPU fits with eager ones.
# ------------------------------------------------------------------------------------------------
def test_cg_engine_eager_matches_plain_cg():
    """The in-place engine's steps (direction, product, alpha, updates, beta) against textbook CG."""
    from algorithms._solvers import _CGEngine

    g = torch.Generator().manual_seed(3)
    M = torch.randn(12, 12, generator=g, dtype=torch.float64)
    A = M @ M.T + 12 * torch.eye(12, dtype=torch.float64)
    B = torch.randn(12, 2, generator=g, dtype=torch.float64)
    cdot = lambda U, V: (U * V).sum(0)  # noqa: E731
    eng = _CGEngine(lambda D: A @ D, cdot, B, 2, graphs=False)
    eng.reset(B, cdot(B, B), [True, True])
    x, r = torch.zeros_like(B), B.clone()
    d, rr = r.clone(), cdot(r, r)
    for k in range(4):
        packed, Ad = eng.step()
        a = rr / cdot(d, A @ d)
        x, r_new = x + a * d, r - a * (A @ d)
        assert torch.allclose(packed[:2], cdot(d, A @ d)) and torch.allclose(eng.S, x) and torch.allclose(eng.R, r_new)
        rr_new = cdot(r_new, r_new)
        d, r, rr = r_new + (rr_new / rr) * d, r_new, rr_new
    eng.set_mask([True, False])  # a stopped column no longer moves
    S1 = eng.S[:, 1].clone()
    eng.step()
    assert torch.equal(eng.S[:, 1], S1)


def test_sparse_cg_captures_early(monkeypatch):
    """CG steps over a CSR matrix are captured after ``capture_after_sparse`` eager steps, dense
    ones after ``capture_after``; Ridge on CSR input asks its CG for the sparse rule."""
    from algorithms import _solvers, linear

    assert _solvers._Replay(lambda: None, False, sparse=True).capture_after == _solvers._Replay.capture_after_sparse == 2
    assert _solvers._Replay(lambda: None, False).capture_after == _solvers._Replay.capture_after == 16
    seen = []
    cg = linear.conjugate_gradient
    monkeypatch.setattr(linear, "conjugate_gradient", lambda *a, **k: seen.append(k["sparse"]) or cg(*a, **k))
    rng = np.random.default_rng(3)
    X = sp.random(60, 8, density=0.4, format="csr", random_state=4, dtype=np.float32)
    y = rng.standard_normal(60).astype(np.float32)
    for Xin in (X, X.toarray()):
        Ridge(alpha=1.0, backend="cpu").fit(Xin, y)
    assert seen == [True, False]
    from fusedml._validation import as_csr

    assert _solvers.is_csr(as_csr(X)) and not _solvers.is_csr(torch.zeros(2, 2))


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _cuda_fit_case(case, backend, seed, tol=1e-5, ridge_tol=1e-8):
    """``(X, make, y)``: the CUDA fit tests' data (20k x 30 on the GPU from ``seed``; a torch CSR
    X with 20 % of the entries for ``*-csr``) and estimator of ``case``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    X = torch.randn(20_000, 30, generator=g, device="cuda")
    eta = X @ torch.randn(30, generator=g, device="cuda") / 4
    if case.endswith("-csr"):
        X = (X * (torch.rand(X.shape, generator=g, device="cuda") < 0.2)).to_sparse_csr()
    cls = torch.bucketize(eta, torch.tensor([-0.5, 0.5], device="cuda"))
    make, y = {
        "logistic": (lambda: LogisticRegression(C=1.0, tol=tol, backend=backend), (eta > 0).float()),
        "logistic-csr": (lambda: LogisticRegression(C=1.0, tol=tol, backend=backend), (eta > 0).float()),
        "multinomial": (lambda: LogisticRegression(C=1.0, tol=tol, backend=backend), cls),
        "svc-ovr": (lambda: LinearSVC(C=1.0, tol=tol, backend=backend), cls),
        "poisson": (lambda: PoissonRegressor(alpha=1e-3, tol=tol, backend=backend), torch.poisson(torch.exp(eta))),
        "ridge-2": (lambda: Ridge(alpha=1.0, tol=ridge_tol, backend=backend), torch.stack([eta, -eta + 1], 1)),
    }[case]
    return X, make, y


def _assert_fits_match(got, ref, exact):
    """``exact`` (deterministic "ops"): the same iterations, coefficients to float32 rounding; else
    (float atomics) within one outer iteration and 1e-3."""
    ig, ir = np.asarray(got.n_iter_), np.asarray(ref.n_iter_)
    cg, cr = (np.asarray(torch.as_tensor(a).cpu()) for a in (got.coef_, ref.coef_))
    if exact:
        assert np.array_equal(ig, ir)
        assert np.abs(cg - cr).max() <= 1e-4 * max(np.abs(cr).max(), 1e-3)
    else:
        assert np.abs(ig - ir).max() <= 1
        assert np.abs(cg - cr).max() <= 1e-3 * max(np.abs(cr).max(), 1e-3)


@cuda
@pytest.mark.parametrize("backend", ["fused", "ops"])
@pytest.mark.parametrize("case", ["logistic", "multinomial", "svc-ovr", "poisson", "ridge-2", "logistic-csr"])
def test_cuda_graph_fits_match_eager(monkeypatch, backend, case):
    """Fits with the CG steps replayed from CUDA graphs equal eager fits (FUSEDML_CUDA_GRAPHS=0):
    on "ops" (deterministic cuBLAS / cuSPARSE) the same iterations, passes and coefficients to
    float32 rounding; on "fused" (float atomics: the bits differ run to run) within one outer
    iteration and 1e-3; at least one graph captured."""
    from algorithms import _solvers

    # fused: stop before float32 noise decides the count
    Xin, make, y = _cuda_fit_case(case, backend, 7, tol=1e-8 if backend == "ops" else 1e-5, ridge_tol=1e-10)
    monkeypatch.setattr(_solvers._Replay, "capture_after", 1)  # capture at the second CG step
    monkeypatch.setenv("FUSEDML_CUDA_GRAPHS", "0")
    ref = make().fit(Xin, y)
    monkeypatch.setenv("FUSEDML_CUDA_GRAPHS", "1")
    n0 = _solvers._Replay.captures
    got = make().fit(Xin, y)
    assert _solvers._Replay.captures > n0, "no CUDA graph was captured"
    _assert_fits_match(got, ref, exact=backend == "ops")
    if backend == "ops":
        for k in ("n_mmchain", "n_matvec", "n_xtv", "n_lossgrad"):
            assert got._fit_info.get(k) == ref._fit_info.get(k), k


@cuda
@pytest.mark.parametrize("backend", ["fused", "ops"])
@pytest.mark.parametrize("case", ["logistic", "multinomial", "svc-ovr", "poisson", "ridge-2"])
def test_cuda_fused_cg_update_fits_match_torch_form(monkeypatch, backend, case):
    """Fits whose CG steps do their vector half in fusedml.cg's one launch, and whose TRON accept
    tests take their sums from fusedml.cg.trial_sums (the GPU default), equal fits with the torch
    form (FUSEDML_FUSED_CG=0): iterations within one, coefficients to 1e-3 (the kernels sum in
    float64); the kernels were used."""
    from _fused_cg import fit_torch_then_kernels

    X, make, y = _cuda_fit_case(case, backend, 11)
    ref, got, n_update, n_trial = fit_torch_then_kernels(monkeypatch, make, X, y, None)
    assert n_update, "the fused CG update was not used"
    assert bool(n_trial) == (case != "ridge-2"), "TRON's accept-test sums did not take the kernel"
    _assert_fits_match(got, ref, exact=False)


@cuda
@pytest.mark.parametrize("backend", ["fused", "ops"])
@pytest.mark.parametrize("case", ["logistic", "svc", "poisson", "ridge", "logistic-csr"])
def test_cuda_fits_read_the_finite_check_with_the_solver_start(backend, case):
    """On the GPU (compiled kernels, the CG engine on the device) a bad X still raises the exact
    check's error from the solver's first host copy, X unchanged; a clean X fits as before."""
    g = torch.Generator(device="cuda").manual_seed(5)
    X = torch.randn(5_000, 20, generator=g, device="cuda")
    eta = X @ torch.randn(20, generator=g, device="cuda") / 4
    make, y = {
        "logistic": (lambda: LogisticRegression(backend=backend), (eta > 0).float()),
        "logistic-csr": (lambda: LogisticRegression(backend=backend), (eta > 0).float()),
        "svc": (lambda: LinearSVC(backend=backend), (eta > 0).float()),
        "poisson": (lambda: PoissonRegressor(alpha=1e-3, backend=backend), torch.poisson(torch.exp(eta))),
        "ridge": (lambda: Ridge(alpha=1.0, backend=backend), eta),
    }[case]
    to_in = (lambda A: A.to_sparse_csr()) if case.endswith("-csr") else (lambda A: A)
    assert np.isfinite(make().fit(to_in(X), y).score(to_in(X), y))
    for bad, what in ((math.nan, "1 NaN and 0 infinite"), (-math.inf, "0 NaN and 1 infinite")):
        Xb = X.clone()
        Xb[123, 4] = bad
        Xin = to_in(Xb)
        with pytest.raises(ValueError, match=f"X contains {what}"):
            make().fit(Xin, y)
        dense = Xin.to_dense() if case.endswith("-csr") else Xin
        assert torch.equal(dense.nan_to_num(), Xb.nan_to_num()) and bool(dense[123, 4].isnan()) == math.isnan(bad)


@cuda
@pytest.mark.parametrize("backend", ["fused", "ops"])
@pytest.mark.parametrize("case", ["logistic", "multinomial", "svc-ovr", "poisson", "ridge-2", "logistic-csr"])
def test_cuda_solve_ahead_fits_match(monkeypatch, backend, case):
    """On the GPU, each solve's restart and first product queued behind the host's read of the
    values it decides with (the default) gives the fit of reading first (FUSEDML_SOLVE_AHEAD=0):
    on "ops" the same iterations and coefficients to float32 rounding; on "fused" (float atomics)
    within one outer iteration and 1e-3; the queued starts were taken."""
    from algorithms import _solvers

    Xin, make, y = _cuda_fit_case(case, backend, 13)
    monkeypatch.setenv("FUSEDML_SOLVE_AHEAD", "0")
    ref = make().fit(Xin, y)
    starts = []
    real = _solvers._CGEngine.start_ahead
    monkeypatch.setattr(_solvers._CGEngine, "start_ahead", lambda *a, **k: starts.append(1) or real(*a, **k))
    monkeypatch.setenv("FUSEDML_SOLVE_AHEAD", "1")
    got = make().fit(Xin, y)
    assert starts, "no solve started ahead"
    _assert_fits_match(got, ref, exact=backend == "ops")


@cuda
@pytest.mark.parametrize("backend", ["fused", "ops"])
@pytest.mark.parametrize("case", ["logistic", "ridge"])
def test_cuda_split_cg_update_fits_match_one_program(monkeypatch, backend, case):
    """Wide CSR fits (40k features: past fusedml.cg.SPLIT_ENTRIES, the CG update over row tiles in
    three launches, the accept test's sums in two) equal the fits with one program per problem:
    iterations within one, coefficients and outputs to 2e-3 (H100, three runs: at most 4.5e-4, where
    the fused fits took 12 and 11 iterations; 0 on "ops"). The logistic fit runs to tol = 1e-8: its
    objective, normalised by N = 20k < D, has curvature ~1e-4 a coordinate, so at 1e-5 the
    stopping point itself is loose (two fused fits, whose float atomics change the bits each run,
    ended 2e-2 apart on the H100)."""
    from fusedml import cg as cgmod

    g = torch.Generator(device="cuda").manual_seed(17)
    N, D, k = 20_000, 40_000, 12
    cols = torch.randint(0, D, (N * k,), generator=g, device="cuda")
    X = torch.sparse_coo_tensor(torch.stack([torch.arange(N, device="cuda").repeat_interleave(k), cols]),
                                torch.randn(N * k, generator=g, device="cuda"), (N, D)).coalesce().to_sparse_csr()
    eta = X @ torch.randn(D, generator=g, device="cuda")
    make, y = {"logistic": (lambda: LogisticRegression(C=1.0, tol=1e-8, backend=backend), (eta > 0).float()),
               "ridge": (lambda: Ridge(alpha=1.0, tol=1e-8, backend=backend), eta)}[case]
    assert D > cgmod.SPLIT_ENTRIES
    calls, sums = [], []
    real, real_sums = cgmod._cg_update_spec, cgmod._trial_sums_spec
    monkeypatch.setattr(cgmod, "_cg_update_spec", lambda *a, **kw: calls.append(len(r := real(*a, **kw))) or r)
    monkeypatch.setattr(cgmod, "_trial_sums_spec", lambda *a, **kw: sums.append(len((r := real_sums(*a, **kw))[1]))
                        or r)
    got = make().fit(X, y)
    assert calls and set(calls) == {3}, "the split CG update was not used"
    assert bool(sums) == (case == "logistic") and set(sums) <= {2}, "the split accept-test sums were not used"
    monkeypatch.setattr(cgmod, "SPLIT_ENTRIES", None)
    ref = make().fit(X, y)
    assert np.abs(np.asarray(got.n_iter_) - np.asarray(ref.n_iter_)).max() <= 1
    out = (lambda m: m.decision_function(X)) if case == "logistic" else (lambda m: m.predict(X))
    rel = [np.abs(a - b).max() / np.abs(b).max() for a, b in
           ((np.asarray(torch.as_tensor(f(got)).cpu()), np.asarray(torch.as_tensor(f(ref)).cpu()))
            for f in (lambda m: m.coef_, out))]
    print(f"split vs one program, {case} {backend}: iterations {got.n_iter_} / {ref.n_iter_}, coefficients "
          f"{rel[0]:.2e}, outputs {rel[1]:.2e}")
    assert max(rel) <= 2e-3


@pytest.mark.parametrize("backend", ["fused", "ops"])
def test_fits_on_one_torch_sparse_tensor_reuse_its_caches(monkeypatch, backend):
    """Two fits given one torch sparse CSR tensor build the fused structure (or the ops transpose)
    once; after its values change through the array it was built from, the next fit is the fit of
    the new matrix."""
    from fusedml.mmchain import csr, ops

    built = []
    if backend == "fused":
        real = csr._Structure.__init__
        monkeypatch.setattr(csr._Structure, "__init__", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    else:
        ops.clear_transpose_cache()
    S = sp.random(120, 20, density=0.3, format="csr", random_state=4, dtype=np.float32)
    y = (np.random.default_rng(4).random(120) > 0.5).astype(int)
    val = torch.from_numpy(S.data.copy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        T = torch.sparse_csr_tensor(torch.from_numpy(S.indptr), torch.from_numpy(S.indices), val, S.shape)
    fit = lambda X: LogisticRegression(backend=backend, max_iter=4, tol=1e-12).fit(X, y)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning
        first = fit(T).coef_
        np.testing.assert_array_equal(fit(T).coef_, first)
        assert len(built if backend == "fused" else ops._CACHE) == 1
        val.mul_(-2.0)  # the tensor's version counter does not see this
        S2 = sp.csr_matrix((val.numpy().copy(), S.indices, S.indptr), shape=S.shape)
        np.testing.assert_allclose(fit(T).coef_, fit(S2).coef_, rtol=1e-6, atol=1e-7)
