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
design). Per TRON CG step: one Hessian mmchain, ONE sync and ~8 small launches (alpha is formed
on the device, the updates and ``||r||^2`` are queued behind the mmchain's read of X). Per TRON
outer iteration: one objective-and-gradient pass at the trial point (margins, loss, gradient and
Hessian weights: one read of X on the fused backend, a matvec and an ``X^T v`` on the others),
before the accept test, and ONE sync. Linear CG: one
mmchain and ONE sync per step. L-BFGS: one sync per line-search evaluation and one per
iteration. Coefficients that differ per problem travel H2D from pinned memory (asynchronous).
"""
from __future__ import annotations

import math
from collections import deque

import torch

__all__ = ["SolverResult", "conjugate_gradient", "lbfgs", "tron"]


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


def _trcg(obj, hstate, g, gnorm, delta, active, eps_cg, max_cg, gg=None):
    """Truncated CG for ``H s = -g`` inside ``||s|| <= delta`` (LIBLINEAR ``trcg``), per problem.

    One host sync per CG step. The step ``alpha = r^T r / d^T H d`` is formed on the device and
    the updates ``S + alpha D``, ``R - alpha H D`` and ``||R||^2`` are queued right behind the
    Hessian product (hidden behind its read of X); the host then reads ``d^T H d`` and the new
    ``||r||^2`` in ONE copy and decides in float64: curvature and trust-region tests (Steihaug's
    recurrences for ``||S||^2``, ``S^T D``, ``D^T D``), convergence, ``beta``. A step that leaves
    the region (rare: at most once per problem and solve) is redone from the kept ``S``/``R``
    with the boundary root and the three inner products recomputed exactly.
    Per CG step: ONE ``obj.hessp`` (one mmchain), one sync, seven small launches (P = 1).

    Parameters
    ----------
    gnorm : list of float
        ``||g||`` per problem (known to the caller: no sync here).
    delta : list of float
        Trust radius per problem.
    active : list of bool
    gg : [P] tensor, optional
        ``g^T g`` on the device (computed here if not given).

    Returns
    -------
    S : [D~, K] step (zero for inactive problems)
    R : [D~, K] residual ``-g - H S``
    n_cg : int
        CG iterations run (the maximum over problems).
    reach : list of bool
        The step hit the trust-region boundary.
    """
    dot = obj.dot
    P = len(gnorm)
    S = torch.zeros_like(g)
    R = torch.neg(g)
    Dv = R
    rTr = [x * x for x in gnorm]
    cgtol = [eps_cg * x for x in gnorm]
    dsq = [d * d for d in delta]
    sts, std, dtd = [0.0] * P, [0.0] * P, list(rTr)
    run = [bool(a) and math.sqrt(r) > c for a, r, c in zip(active, rTr, cgtol)]
    reach = [False] * P
    if not any(run):
        return S, R, 0, reach

    def masked(t):  # [P] device values, zero for problems not running (their alpha must be 0)
        return t if all(run) else t * _coef([1.0 if r else 0.0 for r in run], t).reshape(-1)

    rTr_dev = masked(gg if gg is not None else dot(g, g))
    n_cg = 0
    while n_cg < max_cg and any(run):
        n_cg += 1
        Hd = obj.hessp(hstate, Dv)
        dHd_dev = dot(Dv, Hd)
        a_dev = rTr_dev / dHd_dev
        if P > 1:  # columns not running: 0 / x (or 0 / 0) -> 0
            a_dev = torch.nan_to_num(a_dev, nan=0.0, posinf=0.0, neginf=0.0).reshape(1, P)
        S_try = torch.addcmul(S, a_dev, Dv)
        R_try = torch.addcmul(R, a_dev, Hd, value=-1.0)
        rnew_dev = dot(R_try, R_try)
        v = _host(torch.cat([dHd_dev, rnew_dev]))  # THE sync of the step
        dHd, rnew = v[:P], v[P:]
        alpha, over = [0.0] * P, [False] * P
        for j in range(P):
            if run[j]:
                a = rTr[j] / dHd[j] if dHd[j] > 0 else math.inf  # dHd <= 0 or NaN: to the boundary
                over[j] = not math.isfinite(a) or sts[j] + (2.0 * std[j] + a * dtd[j]) * a > dsq[j]
                alpha[j] = a
        if any(over):
            # exact S^T D, S^T S, D^T D (LIBLINEAR computes them directly), then redo the step
            # from the kept S, R with the boundary root (and the plain alpha for the others)
            ex = _host(torch.stack([dot(S, Dv), dot(S, S), dot(Dv, Dv)]))
            for j in range(P):
                if over[j]:
                    std[j], sts[j], dtd[j] = ex[j], ex[P + j], ex[2 * P + j]
                    a = alpha[j]
                    over[j] = not math.isfinite(a) or sts[j] + (2.0 * std[j] + a * dtd[j]) * a > dsq[j]
                    alpha[j] = _boundary(std[j], sts[j], dtd[j], dsq[j]) if over[j] else a
            S_try = _axpy(S, _coef(alpha, S), Dv)
            R_try = _axpy(R, _coef([-a for a in alpha], R), Hd)
            if not all(over[j] for j in range(P) if run[j]):
                rnew_dev = dot(R_try, R_try)
                rnew = _host(rnew_dev)
        S, R = S_try, R_try
        beta = [0.0] * P
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
                beta[j] = b if run[j] else 0.0
        if any(run):
            Dv = _axpy(R, _coef(beta, R), Dv)  # stopped problems: beta 0, Dv = R stays finite
            rTr_dev = masked(rnew_dev)
    return S, R, n_cg, reach


def tron(obj, W0, *, max_iter, stop, history=None, eps_cg=0.1, max_cg=None):
    """Trust-region Newton method with truncated CG (LIBLINEAR's TRON).

    Per outer iteration: ONE ``evaluate_gradient`` at the trial point before the accept test (a
    further ``gradient`` only when some, not all, of K independent problems reject), and one
    ``hessp`` (one mmchain) per CG step; ONE host sync at the outer level (trial objective,
    ``g^T S``, ``S^T R``, ``S^T S``, the new gradient norm and convergence test) besides the
    one per CG step.
    The trust-region logic runs on the host in float64 Python floats, one per problem.

    Parameters
    ----------
    obj : LinearObjective-like
        ``evaluate_gradient``, ``gradient``, ``hessp``, ``dot``, ``merge``, ``n_problems``.
    W0 : torch.Tensor [D~, K]
        Start point.
    max_iter : int
        Cap on outer iterations (accepted or rejected).
    stop : callable ``(g, gnorm, gnorm0) -> [P] bool`` tensor
        Convergence rule on the gradient (``gnorm``, ``gnorm0``: [P] tensors on g's device).
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

    st, g, hs = obj.evaluate_gradient(W0)
    f = _host(st["f"])
    if not all(math.isfinite(x) for x in f):
        raise ValueError("the objective is not finite at the starting point (check the link/family and the targets)")
    P = len(f)
    gnorm0_dev = torch.sqrt(dot(g, g))

    def grad_info(g):
        gg = dot(g, g)
        gn = torch.sqrt(gg)
        conv = stop(g, gn, gnorm0_dev)
        v = _host(torch.cat([gn.double(), conv.double()]))  # one sync: norms and the test
        return v[:P], [x > 0.5 for x in v[P:]], gg

    gnorm, conv, gg = grad_info(g)
    active = [not c for c in conv]
    n_iter, stalled = [0] * P, [False] * P
    delta = list(gnorm)
    if history is not None:
        history.add(0, sum(f), max(gnorm), 0.0, cg_iter=0)
    for it in range(1, max_iter + 1):
        if not any(active):
            break
        S, R, n_cg, reach = _trcg(obj, hs, g, gnorm, delta, active, eps_cg, max_cg, gg=gg)
        # The gradient at the trial point is computed with its objective, before the accept test
        # (TRON rarely rejects; a rejected step wastes this X^T v, on every backend alike), so
        # ONE sync brings the trial objective, g^T S, S^T R, S^T S, ||g_new|| and the test.
        stn, g_t, hs_t = obj.evaluate_gradient(_axpy(st["W"], 1.0, S))
        gg_t = dot(g_t, g_t)
        gn_t = torch.sqrt(gg_t)
        red = torch.stack([dot(g, S), dot(S, R), dot(S, S), gn_t]).reshape(-1).to(torch.float64)
        v = _host(torch.cat([stn["f"].reshape(-1), red, stop(g_t, gn_t, gnorm0_dev).reshape(-1).double()]))
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
                conv = [v[5 * P + j] > 0.5 if active[j] else conv[j] for j in range(P)]
            else:  # some problems reject: merge per problem, gradient of the merged state
                st = obj.merge(torch.tensor(accept, device=g.device), stn, st)
                g, hs = obj.gradient(st)
                gnorm, conv, gg = grad_info(g)
        for j in range(P):
            if active[j]:
                stalled[j] = stalled[j] and not conv[j]
                active[j] = not conv[j] and not stalled[j]
        if history is not None:
            history.add(it, sum(f), max(gnorm), max(snorm), cg_iter=n_cg)
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
        Stop when the relative objective decrease falls below ``ftol`` (scikit-learn/L-BFGS-B:
        ``64 * eps``); default ``64 * eps`` of the compute dtype.

    Returns
    -------
    SolverResult
    """
    if not obj.coupled:
        raise ValueError("lbfgs solves one coupled problem")
    dot = obj.dot
    if ftol is None:
        ftol = 64 * torch.finfo(W0.dtype).eps

    st, g, _ = obj.evaluate_gradient(W0)
    f = _host(st["f"])[0]
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
def conjugate_gradient(apply_A, B, *, tol, max_iter, history=None, offset=0.0):
    """Conjugate gradient for ``A P = B`` with ``A`` symmetric positive (semi-)definite.

    Columns of ``B`` are independent systems sharing ``A``'s structure (each ``apply_A`` call is
    one mmchain for all of them); each column stops when ``||r_j|| <= tol * ||b_j||``.
    Per step ONE ``apply_A`` and ONE host sync: ``alpha`` is formed on the device and the
    updates and ``||r||^2`` are queued behind ``apply_A``; the host reads ``d^T A d`` and
    ``||r||^2`` in one copy and decides in float64 (about eight small launches for m = 1;
    ``beta`` comes from the host). The recorded objective and step norm follow the
    CG recurrences (``q(P + a D) = q(P) - a ||r||^2 / 2``, ``||D_new||^2 = ||r_new||^2 +
    beta^2 ||D||^2``), so ``history`` costs no launch and no sync.

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

    Returns
    -------
    SolverResult
    """
    cdot = lambda A, C: (A * C).sum(0)  # noqa: E731 - per-column inner products [m]
    m = B.shape[1]
    P = torch.zeros_like(B)
    R = B
    Dv = B
    rr_dev = cdot(B, B)
    rr = _host(rr_dev)  # the one sync before the loop
    bnorm = [math.sqrt(max(x, 0.0)) for x in rr]
    dd = list(rr)
    q = [0.0] * m  # 0.5 p^T A p - b^T p per column
    run = [math.sqrt(max(r, 0.0)) > tol * b for r, b in zip(rr, bnorm)]
    n_iter = [0] * m

    def masked(t):  # [m] device values, zero for converged columns (their alpha must be 0)
        return t if all(run) else t * _coef([1.0 if r else 0.0 for r in run], t).reshape(-1)

    if history is not None:
        history.add(0, float(offset), max(bnorm), 0.0)
    rr_dev = masked(rr_dev)
    it = 0
    while it < max_iter and any(run):
        it += 1
        AD = apply_A(Dv)
        # alpha on the device; the updates and ||r||^2 queue behind apply_A's read of X
        dAd_dev = cdot(Dv, AD)
        a_dev = torch.nan_to_num(rr_dev / dAd_dev, nan=0.0, posinf=0.0, neginf=0.0).reshape(1, m)
        P = torch.addcmul(P, a_dev, Dv)
        R = torch.addcmul(R, a_dev, AD, value=-1.0)
        rnew_dev = cdot(R, R)
        v = _host(torch.cat([dAd_dev, rnew_dev]))  # THE sync of the step
        dAd, rnew = v[:m], v[m:]
        alpha = [(_finite_or(rr[j] / dAd[j], 0.0) if dAd[j] != 0 else 0.0) if run[j] else 0.0 for j in range(m)]
        step = max(abs(a) * math.sqrt(max(d, 0.0)) for a, d in zip(alpha, dd))
        beta = [0.0] * m
        for j in range(m):
            if run[j]:
                q[j] -= 0.5 * alpha[j] * rr[j]
                n_iter[j] += 1
                b = _finite_or(rnew[j] / rr[j], 0.0) if rr[j] > 0 else 0.0
                rr[j] = rnew[j]
                run[j] = math.sqrt(max(rnew[j], 0.0)) > tol * bnorm[j]
                if run[j]:
                    beta[j] = b
                    dd[j] = rnew[j] + b * b * dd[j]
        if any(run):
            Dv = _axpy(R, _coef(beta, R), Dv)
            rr_dev = masked(rnew_dev)
        if history is not None:
            history.add(it, offset + sum(q), max(math.sqrt(max(x, 0.0)) for x in rr), step)
    status = ["converged" if not (math.sqrt(max(r, 0.0)) > tol * b) else "max_iter" for r, b in zip(rr, bnorm)]
    return SolverResult(P, n_iter, status)
