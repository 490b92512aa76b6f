"""End-to-end comparison grid: whole ``fit`` calls per (dataset, algorithm, backend).

Used by ``fusedml demo``, ``fusedml bench`` and ``benchmarks/bench_end_to_end.py``.

Fairness rules
--------------
* Every backend gets the same data (same dtype; the fusedml backends on the same device), the
  same hyper-parameters, the same ``max_iter`` and ``tol``.
* "fused" and "ops" are the same fusedml estimator (same algorithm, same solver); only the
  operator backend differs. scikit-learn runs on the CPU with its own solver.
* On CUDA every timed fit is preceded by one untimed 2-iteration fit on the same data (Triton
  compilation, cuBLAS/cuSPARSE handles, the ops backend's CSR transpose cache), and the clock is
  read after ``torch.cuda.synchronize()``.
* Besides the time per fit, each fusedml row reports the **time to a common objective**: the
  worst final objective among the fusedml backends of its group, located in each ``history_``.
* The reported ``objective`` is recomputed here, in float64 from the fitted coefficients, with
  one formula per algorithm for every backend (scikit-learn's included; see :func:`objective`).
  GMM reports the mean log-likelihood from the estimator's own ``score``.
* scikit-learn fits expected to exceed ``sklearn_budget`` seconds (probed on a subsample) are
  run on that subsample only; the row then reports the time scaled by rows and says so.
"""
from __future__ import annotations

import datetime
import gc
import importlib
import inspect
import json
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

BACKENDS = ("fused", "ops", "cpu", "sklearn")


class BenchError(ValueError):
    """A user-facing configuration error (unknown dataset/algorithm/backend, missing GPU, ...)."""


@dataclass(frozen=True)
class AlgoSpec:
    """One algorithm of the grid.

    Attributes
    ----------
    key : str
        Name on the command line.
    estimator : str
        Class name in :mod:`algorithms`.
    sklearn : str
        ``module:Class`` of the scikit-learn counterpart.
    task : str
        Task of the synthetic data it is benchmarked on.
    accepts : tuple of str
        Tasks of real data sets it can run on.
    params : dict
        Hyper-parameters given to every backend (filtered by each class's signature).
    sense : {"min", "max"}
        Whether ``history_`` objectives decrease ("min") or increase ("max").
    objective_name, score_name : str
        What :func:`objective` and the score column report.
    """

    key: str
    estimator: str
    sklearn: str
    task: str
    accepts: tuple
    params: dict = field(default_factory=dict)
    sense: str = "min"
    objective_name: str = "objective"
    score_name: str = "score"


ALGORITHMS = {
    a.key: a for a in (
        AlgoSpec("logistic", "LogisticRegression", "sklearn.linear_model:LogisticRegression", "binary",
                 ("binary",), {"C": 1.0, "max_iter": 100, "tol": 1e-6},
                 objective_name="log-loss + L2/(2CN)", score_name="accuracy"),
        AlgoSpec("logistic-multinomial", "LogisticRegression", "sklearn.linear_model:LogisticRegression",
                 "multiclass", ("multiclass",), {"C": 1.0, "max_iter": 100, "tol": 1e-6},
                 objective_name="cross-entropy + L2/(2CN)", score_name="accuracy"),
        AlgoSpec("linearsvc", "LinearSVC", "sklearn.svm:LinearSVC", "binary", ("binary",),
                 {"C": 1.0, "max_iter": 100, "tol": 1e-6},
                 objective_name="sq. hinge + L2/(2CN)", score_name="accuracy"),
        AlgoSpec("poisson", "PoissonRegressor", "sklearn.linear_model:PoissonRegressor", "counts",
                 ("counts",), {"alpha": 1e-4, "max_iter": 100, "tol": 1e-6},
                 objective_name="deviance/2N + alpha/2 L2", score_name="D2"),
        AlgoSpec("gamma", "GammaRegressor", "sklearn.linear_model:GammaRegressor", "positive",
                 ("positive",), {"alpha": 1e-4, "max_iter": 100, "tol": 1e-6},
                 objective_name="deviance/2N + alpha/2 L2", score_name="D2"),
        AlgoSpec("ridge", "Ridge", "sklearn.linear_model:Ridge", "regression",
                 ("regression", "counts", "positive"), {"alpha": 1.0, "max_iter": 100, "tol": 1e-6},
                 objective_name="(RSS + alpha L2)/2N", score_name="R2"),
        AlgoSpec("gmm", "GaussianMixture", "sklearn.mixture:GaussianMixture", "clustering",
                 ("clustering", "multiclass", "binary"),
                 {"covariance_type": "diag", "max_iter": 100, "tol": 1e-3, "random_state": 0,
                  "reg_covar": 1e-6},
                 sense="max", objective_name="mean log-likelihood", score_name="log-likelihood"),
    )
}


