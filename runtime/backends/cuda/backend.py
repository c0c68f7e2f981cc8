"""The CudaBackend: memgraphs on NVIDIA GPUs through numba-cuda, cuBLAS and (optionally) torch's fused attention.

Phases. Set up once, run many, close. The first `prepare` sets the GPUs up (`DeviceSet`, devices.py: per
GPU one arena of `memgraph.budget` bytes, one workspace of per-lane scratch, a stream per lane, peer
access), warms the libraries up (libraries.py: cuBLAS per lane stream, CuPy's allocator replaced) and
makes the event pools (clock.py) and the completion notifier (completion.py). Every `prepare`, the first
included, then loads one memgraph onto that set: views at planned offsets and pinned host storage
(copies.py; a later load reuses the earlier pinned chunks that are large enough: pinning many GB costs
seconds), the inputs in place, every vertex's work built (builders.py, through the `KernelEnv` of
services.py), torch's attention warmed up per block shape, the clock started. A later memgraph fits the
set when it has the same GPUs and lanes and a budget within the arena (else `prepare` refuses it in one
line); one that needs more scratch grows the workspaces. The executor then drives `submit` and `wait`; `read_outputs` ends a run.
`close` tears everything down, once, after a failure and after Ctrl-C too.

The driver (driver.py) is chosen once, in the constructor: the GPU's, or numba's CUDA simulator's. No
code below asks which.

Dependencies on the device. The backend has `device_deps`: the executor may submit a vertex whose
dependencies are only submitted. `submit` makes the lane's stream wait on the end event of every
unfinished dependency on another lane (stream order covers the same lane), records a start event, queues
the work, records an end event and queues a completion notice. So the GPU starts a dependent kernel the
moment its inputs are ready, with no host round trip.

Completions and time. `wait` blocks on the notifier, pops finished vertices off their lanes in order, and
stamps each with device times (clock.py). CUDA errors arrive late and stick: when a lane has pending work
but no progress for a while, the streams are queried and a failure ends the run with one line naming the
vertices that were on the GPU. `close` synchronizes every stream before memory goes.
"""

from __future__ import annotations

from collections.abc import Mapping
import contextlib
import time
from collections import OrderedDict, deque

import numpy as np

from runtime.backends.base import STREAMING_QUEUE_DEPTH, Backend, Completion, OutputTarget, compute_depth, resident_depth
from runtime import process_memory
from runtime.backends.cuda import attention, builders
from runtime.backends.cuda.clock import Clock
from runtime.backends.cuda.completion import DEFAULT_NOTIFIER, NOTIFIERS
from runtime.backends.cuda.copies import COPY_KINDS, TensorViews
from runtime.inputs import Filler
from runtime.backends.cuda.devices import DeviceSet, library_allowance, reserve_bytes, scratch_per_lane
from runtime.backends.cuda.driver import MappedFiles, make_driver
from runtime.backends.cuda.libraries import Libraries
from runtime.backends.cuda.memory import CHUNK_BYTES
from runtime.backends.cuda.sampling import MemorySampler
from runtime.backends.cuda.services import KernelServices
from runtime.graph import ExecGraph, Lane
from turnip_ir.errors import InputError, KernelError
from turnip_ir.taskgraph import attrs_key
from turnip_ir.units import format_size


LOADED_PLANS = 4
"""Plans a backend keeps loaded besides the current one (a session's prefill and its decode steps' plans)."""


