"""Argument validation for :func:`fusedml.mmchain` and :func:`fusedml.matvec`.

Everything is checked here, before any kernel runs, so that a bad argument raises a
``ValueError`` / ``TypeError`` naming the argument instead of crashing deep in a kernel.
The result is a :class:`Problem`: the operands converted to torch on X's device, y/v/z cast to
the accumulation dtype and reshaped to 2-D, plus the shape bookkeeping to restore 1-D results.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._validation import CSRMatrix, as_matrix, torch_viewable
from .._validation import check_finite as _check_finite

MAX_M = 16
V_OPS = ("mul", "softmax")
#: Triton's largest tensor (elements): a launch whose tile is larger does not compile.
MAX_TILE_NUMEL = 1 << 20


@dataclass
class Problem:
    """A validated mmchain/matvec problem.

    Attributes
    ----------
    X : torch.Tensor or CSRMatrix
        ``[N, D]`` dense (any strides, never copied here) or CSR.
    N, D : int
        Shape of X (without the intercept column).
    Dx : int
        ``D + 1`` with ``intercept`` else ``D``: rows of y, z and w.
    m : int
        Number of right-hand sides (columns of y / v / z).
    y : torch.Tensor or None
        ``[Dx, m]`` in the accumulation dtype, or None (the ``X^T v`` instance).
    v : torch.Tensor or None
        ``[N, 1]`` (broadcast over columns) or ``[N, m]``, accumulation dtype, or None (ones).
    z : torch.Tensor or None
        ``[Dx, m]`` accumulation dtype, or None.
    vector : bool
        True when the result is 1-D (y 1-D, or y None and v 1-D).
    acc_dtype : torch.dtype
        float64 for float64 X, float32 otherwise.
    """

    X: object
    N: int
    D: int
    Dx: int
    m: int
    y: torch.Tensor | None
    v: torch.Tensor | None
    z: torch.Tensor | None
    alpha: float
    beta: float
    intercept: bool
    v_op: str
    vector: bool
    acc_dtype: torch.dtype
    from_numpy: bool

    @property
    def device(self) -> torch.device:
        return self.X.device

    @property
    def is_csr(self) -> bool:
        return isinstance(self.X, CSRMatrix)

    def finish(self, w: torch.Tensor) -> torch.Tensor:
        """Reshape a ``[Dx, m]`` / ``[N, m]`` result to the caller's 1-D / 2-D convention."""
        return w[:, 0] if self.vector else w


def acc_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 storage, float32 for fp32/bf16/fp16."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _operand(a, name: str, device: torch.device, acc: torch.dtype, ndim) -> torch.Tensor:
    """Convert y/v/z: floating dtype only, same device as X (numpy is moved), cast to acc."""
    if isinstance(a, torch.Tensor):
        if a.layout != torch.strided:
            raise TypeError(f"{name} must be a dense tensor, got layout {a.layout}")
        if a.device != device:
            raise ValueError(f"{name} is on {a.device} but X is on {device}; move it first")
        t = a
    else:
        arr = np.asarray(a) if not np.isscalar(a) else np.asarray([a])
        if arr.dtype == object or arr.dtype.kind in "USV":
            raise TypeError(f"{name} must hold floating-point numbers, got numpy dtype {arr.dtype}")
        arr = torch_viewable(arr)
        if not arr.flags.writeable:
            arr = arr.copy()
        t = torch.from_numpy(np.ascontiguousarray(arr)).to(device)
    if not t.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype (float32/float64/bfloat16/float16), got {t.dtype}")
    if t.ndim not in ndim:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndim))} dimension(s), got shape {tuple(t.shape)}")
    return t.to(acc)  # a copy only when the dtype differs; the caller never writes into it


def _scalar(a, name: str) -> float:
    if isinstance(a, torch.Tensor):
        if a.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(a.shape)}")
        a = a.item()
    if np.iscomplexobj(a):  # float() of a numpy complex drops the imaginary part with only a warning
        raise TypeError(f"{name} must be a real scalar, got {type(a).__name__}")
    try:
        f = float(a)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real scalar, got {type(a).__name__}") from None
    if not np.isfinite(f):
        raise ValueError(f"{name} must be finite, got {f}")
    return f


