"""Run a test file's ahead-of-time sm_90 compile section in a subprocess (no GPU needed).

The interpreter must be off before triton is imported, hence a fresh process; the file's
``if __name__ == "__main__" and "--aot" in sys.argv`` block prints one ``AOT ...`` line per kernel.
"""
import os
import subprocess
import sys

import numpy as np
import pytest


def require_tools(tools=("ptxas", "cuobjdump")):
    """Skip the calling test unless triton's NVIDIA backend ships ``tools`` (sm_90 compiles need them)."""
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not all(os.path.exists(os.path.join(bindir, t)) for t in tools):
        pytest.skip(f"triton's NVIDIA backend tools ({', '.join(tools)}) are not installed")


def _compile_env():
    """The environment of a compiling subprocess: no interpreter, FP fusion on (the JIT's default)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    return env


def run_aot(test_file, expected, *, at_least=False, tools=("ptxas", "cuobjdump"), timeout=900):
    """Compile ``test_file``'s kernels for sm_90 in a subprocess; assert ``expected`` AOT lines."""
    require_tools(tools)
    r = subprocess.run([sys.executable, test_file, "--aot"], env=_compile_env(), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    n = r.stdout.count("AOT ")
    assert (n >= expected) if at_least else (n == expected), r.stdout[-3000:]


def _cuobjdump(kernel, flag):
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def resource_usage(kernel):
    """``(registers, stack bytes)`` of a compiled kernel, from cuobjdump on its cubin (stack > 0: spills)."""
    import re

    usage = _cuobjdump(kernel, "--dump-resource-usage")
    return int(re.search(r"REG:(\d+)", usage).group(1)), int(re.search(r"STACK:(\d+)", usage).group(1))


def sass(kernel):
    """The compiled kernel's SASS text (cuobjdump)."""
    return _cuobjdump(kernel, "--dump-sass")


def _loops(sass_text):
    """``(instructions, loops)``: ``[(address, text)]`` and the ``(first, latch)`` address ranges from
    each conditional backward branch's target to the branch. Unconditional backward branches are
    the returns of out-of-line code (divergent paths) and do not open a range."""
    import re

    insts = [(int(a, 16), body) for a, body in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass_text)]
    loops = []
    for addr, body in insts:
        m = re.match(r"@!?U?P\w+\s+BRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)", body.strip())
        if m and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr))
    return insts, loops


def local_memory_in_loops(sass_text):
    """Local-memory instructions (``LDL`` / ``STL``: register spills) inside the kernel's loops.

    A spill around a loop (saved before, restored after) costs a few instructions per program; one
    inside a loop costs them per iteration.

    Returns
    -------
    int
        The number of ``LDL`` / ``STL`` instructions inside some loop.
    """
    import re

    insts, loops = _loops(sass_text)
    return sum(1 for addr, body in insts if re.search(r"\b(LDL|STL)\b", body)
               and any(lo <= addr <= hi for lo, hi in loops))


def innermost_loop_opcodes(sass_text):
    """Opcode counts (``"FFMA"``, ``"LDS"``, ... without modifiers) over the instructions of the
    kernel's innermost loops (those that contain no other loop): the per-iteration work."""
    import collections
    import re

    insts, loops = _loops(sass_text)
    inner = [(lo, hi) for lo, hi in loops if not any((a, b) != (lo, hi) and lo <= a and b <= hi for a, b in loops)]
    ops = collections.Counter()
    for addr, body in insts:
        if any(lo <= addr <= hi for lo, hi in inner):
            m = re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", body.strip())
            if m:
                ops[m.group(1)] += 1
    return ops