class CudaBackend(Backend):
    name = "cuda"
    device_deps = True

    def __init__(self, notifier: str = DEFAULT_NOTIFIER, queue_depth: int = STREAMING_QUEUE_DEPTH, lookahead: bool = True, attention_provider: str = "auto",
                 chunk_bytes: int = CHUNK_BYTES, sample_memory: float = 0.0, copy_queue_depth: int | None = 4,
                 release_at_close: bool = True, detach_at_close: bool = True, external_inputs: bool = True):
        """`sample_memory`: seconds between samples of each GPU's free memory while running (0: off).
        `copy_queue_depth`: depth of the copy-engine lanes (h2d, d2h, peer), which may queue deeper than the
        compute lanes, so that a tiny copy cannot leave its engine idle while the host learns it finished
        (docs/runtime.md, "Queueing ahead"). `release_at_close` frees every CUDA object of the run in
        `close` and `detach_at_close` unbinds CuPy's cuBLAS handles and torch's workspaces from the run's
        streams; bench/investigations/exit_check.py and bench/investigations/repeat_check.py turn them off to compare.
        `external_inputs`: inputs kept in host storage are read from the caller's arrays where those are
        page-locked already (copies.TensorViews), instead of being staged into the plan's pinned storage."""
        if notifier not in NOTIFIERS:
            raise InputError(f"unknown notifier '{notifier}' (known: {', '.join(NOTIFIERS)})")
        self.notifier_kind = notifier
        self.device_deps = lookahead
        self.queue_depth = queue_depth if lookahead else 1
        self.copy_queue_depth = (queue_depth if copy_queue_depth is None else copy_queue_depth) if lookahead else 1
        self.attention_choice = attention_provider
        self.chunk_bytes = chunk_bytes
        self.sample_memory = sample_memory
        self.release_at_close = release_at_close
        self.detach_at_close = detach_at_close
        self.pieced: frozenset[str] = frozenset()
        """The outputs the next run writes in pieces (`pieces_ahead`)."""
        self.read_in_place = external_inputs
        self.driver = make_driver()
        self.mappings = MappedFiles(self.driver)
        """Checkpoint files' maps page-locked in place for inputs read where they lie, until `close`."""
        self.attention = ""
        """The resolved attention provider, known from the first `prepare`."""
        self.devices: DeviceSet | None = None
        self.libraries = Libraries()
        self.services: KernelServices | None = None
        self.grad_shares: dict = {}
        """Per GPU, attention_grad's GradShare (the services' own dict, kept for `notes` after close)."""
        self.clock: Clock | None = None
        self.notifier = None
        self.sampler: MemorySampler | None = None
        self.graph: ExecGraph | None = None
        self.views: TensorViews | None = None
        self.work: list = []
        self.instead: dict = {}
        """Vertex -> its work for this run in place of its built one: a copy limited to some leading rows
        (`limit_copies`), an offload that also writes an output's pieces (`output_targets`)."""
        self.loaded: OrderedDict = OrderedDict()
        """Memgraph -> (views, works) of the plans loaded before the current one (`_keep_loaded`)."""
        self.early: dict = {}
        """Vertex -> the work copying its output back right after it (`TensorViews.aim`)."""
        self.deps: list[list[int]] = []
        self.lane_of: list[int] = []
        self.fifo: list[deque] = []
        self.errors: dict[int, Exception] = {}
        """Vertex -> the error its launch raised at once; it completes in its lane's order, carrying it."""
        self.current_device = -1
        """The device whose context launches go to; unknown until the first submit switches. The thread's
        current context and CuPy's device are what the previous run (or the caller) left, which after a
        run over several GPUs is not device 0: a cuBLAS call on GPU 0's handle from GPU 1 fails."""
        self.entry_device: int | None = None
        self.closed = False
        self.stats: dict = {}

    def lane_depth(self, lane) -> int:
        if lane.kind != "compute":
            return self.copy_queue_depth
        return compute_depth(self.queue_depth, self.device_deps, self.graph)

    # ----- prepare: set the GPUs up once, then load a memgraph -------------------------------------------
    def prepare(self, graph: ExecGraph, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None) -> None:
        if self.closed:
            raise InputError("this cuda backend is closed; make a new one")
        memgraph = graph.memgraph
        began = time.perf_counter()
        if self.devices is None:
            self._set_up(graph)
        else:
            misfit = self.devices.misfit(graph)
            if misfit:
                raise InputError(f"memgraph does not fit the prepared cuda backend: {misfit}")
            if self.views is None or self.views.graph.memgraph is not memgraph:  # the same plan again: same scratch
                scratch = self.devices.scratch_bytes
                self.devices.grow_scratch(scratch_per_lane(memgraph.nodes, self.attention))
                if self.devices.scratch_bytes != scratch:  # the loaded plans' works hold the old workspace's views
                    self.loaded.clear()
            self.stats["workspace_bytes"] = self.devices.workspaces[0].nbytes if self.devices.workspaces else 0
        self._load(graph, inputs, keep)
        self.stats["prepare_s"] = time.perf_counter() - began

    def _set_up(self, graph: ExecGraph) -> None:
        """What is kept across runs: GPUs, libraries, kernel services, event pools, notifier, sampler."""
        driver = self.driver
        driver.require_gpus(graph.memgraph.devices)
        self.attention = driver.resolve_attention(self.attention_choice)
        self.entry_device = driver.runtime_device()
        self.devices = devices = DeviceSet.open(driver, graph, scratch_per_lane(graph.memgraph.nodes, self.attention))
        self.libraries = driver.open_libraries(devices, graph.lanes, attention.uses_torch(self.attention))
        self.services = KernelServices(driver, devices, self.libraries, self.attention)
        self.grad_shares = self.services.grad_shares  # the summary's count outlives the services (close)
        # events for as deep as any plan may queue (a plan that moves nothing queues its compute lanes deeper)
        deepest = {"compute": resident_depth(self.queue_depth, self.device_deps)}
        pools = [2 * sum(deepest.get(lane.kind, self.copy_queue_depth) + 1 for lane in graph.lanes if lane.device == d)
                 for d in range(devices.devices)]
        self.clock = Clock(driver, pools)
        self.notifier = driver.notifier(self.notifier_kind, devices.lane_device)
        if self.sample_memory:
            self.sampler = MemorySampler(driver, devices.contexts, devices.free_at_start, self.sample_memory)
        self.stats["arena_bytes"] = devices.budget
        self.stats["workspace_bytes"] = devices.workspaces[0].nbytes if devices.workspaces else 0

    def _load(self, graph: ExecGraph, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None) -> None:
        """One memgraph onto the set: views, inputs, every vertex's work, attention warm-up, the clock.
        The memgraph loaded last keeps its views (and so its pinned storage, where inputs in `keep` are)."""
        devices = self.devices
        self.graph = graph
        stamps = [time.perf_counter()]
        same = self.views is not None and self.views.graph.memgraph is graph.memgraph and self.views.serves(inputs, self.pieced)
        if not same and self.views is not None:
            self._keep_loaded()
            earlier = self.loaded.pop(graph.memgraph, None)  # a plan loaded before: its views, storage and works
            if earlier is not None and earlier[0].serves(inputs, self.pieced):
                self.views, self.work = earlier
                same = True
        if same:
            self.views.graph = graph  # the same plan again: its views and storage stay
            stamps.append(time.perf_counter())
            self._start_clock(graph)  # the GPUs are idle: time 0 before the copies, which the run's kernels wait for
            self.views.place(inputs, keep, wait=False)
        else:
            reuse = self.views.storage.all_chunks() if self.views is not None else ()
            self.views = None
            filler = Filler()
            try:  # each pinned chunk's inputs are read into it while the next chunk is pinned
                self.views = TensorViews(self.driver, graph, devices.arenas, self.chunk_bytes, reuse, filler, inputs, self.read_in_place,
                                         self.mappings.register, self.pieced)
                stamps.append(time.perf_counter())
            finally:
                filler.finish()
        self.stats["pinned_bytes"] = self.views.storage.nbytes
        self.stats["in_place"] = (len(self.mappings), sum(self.views.host[i].nbytes for i in self.views.external))
        stamps.append(time.perf_counter())
        # a new plan: every vertex's work (GEMM plans, launches), torch's attention warmed up; the same plan
        # again keeps them (they hold its views, which it kept too)
        if not same:
            self.work = self._build_all(graph)
        stamps.append(time.perf_counter())
        if not same and not keep:  # nothing in the arena to keep yet: the products may write it (before the inputs go in)
            self._warm_products(graph)
        if not same and attention.uses_torch(self.attention):
            attention.release(self.attention, devices.devices)  # a new graph's block shapes may need more
            self.stats["torch_segments"] = attention.warm_up(self.work, graph)
        if not same:
            self.views.place_on_gpus(inputs, keep)
        stamps.append(time.perf_counter())
        self.inputs_time = stamps[2] - stamps[0]  # pinning and reading overlap: the whole span until both are done
        if not same:  # the plan's load (a run of the same plan again keeps its figures)
            steps = ("pinning (inputs read meanwhile)", "views", "building", "warm-up and the GPU inputs placed")
            self.stats["load_steps"] = {step: b - a for step, a, b in zip(steps, stamps, stamps[1:])}
            self.stats["built"] = (sum(work is not None for work in self.work), dict(self.services.cache.builds))
            devices.synchronize()
            self.stats["library_bytes"] = devices.library_bytes()  # a driver query per GPU: once per plan loaded
            pinned = self.stats["pinned_bytes"] + self.stats["in_place"][1]
            self.stats["library_allowance"] = library_allowance(graph.memgraph.nodes, devices.compute, self.attention, pinned)
            self._start_clock(graph)
        count = len(graph)
        self.lane_of = [-1] * count
        self.deps = graph.deps
        self.fifo = [deque() for _ in graph.lanes]
        self.errors = {}
        self.instead = {}
        # each output a vertex computes is copied back right after it, on its GPU's offload stream
        self.early, _ = self.views.aim({}, devices.streams, self.work)
        self.offload_lane = {lane.device: lane.index for lane in graph.lanes if lane.kind == "d2h"}
        self.views.issued = set()
        if same:  # where a run of the same plan again spends its load
            self.stats["rerun_steps"] = {"bind": stamps[1] - stamps[0], "clock and place": stamps[2] - stamps[1], "rest": time.perf_counter() - stamps[-1]}

    def _warm_products(self, graph: ExecGraph) -> None:
        """Run one vertex of each distinct matrix product (kernel, shapes, dtype, attributes) once, on whatever
        the arena holds, before the plan's inputs are placed: cuBLAS loads and picks a kernel at the first call
        of a shape and dtype in a process (a bfloat16 7b prefill's first q projection took 74.5 ms on the H100,
        against 4.2 ms in float16 and 0.3 ms once warm), which belongs in prepare, not in the first run. Only
        where the arena holds nothing to keep: a product writes its output's location."""
        seen = set()
        for vertex in range(len(graph)):
            node = graph.node(vertex)
            if node.op != "kernel" or node.kernel not in ("einsum", "matmul") or self.work[vertex] is None:
                continue
            key = (node.kernel, node.dtype, tuple(node.shape), tuple(tuple(graph.node(s).shape) for s in graph.sources[vertex]),
                   attrs_key(node.attrs))
            if key in seen:
                continue
            seen.add(key)
            lane = next(lane for lane in graph.lanes if lane.device == node.device and lane.kind == "compute")
            if node.device != self.current_device:
                self._switch(node.device)
            with np.errstate(all="ignore"):  # the simulator's numpy products of whatever the arena holds
                self.work[vertex](lane.index)
        self.stats["warmed_products"] = len(seen)
        self.devices.synchronize()

    def _keep_loaded(self) -> None:
        """Keep the plan loaded now (its views, pinned storage and built works) among the last LOADED_PLANS,
        so a session that goes back to it (a call's prefill, then its decode steps, then the next call's
        prefill) loads nothing again; the oldest goes first. Their storage shares the pinned chunks a new
        load reuses: a plan's storage holds nothing another run needs (its inputs are placed each run but
        those residency finds in place)."""
        self.loaded[self.views.graph.memgraph] = (self.views, self.work)
        self.loaded.move_to_end(self.views.graph.memgraph)
        while len(self.loaded) > LOADED_PLANS:
            self.loaded.popitem(last=False)

    def _start_clock(self, graph: ExecGraph) -> None:
        """Time 0 of the run on every GPU, recorded on its first stream (the GPUs must be idle)."""
        devices = self.devices
        first_stream = [next(devices.streams[i] for i, d in enumerate(devices.lane_device) if d == device) for device in range(devices.devices)]
        self.clock.start(graph, first_stream)

    def _build_all(self, graph: ExecGraph) -> list:
        """Every vertex's work, the kernels of each GPU built within its context made current once (a push
        and a pop a vertex were 0.4 s of a 7b prefill plan's load)."""
        work: list = [None] * len(graph)
        kernels: dict[int, list[int]] = {}
        for vertex in range(len(graph)):
            node = graph.node(vertex)
            if node.op in COPY_KINDS:
                work[vertex] = self.views.copy_work(vertex, self.devices.streams)
            elif node.op != "input":
                kernels.setdefault(node.device, []).append(vertex)
        for device, vertices in kernels.items():
            with self.driver.on(device):
                for vertex in vertices:
                    work[vertex] = self._build(graph, vertex)
        return work

    def _build(self, graph: ExecGraph, vertex: int):
        """A kernel vertex's work, its GPU's context current (`_build_all`)."""
        node = graph.node(vertex)
        try:
            return builders.build_work(node, [self.views.gpu[s] for s in graph.sources[vertex]], self.views.gpu[vertex], self.services)
        except KernelError as err:
            raise KernelError(f"node {node.id} ({node.task}): {err}") from None

    def limit_copies(self, limits: Mapping[int, int]) -> None:
        self.instead.update((vertex, self.views.copy_work(vertex, self.devices.streams, rows)) for vertex, rows in limits.items())

    def place_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        """Put the inputs in place again, for another run of the same prepared memgraph (benchmarks): a run
        may reuse an input's location once nobody reads it, so a second run needs them back."""
        self.devices.synchronize()
        self.views.place(inputs)

    @staticmethod
    def scratch_per_lane(nodes, provider: str = "auto", rule=None) -> int:
        """Scratch bytes one compute lane needs under attention `provider` (devices.scratch_per_lane)."""
        return scratch_per_lane(nodes, make_driver().resolve_attention(provider), rule)

    @staticmethod
    def attention_candidates(provider: str = "auto") -> tuple[str, ...]:
        """The providers a run under `provider` may use: `auto`'s candidates here (attention.auto_candidates),
        which the caller ranks (runtime.api, `plan_choosing_attention`), or the one named."""
        return make_driver().attention_candidates() if provider == "auto" else (provider,)

    def choose_attention(self, provider: str) -> None:
        """Use `provider` from the first `prepare` on (what `plan_choosing_attention` chose for `auto`); a
        backend already set up keeps the provider it has, so asking for another is an error."""
        if self.devices is not None and provider != self.attention:
            raise InputError(f"this cuda backend runs attention through {self.attention} already; make a new one for {provider}")
        self.attention_choice = provider

    @staticmethod
    def reserve_bytes(nodes, streams: int = 2, provider: str = "auto") -> int:
        """What to hold back from a per-GPU budget before planning the arena, beside the page tables of what
        the run pins (devices.reserve_bytes with nothing pinned). A provider named outright is sized as it
        is, so a plan can be made where it cannot run (on a CPU for the GPU); `auto` is resolved here."""
        named = provider in attention.PROVIDERS and provider != "auto"
        return reserve_bytes(nodes, streams, provider if named else make_driver().resolve_attention(provider))

    # ----- run: the executor's calls ----------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def _switch(self, device: int) -> None:
        """Make `device` current for the launches that follow (driver.py, `switch`)."""
        self.driver.switch(self.devices.contexts[device], device, bool(self.libraries.cupy_streams))
        self.current_device = device

    def submit(self, vertex: int, lane: Lane) -> None:
        index = lane.index
        stream = self.devices.streams[index]
        device = lane.device
        clock = self.clock
        if device != self.current_device:
            self._switch(device)
        driver = self.driver
        for dep in self.deps[vertex]:
            event = clock.end_event[dep]
            if event is not None and self.lane_of[dep] != index:
                driver.wait_event(stream, event)
        start = clock.event(device)
        driver.record(start, stream)
        began = clock.now()
        work = self.instead.get(vertex, self.work[vertex])
        try:
            if work is not None:
                work(index)
        except Exception as err:  # a launch that fails at once: its completion, in lane order, carries the error
            self.errors[vertex] = err
        clock.host_span[vertex] = (began, clock.now())  # the simulator's clock: it runs the work synchronously
        end = clock.event(device)
        try:
            driver.record(end, stream)
        except Exception:
            failed = self.errors.pop(vertex, None)
            if failed is None:
                raise
            # the failure left the context unusable (a sticky CUDA error): name the vertex, not the event
            raise KernelError(f"{self.graph.describe(vertex)} failed: {type(failed).__name__}: {failed}") from failed
        clock.start_event[vertex], clock.end_event[vertex], self.lane_of[vertex] = start, end, index
        self.fifo[index].append(vertex)
        self.notifier.after(index, stream, end)
        read = self.early.get(vertex)
        if read is not None and vertex not in self.errors:  # an output: its copy back waits for it on the offload stream
            lane_index = self.offload_lane[device]
            if lane_index != index:
                driver.wait_event(self.devices.streams[lane_index], end)
            read(lane_index)
            self.views.issued.add(vertex)

    def wait(self) -> list[Completion]:
        while True:
            counts = self.notifier.wait()
            if counts:
                break
            self._check_streams()
        done = []
        for lane, count in counts.items():
            for _ in range(count):
                vertex = self.fifo[lane].popleft()
                began, ended = self.clock.stamp(vertex, self.devices.lane_device[lane])
                done.append(Completion(vertex, lane, began, ended, self.errors.pop(vertex, None) if self.errors else None))
        return done

    def _check_streams(self) -> None:
        """No progress for a while: a sticky CUDA error shows up in a stream query; name what was running."""
        for lane, queue in enumerate(self.fifo):
            if not queue:
                continue
            err = self.driver.stream_failure(self.devices.streams[lane])
            if err is not None:
                running = [self.graph.describe(q[0]) for q in self.fifo if q]
                raise KernelError(f"CUDA error on the GPU ({err}) while running {', '.join(running)}") from None

    def external_inputs(self) -> set[str]:
        return self.views.external_tasks if self.views is not None else set()

    def run_starts(self) -> None:
        for share in self.grad_shares.values():  # attention_grad.GradShare: nothing kept from the last run's values
            share.new_run()

    def pieces_ahead(self, tasks: frozenset[str]) -> None:
        """The next load gives the first offload of each of `tasks` that no reload reads no storage
        (TensorViews `unstored`): a batched prefill's k and v pieces, 13 GB of a 7b batch of 16 x 2048,
        are then pinned nowhere but in the caller's cache. A plan loaded so is loaded again for a run
        that does not name those pieces."""
        self.pieced = tasks

    def output_targets(self, into: Mapping[str, OutputTarget]) -> None:
        """Straight from the GPU (TensorViews.aim): an array or the pieces of an output never offloaded
        right after the vertex holding it; the pieces of one the plan offloads by its first offload, as
        part of that vertex's work, whose storage copy is made only where a reload reads it."""
        self.early, offloads = self.views.aim(into, self.devices.streams, self.work)
        self.instead.update(offloads)

    def read_outputs(self, copy: bool = True) -> dict[str, np.ndarray]:
        self.devices.synchronize()
        self._count_library_allocations()
        return self.views.read(copy)

    def _count_library_allocations(self) -> None:
        """What libraries allocated while the loop ran: CuPy calls refused or served, torch segments added."""
        allocator = self.libraries.allocator
        self.stats["cupy_refused"], self.stats["cupy_served"] = allocator.refused, allocator.served
        if "torch_segments" in self.stats:
            now = attention.segments_allocated(self.devices.devices)
            self.stats["torch_new_segments"] = sum(now) - sum(self.stats["torch_segments"])

    def notes(self) -> list[str]:
        """What the run summary adds for this backend: memory taken and where library memory went."""
        lines = []
        if "prepare_s" in self.stats:
            lines.append(
                f"cuda: per GPU arena {format_size(self.stats['arena_bytes'])} + workspace {format_size(self.stats['workspace_bytes'])}"
                f" + library memory {format_size(self.stats.get('library_bytes', 0))}, pinned storage {format_size(self.stats['pinned_bytes'])},"
                f" attention {self.attention}, prepare {self.stats['prepare_s']:.2f} s"
            )
            steps = ", ".join(f"{step} {seconds:.2f} s" for step, seconds in self.stats["load_steps"].items())
            vertices, plans = self.stats["built"]
            made = ", ".join(f"{kind} {count}" for kind, count in sorted(plans.items())) or "none"
            lines.append(f"cuda: prepare: {steps}; {vertices} vertices built on plans made once per shape ({made})")
            over = self.stats.get("library_bytes", 0) - self.stats.get("library_allowance", float("inf"))
            if over > 0:
                held = self.stats["arena_bytes"] + self.stats["workspace_bytes"] + self.stats["library_bytes"]
                lines.append(f"cuda: library memory is {format_size(over)} over the {format_size(self.stats['library_allowance'])} "
                             f"held back for it (arena_budget): the GPU held {format_size(held)} per GPU, more than the budget")
            files, read = self.stats.get("in_place", (0, 0))
            if read:
                where = f", {files} checkpoint files page-locked in place" if files else ""
                lines.append(f"cuda: inputs read where they are (no host copy): {format_size(read)}{where}")
        held = self.devices.process_memory if self.devices is not None else process_memory.current()
        if held is not None and held.available:
            peaks = held.peak()
            lines.append(f"cuda: device memory this process holds (the driver, NVML): peak {format_size(max(peaks))} on the worst GPU "
                         f"{[format_size(p) for p in peaks]}, of which the CUDA context {format_size(max(held.context_bytes))}")
        if "peak_drop" in self.stats:
            lines.append(f"cuda: largest drop in free GPU memory while running {format_size(self.stats['peak_drop'])} per GPU {self.stats['peak_drop_per_gpu']}")
        shares = self.grad_shares.values()
        computed, taken = sum(share.computed for share in shares), sum(share.taken for share in shares)
        if computed:
            lines.append(f"cuda: attention backward: {taken} links took their pair's fused result, {computed} computed one")
        return lines

    # ----- close: tear down, once --------------------------------------------------------------------------
    def close(self) -> None:
        """Synchronize every stream, stop the sampler and the notifier, unbind the libraries, then drop every
        CUDA object (streams with their CuPy, torch and cuda.core views, events, the notifier's side
        streams, arenas, pinned chunks) and have the driver free them now, while every context is alive,
        rather than from finalizers at interpreter exit, after other libraries may have torn their CUDA
        state down. Leaves the thread on the device it found."""
        if self.closed:
            return
        self.closed = True
        try:
            with contextlib.suppress(Exception):  # after a CUDA error the context is gone; nothing more to wait for
                if self.devices is not None:
                    self.devices.synchronize()
        finally:
            self._tear_down()

    def _tear_down(self) -> None:
        if self.sampler is not None:
            self.stats.update(self.sampler.stop())
        if self.notifier is not None:
            self.notifier.close()
        if attention.uses_torch(self.attention) and self.devices is not None:
            attention.release(self.attention, self.devices.devices)
        if self.detach_at_close:
            self.libraries.detach(self.driver)
        self.libraries.close()
        # every closure over arena views goes before the memory does, so the driver frees it in `release`:
        # numba defers a free it is told of later until a threshold of pending bytes, which a dropped
        # backend's arena alone never reaches (a session's three backends held 12.45 GiB under 4 GiB)
        self.work, self.views, self.early, self.instead = [], None, {}, {}
        self.loaded.clear()
        self.mappings.release()
        if self.devices is not None:
            self.devices.drop_memory()
        if self.release_at_close:
            self.notifier = None
            self.services = None
            self.libraries = Libraries()
            if self.clock is not None:
                self.clock.close()
            if self.devices is not None:
                self.devices.release()
        self._restore_device()

    def _restore_device(self) -> None:
        """Leave the thread on the device it was on before the run (the loop switched it as it went)."""
        entry = self.entry_device
        if entry is not None and self.current_device not in (-1, entry):
            self.driver.restore_device(entry)
            self.current_device = entry
