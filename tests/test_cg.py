"""fusedml.cg: the vector half of a CG step in one launch (interpreter), and the solvers on it."""
import math
import os
import sys

import numpy as np
import pytest
import torch

from fusedml.cg import (CONTROL, MAX_ENTRIES, bind_cg_restart, bind_trial_point, bind_trial_sums, cg_control,
                        cg_update, cg_update_applies, control_slice, trial_sums, trial_sums_applies)


def _reference(S, R, Dv, Ad, rTr, mask, P):
    """float64 torch: the CG step of algorithms._solvers._CGEngine (per-problem sums)."""
    n, K = S.shape
    cpp = K // P
    sums = lambda A, B: (A.double() * B.double()).reshape(n, P, cpp).sum((0, 2))  # noqa: E731
    dAd = sums(Dv, Ad)
    a = torch.nan_to_num(rTr.double() / dAd, nan=0.0, posinf=0.0, neginf=0.0)
    if mask is not None:
        a = a * mask.double()
    ac = a.repeat_interleave(cpp)[None, :]
    S1, R1 = S.double() + ac * Dv.double(), R.double() - ac * Ad.double()
    rn = sums(R1, R1)
    b = torch.nan_to_num(rn / rTr.double(), nan=0.0, posinf=0.0, neginf=0.0)
    if mask is not None:
        b = b * mask.double()
    return S1, R1, dAd, rn, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,K,P,keep", [(37, 1, 1, True), (2500, 3, 1, True), (50, 4, 4, False), (5, 17, 1, True),
                                        (1, 2, 2, True)])
