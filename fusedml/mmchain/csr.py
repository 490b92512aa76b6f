r"""Fused CSR kernels for ``w = alpha * A^T (v ⊙ (A y)) + beta * z``: one read of A with atomics
("scatter"), or two atomic-free passes over A and a cached CSC copy ("gather").

Math
----
For a CSR matrix ``A`` [N, D] (optionally ``[A, 1]`` with an implicit ones column, ``intercept``),
``y`` [D(+1), m], ``v`` [N, m]::

    t_n = Σ_k A_nk y_k (+ y_D)               (row n's gather: one read of row n)
    p_n = alpha * v_n ⊙ t_n                   (v_op="mul")
    p_n = alpha * v_n ⊙ (t_n − Σ_l v_nl t_nl)  (v_op="softmax", the multinomial Hessian)
    w_k += A_nk p_n   for each stored (n, k);  w_D += p_n   (the scatter, while row n is on chip)
    w  += beta * z

With ``y=None`` the gather is skipped and ``p_n = alpha * v_n``.

Scatter strategy: kernel design (the PPoPP'15 "one read" pattern for sparse)
----------------------------------------------------------------------------
* **Row-block kernel** (``_csr_rows_kernel``): a program owns ``BLOCK_R`` rows and gathers their
  nonzeros as one ``[BLOCK_R, L]`` tile (``L`` a power of two covering the rows' lengths): ``t`` is a
  tile reduction, ``p`` is computed in registers, and ``val * p`` is scattered into ``w[col]`` with
  relaxed ``atomic_add`` (result unused -> compiled to ``RED``). When every row of the launch fits
  in ``L`` (``SINGLE``) the tile stays in registers between the gather and the scatter: A is read
  exactly once. Otherwise the program loops over its rows in ``L``-wide steps twice (t, then
  scatter); the second loop re-reads the block (``BLOCK_R * L`` nonzeros, a few KB) from L1/L2,
  not DRAM.
* **Scheduling** (cached per matrix, see ``_structure``): the model (:func:`csr_config`) picks
  either *ordered* mode — rows in storage order, one launch, when lengths are homogeneous — or
  *binned* mode for skewed (power-law) profiles: rows are stably sorted into power-of-two length
  bins (one launch per non-empty bin, ``L`` = the bin's width, ``BLOCK_R = tile / L``; stable so
  rows of one bin keep their storage order and stream), and rows longer than ``long_threshold``
  go to the long-row kernels.
* **Long rows** (``_csr_long_partial_kernel`` + ``_csr_long_finish_kernel``): a long row is split
  into ``ceil(len / chunk)`` programs. Pass 1 writes each chunk's partial ``t`` to a buffer (no
  atomics); pass 2 (one program per chunk) sums its row's partials in a fixed order, forms ``p``
  and re-reads its chunk to scatter. Byte cost: long rows' values and indices are read twice
  (+8 B per long-row nonzero for fp32/int32; the second read mostly hits L2, 50 MB on the H200,
  because pass 2 starts right after pass 1) plus ``16 * m`` B per chunk of partials; short rows
  keep the single read.
* **Pre-aggregation before global atomics**: the intercept column's ``Σ_n p_n`` is summed per
  program and written to a per-program buffer (no same-address atomics at all; reduced once at
  the end). Within a row columns are unique, so every remaining atomic targets a distinct
  ``w[col, :]`` m-vector (contiguous, one ``RED`` per element). ``A``'s values and indices are
  loaded with ``evict_first`` so the stream does not push ``y`` and ``w`` (``(D+1) * m`` words,
  the atomics' and gathers' targets) out of L2.
* **deterministic=True** uses the gather strategy below (no float atomics anywhere).

Gather strategy (``strategy="gather"``; the model's usual pick, see :func:`csr_config`)
--------------------------------------------------------------------------------------
The scatter above is bound by L2 operations, not bytes: one random ``y`` gather plus one RED per
nonzero (100 G REDs/s fitted on an H200, ~5x the time of the one read), so the alternative pays a
second read and a second random gather instead of the atomics (see :func:`csr_config`):

* Once per matrix (cached with the structure, weakly keyed on ``A.crow``; rebuilt when ``A.val``
  is another tensor or changed in place, checked by identity + ``_version``): the **CSC copy** of
  A -- column pointers [D+1], the row id of each entry (int32 while N, nnz < 2^31) and a copy of
  the values, column-major (stable sort of the column indices: rows ascending within a column).
  That is a full transposed copy, 2x the memory of A, exactly what the "ops" baseline's cached
  transpose also pays.
* Per call, pass 1 = the row kernel over A in MODE 2: ``t = A y`` and ``p = alpha v ⊙ t`` (or the
  softmax form), written to a ``[N, m]`` buffer, the intercept's ``Σ_n p_n`` as per-program
  partials (summed in a fixed order). Pass 2 = the same row kernel over the copy in MODE 0:
  ``w_c = Σ_{n in column c} A_nc p_n`` (+ ``beta z_c`` in the epilogue), one fixed-order sum per
  column, no atomics: the result is bitwise reproducible. ``y=None`` skips pass 1 (pass 2 gathers
  ``v`` and scales by alpha). The copy's column-length profile has its own statistics, bins and
  long-column split (a power-law matrix's popular columns).
* Bytes: ``2 (b_val + b_idx) nnz`` + pointers + ``p`` written and read: ~2.1x the one-read floor
  for m = 1. Time: the two passes' ``2 nnz`` random gathers (one 32-byte L2 sector each, ~120 G/s
  on an H200) bind, not the bytes: ~8x the floor, the same wall as cuSPARSE's two SpMVs.
* **Cache blocking** (``CSRConfig.tile_bytes``, m = 1; :func:`_tile_plan` decides per pass): a
  gathered vector larger than L1 makes every gather an L2 sector operation, but a slice of
  <= 128 KB stays in L1 (436 G/s on an H200 against ~140, ``benchmarks/gather_probe.py``). A pass
  whose vector is larger then reads a flat stream instead (:class:`_Stream`, cached like the CSC
  copy): the nonzeros sorted by (32 KB tile of the vector, output), so the persistent programs
  running at once gather from one slice; segment (t, r) holds output r's part from tile t.
  Per nonzero a 16-bit index within the tile (with the segment start and end flags) and the
  value: 6 bytes for fp32 against 8 in CSR; per segment a 4-byte output id. Each tile's run is
  padded to whole blocks of 2048 (aligned, unmasked 16-byte loads: unpadded, an earlier form ran
  at half the rate). ``_stream_gather_kernel`` scans each block (segmented sum, whose segment
  count also numbers the segments) and adds each segment's total to its output with one atomic
  (measured faster than storing per-(tile, output) partials and summing the tiles afterwards).
  ``tl.atomic_add`` converts address, value and mask to a layout of its own (6 of the loop's 8
  barriers on sm_90), which lets a warp's adds to neighbouring outputs coalesce; an inline
  ``red`` in the scan's layout (``_red_add``) was 12 % slower on tiled streams (short segments)
  and 2.5 % faster on flat ones (rows), so only flat streams use it (``STREAM_INLINE_RED``).
  Session 8's form (int32 segment id + int32 index per nonzero, per-tile partials summed
  afterwards): on the H200 the power-law 1M x 100k mmchain 0.43 ms against 0.55 untiled and 0.47
  for cuSPARSE with a cached transpose; its matvec 0.18 against 0.28-0.32 ms.
* **Flat streams** (``CSRConfig.flat``, :func:`_flat_plan`): a pass that no tile suits (segments of
  about one nonzero a tile: wide power-law matrices) but whose vector outgrows L1 reads the same
  format with ONE tile and 32-bit keys (30 index bits; 8 bytes per fp32 nonzero, as CSR): the row
  kernel's work in one nnz-balanced launch with outputs in storage order, where the row kernel
  took a launch per length bin plus the long-row split and, over the copy of a wide matrix,
  read millions of short columns' pointers and stored their sums at random (binned order).
  H100, 1M x 4M power-law: 0.769 -> 0.611 ms (ops' cached transpose 0.628).

Both strategies: what the kernels do about the L2-operation bound
-----------------------------------------------------------------
* A's values and indices are a stream (``_stream``): L2 ``evict_first``, and ``.cg`` (no L1
  allocation, ``CSRConfig.l1_bypass``) when the gathered vector is at most ~1 MB, so L1 holds
  only vector lines and some gathers hit L1 instead of costing an L2 sector operation.
* Rows looped in ``L``-wide steps accumulate ``vals * y[cols]`` element-wise and reduce once
  after the loop (no cross-warp reduction, with its barriers, per step); homogeneous rows longer
  than a tile (the CSC copy of a uniform matrix) use that loop with several rows per program
  rather than the two-kernel long-row split; long-row chunks are kept in L2 (``evict_last``) only
  when the finish kernel re-reads them (the scatter).
* No host-device synchronisation per call (``alpha``/``beta`` live in a cached device tensor), and
  the model's pick is cached per matrix: on short calls host time between launches is GPU time.

* Indices: ``crow`` int64 -> all nonzero offsets in int64; int32 indices are loaded as int32 and
  only widened where ``(D+1) * m`` could pass 2^31. Every gather is masked (the interpreter does
  not catch out-of-bounds loads).
"""
from __future__ import annotations

import dataclasses
import math
import os
import weakref
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fusedml._dispatch import interpret_mode
from fusedml._launch import call
from fusedml._validation import CSRMatrix

from ._checks import check_launch_fields

__all__ = [
    "CSRConfig",
    "CSRStats",
    "csr_config",
    "csr_stats",
    "csr_sweep_configs",
    "csr_mmchain_fused",
    "csr_matvec_fused",
]

MAX_M = 16
# Fill every buffer a kernel must fully overwrite with NaN (tests switch this on, so unwritten
# elements show up); the environment variable does the same for a whole run.
POISON_OUTPUTS = os.environ.get("FUSEDML_POISON", "0") not in ("", "0")


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _row_mask(nz_mask, jmask, S: tl.constexpr, MP: tl.constexpr):
    """``[BLOCK_R, L, MP]`` mask of gathered / scattered rows of stride ``S``: rows padded to MP
    (``S == MP``, zeros in the padding) need no column mask, so each row is one vector access."""
    j = tl.arange(0, MP)
    if S == MP:
        return nz_mask[:, :, None] & (j < S)[None, None, :]
    else:
        return nz_mask[:, :, None] & jmask[None, None, :]


@triton.jit
def _gather_dot(y_ptr, cols, vals, nz_mask, j, jmask, S: tl.constexpr, MP: tl.constexpr):
    """``[BLOCK_R, MP]`` row sums of ``vals * y[cols, :]`` for a ``[BLOCK_R, L]`` tile (y's rows ``S`` apart)."""
    if MP == 1:  # m = 1: stay 2-D (no 3-D layouts or conversions)
        yg = tl.load(y_ptr + cols, mask=nz_mask, other=0.0, eviction_policy="evict_last")
        return tl.sum(vals * yg, axis=1)[:, None]
    elif S == MP and MP <= 4:  # whole rows, flattened as in _gather_prod
        return tl.sum(tl.reshape(_gather_prod(y_ptr, cols, vals, nz_mask, j, jmask, S, MP),
                                 [cols.shape[0], cols.shape[1], MP]), axis=1)
    else:
        yg = tl.load(y_ptr + cols[:, :, None] * S + j[None, None, :], mask=_row_mask(nz_mask, jmask, S, MP),
                     other=0.0, eviction_policy="evict_last")
        return tl.sum(vals[:, :, None] * yg, axis=1)


@triton.jit
def _stream(ptr, mask, L1_BYPASS: tl.constexpr, KEEP: tl.constexpr = False):
    """Load A's values or indices (read once): ``evict_first`` so the stream does not push the
    gathered vector out of the caches; ``L1_BYPASS`` (``.cg``) keeps it out of L1 altogether, which
    then holds only gathered-vector lines; ``KEEP`` (``evict_last``) when a second kernel re-reads
    them."""
    if KEEP:
        return tl.load(ptr, mask=mask, other=0, eviction_policy="evict_last")
    elif L1_BYPASS:
        # (ptxas rejects .cg with an L1 eviction hint; a vector this small stays hot in L2 anyway)
        return tl.load(ptr, mask=mask, other=0, cache_modifier=".cg")
    else:
        return tl.load(ptr, mask=mask, other=0, eviction_policy="evict_first")


@triton.jit
def _gather_prod(y_ptr, cols, vals, nz_mask, j, jmask, S: tl.constexpr, MP: tl.constexpr):
    """Unreduced ``vals * y[cols, :]``: ``[BLOCK_R, L]`` (MP = 1) or ``[BLOCK_R, L, MP]`` (rows ``S`` apart)."""
    if MP == 1:
        # gathered as a 1-D vector: Triton 3.6 gave the 2-D gather (no contiguity on either axis)
        # a column-first layout, so the loop converted the streamed tiles to it every step
        # (shared memory, 4-6 bar.sync per step on sm_90); the reshapes keep the stream's layout
        n: tl.constexpr = cols.shape[0] * cols.shape[1]
        yg = tl.load(y_ptr + tl.reshape(cols, [n]), mask=tl.reshape(nz_mask, [n]), other=0.0,
                     eviction_policy="evict_last")
        return vals * tl.reshape(yg, [cols.shape[0], cols.shape[1]])
    elif S == MP and MP <= 4:  # whole rows, flattened: [BLOCK_R * L, MP]
        n: tl.constexpr = cols.shape[0] * cols.shape[1]
        yg = tl.load(y_ptr + tl.reshape(cols, [n])[:, None] * S + tl.arange(0, MP)[None, :],
                     mask=tl.reshape(nz_mask, [n])[:, None], other=0.0, eviction_policy="evict_last")
        return tl.reshape(vals, [n])[:, None] * yg
    else:
        yg = tl.load(y_ptr + cols[:, :, None] * S + j[None, None, :], mask=_row_mask(nz_mask, jmask, S, MP),
                     other=0.0, eviction_policy="evict_last")
        return vals[:, :, None] * yg


@triton.jit
def _scatter(out_ptr, cols, vals, p, nz_mask, j, jmask, S: tl.constexpr, MP: tl.constexpr):
    """``out[cols, :] += vals * p`` for a ``[BLOCK_R, L]`` tile and ``p`` ``[BLOCK_R, MP]`` (RED; out's
    rows ``S`` apart; with ``S == MP`` p's padding columns are zeros)."""
    if MP == 1:  # as a 1-D vector, as in _gather_prod (Triton 3.6's layout otherwise: bar.sync per step)
        n: tl.constexpr = cols.shape[0] * cols.shape[1]
        tl.atomic_add(out_ptr + tl.reshape(cols, [n]), tl.reshape(vals * p, [n]), mask=tl.reshape(nz_mask, [n]),
                      sem="relaxed")
    elif S == MP and MP <= 4:  # whole rows, flattened: [BLOCK_R * L, MP]
        n: tl.constexpr = cols.shape[0] * cols.shape[1]
        vp = tl.reshape(vals[:, :, None] * p[:, None, :], [n, MP])
        tl.atomic_add(out_ptr + tl.reshape(cols, [n])[:, None] * S + tl.arange(0, MP)[None, :], vp,
                      mask=tl.reshape(nz_mask, [n])[:, None], sem="relaxed")
    else:
        tl.atomic_add(out_ptr + cols[:, :, None] * S + j[None, None, :], vals[:, :, None] * p[:, None, :],
                      mask=_row_mask(nz_mask, jmask, S, MP), sem="relaxed")


