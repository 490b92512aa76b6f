"""fusedml.mmchain / matvec against the float64 reference, on every backend (CPU, interpreter)."""
import gc
import json
import os
import sys
from unittest.mock import patch

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fusedml
from fusedml import _launch
from fusedml.mmchain import dense as dense_mod
from fusedml.mmchain import launch, ops
from fusedml.mmchain import matvec_reference, mmchain_reference

TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 2e-5, torch.bfloat16: 2e-5}
# "ops" multiplies half-precision X in its storage dtype (products rounded to bf16/fp16)
OPS_TOL = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def rel(a, ref):
    return float((a.detach().double().cpu() - ref).norm() / ref.norm())


@pytest.fixture
def poison(monkeypatch):
    """Every output the dense kernels must fully overwrite starts as NaN."""
    def nan_empty(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(dense_mod, "_empty", nan_empty)


def _operands(rng, N, D, m, *, intercept=False, ymode="vec"):
    Dx = D + intercept
    yshape = (Dx,) if m is None else (Dx, m)
    y = torch.from_numpy(rng.standard_normal(yshape))
    v = torch.from_numpy(rng.random((N,) if m is None else (N, m)) + 0.1)
    z = torch.from_numpy(rng.standard_normal(yshape))
    return y, v, z


def _dense(rng, N, D, dtype, layout="row"):
    X = torch.from_numpy(rng.standard_normal((N, D))).to(dtype)
    if layout == "col":
        X = X.t().contiguous().t()
    elif layout == "strided":
        X = torch.from_numpy(rng.standard_normal((N, 2 * D))).to(dtype)[:, ::2]
    return X


# --------------------------------------------------------------------------------------- dense fused
SHAPES = [(1, 7), (37, 5), (130, 64), (50, 300), (3, 1)]


@pytest.mark.parametrize("N,D", SHAPES, ids=[f"{n}x{d}" for n, d in SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_dense_fused_vector(rng, poison, N, D, dtype):
    X = _dense(rng, N, D, dtype)
    y, v, z = _operands(rng, N, D, None)
    X0 = X.clone()
    w = fusedml.mmchain(X, y, v, z, alpha=0.7, beta=0.3, backend="fused")
    assert w.shape == (D,) and w.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert rel(w, mmchain_reference(X, y, v, z, 0.7, 0.3)) < TOL[dtype]
    assert torch.equal(X, X0)


CASES = [
    # (intercept, m, v_op, layout, deterministic)
    (False, 3, "mul", "row", False),
    (True, None, "mul", "col", False),
    (True, 4, "softmax", "row", True),
    (False, None, "mul", "strided", True),
    (True, 2, "mul", "col", True),
]


@pytest.mark.parametrize("case", CASES, ids=[f"icpt{c[0]}-m{c[1]}-{c[2]}-{c[3]}-det{c[4]}" for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_dense_fused_variants(rng, poison, case, dtype):
    intercept, m, v_op, layout, det = case
    N, D = 45, 24
    X = _dense(rng, N, D, dtype, layout)
    y, v, z = _operands(rng, N, D, m, intercept=intercept)
    w = fusedml.mmchain(X, y, v, z, 1.3, -0.5, intercept=intercept, v_op=v_op, backend="fused",
                        deterministic=det)
    ref = mmchain_reference(X, y, v, z, 1.3, -0.5, intercept=intercept, v_op=v_op)
    assert w.shape == ref.shape
    assert rel(w, ref) < TOL[dtype]
    if det:
        w2 = fusedml.mmchain(X, y, v, z, 1.3, -0.5, intercept=intercept, v_op=v_op, backend="fused",
                             deterministic=True)
        assert torch.equal(w, w2)


@pytest.mark.parametrize("det", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("m", [None, 3], ids=["vec", "m3"])
def test_dense_fused_chunked_wide_strategy(rng, poison, det, m):
    """The wide-D two-pass strategy, forced on a small problem (D not a multiple of the chunk)."""
    N, D = 40, 70
    X = _dense(rng, N, D, torch.float32)
    y, v, z = _operands(rng, N, D, m, intercept=True)
    cfg = {"strategy": "chunked", "block_d": 16, "block_n": 16, "num_programs": 2}
    w = fusedml.mmchain(X, y, v, z, 0.5, 2.0, intercept=True, backend="fused", deterministic=det, config=cfg)
    assert rel(w, mmchain_reference(X, y, v, z, 0.5, 2.0, intercept=True)) < TOL[torch.float32]


def test_dense_fused_elementwise_fp32_and_onchip_overrides(rng, poison):
    """mode='elementwise' (the fp64 path) also serves fp32; several programs share the tiles."""
    X = _dense(rng, 70, 20, torch.float32)
    y, v, _ = _operands(rng, 70, 20, 3)
    w = fusedml.mmchain(X, y, v, backend="fused", config={"mode": "elementwise", "m_pad": 4, "block_n": 8,
                                                            "num_programs": 3})
    assert rel(w, mmchain_reference(X, y, v)) < TOL[torch.float32]


@pytest.mark.parametrize("prec", ["tf32x3", "ieee"])
@pytest.mark.parametrize("strategy", ["onchip", "chunked"])
def test_dense_fused_dot_precisions(rng, poison, prec, strategy):
    """The padded tl.dot in both operand precisions (tensor-core tf32x3 is the default), matvec too."""
    X = _dense(rng, 70, 40, torch.float32)
    y, v, z = _operands(rng, 70, 40, 3, intercept=True)
    cfg = {"mode": "dot", "m_pad": 16, "block_n": 16, "num_programs": 3, "dot_precision": prec}
    if strategy == "chunked":
        cfg.update(strategy="chunked", block_d=16)
    w = fusedml.mmchain(X, y, v, z, 0.5, 2.0, intercept=True, backend="fused", config=cfg)
    assert rel(w, mmchain_reference(X, y, v, z, 0.5, 2.0, intercept=True)) < TOL[torch.float32]
    t = fusedml.matvec(X, y, intercept=True, backend="fused", config=dict(cfg, strategy="onchip", block_d=16))
    assert rel(t, matvec_reference(X, y, intercept=True)) < TOL[torch.float32]


def test_dense_launch_memo_and_padded_dot_rules(rng):
    """The per-problem launch is memoised (same object for the same call, overrides respected); the
    m <= 4 loss pass takes the unrolled kernel's loss epilogue, matvec the tensor-core padded dot,
    X^T V the unrolled kernel."""
    from fusedml.mmchain._checks import prepare_mmchain

    X = _dense(rng, 300, 20, torch.float32)
    y, v, _ = _operands(rng, 300, 20, 3)
    kw = dict(intercept=False, v_op="mul", check_finite=False)
    P = prepare_mmchain(X, y, v, None, 1.0, 0.0, **kw)
    a, b = dense_mod._config(P, None), dense_mod._config(P, None)
    assert a is b and a.mode == "small"
    assert dense_mod._config(P, {"block_n": 8}).block_n == 8
    model = launch.dense_config(300, 20, 3, torch.float32, launch.gpu_info(X.device))
    assert dense_mod._config(P, None, loss=True) == launch.small_config(  # the loss pass
        model, 20, 3, torch.float32, xtv=False, intercept=False, gpu=launch.gpu_info(X.device), stride_xn=20, loss=True)
    forced = dense_mod._config(P, {"mode": "dot", "m_pad": 16, "block_n": 64, "num_warps": 4}, loss=True)
    assert (forced.mode, forced.m_pad) == ("dot", 16)  # the padded tl.dot on request (the sweeps' A/B)
    Pt = prepare_mmchain(X, None, v, None, 1.0, 0.0, **kw)  # X^T V
    assert dense_mod._config(Pt, None).mode == "small" and not dense_mod._config(Pt, None).prefetch
    assert launch.matvec_config(300, 20, 3, torch.float32, launch.gpu_info(X.device)).mode == "dot"
    wide = launch.dense_config(300, 256, 3, torch.float32, launch.gpu_info(X.device))
    assert (launch.padded_dot(wide).block_n, launch.padded_dot(wide).dot_precision) == (32, "ieee")  # wide rows
    assert (launch.padded_dot(a).block_n, launch.padded_dot(a).dot_precision) == (64, "tf32x3")
    # narrow X (iris: D = 4): tl.dot's reduction axis is at least 16 on sm_90, so the features pad to 16
    for d in (1, 3, 4, 8):
        mv = launch.matvec_config(150, d, 3, torch.float32, launch.gpu_info(X.device))
        assert (mv.mode, mv.block_d, mv.block_n) == ("dot", 16, 64), (d, mv)


def test_small_config_rules(rng):
    """launch.small_config (grid_probe-H200-2026-12-03-s12-b): X Y products prefetch (two tiles
    ahead; one for the plain product on rows of <= 128 values, 4 elements per thread on 16 warps;
    fp32 m = 4 there: 8 on 8 warps in chunks of 64),
    else 8 on 8 warps; X^T V
    without prefetch, 16 per thread (8 on 16 warps for m = 5..8); fp32 rows of 256 values: 16 on 4
    warps in chunks of 64, two tiles ahead (hessian_probe-*-s37); fp64 half, 2-byte storage at least
    8; overrides still win."""
    from fusedml.mmchain._checks import prepare_mmchain

    cases = [  # D, m, intercept, xtv, dtype -> warps, elements per thread, prefetch, m_pad
        (100, 4, False, False, torch.float32, 8, 8, 1, 4), (100, 3, True, False, torch.float32, 8, 8, 2, 4),
        (100, 4, False, False, torch.float64, 16, 2, 1, 4),
        (256, 4, False, False, torch.float32, 4, 16, 2, 4), (128, 3, True, True, torch.float32, 8, 16, False, 4),
        (256, 5, True, True, torch.float32, 4, 16, 2, 8), (64, 2, False, False, torch.float64, 16, 2, 1, 2),
        (600, 8, False, True, torch.float64, 16, 4, False, 8), (128, 4, False, False, torch.bfloat16, 16, 8, 1, 4)]
    for D, m, intercept, xtv, dtype, warps, ept, pf, m_pad in cases:
        X = _dense(rng, 64, D, dtype)
        y, v, _ = _operands(rng, 64, D, m, intercept=intercept)
        P = prepare_mmchain(X, None if xtv else y, v, None, 1.0, 0.0, intercept=intercept, v_op="mul",
                            check_finite=False)
        cfg = dense_mod._config(P, None)
        bd = 1 << (D - 1).bit_length()
        assert (cfg.mode, cfg.num_warps, cfg.block_n * bd // (32 * warps), cfg.prefetch, cfg.m_pad) == (
            "small", warps, ept, pf, m_pad), (D, m, intercept, xtv, cfg)
        assert cfg.num_programs == 132 * (2048 // (32 * warps))  # an upper bound: the launcher caps it
        # column chunks (chunk_probe-*-s18-e): fp32, m = 4 without the intercept on 128-value rows; fp32
        # 256-value rows (hessian_probe-*-s37)
        assert cfg.chunk == (64 if (D, m, intercept, dtype) == (100, 4, False, torch.float32)
                             or (D, dtype) == (256, torch.float32) else None)
        assert dense_mod._config(P, {"prefetch": not pf}).prefetch == (not pf)
    with pytest.raises(ValueError, match="m <= 8"):
        launch.small_config(launch.dense_config(10, 8, 9, torch.float32), 8, 9, torch.float32, xtv=False,
                            intercept=False)
    with pytest.raises(ValueError, match="1024"):
        launch.small_config(launch.dense_config(10, 2000, 3, torch.float32), 2000, 3, torch.float32, xtv=True,
                            intercept=False)


@pytest.mark.parametrize("form,m,D,dtype,want", [  # want: values per thread, warps, chunk, exact_m
    ("softmax", 5, 256, torch.float32, (16, 4, 64, True)), ("softmax", 6, 200, torch.float32, (16, 4, 128, True)),
    ("mul", 3, 256, torch.float32, (16, 4, 64, True)), ("mul", 5, 256, torch.float32, (16, 4, 64, True)),
    ("mul", 6, 256, torch.float32, (8, 8, 128, False)), ("xtv", 5, 256, torch.float32, (16, 4, 64, True)),
    ("xtv", 8, 512, torch.float32, (16, 4, 128, True)), ("loss", 3, 256, torch.float32, (8, 4, 128, None)),
    ("softmax", 5, 256, torch.bfloat16, (16, 4, 128, True)), ("mul", 4, 256, torch.float16, (16, 4, 128, True)),
    ("xtv", 6, 256, torch.bfloat16, (16, 4, 128, True)), ("loss", 3, 256, torch.bfloat16, (8, 4, None, None)),
    ("softmax", 5, 512, torch.float32, (16, 4, 128, True)), ("mul", 3, 400, torch.float32, (8, 4, 256, True)),
    ("softmax", 4, 512, torch.float32, (8, 4, 256, True)), ("mul", 3, 1000, torch.float32, (16, 4, 256, True))])
def test_small_config_256_value_rows(rng, poison, form, m, D, dtype, want):
    """Rows of 256 values (fp32: also 512 and 1024) take the unrolled kernel in column chunks, two tiles
    ahead, m unrolled exactly (H100, hessian_probe-H100-2026-12-06-s37 / -s37b / -s37h / -s37j: the multinomial
    Hessian product at 2M x 256, m = 5 0.736 ms against 1.41; 2-byte storage in chunks of 128, -s37f:
    bf16 0.657 against 0.782; its loss pass keeps its launch); the model's launch gives the float64
    result (the loss pass: its one read, gradient, loss and Hessian weights)."""
    from fusedml.mmchain._checks import prepare_mmchain

    X = _dense(rng, 40, D, dtype)
    y, v, z = _operands(rng, 40, D, m, intercept=True)
    if form == "loss":
        Y = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, m, 40)), m).float()
        W = 0.3 * torch.as_tensor(rng.standard_normal((D + 1, m)), dtype=torch.float32)
        P = prepare_mmchain(X, W, None, None, 1.0, 0.0, intercept=True, v_op="mul", check_finite=False)
        cfg = dense_mod._config(P, None, loss=True)
        r = fusedml.loss_gradient(X, W, Y, loss="multinomial", intercept=True, backend="fused")
        ref = fusedml.loss_gradient(X.double(), W.double(), Y.double(), loss="multinomial", intercept=True,
                                    backend="cpu")
        assert rel(r.grad, ref.grad) < TOL[torch.float32] and rel(r.loss, ref.loss) < 1e-5
        assert rel(r.hess, ref.hess) < 1e-5
    else:
        yy = None if form == "xtv" else y
        vop = "softmax" if form == "softmax" else "mul"
        P = prepare_mmchain(X, yy, v, z, 1.0, 0.5, intercept=True, v_op=vop, check_finite=False)
        cfg = dense_mod._config(P, None)
        w = fusedml.mmchain(X, yy, v, z, 1.0, 0.5, intercept=True, v_op=vop, backend="fused")
        assert rel(w, mmchain_reference(X, yy, v, z, 1.0, 0.5, intercept=True, v_op=vop)) < TOL[torch.float32]
    ept = cfg.block_n * cfg.block_d // (32 * cfg.num_warps)
    assert (cfg.mode, ept, cfg.num_warps, cfg.chunk, cfg.exact_m, cfg.prefetch) == ("small",) + want + (2,), cfg
    # column-major X keeps its launch (no chunks)
    Xc = X.T.contiguous().T
    Pc = prepare_mmchain(Xc, None if form == "xtv" else y, v, z, 1.0, 0.5, intercept=True, v_op="mul",
                         check_finite=False)
    assert dense_mod._config(Pc, None, loss=form == "loss").chunk is None


def test_loss_pass_one_read_on_request_on_wide_rows(rng, monkeypatch):
    """On rows the model composes from two reads (m = 5 on 256 values) the caller can still ask for the
    unrolled one-read loss pass (``config={"mode": "small", ...}``): same gradient, loss and Hessian
    weights as float64."""
    from fusedml.mmchain._checks import prepare_mmchain

    X = _dense(rng, 30, 256, torch.float32)
    Y = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, 5, 30)), 5).float()
    W = 0.3 * torch.as_tensor(rng.standard_normal((257, 5)), dtype=torch.float32)
    P = prepare_mmchain(X, W, None, None, 1.0, 0.0, intercept=True, v_op="mul", check_finite=False)
    with pytest.raises(NotImplementedError):
        dense_mod._config(P, None, loss=True)
    cfg = {"mode": "small", "block_n": 8, "chunk": 64, "num_warps": 4}
    assert dense_mod._config(P, cfg, loss=True).mode == "small"
    launched = _record_small_launches(monkeypatch, "LOSS")
    r = fusedml.loss_gradient(X, W, Y, loss="multinomial", intercept=True, backend="fused", config=cfg)
    assert launched == [3]  # one launch of the unrolled kernel's multinomial loss pass
    ref = fusedml.loss_gradient(X.double(), W.double(), Y.double(), loss="multinomial", intercept=True, backend="cpu")
    assert rel(r.grad, ref.grad) < TOL[torch.float32] and rel(r.loss, ref.loss) < 1e-5 and rel(r.hess, ref.hess) < 1e-5


def test_dense_dot_precision_default_and_bad_value(rng):
    """The model's "dot" launches take tf32x3 on rows of <= 128 values and fp32 FMAs (16 rows x 4
    warps) beyond (dot_probe-H200-2026-12-03-s12-d), 8 warps on rows over 512 values (4 spilled
    0.3-1.4 KB in sm_90 compiles), and fp32 FMAs beyond 128 values for 2-byte storage too (its
    tiles at the model's blocks, tf32x3 spilled there); matvec 64 rows there; an unknown precision is a clear error; the
    fp32 FMA launch is exact to fp32 on wide rows."""
    gpu = launch.gpu_info(torch.device("cpu"))
    cfg = launch.dense_config(10_000, 100, 8, torch.float32, gpu)
    assert cfg.mode == "dot" and cfg.dot_precision == "tf32x3"
    for D in (256, 600, 3000):
        cfg = launch.dense_config(10_000, D, 5, torch.float32, gpu)
        assert cfg.mode == "dot" and cfg.dot_precision == "ieee", (D, cfg)
        if cfg.strategy == "onchip":
            assert (cfg.block_n, cfg.num_warps) == (16, 4 if D <= 512 else 8), (D, cfg)
        # 2-byte storage: the same precision rule (tf32x3 spilled 0.8-10 KB there), the model's own tile
        cfg16 = launch.dense_config(10_000, D, 5, torch.bfloat16, gpu)
        assert cfg16.mode == "dot" and cfg16.dot_precision == "ieee", (D, cfg16)
    assert launch.dense_config(10_000, 100, 8, torch.bfloat16, gpu).dot_precision == "tf32x3"
    # the matvec: one accumulator per right-hand side on rows over 128 values up to m = 6 (fp32) / 5
    # (bf16, fp16), the padded FMA dot beyond (matvec_probe- / matvec_small_ab-H100-2026-12-06-s36)
    mv = launch.matvec_config(10_000, 256, 5, torch.float32, gpu)
    assert (mv.mode, mv.block_n, mv.block_d, mv.num_warps, mv.num_programs) == ("small", 64, 32, 4, 157)
    for m, dtype, tile in ((3, torch.float32, (32, 64)), (6, torch.float32, (64, 64)), (3, torch.bfloat16, (32, 64)),
                           (5, torch.float16, (64, 64))):
        mv = launch.matvec_config(10_000, 256, m, dtype, gpu)
        assert (mv.mode, mv.block_n, mv.block_d) == ("small",) + tile, (m, dtype, mv)
    for m, dtype in ((7, torch.float32), (6, torch.bfloat16)):
        mv = launch.matvec_config(10_000, 256, m, dtype, gpu)
        assert (mv.mode, mv.dot_precision) == ("dot", "ieee") and mv.block_n == 64, (m, dtype, mv)
    assert launch.matvec_config(10_000, 100, 3, torch.float32, gpu).mode == "dot"  # tensor cores (tf32x3)
    X = _dense(rng, 40, 200, torch.float32)
    y, v, z = _operands(rng, 40, 200, 6, intercept=True)
    w = fusedml.mmchain(X, y, v, z, 1.0, 0.5, intercept=True, backend="fused")
    assert rel(w, mmchain_reference(X, y, v, z, 1.0, 0.5, intercept=True)) < TOL[torch.float32]
    t = fusedml.matvec(X, y, intercept=True, backend="fused")
    assert rel(t, matvec_reference(X, y, intercept=True)) < TOL[torch.float32]
    X = _dense(rng, 20, 8, torch.float32)
    y, v, _ = _operands(rng, 20, 8, 8)
    with pytest.raises(ValueError, match="dot_precision"):
        fusedml.mmchain(X, y, v, backend="fused", config={"dot_precision": "tf32"})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dense_fused_half_storage(rng, poison, dtype):
    X = _dense(rng, 33, 16, dtype)
    if dtype == torch.bfloat16 and fusedml.interpret_mode():
        probe = fusedml.matvec(X[:1], torch.ones(16), backend="fused")
        if float(probe.abs().sum()) == 0.0 and float(X[:1].float().abs().sum()) > 0:
            pytest.skip("the Triton interpreter loads bf16 as zeros on this build")
    y, v, z = _operands(rng, 33, 16, None)
    w = fusedml.mmchain(X, y, v, z, 1.0, 1.0, backend="fused")
    assert w.dtype == torch.float32
    # the reference sees exactly the stored (rounded) values of X
    assert rel(w, mmchain_reference(X.float(), y, v, z, 1.0, 1.0)) < TOL[dtype]


def test_dense_fused_xty(rng, poison):
    """y=None: w = alpha X^T v + beta z, with vector and matrix v."""
    X = _dense(rng, 29, 11, torch.float32)
    for vshape, intercept in (((29,), False), ((29, 3), True)):
        v = torch.from_numpy(rng.standard_normal(vshape))
        z = torch.from_numpy(rng.standard_normal((11 + intercept,) + vshape[1:]))
        for det in (False, True):
            w = fusedml.mmchain(X, None, v, z, 2.0, 0.5, intercept=intercept, backend="fused", deterministic=det)
            assert rel(w, mmchain_reference(X, None, v, z, 2.0, 0.5, intercept=intercept)) < TOL[torch.float32]


def test_dense_v_vector_broadcasts_over_matrix_y(rng):
    X = _dense(rng, 25, 9, torch.float64)
    y = torch.from_numpy(rng.standard_normal((9, 3)))
    v = torch.from_numpy(rng.random(25))
    ref = mmchain_reference(X, y, v[:, None].expand(25, 3))
    for backend in ("fused", "ops", "cpu"):
        assert rel(fusedml.mmchain(X, y, v, backend=backend), ref) < 1e-12


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("m", [None, 2])
def test_matvec_all_backends(rng, poison, intercept, m):
    X = _dense(rng, 41, 19, torch.float32, "col")
    y, _, _ = _operands(rng, 41, 19, m, intercept=intercept)
    ref = matvec_reference(X, y, intercept=intercept)
    for backend in ("fused", "ops", "cpu"):
        t = fusedml.matvec(X, y, intercept=intercept, backend=backend)
        assert t.shape == ref.shape
        assert rel(t, ref) < TOL[torch.float32], backend
    t = fusedml.matvec(X, y, intercept=intercept, backend="fused", config={"block_d": 4, "mode": "elementwise",
                                                                            "m_pad": 1 if m is None else 2})
    assert rel(t, ref) < TOL[torch.float32]
    # persistent programs: 3 programs walk 11 row tiles; D in chunks and as one chunk
    for cfg in ({"block_n": 4, "num_programs": 3, "block_d": 8}, {"block_n": 4, "num_programs": 3}):
        t = fusedml.matvec(X, y, intercept=intercept, backend="fused", config=cfg)
        assert rel(t, ref) < TOL[torch.float32], cfg


@pytest.mark.parametrize("dtype,layout", [(torch.float32, "row"), (torch.bfloat16, "row"), (torch.float64, "strided"),
                                          (torch.float32, "col")], ids=["fp32", "bf16", "fp64-strided", "fp32-col"])
def test_matvec_small_mode_one_accumulator_per_rhs(rng, poison, dtype, layout):
    """``mode="small"``: one register accumulator per right-hand side (2 <= m <= 8) across the column
    chunks, reduced once per row tile; ragged rows and columns, persistent programs, every m."""
    X = _dense(rng, 45, 37, dtype, layout)
    for m in (2, 3, 5, 8):
        for intercept in (False, True):
            y, _, _ = _operands(rng, 45, 37, m, intercept=intercept)
            ref = matvec_reference(X, y, intercept=intercept)
            for cfg in ({"block_n": 8, "block_d": 16, "num_programs": 3}, {"block_n": 16, "block_d": 64}):
                t = fusedml.matvec(X, y, intercept=intercept, backend="fused", config=dict(cfg, mode="small"))
                assert t.shape == (45, m) and rel(t, ref) < TOL[dtype], (m, intercept, cfg)
    y = torch.from_numpy(rng.standard_normal((37, 9)))
    with pytest.raises(ValueError, match="2 to 8 right-hand sides, got m=9"):
        fusedml.matvec(X, y, backend="fused", config={"mode": "small"})


def test_numpy_inputs_give_torch_and_are_not_modified(rng):
    X = rng.standard_normal((20, 6)).astype(np.float32)
    y, v = rng.standard_normal(6), rng.random(20)
    X0, y0, v0 = X.copy(), y.copy(), v.copy()
    for backend in ("fused", "ops", "cpu", "auto"):
        w = fusedml.mmchain(X, y, v, backend=backend)
        assert isinstance(w, torch.Tensor) and w.device.type == "cpu"
        assert rel(w, mmchain_reference(X, y, v)) < TOL[torch.float32]
    assert np.array_equal(X, X0) and np.array_equal(y, y0) and np.array_equal(v, v0)


# ---------------------------------------------------------------------------------- ops and cpu paths
@pytest.mark.parametrize("backend", ["ops", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["fp32", "fp64", "bf16"])
def test_dense_host_backends(rng, backend, dtype):
    X = _dense(rng, 300, 12, dtype, "col")
    for intercept, m, v_op in ((False, None, "mul"), (True, 3, "softmax"), (True, 2, "mul")):
        y, v, z = _operands(rng, 300, 12, m, intercept=intercept)
        w = fusedml.mmchain(X, y, v, z, 0.9, 0.1, intercept=intercept, v_op=v_op, backend=backend)
        ref = mmchain_reference(X.float() if dtype != torch.float64 else X, y, v, z, 0.9, 0.1,
                                intercept=intercept, v_op=v_op)
        tol = OPS_TOL[dtype] if backend == "ops" else TOL[dtype]
        assert rel(w, ref) < tol, (intercept, m, v_op)


def test_cpu_backend_many_blocks(rng, monkeypatch):
    """Several L2 blocks (dense and CSR) give the same result as one."""
    from fusedml.mmchain import cpu

    monkeypatch.setattr(cpu, "L2_BYTES", 512)
    X = _dense(rng, 200, 10, torch.float64)
    y, v, z = _operands(rng, 200, 10, None, intercept=True)
    ref = mmchain_reference(X, y, v, z, 1.0, 1.0, intercept=True)
    assert rel(fusedml.mmchain(X, y, v, z, 1.0, 1.0, intercept=True, backend="cpu"), ref) < 1e-12
    S = sp.random(200, 10, density=0.3, format="csr", random_state=3)
    ref = mmchain_reference(S, y, v, z, 1.0, 1.0, intercept=True)
    assert rel(fusedml.mmchain(S, y, v, z, 1.0, 1.0, intercept=True, backend="cpu"), ref) < 1e-12


def _csr_inputs(rng):
    """A CSR matrix with empty rows, a long row and unsorted-free structure, as three formats."""
    S = sp.random(60, 25, density=0.15, format="csr", random_state=7, dtype=np.float64)
    S = S.tolil()
    S[5, :] = 0
    S[9, :] = rng.standard_normal(25)  # a dense (long) row
    S = S.tocsr()
    S.sort_indices()
    return S


@pytest.mark.parametrize("fmt", ["scipy", "torch", "CSRMatrix"])
@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
def test_csr_all_backends(rng, fmt, backend):
    S = _csr_inputs(rng)
    if fmt == "scipy":
        X = S
    else:
        T = torch.sparse_csr_tensor(torch.from_numpy(S.indptr.astype(np.int64)),
                                    torch.from_numpy(S.indices.astype(np.int64)),
                                    torch.from_numpy(S.data), S.shape)
        X = T if fmt == "torch" else fusedml.as_csr(T)
    for intercept, m, v_op in ((False, None, "mul"), (True, 3, "softmax"), (True, None, "mul")):
        y, v, z = _operands(rng, 60, 25, m, intercept=intercept)
        w = fusedml.mmchain(X, y, v, z, 0.8, 0.2, intercept=intercept, v_op=v_op, backend=backend)
        ref = mmchain_reference(S, y, v, z, 0.8, 0.2, intercept=intercept, v_op=v_op)
        assert w.dtype == torch.float64
        assert rel(w, ref) < 1e-12, (intercept, m, v_op)
    v = torch.from_numpy(rng.standard_normal(60))
    assert rel(fusedml.mmchain(X, None, v, backend=backend), mmchain_reference(S, None, v)) < 1e-12
    y = torch.from_numpy(rng.standard_normal((26, 2)))
    t = fusedml.matvec(X, y, intercept=True, backend=backend)
    assert rel(t, matvec_reference(S, y, intercept=True)) < 1e-12


def test_csr_fp32_fused_matches_dense_fused(rng):
    """Dense and CSR versions of the same matrix agree (scikit-learn's dense == sparse check)."""
    S = _csr_inputs(rng).astype(np.float32)
    y, v, z = _operands(rng, 60, 25, None)
    w_csr = fusedml.mmchain(S, y, v, z, 1.0, 1.0, backend="fused")
    w_dense = fusedml.mmchain(S.toarray(), y, v, z, 1.0, 1.0, backend="fused")
    assert rel(w_csr, w_dense.double()) < 2e-6


def test_ops_transpose_variants_and_cache(rng):
    S = _csr_inputs(rng)
    T = torch.sparse_csr_tensor(torch.from_numpy(S.indptr), torch.from_numpy(S.indices),
                                torch.from_numpy(S.data), S.shape)
    y, v, _ = _operands(rng, 60, 25, None)
    ref = mmchain_reference(S, y, v)
    ops.clear_transpose_cache()
    w1 = fusedml.mmchain(T, y, v, backend="ops", config={"ops_transpose": "on_the_fly"})
    assert len(ops._CACHE) == 0
    w2 = fusedml.mmchain(T, y, v, backend="ops", config={"ops_transpose": "cached"})
    assert len(ops._CACHE) == 1
    cached = next(iter(ops._CACHE.values()))[-1]
    w3 = fusedml.mmchain(T, y, v, backend="ops")  # the default is "cached": the same transpose object
    assert next(iter(ops._CACHE.values()))[-1] is cached
    for w in (w1, w2, w3):
        assert rel(w, ref) < 1e-12
    del T, cached
    gc.collect()
    assert len(ops._CACHE) == 0  # the entry dies with the matrix


@pytest.mark.parametrize("backend", ["ops", "fused", "cpu"])
def test_csr_caches_follow_in_place_changes(rng, backend):
    """Products follow a matrix changed in place between calls, through a torch sparse tensor's
    accessors or a CSRMatrix's own tensors (ops' cached transpose used to give the old product)."""
    S = _csr_inputs(rng)
    T = torch.sparse_csr_tensor(torch.from_numpy(S.indptr), torch.from_numpy(S.indices),
                                torch.from_numpy(S.data.copy()), S.shape)
    M = fusedml.as_csr(S.copy())
    y, v, _ = _operands(rng, 60, 25, None)
    ops.clear_transpose_cache()
    for X, vals, cols in ((T, T.values, T.col_indices), (M, lambda: M.val, lambda: M.col)):
        fusedml.mmchain(X, y, v, backend=backend)
        vals().mul_(-3.0)
        A = sp.csr_matrix((vals().numpy(), cols().numpy(), S.indptr), shape=S.shape)
        assert rel(fusedml.mmchain(X, y, v, backend=backend), mmchain_reference(A, y, v)) < 1e-12
        c = cols().numpy()  # shift one column index up into a gap: still sorted and unique
        ends = np.zeros(len(c), bool)
        ends[S.indptr[1:][np.diff(S.indptr) > 0] - 1] = True
        nxt = np.where(ends, S.shape[1], np.append(c[1:], S.shape[1]))
        cols()[int(np.flatnonzero(c + 1 < nxt)[0])] += 1
        A = sp.csr_matrix((vals().numpy(), cols().numpy(), S.indptr), shape=S.shape)
        assert A.has_sorted_indices
        assert rel(fusedml.mmchain(X, y, v, backend=backend), mmchain_reference(A, y, v)) < 1e-12
    assert len(ops._CACHE) == (2 if backend == "ops" else 0)


# ------------------------------------------------------------------------------ dispatch and model
def test_auto_backend_is_cpu_for_host_data(rng, monkeypatch):
    from fusedml.mmchain import cpu

    called = []
    real = cpu.mmchain_cpu
    monkeypatch.setattr(cpu, "mmchain_cpu", lambda P: called.append(1) or real(P))
    X = _dense(rng, 10, 3, torch.float32)
    fusedml.mmchain(X, torch.ones(3), backend="auto")
    assert called


@pytest.mark.parametrize("backend", ["fused", "ops", "cpu"])
@pytest.mark.parametrize("form", ["vector", "matrix", "softmax", "csr"])
def test_bind_mmchain_recomputes_from_current_operands(rng, backend, form):
    """A bound product, after its operands change in place, equals mmchain on the new contents;
    on the fused dense path every call writes the same buffer."""
    N, D, m = 300, 7, (None if form in ("vector", "csr") else 3)
    X = torch.from_numpy(rng.standard_normal((N, D)).astype(np.float32))
    if form == "csr":
        X = fusedml.as_csr(sp.random(N, D, density=0.4, format="csr", dtype=np.float32, random_state=1))
    y, v, z = (t.float() for t in _operands(rng, N, D, m, intercept=True))
    kw = dict(alpha=0.7, beta=0.3, intercept=True, v_op="softmax" if form == "softmax" else "mul", backend=backend)
    op = fusedml.bind_mmchain(X, y, v, z, **kw)
    outs = []
    for _ in range(2):
        y.copy_(torch.from_numpy(rng.standard_normal(tuple(y.shape))))
        v.mul_(0.5).add_(0.2)
        z.neg_()
        got = op()
        want = fusedml.mmchain(X, y, v, z, **kw)
        assert got.shape == want.shape and rel(got, want.double()) < 1e-5
        outs.append(got.data_ptr())
    assert op.calls == 2
    if backend == "fused" and form != "csr":
        assert outs[0] == outs[1]


def test_bind_mmchain_bad_inputs(rng):
    X = torch.randn(20, 3)
    with pytest.raises(ValueError, match="bind_mmchain: y must be a torch tensor of torch.float32"):
        fusedml.bind_mmchain(X, torch.zeros(3, dtype=torch.float64), backend="cpu")
    with pytest.raises(ValueError, match="bind_mmchain: v must be"):
        fusedml.bind_mmchain(X, torch.zeros(3), np.ones(20, dtype=np.float32), backend="cpu")
    with pytest.raises(ValueError, match="y must have D = 3 rows"):  # the usual checks, once
        fusedml.bind_mmchain(X, torch.zeros(4), backend="cpu")

    class Streamed:
        def _fusedml_mmchain(self, *a, **k):
            return None
    with pytest.raises(TypeError, match="dense tensor or CSR matrix X"):
        fusedml.bind_mmchain(Streamed(), torch.zeros(3))


def test_duck_typed_delegation():
    class Streamed:
        def _fusedml_mmchain(self, y, v, z, alpha, beta, **kw):
            return ("mmchain", y, v, z, alpha, beta, kw["intercept"], kw["backend"])

        def _fusedml_matvec(self, y, **kw):
            return ("matvec", y, kw["intercept"])

    s = Streamed()
    assert fusedml.mmchain(s, 1, 2, 3, 4.0, 5.0, intercept=True, backend="ops") == ("mmchain", 1, 2, 3, 4.0, 5.0,
                                                                                    True, "ops")
    assert fusedml.matvec(s, 7, intercept=True) == ("matvec", 7, True)


@pytest.mark.parametrize("N,D,m,dtype", [
    (8_000_000, 32, 1, torch.float32), (2_000_000, 128, 1, torch.float32), (500_000, 512, 1, torch.float32),
    (125_000, 2048, 1, torch.float32), (16_384, 16_384, 1, torch.float32), (4_096, 65_536, 1, torch.float32),
    (2_000_000, 128, 4, torch.float32), (2_000_000, 128, 1, torch.bfloat16), (100_000, 1000, 5, torch.float64),
    (2_000_000, 128, 4, torch.bfloat16), (1_000_000, 64, 2, torch.float64), (2_000_000, 128, 8, torch.float32),
    (10, 1, 1, torch.float32), (100_000, 300_000, 1, torch.float32),
])
def test_launch_model_invariants(N, D, m, dtype):
    gpu = launch.H200_PROFILE
    cfg = launch.dense_config(N, D, m, dtype, gpu)
    pow2 = lambda x: x > 0 and x & (x - 1) == 0  # noqa: E731
    assert pow2(cfg.block_n) and pow2(cfg.block_d) and pow2(cfg.m_pad) and cfg.num_warps in (2, 4, 8, 16)
    assert cfg.num_programs % gpu.sm_count == 0 and cfg.num_programs >= gpu.sm_count
    if cfg.strategy == "onchip":
        assert cfg.block_d >= D
    else:
        assert cfg.block_d < D
    if cfg.mode == "dot":
        assert cfg.block_n >= 16 and cfg.block_d >= 16 and cfg.m_pad == 16
    if m == 1:
        assert cfg.mode == "vector"
    elif m <= launch.SMALL_M and D <= 1024:
        assert cfg.mode == "small" and cfg.m_pad >= m and cfg.prefetch
    else:
        assert cfg.mode == ("elementwise" if dtype == torch.float64 else "dot")
    # every program's data (tile + accumulator) fits the register budget
    words = cfg.block_n * cfg.block_d * (cfg.m_pad if cfg.mode == "elementwise" else 1)
    if cfg.mode == "small":
        words += cfg.m_pad * cfg.block_n * cfg.block_d
    elif cfg.strategy == "onchip":
        words += cfg.block_n * cfg.block_d if cfg.mode == "vector" else cfg.m_pad * cfg.block_d
    budget = launch.REG_DATA if cfg.strategy == "onchip" else 2 * launch.REG_DATA  # chunked: no accumulator
    assert words * (2 if dtype == torch.float64 else 1) / (32 * cfg.num_warps) <= budget + 1
    # the reference shapes of PERFORMANCE.md keep a whole row on chip
    if D <= 2048 and m == 1:
        assert cfg.strategy == "onchip"
    if D >= 65_536:
        assert cfg.strategy == ("coop" if m == 1 else "chunked")
    if cfg.strategy == "coop":  # a whole row group is co-resident
        assert -(-D // cfg.block_d) <= cfg.num_programs and cfg.block_n == 1


def test_gpu_info_profile_on_cpu():
    info = launch.gpu_info(torch.device("cpu"))
    assert info == launch.H200_PROFILE and info.sm_count == 132
    cfg = launch.dense_config(1000, 64, 1, torch.float32)
    assert cfg.with_overrides({"block_n": 8, "bogus": 1}).block_n == 8


def test_launch_model_measured_picks():
    """The model reproduces the best configurations of the H200 sweeps (mmchain-H200-2026-12-02-s2; bf16:
    bf16_probe-H200-2026-12-03-s11-f and the 8-warp points of mmchain-H200-*-s12-c, -s17-d, -s31)."""
    gpu = launch.H200_PROFILE
    bf16 = launch.dense_config(2_000_000, 128, 1, torch.bfloat16, gpu)
    assert (bf16.block_n, bf16.block_d, bf16.num_warps, bf16.num_programs) == (64, 128, 16, 264)
    # the product's launch: 2-byte rows of 128-1023 values on half the warps (8), 32-value rows keep 16
    prod = launch.product_config(bf16, 128, torch.bfloat16)
    assert (prod.block_n, prod.num_warps, prod.num_programs) == (64, 8, 264)
    assert [launch.product_config(launch.dense_config(N, D, 1, torch.float16, gpu), D, torch.float16).num_warps
            for N, D in ((8_000_000, 32), (500_000, 512), (125_000, 2048))] == [16, 8, 8]
    assert launch.product_config(launch.dense_config(2_000_000, 128, 1, torch.float32, gpu), 128,
                                 torch.float32).num_warps == 8  # fp32 unchanged
    fp32 = launch.dense_config(2_000_000, 128, 1, torch.float32, gpu)  # unchanged: 94.6 % of the floor
    assert (fp32.block_n, fp32.num_warps, fp32.num_programs, fp32.prefetch) == (16, 8, 528, False)
    dot = launch.dense_config(2_000_000, 128, 8, torch.float32, gpu)  # the dot path: 4 programs per SM
    assert (dot.mode, dot.block_n, dot.num_warps, dot.num_programs) == ("dot", 64, 4, 528)


# ----------------------------------------------------------------------- cooperative wide rows
COOP = [
    # (N, D, dtype, layout, block_d, programs, intercept, det, two_pass)
    (5, 70, torch.float32, "row", 16, 8, True, False, False),  # G = 5, R = 1 (interpreter: two launches)
    (7, 70, torch.float32, "strided", 16, 10, True, True, False),  # R = 2, partial last column block
    (1, 1, torch.float32, "row", 1, 3, False, False, False),  # G = 1: the one-launch (waiting) path
    (9, 33, torch.float64, "col", 64, 4, True, True, False),  # G = 1, R = 4
    (6, 40, torch.float16, "row", 16, 6, False, False, True),  # forced two launches
    (3, 50, torch.float32, "row", 8, 100, True, False, True),  # R capped by N
]


@pytest.mark.parametrize("case", COOP, ids=[f"{c[0]}x{c[1]}-{str(c[2])[6:]}-{c[3]}-bd{c[4]}-P{c[5]}-icpt{c[6]}-det{c[7]}"
                                           f"-2pass{c[8]}" for c in COOP])
@pytest.mark.parametrize("ahead", [0, 1, 2], ids=["ahead1", "ahead2", "ahead3"])
def test_dense_fused_coop(rng, poison, case, ahead):
    """The cooperative wide-row strategy (row split over G column blocks) against float64."""
    N, D, dtype, layout, bd, P, intercept, det, two_pass = case
    X = _dense(rng, N, D, dtype, layout)
    y, v, z = _operands(rng, N, D, None, intercept=intercept)
    cfg = {"strategy": "coop", "block_d": bd, "num_programs": P, "num_warps": 4, "two_pass": two_pass,
           "prefetch": ahead}
    X64 = X.double()
    w = fusedml.mmchain(X, y, v, z, 0.7, 0.3, intercept=intercept, backend="fused", deterministic=det, config=cfg)
    assert rel(w, mmchain_reference(X64, y, v, z, 0.7, 0.3, intercept=intercept)) < TOL[dtype]
    if det:
        assert torch.equal(w, fusedml.mmchain(X, y, v, z, 0.7, 0.3, intercept=intercept, backend="fused",
                                              deterministic=True, config=cfg))
    wx = fusedml.mmchain(X, None, v, z, 1.5, -1.0, intercept=intercept, backend="fused", deterministic=det, config=cfg)
    assert rel(wx, mmchain_reference(X64, None, v, z, 1.5, -1.0, intercept=intercept)) < TOL[dtype]


def test_dense_coop_is_the_model_pick_for_wide_rows(rng, poison):
    """D = 40000 (> one row on chip): the model picks coop; the interpreter runs it in two launches."""
    cfg = launch.dense_config(3, 40_000, 1, torch.float32)
    assert cfg.strategy == "coop" and cfg.block_d == 2048 and cfg.num_warps == 2 and cfg.prefetch == 2
    X = _dense(rng, 3, 40_000, torch.float32)
    y, v, z = _operands(rng, 3, 40_000, None)
    w = fusedml.mmchain(X, y, v, z, 1.0, 1.0, backend="fused")
    assert rel(w, mmchain_reference(X, y, v, z, 1.0, 1.0)) < TOL[torch.float32]


def test_dense_coop_rejects_matrix_y(rng):
    X = _dense(rng, 10, 4, torch.float32)
    y, v, _ = _operands(rng, 10, 4, 2)
    with pytest.raises(ValueError, match="coop"):
        fusedml.mmchain(X, y, v, backend="fused", config={"strategy": "coop", "block_d": 4})


# ----------------------------------------------------------------- small-m and prefetch variants
SMALL = [
    # (N, D, m, dtype, layout, intercept, v_op, det, prefetch, block_n, programs)
    (1, 1, 3, torch.float32, "row", True, "softmax", False, True, 4, 2),
    (37, 5, 4, torch.float32, "strided", False, "mul", True, 2, 8, 3),
    (45, 24, 2, torch.float32, "col", True, "mul", False, False, 16, 1),
    (50, 300, 4, torch.float64, "row", True, "softmax", True, True, 2, 5),
    (33, 16, 3, torch.float16, "row", False, "mul", False, True, 4, 4),
    (20, 7, 1, torch.float32, "row", False, "mul", False, True, 4, 2),
    (29, 40, 5, torch.float32, "row", True, "softmax", True, True, 4, 3),
    (41, 256, 8, torch.float32, "strided", False, "mul", False, False, 2, 4),
    (17, 9, 7, torch.float64, "row", True, "mul", False, True, 8, 2),
    (70, 12, 3, torch.float32, "row", True, "softmax", False, 2, 4, 3),
]


@pytest.mark.parametrize("case", SMALL, ids=[f"{c[0]}x{c[1]}-m{c[2]}-{str(c[3])[6:]}-{c[4]}-icpt{c[5]}-{c[6]}-det{c[7]}-pf{c[8]}"
                                             for c in SMALL])
def test_dense_fused_small_m(rng, poison, case):
    """The unrolled small-m kernel (m <= 8) against float64, forced on odd shapes."""
    N, D, m, dtype, layout, intercept, v_op, det, prefetch, bn, P = case
    X = _dense(rng, N, D, dtype, layout)
    y, v, z = _operands(rng, N, D, m, intercept=intercept)
    cfg = {"strategy": "onchip", "mode": "small", "m_pad": 2 if m <= 2 else (4 if m <= 4 else 8), "block_n": bn,
           "block_d": max(1, 1 << (D - 1).bit_length()), "num_programs": P, "prefetch": prefetch}
    ref = mmchain_reference(X.double() if dtype != torch.float64 else X, y, v, z, 0.7, -0.4, intercept=intercept,
                            v_op=v_op)
    w = fusedml.mmchain(X, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op, backend="fused",
                        deterministic=det, config=cfg)
    assert w.shape == ref.shape
    assert rel(w, ref) < TOL[dtype]
    if det:
        assert torch.equal(w, fusedml.mmchain(X, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op,
                                              backend="fused", deterministic=True, config=cfg))
    # X^T v (y = None) through the same kernel
    wx = fusedml.mmchain(X, None, v, z, 1.5, 0.5, intercept=intercept, backend="fused", config=cfg)
    refx = mmchain_reference(X.double() if dtype != torch.float64 else X, None, v, z, 1.5, 0.5, intercept=intercept)
    assert rel(wx, refx) < TOL[dtype]


@pytest.mark.parametrize("N,D,m,chunk,bn,dtype,layout,v_op,prefetch", [
    (61, 64, 3, 32, 16, torch.float32, "row", "softmax", 2), (45, 100, 4, 32, 8, torch.float32, "row", "mul", 1),
    (33, 40, 5, 16, 4, torch.float32, "strided", "softmax", 0), (50, 128, 2, 64, 8, torch.float16, "row", "mul", 2),
    (29, 24, 8, 8, 4, torch.float64, "row", "mul", 1)])
def test_dense_small_column_chunks(rng, poison, N, D, m, chunk, bn, dtype, layout, v_op, prefetch):
    """``chunk``: the unrolled kernel's tile as [block_n, block_d / chunk, chunk] (a thread holds
    pieces of its row from every chunk): the same product, X^T V and loss pass as float64, with and
    without the intercept, deterministic bit-repeatable; a bad chunk is a clear error."""
    X = _dense(rng, N, D, dtype, layout)
    bd = 1 << (D - 1).bit_length()
    cfg = {"mode": "small", "m_pad": 2 if m <= 2 else (4 if m <= 4 else 8), "block_n": bn, "num_programs": 3,
           "prefetch": prefetch, "chunk": chunk, "block_d": bd, "strategy": "onchip"}
    X64 = X.double() if dtype != torch.float64 else X
    for intercept in (False, True):
        y, v, z = _operands(rng, N, D, m, intercept=intercept)
        ref = mmchain_reference(X64, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op)
        w = fusedml.mmchain(X, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op, backend="fused", config=cfg)
        assert rel(w, ref) < TOL[dtype], intercept
        wd = fusedml.mmchain(X, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op, backend="fused", config=cfg,
                             deterministic=True)
        assert rel(wd, ref) < TOL[dtype] and torch.equal(wd, fusedml.mmchain(
            X, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op, backend="fused", config=cfg, deterministic=True))
        wx = fusedml.mmchain(X, None, v, z, 1.5, 0.5, intercept=intercept, backend="fused", config=cfg)
        assert rel(wx, mmchain_reference(X64, None, v, z, 1.5, 0.5, intercept=intercept)) < TOL[dtype]
    if dtype == torch.float32:  # the loss pass's epilogue on the chunked tile
        Y = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, m, N)), m).float()
        W = 0.3 * torch.as_tensor(rng.standard_normal((D + 1, m)), dtype=torch.float32)
        r = fusedml.loss_gradient(X, W, Y, loss="multinomial", intercept=True, backend="fused", config=cfg)
        ref = fusedml.loss_gradient(X64, W.double(), Y.double(), loss="multinomial", intercept=True, backend="cpu")
        assert rel(r.grad, ref.grad) < TOL[dtype] and rel(r.loss, ref.loss) < 1e-5 and rel(r.hess, ref.hess) < 1e-5
    y, v, _ = _operands(rng, N, D, m)
    for bad in (bd * 2, 3, 2):
        with pytest.raises(ValueError, match="chunk"):
            fusedml.mmchain(X, y, v, backend="fused", config=dict(cfg, chunk=bad))
    with pytest.raises(ValueError, match="chunk"):  # the vector kernel (m = 1) has no chunks
        fusedml.mmchain(X, y[:, 0], None, backend="fused", config={"chunk": 32})
    if dtype == torch.float32 and D == 64 and v_op == "softmax":  # the model chunks this product (m <= 5);
        # another mode on request drops the chunks
        ref = mmchain_reference(X64, y, v, None, 1.0, 0.0, v_op=v_op)
        w = fusedml.mmchain(X, y, v, v_op=v_op, backend="fused", config={"mode": "dot", "m_pad": 16, "block_n": 16})
        assert rel(w, ref) < TOL[dtype]


