"""Gaussian mixture models (EM) and k-means on the fused GMM operators.

:class:`GaussianMixture` runs scikit-learn's ``BaseMixture`` EM loop
(``sklearn/mixture/_base.py``) with the E-step replaced by ONE fused pass over ``X``:

* E-step: :func:`fusedml.gmm_estep` returns, for the current ``(pi, mu, L)``, the total
  log-likelihood ``sum_n log sum_k pi_k N(x_n | mu_k, Sigma_k)`` and the sufficient statistics
  ``N_k``, ``S1_k``, ``S2_k`` (centred about the current means). The ``N x K`` responsibility matrix
  is never stored.
* M-step: :func:`fusedml.gmm_mstep` turns the statistics into ``(weights, means, covariances,
  precisions_cholesky)`` exactly as scikit-learn (``reg_covar`` on the diagonal, ``10 * eps`` added
  to ``N_k``); this is ``O(K D^2)`` work on the statistics only.
* lower bound = mean log-likelihood of the parameters *entering* the iteration (as scikit-learn);
  converged when ``|lower_bound - previous| < tol``; ``n_init`` restarts keep the best lower
  bound; ``warm_start`` continues from the fitted parameters.
* On a GPU with the fused backend and diag / spherical covariances the iterations run on the
  device (:func:`_em_device`): :func:`fusedml.gmm.fused.estep_device` and one launch for the
  M-step and the next operands (:func:`fusedml.gmm.fused.mstep_operands`), iteration ``i + 1``
  queued before the host reads iteration ``i``'s lower bound, replayed from CUDA graphs from the
  fifth iteration on (0.13 ms per iteration at 1M x 16, K = 16 on the H200 against 1.1 ms for the
  host loop :func:`_em_host`); ``FUSEDML_DEVICE_EM=0`` keeps the host loop. The host loop (full /
  tied covariances, Dask input, the ``ops`` and ``cpu`` backends) passes each E-step the parameters
  its M-step made with ``check_params=False``: no conversion and no full re-check per iteration.

Initialisation follows scikit-learn: responsibilities from k-means labels (``"kmeans"``), from
uniform random numbers (``"random"``), or one-hot on ``K`` rows picked at random
(``"random_from_data"``) or by k-means++ (``"k-means++"``), then one M-step. Here the
responsibilities are never materialised either: hard labels are turned into statistics by
per-label sums over row blocks (one-hot GEMMs on CUDA), random responsibilities are drawn block
by block from the same ``numpy.random.RandomState`` stream scikit-learn uses (so a seeded
``"random"`` init gives the same start as scikit-learn's).

Two deliberate differences from scikit-learn's initialisation (both only where its responsibilities
do not sum to one per row, i.e. the one-hot ``"random_from_data"`` / ``"k-means++"`` starts):
the initial weights are normalised (scikit-learn keeps ``N_k / N``, here ``1/N`` each, which is not
a distribution and would be rejected by the operators; the responsibilities of the first E-step are
unchanged, only the first lower bound moves by a constant), and the initial ``"tied"`` covariance
is computed from the ``K`` chosen rows (scikit-learn's tied formula uses ``X^T X`` over all rows, which
assumes every row's responsibilities sum to one). Every other start equals scikit-learn's to
rounding. The ``"random"`` start draws its ``N x K`` uniforms on the host (as scikit-learn) in
row blocks; for a streamed (dask) matrix, whose blocks may come out of row order, in one draw.

:class:`KMeans` is Lloyd's algorithm as scikit-learn's ``_kmeans_single_lloyd``. Its assignment
step is the fused :func:`fusedml.gmm_score` with equal weights and unit spherical precision: then
``argmax_k log pi_k N(x | c_k, I) = argmin_k ||x - c_k||^2`` and no ``N x K`` distance matrix
exists. The centre update is one blocked pass of per-label sums (``index_add_`` on CUDA; a sort and
``segment_reduce`` on the host, where ``index_add_`` is slow) over the labels (residuals about
the old centres accumulated in float64, so data far from the origin does not cancel). Empty
clusters are relocated to the farthest points as scikit-learn does. Seeding: scikit-learn's
greedy k-means++ (``2 + log K`` local trials) on the device, drawing from the same RandomState
calls as scikit-learn so seeded runs start from the same centres on float64 data.

``sample_weight`` (both estimators' ``fit``): weighted statistics in every pass (see the classes).

Inputs: numpy arrays, torch tensors (CPU or CUDA: everything stays on that device), dask arrays
(streamed through :class:`fusedml.streaming.StreamedMatrix`). Sparse input raises ``TypeError``
(as scikit-learn's ``GaussianMixture``). Fitted arrays are numpy arrays, or torch tensors on the
data's device when ``fit`` was given a torch tensor.
"""
from __future__ import annotations

import bisect
import math
import numbers
import os
import time

import numpy as np
import torch

from fusedml._dispatch import resolve_backend
from fusedml._validation import check_finite, is_sparse, to_tensor, warn_user
from fusedml.mmchain.dense import NARROW_ROW_BYTES

from ._base import (BaseEstimator, ConvergenceWarning, aligned_copy, as_design_matrix, as_sample_weight,
                    check_flag, check_features, check_verbose, record_features, sklearn_class)

__all__ = ["GaussianMixture", "KMeans"]

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
GMM_INIT_PARAMS = ("kmeans", "k-means++", "random", "random_from_data")
# Elements of one row-block temporary (block rows x per-row width): 32 MiB in float64.
_BLOCK_ELEMS = 1 << 22
_F64 = torch.float64


# ----------------------------------------------------------------------------------------------
# data access: one code path for in-memory tensors and streamed (dask) matrices
# ----------------------------------------------------------------------------------------------
def _check_random_state(seed):
    """None / int / RandomState -> numpy RandomState (scikit-learn's ``check_random_state``)."""
    if seed is None or seed is np.random:
        return np.random.mtrand._rand
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return np.random.RandomState(int(seed))
    if isinstance(seed, np.random.RandomState):
        return seed
    raise ValueError(f"random_state must be None, an int or a numpy RandomState, got {seed!r}")


