"""The cpu backend: numpy kernels on one worker thread per lane, arenas as numpy byte buffers.

Each lane (compute stream or copy engine of each GPU) is a thread with its own job queue; completions
go to one shared queue that `wait` blocks on. numpy releases the GIL inside kernels and copies, so
completions arrive in a truly nondeterministic order. `jitter` makes each job sleep a random time first,
to shake orders in tests. Every tensor is a view at its planned offset of one arena per GPU (as long as
the plan's highest location there, not the budget) or of the host storage buffer, all allocated in
`prepare` after checking the host has the memory (runtime/host_memory.py).

Prepare once, run many: a later `prepare` (after a run's `read_outputs`) loads another memgraph onto the
same workers, re-allocating an arena or the storage only when the new plan needs more than it holds, and
restarting the workers only when the lanes differ. `close` stops the workers.

Threads: BLAS runs on one thread (threadpoolctl, from `prepare`; restored in `close`), and the kernels'
matrix products run one at a time in the process, a large one cut over `threads` threads (default: the
cores this process may run on; runtime/blas.py). So a lone large product (most of a prefill is a chain
of them) has every core, two lanes' products take the cores in turn instead of each spawning its own
threads on the same cores, and the elementwise kernels and copies of the other lanes run beside them.
"""

from __future__ import annotations

from collections.abc import Mapping
import queue
import random
import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

from runtime.backends.base import Backend, Completion, OutputTarget
from runtime.graph import ExecGraph, Lane
from runtime.host_memory import arena_peaks, check_host_memory, zeros
from runtime.inputs import fill_all
from runtime.residency import placements
from runtime.blas import BLAS
from runtime.kernels_numpy import NUMPY_KERNELS
from turnip_ir.errors import InputError
from turnip_ir.memgraph import MemNode
from turnip_ir.pools import cores

