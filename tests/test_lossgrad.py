"""fusedml.loss_gradient: the one-read loss / gradient / Hessian-weights pass (interpreter on the CPU)."""
import os
import zlib

import numpy as np
import pytest
import torch

import fusedml
from fusedml.mmchain._checks import prepare_mmchain
from fusedml.mmchain.lossgrad import LOSSES, loss_terms, one_read

CASES = [  # (loss, m, power)
    ("logistic", 1, None),
    ("squared_hinge", 1, None),
    ("squared_hinge", 3, None),
    ("multinomial", 3, None),
    ("multinomial", 5, None),
    ("poisson", 1, None),
    ("gamma", 1, None),
    ("tweedie", 1, 1.5),
    ("tweedie", 1, 0.0),
    ("tweedie", 1, 1.0),
    ("squared_error", 2, None),
]


def _target(loss, N, m, g):
    if loss == "logistic":
        return (torch.rand(N, m, generator=g) < 0.4).float()
    if loss == "squared_hinge":
        return torch.where(torch.rand(N, m, generator=g) < 0.5, -1.0, 1.0)
    if loss == "multinomial":
        return torch.nn.functional.one_hot(torch.randint(0, m, (N,), generator=g), m).float()
    if loss == "squared_error":
        return torch.randn(N, m, generator=g)
    return 3.0 * torch.rand(N, m, generator=g) + 0.05


def _reference(X, W, y, loss, power, c, alpha, z, beta, intercept):
    """float64 (grad, loss sums, eta, hess), the fields of LossGradient."""
    X64 = X.double()
    if intercept:
        X64 = torch.cat([X64, torch.ones(X.shape[0], 1, dtype=torch.float64)], 1)
    eta = X64 @ W.double()
    val, g, h = loss_terms(loss, eta, y.double(), power)
    if c is not None:
        g = g * c.double()[:, None]
        val = val * c.double()[:, None]
    grad = alpha * X64.T @ g + (beta * z.double() if z is not None else 0.0)
    return grad, val.sum(0), eta, h


def _rel(a, b):
    return float((a.double().reshape(b.shape) - b).abs().max() / (b.abs().max() + 1e-30))


@pytest.mark.parametrize("loss,m,power", CASES, ids=[f"{c[0]}-m{c[1]}-p{c[2]}" for c in CASES])
@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
def test_loss_gradient_matches_float64(loss, m, power, backend):
    # a fixed seed per case (hash() of a str changes per process: the data, and a loss sum near the
    # tolerance, changed from run to run)
    g = torch.Generator().manual_seed(zlib.crc32(f"{loss}-{m}-{power}".encode()))
    N, D = 203, 10  # N not a multiple of any tile; D = 10: rows not 16-byte multiples
    X = torch.randn(N, D, generator=g)
    W = 0.3 * torch.randn(D + 1, m, generator=g)
    y = _target(loss, N, m, g)
    c = torch.rand(N, generator=g)
    z = torch.randn(D + 1, m, generator=g)
    X0, W0, y0 = X.clone(), W.clone(), y.clone()
    r = fusedml.loss_gradient(X, W, y, loss=loss, power=power, sample_weight=c, alpha=0.7, z=z, beta=0.3,
                              intercept=True, backend=backend)
    ref = _reference(X, W, y, loss, power, c, 0.7, z, 0.3, True)
    for name, a, b in zip(r._fields, r, ref):
        assert a.shape == b.shape, name
        assert _rel(a, b) < 2e-6, (name, _rel(a, b))
    assert torch.equal(X, X0) and torch.equal(W, W0) and torch.equal(y, y0)  # inputs untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
def test_logistic_loss_on_separated_data(dtype, backend):
    """Separable labels and margins up to ~40: each row's loss is log1p(exp(-|t|)), from 0.69 down to
    ~1e-17, so the sum tests the epilogue's log1p series (e < 2^-8) and its log branch, not softplus(t)
    rounding to zero."""
    g = torch.Generator().manual_seed(11)
    N, D = 301, 7
    X = torch.randn(N, D, generator=g, dtype=dtype)
    w = torch.randn(D, generator=g, dtype=dtype)
    t = X @ w
    w = w * (40.0 / t.abs().max())  # margins spread over [-40, 40]
    y = (X @ w > 0).to(dtype)
    r = fusedml.loss_gradient(X, w, y, loss="logistic", backend=backend)
    eta = X.double() @ w.double()
    ref = torch.nn.functional.softplus(-eta.abs()).sum()  # y = (eta > 0): softplus(t) - y t = softplus(-|t|)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert abs(float(r.loss) - float(ref)) <= tol * float(ref), (float(r.loss), float(ref))
    small = eta.abs() > 20  # rows whose loss is below 2e-9: still counted
    assert small.sum() > 10
    rs = fusedml.loss_gradient(X[small], w, y[small], loss="logistic", backend=backend)
    ref_s = torch.nn.functional.softplus(-eta[small].abs()).sum()
    # fp32: t carries ~1e-6 absolute rounding, so e^-|t| ~1e-6 relative
    assert abs(float(rs.loss) - float(ref_s)) <= (1e-12 if dtype == torch.float64 else 1e-4) * float(ref_s)


