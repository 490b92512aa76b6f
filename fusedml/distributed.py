"""Many GPUs / machines through ``dask.distributed``: distribute at the loss level.

The N-vectors of a solver (margins, probabilities, Hessian weights) never travel. The row
partitions of ``X`` (with their labels and sample weights) are persisted on the workers, one
worker per GPU; every solver step sends only the parameters (``D`` floats, or ``K x D`` means
and ``K x D x D`` precisions) to the workers, each worker runs the fused kernels on its
partitions and keeps the partition's Hessian weights between calls (keyed by an iteration
token), and the partial results (loss, gradient, Hessian-vector products: ``O(D)``; GMM
statistics: ``O(K D^2)``) are summed by a tree reduction (``split_every`` inputs per node).

Pieces:

* :func:`local_gpu_cluster` -- a local cluster with one worker process per GPU (dask-cuda's
  ``LocalCUDACluster`` when installed, else Nanny workers with their own
  ``CUDA_VISIBLE_DEVICES``), or CPU worker processes on a host without GPUs.
* :class:`DistributedDesign` -- the per-iteration calls ``loss_grad(w)``, ``hessp(w, s)``,
  ``gmm_estep(...)``.
* :func:`fit_distributed` -- fits a ``LogisticRegression`` (binary or multinomial, L2, the
  scikit-learn objective ``C sum_i s_i loss_i + 1/2 ||w||^2``, intercept unpenalised) or a
  ``GaussianMixture`` with the estimator's own parameters, and sets the estimator's fitted
  attributes, so ``predict`` etc. work unchanged on in-memory data afterwards. The estimators
  themselves need no change.

Fault tolerance: partitions are persisted from their Dask graph, so a lost worker's partitions
are recomputed by the scheduler on the surviving (or restarted) workers; the per-worker caches
(device copies, Hessian weights) are rebuilt on a miss, and every cached quantity can be
recomputed from the parameters sent with the call, so a fit that loses a worker reaches the same
result.
"""
from __future__ import annotations

import math
import sys
import time
import uuid
import warnings

import numpy as np
import torch

from ._validation import warn_user

__all__ = ["DistributedDesign", "fit_distributed", "local_gpu_cluster"]

# Worker-side cache: (design id, partition index) -> dict(X, y, sw, h_token, h, ...).
_CACHE: dict = {}


def local_gpu_cluster(n_workers=None, *, threads_per_worker=1, **kwargs):
    """A local Dask cluster with one worker process per GPU (CPU processes without GPUs).

    Parameters
    ----------
    n_workers : int, optional
        Number of workers; default the number of visible GPUs (2 on a host without GPUs).
    threads_per_worker : int
        Threads per worker process.
    **kwargs
        Passed to the cluster class (e.g. ``memory_limit``).

    Returns
    -------
    distributed.deploy.Cluster
        ``dask_cuda.LocalCUDACluster`` when dask-cuda is installed and GPUs exist; otherwise a
        ``SpecCluster`` of Nanny workers, worker ``i`` seeing only GPU ``i`` through
        ``CUDA_VISIBLE_DEVICES``; on a host without GPUs a ``LocalCluster`` of CPU processes.
    """
    from distributed import LocalCluster, Nanny, Scheduler, SpecCluster

    n_gpus = torch.cuda.device_count()
    kwargs.setdefault("dashboard_address", None)
    if n_gpus == 0:
        return LocalCluster(n_workers=n_workers or 2, threads_per_worker=threads_per_worker,
                            processes=True, **kwargs)
    n = n_workers or n_gpus
    if n > n_gpus:
        raise ValueError(f"n_workers={n} but only {n_gpus} GPU(s) are visible")
    try:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(n_workers=n, threads_per_worker=threads_per_worker, **kwargs)
    except ImportError:
        pass
    visible = _visible_gpus(n_gpus)
    dash = kwargs.pop("dashboard_address")
    workers = {
        f"gpu-{i}": {"cls": Nanny, "options": {"nthreads": threads_per_worker,
                                                "env": {"CUDA_VISIBLE_DEVICES": visible[i]}, **kwargs}}
        for i in range(n)
    }
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": dash}})


