"""Every kernel launch of representative public calls, compiled for sm_90 as the GPU's JIT compiles it.

The interpreter runs whatever it is given: a launch the H200's Triton cannot compile (for example a
``tl.dot`` whose reduction axis is under 16 wide, which Triton 3.6 rejects) passes every interpreted
test and fails on the GPU. Here the calls run under the interpreter with their launches recorded
(:class:`_sm90.record_launches`: arguments specialised as the JIT specialises them: aligned
pointers, multiples of 16, integers equal to 1), then each distinct launch is compiled for sm_90 in
a process without the interpreter. The calls cover the edge tiles of every operator: one to three
features, m not a power of two, every covariance type, the tensor-core precisions, CSR in both
strategies. ``python tests/fuzz.py --aot`` does the same for random cases.
"""
import os

import numpy as np
import pytest
import torch

import fusedml
from fusedml import CSRMatrix

from _sm90 import compile_descriptors, record_launches, require_tools


def _dense(rng, n, d, dtype=torch.float32):
    return torch.from_numpy(rng.standard_normal((n, d))).to(dtype)


def _csr(rng, n, d, per_row=3, dtype=torch.float32):
    cols = np.sort(np.stack([rng.choice(d, size=min(per_row, d), replace=False) for _ in range(n)]), axis=1)
    crow = torch.arange(0, n * cols.shape[1] + 1, cols.shape[1], dtype=torch.int32)
    return CSRMatrix(crow, torch.from_numpy(cols.ravel()).to(torch.int32),
                     torch.from_numpy(rng.standard_normal(cols.size)).to(dtype), (n, d))


def _mmchain_calls(rng):
    for D in (1, 2, 3, 17, 130):
        X = _dense(rng, 40, D)
        for m in (1, 2, 3, 5, 16):
            y = _dense(rng, D, m)
            yield f"mmchain D={D} m={m}", lambda X=X, y=y, m=m: fusedml.mmchain(X, y, _dense(rng, 40, m).abs(),
                                                                               backend="fused")
            yield f"matvec D={D} m={m}", lambda X=X, y=y: fusedml.matvec(X, y, backend="fused")
            yield f"X^T V D={D} m={m}", lambda X=X, m=m: fusedml.mmchain(X, None, _dense(rng, 40, m), backend="fused")
    # rows that are not whole 16-byte vectors, read from an aligned view of padded rows (VEC < -1)
    for D, m, dtype in ((17, 1, torch.float32), (55, 3, torch.float32), (130, 1, torch.bfloat16),
                        (137, 5, torch.float32)):
        Xa = fusedml.aligned_rows(_dense(rng, 40, D, dtype))
        yield f"mmchain aligned view D={D} m={m} {dtype}", lambda Xa=Xa, D=D, m=m: fusedml.mmchain(
            Xa, _dense(rng, D + 1, m), _dense(rng, 40, m).abs(), intercept=True, backend="fused")
        yield f"matvec aligned view D={D} m={m} {dtype}", lambda Xa=Xa, D=D, m=m: fusedml.matvec(
            Xa, _dense(rng, D + 1, m), intercept=True, backend="fused")
    Xb = _dense(rng, 40, 3, torch.bfloat16)
    yield "mmchain bf16 D=3", lambda: fusedml.mmchain(Xb, _dense(rng, 3, 1)[:, 0], backend="fused")
    yield "mmchain intercept softmax", lambda: fusedml.mmchain(
        _dense(rng, 40, 5), _dense(rng, 6, 3), _dense(rng, 40, 3).abs(), intercept=True, v_op="softmax",
        backend="fused")
    # the column-chunked launches of rows of 256-1024 values (launch.small_config, session 37)
    for D, m, dtype, v_op in ((256, 5, torch.float32, "softmax"), (256, 6, torch.float32, "mul"),
                              (256, 3, torch.bfloat16, "softmax"), (512, 5, torch.float32, "softmax"),
                              (512, 3, torch.float32, "mul"), (1000, 3, torch.float32, "softmax")):
        Xw = _dense(rng, 40, D, dtype)
        yield f"mmchain {v_op} D={D} m={m} {dtype}", lambda Xw=Xw, D=D, m=m, v_op=v_op: fusedml.mmchain(
            Xw, _dense(rng, D + 1, m), _dense(rng, 40, m).abs(), intercept=True, v_op=v_op, backend="fused")
        yield f"X^T V D={D} m={m + 2} {dtype}", lambda Xw=Xw, m=m: fusedml.mmchain(
            Xw, None, _dense(rng, 40, m + 2), intercept=True, backend="fused")


