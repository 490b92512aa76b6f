"""fusedml.cg: the vector half of a CG step in one launch (interpreter), and the solvers on it."""
import numpy as np
import pytest
import torch

from fusedml.cg import MAX_ENTRIES, cg_update, cg_update_applies, trial_sums, trial_sums_applies


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
    assert not cg_update_applies(torch.zeros(MAX_ENTRIES + 1, 1), 1)
    assert cg_update_applies(torch.zeros(MAX_ENTRIES, 2), 2)
    monkeypatch.setenv("FUSEDML_FUSED_CG", "0")
    assert not cg_update_applies(x, 1)


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


@pytest.mark.parametrize("case", ["logistic", "multinomial", "svc-ovr", "poisson", "ridge-2"])
def test_solvers_on_fused_cg_update(monkeypatch, case):
    """TRON (one problem, coupled classes, K independent one-vs-rest problems) and linear CG (two
    independent columns) with every CG step's vector half and TRON's accept-test sums in the
    kernels (stop rules on the host): same iterations and coefficients as the torch form."""
    from _fused_cg import fit_torch_then_kernels
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
    ref, got, n_update, n_trial = fit_torch_then_kernels(monkeypatch, make, X, y, "1")
    assert n_update, "the fused CG update was not used"
    assert bool(n_trial) == (case != "ridge-2"), "TRON's accept-test sums did not take the kernel"
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    cg, cr = np.asarray(got.coef_), np.asarray(ref.coef_)
    np.testing.assert_allclose(cg, cr, rtol=1e-4, atol=1e-5 * np.abs(cr).max())


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
