"""Pure-torch float64 reference of the mmchain pattern: the literal formula, for tests.

    t = [X, 1] y                        (the ones column only with intercept=True)
    p = v * t                           (v_op="mul"; v=None means ones)
    p_nj = v_nj (t_nj - sum_l v_nl t_nl)  (v_op="softmax")
    w = alpha * [X, 1]^T p + beta * z

When y is None: p = v. Everything is densified and computed in float64 on the host; this module
shares no code with the kernels on purpose.
"""
from __future__ import annotations

import numpy as np
import torch


def _dense64(X) -> torch.Tensor:
    """Densify any accepted X (numpy, torch dense/sparse CSR, scipy CSR, CSRMatrix) to float64 CPU."""
    if hasattr(X, "toarray"):  # scipy.sparse
        return torch.from_numpy(np.asarray(X.toarray(), dtype=np.float64))
    if hasattr(X, "crow") and hasattr(X, "val"):  # fusedml.CSRMatrix
        return X.to_dense().to(device="cpu", dtype=torch.float64)
    if isinstance(X, torch.Tensor):
        if X.layout != torch.strided:
            X = X.to_dense()
        return X.detach().to(device="cpu", dtype=torch.float64)
    return torch.from_numpy(np.asarray(X, dtype=np.float64))


def _t64(a):
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        return a.detach().to(device="cpu", dtype=torch.float64)
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def mmchain_reference(X, y, v=None, z=None, alpha=1.0, beta=0.0, *, intercept=False, v_op="mul"):
    """float64 ``alpha * X^T (v ⊙ (X y)) + beta * z`` by the literal formula.

    Parameters
    ----------
    X : array-like or sparse, [N, D]
    y : array-like [D(+1)] or [D(+1), m], or None (then w = alpha X^T v + beta z)
    v : array-like [N] or [N, m], or None
    z : array-like [D(+1)] or [D(+1), m], or None
    alpha, beta : float
    intercept : bool
        Treat X as [X, 1].
    v_op : {"mul", "softmax"}

    Returns
    -------
    torch.Tensor
        float64 on the CPU, [D(+1)] or [D(+1), m].
    """
    Xd = _dense64(X)
    if intercept:
        Xd = torch.cat([Xd, torch.ones(Xd.shape[0], 1, dtype=torch.float64)], dim=1)
    v64 = _t64(v)
    if y is None:
        p = v64
    else:
        y64 = _t64(y)
        t = Xd @ y64
        if v64 is None:
            p = t
        elif v_op == "mul":
            p = (v64 if (v64.ndim == t.ndim) else v64[:, None]) * t
        elif v_op == "softmax":
            s = (v64 * t).sum(dim=1, keepdim=True)
            p = v64 * (t - s)
        else:
            raise ValueError(v_op)
    w = alpha * (Xd.T @ p)
    if z is not None:
        w = w + beta * _t64(z).reshape(w.shape)
    return w


def matvec_reference(X, y, *, intercept=False):
    """float64 ``[X, 1] y`` (ones column only with intercept=True), on the CPU.

    Parameters
    ----------
    X : array-like [N, D] or sparse CSR
    y : array-like [D(+1)] or [D(+1), m]
    intercept : bool
        Append a column of ones to X.

    Returns
    -------
    torch.Tensor
        ``[N]`` or ``[N, m]`` float64 on the CPU.
    """
    Xd = _dense64(X)
    if intercept:
        Xd = torch.cat([Xd, torch.ones(Xd.shape[0], 1, dtype=torch.float64)], dim=1)
    return Xd @ _t64(y)
