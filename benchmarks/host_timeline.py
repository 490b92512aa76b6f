"""Where one warm fit's host time goes, call by call: a timeline of the library's own functions.

Every function and method of the ``algorithms`` and ``fusedml`` modules named in ``--match``
(default: all of them) is wrapped to record its entry and exit (``perf_counter_ns``, no sync), and
so are the host's waits on the GPU (``torch.cuda.Event.synchronize``, ``Tensor.tolist`` /
``item``) and Python's garbage collections (``gc.callbacks``). One warm fit of the chosen
estimator is then timed and printed as an indented timeline (time since the fit's start,
duration, the function), calls shorter than ``--min-us`` folded into their caller. Unlike cProfile (which inflates Python calls ~2x) the wrappers cost ~1 us a call, and
unlike the profiler's Python-stack trace (~5x) the times are close to an unprofiled fit's. The
GPU's side is in ``profile_fit.py --trace-dir``.

    python benchmarks/host_timeline.py [--shape 1000000x100] [--algo logistic] [--backend fused]
        [--min-us 20] [--out FILE]
    python benchmarks/host_timeline.py --csr 32:powerlaw --shape 1000000x100000 --algo poisson  # CSR X
    python benchmarks/host_timeline.py --estep 8:diag --shape 4000000x13   # one GMM E-step, in memory
        # and on a StreamedMatrix of the same rows (all resident), one after the other

Without CUDA it runs a tiny shape under the interpreter (a smoke test of the script).
"""
from __future__ import annotations

import argparse
import functools
import gc
import inspect
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


class Recorder:
    """Entry / exit records ``[name, depth, t0, t1]`` of the wrapped calls, in entry order."""

    def __init__(self):
        self.events, self.depth, self.on = [], 0, False

    def wrap(self, fn, name):
        @functools.wraps(fn)
        def timed(*a, **k):
            if not self.on:
                return fn(*a, **k)
            ev = [name, self.depth, time.perf_counter_ns(), 0]
            self.events.append(ev)
            self.depth += 1
            try:
                return fn(*a, **k)
            finally:
                self.depth -= 1
                ev[3] = time.perf_counter_ns()
        timed.__wrapped_by_timeline__ = True
        return timed


def _targets(prefixes):
    """``(owner, attribute, function, label)`` for every plain function and method defined in the
    loaded ``algorithms`` / ``fusedml`` modules (each patched where it is defined and wherever a
    module imported it by name); kernels and non-Python callables are left alone."""
    mods = [m for n, m in sorted(sys.modules.items()) if m is not None and n.split(".")[0] in ("algorithms", "fusedml")]
    found, out = {}, []
    for m in mods:
        for attr, obj in list(vars(m).items()):
            if inspect.isfunction(obj) and obj.__module__ == m.__name__:
                found[obj] = f"{m.__name__.split('.')[-1]}.{attr}"
            elif inspect.isclass(obj) and obj.__module__ == m.__name__:
                for a2, f2 in list(vars(obj).items()):
                    if inspect.isfunction(f2):
                        out.append((obj, a2, f2, f"{m.__name__.split('.')[-1]}.{obj.__name__}.{a2}"))
    for m in mods:
        for attr, obj in list(vars(m).items()):
            if inspect.isfunction(obj) and obj in found:
                out.append((m, attr, obj, found[obj]))
    return [t for t in out if not prefixes or any(p in t[3] for p in prefixes)]


def install(rec, prefixes=()):
    """Wrap the targets; return the callable that restores them."""
    undo, wrapped = [], {}
    for owner, attr, fn, label in _targets(prefixes):
        if getattr(fn, "__wrapped_by_timeline__", False):
            continue
        w = wrapped.setdefault(fn, rec.wrap(fn, label))
        undo.append((owner, attr, fn))
        setattr(owner, attr, w)
    for owner, attr, label in ((torch.cuda.Event, "synchronize", "WAIT Event.synchronize"),
                               (torch.Tensor, "tolist", "WAIT? Tensor.tolist"),
                               (torch.Tensor, "item", "WAIT? Tensor.item")):
        fn = getattr(owner, attr)
        undo.append((owner, attr, fn))
        setattr(owner, attr, rec.wrap(fn, label))

    def restore():
        for owner, attr, fn in reversed(undo):
            setattr(owner, attr, fn)
    return restore


def gc_recorder(rec):
    """A ``gc.callbacks`` hook recording each collection as ``GC gen N`` at the current depth."""
    open_ev = []

    def cb(phase, info):
        if not rec.on:
            return
        if phase == "start":
            ev = [f"GC gen {info['generation']}", rec.depth, time.perf_counter_ns(), 0]
            rec.events.append(ev)
            open_ev.append(ev)
        elif open_ev:
            open_ev.pop()[3] = time.perf_counter_ns()
    return cb


