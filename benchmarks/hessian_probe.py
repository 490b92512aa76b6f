"""The wide-row solver passes on the unrolled ("small") kernel, swept: tiles, column chunks (``chunk``),
warps, and for ``X^T V`` and the plain product m unrolled exactly or padded (``exact_m``), beside the
library's launch and the padded ``tl.dot``, on rows of 256 (fp32, bf16, fp16), 512 and 1024 values.
The passes are the solvers' (``bench_solver_ops.passes``: intercept, L2 term; ``plain4-128`` is
bench_mmchain's matrix-y product); each point is checked against float64. ``--only NAME...`` keeps
those points and the library's (``--only`` alone: the library's launch only).

On the GPU: ms (``do_bench`` median), % of the read-once floor, registers / spills of the compile.
``--compile-only`` (no GPU, under ``TRITON_INTERPRET=1``): every point's sm_90 compile with this
machine's Triton: registers, stack bytes, the innermost loop's FFMA / shuffle / load counts.

    python benchmarks/hessian_probe.py [--cases softmax5 mul5 ...] [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/hessian_probe.py --compile-only [--cases ...]
    TRITON_INTERPRET=1 python benchmarks/hessian_probe.py --quick      # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

import _common
import bench_solver_ops
import fusedml
from tile_ab import _operands

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

_PLAIN = "X^T(V*(XY))"


def _plain(X, w, h):
    """bench_mmchain's matrix-y product ``X^T (V ⊙ (X Y))``: (callable(backend, config), float64 reference)."""
    Y = w[:-1]

    def ref():
        X64 = X.double()
        return X64.T @ (h.double() * (X64 @ Y.double()))

    return (lambda be, cfg: fusedml.mmchain(X, Y, v=h, backend=be, config=cfg)), ref


#: name -> ((N, D, m), bench_solver_ops pass or _PLAIN)
CASES = {
    "softmax5": ((2_000_000, 256, 5), "hessian softmax"),
    "softmax3": ((2_000_000, 256, 3), "hessian softmax"),
    "mul5": ((2_000_000, 256, 5), "hessian X^T(h*(Xs))"),
    "xtv5": ((2_000_000, 256, 5), "X^T v"),
    "xtv8": ((2_000_000, 256, 8), "X^T v"),
    "xtv5-512": ((1_000_000, 512, 5), "X^T v"),
    "loss5": ((2_000_000, 256, 5), "loss+grad (multinomial)"),
    "loss3": ((2_000_000, 256, 3), "loss+grad (multinomial)"),
    "softmax6": ((2_000_000, 256, 6), "hessian softmax"),
    "mul6": ((2_000_000, 256, 6), "hessian X^T(h*(Xs))"),
    "mul3": ((2_000_000, 256, 3), "hessian X^T(h*(Xs))"),
    # rows of 512 and 1024 values (m <= 4 takes the unrolled kernel's unchunked tile there)
    "softmax5-512": ((1_000_000, 512, 5), "hessian softmax"),
    "softmax3-512": ((1_000_000, 512, 3), "hessian softmax"),
    "mul3-512": ((1_000_000, 512, 3), "hessian X^T(h*(Xs))"),
    "loss3-512": ((1_000_000, 512, 3), "loss+grad (multinomial)"),
    "softmax3-1024": ((500_000, 1024, 3), "hessian softmax"),
    "mul3-1024": ((500_000, 1024, 3), "hessian X^T(h*(Xs))"),
    "loss3-1024": ((500_000, 1024, 3), "loss+grad (multinomial)"),
    # 2-byte storage on 256-value rows (the chunked fp32 launches above were not timed for it)
    "softmax5-bf16": ((2_000_000, 256, 5), "hessian softmax", torch.bfloat16),
    "softmax3-bf16": ((2_000_000, 256, 3), "hessian softmax", torch.bfloat16),
    "mul5-bf16": ((2_000_000, 256, 5), "hessian X^T(h*(Xs))", torch.bfloat16),
    "xtv5-bf16": ((2_000_000, 256, 5), "X^T v", torch.bfloat16),
    "loss3-bf16": ((2_000_000, 256, 3), "loss+grad (multinomial)", torch.bfloat16),
    "softmax5-fp16": ((2_000_000, 256, 5), "hessian softmax", torch.float16),
    "xtv5-fp16": ((2_000_000, 256, 5), "X^T v", torch.float16),
    # bench_mmchain's matrix-y case: X^T (V * (X Y)), no intercept, no z (two prefetch depths)
    "plain4-128": ((2_000_000, 128, 4), _PLAIN),
}


