"""StreamedMatrix: streaming the fused operators over row-chunked Dask arrays (CPU engine)."""
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

da = pytest.importorskip("dask.array")

import fusedml  # noqa: E402
from fusedml.mmchain import matvec, mmchain  # noqa: E402
from fusedml.streaming import StreamedMatrix, is_dask_array  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)


def dense_data(rng, n=403, d=7, dtype=np.float64):
    return rng.normal(size=(n, d)).astype(dtype)


def csr_data(rng, n=301, d=23):
    A = sp.random(n, d, density=0.15, random_state=np.random.RandomState(3), format="csr")
    A = A.tolil()
    A[5, :] = 0  # an empty row
    A[7, :] = rng.normal(size=d)  # a full row
    return A.tocsr().astype(np.float64)


# (max_gpu_bytes, host_cache, block_bytes): all resident; nothing resident cached; part resident
# re-read in small blocks.
PLANS = {
    "resident": dict(max_gpu_bytes=None, host_cache=True, block_bytes=1 << 20),
    "streamed-cached": dict(max_gpu_bytes=4000, host_cache=True, block_bytes=1000),
    "partly-resident-reread": dict(max_gpu_bytes=10000, host_cache=False, block_bytes=700),
}


@pytest.mark.parametrize("plan", PLANS, ids=list(PLANS))
@pytest.mark.parametrize("chunks", [50, 130, 403], ids=lambda c: f"rows{c}")
def test_dense_mmchain_matches_reference(rng, plan, chunks):
    A = dense_data(rng)
    X = da.from_array(A, chunks=(chunks, 7))
    S = StreamedMatrix(X, device="cpu", **PLANS[plan])
    y, v, z = rng.normal(size=7), rng.random(403), rng.normal(size=7)
    w = mmchain(S, y, v, z, alpha=0.5, beta=-2.0, backend="cpu")
    assert rel(w, 0.5 * A.T @ (v * (A @ y)) - 2.0 * z) < 1e-12
    t = matvec(S, y, backend="cpu")
    assert t.shape == (403,) and rel(t, A @ y) < 1e-12
    # X^T v form, intercept, matrix y
    assert rel(mmchain(S, None, v, backend="cpu"), A.T @ v) < 1e-12
    Y = rng.normal(size=(8, 3))
    Ai = np.hstack([A, np.ones((403, 1))])
    w3 = mmchain(S, Y, v, intercept=True, backend="cpu")
    assert w3.shape == (8, 3) and rel(w3, Ai.T @ (v[:, None] * (Ai @ Y))) < 1e-12
    if plan != "resident":
        assert S.resident_chunks < S.n_chunks and S.stats.blocks > S.resident_chunks


def test_plan_keeps_resident_prefix_and_rereads_rest(rng):
    A = dense_data(rng, n=400, d=5)
    X = da.from_array(A, chunks=(50, 5))  # 8 chunks of 2000 bytes
    S = StreamedMatrix(X, device="cpu", max_gpu_bytes=8000, host_cache=False, block_bytes=1000)
    # 2 slots of 1000 bytes reserved; 3 chunks (6000 bytes) resident.
    assert S.resident_chunks == 3 and S.resident_bytes == 6000 and S.streamed_bytes == 10000
    y = rng.normal(size=5)
    for _ in range(2):  # an iterative solver: the rest is re-read on every call
        w = mmchain(S, y, backend="cpu")
        # the resident prefix is ONE block (one operator call), then 5 chunks of 2 blocks each
        assert S.stats.reread_chunks == 5 and S.stats.blocks == 1 + 5 * 2
        assert rel(w, A.T @ (A @ y)) < 1e-12
    S.close()


def test_float32_and_storage_dtype(rng):
    A = dense_data(rng, dtype=np.float32)
    X = da.from_array(A, chunks=(100, 7))
    y, v = rng.normal(size=7).astype(np.float32), rng.random(403).astype(np.float32)
    ref = A.astype(np.float64).T @ (v * (A.astype(np.float64) @ y))
    S = StreamedMatrix(X, device="cpu", max_gpu_bytes=3000, block_bytes=800)
    w = mmchain(S, y, v, backend="cpu")
    assert w.dtype == torch.float32 and rel(w, ref) < 1e-5
    S16 = StreamedMatrix(X, device="cpu", dtype=torch.float16)
    assert S16.dtype == torch.float16 and S16.nbytes == 403 * 7 * 2
    A16 = A.astype(np.float16).astype(np.float64)
    assert rel(mmchain(S16, y, v, backend="cpu"), A16.T @ (v * (A16 @ y))) < 1e-5


@pytest.mark.parametrize("plan", PLANS, ids=list(PLANS))
def test_csr_chunks(rng, plan):
    A = csr_data(rng)
    X = da.from_array(A, chunks=(60, 23))
    assert isinstance(X._meta, sp.spmatrix) or sp.issparse(X._meta)
    kw = dict(PLANS[plan])
    if kw["max_gpu_bytes"] is not None:
        kw["max_gpu_bytes"] = kw["max_gpu_bytes"] // 2
        kw["block_bytes"] = 300
    S = StreamedMatrix(X, device="cpu", **kw)
    assert S.is_sparse
    y, v = rng.normal(size=23), rng.random(301)
    assert rel(mmchain(S, y, v, backend="cpu"), A.T @ (v * (A @ y))) < 1e-12
    assert rel(matvec(S, y, backend="cpu"), A @ y) < 1e-12
    assert rel(mmchain(S, y, v, backend="ops"), A.T @ (v * (A @ y))) < 1e-12


