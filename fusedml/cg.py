"""The vector half of a conjugate-gradient step in one launch.

Between two products with X, a CG step does ``alpha = r^T r / d^T A d``, ``s += alpha d``,
``r -= alpha A d``, ``||r||^2`` and ``beta``: on small vectors ([D + 1, K]) these are ~15 torch
launches of a few microseconds of GPU time each, and on a solver host ~10 us of launch cost each,
which at a million rows is as much as the product with X itself. :func:`cg_update` does them in
one Triton program per problem (two sweeps over the problem's entries: ``d^T A d``, then the
updates and ``||r||^2``), float64 sums. The solvers (``algorithms._solvers._CGEngine``) use it on
both GPU backends alike, so the comparison of backends stays one of the products with X.
:func:`trial_sums` does the same for a trust-region step's accept test (``g^T S``, ``S^T R``,
``S^T S``, ``||g_t||^2``, ``max |g_t|``: ~12 launches in torch).
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ._dispatch import interpret_mode
from ._launch import bind as bind_launch, launch
from .mmchain.dense import _f64, _split

__all__ = ["CONTROL", "bind_cg_restart", "bind_cg_update", "bind_trial_point", "bind_trial_sums", "cg_control",
           "control_slice", "cg_update", "cg_update_applies", "trial_sums", "trial_sums_applies"]

#: entries per problem above which one program per problem would stream the vectors too slowly
#: (~10 bytes moved per entry through one SM); without the split forms (``SPLIT_ENTRIES = None``) the
#: solvers then keep the torch form
MAX_ENTRIES = 1 << 17
#: entries per problem above which :func:`cg_update` runs over many programs in three launches (and
#: :func:`trial_sums` in two)
#: (one program took 0.11 ms a step at 100k entries: CSR CG steps, H100, ``profile_fit_csr-*-s46``;
#: split, whole CSR fits 1M x 100k: Ridge 0.49 -> 0.38 ms a CG step, ``env_ab_cg_split-H100-*-s47``);
#: None: never
SPLIT_ENTRIES = 1 << 14
#: entries of one problem per row tile in that form
SPLIT_TILE = 1024
#: programs per problem at most in that form (each sums every program's float64 partials); longer
#: problems give each program several row tiles
SPLIT_PROGRAMS = 1024


@triton.jit
def _finite_or_zero(x):
    return tl.where((x == x) & (tl.abs(x) < float("inf")), x, 0.0)


@triton.jit
def _cg_alpha(dad, sd, ss, dd, rtr, run, j, P, CTL, MASK, HAS_MASK: tl.constexpr, TR: tl.constexpr):
    """A step's ``(alpha, over, sts)`` from its float64 sums (Steihaug's boundary with ``TR``)."""
    alpha = _finite_or_zero(rtr / dad)
    over = tl.zeros_like(dad)
    sts = tl.zeros_like(dad)
    if TR:  # Steihaug: a step leaving ||s|| <= delta (or d^T A d <= 0) stops at the boundary
        dsq = tl.load(CTL + P + j)
        out = (dad <= 0.0) | (dad != dad) | (ss + (2.0 * sd + alpha * dd) * alpha > dsq)
        rad = tl.sqrt(tl.maximum(sd * sd + dd * (dsq - ss), 0.0))
        ab = _finite_or_zero(tl.where(sd >= 0.0, (dsq - ss) / (sd + rad), (rad - sd) / dd))
        alpha = tl.where(out, ab, alpha)
        over = tl.where(out, 1.0, 0.0)
        sts = ss + (2.0 * sd + alpha * dd) * alpha
    alpha = alpha * run
    if HAS_MASK:
        alpha = alpha * tl.load(MASK + j).to(tl.float64)
    return alpha, over, sts


@triton.jit
def _cg_beta(rnew, rtr, run, over, j, P, CTL, MASK, HAS_MASK: tl.constexpr, DECIDE: tl.constexpr):
    """The next direction's ``beta`` (0 for a stopped or frozen problem) and the run flag after the step."""
    b = _finite_or_zero(rnew / rtr)
    cont = tl.zeros_like(b) + 1.0
    if DECIDE:
        cont = tl.where(rnew > tl.load(CTL + 2 * P + j), run * (1.0 - over), 0.0)
        b = b * cont
    elif HAS_MASK:
        b = b * tl.load(MASK + j).to(tl.float64)
    return b, cont


@triton.jit
def _cg_store(j, P, b, cont, rnew, rtr, run, over, dad, alpha, sts, RTR, BETA, PACKED, CTL, DECIDE: tl.constexpr):
    """The step's scalar results: ``beta``, and the control block (``DECIDE``) or ``rTr`` and ``packed``."""
    out_ty = BETA.dtype.element_ty
    tl.store(BETA + j, b.to(out_ty))
    if DECIDE:  # the host's decisions, made here: the host reads this block a step or two later
        go = run * (1.0 - over)  # a normal step (not stopped, not at the boundary)
        tl.store(CTL + j, tl.where(go > 0, rnew, rtr))
        tl.store(CTL + 3 * P + j, cont)
        tl.store(CTL + 4 * P + j, tl.maximum(tl.load(CTL + 4 * P + j), over * run))
        tl.store(CTL + 5 * P + j, tl.load(CTL + 5 * P + j) + run)
        tl.store(CTL + 6 * P + j, dad)
        tl.store(CTL + 7 * P + j, rnew)
        tl.store(CTL + 8 * P + j, alpha)
        tl.store(CTL + 9 * P + j, sts)
    else:
        tl.store(RTR + j, rnew.to(out_ty))
        tl.store(PACKED + j, dad.to(out_ty))
        tl.store(PACKED + P + j, rnew.to(out_ty))


@triton.jit
def _cg_rtr_run(j, P, RTR, CTL, DECIDE: tl.constexpr):
    """``(r^T r, run flag)`` before the step, float64."""
    if DECIDE:
        rtr = tl.load(CTL + j)
        run = tl.load(CTL + 3 * P + j)
    else:
        rtr = tl.load(RTR + j).to(tl.float64)
        run = tl.zeros_like(rtr) + 1.0
    return rtr, run


