"""Vector loads and stores for the memory-bound kernels: four consecutive elements in one instruction.

A warp that loads one float16 per thread moves 64 bytes per instruction, and each thread keeps two bytes
in flight; HBM needs far more than that to run at its rate. `load4(a, i)` reads a[i .. i+3] of a
C-contiguous array as one `ld.global.v4` (8 bytes for float16, 16 for float32) and `store4` writes four
the same way, so a warp moves 256 or 512 bytes per instruction. The caller guarantees that `i` is a
multiple of 4 and that the array's data is aligned to four elements (arena views are 256-byte aligned;
the registry checks before it picks a vector kernel).

These are numba `intrinsic`s (LLVM vector types); the CUDA simulator cannot run those, so under it the
same names are plain device functions with the same meaning, element by element.
"""

from __future__ import annotations

from runtime.backends.cuda.compat import cuda, simulated


def _intrinsics():
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def pointer(context, builder, arrty, array, index, indexty):
        data = context.make_array(arrty)(context, builder, value=array).data
        offset = context.cast(builder, index, indexty, types.intp)
        vector = ir.VectorType(context.get_data_type(arrty.dtype), 4)
        return builder.bitcast(builder.gep(data, [offset]), vector.as_pointer()), vector

    @intrinsic
    def load4(typingctx, array, index):
        if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
            return None
        sig = types.UniTuple(array.dtype, 4)(array, index)

        def codegen(context, builder, signature, args):
            address, vector = pointer(context, builder, signature.args[0], args[0], args[1], signature.args[1])
            loaded = builder.load(address, align=4 * signature.args[0].dtype.bitwidth // 8)
            items = [builder.extract_element(loaded, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, signature.return_type, items)

        return sig, codegen

    @intrinsic
    def store4(typingctx, array, index, a, b, c, d):
        if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
            return None
        sig = types.none(array, index, a, b, c, d)

        def codegen(context, builder, signature, args):
            arrty = signature.args[0]
            address, vector = pointer(context, builder, arrty, args[0], args[1], signature.args[1])
            packed = ir.Constant(vector, ir.Undefined)
            for k in range(4):
                value = context.cast(builder, args[2 + k], signature.args[2 + k], arrty.dtype)
                packed = builder.insert_element(packed, value, ir.Constant(ir.IntType(32), k))
            builder.store(packed, address, align=4 * arrty.dtype.bitwidth // 8)
            return context.get_dummy_value()

        return sig, codegen

    return load4, store4


def _simulated():
    @cuda.jit(device=True)
    def load4(array, index):
        return array[index], array[index + 1], array[index + 2], array[index + 3]

    @cuda.jit(device=True)
    def store4(array, index, a, b, c, d):
        array[index] = a
        array[index + 1] = b
        array[index + 2] = c
        array[index + 3] = d

    return load4, store4


load4, store4 = _simulated() if simulated() else _intrinsics()


def _strided_intrinsics():
    """`load4_2(a, i, j)`, `load4_3(a, h, i, j)` and `store4_2(a, i, j, w, x, y, z)`: a quad of a 2-D or
    3-D array at an index, through the array's own strides (views such as cuDNN's [heads, rows, d] output,
    whose heads interleave), for the last axis contiguous, `j` a multiple of 4 and the rows aligned."""
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def address(context, builder, arrty, array, indices, indextys):
        ary = context.make_array(arrty)(context, builder, value=array)
        inds = [context.cast(builder, i, t, types.intp) for i, t in zip(indices, indextys)]
        pointer = cgutils.get_item_pointer(context, builder, arrty, ary, inds)
        vector = ir.VectorType(context.get_data_type(arrty.dtype), 4)
        return builder.bitcast(pointer, vector.as_pointer())

    def loader(rank):
        def typer(typingctx, array, *indices):
            if not isinstance(array, types.Array) or array.ndim != rank or len(indices) != rank:
                return None
            if not all(isinstance(i, types.Integer) for i in indices):
                return None
            sig = types.UniTuple(array.dtype, 4)(array, *indices)

            def codegen(context, builder, signature, args):
                arrty = signature.args[0]
                vector_pointer = address(context, builder, arrty, args[0], args[1:], signature.args[1:])
                loaded = builder.load(vector_pointer, align=4 * arrty.dtype.bitwidth // 8)
                items = [builder.extract_element(loaded, ir.Constant(ir.IntType(32), k)) for k in range(4)]
                return context.make_tuple(builder, signature.return_type, items)

            return sig, codegen

        return typer

    def load4_2(typingctx, array, i, j):
        return loader(2)(typingctx, array, i, j)

    def load4_3(typingctx, array, h, i, j):
        return loader(3)(typingctx, array, h, i, j)

    def store4_2(typingctx, array, i, j, a, b, c, d):
        if not isinstance(array, types.Array) or array.ndim != 2 or not isinstance(i, types.Integer) or not isinstance(j, types.Integer):
            return None
        sig = types.none(array, i, j, a, b, c, d)

        def codegen(context, builder, signature, args):
            arrty = signature.args[0]
            vector_pointer = address(context, builder, arrty, args[0], args[1:3], signature.args[1:3])
            packed = ir.Constant(vector_pointer.type.pointee, ir.Undefined)
            for k in range(4):
                value = context.cast(builder, args[3 + k], signature.args[3 + k], arrty.dtype)
                packed = builder.insert_element(packed, value, ir.Constant(ir.IntType(32), k))
            builder.store(packed, vector_pointer, align=4 * arrty.dtype.bitwidth // 8)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(load4_2), intrinsic(load4_3), intrinsic(store4_2)


def _strided_simulated():
    @cuda.jit(device=True)
    def load4_2(array, i, j):
        return array[i, j], array[i, j + 1], array[i, j + 2], array[i, j + 3]

    @cuda.jit(device=True)
    def load4_3(array, h, i, j):
        return array[h, i, j], array[h, i, j + 1], array[h, i, j + 2], array[h, i, j + 3]

    @cuda.jit(device=True)
    def store4_2(array, i, j, a, b, c, d):
        array[i, j] = a
        array[i, j + 1] = b
        array[i, j + 2] = c
        array[i, j + 3] = d

    return load4_2, load4_3, store4_2


load4_2, load4_3, store4_2 = _strided_simulated() if simulated() else _strided_intrinsics()


def aligned(*arrays) -> bool:
    """Whether every array (device array or view) may be read four elements at a time from its start."""
    from runtime.backends.cuda.memory import device_pointer

    return all(device_pointer(a) % (4 * a.dtype.itemsize) == 0 for a in arrays)


def rows_aligned(pointer: int, strides, itemsize: int) -> bool:
    """Whether an array at `pointer` with these byte strides, its last axis contiguous, may be read four
    elements at a time at every index whose last coordinate is a multiple of 4."""
    quad = 4 * itemsize
    return pointer % quad == 0 and strides[-1] == itemsize and all(s % quad == 0 for s in strides[:-1])
