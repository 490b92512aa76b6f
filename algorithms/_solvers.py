"""Solvers: trust-region Newton-CG (LIBLINEAR's TRON), L-BFGS with a strong-Wolfe line search,
and linear conjugate gradient (SystemDS lmCG).

Every solver has the same template (scikit-learn's ``_newton_solver`` layering): set up from an
objective object (``evaluate`` -> state with ``f``; ``gradient(state)`` -> (g, hstate);
``hessp(hstate, S)``; ``dot``; ``merge``), iterate (inner solve, step/line search, update), and
test convergence with a caller-supplied rule. The objective does every product with X through
``fusedml.mmchain`` / ``fusedml.matvec``, so the SAME iterations run on every backend.

All solver state stays on the data's device. Per-problem scalars are [P] tensors (P = 1 for a
coupled problem, K for K independent problems solved together); decisions are ``torch.where``
on device. Host synchronisations: one per CG step (the CG stopping test) and one or two per
outer iteration (acceptance + convergence + the ``history_`` record); L-BFGS's line search
needs the objective value on the host at each trial step.
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
# TRON
# --------------------------------------------------------------------------------------------
def _trcg(obj, hstate, g, delta, active, eps_cg, max_cg):
    """Truncated CG for ``H s = -g`` inside ``||s|| <= delta`` (LIBLINEAR ``trcg``), per problem.

    Returns
    -------
    S : [D~, K] step (zero for inactive problems)
    R : [D~, K] residual ``-g - H S``
    n_cg : int
        CG iterations run (the maximum over problems).
    reach : [P] bool
        The step hit the trust-region boundary.
    """
    dot = obj.dot
    S = torch.zeros_like(g)
    R = -g
    Dv = R.clone()
    rTr = dot(R, R)
    cgtol = eps_cg * torch.sqrt(dot(g, g))
    dsq = delta * delta
    run = active & (torch.sqrt(rTr) > cgtol)
    reach = torch.zeros_like(active)
    n_cg = 0
    while n_cg < max_cg:
        if not bool(run.any()):  # the one host sync per CG step
            break
        n_cg += 1
        Hd = obj.hessp(hstate, Dv)
        dHd = dot(Dv, Hd)
        alpha = rTr / dHd
        S_try = S + alpha * Dv
        over = run & ((torch.sqrt(dot(S_try, S_try)) > delta) | ~(dHd > 0))
        # boundary step: the positive root of ||S + a D|| = delta
        std, sts, dtd = dot(S, Dv), dot(S, S), dot(Dv, Dv)
        rad = torch.sqrt(torch.clamp(std * std + dtd * (dsq - sts), min=0.0))
        a_b = torch.where(std >= 0, (dsq - sts) / (std + rad), (rad - std) / dtd)
        alpha = torch.where(over, a_b, torch.where(run, alpha, torch.zeros_like(alpha)))
        alpha = torch.nan_to_num(alpha, nan=0.0, posinf=0.0, neginf=0.0)
        S = S + alpha * Dv
        R = R - alpha * Hd
        reach = reach | over
        run = run & ~over
        rnew = dot(R, R)
        beta = rnew / rTr
        Dv = torch.where(run, R + beta * Dv, Dv)
        rTr = torch.where(run, rnew, rTr)
        run = run & (torch.sqrt(rTr) > cgtol)
    return S, R, n_cg, reach


def tron(obj, W0, *, max_iter, stop, history=None, eps_cg=0.1, max_cg=None):
    """Trust-region Newton method with truncated CG (LIBLINEAR's TRON).

    Parameters
    ----------
    obj : LinearObjective-like
        ``evaluate``, ``gradient``, ``hessp``, ``dot``, ``merge``, ``n_problems``.
    W0 : torch.Tensor [D~, K]
        Start point.
    max_iter : int
        Cap on outer iterations (accepted or rejected).
    stop : callable ``(g, gnorm, gnorm0) -> [P] bool``
        Convergence rule on the gradient.
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

    st = obj.evaluate(W0)
    f = st["f"]
    if not bool(torch.isfinite(f).all()):
        raise ValueError("the objective is not finite at the starting point (check the link/family and the targets)")
    g, hs = obj.gradient(st)
    gnorm = torch.sqrt(dot(g, g))
    gnorm0 = gnorm.clone()
    delta = gnorm.clone().double()
    active = ~stop(g, gnorm, gnorm0)
    n_iter = torch.zeros_like(active, dtype=torch.int64)
    stalled = torch.zeros_like(active)
    if history is not None:
        history.add(0, f.sum().item(), gnorm.max().item(), 0.0, cg_iter=0)
    any_active = bool(active.any())
    for it in range(1, max_iter + 1):
        if not any_active:
            break
        S, R, n_cg, reach = _trcg(obj, hs, g, delta.to(g.dtype), active, eps_cg, max_cg)
        stn = obj.evaluate(st["W"] + S)
        fnew = stn["f"]
        gs = dot(g, S).double()
        prered = -0.5 * (gs - dot(S, R).double())
        actred = f - fnew
        snorm = torch.sqrt(dot(S, S)).double()
        if it == 1:
            delta = torch.minimum(delta, snorm)
        denom = fnew - f - gs
        alpha = torch.where(denom <= 0, torch.full_like(denom, sigma3),
                            torch.clamp(-0.5 * (gs / denom), min=sigma1))
        alpha = torch.nan_to_num(alpha, nan=sigma1)
        d1 = torch.minimum(alpha * snorm, sigma2 * delta)
        d2 = torch.maximum(sigma1 * delta, d1)
        d3 = torch.maximum(sigma1 * delta, torch.minimum(alpha * snorm, sigma3 * delta))
        d4 = torch.where(reach, sigma3 * delta, torch.maximum(delta, torch.minimum(alpha * snorm, sigma3 * delta)))
        new_delta = torch.where(actred < eta0 * prered, d1,
                                torch.where(actred < eta1 * prered, d2,
                                            torch.where(actred < eta2 * prered, d3, d4)))
        delta = torch.where(active, new_delta, delta)
        accept = active & (actred > eta0 * prered)
        n_iter = n_iter + active.to(torch.int64)
        absf = torch.abs(f)
        # LIBLINEAR's "no progress" exits; a tiny but accepted step still counts as progress
        stall = active & ((prered <= 0) | (~accept & (torch.abs(actred) <= thr * absf)
                                           & (torch.abs(prered) <= thr * absf)))
        if bool(accept.any()):
            st = obj.merge(accept, stn, st)
            f = st["f"]
            g, hs = obj.gradient(st)
            gnorm = torch.sqrt(dot(g, g))
        conv = stop(g, gnorm, gnorm0)
        stalled = stalled | (stall & ~conv)
        active = active & ~conv & ~stall
        vals = torch.stack([f.sum(), gnorm.max().double(), snorm.max(), active.any().double()]).tolist()
        any_active = bool(vals[3])
        if history is not None:
            history.add(it, vals[0], vals[1], vals[2], cg_iter=n_cg)
    conv = stop(g, gnorm, gnorm0)
    status = ["converged" if c else ("stalled" if s else "max_iter")
              for c, s in zip(conv.tolist(), stalled.tolist())]
    return SolverResult(st["W"], n_iter.tolist(), status, st)


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

    Each objective/gradient evaluation is one ``matvec`` (margins) and one ``mmchain``
    (``X^T (p - y)``).

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

    st = obj.evaluate(W0)
    f = float(st["f"])
    if not math.isfinite(f):
        raise ValueError("the objective is not finite at the starting point")
    g, _ = obj.gradient(st)
    gnorm = torch.sqrt(dot(g, g))
    gnorm0 = gnorm.clone()
    if history is not None:
        history.add(0, f, float(gnorm), 0.0, ls_evals=0)
    status = "converged" if bool(stop(g, gnorm, gnorm0).all()) else "max_iter"
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
        gtd = float(dot(g, d))
        if not gtd < 0:  # not a descent direction: restart from steepest descent
            S_mem.clear(), Y_mem.clear(), rho_mem.clear()
            d, gamma = -g, 1.0
            gtd = float(dot(g, d))
        t0 = min(1.0, 1.0 / max(float(g.abs().sum()), 1e-300)) if n_iter == 1 else 1.0

        def phi(t, W=W, d=d):
            s_t = obj.evaluate(W + t * d)
            f_t = float(s_t["f"])
            if not math.isfinite(f_t):
                return f_t, None, math.nan, s_t
            g_t, _ = obj.gradient(s_t)
            return f_t, g_t, float(dot(g_t, d)), s_t

        t, f_new, g_new, s_new, n_evals = _strong_wolfe(phi, t0, d, f, g, gtd, max_ls=max_ls)
        if s_new is None or g_new is None or not math.isfinite(f_new) or f_new > f:
            status = "stalled"  # the line search found no acceptable point
            if history is not None:
                history.add(n_iter, f, float(gnorm), 0.0, ls_evals=n_evals)
            break
        s_vec = t * d
        y_vec = g_new - g
        ys = float(dot(y_vec, s_vec))
        yy = float(dot(y_vec, y_vec))
        if ys > 1e-10 * max(yy, 1e-300):
            S_mem.append(s_vec), Y_mem.append(y_vec), rho_mem.append(1.0 / ys)
            gamma = ys / yy
        f_old, f = f, f_new
        W, g, st = s_new["W"], g_new, s_new
        gnorm = torch.sqrt(dot(g, g))
        step = t * float(torch.sqrt(dot(d, d)))
        if history is not None:
            history.add(n_iter, f, float(gnorm), step, ls_evals=n_evals)
        if bool(stop(g, gnorm, gnorm0).all()):
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
    dot = lambda A, C: (A * C).sum(0)  # noqa: E731 - per-column inner products [m]
    P = torch.zeros_like(B)
    R = B.clone()
    Dv = R.clone()
    rr = dot(R, R)
    bnorm = torch.sqrt(dot(B, B))
    run = torch.sqrt(rr) > tol * bnorm
    n_iter = torch.zeros_like(run, dtype=torch.int64)
    if history is not None:
        history.add(0, float(offset), float(bnorm.max()), 0.0)
    it = 0
    while it < max_iter and bool(run.any()):
        it += 1
        AD = apply_A(Dv)
        alpha = torch.where(run, rr / dot(Dv, AD), torch.zeros_like(rr))
        alpha = torch.nan_to_num(alpha, nan=0.0, posinf=0.0, neginf=0.0)
        P = P + alpha * Dv
        R = R - alpha * AD
        step = (alpha.abs() * torch.sqrt(dot(Dv, Dv))).max()
        rnew = dot(R, R)
        beta = rnew / rr
        Dv = torch.where(run, R + beta * Dv, Dv)
        rr = torch.where(run, rnew, rr)
        n_iter = n_iter + run.to(torch.int64)
        run = run & (torch.sqrt(rr) > tol * bnorm)
        if history is not None:
            obj = (-0.5 * (P * (B + R)).sum(0, dtype=torch.float64)).sum()
            vals = torch.stack([obj, torch.sqrt(rr).max().double(), step.double()]).tolist()
            history.add(it, offset + vals[0], vals[1], vals[2])
    conv = ~(torch.sqrt(rr) > tol * bnorm)
    status = ["converged" if c else "max_iter" for c in conv.tolist()]
    return SolverResult(P, n_iter.tolist(), status)
