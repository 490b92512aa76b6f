"""Fused Gaussian-mixture EM step: E-step statistics, M-step, scoring.

Public API (see ``README.md`` beside this file for the math):

* :func:`gmm_estep` -- log-likelihood and the sufficient statistics ``N_k``, ``S1_k``, ``S2_k``
  about centres ``c_k`` for the current parameters, in one pass over X (fused backend).
* :func:`gmm_mstep` -- scikit-learn's M-step from those statistics.
* :func:`gmm_score` -- per-sample log-likelihood and the arg-max component (``predict``).

Parameters follow scikit-learn's ``GaussianMixture`` exactly: ``weights_`` [K], ``means_`` [K, D],
``precisions_cholesky_`` (full [K, D, D] upper triangular, tied [D, D], diag [K, D], spherical [K]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from .._dispatch import resolve_backend
from .._validation import warn_user
from ._prep import COVARIANCE_TYPES, PATHS, PRECISIONS, packed_to, validate

__all__ = ["GMMStats", "gmm_estep", "gmm_mstep", "gmm_score", "COVARIANCE_TYPES"]


@dataclass
class GMMStats:
    """Sufficient statistics of one E-step (float64 tensors on X's device).

    Attributes
    ----------
    covariance_type : str
        ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.
    log_likelihood : torch.Tensor
        0-d, ``sum_n s_n log sum_k pi_k N(x_n | mu_k, Sigma_k)`` (``s_n`` sample weights, 1 if None).
    log_prob : torch.Tensor or None
        ``[N]`` per-sample ``log sum_k pi_k N(x_n | ...)`` (unweighted), when asked for; float32
        (float64 for float64 X).
    nk : torch.Tensor
        ``[K]`` ``sum_n s_n r_nk``.
    center : torch.Tensor
        ``[K, D]`` the centres ``c_k`` the moments are taken about (default: the current means).
    s1 : torch.Tensor
        ``[K, D]`` ``sum_n s_n r_nk (x_n - c_k)``.
    s2 : torch.Tensor
        full ``[K, D, D]`` ``sum_n s_n r_nk (x_n - c_k)(x_n - c_k)^T``; tied ``[D, D]`` the same summed
        over k; diag ``[K, D]`` ``sum_n s_n r_nk (x_n - c_k)^2``; spherical ``[K]`` its sum over D.

    Notes
    -----
    Statistics about the same centres add across row chunks (``a.merge(b)``): pass ``center``
    explicitly when streaming chunks.
    """

    covariance_type: str
    log_likelihood: torch.Tensor
    log_prob: torch.Tensor | None
    nk: torch.Tensor
    center: torch.Tensor
    s1: torch.Tensor
    s2: torch.Tensor

    def merge(self, other: "GMMStats") -> "GMMStats":
        """Sum with the statistics of other rows about the same centres (log_prob concatenated).

        Parameters
        ----------
        other : GMMStats
            Same covariance type and identical ``center``; otherwise ``ValueError``.

        Returns
        -------
        GMMStats
            New statistics; ``log_prob`` is ``[N_self + N_other]`` when both have it, else None.
        """
        if other.covariance_type != self.covariance_type:
            raise ValueError("cannot merge statistics of different covariance types")
        if not torch.equal(other.center.to(self.center.device), self.center):
            raise ValueError("cannot merge statistics taken about different centres; pass center= explicitly")
        lp = None
        if self.log_prob is not None and other.log_prob is not None:
            lp = torch.cat([self.log_prob, other.log_prob.to(self.log_prob.device)])
        dev = self.nk.device
        return replace(self, log_likelihood=self.log_likelihood + other.log_likelihood.to(dev), log_prob=lp,
                       nk=self.nk + other.nk.to(dev), s1=self.s1 + other.s1.to(dev), s2=self.s2 + other.s2.to(dev))

    def to(self, device) -> "GMMStats":
        """The statistics on ``device``, moved in ONE transfer (``log_prob``, ``[N]``, in a second).

        An EM loop on a GPU reads the log-likelihood every iteration anyway; taking the small
        statistics along in the same copy lets the M-step run on the host without further
        synchronisations (``algorithms.GaussianMixture`` does this).

        Parameters
        ----------
        device : torch.device or str

        Returns
        -------
        GMMStats
            New statistics, float64 (``log_prob`` keeps its dtype); ``self`` when already there.
        """
        device = torch.device(device)
        fields = (self.log_likelihood, self.nk, self.center, self.s1, self.s2)
        if all(t.device == device for t in fields) and (self.log_prob is None or self.log_prob.device == device):
            return self
        out = packed_to(fields, device)
        lp = None if self.log_prob is None else self.log_prob.to(device)
        return replace(self, log_likelihood=out[0], nk=out[1], center=out[2], s1=out[3], s2=out[4], log_prob=lp)


def _check_options(path, precision):
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if precision not in ("auto", "fp64") and precision not in PRECISIONS:
        raise ValueError(f"precision must be 'auto', 'fp64' or one of {PRECISIONS}, got {precision!r}")


def _resolve_precision(precision, where) -> str:
    """``"auto"``: :func:`fusedml.gmm.model.auto_precision` (fp32, or tf32x3 where its tensor-core form applies).

    ``where`` is the validated problem (``Prepared``: resolved here, per shape) or a device (callers
    that prepare per chunk, like ``fusedml.streaming``: ``"auto"`` is passed on and
    :func:`fusedml.gmm.fused.estep_fused` resolves it per chunk)."""
    if precision != "auto" or not hasattr(where, "covariance_type"):
        return precision
    from .model import auto_precision

    return auto_precision(where.N, where.K, where.D, where.covariance_type, where.device, where.X.dtype)


def gmm_estep(X, weights, means, precisions_cholesky, covariance_type, *, sample_weight=None, center=None,
              return_log_prob=False, backend="auto", path="auto", precision="auto", check_finite=True,
              check_params=True) -> GMMStats:
    """One E-step: log-likelihood and the M-step's sufficient statistics, without N x K.

    Parameters
    ----------
    X : array-like or torch.Tensor, shape [N, D]
        Data (float32/float64/bfloat16/float16; any strides). A dask array wrapped as
        ``fusedml.streaming.StreamedMatrix`` (anything with ``_fusedml_gmm_estep``) is delegated to.
    weights : array-like, shape [K]
        Mixture weights, non-negative, summing to one.
    means : array-like, shape [K, D]
    precisions_cholesky : array-like
        scikit-learn's ``precisions_cholesky_``: full [K, D, D] (upper triangular), tied [D, D],
        diag [K, D], spherical [K]; positive diagonal / entries.
    covariance_type : {"full", "tied", "diag", "spherical"}
    sample_weight : array-like, shape [N], optional
        Non-negative; multiplies the responsibilities and the log-likelihood terms.
    center : array-like, shape [K, D], optional
        Centres ``c_k`` of the moments; default ``means``.
    return_log_prob : bool
        Also return the per-sample log-likelihood ``[N]``.
    backend : {"auto", "fused", "ops", "cpu"}
        See :func:`fusedml.resolve_backend`.
    path : {"auto", "single", "two_pass"}
        Fused backend only: force the single-sweep or the two-pass kernels (``"auto"``: the
        applicability model in :mod:`fusedml.gmm.model`).
    precision : {"auto", "fp32", "tf32x3", "tf32", "bf16", "fp64"}
        Fused backend: operand precision of the distance and statistics products. ``"fp64"``
        (any backend): the blocked float64 E-step on X's device (no N x K; what the fused and
        ``"ops"`` backends fall back to where fp32 would not be accurate; several times slower).
        ``"fp32"``: fp32 FMA products; ``"tf32x3"``: tensor cores with each fp32 operand split
        into a tf32 high and low part (three products; fp32-level error, about 1e-6 relative on
        the H200, but 2.2e-4 at K=1024, D=128); ``"auto"`` (default): the measured rule of
        :func:`fusedml.gmm.model.auto_precision`: tf32x3 for diag covariance at 8 < K, D <= 16 on fp32
        data from 0.5M rows (the tensor-core form of :mod:`fusedml.gmm.mma`: 1.4-1.7x the fp32 register form on
        an H100, errors <= 2e-6; sample weights and per-row outputs included), fp32 elsewhere
        (tf32x3 was slower on most other H200 shapes). ``"tf32"`` / ``"bf16"``
        are faster (bf16 on the H200: 2.0x at 4M x 16, K = 16; 3.1x at 1M x 64, K = 64; 3.8x at
        K = 1024), with relative errors up to ~1e-2 (tf32, whose operands are truncated) / ~2e-3
        (bf16) in the statistics and ~2e-3 / ~6e-4 in the log-likelihood: an explicit
        speed/accuracy trade. Accumulation is always fp32 (partials combined in float64), for
        float64 X too (shifted in float64 first): ``backend="cpu"`` or ``"ops"`` compute float64
        data in float64. Where fp32 distances would lose more than ~1e-3 nats (a component far
        from the mixture mean in its own precision, :data:`fusedml.gmm._prep.FP32_QUAD_LIMIT`),
        the fused and ``"ops"`` backends warn (RuntimeWarning) and compute in float64. So does a
        checked call (``check_params``) whose diag / spherical ``s2`` the fp32 sums about the
        mixture mean would have lost: a component's rows far tighter than its given precision says,
        far from that mean (one host read of the statistics).
    check_finite : bool
        Check X for NaN/inf (one extra read of X).
    check_params : bool
        False: the parameters come from :func:`gmm_mstep` (float64 numpy arrays, or float64
        tensors on X's device) and ``sample_weight`` from an earlier call that checked it (a
        float64 tensor on X's device), as in an EM loop. Their conversions, shape checks and the
        sample weights' device checks (a synchronisation) are then skipped (about 0.15-0.2 ms of
        host time per call); finiteness and positivity are still tested, and parameters of any
        other form are checked in full. ``center`` given, or ``check_finite``, checks in full.

    Returns
    -------
    GMMStats
        float64 statistics; see :class:`GMMStats`.

    Examples
    --------
    >>> st = gmm_estep(X, w, mu, pc, "diag")                           # doctest: +SKIP
    >>> weights, means, covs, prec_chol = gmm_mstep(st, reg_covar=1e-6)  # doctest: +SKIP
    """
    if hasattr(X, "_fusedml_gmm_estep"):
        return X._fusedml_gmm_estep(weights, means, precisions_cholesky, covariance_type,
                                    sample_weight=sample_weight, center=center, return_log_prob=return_log_prob,
                                    backend=backend, path=path, precision=precision, check_finite=check_finite,
                                    check_params=check_params)
    _check_options(path, precision)
    prep = validate(X, weights, means, precisions_cholesky, covariance_type, sample_weight=sample_weight,
                    center=center, check_finite=check_finite, check_params=check_params)
    be = resolve_backend(backend, prep.device)
    from .cpu import estep_cpu

    if precision == "fp64":
        lp, ll, nk, s1, s2 = estep_cpu(prep, return_log_prob)
    elif be == "fused":
        from .fused import estep_fused

        lp, ll, nk, s1, s2 = estep_fused(prep, return_log_prob, path=path,
                                         precision=_resolve_precision(precision, prep))
    elif be == "ops":
        from .ops import estep_ops

        lp, ll, nk, s1, s2 = estep_ops(prep, return_log_prob)
    else:
        lp, ll, nk, s1, s2 = estep_cpu(prep, return_log_prob)
    if check_params and precision != "fp64" and _sums_cancelled(prep, be, nk, s2):
        lp, ll, nk, s1, s2 = estep_cpu(prep, return_log_prob)
    if lp is not None:
        lp = lp.to(torch.float64 if prep.X.dtype == torch.float64 else torch.float32)
    return GMMStats(covariance_type=covariance_type, log_likelihood=ll, log_prob=lp, nk=nk, center=prep.center,
                    s1=s1, s2=s2)


def _sums_cancelled(prep, backend: str, nk: torch.Tensor, s2: torch.Tensor) -> bool:
    """Whether the diag / spherical ``s2`` of the fp32 sums about the mixture mean lost its digits
    (with a RuntimeWarning; the caller recomputes in float64): ``s2 = S2 - 2 c' S1 + nk c'^2``
    cancels about ``nk c'^2 / s2``, the squared distance of a component's mean from the mixture
    mean in the spread of the rows it holds. :func:`fusedml.gmm._prep.fp32_unsafe` judges that
    spread by the given precisions; a component tighter than they say (stale or arbitrary
    parameters, a collapsing component) is caught here, against the same limit. One host read."""
    from ._prep import FP32_QUAD_LIMIT, fp32_quad

    if prep.covariance_type not in ("diag", "spherical") or backend not in ("fused", "ops") \
            or (backend == "ops" and prep.X.dtype == torch.float64) or fp32_quad(prep) > FP32_QUAD_LIMIT:
        return False  # float64 sums, or already computed in float64
    cp = (prep.center - prep.shift).to(device=s2.device, dtype=torch.float64)  # [K, D]
    term = nk.to(torch.float64)[:, None] * cp * cp
    if prep.covariance_type == "spherical":
        term = term.sum(1)
    ratio = float((term / s2.abs().clamp_min(torch.finfo(torch.float64).tiny)).max())
    if ratio <= FP32_QUAD_LIMIT:
        return False
    warn_user(f"fusedml.gmm: a component's rows lie {math.sqrt(ratio):.3g} of their own spread from the mixture "
              f"mean, so the fp32 sums about it lose the component's variance (~{ratio * 2.0 ** -24:.2g} of it); "
              "the statistics are recomputed in float64 (slower)", RuntimeWarning)
    return True


_FAIL_MSG = ("Fitting the mixture model failed because some components have ill-defined empirical covariance "
             "(for instance caused by singleton or collapsed samples). Try to decrease the number of components, "
             "increase reg_covar, or scale the input data.")


def gmm_mstep(stats: GMMStats, reg_covar: float = 1e-6):
    """scikit-learn's M-step from E-step statistics (float64).

    Follows ``sklearn.mixture._gaussian_mixture._estimate_gaussian_parameters`` and
    ``_compute_precision_cholesky``: ``N_k <- N_k + 10 eps`` (float64 eps) so empty components give
    mean 0... more precisely ``means_k = sum r x / N_k`` (0 for an empty component, never NaN),
    covariances ``sum r (x - mu_k)(x - mu_k)^T / N_k + reg_covar I`` (``reg_covar`` alone for an empty
    component), tied: the ``N_k``-weighted average, weights ``N_k / sum N_k``.

    Parameters
    ----------
    stats : GMMStats
        From :func:`gmm_estep`.
    reg_covar : float
        Non-negative regularisation added to the covariance diagonals.

    Returns
    -------
    weights : torch.Tensor
        ``[K]``.
    means : torch.Tensor
        ``[K, D]``.
    covariances : torch.Tensor
        full ``[K, D, D]``, tied ``[D, D]``, diag ``[K, D]``, spherical ``[K]``.
    precisions_cholesky : torch.Tensor
        Same shapes (full/tied upper triangular), scikit-learn's convention.

    Raises
    ------
    ValueError
        ``reg_covar`` negative, or a covariance not positive definite (scikit-learn's message).
    """
    if not isinstance(stats, GMMStats):
        raise TypeError(f"stats must be a GMMStats, got {type(stats).__name__}")
    if not (float(reg_covar) >= 0.0):
        raise ValueError(f"reg_covar must be non-negative, got {reg_covar!r}")
    weights, means, cov, prec_chol, bad = mstep_tensors(stats.covariance_type, stats.nk, stats.center, stats.s1,
                                                        stats.s2, float(reg_covar))
    if bool(bad):
        raise ValueError(_FAIL_MSG)
    return weights, means, cov, prec_chol


def mstep_tensors(covariance_type, nk, center, s1, s2, reg_covar):
    """:func:`gmm_mstep`'s arithmetic without its checks or host synchronisation.

    Every operation stays on the statistics' device, so the M-step can be queued behind the
    E-step (and captured in a CUDA graph with it) and its failure read later.

    Parameters
    ----------
    covariance_type : str
    nk, center, s1, s2 : torch.Tensor
        :class:`GMMStats` fields (any float dtype; used in float64).
    reg_covar : float
        Non-negative (not checked).

    Returns
    -------
    tuple
        ``(weights, means, covariances, precisions_cholesky, bad)``: as :func:`gmm_mstep`'s
        result, and ``bad`` a 0-d bool tensor, True where a covariance is not positive definite
        (the other outputs are then meaningless; :func:`gmm_mstep` raises).
    """
    f64 = torch.float64
    ct = covariance_type
    nk_raw = nk.to(f64)
    nk = nk_raw + 10 * torch.finfo(f64).eps
    c = center.to(f64)
    s1 = s1.to(f64)
    means = (s1 + nk_raw[:, None] * c) / nk[:, None]  # sum r x / N_k
    delta = means - c  # [K, D]
    D = means.shape[1]
    s2 = s2.to(f64)
    if ct in ("diag", "spherical"):
        # sum r (x - mu)^2 = S2 - 2 delta S1 + N delta^2, about c
        if ct == "diag":
            cov = (s2 - 2 * delta * s1 + nk_raw[:, None] * delta * delta) / nk[:, None] + reg_covar
        else:
            cov = (s2 - 2 * (delta * s1).sum(1) + nk_raw * (delta * delta).sum(1)) / (nk * D) + reg_covar
        bad = (cov <= 0).any()
        prec_chol = 1.0 / torch.sqrt(cov)
    else:
        eye = torch.eye(D, dtype=f64, device=means.device)
        corr = (s1[:, :, None] * delta[:, None, :] + delta[:, :, None] * s1[:, None, :]
                - nk_raw[:, None, None] * delta[:, :, None] * delta[:, None, :])  # [K, D, D]
        if ct == "full":
            cov = (s2 - corr) / nk[:, None, None] + reg_covar * eye
        else:
            cov = (s2 - corr.sum(0)) / nk.sum() + reg_covar * eye
        cov = 0.5 * (cov + cov.transpose(-1, -2))
        L, info = torch.linalg.cholesky_ex(cov)
        # singular to working precision as well as indefinite: collapsed data leaves a covariance of
        # rounding noise (~1e-31 from moments about a centre), which LAPACK may factor with a last
        # pivot of ~eps times the diagonal instead of failing as on exact zeros (scikit-learn's case)
        piv = torch.diagonal(L, dim1=-2, dim2=-1)
        scale = torch.diagonal(cov, dim1=-2, dim2=-1).amax(-1, keepdim=True)
        bad = (info != 0).any() | (piv * piv <= D * torch.finfo(f64).eps * scale).any()
        eye_b = eye.expand_as(L) if ct == "full" else eye
        prec_chol = torch.linalg.solve_triangular(L, eye_b, upper=False).transpose(-1, -2)
    weights = nk / nk.sum()
    return weights, means, cov, prec_chol, bad


def gmm_score(X, weights, means, precisions_cholesky, covariance_type, *, backend="auto", path="auto"):
    """Per-sample log-likelihood and the most probable component, fused, without N x K.

    In float64 (with a RuntimeWarning) where fp32 distances would not be accurate, as :func:`gmm_estep`.

    Parameters
    ----------
    X, weights, means, precisions_cholesky, covariance_type
        As in :func:`gmm_estep`.
    backend : {"auto", "fused", "ops", "cpu"}
    path : {"auto", "single", "two_pass"}
        Accepted for symmetry with :func:`gmm_estep`; scoring is always one pass over X with an
        online log-sum-exp and arg-max over component tiles.

    Returns
    -------
    log_prob : torch.Tensor
        ``[N]`` ``log sum_k pi_k N(x_n | mu_k, Sigma_k)``, float32 (float64 for float64 X).
    labels : torch.Tensor
        ``[N]`` int64 ``argmax_k (log pi_k + log N(x_n | mu_k, Sigma_k))`` (scikit-learn's ``predict``).
    """
    if hasattr(X, "_fusedml_gmm_score"):
        return X._fusedml_gmm_score(weights, means, precisions_cholesky, covariance_type, backend=backend, path=path)
    _check_options(path, "fp32")
    prep = validate(X, weights, means, precisions_cholesky, covariance_type)
    be = resolve_backend(backend, prep.device)
    if be == "fused":
        from .fused import score_fused

        lp, labels = score_fused(prep)
    elif be == "ops":
        from .ops import score_ops

        lp, labels = score_ops(prep)
    else:
        from .cpu import score_cpu

        lp, labels = score_cpu(prep)
    return lp.to(torch.float64 if prep.X.dtype == torch.float64 else torch.float32), labels
