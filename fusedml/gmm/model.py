"""Applicability and launch model of the fused GMM E-step: which path, which block sizes.

One documented function, :func:`plan_launch`. The model:

* Tiles are powers of two, at least 16 on every ``tl.dot`` dimension: ``BD = max(16, 2^ceil(log2 D))``,
  ``BK = max(16, 2^ceil(log2 K))``.
* **Single sweep** keeps, per program, the statistics accumulators and the whole component axis on
  chip. Its live fp32 values (registers) are, for diag/spherical,
  ``E = 2 BK BD`` (accumulators S1, S2) ``+ 2 BD BK`` (the two weight tiles)
  ``+ BN (2 BD + 3 BK)`` (x, x^2, logits / exponentials / responsibilities);
  for full/tied ``E = BN BK`` (logits) ``+ BD^2`` (one P_k tile and one S2_k product) ``+ 4 BN BD``.
  A program of ``W`` warps has ``32 W`` threads with at most ``R = 160`` data registers each (of 255,
  the rest for addresses and loop state), so the path applies when ``E <= 32 W R`` for W in {4, 8}
  (and, for full/tied, ``K <= 64``: the per-component column insert/extract costs ``O(BN K^2)``).
  Programs per SM = ``65536 // (32 W regs)`` with ``regs = min(255, E / (32 W) + 48)``, at most 4;
  the persistent grid is ``SMs x programs-per-SM`` (never more than the row blocks).
* Otherwise the **two-pass** path: pass 1 tiles K by ``BK_tile`` (64 for BD <= 64, else 32); pass 2
  runs ``(row chunk, component tile)`` programs, chunk sizes chosen for ~8 programs per SM so that
  the tiles of one chunk run together and re-read X from L2 rather than HBM.
* Shared memory is only used by the layout conversions of ``tl.dot`` operands (at most
  ``4 (BN + BK) BD`` bytes per dot), well under the 228 KB of an H100/H200 SM for every tile above.

``path`` forces a path (a forced single sweep on a shape the model rejects still runs, with
register spills). The GPU's SM count comes from :func:`gpu_info`.
"""
from __future__ import annotations

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
        Estimated registers per thread of the single sweep.
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


def _single_elems(ct: str, BN: int, BD: int, BK: int) -> int:
    if ct in ("diag", "spherical"):
        return 4 * BK * BD + BN * (2 * BD + 3 * BK)
    return BN * BK + 2 * BD * BD + 4 * BN * BD


def plan_launch(N: int, K: int, D: int, covariance_type: str, dtype, device, *, path: str = "auto",
                precision: str = "fp32") -> Plan:
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
        Operand precision (tensor-core paths like larger row blocks).

    Returns
    -------
    Plan
    """
    info = gpu_info(device)
    sms = info["sm_count"]
    BD = _pow2(D)
    BK = _pow2(K)
    full_like = covariance_type in ("full", "tied")
    big_rows = precision != "fp32"
    fits, best = False, None
    for nw in (4, 8):
        for BN in ((128, 64, 32, 16) if big_rows else (64, 32, 16)):
            if full_like and BN < 32:
                continue
            E = _single_elems(covariance_type, BN, BD, BK)
            if E <= 32 * nw * _DATA_REGS and (not full_like or K <= 64):
                best, fits = (nw, BN, E), True
                break
        if fits:
            break
    if best is None:
        nw = 8
        BN = 32 if not full_like else 64
        best = (nw, BN, _single_elems(covariance_type, BN, BD, BK))
    nw, BN, E = best
    regs = min(255, E // (32 * nw) + 48)
    per_sm = max(1, min(4, info["regs_per_sm"] // (32 * nw * regs)))
    chosen = path if path != "auto" else ("single" if fits else "two_pass")
    if chosen == "two_pass":
        BN = 64 if BD <= 64 else 32
        nw = 4 if BD <= 32 else 8
    BK_tile = min(BK, 64 if BD <= 64 else 32)
    n_blocks = -(-N // BN)
    n_kt = K if full_like else -(-K // BK_tile)
    n_chunks = max(1, (8 * sms) // n_kt)
    chunk_rows = max(BN, -(-(-(-N // n_chunks)) // BN) * BN)
    return Plan(path=chosen, BN=BN, BD=BD, BK=BK, BK_tile=BK_tile, num_warps=nw,
                programs=max(1, min(n_blocks, sms * per_sm)), lse_programs=max(1, min(n_blocks, sms * 4)),
                chunk_rows=chunk_rows, single_fits=fits, regs_est=regs)
