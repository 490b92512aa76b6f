"""datasets: bundled sets, seeded synthetic generators, svmlight / npy / npz loaders."""
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import datasets
from datasets import Dataset


# ---------------------------------------------------------------------------- bundled
EXPECTED = {
    "breast_cancer": ((569, 30), "binary", 2),
    "wine": ((178, 13), "multiclass", 3),
    "digits": ((1797, 64), "multiclass", 10),
    "iris": ((150, 4), "clustering", 3),
    "randhie": ((20190, 9), "counts", None),
    "grunfeld": ((220, 13), "positive", None),
}


def test_list_datasets_matches_files():
    names = datasets.list_datasets()
    assert names == sorted(EXPECTED)
    data_dir = os.path.join(os.path.dirname(datasets.__file__), "data")
    total = sum(os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir))
    assert total < 2_000_000


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_bundled(name):
    shape, task, n_classes = EXPECTED[name]
    ds = datasets.load(name)
    assert isinstance(ds, Dataset)
    assert ds.X.shape == shape and ds.X.dtype == np.float64 and ds.y.shape == (shape[0],)
    assert ds.task == task and ds.name == name and len(ds.feature_names) == shape[1]
    assert np.isfinite(ds.X).all()
    assert ("CC BY 4.0" in ds.description) or ("Public domain" in ds.description)
    if n_classes is not None:
        assert ds.y.dtype == np.int64 and np.unique(ds.y).tolist() == list(range(n_classes))
    if task == "counts":
        assert (ds.y >= 0).all() and (ds.y == np.round(ds.y)).all() and ds.y.max() > 10
    if task == "positive":
        assert (ds.y > 0).all()


def test_load_standardize_and_torch():
    ds = datasets.load("wine", standardize=True, dtype=np.float32, return_torch=True)
    assert isinstance(ds.X, torch.Tensor) and ds.X.dtype == torch.float32 and ds.y.dtype == torch.int64
    X = ds.X.double().numpy()
    np.testing.assert_allclose(X.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(X.std(0), 1, rtol=1e-4)
    raw = datasets.load("wine")
    assert raw.X[:, -1].max() > 100  # proline: raw scale kept without standardize


def test_load_bad_arguments():
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*breast_cancer"):
        datasets.load("nope")
    with pytest.raises(TypeError, match="floating"):
        datasets.load("iris", dtype=np.int32)
    with pytest.raises(ValueError, match="task"):
        Dataset(np.zeros((2, 2)), None, "x", "bogus")


# ---------------------------------------------------------------------------- synthetic dense
@pytest.mark.parametrize("task", ["binary", "multiclass", "regression", "counts", "positive"])
def test_make_dense_deterministic(task):
    a = datasets.make_dense(500, 7, task, seed=3)
    b = datasets.make_dense(500, 7, task, seed=3)
    c = datasets.make_dense(500, 7, task, seed=4)
    assert a.X.shape == (500, 7) and a.X.dtype == np.float32 and a.y.shape == (500,)
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)
    if task in ("binary", "multiclass"):
        assert a.y.dtype == np.int64
    else:
        assert a.y.dtype == np.float64


def test_make_dense_known_model():
    n = 40_000
    reg = datasets.make_regression(n, 5, "normal", noise=0.5, seed=1, dtype="float64")
    eta = reg.X @ reg.truth["coef"] + reg.truth["intercept"]
    assert abs(np.std(reg.y - eta) - 0.5) < 0.01
    po = datasets.make_regression(n, 5, "poisson", seed=2, dtype="float64")
    mu = np.exp(po.X @ po.truth["coef"] + po.truth["intercept"])
    assert (po.y == np.round(po.y)).all() and po.y.min() >= 0
    assert abs(po.y.mean() / mu.mean() - 1) < 0.03
    ga = datasets.make_regression(n, 5, "gamma", gamma_shape=2, seed=3, dtype="float64")
    mu = np.exp(ga.X @ ga.truth["coef"] + ga.truth["intercept"])
    assert ga.y.min() > 0
    r = ga.y / mu  # Gamma(2, 1/2): mean 1, variance 1/2
    assert abs(r.mean() - 1) < 0.02 and abs(r.var() - 0.5) < 0.04
    bi = datasets.make_classification(n, 5, 2, seed=4, dtype="float64")
    p = 1 / (1 + np.exp(-(bi.X @ bi.truth["coef"] + bi.truth["intercept"])))
    assert abs(bi.y.mean() - p.mean()) < 0.01
    mc = datasets.make_classification(n, 5, 4, seed=5)
    assert mc.task == "multiclass" and mc.truth["coef"].shape == (5, 4)
    assert set(np.unique(mc.y)) == {0, 1, 2, 3}