def _record_small_launches(monkeypatch, *keys):
    """Launches of the unrolled kernel from now on, as the value of ``keys`` (one key) or a tuple."""
    launched = []
    real = dense_mod._mmchain_small_kernel

    def record(grid):
        def run(*a, **k):
            launched.append(k[keys[0]] if len(keys) == 1 else tuple(k[key] for key in keys))
            return real[grid](*a, **k)
        return run

    monkeypatch.setattr(dense_mod, "_mmchain_small_kernel", type("K", (), {"__getitem__": lambda self, g: record(g)})())
    return launched


@pytest.mark.parametrize("D,m,form,ept,warps,chunk", [
    (64, 3, "softmax", 16, 4, 16), (100, 3, "softmax", 8, 8, None), (100, 5, "softmax", 16, 4, 32),
    (64, 5, "softmax", 16, 4, 16), (64, 3, "loss", 8, 4, 32), (100, 3, "loss", 16, 4, 32), (100, 5, "loss", 8, 8, 64),
    (64, 6, "loss", 4, 8, None), (200, 3, "loss", 8, 4, 128), (64, 3, "mul", 8, 8, None)])
def test_column_chunk_picks(rng, D, m, form, ept, warps, chunk):
    """The model's column-chunked launches (chunk_probe-H200-2026-12-04-s18-e): fp32, m <= 5, the
    loss pass and the softmax product on 64 / 128-value rows (256: hessian_probe-*-s37); float64 never
    chunks."""
    from fusedml.mmchain._checks import prepare_mmchain

    for dtype in (torch.float32, torch.float64):
        X = _dense(rng, 50, D, dtype)
        y, v, _ = _operands(rng, 50, D, m, intercept=True)
        P = prepare_mmchain(X, y, v, None, 1.0, 0.0, intercept=True, v_op="mul" if form == "loss" else form,
                            check_finite=False)
        cfg = dense_mod._config(P, None, loss=form == "loss")
        if dtype == torch.float64:
            assert cfg.chunk is None
            continue
        assert cfg.mode == "small" and cfg.chunk == chunk and cfg.num_warps == warps, cfg
        assert cfg.block_n * cfg.block_d // (32 * warps) == ept, cfg
        # the model's launch itself against float64
        if form == "loss":
            Y = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, m, 50)), m).float()
            r = fusedml.loss_gradient(X, 0.3 * y, Y, loss="multinomial", intercept=True, backend="fused")
            ref = fusedml.loss_gradient(X.double(), 0.3 * y.double(), Y.double(), loss="multinomial", intercept=True,
                                        backend="cpu")
            assert rel(r.grad, ref.grad) < TOL[dtype] and rel(r.hess, ref.hess) < 1e-5
        else:
            w = fusedml.mmchain(X, y, v, intercept=True, v_op=form, backend="fused")
            assert rel(w, mmchain_reference(X.double(), y, v, None, 1.0, 0.0, intercept=True, v_op=form)) < TOL[dtype]


