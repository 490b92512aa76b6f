"""The "cpu" backend: a cache-blocked, one-pass host implementation (as SystemDS does).

X is walked in row blocks sized to stay in the host's L2 cache (``L2_BYTES``, 1 MiB by default).
For each block ``X_b``: ``t_b = X_b y`` (BLAS / scipy), ``p_b = v_b * t_b``, then
``w += X_b^T p_b`` while ``X_b`` is still in cache, so main memory delivers X once.

Dense blocks go through torch's CPU BLAS (half-precision blocks are upcast to fp32 block by block,
in cache); CSR blocks are zero-copy scipy ``csr_matrix`` views of the row range (the row
pointers are re-based, indices and values are slices), so ``X_b^T p_b`` runs in scipy's C++
CSC kernel. Results are torch tensors in the accumulation dtype.
"""
from __future__ import annotations

import numpy as np
import torch

from ._checks import Problem

L2_BYTES = 1 << 20


def _dense_block_rows(D: int, itemsize: int) -> int:
    return max(8, L2_BYTES // max(1, D * itemsize))


def _csr_blocks(crow: np.ndarray, nnz_per_block: int):
    """Row ranges [(r0, r1)] holding about ``nnz_per_block`` nonzeros each (at least one row)."""
    N = crow.shape[0] - 1
    cuts = np.searchsorted(crow, np.arange(nnz_per_block, int(crow[-1]), nnz_per_block), side="left")
    edges = np.unique(np.concatenate([[0], np.clip(cuts, 1, N), [N]]))
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def _p_block(P: Problem, t: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
    if P.v is None:
        return t
    vb = P.v[r0:r1]
    if P.v_op == "softmax":
        return vb * (t - (vb * t).sum(dim=1, keepdim=True))
    return vb * t


def mmchain_cpu(P: Problem) -> torch.Tensor:
    """Cache-blocked one-pass ``w = alpha * [X,1]^T p + beta * z`` on the host.

    Parameters
    ----------
    P : Problem
        Validated problem with host (CPU) data.

    Returns
    -------
    torch.Tensor
        ``[Dx, m]`` in the accumulation dtype.
    """
    D, m, acc = P.D, P.m, P.acc_dtype
    w = torch.zeros(D, m, dtype=acc)
    psum = torch.zeros(m, dtype=acc)
    y = P.y[:D] if P.y is not None else None
    y_icpt = P.y[D] if (P.y is not None and P.intercept) else None
    if P.is_csr:
        import scipy.sparse as sp

        A = P.X
        crow = A.crow.numpy().astype(np.int64, copy=False)
        col = A.col.numpy()
        val = A.val if A.val.dtype in (torch.float32, torch.float64) else A.val.to(acc)
        val = val.numpy()
        y_np = y.numpy() if y is not None else None
        w_np = w.numpy()
        for r0, r1 in _csr_blocks(crow, max(1, L2_BYTES // 12)):
            s0, s1 = int(crow[r0]), int(crow[r1])
            Xb = sp.csr_matrix((val[s0:s1], col[s0:s1], crow[r0:r1 + 1] - s0), shape=(r1 - r0, D))
            if y is None:
                pb = P.v[r0:r1]
            else:
                tb = torch.from_numpy(np.asarray(Xb @ y_np, dtype=y_np.dtype))
                if y_icpt is not None:
                    tb = tb + y_icpt
                pb = _p_block(P, tb, r0, r1)
            w_np += Xb.T @ pb.numpy()
            if P.intercept:
                psum += pb.sum(dim=0)
    else:
        X = P.X
        step = _dense_block_rows(D, X.element_size())
        for r0 in range(0, P.N, step):
            r1 = min(P.N, r0 + step)
            Xb = X[r0:r1]
            if Xb.dtype != acc:
                Xb = Xb.to(acc)
            if y is None:
                pb = P.v[r0:r1]
            else:
                tb = Xb @ y
                if y_icpt is not None:
                    tb = tb + y_icpt
                pb = _p_block(P, tb, r0, r1)
            w.addmm_(Xb.t(), pb)
            if P.intercept:
                psum += pb.sum(dim=0)
    if P.intercept:
        w = torch.cat([w, psum[None, :]], dim=0)
    if P.alpha != 1.0:
        w.mul_(P.alpha)
    if P.z is not None and P.beta != 0.0:
        w.add_(P.z, alpha=P.beta)
    return w


def matvec_cpu(P: Problem) -> torch.Tensor:
    """``t = [X, 1] y`` on the host, ``[N, m]`` in the accumulation dtype."""
    D, acc = P.D, P.acc_dtype
    y = P.y[:D]
    if P.is_csr:
        A = P.X
        import scipy.sparse as sp

        val = A.val if A.val.dtype in (torch.float32, torch.float64) else A.val.to(acc)
        Xs = sp.csr_matrix((val.numpy(), A.col.numpy(), A.crow.numpy()), shape=A.shape)
        t = torch.from_numpy(np.asarray(Xs @ y.numpy(), dtype=y.numpy().dtype))
    else:
        X = P.X
        t = X @ y if X.dtype == acc else X.to(acc) @ y
    if P.intercept:
        t = t + P.y[D]
    return t
