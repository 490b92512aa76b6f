"""Run one fused GMM E-step configuration a few times, for Nsight Compute (``ncu``) to profile.

    ncu --kernel-name regex:_diag_single --launch-skip 1 --launch-count 1 --section SpeedOfLight \\
        python benchmarks/ncu_gmm.py --shape 4194304,16,16 --precision fp32 [--plan '{"BN": 64}']

Prints the plan that ran and the median ms (``do_bench``) so that each profile is tied to a time.
Without CUDA it runs under the Triton interpreter (a smoke test on tiny shapes; one timed call).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gmm import make_problem  # noqa: E402
from fusedml.gmm._prep import validate  # noqa: E402
from fusedml.gmm.fused import _estep_plan, _operands  # noqa: E402
from fusedml.gmm.model import plan_launch  # noqa: E402


def main(argv=None):
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="N,D,K")
    ap.add_argument("--cov", default="diag")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--path", default="auto")
    ap.add_argument("--plan", default="{}", help="JSON overrides of the Plan fields")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    N, D, K = (int(v) for v in args.shape.split(","))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    X, w, mu, pc = make_problem(N, D, K, args.cov, dev)
    prep = validate(X, w, mu, pc, args.cov, check_finite=False)
    ops = _operands(prep)
    plan = plan_launch(N, K, D, args.cov, X.dtype, dev, path=args.path, precision=args.precision)
    plan = replace(plan, **json.loads(args.plan))
    for _ in range(args.reps):
        _estep_plan(prep, False, args.precision, plan, ops)
    if dev.type == "cuda":
        import triton.testing

        torch.cuda.synchronize()
        ms = triton.testing.do_bench(lambda: _estep_plan(prep, False, args.precision, plan, ops), rep=20)
    else:
        t0 = time.perf_counter()
        _estep_plan(prep, False, args.precision, plan, ops)
        ms = 1e3 * (time.perf_counter() - t0)
    row = {"shape": [N, D, K], "cov": args.cov, "precision": args.precision, "ms": ms, "plan": asdict(plan)}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