def _visible_gpus(n):
    import os

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in env.split(",") if s.strip()] if env else [str(i) for i in range(n)]
    return ids[:n]


def _worker_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


# ----------------------------------------------------------------------------- worker side
def _make_part(x, y, sw):
    """One partition as a tuple (built on a worker from the chunks' graph; recomputable)."""
    return (x, y, sw)


def _get_part(part, key, design_id, backend, pad=True):
    """The partition's device copy, cached on the worker; rebuilt after a worker restart. ``pad``:
    dense rows padded to whole 16-byte vectors where :func:`fusedml.mmchain.dense.pads_rows` says
    so (the linear passes gain; the GMM E-step's register form loses, and EM reads X as it is)."""
    from ._dispatch import resolve_backend
    from ._validation import as_matrix, check_finite, to_tensor
    from .mmchain.dense import aligned_rows, pads_rows

    ck = (design_id, key, pad)
    P = _CACHE.get(ck)
    if P is None:
        x, y, sw = part
        dev = _worker_device()
        X = as_matrix(x, "X partition")
        check_finite(X if isinstance(X, torch.Tensor) else X.val, f"X (partition {key})")
        X = X.to(dev) if not isinstance(X, torch.Tensor) else X.to(dev)
        if pad and isinstance(X, torch.Tensor) and X.layout == torch.strided and X.ndim == 2 \
                and pads_rows(dev, X.shape[1] * X.element_size()) and resolve_backend(backend, dev) == "fused":
            X = aligned_rows(X)  # read every iteration: rows in whole 16-byte vectors (one device pass)
        acc = torch.float64 if X.dtype == torch.float64 else torch.float32
        P = {"X": X, "dev": dev, "acc": acc, "backend": backend,
             "y": None if y is None else np.asarray(y),  # labels stay numpy (may be strings)
             "sw": None if sw is None else _checked_weights(to_tensor(sw, "sample_weight", dtype=acc, device=dev), key),
             "h_token": None}
        _CACHE[ck] = P
    return P


def _checked_weights(sw: torch.Tensor, key) -> torch.Tensor:
    from ._validation import check_finite

    check_finite(sw, f"sample_weight (partition {key})")
    if bool((sw < 0).any()):
        raise ValueError(f"sample_weight must be non-negative (partition {key})")
    return sw


def _drop_cache(design_id):
    for k in [k for k in _CACHE if k[0] == design_id]:
        del _CACHE[k]
    return True


def _logistic_state(P, w, spec):
    """Margins -> per-row loss, residual and Hessian weights for the partition (on its device)."""
    from fusedml.mmchain import matvec
    from fusedml.mmchain.lossgrad import logistic_value

    X, acc, sw = P["X"], P["acc"], P["sw"]
    wt = torch.as_tensor(w).to(device=P["dev"], dtype=acc)
    raw = matvec(X, wt, intercept=spec["fit_intercept"], backend=P["backend"])
    if spec["loss"] == "binomial":
        if "yb" not in P:
            P["yb"] = torch.from_numpy(P["y"] == spec["classes"][1]).to(device=P["dev"], dtype=acc)
        yb = P["yb"]
        loss = logistic_value(raw, yb)
        p = torch.sigmoid(raw)
        resid = p - yb
        h = p * (1 - p)
    else:
        if "yi" not in P:
            P["yi"] = torch.from_numpy(np.searchsorted(spec["classes"], P["y"]).astype(np.int64)).to(P["dev"])
        yi = P["yi"]
        lse = torch.logsumexp(raw, dim=1)
        loss = lse - raw.gather(1, yi[:, None])[:, 0]
        p = torch.softmax(raw, dim=1)
        resid = p.clone()
        resid[torch.arange(p.shape[0], device=p.device), yi] -= 1
        h = p
    if sw is not None:
        loss = loss * sw
        resid = resid * (sw[:, None] if resid.ndim == 2 else sw)
    return loss.sum(), resid, h


