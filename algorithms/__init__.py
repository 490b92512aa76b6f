"""scikit-learn-style estimators trained through fusedml's fused operators.

Every product with the design matrix goes through :func:`fusedml.mmchain` /
:func:`fusedml.matvec`, and ``backend="fused" | "ops" | "cpu"`` runs the SAME iterations on
each backend (the honest end-to-end comparison).
"""
from ._base import ConvergenceWarning, DataConversionWarning, NotFittedError
from .glm import GammaRegressor, GeneralizedLinearRegressor, PoissonRegressor, TweedieRegressor
from .linear import LinearRegression, Ridge
from .logistic import LogisticRegression
from .mixture import GaussianMixture, KMeans
from .svm import LinearSVC

__all__ = [
    "ConvergenceWarning",
    "DataConversionWarning",
    "GammaRegressor",
    "GaussianMixture",
    "GeneralizedLinearRegressor",
    "KMeans",
    "LinearRegression",
    "LinearSVC",
    "LogisticRegression",
    "NotFittedError",
    "PoissonRegressor",
    "Ridge",
    "TweedieRegressor",
]

