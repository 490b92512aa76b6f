"""Validation and host-side parameter preparation shared by every GMM backend.

The parameters ([K], [K, D], [K, D, D]) are checked and turned into the backends' float64
quantities on the host, in numpy: they are tiny, and on the GPU the same work took ~60 small
launches and a synchronisation per E-step (about 1 ms of host time at 1M rows, 8x the kernel).
Parameters that live on a GPU come to the host in one transfer; what the kernels need goes back
in one (:func:`upload`). The data matrix is only checked (shape, dtype, finiteness), never copied.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .._validation import FLOAT_DTYPES, CSRMatrix, as_matrix, check_finite as _check_finite, to_tensor, warn_user

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
PRECISIONS = ("fp32", "tf32x3", "tf32", "bf16")
PATHS = ("auto", "single", "two_pass")

# log(0) for a component of weight 0: finite so that max-subtraction never meets inf - inf.
LOG_ZERO = -1.0e30

_PARAMS = ("mu", "center", "prec_chol", "shift", "const")
_TORCH_DTYPE = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32,
                np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}


def upload(arrays: dict, device) -> dict:
    """Several small host arrays to ``device`` in ONE copy.

    The arrays are packed, 16-byte aligned, into one pinned buffer whose copy is asynchronous
    (no wait on the GPU's queue); the results are typed views of one device buffer.

    Parameters
    ----------
    arrays : dict of str to numpy.ndarray
        float64 / float32 / int64 / int32 arrays of any shape.
    device : torch.device or str

    Returns
    -------
    dict of str to torch.Tensor
        Contiguous tensors with the arrays' shapes and dtypes (copies; on the CPU views of one
        buffer too).
    """
    device = torch.device(device)
    arrays = {k: np.ascontiguousarray(a) for k, a in arrays.items()}
    offs, total = {}, 0
    for k, a in arrays.items():
        offs[k] = total
        total += -(-a.nbytes // 16) * 16
    on_cpu = device.type == "cpu"
    staging = torch.empty(max(total, 16), dtype=torch.uint8, pin_memory=not on_cpu)
    buf = staging.numpy()
    for k, a in arrays.items():
        buf[offs[k]:offs[k] + a.nbytes] = a.reshape(-1).view(np.uint8)
    # the caching host allocator keeps `staging` until the copy has read it
    dev = staging if on_cpu else staging.to(device, non_blocking=True)
    typed, out = {}, {}
    for k, a in arrays.items():  # one typed view of the buffer per dtype, one strided view per array
        dt = _TORCH_DTYPE[a.dtype]
        base = typed.get(dt)
        if base is None:
            base = typed[dt] = dev.view(dt)
        out[k] = base.as_strided(a.shape, tuple(st // a.itemsize for st in a.strides), offs[k] // a.itemsize)
    return out


class Prepared:
    """Validated operands and the float64 quantities every backend derives from them.

    Attributes
    ----------
    X : torch.Tensor
        ``[N, D]`` the data, as given (any strides, any float dtype).
    sample_weight : torch.Tensor or None
        ``[N]`` float64 sample weights on X's device.
    covariance_type : str
    K, D, N : int
    host : dict of str to numpy.ndarray
        float64 parameters on the host: ``mu`` ``[K, D]`` means; ``center`` ``[K, D]`` the
        statistics' centres ``c_k``; ``prec_chol`` precision Cholesky factors (scikit-learn
        shapes; full/tied upper triangular); ``shift`` ``[D]`` the global shift ``g`` subtracted
        from X before any fp32 arithmetic (``sum_k pi_k mu_k``, the mixture mean, close to the
        data mean); ``const`` ``[K]`` ``log pi_k + log det P_k - D/2 log(2 pi)`` (the
        x-independent part of the weighted log-density, without the quadratic).
    mu, center, prec_chol, shift, const : torch.Tensor
        The same on X's device (uploaded together, once, on first use).
    """

    def __init__(self, X, sample_weight, covariance_type, K, D, N, host):
        self.X, self.sample_weight, self.covariance_type = X, sample_weight, covariance_type
        self.K, self.D, self.N = K, D, N
        self.host = host
        self._dev = {}  # device copies, shared by shallow copies (the streamed blocks)

    @property
    def device(self) -> torch.device:
        return self.X.device

    def _tensor(self, name: str) -> torch.Tensor:
        if name not in self._dev:
            self._dev.update(upload({n: self.host[n] for n in _PARAMS if n not in self._dev}, self.device))
        return self._dev[name]

    mu = property(lambda self: self._tensor("mu"))
    center = property(lambda self: self._tensor("center"))
    prec_chol = property(lambda self: self._tensor("prec_chol"))
    shift = property(lambda self: self._tensor("shift"))
    const = property(lambda self: self._tensor("const"))


def _expected_prec_shape(covariance_type, K, D):
    return {"full": (K, D, D), "tied": (D, D), "diag": (K, D), "spherical": (K,)}[covariance_type]


def packed_to(tensors, device):
    """``tensors`` (any shapes, on one device) in float64 on ``device`` in ONE transfer: views of
    one buffer, in order."""
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors]).to(device)
    out, o = [], 0
    for t in tensors:
        out.append(flat[o:o + t.numel()].view(t.shape))
        o += t.numel()
    return out


def _to_host(tensors, probes):
    """float64 numpy copies of ``tensors`` and floats of the 0-d ``probes``: one device-to-host
    transfer for everything that lives on a GPU (one synchronisation), none when nothing does."""
    remote = [i for i, t in enumerate(tensors) if t.device.type != "cpu"]
    rprobes = [i for i, p in enumerate(probes) if p.device.type != "cpu"]
    out = [None] * len(tensors)
    vals = [None] * len(probes)
    if remote or rprobes:
        dev = (tensors[remote[0]] if remote else probes[rprobes[0]]).device
        host = packed_to([tensors[i].detach().to(dev) for i in remote] + [probes[i].to(dev) for i in rprobes], "cpu")
        for i, h in zip(remote, host):
            out[i] = h.numpy()
        for i, h in zip(rprobes, host[len(remote):]):
            vals[i] = float(h)
    for i, t in enumerate(tensors):
        if out[i] is None:
            out[i] = t.detach().to(torch.float64).numpy().copy()
    for i, p in enumerate(probes):
        if vals[i] is None:
            vals[i] = float(p)
    return out, vals


def validate(X, weights, means, precisions_cholesky, covariance_type, *, sample_weight=None,
             center=None, check_finite=True, check_params=True) -> Prepared:
    """Check every operand and derive the float64 quantities the backends share.

    At most one device-to-host transfer (parameters on a GPU, the finiteness probe of X, the
    sample weights' checks) and no transfer back: the device copies are made on first use.
    ``check_params=False`` (:func:`_trusted`) skips the parameters' conversions and most checks
    for parameters an EM loop's own M-step made; what it cannot vouch for takes this full path.

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
    if not check_params and center is None:
        prep = _trusted(X, weights, means, precisions_cholesky, covariance_type, sample_weight, check_finite)
        if prep is not None:
            return prep
    X = as_matrix(X, "X")
    if isinstance(X, CSRMatrix):
        raise TypeError("X: the GMM E-step takes dense data; got a sparse matrix (densify it first)")
    N, D = X.shape
    dev = X.device
    f64 = torch.float64
    mu_t = to_tensor(means, "means", ndim=2)
    K = mu_t.shape[0]
    if K == 0:
        raise ValueError("means has no components (shape [0, D])")
    if mu_t.shape[1] != D:
        raise ValueError(f"means has {mu_t.shape[1]} features but X has {D}: shape {tuple(mu_t.shape)}, X {tuple(X.shape)}")
    w_t = to_tensor(weights, "weights", ndim=1)
    if w_t.shape[0] != K:
        raise ValueError(f"weights must have shape [{K}] (one per component), got {tuple(w_t.shape)}")
    pc_t = to_tensor(precisions_cholesky, "precisions_cholesky")
    exp_shape = _expected_prec_shape(covariance_type, K, D)
    if tuple(pc_t.shape) != exp_shape:
        raise ValueError(
            f"precisions_cholesky for covariance_type={covariance_type!r} must have shape {exp_shape}, got {tuple(pc_t.shape)}"
        )
    c_t = None
    if center is not None:
        c_t = to_tensor(center, "center", ndim=2)
        if tuple(c_t.shape) != (K, D):
            raise ValueError(f"center must have shape [{K}, {D}], got {tuple(c_t.shape)}")
    probes = []
    if check_finite:
        probes.append(X.sum(dtype=f64))  # one read-only reduction decides
    if sample_weight is not None:
        sample_weight = to_tensor(sample_weight, "sample_weight", ndim=1, dtype=f64, device=dev)
        if sample_weight.shape[0] != N:
            raise ValueError(f"sample_weight must have shape [{N}], got {tuple(sample_weight.shape)}")
        probes += [torch.isfinite(sample_weight).all(), sample_weight.min()]
    params, vals = _to_host([w_t, mu_t, pc_t] + ([c_t] if c_t is not None else []), probes)
    w, mu, pc = params[:3]
    c = params[3] if c_t is not None else mu.copy()
    for a, name in ((mu, "means"), (w, "weights"), (pc, "precisions_cholesky"), (c, "center")):
        if not np.isfinite(a).all():
            _check_finite(torch.from_numpy(a), name)
    if check_finite and not math.isfinite(vals[0]):
        # the full elementwise check only runs to name the problem (or for float64 overflow)
        _check_finite(X, "X")
    if sample_weight is not None:
        ok_sw, sw_min = vals[-2:]
        if not ok_sw:
            _check_finite(sample_weight, "sample_weight")
        if sw_min < 0:
            raise ValueError("sample_weight must be non-negative")
    if w.min() < 0:
        raise ValueError(f"weights must be non-negative, got min {w.min():.3g}")
    atol = max(1e-6, 4 * K * torch.finfo(w_t.dtype).eps)
    wsum = float(w.sum())
    if abs(wsum - 1.0) > atol:
        raise ValueError(f"weights must sum to one (tolerance {atol:.1e}), got sum {wsum:.8g}")
    if covariance_type in ("full", "tied"):
        diag = np.diagonal(pc, axis1=-2, axis2=-1)
        if diag.min() <= 0:
            raise ValueError(
                f"precisions_cholesky ({covariance_type}) is not positive definite: its diagonal must be > 0, "
                f"got min {diag.min():.3g}"
            )
        if np.abs(np.tril(pc, -1)).max() > 1e-6 * np.abs(pc).max():
            raise ValueError(
                f"precisions_cholesky ({covariance_type}) must be upper triangular (scikit-learn's convention: "
                "the transposed inverse of the covariance's lower Cholesky factor)"
            )
    elif pc.min() <= 0:
        raise ValueError(f"precisions_cholesky ({covariance_type}) must be positive, got min {pc.min():.3g}")
    return _derive(X, sample_weight, covariance_type, w, mu, pc, c)


def _derive(X, sample_weight, covariance_type, w, mu, pc, c) -> Prepared:
    """The :class:`Prepared` of checked float64 host parameters (``c``: the centres)."""
    K, D = mu.shape
    if covariance_type in ("full", "tied"):
        pc = np.triu(pc)
        logdet = np.broadcast_to(np.log(np.diagonal(pc, axis1=-2, axis2=-1)).sum(-1), (K,))
    else:
        logdet = np.log(pc).sum(1) if covariance_type == "diag" else D * np.log(pc)
    logw = np.where(w > 0, np.log(np.maximum(w, 1e-300)), LOG_ZERO)
    const = logw + logdet - 0.5 * D * math.log(2 * math.pi)
    shift = (w[:, None] * mu).sum(0)
    if X.dtype != torch.float64:
        # the kernels subtract g in fp32: make it exactly representable so that x - g and the
        # shifted means/centres (computed in float64 here) refer to the same origin
        shift = shift.astype(np.float32).astype(np.float64)
    host = {"mu": mu, "center": c, "prec_chol": pc, "shift": shift, "const": np.ascontiguousarray(const)}
    return Prepared(X, sample_weight, covariance_type, K, D, X.shape[0], host)


def _trusted(X, weights, means, precisions_cholesky, covariance_type, sample_weight, check_finite):
    """:func:`validate`'s ``check_params=False`` path, or None where the full path must run.

    For an EM loop's next E-step: the parameters are :func:`fusedml.gmm.gmm_mstep`'s float64
    numpy arrays (or float64 tensors on X's device, read in one copy), the sample weights the
    ``[N]`` float64 tensor on X's device that an earlier validated call checked. Their
    conversions, shape checks and the sample weights' device probes (a synchronisation) are
    skipped; finite values and positive weights / precision factors are still tested (one sum
    and two minima), and anything else (another type or dtype, a failed test, X to check) returns
    None, so the full path runs and raises its own error. 31-98 us instead of 115-255 us of host
    time per call (diag / full, with or without sample weights; 2-core CPU host, best of 7 rounds).
    """
    f64 = torch.float64
    if (check_finite or not isinstance(X, torch.Tensor) or X.layout != torch.strided or X.ndim != 2
            or X.dtype not in FLOAT_DTYPES or X.numel() == 0):
        return None
    if sample_weight is not None and not (isinstance(sample_weight, torch.Tensor) and sample_weight.dtype == f64
                                          and sample_weight.device == X.device
                                          and tuple(sample_weight.shape) == (X.shape[0],)):
        return None
    params = (weights, means, precisions_cholesky)
    if all(isinstance(a, np.ndarray) and a.dtype == np.float64 for a in params):
        w, mu, pc = (a.copy() for a in params)  # the caller's later changes do not reach the operands
    elif all(isinstance(a, torch.Tensor) and a.dtype == f64 and a.device == X.device for a in params):
        (w, mu, pc), _ = _to_host(list(params), [])
    else:
        return None
    K = w.shape[0] if w.ndim == 1 else -1
    if mu.shape != (K, X.shape[1]) or pc.shape != _expected_prec_shape(covariance_type, K, X.shape[1]):
        return None
    diag = np.diagonal(pc, axis1=-2, axis2=-1) if covariance_type in ("full", "tied") else pc
    # NaN / inf reach the sum (an overflow of huge finite values only sends them the full way)
    if not math.isfinite(w.sum() + mu.sum() + pc.sum()) or w.min() < 0 or diag.min() <= 0:
        return None
    return _derive(X, sample_weight, covariance_type, w, mu, pc, mu.copy())


#: Largest expanded quadratic ``sum_d p_kd (x_d - g_d)^2`` (about the mixture mean) the fp32
#: diag / spherical products take: its fp32 rounding, ~2^-24 x 2^14 = 1e-3 nats, bounds each
#: log-density's error. Beyond it (a component many standard deviations from the mixture mean,
#: e.g. a far component with weight, or a tight one far from the others) the E-step and scoring
#: run in float64 instead, with a warning (:func:`fp32_unsafe`).
FP32_QUAD_LIMIT = 2.0 ** 14


def shifted_quad(cp, prec_chol, covariance_type):
    """``max_k sum_d p_kd cp_kd^2 + D`` from the shifted means ``cp = mu - g`` ([K, D]) and the
    precision factors (diag [K, D], spherical [K]), numpy arrays or torch tensors (a scalar of
    the same kind; on a device, no synchronisation): :func:`fp32_quad`'s formula."""
    p = prec_chol * prec_chol
    if covariance_type == "spherical":
        p = p[:, None]
    return (cp * cp * p).sum(1).max() + cp.shape[1]


def fp32_quad(prep: Prepared) -> float:
    """``max_k sum_d p_kd (mu_kd - g_d)^2 + D``: the size of the fp32 expanded quadratic about the
    shift ``g`` at the rows near each component (diag / spherical; 0 for full / tied, whose kernels
    subtract the means before squaring). Cached in ``prep.host`` (shared by streamed blocks)."""
    q = prep.host.get("quad")
    if q is None:
        q = 0.0
        if prep.covariance_type in ("diag", "spherical"):
            h = prep.host
            q = float(shifted_quad(h["mu"] - h["shift"], h["prec_chol"], prep.covariance_type))
        prep.host["quad"] = q
    return q


def fp32_unsafe(prep: Prepared, where: str) -> bool:
    """True (with a RuntimeWarning) when :func:`fp32_quad` exceeds :data:`FP32_QUAD_LIMIT`: the
    caller then computes in float64 (``where`` names the operation in the warning)."""
    q = fp32_quad(prep)
    if q <= FP32_QUAD_LIMIT:
        return False
    warn_user(f"fusedml.gmm: a component lies {math.sqrt(q):.3g} standard deviations (in its own precision) "
              f"from the mixture mean; fp32 distances expanded about it would be off by ~{q * 2.0 ** -24:.2g} "
              f"nats, so {where} runs in float64 (slower)", RuntimeWarning)
    return True


def diag_precisions(prep: Prepared) -> torch.Tensor:
    """``[K, D]`` float64 diagonal precisions ``p_kd`` (spherical broadcast over D) on X's device."""
    pc = prep.prec_chol
    if prep.covariance_type == "diag":
        return pc * pc
    return (pc * pc)[:, None].expand(prep.K, prep.D).contiguous()


def diag_precisions_host(prep: Prepared) -> np.ndarray:
    """:func:`diag_precisions` on the host (numpy)."""
    pc = prep.host["prec_chol"]
    p = pc * pc
    return p if prep.covariance_type == "diag" else np.repeat(p[:, None], prep.D, axis=1)


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
