"""Issue 4: whole ``fit`` per estimator, backend="fused" vs backend="ops" on the same GPU and data,
and scikit-learn on the CPU.

Grid (defaults, float32, seeded synthetic data built on the GPU):

* dense ``1M x 100``: logistic (binary), multinomial logistic (5 classes), LinearSVC, Poisson,
  Gamma, Ridge;
* CSR ``1M x 100k``, power-law rows with 32 nnz on average: logistic, LinearSVC, Poisson, Ridge;
* Gaussian mixture ``1M x 16``, K = 16, diagonal covariances;
* large dense cases, where one read of X is no longer dwarfed by the per-iteration overhead
  (Python, small launches, host syncs): ``2M x 256`` (2 GB fp32) and ``4M x 64`` (1 GB) for
  logistic, LinearSVC, Poisson and Ridge (``--large``; scikit-learn probed with its own, smaller
  budget ``--large-sklearn-budget``).

Every fusedml row also carries the operator counts of its last fit (from the estimator's
``_fit_info``): ``n_lossgrad`` (fused loss-and-gradient passes, one read each: the objective,
gradient and Hessian weights of a Newton / L-BFGS evaluation, which the other backends compose from
a matvec and an ``X^T v``), ``n_matvec``, ``n_mmchain`` (of which ``n_xtv`` with ``y=None``), and
``x_reads``, the passes over X they imply on that backend (matvec and ``X^T v``: one each on
every backend; a full ``X^T (v * (X y))``: one on "fused", two on "ops"), with ``ms_per_x_read`` = time /
x_reads (close to the bandwidth floor only when the overhead per iteration is small);
"cpu" is one-pass like "fused".

Every backend gets the same hyper-parameters, ``max_iter`` and ``tol``; each fused/ops timing is
the median of ``--repeat`` fits after an untimed 2-iteration warm-up fit (compilation, handles,
the ops backend's cached CSR transpose). Rows also give the time to a common objective (the
worst final objective among fused/ops, read from ``history_``). scikit-learn runs once on the
host copy; when a subsample probe predicts more than ``--sklearn-budget`` seconds it is fitted
on the subsample only and its time is scaled by rows (the row says so).

Writes ``benchmarks/results/end_to_end-<gpu>-<date>.json`` (via ``benchmarks/_common.py``), the
plots in a folder of the same stem, and prints the markdown tables last.

    python benchmarks/bench_end_to_end.py              # full GPU run (about 1.5-2 minutes on an H200)
    python benchmarks/bench_end_to_end.py --parts large --repeat 3   # only the large dense part
    python benchmarks/bench_end_to_end.py --quick      # CPU smoke run, small data
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # the repository root: fusedml, algorithms, datasets

import _common  # noqa: E402

from fusedml import bench  # noqa: E402

DENSE_ALGOS = ["logistic", "logistic-multinomial", "linearsvc", "poisson", "gamma", "ridge"]
CSR_ALGOS = ["logistic", "logistic-multinomial", "linearsvc", "poisson", "ridge"]
LARGE_ALGOS = ["logistic", "logistic-multinomial", "linearsvc", "poisson", "ridge"]
# the last is GPU-bound (4.1 GB; a fit reads X 15-30 times): there the passes, not the host, set the ratio
LARGE_DENSE = ["2000000x256", "4000000x64", "16000000x64"]


def _shape(text):
    try:
        n, d = (int(s) for s in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxD (e.g. 2000000x256), got {text!r}") from None
    if n < 1 or d < 1:
        raise argparse.ArgumentTypeError(f"N and D must be positive, got {text!r}")
    return n, d


def operator_counts(info, backend, seconds):
    """X passes of one fit from the estimator's ``_fit_info`` counts.

    Parameters
    ----------
    info : dict
        ``_fit_info`` of a fitted linear model (``n_matvec``, ``n_mmchain``, ``n_xtv``,
        ``n_lossgrad``).
    backend : str
        "ops" reads X twice for a full chain (``X y`` then ``X^T p``); "fused" and "cpu" once.
    seconds : float
        Time of the fit.

    Returns
    -------
    dict
        ``n_matvec``, ``n_mmchain``, ``n_xtv``, ``x_reads``, ``ms_per_x_read`` (empty when the
        estimator records no counts, e.g. the Gaussian mixture).
    """
    if not info or "n_mmchain" not in info or "n_xtv" not in info:
        return {}
    nmv, nmm, nxtv = int(info.get("n_matvec", 0)), int(info["n_mmchain"]), int(info["n_xtv"])
    nlg = int(info.get("n_lossgrad", 0))  # fused loss-and-gradient passes: one read each
    per_chain = 2 if backend == "ops" else 1
    reads = nmv + nxtv + per_chain * (nmm - nxtv) + nlg
    return {"n_matvec": nmv, "n_mmchain": nmm, "n_xtv": nxtv, "n_lossgrad": nlg, "x_reads": reads,
            "ms_per_x_read": 1e3 * seconds / reads if reads else None}


class _RecordCounts:
    """Context manager: every fusedml row returned by ``bench._run_fusedml`` gets the operator
    counts of its last timed fit (the estimator is caught where ``bench`` builds it)."""

    def __enter__(self):
        self._make, self._run = bench._make_estimator, bench._run_fusedml
        last = {}

        def make(cls, backend, params):
            est = self._make(cls, backend, params)
            last["est"] = est
            return est

        def run(cls, algo, backend, *args, **kwargs):
            out = self._run(cls, algo, backend, *args, **kwargs)
            out.update(operator_counts(getattr(last.get("est"), "_fit_info", None), backend, out["time"]))
            return out

        bench._make_estimator, bench._run_fusedml = make, run
        return self

    def __exit__(self, *exc):
        bench._make_estimator, bench._run_fusedml = self._make, self._run
        return False


def counts_table(rows):
    """Markdown table of the operator counts of the fusedml rows."""
    out = ["| dataset | algorithm | backend | iters | loss+grad | matvec | mmchain (y=None) | X reads | time (s) | ms / X read |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "x_reads" not in r:
            continue
        ms = r.get("ms_per_x_read")
        out.append(f"| {r['dataset']} | {r['algorithm']} | {r['backend']} | {r.get('iterations')} | {r.get('n_lossgrad', 0)} | {r['n_matvec']} | "
                   f"{r['n_mmchain']} ({r['n_xtv']}) | {r['x_reads']} | {r['time']:.4g} | "
                   f"{'-' if ms is None else f'{ms:.3f}'} |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke run on small data (cpu/ops/sklearn backends)")
    p.add_argument("--rows", type=int, default=1_000_000, help="N of every data set")
    p.add_argument("--dense-d", type=int, default=100)
    p.add_argument("--csr-d", type=int, default=100_000)
    p.add_argument("--nnz-per-row", type=float, default=32)
    p.add_argument("--profile", default="powerlaw", choices=["uniform", "constant", "powerlaw"])
    p.add_argument("--gmm-d", type=int, default=16)
    p.add_argument("--gmm-k", type=int, default=16)
    p.add_argument("--parts", nargs="+", default=["dense", "csr", "gmm", "large"],
                   choices=["dense", "csr", "gmm", "large"])
    p.add_argument("--large", nargs="+", type=_shape, default=[_shape(s) for s in LARGE_DENSE], metavar="NxD",
                   help=f"shapes of the large dense part (default {' '.join(LARGE_DENSE)})")
    p.add_argument("--classes", type=int, default=5,
                   help="classes of the synthetic multinomial data (default 5; m <= 4 takes the unrolled kernel)")
    p.add_argument("--large-sklearn-budget", type=float, default=5.0,
                   help="--sklearn-budget of the large dense part (its scikit-learn fits are mostly probes)")
    p.add_argument("--algorithms", nargs="+", choices=list(bench.ALGORITHMS),
                   help="restrict to these algorithms")
    p.add_argument("--backends", nargs="+", choices=list(bench.BACKENDS),
                   help="default: fused ops sklearn on a GPU; cpu ops sklearn with --quick")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-iter", type=int, help="override every algorithm's max_iter (same for all backends)")
    p.add_argument("--tol", type=float, help="override every algorithm's tol (same for all backends)")
    p.add_argument("--sklearn-budget", type=float, default=60.0,
                   help="seconds above which scikit-learn is fitted on a subsample (time scaled by rows)")
    p.add_argument("--out", help="JSON path (default benchmarks/results/end_to_end-<gpu>-<date>.json)")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)

    import torch

    if args.quick:
        device = "cpu"
        n = min(args.rows, 20_000)
        csr_d, gmm_k = min(args.csr_d, 2_000), min(args.gmm_k, 4)
        dense_d, gmm_d = min(args.dense_d, 20), min(args.gmm_d, 8)
        backends = args.backends or ["cpu", "ops", "sklearn"]
        repeat = 1
    else:
        if not torch.cuda.is_available():
            p.error("no CUDA GPU: run on a GPU machine, or pass --quick for the CPU smoke run")
        device = "cuda"
        n, csr_d, gmm_k, dense_d, gmm_d = args.rows, args.csr_d, args.gmm_k, args.dense_d, args.gmm_d
        backends = args.backends or ["fused", "ops", "sklearn"]
        repeat = args.repeat
    specs, pairs = [], set()
    if "dense" in args.parts:
        s = f"synthetic-dense:{n}x{dense_d}"
        specs.append(s)
        pairs |= {(s, a) for a in DENSE_ALGOS}
    if "csr" in args.parts:
        s = f"synthetic-csr:{n}x{csr_d}:{args.nnz_per_row:g}:{args.profile}"
        specs.append(s)
        pairs |= {(s, a) for a in CSR_ALGOS}
    if "gmm" in args.parts:
        s = f"synthetic-gmm:{n}x{gmm_d}:{gmm_k}"
        specs.append(s)
        pairs.add((s, "gmm"))
    large_specs, large_pairs = [], set()
    if "large" in args.parts:
        for ln, ld in args.large:
            if args.quick:  # the smoke run keeps the shapes' aspect, at CPU size
                ln, ld = min(ln, 20_000), min(ld, 64)
            s = f"synthetic-dense:{ln}x{ld}"
            if s not in large_specs and s not in specs:
                large_specs.append(s)
                large_pairs |= {(s, a) for a in LARGE_ALGOS}
    algos = [a for a in bench.ALGORITHMS if args.algorithms is None or a in args.algorithms]
    t0 = time.perf_counter()
    rows = []
    with _RecordCounts():
        for sp, pr, budget in ((specs, pairs, args.sklearn_budget), (large_specs, large_pairs, args.large_sklearn_budget)):
            if sp:
                rows += bench.run_grid(algos, sp, backends, repeat=repeat, device=device, dtype="float32",
                                       max_iter=args.max_iter, tol=args.tol, seed=0, pairs=pr,
                                       sklearn_budget=budget if budget > 0 else None, n_classes=args.classes)
    wall = time.perf_counter() - t0
    path = _common.write_json("end_to_end", rows, extra={"args": vars(args), "wall_s": wall}, out=args.out)
    print(f"wrote {path}")
    if not args.no_plots:
        plot_dir = os.path.splitext(path)[0]
        os.makedirs(plot_dir, exist_ok=True)
        for f in bench.plot(rows, plot_dir):
            print(f"wrote {f}")
    print(f"\nwall time {wall:.1f} s on {bench.device_name(device)}\n")
    print(bench.summary_table(rows))
    print(bench.markdown_table(rows))
    print()
    print(counts_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
