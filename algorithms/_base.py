"""Shared estimator machinery: parameters, input conversion, labels, weights, outputs.

scikit-learn is NOT needed at runtime: ``get_params`` / ``set_params`` introspect ``__init__``
exactly as ``sklearn.base.BaseEstimator`` does, so :func:`sklearn.base.clone`, grid search and
pickling work when scikit-learn is present, and nothing imports it otherwise.

Data conventions
----------------
* numpy / scipy input becomes torch CPU tensors; torch input stays on its device (CUDA stays
  CUDA); a dask array becomes a :class:`fusedml.streaming.StreamedMatrix` (imported lazily).
* Compute dtype: float64 for float64 ``X``, float32 for every other storage dtype (float32,
  bfloat16, float16 are read as stored and accumulated in float32 by the fused and cpu backends;
  the ops backend, the operator-level baseline, multiplies half-precision X in its storage
  precision, as torch's matmul does). Scalar reductions of the
  objective (one number per problem) are summed in float64 so that the trust-region ratio test
  is not dominated by float32 cancellation.
* Fitted arrays (``coef_``, ``intercept_``, ``classes_``) are numpy arrays, or torch tensors on
  the training device when ``fit`` was given a torch tensor. ``predict`` & co. return the type of
  the ``X`` they are given (numpy for numpy/scipy/dask, torch for torch).
"""
from __future__ import annotations

import inspect
import math
import numbers
import sys
import time

import numpy as np
import torch

import fusedml
from fusedml._validation import CSRMatrix, as_csr_remembered, check_finite, is_sparse, torch_viewable, warn_user
from fusedml.mmchain.dense import align_mode

__all__ = [
    "BaseEstimator",
    "ClassifierMixin",
    "ConvergenceWarning",
    "DataConversionWarning",
    "NotFittedError",
    "RegressorMixin",
]


class _SklearnTwin:
    """Base of the exception / warning classes that scikit-learn also defines (same name).

    Raised or warned through :func:`sklearn_class`, so that ``except sklearn.exceptions.X`` and
    scikit-learn's warning filters also catch ours where scikit-learn is imported; pickles as the
    class of the unpickling process.
    """

    def __reduce__(self):
        cls = type(self)
        if cls.__module__ == __name__ and cls.__name__ in _TWIN_CLASSES:  # ours or its twin
            return _rebuild_twin, (cls.__name__, self.args)
        return super().__reduce__()


class NotFittedError(_SklearnTwin, ValueError, AttributeError):
    """Raised when a method needing a fitted model is called before ``fit``.

    Subclasses ``ValueError`` and ``AttributeError`` like scikit-learn's exception of the same name
    (and that exception itself where scikit-learn is imported).
    """


class ConvergenceWarning(_SklearnTwin, UserWarning):
    """The solver stopped at ``max_iter`` (or at working precision) before reaching ``tol``."""


class DataConversionWarning(_SklearnTwin, UserWarning):
    """An input was converted to what the estimator reads (a column-vector ``y`` was raveled)."""


_TWINS: dict = {}  # our class -> its subclass that also derives from scikit-learn's


def sklearn_class(cls):
    """``cls``, or, once scikit-learn is imported, a subclass of it and of scikit-learn's class of
    the same name (``sklearn.exceptions.NotFittedError`` etc.). Never imports scikit-learn: code
    that catches scikit-learn's class has imported it.

    Parameters
    ----------
    cls : type
        :class:`NotFittedError`, :class:`ConvergenceWarning` or :class:`DataConversionWarning`.

    Returns
    -------
    type
    """
    sk = sys.modules.get("sklearn.exceptions")
    other = getattr(sk, cls.__name__, None) if sk is not None else None
    if other is None:
        return cls
    twin = _TWINS.get(cls)
    if twin is None:
        twin = _TWINS[cls] = type(cls.__name__, (cls, other), {"__module__": __name__, "__doc__": cls.__doc__})
    return twin


def _rebuild_twin(name, args):
    return sklearn_class(_TWIN_CLASSES[name])(*args)


_TWIN_CLASSES = {c.__name__: c for c in (NotFittedError, ConvergenceWarning, DataConversionWarning)}


# --------------------------------------------------------------------------------------------
# parameters
# --------------------------------------------------------------------------------------------
class BaseEstimator:
    """Parameter handling compatible with scikit-learn, without importing it.

    Subclasses store every ``__init__`` argument unchanged under its own name and do all
    validation in ``fit``.
    """

    _estimator_type: str | None = None
    _fitted_attr = "coef_"  # present only after fit

    @classmethod
    def _get_param_names(cls):
        init = cls.__init__
        if init is object.__init__:
            return []
        sig = inspect.signature(init)
        names = []
        for p in sig.parameters.values():
            if p.name == "self":
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise RuntimeError(f"{cls.__name__}.__init__ must not take *args or **kwargs")
            names.append(p.name)
        return sorted(names)

    def get_params(self, deep=True):
        """Return the estimator's parameters.

        Parameters
        ----------
        deep : bool
            Accepted for scikit-learn compatibility (no parameter here is itself an estimator).

        Returns
        -------
        dict
            Parameter name -> value.
        """
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        """Set parameters; returns ``self``.

        Parameters
        ----------
        **params
            Parameter names of ``__init__`` and their new values.

        Returns
        -------
        self
        """
        valid = set(self._get_param_names())
        for key, value in params.items():
            if key not in valid:
                raise ValueError(
                    f"Invalid parameter {key!r} for estimator {type(self).__name__}; "
                    f"valid parameters are {sorted(valid)}"
                )
            setattr(self, key, value)
        return self

    def __repr__(self):
        sig = inspect.signature(type(self).__init__)
        changed = []
        for name in self._get_param_names():
            default = sig.parameters[name].default
            value = getattr(self, name)
            try:
                same = value is default or bool(value == default)
            except Exception:  # arrays etc.
                same = False
            if not same:
                changed.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(changed)})"

    def __sklearn_tags__(self):
        """Tags for scikit-learn >= 1.6 (imported lazily: only scikit-learn calls this)."""
        from sklearn.utils import ClassifierTags, RegressorTags, Tags, TargetTags

        tags = Tags(estimator_type=self._estimator_type, target_tags=TargetTags(required=True))
        if self._estimator_type == "classifier":
            tags.classifier_tags = ClassifierTags()
        elif self._estimator_type == "regressor":
            tags.regressor_tags = RegressorTags()
        tags.input_tags.sparse = True
        return tags

    # -- helpers for subclasses --------------------------------------------------------------
    def _check_is_fitted(self):
        if not hasattr(self, self._fitted_attr):
            raise sklearn_class(NotFittedError)(
                f"This {type(self).__name__} instance is not fitted yet; call 'fit' first."
            )


