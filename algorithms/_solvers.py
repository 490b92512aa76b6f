"""Solvers: trust-region Newton-CG (LIBLINEAR's TRON), L-BFGS with a strong-Wolfe line search,
and linear conjugate gradient (SystemDS lmCG).

Every solver has the same template (scikit-learn's ``_newton_solver`` layering): set up from an
objective object (``evaluate_gradient(W)`` -> (state with ``f``, g, hstate); ``gradient(state)``;
``hessp(hstate, S)``; ``dot``; ``merge``), iterate (inner solve, step/line search, update), and
test convergence with a caller-supplied rule. The objective does every product with X through
``fusedml`` (``loss_gradient``, ``mmchain``, ``matvec``), so the SAME iterations run on every
backend.

Cost model (the fits are bound by per-iteration overhead unless X is large, so it is counted):
vectors ([D~, K]) stay on the data's device; the per-problem scalars (P = 1 for a coupled
problem, K for K independent problems solved together) live on the HOST as float64 Python
floats, fetched with one small copy per decision. Decisions on the host cost one sync each
but no launches; decisions on the device cost ~60 tiny launches per CG step (the previous
design). Per TRON CG step: one Hessian mmchain, ONE sync and ~12 small launches (alpha is formed
on the device, the updates and ``||r||^2`` are queued behind the mmchain's read of X), all of it
ONE CUDA-graph launch once a solve on the GPU has run a few steps (:class:`_CGEngine`). Per TRON
outer iteration: one objective-and-gradient pass at the trial point (margins, loss, gradient and
Hessian weights: one read of X on the fused backend, a matvec and an ``X^T v`` on the others),
before the accept test, and ONE sync. Linear CG: one
mmchain and ONE sync per step. L-BFGS: one sync per line-search evaluation and one per
iteration. Coefficients that differ per problem travel H2D from pinned memory (asynchronous).
"""
from __future__ import annotations

import math
import os
from collections import deque

import torch

from fusedml._launch import bound_enabled
from fusedml.cg import (CONTROL, bind_cg_restart, bind_cg_update, bind_trial_sums, cg_control, cg_update,
                        cg_update_applies, control_slice, trial_sums, trial_sums_applies)

__all__ = ["SolverResult", "StopRule", "conjugate_gradient", "lbfgs", "max_abs_grad_stop", "relative_grad_norm_stop",
           "tron"]


class SolverResult:
    """What a solver returns.

    Attributes
    ----------
    W : torch.Tensor
        The last iterate, [D~, K].
    n_iter : list of int
        Outer iterations per problem.
    status : list of str
        Per problem: ``"converged"``, ``"max_iter"`` or ``"stalled"`` (no further progress at
        working precision before ``tol`` was reached).
    state : dict or None
        The objective state at W (margins etc.), for callers that want it.
    """

    def __init__(self, W, n_iter, status, state=None):
        self.W = W
        self.n_iter = list(n_iter)
        self.status = list(status)
        self.state = state

    @property
    def converged(self):
        return all(s == "converged" for s in self.status)


class StopRule:
    """A convergence test on the gradient, in a device form and a host form.

    Parameters
    ----------
    device : callable ``(g, gnorm, gnorm0) -> [P] bool tensor``
        On the device: ``g`` [D~, K], ``gnorm`` and ``gnorm0`` [P] tensors (the solvers queue it
        with the other reductions of an iteration and read all of them in one copy).
    host : callable ``(gmax, gnorm, gnorm0) -> list of P bool``
        The same test on Python floats per problem: ``gmax`` the largest ``|g|`` entry, ``gnorm``
        and ``gnorm0`` the gradient norms (TRON's accept test takes this form when its sums come
        from :func:`fusedml.cg.trial_sums`).
    """

    def __init__(self, device, host):
        self.device, self.host = device, host

    def __call__(self, g, gnorm, gnorm0):
        return self.device(g, gnorm, gnorm0)


def max_abs_grad_stop(tol):
    """scikit-learn's rule for newton-cg / lbfgs (one problem): ``max |g| <= tol``.

    Parameters
    ----------
    tol : float

    Returns
    -------
    StopRule
    """
    tol = float(tol)
    return StopRule(lambda g, gnorm, gnorm0: (g.abs().amax() <= tol).reshape(1),
                    lambda gmax, gnorm, gnorm0: [all(x <= tol for x in gmax)])  # NaN: False


def relative_grad_norm_stop(scale):
    """LIBLINEAR's rule, per problem: ``||g_j|| <= scale_j ||g0_j||``.

    Parameters
    ----------
    scale : torch.Tensor
        [P] on the gradient's device (read to the host once here).

    Returns
    -------
    StopRule
    """
    host_scale = [float(x) for x in scale.reshape(-1).tolist()]
    return StopRule(lambda g, gnorm, gnorm0: gnorm <= scale * gnorm0,
                    lambda gmax, gnorm, gnorm0: [a <= c * b for a, b, c in zip(gnorm, gnorm0, host_scale)])


def _precision(dtype):
    # relative size below which actual and predicted reductions are noise (LIBLINEAR: 1e-12 in
    # double); for float32 data the per-sample losses carry ~1e-7 relative error
    return 1e-12 if dtype == torch.float64 else 1e-7


# --------------------------------------------------------------------------------------------
# host-side scalars: one small D2H copy per decision, a handful of launches per step
# --------------------------------------------------------------------------------------------
def _host(t):
    """[P] device tensor -> list of P Python floats (ONE host sync, one small D2H copy)."""
    return [float(x) for x in t.reshape(-1).tolist()]


def _coef(vals, like):
    """Per-problem coefficients (list of P floats) as what :func:`_axpy` takes.

    P == 1: a Python float (no launch, no copy); else a [1, P] tensor on ``like``'s device (one
    asynchronous H2D copy from pinned memory on CUDA).
    """
    if len(vals) == 1:
        return float(vals[0])
    t = torch.tensor(vals, dtype=like.dtype).reshape(1, -1)
    if like.device.type == "cuda":
        t = t.pin_memory().to(like.device, non_blocking=True)
    return t


def _axpy(Y, a, X):
    """``Y + a * X`` in ONE launch (a: float, or [1, P] tensor scaling the columns); new tensor."""
    if isinstance(a, float):
        return Y if a == 0.0 else torch.add(Y, X, alpha=a)
    return torch.addcmul(Y, a, X)


def _finite_or(x, default):
    return x if math.isfinite(x) else default


# --------------------------------------------------------------------------------------------
# the device half of a CG step: in place on persistent buffers, replayed from a CUDA graph
# --------------------------------------------------------------------------------------------
def graph_safe(X) -> bool:
    """Whether products with ``X`` may be captured in a CUDA graph: X a CUDA tensor or CSR matrix
    (not a streamed matrix, whose products copy chunks from the host), graphs not turned off by
    ``FUSEDML_CUDA_GRAPHS=0``."""
    from fusedml import CSRMatrix

    if os.environ.get("FUSEDML_CUDA_GRAPHS", "1") == "0" or not isinstance(X, (torch.Tensor, CSRMatrix)):
        return False
    return X.device.type == "cuda"


def is_csr(X) -> bool:
    """Whether ``X`` is a :class:`fusedml.CSRMatrix` (its CG steps capture early, see :class:`_Replay`)."""
    from fusedml import CSRMatrix

    return isinstance(X, CSRMatrix)


def _counters(owner):
    return {} if owner is None else {k: v for k, v in vars(owner).items()
                                     if k.startswith("n_") and type(v) is int}