@pytest.mark.parametrize("intercept", [False, True])
def test_loss_gradient_vector_form_and_defaults(intercept):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(64, 16, generator=g)  # D a multiple of 16: the EVEN_D path
    w = 0.2 * torch.randn(16 + int(intercept), generator=g)
    y = (torch.rand(64, generator=g) < 0.5).float()
    r = fusedml.loss_gradient(X, w, y, loss="logistic", intercept=intercept, backend="fused")
    assert r.grad.shape == w.shape and r.eta.shape == (64,) and r.hess.shape == (64,)
    ref = _reference(X, w[:, None], y[:, None], "logistic", None, None, 1.0, None, 0.0, intercept)
    for a, b in zip(r, ref):
        assert _rel(a, b[..., 0] if b.ndim == 2 else b[0]) < 2e-6
    assert r.loss.ndim == 0 and r.loss.dtype == torch.float64
    for be in ("fused", "cpu"):  # the one-read pass and the composed one
        assert fusedml.loss_gradient(X, w, y, loss="logistic", intercept=intercept, return_eta=False,
                                     backend=be).eta is None
    # numpy in: CPU torch out, float64 kept
    r64 = fusedml.loss_gradient(X.double().numpy(), w.double().numpy(), y.double().numpy(), loss="logistic",
                                intercept=intercept, backend="fused")
    assert r64.grad.dtype == torch.float64
    assert _rel(r64.grad, ref[0][:, 0]) < 1e-12


def test_loss_gradient_deterministic_and_wide_rows_fallback():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(150, 24, generator=g)
    W = 0.1 * torch.randn(25, 3, generator=g)
    y = torch.nn.functional.one_hot(torch.randint(0, 3, (150,), generator=g), 3).float()
    ref = _reference(X, W, y, "multinomial", None, None, 1.0, None, 0.0, True)
    a = fusedml.loss_gradient(X, W, y, loss="multinomial", intercept=True, backend="fused", deterministic=True)
    b = fusedml.loss_gradient(X, W, y, loss="multinomial", intercept=True, backend="fused", deterministic=True)
    assert torch.equal(a.grad, b.grad) and torch.equal(a.loss, b.loss) and _rel(a.grad, ref[0]) < 2e-6
    # the chunked (wide-row) strategy has no one-read pass: composed from matvec + mmchain
    c = fusedml.loss_gradient(X, W, y, loss="multinomial", intercept=True, backend="fused",
                              config={"strategy": "chunked", "block_d": 8})
    assert _rel(c.grad, ref[0]) < 2e-6 and _rel(c.loss, ref[1]) < 2e-6


@pytest.mark.parametrize("loss,m,power,D", [("logistic", 1, None, 10), ("multinomial", 3, None, 10),
                                             ("tweedie", 1, 1.5, 10), ("multinomial", 3, None, 300)],
                         ids=["logistic", "multinomial", "tweedie", "multinomial-wide"])
