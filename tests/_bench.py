"""Load a script of ``benchmarks/`` as a module (its ``main(argv)`` is what the smoke tests call)."""
import importlib.util
import os


def bench_module(name):
    """The module ``benchmarks/<name>.py``, freshly executed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "benchmarks", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
