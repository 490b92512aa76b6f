"""Where ptxas puts the unrolled kernel's loads: an sm_90 compile without a GPU (session 17).

Compiles ``_mmchain_small_kernel`` for sm_90 (``triton.compile`` with a ``GPUTarget``, Triton's own
``ptxas`` and ``cuobjdump``) with the specialisation the launcher gets (unit strides of y and v as
constants, 16-byte aligned pointers), and prints per variant the registers, spilled bytes, the
instructions of the tile loop and where in it the 16-byte loads of X (the register prefetch) are
issued. Session 17 found ptxas sinking a one-tile prefetch's loads to the end of the loop (16M x 64,
m = 3: issued at instructions 153 and 164 of 169, twice as slow as a compile issuing them at 51 of
222); the GPU's Triton is 3.6, and its ptxas can be installed next to another Triton for this:

    pip install --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 python benchmarks/sass_probe.py [--variants NAME ...] [--out FILE]

Needs Triton's NVIDIA tools (``ptxas``, ``cuobjdump``) and TRITON_INTERPRET unset.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

#: name -> (constexpr overrides, warps): the model's launches of session 17 and the m = 5 candidates
VARIANTS = {
    "softmax m3 D64 8w x 8, 2 ahead (model)": (dict(SOFTMAX=True, M_PAD=3, BLOCK_N=32, PREFETCH=2), 8),
    "softmax m3 D64 8w x 8, 1 ahead": (dict(SOFTMAX=True, M_PAD=3, BLOCK_N=32, PREFETCH=1), 8),
    "mul m4 D64 8w x 8, 2 ahead (model, m = 3 padded)": (dict(M_PAD=4, BLOCK_N=32, PREFETCH=2), 8),
    "mul m3 D64 8w x 8, 1 ahead": (dict(M_PAD=3, BLOCK_N=32, PREFETCH=1), 8),
    "loss m3 D64 4w x 8, 2 ahead (model)": (dict(LOSS=3, M_PAD=3, BLOCK_N=16, PREFETCH=2), 4),
    "plain m4 D128 16w x 4, 1 ahead (model)": (dict(INTERCEPT=False, M_PAD=4, BLOCK_D=128, BLOCK_N=16,
                                                    PREFETCH=1), 16),
    "softmax m5 D64 8w x 4, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_N=16, PREFETCH=2), 8),
    "loss m5 D64 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_N=16, PREFETCH=2), 8),
    "softmax m5 D64 8w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_N=32, PREFETCH=2), 8),
    "loss m5 D64 4w x 8, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_N=16, PREFETCH=2), 4),
    "softmax m8 D64 8w x 4, 2 ahead": (dict(SOFTMAX=True, M_PAD=8, BLOCK_N=16, PREFETCH=2), 8),
    "loss m8 D64 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=8, BLOCK_N=16, PREFETCH=2), 8),
    "softmax m5 D128 8w x 4, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_D=128, EVEN_D=False, BLOCK_N=8,
                                             PREFETCH=2), 8),
    "loss m5 D128 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_D=128, EVEN_D=False, BLOCK_N=8, PREFETCH=2), 8),
    # session 18: the m5-probe's best softmax launch (4 warps x 8 values) at other m and D
    "softmax m5 D64 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_N=16, PREFETCH=2), 4),
    "softmax m8 D64 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=8, BLOCK_N=16, PREFETCH=2), 4),
    "softmax m5 D128 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_D=128, EVEN_D=False, BLOCK_N=8,
                                             PREFETCH=2), 4),
    "softmax m8 D128 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=8, BLOCK_D=128, BLOCK_N=8, PREFETCH=2), 4),
    "softmax m5 D256 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_D=256, BLOCK_N=4, PREFETCH=2), 4),
    "mul m5 D64 4w x 8, 2 ahead": (dict(M_PAD=5, BLOCK_N=16, PREFETCH=2), 4),
    "loss m5 D256 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_D=256, BLOCK_N=4, PREFETCH=2), 8),
    "loss m3 D256 4w x 8, 2 ahead": (dict(LOSS=3, M_PAD=3, BLOCK_D=256, BLOCK_N=4, PREFETCH=2), 4),
    "loss m8 D64 4w x 8, 2 ahead": (dict(LOSS=3, M_PAD=8, BLOCK_N=16, PREFETCH=2), 4),
    "loss m6 D64 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=6, BLOCK_N=16, PREFETCH=2), 8),
    "loss m6 D64 4w x 8, 2 ahead": (dict(LOSS=3, M_PAD=6, BLOCK_N=16, PREFETCH=2), 4),
    "softmax m6 D64 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=6, BLOCK_N=16, PREFETCH=2), 4),
    "softmax m8 D256 8w x 4, 2 ahead": (dict(SOFTMAX=True, M_PAD=8, BLOCK_D=256, BLOCK_N=4, PREFETCH=2), 8),
    # column chunks (CHUNK < BLOCK_D: a thread holds BLOCK_D / CHUNK pieces of its row)
    "plain m4 D128 ch64 8w x 8, 1 ahead": (dict(INTERCEPT=False, M_PAD=4, BLOCK_D=128, BLOCK_N=16, PREFETCH=1,
                                                CHUNK=64), 8),
    "plain m4 D128 ch64 16w x 8, 1 ahead": (dict(INTERCEPT=False, M_PAD=4, BLOCK_D=128, BLOCK_N=32, PREFETCH=1,
                                                 CHUNK=64), 16),
    "plain m4 D128 ch32 4w x 16, 1 ahead": (dict(INTERCEPT=False, M_PAD=4, BLOCK_D=128, BLOCK_N=16, PREFETCH=1,
                                                 CHUNK=32), 4),
    "plain m4 D128 ch32 8w x 16, 1 ahead": (dict(INTERCEPT=False, M_PAD=4, BLOCK_D=128, BLOCK_N=32, PREFETCH=1,
                                                 CHUNK=32), 8),
    "softmax m3 D64 ch32 8w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=3, BLOCK_N=32, PREFETCH=2, CHUNK=32), 8),
    "softmax m3 D64 ch16 8w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=3, BLOCK_N=32, PREFETCH=2, CHUNK=16), 8),
    "loss m3 D64 ch32 4w x 8, 2 ahead": (dict(LOSS=3, M_PAD=3, BLOCK_N=16, PREFETCH=2, CHUNK=32), 4),
    "loss m3 D64 ch16 4w x 8, 2 ahead": (dict(LOSS=3, M_PAD=3, BLOCK_N=16, PREFETCH=2, CHUNK=16), 4),
    "softmax m5 D64 ch32 4w x 8, 2 ahead": (dict(SOFTMAX=True, M_PAD=5, BLOCK_N=16, PREFETCH=2, CHUNK=32), 4),
    "loss m5 D64 ch32 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_N=16, PREFETCH=2, CHUNK=32), 8),
    "loss m5 D64 ch16 8w x 4, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_N=16, PREFETCH=2, CHUNK=16), 8),
    # the model's chunked launches (session 18, chunk_probe-*-s18-e)
    "softmax m3 D64 ch16 4w x 16, 2 ahead (model)": (dict(SOFTMAX=True, M_PAD=3, BLOCK_N=32, PREFETCH=2,
                                                         CHUNK=16), 4),
    "loss m3 D64 ch32 4w x 8, 2 ahead (model)": (dict(LOSS=3, M_PAD=3, BLOCK_N=16, PREFETCH=2, CHUNK=32), 4),
    "loss m3 D128 ch32 4w x 16, 2 ahead (model)": (dict(LOSS=3, M_PAD=3, BLOCK_D=128, EVEN_D=False, BLOCK_N=16,
                                                       PREFETCH=2, CHUNK=32), 4),
    "softmax m5 D64 ch16 4w x 16, 2 ahead (model)": (dict(SOFTMAX=True, M_PAD=5, BLOCK_N=32, PREFETCH=2,
                                                         CHUNK=16), 4),
    "softmax m5 D128 ch32 4w x 16, 2 ahead (model)": (dict(SOFTMAX=True, M_PAD=5, BLOCK_D=128, EVEN_D=False,
                                                          BLOCK_N=16, PREFETCH=2, CHUNK=32), 4),
    "loss m5 D64 ch32 4w x 8, 2 ahead (model)": (dict(LOSS=3, M_PAD=5, BLOCK_N=16, PREFETCH=2, CHUNK=32), 4),
    "loss m5 D128 ch32 4w x 16, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_D=128, EVEN_D=False, BLOCK_N=16,
                                                PREFETCH=2, CHUNK=32), 4),
    "loss m5 D128 ch64 8w x 8, 2 ahead": (dict(LOSS=3, M_PAD=5, BLOCK_D=128, EVEN_D=False, BLOCK_N=16,
                                               PREFETCH=2, CHUNK=64), 8),
}


def compile_variant(over, warps):
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fusedml.mmchain import dense

    fn = dense._mmchain_small_kernel
    consts = dict(stride_xd=1, stride_ym=1, stride_vm=1, XTY=False, HAS_V=True, SOFTMAX=False, INTERCEPT=True,
                  DETERMINISTIC=False, EVEN_D=True, VEC=4, MODE=3, ACC=tl.float32, BLOCK_D=64, LOSS=0,
                  HAS_C=False, STORE_ETA=False)
    consts.update(over)
    consts.setdefault("CHUNK", consts["BLOCK_D"])  # one column chunk: the 2-D tile
    ints = {"N", "D", "M", "n_tiles", "stride_xn", "stride_yd", "stride_vn"}
    sig, attrs = {}, {}
    for i, a in enumerate(fn.arg_names):
        if a in consts:
            sig[a] = "constexpr"
            continue
        sig[a] = ("i32" if a in ints else "fp32" if a.startswith(("alpha", "power")) else
                  "*fp64" if a == "LPART" else "*fp32")
        if sig[a].startswith("*") or a in ("stride_xn", "D"):
            attrs[(i,)] = [["tt.divisibility", 16]]  # what the launcher specialises for aligned X
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps))


def loop_report(sass_text):
    """``(instructions of the longest backward-branch loop, positions of its LDG.E.128, opcode counts)``."""
    ins = [(int(m.group(1), 16), m.group(2)) for ln in sass_text.splitlines()
           for m in [re.match(r"\s+/\*([0-9a-f]{4})\*/\s+(.*)", ln)] if m]
    best = None
    for a, text in ins:
        m = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and (best is None or a - int(m.group(1), 16) > best[1] - best[0]):
            best = (int(m.group(1), 16), a)
    body = [t for a, t in ins if best and best[0] <= a <= best[1]]
    ops = collections.Counter(re.sub(r"^(@!?U?P\w+\s+)", "", t).split()[0] for t in body)
    return len(body), [i for i, t in enumerate(body) if "LDG.E.128" in t], dict(sorted(ops.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=None, help=f"among: {'; '.join(VARIANTS)}")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: this compiles for sm_90")
    import triton
    from _sm90 import resource_usage, sass

    rows = []
    for name in args.variants or list(VARIANTS):
        over, warps = VARIANTS[name]
        k = compile_variant(over, warps)
        regs, stack = resource_usage(k)
        n, ldg, ops = loop_report(sass(k))
        rows.append({"variant": name, "registers": regs, "spill_bytes": stack, "loop_instructions": n,
                     "x_loads_at": ldg, "ops": ops})
        print(f"{name}: {regs} registers, {stack} B spilled, loop {n} instructions, X loads at {ldg}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"triton": triton.__version__, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
