"""bfloat16 inside numba kernels: numba has no bfloat16 array type, so a bf16 tensor is uint16 storage.

On the device a bfloat16 tensor is a uint16 array of its bit patterns (memory.py makes the views; host
copies are ml_dtypes.bfloat16 arrays of the same bytes). Kernels read an element with `load` and write
one with `store`, computing in float32 between:
- `load(bits)`: bf16 -> float32 is exact: the 16 bits on top of a float32 whose low 16 bits are zero.
- `store(value)`: float32 -> bf16 rounds to nearest, ties to even (what torch and ml_dtypes do); a value
  that rounds past the largest bf16 becomes inf, a NaN stays a NaN. On a GPU it is the one instruction
  `cvt.rn.bf16.f32` (inline PTX: numba has no bf16 conversion of its own; the integer rounding it
  replaced cost rope 28% and softmax 13% of their fp16 rate on the H200), which gives NaNs the canonical
  pattern; the simulator rounds the bit pattern, `(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16`, keeping
  a NaN's sign.
A bf16 tensor moves the same bytes as a float16 one, and the kernels keep their float16 launch shapes and
vector loads (four uint16 words per `ld.global.v4`), so they run at the same share of HBM bandwidth.

On a GPU the bit casts are libdevice's `int_as_float` / `float_as_int` (one register move each); the CUDA
simulator has no libdevice, so under it the same names are numpy scalar views (decided at import, like
vector.py's loads).
"""

from __future__ import annotations

import numpy as np

from runtime.backends.cuda.compat import device, simulated


def _gpu_functions():
    from llvmlite import ir
    from numba.cuda import libdevice, types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def round_to_bits(typingctx, value):
        """float32 -> the bit pattern of the nearest bf16, ties to even: one `cvt.rn.bf16.f32` (sm_80+)."""
        if not isinstance(value, types.Float):
            return None

        def codegen(context, builder, signature, args):
            single = context.cast(builder, args[0], signature.args[0], types.float32)
            convert = ir.InlineAsm(ir.FunctionType(ir.IntType(16), [ir.FloatType()]), "cvt.rn.bf16.f32 $0, $1;", "=h,f")
            return builder.call(convert, [single])

        return types.uint16(value), codegen

    @device()
    def load(bits):
        return libdevice.int_as_float(types.int32(types.int64(bits) << 16))

    @device()
    def store(value):
        return round_to_bits(types.float32(value))

    return load, store


def _simulated_functions():
    @device()
    def load(bits):
        return np.uint32(int(bits) << 16).view(np.float32)

    @device()
    def store(value):
        bits = int(np.float32(value).view(np.uint32))
        if (bits & 0x7FFFFFFF) > 0x7F800000:
            return np.uint16((bits >> 16) | 0x40)
        return np.uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)

    return load, store


load, store = _simulated_functions() if simulated() else _gpu_functions()


def widen(xp, words):
    """uint16 words of bfloat16 as float32 values, for array libraries without bfloat16 (`xp`: numpy or
    CuPy; the einsums that are no GEMM compute in float32 through these)."""
    return (words.astype(xp.uint32) << 16).view(xp.float32)


def narrow(xp, values):
    """float32 values as uint16 words of bfloat16, rounded as `store` rounds."""
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return xp.where((bits & 0x7FFFFFFF) > 0x7F800000, (bits >> 16) | 0x40, rounded).astype(xp.uint16)
