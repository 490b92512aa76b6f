"""Loss, gradient and Hessian weights of a linear model in one read of X.

    eta  = [X, 1] W,  hess = l''(target, eta) (gamma, Tweedie: E[l''])  [N, m]
    loss = sum_i c_i l(target_i, eta_i)                          [m] (float64)
    grad = alpha * [X, 1]^T (c ⊙ l'(target, eta)) + beta * z     [D(+1), m]

This is the mmchain pattern with a pointwise function between ``X W`` and ``X^T``: the fused
backend computes ``eta`` for a row tile, applies the loss while the tile is on chip, and
accumulates ``X^T p`` from the same registers (the onchip dense kernel's ``LOSS`` epilogue), so an
objective-and-gradient evaluation of a Newton or quasi-Newton solver reads X once instead of
twice (``matvec`` then ``X^T p``, which is what the ``"ops"`` backend does).

``loss`` sums the part of the loss that depends on ``eta``; terms of the target alone (e.g.
``y log y`` of the Poisson deviance) are the caller's constant (``offset``). With ``objective``
the pass also returns the penalised objective whose gradient ``grad`` is,
``alpha * loss + beta / 2 * ||z||^2 + offset`` (per problem, float64): a bound pass forms it in
one small launch after the read of X instead of ~5 torch launches, host time a solver pays at
every evaluation. The kernel sums it in registers
(per-program partials, added in float64 on the host) and stores only ``hess`` (and ``eta`` when
asked): every per-row store costs a layout conversion through shared memory.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._dispatch import resolve_backend
from .._launch import bind as bind_launch
from .._launch import call
from .._validation import CSRMatrix
from ._checks import _operand, _scalar, check_bindable, check_config, prepare_mmchain
from .dense import _TL, _f64, _loss_p, _split
from .launch import gpu_info

__all__ = ["LOSSES", "BoundLossGradient", "LossGradient", "bind_loss_gradient", "loss_gradient", "loss_terms",
           "one_read"]

#: Loss name -> kernel code (``_loss_terms`` in dense.py). ``"tweedie"`` with power 1 / 2 is
#: ``"poisson"`` / ``"gamma"``.
LOSSES = {
    "logistic": 1,  # softplus(eta) - y eta, y in [0, 1]
    "squared_hinge": 2,  # max(0, 1 - y eta)^2, y in {-1, 1}; m independent columns
    "multinomial": 3,  # logsumexp(eta) - sum_j y_j eta_j (in column 0), y one-hot; hess = softmax
    "poisson": 4,  # exp(eta) - y eta (log link)
    "gamma": 5,  # eta + y exp(-eta) (log link)
    "tweedie": 6,  # exp((2-p) eta)/(2-p) - y exp((1-p) eta)/(1-p) (log link)
    "squared_error": 7,  # (eta - y)^2 / 2
}


class LossGradient(NamedTuple):
    """What :func:`loss_gradient` returns (1-D ``[N]`` / ``[D(+1)]`` for a 1-D W).

    Attributes
    ----------
    grad : torch.Tensor [D(+1), m]
    loss : torch.Tensor [m] (0-d for a 1-D W), float64
        ``sum_i c_i l(target_i, eta_i)`` per column (the eta-dependent part of the loss;
        multinomial: the rows' losses in column 0, zeros elsewhere).
    eta : torch.Tensor [N, m] or None
        The linear predictor ``[X, 1] W`` (None with ``return_eta=False``).
    hess : torch.Tensor [N, m]
        ``l''(target, eta)``, unweighted (multinomial: the class probabilities, the softmax
        Hessian's P; gamma and Tweedie: the expected weight ``E_y[l'']``, see :func:`loss_terms`).
    objective : torch.Tensor or None
        With ``objective="sum"`` ([1]) or ``"columns"`` ([m]; 0-d for a 1-D W), float64:
        ``alpha * loss + beta / 2 * ||z||^2 + offset`` summed over all columns or per column.
    """

    grad: torch.Tensor
    loss: torch.Tensor
    eta: torch.Tensor | None
    hess: torch.Tensor
    objective: torch.Tensor | None = None


def _code(loss: str, power) -> tuple:
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    if loss != "tweedie":
        if power is not None:
            raise ValueError(f"power is only used by loss='tweedie', got power={power!r} with loss={loss!r}")
        return LOSSES[loss], 0.0
    if power is None:
        raise ValueError("loss='tweedie' needs power")
    p = _scalar(power, "power")
    if p == 1.0:
        return LOSSES["poisson"], p
    if p == 2.0:
        return LOSSES["gamma"], p
    return LOSSES["tweedie"], p


def logistic_value(eta: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logistic loss ``softplus(eta) - y * eta`` without cancellation (the kernels' twin).

    ``max(eta, 0) - y * eta`` is formed per sign and ``log1p(exp(-|eta|))`` added last, so a
    well-classified row keeps its loss (~``exp(-|eta|)``) where ``softplus(eta) - y * eta``
    rounds it to zero (``F.softplus`` returns ``eta`` itself above 20).

    Parameters
    ----------
    eta, y : torch.Tensor
        Margins and targets in [0, 1], broadcastable.

    Returns
    -------
    torch.Tensor
    """
    return torch.where(eta > 0, (1.0 - y) * eta, -y * eta) + torch.log1p(torch.exp(-eta.abs()))


def loss_terms(loss: str, eta: torch.Tensor, target: torch.Tensor, power=None):
    """The pointwise loss, its derivative and its Hessian weight (torch; the kernels' twin).

    The Hessian weight is ``l''`` except for gamma and Tweedie, whose log link is not canonical:
    there it is the expected (Fisher) weight ``E_y[l'']`` (gamma: 1; Tweedie: ``exp((2 - p) eta)``),
    positive for every target, as the GLM solvers' Newton steps need.

    Parameters
    ----------
    loss : str
        A key of :data:`LOSSES`.
    eta, target : torch.Tensor [N, m]
    power : float, optional
        Tweedie power (``loss="tweedie"`` only).

    Returns
    -------
    (value, grad, hess) : tuple of torch.Tensor [N, m]
    """
    code, p = _code(loss, power)
    t, y = eta, target
    if code == 1:
        pr = torch.sigmoid(t)
        return logistic_value(t, y), pr - y, pr * (1.0 - pr)
    if code == 2:
        z = 1.0 - y * t
        act = (z > 0).to(t.dtype)
        return act * z * z, act * 2.0 * (t - y), act * 2.0
    if code == 3:
        lse = torch.logsumexp(t, dim=1, keepdim=True)
        pr = torch.exp(t - lse)
        val = -y * t
        val[:, :1] += lse
        return val, pr - y, pr
    if code == 4:
        mu = torch.exp(t)
        return mu - y * t, mu - y, mu
    if code == 5:
        e = torch.exp(-t)
        return t + y * e, 1.0 - y * e, torch.ones_like(t)
    if code == 6:
        a, b = torch.exp((1.0 - p) * t), torch.exp((2.0 - p) * t)
        return b / (2.0 - p) - y * a / (1.0 - p), b - y * a, b
    g = t - y
    return 0.5 * g * g, g, torch.ones_like(t)


def loss_gradient(X, W, target, *, loss, power=None, sample_weight=None, alpha=1.0, z=None, beta=0.0,
                  intercept=False, return_eta=True, backend="auto", deterministic=False, check_finite=False,
                  config=None, objective=None, offset=None) -> LossGradient:
    """Loss, gradient and Hessian weights of a linear model, reading X once (fused).

    ``eta = [X, 1] W``; ``loss = sum_i c_i l(target_i, eta_i)``; ``hess = l''(target, eta)`` (gamma and
    Tweedie: the expected weight, see :func:`loss_terms`);
    ``grad = alpha * [X, 1]^T (c ⊙ l'(target, eta)) + beta * z`` (``c``: ``sample_weight``).

    Parameters
    ----------
    X : array-like [N, D] or sparse CSR
        As for :func:`fusedml.mmchain`. The one-read pass serves dense X whose rows fit on chip
        (the mmchain "onchip" strategy; for m > 1 the rows :func:`one_read` accepts);
        CSR and wider rows are composed from :func:`fusedml.matvec` and :func:`fusedml.mmchain`
        (two reads; on the fused backend the pointwise terms between them are one launch).
    W : array-like [D(+1)] or [D(+1), m] (m <= 16)
        Coefficients (with the intercept in the last row when ``intercept``).
    target : array-like [N] or [N, m]
        The same shape as ``eta``: 0/1 labels (logistic), -1/+1 (squared hinge), one-hot rows
        (multinomial), observations (the GLM losses).
    loss : {"logistic", "squared_hinge", "multinomial", "poisson", "gamma", "tweedie", "squared_error"}
        See :data:`LOSSES`; the GLM losses use the log link (squared error: identity).
    power : float, optional
        Tweedie power (``loss="tweedie"`` only).
    sample_weight : array-like [N], optional
        Row weights ``c`` of the loss sum and the gradient (``hess`` is returned unweighted).
    alpha, beta : float
    z : array-like, optional
        Shape of ``grad``; added as ``beta * z`` (e.g. the L2 penalty's ``l2 * W``).
    intercept : bool
        Treat X as ``[X, 1]``.
    return_eta : bool
        Store and return ``eta`` (one more ``[N, m]`` store per pass; solvers of one coupled
        problem never need it).
    backend : {"auto", "fused", "ops", "cpu"}
    deterministic : bool
        Fused backend: no float atomics (bitwise reproducible).
    check_finite : bool
        Raise ``ValueError`` if X, W, target, z hold NaN or infinity.
    config : dict, optional
        Dense launch overrides, as for :func:`fusedml.mmchain`.
    objective : {None, "sum", "columns"}
        Also return ``alpha * loss + beta / 2 * ||z||^2 + offset`` (float64), the objective whose
        gradient is ``grad`` when ``z`` is W (or W with unpenalised entries set to zero): one value
        over all columns (``"sum"``: a coupled model such as the multinomial) or one per column
        (``"columns"``: m independent problems).
    offset : torch.Tensor, optional
        float64 on X's device, [1] (``"sum"``) or [m] (``"columns"``): added to the objective
        (e.g. the loss's terms of the target alone).

    Returns
    -------
    LossGradient
        ``(grad, loss, eta, hess, objective)``: grad, eta and hess float32 (float64 for float64
        X), loss and objective float64, on X's device (objective None unless asked).

    Examples
    --------
    >>> import math, torch, fusedml
    >>> X = torch.randn(200, 5); w = torch.zeros(6); y = (torch.rand(200) < 0.5).float()
    >>> r = fusedml.loss_gradient(X, w, y, loss="logistic", intercept=True, backend="cpu")
    >>> abs(float(r.loss) - 200 * math.log(2.0)) < 1e-4
    True
    """
    P, code, p, c = _prepare(X, W, target, loss, power, sample_weight, alpha, z, beta, intercept, check_finite)
    check_config(config, P.is_csr)
    offset = _check_objective(P, objective, offset)
    be = resolve_backend(backend, P.device)
    out = None
    if be == "fused" and not isinstance(P.X, CSRMatrix) and isinstance(P.X, torch.Tensor):
        out = _dense_fused(P, code, p, c, bool(return_eta), deterministic, config)
    if out is None:
        out = _composed(P, loss, power, c, be, deterministic)
    grad, lsum, eta, hess = out
    obj = None if objective is None else _objective_torch(P, lsum, objective, offset)
    return _result(P, grad, lsum, eta if return_eta else None, hess, obj)


def _result(P, grad, lsum, eta, hess, obj=None):
    """The :class:`LossGradient` in the caller's 1-D / 2-D convention (``eta`` None: not kept)."""
    if obj is not None and P.vector:
        obj = obj[0]
    return LossGradient(P.finish(grad), lsum[0] if P.vector else lsum, None if eta is None else P.finish(eta),
                        P.finish(hess), obj)


def _check_objective(P, objective, offset):
    """``offset`` checked against ``objective`` (None: no offset, or no objective asked)."""
    if objective not in (None, "sum", "columns"):
        raise ValueError(f"objective must be None, 'sum' or 'columns', got {objective!r}")
    if offset is None:
        return None
    if objective is None:
        raise ValueError("offset needs objective='sum' or 'columns'")
    n = 1 if objective == "sum" else P.m
    if not (isinstance(offset, torch.Tensor) and offset.dtype == torch.float64 and offset.device == P.device
            and offset.numel() == n):
        got = f"{offset.dtype} {tuple(offset.shape)} on {offset.device}" if isinstance(offset, torch.Tensor) else type(
            offset).__name__
        raise ValueError(f"offset must be a float64 tensor of {n} value(s) on {P.device}, got {got}")
    return offset.reshape(n)


def _objective_torch(P, lsum, objective, offset):
    """``alpha * lsum + beta / 2 * ||z||^2 (+ offset)``, [1] or [m] float64 (torch)."""
    obj = P.alpha * lsum
    if P.z is not None and P.beta != 0.0:
        obj = obj + (0.5 * P.beta) * P.z.double().square().sum(0)
    if objective == "sum":
        obj = obj.sum().reshape(1)
    return obj if offset is None else obj + offset


@triton.jit
def _objective_kernel(
    LPART, Z, OFF, LOSS, OBJ,  # LPART [G, M] float64; Z [DZ, M]
    G, M, DZ, stride_zn, stride_zk, a_hi, a_lo, hb_hi, hb_lo,  # alpha and beta / 2 as fp32 hi/lo pairs
    COUPLED: tl.constexpr, HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
):
    # one program: the loss sums over the pass's programs ([M] -> LOSS), then the objective
    jm = tl.arange(0, BLOCK_M)
    cm = jm < M
    og = tl.arange(0, BLOCK_G)
    acc = tl.zeros([BLOCK_G, BLOCK_M], dtype=tl.float64)
    for g0 in range(0, G, BLOCK_G):
        rows = g0 + og
        acc += tl.load(LPART + rows[:, None] * M + jm[None, :], mask=(rows < G)[:, None] & cm[None, :], other=0.0)
    lsum = tl.sum(acc, axis=0)
    tl.store(LOSS + jm, lsum, mask=cm)
    obj = _f64(a_hi, a_lo) * lsum
    if HAS_Z:
        orr = tl.arange(0, BLOCK_R)
        zz = tl.zeros([BLOCK_R, BLOCK_M], dtype=tl.float64)
        for r0 in range(0, DZ, BLOCK_R):
            rows = r0 + orr
            zv = tl.load(Z + rows[:, None] * stride_zn + jm[None, :] * stride_zk,
                         mask=(rows < DZ)[:, None] & cm[None, :], other=0.0).to(tl.float64)
            zz += zv * zv
        obj += _f64(hb_hi, hb_lo) * tl.sum(zz, axis=0)
    if COUPLED:
        tot = tl.sum(tl.where(cm, obj, 0.0), axis=0)
        if HAS_OFF:
            tot += tl.load(OFF)
        tl.store(OBJ, tot)
    else:
        if HAS_OFF:
            obj += tl.load(OFF + jm, mask=cm, other=0.0)
        tl.store(OBJ + jm, obj, mask=cm)


def _bind_objective(P, lpart, objective, offset):
    """``() -> (loss sums [m], objective)``: the bound pass's one launch after the read of X."""
    m, dev = P.m, P.device
    has_z = P.z is not None and P.beta != 0.0
    lsum = torch.empty(m, dtype=torch.float64, device=dev)
    obj = torch.empty(1 if objective == "sum" else m, dtype=torch.float64, device=dev)
    z = P.z if has_z else lpart
    block_m = triton.next_power_of_2(m)
    go = bind_launch(_objective_kernel, (1,),
                     (lpart, z, offset if offset is not None else lsum, lsum, obj, lpart.shape[0], m,
                      P.Dx if has_z else 0, z.stride(0), z.stride(1), *_split(P.alpha), *_split(0.5 * P.beta)),
                     dict(COUPLED=objective == "sum", HAS_Z=has_z, HAS_OFF=offset is not None,
                          BLOCK_G=max(1, 1024 // block_m), BLOCK_M=block_m, BLOCK_R=max(1, 1024 // block_m)),
                     num_warps=4)
    return go, lsum, obj


def _prepare(X, W, target, loss, power, sample_weight, alpha, z, beta, intercept, check_finite):
    """Validated ``(Problem, kernel code, power, c)`` of a loss-gradient pass."""
    code, p = _code(loss, power)
    if target is None:
        raise ValueError("target is required")
    if W is None:  # prepare_mmchain would read it as X^T-only (no margins): the loss at W = 0
        raise ValueError("W is required (the coefficients [D(+1)] or [D(+1), m])")
    P = prepare_mmchain(X, W, target, z, alpha, beta, intercept=intercept, v_op="mul", check_finite=check_finite,
                        names=("W", "target"))
    N, m = P.N, P.m
    if tuple(P.v.shape) != (N, m):
        raise ValueError(f"target must have the shape of eta = [X, 1] W: [{N}, {m}], got [{N}] "
                         "(one target column per column of W)")
    if code == 3 and m < 2:
        raise ValueError(f"loss='multinomial' needs W with one column per class (m >= 2), got m = {m}")
    c = None
    if sample_weight is not None:
        c = _operand(sample_weight, "sample_weight", P.device, P.acc_dtype, (1,))
        if c.shape[0] != N:
            raise ValueError(f"sample_weight must have N = {N} entries, got shape {tuple(c.shape)}")
    return P, code, p, c


class BoundLossGradient:
    """:func:`loss_gradient` over fixed operands, validated once and re-run on their current contents.

    Made by :func:`bind_loss_gradient`. Calling it (no arguments) computes the pass at what ``W``
    and ``z`` hold at that moment. On the fused one-read path ``grad``, ``eta`` and ``hess`` are
    persistent buffers, overwritten by the next call (``loss`` is a new tensor each call, unless an
    ``objective`` is asked: then it and the objective are persistent too), and
    the launch repeats Triton's compiled kernel with the same arguments; elsewhere (CSR, wide
    rows, the other backends) each call is the two-read composition and returns new tensors.

    Attributes
    ----------
    backend : str
        The resolved backend.
    one_read : bool
        Whether each call reads X once (the fused kernel) rather than twice.
    calls : int
        Calls so far.
    """

    def __init__(self, P, code, p, c, loss, power, return_eta, backend, deterministic, config, objective=None,
                 offset=None):
        self.P, self.backend, self.calls = P, backend, 0
        self._spec = (c, loss, power, bool(return_eta), bool(deterministic), objective, offset)
        self._run = None
        if backend == "fused" and not P.is_csr and not deterministic:
            self._run = _dense_fused(P, code, p, c, return_eta, False, config, bind=True, objective=objective,
                                     offset=offset)
        self.one_read = self._run is not None

    def launch_only(self):
        """The pass without its first launch, for a caller that writes it itself.

        A call first writes ``beta * z`` (zero without ``z``) into the gradient buffer, then
        accumulates ``alpha * [X,1]^T (c * loss')`` onto it. The callable returned here runs the
        accumulation (and the objective's launch) alone: whoever calls it must have left
        ``beta * z`` in :attr:`out` since the previous call (:func:`fusedml.cg.bind_trial_point`
        writes it with the trial point).

        Returns
        -------
        callable or None
            ``() -> LossGradient``; None off the bound fused one-read path with an ``objective``.
        """
        go = getattr(self._run, "launch_only", None)
        if go is None:
            return None

        def run():
            self.calls += 1
            return _result(self.P, *go())
        return run

    @property
    def out(self):
        """The persistent ``[Dx, m]`` gradient buffer where :meth:`launch_only` applies, else None."""
        return getattr(self._run, "grad", None)

    def __call__(self) -> LossGradient:
        self.calls += 1
        if self._run is not None:
            return _result(self.P, *self._run())
        c, loss, power, return_eta, deterministic, objective, offset = self._spec
        grad, lsum, eta, hess = _composed(self.P, loss, power, c, self.backend, deterministic)
        obj = None if objective is None else _objective_torch(self.P, lsum, objective, offset)
        return _result(self.P, grad, lsum, eta if return_eta else None, hess, obj)


def bind_loss_gradient(X, W, target, *, loss, power=None, sample_weight=None, alpha=1.0, z=None, beta=0.0,
                       intercept=False, return_eta=True, backend="auto", deterministic=False,
                       config=None, objective=None, offset=None) -> BoundLossGradient:
    """:func:`loss_gradient` for repeated calls at changing coefficients (a solver's evaluations).

    The arguments are checked once, here; each call of the returned object recomputes the pass
    from the current contents of ``W`` and ``z`` (the caller may change them in place, not their
    shapes or storage), without the per-call validation, dispatch and launch set-up (~0.1 ms of
    host time per :func:`loss_gradient` call on the H200 host). ``target`` and
    ``sample_weight`` are converted once, here: a tensor already of the accumulation dtype on X's
    device is used as it is (in-place changes to it are seen), anything else is copied now.

    Parameters
    ----------
    X, W, target, loss, power, sample_weight, alpha, z, beta, intercept, return_eta, backend, deterministic, config
        As for :func:`loss_gradient`, except that ``W`` and ``z`` must be torch tensors already
        on X's device in the accumulation dtype (float64 for float64 X, else float32): a
        conversion would copy them, and the bound pass would not see later changes.
    objective, offset
        As for :func:`loss_gradient` (``offset`` read at each call). On the fused one-read path
        the loss sums and the objective come from one launch after the pass (the objective
        buffer is persistent too).

    Returns
    -------
    BoundLossGradient
        Call it to compute (returns a :class:`LossGradient`); on the fused one-read path each
        call overwrites the same ``grad``, ``eta`` and ``hess`` buffers.

    Examples
    --------
    >>> import torch, fusedml
    >>> X = torch.randn(200, 5); w = torch.zeros(6); y = (torch.rand(200) < 0.5).float()
    >>> lg = fusedml.bind_loss_gradient(X, w, y, loss="logistic", intercept=True, backend="cpu")
    >>> w.fill_(0.1)  # doctest: +ELLIPSIS
    tensor(...)
    >>> r = fusedml.loss_gradient(X, w, y, loss="logistic", intercept=True, backend="cpu")
    >>> torch.allclose(lg().grad, r.grad)
    True
    """
    if hasattr(X, "_fusedml_mmchain") and not isinstance(X, torch.Tensor):
        raise TypeError(f"bind_loss_gradient needs a dense tensor or CSR matrix X, got {type(X).__name__} "
                        "(call loss_gradient for streamed matrices)")
    P, code, p, c = _prepare(X, W, target, loss, power, sample_weight, alpha, z, beta, intercept, False)
    check_config(config, P.is_csr)
    check_bindable("bind_loss_gradient", P, ((W, "W"), (z, "z")))
    offset = _check_objective(P, objective, offset)
    be = resolve_backend(backend, P.device)
    return BoundLossGradient(P, code, p, c, loss, power, return_eta, be, deterministic, config, objective, offset)


def one_read(X, m: int = 1) -> bool:
    """Whether the solvers should take :func:`loss_gradient`'s one read of this X on the fused
    backend (dense rows on chip; for m > 1 rows of at most 128 values, 256 for m <= 4 and 64 for
    m = 6..8: where it was measured faster, see :func:`fusedml.mmchain.dense.loss_launch`).

    Parameters
    ----------
    X : torch.Tensor or other
        The design matrix as given to :func:`loss_gradient`.
    m : int
        Columns of W.

    Returns
    -------
    bool
        False also for m above ``FUSEDML_LOSS_ONE_READ_M`` (default 16; A/B runs of the one
        read against ``matvec`` and ``X^T V`` for the multinomial, ``benchmarks/gpu_session.sh``
        part ``e2e-mult-ab``).
    """
    if not isinstance(X, torch.Tensor) or X.layout != torch.strided or X.ndim != 2 or not 1 <= m <= 16:
        return False
    if m > int(os.environ.get("FUSEDML_LOSS_ONE_READ_M", "16") or 16):
        return False
    from .dense import loss_launch
    from .launch import dense_config

    cfg = dense_config(int(X.shape[0]), int(X.shape[1]), m, X.dtype, gpu_info(X.device),
                       stride_xn=X.stride(0), stride_xd=X.stride(1))
    try:
        loss_launch(cfg, int(X.shape[1]), m, X, torch.float64 if X.dtype == torch.float64 else torch.float32)
    except NotImplementedError:  # wide rows (for m > 1: wider than 128 values; see loss_config)
        return False
    return True


def _dense_fused(P, code, p, c, return_eta, deterministic, config, bind=False, objective=None, offset=None):
    """``(grad, loss sums, eta, hess)`` of the one-read pass, or None where it does not apply (wide
    rows); with ``bind``, ``() -> (grad, loss sums, eta, hess, objective or None)`` over persistent
    buffers (the objective's launch bound after the pass's)."""
    from .dense import dense_mmchain_fused

    N, m, acc, dev = P.N, P.m, P.acc_dtype, P.device
    eta = torch.empty((N, m), dtype=acc, device=dev) if return_eta else None
    hess = torch.empty((N, m), dtype=acc, device=dev)
    grad = torch.empty((P.Dx, m), dtype=acc, device=dev) if bind else None
    cc = None if c is None else c.contiguous()
    try:
        r = dense_mmchain_fused(P, deterministic=bool(deterministic), config=config, out=grad, bind=bind,
                                loss=(code, p, cc, eta, hess))
    except NotImplementedError:  # wide rows: no one-read pass (loss_config)
        return None
    if bind:
        if objective is None:
            return lambda: (grad, r()[1].sum(0, dtype=torch.float64), eta, hess, None)
        go, lsum, obj = _bind_objective(P, r.result[1], objective, offset)

        def run():
            r()
            go()
            return grad, lsum, eta, hess, obj

        def run_only():  # the caller left beta * z (or zero) in grad
            r.launch_only()
            go()
            return grad, lsum, eta, hess, obj
        run.launch_only, run.grad = run_only, grad
        return run
    g, lpart = r
    return g, lpart.sum(0, dtype=torch.float64), eta, hess


@triton.jit
def _terms_kernel(ETA, Y, C, G, HW, LPART, N, M, n_tiles, stride_yn, stride_ym, power_hi, power_lo,
                  LOSS: tl.constexpr, HAS_C: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
                  M_PAD: tl.constexpr):
    # the two-read pass's pointwise part, one sweep of eta [N, M] (contiguous) and the targets:
    # G = c * loss'(eta), HW = the Hessian weights (both [N, M] contiguous), LPART [programs, M]
    # float64 = each program's sum of c * loss (the one-read kernels' _loss_p, reused)
    power = tl.cast(power_hi, ACC) + tl.cast(power_lo, ACC)  # Tweedie power: an fp32 pair (the GPU passes fp32)
    pid = tl.program_id(0)
    jm = tl.arange(0, M_PAD)
    ls = tl.zeros([M_PAD], dtype=tl.float64)
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (jm[None, :] < M)
        t = tl.load(ETA + rows[:, None] * M + jm[None, :], mask=mask, other=0.0).to(ACC)
        yv = tl.load(Y + rows[:, None] * stride_yn + jm[None, :] * stride_ym, mask=mask, other=0.0).to(ACC)
        g, val = _loss_p(t, yv, rows, jm, N, M, 1.0, power, C, ETA, HW, LOSS, HAS_C, False, ACC)
        tl.store(G + rows[:, None] * M + jm[None, :], g, mask=mask)
        ls += tl.sum(val, axis=0).to(tl.float64)
    tl.store(LPART + pid * M + jm, ls, mask=jm < M)


def _fused_terms(eta, target, code, power, c):
    """``(loss sums [m] float64, c * loss' [N, m], Hessian weights [N, m])`` of eta in one launch:
    :func:`loss_terms` (times ``c``) as the fused backend's two-read pass takes it (the torch form
    is ~10 launches and as many sweeps of [N, m])."""
    N, m = eta.shape
    eta = eta.contiguous()
    c = None if c is None else c.contiguous()  # read as C + row
    acc = eta.dtype
    m_pad = triton.next_power_of_2(m)
    block_n = max(16, 2048 // m_pad)
    n_tiles = -(-N // block_n)
    grid = max(1, min(n_tiles, 4 * gpu_info(eta.device).sm_count))
    g = torch.empty_like(eta)
    h = torch.empty_like(eta)
    part = torch.empty((grid, m), dtype=torch.float64, device=eta.device)
    call(_terms_kernel, (grid,), eta, target, eta if c is None else c, g, h, part, N, m, n_tiles,
         target.stride(0), target.stride(1), *_split(float(power or 0.0)),
         LOSS=code, HAS_C=c is not None, ACC=_TL[acc], BLOCK_N=block_n, M_PAD=m_pad, num_warps=4)
    return part.sum(0), g, h


def _composed(P, loss, power, c, backend, deterministic):
    # two reads of X: eta = [X, 1] W, then alpha * [X, 1]^T (c * l') + beta * z; on the fused
    # backend the pointwise part in between is one launch
    from . import matvec, mmchain

    eta = matvec(P.X, P.y, intercept=P.intercept, backend=backend)
    if backend == "fused":
        code, p = _code(loss, power)
        lsum, g, h = _fused_terms(eta, P.v, code, p, c)
    else:
        val, g, h = loss_terms(loss, eta, P.v, power)
        if c is not None:
            g = g * c[:, None]
            val = val * c[:, None]
        lsum = val.sum(0, dtype=torch.float64)
    grad = mmchain(P.X, None, v=g, z=P.z, alpha=P.alpha, beta=P.beta, intercept=P.intercept, backend=backend,
                   deterministic=deterministic)
    return grad, lsum, eta, h