class _Replay:
    """``fn()`` run eagerly, or replayed from a CUDA graph captured after ``capture_after`` calls.

    ``fn`` works in place on persistent buffers and returns tensors the caller reads before the
    next call. The first ``capture_after`` calls run eagerly (short solves, which a capture would
    not pay back), the last of them on the capture's side stream (the warm-up a capture needs:
    lazy library set-up, Triton compiles, the CSR strategy's CSC copy; a stream switch costs
    ~50 us of host time, so the calls before it stay on the caller's stream); the next captures
    ``fn`` and replays it; later
    calls replay: ONE launch instead of the step's ~10 launches and its Python (on the H200
    host, ~8-12 us per torch launch and ~100-250 us per fusedml call). A failed capture (an
    operation that cannot be captured) leaves ``fn`` eager. ``fn``'s Python side effects happen
    at the capture only: ``owner``'s integer ``n_*`` counters advance by the captured call's
    increments at every replay.
    """

    captures = 0  # graphs captured by all instances (tests check that the GPU path is taken)
    #: eager calls before the capture: a capture costs ~1 ms on the H200 host and a replay saves
    #: ~0.1-0.3 ms, so short solves never capture (host_overhead-H200-2026-12-03-s7-c: a 3-step
    #: Ridge fit took 4.3 ms captured at step 2 against 3.5 eager; s8-a: with the capture after 5
    #: steps the 1M x 100 and 4M x 64 dense fits (10-20 CG steps) were still 0.3-2 ms slower than
    #: eager on both backends; long CSR solves, hundreds of steps, gained 10-40 %)
    capture_after = 16
    #: the same for products with a CSR matrix: a CG step there is ~0.5 ms on the GPU against
    #: ~1.2 ms eager (end_to_end_csr-H200-2026-12-03-s9-a: the Ridge fit's steps), so the ~1 ms
    #: capture pays back after two replays
    capture_after_sparse = 2

    def __init__(self, fn, enabled, owner=None, sparse=False):
        self.fn, self.enabled, self.owner = fn, bool(enabled), owner
        self.capture_after = self.capture_after_sparse if sparse else type(self).capture_after
        env = os.environ.get("FUSEDML_CAPTURE_AFTER", "")  # benchmarks' override (host_overhead --ab-var)
        if env:
            self.capture_after = int(env)
        self.calls, self.graph, self.out, self.delta = 0, None, None, {}
        self.side = None  # the warm-up and capture stream, made when a solve gets that far (~60 us)

    def __call__(self):
        self.calls += 1
        if not self.enabled:
            return self.fn()
        if self.graph is not None:
            self.graph.replay()
            for k, d in self.delta.items():
                setattr(self.owner, k, getattr(self.owner, k) + d)
            return self.out
        if self.calls < self.capture_after:  # short solves: real eager steps, on the caller's stream
            return self.fn()
        if self.side is None:
            self.side = torch.cuda.Stream()
        cur, side = torch.cuda.current_stream(), self.side
        side.wait_stream(cur)
        if self.calls == self.capture_after:  # the warm-up before a capture, on its stream
            with torch.cuda.stream(side):
                out = self.fn()
            cur.wait_stream(side)
            return out
        before = _counters(self.owner)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                g.capture_begin()
                try:
                    out = self.fn()
                finally:
                    g.capture_end()
        except Exception:  # not capturable: eager from now on (nothing ran on the device)
            for k, v in before.items():
                setattr(self.owner, k, v)
            cur.wait_stream(side)
            self.enabled = False
            return self.fn()
        cur.wait_stream(side)
        after = _counters(self.owner)
        self.delta = {k: after[k] - before[k] for k in after if after[k] != before.get(k, after[k])}
        self.graph, self.out = g, out
        _Replay.captures += 1
        g.replay()
        return out


