"""Fit once with the solvers' torch vector steps and once with fusedml.cg's kernels, counting the
kernel calls (shared by the CPU interpreter test and the CUDA test)."""
from algorithms import _solvers


def fit_torch_then_kernels(monkeypatch, make, X, y, flag):
    """``(ref, got, n_update, n_trial)``: ``make().fit(X, y)`` with ``FUSEDML_FUSED_CG=0``, then
    with ``FUSEDML_FUSED_CG`` set to ``flag`` (None: unset, the CUDA default), and the number of
    :func:`fusedml.cg.cg_update` and :func:`fusedml.cg.trial_sums` calls the second fit made."""
    monkeypatch.setenv("FUSEDML_FUSED_CG", "0")
    ref = make().fit(X, y)
    calls, trials = [], []
    real, real_t = _solvers.cg_update, _solvers.trial_sums
    monkeypatch.setattr(_solvers, "cg_update", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(_solvers, "trial_sums", lambda *a, **k: trials.append(1) or real_t(*a, **k))
    if flag is None:
        monkeypatch.delenv("FUSEDML_FUSED_CG")
    else:
        monkeypatch.setenv("FUSEDML_FUSED_CG", flag)
    got = make().fit(X, y)
    return ref, got, len(calls), len(trials)