class ClassifierMixin:
    """Mixin adding ``score`` (weighted accuracy)."""

    _estimator_type = "classifier"

    def score(self, X, y, sample_weight=None):
        """Mean (weighted) accuracy of ``predict(X)`` against ``y``.

        Parameters
        ----------
        X : array-like or sparse matrix, shape [N, D]
        y : array-like, shape [N]
        sample_weight : array-like, shape [N], optional

        Returns
        -------
        float
        """
        pred = _to_numpy(self.predict(X))
        y = _labels_to_numpy(y)
        if y.shape != pred.shape:
            raise ValueError(f"y has shape {y.shape}, expected {pred.shape}")
        correct = (pred == y).astype(np.float64)
        if sample_weight is None:
            return float(correct.mean())
        sw = np.asarray(_to_numpy(sample_weight), dtype=np.float64).reshape(-1)
        if sw.shape != correct.shape:
            raise ValueError(f"sample_weight has shape {sw.shape}, expected {correct.shape}")
        return float((correct * sw).sum() / sw.sum())


class RegressorMixin:
    """Mixin adding ``score`` (coefficient of determination R^2, uniform over outputs)."""

    _estimator_type = "regressor"

    def score(self, X, y, sample_weight=None):
        """Coefficient of determination R^2 of ``predict(X)``.

        Parameters
        ----------
        X : array-like or sparse matrix, shape [N, D]
        y : array-like, shape [N] or [N, m]
        sample_weight : array-like, shape [N], optional

        Returns
        -------
        float
            Averaged uniformly over outputs for 2-D ``y``.
        """
        pred = np.asarray(_to_numpy(self.predict(X)), dtype=np.float64)
        y = np.asarray(_to_numpy(y), dtype=np.float64)
        if y.shape != pred.shape:
            raise ValueError(f"y has shape {y.shape}, expected {pred.shape}")
        return r2_score(y, pred, sample_weight)


def r2_score(y, pred, sample_weight=None):
    """Weighted R^2 (uniform average over columns), float64 numpy.

    Parameters
    ----------
    y, pred : numpy.ndarray, shape [N] or [N, m]
    sample_weight : array-like, shape [N], optional

    Returns
    -------
    float
    """
    y2 = y.reshape(len(y), -1)
    p2 = pred.reshape(len(pred), -1)
    sw = np.ones(len(y2)) if sample_weight is None else np.asarray(_to_numpy(sample_weight), np.float64).reshape(-1)
    mean = (sw[:, None] * y2).sum(0) / sw.sum()
    ss_res = (sw[:, None] * (y2 - p2) ** 2).sum(0)
    ss_tot = (sw[:, None] * (y2 - mean) ** 2).sum(0)
    r2 = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), np.where(ss_res == 0, 1.0, 0.0))
    return float(r2.mean())


# --------------------------------------------------------------------------------------------
# input conversion
# --------------------------------------------------------------------------------------------
class DataInfo:
    """What ``fit``/``predict`` learned about the design matrix.

    Attributes
    ----------
    n_samples, n_features : int
    device : torch.device
    dtype : torch.dtype
        Compute dtype (float64 for float64 X, float32 otherwise).
    kind : {"numpy", "torch"}
        Output type for arrays derived from this input.
    finite_check : FiniteCheck or None
        The design matrix's NaN / inf check, when :func:`as_design_matrix` was asked to defer it.
    feature_names : numpy.ndarray of str, or None
        A DataFrame's column names (scikit-learn's ``feature_names_in_``).
    """

    __slots__ = ("n_samples", "n_features", "device", "dtype", "kind", "finite_check", "feature_names")

    def __init__(self, n_samples, n_features, device, dtype, kind, finite_check=None, feature_names=None):
        self.n_samples = n_samples
        self.n_features = n_features
        self.device = device
        self.dtype = dtype
        self.kind = kind
        self.finite_check = finite_check
        self.feature_names = feature_names


def feature_names(X):
    """A DataFrame's column names as scikit-learn keeps them (``feature_names_in_``), or None.

    Parameters
    ----------
    X : any input
        Names are read from ``X.columns`` (pandas and other dataframes); other inputs have none.

    Returns
    -------
    numpy.ndarray of object (str), or None
        None also where every name is a non-string (e.g. a default ``RangeIndex``).
    """
    cols = getattr(X, "columns", None)
    if cols is None:
        return None
    names = np.asarray(list(cols), dtype=object)
    is_str = [isinstance(c, str) for c in names]
    if not any(is_str):
        return None
    if not all(is_str):
        kinds = sorted({type(c).__name__ for c in names})
        raise TypeError(f"Feature names are only supported if all input features have string names, but "
                        f"your input has {kinds} as feature name / column name types. Convert them all "
                        "to strings, e.g. X.columns = X.columns.astype(str)")
    return names


