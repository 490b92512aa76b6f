"""Applicability and launch model of the fused GMM E-step: which path, which block sizes.

One documented function, :func:`plan_launch`. The model (calibrated on sm_90 ahead-of-time
compiles: ``metadata.shared``, register count and spill bytes; tests/test_gmm.py re-checks the
choices for the target shapes):

* Tiles are powers of two, at least 16 on every ``tl.dot`` dimension: ``BD = max(16, 2^ceil(log2 D))``,
  ``BK = max(16, 2^ceil(log2 K))`` (single sweep: the whole K axis; two-pass: ``BK_tile``).
* **Shared memory** of the diag kernels (bytes, fp32 operands, ``S`` = ``num_stages``):
  ``4 ((S-1) BN BD`` (software-pipelined X tiles) ``+ 2 BN BD`` (x, x^2 as dot operands)
  ``+ BN BK`` (r^T) ``+ 2 BD BK)`` (the weight tiles) ``+ 8 BK W`` (reduction scratch); pass 1
  (online LSE over K tiles) holds ``4 (2 BN BD + 2 max(1, S-1) BD BK)``. Tensor-core precisions
  (tf32x3, tf32, bf16) stage their operands in swizzled layouts: counted twice, plus the split
  x, x^2 operands ``8 BN BD``; their single sweep also needs ``BD <= 64``. A configuration
  applies only when this is at most the per-block limit (232448 B on an H100/H200).
* **Registers**: live fp32 values per thread of a ``W``-warp program, ``T = 32 W``:
  ``E = (2 BK BD`` (statistics accumulators) ``+ BN (2 BD + 3 BK))`` (x, x^2, logits /
  exponentials / responsibilities) ``/ T``; pass 1 adds ``2 BD BK / T`` (its weight tile). The
  estimate ``regs = 32 + 2 E`` (fp32 FMA products) or ``64 + 3 E`` / ``56 + 2 E`` at 4 / 8 warps
  (tensor-core products, whose split operands and fragments cost more) must stay <= 240 (fp32) /
  255 (tensor cores) of the 255 a thread may hold, so nothing spills. Programs per SM = ``min(4, 65536 // (T regs), smem_SM // smem)``; the
  persistent grid is ``SMs x programs-per-SM`` (never more than the row blocks).
* full single sweep (fp32): ``K <= 64`` (the per-component column insert/extract costs
  ``O(BN K^2)``), ``BD <= 32``, tiles measured on the H200 (:func:`_full_single_tiles`; where a
  compiler spills in them, the GPU's first launch takes a spill-free fallback, ``Plan.fallback``); tensor-core
  precisions keep the session-1 estimate ``E = BN BK + 2 BD^2 + 4 BN BD`` under ``32 W x 160``.
  Full / tied two-pass tiles: :func:`_full_two_pass_tile`. Tied (its own kernel since
  session 26: one transform per row, statistics about each row's own centre):
  ``E = BD^2 + BK BD + BK^2 + 6 BN (BD + BK)`` under ``32 W x 100`` (:data:`TIED_VALUES`), BN up to 64
  (fp32), ``K <= 64``, but where an H200 sweep timed a faster tile (:func:`_tied_single_tile`).
* **Single sweep** when a (BN, W) candidate fits both budgets, tried in the order BN = 128, 64, 32,
  16, W = 4 then 8 for each (fp32 diag tiles of ``BD x BK <= 4096`` try a measured small program
  first, see session 19 below). Larger row blocks amortise the per-block work that does not scale with
  rows (weight-operand reads from shared memory, layout conversions, barriers): sm_90 PTX of the
  K = D = 16 sweep has 2461 instructions and 338 shared loads per row at BN = 128, W = 4 against 2982
  and 402 at BN = 64 (the session-1 pick, 0.64 ms on the H200), with 1072 vs 1120 FMAs per row (1024
  useful). Otherwise the **two-pass** path: the largest ``BK_tile`` in (64, 32, 16), then
  BN in (64, 32, 16) and W in (4, 8) whose pass-1 and pass-2 estimates fit; pass 2 runs
  ``(row chunk, component tile)`` programs, chunk sizes chosen for ~8 programs per SM so that the
  tiles of one chunk run together and re-read X from L2 rather than HBM.
* Software pipelining: ``num_stages = 2`` (one X tile in flight while the current one is used).
* **Measured corrections** (H200, session 6, ``benchmarks/results/gmm_sweep-H200-2026-12-03-s6*``;
  an ``ncu`` profile showed the single sweep at 4-8 warps per SM, 6-12 % achieved occupancy, with
  80-90 registers where the estimate said 140-200):

  - the single-sweep diag grid is sized from the COMPILED kernel (``occupancy_grid``,
    :func:`fusedml.gmm.fused.resident_programs`: registers, shared memory, warps), not from the
    estimate: 4M x 16, K = 16 bf16 0.56 -> 0.32 ms, fp32 0.68 -> 0.64;
  - ``D <= 8``: ``BD = 8`` with the interleaved ``[x, x^2]`` operand (``form="cat"``, 16 wide: no
    padded features) and the next block prefetched: 16M x 8, K = 8 fp32 3.30 -> 1.55 ms (bf16 2.81 -> 1.01);
  - bf16 pass 1 keeps x on chip (``DC = BD`` up to 128) in 64-row blocks: 1M x 128,
    K = 1024 bf16 24.2 -> 17.6 ms (32-row blocks 19.9), although this kernel spills (~0.8 KB of stack
    on sm_90): the spill-free chunked form re-reads x per chunk and loses.

  The compiled-resource grid was also measured for the full/tied single sweep and is not used
  there (``results/gmm_fulltied_occupancy-H200-2026-12-03-s6-e.json``): 1M x 32, K = 64 full
  13.7 -> 25.7 ms, 4M x 8, K = 8 full 3.97 -> 3.72, others within 1 %.

* **Session 19** (H200, ``results/gmm*-H200-2026-12-04-s19-*``):

  - the **register form** (``form="reg"``, fp32 diag/spherical single sweep, :func:`reg_tile`):
    where at most 8 threads share a row (padded ``K x D <= 256``), each thread holds one row's
    features and ``KI`` components' weights and statistics in registers: 4M x 16, K = 16
    0.639 -> 0.505 ms, 16M x 8, K = 8 1.55 -> 0.542, 4M x 32, K = 8 spherical 1.14 -> 0.56,
    1M x 2, K = 128 1.14 -> 0.25-0.48. With 16 or 32 threads per row it lost to ``tl.dot``
    (16M x 32, K = 32: 7.9 against 4.3-4.9 ms): not used there. Its row blocks are 1-2 KB, so
    blocks are loaded ahead (without: 0.77 / 0.82 ms at 4M x 16 / 4M x 32, K = 8 spherical);
  - ``tl.dot`` tiles with ``BD x BK <= 4096`` run as small programs (the occupancy grid then
    holds many of them): 32 rows x 2 warps up to 512, 32 x 4 up to 1024, 16 x 4 up to 4096
    (16M x 32, K = 32 6.7 -> 4.9 ms; 4M x 16, K = 64 1.69 -> 1.27; 1M x 64, K = 64 1.31 -> 1.12).

* **Session 23** (H200, ``results/gmm*-H200-2026-12-04-s23-*``): the register form is latency-bound
  (2.35 of 4 instructions issued per cycle at 8 warps per SM: shuffles, MUFU and FMA chains), so
  its launch holds one more program per SM where the compiled kernel allows it
  (``Plan.maxnreg = 0``: :func:`fusedml.gmm.fused.register_cap` picks Triton's ``maxnreg`` at the
  first launch): 4M x 16, K = 16 0.457 -> 0.378 ms, 16M x 8, K = 8 spherical 0.408 -> 0.304.

* **Session 32** (H100, ``results/gmm*-H100-2026-12-05-s32*``): ``precision="tf32x3"`` at
  8 < K, D <= 16 (diag, fp32 X) plans the tensor-core form (``form="mma"``, :mod:`fusedml.gmm.mma`:
  8-row groups on 4-warp programs, the grid from the compiled kernel, 5 per SM at 96 registers):
  4M x 16, K = 16 0.272 ms against the register form's 0.400. :func:`auto_precision` picks it
  from :data:`MMA_MIN_ROWS` rows.
* **Session 33** (H200, ``results/gmm*-H200-2026-12-05-s33*``): the form's operand tiles written by
  the sweep itself (two launches per E-step): 4M x 16, K = 16 0.271 ms, 1M x 16 0.097 (register form
  0.123); :data:`MMA_MIN_ROWS` lowered from 2M to 0.5M rows.

``path`` forces a path (a forced single sweep on a shape the model rejects still runs if it
compiles; the launch wrapper falls back to the two-pass path when it does not). The GPU's SM
count comes from :func:`gpu_info`. :func:`auto_precision` is the documented rule behind
``precision="auto"``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

_DATA_REGS = 160
_REGS_PER_SM = 65536


def _pow2(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def gpu_info(device) -> dict:
    """The GPU description the plan uses.

    Parameters
    ----------
    device : torch.device or str

    Returns
    -------
    dict
        ``{"name", "sm_count", "regs_per_sm", "smem_per_sm"}``: a CUDA device's properties (from
        :func:`fusedml.mmchain.launch.gpu_info`), or a small stand-in for the interpreter on the
        host (at most 4 "SMs", so persistent grids stay small there).
    """
    device = torch.device(device)
    if device.type == "cuda":
        from ..mmchain.launch import gpu_info as _launch_gpu_info

        g = _launch_gpu_info(device)
        return {"name": g.name, "sm_count": g.sm_count, "regs_per_sm": g.regs_per_sm, "smem_per_sm": g.smem_per_sm}
    return {"name": "cpu-interpreter", "sm_count": max(1, min(4, os.cpu_count() or 1)), "regs_per_sm": _REGS_PER_SM,
            "smem_per_sm": 228 * 1024}


@dataclass(frozen=True)
class Plan:
    """Launch plan of the fused E-step.

    Attributes
    ----------
    path : str
        ``"single"`` or ``"two_pass"``.
    BN, BD, BK : int
        Rows per block, padded features, padded components (single sweep: the whole K axis).
    BK_tile : int
        Component tile of the two-pass diag kernels.
    num_warps : int
    programs : int
        Persistent programs of the single sweep.
    lse_programs : int
        Persistent programs of pass 1 / scoring.
    chunk_rows : int
        Rows per program of pass 2.
    single_fits : bool
        Whether the model judged the single sweep to fit on chip.
    regs_est : int
        Estimated registers per thread of the chosen path's main kernel.
    num_stages : int
        Software-pipelining depth passed to the launches.
    form : str
        Single-sweep diag product form: ``"mma"`` (``precision="tf32x3"``, 8 < K, D <= 16: both
        products as 3xTF32 tensor-core instructions on register fragments, :func:`mma_applies`),
        ``"reg"`` (register FMAs, small K x D: :func:`reg_tile`),
        ``"dot"`` (four ``tl.dot`` per block), ``"cat"`` (one interleaved ``[x, x^2]`` operand: two
        ``tl.dot`` per block) or ``"bcast"`` (broadcast multiply and in-register sums over a
        ``[BN, BD, BK]`` tile; fp32 only, a benchmark sweep variant).
    smem_est : int
        Estimated shared memory per program (bytes) of the chosen path's largest kernel.
    DC : int
        Feature chunk of pass 1 (``BD``: x stays on chip across the component loop; smaller: x is
        re-read per chunk, for tensor-core precisions at large D).
    lse_BN, lse_BK, lse_warps : int
        Row block, component tile and warps of pass 1 / scoring (0: pass 2's values).
    precision : str
        The operand precision planned for: the one asked for, or "fp32" when no tensor-core
        configuration fits (e.g. D = 256: its split operands spill at every block size).
    prefetch : int
        Single sweep (diag): row blocks loaded ahead of this block's products (software pipelining
        by hand; the ``tl.dot`` forms 0 or 1, the register form 0-2).
    occupancy_grid : bool
        Single sweep (diag): size the persistent grid from the compiled kernel's registers and
        shared memory (:func:`fusedml.gmm.fused.resident_programs`) instead of ``programs``.
    reg : tuple
        ``form="mma"``: ``(R,)``, 8-row groups per warp and block; ``form="reg"``: ``(BD, KI, KO)``
        of its tiles (:func:`reg_tile`: padded features, components per thread, component groups
        across threads; ``BN`` is its row block); ``()`` otherwise.
        ``BD`` and ``BK`` above stay the ``tl.dot`` tiles of pass 1 (scoring, fallbacks).
    sph : bool
        ``form="reg"``, spherical: the quadratic term and the second moment per row and component
        (``p_k |x|^2``, ``sum r |x|^2``) instead of per feature, which halves the thread's values
        (``reg_tile(..., values=2 * REG_VALUES)``).
    maxnreg : int
        ``form="reg"``: registers per thread the compiler is held to (Triton's ``maxnreg``). 0: decided
        at the first launch from the compiled kernel (:func:`fusedml.gmm.fused.register_cap`: one
        more program per SM where the capped compile spills at most a few words); -1: the
        compiler's own count;
        > 0: that cap (the benchmark's sweep).
    fallback : tuple
        Full single sweep: ``(BN, num_warps, num_stages, programs per SM)`` tiles to take, in order,
        where the compiled kernel at this plan's tile spills (:func:`fusedml.gmm.fused.fitted_plan`:
        Triton 3.9 holds about twice the registers per row of 3.6-3.8); ``()`` otherwise.
    """

    path: str
    BN: int
    BD: int
    BK: int
    BK_tile: int
    num_warps: int
    programs: int
    lse_programs: int
    chunk_rows: int
    single_fits: bool
    regs_est: int
    num_stages: int = 2
    form: str = "dot"
    smem_est: int = 0
    DC: int = 0
    lse_BN: int = 0
    lse_BK: int = 0
    lse_warps: int = 0
    precision: str = ""
    prefetch: int = 0
    occupancy_grid: bool = False
    reg: tuple = ()
    sph: bool = False
    maxnreg: int = 0
    fallback: tuple = ()

    def __post_init__(self):
        # pass 1 defaults: the whole feature axis on chip, pass 2's blocks
        for f, v in (("DC", self.BD), ("lse_BN", self.BN), ("lse_BK", self.BK_tile), ("lse_warps", self.num_warps)):
            if getattr(self, f) == 0:
                object.__setattr__(self, f, v)


MAX_SHARED_PER_BLOCK = 232448  # H100/H200 opt-in limit per block (bytes)
_MAX_REGS = 240


def auto_precision(N: int, K: int, D: int, covariance_type: str, device, dtype=torch.float32) -> str:
    """The operand precision ``precision="auto"`` resolves to (documented, measured rule).

    Measured on the H200 (2026-12-02, ms per E-step, fp32 vs tf32x3). Session-1 plans: 4M x 16,
    K=16: 0.64 vs 1.03; 16M x 8, K=8: 3.29 vs 5.33; 1M x 64, K=64: 1.35 vs 2.39; 16M x 32, K=32:
    6.82 vs 6.63; 4M x 64, K=128: 9.33 vs 7.84; 1M x 32, K=256 (two-pass): 4.13 vs 2.85. With the
    spill-free plans of session 2 (18:25 run): 1M x 32, K=256 tf32x3 4.73; 1M x 128, K=1024 tf32x3
    76.8 ms with relative errors 2.2e-4 on N_k and S1 (fp32: 67 ms, 2.8e-6). tf32x3 never won by
    more than 1.5x, lost on most shapes, and at K=1024 broke the 1e-4 accuracy bar, so ``"auto"``
    is fp32 there; tf32x3 / tf32 / bf16 remain explicit, documented trades.

    Session 32: for diag covariance at 8 < K, D <= 16 on fp32 data, tf32x3 runs the tensor-core
    register-fragment form (:func:`mma_applies`, :mod:`fusedml.gmm.mma`): 4M x 16, K = 16 0.272 ms
    against fp32's 0.400, 16M x 16 0.97 against 1.50 (H100), errors <= 1.9e-6 against float64, so
    ``"auto"`` is tf32x3 there from :data:`MMA_MIN_ROWS` rows (on GPUs with tf32 tensor cores,
    compute capability 8.0 and up; ``FUSEDML_GMM_MMA=0`` keeps fp32). Session 33 moved the rule
    from 2M rows down to 0.5M (the form's operand tiles written by the sweep itself).

    Parameters
    ----------
    N, K, D : int
        Rows, components, features.
    covariance_type : str
    device : torch.device or str
    dtype : torch.dtype
        Storage dtype of X (the tensor-core form takes fp32).

    Returns
    -------
    str
        ``"tf32x3"`` where the rule above applies, else ``"fp32"``.
    """
    device = torch.device(device)
    if (device.type == "cuda" and covariance_type == "diag" and dtype == torch.float32 and N >= MMA_MIN_ROWS
            and mma_applies(K, D) and _tf32_cores(device) and os.environ.get("FUSEDML_GMM_MMA", "1") != "0"):
        return "tf32x3"
    return "fp32"


#: rows from which ``"auto"`` takes the tensor-core form (K = 16, D = 16, H100, session 33, with the
#: operand tiles written by the sweep itself: two launches, as the register form): 0.5M rows 0.068
#: against 0.117 ms, 1M 0.115 against 0.123, 2M 0.157 against 0.216; interleaved GaussianMixture fits
#: at 1M and 2M rows equal within 3 % (host-bound). Session 32's three launches had lost at 1M rows.
MMA_MIN_ROWS = 1 << 19


@functools.lru_cache(maxsize=None)
def _tf32_cores(device) -> bool:
    """Whether the CUDA device has tf32 tensor cores (sm_80+; True for a device name without a GPU)."""
    if not torch.cuda.is_available():
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def mma_applies(K: int, D: int) -> bool:
    """Whether the tensor-core diag single sweep (``form="mma"``, :mod:`fusedml.gmm.mma`) takes K
    components of D features: both at most 16 (one m16n8k8 tile of components, 16 features), and
    more than 8 of each, where it was timed faster than the register form (H100, session 32:
    4M x 16, K = 16 0.26 against 0.40 ms; K = 8 equal, D = 8 half the speed on padded features)."""
    return 8 < K <= 16 and 8 < D <= 16


REG_VALUES = 32  # BD * KI of the register form: 2 x 32 weights and 2 x 32 statistics per thread
REG_MAX_KO = 8  # threads sharing a row (component groups): more lost to tl.dot (session 19)


def reg_prefetch(BN: int, BD: int) -> int:
    """Row blocks the register form loads ahead: about 2 KB in flight per program (a 1 KB
    ``BN x BD`` fp32 block one ahead, smaller ones two; session 19's probe)."""
    return 1 if 4 * BN * BD >= 1024 else 2


def reg_values(covariance_type: str) -> int:
    """``BD * KI`` budget of the register form for ``covariance_type``: diag holds four values per
    feature and component (two weights, two statistics), spherical two (its quadratic term and
    second moment are per row and component, :attr:`Plan.sph`)."""
    return 2 * REG_VALUES if covariance_type == "spherical" else REG_VALUES


def reg_tile(D: int, K: int, *, ki: int | None = None, rows_per_thread: int | None = None, num_warps: int = 4,
             values: int = REG_VALUES):
    """Tile of the register-FMA single sweep (``form="reg"``), or None where it does not apply.

    The kernel (:func:`fusedml.gmm.fused._diag_reg_kernel`) holds, per thread, one row's
    features and ``KI`` components' weights and statistics (``2 BD KI`` values each) for the
    whole row stream, so ``BD * KI <= REG_VALUES`` (32: 180-250 registers on sm_90, no spills);
    the ``KO = BK / KI`` component groups lie across the threads of a warp, at most
    ``REG_MAX_KO = 8`` of them (each repeats the row's load, ``x^2`` and softmax; with 16-32 the
    form lost to ``tl.dot`` on the H200), so the rule applies to padded ``K x D <= 256``.
    ``KI = min(BK, 32 / BD)`` (most work per thread for its copy of the row); one row per thread
    (two measured slower: ~255 registers, one program per SM). The overrides reach ``KO = 32``.

    Parameters
    ----------
    D, K : int
        Features, components.
    ki, rows_per_thread : int, optional
        Overrides (the benchmark's probe).
    num_warps : int
    values : int
        ``BD * KI`` budget (:func:`reg_values`). Above ``REG_VALUES`` (spherical) ``KI`` grows to at
        most 8 (never below the diag rule's); features stay at most ``REG_VALUES`` (the row and its
        prefetched blocks are held per thread too). sm_90 compiles (Triton 3.9): 232-239 registers
        without spills at D = 16, K = 16 (KI = 4) and D = 32, K = 8 (KI = 2); KI = 32 at D = 2 spilled.

    Returns
    -------
    tuple or None
        ``(BD, BK, KI, BN, num_warps)``.
    """
    BD, BK = _pow2(D, 1), _pow2(K, 1)
    KI = min(BK, max(1, REG_VALUES // BD))
    if values > REG_VALUES:  # more components per thread, at most 8 (each has ~6 per-row values too)
        KI = min(BK, max(KI, min(values // BD, 8)))
    KI = ki if ki is not None else KI
    if BD > REG_VALUES or BD * KI > values or BK % KI or BK // KI > (32 if ki is not None else REG_MAX_KO):
        return None
    rpt = rows_per_thread if rows_per_thread is not None else 1
    return BD, BK, KI, 32 * num_warps * rpt // (BK // KI), num_warps


def smem_estimate(kind: str, BN: int, BD: int, BK: int, num_warps: int, num_stages: int, precision: str) -> int:
    """Shared memory (bytes) of one program of the diag kernels (see the module docstring).

    Parameters
    ----------
    kind : {"single", "stats", "lse"}
        Single sweep, pass 2, pass 1.
    BN, BD, BK : int
        Row block, padded features, component tile.
    num_warps, num_stages : int
    precision : str
        "fp32" (FMA products) or a tensor-core precision.

    Returns
    -------
    int
    """
    if kind == "lse":
        b = 4 * (2 * BN * BD + 2 * max(1, num_stages - 1) * BD * BK)
    else:
        b = 4 * ((num_stages - 1) * BN * BD + 2 * BN * BD + BN * BK + 2 * BD * BK) + 8 * BK * num_warps
    if precision == "fp32":
        return b
    return 2 * b + (8 * BN * BD if kind != "lse" else 0)  # + the split (hi, lo) x and x^2 operands


def regs_estimate(kind: str, BN: int, BD: int, BK: int, num_warps: int, precision: str) -> int:
    """Registers per thread of the diag kernels (see the module docstring); > 240 means spills.

    Parameters
    ----------
    kind : {"single", "stats", "lse"}
    BN, BD, BK, num_warps : int
    precision : str

    Returns
    -------
    int
    """
    T = 32 * num_warps
    E = BN * (2 * BD + 3 * BK) + (2 * BD * BK)  # lse: its weight tile; single/stats: accumulators
    E = -(-E // T)
    if precision == "fp32":
        return 32 + 2 * E
    if kind == "single":
        return 64 + 3 * E if num_warps <= 4 else 56 + 2 * E
    return 64 + 4 * E if num_warps <= 4 else 56 + 3 * E


def full_bd(D: int) -> int:
    """Feature tile of the full / tied kernels (every plan's ``BD``): the operands they load per
    component (means, centres, precision factors) are zero-padded to it on the host."""
    return _pow2(D)


def _single_elems(ct: str, BN: int, BD: int, BK: int) -> int:
    if ct in ("diag", "spherical"):
        return 4 * BK * BD + BN * (2 * BD + 3 * BK)
    return BN * BK + 2 * BD * BD + 4 * BN * BD


#: fp32 values per thread the tied single sweep may hold (:func:`_tied_elems`), from sm_90 compiles
#: (Triton 3.6) of 10 shapes (D x K from 16 x 16 to 64 x 64) x 6-9 tiles (BN 16-128, 4 / 8 warps):
#: no tile at or under it spilled inside a loop but 64 x 16 at BN = 32, 8 warps (32 B, 2 local
#: accesses per block); above it most spilled (the rule gives up a few clean tiles)
TIED_VALUES = 100


def _tied_elems(BN: int, BD: int, BK: int) -> int:
    """Live fp32 values of a tied single-sweep program: the [BD, BD] second-moment, [BK, BD] first-
    moment and [BK, BK] responsibility-sum accumulators, and per row ~6 (BD + BK) (x and its
    transform, u and g; logits, responsibilities and masks, in the products' operand layouts)."""
    return BD * BD + BK * BD + BK * BK + 6 * BN * (BD + BK)


def _full_single_tiles(D: int, BD: int, BK: int) -> tuple:
    """``(BN, num_warps, num_stages, programs per SM)`` tiles of the fp32 full single sweep in order
    of preference, or ``()`` (two-pass). The first is the fastest timed tile; the rest hold fewer
    rows per warp, for a compiler that spills in it (:func:`fusedml.gmm.fused.fitted_plan` takes the
    first whose compile does not). The grid is the one the timed launches had.

    Measured on the H200 (session 27, ``results/gmm_full_sweep_padded-H200-2026-12-05-s27.json``,
    Triton 3.6; the kernels' operands zero-padded to BD):

    * BD >= 64: none. Every tile spilled inside the row loop (sm_90 compiles: 0.4-7.9 KB); 1M x 64,
      K = 16 took 486 ms at 64 rows on 8 warps against 16.2 ms two-pass.
    * BD = 16, K <= 16: 128 rows on 2 warps (254 registers, no spill on 3.6): 4M x 8, K = 8 2.56 ms
      and 1M x 16, K = 16 1.32 ms, the fastest of 11 tiles (64 rows on 4 warps: 5.12 and 2.56 ms;
      session 26's code and picks: 3.97 and 2.36 ms).
    * BD = 16, 16 < K <= 32: the same 128 rows on 2 warps (session 31, an H100,
      ``results/gmm_full_bd16_sweep-H100-2026-12-05-s31-r{1,2}.json``: 1M x 16, K = 20 1.66 ms and
      K = 32 2.60, against 2.04 and 3.22 at 64 rows on 2 warps).
    * BD = 16, 32 < K <= 64: 64 rows on 2 warps (session 31, ``results/gmm_full_sweep-H200-2026-12-05-s31.json``:
      1M x 16, K = 64 6.84 ms, the fastest of 11 tiles on the H200, 6.85 on an H100, where K = 48
      took 5.05; session 27's pick, 64 rows on 8 warps, 11.5 ms, and the two-pass path 9.35).
    * BD = 32: 64 rows on 4 warps, 3-stage pipeline (168 registers on 3.6): 1M x 32, K = 64
      14.97 ms, the fastest of 13 tiles and of the two-pass path (15.8 ms at its best); session 31
      timed it fastest also with padded features (1M x 24, K = 20 4.37 ms, 1M x 28, K = 8 1.80 ms,
      of 11 tiles each).

    The fallbacks are sm_90 compiles' (session 34): Triton 3.9 compiles this kernel with about twice
    the registers per row of 3.6-3.8 (the same TTGIR) and spills 0.3-1.2 KB inside the row loop at
    every tile above (128 rows on 2 warps at BD = 16, K = 16: 688 B, 294 local accesses per block).
    The tiles with the most rows per warp that it compiles without spills for K <= 64, with and
    without sample weights / per-row output: BD = 16 64 rows on 2 warps up to K = 16 (244-248
    registers; beyond, 40-280 B), 32 rows on 2 warps (168-222); BD = 32 32 rows on 4 warps, 3
    stages (253-255). Programs per SM from their registers.
    """
    if BD > 32:
        return ()
    if BD == 16:
        if BK <= 16:
            return (128, 2, 2, 3), (64, 2, 2, 4), (32, 2, 2, 4)
        return ((128, 2, 2, 3) if BK <= 32 else (64, 2, 2, 3)), (32, 2, 2, 4)
    return (64, 4, 3, 2), (32, 4, 3, 2)


def _tied_single_tile(BD: int, BK: int) -> tuple[int, int, int, int] | None:
    """``(BN, num_warps, num_stages, programs per SM)`` of the fp32 tied single sweep where a sweep
    timed it, else None (the :data:`TIED_VALUES` rule).

    BD = 16, K <= 16: 64 rows on 4 warps at 2 programs per SM (H200, session 27,
    ``results/gmm_tied_sweep-H200-2026-12-05-s27.json``: 4M x 16, K = 16 1.72 ms against the
    rule's 64 rows on 8 warps, 1.89; the fastest of 12 tiles). Its 102 values per thread are just
    over the rule's 100; sm_90 compiles (Triton 3.6, 168 registers): 8 B of stack, no local-memory
    access in the loop.
    """
    return (64, 4, 2, 2) if BD == 16 and BK <= 16 else None


def _full_two_pass_tile(BD: int) -> tuple[int, int]:
    """``(BN, num_warps)`` of the full / tied two-pass kernels (pass 1 and the per-component
    statistics), from sm_90 compiles (Triton 3.6): BD <= 32 64 rows on 4 warps (<= 184 registers,
    no spill); BD = 64 32 rows on 8 warps (64 rows spilled 0.3-3.7 KB in the loop); wider, 16 rows
    on 8 warps (BD = 128: 16-64 B; 32 rows spilled 6-7 KB)."""
    if BD <= 32:
        return 64, 4
    return (32, 8) if BD == 64 else (16, 8)


def lse_chunk(BD: int, precision: str) -> int:
    """Feature chunk DC of pass 1: BD for fp32 and BD <= 32, else 16 (tensor-core operands of the
    whole feature axis would stay live in registers across the component loop and spill)."""
    return BD if precision == "fp32" or BD <= 32 else 16


def _lse_fits(BN, BD, BK, nw, precision, pass1=False):
    """Pass 1 (calibrated on sm_90 compiles): at most 8 outputs of the [BN, BK] logits tile per
    thread, 4 from D = 64 on (fp32: the FMA operands of x and x^2 stay in registers), at most 32
    values of the two weight tiles per thread;
    tensor-core precisions 8 warps (their operand fragments are replicated per warp).
    fp32 pass 1 (``pass1``) also holds at most 16 values of the x tile per thread: at 4M x 256,
    K = 16 on 8 warps ptxas spilled inside the loop with 64-row tiles (Triton 3.6: 255 registers,
    10 local loads / stores) and with 32-row tiles (3.9: capped at 128 registers, 9), not with
    16-row tiles (167-232 registers on 3.6-3.9)."""
    o = BN * BK // (32 * nw)
    if o > 8 or 2 * BD * BK > 32 * 32 * nw:  # and at most 32 weight values per thread
        return False
    if precision == "fp32":
        return o <= (4 if BD >= 64 else 8) and (not pass1 or BN * BD <= 16 * 32 * nw)
    return nw == 8


def _diag_fits(kind, BN, BD, BK, nw, st, precision, smem_limit):
    sm = smem_estimate(kind, BN, BD, BK, nw, st, precision)
    rg = regs_estimate(kind, BN, BD, BK, nw, precision)
    ok = sm <= smem_limit and rg <= (_MAX_REGS if precision == "fp32" else 255)
    if kind == "lse":
        ok = sm <= smem_limit and _lse_fits(BN, BD, BK, nw, precision, pass1=True)
    elif kind == "stats" and precision == "fp32":  # pass 2 recomputes the logits like pass 1
        ok = ok and _lse_fits(BN, BD, BK, nw, precision)
    return ok, sm, rg


def plan_launch(N: int, K: int, D: int, covariance_type: str, dtype, device, *, path: str = "auto",
                precision: str = "fp32", register_form: bool = True) -> Plan:
    """Choose the fused E-step's path and launch parameters (see the module docstring for the model).

    Parameters
    ----------
    N, K, D : int
        Rows, components, features.
    covariance_type : {"full", "tied", "diag", "spherical"}
    dtype : torch.dtype
        Storage dtype of X (sets nothing today beyond the byte count; kept for the model's inputs).
    device : torch.device
    path : {"auto", "single", "two_pass"}
    precision : str
        Operand precision: "fp32" or a tensor-core precision (tf32x3, tf32, bf16).
    register_form : bool
        Allow the register-FMA single sweep (:func:`reg_tile`); False gives the ``tl.dot`` plans
        (the benchmark's before/after comparison).

    Returns
    -------
    Plan
        Memoised per argument tuple (a plan is immutable).
    """
    return _plan(int(N), int(K), int(D), covariance_type, dtype, torch.device(device), path, precision,
                 bool(register_form))


@functools.lru_cache(maxsize=1024)  # an EM fit asks for the same plan every iteration (pure Python, ~40 us)
def _plan(N, K, D, covariance_type, dtype, device, path, precision, register_form) -> Plan:
    info = gpu_info(device)
    sms = info["sm_count"]
    smem_sm = int(info.get("smem_per_sm") or 233472)
    smem_limit = min(MAX_SHARED_PER_BLOCK, smem_sm)
    BD = _pow2(D)
    BK = _pow2(K)
    full_like = covariance_type in ("full", "tied")
    tc = precision != "fp32"
    st = 2
    fits, best = False, None
    # measured (session 19, occupancy grid): small fp32 diag tiles run best as many small programs
    small = ([] if full_like or tc or BD * BK > 4096 else
             [(32, 2)] if BD * BK <= 512 else [(32, 4)] if BD * BK <= 1024 else [(16, 4)])
    cands = small + [(bn, w) for bn in (128, 64, 32, 16) for w in (4, 8)]
    tiles = _full_single_tiles(D, BD, BK) if covariance_type == "full" and not tc and K <= 64 else ()
    measured = tiles[0] if tiles else None
    if covariance_type == "full" and not tc:  # measured tiles (session 27), or the two-pass path
        cands = [measured[:2]] if measured else []
    if covariance_type == "tied" and not tc:
        measured = _tied_single_tile(BD, BK)  # where a sweep timed one (session 27)
        cands = [measured[:2]] + cands if measured else cands
    for BN, nw in cands:
        if covariance_type == "tied":  # the tied sweep (own-centre statistics): sm_90 compiles, session 26
            if BN > 64 and not tc:
                continue
            E = _tied_elems(BN, BD, BK)
            ok = (E <= 32 * nw * TIED_VALUES or (measured is not None and (BN, nw) == measured[:2])) and K <= 64
            regs = min(255, E // (32 * nw) + 48)
            sm = 4 * (st * BN * BD + 2 * BN * BK + 2 * BD * BD + 2 * BK * BD + BK * BK) * (1 if not tc else 2)
            ok = ok and sm <= smem_limit
        elif full_like:
            if not measured and (BN < 32 or (BN > 64 and not tc)):  # tensor cores: the session-1 candidates
                continue
            E = _single_elems(covariance_type, BN, BD, BK)
            ok = (measured is not None or E <= 32 * nw * _DATA_REGS) and K <= 64
            regs = min(255, E // (32 * nw) + 48)
            sm = 4 * (st * BN * BD + BN * BK + 2 * BD * BD) * (1 if not tc else 2)
            ok = ok and sm <= smem_limit
        else:
            ok, sm, regs = _diag_fits("single", BN, BD, BK, nw, st, precision, smem_limit)
            ok = ok and (not tc or BD <= 64)  # tensor-core single sweep spilled at BD = 256 (sm_90)
        if ok:
            best, fits = (nw, BN, regs, sm), True
            break
    chosen = path if path != "auto" else ("single" if fits else "two_pass")
    if measured is not None and chosen == "single":
        st = measured[2]
    if chosen == "single":
        if best is None:  # forced on a shape the model rejects: smallest blocks, no pipelining
            st = 1
            nw, BN = 8, (16 if not full_like else 32)
            regs = 255
            sm = smem_estimate("single", BN, BD, BK, nw, st, precision)
        else:
            nw, BN, regs, sm = best
        BK_tile = min(BK, 64 if BD <= 64 else 32)
    else:
        pick = lse = None
        for bkt in (64, 32, 16):
            bkt = min(bkt, BK)
            for BN_ in (64, 32, 16):
                for nw_ in (4, 8):
                    if full_like:
                        pick = pick or (bkt, *_full_two_pass_tile(BD), 0, 0)
                        lse = lse or (pick[0], pick[1], pick[2])
                        continue
                    DC = lse_chunk(BD, precision)
                    if lse is None and _lse_fits(BN_, DC, bkt, nw_, precision, True) and \
                            smem_estimate("lse", BN_, DC, bkt, nw_, st, precision) <= smem_limit:
                        lse = (bkt, BN_, nw_)
                    ok2, sm2, r2 = _diag_fits("stats", BN_, BD, bkt, nw_, st, precision, smem_limit)
                    if pick is None and ok2:
                        pick = (bkt, BN_, nw_, sm2, r2)
        if lse is None:
            lse = (16, 16, 8)
        if pick is None and tc and not full_like:  # no tensor-core configuration fits: plan fp32
            return plan_launch(N, K, D, covariance_type, dtype, device, path=path, precision="fp32")
        if pick is None:  # nothing fits the model: the smallest tiles, no pipelining
            st = 1
            pick = (16, 16, 8, smem_estimate("stats", 16, BD, 16, 8, 1, precision),
                    regs_estimate("stats", 16, BD, 16, 8, precision))
        BK_tile, BN, nw, sm, regs = pick
    form, prefetch, reg = "dot", False, ()
    rt = (reg_tile(D, K, values=reg_values(covariance_type))
          if register_form and chosen == "single" and not full_like and precision == "fp32" else None)
    if rt is not None:  # register FMAs: no shared-memory operands (see reg_tile)
        rbd, rbk, ki, BN, nw = rt
        form, reg, prefetch = "reg", (rbd, ki, rbk // ki), reg_prefetch(BN, rbd)
        rpt = BN * (rbk // ki) // (32 * nw)
        # shared memory: the x tile in flight (cp.async stages) and its layout change, the weight
        # tiles' layout change, scratch (sm_90 compiles: 1-16 KB)
        regs = 2 * rbd * ki * (1 + rpt) + 2 * rbd * rpt + 8 * ki * rpt + 40
        sm = 4 * rbd * max(BN, 32) * (st + 1) + 16 * rbd * rbk + 1024
    if (precision == "tf32x3" and covariance_type == "diag" and chosen == "single" and dtype == torch.float32
            and mma_applies(K, D)):
        # both products on the tensor cores, fragments in registers (fusedml/gmm/mma.py): 8-row
        # groups, one per warp of 4; the grid from the compiled kernel (H100, session 32: 5 programs
        # per SM at 96 registers, 0.26 ms at 4M x 16, K = 16 against the register form's 0.40)
        form, reg, BN, nw, prefetch, regs, sm = "mma", (1,), 32, 4, 0, 96, 1024
    n_blocks = -(-N // BN)
    if measured is not None and chosen == "single":  # the grid the tile was timed with
        per_sm = measured[3]
    else:
        per_sm = max(1, min(4, info["regs_per_sm"] // (32 * nw * max(regs, 32)), smem_sm // max(sm, 1)))
    n_kt = K if full_like else -(-K // BK_tile)
    n_chunks = max(1, (8 * sms) // n_kt)
    chunk_rows = max(BN, -(-(-(-N // n_chunks)) // BN) * BN)
    if chosen == "single":  # scoring (gmm_score) still runs pass 1: same rules as two-pass
        lse = None
        for bkt in (64, 32, 16):
            for BN_ in (64, 32, 16):
                for nw_ in (4, 8):
                    bkt_ = min(bkt, BK)
                    DC = lse_chunk(BD, precision)
                    if lse is None and (full_like or (_lse_fits(BN_, DC, bkt_, nw_, precision, True) and smem_estimate(
                            "lse", BN_, DC, bkt_, nw_, st, precision) <= smem_limit)):
                        lse = (bkt_, BN_, nw_) if not full_like else (BK_tile, BN, nw)
        if lse is None:
            lse = (16, 16, 8)
    lse_bk, lse_bn, lse_nw = lse
    DC = lse_chunk(BD, precision) if not full_like else BD
    if precision == "bf16" and not full_like and DC < BD <= 128:  # measured: x on chip beats chunked re-reads
        DC, lse_bn = BD, 64
    lse_blocks = -(-N // lse_bn)
    if rt is None and chosen == "single" and not full_like and D <= 8:  # [x, x^2] is 16 wide: no padded features
        BD, form, prefetch = 8, "cat", True
        DC = BD if DC > BD else DC
    return Plan(path=chosen, BN=BN, BD=BD, BK=BK, BK_tile=BK_tile, num_warps=nw,
                programs=max(1, min(n_blocks, sms * per_sm)), lse_programs=max(1, min(lse_blocks, sms * 4)),
                chunk_rows=chunk_rows, single_fits=fits, regs_est=int(regs), num_stages=st, smem_est=int(sm),
                form=form, DC=DC, lse_BN=lse_bn, lse_BK=lse_bk, lse_warps=lse_nw, precision=precision,
                prefetch=prefetch, occupancy_grid=chosen == "single" and not full_like, reg=reg,
                sph=bool(reg) and covariance_type == "spherical",
                fallback=tuple(tiles[1:]) if chosen == "single" and tiles else ())
