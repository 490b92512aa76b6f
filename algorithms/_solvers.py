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

import numpy as np
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
    """[P] device tensor -> float64 numpy array (ONE host sync)."""
    return np.asarray(t.tolist(), dtype=np.float64).reshape(-1)


def _coef(vals, like):
    """Per-problem coefficients [P] (float64 numpy) as what :func:`_axpy` takes.

    P == 1: a Python float (no launch, no copy); else a [1, P] tensor on ``like``'s device (one
    asynchronous H2D copy from pinned memory on CUDA).
    """
    if len(vals) == 1:
        return float(vals[0])
    t = torch.as_tensor(np.ascontiguousarray(vals), dtype=like.dtype).reshape(1, -1)
    if like.device.type == "cuda":
        t = t.pin_memory().to(like.device, non_blocking=True)
    return t


def _axpy(Y, a, X):
    """``Y + a * X`` in ONE launch (a: float, or [1, P] tensor scaling the columns); new tensor."""
    if isinstance(a, float):
        return Y if a == 0.0 else torch.add(Y, X, alpha=a)
    return torch.addcmul(Y, a, X)


# --------------------------------------------------------------------------------------------
# TRON
# --------------------------------------------------------------------------------------------
def _boundary(std, sts, dtd, dsq):
    # the positive root a of ||S + a D||^2 = delta^2 (LIBLINEAR's trcg), per problem
    with np.errstate(divide="ignore", invalid="ignore"):
        rad = np.sqrt(np.maximum(std * std + dtd * (dsq - sts), 0.0))
        a = np.where(std >= 0, (dsq - sts) / (std + rad), (rad - std) / dtd)
    return np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)


def _trcg(obj, hstate, g, gnorm, delta, active, eps_cg, max_cg):
    """Truncated CG for ``H s = -g`` inside ``||s|| <= delta`` (LIBLINEAR ``trcg``), per problem.

    Scalars live on the host in float64 (numpy [P]); per CG step: ONE ``obj.hessp`` (one
    mmchain), two host syncs (``d^T H d``, then ``||r||^2``) and five small launches (the dots
    and three axpys). ``||S||^2``, ``S^T D`` and ``D^T D`` follow Steihaug's recurrences
    (exact in exact arithmetic); when they say the step may leave the region, the three are
    recomputed exactly before the boundary step (at most once per solve, one extra sync).

    Parameters
    ----------
    gnorm : numpy [P] float64
        ``||g||`` per problem (known to the caller: no sync here).
    delta : numpy [P] float64
    active : numpy [P] bool

    Returns
    -------
    S : [D~, K] step (zero for inactive problems)
    R : [D~, K] residual ``-g - H S``
    n_cg : int
        CG iterations run (the maximum over problems).
    reach : numpy [P] bool
        The step hit the trust-region boundary.
    """
    dot = obj.dot
    S = torch.zeros_like(g)
    R = torch.neg(g)
    Dv = R
    rTr = gnorm * gnorm
    cgtol = eps_cg * gnorm
    dsq = delta * delta
    sts = np.zeros_like(rTr)
    std = np.zeros_like(rTr)
    dtd = rTr.copy()
    run = active & (np.sqrt(rTr) > cgtol)
    reach = np.zeros_like(active)
    n_cg = 0
    while n_cg < max_cg and run.any():
        n_cg += 1
        Hd = obj.hessp(hstate, Dv)
        dHd = _host(dot(Dv, Hd))  # sync 1: the curvature along Dv
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(run, rTr / dHd, 0.0)
        sts_try = sts + 2.0 * alpha * std + alpha * alpha * dtd
        over = run & ((sts_try > dsq) | ~(dHd > 0) | ~np.isfinite(alpha))
        if over.any():
            # exact S^T D, S^T S, D^T D for the boundary step (LIBLINEAR computes them directly)
            ex = _host(torch.stack([dot(S, Dv), dot(S, S), dot(Dv, Dv)]).reshape(-1)).reshape(3, -1)
            std, sts, dtd = np.where(over, ex[0], std), np.where(over, ex[1], sts), np.where(over, ex[2], dtd)
            sts_try = sts + 2.0 * alpha * std + alpha * alpha * dtd
            over = run & ((sts_try > dsq) | ~(dHd > 0) | ~np.isfinite(alpha))
            alpha = np.where(over, _boundary(std, sts, dtd, dsq), alpha)
        alpha = np.nan_to_num(np.where(run, alpha, 0.0), nan=0.0, posinf=0.0, neginf=0.0)
        S = _axpy(S, _coef(alpha, S), Dv)
        R = _axpy(R, _coef(-alpha, R), Hd)
        sts = sts + 2.0 * alpha * std + alpha * alpha * dtd
        reach = reach | over
        run = run & ~over
        if not run.any():
            break
        rnew = _host(dot(R, R))  # sync 2: the residual (stopping test and beta)
        with np.errstate(divide="ignore", invalid="ignore"):
            beta = np.where(run, rnew / rTr, 0.0)
        beta = np.nan_to_num(beta, nan=0.0, posinf=0.0, neginf=0.0)
        Dv = _axpy(R, _coef(beta, R), Dv)  # stopped problems: beta 0, Dv = R stays finite
        std = np.where(run, beta * (std + alpha * dtd), std)
        dtd = np.where(run, rnew + beta * beta * dtd, dtd)
        rTr = np.where(run, rnew, rTr)
        run = run & (np.sqrt(rTr) > cgtol)
    return S, R, n_cg, reach


