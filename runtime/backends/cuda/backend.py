"""The CudaBackend: a memgraph on NVIDIA GPUs through numba-cuda, cuBLAS and (optionally) torch's fused attention.

Memory. `prepare` takes everything: per GPU one arena of `memgraph.budget` bytes (every tensor a view at
its planned offset) and one workspace (per compute lane scratch), pinned host storage in chunks, and
warms up the libraries (cuBLAS per lane stream, torch's attention per lane and block shape) so that no
library allocates while the loop runs. During the loop CuPy's allocator refuses (or serves a lane's
scratch inside `cupy_scratch`), and torch's caching allocator is capped where warm-up left it.

Streams. One numba stream per lane of runtime/graph.py: `streams` compute lanes, H2D (reloads), D2H
(offloads) and peer-in (moves, pulled by the destination GPU) per GPU; peer access is enabled between GPUs.

Dependencies on the device. The backend has `device_deps`: the executor may submit a vertex whose
dependencies are only submitted. `submit` makes the lane's stream wait on the end event of every
unfinished dependency on another lane (stream order covers the same lane), records a start event, queues
the work, records an end event and queues a completion notice (runtime/backends/cuda/completion.py).
So the GPU starts a dependent kernel the moment its inputs are ready, with no host round trip.

Completions and time. `wait` blocks on the notifier, pops finished vertices off their lanes in order,
and stamps each with device times (event elapsed time since the GPU's origin event). CUDA errors arrive
late and stick: when a lane has pending work but no progress for a while, the streams are queried and a
failure ends the run with one line naming the vertices that were on the GPU. `close` synchronizes every
stream before memory goes, after a failure and after Ctrl-C too.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from dataclasses import dataclass
import time
from collections import deque

import numpy as np

from runtime.backends.base import Backend, Completion
from runtime.backends.cuda import attention, registry
from runtime.backends.cuda.compat import cuda, require_gpus, simulated, stream_handle, timing_event
from runtime.backends.cuda.completion import DEFAULT_NOTIFIER, NOTIFIERS, make_notifier
from runtime.backends.cuda.memory import CHUNK_BYTES, PinnedStorage, Workspace, device_bytes, device_pointer, device_view
from runtime.graph import ExecGraph, Lane
from runtime.inputs import Tiled, fill
from turnip_ir.units import format_size
from turnip_ir.errors import InputError, KernelError
from turnip_ir.memgraph import MemNode

LIBRARY_RESERVE = 32 << 20
"""Bytes per compute lane held back for cuBLAS's workspace pool on the lane's stream (14 MiB measured
per lane on the H200, docs/benchmarks.md); torch's attention memory is added per graph (attention.py)."""


RELEASE_AT_CLOSE = True
"""`close` frees the run's CUDA objects at once (`_release`); bench/investigations/exit_check.py turns it off to compare."""

DETACH_AT_CLOSE = True
"""`close` unbinds CuPy's cuBLAS handles and current streams from the run's streams (`_detach_libraries`);
bench/investigations/repeat_check.py turns it off to compare."""

PEERS_ENABLED: set[tuple[int, int]] = set()
"""Peer access is per process: enabled once for each ordered pair of GPUs."""


