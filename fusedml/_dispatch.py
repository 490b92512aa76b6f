"""The one dispatch rule of fusedml.

Every public operator resolves its ``backend`` argument here:

* ``"fused"`` -- the Triton kernels. Runs on CUDA tensors, or on CPU tensors when the Triton
  interpreter is active (``TRITON_INTERPRET=1`` set before triton was imported).
* ``"ops"`` -- the operator-level baseline a user would write by hand with torch
  (cuBLAS/cuSPARSE on CUDA, torch's CPU kernels otherwise).
* ``"cpu"`` -- the cache-blocked one-pass host implementation; needs host (CPU) data.
* ``"auto"`` -- ``"fused"`` for CUDA data, ``"cpu"`` otherwise.

The environment variable ``FUSEDML_BACKEND`` overrides ``"auto"`` (never an explicit choice).
Asking for a backend that cannot run raises :class:`BackendUnavailableError`.
"""
from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "fused", "ops", "cpu")


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run on this input or machine."""


def interpret_mode() -> bool:
    """Return True when Triton kernels run on the CPU through the Triton interpreter.

    Returns
    -------
    bool
        True when the ``TRITON_INTERPRET`` environment variable is set to a value other than
        ``""`` or ``"0"``.
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """Resolve a ``backend`` argument to ``"fused"``, ``"ops"`` or ``"cpu"``.

    Parameters
    ----------
    backend : {"auto", "fused", "ops", "cpu"} or None
        The requested backend; None means ``"auto"``.
    device : torch.device
        Where the operands live.

    Returns
    -------
    str
        The backend that will run.

    Raises
    ------
    ValueError
        Unknown backend name.
    BackendUnavailableError
        The backend cannot run on ``device`` here.
    """
    if backend is None:
        backend = "auto"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    device = torch.device(device)
    if backend == "auto":
        env = os.environ.get("FUSEDML_BACKEND", "auto")
        if env not in BACKENDS:
            raise ValueError(f"FUSEDML_BACKEND must be one of {BACKENDS}, got {env!r}")
        if env != "auto":
            return resolve_backend(env, device)
        return "fused" if device.type == "cuda" else "cpu"
    if backend == "fused":
        if device.type == "cuda":
            return "fused"
        if device.type == "cpu" and interpret_mode():
            return "fused"
        raise BackendUnavailableError(
            f"backend='fused' needs CUDA tensors (got data on {device}); on the CPU set "
            "TRITON_INTERPRET=1 before importing triton to run the kernels in the interpreter, "
            "or use backend='cpu'"
        )
    if backend == "cpu" and device.type != "cpu":
        raise BackendUnavailableError(
            f"backend='cpu' runs on host memory, but the data is on {device}; "
            "move it with .cpu() or use backend='fused' / 'ops'"
        )
    return backend