def compile_sm90(fn, types, consts, values=None, divisible=None, **options):
    """Compile ``fn`` for sm_90 (the H200) specialised as the JIT specialises a real launch.

    The JIT marks every 16-byte-aligned pointer and every integer that is a multiple of 16 with
    ``tt.divisibility = 16``, and makes an integer equal to 1 a constant (Triton 3.6-3.9). Without
    these, loads that vectorise on the GPU (unit feature stride, 16-aligned rows) compile as scalar
    loads with other layouts, registers and spills. Pointers are taken as aligned (torch
    allocations are); integers are specialised from ``values`` (name -> the launch's value), and
    stay generic where no value is given.

    Parameters
    ----------
    fn : triton.runtime.JITFunction
        The kernel.
    types : dict
        Argument name -> Triton type string (``"*fp32"``, ``"i32"``, ...) for every non-constexpr.
    consts : dict
        The launch's constexpr arguments.
    values : dict, optional
        Integer argument name -> the value a launch passes.
    divisible : iterable of str, optional
        The arguments to mark divisible by 16, in place of the rule above (a recorded launch's
        own; its integers equal to 1 are already in ``consts``).
    **options
        Compile options (``num_warps``, ``num_stages``).

    Returns
    -------
    triton.compiler.CompiledKernel
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    values = values or {}
    sig, attrs, consts = {}, {}, dict(consts)
    for i, a in enumerate(fn.arg_names):
        if a in consts:
            sig[a] = "constexpr"
            continue
        sig[a] = types[a]
        v = values.get(a)
        if divisible is not None:
            if a in divisible:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif sig[a].startswith("*") or (v is not None and v % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif v == 1:
            sig[a], consts[a] = "constexpr", 1
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)


# ---------------------------------------------------------------------------------------------
# Every launch a call makes, compiled for sm_90: record launches under the interpreter, then
# compile each distinct one (as the JIT would specialise it) in a process without the interpreter.

_TORCH_TY = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16", "float16": "fp16", "int64": "i64",
             "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")


def launch_descriptor(fn, args, kwargs):
    """The sm_90 compile a JIT launch of ``fn(*args, **kwargs)`` would make: a picklable dict.

    Tensors become typed pointers (``tt.divisibility = 16`` when 16-byte aligned), integers are
    specialised as the JIT does (a multiple of 16 gets the divisibility hint, 1 becomes a
    constant), constexpr parameters keep their values, and launch options are kept apart.
    ``rounded`` names the float arguments the GPU would change: the JIT passes a Python float as
    fp32 (the interpreter keeps float64), so a float64 kernel must only get fp32-exact floats.
    """
    import inspect

    from triton.runtime.jit import _normalize_ty

    params = list(inspect.signature(fn).parameters.values())
    ann = {p.name: _normalize_ty(p.annotation) if p.annotation is not inspect.Parameter.empty else None
           for p in params}
    bound = dict(zip([p.name for p in params], args))
    options = {k: kwargs[k] for k in _OPTIONS if k in kwargs}
    bound.update({k: v for k, v in kwargs.items() if k not in _OPTIONS})
    types, consts, attrs, rounded = {}, {}, [], []
    for p in params:
        v = bound[p.name] if p.name in bound else p.default
        if ann[p.name] == "constexpr" or v is None:
            consts[p.name] = v
        elif hasattr(v, "data_ptr"):
            types[p.name] = "*" + _TORCH_TY[str(v.dtype).replace("torch.", "")]
            if v.data_ptr() % 16 == 0:
                attrs.append(p.name)
        elif isinstance(v, bool):
            types[p.name] = "i1"
        elif isinstance(v, int):
            if v == 1:
                consts[p.name] = 1
                continue
            types[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
            if v % 16 == 0:
                attrs.append(p.name)
        elif isinstance(v, float):
            types[p.name] = "fp32"
            if float(np.float32(v)) != v:
                rounded.append(p.name)
        else:
            raise TypeError(f"{fn.__name__}: argument {p.name} of type {type(v).__name__}")
    return dict(module=fn.__module__, name=fn.__name__, types=types, consts=consts, attrs=sorted(attrs),
                options=options, rounded=rounded)


class record_launches:
    """Context manager that records every interpreted Triton launch as a :func:`launch_descriptor`.

    ``with record_launches() as rec: ...`` runs the body as usual (the kernels still execute) and
    leaves the distinct descriptors in ``rec.launches``, each with ``origin``: the value of
    ``rec.origin`` (set it to name the call being run) when the launch was first seen. With
    ``execute=False`` the kernels are recorded and not run (outputs keep whatever they held): a
    call's launches at full benchmark shapes cost its host code only.
    """

    origin = None

    def __init__(self, execute=True):
        self.execute = execute

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self.launches, self._keys, self._orig = [], set(), InterpretedFunction.run
        rec, orig = self, self._orig

        def run(kernel, *args, grid, warmup, **kwargs):
            d = launch_descriptor(kernel.fn, args, kwargs)
            key = repr(d)
            if key not in rec._keys:
                rec._keys.add(key)
                rec.launches.append(dict(d, origin=rec.origin))
            if rec.execute:
                return orig(kernel, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = self._orig
        return False


SM90_MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)


def compile_descriptor(d):
    """Compile one :func:`launch_descriptor` for sm_90 (the interpreter must be off).

    Returns
    -------
    dict
        ``kernel``, ``regs``, ``stack`` (bytes), ``loop_spills`` (local-memory instructions inside
        loops), ``inner_ops`` (:func:`innermost_loop_opcodes`), ``shared`` (bytes); or ``kernel`` and ``error`` when the compile fails (``error``
        also when the kernel needs more shared memory than an sm_90 block may use).
    """
    import importlib

    fn = getattr(importlib.import_module(d["module"]), d["name"])
    tag = f"{d['name']} {d['options']} " + " ".join(f"{k}={v}" for k, v in d["consts"].items() if v is not None)
    tag += f" ({d['origin']})" if d.get("origin") else ""
    try:
        k = compile_sm90(fn, d["types"], d["consts"], divisible=d["attrs"], **d["options"])
    except Exception as e:  # a launch the H200's Triton cannot compile
        return dict(kernel=tag, error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
    regs, stack = resource_usage(k)
    text = sass(k)
    out = dict(kernel=tag, regs=regs, stack=stack, loop_spills=local_memory_in_loops(text),
               inner_ops=dict(innermost_loop_opcodes(text)), shared=k.metadata.shared)
    if k.metadata.shared > SM90_MAX_SHARED:  # compiles, but the launch fails (out of resources)
        out["error"] = f"shared memory {k.metadata.shared} B > {SM90_MAX_SHARED} B per block"
    return out


def compile_descriptors(launches, timeout=3000):
    """Compile recorded launches in a subprocess without the interpreter; one result per launch."""
    import pickle
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.pkl"), os.path.join(tmp, "out.pkl")
        with open(src, "wb") as f:
            pickle.dump(launches, f)
        code = ("import pickle, sys; sys.path[:0] = sys.argv[3:]; import _sm90; "
                "r = [_sm90.compile_descriptor(d) for d in pickle.load(open(sys.argv[1], 'rb'))]; "
                "pickle.dump(r, open(sys.argv[2], 'wb'))")
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, "-c", code, src, dst, here, os.path.dirname(here)], env=_compile_env(),
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, r.stderr[-3000:]
        with open(dst, "rb") as f:
            return pickle.load(f)