class CudaBackend(Backend):
    name = "cuda"
    device_deps = True

    def __init__(self, notifier: str = DEFAULT_NOTIFIER, queue_depth: int = 2, lookahead: bool = True, attention_provider: str = "auto",
                 chunk_bytes: int = CHUNK_BYTES, sample_memory: float = 0.0, copy_queue_depth: int | None = 4):
        if notifier not in NOTIFIERS:
            raise InputError(f"unknown notifier '{notifier}' (known: {', '.join(NOTIFIERS)})")
        self.notifier_kind = notifier
        self.device_deps = lookahead
        self.queue_depth = queue_depth if lookahead else 1
        self.copy_queue_depth = (queue_depth if copy_queue_depth is None else copy_queue_depth) if lookahead else 1
        """Depth of the copy-engine lanes (h2d, d2h, peer), which may queue deeper than the compute lanes: a
        tiny copy then cannot leave its engine idle while the host learns it finished. On llama 7b at 8k and
        2 GiB, depths 2 and 8 measured the same within noise (docs/benchmarks.md)."""
        self.attention_choice = attention_provider
        self.chunk_bytes = chunk_bytes
        self.sample_memory = sample_memory
        """Seconds between samples of each GPU's free memory while running (0: off)."""
        self.simulated = simulated()
        self.closed = False
        self.ready = False
        self.notifier = None
        self.stats: dict = {}

    def lane_depth(self, lane) -> int:
        return self.queue_depth if lane.kind == "compute" else self.copy_queue_depth

    # ----- set-up --------------------------------------------------------------------------------------
    def prepare(self, graph: ExecGraph, inputs: dict[str, np.ndarray]) -> None:
        memgraph = graph.memgraph
        self.graph = graph
        if not self.simulated:
            require_gpus(memgraph.devices)
        self.attention = attention.resolve(self.attention_choice, self.simulated)
        for node in memgraph.nodes:
            if node.dtype == "bfloat16":
                raise InputError(f"node {node.id} ({node.task}): bfloat16 has no numpy or numba array type; use float16 on cuda")
        began = time.perf_counter()
        self._devices(graph)
        self._views(graph)
        self._place_inputs(graph, inputs)
        self.work = [self._build(graph, v) for v in range(len(graph))]
        self._warm_up(graph)
        self._start_clock(graph)
        self.stats["prepare_s"] = time.perf_counter() - began
        self.ready = True

    def _devices(self, graph: ExecGraph) -> None:
        memgraph = graph.memgraph
        scratch = self.scratch_per_lane(memgraph.nodes, self.attention_choice, self.simulated)
        streams = sum(1 for lane in graph.lanes if lane.device == 0 and lane.kind == "compute")
        self.contexts, self.arenas, self.workspaces, self.free_at_start = [], [], [], []
        self.streams = [None] * len(graph.lanes)
        for device in range(memgraph.devices):
            with self._on(device):
                context = cuda.current_context()
                self.contexts.append(context)
                self.free_at_start.append(self._free_memory(context))
                self.arenas.append(device_bytes(memgraph.budget))
                self.workspaces.append(Workspace(streams, scratch))
                for lane in graph.lanes:
                    if lane.device == device:
                        self.streams[lane.index] = cuda.stream()
        self.launch_streams = [_launch_stream(stream) for stream in self.streams]
        """What kernel launches take: cuda.core streams made once from the handles (numba's under the simulator)."""
        self.slot_of = [lane.slot if lane.kind == "compute" else -1 for lane in graph.lanes]
        self.lane_device = [lane.device for lane in graph.lanes]
        self.current_device = -1
        """The device whose context launches go to; unknown until the first submit switches. The thread's
        current context and CuPy's device are what the previous run (or the caller) left, which after a
        run over several GPUs is not device 0: a cuBLAS call on GPU 0's handle from GPU 1 fails."""
        self.entry_device = _runtime_device() if not self.simulated else None
        self._enable_peers(memgraph.devices)
        self.stats["arena_bytes"] = memgraph.budget
        self.stats["workspace_bytes"] = self.workspaces[0].nbytes if self.workspaces else 0

    @contextlib.contextmanager
    def _on(self, device: int):
        if self.simulated:
            yield
            return
        with cuda.gpus[device]:
            yield

    def _free_memory(self, context) -> int:
        if self.simulated:
            return 0
        return int(context.get_memory_info()[0])

    def _enable_peers(self, devices: int) -> None:
        if self.simulated or devices < 2:
            return
        from numba.cuda.cudadrv.driver import CudaAPIError, driver

        for a in range(devices):
            with self._on(a):
                for b in range(devices):
                    if a != b and (a, b) not in PEERS_ENABLED and self.contexts[a].can_access_peer(self.contexts[b].device.id):
                        try:
                            driver.cuCtxEnablePeerAccess(self.contexts[b].handle, 0)
                        except CudaAPIError:
                            pass  # enabled by another library in this process
                        PEERS_ENABLED.add((a, b))

    def _views(self, graph: ExecGraph) -> None:
        nodes = graph.memgraph.nodes
        self.storage = PinnedStorage([node.storage for node in nodes if node.storage is not None], self.chunk_bytes)
        self.stats["pinned_bytes"] = self.storage.nbytes
        self.gpu_view: list = [None] * len(nodes)
        self.host_view: list = [None] * len(nodes)
        for i, node in enumerate(nodes):
            if node.loc is not None:
                self.gpu_view[i] = self._checked(node, self.arenas[node.device], node.loc, "location")
            if node.storage is not None:
                self.host_view[i] = self.storage.view(node.storage, tuple(node.shape), node.dtype)

    def _checked(self, node: MemNode, buffer, region, what: str):
        offset, size = region
        if size < node.nbytes:
            raise InputError(f"node {node.id} ({node.task}): {what} {list(region)} cannot hold {node.nbytes} bytes")
        return device_view(buffer, offset, tuple(node.shape), node.dtype)

    def place_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Put the inputs in place again, for another run of the same prepared memgraph (benchmarks): a run
        may reuse an input's location once nobody reads it, so a second run needs them back."""
        self._synchronize()
        self._place_inputs(self.graph, inputs)

    def _place_inputs(self, graph: ExecGraph, inputs: dict[str, np.ndarray]) -> None:
        for i, node in enumerate(graph.memgraph.nodes):
            if node.op != "input" or node.nbytes == 0:
                continue
            value = inputs[node.task]
            if node.loc is not None:
                data = value.materialize() if isinstance(value, Tiled) else np.ascontiguousarray(value)
                with self._on(node.device):
                    self.gpu_view[i].copy_to_device(data)
            else:
                fill(self.host_view[i], value)

    # ----- per-vertex work -----------------------------------------------------------------------------
    def _build(self, graph: ExecGraph, vertex: int):
        node = graph.node(vertex)
        if node.op == "input":
            return None
        sources = graph.sources[vertex]
        if node.op == "reload":
            return self._copy(vertex, self.host_view[sources[0]], self.gpu_view[vertex], "h2d")
        if node.op == "offload":
            return self._copy(vertex, self.gpu_view[sources[0]], self.host_view[vertex], "d2h")
        if node.op == "move":
            return self._copy(vertex, self.gpu_view[sources[0]], self.gpu_view[vertex], "peer")
        with self._on(node.device):
            try:
                return registry.build_work(node, [self.gpu_view[s] for s in sources], self.gpu_view[vertex], self)
            except KernelError as err:
                raise KernelError(f"node {node.id} ({node.task}): {err}") from None

    def _copy(self, vertex: int, source, target, kind: str):
        """A copy as one async driver call with pointers resolved now; None for empty tensors."""
        if source is None or target is None:
            return None
        if self.simulated:
            if kind == "h2d":
                return lambda lane: target.copy_to_device(source)
            if kind == "d2h":
                return lambda lane: source.copy_to_host(target)
            return lambda lane: target.copy_to_device(source)
        from numba.cuda.cudadrv.driver import driver

        count = target.nbytes
        handles = [stream_handle(stream) for stream in self.streams]
        if kind == "h2d":
            call, dst, src = driver.cuMemcpyHtoDAsync, device_pointer(target), source.ctypes.data
        elif kind == "d2h":
            call, dst, src = driver.cuMemcpyDtoHAsync, target.ctypes.data, device_pointer(source)
        else:
            call, dst, src = driver.cuMemcpyAsync, device_pointer(target), device_pointer(source)
        return lambda lane: call(dst, src, count, handles[lane])

    # ----- what kernels ask of the backend (the `env` of registry.py) ----------------------------------
    def host(self, array):
        """The numpy array behind a simulator device array (simulator only)."""
        return array._ary

    def device_of(self, node: MemNode) -> int:
        return node.device

    def scratch(self, lane: int):
        return self.workspaces[self.lane_device[lane]].slice(self.slot_of[lane])

    def cublas(self, lane: int) -> int:
        """cuBLAS's handle for the lane's GPU, with CuPy's current stream set to the lane's stream."""
        self.cupy_streams[lane].use()
        return self.cublas_handles[self.lane_device[lane]]

    def torch_stream(self, lane: int):
        return self.torch_streams[lane]

    @contextlib.contextmanager
    def cupy_scratch(self, lane: int):
        """Let CuPy allocate from the lane's scratch (bump allocation, reset per vertex)."""
        self.allocator.open(self.scratch(lane))
        try:
            yield
        finally:
            self.allocator.close()

    @staticmethod
    def scratch_per_lane(nodes, provider: str = "auto", is_simulated: bool | None = None, rule=None) -> int:
        """Scratch bytes one compute lane needs: the most any kernel vertex needs (256-byte granules).

        `nodes` are memgraph nodes, or taskgraph nodes (so the budget can be split before planning);
        `rule` (default `registry.scratch_bytes`) says what one vertex needs."""
        is_simulated = simulated() if is_simulated is None else is_simulated
        chosen = attention.resolve(provider, is_simulated)
        rule = rule or registry.scratch_bytes
        nodes = [_as_op(node) for node in nodes]
        by_id = {node.id: node for node in nodes}
        need = 0
        for node in nodes:
            if node.kernel is not None:
                need = max(need, rule(node, [by_id[s] for s in node.inputs], chosen))
        return (need + 255) // 256 * 256

    @classmethod
    def reserve_bytes(cls, nodes, streams: int = 2, provider: str = "auto") -> int:
        """What to hold back from a per-GPU budget before planning the arena: per compute lane, the scratch,
        cuBLAS's pool and what torch's attention keeps cached."""
        nodes = list(nodes)
        scratch = cls.scratch_per_lane(nodes, provider)
        library = cls.scratch_per_lane(nodes, provider, rule=registry.library_bytes)
        return streams * (scratch + LIBRARY_RESERVE + library)

    def _warm_up(self, graph: ExecGraph) -> None:
        """Create library state now (CuPy handles and streams, cuBLAS pools, torch caches), not in the loop."""
        self.allocator = LaneAllocator()
        self.cupy_streams, self.cublas_handles, self.torch_streams = [], [], []
        if self.simulated:
            return
        import cupy
        from cupy.cuda import device as cupy_device

        for device in range(graph.memgraph.devices):
            with self._on(device), cupy.cuda.Device(device):
                self.cublas_handles.append(cupy_device.get_cublas_handle())
        self.cupy_streams = [_cupy_stream(cupy, s, self.lane_device[i]) for i, s in enumerate(self.streams)]
        if attention.uses_torch(self.attention):
            import torch

            self.torch_streams = [torch.cuda.ExternalStream(stream_handle(s), device=torch.device("cuda", self.lane_device[i])) for i, s in enumerate(self.streams)]
        self._compile_and_touch(graph)
        cupy.cuda.set_allocator(self.allocator)

    def _compile_and_touch(self, graph: ExecGraph) -> None:
        """Kernels are compiled when their work is built; here cuBLAS gets one small GEMM per lane stream
        (its workspace pool), and torch's attention runs once per lane and block shape on arena views it
        only reads (its caches). Then the memory libraries hold beyond our two allocations is measured."""
        import cupy

        for index, lane in enumerate(graph.lanes):
            if lane.kind != "compute":
                continue
            with self._on(lane.device), cupy.cuda.Device(lane.device):
                self.cupy_streams[index].use()
                probe = cupy.zeros((16, 16), dtype=cupy.float16)
                cupy.matmul(probe, probe)
                self.streams[index].synchronize()
        if attention.uses_torch(self.attention):
            attention.warm_up(self, graph)
        for stream in self.streams:
            stream.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        library = []
        for device, context in enumerate(self.contexts):
            with self._on(device):
                used = self.free_at_start[device] - self._free_memory(context)
            library.append(used - self.arenas[device].nbytes - self.workspaces[device].nbytes)
        self.stats["library_bytes"] = max(library, default=0)

    def _start_clock(self, graph: ExecGraph) -> None:
        self.events: list[list] = [[] for _ in range(graph.memgraph.devices)]
        self.origins = []
        for device in range(graph.memgraph.devices):
            with self._on(device):  # events belong to a device: made here, in its context, and recycled
                held = sum(self.lane_depth(lane) + 1 for lane in graph.lanes if lane.device == device)
                self.events[device] = [timing_event() for _ in range(2 * held)]
                origin = timing_event()
                stream = next(self.streams[i] for i, d in enumerate(self.lane_device) if d == device)
                origin.record(stream)
                origin.synchronize()
                self.origins.append(origin)
        self.host_origin = time.perf_counter()
        count = len(graph)
        self.end_event: list = [None] * count
        self.start_event: list = [None] * count
        self.host_span = [(0.0, 0.0)] * count
        self.lane_of = [-1] * count
        self.deps = [[] for _ in range(count)]
        for vertex, users in enumerate(graph.dependents):
            for user in users:
                self.deps[user].append(vertex)
        self.fifo = [deque() for _ in graph.lanes]
        self.errors: list[Completion] = []
        self.notifier = make_notifier(self.notifier_kind, self.lane_device)
        self.sampler = MemorySampler(self, self.sample_memory) if self.sample_memory and not self.simulated else None

    # ----- the loop's calls ------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.host_origin

    def _switch(self, device: int) -> None:
        """Make `device` current for the launches that follow: its (primary) context for the driver, numba and
        cuda.core, and the runtime's device for CuPy and cuBLAS."""
        if not self.simulated:
            from numba.cuda.cudadrv.driver import driver

            driver.cuCtxSetCurrent(self.contexts[device].handle)
            if self.cupy_streams:
                import cupy

                cupy.cuda.runtime.setDevice(device)
        self.current_device = device

    def _event(self, device: int):
        """A timing event of `device`, from its pool (made in the device's context when the pool runs dry)."""
        pool = self.events[device]
        if pool:
            return pool.pop()
        with self._on(device):
            return timing_event()

    def submit(self, vertex: int, lane: Lane) -> None:
        index = lane.index
        stream = self.streams[index]
        device = lane.device
        if device != self.current_device:
            self._switch(device)
        for dep in self.deps[vertex]:
            event = self.end_event[dep]
            if event is not None and self.lane_of[dep] != index:
                event.wait(stream)
        start = self._event(device)
        start.record(stream)
        began = self.now()
        work = self.work[vertex]
        try:
            if work is not None:
                work(index)
        except Exception as err:  # a launch that fails at once: reported as this vertex's completion
            self.errors.append(Completion(vertex, index, began, self.now(), err))
            return
        self.host_span[vertex] = (began, self.now())  # the simulator's clock: it runs the work synchronously
        end = self._event(device)
        end.record(stream)
        self.start_event[vertex], self.end_event[vertex], self.lane_of[vertex] = start, end, index
        self.fifo[index].append(vertex)
        self.notifier.after(index, stream, end)

    def wait(self) -> list[Completion]:
        if self.errors:
            return [self.errors.pop(0)]
        while True:
            counts = self.notifier.wait()
            if counts:
                break
            self._check_streams()
        done = []
        for lane, count in counts.items():
            for _ in range(count):
                done.append(self._finish(self.fifo[lane].popleft(), lane))
        return done

    def _finish(self, vertex: int, lane: int) -> Completion:
        start, end = self.start_event[vertex], self.end_event[vertex]
        device = self.lane_device[lane]
        if self.simulated:
            began, ended = self.host_span[vertex]
        else:
            origin = self.origins[device]
            began = cuda.event_elapsed_time(origin, start) * 1e-3
            ended = cuda.event_elapsed_time(origin, end) * 1e-3
        self.start_event[vertex] = self.end_event[vertex] = None
        self.events[device].extend((start, end))
        return Completion(vertex, lane, began, ended)

    def _check_streams(self) -> None:
        """No progress for a while: a sticky CUDA error shows up in a stream query; name what was running."""
        if self.simulated:
            return
        from numba.cuda.cudadrv.driver import CudaAPIError, driver

        for lane, queue in enumerate(self.fifo):
            if not queue:
                continue
            try:
                driver.cuStreamQuery(stream_handle(self.streams[lane]))
            except CudaAPIError as err:
                if getattr(err, "code", None) == 600:  # CUDA_ERROR_NOT_READY: still running
                    continue
                running = [self.graph.describe(q[0]) for q in self.fifo if q]
                raise KernelError(f"CUDA error on the GPU ({err}) while running {', '.join(running)}") from None

    def read_outputs(self) -> dict[str, np.ndarray]:
        self._synchronize()
        self._count_library_allocations()
        nodes = self.graph.memgraph.nodes
        index = {node.id: i for i, node in enumerate(nodes)}
        outputs = {}
        for task, node_id in self.graph.memgraph.outputs.items():
            i = index[node_id]
            node = nodes[i]
            if node.nbytes == 0:
                outputs[task] = np.zeros(node.shape, node.dtype)
            elif self.gpu_view[i] is not None and node.op != "offload":
                with self._on(node.device):
                    outputs[task] = self.gpu_view[i].copy_to_host()
            else:
                outputs[task] = np.array(self.host_view[i])
        return outputs

    def _count_library_allocations(self) -> None:
        """What libraries allocated while the loop ran: CuPy calls refused or served, torch segments added."""
        allocator = getattr(self, "allocator", None)
        if allocator is not None:
            self.stats["cupy_refused"], self.stats["cupy_served"] = allocator.refused, allocator.served
        if not self.simulated and attention.uses_torch(self.attention) and "torch_segments" in self.stats:
            now = attention.segments_allocated(self)
            self.stats["torch_new_segments"] = sum(now) - sum(self.stats["torch_segments"])

    def notes(self) -> list[str]:
        """What the run summary adds for this backend: memory taken and where library memory went."""
        lines = []
        if "arena_bytes" in self.stats:
            lines.append(
                f"cuda: per GPU arena {format_size(self.stats['arena_bytes'])} + workspace {format_size(self.stats['workspace_bytes'])}"
                f" + library memory {format_size(self.stats.get('library_bytes', 0))}, pinned storage {format_size(self.stats['pinned_bytes'])},"
                f" attention {self.attention}, prepare {self.stats['prepare_s']:.2f} s"
            )
        if "peak_drop" in self.stats:
            lines.append(f"cuda: largest drop in free GPU memory while running {format_size(self.stats['peak_drop'])} per GPU {self.stats['peak_drop_per_gpu']}")
        return lines

    def _synchronize(self) -> None:
        for stream in getattr(self, "streams", []) or []:
            if stream is not None:
                stream.synchronize()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            with contextlib.suppress(Exception):  # after a CUDA error the context is gone; nothing more to wait for
                self._synchronize()
        finally:
            if getattr(self, "sampler", None) is not None:
                self.sampler.stop()
            if self.notifier is not None:
                self.notifier.close()
            if not self.simulated and self.ready:
                import cupy

                cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
                attention.release(self)
                if DETACH_AT_CLOSE:
                    self._detach_libraries()
            self.work = []
            self.gpu_view = self.host_view = []
            self.arenas, self.workspaces, self.storage = [], [], None
            if RELEASE_AT_CLOSE:
                self._release()
            self._restore_device()

    def _restore_device(self) -> None:
        """Leave the thread on the device it was on before the run (the loop switched it as it went)."""
        entry = getattr(self, "entry_device", None)
        if entry is not None and getattr(self, "current_device", -1) not in (-1, entry):
            import cupy

            with contextlib.suppress(Exception):
                cupy.cuda.runtime.setDevice(entry)
            self.current_device = entry

    def _detach_libraries(self) -> None:
        """Point the libraries' per-process state away from the run's streams before they are destroyed:
        CuPy's cuBLAS handle of each GPU (cached for the process) and CuPy's current stream go back to the
        default stream, and torch forgets the cuBLAS workspaces it keyed by stream. A later run's new
        stream may get a destroyed one's address, and a handle still bound to it is stale state."""
        import cupy
        from cupy_backends.cuda.libs import cublas

        for device, handle in enumerate(self.cublas_handles):
            with contextlib.suppress(Exception), self._on(device), cupy.cuda.Device(device):
                cublas.setStream(handle, 0)
                cupy.cuda.Stream.null.use()
        if self.torch_streams:
            import torch

            with contextlib.suppress(Exception):
                torch._C._cuda_clearCublasWorkspaces()

    def _release(self) -> None:
        """Drop every CUDA object the run made (streams and their CuPy, torch and cuda.core views, events,
        the notifier's side streams, arenas, pinned chunks) and have numba free them now, while every
        context is alive, rather than from finalizers at interpreter exit, after other libraries may have
        torn their CUDA state down."""
        self.notifier = None
        self.launch_streams, self.cupy_streams, self.torch_streams = [], [], []
        self.events, self.origins = [], []
        self.start_event = self.end_event = []
        self.streams = []
        if self.simulated:
            return
        gc.collect()
        for device, context in enumerate(getattr(self, "contexts", [])):
            with contextlib.suppress(Exception), self._on(device):
                context.deallocations.clear()