def check_config(config, is_csr: bool) -> None:
    """Reject launch overrides a kernel would silently ignore (a misspelt key, a CSR key for dense X).

    ``config`` is None, a dict of :class:`~fusedml.mmchain.launch.DenseConfig` fields (dense X) or
    of :class:`~fusedml.mmchain.csr.CSRConfig` fields plus ``"memory"`` (CSR X; or a ``CSRConfig``),
    with ``"ops_transpose"`` for the ops backend either way.
    """
    if config is None or not isinstance(config, dict):
        return  # a CSRConfig object, or a type the dispatch rejects with its own message
    import dataclasses

    if is_csr:
        from .csr import CSRConfig as cls

        extra = {"memory", "ops_transpose"}
    else:
        from .launch import DenseConfig as cls

        extra = {"ops_transpose"}
    known = {f.name for f in dataclasses.fields(cls)} | extra
    unknown = sorted(set(config) - known, key=str)
    if unknown:
        raise ValueError(f"config: unknown key(s) {', '.join(map(repr, unknown))} for "
                         f"{'CSR' if is_csr else 'dense'} X; known: {', '.join(sorted(known))}")


def check_launch_fields(cfg, *, pow2=(), positive=(), warps=(), flags=(), tile=None, what="config") -> None:
    """Reject launch parameters (``config=`` overrides) no kernel can run with, naming the field.

    Parameters
    ----------
    cfg : object
        A :class:`~fusedml.mmchain.launch.DenseConfig`, a :class:`~fusedml.mmchain.csr.CSRConfig`
        or any object with the named attributes.
    pow2 : tuple of str
        Fields that size a tile axis (``tl.arange``): positive powers of two.
    positive : tuple of str
        Fields that must be integers >= 1.
    warps : tuple of str
        Warp counts: powers of two from 1 to 32.
    flags : tuple of str
        Fields that must be ``True`` or ``False``.
    tile : int, optional
        The largest tile the launch forms (elements); at most :data:`MAX_TILE_NUMEL`.
    what : str
        The argument's name in the messages.

    Raises
    ------
    ValueError
        ``"<what>: <field> must be ..."``.
    """
    def need(name, rule):
        raise ValueError(f"{what}: {name} must be {rule}, got {getattr(cfg, name)!r}")

    for name in pow2 + positive + warps:
        v = getattr(cfg, name)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
            need(name, "a positive integer")
        if name in pow2 and v & (v - 1):
            need(name, "a power of two")
        if name in warps and (v & (v - 1) or v > 32):
            need(name, "a power of two from 1 to 32")
    for name in flags:
        if not isinstance(getattr(cfg, name), (bool, np.bool_)):
            need(name, "True or False")
    if tile is not None and tile > MAX_TILE_NUMEL:
        raise ValueError(f"{what}: the launch's largest tile has {tile} elements, more than Triton's limit of "
                         f"{MAX_TILE_NUMEL}: use smaller blocks")


def check_bindable(who: str, P: Problem, operands) -> None:
    """A bound product reads its operands' storage at every call: each ``(tensor, name)`` of
    ``operands`` (None skipped) must already be a torch tensor of the accumulation dtype on X's
    device, as ``prepare_mmchain`` would otherwise convert (copy) it."""
    for a, name in operands:
        if a is not None and not (isinstance(a, torch.Tensor) and a.dtype == P.acc_dtype and a.device == P.device):
            got = f"{a.dtype} on {a.device}" if isinstance(a, torch.Tensor) else type(a).__name__
            raise ValueError(f"{who}: {name} must be a torch tensor of {P.acc_dtype} on {P.device} "
                             f"(a conversion would copy it), got {got}")


