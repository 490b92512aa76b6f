"""Triton kernels for the dense mmchain ``w = alpha * [X,1]^T p + beta * z``, ``p = v ⊙ ([X,1] y)``.

Strategies (chosen by :func:`fusedml.mmchain.launch.dense_config`; see README.md):

* ``_mmchain_onchip_kernel`` -- a persistent program loops over row tiles ``pid, pid + P, ...``;
  each ``[BLOCK_N, D]`` tile is loaded once, ``t = X_b y`` and ``X_b^T p`` are computed while it
  sits in registers, and ``X^T p`` accumulates in a register accumulator for the whole run
  (m = 1: ``[BLOCK_N, BLOCK_D]`` of ``x * p``, reduced over rows once at the end, so no tile pays
  a cross-warp reduction; m > 1: ``[M_PAD, BLOCK_D]``). At the end: one atomic add per element of the accumulator (P x D x m atomics), or,
  with ``DETERMINISTIC``, a plain store into row ``pid`` of a ``[P, Dx*m]`` partials buffer that
  ``_reduce_partials_kernel`` sums in a fixed order.
  With ``PREFETCH`` the next row tile (and its v) is loaded into registers before the current
  one is used: two tiles of loads in flight per program (short rows, 2-byte storage, and the
  solvers' passes with an intercept). With ``LOSS`` (:func:`fusedml.loss_gradient`) v holds the
  targets and ``p = alpha * c * loss'(t)``: the tile's Hessian weights (and t) are stored and
  ``c * loss(t)`` is summed in float64 registers into a per-program partial.
* ``_mmchain_small_kernel`` -- the same for 2 <= m <= 4 with the right-hand sides unrolled: one
  ``[BLOCK_N, BLOCK_D]`` accumulator per column of y, so every tensor keeps X's 2-D load layout
  (a 3-D ``[BN, m, BD]`` broadcast or a ``tl.dot`` padded to m = 16 cost 4-10x the instructions).
* ``_mmchain_coop_kernel`` -- wide rows, m = 1: G co-resident programs share each row, one column
  block each (its y slice and ``X^T p`` accumulator stay in registers for the whole run); the
  row's t is combined through global memory (each partial stored as a tagged 64-bit word, polled
  until all G tags are set) and each program multiplies the part of the row it still holds: X read once.
  Two launches (X read twice) where the group cannot be co-resident or under the interpreter.
* ``_mmchain_chunked_kernel`` -- wide D with m > 1: pass 1 over the tile's D chunks computes t; pass 2 walks
  the chunks backwards (the most recently read first: they are still in L2) and adds the chunk's
  ``X_b^T p`` with atomics (or into the program's partials row: deterministic).

* ``_matvec_kernel`` -- ``t = [X,1] y``: persistent programs over row tiles.

Row offsets are int64; column offsets are cast to int64 before multiplying by the column stride
(column-major X has stride N). ``VEC`` tells the compiler that row starts and D are multiples of a
16-byte vector when they are (Triton assumes it only for arguments divisible by 16). Accumulation is fp32 (fp64 for fp64 X); alpha is passed as an
fp32 hi/lo pair so that fp64 runs keep full precision.
"""
from __future__ import annotations

import functools
import os
from dataclasses import replace

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.errors import OutOfResources

from .._dispatch import interpret_mode
from .._launch import (FP_FUSION, TRITON_VERSION, _key, bind as bind_launch, call, compiled_local_bytes,
                       first_fitting_tile, launch, stand_in)
from ._checks import Problem, check_launch_fields
from .launch import (SMALL_D, SMALL_M_XTV, DenseConfig, dense_config, gpu_info, matvec_config, product_config,
                     small_config, unrolled_wide_m)

#: the GPU's approximate log2 / reciprocal in the logistic epilogue (libdevice: not available to
#: the interpreter, which takes the accurate forms)
_FAST_MATH = tl.constexpr(not interpret_mode())
#: the column-chunked tile's chunk axis: dim 1 ([BN, NCH, CH]) for Triton 3.6, dim 0 ([NCH, BN, CH])
#: from 3.7 on. Triton orders the two non-contiguous dims of a 3-D load differently across versions
#: (3.6: blocked order [2, 0, 1]; 3.7-3.9: [2, 1, 0]); the chunk axis must come last in that order,
#: so that a thread holds its row's piece of every chunk (checked: sm_90 compiles with each version)
_CHUNK_OUTER = tl.constexpr(TRITON_VERSION >= (3, 7))
#: L1 / L2 eviction priority of the cooperative kernel's X loads (each element read once):
#: evict-first, so that the streamed rows replace their own lines and not the row handshake's
#: tagged words, y or w. H200, session 24 (`mmchain_ev_*-s24-d`, two interleaved rounds): 4k x 65536
#: 0.315 -> 0.306 ms; the same policy on the other kernels' loads changed nothing at m = 1 and cost
#: the unrolled m = 4 kernel 8 % (an L2 policy register and a wider load instruction per load), so
#: they keep the default. ``FUSEDML_X_EVICTION=""`` gives the default policy (A/B benchmarks).
_X_EVICTION = os.environ.get("FUSEDML_X_EVICTION", "evict_first")
if _X_EVICTION not in ("", "evict_first", "evict_last"):
    raise ValueError(f"FUSEDML_X_EVICTION must be '', 'evict_first' or 'evict_last', not {_X_EVICTION!r}")
_X_EVICT = tl.constexpr(_X_EVICTION)

#: the unrolled kernel runs the softmax form and the loss pass with m columns, not padded to m_pad
#: (False: the padded form, for A/B probes)
_EXACT_UNROLL = True

_MODES = {"vector": 0, "dot": 1, "elementwise": 2, "small": 3}
_TL = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC: tl.constexpr, EVEN_D: tl.constexpr,
            VEC: tl.constexpr):
    # rows [BN] int64, cols [BD] -> tile [BN, BD] in the accumulation dtype (zeros outside X)
    return _load_x_raw(X, rows, cols, N, D, stride_xn, stride_xd, EVEN_D, VEC).to(ACC)


