"""fusedml.distributed on a local cluster of 2 CPU worker processes (one cluster per module)."""
import os
import signal
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
sklearn_lm = pytest.importorskip("sklearn.linear_model")
sklearn_mix = pytest.importorskip("sklearn.mixture")
sklearn_exc = pytest.importorskip("sklearn.exceptions")

from fusedml.distributed import DistributedDesign, fit_distributed, local_gpu_cluster  # noqa: E402


def _logistic_cls():
    try:
        from algorithms import LogisticRegression
    except ImportError:  # the estimators land separately; scikit-learn's has the same parameters
        from sklearn.linear_model import LogisticRegression
    return LogisticRegression


def _gmm_cls():
    try:
        from algorithms.mixture import GaussianMixture
    except ImportError:
        from sklearn.mixture import GaussianMixture
    return GaussianMixture


@pytest.fixture(scope="module")
def client():
    cluster = local_gpu_cluster(n_workers=2, threads_per_worker=1)
    c = distributed.Client(cluster)
    assert len(c.scheduler_info()["workers"]) == 2
    yield c
    c.close()
    cluster.close()


def _classification(seed, n=480, d=5, k=2):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, d))
    W = rng.normal(size=(d, k))
    y = np.argmax(A @ W + rng.gumbel(size=(n, k)), axis=1) if k > 2 else (A @ W[:, 0] + rng.logistic(size=n) > 0)
    return A, y.astype(np.int64)


def _rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b))


def test_loss_grad_hessp_match_in_memory(client):
    A, y = _classification(0, n=300, d=4)
    sw = np.random.default_rng(1).random(300)
    design = DistributedDesign(da.from_array(A, chunks=(70, 4)), da.from_array(y, chunks=70), sw, client=client,
                               split_every=2)
    spec = {"loss": "binomial", "classes": np.array([0, 1]), "fit_intercept": True, "backend": "auto"}
    w = np.array([0.3, -0.2, 0.1, 0.5, -0.4])
    loss, grad = design.loss_grad(w, spec)
    Ai = np.hstack([A, np.ones((300, 1))])
    z = Ai @ w
    p = 1 / (1 + np.exp(-z))
    assert abs(loss - np.sum(sw * (np.logaddexp(0, z) - y * z))) < 1e-10 * abs(loss)
    assert _rel(grad, Ai.T @ (sw * (p - y))) < 1e-12
    s = np.array([1.0, 2.0, -1.0, 0.5, 0.25])
    assert _rel(design.hessp(s, spec), Ai.T @ (sw * p * (1 - p) * (Ai @ s))) < 1e-12
    design.close()


def test_worker_partitions_in_padded_rows(monkeypatch):
    """A worker keeps its dense partition in rows padded to whole 16-byte vectors where
    ``fusedml.mmchain.dense.pads_rows`` says so (CUDA by default; ``FUSEDML_ALIGN_ROWS=1`` here, on
    the CPU under the interpreter) and the fused backend reads it: the loss, gradient and Hessian
    product equal those of the partition as it is; the GMM E-step reads the partition as it is
    (run in this process)."""
    import torch

    from fusedml import distributed as fd

    A, y = _classification(2, n=90, d=5)
    A = A.astype(np.float32)
    spec = {"loss": "binomial", "classes": np.array([0, 1]), "fit_intercept": True, "backend": "fused"}
    w, s = np.array([0.3, -0.2, 0.1, 0.5, -0.4, 0.2]), np.array([1.0, 2.0, -1.0, 0.5, 0.25, -0.3])
    K = 2
    gmm = (np.full(K, 0.5), A[:K].astype(np.float64), np.ones((K, 5)), "diag", A[:K].astype(np.float64))
    out = {}
    for mode, stride in (("0", 5), ("1", 8)):
        monkeypatch.setenv("FUSEDML_ALIGN_ROWS", mode)
        part, key = fd._make_part(A, y, None), f"test-{mode}"
        P = fd._get_part(part, key, "padded-rows-test", "fused")
        assert P["X"].stride() == (stride, 1) and torch.equal(P["X"], torch.from_numpy(A))
        loss, grad = fd._part_loss_grad(part, key, "padded-rows-test", spec, w, 1)
        out[mode] = (loss, grad, fd._part_hessp(part, key, "padded-rows-test", spec, w, 1, s),
                     fd._part_gmm_estep(part, key, "padded-rows-test", "fused", *gmm)["s2"])
        assert fd._get_part(part, key, "padded-rows-test", "cpu") is P  # cached per design and key
        assert fd._get_part(part, key, "padded-rows-test", "fused", pad=False)["X"].stride() == (5, 1)  # EM's
    fd._drop_cache("padded-rows-test")
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "1")
    P = fd._get_part(fd._make_part(A, y, None), "cpu", "padded-rows-test", "cpu")
    assert P["X"].stride() == (5, 1)  # the cpu backend reads X as it is
    fd._drop_cache("padded-rows-test")
    for a, b in zip(out["0"], out["1"]):
        assert _rel(b, a) < 1e-6