def test_dense_fused_small_is_the_default_for_m4(rng, poison, monkeypatch):
    """The model's pick for m = 4 on short rows runs the small kernel (and no other)."""
    launched = _record_small_launches(monkeypatch, "M_PAD")
    X = _dense(rng, 70, 33, torch.float32)
    y, v, z = _operands(rng, 70, 33, 4)
    w = fusedml.mmchain(X, y, v, z, 1.0, 1.0, backend="fused")
    assert launched == [4]
    assert rel(w, mmchain_reference(X, y, v, z, 1.0, 1.0)) < TOL[torch.float32]


@pytest.mark.parametrize("N,D,bn,P", [(1, 1, 4, 3), (61, 13, 4, 3), (100, 64, 8, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_dense_fused_prefetch_vector(rng, poison, N, D, bn, P, dtype):
    """Register double buffering (the next tile loaded before this one computes), m = 1."""
    X = _dense(rng, N, D, dtype, "strided")
    y, v, z = _operands(rng, N, D, None, intercept=True)
    cfg = {"prefetch": True, "block_n": bn, "num_programs": P}
    for det in (False, True):
        w = fusedml.mmchain(X, y, v, z, 0.5, 2.0, intercept=True, backend="fused", deterministic=det, config=cfg)
        assert rel(w, mmchain_reference(X.double(), y, v, z, 0.5, 2.0, intercept=True)) < TOL[dtype]


@pytest.mark.parametrize("m,v_op", [(5, "mul"), (16, "softmax")])
def test_dense_fused_dot_mode(rng, poison, m, v_op):
    """m > 4: the padded ieee tl.dot path (m = 16 fills the pad exactly)."""
    X = _dense(rng, 40, 70, torch.float32)
    y, v, z = _operands(rng, 40, 70, m, intercept=True)
    cfg = launch.dense_config(40, 70, m, torch.float32)
    assert cfg.mode == "dot"
    w = fusedml.mmchain(X, y, v, z, 1.0, 0.5, intercept=True, v_op=v_op, backend="fused")
    assert rel(w, mmchain_reference(X, y, v, z, 1.0, 0.5, intercept=True, v_op=v_op)) < TOL[torch.float32]


@pytest.mark.parametrize("m", [5, 8])
def test_dense_softmax_and_loss_m5_8_default_to_unrolled(rng, poison, monkeypatch, m):
    """launch.unrolled_wide_m (m3_probe-H200-2026-12-04-s18-a): the multinomial Hessian product
    with m = 5..8 on rows of <= 128 values, the loss pass and the plain product (padded to 8) on
    rows of <= 64 run the unrolled
    kernel with m exactly (softmax: 4 warps x 8 values for m <= 6, else 8 x 4, also on rows of 256
    values for m <= 6; the loss pass the other way round); wider rows, the plain product and fp64
    keep their launches; each result against float64."""
    from fusedml.mmchain._checks import prepare_mmchain

    launched = _record_small_launches(monkeypatch, "M_PAD", "LOSS", "num_warps")
    for D, warps in ((20, 4 if m <= 6 else 8), (100, 4 if m <= 6 else 8)):
        X = _dense(rng, 70, D, torch.float32)
        y, v, z = _operands(rng, 70, D, m, intercept=True)
        w = fusedml.mmchain(X, y, v, z, 1.0, 0.5, intercept=True, v_op="softmax", backend="fused")
        assert rel(w, mmchain_reference(X, y, v, z, 1.0, 0.5, intercept=True, v_op="softmax")) < TOL[torch.float32]
        assert launched.pop() == (m, 0, warps)
        P = prepare_mmchain(X, y, v, z, 1.0, 0.5, intercept=True, v_op="softmax", check_finite=False)
        cfg = dense_mod._config(P, None)
        chunked = m == 5 and D == 100  # fp32 m = 5 on 128-value rows: chunks of 32, 16 values per thread
        assert cfg.block_n * cfg.block_d // (32 * cfg.num_warps) == (16 if chunked else 8 if m <= 6 else 4)
        assert cfg.prefetch == 2 and cfg.chunk == (32 if chunked else None)
    assert launch.unrolled_wide_m(128, m, torch.float32, "softmax")
    assert launch.unrolled_wide_m(256, m, torch.float32, "softmax") == (m <= 6)
    assert launch.unrolled_wide_m(257, m, torch.float32, "softmax") == (m == 5)  # chunked on 512 (s37h)
    assert not launch.unrolled_wide_m(513, m, torch.float32, "softmax")
    assert not launch.unrolled_wide_m(100, m, torch.float64, "softmax")
    assert launch.unrolled_wide_m(100, m, torch.float32, "loss") == (m == 5)  # m = 5: the chunked launch
    assert launch.unrolled_wide_m(64, m, torch.float32, "loss") and not launch.unrolled_wide_m(64, 9, torch.float32,
                                                                                               "loss")
    # the plain product: unrolled with m padded to 8 on rows of <= 64 values, the padded tl.dot on longer ones
    for D, pad in ((20, 8), (100, None)):
        X = _dense(rng, 70, D, torch.float32)
        y, v, z = _operands(rng, 70, D, m, intercept=True)
        w = fusedml.mmchain(X, y, v, z, 1.0, 0.5, intercept=True, backend="fused")
        assert launched == ([] if pad is None else [(pad, 0, 4)]), (D, launched)
        assert rel(w, mmchain_reference(X, y, v, z, 1.0, 0.5, intercept=True)) < TOL[torch.float32]
        launched.clear()
    X = _dense(rng, 70, 20, torch.float32)
    # the loss pass: unrolled on 64-value rows
    labels = torch.as_tensor(rng.integers(0, m, 70))
    Y = torch.nn.functional.one_hot(labels, m).float()
    W = 0.3 * torch.as_tensor(rng.standard_normal((21, m)), dtype=torch.float32)
    r = fusedml.loss_gradient(X, W, Y, loss="multinomial", intercept=True, backend="fused")
    ref = fusedml.loss_gradient(X.double(), W.double(), Y.double(), loss="multinomial", intercept=True, backend="cpu")
    assert launched == [(m, 3, 8 if m <= 6 else 4)]
    assert rel(r.grad, ref.grad) < TOL[torch.float32] and rel(r.loss, ref.loss) < 1e-5


def test_dense_small_mode_rejects_large_m(rng):
    X = _dense(rng, 10, 4, torch.float32)
    y, v, _ = _operands(rng, 10, 4, 5)
    with pytest.raises(ValueError, match="mode='small'"):
        fusedml.mmchain(X, y, v, backend="fused", config={"mode": "small", "m_pad": 4})
    y, v, _ = _operands(rng, 10, 4, 9)
    with pytest.raises(ValueError, match="mode='small'"):
        fusedml.mmchain(X, y, v, backend="fused", config={"mode": "small", "m_pad": 8})


# ------------------------------------------------------------------------------------------------
# Rows that are not whole 16-byte vectors: fusedml.aligned_rows's view of padded rows is read in
# whole vectors (dense._vec negative), the padding zeroed after the load.
# ------------------------------------------------------------------------------------------------
def _poisoned_view(X):
    """fusedml.aligned_rows(X) with its padding columns set to NaN (a view's padding is anything)."""
    A = fusedml.aligned_rows(X)
    assert A is not X and A.shape == X.shape and torch.equal(A, X)
    A.as_strided((A.shape[0], A.stride(0)), (A.stride(0), 1))[:, X.shape[1]:] = float("nan")
    return A


def test_aligned_rows_copies_only_unaligned_rows():
    """aligned_rows copies only 2-D row-major rows that are not whole vectors, within max_bytes; _vec
    claims the padded read only where the storage holds it, even for the last row."""
    X = torch.randn(10, 55)
    A = fusedml.aligned_rows(X)
    assert A.stride() == (56, 1) and torch.equal(A, X) and dense_mod._vec(A, 55) == -4 and dense_mod._vec(X, 55) == 1
    assert fusedml.aligned_rows(A) is A  # already aligned
    assert fusedml.aligned_rows(X, max_bytes=10 * 56 * 4 - 1) is X  # no room for the copy
    for Y in (torch.randn(10, 56), torch.randn(10, 4), torch.randn(55, 10).T, torch.randn(10, 3, 2)):
        assert fusedml.aligned_rows(Y) is Y
    assert fusedml.aligned_rows(torch.randn(10, 137).bfloat16()).stride() == (144, 1)
    # a view whose last row's padding lies past its storage keeps scalar loads
    tight = torch.randn(9 * 56 + 55).as_strided((10, 55), (56, 1))
    assert dense_mod._vec(tight, 55) == 1
    assert dense_mod._vec(torch.randn(10 * 56).as_strided((10, 55), (56, 1)), 55) == -4


def test_padded_width_align_mode_and_pads_rows(monkeypatch):
    """The padded row length (whole 16-byte vectors), ``FUSEDML_ALIGN_ROWS`` (auto / 1 / 0, anything
    else an error) and the rule for matrices kept on a device: auto pads rows over 64 bytes on CUDA
    devices only, 1 any row on any device, 0 never; rows over 64 KB never; True / False decide."""
    assert [dense_mod.padded_width(d, 4) for d in (1, 4, 5, 55, 56)] == [1, 4, 8, 56, 56]
    assert dense_mod.padded_width(137, 2) == 144 and dense_mod.padded_width(3, 8) == 4
    monkeypatch.delenv("FUSEDML_ALIGN_ROWS", raising=False)
    assert dense_mod.align_mode() == "auto"
    assert dense_mod.pads_rows("cuda:0", 220) and not dense_mod.pads_rows("cpu", 220)
    assert not dense_mod.pads_rows("cuda", (64 << 10) + 4)
    assert not dense_mod.pads_rows("cuda", 52) and not dense_mod.pads_rows("cuda", 64) and dense_mod.pads_rows("cuda", 68)
    assert dense_mod.pads_rows("cpu", 220, True) and not dense_mod.pads_rows("cuda", 220, False)
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "1")
    assert dense_mod.pads_rows("cpu", 220) and not dense_mod.pads_rows("cpu", (64 << 10) + 4)
    assert dense_mod.pads_rows("cpu", 52)
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "0")
    assert not dense_mod.pads_rows("cuda", 220)
    monkeypatch.setenv("FUSEDML_ALIGN_ROWS", "yes")
    with pytest.raises(ValueError, match="FUSEDML_ALIGN_ROWS must be auto, 0 or 1"):
        dense_mod.align_mode()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.float16])
