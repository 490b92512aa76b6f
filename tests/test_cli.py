"""The fusedml command line (demo, bench, info, datasets), the bench grid, and the issue-4 script."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from fusedml import bench
from fusedml.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _one_error_line(err):
    # Progress lines ("[fusedml 0.0s] ...") may precede the error; the error itself is one line.
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith("[fusedml ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("fusedml: error: ")
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------- demo
def test_demo_quick(capsys):
    rc = main(["demo", "--quick", "--quiet", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Triton interpreter" in out and "too slowly for a demo" in out  # says why no "fused"
    assert "| dataset | algorithm | backend | time / fit (s) | iters |" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("| breast_cancer") or ln.startswith("| iris")]
    assert len(rows) == 6 and not any("error" in r for r in rows)
    backends = {(r.split("|")[1].strip(), r.split("|")[2].strip(), r.split("|")[3].strip()) for r in rows}
    for ds, algo in (("breast_cancer", "logistic"), ("iris", "gmm")):
        for b in ("cpu", "ops", "sklearn"):
            assert (ds, algo, b) in backends
    for r in rows:
        cells = [c.strip() for c in r.split("|")]
        assert float(cells[4]) > 0  # time
        float(cells[7])  # objective is a number


def test_demo_quick_env_var(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FUSEDML_DEMO_QUICK", "1")
    rc = main(["demo", "--quiet", "--device", "cpu", "--out", str(tmp_path), "--no-plots"])
    out = capsys.readouterr().out
    assert rc == 0 and "2 (dataset, algorithm) pairs" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["dataset"] for r in data["rows"]} == {"breast_cancer", "iris"}


# ---------------------------------------------------------------------------- bench
def test_bench_writes_json_markdown_png(tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["bench", "--datasets", "synthetic-dense:400x6", "synthetic-csr:400x60:5:powerlaw",
               "--algorithms", "logistic", "ridge", "--backends", "cpu", "ops", "sklearn",
               "--out", str(out), "--quiet", "--max-iter", "50", "--tol", "1e-8"])
    printed = capsys.readouterr().out
    assert rc == 0
    for f in ("results.json", "results.md", "time_per_fit.png", "objective_vs_time.png"):
        assert (out / f).is_file(), f
    for f in ("time_per_fit.png", "objective_vs_time.png"):
        assert (out / f).read_bytes()[:8] == PNG_MAGIC
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["versions"]["torch"] == torch.__version__
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 3
    for r in rows:
        assert "error" not in r and "skipped" not in r, r
        for key in ("dataset", "shape", "nnz", "algorithm", "backend", "device_name", "versions", "times",
                    "iterations", "objective", "score"):
            assert key in r, key
        assert r["params"]["max_iter"] == 50 and r["params"]["tol"] == 1e-8
    csr = [r for r in rows if r["dataset"].startswith("synthetic-csr")]
    assert all(r["sparse"] and 0 < r["nnz"] < 400 * 60 for r in csr)
    # Same algorithm on the same data: the fusedml backends agree with each other and scikit-learn.
    for ds in ("synthetic-dense:400x6", "synthetic-csr:400x60:5:powerlaw"):
        for algo in ("logistic", "ridge"):
            objs = {r["backend"]: r["objective"] for r in rows if r["dataset"] == ds and r["algorithm"] == algo}
            assert abs(objs["cpu"] - objs["ops"]) <= 1e-5 * abs(objs["ops"])
            assert abs(objs["cpu"] - objs["sklearn"]) <= 1e-4 * abs(objs["sklearn"])
            grp = [r for r in rows if r["dataset"] == ds and r["algorithm"] == algo and r["backend"] != "sklearn"]
            for r in grp:
                assert r["time_to_target"] is not None and r["time_to_target"] <= r["time"] + 1e-9
                assert r["history"] and "vs_ops" in r and "vs_sklearn" in r
    md = (out / "results.md").read_text()
    assert "| synthetic-csr:400x60:5:powerlaw | ridge | ops |" in md
    assert "results.json" in printed


def test_bench_n_samples_sweep_and_gmm(tmp_path, capsys):
    rc = main(["bench", "--datasets", "synthetic-gmm:100x3:2", "synthetic-dense:50x3",
               "--n-samples", "150", "300", "--algorithms", "gmm", "logistic",
               "--backends", "cpu", "--out", str(tmp_path), "--quiet", "--no-plots"])
    capsys.readouterr()
    assert rc == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    done = {(r["dataset"], r["algorithm"]) for r in rows if "time" in r}
    assert done == {("synthetic-gmm:150x3:2", "gmm"), ("synthetic-gmm:300x3:2", "gmm"),
                    ("synthetic-dense:150x3", "logistic"), ("synthetic-dense:300x3", "logistic"),
                    ("synthetic-dense:150x3", "gmm"), ("synthetic-dense:300x3", "gmm")}
    skipped = [r for r in rows if r.get("skipped")]
    assert {r["dataset"] for r in skipped} == {"synthetic-gmm:150x3:2", "synthetic-gmm:300x3:2"}
    assert all("gmm only" in r["skipped"] for r in skipped)
    assert not [r for r in rows if r.get("error")]
    gmm = [r for r in rows if r["algorithm"] == "gmm" and "time" in r]
    assert all(r["params"]["n_components"] == 2 for r in gmm if r["dataset"].startswith("synthetic-gmm"))


def test_bench_on_svmlight_file(tmp_path, capsys):
    import datasets

    ds = datasets.make_csr(300, 40, 6, "uniform", "binary", seed=3)
    path = tmp_path / "train.svm"
    datasets.save_svmlight(path, ds.X, ds.y)
    rc = main(["bench", "--datasets", f"svmlight:{path}", "breast_cancer", "--algorithms", "logistic", "poisson",
               "--backends", "ops", "--out", str(tmp_path / "o"), "--quiet", "--no-plots"])
    capsys.readouterr()
    assert rc == 0
    rows = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    ran = {(r["dataset"], r["algorithm"]) for r in rows if "time" in r}
    assert ran == {(f"svmlight:{path}", "logistic"), ("breast_cancer", "logistic")}
    assert all("needs a counts data set" in r["skipped"] for r in rows if r["algorithm"] == "poisson")


def test_annotate_time_to_common_objective():
    rows = [
        {"dataset": "d", "algorithm": "logistic", "backend": "fused", "time": 1.0,
         "history": [(0.1, 5.0), (0.2, 2.0), (0.5, 1.0)]},
        {"dataset": "d", "algorithm": "logistic", "backend": "ops", "time": 4.0,
         "history": [(1.0, 5.0), (2.0, 1.5), (3.0, 1.2)]},
        {"dataset": "d", "algorithm": "logistic", "backend": "sklearn", "time": 8.0, "history": None},
    ]
    bench.annotate(rows)
    assert [r.get("target_objective") for r in rows[:2]] == [1.2, 1.2]
    assert rows[0]["time_to_target"] == 0.5 and rows[1]["time_to_target"] == 3.0
    assert rows[0]["vs_ops"] == 4.0 and rows[0]["vs_sklearn"] == 8.0 and rows[1]["vs_ops"] == 1.0
    gmm = [{"dataset": "d", "algorithm": "gmm", "backend": b, "time": 1.0, "history": h}
           for b, h in (("fused", [(0.1, -3.0), (0.2, -1.0)]), ("ops", [(0.1, -3.0), (0.3, -2.0), (0.4, -1.5)]))]
    bench.annotate(gmm)  # maximised: target is the lower final log-likelihood
    assert gmm[0]["target_objective"] == -1.5 and gmm[0]["time_to_target"] == 0.2
    assert "| d | logistic | fused | 1 |" in bench.markdown_table(rows)
    assert "| d | logistic | 1 | 4 | 8 | 4.00 | 6.00 | 8.0 |" in bench.summary_table(rows)


@pytest.mark.parametrize("spec, kind", [
    ("iris", "bundled"), ("synthetic-dense:1000000x100", "dense"), ("synthetic-dense:1e6x100", "dense"),
    ("synthetic-csr:1000000x100000:32:powerlaw", "csr"), ("synthetic-csr:10x10", "csr"),
    ("synthetic-gmm:1000x16:4", "gmm"),
])
def test_parse_dataset(spec, kind):
    s = bench.parse_dataset(spec)
    assert s.kind == kind
    if kind == "csr" and spec.endswith("powerlaw"):
        assert (s.n, s.d, s.nnz_per_row, s.profile) == (1_000_000, 100_000, 32.0, "powerlaw")
    if spec.startswith("synthetic-dense:1e6"):
        assert s.n == 1_000_000


@pytest.mark.parametrize("spec, msg", [
    ("mnist", "unknown dataset 'mnist'"), ("synthetic-dense:100", "expected synthetic-dense:NxD"),
    ("synthetic-dense:0x5", "must be positive"), ("synthetic-csr:10x10:4:zipf", "unknown nnz profile"),
    ("synthetic-csr:10x10:abc", "bad nnz per row"), ("synthetic-dense:10xq", "bad column count"),
    ("svmlight:", "needs a path"),
    ("synthetic-dense:1e400x5", "bad row count"),  # was an OverflowError traceback
    ("synthetic-csr:100x10:inf", "positive and finite"),
])
def test_parse_dataset_errors(spec, msg):
    with pytest.raises(bench.BenchError, match=msg):
        bench.parse_dataset(spec)


# ---------------------------------------------------------------------------- info / datasets
def test_info(capsys):
    rc = main(["info", "--shape", "5000", "300", "--m", "4"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "mmchain launch model for dense X [5000, 300] float32, m=4" in out
    for field in ("strategy", "block_n", "block_d", "num_warps", "num_programs"):
        assert field in out
    assert f"torch    {torch.__version__}" in out
    if not torch.cuda.is_available():
        assert "GPU: none" in out and "resolves to 'cpu'" in out


def test_info_csr_launch_model(capsys):
    rc = main(["info", "--shape", "3000", "400", "--csr", "8", "powerlaw"])
    out = capsys.readouterr().out
    assert rc == 0 and "mmchain launch model for CSR X [3000, 400]" in out and "powerlaw" in out
    assert "long_threshold" in out


def test_datasets_command(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "randhie" in out and "20190 x 9" in out and "public domain" in out.lower()


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("argv, msg", [
    (["bench", "--datasets", "mnist", "--out", "{tmp}"], "unknown dataset 'mnist'"),
    (["bench", "--datasets", "svmlight:{tmp}/missing.svm", "--out", "{tmp}"], "no such file"),
    (["bench", "--datasets", "svmlight:{tmp}/bad.svm", "--backends", "ops", "--out", "{tmp}"], "line 2"),
    (["bench", "--backends", "fused", "--device", "cpu", "--datasets", "iris", "--out", "{tmp}"], None),
    (["info", "--shape", "0", "5"], "positive"),
    (["info", "--csr", "32", "zipf"], "--csr needs NNZ_PER_ROW"),
    (["info", "--m", "40"], "--m must be between 1 and 16"),  # was accepted (a plan mmchain would refuse)
    (["info", "--m", "0"], "--m must be between 1 and 16"),
    # checked before the fits (were a FileExistsError traceback after the whole grid; rows of errors, exit 0)
    (["bench", "--datasets", "iris", "--algorithms", "gmm", "--device", "cpu", "--out", "{tmp}/afile"],
     "is an existing file"),
    (["bench", "--datasets", "iris", "--device", "cpu", "--tol", "-1", "--out", "{tmp}"], "--tol must be positive"),
    (["bench", "--datasets", "iris", "--device", "cpu", "--max-iter", "-3", "--out", "{tmp}"], "--max-iter must be"),
    (["bench", "--datasets", "svmlight:{tmp}/huge.svm", "--backends", "ops", "--out", "{tmp}"], "too large"),
])
def test_error_lines(tmp_path, capsys, monkeypatch, argv, msg):
    (tmp_path / "bad.svm").write_text("1 1:2\n1 1:x\n")
    (tmp_path / "huge.svm").write_text("1 1:2\n0 1e30:2\n")
    (tmp_path / "afile").write_text("")
    if msg is None:  # 'fused' on the CPU needs the interpreter: an error without it
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        msg = "TRITON_INTERPRET=1"
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and msg in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("cmd", ["demo", "bench"])
def test_no_gpu_error(capsys, cmd):
    rc = main([cmd, "--device", "cuda"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and "no CUDA GPU" in line


@pytest.mark.parametrize("argv", [["bench", "--algorithms", "xgboost"], ["frobnicate"], ["demo", "--repeat", "x"]])
def test_usage_errors_one_line(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    _one_error_line(capsys.readouterr().err)


def test_python_dash_m_entry_point(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "fusedml", "bench", "--datasets", "nope", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 2
    assert _one_error_line(p.stderr).endswith(p.stderr.strip().splitlines()[-1])
    assert "unknown dataset 'nope'" in p.stderr


# ---------------------------------------------------------------------------- issue-4 script
def test_bench_end_to_end_quick(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_end_to_end", os.path.join(ROOT, "benchmarks",
                                                                                  "bench_end_to_end.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "e2e.json"
    rc = mod.main(["--quick", "--rows", "600", "--parts", "dense", "csr", "--algorithms", "logistic", "poisson",
                   "--backends", "cpu", "ops", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    data = json.loads(out.read_text())
    assert "env" in data and data["args"]["quick"] is True
    ran = {(r["dataset"], r["algorithm"], r["backend"]) for r in data["rows"] if "time" in r}
    assert len(ran) == 2 * 2 * 2 and not [r for r in data["rows"] if r.get("error")]
    assert (tmp_path / "e2e" / "time_per_fit.png").read_bytes()[:8] == PNG_MAGIC
    # The markdown tables come last.
    tail = printed.strip().splitlines()
    assert tail[-1].startswith("| synthetic-csr") and "speedup vs ops" in printed
    np.testing.assert_allclose(
        [r["objective"] for r in data["rows"] if r["backend"] == "cpu"],
        [r["objective"] for r in data["rows"] if r["backend"] == "ops"], rtol=1e-5)


def test_bench_end_to_end_classes(tmp_path):
    """--classes: the multinomial rows' class count (the unrolled kernel's m <= 4 against the default 5)."""
    spec = importlib.util.spec_from_file_location("bench_end_to_end", os.path.join(ROOT, "benchmarks",
                                                                                  "bench_end_to_end.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "e2e3.json"
    rc = mod.main(["--quick", "--rows", "400", "--parts", "dense", "--algorithms", "logistic-multinomial",
                   "--backends", "cpu", "--classes", "3", "--no-plots", "--out", str(out)])
    rows = [r for r in json.loads(out.read_text())["rows"] if "time" in r]
    assert rc == 0 and rows and all(r["n_classes"] == 3 for r in rows)


# ---------------------------------------------------------------------------- README
def test_readme_has_the_two_commands_once():
    """The README's set-up-and-go block: exactly two commands, the test one being what CI runs."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert text.count("## Set up and go") == 1
    headings = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert len(headings) == len(set(headings)), "a README section is written twice"
    cmds = [ln.split("#")[0].strip() for ln in text.splitlines() if ln.startswith("bash .ci/setup")]
    assert len(cmds) == 2
    assert any(c.endswith(".venv/bin/fusedml demo") for c in cmds)
    test_cmd = next(c for c in cmds if "pytest" in c).split("&&", 1)[1].strip()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert test_cmd in f.read()