@triton.jit
def _csr_rows_kernel(
    crow_ptr,  # [R + 1] row pointers (int32/int64) of the structure being read (A, or its CSC copy)
    col_ptr,  # [nnz] column indices (row indices of A for the CSC copy)
    val_ptr,  # [nnz] values (storage dtype)
    rows_ptr,  # [n_slots] row ids of the schedule (ROW_PERM), else unused
    y_ptr,  # [C(+1), YS] accumulation dtype (HAS_Y); p [N, YS] for the gather pass over the CSC
    v_ptr,  # [R, M] or [R, 1] broadcast over the m columns (HAS_V)
    z_ptr,  # [R, M] (MODE 0, HAS_Z): out = coef[0] * t + coef[1] * z
    out_ptr,  # MODE 0: t [R, M]; MODE 1: w [C(+1), PS] (scatter); MODE 2: p [R, PS]
    ipart_ptr,  # [n_programs_total, MP] per-program intercept partial sums (MODE 1/2, INTERCEPT)
    slot_lo,  # first schedule slot of this launch
    slot_hi,  # one past the last slot
    prog_base,  # this launch's first row in ipart
    n_cols,  # C: row index of the intercept entry of y / w
    coef_ptr,  # [2] (alpha, beta) in the accumulation dtype (a float argument would be fp32)
    M: tl.constexpr,  # m (row stride of t and z)
    MP: tl.constexpr,  # next power of two >= M
    YS: tl.constexpr,  # row stride of y: M, or MP for rows padded with zeros (one vector load per gather)
    PS: tl.constexpr,  # row stride of w (MODE 1) and p (MODE 2): M, or MP (padding columns get zeros)
    VM: tl.constexpr,  # row stride of v: M, or 1 for a [R, 1] v broadcast over the columns
    BLOCK_R: tl.constexpr,
    L: tl.constexpr,
    SINGLE: tl.constexpr,  # every row of the launch has <= L nonzeros: one tile, kept in registers
    HAS_Y: tl.constexpr,
    HAS_V: tl.constexpr,
    HAS_Z: tl.constexpr,
    INTERCEPT: tl.constexpr,
    SOFTMAX: tl.constexpr,
    MODE: tl.constexpr,  # 0: store coef0 * (A y) (+ coef1 * z); 1: scatter w += A^T p; 2: store p
    ROW_PERM: tl.constexpr,
    WIDE: tl.constexpr,  # (C+1) * M may pass 2^31: widen int32 column indices
    ACC64: tl.constexpr,
    L1_BYPASS: tl.constexpr,  # load A with .cg: L1 left to the gathered vector (see _stream)
):
    acc_t = tl.float64 if ACC64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    slots = slot_lo + pid * BLOCK_R + tl.arange(0, BLOCK_R)  # [BLOCK_R] int64
    rmask = slots < slot_hi
    if ROW_PERM:
        rows = tl.load(rows_ptr + slots, mask=rmask, other=0).to(tl.int64)
    else:
        rows = slots
    start = tl.load(crow_ptr + rows, mask=rmask, other=0)  # [BLOCK_R] crow dtype
    end = tl.load(crow_ptr + rows + 1, mask=rmask, other=0)
    length = end - start
    j = tl.arange(0, MP)
    jmask = j < M
    rj_mask = rmask[:, None] & jmask[None, :]  # [BLOCK_R, MP]
    lane = tl.arange(0, L)

    t = tl.zeros([BLOCK_R, MP], dtype=acc_t)
    if SINGLE:
        # [BLOCK_R, L] tile of the block's nonzeros, loaded once and kept for the scatter.
        nz_mask = lane[None, :] < length[:, None]
        off = start[:, None] + lane[None, :]
        cols = _stream(col_ptr + off, nz_mask, L1_BYPASS)
        if WIDE:
            cols = cols.to(tl.int64)
        vals = _stream(val_ptr + off, nz_mask, L1_BYPASS).to(acc_t)
        if HAS_Y:
            t = _gather_dot(y_ptr, cols, vals, nz_mask, j, jmask, YS, MP)
    else:
        max_len = tl.max(length, axis=0)
        if HAS_Y:
            # Element-wise partial sums, reduced once after the loop (a per-step tl.sum would be a
            # cross-warp reduction with two barriers in every step).
            if MP == 1:
                acc = tl.zeros([BLOCK_R, L], dtype=acc_t)
            elif YS == MP and MP <= 4:  # whole rows: flattened [BLOCK_R * L, MP] (no 3-D layout in the loop)
                acc = tl.zeros([BLOCK_R * L, MP], dtype=acc_t)
            else:
                acc = tl.zeros([BLOCK_R, L, MP], dtype=acc_t)
            for k in range(0, max_len, L):
                nz_mask = (k + lane)[None, :] < length[:, None]
                off = start[:, None] + (k + lane)[None, :]
                cols = _stream(col_ptr + off, nz_mask, L1_BYPASS)
                if WIDE:
                    cols = cols.to(tl.int64)
                vals = _stream(val_ptr + off, nz_mask, L1_BYPASS).to(acc_t)
                acc += _gather_prod(y_ptr, cols, vals, nz_mask, j, jmask, YS, MP)
            if MP == 1:
                t = tl.sum(acc, axis=1)[:, None]
            elif YS == MP and MP <= 4:
                t = tl.sum(tl.reshape(acc, [BLOCK_R, L, MP]), axis=1)
            else:
                t = tl.sum(acc, axis=1)
    if HAS_Y:
        if INTERCEPT:
            y_last = tl.load(y_ptr + n_cols * YS + j, mask=jmask, other=0.0)
            t += y_last[None, :]

    if MODE == 0:
        t = t * tl.load(coef_ptr)
        if HAS_Z:
            zz = tl.load(z_ptr + rows[:, None] * M + j[None, :], mask=rj_mask, other=0.0)
            t += tl.load(coef_ptr + 1) * zz
        tl.store(out_ptr + rows[:, None] * M + j[None, :], t, mask=rj_mask)
    else:
        if HAS_V:
            vv = tl.load(v_ptr + rows[:, None] * VM + j[None, :] * (VM // M), mask=rj_mask, other=0.0)
        else:
            vv = tl.where(rj_mask, 1.0, 0.0).to(acc_t)
        if HAS_Y:
            if SOFTMAX:
                s = tl.sum(vv * t, axis=1)  # [BLOCK_R]
                p = vv * (t - s[:, None])
            else:
                p = vv * t
        else:
            p = vv
        p = tl.where(rj_mask, p * tl.load(coef_ptr), 0.0)
        if INTERCEPT:
            # Pre-aggregated over the block: one [MP] partial per program, no atomics.
            tl.store(ipart_ptr + (prog_base + pid) * MP + j, tl.sum(p, axis=0))
        if MODE == 2:
            tl.store(out_ptr + rows[:, None] * PS + j[None, :], p, mask=rj_mask if PS == M else rmask[:, None])
        elif SINGLE:
            _scatter(out_ptr, cols, vals, p, nz_mask, j, jmask, PS, MP)
        else:
            for k in range(0, max_len, L):
                nz_mask = (k + lane)[None, :] < length[:, None]
                off = start[:, None] + (k + lane)[None, :]
                cols = tl.load(col_ptr + off, mask=nz_mask, other=0)
                if WIDE:
                    cols = cols.to(tl.int64)
                vals = tl.load(val_ptr + off, mask=nz_mask, other=0).to(acc_t)
                _scatter(out_ptr, cols, vals, p, nz_mask, j, jmask, PS, MP)


@triton.jit
def _csr_long_partial_kernel(
    crow_ptr,  # [R + 1]
    col_ptr,  # [nnz]
    val_ptr,  # [nnz]
    long_rows_ptr,  # [n_long] row ids of the long rows
    chunk_row_ptr,  # [n_chunks] int32: index into long_rows of each chunk
    chunk_first_ptr,  # [n_long + 1] int32: first chunk of each long row
    y_ptr,  # [C(+1), YS]
    part_ptr,  # [n_chunks, MP] partial t of each chunk (written, no atomics)
    CHUNK,  # nonzeros per chunk
    M: tl.constexpr,
    MP: tl.constexpr,
    YS: tl.constexpr,  # row stride of y (M or MP)
    PS: tl.constexpr,  # (the finish kernel's; unused here)
    PIECE: tl.constexpr,  # nonzeros per loop step
    WIDE: tl.constexpr,
    ACC64: tl.constexpr,
    REREAD: tl.constexpr,  # the finish kernel re-reads the chunk (scatter): keep it in L2
    L1_BYPASS: tl.constexpr,
):
    acc_t = tl.float64 if ACC64 else tl.float32
    c = tl.program_id(0).to(tl.int64)
    li = tl.load(chunk_row_ptr + c).to(tl.int64)
    row = tl.load(long_rows_ptr + li).to(tl.int64)
    first = tl.load(chunk_first_ptr + li).to(tl.int64)
    start = tl.load(crow_ptr + row).to(tl.int64)
    end = tl.load(crow_ptr + row + 1).to(tl.int64)
    lo = start + (c - first) * CHUNK
    hi = tl.minimum(lo + CHUNK, end)
    j = tl.arange(0, MP)
    jmask = j < M
    lane = tl.arange(0, PIECE)
    acc = tl.zeros([PIECE, MP], dtype=acc_t)
    for k in range(lo, hi, PIECE):
        off = k + lane
        nz_mask = off < hi
        cols = _stream(col_ptr + off, nz_mask, L1_BYPASS, REREAD)
        if WIDE:
            cols = cols.to(tl.int64)
        vals = _stream(val_ptr + off, nz_mask, L1_BYPASS, REREAD).to(acc_t)
        yg = tl.load(y_ptr + cols[:, None] * YS + j[None, :], mask=nz_mask[:, None] & jmask[None, :], other=0.0,
                     eviction_policy="evict_last")
        acc += vals[:, None] * yg
    tl.store(part_ptr + c * MP + j, tl.sum(acc, axis=0))


@triton.jit
def _csr_long_finish_kernel(
    crow_ptr,  # [R + 1]
    col_ptr,  # [nnz]
    val_ptr,  # [nnz]
    long_rows_ptr,  # [n_long]
    chunk_row_ptr,  # [n_chunks] int32
    chunk_first_ptr,  # [n_long + 1] int32
    part_ptr,  # [n_chunks, MP] partial t (HAS_Y)
    y_ptr,  # [C(+1), YS] (HAS_Y)
    v_ptr,  # [R, VM] (HAS_V)
    z_ptr,  # [R, M] (MODE 0, HAS_Z)
    out_ptr,  # MODE 0: t [R, M]; MODE 1: w [C(+1), PS]; MODE 2: p [R, PS]
    ipart_ptr,  # [n_programs_total, MP]
    prog_base,
    n_cols,
    coef_ptr,  # [2] (alpha, beta)
    CHUNK,
    M: tl.constexpr,
    MP: tl.constexpr,
    YS: tl.constexpr,  # row stride of y (M or MP)
    PS: tl.constexpr,  # row stride of w / p (MODE 1 / 2): M, or MP (padding columns get zeros)
    VM: tl.constexpr,
    PIECE: tl.constexpr,
    HAS_Y: tl.constexpr,
    HAS_V: tl.constexpr,
    HAS_Z: tl.constexpr,
    INTERCEPT: tl.constexpr,
    SOFTMAX: tl.constexpr,
    MODE: tl.constexpr,
    WIDE: tl.constexpr,
    ACC64: tl.constexpr,
):
    acc_t = tl.float64 if ACC64 else tl.float32
    c = tl.program_id(0).to(tl.int64)
    li = tl.load(chunk_row_ptr + c).to(tl.int64)
    row = tl.load(long_rows_ptr + li).to(tl.int64)
    first = tl.load(chunk_first_ptr + li).to(tl.int64)
    last = tl.load(chunk_first_ptr + li + 1).to(tl.int64)
    j = tl.arange(0, MP)
    jmask = j < M
    is_first = (j.to(tl.int64) * 0 + c) == first  # [MP] (a vector: the interpreter rejects scalar masks)
    t = tl.zeros([MP], dtype=acc_t)
    if HAS_Y:
        for q in range(first, last):  # fixed order: the same bits on every run
            t += tl.load(part_ptr + q * MP + j)
        if INTERCEPT:
            t += tl.load(y_ptr + n_cols * YS + j, mask=jmask, other=0.0)
    if MODE == 0:
        t = t * tl.load(coef_ptr)
        if HAS_Z:
            t += tl.load(coef_ptr + 1) * tl.load(z_ptr + row * M + j, mask=jmask, other=0.0)
        tl.store(out_ptr + row * M + j, t, mask=jmask & is_first)
    else:
        if HAS_V:
            vv = tl.load(v_ptr + row * VM + j * (VM // M), mask=jmask, other=0.0)
        else:
            vv = tl.where(jmask, 1.0, 0.0).to(acc_t)
        if HAS_Y:
            if SOFTMAX:
                p = vv * (t - tl.sum(vv * t, axis=0))
            else:
                p = vv * t
        else:
            p = vv
        p = tl.where(jmask, p * tl.load(coef_ptr), 0.0)
        if INTERCEPT:
            tl.store(ipart_ptr + (prog_base + c) * MP + j, tl.where(is_first, p, 0.0))
        if MODE == 2:
            tl.store(out_ptr + row * PS + j, p, mask=(j < PS) & is_first)
        else:
            start = tl.load(crow_ptr + row).to(tl.int64)
            end = tl.load(crow_ptr + row + 1).to(tl.int64)
            lo = start + (c - first) * CHUNK
            hi = tl.minimum(lo + CHUNK, end)
            lane = tl.arange(0, PIECE)
            for k in range(lo, hi, PIECE):
                off = k + lane
                nz_mask = off < hi
                cols = tl.load(col_ptr + off, mask=nz_mask, other=0, eviction_policy="evict_first")
                if WIDE:
                    cols = cols.to(tl.int64)
                vals = tl.load(val_ptr + off, mask=nz_mask, other=0, eviction_policy="evict_first").to(acc_t)
                tl.atomic_add(out_ptr + cols[:, None] * PS + j[None, :], vals[:, None] * p[None, :],
                              mask=nz_mask[:, None] & jmask[None, :], sem="relaxed")


@triton.jit
def _seg_add(c1, v1, c2, v2):
    # segmented sum (c: segment starts seen; a start on the right resets the sum): associative
    return c1 + c2, tl.where(c2 > 0, v2, v1 + v2)


_COMPILED = tl.constexpr(not interpret_mode())  # inline PTX: not under the interpreter


@triton.jit
def _red_add(ptr, val, mask, INLINE: tl.constexpr):
    """``*ptr += val`` where ``mask`` (fp32 / fp64; relaxed, GPU scope; no result). ``INLINE``: as
    an inline ``red`` in the operands' own layout (compiled only), where ``tl.atomic_add`` gets a
    one-element-per-thread layout of its own and converting address, value and mask to it costs
    three shared-memory round trips (6 barriers) per call."""
    if INLINE and _COMPILED:
        F64: tl.constexpr = val.dtype == tl.float64
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p red.global.gpu.relaxed.add." + ("f64" if F64 else "f32")
            + " [$1], $2; mov.u32 $0, 0; }", "=r,l," + ("l" if F64 else "r") + ",r",
            [ptr, val.to(tl.int64 if F64 else tl.int32, bitcast=True), mask.to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)
    else:
        tl.atomic_add(ptr, val, mask=mask, sem="relaxed")


@triton.jit
def _stream_gather_kernel(
    KEY,  # [nnz_pad] int16 (int32): bits 0-13 (0-29) index into the block's tile of VEC, then segment start, end (sign)
    VAL,  # [nnz_pad] values (any float dtype); the padding is 0
    SEGOUT,  # [n_seg] int32 output of each segment, in stream order (padding's: n_out)
    SEGBASE,  # [n_blocks] int32 segments starting before each block
    TILE,  # [n_blocks] int32 tile of each block
    VEC,  # [n_vec] accumulation dtype: the gathered vector
    OUT,  # [n_out + 1] accumulation dtype, zeroed: OUT[SEGOUT[seg(j)]] += VAL[j] * VEC[TILE per + idx(j)]
    n_blocks, per,
    BLOCK: tl.constexpr, ACC64: tl.constexpr, IDX_BITS: tl.constexpr = 14, INLINE_RED: tl.constexpr = False,
    CONTIG: tl.constexpr = 0,
):
    """Cache-blocked gather pass over a flat, segment-sorted nonzero stream (see ``_Stream``):
    persistent programs walk blocks ``pid, pid + P, ...`` so that the programs running at once sit
    in one tile of the gathered vector (L1 hits); per block, a segmented inclusive scan of the
    products, whose segment count also numbers the segments; each segment's total (at the block's
    last element: its part so far) goes to its output with one relaxed atomic. Blocks are whole
    (no masks: 16-byte loads) and never straddle a tile."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    for b in range(pid, n_blocks, nprog):
        o = b * BLOCK + offs  # < 2^31 (checked on the host)
        if CONTIG:  # cap the contiguity: CONTIG elements a thread, so a warp's adds cover 32 CONTIG neighbours
            o = tl.max_contiguous(o, CONTIG)
        kk = tl.load(KEY + o, cache_modifier=".cg").to(tl.int32)
        v = tl.load(VAL + o, cache_modifier=".cg")
        v = v.to(tl.float64) if ACC64 else v.to(tl.float32)
        prod = v * tl.load(VEC + tl.load(TILE + b) * per + (kk & ((1 << IDX_BITS) - 1)))
        cnt, tot = tl.associative_scan((((kk >> IDX_BITS) & 1).to(tl.float32), prod), 0, _seg_add)  # counts exact
        emit = (kk < 0) | (offs == BLOCK - 1)
        r = tl.load(SEGOUT + tl.load(SEGBASE + b) + cnt.to(tl.int32) - 1, mask=emit, other=0)
        _red_add(OUT + r, tot, emit, INLINE_RED)


@triton.jit
def _stream_weights_kernel(T, V, YD, P, ISUM, alpha, n, HAS_V: tl.constexpr, INTERCEPT: tl.constexpr,
                           BLOCK: tl.constexpr):
    """``p = alpha * v * (t + y[D])`` ([N], fp32) between the two streamed passes, and with the
    intercept ``ISUM += sum(p)`` (one relaxed atomic per program): one launch for what were four
    torch launches and a reduction."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = o < n
    t = tl.load(T + o, mask=mask, other=0.0)
    if INTERCEPT:
        t = t + tl.load(YD)
    if HAS_V:
        t = t * tl.load(V + o, mask=mask, other=0.0)
    p = tl.where(mask, t * alpha, 0.0)
    tl.store(P + o, p, mask=mask)
    if INTERCEPT:
        tl.atomic_add(ISUM, tl.sum(p, 0), sem="relaxed")


# ------------------------------------------------------------------------------------------------
# The analytical launch model
# ------------------------------------------------------------------------------------------------
# Keys of the profile the model reads; the DRAM bandwidth is not in gpu_info (the H200's measured
# copy bandwidth is the default).
_DEFAULT_GPU = {
    "sm_count": 132,
    "regs_per_sm": 65536,
    "smem_per_sm": 228 * 1024,
    "l2_bytes": 50 * 1024 * 1024,
    "bandwidth": 4.28e12,
}


_PROFILES: dict = {}


def _gpu_profile(gpu=None, device=None) -> dict:
    """Normalise a GPU description to the keys of ``_DEFAULT_GPU``.

    ``gpu`` may be None (``fusedml.mmchain.launch.gpu_info(device)``: the CUDA device's properties,
    or the fixed H200 profile under the interpreter), a dict, or an object with attributes (any
    of the usual spellings).
    """
    if gpu is None:
        dkey = str(device)
        if dkey not in _PROFILES:  # per call otherwise: host time on every launch
            from .launch import gpu_info

            info = gpu_info(device if device is not None else torch.device("cpu"))
            _PROFILES[dkey] = dict(_DEFAULT_GPU) if info is None else _gpu_profile(info)
        return _PROFILES[dkey]
    out = dict(_DEFAULT_GPU)
    if gpu is None:
        return out
    get = gpu.get if isinstance(gpu, dict) else (lambda k, d=None: getattr(gpu, k, d))
    aliases = {
        "sm_count": ("sm_count", "num_sms", "n_sm", "multi_processor_count", "sms"),
        "regs_per_sm": ("regs_per_sm", "registers_per_sm", "regs_per_multiprocessor"),
        "smem_per_sm": ("smem_per_sm", "shared_memory_per_sm", "smem_bytes_per_sm", "smem_per_sm_bytes"),
        "l2_bytes": ("l2_bytes", "l2_cache_bytes", "l2_size", "L2_cache_size"),
        "bandwidth": ("bandwidth", "dram_bandwidth", "bandwidth_bytes_per_s", "mem_bandwidth"),
    }
    for key, names in aliases.items():
        for name in names:
            val = get(name, None)
            if val:
                out[key] = val
                break
    return out


@dataclass(frozen=True)
class CSRStats:
    """Row-length statistics of a CSR matrix (what the launch model needs).

    Attributes
    ----------
    n_rows, n_cols, nnz : int
        ``N``, ``D`` and the number of stored entries.
    max_len : int
        Longest row.
    hist : tuple of int
        ``hist[0]`` = empty rows; ``hist[b]`` (b >= 1) = rows with length in ``(2^(b-2), 2^(b-1)]``
        (i.e. rows whose power-of-two cover is ``2^(b-1)``).
    index_bytes : int
        4 for int32 indices, 8 for int64.
    """

    n_rows: int
    n_cols: int
    nnz: int
    max_len: int
    hist: tuple
    index_bytes: int = 4

    @property
    def mean_len(self) -> float:
        """Mean stored entries per row (``nnz / N``; 0 for an empty matrix)."""
        return self.nnz / max(self.n_rows, 1)

    def quantile_cover(self, q: float) -> int:
        """Smallest power of two covering the row lengths of a fraction ``q`` of the rows.

        Parameters
        ----------
        q : float
            Fraction of rows in ``[0, 1]``.

        Returns
        -------
        int
        """
        need = q * self.n_rows
        acc = 0
        for b, cnt in enumerate(self.hist):
            acc += cnt
            if acc >= need:
                return 1 if b <= 1 else 1 << (b - 1)
        return _pow2_ceil(self.max_len)


@dataclass(frozen=True)
class CSRConfig:
    """Launch parameters of the CSR kernels and the strategy (chosen by :func:`csr_config`).

    Attributes
    ----------
    strategy : {"scatter", "gather"}
        ``"scatter"``: one read of A, ``w`` accumulated with per-nonzero float atomics.
        ``"gather"``: a cached CSC copy of A (2x memory); ``p`` is written by a row pass over A and
        ``w`` by an atomic-free row pass over the copy (deterministic).
    pred_scatter_ms, pred_gather_ms : float
        The model's predicted times (ms) of both strategies (not compared, not hashed).
    ordered : bool
        True: one launch over the rows in storage order; False: power-of-two length bins.
    block_r, lanes : int
        Ordered mode: rows per program and the tile width ``L`` (power of two).
    single : bool
        Ordered mode: every row fits in ``lanes`` (tile kept in registers, no loop).
    tile : int
        Nonzeros per program tile (``BLOCK_R * L``) in binned mode; bins use
        ``BLOCK_R = tile // L`` for ``L`` from ``l_min`` to ``long_threshold``.
    l_min : int
        Width of the smallest bin (rows of 0..l_min nonzeros).
    long_threshold : int
        Rows longer than this use the split long-row kernels (binned mode).
    piece : int
        Nonzeros per loop step of the long-row kernels.
    chunk : int
        Nonzeros per long-row program; programs per long row = ceil(len / chunk).
    num_warps : int
        Warps per program of the row kernel (the long kernels use ``long_warps``).
    long_warps : int
    gather : CSRConfig or None
        ``strategy="gather"``: launch parameters of the pass over the CSC copy (its "rows" are
        A's columns; the fields above describe the pass over A's rows). None: the model's pick
        for the copy's column-length profile, chosen at run time.
    l1_bypass : bool
        Load A's values and indices with ``.cg`` (L2 only), leaving L1 to the gathered vector;
        the model sets it when that vector is small enough for L1 hits to matter.
    tile_bytes : int
        ``strategy="gather"``, m = 1: cache blocking. A pass whose gathered vector (``y`` for the
        pass over A, ``p`` for the pass over the copy) outgrows L1 (``L1_VECTOR_BYTES``) reads a
        flat stream of its nonzeros sorted by slices of ``tile_bytes`` of that vector instead
        (:class:`_Stream`), so the programs running at once gather from one slice, which stays in
        L1 (:func:`_tile_plan`). 0: never.
    flat : int
        ``strategy="gather"``, m = 1, with ``tile_bytes``: passes the tile plan leaves untiled
        whose gathered vector still outgrows L1 read one flat stream of their nonzeros instead of
        the row kernel (:func:`_flat_plan`): one nnz-balanced launch in storage order, no length
        bins, no permutation. Bit 0: the pass over A; bit 1: the pass over the copy.
    """

    strategy: str
    pred_scatter_ms: float = dataclasses.field(compare=False)
    pred_gather_ms: float = dataclasses.field(compare=False)
    ordered: bool
    block_r: int
    lanes: int
    single: bool
    tile: int
    l_min: int
    long_threshold: int
    piece: int
    chunk: int
    num_warps: int
    long_warps: int
    gather: "CSRConfig | None" = None
    l1_bypass: bool = False
    tile_bytes: int = 0
    flat: int = 0

    def bin_block_r(self, width: int) -> int:
        """Rows per program for the bin of width ``width``.

        Parameters
        ----------
        width : int
            The bin's tile width (a power of two).

        Returns
        -------
        int
        """
        return max(1, self.tile // width)

    def launch_key(self) -> "CSRConfig":
        """The launch fields only (strategy and the CSC pass dropped): the schedule cache key."""
        return dataclasses.replace(self, strategy="scatter", gather=None, l1_bypass=False, tile_bytes=0, flat=0)


def _pow2_ceil(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def _pow2_floor(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x).bit_length() - 1)


def csr_stats(A: CSRMatrix, axis: int = 0) -> CSRStats:
    """Row-length (``axis=0``) or column-length (``axis=1``) statistics of ``A`` (cached per matrix).

    Parameters
    ----------
    A : CSRMatrix
        ``[N, D]``.
    axis : {0, 1}
        0: lengths of A's rows; 1: lengths of A's columns (the rows of its CSC copy, computed by a
        ``bincount`` of the column indices; no copy is built).

    Returns
    -------
    CSRStats
        For ``axis=1``, ``n_rows`` is D, ``n_cols`` is N and ``index_bytes`` that of the CSC copy.
    """
    st = _structure(A)
    return st.stats if axis == 0 else _col_stats(A, st)


def _hist_stats(lengths: torch.Tensor, n_cols: int, index_bytes: int) -> CSRStats:
    """CSRStats of a vector of segment lengths (one device-to-host sync)."""
    n = lengths.numel()
    if n == 0:
        return CSRStats(0, n_cols, 0, 0, (0,), index_bytes)
    # bin b: 0 for empty rows, else 1 + ceil(log2(len)); integer arithmetic, exact.
    b = torch.zeros_like(lengths)
    nz = lengths > 0
    b[nz] = 1 + _ceil_log2(lengths[nz])
    hist = torch.bincount(b, minlength=1)
    packed = torch.cat([hist, lengths.max().reshape(1), lengths.sum().reshape(1)]).cpu().tolist()
    return CSRStats(n, n_cols, int(packed[-1]), int(packed[-2]), tuple(int(c) for c in packed[:-2]), index_bytes)


def _compute_stats(A: CSRMatrix) -> CSRStats:
    lengths = (A.crow[1:] - A.crow[:-1]).to(torch.int64)
    return _hist_stats(lengths, A.shape[1], A.crow.element_size())


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ceil(log2(x)) for int64 x >= 1."""
    r = torch.zeros_like(x)
    y = x - 1
    for shift in (32, 16, 8, 4, 2, 1):
        big = y >= (1 << shift)
        r = r + big.to(x.dtype) * shift
        y = torch.where(big, y >> shift, y)
    r = r + (y >= 1).to(x.dtype)
    return r


# Throughput constants of the strategy model, FITTED to one H200 (132 SMs, 4.28 TB/s) on the
# 2026-12-02 session-2 sweep (benchmarks/results/mmchain-H200-2026-12-02-s2.json, fp32, m = 1,
# uniform random columns; every gathered vector L2-resident):
#   gather strategy 2 x 128M gathers in 2.080 ms (4M x 100k), 2 x 100M in 1.725 ms (1M x 1M)
#       -> 123 / 116 G gathers/s: GATHER_RATE = 120e9 (cuSPARSE's SpMV alone: 0.945 ms / 128M and
#       0.775 ms / 100M = 135 / 129 G/s, the same bound); the byte terms are only 0.49 / 0.38 ms.
#   scatter strategy 128M in 2.345 ms, 100M in 1.834 ms = the y gathers at GATHER_RATE (1.07 /
#       0.83 ms) plus 1.28 / 1.00 ms of REDs -> ATOMIC_RATE = 100e9 (additive: both are L2 ops).
# One random gather = one 32-byte L2 sector operation, whatever the 4 useful bytes. Scaled by
# SM count / 132 for other GPUs and halved for fp64 REDs (assumptions, not measured).
GATHER_RATE_H200 = 120e9
ATOMIC_RATE_H200 = 100e9
RATE_SMS = 132
# Assumptions (not measured on this machine): a gather that misses L2 moves a 64-byte DRAM burst;
# the streamed matrix leaves half of L2 to the gathered vector; a back-to-back launch costs 5 us.
DRAM_BURST = 64
L2_SHARE = 0.5
LAUNCH_S = 5e-6
# Gathered vectors up to this size get A loaded with .cg (assumption: ~200 KB of L1 per SM, so a
# hit rate of at least ~20 %; the --csr-strategies sweep times both settings).
L1_BYPASS_MAX_BYTES = 1 << 20
STRATEGIES = ("auto", "scatter", "gather")
# Cache blocking of the gather strategy (``CSRConfig.tile_bytes``), MEASURED on one H200
# (benchmarks/results/gather_probe-H200-2026-12-03-s8-b.json: a flat stream of 32M fp32 values and
# int32 indices): random gathers from a vector of <= 128 KB ran at 436 G/s (81 % of the stream's
# bandwidth floor), from 256 KB at 220 G/s, from 0.5-4 MB at 139-151 G/s (L2 sectors); the same
# 1 MB vector with the stream sorted into 64 KB index tiles at 422 G/s. cuSPARSE's SpMV: 126 G/s.
TILE_BYTES = 32 << 10
L1_VECTOR_BYTES = 128 << 10  # a gathered vector up to this size stays in L1: no tiling
L1_GATHER_RATE_H200 = 430e9
# The stream kernel's launch, MEASURED (bench_csr_tiles --kernel: csr_tiles_kernel-*-s9-b,
# csr_tiles-*-s9-c): blocks of 2048 nonzeros on 8 warps, 4 programs per SM: power-law 1M x 100k
# mmchain 0.32 ms at 64 KB tiles, against 0.42 for 1024 x 8 warps x 8 and 0.34-0.37 for 1024 x 4,
# 2048 x 4, 4096 x 8 or 16; 16 warps with 1024 or 8192 ran at half speed. 32 KB tiles then beat
# 64 KB (csr_tiles-*-s9-d: 0.30 vs 0.32 ms; uniform 4M x 100k 1.17 vs 1.28).
STREAM_BLOCK = 2048
STREAM_WARPS = 8
STREAM_PROGRAMS_PER_SM = 4
#: how the stream pass adds its segment totals: True, inline ``red`` in the scan's layout
#: (``_red_add``); False, ``tl.atomic_add``, whose one-element-per-thread layout costs three
#: shared-memory conversions per block but lets a warp's adds to neighbouring outputs coalesce;
#: "flat", inline on flat streams only. MEASURED on an H100 (csr_tiles_red-H100-2026-12-07-s49):
#: tiled 1M x 100k power-law (~2.5 nonzeros a segment) mmchain 0.313 ms with tl.atomic_add
#: against 0.352 inline (matvec 0.138 / 0.158); flat 1M x 4M (rows as segments, 32 a row) 0.612
#: against 0.597 (0.308 / 0.298), flat 1M x 1M 0.584 against 0.565 (-s49e).
STREAM_INLINE_RED = "flat"
#: the stream pass's elements per thread (``tl.max_contiguous`` on its offsets); 0: as the loads'
#: vector width sets it (8 for 16-bit keys). Fewer spread a warp's segment totals over fewer
#: outputs (coalesced adds) at the cost of narrower loads and a longer scan (sm_90 SASS per block:
#: 423 instructions at 0, 504 / 702 / 896 at 4 / 2 / 1). MEASURED on an H100
#: (csr_tiles_contig-H100-2026-12-07-s50, tiled 1M x 100k power-law, m = 1, one process): 0 with
#: tl.atomic_add 0.318-0.408 ms (its own drift), 4 0.313-0.371, 2 0.52-0.53, 1 0.41: none beats 0.
STREAM_CONTIG = 0
# Tried, removed (session 52): tiled streams gathering from their tile in shared memory (each block
# loads its whole tile, then tl.gather): 105 registers against 64. MEASURED on an H100
# (csr_tiles_smem-H100-2026-12-07-s52, m = 1): 1M x 100k power-law 0.404 ms against 0.316 with L1
# gathers (32 KB tiles; 64 KB 0.503), 4M x 100k uniform 1.61 against 1.23; fused logistic fit 30.4 ->
# 37.6 ms. The L1 gathers are not what binds the pass.
# The model's CSRConfig.flat: which untiled passes (bit 0 over A, bit 1 over the copy) read a flat
# stream where _flat_plan allows. MEASURED on an H100 (csr_tiles_flat-H100-2026-12-07-s48b, power-law
# rows, 32 a row, m = 1): 1M x 4M mmchain 0.769 ms with the row kernels (~10 launches: length bins and
# long-row splits; the copy's 4M mostly tiny columns binned, so their pointers are read and their sums
# stored at random) -> 0.732 flat over A, 0.661 flat over the copy, 0.611 both (ops' cached transpose
# 0.628); 1M x 1M 0.675 -> 0.585 (ops 0.585); uniform 1M x 1M, 100 a row (ordered rows): 1.75 either way.
FLAT_PASSES = 3


def _csc_index_bytes(n_rows: int, nnz: int) -> int:
    return 4 if max(n_rows, nnz) < 2**31 else 8


def _launch_params(stats: CSRStats, m: int, dtype: torch.dtype, prof: dict) -> dict:
    """Tile, bins and long-row split for the row kernel over a structure with ``stats``."""
    mp = _pow2_ceil(m)
    b_val = torch.empty((), dtype=dtype).element_size()
    b = b_val + stats.index_bytes
    progs_per_sm = 4
    latency = 800e-9
    inflight = prof["bandwidth"] * latency / prof["sm_count"]
    tile_bw = _pow2_ceil(int(inflight / (progs_per_sm * b)))
    words_cap = prof["regs_per_sm"] // (2 * progs_per_sm)
    tile_reg = _pow2_floor(max(1, words_cap // (2 + 2 * mp)))
    tile = max(16, min(tile_bw, tile_reg, 4096))
    num_warps = 8 if tile * mp > 2048 else 4

    mean_cover = _pow2_ceil(math.ceil(stats.mean_len)) if stats.nnz else 1
    max_cover = _pow2_ceil(stats.max_len)
    q90 = stats.quantile_cover(0.9)
    q10 = stats.quantile_cover(0.1)
    if max_cover <= max(2 * mean_cover, 4) and max_cover <= tile:
        ordered, single, lanes = True, True, max(max_cover, 1)
    elif stats.max_len <= 4 * q90 and q90 <= tile:
        ordered, single, lanes = True, False, q90
    elif stats.nnz and stats.max_len <= 2 * stats.mean_len and q90 > tile:
        # homogeneous rows all longer than a tile (the CSC copy of a uniform matrix: ~1280 per
        # column): rows in storage order, looped in steps of L = pow2 <= mean / 4 (tail waste
        # <= 25 %) with several rows per program, not the two-kernel long-row split.
        ordered, single, lanes = True, False, max(32, min(tile, _pow2_floor(int(stats.mean_len) // 4)))
    else:
        ordered, single, lanes = False, False, q90
    lanes = max(1, min(lanes, tile))
    block_r = max(1, tile // lanes)
    long_threshold = tile
    piece = tile
    chunk = _long_chunk(stats.nnz, piece, prof["sm_count"])  # refined by the schedule (real long nnz)
    # The gathered vector (y for A's rows, p for the copy's): when it is within a few L1s, keep A's
    # stream out of L1 so its lines stay there (L1 hits spare the L2 sector operations that bind).
    b_acc = 8 if dtype == torch.float64 else 4
    l1_bypass = (stats.n_cols + 1) * m * b_acc <= L1_BYPASS_MAX_BYTES
    return dict(ordered=ordered, block_r=block_r, lanes=lanes, single=single, tile=tile,
                l_min=max(4, min(q10, tile)), long_threshold=long_threshold, piece=piece, chunk=chunk,
                num_warps=num_warps, long_warps=num_warps, l1_bypass=l1_bypass)


def _sectors_per_gather(m: int, b_acc: int) -> float:
    """Mean 32-byte sectors touched by one gathered ``m``-vector of ``b_acc``-byte words (records
    of ``s = m b_acc`` bytes at multiples of ``s``): ``1 + (s - gcd(s, 32)) / 32``."""
    size = m * b_acc
    return 1.0 + (size - math.gcd(size, 32)) / 32.0


def _gather_terms(n_gathers: float, vec_bytes: float, sectors: float, prof: dict) -> tuple:
    """``(seconds of L2 sector operations, extra DRAM bytes)`` of ``n_gathers`` random gathers from
    a vector of ``vec_bytes``: every gather is an L2 operation at GATHER_RATE; the fraction of the
    vector that does not fit in ``L2_SHARE`` of L2 misses and moves a DRAM burst."""
    rate = GATHER_RATE_H200 * prof["sm_count"] / RATE_SMS
    hit = min(1.0, L2_SHARE * prof["l2_bytes"] / max(vec_bytes, 1.0))
    return n_gathers * sectors / rate, n_gathers * (1.0 - hit) * max(DRAM_BURST, 32 * sectors)


def _tile_plan(n_rows: int, n_vec: int, nnz: int, m: int, b_acc: int, tile_bytes: int) -> int:
    """Entries of the gathered vector per tile for one gather pass (``n_vec``: the pass is not tiled).

    A pass over ``n_rows`` rows whose ``nnz`` nonzeros gather from a vector of ``n_vec`` entries
    (``b_acc`` bytes each) is tiled (:class:`_Stream`) when m = 1, the vector exceeds
    ``L1_VECTOR_BYTES`` (L1 no longer holds it: each gather becomes an L2 sector operation at ~1/3
    of the stream's rate), and its segments (one per row and tile at most) hold two nonzeros or more on
    average: each costs a 4-byte output id and one atomic, against 2 bytes saved per nonzero (a
    16-bit index within the tile). Tiles hold at most 2^14 entries; the padded stream stays below
    2^31.

    Parameters
    ----------
    n_rows, n_vec, nnz, m, b_acc, tile_bytes : int

    Returns
    -------
    int
        Vector entries per tile (``min(tile_bytes // b_acc, 2^14)``), or ``n_vec``.
    """
    if tile_bytes <= 0 or m != 1 or n_vec * b_acc <= max(L1_VECTOR_BYTES, tile_bytes):
        return n_vec
    per = max(1, min(tile_bytes // b_acc, 1 << 14))
    tiles = -(-n_vec // per)
    if nnz + (tiles + 1) * STREAM_BLOCK >= 2**31 or 2 * min(nnz, n_rows * tiles) > nnz:
        return n_vec
    return per


def _flat_plan(n_rows: int, n_vec: int, nnz: int, m: int, b_acc: int) -> bool:
    """Whether an untiled gather pass (:func:`_tile_plan` left it whole) may read a flat stream.

    The flat stream is the tiled stream's format with one tile (30-bit indices: int32 keys, 4 bytes
    per nonzero as CSR's): the row kernel's work in one nnz-balanced launch, rows (segments) in
    storage order. It applies to m = 1 passes whose vector outgrows L1 (smaller ones are gathered
    from L1 by the row kernel), up to 2^30 entries, with segments (non-empty rows) of two
    nonzeros or more on average (each costs a 4-byte output id and an atomic).

    Parameters
    ----------
    n_rows, n_vec, nnz, m, b_acc : int

    Returns
    -------
    bool
    """
    return (m == 1 and L1_VECTOR_BYTES < n_vec * b_acc and n_vec <= 1 << 30
            and nnz + STREAM_BLOCK < 2**31 and 2 * min(nnz, n_rows) <= nnz)


def _flat_bits(stats: CSRStats, col_stats: CSRStats | None, m: int, dtype: torch.dtype, prof: dict) -> int:
    """The model's ``CSRConfig.flat``: the ``FLAT_PASSES`` bits of the untiled passes that
    :func:`_flat_plan` allows and whose row kernel would bin its rows (an ordered pass, in storage
    order and one launch, measured no faster flat: uniform 1M x 1M, 1.75 ms either way); the
    pass over the copy only when its column statistics are known."""
    if TILE_BYTES <= 0 or not FLAT_PASSES:
        return 0
    n, d, nnz = stats.n_rows, stats.n_cols, stats.nnz
    b_acc = 8 if dtype == torch.float64 else 4
    bits = 0
    for bit, st, rows, vec in ((1, stats, n, d), (2, col_stats, d, n)):
        if (FLAT_PASSES & bit and st is not None and _tile_plan(rows, vec, nnz, m, b_acc, TILE_BYTES) >= vec
                and _flat_plan(rows, vec, nnz, m, b_acc) and not _launch_params(st, m, dtype, prof)["ordered"]):
            bits |= bit
    return bits


def _n_launches(stats: CSRStats, params: dict) -> int:
    """Kernel launches of one row pass: 1 when ordered, else one per non-empty length bin plus
    two for the long rows."""
    if params["ordered"]:
        return 1
    lo, hi = params["l_min"], params["long_threshold"]
    bins = set()
    for b, cnt in enumerate(stats.hist):
        if cnt:
            cover = 1 if b <= 1 else 1 << (b - 1)
            bins.add(min(max(cover, lo), 2 * hi))
    return len({c for c in bins if c <= hi}) + (2 if stats.max_len > hi else 0)


def _predict_ms(stats: CSRStats, m: int, dtype: torch.dtype, prof: dict, col_stats: CSRStats | None = None,
                has_y: bool = True) -> tuple:
    """(scatter ms, gather ms) of the model (see :func:`csr_config`)."""
    n, d, nnz = stats.n_rows, stats.n_cols, stats.nnz
    b_val = torch.empty((), dtype=dtype).element_size()
    b_acc = 8 if dtype == torch.float64 else 4
    b_csc = _csc_index_bytes(n, nnz)
    bw = prof["bandwidth"]
    a_rate = ATOMIC_RATE_H200 * prof["sm_count"] / RATE_SMS / (2 if dtype == torch.float64 else 1)
    # y, w and p rows of mp columns (_row_width)
    mp = _row_width(m)
    sec = _sectors_per_gather(mp, b_acc)
    a_bytes = nnz * (b_val + stats.index_bytes) + (n + 1) * stats.index_bytes
    w_bytes = (d + 1) * mp * b_acc
    v_bytes = n * m * b_acc
    p_bytes = n * mp * b_acc
    launch_a = _n_launches(stats, _launch_params(stats, m, dtype, prof))
    launch_c = _n_launches(col_stats, _launch_params(col_stats, m, dtype, prof)) if col_stats is not None else 1
    # scatter: one pass; y gathers (L2 ops) + one RED per nonzero and column (power-of-two rows
    # compile to vector REDs, F32x4 on sm_90; their rate is not measured, so each word counts as one
    # RED); REDs whose w row misses L2 move a DRAM burst in and out.
    g_s, extra_y = _gather_terms(nnz if has_y else 0, w_bytes, sec, prof)
    red_s, extra_w = _gather_terms(nnz * m, w_bytes, 1.0, prof)
    scatter = max((a_bytes + v_bytes + 2 * w_bytes + extra_y + 2 * extra_w) / bw,
                  g_s + nnz * m / a_rate) + (launch_a + 1) * LAUNCH_S
    # gather: pass 1 over A (y gathers; v read, p written), pass 2 over the copy (p gathers; w written).
    # A tiled pass (_tile_plan, _Stream) gathers from L1 at L1_GATHER_RATE and moves 2 + b_val bytes
    # per nonzero plus, per segment (at most one per row and tile), an output id and one atomic;
    # 2 launches (zeroing, stream).
    csc_bytes = nnz * (b_val + b_csc) + (d + 1) * b_csc
    l1_rate = L1_GATHER_RATE_H200 * prof["sm_count"] / RATE_SMS

    def tiled(rows, vec, per, extra_bytes):
        seg = min(nnz, rows * -(-vec // per))
        return max((nnz * (b_val + 2) + seg * 4 + extra_bytes) / bw, nnz / l1_rate, seg / a_rate) + 2 * LAUNCH_S

    def flat(rows, vec_bytes, extra_bytes):  # one tile: 4-byte keys, every gather an L2 sector operation
        seg = min(nnz, rows)
        g, extra = _gather_terms(nnz, vec_bytes, 1.0, prof)
        return max((nnz * (b_val + 4) + seg * 4 + extra_bytes + extra) / bw, g, seg / a_rate) + 2 * LAUNCH_S

    flat_bits = _flat_bits(stats, col_stats, m, dtype, prof)
    t1 = 0.0
    if has_y:
        per = _tile_plan(n, d, nnz, m, b_acc, TILE_BYTES)
        if per < d:
            t1 = tiled(n, d, per, v_bytes + 2 * p_bytes) + 3 * LAUNCH_S
        elif flat_bits & 1:
            t1 = flat(n, w_bytes, v_bytes + 2 * p_bytes) + 3 * LAUNCH_S
        else:
            g1, extra1 = _gather_terms(nnz, w_bytes, sec, prof)
            t1 = max((a_bytes + v_bytes + p_bytes + extra1) / bw, g1) + launch_a * LAUNCH_S
    per = _tile_plan(d, n, nnz, m, b_acc, TILE_BYTES)
    if per < n:
        t2 = tiled(d, n, per, p_bytes + w_bytes)
    elif flat_bits & 2:
        t2 = flat(d, p_bytes, p_bytes + w_bytes)
    else:
        g2, extra2 = _gather_terms(nnz, p_bytes, sec, prof)
        t2 = max((csc_bytes + p_bytes + w_bytes + extra2) / bw, g2) + launch_c * LAUNCH_S
    return scatter * 1e3, (t1 + t2) * 1e3


def csr_config(A, m: int = 1, dtype: torch.dtype = torch.float32, gpu=None, *, strategy: str = "auto",
               memory: str = "normal", col_stats: CSRStats | None = None) -> CSRConfig:
    """The analytical launch model of the CSR kernels, and the scatter/gather choice.

    Parameters
    ----------
    A : CSRMatrix or CSRStats
        The matrix or its row-length statistics (:func:`csr_stats`).
    m : int
        Columns of ``y`` (1..16).
    dtype : torch.dtype
        Value storage dtype (sets the bytes per nonzero).
    gpu : dict or object, optional
        SM count, registers/SM, shared memory/SM, L2 bytes, DRAM bandwidth (``gpu_info``); the
        device's own (or an H200-like profile) when None.
    strategy : {"auto", "scatter", "gather"}
        Force a strategy, or let the model pick the faster one.
    memory : {"normal", "low"}
        ``"low"`` forbids the CSC copy (2x the memory of A): ``strategy="auto"`` then picks scatter.
    col_stats : CSRStats, optional
        Column-length statistics (``csr_stats(A, axis=1)``); taken from A when it is a matrix.
        Without them (A given as CSRStats) the CSC pass's launch is chosen at run time.

    Returns
    -------
    CSRConfig
        ``strategy`` and both predicted times are in its repr (first fields).

    Notes
    -----
    **Strategy.** On the H200 neither strategy is bound by its bytes: both are bound by random
    32-byte L2 sector operations (a gather of ``y[col]`` or ``p[row]`` costs one sector however
    few of its bytes are used; a float RED is one more L2 operation). Per pass::

        T_pass = max(bytes / BW,  G s / R_g  [+ nnz m / R_a]) + launches * 5 us

    * ``G`` gathers (one per nonzero), ``s = 1 + (m b_acc - gcd(m b_acc, 32)) / 32`` sectors per
      gathered m-vector (1 for m b_acc <= 32 B);
    * ``R_g = 120e9/s`` and ``R_a = 100e9/s`` FITTED on one H200 (2026-12-02 session-2 sweep,
      ``benchmarks/results/mmchain-H200-2026-12-02-s2.json``, fp32, m = 1, uniform random columns):
      gather 2 x 128M gathers in 2.080 ms and 2 x 100M in 1.725 ms (123 / 116 G/s; cuSPARSE's
      SpMV alone, 0.945 ms for 128M nonzeros = 135 G/s, hits the same wall); scatter 2.345 /
      1.834 ms = the y gathers at ``R_g`` plus 1.28 / 1.00 ms of REDs (100 G/s). Scaled by
      SM count / 132 on other GPUs; ``R_a`` halved for fp64 (assumptions);
    * a gathered vector larger than ``L2_SHARE = 0.5`` of L2 misses in proportion, each miss
      adding a 64-byte DRAM burst to ``bytes`` (assumption: every measured case was L2-resident);
    * launches: 1 for an ordered pass, one per length bin (+2 for long rows) when binned (5 us
      each, assumption).

    scatter = one pass over A (y gathers + nnz m REDs; bytes A, v, w twice); gather = pass 1 over
    A (y gathers; A, v read, p written) + pass 2 over the cached CSC copy (p gathers; copy and p
    read, w written). For m = 1 that is ``2/R_g = 16.7`` vs ``1/R_g + 1/R_a = 18.3`` ns per 1000
    nonzeros: gather by ~9 % (measured 2.08 vs 2.35 ms, 1.73 vs 1.83 ms); for m > 1 the gather's
    sector count stays ~1 per nonzero while the scatter's REDs grow with m. The byte terms
    (~2.1x the read-once floor for gather) only bind for vectors far beyond L2. Cache blocking
    (m = 1, :func:`_tile_plan`): a pass over a tiled stream gathers at ``L1_GATHER_RATE`` (430 G/s,
    measured), moves 6 bytes per fp32 nonzero and adds each (output, tile) segment with one atomic
    (at ``ATOMIC_RATE``); it replaces the pass's term above when the tile plan picks it. Not modelled: L1
    hits (``l1_bypass``: set for gathered vectors up to ``L1_BYPASS_MAX_BYTES`` = 1 MB, an
    assumption the ``--csr-strategies`` sweep of ``benchmarks/bench_mmchain.py`` checks); the
    one-off build of the copy (a stable sort of the column indices; ``"auto"`` builds it only from
    the second call on the same matrix object).

    ``"auto"`` picks the smaller prediction unless ``memory="low"``. Small D does NOT favour the
    scatter: its REDs then hit few addresses and serialise at L2, while the copy has few long
    columns (split long-row kernels, fully parallel).

    **Launch** (each pass: the row kernel over A's rows, and for gather over A's columns):

    1. *Bytes in flight.* Little's law: to stream at bandwidth ``B`` with DRAM latency
       ``λ ≈ 800 ns`` every SM needs ``B λ / n_SM`` bytes of loads outstanding (≈ 26 KB on an
       H200). With ``P = 4`` resident programs per SM, one program's tile must cover
       ``B λ / (n_SM P b)`` nonzeros: ``tile = pow2_ceil`` of that (1024 nonzeros for fp32/int32).
    2. *Registers.* A tile element holds ~``2 + 2 MP`` 32-bit registers (value, index, the
       gathered ``y`` m-vector and the product). Keeping ``P`` programs of ``32 w`` threads
       resident under ``regs_per_sm`` with half the registers for addresses and masks caps
       ``tile * (2 + 2 MP)`` at ``regs_per_sm / (2 P)`` words per program → smaller tiles for
       large ``m``. ``num_warps = 4``, 8 when the tile exceeds 2048 elements.
    3. *Tile shape.* ``L`` = power of two covering the rows; ``BLOCK_R = tile / L``. Ordered mode
       (rows in storage order: perfect streaming, no permutation bytes) when the profile is
       homogeneous: ``pow2(max_len) <= 2 pow2(mean)`` (then ``L = pow2(max_len)``, lanes ≥ 50 %
       busy on average, one tile, single read) or ``max_len <= 4 pow2(q90)`` (``L = pow2(q90)``,
       at most 4 loop steps per block), or, for homogeneous
       rows longer than a tile (``max_len <= 2 mean``, ``pow2(q90) > tile``), ``L = pow2 <= mean/4``
       looped with ``tile / L`` rows per program. Otherwise binned: power-of-two bins from
       ``l_min = max(4, pow2(q10))`` to ``long_threshold = tile`` (bins ≥ 50 % lane-busy), the
       permutation costs ``b_idx`` bytes per row. The CSC copy of a power-law matrix is binned by
       its own column-length profile.
    4. *Long rows* (> ``long_threshold``): ``piece = tile`` nonzeros per step; ``chunk`` is
       the largest multiple of ``piece`` (power of two, ≤ 64 pieces) that still gives the
       long-row launch ``4 n_SM`` programs, so a few rows of 10^5-10^7 nonzeros fill the GPU.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if memory not in ("normal", "low"):
        raise ValueError(f"memory must be 'normal' or 'low', got {memory!r}")
    is_stats = isinstance(A, CSRStats)
    stats = A if is_stats else csr_stats(A)
    if col_stats is None and not is_stats:
        col_stats = csr_stats(A, axis=1)
    prof = _gpu_profile(gpu, None if is_stats else A.device)
    m = int(m)
    t_s, t_g = (float(f"{t:.4g}") for t in _predict_ms(stats, m, dtype, prof, col_stats))
    if strategy == "auto":
        strategy = "gather" if memory == "normal" and t_g < t_s else "scatter"
    gather = None
    if strategy == "gather" and col_stats is not None:
        gather = CSRConfig(strategy="gather", pred_scatter_ms=t_s, pred_gather_ms=t_g,
                           **_launch_params(col_stats, m, dtype, prof))
    streams = strategy == "gather"
    return CSRConfig(strategy=strategy, pred_scatter_ms=t_s, pred_gather_ms=t_g, gather=gather,
                     tile_bytes=TILE_BYTES if streams else 0,
                     flat=_flat_bits(stats, col_stats, m, dtype, prof) if streams else 0,
                     **_launch_params(stats, m, dtype, prof))


def _long_chunk(long_nnz: int, piece: int, sm_count: int) -> int:
    target = max(1, long_nnz // (4 * sm_count))
    return piece * max(1, min(64, _pow2_floor(max(1, target // piece))))


def _variants(base: CSRConfig, max_len: int, tiles=(256, 512, 1024, 2048, 4096), warps_set=(2, 4, 8)) -> list:
    """Tile / warps / ordered-or-binned variants of one pass's launch fields."""
    out = []
    for tile in tiles:
        for warps in warps_set:
            for ordered in (True, False):
                if ordered and base.lanes > tile:
                    continue
                lanes = min(base.lanes, tile)
                cfg = dataclasses.replace(
                    base, tile=tile, num_warps=warps, long_warps=warps, ordered=ordered,
                    lanes=lanes, block_r=max(1, tile // lanes),
                    single=base.single and lanes >= _pow2_ceil(max_len),
                    long_threshold=max(tile, base.long_threshold if not ordered else tile), piece=min(base.piece, tile),
                )
                if not ordered and cfg.lanes > cfg.long_threshold:
                    continue
                out.append(cfg)
    return out


def csr_sweep_configs(A: CSRMatrix, m: int = 1, dtype=None, gpu=None) -> list:
    """A small grid of alternative configs around the model's pick (for benchmark sweeps).

    Parameters
    ----------
    A : CSRMatrix
    m : int
    dtype : torch.dtype, optional
        Defaults to ``A.val.dtype``.
    gpu : optional
        As for :func:`csr_config`.

    Returns
    -------
    list of CSRConfig
        The model's pick first; then both strategies' pick (whichever the model did not choose);
        the gather pick with the other ``flat`` settings; then scatter variants (tile size, warps,
        ordered/binned) and gather variants (the same around the CSC pass's pick, the pass over A's
        rows at the model's pick).
    """
    dtype = A.val.dtype if dtype is None else dtype
    base = csr_config(A, m, dtype, gpu)
    sc = csr_config(A, m, dtype, gpu, strategy="scatter")
    ga = csr_config(A, m, dtype, gpu, strategy="gather")
    out = [base]
    seen = {base}
    # the gather pick's flat-stream bits next (each pass flat or the row kernel), then the launch grids
    cands = [sc, ga] + [dataclasses.replace(ga, flat=f) for f in (0, 3, 1, 2) if f != ga.flat]
    cands += _variants(sc, csr_stats(A).max_len)
    # the CSC pass: a smaller grid (every point compiles new kernels; GPU time is shared)
    cands += [dataclasses.replace(ga, gather=g)
              for g in _variants(ga.gather, csr_stats(A, axis=1).max_len, (512, 1024, 2048, 4096), (4, 8))]
    for cfg in cands:
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out


# ------------------------------------------------------------------------------------------------
# Per-matrix cache: statistics, schedules, the CSC copy
# ------------------------------------------------------------------------------------------------
class _Structure:
    """Everything derived from a matrix's sparsity structure, cached on the crow tensor."""

    def __init__(self, A: CSRMatrix, stats: CSRStats | None = None):
        self.crow_ref = weakref.ref(A.crow)
        self.col_ref = weakref.ref(A.col)
        self.versions = (A.crow._version, A.col._version)
        self.shape = tuple(A.shape)
        self.nnz = A.nnz
        self.stats = _compute_stats(A) if stats is None else stats
        self.col_stats = None  # CSRStats of the columns (bincount of col), on demand
        self.schedules = {}
        self.configs = {}  # (m, dtype, strategy, memory, has col stats) -> the model's CSRConfig
        self.csc = None  # _CSC: the gather strategy's copy, on demand
        self.streams = {}  # (W, H) -> _Streams: the cache-blocked streams, on demand
        self.calls = 0  # csr_mmchain_fused calls seen (auto builds the copy from the second on)

    def valid_for(self, A: CSRMatrix) -> bool:
        return (self.crow_ref() is A.crow and self.col_ref() is A.col
                and self.versions == (A.crow._version, A.col._version)
                and self.shape == tuple(A.shape) and self.nnz == A.nnz)


_CACHE: dict = {}


def _structure(A: CSRMatrix) -> _Structure:
    key = id(A.crow)
    ent = _CACHE.get(key)
    if ent is not None and ent.valid_for(A):
        return ent
    ent = _Structure(A)
    _CACHE[key] = ent
    weakref.finalize(A.crow, _CACHE.pop, key, None)
    return ent


def _col_lengths(A: CSRMatrix) -> torch.Tensor:
    return torch.bincount(A.col.to(torch.int64), minlength=A.shape[1])[: A.shape[1]]


def _col_stats(A: CSRMatrix, st: _Structure) -> CSRStats:
    if st.col_stats is None:
        st.col_stats = _hist_stats(_col_lengths(A), A.shape[0], _csc_index_bytes(A.shape[0], A.nnz))
    return st.col_stats


@dataclass
class _CSC:
    """The gather strategy's copy of A: ``AT`` = A^T in CSR form (colptr, row ids, values)."""

    AT: CSRMatrix  # [D, N]: crow = colptr [D+1], col = row ids [nnz], val = values [nnz] (copies)
    st: _Structure  # AT's own statistics and schedules (column-length profile)
    val_ref: weakref.ref  # the value tensor the copy was taken from
    val_version: int


def _row_ids(A: CSRMatrix, dtype: torch.dtype) -> torch.Tensor:
    """``[nnz]`` the row of each nonzero of ``A`` (dtype ``dtype``)."""
    lengths = (A.crow[1:] - A.crow[:-1]).to(torch.int64)
    return torch.repeat_interleave(torch.arange(A.shape[0], device=A.device, dtype=dtype), lengths)


def _current(copy, A: CSRMatrix) -> bool:
    """Whether a cached copy of ``A`` (:class:`_CSC`, :class:`_Streams`) was taken from ``A.val``
    as it is now (the same tensor, not changed in place since)."""
    return copy is not None and copy.val_ref() is A.val and copy.val_version == A.val._version


def _csc(A: CSRMatrix, st: _Structure) -> _CSC:
    """The CSC copy of ``A`` (cached with A's structure; rebuilt when ``A.val`` is another tensor
    or was changed in place). Costs ``nnz (b_val + b_idx) + (D+1) b_idx`` bytes while cached (the
    2x memory the "ops" baseline's cached transpose also pays); building it sorts the column
    indices once (~32 B/nnz of temporaries)."""
    c = st.csc
    if _current(c, A):
        return c
    st.csc = None  # drop a stale copy before allocating the new one
    n, d = A.shape
    idx = torch.int32 if _csc_index_bytes(n, A.nnz) == 4 else torch.int64
    col = A.col.to(torch.int64)
    order = torch.sort(col, stable=True).indices  # (col, row) order: CSR is row-major
    del col
    rows_t = _row_ids(A, idx)[order]
    val_t = A.val[order]
    del order
    colptr = torch.zeros(d + 1, dtype=torch.int64, device=A.device)
    colptr[1:] = torch.cumsum(_col_lengths(A), 0)
    AT = CSRMatrix(colptr.to(idx), rows_t.contiguous(), val_t.contiguous(), (d, n))
    st.csc = _CSC(AT, _Structure(AT, _col_stats(A, st)), weakref.ref(A.val), A.val._version)
    return st.csc


def _idx_bits(per: int) -> int:
    """Index bits of a stream key for tiles of ``per`` entries: 14 (int16 keys) or 30 (int32)."""
    if per > 1 << 30:
        raise ValueError(f"a stream tile holds at most 2^30 entries, got {per}")
    return 14 if per <= 1 << 14 else 30


@dataclass
class _Stream:
    """One cache-blocked gather pass as a flat nonzero stream: ``out[r] += val[j] * vec[t P + i_j]``
    over the nonzeros j of segment (t, r), output r's part from tile t of ``vec`` (P entries per
    tile). Segments are sorted by (tile, output); each tile's run is padded to whole
    ``STREAM_BLOCK`` blocks with one segment of zeros (output ``n_out``, dropped)."""

    key: torch.Tensor  # [nnz_pad] int16 (int32 past 2^14 entries a tile): index in the tile, segment start, end (sign)
    val: torch.Tensor  # [nnz_pad] A's value dtype
    seg_out: torch.Tensor  # [n_seg] int32
    seg_base: torch.Tensor  # [n_blocks] int32: segments starting before the block
    tile: torch.Tensor  # [n_blocks] int32: the block's tile
    tiles: int
    n_out: int
    per: int  # vector entries per tile
    block: int  # nonzeros per block (STREAM_BLOCK when built)


def _make_stream(key: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, tiles: int, n_out: int,
                 per: int) -> _Stream:
    """A :class:`_Stream` from segment ids ``tile * n_out + output`` sorted ascending (int64), the
    gathered indices (``tile * per <= idx < (tile + 1) * per``, ``per <= 2^30``) and the values.
    Keys are int16 (14 index bits) for ``per <= 2^14``, else int32 (30 index bits: the flat,
    one-tile stream of a wide pass)."""
    B = STREAM_BLOCK
    dev = key.device
    nnz = key.numel()
    tile = key // n_out
    cnt = torch.bincount(tile, minlength=tiles)  # [tiles] nonzeros per tile
    pcnt = (cnt + B - 1) // B * B  # each tile's run padded to whole blocks
    if nnz == 0:
        pcnt[0] = B
    pend = torch.cumsum(pcnt, 0)
    pstart, cstart = pend - pcnt, torch.cumsum(cnt, 0) - cnt
    pos = pstart[tile] + torch.arange(nnz, device=dev) - cstart[tile]  # [nnz] place in the stream
    n_pad = int(pend[-1])
    new = torch.ones(nnz, dtype=torch.bool, device=dev)
    new[1:] = key[1:] != key[:-1]
    end = torch.ones_like(new)
    end[:-1] = new[1:]
    start_f = torch.zeros(n_pad, dtype=torch.bool, device=dev)
    end_f = torch.zeros_like(start_f)
    start_f[pos], end_f[pos] = new, end
    padded = pcnt > cnt  # the padding: one segment at the end of the tile's run
    start_f[(pstart + cnt)[padded]] = True
    end_f[(pend - 1)[padded]] = True
    local = torch.zeros(n_pad, dtype=torch.int32, device=dev)
    local[pos] = (idx.to(torch.int64) - tile * per).to(torch.int32)
    bits = _idx_bits(per)
    k = local + (start_f.to(torch.int64) << bits) - (end_f.to(torch.int64) << (bits + 1))  # flags: the top two bits
    outs = torch.full((n_pad,), n_out, dtype=torch.int32, device=dev)
    outs[pos] = (key - tile * n_out).to(torch.int32)
    v = torch.zeros(n_pad, dtype=val.dtype, device=dev)
    v[pos] = val
    starts = start_f.view(-1, B).sum(1)
    tile_of_block = torch.repeat_interleave(torch.arange(tiles, device=dev), pcnt // B)
    return _Stream(k.to(torch.int16 if bits == 14 else torch.int32), v, outs[start_f],
                   (torch.cumsum(starts, 0) - starts).to(torch.int32), tile_of_block.to(torch.int32), tiles, n_out,
                   per, B)


@dataclass
class _Streams:
    """The gather strategy's cache-blocked passes (:func:`_tile_plan` sizes them; None: not tiled).

    ``xy``: ``t = A y``, A's nonzeros by column tile (W columns), rows ascending within a tile,
    segment ``k N + n``. ``xtp``: ``w = A^T p``, by row tile (H rows) then column, segment ``r D + c``,
    index = the row. Each costs 2 + ``b_val`` bytes per nonzero and 4 per segment while cached.
    """

    xy: _Stream | None
    xtp: _Stream | None
    val_ref: weakref.ref
    val_version: int


def _tile_sizes(A: CSRMatrix, m: int, tile_bytes: int, flat: int = 0) -> tuple:
    """``(W, H, flat)``: columns and rows per tile of the two passes (``D``, ``N``: not tiled) and
    which untiled passes read a flat stream (bit 0: over A, bit 1: over the copy; ``flat`` asks)."""
    n, d = A.shape
    b_acc = 8 if A.val.dtype == torch.float64 else 4
    W = _tile_plan(n, d, A.nnz, m, b_acc, tile_bytes)
    H = _tile_plan(d, n, A.nnz, m, b_acc, tile_bytes)
    f = 0
    if tile_bytes > 0 and flat:
        f |= (flat & 1) if W >= d and _flat_plan(n, d, A.nnz, m, b_acc) else 0
        f |= (flat & 2) if H >= n and _flat_plan(d, n, A.nnz, m, b_acc) else 0
    return W, H, f


def _streams(A: CSRMatrix, st: "_Structure", W: int, H: int, flat: int = 0) -> _Streams:
    """The cache-blocked streams for tile sizes ``(W, H)`` and the flat ones of untiled passes
    (``flat`` bits, see :func:`_tile_sizes`); cached with A's structure, rebuilt when ``A.val`` is
    another tensor or was changed in place. Building sorts the nonzeros once per streamed pass
    (~40 B/nnz of temporaries)."""
    c = st.streams.get((W, H, flat))
    if _current(c, A):
        return c
    st.streams.pop((W, H, flat), None)
    n, d = A.shape
    rows = _row_ids(A, torch.int64)
    col = A.col.to(torch.int64)
    xy = xtp = None
    if W < d or flat & 1:
        tile = col // W
        order = torch.sort(tile, stable=True).indices  # CSR is row-major: rows stay ascending per tile
        key = (tile * n + rows)[order]
        del tile
        xy = _make_stream(key, A.col[order], A.val[order], -(-d // W), n, W)
        del order, key
    if H < n or flat & 2:
        key = (rows // H) * d + col
        order = torch.sort(key, stable=True).indices  # (row tile, column, row)
        xtp = _make_stream(key[order], rows[order], A.val[order], -(-n // H), d, H)
        del key, order
    c = _Streams(xy, xtp, weakref.ref(A.val), A.val._version)
    st.streams[(W, H, flat)] = c
    return c


def _stream_pass(sp: _Stream, vec: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[n_out]`` sums of one cache-blocked pass gathering from ``vec`` ([n_vec], accumulation dtype),
    added onto ``out`` ([n_out + 1], its last entry the padding's: it receives zeros) when given."""
    dev = vec.device
    if out is None:
        out = torch.zeros(sp.n_out + 1, dtype=vec.dtype, device=dev)  # + the padding's output
    n_blocks = sp.key.numel() // sp.block
    P = min(n_blocks, _gpu_profile(None, dev)["sm_count"] * STREAM_PROGRAMS_PER_SM)
    inline = sp.tiles == 1 if STREAM_INLINE_RED == "flat" else bool(STREAM_INLINE_RED)
    call(_stream_gather_kernel, (P,), sp.key, sp.val, sp.seg_out, sp.seg_base, sp.tile, vec, out, n_blocks, sp.per,
         BLOCK=sp.block, ACC64=vec.dtype == torch.float64, IDX_BITS=_idx_bits(sp.per), INLINE_RED=inline,
         CONTIG=STREAM_CONTIG, num_warps=STREAM_WARPS)
    return out[:sp.n_out]


def _stream_matvec(sp: _Stream, y: torch.Tensor, d: int, intercept: bool) -> torch.Tensor:
    """``[N, 1]``: ``A y`` (+ ``y[d]`` with the intercept) by the cache-blocked pass ``sp`` (m = 1)."""
    t = _stream_pass(sp, y[:d, 0].contiguous())[:, None]
    return t + y[d] if intercept else t


def _streams_for(A: CSRMatrix, st: "_Structure", cfg: "CSRConfig", m: int, build: bool) -> _Streams | None:
    """The streams the config's cache blocking asks for (built when ``build``), or None."""
    if not cfg.tile_bytes:
        return None
    W, H, flat = _tile_sizes(A, m, cfg.tile_bytes, cfg.flat)
    if W >= A.shape[1] and H >= A.shape[0] and not flat:
        return None
    if build:
        return _streams(A, st, W, H, flat)
    c = st.streams.get((W, H, flat))
    return c if _current(c, A) else None


@dataclass
class _Schedule:
    """Launch plan for one (matrix, config)."""

    ordered: bool
    rows: torch.Tensor | None  # [n_slots] row ids in bin order (binned), None when ordered
    bins: list  # [(slot_lo, slot_hi, L, BLOCK_R, single)]
    n_short_programs: int
    long_rows: torch.Tensor | None  # [n_long]
    chunk_row: torch.Tensor | None  # [n_chunks] int32
    chunk_first: torch.Tensor | None  # [n_long + 1] int32
    n_chunks: int
    chunk: int


def _schedule(A: CSRMatrix, st: _Structure, cfg: CSRConfig, sm_count: int) -> _Schedule:
    key = cfg.launch_key()
    sch = st.schedules.get(key)
    if sch is not None:
        return sch
    n = A.shape[0]
    stats = st.stats
    if cfg.ordered:
        single = cfg.single and stats.max_len <= cfg.lanes
        bins = [(0, n, cfg.lanes, cfg.block_r, single)]
        sch = _Schedule(True, None, bins, triton.cdiv(n, cfg.block_r), None, None, None, 0, cfg.chunk)
    else:
        lengths = (A.crow[1:] - A.crow[:-1]).to(torch.int64)
        widths = []
        w = _pow2_ceil(cfg.l_min)
        while w < cfg.long_threshold:
            widths.append(w)
            w *= 2
        widths.append(_pow2_ceil(cfg.long_threshold))
        lt = widths[-1]
        # bin id: index of the smallest width covering the row; len(widths) for long rows.
        bid = torch.zeros_like(lengths)
        for wd in widths[:-1]:
            bid += (lengths > wd).to(torch.int64)
        bid += (lengths > lt).to(torch.int64)
        counts = torch.bincount(bid, minlength=len(widths) + 1).cpu().tolist()
        order = torch.sort(bid, stable=True).indices
        idx_dtype = torch.int32 if n < 2**31 else torch.int64
        rows = order.to(idx_dtype).contiguous()
        bins = []
        lo = 0
        n_prog = 0
        for wd, cnt in zip(widths, counts[:-1]):
            if cnt:
                br = cfg.bin_block_r(wd)
                bins.append((lo, lo + cnt, wd, br, True))
                n_prog += triton.cdiv(cnt, br)
            lo += cnt
        n_long = counts[-1]
        long_rows = chunk_row = chunk_first = None
        n_chunks = 0
        chunk = cfg.chunk
        if n_long:
            long_rows = rows[lo:].contiguous()
            long_len = lengths[long_rows.long()]
            long_nnz = int(long_len.sum())
            chunk = min(cfg.chunk, _long_chunk(long_nnz, cfg.piece, sm_count))
            chunk = max(chunk, cfg.piece)
            per_row = (long_len + chunk - 1) // chunk
            first = torch.zeros(n_long + 1, dtype=torch.int64, device=A.device)
            first[1:] = torch.cumsum(per_row, 0)
            n_chunks = int(first[-1])
            chunk_first = first.to(torch.int32)
            chunk_row = torch.repeat_interleave(
                torch.arange(n_long, device=A.device, dtype=torch.int32), per_row)
        sch = _Schedule(False, rows, bins, n_prog, long_rows, chunk_row, chunk_first, n_chunks, chunk)
    st.schedules[key] = sch
    return sch


# ------------------------------------------------------------------------------------------------
# Launch wrappers
# ------------------------------------------------------------------------------------------------
def _alloc(shape, dtype, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _resolve_config(A: CSRMatrix, st: _Structure, m: int, config) -> tuple:
    """``(cfg, explicit, gather_overrides)``: the launch config, whether the caller fixed the
    strategy, and a dict of field overrides for the CSC pass's launch (or None)."""
    if isinstance(config, CSRConfig):
        check_csr_launch(config, m)
        return config, True, None
    if config is not None and not isinstance(config, dict):
        raise TypeError(f"config must be None, a dict or a CSRConfig, got {type(config).__name__}")
    config = config or {}
    strategy = config.get("strategy", "auto")
    memory = config.get("memory", "normal")
    # The model's pick is cached per (matrix, m, strategy, memory): a solver calls this every
    # iteration, and host time between launches is GPU idle time on short calls.
    key = (m, A.val.dtype, strategy, memory, st.col_stats is not None, FLAT_PASSES)  # (A/B runs switch FLAT_PASSES)
    base = st.configs.get(key)
    if base is None:
        base = csr_config(st.stats, m, A.val.dtype, _gpu_profile(None, A.device), strategy=strategy,
                          memory=memory, col_stats=st.col_stats)
        st.configs[key] = base
    fields = {f.name for f in dataclasses.fields(CSRConfig)} - {"strategy", "gather", "pred_scatter_ms",
                                                                 "pred_gather_ms"}
    extra = {k: v for k, v in config.items() if k in fields}
    if extra:
        base = dataclasses.replace(base, **extra)
    g = config.get("gather")
    if g is not None and not isinstance(g, (dict, CSRConfig)):
        raise TypeError(f"config['gather'] must be a dict or a CSRConfig, got {type(g).__name__}")
    if isinstance(g, CSRConfig):
        base, g = dataclasses.replace(base, gather=g), None
    elif g and base.gather is not None:  # the model already picked the CSC pass: override its fields
        gfields = {f.name for f in dataclasses.fields(CSRConfig)} - {"strategy", "gather"}
        base, g = dataclasses.replace(base, gather=dataclasses.replace(
            base.gather, **{k: v for k, v in g.items() if k in gfields})), None
    if extra or config.get("gather") is not None:  # the model's own picks need no check per call
        check_csr_launch(base, m)
    return base, strategy != "auto", g


def check_csr_launch(cfg: CSRConfig, m: int) -> None:
    """Reject CSR launch parameters (the model's pick with ``config=`` overrides, or a given
    :class:`CSRConfig`, its CSC pass's included) that no kernel can run: tile axes that are not
    powers of two, counts below one, warp counts Triton cannot launch, tiles beyond Triton's
    largest tensor.

    Parameters
    ----------
    cfg : CSRConfig
    m : int
        Right-hand sides.

    Raises
    ------
    ValueError
        Naming the field (``"config: ..."``).
    """
    check_launch_fields(cfg, pow2=("block_r", "lanes", "tile", "piece"), positive=("l_min", "long_threshold", "chunk"),
                        warps=("num_warps", "long_warps"), flags=("ordered", "single", "l1_bypass"))
    # row tiles [block_r x lanes] (binned: tile) and long-row steps [piece], each x the padded m
    check_launch_fields(cfg, tile=max(cfg.block_r * cfg.lanes, cfg.tile, cfg.piece) * _pow2_ceil(m))
    if not isinstance(cfg.tile_bytes, int) or isinstance(cfg.tile_bytes, bool) or cfg.tile_bytes < 0:
        raise ValueError(f"config: tile_bytes must be a non-negative integer, got {cfg.tile_bytes!r}")
    if not isinstance(cfg.flat, int) or isinstance(cfg.flat, bool) or cfg.flat not in (0, 1, 2, 3):
        raise ValueError(f"config: flat must be 0, 1, 2 or 3 (bits: the pass over A, over the copy), got {cfg.flat!r}")
    if cfg.gather is not None:
        check_csr_launch(cfg.gather, m)


def _gather_pass_config(csc: _CSC, cfg: CSRConfig, m: int, dtype, prof: dict, g=None) -> CSRConfig:
    """Launch config of the pass over the CSC copy: ``cfg.gather``, or the model's pick for the
    copy's column-length profile (the dict ``g`` overrides fields of that pick)."""
    if cfg.gather is not None:
        return cfg.gather
    key = ("gather-pass", cfg.launch_key(), m, dtype)
    if not g and key in csc.st.configs:
        return csc.st.configs[key]
    pick = CSRConfig(strategy="gather", pred_scatter_ms=cfg.pred_scatter_ms, pred_gather_ms=cfg.pred_gather_ms,
                     **_launch_params(csc.st.stats, m, dtype, prof))
    if g:
        fields = {f.name for f in dataclasses.fields(CSRConfig)} - {"strategy", "gather"}
        pick = dataclasses.replace(pick, **{k: v for k, v in g.items() if k in fields})
        check_csr_launch(pick, m)
    else:
        csc.st.configs[key] = pick
    return pick


def _copy_fits(A: CSRMatrix) -> bool:
    """Whether building the CSC copy (and its sort temporaries) takes under half the free memory."""
    if A.device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(A.device)
    free += torch.cuda.memory_reserved(A.device) - torch.cuda.memory_allocated(A.device)
    need = A.nnz * (A.val.element_size() + 4 + 32) + 8 * (A.shape[1] + 1)
    return need < 0.5 * free


_COEFS: dict = {}


def _coef(alpha: float, beta: float, dtype: torch.dtype, device) -> torch.Tensor:
    """``[alpha, beta]`` on the device, built WITHOUT a host-device sync and cached.

    ``torch.tensor([alpha, beta], device="cuda")`` copies from pageable host memory and
    synchronises the stream: the GPU then idles while the host enqueues the next launches (two
    syncs per gather call; on a ~0.25 ms call that is a large share). ``fill_`` with a Python scalar
    is a kernel argument (exact in fp64), so nothing waits; the (few) distinct pairs are reused.
    """
    key = (float(alpha), float(beta), dtype, str(device))
    c = _COEFS.get(key)
    if c is None:
        if len(_COEFS) >= 64:  # e.g. a line search's many alphas: keep the cache small
            _COEFS.clear()
        c = torch.empty(2, dtype=dtype, device=device)
        c[0].fill_(key[0])
        c[1].fill_(key[1])
        _COEFS[key] = c
    return c


#: pad the rows of y, w and p to a power of two (m = 3 -> 4, 5 -> 8): 16-byte vector gathers and
#: F32x4 REDs, but more bytes per row; on the H200 (session 27, against the unpadded rows) m = 3
#: 2.46 -> 2.58 ms at 4M x 100k and 1.70 -> 2.15 at 1M x 1M, m = 5 3.40 -> 4.04: off. Power-of-two m
#: (2, 4) need no padding and take the flattened whole-row path either way (m = 4: 2.81 -> 2.64 ms).
PAD_ROWS = False


def _row_width(m: int) -> int:
    """Columns of the y / w / p rows the kernels see (:data:`PAD_ROWS`)."""
    return _pow2_ceil(m) if PAD_ROWS else m


def _pad_cols(t: torch.Tensor | None, mp: int) -> torch.Tensor | None:
    """``t`` ``[R, m]`` as ``[R, mp]`` with zero columns: rows of a power-of-two width are whole
    aligned vectors, so the kernels gather (and scatter) each row in one access (m = 3: 12-byte rows
    took one thread per column and a layout change through shared memory per loop step on sm_90)."""
    if t is None or t.shape[1] == mp:
        return t
    out = torch.zeros((t.shape[0], mp), dtype=t.dtype, device=t.device)
    out[:, :t.shape[1]] = t
    return out


def _run(A: CSRMatrix, st: _Structure, cfg: CSRConfig, y, v, z, out, *, mode, intercept, softmax,
         alpha, beta=0.0, m=None) -> torch.Tensor | None:
    """Launch the row and long-row kernels over ``A``; returns the intercept sum [MP] or None.

    mode 0: ``out = alpha * (A y) + beta * z``; 1: ``out += A^T p`` (scatter); 2: ``out = p``.
    ``m``: the number of columns when ``y`` (and, in modes 1 / 2, ``out``) have rows padded to the
    next power of two (:func:`_pad_cols`).
    """
    n, d = A.shape
    ref = y if y is not None else v
    m = m or ref.shape[1]
    if v is not None and v.shape[1] not in (1, m):
        raise ValueError(f"v must have 1 or m={m} columns, got shape {tuple(v.shape)}")
    mp = _pow2_ceil(m)
    ys = y.shape[1] if y is not None else m
    ps = out.shape[1] if mode in (1, 2) else m
    acc64 = ref.dtype == torch.float64
    prof = _gpu_profile(None, A.device)
    sch = _schedule(A, st, cfg, prof["sm_count"])
    dev = A.device
    has_y, has_v, has_z = y is not None, v is not None, z is not None
    wide = A.col.dtype == torch.int32 and (d + 1) * max(ys, ps) >= 2**31
    dummy = A.crow
    y_arg = y if has_y else ref
    v_arg = v if has_v else ref
    z_arg = z if has_z else ref
    vm = v.shape[1] if has_v else m
    n_prog_total = sch.n_short_programs + sch.n_chunks
    need_ipart = mode in (1, 2) and intercept
    ipart = _alloc((max(n_prog_total, 1), mp), ref.dtype, dev) if need_ipart else ref
    rows_arg = sch.rows if sch.rows is not None else dummy
    coef = _coef(alpha, beta, ref.dtype, dev)
    prog_base = 0
    for lo, hi, L, br, single in sch.bins:
        grid = (triton.cdiv(hi - lo, br),)
        call(_csr_rows_kernel, grid,
            A.crow, A.col, A.val, rows_arg, y_arg, v_arg, z_arg, out, ipart, lo, hi, prog_base, d, coef,
            M=m, MP=mp, YS=ys, PS=ps, VM=vm, BLOCK_R=br, L=L, SINGLE=single, HAS_Y=has_y, HAS_V=has_v, HAS_Z=has_z,
            INTERCEPT=intercept, SOFTMAX=softmax, MODE=mode, ROW_PERM=not sch.ordered,
            WIDE=wide, ACC64=acc64, L1_BYPASS=cfg.l1_bypass, num_warps=_warps(cfg.num_warps, br * L * mp)
        )
        prog_base += grid[0]
    if sch.n_chunks:
        part = ref
        common = dict(M=m, MP=mp, YS=ys, PS=ps, PIECE=cfg.piece, WIDE=wide, ACC64=acc64)
        if has_y:
            part = _alloc((sch.n_chunks, mp), ref.dtype, dev)
            call(_csr_long_partial_kernel, (sch.n_chunks,),
                A.crow, A.col, A.val, sch.long_rows, sch.chunk_row, sch.chunk_first, y_arg, part, sch.chunk,
                REREAD=mode == 1, L1_BYPASS=cfg.l1_bypass, num_warps=cfg.long_warps, **common
            )
        call(_csr_long_finish_kernel, (sch.n_chunks,),
            A.crow, A.col, A.val, sch.long_rows, sch.chunk_row, sch.chunk_first, part, y_arg, v_arg, z_arg,
            out, ipart, prog_base, d, coef, sch.chunk, VM=vm, HAS_Y=has_y, HAS_V=has_v, HAS_Z=has_z,
            INTERCEPT=intercept, SOFTMAX=softmax, MODE=mode, num_warps=cfg.long_warps, **common
        )
    if need_ipart:
        return ipart[:n_prog_total].sum(0) if n_prog_total else torch.zeros(mp, dtype=ref.dtype, device=dev)
    return None


def _warps(w: int, elems: int) -> int:
    # Small tiles: fewer warps than the model's default (no idle lanes).
    while w > 1 and elems < 32 * w:
        w //= 2
    return w


def _check_csr(A) -> None:
    if not isinstance(A, CSRMatrix):
        raise TypeError(f"A must be a fusedml.CSRMatrix, got {type(A).__name__}")
    if A.crow.dtype not in (torch.int32, torch.int64) or A.col.dtype != A.crow.dtype:
        raise TypeError(f"A: crow/col must both be int32 or int64, got {A.crow.dtype}/{A.col.dtype}")
    if A.val.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise TypeError(f"A: unsupported value dtype {A.val.dtype}")
    if not (A.crow.is_contiguous() and A.col.is_contiguous() and A.val.is_contiguous()):
        raise ValueError("A: crow, col and val must be contiguous")
    if A.shape[0] == 0 or A.shape[1] == 0:
        raise ValueError(f"A is empty: shape {tuple(A.shape)}")


def _check_dense(t, name, rows, acc, device, m=None):
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.ndim != 2:
        raise ValueError(f"{name} must be a 2-D tensor [{rows}, m], got "
                         f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if t.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got shape {tuple(t.shape)}")
    if m is not None and t.shape[1] != m and not (name == "v" and t.shape[1] == 1):
        raise ValueError(f"{name} must have m={m} columns{' (or 1, broadcast)' if name == 'v' else ''}, "
                         f"got shape {tuple(t.shape)}")
    if not 1 <= t.shape[1] <= MAX_M:
        raise ValueError(f"{name}: m must be between 1 and {MAX_M}, got {t.shape[1]}")
    if t.dtype != acc:
        raise TypeError(f"{name} must have the accumulation dtype {acc}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but A is on {device}")


def _acc_dtype(A: CSRMatrix) -> torch.dtype:
    return torch.float64 if A.val.dtype == torch.float64 else torch.float32


def csr_matvec_fused(A: CSRMatrix, y: torch.Tensor, *, intercept: bool = False, config=None) -> torch.Tensor:
    """``t = A y`` (``+ y[D]`` with ``intercept``) with the CSR row kernel.

    Parameters
    ----------
    A : CSRMatrix
        ``[N, D]``, int32/int64 indices, fp32/fp64/fp16/bf16 values.
    y : torch.Tensor
        ``[D(+1), m]`` contiguous, accumulation dtype (fp32; fp64 for fp64 values), on A's device.
    intercept : bool
        Treat A as ``[A, 1]``: ``y`` has ``D + 1`` rows and ``t_n += y[D]``.
    config : CSRConfig or dict, optional
        Override the launch model.

    Returns
    -------
    torch.Tensor
        ``[N, m]`` accumulation dtype (fresh tensor; every row written, empty rows get 0 or
        ``y[D]``).
    """
    _check_csr(A)
    n, d = A.shape
    acc = _acc_dtype(A)
    _check_dense(y, "y", d + int(bool(intercept)), acc, A.device)
    y = y.contiguous()
    st = _structure(A)
    cfg = _resolve_config(A, st, y.shape[1], config)[0]
    sm_ = _streams_for(A, st, cfg, y.shape[1], build=False) if cfg.strategy == "gather" else None
    if sm_ is not None and sm_.xy is not None:  # a solver's matvec: the mmchain's cached stream
        return _stream_matvec(sm_.xy, y, d, intercept)
    m = y.shape[1]
    out = _alloc((n, m), acc, A.device)
    _run(A, st, cfg, _pad_cols(y, _row_width(m)), None, None, out, mode=0, intercept=bool(intercept), softmax=False,
         alpha=1.0, m=m)
    return out


def csr_mmchain_fused(A: CSRMatrix, y, v, z, alpha=1.0, beta=0.0, *, intercept: bool = False,
                      v_op: str = "mul", deterministic: bool = False, config=None) -> torch.Tensor:
    """``w = alpha * A^T (v ⊙ (A y)) + beta * z`` reading A once (see the module docstring).

    Parameters
    ----------
    A : CSRMatrix
        ``[N, D]``, int32/int64 indices, fp32/fp64/fp16/bf16 values.
    y : torch.Tensor or None
        ``[D(+1), m]`` (m <= 16). None: skip ``A y``, ``w = alpha A^T v + beta z``.
    v : torch.Tensor or None
        ``[N, m]``; None means all ones (required when ``y`` is None).
    z : torch.Tensor or None
        ``[D(+1), m]``; None: no ``beta z`` term.
    alpha, beta : float
    intercept : bool
        Treat A as ``[A, 1]``: ``t_n = A_n y[:D] + y[D]`` and ``w[D] = alpha Σ_n p_n (+ beta z[D])``.
    v_op : {"mul", "softmax"}
        ``p = v ⊙ t`` or ``p_nj = v_nj (t_nj − Σ_l v_nl t_nl)``.
    deterministic : bool
        Bitwise reproducible: always the gather strategy (no float atomics; builds the CSC copy).
    config : CSRConfig or dict, optional
        Override the launch model. A dict may hold ``"strategy"`` (``"auto"`` | ``"scatter"`` |
        ``"gather"``), ``"memory"`` (``"normal"`` | ``"low"``: no CSC copy, so scatter unless
        ``deterministic``), ``"gather"`` (a dict of launch fields for the pass over the CSC copy)
        and any :class:`CSRConfig` launch field (the pass over A's rows). Other keys are ignored.
        ``"auto"`` builds the copy from the second call on the same matrix object only, and only
        when it takes under half the free device memory.

    Returns
    -------
    torch.Tensor
        ``[D(+1), m]`` accumulation dtype (fp32, fp64 for fp64 values), a fresh tensor.
    """
    _check_csr(A)
    n, d = A.shape
    acc = _acc_dtype(A)
    if v_op not in ("mul", "softmax"):
        raise ValueError(f"v_op must be 'mul' or 'softmax', got {v_op!r}")
    intercept = bool(intercept)
    dx = d + int(intercept)
    if y is None and v is None:
        raise ValueError("v is required when y is None (w = alpha A^T v + beta z)")
    _check_dense(y, "y", dx, acc, A.device)
    m = y.shape[1] if y is not None else v.shape[1]
    _check_dense(v, "v", n, acc, A.device, m)
    _check_dense(z, "z", dx, acc, A.device, m)
    y, v, z = (None if t is None else t.contiguous() for t in (y, v, z))  # the kernels take unit strides
    if v_op == "softmax" and y is None:
        raise ValueError("v_op='softmax' needs y (it acts on t = A y); got y=None")
    softmax = v_op == "softmax"
    alpha = float(alpha)
    beta = float(beta)
    st = _structure(A)
    cfg, explicit, g_over = _resolve_config(A, st, m, config)
    gather = deterministic or cfg.strategy == "gather"
    if gather and not deterministic and not explicit and not _csc_cached(A, st):
        # auto: a one-off call never pays the copy's sort; nor is it built when memory is short.
        gather = st.calls > 0 and _copy_fits(A)
    st.calls += 1
    if gather and not deterministic and st.col_stats is None and not isinstance(config, CSRConfig):
        # about to build the gather copies: the model's pick for the pass over the copy (a flat stream
        # or the row kernel over a CSC copy) needs the column statistics first (one bincount)
        _col_stats(A, st)
        cfg, explicit, g_over = _resolve_config(A, st, m, config)
    mp = _row_width(m)
    if not gather:  # scatter: one read of A, float atomics into w (rows of mp columns)
        w = _pad_cols(beta * z, mp) if z is not None else torch.zeros((dx, mp), dtype=acc, device=A.device)
        isum = _run(A, st, cfg, _pad_cols(y, mp), v, None, w, mode=1, intercept=intercept, softmax=softmax,
                    alpha=alpha, m=m)
        w = w if mp == m else w[:, :m].contiguous()
        if intercept:
            w[d] += isum[:m]
        return w

    # gather: p = alpha v ⊙ (A y) by the pass over A's rows, then w = A^T p (+ beta z) by the pass
    # over the CSC copy's rows: fixed-order sums, no atomics (deterministic). With cache blocking
    # (cfg.tile_bytes, m = 1, not deterministic) either pass may read a tiled stream instead.
    sm_ = None if deterministic else _streams_for(A, st, cfg, m, build=True)
    if (_STREAM_EPILOGUE and sm_ is not None and sm_.xy is not None and sm_.xtp is not None and y is not None
            and not softmax and acc == torch.float32):
        return _streamed_mmchain(sm_, y, v, z, alpha, beta, n, d, intercept)
    w = _alloc((dx, m), acc, A.device)
    if y is not None and sm_ is not None and sm_.xy is not None:
        t = _stream_matvec(sm_.xy, y, d, intercept)
        if softmax:
            p = v * (t - (v * t).sum(1, keepdim=True))
        else:
            p = t * v if v is not None else t
        p = p * alpha if alpha != 1.0 else p
        isum = p.sum(0) if intercept else None
        src, scale = p, 1.0
    elif y is not None:  # p with rows of mp columns (zeros beyond m), gathered by the second pass
        p = _alloc((n, mp), acc, A.device)
        isum = _run(A, st, cfg, _pad_cols(y, mp), v, None, p, mode=2, intercept=intercept, softmax=softmax,
                    alpha=alpha, m=m)
        src, scale = p, 1.0
    else:  # p = alpha v: alpha applied in the second pass
        isum = alpha * v.sum(0) if intercept else None
        src, scale = v, alpha
    if sm_ is not None and sm_.xtp is not None:
        wd = _stream_pass(sm_.xtp, src[:, 0].contiguous())
        w[:d, 0] = wd * scale if scale != 1.0 else wd
        if z is not None and beta != 0.0:
            w[:d] += beta * z[:d]
    else:
        csc = _csc(A, st)
        gcfg = _gather_pass_config(csc, cfg, m, A.val.dtype, _gpu_profile(None, A.device), g_over)
        _run(csc.AT, csc.st, gcfg, src, None, None if z is None else z[:d], w[:d], mode=0, intercept=False,
             softmax=False, alpha=scale, beta=beta, m=m)
    if intercept:
        w[d] = isum[:m] if z is None else isum[:m] + beta * z[d]
    return w


#: The streamed product's pointwise steps in two launches (:func:`_streamed_mmchain`); False: in
#: torch ops as before (A/B runs)
_STREAM_EPILOGUE = True
#: rows per program of its pointwise launch (one atomic per program into the intercept's sum)
EPILOGUE_BLOCK = 4096


def _streamed_mmchain(sm_: _Streams, y, v, z, alpha, beta, n, d, intercept):
    """``alpha A^T (v ⊙ (A y)) + beta z`` (m = 1, fp32) over both cache-blocked streams.

    Between the passes one launch forms ``p`` and, with the intercept, adds ``sum(p)`` into the
    result's last entry (:func:`_stream_weights_kernel`); the result buffer starts as ``beta z``
    (one launch) and the second pass adds onto it, its padding's zeros landing in entry ``d``:
    5 launches where the torch form took ~14 (each a few microseconds of GPU time in a CUDA graph
    of CSR CG steps). Returns ``[d (+1), 1]``.
    """
    dev = y.device
    t = _stream_pass(sm_.xy, y[:d, 0].contiguous())  # [n]
    w = torch.empty(d + 1, dtype=torch.float32, device=dev)  # + the xtp stream's padding slot (= intercept's)
    if z is not None and beta != 0.0:
        torch.mul(z[:, 0], beta, out=w[:d + int(intercept)])
        if not intercept:
            w[d:].zero_()
    else:
        w.zero_()
    p = torch.empty(n, dtype=torch.float32, device=dev)
    B = EPILOGUE_BLOCK
    call(_stream_weights_kernel, (triton.cdiv(n, B),), t, t if v is None else v[:, 0], y[d:] if intercept else y,
         p, w[d:], float(alpha), n, HAS_V=v is not None, INTERCEPT=bool(intercept), BLOCK=B, num_warps=8)
    _stream_pass(sm_.xtp, p, out=w)
    return w[:d + int(intercept)].view(-1, 1)


def _csc_cached(A: CSRMatrix, st: _Structure) -> bool:
    """Whether a copy of the gather strategy (the CSC copy or cache-blocked streams) is current."""
    return any(_current(c, A) for c in [st.csc, *st.streams.values()])


# ------------------------------------------------------------------------------------------------
# GPU benchmark of this module alone (the lead runs it): python -m fusedml.mmchain.csr --help
# ------------------------------------------------------------------------------------------------
def _bench_matrix(n, d, lengths, *, idx=torch.int32, dtype=torch.float32, device="cuda", seed=0):
    """CSR with the given row lengths, built on the device: row r's k columns are stratified
    (one uniform draw in each of k equal slices of [0, d)), hence sorted and unique."""
    g = torch.Generator(device=device).manual_seed(seed)
    lengths = lengths.to(device=device, dtype=torch.int64)
    crow = torch.zeros(n + 1, dtype=torch.int64, device=device)
    crow[1:] = torch.cumsum(lengths, 0)
    nnz = int(crow[-1])
    row = torch.repeat_interleave(torch.arange(n, device=device), lengths)
    jloc = torch.arange(nnz, device=device) - crow[row]
    u = torch.rand(nnz, generator=g, device=device, dtype=torch.float64)
    col = ((jloc + u) * d / lengths[row]).floor().clamp_(max=d - 1).to(torch.int64)
    val = torch.randn(nnz, generator=g, device=device).to(dtype)
    return CSRMatrix(crow.to(idx), col.to(idx), val, (n, d))


def _bench_main(argv=None):
    import argparse
    import json
    import time

    ap = argparse.ArgumentParser(
        description="fused CSR mmchain (model pick, scatter, gather) vs torch sparse (cuSPARSE), H200 targets")
    ap.add_argument("--quick", action="store_true", help="1/8 of the sizes")
    ap.add_argument("--sweep", action="store_true", help="also time csr_sweep_configs (model vs best)")
    ap.add_argument("--cases", default="uniform32,uniform100,powerlaw,uniform32_m4,uniform32_bf16")
    ap.add_argument("--json", default=None, help="write result rows here")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny sizes on the CPU under TRITON_INTERPRET=1 (checks this script, times nothing)")
    args = ap.parse_args(argv)
    import sys

    if args.dry_run:
        dev, s = torch.device("cpu"), 20000

        def do_bench(fn, rep=0):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    else:
        from triton.testing import do_bench

        dev = torch.device("cuda")
        s = 8 if args.quick else 1
    bw = 4.28e12
    cases = {
        "uniform32": dict(n=4_000_000 // s, d=100_000, kind="const", k=32, m=1, dtype=torch.float32, target_ms=0.40),
        "uniform100": dict(n=1_000_000 // s, d=1_000_000, kind="const", k=100, m=1, dtype=torch.float32, target_ms=0.35),
        "powerlaw": dict(n=4_000_000 // s, d=1_000_000, kind="power", k=5, m=1, dtype=torch.float32, target_ms=None),
        "uniform32_m4": dict(n=4_000_000 // s, d=100_000, kind="const", k=32, m=4, dtype=torch.float32, target_ms=None),
        "uniform32_bf16": dict(n=4_000_000 // s, d=100_000, kind="const", k=32, m=1, dtype=torch.bfloat16, target_ms=None),
    }
    rows_out = []
    for name in args.cases.split(","):
        c = cases[name]
        n, d, m = c["n"], c["d"], c["m"]
        if args.dry_run:
            d = max(d // 500, 2000)
        if c["kind"] == "const":
            lengths = torch.full((n,), c["k"], dtype=torch.int64)
        else:  # most rows 5 nonzeros, 20 rows of 1e5, a Zipf tail in between
            lengths = torch.full((n,), c["k"], dtype=torch.int64)
            tail = torch.randint(0, n, (n // 100,))
            lengths[tail] = torch.randint(6, 2000, (tail.numel(),))
            lengths[torch.randint(0, n, (20,))] = min(100_000, d)
        A = _bench_matrix(n, d, lengths, dtype=c["dtype"], device=dev)
        y = torch.randn(d, m, device=dev)
        v = torch.rand(n, m, device=dev)
        cfg = csr_config(A, m, A.val.dtype)
        fused = lambda config=None: csr_mmchain_fused(A, y, v, None, 1.0, 0.0, config=config)  # noqa: E731
        first_s = {}
        for strat in ("scatter", "gather"):  # compile; gather's first call also builds the CSC copy
            t0 = time.perf_counter()
            fused({"strategy": strat})
            if dev.type == "cuda":
                torch.cuda.synchronize()
            first_s[strat] = round(time.perf_counter() - t0, 3)
        ms = do_bench(fused, rep=200)  # the model's pick (auto)
        ms_sc = do_bench(lambda: fused({"strategy": "scatter"}), rep=200)
        ms_ga = do_bench(lambda: fused({"strategy": "gather"}), rep=200)
        ms_det = do_bench(lambda: csr_mmchain_fused(A, y, v, None, 1.0, 0.0, deterministic=True), rep=200)
        X = torch.sparse_csr_tensor(A.crow, A.col, A.val.float(), A.shape)
        XT = X.t().to_sparse_csr()  # the pre-built transpose (2x memory), built once
        ops = lambda: XT @ (v * (X @ y))  # noqa: E731
        ms_ops = do_bench(ops, rep=200)
        ms_spmv = do_bench(lambda: X @ y, rep=200)
        X64 = torch.sparse_csr_tensor(A.crow, A.col, A.val.double(), A.shape)
        ref = X64.t().to_sparse_csr() @ (v.double() * (X64 @ y.double()))
        errs = {k: float((fused({"strategy": k}).double() - ref).norm() / ref.norm()) for k in ("scatter", "gather")}
        bytes_x = A.nnz * (A.val.element_size() + A.col.element_size()) + (n + 1) * A.crow.element_size()
        floor = bytes_x / bw * 1e3
        row = dict(case=name, n=n, d=d, nnz=A.nnz, m=m, dtype=str(c["dtype"]).replace("torch.", ""),
                   strategy=cfg.strategy, ms=round(ms, 4), floor_ms=round(floor, 4), x_floor=round(ms / floor, 3),
                   gbps=round(bytes_x / ms / 1e6, 1), target_ms=c["target_ms"],
                   ms_scatter=round(ms_sc, 4), pred_scatter_ms=cfg.pred_scatter_ms,
                   ms_gather=round(ms_ga, 4), pred_gather_ms=cfg.pred_gather_ms,
                   ms_deterministic=round(ms_det, 4), ms_ops_pretransposed=round(ms_ops, 4),
                   speedup_vs_ops=round(ms_ops / ms, 2), ms_torch_spmv_only=round(ms_spmv, 4),
                   rel_err_scatter=errs["scatter"], rel_err_gather=errs["gather"], first_call_s=first_s,
                   config=repr(cfg))
        if args.sweep:
            best = (ms, "model")
            for i, alt in enumerate(csr_sweep_configs(A, m)[1:]):
                try:
                    t = do_bench(lambda: fused(alt), rep=50)
                except Exception as e:  # a variant that does not compile is reported, not fatal
                    print(f"  sweep {i}: {alt} failed: {e}")
                    continue
                if t < best[0]:
                    best = (t, repr(alt))
            row.update(sweep_best_ms=round(best[0], 4), model_vs_best=round(ms / best[0], 3), sweep_best=best[1])
        print(json.dumps(row), flush=True)
        rows_out.append(row)
        A = X = XT = X64 = None  # free the device memory
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    meta = dict(gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter dry run)",
                torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv if argv is None else argv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows_out), f, indent=1)
    return rows_out


if __name__ == "__main__":
    _bench_main()