@pytest.mark.parametrize("N,D,stride", [(1, 9, 9), (37, 55, 55), (1000, 101, 103), (3, 137, 137), (2, 2049, 2049),
                                      (2, 8193, 8195)])
def test_aligned_rows_copy_kernel(dtype, N, D, stride):
    """The padded copy (the one-pass kernel up to 8192 padded values per row, torch's copies past
    it): X's values, zeros in every row's padding (the copy's memory poisoned first), from
    contiguous X and from a view with a wider row stride; X unchanged."""
    base = torch.randn(N, stride).to(dtype)
    X = base[:, :D]
    before = base.clone()
    v = 16 // X.element_size()
    Dp = -(-D // v) * v
    real_empty = torch.empty
    with patch.object(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan"))):
        A = fusedml.aligned_rows(X)
    assert A.shape == X.shape and A.stride() == (Dp, 1) and torch.equal(A, X) and torch.equal(base, before)
    full = A.as_strided((N, Dp), (Dp, 1))
    assert bool((full[:, D:] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("N,D", [(70, 9), (33, 55)])
def test_dense_aligned_rows_view_matches(rng, poison, dtype, N, D):
    """Every dense pass (m = 1 and 3, chunked tiles, the chunked strategy, matvec, both loss passes)
    reads an aligned view whose padding holds NaN and returns X's result, finite."""
    X = _dense(rng, N, D, dtype)
    A = _poisoned_view(X)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    y, v, _ = _operands(rng, N, D, None, intercept=True)
    Y, V, _ = _operands(rng, N, D, 3, intercept=True)
    y, v, Y, V = (t.to(acc) for t in (y, v, Y, V))
    lbl = (v > 0.5).to(acc)
    onehot = torch.nn.functional.one_hot(torch.arange(N) % 3, 3).to(acc)
    calls = [
        lambda M: fusedml.mmchain(M, y, v, intercept=True, backend="fused"),
        lambda M: fusedml.mmchain(M, Y, V, intercept=True, backend="fused"),
        lambda M: fusedml.mmchain(M, Y, V, intercept=True, backend="fused", config={"mode": "small", "chunk": 4}),
        lambda M: fusedml.mmchain(M, y, v, intercept=True, backend="fused",
                                  config={"strategy": "chunked", "block_d": 4, "block_n": 8}),
        lambda M: fusedml.matvec(M, y, intercept=True, backend="fused"),
        lambda M: fusedml.matvec(M, Y, intercept=True, backend="fused"),
        lambda M: fusedml.loss_gradient(M, y, lbl, loss="logistic", intercept=True, backend="fused").grad,
        lambda M: fusedml.loss_gradient(M, Y, onehot, loss="multinomial", intercept=True, backend="fused").grad,
    ]
    for i, f in enumerate(calls):
        want, got = f(X), f(A)
        assert torch.isfinite(got).all() and rel(got, want.double()) < 1e-6, (i, rel(got, want.double()))


# ------------------------------------------------------------------------------------------------
# Ahead-of-time compilation for the H200 (sm_90) without a GPU (as in test_mmchain_csr.py): the new
# dense variants compile, do not spill, and load X with 16-byte vector loads.
# ------------------------------------------------------------------------------------------------
def _aot_dense_variants():
    import re

    import triton
    import triton.language as tl
    from _sm90 import local_memory_in_loops, resource_usage, sass
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)

    def build(fn, xdt, acc, consts, warps, aligned=True):
        ints = {"N", "D", "M", "G", "R", "n_tiles", "stride_xn", "stride_yd", "stride_vn", "stride_ym", "stride_vm"}
        sig, attrs = {}, {}
        for i, a in enumerate(fn.arg_names):
            if a in consts:
                sig[a] = "constexpr"
                continue
            sig[a] = f"*{xdt}" if a == "X" else ("i32" if a in ints else (
                "fp32" if a.startswith(("alpha", "power")) else ("*i32" if a == "ERR" else ("*i64" if a == "TP" else (
                    "*fp64" if a == "LPART" else f"*{acc}")))))
            if sig[a].startswith("*") or (aligned and a in ("stride_xn", "stride_yd", "stride_vn", "D")):
                attrs[(i,)] = [["tt.divisibility", 16]]  # what the launcher specialises for aligned X
        return triton.compile(ASTSource(fn, sig, consts, attrs), target=target, options=dict(num_warps=warps))

    onchip = dict(LOSS=0, HAS_C=False, STORE_ETA=False)
    base = dict(stride_xd=1, XTY=False, HAS_V=True, SOFTMAX=False, INTERCEPT=False, DETERMINISTIC=False,
                EVEN_D=True, VEC=4, ACC=tl.float32, PREFETCH=True, **onchip)
    variants = [
        ("small m4 fp32 16x128", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=16, BLOCK_D=128, M_PAD=4), 8),
        ("small m4 bf16 32x128 softmax intercept", dense_mod._mmchain_small_kernel, "bf16", "fp32",
         dict(MODE=3, BLOCK_N=32, BLOCK_D=128, M_PAD=4, SOFTMAX=True, INTERCEPT=True), 16),
        ("small m2 fp64 2x1024 det", dense_mod._mmchain_small_kernel, "fp64", "fp64",
         dict(MODE=3, BLOCK_N=2, BLOCK_D=1024, M_PAD=2, ACC=tl.float64, DETERMINISTIC=True), 8),
        ("onchip m1 bf16 32x128 prefetch", dense_mod._mmchain_onchip_kernel, "bf16", "fp32",
         dict(onchip, VEC=8, MODE=0, BLOCK_N=32, BLOCK_D=128, M_PAD=1, stride_vm=0), 16),
        ("onchip m1 bf16 64x128 prefetch (the model's)", dense_mod._mmchain_onchip_kernel, "bf16", "fp32",
         dict(onchip, VEC=8, MODE=0, BLOCK_N=64, BLOCK_D=128, M_PAD=1, stride_vm=0), 16),
    ]
    # the multinomial passes in the unrolled kernel, m = 3 unrolled exactly (the solvers' launch: 8
    # values per thread, 8 warps): the loss pass and the softmax Hessian product
    variants += [
        ("small m3 fp32 D=100 multinomial loss intercept", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=16, BLOCK_D=128, M_PAD=3, LOSS=3, INTERCEPT=True, EVEN_D=False), 8, False),
        ("small m3 fp32 D=64 multinomial loss intercept eta", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=32, BLOCK_D=64, M_PAD=3, LOSS=3, INTERCEPT=True, STORE_ETA=True, HAS_C=True), 8),
        ("small m3 fp32 D=64 softmax intercept", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=32, BLOCK_D=64, M_PAD=3, SOFTMAX=True, INTERCEPT=True), 8),
        # m = 5 on request (config={"mode": "small", "m_pad": 8}): 4 values per thread, two tiles ahead
        ("small m5 fp32 D=64 multinomial loss intercept", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=16, BLOCK_D=64, M_PAD=5, LOSS=3, INTERCEPT=True, PREFETCH=2), 8),
        # column-chunked tiles (DenseConfig.chunk), the model's session-18 launches: the fullest ones
        # (ptxas with Triton 3.6: 246-255 registers) must not spill
        ("small m5 fp32 D=100 chunk 64 multinomial loss intercept", dense_mod._mmchain_small_kernel, "fp32",
         "fp32", dict(MODE=3, BLOCK_N=16, BLOCK_D=128, M_PAD=5, LOSS=3, INTERCEPT=True, EVEN_D=False, PREFETCH=2,
                      CHUNK=64), 8, False),
        ("small m5 fp32 D=64 chunk 16 softmax intercept", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=32, BLOCK_D=64, M_PAD=5, SOFTMAX=True, INTERCEPT=True, PREFETCH=2, CHUNK=16), 4),
        ("small m4 fp32 D=128 chunk 64 plain", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=16, BLOCK_D=128, M_PAD=4, PREFETCH=1, CHUNK=64), 8),
    ]
    # rows of 100 fp32 values (stride and D not multiples of 16: only VEC tells the compiler that
    # 16-byte loads are aligned), with the fused logistic loss and sample weights, and the
    # multinomial loss through the padded tl.dot
    variants += [
        ("onchip m1 fp32 D=100 logistic loss", dense_mod._mmchain_onchip_kernel, "fp32", "fp32",
         dict(base, LOSS=1, HAS_C=True, STORE_ETA=False, EVEN_D=False, INTERCEPT=True, PREFETCH=False, MODE=0, BLOCK_N=16,
              BLOCK_D=128, M_PAD=1, stride_vm=0), 8, False),
        ("onchip m3 fp32 multinomial loss dot", dense_mod._mmchain_onchip_kernel, "fp32", "fp32",
         dict(base, LOSS=3, HAS_C=False, STORE_ETA=True, EVEN_D=False, INTERCEPT=True, PREFETCH=False, MODE=1, BLOCK_N=16,
              BLOCK_D=128, M_PAD=16), 8, False),
        ("onchip m3 fp32 multinomial loss dot tf32x3 64x4 (spills)", dense_mod._mmchain_onchip_kernel, "fp32",
         "fp32", dict(base, LOSS=3, HAS_C=False, STORE_ETA=True, EVEN_D=False, INTERCEPT=True, PREFETCH=False,
                      MODE=4, BLOCK_N=64, BLOCK_D=128, M_PAD=16), 4, False),
        ("onchip m3 fp32 multinomial loss dot tf32x3 16x4", dense_mod._mmchain_onchip_kernel, "fp32", "fp32",
         dict(base, LOSS=3, HAS_C=False, STORE_ETA=True, EVEN_D=False, INTERCEPT=True, PREFETCH=False, MODE=4,
              BLOCK_N=16, BLOCK_D=128, M_PAD=16), 4, False),
        ("onchip m4 fp32 softmax dot tf32x3", dense_mod._mmchain_onchip_kernel, "fp32", "fp32",
         dict(base, **onchip, SOFTMAX=True, INTERCEPT=True, PREFETCH=False, MODE=4, BLOCK_N=16, BLOCK_D=128,
              M_PAD=16), 4),
    ]
    # rows that are not whole vectors, read from an aligned view of padded rows (VEC < -1: the stride
    # and D unaligned as the launcher sees them; every load still a 16-byte vector)
    variants += [
        ("onchip m1 fp32 D=55 padded rows logistic loss", dense_mod._mmchain_onchip_kernel, "fp32", "fp32",
         dict(base, LOSS=1, HAS_C=True, STORE_ETA=False, EVEN_D=False, VEC=-4, INTERCEPT=True, MODE=0, BLOCK_N=32,
              BLOCK_D=64, M_PAD=1, stride_vm=0), 8, False),
        ("onchip m1 bf16 D=137 padded rows", dense_mod._mmchain_onchip_kernel, "bf16", "fp32",
         dict(base, EVEN_D=False, VEC=-8, MODE=0, BLOCK_N=32, BLOCK_D=256, M_PAD=1, stride_vm=0), 8, False),
        ("small m3 fp32 D=55 padded rows multinomial loss intercept", dense_mod._mmchain_small_kernel, "fp32",
         "fp32", dict(MODE=3, BLOCK_N=16, BLOCK_D=64, M_PAD=3, LOSS=3, INTERCEPT=True, EVEN_D=False, VEC=-4), 8,
         False),
        ("small m3 fp32 D=55 chunk 16 padded rows", dense_mod._mmchain_small_kernel, "fp32", "fp32",
         dict(MODE=3, BLOCK_N=32, BLOCK_D=64, M_PAD=3, EVEN_D=False, VEC=-4, PREFETCH=2, CHUNK=16), 4, False),
    ]
    coop = dict(stride_xd=1, XTY=False, HAS_V=True, INTERCEPT=True, DETERMINISTIC=False, EVEN_D=True,
                ACC=tl.float32, BLOCK_D=2048, G_PAD=32, PHASE=0, MAX_SPIN=1 << 20, AHEAD=3, WORDS=1)
    variants += [
        ("coop fp32 2048 one launch (the model's)", dense_mod._mmchain_coop_kernel, "fp32", "fp32", coop, 2),
        ("coop bf16 2048 det", dense_mod._mmchain_coop_kernel, "bf16", "fp32", dict(coop, DETERMINISTIC=True), 2),
        ("coop fp32 4096 two rows ahead", dense_mod._mmchain_coop_kernel, "fp32", "fp32",
         dict(coop, BLOCK_D=4096, G_PAD=16, AHEAD=2), 8),
        ("coop fp64 2048 one row ahead", dense_mod._mmchain_coop_kernel, "fp64", "fp64",
         dict(coop, ACC=tl.float64, BLOCK_D=2048, AHEAD=1, WORDS=2), 8),
        ("coop fp64 512 four rows", dense_mod._mmchain_coop_kernel, "fp64", "fp64",
         dict(coop, ACC=tl.float64, BLOCK_D=512, G_PAD=128, WORDS=2), 2),
    ]
    for name, fn, xdt, acc, over, warps, *aligned in variants:
        if fn is dense_mod._mmchain_small_kernel:
            over = dict(over, CHUNK=over.get("CHUNK", over["BLOCK_D"]))  # one chunk: the 2-D tile
        k = build(fn, xdt, acc, over if fn is dense_mod._mmchain_coop_kernel else dict(base, **over), warps, *aligned)
        regs, stack = resource_usage(k)
        vec = re.search(r"ld\.global(\.[\w:]+)*\.v[24]\.b(32|64)", k.asm["ptx"]) is not None
        mma = re.search(r"\b(mma|wgmma)\S*\.tf32", k.asm["ptx"]) is not None
        print(f"AOT {name}: regs={regs} stack={stack} vector_loads={vec} tf32_mma={mma}")
        assert mma == ("tf32x3" in name), f"{name}: tensor-core tf32 MMAs {'missing' if not mma else 'unexpected'}"
        # the loss pass's launch (launch.padded_dot) spills ~0.7 KB on sm_90 and was still the
        # fastest point of the H200 sweep (solver_ops-H200-2026-12-03-s7-a): bounded, not zero.
        # The cooperative kernel sits at ~250 registers: Triton 3.6-3.8 save a few words around
        # its row loop (3.6: 32 B for fp32; 3.8: 24 B for bf16), never inside a loop
        if "(spills)" in name:
            assert stack <= 1024, f"{name}: register spills (stack {stack} B)"
        elif fn is dense_mod._mmchain_coop_kernel:
            assert stack <= 64 and local_memory_in_loops(sass(k)) == 0, f"{name}: spills in its loops ({stack} B)"
        else:
            assert stack == 0, f"{name}: register spills (stack {stack} B)"
        # the padded tl.dot's operand layout loads X 4 bytes at a time (a known cost of that mode)
        assert vec or "dot" in name, f"{name}: X is not loaded with vector loads"
        if "chunk" in name:  # the chunk axis of the 3-D tile lies within a thread (dense._CHUNK_OUTER
            # follows Triton's axis order; a new Triton that orders them otherwise fails here)
            ax = 0 if dense_mod._CHUNK_OUTER else 1
            lay = [tuple(int(v) for v in re.search(rf"{f} = \[(\d+), (\d+), (\d+)\]", ln).groups())
                   for ln in k.asm["ttgir"].splitlines() if "#ttg.blocked<{sizePerThread = [1, 1, 4]" in ln
                   for f in ("threadsPerWarp", "warpsPerCTA")]
            assert lay and all(t[ax] == 1 for t in lay), f"{name}: the chunk axis spans threads or warps: {lay}"
        if fn is dense_mod._mmchain_coop_kernel:  # the row handshake: tagged 64-bit words polled from L2
            ptx = k.asm["ptx"]
            assert re.search(r"ld\.volatile\.global(\.\w+)*\.b64", ptx) and "st.global.b64" in ptx, name
            assert not re.search(r"\.(release|acquire|acq_rel)\b|membar|fence", ptx), name
            # X's rows (read once) go out evict-first in L1 and L2 (dense._X_EVICT)
            assert dense_mod._X_EVICTION != "evict_first" or re.search(
                r"ld\.global\.L1::evict_first\.L2::cache_hint(\.\w+)*\.v[24]", ptx), name


