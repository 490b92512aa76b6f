"""scikit-learn-style estimators trained through fusedml's fused operators.

Every product with the design matrix goes through :func:`fusedml.mmchain` /
:func:`fusedml.matvec`, and ``backend="fused" | "ops" | "cpu"`` runs the SAME iterations on
each backend (the honest end-to-end comparison).
"""
from ._base import ConvergenceWarning, NotFittedError
from .glm import GammaRegressor, GeneralizedLinearRegressor, PoissonRegressor, TweedieRegressor
from .linear import LinearRegression, Ridge
from .logistic import LogisticRegression
from .svm import LinearSVC

__all__ = [
    "ConvergenceWarning",
    "GammaRegressor",
    "GeneralizedLinearRegressor",
    "LinearRegression",
    "LinearSVC",
    "LogisticRegression",
    "NotFittedError",
    "PoissonRegressor",
    "Ridge",
    "TweedieRegressor",
]

try:  # GaussianMixture / KMeans live in algorithms/mixture.py (written by another helper)
    from .mixture import GaussianMixture, KMeans
except ModuleNotFoundError as _exc:  # only "the file does not exist yet"; real import errors propagate
    if _exc.name != f"{__name__}.mixture":
        raise
else:
    __all__ += ["GaussianMixture", "KMeans"]
