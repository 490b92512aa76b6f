"""The diag single sweep on the tensor cores with fp32-level accuracy (``form="mma"``).

Both products of a row block run as ``mma.sync.m16n8k8`` tf32 tensor-core instructions (inline
PTX), each split into three (``a_lo b_hi + a_hi b_lo + a_hi b_hi``, "3xTF32": errors <= 2e-6
relative against float64 on an H100, the fp32 FMA form's order of magnitude):

* the logits ``L^T [K, rows] = [W1; W2]^T [K, 2D] @ [x, x^2]^T [2D, rows]`` (log2 units, the
  constants as the accumulator's start, the x and x^2 terms as two chains: latency), and
* the statistics ``S1^T``, ``S2^T`` ``[K, D] += R^T [K, rows] @ x, x^2 [rows, D]``, whose left
  operand is the responsibilities exactly as the first product left them in registers. Each
  block's products start from zero and are added in fp32 outside the tensor cores, whose own
  accumulation truncates (over a program's thousands of blocks: a 1e-3 bias on an H100).

A warp owns 8 rows at a time and all 16 components (8 < K <= 16, 8 < D <= 16: see
:func:`fusedml.gmm.model.mma_applies`). Tiles are ``[R, CH, RW, WN, G, T]`` with lanes ``4 g + t``,
warps along ``WN`` and each thread's four consecutive registers of one ``(r, wn)`` the 2 x 2
``(CH, RW)`` fragment slots, RW fastest:

* accumulator ``C[m = g + 8 ch][n = 2 t + rw]``: logits / responsibilities of component ``g + 8 ch``
  for row ``2 t + rw`` of the warp's 8 (the statistics: output ``n = 2 t + rw``);
* left operand ``A[m = g + 8 ch][k = t + 4 rw]``; right operand ``B[k = t + 4 rw][n = g]``.

The logits' reduction index k is the feature ``4 t + 2 s + rw`` (k-step s of x, then of x^2), so a
thread's 4 loaded features of row g are its right-operand slots. The statistics' k is the row
``2 t + rw`` (the permutation that lets the responsibilities, an accumulator, be the left operand
in place); their right operand, rows ``2 t + rw`` and feature ``4 (g % 4) + 2 j + g // 4`` (output
tile j), comes from the lanes holding it by two shuffles and a select per value. The softmax over
components is in-thread (CH) then across the 8 lanes of a row (G): three shuffle levels.

``tl.inline_asm_elementwise`` leaves the register order of its packs unspecified and Triton gives
the op one of its operands' layouts. So every operand comes from unit-stride ``[rows, 16]`` tiles (X,
and the operand tiles each program first writes to its own scratch row, :func:`_operand_tiles`,
then reads back), which Triton 3.6 and 3.9 lay out alike (gathered loads gave other layouts: lanes
on WN on 3.6, two features per thread on 3.9, the weights' layout on both), and
:func:`layouts_ok` checks each compiled launch's TTGIR before its first use (the launch falls back
to the register form otherwise; the sm_90 compile test asserts it too). Row weights and per-row
log-likelihoods are loaded / stored in the accumulator slots' layout (rows ``2 t + rw``); the
compiled layouts stay the fragments' (checked the same way). Under
``TRITON_INTERPRET=1`` the mma and the shuffles are emulated with the same fragment semantics (fp32
products), so the operand plumbing is tested on the CPU.
"""
from __future__ import annotations

import re

import triton
import triton.language as tl

from .._launch import interpret_mode
from ..mmchain.dense import _vec_rows
from .fused import _log_normaliser

_EMULATE = tl.constexpr(interpret_mode())

#: three tf32 mma per product, small terms first; the temporaries keep the outputs from
#: aliasing inputs that later instructions read
_MMA3 = tl.constexpr("""
{
.reg .f32 t<4>;
mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {t0, t1, t2, t3}, {$12, $14, $13, $15}, {$16, $17}, {$4, $5, $6, $7};
mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {t0, t1, t2, t3}, {$8, $10, $9, $11}, {$20, $21}, {t0, t1, t2, t3};
mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {$0, $1, $2, $3}, {$8, $10, $9, $11}, {$16, $17}, {t0, t1, t2, t3};
}
""")