def _part_loss_grad(part, key, design_id, spec, w, token):
    from fusedml.mmchain import mmchain

    P = _get_part(part, key, design_id, spec["backend"])
    loss, resid, h = _logistic_state(P, w, spec)
    grad = mmchain(P["X"], None, resid, intercept=spec["fit_intercept"], backend=P["backend"])
    P["h_token"], P["h"] = token, h
    return (np.array(float(loss)), grad.double().cpu().numpy())


def _part_hessp(part, key, design_id, spec, w, token, s):
    from fusedml.mmchain import matvec, mmchain

    P = _get_part(part, key, design_id, spec["backend"])
    if P["h_token"] != token:  # cache lost (worker restarted) or stale: rebuild from w
        _, _, h = _logistic_state(P, w, spec)
        P["h_token"], P["h"] = token, h
    h, sw, acc = P["h"], P["sw"], P["acc"]
    st = torch.as_tensor(s).to(device=P["dev"], dtype=acc)
    fi, be = spec["fit_intercept"], P["backend"]
    if spec["loss"] == "binomial":
        v = h if sw is None else h * sw
        out = mmchain(P["X"], st, v, intercept=fi, backend=be)  # X^T (s p(1-p) ⊙ X s): one fused pass
    elif sw is None:
        out = mmchain(P["X"], st, h, intercept=fi, v_op="softmax", backend=be)
    else:
        # Weighted multinomial: p_nj = s_n P_nj (t_nj - sum_l P_nl t_nl) is not the fused softmax op.
        t = matvec(P["X"], st, intercept=fi, backend=be)
        p = h * (t - (h * t).sum(1, keepdim=True)) * sw[:, None]
        out = mmchain(P["X"], None, p, intercept=fi, backend=be)
    return out.double().cpu().numpy()


def _part_gmm_estep(part, key, design_id, backend, weights, means, prec_chol, cov_type, center):
    from fusedml.gmm import gmm_estep

    P = _get_part(part, key, design_id, backend, pad=False)
    st = gmm_estep(P["X"], weights, means, prec_chol, cov_type, sample_weight=P["sw"], center=center,
                   backend=backend, check_finite=False)
    return {"log_likelihood": st.log_likelihood.double().cpu().numpy(), "nk": st.nk.double().cpu().numpy(),
            "s1": st.s1.double().cpu().numpy(), "s2": st.s2.double().cpu().numpy()}


def _part_rows(part, key, design_id, backend, idx):
    x = part[0]
    rows = x[np.asarray(idx)]
    return rows.toarray() if hasattr(rows, "toarray") else np.asarray(rows)


