"""Test-session set-up: numba-cuda runs in its simulator unless a GPU run asks for the real device.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so it is set here, at collection.
The GPU test script (bench/gpu_check.py) runs pytest with NUMBA_ENABLE_CUDASIM=0 and `-m gpu`.
Every test keeps its plan choices in a cache of its own (TURNIP_CACHE, turnip/choice_cache.py): none
reads a choice another test, or an earlier run, kept.
"""

import os

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


@pytest.fixture(autouse=True)
def _own_choice_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TURNIP_CACHE", str(tmp_path_factory.mktemp("choices")))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only against a real GPU (NUMBA_ENABLE_CUDASIM=0 and a device present)."""
    from runtime.backends import cuda_usable

    if cuda_usable():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU with numba-cuda and CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
