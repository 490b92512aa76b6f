"""fusedml.lloyd_step (the fused k-means step) and KMeans on it: against float64 references."""
import os
import sys

import numpy as np
import pytest
import torch

import fusedml
from fusedml import kmeans as km
from fusedml import _launch


def _reference(X, C, w):
    """float64 nearest centres, sums, counts, inertia by brute force."""
    X, C = X.double(), C.double()
    d2 = ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1)  # [N, K]
    mind, lab = d2.min(1)
    w = torch.ones(X.shape[0], dtype=torch.float64) if w is None else w.double()
    K = C.shape[0]
    sums = torch.zeros_like(C).index_add_(0, lab, X * w[:, None])
    counts = torch.zeros(K, dtype=torch.float64).index_add_(0, lab, w)
    return lab, sums, counts, (mind * w).sum()


def _relerr(a, b):
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-300))


SHAPES = [(1000, 5, 3, False, 0.0), (777, 16, 16, True, 0.0), (300, 33, 20, False, 1e4),
          (5, 2, 1, True, 0.0), (1, 1, 1, False, 0.0), (257, 1, 7, True, 50.0), (200, 64, 128, False, 0.0)]
FORMS = [{"USE_DOT": True}, {"USE_DOT": False, "BLOCK_N": 16}, {"REG_KI": 1, "PREFETCH": 0},
         {"REG_VALUES": 64, "PREFETCH": 1}]


def test_default_shift_is_central_in_the_data(rng):
    """The default shift comes from X, not the centres: a far, empty centre (k-means++ can pick an
    outlier) once moved it ~5e3 away and cost the fp32 sums ~1 % (found by tests/fuzz.py)."""
    X = torch.from_numpy(rng.standard_normal((273, 16))).float()
    C = torch.cat([X[:1] + 0.1, torch.full((1, 16), 1e4)])
    lab, sums, counts, inertia = _reference(X, C, None)
    r = fusedml.lloyd_step(X, C, backend="fused")
    assert torch.equal(r.labels, lab) and torch.equal(r.counts, counts)
    assert float((r.sums - sums).abs().max()) < 1e-4 * float(X.abs().sum(0).max())
    assert _relerr(r.inertia, inertia) < 1e-5


@pytest.mark.parametrize("N,D,K,weighted,offset,form",
                         [s + (None,) for s in SHAPES] + [s + (f,) for s in SHAPES[:4] for f in FORMS])
def test_fused_matches_float64(rng, N, D, K, weighted, offset, form):
    X = torch.from_numpy(rng.standard_normal((N, D)) * 2 + offset).float()
    C = X[torch.from_numpy(rng.choice(N, size=K, replace=K > N))].clone() + 0.01
    w = torch.from_numpy(rng.random(N)).float() if weighted else None
    X0 = X.clone()
    r = fusedml.lloyd_step(X, C, sample_weight=w, shift=X.double().mean(0), backend="fused", plan=form)
    assert torch.equal(X, X0)  # inputs never modified
    assert r.backend == "fused"
    lab, sums, counts, inertia = _reference(X, C, w)
    assert torch.equal(r.labels, lab)
    assert r.labels.dtype == torch.int64 and r.sums.dtype == torch.float64
    assert _relerr(r.sums, sums) < 1e-5
    assert _relerr(r.counts, counts) < 1e-5
    assert abs(float(r.inertia) / max(float(inertia), 1e-300) - 1) < 1e-4 or float(inertia) < 1e-9


def test_register_form_int64_offsets(rng, monkeypatch):
    """The Lloyd step's register form with int64 row offsets (X past 2^31 offsets) equals the
    reference too (the int32 form is what the other tests run)."""
    monkeypatch.setattr(km, "offsets_fit_int32", lambda *a: False)
    X = torch.from_numpy(rng.standard_normal((301, 16)) * 2 + 3.0).float()
    C = X[torch.from_numpy(rng.choice(301, size=16, replace=False))].clone() + 0.01
    r = fusedml.lloyd_step(X, C, shift=X.double().mean(0), backend="fused")
    lab, sums, counts, _ = _reference(X, C, None)
    assert torch.equal(r.labels, lab) and _relerr(r.sums, sums) < 1e-5 and _relerr(r.counts, counts) < 1e-5


