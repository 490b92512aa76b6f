"""Run one dense ``mmchain`` configuration a few times, for Nsight Compute (``ncu``) to profile.

    ncu --kernel-name regex:_mmchain_small --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/ncu_mmchain.py --shape 2000000,128,4 [--dtype bfloat16] [--config '{"block_n": 32}']

The problem is the Hessian product ``X^T (v ⊙ X y)`` (``v`` [N, m]). Prints the launch that ran and
the median ms (``_common.bench_ms``: ``do_bench``'s median) so that each profile is tied to a time.
Without CUDA it runs under the Triton interpreter (a smoke test on tiny shapes; one timed call).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import bench_ms  # noqa: E402


def main(argv=None):
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import fusedml
    from fusedml.mmchain import dense
    from fusedml.mmchain._checks import prepare_mmchain

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
    ms = bench_ms(call, rep=20)
    # the launch that ran: the model's pick after the per-problem rules and the overrides
    P = prepare_mmchain(X, y, v, None, 1.0, 0.0, intercept=False, v_op="mul", check_finite=False)
    cfg = dense._config(P, config or None)
    row = {"shape": [N, D, m], "dtype": args.dtype, "ms": ms, "config": repr(cfg)}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
