"""Kernel launches prepared once per vertex, so that submitting one costs a driver call, not a dispatch.

A numba `kernel[grid, block, stream](*args)` call types every argument and marshals every array on each
launch (docs/runtime.md, "Kernels", gives the cost). A vertex launches the same kernel on the same arena views every
time, so `prepare_launch` does that work once in `prepare`: it compiles the specialisation for the
arguments' types, turns the arguments into the kernel's parameter list, and returns `go(stream)`, which
only calls cuda.core's `launch`. `array_args` builds the parameter block of an array that numba never saw
(a torch tensor), from its pointer, shape and strides. The CUDA simulator's driver (driver.py) launches
through numba instead.
"""

from __future__ import annotations

from runtime.backends.cuda.compat import cuda

_slow_path = False
"""Set when this numba-cuda's internals differ from what the fast path expects: launches go through numba."""


def prepare_launch(kernel, griddim, blockdim, args: tuple, shared: int = 0):
    """`go(stream)` launching `kernel` with `args` on `stream`; compiles now, not at the first launch."""
    global _slow_path
    if _slow_path:
        return lambda stream: kernel[griddim, blockdim, stream, shared](*args)
    try:
        from cuda.core import LaunchConfig, launch

        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        compiled = kernel.compile(argtypes)
        params: list = []
        for ty, value in zip(compiled.argument_types, args):
            compiled._prepare_args(ty, value, 0, [], params)
        function = compiled._codelibrary.get_cufunc().kernel
        config = LaunchConfig(grid=griddim, block=blockdim, shmem_size=shared)
    except (AttributeError, TypeError, ImportError):
        _slow_path = True
        return lambda stream: kernel[griddim, blockdim, stream, shared](*args)
    return lambda stream: launch(stream, config, function, *params)


def array_args(pointer: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> list:
    """The parameters numba passes for one array argument: meminfo, parent, size, itemsize, data, shape, strides (bytes)."""
    size = 1
    for extent in shape:
        size *= extent
    return [0, 0, size, itemsize, pointer, *shape, *strides]


def compiled_launch(kernel, argtypes: tuple, griddim, blockdim, shared: int = 0):
    """`go(stream, params)` for a kernel whose parameters change per call (arrays numba did not allocate)."""
    from cuda.core import LaunchConfig, launch

    compiled = kernel.compile(argtypes)
    function = compiled._codelibrary.get_cufunc().kernel

    def go(stream, params, grid=griddim):
        launch(stream, LaunchConfig(grid=grid, block=blockdim, shmem_size=shared), function, *params)

    return go


__all__ = ["array_args", "compiled_launch", "cuda", "prepare_launch"]