def _sum_results(*parts):
    """Node of the tree reduction: elementwise sum of tuples / dicts / arrays of partials."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: sum(p[k] for p in parts[1:]) + first[k] for k in first}
    if isinstance(first, tuple):
        return tuple(sum(p[i] for p in parts[1:]) + first[i] for i in range(len(first)))
    out = first.copy()
    for p in parts[1:]:
        out += p
    return out


# ----------------------------------------------------------------------------- client side
class DistributedDesign:
    """Row partitions of (X, y, sample_weight) persisted on a Dask cluster, with loss-level calls.

    Parameters
    ----------
    X : dask.array.Array
        ``[N, D]`` dense (numpy) or scipy CSR chunks, chunked by rows (column chunks are merged).
    y : dask.array.Array or array-like, optional
        ``[N]`` labels / targets; rechunked to X's row chunks.
    sample_weight : dask.array.Array or array-like, optional
        ``[N]`` non-negative weights.
    client : distributed.Client, optional
        Default: the current client (``distributed.get_client()``).
    split_every : int
        Fan-in of the tree reduction.
    backend : str
        fusedml backend on the workers (``"auto"``: fused on GPU workers, cpu otherwise).

    Attributes
    ----------
    shape : tuple of int
    n_partitions : int
    is_sparse : bool
    """

    def __init__(self, X, y=None, sample_weight=None, *, client=None, split_every=8, backend="auto"):
        import dask
        import dask.array as da
        from distributed import get_client

        from .streaming import _is_sparse_meta, is_dask_array

        if not is_dask_array(X):
            raise TypeError(f"X must be a dask array, got {type(X).__name__}")
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D [N, D], got shape {X.shape}")
        if np.dtype(X.dtype).kind != "f":
            raise TypeError(f"X must hold floating point values, got dtype {X.dtype}")
        if any(math.isnan(c) for c in X.chunks[0]):
            X = X.compute_chunk_sizes()
        if len(X.chunks[1]) > 1:
            X = X.rechunk({1: -1})
        n, d = (int(s) for s in X.shape)
        if n == 0 or d == 0:
            raise ValueError(f"X is empty: shape {(n, d)}")
        if int(split_every) < 2:
            raise ValueError(f"split_every must be >= 2, got {split_every}")
        self.client = client if client is not None else get_client()
        self.shape = (n, d)
        self.is_sparse = _is_sparse_meta(X._meta)
        self.split_every = int(split_every)
        self.backend = backend
        self.id = uuid.uuid4().hex
        rows = X.chunks[0]

        def known(a):  # y / sample_weight after a boolean mask: their chunk sizes computed (a 1-D pass)
            if is_dask_array(a) and a.ndim == 1 and any(math.isnan(c) for c in a.chunks[0]):
                return a.compute_chunk_sizes()
            return a

        y, sample_weight = known(y), known(sample_weight)

        def aligned(a, name):
            if a is None:
                return [None] * len(rows)
            shape = a.shape if is_dask_array(a) else np.shape(a)
            if len(shape) != 1 or shape[0] != n:
                raise ValueError(f"{name} must have shape ({n},), got {tuple(shape)}")
            a = a if is_dask_array(a) else da.from_array(np.asarray(a), chunks=(rows,))
            return list(a.rechunk((rows,)).to_delayed().ravel())

        xs = list(X.to_delayed().ravel())
        ys, ws = aligned(y, "y"), aligned(sample_weight, "sample_weight")
        self._y_dask = None if y is None else (y if is_dask_array(y) else da.from_array(np.asarray(y), chunks=(rows,)))
        keep = [i for i, r in enumerate(rows) if r > 0]  # empty chunks hold nothing to read
        self._row_chunks = [int(rows[i]) for i in keep]
        parts = [dask.delayed(_make_part)(xs[i], ys[i], ws[i]) for i in keep]
        # One future per partition, computed (and recomputable) from its graph, kept on a worker.
        self._parts = self.client.compute(parts)
        self._keys = list(range(len(parts)))
        self.n_partitions = len(parts)
        self._sw_sum = float(n) if sample_weight is None else None
        self._has_sw = sample_weight is not None
        self._sw = sample_weight
        self._token = None
        self.calls = 0

    # -- plumbing
    def _map_reduce(self, fn, *args):
        c = self.client
        futs = [c.submit(fn, p, k, self.id, *args, pure=False) for p, k in zip(self._parts, self._keys)]
        while len(futs) > 1:  # tree reduction: only partial sums travel
            futs = [c.submit(_sum_results, *futs[i:i + self.split_every], pure=False)
                    for i in range(0, len(futs), self.split_every)]
        self.calls += 1
        return futs[0].result()

    def wait(self):
        """Block until every partition is materialised on the workers.

        Returns
        -------
        DistributedDesign
            ``self``, for chaining.
        """
        from distributed import wait

        wait(self._parts)
        return self

    def sample_weight_sum(self) -> float:
        """``sum_n s_n`` (N without sample weights).

        Returns
        -------
        float
            Computed once on the cluster, then cached.
        """
        if self._sw_sum is None:
            import dask.array as da

            sw = self._sw if hasattr(self._sw, "dask") else da.from_array(np.asarray(self._sw))
            self._sw_sum = float(sw.sum().compute())
        return self._sw_sum

    def classes(self) -> np.ndarray:
        """Sorted unique labels of y.

        Returns
        -------
        numpy.ndarray
            ``[n_classes]``; ``ValueError`` if the design has no y.
        """
        import dask.array as da

        if self._y_dask is None:
            raise ValueError("this design has no y")
        return np.asarray(da.unique(self._y_dask).compute())

    # -- loss-level calls
    def loss_grad(self, w, spec):
        """Summed loss and gradient ``X^T (s ⊙ (p - y))`` over partitions; caches Hessian weights.

        Parameters
        ----------
        w : array-like
            ``[D(+1)]`` (binomial) or ``[D(+1), K]`` (multinomial) coefficients.
        spec : dict
            ``loss`` ("binomial" | "multinomial"), ``classes``, ``fit_intercept``, ``backend``.

        Returns
        -------
        loss : float
            ``sum_n s_n loss_n`` (no penalty).
        grad : numpy.ndarray
            Same shape as ``w``, float64.
        """
        w = np.ascontiguousarray(w, dtype=np.float64)
        self._token = uuid.uuid4().hex
        self._w = w
        loss, grad = self._map_reduce(_part_loss_grad, spec, w, self._token)
        return float(loss), grad

    def hessp(self, s, spec):
        """Hessian-vector product ``sum_p X_p^T (h_p ⊙ X_p s)`` at the last ``loss_grad`` point.

        Parameters
        ----------
        s : array-like
            Same shape as ``w``.
        spec : dict
            As for :meth:`loss_grad`.

        Returns
        -------
        numpy.ndarray
            float64, the shape of ``s``.
        """
        if self._token is None:
            raise RuntimeError("call loss_grad(w) before hessp(s)")
        s = np.ascontiguousarray(s, dtype=np.float64)
        return self._map_reduce(_part_hessp, spec, self._w, self._token, s)

    def gmm_estep(self, weights, means, precisions_cholesky, covariance_type):
        """GMM sufficient statistics summed over partitions (about the current means).

        Parameters
        ----------
        weights : [K]
        means : [K, D]
        precisions_cholesky : as scikit-learn's ``precisions_cholesky_``
        covariance_type : str

        Returns
        -------
        fusedml.gmm.GMMStats
            float64 CPU tensors, ``log_prob`` None.
        """
        from fusedml.gmm import GMMStats

        if self.is_sparse:
            raise TypeError("GaussianMixture needs dense data; X has sparse chunks")
        args = [np.asarray(a, dtype=np.float64) for a in (weights, means, precisions_cholesky)]
        r = self._map_reduce(_part_gmm_estep, self.backend, *args, covariance_type, args[1])
        t = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in r.items()}
        return GMMStats(covariance_type=covariance_type, log_likelihood=t["log_likelihood"].reshape(()),
                        log_prob=None, nk=t["nk"], center=torch.from_numpy(args[1]), s1=t["s1"], s2=t["s2"])

    def sample_rows(self, n, random_state=None) -> np.ndarray:
        """``min(n, N)`` rows drawn uniformly without replacement (gathered to the client, dense).

        Parameters
        ----------
        n : int
            Number of rows wanted.
        random_state : int or numpy.random.Generator, optional
            Seed of the row choice.

        Returns
        -------
        numpy.ndarray
            ``[min(n, N), D]``, rows in increasing row order.
        """
        rng = np.random.default_rng(random_state)
        n = min(int(n), self.shape[0])
        idx = np.sort(rng.choice(self.shape[0], size=n, replace=False))
        bounds = np.cumsum([0] + [int(r) for r in self._rows()])
        futs = []
        for i, p in enumerate(self._parts):
            sel = idx[(idx >= bounds[i]) & (idx < bounds[i + 1])] - bounds[i]
            if sel.size:
                futs.append(self.client.submit(_part_rows, p, i, self.id, self.backend, sel, pure=False))
        return np.concatenate(self.client.gather(futs), 0)

    def _rows(self):
        return self._row_chunks

    def close(self):
        """Release the partitions and the workers' caches."""
        try:
            self.client.run(_drop_cache, self.id)
        except Exception:  # pragma: no cover - cluster already gone
            pass
        self._parts = []