def test_logistic_binary_dense_and_csr(client):
    LR = _logistic_cls()
    A, y = _classification(2)
    ref = sklearn_lm.LogisticRegression(C=0.5, tol=1e-10, max_iter=1000).fit(A, y)
    est = fit_distributed(LR(C=0.5, tol=1e-6), da.from_array(A, chunks=(100, 5)), da.from_array(y, chunks=100),
                          client=client)
    assert _rel(est.coef_, ref.coef_) < 1e-4 and _rel(est.intercept_, ref.intercept_) < 1e-4
    assert np.array_equal(est.classes_, [0, 1]) and est.history_ and est.n_iter_[0] >= 1
    B = sp.random(480, 5, density=0.6, random_state=np.random.RandomState(0), format="csr") * 3
    ref_s = sklearn_lm.LogisticRegression(C=0.5, tol=1e-10, max_iter=1000).fit(B, y)
    est_s = fit_distributed(LR(C=0.5, tol=1e-6), da.from_array(B, chunks=(130, 5)), y, client=client)
    assert _rel(est_s.coef_, ref_s.coef_) < 1e-4


def test_logistic_multinomial_string_labels(client):
    LR = _logistic_cls()
    A, y = _classification(3, k=3)
    labels = np.array(["a", "b", "c"])[y]
    ref = sklearn_lm.LogisticRegression(C=2.0, tol=1e-10, max_iter=1000).fit(A, labels)
    est = fit_distributed(LR(C=2.0, tol=1e-6), da.from_array(A, chunks=(96, 5)), da.from_array(labels, chunks=96),
                          client=client)
    assert list(est.classes_) == ["a", "b", "c"]
    assert est.coef_.shape == (3, 5)
    assert _rel(est.coef_, ref.coef_) < 1e-4 and _rel(est.intercept_, ref.intercept_) < 1e-3


@pytest.mark.parametrize("cov", ["full", "diag"])
def test_gaussian_mixture_matches_sklearn(client, cov):
    GM = _gmm_cls()
    rng = np.random.default_rng(4)
    A = np.concatenate([rng.normal(size=(200, 2)), rng.normal(size=(160, 2)) * 0.5 + 3.0])
    init = dict(weights_init=[0.5, 0.5], means_init=A[[0, 300]],
                precisions_init=np.stack([np.eye(2)] * 2) if cov == "full" else np.ones((2, 2)))
    ref = sklearn_mix.GaussianMixture(2, covariance_type=cov, tol=1e-9, max_iter=500, **init).fit(A)
    est = fit_distributed(GM(2, covariance_type=cov, tol=1e-9, max_iter=500, **init),
                          da.from_array(A, chunks=(90, 2)), client=client)
    assert abs(est.lower_bound_ - ref.lower_bound_) < 1e-5 * abs(ref.lower_bound_)
    assert _rel(est.means_, ref.means_) < 1e-4 and _rel(est.covariances_, ref.covariances_) < 1e-4
    assert est.converged_


def test_non_convergence_warns_at_the_callers_line(client):
    """max_iter hit: a ConvergenceWarning (scikit-learn's class too) attributed to this file, both estimators."""
    from algorithms import ConvergenceWarning

    A, y = _classification(7, n=200, d=4)
    X = da.from_array(A, chunks=(50, 4))
    fits = [(_logistic_cls()(C=1e4, tol=1e-12, max_iter=1), y),
            (_gmm_cls()(2, tol=1e-12, max_iter=1, random_state=0), None)]
    for est, target in fits:
        with pytest.warns(ConvergenceWarning) as rec:
            fit_distributed(est, X, target, client=client)
        w = [r for r in rec if issubclass(r.category, ConvergenceWarning)]
        assert "max_iter=1" in str(w[0].message) and w[0].filename == __file__
        assert issubclass(w[0].category, sklearn_exc.ConvergenceWarning)


def test_worker_loss_mid_fit_gives_same_result(client, monkeypatch):
    """Kill a worker process after the first iteration; Dask recomputes its partitions."""
    LR = _logistic_cls()
    A, y = _classification(5, n=400, d=4)
    # Partitions built by a recomputable graph (not data held only by a worker).
    X = da.from_array(A, chunks=(50, 4))
    Y = da.from_array(y, chunks=50)
    base = fit_distributed(LR(C=1.0, tol=1e-6), X, Y, client=client)

    calls = {"n": 0}
    orig = DistributedDesign.loss_grad

    def loss_grad_then_kill(self, w, spec):
        out = orig(self, w, spec)
        calls["n"] += 1
        if calls["n"] == 1:
            pids = client.run(os.getpid)
            victim = sorted(pids)[0]
            os.kill(pids[victim], signal.SIGKILL)
        return out

    monkeypatch.setattr(DistributedDesign, "loss_grad", loss_grad_then_kill)
    est = fit_distributed(LR(C=1.0, tol=1e-6), X, Y, client=client)
    assert calls["n"] > 1
    assert _rel(est.coef_, base.coef_) < 1e-10 and _rel(est.intercept_, base.intercept_) < 1e-10
    client.wait_for_workers(2, timeout=60)


