"""The one structure every fusedml data source returns."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TASKS = ("binary", "multiclass", "regression", "counts", "positive", "clustering", "unknown")


@dataclass
class Dataset:
    """A design matrix, its targets and what they are for.

    Attributes
    ----------
    X : numpy.ndarray, numpy.memmap, torch.Tensor, scipy.sparse.csr_matrix, fusedml.CSRMatrix or dask.array.Array
        ``[N, D]`` design matrix.
    y : numpy.ndarray, torch.Tensor, dask.array.Array or None
        ``[N]`` targets (class labels as int64, counts and continuous targets as floats);
        None when the source has no targets (e.g. a bare ``.npy`` file).
    name : str
        Short name (the bundled name, the file name, or the synthetic spec).
    task : str
        One of ``"binary"``, ``"multiclass"``, ``"regression"``, ``"counts"`` (non-negative
        integers: Poisson/Tweedie), ``"positive"`` (strictly positive continuous: Gamma),
        ``"clustering"`` (``y`` holds the true component labels, if known), ``"unknown"``.
    description : str
        One paragraph: origin, licence, preprocessing.
    truth : dict or None
        For synthetic data, the true model (``coef``, ``intercept``, ``means``, ...).
    feature_names : list of str or None
        Column names when the source has them.
    """

    X: object
    y: object
    name: str
    task: str
    description: str = ""
    truth: dict | None = field(default=None, repr=False)
    feature_names: list | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")

    @property
    def shape(self) -> tuple:
        """``(N, D)`` of ``X``."""
        return tuple(int(s) for s in self.X.shape)

    @property
    def nnz(self) -> int:
        """Stored entries of ``X`` (``N * D`` for dense data; for Dask arrays of CSR chunks, computed)."""
        X = self.X
        if hasattr(X, "nnz"):
            return int(X.nnz)
        if type(X).__module__.startswith("dask"):
            meta = getattr(X, "_meta", None)
            if meta is not None and hasattr(meta, "nnz"):
                import dask

                return int(sum(dask.compute(*[b.nnz for b in X.to_delayed().ravel()])))
        return int(np.prod(self.shape))

    @property
    def is_sparse(self) -> bool:
        """True for CSR data (scipy, torch sparse, :class:`fusedml.CSRMatrix` or Dask arrays of CSR chunks)."""
        import scipy.sparse as sp

        X = self.X
        if sp.issparse(X) or type(X).__name__ == "CSRMatrix":
            return True
        if getattr(X, "layout", None) is not None and str(X.layout) != "torch.strided":
            return True
        meta = getattr(X, "_meta", None)
        return meta is not None and sp.issparse(meta)

    def __str__(self) -> str:
        kind = "CSR" if self.is_sparse else "dense"
        return f"{self.name}: {kind} {self.shape[0]} x {self.shape[1]}, task={self.task}"


def infer_task(y) -> str:
    """Guess a task from targets: 2 distinct integers -> binary, a few -> multiclass,
    non-negative integers -> counts, positive -> positive, else regression.

    Parameters
    ----------
    y : numpy.ndarray
        ``[N]`` targets.

    Returns
    -------
    str
    """
    y = np.asarray(y)
    if y.size == 0:
        return "unknown"
    if y.dtype.kind in "iub" or np.all(np.mod(y, 1) == 0):
        n_unique = np.unique(y).size
        if n_unique == 2:
            return "binary"
        if n_unique <= 100 and n_unique < max(3, y.size // 5):
            return "multiclass"
        if y.min() >= 0:
            return "counts"
    if np.all(y > 0):
        return "positive"
    return "regression"