def _class_weighted(class_weight, y, sample_weight):
    """Per-row weights, a dask ``[N]``: ``sample_weight`` (ones if None) times each row's class weight,
    as the in-memory estimators weigh them: a dict ``{class: weight}`` (1 for classes left out), or
    ``"balanced"``: ``sum s / (K * the class's sum of s)``."""
    import dask.array as da

    from .streaming import is_dask_array

    yd = y if is_dask_array(y) else da.from_array(np.asarray(y))
    if any(math.isnan(c) for c in yd.chunks[0]):
        yd = yd.compute_chunk_sizes()
    classes = np.asarray(da.unique(yd).compute())
    idx = yd.map_blocks(lambda b: np.searchsorted(classes, b), dtype=np.int64)  # [N] class indices
    sw = None
    if sample_weight is not None:
        sw = sample_weight if is_dask_array(sample_weight) else da.from_array(np.asarray(sample_weight, np.float64))
        if any(math.isnan(c) for c in sw.chunks[0]):
            sw = sw.compute_chunk_sizes()
        if sw.shape != yd.shape:
            raise ValueError(f"sample_weight must have shape {yd.shape}, got {sw.shape}")
        sw = sw.astype(np.float64).rechunk(yd.chunks)
    K = classes.size
    if isinstance(class_weight, str) and class_weight == "balanced":
        ones = idx.map_blocks(lambda b: np.ones(b.shape), dtype=np.float64)
        counts = np.asarray(da.bincount(idx, weights=ones if sw is None else sw, minlength=K).compute(), np.float64)
        if (counts[:K] <= 0).any():
            raise ValueError("class_weight='balanced': a class has zero total sample weight")
        cw = counts[:K].sum() / (K * counts[:K])
    elif isinstance(class_weight, dict):
        labels = classes.tolist()
        unknown = [k for k in class_weight if k not in labels]
        if unknown:
            raise ValueError(f"class_weight keys {unknown} are not among the classes {labels}")
        cw = np.array([float(class_weight.get(c, 1.0)) for c in labels])
        if (cw < 0).any() or not np.isfinite(cw).all():
            raise ValueError("class_weight values must be finite and non-negative")
    else:
        raise ValueError(f"class_weight must be None, 'balanced' or a dict, got {class_weight!r}")
    rows = idx.map_blocks(lambda b: cw[b], dtype=np.float64)
    return rows if sw is None else rows * sw