def record_features(estimator, info: DataInfo):
    """Set ``n_features_in_`` and (for a DataFrame) ``feature_names_in_`` at the end of ``fit``."""
    estimator.n_features_in_ = info.n_features
    if info.feature_names is not None:
        estimator.feature_names_in_ = info.feature_names
    elif "feature_names_in_" in vars(estimator):  # refitted on data without names
        del estimator.feature_names_in_


def check_features(estimator, info: DataInfo, name: str):
    """Check a predict-time X against ``fit``'s: the feature count (an error) and the names
    (scikit-learn's rules: different names are an error, names on one side only a warning)."""
    if info.n_features != estimator.n_features_in_:
        raise ValueError(f"X has {info.n_features} features, but {name} is expecting "
                         f"{estimator.n_features_in_} features as input")
    fitted, given = getattr(estimator, "feature_names_in_", None), info.feature_names
    if fitted is None and given is None:
        return
    if fitted is None:
        warn_user(f"X has feature names, but {name} was fitted without feature names", UserWarning)
    elif given is None:
        warn_user(f"X does not have valid feature names, but {name} was fitted with feature names", UserWarning)
    elif len(fitted) != len(given) or bool((np.asarray(fitted) != given).any()):
        seen, now = set(fitted), set(given)
        unseen = [c for c in given if c not in seen]
        missing = [c for c in fitted if c not in now]
        detail = (f"; unseen at fit time: {unseen[:5]}" if unseen else "") + (
            f"; seen at fit time, now missing: {missing[:5]}" if missing else "")
        raise ValueError("The feature names should match those that were passed during fit"
                         + (detail or " (the same names in another order)"))


class FiniteCheck:
    """A NaN / inf check of a large input, queued on the device when a solver starts and read with
    the solver's first host copy (its start objective), instead of a read of X and a sync of its own.

    The check's reduction then runs on the GPU while the host binds the solver's launches, and a
    bad X is reported by the exact check's error (with the NaN and inf counts) before any result
    that X produced is used.

    Parameters
    ----------
    t : torch.Tensor
        The values to check (a dense X, or a CSR matrix's values); never modified.
    name : str
        The argument's name, used in the error message.
    """

    def __init__(self, t, name):
        self.t, self.name, self.flag = t, name, None

    def queue(self):
        """Queue the reduction (no sync); return its [1] float64 flag (1: finite), also kept as
        :attr:`flag`. NaN and +-inf propagate into the sum (see :func:`check_finite_fast`)."""
        t = self.t
        if not t.is_floating_point() or t.numel() == 0:
            self.flag = torch.ones(1, dtype=torch.float64, device=t.device)
        else:
            self.flag = _sum_is_finite(t).to(torch.float64).reshape(1)
        return self.flag

    def resolve(self, value):
        """Given the flag's host value, raise the exact check's ``ValueError`` for a non-finite input
        (a non-finite sum of finite values, an overflow, passes)."""
        if not value > 0.5:
            check_finite(self.t, self.name)


def _is_dask(X) -> bool:
    mod = type(X).__module__
    if not mod.startswith("dask"):
        return False
    import fusedml.streaming as streaming  # lazy: only dask inputs need it

    return streaming.is_dask_array(X)


def compute_dtype(storage_dtype) -> torch.dtype:
    """float64 for float64 storage, float32 for every other floating storage dtype."""
    return torch.float64 if storage_dtype in (torch.float64, np.float64, np.dtype("float64")) else torch.float32


