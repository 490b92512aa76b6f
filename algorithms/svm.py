"""Linear SVM (L2-regularised squared hinge, LIBLINEAR's primal solver) on fusedml.mmchain."""
from __future__ import annotations

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
    class_weight_vector,
    classification_data,
    normalised_weights,
    warn_solver_status,
    weigh_by_class,
)
from ._loss import LinearObjective, SquaredHingeLoss
from ._solvers import relative_grad_norm_stop, tron

__all__ = ["LinearSVC"]


class LinearSVC(LinearClassifierMixin, ClassifierMixin, BaseEstimator):
    """Linear support vector classifier: L2-regularised squared hinge loss (L2-SVM), primal.

    Minimises, for each one-vs-rest problem k (a single problem for two classes),

        1/2 * ||w_k||^2 + C * sum_i s_i * max(0, 1 - y_ik (x_i^T w_k + b_k))^2,   y_ik in {-1, +1}

    by LIBLINEAR's primal method: trust-region Newton-CG (TRON) with the generalized Hessian
    ``I + 2C X_A^T X_A`` on the active set ``A = {i : y_i eta_i < 1}``. Each Hessian-vector
    product is ONE ``fusedml.mmchain`` with ``v = 2 c 1_A``; for K > 2 classes the K problems are
    solved together, so one mmchain (matrix y [D, K], matrix v [N, K]) serves all K at once.
    Stopping rule (LIBLINEAR's): ``||g_k|| <= tol * max(min(#pos_k, #neg_k), 1) / N * ||g_k(0)||``.

    Difference from scikit-learn / LIBLINEAR: the intercept ``b`` is NOT penalised here, while
    LIBLINEAR appends a constant feature ``intercept_scaling`` and penalises its weight. With
    ``fit_intercept=False`` both solve exactly the same problem (and a large ``intercept_scaling``
    in scikit-learn approaches ours).

    Parameters
    ----------
    C : float, default=1.0
    fit_intercept : bool, default=True
    tol : float, default=1e-4
    max_iter : int, default=1000
    class_weight : None, "balanced" or dict, default=None
        As LIBLINEAR (scikit-learn): with two classes each sample's weight is multiplied by its
        class's weight; with more, problem k (class k against the rest) multiplies the weights of
        class k's samples by class k's weight and leaves the others' as they are.
    backend : {"auto", "fused", "ops", "cpu"}, default="auto"
    verbose : int, default=0

    Attributes
    ----------
    classes_ : ndarray or Tensor, shape [K]
    coef_ : ndarray or Tensor, shape [1, D] (binary) or [K, D]
    intercept_ : ndarray or Tensor, shape [1] or [K]
    n_iter_ : int
        Largest number of Newton iterations over the one-vs-rest problems.
    n_features_in_ : int
    history_ : list of dict

    Examples
    --------
    >>> import numpy as np
    >>> from algorithms import LinearSVC
    >>> X = np.random.default_rng(0).normal(size=(100, 3)); y = (X[:, 0] > 0).astype(int)
    >>> LinearSVC().fit(X, y).score(X, y) > 0.9
    True
    """

    def __init__(self, C=1.0, fit_intercept=True, tol=1e-4, max_iter=1000, class_weight=None,
                 backend="auto", verbose=0):
        self.C = C
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.class_weight = class_weight
        self.backend = backend
        self.verbose = verbose

    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : array-like, torch tensor, CSR matrix or dask array, shape [N, D]
        y : array-like, shape [N]
            Class labels (numbers or strings).
        sample_weight : array-like, shape [N], optional

        Returns
        -------
        self
        """
        C = check_positive(self.C, "C")
        tol = check_positive(self.tol, "tol")
        max_iter = check_max_iter(self.max_iter)
        check_flag(self.fit_intercept, "fit_intercept")
        check_verbose(self.verbose)
        M, info, classes, y_idx, sw = classification_data(X, y, sample_weight, None, self.backend, check="defer")
        K = len(classes)
        cw = class_weight_vector(self.class_weight, classes, y_idx, sw, info)
        if K == 2:
            pos = (y_idx == 1).unsqueeze(1)
            sw = weigh_by_class(cw, y_idx, sw, info)  # both classes' weights
        else:
            pos = torch.nn.functional.one_hot(y_idx, K).bool()
        target = torch.where(pos, 1.0, -1.0).to(info.dtype)  # [N, P] in {-1, +1}
        n_pos = pos.sum(0).double()
        tol_scale = torch.clamp(torch.minimum(n_pos, info.n_samples - n_pos), min=1.0) / info.n_samples
        tol_scale = (tol * tol_scale).to(info.dtype)
        total, weights = normalised_weights(sw, info)
        if K > 2 and cw is not None:  # LIBLINEAR: problem k weighs class k by cw[k], the rest by 1
            weights = torch.where(pos, cw.to(info.dtype), 1.0) * (weights[:, None] if torch.is_tensor(weights)
                                                                  else weights)  # [N, K]
        obj = LinearObjective(M, SquaredHingeLoss(), target, weights, 1.0 / (C * total), n_cols=target.shape[1],
                              fit_intercept=self.fit_intercept, backend=self.backend,
                              dtype=info.dtype, device=info.device)
        obj.finite_check = info.finite_check  # X's NaN / inf check, read with the solver's start
        hist = History(type(self).__name__, self.verbose)
        res = tron(obj, obj.zeros(), max_iter=max_iter, history=hist,
                   stop=relative_grad_norm_stop(tol_scale))
        self.classes_ = classes
        self._store_linear_fit(obj, res, info, hist)
        self.n_iter_ = int(max(res.n_iter))
        warn_solver_status(type(self).__name__, res.status, max_iter, tol, info.dtype)
        return self

    def decision_function(self, X):
        """Signed distances to the hyperplanes.

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor
            [N] for two classes (positive: ``classes_[1]``), [N, K] otherwise.
        """
        return self._decision_values(X)

    def predict(self, X):
        """Predicted class labels, shape [N].

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N]
        """
        return self._predict_labels(X)


