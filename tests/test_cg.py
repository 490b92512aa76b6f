"""fusedml.cg: the vector half of a CG step in one launch (interpreter), and the solvers on it."""
import numpy as np
import pytest
import torch

from fusedml.cg import MAX_ENTRIES, cg_update, cg_update_applies


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
    S0, R0 = (torch.empty_like(S), torch.empty_like(R)) if keep else (None, None)
    beta, packed = torch.full((P,), 7.0, dtype=dtype), torch.empty(2 * P, dtype=dtype)
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


@pytest.mark.parametrize("case", ["logistic", "multinomial", "ridge-2"])
def test_solvers_on_fused_cg_update(monkeypatch, case):
    """TRON (one problem, coupled classes) and linear CG (two independent columns) with every CG
    step's vector half in the kernel: same iterations and coefficients as the torch form."""
    from algorithms import LogisticRegression, Ridge
    from algorithms import _solvers

    rng = np.random.default_rng(5)
    X = rng.standard_normal((400, 6)).astype(np.float32)
    eta = X @ rng.standard_normal(6).astype(np.float32)
    make, y = {
        "logistic": (lambda: LogisticRegression(C=1.0, tol=1e-5, backend="ops"), (eta > 0).astype(np.int64)),
        "multinomial": (lambda: LogisticRegression(C=1.0, tol=1e-5, backend="ops"), np.digitize(eta, [-0.5, 0.5])),
        "ridge-2": (lambda: Ridge(alpha=1.0, tol=1e-8, backend="ops"), np.stack([eta, 1 - eta], 1)),
    }[case]
    monkeypatch.setenv("FUSEDML_FUSED_CG", "0")
    ref = make().fit(X, y)
    calls = []
    real = _solvers.cg_update
    monkeypatch.setattr(_solvers, "cg_update", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("FUSEDML_FUSED_CG", "1")
    got = make().fit(X, y)
    assert calls, "the fused CG update was not used"
    assert np.array_equal(np.asarray(got.n_iter_), np.asarray(ref.n_iter_))
    cg, cr = np.asarray(got.coef_), np.asarray(ref.coef_)
    np.testing.assert_allclose(cg, cr, rtol=1e-4, atol=1e-5 * np.abs(cr).max())