def test_make_dense_torch_and_dtypes():
    ds = datasets.make_dense(64, 3, "binary", dtype="float16", return_torch=True)
    assert ds.X.dtype == torch.float16 and ds.y.dtype == torch.int64
    ds = datasets.make_dense(64, 3, "binary", dtype=torch.bfloat16, return_torch=True)
    assert ds.X.dtype == torch.bfloat16
    with pytest.raises(TypeError, match="bfloat16"):
        datasets.make_dense(64, 3, "binary", dtype="bfloat16")
    with pytest.raises(ValueError, match="n_samples"):
        datasets.make_dense(0, 3)
    with pytest.raises(ValueError, match="task"):
        datasets.make_dense(10, 3, "ranking")
    with pytest.raises(ValueError, match="n_classes"):
        datasets.make_dense(10, 3, "multiclass", n_classes=2)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA"):
            datasets.make_dense(10, 3, device="cuda")


# ---------------------------------------------------------------------------- synthetic CSR
def _canonical(X):
    assert sp.isspmatrix_csr(X)
    lengths = np.diff(X.indptr)
    starts = np.repeat(X.indptr[:-1], lengths)
    pos = np.arange(X.nnz) - starts
    step = np.diff(X.indices)
    assert (step[pos[1:] > 0] > 0).all(), "columns not sorted/unique within rows"
    return lengths


