"""GaussianMixture and KMeans against scikit-learn on iris (CPU; the fused backend on tiny data).

scikit-learn is the reference: started from the same parameters (explicit ``*_init``) or from
the same seed (our initialisations consume the RandomState exactly as scikit-learn does), the
EM / Lloyd iterations must reach the same log-likelihood / inertia and the same parameters.
"""
import os
import pickle
import warnings

import numpy as np
import pytest
import torch

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.cluster import KMeans as SkKMeans  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.mixture import GaussianMixture as SkGMM  # noqa: E402

from algorithms._base import ConvergenceWarning, NotFittedError  # noqa: E402
from algorithms.mixture import GaussianMixture, KMeans  # noqa: E402

COV_TYPES = ["full", "tied", "diag", "spherical"]
_cuda_only = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") != "0",
                                reason="needs a CUDA device and compiled kernels (TRITON_INTERPRET=0)")
#: where the fused fits of the accuracy-guard tests run: numpy on the CPU (interpreter), or a CUDA tensor
DEVICES = ["cpu", pytest.param("cuda", marks=_cuda_only)]


@pytest.fixture(scope="module")
def iris():
    return load_iris().data.astype(np.float64)  # [150, 4]


def _np(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a


def _rel(a, b):
    a, b = np.asarray(_np(a), dtype=np.float64), np.asarray(_np(b), dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _on(X, device):
    """X as given (numpy) for the CPU, a tensor on ``device`` otherwise."""
    return X if device == "cpu" else torch.tensor(X, device=device)


def _explicit_init(X, ct, K=3):
    """Explicit starting parameters (weights, means, precisions) for covariance type ``ct``."""
    D = X.shape[1]
    means = X[[0, 60, 120]][:K] + 0.1
    var = X.var(0)
    weights = np.array([0.5, 0.3, 0.2])[:K]
    weights = weights / weights.sum()
    if ct == "full":
        prec = np.stack([np.diag(1.0 / (var * s)) + 0.01 * (s - 1) for s in (1.0, 1.5, 2.0)][:K])
        prec = 0.5 * (prec + prec.transpose(0, 2, 1)) + 0.05 * np.eye(D)
    elif ct == "tied":
        prec = np.diag(1.0 / var) + 0.02
    elif ct == "diag":
        prec = np.stack([1.0 / (var * s) for s in (1.0, 1.5, 2.0)][:K])
    else:
        prec = np.array([1.0, 0.7, 0.4])[:K] / var.mean()
    return dict(weights_init=weights, means_init=means, precisions_init=prec)


def _assert_same_model(ours, ref, rtol=1e-6):
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"):
        assert _rel(getattr(ours, name), getattr(ref, name)) <= rtol, name


# ------------------------------------------------------------------------------------------------
# GaussianMixture against scikit-learn
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ct", COV_TYPES)
def test_gmm_same_start_matches_sklearn(iris, ct):
    init = _explicit_init(iris, ct)
    kw = dict(covariance_type=ct, tol=1e-7, max_iter=300, **init)
    ours = GaussianMixture(3, backend="cpu", **kw).fit(iris)
    ref = SkGMM(3, **kw).fit(iris)
    assert ours.converged_ and ref.converged_
    assert abs(ours.lower_bound_ - ref.lower_bound_) <= 1e-5 * abs(ref.lower_bound_)
    assert ours.n_iter_ == ref.n_iter_
    _assert_same_model(ours, ref, rtol=1e-6)
    np.testing.assert_allclose(ours.lower_bounds_, ref.lower_bounds_, rtol=1e-8)
    # history_: one record per iteration, objective = the lower bound
    assert [h["iter"] for h in ours.history_] == list(range(1, ours.n_iter_ + 1))
    np.testing.assert_allclose([h["objective"] for h in ours.history_], ours.lower_bounds_)
    # inference on the fitted model
    np.testing.assert_allclose(ours.score_samples(iris), ref.score_samples(iris), rtol=1e-8)
    np.testing.assert_allclose(ours.predict_proba(iris), ref.predict_proba(iris), rtol=1e-6, atol=1e-10)
    np.testing.assert_array_equal(ours.predict(iris), ref.predict(iris))
    assert ours.score(iris) == pytest.approx(ref.score(iris), rel=1e-10)
    assert ours.bic(iris) == pytest.approx(ref.bic(iris), rel=1e-10)
    assert ours.aic(iris) == pytest.approx(ref.aic(iris), rel=1e-10)


@pytest.mark.parametrize("ct", COV_TYPES)
def test_gmm_inference_given_sklearn_parameters(iris, ct, rng):
    """predict / predict_proba / score_samples on a model carrying scikit-learn's parameters."""
    ref = SkGMM(3, covariance_type=ct, random_state=0, max_iter=20).fit(iris)
    ours = GaussianMixture(3, covariance_type=ct, backend="cpu")
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"):
        setattr(ours, name, getattr(ref, name))
    ours.n_features_in_ = 4
    Xt = iris[rng.permutation(150)[:40]] + rng.normal(0, 0.3, (40, 4))
    np.testing.assert_allclose(ours.score_samples(Xt), ref.score_samples(Xt), rtol=1e-9)
    np.testing.assert_allclose(ours.predict_proba(Xt), ref.predict_proba(Xt), rtol=1e-7, atol=1e-12)
    np.testing.assert_array_equal(ours.predict(Xt), ref.predict(Xt))
    assert ours.bic(Xt) == pytest.approx(ref.bic(Xt), rel=1e-10)
    assert ours.aic(Xt) == pytest.approx(ref.aic(Xt), rel=1e-10)


# one-hot starts ("k-means++", "random_from_data": K rows, covariance = reg_covar) are
# ill-conditioned: 1e-16 rounding differences grow to ~1e-7 along the path, hence the brief's 1e-5
@pytest.mark.parametrize("init,ct,rtol", [("kmeans", "full", 1e-8), ("random", "diag", 1e-8), ("random", "tied", 1e-8),
                                          ("k-means++", "spherical", 1e-5), ("random_from_data", "full", 1e-5)])
def test_gmm_seeded_init_matches_sklearn(iris, init, ct, rtol):
    """Same random_state -> same initial responsibilities as scikit-learn -> same fit."""
    kw = dict(covariance_type=ct, init_params=init, random_state=0, tol=1e-4, max_iter=400)
    ours = GaussianMixture(3, backend="cpu", **kw).fit(iris)
    ref = SkGMM(3, **kw).fit(iris)
    assert ours.n_iter_ == ref.n_iter_
    assert abs(ours.lower_bound_ - ref.lower_bound_) <= rtol * abs(ref.lower_bound_)
    _assert_same_model(ours, ref, rtol=100 * rtol)


def test_gmm_n_init_and_max_iter_zero_match_sklearn(iris):
    # one-hot starts with reg_covar=1e-6 are ill-conditioned: rounding differences of 1e-16 grow
    # to ~1e-8 along the path, hence the brief's 1e-5 bound here
    kw = dict(covariance_type="diag", init_params="random_from_data", random_state=3, n_init=3, tol=1e-5)
    ours = GaussianMixture(3, backend="cpu", **kw).fit(iris)
    ref = SkGMM(3, **kw).fit(iris)
    assert ours.n_iter_ == ref.n_iter_
    assert ours.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-5)
    _assert_same_model(ours, ref, rtol=1e-4)
    # max_iter=0: the initialisation only, no warning, lower bound -inf (as scikit-learn)
    kw0 = dict(covariance_type="full", init_params="k-means++", random_state=1, max_iter=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours0 = GaussianMixture(3, backend="cpu", **kw0).fit(iris)
    ref0 = SkGMM(3, **kw0).fit(iris)
    assert ours0.n_iter_ == 0 and ours0.lower_bound_ == -np.inf
    np.testing.assert_allclose(ours0.means_, ref0.means_, rtol=1e-12)
    np.testing.assert_allclose(ours0.covariances_, ref0.covariances_, rtol=1e-12)
    # scikit-learn's initial weights are N_k / N (here 1/150 each: not a distribution); ours are
    # normalised (the operators take a valid mixture), which only shifts the first lower bound
    np.testing.assert_allclose(ours0.weights_, ref0.weights_ / ref0.weights_.sum(), rtol=1e-12)


def test_gmm_warm_start_matches_sklearn(iris):
    init = _explicit_init(iris, "diag")
    kw = dict(covariance_type="diag", warm_start=True, max_iter=3, tol=1e-12, **init)
    ours = GaussianMixture(3, backend="cpu", **kw)
    ref = SkGMM(3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", sklearn.exceptions.ConvergenceWarning)
        for _ in range(3):
            ours.fit(iris)
            ref.fit(iris)
            assert ours.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-10)
    _assert_same_model(ours, ref, rtol=1e-8)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gmm_sample_matches_sklearn(iris):
    init = _explicit_init(iris, "full")
    for ct in COV_TYPES:
        kw = dict(covariance_type=ct, random_state=7, max_iter=5, tol=1e-2)
        if ct == "full":
            kw.update(init)
        ours = GaussianMixture(3, backend="cpu", **kw).fit(iris)
        ref = SkGMM(3, **kw).fit(iris)
        Xs, ys = ours.sample(11)
        Xr, yr = ref.sample(11)
        assert Xs.shape == (11, 4) and ys.shape == (11,) and ys.dtype == np.int64
        assert set(ys.tolist()) <= {0, 1, 2}
        np.testing.assert_array_equal(ys, yr)
        np.testing.assert_allclose(Xs, Xr, rtol=1e-6)
    with pytest.raises(ValueError, match="n_samples"):
        ours.sample(0)


def test_gmm_fit_predict_equals_fit_then_predict(iris):
    kw = dict(covariance_type="diag", random_state=0, backend="cpu", tol=1e-2)
    labels = GaussianMixture(3, **kw).fit_predict(iris)
    model = GaussianMixture(3, **kw).fit(iris)
    np.testing.assert_array_equal(labels, model.predict(iris))
    assert labels.dtype == np.int64


@pytest.mark.parametrize("K,D", [(3, 4), (6, 2), (1, 3)], ids=["K<D", "K>D", "K=1"])
@pytest.mark.parametrize("ct", COV_TYPES)
def test_initial_statistics_equal_sklearn_mstep(ct, K, D, rng):
    """Hard-label and random-responsibility statistics -> gmm_mstep == scikit-learn's M-step."""
    from sklearn.mixture._gaussian_mixture import _estimate_gaussian_parameters

    from algorithms import mixture as mx
    from fusedml.gmm import gmm_mstep

    X = rng.normal(size=(97, D)) * 3 + 50.0  # away from the origin; 97 rows: not a block multiple
    lab = rng.integers(0, K, 97)
    lab[:K] = np.arange(K)
    st = mx._hard_stats(torch.from_numpy(X), torch.from_numpy(lab), K, torch.from_numpy(X[:K]), ct)
    _, means, cov, _ = gmm_mstep(st, 1e-6)
    _, m_ref, c_ref = _estimate_gaussian_parameters(X, np.eye(K)[lab], 1e-6, ct)
    assert _rel(means, m_ref) <= 1e-12 and _rel(cov, c_ref) <= 1e-10
    st = mx._random_resp_stats(torch.from_numpy(X), K, np.random.RandomState(4), ct)
    r = np.random.RandomState(4).uniform(size=(97, K))
    r /= r.sum(1)[:, None]
    _, means, cov, _ = gmm_mstep(st, 1e-6)
    _, m_ref, c_ref = _estimate_gaussian_parameters(X, r, 1e-6, ct)
    assert _rel(means, m_ref) <= 1e-12 and _rel(cov, c_ref) <= 1e-10


@pytest.mark.parametrize("shape", [(37,), (37, 3), (37, 2, 2)], ids=["1d", "2d", "3d"])
def test_segment_sums_both_paths(shape, rng):
    """Per-label sums and counts: the host path (sort + segment_reduce) equals the CUDA path
    (one-hot GEMM), both equal index_add_ / bincount."""
    from algorithms.mixture import _Segments

    K = 6
    lab = torch.from_numpy(rng.integers(0, K - 1, 37))  # label K-1 stays empty
    src = torch.from_numpy(rng.normal(size=shape))
    w = torch.from_numpy(rng.random(37))
    ref = torch.zeros((K,) + shape[1:], dtype=torch.float64).index_add_(0, lab, src)
    for onehot in (False, True):  # True: the CUDA branch on CPU tensors
        seg = _Segments(lab, K, onehot=onehot)
        acc = torch.zeros_like(ref)
        seg.add_(acc, src)
        torch.testing.assert_close(acc, ref, rtol=1e-12, atol=1e-12)
        assert float(acc[K - 1].abs().sum()) == 0.0
        for weights in (None, w):
            cnt = torch.zeros(K, dtype=torch.float64)
            seg.count_(cnt, weights)
            torch.testing.assert_close(cnt, torch.bincount(lab, weights=weights, minlength=K).double(),
                                       rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# backends, dtypes, input types
# ------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("ct", COV_TYPES)
def test_gmm_backends_give_same_model(ct):
    """fused (interpreter, tiny) / ops / cpu: the same EM iterations on float32 data."""
    X = load_iris().data[:, :3].astype(np.float32)  # N=150, D=3, K=2
    full = _explicit_init(X.astype(np.float64), ct, K=2)
    kw = dict(covariance_type=ct, max_iter=4, tol=0.0, **full)
    models = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for be in ("cpu", "ops", "fused"):
            models[be] = GaussianMixture(2, backend=be, **kw).fit(X)
    ref = models["cpu"]
    assert ref.means_.dtype == np.float32
    for be in ("ops", "fused"):
        m = models[be]
        assert m.n_iter_ == ref.n_iter_ == 4
        assert m.lower_bound_ == pytest.approx(ref.lower_bound_, rel=1e-5)
        for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
            assert _rel(getattr(m, name), getattr(ref, name)) <= 1e-4, (be, name)
        np.testing.assert_array_equal(m.predict(X), ref.predict(X))
        np.testing.assert_allclose(m.score_samples(X), ref.score_samples(X), rtol=1e-4)
    # the default ("kmeans") initialisation runs KMeans on the same backend: same start
    fits = [GaussianMixture(2, covariance_type=ct, max_iter=2, tol=1e-1, random_state=0, backend=be).fit(X)
            for be in ("cpu", "ops")]
    assert _rel(fits[1].means_, fits[0].means_) <= 1e-5


@pytest.mark.parametrize("ct", COV_TYPES)
@pytest.mark.parametrize("backend,stream", [("fused", False), ("ops", False), ("cpu", True)])
def test_host_loop_trusted_esteps_equal_checked(ct, backend, stream, monkeypatch):
    """The host EM loop's E-steps take their parameters unchecked (``check_params=False``: they were
    checked at fit or made by ``gmm_mstep``); the fit is the fully checked fit bit for bit, and from
    the second E-step on no parameter is converted or checked in full."""
    import algorithms.mixture as mixture
    from fusedml.gmm import _prep

    X = load_iris().data[:, :3].astype(np.float32)
    if stream:
        da = pytest.importorskip("dask.array")
        pytest.importorskip("fusedml.streaming")
        X = da.from_array(X, chunks=(64, 3))
    sw = np.linspace(0.5, 2.0, 150)
    kw = dict(covariance_type=ct, max_iter=5, tol=0.0, backend=backend, **_explicit_init(load_iris().data[:, :3], ct, K=2))
    monkeypatch.setattr(mixture, "_DEVICE_EM", False)
    real, taken = _prep._trusted, []
    monkeypatch.setattr(_prep, "_trusted", lambda *a: taken.append(real(*a)) or taken[-1])
    fits = {}
    for trusted in (False, True):
        monkeypatch.setattr(mixture, "_TRUSTED_ESTEP", trusted)
        taken.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fits[trusted] = GaussianMixture(2, **kw).fit(X, sample_weight=sw)
        assert len(taken) == (5 if trusted else 0) and all(p is not None for p in taken[1:])
    a, b = fits[False], fits[True]
    assert a.n_iter_ == b.n_iter_ == 5 and a.lower_bounds_ == b.lower_bounds_
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("ct", ["diag", "spherical"])
@pytest.mark.parametrize("max_iter,tol,weighted,one_launch", [(1, 0.0, False, True), (2, 0.0, True, True),
                                                               (6, 0.0, False, True), (200, 1e-3, True, True),
                                                               (3, 0.0, True, False)])
def test_device_em_loop_equals_host_loop(ct, max_iter, tol, weighted, one_launch, monkeypatch):
    """The device EM loop (speculative next iteration, ping-pong buffers; forced on the CPU) stops
    where the host loop does, with the same iterates, history and warnings; one_launch=False: the
    M-step in torch ops (the path of a padded K x D beyond mstep_operands' one program)."""
    import algorithms.mixture as mixture
    import fusedml.gmm.fused as fused

    if not one_launch:
        monkeypatch.setattr(fused, "MSTEP_MAX_TILE", 1)

    X = load_iris().data[:, :3].astype(np.float32)
    sw = np.linspace(0.5, 2.0, X.shape[0]) if weighted else None
    kw = dict(covariance_type=ct, max_iter=max_iter, tol=tol, backend="fused", **_explicit_init(X.astype(np.float64), ct))
    fits = {}
    for forced in (True, False):
        monkeypatch.setattr(mixture, "_DEVICE_EM", forced)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fits[forced] = GaussianMixture(3, **kw).fit(X, sample_weight=sw)
        fits[forced].warned = any(issubclass(c.category, ConvergenceWarning) for c in caught)
    dev, host = fits[True], fits[False]
    assert dev.n_iter_ == host.n_iter_ and dev.converged_ == host.converged_ and dev.warned == host.warned
    assert len(dev.history_) == dev.n_iter_ and [h["iter"] for h in dev.history_] == list(range(1, dev.n_iter_ + 1))
    np.testing.assert_allclose(dev.lower_bounds_, host.lower_bounds_, rtol=1e-10)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert _rel(getattr(dev, name), getattr(host, name)) <= 1e-9, name
    assert tol == 0.0 or dev.converged_


def _far_tight_cluster(spread, prec0):
    """A wide cluster at 0 and a tight one (``spread``) at (20, 20); diag init with precisions ``prec0``."""
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(size=(150, 2)), 20.0 + spread * rng.normal(size=(50, 2))]).astype(np.float32)
    return X, dict(covariance_type="diag", max_iter=5, tol=0.0, weights_init=[0.5, 0.5],
                   means_init=[[0.0, 0.0], [20.0, 20.0]], precisions_init=np.full((2, 2), prec0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spread,prec0", [(0.02, 1.0), (0.02, 200.0), (1e-3, 1.0)])
def test_em_beyond_fp32_runs_in_float64(spread, prec0, device, monkeypatch):
    """A tight cluster far from a wide one, in its own spread: the fp32 E-step's second moments
    lose digits (spread 1e-3: its first M-step fails; 0.02: it puts the component beyond
    fusedml.gmm._prep.FP32_QUAD_LIMIT; prec0 = 200: the initial parameters are beyond it). The
    host loop redoes that iteration and the rest in float64 with a warning, the device loop starts
    over on the host loop; both end where float64 EM (backend="cpu") ends."""
    import algorithms.mixture as mixture

    X, kw = _far_tight_cluster(spread, prec0)
    fits = {}
    for forced in (True, False):
        monkeypatch.setattr(mixture, "_DEVICE_EM", forced)
        with pytest.warns(RuntimeWarning, match="float64"):
            fits[forced] = GaussianMixture(2, backend="fused", **kw).fit(_on(X, device))
    ref = GaussianMixture(2, backend="cpu", **kw).fit(X)
    for fit in fits.values():
        assert fit.n_iter_ == 5 and [h["iter"] for h in fit.history_] == [1, 2, 3, 4, 5]
        np.testing.assert_allclose(fit.lower_bounds_, ref.lower_bounds_, rtol=1e-6)
        for name in ("weights_", "means_", "covariances_"):
            assert _rel(getattr(fit, name), getattr(ref, name)) <= 1e-4, name
    assert fits[True].lower_bounds_ == fits[False].lower_bounds_
    assert ref.covariances_[1].max() < 2 * spread ** 2 + 1e-6  # the tight cluster's variance (+ reg_covar)


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_failure_is_redone_before_the_rounding_hand_over(device, monkeypatch):
    """Iteration 1's fp32 M-step puts the tight component beyond FP32_QUAD_LIMIT while its change
    is also (forced) within the fp32 rounding: both loops redo that iteration in float64 first
    (the device loop by starting over on the host loop), so their iterates agree to float64
    rounding; handing over from the fp32 M-step's output instead would differ in the 7th digit."""
    import algorithms.mixture as mixture

    X, kw = _far_tight_cluster(0.02, 1.0)
    monkeypatch.setattr(mixture, "_below_fp32_noise", lambda tol, change, lower_bound: True)
    fits = {}
    for forced in (True, False):
        monkeypatch.setattr(mixture, "_DEVICE_EM", forced)
        with pytest.warns(RuntimeWarning, match="iteration 1's fp32 statistics"):
            fits[forced] = GaussianMixture(2, backend="fused", **kw).fit(_on(X, device))
    dev, host = fits[True], fits[False]
    assert dev.n_iter_ == host.n_iter_ == 5
    np.testing.assert_allclose(dev.lower_bounds_, host.lower_bounds_, rtol=1e-12)
    for name in ("weights_", "means_", "covariances_"):
        assert _rel(getattr(dev, name), getattr(host, name)) <= 1e-10, name


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("device", DEVICES)
def test_tol_below_fp32_rounding_is_decided_in_float64(device, monkeypatch):
    """tol = 1e-8 lies below the fp32 lower bound's rounding (~1e-7 here): an fp32 change under it
    once stopped the fit 107 iterations early (fuzz case fit:30436). Both loops now go on in float64
    and follow float64 EM (backend="cpu") to the same iteration count and lower bounds."""
    import algorithms.mixture as mixture
    from fuzz import _fit_data, draw_fit

    c = draw_fit(30436)
    X, _, _ = _fit_data(c, np.random.default_rng([8, c["seed"]]))
    kw = dict(covariance_type=c["cov"], tol=1e-8, max_iter=300, random_state=0, reg_covar=1e-6)
    ref = GaussianMixture(c["K"], backend="cpu", **kw).fit(X)
    for forced in (True, False):
        monkeypatch.setattr(mixture, "_DEVICE_EM", forced)
        fit = GaussianMixture(c["K"], backend="fused", **kw).fit(_on(X, device))
        assert fit.n_iter_ == ref.n_iter_ and fit.converged_ == ref.converged_, forced
        np.testing.assert_allclose(fit.lower_bounds_[-50:], ref.lower_bounds_[-50:], rtol=1e-9)
        assert _rel(fit.means_, ref.means_) <= 1e-6


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the speculative iteration runs on the failed M-step
def test_device_em_loop_raises_the_mstep_failure(monkeypatch):
    import algorithms.mixture as mixture

    X = np.repeat(np.array([[0.0, 0.0], [10.0, 10.0]], dtype=np.float32), 10, axis=0)  # two collapsed points
    kw = dict(covariance_type="diag", reg_covar=0.0, weights_init=[0.5, 0.5], means_init=[[0.0, 0.0], [10.0, 10.0]],
              precisions_init=np.ones((2, 2)), backend="fused")
    monkeypatch.setattr(mixture, "_DEVICE_EM", True)
    assert mixture._device_em_applies(torch.from_numpy(X), "diag", "fused")
    assert not mixture._device_em_applies(torch.from_numpy(X), "full", "fused")
    assert not mixture._device_em_applies(torch.from_numpy(X), "diag", "ops")
    with pytest.raises(ValueError, match="ill-defined empirical covariance"):
        GaussianMixture(2, **kw).fit(X)
    monkeypatch.setattr(mixture, "_DEVICE_EM", None)
    assert not mixture._device_em_applies(torch.from_numpy(X), "diag", "fused")  # a CPU tensor: the host loop
    monkeypatch.setenv("FUSEDML_DEVICE_EM", "0")
    monkeypatch.setattr(mixture, "_DEVICE_EM", True)
    assert not mixture._device_em_applies(torch.from_numpy(X), "diag", "fused")


def test_host_mstep_rule():
    from algorithms.mixture import _HOST_MSTEP_MAX, _host_mstep

    assert not _host_mstep("cpu", "diag", 2, 2)  # CPU data: the M-step stays where the data is
    assert _host_mstep(torch.device("cuda", 0), "diag", 16, 16) and _host_mstep("cuda", "spherical", 4096, 256)
    assert _host_mstep("cuda", "full", 16, 32) and not _host_mstep("cuda", "full", 16, 33)
    assert not _host_mstep("cuda", "diag", 1024, 128) and _host_mstep("cuda", "tied", 1024, 128)
    assert _host_mstep("cuda", "diag", _HOST_MSTEP_MAX, 1) and not _host_mstep("cuda", "diag", _HOST_MSTEP_MAX + 1, 1)


def test_choice_p_equals_normalised_ones():
    from algorithms.mixture import _choice_p

    for N in (1, 3, 150, 1_000_003):  # the uniform fast path gives scikit-learn's p exactly
        for dt in (np.float32, np.float64):
            ones = np.ones(N, dtype=dt)
            p = _choice_p(N, None, dt)
            assert p.dtype == dt and np.array_equal(p, ones / ones.sum())
    sw = torch.tensor([1.0, 3.0, 0.0, 4.0], dtype=torch.float64)
    np.testing.assert_array_equal(_choice_p(4, sw, np.float32), np.array([1, 3, 0, 4], np.float32) / np.float32(8))


def test_choice_one_is_random_state_choice():
    from algorithms.mixture import _choice_one, _choice_p

    sw = torch.tensor([1.0, 3.0, 0.0, 4.0], dtype=torch.float64)
    for seed in range(60):
        for N, w in ((1, None), (3, None), (7, None), (150, None), (20_000, None), (1_000_003, None), (4, sw)):
            for dt in (np.float32, np.float64):
                a, b = np.random.RandomState(seed), np.random.RandomState(seed)
                assert _choice_one(N, w, dt, a) == int(b.choice(N, p=_choice_p(N, w, dt))), (seed, N, dt)
                assert a.random_sample() == b.random_sample()  # the same state afterwards


@pytest.mark.parametrize("N", [1, 2, 3, 5, 1000, 65_536, 99_991, 1_000_000])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_uniform_cdf_search_is_numpys(N, dt):
    from algorithms.mixture import _uniform_cdf_search, _uniform_runs

    p = float(np.asarray(1, dtype=dt) / np.asarray(N, dtype=dt))
    cdf = np.cumsum(np.full(N, dt(p)), dtype=np.float64)
    runs = _uniform_runs(N, p)
    assert len(runs) < 200 and sum(r[3] for r in runs) == N
    rebuilt = np.concatenate([r[1] + np.arange(r[3]) * r[2] for r in runs])
    np.testing.assert_array_equal(rebuilt, cdf)  # the sums bit for bit
    cdf /= cdf[-1]
    rng = np.random.default_rng(N)
    at = cdf[rng.integers(0, N, 20)]  # u on a cdf value and one ulp either side: the ties of "right"
    for u in np.concatenate([rng.random(20), [0.0, np.nextafter(1.0, 0.0)], at, np.nextafter(at, 0.0),
                             np.nextafter(at, 1.0)]):
        if u < 1.0:
            assert _uniform_cdf_search(N, p, float(u)) == int(cdf.searchsorted(u, side="right")), (N, u)


def test_uniform_runs_through_rounding_ties():
    from algorithms.mixture import _uniform_runs

    # 1/3's last bit is half an ulp of [2/3, 4/3): ties, rounded to even, at 3^k steps
    for N, p in ((3, 1.0 / 3.0), (50_000, 1.0 / 3.0), (70_001, 1.0 / 7.0), (40_000, 0.1), (30_000, 1.0 + 2.0 ** -52)):
        runs = _uniform_runs(N, p)
        rebuilt = np.concatenate([r[1] + np.arange(r[3]) * r[2] for r in runs])
        np.testing.assert_array_equal(rebuilt, np.cumsum(np.full(N, p)), err_msg=str((N, p)))


@_cuda_only
@pytest.mark.parametrize("ct", COV_TYPES)
def test_cuda_gmm_fit_host_and_device_mstep_agree(ct, monkeypatch):
    import algorithms.mixture as mixture

    X = load_iris().data.astype(np.float32)
    kw = dict(covariance_type=ct, max_iter=6, tol=0.0, **_explicit_init(X.astype(np.float64), ct, K=3))
    Xc = torch.tensor(X, device="cuda")
    fits = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fits["cpu"] = GaussianMixture(3, backend="cpu", **kw).fit(X)
        for where in (True, False):
            monkeypatch.setattr(mixture, "_host_mstep", lambda *a, where=where: where)
            fits[where] = GaussianMixture(3, backend="fused", **kw).fit(Xc)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        host, dev = getattr(fits[True], name), getattr(fits[False], name)
        assert host.device.type == "cuda" and dev.device.type == "cuda", name  # torch in, torch on X's device out
        assert _rel(host.cpu().numpy(), dev.cpu().numpy()) <= 1e-9, name
        assert _rel(host.cpu().numpy(), getattr(fits["cpu"], name)) <= 1e-4, name
    assert fits[True].lower_bound_ == pytest.approx(fits["cpu"].lower_bound_, rel=1e-5)


@_cuda_only
@pytest.mark.parametrize("ct", ["diag", "spherical"])
def test_cuda_device_em_graphs_equal_host_loop(ct, monkeypatch):
    # 12 iterations: each parity's iteration is captured in a CUDA graph and replayed
    import algorithms.mixture as mixture
    from algorithms._solvers import _Replay

    X = torch.tensor(load_iris().data.astype(np.float32), device="cuda")
    kw = dict(covariance_type=ct, max_iter=12, tol=0.0, backend="fused",
              **_explicit_init(load_iris().data.astype(np.float64), ct))
    fits = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for forced in (None, False):
            monkeypatch.setattr(mixture, "_DEVICE_EM", forced)
            before = _Replay.captures
            fits[forced] = GaussianMixture(3, **kw).fit(X)
            fits[forced].captured = _Replay.captures - before
    assert fits[None].captured == 2 and fits[False].captured == 0
    np.testing.assert_allclose(fits[None].lower_bounds_, fits[False].lower_bounds_, rtol=1e-9)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert _rel(getattr(fits[None], name).cpu().numpy(), getattr(fits[False], name).cpu().numpy()) <= 1e-8, name


@_cuda_only
def test_cuda_kmeans_plusplus_replayed_picks_the_cpu_seeds(monkeypatch):
    # 12 centres, captures after two: the fused step is captured at the third and replayed for the rest
    import algorithms.mixture as mixture
    from algorithms._solvers import _Replay
    from algorithms.mixture import _kmeans_plusplus

    monkeypatch.setattr(mixture, "_KPP_CAPTURE_AFTER", 2)
    rng = np.random.default_rng(5)
    X = torch.tensor(rng.standard_normal((20_000, 8)).astype(np.float32) * 3)
    for w in (None, torch.tensor(rng.uniform(0.1, 2.0, 20_000))):
        before = _Replay.captures
        a = _kmeans_plusplus(X.cuda(), 12, np.random.RandomState(7), None if w is None else w.cuda(), backend="fused")
        assert _Replay.captures == before + 1
        b = _kmeans_plusplus(X, 12, np.random.RandomState(7), w, backend="cpu")
        np.testing.assert_array_equal(a, b)


@_cuda_only
def test_cuda_kmeans_replayed_lloyd_equals_cpu(monkeypatch):
    # a Lloyd run with captures after two calls: every slot transition is captured and replayed
    import algorithms.mixture as mixture
    from algorithms._solvers import _Replay

    monkeypatch.setattr(mixture, "_LLOYD_CAPTURE_AFTER", 2)
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(50_000, 4)).astype(np.float32)  # no cluster structure: a slow Lloyd run
    init = X[:6].copy()
    before = _Replay.captures
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = KMeans(6, init=init, n_init=1, tol=0.0, max_iter=12, backend="fused").fit(torch.tensor(X, device="cuda"))
        b = KMeans(6, init=init, n_init=1, tol=0.0, max_iter=12, backend="cpu").fit(X)
    assert a.n_iter_ == 12 and _Replay.captures - before == 3
    assert b.n_iter_ == 12 and (a.labels_.cpu().numpy() == b.labels_).mean() > 0.999
    np.testing.assert_allclose(a.cluster_centers_.cpu().numpy(), b.cluster_centers_, rtol=1e-4, atol=1e-4)


def test_kmeans_backends_give_same_model():
    X = load_iris().data[::2, :3].astype(np.float32)  # N=75, D=3
    init = X[[0, 30, 60]]
    fits = {be: KMeans(3, init=init, backend=be).fit(X) for be in ("cpu", "ops", "fused")}
    for be in ("ops", "fused"):
        np.testing.assert_array_equal(fits[be].labels_, fits["cpu"].labels_)
        assert fits[be].inertia_ == pytest.approx(fits["cpu"].inertia_, rel=1e-6)
        assert fits[be].n_iter_ == fits["cpu"].n_iter_


@pytest.mark.parametrize("device", DEVICES)
def test_kmeans_reads_unaligned_rows_from_an_aligned_copy(device, rng, monkeypatch):
    """Rows of 17 fp32 values are not whole 16-byte vectors: the fused KMeans fit and GaussianMixture's
    k-means start read an aligned copy (stride 20) and give the same model as from X itself
    (FUSEDML_ALIGN_ROWS=0); X is not modified; the EM steps and the cpu backend read X as it is.
    Rows of at most 64 bytes (5 fp32 values) are read as they are."""
    import fusedml

    X = torch.tensor(np.concatenate([rng.normal(size=(40, 17)), rng.normal(size=(40, 17)) + 4.0]),
                     dtype=torch.float32, device=device)
    before = X.clone()
    made = []
    real = fusedml.aligned_rows
    monkeypatch.setattr(fusedml, "aligned_rows", lambda M, **kw: made.append(real(M, **kw)) or made[-1])
    fits = {}
    for mode in ("auto", "0"):
        monkeypatch.setenv("FUSEDML_ALIGN_ROWS", mode)
        made.clear()
        fits[mode] = (KMeans(2, random_state=0, n_init=2, backend="fused").fit(X),
                      GaussianMixture(2, covariance_type="diag", random_state=0, backend="fused").fit(X))
        assert [t.stride() for t in made] == ([(20, 1)] * 2 if mode == "auto" else [])
        KMeans(2, random_state=0, backend="cpu").fit(X.cpu())
        KMeans(2, random_state=0, n_init=1, backend="fused").fit(X[:, :5])  # rows of 20 bytes
        assert len(made) == (2 if mode == "auto" else 0)
    (ka, ga), (k0, g0) = fits["auto"], fits["0"]
    assert torch.equal(X, before) and torch.equal(ka.labels_, k0.labels_) and ka.n_iter_ == k0.n_iter_
    assert ka.inertia_ == pytest.approx(k0.inertia_, rel=1e-12)
    torch.testing.assert_close(ka.cluster_centers_, k0.cluster_centers_, rtol=0, atol=0)
    assert ga.lower_bound_ == pytest.approx(g0.lower_bound_, rel=1e-12) and ga.n_iter_ == g0.n_iter_


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ct", COV_TYPES)
def test_fused_scores_do_not_depend_on_row_order(ct, device, rng):
    """A row's fused float32 ``score_samples`` and label are the same wherever it sits in its tile.
    Compiled (``input_precision="ieee"``: FMAs in k order for every row) they are bitwise equal;
    interpreted, ``tl.dot`` is numpy's float32 matmul (OpenBLAS sgemm), which rounds a row of a
    [64, 16] tile by its position, so there they agree to float32 rounding only (scikit-learn's
    ``check_methods_sample_order_invariance`` asks rtol 1e-7: an expected failure there); diag and
    spherical expand ``||x - mu||^2`` as ``x^2 W2 + x W1 + c``, whose cancellation magnifies it."""
    X = torch.tensor(np.concatenate([rng.normal(size=(150, 5)), rng.normal(size=(150, 5)) * 0.5 + 3.0]),
                     dtype=torch.float32, device=device)
    gm = GaussianMixture(3, covariance_type=ct, random_state=0, max_iter=20, backend="fused").fit(X)
    lp, lab = gm.score_samples(X), gm.predict(X)
    for seed in range(3):
        idx = torch.as_tensor(np.random.default_rng(seed).permutation(len(X)), device=device)
        lp_p, lab_p = gm.score_samples(X[idx]), gm.predict(X[idx])
        assert torch.equal(lab_p, lab[idx])
        if device == "cuda":
            assert torch.equal(lp_p, lp[idx])
        else:
            rtol = 4e-7 if ct in ("full", "tied") else 1e-5
            torch.testing.assert_close(lp_p, lp[idx], rtol=rtol, atol=rtol)


def test_gmm_float32_close_to_float64(iris):
    kw = dict(covariance_type="full", backend="cpu", tol=1e-6, max_iter=300, **_explicit_init(iris, "full"))
    m64 = GaussianMixture(3, **kw).fit(iris)
    m32 = GaussianMixture(3, **kw).fit(iris.astype(np.float32))
    assert m32.means_.dtype == np.float32 and m32.covariances_.dtype == np.float32
    assert m32.lower_bound_ == pytest.approx(m64.lower_bound_, rel=1e-5)
    assert _rel(m32.means_, m64.means_) <= 1e-4
    assert _rel(m32.covariances_, m64.covariances_) <= 1e-3


def test_gmm_data_far_from_origin(iris):
    """float32 data around 1e4: the model is the shifted model (centred statistics)."""
    shift = 1e4
    kw = dict(covariance_type="diag", backend="cpu", tol=1e-6, max_iter=300, **_explicit_init(iris, "diag"))
    base = GaussianMixture(3, **kw).fit(iris)
    kw["means_init"] = kw["means_init"] + shift
    far = GaussianMixture(3, **kw).fit((iris + shift).astype(np.float32))
    np.testing.assert_allclose(far.means_ - shift, base.means_, atol=2e-3)  # fp32 ulp at 1e4 is 1e-3
    assert _rel(far.covariances_, base.covariances_) <= 1e-2
    np.testing.assert_array_equal(far.predict((iris + shift).astype(np.float32)), base.predict(iris))


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_storage(iris, half):
    """fp16 / bf16 storage is read as stored and computed in float32: the model of the upcast data."""
    Xh = torch.from_numpy(iris).to(getattr(torch, half))
    kw = dict(covariance_type="diag", random_state=0, backend="cpu")
    mh = GaussianMixture(3, **kw).fit(Xh)
    mf = GaussianMixture(3, **kw).fit(Xh.float())
    assert mh.means_.dtype == torch.float32
    assert mh.lower_bound_ == pytest.approx(mf.lower_bound_, rel=1e-12)
    torch.testing.assert_close(mh.predict_proba(Xh), mf.predict_proba(Xh.float()))
    kh = KMeans(3, random_state=0, backend="cpu").fit(Xh)
    assert kh.inertia_ == pytest.approx(KMeans(3, random_state=0, backend="cpu").fit(Xh.float()).inertia_, rel=1e-12)


def test_verbose_and_history(iris, capsys):
    m = GaussianMixture(2, random_state=0, backend="cpu", verbose=2, verbose_interval=1, tol=1e-2).fit(iris)
    out = capsys.readouterr().out
    assert "Initialization 0" in out and "Iteration 1" in out and "lower bound" in out
    assert len(m.history_) == m.n_iter_
    assert m.history_[0]["step"] == np.inf and all(h["time"] >= 0 for h in m.history_)
    k = KMeans(2, random_state=0, backend="cpu", verbose=1).fit(iris)
    assert "inertia" in capsys.readouterr().out
    assert [h["iter"] for h in k.history_] == list(range(1, k.n_iter_ + 1))
    assert k.history_[-1]["objective"] >= k.inertia_ - 1e-9  # Lloyd never increases the inertia


def test_torch_input_gives_torch_attributes(iris):
    Xt = torch.from_numpy(iris)
    kw = dict(covariance_type="tied", random_state=0, backend="cpu")
    mt = GaussianMixture(3, **kw).fit(Xt)
    mn = GaussianMixture(3, **kw).fit(iris)
    assert isinstance(mt.means_, torch.Tensor) and isinstance(mt.covariances_, torch.Tensor)
    np.testing.assert_allclose(mt.means_.numpy(), mn.means_, rtol=1e-12)
    assert isinstance(mt.predict(Xt), torch.Tensor) and isinstance(mt.predict(iris), np.ndarray)
    assert isinstance(mt.predict_proba(Xt), torch.Tensor)
    Xs, ys = mt.sample(5)
    assert isinstance(Xs, torch.Tensor) and tuple(Xs.shape) == (5, 4)
    kt = KMeans(3, random_state=0, backend="cpu").fit(Xt)
    assert isinstance(kt.cluster_centers_, torch.Tensor) and isinstance(kt.labels_, torch.Tensor)
    # non-contiguous torch input gives the same model
    Xnc = torch.from_numpy(np.asfortranarray(iris))
    assert not Xnc.is_contiguous()
    mnc = GaussianMixture(3, **kw).fit(Xnc)
    np.testing.assert_allclose(mnc.means_.numpy(), mn.means_, rtol=1e-12)


def test_dask_input_streams(iris):
    da = pytest.importorskip("dask.array")
    pytest.importorskip("fusedml.streaming")
    Xd = da.from_array(iris, chunks=(40, 4))
    for init in ("kmeans", "random"):
        kw = dict(covariance_type="diag", init_params=init, random_state=0, backend="cpu")
        md = GaussianMixture(3, **kw).fit(Xd)
        mn = GaussianMixture(3, **kw).fit(iris)
        assert md.lower_bound_ == pytest.approx(mn.lower_bound_, rel=1e-12)
        assert _rel(md.means_, mn.means_) <= 1e-10
    np.testing.assert_allclose(md.predict_proba(Xd), mn.predict_proba(iris), atol=1e-10)
    np.testing.assert_array_equal(md.predict(Xd), mn.predict(iris))
    kd = KMeans(3, random_state=0, backend="cpu").fit(Xd)
    kn = KMeans(3, random_state=0, backend="cpu").fit(iris)
    assert kd.inertia_ == pytest.approx(kn.inertia_, rel=1e-12)
    np.testing.assert_array_equal(kd.labels_, kn.labels_)


# ------------------------------------------------------------------------------------------------
# KMeans against scikit-learn
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ct", ["diag", "full"])
def test_gmm_ops_float64_small_tol_stops_as_sklearn(iris, ct):
    """The ops backend computes float64 data in float64, so a tol below fp32 rounding is tested as
    on the cpu backend (the fp32 rule ran 2 iterations more: means 4e-4 off scikit-learn's)."""
    ref = SkGMM(3, covariance_type=ct, tol=1e-6, random_state=0, max_iter=500).fit(iris)
    for backend in ("cpu", "ops"):
        g = GaussianMixture(3, covariance_type=ct, tol=1e-6, random_state=0, max_iter=500, backend=backend).fit(iris)
        assert g.n_iter_ == ref.n_iter_
        np.testing.assert_allclose(g.means_, ref.means_, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale", [1e-9, 1e-5, 1e5])
def test_kmeans_labels_at_any_scale(scale):
    """Two clusters scaled by 1e-9 ... 1e5 on every backend, in memory and streamed from dask: the
    assignment was a unit-precision Gaussian score whose constant swamped distances of data at
    1e-5 (every row in cluster 0); labels and predictions as scikit-learn's."""
    rng = np.random.default_rng(0)
    X0 = np.r_[rng.normal(0, 1, (30, 4)), rng.normal(5, 1, (30, 4))] * scale
    da = pytest.importorskip("dask.array")
    for dt in (np.float32, np.float64):
        X = X0.astype(dt)
        ref = SkKMeans(2, init=X[[0, 30]], n_init=1).fit(X)
        for backend in ("cpu", "ops", "fused"):
            for Xi in ((X, da.from_array(X, chunks=(17, 4))) if backend == "cpu" else (X,)):
                km = KMeans(2, init=X[[0, 30]], backend=backend).fit(Xi)
                np.testing.assert_array_equal(km.labels_, ref.labels_)
                np.testing.assert_array_equal(km.predict(Xi), ref.labels_)


def test_kmeans_streamed_ties_go_as_in_memory():
    """Integer data (exact distance ties): a dask X's assignment, block by block about the whole
    matrix's central point, gives the in-memory labels; a rounded Gaussian score broke the ties at
    random (inertia 24763 against 24752, 13 iterations against 25; review of session 52)."""
    da = pytest.importorskip("dask.array")
    X = np.random.default_rng(7).integers(-4, 5, size=(800, 6)).astype(float)
    for backend in ("cpu", "ops"):
        a = KMeans(3, n_init=1, random_state=0, backend=backend).fit(X)
        b = KMeans(3, n_init=1, random_state=0, backend=backend).fit(da.from_array(X, chunks=(77, 6)))
        assert a.inertia_ == b.inertia_ and a.n_iter_ == b.n_iter_
        np.testing.assert_array_equal(a.labels_, b.labels_)


def test_kmeans_same_initial_centres_matches_sklearn(iris):
    init = iris[[3, 70, 140]]
    ours = KMeans(3, init=init, backend="cpu").fit(iris)
    ref = SkKMeans(3, init=init, n_init=1).fit(iris)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    assert ours.n_iter_ == ref.n_iter_
    assert ours.score(iris) == pytest.approx(ref.score(iris), rel=1e-10)
    np.testing.assert_array_equal(ours.predict(iris[::7]), ref.predict(iris[::7]))
    assert len(ours.history_) == ours.n_iter_


def test_kmeans_empty_cluster_relocated_as_sklearn(iris):
    init = np.r_[iris[[3, 70]], [[100.0, 100.0, 100.0, 100.0]]]  # third centre attracts nothing
    ours = KMeans(3, init=init, backend="cpu").fit(iris)
    ref = SkKMeans(3, init=init, n_init=1).fit(iris)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10)


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_kmeans_seeded_matches_sklearn(iris, init):
    ours = KMeans(4, init=init, n_init=2, random_state=5, backend="cpu").fit(iris)
    ref = SkKMeans(4, init=init, n_init=2, random_state=5).fit(iris)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10)


# ------------------------------------------------------------------------------------------------
# warnings, errors, estimator protocol
# ------------------------------------------------------------------------------------------------
def test_convergence_warnings(iris):
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        GaussianMixture(3, max_iter=1, random_state=0, backend="cpu").fit(iris)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        KMeans(3, max_iter=1, tol=0.0, init=iris[[0, 1, 2]], backend="cpu").fit(iris)
    with pytest.warns(ConvergenceWarning, match="distinct clusters"):
        KMeans(3, init=np.zeros((3, 2)), backend="cpu").fit(np.zeros((10, 2)))


@pytest.mark.parametrize("Est", [GaussianMixture, KMeans])
def test_bad_inputs(Est, iris):
    sp = pytest.importorskip("scipy.sparse")
    est = Est(3, backend="cpu")
    with pytest.raises(ValueError, match=r"n_samples.*(n_components|n_clusters)|n_components = 3"):
        Est(5, backend="cpu").fit(iris[:4])
    bad = iris.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(bad)
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        est.fit(bad)
    with pytest.raises(ValueError, match="2-D"):
        est.fit(iris[:, 0])
    with pytest.raises(ValueError, match="2-D"):
        est.fit(iris[None])
    with pytest.raises(ValueError, match="empty"):
        est.fit(np.zeros((0, 4)))
    with pytest.raises(TypeError, match="sparse"):
        est.fit(sp.csr_matrix(iris))
    with pytest.raises(TypeError, match="numbers"):
        est.fit(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(NotFittedError):
        Est(3).predict(iris)
    est.fit(iris)
    with pytest.raises(ValueError, match="features"):
        est.predict(iris[:, :3])
    with pytest.raises(ValueError, match="backend"):
        Est(3, backend="gpu").fit(iris)


def test_gmm_bad_parameters(iris):
    with pytest.raises(ValueError, match="at least 2 samples"):
        GaussianMixture(1, backend="cpu").fit(iris[:1])
    with pytest.raises(ValueError, match="covariance_type"):
        GaussianMixture(2, covariance_type="banana").fit(iris)
    with pytest.raises(ValueError, match="init_params"):
        GaussianMixture(2, init_params="banana").fit(iris)
    for name, val in (("n_components", 0), ("tol", -1.0), ("reg_covar", -1e-3), ("max_iter", -1), ("n_init", 0)):
        with pytest.raises(ValueError, match=name):
            GaussianMixture(**{"n_components": 2, name: val}).fit(iris)
    with pytest.raises(ValueError, match="normalized"):
        GaussianMixture(2, weights_init=[0.5, 0.6], backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="range"):
        GaussianMixture(2, weights_init=[-0.5, 1.5], backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="shape"):
        GaussianMixture(2, means_init=np.zeros((3, 4)), backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="shape"):
        GaussianMixture(2, covariance_type="diag", precisions_init=np.ones((2, 3)), backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="positive-definite"):
        GaussianMixture(2, precisions_init=np.stack([-np.eye(4)] * 2), backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="positive"):
        GaussianMixture(2, covariance_type="spherical", precisions_init=[1.0, 0.0], backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="ill-defined"):  # collapsed data, no regularisation
        GaussianMixture(2, reg_covar=0.0, init_params="random_from_data", random_state=0,
                        backend="cpu").fit(np.ones((6, 2)))
    with pytest.raises(ValueError, match="warm_start must be True or False, got 'yes'"):
        GaussianMixture(2, warm_start="yes", backend="cpu").fit(iris)
    for Est in (GaussianMixture, KMeans):
        with pytest.raises(ValueError, match="verbose must be an int >= 0"):
            Est(2, verbose=-1, backend="cpu").fit(iris)
    with pytest.raises(ValueError, match="init"):
        KMeans(3, init="banana").fit(iris)
    with pytest.raises(ValueError, match="shape"):
        KMeans(3, init=np.zeros((2, 4)), backend="cpu").fit(iris)


def test_inputs_not_modified(iris):
    X = iris.copy()
    init = _explicit_init(iris, "full")
    init_copy = {k: v.copy() for k, v in init.items()}
    GaussianMixture(3, backend="cpu", max_iter=3, tol=1.0, **init).fit(X)
    KMeans(3, init=init["means_init"], backend="cpu").fit(X)
    np.testing.assert_array_equal(X, iris)
    for k in init:
        np.testing.assert_array_equal(init[k], init_copy[k])


@pytest.mark.parametrize("Est", [GaussianMixture, KMeans])
def test_clone_pickle_params(Est, iris):
    est = Est(3, random_state=0, backend="cpu")
    c = clone(est)
    assert c.get_params() == est.get_params() and c is not est
    est.set_params(max_iter=50)
    assert est.get_params()["max_iter"] == 50
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(banana=1)
    est.fit(iris)
    est2 = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(est2.predict(iris), est.predict(iris))
    assert est2.score(iris) == est.score(iris)


# ------------------------------------------------------------------------------------------------
# sample_weight
# ------------------------------------------------------------------------------------------------
def _int_weights(n, seed=0):
    """Integer weights in {0, 1, 2, 3} (zeros drop rows, the others repeat them)."""
    w = np.random.default_rng(seed).integers(0, 4, size=n)
    w[:3] = (1, 2, 3)
    return w


def _gmm_assert_same(a, b, rtol):
    assert a.n_iter_ == b.n_iter_
    assert abs(a.lower_bound_ - b.lower_bound_) <= rtol * abs(b.lower_bound_)
    np.testing.assert_allclose(a.lower_bounds_, b.lower_bounds_, rtol=rtol)
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert _rel(getattr(a, name), getattr(b, name)) <= rtol, name


@pytest.mark.filterwarnings("ignore::algorithms._base.ConvergenceWarning")
@pytest.mark.parametrize("ct", COV_TYPES)
def test_gmm_integer_weights_equal_repeated_rows(iris, ct):
    w = _int_weights(len(iris))
    kw = dict(covariance_type=ct, tol=0.0, max_iter=15, backend="cpu", **_explicit_init(iris, ct))
    weighted = GaussianMixture(3, **kw).fit(iris, sample_weight=w)
    repeated = GaussianMixture(3, **kw).fit(np.repeat(iris, w, axis=0))
    _gmm_assert_same(weighted, repeated, 1e-8)
    # uniform weights 2.0: the unweighted model (float64 data)
    unweighted = GaussianMixture(3, **kw).fit(iris)
    _gmm_assert_same(GaussianMixture(3, **kw).fit(iris, sample_weight=np.full(len(iris), 2.0)), unweighted, 1e-10)
    # the weights matter: non-uniform weights move the model away from the unweighted one
    assert _rel(weighted.means_, unweighted.means_) > 1e-3


@pytest.mark.filterwarnings("ignore::algorithms._base.ConvergenceWarning")
@pytest.mark.parametrize("init", ["kmeans", "random", "random_from_data", "k-means++"])
def test_gmm_weighted_initialisations(iris, init):
    """Seeded starts: uniform weights 2.0 = unweighted; zero-weight rows never pick a start."""
    kw = dict(covariance_type="diag", init_params=init, random_state=3, max_iter=0, backend="cpu")
    unweighted = GaussianMixture(3, **kw).fit(iris)
    twice = GaussianMixture(3, **kw).fit(iris, sample_weight=2.0 * np.ones(len(iris)))
    for name in ("weights_", "means_", "covariances_"):
        assert _rel(getattr(twice, name), getattr(unweighted, name)) <= 1e-12, name
    # only rows 100.. weighted: a one-hot / k-means start takes its means from those rows only
    w = np.zeros(len(iris))
    w[100:] = 1.0
    sub = GaussianMixture(3, **kw).fit(iris, sample_weight=w)
    lo, hi = iris[100:].min(0), iris[100:].max(0)
    if init != "random":  # random responsibilities: weighted means of all weighted rows
        assert np.all(sub.means_ >= lo - 1e-12) and np.all(sub.means_ <= hi + 1e-12)
    else:  # scikit-learn's random responsibilities (same RandomState draw), times the weights
        r = np.random.RandomState(3).uniform(size=(len(iris), 3))
        r = r / r.sum(1)[:, None] * w[:, None]
        np.testing.assert_allclose(sub.means_, (r.T @ iris) / r.sum(0)[:, None], rtol=1e-10)
        np.testing.assert_allclose(sub.weights_, r.sum(0) / r.sum(), rtol=1e-10)
    if init == "kmeans":  # = the statistics of weighted KMeans' clusters of those rows
        km = KMeans(3, random_state=3, backend="cpu").fit(iris, sample_weight=w)
        ref = GaussianMixture(3, **kw).fit(iris[100:])
        np.testing.assert_allclose(np.sort(km.cluster_centers_[:, 0]), np.sort(ref.means_[:, 0]), rtol=1e-10)
    # EM from the weighted start: the lower bound is the weighted mean log-likelihood of the data
    fit = GaussianMixture(3, covariance_type="diag", init_params=init, random_state=3, max_iter=3, tol=0.0,
                          backend="cpu").fit(iris, sample_weight=w + 0.5)
    assert np.isfinite(fit.lower_bound_)
    assert fit.lower_bounds_[-1] == fit.lower_bound_


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gmm_weighted_backends_and_dask(iris):
    """Weighted E-steps on the fused (interpreter) / ops backends and through a dask stream."""
    X = iris[:, :3].astype(np.float32)
    w = _int_weights(len(X), seed=1).astype(np.float64) * 0.5
    full = _explicit_init(iris[:, :3], "full", K=2)
    kw = dict(covariance_type="full", max_iter=3, tol=0.0, **full)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fits = {be: GaussianMixture(2, backend=be, **kw).fit(X, sample_weight=w) for be in ("cpu", "ops", "fused")}
        for be in ("ops", "fused"):
            assert fits[be].lower_bound_ == pytest.approx(fits["cpu"].lower_bound_, rel=1e-5)
            assert _rel(fits[be].means_, fits["cpu"].means_) <= 1e-4
        da = pytest.importorskip("dask.array")
        pytest.importorskip("fusedml.streaming")
        Xd = da.from_array(iris, chunks=(40, 4))
        w = _int_weights(len(iris), seed=2)
        for init in ("kmeans", "random"):
            kwd = dict(covariance_type="diag", init_params=init, random_state=0, max_iter=5, tol=0.0, backend="cpu")
            md = GaussianMixture(3, **kwd).fit(Xd, sample_weight=w)
            mn = GaussianMixture(3, **kwd).fit(iris, sample_weight=w)
            assert md.lower_bound_ == pytest.approx(mn.lower_bound_, rel=1e-12)
            assert _rel(md.means_, mn.means_) <= 1e-10
        kd = KMeans(3, random_state=0, backend="cpu").fit(Xd, sample_weight=w)
        kn = KMeans(3, random_state=0, backend="cpu").fit(iris, sample_weight=w)
        assert kd.inertia_ == pytest.approx(kn.inertia_, rel=1e-12)
        np.testing.assert_array_equal(kd.labels_, kn.labels_)


def test_kmeans_integer_weights_equal_repeated_rows(iris):
    w = _int_weights(len(iris))
    init = iris[[3, 70, 140]]
    weighted = KMeans(3, init=init, backend="cpu").fit(iris, sample_weight=w)
    repeated = KMeans(3, init=init, backend="cpu").fit(np.repeat(iris, w, axis=0))
    assert weighted.inertia_ == pytest.approx(repeated.inertia_, rel=1e-10)
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, rtol=1e-10)
    assert weighted.n_iter_ == repeated.n_iter_
    # uniform weights 2.0: the unweighted centres, twice the inertia; seeded k-means++ too
    for kw in (dict(init=init), dict(init="k-means++", random_state=1), dict(init="random", random_state=1)):
        u = KMeans(3, backend="cpu", **kw).fit(iris)
        t = KMeans(3, backend="cpu", **kw).fit(iris, sample_weight=np.full(len(iris), 2.0))
        np.testing.assert_allclose(t.cluster_centers_, u.cluster_centers_, rtol=1e-12)
        assert t.inertia_ == pytest.approx(2 * u.inertia_, rel=1e-12)
        np.testing.assert_array_equal(t.labels_, u.labels_)


@pytest.mark.parametrize("init", ["explicit", "k-means++", "random"])
def test_kmeans_weighted_matches_sklearn(iris, init):
    w = np.random.default_rng(7).uniform(0.0, 3.0, size=len(iris))
    w[::11] = 0.0
    kw = dict(init=iris[[3, 70, 140]]) if init == "explicit" else dict(init=init, random_state=4)
    ours = KMeans(3, n_init=1, backend="cpu", **kw).fit(iris, sample_weight=w)
    ref = SkKMeans(3, n_init=1, **kw).fit(iris, sample_weight=w)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    assert ours.n_iter_ == ref.n_iter_
    assert ours.score(iris, sample_weight=w) == pytest.approx(ref.score(iris, sample_weight=w), rel=1e-10)
    np.testing.assert_array_equal(ours.fit_predict(iris, sample_weight=w), ref.labels_)


def test_kmeans_weighted_empty_cluster_matches_sklearn(iris):
    init = np.r_[iris[[3, 70]], [[100.0, 100.0, 100.0, 100.0]]]  # third centre attracts nothing
    w = np.random.default_rng(8).uniform(0.5, 2.0, size=len(iris))
    for max_iter in (1, 300):  # right after the relocation, and converged
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            ours = KMeans(3, init=init, max_iter=max_iter, backend="cpu").fit(iris, sample_weight=w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = SkKMeans(3, init=init, n_init=1, max_iter=max_iter).fit(iris, sample_weight=w)
        assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)
        np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10)


