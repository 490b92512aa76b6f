"""Triton kernels of the fused GMM E-step and their launch wrappers.

Single sweep (Turbo-GMM design, ``path="single"``): a persistent program owns a stream of row
blocks and the whole component axis. For each block it computes every component's weighted
log-density (diag/spherical: the expanded quadratic ``x^2 @ (-p/2)^T + x @ (mu p)^T + const`` as two
``tl.dot``; full: ``||(x - mu_k) P_k||^2`` per component; tied: the rows whitened once,
:func:`_tied_single_kernel`), the row's max-subtracted log-sum-exp, the responsibilities and the
statistics' partial sums (``r^T x``, ``r^T x^2`` through ``tl.dot``, per-component ``(r_k e)^T e``
for full, about each row's own centre for tied), all in one traversal of K: nothing is recomputed and
N x K never reaches memory. Partials per program, summed in float64 on the device afterwards.

For small K x D (fp32) the single sweep's products are register FMAs instead (``form="reg"``,
:func:`_diag_reg_kernel`): each thread keeps one row's features and a few components' weights and
statistics in registers for the whole row stream, so no operand goes through shared memory. Where
its partials are few (:func:`_one_launch`) the E-step is one launch: the program that counts last
(a release / acquire atomic on a per-stream count) sums every program's partials.

Two-pass (Flash-GMM design, ``path="two_pass"``) when K x D (K x D^2) does not fit on chip:
pass 1 the row's log-normaliser by an online log-sum-exp over component tiles (the same kernel
scores samples: log-likelihood and arg-max label); pass 2, a grid of (row chunk, component tile)
programs that recompute their tile's log-densities and accumulate its statistics.

Numerics: X is shifted by the global ``g`` inside the kernels (in float64 for float64 X) so the
fp32 moments do not cancel; logits are kept in log2 units (``LOG2E`` folded into the weights on the
host) so every exponential is one ``exp2``. Accumulation is fp32; the per-program partials are
combined in float64 and the moments moved to the centres ``c_k`` analytically in float64.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.errors import OutOfResources

from .._dispatch import interpret_mode
from .._validation import warn_user
from .._launch import (FP_FUSION, _compiled_resources, _stream, call, compiled_local_bytes, first_fitting_tile,
                       launch, stand_in)
from ..mmchain.dense import _FAST_MATH, _vec
from ._prep import LOG_ZERO, Prepared, diag_precisions_host, fp32_unsafe, upload
from .model import Plan, _pow2, auto_precision, full_bd, gpu_info, plan_launch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

_PREC = {"fp32": "ieee", "tf32x3": "tf32x3", "tf32": "tf32", "bf16": "bf16"}


@triton.jit
def _mm(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b with fp32 accumulation; PREC picks the operand precision."""
    if PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D):
    """[BN, BD] fp32 tile of X - g (subtraction in G's dtype: float64 for float64 X); 0 outside."""
    g = tl.load(G + offs_d, mask=offs_d < D, other=0.0)
    return _load_rows_g(X, stride_xn, stride_xd, g, rows, offs_d, N, D)


@triton.jit
def _load_rows_g(X, stride_xn, stride_xd, g, rows, offs_d, N, D):
    """As _load_rows with the shift g [BD] already loaded (hoisted out of persistent loops)."""
    nmask = rows < N
    dmask = offs_d < D
    mask = nmask[:, None] & dmask[None, :]
    x = tl.load(X + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd, mask=mask, other=0.0)
    x = (x.to(g.dtype) - g[None, :]).to(tl.float32)
    return tl.where(mask, x, 0.0)


@triton.jit
def _first_rows(X, stride_xn, stride_xd, g, rows, offs_d, N, D, BN: tl.constexpr, BD: tl.constexpr,
                PREFETCH: tl.constexpr):
    """The tile a persistent loop carries in: its first block's rows (PREFETCH), else an unused
    zero tile (defined for front ends that resolve both branches of the loop body)."""
    if PREFETCH:
        return _load_rows_g(X, stride_xn, stride_xd, g, rows.to(tl.int64), offs_d, N, D)
    else:
        return tl.zeros((BN, BD), dtype=tl.float32)


@triton.jit
def _block_rows(X, stride_xn, stride_xd, g, rows, step, x_nxt, offs_d, N, D, PREFETCH: tl.constexpr):
    """``(x, x_nxt)``: this block's [BN, BD] tile and the one to carry. PREFETCH (software
    pipelining by hand): the tile loaded one iteration earlier, and the next block's rows
    (``rows + step``) loading during this block's math; else a load now."""
    if PREFETCH:
        return x_nxt, _load_rows_g(X, stride_xn, stride_xd, g, rows.to(tl.int64) + step, offs_d, N, D)
    else:
        return _load_rows_g(X, stride_xn, stride_xd, g, rows.to(tl.int64), offs_d, N, D), x_nxt


@triton.jit
def _resp_rows(lg, acc_ll, SW, LOGP, rows, nmask, HAS_SW: tl.constexpr, WRITE_LOGP: tl.constexpr):
    """Single sweep: [BN, BK] (sample-weighted) responsibilities from log2-unit logits lg holding
    every component (0 on rows >= N), and acc_ll + the rows' (weighted) natural-log normalisers."""
    m = tl.max(lg, axis=1)
    e = tl.exp2(lg - m[:, None])
    l = tl.sum(e, axis=1)
    lse = (m + tl.log2(l)) * 0.6931471805599453  # [BN] natural log
    r = e * (1.0 / l)[:, None]
    if HAS_SW:
        sw = tl.load(SW + rows, mask=nmask, other=0.0)
        r = r * sw[:, None]
        acc_ll += tl.where(nmask, sw * lse, 0.0)
    else:
        acc_ll += tl.where(nmask, lse, 0.0)
    if WRITE_LOGP:
        tl.store(LOGP + rows, lse, mask=nmask)
    r = tl.where(nmask[:, None], r, 0.0)
    return r, acc_ll


@triton.jit
def _finish_lse(m, l, arg, acc_ll, SW, LOGP, LABEL, rows, nmask, HAS_SW: tl.constexpr, WRITE_LABEL: tl.constexpr):
    """Pass 1 / scoring: store the rows' log-normaliser (from the online max m and sum l, log2
    units) and arg-max label; return acc_ll + the (weighted) log-normalisers."""
    lse = (m + tl.log2(l)) * 0.6931471805599453
    tl.store(LOGP + rows, lse, mask=nmask)
    if WRITE_LABEL:
        tl.store(LABEL + rows, arg.to(tl.int64), mask=nmask)
    if HAS_SW:
        sw = tl.load(SW + rows, mask=nmask, other=0.0)
        acc_ll += tl.where(nmask, sw * lse, 0.0)
    else:
        acc_ll += tl.where(nmask, lse, 0.0)
    return acc_ll


# ----------------------------------------------------------------------------------------------
# diag / spherical
# ----------------------------------------------------------------------------------------------
@triton.jit
def _diag_weights(W1, W2, CONST, ks, offs_d, D, K):
    """The [BD, BK] weight tiles and [BK] constants of components ks (0 / -inf outside)."""
    kmask = ks < K
    wmask = (offs_d[:, None] < D) & kmask[None, :]
    w1 = tl.load(W1 + offs_d[:, None] * K + ks[None, :], mask=wmask, other=0.0)  # [BD, BK]
    w2 = tl.load(W2 + offs_d[:, None] * K + ks[None, :], mask=wmask, other=0.0)  # [BD, BK]
    cst = tl.load(CONST + ks, mask=kmask, other=float("-inf"))  # [BK]
    return w1, w2, cst


@triton.jit
def _diag_logits_w(x, x2, w1, w2, cst, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                   FORM: tl.constexpr):
    """[BN, BK] log2-unit logits x @ w1 + x2 @ w2 + cst. FORM "dot": two tl.dot; "bcast" (fp32):
    one broadcast multiply [BN, BD, BK] and an in-register sum over D (no operand conversions)."""
    if FORM == "bcast":
        acc = tl.sum(x[:, :, None] * w1[None, :, :] + x2[:, :, None] * w2[None, :, :], axis=1)
    else:
        acc = tl.zeros((BN, BK), dtype=tl.float32)
        acc = _mm(x, w1, acc, PREC)
        acc = _mm(x2, w2, acc, PREC)
    return acc + cst[None, :]


@triton.jit
def _diag_logits(x, x2, W1, W2, CONST, ks, offs_d, D, K, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """[BN, BK] log2-unit weighted log-densities of components ks; -inf for ks >= K."""
    w1, w2, cst = _diag_weights(W1, W2, CONST, ks, offs_d, D, K)
    return _diag_logits_w(x, x2, w1, w2, cst, BN, BK, PREC, "dot")


@triton.jit
def _diag_logits_dc(X, stride_xn, stride_xd, G, rows, W1, W2, CONST, ks, N, D, K,
                    BN: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, DC: tl.constexpr, PREC: tl.constexpr):
    """[BN, BK] logits of components ks with the feature axis in chunks of DC: X re-read per chunk
    (L1/L2 hits) so that no [BN, BD] operand stays live across the component loop (tensor-core
    operands of a large D would not fit in registers)."""
    kmask = ks < K
    offs_c = tl.arange(0, DC)
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for d0 in range(0, BD, DC):
        offs_d = d0 + offs_c
        x = _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D)  # [BN, DC]
        wmask = (offs_d[:, None] < D) & kmask[None, :]
        w1 = tl.load(W1 + offs_d[:, None] * K + ks[None, :], mask=wmask, other=0.0)  # [DC, BK]
        w2 = tl.load(W2 + offs_d[:, None] * K + ks[None, :], mask=wmask, other=0.0)
        acc = _mm(x, w1, acc, PREC)
        acc = _mm(x * x, w2, acc, PREC)
    cst = tl.load(CONST + ks, mask=kmask, other=float("-inf"))
    return acc + cst[None, :]


@triton.jit
def _diag_moments(r, x, x2, acc_nk, acc_s1, acc_s2, PREC: tl.constexpr, FORM: tl.constexpr):
    """Add the block's r^T 1, r^T x, r^T x^2 ([BK], [BK, BD], [BK, BD]) to the accumulators."""
    acc_nk += tl.sum(r, axis=0)
    if FORM == "bcast":
        rb = r[:, :, None]  # [BN, BK, 1]
        acc_s1 += tl.sum(rb * x[:, None, :], axis=0)
        acc_s2 += tl.sum(rb * x2[:, None, :], axis=0)
    else:
        rt = tl.trans(r)  # [BK, BN]
        acc_s1 = _mm(rt, x, acc_s1, PREC)
        acc_s2 = _mm(rt, x2, acc_s2, PREC)
    return acc_nk, acc_s1, acc_s2


@triton.jit
def _diag_store(PNK, PS1, PS2, slot, ks, offs_d, K, D, acc_nk, acc_s1, acc_s2):
    """Store the partial statistics of components ks into row slot ``slot`` of PNK [., K], PS1/PS2 [., K, D]."""
    kmask = ks < K
    smask = kmask[:, None] & (offs_d[None, :] < D)
    tl.store(PNK + slot * K + ks, acc_nk, mask=kmask)
    base = slot.to(tl.int64) * K * D
    tl.store(PS1 + base + ks[:, None] * D + offs_d[None, :], acc_s1, mask=smask)
    tl.store(PS2 + base + ks[:, None] * D + offs_d[None, :], acc_s2, mask=smask)