@pytest.mark.parametrize("plan, match", [
    ({"bogus": 1}, r"plan: unknown key\(s\) 'bogus'"),
    ({"BLOCK_N": 24, "REG": False}, r"plan: BLOCK_N must be a power of two, got 24"),
    ({"BLOCK_N": 0, "REG": False}, r"plan: BLOCK_N must be a positive integer"),
    ({"num_warps": 3, "REG": False}, r"plan: num_warps must be a power of two from 1 to 32"),
    ({"per_sm": 0}, r"plan: per_sm must be a positive integer"),
    ({"REG_KI": 3}, r"plan: REG_KI must be a power of two"),
    ({"PREFETCH": 7}, r"plan: PREFETCH must be 0, 1 or 2"),
    ({"USE_DOT": 1}, r"plan: USE_DOT must be True or False"),
    ({"USE_DOT": True, "BLOCK_N": 8}, r"plan: USE_DOT needs BLOCK_N >= 16"),
    ({"BLOCK_N": 1 << 16, "REG": False}, r"plan: the launch's largest tile has 4194304 elements"),
])
def test_plan_overrides_are_checked(plan, match):
    """A launch override no kernel can run (or a misspelt key) raises naming it, before any launch."""
    X = torch.randn(200, 6)
    with pytest.raises(ValueError, match=match):
        fusedml.lloyd_step(X, X[:5].clone(), backend="fused", plan=plan)


def test_register_form_plan():
    p = km.lloyd_plan(1 << 20, 16, 16)
    assert p["REG"] == (2, 8) and p["BLOCK_N"] == 16 and not p["USE_DOT"]  # the GMM diag tile (measured)
    assert km.lloyd_plan(1 << 20, 16, 16, REG_VALUES=64)["REG"] == (4, 4)  # the s20-i probe
    assert km.lloyd_plan(1 << 20, 16, 16, REG_KI=1)["REG"] == (1, 16)
    assert km.lloyd_plan(1 << 20, 16, 16, REG=False)["REG"] is None
    assert km.lloyd_plan(1 << 20, 16, 16, USE_DOT=True)["USE_DOT"]
    assert km.lloyd_plan(1 << 20, 64, 64)["REG"] is None and km.lloyd_plan(1 << 20, 2, 128)["REG"] == (16, 8)


def test_dot_form_rows_per_tile():
    # tl.dot tiles: 64 rows up to a 4096-element accumulator, 32 beyond (kmeans-sweep-dot-*-s21-b)
    assert [km.lloyd_plan(1 << 20, d, k)["BLOCK_N"] for d, k in ((128, 16), (64, 64), (32, 256))] == [64, 64, 32]
    assert all(km.lloyd_plan(1 << 20, d, k)["USE_DOT"] for d, k in ((128, 16), (64, 64), (32, 256)))
    # fallbacks where the compiled tile spills (session 34): none up to 1024 entries or when a tile is forced
    assert [km.lloyd_plan(1 << 20, d, k)["fallback"] for d, k in ((24, 24), (128, 16), (64, 64), (32, 256))] == \
        [(), ((32, 8), (16, 8)), ((16, 4), (32, 8), (16, 8)), ((32, 8), (16, 8))]
    assert km.lloyd_plan(1 << 20, 64, 64, BLOCK_N=32)["fallback"] == ()
    assert km.lloyd_plan(1 << 20, 64, 64, num_warps=8)["fallback"] == ()


