"""The cuda backend: memgraphs on NVIDIA GPUs (numba-cuda memory, streams and kernels, cuBLAS GEMMs).

Modules, each owning one job (docs/runtime.md has the table): `backend` (the `CudaBackend` the executor
drives; its docstring is the design), `driver` (the GPU or the CUDA simulator, chosen once), `devices`
(contexts, arenas, workspaces, streams, peers), `libraries` (cuBLAS, CuPy and torch warmed up and
detached), `lanes` (CuPy's allocator of lane scratch), `copies` (views, copies, inputs and outputs),
`clock` (events and device time), `completion` (how the loop learns that work finished), `sampling`
(free memory while running), `services` (the `KernelEnv` the builders use), `builders` (kernel name ->
launch builder), `compat` (the GPU image's quirks), `memory`, `launch`, `gemm`, `vector`, `kernels_numba`
and `attention`. Importing this package needs numba-cuda; nothing here imports CuPy or torch until a GPU run.
"""

from runtime.backends.cuda.backend import CudaBackend
from runtime.backends.cuda.compat import gpu_count, simulated

__all__ = ["CudaBackend", "gpu_count", "simulated"]