def _loss_calls(rng):
    X = _dense(rng, 40, 3)
    yield "loss logistic D=3", lambda: fusedml.loss_gradient(
        X, _dense(rng, 3, 1)[:, 0], torch.from_numpy(rng.integers(0, 2, 40)).float(), loss="logistic",
        backend="fused")
    Xw = _dense(rng, 40, 256)
    yield "loss multinomial D=256 m=3", lambda: fusedml.loss_gradient(  # chunks of 128 (session 37)
        Xw, 0.1 * _dense(rng, 257, 3), torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, 3, 40)), 3).float(),
        loss="multinomial", intercept=True, backend="fused")
    for m in (3, 5):
        yield f"loss multinomial m={m}", lambda m=m: fusedml.loss_gradient(
            X, _dense(rng, 3, m), torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, m, 40)), m).float(),
            loss="multinomial", backend="fused")
    for m in (1, 3):
        Xa = fusedml.aligned_rows(_dense(rng, 40, 55))
        yield f"loss multinomial aligned view D=55 m={m}", lambda Xa=Xa, m=m: fusedml.loss_gradient(
            Xa, 0.1 * _dense(rng, 56, m), torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, m + 1, 40)),
                                                                      m + 1)[:, :m].float(),
            loss="logistic" if m == 1 else "multinomial", intercept=True, backend="fused")
    yield "loss poisson D=17", lambda: fusedml.loss_gradient(
        _dense(rng, 40, 17), 0.1 * _dense(rng, 18, 1)[:, 0], torch.from_numpy(rng.poisson(1.0, 40)).float(),
        loss="poisson", intercept=True, backend="fused")
    # two reads, the pointwise terms in one launch between them: rows too wide for m = 5, CSR
    yield "loss multinomial D=200 m=5 (two reads)", lambda: fusedml.loss_gradient(
        _dense(rng, 40, 200), 0.1 * _dense(rng, 201, 5),
        torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, 5, 40)), 5).float(), loss="multinomial",
        intercept=True, backend="fused")
    A = _csr(rng, 50, 30)
    for loss, m, lo in (("logistic", 1, 0.0), ("squared_hinge", 16, -1.0)):  # targets {0, 1} / {-1, 1}
        yield f"loss {loss} CSR m={m} (two reads)", lambda loss=loss, m=m, lo=lo: fusedml.loss_gradient(
            A, 0.1 * _dense(rng, 30, m), torch.where(torch.from_numpy(rng.random((50, m))) < 0.5, lo, 1.0).float(),
            loss=loss, sample_weight=torch.rand(50), backend="fused")


def _csr_calls(rng):
    A = _csr(rng, 50, 30)
    for m in (1, 3, 4, 16):
        y, v = _dense(rng, 30, m), _dense(rng, 50, m).abs()
        for strategy in ("scatter", "gather"):
            yield f"csr m={m} {strategy}", lambda y=y, v=v, s=strategy: fusedml.mmchain(
                A, y, v, backend="fused", config={"strategy": s})
        yield f"csr matvec m={m}", lambda y=y: fusedml.matvec(A, y, backend="fused")
    # the stream pass: tiled (int16 keys, tl.atomic_add) and flat over 20000 columns (int32 keys,
    # inline red), fp32 and fp64, the vectors counted as past L1 while the call runs
    from fusedml.mmchain import csr

    flat = {"tile_bytes": csr.TILE_BYTES, "flat": 1}
    for name, A, cfg in (("tiled fp32", _csr(rng, 200, 300, 40), {"tile_bytes": 128}),
                         ("tiled fp64", _csr(rng, 200, 300, 40, torch.float64), {"tile_bytes": 128}),
                         ("flat fp32", _csr(rng, 60, 20000), flat),
                         ("flat fp64", _csr(rng, 60, 20000, dtype=torch.float64), flat)):
        n, d = A.shape
        y, v = _dense(rng, d, 1, A.val.dtype), _dense(rng, n, 1, A.val.dtype).abs()

        def streamed(A=A, y=y, v=v, cfg=cfg):
            saved, csr.L1_VECTOR_BYTES = csr.L1_VECTOR_BYTES, 0
            try:
                return fusedml.mmchain(A, y, v, backend="fused", config=dict(cfg, strategy="gather"))
            finally:
                csr.L1_VECTOR_BYTES = saved
        yield f"csr streams {name}", streamed