def timeline(events, t_start, min_us):
    """Rows ``{t_us, us, depth, name}``: every call of at least ``min_us`` whose callers all were."""
    rows, keep_depth = [], 0
    for name, depth, t0, t1 in events:
        us = (t1 - t0) / 1e3
        if depth > keep_depth:
            continue
        if us < min_us:
            keep_depth = depth
            continue
        keep_depth = depth + 1
        rows.append({"t_us": (t0 - t_start) / 1e3, "us": us, "depth": depth, "name": name})
    return rows


def record(setup, warm, match, cuda):
    """Run ``setup()()`` ``warm`` times, then once recorded (``setup()``, e.g. the estimator,
    made unrecorded): ``(events, t0, t1)`` in ns."""
    for _ in range(warm):
        setup()()
    rec = Recorder()
    restore = install(rec, match)
    hook = gc_recorder(rec)
    gc.callbacks.append(hook)
    try:
        run = setup()  # after install: its bound methods are the wrapped ones
        if cuda:
            torch.cuda.synchronize()
        rec.on = True
        t0 = time.perf_counter_ns()
        run()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter_ns()
        rec.on = False
    finally:
        gc.callbacks.remove(hook)
        restore()
    return rec.events, t0, t1


def _estep_runs(N, D, spec, dev):
    """``{label: setup}``: one fused ``gmm_estep`` (K components of ``spec`` "K:type") on the
    in-memory tensor and on a StreamedMatrix of the same rows with every chunk resident, each as a
    user calls it and as the host EM loop does (``check_params=False``: parameters from its M-step)."""
    import dask.array as da
    import numpy as np

    import fusedml
    from fusedml.streaming import StreamedMatrix

    K, ct = spec.split(":")
    K = int(K)
    g = torch.Generator().manual_seed(N + D)
    A = torch.randn(N, D, generator=g)
    w, mu = np.full(K, 1.0 / K), A[torch.randperm(N, generator=g)[:K]].double().numpy()
    pc = np.ones(K) if ct == "spherical" else np.ones((K, D))
    At = A.to(dev)
    S = StreamedMatrix(da.from_array(A.numpy(), chunks=(-(-N // 4), D)), device=dev)
    def call(M, checked=True):
        return fusedml.gmm_estep(M, w, mu, pc, ct, backend="fused", check_finite=False, check_params=checked)

    return {"in memory": lambda: lambda: call(At), "streamed": lambda: lambda: call(S),
            "in memory, EM loop": lambda: lambda: call(At, False), "streamed, EM loop": lambda: lambda: call(S, False)}


def _print(label, events, t0, t1, min_us):
    rows = timeline(events, t0, min_us)
    waits = sum((e[3] - e[2]) / 1e3 for e in events if e[0].startswith("WAIT"))
    gcs = [(e[3] - e[2]) / 1e3 for e in events if e[0].startswith("GC")]
    print(f"{label}: {(t1 - t0) / 1e3:.0f} us, {len(events)} recorded calls, {waits:.0f} us in host reads "
          f"(waiting on the GPU or copying), {len(gcs)} garbage collections ({sum(gcs):.0f} us)")
    print(f"{'t us':>8} {'us':>8}  function")
    for r in rows:
        print(f"{r['t_us']:8.0f} {r['us']:8.0f}  {'  ' * r['depth']}{r['name']}")
    return {"label": label, "us": (t1 - t0) / 1e3, "wait_us": waits, "gc_us": gcs, "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1000000x100")
    ap.add_argument("--algo", default="logistic", choices=_common.LINEAR_FIT_ALGOS)
    ap.add_argument("--estep", default=None, metavar="K:TYPE",
                    help="time one GMM E-step (e.g. 8:diag) in memory and streamed instead of a fit")
    ap.add_argument("--csr", default=None, metavar="NNZ:PROFILE",
                    help="the fit on a CSR X of --shape (nonzeros per row, row-length profile; e.g. 32:powerlaw)")
    ap.add_argument("--backend", default="fused")
    ap.add_argument("--min-us", type=float, default=20.0)
    ap.add_argument("--match", nargs="*", default=[], help="only functions whose label contains one of these")
    ap.add_argument("--warm", type=int, default=3, help="warm fits (calls) before the recorded one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = _common.device()
    cuda = dev.type == "cuda"
    if not cuda:
        args.shape, args.warm = "400x8", 1
    N, D = (int(s) for s in args.shape.split("x"))
    if args.estep:
        runs = _estep_runs(N, D, args.estep, dev)
    else:
        if args.csr:
            nnz, prof = args.csr.split(":")
            X, cases = _common.csr_fit_cases(N, D, dev, min(float(nnz), D), prof)
        else:
            X, cases = _common.linear_fit_cases(N, D, dev)
        make, y = cases[args.algo]
        kind = f" CSR {args.csr}" if args.csr else ""
        runs = {f"{args.algo} {args.shape}{kind} {args.backend} fit": lambda: functools.partial(make(args.backend).fit, X, y)}
    out = [_print(label, *record(setup, args.warm, args.match, cuda), args.min_us) for label, setup in runs.items()]
    _common.write_json("host_timeline", out, extra={"args": vars(args)}, out=args.out)
    return out


if __name__ == "__main__":
    main()