@triton.jit
def _vec_rows(stride_xn, D, VEC: tl.constexpr):
    """``(row stride, load bound)`` for ``VEC`` (:func:`_vec`), written so the compiler can prove the
    multiples and emit 16-byte loads: > 1, the bound is D (a multiple of VEC); < -1, D rounded up to
    ``-VEC`` (an aligned view: the caller zeroes the padding after the load); else as given."""
    DL = D
    if VEC > 1:
        stride_xn = (stride_xn // VEC) * VEC
        DL = (D // VEC) * VEC
    if VEC < -1:
        stride_xn = (stride_xn // -VEC) * -VEC
        DL = ((D - VEC - 1) // -VEC) * -VEC
    return stride_xn, DL


@triton.jit
def _load_x_raw(X, rows, cols, N, D, stride_xn, stride_xd, EVEN_D: tl.constexpr, VEC: tl.constexpr):
    # the same tile in X's storage dtype (a prefetched bf16 tile holds half the registers). VEC > 1:
    # row starts and D multiples of VEC (checked on the host), proven to the compiler (_vec_rows:
    # it only assumes that for multiples of 16); < -1: an aligned view of padded rows, whole
    # vectors loaded up to DL, the padding zeroed after the load
    stride_xn, DL = _vec_rows(stride_xn, D, VEC)
    if VEC < -1:
        ptrs = X + rows[:, None] * stride_xn + cols[None, :].to(tl.int64)
        x = tl.load(ptrs, mask=(rows[:, None] < N) & (cols[None, :] < DL), other=0.0)
        return tl.where(cols[None, :] < D, x, tl.zeros_like(x))
    ptrs = X + rows[:, None] * stride_xn + cols[None, :].to(tl.int64) * stride_xd
    if EVEN_D:
        mask = rows[:, None] < N
    else:
        mask = (rows[:, None] < N) & (cols[None, :] < DL)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _load_x3(X, rows, cols, N, D, stride_xn, stride_xd, ACC: tl.constexpr, EVEN_D: tl.constexpr,
             VEC: tl.constexpr):
    # rows [BN] int64, cols [NCH, CH] -> tile [BN, NCH, CH] ([NCH, BN, CH] with _CHUNK_OUTER) in the
    # accumulation dtype (zeros outside X); VEC as _load_x_raw's
    stride_xn, DL = _vec_rows(stride_xn, D, VEC)
    if _CHUNK_OUTER:
        r3 = rows[None, :, None]
        c3 = cols[:, None, :]
    else:
        r3 = rows[:, None, None]
        c3 = cols[None, :, :]
    if VEC < -1:
        x = tl.load(X + r3 * stride_xn + c3.to(tl.int64), mask=(r3 < N) & (c3 < DL), other=0.0)
        return tl.where(c3 < D, x, tl.zeros_like(x)).to(ACC)
    ptrs = X + r3 * stride_xn + c3.to(tl.int64) * stride_xd
    if EVEN_D:
        mask = r3 < N
    else:
        mask = (r3 < N) & (c3 < DL)
    return tl.load(ptrs, mask=mask, other=0.0).to(ACC)


@triton.jit
def _small_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC: tl.constexpr, EVEN_D: tl.constexpr,
             VEC: tl.constexpr, NCH: tl.constexpr):
    # the unrolled kernel's tile: [BN, BD] (one chunk, cols [BD]) or [BN, NCH, CH] (cols [NCH, CH])
    if NCH == 1:
        x = _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
    else:
        x = _load_x3(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
    return x


@triton.jit
def _small_zeros(BLOCK_N: tl.constexpr, NCH: tl.constexpr, CHUNK: tl.constexpr, ACC: tl.constexpr):
    # an accumulator shaped as the tile
    if NCH == 1:
        z = tl.zeros([BLOCK_N, CHUNK], dtype=ACC)
    elif _CHUNK_OUTER:
        z = tl.zeros([NCH, BLOCK_N, CHUNK], dtype=ACC)
    else:
        z = tl.zeros([BLOCK_N, NCH, CHUNK], dtype=ACC)
    return z


@triton.jit
def _small_acc(acc, x, p, NCH: tl.constexpr):
    # acc += x * p (p [BN], one value per row)
    if NCH == 1:
        acc += x * p[:, None]
    elif _CHUNK_OUTER:
        acc += x * p[None, :, None]
    else:
        acc += x * p[:, None, None]
    return acc


@triton.jit
def _load_yt(Y, cols, jm, D, M, stride_yd, stride_ym, ACC: tl.constexpr):
    # y^T chunk [M_PAD, BD] (zeros in the padding)
    mask = (jm[:, None] < M) & (cols[None, :] < D)
    return tl.load(Y + cols[None, :] * stride_yd + jm[:, None] * stride_ym, mask=mask, other=0.0).to(ACC)


@triton.jit
def _xy(x, yt, MODE: tl.constexpr):
    # x [BN, BD], y^T [M_PAD, BD] -> t [BN, M_PAD]
    if MODE == 0:
        t = tl.sum(x * yt, axis=1, keep_dims=True)
    elif MODE == 1:
        t = tl.dot(x, tl.trans(yt), input_precision="ieee")
    elif MODE == 4:  # three tf32 tensor-core products (hi*hi + hi*lo + lo*hi): fp32-level error
        t = tl.dot(x, tl.trans(yt), input_precision="tf32x3")
    else:
        t = tl.sum(x[:, None, :] * yt[None, :, :], axis=2)
    return t


@triton.jit
def _xtp(acc, x, p, MODE: tl.constexpr):
    # acc [M_PAD, BD] += p^T x ; x [BN, BD], p [BN, M_PAD]
    if MODE == 0:
        acc += tl.sum(x * p, axis=0, keep_dims=True)
    elif MODE == 1:
        acc = tl.dot(tl.trans(p), x, acc, input_precision="ieee")
    elif MODE == 4:
        acc = tl.dot(tl.trans(p), x, acc, input_precision="tf32x3")
    else:
        acc += tl.sum(p[:, :, None] * x[:, None, :], axis=0)
    return acc


@triton.jit
def _load_v(V, rows, jm, N, M, stride_vn, stride_vm, HAS_V: tl.constexpr, ACC: tl.constexpr):
    # v [BN, M_PAD] (zeros outside; a [1, 1] dummy when not HAS_V)
    if HAS_V:
        mask = (rows[:, None] < N) & (jm[None, :] < M)
        vv = tl.load(V + rows[:, None] * stride_vn + jm[None, :] * stride_vm, mask=mask, other=0.0).to(ACC)
    else:
        vv = tl.zeros([1, 1], dtype=ACC)
    return vv


@triton.jit
def _make_p(t, vv, rows, jm, N, M, alpha, XTY: tl.constexpr, HAS_V: tl.constexpr, SOFTMAX: tl.constexpr):
    # p [BN, M_PAD] = alpha * (v * t | softmax op | v); zero on rows >= N and padded columns
    rmask = rows[:, None] < N
    cmask = jm[None, :] < M
    if HAS_V:
        if XTY:
            p = vv
        elif SOFTMAX:
            p = vv * (t - tl.sum(vv * t, axis=1, keep_dims=True))
        else:
            p = vv * t
    else:
        p = t
    return tl.where(rmask & cmask, p * alpha, 0.0)


@triton.jit
def _loss_terms(t, yv, jm, M, power, LOSS: tl.constexpr):
    # t, yv [BN, M_PAD] -> the eta-dependent part of the loss, its first and second derivative
    # (codes and the torch twin of this function: fusedml/mmchain/lossgrad.py)
    if LOSS == 1:  # logistic, y in [0, 1]: softplus(t) - y t
        # fp32 without IEEE division and, on the GPU, with the hardware log2 and reciprocal (a
        # division is a ~10-instruction sequence, logf a ~20-instruction polynomial, and this runs
        # once per row in every lane that holds the row: it bounded the pass's instruction rate;
        # sm_90 compile of the 1M x 100 launch: 499 instructions per tile loop before, 351 after,
        # the Poisson pass 279)
        e = tl.exp(-tl.abs(t))
        u = 1.0 + e
        if t.dtype == tl.float32:
            if _FAST_MATH:
                lu = libdevice.fast_log2f(u) * 0.6931471805599453  # |error| <= 1.2e-7 on [1, 2]
                s = libdevice.fast_dividef(1.0, u)  # 1 / (1 + e)
            else:
                lu = tl.log(u)
                s = 1.0 / u
            # log1p(e): its series where 1 + e rounds off more than 2^-16 of e (e < 2^-8)
            l1p = tl.where(e < 0.00390625, e * (1.0 - e * (0.5 - e * 0.3333333333333333)), lu)
        else:  # float64: log1p to full precision (Goldberg's trick)
            s = 1.0 / u
            l1p = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
        # max(t, 0) - y t without cancelling: a well-classified row keeps its loss l1p ~ e^-|t|
        val = tl.where(t > 0, (1.0 - yv) * t, -yv * t) + l1p
        pr = tl.where(t >= 0, s, e * s)  # sigmoid(t) without overflow
        g = pr - yv
        h = pr * (1.0 - pr)
    elif LOSS == 2:  # squared hinge, y in {-1, 1}: max(0, 1 - y t)^2
        z = 1.0 - yv * t
        act = z > 0
        val = tl.where(act, z * z, 0.0)
        g = tl.where(act, 2.0 * (t - yv), 0.0)
        h = tl.where(act, 2.0, 0.0)
    elif LOSS == 3:  # multinomial, y one-hot: logsumexp_j(t) - sum_j y_j t_j (lse in column 0)
        cm = jm[None, :] < M
        tm = tl.where(cm, t, float("-inf"))
        mx = tl.max(tm, axis=1, keep_dims=True)
        e = tl.exp(tm - mx)
        se = tl.sum(e, axis=1, keep_dims=True)
        pr = e / se
        val = tl.where(jm[None, :] == 0, mx + tl.log(se), 0.0) - yv * t
        g = pr - yv
        h = pr  # the softmax Hessian's P
    elif LOSS == 4:  # Poisson, log link: exp(t) - y t
        mu = tl.exp(t)
        val = mu - yv * t
        g = mu - yv
        h = mu
    elif LOSS == 5:  # gamma, log link: t + y exp(-t)
        e = tl.exp(-t)
        val = t + yv * e
        g = 1.0 - yv * e
        h = tl.full(t.shape, 1.0, t.dtype)
    elif LOSS == 6:  # Tweedie power p, log link: e^((2-p) t) / (2-p) - y e^((1-p) t) / (1-p)
        a = tl.exp((1.0 - power) * t)
        b = tl.exp((2.0 - power) * t)
        val = b / (2.0 - power) - yv * a / (1.0 - power)
        g = b - yv * a
        h = b
    else:  # 7: normal, identity link: (t - y)^2 / 2
        g = t - yv
        val = 0.5 * g * g
        h = tl.full(t.shape, 1.0, t.dtype)
    return val, g, h


@triton.jit
def _loss_p(t, yv, rows, jm, N, M, alpha, power, C, ETA, HW, LOSS: tl.constexpr, HAS_C: tl.constexpr,
            STORE_ETA: tl.constexpr, ACC: tl.constexpr):
    # stores the Hessian weights (and t) of the tile's rows into [N, M] (contiguous); returns
    # p = alpha * c * loss'(t) and c * loss(t), [BN, M_PAD] each (zero outside). The loss values
    # are summed in registers by the caller: every [BN, M] store costs a layout conversion
    # (shared memory and two barriers per tile: the H200 showed it)
    val, g, h = _loss_terms(t, yv, jm, M, power, LOSS)
    smask = (rows[:, None] < N) & (jm[None, :] < M)
    o = rows[:, None] * M + jm[None, :]
    tl.store(HW + o, h, mask=smask)
    if STORE_ETA:
        tl.store(ETA + o, t, mask=smask)
    if HAS_C:
        cc = tl.load(C + rows, mask=rows < N, other=0.0).to(ACC)[:, None]
        g = g * cc
        val = val * cc
    return tl.where(smask, g * alpha, 0.0), tl.where(smask, val, 0.0)


@triton.jit
def _mmchain_onchip_kernel(
    X,  # [N, D] any strides, fp32/fp64/bf16/fp16
    Y,  # [Dx, M] accumulation dtype (unused when XTY)
    V,  # [N, M] or [N, 1] (stride_vm = 0), accumulation dtype
    W,  # [Dx, M] contiguous, accumulation dtype: atomics target (pre-set to beta * z)
    PART,  # [P, Dx * M] per-program partials (DETERMINISTIC)
    C, ETA, LPART, HW,  # LOSS > 0: sample weights [N] (HAS_C); outputs t [N, M] (STORE_ETA),
                        # per-program loss sums [P, M] float64, Hessian weights [N, M]
    N, D, M, n_tiles,
    stride_xn, stride_xd, stride_yd, stride_ym, stride_vn, stride_vm,
    alpha_hi, alpha_lo, power_hi, power_lo,
    XTY: tl.constexpr, HAS_V: tl.constexpr, SOFTMAX: tl.constexpr, INTERCEPT: tl.constexpr,
    DETERMINISTIC: tl.constexpr, EVEN_D: tl.constexpr, VEC: tl.constexpr, MODE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M_PAD: tl.constexpr, PREFETCH: tl.constexpr,
    LOSS: tl.constexpr, HAS_C: tl.constexpr, STORE_ETA: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_D), BLOCK_D), BLOCK_D)
    jm = tl.arange(0, M_PAD)
    alpha = tl.cast(alpha_hi, ACC) + tl.cast(alpha_lo, ACC)
    power = tl.cast(power_hi, ACC) + tl.cast(power_lo, ACC)  # Tweedie power: an fp32 pair (~48 bits for float64)
    if not XTY:
        yt = _load_yt(Y, cols, jm, D, M, stride_yd, stride_ym, ACC)  # [M_PAD, BD], kept on chip
        if INTERCEPT:
            yi = tl.load(Y + D * stride_yd + jm * stride_ym, mask=jm < M, other=0.0).to(ACC)
    if MODE == 0:  # [BLOCK_N, BLOCK_D]: no cross-warp reduction per tile, one at the end
        acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
    else:
        acc = tl.zeros([M_PAD, BLOCK_D], dtype=ACC)
    if INTERCEPT:  # sum_i p_i per row slot, reduced once at the end (a per-tile tl.sum over rows
        psum = tl.zeros([BLOCK_N, M_PAD], dtype=ACC)  # is a cross-warp reduction: two barriers)
    if LOSS > 0:
        # sum_i c_i loss_i in float64 (the solvers compare objectives that differ in the 7th
        # digit), reduced over the tile rows once at the end
        lsum = tl.zeros([BLOCK_N, M_PAD], dtype=tl.float64)
    if PREFETCH:  # register double buffer: tile i+1's loads are in flight while tile i computes
        rows0 = tl.arange(0, BLOCK_N).to(tl.int64) + pid * BLOCK_N
        x_nxt = _load_x_raw(X, rows0, cols, N, D, stride_xn, stride_xd, EVEN_D, VEC)  # storage dtype
        v_nxt = _load_v(V, rows0, jm, N, M, stride_vn, stride_vm, HAS_V, ACC)
    for tile in range(pid, n_tiles, nprog):
        rows = tl.arange(0, BLOCK_N).to(tl.int64) + tile * BLOCK_N
        if PREFETCH:
            x = x_nxt.to(ACC)
            vv = v_nxt
            rows_nxt = rows + nprog * BLOCK_N  # rows >= N (past the last tile) load nothing
            x_nxt = _load_x_raw(X, rows_nxt, cols, N, D, stride_xn, stride_xd, EVEN_D, VEC)
            v_nxt = _load_v(V, rows_nxt, jm, N, M, stride_vn, stride_vm, HAS_V, ACC)
        else:
            x = _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
        if XTY:
            t = tl.zeros([BLOCK_N, M_PAD], dtype=ACC)
        else:
            t = _xy(x, yt, MODE)
            if INTERCEPT:
                t += yi[None, :]
        if not PREFETCH:  # loaded after t, as before prefetching existed (fewer live registers)
            vv = _load_v(V, rows, jm, N, M, stride_vn, stride_vm, HAS_V, ACC)
        if LOSS > 0:  # V holds the targets: p = alpha * c * loss'(t); loss''(t) (and t) stored
            p, lv = _loss_p(t, vv, rows, jm, N, M, alpha, power, C, ETA, HW, LOSS, HAS_C, STORE_ETA, ACC)
            lsum += lv.to(tl.float64)
        else:
            p = _make_p(t, vv, rows, jm, N, M, alpha, XTY, HAS_V, SOFTMAX)
        if MODE == 0:
            acc += x * p
        else:
            acc = _xtp(acc, x, p, MODE)
        if INTERCEPT:
            psum += p
    if MODE == 0:
        acc = tl.sum(acc, axis=0, keep_dims=True)  # [1, BLOCK_D]
    if LOSS > 0:
        tl.store(LPART + pid * M + jm, tl.sum(lsum, axis=0), mask=jm < M)
    if INTERCEPT:
        psum = tl.sum(psum, axis=0)  # [M_PAD]
    offs = cols[None, :].to(tl.int64) * M + jm[:, None]  # [M_PAD, BD] into [Dx, M]
    omask = (cols[None, :] < D) & (jm[:, None] < M)
    if DETERMINISTIC:
        base = PART + pid.to(tl.int64) * ((D + INTERCEPT) * M)
        tl.store(base + offs, acc, mask=omask)
        if INTERCEPT:
            tl.store(base + D * M + jm, psum, mask=jm < M)
    else:
        tl.atomic_add(W + offs, acc, mask=omask, sem="relaxed")
        if INTERCEPT:
            tl.atomic_add(W + D * M + jm, psum, mask=jm < M, sem="relaxed")


@triton.jit
def _small_y(Y, cols, j: tl.constexpr, D, M, stride_yd, stride_ym, XTY: tl.constexpr, INTERCEPT: tl.constexpr,
             ACC: tl.constexpr):
    # column j of y ([BD] or [NCH, CH]) and its intercept entry, loaded once per program (zeros when
    # XTY or j >= M)
    # (masks on j are built as vectors: the interpreter rejects scalar constexpr-vs-int masks)
    yj = cols * 0.0
    yi = 0.0
    if not XTY:
        yj = tl.load(Y + cols * stride_yd + j * stride_ym, mask=(cols < D) & ((cols * 0 + j) < M),
                     other=0.0).to(ACC)
        if INTERCEPT:  # column min(j, M - 1): in bounds; t_j for j >= M is never used (p_j = 0)
            yi = tl.load(Y + D * stride_yd + tl.minimum(M - 1, j) * stride_ym).to(ACC)
    return yj, yi


@triton.jit
def _small_col(x, yj, yi, V, rows, j: tl.constexpr, N, M, stride_vn, stride_vm,
               HAS_V: tl.constexpr, XTY: tl.constexpr, INTERCEPT: tl.constexpr, ACC: tl.constexpr,
               BLOCK_N: tl.constexpr, NCH: tl.constexpr):
    # column j of t = [X,1] y (zeros when XTY) and of v, both [BN]; v_j = 0 for j >= M.
    # x [BN, NCH, CH] or [NCH, BN, CH]: the chunks first (within a thread), then across the CH / 4
    # threads of a row
    if XTY:
        t = tl.zeros([BLOCK_N], dtype=ACC)
    else:
        if NCH == 1:
            t = tl.sum(x * yj[None, :], axis=1)
        elif _CHUNK_OUTER:
            t = tl.sum(tl.sum(x * yj[:, None, :], axis=0), axis=1)
        else:
            t = tl.sum(tl.sum(x * yj[None, :, :], axis=1), axis=1)
        if INTERCEPT:
            t += yi
    if HAS_V:
        vj = tl.load(V + rows * stride_vn + j * stride_vm, mask=(rows < N) & ((rows * 0 + j) < M),
                     other=0.0).to(ACC)
    else:
        vj = tl.where((rows * 0 + j) < M, 1.0, 0.0).to(ACC)
    return t, vj


@triton.jit
def _small_p(t, vj, s, rows, j: tl.constexpr, N, M, XTY: tl.constexpr, HAS_V: tl.constexpr,
             SOFTMAX: tl.constexpr):
    # p_j [BN] = v_j t_j | v_j (t_j - s) | v_j (alpha applied once, in _small_out); zero on rows >= N
    # and j >= M: v_j was loaded as 0 there, so only v = 1 (no V) needs the mask
    if XTY:
        p = vj
    elif SOFTMAX:
        p = vj * (t - s)
    elif HAS_V:
        p = vj * t
    else:
        p = tl.where((rows < N) & ((rows * 0 + j) < M), t, 0.0)
    return p


@triton.jit
def _small_live(t, rows, j: tl.constexpr, M):
    # t_j where column j exists, -inf (no softmax weight) for the padding columns j >= M
    return tl.where((rows * 0 + j) < M, t, float("-inf"))


@triton.jit
def _small_loss(t, yv, e, lse, rse, cc, rows, j: tl.constexpr, N, M, power, LOSS: tl.constexpr,
                HAS_C: tl.constexpr):
    # column j of the loss pass, [BN] each: p_j = c loss'(t_j) (alpha in _small_out), c loss(t_j)
    # (both zero on rows >= N and j >= M) and the Hessian weight loss''(t_j).
    # Multinomial: e = exp(t_j - max_l t_l), lse = log sum_l exp(t_l), rse = 1 / sum_l exp(t_l - max)
    live = (rows < N) & ((rows * 0 + j) < M)
    if LOSS == 3:
        pr = e * rse
        val = tl.where((rows * 0 + j) == 0, lse, 0.0) - yv * t
        g = pr - yv
        h = pr
    else:
        val, g, h = _loss_terms(t, yv, j, M, power, LOSS)
    if HAS_C:
        g = g * cc
        val = val * cc
    return tl.where(live, g, 0.0), tl.where(live, val, 0.0), h


@triton.jit
def _small_store(PTR, rows, N, M, a0, a1, a2, a3, a4, a5, a6, a7, BLOCK_N: tl.constexpr, M_PAD: tl.constexpr):
    # columns a0..a(M_PAD-1) [BN] of the tile's rows into PTR [N, M] row-major, as one [BN, 2 | 4 | 8]
    # store: one layout conversion per tile (a [BN] store of a row-reduced vector converts each);
    # the columns past M are masked
    if M_PAD == 2:
        a = tl.join(a0, a1)
    elif M_PAD <= 4:  # [:, i, k] = column 2 i + k
        a = tl.reshape(tl.join(tl.join(a0, a2), tl.join(a1, a3)), (BLOCK_N, 4))
    else:  # [:, i, j, k] = column 4 i + 2 j + k
        a = tl.reshape(tl.join(tl.join(tl.join(a0, a4), tl.join(a2, a6)), tl.join(tl.join(a1, a5), tl.join(a3, a7))),
                       (BLOCK_N, 8))
    jm = tl.arange(0, 2 if M_PAD == 2 else (4 if M_PAD <= 4 else 8))
    tl.store(PTR + rows[:, None] * M + jm[None, :], a, mask=(rows[:, None] < N) & (jm[None, :] < M))


@triton.jit
def _small_out(acc, psum, alpha, W, PART, pid, cols, j: tl.constexpr, D, M,
               INTERCEPT: tl.constexpr, DETERMINISTIC: tl.constexpr, NCH: tl.constexpr):
    # column j of the program's alpha X^T p (acc summed over rows) -> partials row or atomics
    a = tl.sum(acc, axis=1 if NCH > 1 and _CHUNK_OUTER else 0) * alpha
    psum = psum * alpha
    offs = cols.to(tl.int64) * M + j
    omask = (cols < D) & ((cols * 0 + j) < M)
    if DETERMINISTIC:
        base = PART + pid.to(tl.int64) * ((D + INTERCEPT) * M)
        tl.store(base + offs, a, mask=omask)
        if INTERCEPT:
            if j < M:
                tl.store(base + D * M + j, psum)
    else:
        tl.atomic_add(W + offs, a, mask=omask, sem="relaxed")
        if INTERCEPT:
            if j < M:
                tl.atomic_add(W + D * M + j, psum, sem="relaxed")


@triton.jit
def _small_lsum(ls, LPART, pid, j: tl.constexpr, M):
    # the program's sum of column j's c loss -> LPART[pid, j] (float64)
    if j < M:
        tl.store(LPART + pid * M + j, tl.sum(ls, axis=0))


@triton.jit
def _small_pv(t, vj, s, e, lse, rse, cc, rows, j: tl.constexpr, N, M, power, XTY: tl.constexpr,
              HAS_V: tl.constexpr, SOFTMAX: tl.constexpr, LOSS: tl.constexpr, HAS_C: tl.constexpr):
    # column j's p; for the loss pass also c loss(t_j) and the Hessian weight (else p twice more)
    if LOSS > 0:
        p, lv, h = _small_loss(t, vj, e, lse, rse, cc, rows, j, N, M, power, LOSS, HAS_C)
    else:
        p = _small_p(t, vj, s, rows, j, N, M, XTY, HAS_V, SOFTMAX)
        lv = p
        h = p
    return p, lv, h


@triton.jit
def _mmchain_small_kernel(
    X,  # [N, D] any strides, fp32/fp64/bf16/fp16
    Y,  # [Dx, M] accumulation dtype (unused when XTY)
    V,  # [N, M] or [N, 1] (stride_vm = 0), accumulation dtype
    W,  # [Dx, M] contiguous, accumulation dtype: atomics target (pre-set to beta * z)
    PART,  # [P, Dx * M] per-program partials (DETERMINISTIC)
    C, ETA, LPART, HW,  # LOSS > 0, as in _mmchain_onchip_kernel
    N, D, M, n_tiles,
    stride_xn, stride_xd, stride_yd, stride_ym, stride_vn, stride_vm,
    alpha_hi, alpha_lo, power_hi, power_lo,
    XTY: tl.constexpr, HAS_V: tl.constexpr, SOFTMAX: tl.constexpr, INTERCEPT: tl.constexpr,
    DETERMINISTIC: tl.constexpr, EVEN_D: tl.constexpr, VEC: tl.constexpr, MODE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M_PAD: tl.constexpr, PREFETCH: tl.constexpr,
    LOSS: tl.constexpr, HAS_C: tl.constexpr, STORE_ETA: tl.constexpr, CHUNK: tl.constexpr,
):
    # "small" mode: the onchip kernel with the M_PAD (2..8) right-hand sides unrolled, so
    # every tensor is a [BLOCK_N, NCH, CHUNK] tile (or [NCH, ...]) in X's load layout (NCH = BLOCK_D / CHUNK
    # column
    # chunks, held within a thread; no padded tl.dot): 2 m FMAs per element of X plus one row
    # reduction per right-hand side (none for X^T V); y's columns are loaded once per program.
    # LOSS > 0: the loss-gradient pass, the row's softmax (multinomial) or each column's loss in
    # registers, c loss summed in float64.
    tl.static_assert(M_PAD >= 2 and M_PAD <= 8, "M_PAD: 2..8")
    NCH: tl.constexpr = BLOCK_D // CHUNK
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.max_contiguous(tl.multiple_of(tl.arange(0, CHUNK), CHUNK), CHUNK)
    if NCH > 1:  # [NCH, CHUNK]; the tile's chunk axis is held within a thread (_CHUNK_OUTER)
        cols = tl.arange(0, NCH)[:, None] * CHUNK + cols[None, :]
    alpha = tl.cast(alpha_hi, ACC) + tl.cast(alpha_lo, ACC)
    power = tl.cast(power_hi, ACC) + tl.cast(power_lo, ACC)  # Tweedie power: an fp32 pair (~48 bits for float64)
    y0, yi0 = _small_y(Y, cols, 0, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
    y1, yi1 = _small_y(Y, cols, 1, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
    acc0 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
    acc1 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
    ps0 = tl.zeros([BLOCK_N], dtype=ACC)
    ps1 = tl.zeros([BLOCK_N], dtype=ACC)
    ls0 = tl.zeros([BLOCK_N], dtype=tl.float64)  # LOSS: sum of c loss per row slot and column
    ls1 = tl.zeros([BLOCK_N], dtype=tl.float64)
    if M_PAD > 2:
        y2, yi2 = _small_y(Y, cols, 2, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
        acc2 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
        ps2 = tl.zeros([BLOCK_N], dtype=ACC)
        ls2 = tl.zeros([BLOCK_N], dtype=tl.float64)
    if M_PAD > 3:
        y3, yi3 = _small_y(Y, cols, 3, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
        acc3 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
        ps3 = tl.zeros([BLOCK_N], dtype=ACC)
        ls3 = tl.zeros([BLOCK_N], dtype=tl.float64)
    if M_PAD > 4:
        y4, yi4 = _small_y(Y, cols, 4, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
        acc4 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
        ps4 = tl.zeros([BLOCK_N], dtype=ACC)
        ls4 = tl.zeros([BLOCK_N], dtype=tl.float64)
    if M_PAD > 5:
        y5, yi5 = _small_y(Y, cols, 5, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
        acc5 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
        ps5 = tl.zeros([BLOCK_N], dtype=ACC)
        ls5 = tl.zeros([BLOCK_N], dtype=tl.float64)
    if M_PAD > 6:
        y6, yi6 = _small_y(Y, cols, 6, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
        acc6 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
        ps6 = tl.zeros([BLOCK_N], dtype=ACC)
        ls6 = tl.zeros([BLOCK_N], dtype=tl.float64)
    if M_PAD > 7:
        y7, yi7 = _small_y(Y, cols, 7, D, M, stride_yd, stride_ym, XTY, INTERCEPT, ACC)
        acc7 = _small_zeros(BLOCK_N, NCH, CHUNK, ACC)
        ps7 = tl.zeros([BLOCK_N], dtype=ACC)
        ls7 = tl.zeros([BLOCK_N], dtype=tl.float64)
    rows = tl.arange(0, BLOCK_N).to(tl.int64) + pid * BLOCK_N
    if PREFETCH > 0:  # register prefetch, PREFETCH tiles ahead
        x_nxt = _small_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC, NCH)
    if PREFETCH > 1:
        x_nx2 = _small_x(X, rows + nprog * BLOCK_N, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC, NCH)
    for tile in range(pid, n_tiles, nprog):
        if PREFETCH > 1:
            x = x_nxt
            x_nxt = x_nx2
            x_nx2 = _small_x(X, rows + 2 * nprog * BLOCK_N, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC, NCH)
        elif PREFETCH > 0:
            x = x_nxt
            x_nxt = _small_x(X, rows + nprog * BLOCK_N, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC, NCH)
        else:
            x = _small_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC, NCH)
        t0, v0 = _small_col(x, y0, yi0, V, rows, 0, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                            BLOCK_N, NCH)
        t1, v1 = _small_col(x, y1, yi1, V, rows, 1, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                            BLOCK_N, NCH)
        s = v0 * t0 + v1 * t1  # softmax: sum_j v_j t_j (v_j = 0 for j >= M)
        if M_PAD > 2:
            t2, v2 = _small_col(x, y2, yi2, V, rows, 2, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                                BLOCK_N, NCH)
            s += v2 * t2
        if M_PAD > 3:
            t3, v3 = _small_col(x, y3, yi3, V, rows, 3, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                                BLOCK_N, NCH)
            s += v3 * t3
        if M_PAD > 4:
            t4, v4 = _small_col(x, y4, yi4, V, rows, 4, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                                BLOCK_N, NCH)
            s += v4 * t4
        if M_PAD > 5:
            t5, v5 = _small_col(x, y5, yi5, V, rows, 5, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                                BLOCK_N, NCH)
            s += v5 * t5
        if M_PAD > 6:
            t6, v6 = _small_col(x, y6, yi6, V, rows, 6, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                                BLOCK_N, NCH)
            s += v6 * t6
        if M_PAD > 7:
            t7, v7 = _small_col(x, y7, yi7, V, rows, 7, N, M, stride_vn, stride_vm, HAS_V, XTY, INTERCEPT, ACC,
                                BLOCK_N, NCH)
            s += v7 * t7
        # the loss pass's per-row terms (placeholders t0 where a loss does not use them)
        e0, e1, e2, e3, lse, rse, cc = t0, t0, t0, t0, t0, t0, t0
        e4, e5, e6, e7 = t0, t0, t0, t0
        if HAS_C:
            cc = tl.load(C + rows, mask=rows < N, other=0.0).to(ACC)
        if LOSS == 3:  # the row's softmax over its M live columns
            mx = tl.maximum(t0, _small_live(t1, rows, 1, M))
            if M_PAD > 2:
                mx = tl.maximum(mx, _small_live(t2, rows, 2, M))
            if M_PAD > 3:
                mx = tl.maximum(mx, _small_live(t3, rows, 3, M))
            if M_PAD > 4:
                mx = tl.maximum(mx, _small_live(t4, rows, 4, M))
            if M_PAD > 5:
                mx = tl.maximum(mx, _small_live(t5, rows, 5, M))
            if M_PAD > 6:
                mx = tl.maximum(mx, _small_live(t6, rows, 6, M))
            if M_PAD > 7:
                mx = tl.maximum(mx, _small_live(t7, rows, 7, M))
            e0 = tl.exp(t0 - mx)
            e1 = tl.exp(_small_live(t1, rows, 1, M) - mx)
            se = e0 + e1
            if M_PAD > 2:
                e2 = tl.exp(_small_live(t2, rows, 2, M) - mx)
                se += e2
            if M_PAD > 3:
                e3 = tl.exp(_small_live(t3, rows, 3, M) - mx)
                se += e3
            if M_PAD > 4:
                e4 = tl.exp(_small_live(t4, rows, 4, M) - mx)
                se += e4
            if M_PAD > 5:
                e5 = tl.exp(_small_live(t5, rows, 5, M) - mx)
                se += e5
            if M_PAD > 6:
                e6 = tl.exp(_small_live(t6, rows, 6, M) - mx)
                se += e6
            if M_PAD > 7:
                e7 = tl.exp(_small_live(t7, rows, 7, M) - mx)
                se += e7
            lse = mx + tl.log(se)
            rse = 1.0 / se
            if se.dtype == tl.float32:
                if _FAST_MATH:  # se in [1, M]: the hardware log2 and reciprocal (see _loss_terms)
                    lse = mx + libdevice.fast_log2f(se) * 0.6931471805599453
                    rse = libdevice.fast_dividef(1.0, se)
        p0, l0, h0 = _small_pv(t0, v0, s, e0, lse, rse, cc, rows, 0, N, M, power, XTY, HAS_V, SOFTMAX, LOSS, HAS_C)
        p1, l1, h1 = _small_pv(t1, v1, s, e1, lse, rse, cc, rows, 1, N, M, power, XTY, HAS_V, SOFTMAX, LOSS, HAS_C)
        acc0 = _small_acc(acc0, x, p0, NCH)
        acc1 = _small_acc(acc1, x, p1, NCH)
        if INTERCEPT:
            ps0 += p0
            ps1 += p1
        if LOSS > 0:
            ls0 += l0.to(tl.float64)
            ls1 += l1.to(tl.float64)
        h2, h3, tt2, tt3 = h0, h1, t0, t1  # the [BN, 4 or 8] store's unused columns (masked)
        h4, h5, h6, h7, tt4, tt5, tt6, tt7 = h0, h1, h0, h1, t0, t1, t0, t1
        if M_PAD > 2:
            p2, l2, h2 = _small_pv(t2, v2, s, e2, lse, rse, cc, rows, 2, N, M, power, XTY, HAS_V, SOFTMAX, LOSS,
                                   HAS_C)
            acc2 = _small_acc(acc2, x, p2, NCH)
            tt2 = t2
            if INTERCEPT:
                ps2 += p2
            if LOSS > 0:
                ls2 += l2.to(tl.float64)
        if M_PAD > 3:
            p3, l3, h3 = _small_pv(t3, v3, s, e3, lse, rse, cc, rows, 3, N, M, power, XTY, HAS_V, SOFTMAX, LOSS,
                                   HAS_C)
            acc3 = _small_acc(acc3, x, p3, NCH)
            tt3 = t3
            if INTERCEPT:
                ps3 += p3
            if LOSS > 0:
                ls3 += l3.to(tl.float64)
        if M_PAD > 4:
            p4, l4, h4 = _small_pv(t4, v4, s, e4, lse, rse, cc, rows, 4, N, M, power, XTY, HAS_V, SOFTMAX, LOSS,
                                   HAS_C)
            acc4 = _small_acc(acc4, x, p4, NCH)
            tt4 = t4
            if INTERCEPT:
                ps4 += p4
            if LOSS > 0:
                ls4 += l4.to(tl.float64)
        if M_PAD > 5:
            p5, l5, h5 = _small_pv(t5, v5, s, e5, lse, rse, cc, rows, 5, N, M, power, XTY, HAS_V, SOFTMAX, LOSS,
                                   HAS_C)
            acc5 = _small_acc(acc5, x, p5, NCH)
            tt5 = t5
            if INTERCEPT:
                ps5 += p5
            if LOSS > 0:
                ls5 += l5.to(tl.float64)
        if M_PAD > 6:
            p6, l6, h6 = _small_pv(t6, v6, s, e6, lse, rse, cc, rows, 6, N, M, power, XTY, HAS_V, SOFTMAX, LOSS,
                                   HAS_C)
            acc6 = _small_acc(acc6, x, p6, NCH)
            tt6 = t6
            if INTERCEPT:
                ps6 += p6
            if LOSS > 0:
                ls6 += l6.to(tl.float64)
        if M_PAD > 7:
            p7, l7, h7 = _small_pv(t7, v7, s, e7, lse, rse, cc, rows, 7, N, M, power, XTY, HAS_V, SOFTMAX, LOSS,
                                   HAS_C)
            acc7 = _small_acc(acc7, x, p7, NCH)
            tt7 = t7
            if INTERCEPT:
                ps7 += p7
            if LOSS > 0:
                ls7 += l7.to(tl.float64)
        if LOSS > 0:  # the Hessian weights (and t) of the tile's rows
            _small_store(HW, rows, N, M, h0, h1, h2, h3, h4, h5, h6, h7, BLOCK_N, M_PAD)
            if STORE_ETA:
                _small_store(ETA, rows, N, M, t0, t1, tt2, tt3, tt4, tt5, tt6, tt7, BLOCK_N, M_PAD)
        rows += nprog * BLOCK_N
    _small_out(acc0, tl.sum(ps0, axis=0), alpha, W, PART, pid, cols, 0, D, M, INTERCEPT, DETERMINISTIC, NCH)
    _small_out(acc1, tl.sum(ps1, axis=0), alpha, W, PART, pid, cols, 1, D, M, INTERCEPT, DETERMINISTIC, NCH)
    if LOSS > 0:
        _small_lsum(ls0, LPART, pid, 0, M)
        _small_lsum(ls1, LPART, pid, 1, M)
    if M_PAD > 2:
        _small_out(acc2, tl.sum(ps2, axis=0), alpha, W, PART, pid, cols, 2, D, M, INTERCEPT, DETERMINISTIC, NCH)
        if LOSS > 0:
            _small_lsum(ls2, LPART, pid, 2, M)
    if M_PAD > 3:
        _small_out(acc3, tl.sum(ps3, axis=0), alpha, W, PART, pid, cols, 3, D, M, INTERCEPT, DETERMINISTIC, NCH)
        if LOSS > 0:
            _small_lsum(ls3, LPART, pid, 3, M)
    if M_PAD > 4:
        _small_out(acc4, tl.sum(ps4, axis=0), alpha, W, PART, pid, cols, 4, D, M, INTERCEPT, DETERMINISTIC, NCH)
        if LOSS > 0:
            _small_lsum(ls4, LPART, pid, 4, M)
    if M_PAD > 5:
        _small_out(acc5, tl.sum(ps5, axis=0), alpha, W, PART, pid, cols, 5, D, M, INTERCEPT, DETERMINISTIC, NCH)
        if LOSS > 0:
            _small_lsum(ls5, LPART, pid, 5, M)
    if M_PAD > 6:
        _small_out(acc6, tl.sum(ps6, axis=0), alpha, W, PART, pid, cols, 6, D, M, INTERCEPT, DETERMINISTIC, NCH)
        if LOSS > 0:
            _small_lsum(ls6, LPART, pid, 6, M)
    if M_PAD > 7:
        _small_out(acc7, tl.sum(ps7, axis=0), alpha, W, PART, pid, cols, 7, D, M, INTERCEPT, DETERMINISTIC, NCH)
        if LOSS > 0:
            _small_lsum(ls7, LPART, pid, 7, M)


@triton.jit
def _coop_publish(x, y_g, TP, row, g, G, WORDS: tl.constexpr):
    # publish this program's part of t_row = X[row, cols_g] . y_g as tagged 64-bit words: the low 32
    # bits carry the value (fp32; fp64 in two words, high half first), the high 32 bits the tag 1.
    # A reader that sees the tag sees the value (one aligned 64-bit store): no fence, no counter.
    s = tl.sum(x * y_g, axis=0)
    tag = tl.full([], 1 << 32, tl.int64)
    if WORDS == 1:
        tl.store(TP + row * G + g, s.to(tl.uint32, bitcast=True).to(tl.int64) | tag)
    else:
        b = s.to(tl.int64, bitcast=True)
        tl.store(TP + (row * G + g) * 2, ((b >> 32) & 0xFFFFFFFF) | tag)
        tl.store(TP + (row * G + g) * 2 + 1, (b & 0xFFFFFFFF) | tag)


@triton.jit
def _coop_poll(TP, row, gg, G, N, WORDS: tl.constexpr):
    # the G tagged words of a row straight from L2 (volatile: a fresh read every poll) and the
    # smallest tag among them (1 once every partial of the row has arrived; rows past N read as 1)
    gmask = (gg < G) & ((gg * 0 + row) < N)
    one = tl.full([], 1 << 32, tl.int64)
    if WORDS == 1:
        w0 = tl.load(TP + row * G + gg, mask=gmask, other=one, volatile=True)
        return w0, w0, tl.min(w0 >> 32, axis=0)
    else:
        base = TP + (row * G + gg) * 2
        w0 = tl.load(base, mask=gmask, other=one, volatile=True)
        w1 = tl.load(base + 1, mask=gmask, other=one, volatile=True)
        return w0, w1, tl.minimum(tl.min(w0 >> 32, axis=0), tl.min(w1 >> 32, axis=0))


@triton.jit
def _coop_t(w0, w1, gg, G, ACC: tl.constexpr, WORDS: tl.constexpr):
    # t_row: the G partials decoded and summed in a fixed order
    if WORDS == 1:
        part = w0.to(tl.int32).to(tl.float32, bitcast=True)
    else:
        b = (w0 << 32) | (w1 & 0xFFFFFFFF)
        part = b.to(tl.float64, bitcast=True)
    return tl.sum(tl.where(gg < G, part.to(ACC), 0.0), axis=0)


@triton.jit
def _coop_row(X, row, stride_xn, col_off, lmask, cols, N, ACC: tl.constexpr):
    # this program's columns of row ``row`` of X (zeros past N), read once: evict-first
    return tl.load(X + row * stride_xn + col_off, mask=lmask & ((cols * 0 + row) < N), other=0.0,
                   eviction_policy=_X_EVICT).to(ACC)


@triton.jit
def _mmchain_coop_kernel(
    X,  # [N, D] any strides, fp32/fp64/bf16/fp16
    Y,  # [Dx, 1] accumulation dtype (unused when XTY)
    V,  # [N, 1] accumulation dtype
    W,  # [Dx, 1] contiguous, accumulation dtype: atomics target (pre-set to beta * z)
    PART,  # [R, Dx] per-row-group partials (DETERMINISTIC)
    TP,  # [N, G, WORDS] int64, zero: tagged partial t of each row and column block
    ERR,  # [1] int32, zero: rows whose wait hit the spin limit
    N, D, G, R,
    stride_xn, stride_xd, stride_yd, stride_vn,
    alpha_hi, alpha_lo,
    XTY: tl.constexpr, HAS_V: tl.constexpr, INTERCEPT: tl.constexpr, DETERMINISTIC: tl.constexpr,
    EVEN_D: tl.constexpr, ACC: tl.constexpr, BLOCK_D: tl.constexpr, G_PAD: tl.constexpr,
    PHASE: tl.constexpr, MAX_SPIN: tl.constexpr, AHEAD: tl.constexpr, WORDS: tl.constexpr,
):
    # Wide rows, m = 1, one row per tile. Program pid owns column block g = pid % G of row group
    # pid // G for the whole run: its slice of y and its X^T p accumulator stay in registers. Row
    # i's t is the sum of the G partial dot products of its group; PHASE 0 (GPU) combines them
    # through global memory -- each program publishes its partial as a tagged word and polls the
    # row's G words until every tag is set (every program of the grid is co-resident, the
    # launcher sizes it so) -- and then multiplies the part of the row still in its registers: X
    # is read once. The wait is one L2 round trip when the partials are there (no fence, no
    # counter). AHEAD = rows in registers: 1: row i + R loads during row i's wait and is
    # published after it; 2: row i + R (loaded an iteration ago) is published while row i's poll
    # is in flight, row i + 2R loads; 3: row i + 2R is published, row i + 3R loads, and row
    # i + R's poll is issued at the end of the iteration, so neither a load nor a poll issued in
    # an iteration is waited on in it (the loop is latency-bound: H200, 4k x 65536, 0.32 ms
    # against 0.41 / 0.50 ms for 3 / 2 rows). PHASE 1 / 2 split the same work into two launches
    # (partials, then combine + accumulate: X read twice): the interpreter runs programs one after
    # another.
    pid = tl.program_id(0)
    g = pid % G
    r0 = pid // G
    cols = g * BLOCK_D + tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_D), BLOCK_D), BLOCK_D)
    cmask = cols < D
    gg = tl.arange(0, G_PAD)
    alpha = tl.cast(alpha_hi, ACC) + tl.cast(alpha_lo, ACC)
    if not XTY:
        y_g = tl.load(Y + cols.to(tl.int64) * stride_yd, mask=cmask, other=0.0).to(ACC)
        if INTERCEPT:
            yi = tl.load(Y + D * stride_yd).to(ACC)
    acc = tl.zeros([BLOCK_D], dtype=ACC)
    psum = tl.sum(tl.zeros([BLOCK_D], dtype=ACC), axis=0)
    col_off = cols.to(tl.int64) * stride_xd
    lmask = cmask
    row = r0.to(tl.int64)
    PUB: tl.constexpr = (not XTY) and PHASE != 2  # this launch publishes partials
    WAIT: tl.constexpr = (not XTY) and PHASE != 1  # this launch combines them
    x_nxt = _coop_row(X, row, stride_xn, col_off, lmask, cols, N, ACC)
    if PUB:
        if row < N:
            _coop_publish(x_nxt, y_g, TP, row, g, G, WORDS)
    if AHEAD >= 2:  # row i + 2R loads while row i + R is published
        x_n2 = _coop_row(X, row + R, stride_xn, col_off, lmask, cols, N, ACC)
    if AHEAD == 3:  # rows published two iterations ahead; each row's poll issued an iteration ahead
        if PUB:
            if row + R < N:
                _coop_publish(x_n2, y_g, TP, row + R, g, G, WORDS)
        x_n3 = _coop_row(X, row + 2 * R, stride_xn, col_off, lmask, cols, N, ACC)
        if WAIT:
            w0, w1, ok = _coop_poll(TP, row, gg, G, N, WORDS)
    spin_left = MAX_SPIN  # polls for the whole run: a broken grid ends in about a second, not per row
    for _ in range(r0, N, R):  # row = r0, r0 + R, ... (int64, carried)
        x = x_nxt
        nxt = row + R
        if AHEAD == 3:
            x_nxt = x_n2
            x_n2 = x_n3
            x_n3 = _coop_row(X, nxt + 2 * R, stride_xn, col_off, lmask, cols, N, ACC)
            if PUB:
                if nxt + R < N:  # row i + 2R, loaded an iteration ago
                    _coop_publish(x_n2, y_g, TP, nxt + R, g, G, WORDS)
        elif AHEAD == 2:
            x_nxt = x_n2
            x_n2 = _coop_row(X, nxt + R, stride_xn, col_off, lmask, cols, N, ACC)
        else:
            x_nxt = _coop_row(X, nxt, stride_xn, col_off, lmask, cols, N, ACC)
        if WAIT:
            if AHEAD != 3:
                w0, w1, ok = _coop_poll(TP, row, gg, G, N, WORDS)  # in flight while row i + R is published
        if AHEAD == 2:
            if PUB:
                if nxt < N:  # row i + R (loaded an iteration ago) goes out a whole wait before its poll
                    _coop_publish(x_nxt, y_g, TP, nxt, g, G, WORDS)
        if PHASE != 1:
            if WAIT:
                if PHASE == 0:  # wait for the group's G partials of this row
                    while (ok < 1) & (spin_left > 0):
                        w0, w1, ok = _coop_poll(TP, row, gg, G, N, WORDS)
                        spin_left -= 1
                    if ok < 1:  # never expected: count it instead of hanging (host can check)
                        tl.atomic_add(ERR, 1, sem="relaxed")
                t = _coop_t(w0, w1, gg, G, ACC, WORDS)
                if INTERCEPT:
                    t += yi
            if HAS_V:
                vv = tl.load(V + row * stride_vn).to(ACC)
                p = vv if XTY else vv * t
            else:
                p = t
            p = p * alpha
            acc += x * p
            psum += p
        if AHEAD == 1:
            if PUB:
                if nxt < N:  # publish row i + R (just loaded) before waiting on it next iteration
                    _coop_publish(x_nxt, y_g, TP, nxt, g, G, WORDS)
        if AHEAD == 3:
            if WAIT:
                w0, w1, ok = _coop_poll(TP, nxt, gg, G, N, WORDS)  # published an iteration ago
        row = nxt
    if PHASE != 1:
        if DETERMINISTIC:
            base = PART + r0.to(tl.int64) * (D + INTERCEPT)
            tl.store(base + cols, acc, mask=cmask)
            if INTERCEPT:
                if g == 0:
                    tl.store(base + D, psum)
        else:
            tl.atomic_add(W + cols, acc, mask=cmask, sem="relaxed")
            if INTERCEPT:
                if g == 0:
                    tl.atomic_add(W + D, psum, sem="relaxed")


@triton.jit
def _mmchain_chunked_kernel(
    X,  # [N, D] any strides
    Y,  # [Dx, M] accumulation dtype
    V,  # [N, M] or [N, 1] (stride_vm = 0)
    W,  # [Dx, M] contiguous: atomics target (pre-set to beta * z)
    PART,  # [P, Dx * M] zero-initialised per-program partials (DETERMINISTIC)
    N, D, M, n_tiles,
    stride_xn, stride_xd, stride_yd, stride_ym, stride_vn, stride_vm,
    alpha_hi, alpha_lo,
    XTY: tl.constexpr, HAS_V: tl.constexpr, SOFTMAX: tl.constexpr, INTERCEPT: tl.constexpr,
    DETERMINISTIC: tl.constexpr, EVEN_D: tl.constexpr, VEC: tl.constexpr, MODE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M_PAD: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    arange_d = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_D), BLOCK_D), BLOCK_D)
    jm = tl.arange(0, M_PAD)
    alpha = tl.cast(alpha_hi, ACC) + tl.cast(alpha_lo, ACC)
    n_chunks = tl.cdiv(D, BLOCK_D)
    base = PART + pid.to(tl.int64) * ((D + INTERCEPT) * M)
    if INTERCEPT:
        if not XTY:
            yi = tl.load(Y + D * stride_yd + jm * stride_ym, mask=jm < M, other=0.0).to(ACC)
    psum = tl.zeros([M_PAD], dtype=ACC)
    for tile in range(pid, n_tiles, nprog):
        rows = tl.arange(0, BLOCK_N).to(tl.int64) + tile * BLOCK_N
        t = tl.zeros([BLOCK_N, M_PAD], dtype=ACC)
        if not XTY:
            for c in range(0, n_chunks):  # pass 1: t = X_b y
                cols = c * BLOCK_D + arange_d
                x = _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
                yt = _load_yt(Y, cols, jm, D, M, stride_yd, stride_ym, ACC)
                t += _xy(x, yt, MODE)
            if INTERCEPT:
                t += yi[None, :]
        vv = _load_v(V, rows, jm, N, M, stride_vn, stride_vm, HAS_V, ACC)
        p = _make_p(t, vv, rows, jm, N, M, alpha, XTY, HAS_V, SOFTMAX)
        for k in range(0, n_chunks):  # pass 2: last chunk first (freshest in L2)
            cols = (n_chunks - 1 - k) * BLOCK_D + arange_d
            x = _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
            contrib = _xtp(tl.zeros([M_PAD, BLOCK_D], dtype=ACC), x, p, MODE)
            offs = cols[None, :].to(tl.int64) * M + jm[:, None]
            omask = (cols[None, :] < D) & (jm[:, None] < M)
            if DETERMINISTIC:
                prev = tl.load(base + offs, mask=omask, other=0.0)
                tl.store(base + offs, prev + contrib, mask=omask)
            else:
                tl.atomic_add(W + offs, contrib, mask=omask, sem="relaxed")
        if INTERCEPT:
            psum += tl.sum(p, axis=0)
    if INTERCEPT:
        if DETERMINISTIC:
            tl.store(base + D * M + jm, psum, mask=jm < M)
        else:
            tl.atomic_add(W + D * M + jm, psum, mask=jm < M, sem="relaxed")


@triton.jit
def _reduce_partials_kernel(
    PART,  # [P, L] per-program partials
    Z,  # [L] (beta * z is added when HAS_Z)
    W,  # [L] output
    n_parts, L, beta_hi, beta_lo,
    HAS_Z: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < L
    acc = tl.zeros([BLOCK], dtype=ACC)
    for i in range(0, n_parts):  # fixed order: the same bits on every run
        acc += tl.load(PART + i * L + offs, mask=mask, other=0.0)
    if HAS_Z:
        acc += (tl.cast(beta_hi, ACC) + tl.cast(beta_lo, ACC)) * tl.load(Z + offs, mask=mask, other=0.0)
    tl.store(W + offs, acc, mask=mask)


@triton.jit
def _matvec_kernel(
    X,  # [N, D] any strides
    Y,  # [Dx, M] accumulation dtype
    T,  # [N, M] output, contiguous
    N, D, M, n_tiles,
    stride_xn, stride_xd, stride_yd, stride_ym,
    INTERCEPT: tl.constexpr, EVEN_D: tl.constexpr, VEC: tl.constexpr, MODE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, M_PAD: tl.constexpr, ONE_CHUNK: tl.constexpr,
):
    # persistent programs over row tiles (as the mmchain kernels: a grid of a few programs per SM
    # keeps more bytes in flight than one short-lived program per tile); y stays in registers
    # when a whole row is one chunk
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    arange_d = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_D), BLOCK_D), BLOCK_D)
    jm = tl.arange(0, M_PAD)
    if ONE_CHUNK:
        yt = _load_yt(Y, arange_d, jm, D, M, stride_yd, stride_ym, ACC)
    if INTERCEPT:
        yi = tl.load(Y + D * stride_yd + jm * stride_ym, mask=jm < M, other=0.0).to(ACC)
    for tile in range(pid, n_tiles, nprog):
        rows = tl.arange(0, BLOCK_N).to(tl.int64) + tile * BLOCK_N
        if ONE_CHUNK:
            t = _xy(_load_x(X, rows, arange_d, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC), yt, MODE)
        else:
            t = tl.zeros([BLOCK_N, M_PAD], dtype=ACC)
            for c in range(0, tl.cdiv(D, BLOCK_D)):
                cols = c * BLOCK_D + arange_d
                x = _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
                t += _xy(x, _load_yt(Y, cols, jm, D, M, stride_yd, stride_ym, ACC), MODE)
        if INTERCEPT:
            t += yi[None, :]
        tl.store(T + rows[:, None] * M + jm[None, :], t, mask=(rows[:, None] < N) & (jm[None, :] < M))