def _gmm_params(rng, K, D, ct):
    w = torch.full((K,), 1.0 / K, dtype=torch.float64)
    mu = torch.from_numpy(rng.standard_normal((K, D)))
    pc = {"full": torch.eye(D, dtype=torch.float64).repeat(K, 1, 1), "tied": torch.eye(D, dtype=torch.float64),
          "diag": torch.ones(K, D, dtype=torch.float64), "spherical": torch.ones(K, dtype=torch.float64)}[ct]
    return w, mu, pc


def _gmm_calls(rng):
    for ct in ("full", "tied", "diag", "spherical"):
        for D, K in ((1, 1), (2, 3), (3, 70), (40, 5)):
            X = _dense(rng, 60, D)
            params = _gmm_params(rng, K, D, ct)
            for path in ("single", "two_pass"):
                yield f"gmm_estep {ct} D={D} K={K} {path}", lambda X=X, p=params, ct=ct, path=path: fusedml.gmm_estep(
                    X, *p, ct, backend="fused", path=path)
            yield f"gmm_score {ct} D={D} K={K}", lambda X=X, p=params, ct=ct: fusedml.gmm_score(X, *p, ct, backend="fused")
    X = _dense(rng, 60, 20)
    for prec in ("tf32x3", "bf16"):
        for ct in ("full", "diag"):
            p = _gmm_params(rng, 9, 20, ct)
            yield f"gmm_estep {ct} {prec}", lambda p=p, ct=ct, prec=prec: fusedml.gmm_estep(
                X, *p, ct, backend="fused", precision=prec)


def _kmeans_calls(rng):
    for D, K in ((1, 2), (2, 3), (16, 16), (40, 70)):
        X = _dense(rng, 80, D)
        yield f"lloyd_step D={D} K={K}", lambda X=X, K=K: fusedml.lloyd_step(X, X[:K].double(), backend="fused")


FAMILIES = {"mmchain": _mmchain_calls, "loss_gradient": _loss_calls, "csr": _csr_calls, "gmm": _gmm_calls,
            "kmeans": _kmeans_calls}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_launch_compiles_for_sm90(family):
    require_tools()
    rng = np.random.default_rng(7)
    with record_launches() as rec:
        for name, call in FAMILIES[family](rng):
            rec.origin = name
            call()
    assert rec.launches, "no kernel launch was recorded"
    # FMA contraction asked for on every launch (Triton 3.10 turns the default off: _launch.FP_FUSION)
    off = [d for d in rec.launches if d["options"].get("enable_fp_fusion") is not True]
    assert not off, "launches without enable_fp_fusion=True:\n" + "\n".join(f"{d['name']} ({d['origin']})" for d in off)
    results = compile_descriptors(rec.launches)
    for r in results:
        print(r)
    failed = [r for r in results if "error" in r]
    assert not failed, "launches that do not compile for sm_90:\n" + "\n".join(map(str, failed))


def test_the_check_catches_a_launch_sm90_rejects(monkeypatch):
    """A launch the interpreter runs but sm_90 cannot compile fails here: matvec's padded tl.dot with
    the features left 8 wide (as it was before ``launch.padded_dot`` padded them to 16)."""
    from dataclasses import replace

    from fusedml.mmchain import launch

    require_tools()
    real = launch.padded_dot
    monkeypatch.setattr(launch, "padded_dot", lambda cfg, rows=None: replace(real(cfg, rows), block_d=cfg.block_d))
    rng = np.random.default_rng(0)
    X, y = _dense(rng, 40, 3), _dense(rng, 3, 3)
    with record_launches() as rec:
        w = fusedml.matvec(X, y, backend="fused")
    torch.testing.assert_close(w, X @ y)  # the interpreter runs it
    results = compile_descriptors(rec.launches)
    assert any("error" in r for r in results), results


def test_recording_without_executing_sees_the_same_launches():
    """``record_launches(execute=False)`` records what an executed call launches, and runs nothing."""
    rng = np.random.default_rng(3)
    X, y, v = _dense(rng, 50, 7), _dense(rng, 7, 3), _dense(rng, 50, 3).abs()
    with record_launches() as ran:
        fusedml.mmchain(X, y, v, backend="fused")
    with record_launches(execute=False) as skipped:
        w = fusedml.mmchain(X, y, v, backend="fused")
    assert ran.launches and [dict(d, origin=None) for d in ran.launches] == [dict(d, origin=None)
                                                                            for d in skipped.launches]
    assert not torch.allclose(w, X.T @ (v * (X @ y)))  # nothing was computed


