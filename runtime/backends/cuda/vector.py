"""Vector loads and stores for the memory-bound kernels: four consecutive elements in one instruction.

A warp that loads one float16 per thread moves 64 bytes per instruction, and each thread keeps two bytes
in flight; HBM needs far more than that to run at its rate. `load4(a, i)` reads a[i .. i+3] of a
C-contiguous array as one `ld.global.v4` (8 bytes for float16, 16 for float32) and `store4` writes four
the same way, so a warp moves 256 or 512 bytes per instruction. The caller guarantees that `i` is a
multiple of 4 and that the array's data is aligned to four elements (arena views are 256-byte aligned;
the registry checks before it picks a vector kernel).

These are numba `intrinsic`s (LLVM vector types); the CUDA simulator cannot run those, so under it the
same names are the `element_*` device functions, which read and write the same quads element by element
(and which the kernels also use for operands that are not aligned).
"""

from __future__ import annotations

from runtime.backends.cuda.compat import device, simulated


# The same quads element by element: the kernels' build for operands not aligned to four elements, and
# what the simulator runs in place of the vector instructions.
@device()
def element_load4(x, i):
    return x[i], x[i + 1], x[i + 2], x[i + 3]


@device()
def element_store4(x, i, a, b, c, d):
    x[i] = a
    x[i + 1] = b
    x[i + 2] = c
    x[i + 3] = d


@device()
def element_load4_2(x, i, j):
    return x[i, j], x[i, j + 1], x[i, j + 2], x[i, j + 3]


@device()
def element_load4_3(x, h, i, j):
    return x[h, i, j], x[h, i, j + 1], x[h, i, j + 2], x[h, i, j + 3]


@device()
def element_store4_2(x, i, j, a, b, c, d):
    x[i, j] = a
    x[i, j + 1] = b
    x[i, j + 2] = c
    x[i, j + 3] = d


def _intrinsics():
    """`load4(a, i)` and `store4(a, i, w, x, y, z)` at a flat element offset from a's data (C-contiguous
    arrays); `load4_2(a, i, j)`, `load4_3(a, h, i, j)` and `store4_2(a, i, j, w, x, y, z)` at an index of a
    2-D or 3-D array through its own strides (views such as cuDNN's [heads, rows, d] output, whose heads
    interleave), for the last axis contiguous, `j` a multiple of 4 and the rows aligned. Each finds the
    first element's address, then loads or stores one LLVM vector of four there."""
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def flat(context, builder, arrty, array, indices, indextys):
        data = context.make_array(arrty)(context, builder, value=array).data
        return builder.gep(data, [context.cast(builder, indices[0], indextys[0], types.intp)])

    def strided(context, builder, arrty, array, indices, indextys):
        ary = context.make_array(arrty)(context, builder, value=array)
        inds = [context.cast(builder, i, t, types.intp) for i, t in zip(indices, indextys)]
        return cgutils.get_item_pointer(context, builder, arrty, ary, inds)

    def vector_at(item, context, builder, signature, args, rank):
        arrty = signature.args[0]
        first = item(context, builder, arrty, args[0], args[1 : 1 + rank], signature.args[1 : 1 + rank])
        return arrty, builder.bitcast(first, ir.VectorType(context.get_data_type(arrty.dtype), 4).as_pointer())

    def typed(array, indices, ndim) -> bool:
        return isinstance(array, types.Array) and (ndim is None or array.ndim == ndim) and all(isinstance(i, types.Integer) for i in indices)

    def load(typingctx, array, indices, item, ndim):
        if not typed(array, indices, ndim):
            return None

        def codegen(context, builder, signature, args):
            arrty, pointer = vector_at(item, context, builder, signature, args, len(indices))
            loaded = builder.load(pointer, align=4 * arrty.dtype.bitwidth // 8)
            items = [builder.extract_element(loaded, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, items)

        return types.UniTuple(array.dtype, 4)(array, *indices), codegen

    def store(typingctx, array, indices, values, item, ndim):
        if not typed(array, indices, ndim):
            return None
        rank = len(indices)

        def codegen(context, builder, signature, args):
            arrty, pointer = vector_at(item, context, builder, signature, args, rank)
            packed = ir.Constant(pointer.type.pointee, ir.Undefined)
            for k in range(4):
                value = context.cast(builder, args[1 + rank + k], signature.args[1 + rank + k], arrty.dtype)
                packed = builder.insert_element(packed, value, ir.Constant(ir.IntType(32), k))
            builder.store(packed, pointer, align=4 * arrty.dtype.bitwidth // 8)
            return context.get_dummy_value()

        return types.none(array, *indices, *values), codegen

    @intrinsic
    def load4(typingctx, array, index):
        return load(typingctx, array, (index,), flat, None)

    @intrinsic
    def store4(typingctx, array, index, a, b, c, d):
        return store(typingctx, array, (index,), (a, b, c, d), flat, None)

    @intrinsic
    def load4_2(typingctx, array, i, j):
        return load(typingctx, array, (i, j), strided, 2)

    @intrinsic
    def load4_3(typingctx, array, h, i, j):
        return load(typingctx, array, (h, i, j), strided, 3)

    @intrinsic
    def store4_2(typingctx, array, i, j, a, b, c, d):
        return store(typingctx, array, (i, j), (a, b, c, d), strided, 2)

    return load4, store4, load4_2, load4_3, store4_2


if simulated():  # the simulator cannot run LLVM intrinsics
    load4, store4, load4_2, load4_3, store4_2 = element_load4, element_store4, element_load4_2, element_load4_3, element_store4_2
else:
    load4, store4, load4_2, load4_3, store4_2 = _intrinsics()


def aligned(*arrays) -> bool:
    """Whether every array (device array or view) may be read four elements at a time from its start."""
    from runtime.backends.cuda.memory import device_pointer

    return all(device_pointer(a) % (4 * a.dtype.itemsize) == 0 for a in arrays)


def arrays_rows_aligned(*arrays) -> bool:
    """`rows_aligned` for every numba array (device array or view; None: absent) through its own pointer
    and strides: whether kernels may read and write them by quads along their rows."""
    from runtime.backends.cuda.memory import device_pointer

    return all(rows_aligned(device_pointer(a), a.strides, a.dtype.itemsize) for a in arrays if a is not None)


def rows_aligned(pointer: int, strides, itemsize: int) -> bool:
    """Whether an array at `pointer` with these byte strides, its last axis contiguous, may be read four
    elements at a time at every index whose last coordinate is a multiple of 4."""
    quad = 4 * itemsize
    return pointer % quad == 0 and strides[-1] == itemsize and all(s % quad == 0 for s in strides[:-1])
