"""Generalized linear models (Tweedie families incl. normal/Poisson/gamma/inverse Gaussian, and
binomial) with an L2 penalty, trained through fusedml.mmchain."""
from __future__ import annotations

import numpy as np
import torch

from ._base import (
    BaseEstimator,
    History,
    LinearPredictMixin,
    RegressorMixin,
    _to_numpy,
    as_design_matrix,
    as_sample_weight,
    as_target,
    check_flag,
    check_max_iter,
    check_positive,
    check_verbose,
    normalised_weights,
    to_output,
    warn_solver_status,
)
from ._loss import GLMLoss, LinearObjective, default_link, get_family, get_link
from ._solvers import lbfgs, max_abs_grad_stop, tron

__all__ = ["GammaRegressor", "GeneralizedLinearRegressor", "PoissonRegressor", "TweedieRegressor"]

SOLVERS = ("newton-cg", "lbfgs")


class _GLMBase(LinearPredictMixin, RegressorMixin, BaseEstimator):
    """Shared fit / predict / score of the GLM estimators (subclasses fix family and link)."""

    def _family_link(self):
        raise NotImplementedError

    def __sklearn_tags__(self):
        """scikit-learn's tags: ``positive_only`` targets where the family rejects ``y = -1``."""
        tags = super().__sklearn_tags__()
        try:
            self._family_link()[0].check_target(torch.tensor([-1.0]))
        except ValueError:
            tags.target_tags.positive_only = True
        except Exception:  # invalid parameters: fit reports them
            pass
        return tags

    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like, torch tensor, CSR matrix or dask array, shape [N, D]
        y : array-like, shape [N]
            Targets in the family's support (e.g. y >= 0 for Poisson, y > 0 for gamma).
        sample_weight : array-like, shape [N], optional

        Returns
        -------
        self
        """
        alpha = check_positive(self.alpha, "alpha", strict=False)
        tol = check_positive(self.tol, "tol")
        max_iter = check_max_iter(self.max_iter)
        check_flag(self.fit_intercept, "fit_intercept")
        check_verbose(self.verbose)
        solver = getattr(self, "solver", "newton-cg")
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        family, link = self._family_link()
        M, info = as_design_matrix(X, backend=self.backend, check="defer")
        yt = as_target(y, info)
        family.check_target(yt)
        sw = as_sample_weight(sample_weight, info)
        total, weights = normalised_weights(sw, info)
        loss = GLMLoss(family, link)
        obj = LinearObjective(M, loss, yt.unsqueeze(1), weights, alpha, n_cols=1,
                              fit_intercept=self.fit_intercept, backend=self.backend,
                              dtype=info.dtype, device=info.device)
        obj.finite_check = info.finite_check  # X's NaN / inf check, read with the solver's start
        W0 = obj.zeros()
        if self.fit_intercept:
            # scikit-learn's start: coefficients 0, intercept = link(weighted mean of y)
            ymean = (yt.double().mean() if sw is None else (sw.double() * yt.double()).sum() / total)
            ymean = family.mean_domain_clip(ymean.to(info.dtype))
            W0[-1, 0] = link.link(ymean)
        hist = History(type(self).__name__, self.verbose)
        solve = tron if solver == "newton-cg" else lbfgs
        stop = max_abs_grad_stop(tol)  # scikit-learn's rule
        try:
            res = solve(obj, W0, max_iter=max_iter, stop=stop, history=hist)
        except ValueError as exc:
            if "not finite at the starting point" in str(exc):
                raise ValueError(
                    f"{type(self).__name__}: the {link.name} link gives an invalid mean for the {family.name} "
                    "family at the starting point (coefficients 0"
                    + (" and intercept link(mean(y))): try another link" if self.fit_intercept
                       else ", no intercept): try fit_intercept=True or another link")
                ) from None
            raise
        self._store_linear_fit(obj, res, info, hist, vector=True, family=family, link=link)
        self.n_iter_ = int(res.n_iter[0])
        warn_solver_status(type(self).__name__, res.status, max_iter, tol, info.dtype)  # one problem: one status
        return self

    def _family_link_fitted(self):
        info = getattr(self, "_fit_info", None)
        if info is not None and "family" in info:
            return info["family"], info["link"]
        return self._family_link()

    def predict(self, X):
        """Predicted mean ``h(X w + b)``.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N]
        """
        eta, kind, _ = self._linear_predictor(X)
        _, link = self._family_link_fitted()
        return to_output(link.inverse(eta[:, 0]), kind)

    def linear_predictor(self, X):
        """Linear predictor ``X w + b``, shape [N].

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N]
        """
        eta, kind, _ = self._linear_predictor(X)
        return to_output(eta[:, 0], kind)

    def score(self, X, y, sample_weight=None):
        """D^2, the fraction of deviance explained (scikit-learn's GLM score).

        ``D^2 = 1 - dev(y, mu) / dev(y, mean_s(y))`` with sample weights.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]
        y : array-like, shape [N]
        sample_weight : array-like, shape [N], optional

        Returns
        -------
        float
        """
        family, _ = self._family_link_fitted()
        mu = torch.as_tensor(np.asarray(_to_numpy(self.predict(X)), dtype=np.float64))
        yt = torch.as_tensor(np.asarray(_to_numpy(y), dtype=np.float64)).reshape(-1)
        if yt.shape != mu.shape:
            raise ValueError(f"y has shape {tuple(yt.shape)}, expected {tuple(mu.shape)}")
        if not bool(torch.isfinite(yt).all()):
            raise ValueError("y contains NaN or infinity")
        family.check_target(yt)  # as fit: outside the family's support the deviance is undefined
        sw = torch.ones_like(yt) if sample_weight is None else torch.as_tensor(
            np.asarray(_to_numpy(sample_weight), dtype=np.float64)).reshape(-1)
        if sw.shape != yt.shape:
            raise ValueError(f"sample_weight has shape {tuple(sw.shape)}, expected {tuple(yt.shape)}")
        if not bool(torch.isfinite(sw).all()) or bool((sw < 0).any()):
            raise ValueError("sample_weight must be finite and non-negative")
        dev = (sw * family.unit_deviance(yt, mu)).sum()
        ybar = (sw * yt).sum() / sw.sum()
        dev0 = (sw * family.unit_deviance(yt, ybar.expand_as(yt))).sum()
        return float(1.0 - dev / dev0)


_COMMON_DOC = """
    Minimises scikit-learn's objective

        1 / (2 * sum_i s_i) * sum_i s_i * deviance(y_i, h(x_i^T w + b)) + alpha / 2 * ||w||^2

    (intercept not penalised) by trust-region Newton-CG (LIBLINEAR's TRON, a globalised IRLS /
    Fisher scoring): each Hessian-vector product is ONE ``fusedml.mmchain``
    ``X^T (W_fisher * (X s)) + alpha * s`` with the expected (Fisher) weight
    ``W = s_i h'(eta)^2 / V(mu)`` -- the exact Hessian for canonical links (normal-identity,
    Poisson-log, binomial-logit), the Fisher information (positive semi-definite) for
    non-canonical ones (e.g. gamma-log, Tweedie-log, probit, cloglog). ``solver="lbfgs"`` runs
    L-BFGS instead. Both stop when the largest absolute gradient entry is ``<= tol``
    (scikit-learn's rule). Start: coefficients 0 and ``intercept = link(weighted mean of y)``.
"""


class GeneralizedLinearRegressor(_GLMBase):
    __doc__ = """Generalized linear model with an L2 penalty, for any supported family and link.
""" + _COMMON_DOC + """
    Parameters
    ----------
    family : {"normal", "poisson", "gamma", "inverse_gaussian", "tweedie", "binomial"}, default="normal"
    power : float, default=0.0
        Tweedie power (``family="tweedie"`` only; <= 0 or >= 1).
    link : {"auto", "identity", "log", "logit", "probit", "cloglog", "inverse"}, default="auto"
        ``"auto"``: identity for normal, logit for binomial, log otherwise (scikit-learn's rule).
    alpha : float, default=1.0
    fit_intercept : bool, default=True
    tol : float, default=1e-4
    max_iter : int, default=100
    solver : {"newton-cg", "lbfgs"}, default="newton-cg"
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
    verbose : int, default=0

    Attributes
    ----------
    coef_ : ndarray or Tensor, shape [D]
    intercept_ : float (or 0-d Tensor for torch input)
    n_iter_ : int
    n_features_in_ : int
    history_ : list of dict

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms import GeneralizedLinearRegressor
    >>> rng = np.random.default_rng(0); X = rng.normal(size=(200, 3))
    >>> y = rng.poisson(np.exp(0.3 * X[:, 0]))
    >>> GeneralizedLinearRegressor(family="poisson", alpha=1e-3).fit(X, y).coef_.shape
    (3,)
    """

    def __init__(self, family="normal", power=0.0, link="auto", alpha=1.0, fit_intercept=True, tol=1e-4,
                 max_iter=100, solver="newton-cg", backend="auto", verbose=0):
        self.family = family
        self.power = power
        self.link = link
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.backend = backend
        self.verbose = verbose

    def _family_link(self):
        if self.family != "tweedie" and self.power not in (0, 0.0):
            raise ValueError(f"power is only used with family='tweedie' (got family={self.family!r}, power={self.power!r})")
        fam = get_family(self.family, self.power)
        return fam, get_link(default_link(fam) if self.link == "auto" else self.link)


class TweedieRegressor(_GLMBase):
    __doc__ = """Tweedie GLM (scikit-learn's ``TweedieRegressor``) on fused kernels.
""" + _COMMON_DOC + """
    Parameters
    ----------
    power : float, default=0.0
        0: normal, 1: Poisson, (1, 2): compound Poisson-gamma, 2: gamma, 3: inverse Gaussian.
    alpha : float, default=1.0
    fit_intercept : bool, default=True
    link : {"auto", "identity", "log"}, default="auto"
    tol : float, default=1e-4
    max_iter : int, default=100
    solver : {"newton-cg", "lbfgs"}, default="newton-cg"
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
    verbose : int, default=0

    Attributes
    ----------
    coef_, intercept_, n_iter_, n_features_in_, history_ : as :class:`GeneralizedLinearRegressor`
    """

    def __init__(self, power=0.0, alpha=1.0, fit_intercept=True, link="auto", tol=1e-4, max_iter=100,
                 solver="newton-cg", backend="auto", verbose=0):
        self.power = power
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.link = link
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.backend = backend
        self.verbose = verbose

    def _family_link(self):
        if self.link not in ("auto", "identity", "log"):
            raise ValueError(f"TweedieRegressor link must be 'auto', 'identity' or 'log', got {self.link!r}")
        fam = get_family("tweedie", self.power)
        return fam, get_link(default_link(fam) if self.link == "auto" else self.link)


_LOG_LINK_DOC = """
    Parameters
    ----------
    alpha : float, default=1.0
    fit_intercept : bool, default=True
    tol : float, default=1e-4
    max_iter : int, default=100
    solver : {"newton-cg", "lbfgs"}, default="newton-cg"
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
    verbose : int, default=0

    Attributes
    ----------
    coef_, intercept_, n_iter_, n_features_in_, history_ : as :class:`GeneralizedLinearRegressor`
    """


class _LogLinkGLM(_GLMBase):
    """A GLM of the family ``_FAMILY`` with log link; the parameters of ``_LOG_LINK_DOC``."""

    _FAMILY = None

    def __init__(self, alpha=1.0, fit_intercept=True, tol=1e-4, max_iter=100, solver="newton-cg",
                 backend="auto", verbose=0):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.backend = backend
        self.verbose = verbose

    def _family_link(self):
        return get_family(self._FAMILY), get_link("log")


class PoissonRegressor(_LogLinkGLM):
    __doc__ = """Poisson GLM with log link (scikit-learn's ``PoissonRegressor``); targets y >= 0.
""" + _COMMON_DOC + _LOG_LINK_DOC

    _FAMILY = "poisson"


class GammaRegressor(_LogLinkGLM):
    __doc__ = """Gamma GLM with log link (scikit-learn's ``GammaRegressor``); targets y > 0.
""" + _COMMON_DOC + _LOG_LINK_DOC

    _FAMILY = "gamma"
