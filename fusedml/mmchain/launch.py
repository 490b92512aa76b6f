"""Launch parameters of the dense mmchain kernels, from an analytical model.

The kernel is memory-bound (2 FMAs per element of X for m = 1), so the model only has to keep
enough bytes in flight per SM and keep everything a program needs on chip. See
:func:`dense_config` for the model and :func:`gpu_info` for the machine description it uses.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import torch


@dataclass(frozen=True)
class GPUInfo:
    """What the launch model needs to know about a GPU.

    Attributes
    ----------
    name : str
    sm_count : int
    regs_per_sm : int
        32-bit registers per SM.
    smem_per_sm : int
        Shared memory per SM in bytes.
    l2_bytes : int
        L2 cache size in bytes.
    max_threads_per_sm : int
    """

    name: str
    sm_count: int
    regs_per_sm: int
    smem_per_sm: int
    l2_bytes: int
    max_threads_per_sm: int


#: The profile used when there is no CUDA device (Triton interpreter): an H200 (GH100, SXM).
H200_PROFILE = GPUInfo("H200 profile (interpreter)", sm_count=132, regs_per_sm=65536,
                       smem_per_sm=228 * 1024, l2_bytes=60 * 1024 * 1024, max_threads_per_sm=2048)


def gpu_info(device=None) -> GPUInfo:
    """Describe the GPU behind ``device``.

    Parameters
    ----------
    device : torch.device or str, optional
        A CUDA device (queried with ``torch.cuda.get_device_properties``); anything else (CPU
        under the Triton interpreter, None without CUDA) gives the fixed :data:`H200_PROFILE`.

    Returns
    -------
    GPUInfo
    """
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device is None or torch.device(device).type != "cuda":
        return H200_PROFILE
    return _cuda_info(torch.device(device))


@functools.lru_cache(maxsize=None)
def _cuda_info(device: torch.device) -> GPUInfo:
    p = torch.cuda.get_device_properties(device)
    return GPUInfo(
        name=p.name,
        sm_count=int(p.multi_processor_count),
        regs_per_sm=int(getattr(p, "regs_per_multiprocessor", 65536)),
        smem_per_sm=int(getattr(p, "shared_memory_per_multiprocessor", 228 * 1024)),
        l2_bytes=int(getattr(p, "L2_cache_size", 50 * 1024 * 1024)),
        max_threads_per_sm=int(getattr(p, "max_threads_per_multi_processor", 2048)),
    )


@dataclass(frozen=True)
class DenseConfig:
    """Launch parameters of the dense kernels (every field can be overridden by ``config=``).

    Attributes
    ----------
    strategy : {"onchip", "coop", "chunked"}
        ``"onchip"``: a whole row tile ``[block_n, D]`` is held in registers (block_d >= D) and the
        program's ``X^T p`` accumulator ``[m_pad, block_d]`` stays in registers across all its row
        tiles: P x D x m atomics in total. ``"chunked"`` (wide D): two passes over the row tile's D
        chunks -- pass 1 computes ``t = X_b y``, pass 2 re-reads the same chunks (last chunk first,
        from L2) and adds ``X_b^T p`` with per-chunk atomics. ``"coop"`` (wide D, m = 1): the
        grid is G x R programs, G = ceil(D / block_d) column blocks per row group; each program
        keeps its slice of y and of ``X^T p`` in registers, publishes its partial dot product of
        each row and waits (a per-row counter in global memory) for the other G - 1 before using
        the part of the row it still holds: X is read once. Every program must be co-resident:
        the launcher caps R by the compiled kernel's occupancy (else two launches, X read twice).
    block_n : int
        Rows per tile.
    block_d : int
        Columns per tile (>= D for "onchip"), a power of two.
    mode : {"vector", "small", "dot", "elementwise"}
        m == 1: broadcast-multiply + ``tl.sum``; 2 <= m <= 4 (short rows; X^T V up to m = 8, the
        multinomial passes and the plain product as :func:`unrolled_wide_m` says): ``"small"``, the
        right-hand sides unrolled, one accumulator shaped as the tile each (2 m FMAs per element of
        X; see :func:`small_config`); larger m, fp32/bf16/fp16:
        ``tl.dot`` with m padded to 16 (``dot_precision``); fp64 with m > 4: 3-D broadcast +
        ``tl.sum`` (no fp64 tl.dot). The ``matvec`` kernel's "small" (2 <= m <= 8; the model's pick
        on rows over 128 values with a few right-hand sides, :func:`matvec_config`): one
        ``[block_n, block_d]`` accumulator per right-hand side across the column chunks, reduced
        along the row once per tile.
    m_pad : int
        Padded number of right-hand sides (1; 2, 4 or 8 for "small"; 16 for "dot"; next power of two).
    num_warps : int
    num_programs : int
        Persistent grid size (programs loop over row tiles ``pid, pid + P, ...``).
    num_stages : int
        Triton software-pipelining depth of the row-tile loop.
    prefetch : bool or int
        "onchip": load row tile i + 1 (and its v) into registers before computing tile i, so
        each program keeps two tiles of loads in flight; "small": 1 or 2 tiles ahead (the load of
        tile i + 2 is issued during tile i: ptxas sinks a register prefetch's loads towards the end
        of the loop body, where one tile ahead no longer covers the load latency). "coop": rows
        held ahead of the one consumed: 0 (row i + R loads during row i's wait), 1 (i + R
        published, i + 2R loading),
        2 (i + R waiting, i + 2R published, i + 3R loading; polls issued an iteration ahead).
    two_pass : bool
        "coop" only: always use the two-launch form (partial dot products, then combine and
        accumulate: X read twice) instead of the single cooperative launch.
    chunk : int, optional
        "small" only: the row tile is held as ``[block_n, block_d / chunk, chunk]``, a thread's
        values of a row spread over the ``block_d / chunk`` column chunks (a row's dot products
        then reduce across ``chunk / 4`` threads instead of ``block_d / 4``: fewer shuffles per
        element). None: ``block_d`` (one chunk: the 2-D tile).
    exact_m : bool, optional
        "small" only: unroll exactly m right-hand sides (True) or ``m_pad`` (False: the padding
        columns' FMAs run on zeros). None: the rule (exact for the softmax product and the loss
        pass; see :func:`fusedml.mmchain.dense.dense_mmchain_fused`).
    max_registers : int, optional
        "onchip" / "small": ptxas's register limit (Triton's ``maxnreg``); None: ptxas's choice
        (session 17's m = 3 passes: 128 changed nothing, 80 was slower; ``m3_probe-*-s17-f``).
    dot_precision : {"tf32x3", "ieee"}
        "dot" only: ``tl.dot``'s operand precision. "tf32x3" (the model's pick on tiles of <= 128
        values) splits each fp32 operand into a tf32 high and low part and sums three tensor-core
        products (the low parts' product dropped: ~2^-22 relative, fp32 level); "ieee" runs fp32
        FMAs, whose m-padded-to-16 work made the short-row passes compute-bound (17-23 % of the
        read-once floor at m = 3, 1M x 100) but which the model takes on wider tiles, where the
        tf32x3 split's operands spill (2M x 256, m = 5: 1.54 against 53.6 ms).
    """

    strategy: str
    block_n: int
    block_d: int
    mode: str
    m_pad: int
    num_warps: int
    num_programs: int
    num_stages: int = 1
    prefetch: bool | int = False
    two_pass: bool = False
    dot_precision: str = "tf32x3"
    max_registers: int | None = None
    chunk: int | None = None
    exact_m: bool | None = None

    def with_overrides(self, overrides: dict | None) -> "DenseConfig":
        """Return a copy with the fields named in ``overrides`` replaced (unknown keys ignored).

        Parameters
        ----------
        overrides : dict or None
            Field name -> value; None or empty returns ``self``.

        Returns
        -------
        DenseConfig
        """
        if not overrides:
            return self
        names = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in overrides.items() if k in names})


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _pow2_floor(x: float) -> int:
    x = max(1, int(x))
    return 1 << (x.bit_length() - 1)


#: Bytes of X a program loads per row tile: with 2-4 programs per SM this keeps 32-128 KB in
#: flight per SM, above the ~32 KB that Little's law asks for (4.3 TB/s x ~1 us / 132 SMs).
TILE_BYTES = 16 * 1024
#: Data registers per thread a program may use for its tile + accumulator (of 255).
REG_DATA = 96
#: Fraction of L2 that the in-flight row tiles of the chunked strategy may occupy.
L2_FRACTION = 0.5
#: Programs per SM of the cooperative wide-row strategy (register-limited: ~242 registers x 64 threads).
COOP_PROGRAMS_PER_SM = 4
#: Largest m served by the unrolled "small" kernel (one accumulator per right-hand side).
SMALL_M = 4
#: Longest rows (values) the unrolled kernel holds whole (one [block_n, block_d] tile per right-hand side).
SMALL_D = 1024
#: Largest m of ``X^T V`` (no ``X Y``, so no row reductions) served by the unrolled kernel.
SMALL_M_XTV = 8
#: Largest m of the `X Y` products and of the loss pass served by the unrolled kernel
#: (m = 5..8 on rows up to ``SMALL_WIDE_M_D`` values; see :func:`unrolled_wide_m`).
SMALL_M_WIDE = 8
#: Row lengths (block_d) up to which m = 5..8 takes the unrolled kernel: the softmax product (m <= 6:
#: 256), the loss pass (m = 5 in fp32: 128), the plain product ``X^T (V ⊙ [X, 1] Y)`` (m padded to 8;
#: fp32 m <= 6 also on 256-value rows, in column chunks).
SMALL_WIDE_M_D = {"softmax": 128, "loss": 64, "mul": 64}


def unrolled_wide_m(D: int, m: int, dtype: torch.dtype, form: str) -> bool:
    """Whether a product with m = 5..8 right-hand sides takes the unrolled ("small") kernel.

    ``form`` is ``"softmax"`` (the multinomial Hessian product ``X^T (h ⊙ (T - rowsum(h ⊙ T)))``),
    ``"loss"`` (the multinomial loss-gradient pass), both with m unrolled exactly, or ``"mul"``
    (the plain product ``X^T (V ⊙ [X, 1] Y)``, m padded to 8: its exact compile issues the
    prefetch's loads late in the loop, as at m = 3; on fp32 256-value rows chunked, m = 5 exact,
    see :func:`small_config`). Elsewhere, and for fp64, the padded ``tl.dot``
    (fp64: 3-D elementwise). Measured on the H200
    (``benchmarks/m3_probe.py``, ``results/m3_probe-H200-2026-12-04-s18-a`` and ``m58_probe-*-s18-b``,
    every point against float64), with the intercept, ms at 16M x 64 / 4M x 64 / 1M x 100:

    * m = 5, softmax product, 4 warps x 8 values per thread, two tiles ahead: 1.59 / 0.415 / 0.230,
      against 3.50 / 0.893 / 0.370 for the padded ``tl.dot`` (60 % of the floor at 16M x 64);
      2M x 256: 1.41 against 1.53;
    * m = 5, loss pass, 8 warps x 4 values, two tiles ahead: 3.72 / 0.939 / 0.551 against 4.62 /
      1.18 / 0.448: the unrolled pass wins on 64-value rows only;
    * m = 5, plain product with V, padded to 8, 4 warps x 8 values: 2.53 / 0.648 / 0.356 against
      3.58 / 0.909 / 0.364 (on 100-value rows no gain: only rows of <= 64 values take it);
    * m = 8 (4M x 64 / 1M x 100): softmax product on 8 warps x 4 values 0.594 / 0.335 (4 x 8: 0.668 /
      0.382, 220 registers); loss pass on 4 warps x 8 1.38 (8 x 4: 2.11, 184 registers, one program
      per SM) / the padded ``tl.dot``'s 0.456 at 1M x 100.

    m = 6 and 7 take the launch of the neighbour whose registers they are closer to (sm_90 compiles,
    Triton 3.6 ptxas, ``benchmarks/sass_probe.py``): softmax m = 6 on 4 x 8 (167 registers: three
    programs per SM, as m = 5), loss m = 6 on 8 x 4 (126: two per SM, as m = 5); m = 7 as m = 8.
    The softmax product on 256-value rows only for m <= 6; the plain product there too, m exact
    (session 37, :func:`small_config`: 0.736 ms at 2M x 256, m = 5, against 1.54). With the
    column-chunked tiles (:func:`small_config`, ``results/chunk_probe-H200-2026-12-04-s18-e``) the
    m = 5 loss pass also beats the padded ``tl.dot`` on 100-value rows (1M x 100: 0.417 against
    0.450 ms), so fp32 m = 5 takes it on rows of <= 128 values.

    Parameters
    ----------
    D, m : int
        Columns of X and right-hand sides.
    dtype : torch.dtype
        Storage dtype of X.
    form : {"softmax", "loss", "mul"}

    Returns
    -------
    bool
    """
    bd = _pow2_ceil(D)
    if not SMALL_M < m <= SMALL_M_WIDE or dtype == torch.float64:
        return False
    if form == "softmax" and m <= 6:  # m = 5 in fp32 also on 512 (column chunks, small_config)
        return bd <= max(256, SMALL_WIDE_M_D[form]) or (m == 5 and bd == 512 and dtype == torch.float32)
    if form == "loss" and m == 5 and dtype == torch.float32:  # the column-chunked launch (small_config)
        return bd <= max(128, SMALL_WIDE_M_D[form])
    if form == "mul" and bd == 256 and (m <= 6 if dtype == torch.float32 else m <= 5):  # chunked, m exact
        return True  # (small_config; fp32, bf16 / fp16)
    return bd <= SMALL_WIDE_M_D[form]


@functools.lru_cache(maxsize=4096)  # a pure function of hashable arguments; solvers call it per pass
def dense_config(N: int, D: int, m: int, dtype: torch.dtype, gpu: GPUInfo | None = None, *,
                 stride_xn: int | None = None, stride_xd: int | None = None) -> DenseConfig:
    """Choose the dense mmchain launch parameters from N, D, m, the dtype and the GPU.

    The model (memory-bound kernel; every byte of X must be read once at full bandwidth):

    1. **Mode.** m == 1: broadcast + ``tl.sum`` (2 FMAs per element). 2 <= m <= ``SMALL_M`` with
       rows up to 1024 columns: "small", the right-hand sides unrolled over 2-D tiles (sm_90 AOT:
       ~29 instructions per element of X at m = 4, 16 x 128 tiles, against ~250 and register
       spills for the padded ``tl.dot``, which measured 27 % of the floor on the H200). Other
       fp32/bf16/fp16 with m > 1: ``tl.dot`` with m padded to 16 (FMA ``ieee`` dot, no tf32).
       fp64 with m > 4: 3-D broadcast + ``tl.sum`` (fp64 ``tl.dot`` does not compile for the GPU).
       (The caller moves ``X^T V`` with m <= 8, and the multinomial products with m = 5..8 on short
       rows, :func:`unrolled_wide_m`, to "small" too.)
    2. **Registers.** A program of ``32 * num_warps`` threads holds its tile ``block_n x
       block_d`` (converted to the accumulation dtype; x m_pad for the 3-D elementwise mode), and,
       for "onchip", the accumulator (``block_n x block_d`` for m == 1, ``m_pad x block_d``
       otherwise). Per thread this must stay under
       ``REG_DATA`` 32-bit words (fp64 words count double).
    3. **Strategy.** (wide rows, m = 1: "coop", see below.) "onchip" when a whole row (block_d = next power of two >= D) fits with the
       minimum block_n (1, or 16 for ``tl.dot``) and at most 16 warps: then the accumulator lives
       in registers for the whole run and only ``P * D * m`` atomics are issued. Otherwise
       "chunked": block_n is chosen so that all in-flight row tiles (``P * block_n * D *
       bytes``) fit in ``L2_FRACTION`` of L2, so pass 2 re-reads them from L2, not DRAM, and
       block_d so that one chunk ``block_n x block_d`` is about ``2 * TILE_BYTES`` (few programs
       per SM here, so each carries more bytes in flight); programs per SM are also capped by
       the L2 budget. Its atomics are
       ``N / block_n * D * m`` (ratio 1/block_n to the elements of X): for very wide rows (one
       row > L2 / (2 P)) block_n drops to 1 and the atomics land in L2 (w is small and stays
       there) at one per element of X.
    4. **Tile size.** block_n so that one tile is about ``TILE_BYTES`` of X, clipped by (2);
       rows shorter than 2 KB take 8 elements per thread and, for fp32, half that
       (H200 sweeps, benchmarks/results/mmchain-H200-2026-12-02-s2.json: 8M x 32 and 2M x 128
       fp32 best at 8 KB tiles, 8 warps = 32 B per thread); 2-byte storage keeps ``TILE_BYTES``
       (2M x 128 bf16: 64 x 128 tiles, 2 programs per SM: 0.139 ms, 86 % of the floor, against
       0.145 ms at 32 x 128 with 3 per SM; ``results/bf16_probe-H200-2026-12-03-s11-f``; the
       product runs it on 8 warps, :func:`product_config`), ``tl.dot`` tiles twice it.
       Chunked (wide) tiles keep at least 4 rows even when that overflows the L2 budget: with one
       row per tile the atomics (one per element of X) cost more than re-reading from DRAM
       (4k x 65536 on the H200: 0.89 ms at 1 row, 0.57 ms at 4).
       Column-major X (stride_xn == 1) needs block_n >= 32 so that each column segment of a tile
       is a full 128-byte line.
    5. **Warps and grid.** num_warps so that each thread holds ~32 tile elements (32 bytes for
       short rows; 4..16 warps, at most 8 for chunked);
       programs per SM from the register file (estimated registers = data words + 20, which is
       what ptxas gives the short-row kernels; "small" adds y, t, v and p per right-hand side) and
       the thread limit, capped at 4; ``tl.dot`` also by shared memory (tile + y in fp32: the
       2M x 128, m = 4 sweep preferred 4 programs per SM, 0.716 ms against 0.901 ms at 2);
       a persistent grid of ``sm_count * programs_per_sm`` programs (the product's launch then
       halves the warps of 2-byte rows of 128-1023 values: :func:`product_config`).
    7. **Wide rows, m = 1: "coop".** When a row does not fit "onchip" (D > 16384 fp32), a row is
       split over G column blocks of ``block_d`` = 2048 (512 fp64) columns held by G programs of
       2 warps (32 values per thread), which combine the row's t through global memory (each
       publishes its partial as a tagged 64-bit word and polls the row's G words) and each
       multiply their part of the row still in registers: one read of X (the "chunked" two-pass
       strategy re-read most of it from DRAM: 4k x 65536 reached 44 % of the floor). The loop is
       latency-bound, so ``prefetch=2`` keeps four rows per program: row i + 2R is published,
       row i + 3R loads, and row i + R's poll is issued an iteration before it is needed
       (H200 sweep, 4k x 65536: 0.315 ms, 80 % of the floor, against 0.40 ms with three rows and
       0.58 ms with the former 8-warp, 4096-column launch; ``benchmarks/launch_probe.py --probe coop``,
       ``results/coop_sweep-H200-2026-12-03-s11-*``). Grid: ``sm_count * 4`` programs
       (register-limited), R = programs // G row groups; the launcher caps it to the compiled
       kernel's residency. Taken while G fits in the co-resident grid (D up to ~1M columns).
    6. **Prefetch** (register double buffer) for 2-byte storage and the "small" mode with tiles
       up to ``TILE_BYTES``: their loop holds one 16-byte load per thread, so without it an SM
       keeps only ~24 KB in flight and the kernel is latency-bound (bf16: 61 % of the floor).
       The "small" mode's tile, prefetch and grid are then set per product by
       :func:`small_config` (``dense._config_uncached``).

    Parameters
    ----------
    N, D, m : int
        X is ``[N, D]``, y is ``[D, m]``.
    dtype : torch.dtype
        Storage dtype of X.
    gpu : GPUInfo, optional
        Defaults to :func:`gpu_info` of the current device.
    stride_xn, stride_xd : int, optional
        X's strides (elements); stride_xn == 1 marks column-major X.

    Returns
    -------
    DenseConfig
    """
    gpu = gpu or gpu_info()
    b = torch.empty((), dtype=dtype).element_size()
    fp64 = dtype == torch.float64
    w_acc = 2 if fp64 else 1  # 32-bit registers per accumulated value
    if m == 1:
        mode, m_pad = "vector", 1
    elif m <= SMALL_M and D <= SMALL_D:  # short rows: unrolled right-hand sides
        mode, m_pad = "small", _pow2_ceil(m)
    elif fp64:
        mode, m_pad = "elementwise", _pow2_ceil(m)
    else:
        mode, m_pad = "dot", 16
    bn_min = 16 if mode == "dot" else 1
    col_major = stride_xn == 1 and D > 1
    if col_major:
        bn_min = max(bn_min, 32)
    bd_min = 16 if mode == "dot" else 1
    expand = m_pad if mode == "elementwise" else 1

    def regs(bn, bd, warps, onchip):
        if mode == "small":  # [bn, bd] accumulator per right-hand side
            acc = m_pad * bn * bd
        else:
            acc = (bn * bd if mode == "vector" else m_pad * bd) if onchip else 0  # vector: [bn, bd] acc
        words = bn * bd * expand + acc + 2 * bn * m_pad
        return words * w_acc / (32 * warps)

    bd_full = max(bd_min, _pow2_ceil(D))
    onchip = regs(bn_min, bd_full, 16, True) <= REG_DATA
    if not onchip and mode == "vector":
        # cooperative wide rows: 2 warps, 32 values per thread (8 for fp64: 16 spill) of each of
        # four rows (one consumed, one waiting on its poll, one being published, one loading) +
        # the accumulator + y: ~240 registers (sm_90 AOT), four programs per SM
        bd = 512 if fp64 else 2048
        per_sm = max(1, min(COOP_PROGRAMS_PER_SM, gpu.regs_per_sm // (64 * 248)))
        if -(-D // bd) <= gpu.sm_count * per_sm:  # one group's G column blocks must be co-resident
            return DenseConfig(strategy="coop", block_n=1, block_d=bd, mode="vector", m_pad=1, num_warps=2,
                               num_programs=gpu.sm_count * per_sm, prefetch=2)
    short_rows = bd_full * b < 2048  # measured on the H200: short rows like smaller tiles, 8 elements/thread
    # (fp32; 2-byte storage keeps whole 16 KB tiles: two 16-byte loads per thread at 16 warps)
    tile_bytes = TILE_BYTES // 2 if short_rows and b > 2 else TILE_BYTES
    ept = 8 if short_rows else 32  # tile elements per thread (fp32 short rows: two 16-byte loads)
    if mode == "dot":  # measured: 64-row tiles with 4 warps amortise the tl.dot layout conversions
        tile_bytes, ept = 2 * TILE_BYTES, 64
    bn_chunk_min = 4 if mode == "vector" else bn_min  # atomics per X element <= 1/4
    if onchip:
        bd = bd_full
        bn = max(bn_min, min(256, _pow2_floor(tile_bytes / (bd * b))))
    else:
        # rows per tile from the L2 budget of pass 2's re-read, assuming 2 programs per SM
        # (re-checked below with the real grid), but at least bn_chunk_min: measured on the
        # H200 (4k x 65536), atomics cost more than a partial DRAM re-read. Chunks of 8 tiles.
        bn = max(bn_chunk_min, min(64, _pow2_floor(L2_FRACTION * gpu.l2_bytes / (2 * gpu.sm_count * D * b))))
        chunk_bytes = (8 if mode == "vector" else 2) * TILE_BYTES
        bd = max(bd_min, min(bd_full // 2, _pow2_floor(chunk_bytes / (bn * b))))
        while regs(bn, bd, 16, False) > 2 * REG_DATA and bd > bd_min:
            bd //= 2
    if mode == "elementwise":
        bn = min(bn, max(bn_min, _pow2_floor(4096 / (bd * m_pad))))

    budget = REG_DATA if onchip else 2 * REG_DATA  # chunked: no accumulator, the tile may take more

    def fit_warps(bn, bd):
        warps = max(4, min(16 if onchip else 8, _pow2_ceil(bn * bd * expand / (32 * ept))))
        while regs(bn, bd, warps, onchip) > budget and warps < 16:
            warps *= 2
        return warps

    warps = fit_warps(bn, bd)
    while regs(bn, bd, warps, onchip) > budget and bn > bn_min:
        bn //= 2
        warps = fit_warps(bn, bd)
    threads = 32 * warps
    # registers = data words + 20 (sm_90 AOT compile: 40 for 16 data words, short-row fp32/bf16);
    # the small mode holds y, t, v, p per right-hand side too (104 registers at 16 x 128, 8 warps)
    reg_est = regs(bn, bd, warps, onchip) + 20
    if mode == "small":
        reg_est += m_pad * (bd // 32 + 4) + 20
    per_sm = min(4, gpu.max_threads_per_sm // threads, int(gpu.regs_per_sm // (threads * reg_est)))
    if mode == "dot":  # tl.dot operands go through shared memory: ~(tile + y) fp32 words
        # (45 KB at 64 x 128 in the sm_90 AOT compile; the H200 sweep of 2M x 128, m = 4 preferred
        # 4 programs per SM: 0.716 ms against 0.901 ms at 2)
        per_sm = min(per_sm, max(1, gpu.smem_per_sm // ((bn * bd + 16 * bd) * 4 + 4096)))
    if not onchip:  # 2 per SM (measured best on 4k x 65536), fewer only for the thread limit
        per_sm = min(2, gpu.max_threads_per_sm // threads)
    per_sm = max(1, per_sm)
    programs = gpu.sm_count * per_sm
    if not onchip:
        # in-flight row tiles should fit in L2 for pass 2's re-read: programs * bn * D * b <= frac * L2
        bn_l2 = _pow2_floor(L2_FRACTION * gpu.l2_bytes / max(1, programs * D * b))
        bn = max(bn_chunk_min, min(bn, bn_l2))
    # register double buffer where a program's tile is small: 2-byte storage and the small mode
    # (latency-bound at 24 KB in flight per SM); fp32 short rows were at 94-96 % without it
    prefetch = onchip and mode in ("vector", "small") and (b <= 2 or mode == "small") and bn * bd * b <= TILE_BYTES
    precision = "tf32x3"
    if mode == "dot" and bd > 128:
        # tiles over 128 values wide: the tf32x3 split's extra operands spill (H200, 2M x 256,
        # m = 5, results/dot_probe-H200-2026-12-03-s12-d: mmchain 53.6 ms at 32 rows x 8 warps,
        # 1M x 512 60.7 ms; ops 1.90 / 1.81); fp32 FMAs at 16 rows x 4 warps: 1.54 / 1.70 ms.
        # 2-byte storage too (its tiles are split in fp32; sm_90 compiles, session 35, Triton 3.6
        # and 3.9: bf16 at 16 x 1024 8.9-9.9 KB, 64 x 256 0.8-1.2 KB, chunked 32 x 512 7.5 KB; with
        # fp32 FMAs at the same tiles 107-128 registers, none)
        precision = "ieee"
        if onchip and b == 4:  # the measured fp32 tile; rows over 512 values: more warps share the
            bn, warps = 16, 4  # [m_pad, bd] accumulator (4 spilled 0.3-1.4 KB)
            while regs(bn, bd, warps, onchip) > 1.5 * REG_DATA and warps < 16:
                warps *= 2
    return DenseConfig(strategy="onchip" if onchip else "chunked", block_n=int(bn), block_d=int(bd),
                       mode=mode, m_pad=int(m_pad), num_warps=int(warps), num_programs=int(programs),
                       prefetch=bool(prefetch), dot_precision=precision)


def product_config(cfg: DenseConfig, D: int, dtype: torch.dtype) -> DenseConfig:
    """The ``mmchain`` product's launch from :func:`dense_config`'s pick (the loss pass and
    ``matvec`` keep that pick, whose warps their own rules adjust).

    2-byte storage, rows of 128-1023 values, m = 1 ("onchip" vector mode): half the warps on the
    same grid, 32 tile elements per thread. H200 sweeps of 2M x 128 bf16 at 8 against 16 warps, 2
    programs per SM: 0.1368 / 0.1394 ms (``mmchain-*-s12-c`` and ``-s31``), 0.1350 / 0.1376
    (``-s17-d``); H100 probe, session 31 (``launch_probe_warps16-H100-*-s31``): 500k x 512
    0.188 / 0.215 ms (bf16; fp16 0.189-0.206 / 0.215), 2M x 128 bf16 0.1865 / 0.1889. Rows of 32
    values lost at 8 warps (0.203 / 0.194 ms), and 3 programs per SM at 8 warps lost everywhere.

    Parameters
    ----------
    cfg : DenseConfig
        :func:`dense_config`'s pick for ``[N, D]`` storage of ``dtype``.
    D : int
    dtype : torch.dtype

    Returns
    -------
    DenseConfig
    """
    b = torch.empty((), dtype=dtype).element_size()
    if (cfg.strategy == "onchip" and cfg.mode == "vector" and b == 2 and 128 <= _pow2_ceil(D)
            and _pow2_ceil(D) * b < 2048 and cfg.num_warps > 4):
        return replace(cfg, num_warps=cfg.num_warps // 2)
    return cfg


def small_config(cfg: DenseConfig, D: int, m: int, dtype: torch.dtype, *, xtv: bool, intercept: bool,
                 gpu: GPUInfo | None = None, stride_xn: int | None = None, loss: bool = False,
                 softmax: bool = False) -> DenseConfig:
    """The unrolled ("small") kernel's launch for one product, from :func:`dense_config`'s ``cfg``.

    Measured on the H200 (``benchmarks/launch_probe.py --probe grid``,
    ``results/grid_probe-H200-2026-12-03-s12-b``: tile elements per thread x warps x prefetch at one
    wave of resident programs, 10 cases, each point checked against float64):

    * **Grid: one wave.** ``num_programs`` is an upper bound (the thread limit); the launcher caps it
      to what the compiled kernel keeps resident (:func:`fusedml.mmchain.dense._resident_programs`).
      A grid from the register estimate either left slots empty (8 rows x 8 warps: 48 registers,
      5 programs per SM, 2 launched: 0.66 ms against 0.41 on 2M x 128, m = 4) or ran two waves
      (2M x 256, m = 3: 1.79 against 1.13 ms).
    * ``X Y`` products: the register prefetch of the next tile, 8 elements of X per thread on
      8 warps (1M x 100, m = 3 softmax with the intercept 0.193 ms; 2M x 256 1.13; 4M x 64 0.373,
      within 3 % of the best there), and 4 per thread on 16 warps for the plain product without the
      intercept on rows of <= 128 values (2M x 128, m = 4: **0.343 ms, 70 % of the floor**, against
      0.47 at 8 per thread and session 11's 0.44).
    * Session 17 (``m3_probe-H200-2026-12-04-s17-*``, ``small_ab-*-s17-c``): ptxas places a one-tile
      register prefetch's loads where it likes, and in some compiles that is near the end of the
      loop body, where they no longer cover the load latency (SASS of the 16M x 64, m = 3
      product: the loads at instruction 153 of 169, against 51 of 222 for a compile that ran
      twice as fast). The 8-warp products therefore load two tiles ahead: m = 3 softmax form
      16M x 64 1.23 ms (77 % of the floor; one tile ahead 2.33, session 16 1.44), plain form with
      the intercept 1.32 (session 16 1.37). The 16-warp plain product keeps one tile (0.344 ms;
      two: 0.453).
    * ``X^T V`` (no row reductions, no prefetch): 16 elements per thread on 8 warps for m <= 4
      (2M x 128, m = 4 0.259 ms, 92 %; 2M x 256, m = 3 0.491 ms, 97 %; 1M x 100 0.131 ms; the
      padded ``tl.dot`` took 0.369 / 0.850 / 0.195), 8 on 16 warps for m = 5..8 (2M x 256, m = 5:
      0.726 ms against the padded ``tl.dot``'s 0.771; 16 per thread spilled: 14 ms).

    * Session 18, **column-chunked tiles** (``DenseConfig.chunk``; H200, fp32,
      ``results/chunk_probe-H200-2026-12-04-s18-e``, each point against float64): the tile is held as
      ``[block_n, block_d / chunk, chunk]``, so a thread carries a 4-value piece of each of its row's
      chunks, the row's dot products reduce over ``chunk / 4`` threads (fewer shuffles per element:
      sm_90 loop of the m = 3 loss pass 324 -> 205 instructions) and its per-row epilogue (softmax,
      losses) runs on fewer lanes. Taken for m <= 5 in fp32 (ms, the previous launch in brackets):

      - loss pass, 64-value rows: 8 values on 4 warps, chunks of 32 (m = 3, 16M x 64 1.68 (2.06),
        4M x 64 0.435 (0.526); m = 5 2.32 (3.61), 0.597 (0.914)); 128-value rows: 16 values on
        4 warps, chunks of 32 (1M x 100, m = 3 0.214 (0.326)); m = 5 there 8 values on 8 warps,
        chunks of 64 (0.417 against 0.450 for the padded ``tl.dot``; 16 x 4 ran 0.369 but sits at
        255 registers, and spills with Triton 3.9's ptxas);
      - softmax product, 64-value rows: 16 values on 4 warps, chunks of 16 (m = 3, 16M x 64
        **1.10 ms, 87 % of the floor** (1.23), 4M x 64 0.293 (0.318); m = 5 1.34 (1.60), 0.355
        (0.414)); 128-value rows, m = 5: 16 on 4 warps, chunks of 32 (1M x 100 0.192 (0.229); m = 3
        unchanged, 0.159-0.167 either way);
      - plain product without the intercept, m = 4 on 128-value rows: 8 values on 8 warps, chunks
        of 64, one tile ahead (2M x 128 0.323 ms, 74 % (0.344)).

    * Session 37, **rows of 256 values** (fp32; H100, ``benchmarks/hessian_probe.py``,
      ``results/hessian_probe-H100-2026-12-06-s37``, ``-s37b``; the sm_90 compile of every point
      first, ``--compile-only``): the unchunked tile reduced each row over 64 lanes, 55 shuffles
      for 88 FFMAs per thread and tile at m = 5, so the multinomial Hessian product was
      issue-bound at 1.41 ms (2M x 256). Chunks of 64 (a row over 16 lanes), 16 values per thread
      on 4 warps, two tiles ahead, m unrolled exactly (``DenseConfig.exact_m``; 253 registers, no
      spill on 3.6), ms at 2M x 256 (before in brackets):

      - softmax product m = 3 0.693 (0.966), m = 5 **0.736** (1.41), m = 6 in chunks of 128
        0.895 (chunks of 64 spill: 1.02); plain product m = 3 0.691 (1.14), m = 5 0.736 (1.54,
        the padded ``tl.dot``), m = 6 8 values on 8 warps, padded to 8, chunks of 128 1.12 (1.65);
      - the loss pass, m <= 4: 8 values on 4 warps, chunks of 128: m = 3 0.880 (1.30; matvec +
        ``X^T V`` 1.36); m = 5 stays two reads (its best one read, 1.50 ms, spilled);
      - ``X^T V``, m = 5..8, 16 values on 4 warps, chunks of a quarter row, m exact: m = 5
        0.697 (0.803), m = 8 0.747; 1M x 512, m = 5 0.695 (0.791). The padded ``tl.dot`` ran
        0.677 / 0.684 / 0.683 there on the H100, the unrolled kernel 6 % ahead of it on the H200
        (session 12): kept.

      Rows of 512 values (1M x 512, ``hessian_probe_512-H100-*-s37h``): m <= 4 8 values on 4 warps
      in chunks of 256 (softmax m = 3 0.765 (0.907), plain 0.763 (2.07)); the softmax product m = 5
      16 values in chunks of 128 0.764 (1.72, the padded ``tl.dot``). Rows of 1024 (500k x 1024,
      ``-s37j``), m <= 4: 16 values on 4 warps in chunks of 256 (softmax m = 3 0.778 (0.923), plain
      0.777 (1.11)).
      bf16 / fp16 on 256-value rows (``hessian_probe_bf16-H100-*-s37f``): chunks of 128 (8 values
      per load; chunks of 32 / 64 compile to layout conversions through shared memory), 16 values
      on 4 warps, m exact: softmax m = 3 0.474 (1.04), m = 5 0.657 (0.782); plain m = 5 0.646
      (2.14); ``X^T V`` m = 5 0.491 (0.643); the m = 3 loss pass keeps its launch (0.744 against
      0.760).

    fp64 holds half as many elements per thread (two registers each), 2-byte storage at least 8
    (one 16-byte load); fp64 takes no column chunks.

    Parameters
    ----------
    cfg : DenseConfig
        :func:`dense_config`'s launch for the same X.
    D : int
        Columns of X (at most ``SMALL_D``: a whole row is one tile).
    m : int
        Right-hand sides (2..8; m = 5..8 as :func:`unrolled_wide_m` says, ``X^T V`` on any row).
    dtype : torch.dtype
        Storage dtype of X.
    xtv : bool
        ``X^T V`` (no ``y``).
    intercept : bool
        Whether the product carries the intercept column.
    gpu : GPUInfo, optional
        Default :func:`gpu_info`.
    stride_xn : int, optional
        X's row stride (1: column-major X, whose tiles keep at least 32 rows).
    loss : bool
        The loss-gradient pass (:func:`fusedml.loss_gradient`, m <= 4): 8 values of X per thread
        on 4 warps, prefetching two tiles ahead. Its epilogue (the row's softmax, the Hessian
        weights' store, float64 loss sums) takes ~130 registers; H200, m = 3, 1M x 100 / 4M x 64 /
        16M x 64 (``m3_probe-H200-2026-12-04-s17-e``): 0.326 / 0.528 / 2.06 ms, against 0.57 / 1.37
        / 5.4 on 8 warps (``-s17-d``) and 0.47 / 0.91 / 3.54 for the padded ``tl.dot`` the pass
        took before. m = 5, 6 (:func:`unrolled_wide_m`): 4 values per thread on 8 warps; m = 7, 8:
        8 values on 4 warps. Rows of 256 values for m <= 4 (2M x 256, m = 3: 1.31 ms against 1.71
        for ``matvec`` + ``X^T V``; ``results/m58_probe-H200-2026-12-04-s18-b``).
    softmax : bool
        The softmax Hessian product; m = 5, 6 (:func:`unrolled_wide_m`) take 8 values per thread
        on 4 warps, two tiles ahead (H200, m = 5, 16M x 64: 1.59 ms against 2.35 on 8 warps x 4 and
        2.15 on 8 warps x 8; ``results/m3_probe-H200-2026-12-04-s18-a``); m = 7, 8 4 values on
        8 warps. m <= 4 as the other ``X Y`` products. The plain product with m = 5..8 runs m
        padded to 8 on 4 warps x 8 values (16M x 64, m = 5: 2.53 ms against 2.65-3.35 for the other
        tiles and 3.58 for the padded ``tl.dot``).

    Returns
    -------
    DenseConfig
    """
    gpu = gpu or gpu_info()
    m_pad = _pow2_ceil(max(2, m))
    if m_pad > (SMALL_M_XTV if xtv else SMALL_M_WIDE):
        raise ValueError(f"the unrolled kernel serves m <= {SMALL_M_WIDE}, got m = {m}")
    if D > SMALL_D:
        raise ValueError(f"the unrolled kernel holds whole rows of at most {SMALL_D} values, got D = {D}")
    bd = _pow2_ceil(D)
    if loss:  # (see unrolled_wide_m for m = 5..8)
        ept, warps, prefetch = (8, 4, 2) if m_pad <= 4 or m >= 7 else (4, 8, 2)
    elif m_pad > 4 and not xtv:  # m = 5..8 (unrolled_wide_m); the plain product is padded to 8
        ept, warps, prefetch = (4, 8, 2) if softmax and m >= 7 else (8, 4, 2)
    elif xtv:
        ept, warps, prefetch = (16, 8, False) if m_pad <= 4 else (8, 16, False)
    elif not intercept and bd <= 128:  # one tile ahead here (2M x 128, m = 4: 0.344 ms against 0.453)
        ept, warps, prefetch = 4, 16, 1
    else:
        ept, warps, prefetch = 8, 8, 2
    chunk = None
    if dtype == torch.float32 and m <= 5 and not xtv and stride_xn != 1:
        # column-chunked tiles (a thread holds a piece of each of the row's chunks: fewer shuffles
        # per element, the row's epilogue on fewer lanes); H200, results/chunk_probe-*-s18-e
        if loss and bd in (64, 128):  # m = 5 on 128: 16 x 4 needs 255 registers (Triton 3.9: spills)
            ept, warps, chunk = (8, 4, 32) if bd == 64 else (16, 4, 32) if m <= 4 else (8, 8, 64)
        elif softmax and (bd == 64 or (bd == 128 and m == 5)):
            ept, warps, chunk = (16, 4, 16) if bd == 64 else (16, 4, 32)
        elif not loss and not softmax and not intercept and bd == 128 and m_pad == 4:
            ept, warps, chunk, prefetch = 8, 8, 64, 1
    exact = None
    if dtype == torch.float32 and stride_xn != 1 and bd in (256, 512, 1024):
        # column chunks on rows of 256, 512 and 1024 values, two tiles ahead; H100 sweeps (hessian_probe-H100-
        # 2026-12-06-s37, -s37b, -s37h, -s37j), ms at 2M x 256 / 1M x 512 (the previous launch in brackets)
        if xtv and m_pad > 4:
            # 16 values on 4 warps, m exact: m = 5 0.697 (0.803), m = 8 0.747; 1M x 512, m = 5 0.695 (0.791)
            ept, warps, chunk, prefetch, exact = 16, 4, bd // 4, 2, True
        elif bd == 256 and loss and m <= 4:  # 8 values on 4 warps, chunks of 128: m = 3 0.880 (1.30)
            ept, warps, chunk, prefetch = 8, 4, 128, 2
        elif bd == 256 and not xtv and not loss and m <= 6:
            # the Hessian products, 16 values on 4 warps, m exact: softmax m = 3 0.693 (0.966), m = 5 0.736
            # (1.41), m = 6 in chunks of 128 0.895 (1.02 in 64: spills); plain m = 3 0.691 (1.14), m = 5 0.736
            # (1.54, padded dot); plain m = 6 8 values on 8 warps, padded to 8, in chunks of 128: 1.12 (1.65)
            ept, warps, chunk, prefetch, exact = 16, 4, 64 if m <= 5 else 128, 2, True
            if m == 6 and not softmax:
                ept, warps, exact = 8, 8, False
        elif bd == 512 and not xtv and not loss and (m <= 4 or (softmax and m == 5)):
            # 1M x 512 (hessian_probe_512-*-s37h): m <= 4 8 values on 4 warps in chunks of 256, m exact:
            # softmax m = 3 0.765 (0.907), plain m = 3 0.763 (2.07; 32 values in chunks of 128 ran 0.69 but
            # spill on 3.9); the softmax product m = 5 16 values in chunks of 128: 0.764 (1.72, the padded dot)
            ept, warps, chunk, prefetch, exact = (8, 4, 256, 2, True) if m <= 4 else (16, 4, 128, 2, True)
        elif bd == 1024 and not xtv and not loss and m <= 4:
            # 500k x 1024 (hessian_probe_1024-*-s37j): 16 values on 4 warps in chunks of 256 (a row still
            # across two warps), m exact: softmax m = 3 0.778 (0.923), plain m = 3 0.777 (1.11)
            ept, warps, chunk, prefetch, exact = 16, 4, 256, 2, True
    elif dtype in (torch.bfloat16, torch.float16) and stride_xn != 1 and bd == 256 and not loss and (
            m <= 5 if not xtv else m_pad > 4):
        # 2-byte storage (8 values per 16-byte load): 16 values on 4 warps in chunks of 128, m exact; H100,
        # bf16 2M x 256 (hessian_probe_bf16-*-s37f): softmax m = 3 0.474 (1.04), m = 5 0.657 (0.782); plain
        # m = 5 0.646 (2.14, padded dot); X^T V m = 5 0.491 (0.643). The m = 3 loss pass keeps its launch
        # (0.744; chunked 0.760). fp16 (-s37g): softmax m = 5 0.667, X^T V m = 5 0.470
        ept, warps, chunk, prefetch, exact = 16, 4, 128, 2, True
    b = torch.empty((), dtype=dtype).element_size()
    if dtype == torch.float64:
        ept = max(1, ept // 2)
    ept = max(ept, 16 // b)  # at least one 16-byte load per thread (2-byte storage: 8 values)
    bn = max(32 if stride_xn == 1 else 1, ept * 32 * warps // bd)
    programs = gpu.sm_count * max(1, gpu.max_threads_per_sm // (32 * warps))
    return replace(cfg, strategy="onchip", mode="small", m_pad=m_pad, block_n=int(bn), block_d=bd, num_warps=warps,
                   num_programs=int(programs), prefetch=prefetch, chunk=chunk, exact_m=exact)


def padded_dot(cfg: DenseConfig, rows: int | None = None) -> DenseConfig:
    """``cfg`` moved to the padded ``tl.dot`` (m padded to 16), 4 warps: tensor-core tf32x3 with
    64-row tiles for rows of at most 128 values, fp32 FMAs (ieee) with 32-row tiles (``rows``
    if given) beyond.

    For m <= 4 passes that the unrolled "small" mode does not serve or serves slower: the loss
    pass, ``t = X Y`` and ``X^T V``. H200 sweeps (``solver_ops-H200-2026-12-03-s7-a.json``; ms at
    1M x 100, m = 3 / 2M x 128, m = 4): loss pass 0.438 / 0.875 (fp32 FMA form 0.552 / 1.089,
    tf32x3 at 32 rows x 8 warps 1.15 / 2.23); matvec 0.149 / 0.260 (FMA 0.408 / 0.798); ``X^T V``
    0.196 / 0.416 (small mode 0.267 / 0.510). The Hessian product ``X^T (V ⊙ X Y)`` stays "small"
    (0.194 / 0.372 against 0.355 / 0.746 here). At 2M x 256, m = 3 (``-s7-d``) tf32x3's extra
    operand registers cost more than they save: ``X^T V`` 0.851 ms with FMAs at 32 rows (tf32x3
    1.02), matvec 0.961 with FMAs at 64 rows (tf32x3 1.43); the one-read loss pass was 4.3 ms
    there, so the solvers take two reads instead (:func:`fusedml.mmchain.lossgrad.one_read`).
    """
    narrow = cfg.block_d <= 128
    bn = rows or (64 if narrow else 32)
    # tl.dot's reduction axis (the features in X Y) is at least 16 wide on sm_90 (Triton 3.6)
    return replace(cfg, mode="dot", m_pad=16, block_n=bn, block_d=max(16, cfg.block_d), num_warps=4,
                   prefetch=False, dot_precision="tf32x3" if narrow else "ieee")


#: the matvec's one-accumulator-per-right-hand-side kernel: the model takes it on rows over 128 values
#: up to this many right-hand sides, ``[fp32, bf16 / fp16]`` (H100: fp32 faster up to m = 6, m = 7 a
#: tie, m = 8 slower; bf16 timed at m = 3 and 5, 2.2-2.6x the padded dot; fp16 takes the same path)
MATVEC_SMALL_M_PICK = (6, 5)


def matvec_config(N: int, D: int, m: int, dtype: torch.dtype, gpu: GPUInfo | None = None) -> DenseConfig:
    """Launch parameters of the dense ``X y`` kernel: the mmchain model's tile, one program per tile.

    Parameters
    ----------
    N, D, m : int
        ``X`` is ``[N, D]``, ``y`` is ``[D]`` (m = 1) or ``[D, m]``.
    dtype : torch.dtype
        Storage dtype of X.
    gpu : GPUInfo, optional
        Default :func:`gpu_info`.

    Returns
    -------
    DenseConfig
        ``num_programs``: the persistent grid (at most ``ceil(N / block_n)``). Rows over 128 values
        with 2 <= m <= :data:`MATVEC_SMALL_M_PICK` (fp32 / 2-byte storage): ``mode="small"`` (one
        register accumulator per right-hand side across 32-64-column chunks, one program per tile).
    """
    cfg = dense_config(N, D, m, dtype, gpu)
    two_byte = dtype in (torch.bfloat16, torch.float16)
    if (dtype == torch.float32 or two_byte) and 2 <= m <= MATVEC_SMALL_M_PICK[two_byte] and D > 128 \
            and cfg.strategy == "onchip":
        # rows the padded tl.dot would run as fp32 FMAs (16 per element, operands through shared
        # memory): one accumulator per right-hand side, one program per tile. H100, 2M x 256
        # (matvec_probe- / matvec_small_ab-H100-2026-12-06-s36): fp32 m = 3 0.688 ms at 32 x 64 (padded
        # dot 1.00, cuBLAS 0.929), m = 5 0.792 at 64 x 32 (0.984), m = 6 0.787 at 64 x 64 (0.977), m = 7
        # 0.988 (0.973: kept); bf16 m = 3 0.442 (1.14), m = 5 0.578 at 64 x 64 (1.27)
        bn, bd = (32, 64) if m <= 4 else (64, 64) if two_byte or m == 6 else (64, 32)
        return replace(cfg, mode="small", m_pad=1 << (m - 1).bit_length(), block_n=bn, block_d=bd, num_warps=4,
                       num_stages=3, num_programs=-(-N // bn), prefetch=False, chunk=None)
    if cfg.mode == "vector" and cfg.strategy == "onchip":
        # t only (no accumulator): twice the programs per SM (H200 sweeps, solver_ops-H200-2026-12-03-s4-*:
        # 1M x 100 0.107 ms against 0.13, 2M x 256 0.485 against 0.557, 4M x 64 0.257 against 0.285)
        cfg = replace(cfg, num_programs=2 * cfg.num_programs)
    if cfg.mode == "small":  # t only: the padded dot (fp64: 3-D broadcast) of the matvec kernel
        if dtype == torch.float64:
            return replace(cfg, mode="elementwise", prefetch=False)
        return padded_dot(cfg, rows=64)
    if cfg.mode == "dot" and cfg.dot_precision == "ieee" and cfg.strategy == "onchip":
        # t only: 64-row tiles where shared memory allows (2M x 256, m = 5: 0.962 ms against 1.04 at 16
        # rows, ops 0.956; 1M x 512: 1.06-1.10 at 16-32 rows, 64 does not fit; dot_probe-*-s12-d)
        cfg = replace(cfg, block_n=max(16, min(64, 16384 // cfg.block_d)))
    return cfg
