"""fusedml._launch.launch: a repeated launch goes straight to the compiled kernel's launcher, and
only when every argument Triton specialises on is the same (a fake kernel: no GPU here)."""
from types import SimpleNamespace

import pytest
import torch

from fusedml import _launch


class _Compiled:
    def __init__(self):
        self.function, self.packed_metadata, self.runs = object(), object(), []

    def launch_metadata(self, grid, stream, *vals):
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit, *vals):
        assert function is self.function and packed is self.packed_metadata and stream == "stream"
        self.runs.append(((g0, g1, g2), vals))


class _Kernel:
    """A JITFunction stand-in: ``kernel[grid](...)`` counts Triton-path launches, returns one compiled kernel."""

    def __init__(self, names):
        self.params = [SimpleNamespace(name=n) for n in names]
        self.compiled, self.plain = _Compiled(), []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.plain.append((grid, args, kw))
            return self.compiled
        return run


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(_launch, "interpret_mode", lambda: False)
    monkeypatch.setattr(_launch, "_stream", lambda: "stream")
    monkeypatch.setattr(_launch, "_CACHE", {})
    monkeypatch.setitem(_launch._state, "ok", None)


def test_repeat_launch_skips_triton_binding(fast):
    k = _Kernel(["X", "N", "a", "BLOCK"])
    X, X2 = torch.zeros(8), torch.zeros(8)  # fresh aligned allocations: the same specialisation
    _launch.launch(k, (4,), (X, 8, 1.5), {"BLOCK": 16}, num_warps=4)
    _launch.launch(k, (4,), (X2, 24, 2.5), {"BLOCK": 16}, num_warps=4)
    _launch.launch(k, (4,), (X, 8, 1.5), {"BLOCK": 16}, num_warps=4)
    # Triton's path gets the constexprs, FMA contraction (_launch.FP_FUSION) and the options
    assert len(k.plain) == 1 and k.plain[0][2] == {"BLOCK": 16, "enable_fp_fusion": True, "num_warps": 4}
    # the current arguments, constexprs after them in the kernel's order
    assert k.compiled.runs == [((4, 1, 1), (X2, 24, 2.5, 16)), ((4, 1, 1), (X, 8, 1.5, 16))]


def test_call_is_triton_call_syntax_for_launch(fast):
    """``call(kernel, grid, *args, num_warps=..., **consts)``: Triton's call syntax, options apart from
    the constexprs, repeated launches through the launcher as :func:`launch`."""
    k = _Kernel(["X", "N", "BLOCK"])
    X = torch.zeros(8)
    _launch.call(k, (2,), X, 8, BLOCK=32, num_warps=8, num_stages=2)
    _launch.call(k, (2,), X, 8, BLOCK=32, num_warps=8, num_stages=2)
    _launch.call(k, (2,), X, 8, BLOCK=32)  # Triton's default options: another launch key
    assert [p[2] for p in k.plain] == [{"BLOCK": 32, "enable_fp_fusion": True, "num_warps": 8, "num_stages": 2},
                                       {"BLOCK": 32, "enable_fp_fusion": True}]
    assert k.compiled.runs == [((2, 1, 1), (X, 8, 32))]


@pytest.mark.parametrize("change", ["tensor", "dtype", "int_vs_float", "value", "int_multiple", "int_width", "const",
                                    "grid", "warps"])
def test_any_specialised_difference_takes_triton_path(fast, change):
    k = _Kernel(["X", "N", "BLOCK"])
    X = torch.zeros(8)
    base = dict(grid=(4,), args=(X, 16), consts={"BLOCK": 16}, opts={"num_warps": 4})
    other = dict(base)
    other.update({"tensor": dict(args=(X[1:], 16)), "dtype": dict(args=(X.view(torch.int32), 16)),
                  "int_vs_float": dict(args=(X, 16.0)), "value": dict(args=(X, 1)),
                  "int_multiple": dict(args=(X, 17)), "int_width": dict(args=(X, 1 << 33)),
                  "const": dict(consts={"BLOCK": 32}), "grid": dict(grid=(5,)),
                  "warps": dict(opts={"num_warps": 8})}[change])
    for c in (base, other):
        _launch.launch(k, c["grid"], c["args"], c["consts"], **c["opts"])
    assert len(k.plain) == 2 and not k.compiled.runs


