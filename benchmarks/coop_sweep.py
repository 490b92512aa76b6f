"""Launch sweep of the cooperative wide-row mmchain kernel (m = 1): column block x warps x grid.

    python benchmarks/coop_sweep.py --shape 4096,65536 --out results/coop_sweep.json

Each point: ``fusedml.mmchain(X, y, v, config=...)`` timed with ``triton.testing.do_bench``
(median); ``num_programs`` is an upper bound, the launcher caps the grid to the compiled
kernel's residency. Prints one line per point and the best last.
"""
import argparse
import json

import torch
import triton

import fusedml
from fusedml.mmchain import launch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None, help="N,D (repeatable; default 4096,65536)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    sms = launch.gpu_info(dev).sm_count
    rows = []
    for shape in a.shape or ["4096,65536"]:
        N, D = map(int, shape.split(","))
        X = torch.randn(N, D, device=dev)
        y, v = torch.randn(D, device=dev), torch.rand(N, device=dev)
        floor = X.numel() * 4 / 4.28e12 * 1e3
        ref = (X.double().T @ (v.double() * (X.double() @ y.double())))
        for bd in (512, 1024, 2048, 4096):
            for w in (1, 2, 4, 8):
                if bd // (32 * w) < 4 or bd // (32 * w) > 32:
                    continue
                for per_sm, ahead in ((32, 0), (32, 1), (32, 2)):
                    cfg = {"strategy": "coop", "block_n": 1, "block_d": bd, "num_warps": w,
                           "num_programs": per_sm * sms, "prefetch": ahead}
                    f = lambda: fusedml.mmchain(X, y, v, backend="fused", config=cfg)  # noqa: E731
                    try:
                        err = float((f().double() - ref).norm() / ref.norm())
                        ms = triton.testing.do_bench(f, warmup=5, rep=30)
                    except Exception as e:  # noqa: BLE001 -- a point that does not compile is reported
                        print(shape, cfg, "error", str(e)[:100])
                        continue
                    rows.append({"shape": shape, "config": cfg, "ms": ms, "%floor": 100 * floor / ms, "rel_err": err})
                    print(f"{shape} bd={bd} w={w} P<={per_sm}/SM rows ahead={ahead + 1}: {ms:.4f} ms "
                          f"{100 * floor / ms:.1f} % err {err:.1e}", flush=True)
        best = min((r for r in rows if r["shape"] == shape), key=lambda r: r["ms"])
        print("BEST", shape, best)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
