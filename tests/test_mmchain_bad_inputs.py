"""Bad arguments to fusedml.mmchain / matvec raise clear errors naming the problem."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fusedml
from fusedml import BackendUnavailableError


@pytest.fixture
def data(rng):
    X = torch.from_numpy(rng.standard_normal((20, 6))).float()
    y = torch.from_numpy(rng.standard_normal(6)).float()
    v = torch.from_numpy(rng.random(20)).float()
    return X, y, v


BACKENDS = ["fused", "ops", "cpu"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_shapes_name_the_argument(data, backend):
    X, y, v = data
    with pytest.raises(ValueError, match=r"y must have D = 6 rows.*got shape \(5,\)"):
        fusedml.mmchain(X, y[:5], v, backend=backend)
    with pytest.raises(ValueError, match=r"y must have D \+ 1 = 7 \(intercept=True\) rows"):
        fusedml.mmchain(X, y, v, intercept=True, backend=backend)
    with pytest.raises(ValueError, match=r"v must have N = 20 rows"):
        fusedml.mmchain(X, y, v[:19], backend=backend)
    with pytest.raises(ValueError, match=r"z must have shape \[6\]"):
        fusedml.mmchain(X, y, v, torch.zeros(7), backend=backend)
    with pytest.raises(ValueError, match=r"v must be 1-D"):
        fusedml.mmchain(X, y, torch.ones(20, 2), backend=backend)
    with pytest.raises(ValueError, match=r"v must have shape \[N\] or \[N, m\]"):
        fusedml.mmchain(X, torch.ones(6, 3), torch.ones(20, 2), backend=backend)
    with pytest.raises(ValueError, match=r"y must have 1 or 2 dimension"):
        fusedml.mmchain(X, torch.ones(6, 2, 2), backend=backend)
    with pytest.raises(ValueError, match=r"X must have 2 dimension"):
        fusedml.mmchain(torch.ones(20), y, backend=backend)


def test_too_many_columns(data):
    X, _, _ = data
    with pytest.raises(ValueError, match=r"m = 17 columns; at most 16"):
        fusedml.mmchain(X, torch.ones(6, 17))
    with pytest.raises(ValueError, match=r"v has m = 17 columns"):
        fusedml.mmchain(X, None, torch.ones(20, 17))


def test_empty_inputs(data):
    _, y, _ = data
    with pytest.raises(ValueError, match=r"X is empty"):
        fusedml.mmchain(torch.zeros(0, 6), y)
    with pytest.raises(ValueError, match=r"X is empty"):
        fusedml.matvec(torch.zeros(5, 0), torch.zeros(0))
    with pytest.raises(ValueError, match=r"y has 0 columns"):
        fusedml.mmchain(torch.ones(3, 6), torch.zeros(6, 0))


def test_dtype_rules(data):
    X, y, v = data
    with pytest.raises(TypeError, match=r"y must have a floating dtype"):
        fusedml.mmchain(X, torch.arange(6), v)
    with pytest.raises(TypeError, match=r"v must have a floating dtype"):
        fusedml.mmchain(X, y, torch.ones(20, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"z must hold floating-point numbers"):
        fusedml.mmchain(X, y, v, np.array(["a"] * 6))
    with pytest.raises(TypeError, match=r"X must have a floating dtype"):
        fusedml.mmchain(torch.ones(4, 6, dtype=torch.int64), y)
    # float64 operands with float32 X are cast to the accumulation dtype (float32)
    w = fusedml.mmchain(X, y.double(), v.double(), backend="fused")
    assert w.dtype == torch.float32


def test_mismatched_devices(data):
    X, y, v = data
    with pytest.raises(ValueError, match=r"y is on meta but X is on cpu"):
        fusedml.mmchain(X, y.to("meta"), v)
    with pytest.raises(ValueError, match=r"v is on meta"):
        fusedml.mmchain(X, y, v.to("meta"))


@pytest.mark.parametrize("name", ["X", "y", "v", "z"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_check_finite_names_the_argument(data, name, bad):
    X, y, v = data
    args = {"X": X.clone(), "y": y.clone(), "v": v.clone(), "z": torch.ones(6)}
    args[name].view(-1)[3] = bad
    with pytest.raises(ValueError, match=rf"^{name} contains"):
        fusedml.mmchain(args["X"], args["y"], args["v"], args["z"], check_finite=True)
    # without the check, the non-finite value propagates instead of being silently dropped
    w = fusedml.mmchain(args["X"], args["y"], args["v"], args["z"], beta=1.0, backend="cpu")
    assert not bool(torch.isfinite(w).all())


def test_check_finite_csr_values(rng):
    S = sp.random(10, 5, density=0.5, format="csr", random_state=0)
    S.data[2] = np.nan
    with pytest.raises(ValueError, match=r"^X contains 1 NaN"):
        fusedml.mmchain(S, np.ones(5), check_finite=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csr_matrix_is_checked_once(backend):
    """A CSRMatrix built by hand gets as_csr's checks (it was passed through unchecked: a short
    row-pointer array or out-of-range columns crashed the ops backend's process, a short value
    array gave garbage elsewhere); once per matrix, again after its indices change in place."""
    A = sp.random(40, 9, density=0.3, format="csr", dtype=np.float32, random_state=1)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    crow, col, val = t(A.indptr), t(A.indices), t(A.data)
    y, v = torch.ones(9), torch.ones(40)
    bad = [((crow[:-3], col, val, A.shape), ValueError, r"N \+ 1 = 41 entries, got 38"),
           ((crow, col + 5, val, A.shape), ValueError, r"column indices must lie in \[0, 9\)"),
           ((crow, col, val[:-2], A.shape), ValueError, r"col has 108 entries but val has 106"),
           ((crow.flip(0), col, val, A.shape), ValueError, r"row pointers"),
           ((crow.long(), col, val, A.shape), TypeError, r"both be int32 or both int64"),
           ((crow, col, val.int(), A.shape), TypeError, r"CSR values must be one of"),
           ((crow, col, val, (40,)), ValueError, r"shape must be two non-negative ints"),
           ((crow, col, torch.stack([val, val], 1)[:, 0], A.shape), ValueError, r"val must be contiguous")]
    for args, err, match in bad:
        with pytest.raises(err, match=match):
            fusedml.mmchain(fusedml.CSRMatrix(*args), y, v, backend=backend)
    M = fusedml.CSRMatrix(crow.clone(), col.clone(), val, A.shape)
    ref = torch.from_numpy(A.T @ (A @ np.ones(9, np.float32)))
    assert torch.allclose(fusedml.mmchain(M, y, v, backend=backend), ref, rtol=1e-5)
    M.col[0] = 50  # through the tensor: its version counter moves
    with pytest.raises(ValueError, match=r"column indices must lie in \[0, 9\), got range \[0, 50\]"):
        fusedml.mmchain(M, y, v, backend=backend)


def test_sparse_formats_and_structure(rng):
    S = sp.random(10, 5, density=0.5, format="csr", random_state=0)
    with pytest.raises(TypeError, match=r"unsupported sparse format 'coo'"):
        fusedml.mmchain(S.tocoo(), np.ones(5))
    with pytest.raises(TypeError, match=r"unsupported sparse format 'csc'"):
        fusedml.matvec(S.tocsc(), np.ones(5))
    with pytest.raises(TypeError, match=r"unsupported sparse layout"):
        fusedml.mmchain(torch.from_numpy(S.toarray()).to_sparse_coo(), torch.ones(5, dtype=torch.float64))
    bad = sp.csr_matrix((np.array([1.0, 2.0]), np.array([3, 1]), np.array([0, 2] + [2] * 9)), shape=(10, 5))
    with pytest.raises(ValueError, match=r"sorted and unique"):
        fusedml.mmchain(bad, np.ones(5))
    dup = sp.csr_matrix((np.array([1.0, 2.0]), np.array([1, 1]), np.array([0, 2] + [2] * 9)), shape=(10, 5))
    with pytest.raises(ValueError, match=r"sorted and unique"):
        fusedml.mmchain(dup, np.ones(5), backend="ops")


def test_bad_options(data):
    X, y, v = data
    with pytest.raises(ValueError, match=r"v_op must be one of"):
        fusedml.mmchain(X, y, v, v_op="exp")
    with pytest.raises(ValueError, match=r"v_op='softmax' needs a matrix y"):
        fusedml.mmchain(X, y, v, v_op="softmax")
    with pytest.raises(ValueError, match=r"v_op='softmax' needs v"):
        fusedml.mmchain(X, torch.ones(6, 2), v_op="softmax")
    with pytest.raises(ValueError, match=r"v is required when y is None"):
        fusedml.mmchain(X, None)
    with pytest.raises(ValueError, match=r"y is required for matvec"):
        fusedml.matvec(X, None)
    with pytest.raises(ValueError, match=r"backend must be one of"):
        fusedml.mmchain(X, y, backend="cuda")
    with pytest.raises(ValueError, match=r"alpha must be finite"):
        fusedml.mmchain(X, y, alpha=float("nan"))
    with pytest.raises(TypeError, match=r"beta must be a real scalar"):
        fusedml.mmchain(X, y, beta="one")
    for c in (np.complex128(2 + 3j), np.array(2 + 0j), 2 + 3j, torch.tensor(2 + 3j)):  # not the real part
        with pytest.raises(TypeError, match=r"alpha must be a real scalar"):
            fusedml.mmchain(X, y, alpha=c)
    with pytest.raises(ValueError, match=r"ops_transpose"):
        fusedml.mmchain(X, y, backend="ops", config={"ops_transpose": "never"})
    with pytest.raises(ValueError, match=r"invalid dense config"):
        fusedml.mmchain(X, y, backend="fused", config={"strategy": "magic"})
    with pytest.raises(ValueError, match=r"needs block_d >= D"):
        fusedml.mmchain(X, y, backend="fused", config={"strategy": "onchip", "block_d": 2})
    with pytest.raises(ValueError, match=r"mode='dot' is not available for float64"):
        fusedml.mmchain(X.double(), torch.ones(6, 2), backend="fused", config={"mode": "dot", "m_pad": 16,
                                                                                 "block_n": 16, "block_d": 16})
    with pytest.raises(ValueError, match=r"mode='dot' needs block_n >= 16 and block_d >= 16"):
        fusedml.mmchain(X, torch.ones(X.shape[1], 2), backend="fused",
                        config={"mode": "dot", "m_pad": 16, "block_n": 16, "block_d": 8})


def test_unknown_config_keys_are_rejected(data):
    """A misspelt launch override (or a CSR key for dense X) raises instead of being ignored."""
    import scipy.sparse as sp

    X, y, v = data
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'blockn' for dense X"):
        fusedml.mmchain(X, y, v, backend="fused", config={"blockn": 64})
    with pytest.raises(ValueError, match=r"'memory' for dense X"):
        fusedml.matvec(X, y, config={"memory": "low"})
    with pytest.raises(ValueError, match=r"unknown key"):
        fusedml.loss_gradient(X, y, (v > 0.5).float(), loss="logistic", config={"num_warp": 4})
    with pytest.raises(ValueError, match=r"'block_n' for CSR X"):
        fusedml.mmchain(sp.random(20, 6, density=0.5, format="csr", random_state=0), y, v, config={"block_n": 16})
    # the known keys still pass (dense launch, CSR strategy, the ops baseline's transpose)
    fusedml.mmchain(X, y, v, backend="cpu", config={"block_n": 16, "ops_transpose": "cached"})


@pytest.mark.parametrize("config, match", [
    ({"strategy": "chunked", "block_d": 48}, r"config: block_d must be a power of two, got 48"),
    ({"block_n": 24}, r"config: block_n must be a power of two"),
    ({"block_n": 0}, r"config: block_n must be a positive integer, got 0"),
    ({"block_n": True}, r"config: block_n must be a positive integer, got True"),
    ({"num_warps": 3}, r"config: num_warps must be a power of two from 1 to 32"),
    ({"num_warps": 64}, r"config: num_warps must be a power of two from 1 to 32"),
    ({"num_programs": 0}, r"config: num_programs must be a positive integer"),
    ({"num_stages": 0}, r"config: num_stages must be a positive integer"),
    ({"prefetch": 5}, r"config: prefetch must be True / False or 0, 1, 2"),
    ({"two_pass": 1}, r"config: two_pass must be True or False"),
    ({"max_registers": 300}, r"config: max_registers must be None or an integer from 16 to 255"),
    # GPU fuzz case mmchain:28268 (fp64, m = 15: [64, 16, 4096] products) failed to compile instead
    ({"strategy": "chunked", "block_n": 64, "block_d": 4096}, r"largest tile has 4194304 elements, more than"),
])
def test_dense_launch_values_are_checked(config, match):
    """Launch overrides no kernel can run raise a ValueError naming the field, before any launch."""
    X, Y = torch.randn(17, 4970, dtype=torch.float64), torch.randn(4970, 15, dtype=torch.float64)
    Y = Y if "largest tile" in match else Y[:, 0]
    with pytest.raises(ValueError, match=match):
        fusedml.mmchain(X, Y, backend="fused", config=config)


def test_dense_overrides_never_drop_right_hand_sides():
    """m_pad below m (or mode="vector" for m > 1) gave wrong results (mmchain, matvec) or crashed."""
    X, Y = torch.randn(40, 70), torch.randn(70, 5)
    for cfg, match in (({"m_pad": 4, "mode": "dot"}, r"m_pad=4 is below m=5 \(mode 'dot'\)"),
                       ({"m_pad": 4, "mode": "elementwise"}, r"m_pad=4 is below m=5"),
                       ({"mode": "dot", "m_pad": 8}, r"mode='dot' needs m_pad >= 16"),
                       ({"mode": "vector"}, r"mode='vector' serves one right-hand side, got m=5")):
        for fn in (fusedml.mmchain, fusedml.matvec):
            with pytest.raises(ValueError, match=match):
                fn(X, Y, backend="fused", config=cfg)
    with pytest.raises(ValueError, match=r"the matvec kernel runs mode 'vector', 'small', 'dot' or 'elementwise'"):
        fusedml.matvec(X, Y, backend="fused", config={"mode": "bogus"})
    with pytest.raises(ValueError, match=r"mode='small' serves 2 to 8 right-hand sides, got m=1"):
        fusedml.matvec(X, Y[:, 0], backend="fused", config={"mode": "small"})
    with pytest.raises(ValueError, match=r"config: block_n must be a power of two"):
        fusedml.loss_gradient(X, torch.zeros(70), (torch.rand(40) > 0.5).float(), loss="logistic",
                              backend="fused", config={"block_n": 12})
    # valid overrides still give the product
    w = fusedml.mmchain(X, Y, backend="fused", config={"mode": "elementwise", "m_pad": 8})
    torch.testing.assert_close(w, X.T @ (X @ Y), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config, match", [
    ({"block_r": 3}, r"config: block_r must be a power of two, got 3"),
    ({"lanes": 6}, r"config: lanes must be a power of two"),
    ({"tile": 100}, r"config: tile must be a power of two"),
    ({"piece": 7}, r"config: piece must be a power of two"),
    ({"chunk": 0}, r"config: chunk must be a positive integer"),
    ({"long_threshold": 0}, r"config: long_threshold must be a positive integer"),
    ({"num_warps": 3}, r"config: num_warps must be a power of two from 1 to 32"),
    ({"long_warps": 0}, r"config: long_warps must be a positive integer"),
    ({"ordered": 1}, r"config: ordered must be True or False"),
    ({"tile_bytes": -1}, r"config: tile_bytes must be a non-negative integer"),
    ({"tile": 1 << 22}, r"largest tile has 4194304 elements"),
    ({"strategy": "gather", "gather": {"block_r": 5}}, r"config: block_r must be a power of two, got 5"),
])
def test_csr_launch_values_are_checked(config, match):
    """CSR launch overrides (the CSC pass's too) no kernel can run raise a ValueError naming the field."""
    A = sp.random(300, 50, density=0.1, format="csr", dtype=np.float32, random_state=0)
    with pytest.raises(ValueError, match=match):
        fusedml.mmchain(A, np.ones(50, np.float32), backend="fused", config=config)


def test_explicit_csr_config_is_checked():
    """A CSRConfig object passed whole is checked like overrides are."""
    import dataclasses

    from fusedml._validation import as_csr
    from fusedml.mmchain.csr import csr_config

    A = sp.random(300, 50, density=0.1, format="csr", dtype=np.float32, random_state=0)
    bad = dataclasses.replace(csr_config(as_csr(A), 1, torch.float32, strategy="scatter"), lanes=6)
    with pytest.raises(ValueError, match=r"config: lanes must be a power of two, got 6"):
        fusedml.mmchain(A, np.ones(50, np.float32), backend="fused", config=bad)


def test_backend_unavailable(data, monkeypatch):
    X, y, v = data
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendUnavailableError, match=r"backend='fused' needs CUDA"):
        fusedml.mmchain(X, y, v, backend="fused")