def prepare_mmchain(X, y, v, z, alpha, beta, *, intercept, v_op, check_finite, names=("y", "v")) -> Problem:
    """Validate and normalise the arguments of :func:`fusedml.mmchain`.

    ``names``: what the caller calls ``y`` and ``v`` in its error messages (``loss_gradient``: W
    and target).

    Returns
    -------
    Problem
        See the class docstring. Raises ``ValueError``/``TypeError`` naming the bad argument.
    """
    ny, nv = names
    from_numpy = isinstance(X, np.ndarray)
    Xm = as_matrix(X, "X")
    N, D = (int(s) for s in Xm.shape)
    dev = Xm.device
    acc = acc_dtype_for(Xm.dtype)
    intercept = bool(intercept)
    Dx = D + int(intercept)
    if v_op not in V_OPS:
        raise ValueError(f"v_op must be one of {V_OPS}, got {v_op!r}")
    alpha = _scalar(alpha, "alpha")
    beta = _scalar(beta, "beta")
    rows_what = f"D + 1 = {Dx} (intercept=True)" if intercept else f"D = {D}"

    if y is not None:
        yt = _operand(y, ny, dev, acc, (1, 2))
        if yt.shape[0] != Dx:
            raise ValueError(f"{ny} must have {rows_what} rows to match X of shape {(N, D)}, got shape {tuple(yt.shape)}")
        vector = yt.ndim == 1
        yt = yt.reshape(Dx, -1)
        m = yt.shape[1]
        if m == 0:
            raise ValueError(f"{ny} has 0 columns")
    else:
        yt = None
        if v is None:
            raise ValueError(f"{nv} is required when {ny} is None (w = alpha * X^T v + beta * z)")
        vector = None
        m = None
    if m is not None and m > MAX_M:
        raise ValueError(f"{ny} has m = {m} columns; at most {MAX_M} are supported")

    if v is not None:
        vt = _operand(v, nv, dev, acc, (1, 2))
        if vt.shape[0] != N:
            raise ValueError(f"{nv} must have N = {N} rows to match X of shape {(N, D)}, got shape {tuple(vt.shape)}")
        if yt is None:
            vector = vt.ndim == 1
            vt = vt.reshape(N, -1)
            m = vt.shape[1]
            if m == 0:
                raise ValueError(f"{nv} has 0 columns")
            if m > MAX_M:
                raise ValueError(f"{nv} has m = {m} columns; at most {MAX_M} are supported")
        elif vt.ndim == 1:
            vt = vt.reshape(N, 1)
        else:
            if vector:
                raise ValueError(f"{nv} must be 1-D [N] = [{N}] when {ny} is 1-D, got shape {tuple(vt.shape)}")
            if vt.shape[1] != m:
                raise ValueError(f"{nv} must have shape [N] or [N, m] = [{N}, {m}], got {tuple(vt.shape)}")
    else:
        vt = None

    if v_op == "softmax":
        if yt is None or vector:
            raise ValueError("v_op='softmax' needs a matrix y of shape [D, m] (the multinomial Hessian product)")
        if vt is None:
            raise ValueError("v_op='softmax' needs v (the class probabilities, [N, m])")

    if z is not None:
        zt = _operand(z, "z", dev, acc, (1, 2))
        want = (Dx,) if vector else (Dx, m)
        if tuple(zt.shape) != want and not (not vector and m == 1 and tuple(zt.shape) == (Dx,)):
            raise ValueError(f"z must have shape {list(want)} (the shape of the result), got {tuple(zt.shape)}")
        zt = zt.reshape(Dx, m)
    else:
        zt = None

    if check_finite:
        if isinstance(Xm, CSRMatrix):
            _check_finite(Xm.val, "X")
        else:
            _check_finite(Xm, "X")
        for t, name in ((yt, ny), (vt, nv), (zt, "z")):
            if t is not None:
                _check_finite(t, name)
    return Problem(Xm, N, D, Dx, m, yt, vt, zt, alpha, beta, intercept, v_op, bool(vector), acc, from_numpy)


def prepare_matvec(X, y, *, intercept) -> Problem:
    """Validate the arguments of :func:`fusedml.matvec` (``X @ y``, y ``[D(+1)]`` or ``[D(+1), m]``)."""
    if y is None:
        raise ValueError("y is required for matvec")
    return prepare_mmchain(X, y, None, None, 1.0, 0.0, intercept=intercept, v_op="mul", check_finite=False)
