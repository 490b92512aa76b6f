"""Pure-torch float64 reference of the GMM E-step statistics: the literal formulas.

Shares no code with the kernels or the other backends. Quadratic forms are computed from the
precision matrix ``Lambda_k = P_k P_k^T`` (``P_k`` the Cholesky factor of the precision, the
scikit-learn parametrisation), never through the expanded quadratic. Materialises N x K: for
tests and small data only.
"""
from __future__ import annotations

import math

import torch


def precision_matrices(precisions_cholesky: torch.Tensor, covariance_type: str, K: int, D: int) -> torch.Tensor:
    """``[K, D, D]`` precision matrices ``P_k P_k^T`` for any covariance type (float64)."""
    P = precisions_cholesky.to(torch.float64)
    if covariance_type == "full":
        return P @ P.transpose(1, 2)
    if covariance_type == "tied":
        return (P @ P.T).expand(K, D, D)
    if covariance_type == "diag":
        return torch.diag_embed(P * P)
    if covariance_type == "spherical":
        return (P * P)[:, None, None] * torch.eye(D, dtype=torch.float64, device=P.device)
    raise ValueError(covariance_type)


def log_gaussian_prob(X, means, precisions_cholesky, covariance_type):
    """``[N, K]`` log N(x_n | mu_k, Sigma_k) in float64 from (x - mu)^T Lambda (x - mu) and log det."""
    X = X.to(torch.float64)
    mu = means.to(torch.float64)
    N, D = X.shape
    K = mu.shape[0]
    Lam = precision_matrices(precisions_cholesky, covariance_type, K, D)
    out = torch.empty(N, K, dtype=torch.float64, device=X.device)
    for k in range(K):
        diff = X - mu[k]
        maha = ((diff @ Lam[k]) * diff).sum(1)
        logdet = torch.linalg.slogdet(Lam[k])[1]  # log det Lambda = -log det Sigma
        out[:, k] = -0.5 * (D * math.log(2 * math.pi) + maha) + 0.5 * logdet
    return out


def estep_reference(X, weights, means, precisions_cholesky, covariance_type, sample_weight=None, center=None):
    """Float64 reference of :func:`fusedml.gmm_estep`.

    Returns
    -------
    dict
        ``log_likelihood`` (0-d), ``log_prob`` [N], ``resp`` [N, K], ``nk`` [K], ``s1`` [K, D],
        ``s2`` (full [K, D, D], tied [D, D], diag [K, D], spherical [K]), ``labels`` [N].
    """
    X = X.to(torch.float64)
    N, D = X.shape
    mu = means.to(torch.float64)
    K = mu.shape[0]
    c = mu if center is None else center.to(torch.float64)
    s = torch.ones(N, dtype=torch.float64, device=X.device) if sample_weight is None else sample_weight.to(torch.float64)
    wlp = log_gaussian_prob(X, mu, precisions_cholesky, covariance_type) + torch.log(weights.to(torch.float64))
    log_prob = torch.logsumexp(wlp, dim=1)
    resp = torch.exp(wlp - log_prob[:, None])
    rs = resp * s[:, None]
    nk = rs.sum(0)
    s1 = torch.stack([(rs[:, k:k + 1] * (X - c[k])).sum(0) for k in range(K)])
    outer = torch.stack([(rs[:, k, None, None] * ((X - c[k])[:, :, None] * (X - c[k])[:, None, :])).sum(0) for k in range(K)])
    if covariance_type == "full":
        s2 = outer
    elif covariance_type == "tied":
        s2 = outer.sum(0)
    elif covariance_type == "diag":
        s2 = torch.diagonal(outer, dim1=1, dim2=2)
    else:
        s2 = torch.diagonal(outer, dim1=1, dim2=2).sum(1)
    return {
        "log_likelihood": (s * log_prob).sum(),
        "log_prob": log_prob,
        "resp": resp,
        "nk": nk,
        "s1": s1,
        "s2": s2,
        "labels": wlp.argmax(1),
    }


def mstep_reference(X, resp, reg_covar, covariance_type, sample_weight=None):
    """Float64 M-step from responsibilities, literal scikit-learn formulas (covariances only)."""
    X = X.to(torch.float64)
    r = resp.to(torch.float64)
    if sample_weight is not None:
        r = r * sample_weight.to(torch.float64)[:, None]
    eps = torch.finfo(torch.float64).eps
    nk = r.sum(0) + 10 * eps
    means = (r.T @ X) / nk[:, None]
    K, D = means.shape
    covs = []
    for k in range(K):
        diff = X - means[k]
        covs.append(((r[:, k] * diff.T) @ diff) / nk[k])
    full = torch.stack(covs) + reg_covar * torch.eye(D, dtype=torch.float64)
    if covariance_type == "full":
        cov = full
    elif covariance_type == "tied":
        cov = sum(nk[k] * covs[k] for k in range(K)) / nk.sum() + reg_covar * torch.eye(D, dtype=torch.float64)
    elif covariance_type == "diag":
        cov = torch.diagonal(full, dim1=1, dim2=2).clone()
    else:
        cov = torch.diagonal(full, dim1=1, dim2=2).mean(1)
    return nk / nk.sum(), means, cov