def test_inputs_never_modified(data):
    X, y, v = data
    z = torch.ones(6)
    copies = [t.clone() for t in (X, y, v, z)]
    for backend in BACKENDS:
        for det in (False, True):
            fusedml.mmchain(X, y, v, z, 2.0, 3.0, backend=backend, deterministic=det)
    for a, b in zip((X, y, v, z), copies):
        assert torch.equal(a, b)


def test_forced_launch_beyond_the_gpu_is_a_config_error(monkeypatch):
    """A caller's ``config`` whose launch the GPU cannot hold (triton's ``OutOfResources`` at launch: a
    GPU fuzz case, ``block_n=64`` on the padded ``tl.dot`` of 1024-value tiles, needs 324 KB of shared
    memory) raises a ValueError naming the config; the model's own launch lets the error through."""
    from triton.runtime.errors import OutOfResources

    from fusedml.mmchain import dense

    def full(*a, **k):
        raise OutOfResources(331776, 232448, "shared memory")

    monkeypatch.setattr(dense, "launch", full)
    X, Y = torch.rand(40, 30), torch.rand(30, 6)
    with pytest.raises(ValueError, match=r"config: the launch \{'block_n': 64\} does not fit the GPU"):
        fusedml.mmchain(X, Y, torch.rand(40), backend="fused", config={"block_n": 64})
    with pytest.raises(ValueError, match="config: the launch"):
        fusedml.matvec(X, Y, backend="fused", config={"block_n": 64})
    with pytest.raises(OutOfResources):
        fusedml.mmchain(X, Y, torch.rand(40), backend="fused")
