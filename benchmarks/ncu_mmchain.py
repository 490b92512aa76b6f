"""Run one dense ``mmchain`` configuration a few times, for Nsight Compute (``ncu``) to profile.

    ncu --kernel-name regex:_mmchain_small --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/ncu_mmchain.py --shape 2000000,128,4 [--dtype bfloat16] [--config '{"block_n": 32}']

The problem is the Hessian product ``X^T (v ⊙ X y)`` (``v`` [N, m]). Prints the launch that ran and
the median ms (``do_bench``) so that each profile is tied to a time. Without CUDA it runs under
the Triton interpreter (a smoke test on tiny shapes; one timed call).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import fusedml
    from fusedml.mmchain import launch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="N,D,m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--config", default="{}", help="JSON overrides of the DenseConfig fields")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    N, D, m = (int(v) for v in args.shape.split(","))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=dev).manual_seed(0)
    X = torch.randn(N, D, device=dev, generator=g).to(getattr(torch, args.dtype))
    y = torch.randn(D, m, device=dev, generator=g) if m > 1 else torch.randn(D, device=dev, generator=g)
    v = torch.rand(N, m, device=dev, generator=g) if m > 1 else torch.rand(N, device=dev, generator=g)
    config = json.loads(args.config)

    def call():
        return fusedml.mmchain(X, y, v, backend="fused", config=config or None)

    for _ in range(args.reps):
        call()
    if dev.type == "cuda":
        import triton.testing

        torch.cuda.synchronize()
        ms = triton.testing.do_bench(call, rep=20)
    else:
        t0 = time.perf_counter()
        call()
        ms = 1e3 * (time.perf_counter() - t0)
    cfg = launch.dense_config(N, D, m, X.dtype, launch.gpu_info(dev)).with_overrides(config)
    row = {"shape": [N, D, m], "dtype": args.dtype, "ms": ms, "config": repr(cfg)}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