def as_design_matrix(X, *, backend="auto", name="X", check=True, align_rows=None):
    """Convert ``X`` to what ``fusedml.mmchain`` reads, without copying what need not be copied.

    Parameters
    ----------
    X : numpy array, torch tensor (any device), scipy.sparse CSR, torch sparse CSR,
        :class:`fusedml.CSRMatrix`, dask array, or nested sequences; shape [N, D].
    backend : str
        Only used to pick the device of a dask input (``"cpu"`` keeps it on the host).
    name : str
        Argument name for error messages.
    check : bool or "defer"
        Reject NaN / infinity: here (True), or (``"defer"``) through ``info.finite_check``, a
        :class:`FiniteCheck` that a solver queues and reads with its first host copy.
    align_rows : bool, optional
        A dask input's ``StreamedMatrix(align_rows=...)``; None: the streaming options' setting.

    Returns
    -------
    M : torch.Tensor [N, D] or CSRMatrix or StreamedMatrix
    info : DataInfo
    """
    if _is_dask(X):
        import fusedml.streaming as streaming

        if X.ndim != 2:
            raise ValueError(f"{name} must be 2-D [n_samples, n_features], got shape {X.shape}")
        device = "cuda" if (backend != "cpu" and torch.cuda.is_available()) else "cpu"
        M = streaming.StreamedMatrix(X, device=device, **({} if align_rows is None else {"align_rows": align_rows}))
        n, d = (int(s) for s in X.shape)
        _check_not_empty((n, d), name)
        dev = torch.device(getattr(M, "device", device))
        return M, DataInfo(n, d, dev, compute_dtype(M.dtype), "numpy")
    if is_sparse(X):
        kind = "torch" if isinstance(X, torch.Tensor) else "numpy"
        if not isinstance(X, (CSRMatrix, torch.Tensor)):
            if X.format != "csr":
                raise TypeError(f"{name}: unsupported sparse format {X.format!r}; only CSR is supported (use X.tocsr())")
            if X.dtype.kind == "c":
                raise ValueError(f"{name}: Complex data not supported")
            if X.dtype not in (np.float32, np.float64, np.float16):  # integers, bool, longdouble
                X = X.astype(np.float64)
            if not X.has_canonical_format:  # sorted, no duplicates; copies, never modifies X
                X = X.copy()
                X.sum_duplicates()
        M = as_csr_remembered(X, name)  # a torch sparse tensor: the same CSRMatrix (and caches) across fits
        _check_not_empty(tuple(M.shape), name)
        n, d = M.shape
        info = DataInfo(n, d, M.device, compute_dtype(M.dtype), kind)
        _check_design(M.val, name, check, info)
        return M, info
    if isinstance(X, torch.Tensor):
        kind = "torch"
        if X.is_complex():
            raise ValueError(f"{name}: Complex data not supported")
        if X.requires_grad:
            X = X.detach()  # its values (fits are not differentiable)
        T = X if X.is_floating_point() else X.to(torch.float64)
    else:
        kind = "numpy"
        arr = torch_viewable(np.asarray(X))  # ">f4" stays float32
        if arr.dtype.kind in "US":
            raise TypeError(f"{name} must hold numbers, got dtype {arr.dtype}")
        if arr.dtype == object:  # numbers held as Python objects (e.g. from pandas): converted
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{name} must hold numbers (dtype object): {exc}") from None
        if arr.dtype.kind in "biuc":
            if arr.dtype.kind == "c":
                raise ValueError(f"{name}: Complex data not supported")
            arr = arr.astype(np.float64)
        if arr.dtype not in (np.float32, np.float64, np.float16):
            arr = arr.astype(np.float64)
        if not arr.flags.writeable:
            arr = arr.copy()
        T = torch.from_numpy(arr) if arr.ndim else torch.tensor(arr)
    if T.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D [n_samples, n_features], got shape {tuple(T.shape)}"
            + ("; Reshape your data: X.reshape(-1, 1) for a single feature, X.reshape(1, -1) for a "
               "single sample" if T.ndim == 1 else "")
        )
    _check_not_empty(tuple(T.shape), name)
    info = DataInfo(int(T.shape[0]), int(T.shape[1]), T.device, compute_dtype(T.dtype), kind,
                    feature_names=feature_names(X))
    _check_design(T, name, check, info)
    return T, info


def _check_not_empty(shape, name):
    """Reject a design matrix without samples or features (scikit-learn's wording)."""
    for size, what in ((shape[0], "sample"), (shape[1], "feature")):
        if size == 0:
            raise ValueError(f"{name} is empty: found array with 0 {what}(s) (shape={shape}) while a "
                             "minimum of 1 is required.")


# one-column fits copy unaligned rows from this size of X: on the H100 with the copy kernel, every
# Newton-type fit timed (logistic, LinearSVC, Poisson) gained from 0.44 GB (+0.75..+2.67 ms at
# 0.44-0.55 GB; 0.6-8.4 ms from 0.66 GB) and was mixed at 0.32-0.40 GB (-0.56..+1.52 ms); the CG
# least-squares fits (3 iterations) lost 0.5-1.2 ms at every size timed
# (env_ab_align_{mid,large,kernel}-H100-*-s41, env_ab_align_lowsizes-H100-*-s42)
ONE_COLUMN_COPY_BYTES = 400 << 20


def fit_design(M, backend, m=1, *, one_column_copy_bytes=None):
    """The design matrix a linear fit reads at every iteration.

    On the fused backend a dense X whose rows are not whole 16-byte vectors (e.g. 55 fp32 values)
    is read with scalar loads; an aligned view of a zero-padded copy (:func:`fusedml.aligned_rows`)
    is read with full-width ones. The fit makes that copy (part of its time; the fit is the same)
    where it paid on the H100 (``env_ab_align*-H100-*-s40*``, ``-s41``): for ``m > 1`` columns of
    coefficients (multinomial, one-vs-rest, several targets: 2M x 27, 5 classes, 18.7 -> 8.9 ms);
    for one column only from ``one_column_copy_bytes`` of X (a fit at a million rows is host-bound
    and lost the copy's ~0.5-1 ms; see :data:`ONE_COLUMN_COPY_BYTES`). Only when the copy takes at
    most half of the device's free memory, and for rows of at most 64 KB (wider ones go to the
    cooperative kernel). ``FUSEDML_ALIGN_ROWS``: ``auto`` (default, as above), ``1`` (every fit),
    ``0`` (never). An X that already is such a view is read as it is.

    Parameters
    ----------
    M : torch.Tensor, CSRMatrix or StreamedMatrix
        From :func:`as_design_matrix`; only dense tensors are ever copied.
    backend : str
        The estimator's backend.
    m : int
        Columns of the coefficients (the products' right-hand sides).
    one_column_copy_bytes : int or None
        Size of X from which a one-column fit copies under ``auto``; None: never.

    Returns
    -------
    torch.Tensor, CSRMatrix or StreamedMatrix
        ``M`` or its aligned copy (same shape and values).
    """
    mode = align_mode()
    if mode == "auto" and m < 2 and isinstance(M, torch.Tensor) and (
            one_column_copy_bytes is None or M.numel() * M.element_size() < one_column_copy_bytes):
        return M
    return aligned_copy(M, backend)


