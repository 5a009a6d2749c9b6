"""The fixtures scikit-learn's own test files take (from scikit-learn's conftest.py): both
dtypes always (float32 in must give float32 out), the default global random seed."""

import numpy as np
import pytest


@pytest.fixture(params=[np.float32, np.float64])
def global_dtype(request):
    return request.param


@pytest.fixture
def global_random_seed():
    return 42
