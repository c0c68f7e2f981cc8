"""Tensors in place for one memgraph: views at planned offsets, the copies between them, inputs and outputs.

`TensorViews` makes every node a view: a device view of its GPU's arena at its location, a numpy view of
pinned host storage at its storage region (memory.py), None for an empty tensor. The copy vertices
(reload: host to GPU, offload: GPU to host, move: GPU to GPU, pulled by the destination) become one async
driver call each, with pointers resolved when the memgraph is prepared (`copy_work`). `place` puts the
inputs where the plan wants them; `read` copies the outputs back to the host; `aim` sends a run's outputs
straight into the caller's memory from the GPU, an output the plan offloads by its first offload (the
pieces of a batched prefill's k and v blocks, which a tight budget evicts right after their last reader).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping

import numpy as np

from runtime.backends.base import OutputTarget, rows_contiguous
from runtime.backends.cuda.driver import GpuDriver
from runtime.backends.cuda.memory import PinnedStorage, device_view
from runtime.graph import ExecGraph
from runtime.inputs import Filler, fill_all, is_lazy, mapped, materialize
from runtime.residency import placements
from turnip_ir.errors import InputError
from turnip_ir.kernels import numpy_dtype
from turnip_ir.memgraph import MemNode

COPY_KINDS = {"reload": "h2d", "offload": "d2h", "move": "peer"}
"""Memgraph op -> the copy it is."""


class TensorViews:
    """Every node of a memgraph as a view of an arena (`gpu`) or of pinned storage (`host`)."""

    def __init__(self, driver: GpuDriver, graph: ExecGraph, arenas: list, chunk_bytes: int, reuse=(), filler: Filler | None = None,
                 inputs: dict | None = None, external: bool = False, register=None, pieced: frozenset[str] = frozenset()):
        """`reuse`: pinned chunks of the previous memgraph's storage, idle now (memory.PinnedStorage).
        With a `filler` and the `inputs`, each input held in storage is queued on the filler as soon as its
        pinned chunk exists, so reading the weights overlaps pinning the rest (the caller finishes it).
        `external`: an input the plan keeps in host storage whose value is already a C-contiguous array of
        its dtype in page-locked memory is read where it is (its reloads copy from the caller's array),
        not staged into storage of the plan's own: no copy, and no pinning, at a new plan. So is a lazy input
        that lies as it is in a mapped file (runtime.inputs.mapped: a checkpoint's weight in its stored
        dtype) once `register(mapping)` has page-locked that file's map: its reloads copy from the page
        cache's pages, and the weights are never copied on the host. `pieced`: outputs every run of these
        views writes in pieces (`aim`): the first offload of each, where no reload reads it, gets no
        storage (its pieces are the tensor's only copy: `offload_writing`), so no pinned memory."""
        nodes = graph.memgraph.nodes
        self.driver = driver
        self.graph = graph
        self.gpu: list = [None] * len(nodes)
        self.host: list = [None] * len(nodes)
        for i, node in enumerate(nodes):
            if node.loc is not None:
                self.gpu[i] = _checked(node, arenas[node.device], node.loc, "location")
        self._reads: tuple | None = None
        """The outputs' staging (`read`), made at the first read."""
        self._early: dict | None = None
        """`early_reads`, made once."""
        self.issued: set[int] = set()
        """The outputs whose copy into the staging the current run has issued (`early_reads`)."""
        self.targets: dict[int, np.ndarray] = {}
        """Node index -> the caller's array the current run copies that output into (`aim`)."""
        self.pieces: dict[int, list] = {}
        """Node index -> the caller's pieces the current run copies that output into (`aim`): from the GPU
        after the vertex holding it, or by its tensor's first offload; `read` leaves those outputs out."""
        self.named: set[int] = set()
        """Node index of every output the current run's `aim` named, written there or not."""
        self._output_index: dict[str, int] = {}
        self._offloads: dict[int, tuple[int, bool]] | None = None
        """`first_offloads`, found once."""
        self._handles: list | None = None
        self._pointers: dict[int, int | None] = {}
        """Node index -> its GPU view's device address (`place_on_gpus`), found once."""
        self.inputs = [i for i, node in enumerate(nodes) if node.op == "input" and node.nbytes]
        """Indices of the plan's non-empty inputs (each run places them: no walk over every node)."""
        self._on_gpus = [(i, nodes[i].task, nodes[i].device) for i in self.inputs if nodes[i].loc is not None]
        """(index, task, GPU) of the inputs the plan starts on a GPU."""
        self.external: dict[int, int] = {}
        """Node index -> the host address of the caller's array it reads (external inputs)."""
        self._external_tasks: set[str] | None = None
        self._bound_values: dict[int, object] = {}
        """Node index -> the caller's object last found bound to it (`bound_to`: held, so never another
        object at the same address)."""
        if external and inputs is not None:
            written = _Regions(node.storage for node in nodes if node.storage is not None and node.op != "input")
            for i in self.inputs:
                node = nodes[i]
                if node.storage is not None and not written.overlaps(node.storage):
                    bound = _external_view(driver, node, inputs.get(node.task), register)
                    if bound is not None:
                        self.host[i], self.external[i] = bound, bound.ctypes.data
        self.unstored = self._unstored(pieced)
        """Node indices given no storage: the unread first offloads of `pieced` outputs."""
        self.pieced = frozenset(nodes[i].task for i in self.unstored)
        """The outputs a run must name in pieces to use these views (`serves`)."""
        skip = self.external.keys() | self.unstored
        stored = sorted((node.storage[0], i) for i, node in enumerate(nodes) if node.storage is not None and i not in skip)
        waiting = iter(stored)
        following = [next(waiting, None)]

        def ready(storage: PinnedStorage, end: int) -> None:
            """Views of the regions the chunk below `end` holds; the inputs among them queued on the filler."""
            queued = []
            while following[0] is not None and following[0][0] < end:
                i = following[0][1]
                node = nodes[i]
                self.host[i] = storage.view(node.storage, tuple(node.shape), node.dtype)
                if filler is not None and node.op == "input" and node.nbytes:
                    queued.append((self.host[i], inputs[node.task]))
                following[0] = next(waiting, None)
            if queued:
                filler.add(queued)

        regions = [node.storage for i, node in enumerate(nodes) if node.storage is not None and i not in skip]
        self.storage = PinnedStorage(regions, chunk_bytes, driver.pinned, reuse, ready)

    @property
    def external_tasks(self) -> set[str]:
        """The inputs read from the caller's arrays (by taskgraph id)."""
        if self._external_tasks is None:
            nodes = self.graph.memgraph.nodes
            self._external_tasks = {nodes[i].task for i in self.external}
        return self._external_tasks

    def _unstored(self, pieced: frozenset[str]) -> set[int]:
        """The first offload (node index) of each output in `pieced` whose storage no reload reads."""
        if not pieced:
            return set()
        first, reloaded = self._first_offloads(self.graph.memgraph.outputs.keys() & pieced)
        return set(first.values()) - reloaded

    def _first_offloads(self, tasks) -> tuple[dict[str, int], set[int]]:
        """(task -> the first offload vertex of its tensor, for each of `tasks` the plan offloads from a
        GPU; the offload vertices some reload reads)."""
        nodes, sources = self.graph.memgraph.nodes, self.graph.sources
        first, reloaded = {}, set()
        for vertex, node in enumerate(nodes):
            if node.op == "reload":
                reloaded.add(sources[vertex][0])
            elif node.op == "offload" and node.task in tasks and node.task not in first and self.gpu[sources[vertex][0]] is not None:
                first[node.task] = vertex
        return first, reloaded

    def serves(self, inputs: dict, pieced: frozenset[str]) -> bool:
        """Whether a run with `inputs`, naming `pieced` outputs in pieces, may use these views: the same
        external inputs (`bound_to`), and every output left without storage named in pieces."""
        return self.pieced <= pieced and self.bound_to(inputs)

    def bound_to(self, inputs: dict) -> bool:
        """Whether every external input's value in `inputs` is the array this load reads (its copies
        hold that address): else the plan's work must be built again."""
        nodes = self.graph.memgraph.nodes
        bound = self._bound_values
        for i, address in self.external.items():  # the bound view keeps that memory alive: the same address is the same memory
            value = inputs.get(nodes[i].task)
            if value is not None and bound.get(i) is value:  # the very object found bound before
                continue
            if is_lazy(value):
                value = (mapped(value) or (None,))[0]
            if not isinstance(value, np.ndarray) or value.ctypes.data != address or not value.flags.c_contiguous \
                    or value.dtype != self.host[i].dtype or value.nbytes != self.host[i].nbytes:
                return False
            bound[i] = inputs.get(nodes[i].task)
        return True

    def copy_work(self, vertex: int, streams: list, rows: int | None = None):
        """`work(lane)` of a reload, offload or move vertex; None for an empty tensor. `rows`: copy only
        that many leading rows (a limited reload, `Backend.limit_copies`)."""
        node = self.graph.node(vertex)
        source = self.graph.sources[vertex][0]
        kind = COPY_KINDS[node.op]
        if kind == "h2d":
            src, dst = self.host[source], self.gpu[vertex]
        elif kind == "d2h":
            src, dst = self.gpu[source], self.host[vertex]
        else:
            src, dst = self.gpu[source], self.gpu[vertex]
        if src is None or dst is None:
            return None
        if rows is None:
            return self.driver.copy(kind, src, dst, streams)
        if not rows:
            return None
        return self.driver.copy(kind, src, dst, streams, dst.nbytes // dst.shape[0] * rows)  # no slicing: numba's costs 75 us

    def place_on_gpus(self, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None,
                      wait: bool = True) -> None:
        """Copy every input whose plan starts it on a GPU to its location, but those in `keep`, in place
        already: all of them, or all but the flat rows it names (residency.refreshed), which are copied.
        `wait=False`: without waiting for the copies (`GpuDriver.put`)."""
        keep = keep or {}
        copies = []
        pointers = self._pointers
        for i, task, device in self._on_gpus:
            rows = keep.get(task, ())
            if rows is None:
                continue  # in place whole
            if i not in pointers:
                pointers[i] = self.driver.pointer(self.gpu[i])
            copies.append((device, self.gpu[i], materialize(inputs[task]), rows if rows != () else None, pointers[i]))
        self.driver.put(copies, wait)

    def place(self, inputs: dict[str, np.ndarray], keep: Mapping[str, list[tuple[int, int]] | None] | None = None,
              wait: bool = True) -> None:
        """Put every input at its planned location (an arena) or storage region (pinned host memory), but
        those in `keep`, in place already (runtime/residency.py): all of them, or all but the flat rows
        it names, which are copied. Those in storage are written by several threads at once
        (runtime/inputs.py, `fill_all`), a lazy input (a checkpoint's tensor) straight from its source."""
        keep = keep or {}
        stored = []
        nodes = self.graph.memgraph.nodes
        for i in self.inputs:
            node = nodes[i]
            if node.loc is None and i not in self.external:  # external: in place
                stored += placements(self.host[i], inputs[node.task], node.task, keep)
        fill_all(stored)
        self.place_on_gpus(inputs, keep, wait)

    def read(self, copy: bool = True) -> dict[str, np.ndarray]:
        """Copies of the memgraph's outputs by taskgraph id (the streams must be synchronized). Those on a
        GPU come through page-locked staging of the plan's own (made at the first read, kept with the
        views), so their copies are asynchronous, one wait per GPU, and then copied out of it: a decode
        step's 65 outputs cost a synchronous pageable copy apiece otherwise. `copy=False` leaves them in
        the staging (valid until the next read: Backend.read_outputs). Of those `aim` named, the ones
        written straight are the caller's array in the output's place, or left out (pieces: the run has
        written them, as the executor ran every vertex); the others are left in the staging or the
        storage, uncopied, for `runtime.execute` to copy once."""
        nodes = self.graph.memgraph.nodes
        if self._reads is None:
            self._reads = self._read_plan()
        on_gpu, elsewhere, staging = self._reads
        issued, targets, named, pieces = self.issued, self.targets, self.named, self.pieces
        self.driver.get([(nodes[i].device, self.gpu[i], targets.get(i, view)) for _, i, view in on_gpu if i not in issued and i not in pieces])
        self.issued = set()
        outputs = {}
        for task, i, view in on_gpu:
            if i in targets:
                outputs[task] = targets[i]
            elif i not in pieces:  # a named one in the staging, for runtime.execute to copy
                outputs[task] = np.array(view) if copy and i not in named else view
        for task, i in elsewhere:  # in host storage (or empty): a named one is copied on the host from there
            if i in pieces:
                continue
            node = nodes[i]
            stored = np.zeros(node.shape, numpy_dtype(node.dtype)) if node.nbytes == 0 else self.host[i]
            outputs[task] = stored if i in named else np.array(stored)
        return outputs

    def aim(self, into: Mapping[str, OutputTarget], streams: list, built: list) -> tuple[dict, dict]:
        """`early_reads` for the next run, with the outputs named in `into` (task -> the caller's array of
        the output's shape and dtype, or its pieces: `Backend.output_targets`) copied straight there from
        the GPU: no staging, no host copy after. An array goes right after the vertex that holds the
        output, in one copy when C-contiguous, else in one 2-D copy when its rows are contiguous (`read`
        returns it). Pieces go in one 2-D copy each (`read` leaves that output out): those of an output
        the plan offloads by its tensor's first offload (`offload_writing`), whatever holds it at the
        end; those of one it never offloads right after the vertex that holds it. The others (an array
        of other strides, or one whose output the plan holds in host storage at the end; an output that
        no vertex computes) are left where they are for `runtime.execute` to copy on the host. A copy
        right after a vertex is no vertex the plan waits for: so it is made after the last holder (the
        bytes a kernel wrote may be taken by another tensor once its offload has read them), and a
        reloaded output's array is copied after its last reload. The arrays should be page-locked (a
        session's cache is): a pageable one is written all the same, but its copy holds the loop until
        it is done (the driver's rule), so it is not checked here. `built`: each vertex's prepared work
        (CudaBackend.work). Returns (the early reads, vertex -> its work for this run in its built
        one's place: the offloads that write pieces)."""
        early = self.early_reads(streams)
        self.targets, self.pieces, self.named = {}, {}, set()
        if not into:
            return early, {}
        early, instead = dict(early), {}
        index = self._output_index
        for task, target in into.items():
            i = index[task]
            self.named.add(i)
            offload = self.first_offloads().get(i) if not isinstance(target, np.ndarray) else None
            if offload is not None:
                vertex, reloaded = offload
                instead[vertex] = self.offload_writing(vertex, target, streams, built[vertex] if reloaded else None)
                early.pop(i, None)  # a reload holding it at the end: nothing to copy back after
                self.pieces[i] = target
            elif i not in early:
                continue
            elif isinstance(target, np.ndarray) and target.flags.c_contiguous:
                early[i] = self.driver.copy("d2h", self.gpu[i], target, streams, source_pointer=self._pointer(i), handles=self._handles)
                self.targets[i] = target
            elif isinstance(target, np.ndarray):
                if rows_contiguous(target):
                    early[i] = self.driver.copy_rows(self.gpu[i], [(0, target.shape[0], target)], streams, self._pointer(i), self._handles)
                    self.targets[i] = target
            else:
                early[i] = self.driver.copy_rows(self.gpu[i], target, streams, self._pointer(i), self._handles)
                self.pieces[i] = target
        return early, instead

    def offload_writing(self, vertex: int, pieces: list, streams: list, storage_copy=None):
        """`work(lane)` of offload `vertex` that also writes `pieces` of its tensor from the GPU: its
        storage copy (`storage_copy`, the built work; None: none), then one 2-D copy a piece, all on the
        offload's stream before its end event. So the memory edges that make the next writer of the
        tensor's location wait for the offload cover the pieces too: no vertex more, no race. Without a
        storage copy the pieces are the only copy of the tensor the run makes: only for an offload whose
        storage no reload reads, of an output the run leaves out of `read`."""
        source = self.graph.sources[vertex][0]
        rows = self.driver.copy_rows(self.gpu[source], pieces, streams, self._pointer(source), self._handles)
        if storage_copy is None:
            return rows

        def work(lane):
            storage_copy(lane)
            rows(lane)

        return work

    def first_offloads(self) -> dict[int, tuple[int, bool]]:
        """Output node index -> (the first offload vertex of its tensor, whether a reload reads that
        offload's storage), for each non-empty output the plan offloads; found once per plan. The first
        in the node order, which is topological: a later offload of the tensor (a hand-written plan's)
        comes after it, or on no path from it, with the same values. After `early_reads` (its index)."""
        if self._offloads is None:
            outputs = self._output_index
            first, reloaded = self._first_offloads(outputs.keys())
            self._offloads = {outputs[task]: (vertex, vertex in reloaded) for task, vertex in first.items()}
        return self._offloads

    def _pointer(self, i: int) -> int | None:
        """Node `i`'s GPU view's device address (`GpuDriver.pointer`), found once."""
        if i not in self._pointers:
            self._pointers[i] = self.driver.pointer(self.gpu[i])
        return self._pointers[i]

    def early_reads(self, streams: list) -> dict:
        """Node index -> `work(lane)` copying that output into `read`'s staging, for each output a vertex
        of the run computes on a GPU: issued right after its vertex (CudaBackend.submit, on the GPU's
        offload stream once the vertex is done), so the outputs come back while the run goes on and
        `read` has only those left that no vertex computes (an input that is also an output)."""
        if self._early is None:
            if self._reads is None:
                self._reads = self._read_plan()
            nodes = self.graph.memgraph.nodes
            self._early = {i: self.driver.copy("d2h", self.gpu[i], view, streams) for _, i, view in self._reads[0] if nodes[i].op != "input"}
            self._output_index = {task: i for task, i, *_ in (*self._reads[0], *self._reads[1])}
            self._handles = self.driver.stream_handles(streams)
        return self._early

    def _read_plan(self) -> tuple[list, list, np.ndarray]:
        """(task, node, staging view) of each output a GPU holds, (task, node) of the others, the staging."""
        nodes = self.graph.memgraph.nodes
        index = {node.id: i for i, node in enumerate(nodes)}
        on_gpu, elsewhere, offsets, total = [], [], [], 0
        for task, node_id in self.graph.memgraph.outputs.items():
            i = index[node_id]
            node = nodes[i]
            if node.nbytes and self.gpu[i] is not None and node.op != "offload":
                offsets.append((task, i, total))
                total += -(-node.nbytes // 256) * 256
            else:
                elsewhere.append((task, i))
        staging = self.driver.pinned(total)
        for task, i, offset in offsets:
            node = nodes[i]
            on_gpu.append((task, i, staging[offset : offset + node.nbytes].view(numpy_dtype(node.dtype)).reshape(node.shape)))
        return on_gpu, elsewhere, staging


class _Regions:
    """Storage regions (offset, size) that a plan's offloads write: an input whose region one of them
    overlaps (a hand-written plan may do that) is staged, so no run writes into a caller's array."""

    def __init__(self, regions):
        self.spans = sorted((offset, offset + size) for offset, size in regions)
        self.ends = list(itertools.accumulate((end for _, end in self.spans), max))

    def overlaps(self, region: tuple[int, int]) -> bool:
        offset, size = region
        i = bisect.bisect_left(self.spans, (offset + size,))  # spans starting before the region ends
        return i > 0 and self.ends[i - 1] > offset


def readable_in_place(driver: GpuDriver, value, dtype) -> bool:
    """Whether the copy engines may read `value` where it is as `dtype` values: a C-contiguous numpy array
    of that dtype in page-locked memory."""
    return isinstance(value, np.ndarray) and value.flags.c_contiguous and value.dtype == np.dtype(dtype) and driver.host_pinned(value)


def _external_view(driver: GpuDriver, node: MemNode, value, register=None) -> np.ndarray | None:
    """`value` as the node's host tensor when the copy engines may read it where it is, else None; a lazy
    input in a mapped file is its view there, once `register` has page-locked the map."""
    if is_lazy(value):
        found = mapped(value) if register is not None else None
        if found is None or not register(found[1]):
            return None
        view = found[0]  # C-contiguous inside the map `register` page-locked: no driver query (two a weight, 0.27 s of a 7b prefill's load)
        fits = view.nbytes == node.nbytes and view.dtype == numpy_dtype(node.dtype) and view.flags.c_contiguous
        return view.reshape(tuple(node.shape)) if fits else None
    if not isinstance(value, np.ndarray) or value.nbytes != node.nbytes or not readable_in_place(driver, value, numpy_dtype(node.dtype)):
        return None
    return value.reshape(tuple(node.shape))


def _checked(node: MemNode, buffer, region, what: str):
    offset, size = region
    if size < node.nbytes:
        raise InputError(f"node {node.id} ({node.task}): {what} {list(region)} cannot hold {node.nbytes} bytes")
    return device_view(buffer, offset, tuple(node.shape), node.dtype)