@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
def test_bind_loss_gradient_recomputes_from_current_operands(loss, m, power, D, backend):
    """A bound pass, after W and z change in place, equals float64 on the new contents; on the
    one-read path every call writes the same buffers (D = 300, m = 3: two reads, still bound)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"bind-{loss}-{m}-{D}".encode()))
    N = 203
    X = torch.randn(N, D, generator=g)
    y = _target(loss, N, m, g)
    c = torch.rand(N, generator=g)
    W, z = torch.zeros(D + 1, m), torch.zeros(D + 1, m)
    kw = dict(loss=loss, power=power, sample_weight=c, alpha=0.7, beta=0.3, intercept=True, backend=backend)
    op = fusedml.bind_loss_gradient(X, W, y, z=z, **kw)
    assert op.one_read == (backend == "fused" and D == 10)
    ptrs = []
    for _ in range(2):
        W.copy_(0.3 * torch.randn(D + 1, m, generator=g) / D ** 0.5)
        z.copy_(torch.randn(D + 1, m, generator=g))
        r = op()
        ref = _reference(X, W, y, loss, power, c, 0.7, z, 0.3, True)
        for name, a, b in zip(r._fields, r, ref):
            assert a.shape == b.shape and _rel(a, b) < 2e-6, name
        ptrs.append((r.grad.data_ptr(), r.eta.data_ptr(), r.hess.data_ptr()))
    assert op.calls == 2 and (ptrs[0] == ptrs[1]) == op.one_read


@pytest.mark.parametrize("loss,m,objective", [("logistic", 1, "sum"), ("multinomial", 3, "sum"),
                                               ("squared_hinge", 3, "columns"), ("poisson", 1, "columns")])
@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
def test_objective_bound_and_unbound(loss, m, objective, backend):
    """``objective`` = alpha * loss + beta/2 ||z||^2 + offset (all columns or per column), from the
    unbound pass (torch) and the bound one (fused: its own launch after the read of X), after W and
    z change in place."""
    g = torch.Generator().manual_seed(zlib.crc32(f"obj-{loss}-{m}".encode()))
    N, D = 157, 9
    X = torch.randn(N, D, generator=g)
    y = _target(loss, N, m, g)
    c = torch.rand(N, generator=g)
    W, z = torch.zeros(D + 1, m), torch.zeros(D + 1, m)
    n = 1 if objective == "sum" else m
    offset = torch.randn(n, generator=g, dtype=torch.float64)
    kw = dict(loss=loss, sample_weight=c, alpha=0.7, beta=0.3, intercept=True, backend=backend,
              objective=objective, offset=offset)
    op = fusedml.bind_loss_gradient(X, W, y, z=z, **kw)
    for _ in range(2):
        W.copy_(0.3 * torch.randn(D + 1, m, generator=g) / D ** 0.5)
        z.copy_(W * (torch.arange(D + 1) < D)[:, None])  # the intercept row unpenalised
        _, lsum, _, _ = _reference(X, W, y, loss, None, c, 0.7, z, 0.3, True)
        want = 0.7 * lsum + 0.15 * z.double().square().sum(0)
        want = (want.sum().reshape(1) if objective == "sum" else want) + offset
        for r in (op(), fusedml.loss_gradient(X, W, y, z=z, **kw)):
            assert r.objective.shape == (n,) and r.objective.dtype == torch.float64
            assert _rel(r.objective, want) < 2e-6 and _rel(r.loss, lsum) < 2e-6
    # no penalty term without z or beta; a 1-D W gives a 0-d objective
    w1 = torch.zeros(D + 1)
    w1.fill_(0.05)
    r = fusedml.bind_loss_gradient(X, w1, (torch.rand(N, generator=g) < 0.5).float(), loss="logistic",
                                   intercept=True, backend=backend, objective="sum")()
    assert r.objective.ndim == 0 and float(r.objective) == pytest.approx(float(r.loss), rel=1e-12)


def test_objective_bad_inputs():
    X, w, y = torch.randn(20, 3), torch.zeros(3, 2), torch.rand(20, 2)
    kw = dict(loss="poisson", backend="cpu")
    with pytest.raises(ValueError, match="objective must be None, 'sum' or 'columns'"):
        fusedml.loss_gradient(X, w, y, objective="mean", **kw)
    with pytest.raises(ValueError, match="offset needs objective"):
        fusedml.loss_gradient(X, w, y, offset=torch.zeros(1, dtype=torch.float64), **kw)
    with pytest.raises(ValueError, match="offset must be a float64 tensor of 2 value"):
        fusedml.bind_loss_gradient(X, w, y, objective="columns", offset=torch.zeros(1, dtype=torch.float64), **kw)
    with pytest.raises(ValueError, match="offset must be a float64 tensor of 1 value"):
        fusedml.loss_gradient(X, w, y, objective="sum", offset=torch.zeros(1), **kw)


def test_bind_loss_gradient_vector_form_and_bad_inputs():
    X = torch.randn(50, 4)
    w, y = torch.zeros(5), (torch.rand(50) < 0.5).float()
    op = fusedml.bind_loss_gradient(X, w, y, loss="logistic", intercept=True, return_eta=False, backend="fused")
    w.fill_(0.2)
    r, want = op(), fusedml.loss_gradient(X, w, y, loss="logistic", intercept=True, backend="cpu")
    assert r.grad.shape == (5,) and r.loss.ndim == 0 and r.eta is None
    assert _rel(r.grad, want.grad.double()) < 2e-6 and _rel(r.loss, want.loss) < 2e-6
    with pytest.raises(ValueError, match="bind_loss_gradient: W must be a torch tensor of torch.float32"):
        fusedml.bind_loss_gradient(X, np.zeros(5, np.float32), y, loss="logistic", intercept=True)
    with pytest.raises(ValueError, match="bind_loss_gradient: z must be"):
        fusedml.bind_loss_gradient(X, w, y, loss="logistic", z=torch.zeros(5, dtype=torch.float64), intercept=True)
    with pytest.raises(ValueError, match="target must have the shape"):  # the usual checks, once
        fusedml.bind_loss_gradient(X, torch.zeros(5, 2), y, loss="logistic", intercept=True)

    class Streamed:
        def _fusedml_mmchain(self, *a, **k):
            return None
    with pytest.raises(TypeError, match="dense tensor or CSR matrix X"):
        fusedml.bind_loss_gradient(Streamed(), w, y, loss="logistic")


@pytest.mark.parametrize("loss,m,power", [("multinomial", 2, None), ("multinomial", 3, None), ("multinomial", 4, None),
                                          ("logistic", 3, None), ("squared_hinge", 4, None), ("tweedie", 2, 1.5),
                                          ("poisson", 3, None), ("multinomial", 5, None), ("multinomial", 8, None),
                                          ("squared_error", 6, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_unrolled_loss_pass(loss, m, power, dtype, monkeypatch):
    """2 <= m <= 4 on short rows: the unrolled kernel's loss epilogue (and no other kernel) against
    float64 and against the padded tl.dot; several programs share the tiles, rows not a multiple of
    the tile, eta stored, sample weights; a multinomial row far from the origin does not overflow.
    m = 5..8 (the padded tl.dot by default) through the unrolled kernel on request, m unrolled exactly."""
    from fusedml.mmchain import dense as dense_mod

    g = torch.Generator().manual_seed(zlib.crc32(f"small-{loss}-{m}-{dtype}".encode()))
    N, D = 77, 13
    X = torch.randn(N, D, generator=g, dtype=dtype)
    if loss == "multinomial":
        X[5] *= 400.0  # |t| in the hundreds: exp overflows without the row's max
    W = 0.3 * torch.randn(D + 1, m, generator=g, dtype=dtype)
    y = _target(loss, N, m, g).to(dtype)
    c = torch.rand(N, generator=g, dtype=dtype)
    z = torch.randn(D + 1, m, generator=g, dtype=dtype)
    launched = []
    real = dense_mod._mmchain_small_kernel
    monkeypatch.setattr(dense_mod, "_mmchain_small_kernel", type("K", (), {"__getitem__": lambda self, grid: (
        lambda *a, **k: (launched.append((k["LOSS"], k["M_PAD"])), real[grid](*a, **k)))})())
    kw = dict(loss=loss, power=power, sample_weight=c, alpha=0.7, z=z, beta=0.3, intercept=True, backend="fused",
              return_eta=True)
    cfg = {"block_n": 4, "num_programs": 3}
    if m > 4:
        cfg.update(mode="small", m_pad=8, num_warps=4, prefetch=2)
    r = fusedml.loss_gradient(X, W, y, config=cfg, **kw)
    assert launched and launched[0][0] > 0 and launched[0][1] == m  # m = 3 unrolled exactly
    ref = _reference(X, W, y, loss, power, c, 0.7, z, 0.3, True)
    tol = 2e-6 if dtype == torch.float32 else 1e-12
    for name, a, b in zip(("grad", "loss", "eta", "hess"), (r.grad, r.loss, r.eta, r.hess), ref):
        assert torch.isfinite(a).all() and _rel(a, b) < tol, (name, _rel(a, b))
    if dtype == torch.float32:  # the padded tl.dot on request: the same pass
        d = fusedml.loss_gradient(X, W, y, config={"mode": "dot", "m_pad": 16, "block_n": 16, "num_warps": 4}, **kw)
        assert _rel(d.grad, ref[0]) < tol and _rel(d.loss, ref[1]) < tol


def test_one_read(monkeypatch):
    X = torch.randn(100, 8)
    assert one_read(X, 1) and one_read(X, 16)
    assert not one_read(X, 17)
    monkeypatch.setenv("FUSEDML_LOSS_ONE_READ_M", "1")  # A/B runs: m > 1 composed from two reads
    assert one_read(X, 1) and not one_read(X, 3)
    monkeypatch.delenv("FUSEDML_LOSS_ONE_READ_M")
    import scipy.sparse as sp

    assert not one_read(fusedml.as_csr(sp.csr_matrix(X.numpy())), 1)
    assert not one_read(torch.randn(4, 200_000), 1)  # wide rows: cooperative / chunked strategies
    assert not one_read(torch.randn(100, 300), 3) and one_read(torch.randn(100, 300), 1)
    # the unrolled loss pass: m <= 4 on rows of <= 256 values, m = 5..8 on <= 64 (launch.unrolled_wide_m)
    assert one_read(torch.randn(100, 200), 3) and not one_read(torch.randn(100, 200), 5)
    assert one_read(torch.randn(100, 64), 8) and one_read(torch.randn(100, 100), 5)  # 100: the padded tl.dot


def test_wide_rows_m3_take_two_reads(monkeypatch):
    """loss_gradient follows one_read: m > 1 on rows wider than 256 values composes matvec and
    X^T V on the fused backend (the one-read pass is slower there), with the same result."""
    from fusedml.mmchain import lossgrad

    g = torch.Generator().manual_seed(11)
    X = torch.randn(300, 300, generator=g)
    W = 0.1 * torch.randn(301, 3, generator=g, dtype=torch.float32)
    y = torch.nn.functional.one_hot(torch.randint(0, 3, (300,), generator=g), 3).float()
    dense_fused = lossgrad._dense_fused

    def no_one_read(*a, **k):  # the one-read pass declines (loss_config); the composed one answers
        out = dense_fused(*a, **k)
        if out is not None:
            pytest.fail("one-read pass taken")
        return out

    monkeypatch.setattr(lossgrad, "_dense_fused", no_one_read)
    r = fusedml.loss_gradient(X, W, y, loss="multinomial", intercept=True, backend="fused")
    A = torch.cat([X.double(), torch.ones(300, 1, dtype=torch.float64)], 1)
    val, gr, h = loss_terms("multinomial", A @ W.double(), y.double())
    assert _rel(r.grad, A.T @ gr) < 2e-6 and _rel(r.loss, val.sum(0)) < 2e-6 and _rel(r.hess, h) < 2e-6


@pytest.mark.parametrize("D,m", [(200, 3), (64, 5), (50, 8)])
def test_unrolled_one_read_on_wider_rows_and_more_columns(monkeypatch, D, m):
    """m <= 4 on rows of 129..256 values and m = 5..8 on rows of <= 64 take the unrolled kernel's
    one-read loss pass (launch.unrolled_wide_m, dense.LOSS_SMALL_MAX_BD): same result as float64."""
    from fusedml.mmchain import dense, lossgrad

    g = torch.Generator().manual_seed(D + m)
    X = torch.randn(150, D, generator=g)
    W = 0.1 * torch.randn(D + 1, m, generator=g, dtype=torch.float32)
    y = torch.nn.functional.one_hot(torch.randint(0, m, (150,), generator=g), m).float()
    taken = []
    real = lossgrad._dense_fused
    monkeypatch.setattr(lossgrad, "_dense_fused", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    r = fusedml.loss_gradient(X, W, y, loss="multinomial", intercept=True, backend="fused")
    assert len(taken) == 1 and taken[0] is not None
    P = prepare_mmchain(X, W, y, None, 1.0, 0.0, intercept=True, v_op="mul", check_finite=False)
    assert dense._config(P, None, loss=True).mode == "small"
    A = torch.cat([X.double(), torch.ones(150, 1, dtype=torch.float64)], 1)
    val, gr, h = loss_terms("multinomial", A @ W.double(), y.double())
    assert _rel(r.grad, A.T @ gr) < 2e-6 and _rel(r.loss, val.sum(0)) < 2e-6 and _rel(r.hess, h) < 2e-6


def test_loss_terms_match_the_estimators_losses():
    # the kernel's eta-dependent parts differ from the estimators' losses by terms of y alone
    from algorithms._loss import BinomialLoss, GLMLoss, MultinomialLoss, SquaredHingeLoss, get_family, get_link

    g = torch.Generator().manual_seed(3)
    eta = torch.randn(50, 1, generator=g, dtype=torch.float64)
    eta2 = eta + 0.3
    pairs = [("logistic", None, BinomialLoss(), (torch.rand(50, 1, generator=g) < 0.5).double()),
             ("squared_hinge", None, SquaredHingeLoss(), torch.where(torch.rand(50, 1, generator=g) < 0.5, -1.0, 1.0).double()),
             ("poisson", None, GLMLoss(get_family("poisson"), get_link("log")), 2 * torch.rand(50, 1, generator=g).double()),
             ("gamma", None, GLMLoss(get_family("gamma"), get_link("log")), 0.1 + torch.rand(50, 1, generator=g).double()),
             ("tweedie", 1.5, GLMLoss(get_family("tweedie", power=1.5), get_link("log")), torch.rand(50, 1, generator=g).double()),
             ("squared_error", None, GLMLoss(get_family("normal"), get_link("identity")), torch.randn(50, 1, generator=g).double())]
    for name, power, est_loss, y in pairs:
        d1 = est_loss.value(y, eta) - loss_terms(name, eta, y, power)[0]
        d2 = est_loss.value(y, eta2) - loss_terms(name, eta2, y, power)[0]
        assert torch.allclose(d1, d2, atol=1e-12), name
        if getattr(est_loss, "kernel_exact", False):  # the objective adds no constant for these
            assert torch.allclose(d1, torch.zeros_like(d1), atol=1e-12), name
        gr, h = est_loss.grad_hess(y, eta)
        _, gk, hk = loss_terms(name, eta, y, power)
        assert torch.allclose(gr, gk, atol=1e-12) and torch.allclose(h, hk, atol=1e-12), name
    Y = torch.nn.functional.one_hot(torch.randint(0, 4, (50,), generator=g), 4).double()
    E = torch.randn(50, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(MultinomialLoss().value(Y, E)[:, 0], loss_terms("multinomial", E, Y)[0].sum(1))
    assert MultinomialLoss.kernel_exact and BinomialLoss.kernel_exact and SquaredHingeLoss.kernel_exact
    assert not getattr(pairs[2][2], "kernel_exact", False)  # Poisson: y log y - y terms


def test_loss_gradient_bad_inputs():
    X = torch.randn(20, 4)
    w = torch.zeros(4)
    y = torch.zeros(20)
    with pytest.raises(ValueError, match="loss must be one of"):
        fusedml.loss_gradient(X, w, y, loss="hinge")
    with pytest.raises(ValueError, match="needs power"):
        fusedml.loss_gradient(X, w, y, loss="tweedie")
    with pytest.raises(ValueError, match="power is only used"):
        fusedml.loss_gradient(X, w, y, loss="poisson", power=1.0)
    with pytest.raises(ValueError, match="target must have the shape"):
        fusedml.loss_gradient(X, torch.zeros(4, 3), y, loss="squared_hinge")
    with pytest.raises(ValueError, match="target must have N = 20 rows"):
        fusedml.loss_gradient(X, w, torch.zeros(19), loss="logistic")
    with pytest.raises(ValueError, match=r"W must have D = 4 rows"):
        fusedml.loss_gradient(X, torch.zeros(3), y, loss="logistic")
    for backend in ("fused", "ops", "cpu"):  # W = None was the loss at W = 0 on fused dense X
        for bind in (fusedml.loss_gradient, fusedml.bind_loss_gradient):
            with pytest.raises(ValueError, match="W is required"):
                bind(X, None, y, loss="logistic", backend=backend)
    with pytest.raises(ValueError, match="m >= 2"):
        fusedml.loss_gradient(X, w, y, loss="multinomial")
    with pytest.raises(ValueError, match="sample_weight must have N = 20"):
        fusedml.loss_gradient(X, w, y, loss="logistic", sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="target is required"):
        fusedml.loss_gradient(X, w, None, loss="logistic")
    with pytest.raises(ValueError, match="NaN or infinity|not finite|NaN"):
        fusedml.loss_gradient(X, w, torch.full((20,), float("nan")), loss="logistic", check_finite=True)
    assert set(LOSSES) == {"logistic", "squared_hinge", "multinomial", "poisson", "gamma", "tweedie", "squared_error"}


from _bench import bench_module as _bench_module  # noqa: E402


def test_bench_solver_ops_smoke(tmp_path):
    """benchmarks/bench_solver_ops.py on its CPU shapes: every pass runs and matches float64."""
    import json

    out = tmp_path / "s.json"
    rows = _bench_module("bench_solver_ops").main(["--shapes", "300x10", "200x20x3", "--out", str(out)])
    assert len(rows) == 9 and json.loads(out.read_text())["rows"][0]["pass"] == "loss+grad (logistic)"
    assert [r["pass"] for r in rows].count("hessian softmax") == 1  # m > 1 only
    assert all(r["rel_err"] < 1e-5 and r["fused_ms"] > 0 and r["ops_ms"] > 0 for r in rows)


def test_m3_probe_smoke(tmp_path):
    """benchmarks/m3_probe.py on tiny shapes: every variant of the m = 3 passes (and the plain m = 4
    product) runs and matches float64; the session-16 module is optional."""
    rows = _bench_module("m3_probe").main(["--shapes", "40x6", "30x8x4p", "--out", str(tmp_path / "m.json")])
    assert len(rows) >= 25 and all(r["ms"] is not None and r["rel_err"] < 1e-5 for r in rows)
    assert {r["case"] for r in rows} >= {"loss new", "softmax new", "mul new", "plain new"}
    rows = _bench_module("m3_probe").main(["--m", "5", "--shapes", "30x6", "--out", str(tmp_path / "m5.json")])
    assert len(rows) == 18 and all(r["ms"] is not None and r["rel_err"] < 1e-5 for r in rows)
    from fusedml.mmchain import dense, launch

    saved = dense.LOSS_SMALL_MAX_BD, launch.SMALL_WIDE_M_D["loss"]
    try:  # chosen launches, the loss pass on 256-value rows against its two-read form
        rows = _bench_module("m3_probe").main(["--m", "5", "--shapes", "20x150", "--launches", "4x8", "--forms",
                                               "loss", "--loss-max-d", "256", "--out", str(tmp_path / "w.json")])
    finally:
        dense.LOSS_SMALL_MAX_BD, launch.SMALL_WIDE_M_D["loss"] = saved
        dense._CONFIGS.clear()  # launches memoised under the probe's limits
    assert [r["launch"] for r in rows] == ["model", "matvec + X^T V", "small 4w x 8/thread, 2 ahead"]
    assert all(r["ms"] is not None and r["rel_err"] < 1e-5 for r in rows)


def test_profile_fit_smoke(tmp_path):
    """benchmarks/profile_fit.py on a tiny fit: one row per backend with the fit's iterations."""
    import json

    out = tmp_path / "p.json"
    _bench_module("profile_fit").main(["--shape", "300x6", "--calls", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["backend"] for r in rows] == ["fused", "ops"] and all(r["n_iter"] >= 1 for r in rows)
    assert all(r["wall_ms"] > 0 for r in rows)
    _bench_module("profile_fit").main(["--csr", "1000x50:4:powerlaw", "--algo", "ridge", "--backends", "ops",
                                       "--calls", "1", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["algo"] == "ridge" and row["shape"] == "300x40" and row["n_iter"] >= 1  # CPU: the tiny CSR shape


def test_profile_fit_trace_and_gaps(tmp_path, capsys):
    """``profile_fit.py --trace-dir`` writes a fit's Chrome trace; ``trace_gaps.py`` measures a
    synthetic trace exactly: GPU busy time, idle gaps with the host calls inside them, the host's
    time blocked in syncs, and the library functions' inclusive and blocked time."""
    import json

    _bench_module("profile_fit").main(["--shape", "300x6", "--calls", "1", "--backends", "ops",
                                       "--trace-dir", str(tmp_path), "--out", str(tmp_path / "p.json")])
    assert (tmp_path / "trace-logistic-300x6-ops.json").exists()
    ev = [
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0.0, "dur": 5.0},
        {"cat": "kernel", "name": "k1", "ts": 10.0, "dur": 100.0},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 150.0, "dur": 5.0},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 160.0, "dur": 40.0},
        {"cat": "kernel", "name": "k2", "ts": 170.0, "dur": 30.0},
        {"cat": "python_function", "name": "algorithms/_solvers.py(1): tron", "ts": 0.0, "dur": 200.0,
         "args": {"Python id": 1, "Python parent id": None}},
        {"cat": "python_function", "name": "torch/x.py(2): other", "ts": 1.0, "dur": 5.0,
         "args": {"Python id": 2, "Python parent id": 1}},
    ]
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    gaps = _bench_module("trace_gaps")
    s = gaps.summary(ev, top=5)
    assert s["wall_us"] == 200.0 and s["gpu_busy_us"] == 130.0 and s["gap_total_us"] == 70.0
    assert s["sync_blocked_us"] == 40.0 and s["n_syncs"] == 1 and s["n_kernels"] == 2
    calls = {"cudaLaunchKernel": 1, "cudaStreamSynchronize": 1}  # made while the GPU idled
    assert s["gaps"][0] == {"us": 60.0, "at_us": 110.0, "host_calls": calls}
    assert gaps.own_functions(ev) == [["algorithms/_solvers.py(1): tron", 200.0, 40.0, 1]]
    gaps.main([str(path)])
    assert "GPU busy 0.13 ms" in capsys.readouterr().out