@pytest.mark.parametrize("Est", [GaussianMixture, KMeans])
def test_bad_sample_weight(Est, iris):
    est = Est(3, backend="cpu", random_state=0)
    n = len(iris)
    cases = [(np.ones(n - 1), "shape"), (np.ones((n, 1)), "shape"), (-np.ones(n), "non-negative"),
             (np.zeros(n), "zero"), (np.r_[np.nan, np.ones(n - 1)], "NaN"), (np.r_[np.inf, np.ones(n - 1)], "infinite")]
    for sw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            est.fit(iris, sample_weight=sw)
    with pytest.raises(TypeError, match="numeric"):
        est.fit(iris, sample_weight=np.array(["a"] * n))
    few = np.zeros(n)
    few[:2] = 1.0  # two positive rows cannot seed three distinct random rows
    bad_init = GaussianMixture(3, init_params="random_from_data", backend="cpu") if Est is GaussianMixture \
        else KMeans(3, init="random", backend="cpu")
    with pytest.raises(ValueError, match="positive sample_weight"):
        bad_init.fit(iris, sample_weight=few)


def test_byte_swapped_inputs(rng):
    """Byte-swapped numpy X (">f8") and a Dask array of byte-swapped chunks: GaussianMixture and
    KMeans give the native array's model."""
    da = pytest.importorskip("dask.array")
    X = np.concatenate([rng.normal(size=(40, 3)), rng.normal(size=(40, 3)) + 4.0])
    Xs = X.astype(X.dtype.newbyteorder())
    for est in (GaussianMixture(2, random_state=0, backend="cpu"), KMeans(2, random_state=0, backend="cpu")):
        attr = "means_" if isinstance(est, GaussianMixture) else "cluster_centers_"
        want = getattr(clone(est).fit(X), attr)
        np.testing.assert_array_equal(getattr(clone(est).fit(Xs), attr), want)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the Dask input's note
            np.testing.assert_allclose(getattr(clone(est).fit(da.from_array(Xs, chunks=(30, 3))), attr), want,
                                       rtol=1e-6, atol=1e-9)