class _CGEngine:
    """Persistent CG state ``S`` (solution), ``R`` (residual), ``Dv`` (direction), per-problem
    ``rTr``, ``beta`` and a running ``mask`` (P > 1), and the device half of one step.

    :meth:`step` does, in place and without a host sync: ``Dv = R + beta Dv``; ``A Dv`` (one
    mmchain); ``alpha = rTr / Dv^T A Dv`` (0 where undefined or masked); ``S += alpha Dv``,
    ``R -= alpha A Dv`` (with ``keep_previous``, for TRON's trust-region boundary, the previous
    ``S``, ``R`` kept in ``S0``, ``R0``); ``beta = ||R||^2 / rTr`` and ``rTr = ||R||^2``; it
    returns ``[Dv^T A Dv, ||R||^2]`` ([2P], for the host's decisions) and ``A Dv``. With
    ``graphs`` the step is a CUDA graph (:class:`_Replay`). On CUDA vectors everything after the
    product is one launch (:func:`fusedml.cg.cg_update`, float64 sums; ``FUSEDML_FUSED_CG=0``
    keeps the ~15 torch launches), on both GPU backends alike.
    """

    def __init__(self, apply, dot, like, P, graphs, owner=None, keep_previous=True, sparse=False, bind=None,
                 decide=None):
        self.apply, self.dot, self.P = apply, dot, P
        z = torch.zeros_like(like, memory_format=torch.contiguous_format)
        self.S, self.R, self.Dv = z, z.clone(), z.clone()
        # the product's result is one buffer, overwritten by each call: the update kernel binds to it
        self.persistent, self._upd, op = False, None, None
        if bind is not None:  # ``bind(Dv) -> () -> A Dv``: the product set up once for the Dv buffer
            op = bind(self.Dv)
            self.apply = lambda D: op()
            self.persistent = bool(getattr(op, "persistent", False)) and bound_enabled()
        self.rTr = torch.zeros(P, dtype=like.dtype, device=like.device)
        self.beta = torch.zeros_like(self.rTr)
        self.mask = torch.ones_like(self.rTr) if P > 1 else None
        # the vector half of the step in one launch (fusedml.cg), where it applies; ``dot`` is
        # then the per-problem sum it computes (P = 1: over all columns; P = K: per column)
        self.fused = z.ndim == 2 and cg_update_applies(z, P)
        # ``decide`` ("tr": TRON's trust region, "plain": linear CG): the step's decisions made by
        # the update kernel too (cg_update's control block), so the host can queue steps ahead
        self.decide = decide if self.fused else None
        # decided steps: the update kernel also forms the next direction, and a solve starts in
        # one launch (S = 0, R = Dv = -g): 1 and ~4 launches fewer per step and per solve
        self.next_dir, self._restarts = bool(self.decide), {}
        # ... and writes the next product's start (its beta * z) in the same sweep: two launches
        # fewer per step, where the bound product can leave that step to it
        self.prefill = getattr(op, "prefill", None) if self.next_dir and self.persistent else None
        if self.prefill is not None:
            self.apply = lambda D: op.bare()
        self.packed = torch.empty(2 * P, dtype=like.dtype, device=like.device) if self.fused and not decide else None
        self.ctl = torch.zeros(len(CONTROL) * P, dtype=torch.float64, device=like.device) if self.decide else None
        self.snaps = _Snapshots(self.ctl, _lag() + 2) if self.decide else None
        keep = keep_previous and not self.decide  # a decided step never redoes itself
        self.S0, self.R0 = (z.clone(), z.clone()) if keep else (None, None)
        self.step = _Replay(self._step, graphs, owner, sparse)

    def _restart(self, R, negate=False):
        if self.next_dir:  # one launch, bound per source buffer (a solver's gradients alternate between two)
            _bound_call(self._restarts, (R.data_ptr(), R.stride(), R.shape, negate),
                        lambda: bind_cg_restart(self.S, self.R, self.Dv, R, self.beta, negate=negate,
                                                prefill=self.prefill))
            return
        self.S.zero_()
        if negate:
            torch.neg(R, out=self.R)
        else:
            self.R.copy_(R)
        self.Dv.zero_()
        self.beta.zero_()

    def reset(self, R, rTr, run):
        """A new solve from ``S = 0``, residual ``R``, ``rTr`` [P] device, problems ``run``."""
        self._restart(R)
        self.rTr.copy_(rTr)
        if self.mask is not None:
            self.set_mask(run)

    def reset_decided(self, R, control, negate=False):
        """A new device-decided solve from ``S = 0``, residual ``R`` (``-R`` with ``negate``);
        ``control`` the host list of :func:`fusedml.cg.cg_control` (one asynchronous H2D copy)."""
        self._restart(R, negate)
        self.set_control(control)

    def start_ahead(self, R, negate=False):
        """A decided solve's restart and first product, queued before its control block is known
        (the host reads the values it needs behind them): returns the product, which
        :func:`_decided_steps` takes as ``first`` after :meth:`set_control`."""
        self._restart(R, negate)
        Ad = self.apply(self.Dv)  # the direction R formed by the restart
        return Ad.to(self.S.dtype) if Ad.dtype != self.S.dtype else Ad

    def set_control(self, control):
        """The solve's control block (see :meth:`reset_decided`)."""
        if self.ctl.is_cuda:  # the previous solve's copy from the staging buffer was read behind
            self.snaps.stage_np[:] = control  # written through numpy: no torch op on the host
            self.ctl.copy_(self.snaps.stage, non_blocking=True)
        else:
            self.ctl.copy_(torch.tensor(control, dtype=torch.float64))
        self.control0 = control

    def set_mask(self, run):
        self.mask.copy_(torch.tensor([1.0 if r else 0.0 for r in run], dtype=self.mask.dtype))

    def set_scalars(self, beta, rTr):
        """Host values (P floats each) for the next step's ``beta`` and ``rTr``."""
        self.beta.copy_(torch.tensor(beta, dtype=self.beta.dtype))
        self.rTr.copy_(torch.tensor(rTr, dtype=self.rTr.dtype))

    def _step(self):
        if self.fused:  # besides the product: the direction (unless the update kernel formed it), the update
            if not self.next_dir:
                torch.addcmul(self.R, self.beta.reshape(1, -1), self.Dv, out=self.Dv)
            Ad = self.apply(self.Dv)
            if Ad.dtype != self.S.dtype:
                Ad = Ad.to(self.S.dtype)
            return self._update(Ad), Ad
        if self.S0 is not None:
            self.S0.copy_(self.S)
            self.R0.copy_(self.R)
        self.Dv.mul_(self.beta.reshape(1, -1)).add_(self.R)
        Ad = self.apply(self.Dv)
        dAd = self.dot(self.Dv, Ad)
        a = torch.nan_to_num(self.rTr / dAd, nan=0.0, posinf=0.0, neginf=0.0)
        if self.mask is not None:
            a = a * self.mask
        a = a.reshape(1, -1)
        self.S.addcmul_(a, self.Dv)
        self.R.addcmul_(a, Ad, value=-1.0)
        rnew = self.dot(self.R, self.R)
        b = torch.nan_to_num(rnew / self.rTr, nan=0.0, posinf=0.0, neginf=0.0)
        if self.mask is not None:
            b = b * self.mask
        self.beta.copy_(b)
        self.rTr.copy_(rnew)
        return torch.cat([dAd, rnew]), Ad

    def _update(self, Ad):
        """The update kernel after the product ``Ad`` (bound once where ``Ad`` is a persistent
        buffer); returns the control block (decided steps) or ``[dAd, rnew]``."""
        if self.persistent:
            key = (Ad.data_ptr(), Ad.stride())
            if self._upd is not None and self._upd[0] == key:
                return self._upd[1]()
        if self.decide:  # the decisions made by the kernel too
            args, kw = (None, self.beta, None), dict(control=self.ctl, trust_region=self.decide == "tr",
                                                     next_direction=self.next_dir, prefill=self.prefill)
        else:
            args, kw = (self.rTr, self.beta, self.packed), dict(mask=self.mask, S0=self.S0, R0=self.R0)
        if not self.persistent:
            return cg_update(self.S, self.R, self.Dv, Ad, *args, **kw)
        self._upd = (key, bind_cg_update(self.S, self.R, self.Dv, Ad, *args, **kw))
        return self._upd[1]()


def _bound_call(cache, key, make):
    """Call the bound launch ``cache[key]``, made by ``make()`` on a miss. At most two are kept
    (a solver's buffers alternate between two sets); the oldest goes first."""
    go = cache.get(key)
    if go is None:
        if len(cache) >= 2:
            cache.pop(next(iter(cache)))
        go = cache[key] = make()
    return go()


def _lag():
    """Steps the host queues before reading a device-decided step's outcome (``FUSEDML_CG_LAG``,
    default 1; 0 reads every step before queueing the next, as the host-decided steps do)."""
    return max(0, int(os.environ.get("FUSEDML_CG_LAG", "1") or 1))


class _Snapshots:
    """Copies of a CG control block that the host reads a step or two later: on CUDA into a ring of
    pinned buffers, one event each (reading one waits for its step only); elsewhere at once."""

    def __init__(self, ctl, depth):
        self.ctl, self.i = ctl, 0
        self.cuda = ctl.is_cuda
        if self.cuda:
            self.buf = torch.empty((depth, ctl.numel()), dtype=ctl.dtype, pin_memory=True)
            self.ev = [torch.cuda.Event() for _ in range(depth)]
            # the fit's stream, looked up once (~30 us of Python per lookup on the H200 host)
            self.stream = torch.cuda.current_stream(ctl.device)
            self.stage = torch.empty(ctl.numel(), dtype=ctl.dtype, pin_memory=True)  # H2D staging
            self.stage_np = self.stage.numpy()

    def take(self):
        """Queue a copy of the block as it is after the queued work; return ``read() -> list``."""
        if not self.cuda:
            v = self.ctl.tolist()
            return lambda: v
        k = self.i % len(self.ev)
        self.i += 1
        self.buf[k].copy_(self.ctl, non_blocking=True)
        self.ev[k].record(self.stream)

        def read():
            self.ev[k].synchronize()
            return self.buf[k].tolist()
        return read


def _likely_continues(seen, control0, P, tr):
    """Whether some running problem will probably take another step after the one in flight:
    its ``r^T r`` decay (and, in a trust region, its ``||S||^2`` growth) extrapolated one step
    from the last two known states stays clear of the tolerance (the boundary). Queueing a step
    that turns out to be past the end costs one product on the device; not queueing it costs
    one host round trip."""
    if not seen:  # a solve's first step: TRON's later solves often take just one
        return False
    last, prev = seen[-1], (seen[-2] if len(seen) > 1 else control0)
    run, rtr, tol2, sts, dsq = (control_slice(f, P).start for f in ("run", "rTr", "tol2", "sts", "dsq"))
    for j in range(P):
        if last[run + j] < 0.5:
            continue
        r1, r0 = last[rtr + j], prev[rtr + j]
        pred = r1 * min(r1 / r0, 1.0) if r0 > 0 else r1
        if pred <= 4.0 * last[tol2 + j]:
            continue
        if tr:
            s1, s0 = last[sts + j], prev[sts + j]
            if s1 + 2.0 * (s1 - s0) >= last[dsq + j]:
                continue
        return True
    return False


