"""Validation and host-side parameter preparation shared by every GMM backend.

Everything here works on the small parameter tensors ([K], [K, D], [K, D, D]) in float64; the
data matrix is only checked (shape, dtype, finiteness), never copied.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validation import CSRMatrix, as_matrix, check_finite as _check_finite, to_tensor

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
PRECISIONS = ("fp32", "tf32x3", "tf32", "bf16")
PATHS = ("auto", "single", "two_pass")

# log(0) for a component of weight 0: finite so that max-subtraction never meets inf - inf.
LOG_ZERO = -1.0e30


@dataclass
class Prepared:
    """Validated operands and the float64 quantities every backend derives from them.

    Attributes
    ----------
    X : torch.Tensor
        ``[N, D]`` the data, as given (any strides, any float dtype).
    sample_weight : torch.Tensor or None
        ``[N]`` float64 sample weights.
    covariance_type : str
    K, D, N : int
    mu : torch.Tensor
        ``[K, D]`` float64 means.
    center : torch.Tensor
        ``[K, D]`` float64 centres ``c_k`` of the statistics.
    prec_chol : torch.Tensor
        float64 precision Cholesky factors (scikit-learn shapes).
    shift : torch.Tensor
        ``[D]`` float64 global shift ``g`` subtracted from X before any fp32 arithmetic
        (``sum_k pi_k mu_k``: the mixture mean, close to the data mean).
    const : torch.Tensor
        ``[K]`` float64 ``log pi_k + log det P_k - D/2 log(2 pi)`` (the x-independent part of the
        weighted log-density, without the quadratic).
    """

    X: torch.Tensor
    sample_weight: torch.Tensor | None
    covariance_type: str
    K: int
    D: int
    N: int
    mu: torch.Tensor
    center: torch.Tensor
    prec_chol: torch.Tensor
    shift: torch.Tensor
    const: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.X.device


def _expected_prec_shape(covariance_type, K, D):
    return {"full": (K, D, D), "tied": (D, D), "diag": (K, D), "spherical": (K,)}[covariance_type]


def validate(X, weights, means, precisions_cholesky, covariance_type, *, sample_weight=None,
             center=None, check_finite=True) -> Prepared:
    """Check every operand and derive the float64 quantities the backends share.

    Raises
    ------
    ValueError
        Unknown covariance type, mismatched shapes, NaN/inf, weights negative or not summing to one,
        precision Cholesky factors that are not positive definite / not upper triangular,
        negative sample weights.
    TypeError
        Sparse or non-floating data.
    """
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}")
    X = as_matrix(X, "X")
    if isinstance(X, CSRMatrix):
        raise TypeError("X: the GMM E-step takes dense data; got a sparse matrix (densify it first)")
    N, D = X.shape
    dev = X.device
    f64 = torch.float64
    means = to_tensor(means, "means", ndim=2, dtype=f64, device=dev)
    K = means.shape[0]
    if K == 0:
        raise ValueError("means has no components (shape [0, D])")
    if means.shape[1] != D:
        raise ValueError(f"means has {means.shape[1]} features but X has {D}: shape {tuple(means.shape)}, X {tuple(X.shape)}")
    w_in = to_tensor(weights, "weights", ndim=1, device=dev)
    weights = w_in.to(f64)
    if weights.shape[0] != K:
        raise ValueError(f"weights must have shape [{K}] (one per component), got {tuple(weights.shape)}")
    pc = to_tensor(precisions_cholesky, "precisions_cholesky", dtype=f64, device=dev)
    exp_shape = _expected_prec_shape(covariance_type, K, D)
    if tuple(pc.shape) != exp_shape:
        raise ValueError(
            f"precisions_cholesky for covariance_type={covariance_type!r} must have shape {exp_shape}, got {tuple(pc.shape)}"
        )
    if sample_weight is not None:
        sample_weight = to_tensor(sample_weight, "sample_weight", ndim=1, dtype=f64, device=dev)
        if sample_weight.shape[0] != N:
            raise ValueError(f"sample_weight must have shape [{N}], got {tuple(sample_weight.shape)}")
    if center is None:
        center = means
    else:
        center = to_tensor(center, "center", ndim=2, dtype=f64, device=dev)
        if tuple(center.shape) != (K, D):
            raise ValueError(f"center must have shape [{K}, {D}], got {tuple(center.shape)}")
    full_like = covariance_type in ("full", "tied")
    # Every value check is computed on the device and read back in ONE transfer: an EM iteration
    # calls this once, and a host sync per check would cost more than the E-step kernel itself.
    fin = lambda t: torch.isfinite(t).all().to(f64)  # noqa: E731
    diag = torch.diagonal(pc, dim1=-2, dim2=-1) if full_like else pc
    zero = torch.zeros((), dtype=f64, device=dev)
    probe = torch.stack([
        fin(means), fin(weights), fin(pc),
        X.sum(dtype=f64) if check_finite else zero,  # one read-only reduction decides
        weights.min(), weights.sum(), diag.min(),
        torch.tril(pc, diagonal=-1).abs().max() if full_like else zero,
        pc.abs().max(),
        fin(sample_weight) if sample_weight is not None else zero + 1,
        sample_weight.min() if sample_weight is not None else zero,
        fin(center),
    ]).tolist()
    (ok_means, ok_weights, ok_pc, x_sum, w_min, wsum, d_min, lower_max, scale, ok_sw, sw_min, ok_center) = probe
    for ok, t, name in ((ok_means, means, "means"), (ok_weights, weights, "weights"), (ok_pc, pc, "precisions_cholesky")):
        if not ok:
            _check_finite(t, name)
    if check_finite and not math.isfinite(x_sum):
        # the full elementwise check only runs to name the problem (or for float64 overflow)
        _check_finite(X, "X")
    if w_min < 0:
        raise ValueError(f"weights must be non-negative, got min {w_min:.3g}")
    atol = max(1e-6, 4 * K * torch.finfo(w_in.dtype).eps)
    if abs(wsum - 1.0) > atol:
        raise ValueError(f"weights must sum to one (tolerance {atol:.1e}), got sum {wsum:.8g}")
    if full_like:
        if d_min <= 0:
            raise ValueError(
                f"precisions_cholesky ({covariance_type}) is not positive definite: its diagonal must be > 0, "
                f"got min {d_min:.3g}"
            )
        if lower_max > 1e-6 * scale:
            raise ValueError(
                f"precisions_cholesky ({covariance_type}) must be upper triangular (scikit-learn's convention: "
                "the transposed inverse of the covariance's lower Cholesky factor)"
            )
        pc = torch.triu(pc)
        logdet = torch.log(diag).sum(-1)
        if covariance_type == "tied":
            logdet = logdet.expand(K)
    else:
        if d_min <= 0:
            raise ValueError(f"precisions_cholesky ({covariance_type}) must be positive, got min {d_min:.3g}")
        logdet = torch.log(pc).sum(1) if covariance_type == "diag" else D * torch.log(pc)
    if sample_weight is not None:
        if not ok_sw:
            _check_finite(sample_weight, "sample_weight")
        if sw_min < 0:
            raise ValueError("sample_weight must be non-negative")
    if not ok_center:
        _check_finite(center, "center")
    logw = torch.where(weights > 0, torch.log(weights.clamp_min(1e-300)), torch.full_like(weights, LOG_ZERO))
    const = logw + logdet - 0.5 * D * math.log(2 * math.pi)
    shift = (weights[:, None] * means).sum(0)
    if X.dtype != torch.float64:
        # the kernels subtract g in fp32: make it exactly representable so that x - g and the
        # shifted means/centres (computed in float64 here) refer to the same origin
        shift = shift.to(torch.float32).to(f64)
    return Prepared(X=X, sample_weight=sample_weight, covariance_type=covariance_type, K=K, D=D, N=N, mu=means,
                    center=center, prec_chol=pc, shift=shift, const=const)


def diag_precisions(prep: Prepared) -> torch.Tensor:
    """``[K, D]`` float64 diagonal precisions ``p_kd`` (spherical broadcast over D)."""
    pc = prep.prec_chol
    if prep.covariance_type == "diag":
        return pc * pc
    return (pc * pc)[:, None].expand(prep.K, prep.D).contiguous()


def finish_shifted(prep: Prepared, nk, S1, S2):
    """Turn sums about the global shift into the statistics about the centres (float64).

    ``S1 = sum r (x - g)``, ``S2 = sum r (x - g)^2`` ([K, D]) with ``c' = c - g``:
    ``s1 = S1 - nk c'``, ``s2 = S2 - 2 c' S1 + nk c'^2``; spherical sums s2 over D.
    """
    cp = prep.center - prep.shift
    nk = nk.to(torch.float64)
    S1 = S1.to(torch.float64)
    S2 = S2.to(torch.float64)
    s1 = S1 - nk[:, None] * cp
    s2 = S2 - 2 * cp * S1 + nk[:, None] * cp * cp
    if prep.covariance_type == "spherical":
        s2 = s2.sum(1)
    return s1, s2
