"""Least squares and ridge regression by conjugate gradient on the normal equations (SystemDS
lmCG), each CG step one fusedml.mmchain."""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from fusedml._validation import warn_user

from ._base import (
    BaseEstimator,
    History,
    LinearPredictMixin,
    RegressorMixin,
    as_design_matrix,
    as_sample_weight,
    as_target,
    check_flag,
    check_max_iter,
    check_positive,
    check_verbose,
    fit_design,
    normalised_weights,
    to_output,
    warn_not_converged,
)
from ._loss import MAX_COLS, hessvec, rmatvec
from ._solvers import conjugate_gradient, graph_safe, is_csr

__all__ = ["LinearRegression", "Ridge"]

#: A dense X is shifted by its sampled column means before the products (in a copy; a dask X as its
#: chunks are streamed) when ``eps * max_j mean_j^2 / var_j`` of a sample of its rows exceeds this:
#: the implicit form ``X^T S X p - S mu mu^T p`` cancels about that ratio. Float32, 2000 x 5, columns
#: offset by 4 / 16 / 100 standard deviations (ratios 16 / 256 / 1e4): coefficients 2e-5 / 3e-4 /
#: 1e-2 off the float64 solution implicitly (5e-7 shifted); the limit is a ratio of ~4 in float32
#: and ~2e9 in float64.
CENTRE_LIMIT = 5e-7
#: CG runs on the Jacobi-scaled system ``D^-1/2 A D^-1/2`` (``D``: A's diagonal, estimated from the
#: sampled rows) when that diagonal's largest ratio exceeds this: columns of very different scales
#: slow CG and loosen what its residual test says about the coefficients (the warning of
#: :func:`_condition_bound`); standardised data keeps the plain system (no extra launches).
SCALE_LIMIT = 100.0
_CENTRE_SAMPLE = 4096  # rows sampled for that ratio (evenly spaced; a dask X's leading rows)


