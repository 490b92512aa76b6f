"""Shared benchmark helpers: environment description, timing, JSON rows, markdown tables.

Every benchmark script imports this module (run them from the repository root, e.g.
``python benchmarks/bench_mmchain.py``). Results go to ``benchmarks/results/<name>-<gpu>-<date>.json``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
import time

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: Measured H200 device bandwidth (``../shared/PERFORMANCE.md``): the read-once floor's divisor.
H200_BANDWIDTH = 4.28e12


def device() -> torch.device:
    """``cuda`` when available, else ``cpu`` (the interpreter smoke run)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def gpu_name() -> str:
    """The GPU's name, or ``"cpu"`` without CUDA."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def environment() -> dict:
    """GPU name, library versions, date and the command line, for the JSON header."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover
        triton_version = None
    return {
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }


def compiled_kernels(fn) -> list:
    """The compiled kernels of the ``@triton.jit`` function ``fn`` (each with ``n_regs``, ``n_spills``,
    ``asm``), from Triton's JIT cache on every device; none under the interpreter."""
    return [k for cache in getattr(fn, "device_caches", {}).values() for k in cache[0].values()
            if hasattr(k, "n_regs")]


def bench_ms(fn, *, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn()``: ``triton.testing.do_bench`` on CUDA, wall clock on the CPU.

    Parameters
    ----------
    fn : callable
        The work to time (no arguments).
    warmup, rep : int
        Milliseconds of warm-up and of timed repetitions (do_bench's meaning). On the CPU,
        ``fn`` runs once to warm up and then once timed (a smoke run, not a measurement).
    """
    if torch.cuda.is_available():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def write_json(name: str, rows: list, extra: dict | None = None, out: str | None = None) -> str:
    """Write ``{"env": ..., **extra, "rows": rows}`` and return the path.

    Parameters
    ----------
    name : str
        Benchmark name, the file's prefix.
    rows : list of dict
    extra : dict, optional
        More top-level entries (e.g. the arguments).
    out : str, optional
        Explicit path; default ``benchmarks/results/<name>-<gpu>-<date>.json``.
    """
    env = environment()
    if out is None:
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", env["gpu"]).strip("-").lower()
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = os.path.join(RESULTS_DIR, f"{name}-{gpu}-{stamp}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"env": env, **(extra or {}), "rows": rows}, f, indent=1, default=str)
    return out


def shape_list(spec: str) -> list:
    """``"NxDxK,..."`` -> ``[(N, D, K), ...]`` (integers; empty items skipped).

    Parameters
    ----------
    spec : str
        Comma-separated shapes, each ``x``-separated integers.

    Returns
    -------
    list of tuple of int
    """
    return [tuple(int(v) for v in item.split("x")) for item in spec.split(",") if item]


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return f"{v:.2e}"
    return "" if v is None else str(v)


def markdown_table(rows: list, columns: list) -> str:
    """A markdown table of ``rows`` (dicts) restricted to ``columns`` (missing keys left blank)."""
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)


#: The names of :func:`linear_fit_cases`' fits (the A/B scripts' ``--algos`` choices)
LINEAR_FIT_ALGOS = ("logistic", "multinomial", "linearsvc", "poisson", "ridge")


def _linear_cases(eta, g, N, dev) -> dict:
    """The five linear fits' ``{name: (make(backend), y)}`` with targets drawn about ``eta`` [N]."""
    from algorithms import LinearSVC, LogisticRegression, PoissonRegressor, Ridge

    lbl = (eta + 0.5 * torch.randn(N, generator=g, device=dev) > 0).float()
    cls = torch.bucketize(eta + 0.5 * torch.randn(N, generator=g, device=dev),
                          torch.tensor([-0.8, -0.25, 0.25, 0.8], device=dev))
    return {"logistic": (lambda be: LogisticRegression(C=1.0, backend=be), lbl),
            "multinomial": (lambda be: LogisticRegression(C=1.0, backend=be), cls),
            "linearsvc": (lambda be: LinearSVC(C=1.0, backend=be), lbl),
            "poisson": (lambda be: PoissonRegressor(alpha=1e-3, backend=be), torch.poisson(torch.exp(0.5 * eta))),
            "ridge": (lambda be: Ridge(alpha=1.0, backend=be), eta)}


def linear_fit_cases(N: int, D: int, dev) -> tuple:
    """``(X, {name: (make(backend) -> estimator, y)})``: the whole-fit A/B cases of
    ``host_overhead.py`` and ``finite_check_ab.py`` (logistic, 5-class multinomial, LinearSVC,
    Poisson, Ridge) on one seeded N x D Gaussian X on ``dev``."""
    g = torch.Generator(device=dev).manual_seed(1)
    X = torch.randn(N, D, generator=g, device=dev)
    eta = X @ (torch.randn(D, generator=g, device=dev) / D ** 0.5)
    return X, _linear_cases(eta, g, N, dev)


def csr_fit_cases(N: int, D: int, dev, nnz_per_row: float = 32, profile: str = "powerlaw") -> tuple:
    """:func:`linear_fit_cases` on one seeded CSR matrix (``datasets.make_csr``: N x D, the given
    nonzeros per row and row-length profile) on ``dev``: the targets from ``eta = X beta``."""
    import fusedml
    from datasets.synthetic import make_csr

    X = make_csr(N, D, nnz_per_row, profile, "binary", seed=1, device=dev, return_torch=True).X
    g = torch.Generator(device=dev).manual_seed(1)
    eta = fusedml.matvec(X, torch.randn(D, generator=g, device=dev) / nnz_per_row ** 0.5, backend="ops")
    return X, _linear_cases(eta, g, N, dev)


def csr_from_spec(spec: str, dev, cap=None) -> tuple:
    """``(name, X)``: a seeded torch CSR X (``datasets.make_csr``) from ``"NxD:NNZ:PROFILE"``, its
    shape clamped to ``cap = (N, D)`` when given (smoke runs), the nonzeros per row to D."""
    from datasets.synthetic import make_csr

    shape, nnz, prof = spec.split(":")
    n, d = (int(x) for x in shape.split("x"))
    if cap is not None:
        n, d = min(n, cap[0]), min(d, cap[1])
    return f"{prof}-{n}x{d}-{nnz}", make_csr(n, d, min(float(nnz), d), prof, device=dev, return_torch=True).X


#: GaussianMixture fits of the A/B scripts: ``gmm-<covariance type>``
GMM_FIT_ALGOS = ("gmm-full", "gmm-tied", "gmm-diag", "gmm-spherical")


def gmm_fit_cases(N: int, D: int, dev, K: int = 16) -> tuple:
    """``(X, {name: (make(backend) -> estimator, None)})``: whole ``GaussianMixture`` fits (K
    components, k-means start, ``random_state=0``) of each covariance type on one seeded N x D
    sample of a K-component diagonal mixture on ``dev`` (``datasets.make_gmm``)."""
    from algorithms import GaussianMixture
    from datasets.synthetic import make_gmm

    X = torch.as_tensor(make_gmm(N, D, K, seed=1).X).to(dev)
    return X, {f"gmm-{ct}": (lambda be, ct=ct: GaussianMixture(K, covariance_type=ct, random_state=0, backend=be), None)
               for ct in ("full", "tied", "diag", "spherical")}


def alternate_fits(make, X, y, modes, enter, fits: int, dev) -> tuple:
    """Whole fits of ``make().fit(X, y)`` in each of ``modes``, alternating fit by fit (the order
    flipped every other round, after one warm fit per mode), so the machine's drift cancels.

    ``enter(mode)`` switches the mode on and returns a callable that switches it off; ``X`` may
    be a dict giving each mode its own design matrix. Returns ``(ms, last)``: per mode the list of
    wall times (ms, synchronised) and the last fitted estimator."""
    def one(mode):
        leave = enter(mode)
        Xm = X[mode] if isinstance(X, dict) else X
        try:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            est = make().fit(Xm) if y is None else make().fit(Xm, y)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return 1e3 * (time.perf_counter() - t0), est
        finally:
            leave()
    for m in modes:  # warm: compiles, caches
        one(m)
    ms, last = {m: [] for m in modes}, {}
    for i in range(fits):
        for m in (modes if i % 2 == 0 else modes[::-1]):
            t, last[m] = one(m)
            ms[m].append(t)
    return ms, last


def set_env(setting: dict):
    """Apply ``{NAME: VALUE}`` to ``os.environ`` (an empty VALUE unsets NAME), or, for a NAME of the
    form ``package.module:ATTRIBUTE``, set that module attribute to the Python literal VALUE (a
    switch read once at import, e.g. ``fusedml._launch:SKIP_EMPTY_HOOKS=False``); return the callable
    that restores the previous values."""
    import ast
    import importlib

    undo = []
    for k, v in setting.items():
        if ":" in k:
            mod, attr = k.split(":", 1)
            m = importlib.import_module(mod)
            if not hasattr(m, attr):
                raise ValueError(f"{mod} has no attribute {attr!r}")
            undo.append((m, attr, getattr(m, attr)))
            setattr(m, attr, ast.literal_eval(v))
            continue
        undo.append((None, k, os.environ.get(k)))
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)

    def restore():
        for m, k, v in reversed(undo):
            if m is not None:
                setattr(m, k, v)
            elif v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return restore