@triton.jit
def _tf32_split(x):
    """``(hi, lo)``: x truncated to tf32 (10 mantissa bits, as fp32 bits) and the exact rest
    (``|lo| < 2^-10 |x|``, which the tensor core truncates in turn: ~2^-21 relative)."""
    hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _mma3(c, a_hi, a_lo, b_hi, b_lo, R: tl.constexpr, WN: tl.constexpr):
    """``c + A @ B`` per (r, wn) warp tile (m16n8k8, 3xTF32). c, a_*: ``[R, 2, 2, WN, 8, 4]``
    (accumulator / left-operand slots), b_*: ``[R, 1, 2, WN, 8, 4]`` (right-operand slots)."""
    if _EMULATE:
        a = tl.broadcast_to(a_hi + a_lo, c.shape)
        b = tl.broadcast_to(b_hi + b_lo, (R, 1, 2, WN, 8, 4))
        A = tl.reshape(tl.permute(a, (0, 3, 1, 4, 2, 5)), (R, WN, 16, 8))  # [., m = 8 ch + g, k = 4 rw + t]
        B = tl.reshape(tl.permute(b, (0, 3, 1, 2, 5, 4)), (R, WN, 8, 8))  # [., k = 4 rw + t, n = g]
        p = tl.sum(A[:, :, :, :, None] * B[:, :, None, :, :], axis=3)  # [R, WN, m, n]
        p = tl.permute(tl.reshape(p, (R, WN, 2, 8, 4, 2)), (0, 2, 5, 1, 3, 4))  # n = 2 t + rw
        return c + p
    else:
        bh = tl.broadcast_to(b_hi.to(tl.int32, bitcast=True), c.shape)
        bl = tl.broadcast_to(b_lo.to(tl.int32, bitcast=True), c.shape)
        return tl.inline_asm_elementwise(
            _MMA3, "=f,=f,=f,=f,f,f,f,f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
            [c, a_hi.to(tl.int32, bitcast=True), a_lo.to(tl.int32, bitcast=True), bh, bl],
            dtype=tl.float32, is_pure=True, pack=4)


_SHFL2 = tl.constexpr("""
{
.reg .b32 a, b;
.reg .pred p;
shfl.sync.idx.b32 a, $1, $3, 31, -1;
shfl.sync.idx.b32 b, $2, $3, 31, -1;
setp.ne.s32 p, $4, 0;
selp.b32 $0, b, a, p;
}
""")


@triton.jit
def _shfl2(va, vb, src, sel, R: tl.constexpr, WN: tl.constexpr):
    """Per warp tile ``[R, WN, 8, 4]`` (lane ``4 g + t``): ``(vb if sel else va)`` of lane ``src``
    (``src``, ``sel``: int32 ``[1, 1, 8, 4]``): two shuffles and a select."""
    if _EMULATE:
        lane = tl.arange(0, 8)[:, None] * 4 + tl.arange(0, 4)[None, :]  # [8, 4] source lanes
        hit = (lane[None, None, :, :] == tl.reshape(src, (8, 4))[:, :, None, None]).to(tl.float32)  # [8, 4, 8, 4]
        v = tl.where(sel != 0, 1.0, 0.0)[:, :, :, :, None, None]
        va6 = va[:, :, None, None, :, :]
        vb6 = vb[:, :, None, None, :, :]
        pick = va6 * (1.0 - v) + vb6 * v  # [R, WN, 8, 4, 8, 4]: destination, then source
        return tl.sum(tl.sum(pick * hit[None, None, :, :, :, :], axis=5), axis=4)
    else:
        zi = tl.zeros(va.shape, dtype=tl.int32)
        return tl.inline_asm_elementwise(
            _SHFL2, "=r,r,r,r,r", [va.to(tl.int32, bitcast=True), vb.to(tl.int32, bitcast=True), src + zi, sel + zi],
            dtype=tl.int32, is_pure=True, pack=1).to(tl.float32, bitcast=True)


