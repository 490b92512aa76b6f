"""The "ops" backend: the operator-level baseline a user would write by hand with torch.

Dense: ``X.T @ (v * (X @ y))`` -- two cuBLAS GEMV (m == 1, ``torch.mv``) or GEMM calls plus
elementwise torch ops, so X is read twice. Half-precision X (bf16/fp16) is multiplied in its
storage dtype, as a user would (cuBLAS accumulates in fp32 internally, but the products are
rounded to bf16/fp16 on output: expect ~1e-2 relative error); results are returned in fp32.

CSR: torch sparse CSR matmul (cuSPARSE SpMV/SpMM on CUDA) for ``X @ y``, and for ``X^T p`` one of
two honest variants, chosen by ``config={"ops_transpose": ...}``:

* ``"cached"`` (default) -- ``X^T`` converted to CSR once and cached, keyed on the caller's matrix
  object through a weak reference (2x the memory of X; freed with X). The transpose is rebuilt
  when the indices or values are other tensors or were changed in place (torch's version
  counters: a :class:`~fusedml.CSRMatrix`'s own tensors, a torch sparse tensor's through its
  accessors). A scipy matrix's arrays carry no such counter: call :func:`fusedml.clear_csr_caches` (or :func:`clear_transpose_cache`)
  after mutating one in place;
* ``"on_the_fly"`` -- ``X.t() @ p`` on every call (a CSC view; torch/cuSPARSE transposes inside).

CSR values in bf16/fp16 are upcast to the accumulation dtype (torch sparse matmul support for half
types is incomplete); the cached variant caches the upcast matrix too.
The intercept column of ones is never materialised: ``t += y[D]`` and ``w[D] = sum(p)``.
"""
from __future__ import annotations

import warnings
import weakref

import torch

from .._validation import CSRMatrix
from ._checks import Problem

OPS_TRANSPOSE = ("cached", "on_the_fly")
_CACHE: dict[int, tuple] = {}


def clear_transpose_cache() -> None:
    """Drop every cached CSR transpose built by the ``"cached"`` ops variant."""
    _CACHE.clear()


def _torch_csr(A: CSRMatrix, dtype) -> torch.Tensor:
    val = A.val if A.val.dtype == dtype else A.val.to(dtype)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(A.crow, A.col, val, A.shape, check_invariants=False)


def _tensor_state(A: CSRMatrix) -> tuple:
    """Where A's index and value tensors live and their in-place change counts (a torch sparse
    tensor's accessors share the tensor's counter, so their fresh aliases give the same state)."""
    return tuple((t.data_ptr(), t._version) for t in (A.crow, A.col, A.val))


def _csr_pair(P: Problem, key, variant: str):
    """Return (A, A^T-or-None) as torch sparse tensors for the given variant.

    Only the transpose (fresh memory) is cached: ``A`` wraps the caller's arrays, and caching a
    view of them would keep the caller's matrix alive through the view's base.
    """
    A = P.X
    fwd = _torch_csr(A, P.acc_dtype)
    if variant == "on_the_fly" or key is None:
        return fwd, None
    k = id(key)
    state = (P.acc_dtype, A.device, tuple(A.shape), A.nnz) + _tensor_state(A)
    hit = _CACHE.get(k)
    if hit is not None:
        ref, st, At = hit
        if ref() is key and st == state:
            return fwd, At
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        At = fwd.t().to_sparse_csr()
    try:
        ref = weakref.ref(key)
        if hit is None or hit[0]() is not key:  # one finalizer per live key
            weakref.finalize(key, _CACHE.pop, k, None)
    except TypeError:  # not weak-referenceable: do not cache (no way to know when it dies)
        return fwd, At
    _CACHE[k] = (ref, state, At)
    return fwd, At


def _p_from_t(P: Problem, t: torch.Tensor) -> torch.Tensor:
    """p from t [N, m] (acc dtype) following v_op."""
    if P.v is None:
        return t
    if P.v_op == "softmax":
        return P.v * (t - (P.v * t).sum(dim=1, keepdim=True))
    return P.v * t


def _finish(P: Problem, core: torch.Tensor, psum: torch.Tensor | None) -> torch.Tensor:
    """w = alpha * [core; psum] + beta * z, [Dx, m] in acc dtype."""
    w = core if psum is None else torch.cat([core, psum[None, :]], dim=0)
    w = w * P.alpha if P.alpha != 1.0 else w
    if P.z is not None and P.beta != 0.0:
        w = w + P.beta * P.z
    return w


def _dense_xy(X: torch.Tensor, y: torch.Tensor, acc) -> torch.Tensor:
    yc = y.to(X.dtype)
    if y.shape[1] == 1:
        return torch.mv(X, yc[:, 0]).to(acc)[:, None]
    return (X @ yc).to(acc)


def _dense_xtp(X: torch.Tensor, p: torch.Tensor, acc) -> torch.Tensor:
    pc = p.to(X.dtype)
    if p.shape[1] == 1:
        return torch.mv(X.t(), pc[:, 0]).to(acc)[:, None]
    return (X.t() @ pc).to(acc)


def mmchain_ops(P: Problem, *, key=None, config=None) -> torch.Tensor:
    """Operator-level ``w = alpha * X^T p + beta * z``.

    Parameters
    ----------
    P : Problem
        Validated problem (see ``_checks.prepare_mmchain``).
    key : object, optional
        The caller's matrix object: the key of the CSR transpose cache.
    config : dict, optional
        ``{"ops_transpose": "cached" | "on_the_fly"}`` for CSR X.

    Returns
    -------
    torch.Tensor
        ``[Dx, m]`` in the accumulation dtype.
    """
    variant = (config or {}).get("ops_transpose", "cached")
    if variant not in OPS_TRANSPOSE:
        raise ValueError(f"config['ops_transpose'] must be one of {OPS_TRANSPOSE}, got {variant!r}")
    D, acc = P.D, P.acc_dtype
    if P.is_csr:
        A, At = _csr_pair(P, key, variant)
        if P.y is None:
            p = P.v
        else:
            t = A @ P.y[:D]
            if P.intercept:
                t = t + P.y[D]
            p = _p_from_t(P, t)
        core = (At @ p) if At is not None else (A.t() @ p)
    else:
        X = P.X
        if P.y is None:
            p = P.v
        else:
            t = _dense_xy(X, P.y[:D], acc)
            if P.intercept:
                t = t + P.y[D]
            p = _p_from_t(P, t)
        if p.shape[1] != P.m:  # v [N, 1] with y None cannot happen; broadcast guard for safety
            p = p.expand(P.N, P.m)
        core = _dense_xtp(X, p, acc)
    return _finish(P, core, p.sum(dim=0) if P.intercept else None)


def matvec_ops(P: Problem) -> torch.Tensor:
    """Operator-level ``t = [X, 1] y``, ``[N, m]`` in the accumulation dtype."""
    D = P.D
    if P.is_csr:
        t = _torch_csr(P.X, P.acc_dtype) @ P.y[:D]
    else:
        t = _dense_xy(P.X, P.y[:D], P.acc_dtype)
    if P.intercept:
        t = t + P.y[D]
    return t