def test_plain_launch_when_unusable(fast, monkeypatch):
    k = _Kernel(["X", "BLOCK", "EXTRA"])  # a parameter left to its default: never cached
    for _ in range(2):
        _launch.launch(k, (1,), (torch.zeros(2),), {"BLOCK": 4})
    assert len(k.plain) == 2
    k2 = _Kernel(["X", "C"])  # unhashable constexpr value
    for _ in range(2):
        _launch.launch(k2, (1,), (torch.zeros(2),), {"C": [1]})
    assert len(k2.plain) == 2
    monkeypatch.setattr(_launch, "interpret_mode", lambda: True)  # the interpreter: always Triton's path
    k3 = _Kernel(["X"])
    for _ in range(2):
        _launch.launch(k3, (1,), (torch.zeros(2),), {})
    assert len(k3.plain) == 2


def test_compiled_kernel_without_launcher_api(fast):
    k = _Kernel(["X"])
    k.compiled = object()  # a Triton whose compiled kernels lack run/function/...: plain from now on
    for _ in range(2):
        _launch.launch(k, (1,), (torch.zeros(2),), {})
    assert len(k.plain) == 2 and _launch._state["ok"] is False


def test_bind_repeats_the_stored_launch(fast):
    k = _Kernel(["X", "N", "BLOCK"])
    X = torch.zeros(8)
    go = _launch.bind(k, (2,), (X, 8), {"BLOCK": 4}, num_warps=2)
    for _ in range(3):
        go()
    assert len(k.plain) == 1  # compiled once, through launch
    assert k.compiled.runs == [((2, 1, 1), (X, 8, 4))] * 2
    # a launch whose key launch() cannot cache (a parameter left to its default): Triton's path each call
    k2 = _Kernel(["X", "BLOCK", "EXTRA"])
    go2 = _launch.bind(k2, (1,), (X,), {"BLOCK": 4})
    go2()
    go2()
    assert len(k2.plain) == 2 and not k2.compiled.runs


def test_bind_under_the_interpreter_is_a_plain_launch(fast, monkeypatch):
    monkeypatch.setattr(_launch, "interpret_mode", lambda: True)
    k = _Kernel(["X"])
    go = _launch.bind(k, (1,), (torch.zeros(2),), {})
    go()
    go()
    assert len(k.plain) == 2 and not k.compiled.runs


def test_run_skips_empty_launch_hooks(fast, monkeypatch):
    """With no launch hook registered (Triton's empty ``HookChain`` objects), a repeated launch
    passes None for the hooks and their metadata (the launcher then skips them); a registered hook,
    or ``SKIP_EMPTY_HOOKS`` off, gets Triton's own metadata and hooks."""
    from triton import knobs

    seen = []

    class Compiled(_Compiled):
        def launch_metadata(self, grid, stream, *vals):
            return {"grid": grid}

        def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit, *vals):
            seen.append((meta, enter, exit))
            super().run(g0, g1, g2, stream, function, packed, meta, enter, exit, *vals)

    ck = Compiled()
    rt = knobs.runtime
    assert _launch._no_hook(None) and _launch._no_hook(rt.launch_enter_hook) == (not rt.launch_enter_hook.calls)
    _launch._run(ck, (3,), (3, 1, 1), (1, 2))
    assert seen[-1] == (None, None, None) and ck.runs[-1] == ((3, 1, 1), (1, 2))
    hook = lambda meta: None  # noqa: E731
    rt.launch_enter_hook.add(hook)
    try:
        _launch._run(ck, (3,), (3, 1, 1), (1, 2))
        assert seen[-1] == ({"grid": (3,)}, rt.launch_enter_hook, rt.launch_exit_hook)
    finally:
        rt.launch_enter_hook.remove(hook)
    monkeypatch.setattr(_launch, "SKIP_EMPTY_HOOKS", False)
    _launch._run(ck, (3,), (3, 1, 1), (1, 2))
    assert seen[-1] == ({"grid": (3,)}, rt.launch_enter_hook, rt.launch_exit_hook)
    assert not _launch._no_hook(lambda meta: None)
