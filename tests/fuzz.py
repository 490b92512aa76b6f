"""Differential fuzzing of the public operators against float64 references.

Each case draws a random configuration from its seed: shapes (edge sizes included), storage dtype,
layout (contiguous, column-major, strided, numpy, CSR in three containers with int32 / int64
indices, empty and long rows), optional operands, options and, for the fused dense kernels,
sometimes a forced launch (strategy, tile, grid). It runs the operator and checks

* the result against a float64 reference computed from the stored values, within a worst-case
  rounding bound of the accumulation dtype (a wrong, missing or doubled row or column exceeds it);
* that no input was modified;
* for ``deterministic=True``, the same bits on a second call.

``bind`` cases check the bound forms after their operands change in place; ``stream`` cases run
``mmchain``, ``matvec`` and ``gmm_estep`` over a Dask array with random row chunks (dense or CSR)
through :class:`fusedml.streaming.StreamedMatrix` with random memory plans (resident, streamed,
re-read). ``fit`` cases train a random estimator (logistic, multinomial, LinearSVC, Poisson / gamma /
Tweedie, Ridge on dense, torch or CSR data, with sample and class weights, string labels; a
Gaussian mixture of each covariance type) and compare it with scikit-learn's on the same objective.

A failing case prints its seed and configuration; ``--case OP:SEED`` replays it.

    TRITON_INTERPRET=1 python tests/fuzz.py --n 200 --seed 0          # CPU, interpreted kernels
    python tests/fuzz.py --device cuda --n 2000 --seed $RANDOM           # compiled kernels on a GPU

``tests/test_fuzz.py`` runs a fixed set of seeds of every operator in the test suite.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import numpy as np
import torch

OPS = ("mmchain", "loss_gradient", "gmm_estep", "gmm_score", "lloyd_step", "stream", "fit")
_EPS = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


class FuzzFailure(AssertionError):
    """A fuzz case whose result or side effects were wrong."""


# ---------------------------------------------------------------------------------------------
# input drawing


def _size(rng, small, large):
    """An edge size (1, 2, 3, a power of two and its neighbours) or a uniform draw up to ``large``."""
    if rng.random() < 0.5:
        return int(rng.choice([s for s in (1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 65, 127, 128, 129, 255, 256,
                                           257, 513, 1025) if s <= large]))
    return int(rng.integers(small, large + 1))


def _dense(rng, N, D, dtype, layout, scale=1.0, shift=0.0):
    """A dense ``[N, D]`` matrix of ``dtype`` in ``layout``; also its stored values in float64."""
    base = rng.normal(size=(N, D)) * scale + shift
    if layout == "colmajor":
        X = torch.from_numpy(base.T.copy()).to(dtype).T
    elif layout == "rowstride":  # every other row of a taller matrix
        big = np.repeat(base, 2, axis=0)
        X = torch.from_numpy(big).to(dtype)[::2]
    elif layout == "colstride":  # every other column of a wider matrix
        big = np.repeat(base, 2, axis=1)
        X = torch.from_numpy(big).to(dtype)[:, ::2]
    else:
        X = torch.from_numpy(base).to(dtype)
    ref = X.double().numpy().copy()
    if layout == "numpy" and dtype in (torch.float32, torch.float64, torch.float16):
        X = X.numpy()
    return X, ref


def _csr(rng, N, D, dtype, container, index_dtype):
    """A random CSR ``[N, D]`` (empty rows, a few long rows); also its dense float64 values."""
    import scipy.sparse as sp

    lens = rng.poisson(max(1.0, D / 8), size=N).clip(0, D)
    lens[rng.random(N) < 0.15] = 0  # empty rows
    if N > 2:
        lens[rng.integers(0, N)] = D  # a full row
    cols = [np.sort(rng.choice(D, size=int(k), replace=False)) for k in lens]
    crow = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    col = np.concatenate(cols).astype(np.int64) if crow[-1] else np.zeros(0, np.int64)
    val = torch.from_numpy(rng.normal(size=int(crow[-1]))).to(dtype)
    dense = np.zeros((N, D))
    dense[np.repeat(np.arange(N), lens), col] = val.double().numpy()
    it = torch.int32 if index_dtype == "int32" else torch.int64
    if container == "scipy" and dtype in (torch.float32, torch.float64):
        X = sp.csr_matrix((val.numpy(), col.astype(index_dtype), crow.astype(index_dtype)), shape=(N, D))
    elif container == "torch":
        X = torch.sparse_csr_tensor(torch.from_numpy(crow).to(it), torch.from_numpy(col).to(it), val, size=(N, D))
    else:
        from fusedml import CSRMatrix

        X = CSRMatrix(torch.from_numpy(crow).to(it), torch.from_numpy(col).to(it), val, (N, D))
    return X, dense


def _snapshot(objs):
    """Copies of the tensors / arrays among ``objs`` (CSR containers by their arrays)."""
    out = []
    for o in objs:
        for a in _arrays(o):
            out.append((a, a.clone() if isinstance(a, torch.Tensor) else np.array(a, copy=True)))
    return out


def _arrays(o):
    if o is None or isinstance(o, (int, float, str)):
        return []
    if isinstance(o, torch.Tensor) and o.layout == torch.sparse_csr:
        return [o.crow_indices(), o.col_indices(), o.values()]
    if isinstance(o, (torch.Tensor, np.ndarray)):
        return [o]
    if hasattr(o, "crow"):  # CSRMatrix
        return [o.crow, o.col, o.val]
    if hasattr(o, "indptr"):  # scipy
        return [o.indptr, o.indices, o.data]
    return []


def _check_unchanged(snap):
    for a, copy in snap:
        same = torch.equal(a, copy) if isinstance(a, torch.Tensor) else np.array_equal(a, copy)
        if not same:
            raise FuzzFailure("an input was modified in place")


def _to(x, device):
    """``x`` on ``device``; off the CPU, numpy arrays and scipy CSR become device tensors (the fused
    kernels read device memory). On the CPU every container stays as drawn."""
    if str(device) == "cpu":
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device)
    if hasattr(x, "indptr"):  # scipy CSR: the library's own conversion
        from fusedml import as_csr

        return as_csr(x).to(device)
    if isinstance(x, torch.Tensor) or hasattr(x, "crow"):  # dense / sparse CSR tensors, CSRMatrix
        return x.to(device)
    return x


def _np(t):
    return t.detach().double().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, dtype=np.float64)


def _close(name, got, ref, bound, what):
    """Assert ``|got - ref| <= bound`` elementwise (bound >= 0, same shape); report the worst entry."""
    got, ref = _np(got), np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise FuzzFailure(f"{name}: shape {got.shape}, expected {ref.shape} ({what})")
    if not np.all(np.isfinite(got)):
        raise FuzzFailure(f"{name}: non-finite values ({what})")
    err = np.abs(got - ref)
    bad = err > np.broadcast_to(bound, err.shape)
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise FuzzFailure(f"{name}: {int(bad.sum())} of {err.size} entries off; worst at {i}: got {got[i]!r}, "
                          f"expected {ref[i]!r}, bound {np.broadcast_to(bound, err.shape)[i]!r} ({what})")


def _half_ops(c):
    """Unit roundoff of the ops baseline's half-precision products (0 where it computes in acc).

    ``backend="ops"`` multiplies dense bf16 / fp16 X in its storage dtype, as a user's torch code
    would (``fusedml/mmchain/ops.py``): y, X y, p and the result are rounded to that dtype."""
    if c["backend"] != "ops" or c.get("sparse") or c["dtype"] not in ("bfloat16", "float16"):
        return 0.0
    return 2.0 ** -8 if c["dtype"] == "bfloat16" else 2.0 ** -11


def _gamma(n, acc):
    """A worst-case relative rounding bound of an n-term float sum in ``acc`` (Higham's gamma_n, x4)."""
    return 4.0 * (n + 2) * _EPS[acc]


# ---------------------------------------------------------------------------------------------
# mmchain


def draw_mmchain(seed):
    """The configuration of mmchain case ``seed`` (a dict of plain values)."""
    rng = np.random.default_rng([1, seed])
    sparse = rng.random() < 0.3
    c = dict(seed=seed, sparse=sparse, N=_size(rng, 1, 700), D=_size(rng, 1, 300 if sparse else 1100),
             dtype=str(rng.choice(["float32", "float32", "float64", "bfloat16", "float16"])))
    if rng.random() < 0.1 and not sparse:  # wide rows: the chunked / cooperative kernels
        c["N"], c["D"] = int(rng.integers(1, 40)), int(rng.integers(2049, 6000))
    c["m"] = None if rng.random() < 0.6 else int(rng.integers(1, 17))
    c["y_none"] = bool(rng.random() < 0.15)
    c["v"] = str(rng.choice(["none", "vector", "matrix"] if c["m"] else ["none", "vector"]))
    if c["y_none"] and c["v"] == "none":
        c["v"] = "vector"
    c["v_op"] = "softmax" if (c["m"] and c["v"] == "matrix" and not c["y_none"] and rng.random() < 0.3) else "mul"
    c["z"] = bool(rng.random() < 0.4)
    c["alpha"] = float(rng.choice([1.0, -0.5, 2.5]))
    c["beta"] = float(rng.choice([0.0, 1.0, -3.0])) if c["z"] else 0.0
    c["intercept"] = bool(rng.random() < 0.3)
    c["deterministic"] = bool(rng.random() < 0.2)
    c["backend"] = str(rng.choice(["fused", "fused", "fused", "cpu", "ops"]))
    if sparse:
        c["container"] = str(rng.choice(["scipy", "torch", "fusedml"]))
        c["index"] = str(rng.choice(["int32", "int64"]))
        c["config"] = _draw_csr_config(rng) if c["backend"] == "fused" and rng.random() < 0.35 else None
    else:
        c["layout"] = str(rng.choice(["contiguous", "contiguous", "colmajor", "rowstride", "colstride", "numpy"]))
        c["config"] = _draw_dense_config(rng, c) if c["backend"] == "fused" and rng.random() < 0.35 else None
    c["bind"] = bool(rng.random() < 0.25)  # bind_mmchain: two calls, operands changed in place between them
    # the matvec [X, 1] y of the same operands (its own stream: earlier seeds draw the same cases)
    mrng = np.random.default_rng([3, seed])
    c["matvec_config"] = None
    if not sparse and c["backend"] == "fused" and not c["y_none"] and mrng.random() < 0.8:
        m = c["m"] or 1
        if 2 <= m <= 8 and mrng.random() < 0.8:  # one accumulator per right-hand side
            c["matvec_config"] = {"mode": "small", "block_n": int(mrng.choice([4, 16, 32, 64])),
                                  "block_d": int(mrng.choice([16, 32, 64, 128])), "num_warps": int(mrng.choice([2, 4, 8])),
                                  "num_programs": int(mrng.integers(1, 9))}
        else:
            c["matvec_config"] = {"block_n": int(mrng.choice([16, 32, 64])), "num_programs": int(mrng.integers(1, 9))}
    # the same product on the unrolled kernel at a forced launch: column chunks, m exact or padded
    # (its own stream too)
    srng = np.random.default_rng([4, seed])
    c["small_config"] = None
    if not sparse and c["backend"] == "fused" and c["m"] and 2 <= c["m"] <= 8 and c["D"] <= 1024:
        bd = 1 << max(0, c["D"] - 1).bit_length()
        chunks = [1 << k for k in range(2, bd.bit_length())]
        chunk = None if srng.random() < 0.3 or not chunks else chunks[int(srng.integers(0, len(chunks)))]
        c["small_config"] = {
            "mode": "small", "strategy": "onchip", "block_d": bd, "m_pad": 1 << (c["m"] - 1).bit_length(),
            "block_n": int(srng.choice([1, 2, 4, 8, 16])), "num_warps": int(srng.choice([1, 2, 4])),
            "chunk": chunk, "prefetch": int(srng.integers(0, 3)),
            "exact_m": [None, True, False][int(srng.integers(0, 3))], "num_programs": int(srng.integers(1, 9))}
    _cap_interpreted_steps(c)
    return c


#: row blocks x column steps of a forced small-m launch, at most: the interpreter runs each step's
#: tile ops one by one (seed 28: [4, 16] matvec tiles over 418 x 928, 118 s of the 80 seeds' 190)
_MAX_STEPS = 256


def _cap_interpreted_steps(c):
    """Coarsen the forced small-m launches of a draw (within the sets drawn from) until they take at
    most ``_MAX_STEPS`` row-block x column steps; a draw within the bound is unchanged."""
    def steps(bn, cols):
        return -(-c["N"] // bn) * cols

    mv = c["matvec_config"]
    if mv and mv.get("mode") == "small":
        while steps(mv["block_n"], -(-c["D"] // mv["block_d"])) > _MAX_STEPS and mv["block_d"] < 128:
            mv["block_d"] *= 2
        while steps(mv["block_n"], -(-c["D"] // mv["block_d"])) > _MAX_STEPS and mv["block_n"] < 64:
            mv["block_n"] = 16 if mv["block_n"] == 4 else mv["block_n"] * 2
    sc = c["small_config"]
    if sc:
        chunks = lambda: sc["block_d"] // (sc["chunk"] or sc["block_d"])  # noqa: E731
        while steps(sc["block_n"], chunks()) > _MAX_STEPS and sc["block_n"] < 16:
            sc["block_n"] *= 2
        while sc["chunk"] and steps(sc["block_n"], chunks()) > _MAX_STEPS and sc["chunk"] < sc["block_d"] // 2:
            sc["chunk"] *= 2


def _draw_dense_config(rng, c):
    m = c["m"] or 1
    pow2 = 1 << max(0, c["D"] - 1).bit_length()
    choice = rng.integers(0, 4)
    if choice == 0:
        return {"num_programs": int(rng.integers(1, 5))}
    if choice == 1 and c["D"] > 16:
        return {"strategy": "chunked", "block_d": int(rng.choice([16, 32, 64, max(16, pow2 // 2)])),
                "block_n": int(rng.choice([16, 32, 64])), "num_programs": int(rng.integers(1, 6))}
    if choice == 2 and m == 1 and c["v_op"] == "mul" and c["D"] > 32:
        # at most 8 column blocks per row: the interpreter runs the handshake's programs one by one
        return {"strategy": "coop", "block_d": int(rng.choice([max(16, pow2 // g) for g in (2, 4, 8)])),
                "num_programs": int(rng.integers(1, 4)), "prefetch": int(rng.integers(0, 3)),
                "two_pass": bool(rng.random() < 0.3)}
    return {"block_n": int(rng.choice([16, 32, 64])), "num_programs": int(rng.integers(1, 9))}


def _draw_csr_config(rng):
    # either strategy, the low-memory one, and forced launches that reach the binned and long-row
    # kernels (and the ordered loop) on the fuzz's small matrices
    choice = rng.integers(0, 5)
    strategy = str(rng.choice(["scatter", "gather"]))
    if choice == 0:
        return {"strategy": strategy}
    if choice == 1:
        return {"memory": "low"}
    if choice == 2:
        tile = int(rng.choice([16, 32, 64]))
        piece = int(rng.choice([4, 8, tile]))
        return {"strategy": strategy, "ordered": False, "tile": tile, "l_min": int(rng.choice([1, 2, 4])),
                "long_threshold": tile, "piece": piece, "chunk": piece * int(rng.integers(1, 4))}
    if choice == 3:
        return {"strategy": strategy, "ordered": True, "single": False, "lanes": int(rng.choice([2, 4, 8])),
                "block_r": int(rng.choice([1, 4, 8]))}
    return {"strategy": "gather", "gather": {"ordered": False, "tile": 32, "l_min": 2, "long_threshold": 16,
                                             "piece": 8, "chunk": 16}}


def _mmchain_reference(c, Xa, y, v, z, acc, mcols):
    """float64 ``alpha [X,1]^T (v op ([X,1] y)) + beta z`` from the stored values, and its bound."""
    N, Dx = Xa.shape
    yv = None if y is None else _np(y).reshape(Dx, mcols)
    vv = np.ones((N, mcols)) if v is None else _np(v).reshape(N, -1) * np.ones((1, mcols))
    zz = np.zeros((Dx, mcols)) if z is None else _np(z).reshape(Dx, mcols)
    if yv is None:
        p, pabs = vv, np.abs(vv)
    else:
        t, tabs = Xa @ yv, np.abs(Xa) @ np.abs(yv)
        if c["v_op"] == "softmax":
            s = (vv * t).sum(1, keepdims=True)
            p = vv * (t - s)
            pabs = np.abs(vv) * (tabs + (np.abs(vv) * tabs).sum(1, keepdims=True))
        else:
            p, pabs = vv * t, np.abs(vv) * tabs
    ref = c["alpha"] * (Xa.T @ p) + c["beta"] * zz
    scale = abs(c["alpha"]) * (np.abs(Xa).T @ pabs) + abs(c["beta"]) * np.abs(zz)
    return ref, (_gamma(N + 2 * Dx + 16, acc) + 8 * _half_ops(c)) * scale + 1e-30


def run_mmchain(c, device="cpu"):
    """Run mmchain case ``c``; raise :class:`FuzzFailure` on a wrong result. Returns a short tag."""
    import fusedml

    rng = np.random.default_rng([2, c["seed"]])
    dt = getattr(torch, c["dtype"])
    acc = torch.float64 if dt == torch.float64 else torch.float32
    N, D = c["N"], c["D"]
    if c["sparse"]:
        X, Xr = _csr(rng, N, D, dt, c["container"], c["index"])
    else:
        X, Xr = _dense(rng, N, D, dt, c["layout"])
    X = _to(X, device)
    Dx = D + c["intercept"]
    # without y the result's columns are v's: a vector v gives a vector result
    mshape = () if c["m"] is None or (c["y_none"] and c["v"] == "vector") else (c["m"],)
    y = None if c["y_none"] else torch.from_numpy(rng.normal(size=(Dx, *mshape))).to(acc).to(device)
    mcols = mshape[0] if mshape else 1
    v = {"none": None, "vector": torch.from_numpy(rng.uniform(-1, 2, size=N)),
         "matrix": torch.from_numpy(rng.uniform(0, 1, size=(N, mcols)))}[c["v"]]
    v = None if v is None else v.to(acc).to(device)
    z = torch.from_numpy(rng.normal(size=(Dx, *mshape))).to(acc).to(device) if c["z"] else None
    snap = _snapshot([X, y, v, z])
    kw = dict(alpha=c["alpha"], beta=c["beta"], intercept=c["intercept"], v_op=c["v_op"], backend=c["backend"],
              deterministic=c["deterministic"], config=c.get("config"))
    run = (lambda: fusedml.mmchain(X, y, v, z, **kw)) if not c["bind"] else None
    try:
        if c["bind"]:
            op = fusedml.bind_mmchain(X, y, v, z, **kw)
            run = op
        w = run().clone()
    except ValueError as e:
        if c.get("config") and ("config" in str(e) or "strategy=" in str(e) or "mode=" in str(e)):
            return "config-rejected"
        raise
    _check_unchanged(snap)
    Xa = np.hstack([Xr, np.ones((N, 1))]) if c["intercept"] else Xr
    ref, bound = _mmchain_reference(c, Xa, y, v, z, acc, mcols)
    _close("mmchain", _np(w).reshape(Dx, mcols), ref, bound, _describe(c))
    if c["deterministic"] and c["backend"] == "fused":
        if not torch.equal(w, run()):
            raise FuzzFailure(f"mmchain deterministic=True differs between two calls ({_describe(c)})")
    if c.get("matvec_config") is not None:
        t = fusedml.matvec(X, y, intercept=c["intercept"], backend="fused", config=c["matvec_config"])
        _check_unchanged(snap)
        yv = _np(y).reshape(Dx, mcols)
        bound = (_gamma(Dx + 16, acc) + 8 * _half_ops(c)) * (np.abs(Xa) @ np.abs(yv)) + 1e-30
        _close("matvec", _np(t).reshape(N, mcols), Xa @ yv, bound, _describe(c))
    if c.get("small_config") is not None:
        ws = fusedml.mmchain(X, y, v, z, **dict(kw, config=c["small_config"]))
        _check_unchanged(snap)
        ref, bound = _mmchain_reference(c, Xa, y, v, z, acc, mcols)
        _close("mmchain (unrolled, forced launch)", _np(ws).reshape(Dx, mcols), ref, bound, _describe(c))
    if c["bind"]:  # the bound product reads its operands' current contents
        for a in (y, v, z):
            if a is not None:
                a.copy_(torch.from_numpy(rng.uniform(-1, 1, size=tuple(a.shape))).to(a.dtype))
        ref, bound = _mmchain_reference(c, Xa, y, v, z, acc, mcols)
        _close("bind_mmchain (operands changed)", _np(op()).reshape(Dx, mcols), ref, bound, _describe(c))
    return "ok"


# ---------------------------------------------------------------------------------------------
# loss_gradient


def _ref_loss(loss, t, y, power):
    """float64 value and first derivative of the pointwise loss (the fused pass's definitions)."""
    if loss == "logistic":
        return np.logaddexp(0.0, t) - y * t, 1.0 / (1.0 + np.exp(-t)) - y
    if loss == "squared_hinge":
        zz = np.maximum(0.0, 1.0 - y * t)
        return zz * zz, np.where(zz > 0, 2.0 * (t - y), 0.0)
    if loss == "multinomial":
        mx = t.max(1, keepdims=True)
        lse = mx + np.log(np.exp(t - mx).sum(1, keepdims=True))
        val = -y * t
        val[:, :1] += lse
        return val, np.exp(t - lse) - y
    if loss == "poisson":
        return np.exp(t) - y * t, np.exp(t) - y
    if loss == "gamma":
        return t + y * np.exp(-t), 1.0 - y * np.exp(-t)
    if loss == "tweedie":
        a, b = np.exp((1 - power) * t), np.exp((2 - power) * t)
        return b / (2 - power) - y * a / (1 - power), b - y * a
    return 0.5 * (t - y) ** 2, t - y


def draw_loss_gradient(seed):
    """The configuration of loss_gradient case ``seed``."""
    rng = np.random.default_rng([3, seed])
    loss = str(rng.choice(["logistic", "squared_hinge", "multinomial", "poisson", "gamma", "tweedie",
                           "squared_error"]))
    sparse = rng.random() < 0.2
    m = int(rng.integers(2, 9)) if loss == "multinomial" else (None if rng.random() < 0.7 else int(rng.integers(1, 5)))
    c = dict(seed=seed, loss=loss, sparse=sparse, N=_size(rng, 1, 600), D=_size(rng, 1, 200), m=m,
             dtype=str(rng.choice(["float32", "float32", "float64", "bfloat16"])),
             intercept=bool(rng.random() < 0.5), weights=bool(rng.random() < 0.3), z=bool(rng.random() < 0.5),
             alpha=float(rng.choice([1.0, 0.5])), beta=float(rng.choice([0.0, 1e-2, 1.0])),
             power=float(rng.choice([1.2, 1.5, 1.8])) if loss == "tweedie" else None,
             objective=str(rng.choice(["none", "sum", "columns"])),
             backend=str(rng.choice(["fused", "fused", "cpu", "ops"])), deterministic=bool(rng.random() < 0.2))
    if sparse:
        c["container"], c["index"] = str(rng.choice(["scipy", "torch", "fusedml"])), str(rng.choice(["int32", "int64"]))
    else:
        c["layout"] = str(rng.choice(["contiguous", "contiguous", "colmajor", "rowstride"]))
    c["bind"] = bool(rng.random() < 0.25)  # bind_loss_gradient: two calls, W and z changed between them
    return c


def _clone_result(r):
    """A bound pass's result copied out of its persistent buffers."""
    return type(r)(*(None if a is None else a.clone() for a in r))


def _check_loss_result(c, r, Xa, W, y, sw, z, beta, acc, objective, who):
    """``r`` (a :class:`fusedml.LossGradient`) against float64 at ``W``, within rounding bounds."""
    loss = c["loss"]
    N, Dx = Xa.shape
    mc = c["m"] or 1
    Wv, yv = _np(W).reshape(Dx, mc), _np(y).reshape(N, mc)
    cw = np.ones(N) if sw is None else _np(sw)
    t, tabs = Xa @ Wv, np.abs(Xa) @ np.abs(Wv)
    val, g = _ref_loss(loss, t, yv, c["power"])
    # the pass's eta is off by up to e_t per entry: bound the loss and gradient by the reference's
    # own change over [t - e_t, t + e_t] plus the rounding of the values themselves
    uh = _half_ops(c)
    e_t = (_gamma(Dx, acc) + 4 * uh) * tabs + 4 * _EPS[acc] * np.abs(t)
    dv = np.zeros_like(val)
    dg = np.zeros_like(g)
    for sgn in (-1.0, 1.0):
        for shift in (e_t, np.where(np.arange(mc)[None, :] % 2 == 0, e_t, -e_t)):
            v2, g2 = _ref_loss(loss, t + sgn * shift, yv, c["power"])
            dv, dg = np.maximum(dv, np.abs(v2 - val)), np.maximum(dg, np.abs(g2 - g))
    if loss == "multinomial":  # every column's eta moves the softmax
        dg = dg + np.abs(g + yv) * e_t.sum(1, keepdims=True)
        dv = dv + e_t.sum(1, keepdims=True)
    tol = 64 * _EPS[acc] if acc == torch.float32 else 1e-13
    dv = dv + tol * (np.abs(val) + np.abs(yv * t) + 1.0)
    dg = dg + tol * (np.abs(g) + np.abs(yv) + 1.0)
    lref = (cw[:, None] * val).sum(0)
    lbound = (cw[:, None] * dv).sum(0) + _gamma(N, acc) * (cw[:, None] * np.abs(val)).sum(0)
    _close(who + ".loss", _np(r.loss).reshape(mc), lref, lbound, _describe(c))
    zz = np.zeros((Dx, mc)) if z is None else _np(z).reshape(Dx, mc)
    gref = c["alpha"] * Xa.T @ (cw[:, None] * g) + beta * zz
    gbound = c["alpha"] * (np.abs(Xa).T @ (cw[:, None] * (dg + (_gamma(N, acc) + 4 * uh) * np.abs(g)))) + \
        _gamma(2, acc) * np.abs(beta * zz) + 1e-30
    _close(who + ".grad", _np(r.grad).reshape(Dx, mc), gref, gbound, _describe(c))
    if r.eta is not None:
        _close(who + ".eta", _np(r.eta).reshape(N, mc), t, e_t + 1e-30, _describe(c))
    if objective is not None:
        pen = 0.5 * beta * (zz * zz).sum(0)
        oref = c["alpha"] * lref + pen
        ob = c["alpha"] * lbound + _gamma(Dx, acc) * np.abs(pen) + 1e-12
        if objective == "sum":
            oref, ob = oref.sum(keepdims=True), ob.sum(keepdims=True)
        _close(who + ".objective", _np(r.objective).reshape(-1), oref, ob, _describe(c))


def run_loss_gradient(c, device="cpu"):
    """Run loss_gradient case ``c`` against float64; raise :class:`FuzzFailure` if wrong."""
    import fusedml

    rng = np.random.default_rng([4, c["seed"]])
    dt = getattr(torch, c["dtype"])
    acc = torch.float64 if dt == torch.float64 else torch.float32
    N, D, loss = c["N"], c["D"], c["loss"]
    if c["sparse"]:
        X, Xr = _csr(rng, N, D, dt, c["container"], c["index"])
    else:
        X, Xr = _dense(rng, N, D, dt, c["layout"], scale=1.0 / np.sqrt(D))
    X = _to(X, device)
    Dx, mc = D + c["intercept"], c["m"] or 1
    mshape = () if c["m"] is None else (c["m"],)
    W = torch.from_numpy(rng.normal(size=(Dx, *mshape)) * 0.5).to(acc)
    if loss == "logistic":
        y = rng.random((N, mc)) < 0.5
    elif loss == "squared_hinge":
        y = np.where(rng.random((N, mc)) < 0.5, -1.0, 1.0)
    elif loss == "multinomial":
        y = np.eye(mc)[rng.integers(0, mc, size=N)]
    elif loss == "poisson":
        y = rng.poisson(1.0, size=(N, mc))
    elif loss in ("gamma", "tweedie"):
        y = rng.gamma(2.0, 0.5, size=(N, mc))
    else:
        y = rng.normal(size=(N, mc))
    y = torch.from_numpy(np.asarray(y, dtype=np.float64).reshape(N, *mshape)).to(acc)
    sw = torch.from_numpy(rng.uniform(0.2, 2.0, size=N)).to(acc) if c["weights"] else None
    z = torch.from_numpy(rng.normal(size=(Dx, *mshape))).to(acc) if c["z"] else None
    W, y, sw, z = (_to(a, device) for a in (W, y, sw, z))
    objective = None if c["objective"] == "none" else c["objective"]
    snap = _snapshot([X, W, y, sw, z])
    kw = dict(loss=loss, power=c["power"], sample_weight=sw, alpha=c["alpha"], z=z, beta=c["beta"] if z is not None
              else 0.0, intercept=c["intercept"], backend=c["backend"], deterministic=c["deterministic"],
              objective=objective)
    if c["bind"]:
        op = fusedml.bind_loss_gradient(X, W, y, **kw)
        r = _clone_result(op())
    else:
        r = fusedml.loss_gradient(X, W, y, **kw)
    _check_unchanged(snap)
    Xa = np.hstack([Xr, np.ones((N, 1))]) if c["intercept"] else Xr
    _check_loss_result(c, r, Xa, W, y, sw, z, kw["beta"], acc, objective, "loss_gradient")
    if c["deterministic"] and c["backend"] == "fused":
        r2 = op() if c["bind"] else fusedml.loss_gradient(X, W, y, **kw)
        if not (torch.equal(r.grad, r2.grad) and torch.equal(r.loss, r2.loss)):
            raise FuzzFailure(f"loss_gradient deterministic=True differs between two calls ({_describe(c)})")
    if c["bind"]:  # the bound pass reads W's and z's current contents
        for a in (W, z):
            if a is not None:
                a.copy_(torch.from_numpy(rng.normal(size=tuple(a.shape)) * 0.5).to(a.dtype))
        _check_loss_result(c, op(), Xa, W, y, sw, z, kw["beta"], acc, objective, "bind_loss_gradient (W changed)")
    return "ok"


# ---------------------------------------------------------------------------------------------
# Gaussian mixture: E-step statistics, scoring; k-means' Lloyd step


def draw_gmm(seed, op="gmm_estep"):
    """The configuration of GMM case ``seed``."""
    rng = np.random.default_rng([5, seed])
    cov = str(rng.choice(["full", "tied", "diag", "diag", "spherical"]))
    dmax = 24 if cov in ("full", "tied") else 80
    c = dict(seed=seed, op=op, cov=cov, N=_size(rng, 1, 500), D=_size(rng, 1, dmax), K=_size(rng, 1, 48),
             dtype=str(rng.choice(["float32", "float32", "float64", "bfloat16"])),
             layout=str(rng.choice(["contiguous", "contiguous", "colmajor", "rowstride"])),
             shift=float(rng.choice([0.0, 0.0, 50.0, 1e3])), weights=bool(rng.random() < 0.3),
             center=str(rng.choice(["means", "means", "other"])), empty=bool(rng.random() < 0.2),
             path=str(rng.choice(["auto", "auto", "single", "two_pass"])),
             backend=str(rng.choice(["fused", "fused", "fused", "cpu", "ops"])), log_prob=bool(rng.random() < 0.5))
    if c["dtype"] == "bfloat16":
        c["shift"] = min(c["shift"], 50.0)  # bf16 keeps 8 bits: 1e3 + N(0, 1) would lose the cluster
    # session 32's tensor-core form (precision "tf32x3" at 8 < K, D <= 16; its own stream, so the
    # cases drawn before keep their configuration)
    c["precision"] = "auto"
    r2 = np.random.default_rng([7, seed])
    if op == "gmm_estep" and cov == "diag" and c["backend"] == "fused" and r2.random() < 0.4:
        c.update(precision="tf32x3", D=int(r2.integers(9, 17)), K=int(r2.integers(9, 17)))
        if r2.random() < 0.7:  # the form's own path: fp32 rows (the other 30 % keep the drawn dtype, layout,
            # weights and per-row output: strided or non-fp32 X takes the register form)
            c.update(dtype="float32", weights=False, log_prob=False, empty=False, path="auto",
                     layout=str(r2.choice(["contiguous", "rowstride"])))
    return c


def _gmm_params(rng, c, Xr):
    K, D, cov = c["K"], c["D"], c["cov"]
    means = Xr[rng.integers(0, len(Xr), size=K)] + rng.normal(size=(K, D)) * 0.3
    if c["empty"] and K > 1:
        means[-1] += 1e4  # a component no point reaches: N_k underflows to 0
    w = rng.uniform(0.2, 1.0, size=K)
    w /= w.sum()
    if cov == "spherical":
        pc = rng.uniform(0.5, 2.0, size=K)
    elif cov == "diag":
        pc = rng.uniform(0.5, 2.0, size=(K, D))
    else:
        def chol():
            u = np.triu(rng.normal(size=(D, D)) * 0.2, 1)
            return u + np.diag(rng.uniform(0.5, 2.0, size=D))
        pc = chol() if cov == "tied" else np.stack([chol() for _ in range(K)])
    return w, means, pc


def _ref_log_gauss(Xr, means, pc, cov):
    """[N, K] float64 log N(x | mu_k, prec_chol_k) (scikit-learn's parametrisation)."""
    N, D = Xr.shape
    K = len(means)
    if cov == "full":
        logdet = np.log(np.stack([np.diag(p) for p in pc])).sum(1)
        maha = np.stack([(((Xr - means[k]) @ pc[k]) ** 2).sum(1) for k in range(K)], 1)
    elif cov == "tied":
        logdet = np.full(K, np.log(np.diag(pc)).sum())
        maha = np.stack([(((Xr - means[k]) @ pc) ** 2).sum(1) for k in range(K)], 1)
    elif cov == "diag":
        logdet = np.log(pc).sum(1)
        maha = np.stack([(((Xr - means[k]) * pc[k]) ** 2).sum(1) for k in range(K)], 1)
    else:
        logdet = D * np.log(pc)
        maha = np.stack([((Xr - means[k]) ** 2).sum(1) * pc[k] ** 2 for k in range(K)], 1)
    return -0.5 * (D * np.log(2 * np.pi) + maha) + logdet, maha


def run_gmm(c, device="cpu"):
    """Run GMM case ``c`` (``gmm_estep``, ``gmm_score`` or ``lloyd_step``) against float64."""
    import fusedml

    rng = np.random.default_rng([6, c["seed"]])
    dt = getattr(torch, c["dtype"])
    acc = torch.float64 if dt == torch.float64 else torch.float32
    N, D, K, cov = c["N"], c["D"], c["K"], c["cov"]
    X, Xr = _dense(rng, N, D, dt, c["layout"], shift=c["shift"])
    X = _to(X, device)
    w, means, pc = _gmm_params(rng, c, Xr)
    sw = rng.uniform(0.0, 2.0, size=N) if c["weights"] else None
    what = _describe(c)
    if c["backend"] == "fused":
        acc = torch.float32  # the fused GMM and Lloyd products are fp32 for every storage dtype
    tol = 2e-4 if acc == torch.float32 else 1e-9  # the 1e-4 target, with margin for bf16 rows
    if c["op"] == "lloyd_step":
        cen = means
        snap = _snapshot([X])
        st = fusedml.lloyd_step(X, torch.from_numpy(cen).to(acc).to(device), backend=c["backend"],
                                sample_weight=None if sw is None else torch.from_numpy(sw).to(acc).to(device))
        _check_unchanged(snap)
        d2 = ((Xr[:, None, :] - cen[None]) ** 2).sum(2)
        lab = _np(st.labels).astype(np.int64)
        # a label is right when its distance is within rounding of the minimum (ties)
        # expanded distances |x|^2 - 2 x.c + |c|^2 round relative to their terms
        dmin = d2.min(1)
        slack = 4 * _gamma(D + 4, acc) * ((Xr ** 2).sum(1) + (cen ** 2).sum(1).max()) + tol * (dmin + 1)
        if np.any(d2[np.arange(N), lab] > dmin + slack):
            raise FuzzFailure(f"lloyd_step: labels not nearest ({what})")
        s = np.ones(N) if sw is None else sw
        onehot = np.eye(K)[lab]
        cnt = (s[:, None] * onehot).sum(0)
        sums = onehot.T @ (s[:, None] * Xr)
        _close("lloyd_step.counts", st.counts, cnt, tol * (cnt + 1), what)
        _close("lloyd_step.sums", st.sums, sums, tol * (onehot.T @ (s[:, None] * np.abs(Xr)) + 1), what)
        return "ok"
    lg, maha = _ref_log_gauss(Xr, means, pc, cov)
    lw = lg + np.log(w)
    mx = lw.max(1, keepdims=True)
    lp = (mx + np.log(np.exp(lw - mx).sum(1, keepdims=True)))[:, 0]
    resp = np.exp(lw - lp[:, None])
    # the log-density's rounding grows with its terms (the quadratic about the means)
    e_lp = tol * (np.abs(lg) + maha + 1.0).max(1)
    args = [torch.from_numpy(a).to(device) for a in (w, means, pc)]
    snap = _snapshot([X, *args])
    if c["op"] == "gmm_score":
        out = fusedml.gmm_score(X, *args, cov, backend=c["backend"], path=c["path"])
        _check_unchanged(snap)
        lp_got, lab = out
        _close("gmm_score.log_prob", lp_got, lp, e_lp + 1e-12, what)
        lab = _np(lab).astype(np.int64)
        if np.any(lw[np.arange(N), lab] < mx[:, 0] - 2 * e_lp - 1e-9):
            raise FuzzFailure(f"gmm_score: arg-max not the most likely component ({what})")
        return "ok"
    center = means if c["center"] == "means" else means + rng.normal(size=means.shape)
    kw = dict(sample_weight=None if sw is None else torch.from_numpy(sw).to(device),
              center=None if c["center"] == "means" else torch.from_numpy(center).to(device),
              return_log_prob=c["log_prob"], backend=c["backend"], path=c["path"],
              precision=c.get("precision", "auto"))
    st = fusedml.gmm_estep(X, *args, cov, **kw)
    _check_unchanged(snap)
    s = np.ones(N) if sw is None else sw
    sr = s[:, None] * resp  # [N, K]
    xc = Xr[:, None, :] - center[None]  # [N, K, D]
    nk = sr.sum(0)
    s1 = (sr[:, :, None] * xc).sum(0)
    # responsibilities are off by up to r * e_lp (relative): bound the statistics with |terms|
    er = sr * (2 * e_lp[:, None]) + tol * sr
    # diag / spherical moments are taken about one global shift g and moved to c_k in float64
    # (fusedml/gmm/README.md, "Centring"): each moves by ~eps (|x - g|^2 + |c_k - g|^2) per unit of N_k
    g = (w[:, None] * means).sum(0)
    xg, cg = np.abs(Xr - g)[:, None, :], np.abs(center - g)[None]  # [N, 1, D], [1, K, D]
    flat = cov in ("diag", "spherical")
    cen1 = 8 * _EPS[acc] * (sr[:, :, None] * (xg + cg + 1.0)).sum(0) if flat else 0.0  # [K, D]
    cen_err = 8 * _EPS[acc] * (sr[:, :, None] * (xg ** 2 + cg ** 2 + 1.0)).sum(0) if flat else 0.0
    _close("gmm_estep.log_likelihood", st.log_likelihood.reshape(1), [(s * lp).sum()],
           [(s * (e_lp + tol * np.abs(lp))).sum() + 1e-12], what)
    _close("gmm_estep.nk", st.nk, nk, er.sum(0) + 1e-12, what)
    _close("gmm_estep.s1", st.s1, s1, (er[:, :, None] * np.abs(xc)).sum(0) + cen1 + 1e-12, what)
    sq = xc * xc
    if cov == "full" or cov == "tied":
        outer = np.einsum("nk,nkd,nke->kde", sr, xc, xc)
        bnd = np.einsum("nk,nkd,nke->kde", er, np.abs(xc), np.abs(xc))
        if cov == "tied":
            outer, bnd = outer.sum(0), bnd.sum(0)
    elif cov == "diag":
        outer, bnd = (sr[:, :, None] * sq).sum(0), (er[:, :, None] * sq).sum(0) + cen_err
    else:
        outer, bnd = (sr[:, :, None] * sq).sum((0, 2)), (er[:, :, None] * sq).sum((0, 2)) + cen_err.sum(1)
    _close("gmm_estep.s2", st.s2, outer, bnd + 1e-12, what)
    if c["log_prob"]:
        _close("gmm_estep.log_prob", st.log_prob, lp, e_lp + 1e-12, what)
    return "ok"


# ---------------------------------------------------------------------------------------------
# streamed (Dask) matrices: mmchain, matvec and the GMM E-step over row chunks


def draw_stream(seed):
    """The configuration of streaming case ``seed``: chunking, memory plan, operator."""
    rng = np.random.default_rng([9, seed])
    N = int(rng.integers(1, 400))
    cuts = np.sort(rng.choice(np.arange(1, N), size=min(N - 1, int(rng.integers(0, 6))), replace=False)) if N > 1 else []
    return dict(seed=seed, N=N, D=int(rng.integers(1, 40)), chunks=[int(x) for x in np.diff([0, *cuts, N])],
                sparse=bool(rng.random() < 0.35), dtype=str(rng.choice(["float32", "float64"])),
                op=str(rng.choice(["mmchain", "mmchain", "matvec", "gmm_estep"])),
                m=None if rng.random() < 0.7 else int(rng.integers(1, 5)), intercept=bool(rng.random() < 0.3),
                y_none=bool(rng.random() < 0.15), z=bool(rng.random() < 0.3),
                max_gpu_bytes=[None, 2000, 8000, 30000][int(rng.integers(0, 4))],
                host_cache=bool(rng.random() < 0.5), block_bytes=int(rng.choice([300, 1000, 1 << 20])),
                backend=str(rng.choice(["fused", "fused", "cpu", "ops"])), cov=str(rng.choice(["diag", "spherical",
                                                                                           "full", "tied"])),
                K=int(rng.integers(1, 6)))


def run_stream(c, device="cpu"):
    """Run streaming case ``c`` against float64 from the whole matrix."""
    import dask.array as da

    import fusedml
    from fusedml.streaming import StreamedMatrix

    rng = np.random.default_rng([10, c["seed"]])
    N, D = c["N"], c["D"]
    dt = np.float32 if c["dtype"] == "float32" else np.float64
    acc = torch.float32 if dt == np.float32 else torch.float64
    A = rng.normal(size=(N, D)).astype(dt)
    if c["sparse"]:
        import scipy.sparse as sp

        A[np.abs(A) < 0.8] = 0.0
        A[0] = 0.0  # an empty row
        blocks = np.split(A, np.cumsum(c["chunks"])[:-1])
        Xd = da.concatenate([da.from_array(sp.csr_matrix(b), chunks=b.shape, asarray=False) for b in blocks], axis=0)
    else:
        Xd = da.from_array(A, chunks=(tuple(c["chunks"]), D))
    Xr = A.astype(np.float64)
    try:
        S = StreamedMatrix(Xd, device=device, max_gpu_bytes=c["max_gpu_bytes"], host_cache=c["host_cache"],
                           block_bytes=c["block_bytes"])
    except ValueError as e:  # a budget below the two streaming slots: the smallest budget that streams
        import re

        m = re.search(r"cannot hold (\d+) streaming buffers of (\d+) bytes", str(e))
        if m is None:
            raise
        S = StreamedMatrix(Xd, device=device, max_gpu_bytes=int(1.5 * int(m.group(1)) * int(m.group(2))),
                           host_cache=c["host_cache"], block_bytes=c["block_bytes"])
    be = c["backend"] if not (str(device) != "cpu" and c["backend"] == "cpu") else "ops"
    what = _describe(c)
    tag = "ok-streamed" if S.resident_chunks < S.n_chunks else "ok-resident"
    Dx = D + c["intercept"]
    mcols = c["m"] or 1
    mshape = () if c["m"] is None else (c["m"],)
    if c["op"] == "gmm_estep" and not c["sparse"]:  # (CSR chunks: a TypeError, tested in test_streaming)
        K, cov = c["K"], c["cov"]
        w, means, pc = _gmm_params(rng, dict(K=K, D=D, cov=cov, empty=False), Xr)
        args = [torch.from_numpy(a) for a in (w, means, pc)]
        st = fusedml.gmm_estep(S, *args, cov, backend=be, center=torch.from_numpy(means))
        ref = fusedml.gmm_estep(torch.from_numpy(Xr), *args, cov, backend="cpu", center=torch.from_numpy(means))
        tol = 2e-4 if (dt == np.float32 or be == "fused") else 1e-9
        for name in ("log_likelihood", "nk", "s1", "s2"):
            a, b = _np(getattr(st, name)), _np(getattr(ref, name))
            scale = np.abs(b).max() + 1.0
            if np.abs(a - b).max() > tol * scale * max(1.0, np.sqrt(N)):
                raise FuzzFailure(f"stream gmm_estep.{name}: max diff {np.abs(a - b).max():.3e} ({what})")
        return tag
    y = None if c["y_none"] and c["op"] == "mmchain" else torch.from_numpy(rng.normal(size=(Dx, *mshape))).to(acc)
    v = torch.from_numpy(rng.uniform(-1, 2, size=N)).to(acc)
    if c["op"] in ("matvec", "gmm_estep"):
        t = fusedml.matvec(S, y, intercept=c["intercept"], backend=be)
        Xa = np.hstack([Xr, np.ones((N, 1))]) if c["intercept"] else Xr
        ref = Xa @ _np(y).reshape(Dx, mcols)
        bound = _gamma(Dx, acc) * (np.abs(Xa) @ np.abs(_np(y).reshape(Dx, mcols))) + 1e-30
        _close("stream matvec", _np(t).reshape(N, mcols), ref, bound, what)
        return tag
    if y is None:
        mcols = 1
    z = torch.from_numpy(rng.normal(size=(Dx, *(mshape if y is not None else ())))).to(acc) if c["z"] else None
    w = fusedml.mmchain(S, y, v, z, alpha=0.5, beta=-1.5 if z is not None else 0.0, intercept=c["intercept"],
                        backend=be)
    Xa = np.hstack([Xr, np.ones((N, 1))]) if c["intercept"] else Xr
    cc = dict(c, alpha=0.5, beta=-1.5 if z is not None else 0.0, v_op="mul", backend=be, dtype=c["dtype"])
    ref, bound = _mmchain_reference(cc, Xa, y, v, z, acc, mcols)
    _close("stream mmchain", _np(w).reshape(Dx, mcols), ref, bound, what)
    return tag


# ---------------------------------------------------------------------------------------------
# whole fits against scikit-learn on the same objective


def draw_fit(seed):
    """The configuration of estimator case ``seed``: a small random problem and options."""
    rng = np.random.default_rng([7, seed])
    est = str(rng.choice(["logistic", "logistic", "multinomial", "svc", "poisson", "gamma", "tweedie", "ridge",
                          "gmm"]))
    c = dict(seed=seed, est=est, N=int(rng.integers(30, 250)), D=int(rng.integers(1, 9)),
             container=str(rng.choice(["numpy", "numpy", "torch", "csr"])) if est != "gmm" else "numpy",
             dtype=str(rng.choice(["float32", "float64"])), weights=bool(rng.random() < 0.4),
             intercept=bool(rng.random() < 0.75), C=float(rng.choice([0.1, 1.0, 10.0])),
             alpha=float(rng.choice([1e-3, 0.1, 1.0])), strings=bool(rng.random() < 0.3),
             class_weight=str(rng.choice(["none", "none", "balanced"])), solver=str(rng.choice(["newton-cg", "lbfgs"])),
             backend=str(rng.choice(["fused", "fused", "cpu", "ops"])),
             cov=str(rng.choice(["full", "tied", "diag", "spherical"])), K=int(rng.integers(1, 4)))
    # gmm: clusters of spreads 1 / 0.1 / 0.01 up to 30 apart (a tight cluster far from the mixture
    # mean in its own spread: fp32 statistics lose digits there; drawn last, so older seeds keep their draws)
    c["multiscale"] = bool(rng.random() < 0.5) if est == "gmm" else False
    if est == "svc":
        c["intercept"] = False  # scikit-learn / LIBLINEAR penalise the intercept: same problem only without it
    return c


def _fit_data(c, rng):
    N, D = c["N"], c["D"]
    X = rng.normal(size=(N, D))
    w = rng.normal(size=D) / np.sqrt(D)
    eta = X @ w + (0.3 if c["intercept"] else 0.0)
    est = c["est"]
    if est in ("logistic", "svc"):
        y = (rng.random(N) < 1 / (1 + np.exp(-2 * eta))).astype(int)
        y[:2] = [0, 1]  # both classes present
    elif est == "multinomial":
        y = np.argmax(eta[:, None] * np.array([-1.0, 0.0, 1.0]) + rng.gumbel(size=(N, 3)), 1)
        y[:3] = [0, 1, 2]
    elif est == "poisson":
        y = rng.poisson(np.exp(0.5 * eta)).astype(float)
    elif est in ("gamma", "tweedie"):
        y = rng.gamma(2.0, np.exp(0.5 * eta) / 2.0)
    else:
        y = eta + 0.3 * rng.normal(size=N)
    if c["strings"] and est in ("logistic", "svc", "multinomial"):
        y = np.array(["cat", "dog", "emu"])[y]
    sw = rng.uniform(0.2, 3.0, size=N) if c["weights"] else None
    if c.get("multiscale"):
        K = max(c["K"], 2)
        centres = rng.normal(size=(K, D)) * rng.choice([1.0, 10.0, 30.0])
        spreads = rng.choice([1.0, 0.1, 0.01], size=K)
        z = np.arange(N) % K
        X = centres[z] + spreads[z, None] * X
    return X, y, sw


def run_fit(c, device="cpu"):
    """Fit case ``c`` with fusedml and scikit-learn; the models must agree (same objective)."""
    import warnings

    import algorithms as al
    import scipy.sparse as sp
    import sklearn.linear_model as sl
    import sklearn.mixture as sm
    import sklearn.svm as ss

    rng = np.random.default_rng([8, c["seed"]])
    X, y, sw = _fit_data(c, rng)
    what = _describe(c)
    est, be, icpt = c["est"], c["backend"], c["intercept"]
    dt = np.float32 if c["dtype"] == "float32" else np.float64
    Xin = X.astype(dt)
    if c["container"] == "torch":
        Xin = torch.from_numpy(Xin)
    elif c["container"] == "csr":
        Xin = sp.csr_matrix(np.where(np.abs(Xin) < 0.5, 0.0, Xin).astype(dt))
        X = Xin.toarray().astype(np.float64)
    Xin = _to(Xin, device)
    cw = None if c["class_weight"] == "none" else "balanced"
    if est == "gmm":
        K = c["K"]
        ours = al.GaussianMixture(K, covariance_type=c["cov"], tol=1e-8, max_iter=300, random_state=0,
                                  reg_covar=1e-6, backend=be)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours.fit(Xin)
            # the same tolerance as ours: where EM crawls (changes ~tol for thousands of iterations)
            # float64 EM stops near our point too; an early stop (fp32 noise) lets it climb on
            ref = sm.GaussianMixture(K, covariance_type=c["cov"], tol=1e-8, max_iter=1000, reg_covar=1e-6,
                                     weights_init=_np(ours.weights_) / _np(ours.weights_).sum(), means_init=_np(ours.means_),
                                     precisions_init=_np(ours.precisions_)).fit(X)
        # scikit-learn's EM (same tol) started from our converged parameters must not climb much higher
        ll_ref = float(ref.score(X))
        ll_at_ours = _gmm_score_np(X, ours)
        slack = (1e-3 if dt == np.float32 else 1e-5) * (1 + abs(ll_ref))
        if ours.converged_ and ll_at_ours < ll_ref - slack:  # (EM can crawl past max_iter: overlapping components)
            raise FuzzFailure(f"fit gmm: log-likelihood {ll_at_ours} below scikit-learn's {ll_ref} from our "
                              f"solution ({what})")
        if abs(float(ours.score(Xin)) - ll_at_ours) > 1e-4 * (1 + abs(ll_at_ours)):
            raise FuzzFailure(f"fit gmm: score() {float(ours.score(Xin))} != float64 {ll_at_ours} ({what})")
        proba, lab = _np(ours.predict_proba(Xin)), _np(ours.predict(Xin)).astype(np.int64)
        p_lab = proba[np.arange(len(lab)), lab]
        if np.abs(proba.sum(1) - 1).max() > 1e-5 or np.any(p_lab < proba.max(1) - 1e-5):
            raise FuzzFailure(f"fit gmm: predict_proba rows do not sum to 1 or predict is not their arg-max ({what})")
        return "ok"
    tol = 1e-8 if dt == np.float64 else 1e-6
    if est in ("logistic", "multinomial"):
        ours = al.LogisticRegression(C=c["C"], fit_intercept=icpt, tol=tol, max_iter=500, solver=c["solver"],
                                     class_weight=cw, backend=be)
        ref = sl.LogisticRegression(C=c["C"], fit_intercept=icpt, tol=1e-12, max_iter=10000, class_weight=cw)
    elif est == "svc":
        ours = al.LinearSVC(C=c["C"], fit_intercept=False, tol=tol, max_iter=500, class_weight=cw, backend=be)
        ref = ss.LinearSVC(C=c["C"], fit_intercept=False, tol=1e-12, max_iter=100000, class_weight=cw, dual=False)
    elif est == "ridge":
        ours = al.Ridge(alpha=c["alpha"] * len(y), fit_intercept=icpt, tol=1e-10, backend=be)
        ref = sl.Ridge(alpha=c["alpha"] * len(y), fit_intercept=icpt, tol=1e-12, solver="cholesky")
    else:
        kw = dict(alpha=c["alpha"], fit_intercept=icpt, tol=tol, max_iter=500, backend=be)
        kref = dict(alpha=c["alpha"], fit_intercept=icpt, tol=1e-12, max_iter=10000)
        ours, ref = {"poisson": (al.PoissonRegressor(**kw), sl.PoissonRegressor(**kref)),
                     "gamma": (al.GammaRegressor(**kw), sl.GammaRegressor(**kref)),
                     "tweedie": (al.TweedieRegressor(power=1.5, **kw), sl.TweedieRegressor(power=1.5, link="log",
                                                                                           **kref))}[est]
    snap = _snapshot([Xin, y, sw])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours.fit(Xin, y, sample_weight=sw)
        ref.fit(X, y, sample_weight=sw)
    _check_unchanged(snap)
    cf, cr = _np(ours.coef_).ravel(), np.asarray(ref.coef_, dtype=np.float64).ravel()
    scale = max(1.0, np.abs(cr).max())
    rtol = 2e-3 if dt == np.float32 else 1e-4
    if np.abs(cf - cr).max() > rtol * scale:
        raise FuzzFailure(f"fit {est}: coef {cf[:4]} vs scikit-learn {cr[:4]} (max diff "
                          f"{np.abs(cf - cr).max():.2e}) ({what})")
    if icpt:
        bi, br = _np(ours.intercept_).ravel(), np.atleast_1d(np.asarray(ref.intercept_, dtype=np.float64))
        if np.abs(bi - br).max() > rtol * max(1.0, np.abs(br).max()):
            raise FuzzFailure(f"fit {est}: intercept {bi} vs scikit-learn {br} ({what})")
    if est in ("logistic", "multinomial", "svc"):
        pred = ours.predict(Xin)
        pred = pred.cpu().numpy() if isinstance(pred, torch.Tensor) else np.asarray(pred)
        agree = np.mean(pred.astype(str) == np.asarray(ref.predict(X)).astype(str))
        if agree < 0.98:
            raise FuzzFailure(f"fit {est}: predictions agree on {agree:.1%} only ({what})")
        # the estimator's own outputs agree with each other: predict is the arg-max of
        # decision_function (and of predict_proba, whose rows sum to one)
        classes = np.asarray(_np(ours.classes_) if isinstance(ours.classes_, torch.Tensor) else ours.classes_)
        dec = _np(ours.decision_function(Xin))
        top = (dec > 0).astype(int) if dec.ndim == 1 else dec.argmax(1)
        if not np.array_equal(classes[top].astype(str), pred.astype(str)):
            raise FuzzFailure(f"fit {est}: predict is not the arg-max of decision_function ({what})")
        if est != "svc":
            proba = _np(ours.predict_proba(Xin))
            if np.abs(proba.sum(1) - 1).max() > 1e-5 or not np.array_equal(classes[proba.argmax(1)].astype(str),
                                                                             pred.astype(str)):
                raise FuzzFailure(f"fit {est}: predict_proba rows do not sum to 1 or disagree with predict ({what})")
    return "ok"


def _gmm_score_np(X, gm):
    """float64 mean log-likelihood of X under a fitted fusedml GaussianMixture."""
    w, mu, pc = _np(gm.weights_), _np(gm.means_), _np(gm.precisions_cholesky_)
    lg, _ = _ref_log_gauss(X, mu, pc, gm.covariance_type)
    lw = lg + np.log(w)
    mx = lw.max(1, keepdims=True)
    return float(np.mean(mx[:, 0] + np.log(np.exp(lw - mx).sum(1))))


# ---------------------------------------------------------------------------------------------
# driver


def _describe(c):
    return ", ".join(f"{k}={v}" for k, v in c.items())


DRAW = {"mmchain": draw_mmchain, "loss_gradient": draw_loss_gradient, "gmm_estep": draw_gmm,
        "gmm_score": lambda s: draw_gmm(s, "gmm_score"), "lloyd_step": lambda s: draw_gmm(s, "lloyd_step"),
        "stream": draw_stream, "fit": draw_fit}
RUN = {"mmchain": run_mmchain, "loss_gradient": run_loss_gradient, "gmm_estep": run_gmm, "gmm_score": run_gmm,
       "lloyd_step": run_gmm, "stream": run_stream, "fit": run_fit}


def run_case(op, seed, device="cpu"):
    """Draw and run case ``seed`` of ``op``; returns ``(config, tag)`` or raises :class:`FuzzFailure`."""
    c = DRAW[op](seed)
    if str(device) != "cpu" and c.get("backend") == "cpu":
        c["backend"] = "ops"  # device data: the host path does not apply
    return c, RUN[op](c, device)


def main(argv=None):
    """Command line: run ``--n`` cases per operator from ``--seed`` on; exit 1 on any failure."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50, help="cases per operator")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--case", nargs="+", help="replay these cases, OP:SEED ...")
    ap.add_argument("--stop", action="store_true", help="stop at the first failure")
    ap.add_argument("--with", dest="with_key", default=None, metavar="KEY",
                    help="only the drawn cases whose KEY is set (e.g. small_config): the first --n such seeds")
    ap.add_argument("--aot", action="store_true",
                    help="also compile every distinct kernel launch of the cases for sm_90 (CPU only): a launch "
                         "that fails to compile is a failure; spills inside a loop are listed (AOT SPILL)")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if a.case:
        todo = [(c.split(":")[0], int(c.split(":")[1])) for c in a.case]
    elif a.with_key:  # scan seeds for cases that draw the key
        todo = []
        for op in a.ops:
            hits = (s for s in range(a.seed, a.seed + 1000 * a.n) if DRAW[op](s).get(a.with_key))
            todo += [(op, s) for s, _ in zip(hits, range(a.n))]
    else:
        todo = [(op, s) for s in range(a.seed, a.seed + a.n) for op in a.ops]
    fails, tags, t0 = [], {}, time.time()
    if a.aot:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _sm90 import record_launches

        rec = record_launches().__enter__()
    for op, s in todo:
        if a.aot:
            rec.origin = f"{op}:{s}"
        try:
            _, tag = run_case(op, s, a.device)
            tags[tag] = tags.get(tag, 0) + 1
        except Exception as e:  # noqa: BLE001 -- every failure is reported with its case
            fails.append((op, s))
            print(f"FAIL {op}:{s}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
            if not isinstance(e, FuzzFailure):
                traceback.print_exc(limit=-4)
            if a.stop:
                break
    print(f"{len(todo) - len(fails)} of {len(todo)} cases passed in {time.time() - t0:.0f} s {tags}; "
          f"failed: {' '.join(f'{o}:{s}' for o, s in fails) or 'none'}")
    if a.aot:
        rec.__exit__(None, None, None)
        from _sm90 import compile_descriptors

        results = compile_descriptors(rec.launches)
        bad = [r for r in results if "error" in r]
        spills = [r for r in results if "error" not in r and r["loop_spills"]]
        print(f"sm_90 compiles: {len(results)} distinct launches, {len(bad)} failed, {len(spills)} spill in a loop")
        for r in spills:
            print(f"AOT SPILL {r}")
        for r in bad:
            print(f"AOT FAIL {r}", flush=True)
        return 1 if fails or bad else 0
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
