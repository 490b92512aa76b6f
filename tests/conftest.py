"""Test set-up: Triton kernels run on the CPU through the interpreter."""
import os

# Must be set before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture
def rng():
    """A fresh seeded numpy generator per test."""
    return np.random.default_rng(1234)
