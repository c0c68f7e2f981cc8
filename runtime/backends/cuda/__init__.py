"""The cuda backend: memgraphs on NVIDIA GPUs (numba-cuda memory, streams and kernels, cuBLAS GEMMs).

Modules, each owning one thing: `compat` (the GPU image's quirks, in one place), `memory` (the arena and
workspace per GPU, pinned host storage in chunks), `completion` (how the loop learns that work finished),
`launch` (kernel launches prepared once per vertex), `gemm` (einsums as cuBLAS GEMMs on arena views),
`kernels_numba` (everything that is not a GEMM), `attention` (fused attention providers), `registry`
(kernel name -> launch builder) and `backend` (the `CudaBackend` the executor drives; its docstring is
the design). Importing this package needs numba-cuda; nothing here imports CuPy or torch until a GPU run.
"""

from runtime.backends.cuda.backend import CudaBackend
from runtime.backends.cuda.compat import gpu_count, simulated

__all__ = ["CudaBackend", "gpu_count", "simulated"]