# ------------------------------------------------------------------------------------------
# data specs
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSpec:
    """A parsed dataset argument.

    Attributes
    ----------
    text : str
        As given.
    kind : {"bundled", "dense", "csr", "gmm", "svmlight", "npy", "npz"}
    n, d : int
        Rows and columns (synthetic).
    nnz_per_row : float
        CSR mean row length.
    profile : str
        CSR nnz-per-row profile.
    k : int
        GMM components.
    path : str
        File path (file kinds) or bundled name.
    """

    text: str
    kind: str
    n: int = 0
    d: int = 0
    nnz_per_row: float = 0.0
    profile: str = "uniform"
    k: int = 0
    path: str = ""

    def with_n(self, n: int) -> "DataSpec":
        """The same synthetic spec with ``n`` rows (other kinds are returned unchanged).

        Parameters
        ----------
        n : int
            New row count.

        Returns
        -------
        DataSpec
        """
        if self.kind not in ("dense", "csr", "gmm"):
            return self
        parts = self.text.split(":")
        d = parts[1].split("x")[1]
        parts[1] = f"{n}x{d}"
        return DataSpec(":".join(parts), self.kind, n, self.d, self.nnz_per_row, self.profile, self.k,
                        self.path)


SPEC_HELP = (
    "a bundled name ({bundled}), synthetic-dense:NxD, synthetic-csr:NxD[:NNZ_PER_ROW[:PROFILE]] "
    "(PROFILE uniform|constant|powerlaw), synthetic-gmm:NxD[:K], or a file as "
    "svmlight:PATH, npy:PATH, npz:PATH (a file or folder of scipy.sparse.save_npz shards)"
)


def _int(text, what, spec):
    try:
        v = int(float(text)) if "e" in text.lower() else int(text)
    except (ValueError, OverflowError):  # OverflowError: "1e400" (inf)
        raise BenchError(f"bad {what} {text!r} in dataset {spec!r}") from None
    if v < 1:
        raise BenchError(f"{what} must be positive in dataset {spec!r}")
    return v


def parse_dataset(spec: str) -> DataSpec:
    """Parse a dataset argument (see ``SPEC_HELP``).

    Parameters
    ----------
    spec : str
        E.g. ``"breast_cancer"``, ``"synthetic-dense:1000000x100"``,
        ``"synthetic-csr:1000000x100000:32:powerlaw"``, ``"synthetic-gmm:1000000x16:16"``,
        ``"svmlight:/data/a9a.txt"``.

    Returns
    -------
    DataSpec

    Raises
    ------
    BenchError
        Unknown name or malformed spec.
    FileNotFoundError
        A file spec whose path does not exist.
    """
    import datasets

    if spec in datasets.list_datasets():
        return DataSpec(spec, "bundled", path=spec)
    head, _, rest = spec.partition(":")
    if head in ("svmlight", "npy", "npz"):
        if not rest:
            raise BenchError(f"dataset {spec!r} needs a path after '{head}:'")
        if not os.path.exists(rest):
            raise FileNotFoundError(f"no such file: {rest}")
        return DataSpec(spec, head, path=rest)
    kinds = {"synthetic-dense": "dense", "synthetic-csr": "csr", "synthetic-gmm": "gmm"}
    if head not in kinds:
        raise BenchError(f"unknown dataset {spec!r}; expected " +
                         SPEC_HELP.format(bundled=", ".join(datasets.list_datasets())))
    parts = rest.split(":") if rest else []
    if not parts or "x" not in parts[0]:
        raise BenchError(f"dataset {spec!r}: expected {head}:NxD...")
    n_txt, _, d_txt = parts[0].partition("x")
    n, d = _int(n_txt, "row count", spec), _int(d_txt, "column count", spec)
    kind = kinds[head]
    if kind == "dense":
        if len(parts) != 1:
            raise BenchError(f"dataset {spec!r}: expected synthetic-dense:NxD")
        return DataSpec(spec, kind, n, d)
    if kind == "gmm":
        if len(parts) > 2:
            raise BenchError(f"dataset {spec!r}: expected synthetic-gmm:NxD[:K]")
        return DataSpec(spec, kind, n, d, k=_int(parts[1], "component count", spec) if len(parts) == 2 else 8)
    if len(parts) > 3:
        raise BenchError(f"dataset {spec!r}: expected synthetic-csr:NxD[:NNZ_PER_ROW[:PROFILE]]")
    try:
        k = float(parts[1]) if len(parts) > 1 else 32.0
    except ValueError:
        raise BenchError(f"bad nnz per row {parts[1]!r} in dataset {spec!r}") from None
    if not 0 < k < float("inf"):
        raise BenchError(f"nnz per row must be positive and finite in dataset {spec!r}")
    profile = parts[2] if len(parts) > 2 else "uniform"
    if profile not in ("uniform", "constant", "powerlaw"):
        raise BenchError(f"unknown nnz profile {profile!r} in dataset {spec!r} (uniform|constant|powerlaw)")
    return DataSpec(spec, kind, n, d, nnz_per_row=k, profile=profile)


