"""Test-session set-up: numba-cuda runs in its simulator unless a GPU run asks for the real device.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so it is set here, at collection.
The GPU test script (bench/gpu_check.py) runs pytest with NUMBA_ENABLE_CUDASIM=0 and `-m gpu`.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only against a real GPU (NUMBA_ENABLE_CUDASIM=0 and a device present)."""
    import pytest

    from runtime.backends import cuda_usable

    if cuda_usable():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU with numba-cuda and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