def test_first_fitting_tile_and_cpu_keeps_the_plan():
    """The tl.dot Lloyd tile: the first candidate whose compile stays within LOCAL_BYTES_OK of local
    memory (unknown accepts), else the one using least; off the GPU the plan's own tile (nothing compiled)."""
    ok, big = _launch.LOCAL_BYTES_OK, _launch.LOCAL_BYTES_OK + 4
    tiles = ((64, 4), (16, 4), (32, 8))
    seen = []

    def local(spill):
        return lambda bn, nw: seen.append((bn, nw)) or spill[(bn, nw)]
    assert _launch.first_fitting_tile(tiles, local({(64, 4): 0, (16, 4): 0, (32, 8): 0})) == (64, 4)
    assert _launch.first_fitting_tile(tiles, local({(64, 4): big, (16, 4): ok, (32, 8): 0})) == (16, 4)
    assert _launch.first_fitting_tile(tiles, local({(64, 4): big, (16, 4): None, (32, 8): 0})) == (16, 4)
    assert _launch.first_fitting_tile(tiles, local({(64, 4): big, (16, 4): big, (32, 8): big})) == (64, 4)  # a tie: first
    assert _launch.first_fitting_tile(tiles, local({(64, 4): 9 * big, (16, 4): 2 * big, (32, 8): 3 * big})) == (16, 4)
    assert seen[:1] == [(64, 4)] and seen[-3:] == list(tiles)  # in order, each compiled once
    p = km.lloyd_plan(1 << 20, 64, 64)
    assert km._dot_tile(torch.zeros(4, 64), {}, p, None, torch.device("cpu")) == (p["BLOCK_N"], p["num_warps"])


def test_torch_path_and_strided_half_input(rng):
    X = torch.from_numpy(rng.standard_normal((400, 24))).half()
    Xt = X.t().contiguous().t()  # column-major view, read without a copy
    C = X[:6].float() + 0.1
    ref = _reference(X.double(), C, None)
    for backend in ("fused", "cpu"):
        r = fusedml.lloyd_step(Xt, C, backend=backend)
        assert torch.equal(r.labels, ref[0]), backend
        assert _relerr(r.sums, ref[1]) < 1e-5


@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
def test_fp32_far_from_origin_every_backend(rng, backend):
    """Float32 points on an integer grid 1e7 from the origin: X and the centres move by the same
    (fp32-rounded) shift on every backend; the torch path once moved the centres by the unrounded
    one (inertia 139.3 against the exact 76, labels flipped)."""
    X = (1e7 + rng.integers(0, 2, (100, 3))).astype(np.float32)
    C = np.float32([[1e7] * 3, [1e7 + 1] * 3])
    Xd, Cd = X.astype(np.float64), C.astype(np.float64)
    d2 = ((Xd[:, None, :] - Cd[None]) ** 2).sum(2)
    r = fusedml.lloyd_step(torch.from_numpy(X), torch.from_numpy(C), backend=backend)
    assert float(r.inertia) == pytest.approx(d2.min(1).sum(), rel=1e-9)
    np.testing.assert_allclose(r.sums.double().numpy(), np.stack([Xd[d2.argmin(1) == k].sum(0) for k in range(2)]),
                               rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_nearest_labels_are_lloyd_step_labels(rng, monkeypatch, dtype):
    """``nearest_labels``: ``lloyd_step``'s labels on every backend and scale (1e-5 to 1e7 from the
    origin), without the step's ``index_add_`` sums off the fused kernel."""
    calls = []
    add = torch.Tensor.index_add_
    monkeypatch.setattr(torch.Tensor, "index_add_", lambda t, *a, **k: calls.append(1) or add(t, *a, **k))
    for scale, offset in ((1e-5, 0.0), (1.0, 3.0), (1.0, 1e7 if dtype != torch.float16 else 1e3)):
        X = torch.from_numpy(offset + scale * rng.standard_normal((300, 5))).to(dtype)
        C = X[rng.choice(300, 4, replace=False)].double() + 0.1 * scale
        for backend in ("fused", "ops", "cpu"):
            ref = fusedml.lloyd_step(X, C, backend=backend).labels
            calls.clear()
            got = km.nearest_labels(X, C, backend)
            assert got.dtype == torch.int64 and torch.equal(got, ref), (scale, offset, backend)
            assert not calls  # no per-cluster sums
    X = torch.from_numpy(rng.standard_normal((80, 256))).float()
    assert torch.equal(km.nearest_labels(X, X[:64], "fused"), _reference(X, X[:64], None)[0])  # no plan: torch
    sh = X[::km.central_rows(80).step].double().mean(0)  # row blocks given the whole matrix's shift
    blocks = torch.cat([km.nearest_labels(X[i:i + 30], X[:5], "cpu", shift=sh) for i in range(0, 80, 30)])
    assert torch.equal(blocks, km.nearest_labels(X, X[:5], "cpu")) and list(km.central_rows(5000)) == list(range(0, 5000, 5))


def test_large_k_d_runs_operator_path(rng):
    assert km.lloyd_plan(1000, 256, 64) is None  # the [K, D] accumulator does not fit registers
    X = torch.from_numpy(rng.standard_normal((80, 256))).float()
    r = fusedml.lloyd_step(X, X[:64], backend="fused")
    assert r.backend == "ops"
    ref = _reference(X, X[:64], None)
    assert torch.equal(r.labels, ref[0])
    assert _relerr(r.sums, ref[1]) < 1e-5


def test_bad_inputs():
    X = torch.randn(10, 3)
    with pytest.raises(ValueError, match="centers must have shape"):
        fusedml.lloyd_step(X, torch.randn(2, 4), backend="cpu")
    with pytest.raises(ValueError, match="non-empty"):
        fusedml.lloyd_step(torch.empty(0, 3), torch.randn(2, 3), backend="cpu")
    bad = X.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="X"):
        fusedml.lloyd_step(bad, torch.randn(2, 3), backend="fused")
    with pytest.raises(ValueError, match="non-negative"):
        fusedml.lloyd_step(X, torch.randn(2, 3), sample_weight=-torch.ones(10), backend="cpu")
    with pytest.raises(ValueError, match="sample_weight must have shape"):
        fusedml.lloyd_step(X, torch.randn(2, 3), sample_weight=torch.ones(9), backend="cpu")
    with pytest.raises(TypeError, match="floating"):
        fusedml.lloyd_step(X.long(), torch.randn(2, 3), backend="cpu")


