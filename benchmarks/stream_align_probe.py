"""Probe: a streamed matrix's resident rows as they are against padded to whole 16-byte vectors.

``StreamedMatrix(align_rows=...)`` (session 43): with every chunk resident, the resident matrix is
one device matrix; rows of e.g. 55 or 13 float32 values are read by the fused kernels with scalar
loads unless they are padded (``align_rows=True``, the default on CUDA), which costs no extra pass
(the upload writes the padded rows) and ``D_pad / D`` of the memory. Per shape this times, side by
side in one run, ``mmchain`` (``X^T (v * X y)``), ``matvec`` and a diag ``gmm_estep`` (K = 8) on the
streamed matrix with ``align_rows=False`` / ``True`` and on the in-memory tensor as given / its
``fusedml.aligned_rows`` view, against the read-once floor of the unpadded X (bytes / the H200's
4.28 TB/s; on other GPUs only a scale), with each result's relative difference from the
in-memory float64 one.

    python benchmarks/stream_align_probe.py [--shapes 2000000x55 4000000x13 ...] [--out FILE]
    TRITON_INTERPRET=1 python benchmarks/stream_align_probe.py --quick   # CPU smoke run, tiny shapes
"""
from __future__ import annotations

import argparse
import os
import sys

if "--quick" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import dask.array as da  # noqa: E402

import fusedml  # noqa: E402
from fusedml.streaming import StreamedMatrix  # noqa: E402

SHAPES = ["2000000x55", "4000000x13", "1000000x101", "2000000x54", "2000000x56"]


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).double().cpu(), torch.as_tensor(b).double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", nargs="*", default=SHAPES, help="NxD cases (float32)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    rows = []
    for spec in args.shapes:
        N, D = (int(t) for t in spec.split("x"))
        if args.quick:
            N = 96
        g = torch.Generator().manual_seed(N + D)
        A = torch.randn(N, D, generator=g)
        X = da.from_array(A.numpy(), chunks=(-(-N // 4), D))
        At = A.to(dev)
        y, v = torch.randn(D, generator=g).to(dev), torch.rand(N, generator=g).to(dev)
        K = 8
        w = np.full(K, 1.0 / K)
        mu = A[torch.randperm(N, generator=g)[:K]].double().numpy()
        pc = np.ones((K, D))
        Ad = At.double()
        refs = {"mmchain": Ad.T @ (v.double() * (Ad @ y.double())), "matvec": Ad @ y.double(),
                "gmm_estep": fusedml.gmm_estep(Ad, w, mu, pc, "diag", backend="cpu" if dev.type == "cpu" else "auto").s1}
        del Ad
        passes = {
            "mmchain": lambda M: fusedml.mmchain(M, y, v, backend="fused"),
            "matvec": lambda M: fusedml.matvec(M, y, backend="fused"),
            "gmm_estep": lambda M: fusedml.gmm_estep(M, w, mu, pc, "diag", backend="fused", check_finite=False).s1,
        }
        floor_ms = N * D * 4 / _common.H200_BANDWIDTH * 1e3
        variants = [("streamed, align_rows=False", StreamedMatrix(X, device=dev, align_rows=False)),
                    ("streamed, align_rows=True", StreamedMatrix(X, device=dev, align_rows=True)),
                    ("in memory, as given", At), ("in memory, aligned_rows", fusedml.aligned_rows(At))]
        for name, fn in passes.items():
            for variant, M in variants:
                R = M.resident_matrix if isinstance(M, StreamedMatrix) else M
                ms = _common.bench_ms(lambda: fn(M))
                rows.append({"N": N, "D": D, "pass": name, "variant": variant, "row_stride": R.stride(0), "ms": ms,
                             "floor_pct": 100 * floor_ms / ms, "rel_err": _rel(fn(M), refs[name])})
        for _, M in variants:
            if isinstance(M, StreamedMatrix):
                M.close()
        del variants, At
    cols = ["N", "D", "pass", "variant", "row_stride", "ms", "floor_pct", "rel_err"]
    path = _common.write_json("stream_align_probe", rows, {"args": vars(args)}, out=args.out)
    print(_common.markdown_table(rows, cols))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