# ------------------------------------------------------------------ the dense probes of benchmarks/
def test_strips_probe_smoke(tmp_path):
    """benchmarks/strips_probe.py: the 2-strip m = 4 kernel against float64, end to end (JSON written)."""
    from _bench import bench_module

    mod = bench_module("strips_probe")
    X = torch.randn(70, 64, generator=torch.Generator().manual_seed(3))
    Y, V = torch.randn(64, 4), torch.rand(70, 4)
    for chunks, bn in ((2, 4), (4, 8)):
        w = mod.strips_mmchain(X, Y, V, block_n=bn, chunks=chunks, warps=2, programs=3, prefetch=chunks == 2)
        assert rel(w, mmchain_reference(X.double(), Y, V, None, 1.0, 0.0)) < TOL[torch.float32]
    rows = mod.main(["--out", str(tmp_path / "s.json")])
    assert len(rows) == 3 and max(r["rel_err"] for r in rows) < TOL[torch.float32]
    assert (tmp_path / "s.json").exists()


def test_mmchain_mma_probe_smoke(tmp_path):
    """benchmarks/mmchain_mma_probe.py (the matrix-y product with X Y on emulated tensor-core fragments,
    not kept): its launches against float64, its diagnostic variants and its limits."""
    from _bench import bench_module

    mod = bench_module("mmchain_mma_probe")
    rows = mod.main(["--check-shapes", "256x16x1,128x32x3", "--shapes", "128x32x4", "--seed", "2",
                     "--out", str(tmp_path / "m.json")])
    assert all(r["ok"] for r in rows if r.get("case") == "check") and (tmp_path / "m.json").exists()
    timed = [r for r in rows if r.get("case") is None]
    assert {r["variant"] for r in timed} >= {"library (fused)", "mma WN 4 P 2/SM chains 2", "mma WN 4 P 2/SM (X Y only)", "mma WN 4 P 2/SM chains 2 acc 2 stages 2"}
    assert all(r["err"] < TOL[torch.float32] for r in timed if r.get("err") is not None)
    with pytest.raises(ValueError, match="prototype limits"):
        mod.run(torch.randn(64, 24), torch.randn(24, 2), torch.rand(64, 2))


