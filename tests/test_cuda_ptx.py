"""Every numba kernel of the cuda backend compiles for an H200 (sm_90), in float16, bfloat16, float32 and float64.

The simulator runs kernels as Python, so it cannot catch what only real compilation rejects (a type
numba cannot unify, a float16 conversion it lacks). `cuda.compile_ptx` needs no GPU, only NVVM and
NVRTC: where they are missing this test is skipped, and bench/gpu_check.py compiles the kernels anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import re
import sys
from numba import cuda
from numba.cuda import types as T
from runtime.backends.cuda import kernels_numba as K
import types, numba.cuda.dispatcher as D
# A device function compiles for the current device's compute capability, which needs a driver; the
# kernels here target sm_90 anyway, so tell the device-function compiler the same.
D.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))

def arr(dt, nd, layout="C"):
    return T.Array({"float16": T.float16, "bfloat16": T.uint16, "float32": T.float32, "float64": T.float64}[dt], nd, layout)

def ptx(kernel, sig):
    return cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0]

for dt in sys.argv[1].split(","):
    for vector in (True,) if dt == "bfloat16" else (True, False):  # bf16's element-wise builds are fp16's with its codec
        for name in K.UNARY:
            ptx(K.unary(name, dt, vector), (arr(dt, 1), arr(dt, 1), T.float64))
        for name in K.BINARY:
            ptx(K.binary_same(name, dt, vector), (arr(dt, 1),) * 3)
        ptx(K.swiglu(dt, vector), (arr(dt, 1),) * 3)
        ptx(K.softmax(dt, vector), (arr(dt, 1),) * 2 + (T.int64,))
        for weighted in (True, False):
            ptx(K.rmsnorm(dt, weighted, vector), (arr(dt, 1),) * 3 + (T.int64, T.float64))
    for name in K.BINARY:
        ptx(K.binary_broadcast(name, dt), (arr(dt, 1),) * 3 + (T.int64,) * 11)
    for vector in (True, False):
        ptx(K.rope(dt, vector), (arr(dt, 2),) * 4)
    for causal in (True, False):
        for windowed in (True, False):
            ptx(K.attention_scores_softmax(dt, causal, windowed), (arr(dt, 3), arr("float32", 2), T.int64, T.int64))
    for has_prev in (True, False):
        for final in (True, False):
            out = dt if final else "float32"
            for vector in (True, False):
                ptx(K.attention_merge(out, has_prev, final, vector), (arr(dt, 3, "A"), arr("float32", 2, "A"), arr("float32", 2, "A"), arr(out, 2), T.int64, T.int64))
    for has_prev in (True, False):
        for final in (True, False):
            out = dt if final else "float32"
            for own, windowed, vector in ((False, False, True), (False, True, False), (True, False, True)):
                prev = arr("float32", 2) if has_prev else arr(dt, 2)
                ptx(K.decode_attention(dt, out, has_prev, final, own, windowed, vector),
                    (arr(dt, 2), arr(dt, 3), arr(dt, 3), arr("float32", 1), prev, arr(out, 2)) + (T.int64,) * 3 + (T.float64, T.int64, T.int64))
if len(sys.argv) < 3:  # the instruction checks run in one of the processes
    print("compiled")
    sys.exit(0)
# the quad builds read and write with vector instructions, the element-by-element builds do not
for vector in (True, False):
    text = ptx(K.rmsnorm("float16", True, vector), (arr("float16", 1),) * 3 + (T.int64, T.float64))
    assert ("ld.global.v4.u16" in text and "st.global.v4.u16" in text) == vector, vector
    # the merge: float16 o through its strides, float32 prev and out (loads through strided "A" arrays come
    # out as generic `ld.v4`, not `ld.global.v4`: still one instruction per quad)
    text = ptx(K.attention_merge("float32", True, False, vector), (arr("float16", 3, "A"), arr("float32", 2, "A"), arr("float32", 2, "A"), arr("float32", 2), T.int64, T.int64))
    found = [bool(re.search(pattern, text)) for pattern in (r"ld(\.global)?\.v4\.u16", r"ld(\.global)?\.v4\.f32", r"st(\.global)?\.v4\.f32")]
    assert found == [vector] * 3, (vector, found)
    # rope by quads: one vector load per quad of x, cos and sin, one vector store per quad of out
    text = ptx(K.rope("float16", vector), (arr("float16", 2),) * 4)
    found = [bool(re.search(pattern, text)) for pattern in (r"ld(\.global)?\.v4\.u16", r"st(\.global)?\.v4\.u16")]
    assert found == [vector] * 2, ("rope", vector, found)
# bfloat16 (uint16 words) is rounded by one cvt.rn.bf16.f32 per stored element, not integer arithmetic
text = ptx(K.rope("bfloat16"), (arr("bfloat16", 2),) * 4)
assert text.count("cvt.rn.bf16.f32") >= 4, text.count("cvt.rn.bf16.f32")
print("compiled")
'''


def _toolchain() -> bool:
    probe = "from numba import cuda; from numba.cuda import types as T; cuda.compile_ptx(lambda x: None, (T.float32[:],), cc=(9, 0))"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, env=env, timeout=120).returncode == 0


@pytest.mark.skipif(not _toolchain(), reason="no NVVM/NVRTC here to compile PTX with")
@pytest.mark.parametrize("args", [("float16,float64", "checks"), ("bfloat16,float32",)], ids=["float16-float64", "bfloat16-float32"])
def test_every_kernel_compiles_to_ptx_for_sm90(args):
    """Two dtypes a case, in a process of its own: compiling is single-threaded, and `make test` runs the
    cases on separate pytest-xdist workers (CI has two cores)."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled" in proc.stdout