def _row_blocks(n, per_row, start=0):
    """Yield row slices ``[start, start + n)`` whose temporaries hold about ``_BLOCK_ELEMS`` elements."""
    step = max(1, _BLOCK_ELEMS // max(1, int(per_row)))
    for s in range(0, n, step):
        yield slice(start + s, start + min(n, s + step))


def _is_streamed(X) -> bool:
    return hasattr(X, "map_blocks") and hasattr(X, "_fusedml_gmm_estep")


def _for_rows(X, fn, per_row):
    """Call ``fn(Xb, rows)`` on row blocks covering X (``rows`` = global slice, ``Xb`` on X's device).

    In-memory tensors are cut into blocks of about ``_BLOCK_ELEMS / per_row`` rows; a streamed
    matrix hands out its own blocks (``StreamedMatrix.map_blocks``: one data pass, overlapped
    transfers), cut further when a block would make too large a temporary.
    """
    if _is_streamed(X):
        def block(Xb, rows):
            for sl in _row_blocks(rows.stop - rows.start, per_row):
                fn(Xb[sl], slice(rows.start + sl.start, rows.start + sl.stop))
            return None

        X.map_blocks(block, None)
    else:
        for sl in _row_blocks(X.shape[0], per_row):
            fn(X[sl], sl)


class _Segments:
    """Per-label sums ``acc[k] += sum_{n: labels_n = k} src[n]`` for one row block.

    CUDA: a one-hot ``[B, K]`` float64 matrix and one GEMM per sum (``onehot^T src``; ``index_add_``
    onto K rows is an atomic per element on K x D addresses: 0.34 ms per call at 1M x 16, K = 16 on
    the H200, ``gmm_host_probe-*-s20-c``). Host: a stable sort of the labels and ``segment_reduce``
    (``index_add_`` along dim 0 pays a per-row cost on the CPU, several times slower); the sort is
    shared by every sum over the same labels.
    """

    def __init__(self, labels, K, onehot=None):
        self.labels = labels
        self.cuda = labels.device.type == "cuda" if onehot is None else bool(onehot)  # onehot: force a path
        if self.cuda:
            self.onehot = torch.zeros((labels.shape[0], K), dtype=_F64, device=labels.device)
            self.onehot.scatter_(1, labels.view(-1, 1), 1.0)
        else:
            self.order = torch.argsort(labels, stable=True)
            self.lengths = torch.bincount(labels, minlength=K)

    def add_(self, acc, src):
        if self.cuda:
            acc.add_((self.onehot.T @ src.reshape(src.shape[0], -1)).view(acc.shape))
        else:
            acc.add_(torch.segment_reduce(src[self.order], "sum", lengths=self.lengths, axis=0))

    def count_(self, acc, weights=None):
        """``acc[k] += sum_{n: labels_n = k} w_n`` (ones if None); no host sync."""
        if self.cuda:
            acc.add_(self.onehot.sum(0) if weights is None else weights.to(_F64) @ self.onehot)
        elif weights is None:
            acc.add_(self.lengths.to(_F64))
        else:
            acc.add_(torch.segment_reduce(weights.to(_F64)[self.order], "sum", lengths=self.lengths, axis=0))


def _take_rows(X, index):
    """``X[index]`` as a float64 ``[len(index), D]`` tensor on X's device."""
    idx = np.asarray(index, dtype=np.int64).ravel()
    if _is_streamed(X):
        return X.take_rows(idx).to(_F64)
    return X[torch.as_tensor(idx, device=X.device)].to(_F64)


def _score_op(X, weights, means, prec_chol, covariance_type, backend):
    """:func:`fusedml.gmm_score` (through the streamed matrix's hook for dask data)."""
    if hasattr(X, "_fusedml_gmm_score"):
        return X._fusedml_gmm_score(weights, means, prec_chol, covariance_type, backend=backend)
    return _gmm_ops().gmm_score(X, weights, means, prec_chol, covariance_type, backend=backend)


def _as_data(X, estimator, backend):
    """Validate a design matrix; return ``(X, info)`` (see ``algorithms._base.as_design_matrix``).

    X becomes a dense torch tensor (numpy: no copy; torch: kept on its device) or, for a dask
    array, a :class:`fusedml.streaming.StreamedMatrix`, whose resident rows stay unpadded for
    ``GaussianMixture``: its E-steps read X as it is (the register form lost on padded rows, H100,
    4M x 13, K = 8: 0.544 ms against 0.472, ``gmm_odd_width_probe-H100-*-s44``). Sparse data raises
    ``TypeError``.
    """
    if is_sparse(X):
        raise TypeError(
            f"{estimator} does not support sparse input (got {type(X).__name__}); "
            "pass a dense array, e.g. X.toarray()"
        )
    M, info = as_design_matrix(X, backend=backend, align_rows=False if estimator == "GaussianMixture" else None)
    if getattr(M, "is_sparse", False):
        raise TypeError(f"{estimator} does not support sparse input: the dask array has sparse chunks")
    if isinstance(M, torch.Tensor) and M.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        M = M.to(info.dtype)
    return M, info


# statistics up to this many second-moment entries get their M-step on the host (CPU float64,
# 2 cores: 0.1-0.4 ms from K = 16, D = 16 diag to 256 x 64 diag / 16 x 32 x 32 full; 5 ms at
# 1024 x 128 diag, where the GPU's ~20 launches are cheaper)
_HOST_MSTEP_MAX = 1 << 14


def _host_mstep(device, covariance_type, K, D) -> bool:
    """Whether EM on ``device`` runs its M-step on the host: for GPU data whose statistics are
    small, one copy of the statistics per iteration replaces the M-step's ~20 small launches
    and its two synchronisations (the log-likelihood read and the positive-definiteness check),
    and the next E-step takes its parameters from the host without a transfer back."""
    if torch.device(device).type == "cpu":
        return False
    n = {"full": K * D * D, "tied": D * D, "diag": K * D, "spherical": K}[covariance_type]
    return n <= _HOST_MSTEP_MAX


def _out(t, kind, dtype=None):
    """``t`` (cast to ``dtype``) as a torch tensor (kind == "torch") or a numpy array."""
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t if kind == "torch" else t.detach().cpu().numpy()


def _param_tensor(a, name, device):
    return to_tensor(a, name, allow_int=True).to(device=device, dtype=_F64)


def _check_int(value, name, lo):
    """Validate an integer hyper-parameter ``>= lo`` (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {value!r}")


def _fitted_data(estimator, X, name):
    """Validate a predict-time ``X`` for a fitted ``estimator``; return ``(X, info)`` as ``_as_data``."""
    estimator._check_is_fitted()
    X, info = _as_data(X, name, estimator.backend)
    check_features(estimator, info, name)
    return X, info


def _unsupervised_tags(tags, estimator_type):
    """scikit-learn tags of an estimator without target that reads dense data only."""
    tags.estimator_type = estimator_type
    tags.target_tags.required = False
    tags.input_tags.sparse = False
    return tags


def _gmm_ops():
    """The operator layer (imported lazily so the module loads without it)."""
    from fusedml import gmm

    return gmm


def _np_dtype(X):
    return np.float64 if X.dtype == torch.float64 else np.float32


def _sample_weight(sample_weight, info):
    """Validated ``[N]`` float64 sample weights on the data's device, or None (unit weights).

    ``algorithms._base.as_sample_weight`` (shape ``[N]`` or a scalar, finite, non-negative, not
    all zero: ``ValueError`` otherwise); cast through the compute dtype first, as scikit-learn casts
    ``sample_weight`` to X's dtype.
    """
    sw = as_sample_weight(sample_weight, info)
    return None if sw is None else sw.to(_F64)


def _choice_p(N, sw, np_dtype):
    """Row probabilities ``s / sum(s)`` in X's numpy dtype (scikit-learn's ``p=`` of ``choice``)."""
    if sw is None and N <= 1 << 24:  # ones / N: the sum of the ones is exact, one pass instead of three
        return np.full(N, np.asarray(1, dtype=np_dtype) / np.asarray(N, dtype=np_dtype), dtype=np_dtype)
    s = np.ones(N, dtype=np_dtype) if sw is None else sw.detach().cpu().numpy().astype(np_dtype)
    return s / s.sum()


def _choice_one(N, sw, np_dtype, random_state) -> int:
    """``random_state.choice(N, p=_choice_p(N, sw, np_dtype))`` (scikit-learn's first k-means++
    centre), the same draw and the same state afterwards.

    For uniform weights it takes numpy's sampling steps (``cdf = cumsum(p); cdf /= cdf[-1]``, one
    ``random_sample()``, ``searchsorted(..., "right")``: ``RandomState.choice`` with ``p``) without
    building the arrays (:func:`_uniform_cdf_search`: the N-element cumsum alone took 7-8 ms of
    the device host's time per fit at a million rows).
    """
    if sw is None and N <= 1 << 24:
        p = float(np.asarray(1, dtype=np_dtype) / np.asarray(N, dtype=np_dtype))  # _choice_p's entries
        return _uniform_cdf_search(N, p, random_state.random_sample())
    return int(random_state.choice(N, p=_choice_p(N, sw, np_dtype)))


def _uniform_runs(N, p):
    """numpy's ``cumsum(full(N, p))`` (float64, sequential) as runs of equal steps.

    Within one binade ``[2^(e-1), 2^e)`` every ``fl(c + p)`` that stays below ``2^e`` adds the same
    multiple of the binade's ulp: ``p`` rounded to that grid, which does not depend on ``c`` unless
    ``p`` lies exactly half an ulp off the grid (a tie, rounded to the even neighbour: from an even
    grid point the step is again constant, so an odd start takes one addition first). The step that
    leaves the binade is taken as numpy takes it, one float addition. About two runs per binade
    (~50 for any N) instead of N additions.

    Returns ``[(i0, c0, q, n)]``: ``cumsum[i] = c0 + (i - i0) * q`` for ``i0 <= i < i0 + n`` (exact).
    """
    from fractions import Fraction

    P, runs, i, c = Fraction(p), [], 0, float(p)
    while i < N:
        e = math.frexp(c)[1]  # c in [2^(e-1), 2^e)
        ulp = Fraction(2) ** (e - 53)
        q, n = (c + p) - c, 1  # q exact: both on the binade's grid
        if q > 0 and not (2 * (P % ulp) == ulp and (Fraction(c) / ulp) % 2 == 1):
            room = Fraction(2) ** e - P - Fraction(c)  # c + j q + p stays in the binade while j q < room
            n = 1 + max(0, math.ceil(room / Fraction(q)))
        n = min(n, N - i)
        runs.append((i, c, q, n))
        i, c = i + n, (c + (n - 1) * q) + p  # the next step as numpy adds it
    return runs


def _uniform_cdf_search(N, p, u):
    """``searchsorted(cumsum(full(N, p)) / total, u, side="right")`` in O(log N) without the arrays.

    Bit-identical to numpy's (the cdf values are numpy's float64 sums and quotients, exactly, from
    :func:`_uniform_runs`), so :func:`_choice_one` returns ``RandomState.choice``'s draw.
    """
    runs = _uniform_runs(N, p)
    starts = [r[0] for r in runs]

    def cum(i):
        i0, c0, q, _ = runs[bisect.bisect_right(starts, i) - 1]
        return c0 + (i - i0) * q

    total = cum(N - 1)
    lo, hi = 0, N - 1  # cdf[N - 1] = 1 > u: the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if cum(mid) / total > u:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _check_positive_rows(sw, K, what):
    """``ValueError`` when fewer than ``K`` rows have positive weight (``what`` needs K distinct rows)."""
    if sw is not None:
        n_pos = int((sw > 0).sum())
        if n_pos < K:
            raise ValueError(f"{what} needs at least {K} samples with positive sample_weight, got {n_pos}")


# ----------------------------------------------------------------------------------------------
# k-means building blocks (all on X's device; centres float64)
# ----------------------------------------------------------------------------------------------
def _assign(X, centers, backend):
    """Nearest centre of every row, fused (no N x K): ``[N]`` int64 labels.

    :func:`fusedml.lloyd_step`'s labels (distances about a central point of the data, exact at any
    scale; :func:`fusedml.kmeans.nearest_labels`, without the step's sums). A streamed X: the same,
    block by block about the central point of the whole matrix, so exact ties go as in memory (a
    rounded Gaussian score broke them at random).
    """
    from fusedml.kmeans import nearest_labels

    if isinstance(X, torch.Tensor):
        return nearest_labels(X, centers, backend)
    sh = X.central_point()  # the in-memory shift, computed once per matrix (not per Lloyd iteration)
    return X.map_blocks(lambda Xb, rows: nearest_labels(Xb, centers, backend, shift=sh), reduce="concat")


def _sq_dist_to_rows(X, C, shift):
    """``[M, N]`` float64 squared distances from the rows of ``C`` [M, D] to every row of X.

    ``||x - c||^2 = ||x'||^2 - 2 x'.c' + ||c'||^2`` on data centred by ``shift`` (the data mean, as
    scikit-learn's k-means): one GEMM per row block, temporaries ``[B, D]`` and ``[B, M]``.
    """
    M = C.shape[0]
    N, D = X.shape
    Cc = C.to(_F64) - shift  # [M, D]
    c_sq = (Cc * Cc).sum(1)
    out = torch.empty((M, N), dtype=_F64, device=C.device)

    def block(Xb, rows):
        xc = Xb.to(_F64) - shift  # [B, D]
        d = (xc * xc).sum(1)[:, None] - 2.0 * (xc @ Cc.T) + c_sq[None, :]  # [B, M]
        out[:, rows] = d.clamp_(min=0.0).T

    _for_rows(X, block, D + M)
    return out


def _kmeans_plusplus(X, n_clusters, random_state, sample_weight=None, backend=None):
    """Greedy k-means++ seeding (scikit-learn's ``_kmeans_plusplus``), on X's device.

    Draws the same numbers from ``random_state`` as scikit-learn (first centre by
    ``choice(N, p=s / sum(s))``, then ``2 + int(log K)`` candidates per centre by D^2 sampling
    weighted by ``s`` (``s`` = ``sample_weight``, ones if None), keeping the candidate that lowers
    the weighted potential ``sum_n s_n min_j ||x_n - c_j||^2`` most; scikit-learn >= 1.3). Distances are float64 on mean-centred
    data (as scikit-learn's), so on float64 data the seeds equal scikit-learn's except for
    rounding ties at a sampling boundary. Each centre costs one pass over X for the candidates'
    distances (as in scikit-learn).

    Parameters
    ----------
    X : torch.Tensor or StreamedMatrix, shape [N, D]
    n_clusters : int
    random_state : numpy.random.RandomState
    sample_weight : torch.Tensor, shape [N], optional
        float64 non-negative weights on X's device.
    backend : str, optional
        ``"fused"`` with an in-memory X: each centre's distances and potentials come from one
        kernel (:func:`fusedml.kmeans.candidate_distances`, float64 difference form) instead of
        the blocked GEMM on centred data (~50 small launches per centre at 1M rows).

    Returns
    -------
    numpy.ndarray
        ``[K]`` int64 indices of the chosen rows.

    Every decision stays on X's device (one host sync at the end for an in-memory X; a streamed
    X fetches the candidate rows through the host).
    """
    N = X.shape[0]
    n_local_trials = 2 + int(np.log(n_clusters))
    sw = sample_weight
    first = _choice_one(N, sw, _np_dtype(X), random_state)
    on_device = not _is_streamed(X)
    first_row = _take_rows(X, [first])
    dist_op, shift = None, None  # the kernel's difference form needs no centring pass
    if backend == "fused" and on_device:
        from fusedml.kmeans import candidate_distances as dist_op
    res = None if dist_op is None else dist_op(X, first_row, None, sw)
    if res is None:  # the operator-level path (or L x D too large for the kernel)
        dist_op, shift = None, _data_mean(X)
        closest = _sq_dist_to_rows(X, first_row, shift)[0]  # [N]
    else:
        closest = res[0][0]
    wclosest = closest if sw is None else closest * sw
    pot = wclosest.sum()  # 0-d, on the device: the loop needs no host sync for an in-memory X
    dev = closest.device
    # scikit-learn draws uniform(size=L) per centre and scales it by the potential; the same
    # numbers drawn at once (RandomState yields them in the same order) travel in ONE copy (a
    # pageable host-to-device copy synchronises the stream: one per centre would stall the queue)
    draws = torch.as_tensor(random_state.uniform(size=(max(n_clusters - 1, 0), n_local_trials)), dtype=_F64)
    draws = draws.to(dev)
    pot = pot.reshape(1)
    draw = torch.empty(n_local_trials, dtype=_F64, device=dev)  # [L] this centre's draws
    chosen = torch.empty(1, dtype=torch.int64, device=dev)
    indices = torch.full((n_clusters,), first, dtype=torch.int64, device=dev)

    def step():  # one centre, in place on closest / pot / chosen (replayable from a CUDA graph)
        nonlocal shift
        wclosest = closest if sw is None else closest * sw
        cand = torch.searchsorted(torch.cumsum(wclosest, 0), draw * pot).clamp_(max=N - 1)
        rows = X[cand].to(_F64) if on_device else _take_rows(X, cand.cpu().numpy())
        res = None if dist_op is None else dist_op(X, rows, closest, sw)
        if res is not None:  # one kernel: min(distances, closest) and the potentials
            dist, pots = res
        else:  # the operator-level path (or L x D too large for the kernel)
            shift = _data_mean(X) if shift is None else shift
            dist = _sq_dist_to_rows(X, rows, shift)  # [L, N]
            torch.minimum(dist, closest[None, :], out=dist)
            pots = dist.sum(1) if sw is None else dist @ sw
        best = torch.argmin(pots).reshape(1)  # [1]: indexing with a 0-d tensor would read it on the host
        torch.index_select(pots, 0, best, out=pot)
        torch.index_select(dist, 0, best, out=closest.view(1, N))
        torch.index_select(cand, 0, best, out=chosen)

    from algorithms._solvers import _Replay, graph_safe

    # replayed (fused kernel, in-memory X) after _KPP_CAPTURE_AFTER centres: ~15 launches become one
    replay = _Replay(step, dist_op is not None and on_device and graph_safe(X))
    replay.capture_after = _KPP_CAPTURE_AFTER
    for c in range(1, n_clusters):
        draw.copy_(draws[c - 1])
        replay()
        indices[c:c + 1].copy_(chosen)
    return indices.cpu().numpy()  # the one host sync (a streamed X also fetched its candidate rows)


#: centres before the k-means++ step is captured in a CUDA graph. A step is ~15 launches and
#: ~0.3 ms of host time on the H200 host against ~0.17 ms on the GPU, but a capture here costs
#: several ms (its private memory pool allocates the [L, N] distances anew for every fit): with a
#: capture at the third centre the 1M x 16, K = 16 GaussianMixture fit took 23.5 ms against
#: 16.6 without graphs (end_to_end_gmm-*-s21-g), so only many centres capture
_KPP_CAPTURE_AFTER = 32


def _random_rows(N, n_clusters, random_state, np_dtype, sample_weight=None):
    """scikit-learn's k-means ``init="random"``: K distinct rows drawn with ``p = s / sum(s)``.

    Same RandomState call as scikit-learn; ``sample_weight`` [N] float64 tensor or None (uniform).
    """
    _check_positive_rows(sample_weight, n_clusters, "init='random'")
    p = _choice_p(N, sample_weight, np_dtype)
    return np.asarray(random_state.choice(N, size=n_clusters, replace=False, p=p), dtype=np.int64)


def _data_mean(X):
    """``[D]`` float64 column means (one blocked pass)."""
    total = torch.zeros(X.shape[1], dtype=_F64, device=X.device)

    def block(Xb, rows):
        total.add_(Xb.to(_F64).sum(0))

    _for_rows(X, block, X.shape[1])
    return total / X.shape[0]


def _kmeans_tolerance(X, tol):
    """scikit-learn's ``_tolerance``: ``tol * mean(var(X, axis=0))`` (float64, one pass).

    The column sums of ``d = x - x_0`` and ``d^2`` about the first row (a shift that keeps the
    float64 difference ``E[d^2] - E[d]^2`` free of cancellation for data far from the origin).
    """
    if tol == 0:
        return 0.0
    N, D = X.shape
    shift = _take_rows(X, [0])[0]  # [D]
    s = torch.zeros((2, D), dtype=_F64, device=shift.device)  # [sum d, sum d^2]

    def block(Xb, rows):
        d = Xb.to(_F64) - shift
        s.add_(torch.stack([d.sum(0), (d * d).sum(0)]))

    _for_rows(X, block, X.shape[1])
    mean_d = s[0] / N
    return float((s[1] / N - mean_d * mean_d).clamp_(min=0.0).mean()) * tol


def _lloyd_update(X, labels, centers, sample_weight=None):
    """One centre update from ``labels`` (the M-part of scikit-learn's ``lloyd_iter``), one pass.

    Weighted residuals ``s_n (x_n - old_{l_n})`` are accumulated in float64 per label
    (:class:`_Segments`) and divided by the cluster weight ``sum s_n``; clusters of zero weight
    take the farthest points (unweighted distance, ``_relocate_empty_clusters_dense``); clusters
    still empty (or relocated to a zero-weight point) sit on the heaviest cluster's centre
    (``_average_centers``). ``sample_weight``: ``[N]`` float64 or None (ones).

    Returns
    -------
    new_centers : torch.Tensor
        ``[K, D]`` float64.
    shift_sq : float
        ``sum_k ||new_k - old_k||^2``.
    inertia_old : float
        ``sum_n s_n ||x_n - old_{l_n}||^2``.
    """
    N, D = X.shape
    K = centers.shape[0]
    c64 = centers.to(_F64)
    sw = sample_weight
    res = torch.zeros((K, D), dtype=_F64, device=c64.device)
    dist = torch.empty(N, dtype=_F64, device=c64.device)

    def block(Xb, rows):
        lab = labels[rows]
        d = Xb.to(_F64) - c64[lab]  # [B, D]
        _Segments(lab, K).add_(res, d if sw is None else d * sw[rows, None])
        dist[rows] = (d * d).sum(1)

    _for_rows(X, block, D)
    counts = torch.bincount(labels, weights=sw, minlength=K).to(_F64)  # cluster weights [K]
    empty = torch.nonzero(counts == 0).flatten().tolist()
    relocated = {}
    if empty and float(dist.max()) > 0:
        far = torch.topk(dist, len(empty)).indices.tolist()
        rows = _take_rows(X, far)
        for j, f, xf in zip(empty, far, rows):
            old = int(labels[f])
            wf = 1.0 if sw is None else float(sw[f])
            res[old] -= wf * (xf - c64[old])
            counts[old] -= wf
            counts[j] = wf
            if wf > 0:
                relocated[j] = xf
    new = c64 + res / torch.where(counts > 0, counts, 1.0)[:, None]
    for j, xf in relocated.items():
        new[j] = xf
    still = counts <= 0
    if bool(still.any()):
        new[still] = new[int(torch.argmax(counts))].clone()
    shift_sq = float(((new - c64) ** 2).sum())
    return new, shift_sq, float(dist.sum() if sw is None else dist @ sw)


def _inertia(X, labels, centers, sample_weight=None):
    """``sum_n s_n ||x_n - c_{l_n}||^2`` in float64 (``s`` ones if None), one blocked pass."""
    c64 = centers.to(_F64)
    total = torch.zeros((), dtype=_F64, device=c64.device)

    def block(Xb, rows):
        d = Xb.to(_F64) - c64[labels[rows]]
        dd = (d * d).sum(1)
        total.add_(dd.sum() if sample_weight is None else dd @ sample_weight[rows])

    _for_rows(X, block, X.shape[1])
    return float(total)


class _Fetch:
    """A small device tensor's values read on the host without waiting for later work.

    CUDA: a non-blocking copy into ``host`` (a pinned buffer of t's shape and dtype, which the
    caller reuses once :meth:`get` returned: a pinned allocation per step cost ~40 us of host time
    on the H200 host) and an event recorded behind it, so that work queued AFTER the fetch (the
    next Lloyd step or EM iteration) keeps the GPU busy while the host waits for this one;
    elsewhere the tensor itself.
    """

    def __init__(self, t, host):
        self.event = None
        if t.device.type == "cuda":
            self.host = host
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t

    def get(self):
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


def _lloyd_stop(i, inertia_old, shift_sq, same, tol_abs, verbose, history, t0):
    """Report Lloyd step ``i`` (``verbose``, ``history``) and apply scikit-learn's two stopping
    rules: labels unchanged (``same``, strict) or centre shift within ``tol_abs``.

    Returns
    -------
    tuple
        ``(converged, strict)``.
    """
    if verbose:
        print(f"Iteration {i}, inertia {inertia_old}.")
    if history is not None:
        history.append({"iter": i + 1, "objective": inertia_old, "grad_norm": float("nan"),
                        "step": shift_sq, "time": time.perf_counter() - t0})
    if same:
        if verbose:
            print(f"Converged at iteration {i}: strict convergence.")
        return True, True
    if shift_sq <= tol_abs:
        if verbose:
            print(f"Converged at iteration {i}: center shift {shift_sq} within tolerance {tol_abs}.")
        return True, False
    return False, False


#: calls of each of the three slot transitions before its CUDA graph is captured: 16, i.e. from
#: about step 48 on. Each capture costs ~0.9 ms of host time on the H200 host and a replay saves
#: ~0.1 ms (the eager step is near the GPU's ~0.1 ms at 1M x 16, K = 16): the GaussianMixture
#: initialisation's 38 steps ran 7 ms slower with captures after two calls
#: (end_to_end_gmm-*-s21-f against end_to_end_gmm_nographs-*-s21-f); long KMeans fits replay
_LLOYD_CAPTURE_AFTER = 16


def _lloyd_fused_loop(it, X, centers, max_iter, tol_abs, verbose, t0, history, sample_weight):
    """The Lloyd loop on :class:`fusedml.kmeans.LloydIterations`, one step queued ahead.

    Step ``i + 1`` (from step i's device centres and labels) is launched before the host reads
    step i's scalars (empty clusters, shift, inertia, changed labels), so the GPU does not idle
    on the host's decision; the queued step is dropped when step i ends the loop or left a
    cluster empty (then the relocation of :func:`_lloyd_update` runs with step i's labels,
    scikit-learn's rule). The iterates equal those of the step-by-step loop.

    From the second step on, the steps run in place on three persistent slots
    (:meth:`~fusedml.kmeans.LloydIterations.step_into`: step i writes slot ``i % 3``, so the
    queued step leaves step i - 1's centres, which a relocation reads, intact), each of the three
    transitions replayed from a CUDA graph after ``_LLOYD_CAPTURE_AFTER`` calls
    (``algorithms._solvers._Replay``: ~10 launches and allocations per step become one replay).

    Returns
    -------
    tuple
        ``(centers [K, D] float64, labels [N] int32, n_iter, converged, strict)``.
    """
    from algorithms._solvers import _Replay, graph_safe

    labels, first, out = it.step(centers, None)
    slots = [it.new_slot() for _ in range(3)]
    it.load(slots[1], first, labels)
    slots[1]["out"].copy_(out)
    enabled = graph_safe(X)
    replays = {}

    def queue(i):  # step i + 1 from step i's slot
        key = (i % 3, (i + 1) % 3)
        if key not in replays:
            replays[key] = _Replay(lambda a=slots[key[0]], b=slots[key[1]]: it.step_into(a, b), enabled)
            replays[key].capture_after = _LLOYD_CAPTURE_AFTER
        replays[key]()

    converged, strict, n_iter = False, False, 0
    prev_centers = centers
    # one pinned buffer for every step's scalars: each fetch is read before the next
    pinned = torch.empty(4, dtype=_F64, pin_memory=True) if X.device.type == "cuda" else None
    for i in range(max_iter):
        cur = slots[(i + 1) % 3]  # step i + 1's results
        fetch = _Fetch(cur["out"], pinned)
        queued = i + 1 < max_iter
        if queued:
            queue(i + 1)  # speculative: its results are ignored if unused
        empty, shift_sq, inertia_old, changed = fetch.get()
        same = i > 0 and changed == 0
        if empty:
            new, shift_sq, inertia_old = _lloyd_update(X, cur["labels"].long(), prev_centers, sample_weight)
            it.load(cur, new)
            if queued:
                queue(i + 1)  # again, from the relocated centres
        n_iter = i + 1
        converged, strict = _lloyd_stop(i, inertia_old, shift_sq, same, tol_abs, verbose, history, t0)
        if converged:
            break
        prev_centers = cur["C"]
    cur = slots[n_iter % 3]
    return cur["C"].clone(), cur["labels"].clone(), n_iter, converged, strict


def _lloyd_design(X, K, backend):
    """``X``, or its aligned-rows copy where the fused Lloyd step reads it (:func:`_base.aligned_copy`).

    Rows over 64 bytes that are not whole 16-byte vectors cost the fused Lloyd step a third (H100,
    2M x 31, K = 32: 1.46 -> 0.934 ms on the copy; 1M x 61, K = 64: 2.41 -> 1.59), against a copy of
    ~0.18 ms (``gmm_odd_width_probe-H100-*-s42``). Narrower rows gain 0-7 % a step (4M x 15, K = 16:
    0.365 -> 0.339; 4M x 13, K = 8 2 %; 4M x 6, K = 8 nothing), and whole fits of a few steps lost
    0.4-0.7 ms with the copy (``gmm_odd_width_fits-H100-*-s44``), so they read X as it is. The GMM
    E-step gained nothing consistent, so EM reads X as it is.
    """
    if backend != "fused" or not isinstance(X, torch.Tensor) or X.dtype == _F64 \
            or X.shape[-1] * X.element_size() <= NARROW_ROW_BYTES:
        return X
    from fusedml.kmeans import lloyd_plan

    if lloyd_plan(X.shape[0], X.shape[1], K, X.device) is None:
        return X  # the operator-level step
    return aligned_copy(X, backend)


def _lloyd(X, centers, max_iter, tol_abs, backend, verbose=0, t0=None, history=None, sample_weight=None,
           with_inertia=True):
    """One Lloyd run, as scikit-learn's ``_kmeans_single_lloyd``.

    Per iteration: one assignment pass (:func:`_assign`) and one update pass (weighted by
    ``sample_weight`` [N] float64, or unweighted if None; the assignment never depends on it).
    With ``backend="fused"`` on an in-memory float32/16 tensor both run as ONE pass and the
    centre update on the device (:class:`fusedml.kmeans.LloydIterations`: no ``[N, K]``, no
    contended atomics, two launches per iteration, the next step queued before the host reads
    this one's scalars: :func:`_lloyd_fused_loop`).

    ``with_inertia=False`` skips the final inertia pass (None is returned in its place: the
    GaussianMixture initialisation needs only the labels and centres).

    Returns
    -------
    tuple
        ``(centers [K, D] float64, labels [N] int64, inertia, n_iter, converged)``.
    """
    t0 = time.perf_counter() if t0 is None else t0
    labels_old = None
    strict = converged = False
    n_iter = 0
    fused = backend == "fused" and isinstance(X, torch.Tensor) and X.dtype != _F64
    if fused:
        from fusedml.kmeans import LloydIterations, lloyd_plan

        fused = lloyd_plan(X.shape[0], X.shape[1], centers.shape[0], X.device) is not None
    if fused:  # shift: any central point (the initial centres' mean): no extra pass over X
        it = LloydIterations(X, sample_weight, centers.to(_F64).mean(0), centers.shape[0])
        centers, labels, n_iter, converged, strict = _lloyd_fused_loop(
            it, X, centers, max_iter, tol_abs, verbose, t0, history, sample_weight)
    for i in range(0 if fused else max_iter):
        labels = _assign(X, centers, backend)
        new, shift_sq, inertia_old = _lloyd_update(X, labels, centers, sample_weight)
        centers = new
        n_iter = i + 1
        same = labels_old is not None and torch.equal(labels, labels_old)
        converged, strict = _lloyd_stop(i, inertia_old, shift_sq, same, tol_abs, verbose, history, t0)
        if converged:
            break
        labels_old = labels
    if not strict:  # labels consistent with the final centres
        labels = _assign(X, centers, backend)
    labels = labels.long()
    inertia = _inertia(X, labels, centers, sample_weight) if with_inertia else None
    return centers, labels, inertia, n_iter, converged


# ----------------------------------------------------------------------------------------------
# the EM iterations (host M-step, or everything queued on the device)
# ----------------------------------------------------------------------------------------------
class _EMLog:
    """An EM run's lower bounds, ``history_`` rows, verbose lines and stopping rule
    (scikit-learn's: ``|change| < tol``)."""

    def __init__(self, est, lower_bound, t0):
        self.est, self.lower_bound, self.t0 = est, lower_bound, t0
        self.start_bound = lower_bound
        self.lbs, self.hist, self.converged = [], [], False
        self.t_iter = time.perf_counter()

    def restart(self):
        """Forget every iteration (a run started over from its initial parameters)."""
        self.lower_bound, self.converged = self.start_bound, False
        self.lbs.clear()
        self.hist.clear()

    def step(self, n_iter, log_likelihood, can_stop=True):
        """Record iteration ``n_iter``'s mean log-likelihood; True when the run stops there
        (never where ``can_stop`` is False: a change measured across precisions)."""
        est = self.est
        prev, self.lower_bound = self.lower_bound, log_likelihood
        change = self.lower_bound - prev
        now = time.perf_counter()
        self.lbs.append(self.lower_bound)
        self.hist.append({"iter": n_iter, "objective": self.lower_bound, "grad_norm": float("nan"),
                          "step": change, "time": now - self.t0})
        if est.verbose >= 1 and n_iter % est.verbose_interval == 0:
            print(f"  Iteration {n_iter}" if est.verbose == 1 else
                  f"  Iteration {n_iter}\t time lapse {now - self.t_iter:.5f}s\t ll change {change:.5f}")
        self.t_iter = now
        self.converged = can_stop and abs(change) < est.tol
        return self.converged


def _fp32_quad(params, covariance_type) -> float:
    """:func:`fusedml.gmm._prep.fp32_quad` of diag / spherical parameters ``(w, m, cov, pc)``."""
    from fusedml.gmm._prep import shifted_quad

    w, m, _, pc = (torch.as_tensor(t, dtype=_F64) for t in params)
    return float(shifted_quad(m - (w[:, None] * m).sum(0), pc, covariance_type))


#: Resolution of an fp32 E-step's mean log-likelihood, relative to ``1 + |lower bound|`` (the
#: per-row terms' fp32 rounding; changes jittered by ~1e-7 at a lower bound of -4.6, fuzz case
#: fit:30436). A stopping test with ``tol`` below it is decided on float64 E-steps.
_FP32_LB_NOISE = 2.0 ** -20


def _below_fp32_noise(tol, change, lower_bound) -> bool:
    """Whether an fp32 lower bound's ``|change| < tol`` is within its rounding (``tol`` too small)."""
    return abs(change) < tol < _FP32_LB_NOISE * (1.0 + abs(lower_bound))


def _em_host(est, X, params, sw, total_weight, log, backend, host_mstep, start=1, fp64=False):
    """EM iterations through :func:`fusedml.gmm_estep` and :func:`fusedml.gmm.gmm_mstep`.

    With ``host_mstep`` each E-step's log-likelihood and statistics reach the host in one copy and
    the M-step runs there, so the next E-step's parameters are host arrays (no further sync).
    When an fp32 E-step's M-step fails (ill-conditioned second moments, e.g. tight clusters far
    apart) or, diag / spherical, puts a component beyond :data:`fusedml.gmm._prep.FP32_QUAD_LIMIT`
    (its data lie far from the shift in their own spread, so the fp32 second moments lost digits),
    that E-step and the rest of the run are computed in float64 (``precision="fp64"``), with a
    warning; a failure in float64 raises. A ``tol`` below the fp32 lower bound's rounding
    (:data:`_FP32_LB_NOISE`) is tested on float64 E-steps: where an fp32 change falls under it, the
    run goes on in float64 and stops on float64 changes only. ``start`` / ``fp64``: iterations
    from ``start`` (the device loop's hand-over), in float64 from the first.
    Returns ``(weights, means, covariances, precisions_cholesky, n_iter)``.
    """
    from fusedml.gmm._prep import FP32_QUAD_LIMIT

    gmm = _gmm_ops()
    ct = est.covariance_type
    w, m, cov, pc = params
    prec = "fp64" if fp64 else "auto"
    mixed = start if fp64 else 0  # an iteration whose change spans two precisions cannot stop the run
    # fp32 statistics (the fused kernels; ops on data below float64): a failed M-step is redone in
    # float64. ops on float64 data computes in float64 (the fp32 stopping rule cost it 2 iterations)
    check = backend == "fused" or (backend != "cpu" and getattr(X, "dtype", None) != torch.float64)
    quad = check and ct in ("diag", "spherical")  # and fp32 distances about one shift (FP32_QUAD_LIMIT)

    def estep(prec):
        st = gmm.gmm_estep(X, w, m, pc, ct, sample_weight=sw, backend=backend, precision=prec, check_finite=False,
                           check_params=not _TRUSTED_ESTEP)  # the parameters: checked at fit or made by gmm_mstep
        return st.to("cpu") if host_mstep else st  # the log-likelihood and statistics in one copy

    def to_fp64(what):
        warn_user(f"GaussianMixture: {what}; fp32 distances and second moments lose digits there, so "
                  "the fit runs in float64 from here (slower)", RuntimeWarning)
        return "fp64"

    if quad and prec != "fp64" and not _fp32_quad(params, ct) <= FP32_QUAD_LIMIT:
        prec = to_fp64("the initial parameters put a component far from the mixture mean in its own spread")
    n_iter = start - 1
    for n_iter in range(start, est.max_iter + 1):
        stats = estep(prec)
        try:
            out = gmm.gmm_mstep(stats, reg_covar=est.reg_covar)
        except ValueError:  # ill-defined covariances: final unless fp32 statistics may be the cause
            if not check or prec == "fp64":
                raise
            out = None
        if check and prec != "fp64" and (out is None or quad and not _fp32_quad(out, ct) <= FP32_QUAD_LIMIT):
            prec = to_fp64(f"iteration {n_iter}'s fp32 statistics gave " + (
                "a failed M-step" if out is None else "a component far from the mixture mean in its own spread"))
            stats = estep(prec)
            out = gmm.gmm_mstep(stats, reg_covar=est.reg_covar)  # raises when ill-defined in float64 too
            mixed = n_iter
        ll = float(stats.log_likelihood) / total_weight
        if check and prec != "fp64" and _below_fp32_noise(est.tol, ll - log.lower_bound, ll):
            prec, mixed = "fp64", n_iter + 1  # this change and the next span fp32 rounding
        w, m, cov, pc = out
        if log.step(n_iter, ll, can_stop=n_iter > mixed):
            break
    return w, m, cov, pc, n_iter


#: True: the host loop's E-steps skip the full check of parameters that ``fit`` checked or
#: ``gmm_mstep`` made (``gmm_estep(check_params=False)``, ~0.15-0.2 ms of host time each); False:
#: every E-step checks them in full (A/B runs)
_TRUSTED_ESTEP = True

#: None: the device EM loop wherever it applies (:func:`_device_em_applies`); True: also on the
#: CPU under the interpreter (tests); False: never (``FUSEDML_DEVICE_EM=0`` too, for A/B runs)
_DEVICE_EM = None
#: calls of each parity's iteration before its CUDA graph is captured (2: iterations 1-4 eager,
#: 5-6 capture, 7+ replay; a capture costs ~1 ms of host time, a replay saves ~0.3-0.5 ms)
_EM_CAPTURE_AFTER = 2


def _device_em_applies(X, covariance_type, backend) -> bool:
    """Whether ``GaussianMixture`` runs its EM iterations with :func:`_em_device`: the fused backend,
    diag or spherical covariances, X an in-memory tensor on a GPU (or anywhere when forced)."""
    if _DEVICE_EM is False or os.environ.get("FUSEDML_DEVICE_EM", "1") == "0":
        return False
    if backend != "fused" or covariance_type not in ("diag", "spherical") or not isinstance(X, torch.Tensor):
        return False
    return _DEVICE_EM is True or X.device.type == "cuda"


def _em_device(est, X, params, sw, total_weight, log, backend, host_mstep):
    """EM iterations queued on X's device, one iteration ahead of the host's stopping test.

    Iteration ``i`` reads the parameters and their kernel operands in buffer ``(i - 1) % 2`` and
    writes the next ones, with its log-likelihood and M-step failure flag, into the other: the
    E-step (:func:`fusedml.gmm.fused.estep_device`, two launches) and one launch for the M-step
    and the next operands (:func:`fusedml.gmm.fused.mstep_operands`; torch ops where the padded
    K x D exceeds its one program). Nothing synchronises the host inside an iteration, so
    iteration ``i + 1`` is queued before the host reads iteration ``i``'s scalars and the GPU
    never waits for the host's decision; when iteration ``i`` stops the run, the speculative one
    is not used (it wrote the other buffer). Each parity's iteration is replayed from a CUDA graph
    after ``_EM_CAPTURE_AFTER`` calls (``algorithms._solvers._Replay``). The iterates are those of
    :func:`_em_host` up to float64 rounding (the operands are derived on the device).
    """
    from algorithms._solvers import _Replay, graph_safe
    from fusedml.gmm import mstep_tensors
    from fusedml.gmm._prep import FP32_QUAD_LIMIT, shifted_quad
    from fusedml.gmm.fused import device_operands, estep_device, mstep_operands, mstep_operands_applies

    ct = est.covariance_type
    dev, f64 = X.device, torch.float64
    names = ("weights", "means", "covariances", "precisions_cholesky")
    first = {n: t.to(device=dev, dtype=f64).clone() for n, t in zip(names, params)}
    first.update(device_operands(X, first["weights"], first["means"], first["precisions_cholesky"], ct))
    # the fp32 kernels' accuracy (fusedml.gmm._prep.fp32_unsafe): parameters far from their
    # mixture mean in their own precision run on the host loop, in float64
    if float(shifted_quad(first["CP"], first["precisions_cholesky"], ct)) > FP32_QUAD_LIMIT:
        return _em_host(est, X, params, sw, total_weight, log, backend, host_mstep)
    first["scal"] = torch.zeros(3, dtype=f64, device=dev)  # (log-likelihood, M-step failed, next fp32_quad)
    bufs = [first, {n: torch.empty_like(t) for n, t in first.items()}]
    reg = torch.full((1,), float(est.reg_covar), dtype=f64, device=dev)
    K, D = first["means"].shape
    one_launch = mstep_operands_applies(K, D, ct)
    sw32 = None if sw is None else sw.to(torch.float32).contiguous()
    cuda = dev.type == "cuda"
    pinned = torch.empty((2, 3), dtype=f64, pin_memory=True) if cuda else None

    def iteration(src, dst):
        def fn():
            stats = estep_device(X, src["weights"], src["means"], src["precisions_cholesky"], ct,
                                 sample_weight=sw32, ops=src)
            if one_launch:
                mstep_operands(stats, src["means"], reg, ct, X.dtype, dst)
                return
            out = mstep_tensors(ct, stats[1], src["means"], stats[2], stats[3], reg[0])
            for n, o in zip(names, out[:4]):
                dst[n].copy_(o)
            for n, o in device_operands(X, *(dst[n] for n in ("weights", "means", "precisions_cholesky")), ct).items():
                dst[n].copy_(o)
            dst["scal"][0].copy_(stats[0])
            dst["scal"][1].copy_(out[4])
            dst["scal"][2].copy_(shifted_quad(dst["CP"], dst["precisions_cholesky"], ct))
        return fn

    steps = [_Replay(iteration(bufs[0], bufs[1]), cuda and graph_safe(X)),
             _Replay(iteration(bufs[1], bufs[0]), cuda and graph_safe(X))]
    for r in steps:
        r.capture_after = _EM_CAPTURE_AFTER

    def queue(i):  # iteration i (1-based); its scalars' fetch
        steps[(i - 1) % 2]()
        return _Fetch(bufs[i % 2]["scal"], pinned[i % 2] if cuda else None)

    n_iter = 0
    nxt = queue(1) if est.max_iter >= 1 else None
    for n_iter in range(1, est.max_iter + 1):
        fetch, nxt = nxt, (queue(n_iter + 1) if n_iter < est.max_iter else None)
        ll, bad, quad = fetch.get()
        lb = ll / total_weight
        if bad or not quad <= FP32_QUAD_LIMIT:
            # a failed M-step, or parameters beyond fp32's accuracy (this iteration's fp32 statistics
            # may be what failed): the run starts over on the host loop, which redoes such an
            # iteration in float64 (and raises if it fails there too); rare, and the same iterates.
            # Tested first: the host loop redoes this iteration even where its change is also
            # within the fp32 rounding below
            log.restart()
            return _em_host(est, X, params, sw, total_weight, log, backend, host_mstep)
        if _below_fp32_noise(est.tol, lb - log.lower_bound, lb):
            # a stop within the fp32 lower bound's rounding: float64 E-steps from iteration n_iter's
            # output on (its input was overwritten by the queued iteration n_iter + 1)
            log.step(n_iter, lb, can_stop=False)
            params = tuple(bufs[n_iter % 2][n].clone() for n in names)
            return _em_host(est, X, params, sw, total_weight, log, backend, host_mstep, start=n_iter + 1, fp64=True)
        if log.step(n_iter, lb):
            break
    return tuple(bufs[n_iter % 2][n].clone() for n in names) + (n_iter,)


# ----------------------------------------------------------------------------------------------
# GMM initial statistics (responsibilities never materialised for the whole data)
# ----------------------------------------------------------------------------------------------
def _zeros_s2(covariance_type, K, D, device):
    shape = {"full": (K, D, D), "tied": (D, D), "diag": (K, D), "spherical": (K,)}[covariance_type]
    return torch.zeros(shape, dtype=_F64, device=device)


def _make_stats(covariance_type, nk, center, s1, s2):
    return _gmm_ops().GMMStats(covariance_type=covariance_type,
                               log_likelihood=torch.zeros((), dtype=_F64, device=nk.device),
                               log_prob=None, nk=nk, center=center, s1=s1, s2=s2)


def _hard_stats(X, labels, K, center, covariance_type, sample_weight=None):
    """float64 statistics of one-hot responsibilities ``r_nk = [l_n == k]`` about ``center`` [K, D].

    One blocked pass of per-label sums (:class:`_Segments`; ``X`` may be a tensor or a streamed
    matrix), each row weighted by ``sample_weight`` ([N] float64; ones if None).
    """
    D = X.shape[1]
    c64 = center.to(_F64)
    dev = c64.device
    s1 = torch.zeros((K, D), dtype=_F64, device=dev)
    s2 = _zeros_s2(covariance_type, K, D, dev)

    # full: scatter the [B, D, D] outer products (K > D), or the one-hot product
    # (onehot (x) d)^T d with a [B, K, D] temporary (K <= D): one GEMM instead of B*D*D temporaries
    outer = covariance_type == "full" and K > D

    nk = torch.zeros(K, dtype=_F64, device=dev)

    def block(Xb, rows):
        lab = labels[rows]
        seg = _Segments(lab, K)
        seg.count_(nk, None if sample_weight is None else sample_weight[rows])
        d = Xb.to(_F64) - c64[lab]  # [B, D]
        sd = d if sample_weight is None else d * sample_weight[rows, None]  # s_n (x_n - c)
        seg.add_(s1, sd)
        if covariance_type == "full":
            if outer:
                seg.add_(s2, sd[:, :, None] * d[:, None, :])
            else:
                rd = torch.zeros((d.shape[0], K, D), dtype=_F64, device=dev)
                rd[torch.arange(d.shape[0], device=dev), lab] = sd  # [B, K, D]
                s2.add_((rd.reshape(d.shape[0], K * D).T @ d).view(K, D, D))
        elif covariance_type == "tied":
            s2.add_(sd.T @ d)
        elif covariance_type == "diag":
            seg.add_(s2, sd * d)
        else:
            seg.add_(s2, (sd * d).sum(1))

    _for_rows(X, block, ((D * D if outer else K * D) if covariance_type == "full" else D) + K)
    return _make_stats(covariance_type, nk, c64, s1, s2)


def _random_resp_stats(X, K, random_state, covariance_type, sample_weight=None):
    """float64 statistics of scikit-learn's ``init_params="random"`` responsibilities.

    ``resp = uniform(size=(N, K))`` in X's dtype, normalised by rows, times ``sample_weight``
    ([N] float64, if given), accumulated about the data mean. In-memory data: drawn block by block in row order from the RandomState (the same
    numbers as one ``(N, K)`` draw). Streamed data: the ``(N, K)`` draw is made once on the host
    (blocks may arrive out of row order).
    """
    N, D = X.shape
    np_dtype = _np_dtype(X)
    mean = _data_mean(X)
    dev = mean.device
    nk = torch.zeros(K, dtype=_F64, device=dev)
    s1 = torch.zeros((K, D), dtype=_F64, device=dev)
    s2 = _zeros_s2(covariance_type, K, D, dev)
    pre = random_state.uniform(size=(N, K)).astype(np_dtype) if _is_streamed(X) else None

    def block(Xb, rows):
        if pre is None:
            r = random_state.uniform(size=(rows.stop - rows.start, K)).astype(np_dtype)
        else:
            r = pre[rows].copy()
        r /= r.sum(axis=1)[:, None]
        r = torch.from_numpy(r).to(device=dev, dtype=_F64)
        if sample_weight is not None:
            r = r * sample_weight[rows, None]
        d = Xb.to(_F64) - mean  # [B, D]
        nk.add_(r.sum(0))
        s1.add_(r.T @ d)
        if covariance_type == "full":  # (r (x) d)^T d: a [B, K, D] temporary, one GEMM
            s2.add_(((r[:, :, None] * d[:, None, :]).reshape(-1, K * D).T @ d).view(K, D, D))
        elif covariance_type == "tied":
            s2.add_((d * r.sum(1)[:, None]).T @ d)
        elif covariance_type == "diag":
            s2.add_(r.T @ (d * d))
        else:
            s2.add_(r.T @ (d * d).sum(1))

    _for_rows(X, block, 2 * K * D + K)
    return _make_stats(covariance_type, nk, mean.expand(K, D).contiguous(), s1, s2)


def _flipudlr(a):
    return torch.flip(a, dims=(-2, -1))


def _prec_chol_from_precisions(P, covariance_type):
    """scikit-learn's ``_compute_precision_cholesky_from_precisions`` (upper ``U``, ``P = U U^T``)."""
    if covariance_type in ("full", "tied"):
        return _flipudlr(torch.linalg.cholesky(_flipudlr(P)))
    return torch.sqrt(P)


def _precisions_from_chol(pc, covariance_type):
    if covariance_type in ("full", "tied"):
        return pc @ pc.transpose(-1, -2)
    return pc * pc


def _covariances_from_precisions(P, covariance_type):
    if covariance_type in ("full", "tied"):
        return torch.linalg.inv(P)
    return 1.0 / P


def _weighted_log_prob_block(Xb, weights, means, prec_chol, covariance_type):
    """``[B, K]`` float64 ``log pi_k + log N(x_b | mu_k, Sigma_k)`` for one row block.

    scikit-learn's formula, used only where an ``N x K`` output is the definition
    (``predict_proba``); it works on ``x - mu_k`` so data far from the origin does not cancel.
    """
    D = Xb.shape[1]
    diff = Xb.to(_F64)[:, None, :] - means[None, :, :]  # [B, K, D]
    if covariance_type == "full":
        y = torch.einsum("bkd,kde->bke", diff, prec_chol)
        maha = (y * y).sum(-1)
        log_det = torch.log(torch.diagonal(prec_chol, dim1=-2, dim2=-1)).sum(-1)
    elif covariance_type == "tied":
        y = diff @ prec_chol
        maha = (y * y).sum(-1)
        log_det = torch.log(torch.diagonal(prec_chol)).sum()
    elif covariance_type == "diag":
        y = diff * prec_chol[None]
        maha = (y * y).sum(-1)
        log_det = torch.log(prec_chol).sum(-1)
    else:
        maha = (diff * diff).sum(-1) * (prec_chol * prec_chol)[None]
        log_det = D * torch.log(prec_chol)
    return -0.5 * (D * math.log(2 * math.pi) + maha) + log_det + torch.log(weights)


# ----------------------------------------------------------------------------------------------
# KMeans
# ----------------------------------------------------------------------------------------------
class KMeans(BaseEstimator):
    """K-means clustering by Lloyd's algorithm with a fused assignment step.

    Same algorithm as scikit-learn's ``KMeans(algorithm="lloyd")``: tolerance
    ``tol * mean(var(X, axis=0))`` on the squared centre shift, strict convergence when the labels
    stop changing, empty clusters relocated to the farthest points, ``n_init`` runs keeping the
    lowest inertia. The assignment is :func:`fusedml.gmm_score` (equal weights, unit spherical
    precision: the arg-max component is the nearest centre), so no ``N x K`` matrix is formed;
    the centre update is one pass of per-label sums (``index_add_`` on CUDA).

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters ``K``.
    init : {"k-means++", "random"} or array-like of shape (n_clusters, n_features)
        Seeding: scikit-learn's greedy k-means++ (on the device, float64 distances), ``K``
        distinct random rows, or explicit centres (then ``n_init`` is forced to 1 with a warning,
        as scikit-learn).
    n_init : int, default=1
        Number of seeded runs; the lowest inertia wins.
    max_iter : int, default=300
        Maximum Lloyd iterations per run.
    tol : float, default=1e-4
        Relative tolerance on the squared centre shift (times the mean feature variance).
    random_state : None, int or numpy.random.RandomState
        Seeding randomness (consumed exactly as scikit-learn consumes it).
    backend : {"auto", "fused", "ops", "cpu"}
        Backend of the assignment step (:func:`fusedml.resolve_backend`).
    verbose : int, default=0
        Print per-iteration inertia.

    Attributes
    ----------
    cluster_centers_ : array of shape (n_clusters, n_features)
    labels_ : array of shape (n_samples,), int64
    inertia_ : float
        Sum of squared distances of the samples to their closest centre.
    n_iter_ : int
        Lloyd iterations of the best run.
    converged_ : bool
    n_features_in_ : int
    history_ : list of dict
        Best run: ``iter``, ``objective`` (inertia w.r.t. the centres the assignment used),
        ``grad_norm`` (NaN: not defined), ``step`` (squared centre shift), ``time`` (seconds).

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms.mixture import KMeans
    >>> X = np.r_[np.zeros((5, 2)), np.ones((5, 2)) * 10]
    >>> km = KMeans(2, random_state=0, backend="cpu").fit(X)
    >>> sorted(km.cluster_centers_[:, 0].tolist())
    [0.0, 10.0]
    """

    _fitted_attr = "cluster_centers_"

    def __init__(self, n_clusters=8, *, init="k-means++", n_init=1, max_iter=300, tol=1e-4,
                 random_state=None, backend="auto", verbose=0):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.backend = backend
        self.verbose = verbose

    def __sklearn_tags__(self):
        """Tags for scikit-learn >= 1.6 (a clusterer and a transformer that keeps float32 / float64;
        no target)."""
        from sklearn.utils import TransformerTags  # only scikit-learn asks for tags

        tags = _unsupervised_tags(super().__sklearn_tags__(), "clusterer")
        tags.transformer_tags = TransformerTags(preserves_dtype=["float64", "float32"])
        return tags

    def _check_params(self):
        for name in ("n_clusters", "n_init", "max_iter"):
            _check_int(getattr(self, name), name, 1)
        check_verbose(self.verbose)
        if isinstance(self.tol, bool) or not isinstance(self.tol, numbers.Real) or not self.tol >= 0:
            raise ValueError(f"tol must be a float >= 0, got {self.tol!r}")
        if isinstance(self.init, str) and self.init not in ("k-means++", "random"):
            raise ValueError(f"init must be 'k-means++', 'random' or an array of centres, got {self.init!r}")

    def fit(self, X, y=None, sample_weight=None):
        """Cluster ``X``.

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
            Dense data.
        y : ignored
        sample_weight : array-like of shape (n_samples,) or scalar, optional
            Non-negative, finite, not all zero (``ValueError`` otherwise). As scikit-learn: the
            centres are weighted means, ``inertia_`` is weighted, k-means++ samples the first
            centre with ``p = s / sum(s)`` and candidates by ``s``-weighted D^2, ``init="random"``
            draws rows with ``p = s / sum(s)``; the tolerance stays unweighted.

        Returns
        -------
        self
        """
        self._check_params()
        X, info = _as_data(X, "KMeans", self.backend)
        N, D = X.shape
        K = self.n_clusters
        if N < K:
            raise ValueError(f"n_samples={N} should be >= n_clusters={K}")
        sw = _sample_weight(sample_weight, info)
        backend = resolve_backend(self.backend, info.device)
        X = _lloyd_design(X, K, backend)  # every pass of the fit reads it; the same values
        rs = _check_random_state(self.random_state)
        n_init = self.n_init
        init_centers = None
        if not isinstance(self.init, str):
            init_centers = _param_tensor(self.init, "init", info.device)
            if tuple(init_centers.shape) != (K, D):
                raise ValueError(f"init centres must have shape (n_clusters, n_features) = {(K, D)}, "
                                 f"got {tuple(init_centers.shape)}")
            check_finite(init_centers, "init")
            if n_init != 1:
                warn_user(f"Explicit initial center position passed: performing only one init in "
                          f"KMeans instead of n_init={n_init}.", RuntimeWarning)
                n_init = 1
        tol_abs = _kmeans_tolerance(X, self.tol)
        t0 = time.perf_counter()
        best = None
        for _ in range(n_init):
            if init_centers is not None:
                c0 = init_centers
            elif self.init == "k-means++":
                c0 = _take_rows(X, _kmeans_plusplus(X, K, rs, sw, backend))
            else:
                c0 = _take_rows(X, _random_rows(N, K, rs, _np_dtype(X), sw))
            hist = []
            res = _lloyd(X, c0, self.max_iter, tol_abs, backend, self.verbose, t0, hist, sw)
            if best is None or res[2] < best[0][2]:
                best = (res, hist)
        (centers, labels, inertia, n_iter, converged), hist = best
        n_distinct = int(torch.unique(labels).numel())
        if n_distinct < K:
            warn_user(f"Number of distinct clusters ({n_distinct}) found smaller than n_clusters ({K}). "
                      "Possibly due to duplicate points in X.", sklearn_class(ConvergenceWarning))
        if not converged:
            warn_user(f"KMeans did not converge within max_iter={self.max_iter} iterations; "
                      "increase max_iter or tol.", sklearn_class(ConvergenceWarning))
        self.cluster_centers_ = _out(centers, info.kind, info.dtype)
        self.labels_ = _out(labels, info.kind)
        self.inertia_ = inertia
        self.n_iter_ = n_iter
        self.converged_ = converged
        record_features(self, info)
        self.history_ = hist
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return ``labels_``.

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,) or scalar, optional
            As in :meth:`fit`.

        Returns
        -------
        labels : array of shape (n_samples,), int64
        """
        return self.fit(X, sample_weight=sample_weight).labels_

    def _check_fitted_X(self, X):
        X, info = _fitted_data(self, X, "KMeans")
        centers = _param_tensor(self.cluster_centers_, "cluster_centers_", info.device)
        return X, info, centers, resolve_backend(self.backend, info.device)

    def predict(self, X):
        """Index of the nearest centre of every row (fused, no ``N x K``).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        labels : array of shape (n_samples,), int64
        """
        X, info, centers, backend = self._check_fitted_X(X)
        return _out(_assign(X, centers, backend), info.kind)

    def transform(self, X):
        """Distances from every row to every centre (scikit-learn's ``KMeans.transform``).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
            ``||x_n - c_k||``, computed in float64 about the centres' mean (no cancellation for
            data far from the origin), returned in X's floating dtype (float64 for integers).
        """
        X, info, centers, _ = self._check_fitted_X(X)
        d2 = _sq_dist_to_rows(X, centers, centers.mean(0))  # [K, N]
        return _out(d2.T.sqrt(), info.kind, dtype=info.dtype)

    def get_feature_names_out(self, input_features=None):
        """Names of :meth:`transform`'s columns, as scikit-learn's: ``kmeans0`` ... ``kmeans{K-1}``.

        Parameters
        ----------
        input_features : ignored
            Accepted for scikit-learn's pipelines.

        Returns
        -------
        numpy.ndarray of str objects, shape (n_clusters,)
        """
        self._check_is_fitted()
        return np.asarray([f"kmeans{k}" for k in range(len(self.cluster_centers_))], dtype=object)

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit, then :meth:`transform` ``X``.

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,) or scalar, optional
            As in :meth:`fit`.

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the (weighted) inertia of ``X`` under the fitted centres (scikit-learn's).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,) or scalar, optional
            Validated as in :meth:`fit`.

        Returns
        -------
        float
            ``-sum_n s_n min_k ||x_n - c_k||^2`` (``s_n = 1`` if None).
        """
        X, info, centers, backend = self._check_fitted_X(X)
        sw = _sample_weight(sample_weight, info)
        return -_inertia(X, _assign(X, centers, backend), centers, sw)


# ----------------------------------------------------------------------------------------------
# GaussianMixture
# ----------------------------------------------------------------------------------------------
class GaussianMixture(BaseEstimator):
    """Gaussian mixture model fitted by EM, one fused data pass per iteration.

    The EM loop, the parameters, their shapes and the initialisation are scikit-learn's
    ``GaussianMixture``; the E-step is :func:`fusedml.gmm_estep` (log-likelihood and sufficient
    statistics in one pass, no ``N x K`` matrix) and the M-step :func:`fusedml.gmm_mstep`.

    Parameters
    ----------
    n_components : int, default=1
        Number of mixture components ``K``.
    covariance_type : {"full", "tied", "diag", "spherical"}, default="full"
        Covariance parametrisation (shapes as scikit-learn: ``[K, D, D]``, ``[D, D]``, ``[K, D]``,
        ``[K]``).
    tol : float, default=1e-3
        Convergence threshold on the change of the mean log-likelihood.
    reg_covar : float, default=1e-6
        Added to the covariance diagonals.
    max_iter : int, default=100
        EM iterations per initialisation (0: only initialise).
    n_init : int, default=1
        Initialisations; the best lower bound is kept.
    init_params : {"kmeans", "k-means++", "random", "random_from_data"}, default="kmeans"
        Initial responsibilities (see the module docstring). ``"kmeans"`` runs :class:`KMeans`
        (fused assignment) on the same device and backend.
    weights_init : array-like of shape (n_components,), optional
    means_init : array-like of shape (n_components, n_features), optional
    precisions_init : array-like, optional
        Shape as ``precisions_`` for ``covariance_type``.
    random_state : None, int or numpy.random.RandomState
        Initialisation randomness (consumed as scikit-learn consumes it) and ``sample``.
    warm_start : bool, default=False
        Reuse the fitted parameters as the start of the next ``fit`` (then ``n_init`` is 1).
    backend : {"auto", "fused", "ops", "cpu"}
        Backend of every data pass (:func:`fusedml.resolve_backend`).
    verbose : int, default=0
        1: initialisations and iterations every ``verbose_interval``; 2: also time and change.
    verbose_interval : int, default=10
        Iterations between progress lines.

    Attributes
    ----------
    weights_ : array of shape (n_components,)
    means_ : array of shape (n_components, n_features)
    covariances_, precisions_, precisions_cholesky_ : arrays
        Shapes by ``covariance_type`` as scikit-learn (``precisions_cholesky_`` is the upper
        factor ``U`` with ``precision = U U^T``).
    converged_ : bool
    n_iter_ : int
    lower_bound_ : float
        Mean log-likelihood (of the parameters entering the last iteration, as scikit-learn).
    lower_bounds_ : list of float
        Lower bound per iteration of the best initialisation.
    n_features_in_ : int
    history_ : list of dict
        Best initialisation: ``iter``, ``objective`` (lower bound), ``grad_norm`` (NaN: EM has
        none), ``step`` (change of the lower bound), ``time`` (seconds since fit started).

    Notes
    -----
    ``predict_proba`` returns an ``N x K`` matrix by definition: it is computed in row blocks from
    :func:`fusedml.gmm_score`'s per-row log-likelihood and per-block component log-densities.

    ``fit(X, sample_weight=s)`` (scikit-learn's ``GaussianMixture`` has no sample weights; this is
    the weighted likelihood ``sum_n s_n log p(x_n)``): every E-step passes ``s`` to
    :func:`fusedml.gmm_estep` (dask input: sliced per block by the streamed hook), the M-step is
    unchanged, ``lower_bound_`` is ``sum_n s_n log p(x_n) / sum_n s_n``. Initialisation with
    weights: ``"kmeans"`` runs weighted :class:`KMeans` (weighted k-means++ and Lloyd) and takes
    weighted statistics of its labels; ``"random"`` weights the random responsibilities by ``s``;
    ``"random_from_data"`` draws its ``K`` rows with ``p = s / sum(s)`` (constant weights: the
    unweighted draw, so they give the unweighted start) and ``"k-means++"`` by
    weighted k-means++, after which the start is the one of those rows (the weights only choose
    them). Explicit ``*_init`` parameters are used as given. ``score``, ``bic``, ``aic`` take no
    weights (as scikit-learn).

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms.mixture import GaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> X = np.r_[rng.normal(0, 1, (50, 2)), rng.normal(8, 1, (50, 2))]
    >>> gm = GaussianMixture(2, random_state=0, backend="cpu").fit(X)
    >>> gm.means_.shape
    (2, 2)
    """

    _fitted_attr = "means_"

    def __init__(self, n_components=1, *, covariance_type="full", tol=1e-3, reg_covar=1e-6,
                 max_iter=100, n_init=1, init_params="kmeans", weights_init=None, means_init=None,
                 precisions_init=None, random_state=None, warm_start=False, backend="auto",
                 verbose=0, verbose_interval=10):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.warm_start = warm_start
        self.backend = backend
        self.verbose = verbose
        self.verbose_interval = verbose_interval

    def __sklearn_tags__(self):
        """Tags for scikit-learn >= 1.6 (a density estimator; no target)."""
        return _unsupervised_tags(super().__sklearn_tags__(), "density_estimator")

    # -- validation --------------------------------------------------------------------------
    def _check_parameters(self, D, device):
        """Validate hyper-parameters and the ``*_init`` arrays (scikit-learn's checks).

        Returns
        -------
        tuple
            ``(weights_init, means_init, precisions_init)`` as float64 tensors on ``device``
            (None where not given).
        """
        for name, lo in (("n_components", 1), ("max_iter", 0), ("n_init", 1), ("verbose_interval", 1)):
            _check_int(getattr(self, name), name, lo)
        check_flag(self.warm_start, "warm_start")
        check_verbose(self.verbose)
        for name in ("tol", "reg_covar"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0 or math.isinf(v):
                raise ValueError(f"{name} must be a finite float >= 0, got {v!r}")
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {self.covariance_type!r}")
        if self.init_params not in GMM_INIT_PARAMS:
            raise ValueError(f"init_params must be one of {GMM_INIT_PARAMS}, got {self.init_params!r}")
        K, ct = self.n_components, self.covariance_type
        w = m = p = None
        if self.weights_init is not None:
            w_in = to_tensor(self.weights_init, "weights_init", allow_int=True)
            w = w_in.to(_F64)
            if tuple(w.shape) != (K,):
                raise ValueError(f"weights_init should have the shape {(K,)}, but got {tuple(w.shape)}")
            check_finite(w, "weights_init")
            if bool((w < 0).any()) or bool((w > 1).any()):
                raise ValueError("weights_init should be in the range [0, 1], but got "
                                 f"max value {float(w.max()):.5f}, min value {float(w.min()):.5f}")
            atol = 1e-6 if w_in.dtype == torch.float32 else 1e-8
            if abs(1.0 - float(w.sum())) > atol:
                raise ValueError(f"weights_init should be normalized, but got sum(weights) = {float(w.sum()):.5f}")
        if self.means_init is not None:
            m = to_tensor(self.means_init, "means_init", allow_int=True).to(_F64)
            if tuple(m.shape) != (K, D):
                raise ValueError(f"means_init should have the shape {(K, D)}, but got {tuple(m.shape)}")
            check_finite(m, "means_init")
        if self.precisions_init is not None:
            p = to_tensor(self.precisions_init, "precisions_init", allow_int=True).to(_F64)
            shape = {"full": (K, D, D), "tied": (D, D), "diag": (K, D), "spherical": (K,)}[ct]
            if tuple(p.shape) != shape:
                raise ValueError(f"precisions_init ({ct}) should have the shape {shape}, but got {tuple(p.shape)}")
            check_finite(p, "precisions_init")
            if ct in ("full", "tied"):
                mats = p if ct == "full" else p[None]
                sym = torch.allclose(mats, mats.transpose(-1, -2), rtol=1e-5, atol=1e-8)
                if not sym or bool((torch.linalg.eigvalsh(mats) <= 0).any()):
                    raise ValueError(f"precisions_init ('{ct}' precision) should be symmetric, positive-definite")
            elif bool((p <= 0).any()):
                raise ValueError(f"precisions_init ('{ct}' precision) should be positive")
        return tuple(None if t is None else t.to(device) for t in (w, m, p))

    # -- initialisation ----------------------------------------------------------------------
    def _initial_stats(self, X, rs, backend, sw=None):
        """Statistics of scikit-learn's initial responsibilities (see the module docstring).

        With ``sw`` ([N] float64 sample weights): weighted k-means labels and weighted statistics
        (``"kmeans"``), weighted statistics of the random responsibilities (``"random"``), rows
        drawn with ``p = s / sum(s)`` / by weighted k-means++ (the one-hot starts).
        """
        K, ct = self.n_components, self.covariance_type
        if self.init_params == "kmeans":
            # scikit-learn: KMeans(n_clusters=K, n_init=1, random_state=rs) -> labels (k-means++
            # seeding, Lloyd, default max_iter/tol), on the same device and backend; weighted
            # KMeans with the sample weights.
            Xk = _lloyd_design(X, K, backend)  # freed once the labels are in
            c0 = _take_rows(Xk, _kmeans_plusplus(Xk, K, rs, sw, backend))
            centers, labels, _, _, _ = _lloyd(Xk, c0, 300, _kmeans_tolerance(X, 1e-4), backend, sample_weight=sw,
                                              with_inertia=False)
            del Xk
            return _hard_stats(X, labels, K, centers, ct, sw)
        if self.init_params == "random":
            return _random_resp_stats(X, K, rs, ct, sw)
        if self.init_params == "random_from_data":
            if sw is None or bool((sw == sw[0]).all()):  # constant weights: the unweighted draw
                idx = rs.choice(X.shape[0], size=K, replace=False)
            else:
                _check_positive_rows(sw, K, "init_params='random_from_data'")
                idx = rs.choice(X.shape[0], size=K, replace=False, p=_choice_p(X.shape[0], sw, np.float64))
        else:  # "k-means++"
            idx = _kmeans_plusplus(X, K, rs, sw, backend)
        rows = _take_rows(X, idx)  # one-hot responsibilities on K rows: statistics of those rows
        return _hard_stats(rows, torch.arange(K, device=rows.device), K, rows, ct)

    def _initialize_parameters(self, X, rs, backend, inits, sw=None):
        """float64 ``(weights, means, covariances, precisions_cholesky)`` of one initialisation."""
        w_init, m_init, p_init = inits
        ct = self.covariance_type
        w = m = cov = pc = None
        if w_init is None or m_init is None or p_init is None:
            stats = self._initial_stats(X, rs, backend, sw)
            w, m, cov, pc = _gmm_ops().gmm_mstep(stats, reg_covar=self.reg_covar)
        if w_init is not None:
            w = w_init
        if m_init is not None:
            m = m_init
        if p_init is not None:
            pc = _prec_chol_from_precisions(p_init, ct)
            cov = _covariances_from_precisions(p_init, ct)
        return w, m, cov, pc

    # -- fit -----------------------------------------------------------------------------------
    def fit(self, X, y=None, sample_weight=None):
        """Estimate the parameters with EM.

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
            Dense data.
        y : ignored
        sample_weight : array-like of shape (n_samples,) or scalar, optional
            Non-negative, finite, not all zero (``ValueError`` otherwise). Row ``n`` counts
            ``s_n`` times: the E-step statistics are ``sum_n s_n r_nk (...)`` and the lower bound is
            ``sum_n s_n log p(x_n) / sum_n s_n`` (integer weights give the model of the data with
            repeated rows, from the same start). Initialisation: see the class Notes.

        Returns
        -------
        self
        """
        self._fit(X, sample_weight)
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit, then return the most probable component of every row.

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
        y : ignored
        sample_weight : array-like of shape (n_samples,) or scalar, optional
            As in :meth:`fit`.

        Returns
        -------
        labels : array of shape (n_samples,), int64
        """
        X, info, backend = self._fit(X, sample_weight)
        w, m, pc = self._param_tensors(info.device)
        _, labels = _score_op(X, w, m, pc, self.covariance_type, backend)
        return _out(labels.long(), info.kind)

    def _fit(self, X, sample_weight=None):
        X, info = _as_data(X, "GaussianMixture", self.backend)
        N, D = X.shape
        if N < 2:
            raise ValueError(f"GaussianMixture needs at least 2 samples, got n_samples={N}")
        if N < self.n_components:
            raise ValueError(f"Expected n_samples >= n_components but got n_components = "
                             f"{self.n_components}, n_samples = {N}")
        inits = self._check_parameters(D, info.device)
        sw = _sample_weight(sample_weight, info)
        total_weight = N if sw is None else float(sw.sum())  # lower bound = weighted mean log-likelihood
        backend = resolve_backend(self.backend, info.device)
        ct = self.covariance_type

        do_init = not (self.warm_start and hasattr(self, "converged_"))
        if not do_init and self.n_features_in_ != D:
            raise ValueError(f"warm_start: X has {D} features, but the fitted model has {self.n_features_in_}")
        n_init = self.n_init if do_init else 1
        host_mstep = _host_mstep(info.device, ct, self.n_components, D)
        device_em = _device_em_applies(X, ct, backend)
        rs = _check_random_state(self.random_state)
        t0 = time.perf_counter()
        max_lower_bound = -math.inf
        best, best_n_iter, best_lbs, best_hist, converged_best = None, 0, [], [], False
        for init in range(n_init):
            if self.verbose >= 1:
                print(f"Initialization {init}")
            if do_init:
                params = self._initialize_parameters(X, rs, backend, inits, sw)
            else:
                params = self._param_tensors(info.device, with_cov=True)
            if self.max_iter == 0:  # scikit-learn: keep the initialisation, lower bound -inf
                best, best_n_iter = params, 0
                continue
            lower_bound = -math.inf if do_init else self.lower_bound_
            log = _EMLog(self, lower_bound, t0)
            em = _em_device if device_em else _em_host
            w, m, cov, pc, n_iter = em(self, X, params, sw, total_weight, log, backend, host_mstep)
            lower_bound, lbs, hist, converged = log.lower_bound, log.lbs, log.hist, log.converged
            if self.verbose >= 1:
                msg = "converged" if converged else "did not converge"
                print(f"Initialization {msg}." if self.verbose == 1 else
                      f"Initialization {msg}. time lapse {time.perf_counter() - t0:.5f}s\t "
                      f"lower bound {lower_bound:.5f}.")
            if lower_bound > max_lower_bound or max_lower_bound == -math.inf:
                max_lower_bound = lower_bound
                best, best_n_iter, best_lbs, best_hist = (w, m, cov, pc), n_iter, lbs, hist
                converged_best = converged
        if not converged_best and self.max_iter > 0:
            warn_user("Best performing initialization did not converge. Try different init parameters, "
                      "or increase max_iter, tol, or check for degenerate data.", sklearn_class(ConvergenceWarning))
        w, m, cov, pc = (t.to(info.device) for t in best)
        kind, dt = info.kind, info.dtype
        self.weights_ = _out(w, kind, dt)
        self.means_ = _out(m, kind, dt)
        self.covariances_ = _out(cov, kind, dt)
        self.precisions_cholesky_ = _out(pc, kind, dt)
        self.precisions_ = _out(_precisions_from_chol(pc, ct), kind, dt)
        self.converged_ = converged_best
        self.n_iter_ = best_n_iter
        self.lower_bound_ = max_lower_bound
        self.lower_bounds_ = best_lbs
        self.history_ = best_hist
        record_features(self, info)
        return X, info, backend

    # -- inference -----------------------------------------------------------------------------
    def _param_tensors(self, device, with_cov=False):
        """The fitted parameters as float64 tensors on ``device`` (read from the attributes)."""
        w = _param_tensor(self.weights_, "weights_", device)
        m = _param_tensor(self.means_, "means_", device)
        pc = _param_tensor(self.precisions_cholesky_, "precisions_cholesky_", device)
        if self.covariance_type in ("full", "tied"):
            pc = torch.triu(pc)  # exact zeros below the diagonal after a float32 round trip
        w = w / w.sum()  # float32-rounded weights may miss the operator's sum-to-one tolerance
        if with_cov:
            return w, m, _param_tensor(self.covariances_, "covariances_", device), pc
        return w, m, pc

    def _check_fitted_X(self, X):
        X, info = _fitted_data(self, X, "GaussianMixture")
        return X, info, resolve_backend(self.backend, info.device)

    def _score(self, X):
        X, info, backend = self._check_fitted_X(X)
        w, m, pc = self._param_tensors(info.device)
        log_prob, labels = _score_op(X, w, m, pc, self.covariance_type, backend)
        return X, info, log_prob, labels.long(), (w, m, pc)

    def score_samples(self, X):
        """Log-likelihood of every row under the fitted mixture (fused, no ``N x K``).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        log_prob : array of shape (n_samples,)
            float64 for float64 X, float32 otherwise.
        """
        _, info, log_prob, _, _ = self._score(X)
        return _out(log_prob, info.kind, info.dtype)

    def score(self, X, y=None):
        """Mean log-likelihood of ``X``.

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        float
        """
        _, _, log_prob, _, _ = self._score(X)
        return float(log_prob.to(_F64).mean())

    def predict(self, X):
        """Most probable component of every row (fused, no ``N x K``).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        labels : array of shape (n_samples,), int64
        """
        _, info, _, labels, _ = self._score(X)
        return _out(labels, info.kind)

    def predict_proba(self, X):
        """Posterior probability of every component for every row.

        The result is ``N x K`` by definition; it is built in row blocks as the softmax over k of
        ``log pi_k + log N(x | mu_k, Sigma_k)`` in float64, so every row sums to one (a normaliser
        from the fp32 scoring pass left rows 1e-5 off: fuzz case fit:28678).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        resp : array of shape (n_samples, n_components)
            float64 for float64 X, float32 otherwise.
        """
        X, info, _ = self._check_fitted_X(X)
        w, m, pc = self._param_tensors(info.device)
        N, D = X.shape
        K = m.shape[0]
        out = torch.empty((N, K), dtype=info.dtype, device=info.device)

        def block(Xb, rows):
            wlp = _weighted_log_prob_block(Xb, w, m, pc, self.covariance_type)  # [B, K] float64
            out[rows] = torch.softmax(wlp, dim=1).to(info.dtype)

        _for_rows(X, block, 3 * K * D)
        return _out(out, info.kind)

    def _n_parameters(self):
        """Number of free parameters (scikit-learn's count)."""
        K = self.n_components
        D = self.n_features_in_
        cov = {"full": K * D * (D + 1) / 2.0, "diag": K * D, "tied": D * (D + 1) / 2.0,
               "spherical": K}[self.covariance_type]
        return int(cov + D * K + K - 1)

    def bic(self, X):
        """Bayesian information criterion on ``X`` (lower is better).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        float
            ``-2 N score(X) + n_parameters log N``.
        """
        _, _, log_prob, _, _ = self._score(X)
        n = log_prob.shape[0]
        return -2 * float(log_prob.to(_F64).sum()) + self._n_parameters() * math.log(n)

    def aic(self, X):
        """Akaike information criterion on ``X`` (lower is better).

        Parameters
        ----------
        X : array-like, torch.Tensor or dask array of shape (n_samples, n_features)

        Returns
        -------
        float
            ``-2 N score(X) + 2 n_parameters``.
        """
        _, _, log_prob, _, _ = self._score(X)
        return -2 * float(log_prob.to(_F64).sum()) + 2 * self._n_parameters()

    def sample(self, n_samples=1):
        """Draw samples from the fitted mixture (host numpy, scikit-learn's draws).

        Parameters
        ----------
        n_samples : int, default=1

        Returns
        -------
        X : array of shape (n_samples, n_features)
            float64 (a torch tensor on the fit device when fit was given a torch tensor).
        y : array of shape (n_samples,), int64
            Component of each sample.
        """
        self._check_is_fitted()
        if isinstance(n_samples, bool) or not isinstance(n_samples, numbers.Integral) or n_samples < 1:
            raise ValueError(f"Invalid value for 'n_samples': {n_samples!r}. "
                             "The sampling requires at least one sample.")
        as_torch = isinstance(self.means_, torch.Tensor)
        host = (lambda a: a.detach().cpu().numpy().astype(np.float64) if isinstance(a, torch.Tensor)
                else np.asarray(a, dtype=np.float64))
        weights, means, covs = host(self.weights_), host(self.means_), host(self.covariances_)
        D = means.shape[1]
        rng = _check_random_state(self.random_state)
        counts = rng.multinomial(n_samples, weights / weights.sum())
        ct = self.covariance_type
        if ct == "full":
            Xs = np.vstack([rng.multivariate_normal(mu, c, int(s)) for mu, c, s in zip(means, covs, counts)])
        elif ct == "tied":
            Xs = np.vstack([rng.multivariate_normal(mu, covs, int(s)) for mu, s in zip(means, counts)])
        else:
            Xs = np.vstack([mu + rng.standard_normal(size=(s, D)) * np.sqrt(c)
                            for mu, c, s in zip(means, covs, counts)])
        ys = np.concatenate([np.full(int(s), k, dtype=np.int64) for k, s in enumerate(counts)])
        if as_torch:
            dev = self.means_.device
            return torch.from_numpy(Xs).to(dev), torch.from_numpy(ys).to(dev)
        return Xs, ys
