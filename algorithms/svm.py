"""Linear SVM (L2-regularised squared hinge, LIBLINEAR's primal solver) on fusedml.mmchain."""
from __future__ import annotations

import torch

from ._base import (
    BaseEstimator,
    ClassifierMixin,
    History,
    LinearPredictMixin,
    as_design_matrix,
    as_sample_weight,
    check_max_iter,
    check_positive,
    class_weights,
    encode_labels,
    take_labels,
    to_output,
    warn_not_converged,
)
from ._loss import LinearObjective, SquaredHingeLoss
from ._solvers import tron

__all__ = ["LinearSVC"]


class LinearSVC(LinearPredictMixin, ClassifierMixin, BaseEstimator):
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
        M, info = as_design_matrix(X, backend=self.backend)
        classes, y_idx = encode_labels(y, info)
        sw = as_sample_weight(sample_weight, info)
        sw = class_weights(self.class_weight, classes, y_idx, sw, info)
        K = len(classes)
        if K == 2:
            pos = (y_idx == 1).unsqueeze(1)
        else:
            pos = torch.nn.functional.one_hot(y_idx, K).bool()
        target = torch.where(pos, 1.0, -1.0).to(info.dtype)  # [N, P] in {-1, +1}
        n_pos = pos.sum(0).double()
        tol_scale = torch.clamp(torch.minimum(n_pos, info.n_samples - n_pos), min=1.0) / info.n_samples
        tol_scale = (tol * tol_scale).to(info.dtype)
        total = float(info.n_samples) if sw is None else float(sw.sum(dtype=torch.float64))
        weights = 1.0 / total if sw is None else sw / total
        obj = LinearObjective(M, SquaredHingeLoss(), target, weights, 1.0 / (C * total), n_cols=target.shape[1],
                              fit_intercept=self.fit_intercept, backend=self.backend,
                              dtype=info.dtype, device=info.device)
        hist = History(type(self).__name__, self.verbose)
        res = tron(obj, obj.zeros(), max_iter=max_iter, history=hist,
                   stop=lambda g, gnorm, gnorm0: gnorm <= tol_scale * gnorm0)
        self.classes_ = classes
        self._fit_info = {"intercept": bool(self.fit_intercept), "n_matvec": obj.n_matvec,
                          "n_mmchain": obj.n_mmchain, "status": res.status, "dtype": info.dtype,
                          "device": info.device}
        self._set_linear_attributes(res.W, info, self.fit_intercept)
        self.n_iter_ = int(max(res.n_iter))
        self.history_ = hist.records
        if "max_iter" in res.status:
            warn_not_converged(type(self).__name__, max_iter)
        elif "stalled" in res.status:
            warn_not_converged(type(self).__name__, max_iter,
                               f"LinearSVC: the solver stopped making progress at working precision "
                               f"({info.dtype}) before reaching tol={tol:g}")
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
        eta, kind, _ = self._linear_predictor(X)
        return to_output(eta[:, 0] if eta.shape[1] == 1 else eta, kind)

    def predict(self, X):
        """Predicted class labels, shape [N].

        Parameters
        ----------
        X : array-like or sparse, shape [N, D]

        Returns
        -------
        ndarray or Tensor, shape [N]
        """
        eta, kind, _ = self._linear_predictor(X)
        idx = (eta[:, 0] > 0).to(torch.int64) if eta.shape[1] == 1 else eta.argmax(1)
        return take_labels(self.classes_, idx, kind)