def test_host_overhead_smoke(tmp_path):
    """benchmarks/host_overhead.py under the interpreter: every probe and both fits give a time."""
    import json

    out = tmp_path / "h.json"
    _bench_module("host_overhead").main(["--cprofile", "3", "--out", str(out)])
    d = json.loads(out.read_text())
    whats = {(r["what"], r["backend"]) for r in d["rows"]}
    assert ("empty Triton launch", "-") in whats and ("loss_gradient logistic, intercept", "fused") in whats
    fits = [r for r in d["rows"] if r["what"].startswith("LogisticRegression")]
    assert [r["backend"] for r in fits] == ["fused", "ops"] and all(r["us_per_call"] > 0 for r in d["rows"])
    assert set(d["cprofile"]) == {"fused", "ops", "mmchain fused", "loss_gradient fused"}
    assert all(t.startswith("   cum us") and len(t.splitlines()) > 1 for t in d["cprofile"].values())
    assert ("  prepare_mmchain (validation) alone", "fused") in whats


def test_host_overhead_ab_only_smoke(tmp_path, monkeypatch):
    """host_overhead.py --ab-only with a valued switch: one row per value and backend, each with
    the fit's mmchain count and every fit's time; the switch is unset afterwards."""
    import json
    import os

    monkeypatch.delenv("FUSEDML_CAPTURE_AFTER", raising=False)
    out = tmp_path / "ab.json"
    _bench_module("host_overhead").main(["--ab-only", "--ab-var", "FUSEDML_CAPTURE_AFTER", "--ab-values", "16", "2",
                                         "--ab-algos", "ridge", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["what"].rsplit(" ", 1)[-1], r["backend"]) for r in rows] == [
        ("16", "fused"), ("2", "fused"), ("16", "ops"), ("2", "ops")]
    assert all(r["n_mmchain"] >= 1 and len(r["fit_ms_all"]) == 2 and r["us_per_call"] > 0 for r in rows)
    assert "FUSEDML_CAPTURE_AFTER" not in os.environ