def test_kmeans_fused_equals_reference_path(rng):
    from algorithms import KMeans

    centres = rng.standard_normal((5, 8)) * 6
    X = np.concatenate([c + rng.standard_normal((300, 8)) for c in centres]).astype(np.float32)
    w = rng.random(X.shape[0]).astype(np.float32)
    a = KMeans(5, random_state=0, backend="fused").fit(X, sample_weight=w)
    b = KMeans(5, random_state=0, backend="cpu").fit(X, sample_weight=w)
    assert np.array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-5, atol=1e-5)
    assert a.n_iter_ == b.n_iter_
    assert abs(a.inertia_ / b.inertia_ - 1) < 1e-5


def test_kmeans_fused_relocates_empty_cluster():
    from algorithms import KMeans

    X = np.array([[0, 0], [0, 1], [1, 0], [10, 10], [10, 11]], dtype=np.float32)
    init = np.array([[0, 0], [10, 10], [100, 100]], dtype=np.float32)  # third centre gets no point
    a = KMeans(3, init=init, n_init=1, backend="fused").fit(X)
    b = KMeans(3, init=init, n_init=1, backend="cpu").fit(X)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-5)
    assert len(set(a.labels_.tolist())) == 3


def test_kmeans_fused_relocates_after_the_first_step():
    # this start leaves clusters empty at steps 1 and 2: the second relocation reads step 1's
    # centres, which the queued step 3 must not have overwritten (the loop's three slots)
    from algorithms import KMeans

    rng = np.random.default_rng(4)
    X = rng.standard_normal((30, 2)).astype(np.float32)
    X[:10] += 5
    X[10:20] -= 5
    init = rng.uniform(-8, 8, (7, 2)).astype(np.float32)
    a = KMeans(7, init=init, n_init=1, max_iter=50, backend="fused").fit(X)
    b = KMeans(7, init=init, n_init=1, max_iter=50, backend="cpu").fit(X)
    assert a.n_iter_ == b.n_iter_ and np.array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-5, atol=1e-5)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-5)


