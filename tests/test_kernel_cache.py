"""The cuda backend's kernels keep their compiled code on disk (compat.cached_kernel): numba's cache, under
a key of ours that is the same in every process for the same kernel and differs between kernels.

Checked without a GPU: the keys are computed from the kernels' Python functions, which numba-cuda builds
outside its simulator too (compiling them needs a GPU; the H200 run, bench/bench_coldstart.py, measures
the second process loading them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = r"""
import hashlib, json
from runtime.backends.cuda import compat
import runtime.backends.cuda.kernels_numba as kn
kernels = {
    "silu-f16": kn.unary("silu", "float16"), "silu-f16-scalar": kn.unary("silu", "float16", False),
    "exp-bf16": kn.unary("exp", "bfloat16"), "add-f16": kn.binary_same("add", "float16"),
    "mul-f16": kn.binary_same("mul", "float16"), "broadcast": kn.binary_broadcast("mul", "float16"),
    "decode": kn.decode_attention("float16", "float32", True, False, True, False),
    "merge": kn.attention_merge("float16", True, True, True, "float16"),
}
out = {}
for name, k in kernels.items():
    cells = compat._fingerprint(tuple(c.cell_contents for c in k.py_func.__closure__ or ()))
    out[name] = {"key": None if cells is None else hashlib.sha256((compat._fingerprint(k.py_func) + cells).encode()).hexdigest(),
                 "cache": type(getattr(k, "_cache", None)).__name__}
print(json.dumps(out))
"""


def _keys(simulator: str) -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": simulator, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KEYS], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernel_keys_are_the_same_in_every_process_and_differ_between_kernels() -> None:
    first, second = _keys("0"), _keys("0")
    assert first == second
    keys = [entry["key"] for entry in first.values()]
    assert None not in keys and len(set(keys)) == len(keys)
    assert all(entry["cache"] == "CUDACache" for entry in first.values())


def test_the_simulator_and_the_switch_leave_kernels_uncached() -> None:
    assert all(entry["cache"] != "CUDACache" for entry in _keys("1").values())
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "TURNIP_KERNEL_CACHE": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", KEYS], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(entry["cache"] != "CUDACache" for entry in json.loads(done.stdout.strip().splitlines()[-1]).values())


def test_a_cell_without_a_stable_value_gives_no_key() -> None:
    from runtime.backends.cuda import compat

    class Opaque:
        pass

    assert compat._fingerprint((1, "a", 2.5)) == compat._fingerprint((1, "a", 2.5))
    assert compat._fingerprint((Opaque(),)) is None