def test_fused_backend_under_interpreter(rng):
    """The fused kernels run on each streamed block (tiny: the interpreter is slow)."""
    A = dense_data(rng, n=40, d=3, dtype=np.float32)
    S = StreamedMatrix(da.from_array(A, chunks=(15, 3)), device="cpu", max_gpu_bytes=400, block_bytes=100)
    y, v = rng.normal(size=3).astype(np.float32), rng.random(40).astype(np.float32)
    Ad = A.astype(np.float64)
    assert rel(mmchain(S, y, v, backend="fused"), Ad.T @ (v * (Ad @ y))) < 1e-5
    B = csr_data(rng, n=30, d=6)
    Sb = StreamedMatrix(da.from_array(B, chunks=(11, 6)), device="cpu", max_gpu_bytes=300, block_bytes=120)
    y6, v30 = rng.normal(size=6), rng.random(30)
    assert rel(mmchain(Sb, y6, v30, backend="fused"), B.T @ (v30 * (B @ y6))) < 1e-12


@pytest.mark.parametrize("dtype,width", [(np.float32, 16), (np.float64, 14)])
def test_resident_rows_padded_to_whole_vectors(rng, monkeypatch, dtype, width):
    """``align_rows=True``: the resident rows of 13 values padded to whole 16-byte vectors (zeros in
    the padding, counted in the budget), read by the fused kernels (interpreted) in whole vectors with
    the in-memory results; the streamed rest as it is. "auto" pads on CUDA devices only; a budget
    that holds X only unpadded keeps it all resident, unpadded."""
    from fusedml.gmm import gmm_estep
    from fusedml.mmchain.dense import _vec
    from fusedml.streaming import options

    n, d, esz = 200, 13, np.dtype(dtype).itemsize
    A = rng.normal(size=(n, d)).astype(dtype)
    X = da.from_array(A, chunks=(50, d))
    y, v = rng.normal(size=d).astype(dtype), rng.random(n).astype(dtype)
    Ad = A.astype(np.float64)
    want = Ad.T @ (v * (Ad @ y))
    K = 3
    w, mu, pc = np.full(K, 1.0 / K), rng.normal(size=(K, d)), rng.uniform(0.5, 2.0, size=(K, d))
    gref = gmm_estep(torch.from_numpy(Ad), w, mu, pc, "diag", backend="cpu")
    S = StreamedMatrix(X, device="cpu", align_rows=True)
    R = S.resident_matrix
    assert S.resident_rows == n and R.shape == (n, d) and R.stride() == (width, 1) and _vec(R, d) == -(16 // esz)
    assert torch.equal(R, torch.from_numpy(A)) and S.resident_bytes == n * width * esz
    assert torch.all(torch.as_strided(R, (n, width), (width, 1))[:, d:] == 0)
    assert rel(mmchain(S, y, v, backend="fused"), want) < 1e-5
    g = gmm_estep(S, w, mu, pc, "diag", backend="fused")
    assert rel(g.nk, gref.nk) < 1e-5 and rel(g.s1, gref.s1) < 1e-5 and rel(g.s2, gref.s2) < 1e-5
    # part resident: 3 chunks of 50 unpadded rows fit beside the two 1000-byte slots, only 2 padded
    budget = 2 * 1000 + 3 * 50 * d * esz
    kw = dict(device="cpu", max_gpu_bytes=budget, block_bytes=1000, host_cache=True)
    assert StreamedMatrix(X, align_rows=False, **kw).resident_chunks == 3
    S = StreamedMatrix(X, align_rows=True, **kw)
    assert S.resident_chunks == 2 and S.resident_matrix.stride() == (width, 1)
    assert S.streamed_bytes == 2 * 50 * d * esz
    assert rel(mmchain(S, y, v, backend="fused"), want) < 1e-5
    # all of X fits only unpadded: all resident, unpadded
    S = StreamedMatrix(X, device="cpu", max_gpu_bytes=n * d * esz + 8, align_rows=True)
    assert S.resident_chunks == 4 and S.resident_matrix.stride() == (d, 1)
    assert StreamedMatrix(X, device="cpu").resident_matrix.stride() == (d, 1)  # "auto": CUDA devices only
    with options(align_rows=True):
        assert StreamedMatrix(X, device="cpu").resident_matrix.stride() == (width, 1)
    with pytest.raises(ValueError, match="align_rows"):
        StreamedMatrix(X, device="cpu", align_rows="yes")


def _odd_layout(b, block_info=None):
    """Chunk i of X as read-only, column-major, byte-swapped or negatively strided rows (same values)."""
    i = block_info[0]["chunk-location"][0] % 4
    if i == 0:
        b = b.copy()
        b.flags.writeable = False
        return b
    if i == 1:
        return np.asfortranarray(b)
    if i == 2:
        return b.astype(b.dtype.newbyteorder())
    return np.flipud(np.flipud(b).copy())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
@pytest.mark.parametrize("align", [False, True])
def test_chunks_of_any_layout(rng, align, device):
    """Chunks that are read-only, column-major, byte-swapped or negatively strided, float64 stored as
    float32: the resident rows (padded or not) and the streamed blocks hold their values, one host
    pass per chunk; the chunks stay as they were."""
    n, d = 160, 13
    A = rng.normal(size=(n, d))
    X = da.from_array(A, chunks=(20, d)).map_blocks(_odd_layout, dtype=A.dtype)
    y, v = rng.normal(size=d), rng.random(n)
    want = A.T @ (v * (A @ y))
    budget = 2 * 1000 + 4 * 20 * 16 * 4  # four resident chunks (padded or not) beside two 1000-byte slots
    for kw in (dict(), dict(max_gpu_bytes=budget, block_bytes=1000, host_cache=True),
               dict(max_gpu_bytes=budget, block_bytes=1000, host_cache=False)):
        S = StreamedMatrix(X, device=device, dtype=torch.float32, align_rows=align, **kw)
        R = S.resident_matrix
        assert R.dtype == torch.float32 and R.stride(0) == (16 if align else d)
        assert torch.equal(R.cpu(), torch.from_numpy(A[:S.resident_rows].astype(np.float32)))
        assert torch.all(torch.as_strided(R, (R.shape[0], R.stride(0)), (R.stride(0), 1))[:, d:] == 0)
        assert S.resident_rows == (n if not kw else 80) and S.streamed_bytes == (n - S.resident_rows) * d * 4
        be = "cpu" if device == "cpu" else "fused"
        for _ in range(2):  # the second call re-reads the chunks not cached
            yt, vt = (torch.tensor(a, dtype=torch.float32, device=device) for a in (y, v))
            assert rel(mmchain(S, yt, vt, backend=be).cpu(), want) < 1e-5


def test_integer_and_boolean_chunks(rng):
    """Integer and boolean dense chunks are stored as float64 (or the dtype asked for), resident and
    streamed, as the estimators take in-memory integers; sparse integer chunks are an error."""
    A = rng.integers(-3, 4, size=(90, 5))
    y = rng.normal(size=5)
    for a, want_dtype, kw in ((A, torch.float64, {}), (A > 0, torch.float64, {}), (A, torch.float32, {"dtype": torch.float32})):
        for budget in (None, 2 * 400 + 30 * 5 * 8):  # all resident; 30 rows resident, the rest streamed
            S = StreamedMatrix(da.from_array(a, chunks=(30, 5)), device="cpu", max_gpu_bytes=budget, block_bytes=400, **kw)
            assert S.dtype == want_dtype
            ad = a.astype(np.float64)
            assert rel(mmchain(S, y, backend="cpu"), ad.T @ (ad @ y)) < 1e-6
    Xs = da.from_array(A, chunks=(30, 5)).map_blocks(sp.csr_matrix, meta=sp.csr_matrix((0, 5), dtype=np.int64))
    with pytest.raises(TypeError, match="float16/float32/float64"):
        StreamedMatrix(Xs, device="cpu")


def test_independent_of_chunking_and_scheduler(rng):
    A = dense_data(rng, n=500, d=6)
    y, v = rng.normal(size=6), rng.random(500)
    results = []
    for chunks, sched in [(500, "sync"), (37, "threads"), (128, "sync"), (64, "threads")]:
        S = StreamedMatrix(da.from_array(A, chunks=(chunks, 6)), device="cpu", scheduler=sched,
                           max_gpu_bytes=6000, host_cache=False, block_bytes=1200)
        results.append(mmchain(S, y, v, backend="cpu").numpy())
    for r in results[1:]:
        assert rel(r, results[0]) < 1e-13
    # same chunking and plan twice: bitwise identical (fixed block order)
    S = StreamedMatrix(da.from_array(A, chunks=(37, 6)), device="cpu", max_gpu_bytes=6000, block_bytes=1200)
    assert torch.equal(mmchain(S, y, v, backend="cpu"), mmchain(S, y, v, backend="cpu"))


def test_column_chunked_input_is_merged(rng):
    A = dense_data(rng, n=100, d=8)
    S = StreamedMatrix(da.from_array(A, chunks=(30, 3)), device="cpu")
    assert S.to_dask().chunks[1] == (8,)
    y = rng.normal(size=8)
    assert rel(matvec(S, y, backend="cpu"), A @ y) < 1e-12


def test_unknown_chunk_sizes(rng):
    A = dense_data(rng, n=90, d=4)
    X = da.from_array(A, chunks=(20, 4))
    Xu = X[X[:, 0] > -10]  # boolean mask: NaN chunk sizes, all rows kept
    assert any(np.isnan(c) for c in Xu.chunks[0])
    S = StreamedMatrix(Xu, device="cpu", max_gpu_bytes=1500, block_bytes=300)
    y = rng.normal(size=4)
    assert S.shape == (90, 4) and rel(matvec(S, y, backend="cpu"), A @ y) < 1e-12


def test_memory_mapped_npy_reread(tmp_path, rng):
    A = dense_data(rng, n=300, d=5, dtype=np.float32)
    path = tmp_path / "x.npy"
    np.save(path, A)
    mm = np.load(path, mmap_mode="r")
    X = da.from_array(mm, chunks=(64, 5))
    S = StreamedMatrix(X, device="cpu", max_gpu_bytes=2600, host_cache=False, block_bytes=600)
    y = rng.normal(size=5).astype(np.float32)
    w1 = mmchain(S, y, backend="cpu")
    assert S.stats.reread_chunks > 0
    assert rel(w1, A.astype(np.float64).T @ (A.astype(np.float64) @ y)) < 1e-5
    assert torch.equal(w1, mmchain(S, y, backend="cpu"))
    S.close()


def test_gmm_estep_and_score_sum_over_chunks(rng):
    from fusedml.gmm import gmm_estep, gmm_score

    A = np.concatenate([rng.normal(size=(150, 3)), rng.normal(size=(120, 3)) + 3.0])
    K = 2
    w = np.array([0.4, 0.6])
    mu = np.stack([A[:150].mean(0), A[150:].mean(0)])
    pc = np.ones((K, 3)) * 0.9
    sw = rng.random(270)
    ref = gmm_estep(torch.from_numpy(A), w, mu, pc, "diag", sample_weight=sw, return_log_prob=True, backend="cpu")
    S = StreamedMatrix(da.from_array(A, chunks=(61, 3)), device="cpu", max_gpu_bytes=3000, block_bytes=700)
    st = gmm_estep(S, w, mu, pc, "diag", sample_weight=sw, return_log_prob=True, backend="cpu")
    for name in ("nk", "s1", "s2", "log_likelihood", "log_prob"):
        assert rel(getattr(st, name), getattr(ref, name)) < 1e-12, name
    st = gmm_estep(S, w, mu, pc, "diag", sample_weight=sw, backend="ops", precision="fp64")  # float64 per chunk
    for name in ("nk", "s1", "s2", "log_likelihood"):
        assert rel(getattr(st, name), getattr(ref, name)) < 1e-12, name
    lp, lab = S._fusedml_gmm_score(w, mu, pc, "diag", backend="cpu")
    lp_ref, lab_ref = gmm_score(torch.from_numpy(A), w, mu, pc, "diag", backend="cpu")
    assert rel(lp, lp_ref) < 1e-12 and torch.equal(lab, lab_ref)


def test_map_blocks_and_take_rows(rng):
    A = dense_data(rng, n=120, d=4)
    S = StreamedMatrix(da.from_array(A, chunks=(25, 4)), device="cpu", max_gpu_bytes=1800, block_bytes=400)
    colsum = S.map_blocks(lambda Xb, rows: Xb.sum(0), "sum")
    assert rel(colsum, A.sum(0)) < 1e-12
    norms = S.map_blocks(lambda Xb, rows: (Xb * Xb).sum(1), "concat")
    assert rel(norms, (A * A).sum(1)) < 1e-12
    idx = [5, 119, 5, 0]
    assert np.array_equal(S.take_rows(idx).numpy(), A[idx])
    with pytest.raises(ValueError, match="reduce"):
        S.map_blocks(lambda Xb, rows: Xb.sum(0), "max")
    with pytest.raises(IndexError):
        S.take_rows([120])


def test_is_dask_array(rng):
    A = dense_data(rng, n=10, d=2)
    assert is_dask_array(da.from_array(A))
    assert not is_dask_array(A) and not is_dask_array(torch.from_numpy(A))


def test_bad_inputs(rng):
    A = dense_data(rng, n=50, d=4)
    X = da.from_array(A, chunks=(20, 4))
    with pytest.raises(TypeError, match="dask"):
        StreamedMatrix(A)
    with pytest.raises(ValueError, match="2-D"):
        StreamedMatrix(da.from_array(A[:, 0]))
    with pytest.raises(TypeError, match="float"):
        StreamedMatrix(da.from_array(np.arange(12).reshape(6, 2).astype(np.complex64), chunks=(3, 2)))
    with pytest.raises(ValueError, match="empty"):
        StreamedMatrix(da.zeros((0, 3), chunks=(5, 3)))
    with pytest.raises(ValueError, match="max_gpu_bytes"):
        StreamedMatrix(X, device="cpu", max_gpu_bytes=100, block_bytes=1000)
    with pytest.raises(ValueError, match="host_cache"):
        StreamedMatrix(X, host_cache="sometimes")
    bad = A.copy()
    bad[33, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        StreamedMatrix(da.from_array(bad, chunks=(20, 4)), device="cpu")
    S_bad = StreamedMatrix(da.from_array(bad, chunks=(20, 4)), device="cpu", max_gpu_bytes=700,
                           block_bytes=320, host_cache=False)  # NaN chunk not read yet: found on first read
    with pytest.raises(ValueError, match="NaN"):
        matvec(S_bad, np.ones(4), backend="cpu")
    S = StreamedMatrix(X, device="cpu")
    with pytest.raises(ValueError, match="v must have N=50"):
        mmchain(S, np.ones(4), np.ones(49), backend="cpu")
    with pytest.raises(ValueError, match="y must have 4 rows"):
        mmchain(S, np.ones(5), backend="cpu")
    with pytest.raises(ValueError, match="v is required"):
        mmchain(S, None, backend="cpu")
    with pytest.raises(ValueError, match="z must have shape"):
        mmchain(S, np.ones(4), z=np.ones(3), beta=1.0, backend="cpu")
    with pytest.raises(ValueError, match="NaN"):
        mmchain(S, np.array([1.0, np.nan, 0, 0]), check_finite=True, backend="cpu")
    coo = da.from_array(sp.random(20, 5, density=0.3, format="csr", random_state=0), chunks=(10, 5))
    coo = coo.map_blocks(lambda b: b.tocoo(), dtype=np.float64, meta=sp.coo_matrix((0, 0)))
    with pytest.raises(TypeError, match="coo"):
        StreamedMatrix(coo, device="cpu")
    Ssp = StreamedMatrix(da.from_array(csr_data(rng, n=30, d=4), chunks=(10, 4)), device="cpu")
    with pytest.raises(TypeError, match="dense"):
        fusedml.gmm.gmm_estep(Ssp, np.ones(1), np.zeros((1, 4)), np.ones((1, 4)), "diag")


def test_options_context_sets_defaults(rng):
    from fusedml.streaming import options

    A = dense_data(rng, n=200, d=4)
    X = da.from_array(A, chunks=(50, 4))
    with options(max_gpu_bytes=3000, block_bytes=500, host_cache=False):
        S = StreamedMatrix(X, device="cpu")
    assert S.resident_chunks == 1 and not S.host_cache
    assert StreamedMatrix(X, device="cpu").resident_chunks == 4  # restored
    with pytest.raises(TypeError, match="unknown streaming option"):
        options(gpu=1)


# ---------------------------------------------------------------------------------------------
# Resident prefix as one matrix; results independent of the memory plan and of the chunking
# ---------------------------------------------------------------------------------------------
def _plans(nbytes, block):
    """all resident / about half resident / nothing resident (cached) / nothing resident (re-read)."""
    return {
        "all-resident": dict(max_gpu_bytes=None),
        "half-resident": dict(max_gpu_bytes=nbytes // 2 + 2 * block, host_cache=True, block_bytes=block),
        "streamed": dict(max_gpu_bytes=2 * block, host_cache=True, block_bytes=block),
        "streamed-reread": dict(max_gpu_bytes=2 * block, host_cache=False, block_bytes=block),
    }


def _count_calls(monkeypatch, module, name):
    calls = []
    orig = getattr(module, name)

    def wrapper(*a, **k):
        calls.append(k)
        return orig(*a, **k)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.mark.parametrize("chunks", [37, 100, 301], ids=lambda c: f"rows{c}")
def test_dense_plans_agree_with_in_memory(rng, monkeypatch, chunks):
    mm = sys.modules["fusedml.mmchain"]

    A = dense_data(rng, n=301, d=6)
    y, v, z = rng.normal(size=6), rng.random(301), rng.normal(size=6)
    Y = rng.normal(size=(7, 2))
    ref = mmchain(torch.from_numpy(A), y, v, z, alpha=0.7, beta=0.3, backend="cpu").numpy()
    refi = mmchain(torch.from_numpy(A), Y, v, intercept=True, backend="cpu").numpy()
    calls = _count_calls(monkeypatch, mm, "_run_mmchain")
    for plan, kw in _plans(A.nbytes, 600).items():
        S = StreamedMatrix(da.from_array(A, chunks=(chunks, 6)), device="cpu", **kw)
        R = S.resident_rows
        assert R == sum(S.to_dask().chunks[0][:S.resident_chunks])
        if R:  # the resident prefix is ONE [R, D] matrix holding X's first R rows
            assert isinstance(S.resident_matrix, torch.Tensor) and S.resident_matrix.shape == (R, 6)
            assert np.array_equal(S.resident_matrix.numpy(), A[:R])
        else:
            assert S.resident_matrix is None
        if plan == "all-resident":
            assert R == 301
        elif plan == "half-resident":
            assert 0 < S.resident_chunks < S.n_chunks or S.n_chunks == 1
        else:
            assert R == 0
        calls.clear()
        w = mmchain(S, y, v, z, alpha=0.7, beta=0.3, backend="cpu")
        # one operator call for the whole resident prefix, one per streamed block
        per = max(1, S.block_bytes // (6 * 8))  # rows per streamed block
        streamed = sum(-(-r // per) for r in S.to_dask().chunks[0][S.resident_chunks:])
        assert len(calls) == S.stats.blocks == int(R > 0) + streamed
        if plan == "all-resident":
            assert len(calls) == 1
        assert rel(w, ref) < 1e-12, plan
        assert rel(mmchain(S, Y, v, intercept=True, backend="cpu"), refi) < 1e-12, plan
        assert rel(matvec(S, y, backend="cpu"), A @ y) < 1e-12, plan
        S.close()


@pytest.mark.parametrize("chunks", [40, 97, 301], ids=lambda c: f"rows{c}")
def test_csr_plans_agree_with_in_memory(rng, monkeypatch, chunks):
    mm = sys.modules["fusedml.mmchain"]

    A = csr_data(rng, n=301, d=23)
    nbytes = A.nnz * 12 + 302 * 4
    y, v = rng.normal(size=23), rng.random(301)
    ref = A.T @ (v * (A @ y))
    calls = _count_calls(monkeypatch, mm, "_run_mmchain")
    for plan, kw in _plans(nbytes, 400).items():
        S = StreamedMatrix(da.from_array(A, chunks=(chunks, 23)), device="cpu", **kw)
        R = S.resident_rows
        if R:  # ONE CSR matrix with merged row pointers
            M = S.resident_matrix
            assert isinstance(M, fusedml.CSRMatrix) and M.shape == (R, 23) and M.crow.dtype == torch.int32
            assert int(M.crow[0]) == 0 and int(M.crow[-1]) == M.nnz == A[:R].nnz
            assert (M.to_scipy() != A[:R]).nnz == 0
        if plan == "all-resident":
            assert R == 301
        calls.clear()
        for backend in ("cpu", "ops"):
            assert rel(mmchain(S, y, v, backend=backend), ref) < 1e-12, (plan, backend)
        assert len(calls) == 2 * S.stats.blocks
        assert rel(matvec(S, y, backend="cpu"), A @ y) < 1e-12, plan
        # streamed CSR blocks use the copy-free scatter; so does a resident prefix under a budget
        # too tight for its transposed copy; with no budget the resident matrix is used as in memory
        configs = [k["config"] for k in calls[:S.stats.blocks]]
        if plan == "all-resident":
            assert configs == [None]
        else:
            assert all(c == {"memory": "low"} for c in configs)
        S.close()


@pytest.mark.parametrize("chunks", [50, 133, 270], ids=lambda c: f"rows{c}")
def test_gmm_plans_agree_with_in_memory(rng, monkeypatch, chunks):
    import fusedml.gmm._prep as prep_mod
    import fusedml.gmm.cpu as gcpu
    from fusedml.gmm import gmm_estep

    A = np.concatenate([rng.normal(size=(150, 3)), rng.normal(size=(120, 3)) + 3.0]).astype(np.float32)
    w = np.array([0.3, 0.7])
    mu = np.stack([A[:150].mean(0), A[150:].mean(0)]).astype(np.float64)
    pc = np.full((2, 3), 0.8)
    sw = rng.random(270)
    ref = gmm_estep(torch.from_numpy(A), w, mu, pc, "diag", sample_weight=sw, return_log_prob=True, backend="cpu")
    validations = _count_calls(monkeypatch, prep_mod, "validate")
    blocks = _count_calls(monkeypatch, gcpu, "estep_cpu")
    for plan, kw in _plans(A.nbytes, 480).items():
        S = StreamedMatrix(da.from_array(A, chunks=(chunks, 3)), device="cpu", **kw)
        validations.clear()
        blocks.clear()
        st = gmm_estep(S, w, mu, pc, "diag", sample_weight=sw, return_log_prob=True, backend="cpu")
        assert len(validations) == 1 and len(blocks) == S.stats.blocks  # parameters checked once per call
        for name in ("nk", "s1", "s2", "log_likelihood", "log_prob"):
            assert rel(getattr(st, name), getattr(ref, name)) < 1e-10, (plan, name)
        assert st.log_prob.dtype == torch.float32 and st.nk.dtype == torch.float64
        S.close()


def test_fused_backend_all_plans_under_interpreter(rng):
    """Fused kernels on the resident prefix and on streamed blocks agree with the in-memory call."""
    from fusedml.gmm import gmm_estep

    A = dense_data(rng, n=48, d=3, dtype=np.float32)
    y, v = rng.normal(size=3).astype(np.float32), rng.random(48).astype(np.float32)
    ref = mmchain(torch.from_numpy(A), y, v, backend="fused").double()
    w, mu, pc = np.array([0.5, 0.5]), np.stack([A[:24].mean(0), A[24:].mean(0)]).astype(np.float64), np.ones((2, 3))
    gref = gmm_estep(torch.from_numpy(A), w, mu, pc, "diag", backend="fused")
    for kw in (dict(max_gpu_bytes=None), dict(max_gpu_bytes=400, block_bytes=120)):
        S = StreamedMatrix(da.from_array(A, chunks=(20, 3)), device="cpu", **kw)
        assert rel(mmchain(S, y, v, backend="fused"), ref) < 1e-5
        g = gmm_estep(S, w, mu, pc, "diag", backend="fused")
        assert rel(g.nk, gref.nk) < 1e-5 and rel(g.s2, gref.s2) < 1e-4


def test_csr_block_statistics_computed_once_on_host(rng, monkeypatch):
    """Streamed CSR blocks reach the fused operator with their row statistics already known."""
    from fusedml.mmchain import csr

    B = csr_data(rng, n=40, d=9)
    S = StreamedMatrix(da.from_array(B, chunks=(13, 9)), device="cpu", max_gpu_bytes=300, block_bytes=120,
                       host_cache=True)
    assert S.resident_rows == 0 and S.n_chunks == 4
    seen = []
    S.map_blocks(lambda Xb, rows: seen.append((csr._structure(Xb).stats, csr._compute_stats(Xb))) or Xb.val.sum())
    assert len(seen) == S.stats.blocks > S.n_chunks and all(a == b for a, b in seen)
    counted = _count_calls(monkeypatch, csr, "_compute_stats")
    y, v = rng.normal(size=9), rng.random(40)
    ref = B.T @ (v * (B @ y))
    assert rel(mmchain(S, y, v, backend="fused"), ref) < 1e-12
    assert len(counted) == 0  # already known from the first pass over the (cached) host blocks
    assert rel(mmchain(S, y, v, backend="fused"), ref) < 1e-12 and len(counted) == 0


def test_resident_csr_copy_only_within_budget(rng, monkeypatch):
    mm = sys.modules["fusedml.mmchain"]

    B = csr_data(rng, n=100, d=12)
    X = da.from_array(B, chunks=(25, 12))
    calls = _count_calls(monkeypatch, mm, "_run_mmchain")
    y = rng.normal(size=12)
    tight = StreamedMatrix(X, device="cpu", max_gpu_bytes=2000, block_bytes=200)
    roomy = StreamedMatrix(X, device="cpu", max_gpu_bytes=10 * tight.nbytes, block_bytes=200)
    assert 0 < tight.resident_rows < 100 and roomy.resident_rows == 100
    mmchain(tight, y, backend="cpu", config={"strategy": "scatter"})
    assert calls[0]["config"] == {"memory": "low", "strategy": "scatter"}  # the caller's keys win
    calls.clear()
    mmchain(roomy, y, backend="cpu")
    assert len(calls) == 1 and calls[0]["config"] is None


def test_host_csr_stats_match_the_operator():
    from fusedml.mmchain import csr
    from fusedml.streaming import _host_csr_stats

    lengths = np.array([0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 0, 1023, 1024, 1025, 4096, 4097])
    crow = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    nnz = int(crow[-1])
    A = fusedml.CSRMatrix(torch.from_numpy(crow), torch.zeros(nnz, dtype=torch.int32), torch.zeros(nnz), (18, 50))
    assert _host_csr_stats(crow, 50) == csr._compute_stats(A)
    one = np.array([0, 0], dtype=np.int32)  # a block of one empty row
    A1 = fusedml.CSRMatrix(torch.from_numpy(one), torch.zeros(0, dtype=torch.int32), torch.zeros(0), (1, 50))
    assert _host_csr_stats(one, 50) == csr._compute_stats(A1)


# ---------------------------------------------------------------------------------------------
# CUDA pipeline (the lead runs these on the GPU: TRITON_INTERPRET=0 python -m pytest ...)
# ---------------------------------------------------------------------------------------------
import os  # noqa: E402

cuda_only = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") != "0",
                               reason="needs a CUDA device and compiled kernels (TRITON_INTERPRET=0)")


@cuda_only
@pytest.mark.parametrize("n_buffers", [1, 2, 3])
def test_cuda_pipeline_matches_in_memory(rng, n_buffers):
    from fusedml.gmm import gmm_estep

    dev = torch.device("cuda")
    A = rng.normal(size=(20_000, 24)).astype(np.float32)
    B = sp.random(20_000, 300, density=0.05, format="csr", random_state=np.random.RandomState(0), dtype=np.float32)
    y, v = torch.randn(24, device=dev), torch.rand(20_000, device=dev)
    ys = torch.randn(300, device=dev)
    At, Bt = torch.from_numpy(A).to(dev), fusedml.as_csr(B).to(dev)
    ref = mmchain(At, y, v).double()
    refs = mmchain(Bt, ys, v).double()
    K = 4
    w = torch.full((K,), 1.0 / K, dtype=torch.float64, device=dev)
    mu, pc = torch.randn(K, 24, dtype=torch.float64, device=dev), torch.ones(K, 24, dtype=torch.float64, device=dev)
    gref = gmm_estep(At, w, mu, pc, "diag", center=mu)
    X, Xs = da.from_array(A, chunks=(3_000, 24)), da.from_array(B, chunks=(3_000, 300), asarray=False)
    nbytes_s = B.nnz * 8 + (B.shape[0] + 1) * 4
    blk = 100_000
    plans = [(dict(max_gpu_bytes=None), dict(max_gpu_bytes=None))]  # all resident
    for nbytes_d in (A.nbytes // 2, 0):  # about half resident; nothing resident (cached, then re-read)
        for cache in ((True,) if nbytes_d else (True, False)):
            plans.append(tuple(dict(max_gpu_bytes=max(nb, n_buffers * blk + 1), block_bytes=blk, host_cache=cache)
                               for nb in (nbytes_d, nbytes_s // 2 if nbytes_d else 0)))
    for kw, kws in plans:
        S = StreamedMatrix(X, device=dev, n_buffers=n_buffers, **kw)
        Ss = StreamedMatrix(Xs, device=dev, n_buffers=n_buffers, **kws)
        for _ in range(3):  # slots recycled across calls
            assert rel(mmchain(S, y, v).double().cpu(), ref.cpu()) < 1e-5, kw
            assert rel(mmchain(Ss, ys, v).double().cpu(), refs.cpu()) < 1e-5, kw
            assert rel(matvec(S, y).cpu(), (At @ y).cpu()) < 1e-5
            g = gmm_estep(S, w, mu, pc, "diag", center=mu)
            assert rel(g.nk.cpu(), gref.nk.cpu()) < 1e-5 and rel(g.s2.cpu(), gref.s2.cpu()) < 1e-4
        S.close()
        Ss.close()


@cuda_only
def test_cuda_resident_rows_aligned_by_default(rng, monkeypatch):
    """On CUDA resident rows over 64 bytes (17 float32 values) are padded to whole 16-byte vectors by
    default, rows of 13 only under ``FUSEDML_ALIGN_ROWS=1`` (``0``: never); the padding, written on
    the device after an unpadded upload, is zeros; the compiled kernels' results equal the in-memory ones."""
    dev = torch.device("cuda")
    for d, strides in ((17, {"auto": 20, "0": 17, "1": 20}), (13, {"auto": 13, "0": 13, "1": 16})):
        A = rng.normal(size=(30_000, d)).astype(np.float32)
        X = da.from_array(A, chunks=(7_000, d))
        At = torch.from_numpy(A).to(dev)
        y, v = torch.randn(d, device=dev), torch.rand(30_000, device=dev)
        ref = mmchain(At.double(), y.double(), v.double())
        for mode, stride in strides.items():
            monkeypatch.setenv("FUSEDML_ALIGN_ROWS", mode)
            S = StreamedMatrix(X, device=dev)
            R = S.resident_matrix
            assert R.stride() == (stride, 1) and torch.equal(R, At), (d, mode)
            full = R.as_strided((R.shape[0], stride), (stride, 1))
            assert not full[:, d:].any()
            assert rel(mmchain(S, y, v).double().cpu(), ref.cpu()) < 1e-5
            assert rel(matvec(S, y).double().cpu(), (At.double() @ y.double()).cpu()) < 1e-5
            S.close()


@cuda_only
def test_cuda_host_syncs_do_not_grow_with_blocks(rng):
    """Host synchronisations per call are those of ONE in-memory call, however many blocks stream."""
    import warnings

    from fusedml.gmm import gmm_estep

    dev = torch.device("cuda")
    A = rng.normal(size=(40_000, 16)).astype(np.float32)
    X = da.from_array(A, chunks=(2_500, 16))
    K = 4
    w = torch.full((K,), 1.0 / K, dtype=torch.float64, device=dev)
    mu, pc = torch.randn(K, 16, dtype=torch.float64, device=dev), torch.ones(K, 16, dtype=torch.float64, device=dev)
    y, v = torch.randn(16, device=dev), torch.rand(40_000, device=dev)

    def syncs(fn):
        fn()  # warm-up: first-call caches
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as rec:
                warnings.simplefilter("always")
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(r.message) for r in rec)

    R = StreamedMatrix(X, device=dev)
    S = StreamedMatrix(X, device=dev, max_gpu_bytes=A.nbytes // 4, block_bytes=64_000)
    for op in (lambda M: mmchain(M, y, v), lambda M: gmm_estep(M, w, mu, pc, "diag", center=mu)):
        n_res = syncs(lambda: op(R))
        n_str = syncs(lambda: op(S))
        assert S.stats.blocks > 10 and R.stats.blocks == 1
        assert n_str == n_res, (n_str, n_res)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_empty_resident_prefix(rng, sparse):
    """A leading empty chunk fits the budget and the next does not: the resident prefix holds no
    rows (no storage was allocated; its upload used to fail with an AttributeError)."""
    X = rng.random((10, 4))
    Xd = da.from_array(X, chunks=((0, 5, 5), 4))
    if sparse:
        Xd = Xd.map_blocks(sp.csr_matrix)
    S = StreamedMatrix(Xd, device="cpu", max_gpu_bytes=200 if sparse else 100, block_bytes=80 if sparse else 40)
    assert S._resident_rows == 0 and S._chunks[0].resident and not S._chunks[1].resident
    y = torch.from_numpy(rng.standard_normal(4))
    assert rel(mmchain(S, y, backend="cpu"), torch.from_numpy(X.T @ (X @ y.numpy()))) < 1e-12


def test_central_point_is_the_in_memory_shift_computed_once(rng, monkeypatch):
    """``central_point``: the mean of ``kmeans.central_rows`` (lloyd_step's default shift in memory),
    computed through the graph once per matrix: the streamed k-means assignment asks each Lloyd
    iteration, and 1024 rows spread over X touch every chunk."""
    from fusedml.kmeans import central_rows

    X = rng.normal(size=(3000, 4)).astype(np.float32) + 5
    S = StreamedMatrix(da.from_array(X, chunks=(700, 4)), device="cpu")
    calls = []
    take = S.take_rows
    monkeypatch.setattr(S, "take_rows", lambda idx: calls.append(1) or take(idx))
    c = S.central_point()
    assert c.dtype == torch.float64 and torch.equal(S.central_point(), c) and len(calls) == 1
    assert torch.equal(c, torch.from_numpy(X[list(central_rows(3000))]).double().mean(0))