def _fit_logistic(est, design, spec_backend, verbose):
    from scipy.optimize import minimize

    classes = design.classes()
    if classes.size < 2:
        raise ValueError(f"y has one class only ({classes[0]!r}); need at least 2")
    binary = classes.size == 2
    d = design.shape[1]
    fi = bool(getattr(est, "fit_intercept", True))
    C = float(getattr(est, "C", 1.0))
    if not C > 0:
        raise ValueError(f"C must be positive, got {C}")
    unpenalised = getattr(est, "penalty", "l2") is None or math.isinf(C)  # scikit-learn: penalty=None, C=inf
    C = 1.0 if unpenalised else C
    tol = float(getattr(est, "tol", 1e-4))
    max_iter = int(getattr(est, "max_iter", 100))
    k = 1 if binary else classes.size
    spec = {"loss": "binomial" if binary else "multinomial", "classes": classes, "fit_intercept": fi,
            "backend": spec_backend}
    dx = d + int(fi)
    shape = (dx,) if binary else (dx, k)
    mask = np.zeros(shape) if unpenalised else np.ones(shape)
    if fi:
        mask[d] = 0.0  # the intercept is not penalised
    history, t0 = [], time.perf_counter()

    def fun(wf):
        w = wf.reshape(shape)
        loss, grad = design.loss_grad(w, spec)
        f = C * loss + 0.5 * float(np.sum(mask * w * w))
        g = C * grad + mask * w
        return f, g.ravel()

    def hessp(wf, sf):
        s = sf.reshape(shape)
        return (C * design.hessp(s, spec) + mask * s).ravel()

    def callback(intermediate_result):
        r = intermediate_result
        history.append({"iter": len(history) + 1, "objective": float(r.fun),
                        "grad_norm": float(np.abs(r.jac).max()) if hasattr(r, "jac") and r.jac is not None else float("nan"),
                        "step": float("nan"), "time": time.perf_counter() - t0})
        if verbose:
            print(f"[fit_distributed] iter {len(history)} objective {r.fun:.8g}")

    res = minimize(fun, np.zeros(int(np.prod(shape))), jac=True, hessp=hessp, method="trust-ncg",
                   callback=callback, options={"gtol": tol * C * 1e-2 + 1e-12, "maxiter": max_iter})
    w = res.x.reshape(shape)
    if binary:
        coef, icpt = w[:d][None, :], np.array([w[d] if fi else 0.0])
    else:
        coef, icpt = w[:d].T.copy(), (w[d].copy() if fi else np.zeros(k))
    est.classes_ = classes
    est.coef_ = coef
    est.intercept_ = icpt
    est.n_iter_ = np.array([int(res.nit)])
    est.n_features_in_ = d
    vars(est).pop("feature_names_in_", None)  # dask arrays carry no column names
    est.history_ = history
    if not res.success and res.nit >= max_iter:
        warn_user(f"fit_distributed: LogisticRegression reached max_iter={max_iter} without converging",
                  _convergence_warning())
    return est