def test_aot_plans_script_compiles_a_benchmark_case(capsys):
    """``benchmarks/aot_plans.py``: a benchmark case's launches at its full shape, recorded without
    running and compiled for sm_90 (k-means, 1M x 2, K = 128: the register-form Lloyd step)."""
    import sys

    require_tools()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import aot_plans

    assert aot_plans.main(["--parts", "kmeans", "--match", "^1048576x2 K=128$"]) == 0
    out = capsys.readouterr().out
    assert "_lloyd_reg_kernel" in out and "0 do not compile or fit" in out, out[-2000:]


def _float64_calls(rng):
    X, A64 = _dense(rng, 40, 5, torch.float64), _csr(rng, 40, 5, dtype=torch.float64)
    y, v, z = _dense(rng, 5, 1, torch.float64)[:, 0], _dense(rng, 40, 1, torch.float64)[:, 0].abs(), \
        _dense(rng, 5, 1, torch.float64)[:, 0]
    for name, M in (("dense", X), ("csr", A64)):
        yield f"mmchain {name} float64", lambda M=M: fusedml.mmchain(M, y, v, z, alpha=1 / 3, beta=0.1, backend="fused")
        yield f"matvec {name} float64", lambda M=M: fusedml.matvec(M, y, backend="fused")
    counts = torch.from_numpy(rng.poisson(1.0, 40)).double()
    for loss, power in (("tweedie", 1.2), ("poisson", None), ("logistic", None)):
        target = counts if loss != "logistic" else (counts > 0).double()
        yield f"loss {loss} float64", lambda loss=loss, power=power, target=target: fusedml.loss_gradient(
            X, 0.1 * y, target, loss=loss, power=power, alpha=1 / 3, z=z, beta=0.7, backend="fused")
    counts4 = torch.from_numpy(rng.poisson(1.0, (40, 4))).double()
    yield "loss tweedie m=4 float64", lambda: fusedml.loss_gradient(
        X, 0.1 * _dense(rng, 5, 4, torch.float64), counts4, loss="tweedie", power=1.2, alpha=1 / 3, backend="fused")
    # the two-read pass's terms kernel (CSR X; GPU fuzz case loss_gradient:38103, session 38)
    yield "loss tweedie CSR float64", lambda: fusedml.loss_gradient(
        A64, 0.1 * y, counts, loss="tweedie", power=1.2, alpha=1 / 3, z=z, beta=0.7, backend="fused")
    for ct in ("full", "diag"):
        p = _gmm_params(rng, 3, 5, ct)
        yield f"gmm_estep {ct} float64", lambda p=p, ct=ct: fusedml.gmm_estep(X, *p, ct, backend="fused")


def test_float64_launches_pass_only_fp32_exact_floats():
    """The GPU's Triton passes a Python float argument as fp32; the interpreter keeps float64. A
    float64 kernel given 1.2 computes with 1.2000000477 on the GPU only (the Tweedie power did:
    loss off by 2e-7 relative, found by the GPU fuzz run): such scalars go as fp32 hi / lo pairs
    (``dense._split``). Every float argument of a float64 call's launches must be fp32-exact
    (``launch_descriptor``'s ``rounded``)."""
    rng = np.random.default_rng(3)
    with record_launches() as rec:
        for name, call in _float64_calls(rng):
            rec.origin = name
            call()
    assert rec.launches, "no kernel launch was recorded"
    seen = [(d["name"], d["rounded"], d["origin"]) for d in rec.launches if d["rounded"]]
    assert not seen, f"float arguments the GPU would round to fp32: {seen}"