def tron(obj, W0, *, max_iter, stop, history=None, eps_cg=0.1, max_cg=None):
    """Trust-region Newton method with truncated CG (LIBLINEAR's TRON).

    Per outer iteration: ONE ``evaluate`` (one matvec) at the trial point, ONE ``gradient``
    (one mmchain with ``y=None``) when a step is accepted, and one ``hessp`` (one mmchain) per
    CG step; two host syncs at the outer level (trial objective; gradient norm and the
    convergence test) besides the two per CG step.

    Parameters
    ----------
    obj : LinearObjective-like
        ``evaluate``, ``gradient``, ``hessp``, ``dot``, ``merge``, ``n_problems``.
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

    st = obj.evaluate(W0)
    f = _host(st["f"])
    if not np.isfinite(f).all():
        raise ValueError("the objective is not finite at the starting point (check the link/family and the targets)")
    g, hs = obj.gradient(st)
    gnorm0_dev = torch.sqrt(dot(g, g))

    def grad_info(g):
        gn = torch.sqrt(dot(g, g))
        conv = stop(g, gn, gnorm0_dev)
        v = _host(torch.cat([gn.double(), conv.double()]))  # one sync: norm and test
        P = v.shape[0] // 2
        return v[:P], v[P:] > 0.5

    gnorm, conv = grad_info(g)
    active = ~conv
    n_iter = np.zeros(active.shape, dtype=np.int64)
    stalled = np.zeros_like(active)
    delta = gnorm.copy()
    if history is not None:
        history.add(0, float(f.sum()), float(gnorm.max()), 0.0, cg_iter=0)
    for it in range(1, max_iter + 1):
        if not active.any():
            break
        S, R, n_cg, reach = _trcg(obj, hs, g, gnorm, delta, active, eps_cg, max_cg)
        stn = obj.evaluate(_axpy(st["W"], 1.0, S))
        # one sync: trial objective, g^T S, S^T R, S^T S
        red = torch.stack([dot(g, S), dot(S, R), dot(S, S)]).reshape(-1).to(torch.float64)
        v = _host(torch.cat([stn["f"].reshape(-1), red]))
        P = f.shape[0]
        fnew, gs, sR, ss = v[:P], v[P:2 * P], v[2 * P:3 * P], v[3 * P:]
        fnew = np.where(np.isfinite(fnew), fnew, np.inf)
        prered = -0.5 * (gs - sR)
        actred = f - fnew
        snorm = np.sqrt(np.maximum(ss, 0.0))
        if it == 1:
            delta = np.minimum(delta, snorm)
        denom = fnew - f - gs
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(denom <= 0, sigma3, np.maximum(-0.5 * (gs / denom), sigma1))
        alpha = np.nan_to_num(alpha, nan=sigma1)
        d1 = np.minimum(alpha * snorm, sigma2 * delta)
        d2 = np.maximum(sigma1 * delta, d1)
        d3 = np.maximum(sigma1 * delta, np.minimum(alpha * snorm, sigma3 * delta))
        d4 = np.where(reach, sigma3 * delta, np.maximum(delta, np.minimum(alpha * snorm, sigma3 * delta)))
        with np.errstate(invalid="ignore"):
            new_delta = np.where(actred < eta0 * prered, d1,
                                 np.where(actred < eta1 * prered, d2, np.where(actred < eta2 * prered, d3, d4)))
            accept = active & (actred > eta0 * prered)
            absf = np.abs(f)
            # LIBLINEAR's "no progress" exits; a tiny but accepted step still counts as progress
            stall = active & ((prered <= 0) | (~accept & (np.abs(actred) <= thr * absf)
                                               & (np.abs(prered) <= thr * absf)))
        delta = np.where(active, new_delta, delta)
        n_iter = n_iter + active.astype(np.int64)
        if accept.any():
            if accept.all():
                st = stn
            else:
                st = obj.merge(torch.as_tensor(accept, device=g.device), stn, st)
            f = np.where(accept, fnew, f)
            g, hs = obj.gradient(st)
            gnorm, conv = grad_info(g)
        stalled = stalled | (stall & ~conv)
        active = active & ~conv & ~stall
        if history is not None:
            history.add(it, float(f.sum()), float(gnorm.max()), float(snorm.max()), cg_iter=n_cg)
    status = ["converged" if c else ("stalled" if s else "max_iter") for c, s in zip(conv.tolist(), stalled.tolist())]
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
    Scalars live on the host in float64: per step ONE ``apply_A``, two host syncs (``d^T A d``,
    then ``||r||^2``) and five small launches; the recorded objective and step norm follow the
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
    P = torch.zeros_like(B)
    R = B
    Dv = B
    rr = _host(cdot(B, B))  # the one sync before the loop
    bnorm = np.sqrt(rr)
    dd = rr.copy()
    q = np.zeros_like(rr)  # 0.5 p^T A p - b^T p per column
    run = np.sqrt(rr) > tol * bnorm
    n_iter = np.zeros(rr.shape, dtype=np.int64)
    if history is not None:
        history.add(0, float(offset), float(bnorm.max()), 0.0)
    it = 0
    while it < max_iter and run.any():
        it += 1
        AD = apply_A(Dv)
        dAd = _host(cdot(Dv, AD))  # sync 1
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(run, rr / dAd, 0.0)
        alpha = np.nan_to_num(alpha, nan=0.0, posinf=0.0, neginf=0.0)
        P = _axpy(P, _coef(alpha, P), Dv)
        R = _axpy(R, _coef(-alpha, R), AD)
        q = q - 0.5 * alpha * rr
        step = float((np.abs(alpha) * np.sqrt(dd)).max())
        rnew = _host(cdot(R, R))  # sync 2
        with np.errstate(divide="ignore", invalid="ignore"):
            beta = np.nan_to_num(np.where(run, rnew / rr, 0.0), nan=0.0, posinf=0.0, neginf=0.0)
        n_iter = n_iter + run.astype(np.int64)
        rr = np.where(run, rnew, rr)
        run = run & (np.sqrt(rr) > tol * bnorm)
        if run.any():
            Dv = _axpy(R, _coef(np.where(run, beta, 0.0), R), Dv)
            dd = np.where(run, rnew + beta * beta * dd, dd)
        if history is not None:
            history.add(it, offset + float(q.sum()), float(np.sqrt(rr).max()), step)
    conv = ~(np.sqrt(rr) > tol * bnorm)
    status = ["converged" if c else "max_iter" for c in conv.tolist()]
    return SolverResult(P, n_iter.tolist(), status)
