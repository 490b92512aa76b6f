"""Data for fusedml: small bundled real data sets, seeded synthetic generators, file loaders.

>>> import datasets
>>> datasets.list_datasets()
['breast_cancer', 'digits', 'grunfeld', 'iris', 'randhie', 'wine']
>>> ds = datasets.load("breast_cancer", standardize=True)
>>> ds.X.shape, ds.task
((569, 30), 'binary')
>>> big = datasets.make_csr(1_000_000, 100_000, 32, "powerlaw", device="cpu")
"""
from ._base import TASKS, Dataset, infer_task
from .bundled import describe, list_datasets, load
from .loaders import load_npy, load_npz_shards, load_svmlight, save_svmlight
from .synthetic import (make_classification, make_csr, make_dense, make_gmm, make_regression,
                        row_lengths)

__all__ = [
    "Dataset", "TASKS", "describe", "infer_task", "list_datasets", "load",
    "load_npy", "load_npz_shards", "load_svmlight", "save_svmlight",
    "make_classification", "make_csr", "make_dense", "make_gmm", "make_regression", "row_lengths",
]