def aligned_copy(M, backend):
    """``M``, or its aligned-rows copy (:func:`fusedml.aligned_rows`) for the fused backend.

    The copy is made only for a dense ``[N, D]`` tensor whose rows are not whole 16-byte vectors,
    on the fused backend, with rows of at most 64 KB (wider ones go to the cooperative kernel), when
    it takes at most half of the device's free memory, and unless ``FUSEDML_ALIGN_ROWS=0``. The
    caller decides whether the fit reads X often enough to pay for it (:func:`fit_design`).

    Parameters
    ----------
    M : torch.Tensor or any design matrix
        Anything but a dense strided tensor is returned as it is.
    backend : str
        The estimator's backend.

    Returns
    -------
    torch.Tensor or the input's type
        ``M`` or the aligned copy (same shape and values).
    """
    if align_mode() == "0" or not isinstance(M, torch.Tensor) or M.layout != torch.strided:
        return M
    try:
        if fusedml.resolve_backend(backend, M.device) != "fused":
            return M
    except fusedml.BackendUnavailableError:
        return M  # the fit raises it with its own message
    if M.ndim != 2 or M.shape[1] * M.element_size() > 64 << 10:
        return M  # rows over 64 KB: the cooperative kernel, which reads a row its own way
    room = None
    if M.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(M.device)
        room = (free + torch.cuda.memory_reserved(M.device) - torch.cuda.memory_allocated(M.device)) // 2
    return fusedml.aligned_rows(M, max_bytes=room)


def _check_design(t, name, check, info):
    if check == "defer":
        info.finite_check = FiniteCheck(t, name)
    elif check:
        check_finite_fast(t, name)


def check_finite_fast(t: torch.Tensor, name: str) -> None:
    """:func:`fusedml._validation.check_finite` without its X-sized temporary in the common case.

    One reduction (``sum``, fp32 or fp64 accumulation) reads ``t`` once and allocates nothing
    of its size: NaN and +-inf propagate into the sum, so a finite sum proves ``t`` finite. Only
    a non-finite sum (bad data, or an overflow of huge finite values) runs the exact check, which
    raises with the NaN / inf counts.

    Parameters
    ----------
    t : torch.Tensor
        Any shape; integer and bool tensors are accepted unchecked.
    name : str
        The argument's name, used in the error message.
    """
    if not t.is_floating_point() or t.numel() == 0:
        return
    if not _sum_is_finite(t).item():
        check_finite(t, name)


def _sum_is_finite(t):
    """Whether the sum of the floating tensor ``t`` (fp32 or fp64 accumulation) is finite, a device bool."""
    return torch.isfinite(t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32))


def _to_numpy(a):
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    if hasattr(a, "compute") and type(a).__module__.startswith("dask"):
        return np.asarray(a.compute())
    return np.asarray(a)