#: right-hand sides the matvec's unrolled ("small") kernel holds one accumulator each for
MATVEC_SMALL_M = 8


@triton.jit
def _rhs_fma(a, x, Y, cols, D, stride_yd, stride_ym, NM: tl.constexpr, J: tl.constexpr, ACC: tl.constexpr):
    # a [BN, BD] += x * y[cols, J] (a no-op past the last right-hand side)
    if J < NM:
        a += x * tl.load(Y + cols * stride_yd + J * stride_ym, mask=cols < D, other=0.0).to(ACC)[None, :]
    return a


@triton.jit
def _rhs_store(T, a, rows, N, Y, D, stride_yd, stride_ym, NM: tl.constexpr, J: tl.constexpr,
               INTERCEPT: tl.constexpr, ACC: tl.constexpr):
    # t[rows, J] = sum of a's row (+ the intercept's y[D, J])
    if J < NM:
        t = tl.sum(a, axis=1)
        if INTERCEPT:
            t += tl.load(Y + D * stride_yd + J * stride_ym).to(ACC)
        tl.store(T + rows * NM + J, t, mask=rows < N)


@triton.jit
def _matvec_small_kernel(
    X,  # [N, D] any strides
    Y,  # [Dx, NM] accumulation dtype
    T,  # [N, NM] output, contiguous
    N, D, n_tiles,
    stride_xn, stride_xd, stride_yd, stride_ym,
    INTERCEPT: tl.constexpr, EVEN_D: tl.constexpr, VEC: tl.constexpr, ACC: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NM: tl.constexpr,
):
    # t = [X, 1] Y for 2 <= NM <= 8: each right-hand side keeps a [BLOCK_N, BLOCK_D] accumulator
    # across the column chunks (NM FMAs per element of X, in the tile's load layout) and reduces
    # along the row once per tile; short chunks keep a row within a few threads of one warp
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    arange_d = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_D), BLOCK_D), BLOCK_D)
    for tile in range(pid, n_tiles, nprog):
        rows = tl.arange(0, BLOCK_N).to(tl.int64) + tile * BLOCK_N
        a0 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a1 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a2 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a3 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a4 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a5 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a6 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        a7 = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        for c in range(0, tl.cdiv(D, BLOCK_D)):
            cols = c * BLOCK_D + arange_d
            x = _load_x(X, rows, cols, N, D, stride_xn, stride_xd, ACC, EVEN_D, VEC)
            a0 = _rhs_fma(a0, x, Y, cols, D, stride_yd, stride_ym, NM, 0, ACC)
            a1 = _rhs_fma(a1, x, Y, cols, D, stride_yd, stride_ym, NM, 1, ACC)
            a2 = _rhs_fma(a2, x, Y, cols, D, stride_yd, stride_ym, NM, 2, ACC)
            a3 = _rhs_fma(a3, x, Y, cols, D, stride_yd, stride_ym, NM, 3, ACC)
            a4 = _rhs_fma(a4, x, Y, cols, D, stride_yd, stride_ym, NM, 4, ACC)
            a5 = _rhs_fma(a5, x, Y, cols, D, stride_yd, stride_ym, NM, 5, ACC)
            a6 = _rhs_fma(a6, x, Y, cols, D, stride_yd, stride_ym, NM, 6, ACC)
            a7 = _rhs_fma(a7, x, Y, cols, D, stride_yd, stride_ym, NM, 7, ACC)
        _rhs_store(T, a0, rows, N, Y, D, stride_yd, stride_ym, NM, 0, INTERCEPT, ACC)
        _rhs_store(T, a1, rows, N, Y, D, stride_yd, stride_ym, NM, 1, INTERCEPT, ACC)
        _rhs_store(T, a2, rows, N, Y, D, stride_yd, stride_ym, NM, 2, INTERCEPT, ACC)
        _rhs_store(T, a3, rows, N, Y, D, stride_yd, stride_ym, NM, 3, INTERCEPT, ACC)
        _rhs_store(T, a4, rows, N, Y, D, stride_yd, stride_ym, NM, 4, INTERCEPT, ACC)
        _rhs_store(T, a5, rows, N, Y, D, stride_yd, stride_ym, NM, 5, INTERCEPT, ACC)
        _rhs_store(T, a6, rows, N, Y, D, stride_yd, stride_ym, NM, 6, INTERCEPT, ACC)
        _rhs_store(T, a7, rows, N, Y, D, stride_yd, stride_ym, NM, 7, INTERCEPT, ACC)