def test_cg_update_matches_float64(n, K, P, keep, dtype):
    """One problem over all columns and one per column (one masked); rows over several blocks
    (2500 x 3: 683 rows a block); the kept start copied; Ad strided; nothing else written."""
    g = torch.Generator().manual_seed(n * 31 + K)
    S, R, Dv = (torch.randn(n, K, generator=g, dtype=dtype) for _ in range(3))
    Ad = torch.randn(K, n, generator=g, dtype=dtype).t()  # column-major
    rTr = torch.rand(P, generator=g, dtype=dtype) + 0.5
    mask = None if P == 1 else (torch.arange(P) % 3 != 1).to(dtype)
    S1, R1, dAd, rn, b = _reference(S, R, Dv, Ad, rTr, mask, P)
    Sc, Rc, Dc, Ac = S.clone(), R.clone(), Dv.clone(), Ad.clone()
    nan = float("nan")  # poisoned outputs: anything left unwritten fails
    S0, R0 = (torch.full_like(S, nan), torch.full_like(R, nan)) if keep else (None, None)
    beta, packed = torch.full((P,), nan, dtype=dtype), torch.full((2 * P,), nan, dtype=dtype)
    out = cg_update(S, R, Dv, Ad, rTr, beta, packed, mask=mask, S0=S0, R0=R0)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert out is packed
    torch.testing.assert_close(S.double(), S1, **tol)
    torch.testing.assert_close(R.double(), R1, **tol)
    torch.testing.assert_close(packed.double(), torch.cat([dAd, rn]), **tol)
    torch.testing.assert_close(beta.double(), b, **tol)
    torch.testing.assert_close(rTr.double(), rn, **tol)
    assert torch.equal(Dv, Dc) and torch.equal(Ad, Ac)
    if keep:
        assert torch.equal(S0, Sc) and torch.equal(R0, Rc)
    if mask is not None:  # a frozen problem keeps its S and R
        frozen = (mask == 0).repeat_interleave(K // P)
        assert torch.equal(S[:, frozen], Sc[:, frozen]) and torch.equal(R[:, frozen], Rc[:, frozen])


@pytest.mark.parametrize("P", [1, 3])
def test_cg_update_next_direction_host_decided(P):
    """``next_direction`` without a control block: ``Dv`` becomes ``R + beta Dv`` with the step's
    new (masked) beta; everything else as without it."""
    g = torch.Generator().manual_seed(5 + P)
    n, K = 300, 3
    S, R, Dv, Ad = (torch.randn(n, K, generator=g) for _ in range(4))
    rTr = torch.rand(P, generator=g) + 0.5
    mask = None if P == 1 else torch.tensor([1.0, 0.0, 1.0])
    a = [t.clone() for t in (S, R, Dv, Ad, rTr)]
    beta_a, packed_a = torch.empty(P), torch.empty(2 * P)
    cg_update(*a[:4], a[4], beta_a, packed_a, mask=mask)
    want = a[1] + beta_a.repeat_interleave(K // P)[None, :] * a[2]
    beta, packed = torch.empty(P), torch.empty(2 * P)
    cg_update(S, R, Dv, Ad, rTr, beta, packed, mask=mask, next_direction=True)
    torch.testing.assert_close(Dv, want, rtol=1e-6, atol=1e-6)
    for x, y in ((S, a[0]), (R, a[1]), (rTr, a[4]), (beta, beta_a), (packed, packed_a)):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning")  # the interpreter's numpy
def test_cg_update_undefined_alpha_and_beta_are_zero():
    """d^T A d = 0 (alpha = r^T r / 0) and r^T r = 0 (beta = . / 0): both 0, as the torch step's
    nan_to_num, so S and R do not move and nothing turns NaN."""
    S, R, Dv = torch.ones(4, 1), torch.ones(4, 1), torch.ones(4, 1)
    Ad = torch.zeros(4, 1)
    rTr, beta, packed = torch.zeros(1), torch.empty(1), torch.empty(2)
    cg_update(S, R, Dv, Ad, rTr, beta, packed)
    assert torch.equal(S, torch.ones(4, 1)) and torch.equal(R, torch.ones(4, 1))
    assert beta.item() == 0.0 and packed.tolist() == [0.0, 4.0]


def test_cg_update_bad_inputs():
    S = torch.zeros(6, 2)
    ok = dict(R=torch.zeros(6, 2), Dv=torch.zeros(6, 2), Ad=torch.zeros(6, 2), rTr=torch.ones(1),
              beta=torch.zeros(1), packed=torch.zeros(2))
    with pytest.raises(ValueError, match="1 or K = 2"):
        cg_update(S, **dict(ok, rTr=torch.ones(3)))
    with pytest.raises(ValueError, match="Ad must match S"):
        cg_update(S, **dict(ok, Ad=torch.zeros(6, 3)))
    with pytest.raises(ValueError, match="Dv must match S"):
        cg_update(S, **dict(ok, Dv=torch.zeros(6, 2, dtype=torch.float64)))
    with pytest.raises(ValueError, match="S0 and R0 go together"):
        cg_update(S, **ok, S0=torch.zeros(6, 2))
    with pytest.raises(ValueError, match="R must be contiguous"):
        cg_update(S, **dict(ok, R=torch.zeros(2, 6).t()))
    with pytest.raises(ValueError, match="packed must be 2"):
        cg_update(S, **dict(ok, packed=torch.zeros(3)))
    with pytest.raises(ValueError, match="S must be"):
        cg_update(torch.zeros(6), **ok)


def test_cg_update_applies(monkeypatch):
    """CUDA tensors by default; the CPU only when forced under the interpreter; never for a
    problem count other than 1 or K, non-contiguous or integer vectors, oversized problems, or
    with FUSEDML_FUSED_CG=0."""
    x = torch.zeros(10, 3)
    monkeypatch.delenv("FUSEDML_FUSED_CG", raising=False)
    assert not cg_update_applies(x, 1)  # CPU, not forced
    monkeypatch.setenv("FUSEDML_FUSED_CG", "1")
    assert cg_update_applies(x, 1) and cg_update_applies(x, 3)
    assert not cg_update_applies(x, 2)
    assert not cg_update_applies(torch.zeros(3, 10).t(), 1)
    assert not cg_update_applies(torch.zeros(10, 3, dtype=torch.int64), 1)
    assert cg_update_applies(torch.zeros(MAX_ENTRIES, 2), 2)
    from fusedml import cg as cgmod

    long = torch.zeros(MAX_ENTRIES + 1, 1)  # the split forms' (SPLIT_ENTRIES): any length
    assert cg_update_applies(long, 1) and trial_sums_applies((long,) * 4, 1)
    monkeypatch.setattr(cgmod, "SPLIT_ENTRIES", None)
    assert not cg_update_applies(long, 1) and not trial_sums_applies((long,) * 4, 1)
    monkeypatch.setenv("FUSEDML_FUSED_CG", "0")
    assert not cg_update_applies(x, 1)


def _steihaug_reference(A, B, P, tol2, run, dsq, steps):
    """float64 Python: ``steps`` CG steps on ``A X = B`` per problem (P = 1: all columns one problem;
    P = K: each column), Steihaug's boundary rule when ``dsq`` is given (LIBLINEAR's trcg)."""
    n, K = B.shape
    cpp = K // P
    out = []
    for j in range(P):
        cols = slice(j * cpp, (j + 1) * cpp)
        s, r = np.zeros((n, cpp)), B[:, cols].copy()
        d, beta, rtr, go = np.zeros((n, cpp)), 0.0, float((r * r).sum()), run[j]
        n_steps, reach = 0, False
        for _ in range(steps):
            if not go:
                break
            d = r + beta * d
            ad = A @ d
            dad = float((d * ad).sum())
            alpha = rtr / dad if dad != 0 else 0.0
            over = False
            if dsq is not None:
                sd, ss, dd = float((s * d).sum()), float((s * s).sum()), float((d * d).sum())
                over = dad <= 0 or ss + (2 * sd + alpha * dd) * alpha > dsq[j]
                if over:
                    rad = np.sqrt(max(sd * sd + dd * (dsq[j] - ss), 0.0))
                    alpha = (dsq[j] - ss) / (sd + rad) if sd >= 0 else (rad - sd) / dd
            s, r = s + alpha * d, r - alpha * ad
            n_steps += 1
            rnew = float((r * r).sum())
            if over:
                reach, go = True, False
            else:
                beta, rtr, go = rnew / rtr, rnew, rnew > tol2[j]
                beta = beta if go else 0.0
        out.append((s, n_steps, reach))
    return out


@pytest.mark.parametrize("next_dir", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,K,P,region", [(30, 1, 1, None), (30, 1, 1, 0.5), (30, 3, 1, 2.0), (30, 3, 3, 0.7),
                                          (30, 3, 3, None), (7, 2, 2, 1e6)])
def test_cg_update_decided_matches_steihaug(n, K, P, region, dtype, next_dir):
    """With a control block the kernel makes the CG driver's decisions (stop at the tolerance, at
    the trust-region boundary, frozen problems): the queued steps reproduce a float64 Steihaug CG
    run per problem, steps past a problem's end change nothing. ``next_dir``: the solve starts from
    ``bind_cg_restart`` (a strided, negated source; the buffers poisoned before) and the kernel
    forms each next direction itself."""
    g = torch.Generator().manual_seed(n + K + P)
    Q = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = Q @ Q.T / n + 0.1 * torch.eye(n, dtype=torch.float64)
    A[0, 0] = -5.0 if region is not None and region > 1e3 else A[0, 0]  # indefinite: d^T A d <= 0 ends it
    B = torch.randn(n, K, generator=g, dtype=torch.float64)
    cpp = K // P
    rtr = (B * B).reshape(n, P, cpp).sum((0, 2)).tolist()
    tol2 = [(1e-8 if dtype == torch.float64 else 1e-4) * x for x in rtr]
    run = [True] * P
    if P > 1:
        run[-1] = False  # frozen from the start
    dsq = None if region is None else [region ** 2] * P
    S, R, Dv = torch.zeros(n, K, dtype=dtype), B.clone().to(dtype), torch.zeros(n, K, dtype=dtype)
    beta = torch.zeros(P, dtype=dtype)
    if next_dir:
        for t in (S, R, Dv, beta):
            t.fill_(float("nan"))
        negB = (-B).to(dtype).t().contiguous().t()  # column-major
        bind_cg_restart(S, R, Dv, negB, beta, negate=True)()
        assert torch.equal(S, torch.zeros_like(S)) and torch.equal(R, B.to(dtype)) and torch.equal(Dv, R)
        assert torch.equal(beta, torch.zeros_like(beta))
    ctl = torch.tensor(cg_control(rtr, tol2, run, dsq), dtype=torch.float64)
    steps = 3 * n
    for _ in range(steps):
        if not next_dir:
            Dv = R + beta.repeat_interleave(cpp)[None, :] * Dv
        Ad = (A @ Dv.double()).to(dtype)
        assert cg_update(S, R, Dv, Ad, None, beta, None, control=ctl, trust_region=dsq is not None,
                         next_direction=next_dir) is ctl
    ref = _steihaug_reference(A.numpy(), B.numpy(), P, tol2, run, dsq, steps)
    v = ctl.tolist()
    tol = 1e-6 if dtype == torch.float64 else 2e-3  # CG amplifies rounding over ~20 steps
    for j, (s_ref, n_ref, reach_ref) in enumerate(ref):
        assert v[CONTROL.index("run") * P + j] == 0.0  # every problem ended
        # float32 rounding may move the step that crosses the tolerance by one
        assert abs(v[CONTROL.index("steps") * P + j] - n_ref) <= (0 if dtype == torch.float64 else 1)
        assert (v[CONTROL.index("reach") * P + j] == 1.0) == reach_ref
        got = S[:, j * cpp:(j + 1) * cpp].double().numpy()
        np.testing.assert_allclose(got, s_ref, rtol=tol, atol=tol * max(np.abs(s_ref).max(), 1e-12))
        if reach_ref:  # on the boundary
            assert abs(float((got ** 2).sum()) - dsq[j]) <= 10 * tol * dsq[j]
    if P > 1:
        assert torch.all(S[:, -cpp:] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,K,P,rows", [(30, 1, 1, 29), (40, 3, 3, 40), (9, 2, 1, 0)])
def test_cg_prefill_writes_next_products_start(n, K, P, rows, dtype):
    """``prefill``: the restart and each update also write ``W = scale * Dv`` (the direction the
    next product takes) with rows ``>= rows`` zeroed, into a strided W that is the product's own
    result buffer ``Ad``; S, R, Dv and the control block are as without it."""
    g = torch.Generator().manual_seed(n * K)
    Q = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = Q @ Q.T / n + 0.5 * torch.eye(n, dtype=torch.float64)
    B = torch.randn(n, K, generator=g, dtype=torch.float64).to(dtype)
    scale = 0.37
    store = torch.full((K, n), float("nan"), dtype=dtype)
    W = store.t()  # column-major, like a product's [Dx, 1] view
    bufs = {k: [torch.zeros(n, K, dtype=dtype) for _ in range(3)] + [torch.zeros(P, dtype=dtype)] for k in "ab"}
    ctls = {}
    for k, pf in (("a", None), ("b", (W, scale, rows))):
        S, R, Dv, beta = bufs[k]
        bind_cg_restart(S, R, Dv, B, beta, negate=True, prefill=pf)()
        rtr = (B.double() ** 2).reshape(n, P, K // P).sum((0, 2)).tolist()
        ctls[k] = torch.tensor(cg_control(rtr, [1e-12 * x for x in rtr], [True] * P), dtype=torch.float64)
    want = lambda D: torch.where(torch.arange(n)[:, None] < rows, scale * D.double(), 0.0)  # noqa: E731
    torch.testing.assert_close(W.double(), want(bufs["b"][2]), rtol=1e-6, atol=1e-7)
    for _ in range(4):
        for k in "ab":
            S, R, Dv, beta = bufs[k]
            Ad = (A @ Dv.double()).to(dtype)
            if k == "b":  # the product's result buffer is W itself: it is read, then overwritten
                W.copy_(Ad)
                Ad = W
            cg_update(S, R, Dv, Ad, None, beta, None, control=ctls[k], next_direction=True,
                      prefill=(W, scale, rows) if k == "b" else None)
        for a, b in zip(bufs["a"], bufs["b"]):
            assert torch.equal(a, b)
        assert torch.equal(ctls["a"], ctls["b"])
        torch.testing.assert_close(W.double(), want(bufs["b"][2]), rtol=1e-6, atol=1e-7)
    S = bufs["a"][0]
    with pytest.raises(ValueError, match="prefill needs next_direction"):
        cg_update(S, S.clone(), S.clone(), S.clone(), None, torch.zeros(P, dtype=dtype), None, control=ctls["a"],
                  prefill=(W, 1.0, n))
    with pytest.raises(ValueError, match="prefill's W must be"):
        bind_cg_restart(S, S.clone(), S.clone(), S.clone(), torch.zeros(P, dtype=dtype), prefill=(W[:-1], 1.0, n))


def test_cg_update_split_form(monkeypatch, tile=4):
    """Problems over ``SPLIT_ENTRIES`` run in three launches over row tiles (forced here on small
    ones, tiles of 4 / 16 entries, at most 4 programs a problem): the host- and device-decided
    steps, the kept start, masks, the Steihaug boundary, the next direction and the prefill as in
    one program; repeated runs bitwise equal."""
    from fusedml import cg as cgmod

    monkeypatch.setattr(cgmod, "SPLIT_ENTRIES", 0)
    monkeypatch.setattr(cgmod, "SPLIT_TILE", tile)
    monkeypatch.setattr(cgmod, "SPLIT_PROGRAMS", 4)  # longer problems: several row tiles a program
    assert cgmod._split_grid(37, 1) == (4, 4, 3) and cgmod._split_grid(8, 1) == (4, 2, 1)
    for n, K, P, keep in ((37, 1, 1, True), (50, 4, 4, False)):
        test_cg_update_matches_float64(n, K, P, keep, torch.float32)
    test_cg_update_decided_matches_steihaug(30, 1, 1, 0.5, torch.float64, True)
    test_cg_update_decided_matches_steihaug(7, 2, 2, 1e6, torch.float32, False)
    test_cg_prefill_writes_next_products_start(20, 3, 3, 12, torch.float32)
    g = torch.Generator().manual_seed(5)
    S, R, Dv, Ad = (torch.randn(300, 2, generator=g, dtype=torch.float32) for _ in range(4))
    outs = []
    for _ in range(2):  # deterministic: fixed-order partial sums, no atomics
        st = [t.clone() for t in (S, R, Dv)] + [torch.ones(1), torch.zeros(1), torch.zeros(2)]
        cg_update(st[0], st[1], st[2], Ad, st[3], st[4], st[5])
        outs.append(st)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


def test_cg_update_decided_bad_inputs():
    S = torch.zeros(4, 2)
    beta = torch.zeros(1)
    ctl = torch.zeros(len(CONTROL), dtype=torch.float64)
    with pytest.raises(ValueError, match="control must be"):
        cg_update(S, S.clone(), S.clone(), S.clone(), None, beta, None, control=torch.zeros(len(CONTROL) + 1))
    with pytest.raises(ValueError, match="control must be"):
        cg_update(S, S.clone(), S.clone(), S.clone(), None, beta, None, control=ctl.float())
    with pytest.raises(ValueError, match="exclude each other"):
        cg_update(S, S.clone(), S.clone(), S.clone(), None, beta, None, control=ctl, mask=beta)
    with pytest.raises(ValueError, match="trust_region needs control"):
        cg_update(S, S.clone(), S.clone(), S.clone(), beta, beta, torch.zeros(2), trust_region=True)
    assert cg_control([4.0], [1e-2], [True]) == [4.0, float("inf"), 1e-2, 1.0] + [0.0] * 6
    with pytest.raises(ValueError, match="g must match S"):
        bind_cg_restart(S, S.clone(), S.clone(), torch.zeros(4, 3), beta)
    with pytest.raises(ValueError, match="Dv must be contiguous"):
        bind_cg_restart(S, S.clone(), torch.zeros(2, 4).t(), S.clone(), beta)
    with pytest.raises(ValueError, match="beta must be a 1-D"):
        bind_cg_restart(S, S.clone(), S.clone(), S.clone(), beta.double())
    assert control_slice("reach", 3) == slice(12, 15) and control_slice("rTr", 2) == slice(0, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,K,P", [(37, 1, 1), (1500, 3, 1), (50, 4, 4)])
def test_trial_sums_matches_float64(n, K, P, dtype):
    """g^T S, S^T R, S^T S, ||g_t||^2 and max |g_t| per problem; strided inputs; rows over
    several blocks (1500 x 3: 256 rows a block)."""
    gen = torch.Generator().manual_seed(n + K)
    g, S, R = (torch.randn(n, K, generator=gen, dtype=dtype) for _ in range(3))
    g_t = torch.randn(K, n, generator=gen, dtype=dtype).t()
    out = trial_sums(g, S, R, g_t, P)
    cpp = K // P
    per = lambda A: A.double().reshape(n, P, cpp)  # noqa: E731
    want = torch.cat([(per(g) * per(S)).sum((0, 2)), (per(S) * per(R)).sum((0, 2)), (per(S) ** 2).sum((0, 2)),
                      (per(g_t) ** 2).sum((0, 2)), per(g_t).abs().amax((0, 2))])
    assert out.dtype == torch.float64 and out.shape == (5 * P,)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    f = torch.randn(P, generator=gen, dtype=torch.float64)
    out_f = bind_trial_sums(g, S, R, g_t, P, f=f)()  # the objective ahead of the sums
    torch.testing.assert_close(out_f, torch.cat([f, want]), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="f must be"):
        trial_sums(g, S, R, g_t, P, f=f.float())


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's numpy
def test_trial_sums_nan_gradient_and_bad_inputs():
    """A NaN in g_t gives a NaN max (never "converged"); mismatched inputs raise."""
    g = torch.ones(5, 1)
    g_t = torch.ones(5, 1)
    g_t[3, 0] = float("nan")
    out = trial_sums(g, g, g, g_t, 1)
    assert out[:3].tolist() == [5.0, 5.0, 5.0] and np.isnan(out[3].item()) and np.isnan(out[4].item())
    with pytest.raises(ValueError, match="R must match g"):
        trial_sums(g, g, torch.ones(5, 2), g, 1)
    with pytest.raises(ValueError, match="P must be 1 or K"):
        trial_sums(torch.ones(5, 3), torch.ones(5, 3), torch.ones(5, 3), torch.ones(5, 3), 2)
    assert not trial_sums_applies((g, g, g, g), 1)  # CPU, not forced


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's numpy
def test_trial_sums_split_form(monkeypatch):
    """Problems over ``SPLIT_ENTRIES`` (forced: tiles of 4 / 16 entries, 2 programs a problem) take
    two launches, partial sums per program then totals in a fixed order: the same sums, the objective ahead, the NaN
    max, bitwise repeatable."""
    from fusedml import cg as cgmod

    monkeypatch.setattr(cgmod, "SPLIT_ENTRIES", 0)
    monkeypatch.setattr(cgmod, "SPLIT_TILE", 16)
    monkeypatch.setattr(cgmod, "SPLIT_PROGRAMS", 2)  # several row tiles a program
    g = torch.ones(40, 1)
    assert len(cgmod._trial_sums_spec(g, g, g, g, 1)[1]) == 2
    for n, K, P in ((37, 1, 1), (50, 4, 4), (45, 3, 1)):
        test_trial_sums_matches_float64(n, K, P, torch.float32)
    test_trial_sums_nan_gradient_and_bad_inputs()
    gen = torch.Generator().manual_seed(3)
    v = [torch.randn(300, 2, generator=gen) for _ in range(4)]
    assert torch.equal(trial_sums(*v, 2), bind_trial_sums(*v, 2)())


def _solver_case(case):
    from algorithms import LinearSVC, LogisticRegression, PoissonRegressor, Ridge

    rng = np.random.default_rng(5)
    X = rng.standard_normal((400, 6)).astype(np.float32)
    eta = X @ rng.standard_normal(6).astype(np.float32)
    make, y = {
        "logistic": (lambda: LogisticRegression(C=1.0, tol=1e-5, backend="ops"), (eta > 0).astype(np.int64)),
        "multinomial": (lambda: LogisticRegression(C=1.0, tol=1e-5, backend="ops"), np.digitize(eta, [-0.5, 0.5])),
        "svc-ovr": (lambda: LinearSVC(C=1.0, tol=1e-3, backend="ops"), np.digitize(eta, [-0.5, 0.5])),
        "poisson": (lambda: PoissonRegressor(alpha=1e-3, tol=1e-4, backend="ops"),
                    rng.poisson(np.exp(0.3 * eta)).astype(np.float32)),
        "ridge-2": (lambda: Ridge(alpha=1.0, tol=1e-8, backend="ops"), np.stack([eta, 1 - eta], 1)),
    }[case]
    return make, X, y


@pytest.mark.parametrize("case", ["logistic", "multinomial", "svc-ovr", "poisson", "ridge-2"])
def test_solvers_on_fused_cg_update(monkeypatch, case):
    """TRON (one problem, coupled classes, K independent one-vs-rest problems) and linear CG (two
    independent columns) with every CG step's vector half, its decisions (trust region, stop)
    and TRON's accept-test sums in the kernels, the host a step behind: same iterations and
    coefficients as the torch form with host decisions."""
    from _fused_cg import fit_torch_then_kernels

    make, X, y = _solver_case(case)
    ref, got, n_update, n_trial = fit_torch_then_kernels(monkeypatch, make, X, y, "1")
    assert n_update, "the fused CG update was not used"
    assert bool(n_trial) == (case != "ridge-2"), "TRON's accept-test sums did not take the kernel"
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    cg, cr = np.asarray(got.coef_), np.asarray(ref.coef_)
    np.testing.assert_allclose(cg, cr, rtol=1e-4, atol=1e-5 * np.abs(cr).max())


@pytest.mark.parametrize("bind", ["1", "0"])
@pytest.mark.parametrize("case", ["logistic", "svc-ovr"])
def test_solvers_on_bound_launches(monkeypatch, case, bind):
    """The fused backend on dense X: the CG engine's update kernel bound to the persistent Hessian
    product, TRON's trial points in two bound buffer sets and the accept-test sums bound to them
    (none of it with ``FUSEDML_BIND=0``); the same fit as the torch form (iterations, coefficients)."""
    from _fused_cg import fit_torch_then_kernels

    monkeypatch.setenv("FUSEDML_BIND", bind)
    make, X, y = _solver_case(case)
    fused = lambda: make().set_params(backend="fused", tol=1e-6 if case == "logistic" else 1e-4)  # noqa: E731
    ref, got, n_update, n_trial = fit_torch_then_kernels(monkeypatch, fused, X, y, "1")
    assert n_update and n_trial
    assert fit_torch_then_kernels.bound >= 2 if bind == "1" else fit_torch_then_kernels.bound == 0
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_)) and min(np.ravel(got.n_iter_)) >= 3
    cg, cr = np.asarray(got.coef_), np.asarray(ref.coef_)
    np.testing.assert_allclose(cg, cr, rtol=1e-4, atol=1e-5 * np.abs(cr).max())


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bind_trial_point(masked, dtype):
    """One launch: W = W0 + S, Wm = W with the rows from ``rows`` on zeroed, G = scale * Wm; the
    sources' current contents at each call; mismatched buffers raise."""
    g = torch.Generator().manual_seed(3)
    n, K, rows, scale = 1500, 2, 1499, 0.3
    W0, S = (torch.randn(n, K, generator=g, dtype=dtype) for _ in range(2))
    W, Wm, G = (torch.full((n, K), float("nan"), dtype=dtype) for _ in range(3))
    go = bind_trial_point(W0, S, W, Wm if masked else None, G, scale, rows)
    for _ in range(2):
        go()
        want = W0 + S
        wm = want.clone()
        wm[rows:] = 0
        assert torch.equal(W, want)
        if masked:
            assert torch.equal(Wm, wm)
        torch.testing.assert_close(G, scale * wm)
        S.add_(1.0)
    with pytest.raises(ValueError, match="S must match W"):
        bind_trial_point(W0, S[:, :1], W, None, G, scale, rows)
    with pytest.raises(ValueError, match="G must be"):
        bind_trial_point(W0, S, W, None, G[:-1], scale, rows)


@pytest.mark.parametrize("case", ["logistic", "svc-ovr", "multinomial", "poisson", "logistic-fp64"])
def test_tron_prefilled_products(monkeypatch, case):
    """TRON's CG engine on bound fused products leaves each product's ``beta * z`` start to its
    update and restart kernels (``BoundMMChain.launch_only``), and each trial point's gradient
    start to ``bind_trial_point``: the same fit as when the passes write it themselves, and no
    ``mask * S`` or ``beta * z`` launch per product."""
    import fusedml

    from algorithms import _solvers

    monkeypatch.setenv("FUSEDML_FUSED_CG", "1")
    make, X, y = _solver_case(case.replace("-fp64", ""))
    if case.endswith("fp64"):
        X = X.astype(np.float64)
    tol = 1e-6 if case.startswith("logistic") else 1e-4
    fit = lambda: make().set_params(backend="fused", tol=tol).fit(X, y)  # noqa: E731
    engines = []
    real_init = _solvers._CGEngine.__init__
    monkeypatch.setattr(_solvers._CGEngine, "__init__",
                        lambda self, *a, **k: real_init(self, *a, **k) or engines.append(self))
    got = fit()
    assert engines and all(e.prefill is not None for e in engines)
    real_mul = torch.mul

    def count_muls():
        muls = []
        monkeypatch.setattr(torch, "mul", lambda *a, **k: muls.append(1) or real_mul(*a, **k))
        est = fit()
        monkeypatch.setattr(torch, "mul", real_mul)
        return est, len(muls)
    got2, n_got = count_muls()
    assert np.array_equal(np.asarray(got2.coef_), np.asarray(got.coef_))
    from algorithms import _loss
    points = []
    real_point = _loss.bind_trial_point
    monkeypatch.setattr(_loss, "bind_trial_point", lambda *a, **k: points.append(1) or real_point(*a, **k))
    fit()
    assert points, "the trial points did not take bind_trial_point"
    monkeypatch.setattr(fusedml.BoundMMChain, "launch_only", lambda self: None)
    monkeypatch.setattr(fusedml.BoundLossGradient, "launch_only", lambda self: None)
    engines.clear()
    ref, n_ref = count_muls()
    assert engines and all(e.prefill is None for e in engines)
    n_cg = sum(r["cg_iter"] for r in ref.history_)
    assert n_cg > 0 and n_ref - n_got >= 2 * n_cg  # two launches fewer per Hessian product
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    np.testing.assert_allclose(np.asarray(got.coef_), np.asarray(ref.coef_), rtol=1e-5,
                               atol=1e-6 * np.abs(np.asarray(ref.coef_)).max())


@pytest.mark.parametrize("lag", ["0", "3"])
@pytest.mark.parametrize("case", ["svc-ovr", "ridge-2"])
def test_decided_cg_steps_any_lag(monkeypatch, case, lag):
    """The host reading the device-decided CG steps at once (lag 0) or three steps late gives the
    same fit and history as the torch form; steps queued past the end only add products."""
    from _fused_cg import fit_torch_then_kernels

    monkeypatch.setenv("FUSEDML_CG_LAG", lag)
    make, X, y = _solver_case(case)
    ref, got, n_update, _ = fit_torch_then_kernels(monkeypatch, make, X, y, "1")
    assert n_update
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    np.testing.assert_allclose(np.asarray(got.coef_), np.asarray(ref.coef_), rtol=1e-4,
                               atol=1e-5 * np.abs(np.asarray(ref.coef_)).max())
    hg, hr = got.history_, ref.history_
    assert [r["iter"] for r in hg] == [r["iter"] for r in hr]
    # fp32 objectives near convergence cancel terms of the first objective's size (Ridge's 11.1 ->
    # 0.028): their rounding is absolute at that scale (torch 2.13's CPU sums moved it to 1.4e-5 relative)
    np.testing.assert_allclose([r["objective"] for r in hg], [r["objective"] for r in hr], rtol=1e-5,
                               atol=1e-7 * abs(hr[0]["objective"]))
    if case == "ridge-2":
        assert got._fit_info["n_mmchain"] >= ref._fit_info["n_mmchain"]
        assert got._fit_info["n_mmchain"] <= ref._fit_info["n_mmchain"] + int(lag)


def test_stop_rules_host_form_matches_device_form():
    """The host form of each solver stop rule gives the device form's answer on the same numbers,
    NaN included (never converged)."""
    from algorithms._solvers import max_abs_grad_stop, relative_grad_norm_stop

    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        g = torch.randn(7, 3, generator=gen, dtype=torch.float64) * 0.1
        gnorm = torch.linalg.vector_norm(g, dim=0)
        gnorm0 = gnorm * (0.5 + torch.rand(3, generator=gen, dtype=torch.float64) * 20)
        gmax = g.abs().amax(0)
        rule = max_abs_grad_stop(0.15)
        assert rule(g, gnorm, gnorm0).tolist() == rule.host([float(gmax.max())], gnorm.tolist(), gnorm0.tolist())
        scale = torch.rand(3, generator=gen, dtype=torch.float64) * 0.2
        rule = relative_grad_norm_stop(scale)
        assert rule(g, gnorm, gnorm0).tolist() == rule.host(gmax.tolist(), gnorm.tolist(), gnorm0.tolist())
    nan = float("nan")
    assert max_abs_grad_stop(1.0).host([nan], [nan], [1.0]) == [False]
    assert relative_grad_norm_stop(torch.ones(1)).host([nan], [nan], [1.0]) == [False]


def _aot():
    """sm_90 compiles of the solvers' small kernels in every variant they launch (fp32 and fp64)."""
    from _sm90 import compile_sm90

    from fusedml import cg

    def build(fn, types, consts, warps):  # every other argument an i32 (lengths)
        return compile_sm90(fn, {a: types.get(a, "i32") for a in fn.arg_names}, consts, num_warps=warps)

    fn = cg._cg_update_kernel
    split = ((cg._cg_split_sums_kernel, dict(TR=True)),
             (cg._cg_split_update_kernel, dict(KEEP=True, HAS_MASK=False, DECIDE=True, TR=True, NB=128)),
             (cg._cg_split_finish_kernel, dict(HAS_MASK=False, DECIDE=True, TR=True, NEXT_DIR=True, PREFILL=True,
                                               NB=128)),
             (cg._cg_split_finish_kernel, dict(HAS_MASK=True, DECIDE=False, TR=False, NEXT_DIR=False, PREFILL=False,
                                               NB=128)))
    for ty in ("fp32", "fp64"):
        for k, consts in split:  # the three-launch form (SPLIT_ENTRIES)
            types = {a: f"*{ty}" for a in ("S", "R", "Dv", "Ad", "S0", "R0", "RTR", "BETA", "MASK", "PACKED", "W")}
            types.update(CTL="*fp64", PART="*fp64", PART2="*fp64", SNAP="*fp64", pf_hi="fp32", pf_lo="fp32")
            build(k, types, dict(consts, BLOCK_R=1024, BLOCK_C=1), 4)
            print("AOT cg split", k.fn.__name__ if hasattr(k, "fn") else k, ty)
    for ty in ("fp32", "fp64"):
        for keep, mask, decide, tr, nd, pf in ((True, False, False, False, False, False),
                                               (False, True, False, False, False, False),
                                               (False, False, True, True, True, False),
                                               (False, False, True, True, True, True),
                                               (False, False, True, False, True, False)):
            types = {a: f"*{ty}" for a in ("S", "R", "Dv", "Ad", "S0", "R0", "RTR", "BETA", "MASK", "PACKED", "W")}
            types.update(CTL="*fp64", pf_hi="fp32", pf_lo="fp32", pf_rows="i32")
            consts = dict(KEEP=keep, HAS_MASK=mask, DECIDE=decide, TR=tr, NEXT_DIR=nd, PREFILL=pf, BLOCK_R=512,
                          BLOCK_C=4)
            build(fn, types, consts, 8)
            print("AOT cg_update", ty, keep, mask, decide, tr, nd, pf)
        rs = cg._cg_restart_kernel
        for pf in (False, True):
            types = {a: f"*{ty}" for a in ("S", "R", "Dv", "G", "BETA", "W")}
            types.update(pf_hi="fp32", pf_lo="fp32")
            consts = dict(SIGN=-1.0, PREFILL=pf, BLOCK=1024)
            build(rs, types, consts, 4)
            print("AOT cg_restart", ty, pf)
        ts = cg._trial_sums_kernel
        for has_f, split in ((False, False), (True, False), (False, True)):
            types = {a: f"*{ty}" for a in ("G", "S", "R", "GT")}
            types.update(OUT="*fp64", F="*fp64")
            consts = dict(HAS_F=has_f, SPLIT=split, BLOCK_R=1024, BLOCK_C=1)
            build(ts, types, consts, 4 if split else 8)
            print("AOT trial_sums", ty, has_f, split)
        for has_f in (False, True):  # the split form's totals
            build(cg._trial_finish_kernel, dict(PART="*fp64", F="*fp64", OUT="*fp64"), dict(HAS_F=has_f, NB=128), 4)
            print("AOT trial_finish", ty, has_f)
        tp = cg._trial_point_kernel
        for has_wm in (False, True):
            types = {a: f"*{ty}" for a in ("W0", "S", "W", "WM", "G")}
            types.update(pf_hi="fp32", pf_lo="fp32")
            consts = dict(HAS_WM=has_wm, BLOCK=1024)
            build(tp, types, consts, 4)
            print("AOT trial_point", ty, has_wm)
    # the bound loss-gradient pass's objective launch (fusedml/mmchain/lossgrad.py)
    from fusedml.mmchain import lossgrad

    ob = lossgrad._objective_kernel
    for ty, coupled in (("fp32", True), ("fp64", False)):
        types = dict(LPART="*fp64", Z=f"*{ty}", OFF="*fp64", LOSS="*fp64", OBJ="*fp64", a_hi="fp32", a_lo="fp32",
                     hb_hi="fp32", hb_lo="fp32")
        consts = dict(COUPLED=coupled, HAS_Z=True, HAS_OFF=True, BLOCK_G=256, BLOCK_M=4, BLOCK_R=256)
        build(ob, types, consts, 4)
        print("AOT objective", ty, coupled)


def test_kernels_compile_for_sm90():
    """The decided step's float64 scalar logic (sqrt, selects) and both kernels compile for the GPU."""
    from _sm90 import run_aot

    run_aot(__file__, 38, tools=("ptxas",))


if __name__ == "__main__" and "--aot" in sys.argv:
    _aot()


@pytest.mark.parametrize("backend", ["fused", "ops"])
@pytest.mark.parametrize("case", ["logistic", "multinomial", "svc-ovr", "poisson", "ridge-2", "logistic-csr",
                                  "logistic-converged"])
def test_solve_ahead_same_fit(monkeypatch, case, backend):
    """Each solve's restart and first product queued before the host reads the values the solve
    decides with (``FUSEDML_SOLVE_AHEAD``, the default): bit for bit the fit, iterations and
    history of reading first; the queued starts are taken (not redone); a start that is not
    followed (the last iteration, mispredicted) adds at most one product."""
    from algorithms import _solvers

    import scipy.sparse as sp

    monkeypatch.setenv("FUSEDML_FUSED_CG", "1")
    make, X, y = _solver_case(case.split("-")[0] if case.startswith("logistic") else case)
    if case == "logistic-csr":
        X = sp.csr_matrix(X * (np.abs(X) > 0.7))
    params = {"backend": backend}
    if case == "logistic-converged":  # converged at the start: the queued solve is not taken
        params["tol"] = 1e3
    fit = lambda: make().set_params(**params).fit(X, y)  # noqa: E731
    monkeypatch.setenv("FUSEDML_SOLVE_AHEAD", "0")
    ref = fit()
    starts, resets = [], []
    real_start, real_reset = _solvers._CGEngine.start_ahead, _solvers._CGEngine.reset_decided
    monkeypatch.setattr(_solvers._CGEngine, "start_ahead", lambda *a, **k: starts.append(1) or real_start(*a, **k))
    monkeypatch.setattr(_solvers._CGEngine, "reset_decided", lambda *a, **k: resets.append(1) or real_reset(*a, **k))
    monkeypatch.setenv("FUSEDML_SOLVE_AHEAD", "1")
    got = fit()
    assert starts, "no solve started ahead"
    solves = 1 if case == "ridge-2" else sum(1 for r in ref.history_ if r["iter"] > 0)
    assert (solves == 0) == (case == "logistic-converged")
    assert len(starts) + len(resets) >= solves and len(starts) <= solves + 1
    assert np.array_equal(np.asarray(got.coef_), np.asarray(ref.coef_))
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    assert [r["objective"] for r in got.history_] == [r["objective"] for r in ref.history_]
    key = "n_mmchain"
    assert ref._fit_info[key] <= got._fit_info[key] <= ref._fit_info[key] + 1


def test_solve_ahead_only_from_its_own_start(monkeypatch):
    """A start queued from another gradient (a rejected trial point) is not used: the solve
    restarts from its own ``g`` and gives the plain solve's step."""
    from algorithms._loss import BinomialLoss, LinearObjective
    from algorithms._solvers import _solve_ahead, _trcg

    monkeypatch.setenv("FUSEDML_FUSED_CG", "1")
    rng = np.random.default_rng(8)
    X = torch.from_numpy(rng.normal(size=(60, 5)))
    T = torch.from_numpy((rng.uniform(size=(60, 1)) > 0.5) * 1.0)
    obj = LinearObjective(X, BinomialLoss(), T, 1.0 / 60, 0.3, n_cols=1, fit_intercept=True, backend="cpu",
                          dtype=torch.float64, device=X.device)
    st, g, hs = obj.evaluate_gradient(obj.zeros())
    gnorm = [float(torch.linalg.vector_norm(g))]
    plain = [t.clone() for t in _trcg(obj, hs, g, gnorm, [10.0], [True], 0.1, 20)[:2]]
    other_g = g * 3.0  # a start from another point, e.g. a rejected trial's
    ahead = _solve_ahead(obj, other_g, hs, 1)
    assert ahead is not None
    S, R, _, _ = _trcg(obj, hs, g, gnorm, [10.0], [True], 0.1, 20, ahead=ahead)
    assert torch.equal(S, plain[0]) and torch.equal(R, plain[1])
    own = _solve_ahead(obj, g, hs, 1)
    ends = []
    S, R, _, _ = _trcg(obj, hs, g, gnorm, [10.0], [True], 0.1, 20, ahead=own, ends=ends)
    assert torch.equal(S, plain[0]) and torch.equal(R, plain[1])
    assert len(ends) == 1 and ends[0] == pytest.approx(float((R.double() ** 2).sum()), rel=1e-5)
    monkeypatch.setenv("FUSEDML_SOLVE_AHEAD", "0")
    assert _solve_ahead(obj, g, hs, 1) is None


def test_likely_unconverged_prediction():
    """The solve-ahead prediction: the CG's last residual, halved, against each stop rule's host
    form; only active problems count; no residuals or no host form: no prediction."""
    from algorithms._solvers import _likely_unconverged, max_abs_grad_stop, relative_grad_norm_stop

    rel = relative_grad_norm_stop(torch.tensor([1e-3, 1e-3])).host
    assert _likely_unconverged(rel, [1e-4, 0.0], [1.0, 1.0], [True, True], 10)  # 0.5e-2 > 1e-3
    assert not _likely_unconverged(rel, [1e-6, 0.0], [1.0, 1.0], [True, True], 10)  # 0.5e-3 <= 1e-3
    assert not _likely_unconverged(rel, [1e-4, 1e-4], [1.0, 1.0], [False, False], 10)
    mab = max_abs_grad_stop(1e-3).host
    # max |g| >= ||g|| / sqrt(n): 0.5 * 1e-1 / sqrt(100) = 5e-3 > 1e-3
    assert _likely_unconverged(mab, [1e-2], [1.0], [True], 100)
    assert not _likely_unconverged(mab, [1e-2], [1.0], [True], 10 ** 6)
    assert not _likely_unconverged(None, [1.0], [1.0], [True], 10)
    assert not _likely_unconverged(rel, [], [1.0], [True], 10)


_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") != "0",
                           reason="compiled kernels need a GPU")


@_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,K,P", [(100_003, 1, 1), (40_001, 4, 4), (3_000_017, 1, 1)])
def test_cuda_cg_update_split_matches_float64(monkeypatch, n, K, P, dtype):
    """Compiled, past ``SPLIT_ENTRIES`` (three launches over row tiles; at 3M entries three tiles a
    program): a host-decided step (one problem masked) against float64; a device-decided
    trust-region solve forming its own next directions and prefill (half the problems reach the
    boundary) gives the one-program form's steps, flags and solution."""
    from fusedml import cg as cgmod

    assert cgmod.SPLIT_ENTRIES is not None and n * (K // P) > cgmod.SPLIT_ENTRIES
    assert cg_update_applies(torch.empty(n, K, dtype=dtype, device="cuda"), P)
    g = torch.Generator().manual_seed(n + K)
    S, R, Dv = (torch.randn(n, K, generator=g, dtype=dtype) for _ in range(3))
    Ad = torch.randn(K, n, generator=g, dtype=dtype).t()
    rTr = torch.rand(P, generator=g, dtype=dtype) + 0.5
    mask = None if P == 1 else (torch.arange(P) % 3 != 1).to(dtype)
    S1, R1, dAd, rn, b = _reference(S, R, Dv, Ad, rTr, mask, P)
    dev = [t.cuda() for t in (S, R, Dv, Ad, rTr)]
    beta = torch.full((P,), float("nan"), dtype=dtype, device="cuda")
    packed = torch.empty(2 * P, dtype=dtype, device="cuda")
    cg_update(*dev[:4], dev[4], beta, packed, mask=None if mask is None else mask.cuda())
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for got, want in ((dev[0], S1), (dev[1], R1), (packed, torch.cat([dAd, rn])), (beta, b), (dev[4], rn)):
        torch.testing.assert_close(got.double().cpu(), want, **tol)

    d = (torch.rand(n, K, generator=g, dtype=torch.float64) * 10 + 0.1).cuda()  # A = diag(d), per column
    B = torch.randn(n, K, generator=g, dtype=torch.float64)
    rtr = (B * B).reshape(n, P, K // P).sum((0, 2)).tolist()
    runs = {}
    for split in (None, cgmod.SPLIT_ENTRIES):
        monkeypatch.setattr(cgmod, "SPLIT_ENTRIES", split)
        S, R, Dv = (torch.zeros(n, K, dtype=dtype, device="cuda") for _ in range(3))
        beta = torch.zeros(P, dtype=dtype, device="cuda")
        W = torch.empty(K, n, dtype=dtype, device="cuda").t()  # the product's result buffer
        pf = (W, 0.5, n - 7)
        bind_cg_restart(S, R, Dv, (-B).to(dtype).cuda(), beta, negate=True, prefill=pf)()
        ctl = torch.tensor(cg_control(rtr, [1e-6 * x for x in rtr], [True] * P,
                                      [(0.05 if j % 2 == 0 else 1e6) * x for j, x in enumerate(rtr)]),
                           dtype=torch.float64, device="cuda")
        for _ in range(40):
            W.copy_((d * Dv.double()).to(dtype))
            cg_update(S, R, Dv, W, None, beta, None, control=ctl, trust_region=True, next_direction=True, prefill=pf)
        want = torch.where(torch.arange(n, device="cuda")[:, None] < n - 7, 0.5 * Dv.double(), 0.0)
        torch.testing.assert_close(W.double(), want, rtol=1e-6, atol=1e-7)
        runs[split] = (S.double().cpu(), ctl.cpu())
    (S_one, c_one), (S_split, c_split) = runs.values()
    steps, reach = (CONTROL.index(k) for k in ("steps", "reach"))
    assert torch.equal(c_split[reach * P:(reach + 1) * P], c_one[reach * P:(reach + 1) * P])
    assert (c_split[steps * P:(steps + 1) * P] - c_one[steps * P:(steps + 1) * P]).abs().max() <= (
        0 if dtype == torch.float64 else 1)
    stol = 1e-10 if dtype == torch.float64 else 2e-3
    torch.testing.assert_close(S_split, S_one, rtol=stol, atol=stol * float(S_one.abs().max()))


@_cuda
@pytest.mark.parametrize("n,K,P", [(100_003, 1, 1), (40_001, 4, 4), (3_000_017, 1, 1)])
def test_cuda_trial_sums_split_matches_float64(n, K, P):
    """Compiled, past ``SPLIT_ENTRIES`` (partials per program, then totals): the accept test's sums
    against float64 with the objective ahead; a NaN in g_t gives a NaN max; bitwise repeatable."""
    from fusedml import cg as cgmod

    assert n * (K // P) > cgmod.SPLIT_ENTRIES and trial_sums_applies((torch.empty(n, K, device="cuda"),) * 4, P)
    gen = torch.Generator().manual_seed(n)
    g, S, R = (torch.randn(n, K, generator=gen) for _ in range(3))
    g_t = torch.randn(K, n, generator=gen).t()
    per = lambda A: A.double().reshape(n, P, K // P)  # noqa: E731
    want = torch.cat([(per(g) * per(S)).sum((0, 2)), (per(S) * per(R)).sum((0, 2)), (per(S) ** 2).sum((0, 2)),
                      (per(g_t) ** 2).sum((0, 2)), per(g_t).abs().amax((0, 2))])
    f = torch.randn(P, generator=gen, dtype=torch.float64)
    dev = [t.cuda() for t in (g, S, R, g_t)]
    run = bind_trial_sums(*dev, P, f=f.cuda())
    out = run().cpu()
    torch.testing.assert_close(out, torch.cat([f, want]), rtol=1e-12, atol=1e-9)
    assert torch.equal(run().cpu(), out)
    dev[3][n // 2, 0] = float("nan")
    assert math.isnan(float(trial_sums(*dev, P)[4 * P]))