def _loss_pass_launch(N, D, m, kernel):
    """The recorded (not executed) launch of ``kernel`` in the multinomial loss pass at N x D, m
    classes, as the solvers' benchmark makes it (``bench_solver_ops.passes``)."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import bench_solver_ops

    with record_launches(execute=False) as rec:
        X, w = torch.empty(N, D), torch.zeros(D + 1, m)
        y, h = torch.zeros(N, m), torch.zeros(N, m)
        bench_solver_ops.passes(X, w, y, h, m)["loss+grad (multinomial)"][0]("fused", None)
    (launch,) = [d for d in rec.launches if d["name"] == kernel]
    return launch


def test_matvec_block_d_fits_without_spilling():
    """The multinomial loss pass's ``[X, 1] W`` at rows of 256 and 1024 values: the columns per tile
    ``dense.fitting_block_d`` takes (the plan's, halved while the compile spills more than
    LOCAL_BYTES_OK) compile within it for sm_90 (Triton 3.9 spilled 5.4 KB at 2M x 256, m = 5 and
    4.6 KB at 1M x 1024, m = 16 at the plan's tile; 3.6 keeps it). m = 8 here: up to m = 6 these rows
    take the one-accumulator-per-right-hand-side kernel since session 36."""
    import copy

    from fusedml import _launch

    require_tools()
    variants = []
    for N, D, m in ((2_000_000, 256, 8), (1_000_000, 1024, 16)):
        plan = _loss_pass_launch(N, D, m, "_matvec_kernel")
        bd = plan["consts"]["BLOCK_D"]
        for b in (bd >> i for i in range(bd.bit_length()) if bd >> i >= 128):
            d = copy.deepcopy(plan)
            d["consts"].update(BLOCK_D=b, EVEN_D=D % b == 0, ONE_CHUNK=b >= D)
            d["origin"] = (N, D, m, bd, b)
            variants.append(d)
    results = compile_descriptors(variants)
    stack = {d["origin"]: r.get("stack") for d, r in zip(variants, results)}
    assert all("error" not in r for r in results), results
    for key in {o[:4] for o in stack}:
        bd = key[3]
        ladder = [(b,) for (*k, b) in stack if tuple(k) == key]
        (b,) = _launch.first_fitting_tile(ladder, lambda b: stack[key + (b,)])
        print(f"matvec {key[:3]}: plan {bd} columns, takes {b} ({stack[key + (b,)]} B of stack)")
        assert stack[key + (b,)] <= _launch.LOCAL_BYTES_OK, (key, stack)


def test_unrolled_loss_block_n_fits_without_spilling():
    """The unrolled multinomial loss pass on rows not a multiple of 16 (1M x 55, m = 7): the rows per
    tile ``dense.fitting_block_n`` takes compile within LOCAL_BYTES_OK for sm_90 (16 rows: 3.6 KB on
    Triton 3.9, 1.1-1.3 KB on 3.6)."""
    import copy

    from fusedml import _launch

    require_tools()
    N, D, m = 1_000_000, 55, 7
    plan = _loss_pass_launch(N, D, m, "_mmchain_small_kernel")
    bn = plan["consts"]["BLOCK_N"]
    variants = []
    for b in (bn >> i for i in range(bn.bit_length())):
        d = copy.deepcopy(plan)
        d["consts"]["BLOCK_N"] = b
        d["origin"] = b
        variants.append(d)
    results = compile_descriptors(variants)
    assert all("error" not in r for r in results), results
    stack = {d["origin"]: r["stack"] for d, r in zip(variants, results)}
    (b,) = _launch.first_fitting_tile([(d["origin"],) for d in variants], lambda b: stack[b])
    print(f"loss pass {N}x{D} m={m}: plan {bn} rows, takes {b} ({stack})")
    assert stack[b] <= _launch.LOCAL_BYTES_OK, stack


def test_matvec_small_mode_loop_is_m_fmas_per_element():
    """The matvec's ``mode="small"`` (one accumulator per right-hand side) compiles for sm_90 into an
    inner loop of exactly m FFMAs per element of X a thread holds, with no shared-memory staging,
    barrier or spill; the padded FMA ``tl.dot`` the model ran on such rows until session 36 (2M x 256,
    m = 5) does 16 per element and stages its operands through shared memory."""
    require_tools()
    N, D, m, (bn, bd, warps) = 2_000_000, 256, 5, (16, 64, 4)
    launches = []
    for cfg in (dict(mode="dot", m_pad=16, block_n=64, dot_precision="ieee"),
                dict(mode="small", block_n=bn, block_d=bd, num_warps=warps)):
        with record_launches(execute=False) as rec:
            fusedml.matvec(torch.empty(N, D), torch.zeros(D + 1, m), intercept=True, backend="fused", config=cfg)
        launches.append(rec.launches[-1])
    dot, small = compile_descriptors(launches)
    assert "error" not in dot and "error" not in small, (dot, small)
    per_thread = bn * bd // (32 * warps)
    ops = small["inner_ops"]
    assert ops.get("FFMA") == m * per_thread, ops
    assert not any(ops.get(k) for k in ("LDS", "STS", "BAR", "LDL", "STL")), ops
    assert small["stack"] == 0
    assert dot["inner_ops"].get("LDS", 0) > 0 and dot["inner_ops"].get("FFMA", 0) >= 16 * per_thread, dot


def test_wide_row_hessian_chunks_cut_the_row_shuffles():
    """The model's multinomial Hessian product on 256-value rows (fp32, m = 5: chunks of 64, 16 values
    per thread on 4 warps, session 37) compiles for sm_90 without spills and reduces each row over
    16 lanes: 4 shuffles per right-hand side per tile, against 11 for the unchunked tile the model
    ran before (4 warps x 8 values, each row over 64 lanes: issue-bound, 1.41 against 0.736 ms at
    2M x 256 on the H100)."""
    require_tools()
    N, D, m = 2_000_000, 256, 5
    launches = []
    for cfg in (None, dict(mode="small", block_n=4, block_d=256, num_warps=4, chunk=None, prefetch=2)):
        with record_launches(execute=False) as rec:
            fusedml.mmchain(torch.empty(N, D), torch.zeros(D + 1, m), v=torch.empty(N, m), intercept=True,
                            v_op="softmax", backend="fused", config=cfg)
        launches.append(rec.launches[-1])
        assert launches[-1]["consts"]["M_PAD"] == m and launches[-1]["name"] == "_mmchain_small_kernel"
    assert launches[0]["consts"]["CHUNK"] == 64 and launches[0]["options"]["num_warps"] == 4
    new, old = compile_descriptors(launches)
    assert "error" not in new and "error" not in old, (new, old)
    assert new["stack"] == 0 and new["loop_spills"] == 0, new
    assert new["inner_ops"].get("SHFL") == 4 * m, new["inner_ops"]
    assert old["inner_ops"].get("SHFL", 0) >= 10 * m, old["inner_ops"]


def test_chunked_wide_row_launches_compile_without_loop_spills():
    """Each column-chunked launch the model takes on rows of 256-1024 values (``launch.small_config``,
    session 37: Hessian products, ``X^T V``, the m <= 4 loss pass; fp32 and bf16), recorded at its
    benchmark shape, compiles for sm_90 with no local-memory traffic inside its loops: those launches
    were timed spill-free on Triton 3.6, and a compile that spills in the loop would lose their gain
    (3.9 at 32 values per thread spilled, which is why 512-value rows take 8)."""
    require_tools()
    cases = [  # N, D, m, dtype, form
        (2_000_000, 256, 5, torch.float32, "softmax"), (2_000_000, 256, 6, torch.float32, "softmax"),
        (2_000_000, 256, 5, torch.float32, "mul"), (2_000_000, 256, 6, torch.float32, "mul"),
        (2_000_000, 256, 8, torch.float32, "xtv"), (2_000_000, 256, 3, torch.float32, "loss"),
        (2_000_000, 256, 5, torch.bfloat16, "softmax"), (2_000_000, 256, 5, torch.bfloat16, "xtv"),
        (1_000_000, 512, 5, torch.float32, "softmax"), (1_000_000, 512, 3, torch.float32, "mul"),
        (500_000, 1024, 3, torch.float32, "softmax")]
    launches = []
    for N, D, m, dtype, form in cases:
        X, W = torch.empty(N, D, dtype=dtype), torch.zeros(D + 1, m)
        with record_launches(execute=False) as rec:
            if form == "loss":
                fusedml.loss_gradient(X, W, torch.zeros(N, m), loss="multinomial", intercept=True, backend="fused")
            else:
                fusedml.mmchain(X, None if form == "xtv" else W, v=torch.empty(N, m), intercept=True,
                                v_op="softmax" if form == "softmax" else "mul", backend="fused")
        small = [d for d in rec.launches if d["name"] == "_mmchain_small_kernel"]
        assert len(small) == 1 and small[0]["consts"]["CHUNK"] < small[0]["consts"]["BLOCK_D"], (form, D, m, small)
        launches.append(dict(small[0], origin=(form, D, m, str(dtype))))
    results = compile_descriptors(launches)
    bad = [(d["origin"], r) for d, r in zip(launches, results) if "error" in r or r["loop_spills"]]
    assert not bad, bad