def _decided_steps(eng, max_steps, tr, first=None):
    """Up to ``max_steps`` device-decided CG steps of ``eng``, the host ``_lag()`` steps behind;
    ``first``: the first step's product, queued ahead (:meth:`_CGEngine.start_ahead`).

    Returns
    -------
    seen : list of list of float
        The control block after each step, in order, up to the first after which no problem
        runs (steps queued past it changed nothing on the device).
    issued : int
        Steps queued (products with the operator run).
    """
    P, lag = eng.P, _lag()
    run = control_slice("run", P)
    pending, seen, issued = deque(), [], 0
    while issued < max_steps:
        if issued == 0 and first is not None:
            eng._update(first)
        else:
            eng.step()
        issued += 1
        pending.append(eng.snaps.take())
        while pending and (len(pending) > lag or not _likely_continues(seen, eng.control0, P, tr)):
            seen.append(pending.popleft()())
            if not any(x > 0.5 for x in seen[-1][run]):
                return seen, issued
    while pending:
        seen.append(pending.popleft()())
    return seen, issued


def _tron_engine(obj, g, hstate, P):
    """The CG engine of ``obj``'s TRON solves: kept on ``obj`` across outer iterations when graphs
    apply (the Hessian state is copied into the captured buffers), a fresh eager one otherwise."""
    bind = getattr(obj, "hessp_op", None)
    if not (graph_safe(getattr(obj, "X", None)) and g.is_cuda):
        return _CGEngine(lambda D: obj.hessp(hstate, D), obj.dot, g, P, False, obj,
                         bind=None if bind is None else (lambda D: bind(hstate, D)), decide="tr")
    key = (tuple(g.shape), g.dtype, P, tuple(
        (k, tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (k, v) for k, v in sorted(hstate.items())))
    eng = obj.__dict__.get("_cg_engine")
    if eng is None or eng.key != key:
        static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in hstate.items()}
        eng = _CGEngine(lambda D: obj.hessp(static, D), obj.dot, g, P, True, obj, sparse=is_csr(obj.X),
                        bind=None if bind is None else (lambda D: bind(static, D)), decide="tr")
        eng.key, eng.static = key, static
        obj._cg_engine = eng
    else:
        for k, v in hstate.items():
            if isinstance(v, torch.Tensor):
                eng.static[k].copy_(v)
    return eng


def _ahead_enabled():
    """Whether the solvers start a solve before reading what it decides with
    (``FUSEDML_SOLVE_AHEAD``, default 1; 0 reads first, as before)."""
    return os.environ.get("FUSEDML_SOLVE_AHEAD", "1") != "0"


class _Ahead:
    """A TRON solve started before the host read what it decides with: its engine, the gradient
    and Hessian state it started from, and its first product (see :func:`_solve_ahead`)."""

    __slots__ = ("eng", "g", "hstate", "Ad")

    def __init__(self, eng, g, hstate, Ad):
        self.eng, self.g, self.hstate, self.Ad = eng, g, hstate, Ad


def _solve_ahead(obj, g, hstate, P):
    """Queue the next TRON solve's restart (``S = 0``, ``R = D = -g``) and first Hessian product
    before the host reads the trial point's sums: the product needs neither the trust radius nor
    the accept test, so the GPU runs it while the host decides (the ~0.1-0.3 ms between that read
    and the next launch otherwise leaves it idle, per outer iteration). Returns None where it does
    not apply: the CG steps decided on the host, X streamed from the host, or
    ``FUSEDML_SOLVE_AHEAD=0``. A solve that does not follow (converged, rejected) leaves one
    product unused."""
    from fusedml import CSRMatrix

    if (not _ahead_enabled() or not cg_update_applies(g, P)
            or not isinstance(getattr(obj, "X", None), (torch.Tensor, CSRMatrix))):
        return None
    eng = _tron_engine(obj, g, hstate, P)
    if not eng.decide:
        return None
    return _Ahead(eng, g, hstate, eng.start_ahead(g, negate=True))


def _likely_unconverged(host_stop, rtr, gnorm0, active, n):
    """Whether some active problem will probably NOT pass the stop rule at the trial point: its
    gradient predicted by the CG's last residual (``||g_t|| ~ ||g + H S||``), halved for margin,
    the largest entry bounded below by ``||g_t|| / sqrt(n)``."""
    if host_stop is None or not rtr:
        return False
    gn = [0.5 * math.sqrt(max(r, 0.0)) for r in rtr]
    conv = host_stop([x / math.sqrt(max(n, 1)) for x in gn], gn, gnorm0)
    conv = conv * len(gn) if len(conv) == 1 else conv
    return any(a and not c for a, c in zip(active, conv))


