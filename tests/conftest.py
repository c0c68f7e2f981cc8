"""Test-session set-up: numba-cuda runs in its simulator unless a GPU run asks for the real device.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so it is set here, at collection.
The GPU test script (bench/gpu_check.py) runs pytest with NUMBA_ENABLE_CUDASIM=0 and `-m gpu`.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
