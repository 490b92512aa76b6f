"""The ``fusedml`` command line: ``demo``, ``bench``, ``info``, ``datasets``.

Errors a user can cause (unknown dataset, missing file, no GPU for ``--device cuda``, bad
arguments) print one line ``fusedml: error: ...`` and exit with code 2; set ``FUSEDML_DEBUG=1``
for the traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

DEMO_PAIRS = [
    ("breast_cancer", "logistic"),
    ("digits", "logistic-multinomial"),
    ("wine", "logistic-multinomial"),
    ("breast_cancer", "linearsvc"),
    ("randhie", "poisson"),
    ("grunfeld", "gamma"),
    ("grunfeld", "ridge"),
    ("randhie", "ridge"),
    ("iris", "gmm"),
    ("wine", "gmm"),
]
#: The reduced demo (hidden ``--quick`` flag or ``FUSEDML_DEMO_QUICK=1``), for tests and smoke runs.
QUICK_PAIRS = [("breast_cancer", "logistic"), ("iris", "gmm")]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message):  # noqa: D102 - argparse hook
        self.exit(2, f"fusedml: error: {message} (see '{self.prog} --help')\n")


def _default_device():
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _has_sklearn():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def _check_device(device):
    from .bench import BenchError

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise BenchError("--device cuda requested but no CUDA GPU is available "
                             "(use --device cpu)")


def cmd_demo(args) -> int:
    """Train every estimator on the bundled data with each backend and print a table.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``demo`` arguments.

    Returns
    -------
    int
        Process exit status.
    """
    from . import bench

    device = args.device or _default_device()
    _check_device(device)
    quick = args.quick or os.environ.get("FUSEDML_DEMO_QUICK", "0") not in ("", "0")
    pairs = QUICK_PAIRS if quick else DEMO_PAIRS
    if device == "cuda":
        backends = ["fused", "ops"]
        note = "fusedml backends on the GPU: 'fused' (Triton kernels) and 'ops' (cuBLAS/cuSPARSE baseline)."
    else:
        backends = ["cpu", "ops"]
        note = ("No GPU: fusedml runs its 'cpu' (cache-blocked one-pass) and 'ops' (torch operator) "
                "backends. The 'fused' Triton kernels would run here only under the Triton "
                "interpreter (TRITON_INTERPRET=1), far too slowly for a demo; they are skipped.")
    if _has_sklearn():
        backends.append("sklearn")
    else:
        note += " scikit-learn is not installed: no scikit-learn column."
    _check_out(args.out)
    print(f"fusedml demo on {bench.device_name(device)}")
    print(note)
    print(f"{len(pairs)} (dataset, algorithm) pairs x backends {', '.join(backends)}; bundled data, "
          "standardized features.\n", flush=True)
    t0 = time.perf_counter()
    dsets = list(dict.fromkeys(d for d, _ in pairs))
    algos = list(dict.fromkeys(a for _, a in pairs))
    rows = bench.run_grid(algos, dsets, backends, repeat=args.repeat, device=device,
                          dtype=args.dtype, progress=None if args.quiet else sys.stderr,
                          pairs=set(pairs), sklearn_budget=None)
    print(bench.markdown_table(rows))
    if args.out:
        for p in bench.write_results(rows, args.out, plots=not args.no_plots):
            print(f"wrote {p}")
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_bench(args) -> int:
    """Run the end-to-end grid and write JSON, markdown and PNG plots.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``bench`` arguments.

    Returns
    -------
    int
        Process exit status.
    """
    from . import bench

    device = args.device or _default_device()
    _check_device(device)
    if args.datasets:
        dsets = args.datasets
    elif device == "cuda":
        dsets = ["synthetic-dense:1000000x100", "synthetic-csr:1000000x100000:32:powerlaw",
                 "synthetic-gmm:1000000x16:16"]
    else:
        dsets = ["breast_cancer", "digits", "randhie", "grunfeld", "iris"]
    if args.backends:
        backends = args.backends
    else:
        backends = (["fused", "ops"] if device == "cuda" else ["cpu", "ops"]) + (["sklearn"] if _has_sklearn() else [])
    if "fused" in backends and device == "cpu":
        from ._dispatch import interpret_mode

        if not interpret_mode():
            raise bench.BenchError("backend 'fused' on --device cpu needs TRITON_INTERPRET=1 "
                                   "(the Triton interpreter; slow) -- use --device cuda or drop 'fused'")
    algos = args.algorithms or list(bench.ALGORITHMS)
    # Validate every argument, dataset spec and the output folder before any (possibly long) fit.
    if args.tol is not None and not args.tol > 0:
        raise bench.BenchError(f"--tol must be positive, got {args.tol}")
    if args.max_iter is not None and args.max_iter < 1:
        raise bench.BenchError(f"--max-iter must be >= 1, got {args.max_iter}")
    for d in dsets:
        bench.parse_dataset(d)
    _check_out(args.out)
    rows = bench.run_grid(algos, dsets, backends, repeat=args.repeat, device=device, dtype=args.dtype,
                          max_iter=args.max_iter, tol=args.tol, n_samples=args.n_samples, seed=args.seed,
                          sklearn_budget=None if args.sklearn_budget <= 0 else args.sklearn_budget,
                          progress=None if args.quiet else sys.stderr)
    paths = bench.write_results(rows, args.out, plots=not args.no_plots)
    print(bench.markdown_table(rows))
    for p in paths:
        print(f"wrote {p}")
    return 0


def _check_out(out) -> None:
    """Create the output folder now, so that a bad ``--out`` fails before the fits, not after."""
    if out is None:
        return
    from .bench import BenchError

    if os.path.exists(out) and not os.path.isdir(out):
        raise BenchError(f"--out {out!r} is an existing file, not a folder")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise BenchError(f"--out {out!r}: cannot create the folder ({e.strerror or e})") from None
    if not os.access(out, os.W_OK):
        raise BenchError(f"--out {out!r}: the folder is not writable")


def cmd_info(args) -> int:
    """Print the GPU, the launch model's choice for a shape, the dispatch rule's choice, versions.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``info`` arguments.

    Returns
    -------
    int
        Process exit status.
    """
    import torch

    from . import bench
    from ._dispatch import interpret_mode, resolve_backend
    from .bench import BenchError
    from .mmchain.launch import dense_config, gpu_info

    N, D = args.shape
    if N < 1 or D < 1:
        raise BenchError(f"--shape needs two positive integers, got {N} {D}")
    from .mmchain._checks import MAX_M

    if not 1 <= args.m <= MAX_M:
        raise BenchError(f"--m must be between 1 and {MAX_M} (the columns mmchain takes), got {args.m}")
    csr_arg = None
    if args.csr is not None:
        try:
            k = float(args.csr[0])
        except ValueError:
            k = -1.0
        profile = args.csr[1] if len(args.csr) > 1 else "uniform"
        if not k > 0 or len(args.csr) > 2 or profile not in ("uniform", "constant", "powerlaw"):
            raise BenchError(f"--csr needs NNZ_PER_ROW > 0 and optionally a profile uniform|constant|powerlaw, "
                             f"got {' '.join(args.csr)!r}")
        csr_arg = (k, profile)
    print("fusedml", bench.versions().get("fusedml"))
    for k, v in bench.versions().items():
        if k != "fusedml":
            print(f"  {k:8s} {v}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"GPU {i}: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, "
                  f"compute capability {p.major}.{p.minor}")
        dev = torch.device("cuda")
    else:
        print("GPU: none (CUDA not available)")
        dev = torch.device("cpu")
    print(f"Triton interpreter: {'on' if interpret_mode() else 'off'} (TRITON_INTERPRET)")
    print(f"backend='auto' resolves to {resolve_backend('auto', dev)!r} for data on {dev}")
    dtype = getattr(torch, args.dtype)
    gpu = gpu_info(dev if dev.type == "cuda" else None)
    cfg = dense_config(N, D, args.m, dtype, gpu)
    print(f"mmchain launch model for dense X [{N}, {D}] {args.dtype}, m={args.m}, on {gpu.name} "
          f"({gpu.sm_count} SMs):")
    for k, v in vars(cfg).items():
        print(f"  {k:13s} {v}")
    if args.csr is not None:
        import datasets

        from .mmchain.csr import csr_config

        k, profile = csr_arg
        A = datasets.make_csr(N, D, k, profile, dtype=args.dtype, device=dev, return_torch=True).X
        ccfg = csr_config(A, args.m, dtype, gpu)
        print(f"mmchain launch model for CSR X [{N}, {D}], {A.nnz} nnz ({profile}, mean "
              f"{A.nnz / N:.1f}/row, longest {int(A.row_lengths().max())}), {args.dtype}, m={args.m}:")
        for key, v in vars(ccfg).items():
            print(f"  {key:15s} {v}")
    return 0


def cmd_datasets(args) -> int:
    """List the bundled data sets with their shapes, tasks and sources.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed ``datasets`` arguments.

    Returns
    -------
    int
        Process exit status.
    """
    import datasets

    for name in datasets.list_datasets():
        ds = datasets.load(name)
        print(f"{name:14s} {ds.shape[0]:6d} x {ds.shape[1]:<4d} {ds.task:11s} {datasets.describe(name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``fusedml`` argument parser (subcommands demo, bench, info, datasets).

    Returns
    -------
    argparse.ArgumentParser
    """
    from .bench import ALGORITHMS, BACKENDS

    p = _Parser(prog="fusedml", description="Whole ML algorithms on the GPU through fused Triton kernels.")
    sub = p.add_subparsers(dest="command", metavar="{demo,bench,info,datasets}", parser_class=_Parser)
    sub.required = True

    d = sub.add_parser("demo", help="train every estimator on bundled data with each backend")
    d.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    d.add_argument("--repeat", type=int, default=1, help="timed fits per configuration (median)")
    d.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    d.add_argument("--out", help="also write results.json / results.md / plots to this folder")
    d.add_argument("--no-plots", action="store_true", help="with --out: skip the PNG plots")
    d.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    d.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="end-to-end grid: datasets x algorithms x backends")
    b.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), metavar="ALGO",
                   help=f"among {', '.join(ALGORITHMS)} (default: all)")
    b.add_argument("--datasets", nargs="+", metavar="SPEC",
                   help="bundled names, synthetic-dense:NxD, synthetic-csr:NxD:NNZ_PER_ROW:PROFILE, "
                        "synthetic-gmm:NxD:K, svmlight:PATH, npy:PATH, npz:PATH")
    b.add_argument("--backends", nargs="+", choices=list(BACKENDS), metavar="BACKEND",
                   help=f"among {', '.join(BACKENDS)} (default: fused ops sklearn on cuda, cpu ops sklearn on cpu)")
    b.add_argument("--repeat", type=int, default=1, help="timed fits per configuration (median)")
    b.add_argument("--out", default="fusedml-bench", help="output folder (default ./fusedml-bench)")
    b.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    b.add_argument("--n-samples", nargs="+", type=int, metavar="N",
                   help="row counts replacing N of the synthetic specs (a sweep)")
    b.add_argument("--max-iter", type=int, help="same iteration limit for every backend")
    b.add_argument("--tol", type=float, help="same tolerance for every backend")
    b.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--sklearn-budget", type=float, default=60.0,
                   help="seconds above which scikit-learn runs on a subsample, time scaled by rows (<= 0: never)")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    b.set_defaults(func=cmd_bench)

    i = sub.add_parser("info", help="GPU, launch-model choice for a shape, versions")
    i.add_argument("--shape", nargs=2, type=int, default=[1_000_000, 100], metavar=("N", "D"))
    i.add_argument("--m", type=int, default=1, help="right-hand sides (columns of y)")
    i.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    i.add_argument("--csr", nargs="+", metavar="ARG",
                   help="also the CSR launch model: NNZ_PER_ROW [PROFILE] (builds a synthetic N x D matrix)")
    i.set_defaults(func=cmd_info)

    s = sub.add_parser("datasets", help="list the bundled data sets")
    s.set_defaults(func=cmd_datasets)
    return p


def main(argv=None) -> int:
    """Entry point of the ``fusedml`` console script and ``python -m fusedml``.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit code: 0 success, 2 usage or input error.
    """
    from ._dispatch import BackendUnavailableError
    from .bench import BenchError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (BenchError, BackendUnavailableError, FileNotFoundError, IsADirectoryError, ValueError,
            TypeError) as e:
        if os.environ.get("FUSEDML_DEBUG", "0") not in ("", "0"):
            raise
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"fusedml: error: {msg}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - output piped into `head` & co.
        sys.stdout = open(os.devnull, "w")
        return 0
    except KeyboardInterrupt:  # pragma: no cover - interactive
        print("fusedml: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