@dataclass(frozen=True)
class _Op:
    """What scratch rules read of a vertex, from a memgraph node or a taskgraph node alike."""

    id: object
    kernel: str | None
    inputs: tuple
    attrs: dict
    shape: tuple
    dtype: str
    nbytes: int


def _as_op(node) -> _Op:
    if isinstance(node, MemNode):
        kernel = node.kernel if node.op == "kernel" else None
    else:
        kernel = None if node.op in ("input", "move") else node.op
    return _Op(node.id, kernel, tuple(node.inputs), dict(node.attrs), tuple(node.shape), node.dtype, node.nbytes)


def _runtime_device() -> int | None:
    """CUDA's current device for this thread (CuPy's view), or None without CuPy."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDevice())
    except Exception:
        return None


def _cupy_stream(cupy, stream, device: int):
    """CuPy's view of a numba stream: `Stream.from_external` (CuPy 14+), else the older ExternalStream."""
    make = getattr(cupy.cuda.Stream, "from_external", None)
    if make is not None:
        with cupy.cuda.Device(device):
            return make(stream)
    return cupy.cuda.ExternalStream(stream_handle(stream), device)


def _launch_stream(stream):
    if simulated():
        return stream
    from cuda.core import Stream

    return Stream.from_handle(stream_handle(stream))