class _Reader:
    """Reads of small device vectors behind which the host queues more work: on CUDA an
    asynchronous copy into a pinned buffer and an event (the read waits for that copy only);
    elsewhere read at once."""

    def __init__(self):
        self.bufs, self.stream = {}, None

    def take(self, t):
        """Queue the copy of ``t``; return ``read() -> list of float``."""
        t = t.reshape(-1)
        if not t.is_cuda:
            v = _host(t)
            return lambda: v
        if self.stream is None:  # looked up once (~30 us of Python per lookup on the H200 host)
            self.stream = torch.cuda.current_stream(t.device)
        buf = self.bufs.get((t.numel(), t.dtype))
        if buf is None:
            buf = self.bufs[t.numel(), t.dtype] = torch.empty(t.numel(), dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(self.stream)

        def read():
            ev.synchronize()
            return [float(x) for x in buf.tolist()]
        return read


# --------------------------------------------------------------------------------------------
# TRON
# --------------------------------------------------------------------------------------------
def _boundary(std, sts, dtd, dsq):
    """The positive root a of ``||S + a D||^2 = delta^2`` (LIBLINEAR's trcg); 0 if undefined."""
    rad = math.sqrt(max(std * std + dtd * (dsq - sts), 0.0))
    try:
        a = (dsq - sts) / (std + rad) if std >= 0 else (rad - std) / dtd
    except ZeroDivisionError:
        return 0.0
    return _finite_or(a, 0.0)


def _trcg(obj, hstate, g, gnorm, delta, active, eps_cg, max_cg, gg=None, ahead=None, ends=None):
    """Truncated CG for ``H s = -g`` inside ``||s|| <= delta`` (LIBLINEAR ``trcg``), per problem.

    One host sync per CG step. The device half of the step (:class:`_CGEngine`: the direction
    update, the Hessian product, ``alpha = r^T r / d^T H d``, ``S + alpha D``, ``R - alpha H D``,
    ``||R||^2`` and the next ``beta``) runs in place, from a CUDA graph on the GPU (one launch);
    the host then reads ``d^T H d`` and the new ``||r||^2`` in ONE copy and decides in float64:
    curvature and trust-region tests (Steihaug's recurrences for ``||S||^2``, ``S^T D``,
    ``D^T D``), convergence. A step that leaves the region (rare: at most once per problem and
    solve) is redone from the kept ``S``/``R`` with the boundary root and the three inner
    products recomputed exactly.
    Per CG step: ONE ``obj.hessp`` (one mmchain), one sync; eager, ~12 small launches (P = 1).

    Parameters
    ----------
    gnorm : list of float
        ``||g||`` per problem (known to the caller: no sync here).
    delta : list of float
        Trust radius per problem.
    active : list of bool
    gg : [P] tensor, optional
        ``g^T g`` on the device (computed here if not given).
    ahead : _Ahead, optional
        This solve's restart and first product, queued by :func:`_solve_ahead` before the host
        read ``gnorm`` and ``delta`` (used when made from this ``g`` and ``hstate``).
    ends : list, optional
        Receives each problem's last ``r^T r`` (device-decided solves): ``||g + H S||^2``, the
        quadratic model's prediction of the next gradient's squared norm.

    Returns
    -------
    S : [D~, K] step (zero for inactive problems; a buffer the next solve on ``obj`` reuses)
    R : [D~, K] residual ``-g - H S`` (likewise)
    n_cg : int
        CG iterations run (the maximum over problems).
    reach : list of bool
        The step hit the trust-region boundary.
    """
    dot = obj.dot
    P = len(gnorm)
    rTr = [x * x for x in gnorm]
    cgtol = [eps_cg * x for x in gnorm]
    dsq = [d * d for d in delta]
    sts, std, dtd = [0.0] * P, [0.0] * P, list(rTr)
    run = [bool(a) and math.sqrt(r) > c for a, r, c in zip(active, rTr, cgtol)]
    reach = [False] * P
    if not any(run):
        return torch.zeros_like(g), torch.neg(g), 0, reach
    control = lambda: cg_control(rTr, [c * c for c in cgtol], run, dsq)  # noqa: E731
    if ahead is not None and ahead.g is g and ahead.hstate is hstate:  # started before the host decided
        eng = ahead.eng
        eng.set_control(control())
        seen, _ = _decided_steps(eng, max_cg, tr=True, first=ahead.Ad)
    else:
        eng = _tron_engine(obj, g, hstate, P)
        if eng.decide:  # the decisions below, made on the device: the host queues a step ahead
            eng.reset_decided(g, control(), negate=True)
            seen, _ = _decided_steps(eng, max_cg, tr=True)
    if eng.decide:
        last = seen[-1]
        if ends is not None:
            ends[:] = last[control_slice("rnew", P)]
        return (eng.S, eng.R, int(round(max(last[control_slice("steps", P)]))),
                [x > 0.5 for x in last[control_slice("reach", P)]])
    eng.reset(torch.neg(g), gg if gg is not None else dot(g, g), run)  # problems not running: masked
    S, R, Dv = eng.S, eng.R, eng.Dv
    n_cg = 0
    while n_cg < max_cg and any(run):
        n_cg += 1
        packed, Hd = eng.step()
        v = _host(packed)  # THE sync of the step
        dHd, rnew = v[:P], v[P:]
        alpha, over = [0.0] * P, [False] * P
        for j in range(P):
            if run[j]:
                a = rTr[j] / dHd[j] if dHd[j] > 0 else math.inf  # dHd <= 0 or NaN: to the boundary
                over[j] = not math.isfinite(a) or sts[j] + (2.0 * std[j] + a * dtd[j]) * a > dsq[j]
                alpha[j] = a
        if any(over):
            # back to the kept S, R; exact S^T D, S^T S, D^T D (LIBLINEAR computes them directly),
            # then the step again with the boundary root (and the plain alpha for the others)
            S.copy_(eng.S0)
            R.copy_(eng.R0)
            ex = _host(torch.stack([dot(S, Dv), dot(S, S), dot(Dv, Dv)]))
            for j in range(P):
                if over[j]:
                    std[j], sts[j], dtd[j] = ex[j], ex[P + j], ex[2 * P + j]
                    a = alpha[j]
                    over[j] = not math.isfinite(a) or sts[j] + (2.0 * std[j] + a * dtd[j]) * a > dsq[j]
                    alpha[j] = _boundary(std[j], sts[j], dtd[j], dsq[j]) if over[j] else a
            S.copy_(_axpy(S, _coef(alpha, S), Dv))
            R.copy_(_axpy(R, _coef([-a for a in alpha], R), Hd))
            if not all(over[j] for j in range(P) if run[j]):
                rnew = _host(dot(R, R))
                eng.set_scalars([_finite_or(rnew[j] / rTr[j], 0.0) if run[j] and not over[j] and rTr[j] > 0 else 0.0
                                 for j in range(P)], rnew)
        was = list(run)
        for j in range(P):
            if run[j]:
                a = alpha[j]
                sts[j] += (2.0 * std[j] + a * dtd[j]) * a
                if over[j]:
                    reach[j], run[j] = True, False
                    continue
                b = _finite_or(rnew[j] / rTr[j], 0.0) if rTr[j] > 0 else 0.0
                std[j] = b * (std[j] + a * dtd[j])
                dtd[j] = rnew[j] + b * b * dtd[j]
                rTr[j] = rnew[j]
                run[j] = math.sqrt(max(rnew[j], 0.0)) > cgtol[j]
        if P > 1 and any(run) and run != was:
            eng.set_mask(run)  # stopped problems: alpha and beta 0 from the next step on
    return S, R, n_cg, reach


def tron(obj, W0, *, max_iter, stop, history=None, eps_cg=0.1, max_cg=None):
    """Trust-region Newton method with truncated CG (LIBLINEAR's TRON).

    Per outer iteration: ONE ``evaluate_gradient`` at the trial point before the accept test (a
    further ``gradient`` only when some, not all, of K independent problems reject), and one
    ``hessp`` (one mmchain) per CG step; ONE host sync at the outer level (trial objective,
    ``g^T S``, ``S^T R``, ``S^T S``, the new gradient norm and convergence test) besides the
    one per CG step. Where the CG steps are decided on the device, the next solve's restart and
    first product are queued behind that sync's copy (:func:`_solve_ahead`) when the quadratic
    model predicts another iteration: the GPU reads X while the host decides.
    The trust-region logic runs on the host in float64 Python floats, one per problem.

    Parameters
    ----------
    obj : LinearObjective-like
        ``evaluate_gradient``, ``gradient``, ``hessp``, ``dot``, ``merge``, ``n_problems``.
    W0 : torch.Tensor [D~, K]
        Start point.
    max_iter : int
        Cap on outer iterations (accepted or rejected).
    stop : callable ``(g, gnorm, gnorm0) -> [P] bool`` tensor, or StopRule
        Convergence rule on the gradient (``gnorm``, ``gnorm0``: [P] tensors on g's device). A
        :class:`StopRule` also has a host form: the accept test then takes its sums from one
        launch (:func:`fusedml.cg.trial_sums`, where it applies) and decides on the host.
    history : History, optional
        Receives one record per outer iteration (objective summed over problems, largest
        gradient norm, largest step norm, CG iterations).
    eps_cg : float
        CG stops when ``||r|| <= eps_cg * ||g||`` (LIBLINEAR: 0.1).
    max_cg : int, optional
        Cap on CG iterations per outer iteration (default: the number of unknowns per problem).

    Returns
    -------
    SolverResult
    """
    eta0, eta1, eta2 = 1e-4, 0.25, 0.75
    sigma1, sigma2, sigma3 = 0.25, 0.5, 4.0
    dot = obj.dot
    if max_cg is None:
        max_cg = max(W0.numel() if obj.coupled else W0.shape[0], 1)
    thr = _precision(W0.dtype)

    check = getattr(obj, "finite_check", None)  # X's NaN / inf check: read with the start's objective
    flag = None if check is None else check.queue()
    step = getattr(obj, "evaluate_gradient_step", None)  # trial points into buffers st does not use
    st, g, hs = step({"W": W0}) if step is not None else obj.evaluate_gradient(W0)
    f_dev = st["f"].reshape(-1)
    P = f_dev.numel()
    gnorm0_dev = None

    reader = _Reader()

    def grad_info(g, first=None, then=None):
        gg = dot(g, g)
        gn = torch.sqrt(gg)
        conv = stop(g, gn, gn if gnorm0_dev is None else gnorm0_dev)
        parts = [gn.double(), conv.double()]
        packed = torch.cat(parts if first is None else [first.double()] + parts)
        if then is None:
            v, after = _host(packed), None  # one sync: norms and the test
        else:  # ... with ``then()`` queued behind the copy
            read = reader.take(packed)
            after = then()
            v = read()
        head, v = ([], v) if first is None else (v[:first.numel()], v[first.numel():])
        return v[:P], [x > 0.5 for x in v[P:]], gg, gn, head, after

    # the first solve starts behind the start's copy (a start already converged leaves one product unused)
    gnorm, conv, gg, gnorm0_dev, f, ahead = grad_info(
        g, first=f_dev if flag is None else torch.cat([f_dev.double(), flag]),
        then=(lambda: _solve_ahead(obj, g, hs, P)) if max_iter >= 1 else None)
    if flag is not None:
        check.resolve(f.pop())
    if not all(math.isfinite(x) for x in f):
        raise ValueError("the objective is not finite at the starting point (check the link/family and the targets)")
    gnorm0 = list(gnorm)
    host_stop = getattr(stop, "host", None)
    n_unknowns = W0.numel() if P == 1 else W0.shape[0]
    active = [not c for c in conv]
    n_iter, stalled = [0] * P, [False] * P
    delta = list(gnorm)
    sum_ops = {}  # bound trial_sums launches by their vectors
    if history is not None:
        history.add(0, sum(f), max(gnorm), 0.0, cg_iter=0)
    for it in range(1, max_iter + 1):
        if not any(active):
            break
        ends = []
        S, R, n_cg, reach = _trcg(obj, hs, g, gnorm, delta, active, eps_cg, max_cg, gg=gg, ahead=ahead, ends=ends)
        ahead = None
        # The gradient at the trial point is computed with its objective, before the accept test
        # (TRON rarely rejects; a rejected step wastes this X^T v, on every backend alike), so
        # ONE sync brings the trial objective, g^T S, S^T R, S^T S, ||g_new|| and the test.
        stn, g_t, hs_t = step(st, S) if step is not None else obj.evaluate_gradient(_axpy(st["W"], 1.0, S))
        if host_stop is not None and trial_sums_applies((g, S, R, g_t), P):
            # one launch for the accept test's sums (float64), the stop rule on the host; bound
            # where g and g_t are the objective's two trial buffers (which alternate)
            # [f_t, g^T S, S^T R, S^T S, ||g_t||^2, max |g_t|]: the kernel copies f_t ahead of its sums
            f_t = stn["f"].reshape(-1)
            f_in = f_t if f_t.dtype == torch.float64 and f_t.numel() == P and f_t.is_contiguous() else None
            if st.get("bound") and stn.get("bound"):
                sums = _bound_call(sum_ops, (id(g), id(S), id(R), id(g_t), None if f_in is None else f_in.data_ptr()),
                                   lambda: bind_trial_sums(g, S, R, g_t, P, f=f_in))
            else:
                sums = trial_sums(g, S, R, g_t, P, f=f_in)
            packed = sums if f_in is not None else torch.cat([f_t.to(torch.float64), sums])
            gg_t = packed[4 * P:5 * P]
            if it < max_iter and _likely_unconverged(host_stop, ends, gnorm0, active, n_unknowns):
                read = reader.take(packed)  # the next solve starts behind the copy, from the trial point
                ahead = _solve_ahead(obj, g_t, hs_t, P)
                v = read()
            else:
                v = _host(packed)
            v[4 * P:5 * P] = [math.sqrt(max(x, 0.0)) if math.isfinite(x) else x for x in v[4 * P:5 * P]]
            conv_t = host_stop(v[5 * P:6 * P], v[4 * P:5 * P], gnorm0)
        else:
            gg_t = dot(g_t, g_t)
            gn_t = torch.sqrt(gg_t)
            red = torch.stack([dot(g, S), dot(S, R), dot(S, S), gn_t]).reshape(-1).to(torch.float64)
            v = _host(torch.cat([stn["f"].reshape(-1), red, stop(g_t, gn_t, gnorm0_dev).reshape(-1).double()]))
            conv_t = [x > 0.5 for x in v[5 * P:6 * P]]
        accept, snorm = [False] * P, [0.0] * P
        for j in range(P):
            fnew, gs, sR, ss = v[j], v[P + j], v[2 * P + j], v[3 * P + j]
            if not math.isfinite(fnew):
                fnew = math.inf
            snorm[j] = sn = math.sqrt(max(ss, 0.0))
            if not active[j]:
                continue
            dl = delta[j]
            if it == 1:
                dl = min(dl, sn)
            prered = -0.5 * (gs - sR)
            actred = f[j] - fnew
            denom = fnew - f[j] - gs
            if denom <= 0:
                al = sigma3
            else:
                al = max(-0.5 * (gs / denom), sigma1) if math.isfinite(denom) else sigma1
            if not math.isfinite(al):
                al = sigma1
            if actred < eta0 * prered:
                dl = min(al * sn, sigma2 * dl)
            elif actred < eta1 * prered:
                dl = max(sigma1 * dl, min(al * sn, sigma2 * dl))
            elif actred < eta2 * prered:
                dl = max(sigma1 * dl, min(al * sn, sigma3 * dl))
            elif reach[j]:
                dl = sigma3 * dl
            else:
                dl = max(dl, min(al * sn, sigma3 * dl))
            delta[j] = dl
            accept[j] = actred > eta0 * prered
            n_iter[j] += 1
            absf = abs(f[j])
            # LIBLINEAR's "no progress" exits; a tiny but accepted step still counts as progress
            stalled[j] = (prered <= 0) or (not accept[j] and abs(actred) <= thr * absf and abs(prered) <= thr * absf)
            if accept[j]:
                f[j] = fnew
        if any(accept):
            if all(accept[j] for j in range(P) if active[j]):
                # every active problem moves (inactive ones have S = 0: the trial point is theirs)
                st, g, hs, gg = stn, g_t, hs_t, gg_t
                gnorm = [v[4 * P + j] if active[j] else gnorm[j] for j in range(P)]
                conv = [conv_t[j] if active[j] else conv[j] for j in range(P)]
            else:  # some problems reject: merge per problem, gradient of the merged state
                st = obj.merge(torch.tensor(accept, device=g.device), stn, st)
                g, hs = obj.gradient(st)
                gnorm, conv, gg = grad_info(g)[:3]
        for j in range(P):
            if active[j]:
                stalled[j] = stalled[j] and not conv[j]
                active[j] = not conv[j] and not stalled[j]
        if history is not None:
            history.add(it, sum(f), max(gnorm), max(snorm), cg_iter=n_cg)
    for k in ("_cg_engine", "_lg_slots", "_points"):  # its CUDA graph and buffers; the trial buffers (W stays ours)
        obj.__dict__.pop(k, None)
    status = ["converged" if c else ("stalled" if s else "max_iter") for c, s in zip(conv, stalled)]
    return SolverResult(st["W"], n_iter, status, st)


# --------------------------------------------------------------------------------------------
# L-BFGS
# --------------------------------------------------------------------------------------------
def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    if not all(math.isfinite(v) for v in (f1, f2, g1, g2)):
        return 0.5 * (lo + hi)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 * d1 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        if not math.isfinite(min_pos):
            return 0.5 * (lo + hi)
        return min(max(min_pos, lo), hi)
    return 0.5 * (lo + hi)


def _strong_wolfe(phi, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-12, max_ls=25):
    """Strong-Wolfe line search (Nocedal & Wright Alg. 3.5/3.6, as in torch.optim.LBFGS).

    ``phi(t) -> (f, g, gtd, state)``; returns ``(t, f, g, state, n_evals)``.
    """
    d_norm = float(d.abs().max())
    f_new, g_new, gtd_new, s_new = phi(t)
    n_evals = 1
    t_prev, f_prev, g_prev, gtd_prev, s_prev = 0.0, f, g, gtd, None
    done = False
    ls_iter = 0
    bracket = None
    while ls_iter < max_ls:
        if f_new > f + c1 * t * gtd or (ls_iter > 1 and f_new >= f_prev):
            bracket = [[t_prev, f_prev, g_prev, gtd_prev, s_prev], [t, f_new, g_new, gtd_new, s_new]]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket = [[t, f_new, g_new, gtd_new, s_new]]
            done = True
            break
        if gtd_new >= 0:
            bracket = [[t_prev, f_prev, g_prev, gtd_prev, s_prev], [t, f_new, g_new, gtd_new, s_new]]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev, s_prev = tmp, f_new, g_new, gtd_new, s_new
        f_new, g_new, gtd_new, s_new = phi(t)
        n_evals += 1
        ls_iter += 1
    if bracket is None:
        bracket = [[0.0, f, g, gtd, None], [t, f_new, g_new, gtd_new, s_new]]
    insuf_progress = False
    if len(bracket) == 2:
        low, high = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
    else:
        low = 0
    while not done and ls_iter < max_ls and len(bracket) == 2:
        a, b = bracket[0][0], bracket[1][0]
        if abs(b - a) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(a, bracket[0][1], bracket[0][3], b, bracket[1][1], bracket[1][3])
        hi_t, lo_t = max(a, b), min(a, b)
        eps = 0.1 * (hi_t - lo_t)
        if min(hi_t - t, t - lo_t) < eps:
            if insuf_progress or t >= hi_t or t <= lo_t:
                t = hi_t - eps if abs(t - hi_t) < abs(t - lo_t) else lo_t + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new, gtd_new, s_new = phi(t)
        n_evals += 1
        ls_iter += 1
        if f_new > f + c1 * t * gtd or f_new >= bracket[low][1]:
            bracket[high] = [t, f_new, g_new, gtd_new, s_new]
            low, high = (0, 1) if bracket[0][1] <= bracket[1][1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high][0] - bracket[low][0]) >= 0:
                bracket[high] = list(bracket[low])
            bracket[low] = [t, f_new, g_new, gtd_new, s_new]
    t, f_new, g_new, gtd_new, s_new = bracket[low]
    return t, f_new, g_new, s_new, n_evals


