"""Differential fuzzing of the public operators (tests/fuzz.py) on a fixed set of seeds.

Each seed draws a random configuration (shapes with edge sizes, dtypes, layouts, CSR containers,
optional operands, backends, forced launches) and checks the result against a float64 reference
within a worst-case rounding bound, that inputs are not modified, and deterministic repeats;
``fit`` cases train a random estimator and compare it with scikit-learn's on the same objective.
Longer campaigns: ``TRITON_INTERPRET=1 python tests/fuzz.py --n 500 --seed N``.
"""
import pytest

from fuzz import OPS, FuzzFailure, draw_fit, draw_gmm, draw_loss_gradient, draw_mmchain, draw_stream, run_case

# seeds per operator: ~0.1-0.4 s per operator case under the interpreter, ~1 s per fit
SEEDS = {op: range(40 if op == "fit" else 80) for op in OPS}


@pytest.mark.parametrize("op", OPS)
def test_fuzz_cases(op):
    failures = []
    for seed in SEEDS[op]:
        try:
            run_case(op, seed)
        except FuzzFailure as e:
            failures.append(f"{op}:{seed}: {e}")
    assert not failures, "\n".join(failures[:5]) + f"\n({len(failures)} of {len(SEEDS[op])} failed)"


#: cases CPU campaigns found failing, kept as regressions (session 28: fp32 distances about a shift
#: far from the data; an EM stopped on a quantised lower bound; predict_proba rows 1e-5 off one;
#: a tied fit of two tight clusters far apart whose fp32 second moments were not positive definite;
#: fit:30036, a harness false positive: EM crawling at tol = 1e-8, float64 included; fit:30436, an
#: fp32 lower-bound change under tol = 1e-8 within its rounding; session 31, a GPU campaign:
#: mmchain:28268, a forced launch whose [64, 16, 4096] tile Triton cannot compile, now rejected)
FOUND = ["gmm_estep:27329", "fit:27510", "fit:28678", "fit:1169", "fit:30036", "fit:30436", "mmchain:28268"]


@pytest.mark.parametrize("case", FOUND)
def test_fuzz_found_cases(case):
    op, seed = case.split(":")
    run_case(op, int(seed))


def test_fuzz_catches_a_wrong_result(monkeypatch):
    """The harness fails on a result off by one row's contribution (it can fail)."""
    import fusedml

    real = fusedml.mmchain

    def wrong(X, y, v=None, *a, **k):
        w = real(X, y, v, *a, **k)
        return w * (1 + 1e-3)

    monkeypatch.setattr(fusedml, "mmchain", wrong)
    with pytest.raises(FuzzFailure, match="mmchain"):
        for seed in range(5):
            run_case("mmchain", seed)


def test_fuzz_draws_cover_the_options():
    """The seeds reach every dtype, backend and layout the harness knows (no dead branches)."""
    mm = [draw_mmchain(s) for s in range(200)]
    assert {c["dtype"] for c in mm} == {"float32", "float64", "bfloat16", "float16"}
    assert {c["backend"] for c in mm} == {"fused", "cpu", "ops"}
    assert {c.get("layout") for c in mm} >= {"contiguous", "colmajor", "rowstride", "colstride", "numpy"}
    assert {c.get("container") for c in mm} >= {"scipy", "torch", "fusedml"}
    assert any(c.get("config") and c["config"].get("strategy") == "coop" for c in mm)
    assert any(c.get("config") and c["config"].get("strategy") == "chunked" for c in mm)
    assert any(c["v_op"] == "softmax" for c in mm) and any(c["y_none"] for c in mm)
    small = [c["small_config"] for c in mm if c.get("small_config")]  # the unrolled kernel's forced launches
    assert {s["exact_m"] for s in small} == {None, True, False} and {s["chunk"] is None for s in small} == {True, False}
    lg = [draw_loss_gradient(s) for s in range(200)]
    assert {c["loss"] for c in lg} == {"logistic", "squared_hinge", "multinomial", "poisson", "gamma", "tweedie",
                                       "squared_error"}
    gm = [draw_gmm(s) for s in range(200)]
    assert {c["cov"] for c in gm} == {"full", "tied", "diag", "spherical"}
    assert {c["path"] for c in gm} == {"auto", "single", "two_pass"}
    assert any(c["bind"] for c in mm) and any(c["bind"] for c in lg)
    st = [draw_stream(s) for s in range(200)]
    assert {c["op"] for c in st} == {"mmchain", "matvec", "gmm_estep"} and any(len(c["chunks"]) > 3 for c in st)
    fits = [draw_fit(s) for s in range(200)]
    assert {c["est"] for c in fits} == {"logistic", "multinomial", "svc", "poisson", "gamma", "tweedie", "ridge", "gmm"}
    assert {c["container"] for c in fits} == {"numpy", "torch", "csr"}