def test_make_csr_profiles():
    n, d, k = 20_000, 100_000, 16
    const = datasets.make_csr(n, d, k, "constant", seed=0)
    L = _canonical(const.X)
    assert L.max() == k and L.mean() > 0.999 * k  # collisions in 1e5 columns are rare
    uni = datasets.make_csr(n, d, k, "uniform", seed=0)
    L = _canonical(uni.X)
    assert L.min() >= 1 and L.max() <= 2 * k - 1 and abs(L.mean() / k - 1) < 0.03
    pw = datasets.make_csr(n, d, k, "powerlaw", seed=0)
    L = _canonical(pw.X)
    drawn = pw.truth["row_lengths"]
    assert abs(drawn.mean() / k - 1) < 0.15 and drawn.max() > 20 * k  # heavy tail
    assert L.max() > 10 * k and (L <= drawn).all()
    # Zipf-like column popularity: the top 1% of columns hold far more than 1% of entries.
    counts = np.sort(np.bincount(pw.X.indices, minlength=d))[::-1]
    assert counts[: d // 100].sum() > 0.1 * pw.X.nnz
    # Rows are l2-normalised on average.
    sq = np.asarray(uni.X.multiply(uni.X).sum(1)).ravel()
    assert abs(sq.mean() - 1) < 0.05


def test_make_csr_deterministic_and_model():
    a = datasets.make_csr(3000, 500, 8, "powerlaw", "binary", seed=11)
    b = datasets.make_csr(3000, 500, 8, "powerlaw", "binary", seed=11)
    assert (a.X != b.X).nnz == 0 and np.array_equal(a.y, b.y)
    c = datasets.make_csr(3000, 500, 8, "powerlaw", "binary", seed=12)
    assert a.X.nnz != c.X.nnz or (a.X != c.X).nnz > 0
    r = datasets.make_csr(20_000, 300, 10, "uniform", "regression", noise=0.25, seed=2, dtype="float64")
    eta = r.X @ r.truth["coef"] + r.truth["intercept"]
    assert abs(np.std(r.y - eta) - 0.25) < 0.01
    m = datasets.make_csr(2000, 300, 10, "uniform", "multiclass", n_classes=4, seed=2)
    assert m.truth["coef"].shape == (300, 4) and m.y.max() == 3


def test_make_csr_torch_output():
    from fusedml import CSRMatrix, as_csr

    ds = datasets.make_csr(500, 200, 6, "uniform", "counts", seed=1, return_torch=True)
    assert isinstance(ds.X, CSRMatrix) and ds.X.crow.dtype == torch.int32 and ds.X.val.dtype == torch.float32
    np_ds = datasets.make_csr(500, 200, 6, "uniform", "counts", seed=1)
    np.testing.assert_array_equal(ds.X.to_scipy().toarray(), np_ds.X.toarray())
    as_csr(ds.X.to_torch())  # passes fusedml's structure checks
    assert ds.is_sparse and ds.nnz == np_ds.X.nnz
    with pytest.raises(ValueError, match="profile"):
        datasets.make_csr(10, 10, 2, "zipf")
    with pytest.raises(ValueError, match="nnz_per_row"):
        datasets.make_csr(10, 10, 0)


# ---------------------------------------------------------------------------- GMM
@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_make_gmm(cov):
    K, D = 4, 3
    ds = datasets.make_gmm(30_000, D, K, separation=5.0, covariance_type=cov, weights=[1, 2, 3, 4], seed=7,
                           dtype="float64")
    t = ds.truth
    assert ds.task == "clustering" and ds.X.shape == (30_000, D) and ds.y.dtype == np.int64
    dist = np.linalg.norm(t["means"][:, None] - t["means"][None], axis=-1) + np.eye(K) * 1e9
    assert abs(dist.min() - 5.0) < 1e-9
    np.testing.assert_allclose(t["weights"], [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(np.bincount(ds.y) / 30_000, t["weights"], atol=0.015)
    shapes = {"full": (K, D, D), "tied": (D, D), "diag": (K, D), "spherical": (K,)}
    assert t["covariances"].shape == shapes[cov]
    for k in range(K):
        Xk = ds.X[ds.y == k]
        np.testing.assert_allclose(Xk.mean(0), t["means"][k], atol=0.08)
        emp = np.cov(Xk.T)
        true = {"full": lambda: t["covariances"][k], "tied": lambda: t["covariances"],
                "diag": lambda: np.diag(t["covariances"][k]),
                "spherical": lambda: t["covariances"][k] * np.eye(D)}[cov]()
        np.testing.assert_allclose(emp, true, atol=0.12)
    again = datasets.make_gmm(30_000, D, K, separation=5.0, covariance_type=cov, weights=[1, 2, 3, 4], seed=7,
                              dtype="float64")
    np.testing.assert_array_equal(ds.X, again.X)


def test_make_gmm_bad_input():
    with pytest.raises(ValueError, match="covariance_type"):
        datasets.make_gmm(10, 2, 2, covariance_type="banded")
    with pytest.raises(ValueError, match="separation"):
        datasets.make_gmm(10, 2, 2, separation=0)
    with pytest.raises(ValueError, match="weights"):
        datasets.make_gmm(10, 2, 2, weights=[1, -1])


# ---------------------------------------------------------------------------- svmlight
SVM_TEXT = """# a comment line
1 3:0.5 1:2.5  # trailing comment
-1 qid:4 2:-1e-3

0 1:1 2:2 3:3
2.5
"""


def test_svmlight_parse_features(tmp_path):
    p = tmp_path / "a.svm"
    p.write_text(SVM_TEXT)
    ds = datasets.load_svmlight(p)
    # One-based (no index 0): columns shift by one; blank and comment lines are no rows.
    expect = np.array([[2.5, 0, 0.5], [0, -1e-3, 0], [1, 2, 3], [0, 0, 0]])
    np.testing.assert_array_equal(ds.X.toarray(), expect)
    np.testing.assert_array_equal(ds.y, [1, -1, 0, 2.5])
    assert ds.X.has_canonical_format and ds.task == "regression"
    wide = datasets.load_svmlight(p, n_features=10, zero_based=True, dtype=np.float32)
    assert wide.X.shape == (4, 10) and wide.X.dtype == np.float32 and wide.X[0, 3] == 0.5


@pytest.mark.parametrize("zero_based", [True, False])
def test_svmlight_round_trip(tmp_path, zero_based):
    ds = datasets.make_csr(700, 90, 6, "powerlaw", "multiclass", n_classes=3, seed=5, dtype="float64")
    X = ds.X.tolil()
    X[5, :] = 0  # an empty row
    X = X.tocsr()
    p = tmp_path / "r.svm"
    datasets.save_svmlight(p, X, ds.y, zero_based=zero_based, comment="round trip")
    back = datasets.load_svmlight(p, n_features=90, zero_based=zero_based)
    assert back.X.shape == X.shape and (back.X != X).nnz == 0
    np.testing.assert_array_equal(back.y, ds.y)
    assert back.task == "multiclass"
    lazy = datasets.load_svmlight(p, chunks=128, zero_based=zero_based)
    # Chunks are runs of 128 lines: the comment line makes the first block one row short.
    assert lazy.X.chunks[0] == (127, 128, 128, 128, 128, 61)
    got = lazy.X.compute()
    assert got.shape[1] <= 90 and (got - X[:, :got.shape[1]]).nnz == 0
    np.testing.assert_array_equal(lazy.y.compute(), ds.y)


@pytest.mark.parametrize("mod", ["gzip", "bz2", "lzma"])
def test_svmlight_compressed_and_byte_order_mark(tmp_path, mod):
    """gzip, bz2 and xz files (told by their first bytes, whatever their name) and a leading UTF-8
    byte-order mark read as the plain text; ``chunks=`` on a compressed file is a clear error."""
    import importlib

    plain = datasets.load_svmlight(_write(tmp_path / "p.svm", SVM_TEXT))
    p = tmp_path / "c.svm"  # no telling extension
    with importlib.import_module(mod).open(p, "wb") as f:
        f.write(("\ufeff" + SVM_TEXT).encode())
    got = datasets.load_svmlight(p)
    assert (got.X != plain.X).nnz == 0 and np.array_equal(got.y, plain.y)
    with pytest.raises(ValueError, match=f"{mod}-compressed.*chunks"):
        datasets.load_svmlight(p, chunks=2)
    bom = _write(tmp_path / "b.svm", "\ufeff" + SVM_TEXT)
    assert (datasets.load_svmlight(bom).X != plain.X).nnz == 0
    assert (datasets.load_svmlight(bom, chunks=2).X.compute() != plain.X).nnz == 0


def _write(p, text):
    p.write_bytes(text.encode())
    return p


@pytest.mark.parametrize("text, line, msg", [
    ("1 1:2\n1 2:3\n1 3:x\n", 3, "not a number"),
    ("1 1:2\n1 2:3 4\n", 2, "malformed"),
    ("1 1:2\n1:3 2:3\n", 2, "malformed"),
    ("1 1:2\n\n1 :3\n", 3, "malformed"),
    ("1 1:2\n1 2:\n", 2, "malformed"),
    ("1 1:2\n1 1.5:3\n", 2, "non-negative integer"),
    ("1 1:2\n1 2:3 2:4\n", 2, "duplicate"),
    ("1 1:2\n1 7:3\n", 2, "out of range"),
])
def test_svmlight_malformed_lines(tmp_path, text, line, msg):
    p = tmp_path / "bad.svm"
    p.write_text(text)
    n_features = 5 if "7:" in text else None
    with pytest.raises(ValueError, match=rf"line {line}: .*{msg}|line {line}: {msg}"):
        datasets.load_svmlight(p, n_features=n_features)


def test_svmlight_chunked_reports_global_line_number(tmp_path):
    p = tmp_path / "bad.svm"
    p.write_text("".join(f"{i % 2} 1:{i}\n" for i in range(20)) + "1 2:oops\n")
    with pytest.raises(ValueError, match="line 21"):
        datasets.load_svmlight(p, chunks=6)


def test_svmlight_file_errors(tmp_path):
    missing = tmp_path / "none.svm"
    with pytest.raises(FileNotFoundError, match="none.svm"):
        datasets.load_svmlight(missing)
    p = tmp_path / "z.svm"
    p.write_text("1 0:1\n")
    with pytest.raises(ValueError, match="line 1: feature index 0 in a one-based"):
        datasets.load_svmlight(p, zero_based=False)
    empty = tmp_path / "e.svm"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="no data rows"):
        datasets.load_svmlight(empty)


# ---------------------------------------------------------------------------- npy / npz
def test_load_npy(tmp_path, rng):
    X = rng.standard_normal((250, 6)).astype(np.float32)
    y = rng.integers(0, 2, 250)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    ds = datasets.load_npy(tmp_path / "X.npy", y=tmp_path / "y.npy")
    assert isinstance(ds.X, np.memmap) and ds.task == "binary"
    np.testing.assert_array_equal(ds.X, X)
    lazy = datasets.load_npy(tmp_path / "X.npy", chunks=100, y=y)
    assert lazy.X.chunks == ((100, 100, 50), (6,))
    np.testing.assert_array_equal(lazy.X.compute(), X)
    np.testing.assert_array_equal(lazy.y.compute(), y)
    assert datasets.load_npy(tmp_path / "X.npy").y is None


def test_load_npy_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        datasets.load_npy(tmp_path / "nope.npy")
    np.save(tmp_path / "v.npy", np.zeros(5))
    with pytest.raises(ValueError, match="2-D"):
        datasets.load_npy(tmp_path / "v.npy")
    np.save(tmp_path / "i.npy", np.zeros((3, 2), dtype=np.int64))
    with pytest.raises(TypeError, match="floating"):
        datasets.load_npy(tmp_path / "i.npy")
    np.save(tmp_path / "f.npy", np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        datasets.load_npy(tmp_path / "f.npy", y=np.zeros(4))
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(ValueError, match="junk.npy"):
        datasets.load_npy(tmp_path / "junk.npy")


def test_load_npz_shards(tmp_path):
    parts = [datasets.make_csr(n, 40, 5, "uniform", "counts", seed=s) for s, n in enumerate([130, 70, 101])]
    for i, ds in enumerate(parts):
        sp.save_npz(tmp_path / f"part-{i:03d}.npz", ds.X)
        np.save(tmp_path / f"part-{i:03d}.y.npy", ds.y)
    full = sp.vstack([d.X for d in parts], format="csr")
    y = np.concatenate([d.y for d in parts])
    ds = datasets.load_npz_shards(tmp_path, task="counts")
    assert (ds.X != full).nnz == 0 and ds.task == "counts"
    # Small integer targets are indistinguishable from class labels: inferred as multiclass.
    assert datasets.load_npz_shards(tmp_path).task == "multiclass"
    np.testing.assert_array_equal(ds.y, y)
    lazy = datasets.load_npz_shards(tmp_path, chunks=64)
    assert lazy.X.chunks[0] == (64, 64, 2, 64, 6, 64, 37)  # blocks never straddle shards
    assert (lazy.X.compute() != full).nnz == 0 and lazy.nnz == full.nnz
    np.testing.assert_array_equal(lazy.y.compute(), y)
    single = datasets.load_npz_shards(tmp_path / "part-001.npz")
    assert single.X.shape == (70, 40)


def test_load_npz_shards_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        datasets.load_npz_shards(tmp_path / "missing_dir")
    g = tmp_path / "g"
    g.mkdir()
    np.save(g / "one.npy", np.zeros(3))  # a .npy, garbage: errors naming the file (were numpy's)
    (g / "g.npz").write_bytes(b"not a zip at all")
    for f in ("one.npy", "g.npz"):
        with pytest.raises(ValueError, match=f"{f}: not an .npz archive"):
            datasets.load_npz_shards(g / f)
    e = tmp_path / "e"
    e.mkdir()
    sp.save_npz(e / "0.npz", sp.csr_matrix((0, 4)))
    for chunks in (None, 2):  # every shard empty: one error (was a 0 x 4 Dataset / a dask error)
        with pytest.raises(ValueError, match="every shard has 0 rows"):
            datasets.load_npz_shards(e, chunks=chunks)
    with pytest.raises(FileNotFoundError, match="no .npz shards"):
        datasets.load_npz_shards(tmp_path)
    a = tmp_path / "a"
    a.mkdir()
    sp.save_npz(a / "0.npz", sp.random(5, 4, 0.5, format="csr"))
    sp.save_npz(a / "1.npz", sp.random(5, 6, 0.5, format="csr"))
    with pytest.raises(ValueError, match="different numbers of columns"):
        datasets.load_npz_shards(a)
    b = tmp_path / "b"
    b.mkdir()
    sp.save_npz(b / "0.npz", sp.random(5, 4, 0.5, format="csc"))
    with pytest.raises(TypeError, match="only CSR"):
        datasets.load_npz_shards(b)
    c = tmp_path / "c"
    c.mkdir()
    sp.save_npz(c / "0.npz", sp.random(5, 4, 0.5, format="csr"))
    sp.save_npz(c / "1.npz", sp.random(5, 4, 0.5, format="csr"))
    np.save(c / "0.y.npy", np.zeros(5))
    with pytest.raises(FileNotFoundError, match="1.y.npy"):
        datasets.load_npz_shards(c)
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not a scipy.sparse.save_npz"):
        datasets.load_npz_shards(tmp_path / "plain.npz")


def test_infer_task():
    assert datasets.infer_task(np.array([0, 1, 1, 0])) == "binary"
    assert datasets.infer_task(np.arange(100) % 4) == "multiclass"
    assert datasets.infer_task(np.arange(1000.0)) == "counts"
    assert datasets.infer_task(np.linspace(0.5, 3, 50)) == "positive"
    assert datasets.infer_task(np.linspace(-1, 3, 50)) == "regression"