@triton.jit
def _cg_tile_sums(S, Dv, Ad, rows, cols, m, K, stride_an, stride_ak, acc, a_sd, a_ss, a_dd, TR: tl.constexpr):
    """Sweep 1 on one tile: ``d^T A d`` (and ``S^T D``, ``S^T S``, ``D^T D`` with ``TR``) accumulated."""
    d = tl.load(Dv + rows[:, None] * K + cols[None, :], mask=m, other=0.0).to(tl.float64)
    a = tl.load(Ad + rows[:, None] * stride_an + cols[None, :] * stride_ak, mask=m, other=0.0)
    acc += d * a.to(tl.float64)
    if TR:
        s = tl.load(S + rows[:, None] * K + cols[None, :], mask=m, other=0.0).to(tl.float64)
        a_sd += s * d
        a_ss += s * s
        a_dd += d * d
    return acc, a_sd, a_ss, a_dd


@triton.jit
def _cg_tile_update(S, R, Dv, Ad, S0, R0, rows, cols, m, K, stride_an, stride_ak, alpha, acc, KEEP: tl.constexpr):
    """Sweep 2 on one tile: ``s += alpha d``, ``r -= alpha A d`` (the start kept with ``KEEP``);
    ``||r||^2`` accumulated."""
    at = rows[:, None] * K + cols[None, :]
    s = tl.load(S + at, mask=m, other=0.0)
    r = tl.load(R + at, mask=m, other=0.0)
    d = tl.load(Dv + at, mask=m, other=0.0)
    a = tl.load(Ad + rows[:, None] * stride_an + cols[None, :] * stride_ak, mask=m, other=0.0)
    if KEEP:  # the step's start, for a redo at the trust-region boundary
        tl.store(S0 + at, s, mask=m)
        tl.store(R0 + at, r, mask=m)
    r = (r.to(tl.float64) - alpha * a.to(tl.float64)).to(s.dtype)
    tl.store(S + at, (s.to(tl.float64) + alpha * d.to(tl.float64)).to(s.dtype), mask=m)
    tl.store(R + at, r, mask=m)
    rf = r.to(tl.float64)
    return acc + rf * rf


@triton.jit
def _cg_tile_direction(R, Dv, W, rows, cols, m, K, stride_wn, stride_wk, b, pf_hi, pf_lo, pf_rows,
                       PREFILL: tl.constexpr):
    """Sweep 3 on one tile: ``d = r + beta d`` (and the next product's start ``W``)."""
    at = rows[:, None] * K + cols[None, :]
    r = tl.load(R + at, mask=m, other=0.0)
    d = tl.load(Dv + at, mask=m, other=0.0)
    dn = r.to(tl.float64) + b * d.to(tl.float64)
    tl.store(Dv + at, dn.to(r.dtype), mask=m)
    if PREFILL:  # W may be Ad itself: its entries were read by the earlier sweeps
        keep = (rows < pf_rows)[:, None]
        tl.store(W + rows[:, None] * stride_wn + cols[None, :] * stride_wk,
                 tl.where(keep, _f64(pf_hi, pf_lo) * dn, 0.0).to(W.dtype.element_ty), mask=m)