@triton.jit
def _diag_single_kernel(
    X, stride_xn, stride_xd,  # [N, D] any float dtype, any strides
    G,  # [D] shift (float64 for float64 X, else fp32)
    SW,  # [N] fp32 sample weights (HAS_SW)
    W1, W2, CONST,  # [D, K], [D, K], [K] fp32, log2 units
    LOGP,  # [N] fp32 out (WRITE_LOGP)
    PNK, PS1, PS2, PLL,  # [P, K], [P, K, D], [P, K, D] fp32 partials, [P] float64
    N, D, K, n_blocks,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    HAS_SW: tl.constexpr, WRITE_LOGP: tl.constexpr, PREC: tl.constexpr, FORM: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_k = tl.arange(0, BK)
    # loop invariants loaded once per program: the shift, the weights, the constants
    g = tl.load(G + offs_d, mask=offs_d < D, other=0.0)
    w1, w2, cst = _diag_weights(W1, W2, CONST, offs_k, offs_d, D, K)
    acc_nk = tl.zeros((BK,), dtype=tl.float32)
    acc_ll = tl.zeros((BN,), dtype=tl.float32)
    if FORM == "cat":
        # one operand [x, x^2] (interleaved columns 2d, 2d+1) against [w1; w2]: two dots per block
        # instead of four, one operand conversion each way
        w12 = tl.reshape(tl.permute(tl.join(w1, w2), (0, 2, 1)), (2 * BD, BK))  # [2 BD, BK]
        acc_s12 = tl.zeros((BK, 2 * BD), dtype=tl.float32)
        x_nxt = _first_rows(X, stride_xn, stride_xd, g, pid * BN + offs_n, offs_d, N, D, BN, BD, PREFETCH)
        for blk in range(pid, n_blocks, nprog):
            rows = blk * BN + offs_n
            nmask = rows < N
            x, x_nxt = _block_rows(X, stride_xn, stride_xd, g, rows, nprog * BN, x_nxt, offs_d, N, D, PREFETCH)
            xx = tl.reshape(tl.join(x, x * x), (BN, 2 * BD))  # [BN, 2 BD]
            lg = _mm(xx, w12, tl.zeros((BN, BK), dtype=tl.float32), PREC) + cst[None, :]
            r, acc_ll = _resp_rows(lg, acc_ll, SW, LOGP, rows, nmask, HAS_SW, WRITE_LOGP)
            acc_nk += tl.sum(r, axis=0)
            acc_s12 = _mm(tl.trans(r), xx, acc_s12, PREC)
        acc_s1, acc_s2 = tl.split(tl.reshape(acc_s12, (BK, BD, 2)))
    else:
        acc_s1 = tl.zeros((BK, BD), dtype=tl.float32)
        acc_s2 = tl.zeros((BK, BD), dtype=tl.float32)
        x_nxt = _first_rows(X, stride_xn, stride_xd, g, pid * BN + offs_n, offs_d, N, D, BN, BD, PREFETCH)
        for blk in range(pid, n_blocks, nprog):
            rows = blk * BN + offs_n  # int32 in the loop; the int64 cast only for the addresses
            nmask = rows < N
            x, x_nxt = _block_rows(X, stride_xn, stride_xd, g, rows, nprog * BN, x_nxt, offs_d, N, D, PREFETCH)
            x2 = x * x
            lg = _diag_logits_w(x, x2, w1, w2, cst, BN, BK, PREC, FORM)  # [BN, BK]
            r, acc_ll = _resp_rows(lg, acc_ll, SW, LOGP, rows, nmask, HAS_SW, WRITE_LOGP)
            acc_nk, acc_s1, acc_s2 = _diag_moments(r, x, x2, acc_nk, acc_s1, acc_s2, PREC, FORM)
    _diag_store(PNK, PS1, PS2, pid, offs_k, offs_d, K, D, acc_nk, acc_s1, acc_s2)
    tl.store(PLL + pid, tl.sum(acc_ll.to(tl.float64), axis=0))  # float64: EM's stopping test reads it


@triton.jit
def _log_normaliser(m, l):
    """``(lse, 1 / l)``: the rows' natural-log normaliser ``(m + log2 l) ln 2`` from their log2-unit
    max m and sum of exponentials l in ``[1, K]`` (the register sweeps' softmax), with the hardware
    log2 and reciprocal on the GPU (l >= 1: no range handling), the exact forms under the interpreter."""
    if _FAST_MATH:
        lse = (m + libdevice.fast_log2f(l)) * 0.6931471805599453
        rl = libdevice.fast_dividef(1.0, l)
    else:
        lse = (m + tl.log2(l)) * 0.6931471805599453
        rl = 1.0 / l
    return lse, rl


@triton.jit
def _reg_layout(BN: tl.constexpr, BD: tl.constexpr, KI: tl.constexpr, KO: tl.constexpr, D, K):
    """Index vectors of the register form's ``[BD, KI, BN, KO]`` tiles (the GMM single sweep's and
    the Lloyd step's): rows, features, component groups, the component ids ``k = ki * KO + ko``
    ``[KI, KO]``, and the feature and component masks."""
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_o = tl.arange(0, KO)
    ks = tl.arange(0, KI)[:, None] * KO + offs_o[None, :]  # [KI, KO]
    return offs_n, offs_d, offs_o, ks, offs_d < D, ks < K


@triton.jit
def _reg_rows(X, stride_xn, stride_xd, blk, BN: tl.constexpr, offs_n, offs_d, N, D, ON: tl.constexpr,
              OFF32: tl.constexpr):
    """Row block ``blk`` of X as a [BD, BN] tile in X's dtype (0 outside [N, D]); zeros when not ON
    (an unused prefetch slot). OFF32: element offsets in int32 (every offset reached, the blocks
    ahead included, is below 2^31: :func:`offsets_fit_int32`), int64 otherwise."""
    if ON:
        rows = blk * BN + offs_n
        m = (offs_d[:, None] < D) & (rows[None, :] < N)
        if OFF32:
            return tl.load(X + rows[None, :] * stride_xn + offs_d[:, None] * stride_xd, mask=m, other=0.0)
        return tl.load(X + rows.to(tl.int64)[None, :] * stride_xn + offs_d[:, None] * stride_xd, mask=m, other=0.0)
    else:
        return tl.zeros((offs_d.shape[0], BN), dtype=X.dtype.element_ty)


@triton.jit
def _reg_next(X, stride_xn, stride_xd, blk, nprog, BN: tl.constexpr, offs_n, offs_d, N, D, x_a, x_b,
              PREFETCH: tl.constexpr, OFF32: tl.constexpr):
    """``(tile of row block blk, x_a, x_b)`` for a persistent loop over blocks ``blk, blk + nprog,
    ...`` holding PREFETCH (0-2) blocks ahead in ``x_a`` / ``x_b`` (start them with :func:`_reg_rows`
    at ``pid`` and ``pid + nprog``): the next block ahead is loaded into the slot this one frees."""
    if PREFETCH == 0:
        xt = _reg_rows(X, stride_xn, stride_xd, blk, BN, offs_n, offs_d, N, D, True, OFF32)
    elif PREFETCH == 1:
        xt = x_a
        x_a = _reg_rows(X, stride_xn, stride_xd, blk + nprog, BN, offs_n, offs_d, N, D, True, OFF32)
    else:
        xt = x_a
        x_a = x_b
        x_b = _reg_rows(X, stride_xn, stride_xd, blk + 2 * nprog, BN, offs_n, offs_d, N, D, True, OFF32)
    return xt, x_a, x_b


@triton.jit
def _diag_reg_kernel(
    X, stride_xn, stride_xd,  # [N, D] any float dtype, any strides
    G,  # [D] shift (float64 for float64 X, else fp32)
    SW,  # [N] fp32 sample weights (HAS_SW)
    W1, W2, CONST,  # [D, K], [D, K], [K] fp32, log2 units
    LOGP,  # [N] fp32 out (WRITE_LOGP)
    PNK, PS1, PS2, PLL,  # [P, K], [P, K, D], [P, K, D] fp32 partials, [P] float64
    CP, OUT, CNT,  # FINISH: [K, D] float64 centres minus the shift, float64 [1 + K + 2 K D] out, int32 [1] zero
    N, D, K, n_blocks,
    BN: tl.constexpr, BD: tl.constexpr, KI: tl.constexpr, KO: tl.constexpr,
    HAS_SW: tl.constexpr, WRITE_LOGP: tl.constexpr, PREFETCH: tl.constexpr = 2, SPH: tl.constexpr = False,
    OFF32: tl.constexpr = False, FINISH: tl.constexpr = False, FBP: tl.constexpr = 1, FBKD: tl.constexpr = 1,
):
    """Single sweep with register FMAs, for small K x D (``form="reg"``): tiles are
    [BD, KI, BN, KO]. Triton's default layout gives threads to the trailing axes first, so the
    feature axis and KI components lie within each thread (their weights and statistics held in
    registers across the whole row stream: no shared-memory operands, no shuffles in the sums),
    rows and KO component groups across threads (component k = ki * KO + ko). The statistics
    accumulate per thread and are reduced over rows once, at the end. PREFETCH (0-2): row blocks
    loaded ahead (a block is 1-2 KB, so one load in flight per program cannot cover DRAM latency).
    SPH (spherical): the quadratic term ``p_k |x|^2`` and the second moment ``sum r |x|^2`` per row
    and component (W2's row 0 holds ``-p_k / 2`` in log2 units; the moment goes to PS2's feature 0,
    zeros elsewhere, so the finishing kernel's per-feature centring sums to the spherical one).
    FINISH (one launch per E-step, for small ``P x K x D``): the program that stores the last
    partials (counted in CNT, which it resets to zero) also sums them (:func:`_finish_flat`, one
    ``[FBP, FBKD]`` block, ``FBKD >= K x D``) into OUT."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n, offs_d, offs_o, ks, dmask, kmask = _reg_layout(BN, BD, KI, KO, D, K)
    g = tl.load(G + offs_d, mask=dmask, other=0.0)
    wmask = dmask[:, None, None] & kmask[None, :, :]  # [BD, KI, KO]
    woff = offs_d[:, None, None] * K + ks[None, :, :]
    w1 = tl.load(W1 + woff, mask=wmask, other=0.0)[:, :, None, :]  # [BD, KI, 1, KO]
    if SPH:
        w2 = tl.load(W2 + ks, mask=kmask, other=0.0)[:, None, :]  # [KI, 1, KO]
        acc_s2 = tl.zeros((KI, BN, KO), dtype=tl.float32)
    else:
        w2 = tl.load(W2 + woff, mask=wmask, other=0.0)[:, :, None, :]
        acc_s2 = tl.zeros((BD, KI, BN, KO), dtype=tl.float32)
    cst = tl.load(CONST + ks, mask=kmask, other=float("-inf"))[:, None, :]  # [KI, 1, KO]
    acc_s1 = tl.zeros((BD, KI, BN, KO), dtype=tl.float32)
    acc_nk = tl.zeros((KI, BN, KO), dtype=tl.float32)
    acc_ll = tl.zeros((BN, KO), dtype=tl.float32)  # row sums in the ko == 0 column: no layout change
    x_a = _reg_rows(X, stride_xn, stride_xd, pid, BN, offs_n, offs_d, N, D, PREFETCH >= 1, OFF32)
    x_b = _reg_rows(X, stride_xn, stride_xd, pid + nprog, BN, offs_n, offs_d, N, D, PREFETCH >= 2, OFF32)
    for blk in range(pid, n_blocks, nprog):
        rows = blk * BN + offs_n
        nmask = rows < N
        xt, x_a, x_b = _reg_next(X, stride_xn, stride_xd, blk, nprog, BN, offs_n, offs_d, N, D, x_a, x_b, PREFETCH,
                                 OFF32)
        # rows past N hold -g: finite, and their responsibilities and normaliser are masked below
        xt = (xt.to(g.dtype) - g[:, None]).to(tl.float32)  # [BD, BN]
        x = xt[:, None, :, None]  # [BD, 1, BN, 1]
        if SPH:
            x2 = tl.sum(xt * xt, axis=0)[None, :, None]  # [1, BN, 1] |x|^2
            lg = tl.sum(x * w1, axis=0) + x2 * w2 + cst  # [KI, BN, KO]
        else:
            x2 = x * x
            # sum_d x (w1 + x w2): one in-thread product sum per component (Horner form)
            lg = tl.sum(x * (x * w2 + w1), axis=0) + cst  # [KI, BN, KO]
        m = tl.max(tl.max(lg, axis=0), axis=1)  # [BN]
        e = tl.exp2(lg - m[None, :, None])
        l = tl.sum(tl.sum(e, axis=0), axis=1)  # [BN] in [1, K]
        lse, rl = _log_normaliser(m, l)
        r = e * rl[None, :, None]
        if HAS_SW:
            sw = tl.load(SW + rows, mask=nmask, other=0.0)
            r = r * sw[None, :, None]
            lse_w = sw * lse
        else:
            lse_w = lse
        acc_ll += tl.where(nmask[:, None] & (offs_o[None, :] == 0), lse_w[:, None], 0.0)
        if WRITE_LOGP:
            tl.store(LOGP + rows, lse, mask=nmask)
        r = tl.where(nmask[None, :, None], r, 0.0)
        acc_nk += r
        acc_s1 += x * r[None, :, :, :]
        if SPH:
            acc_s2 += x2 * r
        else:
            acc_s2 += x2 * r[None, :, :, :]
    base = pid.to(tl.int64) * K * D
    tl.store(PNK + pid * K + ks, tl.sum(acc_nk, axis=1), mask=kmask)
    soff = base + ks[None, :, :] * D + offs_d[:, None, None]  # [BD, KI, KO] -> [k, d]
    tl.store(PS1 + soff, tl.sum(acc_s1, axis=2), mask=wmask)
    if SPH:
        tl.store(PS2 + soff, tl.where(offs_d[:, None, None] == 0, tl.sum(acc_s2, axis=1)[None, :, :], 0.0), mask=wmask)
    else:
        tl.store(PS2 + soff, tl.sum(acc_s2, axis=2), mask=wmask)
    tl.store(PLL + pid, tl.sum(tl.sum(acc_ll.to(tl.float64), axis=1), axis=0))  # float64, as above
    if FINISH:
        # every thread's partials are stored before the count; the release / acquire pair of the
        # count makes all programs' partials visible to the program that counts last
        tl.debug_barrier()
        if tl.atomic_add(CNT, 1, sem="acq_rel", scope="gpu") == nprog - 1:
            _finish_flat(PNK, PS1, PS2, PLL, CP, OUT, nprog, nprog, K, D, 0, FBP, FBKD)
            tl.atomic_xchg(CNT, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _diag_lse_kernel(
    X, stride_xn, stride_xd,  # [N, D]
    G, SW,  # [D], [N]
    W1, W2, CONST,  # [D, K], [D, K], [K] log2 units
    LOGP,  # [N] fp32 out: log sum_k pi_k N(x | k)
    LABEL,  # [N] int64 out (WRITE_LABEL)
    PLL,  # [P] float64 partial log-likelihood
    N, D, K, n_blocks,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    HAS_SW: tl.constexpr, WRITE_LABEL: tl.constexpr, PREC: tl.constexpr, DC: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_k = tl.arange(0, BK)
    acc_ll = tl.zeros((BN,), dtype=tl.float32)
    for blk in range(pid, n_blocks, nprog):
        rows = blk * BN + offs_n.to(tl.int64)
        nmask = rows < N
        if DC == BD:  # the whole feature axis on chip across the component loop
            x = _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D)
            x2 = x * x
        m = tl.full((BN,), float("-inf"), tl.float32)
        l = tl.zeros((BN,), dtype=tl.float32)
        best = tl.full((BN,), float("-inf"), tl.float32)
        arg = tl.zeros((BN,), dtype=tl.int32)
        for k0 in range(0, K, BK):
            if DC == BD:
                lg = _diag_logits(x, x2, W1, W2, CONST, k0 + offs_k, offs_d, D, K, BN, BK, PREC)
            else:
                lg = _diag_logits_dc(X, stride_xn, stride_xd, G, rows, W1, W2, CONST, k0 + offs_k, N, D, K,
                                     BN, BK, BD, DC, PREC)
            tmax = tl.max(lg, axis=1)
            if WRITE_LABEL:
                targ = tl.argmax(lg, axis=1).to(tl.int32)
                upd = tmax > best
                arg = tl.where(upd, k0 + targ, arg)
                best = tl.where(upd, tmax, best)
            m_new = tl.maximum(m, tmax)
            l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(lg - m_new[:, None]), axis=1)
            m = m_new
        acc_ll = _finish_lse(m, l, arg, acc_ll, SW, LOGP, LABEL, rows, nmask, HAS_SW, WRITE_LABEL)
    tl.store(PLL + pid, tl.sum(acc_ll.to(tl.float64), axis=0))  # float64: EM's stopping test reads it


@triton.jit
def _diag_stats_kernel(
    X, stride_xn, stride_xd,  # [N, D]
    G, SW,  # [D], [N]
    W1, W2, CONST,  # [D, K], [D, K], [K] log2 units
    LOGP,  # [N] fp32 from pass 1
    PNK, PS1, PS2,  # [C, K], [C, K, D], [C, K, D] fp32 partials per row chunk
    N, D, K, n_kt, chunk_rows,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    HAS_SW: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    chunk = pid // n_kt  # component tiles of one chunk are neighbours: X re-reads hit L2
    kt = pid % n_kt
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    ks = kt * BK + tl.arange(0, BK)
    g = tl.load(G + offs_d, mask=offs_d < D, other=0.0)
    w1, w2, cst = _diag_weights(W1, W2, CONST, ks, offs_d, D, K)  # this program's tile, loaded once
    acc_nk = tl.zeros((BK,), dtype=tl.float32)
    acc_s1 = tl.zeros((BK, BD), dtype=tl.float32)
    acc_s2 = tl.zeros((BK, BD), dtype=tl.float32)
    row0 = chunk.to(tl.int64) * chunk_rows
    for b in range(0, chunk_rows, BN):
        rows = row0 + b + offs_n
        nmask = rows < N
        x = _load_rows_g(X, stride_xn, stride_xd, g, rows, offs_d, N, D)
        x2 = x * x
        lg = _diag_logits_w(x, x2, w1, w2, cst, BN, BK, PREC, "dot")
        lse = tl.load(LOGP + rows, mask=nmask, other=0.0) * 1.4426950408889634
        r = tl.exp2(lg - lse[:, None])
        if HAS_SW:
            sw = tl.load(SW + rows, mask=nmask, other=0.0)
            r = r * sw[:, None]
        r = tl.where(nmask[:, None], r, 0.0)
        acc_nk, acc_s1, acc_s2 = _diag_moments(r, x, x2, acc_nk, acc_s1, acc_s2, PREC, "dot")
    _diag_store(PNK, PS1, PS2, chunk, ks, offs_d, K, D, acc_nk, acc_s1, acc_s2)


@triton.jit
def _finish_flat(PNK, PS1, PS2, PLL, CP, OUT, P, PL, K, D, j, BP: tl.constexpr, BKD: tl.constexpr):
    """Sum the partial statistics of flat entries ``k * D + d`` in ``[j BKD, (j + 1) BKD)`` over
    their P rows in float64 (a fixed order) and move the moments from the shift to the centres
    (``s1 = S1 - nk c'``, ``s2 = S2 - 2 c' S1 + nk c'^2``); block 0 also sums the PL
    log-likelihood partials. Partials are read from L2 (``.cg``): in the one-launch sweep they were
    written by other programs of the same launch."""
    offs_p = tl.arange(0, BP)
    offs = j * BKD + tl.arange(0, BKD)
    KD = K * D
    fmask = offs < KD
    kof = offs // D
    acc_n = tl.zeros((BP, BKD), dtype=tl.float64)
    acc_1 = tl.zeros((BP, BKD), dtype=tl.float64)
    acc_2 = tl.zeros((BP, BKD), dtype=tl.float64)
    for p0 in range(0, P, BP):
        ps = p0 + offs_p
        m = (ps < P)[:, None] & fmask[None, :]
        acc_n += tl.load(PNK + ps[:, None] * K + kof[None, :], mask=m, other=0.0, cache_modifier=".cg").to(tl.float64)
        off = ps.to(tl.int64)[:, None] * KD + offs[None, :]
        acc_1 += tl.load(PS1 + off, mask=m, other=0.0, cache_modifier=".cg").to(tl.float64)
        acc_2 += tl.load(PS2 + off, mask=m, other=0.0, cache_modifier=".cg").to(tl.float64)
    nk = tl.sum(acc_n, axis=0)  # [BKD] N_k of each entry's component
    S1 = tl.sum(acc_1, axis=0)
    S2 = tl.sum(acc_2, axis=0)
    cp = tl.load(CP + offs, mask=fmask, other=0.0)
    tl.store(OUT + 1 + K + offs, S1 - nk * cp, mask=fmask)
    tl.store(OUT + 1 + K + KD + offs, S2 - 2.0 * cp * S1 + nk * cp * cp, mask=fmask)
    tl.store(OUT + 1 + kof, nk, mask=fmask & (offs == kof * D))
    if j == 0:
        acc_l = tl.zeros((BP,), dtype=tl.float64)
        for p0 in range(0, PL, BP):
            ps = p0 + offs_p
            acc_l += tl.load(PLL + ps, mask=ps < PL, other=0.0, cache_modifier=".cg").to(tl.float64)
        tl.store(OUT, tl.sum(acc_l, axis=0))


@triton.jit
def _diag_finish_kernel(
    PNK, PS1, PS2, PLL,  # [P, K], [P, K, D], [P, K, D] fp32, [P] float64 partials (programs or row chunks)
    CP,  # [K, D] float64 centres minus the shift
    OUT,  # float64 [1 + K + 2 K D]: ll, nk, s1 [K, D], s2 [K, D]
    P, PL, K, D,  # rows of the statistics' partials, of PLL (two-pass: pass 1's programs)
    BP: tl.constexpr, BKD: tl.constexpr,
):
    """The partials' float64 finish (:func:`_finish_flat`) as its own launch: one launch where
    torch took ~16. Program j: flat statistics entries ``[j BKD, (j + 1) BKD)``."""
    _finish_flat(PNK, PS1, PS2, PLL, CP, OUT, P, PL, K, D, tl.program_id(0), BP, BKD)


# ----------------------------------------------------------------------------------------------
# full / tied
# ----------------------------------------------------------------------------------------------
@triton.jit
def _full_logit(x, MU, P, CONST, k, stride_pk, offs_d, D, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr):
    """[BN] log2-unit weighted log-density of component k: const_k - ||(x - mu_k) P_k||^2 log2(e) / 2.
    MU [K, BD] and P [K, BD, BD] are zero-padded to BD on the host: unmasked, vectorised loads
    (masked [BD, BD] loads at 16 < D < BD spilled: sm_90, 1M x 24, K = 20, 64 rows, 336 B)."""
    mu = tl.load(MU + k * BD + offs_d)  # [BD]
    d = x - mu[None, :]  # padded columns stay 0: x and mu are 0 there
    pk = tl.load(P + k * stride_pk + offs_d[:, None] * BD + offs_d[None, :])  # [BD, BD]
    y = _mm(d, pk, tl.zeros((BN, BD), dtype=tl.float32), PREC)
    q = tl.sum(y * y, axis=1)
    return tl.load(CONST + k) - 0.7213475204444817 * q  # 0.5 * log2(e)


@triton.jit
def _full_centred(x, ck, rk, nmask, dmask):
    """Rows centred on c_k, 0 outside [N, D] (ev [BN, BD]), and ev weighted by rk [BN] (re)."""
    ev = tl.where(nmask[:, None] & dmask[None, :], x - ck[None, :], 0.0)
    re = ev * rk[:, None]
    return ev, re


@triton.jit
def _full_single_kernel(
    X, stride_xn, stride_xd,  # [N, D]
    G, SW,  # [D], [N]
    MU,  # [K, BD] fp32 shifted means (zero-padded to BD, as P and C)
    P, stride_pk,  # [K, BD, BD] fp32 precision Cholesky (tied: stride_pk = 0)
    CONST,  # [K] fp32 log2 units
    C,  # [K, BD] fp32 shifted centres
    LOGP,  # [N] fp32 out (WRITE_LOGP)
    PNK, PS1, PS2, PLL,  # [P, K], [P, K, BD], [P, K, BD, BD] (tied: [P, BD, BD]), [P] float64
    N, D, K, n_blocks,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    HAS_SW: tl.constexpr, WRITE_LOGP: tl.constexpr, TIED: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_k = tl.arange(0, BK)
    dmask = offs_d < D
    dd_offs = offs_d[:, None] * BD + offs_d[None, :]
    acc_nk = tl.zeros((BK,), dtype=tl.float32)
    acc_ll = tl.zeros((BN,), dtype=tl.float32)
    acc_t = tl.zeros((BD, BD), dtype=tl.float32)  # tied: sum over k in registers
    p64 = pid.to(tl.int64)
    for blk in range(pid, n_blocks, nprog):
        rows = blk * BN + offs_n.to(tl.int64)
        nmask = rows < N
        x = _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D)
        lg = tl.full((BN, BK), float("-inf"), tl.float32)
        for k in range(K):
            lgk = _full_logit(x, MU, P, CONST, k, stride_pk, offs_d, D, BN, BD, PREC)
            lg = tl.where(offs_k[None, :] == k, lgk[:, None], lg)
        r, acc_ll = _resp_rows(lg, acc_ll, SW, LOGP, rows, nmask, HAS_SW, WRITE_LOGP)
        acc_nk += tl.sum(r, axis=0)
        for k in range(K):
            rk = tl.sum(tl.where(offs_k[None, :] == k, r, 0.0), axis=1)  # [BN]
            ck = tl.load(C + k * BD + offs_d)
            ev, re = _full_centred(x, ck, rk, nmask, dmask)
            s1p = PS1 + (p64 * K + k) * BD + offs_d
            tl.store(s1p, tl.load(s1p) + tl.sum(re, axis=0))
            s2k = _mm(tl.trans(re), ev, tl.zeros((BD, BD), dtype=tl.float32), PREC)
            if TIED:
                acc_t += s2k
            else:
                s2p = PS2 + (p64 * K + k) * BD * BD + dd_offs
                tl.store(s2p, tl.load(s2p) + s2k)
    tl.store(PNK + pid * K + offs_k, acc_nk, mask=offs_k < K)
    if TIED:
        tl.store(PS2 + p64 * BD * BD + dd_offs, acc_t)
    tl.store(PLL + pid, tl.sum(acc_ll.to(tl.float64), axis=0))  # float64: EM's stopping test reads it


@triton.jit
def _whiten(x, P, offs_d, D, BN: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr, MASKED: tl.constexpr):
    """[BN, BD] rows z = x P with the shared precision Cholesky P [BD, BD] (tied; zero-padded). P is
    re-read per call (L1 / L2): held across a row loop it costs registers (it spilled at D = 128).
    MASKED: load only the [D, D] corner. Chosen per kernel from sm_90 compiles at D = 64: pass 1
    spilled in its loop unmasked (Triton 3.9, 24 B), the single sweep masked (3.6, 32 B)."""
    if MASKED:
        dmask = offs_d < D
        pt = tl.load(P + offs_d[:, None] * BD + offs_d[None, :], mask=dmask[:, None] & dmask[None, :], other=0.0)
    else:
        pt = tl.load(P + offs_d[:, None] * BD + offs_d[None, :])
    return _mm(x, pt, tl.zeros((BN, BD), dtype=tl.float32), PREC)


@triton.jit
def _tied_logit(z, MUP, CONST, k, offs_d, BD: tl.constexpr):
    """[BN] log2-unit weighted log-density of tied component k from the whitened rows z: one
    subtraction ``z - (mu_k - shift) P`` (MUP) and a norm, no [BN, BD] x [BD, BD] product."""
    mk = tl.load(MUP + k * BD + offs_d)  # [K, BD] zero-padded
    d = z - mk[None, :]  # padded columns stay 0: z and mk are 0 there
    return tl.load(CONST + k) - 0.7213475204444817 * tl.sum(d * d, axis=1)  # 0.5 * log2(e)


@triton.jit
def _tied_logits(z, MUP, CONST, offs_k, offs_d, K, BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr):
    """[BN, BK] log2-unit logits of every component (-inf for k >= K) from the whitened rows
    z = (x - shift) P (:func:`_tied_logit` per component)."""
    lg = tl.full((BN, BK), float("-inf"), tl.float32)
    for k in range(K):
        lg = tl.where(offs_k[None, :] == k, _tied_logit(z, MUP, CONST, k, offs_d, BD)[:, None], lg)
    return lg


@triton.jit
def _tied_single_kernel(
    X, stride_xn, stride_xd,  # [N, D]
    G, SW,  # [D], [N]
    MUP,  # [K, BD] fp32 whitened shifted means (mu_k - shift) P (zero-padded to BD, as P and C)
    P,  # [BD, BD] fp32 shared precision Cholesky
    CONST,  # [K] fp32 log2 units
    C,  # [K, BD] fp32 shifted centres
    LOGP,  # [N] fp32 out (WRITE_LOGP)
    PNK, PS1, PS2, PR, PLL,  # [P, K], [P, K, BD], [P, BD, BD], [P, K, K], [P] float64
    N, D, K, n_blocks,
    BN: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
    HAS_SW: tl.constexpr, WRITE_LOGP: tl.constexpr, PREC: tl.constexpr,
):
    """Tied single sweep: per row block one [BN, BD] x [BD, BD] transform, the K logits by
    subtraction (:func:`_tied_logits`), and statistics about each row's own centre c_a (a: its
    largest responsibility): u = x - c_a, g = sum_k r_k (c_a - c_k), so that
    ``sum_k r_k (x - c_k)(x - c_k)^T = w u u^T + u g^T + g u^T + sum_k r_k (c_a - c_k)(c_a - c_k)^T``
    (w = sum_k r_k). The kernel accumulates ``r^T u`` [BK, BD], ``(w u + 2 g)^T u`` [BD, BD] (its
    symmetric part is the first three terms) and ``R = onehot(a)^T r`` [BK, BK]; the host adds the
    centre-difference terms from R in float64. Every product stays about the rows' own centres (no
    fp32 cancellation), at ~4 BD^2 + 7 BK BD + 2 BK^2 flops per row against the full kernel's 4 K BD^2."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    offs_k = tl.arange(0, BK)
    dmask = offs_d < D
    kmask = offs_k < K
    acc_nk = tl.zeros((BK,), dtype=tl.float32)
    acc_ll = tl.zeros((BN,), dtype=tl.float32)
    acc_s1 = tl.zeros((BK, BD), dtype=tl.float32)
    acc_s2 = tl.zeros((BD, BD), dtype=tl.float32)
    acc_r = tl.zeros((BK, BK), dtype=tl.float32)
    for blk in range(pid, n_blocks, nprog):
        rows = blk * BN + offs_n.to(tl.int64)
        nmask = rows < N
        x = _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D)
        z = _whiten(x, P, offs_d, D, BN, BD, PREC, False)
        lg = _tied_logits(z, MUP, CONST, offs_k, offs_d, K, BN, BD, BK)
        r, acc_ll = _resp_rows(lg, acc_ll, SW, LOGP, rows, nmask, HAS_SW, WRITE_LOGP)  # 0 on rows >= N
        acc_nk += tl.sum(r, axis=0)
        a = tl.argmax(lg, axis=1)  # [BN] each row's own component
        own = offs_k[None, :] == a[:, None]  # [BN, BK]
        ca = tl.load(C + a[:, None] * BD + offs_d[None, :])  # [BN, BD]
        u = tl.where(nmask[:, None] & dmask[None, :], x - ca, 0.0)
        ro = tl.where(own, 0.0, r)  # the other components' responsibilities: g without cancellation
        # C re-read per block (L1 / L2), as P in _whiten
        cmat = tl.load(C + offs_k[:, None] * BD + offs_d[None, :], mask=kmask[:, None], other=0.0)
        g = tl.sum(ro, axis=1)[:, None] * ca - _mm(ro, cmat, tl.zeros((BN, BD), dtype=tl.float32), PREC)
        w = tl.sum(r, axis=1)
        acc_s1 = _mm(tl.trans(r), u, acc_s1, PREC)
        acc_s2 = _mm(tl.trans(w[:, None] * u + 2.0 * g), u, acc_s2, PREC)
        acc_r = tl.dot(tl.trans(own.to(tl.float32)), r, acc_r, input_precision="ieee")  # fp32 sums of r
    p64 = pid.to(tl.int64)
    tl.store(PNK + pid * K + offs_k, acc_nk, mask=kmask)
    tl.store(PS1 + (p64 * K + offs_k[:, None]) * BD + offs_d[None, :], acc_s1, mask=kmask[:, None])
    tl.store(PS2 + p64 * BD * BD + offs_d[:, None] * BD + offs_d[None, :], acc_s2)
    tl.store(PR + (p64 * K + offs_k[:, None]) * K + offs_k[None, :], acc_r, mask=kmask[:, None] & kmask[None, :])
    tl.store(PLL + pid, tl.sum(acc_ll.to(tl.float64), axis=0))  # float64: EM's stopping test reads it