def _synthetic_kw(algo: AlgoSpec, n_classes: int) -> dict:
    """The synthetic generators' task options: the class count, a weaker signal for count targets."""
    kw = {"n_classes": int(n_classes)} if algo.task == "multiclass" else {}
    if algo.task in ("counts", "positive"):
        kw["signal"] = 0.5
    return kw


def make_data(spec: DataSpec, algo: AlgoSpec, *, device: str = "cpu", dtype: str = "float32",
              seed: int = 0, n_classes: int = 5):
    """Build or load the data of ``spec`` for ``algo``.

    Parameters
    ----------
    spec : DataSpec
    algo : AlgoSpec
        Synthetic data is drawn for its task; real data must match ``algo.accepts``.
    device : {"cpu", "cuda"}
        Where synthetic data is built (CUDA: on the GPU).
    dtype : str
        Storage dtype of X.
    seed : int
    n_classes : int
        Classes of the synthetic data of multiclass algorithms (the multinomial model's m).

    Returns
    -------
    datasets.Dataset or str
        The data, or a one-line reason why ``algo`` does not apply to it.
    """
    import datasets

    if int(n_classes) < 3:
        raise BenchError(f"n_classes must be >= 3 (multiclass data), got {n_classes}")

    torch_out = device != "cpu"
    if spec.kind == "gmm" and algo.task != "clustering":
        return f"{spec.text} is mixture data (for gmm only)"
    if spec.kind == "csr" and algo.task == "clustering":
        return "gmm runs on dense data only"
    if spec.kind == "bundled":
        ds = datasets.load(spec.path, standardize=True, dtype=dtype)
    elif spec.kind == "svmlight":
        ds = datasets.load_svmlight(spec.path, dtype=np.float64 if dtype == "float64" else np.float32)
    elif spec.kind == "npy":
        ds = datasets.load_npy(spec.path)
        ds.X = np.asarray(ds.X, dtype=dtype)
    elif spec.kind == "npz":
        ds = datasets.load_npz_shards(spec.path)
        ds.X = ds.X.astype(dtype)
    elif spec.kind == "gmm" or algo.task == "clustering":
        k = spec.k or 8
        ds = datasets.make_gmm(spec.n, spec.d, k, separation=4.0, covariance_type="diag", seed=seed,
                               dtype=dtype, device=device, return_torch=torch_out)
        if spec.kind != "gmm":
            ds.name = spec.text
    elif spec.kind == "dense":
        ds = datasets.make_dense(spec.n, spec.d, algo.task, seed=seed, dtype=dtype, device=device,
                                 return_torch=torch_out, **_synthetic_kw(algo, n_classes))
    else:
        kw = _synthetic_kw(algo, n_classes)
        ds = datasets.make_csr(spec.n, spec.d, spec.nnz_per_row, spec.profile, algo.task, seed=seed,
                               dtype=dtype, device=device, return_torch=torch_out, **kw)
    if spec.kind in ("bundled", "svmlight", "npy", "npz"):
        if ds.y is None and algo.task != "clustering":
            return f"{spec.text} has no targets"
        if ds.task not in algo.accepts:
            return f"{algo.key} needs a {'/'.join(algo.accepts)} data set, {spec.text} is {ds.task}"
        if device != "cpu":
            ds = _to_torch(ds, device)
    return ds


def _to_torch(ds, device):
    import scipy.sparse as sp
    import torch

    from ._validation import as_csr

    X = as_csr(sp.csr_matrix(ds.X)).to(device) if sp.issparse(ds.X) else torch.from_numpy(np.ascontiguousarray(ds.X)).to(device)
    y = None if ds.y is None else torch.from_numpy(np.ascontiguousarray(ds.y)).to(device)
    ds.X, ds.y = X, y
    return ds


def host_copy(ds):
    """``(X, y)`` on the host: numpy / ``scipy.sparse.csr_matrix`` (views when already there).

    Parameters
    ----------
    ds : datasets.Dataset

    Returns
    -------
    tuple
        ``X`` [N, D] and ``y`` [N] (or None).
    """
    import torch

    X, y = ds.X, ds.y
    if type(X).__name__ == "CSRMatrix":
        X = X.to_scipy()  # float32 values stay float32 (half precision becomes float32)
    elif isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    return X, y


# ------------------------------------------------------------------------------------------
# objectives
# ------------------------------------------------------------------------------------------
def _np(a):
    if a is None:
        return None
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def _linpred(X, W, b, block=1 << 16):
    """``X @ W + b`` in float64, dense input in row blocks (bounded extra memory). W: [D] or [D, K]."""
    import scipy.sparse as sp

    if sp.issparse(X):
        return np.asarray(X @ W) + b
    out = np.empty((X.shape[0],) + W.shape[1:], dtype=np.float64)
    for r in range(0, X.shape[0], block):
        out[r:r + block] = np.asarray(X[r:r + block], dtype=np.float64) @ W
    return out + b