def test_launch_probe_smoke(monkeypatch):
    """benchmarks/launch_probe.py: the small-m, tiles, grid, softmax and dot probes on tiny shapes, every
    point checked."""
    from _bench import bench_module

    mod = bench_module("launch_probe")

    def once(fn, **kw):  # one call per point instead of a warm-up and a timed call: only the checks matter
        fn()
        return 1.0

    monkeypatch.setattr(mod, "bench_ms", once)
    monkeypatch.setattr(mod, "SMALL_SHAPES", ((40, 128, 4), (30, 256, 3)))
    monkeypatch.setattr(mod, "TILES_CASES", [(40, 100, 3, True, "softmax", torch.float32)])
    rows = mod.small_probe(torch.device("cpu"))
    assert len(rows) == 17 and max(r["rel_err"] for r in rows) < TOL[torch.float32]
    rows = mod.tiles_probe(torch.device("cpu"), 1)
    assert len(rows) == 10 and max(r["rel_err"] for r in rows) < TOL[torch.float32]
    monkeypatch.setattr(mod, "GRID_CASES", [(40, 100, 3, True, "softmax"), (30, 64, 2, True, "xtv")])
    rows = mod.grid_probe(torch.device("cpu"), 1)
    assert len(rows) == 34 and max(r["rel_err"] for r in rows) < TOL[torch.float32]
    monkeypatch.setattr(mod, "SOFTMAX_CASES", ((30, 150, 5), (25, 40, 3)))
    rows = mod.softmax_probe(torch.device("cpu"), 1)
    assert len(rows) == 6 and max(r["rel_err"] for r in rows) < TOL[torch.float32]
    monkeypatch.setattr(mod, "DOT_CASES", ((20, 150, 5),))
    rows = mod.dot_probe(torch.device("cpu"), 1)
    assert len(rows) == 30 and max(r["rel_err"] for r in rows) < TOL[torch.float32]