TWO_READ = [("csr",) + c for c in CASES] + [("wide",) + c for c in CASES if c[1] > 1]  # m = 1: one read to 16384


@pytest.mark.parametrize("layout,loss,m,power", TWO_READ, ids=[f"{c[0]}-{c[1]}-m{c[2]}-p{c[3]}" for c in TWO_READ])
def test_two_read_pass_terms_kernel_matches_float64(monkeypatch, layout, loss, m, power):
    """Where the one-read pass does not apply (CSR X; dense rows too wide for m), the fused backend's
    loss_gradient reads X twice with its pointwise terms (loss sums, ``c * loss'``, the Hessian
    weights) in one launch between the reads (``_terms_kernel``): every field against float64,
    with and without weights, float32 and float64 storage."""
    import importlib

    lg = importlib.import_module("fusedml.mmchain.lossgrad")
    calls = []
    real = lg._fused_terms
    monkeypatch.setattr(lg, "_fused_terms", lambda *a: (calls.append(1), real(*a))[1])
    g = torch.Generator().manual_seed(zlib.crc32(f"two-{loss}-{m}-{power}-{layout}".encode()))
    N, D = 157, (9 if layout == "csr" else 300)
    X = torch.randn(N, D, generator=g)
    if layout == "csr":
        X = X * (torch.rand(N, D, generator=g) < 0.4)
        X[5] = 0.0  # an empty row
    W = (0.3 if layout == "csr" else 0.05) * torch.randn(D + 1, m, generator=g)
    y = _target(loss, N, m, g)
    z = torch.randn(D + 1, m, generator=g)
    for dtype in (torch.float32, torch.float64):
        Xd = X.to(dtype)
        Xin = fusedml.as_csr(Xd.to_sparse_csr()) if layout == "csr" else Xd
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        Wd, yd, zd = W.to(acc), y.to(acc), z.to(acc)
        assert not one_read(Xin, m)
        for c in (None, torch.rand(N, generator=g).to(acc)):
            calls.clear()
            r = fusedml.loss_gradient(Xin, Wd, yd, loss=loss, power=power, sample_weight=c, alpha=0.7, z=zd,
                                      beta=0.3, intercept=True, backend="fused")
            assert calls == [1]
            ref = _reference(Xd, Wd, yd, loss, power, c, 0.7, zd, 0.3, True)
            for name, a, b in zip(r._fields, r, ref):
                assert a.shape == b.shape and a.dtype in (acc, torch.float64), name
                assert _rel(a, b) < (1e-12 if dtype == torch.float64 else 2e-6), (name, dtype, _rel(a, b))


