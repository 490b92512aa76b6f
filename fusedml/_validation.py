"""Input validation and conversion shared by every operator and estimator.

Nothing here modifies its inputs: conversions copy when they must and return views otherwise.
"""
from __future__ import annotations

import sys
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _is_scipy_sparse(a) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency
        return False
    return sp.issparse(a)


def torch_viewable(arr: np.ndarray) -> np.ndarray:
    """``arr``, or a copy of it where ``torch.from_numpy`` cannot view it: byte-swapped dtypes
    (``">f4"`` from FITS, HDF5 or network formats) in the machine's order, negative strides
    (``X[::-1]``) or strides that are no multiple of the item size as a C-ordered copy. Read-only
    arrays are returned as they are."""
    if not arr.dtype.isnative:
        return arr.astype(arr.dtype.newbyteorder("="))
    if any(s < 0 or s % arr.itemsize for s in arr.strides):
        return np.array(arr, order="C", copy=True)  # ascontiguousarray keeps a size-1 axis's negative stride
    return arr


def to_tensor(a, name: str, *, dtype=None, device=None, ndim=None, allow_int=False) -> torch.Tensor:
    """Convert ``a`` (torch tensor, numpy array, scalar or sequence) to a dense torch tensor.

    Parameters
    ----------
    a : array-like
        The input; never modified (numpy inputs are wrapped without a copy where possible).
    name : str
        The argument's name, used in error messages.
    dtype : torch.dtype, optional
        Cast to this dtype (a copy only when it differs).
    device : torch.device, optional
        Move to this device.
    ndim : int or tuple of int, optional
        Allowed numbers of dimensions.
    allow_int : bool
        Accept integer and bool dtypes (otherwise only floating point).

    Returns
    -------
    torch.Tensor
    """
    if isinstance(a, torch.Tensor):
        if a.layout != torch.strided:
            raise TypeError(f"{name} must be a dense tensor here, got layout {a.layout}")
        t = a
    elif _is_scipy_sparse(a):
        raise TypeError(f"{name} must be dense, got a scipy.sparse matrix")
    else:
        arr = np.asarray(a)
        if arr.dtype == object:
            raise TypeError(f"{name} has dtype object; expected numbers")
        if arr.dtype.kind in "US":
            raise TypeError(f"{name} holds strings; expected numbers")
        arr = torch_viewable(arr)
        if not arr.flags.writeable:  # torch.from_numpy warns on read-only memory
            arr = arr.copy()
        t = torch.from_numpy(arr) if arr.ndim else torch.tensor(arr)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.ndim not in allowed:
            raise ValueError(f"{name} must have {' or '.join(map(str, allowed))} dimension(s), got shape {tuple(t.shape)}")
    if not allow_int and not t.is_floating_point():
        if dtype is None:
            raise TypeError(f"{name} must have a floating dtype {FLOAT_DTYPES}, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if device is not None and t.device != torch.device(device):
        t = t.to(device)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` if the floating tensor ``t`` holds NaN or infinity.

    Parameters
    ----------
    t : torch.Tensor
        Any shape; integer and bool tensors are accepted unchecked.
    name : str
        The argument's name, used in the error message (with the NaN and inf counts).
    """
    if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
        n_nan = int(torch.isnan(t).sum())
        n_inf = int(torch.isinf(t).sum())
        raise ValueError(f"{name} contains {n_nan} NaN and {n_inf} infinite value(s)")


@dataclass(frozen=True)
class CSRMatrix:
    """A CSR matrix held as three torch tensors (the layout every fusedml kernel reads).

    Attributes
    ----------
    crow : torch.Tensor
        ``[N + 1]`` row pointers, int32 or int64.
    col : torch.Tensor
        ``[nnz]`` column indices, same dtype as ``crow``, sorted and unique within each row.
    val : torch.Tensor
        ``[nnz]`` values, float32/float64/bfloat16/float16.
    shape : tuple of int
        ``(N, D)``.
    """

    crow: torch.Tensor
    col: torch.Tensor
    val: torch.Tensor
    shape: tuple

    @property
    def device(self) -> torch.device:
        """torch.device: the device of the values (crow and col live there too)."""
        return self.val.device

    @property
    def dtype(self) -> torch.dtype:
        """torch.dtype: the dtype of the stored values."""
        return self.val.dtype

    @property
    def nnz(self) -> int:
        """int: the number of stored entries."""
        return int(self.val.numel())

    def to(self, device=None, dtype=None) -> "CSRMatrix":
        """Return the matrix on ``device`` and/or with values of ``dtype`` (self is unchanged).

        Parameters
        ----------
        device : torch.device or str, optional
            Target device for crow, col and val; None keeps the current one.
        dtype : torch.dtype, optional
            Dtype of the values; the index dtype is kept. None keeps the current one.

        Returns
        -------
        CSRMatrix
            Same ``shape``; tensors that need no move or cast are shared, not copied.
        """
        val = self.val
        if dtype is not None:
            val = val.to(dtype)
        return CSRMatrix(self.crow.to(device) if device is not None else self.crow,
                         self.col.to(device) if device is not None else self.col,
                         val.to(device) if device is not None else val, self.shape)

    def row_lengths(self) -> torch.Tensor:
        """Number of stored entries per row.

        Returns
        -------
        torch.Tensor
            ``[N]``, the index dtype of ``crow`` (``crow[1:] - crow[:-1]``).
        """
        return self.crow[1:] - self.crow[:-1]

    def to_dense(self) -> torch.Tensor:
        """Densify (for tests and references only).

        Returns
        -------
        torch.Tensor
            ``[N, D]`` dense, the dtype and device of ``val``.
        """
        return torch.sparse_csr_tensor(self.crow.long(), self.col.long(), self.val, self.shape).to_dense()

    def to_scipy(self):
        """Return a ``scipy.sparse.csr_matrix`` on the host.

        Returns
        -------
        scipy.sparse.csr_matrix
            ``[N, D]``; float32/float64 values keep their dtype, bfloat16/float16 values are
            converted to float32 (numpy has no bfloat16).
        """
        import scipy.sparse as sp

        val = self.val.cpu()
        if val.dtype in (torch.bfloat16, torch.float16):
            val = val.float()
        return sp.csr_matrix((val.numpy(), self.col.cpu().numpy(), self.crow.cpu().numpy()), shape=self.shape)

    def to_torch(self) -> torch.Tensor:
        """Return a ``torch.sparse_csr_tensor`` sharing this matrix's memory.

        Returns
        -------
        torch.Tensor
            ``[N, D]`` with layout ``torch.sparse_csr`` over the same crow/col/val storage.
        """
        return torch.sparse_csr_tensor(self.crow, self.col, self.val, self.shape)


def _check_csr_structure(crow, col, shape, name):
    n, d = shape
    if crow.ndim != 1 or crow.numel() != n + 1:
        raise ValueError(f"{name}: row pointer array must have N + 1 = {n + 1} entries, got {crow.numel()}")
    if int(crow[0]) != 0 or int(crow[-1]) != col.numel():
        raise ValueError(f"{name}: row pointers must start at 0 and end at nnz={col.numel()}")
    lengths = crow[1:] - crow[:-1]
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"{name}: row pointers must be non-decreasing")
    if col.numel():
        lo, hi = int(col.min()), int(col.max())
        if lo < 0 or hi >= d:
            raise ValueError(f"{name}: column indices must lie in [0, {d}), got range [{lo}, {hi}]")
        # Within a row, columns strictly increase: the kernels' pre-aggregation relies on it.
        step = col[1:] - col[:-1]
        row_start = torch.zeros(col.numel(), dtype=torch.bool, device=col.device)
        starts = crow[:-1][lengths > 0].long()
        row_start[starts] = True
        bad = (step <= 0) & ~row_start[1:]
        if bool(bad.any()):
            raise ValueError(
                f"{name}: CSR column indices must be sorted and unique within each row "
                "(call .sort_indices() / .sum_duplicates() on a scipy matrix first)"
            )


def as_csr(X, name: str = "X", *, check_structure: bool = True) -> CSRMatrix:
    """Convert a scipy.sparse CSR matrix or a torch sparse CSR tensor to :class:`CSRMatrix`.

    Other sparse formats (COO, CSC, BSR, ...) are rejected with a clear message rather than
    converted implicitly: a conversion would copy the whole matrix behind the caller's back.

    Parameters
    ----------
    X : scipy.sparse.csr_matrix, torch sparse CSR tensor or CSRMatrix
        ``[N, D]``, floating values; a CSRMatrix is returned as is, after the same checks (once
        per matrix; again after its indices change in place).
    name : str
        The argument's name, used in error messages.
    check_structure : bool
        Check the row pointers and that columns are in range, sorted and unique within rows.

    Returns
    -------
    CSRMatrix
        Contiguous int32 or int64 indices (int64 if the two differ) and the input's values,
        shared with the input where no conversion is needed.
    """
    if isinstance(X, CSRMatrix):
        return _checked_csr_matrix(X, name) if check_structure else X
    if isinstance(X, torch.Tensor):
        if X.layout != torch.sparse_csr:
            raise TypeError(f"{name}: unsupported sparse layout {X.layout}; convert with X.to_sparse_csr()")
        if X.ndim != 2 or X.dense_dim() != 0:
            raise ValueError(f"{name}: only 2-D CSR tensors with scalar values are supported")
        crow, col, val = X.crow_indices(), X.col_indices(), X.values()
        shape = tuple(int(s) for s in X.shape)
    elif _is_scipy_sparse(X):
        fmt = X.format
        if fmt != "csr":
            raise TypeError(f"{name}: unsupported sparse format {fmt!r}; only CSR is supported (use X.tocsr())")
        if X.dtype.kind not in "f":
            raise TypeError(f"{name}: sparse values must be floating point, got {X.dtype}")
        idx_dtype = np.int64 if X.indptr.dtype == np.int64 or X.indices.dtype == np.int64 else np.int32
        crow = torch.from_numpy(np.ascontiguousarray(X.indptr, dtype=idx_dtype))
        col = torch.from_numpy(np.ascontiguousarray(X.indices, dtype=idx_dtype))
        data = torch_viewable(X.data)
        data = data if data.flags.writeable else data.copy()
        val = torch.from_numpy(np.ascontiguousarray(data))
        shape = tuple(int(s) for s in X.shape)
    else:
        raise TypeError(f"{name}: expected a CSR matrix, got {type(X).__name__}")
    if crow.dtype not in INDEX_DTYPES or col.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name}: CSR indices must be int32 or int64, got {crow.dtype}/{col.dtype}")
    if col.dtype != crow.dtype:
        col = col.to(torch.int64)
        crow = crow.to(torch.int64)
    if val.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: CSR values must be one of {FLOAT_DTYPES}, got {val.dtype}")
    if check_structure:
        _check_csr_structure(crow, col, shape, name)
    M = CSRMatrix(crow.contiguous(), col.contiguous(), val.contiguous(), shape)
    if check_structure:
        _mark_checked(M)
    return M


_CHECK_EPOCH = [0]  # moved by clear_csr_caches: every earlier check is forgotten


def _checked_key(M: CSRMatrix) -> tuple:
    """What a structure check of ``M`` depends on: its index tensors' memory and version counters,
    the values' length, dtypes, devices and the shape (no device read)."""
    return (tuple((t.data_ptr(), t._version, t.numel(), t.dtype, t.device) for t in (M.crow, M.col))
            + (M.val.numel(), M.val.dtype, M.val.device, tuple(M.shape), _CHECK_EPOCH[0]))


def clear_csr_caches() -> None:
    """Forget everything derived from CSR matrices: the ops backend's cached transposes, the fused
    kernels' statistics, column copies and streams, and :func:`as_csr`'s record of checked matrices.

    These are rebuilt when a matrix's torch tensors change in place (their version counters), but
    writes made through numpy into memory a matrix shares (a scipy matrix given to
    :func:`bind_mmchain` or :func:`as_csr`, whose arrays the torch tensors wrap) move no counter:
    call this after such a change.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, fusedml
    >>> A = sp.random(5, 4, density=0.5, format="csr", dtype=np.float32, random_state=0)
    >>> M = fusedml.as_csr(A)
    >>> A.data *= 2  # numpy write into M's memory
    >>> fusedml.clear_csr_caches()
    """
    from .mmchain import csr, ops

    ops.clear_transpose_cache()
    csr._CACHE.clear()
    _CHECK_EPOCH[0] += 1


def _mark_checked(M: CSRMatrix) -> None:
    object.__setattr__(M, "_checked", _checked_key(M))  # frozen dataclass: not a field


def _checked_csr_matrix(M: CSRMatrix, name: str) -> CSRMatrix:
    """``M`` after :func:`as_csr`'s checks, run once per matrix and again after an in-place change
    of its indices (torch version counters; numpy writes into shared memory are not seen)."""
    if hasattr(M, "_checked") and M._checked == _checked_key(M):  # set only on checked tensors
        return M
    parts = (("crow", M.crow), ("col", M.col), ("val", M.val))
    for what, t in parts:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.ndim != 1:
            raise TypeError(f"{name}: CSRMatrix.{what} must be a 1-D dense torch tensor, got "
                            f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: CSRMatrix.{what} must be contiguous (use .contiguous())")
    if M.crow.dtype not in INDEX_DTYPES or M.col.dtype != M.crow.dtype:
        raise TypeError(f"{name}: CSRMatrix indices must both be int32 or both int64, got {M.crow.dtype}/{M.col.dtype}")
    if M.val.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: CSR values must be one of {FLOAT_DTYPES}, got {M.val.dtype}")
    if not (M.crow.device == M.col.device == M.val.device):
        raise ValueError(f"{name}: CSRMatrix tensors on different devices: crow {M.crow.device}, col {M.col.device}, "
                         f"val {M.val.device}")
    shape = tuple(M.shape) if isinstance(M.shape, (tuple, list, torch.Size)) else ()
    if len(shape) != 2 or not all(isinstance(s, (int, np.integer)) and s >= 0 for s in shape):
        raise ValueError(f"{name}: CSRMatrix.shape must be two non-negative ints (N, D), got {M.shape!r}")
    if M.col.numel() != M.val.numel():
        raise ValueError(f"{name}: CSRMatrix.col has {M.col.numel()} entries but val has {M.val.numel()}")
    _check_csr_structure(M.crow, M.col, shape, name)
    _mark_checked(M)
    return M


_REMEMBERED: dict = {}  # id(torch sparse tensor) -> (weakref to it, fingerprint, CSRMatrix sharing its memory)
_HASH_CHUNK = 1 << 22


def _content_hash(ts) -> tuple:
    """Position-weighted sums of the tensors' bits, as int32 words (wrapping products, int64
    sums): one read of each on its device in chunks of ``_HASH_CHUNK`` words and one host copy.
    Any in-place change that keeps every sum is a ~2^-32..2^-64 accident."""
    sums = []
    for t in ts:
        b = t.reshape(-1)
        b = b.view(torch.int32) if t.element_size() in (4, 8) else b.view(torch.int16).to(torch.int32)
        j = torch.arange(min(b.numel(), _HASH_CHUNK), dtype=torch.int32, device=t.device)
        h = torch.zeros((), dtype=torch.int64, device=t.device)
        for s in range(0, b.numel(), _HASH_CHUNK):
            c = b[s:s + _HASH_CHUNK]
            w = (j[:c.numel()] + (s & 0x7FFFFFFF)).mul_(0x27D4EB2F).bitwise_or_(1)  # odd, pseudo-random
            h += (c * w).sum()
        sums.append(h)
    return tuple(torch.stack(sums).tolist())


def _storage_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor on ``t``'s memory with no reference to ``t`` (an accessor's alias would keep its
    sparse tensor alive through ``_base``)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.size(),
                                                               t.stride())


def as_csr_remembered(X, name: str = "X") -> CSRMatrix:
    """:func:`as_csr`, returning the same :class:`CSRMatrix` for a torch sparse CSR tensor whose
    contents did not change since the last call (other inputs: :func:`as_csr`).

    The fused CSR kernels cache what they derive from a matrix (statistics, streams, copies) with
    the CSRMatrix's tensors; a torch sparse tensor's accessors return new aliases on every call,
    so a fit given one rebuilt them all (H100, 1M x 100k power-law rows, fused: logistic 76.1 ms
    against 39.4 given a CSRMatrix, Poisson 56.6 against 18.5; ``csr_input_probe-H100-*-s50``).
    The tensor is remembered through a weak reference and its contents through
    :func:`_content_hash` (indices and values: one read), so changes made in place through the
    tensor or through the arrays it was built from are seen. The returned matrix shares the
    tensor's memory; it is for one fit (changes made while it is in use are not seen).

    Parameters
    ----------
    X : torch sparse CSR tensor, scipy.sparse CSR matrix or CSRMatrix
        ``[N, D]``.
    name : str
        The argument's name, used in error messages.

    Returns
    -------
    CSRMatrix
    """
    M = as_csr(X, name)
    if not isinstance(X, torch.Tensor):
        return M
    key = (tuple(M.shape), M.val.dtype, M.crow.dtype, M.device,
           tuple(t.data_ptr() for t in (M.crow, M.col, M.val)), _content_hash((M.crow, M.col, M.val)))
    hit = _REMEMBERED.get(id(X))
    if hit is not None and hit[0]() is X and hit[1] == key:
        return hit[2]
    if hit is None or hit[0]() is not X:  # one finalizer per live tensor
        weakref.finalize(X, _REMEMBERED.pop, id(X), None)
    kept = CSRMatrix(*(_storage_view(t) for t in (M.crow, M.col, M.val)), M.shape)
    _mark_checked(kept)  # M's check holds for the same memory
    _REMEMBERED[id(X)] = (weakref.ref(X), key, kept)
    return kept


def is_sparse(X) -> bool:
    """True for the sparse inputs fusedml accepts or must reject (scipy sparse, torch sparse, CSRMatrix).

    Parameters
    ----------
    X : object
        Any input.

    Returns
    -------
    bool
    """
    return isinstance(X, CSRMatrix) or _is_scipy_sparse(X) or (
        isinstance(X, torch.Tensor) and X.layout != torch.strided
    )


def as_matrix(X, name: str = "X", *, check_structure: bool = True):
    """Convert a design matrix to a dense ``[N, D]`` torch tensor or a :class:`CSRMatrix`.

    Dense inputs keep their strides (the kernels take strides; callers decide whether to copy).
    Empty matrices (N == 0 or D == 0) are rejected: no operator has a meaningful result on them.

    Parameters
    ----------
    X : array-like [N, D] or sparse CSR
        Dense tensor/array or a CSR input accepted by :func:`as_csr`; other sparse formats raise
        ``TypeError``.
    name : str
        The argument's name, used in error messages.
    check_structure : bool
        Passed to :func:`as_csr`.

    Returns
    -------
    torch.Tensor or CSRMatrix
        ``[N, D]``, floating dtype.
    """
    if is_sparse(X):
        M = as_csr(X, name, check_structure=check_structure)
    else:
        M = to_tensor(X, name, ndim=2)
        if M.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype must be one of {FLOAT_DTYPES}, got {M.dtype}")
    n, d = M.shape
    if n == 0 or d == 0:
        raise ValueError(f"{name} is empty: shape {tuple(M.shape)}")
    return M


def warn_user(message, category=UserWarning):
    """``warnings.warn`` attributed to the first caller outside ``algorithms`` and ``fusedml``.

    Parameters
    ----------
    message : str
    category : type of Warning, default UserWarning
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("algorithms", "fusedml"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