def test_readme_usage_example_runs():
    """The README's "Use" block runs as written (CPU, interpreted kernels), so the documented API
    cannot drift from the code."""
    import re

    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    fence = "`" * 3
    block = re.search("## Use\n\n" + fence + "python\n(.*?)" + fence, text, re.S).group(1)
    scope = {}
    exec(compile(block, "README.md (Use)", "exec"), scope)  # noqa: S102 -- the project's own documentation
    assert scope["w"].shape == (64,) and scope["st"].nk.shape == (4,) and scope["clf"].coef_.shape[-1] == 30


def test_bench_warms_up_before_timing_on_the_cpu(monkeypatch):
    """A short fit precedes the timed ones on every device (the CPU too: its first fit carried
    one-time costs, 0.76 s against 0.13 s, and skewed the ratios of --repeat 1 runs), except the
    interpreted fused backend."""
    fits = []
    timed = bench._timed_fit
    monkeypatch.setattr(bench, "_timed_fit", lambda est, X, y: fits.append(est.max_iter) or timed(est, X, y))
    rows = bench.run_grid(["logistic"], ["breast_cancer"], ["cpu", "ops"], repeat=1, device="cpu")
    assert len(rows) == 2 and all("error" not in r for r in rows)
    assert len(fits) == 4 and fits[0] == fits[2] == 2  # warm-up (2 iterations), then the timed fit