def _moments(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means and variances [D] (float64) of the sampled rows ``S`` [s, D]."""
    S = S.double()
    return S.mean(0), S.var(0, unbiased=False)


def _far_from_zero(mean: torch.Tensor, var: torch.Tensor, acc: torch.dtype) -> bool:
    """Whether the implicit centring in ``acc`` would lose accuracy (see :data:`CENTRE_LIMIT`): a
    column whose mean is large against its spread, or constant and not zero. One host read; NaN /
    inf say no (the fit's finite check reports them)."""
    bad = (mean.square() > var * (CENTRE_LIMIT / torch.finfo(acc).eps)) | ((var == 0) & (mean != 0))
    return bool(bad.any())


def _sample_rows(X: torch.Tensor) -> torch.Tensor:
    """Evenly spaced rows [s, D] (float64) of the dense ``X`` [N, D]: at most :data:`_CENTRE_SAMPLE`,
    and at most ``2^22`` values (wide X: 64 rows or more)."""
    n, d = X.shape
    s = min(n, _CENTRE_SAMPLE, max(64, (1 << 22) // max(d, 1)))
    return X[torch.linspace(0, n - 1, s, device=X.device).round().long()].double()


def _sampled_diag(S: torch.Tensor, centred: bool) -> torch.Tensor:
    """The diagonal [D] (float64) of ``X^T X / N`` (``centred``: of ``X - mean``) from sampled rows."""
    S = S.double()
    return (S - S.mean(0) if centred else S).square().mean(0)


def _jacobi_scale(S: torch.Tensor, centred: bool, ridge: float, dtype: torch.dtype) -> torch.Tensor | None:
    """``diag(A)^-1/2`` [D] in ``dtype`` (1 for columns the sample shows empty) when the sampled
    diagonal of ``A = X^T X / N + ridge I`` spans more than :data:`SCALE_LIMIT`, else None. One host
    read of two values."""
    d = _sampled_diag(S, centred)
    pos = d > 0
    lo, hi = torch.where(pos, d, math.inf).min(), d.max()
    if not bool(pos.any()) or float((hi + ridge) / (lo + ridge)) <= SCALE_LIMIT:
        return None
    return torch.where(pos, (d + ridge).rsqrt(), torch.ones_like(d)).to(dtype)


def _condition_bound(S: torch.Tensor, centred: bool, ridge: float) -> float:
    """A lower bound on the condition number of the normal matrix ``X^T X / N + ridge I`` from the
    sampled rows ``S`` [s, D] of X (``centred``: of ``X - mean``): the largest ratio of its diagonal
    entries, and that of the eigenvalues of its block on the (at most 16) columns most aligned with
    the all-ones direction (their means largest against their spread: nearly parallel columns).
    Zero columns and eigenvalues below ``1e-14`` of the largest count as an exact null space
    (duplicate or constant centred columns: CG still reaches the minimum-norm solution), left out
    before ``ridge`` is added. Host reads: the diagonal and a 16 x 16 block."""
    S = S.double()
    if centred:
        S = S - S.mean(0)
    diag = _sampled_diag(S, False)  # [D]
    k = min(16, S.shape[1])
    idx = (S.mean(0).square() / S.var(0, unbiased=False).clamp_min(1e-300)).topk(k).indices
    ev = torch.linalg.eigvalsh((S[:, idx].T @ S[:, idx] / S.shape[0]).cpu())
    bounds = [1.0]
    for v in (diag[diag > 0].cpu(), ev[ev > 1e-14 * ev.max()]):  # the data's null space left out
        if v.numel():
            bounds.append(float((v.max() + ridge) / (v.min() + ridge)))
    return max(bounds)


def _centred(X: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """``X - mu`` [N, D] in X's dtype (formed in mu's accumulation dtype for 2-byte storage)."""
    return X - mu if X.dtype == mu.dtype else (X.to(mu.dtype) - mu).to(X.dtype)


def _shift_dask(X, shift: torch.Tensor):
    """``X - shift`` as a lazy dask array in X's storage dtype (float64 for integer chunks): each
    chunk is shifted on the host as it is read, so the streamed matrix holds centred rows."""
    store = X.dtype if X.dtype.kind == "f" else np.dtype(np.float64)
    wide = np.float64 if store == np.float64 else np.float32
    return (X.astype(wide) - shift.numpy().astype(wide)).astype(store)


def _dask_shift(X, fit_intercept: bool):
    """For a dense dask ``X`` with an intercept: ``(X, None, None)`` when the moments of its leading
    :data:`_CENTRE_SAMPLE` rows (one small compute) show every column near zero, else
    ``(X - mean, mean, var)`` (:func:`_shift_dask`); ``(X, None, None)`` otherwise (CSR stays
    implicit, as scikit-learn's; chunk sizes unknown: checked after streaming, with a warning)."""
    from ._base import _is_dask

    if not fit_intercept or not _is_dask(X) or np.isnan(X.shape[0]):
        return X, None, None
    import fusedml.streaming as streaming

    if streaming._is_sparse_meta(X._meta):
        return X, None, None
    mean, var = _moments(torch.from_numpy(np.asarray(X[:_CENTRE_SAMPLE].compute(), dtype=np.float64)))
    acc = torch.float64 if X.dtype == np.float64 or X.dtype.kind != "f" else torch.float32
    if not _far_from_zero(mean, var, acc):
        return X, None, None
    return _shift_dask(X, mean), mean, var


class _LeastSquaresBase(LinearPredictMixin, RegressorMixin, BaseEstimator):
    """CG on ``(X_c^T S X_c + alpha I) w = X_c^T S (y - ybar)`` with implicit centring.

    With an intercept, X is centred implicitly (never materialised, so CSR stays sparse), unless a
    dense X's column means are large against their spread (:data:`CENTRE_LIMIT`): then X is first
    shifted by the sampled means, in a copy (as scikit-learn centres every dense X), or for a dask X
    chunk by chunk as it is streamed (the means of its leading rows; a ``RuntimeWarning`` when the
    shifted columns still lie far from zero). CSR inputs stay implicit (as scikit-learn's).
    ``X_c^T S X_c p = X^T (s * (X p)) - S mu (mu^T p)`` with the weighted column means
    ``mu = X^T s / S``, so each CG step is ONE mmchain ``X^T (s * (X p)) + z`` with
    ``z = alpha p - S mu (mu^T p)``; then ``b = ybar - mu^T w``. Centring gives the
    conditioning of scikit-learn's (centred) problem. The system is scaled by ``1 / S`` (same
    solution) to keep float32 magnitudes moderate, and CG runs on the Jacobi-scaled system where the
    sampled columns' scales differ widely (:data:`SCALE_LIMIT`).
    """

    def _alpha(self):
        return 0.0

    def __sklearn_tags__(self):
        """scikit-learn's tags: ``y`` may be [N, m] (several targets)."""
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags

    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like, torch tensor, CSR matrix or dask array, shape [N, D]
        y : array-like, shape [N] or [N, m]
        sample_weight : array-like, shape [N], optional

        Returns
        -------
        self
        """
        tol = check_positive(self.tol, "tol")
        check_flag(self.fit_intercept, "fit_intercept")
        check_verbose(self.verbose)
        X, shift, head_var = _dask_shift(X, bool(self.fit_intercept))  # [D] float64 shifts or None
        M, info = as_design_matrix(X, backend=self.backend, check="defer")
        max_iter = max(100, 2 * (info.n_features + 1)) if self.max_iter is None else check_max_iter(self.max_iter)
        yt = as_target(y, info, allow_2d=True)
        one_d = yt.ndim == 1
        Y = yt.unsqueeze(1) if one_d else yt  # [N, m]
        m = Y.shape[1]
        sample = _sample_rows(M) if isinstance(M, torch.Tensor) else None  # [s, D] float64 in-memory dense rows
        if self.fit_intercept and sample is not None:
            mean, var = _moments(sample)
            if _far_from_zero(mean, var, info.dtype):  # X - mean in a copy, as scikit-learn centres
                shift = mean
        streamed = hasattr(M, "take_rows") and not getattr(M, "is_sparse", False)
        if self.fit_intercept and streamed and head_var is None and shift is None:  # chunk sizes were unknown
            head_var = _moments(M.take_rows(np.arange(min(M.shape[0], _CENTRE_SAMPLE))))[1]
        M = fit_design(M, self.backend, m)  # unaligned rows: a padded copy where it pays
        alpha = self._alpha()
        if isinstance(alpha, numbers.Real) or np.ndim(alpha) == 0:
            alpha_t = torch.full((m,), float(check_positive(float(alpha), "alpha", strict=False)),
                                 dtype=info.dtype, device=info.device)
        else:
            a = np.asarray(alpha, dtype=np.float64).reshape(-1)
            if a.shape[0] != m:
                raise ValueError(f"alpha has {a.shape[0]} values but y has {m} targets")
            if not np.isfinite(a).all() or (a < 0).any():
                raise ValueError("alpha must be finite and non-negative")
            alpha_t = torch.as_tensor(a, dtype=info.dtype, device=info.device)
        sw = as_sample_weight(sample_weight, info)
        total, weights = normalised_weights(sw, info)
        c = None if sw is None else weights  # [N] normalised weights (None: 1/N each)
        cscale = 1.0 / total if sw is None else 1.0
        alpha_s = alpha_t / total
        # CG on D^-1/2 A D^-1/2 (w = s * w') where the sampled columns' scales differ widely
        scale = None if sample is None else _jacobi_scale(sample, bool(self.fit_intercept), float(alpha_s.min()),
                                                          info.dtype)
        s_col = None if scale is None else scale[:, None]  # [D, 1]
        be = self.backend
        check = info.finite_check
        if check is not None:  # X's NaN / inf check: queued ahead of the products, read with CG's first copy
            check.queue()
        ones = torch.ones(info.n_samples, 1, dtype=info.dtype, device=info.device)
        if self.fit_intercept:
            cw = ones if c is None else c[:, None]
            if shift is not None and isinstance(M, torch.Tensor):  # the implicit form keeps what is left (~0)
                M = fit_design(_centred(M, shift.to(device=M.device, dtype=info.dtype)), be, m)
            mu = rmatvec(M, cw, alpha=cscale, intercept=False, backend=be).to(info.dtype)[:, 0]  # [D]
            if streamed and head_var is not None and _far_from_zero(mu.double().cpu(), head_var.cpu(), info.dtype):
                after = " after the shift by its leading rows' means" if shift is not None else ""
                warn_user(f"{type(self).__name__}: some columns of the dask X lie far from zero against their spread"
                          f"{after} (rows ordered by a feature?); the implicit centring of streamed data loses digits "
                          "there. Centre X first (X - X.mean(axis=0)) or fit an in-memory array.", RuntimeWarning)
            ybar = ((Y * cw).sum(0, dtype=torch.float64) * cscale).to(info.dtype)  # [m]
            Yc = Y - ybar
        else:
            mu, ybar, Yc = None, torch.zeros(m, dtype=info.dtype, device=info.device), Y
        # right-hand side X_c^T S (y - ybar) / S = X^T (c (y - ybar))  (the mu term vanishes)
        V = Yc if c is None else Yc * c[:, None]
        B = torch.cat([rmatvec(M, V[:, j:j + MAX_COLS], alpha=cscale, intercept=False, backend=be)
                       for j in range(0, m, MAX_COLS)], dim=1).to(info.dtype)
        if s_col is not None:
            B = B * s_col
        mu_col = None if mu is None else mu[:, None]  # [D, 1]

        def apply_A(P):
            if s_col is not None:  # the scaled system: s * A (s * p')
                P = P * s_col
            # z = alpha p - mu (mu^T p): two small launches (addmm fuses the outer product)
            z = alpha_s * P
            if mu_col is not None:
                z = torch.addmm(z, mu_col, mu_col.T @ P, alpha=-1.0)
            out = hessvec(M, P, c, z=z, beta=1.0, alpha=cscale, intercept=False, backend=be)
            out = out if out.dtype == info.dtype else out.to(info.dtype)
            return out if s_col is None else out * s_col

        hist = History(type(self).__name__, self.verbose)
        # history_ objective = (weighted RSS + alpha ||w||^2) / (2 S): the quadratic plus ||y_c||^2_s / (2 S)
        yy = ((Yc.double() ** 2).sum(0) * cscale if c is None else (c[:, None].double() * Yc.double() ** 2).sum(0))
        res = conjugate_gradient(apply_A, B, tol=tol, max_iter=max_iter, history=hist,
                                 offset=float(0.5 * yy.sum()), graphs=graph_safe(M), sparse=is_csr(M),
                                 check=check)
        Wc = res.W if s_col is None else res.W * s_col  # [D, m]
        if shift is not None:  # the products read X - shift: b = ybar - (mu + shift)^T w
            mu = mu + shift.to(device=mu.device, dtype=mu.dtype)
        icpt = ybar - (mu @ Wc if mu is not None else 0.0)
        W = torch.cat([Wc, torch.as_tensor(icpt, dtype=info.dtype, device=info.device).reshape(1, m)], dim=0)
        n_xtv = 1 + int(self.fit_intercept)
        self._fit_info = {"intercept": True, "n_mmchain": res.n_steps + n_xtv, "n_xtv": n_xtv, "n_matvec": 0,
                          "shifted": shift is not None, "scaled": scale is not None, "status": res.status, "dtype": info.dtype,
                          "device": info.device}
        self._set_linear_attributes(W, info, True, vector=one_d)
        if not self.fit_intercept:
            self.intercept_ = 0.0 if one_d and info.kind == "numpy" else (
                to_output(torch.zeros(() if one_d else (m,), dtype=info.dtype, device=info.device), info.kind))
        self.n_iter_ = int(max(res.n_iter)) if one_d else np.asarray(res.n_iter, dtype=np.int32)
        self.history_ = hist.records
        if not res.converged:
            warn_not_converged(type(self).__name__, max_iter)
        elif sample is not None:  # CG's residual test bounds the error by cond(A) * tol only
            ridge = float(alpha_s.min()) * (1.0 if scale is None else float(scale.double().square().min()))
            kappa = _condition_bound(sample if scale is None else sample * scale, bool(self.fit_intercept), ridge)
            if kappa * tol > 1.0:
                warn_user(f"{type(self).__name__}: the normal equations are ill-conditioned (condition number at "
                          f"least {kappa:.1e}), so CG's residual test at tol={tol:g} does not bound the coefficients' "
                          "error: they may be far from the least-squares solution. Standardise the columns, fit an "
                          "intercept (columns far from zero are nearly parallel), or lower tol.", RuntimeWarning)
        return self

    def predict(self, X):
        """Predicted targets.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N] (or [N, m] for 2-D y at fit)
        """
        eta, kind, _ = self._linear_predictor(X)
        coef_ndim = self.coef_.ndim
        return to_output(eta[:, 0] if coef_ndim == 1 else eta, kind)


class LinearRegression(_LeastSquaresBase):
    """Ordinary least squares by conjugate gradient on the normal equations (SystemDS lmCG).

    Each CG iteration is ONE ``fusedml.mmchain``: ``X^T (s * (X p)) - S mu (mu^T p)`` (implicit
    centring for the intercept; see ``_LeastSquaresBase``). Starting from 0, CG converges to the
    minimum-norm solution when X is rank deficient (as ``numpy.linalg.lstsq``).

    Parameters
    ----------
    fit_intercept : bool, default=True
    tol : float, default=1e-6
        Stop when ``||r|| <= tol * ||b||`` for every target (relative normal-equation residual).
        That bounds the coefficients' relative error by ``cond(X^T X) * tol`` only: a fit on an
        in-memory X whose sampled rows show ``cond * tol > 1`` warns (``RuntimeWarning``).
    max_iter : int or None, default=None
        None: ``max(100, 2 * (D + 1))``.
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
    verbose : int, default=0

    Attributes
    ----------
    coef_ : ndarray or Tensor, shape [D] or [m, D]
    intercept_ : float or ndarray [m] (Tensor for torch input)
    n_iter_ : int, or ndarray [m] for 2-D y
    n_features_in_ : int
    history_ : list of dict
        objective is ``(weighted RSS + alpha ||w||^2) / (2 sum s)`` (summed over targets),
        grad_norm the normal-equation residual norm.

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms import LinearRegression
    >>> X = np.random.default_rng(0).normal(size=(50, 3)); y = X @ [1.0, 2.0, 3.0] + 4.0
    >>> np.round(LinearRegression().fit(X, y).coef_, 4)
    array([1., 2., 3.])
    """

    def __init__(self, fit_intercept=True, tol=1e-6, max_iter=None, backend="auto", verbose=0):
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.backend = backend
        self.verbose = verbose


class Ridge(_LeastSquaresBase):
    """Ridge regression ``sum_i s_i (y_i - x_i^T w - b)^2 + alpha ||w||^2`` by conjugate gradient.

    Each CG iteration is ONE ``fusedml.mmchain`` ``X^T (s * (X p)) + z`` with
    ``z = alpha p - S mu (mu^T p)`` (the intercept by implicit centring, unpenalised, as
    scikit-learn). Several targets (2-D y) are solved together: one mmchain per CG step for up
    to 16 targets.

    Parameters
    ----------
    alpha : float or array of shape [m], default=1.0
    fit_intercept : bool, default=True
    tol : float, default=1e-6
        Stop when ``||r|| <= tol * ||b||`` for every target (a ``RuntimeWarning`` where a sampled
        bound of ``cond(X^T X) * tol`` exceeds 1, as for :class:`LinearRegression`).
    max_iter : int or None, default=None
        None: ``max(100, 2 * (D + 1))``.
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
    verbose : int, default=0

    Attributes
    ----------
    coef_ : ndarray or Tensor, shape [D] or [m, D]
    intercept_ : float or ndarray [m] (Tensor for torch input)
    n_iter_ : int, or ndarray [m] for 2-D y
    n_features_in_ : int
    history_ : list of dict

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms import Ridge
    >>> X = np.random.default_rng(0).normal(size=(50, 3)); y = X @ [1.0, 2.0, 3.0]
    >>> Ridge(alpha=1.0).fit(X, y).coef_.shape
    (3,)
    """

    def __init__(self, alpha=1.0, fit_intercept=True, tol=1e-6, max_iter=None, backend="auto", verbose=0):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.backend = backend
        self.verbose = verbose

    def _alpha(self):
        return self.alpha