def test_bad_inputs(client):
    A, y = _classification(6, n=40, d=3)
    X = da.from_array(A, chunks=(10, 3))
    with pytest.raises(TypeError, match="supports"):
        fit_distributed(sklearn_lm.Ridge(), X, y, client=client)
    with pytest.raises(ValueError, match="needs y"):
        fit_distributed(sklearn_lm.LogisticRegression(), X, client=client)
    with pytest.raises(TypeError, match="dask array"):
        DistributedDesign(A, y, client=client)
    with pytest.raises(ValueError, match="y must have shape"):
        DistributedDesign(X, y[:-1], client=client)
    with pytest.raises(ValueError, match="one class"):
        fit_distributed(sklearn_lm.LogisticRegression(), X, np.zeros(40, dtype=int), client=client)
    with pytest.raises(ValueError, match="n_components"):
        fit_distributed(sklearn_mix.GaussianMixture(50), X, client=client)
    with pytest.raises(RuntimeError, match="loss_grad"):
        d = DistributedDesign(X, y, client=client)
        d.hessp(np.ones(4), {})


def test_logistic_class_weight_penalty_none_and_odd_chunks(client):
    """Review of session 52: ``class_weight`` (dict, "balanced" with sample weights) gives the
    in-memory estimator's fit (it was ignored); ``penalty=None`` / ``C=inf`` fit unpenalised (was C = 1 /
    a crash); a 0-row chunk and X, y masked alike (unknown chunk sizes) fit (were errors)."""
    LR = _logistic_cls()
    A, y = _classification(8, k=3)
    sw = np.random.default_rng(8).uniform(0.5, 2.0, len(y))
    X = da.from_array(A, chunks=(120, 5))
    for cw in ("balanced", {0: 3.0, 2: 0.5}):
        ref = LR(C=0.5, tol=1e-10, max_iter=500, class_weight=cw, backend="cpu").fit(A, y, sample_weight=sw)
        est = fit_distributed(LR(C=0.5, tol=1e-8, class_weight=cw), X, da.from_array(y, chunks=100), sample_weight=sw,
                              client=client, backend="cpu")
        assert _rel(est.coef_, ref.coef_) < 1e-4 and _rel(est.intercept_, ref.intercept_) < 1e-4, cw
    Ab, yb = _classification(9, n=300)
    ref = sklearn_lm.LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(Ab, yb)
    ests = [sklearn_lm.LogisticRegression(C=np.inf, tol=1e-8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # scikit-learn 1.8 deprecates penalty
        try:
            ests.append(sklearn_lm.LogisticRegression(penalty=None, tol=1e-8))
        except TypeError:  # pragma: no cover - removed (scikit-learn 1.10)
            pass
        for est in ests:
            est = fit_distributed(est, da.from_array(Ab, chunks=(100, 5)), yb, client=client, backend="cpu")
            assert _rel(est.coef_, ref.coef_) < 1e-3
    ref = LR(C=1.0, tol=1e-8, max_iter=500, backend="cpu").fit(A, y)
    est = fit_distributed(LR(C=1.0, tol=1e-8), da.from_array(A, chunks=((240, 0, 240), 5)), y, client=client,
                          backend="cpu")
    assert _rel(est.coef_, ref.coef_) < 1e-4
    keep = A[:, 0] > -0.5
    m = da.from_array(keep, chunks=100)
    ref = LR(C=1.0, tol=1e-8, max_iter=500, backend="cpu").fit(A[keep], y[keep])
    est = fit_distributed(LR(C=1.0, tol=1e-8), da.from_array(A, chunks=(100, 5))[m], da.from_array(y, chunks=100)[m],
                          client=client, backend="cpu")
    assert _rel(est.coef_, ref.coef_) < 1e-4


def test_non_finite_partitions_are_named(client):
    """NaN / inf in a later partition of X or sample_weight: an error naming X and the partition
    (it was scipy's "array must not contain infs or NaNs", or an ill-defined covariance)."""
    A, y = _classification(10, n=400, d=3)
    A[350, 1] = np.nan
    with pytest.raises(ValueError, match=r"X \(partition 3\) contains"):
        fit_distributed(_logistic_cls()(), da.from_array(A, chunks=(100, 3)), y, client=client, backend="cpu")
    with pytest.raises(ValueError, match=r"X \(partition 3\) contains"):
        fit_distributed(_gmm_cls()(2, means_init=np.zeros((2, 3))), da.from_array(A, chunks=(100, 3)), client=client,
                        backend="cpu")
    sw = np.ones(400)
    sw[10] = np.inf
    with pytest.raises(ValueError, match=r"sample_weight \(partition 0\) contains"):
        fit_distributed(_logistic_cls()(), da.from_array(np.nan_to_num(A), chunks=(100, 3)), y, sample_weight=sw,
                        client=client, backend="cpu")