def test_sass_probe_reports_the_prefetch_loads(tmp_path):
    """benchmarks/sass_probe.py (sm_90 compile, no GPU): registers, spills and where the tile loop
    issues X's 16-byte loads, for the model's m = 3 loss-pass launch."""
    import subprocess

    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not all(os.path.exists(os.path.join(bindir, t)) for t in ("ptxas", "cuobjdump")):
        pytest.skip("triton's NVIDIA backend tools are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "s.json"
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "sass_probe.py")
    r = subprocess.run([sys.executable, script, "--variants", "loss m3 D64 4w x 8, 2 ahead (model)", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["spill_bytes"] == 0 and row["loop_instructions"] > 100
    assert len(row["x_loads_at"]) >= 1 and max(row["x_loads_at"]) < row["loop_instructions"]


def test_dense_kernels_compile_for_sm90():
    from _sm90 import run_aot

    run_aot(__file__, 26)


if __name__ == "__main__" and "--aot" in sys.argv:
    _aot_dense_variants()


def test_fitting_block_d_halves_a_spilling_tile(monkeypatch, rng):
    """dense.fitting_block_d: the planned columns per tile unless the compile spills more than
    LOCAL_BYTES_OK, then the first of bd / 2, bd / 4 ... 128 that does not (Triton 3.9's matvec
    tl.dot at 256-1024 columns: 2.5-5.8 KB); decided once; nothing compiled off the GPU; the matvec
    launch takes it unless the caller fixed block_d."""
    spills = {1024: 4576, 512: 600, 256: 0, 128: 0}
    seen = []

    def resources(kernel, args, kwargs):
        seen.append((kwargs["BLOCK_D"], kwargs["ONE_CHUNK"], kwargs["num_warps"]))
        return 32, 0, spills[kwargs["BLOCK_D"]] // 4

    def consts(bd):
        return dict(BLOCK_D=bd, ONE_CHUNK=bd >= 1024)
    cpu = torch.device("cpu")
    assert dense_mod.fitting_block_d("k", (1, 2), consts, 1024, 8, cpu) == 1024 and not seen
    monkeypatch.setattr(dense_mod, "interpret_mode", lambda: False)
    monkeypatch.setattr(_launch, "_compiled_resources", resources)
    monkeypatch.setattr(dense_mod, "_FITTING", {})
    cuda = torch.device("cuda", 0)
    assert dense_mod.fitting_block_d("k", (1, 2), consts, 1024, 8, cuda) == 256
    assert seen == [(1024, True, 8), (512, False, 8), (256, False, 8)]
    assert dense_mod.fitting_block_d("k", (1, 2), consts, 1024, 8, cuda) == 256 and len(seen) == 3  # once
    assert dense_mod.fitting_block_d("k", (1, 2), consts, 128, 8, cuda) == 128 and len(seen) == 3  # no smaller
    spills.update({256: 900, 128: 700})  # none fits: the least spilling
    assert dense_mod.fitting_block_d("k", (1, 16), consts, 1024, 8, cuda) == 512  # another specialisation
    # the launch: the chosen tile's columns (chunks of 128 here), the same answer as the float64 reference
    monkeypatch.setattr(dense_mod, "fitting_block_d", lambda kernel, args, consts, bd, warps, dev: 128)
    X = _dense(rng, 37, 300, torch.float32)
    W = torch.randn(301, 5, dtype=torch.float32)
    t = fusedml.matvec(X, W, intercept=True, backend="fused")
    ref = torch.cat([X.double(), torch.ones(37, 1, dtype=torch.float64)], 1) @ W.double()
    assert rel(t, ref) < TOL[torch.float32]


def test_fitting_block_n_halves_a_spilling_tile(monkeypatch, rng):
    """dense.fitting_block_n: the planned rows per tile unless the compile spills more than
    LOCAL_BYTES_OK, then the first of bn / 2, bn / 4 ... floor that does not (the unrolled loss pass
    at 1M x 55, m = 7: 3.6 KB at 16 rows, 192 B at 8); nothing compiled off the GPU; the mmchain and
    loss launches (m > 1) take it and stay exact."""
    from fusedml import loss_gradient

    spills = {16: 3640, 8: 192, 4: 0}
    seen = []

    def resources(kernel, args, kwargs):
        seen.append((kwargs["BLOCK_N"], args[-1], kwargs["num_warps"]))
        return 32, 0, spills[kwargs["BLOCK_N"]] // 4

    def args(bn):
        return (1, -(-1000 // bn))
    cpu = torch.device("cpu")
    assert dense_mod.fitting_block_n("k", args, lambda b: {"BLOCK_N": b}, 16, 1, {"num_warps": 4}, cpu) == 16
    monkeypatch.setattr(dense_mod, "interpret_mode", lambda: False)
    monkeypatch.setattr(_launch, "_compiled_resources", resources)
    monkeypatch.setattr(dense_mod, "_FITTING", {})
    cuda = torch.device("cuda", 0)
    assert dense_mod.fitting_block_n("k", args, lambda b: {"BLOCK_N": b}, 16, 1, {"num_warps": 4}, cuda) == 8
    assert seen == [(16, 1000 // 16 + 1, 4), (8, 125, 4)]
    assert dense_mod.fitting_block_n("k", args, lambda b: {"BLOCK_N": b}, 16, 8, {"num_warps": 8}, cuda) == 8
    spills[8] = 900
    assert dense_mod.fitting_block_n("k", args, lambda b: {"BLOCK_N": b}, 16, 8, {"num_warps": 2}, cuda) == 8  # least
    monkeypatch.undo()
    # the launches at the halved tile (more row tiles, the grid from them): the same answers
    halved = []

    def half(kernel, args, consts, bn, floor, options, dev):
        halved.append((bn, args(max(floor, bn // 2))[12]))  # the row-tile count the launch gets
        return max(floor, bn // 2)
    monkeypatch.setattr(dense_mod, "fitting_block_n", half)
    X = _dense(rng, 203, 55, torch.float32)
    y, v, z = _operands(rng, 203, 55, 7, intercept=True)
    w = fusedml.mmchain(X, y, v, z, 1.0, 0.5, intercept=True, backend="fused")
    assert rel(w, mmchain_reference(X, y, v, z, 1.0, 0.5, intercept=True)) < TOL[torch.float32]
    lbl = torch.nn.functional.one_hot(torch.from_numpy(rng.integers(0, 7, 203)), 7).float()
    W = 0.1 * torch.from_numpy(rng.standard_normal((56, 7))).float()
    r = loss_gradient(X, W, lbl, loss="multinomial", intercept=True, backend="fused")
    r_cpu = loss_gradient(X, W, lbl, loss="multinomial", intercept=True, backend="cpu")
    assert rel(r.grad, r_cpu.grad) < 1e-5
    assert len(halved) >= 2 and all(n == -(-203 // (bn // 2)) for bn, n in halved), halved


@pytest.mark.parametrize("N,D,m,chunk,bn,dtype,v_op", [
    (61, 64, 5, 16, 8, torch.float32, "softmax"), (45, 100, 3, None, 4, torch.float32, "mul"),
    (37, 40, 7, 8, 4, torch.float64, "mul"), (50, 128, 6, 32, 8, torch.bfloat16, "softmax")])
def test_dense_small_exact_m(rng, poison, N, D, m, chunk, bn, dtype, v_op):
    """``exact_m``: the unrolled kernel with m right-hand sides unrolled exactly (True) or padded to
    m_pad (False) gives every product and X^T V as float64, with and without the intercept,
    deterministic bit-repeatable; a value other than None / True / False raises."""
    X = _dense(rng, N, D, dtype, "row")
    X64 = X.double() if dtype != torch.float64 else X
    base = {"mode": "small", "m_pad": 1 << (m - 1).bit_length(), "block_n": bn, "num_programs": 3,
            "prefetch": 2, "chunk": chunk, "block_d": 1 << (D - 1).bit_length(), "strategy": "onchip"}
    for intercept in (False, True):
        y, v, z = _operands(rng, N, D, m, intercept=intercept)
        ref = mmchain_reference(X64, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op)
        refx = mmchain_reference(X64, None, v, z, 1.5, 0.5, intercept=intercept)
        for exact in (True, False):
            cfg = dict(base, exact_m=exact)
            w = fusedml.mmchain(X, y, v, z, 0.7, -0.4, intercept=intercept, v_op=v_op, backend="fused", config=cfg)
            assert rel(w, ref) < TOL[dtype], (intercept, exact)
            wx = fusedml.mmchain(X, None, v, z, 1.5, 0.5, intercept=intercept, backend="fused", config=cfg)
            assert rel(wx, refx) < TOL[dtype], (intercept, exact)
            wd = fusedml.mmchain(X, None, v, z, 1.5, 0.5, intercept=intercept, backend="fused", config=cfg,
                                 deterministic=True)
            assert rel(wd, refx) < TOL[dtype] and torch.equal(wd, fusedml.mmchain(
                X, None, v, z, 1.5, 0.5, intercept=intercept, backend="fused", config=cfg, deterministic=True))
    y, v, _ = _operands(rng, N, D, m)
    for bad in ("yes", 1):  # 1 after True: the launch memo keys on the values' types too
        with pytest.raises(ValueError, match="config: exact_m must be None, True or False"):
            fusedml.mmchain(X, y, v, backend="fused", config=dict(base, exact_m=bad))


def _benchmark_module(name):
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tile_ab_benchmark_smoke(tmp_path):
    """``benchmarks/tile_ab.py --quick``: each case's library launch and its alternative tiles, all
    checked against float64, written as JSON (a CPU smoke run of the GPU script)."""
    mod = _benchmark_module("tile_ab")
    out = tmp_path / "ab.json"
    assert mod.main(["--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == sum(1 + len(case[-1]) for case in mod.CASES)
    assert all(r["rel_err"] < 1e-5 for r in rows) and sum(r["tile"] == "library" for r in rows) == len(mod.CASES)


def test_matvec_probe_benchmark_smoke(tmp_path):
    """``benchmarks/matvec_probe.py --quick``: the probe kernel, the library's matvec (its default and
    mode="small" at the probe's tile) and cuBLAS on each case, checked against float64."""
    mod = _benchmark_module("matvec_probe")
    out = tmp_path / "mv.json"
    assert mod.main(["--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 * len(mod.CASES) and all(r["rel_err"] < 1e-5 for r in rows)


def test_hessian_probe_benchmark_smoke(tmp_path):
    """``benchmarks/hessian_probe.py --quick``: the library's launch and unrolled-kernel points (m exact
    and padded for X^T V) of each case, checked against float64."""
    mod = _benchmark_module("hessian_probe")
    out = tmp_path / "hp.json"
    assert mod.main(["--quick", "--cases", "softmax5", "xtv5", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["point"].split()[-1] for r in rows] == ["library", "w4", "w4", "library", "exact=0", "exact=1"]
    assert all(r["rel_err"] < 1e-5 for r in rows)


def test_matvec_small_ab_benchmark_smoke(tmp_path):
    """``benchmarks/matvec_small_ab.py --quick``: the model's matvec and the small kernel at each tile,
    checked against float64 (bf16 under the interpreter: its fp32 products of exact bf16 values)."""
    mod = _benchmark_module("matvec_small_ab")
    out = tmp_path / "ab.json"
    assert mod.main(["--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == (1 + len(mod.TILES)) * len(mod.CASES) and all(r["rel_err"] < 1e-5 for r in rows)


@pytest.mark.parametrize("backend,config", [("ops", None), ("fused", {"strategy": "gather"}), ("fused", None),
                                            ("cpu", None)])
def test_clear_csr_caches_after_numpy_writes(rng, backend, config):
    """Writes through numpy into memory a matrix shares move no torch version counter, so what was
    derived from the matrix (ops' transpose, the fused column copy, the structure check) stays;
    ``clear_csr_caches`` forgets it (the bound product below gave the old matrix's: 0.73 off)."""
    S = _csr_inputs(rng).astype(np.float32)
    y, v, _ = _operands(rng, 60, 25, None)
    y, v = y.float(), v.float()
    M = fusedml.as_csr(S)  # wraps S's arrays
    op = fusedml.bind_mmchain(S, y, v, backend=backend, config=config)
    for call in (lambda: fusedml.mmchain(M, y, v, backend=backend, config=config), op):
        call()
        S.data *= 2.0
        S.data += 1.0
        fusedml.clear_csr_caches()
        assert rel(call(), mmchain_reference(S, y.double(), v.double())) < 1e-5
    S.indices[0] = 999  # out of range, through numpy
    fusedml.clear_csr_caches()
    with pytest.raises(ValueError, match="column indices must lie in"):
        fusedml.mmchain(M, y, v, backend=backend, config=config)