@triton.jit
def _cg_update_kernel(
    S, R, Dv, Ad, S0, R0,  # [n, K] (Ad: any strides; the others contiguous)
    RTR, BETA, MASK, PACKED, CTL,  # [P], [P], [P], [2P], [NCTL * P] float64
    W,  # [n, K] (any strides): the next product's start, (pf_hi + pf_lo) * Dv, rows >= pf_rows zeroed
    n, cpp, P, K, stride_an, stride_ak, stride_wn, stride_wk, pf_hi, pf_lo, pf_rows,
    KEEP: tl.constexpr, HAS_MASK: tl.constexpr, DECIDE: tl.constexpr, TR: tl.constexpr,
    NEXT_DIR: tl.constexpr, PREFILL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    j = tl.program_id(0)  # problem j owns columns [j * cpp, (j + 1) * cpp)
    offs_r = tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    cols = j * cpp + offs_c
    cmask = offs_c < cpp
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    a_sd = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    a_ss = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    a_dd = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    for r0 in range(0, n, BLOCK_R):  # sweep 1: d^T A d (and S^T D, S^T S, D^T D for the region test)
        rows = (r0 + offs_r).to(tl.int64)
        m = (rows < n)[:, None] & cmask[None, :]
        acc, a_sd, a_ss, a_dd = _cg_tile_sums(S, Dv, Ad, rows, cols, m, K, stride_an, stride_ak, acc, a_sd, a_ss,
                                              a_dd, TR)
    dad = tl.sum(tl.sum(acc, axis=1), axis=0)
    rtr, run = _cg_rtr_run(j, P, RTR, CTL, DECIDE)
    alpha, over, sts = _cg_alpha(dad, tl.sum(tl.sum(a_sd, axis=1), axis=0), tl.sum(tl.sum(a_ss, axis=1), axis=0),
                                 tl.sum(tl.sum(a_dd, axis=1), axis=0), rtr, run, j, P, CTL, MASK, HAS_MASK, TR)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    for r0 in range(0, n, BLOCK_R):  # sweep 2: s += alpha d, r -= alpha A d, ||r||^2
        rows = (r0 + offs_r).to(tl.int64)
        m = (rows < n)[:, None] & cmask[None, :]
        acc = _cg_tile_update(S, R, Dv, Ad, S0, R0, rows, cols, m, K, stride_an, stride_ak, alpha, acc, KEEP)
    rnew = tl.sum(tl.sum(acc, axis=1), axis=0)
    b, cont = _cg_beta(rnew, rtr, run, over, j, P, CTL, MASK, HAS_MASK, DECIDE)
    _cg_store(j, P, b, cont, rnew, rtr, run, over, dad, alpha, sts, RTR, BETA, PACKED, CTL, DECIDE)
    if NEXT_DIR:  # sweep 3: the next step's direction d = r + beta d (a launch fewer per step)
        tl.debug_barrier()  # R as sweep 2 stored it
        for r0 in range(0, n, BLOCK_R):
            rows = (r0 + offs_r).to(tl.int64)
            m = (rows < n)[:, None] & cmask[None, :]
            _cg_tile_direction(R, Dv, W, rows, cols, m, K, stride_wn, stride_wk, b, pf_hi, pf_lo, pf_rows, PREFILL)


# The same step over many programs, for problems too long for one program (``SPLIT_ENTRIES``): three
# launches of one program per (tpp row tiles, problem), float64 partials per program written to ``PART`` and
# summed in a fixed order by every program of the next launch (deterministic, no atomics); the
# scalars that the last launch's first programs overwrite (``r^T r``, the run flag) pass through ``SNAP``.
@triton.jit
def _cg_split_sums_kernel(S, Dv, Ad, PART, n, cpp, K, nb, tpp, stride_an, stride_ak,
                          TR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    t, j = tl.program_id(0), tl.program_id(1)
    offs_c = tl.arange(0, BLOCK_C)
    z = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    acc, a_sd, a_ss, a_dd = z, z, z, z
    for k in range(0, tpp):  # this program's tpp row tiles
        rows = ((t * tpp + k) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        m = (rows < n)[:, None] & (offs_c < cpp)[None, :]
        acc, a_sd, a_ss, a_dd = _cg_tile_sums(S, Dv, Ad, rows, j * cpp + offs_c, m, K, stride_an, stride_ak, acc,
                                              a_sd, a_ss, a_dd, TR)
    at = PART + (j * nb + t) * 4
    tl.store(at, tl.sum(tl.sum(acc, axis=1), axis=0))
    tl.store(at + 1, tl.sum(tl.sum(a_sd, axis=1), axis=0))
    tl.store(at + 2, tl.sum(tl.sum(a_ss, axis=1), axis=0))
    tl.store(at + 3, tl.sum(tl.sum(a_dd, axis=1), axis=0))


@triton.jit
def _cg_split_alpha(PART, RTR, CTL, MASK, SNAP, j, P, nb, FROM_SNAP: tl.constexpr, HAS_MASK: tl.constexpr,
                    DECIDE: tl.constexpr, TR: tl.constexpr, NB: tl.constexpr):
    """Sweep 1's totals (fixed order) and the step's scalars, the same in every program."""
    i = tl.arange(0, NB)
    pm = i < nb
    base = PART + (j * nb + i) * 4
    dad = tl.sum(tl.load(base, mask=pm, other=0.0), axis=0)
    sd = tl.sum(tl.load(base + 1, mask=pm, other=0.0), axis=0)
    ss = tl.sum(tl.load(base + 2, mask=pm, other=0.0), axis=0)
    dd = tl.sum(tl.load(base + 3, mask=pm, other=0.0), axis=0)
    if FROM_SNAP:
        rtr, run = tl.load(SNAP + 2 * j), tl.load(SNAP + 2 * j + 1)
    else:
        rtr, run = _cg_rtr_run(j, P, RTR, CTL, DECIDE)
    alpha, over, sts = _cg_alpha(dad, sd, ss, dd, rtr, run, j, P, CTL, MASK, HAS_MASK, TR)
    return dad, rtr, run, alpha, over, sts


@triton.jit
def _cg_split_update_kernel(S, R, Dv, Ad, S0, R0, RTR, MASK, CTL, PART, PART2, SNAP,
                            n, cpp, P, K, nb, tpp, stride_an, stride_ak,
                            KEEP: tl.constexpr, HAS_MASK: tl.constexpr, DECIDE: tl.constexpr, TR: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NB: tl.constexpr):
    t, j = tl.program_id(0), tl.program_id(1)
    dad, rtr, run, alpha, over, sts = _cg_split_alpha(PART, RTR, CTL, MASK, SNAP, j, P, nb, False, HAS_MASK, DECIDE,
                                                      TR, NB)
    if t == 0:
        tl.store(SNAP + 2 * j, rtr)
        tl.store(SNAP + 2 * j + 1, run)
    offs_c = tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    for k in range(0, tpp):
        rows = ((t * tpp + k) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        m = (rows < n)[:, None] & (offs_c < cpp)[None, :]
        acc = _cg_tile_update(S, R, Dv, Ad, S0, R0, rows, j * cpp + offs_c, m, K, stride_an, stride_ak, alpha, acc,
                              KEEP)
    tl.store(PART2 + j * nb + t, tl.sum(tl.sum(acc, axis=1), axis=0))


@triton.jit
def _cg_split_finish_kernel(R, Dv, RTR, BETA, MASK, PACKED, CTL, PART, PART2, SNAP, W,
                            n, cpp, P, K, nb, tpp, stride_wn, stride_wk, pf_hi, pf_lo, pf_rows,
                            HAS_MASK: tl.constexpr, DECIDE: tl.constexpr, TR: tl.constexpr, NEXT_DIR: tl.constexpr,
                            PREFILL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NB: tl.constexpr):
    t, j = tl.program_id(0), tl.program_id(1)
    dad, rtr, run, alpha, over, sts = _cg_split_alpha(PART, RTR, CTL, MASK, SNAP, j, P, nb, True, HAS_MASK, DECIDE,
                                                      TR, NB)
    i = tl.arange(0, NB)
    rnew = tl.sum(tl.load(PART2 + j * nb + i, mask=i < nb, other=0.0), axis=0)
    b, cont = _cg_beta(rnew, rtr, run, over, j, P, CTL, MASK, HAS_MASK, DECIDE)
    if t == 0:
        _cg_store(j, P, b, cont, rnew, rtr, run, over, dad, alpha, sts, RTR, BETA, PACKED, CTL, DECIDE)
    if NEXT_DIR:
        offs_c = tl.arange(0, BLOCK_C)
        for k in range(0, tpp):
            rows = ((t * tpp + k) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
            m = (rows < n)[:, None] & (offs_c < cpp)[None, :]
            _cg_tile_direction(R, Dv, W, rows, j * cpp + offs_c, m, K, stride_wn, stride_wk, b, pf_hi, pf_lo,
                               pf_rows, PREFILL)


@triton.jit
def _cg_restart_kernel(S, R, Dv, G, BETA, W, n, K, P, sg_n, sg_k, sw_n, sw_k, pf_hi, pf_lo, pf_rows,
                       SIGN: tl.constexpr, PREFILL: tl.constexpr, BLOCK: tl.constexpr):
    # S = 0, R = Dv = SIGN * G ([n, K]; S, R, Dv contiguous, G any strides), BETA [P] = 0;
    # PREFILL: W = (pf_hi + pf_lo) * Dv with rows >= pf_rows zeroed (the first product's start)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n * K
    row = (i // K).to(tl.int64)
    g = tl.load(G + row * sg_n + (i % K) * sg_k, mask=m, other=0.0)
    r = g * SIGN
    tl.store(S + i, tl.zeros_like(r), mask=m)
    tl.store(R + i, r, mask=m)
    tl.store(Dv + i, r, mask=m)
    if PREFILL:
        wv = tl.where(row < pf_rows, _f64(pf_hi, pf_lo) * r.to(tl.float64), 0.0)
        tl.store(W + row * sw_n + (i % K) * sw_k, wv.to(W.dtype.element_ty), mask=m)
    if tl.program_id(0) == 0:
        jp = tl.arange(0, 16)
        for p0 in range(0, P, 16):
            tl.store(BETA + p0 + jp, tl.zeros([16], dtype=BETA.dtype.element_ty), mask=p0 + jp < P)


def _check_like(ref, ref_name, tensors):
    """Each ``(tensor, name)`` (None skipped) has ``ref``'s shape, dtype and device."""
    for t, name in tensors:
        if t is not None and (t.shape != ref.shape or t.dtype != ref.dtype or t.device != ref.device):
            raise ValueError(f"{name} must match {ref_name} ({tuple(ref.shape)}, {ref.dtype}, {ref.device}), got "
                             f"{tuple(t.shape)}, {t.dtype}, {t.device}")


def _check_contiguous(tensors):
    for t, name in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


def _check_prefill(prefill, S):
    """``(W, scale, rows)`` of the ``prefill`` option (W [n, K] like S, any strides), or None."""
    if prefill is None:
        return None
    W, scale, rows = prefill
    if W.shape != S.shape or W.device != S.device or W.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"prefill's W must be a float32/float64 [n, K] = {tuple(S.shape)} tensor on {S.device}, "
                         f"got {tuple(W.shape)}, {W.dtype}, {W.device}")
    return W, _split(float(scale)), int(rows)


def bind_cg_restart(S, R, Dv, g, beta, *, negate=False, prefill=None):
    """A CG solve's start from ``S = 0`` in one launch, over fixed vectors.

    Parameters
    ----------
    S, R, Dv : torch.Tensor
        [n, K] contiguous, float32 or float64: solution (set to 0), residual and direction (both
        set to ``g``, or ``-g`` with ``negate``: the first direction is the residual).
    g : torch.Tensor
        [n, K], same dtype and device, any strides: read at each call.
    beta : torch.Tensor
        [P] in the vectors' dtype: set to 0.
    negate : bool
    prefill : tuple (W, scale, rows), optional
        Also set ``W = scale * Dv`` with rows ``>= rows`` zeroed (W [n, K], any strides): the
        start a bound product accumulates onto (:meth:`fusedml.BoundMMChain.launch_only`).

    Returns
    -------
    callable
        ``() -> None``: one launch (:func:`fusedml._launch.bind`).
    """
    if S.ndim != 2:
        raise ValueError(f"S must be [n, K], got shape {tuple(S.shape)}")
    n, K = S.shape
    _check_like(S, "S", ((R, "R"), (Dv, "Dv"), (g, "g")))
    _check_contiguous(((S, "S"), (R, "R"), (Dv, "Dv"), (beta, "beta")))
    if beta.dtype != S.dtype or beta.device != S.device or beta.ndim != 1:
        raise ValueError(f"beta must be a 1-D {S.dtype} tensor on {S.device}")
    pf = _check_prefill(prefill, S)
    W, (hi, lo), rows = pf if pf is not None else (S, (0.0, 0.0), 0)
    block = 1024
    return bind_launch(_cg_restart_kernel, (triton.cdiv(n * K, block),),
                       (S, R, Dv, g, beta, W, n, K, beta.numel(), g.stride(0), g.stride(1), W.stride(0), W.stride(1),
                        hi, lo, rows),
                       dict(SIGN=-1.0 if negate else 1.0, PREFILL=pf is not None, BLOCK=block), num_warps=4)


@triton.jit
def _trial_point_kernel(W0, S, W, WM, G, numel, K, pf_hi, pf_lo, pf_rows,
                        HAS_WM: tl.constexpr, BLOCK: tl.constexpr):
    # W = W0 + S; WM = W with rows >= pf_rows zeroed; G = (pf_hi + pf_lo) * WM (all [n, K] contiguous)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < numel
    w = tl.load(W0 + i, mask=m, other=0.0) + tl.load(S + i, mask=m, other=0.0)
    tl.store(W + i, w, mask=m)
    wm = tl.where(i // K < pf_rows, w, 0.0)
    if HAS_WM:
        tl.store(WM + i, wm, mask=m)
    gv = _f64(pf_hi, pf_lo) * wm.to(tl.float64)
    tl.store(G + i, gv.to(G.dtype.element_ty), mask=m)


def bind_trial_point(W0, S, W, Wm, G, scale, rows):
    """A solver's trial point and its pass's start in one launch, over fixed buffers.

    Sets ``W = W0 + S``, ``Wm = W`` with rows ``>= rows`` zeroed (the penalised part: the
    intercept row is not), and ``G = scale * Wm``: the start a bound loss-gradient pass
    accumulates its gradient onto (:meth:`fusedml.BoundLossGradient.launch_only`), where
    ``torch.add``, ``torch.mul`` and the pass's own ``beta * z`` launch would be three.

    Parameters
    ----------
    W0, S : torch.Tensor
        [n, K] contiguous, float32 or float64, read at each call.
    W : torch.Tensor
        [n, K] contiguous, same dtype: written.
    Wm : torch.Tensor or None
        [n, K] contiguous, same dtype: written (None: the rows are all penalised or there is no
        penalty, and ``Wm`` would be ``W``).
    G : torch.Tensor
        [n, K] contiguous, float32 or float64: written.
    scale : float
        The pass's ``beta`` (the L2 strength).
    rows : int
        Rows below which ``W`` is penalised.

    Returns
    -------
    callable
        ``() -> None``: one launch (:func:`fusedml._launch.bind`).
    """
    if W.ndim != 2:
        raise ValueError(f"W must be [n, K], got shape {tuple(W.shape)}")
    _check_like(W, "W", ((W0, "W0"), (S, "S"), (Wm, "Wm")))
    _check_contiguous(((W0, "W0"), (S, "S"), (W, "W"), (Wm, "Wm"), (G, "G")))
    if G.shape != W.shape or G.device != W.device or G.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"G must be a float32/float64 {tuple(W.shape)} tensor on {W.device}")
    n, K = W.shape
    hi, lo = _split(float(scale))
    block = 1024
    return bind_launch(_trial_point_kernel, (triton.cdiv(n * K, block),),
                       (W0, S, W, W if Wm is None else Wm, G, n * K, K, hi, lo, int(rows)),
                       dict(HAS_WM=Wm is not None, BLOCK=block), num_warps=4)


def cg_update_applies(like: torch.Tensor, P: int) -> bool:
    """Whether :func:`cg_update` takes CG vectors shaped like ``like`` with ``P`` problems.

    Parameters
    ----------
    like : torch.Tensor
        A CG vector, [n, K].
    P : int
        Problems: 1 (one problem over all K columns) or K (one per column).

    Returns
    -------
    bool
        True for a contiguous float32/float64 [n, K] tensor on a CUDA device, ``P`` 1 or K and at
        most ``MAX_ENTRIES`` entries per problem (any number when ``SPLIT_ENTRIES`` is set). The
        environment variable ``FUSEDML_FUSED_CG`` overrides: ``0`` never, ``1`` also on the CPU
        under the Triton interpreter (tests).
    """
    return like.ndim == 2 and like.is_contiguous() and _applies(like, P)


def _applies(t: torch.Tensor, P: int) -> bool:
    """The shared part of the ``*_applies`` rules for a 2-D vector block ``t`` (any length a problem
    in the split forms, else at most ``MAX_ENTRIES``)."""
    flag = os.environ.get("FUSEDML_FUSED_CG", "")
    if flag == "0" or t.dtype not in (torch.float32, torch.float64):
        return False
    if not (t.is_cuda or (flag == "1" and t.device.type == "cpu" and interpret_mode())):
        return False
    n, K = t.shape
    return P in (1, K) and (SPLIT_ENTRIES is not None or n * (K // P) <= MAX_ENTRIES)


#: the control block of a device-decided CG step (:func:`cg_update` with ``control``): float64
#: [len(CONTROL) * P], field f of problem j at ``CONTROL.index(f) * P + j``
CONTROL = ("rTr", "dsq", "tol2", "run", "reach", "steps", "dAd", "rnew", "alpha", "sts")


def control_slice(name: str, P: int) -> slice:
    """Where field ``name`` of :data:`CONTROL` lies in a control block of ``P`` problems.

    Parameters
    ----------
    name : str
        One of :data:`CONTROL`.
    P : int
        Problems.

    Returns
    -------
    slice
        Its ``P`` values, problem j at ``start + j``.
    """
    i = CONTROL.index(name) * P
    return slice(i, i + P)


def cg_control(rTr, tol2, run, dsq=None) -> list:
    """The initial control block of device-decided CG steps, as a host list (see :data:`CONTROL`).

    Parameters
    ----------
    rTr : list of float
        ``r^T r`` per problem at the start (``S = 0``).
    tol2 : list of float
        A problem stops after the step whose new ``r^T r`` is ``<= tol2``.
    run : list of bool
        Problems that take steps (the others are frozen from the start).
    dsq : list of float, optional
        Squared trust-region radius per problem (``trust_region=True`` steps).

    Returns
    -------
    list of float
        ``len(CONTROL) * P`` values.
    """
    P = len(rTr)
    zero = [0.0] * P
    return ([float(x) for x in rTr] + ([float(x) for x in dsq] if dsq is not None else [math.inf] * P)
            + [float(x) for x in tol2] + [1.0 if r else 0.0 for r in run] + zero * 6)


def cg_update(S, R, Dv, Ad, rTr, beta, packed, *, mask=None, S0=None, R0=None, control=None,
              trust_region=False, next_direction=False, prefill=None) -> torch.Tensor:
    """The vector half of one CG step, in place, one launch (three beyond ``SPLIT_ENTRIES`` per problem, when set).

    With ``cpp = K / P`` columns per problem, for every problem j (its columns ``c``)::

        dAd_j   = sum_c Dv_c . Ad_c
        a_j     = rTr_j / dAd_j          (0 if not finite; times mask_j)
        S0, R0  = S, R                   (when given)
        S_c    += a_j Dv_c
        R_c    -= a_j Ad_c
        rnew_j  = sum_c R_c . R_c
        beta_j  = rnew_j / rTr_j         (0 if not finite; times mask_j)
        rTr_j   = rnew_j

    Sums in float64; ``packed`` receives ``[dAd, rnew]``.

    With ``control`` the step also makes the decisions a CG driver makes on the host, so that the
    host may queue further steps before reading any result: the ``rTr``, run flag, tolerance and
    (``trust_region``) squared radius come from ``control`` (:data:`CONTROL`, made by
    :func:`cg_control`); a problem that is not running takes no step; a step with ``d^T A d <= 0``
    or leaving ``||S|| <= delta`` instead goes to the boundary (Steihaug, LIBLINEAR's trcg, with
    ``S^T D``, ``S^T S``, ``D^T D`` summed exactly in the same sweep) and stops with ``reach``
    set; a problem whose new ``r^T r <= tol2`` stops; ``beta`` is 0 for stopped problems;
    ``steps`` counts each problem's steps; ``dAd``, ``rnew``, ``alpha`` and ``sts`` (``S^T S``
    after the step) are the step's values.

    Parameters
    ----------
    S, R, Dv : torch.Tensor
        [n, K] contiguous, float32 or float64: solution, residual, direction. S and R are updated.
    Ad : torch.Tensor
        [n, K], the product of the operator with ``Dv`` (any strides, same dtype).
    rTr, beta : torch.Tensor
        [P] in the vectors' dtype: ``r^T r`` before the step (replaced by the new one) and the
        next ``beta`` (written). With ``control``, ``rTr`` is not used (may be None).
    packed : torch.Tensor
        [2 P] output: ``d^T A d``, then the new ``r^T r`` (not used with ``control``; may be None).
    mask : torch.Tensor, optional
        [P]: 0 freezes a problem (alpha and beta 0). Not with ``control`` (its run flags).
    S0, R0 : torch.Tensor, optional
        [n, K] contiguous: receive S and R as they were before the update (both or neither).
    control : torch.Tensor, optional
        [len(CONTROL) * P] float64 on the vectors' device, updated in place.
    trust_region : bool
        With ``control``: the Steihaug boundary test against ``control``'s ``dsq``.
    next_direction : bool
        Also set ``Dv = R + beta Dv`` for the next step (a third sweep; the caller then skips
        the direction update before the next product).
    prefill : tuple (W, scale, rows), optional
        With ``next_direction``: also set ``W = scale * Dv`` (the new direction) with rows
        ``>= rows`` zeroed, W [n, K] of any strides and may be ``Ad`` itself: the start that
        the next product accumulates onto (a bound product's ``beta * z`` with ``z`` the
        direction and its unpenalised intercept row masked; two launches fewer per step).

    Returns
    -------
    torch.Tensor
        ``packed`` (``control`` with ``control``).
    """
    _launch_all(_cg_update_spec(S, R, Dv, Ad, rTr, beta, packed, mask, S0, R0, control, trust_region, next_direction,
                                prefill))
    return control if control is not None else packed


def bind_cg_update(S, R, Dv, Ad, rTr, beta, packed, *, mask=None, S0=None, R0=None, control=None,
                   trust_region=False, next_direction=False, prefill=None):
    """:func:`cg_update` over fixed buffers, checked once: a CG engine's repeated step.

    Parameters
    ----------
    S, R, Dv, Ad, rTr, beta, packed, mask, S0, R0, control, trust_region, next_direction, prefill
        As for :func:`cg_update`; each call of the result updates from their current contents
        (their storage must stay: ``Ad`` too, e.g. a bound product's result buffer).

    Returns
    -------
    callable
        ``() -> torch.Tensor``: one launch (:func:`fusedml._launch.bind`; three in the form beyond
        ``SPLIT_ENTRIES``), returning ``packed`` (``control`` with ``control``).
    """
    go = _bind_all(_cg_update_spec(S, R, Dv, Ad, rTr, beta, packed, mask, S0, R0, control, trust_region,
                                   next_direction, prefill))
    return _returning(go, control if control is not None else packed)


def _launch_all(specs):
    """Launch ``specs`` (``(kernel, grid, args, consts, options)``) in order."""
    for kernel, grid, args, consts, opts in specs:
        launch(kernel, grid, args, consts, **opts)


def _bind_all(specs):
    """``() -> None``: the bound launches of ``specs`` (``(kernel, grid, args, consts, options)``), in order."""
    gos = [bind_launch(kernel, grid, args, consts, **opts) for kernel, grid, args, consts, opts in specs]
    return gos[0] if len(gos) == 1 else (lambda: [go() for go in gos])


def _returning(go, res):
    """``() -> res`` after the bound launch ``go``."""
    def run():
        go()
        return res
    return run


def _split_grid(n, block_c):
    """``(BLOCK_R, programs, row tiles per program)`` of a split form over ``n`` rows of ``block_c``
    columns: tiles of ``SPLIT_TILE`` entries, at most ``SPLIT_PROGRAMS`` programs."""
    block_r = max(1, SPLIT_TILE // block_c)
    tiles = triton.cdiv(n, block_r)
    tpp = triton.cdiv(tiles, SPLIT_PROGRAMS)
    return block_r, triton.cdiv(tiles, tpp), tpp


def _cg_update_spec(S, R, Dv, Ad, rTr, beta, packed, mask, S0, R0, control, trust_region, next_direction=False,
                    prefill=None):
    """Checked arguments of :func:`cg_update`: ``(kernel, grid, args, consts, options)``."""
    if S.ndim != 2:
        raise ValueError(f"S must be [n, K], got shape {tuple(S.shape)}")
    n, K = S.shape
    P = control.numel() // len(CONTROL) if control is not None else rTr.numel()
    if P not in (1, K):
        raise ValueError(f"there must be 1 or K = {K} problems, got {P}")
    if (S0 is None) != (R0 is None):
        raise ValueError("S0 and R0 go together")
    if trust_region and control is None:
        raise ValueError("trust_region needs control (the radius lives there)")
    _check_like(S, "S", ((R, "R"), (Dv, "Dv"), (Ad, "Ad"), (S0, "S0"), (R0, "R0")))
    _check_contiguous(((S, "S"), (R, "R"), (Dv, "Dv"), (S0, "S0"), (R0, "R0")))
    small = ((beta, "beta", P),)
    if control is None:
        small += ((rTr, "rTr", P), (packed, "packed", 2 * P), (mask, "mask", P))
    elif (control.numel() != len(CONTROL) * P or control.dtype != torch.float64 or not control.is_contiguous()
          or control.device != S.device):
        raise ValueError(f"control must be {len(CONTROL)} x P contiguous float64 values on {S.device}")
    elif mask is not None:
        raise ValueError("mask and control exclude each other (control holds the run flags)")
    for t, name, size in small:
        if t is not None and (t.numel() != size or not t.is_contiguous() or t.dtype != S.dtype):
            raise ValueError(f"{name} must be {size} contiguous values of {S.dtype}")
    pf = _check_prefill(prefill, S)
    if pf is not None and not next_direction:
        raise ValueError("prefill needs next_direction (it is the next direction, scaled)")
    W, (hi, lo), rows = pf if pf is not None else (S, (0.0, 0.0), 0)
    cpp = K // P
    block_c = triton.next_power_of_2(cpp)
    keep = S0 is not None
    dummy = beta
    RTR, MASK = (rTr if rTr is not None else dummy), (mask if mask is not None else dummy)
    PACKED, CTL = (packed if packed is not None else dummy), (control if control is not None else dummy)
    S0_, R0_ = (S0 if keep else S), (R0 if keep else R)
    flags = dict(HAS_MASK=mask is not None, DECIDE=control is not None, TR=bool(trust_region))
    if SPLIT_ENTRIES is None or n * cpp <= SPLIT_ENTRIES:  # one program per problem
        return [(_cg_update_kernel, (P,),
                 (S, R, Dv, Ad, S0_, R0_, RTR, beta, MASK, PACKED, CTL, W, n, cpp, P, K, Ad.stride(0), Ad.stride(1),
                  W.stride(0), W.stride(1), hi, lo, rows),
                 dict(KEEP=keep, **flags, NEXT_DIR=bool(next_direction), PREFILL=pf is not None,
                      BLOCK_R=max(1, 2048 // block_c), BLOCK_C=block_c),
                 dict(num_warps=8))]
    block_r, nb, tpp = _split_grid(n, block_c)
    NB = triton.next_power_of_2(nb)
    part = torch.empty(P * nb * 5 + 2 * P, dtype=torch.float64, device=S.device)  # PART [P, nb, 4], PART2, SNAP
    PART, PART2, SNAP = part[:P * nb * 4], part[P * nb * 4:P * nb * 5], part[P * nb * 5:]
    tiles = dict(BLOCK_R=block_r, BLOCK_C=block_c)
    return [(_cg_split_sums_kernel, (nb, P), (S, Dv, Ad, PART, n, cpp, K, nb, tpp, Ad.stride(0), Ad.stride(1)),
             dict(TR=flags["TR"], **tiles), dict(num_warps=4)),
            (_cg_split_update_kernel, (nb, P),
             (S, R, Dv, Ad, S0_, R0_, RTR, MASK, CTL, PART, PART2, SNAP, n, cpp, P, K, nb, tpp, Ad.stride(0),
              Ad.stride(1)),
             dict(KEEP=keep, **flags, **tiles, NB=NB), dict(num_warps=4)),
            (_cg_split_finish_kernel, (nb if next_direction else 1, P),
             (R, Dv, RTR, beta, MASK, PACKED, CTL, PART, PART2, SNAP, W, n, cpp, P, K, nb, tpp, W.stride(0),
              W.stride(1), hi, lo, rows),
             dict(**flags, NEXT_DIR=bool(next_direction), PREFILL=pf is not None, **tiles, NB=NB), dict(num_warps=4))]


@triton.jit
def _trial_tile(G, S, R, GT, rows, cols, m, sg_n, sg_k, ss_n, ss_k, sr_n, sr_k, st_n, st_k, gs, sr, ss, tt, mx):
    """One row tile of the accept test's sums accumulated (float64); ``max |g_t|`` keeps NaN."""
    g = tl.load(G + rows[:, None] * sg_n + cols[None, :] * sg_k, mask=m, other=0.0).to(tl.float64)
    s = tl.load(S + rows[:, None] * ss_n + cols[None, :] * ss_k, mask=m, other=0.0).to(tl.float64)
    r = tl.load(R + rows[:, None] * sr_n + cols[None, :] * sr_k, mask=m, other=0.0).to(tl.float64)
    t = tl.load(GT + rows[:, None] * st_n + cols[None, :] * st_k, mask=m, other=0.0).to(tl.float64)
    # |t|, NaN kept (a NaN gradient must not look converged): max(x, NaN) -> NaN
    at = tl.abs(t)
    return gs + g * s, sr + s * r, ss + s * s, tt + t * t, tl.where((at > mx) | (at != at), at, mx)


@triton.jit
def _nan_max(mx):
    """``max`` of a tile of non-negative values, NaN if any is NaN."""
    mnan = tl.max(tl.max(tl.where(mx != mx, 1.0, 0.0), axis=1), axis=0)
    return tl.where(mnan > 0, float("nan"), tl.max(tl.max(mx, axis=1), axis=0))


@triton.jit
def _trial_sums_kernel(
    G, S, R, GT, F, OUT,  # [n, K] each (any strides), F [P] float64, OUT [5P] ([6P] with F first) float64
    n, cpp, P, nb, tpp, sg_n, sg_k, ss_n, ss_k, sr_n, sr_k, st_n, st_k,
    HAS_F: tl.constexpr, SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # grid (nb, P): one program per (tpp row tiles, problem). nb = 1 (tpp tiles cover every row): the
    # problem's sums to OUT; SPLIT: its 5 partials to OUT [P, nb, 5] for _trial_finish_kernel
    t, j = tl.program_id(0), tl.program_id(1)
    if HAS_F and not SPLIT:  # the trial objective beside the sums: one buffer for the host's one copy
        tl.store(OUT + j, tl.load(F + j))
        OUT += P
    offs_r = tl.arange(0, BLOCK_R)
    offs_c = tl.arange(0, BLOCK_C)
    cols = (j * cpp + offs_c).to(tl.int64)
    cmask = offs_c < cpp
    z = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    gs, sr, ss, tt, mx = z, z, z, z, z
    for k in range(0, tpp):
        rows = ((t * tpp + k) * BLOCK_R + offs_r).to(tl.int64)
        m = (rows < n)[:, None] & cmask[None, :]
        gs, sr, ss, tt, mx = _trial_tile(G, S, R, GT, rows, cols, m, sg_n, sg_k, ss_n, ss_k, sr_n, sr_k, st_n, st_k,
                                         gs, sr, ss, tt, mx)
    if SPLIT:
        at, step = OUT + (j * nb + t) * 5, 1
    else:
        at, step = OUT + j, P
    tl.store(at, tl.sum(tl.sum(gs, axis=1), axis=0))
    tl.store(at + step, tl.sum(tl.sum(sr, axis=1), axis=0))
    tl.store(at + 2 * step, tl.sum(tl.sum(ss, axis=1), axis=0))
    tl.store(at + 3 * step, tl.sum(tl.sum(tt, axis=1), axis=0))
    tl.store(at + 4 * step, _nan_max(mx))


@triton.jit
def _trial_finish_kernel(PART, F, OUT, P, nb, HAS_F: tl.constexpr, NB: tl.constexpr):
    # problem j's totals from the split form's partials PART [P, nb, 5], summed in a fixed order
    j = tl.program_id(0)
    if HAS_F:
        tl.store(OUT + j, tl.load(F + j))
        OUT += P
    i = tl.arange(0, NB)
    pm = i < nb
    base = PART + (j * nb + i) * 5
    for q in tl.static_range(4):
        tl.store(OUT + q * P + j, tl.sum(tl.load(base + q, mask=pm, other=0.0), axis=0))
    mx = tl.load(base + 4, mask=pm, other=0.0)
    tl.store(OUT + 4 * P + j, _nan_max(mx[:, None]))


def trial_sums_applies(tensors, P: int) -> bool:
    """Whether :func:`trial_sums` takes these [n, K] vectors with ``P`` problems: as
    :func:`cg_update_applies` (CUDA, or forced under the interpreter; fp32/fp64; P = 1 or K;
    at most as many entries a problem), same shape, dtype and device for all, any strides."""
    first = tensors[0]
    if first.ndim != 2 or any(t.shape != first.shape or t.dtype != first.dtype or t.device != first.device
                              for t in tensors):
        return False
    return _applies(first, P)


def trial_sums(g, S, R, g_t, P: int, f=None) -> torch.Tensor:
    """The sums a trust-region Newton step's accept test needs, per problem, in one launch (two
    beyond ``SPLIT_ENTRIES`` entries a problem: partial sums over row tiles, then their totals in a
    fixed order).

    Parameters
    ----------
    g, S, R, g_t : torch.Tensor
        [n, K], same dtype and device, any strides: the gradient, the step, the CG residual and
        the gradient at the trial point.
    P : int
        Problems: 1 (one over all K columns) or K (one per column).
    f : torch.Tensor, optional
        [P] float64 (the trial objective): copied ahead of the sums, so that the host reads
        both in one copy.

    Returns
    -------
    torch.Tensor
        [5 P] float64: ``g^T S``, ``S^T R``, ``S^T S``, ``g_t^T g_t`` and ``max |g_t|`` (NaN if
        ``g_t`` holds a NaN), each per problem, sums in float64; [6 P] with ``f`` first when
        ``f`` is given.
    """
    out, specs = _trial_sums_spec(g, S, R, g_t, P, f)
    _launch_all(specs)
    return out


def _trial_sums_spec(g, S, R, g_t, P, f=None):
    """Checked arguments of :func:`trial_sums`: ``(out, [(kernel, grid, args, consts, options)])``."""
    if g.ndim != 2:
        raise ValueError(f"g must be [n, K], got shape {tuple(g.shape)}")
    n, K = g.shape
    _check_like(g, "g", ((S, "S"), (R, "R"), (g_t, "g_t")))
    if P not in (1, K):
        raise ValueError(f"P must be 1 or K = {K}, got {P}")
    if f is not None and (f.numel() != P or f.dtype != torch.float64 or not f.is_contiguous() or f.device != g.device):
        raise ValueError(f"f must be {P} contiguous float64 values on {g.device}, got {tuple(f.shape)}, {f.dtype}, "
                         f"{f.device}")
    cpp = K // P
    block_c = triton.next_power_of_2(cpp)
    out = torch.empty((5 if f is None else 6) * P, dtype=torch.float64, device=g.device)
    F = out if f is None else f
    strides = (g.stride(0), g.stride(1), S.stride(0), S.stride(1), R.stride(0), R.stride(1), g_t.stride(0),
               g_t.stride(1))
    if SPLIT_ENTRIES is None or n * cpp <= SPLIT_ENTRIES:  # one program per problem, over every row tile
        block_r = max(1, 1024 // block_c)
        return out, [(_trial_sums_kernel, (1, P), (g, S, R, g_t, F, out, n, cpp, P, 1, triton.cdiv(n, block_r),
                                                    *strides),
                      dict(HAS_F=f is not None, SPLIT=False, BLOCK_R=block_r, BLOCK_C=block_c), dict(num_warps=8))]
    block_r, nb, tpp = _split_grid(n, block_c)
    part = torch.empty(P * nb * 5, dtype=torch.float64, device=g.device)
    return out, [(_trial_sums_kernel, (nb, P), (g, S, R, g_t, F, part, n, cpp, P, nb, tpp, *strides),
                  dict(HAS_F=False, SPLIT=True, BLOCK_R=block_r, BLOCK_C=block_c), dict(num_warps=4)),
                 (_trial_finish_kernel, (P,), (part, F, out, P, nb),
                  dict(HAS_F=f is not None, NB=triton.next_power_of_2(nb)), dict(num_warps=4))]


def bind_trial_sums(g, S, R, g_t, P: int, f=None):
    """:func:`trial_sums` over fixed vectors, checked once (a solver's repeated accept test).

    Parameters
    ----------
    g, S, R, g_t, P, f
        As for :func:`trial_sums`; each call sums their current contents (and copies ``f``'s).

    Returns
    -------
    callable
        ``() -> torch.Tensor``: one launch (two beyond ``SPLIT_ENTRIES``), returning the same
        ``[5 P]`` (``[6 P]``) float64 buffer each call.
    """
    out, specs = _trial_sums_spec(g, S, R, g_t, P, f)
    return _returning(_bind_all(specs), out)