@triton.jit
def _frag(t2, R: tl.constexpr, WN: tl.constexpr):
    """A ``[8 R WN, 16]`` tile whose thread ``(g, t)`` holds columns ``4 t + 2 a + b`` of row
    ``(r, wn, g)`` as fragment slots ``[R, a, b, WN, G, T]`` (a = CH, b = RW)."""
    return tl.permute(tl.reshape(t2, (R, WN, 8, 4, 2, 2)), (0, 4, 5, 1, 2, 3))


@triton.jit
def _pair(v0, v1):
    """``[R, WN, 8, 4]`` x 2 -> right-operand slots ``[R, 1, RW, WN, 8, 4]``."""
    return tl.permute(tl.join(v0, v1), (0, 4, 1, 2, 3))[:, None, :, :, :, :]


#: fp32 words of one program's operand tiles: GF [16], WF [4, 2, 8, 16], CF [8, 16]
TILE_WORDS = tl.constexpr(16 + 1024 + 128)


@triton.jit
def _diag_mma_kernel(
    X, stride_xn,  # [N, D] fp32, unit feature stride
    G, W1, W2, CONST,  # [D], [D, K], [D, K], [K] fp32: the diag operands (fusedml.gmm.fused._operands)
    SCR,  # [P, TILE_WORDS] fp32 scratch: each program's operand tiles (:func:`_operand_tiles`)
    PNK, PS1, PS2, PLL,  # [P, K], [P, K, D], [P, K, D] fp32 partials, [P] float64
    N, D, K, n_blocks,
    SW, LOGP,  # [N] fp32 row weights in / per-row log-likelihoods out (HAS_SW / WRITE_LOGP; else unused)
    WN: tl.constexpr, OFF32: tl.constexpr = False, R: tl.constexpr = 1,
    HAS_SW: tl.constexpr = False, WRITE_LOGP: tl.constexpr = False, VEC: tl.constexpr = 1,
):
    """Single sweep, both products on the tensor cores (module docstring); row blocks of
    ``8 R WN`` rows, R 8-row groups per warp. ``VEC`` as the dense mmchain kernels'
    (:func:`fusedml.mmchain.dense._vec`): > 1, row starts and D multiples of it; < -1, row starts
    multiples of ``-VEC`` and every row readable up to D rounded up to it (an aligned view of
    padded rows: whole vectors loaded, the padding zeroed after the load)."""
    BN: tl.constexpr = 8 * R * WN
    stride_xn, DL = _vec_rows(stride_xn, D, VEC)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # the operand tiles, written and read back by this program: loaded with unit-stride rows, they
    # take the data tile's layout (gathered here, the weights gave the mma ops their own)
    GF = SCR + pid * TILE_WORDS
    WF = GF + 16
    CF = GF + 1040
    _operand_tiles(G, W1, W2, CONST, GF, WF, CF, D, K)
    tl.debug_barrier()  # the program's stores before its loads (bar.sync orders global memory in the CTA)
    # every operand of the mma comes from [BN, 16] / [BN, 8] tiles of one layout (a unit-stride
    # last axis: Triton gives thread 4 g + t of warp wn the row (r, wn, g), 4 t .. 4 t + 3)
    rows2 = tl.arange(0, BN)[:, None]
    cols = tl.arange(0, 16)[None, :]
    g16 = tl.load(GF + cols + 0 * rows2, cache_modifier=".cg")  # [BN, 16]
    wrow = (rows2 % 8) * 16 + cols
    w0h = _frag(tl.load(WF + 0 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w0l = _frag(tl.load(WF + 1 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w1h = _frag(tl.load(WF + 2 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w1l = _frag(tl.load(WF + 3 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w2h = _frag(tl.load(WF + 4 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w2l = _frag(tl.load(WF + 5 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w3h = _frag(tl.load(WF + 6 * 128 + wrow, cache_modifier=".cg"), R, WN)
    w3l = _frag(tl.load(WF + 7 * 128 + wrow, cache_modifier=".cg"), R, WN)
    cst = _frag(tl.load(CF + wrow, cache_modifier=".cg"), R, WN)  # [R, 2, 2, WN, 8, 4]
    zero = tl.zeros_like(cst)
    # fragment coordinates
    rw = tl.arange(0, 2)[None, None, :, None, None, None]
    wn = tl.arange(0, WN)[None, None, None, :, None, None]
    t = tl.arange(0, 4)[None, None, None, None, None, :]
    r_ = tl.arange(0, R)[:, None, None, None, None, None]
    srow = (r_ * WN + wn) * 8 + 2 * t + rw  # [R, 1, 2, WN, 1, 4] the accumulator slots' rows
    # the statistics' right operand: thread (g, t) takes x[row 2 t + rw][feature 4 (g % 4) + 2 j + g // 4]
    # from lane 4 (2 t + rw) + g % 4, registers 2 j + (0, 1)
    g4 = tl.arange(0, 8)[:, None]
    t4 = tl.arange(0, 4)[None, :]
    src0 = (4 * (2 * t4) + g4 % 4)[None, None, :, :]  # [1, 1, 8, 4]
    src1 = src0 + 4
    sel = (g4 // 4 + 0 * t4)[None, None, :, :]
    acc_s10 = tl.zeros_like(cst)
    acc_s11 = tl.zeros_like(cst)
    acc_s20 = tl.zeros_like(cst)
    acc_s21 = tl.zeros_like(cst)
    acc_nk = tl.zeros_like(cst)
    acc_ll = tl.zeros((R, 1, 2, WN, 1, 4), dtype=tl.float32)
    for blk in range(pid, n_blocks, nprog):
        row0 = blk * BN
        xr = row0 + rows2
        if OFF32:
            xo = xr * stride_xn
        else:
            xo = xr.to(tl.int64) * stride_xn
        # rows past N hold -g: finite, their responsibilities and normaliser masked below
        x = tl.load(X + xo + cols, mask=(xr < N) & (cols < DL), other=0.0)  # [BN, 16]
        if VEC < -1:
            x = tl.where(cols < D, x, 0.0)
        z2 = x - g16
        # (r, wn, g, t, a, b) -> feature 4 t + 2 a + b; k-step a of the logits takes slot b
        z6 = tl.reshape(z2, (R, WN, 8, 4, 2, 2))
        za, zb = tl.split(z6)  # b = 0 / 1: [R, WN, 8, 4, 2 (a)]
        z00, z10 = tl.split(za)  # registers (a, b) = (0, 0), (1, 0)
        z01, z11 = tl.split(zb)
        z0 = _pair(z00, z01)  # k-step 0: features 4 t + rw
        z1 = _pair(z10, z11)  # k-step 1: features 4 t + 2 + rw
        z0h, z0l = _tf32_split(z0)
        z1h, z1l = _tf32_split(z1)
        q0h, q0l = _tf32_split(z0 * z0)
        q1h, q1l = _tf32_split(z1 * z1)
        # two accumulation chains (x, x^2 terms): the mma's latency, not its rate, bounds a chain
        lg1 = _mma3(cst, w0h, w0l, z0h, z0l, R, WN)
        lg1 = _mma3(lg1, w1h, w1l, z1h, z1l, R, WN)
        lg2 = _mma3(zero, w2h, w2l, q0h, q0l, R, WN)
        lg2 = _mma3(lg2, w3h, w3l, q1h, q1l, R, WN)
        lg = lg1 + lg2  # [R, 2, 2, WN, 8, 4] log2 units
        # in-thread (CH) before across lanes (G): one shuffle per level, not two
        m = tl.max(tl.max(lg, axis=1, keep_dims=True), axis=4, keep_dims=True)  # [R, 1, 2, WN, 1, 4]
        e = tl.exp2(lg - m)
        l = tl.sum(tl.sum(e, axis=1, keep_dims=True), axis=4, keep_dims=True)  # in [1, K]
        lse, rl = _log_normaliser(m, l)  # natural log, 1 / l
        rowm = (row0 + srow) < N
        if WRITE_LOGP:
            tl.store(LOGP + row0 + srow, lse, mask=rowm)
        if HAS_SW:  # the row weight scales its log-likelihood and its responsibilities
            sw = tl.load(SW + row0 + srow, mask=rowm, other=0.0)
            acc_ll += tl.where(rowm, lse * sw, 0.0)
            r = tl.where(rowm, e * (rl * sw), 0.0)
        else:
            acc_ll += tl.where(rowm, lse, 0.0)
            r = tl.where(rowm, e * rl, 0.0)
        acc_nk += r
        rh, rlo = _tf32_split(r)
        s0 = _pair(_shfl2(z00, z01, src0, sel, R, WN), _shfl2(z00, z01, src1, sel, R, WN))  # j = 0
        s1 = _pair(_shfl2(z10, z11, src0, sel, R, WN), _shfl2(z10, z11, src1, sel, R, WN))  # j = 1
        x0h, x0l = _tf32_split(s0)
        x1h, x1l = _tf32_split(s1)
        # each block's 8-row products start from zero and are added in fp32 outside the tensor
        # cores: their accumulation truncates, which over a program's thousands of blocks biased
        # the statistics by up to 1e-3 (H100, 16M rows)
        acc_s10 += _mma3(zero, rh, rlo, x0h, x0l, R, WN)
        acc_s11 += _mma3(zero, rh, rlo, x1h, x1l, R, WN)
        y0h, y0l = _tf32_split(s0 * s0)
        y1h, y1l = _tf32_split(s1 * s1)
        acc_s20 += _mma3(zero, rh, rlo, y0h, y0l, R, WN)
        acc_s21 += _mma3(zero, rh, rlo, y1h, y1l, R, WN)
    # statistics slots: component g + 8 ch, output n = 2 t + rw: feature 4 (n % 4) + 2 j + n // 4
    base = pid.to(tl.int64) * K * D
    nk = tl.sum(tl.sum(tl.sum(tl.sum(acc_nk, axis=5), axis=3), axis=2), axis=0)  # [2, 8]: component g + 8 ch
    c2 = tl.arange(0, 2)[:, None] * 8 + tl.arange(0, 8)[None, :]
    tl.store(PNK + pid * K + c2, nk, mask=c2 < K)
    c4 = tl.arange(0, 2)[:, None, None, None] * 8 + tl.arange(0, 8)[None, None, :, None]  # [CH, RW, G, T]
    n4 = 2 * tl.arange(0, 4)[None, None, None, :] + tl.arange(0, 2)[None, :, None, None]
    for j in tl.static_range(2):
        fj = 4 * (n4 % 4) + 2 * j + n4 // 4
        m4 = (c4 < K) & (fj < D)
        a1 = acc_s10 if j == 0 else acc_s11
        a2 = acc_s20 if j == 0 else acc_s21
        tl.store(PS1 + base + c4 * D + fj, tl.sum(tl.sum(a1, axis=3), axis=0), mask=m4)
        tl.store(PS2 + base + c4 * D + fj, tl.sum(tl.sum(a2, axis=3), axis=0), mask=m4)
    tl.store(PLL + pid, tl.sum(tl.reshape(acc_ll, (R * 2 * WN * 4,)).to(tl.float64), axis=0))


@triton.jit
def _operand_tiles(G, W1, W2, CONST, GF, WF, CF, D, K):
    """The sweep's operand tiles from the diag operands (K <= 16, D <= 16): ``GF [16]`` (the shift,
    0 past D), ``WF [4, 2, 8, 16]`` (k-step s, tf32 high / low part, lane row g, column
    ``4 t + 2 ch + rw``: the logits' left-operand slot of component ``g + 8 ch`` and feature
    ``4 t + 2 (s % 2) + rw`` of W1 (s < 2) or W2), ``CF [8, 16]`` (the constants in accumulator
    slots, -inf past K)."""
    offs = tl.arange(0, 1024)
    s = offs // 256
    c = offs % 16
    g = (offs // 16) % 8
    comp = g + 8 * ((c // 2) % 2)
    f = 4 * (c // 4) + 2 * (s % 2) + c % 2
    m = (comp < K) & (f < D)
    w = tl.where(s < 2, tl.load(W1 + f * K + comp, mask=m & (s < 2), other=0.0),
                 tl.load(W2 + f * K + comp, mask=m & (s >= 2), other=0.0))
    hi, lo = _tf32_split(w)
    tl.store(WF + offs, tl.where((offs // 128) % 2 == 0, hi, lo))
    o2 = tl.arange(0, 128)
    k2 = o2 // 16 + 8 * ((o2 % 16 // 2) % 2)
    tl.store(CF + o2, tl.load(CONST + k2, mask=k2 < K, other=float("-inf")))
    o3 = tl.arange(0, 16)
    tl.store(GF + o3, tl.load(G + o3, mask=o3 < D, other=0.0))


def _blocked(attr: str):
    """``(sizePerThread, threadsPerWarp, warpsPerCTA, order)`` of a ``#ttg.blocked<...>`` layout, or None."""
    if not attr.startswith("#ttg.blocked<"):
        return None
    out = []
    for key in ("sizePerThread", "threadsPerWarp", "warpsPerCTA", "order"):
        m = re.search(key + r" = \[([0-9, ]*)\]", attr)
        if m is None:
            return None
        out.append([int(v) for v in m.group(1).split(",")])
    return tuple(out)


def layouts_ok(ttgir: str, num_warps: int) -> bool:
    """Whether every inline-asm op of a compiled :func:`_diag_mma_kernel` has the layout its
    fragments assume (the register order of ``tl.inline_asm_elementwise`` is unspecified, and
    Triton picks the op's layout from its operands').

    The mma ops (rank 6, ``[R, CH, RW, WN, G, T]``) need lanes ``4 g + t``, warps along WN and each
    thread's four consecutive registers of one r in the order ``(ch, rw)``, RW fastest; the
    shuffles (rank 4, ``[R, WN, G, T]``) need the same lanes and warps.

    Parameters
    ----------
    ttgir : str
        The compiled kernel's ``asm["ttgir"]``.
    num_warps : int

    Returns
    -------
    bool
    """
    layouts = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, re.M))
    used = re.findall(r"tt\.elementwise_inline_asm .*?-> tensor<([0-9x]+)x[if]32, (#\w+)>", ttgir)
    if len(used) != 12:  # 8 mma (two chains of 2, four statistics) and 4 shuffles per block
        return False
    for shape, name in used:
        b = _blocked(layouts.get(name, ""))
        if b is None:
            return False
        spt, tpw, wpc, order = b
        rank = len(shape.split("x"))
        if rank == 6:
            pos = order.index
            ok = (tpw == [1, 1, 1, 1, 8, 4] and wpc == [1, 1, 1, num_warps, 1, 1] and pos(5) < pos(4)
                  and spt[3:] == [1, 1, 1] and pos(2) < pos(1)
                  and (spt[1:3] == [2, 2] or (spt[:3] == [1, 1, 1] and pos(1) < pos(0))))
        elif rank == 4:
            ok = (tpw == [1, 1, 8, 4] and wpc == [1, num_warps, 1, 1] and order.index(3) < order.index(2)
                  and spt[1:] == [1, 1, 1])
        else:
            ok = False
        if not ok:
            return False
    return True
