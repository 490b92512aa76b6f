"""Fused Lloyd step for k-means: assignment and centre statistics in one pass over X.

One Lloyd iteration needs, for the current centres ``c_k``, every row's nearest centre and the
per-cluster sums of the rows assigned to it. The operator-level way materialises the ``[N, K]``
distance matrix, takes its arg-min and scatters the rows into ``[K, D]`` sums with ``index_add_``
(one global atomic per element of X onto only ``K * D`` addresses: heavily contended on a GPU).
The fused kernel (the GMM single sweep with one-hot responsibilities) reads a row tile once,
computes its distances to all K centres on chip (register FMAs for tiny K and D, ``tl.dot``
otherwise: :func:`lloyd_plan`), takes the arg-min, and accumulates the one-hot
product ``onehot^T x`` in registers; each program writes one ``[K, D]`` partial at the end, summed
in float64 on the host side (deterministic, no atomics).

Distances use the expanded form ``|x'|^2 - 2 x'.c' + |c'|^2`` on data shifted by ``shift`` (the data
mean, as scikit-learn's k-means centres X), so float32 does not cancel for data far from the
origin. Products run in IEEE float32 (``input_precision="ieee"``): tf32 would move points near a
boundary to the wrong cluster.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from ._dispatch import interpret_mode, resolve_backend
from ._launch import bind, compiled_local_bytes, first_fitting_tile, launch
from ._validation import check_finite as _check_finite
from ._validation import to_tensor
from .gmm.fused import _reg_layout, _reg_next, _reg_rows, offsets_fit_int32, register_cap, resident_programs
from .gmm.model import REG_VALUES, reg_prefetch, reg_tile
from .mmchain._checks import check_launch_fields
from .mmchain.launch import H200_PROFILE, gpu_info

__all__ = ["LloydIterations", "LloydStep", "candidate_distances", "central_rows", "lloyd_step", "nearest_labels"]

_F64 = torch.float64
# Register budget of the fused kernel: the [K, D] accumulator and the [BLOCK_N, K] / [BLOCK_N, D]
# tiles each hold at most this many fp32 elements per program.
_MAX_TILE = 8192
#: The keys :func:`lloyd_plan` takes as overrides.
_PLAN_KEYS = {"BLOCK_N", "num_warps", "USE_DOT", "per_sm", "REG", "REG_KI", "REG_VALUES", "PREFETCH"}
_BLOCK_ELEMS = 1 << 22  # rows per block of the torch path: temporaries of about this many elements


@dataclass
class LloydStep:
    """Result of one Lloyd step (tensors on X's device).

    Attributes
    ----------
    labels : torch.Tensor
        ``[N]`` int64, the nearest centre of every row (the first one on ties).
    sums : torch.Tensor
        ``[K, D]`` float64, ``sum_{n: labels_n = k} s_n x_n``.
    counts : torch.Tensor
        ``[K]`` float64, ``sum_{n: labels_n = k} s_n``.
    inertia : torch.Tensor
        0-d float64, ``sum_n s_n min_k |x_n - c_k|^2`` (distances to the centres given).
    backend : str
        ``"fused"``, ``"ops"`` or ``"cpu"``: what ran.
    """

    labels: torch.Tensor
    sums: torch.Tensor
    counts: torch.Tensor
    inertia: torch.Tensor
    backend: str


@triton.jit
def _lloyd_kernel(X, sx0, sx1, C, CSQ, SHIFT, W, LAB, LAB_OLD, PART, N, D, K, n_tiles,
                  HAS_W: tl.constexpr, HAS_OLD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    # PART [P, ROW] fp32, ROW = BLOCK_K * BLOCK_D + BLOCK_K + 2: per program the [BK, BD] sums of
    # the shifted rows, the [BK] counts, the inertia and (HAS_OLD) the number of changed labels,
    # so that one reduction over programs serves all of them
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = tl.arange(0, BLOCK_N)
    dmask = offs_d < D
    kmask = offs_k < K
    # centres (shifted) [BK, BD] and |c'|^2 [BK] (+inf on padding: never the arg-min)
    c = tl.load(C + offs_k[:, None] * D + offs_d[None, :], mask=kmask[:, None] & dmask[None, :], other=0.0)
    csq = tl.load(CSQ + offs_k, mask=kmask, other=float("inf"))
    shift = tl.load(SHIFT + offs_d, mask=dmask, other=0.0)
    acc = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    cnt = tl.zeros((BLOCK_K,), dtype=tl.float32)
    inr = tl.zeros((BLOCK_N,), dtype=tl.float32)
    chg = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for t in range(pid, n_tiles, nprog):
        rows = (t * BLOCK_N + offs_n).to(tl.int64)  # int64: rows * stride can pass 2^31
        rmask = rows < N
        m2 = rmask[:, None] & dmask[None, :]
        x = tl.load(X + rows[:, None] * sx0 + offs_d[None, :] * sx1, mask=m2, other=0.0).to(tl.float32)
        xs = tl.where(m2, x - shift[None, :], 0.0)  # [BN, BD]
        xsq = tl.sum(xs * xs, 1)
        if USE_DOT:
            dots = tl.dot(xs, tl.trans(c), input_precision="ieee")  # [BN, BK]
        else:  # small K, D: FMAs in registers, no padding to 16 and no shared-memory operands
            dots = tl.sum(xs[:, None, :] * c[None, :, :], axis=2)
        d2 = tl.maximum(xsq[:, None] - 2.0 * dots + csq[None, :], 0.0)
        mind = tl.min(d2, 1)
        lab = tl.argmin(d2, 1)
        if HAS_W:
            w = tl.load(W + rows, mask=rmask, other=0.0).to(tl.float32)
        else:
            w = tl.where(rmask, 1.0, 0.0)
        oh = tl.where(offs_k[None, :] == lab[:, None], w[:, None], 0.0)  # [BN, BK]
        if USE_DOT:
            acc += tl.dot(tl.trans(oh), xs, input_precision="ieee")  # [BK, BD]
        else:
            acc += tl.sum(oh[:, :, None] * xs[:, None, :], axis=0)
        cnt += tl.sum(oh, 0)
        inr += tl.where(rmask, w * mind, 0.0)
        tl.store(LAB + rows, lab.to(tl.int32), mask=rmask)
        if HAS_OLD:  # scikit-learn's strict convergence: did any label change?
            old = tl.load(LAB_OLD + rows, mask=rmask, other=0)
            chg += tl.where(rmask & (old != lab.to(tl.int32)), 1.0, 0.0)
    base = PART + pid.to(tl.int64) * (BLOCK_K * BLOCK_D + BLOCK_K + 2)
    tl.store(base + offs_k[:, None] * BLOCK_D + offs_d[None, :], acc)
    tl.store(base + BLOCK_K * BLOCK_D + offs_k, cnt)
    tl.store(base + BLOCK_K * BLOCK_D + BLOCK_K, tl.sum(inr, 0))
    tl.store(base + BLOCK_K * BLOCK_D + BLOCK_K + 1, tl.sum(chg, 0))


@triton.jit
def _lloyd_reg_kernel(X, sx0, sx1, C, CSQ, SHIFT, W, LAB, LAB_OLD, PART, N, D, K, n_tiles,
                      HAS_W: tl.constexpr, HAS_OLD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_K: tl.constexpr, KI: tl.constexpr, KO: tl.constexpr, PREFETCH: tl.constexpr,
                      OFF32: tl.constexpr):
    # _lloyd_kernel's step in the GMM single sweep's register form (fusedml.gmm.fused._diag_reg_kernel):
    # tiles [BD, KI, BN, KO], each thread holding one row's features and KI centres (k = ki * KO + ko)
    # and their sums for the whole row stream; the distance products are FFMA chains in-thread,
    # the arg-min crosses at most KO lanes. Same PART layout as _lloyd_kernel.
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_n, offs_d, offs_o, ks, dmask, kmask = _reg_layout(BLOCK_N, BLOCK_D, KI, KO, D, K)
    shift = tl.load(SHIFT + offs_d, mask=dmask, other=0.0)
    cmask = dmask[:, None, None] & kmask[None, :, :]  # [BD, KI, KO]
    c = tl.load(C + ks[None, :, :] * D + offs_d[:, None, None], mask=cmask, other=0.0)[:, :, None, :]
    csq = tl.load(CSQ + ks, mask=kmask, other=float("inf"))[:, None, :]  # [KI, 1, KO]; padding never wins
    kk = ks[:, None, :]  # [KI, 1, KO]
    acc = tl.zeros((BLOCK_D, KI, BLOCK_N, KO), dtype=tl.float32)
    cnt = tl.zeros((KI, BLOCK_N, KO), dtype=tl.float32)
    inr = tl.zeros((BLOCK_N,), dtype=tl.float32)
    chg = tl.zeros((BLOCK_N,), dtype=tl.float32)
    x_a = _reg_rows(X, sx0, sx1, pid, BLOCK_N, offs_n, offs_d, N, D, PREFETCH >= 1, OFF32)
    x_b = _reg_rows(X, sx0, sx1, pid + nprog, BLOCK_N, offs_n, offs_d, N, D, PREFETCH >= 2, OFF32)
    for t in range(pid, n_tiles, nprog):
        rows = t * BLOCK_N + offs_n
        rmask = rows < N
        m2 = dmask[:, None] & rmask[None, :]
        xt, x_a, x_b = _reg_next(X, sx0, sx1, t, nprog, BLOCK_N, offs_n, offs_d, N, D, x_a, x_b, PREFETCH, OFF32)
        xs = tl.where(m2, xt.to(tl.float32) - shift[:, None], 0.0)  # [BD, BN]
        xsq = tl.sum(xs * xs, axis=0)  # [BN]
        x = xs[:, None, :, None]  # [BD, 1, BN, 1]
        d2 = tl.maximum(xsq[None, :, None] - 2.0 * tl.sum(x * c, axis=0) + csq, 0.0)  # [KI, BN, KO]
        mind = tl.min(tl.min(d2, axis=0), axis=1)  # [BN]
        lab = tl.min(tl.min(tl.where(d2 == mind[None, :, None], kk, BLOCK_K), axis=0), axis=1)  # first on ties
        if HAS_W:
            w = tl.load(W + rows, mask=rmask, other=0.0).to(tl.float32)
        else:
            w = tl.where(rmask, 1.0, 0.0)
        oh = tl.where(kk == lab[None, :, None], w[None, :, None], 0.0)  # [KI, BN, KO]
        acc += x * oh[None, :, :, :]
        cnt += oh
        inr += tl.where(rmask, w * mind, 0.0)
        tl.store(LAB + rows, lab.to(tl.int32), mask=rmask)
        if HAS_OLD:
            old = tl.load(LAB_OLD + rows, mask=rmask, other=0)
            chg += tl.where(rmask & (old != lab.to(tl.int32)), 1.0, 0.0)
    base = PART + pid.to(tl.int64) * (BLOCK_K * BLOCK_D + BLOCK_K + 2)
    tl.store(base + ks[None, :, :] * BLOCK_D + offs_d[:, None, None], tl.sum(acc, axis=2))  # [BD, KI, KO]
    tl.store(base + BLOCK_K * BLOCK_D + ks, tl.sum(cnt, axis=1))
    tl.store(base + BLOCK_K * BLOCK_D + BLOCK_K, tl.sum(inr, 0))
    tl.store(base + BLOCK_K * BLOCK_D + BLOCK_K + 1, tl.sum(chg, 0))


@triton.jit
def _lloyd_finalize_kernel(RED, C, SHIFT, NEW, CS, CSQ, OUT, K, D,
                           BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    # one program, after the reduction over programs (RED [ROW] float64, PART's layout): the new
    # centres sums / counts [K, D] float64 (shift undone), the next step's shifted fp32 centres
    # and |c'|^2, and OUT [4] float64 = (clusters left empty, |new - old|^2, inertia, changed labels)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    km = offs_k < K
    dm = offs_d < D
    m2 = km[:, None] & dm[None, :]
    s = tl.load(RED + offs_k[:, None] * BLOCK_D + offs_d[None, :])
    cnt = tl.load(RED + BLOCK_K * BLOCK_D + offs_k)
    sh = tl.load(SHIFT + offs_d, mask=dm, other=0.0)
    old = tl.load(C + offs_k[:, None] * D + offs_d[None, :], mask=m2, other=0.0)
    new = (s + cnt[:, None] * sh[None, :]) / tl.where(cnt > 0, cnt, 1.0)[:, None]  # empty: 0
    diff = tl.where(m2, new - old, 0.0)
    cs = tl.where(m2, new - sh[None, :], 0.0)
    tl.store(NEW + offs_k[:, None] * D + offs_d[None, :], new, mask=m2)
    tl.store(CS + offs_k[:, None] * D + offs_d[None, :], cs.to(tl.float32), mask=m2)
    tl.store(CSQ + offs_k, tl.sum(cs * cs, 1).to(tl.float32), mask=km)
    tl.store(OUT, tl.sum(tl.where(km & (cnt <= 0), 1.0, 0.0), 0).to(tl.float64))
    tl.store(OUT + 1, tl.sum(tl.sum(diff * diff, 1), 0))
    tl.store(OUT + 2, tl.load(RED + BLOCK_K * BLOCK_D + BLOCK_K))
    tl.store(OUT + 3, tl.load(RED + BLOCK_K * BLOCK_D + BLOCK_K + 1))


@triton.jit
def _cand_dist_kernel(X, sx0, sx1, C, CLOSEST, SW, DIST, PPOT, N, D, L, n_tiles,
                      HAS_CLOSEST: tl.constexpr, HAS_SW: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr):
    # k-means++'s pass over X: DIST [L, N] = min(|x_n - c_l|^2, closest_n) in float64 (difference
    # form: no cancellation), PPOT [P, BLOCK_L] = per-program sums of s_n * DIST[l, n]
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_l = tl.arange(0, BLOCK_L)
    offs_n = tl.arange(0, BLOCK_N)
    dm = offs_d < D
    lm = offs_l < L
    c = tl.load(C + offs_l[:, None] * D + offs_d[None, :], mask=lm[:, None] & dm[None, :], other=0.0)
    pot = tl.zeros((BLOCK_L,), dtype=tl.float64)
    for t in range(pid, n_tiles, nprog):
        rows = (t * BLOCK_N + offs_n).to(tl.int64)
        rm = rows < N
        x = tl.load(X + rows[:, None] * sx0 + offs_d[None, :] * sx1, mask=rm[:, None] & dm[None, :],
                    other=0.0).to(tl.float64)
        diff = x[:, None, :] - c[None, :, :]  # [BN, BL, BD]
        d2 = tl.sum(diff * diff, axis=2)  # [BN, BL]
        if HAS_CLOSEST:
            d2 = tl.minimum(d2, tl.load(CLOSEST + rows, mask=rm, other=0.0)[:, None])
        ok = rm[:, None] & lm[None, :]
        tl.store(DIST + offs_l[None, :].to(tl.int64) * N + rows[:, None], d2, mask=ok)
        if HAS_SW:
            d2 = d2 * tl.load(SW + rows, mask=rm, other=0.0)[:, None]
        pot += tl.sum(tl.where(ok, d2, 0.0), axis=0)
    tl.store(PPOT + pid * BLOCK_L + offs_l, pot)


def candidate_distances(X, candidates, closest=None, sample_weight=None):
    """k-means++'s pass over X on the fused backend: the candidates' distances and potentials.

    ``dist[l, n] = min(|x_n - c_l|^2, closest_n)`` and ``pots[l] = sum_n s_n dist[l, n]`` in
    float64 from one read of X (a Triton kernel; the difference form, so no cancellation), for
    the L = 2 + log K candidate centres of one k-means++ step: the operator-level version is a
    blocked GEMM with ~10 small launches per block of rows.

    Parameters
    ----------
    X : torch.Tensor [N, D]
        Floating data on a CUDA device (or the CPU under ``TRITON_INTERPRET=1``).
    candidates : torch.Tensor [L, D]
        The candidate rows (any float dtype; used in float64).
    closest : torch.Tensor [N] float64, optional
        Current distance of every row to its nearest chosen centre (none yet: no minimum).
    sample_weight : torch.Tensor [N], optional
        Row weights ``s`` of the potentials (ones if None).

    Returns
    -------
    tuple
        ``(dist [L, N] float64, pots [L] float64)``, or None when ``L * D`` is too large for the
        kernel's registers (the caller then uses its operator-level path).
    """
    N, D = X.shape
    L = candidates.shape[0]
    bl, bd = _pow2(L, 1), _pow2(D, 1)
    if bl * bd > 2048:
        return None
    bn = max(1, min(256, 4096 // (bl * bd)))
    n_tiles = triton.cdiv(N, bn)
    P = max(1, min(n_tiles, 4 * _sm_count(X.device)))
    dev = X.device
    c = candidates.to(_F64).contiguous()
    dist = torch.empty((L, N), dtype=_F64, device=dev)
    ppot = torch.empty((P, bl), dtype=_F64, device=dev)
    cl = None if closest is None else closest.to(_F64).contiguous()
    sw = None if sample_weight is None else sample_weight.to(_F64).contiguous()
    launch(_cand_dist_kernel, (P,), (X, X.stride(0), X.stride(1), c, dist if cl is None else cl,
                                     dist if sw is None else sw, dist, ppot, N, D, L, n_tiles),
           dict(HAS_CLOSEST=cl is not None, HAS_SW=sw is not None, BLOCK_N=bn, BLOCK_D=bd, BLOCK_L=bl), num_warps=4)
    return dist, ppot.sum(0)[:L]


def _sm_count(device):
    """SMs of a CUDA ``device`` (cached :func:`~fusedml.mmchain.launch.gpu_info`); the H200
    profile's 132 otherwise (CPU under the interpreter, or no device given)."""
    return H200_PROFILE.sm_count if device is None else gpu_info(device).sm_count


def _pow2(n, lo):
    return max(lo, triton.next_power_of_2(int(n)))


def lloyd_plan(N, D, K, device=None, **override):
    """Block sizes and form of the fused Lloyd kernel, or None when K and D are too large for it.

    Two forms of the two products per row tile (distances ``x'.c'`` and sums ``onehot^T x'``),
    chosen from two H200 runs (2026-12-02, ms per step; first run: tl.dot, ``BLOCK_N`` 128 /
    8192 // padded K, 4 warps; second run: the rule below except for the rows marked):

    * ``REG=(KI, KO)`` (session 20) wherever :func:`fusedml.gmm.model.reg_tile` applies (padded
      ``K x D <= 256``, at most 8 threads per row): the GMM single sweep's register form
      (:func:`_lloyd_reg_kernel`; 16M x 8, K = 8: 2.81 -> 0.49 ms, 4M x 16, K = 16: 0.59 -> 0.33-0.43,
      ``kmeans-*-s20-{e,f,g,i}``), with the GMM diag budget (``BD * KI <= 32``: twice the centres per
      thread was slower at 16 x 16); ``REG=False`` gives the rules below, ``REG_KI`` /
      ``REG_VALUES`` override the centres per thread / their budget.
    * ``USE_DOT=False`` when the padded ``BLOCK_K * BLOCK_D <= 64``: broadcast FMAs in registers
      over a ``[BLOCK_N, BLOCK_K, BLOCK_D]`` temporary of about 8192 elements, no padding of K and
      D to 16 (16M x 8, K=8: 2.83 ms against 3.49 with tl.dot). Larger products lost in this form
      (4M x 16, K=16: 1.04 against 0.61; 1M x 2, K=128: 1.21 against 0.70).
    * ``USE_DOT=True`` otherwise, IEEE fp32, ``BLOCK_N`` 128 while ``BLOCK_K * BLOCK_D <= 256``,
      64 up to 4096 (1M x 128, K=16: 0.97 ms, 1.46 at 16; 1M x 64, K=64: 0.97 ms against 1.55 at
      32, ``kmeans-sweep-dot-*-s21-b``, although ptxas spills 7 KB there), else 32 (1M x 32,
      K=256: 1.81; 1.86 at 64 with 8 warps).

    The ``[BLOCK_K, BLOCK_D]`` accumulator must fit ``_MAX_TILE`` fp32 elements; beyond that the
    operator-level path runs. Programs: a persistent grid of four per SM (the register form: every
    program the compiled kernel keeps resident, from its registers, at launch).

    Parameters
    ----------
    N, D, K : int
        Rows, features, clusters.
    device : torch.device, optional
        Where the kernel runs (its SM count sizes the grid; 132 when unknown).
    **override
        Replace any entry of the plan (``BLOCK_N``, ``num_warps``, ``USE_DOT``, ``per_sm``; ``REG``
        False / ``REG_KI``, ``REG_VALUES``, ``PREFETCH`` for the register form): the benchmark's sweep.

    Returns
    -------
    dict or None
        ``BLOCK_N``, ``BLOCK_D``, ``BLOCK_K``, ``USE_DOT``, ``REG`` (``(KI, KO)`` or None),
        ``num_warps``, ``programs``, ``n_tiles`` (and ``PREFETCH`` for the register form).
    """
    if override:  # the caller's overrides (every lloyd_step call plans: nothing to check without them)
        o = SimpleNamespace(**override)
        unknown = sorted(set(override) - _PLAN_KEYS)
        if unknown:
            raise ValueError(f"plan: unknown key(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(sorted(_PLAN_KEYS))}")
        check_launch_fields(o, what="plan", pow2=[k for k in ("BLOCK_N", "REG_KI") if k in override],
                            positive=[k for k in ("per_sm", "REG_VALUES") if k in override],
                            warps=[k for k in ("num_warps",) if k in override],
                            flags=[k for k in ("USE_DOT", "REG") if k in override])
        if "PREFETCH" in override and override["PREFETCH"] not in (0, 1, 2):
            raise ValueError(f"plan: PREFETCH must be 0, 1 or 2, got {override['PREFETCH']!r}")
    sms = _sm_count(device)
    per_sm = override.get("per_sm", 4)
    # the register form at diag's budget: spherical's (KI doubled) measured 0.42 against 0.33 ms at
    # 4M x 16, K = 16 and equal at 16M x 8, K = 8 (kmeans-*-s20-i)
    reg = (None if override.get("REG", True) is False or "USE_DOT" in override
           else reg_tile(D, K, ki=override.get("REG_KI"), values=override.get("REG_VALUES", REG_VALUES)))
    if reg is not None:
        bd, bk, ki, bn, nw = reg
        n_tiles = triton.cdiv(int(N), bn)
        return {"BLOCK_N": bn, "BLOCK_D": bd, "BLOCK_K": bk, "USE_DOT": False, "REG": (ki, bk // ki),
                "PREFETCH": override.get("PREFETCH", reg_prefetch(bn, bd)), "num_warps": nw,
                "programs": max(1, min(n_tiles, per_sm * sms)), "n_tiles": n_tiles}
    use_dot = override.get("USE_DOT", _pow2(D, 1) * _pow2(K, 1) > 64)
    lo = 16 if use_dot else 1
    bd, bk = _pow2(D, lo), _pow2(K, lo)
    if bd * bk > _MAX_TILE:
        return None
    if use_dot:
        bn = 128 if bd * bk <= 256 else (64 if bd * bk <= 4096 else 32)
    else:
        bn = max(16, min(256, 8192 // (bd * bk)))
    nw = override.get("num_warps", 4)
    # tl.dot tiles the compiled launch may fall back to (_dot_tile), where none is forced
    fallback = (_DOT_FALLBACK.get(bd * bk, ()) if use_dot and "BLOCK_N" not in override
                and "num_warps" not in override else ())
    bn = override.get("BLOCK_N", bn)
    if use_dot and bn < 16:
        raise ValueError(f"plan: USE_DOT needs BLOCK_N >= 16 (tl.dot's smallest tile on sm_90), got {bn}")
    if override:  # [BLOCK_N, BLOCK_K, BLOCK_D] broadcast products (tl.dot: [BLOCK_N, BLOCK_K] / [BLOCK_N, BLOCK_D])
        check_launch_fields(o, what="plan", tile=bn * (bk * bd if not use_dot else max(bk, bd)))
    n_tiles = triton.cdiv(int(N), bn)
    return {"BLOCK_N": bn, "BLOCK_D": bd, "BLOCK_K": bk, "USE_DOT": use_dot, "REG": None,
            "num_warps": nw, "programs": max(1, min(n_tiles, per_sm * sms)), "n_tiles": n_tiles,
            "fallback": fallback, "per_sm": per_sm}


#: ``(BLOCK_N, num_warps)`` the tl.dot Lloyd step falls back to, in order, per padded
#: ``BLOCK_K x BLOCK_D``, when the planned tile's compile spills (:func:`_dot_tile`). sm_90 compiles
#: (session 34) of the planned tiles moved from clean to kilobytes of local memory with the Triton
#: version, the flags and the row alignment: 64 rows on 4 warps at 64 x 64 used 0 B on Triton 3.6
#: and 3.7 without sample weights but 6.9 KB on 3.6 with them, 1.5-2.3 KB on 3.8 and 3.9; 32 rows on
#: 4 warps at 32 x 256 152-208 B on 3.6 and 3.7 but 6.8-8.9 KB on 3.8 and 3.9; with D not a multiple
#: of 16 (unaligned rows) 64 x 4 at 2048 entries 0.2-0.3 KB on 3.6 and 3.8-5.4 KB on 3.9 (1M x 100,
#: K = 16; 1M x 59, K = 23), at 4096 7.2-8.1 KB on both (1M x 52, K = 44). The fallbacks on those
#: cases: 16 x 4 at 64 x 64 0 B on all four versions (aligned rows; 0.5 KB with unaligned rows on
#: 3.9); 32 x 8 0-192 B at 8192 entries and at 2048 on 3.6, 0.3 KB at 2048 on 3.9 with unaligned
#: rows; 16 x 8, the last resort, 0-8 B everywhere. Up to 1024 entries 64 x 4 compiled clean on both
#: (aligned or not). 16 x 4 took 1.53 ms against the plan's 0.97 at 1M x 64, K = 64 on the H200 with
#: 3.6 (``kmeans-sweep-dot-*-s21-b``); the 8-warp fallbacks are untimed.
_DOT_FALLBACK = {2048: ((32, 8), (16, 8)), 4096: ((16, 4), (32, 8), (16, 8)), 8192: ((32, 8), (16, 8))}

_DOT_TILES: dict = {}


def _dot_tile(X, consts, plan, spec_args, dev):
    """``(BLOCK_N, num_warps)`` of a tl.dot Lloyd launch on a CUDA device: the plan's tile unless its
    compile uses more than :data:`fusedml._launch.LOCAL_BYTES_OK` of local memory per thread, then
    the first of ``plan["fallback"]`` that does not (:func:`first_fitting_tile`). Compiled once per
    shape class, flags, row alignment and device; off the GPU (the interpreter) the plan's tile.

    Parameters
    ----------
    X : torch.Tensor
        The rows (their dtype and strides specialise the compile).
    consts : dict
        The launch's constexpr arguments (``BLOCK_N`` is replaced per candidate).
    plan : dict
        :func:`lloyd_plan`'s plan (``BLOCK_N``, ``num_warps``, ``fallback``).
    spec_args : callable
        ``spec_args(BLOCK_N) -> tuple``: the launch's positional arguments for that tile.
    dev : torch.device

    Returns
    -------
    tuple of int
        ``(BLOCK_N, num_warps)``.
    """
    first = (plan["BLOCK_N"], plan["num_warps"])
    if not plan.get("fallback") or dev.type != "cuda" or interpret_mode():
        return first
    key = (plan["BLOCK_D"], plan["BLOCK_K"], X.dtype, X.stride(1) == 1, X.stride(0) % 16 == 0,
           X.shape[1] % 16 == 0, tuple(sorted(consts.items())), dev.index)
    if key not in _DOT_TILES:
        def local_bytes(bn, nw):
            return compiled_local_bytes(_lloyd_kernel, spec_args(bn), dict(consts, BLOCK_N=bn, num_warps=nw))
        _DOT_TILES[key] = first_fitting_tile((first, *plan["fallback"]), local_bytes)
    return _DOT_TILES[key]


def _lloyd_spec(X, Cs, csq, shift, w, plan, labels_old, labels):
    """The fused kernel's launch: ``(kernel, P, consts, launch options)`` and the argument tuple builder."""
    N, D = X.shape
    K = Cs.shape[0]
    P, bk, bd = plan["programs"], plan["BLOCK_K"], plan["BLOCK_D"]
    dev = X.device
    consts = dict(HAS_W=w is not None, HAS_OLD=labels_old is not None, BLOCK_N=plan["BLOCK_N"], BLOCK_D=bd,
                  BLOCK_K=bk)
    opts = dict(num_warps=plan["num_warps"])
    def args(part, n_tiles=None):  # the launch's arguments; a compile-only call passes Cs as part
        return (X, X.stride(0), X.stride(1), Cs, csq, shift, w if w is not None else part, labels,
                labels if labels_old is None else labels_old, part, N, D, K,
                plan["n_tiles"] if n_tiles is None else n_tiles)

    if plan.get("REG"):
        kernel = _lloyd_reg_kernel
        # blocks up to 2 * P past the last are formed (P <= n_tiles), masked
        consts.update(KI=plan["REG"][0], KO=plan["REG"][1], PREFETCH=plan["PREFETCH"],
                      OFF32=offsets_fit_int32(X, 3 * plan["n_tiles"] * plan["BLOCK_N"], bd))
        gkey = (N, D, K, X.dtype, dev, tuple(consts.items()), plan["num_warps"])
        P, cap = _GRIDS.get(gkey, (None, 0))
        if P is None:  # a persistent grid of every program the compiled kernel keeps resident
            spec = args(Cs)  # the launch's argument types (one compiled variant)
            cap = register_cap(kernel, spec, dict(consts, **opts), dev)  # one more program per SM where it fits
            if cap:
                opts["maxnreg"] = cap
            per_sm = resident_programs(kernel, spec, dict(consts, **opts), dev)
            P = plan["programs"] if per_sm is None else max(1, min(plan["n_tiles"], per_sm * _sm_count(dev)))
            if len(_GRIDS) < 4096:
                _GRIDS[gkey] = (P, cap)
        elif cap:
            opts["maxnreg"] = cap
    else:
        kernel = _lloyd_kernel
        consts.update(USE_DOT=plan["USE_DOT"])
        bn, nw = _dot_tile(X, consts, plan, lambda b: args(Cs, triton.cdiv(N, b)), dev)
        if (bn, nw) != (plan["BLOCK_N"], plan["num_warps"]):
            n_tiles = triton.cdiv(N, bn)
            P = max(1, min(n_tiles, plan["per_sm"] * _sm_count(dev)))
            plan = dict(plan, BLOCK_N=bn, num_warps=nw, n_tiles=n_tiles, programs=P)
            consts["BLOCK_N"], opts["num_warps"] = bn, nw
    return kernel, P, consts, opts, args


def _lloyd_launch(X, Cs, csq, shift, w, plan, labels_old=None):
    """The fused kernel and the one reduction over programs: ``(labels [N] int32, RED [ROW] f64)``."""
    labels = torch.empty(X.shape[0], dtype=torch.int32, device=X.device)
    kernel, P, consts, opts, args = _lloyd_spec(X, Cs, csq, shift, w, plan, labels_old, labels)
    part = torch.empty((P, plan["BLOCK_K"] * plan["BLOCK_D"] + plan["BLOCK_K"] + 2), dtype=torch.float32,
                       device=X.device)
    launch(kernel, (P,), args(part), consts, **opts)
    return labels, part.sum(0, dtype=_F64)


_GRIDS: dict = {}


def _lloyd_fused(X, Cs, csq, shift, w, plan):
    K, D = Cs.shape
    bk, bd = plan["BLOCK_K"], plan["BLOCK_D"]
    labels, red = _lloyd_launch(X, Cs, csq, shift, w, plan)
    sums = red[:bk * bd].view(bk, bd)[:K, :D]
    return labels.long(), sums, red[bk * bd:bk * bd + K], red[bk * bd + bk]


class LloydIterations:
    """Repeated fused Lloyd steps on one X, with the centre update on the device.

    What k-means' loop needs per iteration -- labels, new centres ``sums / counts``, and the
    scalars it decides on (empty clusters, centre shift, inertia, whether any label changed) --
    from two kernel launches and one reduction (:func:`lloyd_step` plus the updates cost ~28
    small launches per iteration, which bound a k-means fit on the GPU: 44 steps per
    ``GaussianMixture`` initialisation at 1M x 16, K = 16). The next step's shifted fp32 centres
    come out of the finalising kernel, so a step starts with no host-side preparation.

    Parameters
    ----------
    X : torch.Tensor [N, D]
        float32/float16/bfloat16 data on the device the kernels run on (CUDA, or the CPU under
        ``TRITON_INTERPRET=1``), with a fused plan (:func:`lloyd_plan` not None).
    sample_weight : torch.Tensor [N], optional
    shift : torch.Tensor [D] float64
        Subtracted from X and the centres in the distances (rounded to float32, as
        :func:`lloyd_step` does).
    K : int
        Number of centres.
    """

    def __init__(self, X, sample_weight, shift, K):
        N, D = X.shape
        self.X, self.K, self.D = X, int(K), int(D)
        self.plan = lloyd_plan(N, D, K, X.device)
        if self.plan is None or X.dtype == _F64:
            raise ValueError(f"no fused Lloyd plan for D={D}, K={K}, dtype {X.dtype}")
        self.w = None if sample_weight is None else sample_weight.to(torch.float32).contiguous()
        self.sh32 = shift.to(torch.float32).contiguous()
        self.sh64 = self.sh32.to(_F64)
        self.prepared = None  # (centres f64, their shifted fp32 copy, |c'|^2 fp32) from the last step
        self._bound = {}  # step_into's bound launches per (src, dst) slot pair

    def step(self, centers, labels_old=None):
        """One Lloyd step from ``centers`` [K, D] float64.

        Returns
        -------
        tuple
            ``labels`` [N] int32, ``new`` [K, D] float64 centres (``sums / counts``; meaningless
            rows for empty clusters), ``scalars`` [4] float64 on the device: clusters left empty,
            ``|new - centers|^2``, the inertia, and the number of labels that differ from
            ``labels_old`` (int32 [N]; 0 without it).
        """
        K, D, dev = self.K, self.D, self.X.device
        c64 = centers.to(_F64).contiguous()
        if self.prepared is not None and self.prepared[0] is c64:
            cs, csq = self.prepared[1], self.prepared[2]
        else:
            csd = c64 - self.sh64
            cs, csq = csd.to(torch.float32).contiguous(), (csd * csd).sum(1).to(torch.float32)
        labels, red = _lloyd_launch(self.X, cs, csq, self.sh32, self.w, self.plan, labels_old)
        new = torch.empty((K, D), dtype=_F64, device=dev)
        cs_next = torch.empty((K, D), dtype=torch.float32, device=dev)
        csq_next = torch.empty(K, dtype=torch.float32, device=dev)
        out = torch.empty(4, dtype=_F64, device=dev)
        launch(_lloyd_finalize_kernel, (1,), (red, c64, self.sh64, new, cs_next, csq_next, out, K, D),
               dict(BLOCK_K=self.plan["BLOCK_K"], BLOCK_D=self.plan["BLOCK_D"]), num_warps=4)
        self.prepared = (new, cs_next, csq_next)
        return labels, new, out

    def new_slot(self):
        """Persistent buffers of one step's results, for :meth:`step_into`: ``C`` [K, D] float64
        centres, ``CS`` / ``CSQ`` their shifted fp32 copy and squared norms, ``labels`` [N] int32,
        ``out`` [4] float64 scalars (as :meth:`step`'s), ``red`` the reduced partials."""
        K, D, dev = self.K, self.D, self.X.device
        bk, bd = self.plan["BLOCK_K"], self.plan["BLOCK_D"]
        return {"C": torch.zeros((K, D), dtype=_F64, device=dev), "CS": torch.zeros((K, D), dtype=torch.float32, device=dev),
                "CSQ": torch.zeros(K, dtype=torch.float32, device=dev),
                "labels": torch.zeros(self.X.shape[0], dtype=torch.int32, device=dev),
                "out": torch.zeros(4, dtype=_F64, device=dev), "red": torch.zeros(bk * bd + bk + 2, dtype=_F64, device=dev)}

    def load(self, slot, centers, labels=None):
        """Write ``centers`` [K, D] (and ``labels`` [N]) into ``slot`` as if a step had produced them."""
        c64 = centers.to(_F64)
        csd = c64 - self.sh64
        slot["C"].copy_(c64)
        slot["CS"].copy_(csd)
        slot["CSQ"].copy_((csd * csd).sum(1))
        if labels is not None:
            slot["labels"].copy_(labels)

    def step_into(self, src, dst):
        """:meth:`step` from ``src``'s centres with ``src``'s labels as the previous ones, results
        into ``dst`` (both from :meth:`new_slot`; ``dst`` must not be ``src``).

        Fixed buffers and no host synchronisation, so the step can be replayed from a CUDA graph;
        eager, each (src, dst) pair's two launches are bound once (:func:`fusedml._launch.bind`:
        no per-call argument keys) and the partials reused, so a step costs three host calls.
        """
        key = (id(src["C"]), id(dst["C"]))
        fn = self._bound.get(key)
        if fn is None:
            fn = self._bound[key] = self._bind(src, dst)
        fn()

    def _bind(self, src, dst):
        plan = self.plan
        kernel, P, consts, opts, args = _lloyd_spec(self.X, src["CS"], src["CSQ"], self.sh32, self.w, plan,
                                                    src["labels"], dst["labels"])
        part = torch.empty((P, plan["BLOCK_K"] * plan["BLOCK_D"] + plan["BLOCK_K"] + 2), dtype=torch.float32,
                           device=self.X.device)
        step = bind(kernel, (P,), args(part), consts, **opts)
        fin = bind(_lloyd_finalize_kernel, (1,), (dst["red"], src["C"], self.sh64, dst["C"], dst["CS"], dst["CSQ"],
                                                  dst["out"], self.K, self.D),
                   dict(BLOCK_K=plan["BLOCK_K"], BLOCK_D=plan["BLOCK_D"]), num_warps=4)
        red = dst["red"]

        def run():
            step()
            torch.sum(part, 0, dtype=_F64, out=red)
            fin()
        return run


def _lloyd_torch(X, Cs, csq, shift, w, labels_only=False):
    """Operator-level Lloyd step: blocked GEMM distances, ``argmin``, ``index_add_`` sums
    (``labels_only``: the labels alone, ``(labels, None, None, None)``)."""
    N, D = X.shape
    K = Cs.shape[0]
    ct = torch.float64 if X.dtype == _F64 else torch.float32
    Cs, csq, shift = Cs.to(ct), csq.to(ct), shift.to(ct)
    labels = torch.empty(N, dtype=torch.int64, device=X.device)
    sums = counts = inertia = None
    if not labels_only:
        sums = torch.zeros((K, D), dtype=_F64, device=X.device)
        counts = torch.zeros(K, dtype=_F64, device=X.device)
        inertia = torch.zeros((), dtype=_F64, device=X.device)
    step = max(1, _BLOCK_ELEMS // (D + K))
    for s in range(0, N, step):
        xs = X[s:s + step].to(ct) - shift  # [B, D]
        d2 = ((xs * xs).sum(1, keepdim=True) - 2.0 * (xs @ Cs.T) + csq).clamp_(min=0.0)  # [B, K]
        mind, lab = d2.min(1)
        labels[s:s + step] = lab
        if labels_only:
            continue
        wb = None if w is None else w[s:s + step].to(ct)
        sums.index_add_(0, lab, (xs if wb is None else xs * wb[:, None]).to(_F64))
        counts += torch.bincount(lab, weights=None if wb is None else wb.to(_F64), minlength=K).to(_F64)
        inertia += (mind if wb is None else mind * wb).sum(dtype=_F64)
    return labels, sums, counts, inertia


def central_rows(n: int) -> range:
    """The rows (at most 1024, spread over ``n``) whose mean is :func:`lloyd_step`'s default shift.

    Parameters
    ----------
    n : int
        Number of rows of X.

    Returns
    -------
    range
    """
    return range(0, n, max(1, -(-n // 1024)))


def _central_point(X: torch.Tensor) -> torch.Tensor:
    """The float64 mean [D] of X's :func:`central_rows`: one small strided read, no pass."""
    return X[::central_rows(X.shape[0]).step].to(_F64).mean(0)


def _shifted_centres(X, C, sh):
    """``(shift, C - shift [K, D], ||C - shift||^2 [K])`` in float64. The shift X is moved by is
    fp32 unless X is float64 (kernel and torch path alike), so the centres move by the same vector
    (an unrounded one put 1e7-offset data 0.5 off: inertia 139 against 76)."""
    sh = sh.to(_F64) if X.dtype == _F64 else sh.to(torch.float32).to(_F64)
    Cs = C.to(_F64) - sh
    return sh, Cs, (Cs * Cs).sum(1)


def nearest_labels(X: torch.Tensor, centers: torch.Tensor, backend: str = "auto", *, shift=None) -> torch.Tensor:
    """The nearest centre of every row: :func:`lloyd_step`'s labels, without its per-cluster sums
    where the fused kernel does not run (their ``index_add_`` onto K rows is most of an ops step).

    Parameters
    ----------
    X : torch.Tensor, shape [N, D]
        Dense data, already validated (finite, non-empty).
    centers : torch.Tensor, shape [K, D]
        On X's device.
    backend : {"auto", "fused", "ops", "cpu"}
    shift : torch.Tensor, shape [D], optional
        As :func:`lloyd_step`'s (default: the mean of up to 1024 rows spread over X); row blocks of
        one matrix given its shift get that matrix's labels.

    Returns
    -------
    torch.Tensor
        ``[N]`` int64.
    """
    be = resolve_backend(backend, X.device)
    sh = _central_point(X) if shift is None else shift
    if be == "fused" and X.dtype != _F64 and lloyd_plan(*X.shape, centers.shape[0], X.device) is not None:
        return lloyd_step(X, centers, shift=sh, backend=be, check_finite=False).labels
    sh, Cs, csq = _shifted_centres(X, centers, sh)
    return _lloyd_torch(X, Cs, csq, sh, None, labels_only=True)[0]


def lloyd_step(X, centers, *, sample_weight=None, shift=None, backend="auto", check_finite=True, plan=None):
    """One Lloyd step of k-means: nearest centres and per-cluster sums, in one pass over X.

    Parameters
    ----------
    X : torch.Tensor or numpy.ndarray, shape [N, D]
        Dense data (float16, bfloat16, float32 or float64; any strides). Not modified.
    centers : torch.Tensor or numpy.ndarray, shape [K, D]
        The current centres.
    sample_weight : torch.Tensor or numpy.ndarray, shape [N], optional
        Non-negative row weights ``s_n`` (ones if None).
    shift : torch.Tensor or numpy.ndarray, shape [D], optional
        Vector subtracted from X and the centres before the expanded distances and the sums
        (fp32 on the fused path: they round relative to ``|x - shift|``). Default: the mean of
        up to 1024 rows spread over X, a central point of the data (the centres' mean can lie
        far from it: one outlying or empty centre moves it, and the sums then lose digits).
    backend : {"auto", "fused", "ops", "cpu"}
        ``"fused"``: the Triton kernel (float64 X, or ``K`` and ``D`` too large for the kernel's
        register budget (:func:`lloyd_plan`), run the operator-level path instead);
        ``"ops"``/``"cpu"``: blocked torch (GEMM distances, ``argmin``, ``index_add_``).
    check_finite : bool
        Reject NaN/inf in X, the centres and the weights (one device pass).
    plan : dict, optional
        Overrides of the fused kernel's launch plan (:func:`lloyd_plan`), for sweeps.

    Returns
    -------
    LloydStep
        ``labels`` [N] int64, ``sums`` [K, D] float64, ``counts`` [K] float64, ``inertia`` 0-d
        float64, ``backend``. The new centres of the non-empty clusters are ``sums / counts``.

    Examples
    --------
    >>> import torch, fusedml
    >>> X = torch.tensor([[0.0, 0.0], [0.0, 1.0], [10.0, 10.0]])
    >>> r = fusedml.lloyd_step(X, torch.tensor([[0.0, 0.0], [9.0, 9.0]]), backend="cpu")
    >>> r.labels.tolist(), r.counts.tolist()
    ([0, 0, 1], [2.0, 1.0])
    """
    X = to_tensor(X, "X", ndim=2)
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"X must be non-empty, got shape {tuple(X.shape)}")
    N, D = X.shape
    C = to_tensor(centers, "centers", ndim=2, device=X.device)
    if C.shape[1] != D or C.shape[0] == 0:
        raise ValueError(f"centers must have shape [K >= 1, D={D}], got {tuple(C.shape)}")
    K = C.shape[0]
    w = None
    if sample_weight is not None:
        w = to_tensor(sample_weight, "sample_weight", ndim=1, device=X.device)
        if w.shape[0] != N:
            raise ValueError(f"sample_weight must have shape [N={N}], got {tuple(w.shape)}")
    if shift is None:
        sh = _central_point(X)
    else:
        sh = to_tensor(shift, "shift", ndim=1, device=X.device)
    if sh.shape[0] != D:
        raise ValueError(f"shift must have shape [D={D}], got {tuple(sh.shape)}")
    if check_finite:
        _check_finite(X, "X")
        _check_finite(C, "centers")
        _check_finite(sh, "shift")
        if w is not None:
            _check_finite(w, "sample_weight")
            if bool((w < 0).any()):
                raise ValueError("sample_weight must be non-negative")
    be = resolve_backend(backend, X.device)
    plan = lloyd_plan(N, D, K, X.device, **(plan or {})) if be == "fused" and X.dtype != _F64 else None
    sh, Cs, csq = _shifted_centres(X, C, sh)
    if plan is not None:
        f32 = torch.float32
        labels, sums_s, counts, inertia = _lloyd_fused(
            X, Cs.to(f32).contiguous(), csq.to(f32).contiguous(), sh.to(f32).contiguous(),
            None if w is None else w.to(f32).contiguous(), plan)
    else:
        labels, sums_s, counts, inertia = _lloyd_torch(X, Cs, csq, sh, w)
        be = be if be != "fused" else "ops"
    sums = sums_s + counts[:, None] * sh[None, :]  # undo the shift: sum s_n x_n
    return LloydStep(labels=labels, sums=sums, counts=counts, inertia=inertia, backend=be)
