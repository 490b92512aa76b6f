"""Does one CSR product leave the GPU's L2 in a state that slows a later one (session 47, ``-s47i``)?

In ``csr_tiles_scatter-H100-*-s47i`` the gather strategy on a 1M-column power-law matrix took 1.58 ms
after the scatter strategy had run on a 4M-column matrix, against 0.676 ms in ``-s47f`` (no scatter
calls). One candidate: the row kernels gather with ``evict_last``, and lines so marked could outlive
their kernels (and their freed vectors) in L2. This script times the product on matrix B (``do_bench``
medians, ms) in one process:

1. first, 2. after the products on matrix A (``--a-strategy``), 3. again, 4. after a copy that streams
``--flush`` x the L2 size with default eviction, 5. after dropping A and its cached copies.

    python benchmarks/l2_state_probe.py [--a 1000000x4000000:32:powerlaw] [--b 1000000x1000000:32:powerlaw]
        [--a-strategy scatter] [--out FILE]

Without CUDA it runs tiny matrices under the interpreter (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _common  # noqa: E402
import fusedml  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="1000000x4000000:32:powerlaw", help="the matrix run in between")
    ap.add_argument("--b", default="1000000x1000000:32:powerlaw", help="the matrix timed")
    ap.add_argument("--a-strategy", default="scatter", choices=["scatter", "gather"])
    ap.add_argument("--flush", type=float, default=2.0, help="bytes streamed by the flush, in L2 sizes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    cap = (500, 700) if dev.type != "cuda" else None  # a smoke run under the interpreter
    A, B = (_common.csr_from_spec(spec, dev, cap)[1] for spec in (args.a, args.b))
    g = torch.Generator(device=dev).manual_seed(0)
    vec = lambda M: (torch.randn(M.shape[1], generator=g, device=dev), torch.rand(M.shape[0], generator=g,  # noqa: E731
                                                                                 device=dev))
    ya, va = vec(A)
    yb, vb = vec(B)
    ref = fusedml.mmchain(B.to(dtype=torch.float64), yb.double(), vb.double(), backend="ops")
    on_b = lambda: fusedml.mmchain(B, yb, vb, backend="fused", config={"strategy": "gather", "tile_bytes": 0})  # noqa: E731
    on_a = lambda A=A, y=ya, v=va: fusedml.mmchain(A, y, v, backend="fused",  # noqa: E731
                                                   config={"strategy": args.a_strategy})
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if dev.type == "cuda" else 1 << 20
    rows = []

    def timed(step):
        out = on_b()
        err = float((out.double() - ref).norm() / ref.norm())
        rows.append(dict(step=step, ms=_common.bench_ms(on_b), rel_err=err))

    timed("first")
    on_a()
    _common.bench_ms(on_a)
    timed(f"after A ({args.a_strategy})")
    timed("again")
    src = torch.empty(int(args.flush * l2) // 4, device=dev)
    torch.empty_like(src).copy_(src)
    timed(f"after a {args.flush:g} x L2 copy")
    del A, ya, va, on_a, src
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    timed("after dropping A")
    print(_common.markdown_table(rows, ["step", "ms", "rel_err"]))
    if args.out or dev.type == "cuda":
        print(_common.write_json("l2_state_probe", rows, {"args": vars(args)}, out=args.out))
    return rows


if __name__ == "__main__":
    main()
