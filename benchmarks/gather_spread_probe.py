"""Why does one CSR gather product take 0.68 ms in one process and ~1.1 ms in another (session 48)?

Session 48's ``l2_state_probe`` found no L2 state that carries over between products inside a
process, yet the same product (the 1M x 1M power-law matrix, gather, untiled) ran at 0.68 ms in
one process and 1.12 ms in the next. This script starts ``--procs`` fresh processes one after
another; each builds the same seeded matrix and vectors (after ``--pad-mib`` MiB of padding, meant to
move the vectors; on CUDA it does not: the caching allocator gives each of these large tensors its own
2 MiB-aligned segment, ``-s49b``) and times, side by side (``do_bench`` medians, ms): the fused
gather product, the "ops" product with a cached transpose (cuSPARSE: if it moves with the fused one,
the cause is the machine or the allocation, not our kernel), and a device copy of ``--copy-mib``
MiB (GB/s: clocks or memory state). Each row also names the vector's and the matrix's addresses
modulo 2 MiB (large-page placement) and the SM clock that ``nvidia-smi`` reports after the timing.

    python benchmarks/gather_spread_probe.py [--b 1000000x1000000:32:powerlaw] [--procs 4]
        [--pad-mib 0 1 3] [--out FILE]

Without CUDA it runs tiny matrices under the interpreter (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import _common  # noqa: E402


def _sm_clock_mhz():
    """The SM clock of GPU 0 in MHz as ``nvidia-smi`` reports it, or None where it cannot."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def child(spec: str, pad_mib: float, copy_mib: float) -> dict:
    """One fresh process's timings of the product on ``spec`` (see the module docstring)."""
    import fusedml

    dev = _common.device()
    cap = (500, 700) if dev.type != "cuda" else None
    pad = torch.empty(int(pad_mib * (1 << 20)) // 4 + 1, device=dev)  # (large later tensors get segments of their own)
    _, B = _common.csr_from_spec(spec, dev, cap)
    g = torch.Generator(device=dev).manual_seed(0)
    y = torch.randn(B.shape[1], generator=g, device=dev)
    v = torch.rand(B.shape[0], generator=g, device=dev)
    ref = fusedml.mmchain(B.to(dtype=torch.float64), y.double(), v.double(), backend="ops")
    fused = lambda: fusedml.mmchain(B, y, v, backend="fused", config={"strategy": "gather", "tile_bytes": 0})  # noqa: E731
    ops = lambda: fusedml.mmchain(B, y, v, backend="ops", config={"ops_transpose": "cached"})  # noqa: E731
    rel = lambda out: float((out.double() - ref).norm() / ref.norm())  # noqa: E731
    src = torch.empty(int(copy_mib * (1 << 20)) // 4, device=dev)
    dst = torch.empty_like(src)
    row = dict(pad_mib=pad_mib, fused_rel_err=rel(fused()), ops_rel_err=rel(ops()))
    row["fused_ms"] = _common.bench_ms(fused)
    row["ops_ms"] = _common.bench_ms(ops)
    row["copy_gbps"] = 2 * src.numel() * 4 / _common.bench_ms(lambda: dst.copy_(src)) / 1e6
    row["fused_ms_again"] = _common.bench_ms(fused)
    row["y_mod_2m"] = y.data_ptr() % (2 << 20)
    row["cols_mod_2m"] = B.col.data_ptr() % (2 << 20)
    row["sm_mhz"] = _sm_clock_mhz()
    del pad
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", default="1000000x1000000:32:powerlaw", help="the matrix timed")
    ap.add_argument("--procs", type=int, default=4, help="fresh processes per padding")
    ap.add_argument("--pad-mib", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    ap.add_argument("--copy-mib", type=float, default=1024.0)
    ap.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.child is not None:
        print("ROW " + json.dumps(child(args.b, args.child, args.copy_mib)))
        return None
    rows = []
    for proc in range(args.procs):
        for pad in args.pad_mib:
            cmd = [sys.executable, os.path.abspath(__file__), "--b", args.b, "--copy-mib", str(args.copy_mib),
                   "--child", str(pad)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            line = [ln for ln in res.stdout.splitlines() if ln.startswith("ROW ")]
            if res.returncode != 0 or not line:
                raise RuntimeError(f"child {cmd} failed (rc {res.returncode}):\n{res.stderr[-2000:]}")
            rows.append(dict(proc=proc, **json.loads(line[0][4:])))
            print(rows[-1], flush=True)
    cols = ["proc", "pad_mib", "fused_ms", "fused_ms_again", "ops_ms", "copy_gbps", "y_mod_2m", "cols_mod_2m",
            "sm_mhz", "fused_rel_err"]
    print(_common.markdown_table(rows, cols))
    if args.out or _common.device().type == "cuda":
        print(_common.write_json("gather_spread_probe", rows, {"args": vars(args)}, out=args.out))
    return rows


if __name__ == "__main__":
    main()
