"""L2-regularised logistic regression (binary and multinomial) trained through fusedml.mmchain."""
from __future__ import annotations

import numpy as np
import torch

from ._base import (
    BaseEstimator,
    ClassifierMixin,
    History,
    LinearClassifierMixin,
    check_flag,
    check_max_iter,
    check_positive,
    check_verbose,
    classification_data,
    normalised_weights,
    to_output,
    warn_solver_status,
)
from ._loss import BinomialLoss, LinearObjective, MultinomialLoss
from ._solvers import lbfgs, max_abs_grad_stop, tron

__all__ = ["LogisticRegression"]

SOLVERS = ("newton-cg", "lbfgs")


class LogisticRegression(LinearClassifierMixin, ClassifierMixin, BaseEstimator):
    """L2-regularised logistic regression, binary or multinomial (softmax), on fused kernels.

    Minimises scikit-learn's objective

        C * sum_i s_i * loss_i(W) + 1/2 * ||W_features||^2

    (the intercept is not penalised; ``s_i`` = sample weight times class weight), divided, as
    scikit-learn does internally, by ``C * sum_i s_i`` -- the same minimiser; ``history_``
    reports this normalised objective ``mean_s(loss) + ||W||^2 / (2 C sum s)``. Two classes give
    the binary logistic loss with one coefficient vector; more give the multinomial loss with K
    vectors (scikit-learn >= 1.5's default), all K penalised.

    Solvers
    -------
    ``"newton-cg"``: trust-region Newton-CG (LIBLINEAR's TRON). Each Hessian-vector product is
    ONE ``fusedml.mmchain``: ``X^T (D * (X s)) + l2 * s`` (binary, ``D = c p (1-p)``) or, for the
    multinomial Hessian of all K classes together, ``mmchain(X, S, v=P, v_op="softmax")``
    (``p_nj = P_nj (t_nj - sum_l P_nl t_nl)``). With non-uniform sample/class weights the
    multinomial product takes two passes (the row weight cannot enter the softmax form).
    ``"lbfgs"``: L-BFGS with a strong-Wolfe line search; gradients ``X^T (p - y)`` are one
    mmchain each. Both stop when the largest absolute gradient entry of the normalised objective
    is ``<= tol`` (scikit-learn's rule).

    Parameters
    ----------
    C : float, default=1.0
        Inverse regularisation strength.
    fit_intercept : bool, default=True
        Fit an unpenalised intercept (an implicit column of ones; sparse X is never densified).
    tol : float, default=1e-4
        Gradient tolerance (see above).
    max_iter : int, default=100
        Outer iterations (Newton steps, accepted or rejected / L-BFGS iterations).
    solver : {"newton-cg", "lbfgs"}, default="newton-cg"
    class_weight : None, "balanced" or dict, default=None
        Multiplies the sample weights per class, as scikit-learn.
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
        Backend of every mmchain / matvec call; the same iterations run on each.
    verbose : int, default=0
        Print one line per iteration.

    Attributes
    ----------
    classes_ : ndarray or Tensor, shape [K]
    coef_ : ndarray or Tensor, shape [1, D] (binary) or [K, D]
    intercept_ : ndarray or Tensor, shape [1] or [K]
    n_iter_ : ndarray, shape [1]
    n_features_in_ : int
    history_ : list of dict
        Per iteration: iter, objective, grad_norm, step, time (+ cg_iter / ls_evals).

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms import LogisticRegression
    >>> X = np.random.default_rng(0).normal(size=(100, 3)); y = (X[:, 0] > 0).astype(int)
    >>> clf = LogisticRegression(C=10.0).fit(X, y)
    >>> clf.predict(X[:3]).shape
    (3,)
    """

    def __init__(self, C=1.0, fit_intercept=True, tol=1e-4, max_iter=100, solver="newton-cg",
                 class_weight=None, backend="auto", verbose=0):
        self.C = C
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.solver = solver
        self.class_weight = class_weight
        self.backend = backend
        self.verbose = verbose

    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like, torch tensor (CPU or CUDA), scipy/torch CSR, CSRMatrix or dask array, shape [N, D]
        y : array-like, shape [N]
            Class labels (numbers or strings).
        sample_weight : array-like, shape [N], optional
            Non-negative per-sample weights.

        Returns
        -------
        self
        """
        C = check_positive(self.C, "C")
        tol = check_positive(self.tol, "tol")
        max_iter = check_max_iter(self.max_iter)
        check_flag(self.fit_intercept, "fit_intercept")
        check_verbose(self.verbose)
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        M, info, classes, y_idx, sw = classification_data(X, y, sample_weight, self.class_weight, self.backend,
                                                          check="defer")
        K = len(classes)
        if K == 2:
            target = (y_idx == 1).to(info.dtype).unsqueeze(1)
            loss, n_cols = BinomialLoss(), 1
        else:
            target = torch.nn.functional.one_hot(y_idx, K).to(info.dtype)
            loss, n_cols = MultinomialLoss(), K
        total, weights = normalised_weights(sw, info)
        obj = LinearObjective(M, loss, target, weights, 1.0 / (C * total), n_cols=n_cols,
                              fit_intercept=self.fit_intercept, backend=self.backend,
                              dtype=info.dtype, device=info.device)
        obj.finite_check = info.finite_check  # X's NaN / inf check, read with the solver's start
        hist = History(type(self).__name__, self.verbose)
        solve = tron if self.solver == "newton-cg" else lbfgs
        res = solve(obj, obj.zeros(), max_iter=max_iter, stop=max_abs_grad_stop(tol), history=hist)
        self.classes_ = classes
        self._store_linear_fit(obj, res, info, hist)
        self.n_iter_ = np.asarray([max(res.n_iter)], dtype=np.int32)
        warn_solver_status(type(self).__name__, res.status, max_iter, tol, info.dtype)  # one problem: one status
        return self

    def decision_function(self, X):
        """Linear predictor.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor
            [N] for two classes (log-odds of ``classes_[1]``), [N, K] otherwise.
        """
        return self._decision_values(X)

    def predict_proba(self, X):
        """Class probabilities.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N, K]
        """
        eta, kind, _ = self._linear_predictor(X)
        if eta.shape[1] == 1:
            p = torch.sigmoid(eta[:, 0])
            P = torch.stack([1.0 - p, p], dim=1)
        else:
            P = torch.softmax(eta, dim=1)
        return to_output(P, kind)

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`, computed stably.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N, K]
            Log-probabilities in the order of ``classes_`` (K = 2 for binary); the same output
            type as :meth:`predict_proba`.
        """
        eta, kind, _ = self._linear_predictor(X)
        if eta.shape[1] == 1:
            e = eta[:, 0]
            L = torch.stack([torch.nn.functional.logsigmoid(-e), torch.nn.functional.logsigmoid(e)], dim=1)
        else:
            L = torch.log_softmax(eta, dim=1)
        return to_output(L, kind)

    def predict(self, X):
        """Predicted class labels.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N]
        """
        return self._predict_labels(X)