def lbfgs(obj, W0, *, max_iter, stop, history=None, memory=10, max_ls=25, ftol=None):
    """L-BFGS (two-loop recursion) with a strong-Wolfe line search, for a coupled problem.

    Each objective/gradient evaluation is one ``evaluate_gradient`` (one read of X fused; a
    ``matvec`` and ``X^T (p - y)`` otherwise).

    Parameters
    ----------
    obj : LinearObjective-like (coupled, one problem)
    W0 : torch.Tensor [D~, K]
    max_iter : int
    stop : callable ``(g, gnorm, gnorm0) -> [1] bool``
    history : History, optional
    memory : int
        Number of stored correction pairs.
    max_ls : int
        Line-search evaluations per iteration.
    ftol : float, optional
        Stop when the relative objective decrease falls below ``ftol``; default ``64 * eps`` of
        float64, as scikit-learn's L-BFGS-B, for every compute dtype: the objective is summed in
        float64 (an fp32 ftol, 7.6e-6, stopped fp32 fits with the gradient still 10^3 x above
        ``tol`` and the coefficients 4e-3 off, without a warning; tests/fuzz.py fit:155).

    Returns
    -------
    SolverResult
    """
    if not obj.coupled:
        raise ValueError("lbfgs solves one coupled problem")
    dot = obj.dot
    if ftol is None:
        ftol = 64 * torch.finfo(torch.float64).eps

    check = getattr(obj, "finite_check", None)  # X's NaN / inf check: read with the start's objective
    flag = None if check is None else check.queue()
    st, g, _ = obj.evaluate_gradient(W0)
    if flag is None:
        f = _host(st["f"])[0]
    else:
        f, ok = _host(torch.cat([st["f"].reshape(-1).double(), flag]))
        check.resolve(ok)
    if not math.isfinite(f):
        raise ValueError("the objective is not finite at the starting point")
    gnorm = torch.sqrt(dot(g, g))
    gnorm0 = gnorm.clone()
    gn0, conv0 = _host(torch.cat([gnorm, stop(g, gnorm, gnorm0).all().reshape(1).to(gnorm.dtype)]))
    if history is not None:
        history.add(0, f, gn0, 0.0, ls_evals=0)
    status = "converged" if conv0 > 0.5 else "max_iter"
    S_mem, Y_mem, rho_mem = deque(maxlen=memory), deque(maxlen=memory), deque(maxlen=memory)
    n_iter = 0
    gamma = 1.0
    W = st["W"]
    while status == "max_iter" and n_iter < max_iter:
        n_iter += 1
        # two-loop recursion: d = -H g
        q = -g
        alphas = []
        for s_i, y_i, rho_i in reversed(list(zip(S_mem, Y_mem, rho_mem))):
            a_i = rho_i * dot(s_i, q)
            q = q - a_i * y_i
            alphas.append(a_i)
        d = q * gamma
        for (s_i, y_i, rho_i), a_i in zip(zip(S_mem, Y_mem, rho_mem), reversed(alphas)):
            b_i = rho_i * dot(y_i, d)
            d = d + (a_i - b_i) * s_i
        if n_iter == 1:
            gtd, gabs = _host(torch.stack([dot(g, d).reshape(()), g.abs().sum().to(d.dtype)]))
            t0 = min(1.0, 1.0 / max(gabs, 1e-300))
        else:
            gtd, t0 = _host(dot(g, d))[0], 1.0
        if not gtd < 0:  # not a descent direction: restart from steepest descent
            S_mem.clear(), Y_mem.clear(), rho_mem.clear()
            d, gamma = -g, 1.0
            gtd = _host(dot(g, d))[0]

        def phi(t, W=W, d=d):
            # objective and directional derivative in ONE sync (the gradient is computed before
            # f is known: it is discarded in the rare case f is not finite)
            s_t, g_t, _ = obj.evaluate_gradient(_axpy(W, float(t), d))
            f_t, gtd_t = _host(torch.cat([s_t["f"].reshape(1), dot(g_t, d).reshape(1).double()]))
            if not math.isfinite(f_t):
                return math.inf, None, math.nan, s_t
            return f_t, g_t, gtd_t, s_t

        t, f_new, g_new, s_new, n_evals = _strong_wolfe(phi, t0, d, f, g, gtd, max_ls=max_ls)
        if s_new is None or g_new is None or not math.isfinite(f_new) or f_new > f:
            status = "stalled"  # the line search found no acceptable point
            if history is not None:
                history.add(n_iter, f, _host(gnorm)[0], 0.0, ls_evals=n_evals)
            break
        s_vec = t * d
        y_vec = g_new - g
        f_old, f = f, f_new
        W, g, st = s_new["W"], g_new, s_new
        gnorm = torch.sqrt(dot(g, g))
        # one sync: y^T s, y^T y, ||g||, ||d||, the convergence test
        ys, yy, gn, dn, conv = _host(torch.cat([dot(y_vec, s_vec), dot(y_vec, y_vec), gnorm,
                                                torch.sqrt(dot(d, d)), stop(g, gnorm, gnorm0).all().reshape(1)
                                                .to(gnorm.dtype)]))
        if ys > 1e-10 * max(yy, 1e-300):
            S_mem.append(s_vec), Y_mem.append(y_vec), rho_mem.append(1.0 / ys)
            gamma = ys / yy
        step = t * dn
        if history is not None:
            history.add(n_iter, f, gn, step, ls_evals=n_evals)
        if conv > 0.5:
            status = "converged"
        elif (f_old - f) / max(abs(f_old), abs(f), 1.0) <= ftol:
            status = "converged"  # L-BFGS-B's relative-reduction exit (scikit-learn treats it as converged)
    return SolverResult(W, [n_iter], [status], st)


