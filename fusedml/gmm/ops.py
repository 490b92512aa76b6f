"""Operator-level torch E-step (the ``"ops"`` backend) and the block routine the host path reuses.

This is the E-step a user writes by hand with torch: distance GEMMs (``X^2 @ p^T``, ``X @ (mu p)^T``
for diag/spherical, ``(X - mu_k) @ P_k`` per component for full/tied), ``torch.logsumexp``, the
responsibilities materialised as an ``[N, K]`` tensor, then the statistics' GEMMs ``r^T X`` and
``r^T X^2`` (per-component ``(r_k d)^T d`` for full/tied). Like the fused kernels it subtracts the
global shift ``g`` from X first (one elementwise pass) so the second moments do not cancel.
"""
from __future__ import annotations

import torch

from ._prep import Prepared, diag_precisions, finish_shifted, fp32_unsafe


def _shifted(Xb: torch.Tensor, prep: Prepared, dt: torch.dtype) -> torch.Tensor:
    # Subtract in the wider of the two dtypes, then cast: fp64 data far from 0 keeps its digits.
    if Xb.dtype == torch.float64:
        return (Xb - prep.shift).to(dt)
    return Xb.to(dt) - prep.shift.to(dt)


def weighted_log_prob(Xs: torch.Tensor, prep: Prepared, dt: torch.dtype) -> torch.Tensor:
    """``[B, K]`` log pi_k + log N(x | mu_k, Sigma_k) for shifted rows ``Xs`` ([B, D], dtype ``dt``)."""
    mup = (prep.mu - prep.shift).to(dt)
    const = prep.const.to(dt)
    if prep.covariance_type in ("diag", "spherical"):
        p = diag_precisions(prep).to(dt)
        quad = (Xs * Xs) @ p.T - 2.0 * (Xs @ (mup * p).T) + (mup * mup * p).sum(1)
        return -0.5 * quad + const
    P = prep.prec_chol.to(dt)
    out = torch.empty(Xs.shape[0], prep.K, dtype=dt, device=Xs.device)
    for k in range(prep.K):
        y = (Xs - mup[k]) @ (P[k] if prep.covariance_type == "full" else P)
        out[:, k] = (y * y).sum(1)
    return -0.5 * out + const


def block_stats(Xb: torch.Tensor, swb, prep: Prepared, dt: torch.dtype, want_log_prob: bool):
    """E-step on one block of rows; statistics returned as float64 partial sums.

    Returns
    -------
    tuple
        ``(log_prob [B] or None, ll 0-d, nk [K], s1, s2)``; for diag/spherical ``s1``/``s2`` are the
        sums about the global shift ``S1 = sum r (x-g)``, ``S2 = sum r (x-g)^2`` ([K, D], to be
        finished by :func:`finish_shifted`), for full/tied the exact centred sums.
    """
    f64 = torch.float64
    Xs = _shifted(Xb, prep, dt)
    wlp = weighted_log_prob(Xs, prep, dt)  # [B, K]
    lse = torch.logsumexp(wlp, dim=1)  # [B]
    r = torch.exp(wlp - lse[:, None])  # [B, K] responsibilities
    if swb is not None:
        sw = swb.to(dt)
        r = r * sw[:, None]
        ll = (swb.to(f64) * lse.to(f64)).sum()
    else:
        ll = lse.to(f64).sum()
    nk = r.sum(0).to(f64)
    if prep.covariance_type in ("diag", "spherical"):
        s1 = (r.T @ Xs).to(f64)
        s2 = (r.T @ (Xs * Xs)).to(f64)
    else:
        cp = (prep.center - prep.shift).to(dt)
        s1 = torch.empty(prep.K, prep.D, dtype=f64, device=Xb.device)
        s2 = torch.empty(prep.K, prep.D, prep.D, dtype=f64, device=Xb.device)
        for k in range(prep.K):
            d = Xs - cp[k]
            rd = d * r[:, k, None]
            s1[k] = rd.sum(0).to(f64)
            s2[k] = (rd.T @ d).to(f64)
    return (lse if want_log_prob else None), ll, nk, s1, s2


def finish(prep: Prepared, ll, nk, s1, s2):
    """Final statistics from summed block partials: centre diag/spherical sums, symmetrise, sum tied."""
    if prep.covariance_type in ("diag", "spherical"):
        s1, s2 = finish_shifted(prep, nk, s1, s2)
    else:
        s2 = 0.5 * (s2 + s2.transpose(1, 2))
        if prep.covariance_type == "tied":
            s2 = s2.sum(0)
    return ll, nk, s1, s2


def compute_dtype(X: torch.Tensor) -> torch.dtype:
    """float64 for float64 data, float32 otherwise (half storage is computed in fp32)."""
    return torch.float64 if X.dtype == torch.float64 else torch.float32


def estep_ops(prep: Prepared, return_log_prob: bool):
    """The ``"ops"`` backend: one pass of torch operators over all N rows (N x K materialised);
    float64 where fp32 would not be accurate (:func:`fusedml.gmm._prep.fp32_unsafe`)."""
    dt = compute_dtype(prep.X)
    if dt != torch.float64 and fp32_unsafe(prep, "the E-step"):
        dt = torch.float64
    lp, ll, nk, s1, s2 = block_stats(prep.X, prep.sample_weight, prep, dt, return_log_prob)
    return (lp,) + finish(prep, ll, nk, s1, s2)


def score_ops(prep: Prepared):
    """``(log_prob [N], labels [N] int64)`` with torch operators (float64 as :func:`estep_ops`)."""
    dt = compute_dtype(prep.X)
    if dt != torch.float64 and fp32_unsafe(prep, "scoring"):
        dt = torch.float64
    wlp = weighted_log_prob(_shifted(prep.X, prep, dt), prep, dt)
    return torch.logsumexp(wlp, dim=1), wlp.argmax(1)