def _convergence_warning():
    """``algorithms.ConvergenceWarning`` (scikit-learn's subclass once scikit-learn is imported)."""
    from algorithms._base import ConvergenceWarning, sklearn_class

    return sklearn_class(ConvergenceWarning)


def _convergence_warnings():
    """The convergence warnings of fusedml's estimators and, once imported, scikit-learn's."""
    from algorithms._base import ConvergenceWarning

    sk = sys.modules.get("sklearn.exceptions")
    return (ConvergenceWarning,) + ((sk.ConvergenceWarning,) if sk is not None else ())


def _precisions_from_cholesky(pc, cov_type):
    if cov_type == "full":
        return np.einsum("kij,klj->kil", pc, pc)
    if cov_type == "tied":
        return pc @ pc.T
    return pc ** 2


def _fit_gmm(est, design, verbose, init_sample):
    from fusedml.gmm import gmm_mstep

    K = int(getattr(est, "n_components", 1))
    cov = getattr(est, "covariance_type", "full")
    tol = float(getattr(est, "tol", 1e-3))
    reg = float(getattr(est, "reg_covar", 1e-6))
    max_iter = int(getattr(est, "max_iter", 100))
    n, d = design.shape
    if K > n:
        raise ValueError(f"n_components={K} must be <= n_samples={n}")
    means_init = getattr(est, "means_init", None)
    if means_init is not None:
        means = np.asarray(means_init, dtype=np.float64)
        weights = np.asarray(getattr(est, "weights_init", None) if getattr(est, "weights_init", None) is not None
                             else np.full(K, 1.0 / K), dtype=np.float64)
        prec = getattr(est, "precisions_init", None)
        if prec is None:
            prec_chol = {"full": np.tile(np.eye(d), (K, 1, 1)), "tied": np.eye(d),
                         "diag": np.ones((K, d)), "spherical": np.ones(K)}[cov]
        else:
            prec = np.asarray(prec, dtype=np.float64)
            if cov == "full":
                prec_chol = np.stack([np.linalg.cholesky(p) for p in prec])
            elif cov == "tied":
                prec_chol = np.linalg.cholesky(prec)
            else:
                prec_chol = np.sqrt(prec)
    else:
        # Initialise from the estimator itself fitted on a uniform sample of rows (gathered once).
        sample = design.sample_rows(max(init_sample, 10 * K), getattr(est, "random_state", None))
        params = est.get_params() if hasattr(est, "get_params") else {}
        sub = type(est)(**params)
        with warnings.catch_warnings():  # the sample fit only starts EM; the full fit reports convergence
            for category in _convergence_warnings():
                warnings.simplefilter("ignore", category)
            sub.fit(sample)
        weights = np.asarray(sub.weights_, dtype=np.float64)
        means = np.asarray(sub.means_, dtype=np.float64)
        prec_chol = np.asarray(sub.precisions_cholesky_, dtype=np.float64)
    sw_sum = design.sample_weight_sum()
    lower, converged, history, t0 = -np.inf, False, [], time.perf_counter()
    it = 0
    for it in range(1, max_iter + 1):
        stats = design.gmm_estep(weights, means, prec_chol, cov)
        new_lower = float(stats.log_likelihood) / sw_sum
        w_t, m_t, cov_t, pc_t = gmm_mstep(stats, reg_covar=reg)
        weights, means, covs, prec_chol = (np.asarray(a.cpu(), dtype=np.float64) for a in (w_t, m_t, cov_t, pc_t))
        change = new_lower - lower
        lower = new_lower
        history.append({"iter": it, "objective": lower, "grad_norm": abs(change), "step": float("nan"),
                        "time": time.perf_counter() - t0})
        if verbose:
            print(f"[fit_distributed] EM iter {it} lower bound {lower:.10g} change {change:.3g}")
        if abs(change) < tol:
            converged = True
            break
    if not converged:
        warn_user(f"fit_distributed: GaussianMixture did not converge in max_iter={max_iter}",
                  _convergence_warning())
    est.weights_, est.means_, est.covariances_, est.precisions_cholesky_ = weights, means, covs, prec_chol
    est.precisions_ = _precisions_from_cholesky(prec_chol, cov)
    est.converged_, est.n_iter_, est.lower_bound_ = converged, it, lower
    est.n_features_in_ = d
    vars(est).pop("feature_names_in_", None)  # dask arrays carry no column names
    est.history_ = history
    return est