# --------------------------------------------------------------------------------------------
# linear CG (SystemDS lmCG)
# --------------------------------------------------------------------------------------------
def conjugate_gradient(apply_A, B, *, tol, max_iter, history=None, offset=0.0, graphs=False, sparse=False,
                       check=None):
    """Conjugate gradient for ``A P = B`` with ``A`` symmetric positive (semi-)definite.

    Columns of ``B`` are independent systems sharing ``A``'s structure (each ``apply_A`` call is
    one mmchain for all of them); each column stops when ``||r_j|| <= tol * ||b_j||``.
    Per step ONE ``apply_A`` and ONE host sync: the device half of the step (:class:`_CGEngine`:
    direction, ``apply_A``, ``alpha``, the updates, ``||r||^2``, ``beta``) runs in place, from a
    CUDA graph when ``graphs`` and B is on the GPU (one launch); the host reads ``d^T A d`` and
    ``||r||^2`` in one copy and decides in float64 (decided on the device, the restart and first
    product are queued behind the first copy, as TRON's, :func:`_solve_ahead`). The recorded
    objective and step norm follow the CG recurrences (``q(P + a D) = q(P) - a ||r||^2 / 2``,
    ``||D_new||^2 = ||r_new||^2 + beta^2 ||D||^2``), so ``history`` costs no launch and no sync.

    Parameters
    ----------
    apply_A : callable ``[D, m] -> [D, m]``
    B : torch.Tensor [D, m]
    tol : float
    max_iter : int
    history : History, optional
        Records the quadratic objective ``offset + 0.5 p^T A p - b^T p`` (summed over columns),
        the largest residual norm and the largest step norm.
    offset : float
        Constant added to the recorded objective (e.g. ``||y||^2 / 2`` to report the loss).
    graphs : bool
        ``apply_A`` may be captured in a CUDA graph (no host sync, no host-side data decisions;
        see :func:`graph_safe`).
    sparse : bool
        ``apply_A`` multiplies by a CSR matrix: with ``graphs``, the capture comes after
        ``_Replay.capture_after_sparse`` eager steps instead of ``_Replay.capture_after``.
    check : algorithms._base.FiniteCheck, optional
        A queued input check, read with the first host copy (``||b||^2``) and resolved (raised)
        before anything else.

    Returns
    -------
    SolverResult
        With ``n_steps``, the number of ``apply_A`` evaluations.
    """
    cdot = lambda A, C: (A * C).sum(0)  # noqa: E731 - per-column inner products [m]
    m = B.shape[1]
    rr_dev = cdot(B, B)
    packed = rr_dev if check is None else torch.cat([rr_dev.double(), check.flag])  # with the input check's flag
    eng = _CGEngine(apply_A, cdot, B, m, graphs and B.is_cuda, keep_previous=False, sparse=sparse, decide="plain")
    first = None
    if eng.decide and _ahead_enabled():  # the restart and first product queued behind the copy (as TRON's)
        read = _Reader().take(packed)
        first = eng.start_ahead(B)
        rr = read()
    else:
        rr = _host(packed)  # the one sync before the loop
    if check is not None:
        check.resolve(rr.pop())
    bnorm = [math.sqrt(max(x, 0.0)) for x in rr]
    dd = list(rr)
    q = [0.0] * m  # 0.5 p^T A p - b^T p per column
    run = [math.sqrt(max(r, 0.0)) > tol * b for r, b in zip(rr, bnorm)]
    n_iter = [0] * m
    if history is not None:
        history.add(0, float(offset), max(bnorm), 0.0)
    if eng.decide and any(run):  # decisions on the device, the host a step behind; history replayed
        control = cg_control(rr, [(tol * b) ** 2 for b in bnorm], run)
        if first is None:
            eng.reset_decided(B, control)
        else:
            eng.set_control(control)
        seen, it = _decided_steps(eng, max_iter, tr=False, first=first)
        steps = [0.0] * m
        f_steps, f_alpha, f_rnew = (control_slice(f, m).start for f in ("steps", "alpha", "rnew"))
        for k, v in enumerate(seen, 1):
            step = 0.0
            for j in range(m):
                if v[f_steps + j] > steps[j]:  # problem j took this step
                    steps[j] = v[f_steps + j]
                    a, rnew = v[f_alpha + j], v[f_rnew + j]
                    step = max(step, abs(a) * math.sqrt(max(dd[j], 0.0)))
                    q[j] -= 0.5 * a * rr[j]
                    n_iter[j] += 1
                    b = _finite_or(rnew / rr[j], 0.0) if rr[j] > 0 else 0.0
                    rr[j] = rnew
                    dd[j] = rnew + b * b * dd[j]
            if history is not None:  # every step read was taken by some column
                history.add(k, offset + sum(q), max(math.sqrt(max(x, 0.0)) for x in rr), step)
    else:
        eng.reset(B, rr_dev, run)  # converged columns: masked (alpha and beta 0)
        it = 0
        while it < max_iter and any(run):
            it += 1
            v = _host(eng.step()[0])  # THE sync of the step
            dAd, rnew = v[:m], v[m:]
            alpha = [(_finite_or(rr[j] / dAd[j], 0.0) if dAd[j] != 0 else 0.0) if run[j] else 0.0 for j in range(m)]
            step = max(abs(a) * math.sqrt(max(d, 0.0)) for a, d in zip(alpha, dd))
            was = list(run)
            for j in range(m):
                if run[j]:
                    q[j] -= 0.5 * alpha[j] * rr[j]
                    n_iter[j] += 1
                    b = _finite_or(rnew[j] / rr[j], 0.0) if rr[j] > 0 else 0.0
                    rr[j] = rnew[j]
                    run[j] = math.sqrt(max(rnew[j], 0.0)) > tol * bnorm[j]
                    if run[j]:
                        dd[j] = rnew[j] + b * b * dd[j]
            if m > 1 and any(run) and run != was:
                eng.set_mask(run)
            if history is not None:
                history.add(it, offset + sum(q), max(math.sqrt(max(x, 0.0)) for x in rr), step)
    P = eng.S
    status = ["converged" if not (math.sqrt(max(r, 0.0)) > tol * b) else "max_iter" for r, b in zip(rr, bnorm)]
    res = SolverResult(P, n_iter, status)
    res.n_steps = it  # apply_A calls (a replayed step runs its Python once)
    return res