STOP = -1


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, jitter: float = 0.0, seed: int = 0, noop: bool = False, threads: int | None = None):
        self.jitter = jitter
        self.seed = seed
        self.noop = noop
        """Skip kernel bodies and copies: for measuring the executor's own overhead."""
        self.completed: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs: list[queue.SimpleQueue] = []
        self.threads: list[threading.Thread] = []
        self.work: list = []
        self.limited: dict = {}
        """Vertex -> the job of a copy limited to some leading rows for this run (`limit_copies`)."""
        self.named: frozenset = frozenset()
        """The outputs this run's `output_targets` named: read uncopied, for `runtime.execute` to copy once."""
        self.graph: ExecGraph | None = None
        self.origin = time.perf_counter()
        self.blas_threads = threads or cores()
        """The threads a large product is cut over (runtime/blas.py)."""
        self.blas_limit = None
        self.lanes: list[Lane] = []
        self.arenas: list[np.ndarray] = []
        self.storage = np.zeros(0, np.uint8)

    def prepare(self, graph: ExecGraph, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None) -> None:
        memgraph = graph.memgraph
        for node in memgraph.nodes:
            if node.dtype == "bfloat16":
                raise InputError(f"node {node.id} ({node.task}): bfloat16 is not supported by the cpu backend")
        # the plan whose jobs `work` holds (views of these buffers): the same plan again keeps them
        same = self.graph is not None and self.graph.memgraph is memgraph
        self.graph = None
        if self._allocate(arena_peaks(memgraph), memgraph.storage_bytes):
            keep = None  # new buffers hold nothing yet
            same = False
        if not same:
            self.work = [self._job(graph, vertex) for vertex in range(len(graph))]
        self.graph = graph
        self.limited = {}
        self.named = frozenset()
        self.place_inputs(inputs, keep)
        if self.blas_limit is None:
            # BLAS on one thread: its own threads wake too slowly for small products (runtime/blas.py),
            # and the large ones are cut over `blas_threads` threads by `product` instead
            self.blas_limit = threadpool_limits(limits=1, user_api="blas")
            BLAS.use(self.blas_threads)
        self.origin = time.perf_counter()
        if list(graph.lanes) != self.lanes:
            self._stop_workers()
            self.lanes = list(graph.lanes)
            for lane in graph.lanes:
                self._start_worker(lane)

    def _allocate(self, peaks: list[int], storage: int) -> None:
        """Arenas of at least `peaks` bytes and storage of at least `storage`: those of an earlier memgraph
        when they are large enough, else new ones (never smaller than before), the old dropped first.
        True when it allocated."""
        held = [len(arena) for arena in self.arenas]
        if len(held) == len(peaks) and all(h >= p for h, p in zip(held, peaks)) and len(self.storage) >= storage:
            return False
        sizes = [max(peak, held[d] if d < len(held) else 0) for d, peak in enumerate(peaks)]
        storage = max(storage, len(self.storage))
        self.arenas, self.storage = [], np.zeros(0, np.uint8)
        check_host_memory(sum(sizes) + storage, "the GPU arenas and the CPU storage",
                          "check the plan's locations and storage regions, or run it on the sim backend")
        self.arenas = [zeros(size, f"GPU {device}'s arena") for device, size in enumerate(sizes)]
        self.storage = zeros(storage, "the CPU storage")
        return True

    def place_inputs(self, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None) -> None:
        """Put the inputs in place (again, for another run of the same prepared memgraph: a run may reuse
        an input's location once nobody reads it), but those in `keep`, in place already (all of them,
        or all but the rows it names, which are copied); several at a time (runtime/inputs.py, `fill_all`)."""
        keep = keep or {}
        began = time.perf_counter()
        pairs = []
        for node in self.graph.memgraph.nodes:
            if node.op == "input":
                pairs += placements(self._home(node), inputs[node.task], node.task, keep)
        fill_all(pairs)
        self.inputs_time = time.perf_counter() - began

    def _stop_workers(self) -> None:
        for jobs in self.jobs:
            jobs.put(STOP)
        for thread in self.threads:
            thread.join()
        self.jobs, self.threads = [], []

    def _start_worker(self, lane: Lane) -> None:
        jobs: queue.SimpleQueue = queue.SimpleQueue()
        thread = threading.Thread(target=self._worker, args=(lane, jobs), name=f"turnip {lane.name}", daemon=True)
        self.jobs.append(jobs)
        self.threads.append(thread)
        thread.start()

    def _worker(self, lane: Lane, jobs: queue.SimpleQueue) -> None:
        rng = random.Random(self.seed * 1000003 + lane.index)
        while True:
            vertex = jobs.get()
            if vertex == STOP:
                return
            start = self.now()
            error = None
            try:
                if self.jitter > 0:
                    time.sleep(rng.uniform(0.0, self.jitter))
                if not self.noop:
                    self.limited.get(vertex, self.work[vertex])()
            except Exception as err:  # reported to the loop, which names the vertex
                error = err
            self.completed.put(Completion(vertex, lane.index, start, self.now(), error))

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def submit(self, vertex: int, lane: Lane) -> None:
        self.jobs[lane.index].put(vertex)

    def wait(self) -> list[Completion]:
        # A timeout keeps the main thread responsive to Ctrl-C while it waits.
        while True:
            try:
                first = self.completed.get(timeout=0.2)
                break
            except queue.Empty:
                continue
        batch = [first]
        while True:
            try:
                batch.append(self.completed.get_nowait())
            except queue.Empty:
                return batch

    def output_targets(self, into: Mapping[str, OutputTarget]) -> None:
        """The arenas and storage are host memory: each output named here is read where it is, and
        `runtime.execute` copies it into the caller's arrays or pieces after the run, one copy apiece."""
        self.named = frozenset(into)

    def read_outputs(self, copy: bool = True) -> dict[str, np.ndarray]:
        nodes = self.graph.memgraph.by_id()
        named = self.named
        return {task: self._home(nodes[node_id]).copy() if copy and task not in named else self._home(nodes[node_id])
                for task, node_id in self.graph.memgraph.outputs.items()}

    def close(self) -> None:
        self._stop_workers()
        self.lanes = []
        if self.blas_limit is not None:
            BLAS.use(None)
            self.blas_limit.restore_original_limits()
            self.blas_limit = None

    # ----- views --------------------------------------------------------------------------------------
    def _home(self, node: MemNode) -> np.ndarray:
        """Where the node's tensor lives after it ran: its location, or its storage region."""
        if node.loc is not None:
            return self._view(node, self.arenas[node.device], node.loc, "location")
        return self._view(node, self.storage, node.storage, "storage")

    def _view(self, node: MemNode, buffer: np.ndarray, region: tuple[int, int], what: str) -> np.ndarray:
        offset, size = region
        count = node.nbytes
        if size < count or offset + count > len(buffer):
            raise InputError(
                f"node {node.id} ({node.task}): {what} [{offset}, {size}] cannot hold {count} bytes in a buffer of {len(buffer)}"
            )
        return buffer[offset : offset + count].view(node.dtype).reshape(node.shape)

    def _job(self, graph: ExecGraph, vertex: int):
        """The closure a worker calls for `vertex`, with every view resolved now, before the loop."""
        node = graph.node(vertex)
        if node.op == "input":
            return None
        sources = [graph.node(s) for s in graph.sources[vertex]]
        if node.op == "reload":
            reads = [self._stored(sources[0], node)]
        else:
            reads = [self._resident(source, node) for source in sources]
        if node.op == "offload":
            out = self._view(node, self.storage, node.storage, "storage")
        else:
            out = self._view(node, self.arenas[node.device], node.loc, "location")
        if node.op == "kernel":
            impl = NUMPY_KERNELS[node.kernel]
            return lambda: impl(reads, out, node.attrs)
        return lambda: np.copyto(out, reads[0])

    def limit_copies(self, limits: Mapping[int, int]) -> None:
        limited = {}
        for vertex, rows in limits.items():
            node = self.graph.node(vertex)
            out = self._view(node, self.arenas[node.device], node.loc, "location")[:rows]
            read = self._stored(self.graph.node(self.graph.sources[vertex][0]), node)[:rows]
            limited[vertex] = lambda out=out, read=read: np.copyto(out, read)
        self.limited = limited

    def _stored(self, source: MemNode, user: MemNode) -> np.ndarray:
        if source.storage is None:
            raise InputError(f"node {user.id} ({user.task}): reloads node {source.id}, which has no storage region")
        return self._view(source, self.storage, source.storage, "storage")

    def _resident(self, source: MemNode, user: MemNode) -> np.ndarray:
        if source.loc is None:
            raise InputError(f"node {user.id} ({user.task}): reads node {source.id}, which has no GPU location")
        return self._view(source, self.arenas[source.device], source.loc, "location")