def fit_distributed(estimator, X, y=None, *, sample_weight=None, client=None, backend="auto",
                    split_every=8, init_sample=10_000, verbose=0):
    """Fit ``estimator`` on a Dask array whose partitions stay on the cluster's workers.

    Supported: ``LogisticRegression`` (binary and multinomial; L2, or none with scikit-learn's
    ``penalty=None`` / ``C=inf``; ``class_weight`` as in memory; trust-region Newton-CG whose
    gradients and Hessian-vector products are fused ``mmchain`` passes on the workers) and
    ``GaussianMixture`` (EM whose E-step runs ``fusedml.gmm_estep`` on the workers; the M-step,
    ``fusedml.gmm_mstep``, on the client). fusedml's ``algorithms`` estimators and scikit-learn's
    of the same names both work: only their parameters are read and their fitted attributes set.

    Parameters
    ----------
    estimator : LogisticRegression or GaussianMixture
    X : dask.array.Array
        ``[N, D]``, chunked by rows (dense or, for logistic regression, scipy CSR chunks); empty
        chunks are skipped, unknown chunk sizes (of X, y and sample_weight) computed, and each
        partition is checked for NaN / infinity once, on its worker.
    y : dask.array.Array or array-like, optional
        ``[N]`` labels (logistic regression).
    sample_weight : dask.array.Array or array-like, optional
        ``[N]``.
    client : distributed.Client, optional
        Default: the current client.
    backend : str
        fusedml backend on the workers.
    split_every : int
        Fan-in of the tree reduction.
    init_sample : int
        GaussianMixture without ``means_init``: rows sampled to initialise (the estimator's own
        ``fit`` on the sample).
    verbose : int

    Returns
    -------
    estimator
        The same object, fitted; ``history_`` lists the distributed iterations.
    """
    name = type(estimator).__name__
    if name not in ("LogisticRegression", "GaussianMixture"):
        raise TypeError(f"fit_distributed supports LogisticRegression and GaussianMixture, got {name}")
    if name == "LogisticRegression" and y is None:
        raise ValueError("LogisticRegression needs y")
    penalty = getattr(estimator, "penalty", "l2")
    if penalty not in ("l2", None, "deprecated"):
        raise ValueError(f"fit_distributed supports the L2 penalty only, got penalty={penalty!r}")
    if name == "LogisticRegression" and getattr(estimator, "class_weight", None) is not None:
        sample_weight = _class_weighted(estimator.class_weight, y, sample_weight)
    design = DistributedDesign(X, y if name == "LogisticRegression" else None, sample_weight, client=client,
                               split_every=split_every, backend=backend)
    try:
        if name == "LogisticRegression":
            return _fit_logistic(estimator, design, backend, verbose)
        return _fit_gmm(estimator, design, verbose, init_sample)
    finally:
        design.close()