def _logsumexp(Z):
    m = Z.max(1, keepdims=True)
    return (m + np.log(np.exp(Z - m).sum(1, keepdims=True)))[:, 0]


def objective(algo: AlgoSpec, est, X, y, params: dict, X_fit=None):
    """The float64 objective and score of a fitted model, one formula per algorithm.

    Parameters
    ----------
    algo : AlgoSpec
    est : fitted estimator (fusedml or scikit-learn)
    X, y : host arrays
        ``[N, D]`` (numpy or scipy CSR) and ``[N]``.
    params : dict
        The hyper-parameters used (``C``, ``alpha``).
    X_fit : optional
        The data as given to ``fit`` (GMM scores it there: a model fitted with
        ``backend="fused"`` on the GPU scores GPU data).

    Returns
    -------
    tuple of float
        ``(objective, score)``. Linear models (N rows, w without intercept):
        logistic ``mean log(1 + exp(-s z)) + |w|^2 / (2 C N)``; multinomial
        ``mean(logsumexp(Z) - Z_y) + |W|^2 / (2 C N)``; LinearSVC ``mean max(0, 1 - s z)^2 +
        |w|^2 / (2 C N)``; Poisson/Gamma ``deviance / (2N) + alpha/2 |w|^2``; Ridge
        ``(|y - z|^2 + alpha |w|^2) / (2N)``. Scores: accuracy, D^2, R^2. GMM: the estimator's
        mean log-likelihood (both).
    """
    if algo.key == "gmm":
        ll = float(est.score(X if X_fit is None else X_fit))
        return ll, ll
    N = X.shape[0]
    coef = _np(est.coef_)
    icpt = _np(getattr(est, "intercept_", 0.0))
    y = np.asarray(y)
    if algo.key == "logistic-multinomial":
        W = coef.T  # [D, K]
        Z = _linpred(X, W, icpt)
        classes = _np(est.classes_)
        yi = np.searchsorted(classes, y.astype(np.float64))
        obj = float(np.mean(_logsumexp(Z) - Z[np.arange(N), yi]) + (W**2).sum() / (2 * params["C"] * N))
        return obj, float(np.mean(Z.argmax(1) == yi))
    w = coef.reshape(-1)
    b = float(np.ravel(icpt)[0]) if np.size(icpt) else 0.0
    z = _linpred(X, w, b)
    if algo.key in ("logistic", "linearsvc"):
        classes = _np(est.classes_)
        s = np.where(y.astype(np.float64) == classes[1], 1.0, -1.0)
        pen = (w**2).sum() / (2 * params["C"] * N)
        if algo.key == "logistic":
            loss = np.mean(np.logaddexp(0.0, -s * z))
        else:
            loss = np.mean(np.maximum(0.0, 1.0 - s * z) ** 2)
        return float(loss + pen), float(np.mean(np.sign(z + 1e-300) == s))
    yf = y.astype(np.float64)
    if algo.key == "ridge":
        r = yf - z
        obj = ((r**2).sum() + params["alpha"] * (w**2).sum()) / (2 * N)
        return float(obj), float(1 - (r**2).sum() / max(((yf - yf.mean()) ** 2).sum(), 1e-300))
    mu = np.exp(np.clip(z, -700, 700))
    m0 = yf.mean()

    def dev(m):
        if algo.key == "poisson":
            with np.errstate(divide="ignore", invalid="ignore"):
                t = np.where(yf > 0, yf * np.log(yf / m), 0.0)
            return 2 * np.sum(t - yf + m)
        return 2 * np.sum(np.log(m / yf) + yf / m - 1)

    d = dev(mu)
    obj = d / (2 * N) + params["alpha"] / 2 * (w**2).sum()
    return float(obj), float(1 - d / max(dev(np.full_like(yf, m0)), 1e-300))


# ------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------
def _estimator_class(algo: AlgoSpec, backend: str):
    """The class for ``backend``, or a string saying why it is not available."""
    if backend == "sklearn":
        mod, _, cls = algo.sklearn.partition(":")
        try:
            return getattr(importlib.import_module(mod), cls)
        except ImportError:
            return "scikit-learn is not installed"
    try:
        algorithms = importlib.import_module("algorithms")
    except ImportError as e:  # pragma: no cover - part of this repository
        return f"algorithms package not importable ({e})"
    cls = getattr(algorithms, algo.estimator, None)
    for sub in ("logistic", "svm", "glm", "linear", "mixture"):
        if cls is not None:
            break
        try:  # the package may not re-export everything yet
            cls = getattr(importlib.import_module(f"algorithms.{sub}"), algo.estimator, None)
        except ImportError:
            continue
    if cls is None:
        return f"algorithms.{algo.estimator} is not available"
    return cls