def test_tensor_requiring_grad(rng):
    """GaussianMixture and KMeans on a torch X that requires grad: the plain tensor's model."""
    X = torch.tensor(np.concatenate([rng.normal(size=(40, 3)), rng.normal(size=(40, 3)) + 4.0]))
    Xg = X.clone().requires_grad_(True)
    g, gg = (GaussianMixture(2, random_state=0, backend="cpu").fit(A) for A in (X, Xg))
    assert torch.equal(g.means_, gg.means_) and torch.equal(g.predict(X), gg.predict(Xg))
    k, kg = (KMeans(2, random_state=0, backend="cpu").fit(A) for A in (X, Xg))
    assert torch.equal(k.cluster_centers_, kg.cluster_centers_) and torch.equal(k.predict(X), kg.predict(Xg))


def test_streamed_rows_padded_for_kmeans_not_for_em(rng, monkeypatch):
    """A Dask X: KMeans' streamed matrix keeps its resident rows padded where the streaming options
    say so (``align_rows``), GaussianMixture's keeps them as they are (its E-steps read X as it is);
    both give the in-memory model."""
    da = pytest.importorskip("dask.array")
    import fusedml.streaming as streaming

    X = np.concatenate([rng.normal(size=(40, 5)), rng.normal(size=(40, 5)) + 4.0]).astype(np.float32)
    made = []
    real = streaming.StreamedMatrix.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self.resident_matrix.stride(0))

    monkeypatch.setattr(streaming.StreamedMatrix, "__init__", init)
    with streaming.options(align_rows=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Dask input's note
        k = KMeans(2, random_state=0, backend="cpu").fit(da.from_array(X, chunks=(30, 5)))
        g = GaussianMixture(2, random_state=0, backend="cpu").fit(da.from_array(X, chunks=(30, 5)))
    assert made[0] == 8 and set(made[1:]) == {5}, made
    np.testing.assert_allclose(k.cluster_centers_, KMeans(2, random_state=0, backend="cpu").fit(X).cluster_centers_,
                               rtol=1e-5)
    np.testing.assert_allclose(g.means_, GaussianMixture(2, random_state=0, backend="cpu").fit(X).means_, rtol=1e-4)


def test_kmeans_transform(rng):
    """``transform`` / ``fit_transform``: distances to every centre as the direct float64 formula
    (data far from the origin too), in X's dtype, for numpy, torch and Dask inputs."""
    da = pytest.importorskip("dask.array")
    X = np.concatenate([rng.normal(size=(30, 3)), rng.normal(size=(30, 3)) + 4.0]) + 1e4
    km = KMeans(2, random_state=0, backend="cpu")
    D = km.fit_transform(X)
    C = km.cluster_centers_
    ref = np.sqrt(((X[:, None, :] - C[None]) ** 2).sum(-1))
    assert D.shape == (60, 2) and D.dtype == np.float64 and np.abs(D - ref).max() < 1e-9
    np.testing.assert_array_equal(D.argmin(1), km.labels_)
    assert km.transform(X.astype(np.float32)).dtype == np.float32
    t = km.transform(torch.tensor(X))
    assert isinstance(t, torch.Tensor) and torch.equal(t, torch.from_numpy(D))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the Dask input's note
        np.testing.assert_array_equal(km.transform(da.from_array(X, chunks=(25, 3))), D)
    with pytest.raises(ValueError, match="features"):
        km.transform(X[:, :2])
    assert km.get_feature_names_out().tolist() == ["kmeans0", "kmeans1"]
