"""Run a test file's ahead-of-time sm_90 compile section in a subprocess (no GPU needed).

The interpreter must be off before triton is imported, hence a fresh process; the file's
``if __name__ == "__main__" and "--aot" in sys.argv`` block prints one ``AOT ...`` line per kernel.
"""
import os
import subprocess
import sys

import pytest


def run_aot(test_file, expected, *, at_least=False, tools=("ptxas", "cuobjdump"), timeout=900):
    """Compile ``test_file``'s kernels for sm_90 in a subprocess; assert ``expected`` AOT lines."""
    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    if not all(os.path.exists(os.path.join(bindir, t)) for t in tools):
        pytest.skip(f"triton's NVIDIA backend tools ({', '.join(tools)}) are not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    r = subprocess.run([sys.executable, test_file, "--aot"], env=env, capture_output=True, text=True,
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


def local_memory_in_loops(sass_text):
    """Local-memory instructions (``LDL`` / ``STL``: register spills) inside the kernel's loops.

    A loop is the address range from a conditional backward branch's target to the branch (its
    latch); unconditional backward branches are the returns of out-of-line code (divergent paths)
    and do not open a range. A spill around a loop (saved before, restored after) costs a few
    instructions per program; one inside a loop costs them per iteration.

    Returns
    -------
    int
        The number of ``LDL`` / ``STL`` instructions inside some loop.
    """
    import re

    insts = [(int(a, 16), body) for a, body in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass_text)]
    loops = []
    for addr, body in insts:
        m = re.match(r"@!?U?P\w+\s+BRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)", body.strip())
        if m and int(m.group(1), 16) <= addr:
            loops.append((int(m.group(1), 16), addr))
    return sum(1 for addr, body in insts if re.search(r"\b(LDL|STL)\b", body)
               and any(lo <= addr <= hi for lo, hi in loops))
