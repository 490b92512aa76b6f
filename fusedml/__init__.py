"""fusedml: whole ML algorithms on the GPU through fused Triton kernels."""
from ._dispatch import BackendUnavailableError, interpret_mode, resolve_backend
from ._validation import CSRMatrix, as_csr, as_matrix, clear_csr_caches
from .gmm import GMMStats, gmm_estep, gmm_mstep, gmm_score
from .kmeans import LloydStep, lloyd_step
from .mmchain import (BoundLossGradient, BoundMMChain, LossGradient, aligned_rows, bind_loss_gradient, bind_mmchain,
                      loss_gradient, matvec, mmchain)

__version__ = "0.1.0"

#: submodules loaded on first access (``fusedml.streaming`` imports dask), so that
#: ``import fusedml`` then ``fusedml.streaming.StreamedMatrix(...)`` works as the README writes it
_LAZY = ("streaming", "distributed", "cg", "bench", "cli")


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BackendUnavailableError",
    "BoundLossGradient",
    "BoundMMChain",
    "CSRMatrix",
    "GMMStats",
    "gmm_estep",
    "gmm_mstep",
    "gmm_score",
    "aligned_rows",
    "as_csr",
    "as_matrix",
    "bind_loss_gradient",
    "bind_mmchain",
    "clear_csr_caches",
    "interpret_mode",
    "LloydStep",
    "LossGradient",
    "loss_gradient",
    "lloyd_step",
    "matvec",
    "mmchain",
    "resolve_backend",
    "__version__",
]