@triton.jit
def _full_lse_kernel(
    X, stride_xn, stride_xd,  # [N, D]
    G, SW,  # [D], [N]
    MU, P, stride_pk, CONST,  # [K, BD], [K, BD, BD], [K] (zero-padded to BD)
    LOGP, LABEL, PLL,  # [N] fp32, [N] int64, [P] float64
    N, D, K, n_blocks,
    BN: tl.constexpr, BD: tl.constexpr,
    HAS_SW: tl.constexpr, WRITE_LABEL: tl.constexpr, PREC: tl.constexpr, TIED: tl.constexpr = False,
):
    """Pass 1 / scoring of full and tied components; TIED: MU holds the whitened means
    (mu_k - shift) P, the rows are transformed once per block (:func:`_whiten`, :func:`_tied_logit`)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    acc_ll = tl.zeros((BN,), dtype=tl.float32)
    for blk in range(pid, n_blocks, nprog):
        rows = blk * BN + offs_n.to(tl.int64)
        nmask = rows < N
        x = _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D)
        if TIED:
            z = _whiten(x, P, offs_d, D, BN, BD, PREC, True)
        m = tl.full((BN,), float("-inf"), tl.float32)
        l = tl.zeros((BN,), dtype=tl.float32)
        arg = tl.zeros((BN,), dtype=tl.int32)
        for k in range(K):
            if TIED:
                lgk = _tied_logit(z, MU, CONST, k, offs_d, BD)
            else:
                lgk = _full_logit(x, MU, P, CONST, k, stride_pk, offs_d, D, BN, BD, PREC)
            if WRITE_LABEL:
                arg = tl.where(lgk > m, k, arg)
            m_new = tl.maximum(m, lgk)
            l = l * tl.exp2(m - m_new) + tl.exp2(lgk - m_new)
            m = m_new
        acc_ll = _finish_lse(m, l, arg, acc_ll, SW, LOGP, LABEL, rows, nmask, HAS_SW, WRITE_LABEL)
    tl.store(PLL + pid, tl.sum(acc_ll.to(tl.float64), axis=0))  # float64: EM's stopping test reads it


@triton.jit
def _full_stats_kernel(
    X, stride_xn, stride_xd,  # [N, D]
    G, SW,  # [D], [N]
    MU, P, stride_pk, CONST, C,  # [K, BD], [K, BD, BD], [K], [K, BD] (zero-padded to BD)
    LOGP,  # [N] fp32 from pass 1
    PNK, PS1, PS2,  # [Ch, K], [Ch, K, BD], [Ch, K, BD, BD] partials per row chunk
    N, D, K, chunk_rows,
    BN: tl.constexpr, BD: tl.constexpr,
    HAS_SW: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    chunk = pid // K  # the K programs of one chunk are neighbours: X re-reads hit L2
    k = pid % K
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    dmask = offs_d < D
    ck = tl.load(C + k * BD + offs_d)
    acc_nk = tl.zeros((BN,), dtype=tl.float32)
    acc_s1 = tl.zeros((BD,), dtype=tl.float32)
    acc_s2 = tl.zeros((BD, BD), dtype=tl.float32)
    row0 = chunk.to(tl.int64) * chunk_rows
    for b in range(0, chunk_rows, BN):
        rows = row0 + b + offs_n
        nmask = rows < N
        x = _load_rows(X, stride_xn, stride_xd, G, rows, offs_d, N, D)
        lgk = _full_logit(x, MU, P, CONST, k, stride_pk, offs_d, D, BN, BD, PREC)
        lse = tl.load(LOGP + rows, mask=nmask, other=0.0) * 1.4426950408889634
        rk = tl.exp2(lgk - lse)
        if HAS_SW:
            rk = rk * tl.load(SW + rows, mask=nmask, other=0.0)
        rk = tl.where(nmask, rk, 0.0)
        ev, re = _full_centred(x, ck, rk, nmask, dmask)
        acc_nk += rk
        acc_s1 += tl.sum(re, axis=0)
        acc_s2 = _mm(tl.trans(re), ev, acc_s2, PREC)
    c64 = chunk.to(tl.int64)
    tl.store(PNK + c64 * K + k, tl.sum(acc_nk, axis=0))
    tl.store(PS1 + (c64 * K + k) * BD + offs_d, acc_s1)
    tl.store(PS2 + (c64 * K + k) * BD * BD + offs_d[:, None] * BD + offs_d[None, :], acc_s2)


# ----------------------------------------------------------------------------------------------
# launch wrappers
# ----------------------------------------------------------------------------------------------
def _operands(prep: Prepared):
    """Kernel-side parameter tensors (fp32, log2 units), the shift in X's compute dtype and the
    float64 centres, derived on the host and sent to the device in one copy."""
    h = prep.host
    f32 = np.float32
    mup = h["mu"] - h["shift"]  # [K, D] float64
    cp = h["center"] - h["shift"]
    arrays = {"G": h["shift"].astype(np.float64 if prep.X.dtype == torch.float64 else f32), "center": h["center"]}
    if prep.covariance_type in ("diag", "spherical"):
        p = diag_precisions_host(prep)  # [K, D]
        arrays["W1"] = (LOG2E * mup * p).T.astype(f32)  # [D, K]
        arrays["W2"] = (-0.5 * LOG2E * p).T.astype(f32)  # [D, K]
        arrays["CONST"] = (LOG2E * (h["const"] - 0.5 * (mup * mup * p).sum(1))).astype(f32)
        arrays["CP"] = cp  # [K, D] float64, for the finish
    else:  # zero-padded to the kernels' BD: unmasked [BD, BD] loads and partial stores
        pad = full_bd(prep.D) - prep.D
        arrays["MU"] = np.pad(mup, ((0, 0), (0, pad))).astype(f32)
        pc = h["prec_chol"]
        arrays["P"] = np.pad(pc, ((0, 0),) * (pc.ndim - 2) + ((0, pad), (0, pad))).astype(f32)
        if prep.covariance_type == "tied":  # the whitened means of the tied kernels: (mu_k - shift) P
            arrays["MUP"] = np.pad(mup @ pc, ((0, 0), (0, pad))).astype(f32)
        arrays["CONST"] = (LOG2E * h["const"]).astype(f32)
        arrays["C"] = np.pad(cp, ((0, 0), (0, pad))).astype(f32)
    ops = upload(arrays, prep.device)
    prep._dev.setdefault("center", ops["center"])
    if prep.covariance_type in ("full", "tied"):
        ops["stride_pk"] = 0 if prep.covariance_type == "tied" else full_bd(prep.D) ** 2
    return ops


def device_operands(X, weights, means, prec_chol, covariance_type):
    """:func:`_operands` (diag / spherical) from float64 parameter tensors on X's device.

    The same float64 derivation as :func:`fusedml.gmm._prep.validate` and :func:`_operands`, in
    torch ops on the device: no host copy and no synchronisation, so the E-step can follow an
    M-step in one queue (and one CUDA graph). The centres are the means.

    Parameters
    ----------
    X : torch.Tensor
        ``[N, D]`` data (its dtype picks the shift's).
    weights, means, prec_chol : torch.Tensor
        float64 ``[K]``, ``[K, D]``, ``[K, D]`` (diag) or ``[K]`` (spherical), valid (not checked).
    covariance_type : {"diag", "spherical"}

    Returns
    -------
    dict
        ``G``, ``W1``, ``W2``, ``CONST``, ``CP`` as :func:`_operands` returns them.
    """
    f64 = torch.float64
    K, D = means.shape
    logdet = torch.log(prec_chol).sum(1) if covariance_type == "diag" else D * torch.log(prec_chol)
    logw = torch.where(weights > 0, torch.log(weights.clamp(min=1e-300)), torch.full_like(weights, LOG_ZERO))
    const = logw + logdet - 0.5 * D * math.log(2 * math.pi)
    shift = (weights[:, None] * means).sum(0)
    if X.dtype != f64:  # exactly representable in fp32, as validate makes it
        shift = shift.to(torch.float32).to(f64)
    mup = means - shift  # [K, D]
    p = prec_chol * prec_chol
    if covariance_type == "spherical":
        p = p[:, None].expand(K, D)
    return {"G": shift if X.dtype == f64 else shift.to(torch.float32),
            "W1": (LOG2E * mup * p).T.to(torch.float32).contiguous(),
            "W2": (-0.5 * LOG2E * p).T.to(torch.float32).contiguous(),
            "CONST": (LOG2E * (const - 0.5 * (mup * mup * p).sum(1))).to(torch.float32),
            "CP": mup}


@triton.jit
def _mstep_operands_kernel(
    LL, NK, S1, S2,  # [1], [K], [K, D], [K, D] (spherical: [K]) float64: statistics about C
    C,  # [K, D] float64 the E-step's centres (its means)
    W, MEANS, COV, PC,  # out: [K], [K, D], [K, D] or [K], [K, D] or [K] float64
    G, W1, W2, CONST, CP,  # out: the next E-step's operands (see _operands)
    SCAL,  # out: [3] float64 (log-likelihood, covariance entries <= 0, the next operands' fp32_quad)
    REG,  # [1] float64 reg_covar (a Python float argument would be fp32)
    K, D,
    SPH: tl.constexpr, X64: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # one program: gmm_mstep's arithmetic (diag / spherical) and device_operands' derivation, so an
    # EM iteration is the E-step's two launches and this one. float64 constants through tl.full (a
    # Python float literal is an fp32 constant)
    log2e = tl.full((), 1.4426950408889634, tl.float64)
    eps10 = tl.full((), 2.220446049250313e-15, tl.float64)  # 10 x float64 eps
    log2pi = tl.full((), 1.8378770664093453, tl.float64)
    tiny = tl.full((), 1e-300, tl.float64)
    log_zero = tl.full((), -1.0e30, tl.float64)
    reg_covar = tl.load(REG)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    km = offs_k < K
    dm = offs_d < D
    m2 = km[:, None] & dm[None, :]
    kd = offs_k[:, None] * D + offs_d[None, :]
    nk_raw = tl.load(NK + offs_k, mask=km, other=0.0)
    nk = nk_raw + eps10
    c = tl.load(C + kd, mask=m2, other=0.0)
    s1 = tl.load(S1 + kd, mask=m2, other=0.0)
    means = (s1 + nk_raw[:, None] * c) / nk[:, None]
    delta = tl.where(m2, means - c, 0.0)
    if SPH:
        s2 = tl.load(S2 + offs_k, mask=km, other=1.0)
        cov = (s2 - 2 * tl.sum(delta * s1, 1) + nk_raw * tl.sum(delta * delta, 1)) / (nk * D) + reg_covar
        bad = tl.sum(tl.where(km & (cov <= 0), 1.0, 0.0), 0)
        pc = 1.0 / tl.sqrt(cov)  # [BLOCK_K]
        tl.store(COV + offs_k, cov, mask=km)
        tl.store(PC + offs_k, pc, mask=km)
        logdet = D * tl.log(pc)
        p = tl.where(m2, (pc * pc)[:, None] + 0.0 * delta, 0.0)  # [BLOCK_K, BLOCK_D]
    else:
        s2 = tl.load(S2 + kd, mask=m2, other=1.0)
        cov = (s2 - 2 * delta * s1 + nk_raw[:, None] * delta * delta) / nk[:, None] + reg_covar
        bad = tl.sum(tl.sum(tl.where(m2 & (cov <= 0), 1.0, 0.0), 1), 0)
        pc = 1.0 / tl.sqrt(cov)
        tl.store(COV + kd, cov, mask=m2)
        tl.store(PC + kd, pc, mask=m2)
        logdet = tl.sum(tl.where(m2, tl.log(pc), 0.0), 1)
        p = tl.where(m2, pc * pc, 0.0)
    w = tl.where(km, nk / tl.sum(tl.where(km, nk, 0.0), 0), 0.0)
    tl.store(W + offs_k, w, mask=km)
    tl.store(MEANS + kd, means, mask=m2)
    logw = tl.where(w > 0, tl.log(tl.maximum(w, tiny)), log_zero)
    const = logw + logdet - 0.5 * D * log2pi
    shift = tl.sum(tl.where(m2, w[:, None] * means, 0.0), 0)  # [BLOCK_D]
    if X64:
        tl.store(G + offs_d, shift, mask=dm)
    else:  # exactly representable in fp32, as validate makes it
        shift = shift.to(tl.float32).to(tl.float64)
        tl.store(G + offs_d, shift.to(tl.float32), mask=dm)
    mup = tl.where(m2, means - shift[None, :], 0.0)
    dk = offs_d[None, :] * K + offs_k[:, None]  # the [D, K] layout of W1 / W2
    tl.store(W1 + dk, (log2e * mup * p).to(tl.float32), mask=m2)
    tl.store(W2 + dk, (-0.5 * log2e * p).to(tl.float32), mask=m2)
    tl.store(CONST + offs_k, (log2e * (const - 0.5 * tl.sum(mup * mup * p, 1))).to(tl.float32), mask=km)
    tl.store(CP + kd, mup, mask=m2)
    tl.store(SCAL, tl.load(LL))
    tl.store(SCAL + 1, bad)
    # the next E-step's fp32 quadratic size (fusedml.gmm._prep.fp32_quad, shifted_quad)
    tl.store(SCAL + 2, tl.max(tl.where(km, tl.sum(mup * mup * p, 1), 0.0), 0) + D)


#: the largest padded K x D of :func:`mstep_operands`' one program (float64 tiles in registers)
MSTEP_MAX_TILE = 4096


def mstep_operands_applies(K: int, D: int, covariance_type: str) -> bool:
    """Whether :func:`mstep_operands` takes K components of D features (diag / spherical, padded
    ``K x D <= MSTEP_MAX_TILE``)."""
    return (covariance_type in ("diag", "spherical")
            and triton.next_power_of_2(K) * triton.next_power_of_2(D) <= MSTEP_MAX_TILE)


def mstep_operands(stats, means, reg_covar, covariance_type, x_dtype, out):
    """One launch: the M-step (diag / spherical) and the next E-step's operands, on the device.

    :func:`fusedml.gmm.mstep_tensors`' arithmetic followed by :func:`device_operands`' (the new
    parameters' kernel operands), written into ``out``'s buffers: an EM iteration becomes the
    E-step's two launches and this one (~45 small launches in torch ops).

    Parameters
    ----------
    stats : tuple
        ``(log_likelihood, nk, s1, s2)`` float64 from :func:`estep_device` (about ``means``).
    means : torch.Tensor
        ``[K, D]`` float64, the parameters the E-step used.
    reg_covar : torch.Tensor
        ``[1]`` float64 on the device.
    covariance_type : {"diag", "spherical"}
    x_dtype : torch.dtype
        The data's dtype (float64 data: a float64 shift).
    out : dict
        Buffers ``weights``, ``means``, ``covariances``, ``precisions_cholesky`` (float64) and the
        operands ``G``, ``W1``, ``W2``, ``CONST``, ``CP`` (:func:`device_operands`' shapes and
        dtypes), and ``scal`` ``[3]`` float64: (log-likelihood, how many covariance entries are
        not positive: 0 when the M-step succeeded, the new parameters'
        :func:`fusedml.gmm._prep.fp32_quad`).

    Returns
    -------
    dict
        ``out``.
    """
    ll, nk, s1, s2 = stats
    K, D = means.shape
    BK, BD = triton.next_power_of_2(K), triton.next_power_of_2(D)
    if not mstep_operands_applies(K, D, covariance_type):
        raise ValueError(f"mstep_operands: K={K}, D={D}, {covariance_type!r} is beyond its one program")
    launch(_mstep_operands_kernel, (1,),
           (ll, nk, s1, s2, means, out["weights"], out["means"], out["covariances"], out["precisions_cholesky"],
            out["G"], out["W1"], out["W2"], out["CONST"], out["CP"], out["scal"], reg_covar, K, D),
           dict(SPH=covariance_type == "spherical", X64=x_dtype == torch.float64, BLOCK_K=BK, BLOCK_D=BD),
           num_warps=4 if BK * BD <= 1024 else 8)
    return out


def estep_device(X, weights, means, prec_chol, covariance_type, *, sample_weight=None, precision="auto", plan=None,
                 ops=None):
    """Fused E-step (diag / spherical) for trusted parameters that live on X's device.

    What :func:`fusedml.gmm.gmm_estep` computes with ``center=means``, without its checks and
    host round trip: the operands come from :func:`device_operands`, so nothing synchronises the
    host and the call can be captured in a CUDA graph (``GaussianMixture``'s EM loop on a GPU).
    Callers validate X and produce the parameters themselves (an M-step's output).

    Parameters
    ----------
    X : torch.Tensor
        ``[N, D]`` float data on a CUDA device (or the CPU under ``TRITON_INTERPRET=1``).
    weights, means, prec_chol : torch.Tensor
        float64 parameters on X's device (see :func:`device_operands`).
    covariance_type : {"diag", "spherical"}
    sample_weight : torch.Tensor, optional
        ``[N]`` float32 contiguous row weights.
    precision : str
        As :func:`fusedml.gmm.gmm_estep`'s (``"auto"`` resolved per shape).
    plan : Plan, optional
        A launch plan (default: the model's).
    ops : dict, optional
        The parameters' operands, already derived (:func:`mstep_operands` writes them); default
        :func:`device_operands`.

    Returns
    -------
    tuple
        ``(log_likelihood, nk, s1, s2)`` float64 on the device, the statistics about the means.
    """
    if covariance_type not in ("diag", "spherical"):
        raise ValueError(f"estep_device takes diag or spherical parameters, got {covariance_type!r}")
    K, D = means.shape
    # the problem's shape only: _estep_plan reads no parameter of it (they are in ``ops``)
    prep = Prepared(X, sample_weight, covariance_type, K, D, X.shape[0], host={})
    if precision == "auto":
        precision = auto_precision(prep.N, K, D, covariance_type, X.device, X.dtype)
    if plan is None:
        plan = plan_launch(prep.N, K, D, covariance_type, X.dtype, X.device, precision=precision)
    if ops is None:
        ops = device_operands(X, weights, means, prec_chol, covariance_type)
    return _estep_plan(prep, False, plan.precision or precision, plan, ops)[1:]


_RESIDENT: dict = {}


def resident_programs(kernel, args, kwargs, device) -> int | None:
    """Programs of ``kernel`` one SM holds at once, from its COMPILED resources.

    The launch model's register and shared-memory estimates are coarse (sm_90 compiles used
    80-100 registers where it estimated 140-200, so the persistent grids ran at 4-8 warps per SM);
    the compiled kernel knows: registers (allocated per warp in units of 256), shared memory
    (+1 KB reserved per block), at most 64 warps and 32 blocks per SM.

    Parameters
    ----------
    kernel : triton JITFunction
    args : tuple
        The launch's positional arguments.
    kwargs : dict
        The launch's keyword arguments (constexprs, ``num_warps``, ``num_stages``).
    device : torch.device

    Returns
    -------
    int or None
        Programs per SM (>= 1); None where unknown (no CUDA device, the interpreter, or a Triton
        without ``warmup``): the caller keeps the model's grid.
    """
    if device.type != "cuda" or not hasattr(kernel, "warmup"):
        return None
    key = _resource_key(kernel, args, kwargs, device)
    if key not in _RESIDENT:
        res = _compiled_resources(kernel, args, kwargs)
        _RESIDENT[key] = None if res is None else _programs_per_sm(res[0], res[1], kwargs, device)
    return _RESIDENT[key]


def _resource_key(kernel, args, kwargs, device) -> tuple:
    return (getattr(kernel, "__name__", id(kernel)), device.index, args[0].dtype,
            tuple(sorted((k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))))


_FITTED: dict = {}


def fitted_plan(plan: Plan, kernel, args, consts, key, n_rows: int, device) -> Plan:
    """``plan`` at the first of its own tile and ``plan.fallback`` whose compile of ``kernel`` uses at
    most :data:`fusedml._launch.LOCAL_BYTES_OK` of local memory per thread
    (:func:`fusedml._launch.first_fitting_tile`); ``plan`` itself where it has no fallback, off the
    GPU and under the interpreter. Decided once per ``key``.

    The full single sweep's tiles were timed with Triton 3.6; Triton 3.9 compiles the same kernel
    with about twice the registers per row and spills 0.3-1.2 KB inside the row loop at them
    (:func:`fusedml.gmm.model._full_single_tiles`).

    Parameters
    ----------
    plan : Plan
    kernel : triton.JITFunction
    args : callable
        ``args(BN) -> tuple``: the launch's positional arguments at row block ``BN``.
    consts : dict
        The launch's constexprs but ``BN``.
    key : tuple
        What else specialises the compile (flags, dtypes, strides, the row count).
    n_rows : int
        Rows of the launch (a fallback's grid).
    device : torch.device

    Returns
    -------
    Plan
        With ``BN``, ``num_warps``, ``num_stages`` and ``programs`` of the chosen tile, no fallback.
    """
    if not plan.fallback or device.type != "cuda" or interpret_mode():
        return plan
    key = (plan, key, device.index)
    if key not in _FITTED:
        def local_bytes(bn, nw, ns, per_sm):
            return compiled_local_bytes(kernel, args(bn), dict(consts, BN=bn, num_warps=nw, num_stages=ns))
        bn, nw, ns, per_sm = first_fitting_tile(((plan.BN, plan.num_warps, plan.num_stages, 0), *plan.fallback),
                                                local_bytes)
        fit = replace(plan, fallback=())
        if per_sm:  # a fallback: its grid (the plan's own keeps the plan's)
            n_blocks = -(-n_rows // bn)
            fit = replace(fit, BN=bn, num_warps=nw, num_stages=ns, lse_BN=bn, lse_warps=nw,
                          programs=max(1, min(n_blocks, gpu_info(device)["sm_count"] * per_sm)))
        _FITTED[key] = fit
    return _FITTED[key]


def _programs_per_sm(regs: int, smem: int, kwargs, device, by_regs_only: bool = False) -> int:
    """Programs per SM of a compiled kernel: registers (per warp in units of 256), shared memory
    (+1 KB per block), at most 64 warps and 32 blocks; ``by_regs_only``: the register bound alone."""
    info = gpu_info(device)
    nw = int(kwargs.get("num_warps", 4))
    warp_regs = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = int(info["regs_per_sm"]) // (warp_regs * nw)
    if by_regs_only:
        return by_regs
    return max(1, min(32, 64 // nw, by_regs, int(info.get("smem_per_sm") or 233472) // (smem + 1024)))


_CAPS: dict = {}
#: local memory a capped compile may use (words): 8 bytes at D = 8, K = 8 (Triton 3.6, outside the
#: row loop); the slow caps spilled 80-120 bytes into it
_CAP_SPILL_WORDS = 4


def register_cap(kernel, args, kwargs, device) -> int:
    """Registers per thread (Triton's ``maxnreg``) that let one more program of ``kernel`` reside
    per SM than its own compile does, where registers are what binds and the compile at that cap
    spills at most a few words; 0 otherwise (keep the compiler's count), and off the GPU.

    The register-form kernels (the GMM single sweep, the Lloyd step) hold a row's features and
    their components' weights and statistics in registers for the whole row stream, and each row's
    softmax is a serial chain of shuffles and MUFU operations that only other warps can hide. With
    Triton 3.6, ptxas took 177-180 registers at D = 16, K = 16 and D = 8, K = 8 (two programs of 4
    warps per SM) and fits both in 168 without spilling: three programs, 4M x 16, K = 16 0.457 ->
    0.378 ms on the H200 (session 23). Caps that spill (1M x 2, K = 128 at 168: 104 bytes) were
    slower, hence the check (at most ``_CAP_SPILL_WORDS``).

    Parameters
    ----------
    kernel : triton JITFunction
    args : tuple
        The launch's positional arguments.
    kwargs : dict
        The launch's keyword arguments (constexprs, ``num_warps``, ``num_stages``), without ``maxnreg``.
    device : torch.device

    Returns
    -------
    int
        The cap, or 0.
    """
    if device.type != "cuda" or not hasattr(kernel, "warmup"):
        return 0
    key = _resource_key(kernel, args, kwargs, device)
    if key not in _CAPS:
        cap, res = 0, _compiled_resources(kernel, args, kwargs)
        if res is not None:
            regs, smem, _ = res
            per_sm = _programs_per_sm(regs, smem, kwargs, device)
            if per_sm == _programs_per_sm(regs, smem, kwargs, device, by_regs_only=True):  # registers bind
                nw = int(kwargs.get("num_warps", 4))
                want = (int(gpu_info(device)["regs_per_sm"]) // ((per_sm + 1) * nw * 32)) // 8 * 8
                if 64 <= want < regs:
                    capped = _compiled_resources(kernel, args, dict(kwargs, maxnreg=want))
                    if (capped is not None and capped[2] <= _CAP_SPILL_WORDS
                            and _programs_per_sm(capped[0], capped[1], kwargs, device) > per_sm):
                        cap = want
        _CAPS[key] = cap
    return _CAPS[key]


def _grid(kernel, args, kwargs, device, n_blocks, model_programs, max_programs=None) -> int:
    """Persistent grid: every program resident at once (compiled resources), at most one per
    block and ``max_programs`` (bounds the per-program partials); the model's count elsewhere."""
    per_sm = resident_programs(kernel, args, kwargs, device)
    if per_sm is None:
        P = model_programs
    else:
        P = gpu_info(device)["sm_count"] * per_sm
    if max_programs is not None:
        P = min(P, max_programs)
    return max(1, min(n_blocks, P))


def _partials(dev, sizes, n_ll):
    """fp32 partial buffers of ``sizes`` elements and a float64 ``[n_ll]`` one for the per-program
    log-likelihoods, views of ONE allocation (a host-bound call: one allocation, not five)."""
    n32 = sum(sizes) + (sum(sizes) & 1)  # the float64 view starts 8-byte aligned
    buf = torch.empty(n32 + 2 * n_ll, dtype=torch.float32, device=dev)
    return list(buf[:sum(sizes)].split_with_sizes(sizes)) + [buf[n32:].view(torch.float64)]


def _sw(prep: Prepared, dummy: torch.Tensor):
    if prep.sample_weight is None:
        return dummy, False
    return prep.sample_weight.to(torch.float32).contiguous(), True


def _lse_pass(prep: Prepared, ops, plan: Plan, sw, has_sw, want_label, prec):
    """Pass 1 / scoring: log-normaliser per row (and arg-max label); returns (logp, labels, pll)."""
    X, N, D, K = prep.X, prep.N, prep.D, prep.K
    dev = X.device
    logp = torch.empty(N, dtype=torch.float32, device=dev)
    labels = torch.empty(N if want_label else 1, dtype=torch.int64, device=dev)
    n_blocks = -(-N // plan.lse_BN)
    P = max(1, min(n_blocks, plan.lse_programs))
    pll = torch.empty(P, dtype=torch.float64, device=dev)
    if prep.covariance_type in ("diag", "spherical"):
        call(_diag_lse_kernel, (P,),
            X, X.stride(0), X.stride(1), ops["G"], sw, ops["W1"], ops["W2"], ops["CONST"], logp, labels, pll,
            N, D, K, n_blocks, BN=plan.lse_BN, BD=plan.BD, BK=plan.lse_BK, HAS_SW=has_sw, WRITE_LABEL=want_label,
            DC=plan.DC, PREC=prec, num_warps=plan.lse_warps, num_stages=plan.num_stages)
    else:
        tied = prep.covariance_type == "tied"
        call(_full_lse_kernel, (P,),
            X, X.stride(0), X.stride(1), ops["G"], sw, ops["MUP" if tied else "MU"], ops["P"], ops["stride_pk"],
            ops["CONST"], logp, labels, pll, N, D, K, n_blocks, BN=plan.BN, BD=plan.BD, HAS_SW=has_sw,
            WRITE_LABEL=want_label, PREC=prec, TIED=tied, num_warps=plan.num_warps, num_stages=plan.num_stages)
    return logp, (labels if want_label else None), pll


def offsets_fit_int32(X: torch.Tensor, rows: int, cols: int) -> bool:
    """Whether every element offset ``r * stride(0) + c * stride(1)`` of X with ``r < rows`` and
    ``c < cols`` (the padded tile, blocks loaded ahead included) fits int32, so a kernel may
    compute them without 64-bit arithmetic (masked lanes' offsets included)."""
    return rows * abs(X.stride(0)) + cols * abs(X.stride(1)) < 2 ** 31


#: one launch per register-form E-step (the last program finishes) where the finish reads at most
#: this many padded partial values (``P x pow2(K x D)``): 16 blocks of 512 in one program. Such
#: E-steps (small K x D at up to a few million rows) are host-bound, and the second launch cost
#: more host time than its GPU work.
_ONE_LAUNCH_VALUES = 8192


def _one_launch(P: int, K: int, D: int, dev) -> tuple | None:
    """``(FBP, FBKD)`` finish blocks of the register-form sweep's one-launch E-step, or None (two
    launches: large ``P x K x D``, or a CUDA graph being captured, whose replays need no host
    time and must not share the count with eager launches)."""
    fbkd = _pow2(K * D, 1)
    if P * fbkd > _ONE_LAUNCH_VALUES or (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return None
    return max(1, 512 // fbkd), fbkd


_COUNTERS: dict = {}


def _counter(dev) -> torch.Tensor:
    """The one-launch E-step's int32 count (zero between launches: the program that counts last
    resets it), one per device and stream, since launches on one stream run in order. The stream is
    the one the launch takes (:func:`fusedml._launch._stream`, ~1 us; ``torch.cuda.current_stream``
    builds a Stream object, 7-9 us on the H200 hosts)."""
    key = (dev, _stream() if dev.type == "cuda" else None)
    t = _COUNTERS.get(key)
    if t is None:
        t = _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=dev)
    return t


def _mma_vec(X: torch.Tensor, D: int) -> int:
    """The tensor-core E-step's ``VEC`` (:func:`fusedml.mmchain.dense._vec`), 1 where the JIT's own
    specialisation already proves it (D and the row stride multiples of 16: the launch as timed).
    sm_90 (Triton 3.9): an aligned view of rows of 15 loads its X tile in one 16-byte load per thread
    and row as rows of 16 do (four scalar loads as given; H100, 4M x 15, K = 16: 0.528 ms against
    0.551 as given and 0.542 at D = 16), rows of 16 at a row stride of 20 or 24 likewise. The
    register form has no VEC: its views lost with or without it (`gmm_odd_width_probe-H100-*-s44`)."""
    return 1 if D % 16 == 0 and X.stride(0) % 16 == 0 else _vec(X, D)


def _diag_single_launch(plan: Plan, has_sw: bool, write_logp: bool, prec: str, off32: bool = False,
                        finish: tuple | None = None):
    """``(kernel, constexprs, launch options)`` of the diag single sweep in the plan's form;
    ``off32``: the register form's row offsets in int32 (:func:`offsets_fit_int32`); ``finish``:
    the register form's one-launch finish blocks (:func:`_one_launch`)."""
    kw = dict(BN=plan.BN, HAS_SW=has_sw, WRITE_LOGP=write_logp)
    opts = dict(num_warps=plan.num_warps, num_stages=plan.num_stages)
    if plan.maxnreg > 0:
        opts["maxnreg"] = plan.maxnreg
    if plan.form == "reg":
        bd, ki, ko = plan.reg
        fbp, fbkd = finish or (1, 1)
        return _diag_reg_kernel, dict(kw, BD=bd, KI=ki, KO=ko, PREFETCH=int(plan.prefetch), SPH=plan.sph,
                                      OFF32=off32, FINISH=finish is not None, FBP=fbp, FBKD=fbkd), opts
    return (_diag_single_kernel, dict(kw, BD=plan.BD, BK=plan.BK, PREC=prec, FORM=plan.form, PREFETCH=plan.prefetch),
            opts)


_GRIDS: dict = {}


def _full_fitted(prep: Prepared, ops, plan: Plan, sw, has_sw: bool, write_logp: bool, prec) -> Plan:
    """The full single sweep's plan at a tile that compiles without spilling (:func:`fitted_plan`)."""
    X, N, D, K = prep.X, prep.N, prep.D, prep.K
    dev = X.device

    def args(bn):  # the launch's arguments; partials and the row output as 1-element stand-ins
        f32 = stand_in(torch.float32, dev)
        return (X, X.stride(0), X.stride(1), ops["G"], sw, ops["MU"], ops["P"], ops["stride_pk"], ops["CONST"],
                ops["C"], f32, f32, f32, f32, stand_in(torch.float64, dev), N, D, K, -(-N // bn))
    consts = dict(BD=plan.BD, BK=plan.BK, HAS_SW=has_sw, WRITE_LOGP=write_logp, TIED=False, PREC=prec)
    return fitted_plan(plan, _full_single_kernel, args, consts, (N, X.dtype, X.stride(), has_sw, write_logp, prec),
                       N, dev)


def _estep_plan(prep: Prepared, return_log_prob: bool, precision: str, plan: Plan, ops):
    """One fused E-step with a fixed plan (may raise triton's OutOfResources at launch)."""
    X, N, D, K = prep.X, prep.N, prep.D, prep.K
    dev = X.device
    f32, f64 = torch.float32, torch.float64
    ct = prep.covariance_type
    prec = _PREC[precision]
    dummy = stand_in(torch.float32, dev)
    sw, has_sw = _sw(prep, dummy)
    full_like = ct in ("full", "tied")
    if full_like and plan.BD != full_bd(D):  # the operands are padded to full_bd(D) (_operands)
        raise ValueError(f"a full / tied plan needs BD = {full_bd(D)} for D = {D}, got {plan.BD}")
    if plan.form == "mma":
        mma_out = _mma_estep(prep, ops, plan, sw if has_sw else None, return_log_prob)
        if mma_out is not None:
            return mma_out
        # strided or non-fp32 X, or a layout the fragments do not assume: the register form
        plan = plan_launch(N, K, D, ct, X.dtype, dev, precision="fp32")
        prec = _PREC["fp32"]
    if plan.path == "single":
        if plan.fallback:  # the full sweep's tile: one that compiles without spilling (fitted_plan)
            plan = _full_fitted(prep, ops, plan, sw, has_sw, return_log_prob, prec)
        n_blocks = -(-N // plan.BN)  # host arithmetic: triton.cdiv is a ~3 us JIT call per use
        if not full_like:  # blocks up to 2 * P past the last are formed (P <= n_blocks), masked
            off32 = offsets_fit_int32(X, 3 * n_blocks * plan.BN, plan.BD)
            kern, consts, opts = _diag_single_launch(plan, has_sw, return_log_prob, prec, off32)
        if full_like or not plan.occupancy_grid:
            P = max(1, min(n_blocks, plan.programs))
        else:
            gkey = (plan, N, has_sw, return_log_prob, prec, X.dtype, dev)
            P, cap = _GRIDS.get(gkey, (None, 0))
            if P is None:
                args = ((X, X.stride(0), X.stride(1), ops["G"], sw, ops["W1"], ops["W2"], ops["CONST"])
                        + (dummy,) * (8 if plan.form == "reg" else 5) + (N, D, K, n_blocks))
                if plan.form == "reg" and plan.maxnreg == 0:  # one more program per SM where it fits
                    cap = register_cap(kern, args, {**consts, **opts}, dev)
                # partials: P x K x D x 2 fp32, kept under ~32 MB
                P = _grid(kern, args, {**consts, **opts, **({"maxnreg": cap} if cap else {})}, dev, n_blocks,
                          plan.programs, max(1, (32 << 20) // (8 * plan.BK * plan.BD + 8)))
                if len(_GRIDS) < 4096:
                    _GRIDS[gkey] = (P, cap)
            if cap:
                opts["maxnreg"] = cap
        logp = torch.empty(N, dtype=f32, device=dev) if return_log_prob else dummy
        if ct == "tied" and plan.BK <= TIED_MAX_BK:
            return (logp if return_log_prob else None,) + _tied_single(prep, ops, plan, P, n_blocks, sw, has_sw,
                                                                       logp, return_log_prob, prec)
        if full_like:
            pnk = torch.empty(P, K, dtype=f32, device=dev)
            pll = torch.empty(P, dtype=torch.float64, device=dev)
            BD = plan.BD  # the kernel's padded feature tile (zeros beyond D)
            ps1 = torch.zeros(P, K, BD, dtype=f32, device=dev)
            ps2 = torch.zeros((P, BD, BD) if ct == "tied" else (P, K, BD, BD), dtype=f32, device=dev)
            call(_full_single_kernel, (P,),
                X, X.stride(0), X.stride(1), ops["G"], sw, ops["MU"], ops["P"], ops["stride_pk"], ops["CONST"],
                ops["C"], logp, pnk, ps1, ps2, pll, N, D, K, n_blocks, BN=plan.BN, BD=plan.BD, BK=plan.BK,
                HAS_SW=has_sw, WRITE_LOGP=return_log_prob, TIED=(ct == "tied"), PREC=prec,
                num_warps=plan.num_warps, num_stages=plan.num_stages)
        else:
            # the partials [P, K], [P, K, D], [P, K, D], [P] in one allocation
            pnk, ps1, ps2, pll = _partials(dev, [P * K, P * K * D, P * K * D], P)
            args = (X, X.stride(0), X.stride(1), ops["G"], sw, ops["W1"], ops["W2"], ops["CONST"], logp, pnk, ps1, ps2,
                    pll)
            finish = _one_launch(P, K, D, dev) if plan.form == "reg" else None
            if finish is not None:  # the last program sums the partials: one launch
                out = torch.empty(1 + K + 2 * K * D, dtype=f64, device=dev)
                consts = dict(consts, FINISH=True, FBP=finish[0], FBKD=finish[1])
                launch(kern, (P,), args + (ops["CP"], out, _counter(dev), N, D, K, n_blocks), consts, **opts)
                return (logp if return_log_prob else None,) + _finish_views(prep, out)
            launch(kern, (P,), args + ((dummy,) * 3 if plan.form == "reg" else ()) + (N, D, K, n_blocks), consts,
                   **opts)
        lp_out = logp if return_log_prob else None
    else:
        logp, _, pll = _lse_pass(prep, ops, plan, sw, has_sw, False, prec)
        lp_out = logp if return_log_prob else None
        chunk_rows = plan.chunk_rows
        n_chunks = -(-N // chunk_rows)
        pnk = torch.empty(n_chunks, K, dtype=f32, device=dev)
        if full_like:  # partials in the kernels' padded feature tile
            ps1 = torch.empty(n_chunks, K, plan.BD, dtype=f32, device=dev)
            ps2 = torch.empty(n_chunks, K, plan.BD, plan.BD, dtype=f32, device=dev)
            call(_full_stats_kernel, (n_chunks * K,),
                X, X.stride(0), X.stride(1), ops["G"], sw, ops["MU"], ops["P"], ops["stride_pk"], ops["CONST"],
                ops["C"], logp, pnk, ps1, ps2, N, D, K, chunk_rows, BN=plan.BN, BD=plan.BD, HAS_SW=has_sw,
                PREC=prec, num_warps=plan.num_warps, num_stages=plan.num_stages)
            if ct == "tied":
                ps2 = ps2.sum(1)
        else:
            ps1 = torch.empty(n_chunks, K, D, dtype=f32, device=dev)
            ps2 = torch.empty(n_chunks, K, D, dtype=f32, device=dev)
            n_kt = -(-K // plan.BK_tile)
            call(_diag_stats_kernel, (n_chunks * n_kt,),
                X, X.stride(0), X.stride(1), ops["G"], sw, ops["W1"], ops["W2"], ops["CONST"], logp,
                pnk, ps1, ps2, N, D, K, n_kt, chunk_rows, BN=plan.BN, BD=plan.BD, BK=plan.BK_tile,
                HAS_SW=has_sw, PREC=prec, num_warps=plan.num_warps, num_stages=plan.num_stages)
    if not full_like:
        return (lp_out,) + _diag_finish(prep, ops, pnk, ps1, ps2, pll)
    ll = pll.to(f64).sum()
    nk = pnk.to(f64).sum(0)
    s1 = ps1[..., :D].to(f64).sum(0)
    s2 = ps2[..., :D, :D].to(f64).sum(0)
    s2 = 0.5 * (s2 + s2.transpose(-1, -2))
    return lp_out, ll, nk, s1, s2


_MMA_OK: dict = {}


def _mma_estep(prep: Prepared, ops, plan: Plan, sw: torch.Tensor | None, want_logp: bool):
    """``(logp or None, ll, nk, s1, s2)`` of the tensor-core diag single sweep (:mod:`fusedml.gmm.mma`;
    ``sw``: fp32 contiguous row weights), or None where it does not apply: X not fp32 with unit
    feature stride, or (checked once per compiled launch) a layout of Triton's that is not the one
    its register fragments assume."""
    from . import mma

    X, N, D, K = prep.X, prep.N, prep.D, prep.K
    if X.dtype != torch.float32 or (X.stride(1) != 1 and D > 1):
        return None
    dev = X.device
    (R,) = plan.reg
    n_blocks = -(-N // plan.BN)  # the plan's BN is 8 R num_warps rows
    off32 = offsets_fit_int32(X, n_blocks * plan.BN, 16)
    consts = dict(WN=plan.num_warps, R=R, OFF32=off32, HAS_SW=sw is not None, WRITE_LOGP=want_logp,
                  VEC=_mma_vec(X, D))
    opts = dict(num_warps=plan.num_warps)
    key = (plan, N, off32, sw is not None, want_logp, consts["VEC"], dev)
    P = _MMA_OK.get(key)
    if P == 0:
        return None
    opnds = (ops["G"], ops["W1"], ops["W2"], ops["CONST"])
    dummy = stand_in(torch.float32, dev)
    if P is None:
        args = (X, X.stride(0)) + opnds + (dummy,) * 5 + (N, D, K, n_blocks, dummy, dummy)
        ok = True  # the interpreter emulates the fragments' semantics
        if dev.type == "cuda":
            try:
                ck = mma._diag_mma_kernel.warmup(*args, grid=(1,), **consts, **opts, **FP_FUSION)
            except Exception as e:  # noqa: BLE001 -- e.g. an asm the toolchain rejects: the register form
                warn_user(f"fusedml: the tensor-core GMM E-step did not compile ({e!r:.200}); using fp32 FMAs")
                ok = False
            else:
                ok = mma.layouts_ok(ck.asm["ttgir"], plan.num_warps)
                if not ok:
                    warn_user("fusedml: Triton laid out the tensor-core GMM E-step's fragments differently "
                              "from what its inline assembly assumes; using fp32 FMAs")
        P = _grid(mma._diag_mma_kernel, args, {**consts, **opts}, dev, n_blocks, plan.programs,
                  max(1, (32 << 20) // (8 * K * D + 8))) if ok else 0
        if len(_MMA_OK) < 4096:
            _MMA_OK[key] = P
        if not P:
            return None
    # each program's operand tiles first (16-byte aligned rows), then the partials: one allocation
    scr, pnk, ps1, ps2, pll = _partials(dev, [P * mma.TILE_WORDS.value, P * K, P * K * D, P * K * D], P)
    logp = torch.empty(N, dtype=torch.float32, device=dev) if want_logp else None
    launch(mma._diag_mma_kernel, (P,), (X, X.stride(0)) + opnds + (scr, pnk, ps1, ps2, pll, N, D, K, n_blocks,
                                                              dummy if sw is None else sw,
                                                              dummy if logp is None else logp), consts, **opts)
    return (logp,) + _diag_finish(prep, ops, pnk, ps1, ps2, pll)


#: the tied single sweep's components on chip: its [BK, BK] responsibility sums (R) live in registers
TIED_MAX_BK = 64


def _tied_single(prep: Prepared, ops, plan: Plan, P: int, n_blocks: int, sw, has_sw: bool, logp, write_logp: bool,
                 prec: str):
    """``(ll, nk, s1, s2)`` float64 of the tied single sweep (:func:`_tied_single_kernel`): its fp32
    partials summed, plus the centre-difference terms from ``R[a, k] = sum_{n: a(n) = a} r_nk`` in
    float64 (``s1_k += sum_a R_ak (c_a - c_k)``, ``s2 += sum_ak R_ak (c_a - c_k)(c_a - c_k)^T``, with
    the kernel's fp32 centres, so the sums are the full kernel's about the same centres)."""
    X, N, D, K = prep.X, prep.N, prep.D, prep.K
    dev, f64 = X.device, torch.float64
    BD = plan.BD  # the kernel's padded feature tile
    pnk, ps1, ps2, pr, pll = _partials(dev, [P * K, P * K * BD, P * BD * BD, P * K * K], P)
    call(_tied_single_kernel, (P,),
        X, X.stride(0), X.stride(1), ops["G"], sw, ops["MUP"], ops["P"], ops["CONST"], ops["C"], logp, pnk, ps1, ps2,
        pr, pll, N, D, K, n_blocks, BN=plan.BN, BD=plan.BD, BK=plan.BK, HAS_SW=has_sw, WRITE_LOGP=write_logp,
        PREC=prec, num_warps=plan.num_warps, num_stages=plan.num_stages)
    R = pr.view(P, K, K).to(f64).sum(0)  # [a, k]
    c = ops["C"][:, :D].to(f64)
    delta = c[:, None, :] - c[None, :, :]  # [a, k, D]: c_a - c_k
    s1 = ps1.view(P, K, BD)[..., :D].to(f64).sum(0) + torch.einsum("ak,akd->kd", R, delta)
    s2 = ps2.view(P, BD, BD)[:, :D, :D].to(f64).sum(0)
    s2 = 0.5 * (s2 + s2.T) + torch.einsum("ak,akd,ake->de", R, delta, delta)
    return pll.to(f64).sum(), pnk.view(P, K).to(f64).sum(0), s1, s2


def _diag_finish(prep: Prepared, ops, pnk, ps1, ps2, pll):
    """``(ll, nk, s1, s2)`` float64 from the diag kernels' fp32 partials: one launch
    (:func:`_diag_finish_kernel`), plus the sum over features for spherical."""
    K, D = prep.K, prep.D
    out = torch.empty(1 + K + 2 * K * D, dtype=torch.float64, device=pnk.device)
    # [64, 16] blocks: a program's loop is latency-bound (~1 us per block of rows), so many
    # programs over few entries each beat few over many (2 programs of [16, 128] at
    # 1M x 2, K = 128: +26 us on the H200)
    launch(_diag_finish_kernel, (-(-(K * D) // 16),), (pnk, ps1, ps2, pll, ops["CP"], out, pnk.numel() // K,
                                                       pll.numel(), K, D), dict(BP=64, BKD=16), num_warps=4)
    return _finish_views(prep, out)


def _finish_views(prep: Prepared, out: torch.Tensor):
    """``(ll, nk, s1, s2)`` views of the finish's float64 ``[1 + K + 2 K D]`` output (spherical
    s2 summed over features)."""
    K, D = prep.K, prep.D
    ll, nk, s1, s2 = out.split_with_sizes([1, K, K * D, K * D])  # (Tensor.split: a Python wrapper)
    s2 = s2.view(K, D)
    return ll.view(()), nk, s1.view(K, D), s2.sum(1) if prep.covariance_type == "spherical" else s2


def _fallbacks(plan: Plan, N: int, K: int, D: int, ct: str, dev, precision: str):
    """Smaller configurations to retry after an out-of-resources launch: the two-pass path, then
    halved row blocks / component tiles with no software pipelining."""
    out = []
    if plan.path == "single":
        out.append(plan_launch(N, K, D, ct, torch.float32, dev, path="two_pass", precision=precision))
    p = out[-1] if out else plan
    while p.BN > 16 or p.BK_tile > 16 or p.lse_BN > 16 or p.lse_BK > 16 or p.num_stages > 1:
        p = replace(p, path="two_pass", BN=max(16, p.BN // 2), BK_tile=max(16, p.BK_tile // 2), num_stages=1,
                    chunk_rows=max(16, p.chunk_rows // 16 * 16), lse_BN=max(16, p.lse_BN // 2),
                    lse_BK=max(16, p.lse_BK // 2), DC=min(p.DC, 16))
        out.append(p)
    return out


def estep_fused(prep: Prepared, return_log_prob: bool, *, path="auto", precision="fp32", plan: Plan | None = None,
                ops=None):
    """Fused E-step; returns ``(log_prob or None, ll, nk, s1, s2)`` float64 (log_prob fp32).

    ``plan`` overrides the launch model; ``ops`` (from :func:`_operands`) skips the parameter set-up
    (the benchmark times the data pass alone that way). ``precision="auto"`` resolves by
    :func:`fusedml.gmm.model.auto_precision`. A launch that runs out of GPU resources
    (shared memory, registers) is retried with the two-pass path and smaller blocks, with a
    warning; if every configuration fails, the operator-level E-step answers (also with a warning).
    """
    N, D, K, ct = prep.N, prep.D, prep.K, prep.covariance_type
    dev = prep.X.device
    if fp32_unsafe(prep, "the E-step"):  # fp32 distances would be off: the blocked float64 pass
        from .cpu import estep_cpu

        return estep_cpu(prep, return_log_prob)
    if precision == "auto":
        precision = auto_precision(N, K, D, ct, dev, prep.X.dtype)
    if plan is None:
        plan = plan_launch(N, K, D, ct, prep.X.dtype, dev, path=path, precision=precision)
    if plan.precision and plan.precision != precision:
        warn_user(f"fusedml.gmm: no {precision} configuration fits the GPU for K={K}, D={D}; using fp32 "
                  "products (more accurate)", RuntimeWarning)
        precision = plan.precision
    if ops is None:
        ops = _operands(prep)
    try:
        return _estep_plan(prep, return_log_prob, precision, plan, ops)
    except OutOfResources as err:
        first = err
    for alt in _fallbacks(plan, N, K, D, ct, dev, precision):
        warn_user(f"fusedml.gmm: the fused E-step ({plan.path}, BN={plan.BN}, BK={plan.BK_tile}, "
                  f"stages={plan.num_stages}) ran out of GPU resources ({first}); retrying with {alt.path}, "
                  f"BN={alt.BN}, BK={alt.BK_tile}, stages={alt.num_stages}", RuntimeWarning)
        try:
            return _estep_plan(prep, return_log_prob, precision, alt, ops)
        except OutOfResources as err:
            first, plan = err, alt
    warn_user(f"fusedml.gmm: no fused configuration fits this GPU ({first}); using the operator-level E-step",
              RuntimeWarning)
    from .ops import estep_ops

    return estep_ops(prep, return_log_prob)


def score_fused(prep: Prepared, plan: Plan | None = None):
    """Fused scoring: ``(log_prob [N] fp32, labels [N] int64)`` in one pass, no N x K.

    Out-of-resources launches retry with smaller blocks (warning), then the operator-level path;
    float64 (blocked, on X's device) where fp32 would not be accurate, as :func:`estep_fused`."""
    if fp32_unsafe(prep, "scoring"):
        from .cpu import score_cpu

        return score_cpu(prep)
    if plan is None:
        plan = plan_launch(prep.N, prep.K, prep.D, prep.covariance_type, prep.X.dtype, prep.device, path="two_pass")
    ops = _operands(prep)
    dummy = stand_in(torch.float32, prep.device)
    err = None
    for p in [plan] + _fallbacks(plan, prep.N, prep.K, prep.D, prep.covariance_type, prep.device, "fp32"):
        try:
            logp, labels, _ = _lse_pass(prep, ops, p, dummy, False, True, "ieee")
            return logp, labels
        except OutOfResources as e:
            err = e
            warn_user(f"fusedml.gmm: scoring (BN={p.BN}, BK={p.BK_tile}) ran out of GPU resources ({e}); "
                      "retrying with smaller blocks", RuntimeWarning)
    warn_user(f"fusedml.gmm: no fused scoring configuration fits this GPU ({err}); using the operator-level path",
              RuntimeWarning)
    from .ops import score_ops

    return score_ops(prep)
