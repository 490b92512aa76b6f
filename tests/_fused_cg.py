"""Fit once with the solvers' torch vector steps and once with fusedml.cg's kernels, counting the
kernel calls (shared by the CPU interpreter test and the CUDA test)."""
from algorithms import _solvers


def fit_torch_then_kernels(monkeypatch, make, X, y, flag):
    """``(ref, got, n_update, n_trial)``: ``make().fit(X, y)`` with ``FUSEDML_FUSED_CG=0``, then
    with ``FUSEDML_FUSED_CG`` set to ``flag`` (None: unset, the CUDA default), and the number of
    :func:`fusedml.cg.cg_update` and :func:`fusedml.cg.trial_sums` calls the second fit made
    (bound forms included; ``fit_torch_then_kernels.bound`` counts the bindings)."""
    monkeypatch.setenv("FUSEDML_FUSED_CG", "0")
    ref = make().fit(X, y)
    calls, trials, bound = [], [], []
    real, real_t = _solvers.cg_update, _solvers.trial_sums
    monkeypatch.setattr(_solvers, "cg_update", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(_solvers, "trial_sums", lambda *a, **k: trials.append(1) or real_t(*a, **k))

    def counted(bind, into):  # the bound forms (fused dense products): each call of the bound launch
        def make_bound(*a, **k):
            op = bind(*a, **k)
            bound.append(1)
            return lambda: into.append(1) or op()
        return make_bound
    monkeypatch.setattr(_solvers, "bind_cg_update", counted(_solvers.bind_cg_update, calls))
    monkeypatch.setattr(_solvers, "bind_trial_sums", counted(_solvers.bind_trial_sums, trials))
    if flag is None:
        monkeypatch.delenv("FUSEDML_FUSED_CG")
    else:
        monkeypatch.setenv("FUSEDML_FUSED_CG", flag)
    got = make().fit(X, y)
    fit_torch_then_kernels.bound = len(bound)  # bound launches made (fused dense: once per buffer set)
    return ref, got, len(calls), len(trials)