def _mode(cfg: DenseConfig) -> int:
    """The kernels' MODE: "dot" with ``dot_precision="tf32x3"`` is 4 (tensor cores), else _MODES."""
    return 4 if cfg.mode == "dot" and cfg.dot_precision == "tf32x3" else _MODES[cfg.mode]


def _empty(shape, dtype, device) -> torch.Tensor:
    """Allocate an output every element of which the kernels overwrite (tests poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _vec(X: torch.Tensor, D: int) -> int:
    """Elements per 16-byte load that X's row stride and D are multiples of (1: no claim); negated
    where the stride is and D is not, but every row can be read up to D rounded up to it.

    Triton assumes 16-byte alignment only for integer arguments divisible by 16, so rows of e.g.
    100 fp32 values would be read with 4-byte loads (H200, 1M x 100: 2.8x the floor). Rows whose
    length is not a multiple of the vector (55 fp32 values) are read in whole vectors only from an
    aligned view of padded rows (:func:`aligned_rows`, or any view whose storage holds the
    padding, even of the last row); the kernels zero the padding after the load.
    """
    if D > 1 and X.stride(1) != 1:
        return 1
    v = 16 // X.element_size()
    while v > 1 and X.stride(0) % v:
        v //= 2
    if v > 1 and D % v and D > v:
        end = X.storage_offset() + (X.shape[0] - 1) * X.stride(0) + -(-D // v) * v
        if end * X.element_size() <= X.untyped_storage().nbytes():
            return -v
    while v > 1 and D % v:
        v //= 2
    return v


#: rows of at most this many bytes are read as they are where a copy would pad them (a streamed
#: matrix's resident rows, a worker's partition, the Lloyd step's copy): their padded passes gained
#: 0-7 % or lost (H100, ``stream_align_probe-*-s44``, ``gmm_odd_width_fits-*-s44``)
NARROW_ROW_BYTES = 64


def padded_width(D: int, element_size: int) -> int:
    """Row length, in elements, of :func:`aligned_rows`' padded rows: D rounded up to whole 16-byte
    vectors, or D itself where no padding applies (rows of at most one vector, 1-byte dtypes)."""
    v = 16 // element_size if element_size in (2, 4, 8) else 1
    return D if D <= v else -(-D // v) * v


def align_mode() -> str:
    """``FUSEDML_ALIGN_ROWS``: ``"auto"`` (default; the estimators' and the streamed matrices' own
    rules), ``"1"`` (every fit copies odd-width rows), ``"0"`` (never: X is read as it is)."""
    mode = os.environ.get("FUSEDML_ALIGN_ROWS", "auto").strip().lower() or "auto"
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"FUSEDML_ALIGN_ROWS must be auto, 0 or 1, got {mode!r}")
    return mode


def pads_rows(device, row_bytes: int, setting="auto") -> bool:
    """Whether a dense matrix kept on ``device`` for many passes (a streamed matrix's resident rows, a
    worker's partition) is kept in rows padded to whole 16-byte vectors (:func:`aligned_rows`).

    ``setting`` True / False decides; ``"auto"`` follows ``FUSEDML_ALIGN_ROWS`` (:func:`align_mode`):
    ``auto`` pads rows of over 64 bytes up to 64 KB on CUDA devices, ``1`` rows up to 64 KB on any
    device, ``0`` never. Rows of at most 64 bytes stay as they are, as for the Lloyd step: padded
    rows of 13 fp32 values lost 13 % in ``matvec`` and gained 6 % in ``mmchain`` (H100, 4M x 13,
    ``stream_align_probe-H100-*-s44``); rows over 64 KB are read the cooperative kernel's way.
    """
    if setting != "auto":
        return bool(setting)
    mode = align_mode()
    if mode == "0" or row_bytes > 64 << 10:
        return False
    return mode == "1" or (row_bytes > NARROW_ROW_BYTES and torch.device(device).type == "cuda")


def aligned_rows(X: torch.Tensor, max_bytes: int | None = None) -> torch.Tensor:
    """X itself, or an ``[N, D]`` view of a copy whose rows are padded to whole 16-byte vectors.

    The dense kernels read rows whose length in bytes is a multiple of 16 with 16-byte loads and
    other rows (e.g. 55 fp32 values) with scalar loads at a fraction of the bandwidth; on the
    padded copy every row is read in whole vectors (the padding is never part of a result). The
    copy costs about two reads of X (a read and a write) once and ``D_pad / D`` times X's memory.
    The linear estimators make it on the fused backend for fits with several columns of
    coefficients, and for one-column Newton-type fits from 400 MiB of X
    (``algorithms._base.fit_design``); pass the view to reuse one copy across fits.

    Parameters
    ----------
    X : torch.Tensor
        ``[N, D]`` dense; never modified.
    max_bytes : int, optional
        Make no copy larger than this (then ``X`` is returned).

    Returns
    -------
    torch.Tensor
        ``X`` when its rows are already read in whole vectors (or it is not a 2-D row-major
        tensor of a 2-, 4- or 8-byte dtype, or the copy would exceed ``max_bytes``); else a new
        ``[N, D]`` view with row stride ``D_pad``.

    Examples
    --------
    >>> import torch, fusedml
    >>> A = fusedml.aligned_rows(torch.randn(1000, 55))
    >>> A.shape, A.stride()
    (torch.Size([1000, 55]), (56, 1))
    """
    if not isinstance(X, torch.Tensor) or X.ndim != 2 or X.layout != torch.strided or X.shape[0] == 0 \
            or X.element_size() not in (2, 4, 8) or (X.shape[1] > 1 and X.stride(1) != 1):
        return X
    N, D = (int(s) for s in X.shape)
    Dp = padded_width(D, X.element_size())
    if Dp == D or abs(_vec(X, D)) == 16 // X.element_size():
        return X
    if max_bytes is not None and N * Dp * X.element_size() > max_bytes:
        return X
    Xp = torch.empty((N, Dp), dtype=X.dtype, device=X.device)
    dpc = triton.next_power_of_2(Dp)
    if (X.is_cuda or interpret_mode()) and dpc <= _PAD_TILE:
        # one pass: each row read once, written whole with its zeroed padding (H100: 2.6-2.95 TB/s,
        # 1.6-2.3x torch's zero_ + strided copy_; pad_copy_probe-H100-*-s41)
        br = _PAD_TILE // dpc
        call(_pad_rows_kernel, (triton.cdiv(N, br),), X, Xp, N, X.stride(0), D=D, DP=Dp, DPC=dpc, BR=br,
             num_warps=8)
    else:
        Xp[:, D:].zero_()  # never read into a result (the kernels zero it after the load), but defined
        Xp[:, :D].copy_(X)
    return Xp[:, :D]


_PAD_TILE = 8192  # elements per program of the padded copy


@triton.jit
def _pad_rows_kernel(X, Y, N, sx, D: tl.constexpr, DP: tl.constexpr, DPC: tl.constexpr, BR: tl.constexpr):
    """Y[n, :D] = X[n, :D], Y[n, D:DP] = 0 for a tile of BR rows (Y is [N, DP] contiguous)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)  # [BR]
    cols = tl.arange(0, DPC)  # [DPC]
    rmask = rows < N
    x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=rmask[:, None] & (cols[None, :] < D), other=0.0)
    tl.store(Y + rows[:, None] * DP + cols[None, :], x, mask=rmask[:, None] & (cols[None, :] < DP))


