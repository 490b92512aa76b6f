"""Repeated Triton launches without Triton's per-call argument binding.

``kernel[grid](*args, **consts)`` spends ~40-60 us of host time on the H200 host binding and
specialising ~30 arguments and hashing its cache key before the ~10 us driver launch
(``benchmarks/results/host_overhead-H200-2026-12-03-s14-*.json``). The solvers make the same
launches hundreds of times per fit, and at a million rows that host time is most of a fit.
:func:`launch` keys each launch on what Triton specialises a compiled kernel on -- every tensor's
dtype and 16-byte alignment, every integer's width class, ``== 1`` and divisibility by 16, every
other scalar's type, the constexprs' values, the grid and launch options -- (finer than Triton's
own key, never coarser) and, on a hit, calls the compiled kernel that Triton's own first launch
returned through its launcher, with the current arguments. Under the interpreter, and on a
Triton whose compiled kernels lack the launcher API, it is a plain launch. Kernels are keyed by
``id``: module-level kernels only.
"""
from __future__ import annotations

import os

import torch
import triton

from ._dispatch import interpret_mode

__all__ = ["LOCAL_BYTES_OK", "bind", "bound_enabled", "call", "compiled_local_bytes", "first_fitting_tile", "launch",
           "stand_in"]

_CACHE: dict = {}
_MAX = 4096
_state = {"ok": None}  # None: not probed yet; False: plain launches only


def _key(a):
    """What Triton specialises a compiled kernel on for argument ``a`` (or finer)."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if a.__class__ is int:
        return int, a == 1, a % 16 == 0, -(1 << 31) <= a < (1 << 31), 0 <= a < (1 << 32)
    if a.__class__ is float:
        return float
    return a.__class__, a  # bool, None, anything else: by value


#: ``(major, minor)`` of the installed Triton: tiles and layouts that differ between its versions
TRITON_VERSION = tuple(int(v) for v in triton.__version__.split(".")[:2])

#: Compile option of every fusedml launch: FMA contraction on, which the kernels' instruction counts,
#: tiles and rounding bounds were measured with. Triton enables it by default through 3.9, which warns
#: on each process's first compile that 3.10 turns the default off; an explicit option keeps it on
#: for fusedml's kernels alone and silences the warning.
FP_FUSION = {"enable_fp_fusion": True}


_STAND_INS: dict = {}


def stand_in(dtype, device) -> torch.Tensor:
    """A kept 1-element tensor of ``dtype`` on ``device``: a pointer argument a launch does not use,
    or a compile's stand-in for a buffer (its dtype and 16-byte alignment are what specialise)."""
    t = _STAND_INS.get((dtype, device))
    if t is None:
        t = _STAND_INS[(dtype, device)] = torch.empty(1, dtype=dtype, device=device)
    return t


def _compiled_resources(kernel, args, kwargs):
    """``(registers, shared bytes, spilled words)`` of the compiled launch, or None (API difference)."""
    try:
        ck = kernel.warmup(*args, grid=(1,), **kwargs, **FP_FUSION)
        if hasattr(ck, "_init_handles"):
            ck._init_handles()  # loads the binary: n_regs is only known from then on
        return int(ck.n_regs), int(ck.metadata.shared), int(getattr(ck, "n_spills", 0) or 0)
    except Exception:  # noqa: BLE001 -- an API difference keeps the model's grid
        return None


def compiled_local_bytes(kernel, args, kwargs) -> int | None:
    """Local memory per thread (bytes) of the compiled launch (``n_spills``, in 4-byte words), or
    None where unknown (:func:`_compiled_resources`); what :func:`first_fitting_tile` compares."""
    res = _compiled_resources(kernel, args, kwargs)
    return None if res is None else 4 * res[2]


#: Local memory per thread (bytes) a compiled launch may use before :func:`first_fitting_tile` takes
#: the next candidate tile: the H200's timed k-means 32 x 4 tile at 32 x 256 holds 152-208 B and the
#: GMM full sweep's 128 x 2 at BD = 16, 16 < K <= 32 32 B (Triton 3.6), both the fastest of their
#: sweeps; the spills the fallbacks replace are 0.3-8 KB
LOCAL_BYTES_OK = 256


def first_fitting_tile(tiles, local_bytes):
    """The first of ``tiles`` whose compile uses at most :data:`LOCAL_BYTES_OK` of local memory per
    thread (``local_bytes(*tile)``; None, unknown, accepts the tile), else the one that uses least.

    Parameters
    ----------
    tiles : sequence of tuple
        Candidate tiles in order of preference (k-means: ``(BLOCK_N, num_warps)``; the GMM full
        sweep: ``(BN, num_warps, num_stages, programs per SM)``; the dense matvec: ``(BLOCK_D,)``).
    local_bytes : callable
        ``local_bytes(*tile) -> int or None``.

    Returns
    -------
    tuple
        The chosen tile.
    """
    least = None
    for t in tiles:
        b = local_bytes(*t)
        if b is None or b <= LOCAL_BYTES_OK:
            return t
        if least is None or b < least[0]:
            least = (b, t)
    return least[1]


def _plain(kernel, grid, args, consts, options):
    return kernel[grid](*args, **consts, **FP_FUSION, **options)


