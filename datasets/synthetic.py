"""Seeded synthetic data of any scale with a known true model.

Everything is drawn with torch on the requested device (vectorised; on ``device="cuda"`` the
data is built on the GPU and never crosses PCIe), from one ``torch.Generator`` seeded with
``seed``: the same seed, shape and device give the same data. Results are numpy arrays /
``scipy.sparse.csr_matrix`` on request (CPU only) or torch tensors / :class:`fusedml.CSRMatrix`.

Models (``eta`` is the linear predictor ``X @ coef + intercept``):

* binary: ``y ~ Bernoulli(sigmoid(eta))``; multiclass: ``y ~ Categorical(softmax(eta))``
  (Gumbel-max);
* regression: ``y = eta + noise * N(0, 1)``;
* counts (log link): ``y ~ Poisson(exp(eta))``;
* positive (log link): ``y ~ Gamma(shape=k, scale=exp(eta) / k)`` with integer ``k``
  (a sum of ``k`` exponentials, so that the seeded generator drives it);
* Gaussian mixtures: component means at a chosen minimum pairwise distance ``separation``
  (within-component standard deviations are of order 1).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ._base import Dataset

SUPERVISED_TASKS = ("binary", "multiclass", "regression", "counts", "positive")
PROFILES = ("constant", "uniform", "powerlaw")
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")

_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                 "bfloat16": torch.bfloat16}


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise TypeError(f"dtype must be floating point, got {dtype}")
        return dtype
    name = np.dtype(dtype).name if dtype not in _TORCH_DTYPES else dtype
    if name not in _TORCH_DTYPES:
        raise TypeError(f"dtype must be one of {tuple(_TORCH_DTYPES)}, got {dtype!r}")
    return _TORCH_DTYPES[name]


def _setup(seed, device, return_torch):
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' requested but no CUDA GPU is available")
    if return_torch is None:
        return_torch = device.type != "cpu"
    if not return_torch and device.type != "cpu":
        raise ValueError("numpy output (return_torch=False) needs device='cpu'")
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return device, return_torch, gen


def _check_size(n_samples, n_features):
    for nm, v in (("n_samples", n_samples), ("n_features", n_features)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{nm} must be a positive integer, got {v!r}")


def _true_model(n_features, task, n_classes, signal, gen, device):
    """Draw ``coef`` [D] (or [D, K]) with ``||coef|| ~ signal`` and an intercept."""
    k = n_classes if task == "multiclass" else 1
    coef = torch.randn(n_features, k, generator=gen, device=device, dtype=torch.float64)
    coef *= signal / math.sqrt(n_features)
    if task == "multiclass":
        intercept = 0.5 * torch.randn(k, generator=gen, device=device, dtype=torch.float64)
    elif task in ("counts", "positive"):
        intercept = torch.full((1,), math.log(2.0), device=device, dtype=torch.float64)  # mean ~ 2
    else:
        intercept = 0.5 * torch.randn(1, generator=gen, device=device, dtype=torch.float64)
    if k == 1:
        coef, intercept = coef[:, 0], intercept[0]
    return coef, intercept


def _targets(eta, task, gen, noise=0.5, gamma_shape=2):
    """Draw ``y`` [N] from the linear predictor ``eta`` ([N], or [N, K] for multiclass), float64."""
    if task == "binary":
        u = torch.rand(eta.shape, generator=gen, device=eta.device, dtype=torch.float64)
        return (u < torch.sigmoid(eta)).to(torch.int64)
    if task == "multiclass":
        u = torch.rand(eta.shape, generator=gen, device=eta.device, dtype=torch.float64)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
        return torch.argmax(eta + gumbel, dim=1)
    if task == "regression":
        return eta + noise * torch.randn(eta.shape, generator=gen, device=eta.device, dtype=torch.float64)
    if task == "counts":
        return torch.poisson(torch.exp(eta.clamp(max=30.0)), generator=gen)
    if task == "positive":
        if not isinstance(gamma_shape, (int, np.integer)) or gamma_shape < 1:
            raise ValueError(f"gamma_shape must be a positive integer, got {gamma_shape!r}")
        # Gamma(k, theta) = theta * sum of k standard exponentials.
        u = torch.rand((eta.shape[0], int(gamma_shape)), generator=gen, device=eta.device, dtype=torch.float64)
        e = -torch.log1p(-u).sum(1)
        return torch.exp(eta) / gamma_shape * e.clamp_min(1e-12)
    raise ValueError(f"task must be one of {SUPERVISED_TASKS}, got {task!r}")


def _check_task(task, n_classes):
    if task not in SUPERVISED_TASKS:
        raise ValueError(f"task must be one of {SUPERVISED_TASKS}, got {task!r}")
    if task == "multiclass" and (not isinstance(n_classes, (int, np.integer)) or n_classes < 3):
        raise ValueError(f"multiclass needs n_classes >= 3, got {n_classes!r}")


def _finish_y(y, task, return_torch):
    if task not in ("binary", "multiclass"):
        y = y.to(torch.float64)
    return y if return_torch else y.cpu().numpy()


def make_dense(n_samples: int, n_features: int, task: str = "binary", *, n_classes: int = 3,
               signal: float = 2.0, noise: float = 0.5, gamma_shape: int = 2, seed: int = 0,
               dtype="float32", device="cpu", return_torch: bool | None = None) -> Dataset:
    """Dense Gaussian features with targets from a known generalised linear model.

    Parameters
    ----------
    n_samples, n_features : int
        ``N`` and ``D``.
    task : {"binary", "multiclass", "regression", "counts", "positive"}
        The target model (see the module docstring); counts and positive use a log link.
    n_classes : int
        Number of classes for ``task="multiclass"`` (>= 3).
    signal : float
        Standard deviation of the linear predictor's feature part (``||coef||``, as X ~ N(0, 1)).
        Use a smaller value (e.g. 0.5) for counts/positive to keep ``exp(eta)`` moderate.
    noise : float
        Noise standard deviation for ``task="regression"``.
    gamma_shape : int
        Gamma shape ``k`` for ``task="positive"`` (dispersion ``1/k``).
    seed : int
        Seed of the generator: same seed, shape and device give the same data.
    dtype : str or dtype
        Storage dtype of ``X`` (float32, float64, float16, bfloat16).
    device : str or torch.device
        Where to build the data ("cpu" or "cuda").
    return_torch : bool, optional
        Torch tensors (default when ``device`` is not the CPU) or numpy arrays.

    Returns
    -------
    Dataset
        ``X`` [N, D]; ``y`` [N] (int64 labels, float64 otherwise); ``truth`` holds
        ``coef`` ([D] or [D, K] float64) and ``intercept``.
    """
    _check_size(n_samples, n_features)
    _check_task(task, n_classes)
    dt = _dtype(dtype)
    device, return_torch, gen = _setup(seed, device, return_torch)
    coef, intercept = _true_model(n_features, task, n_classes, signal, gen, device)
    X = torch.randn(n_samples, n_features, generator=gen, device=device, dtype=torch.float32)
    X = X.to(dt)
    eta = X.to(torch.float64) @ coef + intercept  # the model the stored (rounded) X defines
    y = _targets(eta, task, gen, noise=noise, gamma_shape=gamma_shape)
    truth = {"coef": coef if return_torch else coef.cpu().numpy(),
             "intercept": intercept if return_torch else intercept.cpu().numpy()}
    if not return_torch:
        if dt == torch.bfloat16:
            raise TypeError("numpy has no bfloat16: use return_torch=True for bfloat16 data")
        X = X.cpu().numpy()
    name = f"synthetic-dense:{n_samples}x{n_features}"
    desc = (f"Synthetic dense N(0, 1) features, {task} targets from a known linear model "
            f"(signal={signal}, seed={seed}).")
    return Dataset(X, _finish_y(y, task, return_torch), name, task, desc, truth=truth)


def make_classification(n_samples: int, n_features: int, n_classes: int = 2, **kw) -> Dataset:
    """Dense binary (``n_classes=2``) or multinomial classification data with a known model.

    Parameters
    ----------
    n_samples, n_features : int
        ``N`` and ``D``.
    n_classes : int
        2 for logistic targets, >= 3 for multinomial (softmax) targets.
    **kw
        Passed to :func:`make_dense` (``signal``, ``seed``, ``dtype``, ``device``, ``return_torch``).

    Returns
    -------
    Dataset
        See :func:`make_dense`.
    """
    if not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
        raise ValueError(f"n_classes must be an integer >= 2, got {n_classes!r}")
    task = "binary" if n_classes == 2 else "multiclass"
    return make_dense(n_samples, n_features, task, n_classes=n_classes, **kw)


def make_regression(n_samples: int, n_features: int, family: str = "normal", **kw) -> Dataset:
    """Dense regression data: ``family`` "normal" (identity link), "poisson" or "gamma" (log link).

    Parameters
    ----------
    n_samples, n_features : int
        ``N`` and ``D``.
    family : {"normal", "poisson", "gamma"}
        Target distribution.
    **kw
        Passed to :func:`make_dense`. For poisson/gamma the default ``signal`` is 0.5.

    Returns
    -------
    Dataset
        See :func:`make_dense`.
    """
    tasks = {"normal": "regression", "poisson": "counts", "gamma": "positive"}
    if family not in tasks:
        raise ValueError(f"family must be one of {tuple(tasks)}, got {family!r}")
    if family != "normal":
        kw.setdefault("signal", 0.5)
    return make_dense(n_samples, n_features, tasks[family], **kw)


def row_lengths(n_samples: int, n_features: int, nnz_per_row: float, profile: str, gen,
                device) -> torch.Tensor:
    """Draw ``[N]`` int64 row lengths with mean about ``nnz_per_row``, clipped to ``[1, D]``.

    Parameters
    ----------
    n_samples, n_features : int
        ``N`` and ``D``.
    nnz_per_row : float
        Target mean number of entries per row.
    profile : {"constant", "uniform", "powerlaw"}
        ``constant``: every row has ``nnz_per_row`` entries; ``uniform``: lengths uniform on
        ``[1, 2 * nnz_per_row - 1]``; ``powerlaw``: Pareto(alpha=2) lengths (mean
        ``nnz_per_row``, a heavy tail of very long rows, like KDD2010 or url).
    gen : torch.Generator
        The seeded generator (on ``device``).
    device : torch.device
        Where to draw.

    Returns
    -------
    torch.Tensor
        ``[N]`` int64.
    """
    k = float(nnz_per_row)
    if profile == "constant":
        L = torch.full((n_samples,), int(round(k)), dtype=torch.int64, device=device)
    elif profile == "uniform":
        hi = max(1, int(round(2 * k - 1)))
        L = torch.randint(1, hi + 1, (n_samples,), generator=gen, device=device)
    elif profile == "powerlaw":
        # Pareto(alpha=2, x_m): mean 2 x_m; floor(x_m U^{-1/2}) + 1 has mean about 2 x_m + 1/2.
        xm = max(k - 0.5, 0.5) / 2.0
        u = torch.rand(n_samples, generator=gen, device=device, dtype=torch.float64).clamp_min(1e-12)
        L = torch.floor(xm * u.pow(-0.5)).to(torch.int64) + 1
    else:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return L.clamp_(1, n_features)


def make_csr(n_samples: int, n_features: int, nnz_per_row: float = 32, profile: str = "uniform",
             task: str = "binary", *, n_classes: int = 3, signal: float = 2.0, noise: float = 0.5,
             gamma_shape: int = 2, seed: int = 0, dtype="float32", index_dtype=None, device="cpu",
             return_torch: bool | None = None) -> Dataset:
    """Sparse CSR features with a chosen nnz-per-row profile and targets from a known model.

    Built fully vectorised: row lengths are drawn, all column indices at once (uniform
    columns for "constant"/"uniform", Zipf-like popular columns for "powerlaw", scattered by a
    fixed random permutation), then sorted by ``row * D + col`` and de-duplicated, so the realised
    nnz per row can fall slightly below the drawn length when columns collide. Values are
    ``N(0, 1) / sqrt(row length)`` (rows of unit norm on average, like l2-normalised tf-idf).

    Parameters
    ----------
    n_samples, n_features : int
        ``N`` and ``D``.
    nnz_per_row : float
        Mean entries per row before de-duplication.
    profile : {"constant", "uniform", "powerlaw"}
        See :func:`row_lengths`.
    task : {"binary", "multiclass", "regression", "counts", "positive"}
        Target model (see the module docstring).
    n_classes, signal, noise, gamma_shape, seed, dtype, device, return_torch
        As in :func:`make_dense` (``signal`` is the std of the linear predictor).
    index_dtype : torch.dtype, optional
        Index dtype; default int32 when ``nnz`` and ``D`` fit, else int64.

    Returns
    -------
    Dataset
        ``X`` is a ``scipy.sparse.csr_matrix`` (numpy output) or a :class:`fusedml.CSRMatrix`
        (torch output) of shape ``[N, D]`` with sorted, unique columns per row; ``y`` [N];
        ``truth`` holds ``coef``, ``intercept`` and the drawn ``row_lengths`` target.
    """
    _check_size(n_samples, n_features)
    _check_task(task, n_classes)
    if not (0 < nnz_per_row < float("inf")):
        raise ValueError(f"nnz_per_row must be positive and finite, got {nnz_per_row!r}")
    dt = _dtype(dtype)
    device, return_torch, gen = _setup(seed, device, return_torch)
    coef, intercept = _true_model(n_features, task, n_classes, signal, gen, device)
    L = row_lengths(n_samples, n_features, nnz_per_row, profile, gen, device)
    total = int(L.sum())
    rows = torch.repeat_interleave(torch.arange(n_samples, device=device), L)  # [nnz0]
    u = torch.rand(total, generator=gen, device=device, dtype=torch.float64)
    if profile == "powerlaw":
        # Column popularity ~ Zipf-like (density ∝ c^(-2/3)); a permutation spreads popular ids.
        col = torch.floor(n_features * u.pow(3.0)).to(torch.int64).clamp_(max=n_features - 1)
        perm = torch.randperm(n_features, generator=gen, device=device)
        col = perm[col]
    else:
        col = torch.floor(n_features * u).to(torch.int64).clamp_(max=n_features - 1)
    del u
    key, _ = torch.sort(rows * n_features + col)
    del rows, col
    keep = torch.ones_like(key, dtype=torch.bool)
    keep[1:] = key[1:] != key[:-1]
    key = key[keep]
    del keep
    rows = key // n_features
    col = key - rows * n_features
    del key
    counts = torch.bincount(rows, minlength=n_samples)
    crow = torch.zeros(n_samples + 1, dtype=torch.int64, device=device)
    crow[1:] = torch.cumsum(counts, 0)
    scale = counts.clamp_min(1).to(torch.float64).rsqrt()[rows]
    val64 = torch.randn(col.numel(), generator=gen, device=device, dtype=torch.float64) * scale
    del scale
    val = val64.to(dt)
    # eta = X @ coef by prefix sums of val * coef[col]: deterministic on every device.
    prod = val.to(torch.float64)[:, None] * (coef[col] if coef.ndim == 2 else coef[col][:, None])
    del val64
    cs = torch.zeros((prod.shape[0] + 1, prod.shape[1]), dtype=torch.float64, device=device)
    cs[1:] = torch.cumsum(prod, 0)
    del prod
    eta = cs[crow[1:]] - cs[crow[:-1]]
    del cs
    eta = (eta if coef.ndim == 2 else eta[:, 0]) + intercept
    y = _targets(eta, task, gen, noise=noise, gamma_shape=gamma_shape)
    nnz = col.numel()
    if index_dtype is None:
        index_dtype = torch.int32 if max(nnz, n_features) < 2**31 - 1 else torch.int64
    crow = crow.to(index_dtype)
    col = col.to(index_dtype)
    name = f"synthetic-csr:{n_samples}x{n_features}:{nnz_per_row:g}:{profile}"
    desc = (f"Synthetic CSR, {profile} nnz-per-row profile (mean {nnz_per_row:g} before "
            f"de-duplication, realised {nnz / n_samples:.2f}), {task} targets from a known "
            f"linear model (signal={signal}, seed={seed}).")
    if return_torch:
        from fusedml._validation import CSRMatrix

        X = CSRMatrix(crow, col, val, (n_samples, n_features))
        truth = {"coef": coef, "intercept": intercept, "row_lengths": L}
    else:
        import scipy.sparse as sp

        if dt == torch.bfloat16:
            raise TypeError("numpy has no bfloat16: use return_torch=True for bfloat16 data")
        X = sp.csr_matrix((val.numpy(), col.numpy(), crow.numpy()), shape=(n_samples, n_features))
        truth = {"coef": coef.numpy(), "intercept": intercept.numpy(), "row_lengths": L.numpy()}
    return Dataset(X, _finish_y(y, task, return_torch), name, task, desc, truth=truth)


def make_gmm(n_samples: int, n_features: int, n_components: int = 3, *, separation: float = 4.0,
             covariance_type: str = "diag", weights=None, seed: int = 0, dtype="float32",
             device="cpu", return_torch: bool | None = None) -> Dataset:
    """Samples of a Gaussian mixture whose closest two means are ``separation`` apart.

    Within-component standard deviations lie in [0.5, 1.5] ("diag": per feature; "spherical":
    one per component; "full"/"tied": covariance ``A A^T / D + 0.5 I`` with Gaussian ``A``), so
    ``separation`` reads as a distance in units of about one standard deviation: 2 overlaps,
    6 is well separated.

    Parameters
    ----------
    n_samples, n_features : int
        ``N`` and ``D``.
    n_components : int
        ``K``.
    separation : float
        Minimum distance between two component means (> 0).
    covariance_type : {"full", "tied", "diag", "spherical"}
        Shape of the true covariances.
    weights : array-like of shape [K], optional
        Mixing weights (default equal); must be positive, they are normalised.
    seed, dtype, device, return_torch
        As in :func:`make_dense`.

    Returns
    -------
    Dataset
        ``task="clustering"``, ``X`` [N, D], ``y`` [N] int64 true component labels, ``truth``
        with ``weights`` [K], ``means`` [K, D] and ``covariances`` (scikit-learn shapes: full
        [K, D, D], tied [D, D], diag [K, D], spherical [K]), float64.
    """
    _check_size(n_samples, n_features)
    if not isinstance(n_components, (int, np.integer)) or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r}")
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    if not (separation > 0):
        raise ValueError(f"separation must be positive, got {separation!r}")
    dt = _dtype(dtype)
    device, return_torch, gen = _setup(seed, device, return_torch)
    K, D, f64 = n_components, n_features, torch.float64
    if weights is None:
        w = torch.full((K,), 1.0 / K, dtype=f64, device=device)
    else:
        w = torch.as_tensor(np.asarray(weights, dtype=np.float64), device=device)
        if w.shape != (K,) or not bool((w > 0).all()):
            raise ValueError(f"weights must be {K} positive numbers, got {weights!r}")
        w = w / w.sum()
    means = torch.randn(K, D, generator=gen, device=device, dtype=f64)
    if K > 1:
        dist = torch.cdist(means, means) + torch.eye(K, device=device, dtype=f64) * 1e300
        means *= separation / dist.min()
    labels = torch.multinomial(w, n_samples, replacement=True, generator=gen)  # [N]
    eps = torch.randn(n_samples, D, generator=gen, device=device, dtype=f64)
    if covariance_type == "diag":
        sd = 0.5 + torch.rand(K, D, generator=gen, device=device, dtype=f64)
        X = means[labels] + eps * sd[labels]
        cov = sd**2
    elif covariance_type == "spherical":
        sd = 0.5 + torch.rand(K, generator=gen, device=device, dtype=f64)
        X = means[labels] + eps * sd[labels, None]
        cov = sd**2
    else:
        n_cov = K if covariance_type == "full" else 1
        A = torch.randn(n_cov, D, D, generator=gen, device=device, dtype=f64)
        cov = A @ A.transpose(1, 2) / D + 0.5 * torch.eye(D, device=device, dtype=f64)
        chol = torch.linalg.cholesky(cov)  # [n_cov, D, D]
        X = means[labels].clone()
        for k in range(n_cov):
            sel = labels == k if covariance_type == "full" else slice(None)
            X[sel] += eps[sel] @ chol[k].T
        if covariance_type == "tied":
            cov = cov[0]
    X = X.to(dt)
    truth = {"weights": w, "means": means, "covariances": cov}
    if not return_torch:
        if dt == torch.bfloat16:
            raise TypeError("numpy has no bfloat16: use return_torch=True for bfloat16 data")
        X, labels = X.cpu().numpy(), labels.cpu().numpy()
        truth = {k: v.cpu().numpy() for k, v in truth.items()}
    name = f"synthetic-gmm:{n_samples}x{n_features}:{K}"
    desc = (f"Synthetic Gaussian mixture, K={K}, {covariance_type} covariances, minimum mean "
            f"distance {separation:g}, seed={seed}.")
    return Dataset(X, labels, name, "clustering", desc, truth=truth)