@functools.lru_cache(maxsize=256)  # the solvers pass the same few scalars every call
def _split(x: float):
    """fp32 hi/lo pair with hi + lo == x to ~48 bits (Triton passes Python floats as fp32)."""
    hi = float(np.float32(x))
    return hi, float(np.float32(x - hi))


@triton.jit
def _f64(hi, lo):
    """The float64 value of a :func:`_split` pair, in a kernel."""
    return tl.cast(hi, tl.float64) + tl.cast(lo, tl.float64)


_CONFIGS: dict = {}


def _config(P: Problem, config: dict | None, loss: bool = False) -> DenseConfig:
    """The launch of this problem (model pick, per-pass rules, the caller's overrides), memoised:
    the solvers make the same call hundreds of times per fit and its host cost adds to each."""
    X = P.X
    try:
        key = (P.N, P.D, P.m, X.dtype, X.device, X.stride(), P.acc_dtype, P.intercept, P.y is None, P.v_op, loss,
               # the values' types too: 1 == True, but only the bool passes a flag's check
               None if not config else tuple(sorted((k, type(v).__name__, v) for k, v in config.items())))
        hash(key)
    except TypeError:  # unhashable override values: no memo
        return _config_uncached(P, config, loss)
    cfg = _CONFIGS.get(key)
    if cfg is None:
        if len(_CONFIGS) > 1024:
            _CONFIGS.clear()
        cfg = _CONFIGS[key] = _config_uncached(P, config, loss)
    return cfg