def _make_estimator(cls, backend, params):
    sig = inspect.signature(cls.__init__).parameters
    kw = {k: v for k, v in params.items() if k in sig}
    if backend != "sklearn":
        kw["backend"] = backend
    if backend == "sklearn" and "dual" in sig and cls.__name__ == "LinearSVC":
        kw["dual"] = "auto"
    return cls(**kw)


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _sync():
    if _cuda_in_use():
        import torch

        torch.cuda.synchronize()


def _timed_fit(est, X, y):
    if _cuda_in_use():
        # a full collection left to strike inside a ~5 ms GPU fit costs milliseconds (timeit's
        # reason); on the CPU (the demo) the fits are long and a collection (~0.1 s) is not
        gc.collect()
    _sync()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings: iterations are reported instead
        if y is None:
            est.fit(X)
        else:
            est.fit(X, y)
    _sync()
    return time.perf_counter() - t0


def _n_iter(est):
    it = getattr(est, "n_iter_", None)
    if it is None:
        return None
    try:
        return int(np.max(np.asarray(it)))
    except (TypeError, ValueError):
        return None


def _history(est, max_points=2000):
    h = getattr(est, "history_", None)
    if not h:
        return None
    pts = [(float(r.get("time", math.nan)), float(r.get("objective", math.nan))) for r in h]
    if len(pts) > max_points:
        step = math.ceil(len(pts) / max_points)
        pts = pts[::step] + [pts[-1]]
    return pts