def launch(kernel, grid, args, consts, **options):
    """``kernel[grid](*args, **consts, **options)``, through the compiled kernel's launcher when
    a launch that Triton would compile the same way (same key, see the module) ran before.

    Parameters
    ----------
    kernel : triton.JITFunction
    grid : tuple of int
    args : tuple
        The positional (non-constexpr) arguments, in the kernel's order.
    consts : dict
        The constexpr arguments by name (the kernel's remaining parameters).
    **options
        Launch options (``num_warps``, ``num_stages``).
    """
    return _launch(kernel, grid, args, consts, options)[0]


def call(kernel, grid, *args, num_warps=None, num_stages=None, **consts):
    """``kernel[grid](*args, **consts, num_warps=..., num_stages=...)`` through :func:`launch`: the
    launch written as Triton's own call, for launches that pass every constexpr by name.

    Parameters
    ----------
    kernel : triton.JITFunction
    grid : tuple of int
    *args
        The positional (non-constexpr) arguments, in the kernel's order.
    num_warps, num_stages : int, optional
        Launch options; ``None`` leaves Triton's default.
    **consts
        The constexpr arguments by name.
    """
    options = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    return launch(kernel, grid, args, consts, **options)


def _launch(kernel, grid, args, consts, options):
    """:func:`launch`, returning ``(compiled kernel, cache entry or None)``; the entry
    ``(ck, 3-D grid, constexpr values)`` lets :func:`bind` repeat the launch."""
    if _state["ok"] is False:
        return _plain(kernel, grid, args, consts, options), None
    try:
        key = (id(kernel), grid, tuple(map(_key, args)), tuple(consts.items()), tuple(options.items()))
        hit = _CACHE.get(key)
    except TypeError:  # an unhashable argument: Triton's path
        return _plain(kernel, grid, args, consts, options), None
    if hit is None:  # (the interpreter never stores one: the check costs a host us per launch otherwise)
        if interpret_mode():
            return _plain(kernel, grid, args, consts, options), None
        ck = _plain(kernel, grid, args, consts, options)
        if _state["ok"] is None:
            _state["ok"] = all(hasattr(ck, a) for a in ("run", "function", "packed_metadata", "launch_metadata"))
        if _state["ok"]:
            names = [p.name for p in kernel.params]
            rest = names[len(args):]
            if all(n in consts for n in rest):  # no parameter left to a default
                if len(_CACHE) >= _MAX:
                    _CACHE.clear()
                g = tuple(grid) + (1,) * (3 - len(grid))
                hit = _CACHE[key] = (ck, g, tuple(consts[n] for n in rest))
        return ck, hit
    ck, g, tail = hit
    _run(ck, grid, g, tuple(args) + tail)
    return ck, hit


#: Skip the launch hooks' metadata where no hook is registered (``FUSEDML_LAUNCH_HOOKS=always``:
#: build and pass them on every launch, as Triton's own launch does; A/B benchmarks)
SKIP_EMPTY_HOOKS = os.environ.get("FUSEDML_LAUNCH_HOOKS", "") != "always"


def _no_hook(h) -> bool:
    """Whether launch hook ``h`` calls nothing: None, or a Triton ``HookChain`` with no hook in it."""
    return h is None or (type(h).__name__ == "HookChain" and not h.calls)


def _run(ck, grid, g, vals):
    """The compiled kernel ``ck`` through its launcher (what Triton's ``run`` ends with).

    Triton 3.6-3.9 keep its launch hooks as ``HookChain`` objects, never None, so its own launch
    builds the hooks' metadata (a ``LazyDict``) and the launcher calls two empty chains on every
    launch, ~4-6 us of host time. With no hook registered (checked at each launch: a profiler may
    add one at any time) both go to the launcher as None, which it skips."""
    from triton import knobs

    stream = _stream()
    rt = knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    if SKIP_EMPTY_HOOKS and _no_hook(enter) and _no_hook(leave):
        ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, None, None, None, *vals)
    else:
        ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, ck.launch_metadata(grid, stream, *vals),
               enter, leave, *vals)


def bound_enabled() -> bool:
    """Whether the solvers take the bound forms of this module's launches (their trial points,
    CG updates and accept-test sums; ``FUSEDML_BIND=0`` turns them off, for A/B benchmarks)."""
    return os.environ.get("FUSEDML_BIND", "1") != "0"


def bind(kernel, grid, args, consts, **options):
    """A launch with fixed arguments, to repeat: ``bind(...)()`` is ``launch(kernel, grid, args,
    consts, **options)`` with the key looked up once.

    For a solver's repeated launch over the same buffers (whose contents change, not their
    storage): after the first call each call is the compiled kernel's launcher with the stored
    arguments (no per-argument key, no dictionary lookup). Under the interpreter, or where
    :func:`launch` would take Triton's path, every call is :func:`launch`.

    Parameters
    ----------
    kernel, grid, args, consts, **options
        As for :func:`launch`. The tensors are held (kept alive) by the returned callable.

    Returns
    -------
    callable
        ``() -> None``: one launch per call.
    """
    fast = []

    def run():
        if fast:
            _run(*fast[0])
            return
        hit = _launch(kernel, grid, args, consts, options)[1]
        if hit is not None:  # else launch's plain path every call
            fast.append((hit[0], grid, hit[1], tuple(args) + hit[2]))
    return run


def _stream():
    """The current device's current stream, as Triton's own launch finds it."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream(driver.active.get_current_device())
