"""fusedml: whole ML algorithms on the GPU through fused Triton kernels."""
from ._dispatch import BackendUnavailableError, interpret_mode, resolve_backend
from ._validation import CSRMatrix, as_csr, as_matrix
from .mmchain import matvec, mmchain

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "CSRMatrix",
    "as_csr",
    "as_matrix",
    "interpret_mode",
    "matvec",
    "mmchain",
    "resolve_backend",
    "__version__",
]