def test_finite_check_ab_smoke(tmp_path, monkeypatch):
    """benchmarks/finite_check_ab.py under the interpreter: both modes of each fit give a time; the
    up-front mode runs the estimators' own check before the solver, the deferred one does not, and
    the patched helper is restored."""
    import json

    import algorithms._base as base

    mod = _bench_module("finite_check_ab")
    seen = []
    real = base.check_finite_fast
    monkeypatch.setattr(base, "check_finite_fast", lambda t, name: (seen.append(name), real(t, name)))
    out = tmp_path / "fc.json"
    mod.main(["--algos", "logistic", "ridge", "--backends", "ops", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algo"], r["backend"]) for r in rows] == [("logistic", "ops"), ("ridge", "ops")]
    assert all(len(r["all_ms"]["up front"]) == len(r["all_ms"]["deferred"]) == 2 and r["deferred_ms"] > 0 for r in rows)
    assert seen == ["X"] * 6  # the up-front fits only: one warm and two timed per fit
    assert base._check_design is mod._DEFERRED


def test_env_ab_smoke(tmp_path, monkeypatch):
    """benchmarks/env_ab.py under the interpreter: each fit gets a time under both settings, each
    fit runs under its own setting, and the environment is restored afterwards."""
    import json

    from algorithms import _solvers

    mod = _bench_module("env_ab")
    monkeypatch.setenv("FUSEDML_FUSED_CG", "1")  # the device-decided CG steps, as on the GPU
    monkeypatch.setenv("FUSEDML_SOLVE_AHEAD", "7")
    seen = []
    real = _solvers._ahead_enabled
    monkeypatch.setattr(_solvers, "_ahead_enabled", lambda: seen.append(os.environ.get("FUSEDML_SOLVE_AHEAD")) or real())
    out = tmp_path / "env.json"
    mod.main(["--a", "FUSEDML_SOLVE_AHEAD=0", "--b", "FUSEDML_SOLVE_AHEAD=", "--algos", "ridge", "--backends", "ops",
              "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algo"], r["backend"]) for r in rows] == [("ridge", "ops")]
    assert len(rows[0]["all_ms"]["A"]) == len(rows[0]["all_ms"]["B"]) == 2 and rows[0]["b_ms"] > 0
    assert seen.count("0") == 3 and seen.count(None) == 3  # one warm and two timed fits each
    assert os.environ["FUSEDML_SOLVE_AHEAD"] == "7"
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        mod.parse_setting(["FUSEDML_SOLVE_AHEAD"])
    from fusedml import _launch  # a module switch read at import: set as a Python literal, then restored

    restore = mod._common.set_env(mod.parse_setting(["fusedml._launch:SKIP_EMPTY_HOOKS=False"]))
    assert _launch.SKIP_EMPTY_HOOKS is False
    restore()
    assert _launch.SKIP_EMPTY_HOOKS is True
    with pytest.raises(ValueError, match="no attribute"):
        mod._common.set_env({"fusedml._launch:NO_SUCH_SWITCH": "1"})


def test_env_ab_gmm_smoke(tmp_path):
    """benchmarks/env_ab.py's GaussianMixture fits under a module switch, set per fit and restored."""
    import json

    from algorithms import mixture

    mod = _bench_module("env_ab")
    out = tmp_path / "env.json"
    mod.main(["--a", "algorithms.mixture:_TRUSTED_ESTEP=False", "--b", "algorithms.mixture:_TRUSTED_ESTEP=True",
              "--algos", "gmm-tied", "--backends", "ops", "--out", str(out)])
    (row,) = json.loads(out.read_text())["rows"]
    assert row["algo"] == "gmm-tied" and len(row["all_ms"]["A"]) == 2 and row["n_iter"]["A"] == row["n_iter"]["B"] >= 1
    assert mixture._TRUSTED_ESTEP is True
    mod.main(["--a", "FUSEDML_SOLVE_AHEAD=0", "--b", "FUSEDML_SOLVE_AHEAD=1", "--csr", "4:powerlaw", "--algos", "ridge",
              "--backends", "ops", "--out", str(out)])  # linear fits on CSR data
    (row,) = json.loads(out.read_text())["rows"]
    assert row["algo"] == "ridge" and row["b_ms"] > 0 and json.loads(out.read_text())["args"]["csr"] == "4:powerlaw"


def test_host_timeline_smoke(tmp_path):
    """benchmarks/host_timeline.py under the interpreter: the fit's timeline starts with the
    estimator's fit and nests the solver in it; every wrapped function is restored afterwards;
    ``--csr`` times the fit on a CSR X; ``--estep`` records one E-step in memory and one through
    the StreamedMatrix hook."""
    import json

    from algorithms import _solvers

    real = _solvers._trcg
    mod = _bench_module("host_timeline")
    out = tmp_path / "ht.json"
    (fit,) = mod.main(["--algo", "ridge", "--backend", "ops", "--min-us", "0", "--out", str(out)])
    rows = fit["rows"]
    assert rows[0]["name"] == "linear._LeastSquaresBase.fit"
    assert rows[0]["depth"] == 0 and all(r["depth"] >= 1 for r in rows[1:])
    assert any("conjugate_gradient" in r["name"] for r in rows)
    assert all(r["t_us"] + r["us"] <= rows[0]["t_us"] + rows[0]["us"] + 1 for r in rows)
    assert json.loads(out.read_text())["rows"][0]["rows"] == rows
    assert _solvers._trcg is real and not hasattr(torch.Tensor.tolist, "__wrapped_by_timeline__")
    (csr,) = mod.main(["--algo", "poisson", "--backend", "ops", "--csr", "4:powerlaw", "--min-us", "0", "--out",
                       str(out)])
    assert "CSR 4:powerlaw" in csr["label"] and csr["rows"][0]["name"].endswith(".fit")
    assert any("tron" in r["name"] for r in csr["rows"])
    mem, streamed, mem_em, streamed_em = mod.main(["--estep", "3:spherical", "--min-us", "0", "--out", str(out)])
    assert [mem["label"], streamed["label"]] == ["in memory", "streamed"]
    assert [mem_em["label"], streamed_em["label"]] == ["in memory, EM loop", "streamed, EM loop"]
    assert any(r["name"] == "_prep._trusted" for r in mem_em["rows"]) and all(
        r["name"] != "_prep._trusted" for r in mem["rows"])
    assert mem["rows"][0]["name"] == "gmm.gmm_estep" and any("estep_fused" in r["name"] for r in mem["rows"])
    assert any(r["name"] == "streaming.StreamedMatrix._fusedml_gmm_estep" for r in streamed["rows"])


def test_call_probe_smoke(tmp_path):
    """benchmarks/call_probe.py under the interpreter: each case gets both call forms' times, the
    host time per call and a profile of the default call."""
    import json

    mod = _bench_module("call_probe")
    out = tmp_path / "cp.json"
    mod.main(["--cases", "csr-powerlaw", "dense-2Mx128", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["csr-powerlaw", "dense-2Mx128"]
    for r in rows:
        assert all(len(r[k]) == 1 and r[k][0] > 0 for k in ("default_ms", "explicit_ms", "ops_ms", "host_default_us"))
        assert "tottime" in r["profile_default"]


def test_solver_ops_precision_points():
    """The sweep's m > 1 points: the padded tl.dot in both precisions; none for m = 1."""
    mod = _bench_module("bench_solver_ops")
    X = torch.randn(64, 100)
    pts = mod.sweep_points(X, 3, quick=False, only_precision=True)
    assert pts[0] is None and {"dot_precision": "ieee"} in pts
    assert any(p and p.get("mode") == "dot" and p.get("dot_precision") == "ieee" for p in pts)
    assert mod.sweep_points(X, 1, quick=False, only_precision=True) == [None]