def device_name(device: str) -> str:
    """Human-readable name of the device the fusedml backends run on.

    Parameters
    ----------
    device : {"cpu", "cuda"}

    Returns
    -------
    str
        The GPU's name, or the CPU's architecture and core count.
    """
    if device != "cpu":
        import torch

        return torch.cuda.get_device_name()
    return f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def versions() -> dict:
    """Versions of the libraries that matter for the timings.

    Returns
    -------
    dict
        ``{library: version or None}`` for python, fusedml, torch, triton, numpy, scipy,
        scikit-learn, dask, and the CUDA runtime torch was built with.
    """
    out = {"python": platform.python_version()}
    for mod in ("fusedml", "torch", "triton", "numpy", "scipy", "sklearn", "dask"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001 - missing or broken optional library
            out[mod] = None
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover
        pass
    return out


def _progress(stream, t0, msg):
    if stream is not None:
        print(f"[fusedml {time.perf_counter() - t0:7.1f}s] {msg}", file=stream, flush=True)


def _subsample(X, y, n_sub, seed=0):
    idx = np.sort(np.random.default_rng(seed).choice(X.shape[0], n_sub, replace=False))
    return X[idx], (None if y is None else y[idx])


def _gmm_components(ds, spec):
    if spec.kind == "gmm" and spec.k:
        return spec.k
    if ds.y is not None:
        y = ds.y
        if hasattr(y, "detach"):
            y = y.detach().cpu().numpy()
        return max(1, int(np.unique(np.asarray(y)).size))
    return 8


def run_grid(algorithms, datasets_, backends, *, repeat=1, device="cpu", dtype="float32",
             max_iter=None, tol=None, n_samples=None, seed=0, sklearn_budget=60.0,
             progress=sys.stderr, pairs=None, n_classes=5):
    """Fit every (dataset, algorithm, backend) and return one row per fit configuration.

    Parameters
    ----------
    algorithms : list of str
        Keys of :data:`ALGORITHMS`.
    datasets_ : list of str
        Dataset specs (see :func:`parse_dataset`).
    backends : list of str
        Among "fused", "ops", "cpu", "sklearn".
    repeat : int
        Timed fits per configuration (the median is reported; scikit-learn fits longer than
        10 s run once).
    device : {"cpu", "cuda"}
        Where the fusedml backends' data lives.
    dtype : str
        Storage dtype of X for every backend.
    max_iter, tol : optional
        Override every algorithm's iteration limit / tolerance (same for all backends).
    n_samples : list of int, optional
        Row counts replacing N of every synthetic spec (a sweep).
    seed : int
        Seed of synthetic data and subsamples.
    sklearn_budget : float or None
        Seconds above which a scikit-learn fit is replaced by a subsample fit scaled by rows
        (None: always the full fit).
    progress : file or None
        Where progress lines go (stderr by default).
    pairs : list of (dataset, algorithm), optional
        Only these combinations (the demo's selection); otherwise the full product.
    n_classes : int
        Classes of the synthetic multiclass data (default 5; see :func:`make_data`).

    Returns
    -------
    list of dict
        Rows with dataset, shape, nnz, algorithm, backend, times, iterations, objective, score,
        time to the common objective, speedups (see :func:`annotate`) or ``error``/``skipped``.
    """
    for a in algorithms:
        if a not in ALGORITHMS:
            raise BenchError(f"unknown algorithm {a!r}; choose from {', '.join(ALGORITHMS)}")
    for b in backends:
        if b not in BACKENDS:
            raise BenchError(f"unknown backend {b!r}; choose from {', '.join(BACKENDS)}")
    if device not in ("cpu", "cuda"):
        raise BenchError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BenchError("--device cuda requested but no CUDA GPU is available")
    if repeat < 1:
        raise BenchError(f"repeat must be >= 1, got {repeat}")
    specs = [parse_dataset(s) for s in datasets_]
    if n_samples:
        specs = [s.with_n(n) if s.kind in ("dense", "csr", "gmm") else s
                 for s in specs for n in (n_samples if s.kind in ("dense", "csr", "gmm") else [0])]
    dev_name = device_name(device)
    vers = versions()
    t0 = time.perf_counter()
    rows = []
    todo = [(s, a) for s in specs for a in algorithms if pairs is None or (s.text, a) in pairs]
    for i, (spec, akey) in enumerate(todo):
        algo = ALGORITHMS[akey]
        _progress(progress, t0, f"[{i + 1}/{len(todo)}] {akey} on {spec.text}: preparing data")
        ds = make_data(spec, algo, device=device, dtype=dtype, seed=seed, n_classes=n_classes)
        base = {"dataset": spec.text, "algorithm": akey, "device": device, "device_name": dev_name,
                "versions": vers, "dtype": dtype}
        if algo.task == "multiclass" and spec.kind in ("dense", "csr"):
            base["n_classes"] = int(n_classes)
        if isinstance(ds, str):
            rows.append({**base, "backend": None, "skipped": ds})
            _progress(progress, t0, f"    skipped: {ds}")
            continue
        Xh, yh = host_copy(ds)
        base.update(shape=list(ds.shape), nnz=int(Xh.nnz) if hasattr(Xh, "nnz") else int(np.prod(ds.shape)),
                    sparse=bool(ds.is_sparse))
        params = dict(algo.params)
        if max_iter is not None:
            params["max_iter"] = int(max_iter)
        if tol is not None:
            params["tol"] = float(tol)
        if akey == "gmm":
            params["n_components"] = _gmm_components(ds, spec)
        y_fit = None if akey == "gmm" else ds.y
        y_host = None if akey == "gmm" else yh
        for backend in backends:
            row = {**base, "backend": backend, "params": params,
                   "objective_name": algo.objective_name, "score_name": algo.score_name}
            cls = _estimator_class(algo, backend)
            if isinstance(cls, str):
                rows.append({**row, "skipped": cls})
                _progress(progress, t0, f"    {backend}: skipped ({cls})")
                continue
            try:
                if backend == "sklearn":
                    row.update(_run_sklearn(cls, algo, params, Xh, y_host, repeat, sklearn_budget, seed,
                                            progress, t0))
                else:
                    X_fit = ds.X if device != "cpu" else Xh
                    yf = y_fit if device != "cpu" else y_host
                    row.update(_run_fusedml(cls, algo, backend, params, X_fit, yf, Xh, y_host, repeat,
                                            device, progress, t0))
            except Exception as e:  # noqa: BLE001 - one failing fit must not end the grid
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                row["error"] = msg
                _progress(progress, t0, f"    {backend}: error {msg}")
            rows.append(row)
        del ds, Xh, yh
    annotate(rows)
    return rows


def _run_fusedml(cls, algo, backend, params, X, y, Xh, yh, repeat, device, progress, t0):
    from ._dispatch import interpret_mode

    if not (backend == "fused" and interpret_mode()):  # first-call costs out of the timed fits (any device)
        warm = dict(params)
        warm["max_iter"] = min(2, params.get("max_iter", 2))
        _timed_fit(_make_estimator(cls, backend, warm), X, y)
    times, est = [], None
    for r in range(repeat):
        est = _make_estimator(cls, backend, params)
        times.append(_timed_fit(est, X, y))
        _progress(progress, t0, f"    {backend}: fit {r + 1}/{repeat} {times[-1]:.3f} s, {_n_iter(est)} iterations")
    obj, score = objective(algo, est, Xh, yh, params, X_fit=X)
    return {"times": times, "time": float(np.median(times)), "iterations": _n_iter(est),
            "objective": obj, "score": score, "history": _history(est)}


def _run_sklearn(cls, algo, params, Xh, yh, repeat, budget, seed, progress, t0):
    N = Xh.shape[0]
    out = {"sklearn_rows": N, "time_scaled": False}
    if budget is not None and N > 100_000:
        n_sub = max(20_000, N // 20)
        Xs, ys = _subsample(Xh, yh, n_sub, seed)
        est = _make_estimator(cls, "sklearn", params)
        t_sub = _timed_fit(est, Xs, ys)
        estimate = t_sub * N / n_sub
        _progress(progress, t0, f"    sklearn: {n_sub}-row probe {t_sub:.2f} s -> full fit ~{estimate:.0f} s")
        if estimate > budget:
            obj, score = objective(algo, est, Xh, yh, params)
            out.update(times=[estimate], time=estimate, time_scaled=True, sklearn_rows=n_sub,
                       iterations=_n_iter(est), objective=obj, score=score, history=None,
                       note=f"scikit-learn fitted on a {n_sub}-row subsample ({t_sub:.2f} s), time scaled by "
                            f"rows to N={N}; objective evaluated on all rows")
            return out
    times, est = [], None
    for r in range(repeat):
        est = _make_estimator(cls, "sklearn", params)
        times.append(_timed_fit(est, Xh, yh))
        _progress(progress, t0, f"    sklearn: fit {r + 1}/{repeat} {times[-1]:.3f} s")
        if times[-1] > 10.0:
            break
    obj, score = objective(algo, est, Xh, yh, params)
    out.update(times=times, time=float(np.median(times)), iterations=_n_iter(est), objective=obj,
               score=score, history=None)
    return out


def _time_to(hist, target, sense):
    """First history time whose objective reaches ``target`` (None if never)."""
    if not hist:
        return None
    slack = 1e-9 * max(abs(target), 1.0)
    for t, o in hist:
        if (o <= target + slack) if sense == "min" else (o >= target - slack):
            return t
    return None


def annotate(rows):
    """Add ``target_objective``, ``time_to_target`` and speedups (``vs_ops``, ``vs_sklearn``) in place.

    Within each (dataset, algorithm) group: the target is the worst final ``history_`` objective
    among the fusedml backends (so every one of them reaches it); ``time_to_target`` is read from
    each history. Speedups divide the "ops" / "sklearn" median time by the row's median time.

    Parameters
    ----------
    rows : list of dict
        As returned by :func:`run_grid`.
    """
    groups = {}
    for r in rows:
        if r.get("backend") and "time" in r:
            groups.setdefault((r["dataset"], r["algorithm"]), []).append(r)
    for (ds, akey), grp in groups.items():
        sense = ALGORITHMS[akey].sense if akey in ALGORITHMS else "min"
        finals = [r["history"][-1][1] for r in grp if r.get("history")]
        finals = [f for f in finals if f == f]
        if finals:
            target = max(finals) if sense == "min" else min(finals)
            for r in grp:
                if r.get("history"):
                    r["target_objective"] = target
                    r["time_to_target"] = _time_to(r["history"], target, sense)
        ref = {r["backend"]: r["time"] for r in grp}
        for r in grp:
            for b in ("ops", "sklearn"):
                if b in ref and r["time"] > 0:
                    r[f"vs_{b}"] = ref[b] / r["time"]


# ------------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------------
def _fmt(v, spec):
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return format(v, spec)


def markdown_table(rows) -> str:
    """Markdown table: dataset, algorithm, backend, time, iterations, objective, score, speedups.

    Parameters
    ----------
    rows : list of dict

    Returns
    -------
    str
    """
    head = ("| dataset | algorithm | backend | time / fit (s) | iters | time to common obj. (s) | "
            "objective | score | vs ops | vs sklearn |")
    lines = [head, "|" + "---|" * 10]
    notes = []
    for r in rows:
        if r.get("skipped") or r.get("error"):
            why = r.get("skipped") or "error: " + r["error"]
            lines.append(f"| {r['dataset']} | {r['algorithm']} | {r.get('backend') or '-'} | {why} |"
                         " | | | | | |")
            continue
        t = _fmt(r["time"], ".4g") + ("*" if r.get("time_scaled") else "")
        if r.get("time_scaled"):
            notes.append(f"* {r['dataset']} / {r['algorithm']}: {r['note']}")
        lines.append(
            f"| {r['dataset']} | {r['algorithm']} | {r['backend']} | {t} | {_fmt(r.get('iterations'), 'd')} | "
            f"{_fmt(r.get('time_to_target'), '.4g')} | {_fmt(r.get('objective'), '.8g')} | "
            f"{r.get('score_name', '')} {_fmt(r.get('score'), '.4f')} | {_fmt(r.get('vs_ops'), '.2f')} | "
            f"{_fmt(r.get('vs_sklearn'), '.2f')} |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def summary_table(rows) -> str:
    """One line per (dataset, algorithm): the fusedml backends' times against "ops" and scikit-learn.

    Parameters
    ----------
    rows : list of dict

    Returns
    -------
    str
        Markdown: fit time of each backend, the first fusedml backend's ("fused", else "cpu")
        speedup over "ops" per fit and to the common objective, and over scikit-learn.
    """
    groups = {}
    for r in rows:
        if "time" in r:
            groups.setdefault((r["dataset"], r["algorithm"]), {})[r["backend"]] = r
    lines = ["| dataset | algorithm | fused/cpu (s) | ops (s) | sklearn (s) | speedup vs ops | "
             "speedup vs ops, to common objective | speedup vs sklearn |", "|" + "---|" * 8]
    for (ds, akey), by in groups.items():
        main = by.get("fused") or by.get("cpu")
        ops, sk = by.get("ops"), by.get("sklearn")
        tt = None
        if main and ops and main.get("time_to_target") and ops.get("time_to_target"):
            tt = ops["time_to_target"] / main["time_to_target"]
        sk_t = None if sk is None else _fmt(sk["time"], ".4g") + ("*" if sk.get("time_scaled") else "")
        lines.append(
            f"| {ds} | {akey} | {_fmt(main and main['time'], '.4g')} | {_fmt(ops and ops['time'], '.4g')} | "
            f"{sk_t or '-'} | {_fmt(main and main.get('vs_ops'), '.2f')} | {_fmt(tt, '.2f')} | "
            f"{_fmt(main and main.get('vs_sklearn'), '.1f')} |")
    return "\n".join(lines) + "\n"


def plot(rows, out_dir):
    """Write ``time_per_fit.png`` and ``objective_vs_time.png`` (matplotlib, Agg).

    Parameters
    ----------
    rows : list of dict
    out_dir : str

    Returns
    -------
    list of str
        Paths written (empty when matplotlib is missing or there is nothing to plot).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    done = [r for r in rows if "time" in r]
    if not done:
        return []
    paths = []
    groups = list(dict.fromkeys((r["dataset"], r["algorithm"]) for r in done))
    backs = list(dict.fromkeys(r["backend"] for r in done))
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(groups) * max(1, len(backs)) / 2 + 1))
    h = 0.8 / len(backs)
    for j, b in enumerate(backs):
        ys, ws = [], []
        for i, g in enumerate(groups):
            for r in done:
                if (r["dataset"], r["algorithm"]) == g and r["backend"] == b:
                    ys.append(i + j * h)
                    ws.append(r["time"])
        ax.barh(ys, ws, height=h, label=b)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(groups))])
    ax.set_yticklabels([f"{d}\n{a}" for d, a in groups], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("seconds per fit (log)")
    ax.invert_yaxis()
    ax.legend()
    ax.set_title("time per fit by backend")
    fig.tight_layout()
    p = os.path.join(out_dir, "time_per_fit.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    hist_groups = [g for g in groups if any(r.get("history") for r in done if (r["dataset"], r["algorithm"]) == g)]
    if hist_groups:
        n = len(hist_groups)
        cols = min(3, n)
        nr = math.ceil(n / cols)
        fig, axes = plt.subplots(nr, cols, figsize=(4.2 * cols, 3.2 * nr), squeeze=False)
        for ax, g in zip(axes.ravel(), hist_groups):
            grp = [r for r in done if (r["dataset"], r["algorithm"]) == g and r.get("history")]
            sense = ALGORITHMS[g[1]].sense if g[1] in ALGORITHMS else "min"
            allv = [o for r in grp for _, o in r["history"] if o == o]
            best = (min(allv) if sense == "min" else max(allv)) if allv else 0.0
            for r in grp:
                t = np.array([p[0] for p in r["history"]])
                o = np.array([p[1] for p in r["history"]])
                gap = (o - best) if sense == "min" else (best - o)
                gap = np.maximum(gap / max(abs(best), 1e-300), 1e-16)
                ax.semilogy(t, gap, marker=".", label=r["backend"])
            ax.set_title(f"{g[0]}\n{g[1]}", fontsize=8)
            ax.set_xlabel("time in fit (s)")
            ax.set_ylabel("relative gap to best objective")
            ax.legend(fontsize=7)
        for ax in axes.ravel()[n:]:
            ax.axis("off")
        fig.tight_layout()
        p = os.path.join(out_dir, "objective_vs_time.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def write_results(rows, out_dir, *, command=None, plots=True):
    """Write ``results.json`` (rows + metadata), ``results.md`` and the PNG plots to ``out_dir``.

    Parameters
    ----------
    rows : list of dict
    out_dir : str
        Created if needed.
    command : str, optional
        The command line (default ``sys.argv``).
    plots : bool
        Also write the PNG plots.

    Returns
    -------
    list of str
        The files written.
    """
    os.makedirs(out_dir, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command if command is not None else " ".join(sys.argv),
            "host": platform.node(), "versions": versions()}
    pj = os.path.join(out_dir, "results.json")
    with open(pj, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=_json_default)
    pm = os.path.join(out_dir, "results.md")
    with open(pm, "w") as f:
        f.write(f"<!-- {meta['date']} {meta['command']} -->\n\n")
        f.write(markdown_table(rows))
    paths = [pj, pm]
    if plots:
        paths += plot(rows, out_dir)
    return paths


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