class LaneAllocator:
    """CuPy's allocator while the loop runs: refuses, except inside `cupy_scratch`, where it bump-allocates
    from the lane's scratch. `refused` and `served` count calls (a GPU test asserts that refused stays 0)."""

    def __init__(self):
        self.area = None
        self.top = 0
        self.served = 0
        self.refused = 0

    def open(self, area) -> None:
        self.area, self.top = area, 0

    def close(self) -> None:
        self.area = None

    def __call__(self, size: int):
        import cupy

        if self.area is None:
            self.refused += 1
            raise MemoryError(f"CuPy asked for {size} bytes while a memgraph runs; turnip allows no allocation outside its workspace")
        start = (self.top + 255) // 256 * 256
        if start + size > self.area.shape[0]:
            self.refused += 1
            raise MemoryError(f"a kernel needs {size} bytes of scratch beyond its lane's {self.area.shape[0]}-byte workspace slice")
        self.top = start + size
        self.served += 1
        pointer = device_pointer(self.area) + start
        memory = cupy.cuda.UnownedMemory(pointer, size, self.area)
        return cupy.cuda.MemoryPointer(memory, 0)


class MemorySampler:
    """A thread that samples each GPU's free memory every `period` seconds while the loop runs."""

    def __init__(self, backend: CudaBackend, period: float):
        self.backend, self.period = backend, period
        self.lowest = list(backend.free_at_start)
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True, name="turnip memory sampler")
        self.thread.start()

    def _run(self) -> None:
        contexts = self.backend.contexts
        while self.running:
            for device, context in enumerate(contexts):
                with cuda.gpus[device]:
                    free = int(context.get_memory_info()[0])
                self.lowest[device] = min(self.lowest[device], free)
            time.sleep(self.period)

    def stop(self) -> None:
        self.running = False
        self.thread.join(timeout=5)
        drops = [start - low for start, low in zip(self.backend.free_at_start, self.lowest)]
        self.backend.stats["peak_drop"] = max(drops, default=0)
        self.backend.stats["peak_drop_per_gpu"] = drops
