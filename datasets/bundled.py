"""Small real data sets shipped in ``datasets/data/`` (sources and licences in ``datasets/README.md``).

Every file is a gzip-compressed CSV: one header row of column names, the last column ``target``.
"""
from __future__ import annotations

import gzip
import os

import numpy as np

from ._base import Dataset

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

# name -> (task, target dtype, description)
_REGISTRY = {
    "breast_cancer": (
        "binary", np.int64,
        "Breast Cancer Wisconsin (Diagnostic), 569 x 30, target 0 = malignant, 1 = benign. "
        "UCI Machine Learning Repository (Wolberg, Street, Mangasarian, 1995), CC BY 4.0; "
        "copied from scikit-learn's bundled copy.",
    ),
    "wine": (
        "multiclass", np.int64,
        "Wine recognition, 178 x 13, 3 cultivars. UCI Machine Learning Repository "
        "(Aeberhard, Forina, 1991), CC BY 4.0; copied from scikit-learn's bundled copy.",
    ),
    "digits": (
        "multiclass", np.int64,
        "Optical recognition of handwritten digits (8 x 8 images, test part), 1797 x 64, 10 classes. "
        "UCI Machine Learning Repository (Alpaydin, Kaynak, 1998), CC BY 4.0; copied from "
        "scikit-learn's bundled copy.",
    ),
    "iris": (
        "clustering", np.int64,
        "Iris, 150 x 4, 3 species (target = species, for scoring clusterings). UCI Machine "
        "Learning Repository (Fisher, 1936), CC BY 4.0; copied from scikit-learn's bundled copy.",
    ),
    "randhie": (
        "counts", np.float64,
        "RAND Health Insurance Experiment, 20190 x 9, target = number of outpatient visits to an MD "
        "(counts, for Poisson/Tweedie). Public domain (RAND HIE via Cameron and Trivedi 2005); "
        "copied from statsmodels' bundled copy.",
    ),
    "grunfeld": (
        "positive", np.float64,
        "Grunfeld (1950) investment data, 220 x 13, target = gross investment (strictly positive, "
        "for Gamma/Ridge). Features: log market value, log capital stock, years since 1935, and "
        "dummies for 10 firms (General Motors omitted). Public domain (Kleiber and Zeileis 2008 "
        "recreation); copied from statsmodels' bundled copy.",
    ),
}


def list_datasets() -> list:
    """Names of the bundled data sets, for :func:`load`.

    Returns
    -------
    list of str
    """
    return sorted(_REGISTRY)


def describe(name: str) -> str:
    """One-paragraph description (origin, licence) of a bundled data set.

    Parameters
    ----------
    name : str
        A name from :func:`list_datasets`.

    Returns
    -------
    str
    """
    _check_name(name)
    return _REGISTRY[name][2]


def _check_name(name):
    if name not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; bundled data sets: {', '.join(list_datasets())}")


def load(name: str, *, standardize: bool = False, dtype=np.float64, return_torch: bool = False,
         device=None) -> Dataset:
    """Load a bundled data set.

    Parameters
    ----------
    name : str
        One of :func:`list_datasets`: ``breast_cancer`` (binary), ``wine``, ``digits``
        (multiclass), ``iris`` (clustering), ``randhie`` (counts), ``grunfeld`` (positive).
    standardize : bool
        Centre each feature and scale it to unit variance (constant features are only centred).
        The solvers converge in far fewer iterations on standardized data.
    dtype : numpy dtype
        Floating dtype of ``X`` (float64 or float32).
    return_torch : bool
        Return ``X`` and ``y`` as torch tensors (on ``device``) instead of numpy arrays.
    device : str or torch.device, optional
        With ``return_torch``, where the tensors go (default CPU).

    Returns
    -------
    Dataset
        ``X`` is ``[N, D]`` of ``dtype``; ``y`` is ``[N]``, int64 for class labels, float64
        otherwise (the target's dtype is kept whatever ``dtype`` is).
    """
    _check_name(name)
    task, ydtype, desc = _REGISTRY[name]
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    path = os.path.join(DATA_DIR, name + ".csv.gz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"bundled data file missing: {path} (broken installation?)")
    with gzip.open(path, "rt") as f:
        names = f.readline().strip().split(",")
        table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    X = table[:, :-1]
    y = table[:, -1].astype(ydtype)
    if standardize:
        mu = X.mean(0)
        sd = X.std(0)
        sd[sd == 0] = 1.0
        X = (X - mu) / sd
        desc += " Features standardized (zero mean, unit variance)."
    X = np.ascontiguousarray(X, dtype=dtype)
    if return_torch:
        import torch

        X = torch.from_numpy(X).to(device or "cpu")
        y = torch.from_numpy(np.ascontiguousarray(y)).to(device or "cpu")
    return Dataset(X=X, y=y, name=name, task=task, description=desc, feature_names=names[:-1])