def _labels_to_numpy(y):
    y = _to_numpy(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.ravel()
    return y


def _require_y(y):
    if y is None:
        raise ValueError("This estimator requires y to be passed, but the target y is None")


def _warn_column_vector(shape):
    """scikit-learn's warning for a [N, 1] target where [N] is expected (the target is raveled)."""
    if len(shape) == 2 and shape[1] == 1:
        warn_user("A column-vector y was passed when a 1d array was expected; it is raveled to shape "
                  "(n_samples,)", sklearn_class(DataConversionWarning))


def _check_label_values(labels):
    """Reject floating-point labels that are not integers (scikit-learn's 'continuous' target)."""
    a = np.asarray(labels)
    if a.dtype.kind == "f" and not bool(np.all(a == np.round(a))):
        raise ValueError("Unknown label type: continuous. A classifier needs class labels (integers, "
                         "integral floats or strings); use a regressor for a continuous target")


def as_target(y, info: DataInfo, *, name="y", allow_2d=False, max_cols=None):
    """Convert a numeric regression target to a tensor on the data's device.

    Parameters
    ----------
    y : array-like or torch tensor, shape [N] (or [N, m] when ``allow_2d``)
    info : DataInfo
    name : str
    allow_2d : bool
    max_cols : int, optional

    Returns
    -------
    torch.Tensor
        [N] or [N, m], compute dtype, on ``info.device``.
    """
    _require_y(y)
    if isinstance(y, torch.Tensor):
        t = y.detach()
    else:
        arr = _to_numpy(y)
        if arr.dtype.kind in "US":
            raise TypeError(f"{name} must be numeric for a regressor, got dtype {arr.dtype}")
        try:  # an object array of numbers converts; anything else is an error
            t = torch.from_numpy(np.array(arr, dtype=np.float64, copy=True))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be numeric for a regressor (dtype {arr.dtype}): {exc}") from None
    if t.ndim == 2 and t.shape[1] == 1 and not allow_2d:
        _warn_column_vector(tuple(t.shape))
        t = t.reshape(-1)
    if t.ndim not in ((1, 2) if allow_2d else (1,)):
        raise ValueError(f"{name} must be 1-D [n_samples]{' or 2-D' if allow_2d else ''}, got shape {tuple(t.shape)}")
    if t.shape[0] != info.n_samples:
        raise ValueError(f"{name} has {t.shape[0]} samples but X has {info.n_samples}")
    if t.ndim == 2 and t.shape[1] == 0:
        raise ValueError(f"{name} has no target columns")
    if max_cols is not None and t.ndim == 2 and t.shape[1] > max_cols:
        raise ValueError(f"{name} has {t.shape[1]} columns; at most {max_cols} are supported")
    t = t.to(device=info.device, dtype=info.dtype)
    check_finite(t, name)
    return t


def as_sample_weight(sample_weight, info: DataInfo):
    """Validate ``sample_weight`` (None, a scalar, or [N] non-negative finite weights).

    Returns
    -------
    torch.Tensor or None
        [N] in the compute dtype on the data's device; None means unit weights.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Number):
        sw = torch.full((info.n_samples,), float(sample_weight), dtype=info.dtype, device=info.device)
    elif isinstance(sample_weight, torch.Tensor):
        sw = sample_weight.detach().to(device=info.device, dtype=info.dtype)
    else:
        arr = _to_numpy(sample_weight)
        if arr.dtype == object or arr.dtype.kind in "USO":
            raise TypeError(f"sample_weight must be numeric, got dtype {arr.dtype}")
        sw = torch.from_numpy(np.array(arr, dtype=np.float64, copy=True)).to(device=info.device, dtype=info.dtype)
    if sw.ndim != 1 or sw.shape[0] != info.n_samples:
        raise ValueError(f"sample_weight must have shape ({info.n_samples},), got {tuple(sw.shape)}")
    check_finite(sw, "sample_weight")
    if bool((sw < 0).any()):
        raise ValueError("sample_weight must be non-negative")
    if not bool((sw > 0).any()):
        raise ValueError("sample_weight sums to zero: at least one sample needs a positive weight")
    return sw


def normalised_weights(sw, info: DataInfo):
    """Total sample weight and the per-sample weights divided by it.

    Parameters
    ----------
    sw : torch.Tensor [N] or None
        From :func:`as_sample_weight` (None: unit weights).
    info : DataInfo

    Returns
    -------
    total : float
        ``sum_i s_i`` (``N`` for unit weights), summed in float64.
    weights : float or torch.Tensor
        ``1 / total`` for unit weights, else ``sw / total`` [N].
    """
    total = float(info.n_samples) if sw is None else float(sw.sum(dtype=torch.float64))
    if not total > 0:  # e.g. class weights of 0 on every class present
        raise ValueError("the sample weights (times any class weights) sum to zero: nothing to fit")
    return total, (1.0 / total if sw is None else sw / total)


def _two_labels(t: torch.Tensor):
    """``(classes, y_idx, [lo, hi] on the host)`` of a tensor of exactly two distinct finite labels,
    without the sort of ``torch.unique`` (~25 launches and a radix sort over N values at a million
    rows): its min, max and the count of other values in one host read. None otherwise (NaN or
    inf, one label, three or more), for the general path and its errors."""
    if t.numel() == 0 or t.dtype == torch.bool or t.is_complex():
        return None
    lo, hi = torch.aminmax(t)
    other = ((t != lo) & (t != hi)).sum()
    v = torch.stack([lo.double(), hi.double(), other.double()]).tolist()
    if not (math.isfinite(v[0]) and math.isfinite(v[1])) or v[0] == v[1] or v[2] != 0:
        return None
    return torch.stack([lo, hi]), (t == hi).to(torch.int64), v[:2]


def encode_labels(y, info: DataInfo):
    """Encode class labels (numbers or strings) as integer indices into sorted ``classes_``.

    Parameters
    ----------
    y : array-like or torch tensor, shape [N]
    info : DataInfo

    Returns
    -------
    classes : numpy.ndarray or torch.Tensor
        Sorted unique labels; a torch tensor (on y's device) when ``y`` is a torch tensor.
    y_idx : torch.Tensor
        [N] int64 on the data's device.
    """
    _require_y(y)
    if isinstance(y, torch.Tensor):
        t = y.detach()
        _warn_column_vector(tuple(t.shape))
        if t.ndim == 2 and t.shape[1] == 1:
            t = t.reshape(-1)
        if t.ndim != 1:
            raise ValueError(f"y must be 1-D [n_samples], got shape {tuple(t.shape)}")
        two = _two_labels(t)
        if two is not None:  # binary labels: no sort
            classes, y_idx, lo_hi = two
            y_idx = y_idx.to(info.device)
        else:
            if t.is_floating_point():
                check_finite(t, "y")
            classes, inv = torch.unique(t, sorted=True, return_inverse=True)
            y_idx = inv.to(device=info.device, dtype=torch.int64)
            lo_hi = classes.cpu().double().numpy() if classes.is_floating_point() else ()  # K values
        _check_label_values(lo_hi)
    else:
        arr = _to_numpy(y)
        _warn_column_vector(arr.shape)
        arr = _labels_to_numpy(arr)
        if arr.ndim != 1:
            raise ValueError(f"y must be 1-D [n_samples], got shape {arr.shape}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError("y contains NaN or infinite labels")
        if arr.dtype == object:
            try:
                arr = arr.astype(str) if all(isinstance(v, str) for v in arr) else arr
            except Exception:  # pragma: no cover
                pass
        try:
            classes, inv = np.unique(arr, return_inverse=True)
        except TypeError as exc:
            raise TypeError(f"y labels are not mutually comparable: {exc}") from None
        _check_label_values(classes)
        y_idx = torch.from_numpy(inv.reshape(-1).astype(np.int64)).to(info.device)
    if y_idx.shape[0] != info.n_samples:
        raise ValueError(f"y has {y_idx.shape[0]} samples but X has {info.n_samples}")
    if len(classes) < 2:
        raise ValueError(
            f"The data contains only one class ({classes[0]!r}); a classifier needs at least 2 classes"
        )
    return classes, y_idx


def class_weights(class_weight, classes, y_idx, sample_weight, info: DataInfo):
    """Per-sample weights combining ``sample_weight`` and ``class_weight`` (as scikit-learn).

    ``"balanced"`` uses ``sum(s) / (K * sum_{i in k} s_i)`` (scikit-learn's weighted equivalent of
    ``n_samples / (K * bincount(y))``). A dict maps labels to weights (missing labels: 1).

    Returns
    -------
    torch.Tensor or None
        [N] weights, or None when every weight is 1.
    """
    return weigh_by_class(class_weight_vector(class_weight, classes, y_idx, sample_weight, info), y_idx,
                          sample_weight, info)


def weigh_by_class(cw, y_idx, sample_weight, info: DataInfo):
    """``sample_weight`` times each sample's class weight ``cw[y_idx]`` (see :func:`class_weights`).

    Parameters
    ----------
    cw : torch.Tensor [K] or None
        From :func:`class_weight_vector` (None: ``sample_weight`` is returned as it is).
    y_idx : torch.Tensor, shape [N] int64
    sample_weight : torch.Tensor [N] or None
    info : DataInfo

    Returns
    -------
    torch.Tensor or None
        [N] weights, or None when every weight is 1.
    """
    if cw is None:
        return sample_weight
    per = cw.to(info.dtype)[y_idx]
    return per if sample_weight is None else per * sample_weight


def class_weight_vector(class_weight, classes, y_idx, sample_weight, info: DataInfo):
    """The weight of each class (see :func:`class_weights`).

    Parameters
    ----------
    class_weight : None, "balanced" or dict
    classes : numpy.ndarray or torch.Tensor, shape [K]
    y_idx : torch.Tensor, shape [N] int64
        Each sample's class index.
    sample_weight : torch.Tensor [N] or None
    info : DataInfo

    Returns
    -------
    torch.Tensor or None
        [K] float64 on the data's device; None for ``class_weight=None``.
    """
    if class_weight is None:
        return None
    K = len(classes)
    if isinstance(class_weight, str):
        if class_weight != "balanced":
            raise ValueError(f"class_weight must be None, 'balanced' or a dict, got {class_weight!r}")
        s = sample_weight if sample_weight is not None else torch.ones(info.n_samples, dtype=info.dtype, device=info.device)
        counts = torch.zeros(K, dtype=torch.float64, device=info.device).index_add_(0, y_idx, s.double())
        if bool((counts <= 0).any()):
            raise ValueError("class_weight='balanced': a class has zero total sample weight")
        cw = counts.sum() / (K * counts)
    elif isinstance(class_weight, dict):
        labels = _to_numpy(classes).tolist()
        unknown = [k for k in class_weight if k not in labels]
        if unknown:
            raise ValueError(f"class_weight keys {unknown} are not among the classes {labels}")
        cw = torch.tensor([float(class_weight.get(c, 1.0)) for c in labels], dtype=torch.float64, device=info.device)
        if bool((cw < 0).any()) or not bool(torch.isfinite(cw).all()):
            raise ValueError("class_weight values must be finite and non-negative")
    else:
        raise TypeError(f"class_weight must be None, 'balanced' or a dict, got {type(class_weight).__name__}")
    return cw


def classification_data(X, y, sample_weight, class_weight, backend, check=True):
    """Validate a classifier's ``fit`` inputs.

    Parameters
    ----------
    X : design matrix accepted by :func:`as_design_matrix`, shape [N, D]
    y : array-like, shape [N]
        Class labels.
    sample_weight : array-like, shape [N], or None
    class_weight : None, "balanced" or dict
    backend : str
    check : bool or "defer"
        X's NaN / inf check (see :func:`as_design_matrix`).

    Returns
    -------
    M : torch.Tensor, CSRMatrix or StreamedMatrix
    info : DataInfo
    classes : numpy.ndarray or torch.Tensor, shape [K]
    y_idx : torch.Tensor, shape [N] int64
    sw : torch.Tensor [N] or None
        Sample weights times class weights (None: all 1).
    """
    M, info = as_design_matrix(X, backend=backend, check=check)
    classes, y_idx = encode_labels(y, info)
    sw = as_sample_weight(sample_weight, info)
    sw = class_weights(class_weight, classes, y_idx, sw, info)
    return M, info, classes, y_idx, sw


def to_output(t: torch.Tensor, kind: str):
    """Return ``t`` as a torch tensor (``kind == "torch"``) or a numpy array."""
    if kind == "torch":
        return t
    return t.detach().cpu().numpy()


def output_kind(X) -> str:
    """``"torch"`` for torch tensors (dense or sparse), ``"numpy"`` otherwise."""
    return "torch" if isinstance(X, torch.Tensor) else "numpy"


def take_labels(classes, idx: torch.Tensor, kind: str):
    """Map class indices to labels in the output type.

    Parameters
    ----------
    classes : numpy.ndarray or torch.Tensor, shape [K]
    idx : torch.Tensor, shape [N] int64
    kind : {"numpy", "torch"}
    """
    if isinstance(classes, torch.Tensor):
        out = classes.to(idx.device)[idx]
        return out if kind == "torch" else out.cpu().numpy()
    labels = classes[idx.cpu().numpy()]
    if kind == "torch" and labels.dtype.kind in "biuf":
        return torch.from_numpy(labels).to(idx.device)
    return labels


class History:
    """Per-iteration record kept by the solvers (``history_``) and the ``verbose`` printer.

    Parameters
    ----------
    name : str
        Printed before each line.
    verbose : int
        0: silent, >= 1: one line per iteration.
    """

    def __init__(self, name: str, verbose: int = 0):
        self.name = name
        self.verbose = check_verbose(verbose)
        self.records = []
        self.t0 = time.perf_counter()

    def add(self, it, objective, grad_norm, step, **extra):
        rec = {
            "iter": int(it),
            "objective": float(objective),
            "grad_norm": float(grad_norm),
            "step": float(step),
            "time": time.perf_counter() - self.t0,
        }
        rec.update(extra)
        self.records.append(rec)
        if self.verbose:
            more = "".join(f" {k}={v}" for k, v in extra.items())
            print(
                f"[{self.name}] iter {rec['iter']:4d}  objective {rec['objective']:.10g}  "
                f"grad_norm {rec['grad_norm']:.4g}  step {rec['step']:.4g}{more}  ({rec['time']:.3f} s)",
                flush=True,
            )


def warn_not_converged(name: str, max_iter: int, reason: str | None = None):
    """Emit a :class:`ConvergenceWarning` for an estimator, attributed to the user's line (:func:`warn_user`)."""
    msg = reason or (
        f"{name} did not converge within max_iter={max_iter} iterations; increase max_iter "
        "or loosen tol (the result is the last iterate)"
    )
    warn_user(msg, sklearn_class(ConvergenceWarning))


def warn_solver_status(name: str, status, max_iter: int, tol: float, dtype):
    """Warn (from an estimator's ``fit``) unless every solver problem converged.

    Parameters
    ----------
    name : str
        Estimator name for the messages.
    status : list of str
        ``SolverResult.status``: "converged", "max_iter" or "stalled" per problem.
    max_iter : int
    tol : float
    dtype : torch.dtype
        Working precision, named when the solver stalled.

    Any problem stopped by ``max_iter`` gives the generic warning; otherwise a stalled problem
    gives the working-precision one.
    """
    if "max_iter" in status:
        warn_not_converged(name, max_iter)
    elif "stalled" in status:
        warn_not_converged(name, max_iter,
                           f"{name}: the solver stopped making progress at working "
                           f"precision ({dtype}) before reaching tol={tol:g}")


def check_positive(value, name, *, strict=True, allow_inf=False):
    """Validate a scalar hyper-parameter."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if np.isnan(v) or (np.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if (strict and v <= 0) or (not strict and v < 0):
        raise ValueError(f"{name} must be {'>' if strict else '>='} 0, got {value!r}")
    return v


def check_flag(value, name):
    """Validate a boolean hyper-parameter (``True`` / ``False``; numpy bools too): a string such as
    ``"no"`` would otherwise count as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_verbose(value):
    """Validate ``verbose``: None, a bool or an int >= 0."""
    if value is None:
        return 0
    if not isinstance(value, (numbers.Integral, np.bool_)) or value < 0:
        raise ValueError(f"verbose must be an int >= 0 (or a bool), got {value!r}")
    return int(value)


def check_max_iter(value, name="max_iter"):
    """Validate an iteration cap (positive int)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class LinearPredictMixin:
    """Linear predictor ``[X, 1] W`` for fitted linear models, W built from ``coef_`` and ``intercept_``."""

    def _linear_predictor(self, X):
        """Return ``(eta [N, K] tensor, output kind, DataInfo)`` for a predict-time ``X``."""
        from fusedml import BackendUnavailableError

        from ._loss import matvec

        self._check_is_fitted()
        M, info = as_design_matrix(X, backend=self.backend)
        check_features(self, info, type(self).__name__)
        # W from the public attributes (so coef_ set by hand or by fusedml.distributed is used)
        coef = torch.as_tensor(_to_numpy(self.coef_) if not isinstance(self.coef_, torch.Tensor) else self.coef_)
        coef = coef.reshape(-1, info.n_features).to(device=info.device, dtype=info.dtype)
        icpt = self.intercept_
        icpt = torch.as_tensor(icpt if isinstance(icpt, torch.Tensor) else np.asarray(icpt, dtype=np.float64))
        icpt = icpt.reshape(-1).to(device=info.device, dtype=info.dtype).expand(coef.shape[0])
        W = torch.cat([coef.T, icpt[None, :]], dim=0)  # [D + 1, K]
        try:
            eta = matvec(M, W, intercept=True, backend=self.backend)
        except BackendUnavailableError:  # e.g. fitted with backend="fused" on CUDA, predicting on host data
            eta = matvec(M, W, intercept=True, backend="auto")
        return eta.to(info.dtype), output_kind(X), info

    def _set_linear_attributes(self, W, info: DataInfo, fit_intercept: bool, *, vector=False):
        """Store ``coef_`` ([K, D], or [D] when ``vector``) and ``intercept_`` from W [D~, K]."""
        D = info.n_features
        coef = W[:D].T.contiguous()
        icpt = W[D].clone() if fit_intercept else torch.zeros(W.shape[1], dtype=W.dtype, device=W.device)
        if vector:
            coef = coef[0]
            self.coef_ = to_output(coef, info.kind)
            self.intercept_ = float(icpt[0]) if info.kind == "numpy" else icpt[0]
        else:
            self.coef_ = to_output(coef, info.kind)
            self.intercept_ = to_output(icpt, info.kind)
        record_features(self, info)

    def _store_linear_fit(self, obj, res, info: DataInfo, hist, *, vector=False, **fit_info):
        """Store what every solver-trained linear model keeps after ``fit``.

        ``_fit_info`` (counts from the objective ``obj``, the solver status, dtype, device, plus
        ``fit_info``), ``coef_`` / ``intercept_`` / ``n_features_in_`` from ``res.W`` and
        ``history_`` from ``hist``.
        """
        self._fit_info = {"intercept": bool(self.fit_intercept), "n_matvec": obj.n_matvec,
                          "n_mmchain": obj.n_mmchain, "n_xtv": obj.n_xtv,
                          "n_lossgrad": obj.n_lossgrad, "status": res.status, "dtype": info.dtype,
                          "device": info.device, **fit_info}
        self._set_linear_attributes(res.W, info, self.fit_intercept, vector=vector)
        self.history_ = hist.records


class LinearClassifierMixin(LinearPredictMixin):
    """Decision values and labels of a fitted linear classifier (``classes_``, one column if binary)."""

    def _decision_values(self, X):
        """[N] (one column: positive means ``classes_[1]``) or [N, K] linear predictor."""
        eta, kind, _ = self._linear_predictor(X)
        return to_output(eta[:, 0] if eta.shape[1] == 1 else eta, kind)

    def _predict_labels(self, X):
        """[N] labels: sign of the single column, else the arg-max column."""
        eta, kind, _ = self._linear_predictor(X)
        idx = (eta[:, 0] > 0).to(torch.int64) if eta.shape[1] == 1 else eta.argmax(1)
        return take_labels(self.classes_, idx, kind)