def test_benchmark_smoke(tmp_path):
    import importlib.util
    import json

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("bench_kmeans", os.path.join(root, "benchmarks", "bench_kmeans.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "k.json"
    mod.main(["--quick", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and all("error" not in r for r in rows)
    assert all(r["label_agreement"] == 1.0 and r["rel_err_sums"] < 1e-5 and r["path"] == "fused" for r in rows)


@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_iterations_match_lloyd_step(rng, weighted):
    """LloydIterations.step (kernel + reduction + finalising kernel) = lloyd_step + the host update."""
    N, D, K = 500, 6, 5
    X = torch.from_numpy(rng.standard_normal((N, D)) * 2 + 3.0).float()
    C = X[:K].double() + 0.1
    w = torch.from_numpy(rng.random(N)).float() if weighted else None
    shift = C.mean(0)
    it = km.LloydIterations(X, w, shift, K)
    labels, new, out = it.step(C)
    r = fusedml.lloyd_step(X, C, sample_weight=w, shift=shift, backend="fused", check_finite=False)
    assert labels.dtype == torch.int32 and torch.equal(labels.long(), r.labels)
    ref_new = r.sums / r.counts[:, None]
    assert _relerr(new, ref_new) < 1e-12
    empty, shift_sq, inertia, changed = out.tolist()
    assert empty == 0 and changed == 0
    assert shift_sq == pytest.approx(float(((ref_new - C) ** 2).sum()), rel=1e-10)
    assert inertia == pytest.approx(float(r.inertia), rel=1e-10)
    # the second step starts from the finalising kernel's shifted centres; labels compared
    old = labels.clone()
    old[:7] = (old[:7] + 1) % K  # 7 labels that the step will not reproduce
    labels2, new2, out2 = it.step(new, old)
    r2 = fusedml.lloyd_step(X, new, sample_weight=w, shift=shift, backend="fused", check_finite=False)
    assert torch.equal(labels2.long(), r2.labels)
    assert _relerr(new2, r2.sums / r2.counts[:, None]) < 1e-10
    assert out2.tolist()[3] == float((labels2 != old).sum())
    # a cluster left empty is reported (its centre far from every row)
    far = torch.cat([C[:-1], torch.full((1, D), 1e3, dtype=torch.float64)])
    assert km.LloydIterations(X, w, shift, K).step(far)[2].tolist()[0] == 1.0
    # the in-place form (persistent slots, what the replayed loop uses) gives the same step
    a, b = it.new_slot(), it.new_slot()
    it.load(a, new, old)
    assert it.step_into(a, b) is None
    assert torch.equal(b["labels"], labels2) and torch.equal(b["C"], new2) and torch.equal(b["out"], out2)
    assert torch.equal(b["CS"], it.prepared[1]) and torch.equal(b["CSQ"], it.prepared[2])
    it.step_into(b, a)  # and on from its own results
    labels3, new3, out3 = it.step(new2, labels2)
    assert torch.equal(a["labels"], labels3) and torch.equal(a["C"], new3) and torch.equal(a["out"], out3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_candidate_distances(rng, dtype):
    N, D, L = 333, 7, 3
    X = torch.from_numpy(rng.standard_normal((N, D)) + 50.0).to(dtype)  # far from 0: no cancellation
    C = X[:L].double() + 0.25
    closest = torch.from_numpy(rng.random(N) * 10)
    w = torch.from_numpy(rng.random(N))
    ref = ((X.double()[None, :, :] - C[:, None, :]) ** 2).sum(-1)  # [L, N]
    dist, pots = km.candidate_distances(X, C)
    assert _relerr(dist, ref) < 1e-13 and _relerr(pots, ref.sum(1)) < 1e-13
    dist, pots = km.candidate_distances(X, C, closest, w)
    refm = torch.minimum(ref, closest[None, :])
    assert _relerr(dist, refm) < 1e-13 and _relerr(pots, refm @ w) < 1e-13
    assert km.candidate_distances(torch.zeros(4, 4096), torch.zeros(3, 4096)) is None  # L x D too large


def test_fused_kmeans_plusplus_picks_the_cpu_seeds(rng):
    from algorithms.mixture import _kmeans_plusplus

    X = torch.from_numpy(rng.standard_normal((400, 5)) * 3).float()
    sw = torch.from_numpy(rng.random(400))
    for w in (None, sw):
        a = _kmeans_plusplus(X, 6, np.random.RandomState(3), w, backend="fused")
        b = _kmeans_plusplus(X, 6, np.random.RandomState(3), w, backend="cpu")
        assert np.array_equal(a, b)
    # D = 1024: the kernel takes the first row (1 x 1024) but not 4 candidates (4 x 1024 > 2048
    # register values): those centres fall back to the operator-level distances
    X = torch.from_numpy(rng.standard_normal((200, 1024))).float()
    assert km.candidate_distances(X, X[:1].double()) is not None and km.candidate_distances(X, X[:4].double()) is None
    a = _kmeans_plusplus(X, 16, np.random.RandomState(5), None, backend="fused")
    assert np.array_equal(a, _kmeans_plusplus(X, 16, np.random.RandomState(5), None, backend="cpu"))


def test_lloyd_iterations_rejects_unplanned():
    X = torch.zeros(10, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="no fused Lloyd plan"):
        km.LloydIterations(X, None, torch.zeros(4, dtype=torch.float64), 3)


def _aot():
    from _sm90 import compile_sm90, resource_usage

    types = dict(X="*fp32", sx0="i64", sx1="i64", C="*fp32", CSQ="*fp32", SHIFT="*fp32", W="*fp32",
                 LAB="*i32", LAB_OLD="*i32", PART="*fp32", N="i32", D="i32", K="i32", n_tiles="i32")
    cases = [(D, K, None) for D, K in [(16, 16), (64, 64), (2, 128), (128, 8), (8, 8), (32, 256)]]
    cases += [(16, 16, {"USE_DOT": True}), (8, 8, {"USE_DOT": False})]  # the forms the register form replaced
    for (D, K, over) in cases:
        p = km.lloyd_plan(1 << 20, D, K, **(over or {}))
        consts = dict(HAS_W=True, HAS_OLD=True, BLOCK_N=p["BLOCK_N"], BLOCK_D=p["BLOCK_D"], BLOCK_K=p["BLOCK_K"])
        if p["REG"]:
            fn = km._lloyd_reg_kernel
            consts.update(KI=p["REG"][0], KO=p["REG"][1], PREFETCH=p["PREFETCH"], OFF32=True)
        else:
            fn = km._lloyd_kernel
            consts.update(USE_DOT=p["USE_DOT"])
        # specialised as the JIT specialises the launch on contiguous X (unit feature stride)
        values = dict(sx0=D, sx1=1, N=1 << 20, D=D, K=K, n_tiles=-(-(1 << 20) // p["BLOCK_N"]))
        k = compile_sm90(fn, types, consts, values, num_warps=p["num_warps"])
        assert k.metadata.shared <= 232448, (D, K, k.metadata.shared)
        regs, stack = resource_usage(k)
        assert stack == 0 or not p["REG"], (D, K, "register form spills", stack)
        print("AOT", D, K, "reg" if p["REG"] else "dot" if p["USE_DOT"] else "fma", k.metadata.shared, regs, stack)
    cd = km._cand_dist_kernel
    ctypes = dict(X="*fp32", sx0="i64", sx1="i64", C="*fp64", CLOSEST="*fp64", SW="*fp64", DIST="*fp64",
                  PPOT="*fp64", N="i32", D="i32", L="i32", n_tiles="i32")
    consts = dict(HAS_CLOSEST=True, HAS_SW=True, BLOCK_N=64, BLOCK_D=16, BLOCK_L=4)  # 1M x 16, K = 16
    compile_sm90(cd, ctypes, consts, dict(sx0=16, sx1=1, N=1 << 20, D=16, L=4, n_tiles=(1 << 20) // 64), num_warps=4)
    print("AOT candidate distances")
    fin = km._lloyd_finalize_kernel
    ftypes = dict(RED="*fp64", C="*fp64", SHIFT="*fp64", NEW="*fp64", CS="*fp32", CSQ="*fp32", OUT="*fp64",
                  K="i32", D="i32")
    consts = dict(BLOCK_K=256, BLOCK_D=32)  # the largest accumulator of the plan (K = 256, D = 32)
    compile_sm90(fin, ftypes, consts, dict(K=256, D=32), num_warps=4)
    print("AOT finalize")
    # the tl.dot tile a fit's step compiles (previous labels, with and without weights): the plan's or
    # the first fallback within LOCAL_BYTES_OK (km._dot_tile's rule, the compile's stack as its local memory)
    # (D not a multiple of 16: unaligned rows, 1M x 100, K = 16 and 1M x 52, K = 44)
    for D, K in ((64, 64), (32, 256), (128, 64), (16, 512), (100, 16), (52, 44)):
        p = km.lloyd_plan(1 << 20, D, K)
        for has_w in (False, True):
            consts = dict(HAS_W=has_w, HAS_OLD=True, BLOCK_D=p["BLOCK_D"], BLOCK_K=p["BLOCK_K"], USE_DOT=True)

            def local(bn, nw):
                values = dict(sx0=D, sx1=1, N=1 << 20, D=D, K=K, n_tiles=-(-(1 << 20) // bn))
                k = compile_sm90(km._lloyd_kernel, types, dict(consts, BLOCK_N=bn), values, num_warps=nw)
                return resource_usage(k)[1]
            bn, nw = _launch.first_fitting_tile(((p["BLOCK_N"], p["num_warps"]), *p["fallback"]), local)
            stack = local(bn, nw)
            print(f"dot tile {D}x{K} weights={has_w}: {bn} rows, {nw} warps, stack {stack} B", flush=True)
            assert stack <= _launch.LOCAL_BYTES_OK, (D, K, has_w, bn, nw, stack)
    print("AOT dot tiles")


def test_kernel_compiles_for_sm90():
    from _sm90 import run_aot

    run_aot(__file__, 11)


def test_kmeans_tolerance_matches_scikit_learn_far_from_origin(rng):
    # the one-pass variance about the first row: no cancellation for data far from the origin
    from sklearn.cluster._kmeans import _tolerance

    from algorithms.mixture import _kmeans_tolerance

    X = (rng.standard_normal((3000, 5)) * [1.0, 1e-3, 10.0, 2.0, 0.5] + 1e5).astype(np.float64)
    got = _kmeans_tolerance(torch.from_numpy(X), 1e-4)
    assert got == pytest.approx(_tolerance(X, 1e-4), rel=1e-9)
    assert _kmeans_tolerance(torch.from_numpy(X), 0.0) == 0.0


@pytest.mark.parametrize("max_iter,tol", [(1, 0.0), (2, 0.0), (300, 0.0), (300, 1e-2)])
def test_kmeans_fused_loop_stops_where_the_reference_does(rng, max_iter, tol):
    # the fused loop queues step i + 1 before reading step i: the iterates, the stop and the
    # history must still be those of the step-by-step loop
    from algorithms import KMeans

    centres = rng.standard_normal((4, 3)) * 2.5  # overlapping: several iterations
    X = np.concatenate([c + rng.standard_normal((150, 3)) for c in centres]).astype(np.float32)
    kw = dict(n_clusters=4, random_state=1, n_init=1, max_iter=max_iter, tol=tol)
    a = KMeans(backend="fused", **kw).fit(X)
    b = KMeans(backend="cpu", **kw).fit(X)
    assert a.n_iter_ == b.n_iter_ and len(a.history_) == len(b.history_) == a.n_iter_
    assert np.array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose([h["objective"] for h in a.history_], [h["objective"] for h in b.history_],
                               rtol=1e-5)


if __name__ == "__main__" and "--aot" in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _aot()