def points(D, m, padded, *, warps=(4, 8), ept=(8, 16, 32), chunks=None, prefetch=(2,), dtype=torch.float32):
    """The library's launch, the padded ``tl.dot`` and the unrolled kernel's grid (``config`` dicts);
    ``padded``: a form the rule pads to m_pad (``X^T V``, the plain product), also timed exact."""
    from fusedml.mmchain import launch

    base = launch.dense_config(1 << 20, D, m, dtype, launch.gpu_info())
    dot = dataclasses.asdict(launch.padded_dot(base))
    pts = [("library", None), ("padded dot", dot)] + ([("library exact=1", {"exact_m": True})] if padded else [])
    bd = 1 << (D - 1).bit_length()
    if chunks is None:  # 32 .. bd / 2, and the whole row
        chunks = tuple(1 << k for k in range(5, bd.bit_length() - 1)) + (None,)
    for w in warps:
        for e in ept:
            bn = e * 32 * w // bd
            if bn < 1:
                continue
            for ch in chunks:
                if ch is not None and ch >= bd:
                    continue
                for exact in ((False, True) if padded else (None,)):
                    for pf in prefetch:
                        cfg = {"mode": "small", "strategy": "onchip", "block_n": bn, "block_d": bd, "num_warps": w,
                               "chunk": ch, "prefetch": pf, "m_pad": 1 << (m - 1).bit_length(), "exact_m": exact}
                        name = (f"{bn}x{bd}/{ch or bd} w{w}" + ("" if exact is None else f" exact={int(exact)}")
                                + ("" if len(prefetch) == 1 else f" pf{pf}"))
                        pts.append((name, cfg))
    return pts


def _new_kernels(seen):
    """Compiled kernels of the unrolled / dot kernels not in ``seen`` (adds them)."""
    from fusedml.mmchain import dense

    out = [k for fn in (dense._mmchain_small_kernel, dense._mmchain_onchip_kernel)
           for k in _common.compiled_kernels(fn) if id(k) not in seen]
    seen.update(id(k) for k in out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--quick", action="store_true", help="tiny shapes, two points per case (CPU smoke run)")
    ap.add_argument("--compile-only", action="store_true", help="sm_90 compiles of every point, no timing")
    ap.add_argument("--only", nargs="*", default=None, help="point names to keep (besides the library's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cpu") if args.compile_only else _common.device()
    gen = torch.Generator(device=dev).manual_seed(37)
    rows, launches, seen = [], [], set()
    for case in args.cases:
        (N, D, m), pas, *rest = CASES[case]
        dtype = rest[0] if rest else torch.float32
        if args.quick or args.compile_only:
            N = 256
        X, w, y, h = _operands(N, D, m, dtype, dev, gen)
        fused, ref = _plain(X, w, h) if pas == _PLAIN else bench_solver_ops.passes(X, w, y, h, m)[pas]
        want = None if args.compile_only else ref()
        floor_ms = N * D * X.element_size() / _common.H200_BANDWIDTH * 1e3
        if pas == _PLAIN:  # m <= 4: the padded form is the m_pad = 4 unroll; one and two tiles ahead
            pts = points(D, m, False, ept=(8, 16), chunks=(16, 32, 64, None), prefetch=(1, 2))
        else:
            pts = points(D, m, "softmax" not in pas and "loss" not in pas, dtype=dtype,
                         ept=(8, 16, 32) if dtype == torch.float32 else (8, 16))
        if args.only is not None:
            pts = [p for p in pts if p[0] == "library" or p[0] in args.only]
        if args.quick:
            pts = pts[:1] + [p for p in pts if p[0].startswith(("4x", "1x"))][:2]
        for name, cfg in pts:
            row = {"case": case, "N": N, "D": D, "m": m, "point": name}
            if args.compile_only:
                from _sm90 import record_launches

                with record_launches(execute=False) as rec:
                    fused("fused", cfg)
                launches += [dict(d, origin=f"{case} {name}") for d in rec.launches]
                continue
            got = fused("fused", cfg)
            row["rel_err"] = float((got.double() - want).norm() / want.norm())
            ks = _new_kernels(seen)
            if ks:
                row["regs"] = max(k.n_regs for k in ks)
                row["spills"] = max(k.n_spills for k in ks)
            if not args.quick:
                row["ms"] = _common.bench_ms(lambda: fused("fused", cfg))
                row["%floor"] = 100 * floor_ms / row["ms"]
            rows.append(row)
            print(row, flush=True)
        del X, w, y, h
    if args.compile_only:
        from _sm90 import compile_descriptors

        for r in compile_descriptors(launches):
            ops = r.get("inner_ops", {})
            rows.append({"point": r["kernel"].split("(")[-1].rstrip(")"), "regs": r.get("regs"),
                         "stack": r.get("stack"), "FFMA": ops.get("FFMA"), "SHFL": ops.get("SHFL"),
                         "LDG": ops.get("LDG"), "LDS": ops.get("LDS"), "error": r.get("error", "")})
        print(_common.markdown_table(rows, ["point", "regs", "stack", "FFMA", "SHFL", "LDG", "LDS", "error"]))
        return 0
    print(_common.markdown_table(rows, ["case", "N", "D", "m", "point", "ms", "%floor", "regs", "spills",
                                        "rel_err"]))
    print("wrote", _common.write_json("hessian_probe", rows, out=args.out))
    return 1 if any(r["rel_err"] > 1e-5 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