def _overridden(cfg: DenseConfig, config: dict | None) -> DenseConfig:
    # the caller's overrides; a mode other than "small" drops the model's column chunks (unless given)
    cfg = cfg.with_overrides(config)
    if cfg.chunk is not None and cfg.mode != "small" and "chunk" not in (config or {}):
        cfg = replace(cfg, chunk=None)
    return cfg


def _config_uncached(P: Problem, config: dict | None, loss: bool) -> DenseConfig:
    X = P.X
    cfg = dense_config(P.N, P.D, P.m, X.dtype, gpu_info(X.device),
                       stride_xn=X.stride(0), stride_xd=X.stride(1))
    if loss:  # the loss pass's launch, then the caller's overrides on top
        try:
            cfg = loss_launch(cfg, P.D, P.m, X, P.acc_dtype)
        except NotImplementedError:
            if not (config and config.get("mode") == "small" and cfg.strategy == "onchip"):
                raise
            # rows the model composes from two reads: the unrolled one-read pass on request
            cfg = small_config(cfg, P.D, P.m, X.dtype, xtv=False, intercept=True, gpu=gpu_info(X.device),
                               stride_xn=X.stride(0), loss=True)
        cfg = loss_config(_overridden(cfg, config), P.acc_dtype, tuned=True)
    elif P.intercept and cfg.mode == "vector" and cfg.strategy == "onchip" and not cfg.prefetch:
        # the solvers' Hessian products (intercept, row weights, beta * z): H200 sweeps of 1M x 100,
        # 2M x 256 and 4M x 64 (solver_ops-H200-2026-12-03-s4-*) all preferred the register double
        # buffer with half the warps: 0.12 / 0.49 / 0.25 ms against 0.16 / 0.64 / 0.34
        cfg = replace(cfg, prefetch=True, num_warps=max(2, cfg.num_warps // 2))
    elif (cfg.mode == "small" or (P.y is None and 2 <= P.m <= SMALL_M_XTV and P.D <= SMALL_D)
          or (P.y is not None and unrolled_wide_m(P.D, P.m, X.dtype, P.v_op))):
        # the unrolled kernel: its own tile, prefetch and grid rules (launch.small_config)
        cfg = small_config(cfg, P.D, P.m, X.dtype, xtv=P.y is None, intercept=P.intercept, gpu=gpu_info(X.device),
                           stride_xn=X.stride(0), softmax=P.v_op == "softmax")
    if not loss:
        cfg = _overridden(product_config(cfg, P.D, X.dtype), config)
    if cfg.strategy not in ("onchip", "chunked", "coop") or cfg.mode not in _MODES:
        raise ValueError(f"invalid dense config: strategy={cfg.strategy!r}, mode={cfg.mode!r}")
    check_dense_launch(cfg, P.m)
    if cfg.mode == "dot" and P.acc_dtype == torch.float64:
        raise ValueError("mode='dot' is not available for float64 X (no fp64 tl.dot on the GPU)")
    if cfg.dot_precision not in ("tf32x3", "ieee"):
        raise ValueError(f"dot_precision must be 'tf32x3' or 'ieee', got {cfg.dot_precision!r}")
    if cfg.mode == "dot" and (cfg.block_d < 16 or cfg.block_n < 16):
        raise ValueError(f"mode='dot' needs block_n >= 16 and block_d >= 16 (tl.dot's smallest tile on sm_90), "
                         f"got block_n={cfg.block_n}, block_d={cfg.block_d}")
    if cfg.strategy == "onchip" and cfg.block_d < P.D:
        raise ValueError(f"strategy='onchip' needs block_d >= D = {P.D}, got {cfg.block_d}")
    if cfg.strategy == "coop" and (P.m != 1 or P.v_op != "mul"):
        raise ValueError(f"strategy='coop' serves m = 1 only (got m={P.m})")
    if cfg.mode == "small" and not (cfg.m_pad in (2, 4, 8) and P.m <= cfg.m_pad):
        raise ValueError(f"mode='small' needs m <= m_pad in (2, 4, 8); got m={P.m}, m_pad={cfg.m_pad}")
    if not (cfg.exact_m is None or isinstance(cfg.exact_m, (bool, np.bool_))):
        raise ValueError(f"config: exact_m must be None, True or False, got {cfg.exact_m!r}")
    if cfg.chunk is not None and not (cfg.mode == "small" and 4 <= cfg.chunk <= cfg.block_d
                                      and cfg.chunk & (cfg.chunk - 1) == 0):
        raise ValueError(f"chunk must be a power of two in [4, block_d = {cfg.block_d}] with mode='small', "
                         f"got {cfg.chunk} (mode {cfg.mode!r})")
    return cfg


def check_dense_launch(cfg: DenseConfig, m: int) -> None:
    """Reject a dense launch (the model's pick with the caller's ``config=`` overrides) that would
    not compile or would drop right-hand sides: tile sizes that are not powers of two, a warp
    count Triton cannot launch, ``m_pad < m``, a tile beyond Triton's largest tensor.

    Parameters
    ----------
    cfg : DenseConfig
    m : int
        Right-hand sides (columns of y).

    Raises
    ------
    ValueError
        Naming the field (``"config: ..."``).
    """
    check_launch_fields(cfg, pow2=("block_n", "block_d", "m_pad"), positive=("num_programs", "num_stages"),
                        warps=("num_warps",), flags=("two_pass",))
    # [block_n, m_pad, block_d] for the 3-D elementwise products, else [block_n, block_d] / [m_pad, block_d]
    rows = cfg.block_n * cfg.m_pad if cfg.mode == "elementwise" else max(cfg.block_n, cfg.m_pad)
    check_launch_fields(cfg, tile=rows * cfg.block_d)
    pf = cfg.prefetch
    if not (isinstance(pf, (bool, np.bool_)) or (isinstance(pf, (int, np.integer)) and 0 <= pf <= 2)):
        raise ValueError(f"config: prefetch must be True / False or 0, 1, 2, got {pf!r}")
    if cfg.max_registers is not None and not (isinstance(cfg.max_registers, (int, np.integer))
                                              and 16 <= cfg.max_registers <= 255):
        raise ValueError(f"config: max_registers must be None or an integer from 16 to 255, got {cfg.max_registers!r}")
    if cfg.mode == "vector" and m != 1:
        raise ValueError(f"config: mode='vector' serves one right-hand side, got m={m}")
    if cfg.mode in ("dot", "elementwise") and cfg.m_pad < m:
        raise ValueError(f"config: m_pad={cfg.m_pad} is below m={m} (mode {cfg.mode!r})")
    if cfg.mode == "dot" and cfg.m_pad < 16:
        raise ValueError(f"config: mode='dot' needs m_pad >= 16 (tl.dot's smallest tile on sm_90), got {cfg.m_pad}")


def loss_launch(cfg: DenseConfig, D: int, m: int, X: torch.Tensor, acc: torch.dtype) -> DenseConfig:
    """The model's loss-pass launch from :func:`dense_config`'s ``cfg`` for ``X`` ``[N, D]`` and m
    columns: the unrolled kernel's (:func:`~fusedml.mmchain.launch.small_config`) where it serves
    (m <= 4; m <= 8 as :func:`~fusedml.mmchain.launch.unrolled_wide_m` says), then
    :func:`loss_config`'s checks (``NotImplementedError``: no one-read pass for these rows)."""
    if cfg.strategy == "onchip" and (cfg.mode == "small" or unrolled_wide_m(D, m, X.dtype, "loss")):
        cfg = small_config(cfg, D, m, X.dtype, xtv=False, intercept=True, gpu=gpu_info(X.device),
                           stride_xn=X.stride(0), loss=True)
    return loss_config(cfg, acc)


#: Widest rows (block_d) of the unrolled kernel's loss pass for m > 1 (the padded tl.dot's: 128);
#: H200, 2M x 256, m = 3: 1.31 ms against 1.71 for matvec + X^T V (m58_probe-*-s18-b)
LOSS_SMALL_MAX_BD = 256


def loss_config(cfg: DenseConfig, acc: torch.dtype, tuned: bool = False) -> DenseConfig:
    """The launch of a fused loss-gradient pass: the onchip or the unrolled ("small") kernel, whose
    tiles hold whole rows.

    m = 1 takes the onchip kernel; 2 <= m <= 4, and m <= 8 on rows of at most 64 values (m = 5:
    128; :func:`~fusedml.mmchain.launch.unrolled_wide_m`), the unrolled kernel's loss epilogue (the row's
    softmax and each column's loss in registers; its tile from :func:`~fusedml.mmchain.launch.small_config`,
    set by the caller); other m <= 16 the padded ``tl.dot``. Either way the other form is available
    through ``config`` (``{"mode": "small", "m_pad": 8, ...}`` runs m <= 8 unrolled).
    Wide rows (chunked / cooperative strategies; for m > 1 rows wider than 128 values, 256 for the
    unrolled kernel, ``LOSS_SMALL_MAX_BD``) raise
    ``NotImplementedError``: the caller composes the pass from ``matvec`` and ``mmchain`` instead
    (X read twice). ``tuned``: only check and convert (the launch already adjusted, e.g. after a
    caller's overrides).
    """
    if cfg.strategy != "onchip":
        raise NotImplementedError(f"no fused loss-gradient pass for the {cfg.strategy!r} strategy (wide rows)")
    if cfg.m_pad > 1 and cfg.block_d > (LOSS_SMALL_MAX_BD if cfg.mode == "small" else 128):
        # m > 1 on rows wider than 128 values (unrolled: 256): the padded tl.dot's one read is
        # slower than two reads (H200, 2M x 256, m = 3: 4.3 ms with tf32x3 and 72 ms with FMAs,
        # against 0.96 + 0.85 for matvec + X^T V; solver_ops-*-s7-d, solver_ops_wide_unrolled-*-s8-e)
        raise NotImplementedError(f"no fused loss-gradient pass for m > 1 on rows of {cfg.block_d} values "
                                  f"(the {cfg.mode!r} mode)")
    if cfg.mode == "vector" and not tuned:
        # the epilogue's Hessian-weight store is a layout conversion (two barriers) per tile: keep
        # the next tile's loads in flight across it, with half the warps for the registers (H200
        # sweep, benchmarks/results/solver_ops-H200-2026-12-03-s4-b.json: 1M x 100 0.171 ms
        # against 0.219, 2M x 256 0.691 against 1.376, 4M x 64 0.334 against 0.436)
        return replace(cfg, prefetch=True, num_warps=max(2, cfg.num_warps // 2))
    return cfg


def _resident_programs(kernel, args, consts, warps, dev, stages=1, **options) -> int | None:
    """Programs of the compiled ``kernel`` that ``dev`` holds at once (None under the interpreter).

    From the compiled kernel's registers and shared memory, as the Triton fused-softmax tutorial
    does. The cooperative kernel needs its whole grid co-resident (programs wait on each other);
    the persistent "small" kernel's grid is capped to it (a second wave of programs doubles the
    time: 1M x 100, m = 3 at 16 warps, 86 registers, 2 x 132 programs: 0.51 ms against 0.19).
    """
    if dev.type != "cuda":
        return None
    key = (id(kernel), dev, str(args[0].dtype), tuple(sorted(consts.items())), warps, stages,
           tuple(sorted(options.items())))  # module kernels
    if key not in _RESIDENT:
        k = kernel.warmup(*args, grid=(1,), num_warps=warps, num_stages=stages, **consts, **options, **FP_FUSION)
        k._init_handles()
        gpu = gpu_info(dev)
        threads = 32 * warps
        regs = ((max(1, int(k.n_regs)) + 7) // 8) * 8
        smem = int(k.metadata.shared) + 1024  # sm_90 reserves 1 KB of shared memory per block
        per_sm = min(gpu.max_threads_per_sm // threads, gpu.regs_per_sm // (regs * threads),
                     gpu.smem_per_sm // smem, 32)
        _RESIDENT[key] = gpu.sm_count * max(1, per_sm)
    return _RESIDENT[key]


_RESIDENT: dict = {}
#: Polls of a row's tagged partials (each an L2 round trip, ~1 us) a program may spend over its whole run
#: before it stops waiting and counts an error in ``ERR`` instead of hanging (never reached when
#: the grid is co-resident: a normal run polls a few times per row).
COOP_MAX_SPIN = 1 << 20


def _launch_coop(P: Problem, cfg: DenseConfig, y, v, w, deterministic, a_hi, a_lo):
    """Launch the cooperative wide-row kernel; return (partials buffer or None, its rows R)."""
    X, N, D, acc, dev = P.X, P.N, P.D, P.acc_dtype, P.X.device
    G = triton.cdiv(D, cfg.block_d)
    consts = dict(XTY=P.y is None, HAS_V=P.v is not None, INTERCEPT=P.intercept,
                  DETERMINISTIC=bool(deterministic), EVEN_D=D % cfg.block_d == 0, ACC=_TL[acc],
                  BLOCK_D=cfg.block_d, G_PAD=triton.next_power_of_2(G), MAX_SPIN=COOP_MAX_SPIN,
                  AHEAD=1 + int(cfg.prefetch), WORDS=2 if acc == torch.float64 else 1)
    tp = torch.zeros((max(N, 1), G, consts["WORDS"]), dtype=torch.int64, device=dev)  # tags 0: nothing yet
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    R = max(1, min(N, cfg.num_programs // G))

    def args(R, part):
        return (X, y, v, w, part, tp, err, N, D, G, R, X.stride(0), X.stride(1), y.stride(0), v.stride(0),
                a_hi, a_lo)

    cap = _resident_programs(_mmchain_coop_kernel, args(R, w), dict(consts, PHASE=0), cfg.num_warps, dev)
    # one launch when a grid of G x R programs can be co-resident (R shrunk to fit); under the
    # interpreter, which runs programs one after another, only with one column block (G = 1).
    # Otherwise two launches (partials, then combine + accumulate): X read twice.
    if cfg.two_pass:
        one = False
    elif cap is None:
        one = G == 1
    else:
        one = cap >= G
        R = max(1, min(R, cap // G))
    part = _empty((R, P.Dx), acc, dev) if deterministic else w
    phases = (0,) if one else (1, 2)
    for phase in phases:
        call(_mmchain_coop_kernel, (G * R,), *args(R, part), PHASE=phase, **consts,
             num_warps=cfg.num_warps, num_stages=1)
    return (part, R) if deterministic else (None, R)


def _forced(fn):
    """A caller's ``config`` whose launch the GPU cannot hold (shared memory, registers) raises a
    ValueError naming the config, not triton's ``OutOfResources`` from inside the launch (a GPU
    fuzz case: ``block_n=64`` on the padded ``tl.dot`` of 1024-value tiles needs 324 KB)."""
    @functools.wraps(fn)
    def run(P, *args, config=None, **kw):
        try:
            return fn(P, *args, config=config, **kw)
        except OutOfResources as e:
            if not config:
                raise
            raise ValueError(f"config: the launch {config} does not fit the GPU ({e}); ask for smaller tiles "
                             "or leave the launch to the model") from e
    return run


@_forced
def dense_mmchain_fused(P: Problem, *, deterministic: bool = False, config: dict | None = None,
                        loss: tuple | None = None, out: torch.Tensor | None = None, bind: bool = False):
    """Fused dense ``w = alpha * [X,1]^T p + beta * z`` reading X once.

    Parameters
    ----------
    P : Problem
        Validated problem with a dense X on a CUDA device (or CPU under the interpreter).
    deterministic : bool
        Per-program partials reduced in a fixed order instead of float atomics.
    config : dict, optional
        Overrides of :class:`~fusedml.mmchain.launch.DenseConfig` fields.
    loss : tuple, optional
        ``(code, power, c, eta, hess)``: the loss-gradient pass (``P.v`` holds the targets; ``c``
        [N] weights or None; ``eta`` [N, m] output or None; ``hess`` [N, m] output); see
        :func:`fusedml.loss_gradient`. Only the onchip strategy (else ``NotImplementedError``).
    out : torch.Tensor, optional
        ``[Dx, m]`` contiguous, accumulation dtype: the result goes there (not with
        ``deterministic``); :class:`fusedml.BoundMMChain` passes its one buffer.
    bind : bool
        Return ``() -> result`` instead: the pass over ``P``'s operands and ``out`` (needed, not
        ``deterministic``) set up once, each call recomputing it from their current contents
        (the launch through :func:`fusedml._launch.bind`; the loss outputs reused too).

    Returns
    -------
    torch.Tensor or tuple or callable
        ``[Dx, m]`` in the accumulation dtype; with ``loss``, also the per-program sums of
        ``c * loss`` ``[P, m]``; with ``bind``, a callable returning them.
    """
    X, N, D, M, Dx, acc = P.X, P.N, P.D, P.m, P.Dx, P.acc_dtype
    cfg = _config(P, config, loss=loss is not None)
    if bind:
        if out is None or deterministic:
            raise ValueError("bind needs out (and deterministic=False)")
        if cfg.strategy == "coop":  # two launches with a grid-wide wait: set up per call
            return lambda: dense_mmchain_fused(P, config=config, loss=loss, out=out)
    n_tiles = -(-N // cfg.block_n)  # triton.cdiv costs ~3 us of host time per call
    grid = max(1, min(cfg.num_programs, n_tiles))
    dev = X.device
    has_z = P.z is not None and P.beta != 0.0
    y = P.y if P.y is not None else X.new_empty((1, 1), dtype=acc)
    v = P.v if P.v is not None else X.new_empty((1, 1), dtype=acc)
    stride_vm = 0 if v.shape[1] == 1 else v.stride(1)
    L = Dx * M
    if deterministic:
        w = _empty((Dx, M), acc, dev)
    elif bind:
        w = out
    elif out is not None:  # atomics accumulate into it: start from beta * z or zero
        w = torch.mul(P.z, P.beta, out=out) if has_z else out.zero_()
    else:
        w = (P.z * P.beta).contiguous() if has_z else torch.zeros((Dx, M), dtype=acc, device=dev)
    a_hi, a_lo = _split(P.alpha)
    if cfg.strategy == "coop":
        part, grid = _launch_coop(P, cfg, y, v, w, deterministic, a_hi, a_lo)
    else:
        consts = dict(XTY=P.y is None, HAS_V=P.v is not None, SOFTMAX=P.v_op == "softmax", INTERCEPT=P.intercept,
                      DETERMINISTIC=bool(deterministic), EVEN_D=D % cfg.block_d == 0, VEC=_vec(X, D),
                      MODE=_mode(cfg), ACC=_TL[acc], BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d, M_PAD=cfg.m_pad)
        scalars = (N, D, M, n_tiles, X.stride(0), X.stride(1), y.stride(0), y.stride(1), v.stride(0), stride_vm,
                   a_hi, a_lo)
        if cfg.strategy == "chunked":
            kernel, extra, code, power, c, eta, hw = _mmchain_chunked_kernel, {}, 0, 0.0, None, None, w
        else:
            kernel = _mmchain_small_kernel if cfg.mode == "small" else _mmchain_onchip_kernel
            exact = cfg.exact_m if cfg.exact_m is not None else (
                _EXACT_UNROLL and (loss is not None or P.v_op == "softmax"))
            if kernel is _mmchain_small_kernel and 2 <= M < cfg.m_pad and exact:
                # unrolled exactly: no padding column's FMAs and reductions. Not the plain product,
                # whose m = 3 compile ptxas schedules with the prefetch's loads late in the loop
                # (H200, 16M x 64: 2.34 ms against 1.25 padded; softmax 1.20 against 1.33;
                # m3_probe-H200-2026-12-04-s17-d)
                consts["M_PAD"] = M
            code, power, c, eta, hw = loss if loss is not None else (0, 0.0, None, None, w)
            # the unrolled kernel prefetches 1 or 2 tiles ahead, the onchip kernel 1
            extra = {"PREFETCH": int(cfg.prefetch) if kernel is _mmchain_small_kernel else bool(cfg.prefetch),
                     "LOSS": code, "HAS_C": c is not None, "STORE_ETA": eta is not None}
            if kernel is _mmchain_small_kernel:
                extra["CHUNK"] = cfg.chunk or cfg.block_d
            if M > 1 and not (config and "block_n" in config):  # rows per tile the compiler holds
                bn = _fitting_rows(P, cfg, kernel, (X, y, v, w), (c, eta, hw), scalars, consts, extra,
                                   loss is not None, deterministic)
                if bn != cfg.block_n:
                    cfg, n_tiles = replace(cfg, block_n=bn), -(-N // bn)
                    grid = max(1, min(cfg.num_programs, n_tiles))
                    consts["BLOCK_N"], scalars = bn, scalars[:3] + (n_tiles,) + scalars[4:]
        lpart = torch.empty((grid, M), dtype=torch.float64, device=dev) if loss is not None else w
        # the onchip and small kernels' loss operands, then power after the scalars
        mid = (w if c is None else c, w if eta is None else eta, lpart, hw)
        opts = {} if cfg.max_registers is None or kernel is _mmchain_chunked_kernel else {
            "maxnreg": int(cfg.max_registers)}
        if kernel is _mmchain_small_kernel:  # persistent: one wave
            cap = _resident_programs(kernel, (X, y, v, w, w) + mid + scalars + (0.0, 0.0), dict(consts, **extra),
                                     cfg.num_warps, dev, cfg.num_stages, **opts)
            if cap and cap < grid:
                grid = cap
                lpart = lpart[:grid] if loss is not None else w
                mid = mid[:2] + (lpart, hw)
        if not deterministic:
            part = w  # unused
        elif cfg.strategy == "chunked":  # read-modify-write per tile
            part = torch.zeros((grid, L), dtype=acc, device=dev)
        else:  # every program stores its whole row
            part = _empty((grid, L), acc, dev)
        lead = (X, y, v, w, part)
        if kernel is not _mmchain_chunked_kernel:
            lead, mid = lead + mid, _split(float(power))
        else:
            mid = ()
        if bind:
            go = bind_launch(kernel, (grid,), lead + scalars + mid, dict(consts, **extra), num_warps=cfg.num_warps,
                             num_stages=cfg.num_stages, **opts)
            z, beta, res = P.z, P.beta, ((w, lpart) if loss is not None else w)

            def run():
                if has_z:  # the atomics accumulate from beta * z (or zero)
                    torch.mul(z, beta, out=w)
                else:
                    w.zero_()
                go()
                return res
            run.result = res  # the buffers each call fills (a bound epilogue launch may read them)
            run.launch_only = go  # for a caller that leaves beta * z (or zero) in w itself
            return run
        launch(kernel, (grid,), lead + scalars + mid, dict(consts, **extra), num_warps=cfg.num_warps,
               num_stages=cfg.num_stages, **opts)
    if deterministic:
        z = P.z.contiguous() if has_z else w
        b_hi, b_lo = _split(P.beta)
        BLOCK = 1024
        call(_reduce_partials_kernel, (triton.cdiv(L, BLOCK),),
            part, z, w, grid, L, b_hi, b_lo, HAS_Z=has_z, ACC=_TL[acc], BLOCK=BLOCK, num_warps=4)
    return (w, lpart) if loss is not None else w


@_forced
def dense_matvec_fused(P: Problem, *, config: dict | None = None) -> torch.Tensor:
    """Fused dense ``t = [X,1] y``: persistent programs over row tiles, D walked in chunks.

    Returns
    -------
    torch.Tensor
        ``[N, m]`` in the accumulation dtype.
    """
    X, N, D, M, acc = P.X, P.N, P.D, P.m, P.acc_dtype
    cfg = matvec_config(N, D, M, X.dtype, gpu_info(X.device)).with_overrides(config)
    if cfg.mode == "dot" and acc == torch.float64:
        raise ValueError("mode='dot' is not available for float64 X")
    bd = cfg.block_d  # clipped to the row (a non-integer is rejected below)
    if isinstance(bd, (int, np.integer)):
        bd = min(bd, max(16 if cfg.mode == "dot" else 1, triton.next_power_of_2(D)))
    if cfg.mode not in ("vector", "small", "dot", "elementwise"):
        raise ValueError("config: the matvec kernel runs mode 'vector', 'small', 'dot' or 'elementwise', "
                         f"got {cfg.mode!r}")
    if cfg.mode == "small" and not 2 <= M <= MATVEC_SMALL_M:
        raise ValueError(f"config: the matvec's mode='small' serves 2 to {MATVEC_SMALL_M} right-hand sides, got m={M}")
    check_dense_launch(replace(cfg, block_d=bd), M)
    t = _empty((N, M), acc, X.device)
    y = P.y
    n_tiles = -(-N // cfg.block_n)  # triton.cdiv costs ~3 us of host time per call
    grid = (max(1, min(cfg.num_programs, n_tiles)),)
    if cfg.mode == "small":
        launch(_matvec_small_kernel, grid, (X, y, t, N, D, n_tiles, X.stride(0), X.stride(1), y.stride(0),
                                            y.stride(1)),
               dict(INTERCEPT=P.intercept, EVEN_D=D % bd == 0, VEC=_vec(X, D), ACC=_TL[acc], BLOCK_N=cfg.block_n,
                    BLOCK_D=bd, NM=M), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return t
    args = (X, y, t, N, D, M, n_tiles, X.stride(0), X.stride(1), y.stride(0), y.stride(1))

    def consts(bd):
        return dict(INTERCEPT=P.intercept, EVEN_D=D % bd == 0, VEC=_vec(X, D), MODE=_mode(cfg), ACC=_TL[acc],
                    BLOCK_N=cfg.block_n, BLOCK_D=bd, M_PAD=cfg.m_pad, ONE_CHUNK=bd >= D)
    if not (config and "block_d" in config):
        bd = fitting_block_d(_matvec_kernel, args, consts, bd, cfg.num_warps, X.device)
    launch(_matvec_kernel, grid, args, consts(bd), num_warps=cfg.num_warps)
    return t


def _fitting_rows(P: Problem, cfg: DenseConfig, kernel, lead, loss_ops, scalars, consts, extra, loss: bool,
                  deterministic: bool) -> int:
    """:func:`fitting_block_n` for an onchip / unrolled ``mmchain`` launch (its arguments at each row
    block; the per-program partials as one-element stand-ins of their dtypes)."""
    X, w = P.X, lead[3]
    c, eta, hw = loss_ops
    part = stand_in(w.dtype, w.device) if deterministic else w
    lpart = stand_in(torch.float64, w.device) if loss else w
    tail = (w if c is None else c, w if eta is None else eta, lpart, hw)

    def args(bn):
        return lead + (part,) + tail + scalars[:3] + (-(-P.N // bn),) + scalars[4:] + (0.0, 0.0)

    def consts_at(bn):
        return dict(consts, **extra, BLOCK_N=bn)
    floor = 32 if X.stride(0) == 1 and P.D > 1 else 16 if cfg.mode == "dot" else 1
    options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.max_registers is not None:
        options["maxnreg"] = int(cfg.max_registers)
    return fitting_block_n(kernel, args, consts_at, cfg.block_n, floor, options, X.device)


_FITTING: dict = {}


def fitting_block_n(kernel, args, consts, bn: int, floor: int, options: dict, dev) -> int:
    """Rows per tile of a row-tile launch: ``bn`` unless its compile uses more than
    :data:`fusedml._launch.LOCAL_BYTES_OK` of local memory per thread, then the first of ``bn / 2``,
    ``bn / 4``, ... down to ``floor`` that does not (the least-spilling where none fits). ``bn`` off
    the GPU and under the interpreter; decided once per specialisation.

    The unrolled loss pass on rows whose length is not a multiple of 16 (masked loads) fell off a
    cliff in sm_90 compiles (session 35): 1M x 55, m = 7 with the intercept at 16 rows x 4 warps
    took 32 registers and 3.6 KB of local memory on Triton 3.9 (1.1-1.3 KB on 3.6); 8 rows: 192-224 B,
    4 rows: none. 1M x 64 at the same tile: none.

    Parameters
    ----------
    kernel : triton.JITFunction
    args : callable
        ``args(bn) -> tuple``: the launch's positional arguments at ``bn`` rows per tile.
    consts : callable
        ``consts(bn) -> dict``: its constexprs.
    bn : int
        The planned rows per tile (a power of two).
    floor : int
        The fewest rows per tile the kernel takes.
    options : dict
        Launch options (``num_warps``, ``num_stages``, ``maxnreg``).
    dev : torch.device

    Returns
    -------
    int
    """
    return _halved_to_fit(kernel, args, consts, bn, floor, options, dev)


def _halved_to_fit(kernel, args, consts, first: int, floor: int, options: dict, dev) -> int:
    """``first`` or the first of ``first / 2``, ... ``floor`` whose compile of ``kernel`` (``args(t)``,
    ``consts(t)``, ``options``) stays within LOCAL_BYTES_OK (:func:`fitting_block_n`,
    :func:`fitting_block_d`); cached per specialisation (~4-8 us of host time per call)."""
    if first <= floor or dev.type != "cuda" or interpret_mode():
        return first
    key = (id(kernel), tuple(map(_key, args(first))), tuple(consts(first).items()), tuple(options.items()),
           dev.index)
    if key not in _FITTING:
        def local_bytes(t):
            return compiled_local_bytes(kernel, args(t), dict(consts(t), **options))
        ladder = [(first >> i,) for i in range(first.bit_length()) if first >> i >= floor]
        _FITTING[key] = first_fitting_tile(ladder, local_bytes)[0]
    return _FITTING[key]




def fitting_block_d(kernel, args, consts, bd: int, warps: int, dev) -> int:
    """Columns per tile of a row-tile launch: ``bd`` unless its compile uses more than
    :data:`fusedml._launch.LOCAL_BYTES_OK` of local memory per thread, then the first of ``bd / 2``,
    ``bd / 4``, ... down to 128 that does not (rows walked in chunks; the least-spilling where none
    fits). ``bd`` off the GPU and under the interpreter; decided once per specialisation.

    Triton 3.9 compiles the matvec kernel's fp32 ``tl.dot`` with the whole row's ``y^T`` held across
    row tiles (``ONE_CHUNK``) at 256-1024 columns into 32 registers and 2.5-5.8 KB of local memory
    (sm_90 compiles, session 35: the multinomial loss pass's ``[X, 1] W`` at 2M x 256, m = 5 5.4 KB),
    where Triton 3.6 holds it in 42-56 registers; 128-column chunks compile clean on both.

    Parameters
    ----------
    kernel : triton.JITFunction
    args : tuple
        The launch's positional arguments.
    consts : callable
        ``consts(bd) -> dict``: the launch's constexprs at ``bd`` columns per tile.
    bd : int
        The planned columns per tile (a power of two).
    warps : int
    dev : torch.device

    Returns
    -------
    int
    """
    return _halved_to_fit(kernel, lambda _: args, consts, bd, 128, {"num_warps": warps}, dev)
